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

#include "kairos/canon.h"
#include "kairos/kbuf.h"
#include "kairos/kjson.h"
#include "kairos/planner.h"

#define NAME "daily"
#define FIRED "2026-04-20T12:00:00Z"

/* Expected values computed with the original's algorithm (seed 004) in Ruby. */
static const char *const cycle1[PLANNER_PHASES][5] = {
        { "observe_001", "ooda.observe",
          "sha256-a174849d204ae3424d768eb12b119567a27d6ad65783ba37654d6485660a43aa",
          "sha256-3e02fda9bdfd78947f64676ba85058fde6c1b94ba361087a722618d887087926",
          "sha256-a601de22e16f4d5247ece2d0c75413357fc70345b3245c9b3fe9b739288d44d7" },
        { "orient_001", "ooda.orient",
          "sha256-d43a75eb5a5515fc48e69cfda0dd56056fef79041ce4175eb9193aeb0e4cac21",
          "sha256-9b0b7d361b25d1d9fbf08571e8707b1c0c606749f81242f2f3071365c08a38b4",
          "sha256-8226e2a10231cc5a70835ae1d57bb23d4c999791884670dc0bfa5b9b703e49dc" },
        { "decide_001", "ooda.decide",
          "sha256-6bd2c6a00b775f04c48be42869b6e02270deb9b0ed5ba0037e91019e9c7f222e",
          "sha256-1d9cb9052d325a41465dcd59d7e811d0a9603330bf52b8ad167731e2116c888c",
          "sha256-4c26ad6a6467264b277fdac4941317d6e74209b9b7909da393c2410860a691b1" },
        { "act_001", "ooda.act",
          "sha256-51467f5361d8293810d97855e1bd516261d35c8bf54eeb61d4bde379301f6d17",
          "sha256-35ab21c6ec0043c469c6f692acedf86c756ab488a2ec79629851dc3789a81f25",
          "sha256-d38bb9087a29f7cc6219b8987c0dab18270bef425e0442b1afca0a297dc2b98f" },
        { "reflect_001", "ooda.reflect",
          "sha256-4b5db41210eef1c8273bb3044e13fef92ec3cca3169539619ebb4455faffba0c",
          "sha256-4e11503dcbdab3cdcdca2b5d8c4bd968f2c30576aa4c9515b79395308393d03a",
          "sha256-8a83cde0c8a07cf116086be82a04f9c25aa2cf15b7a6eb9c306441a389042f36" },
};

static void test_plan_id_example(void **state)
{
        (void)state;
        char id[PLANNER_ID_MAX];
        assert_int_equal(planner_plan_id(NAME, FIRED, 1, id), 0);
        assert_string_equal(id, "plan_ae607245ac43");
        assert_int_equal(planner_mandate_id(NAME, FIRED, id), 0);
        assert_string_equal(id, "mnd_plan_ae607245ac43");
        assert_int_equal(strlen(id) + 1, 22);
        assert_true(strlen(id) < PLANNER_ID_MAX);
}

static void test_plan_id_cycles(void **state)
{
        (void)state;
        char c1[PLANNER_ID_MAX], c2[PLANNER_ID_MAX], c3[PLANNER_ID_MAX], m[PLANNER_ID_MAX];
        assert_int_equal(planner_plan_id(NAME, FIRED, 1, c1), 0);
        assert_int_equal(planner_plan_id(NAME, FIRED, 2, c2), 0);
        assert_int_equal(planner_plan_id(NAME, FIRED, 3, c3), 0);
        assert_string_equal(c2, "plan_879532634ddd");       /* sha256("daily|...|2") */
        assert_string_not_equal(c1, c2);
        assert_string_not_equal(c2, c3);
        assert_string_not_equal(c1, c3);
        /* the mandate id is the cycle-1 plan id whatever the cycle */
        assert_int_equal(planner_mandate_id(NAME, FIRED, m), 0);
        assert_string_equal(m + 4, c1);
        /* the id hashes exactly NAME|FIRED_AT (and |c) */
        char h[CANON_HASH_STRLEN];
        canon_hash_bytes(NAME "|" FIRED, strlen(NAME "|" FIRED), h);
        assert_memory_equal(c1 + 5, h + 7, 12);
        canon_hash_bytes(NAME "|" FIRED "|3", strlen(NAME "|" FIRED "|3"), h);
        assert_memory_equal(c3 + 5, h + 7, 12);
        assert_int_equal(planner_plan_id(NAME, FIRED, 999, c3), 0);
        /* other name or other time: other id */
        assert_int_equal(planner_plan_id("daily2", FIRED, 1, c2), 0);
        assert_string_not_equal(c1, c2);
        assert_int_equal(planner_plan_id(NAME, "2026-04-20T12:00:01Z", 1, c2), 0);
        assert_string_not_equal(c1, c2);
}

