/* SPDX-License-Identifier: MIT */
/* The missed-tick policy: one test per row of the rule. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include <cmocka.h>

#include "kairos/missed.h"

static int64_t U(int y, int mo, int d, int h, int mi)
{
        struct tm tm = { .tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = d, .tm_hour = h,
                         .tm_min = mi };
        return (int64_t)timegm(&tm);
}

static struct cron_expr P(const char *text)
{
        struct cron_expr e;
        assert_int_equal(cron_parse(text, &e, NULL, 0), 0);
        return e;
}

static struct missed_plan plan;

static struct missed_rule R(enum config_missed_policy p, unsigned k, uint64_t stale,
                            uint64_t grace)
{
        return (struct missed_rule){ .policy = p, .max_catch_up_runs = k,
                                     .stale_after_sec = stale, .grace_sec = grace };
}

static void run(const char *expr, struct missed_rule rule, int64_t last_eval, int64_t last_fire,
                int64_t now)
{
        struct cron_expr e = P(expr);
        assert_int_equal(missed_plan(&e, NULL, &rule, last_eval, last_fire, now, &plan), 0);
        assert_true(plan.ncatch_up <= plan.nfire);
        for (size_t i = 1; i < plan.nfire; i++)
                assert_true(plan.fire[i] > plan.fire[i - 1]);
        for (size_t i = 0; i < plan.nfire; i++)
                assert_true(plan.fire[i] > last_eval && plan.fire[i] <= now);
}

#define T0 U(2026, 5, 1, 12, 0)

/* skip: missed ticks are dropped and counted; nothing fires. */
static void test_skip_drops(void **state)
{
        (void)state;
        /* down from 12:00 to 15:30: ticks 13:00 14:00 15:00 all older than the grace */
        run("0 * * * *", R(MISSED_SKIP, 5, 172800, 300), T0, T0, T0 + 3 * 3600 + 1800);
        assert_int_equal(plan.nfire, 0);
        assert_int_equal(plan.dropped, 3);
        assert_false(plan.dropped_more);
        assert_false(plan.stale);
}

/* A tick within a minute is on time even with MissedGraceSec=0. */
static void test_on_time(void **state)
{
        (void)state;
        run("0 * * * *", R(MISSED_SKIP, 5, 172800, 0), T0, T0, T0 + 3600 + 59);
        assert_int_equal(plan.nfire, 1);
        assert_int_equal(plan.ncatch_up, 0);
        assert_int_equal(plan.fire[0], T0 + 3600);
        /* 61 s late with no grace: missed, dropped under skip */
        run("0 * * * *", R(MISSED_SKIP, 5, 172800, 0), T0, T0, T0 + 3600 + 61);
        assert_int_equal(plan.nfire, 0);
        assert_int_equal(plan.dropped, 1);
        /* the boundaries: a tick at last_evaluated is not in the window, one at now is */
        run("0 * * * *", R(MISSED_SKIP, 5, 172800, 0), T0, T0, T0 + 3600);
        assert_int_equal(plan.nfire, 1);
        assert_int_equal(plan.fire[0], T0 + 3600);
        assert_int_equal(plan.dropped, 0);
}

/* MissedGraceSec=: the latest tick of the period, missed by at most that,
 * is the current tick and fires whatever the policy says; every older tick
 * is missed and follows the policy (before: each tick of the grace fired). */
