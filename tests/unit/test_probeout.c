/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kairos/planner.h"
#include "kairos/probeout.h"

static void judge_out(const char *out, struct probe_word *w)
{
        struct probe_run run = { .out = out, .out_len = strlen(out) };
        assert_int_equal(probe_judge(&run, w), 0);
}

static void expect_failed(const char *out, const char *why)
{
        struct probe_word w;
        judge_out(out, &w);
        if (w.probe != RECOVERY_PROBE_FAILED)
                fail_msg("%s: %s, expected failed", out, probe_word_name(w.probe));
        assert_null(w.result_json);
        assert_non_null(w.output);
        if (!strstr(w.output, why))
                fail_msg("%s: \"%s\" lacks \"%s\"", out, w.output, why);
        probe_word_clear(&w);
}

static void test_answers(void **state)
{
        (void)state;
        struct probe_word w;
        judge_out("{\"state\":\"done\",\"result\":{\"sent\":3, \"n\":123456789012345678901234}}\n",
                  &w);
        assert_int_equal(w.probe, RECOVERY_PROBE_DONE);
        /* compact, numbers exactly as written */
        assert_string_equal(w.result_json, "{\"sent\":3,\"n\":123456789012345678901234}");
        assert_null(w.output);
        probe_word_clear(&w);
        assert_int_equal(w.probe, RECOVERY_PROBE_NONE);

        judge_out(" {\"result\":null,\"state\":\"done\"} ", &w);
        assert_int_equal(w.probe, RECOVERY_PROBE_DONE);
        assert_string_equal(w.result_json, "null");
        probe_word_clear(&w);

        judge_out("{\"state\":\"not_started\"}", &w);
        assert_int_equal(w.probe, RECOVERY_PROBE_NOT_STARTED);
        assert_null(w.result_json);
        assert_null(w.output);
        probe_word_clear(&w);
}

static void test_strict(void **state)
{
        (void)state;
        expect_failed("", "no answer on stdout");
        expect_failed("done", "stdout is not JSON");
        expect_failed("{\"state\":\"done\",\"result\":1} trailing", "stdout is not JSON");
        expect_failed("[\"done\"]", "not a JSON object");
        expect_failed("{\"state\":\"done\"}", "done without a result");
        expect_failed("{\"state\":\"Done\",\"result\":1}", "neither done nor not_started");
        expect_failed("{\"state\":\"not_started\",\"result\":1}", "not_started with a result");
        expect_failed("{\"state\":\"done\",\"result\":1,\"extra\":2}", "a member other than");
        expect_failed("{\"state\":\"not_started\",\"state\":\"done\",\"result\":1}",
                      "a member given twice");
        expect_failed("{\"state\":1}", "no state string");
        expect_failed("{\"state\":\"done\\u0000\",\"result\":1}", "no state string");
        expect_failed("{\"result\":1}", "no state string");
        /* the evidence names what was expected and shows the output */
        expect_failed("garbage", "expected {\"state\":\"done\"");
        expect_failed("garbage", "; stdout: garbage");
}

static void test_ends(void **state)
{
        (void)state;
        static const char done[] = "{\"state\":\"done\",\"result\":1}";
        struct probe_word w;
        struct probe_run run = { .out = done, .out_len = strlen(done), .exit_status = 2,
                                 .err = "no db\n", .err_len = 6 };
        /* a good answer does not count from a probe that failed */
        assert_int_equal(probe_judge(&run, &w), 0);
        assert_int_equal(w.probe, RECOVERY_PROBE_FAILED);
        assert_string_equal(w.output, "exit status 2; stdout: {\"state\":\"done\",\"result\":1}; "
                                      "stderr: no db");
        probe_word_clear(&w);

        run = (struct probe_run){ .out = done, .out_len = strlen(done), .term_signal = 9 };
        assert_int_equal(probe_judge(&run, &w), 0);
        assert_int_equal(w.probe, RECOVERY_PROBE_FAILED);
        assert_non_null(strstr(w.output, "killed by signal 9"));
        probe_word_clear(&w);

        run = (struct probe_run){ .timed_out = true, .timeout_sec = 30, .term_signal = 15 };
        assert_int_equal(probe_judge(&run, &w), 0);
        assert_int_equal(w.probe, RECOVERY_PROBE_FAILED);
        assert_string_equal(w.output, "no answer within ProbeTimeoutSec=30 (killed)");
        probe_word_clear(&w);

        run = (struct probe_run){ .out = done, .out_len = strlen(done), .out_overflow = true };
        assert_int_equal(probe_judge(&run, &w), 0);
        assert_int_equal(w.probe, RECOVERY_PROBE_FAILED);
        assert_non_null(strstr(w.output, "more than 1048576 bytes on stdout"));
        probe_word_clear(&w);

        run = (struct probe_run){ .start_error = "execute: No such file or directory" };
        assert_int_equal(probe_judge(&run, &w), 0);
        assert_int_equal(w.probe, RECOVERY_PROBE_FAILED);
        assert_string_equal(w.output,
                            "the probe could not start: execute: No such file or directory");
        probe_word_clear(&w);

        assert_int_equal(probe_judge(NULL, &w), -EINVAL);
        assert_int_equal(probe_judge(&run, NULL), -EINVAL);
        probe_word_clear(NULL);
}

