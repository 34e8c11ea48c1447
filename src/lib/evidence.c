/* SPDX-License-Identifier: MIT */
/* evidence: what recovery knows beyond the WAL (see kairos/evidence.h). */
#include "kairos/evidence.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kairos/kbuf.h"
#include "kairos/kmem.h"
#include "kairos/strmap.h"

struct mandate_calls {
        struct evidence_call *calls;
        size_t n, cap;
};

struct evidence_index {
        bool known;
        struct strmap *map;      /* mandate id → struct mandate_calls */
        size_t size;
};

static void calls_free(void *p)
{
        struct mandate_calls *mc = p;
        if (!mc)
                return;
        for (size_t i = 0; i < mc->n; i++) {
                free((char *)mc->calls[i].key);
                free((char *)mc->calls[i].tool);
                free((char *)mc->calls[i].step);
                free((char *)mc->calls[i].check);
        }
        free(mc->calls);
        free(mc);
}

void evidence_index_free(struct evidence_index *ix)
{
        if (!ix)
                return;
        strmap_free_with(ix->map, calls_free);
        free(ix);
}

/* A copy of *src among mandate's calls. */
static int add_one(struct evidence_index *ix, const char *mandate, const struct evidence_call *src)
{
        struct mandate_calls *mc = strmap_get(ix->map, mandate);
        if (!mc) {
                if (!(mc = calloc(1, sizeof(*mc))))
                        return -ENOMEM;
                if (strmap_put(ix->map, mandate, mc) < 0) {
                        free(mc);
                        return -ENOMEM;
                }
        }
        if (mc->n == mc->cap) {
                size_t cap = mc->cap ? mc->cap * 2 : 4;
                struct evidence_call *c = realloc(mc->calls, cap * sizeof(*c));
                if (!c)
                        return -ENOMEM;
                mc->calls = c;
                mc->cap = cap;
        }
        struct evidence_call *c = &mc->calls[mc->n];
        *c = *src;
        c->key = strdup(src->key);
        c->tool = strdup(src->tool);
        c->step = strdup(src->step);
        c->check = src->check ? strdup(src->check) : NULL;
        if (!c->key || !c->tool || !c->step || (src->check && !c->check)) {
                free((char *)c->key);
                free((char *)c->tool);
                free((char *)c->step);
                free((char *)c->check);
                return -ENOMEM;
        }
        mc->n++;
        ix->size++;
        return 0;
}

static int add_call(const struct idem_view *v, void *ctx)
{
        if (!v->owner || !v->owner->mandate[0])
                return 0;
        struct evidence_call c = {
                .key = v->key,
                .tool = v->tool,
                .step = v->owner->step,
                .attempt = v->owner->attempt,
                .state = v->state,
                .created_ms = v->created_ms,
                .finished_ms = v->finished_ms,
                .check = v->check,
                .client = v->client,
        };
        return add_one(ctx, v->owner->mandate, &c);
}

int evidence_call_cmp(const void *a, const void *b)
{
        const struct evidence_call *x = a, *y = b;
        int c = strcmp(x->step, y->step);
        if (c)
                return c;
        if (x->created_ms != y->created_ms)
                return x->created_ms < y->created_ms ? -1 : 1;
        return strcmp(x->key, y->key);
}

static void sort_calls(struct evidence_index *ix)
{
        size_t pos = 0;
        const char *k;
        void *v;
        while (strmap_next(ix->map, &pos, &k, &v) == 0) {
                struct mandate_calls *mc = v;
                if (mc->n > 1)
                        qsort(mc->calls, mc->n, sizeof(*mc->calls), evidence_call_cmp);
        }
}

static int index_new(bool known, struct evidence_index **out)
{
        struct evidence_index *ix = calloc(1, sizeof(*ix));
        if (!ix || !(ix->map = strmap_new())) {
                free(ix);
                return -ENOMEM;
        }
        ix->known = known;
        *out = ix;
        return 0;
}

int evidence_index_unknown(struct evidence_index **out)
{
        if (!out)
                return -EINVAL;
        *out = NULL;
        return index_new(false, out);
}

