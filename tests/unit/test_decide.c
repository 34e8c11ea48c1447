/* SPDX-License-Identifier: MIT */
/* decide: every row of the live rule and of the startup rule, plus the
 * incremental fold (fold_feed) the daemon drives it with. */
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
#include "kairos/decide.h"
#include "kairos/evidence.h"
#include "kairos/idem.h"
#include "kairos/fold.h"
#include "kairos/kbuf.h"
#include "kairos/planner.h"
#include "kairos/wal.h"

#define T0 1776686400123LL
#define SCHED "job"
#define AT "2026-04-20T12:00:00Z"

/* A mandate's WAL in memory, folded incrementally as the daemon does. */
struct sim {
        struct kbuf b;     /* the file */
        struct fold *f;
        int64_t ts;
        char mid[PLANNER_ID_MAX];
        struct decide_input in;
};

static void sim_feed(struct sim *s)
{
        size_t used;
        int r = fold_feed(s->f, s->b.data + s->f->good_end, s->b.len - s->f->good_end, &used);
        assert_int_equal(r, 0);
        assert_int_equal(s->f->good_end, s->b.len);
}

static void put(struct sim *s, const struct wal_record *r)
{
        int ret = wal_encode(r, T0 + s->ts++, &s->b);
        if (ret < 0)
                fail_msg("wal_encode: %d %s", ret, wal_encode_error());
        sim_feed(s);
}

static void put_raw(struct sim *s, const char *line)
{
        assert_int_equal(kbuf_puts(&s->b, line), 0);
        sim_feed(s);
}

static void sim_init(struct sim *s, unsigned max_cycles, bool mandate_record)
{
        memset(s, 0, sizeof(*s));
        assert_int_equal(canon_init(), 0);
        assert_int_equal(fold_new(&s->f), 0);
        assert_int_equal(planner_mandate_id(SCHED, AT, s->mid), 0);
        s->in = (struct decide_input){ .mandate_id = s->mid, .schedule = SCHED, .fired_at = AT,
                                       .schedule_known = true, .max_cycles = max_cycles };
        for (int i = 0; i < PLANNER_PHASES; i++)
                s->in.has_command[i] = true;
        if (mandate_record) {
                struct wal_record r = { .op = WAL_OP_MANDATE, .mandate_id = s->mid,
                                        .schedule = SCHED, .fired_at = AT };
                put(s, &r);
        }
}

static void sim_free(struct sim *s)
{
        fold_free(s->f);
        kbuf_free(&s->b);
}

static void decide(struct sim *s, struct decide_next *n)
{
        assert_int_equal(decide_next(s->f, &s->in, n), 0);
}

/* Decide and append the records. */
static enum decide_kind step(struct sim *s, struct decide_next *n)
{
        decide(s, n);
        for (size_t i = 0; i < n->nrecords; i++)
                put(s, &n->records[i]);
        return n->kind;
}

/* Decide/append while the decision says again; the final kind. */
static enum decide_kind settle(struct sim *s, struct decide_next *n)
{
        for (int i = 0; i < 64; i++)
                if (step(s, n) , !n->again)
                        return n->kind;
        fail_msg("no settled decision");
        return DECIDE_NOTHING;
}

/* The handler of the step just started: completed with result. */
static void complete(struct sim *s, const char *sid, const char *result)
{
        char h[CANON_HASH_STRLEN];
        assert_int_equal(canon_hash_json(result, strlen(result), h, NULL), 0);
        struct wal_record r = { .op = WAL_OP_COMPLETED, .step_id = sid, .post_hash = "p",
                                .result_hash = h, .result_json = result };
        put(s, &r);
}

static void fail_step(struct sim *s, const char *sid)
{
        struct wal_record r = { .op = WAL_OP_FAILED, .step_id = sid, .error_class = "exit_status",
                                .error_msg = "exit status 1" };
        put(s, &r);
}

/* Start a cycle and run its steps up to (not including) phase `upto`. */
static void run_until(struct sim *s, int upto, const char *result)
{
        struct decide_next n;
        for (int i = 0; i < upto; i++) {
                assert_int_equal(settle(s, &n), DECIDE_RUN_STEP);
                assert_int_equal(n.phase, i);
                complete(s, n.step_id, result);
        }
}

/* ---- the live rule ---- */

static void test_first_cycle(void **state)
{
        (void)state;
        struct sim s;
        struct decide_next n;
        struct planner_plan p;
        sim_init(&s, 1, true);
        assert_int_equal(step(&s, &n), DECIDE_START_CYCLE);
        assert_true(n.again);
        assert_int_equal(n.cycle, 1);
        assert_int_equal(planner_build(SCHED, AT, 1, &p), 0);
        assert_string_equal(n.records[0].plan_id, p.plan_id);
        assert_int_equal(n.records[0].op, WAL_OP_PLAN_COMMIT);
        assert_int_equal(n.records[0].nsteps, PLANNER_PHASES);
        /* then the first step runs: append + executing */
        assert_int_equal(step(&s, &n), DECIDE_RUN_STEP);
        assert_false(n.again);
        assert_int_equal(n.phase, PHASE_OBSERVE);
        assert_string_equal(n.step_id, "observe_001");
        assert_int_equal(n.attempt, 1);
        char key[128];
        snprintf(key, sizeof key, "%s/observe_001", s.mid);
        assert_string_equal(n.idem_key, key);
        assert_int_equal(n.nrecords, 2);
        assert_int_equal(n.records[0].op, WAL_OP_APPEND);
        assert_string_equal(n.records[0].idem_key, key);
        assert_int_equal(n.records[1].op, WAL_OP_EXECUTING);
        assert_int_equal(s.f->steps[n.step].state, STEP_EXECUTING);
        /* an executing step with no outcome is for a human */
        decide(&s, &n);
        assert_int_equal(n.kind, DECIDE_REVIEW);
        assert_string_equal(n.step_id, "observe_001");
        assert_string_equal(n.reason, "needs_review");
        sim_free(&s);
}

static void test_no_mandate_record_pauses(void **state)
{
        (void)state;
        struct sim s;
        struct decide_next n;
        sim_init(&s, 1, false);
        s.in.schedule = NULL;
        s.in.fired_at = NULL;
        decide(&s, &n);
        assert_int_equal(n.kind, DECIDE_PAUSE);
        assert_string_equal(n.reason, "no mandate record: schedule unknown, cannot plan a new cycle");
        assert_int_equal(n.nrecords, 0);
        sim_free(&s);
}

