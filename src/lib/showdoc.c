/* SPDX-License-Identifier: MIT */
/* showdoc: list's and show's documents (kairos/showdoc.h). */
#include "kairos/showdoc.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "kairos/evidence.h"
#include "kairos/idem.h"
#include "kairos/kio.h"
#include "kairos/kjson.h"
#include "kairos/wal.h"

static json_t *str_or_null(const char *s)
{
        return s ? json_string(s) : json_null();
}

/* ---- order and rows ---- */

const char *const showdoc_status_names[SHOWDOC_NSTATUS + 1] = {
        "runnable", "running", "idle", "paused", "paused_review", "probing",
        "awaiting_approval", "quarantined", "wal_io_error", "done", "failed",
        "terminated", "abandoned", "cancelled", NULL,
};

bool showdoc_status_known(const char *name)
{
        for (size_t i = 0; showdoc_status_names[i]; i++)
                if (strcmp(showdoc_status_names[i], name) == 0)
                        return true;
        return false;
}

int64_t showdoc_fired_key(const char *s)
{
        static const char form[] = "dddd-dd-ddTdd:dd:ddZ";
        int64_t k = 0;
        if (!s || strlen(s) != sizeof(form) - 1)
                return -1;
        for (size_t i = 0; form[i]; i++) {
                if (form[i] != 'd') {
                        if (s[i] != form[i])
                                return -1;
                } else if (s[i] < '0' || s[i] > '9') {
                        return -1;
                } else {
                        k = k * 10 + (s[i] - '0');
                }
        }
        return k;
}

int showdoc_order(int64_t ka, const char *fa, const char *ia, int64_t kb, const char *fb,
                  const char *ib)
{
        if (ka >= 0 && kb >= 0 && ka != kb)
                return ka < kb ? 1 : -1;
        int c = strcmp(fb ? fb : "", fa ? fa : "");
        return c ? c : strcmp(ib, ia);
}

static int order(const struct showdoc_mandate *a, const struct showdoc_mandate *b)
{
        return showdoc_order(a->fired_key, a->fired_at, a->id, b->fired_key, b->fired_at, b->id);
}

json_t *showdoc_ms_json(int64_t ms)
{
        if (ms <= 0)
                return json_null();
        char ts[32];
        wal_format_ts(ms, ts);
        return json_string(ts);
}

json_t *showdoc_mandate_json(const struct showdoc_mandate *m)
{
        json_t *o = json_pack("{s:s, s:s, s:s?, s:s?, s:s?, s:I, s:s?, s:s?}", "id", m->id,
                              "status", m->status, "reason", m->reason, "review_step",
                              m->review_step, "plan_id", m->plan_id, "cycle",
                              (json_int_t)m->cycle, "schedule", m->schedule, "fired_at",
                              m->fired_at);
        json_object_set_new(o, "started_at", showdoc_ms_json(m->started_ms));
        json_object_set_new(o, "ended_at", showdoc_ms_json(m->ended_ms));
        return o;
}

json_t *showdoc_row_json(const struct showdoc_mandate *m)
{
        json_t *o = showdoc_mandate_json(m);
        int64_t ran = m->ended_ms - m->started_ms;
        if (m->down_ms > 0)
                ran = m->down_ms < ran ? ran - m->down_ms : 0;
        json_object_set_new(o, "duration_ms",
                            m->started_ms > 0 && m->ended_ms >= m->started_ms
                                    ? json_integer(ran)
                                    : json_null());
        return o;
}

static bool matches(const struct showdoc_filter *f, const struct showdoc_mandate *m)
{
        if (f->status && (!m->status || strcmp(m->status, f->status) != 0))
                return false;
        if (f->schedule && (!m->schedule || strcmp(m->schedule, f->schedule) != 0))
                return false;
        if (f->since && (!m->fired_at || strcmp(m->fired_at, f->since) < 0))
                return false;
        if (f->after && order(m, f->after) <= 0)
                return false;
        return true;
}

