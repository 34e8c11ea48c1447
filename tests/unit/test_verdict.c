/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kairos/kbuf.h"
#include "kairos/verdict.h"

/* Run the check and compare kind, row, reason and the evidence JSON. */
static void expect(const struct verdict_step *s, const char *cur_pre, const char *cur_post,
                   enum verdict_kind kind, int row, const char *reason, const char *evidence)
{
        struct verdict v;
        struct kbuf b = KBUF_INIT;

        verdict_check(s, cur_pre, cur_post, &v);
        assert_string_equal(verdict_kind_name(v.kind), verdict_kind_name(kind));
        assert_int_equal(v.row, row);
        assert_string_equal(v.reason, reason);
        assert_int_equal(verdict_evidence_json(&v, &b), 0);
        assert_string_equal(b.data, evidence);
        kbuf_free(&b);
}

static void test_row1_wal_recorded_completion(void **state)
{
        (void)state;
        struct verdict_step s = { .state = STEP_COMPLETED, .status = "completed", .pre_hash = "pre", .expected_post_hash = "post",
                                  .observed_pre_hash = "pre", .post_hash = "P", .result_hash = "R" };
        struct verdict v;

        expect(&s, NULL, NULL, VERDICT_ALREADY_DONE, 1, "wal_recorded_completion",
               "{\"reason\":\"wal_recorded_completion\",\"result_hash\":\"R\"}");
        verdict_check(&s, NULL, NULL, &v);
        assert_string_equal(v.post_hash, "P");

        /* result_hash absent is written as null */
        s.result_hash = NULL;
        expect(&s, NULL, NULL, VERDICT_ALREADY_DONE, 1, "wal_recorded_completion",
               "{\"reason\":\"wal_recorded_completion\",\"result_hash\":null}");

        /* row 1 beats a matching current_post (row 2): post_hash echoed from the WAL */
        verdict_check(&s, "pre", "post", &v);
        assert_int_equal(v.row, 1);
        assert_string_equal(v.post_hash, "P");
}

static void test_needs_review_with_post_hash_is_done(void **state)
{
        (void)state;
        struct verdict_step s = { .state = STEP_NEEDS_REVIEW, .status = "needs_review", .observed_pre_hash = "o", .post_hash = "P" };

        expect(&s, NULL, NULL, VERDICT_ALREADY_DONE, 1, "wal_recorded_completion",
               "{\"reason\":\"wal_recorded_completion\",\"result_hash\":null}");
}

static void test_empty_post_hash_not_done(void **state)
{
        (void)state;
        struct verdict_step s = { .state = STEP_EXECUTING, .status = "executing", .pre_hash = "pre", .observed_pre_hash = "o",
                                  .post_hash = "" };

        expect(&s, NULL, NULL, VERDICT_MANUAL_REVIEW, 6, "interrupted_during_execution",
               "{\"reason\":\"interrupted_during_execution\",\"status\":\"executing\","
               "\"observed_pre_hash\":\"o\",\"expected_pre_hash\":\"pre\"}");
        /* and with nothing else known it is a plain never-executed step */
        struct verdict_step t = { .state = STEP_PENDING, .status = "pending", .post_hash = "" };
        expect(&t, NULL, NULL, VERDICT_SAFE_TO_RETRY, 4, "never_reached_executing",
               "{\"reason\":\"never_reached_executing\",\"status\":\"pending\"}");
}

static void test_row2_current_post_matches(void **state)
{
        (void)state;
        struct verdict_step s = { .state = STEP_EXECUTING, .status = "executing", .pre_hash = "pre", .expected_post_hash = "post",
                                  .observed_pre_hash = "pre" };
        struct verdict v;

        expect(&s, NULL, "post", VERDICT_ALREADY_DONE, 2, "current_state_matches_expected_post",
               "{\"reason\":\"current_state_matches_expected_post\"}");
        verdict_check(&s, NULL, "post", &v);
        assert_string_equal(v.post_hash, "post");

        /* different current_post: falls through to row 6 */
        expect(&s, NULL, "other", VERDICT_MANUAL_REVIEW, 6, "interrupted_during_execution",
               "{\"reason\":\"interrupted_during_execution\",\"status\":\"executing\","
               "\"observed_pre_hash\":\"pre\",\"expected_pre_hash\":\"pre\"}");

        /* no expected_post: row 2 cannot match */
        s.expected_post_hash = NULL;
        verdict_check(&s, NULL, "post", &v);
        assert_int_equal(v.row, 6);

        /* "" is a present value (truthy in the original) */
        s.expected_post_hash = "";
        verdict_check(&s, NULL, "", &v);
        assert_int_equal(v.row, 2);
}

