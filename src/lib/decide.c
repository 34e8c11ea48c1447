/* SPDX-License-Identifier: MIT */
/* decide: what a mandate does next (see kairos/decide.h).
 *
 * The live rule, first match wins:
 *   no plan yet                               start cycle 1
 *   last plan finalized abandoned             end abandoned (its reason), or
 *     cancelled when an operator cancelled it
 *   last plan finalized failed, and the one
 *     before it too                           end terminated
 *   ... failed, cycle >= MaxCycles            end failed
 *   ... failed                                start the next cycle
 *   ... otherwise, reflect said done          end done "reflect said done"
 *   ... cycle >= MaxCycles                    end done "MaxCycles reached"
 *   ... otherwise                             start the next cycle
 *   open plan, every step completed           finalize succeeded
 *   first open step failed, waiting for its
 *     retry (retry_wait), not due yet         wait until it is due
 *   ... due, its effect journaled             the evidence decides (recovery)
 *   ... due                                   run it again (below)
 *   ... its policy retries this failure and
 *     retries are left                        retry_wait (due = now + backoff)
 *   first open step failed                    finalize failed (step_failed)
 *   first open step abandoned                 finalize failed (step_abandoned)
 *   first open step needs_review / executing  review
 *   it is reflect, act asked for approval,
 *     no operator approved it                 await approval
 *   schedule unknown / not configured         pause
 *   its phase has no command                  complete it (null result)
 *   otherwise                                 run it
 * Starting a cycle without a mandate record (schedule, fired_at) pauses. */
#include "kairos/decide.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kairos/canon.h"
#include "kairos/kjson.h"
#include "kairos/kmem.h"

static const struct fold_step *plan_step(const struct fold *f, const struct fold_plan *p, size_t i)
{
        return &f->steps[p->steps[i]];
}

static const struct fold_plan *last_plan(const struct fold *f)
{
        for (size_t i = f->nplans; i-- > 0;)
                if (!f->plans[i].orphan_reason)
                        return &f->plans[i];
        return NULL;
}

/* The {"kairos":{key:…}} member of a result, parsed into ar; NULL if none. */
static const struct kjson *control_field(struct kjson_arena *ar, const char *result_json,
                                         const char *key)
{
        struct kjson *v;
        struct kjson_error err;

        if (!ar || !result_json ||
            kjson_parse(ar, result_json, strlen(result_json), &v, &err) < 0 ||
            v->type != KJSON_OBJECT)
                return NULL;
        const struct kjson *k = kjson_get(v, "kairos");
        if (!k || k->type != KJSON_OBJECT)
                return NULL;
        return kjson_get(k, key);
}

static const char *reflect_result(const struct fold *f, const struct fold_plan *p)
{
        if (!p || p->nsteps < PLANNER_PHASES)
                return NULL;
        const struct fold_step *s = plan_step(f, p, PHASE_REFLECT);
        return s->state == STEP_COMPLETED ? s->result_json : NULL;
}

/* Consecutive failed plans at the end of the WAL. */
static unsigned trailing_failed(const struct fold *f)
{
        unsigned n = 0;
        for (size_t i = f->nplans; i-- > 0;) {
                const struct fold_plan *p = &f->plans[i];
                if (p->orphan_reason)
                        continue;
                if (!p->finalized || p->final_state != PLAN_FAILED)
                        break;
                n++;
        }
        return n;
}

static bool approved(const struct fold *f, const char *act_step)
{
        for (size_t i = 0; i < f->noperators; i++) {
                const struct fold_operator *o = &f->operators[i];
                if (o->action && strcmp(o->action, "approve") == 0 && o->step_id &&
                    strcmp(o->step_id, act_step) == 0)
                        return true;
        }
        return false;
}

static void set_end(struct decide_next *n, enum decide_end e, const char *reason)
{
        n->kind = DECIDE_END;
        n->end = e;
        n->reason = reason;
}

static void set_pause(struct decide_next *n, const char *reason)
{
        n->kind = DECIDE_PAUSE;
        n->reason = reason;
}

