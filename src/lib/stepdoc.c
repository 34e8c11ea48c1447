/* SPDX-License-Identifier: MIT */
/* stepdoc: a handler's stdin document (kairos/stepdoc.h). */
#include "kairos/stepdoc.h"

#include <errno.h>
#include <string.h>

#include "kairos/planner.h"

static const struct fold_step *plan_step(const struct fold *f, const struct fold_plan *p, size_t i)
{
        return &f->steps[p->steps[i]];
}

static const struct fold_plan *plan_of_cycle(const struct fold *f, long long cycle)
{
        for (size_t i = f->nplans; i-- > 0;)
                if (f->plans[i].cycle == cycle && !f->plans[i].orphan_reason)
                        return &f->plans[i];
        return NULL;
}

static const char *reflect_result(const struct fold *f, const struct fold_plan *p)
{
        if (!p || p->nsteps < PLANNER_PHASES)
                return NULL;
        const struct fold_step *s = plan_step(f, p, PLANNER_PHASES - 1);
        return s->state == STEP_COMPLETED ? s->result_json : NULL;
}

static void str_or_null(struct kbuf *b, const char *s)
{
        s ? (void)kbuf_json_string_lossy(b, s, strlen(s), 0) : (void)kbuf_puts(b, "null");
}

static size_t result_len(const struct fold_step *s)
{
        return !s->result_json ? 4 : s->result_len ? s->result_len : strlen(s->result_json);
}

int stepdoc_build(const struct fold *f, const struct fold_plan *p, size_t idx,
                  const struct stepdoc_input *in, struct kbuf *b)
{
        kbuf_reset(b);
        /* room for the results at once: a result may be 1 MiB, and the
         * buffer is not grown (copied) through every power of two */
        const char *prev = reflect_result(f, plan_of_cycle(f, p->cycle - 1));
        size_t room = 4096 + (prev ? strlen(prev) : 0);
        for (size_t i = 0; i < idx; i++)
                if (plan_step(f, p, i)->state == STEP_COMPLETED)
                        room += 32 + result_len(plan_step(f, p, i));
        if (kbuf_reserve(b, room) < 0)
                return -ENOMEM;
        kbuf_puts(b, "{\"mandate\":{\"id\":");
        str_or_null(b, in->mandate_id ? in->mandate_id : "");
        kbuf_puts(b, ",\"schedule\":");
        str_or_null(b, in->schedule);
        kbuf_puts(b, ",\"fired_at\":");
        str_or_null(b, in->fired_at);
        kbuf_printf(b, ",\"max_cycles\":%u},\"goal\":", in->max_cycles);
        str_or_null(b, in->goal ? in->goal : (in->schedule ? in->schedule : ""));
        kbuf_puts(b, ",\"plan\":{\"plan_id\":");
        str_or_null(b, p->plan_id ? p->plan_id : "");
        kbuf_printf(b, ",\"cycle\":%lld},\"step\":{\"step_id\":", p->cycle);
        const struct fold_step *s = plan_step(f, p, idx);
        str_or_null(b, s->step_id);
        kbuf_printf(b, ",\"phase\":\"%s\",\"attempt\":%u,\"idem_key\":",
                    planner_phase_name((enum planner_phase)idx), in->attempt);
        str_or_null(b, in->idem_key ? in->idem_key : "");
        kbuf_puts(b, "},\"results\":{");
        bool first = true;
        for (size_t i = 0; i < idx; i++) {
                const struct fold_step *e = plan_step(f, p, i);
                if (e->state != STEP_COMPLETED)
                        continue;
                /* a result may be 1 MiB: copied by its length, no printf */
                const char *res = e->result_json ? e->result_json : "null";
                if ((!first && kbuf_putc(b, ',') < 0) || kbuf_putc(b, '"') < 0 ||
                    kbuf_puts(b, planner_phase_name((enum planner_phase)i)) < 0 ||
                    kbuf_puts(b, "\":") < 0 || kbuf_append(b, res, result_len(e)) < 0)
                        return -ENOMEM;
                first = false;
        }
        kbuf_puts(b, "},\"previous_reflect\":");
        if (kbuf_puts(b, prev ? prev : "null") < 0)
                return -ENOMEM;
        /* one check at the end: kbuf leaves its data consistent on failure */
        return kbuf_puts(b, "}\n") < 0 || !b->data ? -ENOMEM : 0;
}