static void test_schedule_missing_or_unknown_pauses(void **state)
{
        (void)state;
        struct sim s;
        struct decide_next n;
        sim_init(&s, 1, true);
        assert_int_equal(step(&s, &n), DECIDE_START_CYCLE);
        s.in.schedule_known = false;
        decide(&s, &n);
        assert_int_equal(n.kind, DECIDE_PAUSE);
        assert_string_equal(n.reason, "schedule_missing: not in the configuration");
        s.in.schedule = NULL;
        decide(&s, &n);
        assert_string_equal(n.reason, "schedule_unknown: the WAL has no mandate record");
        assert_int_equal(n.nrecords, 0);
        sim_free(&s);
}

static void test_no_command_completes_without_executing(void **state)
{
        (void)state;
        struct sim s;
        struct decide_next n;
        sim_init(&s, 1, true);
        for (int i = 0; i < PLANNER_PHASES; i++)
                s.in.has_command[i] = i == PHASE_ACT;
        assert_int_equal(step(&s, &n), DECIDE_START_CYCLE);
        for (int i = 0; i < PHASE_ACT; i++) {
                assert_int_equal(step(&s, &n), DECIDE_COMPLETE_STEP);
                assert_true(n.again);
                assert_int_equal(n.phase, i);
                assert_int_equal(n.records[0].op, WAL_OP_APPEND);
                assert_int_equal(n.records[1].op, WAL_OP_COMPLETED);
                assert_string_equal(n.records[1].result_json, "null");
                /* the hash of null (computed once per thread in decide.c) */
                char want[CANON_HASH_STRLEN];
                assert_int_equal(canon_hash_json("null", 4, want, NULL), 0);
                assert_string_equal(n.records[1].result_hash, want);
                const struct fold_step *st = &s.f->steps[n.step];
                assert_int_equal(st->state, STEP_COMPLETED);
                assert_int_equal(st->executions, 0);
                assert_null(st->observed_pre_hash);
        }
        assert_int_equal(step(&s, &n), DECIDE_RUN_STEP);
        assert_int_equal(n.phase, PHASE_ACT);
        complete(&s, n.step_id, "{}");
        /* reflect has no command, then the plan ends and MaxCycles=1 */
        assert_int_equal(settle(&s, &n), DECIDE_END);
        assert_int_equal(n.end, DECIDE_END_DONE);
        assert_string_equal(n.reason, "MaxCycles reached");
        sim_free(&s);
}

static void test_all_completed_finalizes_succeeded(void **state)
{
        (void)state;
        struct sim s;
        struct decide_next n;
        sim_init(&s, 1, true);
        run_until(&s, PLANNER_PHASES, "1");
        assert_int_equal(step(&s, &n), DECIDE_FINALIZE);
        assert_true(n.again && n.cycle_finished);
        assert_int_equal(n.records[0].op, WAL_OP_FINALIZE);
        assert_int_equal(n.records[0].status, PLAN_SUCCEEDED);
        assert_null(n.records[0].reason);
        assert_int_equal(s.f->plans[0].final_state, PLAN_SUCCEEDED);
        assert_int_equal(step(&s, &n), DECIDE_END);
        assert_int_equal(n.end, DECIDE_END_DONE);
        assert_string_equal(n.reason, "MaxCycles reached");
        sim_free(&s);
}

static void test_failed_step_finalizes_failed(void **state)
{
        (void)state;
        struct sim s;
        struct decide_next n;
        sim_init(&s, 1, true);
        run_until(&s, 2, "1");
        assert_int_equal(settle(&s, &n), DECIDE_RUN_STEP);
        fail_step(&s, n.step_id);
        assert_int_equal(step(&s, &n), DECIDE_FINALIZE);
        assert_int_equal(n.records[0].status, PLAN_FAILED);
        assert_string_equal(n.records[0].reason, "step_failed");
        assert_true(n.cycle_finished);
        /* the last allowed cycle failed */
        assert_int_equal(step(&s, &n), DECIDE_END);
        assert_int_equal(n.end, DECIDE_END_FAILED);
        assert_string_equal(n.reason, "the last cycle failed");
        sim_free(&s);
}

/* RetryAttempts=2: a failed step waits (retry_wait, folded), runs again
 * at its due time under the same key as attempt 2, and when its retries
 * are used up the plan fails as before; a timeout is not retried. */
static void test_failed_step_retried(void **state)
{
        (void)state;
        struct sim s;
        struct decide_next n;
        struct retry_policy pol[PLANNER_PHASES];
        for (int i = 0; i < PLANNER_PHASES; i++)
                retry_policy_init(&pol[i]);
        pol[PHASE_ORIENT].attempts = 2;
        pol[PHASE_ORIENT].first_ms = 300;
        sim_init(&s, 1, true);
        s.in.retry_policy = pol;
        s.in.now_ms = 1000000;
        run_until(&s, 1, "1");
        assert_int_equal(settle(&s, &n), DECIDE_RUN_STEP);
        const char *key = s.f->steps[n.step].idem_key;
        size_t si = n.step;
        fail_step(&s, n.step_id);
        /* the retry_wait record, folded */
        assert_int_equal(step(&s, &n), DECIDE_RETRY_WAIT);
        assert_true(n.again);
        assert_int_equal(n.nrecords, 1);
        assert_int_equal(n.records[0].op, WAL_OP_RETRY_WAIT);
        assert_int_equal(n.due_ms, 1000300);
        assert_true(s.f->steps[si].retry_waiting);
        assert_int_equal(s.f->steps[si].retries, 1);
        assert_int_equal(s.f->steps[si].retry_due_ms, 1000300);
        assert_int_equal(s.f->nretries, 1);
        assert_int_equal(s.f->retries[0].attempt, 1);
        assert_string_equal(s.f->retries[0].error_class, "exit_status");
        assert_string_equal(s.f->retries[0].error_msg, "exit status 1");
        /* not due: wait, nothing recorded (also without a policy: a restart
         * that lost the configuration still waits) */
        s.in.now_ms = 1000299;
        assert_int_equal(step(&s, &n), DECIDE_RETRY_WAIT);
        assert_int_equal(n.nrecords, 0);
        assert_int_equal(n.due_ms, 1000300);
        /* due, its effect journaled: the evidence decides, nothing runs */
        s.in.now_ms = 1000300;
        s.in.retry_evidence_phases = 1u << PHASE_ORIENT;
        assert_int_equal(step(&s, &n), DECIDE_RETRY_EVIDENCE);
        assert_int_equal(n.nrecords, 0);
        assert_string_equal(n.step_id, "orient_001");
        s.in.retry_evidence_phases = 0;
        /* due: run again, same key, attempt 2 */
        assert_int_equal(step(&s, &n), DECIDE_RUN_STEP);
        assert_int_equal(n.attempt, 2);
        assert_string_equal(n.idem_key, key);
        assert_false(s.f->steps[si].retry_waiting);
        fail_step(&s, n.step_id);
        /* the second retry waits twice as long */
        assert_int_equal(step(&s, &n), DECIDE_RETRY_WAIT);
        assert_int_equal(n.due_ms, 1000300 + 600);
        s.in.now_ms = 2000000;
        assert_int_equal(step(&s, &n), DECIDE_RUN_STEP);
        assert_int_equal(n.attempt, 3);
        fail_step(&s, n.step_id);
        /* retries used up: the plan fails as before */
        assert_int_equal(step(&s, &n), DECIDE_FINALIZE);
        assert_int_equal(n.records[0].status, PLAN_FAILED);
        assert_int_equal(s.f->nretries, 2);
        sim_free(&s);

        /* a timeout is not retried by default, a cancel never */
        sim_init(&s, 1, true);
        s.in.retry_policy = pol;
        run_until(&s, 1, "1");
        assert_int_equal(settle(&s, &n), DECIDE_RUN_STEP);
        struct wal_record t = { .op = WAL_OP_FAILED, .step_id = n.step_id,
                                .error_class = "timeout", .error_msg = "no exit" };
        put(&s, &t);
        assert_int_equal(step(&s, &n), DECIDE_FINALIZE);
        sim_free(&s);
}