static void start_cycle(const struct decide_input *in, long long cycle, struct decide_next *n)
{
        if (!in->schedule || !in->fired_at) {
                set_pause(n, "no mandate record: schedule unknown, cannot plan a new cycle");
                return;
        }
        if (cycle > PLANNER_MAX_CYCLE ||
            planner_build_retry(in->schedule, in->fired_at, in->retry, (int)cycle,
                                &n->new_plan) < 0) {
                set_pause(n, "cannot plan the next cycle");
                return;
        }
        const struct planner_plan *p = &n->new_plan;
        for (int i = 0; i < PLANNER_PHASES; i++)
                n->wsteps[i] = (struct wal_step){ p->steps[i].step_id, p->steps[i].tool,
                                                  p->steps[i].params_hash, p->steps[i].pre_hash,
                                                  p->steps[i].expected_post_hash };
        n->kind = DECIDE_START_CYCLE;
        n->again = true;
        n->cycle = cycle;
        n->plan_id = p->plan_id;
        n->records[0] = (struct wal_record){ .op = WAL_OP_PLAN_COMMIT, .plan_id = p->plan_id,
                                             .mandate_id = p->mandate_id, .cycle = p->cycle,
                                             .steps = n->wsteps, .nsteps = PLANNER_PHASES };
        n->nrecords = 1;
}

static void finalize(const struct fold_plan *p, enum plan_status status, const char *reason,
                     struct decide_next *n)
{
        n->kind = DECIDE_FINALIZE;
        n->again = true;
        n->cycle_finished = true;
        n->reason = reason;
        n->records[0] = (struct wal_record){ .op = WAL_OP_FINALIZE, .plan_id = p->plan_id,
                                             .status = status, .reason = reason };
        n->nrecords = 1;
}

static void decide_finalized(const struct fold *f, const struct decide_input *in,
                             const struct fold_plan *last, struct kjson_arena *ar,
                             struct decide_next *n)
{
        long long max = in->max_cycles ? (long long)in->max_cycles : 1;

        switch (last->final_state) {
        case PLAN_ABANDONED: {
                bool cancelled = false;
                for (size_t i = 0; i < f->noperators; i++)
                        cancelled |= f->operators[i].action &&
                                     strcmp(f->operators[i].action, "cancel") == 0;
                set_end(n, cancelled ? DECIDE_END_CANCELLED : DECIDE_END_ABANDONED,
                        last->final_reason);
                return;
        }
        default: {
                /* failed: two in a row end it; else reflect may say done */
                bool failed = last->final_state == PLAN_FAILED;
                const struct kjson *done =
                        failed ? NULL : control_field(ar, reflect_result(f, last), "done");
                if (failed && trailing_failed(f) >= 2)
                        set_end(n, DECIDE_END_TERMINATED, "two consecutive failed cycles");
                else if (done && done->type == KJSON_TRUE)
                        set_end(n, DECIDE_END_DONE, "reflect said done");
                else if (last->cycle >= max)
                        set_end(n, failed ? DECIDE_END_FAILED : DECIDE_END_DONE,
                                failed ? "the last cycle failed" : "MaxCycles reached");
                else
                        start_cycle(in, last->cycle + 1, n);
                return;
        }
        }
}

/* The act result asks for approval that no operator gave: the reason. */
static bool awaits_approval(const struct fold *f, const struct fold_plan *p, struct kjson_arena *ar,
                            struct decide_next *n)
{
        if (p->nsteps <= PHASE_ACT)
                return false;
        const struct fold_step *act = plan_step(f, p, PHASE_ACT);
        const struct kjson *pause = control_field(ar, act->result_json, "pause");
        if (!pause || approved(f, act->step_id))
                return false;
        const struct kjson *why = control_field(ar, act->result_json, "reason");
        snprintf(n->reason_buf, sizeof n->reason_buf, "%s",
                 why && why->type == KJSON_STRING ? why->u.str.ptr : "awaiting_approval");
        n->kind = DECIDE_AWAIT_APPROVAL;
        n->reason = n->reason_buf;
        n->step_id = act->step_id;
        return true;
}