int evidence_index_build(struct idem_store *s, struct evidence_index **out)
{
        if (!out)
                return -EINVAL;
        *out = NULL;
        if (!s)
                return evidence_index_unknown(out);
        struct evidence_index *ix;
        int r = index_new(true, &ix);
        if (r < 0)
                return r;
        if ((r = idem_foreach(s, add_call, ix)) < 0) {
                evidence_index_free(ix);
                return r;
        }
        sort_calls(ix);
        *out = ix;
        return 0;
}

int evidence_index_from_calls(const char *mandate_id, const struct evidence_call *calls,
                              size_t n, struct evidence_index **out)
{
        if (!out)
                return -EINVAL;
        *out = NULL;
        if (!mandate_id || !*mandate_id || (n && !calls))
                return -EINVAL;
        for (size_t i = 0; i < n; i++)
                if (!calls[i].key || !calls[i].tool || !calls[i].step)
                        return -EINVAL;
        struct evidence_index *ix;
        int r = index_new(true, &ix);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n; i++)
                if ((r = add_one(ix, mandate_id, &calls[i])) < 0) {
                        evidence_index_free(ix);
                        return r;
                }
        sort_calls(ix);
        *out = ix;
        return 0;
}

bool evidence_index_known(const struct evidence_index *ix)
{
        return ix && ix->known;
}

size_t evidence_index_size(const struct evidence_index *ix)
{
        return ix ? ix->size : 0;
}

size_t evidence_index_calls(const struct evidence_index *ix, const char *mandate_id,
                            const struct evidence_call **ret)
{
        *ret = NULL;
        if (!ix || !ix->map || !mandate_id)
                return 0;
        const struct mandate_calls *mc = strmap_get(ix->map, mandate_id);
        if (!mc || !mc->n)
                return 0;
        *ret = mc->calls;
        return mc->n;
}

void evidence_schedule_from_config(const struct config_schedule *sc, struct evidence_schedule *es)
{
        *es = (struct evidence_schedule){ 0 };
        if (!sc)
                return;
        es->effects = sc->effects;
        es->effects_via_kairosctl = sc->effects_via == EFFECTS_VIA_KAIROSCTL;
        for (int i = 0; i < PLANNER_PHASES && i < CONFIG_PHASES; i++)
                es->has_command[i] = sc->exec[i] && *sc->exec[i];
        es->has_probe = sc->probe && *sc->probe;
}

void evidence_format_ms(int64_t ms, char buf[EVIDENCE_TS_SIZE])
{
        time_t t = (time_t)(ms >= 0 ? ms / 1000 : (ms - 999) / 1000);
        int frac = (int)(ms - (int64_t)t * 1000);
        struct tm tm;
        if (!gmtime_r(&t, &tm) || tm.tm_year > 8099) {
                snprintf(buf, EVIDENCE_TS_SIZE, "%s", "?");
                return;
        }
        snprintf(buf, EVIDENCE_TS_SIZE, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, frac);
}

static int call_json(const struct evidence_call *c, struct kbuf *b)
{
        char ts[EVIDENCE_TS_SIZE];
        evidence_format_ms(c->created_ms, ts);
        int r;
        if ((r = kbuf_puts(b, "{\"key\":")) < 0 ||
            (r = kbuf_json_string_lossy(b, c->key, strlen(c->key), 0)) < 0 ||
            (r = kbuf_puts(b, ",\"tool\":")) < 0 ||
            (r = kbuf_json_string_lossy(b, c->tool, strlen(c->tool), 0)) < 0 ||
            (r = kbuf_printf(b, ",\"state\":\"%s\",\"attempt\":%u,\"started\":\"%s\"}",
                             idem_state_name(c->state), (unsigned)c->attempt, ts)) < 0)
                return r;
        return 0;
}

int evidence_calls_json(const struct evidence_call *calls, size_t n, struct kbuf *out)
{
        int r = kbuf_putc(out, '[');
        for (size_t i = 0; r >= 0 && i < n; i++) {
                if (i && (r = kbuf_putc(out, ',')) < 0)
                        break;
                r = call_json(&calls[i], out);
        }
        if (r >= 0)
                r = kbuf_putc(out, ']');
        return r < 0 ? r : 0;
}