static void test_grace_fires_the_current_tick_only(void **state)
{
        (void)state;
        /* a restart from 12:00:30 to 12:05:10 with a minutely schedule, grace 300 s:
         * 12:05 fires, 12:01 .. 12:04 are missed, skipped */
        run("* * * * *", R(MISSED_SKIP, 5, 172800, 300), T0 + 30, T0, T0 + 310);
        assert_int_equal(plan.nfire, 1);
        assert_int_equal(plan.ncatch_up, 0);
        assert_int_equal(plan.fire[0], T0 + 300);
        assert_int_equal(plan.dropped, 4);
        assert_int_equal(plan.dropped_first, T0 + 60);
        assert_int_equal(plan.dropped_last, T0 + 240);
        assert_false(plan.covered);
        /* a tick 301 s late is outside a 300 s grace: dropped */
        run("0 * * * *", R(MISSED_SKIP, 5, 172800, 300), T0, T0, T0 + 3600 + 301);
        assert_int_equal(plan.nfire, 0);
        assert_int_equal(plan.dropped, 1);
        assert_int_equal(plan.dropped_first, T0 + 3600);
        assert_int_equal(plan.dropped_last, T0 + 3600);
        /* exactly 300 s late: fires */
        run("0 * * * *", R(MISSED_SKIP, 5, 172800, 300), T0, T0, T0 + 3600 + 300);
        assert_int_equal(plan.nfire, 1);
        assert_int_equal(plan.fire[0], T0 + 3600);
        assert_int_equal(plan.dropped, 0);
        assert_int_equal(plan.dropped_first, MISSED_NEVER);
        /* catch_up_once with a current tick: it is the one run of the period */
        run("* * * * *", R(MISSED_CATCH_UP_ONCE, 5, 172800, 120), T0, T0, T0 + 600);
        assert_int_equal(plan.nfire, 1);
        assert_int_equal(plan.ncatch_up, 0);
        assert_int_equal(plan.fire[0], T0 + 600);
        assert_int_equal(plan.dropped, 9);
        assert_true(plan.covered);
}

/* The 3-minute outage of a minutely schedule: down after 12:00:30, back at
 * 12:03:10; 12:01 and 12:02 are missed, 12:03 is the current tick. */
static void test_three_minute_outage(void **state)
{
        (void)state;
        int64_t le = T0 + 30, now = T0 + 190;
        /* skip: the current tick only */
        run("* * * * *", R(MISSED_SKIP, 5, 172800, 300), le, T0, now);
        assert_int_equal(plan.nfire, 1);
        assert_int_equal(plan.fire[0], T0 + 180);
        assert_int_equal(plan.dropped, 2);
        assert_int_equal(plan.dropped_first, T0 + 60);
        assert_int_equal(plan.dropped_last, T0 + 120);
        /* catch_up_once: one run for the period, the current tick */
        run("* * * * *", R(MISSED_CATCH_UP_ONCE, 5, 172800, 300), le, T0, now);
        assert_int_equal(plan.nfire, 1);
        assert_int_equal(plan.ncatch_up, 0);
        assert_int_equal(plan.fire[0], T0 + 180);
        assert_int_equal(plan.dropped, 2);
        assert_true(plan.covered);
        /* catch_up_once with no current tick (an hourly schedule back at
         * 14:30): the latest missed tick, as a catch-up run */
        run("0 * * * *", R(MISSED_CATCH_UP_ONCE, 5, 172800, 300), le, T0, T0 + 9000);
        assert_int_equal(plan.nfire, 1);
        assert_int_equal(plan.ncatch_up, 1);
        assert_int_equal(plan.fire[0], T0 + 7200);
        assert_int_equal(plan.dropped, 1);
        assert_false(plan.covered);
        /* catch_up_bounded: each missed tick (up to the bound), then the current */
        run("* * * * *", R(MISSED_CATCH_UP_BOUNDED, 5, 172800, 300), le, T0, now);
        assert_int_equal(plan.nfire, 3);
        assert_int_equal(plan.ncatch_up, 2);
        assert_int_equal(plan.fire[0], T0 + 60);
        assert_int_equal(plan.fire[1], T0 + 120);
        assert_int_equal(plan.fire[2], T0 + 180);
        assert_int_equal(plan.dropped, 0);
        run("* * * * *", R(MISSED_CATCH_UP_BOUNDED, 1, 172800, 300), le, T0, now);
        assert_int_equal(plan.nfire, 2);
        assert_int_equal(plan.fire[0], T0 + 120);
        assert_int_equal(plan.dropped, 1);
        assert_int_equal(plan.dropped_first, T0 + 60);
        assert_int_equal(plan.dropped_last, T0 + 60);
}

