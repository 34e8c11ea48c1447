/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kairos/cron.h"

/* ------------------------------------------------------------------------ */
/* helpers                                                                   */

static int64_t U(int y, int mo, int d, int h, int mi)
{
        struct tm tm = { .tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = d, .tm_hour = h,
                         .tm_min = mi };
        return (int64_t)timegm(&tm);
}

/* The UTC offset at t (asserts t is in range). */
static int32_t OFF(const struct cron_tz *tz, int64_t t)
{
        int32_t off = INT32_MIN;
        assert_int_equal(cron_tz_utc_offset(tz, t, &off), 0);
        return off;
}

/* The count of instants showing the local time (asserts it is in range). */
static size_t L2U(const struct cron_tz *tz, int64_t local, int64_t c[CRON_TZ_MAX_CANDIDATES])
{
        size_t n = 99;
        assert_int_equal(cron_tz_local_to_utc(tz, local, c, &n), 0);
        return n;
}

/* First UTC instant of the local wall time in tz (asserts it exists). */
static int64_t L(const struct cron_tz *tz, int y, int mo, int d, int h, int mi)
{
        int64_t c[CRON_TZ_MAX_CANDIDATES];
        size_t n = L2U(tz, U(y, mo, d, h, mi), c);
        assert_true(n >= 1);
        return c[0];
}

static struct cron_expr P(const char *text)
{
        struct cron_expr e;
        char err[160];
        int r = cron_parse(text, &e, err, sizeof(err));
        if (r != 0)
                print_message("cron_parse(\"%s\"): %s\n", text, err);
        assert_int_equal(r, 0);
        return e;
}

static struct cron_tz *TZ(const char *name)
{
        struct cron_tz *tz = NULL;
        assert_int_equal(cron_tz_load(name, &tz), 0);
        assert_non_null(tz);
        return tz;
}

static int64_t next_of(const char *expr, const struct cron_tz *tz, int64_t after)
{
        struct cron_expr e = P(expr);
        int64_t n = 0;
        assert_int_equal(cron_next(&e, tz, after, &n), 0);
        return n;
}

/* Number of fires in (from, to]. */
static int count_fires(const char *expr, const struct cron_tz *tz, int64_t from, int64_t to)
{
        struct cron_expr e = P(expr);
        int n = 0;
        int64_t t = from;
        for (;;) {
                int64_t nx;
                if (cron_next(&e, tz, t, &nx) != 0 || nx > to)
                        return n;
                assert_true(nx > t);
                n++;
                t = nx;
        }
}

static uint64_t bits(const int *v, size_t n)
{
        uint64_t m = 0;
        for (size_t i = 0; i < n; i++)
                m |= UINT64_C(1) << v[i];
        return m;
}
#define BITS(...) bits((const int[]){ __VA_ARGS__ }, sizeof((const int[]){ __VA_ARGS__ }) / sizeof(int))

static uint64_t range_bits(int lo, int hi)
{
        uint64_t m = 0;
        for (int v = lo; v <= hi; v++)
                m |= UINT64_C(1) << v;
        return m;
}

static void assert_expr_eq(const struct cron_expr *a, const struct cron_expr *b)
{
        assert_int_equal(a->minutes, b->minutes);
        assert_int_equal(a->hours, b->hours);
        assert_int_equal(a->days, b->days);
        assert_int_equal(a->months, b->months);
        assert_int_equal(a->weekdays, b->weekdays);
        assert_int_equal(a->dom_restricted, b->dom_restricted);
        assert_int_equal(a->dow_restricted, b->dow_restricted);
}

/* ------------------------------------------------------------------------ */
/* parsing                                                                   */

static void test_parse_original_cases(void **state)
{
        (void)state;
        struct cron_expr e = P("* * * * *");
        assert_int_equal(e.minutes, range_bits(0, 59));
        assert_int_equal(e.hours, range_bits(0, 23));
        assert_int_equal(e.days, range_bits(1, 31));
        assert_int_equal(e.months, range_bits(1, 12));
        assert_int_equal(e.weekdays, range_bits(0, 6));
        assert_false(e.dom_restricted);
        assert_false(e.dow_restricted);

        e = P("0 9 * * 1-5");
        assert_int_equal(e.minutes, BITS(0));
        assert_int_equal(e.hours, BITS(9));
        assert_int_equal(e.weekdays, range_bits(1, 5));
        assert_false(e.dom_restricted);
        assert_true(e.dow_restricted);

        assert_int_equal(P("*/15 * * * *").minutes, BITS(0, 15, 30, 45));
        assert_int_equal(P("0 0,12 * * *").hours, BITS(0, 12));
        assert_int_equal(P("1-7/2 * * * *").minutes, BITS(1, 3, 5, 7));
        assert_int_equal(P("5/20 * * * *").minutes, BITS(5, 25, 45));
        assert_int_equal(P("0 */7 * * *").hours, BITS(0, 7, 14, 21));
        assert_int_equal(P("0 0 */10 * *").days, BITS(1, 11, 21, 31));
        assert_int_equal(P("1,2,3-5,10-20/5,*/30 * * * *").minutes,
                         BITS(0, 1, 2, 3, 4, 5, 10, 15, 20, 30));
        /* whitespace: tabs, several spaces, leading/trailing */
        assert_int_equal(P("  1\t2   3 4 5\n").minutes, BITS(1));
        assert_int_equal(P("59 23 31 12 6").weekdays, BITS(6));
}

static void test_parse_names_and_sunday(void **state)
{
        (void)state;
        struct cron_expr e = P("0 0 * jan,Mar-MAY,dec sun-tue");
        assert_int_equal(e.months, BITS(1, 3, 4, 5, 12));
        assert_int_equal(e.weekdays, BITS(0, 1, 2));
        assert_int_equal(P("* * * * 7").weekdays, BITS(0));
        assert_int_equal(P("* * * * 5-7").weekdays, BITS(5, 6, 0));
        assert_int_equal(P("* * * * FRI-7").weekdays, BITS(5, 6, 0));
        assert_int_equal(P("* * * * Sat,sUn").weekdays, BITS(6, 0));
        assert_int_equal(P("* * * * */2").weekdays, BITS(0, 2, 4, 6));
        assert_int_equal(P("* * * * 1/2").weekdays, BITS(1, 3, 5));
        assert_int_equal(P("* * * JAN-DEC/3 *").months, BITS(1, 4, 7, 10));
        assert_int_equal(P("* * * Feb/4 *").months, BITS(2, 6, 10));
        /* 7 and 0 are the same day */
        struct cron_expr a = P("0 0 * * 0"), b = P("0 0 * * 7"), c = P("0 0 * * sun");
        assert_expr_eq(&a, &b);
        assert_expr_eq(&a, &c);
}

static void test_parse_restricted(void **state)
{
        (void)state;
        static const char *unrestricted[] = { "* * * * *", "* * 1-31 * 0-6", "* * */1 * 0-7",
                                              "* * 1-15,16-31 * */1", "* * * * SUN-SAT",
                                              "* * 1/1 * 0/1" };
        for (size_t i = 0; i < sizeof(unrestricted) / sizeof(*unrestricted); i++) {
                struct cron_expr e = P(unrestricted[i]);
                assert_false(e.dom_restricted);
                assert_false(e.dow_restricted);
        }
        struct cron_expr e = P("* * */2 * 1-6");
        assert_true(e.dom_restricted);
        assert_true(e.dow_restricted);
        e = P("* * */2 * 1-7");         /* 1-7 is every day */
        assert_true(e.dom_restricted);
        assert_false(e.dow_restricted);
        e = P("* * 1-30 * 1-6");
        assert_true(e.dom_restricted);
        assert_true(e.dow_restricted);
}

static void test_parse_macros(void **state)
{
        (void)state;
        static const char *pairs[][2] = {
                { "@hourly", "0 * * * *" },   { "@daily", "0 0 * * *" },
                { "@midnight", "0 0 * * *" }, { "@weekly", "0 0 * * 0" },
                { "@monthly", "0 0 1 * *" },  { "@yearly", "0 0 1 1 *" },
                { "@annually", "0 0 1 1 *" }, { "  @DAILY \t", "0 0 * * *" },
        };
        for (size_t i = 0; i < sizeof(pairs) / sizeof(*pairs); i++) {
                struct cron_expr a = P(pairs[i][0]), b = P(pairs[i][1]);
                assert_expr_eq(&a, &b);
        }
}

static void expect_error(const char *text, const char *msg)
{
        struct cron_expr e;
        memset(&e, 0xAB, sizeof(e));
        struct cron_expr before = e;
        char err[160] = "unset";
        int r = cron_parse(text, &e, err, sizeof(err));
        if (r != -EINVAL || strcmp(err, msg) != 0)
                print_message("cron_parse(\"%s\") = %d, \"%s\"; want \"%s\"\n", text, r, err, msg);
        assert_int_equal(r, -EINVAL);
        assert_string_equal(err, msg);
        assert_memory_equal(&e, &before, sizeof(e)); /* untouched on error */
}

