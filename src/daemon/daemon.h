/* SPDX-License-Identifier: MIT */
/* The daemon: one libuv loop owns all state.  Blocking file work runs on the
 * thread pool through per-mandate serial queues (serialq.h). */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "kairos/kbuf.h"

#include "kairos/config.h"
#include "kairos/statedir.h"
#include "kairos/strmap.h"
#include "creds.h"
#include "notify.h"
#include "result.h"
#include "serialq.h"

struct control_server;
struct chronos;
struct idem_service;
struct opreads;
struct toolclaims;
struct metrics;
struct runner;
struct hooks;
struct hook_failure;
struct evidence_index;
struct wal_options;
struct mandate;

enum mandate_status {
        MANDATE_RUNNABLE,          /* has work to do, waiting for the executor */
        MANDATE_RUNNING,
        MANDATE_IDLE,              /* every plan finalized; next cycle not decided yet */
        MANDATE_PAUSED,            /* paused by an operator */
        MANDATE_PAUSED_REVIEW,     /* a step needs a human (kairosctl resolve) */
        MANDATE_PROBING,           /* recovery waits for a step's Probe= (probe.h) */
        MANDATE_AWAITING_APPROVAL,
        MANDATE_QUARANTINED,       /* WAL corrupt: nothing is appended */
        MANDATE_WAL_IO_ERROR,      /* a write or flush of the WAL failed */
        MANDATE_DONE,
        MANDATE_FAILED,
        MANDATE_TERMINATED,
        MANDATE_ABANDONED,
        MANDATE_CANCELLED,         /* ended by kairosctl cancel */
        MANDATE__STATUS_MAX,
};

const char *mandate_status_name(enum mandate_status s);
/* s ends the mandate: nothing will run in it again. */
static inline bool mandate_status_is_final(enum mandate_status s)
{
        return s == MANDATE_DONE || s == MANDATE_FAILED || s == MANDATE_TERMINATED ||
               s == MANDATE_ABANDONED || s == MANDATE_CANCELLED;
}
/* The status named `name` (an enum mandate_status), or -ENOENT. */
int mandate_status_parse(const char *name);

struct mandate {
        struct daemon *d;
        char *id;
        char *wal_path;
        struct serialq q;          /* every WAL access of this mandate */
        struct wal *wal;           /* owned by jobs of q; NULL when closed */
        struct fold *fold;         /* owned by jobs of q: the WAL folded so far, or NULL */
        struct kbuf wal_bytes;     /* owned by jobs of q: the bytes folded (for the archive) */
        enum mandate_status status;
        unsigned busy;             /* commands in flight (keeps it alive) */
        char *reason;              /* why paused / quarantined / failed */
        char *review_step;         /* PAUSED_REVIEW: the step to resolve */
        struct hook_failure *failure; /* its last failed execution, for OnFailure= (hooks.h) */
        char *plan_id;             /* the open (or last) plan */
        long long cycle;
        char *schedule;            /* NULL when unknown */
        uint64_t flushes;          /* fdatasync calls on this mandate's WAL */
        char *fired_at;            /* set with mandate_set_fired_at */
        int64_t fired_key;         /* fired_at's digits as YYYYMMDDHHMMSS (it sorts like
                                    * the text); -1: none or not of that form */
        char *goal;
        char *retry_of;            /* a retry (kairosctl retry): the mandate it retries */
        int retry;                 /* ... and its number N >= 1 (planner.h); 0 otherwise */
        bool retry_forced;         /* ... made with a reason (cluster mode: kairos_retry_create) */
        bool order_added;          /* in d->order_added, not yet in d->ordered */
        bool cluster_parking;      /* postgres: its row is being marked paused
                                    * (commands.c reads it) */
        int64_t started_ms;        /* wall clock: fired (or its WAL's first record); 0 unknown */
        int64_t ended_ms;          /* wall clock: finished; 0 while it runs */
        int64_t down_ms;           /* finished: restarts' time in between (fold.down_ms) */
        bool archived;             /* finished: WAL gzipped to archive/ */
        /* executor */
        bool queued;               /* in the runnable queue */
        bool holds_slot;           /* counted in running (MaxConcurrentMandates) */
        struct mandate *next_queued;
        struct exec_run *run;      /* the handler being run, if any */
        char *step_id;             /* the step being run */
        uv_timer_t *retry_timer;   /* a failed step waits for its retry (RetryAttempts=) */
        struct mandate_cancel *cancel; /* kairosctl cancel in progress */
        /* the epoch this node holds it at (the postgres driver's, written
         * into its records); 0 on one host */
        int64_t epoch;
        void *drv_state;           /* driver.h: its driver's, own.attach */
};