static int decide_open(const struct fold *f, const struct decide_input *in,
                       const struct fold_plan *last, struct kjson_arena *ar,
                       struct decide_next *n)
{
        size_t idx = last->nsteps;
        for (size_t i = 0; i < last->nsteps; i++)
                if (plan_step(f, last, i)->state != STEP_COMPLETED) {
                        idx = i;
                        break;
                }
        if (idx == last->nsteps) {
                finalize(last, PLAN_SUCCEEDED, NULL, n);
                return 0;
        }
        const struct fold_step *s = plan_step(f, last, idx);
        const struct retry_policy *rp =
                in->retry_policy && idx < PLANNER_PHASES ? &in->retry_policy[idx] : NULL;
        switch (s->state) {
        case STEP_FAILED:
                if (s->retry_waiting) {
                        if (in->now_ms >= s->retry_due_ms &&
                            idx < PLANNER_PHASES && (in->retry_evidence_phases & (1u << idx))) {
                                n->kind = DECIDE_RETRY_EVIDENCE;
                                n->step_id = s->step_id;
                                n->phase = (int)idx;
                                return 0;
                        }
                        if (in->now_ms >= s->retry_due_ms)
                                break; /* due: run it again below */
                        n->kind = DECIDE_RETRY_WAIT;
                        n->step_id = s->step_id;
                        n->due_ms = s->retry_due_ms;
                        return 0;
                }
                if (in->schedule_known && rp && s->retries < rp->attempts &&
                    retry_matches(rp, s->error_class, s->error_msg)) {
                        n->kind = DECIDE_RETRY_WAIT;
                        n->again = true;
                        n->step_id = s->step_id;
                        n->due_ms = in->now_ms +
                                    (long long)retry_delay_ms(rp, s->retries + 1, in->jitter_rand);
                        n->records[0] = (struct wal_record){
                                .op = WAL_OP_RETRY_WAIT, .step_id = s->step_id,
                                .attempt = s->executions ? s->executions : 1,
                                .error_class = s->error_class, .due_ms = n->due_ms
                        };
                        n->nrecords = 1;
                        return 0;
                }
                finalize(last, PLAN_FAILED, "step_failed", n);
                return 0;
        case STEP_ABANDONED:
                finalize(last, PLAN_FAILED, "step_abandoned", n);
                return 0;
        case STEP_NEEDS_REVIEW:
        case STEP_EXECUTING:
                n->kind = DECIDE_REVIEW;
                n->step_id = s->step_id;
                n->reason = s->reason ? s->reason : "needs_review";
                return 0;
        default:
                break;
        }
        if (idx == PHASE_REFLECT && awaits_approval(f, last, ar, n))
                return 0;
        if (!in->schedule_known) {
                set_pause(n, in->schedule ? "schedule_missing: not in the configuration"
                                          : "schedule_unknown: the WAL has no mandate record");
                return 0;
        }
        n->step = last->steps[idx];
        n->step_id = s->step_id;
        n->phase = idx < PLANNER_PHASES ? (int)idx : -1;
        n->attempt = s->executions + 1;
        n->expected_post = s->expected_post_hash ? s->expected_post_hash : "";
        snprintf(n->idem_key_buf, sizeof n->idem_key_buf, "%s/%s",
                 in->mandate_id ? in->mandate_id : "", s->step_id);
        n->idem_key = n->idem_key_buf;
        n->records[0] = (struct wal_record){ .op = WAL_OP_APPEND, .step_id = s->step_id,
                                             .plan_id = last->plan_id, .idem_key = n->idem_key };
        n->nrecords = 2;
        if (n->phase >= 0 && !in->has_command[n->phase]) {
                /* Nothing runs: the step completes at once with a null result.
                 * No executing record — no handler ran, so a crash can never
                 * leave this step "interrupted during execution". */
                /* (the same hash every time: computed once per thread;
                 * start-up recovery decides this for every WAL) */
                static _Thread_local char null_hash[CANON_HASH_STRLEN];
                if (!null_hash[0]) {
                        int r = canon_hash_json("null", 4, null_hash, NULL);
                        if (r < 0) {
                                null_hash[0] = '\0';
                                return r;
                        }
                }
                memcpy(n->hash_buf, null_hash, sizeof n->hash_buf);
                n->kind = DECIDE_COMPLETE_STEP;
                n->again = true;
                n->records[1] = (struct wal_record){ .op = WAL_OP_COMPLETED, .step_id = s->step_id,
                                                     .post_hash = n->expected_post,
                                                     .result_hash = n->hash_buf,
                                                     .result_json = "null" };
                return 0;
        }
        n->kind = DECIDE_RUN_STEP;
        n->records[1] = (struct wal_record){ .op = WAL_OP_EXECUTING, .step_id = s->step_id,
                                             .pre_hash = s->pre_hash ? s->pre_hash : "" };
        return 0;
}