int showdoc_list(const struct showdoc_rows *src, const struct showdoc_filter *filter,
                 size_t limit, json_t **ret_result)
{
        struct showdoc_filter f = *filter;
        size_t n = src->n;
        struct showdoc_mandate row;
        /* the rows are v[end - 1], v[end - 2], ... where end is the
         * cursor's place (the rows strictly after it) */
        size_t end = n;
        if (f.after) {
                size_t lo = 0, hi = n;
                while (lo < hi) {
                        size_t mid = lo + (hi - lo) / 2;
                        src->get(src->ctx, mid, &row);
                        if (order(&row, f.after) > 0)
                                lo = mid + 1;
                        else
                                hi = mid;
                }
                end = lo;
                f.after = NULL;  /* the cut is made */
        }
        bool any = f.status || f.schedule || f.since;
        json_t *arr = json_array();
        size_t kept = 0, total = 0;
        char *last = NULL;
        for (size_t i = end; i-- > 0;) {
                src->get(src->ctx, i, &row);
                if (!limit || kept < limit) {
                        if (any && !matches(&f, &row))
                                continue;
                        json_array_append_new(arr, showdoc_row_json(&row));
                        free(last);
                        last = strdup(row.id);
                        kept++;
                        total++;
                        continue;
                }
                if (!any) {
                        total = end;  /* every one matches */
                        break;
                }
                total += matches(&f, &row);
        }
        json_t *res = json_pack("{s:o, s:I, s:b}", "mandates", arr, "total", (json_int_t)total,
                                "more", total > kept);
        if (res && total > kept && last)
                json_object_set_new(res, "next", json_string(last));
        free(last);
        if (!res)
                return -ENOMEM;
        *ret_result = res;
        return 0;
}

json_t *showdoc_retried_by(const struct showdoc_rows *src, const char *id)
{
        json_t *arr = json_array();
        int best_prev = 0;
        struct showdoc_mandate o;
        /* a few retries at most: repeated scans keep it simple */
        for (;;) {
                char *next = NULL;
                int next_retry = 0;
                for (size_t i = 0; i < src->n; i++) {
                        src->get(src->ctx, i, &o);
                        if (o.retry_of && strcmp(o.retry_of, id) == 0 && o.retry > best_prev &&
                            (!next || o.retry < next_retry)) {
                                free(next);
                                next = strdup(o.id);
                                next_retry = o.retry;
                        }
                }
                if (!next)
                        break;
                json_array_append_new(arr, json_string(next));
                free(next);
                best_prev = next_retry;
        }
        return arr;
}

/* ---- summaries ---- */

int showdoc_summary_read(const char *path, struct showdoc_mandate *ret_m,
                         const char **ret_archive, json_t **ret_json, char *why, size_t why_len)
{
        json_error_t err;
        json_t *j = json_load_file(path, 0, &err);
        *ret_json = NULL;
        if (!j) {
                snprintf(why, why_len, "%s", err.text);
                return -EINVAL;
        }
        const char *id = json_string_value(json_object_get(j, "mandate_id"));
        const char *status = json_string_value(json_object_get(j, "status"));
        const char *archive = json_string_value(json_object_get(j, "archive"));
        if (!id || !status || !archive) {
                snprintf(why, why_len, "missing fields");
                json_decref(j);
                return -EINVAL;
        }
        struct showdoc_mandate m = {
                .id = id,
                .status = status,
                .reason = json_string_value(json_object_get(j, "reason")),
                .plan_id = json_string_value(json_object_get(j, "plan_id")),
                .cycle = json_integer_value(json_object_get(j, "cycles")),
                .schedule = json_string_value(json_object_get(j, "schedule")),
                .fired_at = json_string_value(json_object_get(j, "fired_at")),
                .started_ms = json_integer_value(json_object_get(j, "started_ms")),
                .ended_ms = json_integer_value(json_object_get(j, "ended_ms")),
                .down_ms = json_integer_value(json_object_get(j, "down_ms")),
        };
        if (!m.ended_ms)
                m.ended_ms = json_integer_value(json_object_get(j, "ended_at")) * 1000;
        m.fired_key = showdoc_fired_key(m.fired_at);
        json_int_t n = json_integer_value(json_object_get(j, "retry"));
        const char *v = json_string_value(json_object_get(j, "retry_of"));
        if (v && n >= 1 && n <= INT32_MAX) {
                m.retry_of = v;
                m.retry = (int)n;
        }
        *ret_m = m;
        *ret_archive = archive;
        *ret_json = j;
        return 0;
}