/* Retry N of a tick: ids over NAME|FIRED_AT|retry:N (and |c for c >= 2). */
static void test_retry_ids(void **state)
{
        (void)state;
        char id[PLANNER_ID_MAX], first[PLANNER_ID_MAX], m[PLANNER_ID_MAX], h[CANON_HASH_STRLEN];
        struct planner_plan p;

        /* retry 0 is the tick's first mandate */
        assert_int_equal(planner_retry_mandate_id(NAME, FIRED, 0, id), 0);
        assert_string_equal(id, "mnd_plan_ae607245ac43");
        assert_int_equal(planner_plan_id(NAME, FIRED, 2, first), 0);
        assert_int_equal(planner_retry_plan_id(NAME, FIRED, 0, 2, id), 0);
        assert_string_equal(id, first);

        assert_int_equal(planner_retry_plan_id(NAME, FIRED, 1, 1, id), 0);
        canon_hash_bytes(NAME "|" FIRED "|retry:1", strlen(NAME "|" FIRED "|retry:1"), h);
        assert_memory_equal(id + 5, h + 7, 12);
        assert_int_equal(planner_retry_mandate_id(NAME, FIRED, 1, m), 0);
        assert_string_equal(m + 4, id);
        assert_string_not_equal(m, "mnd_plan_ae607245ac43");
        assert_int_equal(planner_retry_plan_id(NAME, FIRED, 1, 3, id), 0);
        canon_hash_bytes(NAME "|" FIRED "|retry:1|3", strlen(NAME "|" FIRED "|retry:1|3"), h);
        assert_memory_equal(id + 5, h + 7, 12);
        assert_int_equal(planner_retry_mandate_id(NAME, FIRED, 2, id), 0);
        assert_string_not_equal(id, m);

        /* the plan of a retry carries its own ids in every cycle */
        assert_int_equal(planner_build_retry(NAME, FIRED, 1, 2, &p), 0);
        assert_string_equal(p.mandate_id, m);
        assert_int_equal(planner_retry_plan_id(NAME, FIRED, 1, 2, id), 0);
        assert_string_equal(p.plan_id, id);
        assert_string_equal(p.steps[0].step_id, "observe_002");

        assert_int_equal(planner_retry_plan_id(NAME, FIRED, -1, 1, id), -EINVAL);
        assert_int_equal(planner_retry_plan_id(NAME, FIRED, PLANNER_MAX_RETRY + 1, 1, id),
                         -EINVAL);
        assert_int_equal(planner_build_retry(NAME, FIRED, PLANNER_MAX_RETRY + 1, 1, &p), -EINVAL);
        assert_int_equal(planner_retry_mandate_id(NAME, FIRED, PLANNER_MAX_RETRY, id), 0);
}