/* The evidence is bounded and valid UTF-8 whatever the probe printed. */
static void test_evidence_bounded(void **state)
{
        (void)state;
        size_t n = 100000;
        char *big = malloc(n);
        assert_non_null(big);
        for (size_t i = 0; i < n; i++)
                big[i] = i % 7 == 0 ? '\xff' : i % 11 == 0 ? '\0' : 'x';
        struct probe_word w;
        struct probe_run run = { .out = big, .out_len = n, .err = big, .err_len = n };
        assert_int_equal(probe_judge(&run, &w), 0);
        assert_int_equal(w.probe, RECOVERY_PROBE_FAILED);
        /* two streams of at most PROBE_EVIDENCE_MAX characters of <= 3 bytes */
        assert_true(strlen(w.output) < 2 * (3 * PROBE_EVIDENCE_MAX + 16) + 200);
        assert_non_null(strstr(w.output, "\xEF\xBF\xBD"));
        assert_non_null(strstr(w.output, "\u2026"));
        probe_word_clear(&w);
        free(big);
}

static void test_schedule_evidence(void **state)
{
        (void)state;
        const char *text = "[Schedule]\nCron=@daily\n[Exec]\nAct=/bin/act\nReflect=/bin/r\n"
                           "Probe=/bin/probe\nEffects=act reflect\n";
        struct config_schedule s;
        struct config_errors errs = { 0 };
        struct recovery_evidence ev;
        assert_int_equal(config_parse_schedule("x", "/x.conf", text, strlen(text), &s, &errs), 0);
        struct config c = { .schedules = &s, .nschedules = 1 };
        assert_true(probe_schedule_evidence(&c, "x", &ev));
        assert_true(ev.has_probe);
        assert_false(ev.effects_via_kairosctl);
        assert_int_equal(ev.effects, (1u << PHASE_ACT) | (1u << PHASE_REFLECT));
        assert_false(ev.has_command[PHASE_OBSERVE]);
        assert_true(ev.has_command[PHASE_ACT]);
        assert_true(ev.has_command[PHASE_REFLECT]);
        assert_null(ev.steps);
        assert_false(probe_schedule_evidence(&c, "y", &ev));
        assert_false(probe_schedule_evidence(&c, NULL, &ev));
        config_schedule_clear(&s);
        text = "[Schedule]\nCron=@daily\n[Exec]\nAct=/bin/act\n";
        assert_int_equal(config_parse_schedule("x", "/x.conf", text, strlen(text), &s, &errs), 0);
        assert_false(probe_schedule_evidence(&c, "x", &ev));
        config_schedule_clear(&s);
}

static void test_names(void **state)
{
        (void)state;
        assert_string_equal(probe_word_name(RECOVERY_PROBE_DONE), "done");
        assert_string_equal(probe_word_name(RECOVERY_PROBE_NOT_STARTED), "not_started");
        assert_string_equal(probe_word_name(RECOVERY_PROBE_FAILED), "failed");
        assert_string_equal(probe_word_name(RECOVERY_PROBE_NONE), "none");
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_answers),         cmocka_unit_test(test_strict),
                cmocka_unit_test(test_ends),            cmocka_unit_test(test_evidence_bounded),
                cmocka_unit_test(test_schedule_evidence), cmocka_unit_test(test_names),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