/* ---- show ---- */

int showdoc_fold_file(const char *path, bool gzipped, struct fold **ret_fold)
{
        if (!gzipped)
                return fold_file(path, ret_fold);
        char *data = NULL;
        size_t len = 0;
        int r = kio_read_file(path, 0, KIO_READ_GZIP, &data, &len);
        if (r == 0)
                r = fold_buffer(data, len, ret_fold);
        free(data);
        return r;
}

/* A handler's result (or a recovery's evidence) goes into a reply as the
 * WAL holds it, numbers digit for digit: jansson would turn an integer
 * beyond 64 bits into text and re-print 0.1 as 0.10000000000000001.  The
 * tree carries a placeholder string, RAW_MARK and a per-process random
 * token followed by the value's compact text in hex, which showdoc_print
 * replaces with the text itself.  The token is unknown outside the process:
 * no handler's string can pose as a placeholder. */
#define RAW_MARK "kairos.raw."
static char raw_token[sizeof RAW_MARK + 32];
static pthread_once_t raw_token_once = PTHREAD_ONCE_INIT;

static void raw_token_init(void)
{
        unsigned char rnd[16];
        if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
                /* no entropy: still unguessable enough for a marker nobody sees */
                struct timespec ts;
                clock_gettime(CLOCK_MONOTONIC, &ts);
                uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
                             ((uint64_t)getpid() << 48) ^ (uint64_t)(uintptr_t)&ts;
                for (size_t i = 0; i < sizeof rnd; i++, x = x * 6364136223846793005u + 1)
                        rnd[i] = (unsigned char)(x >> 56);
        }
        char *p = raw_token + snprintf(raw_token, sizeof raw_token, "%s", RAW_MARK);
        for (size_t i = 0; i < sizeof rnd; i++)
                p += snprintf(p, 3, "%02x", rnd[i]);
}

static json_t *raw_json(const char *text)
{
        struct kjson_arena *a = kjson_arena_new();
        struct kjson *v = NULL;
        struct kjson_error err;
        struct kbuf compact = KBUF_INIT, mark = KBUF_INIT;
        json_t *out = NULL;
        pthread_once(&raw_token_once, raw_token_init);
        if (a && kjson_parse(a, text, strlen(text), &v, &err) == 0 &&
            kjson_write(&compact, v) == 0 && kbuf_puts(&mark, raw_token) == 0 &&
            kbuf_putc(&mark, '.') == 0 && kbuf_reserve(&mark, 2 * compact.len) == 0) {
                static const char hex[] = "0123456789abcdef";
                for (size_t i = 0; i < compact.len; i++) {
                        unsigned char c = (unsigned char)compact.data[i];
                        mark.data[mark.len++] = hex[c >> 4];
                        mark.data[mark.len++] = hex[c & 15];
                }
                mark.data[mark.len] = '\0';
                out = json_string(mark.data);
        }
        kjson_arena_free(a);
        kbuf_free(&compact);
        kbuf_free(&mark);
        return out ? out : json_string(text); /* not JSON: kept as text */
}

