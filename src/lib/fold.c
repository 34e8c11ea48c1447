/* SPDX-License-Identifier: MIT */
/* fold: rebuild plans and steps from a WAL (docs/design.md §6).
 *
 * The buffer is split on '\n'; one trailing '\r' is stripped; blank lines
 * (only spaces, tabs, CRs) are skipped.  Each other line is checked:
 *
 *   kairos line  ends with ,"crc":"xxxxxxxx"} (8 lowercase hex): the crc of
 *                the line without ,"crc":"xxxxxxxx" must match (checked on
 *                the text before parsing), the JSON must be an object and
 *                "crc" must be its only top-level crc member;
 *   legacy line  no such suffix: a JSON object without a top-level "crc"
 *                whose LAST member is "ts" (a damaged crc field must not
 *                pass as legacy).
 *
 * A bad line followed by any non-blank line is corruption.  The last
 * non-blank line, when bad or unterminated, is a torn tail only if it could
 * be a strict prefix of one record (only NULs, or the parser runs out of
 * input, or it is a whole good record without its '\n'); anything else is
 * corruption.  An unterminated line is never folded. */
#include "kairos/fold.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "kairos/crcline.h"
#include "kairos/kio.h"
#include "kairos/kbuf.h"
#include "kairos/kjson.h"
#include "kairos/wal.h"

/* ---- string → index hash map (open addressing, linear probing) ---- */

struct map_entry {
        const char *key;   /* NULL = empty slot */
        uint64_t hash;
        size_t val;
};

struct map {
        struct map_entry *e;
        size_t cap;        /* power of two, or 0 */
        size_t n;
        bool inl;          /* e is the fold's own room (struct fold_mem), not freed */
};

static uint64_t hash_str(const char *s)
{
        uint64_t h = 1469598103934665603ULL;
        for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
                h ^= *p;
                h *= 1099511628211ULL;
        }
        return h ^ (h >> 29);
}

static struct map_entry *map_slot(const struct map *m, const char *key, uint64_t h)
{
        size_t mask = m->cap - 1;
        for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
                struct map_entry *e = &m->e[i];
                if (!e->key || (e->hash == h && strcmp(e->key, key) == 0))
                        return e;
        }
}

static bool map_get(const struct map *m, const char *key, size_t *val)
{
        if (!m->cap)
                return false;
        struct map_entry *e = map_slot(m, key, hash_str(key));
        if (!e->key)
                return false;
        *val = e->val;
        return true;
}

static int map_grow(struct map *m)
{
        size_t cap = m->cap ? m->cap * 2 : 64;
        if (cap < m->cap || cap > SIZE_MAX / sizeof(struct map_entry))
                return -ENOMEM;
        struct map_entry *e = calloc(cap, sizeof(*e));
        if (!e)
                return -ENOMEM;
        struct map old = *m;
        m->e = e;
        m->cap = cap;
        m->inl = false;
        for (size_t i = 0; i < old.cap; i++)
                if (old.e[i].key)
                        *map_slot(m, old.e[i].key, old.e[i].hash) = old.e[i];
        if (!old.inl)
                free(old.e);
        return 0;
}

/* Insert or overwrite.  key must outlive the map. */
static int map_put(struct map *m, const char *key, size_t val)
{
        if ((m->n + 1) * 2 > m->cap) {
                int r = map_grow(m);
                if (r < 0)
                        return r;
        }
        uint64_t h = hash_str(key);
        struct map_entry *e = map_slot(m, key, h);
        if (!e->key)
                m->n++;
        e->key = key;
        e->hash = h;
        e->val = val;
        return 0;
}

/* ---- fold state ---- */

struct fold_internal {
        struct kjson_arena *keep;    /* strings of the result */
        struct kjson_arena *scratch; /* one line's parse tree, reset per line */
        struct kbuf json;            /* scratch for compact JSON */
        const char *line_lo, *line_hi; /* the fast path's copy of the line, when in keep */
        struct map step_map;
        struct map plan_map;
        size_t cap_plans;
        size_t cap_steps;
        size_t cap_operators;
        size_t cap_retries;
        size_t *plan_step_cap;       /* capacity of plans[i].steps */
        const char *work_ts;         /* ts of the last record before this one, but an
                                      * operator's (written after a restart) */
};

/* One parsed record's top-level members (the last one of a key wins). */
struct rec {
        const struct kjson *op, *step_id, *plan_id, *mandate_id, *cycle, *plan_hash, *steps,
                *idem_key, *status, *pre_hash, *post_hash, *result_hash, *result, *evidence,
                *recovered, *error_class, *error_msg, *reason, *reset, *action, *uid, *ts,
                *schedule, *fired_at, *goal, *retry_of, *retry, *attempt, *due_ms, *carried_from,
                *exit_status, *exit_signal, *stderr_tail;
};

#define KEY_IS(m, lit) ((m)->key_len == sizeof(lit) - 1 && memcmp((m)->key, lit, sizeof(lit) - 1) == 0)

/* One top-level member into r (a later one of the same key replaces it). */
static void rec_member(struct rec *r, const struct kjson_member *m)
{
        const struct kjson *v = m->value;
        if (KEY_IS(m, "op"))
                r->op = v;
        else if (KEY_IS(m, "step_id"))
                r->step_id = v;
        else if (KEY_IS(m, "plan_id"))
                r->plan_id = v;
        else if (KEY_IS(m, "status"))
                r->status = v;
        else if (KEY_IS(m, "ts"))
                r->ts = v;
        else if (KEY_IS(m, "pre_hash"))
                r->pre_hash = v;
        else if (KEY_IS(m, "post_hash"))
                r->post_hash = v;
        else if (KEY_IS(m, "result_hash"))
                r->result_hash = v;
        else if (KEY_IS(m, "idem_key"))
                r->idem_key = v;
        else if (KEY_IS(m, "mandate_id"))
                r->mandate_id = v;
        else if (KEY_IS(m, "cycle"))
                r->cycle = v;
        else if (KEY_IS(m, "plan_hash"))
                r->plan_hash = v;
        else if (KEY_IS(m, "steps"))
                r->steps = v;
        else if (KEY_IS(m, "result"))
                r->result = v;
        else if (KEY_IS(m, "evidence"))
                r->evidence = v;
        else if (KEY_IS(m, "recovered"))
                r->recovered = v;
        else if (KEY_IS(m, "error_class"))
                r->error_class = v;
        else if (KEY_IS(m, "error_msg"))
                r->error_msg = v;
        else if (KEY_IS(m, "reason"))
                r->reason = v;
        else if (KEY_IS(m, "reset"))
                r->reset = v;
        else if (KEY_IS(m, "action"))
                r->action = v;
        else if (KEY_IS(m, "uid"))
                r->uid = v;
        else if (KEY_IS(m, "schedule"))
                r->schedule = v;
        else if (KEY_IS(m, "fired_at"))
                r->fired_at = v;
        else if (KEY_IS(m, "goal"))
                r->goal = v;
        else if (KEY_IS(m, "retry_of"))
                r->retry_of = v;
        else if (KEY_IS(m, "retry"))
                r->retry = v;
        else if (KEY_IS(m, "attempt"))
                r->attempt = v;
        else if (KEY_IS(m, "due_ms"))
                r->due_ms = v;
        else if (KEY_IS(m, "carried_from"))
                r->carried_from = v;
        else if (KEY_IS(m, "exit_status"))
                r->exit_status = v;
        else if (KEY_IS(m, "signal"))
                r->exit_signal = v;
        else if (KEY_IS(m, "stderr"))
                r->stderr_tail = v;
}