static void test_parse_errors(void **state)
{
        (void)state;
        expect_error("* * * *", "expected 5 fields, got 4");
        expect_error("* * * * * *", "expected 5 fields, got 6");
        expect_error("", "expected 5 fields, got 0");
        expect_error("   ", "expected 5 fields, got 0");
        expect_error("60 * * * *", "minute: 60 out of range 0-59");
        expect_error("* 24 * * *", "hour: 24 out of range 0-23");
        expect_error("* * 0 * *", "day-of-month: 0 out of range 1-31");
        expect_error("* * 32 * *", "day-of-month: 32 out of range 1-31");
        expect_error("* * * 13 *", "month: 13 out of range 1-12");
        expect_error("* * * 0 *", "month: 0 out of range 1-12");
        expect_error("* * * * 8", "day-of-week: 8 out of range 0-7");
        expect_error("* * * * 1..5", "day-of-week: bad token '1..5'");
        expect_error("99999999999999999999 * * * *",
                     "minute: 99999999999999999999 out of range 0-59");
        expect_error("1-60 * * * *", "minute: 60 out of range 0-59");
        expect_error("*/0 * * * *", "minute: step 0 in '*/0'");
        expect_error("* 1-5/0 * * *", "hour: step 0 in '1-5/0'");
        expect_error("*/61 * * * *", "minute: step in '*/61' out of range 1-60");
        expect_error("* 5-1 * * *", "hour: reversed range '5-1'");
        expect_error("* * * * 6-0", "day-of-week: reversed range '6-0'");
        expect_error("* * * DEC-JAN *", "month: reversed range 'DEC-JAN'");
        expect_error("1,,2 * * * *", "minute: empty item in '1,,2'");
        expect_error(",1 * * * *", "minute: empty item in ',1'");
        expect_error("1, * * * *", "minute: empty item in '1,'");
        expect_error("JAN * * * *", "minute: bad token 'JAN'");
        expect_error("* * * JANUARY *", "month: bad token 'JANUARY'");
        expect_error("* * * * MON-", "day-of-week: bad token 'MON-'");
        expect_error("-1 * * * *", "minute: bad token '-1'");
        expect_error("1-2-3 * * * *", "minute: bad token '1-2-3'");
        expect_error("*/ * * * *", "minute: bad token '*/'");
        expect_error("*/x * * * *", "minute: bad token '*/x'");
        expect_error("1/2/3 * * * *", "minute: bad token '1/2/3'");
        expect_error("** * * * *", "minute: bad token '**'");
        expect_error("*-5 * * * *", "minute: bad token '*-5'");
        expect_error("/5 * * * *", "minute: bad token '/5'");
        expect_error("* * * * SUN,FOO", "day-of-week: bad token 'FOO'");
        expect_error("@foo", "unknown macro '@foo'");
        expect_error("@reboot", "unknown macro '@reboot'");
        expect_error("@daily 5", "unexpected '5' after a macro");
        expect_error("\x01 * * * *", "minute: bad token '?'");
}

static void test_parse_error_buffer(void **state)
{
        (void)state;
        struct cron_expr e;
        char small[8];
        assert_int_equal(cron_parse("60 * * * *", &e, small, sizeof(small)), -EINVAL);
        assert_string_equal(small, "minute:");          /* truncated, terminated */
        assert_int_equal(cron_parse("60 * * * *", &e, NULL, 0), -EINVAL);
        assert_int_equal(cron_parse(NULL, &e, NULL, 0), -EINVAL);
        assert_int_equal(cron_parse("* * * * *", NULL, NULL, 0), -EINVAL);
        /* a long token is shortened in the message */
        char text[400], err[160];
        memset(text, '9', 300);
        strcpy(text + 300, " * * * *");
        assert_int_equal(cron_parse(text, &e, err, sizeof(err)), -EINVAL);
        assert_true(strlen(err) < 100);
        assert_non_null(strstr(err, "...' out of range") ? err : strstr(err, "... out of range"));
        err[0] = 'x';
        assert_int_equal(cron_parse("* * * * *", &e, err, sizeof(err)), 0);
        assert_string_equal(err, "");
}

static uint64_t rng_state;

static uint64_t rnd(void)
{
        uint64_t z = (rng_state += UINT64_C(0x9E3779B97F4A7C15));
        z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
        return z ^ (z >> 31);
}

static unsigned rn(unsigned n)
{
        return (unsigned)(rnd() % n);
}

static uint64_t test_seed(void)
{
        const char *s = getenv("CRON_TEST_SEED");
        return s ? strtoull(s, NULL, 0) : UINT64_C(20260401);
}

/* Never crashes, always either parses to in-range masks or fails with a message. */
static void test_parse_garbage(void **state)
{
        (void)state;
        uint64_t seed = test_seed();
        rng_state = seed;
        static const char alpha[] = "0123456789*/-,@ \t JANSUNMONFRIdecxyz.7";
        char text[64], err[160];
        for (int it = 0; it < 200000; it++) {
                size_t n = rn(40);
                for (size_t i = 0; i < n; i++)
                        text[i] = it % 4 == 0 ? (char)(rn(255) + 1) : alpha[rn(sizeof(alpha) - 1)];
                text[n] = '\0';
                struct cron_expr e;
                err[0] = '\0';
                int r = cron_parse(text, &e, err, sizeof(err));
                if (r == 0) {
                        assert_int_equal(e.minutes & ~range_bits(0, 59), 0);
                        assert_int_equal(e.hours & ~range_bits(0, 23), 0);
                        assert_int_equal(e.days & ~range_bits(1, 31), 0);
                        assert_int_equal(e.months & ~range_bits(1, 12), 0);
                        assert_int_equal(e.weekdays & ~range_bits(0, 6), 0);
                        assert_true(e.minutes && e.hours && e.days && e.months && e.weekdays);
                } else {
                        if (r != -EINVAL || err[0] == '\0')
                                print_message("seed %" PRIu64 ": '%s' -> %d\n", seed, text, r);
                        assert_int_equal(r, -EINVAL);
                        assert_true(err[0] != '\0');
                }
        }
}

/* ------------------------------------------------------------------------ */
/* matching and next                                                         */

static void test_matches(void **state)
{
        (void)state;
        struct cron_expr e = P("0 0 1 * 1");    /* 1st of month OR Monday */
        assert_true(cron_matches(&e, 0, 0, 1, 4, 3));   /* 2026-04-01, Wednesday */
        assert_true(cron_matches(&e, 0, 0, 20, 4, 1));  /* 2026-04-20, Monday */
        assert_false(cron_matches(&e, 0, 0, 15, 4, 3)); /* 2026-04-15, Wednesday */
        assert_false(cron_matches(&e, 1, 0, 1, 4, 3));
        e = P("0 0 1 * *");     /* only dom restricted: dow ignored */
        assert_true(cron_matches(&e, 0, 0, 1, 4, 3));
        assert_false(cron_matches(&e, 0, 0, 20, 4, 1));
        e = P("0 0 * * 1");     /* only dow restricted */
        assert_false(cron_matches(&e, 0, 0, 1, 4, 3));
        assert_true(cron_matches(&e, 0, 0, 20, 4, 1));
        e = P("0 0 1-31 * 1");  /* full dom range counts as unrestricted: AND */
        assert_false(cron_matches(&e, 0, 0, 1, 4, 3));
        assert_true(cron_matches(&e, 0, 0, 20, 4, 1));
        e = P("* * * * 0");
        assert_true(cron_matches(&e, 0, 0, 5, 4, 7));   /* wday 7 accepted as Sunday */
        e = P("* * * * *");
        assert_false(cron_matches(&e, 60, 0, 1, 1, 0));
        assert_false(cron_matches(&e, -1, 0, 1, 1, 0));
        assert_false(cron_matches(&e, 0, 24, 1, 1, 0));
        assert_false(cron_matches(&e, 0, 0, 0, 1, 0));
        assert_false(cron_matches(&e, 0, 0, 32, 1, 0));
        assert_false(cron_matches(&e, 0, 0, 1, 13, 0));
        assert_false(cron_matches(&e, 0, 0, 1, 1, 8));
        assert_false(cron_matches(NULL, 0, 0, 1, 1, 0));
}

static void test_or_rule_next(void **state)
{
        (void)state;
        struct cron_expr e = P("0 0 1 * 1");
        int64_t t = U(2026, 3, 31, 12, 0), got[6];
        for (int i = 0; i < 6; i++) {
                assert_int_equal(cron_next(&e, NULL, t, &got[i]), 0);
                t = got[i];
        }
        assert_int_equal(got[0], U(2026, 4, 1, 0, 0));
        assert_int_equal(got[1], U(2026, 4, 6, 0, 0));
        assert_int_equal(got[2], U(2026, 4, 13, 0, 0));
        assert_int_equal(got[3], U(2026, 4, 20, 0, 0)); /* 04-15 skipped */
        assert_int_equal(got[4], U(2026, 4, 27, 0, 0));
        assert_int_equal(got[5], U(2026, 5, 1, 0, 0));
        assert_int_equal(count_fires("0 0 1 * 1", NULL, U(2026, 4, 14, 0, 0), U(2026, 4, 16, 0, 0)), 0);
}