/* catch_up_once: the latest missed tick runs, the others are dropped. */
static void test_catch_up_once(void **state)
{
        (void)state;
        run("0 * * * *", R(MISSED_CATCH_UP_ONCE, 5, 172800, 300), T0, T0, T0 + 5 * 3600 + 1800);
        assert_int_equal(plan.nfire, 1);
        assert_int_equal(plan.ncatch_up, 1);
        assert_int_equal(plan.fire[0], T0 + 5 * 3600);
        assert_int_equal(plan.dropped, 4);
}

/* catch_up_bounded: the latest MaxCatchUpRuns missed ticks, oldest first. */
static void test_catch_up_bounded(void **state)
{
        (void)state;
        run("0 * * * *", R(MISSED_CATCH_UP_BOUNDED, 3, 172800, 300), T0, T0,
            T0 + 10 * 3600 + 1800);
        assert_int_equal(plan.nfire, 3);
        assert_int_equal(plan.ncatch_up, 3);
        assert_int_equal(plan.fire[0], T0 + 8 * 3600);
        assert_int_equal(plan.fire[1], T0 + 9 * 3600);
        assert_int_equal(plan.fire[2], T0 + 10 * 3600);
        assert_int_equal(plan.dropped, 7);
        assert_false(plan.stale);
        /* fewer missed ticks than the bound: all of them */
        run("0 * * * *", R(MISSED_CATCH_UP_BOUNDED, 5, 172800, 300), T0, T0, T0 + 2 * 3600 + 900);
        assert_int_equal(plan.nfire, 2);
        assert_int_equal(plan.dropped, 0);
        /* catch-up runs come before the on-time ticks */
        run("0 * * * *", R(MISSED_CATCH_UP_BOUNDED, 2, 172800, 300), T0, T0, T0 + 4 * 3600 + 10);
        assert_int_equal(plan.nfire, 3);
        assert_int_equal(plan.ncatch_up, 2);
        assert_int_equal(plan.fire[0], T0 + 2 * 3600);
        assert_int_equal(plan.fire[1], T0 + 3 * 3600);
        assert_int_equal(plan.fire[2], T0 + 4 * 3600);
        assert_int_equal(plan.dropped, 1);
}

/* StaleAfter=: a catch_up_bounded schedule whose last fire is older runs once
 * (the latest missed tick), or not at all when an on-time tick fires. */
static void test_stale(void **state)
{
        (void)state;
        int64_t now = T0 + 3 * 86400 + 1800;
        run("0 * * * *", R(MISSED_CATCH_UP_BOUNDED, 5, 48 * 3600, 300), T0, T0, now);
        assert_true(plan.stale);
        assert_int_equal(plan.nfire, 1);
        assert_int_equal(plan.ncatch_up, 1);
        assert_int_equal(plan.fire[0], T0 + 3 * 86400);
        assert_int_equal(plan.dropped, 72 - 1);
        /* with an on-time tick: only that one */
        run("0 * * * *", R(MISSED_CATCH_UP_BOUNDED, 5, 48 * 3600, 300), T0, T0,
            T0 + 3 * 86400 + 10);
        assert_true(plan.stale);
        assert_int_equal(plan.nfire, 1);
        assert_int_equal(plan.ncatch_up, 0);
        assert_int_equal(plan.fire[0], T0 + 3 * 86400);
        assert_int_equal(plan.dropped, 71);
        /* no fire yet: never stale */
        run("0 * * * *", R(MISSED_CATCH_UP_BOUNDED, 5, 48 * 3600, 300), T0, MISSED_NEVER, now);
        assert_false(plan.stale);
        assert_int_equal(plan.nfire, 5);
        /* a recent fire: not stale */
        run("0 * * * *", R(MISSED_CATCH_UP_BOUNDED, 5, 48 * 3600, 300), T0, now - 3600, now);
        assert_false(plan.stale);
        assert_int_equal(plan.nfire, 5);
        /* StaleAfter= does nothing under the other policies */
        run("0 * * * *", R(MISSED_CATCH_UP_ONCE, 5, 60, 300), T0, T0, now);
        assert_false(plan.stale);
        assert_int_equal(plan.nfire, 1);
}