static void test_abandoned_step_finalizes_failed(void **state)
{
        (void)state;
        struct sim s;
        struct decide_next n;
        sim_init(&s, 1, true);
        assert_int_equal(settle(&s, &n), DECIDE_RUN_STEP);
        /* a status kairos never writes, from another writer (legacy line) */
        put_raw(&s, "{\"op\":\"transition\",\"step_id\":\"observe_001\",\"status\":\"abandoned\","
                    "\"ts\":\"2026-04-20T12:00:00.000Z\"}\n");
        assert_int_equal(s.f->steps[n.step].state, STEP_ABANDONED);
        assert_int_equal(step(&s, &n), DECIDE_FINALIZE);
        assert_int_equal(n.records[0].status, PLAN_FAILED);
        assert_string_equal(n.records[0].reason, "step_abandoned");
        sim_free(&s);
}

static void test_failed_cycle_then_next_then_terminated(void **state)
{
        (void)state;
        struct sim s;
        struct decide_next n;
        sim_init(&s, 3, true);
        assert_int_equal(settle(&s, &n), DECIDE_RUN_STEP);
        fail_step(&s, n.step_id);
        assert_int_equal(step(&s, &n), DECIDE_FINALIZE);
        /* one failed cycle, more allowed: the next cycle */
        assert_int_equal(step(&s, &n), DECIDE_START_CYCLE);
        assert_int_equal(n.cycle, 2);
        assert_int_equal(step(&s, &n), DECIDE_RUN_STEP);
        assert_string_equal(n.step_id, "observe_002");
        fail_step(&s, n.step_id);
        assert_int_equal(step(&s, &n), DECIDE_FINALIZE);
        /* two consecutive failed cycles, although MaxCycles=3 */
        assert_int_equal(step(&s, &n), DECIDE_END);
        assert_int_equal(n.end, DECIDE_END_TERMINATED);
        assert_string_equal(n.reason, "two consecutive failed cycles");
        sim_free(&s);
}

static void test_reflect_done_ends(void **state)
{
        (void)state;
        struct sim s;
        struct decide_next n;
        sim_init(&s, 5, true);
        run_until(&s, PHASE_REFLECT, "1");
        assert_int_equal(settle(&s, &n), DECIDE_RUN_STEP);
        complete(&s, n.step_id, "{\"kairos\":{\"done\":true}}");
        assert_int_equal(settle(&s, &n), DECIDE_END);
        assert_int_equal(n.end, DECIDE_END_DONE);
        assert_string_equal(n.reason, "reflect said done");
        assert_int_equal(n.cycle, 1);
        sim_free(&s);
}

static void test_succeeded_cycle_starts_next_until_max(void **state)
{
        (void)state;
        struct sim s;
        struct decide_next n;
        sim_init(&s, 2, true);
        run_until(&s, PLANNER_PHASES, "{\"kairos\":{\"done\":false}}");
        assert_int_equal(step(&s, &n), DECIDE_FINALIZE);
        assert_int_equal(step(&s, &n), DECIDE_START_CYCLE);
        assert_int_equal(n.cycle, 2);
        run_until(&s, PLANNER_PHASES, "2");
        assert_int_equal(settle(&s, &n), DECIDE_END);
        assert_int_equal(n.end, DECIDE_END_DONE);
        assert_string_equal(n.reason, "MaxCycles reached");
        assert_int_equal(n.cycle, 2);
        sim_free(&s);
}

static void test_approval(void **state)
{
        (void)state;
        struct sim s;
        struct decide_next n;
        sim_init(&s, 1, true);
        run_until(&s, PHASE_ACT, "1");
        assert_int_equal(settle(&s, &n), DECIDE_RUN_STEP);
        complete(&s, n.step_id,
                 "{\"kairos\":{\"pause\":\"awaiting_approval\",\"reason\":\"big change\"}}");
        decide(&s, &n);
        assert_int_equal(n.kind, DECIDE_AWAIT_APPROVAL);
        assert_string_equal(n.reason, "big change");
        assert_string_equal(n.step_id, "act_001");
        assert_int_equal(n.nrecords, 0);
        /* an approval of another step changes nothing */
        struct wal_record op = { .op = WAL_OP_OPERATOR, .mandate_id = s.mid, .action = "approve",
                                 .step_id = "act_002", .uid = 0, .reason = "x" };
        put(&s, &op);
        decide(&s, &n);
        assert_int_equal(n.kind, DECIDE_AWAIT_APPROVAL);
        op.step_id = "act_001";
        put(&s, &op);
        decide(&s, &n);
        assert_int_equal(n.kind, DECIDE_RUN_STEP);
        assert_string_equal(n.step_id, "reflect_001");
        sim_free(&s);
}

