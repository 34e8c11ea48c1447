/* SPDX-License-Identifier: MIT */
/* carry_select: which steps a retry --from takes as completed; the
 * carried_from field of a completed record, written and folded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <errno.h>

#include "kairos/carry.h"
#include "kairos/fold.h"
#include "kairos/kbuf.h"
#include "kairos/wal.h"

#define T0 1776686400123LL

static const struct wal_step C1[] = {
        { "observe_001", "ooda.observe", "ph", "pre", "post" },
        { "orient_001", "ooda.orient", "ph", "pre", "post" },
        { "decide_001", "ooda.decide", "ph", "pre", "post" },
        { "act_001", "ooda.act", "ph", "pre", "post" },
        { "reflect_001", "ooda.reflect", "ph", "pre", "post" },
};
static const struct wal_step C2[] = {
        { "observe_002", "ooda.observe", "ph", "pre", "post" },
        { "orient_002", "ooda.orient", "ph", "pre", "post" },
        { "decide_002", "ooda.decide", "ph", "pre", "post" },
        { "act_002", "ooda.act", "ph", "pre", "post" },
        { "reflect_002", "ooda.reflect", "ph", "pre", "post" },
};

struct w {
        struct kbuf b;
        int64_t ts;
};

static void put(struct w *w, const struct wal_record *r)
{
        int ret = wal_encode(r, T0 + w->ts++, &w->b);
        if (ret < 0)
                fail_msg("wal_encode: %d %s", ret, wal_encode_error());
}

static void run(struct w *w, const char *sid, const char *pid, const char *result)
{
        put(w, &(struct wal_record){ .op = WAL_OP_APPEND, .step_id = sid, .plan_id = pid,
                                     .idem_key = "k" });
        put(w, &(struct wal_record){ .op = WAL_OP_EXECUTING, .step_id = sid, .pre_hash = "pre" });
        if (result)
                put(w, &(struct wal_record){ .op = WAL_OP_COMPLETED, .step_id = sid,
                                             .post_hash = "post", .result_hash = "rh",
                                             .result_json = result });
        else
                put(w, &(struct wal_record){ .op = WAL_OP_FAILED, .step_id = sid,
                                             .error_class = "exit", .error_msg = "1" });
}

/* cycle 1 done, cycle 2: observe and orient completed, decide failed */
static struct fold *mandate(void)
{
        struct w w = { .b = KBUF_INIT };
        put(&w, &(struct wal_record){ .op = WAL_OP_MANDATE, .mandate_id = "mnd_t",
                                      .schedule = "s", .fired_at = "T" });
        put(&w, &(struct wal_record){ .op = WAL_OP_PLAN_COMMIT, .plan_id = "p1",
                                      .mandate_id = "mnd_t", .cycle = 1, .steps = C1,
                                      .nsteps = 5 });
        for (size_t i = 0; i < 5; i++)
                run(&w, C1[i].step_id, "p1", "{\"c\":1}");
        put(&w, &(struct wal_record){ .op = WAL_OP_FINALIZE, .plan_id = "p1",
                                      .status = PLAN_SUCCEEDED });
        put(&w, &(struct wal_record){ .op = WAL_OP_PLAN_COMMIT, .plan_id = "p2",
                                      .mandate_id = "mnd_t", .cycle = 2, .steps = C2,
                                      .nsteps = 5 });
        run(&w, "observe_002", "p2", "{\"seen\":2}");
        run(&w, "orient_002", "p2", "[1,2]");
        run(&w, "decide_002", "p2", NULL);
        struct fold *f = NULL;
        assert_int_equal(fold_buffer(w.b.data, w.b.len, &f), 0);
        assert_int_equal(f->status, FOLD_CLEAN);
        kbuf_free(&w.b);
        return f;
}

/* A phase name is its step in the last cycle; the steps before it carry
 * their results. */