static void test_windows(void **state)
{
        (void)state;
        assert_int_equal(count_fires("0 * * * *", NULL, U(2026, 4, 1, 8, 0), U(2026, 4, 1, 11, 0)), 3);
        assert_int_equal(count_fires("0 * * * *", NULL, U(2026, 4, 1, 8, 59), U(2026, 4, 1, 9, 0)), 1);
        /* Mon 2026-04-06 .. Sun 2026-04-12 */
        assert_int_equal(count_fires("0 9 * * 1-5", NULL, U(2026, 4, 6, 0, 0), U(2026, 4, 13, 0, 0)), 5);
        assert_int_equal(count_fires("0 9 * * MON-FRI", NULL, U(2026, 4, 6, 0, 0), U(2026, 4, 13, 0, 0)), 5);
        assert_int_equal(count_fires("*/5 * * * *", NULL, U(2026, 4, 1, 8, 0), U(2026, 4, 1, 9, 0)), 12);
        assert_int_equal(count_fires("* * * * *", NULL, U(2026, 4, 1, 0, 0), U(2026, 4, 2, 0, 0)), 1440);
        assert_int_equal(count_fires("*/15 * * * *", NULL, U(2026, 4, 1, 0, 0), U(2026, 4, 1, 1, 0)), 4);
        assert_int_equal(count_fires("0 0,12 * * *", NULL, U(2026, 4, 1, 0, 0), U(2026, 4, 2, 0, 0)), 2);
        assert_int_equal(count_fires("1-7/2 * * * *", NULL, U(2026, 4, 1, 0, 0), U(2026, 4, 1, 1, 0)), 4);
        assert_int_equal(count_fires("@daily", NULL, U(2026, 1, 1, 0, 0), U(2027, 1, 1, 0, 0)), 365);
        assert_int_equal(count_fires("@weekly", NULL, U(2026, 1, 1, 0, 0), U(2027, 1, 1, 0, 0)), 52);
        assert_int_equal(count_fires("@monthly", NULL, U(2026, 1, 1, 0, 0), U(2027, 1, 1, 0, 0)), 12);
        assert_int_equal(count_fires("@yearly", NULL, U(2026, 1, 1, 0, 0), U(2036, 1, 1, 0, 0)), 10);
        assert_int_equal(count_fires("@hourly", NULL, U(2026, 1, 1, 0, 0), U(2026, 1, 2, 0, 0)), 24);
        assert_int_equal(count_fires("0 0 * * 7", NULL, U(2026, 4, 1, 0, 0), U(2026, 5, 1, 0, 0)), 4);
}

static void test_next_same_day_and_wrap(void **state)
{
        (void)state;
        /* same day, strictly after, seconds inside the minute */
        assert_int_equal(next_of("0 9 * * *", NULL, U(2026, 4, 1, 8, 0)), U(2026, 4, 1, 9, 0));
        assert_int_equal(next_of("0 9 * * *", NULL, U(2026, 4, 1, 9, 0)), U(2026, 4, 2, 9, 0));
        assert_int_equal(next_of("0 9 * * *", NULL, U(2026, 4, 1, 9, 0) - 1), U(2026, 4, 1, 9, 0));
        assert_int_equal(next_of("* * * * *", NULL, U(2026, 4, 1, 9, 0) + 30), U(2026, 4, 1, 9, 1));
        assert_int_equal(next_of("30 17 * * *", NULL, U(2026, 4, 1, 17, 29) + 59), U(2026, 4, 1, 17, 30));
        /* next hour, next day */
        assert_int_equal(next_of("15 * * * *", NULL, U(2026, 4, 1, 23, 20)), U(2026, 4, 2, 0, 15));
        /* month end */
        assert_int_equal(next_of("0 0 1 * *", NULL, U(2026, 1, 31, 12, 0)), U(2026, 2, 1, 0, 0));
        assert_int_equal(next_of("0 0 31 * *", NULL, U(2026, 4, 1, 0, 0)), U(2026, 5, 31, 0, 0));
        assert_int_equal(next_of("0 0 30 * *", NULL, U(2026, 1, 30, 0, 0)), U(2026, 3, 30, 0, 0));
        /* year end */
        assert_int_equal(next_of("59 23 31 12 *", NULL, U(2026, 12, 31, 23, 59)), U(2027, 12, 31, 23, 59));
        assert_int_equal(next_of("0 0 * * *", NULL, U(2026, 12, 31, 23, 59)), U(2027, 1, 1, 0, 0));
        assert_int_equal(next_of("@yearly", NULL, U(2026, 1, 1, 0, 0)), U(2027, 1, 1, 0, 0));
        assert_int_equal(next_of("0 0 1 JAN MON", NULL, U(2026, 1, 1, 0, 0)), U(2026, 1, 5, 0, 0));
        /* Feb 29 only in leap years; 2100 is not one */
        assert_int_equal(next_of("0 12 29 2 *", NULL, U(2026, 3, 1, 0, 0)), U(2028, 2, 29, 12, 0));
        assert_int_equal(next_of("0 12 29 2 *", NULL, U(2028, 2, 29, 12, 0)), U(2032, 2, 29, 12, 0));
        assert_int_equal(next_of("0 12 29 2 *", NULL, U(2096, 3, 1, 0, 0)), U(2104, 2, 29, 12, 0));
        assert_int_equal(next_of("0 0 * 2 *", NULL, U(2028, 2, 28, 0, 0)), U(2028, 2, 29, 0, 0));
        assert_int_equal(next_of("0 0 * 2 *", NULL, U(2027, 2, 28, 0, 0)), U(2028, 2, 1, 0, 0));
        /* "13 * 5" is the 13th OR a Friday; a full dom range means Fridays only */
        assert_int_equal(next_of("0 0 13 * 5", NULL, U(2026, 1, 1, 0, 0)), U(2026, 1, 2, 0, 0));
        assert_int_equal(next_of("0 0 13 * 5", NULL, U(2026, 1, 9, 0, 0)), U(2026, 1, 13, 0, 0));
        assert_int_equal(next_of("0 0 1-31/1 * 5", NULL, U(2026, 1, 9, 0, 0)), U(2026, 1, 16, 0, 0));
        assert_int_equal(next_of("0 0 1 1 *", NULL, 0), U(1971, 1, 1, 0, 0));
        assert_int_equal(next_of("* * * * *", NULL, 0), 60);
}

/* One range for every time function: 1970-01-01T00:00:00Z to
 * 9999-12-31T23:59:59Z, -ERANGE outside, nothing answered beyond it. */
static void test_time_range(void **state)
{
        (void)state;
        assert_int_equal(CRON_TIME_MAX, U(9999, 12, 31, 23, 59) + 59);
        struct cron_tz *tz = TZ("America/New_York");
        const struct cron_tz *zones[] = { NULL, tz };
        struct cron_expr e = P("0 * * * *"), yearly = P("59 23 31 12 *");
        static const int64_t outside[] = { -1, CRON_TIME_MAX + 1, -281474976710000LL,
                                           (int64_t)1 << 40, INT64_MIN, INT64_MAX };
        for (size_t z = 0; z < 2; z++) {
                for (size_t i = 0; i < sizeof(outside) / sizeof(*outside); i++) {
                        int64_t n = 42, c[CRON_TZ_MAX_CANDIDATES];
                        int32_t off = 42;
                        size_t nc = 42;
                        struct tm tm;
                        assert_int_equal(cron_next(&e, zones[z], outside[i], &n), -ERANGE);
                        assert_int_equal(n, 42);
                        assert_int_equal(cron_tz_utc_offset(zones[z], outside[i], &off), -ERANGE);
                        assert_int_equal(off, 42);
                        assert_int_equal(cron_tz_localtime(zones[z], outside[i], &tm), -ERANGE);
                        if (outside[i] != -1 && outside[i] != CRON_TIME_MAX + 1) {
                                assert_int_equal(cron_tz_local_to_utc(zones[z], outside[i], c,
                                                                      &nc), -ERANGE);
                                assert_int_equal(nc, 42);
                        }
                }
                /* the last fire of the range, then nothing */
                int64_t n;
                assert_int_equal(cron_next(&yearly, zones[z], CRON_TIME_MAX - 86400 * 400, &n), 0);
                assert_int_equal(n, L(zones[z], 9998, 12, 31, 23, 59));
                if (z == 0) {
                        assert_int_equal(cron_next(&yearly, NULL, n, &n), 0);
                        assert_int_equal(n, CRON_TIME_MAX - 59);
                }
                assert_int_equal(cron_next(&yearly, zones[z], CRON_TIME_MAX - 59, &n), -ENOENT);
                assert_int_equal(cron_next(&e, zones[z], CRON_TIME_MAX, &n), -ENOENT);
                assert_int_equal(cron_next(&e, zones[z], CRON_TIME_MAX - 3600, &n), 0);
                assert_true(n <= CRON_TIME_MAX);
                /* the edges themselves are in range */
                int32_t off;
                struct tm tm;
                assert_int_equal(cron_tz_utc_offset(zones[z], CRON_TIME_MIN, &off), 0);
                assert_int_equal(cron_tz_utc_offset(zones[z], CRON_TIME_MAX, &off), 0);
                assert_int_equal(cron_tz_localtime(zones[z], CRON_TIME_MAX, &tm), 0);
                assert_int_equal(tm.tm_year + 1900, 9999);
        }
        /* a local time just before 1970 in New York maps to an instant in range */
        int64_t c[CRON_TZ_MAX_CANDIDATES];
        size_t nc = 0;
        assert_int_equal(cron_tz_local_to_utc(tz, U(1969, 12, 31, 20, 0), c, &nc), 0);
        assert_int_equal(nc, 1);
        assert_int_equal(c[0], U(1970, 1, 1, 1, 0));
        assert_int_equal(cron_tz_local_to_utc(NULL, -1, c, &nc), 0);
        assert_int_equal(nc, 1);
        assert_int_equal(c[0], -1);
        cron_tz_free(tz);
}