static void test_approval_default_reason(void **state)
{
        (void)state;
        struct sim s;
        struct decide_next n;
        sim_init(&s, 1, true);
        run_until(&s, PHASE_ACT, "1");
        assert_int_equal(settle(&s, &n), DECIDE_RUN_STEP);
        complete(&s, n.step_id, "{\"kairos\":{\"pause\":true}}");
        decide(&s, &n);
        assert_int_equal(n.kind, DECIDE_AWAIT_APPROVAL);
        assert_string_equal(n.reason, "awaiting_approval");
        sim_free(&s);
}

static void test_review_and_reset(void **state)
{
        (void)state;
        struct sim s;
        struct decide_next n;
        sim_init(&s, 1, true);
        assert_int_equal(settle(&s, &n), DECIDE_RUN_STEP);
        struct wal_record nr = { .op = WAL_OP_NEEDS_REVIEW, .step_id = "observe_001",
                                 .reason = "killed_at_shutdown" };
        put(&s, &nr);
        decide(&s, &n);
        assert_int_equal(n.kind, DECIDE_REVIEW);
        assert_string_equal(n.reason, "killed_at_shutdown");
        /* an operator's retry: reset, runs again as attempt 2 with the same key */
        struct wal_record rs = { .op = WAL_OP_RESET, .step_id = "observe_001" };
        put(&s, &rs);
        decide(&s, &n);
        assert_int_equal(n.kind, DECIDE_RUN_STEP);
        assert_int_equal(n.attempt, 2);
        assert_string_equal(n.step_id, "observe_001");
        sim_free(&s);
}

static void test_abandoned_plan_ends(void **state)
{
        (void)state;
        struct sim s;
        struct decide_next n;
        sim_init(&s, 3, true);
        assert_int_equal(settle(&s, &n), DECIDE_RUN_STEP);
        struct wal_record fin = { .op = WAL_OP_FINALIZE, .plan_id = n.plan_id,
                                  .status = PLAN_ABANDONED, .reason = "operator gave up" };
        put(&s, &fin);
        decide(&s, &n);
        assert_int_equal(n.kind, DECIDE_END);
        assert_int_equal(n.end, DECIDE_END_ABANDONED);
        assert_string_equal(n.reason, "operator gave up");
        /* abandoned by a cancel: cancelled */
        struct wal_record op = { .op = WAL_OP_OPERATOR, .mandate_id = s.mid, .action = "cancel",
                                 .uid = 0, .reason = "stop it" };
        put(&s, &op);
        decide(&s, &n);
        assert_int_equal(n.end, DECIDE_END_CANCELLED);
        assert_string_equal(decide_end_name(n.end), "cancelled");
        sim_free(&s);
}

static void test_orphan_plan_is_not_the_last(void **state)
{
        (void)state;
        struct sim s;
        struct decide_next n;
        sim_init(&s, 1, true);
        /* an append for a step no plan announced: an orphan plan */
        struct wal_record ap = { .op = WAL_OP_APPEND, .step_id = "x_1", .plan_id = "plan_x",
                                 .idem_key = "k" };
        put(&s, &ap);
        assert_int_equal(s.f->nplans, 1);
        decide(&s, &n);
        assert_int_equal(n.kind, DECIDE_START_CYCLE);
        assert_int_equal(n.cycle, 1);
        sim_free(&s);
}

static void test_corrupt_and_bad_arguments(void **state)
{
        (void)state;
        struct sim s;
        struct decide_next n;
        size_t used;
        sim_init(&s, 1, true);
        assert_int_equal(fold_feed(s.f, "{\"op\":1,\"crc\":\"00000000\"}\n", 27, &used), -EBADMSG);
        assert_int_equal(s.f->status, FOLD_CORRUPT);
        assert_int_equal(decide_next(s.f, &s.in, &n), -EBADMSG);
        assert_int_equal(decide_next(NULL, &s.in, &n), -EINVAL);
        assert_int_equal(decide_next(s.f, NULL, &n), -EINVAL);
        assert_int_equal(fold_feed(s.f, "\n", 1, &used), -EBADMSG);
        sim_free(&s);
}

static void test_feed_partial_line_waits(void **state)
{
        (void)state;
        struct sim s;
        struct kbuf line = KBUF_INIT;
        size_t used;
        sim_init(&s, 1, false);
        struct wal_record r = { .op = WAL_OP_MANDATE, .mandate_id = s.mid, .schedule = SCHED,
                                .fired_at = AT };
        assert_int_equal(wal_encode(&r, T0, &line), 0);
        /* all but the newline: nothing folded yet */
        assert_int_equal(fold_feed(s.f, line.data, line.len - 1, &used), 0);
        assert_int_equal(used, 0);
        assert_int_equal(s.f->records, 0);
        assert_int_equal(fold_feed(s.f, line.data, line.len, &used), 0);
        assert_int_equal(used, line.len);
        assert_int_equal(s.f->records, 1);
        assert_int_equal(s.f->good_end, line.len);
        assert_string_equal(s.f->mandate.schedule, SCHED);
        /* the same as folding the whole buffer */
        struct fold *g;
        assert_int_equal(fold_buffer(line.data, line.len, &g), 0);
        assert_int_equal(g->records, s.f->records);
        assert_int_equal(g->good_end, s.f->good_end);
        fold_free(g);
        kbuf_free(&line);
        sim_free(&s);
}

/* The incremental fold of a whole mandate equals the fold of its file. */
static void test_incremental_equals_whole(void **state)
{
        (void)state;
        struct sim s;
        struct decide_next n;
        sim_init(&s, 2, true);
        run_until(&s, PLANNER_PHASES, "{\"a\":[1,2]}");
        run_until(&s, PLANNER_PHASES, "3");
        assert_int_equal(settle(&s, &n), DECIDE_END);
        struct fold *g;
        assert_int_equal(fold_buffer(s.b.data, s.b.len, &g), 0);
        assert_int_equal(g->records, s.f->records);
        assert_int_equal(g->nplans, s.f->nplans);
        assert_int_equal(g->nsteps, s.f->nsteps);
        for (size_t i = 0; i < g->nsteps; i++) {
                assert_string_equal(g->steps[i].step_id, s.f->steps[i].step_id);
                assert_int_equal(g->steps[i].state, s.f->steps[i].state);
                assert_string_equal(g->steps[i].result_json, s.f->steps[i].result_json);
        }
        for (size_t i = 0; i < g->nplans; i++)
                assert_int_equal(g->plans[i].final_state, s.f->plans[i].final_state);
        fold_free(g);
        sim_free(&s);
}