static void test_row2_beats_row3(void **state)
{
        (void)state;
        struct verdict_step s = { .state = STEP_NEEDS_REVIEW, .status = "needs_review", .expected_post_hash = "post",
                                  .observed_pre_hash = "o" };

        expect(&s, NULL, "post", VERDICT_ALREADY_DONE, 2, "current_state_matches_expected_post",
               "{\"reason\":\"current_state_matches_expected_post\"}");
}

static void test_row3_needs_review(void **state)
{
        (void)state;
        /* needs_review wins over row 4 (never executed) and row 5 (current_pre matches) */
        struct verdict_step s = { .state = STEP_NEEDS_REVIEW, .status = "needs_review", .pre_hash = "pre" };

        expect(&s, "pre", NULL, VERDICT_MANUAL_REVIEW, 3, "explicitly_marked_needs_review",
               "{\"reason\":\"explicitly_marked_needs_review\",\"status\":\"needs_review\"}");
}

static void test_row4_never_reached_executing(void **state)
{
        (void)state;
        struct verdict_step s = { .state = STEP_PENDING, .status = "pending", .pre_hash = "pre" };

        expect(&s, NULL, NULL, VERDICT_SAFE_TO_RETRY, 4, "never_reached_executing",
               "{\"reason\":\"never_reached_executing\",\"status\":\"pending\"}");
}

static void test_failed_never_executed_is_retry(void **state)
{
        (void)state;
        struct verdict_step s = { .state = STEP_FAILED, .status = "failed", .pre_hash = "pre" };

        expect(&s, NULL, NULL, VERDICT_SAFE_TO_RETRY, 4, "never_reached_executing",
               "{\"reason\":\"never_reached_executing\",\"status\":\"failed\"}");
}

static void test_failed_after_executing_is_review(void **state)
{
        (void)state;
        struct verdict_step s = { .state = STEP_FAILED, .status = "failed", .pre_hash = "pre", .observed_pre_hash = "obs" };

        expect(&s, NULL, NULL, VERDICT_MANUAL_REVIEW, 6, "interrupted_during_execution",
               "{\"reason\":\"interrupted_during_execution\",\"status\":\"failed\","
               "\"observed_pre_hash\":\"obs\",\"expected_pre_hash\":\"pre\"}");
}

static void test_status_null_is_retry(void **state)
{
        (void)state;
        struct verdict_step s = { .status = NULL, .pre_hash = "pre" };
        struct verdict v;

        expect(&s, NULL, NULL, VERDICT_SAFE_TO_RETRY, 4, "never_reached_executing",
               "{\"reason\":\"never_reached_executing\",\"status\":\"\"}");
        verdict_check(&s, NULL, NULL, &v);
        assert_string_equal(v.status, "");
}

static void test_observed_pre_empty_counts_as_present(void **state)
{
        (void)state;
        struct verdict_step s = { .state = STEP_PENDING, .status = "pending", .pre_hash = "pre", .observed_pre_hash = "" };

        expect(&s, NULL, NULL, VERDICT_MANUAL_REVIEW, 6, "interrupted_during_execution",
               "{\"reason\":\"interrupted_during_execution\",\"status\":\"pending\","
               "\"observed_pre_hash\":\"\",\"expected_pre_hash\":\"pre\"}");
}

static void test_executing_without_observed_pre_is_not_row4(void **state)
{
        (void)state;
        struct verdict_step s = { .state = STEP_EXECUTING, .status = "executing" };
        struct verdict_step c = { .state = STEP_COMPLETED, .status = "completed" };

        expect(&s, NULL, NULL, VERDICT_MANUAL_REVIEW, 6, "interrupted_during_execution",
               "{\"reason\":\"interrupted_during_execution\",\"status\":\"executing\","
               "\"observed_pre_hash\":null,\"expected_pre_hash\":null}");
        /* completed with no post_hash recorded is ambiguous as well */
        expect(&c, NULL, NULL, VERDICT_MANUAL_REVIEW, 6, "interrupted_during_execution",
               "{\"reason\":\"interrupted_during_execution\",\"status\":\"completed\","
               "\"observed_pre_hash\":null,\"expected_pre_hash\":null}");
}