static void test_next_enoent_and_args(void **state)
{
        (void)state;
        static const char *never[] = { "0 0 30 2 *", "0 0 31 2 *", "0 0 31 4,6,9,11 *",
                                       "0 0 31 FEB,APR *" };
        for (size_t i = 0; i < sizeof(never) / sizeof(*never); i++) {
                struct cron_expr e = P(never[i]);
                int64_t n = 42;
                assert_int_equal(cron_next(&e, NULL, U(2026, 1, 1, 0, 0), &n), -ENOENT);
                assert_int_equal(n, 42);
        }
        /* the longest gap between February 29ths (2096 -> 2104) is within the
         * search span: tested in test_next_same_day_and_wrap */
        struct cron_expr e = P("0 12 29 2 *"), zero = { 0 };
        int64_t n;
        assert_int_equal(cron_next(&zero, NULL, 0, &n), -ENOENT);
        assert_int_equal(cron_next(NULL, NULL, 0, &n), -EINVAL);
        assert_int_equal(cron_next(&e, NULL, 0, NULL), -EINVAL);
        assert_int_equal(cron_next(&e, NULL, INT64_MAX, &n), -ERANGE);
        assert_int_equal(cron_next(&e, NULL, INT64_MIN, &n), -ERANGE);
        /* hand-made expression with stray bits is handled without UB */
        struct cron_expr odd = { .minutes = ~UINT64_C(0), .hours = ~0u, .days = ~0u,
                                 .months = 0xFFFF, .weekdays = 0xFF,
                                 .dom_restricted = true, .dow_restricted = true };
        assert_int_equal(cron_next(&odd, NULL, U(2026, 1, 1, 0, 0), &n), 0);
        assert_int_equal(n, U(2026, 1, 1, 0, 1));
}

/* ------------------------------------------------------------------------ */
/* differential: random expressions vs a brute-force minute-by-minute matcher */

struct gen {
        char text[200];
        bool set[5][64];        /* expected values, day-of-week 0..6 */
        bool dom_r, dow_r;
};

static const int gmin[5] = { 0, 0, 1, 1, 0 }, gmax[5] = { 59, 23, 31, 12, 6 };
static const char *const gmon[] = { "jan", "FEB", "Mar", "apr", "MAY", "jun",
                                    "Jul", "aug", "SEP", "oct", "Nov", "DEC" };
static const char *const gdow[] = { "SUN", "mon", "Tue", "WED", "thu", "Fri", "sat" };

static void gen_value(int f, int v, char *buf, size_t len)
{
        if (f == 3 && rn(3) == 0)
                snprintf(buf, len, "%s", gmon[v - 1]);
        else if (f == 4 && v == 0 && rn(2) == 0)
                snprintf(buf, len, "7");
        else if (f == 4 && rn(3) == 0)
                snprintf(buf, len, "%s", gdow[v]);
        else
                snprintf(buf, len, "%d", v);
}

/* One list item (not '*' alone); marks its values. */
static void gen_item(struct gen *g, int f, char *out, size_t len, int dense)
{
        int lo = gmin[f], hi = gmax[f], span = hi - lo + 1;
        char a[8], b[8];
        int kind = (int)rn(6);
        int x = lo + (int)rn((unsigned)span), y = lo + (int)rn((unsigned)span);
        if (x > y) {
                int t = x;
                x = y;
                y = t;
        }
        int step = 1 + (int)rn((unsigned)(span < 12 ? span : 12));
        if (dense && kind == 0)
                kind = 1;
        switch (kind) {
        case 0:         /* N */
                gen_value(f, x, a, sizeof(a));
                snprintf(out, len, "%s", a);
                g->set[f][x] = true;
                break;
        case 1:         /* N-M */
        case 2:
                gen_value(f, x, a, sizeof(a));
                if (f == 4 && y == 6 && x > 0 && rn(2) == 0) {  /* N-7 includes Sunday */
                        snprintf(out, len, "%s-7", a);
                        g->set[f][0] = true;
                } else {
                        if (f == 4 && x == 0)
                                snprintf(a, sizeof(a), "0");    /* 7-M would be reversed */
                        gen_value(f, y, b, sizeof(b));
                        if (f == 4 && y == 0)
                                snprintf(b, sizeof(b), "0");
                        snprintf(out, len, "%s-%s", a, b);
                }
                for (int v = x; v <= y; v++)
                        g->set[f][v] = true;
                break;
        case 3:         /* * /S */
                snprintf(out, len, "*/%d", step);
                for (int v = lo; v <= hi; v += step)
                        g->set[f][v] = true;
                break;
        case 4:         /* N-M/S */
                gen_value(f, x, a, sizeof(a));
                gen_value(f, y, b, sizeof(b));
                if (f == 4) {
                        snprintf(a, sizeof(a), "%d", x);
                        snprintf(b, sizeof(b), "%d", y);
                }
                snprintf(out, len, "%s-%s/%d", a, b, step);
                for (int v = x; v <= y; v += step)
                        g->set[f][v] = true;
                break;
        default:        /* N/S */
                snprintf(a, sizeof(a), "%d", x);
                snprintf(out, len, "%s/%d", a, step);
                for (int v = x; v <= hi; v += step)
                        g->set[f][v] = true;
                break;
        }
}

/* dense: prefer expressions that fire often (for the slower zone brute force) */
static void gen_expr(struct gen *g, int dense)
{
        memset(g, 0, sizeof(*g));
        size_t pos = 0;
        for (int f = 0; f < 5; f++) {
                char field[120];
                unsigned star_p = dense ? (f >= 2 ? 7 : 3) : (f >= 2 ? 5 : 3);
                if (rn(10) < star_p) {
                        snprintf(field, sizeof(field), "*");
                        for (int v = gmin[f]; v <= gmax[f]; v++)
                                g->set[f][v] = true;
                } else {
                        size_t fp = 0;
                        int items = 1 + (rn(4) == 0 ? (int)rn(3) : 0);
                        for (int i = 0; i < items; i++) {
                                char item[40];
                                gen_item(g, f, item, sizeof(item), dense);
                                fp += (size_t)snprintf(field + fp, sizeof(field) - fp, "%s%s",
                                                       i ? "," : "", item);
                        }
                }
                pos += (size_t)snprintf(g->text + pos, sizeof(g->text) - pos, "%s%s",
                                        f ? " " : "", field);
        }
        bool all_dom = true, all_dow = true;
        for (int v = 1; v <= 31; v++)
                all_dom = all_dom && g->set[2][v];
        for (int v = 0; v <= 6; v++)
                all_dow = all_dow && g->set[4][v];
        g->dom_r = !all_dom;
        g->dow_r = !all_dow;
}

static bool ref_match(const struct gen *g, int y, int mo, int d, int h, int mi, int wd)
{
        (void)y;
        if (!g->set[0][mi] || !g->set[1][h] || !g->set[3][mo])
                return false;
        bool dom = g->set[2][d], dow = g->set[4][wd];
        if (g->dom_r && g->dow_r)
                return dom || dow;
        return dom && dow;
}

/* Minute-by-minute UTC reference with an incrementing calendar. */
static int64_t ref_next_utc(const struct gen *g, int64_t after, int64_t max_minutes)
{
        int64_t t = (after >= 0 ? after / 60 : (after - 59) / 60) * 60 + 60;
        time_t tt = (time_t)t;
        struct tm tm;
        gmtime_r(&tt, &tm);
        int y = tm.tm_year + 1900, mo = tm.tm_mon + 1, d = tm.tm_mday, h = tm.tm_hour,
            mi = tm.tm_min, wd = tm.tm_wday;
        static const int dim[] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
        for (int64_t k = 0; k < max_minutes; k++, t += 60) {
                if (ref_match(g, y, mo, d, h, mi, wd))
                        return t;
                if (++mi < 60)
                        continue;
                mi = 0;
                if (++h < 24)
                        continue;
                h = 0;
                wd = (wd + 1) % 7;
                bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
                if (++d <= dim[mo - 1] + (mo == 2 && leap))
                        continue;
                d = 1;
                if (++mo <= 12)
                        continue;
                mo = 1;
                y++;
        }
        return -1;
}

static void check_parse_matches_gen(const struct gen *g, uint64_t seed)
{
        struct cron_expr e;
        char err[160];
        int r = cron_parse(g->text, &e, err, sizeof(err));
        if (r != 0)
                print_message("seed %" PRIu64 ": '%s': %s\n", seed, g->text, err);
        assert_int_equal(r, 0);
        uint64_t want[5] = { 0 };
        for (int f = 0; f < 5; f++)
                for (int v = 0; v < 64; v++)
                        if (g->set[f][v])
                                want[f] |= UINT64_C(1) << v;
        if (e.minutes != want[0] || e.hours != want[1] || e.days != want[2] ||
            e.months != want[3] || e.weekdays != want[4] || e.dom_restricted != g->dom_r ||
            e.dow_restricted != g->dow_r)
                print_message("seed %" PRIu64 ": '%s' parsed differently\n", seed, g->text);
        assert_int_equal(e.minutes, want[0]);
        assert_int_equal(e.hours, want[1]);
        assert_int_equal(e.days, want[2]);
        assert_int_equal(e.months, want[3]);
        assert_int_equal(e.weekdays, want[4]);
        assert_int_equal(e.dom_restricted, g->dom_r);
        assert_int_equal(e.dow_restricted, g->dow_r);
}