static void test_names(void **state)
{
        (void)state;
        assert_string_equal(decide_kind_name(DECIDE_RUN_STEP), "run_step");
        assert_string_equal(decide_kind_name(DECIDE_COMPLETE_STEP), "complete_step");
        assert_string_equal(decide_end_name(DECIDE_END_TERMINATED), "terminated");
        assert_string_equal(decide_file_name(DECIDE_FILE_REMOVE), "remove");
        assert_int_equal(step_status_parse("needs_review"), STEP_NEEDS_REVIEW);
        assert_int_equal(step_status_parse("weird"), STEP_OTHER);
        assert_int_equal(step_status_parse(NULL), STEP_NONE);
        assert_string_equal(step_status_name(STEP_EXECUTING), "executing");
        assert_null(step_status_name(STEP_OTHER));
        assert_int_equal(plan_status_parse("abandoned"), PLAN_ABANDONED);
        assert_int_equal(plan_status_parse(NULL), PLAN_OTHER);
        assert_string_equal(plan_status_name(PLAN_FAILED), "failed");
}

/* ---- the startup rule ---- */

static void test_recover_remove_unacknowledged(void **state)
{
        (void)state;
        struct sim s;
        struct decide_recovery dr;
        sim_init(&s, 1, false);
        /* an empty file */
        assert_int_equal(decide_recover(s.f, false, NULL, &dr), 0);
        assert_int_equal(dr.file, DECIDE_FILE_REMOVE);
        decide_recovery_release(&dr);
        /* only the mandate record */
        struct wal_record r = { .op = WAL_OP_MANDATE, .mandate_id = s.mid, .schedule = SCHED,
                                .fired_at = AT };
        put(&s, &r);
        assert_int_equal(decide_recover(s.f, false, NULL, &dr), 0);
        assert_int_equal(dr.file, DECIDE_FILE_REMOVE);
        decide_recovery_release(&dr);
        /* ... but a summary says the mandate ran: never removed */
        assert_int_equal(decide_recover(s.f, true, NULL, &dr), 0);
        assert_int_equal(dr.file, DECIDE_FILE_RECOVER);
        assert_int_equal(dr.mandate, DECIDE_MANDATE_RUNNABLE);
        decide_recovery_release(&dr);
        /* an operator record: kept */
        struct wal_record op = { .op = WAL_OP_OPERATOR, .mandate_id = s.mid, .action = "pause",
                                 .uid = 0, .reason = "x" };
        put(&s, &op);
        assert_int_equal(decide_recover(s.f, false, NULL, &dr), 0);
        assert_int_equal(dr.file, DECIDE_FILE_RECOVER);
        decide_recovery_release(&dr);
        sim_free(&s);
}

static void test_recover_plan_kept_and_corrupt(void **state)
{
        (void)state;
        struct sim s;
        struct decide_next n;
        struct decide_recovery dr;
        size_t used;
        sim_init(&s, 1, true);
        assert_int_equal(step(&s, &n), DECIDE_START_CYCLE);
        assert_int_equal(decide_recover(s.f, false, NULL, &dr), 0);
        assert_int_equal(dr.file, DECIDE_FILE_RECOVER);
        assert_int_equal(dr.mandate, DECIDE_MANDATE_RUNNABLE);
        assert_int_equal(recovery_record_count(dr.recovery), 0);
        decide_recovery_release(&dr);
        assert_null(dr.recovery);
        assert_int_equal(fold_feed(s.f, "garbage\n", 8, &used), -EBADMSG);
        assert_int_equal(decide_recover(s.f, false, NULL, &dr), 0);
        assert_int_equal(dr.file, DECIDE_FILE_QUARANTINE);
        assert_null(dr.recovery);
        assert_int_equal(decide_recover(NULL, false, NULL, &dr), -EINVAL);
        sim_free(&s);
}

/* A mandate interrupted in the act step; its decision with evidence ev. */
static void interrupted_at(struct sim *s, int phase)
{
        struct decide_next n;
        sim_init(s, 1, true);
        run_until(s, phase, "1");
        assert_int_equal(settle(s, &n), DECIDE_RUN_STEP);
        assert_int_equal(n.phase, phase);
}

static const struct recovery_decision *decision(struct decide_recovery *dr)
{
        assert_int_equal(dr->file, DECIDE_FILE_RECOVER);
        assert_int_equal(dr->recovery->nplans, 1);
        assert_int_equal(dr->recovery->plans[0].ndecisions, 1);
        return &dr->recovery->plans[0].decisions[0];
}

static void test_recover_wal_alone_pauses(void **state)
{
        (void)state;
        struct sim s;
        struct decide_recovery dr;
        interrupted_at(&s, PHASE_ACT);
        assert_int_equal(decide_recover(s.f, false, NULL, &dr), 0);
        const struct recovery_decision *d = decision(&dr);
        assert_int_equal(d->verdict.kind, VERDICT_MANUAL_REVIEW);
        assert_string_equal(d->verdict.reason, "interrupted_during_execution");
        assert_int_equal(dr.mandate, DECIDE_MANDATE_PAUSED_REVIEW);
        assert_string_equal(dr.review_step, "act_001");
        assert_string_equal(dr.review_reason, "interrupted_during_execution");
        decide_recovery_release(&dr);
        sim_free(&s);
}

static void expect_evidence(int phase, struct recovery_evidence *ev, enum verdict_kind kind,
                            const char *reason, const char *evidence_part)
{
        struct sim s;
        struct decide_recovery dr;
        struct kbuf b = KBUF_INIT;
        interrupted_at(&s, phase);
        assert_int_equal(decide_recover(s.f, false, ev, &dr), 0);
        const struct recovery_decision *d = decision(&dr);
        assert_int_equal(d->verdict.kind, kind);
        assert_string_equal(d->verdict.reason, reason);
        assert_int_equal(verdict_evidence_json(&d->verdict, &b), 0);
        if (!strstr(b.data, evidence_part))
                fail_msg("evidence %s lacks %s", b.data, evidence_part);
        assert_int_equal(dr.mandate, kind == VERDICT_MANUAL_REVIEW ? DECIDE_MANDATE_PAUSED_REVIEW
                                                                  : DECIDE_MANDATE_RUNNABLE);
        if (kind == VERDICT_SAFE_TO_RETRY) {
                assert_true(d->has_record);
                assert_int_equal(d->record.op, WAL_OP_RESET);
        }
        kbuf_free(&b);
        decide_recovery_release(&dr);
        sim_free(&s);
}

