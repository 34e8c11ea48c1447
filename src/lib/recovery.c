/* SPDX-License-Identifier: MIT */
/* recovery: the pure recovery planner (docs/design.md §8).
 *
 * For every plan not finalized, in WAL order:
 *   - it holds a failed (or abandoned) step: finalize it failed, nothing runs;
 *   - else walk its steps in plan order, skipping completed ones:
 *       already_done  → completed {recovered:true, evidence}; go on;
 *       safe_to_retry → reset if the step had reached executing; resume
 *                       from this step; stop (later steps never ran);
 *       manual_review → needs_review with the evidence (unless the step is
 *                       already needs_review); pause; stop;
 *       (a step whose step_id a later plan_commit took over cannot be driven:
 *       pause with reason step_id_reused, no record);
 *   - the walk found every step completed: finalize it succeeded. */
#include "kairos/recovery.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kairos/canon.h"
#include "kairos/kbuf.h"
#include "kairos/kjson.h"

struct recovery_internal {
        struct kjson_arena *arena; /* evidence texts and probe hashes */
};

static int keep(struct recovery *r, const char *s, const char **out);

static const struct recovery_step_evidence *step_evidence(const struct recovery_evidence *ev,
                                                           const char *step_id)
{
        for (size_t i = 0; ev && i < ev->nsteps; i++)
                if (ev->steps[i].step_id && strcmp(ev->steps[i].step_id, step_id) == 0)
                        return &ev->steps[i];
        return NULL;
}

/* Sources after the WAL, for a step the WAL leaves open (row 6): what the
 * step is, the idempotency store, the probe.  Changes *v when one decides
 * (more evidence members in v->extra_json, in r's arena).  Returns 1 when
 * only the probe can decide and it has not spoken yet. */
static int evidence_sources(struct recovery *r, const struct fold_step *s,
                            const struct recovery_evidence *ev, struct verdict *v)
{
        enum planner_phase phase;
        int cycle;
        char *x = NULL;

        if (!ev || v->row != 6)
                return 0;
        if (planner_parse_step_id(s->step_id, &phase, &cycle) == 0) {
                if (!ev->has_command[phase] || !(ev->effects & (1u << phase))) {
                        v->kind = VERDICT_SAFE_TO_RETRY;
                        v->row = 0;
                        v->reason = ev->has_command[phase] ? "declared_rerunnable" : "no_command";
                        v->evidence = VERDICT_EV_STATUS;
                        if (asprintf(&x, "\"phase\":\"%s\"", planner_phase_name(phase)) < 0)
                                return -ENOMEM;
                        goto keep;
                }
        }
        const struct recovery_step_evidence *se = step_evidence(ev, s->step_id);
        if (se && se->idem_open && se->check == RECOVERY_PROBE_FAILED) {
                /* a call's own check could not say: a human, with its words */
                struct kbuf b = KBUF_INIT;
                const char *o = se->check_output ? se->check_output : "";
                const char *k = se->check_key ? se->check_key : "";
                v->kind = VERDICT_MANUAL_REVIEW;
                v->row = 0;
                v->reason = "tool_check_inconclusive";
                v->evidence = VERDICT_EV_STATUS;
                if (kbuf_printf(&b, "\"tool_calls\":%s,\"check\":{\"key\":",
                                se->idem_json ? se->idem_json : "null") < 0 ||
                    kbuf_json_string_lossy(&b, k, strlen(k), 0) < 0 ||
                    kbuf_puts(&b, ",\"output\":") < 0 ||
                    kbuf_json_string_lossy(&b, o, strlen(o), 0) < 0 || kbuf_putc(&b, '}') < 0) {
                        kbuf_free(&b);
                        return -ENOMEM;
                }
                x = kbuf_steal(&b);
                goto keep;
        }
        /* an open call that its own check or the schedule's probe can
         * decide waits for them (run after READY=1); the probe's word,
         * once given, decides the step below (the caller settles the
         * calls with it) */
        if (se && se->idem_open && se->probe == RECOVERY_PROBE_NONE &&
            (se->idem_checks || ev->has_probe))
                return 1;
        if (se && se->idem_open && se->probe == RECOVERY_PROBE_NONE) {
                v->kind = VERDICT_MANUAL_REVIEW;
                v->row = 0;
                v->reason = "tool_call_interrupted";
                v->evidence = VERDICT_EV_STATUS;
                if (asprintf(&x, "\"tool_calls\":%s", se->idem_json ? se->idem_json : "null") < 0)
                        return -ENOMEM;
                goto keep;
        }
        /* (a call still open with the probe's word: the word decides) */
        if (ev->effects_via_kairosctl && !(se && se->idem_open)) {
                v->kind = VERDICT_SAFE_TO_RETRY;
                v->row = 0;
                v->reason = "effects_journaled";
                v->evidence = VERDICT_EV_STATUS;
                if (asprintf(&x, "\"tool_calls\":%s",
                             se && se->idem_json ? se->idem_json : "[]") < 0)
                        return -ENOMEM;
                goto keep;
        }
        if (!se || se->probe == RECOVERY_PROBE_NONE)
                return ev->has_probe ? 1 : 0;
        switch (se->probe) {
        case RECOVERY_PROBE_DONE:
                v->kind = VERDICT_ALREADY_DONE;
                v->row = 2;
                v->reason = "current_state_matches_expected_post";
                v->post_hash = s->expected_post_hash ? s->expected_post_hash : "";
                v->evidence = 0;
                if (asprintf(&x, "\"source\":\"probe\"") < 0)
                        return -ENOMEM;
                break;
        case RECOVERY_PROBE_NOT_STARTED:
                v->kind = VERDICT_SAFE_TO_RETRY;
                v->row = 5;
                v->reason = "current_pre_matches_expected";
                v->evidence = 0;
                if (asprintf(&x, "\"source\":\"probe\"") < 0)
                        return -ENOMEM;
                break;
        default: {
                struct kbuf b = KBUF_INIT;
                const char *o = se->probe_output ? se->probe_output : "";
                v->kind = VERDICT_MANUAL_REVIEW;
                v->row = 0;
                v->reason = "probe_inconclusive";
                v->evidence = VERDICT_EV_STATUS;
                if (kbuf_puts(&b, "\"probe_output\":") < 0 ||
                    kbuf_json_string_lossy(&b, o, strlen(o), 0) < 0) {
                        kbuf_free(&b);
                        return -ENOMEM;
                }
                x = kbuf_steal(&b);
                break;
        }
        }
keep:;
        int ret = keep(r, x, &v->extra_json);
        free(x);
        return ret;
}