static void test_differential_utc(void **state)
{
        (void)state;
        uint64_t seed = test_seed();
        rng_state = seed ^ 0x5555;
        const int64_t cap = 2LL * 366 * 1440;   /* brute force looks 2 years ahead */
        int checked = 0;
        for (int i = 0; i < 2500; i++) {
                struct gen g;
                gen_expr(&g, 0);
                check_parse_matches_gen(&g, seed);
                struct cron_expr e = P(g.text);
                int64_t starts[5] = {
                        U(2000 + (int)rn(100), 1 + (int)rn(12), 1 + (int)rn(28), (int)rn(24),
                          (int)rn(60)),
                        U(2000 + (int)rn(100), 1 + (int)rn(12), 1 + (int)rn(28), 0, 0) + rn(86400),
                        U(2027, 12, 31, 23, 59) + rn(60),
                        U(2028, 2, 28, 23, 0) + rn(7200),
                        (int64_t)rn(4000000000u),
                };
                for (int s = 0; s < 5; s++) {
                        int64_t got = -1, want = ref_next_utc(&g, starts[s], cap);
                        int r = cron_next(&e, NULL, starts[s], &got);
                        bool ok = want >= 0 ? (r == 0 && got == want)
                                            : (r == -ENOENT || (r == 0 && got > starts[s] + cap * 60));
                        if (!ok)
                                print_message("seed %" PRIu64 ": '%s' after %" PRId64
                                              ": got %d/%" PRId64 ", want %" PRId64 "\n",
                                              seed, g.text, starts[s], r, got, want);
                        assert_true(ok);
                        if (r == 0)
                                assert_int_equal(got % 60, 0);
                        checked++;
                }
        }
        assert_int_equal(checked, 2500 * 5);
}

/* Reference in a zone: every UTC minute, converted to local time with the
 * zone's offset; fires when the local time matches and that local time has
 * not occurred before (checked by looking back over the possible offset
 * differences). */
static int64_t ref_next_zone(const struct gen *g, const struct cron_tz *tz, int64_t after,
                             int64_t max_minutes)
{
        int64_t t = (after / 60) * 60 + 60;
        for (int64_t k = 0; k < max_minutes; k++, t += 60) {
                int64_t l = t + OFF(tz, t);
                time_t lt = (time_t)l;
                struct tm tm;
                gmtime_r(&lt, &tm);
                if (!ref_match(g, tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                               tm.tm_min, tm.tm_wday))
                        continue;
                bool seen = false;
                for (int64_t back = 60; back <= 3 * 3600 && !seen; back += 60)
                        seen = (t - back) + OFF(tz, t - back) == l;
                if (!seen)
                        return t;
        }
        return -1;
}

static void differential_zone(const char *zone, const int64_t *fixed, size_t nfixed, int nexpr)
{
        struct cron_tz *tz = TZ(zone);
        uint64_t seed = test_seed();
        rng_state = seed ^ 0xBE1;
        const int64_t cap = 40 * 1440;
        for (int i = 0; i < nexpr; i++) {
                struct gen g;
                gen_expr(&g, 1);
                struct cron_expr e = P(g.text);
                for (size_t s = 0; s <= nfixed; s++) {
                        int64_t start = s < nfixed ? fixed[s] - (int64_t)rn(3 * 86400)
                                                   : U(2024 + (int)rn(6), 1 + (int)rn(12), 1, 0, 0) +
                                                             rn(28 * 86400);
                        int64_t got = -1, want = ref_next_zone(&g, tz, start, cap);
                        int r = cron_next(&e, tz, start, &got);
                        bool ok = want >= 0 ? (r == 0 && got == want)
                                            : (r == -ENOENT || (r == 0 && got > start + cap * 60));
                        if (!ok)
                                print_message("seed %" PRIu64 " %s: '%s' after %" PRId64
                                              ": got %d/%" PRId64 ", want %" PRId64 "\n",
                                              seed, zone, g.text, start, r, got, want);
                        assert_true(ok);
                }
        }
        cron_tz_free(tz);
}

static void test_differential_berlin(void **state)
{
        (void)state;
        const int64_t fixed[] = { U(2026, 3, 29, 1, 0), U(2026, 10, 25, 1, 0),
                                  U(2030, 3, 31, 1, 0), U(2030, 10, 27, 1, 0) };
        differential_zone("Europe/Berlin", fixed, 4, 300);
}

static void test_differential_new_york(void **state)
{
        (void)state;
        const int64_t fixed[] = { U(2026, 3, 8, 7, 0), U(2026, 11, 1, 6, 0) };
        differential_zone("America/New_York", fixed, 2, 150);
}

/* Lord Howe shifts by 30 minutes: a half-hour gap and overlap. */
static void test_differential_lord_howe(void **state)
{
        (void)state;
        const int64_t fixed[] = { U(2026, 4, 4, 15, 0), U(2026, 10, 3, 15, 30) };
        differential_zone("Australia/Lord_Howe", fixed, 2, 100);
}

/* ------------------------------------------------------------------------ */
/* DST                                                                       */

static void test_dst_berlin(void **state)
{
        (void)state;
        struct cron_tz *tz = TZ("Europe/Berlin");
        assert_string_equal(cron_tz_name(tz), "Europe/Berlin");
        int64_t c[CRON_TZ_MAX_CANDIDATES];

        /* spring forward 2026-03-29 02:00 CET -> 03:00 CEST (01:00 UTC) */
        assert_int_equal(L2U(tz, U(2026, 3, 29, 2, 30), c), 0);
        assert_int_equal(L2U(tz, U(2026, 3, 29, 3, 0), c), 1);
        assert_int_equal(c[0], U(2026, 3, 29, 1, 0));
        int64_t t = next_of("30 2 * * *", tz, L(tz, 2026, 3, 28, 12, 0));
        assert_int_equal(t, U(2026, 3, 30, 0, 30));     /* 29th skipped: 02:30 does not exist */
        int64_t day0 = L(tz, 2026, 3, 29, 0, 0), day1 = L(tz, 2026, 3, 30, 0, 0);
        assert_int_equal(day1 - day0, 23 * 3600);
        assert_int_equal(count_fires("0 * * * *", tz, day0 - 1, day1 - 1), 23);
        assert_int_equal(count_fires("30 2 * * *", tz, day0 - 1, day1 - 1), 0);
        assert_int_equal(count_fires("* * * * *", tz, day0 - 1, day1 - 1), 23 * 60);
        /* the minute after 01:59 local is 03:00 local */
        assert_int_equal(next_of("* * * * *", tz, U(2026, 3, 29, 0, 59)), U(2026, 3, 29, 1, 0));
        assert_int_equal(next_of("0 3 * * *", tz, day0), U(2026, 3, 29, 1, 0));

        /* fall back 2026-10-25 03:00 CEST -> 02:00 CET (01:00 UTC):
         * 02:00-02:59 happen twice (00:00-00:59 UTC and 01:00-01:59 UTC). */
        assert_int_equal(L2U(tz, U(2026, 10, 25, 2, 30), c), 2);
        assert_int_equal(c[0], U(2026, 10, 25, 0, 30));
        assert_int_equal(c[1], U(2026, 10, 25, 1, 30));
        day0 = L(tz, 2026, 10, 25, 0, 0);
        day1 = L(tz, 2026, 10, 26, 0, 0);
        assert_int_equal(day1 - day0, 25 * 3600);
        /* 02:30 fires once, at its first occurrence (CEST) */
        assert_int_equal(count_fires("30 2 * * *", tz, day0 - 1, day1 - 1), 1);
        assert_int_equal(next_of("30 2 * * *", tz, day0), U(2026, 10, 25, 0, 30));
        /* hourly fires once per distinct local hour: 24 fires in this 25-hour
         * day; local 02:00 fires at 00:00 UTC, the repeated 02:00 (01:00 UTC)
         * does not fire, and the next fire is 03:00 CET (02:00 UTC). */
        assert_int_equal(count_fires("0 * * * *", tz, day0 - 1, day1 - 1), 24);
        assert_int_equal(next_of("0 * * * *", tz, U(2026, 10, 25, 0, 0)), U(2026, 10, 25, 2, 0));
        assert_int_equal(count_fires("* * * * *", tz, day0 - 1, day1 - 1), 24 * 60);
        /* starting inside the second pass: the repeated local minutes already
         * fired during the first pass, so the next fire is 03:00 CET */
        assert_int_equal(next_of("* * * * *", tz, U(2026, 10, 25, 1, 10)), U(2026, 10, 25, 2, 0));
        assert_int_equal(next_of("30 2 * * *", tz, U(2026, 10, 25, 1, 10)), U(2026, 10, 26, 1, 30));
        /* a local time in the second pass that did not exist in the first
         * pass is impossible here, but minutes after the overlap are normal */
        assert_int_equal(next_of("5 3 * * *", tz, day0), U(2026, 10, 25, 2, 5));

        /* far future uses the footer rule (CET-1CEST,M3.5.0,M10.5.0/3) */
        assert_int_equal(next_of("30 2 * * *", tz, L(tz, 2090, 3, 25, 12, 0)),
                         L(tz, 2090, 3, 27, 2, 30));    /* 2090-03-26 is the change */
        assert_int_equal(L2U(tz, U(2090, 3, 26, 2, 30), c), 0);
        assert_int_equal(L2U(tz, U(2090, 10, 29, 2, 30), c), 2);
        cron_tz_free(tz);
}