static void test_recover_evidence_sources(void **state)
{
        (void)state;
        struct recovery_evidence ev = { .effects = 1u << PHASE_ACT,
                                        .has_command = { true, true, true, true, true } };
        /* 2: what the step is */
        expect_evidence(PHASE_OBSERVE, &ev, VERDICT_SAFE_TO_RETRY, "declared_rerunnable",
                        "\"phase\":\"observe\"");
        ev.has_command[PHASE_ACT] = false;
        expect_evidence(PHASE_ACT, &ev, VERDICT_SAFE_TO_RETRY, "no_command", "\"phase\":\"act\"");
        ev.has_command[PHASE_ACT] = true;
        /* an effectful step with nothing more: the WAL's word */
        expect_evidence(PHASE_ACT, &ev, VERDICT_MANUAL_REVIEW, "interrupted_during_execution",
                        "\"status\":\"executing\"");
        /* 3: the idempotency store */
        struct recovery_step_evidence se = { .step_id = "act_001", .idem_open = 1,
                                             .idem_json = "[{\"key\":\"k1\"}]" };
        ev.steps = &se;
        ev.nsteps = 1;
        expect_evidence(PHASE_ACT, &ev, VERDICT_MANUAL_REVIEW, "tool_call_interrupted",
                        "\"tool_calls\":[{\"key\":\"k1\"}]");
        se.idem_open = 0;
        ev.effects_via_kairosctl = true;
        expect_evidence(PHASE_ACT, &ev, VERDICT_SAFE_TO_RETRY, "effects_journaled",
                        "\"tool_calls\":[{\"key\":\"k1\"}]");
        ev.effects_via_kairosctl = false;
        /* 4: the probe */
        se.probe = RECOVERY_PROBE_NOT_STARTED;
        expect_evidence(PHASE_ACT, &ev, VERDICT_SAFE_TO_RETRY, "current_pre_matches_expected",
                        "\"source\":\"probe\"");
        se.probe = RECOVERY_PROBE_FAILED;
        se.probe_output = "garbage";
        expect_evidence(PHASE_ACT, &ev, VERDICT_MANUAL_REVIEW, "probe_inconclusive",
                        "\"probe_output\":\"garbage\"");
        /* evidence for another step changes nothing */
        se.step_id = "act_009";
        expect_evidence(PHASE_ACT, &ev, VERDICT_MANUAL_REVIEW, "interrupted_during_execution",
                        "\"status\":\"executing\"");
}

/* An open tool call that its own check or the schedule's probe can decide
 * waits for them; a check that could not say pages a human with its
 * words; the probe's word decides a step whose call is still open. */
static void test_recover_open_call_checks(void **state)
{
        (void)state;
        struct sim s;
        struct decide_recovery dr;
        struct recovery_step_evidence se = { .step_id = "act_001", .idem_open = 1,
                                             .idem_checks = 1,
                                             .idem_json = "[{\"key\":\"cmd:k\"}]" };
        struct recovery_evidence ev = { .effects = 1u << PHASE_ACT,
                                        .effects_via_kairosctl = true,
                                        .has_command = { true, true, true, true, true },
                                        .steps = &se, .nsteps = 1 };
        interrupted_at(&s, PHASE_ACT);
        /* its check first */
        assert_int_equal(decide_recover(s.f, false, &ev, &dr), 0);
        assert_int_equal(dr.mandate, DECIDE_MANDATE_PROBING);
        assert_string_equal(dr.probe_step, "act_001");
        decide_recovery_release(&dr);
        /* no check, the schedule's probe */
        se.idem_checks = 0;
        ev.has_probe = true;
        assert_int_equal(decide_recover(s.f, false, &ev, &dr), 0);
        assert_int_equal(dr.mandate, DECIDE_MANDATE_PROBING);
        decide_recovery_release(&dr);
        sim_free(&s);
        /* the probe's word decides, not EffectsVia= (the call is open) */
        se.probe = RECOVERY_PROBE_NOT_STARTED;
        expect_evidence(PHASE_ACT, &ev, VERDICT_SAFE_TO_RETRY, "current_pre_matches_expected",
                        "\"source\":\"probe\"");
        /* the check could not say */
        se.probe = RECOVERY_PROBE_NONE;
        se.idem_checks = 1;
        se.check = RECOVERY_PROBE_FAILED;
        se.check_key = "cmd:k";
        se.check_output = "no idea";
        expect_evidence(PHASE_ACT, &ev, VERDICT_MANUAL_REVIEW, "tool_check_inconclusive",
                        "\"tool_calls\":[{\"key\":\"cmd:k\"}],\"check\":{\"key\":\"cmd:k\","
                        "\"output\":\"no idea\"}");
        /* neither: a human, as before */
        se.check = RECOVERY_PROBE_NONE;
        se.idem_checks = 0;
        ev.has_probe = false;
        expect_evidence(PHASE_ACT, &ev, VERDICT_MANUAL_REVIEW, "tool_call_interrupted",
                        "\"tool_calls\":[{\"key\":\"cmd:k\"}]");
}

static void test_recover_probe_done_completes(void **state)
{
        (void)state;
        struct sim s;
        struct decide_recovery dr;
        struct recovery_step_evidence se = { .step_id = "act_001", .probe = RECOVERY_PROBE_DONE,
                                             .probe_result_json = "{\"sent\":1}" };
        struct recovery_evidence ev = { .effects = 1u << PHASE_ACT,
                                        .has_command = { true, true, true, true, true },
                                        .steps = &se, .nsteps = 1 };
        char h[CANON_HASH_STRLEN];
        interrupted_at(&s, PHASE_ACT);
        assert_int_equal(decide_recover(s.f, false, &ev, &dr), 0);
        /* act completed by the probe's word, then reflect never started */
        assert_int_equal(dr.recovery->plans[0].ndecisions, 2);
        assert_int_equal(dr.recovery->plans[0].decisions[1].verdict.kind, VERDICT_SAFE_TO_RETRY);
        const struct recovery_decision *d = &dr.recovery->plans[0].decisions[0];
        assert_int_equal(d->verdict.kind, VERDICT_ALREADY_DONE);
        assert_string_equal(d->verdict.reason, "current_state_matches_expected_post");
        assert_int_equal(d->record.op, WAL_OP_COMPLETED);
        assert_true(d->record.recovered);
        assert_string_equal(d->record.result_json, "{\"sent\":1}");
        /* a copy: the evidence need not outlive the decision */
        assert_ptr_not_equal(d->record.result_json, se.probe_result_json);
        assert_int_equal(canon_hash_json("{\"sent\":1}", 10, h, NULL), 0);
        assert_string_equal(d->record.result_hash, h);
        /* the mandate goes on (reflect runs next) */
        assert_int_equal(dr.mandate, DECIDE_MANDATE_RUNNABLE);
        decide_recovery_release(&dr);
        sim_free(&s);
}