/* The clock went back, or did not move: nothing. */
static void test_clock_back(void **state)
{
        (void)state;
        run("* * * * *", R(MISSED_CATCH_UP_BOUNDED, 5, 172800, 300), T0, T0, T0 - 3600);
        assert_int_equal(plan.nfire, 0);
        assert_int_equal(plan.dropped, 0);
        run("* * * * *", R(MISSED_CATCH_UP_BOUNDED, 5, 172800, 300), T0, T0, T0);
        assert_int_equal(plan.nfire, 0);
}

/* Outside years 1970-9999: -ERANGE, nothing written; bad arguments: -EINVAL. */
static void test_range_and_args(void **state)
{
        (void)state;
        struct cron_expr e = P("0 * * * *");
        struct missed_rule r = R(MISSED_SKIP, 5, 172800, 300);
        plan.nfire = 77;
        assert_int_equal(missed_plan(&e, NULL, &r, T0, T0, (int64_t)1 << 40, &plan), -ERANGE);
        assert_int_equal(missed_plan(&e, NULL, &r, -1, T0, T0, &plan), -ERANGE);
        assert_int_equal(missed_plan(&e, NULL, &r, T0, T0, CRON_TIME_MAX + 1, &plan), -ERANGE);
        assert_int_equal(plan.nfire, 77);
        assert_int_equal(missed_plan(NULL, NULL, &r, T0, T0, T0, &plan), -EINVAL);
        assert_int_equal(missed_plan(&e, NULL, NULL, T0, T0, T0, &plan), -EINVAL);
        assert_int_equal(missed_plan(&e, NULL, &r, T0, T0, T0, NULL), -EINVAL);
        struct missed_rule bad = R(MISSED_CATCH_UP_BOUNDED, 0, 1, 0);
        assert_int_equal(missed_plan(&e, NULL, &bad, T0, T0, T0, &plan), -EINVAL);
        bad = R(MISSED_CATCH_UP_BOUNDED, MISSED_CATCH_UP_MAX + 1, 1, 0);
        assert_int_equal(missed_plan(&e, NULL, &bad, T0, T0, T0, &plan), -EINVAL);
        bad = R(MISSED_SKIP, 5, 1, MISSED_GRACE_MAX_SEC + 1);
        assert_int_equal(missed_plan(&e, NULL, &bad, T0, T0, T0, &plan), -EINVAL);
}

/* A jump of thousands of years: the count stops (a lower bound), the latest
 * ticks are still exact, and so are the on-time ones. */
