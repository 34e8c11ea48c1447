/* SPDX-License-Identifier: MIT */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kairos/fold.h"
#include "kairos/kbuf.h"
#include "kairos/stepdoc.h"
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

static void run_ok(struct w *w, const char *sid, const char *pid, const char *result)
{
        char key[128];
        snprintf(key, sizeof(key), "mnd_t/%s", sid);
        put(w, &(struct wal_record){ .op = WAL_OP_APPEND, .step_id = sid, .plan_id = pid,
                                     .idem_key = key });
        put(w, &(struct wal_record){ .op = WAL_OP_EXECUTING, .step_id = sid, .pre_hash = "pre" });
        put(w, &(struct wal_record){ .op = WAL_OP_COMPLETED, .step_id = sid, .post_hash = "post",
                                     .result_hash = "rh", .result_json = result });
}

static struct fold *two_cycles(void)
{
        struct w w = { .b = KBUF_INIT };
        put(&w, &(struct wal_record){ .op = WAL_OP_PLAN_COMMIT, .plan_id = "p1",
                                      .mandate_id = "mnd_t", .cycle = 1, .steps = C1,
                                      .nsteps = 5 });
        for (size_t i = 0; i < 5; i++)
                run_ok(&w, C1[i].step_id, "p1", i == 4 ? "{\"next\":\"again\"}" : "{\"v\":1}");
        put(&w, &(struct wal_record){ .op = WAL_OP_FINALIZE, .plan_id = "p1",
                                      .status = PLAN_SUCCEEDED });
        put(&w, &(struct wal_record){ .op = WAL_OP_PLAN_COMMIT, .plan_id = "p2",
                                      .mandate_id = "mnd_t", .cycle = 2, .steps = C2,
                                      .nsteps = 5 });
        run_ok(&w, "observe_002", "p2", "{\"seen\":[1,2]}");
        /* orient_002 pending: its handler (or probe) gets the document */
        put(&w, &(struct wal_record){ .op = WAL_OP_APPEND, .step_id = "orient_002", .plan_id = "p2",
                                      .idem_key = "mnd_t/orient_002" });
        struct fold *f = NULL;
        assert_int_equal(fold_buffer(w.b.data, w.b.len, &f), 0);
        assert_int_not_equal(f->status, FOLD_CORRUPT);
        assert_int_equal(f->nplans, 2);
        kbuf_free(&w.b);
        return f;
}

/* A step of the second cycle sees the earlier phases' results of its cycle
 * and the previous cycle's reflect; its identity and attempt are given. */
static void test_second_cycle(void **state)
{
        (void)state;
        struct fold *f = two_cycles();
        struct kbuf b = KBUF_INIT;
        struct stepdoc_input in = { .mandate_id = "mnd_t", .schedule = "s", .fired_at = "T",
                                    .max_cycles = 3, .attempt = 2,
                                    .idem_key = "mnd_t/orient_002" };
        assert_int_equal(stepdoc_build(f, &f->plans[1], 1, &in, &b), 0);
        assert_string_equal(b.data,
                            "{\"mandate\":{\"id\":\"mnd_t\",\"schedule\":\"s\",\"fired_at\":\"T\","
                            "\"max_cycles\":3},\"goal\":\"s\",\"plan\":{\"plan_id\":\"p2\","
                            "\"cycle\":2},\"step\":{\"step_id\":\"orient_002\",\"phase\":"
                            "\"orient\",\"attempt\":2,\"idem_key\":\"mnd_t/orient_002\"},"
                            "\"results\":{\"observe\":{\"seen\":[1,2]}},\"previous_reflect\":"
                            "{\"next\":\"again\"}}\n");
        kbuf_free(&b);
        fold_free(f);
}

/* The first cycle has no previous reflect; an unknown schedule and fired_at
 * are null, the goal is given; the buffer is emptied first. */
static void test_first_cycle_and_unknowns(void **state)
{
        (void)state;
        struct fold *f = two_cycles();
        struct kbuf b = KBUF_INIT;
        kbuf_puts(&b, "stale");
        struct stepdoc_input in = { .mandate_id = "mnd_t", .goal = "g", .attempt = 1 };
        assert_int_equal(stepdoc_build(f, &f->plans[0], 3, &in, &b), 0);
        assert_string_equal(b.data,
                            "{\"mandate\":{\"id\":\"mnd_t\",\"schedule\":null,\"fired_at\":null,"
                            "\"max_cycles\":0},\"goal\":\"g\",\"plan\":{\"plan_id\":\"p1\","
                            "\"cycle\":1},\"step\":{\"step_id\":\"act_001\",\"phase\":\"act\","
                            "\"attempt\":1,\"idem_key\":\"\"},\"results\":{\"observe\":{\"v\":1},"
                            "\"orient\":{\"v\":1},\"decide\":{\"v\":1}},\"previous_reflect\":"
                            "null}\n");
        kbuf_free(&b);
        fold_free(f);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_second_cycle),
                cmocka_unit_test(test_first_cycle_and_unknowns),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
