/* SPDX-License-Identifier: MIT */
#include "kairos/carry.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int refuse(char *msg, size_t size, const char *fmt, ...)
{
        if (msg && size) {
                va_list ap;
                va_start(ap, fmt);
                vsnprintf(msg, size, fmt, ap);
                va_end(ap);
        }
        return -EINVAL;
}

/* The last plan of f that is not an orphan, or NULL. */
static const struct fold_plan *last_plan(const struct fold *f)
{
        const struct fold_plan *best = NULL;
        for (size_t i = 0; i < f->nplans; i++)
                if (!f->plans[i].orphan_reason && (!best || f->plans[i].cycle >= best->cycle))
                        best = &f->plans[i];
        return best;
}

static bool is_phase_name(const char *s, size_t *ret_phase)
{
        for (int p = 0; p < PLANNER_PHASES; p++)
                if (strcmp(s, planner_phase_name((enum planner_phase)p)) == 0) {
                        *ret_phase = (size_t)p;
                        return true;
                }
        return false;
}

int carry_select(const struct fold *f, const char *from, struct carry *ret_carry, char *msg,
                 size_t msg_size)
{
        if (!f || !from || !ret_carry)
                return -EINVAL;
        memset(ret_carry, 0, sizeof(*ret_carry));
        const char *mid = f->mandate.mandate_id ? f->mandate.mandate_id : "the mandate";
        const struct fold_plan *p = NULL;
        size_t idx = 0, phase;
        if (is_phase_name(from, &phase)) {
                p = last_plan(f);
                if (!p || p->nsteps <= phase)
                        return refuse(msg, msg_size, "args.from: %s has no %s step", mid, from);
                idx = phase;
        } else {
                for (size_t i = 0; i < f->nplans && !p; i++) {
                        if (f->plans[i].orphan_reason)
                                continue;
                        for (size_t j = 0; j < f->plans[i].nsteps; j++) {
                                const char *sid = f->steps[f->plans[i].steps[j]].step_id;
                                if (sid && strcmp(sid, from) == 0) {
                                        p = &f->plans[i];
                                        idx = j;
                                        break;
                                }
                        }
                }
                if (!p)
                        return refuse(msg, msg_size,
                                      "args.from: %s has no step '%s' (a step id such as "
                                      "act_001, or a phase: observe, orient, decide, act, "
                                      "reflect)",
                                      mid, from);
        }
        if (idx >= PLANNER_PHASES)
                return refuse(msg, msg_size, "args.from: step '%s' of %s is not a phase's step",
                              from, mid);
        for (size_t j = 0; j < idx; j++) {
                const struct fold_step *s = &f->steps[p->steps[j]];
                if (s->state != STEP_COMPLETED || !s->post_hash || !s->result_hash)
                        return refuse(msg, msg_size,
                                      "args.from: step %s of %s before %s did not complete "
                                      "(%s): it has no result to carry",
                                      s->step_id ? s->step_id : "?", mid,
                                      f->steps[p->steps[idx]].step_id,
                                      s->status ? s->status : "not run");
                ret_carry->steps[j] = (struct carry_step){
                        .step_id = s->step_id, .post_hash = s->post_hash,
                        .result_hash = s->result_hash, .result_json = s->result_json,
                };
        }
        ret_carry->nsteps = idx;
        ret_carry->cycle = p->cycle;
        const struct fold_plan *prev = NULL;
        for (size_t i = 0; i < f->nplans; i++)
                if (!f->plans[i].orphan_reason && f->plans[i].cycle == p->cycle - 1)
                        prev = &f->plans[i];
        if (prev && prev->finalized && plan_status_name(prev->final_state)) {
                ret_carry->prev_status = prev->final_state;
                ret_carry->prev_reason = prev->final_reason;
                for (size_t j = 0; j < prev->nsteps && j < PLANNER_PHASES; j++) {
                        const struct fold_step *s = &f->steps[prev->steps[j]];
                        if (s->state != STEP_COMPLETED || !s->post_hash || !s->result_hash)
                                continue;
                        ret_carry->prev_steps[ret_carry->prev_nsteps++] = (struct carry_step){
                                .step_id = s->step_id, .post_hash = s->post_hash,
                                .result_hash = s->result_hash, .result_json = s->result_json,
                        };
                }
        }
        ret_carry->from_step = f->steps[p->steps[idx]].step_id;
        return 0;
}