static void test_bad_arguments(void **state)
{
        (void)state;
        char id[PLANNER_ID_MAX];
        struct planner_plan p;
        static const int bad_cycles[] = { 0, -1, -1000, 1000, 1 << 30 };
        for (size_t i = 0; i < sizeof(bad_cycles) / sizeof(bad_cycles[0]); i++) {
                assert_int_equal(planner_plan_id(NAME, FIRED, bad_cycles[i], id), -EINVAL);
                assert_int_equal(planner_build(NAME, FIRED, bad_cycles[i], &p), -EINVAL);
        }
        assert_int_equal(planner_plan_id("", FIRED, 1, id), -EINVAL);
        assert_int_equal(planner_plan_id(NAME, "", 1, id), -EINVAL);
        assert_int_equal(planner_plan_id(NULL, FIRED, 1, id), -EINVAL);
        assert_int_equal(planner_plan_id(NAME, NULL, 1, id), -EINVAL);
        assert_int_equal(planner_mandate_id("", FIRED, id), -EINVAL);
        assert_int_equal(planner_mandate_id(NAME, NULL, id), -EINVAL);
        assert_int_equal(planner_build("", FIRED, 1, &p), -EINVAL);
        assert_int_equal(planner_build(NAME, "", 1, &p), -EINVAL);
        assert_int_equal(planner_build(NULL, FIRED, 1, &p), -EINVAL);
        assert_int_equal(planner_build(NAME, FIRED, 1, NULL), -EINVAL);
        assert_int_equal(planner_build("bad\xff", FIRED, 1, &p), -EINVAL);
        assert_int_equal(planner_build(NAME, FIRED, 999, &p), 0);
        assert_string_equal(p.steps[4].step_id, "reflect_999");
}

static void test_build_cycle1(void **state)
{
        (void)state;
        struct planner_plan p;
        assert_int_equal(planner_build(NAME, FIRED, 1, &p), 0);
        assert_string_equal(p.plan_id, "plan_ae607245ac43");
        assert_string_equal(p.mandate_id, "mnd_plan_ae607245ac43");
        assert_int_equal(p.cycle, 1);
        for (int i = 0; i < PLANNER_PHASES; i++) {
                assert_string_equal(p.steps[i].step_id, cycle1[i][0]);
                assert_string_equal(p.steps[i].tool, cycle1[i][1]);
                assert_string_equal(p.steps[i].params_hash, cycle1[i][2]);
                assert_string_equal(p.steps[i].pre_hash, cycle1[i][3]);
                assert_string_equal(p.steps[i].expected_post_hash, cycle1[i][4]);
        }
        assert_string_equal(p.plan_hash,
                            "sha256-03863dd2ea524f315d9e586fc715bb28f5e6aa9359b35311ac12a94e6e1d2d0f");
}

/* The observe pre_hash of cycle 1 is the docs/design.md §4 golden vector. */
static void test_pre_hash_is_golden(void **state)
{
        (void)state;
        struct planner_plan p;
        assert_int_equal(planner_build(NAME, FIRED, 1, &p), 0);
        assert_string_equal(p.steps[PHASE_OBSERVE].pre_hash,
                            "sha256-3e02fda9bdfd78947f64676ba85058fde6c1b94ba361087a722618d887087926");
        /* markers do not depend on the name or the time */
        struct planner_plan q;
        assert_int_equal(planner_build("other", "2030-01-01T00:00:00Z", 1, &q), 0);
        for (int i = 0; i < PLANNER_PHASES; i++) {
                assert_string_equal(p.steps[i].pre_hash, q.steps[i].pre_hash);
                assert_string_equal(p.steps[i].expected_post_hash, q.steps[i].expected_post_hash);
                assert_string_not_equal(p.steps[i].params_hash, q.steps[i].params_hash);
                assert_string_not_equal(p.steps[i].pre_hash, p.steps[i].expected_post_hash);
        }
        assert_string_not_equal(p.plan_hash, q.plan_hash);
}

static void test_build_cycle2(void **state)
{
        (void)state;
        struct planner_plan p1, p2;
        assert_int_equal(planner_build(NAME, FIRED, 1, &p1), 0);
        assert_int_equal(planner_build(NAME, FIRED, 2, &p2), 0);
        assert_string_equal(p2.plan_id, "plan_879532634ddd");
        assert_string_equal(p2.mandate_id, p1.mandate_id);
        assert_int_equal(p2.cycle, 2);
        assert_string_equal(p2.steps[PHASE_ACT].step_id, "act_002");
        assert_string_equal(p2.steps[PHASE_ACT].params_hash,
                            "sha256-87abe0efbafc2300a23b60c4dc3c211a79911ebc57d50e3509bc4aeb81b1ebd9");
        assert_string_equal(p2.steps[PHASE_OBSERVE].pre_hash,
                            "sha256-44fb1733912f27e7dfe8742a5c36059adf5264a7ca153f9a172fd9d8020db4ee");
        assert_string_equal(p2.steps[PHASE_REFLECT].expected_post_hash,
                            "sha256-2979292d67efa3cdabdcdfe1de6387fc9af07cbef25c89383cf37cea384a9de6");
        assert_string_equal(p2.plan_hash,
                            "sha256-f559361f05e68e314889ccc5c79d4cad0a26d448a56e1870501521b6c008c4f2");
        /* deterministic */
        struct planner_plan again;
        assert_int_equal(planner_build(NAME, FIRED, 2, &again), 0);
        assert_memory_equal(&again, &p2, sizeof(p2));
}