static void test_row5_current_pre_matches(void **state)
{
        (void)state;
        struct verdict_step s = { .state = STEP_EXECUTING, .status = "executing", .pre_hash = "pre", .observed_pre_hash = "pre" };

        expect(&s, "pre", NULL, VERDICT_SAFE_TO_RETRY, 5, "current_pre_matches_expected",
               "{\"reason\":\"current_pre_matches_expected\"}");
        /* not matching: row 6 */
        expect(&s, "changed", NULL, VERDICT_MANUAL_REVIEW, 6, "interrupted_during_execution",
               "{\"reason\":\"interrupted_during_execution\",\"status\":\"executing\","
               "\"observed_pre_hash\":\"pre\",\"expected_pre_hash\":\"pre\"}");
        /* no current_pre given: row 6 */
        expect(&s, NULL, NULL, VERDICT_MANUAL_REVIEW, 6, "interrupted_during_execution",
               "{\"reason\":\"interrupted_during_execution\",\"status\":\"executing\","
               "\"observed_pre_hash\":\"pre\",\"expected_pre_hash\":\"pre\"}");
        /* no expected pre in the plan: row 5 cannot match */
        s.pre_hash = NULL;
        expect(&s, "pre", NULL, VERDICT_MANUAL_REVIEW, 6, "interrupted_during_execution",
               "{\"reason\":\"interrupted_during_execution\",\"status\":\"executing\","
               "\"observed_pre_hash\":\"pre\",\"expected_pre_hash\":null}");
}

static void test_evidence_escapes_and_appends(void **state)
{
        (void)state;
        struct verdict_step s = { .status = "exec\"uting", .pre_hash = "a\\b", .observed_pre_hash = "o" };
        struct verdict v;
        struct kbuf b = KBUF_INIT;

        verdict_check(&s, NULL, NULL, &v);
        assert_int_equal(kbuf_puts(&b, "X"), 0);
        assert_int_equal(verdict_evidence_json(&v, &b), 0);
        assert_string_equal(b.data, "X{\"reason\":\"interrupted_during_execution\",\"status\":\"exec\\\"uting\","
                                    "\"observed_pre_hash\":\"o\",\"expected_pre_hash\":\"a\\\\b\"}");

        /* invalid UTF-8 is refused and the buffer left as it was */
        struct verdict_step bad = { .status = "pending\xff" };
        verdict_check(&bad, NULL, NULL, &v);
        kbuf_reset(&b);
        assert_int_equal(kbuf_puts(&b, "Y"), 0);
        assert_int_equal(verdict_evidence_json(&v, &b), -EILSEQ);
        assert_string_equal(b.data, "Y");
        assert_int_equal(b.len, 1);
        kbuf_free(&b);
}

/* verdict_evidence_json as it was: each key escaped with kbuf_json_string
 * each time.  The reference for the one that writes them pre-escaped. */
static int ref_member(struct kbuf *out, const char *key, const char *value)
{
        int r = kbuf_putc(out, ',');
        if (r == 0)
                r = kbuf_json_string(out, key, strlen(key));
        if (r == 0)
                r = kbuf_putc(out, ':');
        if (r < 0)
                return r;
        if (!value)
                return kbuf_puts(out, "null");
        return kbuf_json_string(out, value, strlen(value));
}

static int ref_evidence_json(const struct verdict *v, struct kbuf *out)
{
        size_t start = out->len;
        if (!v->reason)
                return -EINVAL;
        int r = kbuf_puts(out, "{\"reason\":");
        if (r == 0)
                r = kbuf_json_string(out, v->reason, strlen(v->reason));
        if (r == 0 && (v->evidence & VERDICT_EV_RESULT_HASH))
                r = ref_member(out, "result_hash", v->result_hash);
        if (r == 0 && (v->evidence & VERDICT_EV_STATUS))
                r = ref_member(out, "status", v->status);
        if (r == 0 && (v->evidence & VERDICT_EV_OBSERVED_PRE))
                r = ref_member(out, "observed_pre_hash", v->observed_pre_hash);
        if (r == 0 && (v->evidence & VERDICT_EV_EXPECTED_PRE))
                r = ref_member(out, "expected_pre_hash", v->expected_pre_hash);
        if (r == 0 && v->extra_json && *v->extra_json) {
                r = kbuf_putc(out, ',');
                if (r == 0)
                        r = kbuf_puts(out, v->extra_json);
        }
        if (r == 0)
                r = kbuf_putc(out, '}');
        if (r < 0)
                kbuf_truncate(out, start);
        return r;
}