struct recovery_summary {
        unsigned files;
        unsigned resumed;          /* mandates with work that goes on */
        unsigned paused_review;
        unsigned quarantined;
        unsigned io_errors;
        unsigned torn_repaired;
        unsigned decisions;
        unsigned already_done, safe_to_retry, manual_review;
        uint64_t started_ms, duration_ms;
};

struct daemon {
        uv_loop_t *loop;
        struct config *cfg;
        char *config_path;         /* NULL: built-in configuration */
        char *state_dir_override;  /* --state-dir */
        struct statedir paths;     /* the state directory's layout */
        enum statedir_sync sync_mode; /* one syncfs, or file by file (statedir.h) */
        struct wal_spares *spares; /* WAL files made ahead in wal/ (wal.h; mandate.c) */
#define DAEMON_WAL_SPARES 8
        int lock_fd;
        gid_t socket_gid;          /* (gid_t)-1: the group does not exist */
        uint64_t started_ms;

        struct strmap *mandates;   /* id -> struct mandate* */
        /* mandates per status, kept by mandate_add/_set_status/_remove: status
         * and the sd_notify line cost O(1), not a pass over every mandate */
        unsigned status_count[MANDATE__STATUS_MAX];
        /* mandate.c: every mandate oldest first (mandates_ordered), kept
         * lazily: new mandates wait in order_added and are inserted when
         * asked for; a removal or a changed fired_at rebuilds it */
        struct mandate **ordered, **order_added;
        size_t nordered, ordered_cap, norder_added, order_added_cap;
        bool order_stale;
        struct serialq_group jobs;
        struct serialq admin_q;    /* config reloads and other non-mandate file work */
        struct control_server *control;
        struct chronos *chronos;
        struct idem_service *idem;  /* idem_service.h: the idempotency store */
        const struct opreads *opreads;       /* opreads.h: set by main.c at start */
        const struct toolclaims *toolclaims; /* toolclaims.h: set by main.c at start */
        struct metrics *metrics;    /* metrics.h */
        const struct driver *drv;   /* driver.h: Backend=, chosen at start */
        struct cluster *cluster;    /* the postgres driver's state (cluster.h); NULL
                                     * on one host: commands.c and idem_service.c
                                     * still test it */
        struct runner *runner;      /* runner.h: starts handlers, hooks and probes */
        struct executor *executor;  /* executor_internal.h: the executor's own state */
        struct hooks *hooks;        /* hooks.h: [Notify] commands */
        struct handler_user handler_user; /* creds.h: HandlerUser= as started */
        struct recovery_summary recovery;
        uint64_t flushes_total;
        uint64_t cycles_completed;


        uv_signal_t sig_term, sig_int, sig_hup, sig_usr1;
        uv_timer_t extend_timer;
        uv_timer_t stop_timer;
        struct notify_watchdog watchdog;
        bool ready;
        bool stopping;
        bool reloading;
        int exit_code;
        /* clock.c: the scheduler's clock is faked (test-clock) at fake_now */
        bool fake_clock;
        int64_t fake_now;

        /* Calls up into a higher module, registered at start by main.c: a
         * lower module calls the function pointer it was given, never a
         * module above it by name (docs/design.md §2, "Data flows one way"). */
        struct daemon_upcalls {
                /* mandate.c: a WAL's options (metrics' sync timing, the
                 * cluster's barrier); freeing the executor's fields */
                void (*wal_options)(struct mandate *m, struct wal_options *o);
                void (*free_mandate)(struct mandate *m);
                /* executor.c: a due step retry whose evidence decides
                 * (recover.c, recover_again) */
                void (*recover_again)(struct daemon *d, const char *mandate_id);
                /* cluster.c: kill a dropped mandate's handler; recover a
                 * mandate taken over (recover_adopt) */
                void (*kill_handler)(struct mandate *m, int sig);
                void (*adopt)(struct daemon *d, struct mandate *m, const char *prev_owner,
                              struct evidence_index *ix,
                              void (*done)(void *ctx, struct mandate *m, int err), void *ctx);
                /* mandate.c: m's status changed; lifecycle.c: kairosd
                 * stops (commands.c answers its wait requests) */
                void (*status_changed)(struct mandate *m);
                void (*stopping)(struct daemon *d);
        } up;
};

