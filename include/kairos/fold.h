/* SPDX-License-Identifier: MIT */
/* fold: rebuild plans and steps from a WAL's bytes (docs/design.md §6), compatible
 * with legacy WAL files plus the marked FIXes.  Never crashes, never loops,
 * allocates at most O(input) memory.
 *
 * Classification of the file:
 *   CLEAN    every non-blank line is a good record;
 *   TORN     only the last non-blank line is bad, and it could be a strict
 *            prefix of one record (or is a whole record missing its '\n');
 *            the records before it are folded;
 *   CORRUPT  a bad line is followed by more lines, or the last line cannot
 *            be a prefix of one record (e.g. a complete crc-valid record
 *            followed by more bytes).  Records before the bad line are
 *            folded; nothing after it is.  The file must be quarantined.
 * A good record: a JSON object on one line whose crc (if any) matches; a line
 * without crc (legacy, written by older writers) must end with its "ts" member. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum fold_status {
        FOLD_CLEAN,
        FOLD_TORN,
        FOLD_CORRUPT,
};

/* A step's status at the library boundary.  The WAL holds it as text
 * ("pending", "executing", ...); the text as recorded stays in
 * fold_step.status for display, the enum is what code compares. */
enum step_status {
        STEP_NONE,          /* no record set a status yet */
        STEP_PENDING,
        STEP_EXECUTING,
        STEP_COMPLETED,
        STEP_FAILED,
        STEP_NEEDS_REVIEW,
        STEP_ABANDONED,
        STEP_OTHER,         /* a status kairos does not know (kept as text) */
};

/* A plan's final status (plan_finalize). */
enum plan_status {
        PLAN_OPEN,          /* not finalized */
        PLAN_SUCCEEDED,
        PLAN_FAILED,
        PLAN_ABANDONED,
        PLAN_OTHER,         /* finalized with a status kairos does not know, or none */
};

enum step_status step_status_parse(const char *text);
enum plan_status plan_status_parse(const char *text);
/* "pending", ...; NULL for STEP_NONE and STEP_OTHER. */
const char *step_status_name(enum step_status s);
/* "succeeded", ...; NULL for PLAN_OPEN and PLAN_OTHER. */
const char *plan_status_name(enum plan_status s);

/* Every string is NUL-terminated and owned by the fold; NULL = absent. */
struct fold_step {
        const char *step_id;
        const char *plan_id;
        const char *tool;
        const char *params_hash;
        const char *pre_hash;            /* expected, from the plan */
        const char *expected_post_hash;
        const char *idem_key;
        enum step_status state;          /* last status (append: pending, transitions) */
        const char *status;              /* ... as recorded (text), NULL if none */
        const char *observed_pre_hash;   /* from the executing record */
        const char *post_hash;
        const char *result_hash;
        const char *result_json;         /* compact JSON of the completed record's result */
        size_t result_len;               /* its length (strlen) */
        const char *evidence_json;
        const char *error_class;
        const char *error_msg;
        /* the last failed record's handler end (optional in the record):
         * its exit status (has_exit_status), signal (0: none) and the end
         * of its stderr (NULL: none); cleared by the next status */
        bool has_exit_status;
        int exit_status;
        int exit_signal;
        const char *stderr_tail;
        const char *reason;
        bool recovered;
        const char *started_ts;          /* ts of the last executing record */
        const char *ended_ts;            /* ts of the completed/failed/needs_review after it */
        unsigned executions;             /* executing records seen */
        unsigned resets;
        /* The last execution that ended without its handler's word (kairosd
         * went down under it, or killed it at shutdown) and what decided it
         * (recovery, its probe, an operator); 0/NULL: none. */
        unsigned interrupted_execution;  /* its number (1-based) */
        const char *interrupted_started_ts; /* its executing record */
        const char *interrupted_ended_ts;   /* the last record before the restart
                                             * (a kill at shutdown: that record) */
        const char *decided_ts;             /* the record that decided it */
        const char *decided_status;         /* pending (run again), completed, failed,
                                             * needs_review */
        const char *decided_evidence_json;
        /* Step retries (RetryAttempts=): retry_wait records of this step,
         * the due time of the last one, and whether the step waits for it
         * (failed, and no record since). */
        unsigned retries;
        long long retry_due_ms;
        bool retry_waiting;
        /* "MANDATE/STEP": the step was not run here but carried, completed
         * with that step's result (kairosctl retry --from); NULL: not */
        const char *carried_from;
        size_t plan;                     /* index into fold.plans */
};

/* One retry_wait record: attempt `attempt` of the step failed; the step
 * runs again at due_ms.  The attempt's times and error are the step's when
 * the record was folded. */
