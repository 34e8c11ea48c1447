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

#include "kairos/fold.h"
#include "kairos/kbuf.h"
#include "kairos/recovery.h"
#include "kairos/wal.h"

#define T0 1776686400123LL

static const struct wal_step STEPS3[] = {
        { "observe_001", "ooda.observe", "ph-o", "pre-o", "post-o" },
        { "act_001", "ooda.act", "ph-a", "pre-a", "post-a" },
        { "reflect_001", "ooda.reflect", "ph-r", "pre-r", "post-r" },
};

/* A small WAL writer into a buffer. */
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

static void commit(struct w *w, const char *plan_id, long long cycle, const struct wal_step *st, size_t n)
{
        struct wal_record r = { .op = WAL_OP_PLAN_COMMIT, .plan_id = plan_id, .mandate_id = "mnd_t",
                                .cycle = cycle, .steps = st, .nsteps = n };
        put(w, &r);
}

static void pending(struct w *w, const char *sid, const char *pid)
{
        char key[128];
        snprintf(key, sizeof(key), "mnd_t/%s", sid);
        struct wal_record r = { .op = WAL_OP_APPEND, .step_id = sid, .plan_id = pid, .idem_key = key };
        put(w, &r);
}

static void executing(struct w *w, const char *sid, const char *pre)
{
        struct wal_record r = { .op = WAL_OP_EXECUTING, .step_id = sid, .pre_hash = pre };
        put(w, &r);
}

static void completed(struct w *w, const char *sid)
{
        char post[64], rh[64];
        snprintf(post, sizeof(post), "post-%s", sid);
        snprintf(rh, sizeof(rh), "rh-%s", sid);
        struct wal_record r = { .op = WAL_OP_COMPLETED, .step_id = sid, .post_hash = post,
                                .result_hash = rh, .result_json = "{\"v\":1}" };
        put(w, &r);
}

/* Run a step to completion. */
static void run_ok(struct w *w, const char *sid, const char *pid)
{
        pending(w, sid, pid);
        executing(w, sid, "obs");
        completed(w, sid);
}

static void finalize(struct w *w, const char *pid, enum plan_status status)
{
        struct wal_record r = { .op = WAL_OP_FINALIZE, .plan_id = pid, .status = status };
        put(w, &r);
}

static struct fold *fold_w(const struct w *w)
{
        struct fold *f = NULL;
        assert_int_equal(fold_buffer(w->b.data, w->b.len, &f), 0);
        assert_int_not_equal(f->status, FOLD_CORRUPT);
        return f;
}

static struct recovery *plan_w(const struct w *w, struct fold **fp)
{
        struct recovery *r = NULL;
        *fp = fold_w(w);
        assert_int_equal(recovery_plan_fold(*fp, &r), 0);
        assert_non_null(r);
        return r;
}

/* Append every record of r to the WAL, as the daemon would. */
static void apply(struct w *w, const struct recovery *r)
{
        size_t n = recovery_record_count(r);
        for (size_t i = 0; i < n; i++) {
                const struct wal_record *rec = recovery_record_at(r, i);
                assert_non_null(rec);
                put(w, rec);
        }
        assert_null(recovery_record_at(r, n));
}

static const char *step_of(const struct fold *f, size_t idx)
{
        return f->steps[idx].step_id;
}

/* Apply the records, plan again: no new records, and the same outcome for
 * plans that stay open (recovery run twice gives the same answer). */
static void check_idempotent(struct w *w, const struct fold *f, const struct recovery *r)
{
        apply(w, r);
        struct fold *f2;
        struct recovery *r2 = plan_w(w, &f2);
        size_t open = 0;

        assert_int_equal(recovery_record_count(r2), 0);
        for (size_t i = 0; i < r->nplans; i++) {
                const struct recovery_plan *a = &r->plans[i];
                if (a->outcome != RECOVERY_RESUME && a->outcome != RECOVERY_PAUSED_REVIEW) {
                        /* finalized now */
                        assert_true(f2->plans[a->plan].finalized);
                        continue;
                }
                assert_true(open < r2->nplans);
                const struct recovery_plan *b = &r2->plans[open++];
                assert_string_equal(f2->plans[b->plan].plan_id, f->plans[a->plan].plan_id);
                assert_int_equal(b->outcome, a->outcome);
                if (a->outcome == RECOVERY_RESUME) {
                        assert_string_equal(step_of(f2, b->resume_step), step_of(f, a->resume_step));
                } else {
                        assert_string_equal(b->pause_step, a->pause_step);
                        assert_string_equal(b->pause_reason, a->pause_reason);
                }
        }
        assert_int_equal(r2->nplans, open);
        recovery_free(r2);
        fold_free(f2);
}