/* clock.c: the monotonic clock in ms and in us, the real-time one in ms; the
 * scheduler's seconds (the test clock if faked). */
uint64_t now_ms_monotonic(void);
uint64_t now_us_monotonic(void);
int64_t now_ms_realtime(void);
int64_t clock_now(const struct daemon *d);
/* status.c: STATUS= text. */
void daemon_update_status(struct daemon *d);

/* lifecycle.c: the daemon as a whole. */
/* The graceful stop: the scheduler stops, running handlers get their
 * grace, then the loop ends with exit_code. */
void daemon_stop(struct daemon *d, int exit_code);
/* Load the configuration again on the admin queue; done (may be NULL) gets
 * {reloaded, schedules} or the error "conflict", "config_invalid" (detail:
 * errors) or "internal". */
void daemon_reload(struct daemon *d, void (*done)(void *ctx, const struct op_result *r),
                   void *ctx);
/* What main.c wires: configuration loading (path NULL: the built-in one),
 * SocketGroup='s gid, the event sources of the daemon as a whole. */
int daemon_load_config(const char *path, const char *state_dir, struct config **ret,
                       struct config_errors *errs);
gid_t daemon_lookup_group(const char *name);
/* Into the journal: the errors of broken schedule files and the warnings. */
void daemon_log_schedule_problems(const struct config *c);
void daemon_on_signal(uv_signal_t *s, int signum);
void daemon_on_extend(uv_timer_t *t);
void daemon_on_jobs_drained(void *ctx);

/* mandate.c */
struct mandate *mandate_add(struct daemon *d, const char *id, const char *wal_path);
/* The same with wal_path owned (freed if it fails), not copied. */
struct mandate *mandate_add_path(struct daemon *d, const char *id, char *wal_path);
struct mandate *mandate_find(struct daemon *d, const char *id);
void mandate_set_status(struct mandate *m, enum mandate_status s, const char *reason);
/* Replace m->fired_at by fired_at (owned; NULL: unknown) and its sort key. */
void mandate_set_fired_at(struct mandate *m, char *fired_at);
/* The order of `list`: < 0 when a is newer than b (fired_at descending, none
 * oldest, then id descending); 0 only for a == b. */
int mandate_order(const struct mandate *a, const struct mandate *b);
/* Every mandate, OLDEST first (so *ret[n - 1] is the newest), valid until
 * the registry changes; -ENOMEM. */
int mandates_ordered(struct daemon *d, struct mandate *const **ret, size_t *ret_n);
/* Forget a mandate that has nothing in flight (no command, no job, no
 * handler, not queued) and free it: -EBUSY otherwise. */
int mandate_remove(struct mandate *m);
void mandates_free(struct daemon *d);
/* Queue work, then done, on m's serial queue (serialq_submit), m kept
 * alive (busy) until done gives it back (m->busy--); -ENOMEM: nothing is
 * queued and m is as it was. */
int mandate_submit(struct mandate *m, void (*work)(void *arg), void (*done)(void *arg), void *arg);
/* Open the mandate's WAL if needed (pool thread, inside a job of m->q). */
int mandate_wal_open(struct mandate *m);
void mandate_wal_close(struct mandate *m);
/* Recovery's scan of wal/ saw the spare name (docs/design.md §6): kept
 * for mandate_spares_settle. */
int mandate_spare_seen(const char *name);
/* Once the scan is over: each spare seen settled (wal_spare_adopt; kept as
 * a spare, removed, or left with an error logged), *ret_ids the mandates
 * whose records one held, now under their WAL's name (the renames made
 * durable by one fsync of wal/).  Caller frees each and the array. */
int mandate_spares_settle(struct daemon *d, char ***ret_ids, size_t *ret_n);
/* Spares for the next mandates, around a sync that runs anyway (pool
 * thread): fill before it starts, covered with its result after it. */