static int keep(struct recovery *r, const char *s, const char **out)
{
        if (!s) {
                *out = NULL;
                return 0;
        }
        char *d = kjson_arena_strndup(r->internal->arena, s, strlen(s));
        if (!d)
                return -ENOMEM;
        *out = d;
        return 0;
}

bool recovery_step_stopped(const struct fold_step *s)
{
        return s && s->state == STEP_NEEDS_REVIEW && s->reason &&
               strcmp(s->reason, RECOVERY_KILLED_AT_SHUTDOWN) == 0;
}

/* A failed step whose retry is due, decided by the evidence (recovery.h). */
static bool retry_by_evidence(const struct recovery_evidence *ev, const struct fold_step *s)
{
        enum planner_phase phase;
        if (!ev || !ev->retry_now_ms || s->state != STEP_FAILED || !s->retry_waiting ||
            s->retry_due_ms > ev->retry_now_ms || !ev->effects_via_kairosctl ||
            planner_parse_step_id(s->step_id, &phase, NULL) < 0)
                return false;
        return (ev->effects & (1u << phase)) && ev->has_command[phase];
}

bool recovery_step_interrupted(const struct fold_step *s)
{
        return s && (s->state == STEP_EXECUTING || recovery_step_stopped(s));
}

/* The evidence of a decision on a stopped step says so. */
static int say_stopped(struct recovery *r, struct verdict *v)
{
        char *x = NULL;
        if (asprintf(&x, "%s%s\"" RECOVERY_KILLED_AT_SHUTDOWN "\":true",
                     v->extra_json ? v->extra_json : "", v->extra_json ? "," : "") < 0)
                return -ENOMEM;
        int ret = keep(r, x, &v->extra_json);
        free(x);
        return ret;
}