/* ------------------------------------------------------------ verdict kinds */

static void test_already_done_recorded(void **state)
{
        (void)state;
        struct w w = { KBUF_INIT, 0 };
        commit(&w, "plan_a", 1, STEPS3, 3);
        run_ok(&w, "observe_001", "plan_a");
        run_ok(&w, "act_001", "plan_a");
        /* completed, then marked for review: the WAL holds its post_hash */
        struct wal_record nr = { .op = WAL_OP_NEEDS_REVIEW, .step_id = "act_001", .reason = "odd" };
        put(&w, &nr);
        run_ok(&w, "reflect_001", "plan_a");

        struct fold *f;
        struct recovery *r = plan_w(&w, &f);
        assert_int_equal(r->nplans, 1);
        const struct recovery_plan *rp = &r->plans[0];
        assert_int_equal(rp->outcome, RECOVERY_FINALIZED_SUCCEEDED);
        assert_int_equal(rp->ndecisions, 1);
        const struct recovery_decision *d = &rp->decisions[0];
        assert_string_equal(step_of(f, d->step), "act_001");
        assert_int_equal(d->verdict.kind, VERDICT_ALREADY_DONE);
        assert_int_equal(d->verdict.row, 1);
        assert_true(d->has_record);
        assert_int_equal(d->record.op, WAL_OP_COMPLETED);
        assert_string_equal(d->record.step_id, "act_001");
        assert_true(d->record.recovered);
        assert_string_equal(d->record.post_hash, "post-act_001");
        assert_string_equal(d->record.result_hash, "rh-act_001");
        assert_string_equal(d->record.evidence_json,
                            "{\"reason\":\"wal_recorded_completion\",\"result_hash\":\"rh-act_001\"}");
        assert_true(rp->has_finalize);
        assert_int_equal(rp->finalize.op, WAL_OP_FINALIZE);
        assert_string_equal(rp->finalize.plan_id, "plan_a");
        assert_int_equal(rp->finalize.status, PLAN_SUCCEEDED);
        assert_int_equal(recovery_record_count(r), 2);
        assert_ptr_equal(recovery_record_at(r, 0), &d->record);
        assert_ptr_equal(recovery_record_at(r, 1), &rp->finalize);

        check_idempotent(&w, f, r);
        /* the recovered completion folds as one */
        struct fold *f2 = fold_w(&w);
        const struct fold_step *s = fold_find_step(f2, "act_001");
        assert_string_equal(s->status, "completed");
        assert_true(s->recovered);
        assert_string_equal(s->evidence_json,
                            "{\"reason\":\"wal_recorded_completion\",\"result_hash\":\"rh-act_001\"}");
        assert_true(f2->plans[0].finalized);
        assert_string_equal(f2->plans[0].final_status, "succeeded");
        fold_free(f2);
        recovery_free(r);
        fold_free(f);
        kbuf_free(&w.b);
}

static void test_never_started_resumes(void **state)
{
        (void)state;
        struct w w = { KBUF_INIT, 0 };
        commit(&w, "plan_a", 1, STEPS3, 3);
        run_ok(&w, "observe_001", "plan_a");
        pending(&w, "act_001", "plan_a");

        struct fold *f;
        struct recovery *r = plan_w(&w, &f);
        assert_int_equal(r->nplans, 1);
        const struct recovery_plan *rp = &r->plans[0];
        assert_int_equal(rp->outcome, RECOVERY_RESUME);
        assert_string_equal(step_of(f, rp->resume_step), "act_001");
        assert_int_equal(rp->ndecisions, 1); /* reflect_001 is never examined */
        assert_int_equal(rp->decisions[0].verdict.kind, VERDICT_SAFE_TO_RETRY);
        assert_int_equal(rp->decisions[0].verdict.row, 4);
        assert_false(rp->decisions[0].has_record);
        assert_false(rp->has_finalize);
        assert_int_equal(recovery_record_count(r), 0);

        check_idempotent(&w, f, r);
        recovery_free(r);
        fold_free(f);
        kbuf_free(&w.b);
}

