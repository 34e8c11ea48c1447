/* SPDX-License-Identifier: MIT */
/* evidence: an index built from calls read elsewhere (cluster mode: the
 * database's rows) tells recovery exactly what the same calls in the local
 * idempotency store tell it. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kairos/evidence.h"
#include "kairos/idem.h"
#include "kairos/kbuf.h"

#define T0 1776686400123LL /* 2026-04-20T12:00:00.123Z */
#define MID "mnd_job_000000000001"

static int64_t fixed_clock(void *ctx)
{
        (void)ctx;
        return T0;
}

/* A call of MID's step in the store, finished or left processing. */
static void stored_call(struct idem_store *st, const char *mandate, const char *step,
                        uint32_t attempt, const char *key, bool finish)
{
        struct idem_step_owner o = { .attempt = attempt };
        snprintf(o.mandate, sizeof o.mandate, "%s", mandate);
        snprintf(o.step, sizeof o.step, "%s", step);
        struct idem_request rq = { .tool = "cmd", .key = key, .input_json = "[]", .input_len = 2,
                                   .owner = &o };
        struct idem_view v;
        uint64_t lsn;
        char full[IDEM_FULL_KEY_SIZE];
        assert_int_equal(idem_begin(st, &rq, &v, &lsn), IDEM_PROCEED);
        snprintf(full, sizeof full, "cmd:%s", key);
        if (finish)
                assert_int_equal(idem_complete(st, full, "0", 1, &lsn), 0);
}

static char *mandate_json(const struct evidence_index *ix)
{
        struct evidence_schedule es = { .effects = 1u << 2, .effects_via_kairosctl = true };
        struct evidence_mandate em;
        assert_int_equal(evidence_for_mandate(ix, MID, &es, &em), 0);
        struct kbuf b = KBUF_INIT;
        assert_int_equal(kbuf_printf(&b, "via=%d n=%zu", em.ev.effects_via_kairosctl, em.n), 0);
        for (size_t i = 0; i < em.n; i++)
                assert_int_equal(kbuf_printf(&b, "|%s open=%u fin=%u %s", em.steps[i].step_id,
                                             em.steps[i].idem_open, em.steps[i].idem_finished,
                                             em.steps[i].idem_json),
                                 0);
        evidence_mandate_release(&em);
        return b.data;
}

static void test_from_calls_equals_store(void **state)
{
        (void)state;
        struct idem_options opt = { .now_ms = fixed_clock };
        struct idem_store *st;
        assert_int_equal(idem_store_new(&opt, &st), 0);
        stored_call(st, MID, "act_001", 2, "sent", true);
        stored_call(st, MID, "act_001", 2, "half", false);
        stored_call(st, MID, "observe_001", 1, "look", true);
        stored_call(st, "mnd_other_00000000001", "act_001", 1, "elsewhere", false);
        struct evidence_index *built;
        assert_int_equal(evidence_index_build(st, &built), 0);
        idem_store_free(st);

        /* the same calls of MID, out of order, in buffers overwritten after */
        char k[3][16] = { "cmd:look", "cmd:half", "cmd:sent" };
        char step[3][16] = { "observe_001", "act_001", "act_001" };
        struct evidence_call calls[3] = {
                { k[0], "cmd", step[0], 1, IDEM_ST_COMPLETED, T0, T0, NULL, { 0 } },
                { k[1], "cmd", step[1], 2, IDEM_ST_PROCESSING, T0, 0, NULL, { 0 } },
                { k[2], "cmd", step[2], 2, IDEM_ST_COMPLETED, T0, T0, NULL, { 0 } },
        };
        struct evidence_index *ix;
        assert_int_equal(evidence_index_from_calls(MID, calls, 3, &ix), 0);
        memset(k, 'x', sizeof k);
        memset(step, 'y', sizeof step);
        assert_true(evidence_index_known(ix));
        assert_int_equal(evidence_index_size(ix), 3);
        const struct evidence_call *c;
        assert_int_equal(evidence_index_calls(ix, MID, &c), 3);
        assert_string_equal(c[0].step, "act_001");
        assert_string_equal(c[0].key, "cmd:half");   /* same step and start: by key */
        assert_string_equal(c[1].key, "cmd:sent");
        assert_string_equal(c[2].step, "observe_001");
        assert_int_equal(c[2].attempt, 1);
        assert_int_equal(evidence_index_calls(ix, "mnd_other_00000000001", &c), 0);

        char *a = mandate_json(built), *b = mandate_json(ix);
        assert_string_equal(a, b);
        /* and it says something: an open call of act_001, with its attempt */
        assert_non_null(strstr(b, "act_001 open=1 fin=1"));
        assert_non_null(strstr(b, "\"attempt\":2"));
        assert_non_null(strstr(b, "via=1"));
        free(a);
        free(b);
        evidence_index_free(built);
        evidence_index_free(ix);
}

static void test_from_no_calls_is_known(void **state)
{
        (void)state;
        struct evidence_index *ix;
        assert_int_equal(evidence_index_from_calls(MID, NULL, 0, &ix), 0);
        assert_true(evidence_index_known(ix));
        assert_int_equal(evidence_index_size(ix), 0);
        /* known and empty: no call can be open, unlike an unknown index */
        char *s = mandate_json(ix);
        assert_string_equal(s, "via=1 n=0");
        free(s);
        evidence_index_free(ix);
        assert_int_equal(evidence_index_unknown(&ix), 0);
        s = mandate_json(ix);
        assert_string_equal(s, "via=0 n=0");
        free(s);
        evidence_index_free(ix);
}

static void test_from_calls_bad_input(void **state)
{
        (void)state;
        struct evidence_index *ix = (void *)1;
        struct evidence_call bad = { "cmd:k", "cmd", NULL, 1, IDEM_ST_COMPLETED, T0, T0, NULL, { 0 } };
        assert_int_equal(evidence_index_from_calls(MID, &bad, 1, &ix), -EINVAL);
        assert_null(ix);
        assert_int_equal(evidence_index_from_calls(NULL, NULL, 0, &ix), -EINVAL);
        assert_int_equal(evidence_index_from_calls("", NULL, 0, &ix), -EINVAL);
        assert_int_equal(evidence_index_from_calls(MID, NULL, 1, &ix), -EINVAL);
        assert_int_equal(evidence_index_from_calls(MID, NULL, 0, NULL), -EINVAL);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_from_calls_equals_store),
                cmocka_unit_test(test_from_no_calls_is_known),
                cmocka_unit_test(test_from_calls_bad_input),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