/* Every combination of members, values odd and plain (NULL, "", quotes,
 * backslashes, controls, UTF-8, invalid UTF-8, long hashes), extra members
 * or not, into an empty buffer or after text already there: the same bytes,
 * return and buffer size as the reference, and a refused value leaves the
 * buffer as it was. */
static void test_evidence_same_as_reference(void **state)
{
        (void)state;
        static const char *const values[] = {
                NULL, "", "executing", "sha256-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                "a\"b", "a\\b", "\n\t\x01\x1f", "\xc3\xa9\xe2\x80\xa8", "bad\xff", "/<>",
        };
        static const char *const reasons[] = { "interrupted_during_execution", "", "r\"\\\n",
                                                "\xc3\xa9", "bad\xc3" };
        static const char *const extras[] = { NULL, "", "\"k\":1", "\"tool_calls\":[]" };
        static const char *const before[] = { "", "X", "0123456789012345678901234567890123456789"
                                                       "0123456789012345678901234567890123456789"
                                                       "0123456789012345678901234567890123456789"
                                                       "0123456789012345678901234567890123456789" };
        const size_t nv = sizeof values / sizeof values[0];
        unsigned seed = 1;
        for (size_t i = 0; i < 20000; i++) {
                seed = seed * 1103515245u + 12345u;
                unsigned x = seed >> 4;
                struct verdict v = {
                        .reason = reasons[x % 5],
                        .evidence = (x / 5) % 16,
                        .result_hash = values[(x / 80) % nv],
                        .status = values[(x / 800) % nv],
                        .observed_pre_hash = values[(i * 7) % nv],
                        .expected_pre_hash = values[(i * 3 + x) % nv],
                        .extra_json = extras[(x / 8000) % 4],
                };
                const char *pre = before[i % 3];
                struct kbuf got = KBUF_INIT, want = KBUF_INIT;
                if (*pre) {
                        assert_int_equal(kbuf_puts(&got, pre), 0);
                        assert_int_equal(kbuf_puts(&want, pre), 0);
                }
                int rg = verdict_evidence_json(&v, &got), rw = ref_evidence_json(&v, &want);
                assert_int_equal(rg, rw);
                assert_int_equal(got.len, want.len);
                assert_memory_equal(got.data ? got.data : "", want.data ? want.data : "",
                                    want.len);
                /* and no bigger a buffer (callers keep it: one per decision) */
                if (rg == 0)
                        assert_int_equal(got.cap, want.cap);
                if (rg < 0)
                        assert_int_equal(got.len, strlen(pre));
                kbuf_free(&got);
                kbuf_free(&want);
        }
        struct verdict none = { .reason = NULL };
        struct kbuf b = KBUF_INIT;
        assert_int_equal(verdict_evidence_json(&none, &b), -EINVAL);
        assert_int_equal(b.len, 0);
        kbuf_free(&b);
}

static void test_kind_names(void **state)
{
        (void)state;
        assert_string_equal(verdict_kind_name(VERDICT_ALREADY_DONE), "already_done");
        assert_string_equal(verdict_kind_name(VERDICT_SAFE_TO_RETRY), "safe_to_retry");
        assert_string_equal(verdict_kind_name(VERDICT_MANUAL_REVIEW), "manual_review");
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_row1_wal_recorded_completion),
                cmocka_unit_test(test_needs_review_with_post_hash_is_done),
                cmocka_unit_test(test_empty_post_hash_not_done),
                cmocka_unit_test(test_row2_current_post_matches),
                cmocka_unit_test(test_row2_beats_row3),
                cmocka_unit_test(test_row3_needs_review),
                cmocka_unit_test(test_row4_never_reached_executing),
                cmocka_unit_test(test_failed_never_executed_is_retry),
                cmocka_unit_test(test_failed_after_executing_is_review),
                cmocka_unit_test(test_status_null_is_retry),
                cmocka_unit_test(test_observed_pre_empty_counts_as_present),
                cmocka_unit_test(test_executing_without_observed_pre_is_not_row4),
                cmocka_unit_test(test_row5_current_pre_matches),
                cmocka_unit_test(test_evidence_escapes_and_appends),
                cmocka_unit_test(test_evidence_same_as_reference),
                cmocka_unit_test(test_kind_names),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