static void test_plan_without_appends_resumes_at_first_step(void **state)
{
        (void)state;
        struct w w = { KBUF_INIT, 0 };
        commit(&w, "plan_a", 1, STEPS3, 3);

        struct fold *f;
        struct recovery *r = plan_w(&w, &f);
        assert_int_equal(r->plans[0].outcome, RECOVERY_RESUME);
        assert_string_equal(step_of(f, r->plans[0].resume_step), "observe_001");
        recovery_free(r);
        fold_free(f);
        kbuf_free(&w.b);
}

static void test_interrupted_pauses(void **state)
{
        (void)state;
        struct w w = { KBUF_INIT, 0 };
        commit(&w, "plan_a", 1, STEPS3, 3);
        run_ok(&w, "observe_001", "plan_a");
        pending(&w, "act_001", "plan_a");
        executing(&w, "act_001", "obs-a");

        struct fold *f;
        struct recovery *r = plan_w(&w, &f);
        const struct recovery_plan *rp = &r->plans[0];
        assert_int_equal(rp->outcome, RECOVERY_PAUSED_REVIEW);
        assert_string_equal(rp->pause_step, "act_001");
        assert_string_equal(rp->pause_reason, "interrupted_during_execution");
        assert_int_equal(rp->ndecisions, 1);
        const struct recovery_decision *d = &rp->decisions[0];
        assert_int_equal(d->verdict.kind, VERDICT_MANUAL_REVIEW);
        assert_int_equal(d->verdict.row, 6);
        assert_true(d->has_record);
        assert_int_equal(d->record.op, WAL_OP_NEEDS_REVIEW);
        assert_string_equal(d->record.step_id, "act_001");
        assert_string_equal(d->record.reason, "interrupted_during_execution");
        assert_string_equal(d->record.evidence_json,
                            "{\"reason\":\"interrupted_during_execution\",\"status\":\"executing\","
                            "\"observed_pre_hash\":\"obs-a\",\"expected_pre_hash\":\"pre-a\"}");
        assert_false(rp->has_finalize);
        assert_int_equal(recovery_record_count(r), 1);

        check_idempotent(&w, f, r);
        recovery_free(r);
        fold_free(f);
        kbuf_free(&w.b);
}

static void test_already_needs_review_no_duplicate(void **state)
{
        (void)state;
        struct w w = { KBUF_INIT, 0 };
        commit(&w, "plan_a", 1, STEPS3, 3);
        pending(&w, "observe_001", "plan_a");
        struct wal_record nr = { .op = WAL_OP_NEEDS_REVIEW, .step_id = "observe_001", .reason = "operator_hold" };
        put(&w, &nr);

        struct fold *f;
        struct recovery *r = plan_w(&w, &f);
        const struct recovery_plan *rp = &r->plans[0];
        assert_int_equal(rp->outcome, RECOVERY_PAUSED_REVIEW);
        assert_string_equal(rp->pause_step, "observe_001");
        assert_string_equal(rp->pause_reason, "operator_hold");
        assert_int_equal(rp->decisions[0].verdict.row, 3);
        assert_false(rp->decisions[0].has_record);
        assert_int_equal(recovery_record_count(r), 0);
        recovery_free(r);
        fold_free(f);

        /* without a recorded reason the verdict's reason is given */
        kbuf_free(&w.b);
        w.ts = 0;
        commit(&w, "plan_a", 1, STEPS3, 1);
        nr.reason = NULL;
        put(&w, &nr);
        r = plan_w(&w, &f);
        assert_string_equal(r->plans[0].pause_reason, "explicitly_marked_needs_review");
        recovery_free(r);
        fold_free(f);
        kbuf_free(&w.b);
}

/* A step a graceful stop killed is decided as one a crash cut off: the same
 * evidence; the stop's record stands when nothing beyond the WAL decides. */
