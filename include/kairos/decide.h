/* SPDX-License-Identifier: MIT */
/* decide: what a mandate does next, from its folded WAL.  Pure, no I/O.
 *
 * Two questions, one module, so the live executor, startup recovery and
 * `kairosctl recover --dry-run` cannot disagree:
 *
 *   decide_next     the live rule: given the fold and the schedule's
 *                   settings, the one next thing (run a step, complete a
 *                   step that has no command, finalize the open plan, start
 *                   the next cycle, end the mandate, pause, or nothing) and
 *                   the WAL records that make it so.  The caller appends the
 *                   records, folds them, and asks again while the answer
 *                   says `again` (finalize, new cycle, a step completed
 *                   without a command); one flush then covers all of it.
 *
 *   decide_recover  the startup rule for one WAL file: quarantine it
 *                   (corrupt), remove it (a fire that was never
 *                   acknowledged), or recover each unfinished plan (the
 *                   recovery planner, with optional evidence beyond the WAL)
 *                   and say whether the mandate runs on or waits for review.
 *
 * docs/design.md describes the rules in prose. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "kairos/fold.h"
#include "kairos/planner.h"
#include "kairos/recovery.h"
#include "kairos/retry.h"
#include "kairos/wal.h"

/* ---- the live rule ---- */

/* What the fold does not hold: the mandate's identity and its schedule's
 * settings.  schedule/fired_at come from the mandate record (or the
 * summary); NULL when unknown. */
struct decide_input {
        const char *mandate_id;
        const char *schedule;
        const char *fired_at;
        int retry;                       /* the mandate's retry number (0: the tick's first) */
        bool schedule_known;             /* the schedule is in the configuration */
        unsigned max_cycles;             /* MaxCycles= (1 when the schedule is unknown) */
        bool has_command[PLANNER_PHASES];/* which phases have a command */
        /* the step retry policy per phase (NULL: no retry), the time now
         * (ms since the epoch) and a random number for the jitter */
        const struct retry_policy *retry_policy;  /* [PLANNER_PHASES] */
        int64_t now_ms;
        uint32_t jitter_rand;
        /* bit (1 << phase): a due retry of this phase is decided by the
         * step's evidence, as after a crash (an Effects= phase under
         * EffectsVia=kairosctl): DECIDE_RETRY_EVIDENCE, never run blindly */
        unsigned retry_evidence_phases;
};

enum decide_kind {
        DECIDE_NOTHING,         /* nothing to do */
        DECIDE_START_CYCLE,     /* append records[0] (plan_commit of `cycle`); again */
        DECIDE_FINALIZE,        /* append records[0] (plan_finalize); again */
        DECIDE_COMPLETE_STEP,   /* a phase without command: append + completed (null); again */
        DECIDE_RUN_STEP,        /* append + executing, flush, then spawn the handler */
        DECIDE_AWAIT_APPROVAL,  /* act asked for approval: pause until approved */
        DECIDE_REVIEW,          /* a step needs a human */
        DECIDE_PAUSE,           /* cannot go on (schedule unknown or missing, ...) */
        DECIDE_END,             /* the mandate is over */
        DECIDE_RETRY_WAIT,      /* a failed step is retried at due_ms: with records[0]
                                 * (retry_wait), append it and decide again; without,
                                 * wait until due_ms and decide again */
        DECIDE_RETRY_EVIDENCE,  /* step_id's retry is due and its effect journaled: the
                                 * recovery's evidence decides it (recovery.h,
                                 * retry_now_ms), nothing recorded here */
};

enum decide_end {
        DECIDE_END_DONE,        /* reflect said done, or MaxCycles reached */
        DECIDE_END_FAILED,      /* the last allowed cycle failed */
        DECIDE_END_TERMINATED,  /* two consecutive failed cycles */
        DECIDE_END_ABANDONED,   /* an operator abandoned the plan */
        DECIDE_END_CANCELLED,   /* ... by cancelling the mandate (an operator "cancel" record) */
};

struct decide_next {
        enum decide_kind kind;
        bool again;                  /* append the records, fold them, decide again */
        enum decide_end end;         /* DECIDE_END */
        const char *reason;          /* END, PAUSE, REVIEW, AWAIT_APPROVAL, FINALIZE */
        long long cycle;             /* of the plan concerned (0: none yet) */
        const char *plan_id;         /* the plan concerned, or NULL */
        const char *step_id;         /* RUN/COMPLETE: the step; REVIEW/APPROVAL: the step waiting */
        size_t plan;                 /* index into fold.plans (when plan_id) */
        size_t step;                 /* index into fold.steps (RUN/COMPLETE) */
        int phase;                   /* RUN/COMPLETE: enum planner_phase, else -1 */
        unsigned attempt;            /* RUN: executions + 1 */
        long long due_ms;            /* RETRY_WAIT: when the step runs again */
        bool cycle_finished;         /* FINALIZE: a cycle ended */
        const char *idem_key;        /* RUN/COMPLETE */
        const char *expected_post;   /* RUN/COMPLETE: "" when the plan has none */
        struct wal_record records[2];
        size_t nrecords;
        /* storage the pointers above may borrow (besides the fold) */
        char idem_key_buf[2 * PLANNER_ID_MAX + PLANNER_STEP_ID_MAX + 64];
        char reason_buf[256];
        char hash_buf[CANON_HASH_STRLEN];
        struct planner_plan new_plan;
        struct wal_step wsteps[PLANNER_PHASES];
};

/* One decision.  Pointers in *ret_next borrow from f, in and *ret_next;
 * they live until f changes.  -EINVAL on a NULL argument, -EBADMSG on a
 * CORRUPT fold, -ENOMEM. */
int decide_next(const struct fold *f, const struct decide_input *in, struct decide_next *ret_next);

const char *decide_kind_name(enum decide_kind k);
const char *decide_end_name(enum decide_end e);

/* ---- the startup rule ---- */

enum decide_file {
        DECIDE_FILE_RECOVER,      /* recover the plans (recovery below) */
        DECIDE_FILE_QUARANTINE,   /* corrupt: no appends, mandate paused (wal_corrupt) */
        DECIDE_FILE_REMOVE,       /* no plan, no operator, at most the mandate record, no
                                   * summary: a fire never acknowledged; delete the file */
};

enum decide_mandate {
        DECIDE_MANDATE_RUNNABLE,      /* goes on: decide_next says what comes next */
        DECIDE_MANDATE_PAUSED_REVIEW, /* a step needs a human */
        DECIDE_MANDATE_PROBING,       /* a step waits for its probe (Probe=): run it, then
                                       * decide again with its word */
};

struct decide_recovery {
        enum decide_file file;
        struct recovery *recovery;   /* FILE_RECOVER: the planner's decisions and records */
        enum decide_mandate mandate; /* FILE_RECOVER: afterwards */
        const char *review_step;     /* PAUSED_REVIEW (borrows from the fold / recovery) */
        const char *review_reason;
        const char *probe_step;      /* PROBING: the step whose probe decides */
};

/* had_summary: the mandate ended before (mandates/ID.json exists).  ev:
 * evidence beyond the WAL, NULL for the WAL alone.  Free with
 * decide_recovery_release (the struct itself is the caller's). */
int decide_recover(const struct fold *f, bool had_summary, const struct recovery_evidence *ev,
                   struct decide_recovery *ret_rec);
void decide_recovery_release(struct decide_recovery *rec);

const char *decide_file_name(enum decide_file d);