/* A schedule with Probe=: a step that only the probe can decide, with no
 * word from it yet, is left undecided (no record) and the mandate probes;
 * the same function then decides with the probe's word.  A step another
 * source decides never waits for a probe. */
static void test_recover_awaits_probe(void **state)
{
        (void)state;
        struct sim s;
        struct decide_recovery dr;
        struct recovery_step_evidence se = { .step_id = "act_001" };
        struct recovery_evidence ev = { .effects = 1u << PHASE_ACT, .has_probe = true,
                                        .has_command = { true, true, true, true, true },
                                        .steps = &se, .nsteps = 1 };
        interrupted_at(&s, PHASE_ACT);
        assert_int_equal(decide_recover(s.f, false, &ev, &dr), 0);
        assert_int_equal(dr.file, DECIDE_FILE_RECOVER);
        assert_int_equal(dr.mandate, DECIDE_MANDATE_PROBING);
        assert_string_equal(dr.probe_step, "act_001");
        assert_int_equal(dr.recovery->nplans, 1);
        const struct recovery_plan *rp = &dr.recovery->plans[0];
        assert_int_equal(rp->outcome, RECOVERY_AWAIT_PROBE);
        assert_string_equal(rp->probe_step, "act_001");
        assert_string_equal(s.f->steps[rp->probe_index].step_id, "act_001");
        assert_int_equal(rp->ndecisions, 0);
        assert_false(rp->has_finalize);
        assert_int_equal(recovery_record_count(dr.recovery), 0);
        assert_string_equal(recovery_outcome_name(rp->outcome), "awaiting_probe");
        decide_recovery_release(&dr);

        /* the probe spoke: decided as any other source */
        se.probe = RECOVERY_PROBE_NOT_STARTED;
        assert_int_equal(decide_recover(s.f, false, &ev, &dr), 0);
        assert_int_equal(dr.mandate, DECIDE_MANDATE_RUNNABLE);
        assert_int_equal(dr.recovery->plans[0].outcome, RECOVERY_RESUME);
        assert_int_equal(recovery_record_count(dr.recovery), 1);
        /* the reset says why: the probe */
        const struct wal_record *reset = recovery_record_at(dr.recovery, 0);
        assert_int_equal(reset->op, WAL_OP_RESET);
        assert_non_null(reset->evidence_json);
        assert_non_null(strstr(reset->evidence_json, "\"reason\":\"current_pre_matches_expected\""));
        assert_non_null(strstr(reset->evidence_json, "\"source\":\"probe\""));
        decide_recovery_release(&dr);
        se.probe = RECOVERY_PROBE_FAILED;
        se.probe_output = "exit status 3";
        assert_int_equal(decide_recover(s.f, false, &ev, &dr), 0);
        assert_int_equal(dr.mandate, DECIDE_MANDATE_PAUSED_REVIEW);
        assert_string_equal(dr.review_reason, "probe_inconclusive");
        decide_recovery_release(&dr);
        se.probe = RECOVERY_PROBE_NONE;

        /* no Probe=: the WAL's word (review) */
        ev.has_probe = false;
        assert_int_equal(decide_recover(s.f, false, &ev, &dr), 0);
        assert_int_equal(dr.mandate, DECIDE_MANDATE_PAUSED_REVIEW);
        assert_string_equal(dr.review_reason, "interrupted_during_execution");
        decide_recovery_release(&dr);
        ev.has_probe = true;
        /* an open call of the step waits for the probe too (before a human) */
        se.idem_open = 1;
        assert_int_equal(decide_recover(s.f, false, &ev, &dr), 0);
        assert_int_equal(dr.mandate, DECIDE_MANDATE_PROBING);
        decide_recovery_release(&dr);
        se.idem_open = 0;
        ev.effects_via_kairosctl = true;
        assert_int_equal(decide_recover(s.f, false, &ev, &dr), 0);
        assert_int_equal(dr.mandate, DECIDE_MANDATE_RUNNABLE);
        decide_recovery_release(&dr);
        ev.effects_via_kairosctl = false;
        ev.effects = 0;
        assert_int_equal(decide_recover(s.f, false, &ev, &dr), 0);
        assert_int_equal(dr.mandate, DECIDE_MANDATE_RUNNABLE);
        decide_recovery_release(&dr);
        sim_free(&s);
}

/* The evidence as kairosd and kairosctl recover --dry-run build it: from an
 * idempotency store (its owned entries, indexed by mandate) and a schedule's
 * declarations, decided by the same function. */
static int64_t fixed_clock(void *ctx)
{
        (void)ctx;
        return 1776686400123LL; /* 2026-04-20T12:00:00.123Z */
}