static void test_stopped_step_decided_by_evidence(void **state)
{
        (void)state;
        struct w w = { KBUF_INIT, 0 };
        commit(&w, "plan_a", 1, STEPS3, 3);
        run_ok(&w, "observe_001", "plan_a");
        pending(&w, "act_001", "plan_a");
        executing(&w, "act_001", "obs-a");
        struct wal_record nr = { .op = WAL_OP_NEEDS_REVIEW, .step_id = "act_001",
                                 .reason = RECOVERY_KILLED_AT_SHUTDOWN,
                                 .evidence_json = "{\"reason\":\"killed_at_shutdown\"}" };
        put(&w, &nr);

        /* the WAL alone: paused as the stop left it, no second record */
        struct fold *f;
        struct recovery *r = plan_w(&w, &f);
        assert_true(recovery_step_stopped(fold_find_step(f, "act_001")));
        assert_true(recovery_step_interrupted(fold_find_step(f, "act_001")));
        assert_false(recovery_step_stopped(fold_find_step(f, "observe_001")));
        const struct recovery_plan *rp = &r->plans[0];
        assert_int_equal(rp->outcome, RECOVERY_PAUSED_REVIEW);
        assert_string_equal(rp->pause_reason, "killed_at_shutdown");
        assert_int_equal(rp->decisions[0].verdict.row, 6);
        assert_false(rp->decisions[0].has_record);
        assert_string_equal(rp->decisions[0].verdict.extra_json, "\"killed_at_shutdown\":true");
        recovery_free(r);

        /* act is not in Effects=: run again, the reset says why and that a
         * stop killed it */
        struct recovery_evidence ev = { .effects = 1u << PHASE_OBSERVE };
        for (int i = 0; i < PLANNER_PHASES; i++)
                ev.has_command[i] = true;
        assert_int_equal(recovery_plan_fold_evidence(f, &ev, &r), 0);
        rp = &r->plans[0];
        assert_int_equal(rp->outcome, RECOVERY_RESUME);
        assert_true(rp->decisions[0].has_record);
        assert_int_equal(rp->decisions[0].record.op, WAL_OP_RESET);
        assert_string_equal(rp->decisions[0].record.evidence_json,
                            "{\"reason\":\"declared_rerunnable\",\"status\":\"needs_review\","
                            "\"phase\":\"act\",\"killed_at_shutdown\":true}");
        apply(&w, r);
        recovery_free(r);
        fold_free(f);
        f = fold_w(&w);
        assert_int_equal(fold_find_step(f, "act_001")->state, STEP_PENDING);
        assert_false(recovery_step_interrupted(fold_find_step(f, "act_001")));
        fold_free(f);

        /* a review recorded for another reason is a human's, as before */
        kbuf_free(&w.b);
        w.ts = 0;
        commit(&w, "plan_a", 1, STEPS3, 3);
        pending(&w, "observe_001", "plan_a");
        executing(&w, "observe_001", "obs-o");
        nr.step_id = "observe_001";
        nr.reason = "interrupted_during_execution";
        put(&w, &nr);
        f = fold_w(&w);
        assert_false(recovery_step_stopped(fold_find_step(f, "observe_001")));
        assert_int_equal(recovery_plan_fold_evidence(f, &ev, &r), 0);
        assert_int_equal(r->plans[0].outcome, RECOVERY_PAUSED_REVIEW);
        assert_int_equal(r->plans[0].decisions[0].verdict.row, 3);
        assert_int_equal(recovery_record_count(r), 0);
        recovery_free(r);
        fold_free(f);
        kbuf_free(&w.b);
}

static void test_failed_step_finalizes_failed(void **state)
{
        (void)state;
        struct w w = { KBUF_INIT, 0 };
        commit(&w, "plan_a", 1, STEPS3, 3);
        run_ok(&w, "observe_001", "plan_a");
        pending(&w, "act_001", "plan_a");
        executing(&w, "act_001", "obs-a");
        struct wal_record fr = { .op = WAL_OP_FAILED, .step_id = "act_001", .error_class = "E",
                                 .error_msg = "exit 1" };
        put(&w, &fr);

        struct fold *f;
        struct recovery *r = plan_w(&w, &f);
        const struct recovery_plan *rp = &r->plans[0];
        assert_int_equal(rp->outcome, RECOVERY_FINALIZED_FAILED);
        assert_int_equal(rp->ndecisions, 0); /* no verdicts: later steps never run */
        assert_true(rp->has_finalize);
        assert_string_equal(rp->finalize.plan_id, "plan_a");
        assert_int_equal(rp->finalize.status, PLAN_FAILED);
        assert_string_equal(rp->finalize.reason, "step_failed");
        assert_int_equal(recovery_record_count(r), 1);

        check_idempotent(&w, f, r);
        struct fold *f2 = fold_w(&w);
        assert_string_equal(f2->plans[0].final_reason, "step_failed");
        fold_free(f2);
        recovery_free(r);
        fold_free(f);
        kbuf_free(&w.b);
}

