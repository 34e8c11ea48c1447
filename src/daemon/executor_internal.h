/* SPDX-License-Identifier: MIT */
/* The executor's parts and what they share (private to src/daemon/executor*.c;
 * the executor's interface is executor.h).  docs/design.md §2:
 *   executor.c          mandates on the loop: fire and retry, the queue and
 *                       its slots, cancel, acting on each advance job's
 *                       decision, the graceful stop           (executor_…)
 *   executor_advance.c  the advance job on the mandate's serial queue:
 *                       append, fold, decide, append, flush  (advance_…)
 *   executor_handler.c  handler runs: through child.h (stdin, stdout,
 *                       the end of stderr, timeouts and kills), stderr to
 *                       the log, the step's records from how it ended; the
 *                       handlers' environment and process groups (handler_…)
 *   executor_archive.c  finished mandates archived in batches (archive_…)
 * The functions of executor.h keep their executor_ names in whichever file
 * holds them (executor_init, executor_step_of, … are in executor_handler.c). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "cgroup.h"
#include "daemon.h"
#include "kairos/decide.h"
#include "kairos/kbuf.h"
#include "kairos/planner.h"
#include "kairos/wal.h"
#include "result.h"
#include "child.h"
#include "runner.h"

#define MAX_BATCH 24                /* records an advance job appends first */

/* The executor's own state (d->executor), made by executor_init and freed
 * by executor_free; other modules reach it through executor.h. */
struct executor {
        struct mandate *queue_head, *queue_tail;  /* runnable, FIFO */
        unsigned running;                          /* mandates holding a slot */
        void (*idle)(struct daemon *d);            /* shutdown: nothing runs any more */
        uv_timer_t grace_timer;
        /* finished mandates whose archives wait for one syncfs (executor_archive.c) */
        struct mandate **arch_pending;
        char **arch_paths;                         /* their archive paths */
        size_t arch_npending, arch_cap;
        char **arch_batch_paths;                   /* of the batch being synced */
        bool arch_syncing;                         /* a batch's syncfs is running */
        unsigned arch_unlinking;                   /* WAL unlinks in flight */
        bool arch_unsynced;                        /* WALs unlinked since the last syncfs */
        uv_timer_t arch_timer;
        bool arch_timer_init;
        /* handlers */
        struct strmap *handler_groups;             /* running handlers by process group */
        unsigned nstarting;                        /* started, their pid not yet reported */
        struct start_waiter *start_waiters;        /* executor_after_start */
        struct exec_run *live;                     /* runs whose handles are open */
        struct cgroup_ctl *cgroup;                 /* cgroup.h: handler cgroups; NULL: none */
        char cgroup_why[256];                      /* why there is none */
};

/* ---- the advance job (executor_advance.c) ---- */

enum next_kind {
        NEXT_NONE,           /* stop here (shutdown, or nothing to decide) */
        NEXT_RUN_STEP,       /* spawn the handler of `step` */
        NEXT_AWAIT_APPROVAL, /* act asked for approval */
        NEXT_REVIEW,         /* a step needs a human */
        NEXT_PAUSE,          /* cannot go on (schedule missing, ...) */
        NEXT_END,            /* the mandate is over: archived */
        NEXT_RETRY_WAIT,     /* a failed step runs again at retry_due_ms */
        NEXT_RETRY_EVIDENCE, /* ... its retry is due: its evidence decides (recover_again) */
};

struct advance {
        struct mandate *m;
        struct op_reply reply;        /* fire: answered when durable */
        bool log_fired;               /* fire in a cluster: "fired S at T" once
                                       * durable, i.e. its tick's claim won */
        bool decide;                  /* fold + decide + act (false: only append + flush) */
        /* records to append first (strings owned by `owned`) */
        struct wal_record pre[MAX_BATCH];
        size_t npre;
        struct planner_plan plan;     /* storage for a plan_commit in pre */
        struct wal_step wsteps[PLANNER_PHASES];
        struct planner_plan prev_plan; /* retry --from: the cycle before (carry.h) */
        struct wal_step prev_wsteps[PLANNER_PHASES];
        char *owned[64];
        size_t nowned;
        /* configuration snapshot */
        unsigned max_cycles;
        bool has_command[PLANNER_PHASES];
        unsigned completed_inline[PLANNER_PHASES]; /* steps without a command, completed */
        char *schedule;
        char *fired_at;
        char *goal;
        int retry;                 /* the mandate's retry number (planner.h) */
        bool schedule_known;
        /* results */
        int error;                    /* WAL failure (negative errno) */
        char errmsg[256];
        enum next_kind next;
        enum mandate_status end_status;
        char *reason;
        long long cycle;
        char *plan_id;
        char *step_id;
        char *idem_key;
        char *expected_post;
        char *archive_path;           /* NEXT_END: where the WAL went */
        int64_t ended_ms;             /* NEXT_END: the end its summary holds */
        int64_t started_ms;           /* its WAL's mandate record's time; 0 unknown */
        int64_t down_ms;              /* NEXT_END: its fold's down_ms */
        /* Decided on the loop when the job was made: the mandate runs alone
         * (nothing else holds a slot, no batch waits) on a file system whose
         * syncfs is a barrier, not in cluster mode.  If it ends, its last
         * records, summary and archive are made durable by ONE syncfs of
         * its own (no fdatasync of the WAL first) and its WAL goes at once
         * (docs/design.md §6, rule 4). */
        bool end_alone;
        bool end_synced;              /* NEXT_END: that syncfs returned 0 */
        int unlink_error;             /* end_synced: the WAL's unlink, in the same job */
        unsigned attempt;
        int phase;
        struct kbuf stdin_doc;
        uint64_t flushes;
        bool cycle_finished;
        /* kairosctl cancel: record the end instead of deciding */
        bool cancel, cancel_too_late;
        char *cancel_reason;
        long long cancel_uid;
        struct op_reply cancel_reply;
        char *interrupted;            /* the step whose handler the cancel stopped */
        /* the step retry policy (RetryAttempts=...) per phase */
        struct retry_policy retry_policy[PLANNER_PHASES];
        unsigned retry_evidence_phases;
        long long retry_due_ms;       /* NEXT_RETRY_WAIT */
        unsigned retries_written[PLANNER_PHASES]; /* retry_wait records appended */
        /* NEXT_END failed or terminated: the failed step's end as its
         * record says (hooks.h), for a page this kairosd did not see fail */
        struct hook_failure *wal_failure;
        /* NEXT_REVIEW: the evidence of the step's needs_review record */
        char *review_evidence;
};