static void owned_call(struct idem_store *st, const char *mid, const char *step, const char *key,
                       bool finish)
{
        struct idem_step_owner o = { .attempt = 1 };
        snprintf(o.mandate, sizeof o.mandate, "%s", mid);
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

static const struct recovery_decision *decide_with(struct sim *s, struct idem_store *st,
                                                   const struct evidence_schedule *es,
                                                   struct evidence_index **ix,
                                                   struct evidence_mandate *em,
                                                   struct decide_recovery *dr)
{
        assert_int_equal(st ? evidence_index_build(st, ix) : evidence_index_unknown(ix), 0);
        assert_int_equal(evidence_for_mandate(*ix, s->mid, es, em), 0);
        assert_int_equal(decide_recover(s->f, false, &em->ev, dr), 0);
        return decision(dr);
}

static void test_recover_evidence_from_store(void **state)
{
        (void)state;
        struct sim s;
        struct idem_store *st;
        struct idem_options opt = { .now_ms = fixed_clock };
        struct evidence_index *ix;
        struct evidence_mandate em;
        struct decide_recovery dr;
        struct config_schedule sc = { .effects = 1u << PHASE_ACT,
                                      .effects_via = EFFECTS_VIA_KAIROSCTL };
        char *cmd = "/bin/true";
        for (int i = 0; i < PLANNER_PHASES; i++)
                sc.exec[i] = cmd;
        struct evidence_schedule es;
        evidence_schedule_from_config(&sc, &es);
        assert_true(es.effects_via_kairosctl);
        assert_false(es.has_probe);

        interrupted_at(&s, PHASE_ACT);
        assert_int_equal(idem_store_new(&opt, &st), 0);
        owned_call(st, s.mid, "act_001", "sent", true);
        owned_call(st, "mnd_other_000000000000", "act_001", "elsewhere", false);
        owned_call(st, s.mid, "decide_001", "chosen", true);

        /* act's call finished, EffectsVia=kairosctl: run it again, the call replays */
        const struct recovery_decision *d = decide_with(&s, st, &es, &ix, &em, &dr);
        assert_int_equal(evidence_index_size(ix), 3);
        assert_int_equal(em.ev.nsteps, 2);
        assert_int_equal(d->verdict.kind, VERDICT_SAFE_TO_RETRY);
        assert_string_equal(d->verdict.reason, "effects_journaled");
        assert_true(d->has_record);
        assert_int_equal(d->record.op, WAL_OP_RESET);
        assert_non_null(d->record.evidence_json);
        assert_non_null(strstr(d->record.evidence_json,
                               "\"reason\":\"effects_journaled\",\"status\":\"executing\","
                               "\"tool_calls\":[{\"key\":\"cmd:sent\",\"tool\":\"cmd\","
                               "\"state\":\"completed\",\"attempt\":1,"
                               "\"started\":\"2026-04-20T12:00:00.123Z\"}]"));
        decide_recovery_release(&dr);
        evidence_mandate_release(&em);
        evidence_index_free(ix);

        /* a store that is not known (not loaded, quarantined): no promise holds */
        d = decide_with(&s, NULL, &es, &ix, &em, &dr);
        assert_int_equal(d->verdict.kind, VERDICT_MANUAL_REVIEW);
        assert_string_equal(d->verdict.reason, "interrupted_during_execution");
        decide_recovery_release(&dr);
        evidence_mandate_release(&em);
        evidence_index_free(ix);

        /* a call of act still open: review, with that call (not the finished one) */
        owned_call(st, s.mid, "act_001", "half", false);
        d = decide_with(&s, st, &es, &ix, &em, &dr);
        assert_int_equal(d->verdict.kind, VERDICT_MANUAL_REVIEW);
        assert_string_equal(d->verdict.reason, "tool_call_interrupted");
        assert_non_null(strstr(d->record.evidence_json, "\"key\":\"cmd:half\""));
        assert_null(strstr(d->record.evidence_json, "cmd:sent"));
        assert_int_equal(dr.mandate, DECIDE_MANDATE_PAUSED_REVIEW);
        decide_recovery_release(&dr);
        evidence_mandate_release(&em);
        evidence_index_free(ix);

        /* no EffectsVia=: the WAL's word; a Probe= would be asked */
        sc.effects_via = EFFECTS_VIA_NONE;
        sc.probe = cmd;
        evidence_schedule_from_config(&sc, &es);
        idem_store_free(st);
        assert_int_equal(idem_store_new(&opt, &st), 0);
        assert_int_equal(evidence_index_build(st, &ix), 0);
        assert_int_equal(evidence_for_mandate(ix, s.mid, &es, &em), 0);
        assert_true(em.ev.has_probe);
        assert_int_equal(decide_recover(s.f, false, &em.ev, &dr), 0);
        assert_int_equal(dr.mandate, DECIDE_MANDATE_PROBING);
        assert_string_equal(dr.probe_step, "act_001");
        decide_recovery_release(&dr);
        evidence_mandate_release(&em);
        evidence_index_free(ix);

        /* with Probe=, a call of the step cut off is the probe's to decide
         * too, before a human */
        owned_call(st, s.mid, "act_001", "cut", false);
        assert_int_equal(evidence_index_build(st, &ix), 0);
        assert_int_equal(evidence_for_mandate(ix, s.mid, &es, &em), 0);
        assert_true(em.ev.has_probe);
        assert_int_equal(em.ev.steps[0].idem_open, 1);
        assert_int_equal(decide_recover(s.f, false, &em.ev, &dr), 0);
        assert_int_equal(dr.mandate, DECIDE_MANDATE_PROBING);
        assert_string_equal(dr.probe_step, "act_001");
        decide_recovery_release(&dr);
        evidence_mandate_release(&em);
        evidence_index_free(ix);
        idem_store_free(st);
        assert_int_equal(idem_store_new(&opt, &st), 0);

        /* Effects= without act: act is re-runnable */
        sc.effects = 1u << PHASE_REFLECT;
        evidence_schedule_from_config(&sc, &es);
        d = decide_with(&s, st, &es, &ix, &em, &dr);
        assert_string_equal(d->verdict.reason, "declared_rerunnable");
        assert_non_null(strstr(d->record.evidence_json, "\"phase\":\"act\""));
        decide_recovery_release(&dr);
        evidence_mandate_release(&em);
        evidence_index_free(ix);

        idem_store_free(st);
        sim_free(&s);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_first_cycle),
                cmocka_unit_test(test_no_mandate_record_pauses),
                cmocka_unit_test(test_schedule_missing_or_unknown_pauses),
                cmocka_unit_test(test_no_command_completes_without_executing),
                cmocka_unit_test(test_all_completed_finalizes_succeeded),
                cmocka_unit_test(test_failed_step_finalizes_failed),
                cmocka_unit_test(test_failed_step_retried),
                cmocka_unit_test(test_abandoned_step_finalizes_failed),
                cmocka_unit_test(test_failed_cycle_then_next_then_terminated),
                cmocka_unit_test(test_reflect_done_ends),
                cmocka_unit_test(test_succeeded_cycle_starts_next_until_max),
                cmocka_unit_test(test_approval),
                cmocka_unit_test(test_approval_default_reason),
                cmocka_unit_test(test_review_and_reset),
                cmocka_unit_test(test_abandoned_plan_ends),
                cmocka_unit_test(test_orphan_plan_is_not_the_last),
                cmocka_unit_test(test_corrupt_and_bad_arguments),
                cmocka_unit_test(test_feed_partial_line_waits),
                cmocka_unit_test(test_incremental_equals_whole),
                cmocka_unit_test(test_names),
                cmocka_unit_test(test_recover_remove_unacknowledged),
                cmocka_unit_test(test_recover_plan_kept_and_corrupt),
                cmocka_unit_test(test_recover_wal_alone_pauses),
                cmocka_unit_test(test_recover_evidence_sources),
                cmocka_unit_test(test_recover_open_call_checks),
                cmocka_unit_test(test_recover_probe_done_completes),
                cmocka_unit_test(test_recover_awaits_probe),
                cmocka_unit_test(test_recover_evidence_from_store),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