static bool is_open(enum idem_state st)
{
        return st == IDEM_ST_PROCESSING || st == IDEM_ST_INTERRUPTED;
}

/* The JSON of one step's calls [from, to): the open ones if any, else all. */
static int step_json(const struct evidence_call *c, size_t from, size_t to, unsigned nopen,
                     char **out)
{
        struct kbuf b = KBUF_INIT;
        int r = kbuf_putc(&b, '[');
        bool first = true;
        for (size_t i = from; r >= 0 && i < to; i++) {
                if (nopen && !is_open(c[i].state))
                        continue;
                if (!first && (r = kbuf_putc(&b, ',')) < 0)
                        break;
                first = false;
                r = call_json(&c[i], &b);
        }
        if (r >= 0)
                r = kbuf_putc(&b, ']');
        if (r < 0) {
                kbuf_free(&b);
                return r;
        }
        *out = kbuf_steal(&b);
        return 0;
}

void evidence_mandate_release(struct evidence_mandate *em)
{
        if (!em)
                return;
        kmem_free_strv(em->json, em->n);
        free(em->steps);
        *em = (struct evidence_mandate){ 0 };
}

int evidence_for_mandate(const struct evidence_index *ix, const char *mandate_id,
                         const struct evidence_schedule *es, struct evidence_mandate *em)
{
        if (!em || !es)
                return -EINVAL;
        *em = (struct evidence_mandate){ 0 };
        em->ev.effects = es->effects;
        memcpy(em->ev.has_command, es->has_command, sizeof em->ev.has_command);
        /* without a store that is known to be whole, no call can be ruled out */
        em->ev.effects_via_kairosctl = es->effects_via_kairosctl && evidence_index_known(ix);
        /* a step nothing else decides waits for the probe (kairosd runs it
         * after READY=1, kairosctl recover --dry-run with --probe) */
        em->ev.has_probe = es->has_probe;

        const struct evidence_call *c;
        size_t n = evidence_index_known(ix) ? evidence_index_calls(ix, mandate_id, &c) : 0;
        size_t nsteps = 0;
        for (size_t i = 0; i < n; i++)
                nsteps += i == 0 || strcmp(c[i].step, c[i - 1].step) != 0;
        if (!nsteps)
                return 0;
        em->steps = calloc(nsteps, sizeof(*em->steps));
        em->json = calloc(nsteps, sizeof(*em->json));
        if (!em->steps || !em->json) {
                evidence_mandate_release(em);
                return -ENOMEM;
        }
        for (size_t i = 0; i < n;) {
                size_t j = i;
                unsigned nopen = 0, nfin = 0, nchecks = 0;
                for (; j < n && strcmp(c[j].step, c[i].step) == 0; j++) {
                        if (is_open(c[j].state)) {
                                nopen++;
                                nchecks += c[j].check != NULL;
                        } else {
                                nfin++;
                        }
                }
                struct recovery_step_evidence *se = &em->steps[em->n];
                int r = step_json(c, i, j, nopen, &em->json[em->n]);
                if (r < 0) {
                        evidence_mandate_release(em);
                        return r;
                }
                *se = (struct recovery_step_evidence){
                        .step_id = c[i].step,
                        .idem_open = nopen,
                        .idem_checks = nchecks,
                        .idem_finished = nfin,
                        .idem_json = em->json[em->n],
                };
                em->n++;
                i = j;
        }
        em->ev.steps = em->steps;
        em->ev.nsteps = em->n;
        return 0;
}


const char *evidence_source_name(const struct verdict *v)
{
        static const struct {
                const char *reason, *source;
        } map[] = {
                { "declared_rerunnable", "step" },
                { "no_command", "step" },
                { "tool_call_interrupted", "idem" },
                { "tool_check_inconclusive", "check" },
                { "effects_journaled", "idem" },
                { "current_state_matches_expected_post", "probe" },
                { "current_pre_matches_expected", "probe" },
                { "probe_inconclusive", "probe" },
        };
        for (size_t i = 0; v && v->reason && i < sizeof map / sizeof map[0]; i++)
                if (strcmp(v->reason, map[i].reason) == 0)
                        return map[i].source;
        return "wal";
}