uint64_t mandate_spares_fill(struct daemon *d);
void mandate_spares_covered(struct daemon *d, uint64_t mark, int r);
/* Counts by status. */
void mandates_count(struct daemon *d, unsigned counts[MANDATE__STATUS_MAX]);

/* recover.c: startup recovery; calls done(d) on the loop when finished.
 * recover_load_finished first registers finished mandates from their summaries.
 * recover_start takes ix (the idempotency store's calls by owner, built once
 * after the store loaded; read-only on the pool threads) and frees it when
 * recovery ends, also on failure.  ix NULL: nothing known of tool calls. */
struct evidence_index;
int recover_load_finished(struct daemon *d);
int recover_start(struct daemon *d, struct evidence_index *ix, void (*done)(struct daemon *d));
/* Cluster mode: m (registered, m->epoch the new epoch, its WAL file the
 * rows) was taken over from prev_owner: the owner record and recovery's
 * decisions, with ix (its tool calls; taken) as evidence, in one barrier;
 * then it goes on like any recovered mandate.  done (may be NULL) runs on
 * the loop once that has settled: err 0, or the mandate was given up (then
 * m may be forgotten soon after; done must not keep it). */
void recover_adopt(struct daemon *d, struct mandate *m, const char *prev_owner,
                   struct evidence_index *ix, void (*done)(void *ctx, struct mandate *m, int err),
                   void *ctx);
/* The mandate (probing) waited for a tool call that outlived the last
 * kairosd (toolhold.h): decide it again from the store as it is now, on its
 * queue, with no wait this time. */
void recover_again(struct daemon *d, const char *mandate_id);

/* history.c: list, mandate prefixes, retention of finished mandates. */
/* Resolve a MANDATE argument: an id or a unique prefix of one.  -ENOENT
 * (none), -EEXIST (ambiguous: *ret_candidates, up to max, NULL-terminated,
 * owned by the registry), 0 with *ret. */
int history_resolve(struct daemon *d, const char *arg, struct mandate **ret,
                    const struct mandate **ret_candidates, size_t max);
/* A mandate finished: retention may prune older ones. */
void history_finished(struct mandate *m);
/* After startup: prune what retention allows, start the age timer. */
void history_start(struct daemon *d);
void history_stop(struct daemon *d);
/* Prune now (test hook after moving the fake clock). */
void history_prune_now(struct daemon *d);
/* Rows of `list` (the most rows an answer holds: HISTORY_LIST_MAX). */
#define HISTORY_LIST_MAX 100000
struct history_filter {
        int status;                   /* an enum mandate_status; -1: any */
        const char *schedule;         /* NULL: any */
        const char *since;            /* fired_at >= since; NULL: any */
        const struct mandate *after;  /* cursor: rows strictly after it; NULL: from the first */
};
/* The first `limit` (0: all) mandates matching f, newest first, as the
 * result of `list` (kairosctl(1)): *ret_result owned by the caller.
 * -ENOMEM. */
int history_list(struct daemon *d, const struct history_filter *f, size_t limit,
                 json_t **ret_result);
/* A schedule name neither configured (running, retained or broken) nor
 * that of any mandate kept here: a typo, not an empty list.  (A schedule
 * removed from the configuration still lists its history.)  Its error: */
bool history_schedule_unknown(struct daemon *d, const char *name);
#define HISTORY_NO_SCHEDULE_FMT                                                                   \
        "args.schedule: no schedule '%s' (none in the configuration, and no mandate of it is "   \
        "kept)"
/* The fields of m that list's rows and show share (id, status, reason,
 * review_step, plan_id, cycle, schedule, fired_at, started_at, ended_at). */
json_t *history_mandate_json(const struct mandate *m);
/* A time (ms since the epoch) as list and show print it; null if <= 0. */
json_t *history_ms_json(int64_t ms);
/* m's fields as list and show print them (kairos/showdoc.h; borrowed from
 * m), and every mandate's, oldest first (valid until the registry
 * changes); -ENOMEM. */
struct showdoc_mandate;
struct showdoc_rows;
void history_row(const struct mandate *m, struct showdoc_mandate *ret);
int history_rows(struct daemon *d, struct showdoc_rows *ret);

/* control.c */
int control_start(struct daemon *d, const char *path);
void control_stop(struct daemon *d);