static int unhex(char c)
{
        return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

int showdoc_print(json_t *result, struct kbuf *b)
{
        char *text = json_dumps(result, JSON_COMPACT);
        pthread_once(&raw_token_once, raw_token_init);
        size_t tlen = strlen(raw_token);
        int r = text ? 0 : -ENOMEM;
        const char *s = text;
        for (const char *q; r == 0 && (q = strstr(s, raw_token));) {
                /* the dumped placeholder: "TOKEN.HEX" */
                if (q == text || q[-1] != '"' || q[tlen] != '.') {
                        r = kbuf_append(b, s, (size_t)(q + tlen - s));
                        s = q + tlen;
                        continue;
                }
                r = kbuf_append(b, s, (size_t)(q - 1 - s));
                const char *h = q + tlen + 1;
                for (; r == 0 && unhex(h[0]) >= 0 && unhex(h[1]) >= 0; h += 2)
                        r = kbuf_putc(b, (char)(unhex(h[0]) << 4 | unhex(h[1])));
                if (r == 0 && *h != '"')
                        r = -EINVAL; /* not reached: only raw_json makes them */
                s = h + 1;
        }
        if (r == 0)
                r = kbuf_puts(b, s);
        if (r == 0 && !b->data)
                r = -ENOMEM;
        free(text);
        return r;
}

/* Milliseconds from a to b (WAL timestamps), or null. */
static json_t *ts_span(const char *a, const char *b)
{
        int64_t t0 = 0, t1 = 0;
        return wal_parse_ts(a, &t0) == 0 && wal_parse_ts(b, &t1) == 0 && t1 >= t0
                       ? json_integer(t1 - t0)
                       : json_null();
}

/* A step's execution that kairosd's end cut short, and what decided it. */
static json_t *interrupted_json(const struct fold_step *s)
{
        json_t *o = json_pack("{s:i, s:o, s:o, s:o, s:o, s:o}", "execution",
                              (int)s->interrupted_execution, "started_at",
                              str_or_null(s->interrupted_started_ts), "ended_at",
                              str_or_null(s->interrupted_ended_ts), "duration_ms",
                              ts_span(s->interrupted_started_ts, s->interrupted_ended_ts),
                              "decided_at", str_or_null(s->decided_ts), "decision",
                              str_or_null(s->decided_status));
        if (o && s->decided_evidence_json)
                json_object_set_new(o, "evidence", raw_json(s->decided_evidence_json));
        return o;
}

/* The failed attempts of a step that were tried again (retry_wait). */
static json_t *retries_json(const struct fold *f, size_t step)
{
        json_t *a = json_array();
        for (size_t i = 0; a && i < f->nretries; i++) {
                const struct fold_retry *t = &f->retries[i];
                if (t->step != step)
                        continue;
                char due[32];
                wal_format_ts(t->due_ms, due);
                json_array_append_new(
                        a, json_pack("{s:I, s:o, s:o, s:o, s:o, s:o, s:s}", "attempt",
                                     (json_int_t)t->attempt, "started_at",
                                     str_or_null(t->started_ts), "failed_at",
                                     str_or_null(t->ended_ts), "error_class",
                                     str_or_null(t->error_class), "error_msg",
                                     str_or_null(t->error_msg), "retry_at",
                                     str_or_null(t->ts), "due_at", due));
        }
        return a;
}

json_t *showdoc_fold_json(const struct fold *f)
{
        json_t *plans = json_array();
        for (size_t i = 0; i < f->nplans; i++) {
                const struct fold_plan *p = &f->plans[i];
                json_t *steps = json_array();
                for (size_t k = 0; k < p->nsteps; k++) {
                        const struct fold_step *s = &f->steps[p->steps[k]];
                        json_t *js = json_pack(
                                "{s:s, s:o, s:o, s:o, s:o, s:o, s:i, s:b}", "step_id", s->step_id,
                                "status", str_or_null(s->status), "idem_key",
                                str_or_null(s->idem_key), "post_hash", str_or_null(s->post_hash),
                                "result_hash", str_or_null(s->result_hash), "reason",
                                str_or_null(s->reason), "executions", (int)s->executions,
                                "recovered", s->recovered);
                        json_object_set_new(js, "started_at", str_or_null(s->started_ts));
                        json_object_set_new(js, "ended_at", str_or_null(s->ended_ts));
                        /* not run again after an interruption: it ran until
                         * the restart, not until what decided it (the time
                         * kairosd was down is not the step's) */
                        bool cut = s->interrupted_execution &&
                                   s->interrupted_execution == s->executions;
                        json_object_set_new(js, "duration_ms",
                                            cut ? ts_span(s->interrupted_started_ts,
                                                          s->interrupted_ended_ts)
                                                : ts_span(s->started_ts, s->ended_ts));
                        if (s->interrupted_execution)
                                json_object_set_new(js, "interrupted", interrupted_json(s));
                        if (s->carried_from)
                                json_object_set_new(js, "carried_from",
                                                    json_string(s->carried_from));
                        if (s->retries)
                                json_object_set_new(js, "retries",
                                                    retries_json(f, p->steps[k]));
                        if (s->error_class)
                                json_object_set_new(js, "error_class", json_string(s->error_class));
                        if (s->error_msg)
                                json_object_set_new(js, "error_msg", json_string(s->error_msg));
                        if (s->evidence_json)
                                json_object_set_new(js, "evidence", raw_json(s->evidence_json));
                        if (s->result_json)
                                json_object_set_new(js, "result", raw_json(s->result_json));
                        json_array_append_new(steps, js);
                }
                json_array_append_new(
                        plans, json_pack("{s:o, s:I, s:b, s:o, s:o, s:o}", "plan_id",
                                         str_or_null(p->plan_id), "cycle", (json_int_t)p->cycle,
                                         "finalized", p->finalized, "status",
                                         str_or_null(p->final_status), "reason",
                                         str_or_null(p->final_reason), "steps", steps));
        }
        json_t *ops = json_array();
        for (size_t i = 0; i < f->noperators; i++) {
                const struct fold_operator *o = &f->operators[i];
                json_array_append_new(ops, json_pack("{s:o, s:o, s:I, s:o, s:o}", "action",
                                                     str_or_null(o->action), "step_id",
                                                     str_or_null(o->step_id), "uid",
                                                     (json_int_t)o->uid, "reason",
                                                     str_or_null(o->reason), "ts",
                                                     str_or_null(o->ts)));
        }
        return json_pack("{s:s, s:i, s:o, s:o}", "wal_status", fold_status_name(f->status),
                         "records", (int)f->records, "plans", plans, "operators", ops);
}

void showdoc_set_tool_calls(json_t *result, json_t *calls)
{
        json_t *p, *st;
        size_t i, k;
        json_array_foreach(json_object_get(result, "plans"), i, p)
                json_array_foreach(json_object_get(p, "steps"), k, st) {
                        const char *sid = json_string_value(json_object_get(st, "step_id"));
                        json_t *c = sid && calls ? json_object_get(calls, sid) : NULL;
                        json_object_set_new(st, "tool_calls",
                                            c ? json_incref(c)
                                              : calls ? json_array() : json_null());
                }
}

struct calls_ctx {
        const char *mandate;
        struct evidence_call *calls;
        size_t n, cap;
        int error;
};

static int collect_call(const struct idem_view *v, void *arg)
{
        struct calls_ctx *c = arg;
        if (!v->owner || strcmp(v->owner->mandate, c->mandate) != 0)
                return 0;
        if (c->n == c->cap) {
                size_t cap = c->cap ? c->cap * 2 : 8;
                struct evidence_call *n = realloc(c->calls, cap * sizeof(*n));
                if (!n)
                        return c->error = -ENOMEM;
                c->calls = n;
                c->cap = cap;
        }
        /* borrowed: the store does not change while this runs */
        c->calls[c->n++] = (struct evidence_call){
                .key = v->key, .tool = v->tool, .step = v->owner->step,
                .attempt = v->owner->attempt, .state = v->state,
                .created_ms = v->created_ms, .finished_ms = v->finished_ms,
        };
        return 0;
}

json_t *showdoc_calls_json(struct idem_store *s, const char *mandate)
{
        struct calls_ctx c = { .mandate = mandate };
        if (idem_foreach(s, collect_call, &c) < 0) {
                free(c.calls);
                return NULL;
        }
        if (c.n > 1)
                qsort(c.calls, c.n, sizeof(*c.calls), evidence_call_cmp);
        json_t *o = json_object();
        for (size_t i = 0; o && i < c.n; i++) {
                const struct evidence_call *e = &c.calls[i];
                char started[EVIDENCE_TS_SIZE], finished[EVIDENCE_TS_SIZE];
                evidence_format_ms(e->created_ms, started);
                evidence_format_ms(e->finished_ms, finished);
                json_t *arr = json_object_get(o, e->step);
                if (!arr) {
                        arr = json_array();
                        if (json_object_set_new(o, e->step, arr) < 0)
                                break;
                }
                json_array_append_new(
                        arr, json_pack("{s:s, s:s, s:s, s:I, s:s, s:o}", "key", e->key, "tool",
                                       e->tool, "state", idem_state_name(e->state), "attempt",
                                       (json_int_t)e->attempt, "started", started, "finished",
                                       e->finished_ms ? json_string(finished) : json_null()));
        }
        free(c.calls);
        return o;
}