static void test_params_hash_contents(void **state)
{
        (void)state;
        struct planner_plan p;
        assert_int_equal(planner_build("nightly-report_2", FIRED, 3, &p), 0);
        for (int i = 0; i < PLANNER_PHASES; i++) {
                struct kbuf b = KBUF_INIT;
                assert_int_equal(kbuf_printf(&b,
                        "{\"mandate_name\":\"nightly-report_2\",\"order\":%d,\"cycle\":3,"
                        "\"plan_id\":\"%s\",\"phase\":\"%s\"}", i, p.plan_id,
                        planner_phase_name((enum planner_phase)i)), 0);
                char h[CANON_HASH_STRLEN];
                assert_int_equal(canon_hash_json(b.data, b.len, h, NULL), 0);
                assert_string_equal(p.steps[i].params_hash, h);
                kbuf_reset(&b);
                assert_int_equal(kbuf_printf(&b, "{\"state\":\"post\",\"cycle\":3,\"phase\":\"%s\"}",
                                             planner_phase_name((enum planner_phase)i)), 0);
                assert_int_equal(canon_hash_json(b.data, b.len, h, NULL), 0);
                assert_string_equal(p.steps[i].expected_post_hash, h);
                kbuf_free(&b);
        }
}

static void test_steps_json(void **state)
{
        (void)state;
        struct planner_plan p;
        struct kbuf b = KBUF_INIT;
        assert_int_equal(planner_build(NAME, FIRED, 1, &p), 0);
        assert_int_equal(kbuf_puts(&b, ">"), 0);
        assert_int_equal(planner_steps_json(&p, &b), 0);
        const char *json = b.data + 1;
        size_t len = b.len - 1;

        /* its hash is plan_hash, and it is already canonical */
        char h[CANON_HASH_STRLEN];
        canon_hash_bytes(json, len, h);
        assert_string_equal(h, p.plan_hash);
        struct kbuf c = KBUF_INIT;
        assert_int_equal(canon_json(json, len, &c, NULL), 0);
        assert_int_equal(c.len, len);
        assert_memory_equal(c.data, json, len);
        kbuf_free(&c);

        /* five objects with exactly the five keys */
        struct kjson_arena *a = kjson_arena_new();
        struct kjson *v;
        assert_int_equal(kjson_parse(a, json, len, &v, NULL), 0);
        assert_int_equal(v->type, KJSON_ARRAY);
        assert_int_equal(v->u.arr.n, PLANNER_PHASES);
        for (int i = 0; i < PLANNER_PHASES; i++) {
                const struct kjson *s = v->u.arr.items[i];
                assert_int_equal(s->u.obj.n, 5);
                assert_string_equal(kjson_get_str(s, "step_id"), cycle1[i][0]);
                assert_string_equal(kjson_get_str(s, "tool"), cycle1[i][1]);
                assert_string_equal(kjson_get_str(s, "params_hash"), cycle1[i][2]);
                assert_string_equal(kjson_get_str(s, "pre_hash"), cycle1[i][3]);
                assert_string_equal(kjson_get_str(s, "expected_post_hash"), cycle1[i][4]);
        }
        kjson_arena_free(a);
        kbuf_free(&b);
}

static void test_phase_names(void **state)
{
        (void)state;
        assert_string_equal(planner_phase_name(PHASE_OBSERVE), "observe");
        assert_string_equal(planner_phase_name(PHASE_ORIENT), "orient");
        assert_string_equal(planner_phase_name(PHASE_DECIDE), "decide");
        assert_string_equal(planner_phase_name(PHASE_ACT), "act");
        assert_string_equal(planner_phase_name(PHASE_REFLECT), "reflect");
        assert_null(planner_phase_name((enum planner_phase)5));
        assert_null(planner_phase_name((enum planner_phase)-1));
}