static void test_phase_name(void **state)
{
        (void)state;
        struct fold *f = mandate();
        struct carry c;
        char msg[256] = "";
        assert_int_equal(carry_select(f, "decide", &c, msg, sizeof msg), 0);
        assert_int_equal(c.cycle, 2);
        assert_string_equal(c.from_step, "decide_002");
        assert_int_equal(c.nsteps, 2);
        assert_string_equal(c.steps[0].step_id, "observe_002");
        assert_string_equal(c.steps[0].result_json, "{\"seen\":2}");
        assert_string_equal(c.steps[0].result_hash, "rh");
        assert_string_equal(c.steps[0].post_hash, "post");
        assert_string_equal(c.steps[1].step_id, "orient_002");
        assert_string_equal(c.steps[1].result_json, "[1,2]");
        /* the cycle before, as it ended, with its completed steps */
        assert_int_equal(c.prev_status, PLAN_SUCCEEDED);
        assert_null(c.prev_reason);
        assert_int_equal(c.prev_nsteps, 5);
        assert_string_equal(c.prev_steps[4].step_id, "reflect_001");
        assert_string_equal(c.prev_steps[4].result_json, "{\"c\":1}");
        /* from the first phase: nothing carried */
        assert_int_equal(carry_select(f, "observe", &c, msg, sizeof msg), 0);
        assert_int_equal(c.nsteps, 0);
        assert_string_equal(c.from_step, "observe_002");
        fold_free(f);
}

/* A step id of an earlier cycle: that cycle's steps before it. */
static void test_step_id(void **state)
{
        (void)state;
        struct fold *f = mandate();
        struct carry c;
        assert_int_equal(carry_select(f, "reflect_001", &c, NULL, 0), 0);
        assert_int_equal(c.cycle, 1);
        assert_int_equal(c.nsteps, 4);
        assert_string_equal(c.steps[3].step_id, "act_001");
        assert_string_equal(c.steps[3].result_json, "{\"c\":1}");
        assert_int_equal(c.prev_status, PLAN_OPEN); /* cycle 1: none before */
        assert_int_equal(c.prev_nsteps, 0);
        fold_free(f);
}

/* Not in the mandate, or after a step that did not complete: refused,
 * naming args.from. */
static void test_refused(void **state)
{
        (void)state;
        struct fold *f = mandate();
        struct carry c;
        char msg[256] = "";
        assert_int_equal(carry_select(f, "act_009", &c, msg, sizeof msg), -EINVAL);
        assert_non_null(strstr(msg, "args.from: mnd_t has no step 'act_009'"));
        assert_int_equal(carry_select(f, "nonsense", &c, msg, sizeof msg), -EINVAL);
        assert_non_null(strstr(msg, "args.from"));
        assert_int_equal(carry_select(f, "act", &c, msg, sizeof msg), -EINVAL);
        assert_non_null(strstr(msg, "args.from: step decide_002 of mnd_t before act_002 did not "
                                    "complete (failed)"));
        assert_int_equal(carry_select(f, "reflect_002", &c, msg, sizeof msg), -EINVAL);
        fold_free(f);
}

/* A completed record's carried_from is written and folded; a later status
 * record (a reset) forgets it. */
static void test_carried_from_record(void **state)
{
        (void)state;
        struct w w = { .b = KBUF_INIT };
        put(&w, &(struct wal_record){ .op = WAL_OP_PLAN_COMMIT, .plan_id = "p1",
                                      .mandate_id = "mnd_r", .cycle = 1, .steps = C1,
                                      .nsteps = 5 });
        put(&w, &(struct wal_record){ .op = WAL_OP_APPEND, .step_id = "observe_001",
                                      .plan_id = "p1", .idem_key = "k" });
        put(&w, &(struct wal_record){ .op = WAL_OP_COMPLETED, .step_id = "observe_001",
                                      .post_hash = "post", .result_hash = "rh",
                                      .result_json = "{\"a\":1}",
                                      .carried_from = "mnd_t/observe_001" });
        assert_non_null(strstr(w.b.data, "\"carried_from\":\"mnd_t/observe_001\""));
        struct fold *f = NULL;
        assert_int_equal(fold_buffer(w.b.data, w.b.len, &f), 0);
        assert_int_equal(f->status, FOLD_CLEAN);
        const struct fold_step *s = fold_find_step(f, "observe_001");
        assert_int_equal(s->state, STEP_COMPLETED);
        assert_int_equal(s->executions, 0);
        assert_string_equal(s->carried_from, "mnd_t/observe_001");
        assert_string_equal(s->result_json, "{\"a\":1}");
        assert_null(fold_find_step(f, "orient_001")->carried_from);
        fold_free(f);
        put(&w, &(struct wal_record){ .op = WAL_OP_RESET, .step_id = "observe_001" });
        assert_int_equal(fold_buffer(w.b.data, w.b.len, &f), 0);
        assert_int_equal(fold_find_step(f, "observe_001")->state, STEP_PENDING);
        assert_null(fold_find_step(f, "observe_001")->carried_from);
        fold_free(f);
        kbuf_free(&w.b);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_phase_name),
                cmocka_unit_test(test_step_id),
                cmocka_unit_test(test_refused),
                cmocka_unit_test(test_carried_from_record),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
