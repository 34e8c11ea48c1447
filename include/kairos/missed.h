/* SPDX-License-Identifier: MIT */
/* missed: which ticks of a schedule fire when it is evaluated at `now`, given
 * the last evaluation (downtime, a suspended machine, a late timer).  Pure:
 * no I/O, no clock; the scheduler of kairosd and the unit tests call it.
 *
 * The ticks of (last_evaluated, now] fall in two parts:
 *   - the current tick: the latest one, if it is at most
 *     max(MISSED_ON_TIME_SEC, grace_sec) old (MissedGraceSec=); it always
 *     fires, as an ordinary tick;
 *   - missed: all the others, through the policy: skip fires none,
 *     catch_up_once one run for the whole missed period (the latest missed
 *     tick, or none when the current tick fires: it is that run, like
 *     systemd's Persistent=true), catch_up_bounded the latest
 *     max_catch_up_runs — or, if the last fire is older than stale_after_sec
 *     ("stale"), as catch_up_once.
 * Every missed tick not fired is counted as dropped (first and last kept). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kairos/config.h"
#include "kairos/cron.h"

/* A tick at most this late is on time even with grace_sec 0 (the timer's own
 * lateness). */
#define MISSED_ON_TIME_SEC 60
/* Upper bound of grace_sec (MissedGraceSec=). */
#define MISSED_GRACE_MAX_SEC 3600
/* Upper bound of max_catch_up_runs (MaxCatchUpRuns=). */
#define MISSED_CATCH_UP_MAX 1000
/* At most this many on-time ticks fire (a minutely schedule has 61 in an hour). */
#define MISSED_ON_TIME_MAX 128
#define MISSED_FIRES_MAX (MISSED_CATCH_UP_MAX + MISSED_ON_TIME_MAX)
/* Missed ticks are counted one by one up to this many; beyond, the count is
 * a lower bound and the latest ticks are found by bisection (bounded work
 * even after a clock jump of thousands of years). */
#define MISSED_COUNT_MAX 1000
/* "never" for last_fire */
#define MISSED_NEVER INT64_MIN

struct missed_rule {
        enum config_missed_policy policy;
        unsigned max_catch_up_runs;     /* catch_up_bounded: 1..MISSED_CATCH_UP_MAX */
        uint64_t stale_after_sec;       /* catch_up_bounded: StaleAfter= */
        uint64_t grace_sec;             /* MissedGraceSec=, 0..MISSED_GRACE_MAX_SEC */
};

struct missed_plan {
        int64_t fire[MISSED_FIRES_MAX]; /* the ticks that fire, ascending */
        size_t nfire;
        size_t ncatch_up;               /* fire[0..ncatch_up) are catch-up runs (policy),
                                         * ascending; fire[ncatch_up], if any, is the
                                         * current tick (within the grace) */
        uint64_t dropped;               /* ticks of the window not fired */
        bool dropped_more;              /* dropped is a lower bound (too many to count) */
        bool stale;                     /* catch_up_bounded and the last fire is older
                                         * than stale_after_sec */
        bool covered;                   /* dropped because the current tick runs for the
                                         * missed period (catch_up_once, stale) */
        int64_t dropped_first, dropped_last; /* the oldest and latest dropped tick, or
                                              * MISSED_NEVER */
};

/* The ticks of (last_evaluated, now] of e in tz (NULL = UTC) that fire, into
 * *ret.  last_fire: the latest tick fired so far, or MISSED_NEVER.  now <=
 * last_evaluated gives an empty plan.  -ERANGE if now or last_evaluated is
 * outside [CRON_TIME_MIN, CRON_TIME_MAX] (nothing written), -EINVAL on a NULL
 * argument or a rule out of bounds. */
int missed_plan(const struct cron_expr *e, const struct cron_tz *tz,
                const struct missed_rule *rule, int64_t last_evaluated, int64_t last_fire,
                int64_t now, struct missed_plan *ret);