static int evidence_json(struct recovery *r, const struct verdict *v, const char **out)
{
        struct kbuf b = KBUF_INIT;
        int ret = verdict_evidence_json(v, &b);
        if (ret >= 0)
                ret = keep(r, b.data, out);
        kbuf_free(&b);
        return ret;
}

static void set_finalize(struct recovery_plan *rp, const struct fold_plan *p, enum recovery_outcome o,
                         enum plan_status status, const char *reason)
{
        rp->outcome = o;
        rp->has_finalize = true;
        rp->finalize = (struct wal_record){
                .op = WAL_OP_FINALIZE,
                .plan_id = p->plan_id,
                .status = status,
                .reason = reason,
        };
}

/* The result a completed record carries: the probe's when it decided. */
static const char *se_result(const struct recovery_evidence *ev, const struct fold_step *s)
{
        const struct recovery_step_evidence *se = step_evidence(ev, s->step_id);
        if (se && se->probe == RECOVERY_PROBE_DONE && !s->post_hash)
                return se->probe_result_json;
        return s->result_json;
}

/* Decide one step; *stop when the walk ends here. */
static int decide_step(struct recovery *r, const struct fold *f, size_t idx, struct recovery_plan *rp,
                       recovery_probe_fn probe, void *ctx, const struct recovery_evidence *evi,
                       bool *stop)
{
        const struct fold_step *s = &f->steps[idx];
        struct recovery_decision *d = &rp->decisions[rp->ndecisions++];
        const char *cur_pre = NULL, *cur_post = NULL;
        const char *ev;
        int ret;

        if (probe) {
                const char *pre = NULL, *post = NULL;
                probe(ctx, s, &pre, &post);
                if ((ret = keep(r, pre, &cur_pre)) < 0 || (ret = keep(r, post, &cur_post)) < 0)
                        return ret;
        }
        struct verdict_step vs = {
                .state = s->state,
                .status = s->status,
                .pre_hash = s->pre_hash,
                .expected_post_hash = s->expected_post_hash,
                .observed_pre_hash = s->observed_pre_hash,
                .post_hash = s->post_hash,
                .result_hash = s->result_hash,
        };
        /* a step a graceful stop killed is decided as one a crash cut off */
        bool stopped = recovery_step_stopped(s);
        /* ... and so is a failed attempt whose effect is journaled, when
         * its retry is due: its calls, not the handler's exit, decide */
        bool retrying = retry_by_evidence(evi, s);
        if (stopped || retrying)
                vs.state = STEP_EXECUTING;
        d->step = idx;
        verdict_check(&vs, cur_pre, cur_post, &d->verdict);
        if ((ret = evidence_sources(r, s, evi, &d->verdict)) < 0)
                return ret;
        if (ret == 0 && stopped && (ret = say_stopped(r, &d->verdict)) < 0)
                return ret;
        *stop = true;
        if (ret == 1) {
                /* undecided: not a decision, no record; the probe comes first */
                rp->ndecisions--;
                rp->outcome = RECOVERY_AWAIT_PROBE;
                rp->probe_step = s->step_id;
                rp->probe_index = idx;
                return 0;
        }

        switch (d->verdict.kind) {
        case VERDICT_ALREADY_DONE:
                ret = evidence_json(r, &d->verdict, &ev);
                if (ret < 0)
                        return ret;
                const char *res = se_result(evi, s), *rh = s->result_hash ? s->result_hash : "";
                if (res && res != s->result_json) {
                        /* the probe's result: the record keeps its own copy */
                        if ((ret = keep(r, res, &res)) < 0)
                                return ret;
                        char h[CANON_HASH_STRLEN];
                        if (canon_hash_json(res, strlen(res), h, NULL) == 0 &&
                            (ret = keep(r, h, &rh)) < 0)
                                return ret;
                }
                d->has_record = true;
                d->record = (struct wal_record){
                        .op = WAL_OP_COMPLETED,
                        .step_id = s->step_id,
                        .post_hash = d->verdict.post_hash,
                        /* the writer requires one; "" = no result recorded */
                        .result_hash = rh,
                        .recovered = true,
                        .evidence_json = ev,
                        .result_json = res,
                };
                *stop = false;
                return 0;
        case VERDICT_SAFE_TO_RETRY:
                if (s->observed_pre_hash || s->state == STEP_EXECUTING || stopped || retrying) {
                        d->has_record = true;
                        d->record = (struct wal_record){ .op = WAL_OP_RESET, .step_id = s->step_id };
                        /* decided by evidence beyond the WAL: say which */
                        if (d->verdict.extra_json) {
                                if ((ret = evidence_json(r, &d->verdict, &ev)) < 0)
                                        return ret;
                                d->record.evidence_json = ev;
                        }
                }
                rp->outcome = RECOVERY_RESUME;
                rp->resume_step = idx;
                return 0;
        case VERDICT_MANUAL_REVIEW:
                rp->outcome = RECOVERY_PAUSED_REVIEW;
                rp->pause_step = s->step_id;
                if (s->state == STEP_NEEDS_REVIEW && (!stopped || d->verdict.row == 6)) {
                        /* already recorded: no second record (a stopped
                         * step only gets one when evidence beyond the WAL
                         * has more to say, e.g. its interrupted call) */
                        rp->pause_reason = s->reason ? s->reason : d->verdict.reason;
                        return 0;
                }
                ret = evidence_json(r, &d->verdict, &ev);
                if (ret < 0)
                        return ret;
                rp->pause_reason = d->verdict.reason;
                d->has_record = true;
                d->record = (struct wal_record){
                        .op = WAL_OP_NEEDS_REVIEW,
                        .step_id = s->step_id,
                        .reason = d->verdict.reason,
                        .evidence_json = ev,
                };
                return 0;
        }
        return -EINVAL;
}