static void test_dst_new_york(void **state)
{
        (void)state;
        struct cron_tz *tz = TZ("America/New_York");
        int64_t c[CRON_TZ_MAX_CANDIDATES];
        /* spring forward 2026-03-08 02:00 EST -> 03:00 EDT (07:00 UTC) */
        int64_t day0 = L(tz, 2026, 3, 8, 0, 0), day1 = L(tz, 2026, 3, 9, 0, 0);
        assert_int_equal(day0, U(2026, 3, 8, 5, 0));
        assert_int_equal(day1 - day0, 23 * 3600);
        assert_int_equal(count_fires("30 2 * * *", tz, day0 - 1, day1 - 1), 0);
        assert_int_equal(count_fires("0 * * * *", tz, day0 - 1, day1 - 1), 23);
        assert_int_equal(next_of("30 2 * * *", tz, day0), U(2026, 3, 9, 6, 30));
        assert_int_equal(next_of("0 2 * * *", tz, U(2026, 3, 7, 12, 0)), U(2026, 3, 9, 6, 0));
        /* fall back 2026-11-01 02:00 EDT -> 01:00 EST (06:00 UTC) */
        assert_int_equal(L2U(tz, U(2026, 11, 1, 1, 30), c), 2);
        assert_int_equal(c[0], U(2026, 11, 1, 5, 30));
        assert_int_equal(c[1], U(2026, 11, 1, 6, 30));
        day0 = L(tz, 2026, 11, 1, 0, 0);
        day1 = L(tz, 2026, 11, 2, 0, 0);
        assert_int_equal(day1 - day0, 25 * 3600);
        assert_int_equal(count_fires("30 1 * * *", tz, day0 - 1, day1 - 1), 1);
        assert_int_equal(next_of("30 1 * * *", tz, day0), U(2026, 11, 1, 5, 30));      /* EDT */
        assert_int_equal(next_of("30 1 * * *", tz, U(2026, 11, 1, 5, 30)), U(2026, 11, 2, 6, 30));
        /* 24 hourly fires: local 01:00 fires once (05:00 UTC, EDT) */
        assert_int_equal(count_fires("0 * * * *", tz, day0 - 1, day1 - 1), 24);
        assert_int_equal(next_of("0 * * * *", tz, U(2026, 11, 1, 5, 0)), U(2026, 11, 1, 7, 0));
        /* weekday 09:00 around the change keeps local 09:00 */
        assert_int_equal(next_of("0 9 * * 1-5", tz, U(2026, 10, 30, 14, 0)), U(2026, 11, 2, 14, 0));
        assert_int_equal(next_of("0 9 * * 1-5", tz, U(2026, 10, 29, 14, 0)), U(2026, 10, 30, 13, 0));
        cron_tz_free(tz);
}

/* Santiago: DST starts at 24:00 on a Saturday, so local midnight of the
 * Sunday does not exist; @daily skips that day. */
static void test_dst_missing_midnight(void **state)
{
        (void)state;
        struct cron_tz *tz = TZ("America/Santiago");
        int64_t c[CRON_TZ_MAX_CANDIDATES];
        assert_int_equal(L2U(tz, U(2026, 9, 6, 0, 0), c), 0);
        int64_t t = next_of("@daily", tz, L(tz, 2026, 9, 5, 0, 0));
        assert_int_equal(t, L(tz, 2026, 9, 7, 0, 0));
        assert_int_equal(next_of("@daily", tz, L(tz, 2026, 9, 5, 0, 0) - 1), L(tz, 2026, 9, 5, 0, 0));
        cron_tz_free(tz);
}

/* ------------------------------------------------------------------------ */
/* time zones: loading and offsets                                           */

static void test_tz_names(void **state)
{
        (void)state;
        struct cron_tz *tz = (struct cron_tz *)&tz;
        static const char *bad[] = { "", "../etc/passwd", "Europe/../../etc/passwd", "/etc/localtime",
                                     "Europe/Berlin;rm", "Europe Berlin", "Europe/Berlin\n", "a..b",
                                     "Europe/Berlin.", "~root", "Europe\\Berlin" };
        for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
                tz = (struct cron_tz *)&tz;
                assert_int_equal(cron_tz_load(bad[i], &tz), -EINVAL);
                assert_null(tz);
        }
        char longname[400];
        memset(longname, 'a', sizeof(longname) - 1);
        longname[sizeof(longname) - 1] = '\0';
        assert_int_equal(cron_tz_load(longname, &tz), -EINVAL);
        assert_int_equal(cron_tz_load(NULL, &tz), -EINVAL);
        assert_int_equal(cron_tz_load("UTC", NULL), -EINVAL);
        assert_int_equal(cron_tz_load("No/Such_Zone", &tz), -ENOENT);
        assert_int_equal(cron_tz_load("Europe", &tz), -ENOENT);        /* a directory */
        assert_int_equal(cron_tz_load("Europe/Berlin/x", &tz), -ENOENT);
        tz = TZ("Etc/GMT+5");   /* POSIX sign: 5 hours west */
        assert_int_equal(OFF(tz, 0), -5 * 3600);
        cron_tz_free(tz);
        assert_string_equal(cron_tz_name(NULL), "UTC");
        assert_int_equal(OFF(NULL, 12345), 0);
        cron_tz_free(NULL);
}

static char *make_tmpdir(void)
{
        char *d = strdup("/tmp/test_cron.XXXXXX");
        assert_non_null(d);
        assert_non_null(mkdtemp(d));
        return d;
}

static void write_bytes(const char *dir, const char *name, const void *p, size_t n)
{
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        char *slash = strrchr(path, '/');
        if (slash > path + strlen(dir)) {
                *slash = '\0';
                mkdir(path, 0755);
                *slash = '/';
        }
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(p, 1, n, f), n);
        assert_int_equal(fclose(f), 0);
}

static int rm_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
        (void)st;
        (void)flag;
        (void)ftw;
        return remove(path);
}

static void rm_rf(char *dir)
{
        nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
        free(dir);
}

static void test_tz_utc_without_tzdata(void **state)
{
        (void)state;
        char *dir = make_tmpdir();
        assert_int_equal(setenv("TZDIR", dir, 1), 0);
        struct cron_tz *tz = TZ("UTC");
        assert_string_equal(cron_tz_name(tz), "UTC");
        assert_int_equal(OFF(tz, U(2026, 7, 1, 0, 0)), 0);
        assert_int_equal(next_of("0 9 * * *", tz, U(2026, 4, 1, 8, 0)), U(2026, 4, 1, 9, 0));
        cron_tz_free(tz);
        tz = TZ("Etc/UTC");
        assert_int_equal(OFF(tz, 0), 0);
        cron_tz_free(tz);
        assert_int_equal(cron_tz_load("Europe/Berlin", &tz), -ENOENT);
        unsetenv("TZDIR");
        rm_rf(dir);
}

static void put32(unsigned char *p, uint32_t v)
{
        p[0] = (unsigned char)(v >> 24);
        p[1] = (unsigned char)(v >> 16);
        p[2] = (unsigned char)(v >> 8);
        p[3] = (unsigned char)v;
}

/* Build a TZif file: v1 (4-byte times) or v2 (empty v1 block, 8-byte block,
 * footer). */
static size_t build_tzif(unsigned char *buf, int version, const int64_t *trans, const uint8_t *idx,
                         uint32_t ntrans, const int32_t *offs, uint32_t ntypes, const char *footer)
{
        size_t n = 0;
        for (int pass = 0; pass < (version >= 2 ? 2 : 1); pass++) {
                bool v1empty = version >= 2 && pass == 0;
                unsigned tsize = pass == 1 ? 8 : 4;
                uint32_t nt = v1empty ? 0 : ntrans, nty = v1empty ? 1 : ntypes;
                memcpy(buf + n, "TZif", 4);
                buf[n + 4] = version >= 2 ? (unsigned char)('0' + version) : 0;
                memset(buf + n + 5, 0, 15);
                put32(buf + n + 20, 0);
                put32(buf + n + 24, 0);
                put32(buf + n + 28, 0);
                put32(buf + n + 32, nt);
                put32(buf + n + 36, nty);
                put32(buf + n + 40, 4);
                n += 44;
                for (uint32_t i = 0; i < nt; i++) {
                        if (tsize == 8) {
                                put32(buf + n, (uint32_t)((uint64_t)trans[i] >> 32));
                                put32(buf + n + 4, (uint32_t)trans[i]);
                        } else {
                                put32(buf + n, (uint32_t)trans[i]);
                        }
                        n += tsize;
                }
                for (uint32_t i = 0; i < nt; i++)
                        buf[n++] = idx[i];
                for (uint32_t i = 0; i < nty; i++) {
                        put32(buf + n, (uint32_t)(v1empty ? 0 : offs[i]));
                        buf[n + 4] = 0;
                        buf[n + 5] = 0;
                        n += 6;
                }
                memcpy(buf + n, "XYZ", 4);
                n += 4;
        }
        if (version >= 2)
                n += (size_t)sprintf((char *)buf + n, "\n%s\n", footer);
        return n;
}

