/* SPDX-License-Identifier: MIT */
/* planner: a fired event (schedule name, fired_at) and a cycle number become
 * the five-step plan of that cycle (docs/design.md §3, §5).  Pure, no I/O. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "kairos/canon.h"

#define PLANNER_PHASES 5
#define PLANNER_ID_MAX 24          /* "plan_" + 12 hex + NUL, "mnd_plan_" + 12 hex + NUL */
#define PLANNER_STEP_ID_MAX 16     /* "reflect_010" */
#define PLANNER_MAX_CYCLE 999
#define PLANNER_FIRED_AT_LEN 21      /* "2026-04-20T12:00:00Z" + NUL */

enum planner_phase {
        PHASE_OBSERVE,
        PHASE_ORIENT,
        PHASE_DECIDE,
        PHASE_ACT,
        PHASE_REFLECT,
};

struct planner_step {
        char step_id[PLANNER_STEP_ID_MAX];
        char tool[16];                          /* "ooda.<phase>" */
        char params_hash[CANON_HASH_STRLEN];
        char pre_hash[CANON_HASH_STRLEN];
        char expected_post_hash[CANON_HASH_STRLEN];
};

struct planner_plan {
        char plan_id[PLANNER_ID_MAX];
        char mandate_id[PLANNER_ID_MAX];
        int cycle;
        char plan_hash[CANON_HASH_STRLEN];
        struct planner_step steps[PLANNER_PHASES];
};

const char *planner_phase_name(enum planner_phase p);
/* Phase of a step id such as "act_002" (and its cycle), or -EINVAL. */
int planner_parse_step_id(const char *step_id, enum planner_phase *phase, int *cycle);

/* plan_id of (name, fired_at, cycle): cycle 1 hashes "NAME|FIRED_AT",
 * cycle >= 2 hashes "NAME|FIRED_AT|c". */
int planner_plan_id(const char *name, const char *fired_at, int cycle,
                    char out[PLANNER_ID_MAX]);
/* "mnd_" + cycle-1 plan_id. */
int planner_mandate_id(const char *name, const char *fired_at, char out[PLANNER_ID_MAX]);

/* Retries (kairosctl retry): retry N >= 1 of the tick (name, fired_at) is a
 * mandate of its own.  Its plan ids hash "NAME|FIRED_AT|retry:N" (cycle 1)
 * and "NAME|FIRED_AT|retry:N|c" (cycle c >= 2); its mandate id is "mnd_" +
 * its cycle-1 plan id.  Retry 0 is the tick's first mandate (the functions
 * above).  -EINVAL for a retry outside 0..PLANNER_MAX_RETRY. */
#define PLANNER_MAX_RETRY 999
int planner_retry_plan_id(const char *name, const char *fired_at, int retry, int cycle,
                          char out[PLANNER_ID_MAX]);
int planner_retry_mandate_id(const char *name, const char *fired_at, int retry,
                             char out[PLANNER_ID_MAX]);

/* May a tick be retried (kairosctl retry)?  The rule is about the tick,
 * not about the mandate the operator names: at most one of the tick's
 * mandates is unfinished at a time, and once one of them ended done, a
 * repeat needs a reason (docs/design.md §3). */
enum planner_tick_state {
        PLANNER_TICK_UNFINISHED,   /* queued, running, paused, probing, ... */
        PLANNER_TICK_DONE,         /* ended done: its work happened */
        PLANNER_TICK_ENDED,        /* ended otherwise (failed, cancelled, ...) */
};
struct planner_tick_mandate {
        const char *id;            /* borrowed */
        int retry;                 /* 0: the tick's first mandate, N >= 1: retry N */
        enum planner_tick_state state;
};
enum planner_retry_verdict {
        PLANNER_RETRY_ALLOWED,
        PLANNER_RETRY_UNFINISHED,  /* refused: *ret_which is unfinished */
        PLANNER_RETRY_NEEDS_REASON, /* refused without a reason: *ret_which ended done */
};
/* Judge a retry of the tick whose known mandates are v[0..n) (any order).
 * *ret_which: the index in v the verdict names (the unfinished mandate of
 * the highest retry number; the done one of the highest), or n when
 * allowed.  -EINVAL for v NULL with n > 0 or a bad state. */
int planner_retry_check(const struct planner_tick_mandate *v, size_t n, bool has_reason,
                        enum planner_retry_verdict *ret_verdict, size_t *ret_which);

/* Build the plan.  -EINVAL for a cycle outside 1..PLANNER_MAX_CYCLE, an empty
 * name or fired_at. */
int planner_build(const char *name, const char *fired_at, int cycle, struct planner_plan *out);
/* The plan of cycle `cycle` of retry `retry` (0: the first mandate). */
int planner_build_retry(const char *name, const char *fired_at, int retry, int cycle,
                        struct planner_plan *out);

/* Append the canonical JSON array of the plan's steps: exactly the five keys
 * step_id, tool, params_hash, pre_hash, expected_post_hash, in canonical
 * (bytewise sorted) key order, so canon_hash_bytes() of these bytes is
 * plan_hash.  (The WAL's plan_commit line writes the same steps in its own
 * key order.) */
int planner_steps_json(const struct planner_plan *p, struct kbuf *out);

/* Identifiers (docs/design.md §3). */
/* A schedule name: [A-Za-z0-9_-]{1,64}. */
bool planner_valid_name(const char *name);
/* fired_at "YYYY-MM-DDTHH:MM:SSZ" (UTC, a real date, year >= 1970) → Unix
 * seconds.  -EINVAL otherwise. */
int planner_parse_fired_at(const char *s, int64_t *unix_seconds);
/* Unix seconds → "YYYY-MM-DDTHH:MM:SSZ".  -EINVAL for negative times. */
int planner_format_fired_at(int64_t unix_seconds, char out[PLANNER_FIRED_AT_LEN]);
