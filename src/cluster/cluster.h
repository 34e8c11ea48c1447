/* SPDX-License-Identifier: MIT */
/* cluster: kairosd as one node of many sharing PostgreSQL ([Cluster]
 * Backend=postgres; docs/design.md §14).
 *
 * The rows in the database are the truth.  A node keeps, for each mandate
 * it holds, an unsynced copy of the mandate's rows as its WAL file (so
 * fold, decide and recovery read what they always read), and every WAL
 * barrier is one fenced transaction instead of an fdatasync (wal.h,
 * wal_options.barrier): the first barrier of a tick claims it (one winner),
 * every later one appends at the mandate's epoch.  A barrier that fails —
 * fenced (-ESTALE), lost claim (-EALREADY), database unreachable — means
 * the node no longer holds the mandate: it appends nothing more, kills its
 * handler and forgets it; whoever takes it over decides from the rows.
 *
 * A heartbeat thread (its own connection, never the loop, never the pool)
 * renews the node and the leases of the mandates it holds; mandates not
 * renewed are lost.  A node that cannot renew stops spawning and claiming
 * (cluster_may_act) and kills every handler before its leases can end
 * (monotonic clock, drift margin); the deadman process (deadman.h) does the
 * same if kairosd itself is stopped.  Expired mandates of any node are
 * taken over (epoch + 1), their rows copied to the WAL file, an owner
 * record appended, and startup recovery's decision runs on them.
 *
 * The postgres driver (driver.h, driver_postgres.c): this file, cluster.c
 * (the node, its pool, heartbeat, takeover, the barrier), cluster_ticks.c
 * (the schedules' rows), cluster_executor.c (claims refused and the
 * schedules' slots, as the executor sees them) and initdb.c; built with
 * -Dpostgres=enabled only. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "driver.h"

typedef struct json_t json_t;
struct daemon;
struct deadman;
struct mandate;
struct pgstore;
struct wal_options;

/* A mandate's state in the postgres driver (m->drv_state, pgd_attach). */
struct cluster_mandate {
        bool held;                 /* renewed by the heartbeat (loop only) */
        bool dropped;              /* no longer this node's (atomic: read by pool threads) */
        char *winner;              /* a lost tick claim: the node that won it */
        /* Concurrency= across the cluster (docs/design.md §14) */
        bool reject;               /* its tick is claimed with kairos_claim_tick_reject */
        char *busy;                /* a refused claim: the unfinished mandate ... */
        char *busy_status;         /* ... and its status (running, paused) */
        bool db_slot;              /* holds its schedule's slot in the database (queue) */
        bool slot_taking;          /* a take of that slot is in flight */
        char *slot_waits_for;      /* the last take was refused: the mandate it waits for */
        int64_t park_after;        /* monotonic ms: not before (after a failure) */
        char db_error[256];        /* the database's words on its last failed barrier
                                    * (written by the pool thread before its job ends) */
        int claim_err;             /* its tick's claim (or retry's creation) failed for
                                    * want of the database: the error (pool thread), 0 */
};

static inline struct cluster_mandate *CM(const struct mandate *m)
{
        return m->drv_state;
}

/* The names commands.c and idem_service.c still call (their own drivers
 * replace them): through the daemon's driver, so they mean the same with
 * either backend. */
static inline json_t *cluster_status(struct daemon *d) { return d->drv->status(d); }
static inline const char *cluster_node(const struct daemon *d) { return own_node(d); }
static inline bool cluster_dropped(const struct mandate *m) { return own_dropped(m); }
static inline bool cluster_retry_creating(const struct mandate *m)
{
        return own_retry_creating(m);
}
static inline void cluster_drop(struct mandate *m, const char *why) { own_drop(m, why); }

/* LeaseSec= in ms; the monotonic ms after which this node's leases may have
 * ended. */
int64_t cluster_lease_ms(const struct daemon *d);
int64_t cluster_deadline_ms(const struct daemon *d);
/* A connection for the calling pool thread's job: one of the node's few
 * (connected on first use, reconnected after a broken connection), lent to
 * this thread until cluster_thread_done; the same one on every call in
 * between.  Waits while every connection is lent, at most half a lease
 * (-ETIMEDOUT).  NULL and *ret_err on failure.  Never on the loop thread. */
struct pgstore *cluster_thread_store(struct daemon *d, int *ret_err);
/* A pool thread's call on s failed with r: its error into buf; after a
 * broken connection (-ENOTCONN) the next call on s reconnects. */
void cluster_thread_failed(struct pgstore *s, int r, char *buf, size_t len);
/* Why cluster_thread_store last failed on this thread (the database's
 * words when it gave any). */
const char *cluster_thread_error(void);
/* cluster_thread_store, and on failure cluster_thread_error() in why. */
struct pgstore *cluster_thread_store_why(struct daemon *d, int *ret_err, char *why, size_t len);
/* The end of a pool thread's job: the connection it was lent, if any, goes
 * back to the node's pool.  Called by every job runner (serialq, ...). */
void cluster_thread_done(void);

/* Pool thread, Concurrency=queue across the cluster (docs/design.md §14,
 * "Concurrency"): take the one slot of m's schedule in the database
 * (pgstore_slot_take, fenced by m's epoch): *ret_taken, else *ret_holder
 * (malloc'd, may be NULL) the mandate m waits for.  -ESTALE: not this
 * node's; other errors: the database did not answer (try again later). */
int cluster_slot_take(struct mandate *m, bool *ret_taken, char **ret_holder);
/* The loop's timer that asks again for the slots refused
 * (cluster_executor.c). */
uv_timer_t *cluster_slot_timer(struct daemon *d);
/* Pool thread: give the slot back while m stays running (it waits for an
 * approval or a review). */
int cluster_slot_release(struct mandate *m);
/* Take mandate_id, which this node does not hold, for an operator's command
 * (resolve, approve, resume): on a pool thread pgstore_mandate_take (a
 * paused mandate, or one whose lease ended; epoch + 1), its rows into the
 * WAL file, then adopted through recovery as a takeover is.  cb runs once
 * on the loop: err 0 with m once the adoption settled (the executor has
 * decided: paused for review, awaiting approval, paused or running), or an
 * error: -EBUSY (detail: the node holding it under a live lease), -EALREADY
 * (detail: how it ended), -ENOENT, -ESHUTDOWN, other (detail: why).  A
 * paused mandate with nothing in flight is released by its node (its row
 * marked paused, the node forgets it: docs/design.md §14). */
typedef void (*cluster_take_cb)(void *ctx, struct mandate *m, int err, const char *detail);
int cluster_take(struct daemon *d, const char *mandate_id, cluster_take_cb cb, void *ctx);
/* Run work on a pool thread (cluster_thread_store there), one at a time
 * for operators' reads of the database; done on the loop. */
int cluster_submit(struct daemon *d, void (*work)(void *arg), void (*done)(void *arg),
                   void *arg);
/* Pool thread, between attempts to reach the database: sleep 0.1, 0.2,
 * 0.4, 0.8, 1.6, then 2 s. */
void cluster_backoff(unsigned attempt);