static void test_tz_crafted_files(void **state)
{
        (void)state;
        char *dir = make_tmpdir();
        assert_int_equal(setenv("TZDIR", dir, 1), 0);
        unsigned char buf[4096];
        struct cron_tz *tz;

        /* v1: one transition at 1e9 from +0 to +1h */
        const int64_t tr[] = { 1000000000 };
        const uint8_t idx[] = { 1 };
        const int32_t offs[] = { 0, 3600 };
        size_t n = build_tzif(buf, 1, tr, idx, 1, offs, 2, NULL);
        write_bytes(dir, "Test/V1", buf, n);
        tz = TZ("Test/V1");
        assert_int_equal(OFF(tz, 999999999), 0);
        assert_int_equal(OFF(tz, 1000000000), 3600);
        assert_int_equal(OFF(tz, CRON_TIME_MAX), 3600);
        cron_tz_free(tz);

        /* v2 with 64-bit times before 1901 and a footer after them */
        const int64_t tr2[] = { -3000000000LL, 100000 };
        const uint8_t idx2[] = { 1, 0 };
        const int32_t offs2[] = { 19800, 20700 };
        n = build_tzif(buf, 2, tr2, idx2, 2, offs2, 2, "<+0530>-5:30");
        write_bytes(dir, "Test/V2", buf, n);
        tz = TZ("Test/V2");
        assert_int_equal(OFF(tz, 0), 20700);
        assert_int_equal(OFF(tz, 100000), 19800);
        assert_int_equal(OFF(tz, U(2030, 1, 1, 0, 0)), 19800);
        cron_tz_free(tz);

        /* footer forms compared against glibc's own POSIX TZ parser */
        static const char *footers[] = {
                "EST5EDT,M3.2.0,M11.1.0", "CET-1CEST,M3.5.0,M10.5.0/3",
                "<-03>3<-02>,M3.5.0/-2,M10.5.0/-1", "IST-2IDT,M3.4.4/26,M10.5.0",
                "AEST-10AEDT,M10.1.0,M4.1.0/3", "<+1030>-10:30<+11>-11,M10.1.0,M4.1.0",
                "XXX3YYY,J60/2,J300/2", "ZZZ-1WWW,59,299/1:30:15",
                "<-04>4<-03>,M9.1.6/24,M4.1.6/24", "NZST-12NZDT,M9.5.0,M4.1.0/3",
                "GMT0IST,M3.5.0/1,M10.5.0", "ABC+4:30DEF+3:30,M3.1.1/-1:30,M10.5.6/150",
        };
        for (size_t i = 0; i < sizeof(footers) / sizeof(*footers); i++) {
                const int32_t o0[] = { 0 };
                n = build_tzif(buf, 3, NULL, NULL, 0, o0, 1, footers[i]);
                write_bytes(dir, "Test/Footer", buf, n);
                tz = TZ("Test/Footer");
                assert_int_equal(setenv("TZ", footers[i], 1), 0);
                tzset();
                for (int64_t t = U(1990, 1, 1, 0, 0); t < U(2040, 1, 1, 0, 0); t += 86400 * 5 + 1777) {
                        time_t tt = (time_t)t;
                        struct tm tm;
                        localtime_r(&tt, &tm);
                        int32_t mine = OFF(tz, t);
                        if (mine != tm.tm_gmtoff)
                                print_message("%s at %" PRId64 ": %d vs libc %ld\n", footers[i], t,
                                              mine, tm.tm_gmtoff);
                        assert_int_equal(mine, tm.tm_gmtoff);
                }
                cron_tz_free(tz);
        }
        unsetenv("TZ");
        tzset();

        /* zic's idiom for DST all year.  (glibc answers EST for the first
         * hours of each UTC year here; RFC 8536 means EDT throughout.) */
        const int32_t z0[] = { 0 };
        n = build_tzif(buf, 3, NULL, NULL, 0, z0, 1, "EST5EDT,0/0,J365/25");
        write_bytes(dir, "Test/AllDst", buf, n);
        tz = TZ("Test/AllDst");
        for (int64_t t = U(1999, 12, 31, 0, 0); t < U(2001, 1, 2, 0, 0); t += 1800)
                assert_int_equal(OFF(tz, t), -4 * 3600);
        cron_tz_free(tz);

        /* bad footers and bad files */
        static const char *bad_footers[] = { "E5", "EST", "EST5EDT,M13.1.0,M11.1.0",
                                             "EST5EDT,M3.2.0", "EST5EDT,M3.2.0,M11.1.0x",
                                             "<EST5", "EST99", "EST5EDT,M3.2.7,M11.1.0" };
        for (size_t i = 0; i < sizeof(bad_footers) / sizeof(*bad_footers); i++) {
                const int32_t o0[] = { 0 };
                n = build_tzif(buf, 2, NULL, NULL, 0, o0, 1, bad_footers[i]);
                write_bytes(dir, "Test/BadFooter", buf, n);
                assert_int_equal(cron_tz_load("Test/BadFooter", &tz), -EBADMSG);
        }
        write_bytes(dir, "Test/Text", "hello world, not a zone\n", 24);
        assert_int_equal(cron_tz_load("Test/Text", &tz), -ENOENT);
        write_bytes(dir, "Test/Empty", "", 0);
        assert_int_equal(cron_tz_load("Test/Empty", &tz), -ENOENT);
        /* transitions out of order, offset absurd, index out of range */
        const int64_t tr3[] = { 2000, 1000 };
        const uint8_t idx3[] = { 0, 0 };
        n = build_tzif(buf, 1, tr3, idx3, 2, offs, 2, NULL);
        write_bytes(dir, "Test/Order", buf, n);
        assert_int_equal(cron_tz_load("Test/Order", &tz), -EBADMSG);
        const int32_t huge[] = { 0, 200000 };
        n = build_tzif(buf, 1, tr, idx, 1, huge, 2, NULL);
        write_bytes(dir, "Test/Huge", buf, n);
        assert_int_equal(cron_tz_load("Test/Huge", &tz), -EBADMSG);
        const uint8_t idx4[] = { 5 };
        n = build_tzif(buf, 1, tr, idx4, 1, offs, 2, NULL);
        write_bytes(dir, "Test/Idx", buf, n);
        assert_int_equal(cron_tz_load("Test/Idx", &tz), -EBADMSG);

        unsetenv("TZDIR");
        rm_rf(dir);
}

static unsigned char *slurp(const char *path, size_t *len)
{
        FILE *f = fopen(path, "rb");
        if (!f)
                return NULL;
        unsigned char *b = malloc(1 << 20);
        assert_non_null(b);
        *len = fread(b, 1, 1 << 20, f);
        fclose(f);
        return b;
}

/* Truncations and bit flips of a real file never crash; truncations fail. */
static void test_tz_corrupt_files(void **state)
{
        (void)state;
        size_t len = 0;
        unsigned char *orig = slurp("/usr/share/zoneinfo/Europe/Berlin", &len);
        if (!orig)
                skip();
        char *dir = make_tmpdir();
        assert_int_equal(setenv("TZDIR", dir, 1), 0);
        struct cron_tz *tz;
        struct cron_expr e = P("30 2 * * *");
        for (size_t n = 0; n < len; n++) {
                write_bytes(dir, "Z", orig, n);
                tz = (struct cron_tz *)&tz;
                int r = cron_tz_load("Z", &tz);
                assert_true(r == -ENOENT || r == -EBADMSG);
                assert_null(tz);
        }
        write_bytes(dir, "Z", orig, len);
        tz = TZ("Z");
        cron_tz_free(tz);
        uint64_t seed = test_seed();
        rng_state = seed ^ 0xF11;
        unsigned char *copy = malloc(len);
        assert_non_null(copy);
        for (int it = 0; it < 3000; it++) {
                memcpy(copy, orig, len);
                int flips = 1 + (int)rn(4);
                for (int k = 0; k < flips; k++)
                        copy[rn((unsigned)len)] ^= (unsigned char)(1u << rn(8));
                write_bytes(dir, "Z", copy, len);
                if (cron_tz_load("Z", &tz) == 0) {
                        int64_t nx;
                        int r = cron_next(&e, tz, U(2026, 3, 1, 0, 0), &nx);
                        assert_true(r == 0 || r == -ENOENT);
                        r = cron_next(&e, tz, U(2090, 3, 1, 0, 0), &nx);
                        assert_true(r == 0 || r == -ENOENT);
                        cron_tz_free(tz);
                }
        }
        free(copy);
        free(orig);
        unsetenv("TZDIR");
        rm_rf(dir);
}

/* Our offsets and broken-down times equal glibc's localtime_r (reading the
 * same files) over 1890..2150 for zones with unusual rules. */