static void rec_collect(const struct kjson *obj, struct rec *r)
{
        memset(r, 0, sizeof(*r));
        for (size_t i = 0; i < obj->u.obj.n; i++)
                rec_member(r, &obj->u.obj.members[i]);
}

static bool is_str(const struct kjson *v)
{
        return v && v->type == KJSON_STRING;
}

static bool str_eq(const struct kjson *v, const char *lit)
{
        size_t n = strlen(lit);
        return is_str(v) && v->u.str.len == n && memcmp(v->u.str.ptr, lit, n) == 0;
}

/* Copy a string value into the result arena; NULL if v is not a string.
 * Frequent statuses are interned. */
static int keep_str(struct fold *f, const struct kjson *v, const char **out)
{
#define INTERNED(s) { s, sizeof(s) - 1 }
        static const struct {
                const char *s;
                size_t n;
        } interned[] = {
                INTERNED("pending"), INTERNED("executing"), INTERNED("completed"),
                INTERNED("failed"), INTERNED("needs_review"), INTERNED("abandoned"),
                INTERNED("succeeded"),
        };
#undef INTERNED

        if (!is_str(v)) {
                *out = NULL;
                return 0;
        }
        for (size_t i = 0; i < sizeof(interned) / sizeof(interned[0]); i++) {
                if (v->u.str.len == interned[i].n &&
                    memcmp(v->u.str.ptr, interned[i].s, interned[i].n) == 0) {
                        *out = interned[i].s;
                        return 0;
                }
        }
        /* a string of a line the fast path copied into the result arena
         * is kept where it is */
        const struct fold_internal *in = f->internal;
        uintptr_t at = (uintptr_t)v->u.str.ptr;
        if (at >= (uintptr_t)in->line_lo && at < (uintptr_t)in->line_hi) {
                *out = v->u.str.ptr;
                return 0;
        }
        char *s = kjson_arena_strndup(f->internal->keep, v->u.str.ptr, v->u.str.len);
        if (!s)
                return -ENOMEM;
        *out = s;
        return 0;
}

/* Compact JSON of any value into the result arena; its length to
 * *ret_len (may be NULL). */
static int keep_json_len(struct fold *f, const struct kjson *v, const char **out,
                         size_t *ret_len)
{
        struct fold_internal *in = f->internal;
        const char *text = v->u.raw.text;
        size_t len = v->u.raw.len;

        if (v->type != KJSON_RAW) {
                kbuf_reset(&in->json);
                int r = kjson_write(&in->json, v);
                if (r < 0)
                        return r;
                text = in->json.data ? in->json.data : "";
                len = in->json.len;
        } /* (else fold_feed_own: already the compact text) */
        char *s = kjson_arena_strndup(in->keep, text, len);
        if (!s)
                return -ENOMEM;
        *out = s;
        if (ret_len)
                *ret_len = len;
        return 0;
}

static int keep_json(struct fold *f, const struct kjson *v, const char **out)
{
        return keep_json_len(f, v, out, NULL);
}

static long long num_ll(const struct kjson *v)
{
        char tmp[32];

        if (!v || v->type != KJSON_NUMBER || v->u.num.is_float || v->u.num.len >= sizeof(tmp))
                return 0;
        memcpy(tmp, v->u.num.text, v->u.num.len);
        tmp[v->u.num.len] = '\0';
        return strtoll(tmp, NULL, 10);
}

/* inl: the fold's own room for the first elements (struct fold_mem), or
 * NULL: when *arr is still there, the bigger array is a new one. */
static int grow_from(void **arr, size_t *cap, size_t need, size_t elem, const void *inl)
{
        if (need <= *cap)
                return 0;
        size_t n = *cap ? *cap : 16;
        while (n < need) {
                if (n > SIZE_MAX / 2 / elem)
                        return -ENOMEM;
                n *= 2;
        }
        bool moving = inl && *arr == inl;
        void *p = moving ? malloc(n * elem) : realloc(*arr, n * elem);
        if (!p)
                return -ENOMEM;
        if (moving)
                memcpy(p, inl, *cap * elem);
        *arr = p;
        *cap = n;
        return 0;
}

static int grow(void **arr, size_t *cap, size_t need, size_t elem)
{
        return grow_from(arr, cap, need, elem, NULL);
}

/* A fold and the room for a small WAL's plans, steps and maps, in one
 * allocation: a WAL of one plan of a few steps (startup recovery folds one
 * per WAL) needs no other; a bigger one moves its arrays out as they grow. */
#define FOLD_MEM_PLANS 2
#define FOLD_MEM_STEPS 8
#define FOLD_MEM_MAP 16         /* map entries: up to 8 keys */
struct fold_mem {
        struct fold f;
        struct fold_internal in;
        struct fold_plan plans[FOLD_MEM_PLANS];
        size_t plan_step_cap[FOLD_MEM_PLANS];
        struct fold_step steps[FOLD_MEM_STEPS];
        size_t plan0_steps[FOLD_MEM_STEPS];     /* plans[0].steps */
        struct map_entry step_e[FOLD_MEM_MAP], plan_e[FOLD_MEM_MAP];
};

static struct fold_mem *fold_mem(const struct fold *f)
{
        return (struct fold_mem *)f;
}