static void test_parse_step_id(void **state)
{
        (void)state;
        enum planner_phase ph;
        int cycle;

        /* round trip over every phase and many cycles */
        for (int c = 1; c <= PLANNER_MAX_CYCLE; c += 7) {
                struct planner_plan p;
                assert_int_equal(planner_build(NAME, FIRED, c, &p), 0);
                for (int i = 0; i < PLANNER_PHASES; i++) {
                        ph = PHASE_REFLECT;
                        cycle = -1;
                        assert_int_equal(planner_parse_step_id(p.steps[i].step_id, &ph, &cycle), 0);
                        assert_int_equal(ph, i);
                        assert_int_equal(cycle, c);
                }
        }
        assert_int_equal(planner_parse_step_id("act_002", &ph, &cycle), 0);
        assert_int_equal(ph, PHASE_ACT);
        assert_int_equal(cycle, 2);
        assert_int_equal(planner_parse_step_id("reflect_999", &ph, &cycle), 0);
        assert_int_equal(ph, PHASE_REFLECT);
        assert_int_equal(cycle, 999);
        assert_int_equal(planner_parse_step_id("observe_001", NULL, NULL), 0);

        static const char *const bad[] = {
                "", "act", "act_", "act_0", "act_02", "act_0002", "act_000", "act_1000",
                "act_00a", "act_-01", "act_+01", "act__002", "Act_002", "acts_002", "ac_002",
                "_002", "observe-001", "observe_001 ", " observe_001", "observe_001\n",
                "s1", "plan_ae607245ac43", "observe_orient_001", "act_ 02",
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                ph = PHASE_OBSERVE;
                cycle = 42;
                if (planner_parse_step_id(bad[i], &ph, &cycle) != -EINVAL)
                        fail_msg("accepted '%s'", bad[i]);
                /* outputs untouched on failure */
                assert_int_equal(ph, PHASE_OBSERVE);
                assert_int_equal(cycle, 42);
        }
        assert_int_equal(planner_parse_step_id(NULL, &ph, &cycle), -EINVAL);
}