static void test_tz_vs_libc(void **state)
{
        (void)state;
        static const char *zones[] = {
                "Europe/Berlin", "America/New_York", "Australia/Sydney", "Australia/Lord_Howe",
                "Asia/Kolkata", "America/Sao_Paulo", "Pacific/Apia", "Africa/Casablanca",
                "Pacific/Chatham", "Asia/Tehran", "America/St_Johns", "Antarctica/Troll",
                "Europe/Dublin", "America/Nuuk", "Asia/Gaza", "America/Santiago",
                "Asia/Jerusalem", "Pacific/Kiritimati", "Europe/London", "America/Havana",
                "Pacific/Auckland", "Africa/Cairo", "Asia/Amman", "UTC",
        };
        for (size_t i = 0; i < sizeof(zones) / sizeof(*zones); i++) {
                struct cron_tz *tz = NULL;
                if (cron_tz_load(zones[i], &tz) == -ENOENT)
                        continue;       /* older tzdata */
                assert_non_null(tz);
                char tzenv[80];
                snprintf(tzenv, sizeof(tzenv), ":%s", zones[i]);
                assert_int_equal(setenv("TZ", tzenv, 1), 0);
                tzset();
                int64_t step = 86400 * 3 + 3607;
                struct tm before;
                assert_int_equal(cron_tz_localtime(tz, U(1969, 12, 31, 23, 59), &before),
                                 -ERANGE);
                for (int64_t t = U(1970, 1, 1, 0, 0); t < U(2150, 1, 1, 0, 0); t += step) {
                        int64_t tt2 = t;
                        /* dense around 2026 */
                        if (t > U(2025, 12, 1, 0, 0) && t < U(2027, 1, 1, 0, 0))
                                step = 3593;
                        else
                                step = 86400 * 3 + 3607;
                        time_t tt = (time_t)tt2;
                        struct tm want, got;
                        localtime_r(&tt, &want);
                        assert_int_equal(cron_tz_localtime(tz, tt2, &got), 0);
                        if (got.tm_gmtoff != want.tm_gmtoff || got.tm_hour != want.tm_hour ||
                            got.tm_mday != want.tm_mday)
                                print_message("%s at %" PRId64 ": %ld vs libc %ld\n", zones[i], tt2,
                                              got.tm_gmtoff, want.tm_gmtoff);
                        assert_int_equal(got.tm_gmtoff, want.tm_gmtoff);
                        assert_int_equal(got.tm_year, want.tm_year);
                        assert_int_equal(got.tm_mon, want.tm_mon);
                        assert_int_equal(got.tm_mday, want.tm_mday);
                        assert_int_equal(got.tm_hour, want.tm_hour);
                        assert_int_equal(got.tm_min, want.tm_min);
                        assert_int_equal(got.tm_sec, want.tm_sec);
                        assert_int_equal(got.tm_wday, want.tm_wday);
                        assert_int_equal(got.tm_yday, want.tm_yday);
                }
                cron_tz_free(tz);
        }
        unsetenv("TZ");
        tzset();
}

static int zone_files;

static int load_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
        (void)ftw;
        if (flag != FTW_F || !S_ISREG(st->st_mode))
                return 0;
        FILE *f = fopen(path, "rb");
        char magic[4] = { 0 };
        if (!f)
                return 0;
        size_t n = fread(magic, 1, 4, f);
        fclose(f);
        if (n != 4 || memcmp(magic, "TZif", 4) != 0)
                return 0;
        const char *name = path + strlen("/usr/share/zoneinfo/");
        struct cron_tz *tz = NULL;
        int r = cron_tz_load(name, &tz);
        if (r == -EINVAL)
                return 0;       /* a file name we do not accept as a zone name */
        if (r != 0)
                print_message("%s: %d\n", name, r);
        assert_int_equal(r, 0);
        int64_t nx;
        struct cron_expr e = P("@daily");
        assert_int_equal(cron_next(&e, tz, U(2026, 1, 1, 0, 0), &nx), 0);
        cron_tz_free(tz);
        zone_files++;
        return 0;
}

/* Every TZif file of the installed tzdata loads. */
static void test_tz_all_installed(void **state)
{
        (void)state;
        if (access("/usr/share/zoneinfo/Europe/Berlin", R_OK) != 0)
                skip();
        unsetenv("TZDIR");
        zone_files = 0;
        assert_int_equal(nftw("/usr/share/zoneinfo", load_cb, 16, 0), 0);
        assert_true(zone_files > 300);
}

/* ------------------------------------------------------------------------ */
/* systemd-analyze calendar, when available (UTC, expressions it can express) */

static void sd_list(const struct gen *g, int f, char *out, size_t len, bool names)
{
        static const char *const dn[] = { "Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat" };
        size_t p = 0;
        out[0] = '\0';
        for (int v = gmin[f]; v <= gmax[f]; v++) {
                if (!g->set[f][v])
                        continue;
                if (names)
                        p += (size_t)snprintf(out + p, len - p, "%s%s", p ? "," : "", dn[v]);
                else
                        p += (size_t)snprintf(out + p, len - p, "%s%02d", p ? "," : "", v);
        }
}

static void test_vs_systemd_analyze(void **state)
{
        (void)state;
        if (access("/usr/bin/systemd-analyze", X_OK) != 0 || getenv("CRON_TEST_NO_SYSTEMD"))
                skip();
        uint64_t seed = test_seed();
        rng_state = seed ^ 0x5D;
        int compared = 0;
        for (int i = 0; i < 60; i++) {
                struct gen g;
                gen_expr(&g, 0);
                if (g.dom_r && g.dow_r)
                        continue;       /* systemd ANDs them; no OR rule */
                char mi[400], h[200], d[200], mo[100], dw[100], cmd[1400];
                sd_list(&g, 0, mi, sizeof(mi), false);
                sd_list(&g, 1, h, sizeof(h), false);
                sd_list(&g, 2, d, sizeof(d), false);
                sd_list(&g, 3, mo, sizeof(mo), false);
                sd_list(&g, 4, dw, sizeof(dw), true);
                int64_t base = U(2020 + (int)rn(10), 1 + (int)rn(12), 1 + (int)rn(28), (int)rn(24), 0);
                time_t bt = (time_t)base;
                struct tm tm;
                gmtime_r(&bt, &tm);
                snprintf(cmd, sizeof(cmd),
                         "TZ=UTC systemd-analyze calendar --iterations=3 "
                         "--base-time='%04d-%02d-%02d %02d:%02d:%02d UTC' "
                         "'%s%s*-%s-%s %s:%s:00 UTC' 2>/dev/null",
                         tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                         tm.tm_sec, g.dow_r ? dw : "", g.dow_r ? " " : "", mo, d, h, mi);
                FILE *p = popen(cmd, "r");
                if (!p)
                        skip();
                char line[256];
                int64_t sd[3];
                int nsd = 0;
                while (fgets(line, sizeof(line), p) && nsd < 3) {
                        char *c = strstr(line, "Next elapse: ");
                        if (!c)
                                c = strstr(line, "Iter. #");
                        if (!c || !(c = strchr(c, ':')))
                                continue;
                        struct tm st = { 0 };
                        char wd[8];
                        if (sscanf(c + 1, " %7s %d-%d-%d %d:%d:%d", wd, &st.tm_year, &st.tm_mon,
                                   &st.tm_mday, &st.tm_hour, &st.tm_min, &st.tm_sec) != 7)
                                continue;
                        st.tm_year -= 1900;
                        st.tm_mon -= 1;
                        sd[nsd++] = (int64_t)timegm(&st);
                }
                int rc = pclose(p);
                if (rc != 0 || nsd == 0)
                        continue;       /* not expressible (e.g. no match) */
                struct cron_expr e = P(g.text);
                int64_t t = base;
                for (int k = 0; k < nsd; k++) {
                        int64_t nx;
                        assert_int_equal(cron_next(&e, NULL, t, &nx), 0);
                        if (nx != sd[k])
                                print_message("seed %" PRIu64 ": '%s' from %" PRId64
                                              ": %" PRId64 " vs systemd %" PRId64 "\n",
                                              seed, g.text, t, nx, sd[k]);
                        assert_int_equal(nx, sd[k]);
                        t = nx;
                }
                compared++;
        }
        print_message("compared %d expressions with systemd-analyze\n", compared);
        if (compared == 0)
                skip();
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_parse_original_cases),
                cmocka_unit_test(test_parse_names_and_sunday),
                cmocka_unit_test(test_parse_restricted),
                cmocka_unit_test(test_parse_macros),
                cmocka_unit_test(test_parse_errors),
                cmocka_unit_test(test_parse_error_buffer),
                cmocka_unit_test(test_parse_garbage),
                cmocka_unit_test(test_matches),
                cmocka_unit_test(test_or_rule_next),
                cmocka_unit_test(test_windows),
                cmocka_unit_test(test_next_same_day_and_wrap),
                cmocka_unit_test(test_next_enoent_and_args),
                cmocka_unit_test(test_time_range),
                cmocka_unit_test(test_differential_utc),
                cmocka_unit_test(test_differential_berlin),
                cmocka_unit_test(test_differential_new_york),
                cmocka_unit_test(test_differential_lord_howe),
                cmocka_unit_test(test_dst_berlin),
                cmocka_unit_test(test_dst_new_york),
                cmocka_unit_test(test_dst_missing_midnight),
                cmocka_unit_test(test_tz_names),
                cmocka_unit_test(test_tz_utc_without_tzdata),
                cmocka_unit_test(test_tz_crafted_files),
                cmocka_unit_test(test_tz_corrupt_files),
                cmocka_unit_test(test_tz_vs_libc),
                cmocka_unit_test(test_tz_all_installed),
                cmocka_unit_test(test_vs_systemd_analyze),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
