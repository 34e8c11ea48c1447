/* SPDX-License-Identifier: MIT */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kairos/openmetrics.h"

static void test_escape_label_value(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        assert_int_equal(om_escape_label_value(&b, "a\\b\"c\nd\te"), 0);
        assert_string_equal(b.data, "a\\\\b\\\"c\\nd\te");
        kbuf_free(&b);
}

static void test_counter_family_names_differ_by_format(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        assert_int_equal(om_family(&b, OM_PROMETHEUS, "kairos_fires", OM_COUNTER, NULL,
                                   "Fires.\nSecond \\ line"),
                         0);
        assert_string_equal(b.data, "# HELP kairos_fires_total Fires.\\nSecond \\\\ line\n"
                                    "# TYPE kairos_fires_total counter\n");
        kbuf_reset(&b);
        assert_int_equal(om_family(&b, OM_OPENMETRICS, "kairos_fires", OM_COUNTER, NULL, "Fires."),
                         0);
        assert_string_equal(b.data, "# HELP kairos_fires Fires.\n# TYPE kairos_fires counter\n");
        kbuf_free(&b);
}

static void test_unit_only_in_openmetrics(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        om_family(&b, OM_PROMETHEUS, "kairos_x_seconds", OM_HISTOGRAM, "seconds", "X.");
        assert_null(strstr(b.data, "# UNIT"));
        kbuf_reset(&b);
        om_family(&b, OM_OPENMETRICS, "kairos_x_seconds", OM_HISTOGRAM, "seconds", "X.");
        assert_non_null(strstr(b.data, "# UNIT kairos_x_seconds seconds\n"));
        kbuf_free(&b);
}

static void test_samples(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        struct om_label l[] = { { "schedule", "a\"b" }, { "source", "timer" } };
        assert_int_equal(om_sample_u64(&b, "kairos_fires", OM_COUNTER, l, 2, 7), 0);
        assert_int_equal(om_sample_u64(&b, "kairos_up", OM_GAUGE, NULL, 0, 1), 0);
        assert_int_equal(om_sample_double(&b, "kairos_t", OM_GAUGE, NULL, 0, 1700000000.25), 0);
        assert_string_equal(b.data, "kairos_fires_total{schedule=\"a\\\"b\",source=\"timer\"} 7\n"
                                    "kairos_up 1\n"
                                    "kairos_t 1700000000.25\n");
        kbuf_free(&b);
}

static void test_histogram_is_cumulative(void **state)
{
        (void)state;
        static const double bounds[] = { 0.001, 0.1, 1 };
        uint64_t counts[4] = { 0 };
        double obs[] = { 0.0005, 0.001, 0.05, 0.5, 3, 7 };
        double sum = 0;
        for (size_t i = 0; i < 6; i++) {
                counts[om_bucket_index(bounds, 3, obs[i])]++;
                sum += obs[i];
        }
        assert_int_equal(counts[0], 2); /* le is inclusive */
        assert_int_equal(counts[3], 2);
        struct kbuf b = KBUF_INIT;
        struct om_label l[] = { { "phase", "act" } };
        struct om_histogram h = { bounds, 3, counts, sum };
        assert_int_equal(om_histogram_samples(&b, "kairos_h_seconds", l, 1, &h), 0);
        assert_string_equal(b.data, "kairos_h_seconds_bucket{phase=\"act\",le=\"0.001\"} 2\n"
                                    "kairos_h_seconds_bucket{phase=\"act\",le=\"0.1\"} 3\n"
                                    "kairos_h_seconds_bucket{phase=\"act\",le=\"1\"} 4\n"
                                    "kairos_h_seconds_bucket{phase=\"act\",le=\"+Inf\"} 6\n"
                                    "kairos_h_seconds_sum{phase=\"act\"} 10.5515\n"
                                    "kairos_h_seconds_count{phase=\"act\"} 6\n");
        kbuf_reset(&b);
        assert_int_equal(om_histogram_samples(&b, "kairos_w_seconds", NULL, 0, &h), 0);
        assert_non_null(strstr(b.data, "kairos_w_seconds_bucket{le=\"+Inf\"} 6\n"));
        assert_non_null(strstr(b.data, "kairos_w_seconds_count 6\n"));
        kbuf_free(&b);
}

static void test_format_double_round_trips(void **state)
{
        (void)state;
        char s[32];
        double vals[] = { 0.1, 0.005, 2.5, 1e-9, 123456789.125, 1.0 / 3.0 };
        for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
                om_format_double(vals[i], s);
                assert_true(strtod(s, NULL) == vals[i]);
        }
        om_format_double(0.1, s);
        assert_string_equal(s, "0.1");
        om_format_double(10, s);
        assert_string_equal(s, "10");
        om_format_double(3600, s);
        assert_string_equal(s, "3600");
        om_format_double(0.0001, s);
        assert_string_equal(s, "0.0001");
        om_format_double(1e-9, s);
        assert_string_equal(s, "1e-09");
        om_format_double(INFINITY, s);
        assert_string_equal(s, "+Inf");
        om_format_double(NAN, s);
        assert_string_equal(s, "NaN");
}

static void test_end(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        assert_int_equal(om_end(&b, OM_PROMETHEUS), 0);
        assert_int_equal(b.len, 0);
        assert_int_equal(om_end(&b, OM_OPENMETRICS), 0);
        assert_string_equal(b.data, "# EOF\n");
        kbuf_free(&b);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_escape_label_value),
                cmocka_unit_test(test_counter_family_names_differ_by_format),
                cmocka_unit_test(test_unit_only_in_openmetrics),
                cmocka_unit_test(test_samples),
                cmocka_unit_test(test_histogram_is_cumulative),
                cmocka_unit_test(test_format_double_round_trips),
                cmocka_unit_test(test_end),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
