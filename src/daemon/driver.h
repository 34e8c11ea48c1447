/* SPDX-License-Identifier: MIT */
/* driver: where the loop's shared state lives, one table of operations per
 * role (docs/design.md §14, "Drivers").  [Cluster] Backend= picks one driver
 * at start (main.c's table); the loop's modules call through it and never
 * ask which one runs:
 *   files     (driver_files.c) one host: the WAL file and its fdatasync are
 *             the truth, every mandate and tick is this node's;
 *   postgres  (src/cluster, built with -Dpostgres=enabled only) many nodes
 *             sharing PostgreSQL: the rows are the truth (cluster.h).
 * Each role's table carries function pointers only; a driver keeps its own
 * state behind the daemon's d->cluster (postgres: only its driver reads
 * it), a mandate's m->drv_state (own.attach), the
 * chronos' and each schedule's drv_state (ticks.attach, ticks.sched_new).
 * A driver fills every pointer: the loop never tests one for NULL. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon.h"

struct chronos;
struct config_schedule;
struct deadman;
struct op_reply;
struct op_result;
struct sched;
struct wal_options;
typedef struct json_t json_t;

/* WAL barrier: what makes a mandate's appended records durable. */
struct wal_driver {
        /* Fill o's barrier hook for m's WAL (wal.h); files: nothing (an
         * fdatasync). */
        void (*options)(struct mandate *m, struct wal_options *o);
        /* The message of a barrier that failed with err (for the log and
         * the operator) into buf. */
        void (*failed)(const struct mandate *m, int err, char *buf, size_t len);
};

/* Schedule state and tick claims: who fires which tick (chronos.c). */
struct ticks_driver {
        /* chronos_start / chronos_free: the driver's state of the schedules */
        int (*attach)(struct chronos *c);
        void (*detach)(struct chronos *c);
        /* A schedule's state in the driver (s->drv_state), made with the
         * schedule (at start and each reload), carried from the schedule
         * of the same name it replaces, told its last evaluation as
         * chronos.json had it, freed with it. */
        int (*sched_new)(struct chronos *c, struct sched *s);
        void (*sched_carry)(struct sched *s, struct sched *old);
        void (*sched_loaded)(struct sched *s);
        void (*sched_free)(struct sched *s);
        /* Does this node decide the missed ticks of its own evaluations?
         * files: yes; postgres: no, the round that wins a schedule's row
         * does (round). */
        bool (*missed_here)(const struct chronos *c);
        /* A fire of tick t of schedule name was answered r: true if the
         * driver takes it over (fires it again later). */
        bool (*unclaimed)(struct chronos *c, const char *name, int64_t t,
                          const struct op_result *r);
        /* The evaluations changed: share them once every fire is answered
         * (postgres: one round through the schedules' rows). */
        void (*round)(struct chronos *c);
        /* Every fire is answered: what round deferred is done now. */
        void (*settled)(struct chronos *c);
        /* chronos_stop: no round starts any more. */
        void (*stop)(struct chronos *c);
};