int decide_next(const struct fold *f, const struct decide_input *in, struct decide_next *n)
{
        if (!f || !in || !n)
                return -EINVAL;
        memset(n, 0, offsetof(struct decide_next, idem_key_buf));
        n->kind = DECIDE_NOTHING;
        n->phase = -1;
        if (f->status == FOLD_CORRUPT)
                return -EBADMSG;

        const struct fold_plan *last = last_plan(f);
        if (!last) {
                start_cycle(in, 1, n);
                return 0;
        }
        n->cycle = last->cycle;
        n->plan_id = last->plan_id;
        n->plan = (size_t)(last - f->plans);

        struct kjson_arena *ar = kjson_arena_new();
        if (!ar)
                return -ENOMEM;
        int r = 0;
        if (last->finalized)
                decide_finalized(f, in, last, ar, n);
        else
                r = decide_open(f, in, last, ar, n);
        /* reasons parsed from results were copied into reason_buf */
        kjson_arena_free(ar);
        return r;
}

const char *decide_kind_name(enum decide_kind k)
{
        static const char *const names[] = {
                [DECIDE_NOTHING] = "nothing", [DECIDE_START_CYCLE] = "start_cycle",
                [DECIDE_FINALIZE] = "finalize", [DECIDE_COMPLETE_STEP] = "complete_step",
                [DECIDE_RUN_STEP] = "run_step", [DECIDE_AWAIT_APPROVAL] = "await_approval",
                [DECIDE_REVIEW] = "review", [DECIDE_PAUSE] = "pause", [DECIDE_END] = "end",
                [DECIDE_RETRY_WAIT] = "retry_wait", [DECIDE_RETRY_EVIDENCE] = "retry_evidence",
        };
        return ENUM_NAME(names, k, "unknown");
}

const char *decide_end_name(enum decide_end e)
{
        static const char *const names[] = {
                [DECIDE_END_DONE] = "done", [DECIDE_END_FAILED] = "failed",
                [DECIDE_END_TERMINATED] = "terminated", [DECIDE_END_ABANDONED] = "abandoned",
                [DECIDE_END_CANCELLED] = "cancelled",
        };
        return ENUM_NAME(names, e, "unknown");
}

/* ---- the startup rule ---- */

int decide_recover(const struct fold *f, bool had_summary, const struct recovery_evidence *ev,
                   struct decide_recovery *out)
{
        if (!out)
                return -EINVAL;
        *out = (struct decide_recovery){ .file = DECIDE_FILE_RECOVER };
        if (!f)
                return -EINVAL;
        if (f->status == FOLD_CORRUPT) {
                out->file = DECIDE_FILE_QUARANTINE;
                return 0;
        }
        /* Not one record, or only the mandate record: a kill between creating
         * the WAL and the first flush of a fire (its two first appends share
         * that flush).  The fire was never acknowledged — its reply waits for
         * the flush — so nothing is lost; the file goes, and the same tick can
         * be fired again.  Kept, it would hold an id nobody can plan under and
         * turn every later fire of that tick into "already fired".  A summary
         * says the mandate ran and ended: never removed. */
        if (!had_summary && f->nplans == 0 && f->noperators == 0 &&
            f->records == (f->mandate.line ? 1u : 0u)) {
                out->file = DECIDE_FILE_REMOVE;
                return 0;
        }
        int r = recovery_plan_fold_evidence(f, ev, &out->recovery);
        if (r < 0)
                return r;
        out->mandate = DECIDE_MANDATE_RUNNABLE;
        for (size_t i = 0; i < out->recovery->nplans; i++) {
                const struct recovery_plan *rp = &out->recovery->plans[i];
                if (rp->outcome == RECOVERY_PAUSED_REVIEW) {
                        out->mandate = DECIDE_MANDATE_PAUSED_REVIEW;
                        out->review_step = rp->pause_step ? rp->pause_step : "";
                        out->review_reason = rp->pause_reason ? rp->pause_reason : "needs_review";
                        break;
                }
                if (rp->outcome == RECOVERY_AWAIT_PROBE) {
                        out->mandate = DECIDE_MANDATE_PROBING;
                        out->probe_step = rp->probe_step;
                        break;
                }
        }
        return 0;
}

void decide_recovery_release(struct decide_recovery *rec)
{
        if (!rec)
                return;
        recovery_free(rec->recovery);
        rec->recovery = NULL;
}

const char *decide_file_name(enum decide_file d)
{
        static const char *const names[] = {
                [DECIDE_FILE_RECOVER] = "recover", [DECIDE_FILE_QUARANTINE] = "quarantine",
                [DECIDE_FILE_REMOVE] = "remove",
        };
        return ENUM_NAME(names, d, "unknown");
}