static int plan_one(struct recovery *r, const struct fold *f, size_t pi, struct recovery_plan *rp,
                    recovery_probe_fn probe, void *ctx, const struct recovery_evidence *ev)
{
        const struct fold_plan *p = &f->plans[pi];
        int ret;

        rp->plan = pi;
        for (size_t j = 0; j < p->nsteps; j++) {
                const struct fold_step *s = &f->steps[p->steps[j]];
                if (s->state == STEP_FAILED && s->retry_waiting && !retry_by_evidence(ev, s)) {
                        /* waits for its retry (retry_wait): the executor
                         * waits for the rest of it, nothing to recover */
                        rp->outcome = RECOVERY_RESUME;
                        rp->resume_step = p->steps[j];
                        return 0;
                }
                if (s->state == STEP_FAILED && s->retry_waiting)
                        break; /* due, its effect journaled: decided below */
                if (s->state == STEP_FAILED) {
                        set_finalize(rp, p, RECOVERY_FINALIZED_FAILED, PLAN_FAILED, "step_failed");
                        return 0;
                }
        }
        for (size_t j = 0; j < p->nsteps; j++) {
                const struct fold_step *s = &f->steps[p->steps[j]];
                if (s->state == STEP_ABANDONED) {
                        /* an abandoned step never completes: the plan cannot succeed */
                        set_finalize(rp, p, RECOVERY_FINALIZED_FAILED, PLAN_FAILED, "step_abandoned");
                        return 0;
                }
        }

        if (p->nsteps) {
                rp->decisions = calloc(p->nsteps, sizeof(*rp->decisions));
                if (!rp->decisions)
                        return -ENOMEM;
        }
        for (size_t j = 0; j < p->nsteps; j++) {
                const struct fold_step *s = &f->steps[p->steps[j]];
                bool stop;
                if (s->state == STEP_COMPLETED)
                        continue;
                if (fold_find_step(f, s->step_id) != s) {
                        /* a later plan_commit took this step_id over: every
                         * record for it would land on the new owner, so this
                         * plan cannot be driven (and no record is written) */
                        rp->outcome = RECOVERY_PAUSED_REVIEW;
                        rp->pause_step = s->step_id;
                        rp->pause_reason = "step_id_reused";
                        return 0;
                }
                ret = decide_step(r, f, p->steps[j], rp, probe, ctx, ev, &stop);
                if (ret < 0)
                        return ret;
                if (stop)
                        return 0;
        }
        set_finalize(rp, p, RECOVERY_FINALIZED_SUCCEEDED, PLAN_SUCCEEDED, NULL);
        return 0;
}