/* Mandate ownership: which node's a mandate is, and what it may do. */
struct own_driver {
        /* a mandate's driver state (m->drv_state), before any job of it /
         * when it is freed */
        int (*attach)(struct mandate *m);
        void (*detach)(struct mandate *m);
        /* m is held by this node / no longer (ended, lost, dropped) */
        void (*hold)(struct mandate *m);
        void (*release)(struct mandate *m);
        /* m is no longer this node's: nothing more is appended, its handler
         * is killed, it is forgotten once nothing of it runs */
        void (*drop)(struct mandate *m, const char *why);
        bool (*dropped)(const struct mandate *m);
        /* a retry this node is still creating (another node may win it) */
        bool (*retry_creating)(const struct mandate *m);
        /* dropped and idle: forget it now (true), else keep it (false) */
        bool (*forget_dropped)(struct mandate *m);
        /* may this node spawn a handler or claim a tick now? */
        bool (*may_act)(const struct daemon *d);
        /* this node's name, NULL on one host */
        const char *(*node)(const struct daemon *d);
        /* pool thread, after the barrier of m's last records: m ended as
         * end (postgres: its row says so too).  -errno with the message in
         * err. */
        int (*finish)(struct mandate *m, enum mandate_status end, char *err, size_t errlen);
        /* a fire of schedule sc made m: must m wait in the queue whatever
         * runs here (postgres: Concurrency=queue waits for its schedule's
         * slot in the database)? */
        bool (*fired)(struct mandate *m, const struct config_schedule *sc);
        /* Concurrency=queue: may m start now (holding what it must)?  false:
         * asked for, the executor is kicked when it changes. */
        bool (*slot_ready)(struct mandate *m);
        /* m stops running but goes on later (approval, review, pause) */
        void (*slot_release)(struct mandate *m);
        /* an advance job of m's WAL barrier failed with err (errmsg): true
         * if the driver settled it (postgres: the mandate is not this
         * node's any more: reply, and cancel_reply when the job carried a
         * cancel, answered, m dropped; the executor frees its slot and
         * cancel); false: the mandate's own WAL error. */
        bool (*barrier_failed)(struct mandate *m, int err, const char *errmsg,
                               struct op_reply *reply, struct op_reply *cancel_reply);
        /* A handler of m starts: a mark of the node's own kills so far
         * (files: 0). */
        uint64_t (*kill_mark)(const struct daemon *d);
        /* m's handler, started at mark, died by SIGKILL: was it this
         * node's own fence or deadman (postgres: the deadman killed at a
         * deadline since mark, the node's deadline passed, or m was
         * dropped)?  true: m was dropped now and its step is recorded at
         * no epoch of this node; whoever holds m next decides the step by
         * evidence, as after a crash.  files: false. */
        bool (*killed_here)(struct mandate *m, uint64_t mark);
};

struct opreads;
struct toolclaims;

struct driver {
        const char *name;  /* Backend= */
        /* before recovery: -errno with a message in err */
        int (*start)(struct daemon *d, char *err, size_t errlen);
        /* before any thread exists (executor_init): helper processes;
         * *ret_deadman: the one that guards the handlers (deadman.h), NULL:
         * none */
        int (*prefork)(struct daemon *d, struct deadman **ret_deadman);
        void (*ready)(struct daemon *d);
        void (*quiesce)(struct daemon *d);
        void (*stop)(struct daemon *d);
        void (*free)(struct daemon *d);  /* after the loop is closed */
        /* for kairosctl status; NULL on one host */
        json_t *(*status)(struct daemon *d);
        /* the end of a pool thread's job (serialq) */
        void (*thread_done)(void);
        /* kairosd --init-db ARG: create or migrate the shared schema (exit
         * code) */
        int (*init_db)(const char *arg);
        struct wal_driver wal;
        struct ticks_driver ticks;
        struct own_driver own;
        const struct opreads *opreads;       /* operators' reads (opreads.h) */
        const struct toolclaims *toolclaims; /* tool-call claims (toolclaims.h) */
};

extern const struct driver files_driver;

/* The loop's calls, through m's (or d's) driver. */
static inline void own_hold(struct mandate *m) { m->d->drv->own.hold(m); }
static inline void own_release(struct mandate *m) { m->d->drv->own.release(m); }
static inline void own_drop(struct mandate *m, const char *why) { m->d->drv->own.drop(m, why); }
static inline bool own_dropped(const struct mandate *m) { return m->d->drv->own.dropped(m); }
static inline bool own_retry_creating(const struct mandate *m)
{
        return m->d->drv->own.retry_creating(m);
}
static inline bool own_forget_dropped(struct mandate *m)
{
        return m->d->drv->own.forget_dropped(m);
}
static inline bool own_may_act(const struct daemon *d) { return d->drv->own.may_act(d); }
static inline const char *own_node(const struct daemon *d) { return d->drv->own.node(d); }
static inline int own_finish(struct mandate *m, enum mandate_status end, char *err,
                             size_t errlen)
{
        return m->d->drv->own.finish(m, end, err, errlen);
}