static int new_plan(struct fold *f, const char *plan_id, size_t *idx)
{
        struct fold_internal *in = f->internal;
        size_t old_cap = in->cap_plans;
        struct fold_mem *mem = fold_mem(f);
        int r = grow_from((void **)&f->plans, &in->cap_plans, f->nplans + 1, sizeof(*f->plans),
                          mem->plans);
        if (r < 0)
                return r;
        if (in->cap_plans != old_cap) {
                bool moving = in->plan_step_cap == mem->plan_step_cap;
                size_t *c = moving ? malloc(in->cap_plans * sizeof(*c))
                                   : realloc(in->plan_step_cap, in->cap_plans * sizeof(*c));
                if (!c)
                        return -ENOMEM;
                if (moving)
                        memcpy(c, mem->plan_step_cap, old_cap * sizeof(*c));
                in->plan_step_cap = c;
        }
        r = map_put(&in->plan_map, plan_id, f->nplans);
        if (r < 0)
                return r;
        *idx = f->nplans++;
        f->plans[*idx] = (struct fold_plan){ .plan_id = plan_id };
        in->plan_step_cap[*idx] = 0;
        if (*idx == 0) {
                f->plans[0].steps = fold_mem(f)->plan0_steps;
                in->plan_step_cap[0] = FOLD_MEM_STEPS;
        }
        return 0;
}

static int new_step(struct fold *f, size_t plan, const char *step_id, size_t *idx)
{
        struct fold_internal *in = f->internal;
        struct fold_plan *p = &f->plans[plan];
        int r;

        r = grow_from((void **)&f->steps, &in->cap_steps, f->nsteps + 1, sizeof(*f->steps),
                      fold_mem(f)->steps);
        if (r < 0)
                return r;
        r = grow_from((void **)&p->steps, &in->plan_step_cap[plan], p->nsteps + 1,
                      sizeof(*p->steps), fold_mem(f)->plan0_steps);
        if (r < 0)
                return r;
        r = map_put(&in->step_map, step_id, f->nsteps);
        if (r < 0)
                return r;
        *idx = f->nsteps++;
        f->steps[*idx] = (struct fold_step){ .step_id = step_id, .plan_id = p->plan_id, .plan = plan };
        p->steps[p->nsteps++] = *idx;
        return 0;
}

static int op_plan_commit(struct fold *f, const struct rec *rc, size_t line)
{
        struct fold_internal *in = f->internal;
        const char *plan_id;
        size_t pi;
        int r;

        if (!is_str(rc->plan_id))
                return 0;
        if (map_get(&in->plan_map, rc->plan_id->u.str.ptr, &pi)) {
                /* duplicate plan_commit: replace the plan, keep its position */
                struct fold_plan *p = &f->plans[pi];
                plan_id = p->plan_id;
                p->nsteps = 0;
                *p = (struct fold_plan){ .plan_id = plan_id, .steps = p->steps };
        } else {
                r = keep_str(f, rc->plan_id, &plan_id);
                if (r < 0)
                        return r;
                r = new_plan(f, plan_id, &pi);
                if (r < 0)
                        return r;
        }
        struct fold_plan *p = &f->plans[pi];
        p->line = line;
        p->cycle = num_ll(rc->cycle);
        r = keep_str(f, rc->mandate_id, &p->mandate_id);
        if (r < 0)
                return r;
        r = keep_str(f, rc->plan_hash, &p->plan_hash);
        if (r < 0)
                return r;

        if (!rc->steps || rc->steps->type != KJSON_ARRAY)
                return 0;
        for (size_t i = 0; i < rc->steps->u.arr.n; i++) {
                const struct kjson *so = rc->steps->u.arr.items[i];
                const char *sid;
                size_t si;

                if (so->type != KJSON_OBJECT)
                        continue;
                /* its members in one pass (the last of a key wins, as with
                 * kjson_get) */
                const struct kjson *id = NULL, *tool = NULL, *params = NULL, *pre = NULL,
                                   *post = NULL;
                for (size_t k = 0; k < so->u.obj.n; k++) {
                        const struct kjson_member *m = &so->u.obj.members[k];
                        if (KEY_IS(m, "step_id"))
                                id = m->value;
                        else if (KEY_IS(m, "tool"))
                                tool = m->value;
                        else if (KEY_IS(m, "params_hash"))
                                params = m->value;
                        else if (KEY_IS(m, "pre_hash"))
                                pre = m->value;
                        else if (KEY_IS(m, "expected_post_hash"))
                                post = m->value;
                }
                if (!is_str(id))
                        continue;
                r = keep_str(f, id, &sid);
                if (r < 0)
                        return r;
                r = new_step(f, pi, sid, &si);
                if (r < 0)
                        return r;
                struct fold_step *s = &f->steps[si];
                if ((r = keep_str(f, tool, &s->tool)) < 0 ||
                    (r = keep_str(f, params, &s->params_hash)) < 0 ||
                    (r = keep_str(f, pre, &s->pre_hash)) < 0 ||
                    (r = keep_str(f, post, &s->expected_post_hash)) < 0)
                        return r;
        }
        return 0;
}