static int plan_fold(const struct fold *f, recovery_probe_fn probe, void *ctx,
                     const struct recovery_evidence *ev, struct recovery **out)
{
        struct recovery *r;
        size_t n = 0;
        int ret;

        if (!out)
                return -EINVAL;
        *out = NULL;
        if (!f)
                return -EINVAL;
        if (f->status == FOLD_CORRUPT)
                return -EBADMSG;

        r = calloc(1, sizeof(*r));
        if (!r)
                return -ENOMEM;
        r->internal = calloc(1, sizeof(*r->internal));
        if (!r->internal || !(r->internal->arena = kjson_arena_new())) {
                recovery_free(r);
                return -ENOMEM;
        }
        for (size_t i = 0; i < f->nplans; i++)
                n += !f->plans[i].finalized;
        if (n) {
                r->plans = calloc(n, sizeof(*r->plans));
                if (!r->plans) {
                        recovery_free(r);
                        return -ENOMEM;
                }
        }
        for (size_t i = 0; i < f->nplans; i++) {
                if (f->plans[i].finalized)
                        continue;
                ret = plan_one(r, f, i, &r->plans[r->nplans++], probe, ctx, ev);
                if (ret < 0) {
                        recovery_free(r);
                        return ret;
                }
        }
        *out = r;
        return 0;
}

int recovery_plan_fold_probe(const struct fold *f, recovery_probe_fn probe, void *ctx,
                             struct recovery **out)
{
        return plan_fold(f, probe, ctx, NULL, out);
}

int recovery_plan_fold_evidence(const struct fold *f, const struct recovery_evidence *ev,
                                struct recovery **out)
{
        return plan_fold(f, NULL, NULL, ev, out);
}

int recovery_plan_fold(const struct fold *f, struct recovery **out)
{
        return plan_fold(f, NULL, NULL, NULL, out);
}

void recovery_free(struct recovery *r)
{
        if (!r)
                return;
        for (size_t i = 0; i < r->nplans; i++)
                free(r->plans[i].decisions);
        free(r->plans);
        if (r->internal)
                kjson_arena_free(r->internal->arena);
        free(r->internal);
        free(r);
}

size_t recovery_record_count(const struct recovery *r)
{
        size_t n = 0;

        if (!r)
                return 0;
        for (size_t i = 0; i < r->nplans; i++) {
                const struct recovery_plan *rp = &r->plans[i];
                for (size_t j = 0; j < rp->ndecisions; j++)
                        n += rp->decisions[j].has_record;
                n += rp->has_finalize;
        }
        return n;
}

const struct wal_record *recovery_record_at(const struct recovery *r, size_t i)
{
        if (!r)
                return NULL;
        for (size_t k = 0; k < r->nplans; k++) {
                const struct recovery_plan *rp = &r->plans[k];
                for (size_t j = 0; j < rp->ndecisions; j++) {
                        if (!rp->decisions[j].has_record)
                                continue;
                        if (i == 0)
                                return &rp->decisions[j].record;
                        i--;
                }
                if (rp->has_finalize) {
                        if (i == 0)
                                return &rp->finalize;
                        i--;
                }
        }
        return NULL;
}

const char *recovery_action_text(const struct recovery_decision *dec)
{
        if (!dec->has_record)
                return dec->verdict.kind == VERDICT_SAFE_TO_RETRY ? "runs when its turn comes"
                                                                   : "already marked";
        switch (dec->record.op) {
        case WAL_OP_COMPLETED:
                return "marked completed (recovered)";
        case WAL_OP_RESET:
                return "reset to pending, runs again with the same idem_key";
        case WAL_OP_NEEDS_REVIEW:
                return "marked needs_review, mandate paused";
        default:
                return "recorded";
        }
}

const char *recovery_outcome_name(enum recovery_outcome o)
{
        switch (o) {
        case RECOVERY_RESUME:
                return "resume";
        case RECOVERY_PAUSED_REVIEW:
                return "paused_review";
        case RECOVERY_FINALIZED_FAILED:
                return "finalized_failed";
        case RECOVERY_FINALIZED_SUCCEEDED:
                return "finalized_succeeded";
        case RECOVERY_AWAIT_PROBE:
                return "awaiting_probe";
        }
        return "unknown";
}