struct fold_retry {
        size_t step;                     /* index into fold.steps */
        long long attempt;
        const char *error_class;
        const char *error_msg;
        const char *started_ts;
        const char *ended_ts;
        long long due_ms;
        const char *ts;
};

struct fold_plan {
        const char *plan_id;
        const char *mandate_id;
        long long cycle;
        const char *plan_hash;
        size_t *steps;                   /* indices into fold.steps, plan order */
        size_t nsteps;
        bool finalized;
        enum plan_status final_state;    /* PLAN_OPEN until finalized */
        const char *final_status;        /* ... as recorded: succeeded | failed | abandoned */
        const char *final_reason;
        const char *orphan_reason;       /* "orphan_steps_detected" for orphan plans */
        size_t line;                     /* 1-based line that created it */
};

struct fold_operator {
        const char *mandate_id;
        const char *action;
        const char *step_id;
        const char *reason;
        long long uid;
        const char *ts;
        size_t line;
};

/* The mandate record (kairos): who fired it.  All NULL if the WAL has none
 * (written by older writers, or by a test). */
struct fold_mandate {
        const char *mandate_id;
        const char *schedule;
        const char *fired_at;
        const char *goal;
        const char *retry_of;            /* a retry: the mandate it retries, else NULL */
        long long retry;                 /* ... and its number (>= 1); 0 otherwise */
        const char *ts;                  /* when it was written */
        size_t line;                     /* 0: none */
};

struct fold {
        struct fold_mandate mandate;
        struct fold_plan *plans;         /* in order of first commit */
        size_t nplans;
        struct fold_step *steps;
        size_t nsteps;
        struct fold_operator *operators;
        size_t noperators;
        struct fold_retry *retries;      /* in WAL order */
        size_t nretries;
        const char *first_ts;            /* ts of the first and last good record */
        const char *last_ts;
        /* The time a restart took from executions: for each execution that
         * ended without its handler's word (interrupted_execution), from the
         * last record before the restart to the first after it, summed (ms;
         * list's DURATION leaves it out, as show's step durations do) */
        int64_t down_ms;

        enum fold_status status;
        size_t lines;                    /* lines seen (incl. blank and bad) */
        size_t records;                  /* good records folded */
        size_t legacy_records;           /* good records without crc */
        size_t fast_records;             /* good records read without the general parser
                                          * (fold.c's fast path; same state either way) */
        size_t unknown_ops;
        size_t owner_records;            /* cluster mode: takeovers (op owner) */
        size_t good_end;                 /* byte offset just past the last good record */
        size_t bad_line;                 /* TORN/CORRUPT: 1-based line of the bad line */
        size_t bad_offset;               /* ... and its byte offset */
        char bad_reason[128];

        struct fold_internal *internal;
};

/* Fold a buffer / a file.  -ENOMEM; fold_file: -errno of open/read. */
int fold_buffer(const char *data, size_t len, struct fold **out);
/* As fold_buffer, every line through the general parser (no fast path of
 * plain lines): the reference the fast path is tested against. */
int fold_buffer_tree(const char *data, size_t len, struct fold **out);
/* An empty fold (CLEAN, no record), to be fed with fold_feed. */
int fold_new(struct fold **ret_fold);
/* Fold records appended to the file after f->good_end: data holds the bytes
 * from f->good_end on.  Only whole ('\n'-terminated) lines are folded; an
 * unterminated tail is left for a later call.  A bad line makes the fold
 * CORRUPT (nothing more is folded: every byte fed here was written whole by
 * one append, so a bad line is never a torn tail).  *ret_used: bytes
 * consumed (f->good_end advances past the last good record).  -ENOMEM;
 * -EBADMSG when f is (or becomes) CORRUPT. */
int fold_feed(struct fold *f, const char *data, size_t len, size_t *ret_used);
/* As fold_feed, for lines this process appended itself (wal_take_appended):
 * a completed record's result is kept as the text written, not parsed and
 * written again (it was parsed when the handler gave it: docs/design.md). */
int fold_feed_own(struct fold *f, const char *data, size_t len, size_t *ret_used);
int fold_file(const char *path, struct fold **out);
void fold_free(struct fold *f);

/* Step lookup by id (the latest owner), or NULL. */
const struct fold_step *fold_find_step(const struct fold *f, const char *step_id);
const struct fold_plan *fold_find_plan(const struct fold *f, const char *plan_id);

/* completed, failed or abandoned.  needs_review is not final. */
bool fold_step_finalized(const struct fold_step *s);

const char *fold_status_name(enum fold_status s);

