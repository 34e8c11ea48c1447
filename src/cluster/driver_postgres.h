/* SPDX-License-Identifier: MIT */
/* The postgres driver's operations (driver.h), for its table
 * (driver_postgres.c): cluster.c (pgd_), cluster_ticks.c (pgt_),
 * cluster_executor.c (pgx_), initdb.c.  Only the table calls them by name. */
#pragma once

#include "cluster.h"

extern const struct driver postgres_driver;

/* ---- cluster.c ---- */
int pgd_start(struct daemon *d, char *err, size_t errlen);
int pgd_prefork(struct daemon *d, struct deadman **ret_deadman);
void pgd_ready(struct daemon *d);
void pgd_quiesce(struct daemon *d);
void pgd_stop(struct daemon *d);
void pgd_free(struct daemon *d);
json_t *pgd_status(struct daemon *d);
void pgd_wal_options(struct mandate *m, struct wal_options *o);
void pgd_wal_failed(const struct mandate *m, int err, char *buf, size_t len);
int pgd_attach(struct mandate *m);
void pgd_detach(struct mandate *m);
void pgd_hold(struct mandate *m);
void pgd_release(struct mandate *m);
void pgd_drop(struct mandate *m, const char *why);
bool pgd_dropped(const struct mandate *m);
bool pgd_retry_creating(const struct mandate *m);
bool pgd_forget_dropped(struct mandate *m);
bool pgd_may_act(const struct daemon *d);
const char *pgd_node(const struct daemon *d);
int pgd_finish(struct mandate *m, enum mandate_status end, char *err, size_t errlen);
uint64_t pgd_kill_mark(const struct daemon *d);
bool pgd_killed_here(struct mandate *m, uint64_t mark);
/* initdb.c: kairosd --init-db */
int pgd_init_db(const char *arg);

/* ---- cluster_executor.c ---- */
bool pgx_fired(struct mandate *m, const struct config_schedule *sc);
bool pgx_slot_ready(struct mandate *m);
void pgx_slot_release(struct mandate *m);
bool pgx_barrier_failed(struct mandate *m, int err, const char *errmsg, struct op_reply *reply,
                        struct op_reply *cancel_reply);

/* ---- cluster_ticks.c ---- */
int pgt_attach(struct chronos *c);
void pgt_detach(struct chronos *c);
int pgt_sched_new(struct chronos *c, struct sched *s);
void pgt_sched_carry(struct sched *s, struct sched *old);
void pgt_sched_loaded(struct sched *s);
void pgt_sched_free(struct sched *s);
bool pgt_missed_here(const struct chronos *c);
bool pgt_unclaimed(struct chronos *c, const char *name, int64_t t, const struct op_result *r);
void pgt_round(struct chronos *c);
void pgt_settled(struct chronos *c);
void pgt_stop(struct chronos *c);