static void test_all_completed_finalizes_succeeded(void **state)
{
        (void)state;
        struct w w = { KBUF_INIT, 0 };
        commit(&w, "plan_a", 1, STEPS3, 3);
        run_ok(&w, "observe_001", "plan_a");
        run_ok(&w, "act_001", "plan_a");
        run_ok(&w, "reflect_001", "plan_a");

        struct fold *f;
        struct recovery *r = plan_w(&w, &f);
        const struct recovery_plan *rp = &r->plans[0];
        assert_int_equal(rp->outcome, RECOVERY_FINALIZED_SUCCEEDED);
        assert_int_equal(rp->ndecisions, 0);
        assert_int_equal(rp->finalize.status, PLAN_SUCCEEDED);
        assert_null(rp->finalize.reason);
        check_idempotent(&w, f, r);
        recovery_free(r);
        fold_free(f);
        kbuf_free(&w.b);
}

/* ------------------------------------------------------------ probes */

struct probe_ctx {
        const char *pre;
        const char *post;
        char buf[64];
        int calls;
};

static void probe(void *ctx, const struct fold_step *s, const char **pre, const char **post)
{
        struct probe_ctx *p = ctx;
        p->calls++;
        /* a buffer the probe reuses: the planner must copy */
        snprintf(p->buf, sizeof(p->buf), "%s", p->post ? p->post : "");
        *pre = p->pre;
        *post = p->post ? p->buf : NULL;
        (void)s;
}

static void test_probe_current_pre_resets(void **state)
{
        (void)state;
        struct w w = { KBUF_INIT, 0 };
        commit(&w, "plan_a", 1, STEPS3, 3);
        run_ok(&w, "observe_001", "plan_a");
        pending(&w, "act_001", "plan_a");
        executing(&w, "act_001", "pre-a");

        struct fold *f = fold_w(&w);
        struct probe_ctx pc = { .pre = "pre-a" };
        struct recovery *r = NULL;
        assert_int_equal(recovery_plan_fold_probe(f, probe, &pc, &r), 0);
        assert_int_equal(pc.calls, 1);
        const struct recovery_plan *rp = &r->plans[0];
        assert_int_equal(rp->outcome, RECOVERY_RESUME);
        assert_string_equal(step_of(f, rp->resume_step), "act_001");
        assert_int_equal(rp->decisions[0].verdict.row, 5);
        assert_true(rp->decisions[0].has_record);
        assert_int_equal(rp->decisions[0].record.op, WAL_OP_RESET);
        assert_string_equal(rp->decisions[0].record.step_id, "act_001");

        /* the reset makes the step plainly retryable, without a probe */
        check_idempotent(&w, f, r);
        struct fold *f2 = fold_w(&w);
        const struct fold_step *s = fold_find_step(f2, "act_001");
        assert_null(s->observed_pre_hash);
        assert_int_equal(s->resets, 1);
        fold_free(f2);
        recovery_free(r);
        fold_free(f);
        kbuf_free(&w.b);
}

static void test_probe_current_post_completes(void **state)
{
        (void)state;
        struct w w = { KBUF_INIT, 0 };
        commit(&w, "plan_a", 1, STEPS3, 2);
        run_ok(&w, "observe_001", "plan_a");
        pending(&w, "act_001", "plan_a");
        executing(&w, "act_001", "obs-a");

        struct fold *f = fold_w(&w);
        struct probe_ctx pc = { .post = "post-a" };
        struct recovery *r = NULL;
        assert_int_equal(recovery_plan_fold_probe(f, probe, &pc, &r), 0);
        memset(pc.buf, 'X', sizeof(pc.buf) - 1); /* the probe's buffer is gone */
        const struct recovery_plan *rp = &r->plans[0];
        assert_int_equal(rp->outcome, RECOVERY_FINALIZED_SUCCEEDED);
        assert_int_equal(rp->decisions[0].verdict.row, 2);
        assert_int_equal(rp->decisions[0].record.op, WAL_OP_COMPLETED);
        assert_string_equal(rp->decisions[0].record.post_hash, "post-a");
        assert_string_equal(rp->decisions[0].record.result_hash, ""); /* no result was recorded */
        assert_true(rp->decisions[0].record.recovered);
        assert_string_equal(rp->decisions[0].record.evidence_json,
                            "{\"reason\":\"current_state_matches_expected_post\"}");
        assert_int_equal(recovery_record_count(r), 2);
        check_idempotent(&w, f, r);
        recovery_free(r);
        fold_free(f);
        kbuf_free(&w.b);
}