static int op_append(struct fold *f, const struct rec *rc, size_t line)
{
        struct fold_internal *in = f->internal;
        size_t si, pi;
        int r;

        if (!is_str(rc->step_id))
                return 0;
        if (!map_get(&in->step_map, rc->step_id->u.str.ptr, &si)) {
                /* orphan: a pending step no plan_commit announced */
                struct kbuf id = KBUF_INIT;
                const char *plan_id, *sid;

                if (is_str(rc->plan_id)) {
                        r = kbuf_append(&id, rc->plan_id->u.str.ptr, rc->plan_id->u.str.len);
                } else {
                        r = kbuf_puts(&id, "__orphan_");
                        if (r >= 0)
                                r = kbuf_append(&id, rc->step_id->u.str.ptr, rc->step_id->u.str.len);
                }
                if (r < 0) {
                        kbuf_free(&id);
                        return r;
                }
                bool found = map_get(&in->plan_map, id.data, &pi);
                if (!found) {
                        plan_id = kjson_arena_strndup(in->keep, id.data, id.len);
                        kbuf_free(&id);
                        if (!plan_id)
                                return -ENOMEM;
                        r = new_plan(f, plan_id, &pi);
                        if (r < 0)
                                return r;
                        struct fold_plan *p = &f->plans[pi];
                        p->mandate_id = "unknown";
                        p->orphan_reason = "orphan_steps_detected";
                        p->line = line;
                } else {
                        kbuf_free(&id);
                }
                r = keep_str(f, rc->step_id, &sid);
                if (r < 0)
                        return r;
                r = new_step(f, pi, sid, &si);
                if (r < 0)
                        return r;
        }
        struct fold_step *s = &f->steps[si];
        if (is_str(rc->idem_key)) {
                r = keep_str(f, rc->idem_key, &s->idem_key);
                if (r < 0)
                        return r;
        }
        s->status = "pending";
        s->state = STEP_PENDING;
        s->retry_waiting = false;
        if (!s->plan_id && is_str(rc->plan_id)) {
                r = keep_str(f, rc->plan_id, &s->plan_id);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int apply_str(struct fold *f, const struct kjson *v, const char **field)
{
        if (!is_str(v))
                return 0;
        return keep_str(f, v, field);
}

/* The time from `from` (the last record before a restart) to rc (the first
 * after it) is the restart's: fold.down_ms. */
static void add_down(struct fold *f, const char *from, const struct rec *rc)
{
        int64_t t0, t1;
        if (is_str(rc->ts) && wal_parse_ts(from, &t0) == 0 &&
            wal_parse_ts(rc->ts->u.str.ptr, &t1) == 0 && t1 > t0)
                f->down_ms += t1 - t0;
}

/* An execution that ended without its handler's word: a step executing
 * that recovery completes, runs again or sends to review (or that was
 * killed at shutdown), and then what decided it.  It ran until the last
 * record before the restart: the time kairosd was down is not its. */
static int note_interruption(struct fold *f, const struct rec *rc, struct fold_step *s,
                             enum step_status prev, unsigned prev_interrupted)
{
        int r;
        if (!is_str(rc->status) || s->state == STEP_EXECUTING)
                return 0;
        bool recovered = rc->recovered && rc->recovered->type == KJSON_TRUE;
        bool reset = rc->reset && rc->reset->type == KJSON_TRUE;
        if (prev == STEP_EXECUTING && (recovered || reset || s->state == STEP_NEEDS_REVIEW)) {
                bool killed = s->state == STEP_NEEDS_REVIEW &&
                              str_eq(rc->reason, "killed_at_shutdown");
                s->interrupted_execution = s->executions;
                s->interrupted_started_ts = s->started_ts;
                s->interrupted_ended_ts = NULL;
                if (killed)
                        r = apply_str(f, rc->ts, &s->interrupted_ended_ts);
                else
                        r = (s->interrupted_ended_ts = f->internal->work_ts, 0);
                if (r < 0)
                        return r;
                /* killed at a stop: its record is the stop's (below); else
                 * this record is the first after the restart */
                if (!killed)
                        add_down(f, s->interrupted_ended_ts, rc);
        } else if (!(prev == STEP_NEEDS_REVIEW && prev_interrupted &&
                     prev_interrupted == s->executions)) {
                return 0; /* (a later word on the same interrupted execution: below) */
        } else if (s->decided_ts && s->interrupted_ended_ts &&
                   strcmp(s->decided_ts, s->interrupted_ended_ts) == 0 &&
                   rc->evidence && rc->evidence->type == KJSON_OBJECT &&
                   kjson_get(rc->evidence, "killed_at_shutdown") &&
                   kjson_get(rc->evidence, "killed_at_shutdown")->type == KJSON_TRUE) {
                /* recovery's word on a step killed at a stop, the first
                 * after the stop's record (an operator's says nothing of
                 * the stop: the wait for it is the review's) */
                add_down(f, s->interrupted_ended_ts, rc);
        }
        s->decided_evidence_json = NULL;
        if ((r = apply_str(f, rc->ts, &s->decided_ts)) < 0 ||
            (r = apply_str(f, rc->status, &s->decided_status)) < 0)
                return r;
        if (rc->evidence && (r = keep_json(f, rc->evidence, &s->decided_evidence_json)) < 0)
                return r;
        return 0;
}

static int op_transition(struct fold *f, const struct rec *rc)
{
        size_t si;
        int r;

        if (!is_str(rc->step_id) || !map_get(&f->internal->step_map, rc->step_id->u.str.ptr, &si))
                return 0; /* unknown step: ignored */
        struct fold_step *s = &f->steps[si];
        const enum step_status prev = s->state;
        const unsigned prev_interrupted = s->interrupted_execution;

        if ((r = apply_str(f, rc->status, &s->status)) < 0 ||
            (r = apply_str(f, rc->pre_hash, &s->observed_pre_hash)) < 0 ||
            (r = apply_str(f, rc->post_hash, &s->post_hash)) < 0 ||
            (r = apply_str(f, rc->result_hash, &s->result_hash)) < 0 ||
            (r = apply_str(f, rc->error_class, &s->error_class)) < 0 ||
            (r = apply_str(f, rc->error_msg, &s->error_msg)) < 0 ||
            (r = apply_str(f, rc->reason, &s->reason)) < 0)
                return r;
        if (is_str(rc->status) && (r = keep_str(f, rc->carried_from, &s->carried_from)) < 0)
                return r;
        if (is_str(rc->status)) {
                s->state = step_status_parse(s->status);
                s->retry_waiting = false;
                s->has_exit_status = false;
                s->exit_status = s->exit_signal = 0;
                s->stderr_tail = NULL;
        }
        if (is_str(rc->status) && s->state == STEP_FAILED) {
                if (rc->exit_status && rc->exit_status->type == KJSON_NUMBER) {
                        s->has_exit_status = true;
                        s->exit_status = (int)num_ll(rc->exit_status);
                }
                if (rc->exit_signal && rc->exit_signal->type == KJSON_NUMBER)
                        s->exit_signal = (int)num_ll(rc->exit_signal);
                if ((r = keep_str(f, rc->stderr_tail, &s->stderr_tail)) < 0)
                        return r;
        }
        if (rc->result && (r = keep_json_len(f, rc->result, &s->result_json, &s->result_len)) < 0)
                return r;
        if (rc->evidence && (r = keep_json(f, rc->evidence, &s->evidence_json)) < 0)
                return r;
        if (rc->recovered && (rc->recovered->type == KJSON_TRUE || rc->recovered->type == KJSON_FALSE))
                s->recovered = rc->recovered->type == KJSON_TRUE;
        if ((r = note_interruption(f, rc, s, prev, prev_interrupted)) < 0)
                return r;
        if (is_str(rc->status) && s->state == STEP_EXECUTING) {
                s->executions++;
                s->ended_ts = NULL;
                if ((r = apply_str(f, rc->ts, &s->started_ts)) < 0)
                        return r;
        } else if (is_str(rc->status) && (s->state == STEP_COMPLETED || s->state == STEP_FAILED ||
                                          s->state == STEP_NEEDS_REVIEW)) {
                if ((r = apply_str(f, rc->ts, &s->ended_ts)) < 0)
                        return r;
                /* a phase without command completes without executing: it
                 * started and ended at once */
                if (!s->started_ts && (r = apply_str(f, rc->ts, &s->started_ts)) < 0)
                        return r;
        }
        if (is_str(rc->status) && s->state == STEP_PENDING && rc->reset && rc->reset->type == KJSON_TRUE) {
                /* FIX: a reset forgets the interrupted execution */
                s->observed_pre_hash = NULL;
                s->post_hash = NULL;
                s->result_hash = NULL;
                s->resets++;
        }
        return 0;
}

static int op_finalize(struct fold *f, const struct rec *rc)
{
        size_t pi;
        int r;

        if (!is_str(rc->plan_id) || !map_get(&f->internal->plan_map, rc->plan_id->u.str.ptr, &pi))
                return 0; /* unknown plan: ignored */
        struct fold_plan *p = &f->plans[pi];
        p->finalized = true;
        if ((r = keep_str(f, rc->status, &p->final_status)) < 0 ||
            (r = keep_str(f, rc->reason, &p->final_reason)) < 0)
                return r;
        p->final_state = plan_status_parse(p->final_status);
        return 0;
}

static int op_operator(struct fold *f, const struct rec *rc, size_t line)
{
        struct fold_internal *in = f->internal;
        int r;

        r = grow((void **)&f->operators, &in->cap_operators, f->noperators + 1, sizeof(*f->operators));
        if (r < 0)
                return r;
        struct fold_operator *o = &f->operators[f->noperators];
        *o = (struct fold_operator){ .uid = num_ll(rc->uid), .line = line };
        if ((r = keep_str(f, rc->mandate_id, &o->mandate_id)) < 0 ||
            (r = keep_str(f, rc->action, &o->action)) < 0 ||
            (r = keep_str(f, rc->step_id, &o->step_id)) < 0 ||
            (r = keep_str(f, rc->reason, &o->reason)) < 0 ||
            (r = keep_str(f, rc->ts, &o->ts)) < 0)
                return r;
        f->noperators++;
        return 0;
}

/* A failed step waits to be tried again (RetryAttempts=). */
static int op_retry_wait(struct fold *f, const struct rec *rc)
{
        struct fold_internal *in = f->internal;
        size_t si;
        int r;

        if (!is_str(rc->step_id) || !map_get(&in->step_map, rc->step_id->u.str.ptr, &si))
                return 0; /* unknown step: ignored */
        r = grow((void **)&f->retries, &in->cap_retries, f->nretries + 1, sizeof(*f->retries));
        if (r < 0)
                return r;
        struct fold_step *s = &f->steps[si];
        struct fold_retry *t = &f->retries[f->nretries];
        long long due = num_ll(rc->due_ms);
        *t = (struct fold_retry){ .step = si, .attempt = num_ll(rc->attempt), .due_ms = due,
                                  .error_msg = s->error_msg, .started_ts = s->started_ts,
                                  .ended_ts = s->ended_ts };
        if ((r = keep_str(f, rc->error_class, &t->error_class)) < 0 ||
            (r = keep_str(f, rc->ts, &t->ts)) < 0)
                return r;
        f->nretries++;
        s->retries++;
        s->retry_due_ms = due;
        s->retry_waiting = s->state == STEP_FAILED;
        return 0;
}

/* kairos's first record: who fired the mandate.  The last one wins. */
static int op_mandate(struct fold *f, const struct rec *rc, size_t line)
{
        struct fold_mandate *md = &f->mandate;
        int r;
        *md = (struct fold_mandate){ .line = line };
        if ((r = keep_str(f, rc->mandate_id, &md->mandate_id)) < 0 ||
            (r = keep_str(f, rc->schedule, &md->schedule)) < 0 ||
            (r = keep_str(f, rc->fired_at, &md->fired_at)) < 0 ||
            (r = keep_str(f, rc->goal, &md->goal)) < 0 ||
            (r = keep_str(f, rc->retry_of, &md->retry_of)) < 0 ||
            (r = keep_str(f, rc->ts, &md->ts)) < 0)
                return r;
        md->retry = md->retry_of ? num_ll(rc->retry) : 0;
        return 0;
}

static int apply_op(struct fold *f, const struct rec *rc, size_t line);

static int apply_rec(struct fold *f, const struct rec *rcp, size_t line)
{
        const struct rec rc = *rcp;

        if (is_str(rc.ts)) {
                int r = keep_str(f, rc.ts, &f->last_ts);
                if (r < 0)
                        return r;
                if (!f->first_ts)
                        f->first_ts = f->last_ts;
        }
        int r = apply_op(f, &rc, line);
        if (r == 0 && is_str(rc.ts) && !str_eq(rc.op, "operator"))
                f->internal->work_ts = f->last_ts;
        return r;
}

static int apply_record(struct fold *f, const struct kjson *obj, size_t line)
{
        struct rec rc;

        rec_collect(obj, &rc);
        return apply_rec(f, &rc, line);
}

static int apply_op(struct fold *f, const struct rec *rcp, size_t line)
{
        const struct rec rc = *rcp;
        if (str_eq(rc.op, "plan_commit"))
                return op_plan_commit(f, &rc, line);
        if (str_eq(rc.op, "append"))
                return op_append(f, &rc, line);
        if (str_eq(rc.op, "transition"))
                return op_transition(f, &rc);
        if (str_eq(rc.op, "plan_finalize"))
                return op_finalize(f, &rc);
        if (str_eq(rc.op, "operator"))
                return op_operator(f, &rc, line);
        if (str_eq(rc.op, "mandate"))
                return op_mandate(f, &rc, line);
        if (str_eq(rc.op, "retry_wait"))
                return op_retry_wait(f, &rc);
        if (str_eq(rc.op, "owner")) {
                /* who holds the mandate changes nothing in its steps */
                f->owner_records++;
                return 0;
        }
        f->unknown_ops++;
        return 0;
}

/* ---- the fast path: a record's members straight from its line ----
 *
 * Startup recovery folds every line of every WAL, and a parse of each line
 * into a tree was most of its CPU.  kairos writes its records compact and
 * plain; such a line is read here in one pass: the members of the record go
 * straight into a struct rec, every string pointing into one copy of the
 * line (NUL-terminated there, not copied again), a nested value (a plan's
 * steps, a result, evidence) built as a small tree in the scratch arena.
 * Only a strict subset of JSON is taken: no whitespace outside strings;
 * strings of ASCII without control bytes, escapes but \u; containers at
 * most FAST_DEPTH deep with at most FAST_ITEMS members or items each;
 * exactly one crc member.  On that subset the values
 * are the ones kjson_parse builds.  Anything else, or any doubt, returns 0
 * before anything is changed and the line takes the general path
 * (crcline_check and the tree): what the fold decides never depends on this
 * path.  fold_buffer_tree folds without it; tests/unit/test_fold.c and
 * tests/fuzz/fuzz_fold.c compare the two. */

#define FAST_DEPTH 6   /* containers around a value, the record's included */
#define FAST_ITEMS 64  /* members or items of one nested container */
#define FAST_TOP 48    /* members of the record */
#define FAST_KEEP_LINE 4096 /* a line up to this long is copied into the result's arena */

struct fast {
        struct kjson_arena *a;
        char *p;         /* the next byte, in the copy */
        const char *end; /* the copy's end: 8 NULs */
};

static inline bool fast_plain(unsigned char c)
{
        return c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
}

/* Not all of the 8 bytes at p plain?  (The copy has 8 NULs after the line,
 * so that this may read past its end.)  Exact for "all plain": the lowest
 * byte below 0x20, or equal to '"' or '\\', sets its high bit in the
 * differences (no borrow reaches it from below); a byte of 0x80 or more
 * has its own.  Above such a byte it may err, towards "not all". */
static inline bool fast_stop8(const char *p)
{
        const uint64_t ones = 0x0101010101010101ULL;
        uint64_t w;
        memcpy(&w, p, sizeof w);
        uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
        return ((w | (w - ones * 0x20) | (q - ones) | (b - ones)) & (ones * 0x80)) != 0;
}

/* At the opening quote: the string, decoded in place in the copy (an
 * escape only shrinks it) and ended by a NUL there. */
static int fast_str(struct fast *F, const char **ret, size_t *ret_len)
{
        char *s = F->p + 1, *q = s, *d = NULL; /* d: where bytes go once an escape was seen */
        for (;;) {
                if (!d)
                        while (!fast_stop8(q))
                                q += 8;
                while (fast_plain((unsigned char)*q)) {
                        if (d)
                                *d++ = *q;
                        q++;
                }
                if (*q == '"')
                        break;
                if (*q != '\\')
                        return 0; /* a control or non-ASCII byte, or the end */
                char c;
                switch (q[1]) {
                case '"': c = '"'; break;
                case '\\': c = '\\'; break;
                case '/': c = '/'; break;
                case 'b': c = '\b'; break;
                case 'f': c = '\f'; break;
                case 'n': c = '\n'; break;
                case 'r': c = '\r'; break;
                case 't': c = '\t'; break;
                default:
                        return 0; /* \u (or a bad escape) */
                }
                if (!d)
                        d = q;
                *d++ = c;
                q += 2;
        }
        char *e = d ? d : q;
        *e = '\0';
        *ret = s;
        *ret_len = (size_t)(e - s);
        F->p = q + 1;
        return 1;
}

static inline bool fast_digit(char c)
{
        return c >= '0' && c <= '9';
}

/* A number, its text as written (RFC 8259's grammar, as kjson reads it). */
static int fast_num(struct fast *F, struct kjson *v)
{
        const char *s = F->p, *p = s;
        bool is_float = false;
        if (*p == '-')
                p++;
        if (*p == '0') {
                p++;
        } else if (*p >= '1' && *p <= '9') {
                while (fast_digit(*p))
                        p++;
        } else {
                return 0;
        }
        if (*p == '.') {
                is_float = true;
                if (!fast_digit(*++p))
                        return 0;
                while (fast_digit(*p))
                        p++;
        }
        if (*p == 'e' || *p == 'E') {
                is_float = true;
                p++;
                if (*p == '+' || *p == '-')
                        p++;
                if (!fast_digit(*p))
                        return 0;
                while (fast_digit(*p))
                        p++;
        }
        size_t len = (size_t)(p - s);
        char *text = kjson_arena_strndup(F->a, s, len);
        if (!text)
                return -ENOMEM;
        *v = (struct kjson){ .type = KJSON_NUMBER,
                             .u.num = { .text = text, .len = len, .is_float = is_float } };
        F->p += len;
        return 1;
}

static int fast_lit(struct fast *F, const char *lit, size_t n, enum kjson_type t,
                    struct kjson *v)
{
        if (strncmp(F->p, lit, n) != 0)
                return 0;
        v->type = t;
        F->p += n;
        return 1;
}

static int fast_value(struct fast *F, int depth, struct kjson *v);

/* An object or array inside the record; depth: containers around it. */
static int fast_container(struct fast *F, int depth, struct kjson *v)
{
        bool obj = *F->p == '{';
        char close = obj ? '}' : ']';
        struct kjson_member m[FAST_ITEMS];
        struct kjson *item[FAST_ITEMS];
        size_t n = 0;
        int r;

        if (depth >= FAST_DEPTH)
                return 0;
        F->p++;
        if (*F->p == close) {
                F->p++;
        } else {
                for (;;) {
                        if (n == FAST_ITEMS)
                                return 0;
                        struct kjson *x = kjson_arena_alloc(F->a, sizeof(*x));
                        if (!x)
                                return -ENOMEM;
                        if (obj) {
                                if (*F->p != '"')
                                        return 0;
                                if ((r = fast_str(F, &m[n].key, &m[n].key_len)) <= 0)
                                        return r;
                                if (*F->p != ':')
                                        return 0;
                                F->p++;
                                m[n].value = x;
                        } else {
                                item[n] = x;
                        }
                        if ((r = fast_value(F, depth + 1, x)) <= 0)
                                return r;
                        n++;
                        if (*F->p == ',') {
                                F->p++;
                                continue;
                        }
                        if (*F->p != close)
                                return 0;
                        F->p++;
                        break;
                }
        }
        void *items = NULL;
        size_t size = obj ? sizeof(m[0]) : sizeof(item[0]);
        if (n && !(items = kjson_arena_alloc(F->a, n * size)))
                return -ENOMEM;
        if (n)
                memcpy(items, obj ? (void *)m : (void *)item, n * size);
        if (obj)
                *v = (struct kjson){ .type = KJSON_OBJECT, .u.obj = { items, n } };
        else
                *v = (struct kjson){ .type = KJSON_ARRAY, .u.arr = { items, n } };
        return 1;
}

static int fast_value(struct fast *F, int depth, struct kjson *v)
{
        switch (*F->p) {
        case '"':
                v->type = KJSON_STRING;
                return fast_str(F, &v->u.str.ptr, &v->u.str.len);
        case '{':
        case '[':
                return fast_container(F, depth, v);
        case 't':
                return fast_lit(F, "true", 4, KJSON_TRUE, v);
        case 'f':
                return fast_lit(F, "false", 5, KJSON_FALSE, v);
        case 'n':
                return fast_lit(F, "null", 4, KJSON_NULL, v);
        case '-':
        case '0': case '1': case '2': case '3': case '4':
        case '5': case '6': case '7': case '8': case '9':
                return fast_num(F, v);
        default:
                return 0;
        }
}

/* The record at F->p into *rc, its values in top[FAST_TOP]: 1, or 0 (not
 * taken), or -ENOMEM. */
static int fast_record(struct fast *F, struct kjson *top, struct rec *rc)
{
        size_t n = 0, ncrc = 0;
        int r;

        memset(rc, 0, sizeof(*rc));
        if (*F->p != '{')
                return 0;
        F->p++;
        for (;;) {
                struct kjson_member m;
                if (n == FAST_TOP || *F->p != '"')
                        return 0;
                if ((r = fast_str(F, &m.key, &m.key_len)) <= 0)
                        return r;
                if (*F->p != ':')
                        return 0;
                F->p++;
                m.value = &top[n];
                if ((r = fast_value(F, 1, &top[n])) <= 0)
                        return r;
                n++;
                if (KEY_IS(&m, "crc"))
                        ncrc++;
                rec_member(rc, &m);
                if (*F->p == ',') {
                        F->p++;
                        continue;
                }
                if (*F->p != '}')
                        return 0;
                F->p++;
                break;
        }
        /* the whole line, and the crc once (the suffix made it the last) */
        return F->p == F->end && ncrc == 1;
}

/* crcline_scan's fast callback (a terminated line, its crc good). */
static int fold_fast(void *ctx, const char *l, size_t n, size_t line)
{
        struct fold *f = ctx;
        struct kjson_arena *a = f->internal->scratch;
        struct kjson top[FAST_TOP];
        struct rec rc;

        if (n > SIZE_MAX - 8)
                return 0;
        kjson_arena_reset(a);
        /* A short line is copied where the fold's strings are kept: its
         * strings are then kept without a copy each (keep_str).  A long one
         * (a result) goes to the scratch, its strings copied as needed. */
        bool in_keep = n <= FAST_KEEP_LINE;
        char *copy = kjson_arena_alloc(in_keep ? f->internal->keep : a, n + 8);
        if (!copy)
                return -ENOMEM;
        memcpy(copy, l, n);
        memset(copy + n, 0, 8); /* the end, and room for fast_stop8 */
        struct fast F = { .a = a, .p = copy, .end = copy + n };
        int r = fast_record(&F, top, &rc);
        if (r <= 0)
                return r;
        if (in_keep) {
                f->internal->line_lo = copy;
                f->internal->line_hi = copy + n + 8;
        }
        r = apply_rec(f, &rc, line);
        f->internal->line_lo = f->internal->line_hi = NULL;
        if (r < 0)
                return r;
        f->fast_records++;
        return 1;
}

/* ---- the scan: lines, crc, torn tail (crcline.c) ---- */

static int fold_record(void *ctx, const struct kjson *obj, size_t line, bool legacy)
{
        (void)legacy;
        return apply_record(ctx, obj, line);
}

static int fold_run(struct fold *f, const char *data, size_t len, bool fast)
{
        struct crcline_scan s = {
                .flags = CRCLINE_LEGACY,
                .record = fold_record,
                .fast = fast ? fold_fast : NULL,
                .ctx = f,
                .arena = f->internal->scratch,
        };
        struct crcline_result res;
        int r = crcline_scan(&s, data, len, &res);
        if (r < 0)
                return r;
        f->status = res.status == CRCLINE_CLEAN ? FOLD_CLEAN
                    : res.status == CRCLINE_TORN ? FOLD_TORN
                                                 : FOLD_CORRUPT;
        f->lines = res.lines;
        f->records = res.records;
        f->legacy_records = res.legacy_records;
        f->good_end = res.good_end;
        f->bad_line = res.bad_line;
        f->bad_offset = res.bad_offset;
        snprintf(f->bad_reason, sizeof(f->bad_reason), "%s", res.bad_reason);
        return 0;
}

/* The arena of a fold's strings is kept per thread when the fold is freed
 * and reset for the next fold_new there: startup recovery folds and frees
 * one WAL after another on each pool thread, and a first chunk malloc'd and
 * freed per WAL (a request large enough to consolidate the fast bins each
 * time) was the biggest of its mallocs.  Only a small one is kept, so what
 * a thread keeps stays small; a fold freed on another thread leaves its
 * arena to that thread. */
#define KEEP_KEEP_BYTES (64u * 1024u)
static _Thread_local struct kjson_arena *keep_kept;

static void keep_release(struct kjson_arena *a)
{
        if (a && !keep_kept && kjson_arena_capacity(a) <= KEEP_KEEP_BYTES) {
                kjson_arena_reset(a);
                keep_kept = a;
                return;
        }
        kjson_arena_free(a);
}

static void fold_internal_free(struct fold *f)
{
        struct fold_internal *in = f->internal;

        if (!in)
                return;
        keep_release(in->keep);
        kjson_arena_free(in->scratch);
        kbuf_free(&in->json);
        if (!in->step_map.inl)
                free(in->step_map.e);
        if (!in->plan_map.inl)
                free(in->plan_map.e);
        if (in->plan_step_cap != fold_mem(f)->plan_step_cap)
                free(in->plan_step_cap);
        f->internal = NULL;
}

void fold_free(struct fold *f)
{
        if (!f)
                return;
        struct fold_mem *mem = fold_mem(f);
        for (size_t i = 0; i < f->nplans; i++)
                if (f->plans[i].steps != mem->plan0_steps)
                        free(f->plans[i].steps);
        if (f->plans != mem->plans)
                free(f->plans);
        if (f->steps != mem->steps)
                free(f->steps);
        free(f->operators);
        free(f->retries);
        fold_internal_free(f);
        free(mem);
}

int fold_new(struct fold **ret_fold)
{
        struct fold *f;

        *ret_fold = NULL;
        /* (only what is read before it is written is cleared) */
        struct fold_mem *mem = malloc(sizeof(*mem));
        if (!mem)
                return -ENOMEM;
        mem->f = (struct fold){ 0 };
        mem->in = (struct fold_internal){ 0 };
        f = &mem->f;
        f->internal = &mem->in;
        f->plans = mem->plans;
        f->internal->cap_plans = FOLD_MEM_PLANS;
        f->internal->plan_step_cap = mem->plan_step_cap;
        f->steps = mem->steps;
        f->internal->cap_steps = FOLD_MEM_STEPS;
        memset(mem->step_e, 0, sizeof(mem->step_e));
        memset(mem->plan_e, 0, sizeof(mem->plan_e));
        f->internal->step_map = (struct map){ .e = mem->step_e, .cap = FOLD_MEM_MAP, .inl = true };
        f->internal->plan_map = (struct map){ .e = mem->plan_e, .cap = FOLD_MEM_MAP, .inl = true };
        f->internal->keep = keep_kept ? keep_kept : kjson_arena_new();
        keep_kept = NULL;
        if (!f->internal->keep) {
                fold_free(f);
                return -ENOMEM;
        }
        f->status = FOLD_CLEAN;
        *ret_fold = f;
        return 0;
}

/* The parse scratch of a small buffer is kept per thread and reset for
 * the next one: startup recovery folds one WAL after another on each pool
 * thread, and an arena made and freed per WAL was a malloc and a free of
 * its chunks each time.  A buffer larger than this gets an arena of its
 * own, freed at once, so what a thread keeps stays small. */
#define SCRATCH_KEEP_INPUT (64u * 1024u)
static _Thread_local struct kjson_arena *scratch_kept;

static int fold_buffer_with(const char *data, size_t len, bool fast, struct fold **out)
{
        struct fold *f;
        int r;

        r = fold_new(&f);
        if (r < 0)
                return r;
        bool keep = len <= SCRATCH_KEEP_INPUT;
        struct kjson_arena *scratch = keep ? scratch_kept : NULL;
        if (!scratch && !(scratch = kjson_arena_new())) {
                fold_free(f);
                return -ENOMEM;
        }
        if (keep)
                scratch_kept = scratch;
        f->internal->scratch = scratch;
        r = fold_run(f, data ? data : "", data ? len : 0, fast);
        /* the parse scratch is not needed any more */
        f->internal->scratch = NULL;
        if (keep)
                kjson_arena_reset(scratch);
        else
                kjson_arena_free(scratch);
        if (r < 0) {
                fold_free(f);
                return r;
        }
        kbuf_free(&f->internal->json);
        *out = f;
        return 0;
}

int fold_buffer(const char *data, size_t len, struct fold **out)
{
        return fold_buffer_with(data, len, true, out);
}

int fold_buffer_tree(const char *data, size_t len, struct fold **out)
{
        return fold_buffer_with(data, len, false, out);
}

static int feed(struct fold *f, const char *data, size_t len, unsigned flags, size_t *ret_used)
{
        size_t pos = 0;
        int r = 0;

        *ret_used = 0;
        if (!f || !f->internal)
                return -EINVAL;
        if (f->status == FOLD_CORRUPT)
                return -EBADMSG;
        if (!f->internal->scratch && !(f->internal->scratch = kjson_arena_new()))
                return -ENOMEM;
        while (pos < len) {
                const char *l = data + pos;
                const char *nl = memchr(l, '\n', len - pos);
                if (!nl)
                        break; /* an unterminated tail: not yet */
                size_t n = (size_t)(nl - l), next = pos + n + 1;
                if (n > 0 && l[n - 1] == '\r')
                        n--;
                f->lines++;
                size_t k = 0;
                while (k < n && (l[k] == ' ' || l[k] == '\t'))
                        k++;
                if (k == n) {
                        pos = next;
                        *ret_used = pos;
                        continue;
                }
                const struct kjson *obj = NULL;
                bool legacy = false;
                char reason[sizeof(f->bad_reason)];
                r = crcline_check(f->internal->scratch, CRCLINE_LEGACY | flags, l, n, &obj, &legacy,
                                  reason, sizeof(reason));
                if (r < 0)
                        break;
                if (r == 0) {
                        f->status = FOLD_CORRUPT;
                        f->bad_line = f->lines;
                        f->bad_offset = f->good_end + pos;
                        snprintf(f->bad_reason, sizeof(f->bad_reason), "%s", reason);
                        r = -EBADMSG;
                        break;
                }
                r = apply_record(f, obj, f->lines);
                if (r < 0)
                        break;
                f->records++;
                if (legacy)
                        f->legacy_records++;
                pos = next;
                *ret_used = pos;
        }
        f->good_end += *ret_used;
        /* bound the memory a long-lived fold keeps between calls */
        kjson_arena_reset(f->internal->scratch);
        return r < 0 ? r : 0;
}

int fold_feed(struct fold *f, const char *data, size_t len, size_t *ret_used)
{
        return feed(f, data, len, 0, ret_used);
}

int fold_feed_own(struct fold *f, const char *data, size_t len, size_t *ret_used)
{
        return feed(f, data, len, CRCLINE_OWN, ret_used);
}

int fold_file(const char *path, struct fold **out)
{
        char *data = NULL;
        size_t len = 0;

        *out = NULL;
        int r = kio_read_file(path, 0, 0, &data, &len);
        if (r == 0)
                r = fold_buffer(data, len, out);
        free(data);
        return r;
}

const struct fold_step *fold_find_step(const struct fold *f, const char *step_id)
{
        size_t i;

        if (!f || !step_id || !f->internal || !map_get(&f->internal->step_map, step_id, &i))
                return NULL;
        return &f->steps[i];
}

const struct fold_plan *fold_find_plan(const struct fold *f, const char *plan_id)
{
        size_t i;

        if (!f || !plan_id || !f->internal || !map_get(&f->internal->plan_map, plan_id, &i))
                return NULL;
        return &f->plans[i];
}

bool fold_step_finalized(const struct fold_step *s)
{
        return s && (s->state == STEP_COMPLETED || s->state == STEP_FAILED ||
                     s->state == STEP_ABANDONED);
}

static const char *const step_names[] = {
        [STEP_PENDING] = "pending",       [STEP_EXECUTING] = "executing",
        [STEP_COMPLETED] = "completed",   [STEP_FAILED] = "failed",
        [STEP_NEEDS_REVIEW] = "needs_review", [STEP_ABANDONED] = "abandoned",
};

static const char *const plan_names[] = {
        [PLAN_SUCCEEDED] = "succeeded",
        [PLAN_FAILED] = "failed",
        [PLAN_ABANDONED] = "abandoned",
};

enum step_status step_status_parse(const char *text)
{
        if (!text)
                return STEP_NONE;
        for (size_t i = 0; i < sizeof step_names / sizeof step_names[0]; i++)
                if (step_names[i] && strcmp(step_names[i], text) == 0)
                        return (enum step_status)i;
        return STEP_OTHER;
}

enum plan_status plan_status_parse(const char *text)
{
        for (size_t i = 0; text && i < sizeof plan_names / sizeof plan_names[0]; i++)
                if (plan_names[i] && strcmp(plan_names[i], text) == 0)
                        return (enum plan_status)i;
        return PLAN_OTHER;
}

const char *step_status_name(enum step_status s)
{
        return (size_t)s < sizeof step_names / sizeof step_names[0] ? step_names[s] : NULL;
}

const char *plan_status_name(enum plan_status s)
{
        return (size_t)s < sizeof plan_names / sizeof plan_names[0] ? plan_names[s] : NULL;
}

const char *fold_status_name(enum fold_status s)
{
        switch (s) {
        case FOLD_CLEAN:
                return "clean";
        case FOLD_TORN:
                return "torn";
        case FOLD_CORRUPT:
                return "corrupt";
        }
        return "unknown";
}