static void test_identifiers(void **state)
{
        (void)state;
        assert_true(planner_valid_name("daily"));
        assert_true(planner_valid_name("a-b_C9"));
        char long_name[66];
        memset(long_name, 'x', 65);
        long_name[65] = '\0';
        assert_false(planner_valid_name(long_name));
        long_name[64] = '\0';
        assert_true(planner_valid_name(long_name));
        assert_false(planner_valid_name(""));
        assert_false(planner_valid_name("../etc"));
        assert_false(planner_valid_name("a b"));
        assert_false(planner_valid_name("a/b"));

        int64_t t = 0;
        assert_int_equal(planner_parse_fired_at("2026-04-20T12:00:00Z", &t), 0);
        assert_int_equal(t, 1776686400);
        assert_int_equal(planner_parse_fired_at("1970-01-01T00:00:00Z", &t), 0);
        assert_int_equal(t, 0);
        assert_int_equal(planner_parse_fired_at("2028-02-29T23:59:59Z", &t), 0);
        static const char *const bad[] = {
                "2026-02-29T00:00:00Z", "2026-04-20 12:00:00Z", "2026-04-20T12:00:00",
                "2026-04-20T24:00:00Z", "2026-13-01T00:00:00Z", "1969-12-31T23:59:59Z",
                "2026-04-20T12:00:00.000Z", "", "2026-4-20T12:00:00Z", "2100-02-29T00:00:00Z",
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
                assert_int_equal(planner_parse_fired_at(bad[i], &t), -EINVAL);

        char buf[PLANNER_FIRED_AT_LEN];
        assert_int_equal(planner_format_fired_at(1776686400, buf), 0);
        assert_string_equal(buf, "2026-04-20T12:00:00Z");
        assert_int_equal(planner_format_fired_at(-1, buf), -EINVAL);
        /* round trip */
        for (int64_t x = 0; x < 4102444800; x += 7777777) {
                assert_int_equal(planner_format_fired_at(x, buf), 0);
                assert_int_equal(planner_parse_fired_at(buf, &t), 0);
                assert_int_equal(t, x);
        }
}

/* The retry rule is about the tick: any unfinished mandate of it refuses,
 * any done one needs a reason. */
static void test_retry_check(void **state)
{
        (void)state;
        enum planner_retry_verdict v;
        size_t w;
        const struct planner_tick_mandate first_done[] = {
                { "mnd_a", 0, PLANNER_TICK_DONE },
        };
        assert_int_equal(planner_retry_check(first_done, 1, false, &v, &w), 0);
        assert_int_equal(v, PLANNER_RETRY_NEEDS_REASON);
        assert_int_equal(w, 0);
        assert_int_equal(planner_retry_check(first_done, 1, true, &v, &w), 0);
        assert_int_equal(v, PLANNER_RETRY_ALLOWED);
        assert_int_equal(w, 1);
        /* the operator names the failed first mandate, retry 1 ended done:
         * the tick's work happened, a reason is needed */
        const struct planner_tick_mandate retry_done[] = {
                { "mnd_a", 0, PLANNER_TICK_ENDED },
                { "mnd_b", 1, PLANNER_TICK_DONE },
                { "mnd_c", 2, PLANNER_TICK_ENDED },
        };
        assert_int_equal(planner_retry_check(retry_done, 3, false, &v, &w), 0);
        assert_int_equal(v, PLANNER_RETRY_NEEDS_REASON);
        assert_int_equal(w, 1);
        assert_int_equal(planner_retry_check(retry_done, 3, true, &v, &w), 0);
        assert_int_equal(v, PLANNER_RETRY_ALLOWED);
        /* an unfinished retry refuses, with or without a reason, and is named
         * before any done one (the latest when several are) */
        const struct planner_tick_mandate running[] = {
                { "mnd_a", 0, PLANNER_TICK_DONE },
                { "mnd_c", 2, PLANNER_TICK_UNFINISHED },
                { "mnd_b", 1, PLANNER_TICK_UNFINISHED },
                { "mnd_d", 3, PLANNER_TICK_ENDED },
        };
        for (int reason = 0; reason < 2; reason++) {
                assert_int_equal(planner_retry_check(running, 4, reason, &v, &w), 0);
                assert_int_equal(v, PLANNER_RETRY_UNFINISHED);
                assert_int_equal(w, 1);
        }
        /* failed and cancelled ones allow a retry without a reason */
        const struct planner_tick_mandate failed[] = {
                { "mnd_a", 0, PLANNER_TICK_ENDED },
                { "mnd_b", 1, PLANNER_TICK_ENDED },
        };
        assert_int_equal(planner_retry_check(failed, 2, false, &v, &w), 0);
        assert_int_equal(v, PLANNER_RETRY_ALLOWED);
        assert_int_equal(w, 2);
        assert_int_equal(planner_retry_check(NULL, 0, false, &v, &w), 0);
        assert_int_equal(v, PLANNER_RETRY_ALLOWED);
        /* bad arguments */
        assert_int_equal(planner_retry_check(NULL, 1, false, &v, &w), -EINVAL);
        assert_int_equal(planner_retry_check(failed, 2, false, NULL, &w), -EINVAL);
        const struct planner_tick_mandate bad[] = { { "mnd_a", 0, (enum planner_tick_state)7 } };
        assert_int_equal(planner_retry_check(bad, 1, false, &v, &w), -EINVAL);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_plan_id_example),
                cmocka_unit_test(test_plan_id_cycles),
                cmocka_unit_test(test_retry_ids),
                cmocka_unit_test(test_retry_check),
                cmocka_unit_test(test_bad_arguments),
                cmocka_unit_test(test_build_cycle1),
                cmocka_unit_test(test_pre_hash_is_golden),
                cmocka_unit_test(test_build_cycle2),
                cmocka_unit_test(test_params_hash_contents),
                cmocka_unit_test(test_steps_json),
                cmocka_unit_test(test_phase_names),
                cmocka_unit_test(test_parse_step_id),
                cmocka_unit_test(test_identifiers),
        };
        if (canon_init() < 0)
                return 1;
        return cmocka_run_group_tests(tests, NULL, NULL);
}