/* ------------------------------------------------------------ files */

static void test_multi_plan_file(void **state)
{
        (void)state;
        static const struct wal_step s1[] = { { "observe_001", "t", "p", "pre1", "post1" },
                                              { "act_001", "t", "p", "pre2", "post2" } };
        static const struct wal_step s2[] = { { "observe_002", "t", "p", "pre3", "post3" },
                                              { "act_002", "t", "p", "pre4", "post4" } };
        static const struct wal_step s3[] = { { "observe_003", "t", "p", "pre5", "post5" },
                                              { "act_003", "t", "p", "pre6", "post6" } };
        static const struct wal_step s4[] = { { "observe_004", "t", "p", "pre7", "post7" } };
        struct w w = { KBUF_INIT, 0 };

        /* plan_1 finalized: untouched even though a step looks interrupted */
        commit(&w, "plan_1", 1, s1, 2);
        run_ok(&w, "observe_001", "plan_1");
        executing(&w, "act_001", "x");
        finalize(&w, "plan_1", PLAN_ABANDONED);
        /* plan_2: interrupted → paused */
        commit(&w, "plan_2", 2, s2, 2);
        run_ok(&w, "observe_002", "plan_2");
        pending(&w, "act_002", "plan_2");
        executing(&w, "act_002", "y");
        /* plan_3: resume at act_003 */
        commit(&w, "plan_3", 3, s3, 2);
        run_ok(&w, "observe_003", "plan_3");
        /* plan_4: failed */
        commit(&w, "plan_4", 4, s4, 1);
        struct wal_record fr = { .op = WAL_OP_FAILED, .step_id = "observe_004", .error_class = "E",
                                 .error_msg = "m" };
        put(&w, &fr);

        struct fold *f;
        struct recovery *r = plan_w(&w, &f);
        assert_int_equal(r->nplans, 3);
        assert_string_equal(f->plans[r->plans[0].plan].plan_id, "plan_2");
        assert_int_equal(r->plans[0].outcome, RECOVERY_PAUSED_REVIEW);
        assert_string_equal(r->plans[0].pause_step, "act_002");
        assert_string_equal(f->plans[r->plans[1].plan].plan_id, "plan_3");
        assert_int_equal(r->plans[1].outcome, RECOVERY_RESUME);
        assert_string_equal(step_of(f, r->plans[1].resume_step), "act_003");
        assert_string_equal(f->plans[r->plans[2].plan].plan_id, "plan_4");
        assert_int_equal(r->plans[2].outcome, RECOVERY_FINALIZED_FAILED);
        /* records in append order: plan_2's needs_review, then plan_4's finalize */
        assert_int_equal(recovery_record_count(r), 2);
        assert_int_equal(recovery_record_at(r, 0)->op, WAL_OP_NEEDS_REVIEW);
        assert_string_equal(recovery_record_at(r, 0)->step_id, "act_002");
        assert_int_equal(recovery_record_at(r, 1)->op, WAL_OP_FINALIZE);
        assert_string_equal(recovery_record_at(r, 1)->plan_id, "plan_4");
        /* the finalized plan's step was never examined */
        for (size_t i = 0; i < r->nplans; i++)
                for (size_t j = 0; j < r->plans[i].ndecisions; j++)
                        assert_string_not_equal(step_of(f, r->plans[i].decisions[j].step), "act_001");

        check_idempotent(&w, f, r);
        recovery_free(r);
        fold_free(f);
        kbuf_free(&w.b);
}

