/* SPDX-License-Identifier: MIT */
/* recovery: the pure recovery planner (docs/design.md §8).  Given a folded WAL it
 * decides, for every unfinished plan, what happens to each unfinished step
 * and which records recovery appends.  It does no I/O: the daemon appends the
 * records (and `kairosctl recover --dry-run` prints them). */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "kairos/fold.h"
#include "kairos/planner.h"
#include "kairos/verdict.h"
#include "kairos/wal.h"

enum recovery_outcome {
        RECOVERY_RESUME,             /* runs again from resume_step */
        RECOVERY_PAUSED_REVIEW,      /* a step needs a human: mandate paused_review */
        RECOVERY_FINALIZED_FAILED,   /* held a failed step: finalized failed */
        RECOVERY_FINALIZED_SUCCEEDED,/* every step completed: finalized succeeded */
        RECOVERY_AWAIT_PROBE,        /* a step waits for its probe: nothing recorded for it */
};

struct recovery_decision {
        size_t step;                 /* index into fold.steps */
        struct verdict verdict;
        bool has_record;             /* a record is appended for it */
        struct wal_record record;    /* strings borrow from the fold and the recovery */
};

struct recovery_plan {
        size_t plan;                 /* index into fold.plans */
        enum recovery_outcome outcome;
        size_t resume_step;          /* RESUME: index into fold.steps of the first step to run */
        const char *pause_step;      /* PAUSED_REVIEW: step_id that needs review */
        const char *pause_reason;    /* its evidence reason */
        const char *probe_step;      /* AWAIT_PROBE: step_id whose probe decides it */
        size_t probe_index;          /* ... its index into fold.steps */
        struct recovery_decision *decisions; /* one per unfinished step examined, in order */
        size_t ndecisions;
        bool has_finalize;           /* a plan_finalize record is appended */
        struct wal_record finalize;
};

struct recovery {
        struct recovery_plan *plans; /* one per unfinished plan, in WAL order */
        size_t nplans;
        struct recovery_internal *internal;
};

/* A CORRUPT fold is refused (-EBADMSG): corrupt files are quarantined, never
 * recovered.  A TORN fold is planned from its good records.  Every verdict is
 * taken without current hashes (recovery decides from the log alone). */
int recovery_plan_fold(const struct fold *f, struct recovery **out);
void recovery_free(struct recovery *r);

/* World-state probe (docs/design.md §8, "later work"): sets the current pre/post
 * hashes of a step at recovery time, or leaves them NULL.  The strings are
 * copied; they need only live until the probe is called again. */
typedef void (*recovery_probe_fn)(void *ctx, const struct fold_step *s, const char **current_pre,
                                  const char **current_post);
/* recovery_plan_fold with a probe (NULL: none). */
int recovery_plan_fold_probe(const struct fold *f, recovery_probe_fn probe, void *ctx,
                             struct recovery **out);

/* Evidence beyond the WAL, for steps the WAL alone leaves open (interrupted
 * during execution).  Sources in order: what the step is (its phase is not
 * in `effects`, or has no command → safe_to_retry), the idempotency store
 * (an owned tool call still open: its own check, else the probe, decides
 * it, else manual_review; none, and the schedule promises every effect
 * goes through kairosctl → safe_to_retry), the probe's word.  A step that only a probe can decide and whose probe has not spoken
 * yet is left undecided: its plan's outcome is RECOVERY_AWAIT_PROBE (no
 * record for it, nothing after it); the caller runs the probe and decides
 * again with its word.  A NULL evidence pointer: the WAL alone decides. */
enum recovery_probe {
        RECOVERY_PROBE_NONE,          /* no probe ran */
        RECOVERY_PROBE_DONE,          /* {"state":"done","result":…} */
        RECOVERY_PROBE_NOT_STARTED,   /* {"state":"not_started"} */
        RECOVERY_PROBE_FAILED,        /* anything else, non-zero exit, timeout */
};

struct recovery_step_evidence {
        const char *step_id;
        /* idempotency store: tool calls owned by this step */
        unsigned idem_open;           /* entries still processing or interrupted */
        unsigned idem_checks;         /* ... of them, those that carry their own check */
        unsigned idem_finished;
        const char *idem_json;        /* the entries as a JSON array (evidence), or NULL */
        /* probe */
        enum recovery_probe probe;
        const char *probe_result_json;/* PROBE_DONE: the result (JSON) */
        const char *probe_output;     /* PROBE_FAILED: what it said (text) */
        /* a call's own check (kairosctl tool run --check): the daemon runs
         * it and settles the call (done: completed, not_started: released)
         * before deciding again; only an inconclusive word reaches here */
        enum recovery_probe check;    /* PROBE_FAILED: inconclusive */
        const char *check_key;        /* the call it checked */
        const char *check_output;     /* what it said (text) */
};

struct recovery_evidence {
        unsigned effects;             /* bit (1 << phase): phases that change the world */
        bool effects_via_kairosctl;   /* every effect goes through kairosctl tool */
        bool has_probe;               /* the schedule has a Probe=: a step the sources
                                       * before it leave open, with no probe word yet
                                       * (RECOVERY_PROBE_NONE), awaits its probe */
        bool has_command[PLANNER_PHASES];
        const struct recovery_step_evidence *steps;
        size_t nsteps;
        /* A failed step waiting for its retry (retry_wait) whose due time
         * is at or before retry_now_ms (ms since the epoch), of an Effects=
         * phase under EffectsVia=kairosctl: decided as a step a crash cut
         * off (the same sources, the same order) instead of being run again
         * blindly.  0: such steps are left waiting (RECOVERY_RESUME at
         * them, no record). */
        int64_t retry_now_ms;
};

/* recovery_plan_fold with evidence (NULL: the WAL alone). */
int recovery_plan_fold_evidence(const struct fold *f, const struct recovery_evidence *ev,
                                struct recovery **out);

/* All records of the recovery in append order. */
size_t recovery_record_count(const struct recovery *r);
/* The i-th record in append order (per plan: its decisions' records, then
 * its plan_finalize), or NULL when i >= recovery_record_count(). */
const struct wal_record *recovery_record_at(const struct recovery *r, size_t i);

const char *recovery_outcome_name(enum recovery_outcome o);

/* The reason of the needs_review record kairosd writes for a step whose
 * handler a graceful stop killed (GracefulTimeoutSec= ran out). */
#define RECOVERY_KILLED_AT_SHUTDOWN "killed_at_shutdown"
/* Was s's handler killed by a graceful stop, and nothing recorded since?
 * Recovery decides such a step as one cut off by a crash (the same
 * evidence, the same order); its records say "killed_at_shutdown":true, and
 * when nothing beyond the WAL decides it the stop's record stands. */
bool recovery_step_stopped(const struct fold_step *s);
/* Was s cut off while its handler ran: executing, or stopped? */
bool recovery_step_interrupted(const struct fold_step *s);
/* What a decision does to its step, as the journal and kairosctl say it. */
const char *recovery_action_text(const struct recovery_decision *dec);