struct mandate_cancel {
        char *reason;
        uid_t uid;
        struct op_reply reply;
        bool submitted;               /* its advance job is queued */
};

/* s copied into a's storage (freed with a); NULL when out of memory. */
char *advance_own(struct advance *a, const char *s);
/* s (malloc'd) taken into a's storage; NULL (s freed) when full. */
char *advance_take(struct advance *a, char *s);
/* A job for m with a snapshot of its schedule's configuration; NULL when
 * out of memory. */
struct advance *advance_new(struct mandate *m);
void advance_free(struct advance *a);
/* r = the plan_commit record of p (p copied into a). */
void advance_set_plan(struct advance *a, struct wal_record *r, const struct planner_plan *p);
enum mandate_status advance_end_status(enum decide_end e);
/* The job (pool thread): append a->pre, then fold + decide + append (or the
 * cancel's records), flush once; at the end, the summary and archive. */
void advance_work(void *arg);

/* ---- handler runs (executor_handler.c) ---- */

struct exec_run {
        struct mandate *m;
        struct child child;           /* the process (child.h): its output, how it ended */
        char **argv, **env;           /* owned: the child's argv and environment */
        char *cwd;
        char *cmdline;
        bool starting;                /* handed to the runner, not started yet */
        bool waiting_retry;           /* its start failed for want of resources */
        bool started;
        unsigned retry_ms, tries;
        char *stdin_doc;
        size_t stdin_cap;             /* its buffer's size */
        struct kbuf err_line;
        size_t err_accepted, err_dropped; /* stderr bytes logged / not logged */
        bool finished;
        bool killed_for_shutdown, spawn_failed;
        char spawn_error[256];
        unsigned timeout_sec;
        unsigned attempt;
        pid_t pid;
        int phase;
        char *step_id;
        char *expected_post;
        uint64_t started_us;       /* now_us_monotonic() at the spawn */
        uint64_t kill_mark;        /* own.kill_mark before the spawn */
        struct exec_run *live_prev, *live_next; /* executor's `live` list */
};

/* b (empty, no buffer yet) given the buffer of an earlier stdin document,
 * when one was kept (any thread). */
void executor_stdin_buffer(struct kbuf *b);
/* Start the handler of a's step (a->step_id); the mandate holds a slot. */
void handler_spawn(struct mandate *m, struct advance *a);
/* kairosctl cancel: SIGTERM to its process group, SIGKILL after the grace. */
void handler_stop(struct exec_run *run);
/* Close its handles; run is freed once they are closed. */
void handler_close(struct exec_run *run);
/* Stopping while its start waits for resources: it is not started. */
void handler_retry_give_up(struct exec_run *run);
/* sig to its process group, if it runs. */
void handler_kill(struct exec_run *run, int sig);

/* ---- mandates on the loop (executor.c) ---- */

/* Queue a on m's serial queue; its done acts on the decision. */
void executor_submit(struct mandate *m, struct advance *a);
/* Free m's pending cancel (answering "dropped" if it was not answered). */
void executor_cancel_drop(struct mandate *m);
/* Stop the wait for a step's retry, if any. */
void executor_retry_stop(struct mandate *m);
/* Queue the cancel's records (a: a job that already holds the interrupted
 * step's record, or NULL). */
void executor_cancel_submit(struct mandate *m, struct advance *a);
void executor_release_slot(struct mandate *m);
/* Stopping, nothing runs and no archive is in flight: tell the stop. */
void executor_check_idle(struct daemon *d);

/* ---- archiving (executor_archive.c) ---- */

/* m ended: archive_path (stolen) joins the next batch. */
void archive_enqueue(struct mandate *m, char *archive_path);
/* m ended alone and its own syncfs made its summary and archive durable
 * (struct advance, end_alone): the same job unlinked its WAL then (error:
 * that unlink's), no batch and no job of its own. */
void archive_synced(struct mandate *m, char *archive_path, int error);
/* Start a batch now. */
void archive_flush(struct daemon *d);
/* Anything waiting, syncing, unlinking or unsynced. */
bool archive_busy(const struct daemon *d);