static void test_legacy_wal(void **state)
{
        (void)state;
        /* written by the original: no crc */
        const char *wal =
                "{\"op\":\"plan_commit\",\"plan_id\":\"plan_l\",\"mandate_id\":\"mnd_l\",\"cycle\":1,"
                "\"plan_hash\":\"h\",\"steps\":[{\"step_id\":\"s1\",\"tool\":\"t\",\"params_hash\":\"p\","
                "\"pre_hash\":\"pre\",\"expected_post_hash\":\"post\"},{\"step_id\":\"s2\",\"tool\":\"t\","
                "\"params_hash\":\"p\",\"pre_hash\":\"pre2\",\"expected_post_hash\":\"post2\"}],"
                "\"ts\":\"2026-04-20T12:00:00.000Z\"}\n"
                "{\"op\":\"append\",\"step_id\":\"s1\",\"plan_id\":\"plan_l\",\"idem_key\":\"k\","
                "\"status\":\"pending\",\"ts\":\"2026-04-20T12:00:00.001Z\"}\n"
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"executing\",\"pre_hash\":\"pre\","
                "\"ts\":\"2026-04-20T12:00:00.002Z\"}\n"
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"completed\",\"post_hash\":\"post\","
                "\"result_hash\":\"rh\",\"ts\":\"2026-04-20T12:00:00.003Z\"}\n"
                "{\"op\":\"append\",\"step_id\":\"s2\",\"plan_id\":\"plan_l\",\"idem_key\":\"k2\","
                "\"status\":\"pending\",\"ts\":\"2026-04-20T12:00:00.004Z\"}\n"
                "{\"op\":\"transition\",\"step_id\":\"s2\",\"status\":\"executing\",\"pre_hash\":\"pre2\","
                "\"ts\":\"2026-04-20T12:00:00.005Z\"}\n";
        struct w w = { KBUF_INIT, 0 };
        kbuf_puts(&w.b, wal);

        struct fold *f;
        struct recovery *r = plan_w(&w, &f);
        assert_int_equal(f->legacy_records, 6);
        assert_int_equal(r->nplans, 1);
        assert_int_equal(r->plans[0].outcome, RECOVERY_PAUSED_REVIEW);
        assert_string_equal(r->plans[0].pause_step, "s2");
        assert_string_equal(r->plans[0].decisions[0].record.evidence_json,
                            "{\"reason\":\"interrupted_during_execution\",\"status\":\"executing\","
                            "\"observed_pre_hash\":\"pre2\",\"expected_pre_hash\":\"pre2\"}");
        check_idempotent(&w, f, r);
        recovery_free(r);
        fold_free(f);
        kbuf_free(&w.b);
}

static void test_corrupt_refused_torn_planned(void **state)
{
        (void)state;
        struct w w = { KBUF_INIT, 0 };
        commit(&w, "plan_a", 1, STEPS3, 3);
        run_ok(&w, "observe_001", "plan_a");
        size_t end = w.b.len;
        pending(&w, "act_001", "plan_a");

        /* torn: the append is cut short; planned from the good records */
        struct fold *f = NULL;
        struct recovery *r = NULL;
        assert_int_equal(fold_buffer(w.b.data, w.b.len - 5, &f), 0);
        assert_int_equal(f->status, FOLD_TORN);
        assert_int_equal(recovery_plan_fold(f, &r), 0);
        assert_int_equal(r->plans[0].outcome, RECOVERY_RESUME);
        assert_string_equal(step_of(f, r->plans[0].resume_step), "act_001");
        recovery_free(r);
        fold_free(f);

        /* corrupt: refused */
        w.b.data[end + 3] = '#';
        completed(&w, "act_001");
        assert_int_equal(fold_buffer(w.b.data, w.b.len, &f), 0);
        assert_int_equal(f->status, FOLD_CORRUPT);
        r = (struct recovery *)1;
        assert_int_equal(recovery_plan_fold(f, &r), -EBADMSG);
        assert_null(r);
        fold_free(f);
        assert_int_equal(recovery_plan_fold(NULL, &r), -EINVAL);
        kbuf_free(&w.b);
}

static void test_orphan_plan_and_empty(void **state)
{
        (void)state;
        struct w w = { KBUF_INIT, 0 };
        pending(&w, "lost_1", "plan_gone");
        commit(&w, "plan_empty", 1, STEPS3, 0);

        struct fold *f;
        struct recovery *r = plan_w(&w, &f);
        assert_int_equal(r->nplans, 2);
        assert_string_equal(f->plans[r->plans[0].plan].orphan_reason, "orphan_steps_detected");
        assert_int_equal(r->plans[0].outcome, RECOVERY_RESUME);
        assert_int_equal(r->plans[1].outcome, RECOVERY_FINALIZED_SUCCEEDED);
        assert_int_equal(r->plans[1].ndecisions, 0);
        recovery_free(r);
        fold_free(f);

        /* nothing open: nothing to do */
        kbuf_reset(&w.b);
        r = plan_w(&w, &f);
        assert_int_equal(r->nplans, 0);
        assert_int_equal(recovery_record_count(r), 0);
        assert_null(recovery_record_at(r, 0));
        recovery_free(r);
        fold_free(f);
        recovery_free(NULL);
        kbuf_free(&w.b);
}