static void test_huge_jump(void **state)
{
        (void)state;
        int64_t now = U(9999, 6, 1, 0, 0) + 30;
        run("* * * * *", R(MISSED_SKIP, 5, 172800, 300), T0, T0, now);
        assert_int_equal(plan.ncatch_up, 0);
        assert_int_equal(plan.nfire, 1);
        assert_int_equal(plan.fire[0], now - 30);
        assert_true(plan.dropped_more);
        assert_true(plan.dropped >= MISSED_COUNT_MAX);
        assert_int_equal(plan.dropped_first, T0 + 60);
        assert_int_equal(plan.dropped_last, now - 90);

        run("* * * * *", R(MISSED_CATCH_UP_BOUNDED, 7, UINT64_C(3153600000), 300), T0,
            MISSED_NEVER, now);
        assert_int_equal(plan.ncatch_up, 7);
        assert_int_equal(plan.nfire, 8);
        for (size_t i = 0; i < 8; i++)
                assert_int_equal(plan.fire[i], now - 30 - 60 * (7 - (int64_t)i));
        assert_int_equal(plan.dropped_last, now - 30 - 60 * 8);
        assert_true(plan.dropped_more);

        run("0 0 * * *", R(MISSED_CATCH_UP_BOUNDED, MISSED_CATCH_UP_MAX, UINT64_C(3153600000), 0),
            T0, MISSED_NEVER, now);
        assert_int_equal(plan.ncatch_up, MISSED_CATCH_UP_MAX);
        assert_int_equal(plan.fire[MISSED_CATCH_UP_MAX - 1], now - 30 - 86400);
        assert_int_equal(plan.fire[0], now - 30 - 86400 * (int64_t)MISSED_CATCH_UP_MAX);
        assert_true(plan.dropped_more);

        /* exact counts up to the limit, a lower bound beyond */
        run("0 * * * *", R(MISSED_SKIP, 5, 172800, 0), T0, T0, T0 + 40 * 86400 + 1800);
        assert_int_equal(plan.dropped, 960);
        assert_false(plan.dropped_more);
        run("0 * * * *", R(MISSED_SKIP, 5, 172800, 0), T0, T0, T0 + 100 * 86400 + 1800);
        assert_int_equal(plan.dropped, MISSED_COUNT_MAX + 1);
        assert_true(plan.dropped_more);
        /* the bound itself: exactly keep + 1 ticks more than the count limit */
        run("0 * * * *", R(MISSED_CATCH_UP_BOUNDED, MISSED_CATCH_UP_MAX, UINT64_C(3153600000), 0),
            T0, MISSED_NEVER, T0 + (MISSED_CATCH_UP_MAX + 1) * 3600 + 1800);
        assert_int_equal(plan.ncatch_up, MISSED_CATCH_UP_MAX);
        assert_int_equal(plan.fire[0], T0 + 2 * 3600);
        assert_int_equal(plan.dropped, 1);
        run("0 * * * *", R(MISSED_CATCH_UP_BOUNDED, MISSED_CATCH_UP_MAX, UINT64_C(3153600000), 0),
            T0, MISSED_NEVER, T0 + (MISSED_CATCH_UP_MAX + 5) * 3600 + 1800);
        assert_int_equal(plan.ncatch_up, MISSED_CATCH_UP_MAX);
        assert_int_equal(plan.fire[0], T0 + 6 * 3600);
        assert_int_equal(plan.fire[MISSED_CATCH_UP_MAX - 1], T0 + (MISSED_CATCH_UP_MAX + 5) * 3600);
        assert_true(plan.dropped_more && plan.dropped >= 3 && plan.dropped <= 5);
}

/* In a zone, a repeated local time fires once (Berlin, 2026-10-25 02:30). */
static void test_time_zone(void **state)
{
        (void)state;
        struct cron_tz *tz = NULL;
        if (cron_tz_load("Europe/Berlin", &tz) == -ENOENT) {
                skip();
                return;
        }
        struct cron_expr e = P("30 2 * * *");
        struct missed_rule r = R(MISSED_CATCH_UP_BOUNDED, 5, UINT64_C(3153600000), 0);
        assert_int_equal(missed_plan(&e, tz, &r, U(2026, 10, 24, 12, 0), MISSED_NEVER,
                                     U(2026, 10, 25, 12, 0), &plan), 0);
        assert_int_equal(plan.nfire, 1);
        assert_int_equal(plan.fire[0], U(2026, 10, 25, 0, 30)); /* 02:30 CEST */
        cron_tz_free(tz);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_skip_drops),
                cmocka_unit_test(test_on_time),
                cmocka_unit_test(test_grace_fires_the_current_tick_only),
                cmocka_unit_test(test_three_minute_outage),
                cmocka_unit_test(test_catch_up_once),
                cmocka_unit_test(test_catch_up_bounded),
                cmocka_unit_test(test_stale),
                cmocka_unit_test(test_clock_back),
                cmocka_unit_test(test_range_and_args),
                cmocka_unit_test(test_huge_jump),
                cmocka_unit_test(test_time_zone),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