static void test_reused_step_id_pauses(void **state)
{
        (void)state;
        static const struct wal_step a[] = { { "s1", "t", "p", "pre", "post" } };
        struct w w = { KBUF_INIT, 0 };
        commit(&w, "plan_a", 1, a, 1);
        executing(&w, "s1", "pre");
        commit(&w, "plan_b", 2, a, 1); /* takes s1 over */
        pending(&w, "s1", "plan_b");

        struct fold *f;
        struct recovery *r = plan_w(&w, &f);
        assert_int_equal(r->nplans, 2);
        /* plan_a's s1 is interrupted, but any record would land on plan_b's s1 */
        assert_int_equal(r->plans[0].outcome, RECOVERY_PAUSED_REVIEW);
        assert_string_equal(r->plans[0].pause_step, "s1");
        assert_string_equal(r->plans[0].pause_reason, "step_id_reused");
        assert_int_equal(r->plans[0].ndecisions, 0);
        assert_int_equal(r->plans[1].outcome, RECOVERY_RESUME);
        assert_int_equal(recovery_record_count(r), 0);
        check_idempotent(&w, f, r);
        recovery_free(r);
        fold_free(f);
        kbuf_free(&w.b);
}

static void test_outcome_names(void **state)
{
        (void)state;
        assert_string_equal(recovery_outcome_name(RECOVERY_RESUME), "resume");
        assert_string_equal(recovery_outcome_name(RECOVERY_PAUSED_REVIEW), "paused_review");
        assert_string_equal(recovery_outcome_name(RECOVERY_FINALIZED_FAILED), "finalized_failed");
        assert_string_equal(recovery_outcome_name(RECOVERY_FINALIZED_SUCCEEDED), "finalized_succeeded");
}

static void test_action_text(void **state)
{
        (void)state;
        struct recovery_decision d = { .has_record = false };
        d.verdict.kind = VERDICT_SAFE_TO_RETRY;
        assert_string_equal(recovery_action_text(&d), "runs when its turn comes");
        d.verdict.kind = VERDICT_MANUAL_REVIEW;
        assert_string_equal(recovery_action_text(&d), "already marked");
        d.has_record = true;
        d.record.op = WAL_OP_COMPLETED;
        assert_string_equal(recovery_action_text(&d), "marked completed (recovered)");
        d.record.op = WAL_OP_RESET;
        assert_string_equal(recovery_action_text(&d),
                            "reset to pending, runs again with the same idem_key");
        d.record.op = WAL_OP_NEEDS_REVIEW;
        assert_string_equal(recovery_action_text(&d), "marked needs_review, mandate paused");
        d.record.op = WAL_OP_FINALIZE;
        assert_string_equal(recovery_action_text(&d), "recorded");
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_action_text),
                cmocka_unit_test(test_already_done_recorded),
                cmocka_unit_test(test_never_started_resumes),
                cmocka_unit_test(test_plan_without_appends_resumes_at_first_step),
                cmocka_unit_test(test_interrupted_pauses),
                cmocka_unit_test(test_already_needs_review_no_duplicate),
                cmocka_unit_test(test_stopped_step_decided_by_evidence),
                cmocka_unit_test(test_failed_step_finalizes_failed),
                cmocka_unit_test(test_all_completed_finalizes_succeeded),
                cmocka_unit_test(test_probe_current_pre_resets),
                cmocka_unit_test(test_probe_current_post_completes),
                cmocka_unit_test(test_multi_plan_file),
                cmocka_unit_test(test_legacy_wal),
                cmocka_unit_test(test_corrupt_refused_torn_planned),
                cmocka_unit_test(test_orphan_plan_and_empty),
                cmocka_unit_test(test_reused_step_id_pauses),
                cmocka_unit_test(test_outcome_names),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
