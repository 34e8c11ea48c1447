/* SPDX-License-Identifier: MIT */
/* wal: the per-mandate write-ahead log (DESIGN §6): the record encoder, the
 * appending writer with its flush barrier and failure states, torn-tail
 * repair on open, and the gzip archive. */
#include "kairos/wal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "kairos/canon.h"
#include "kairos/fold.h"
#include "kairos/kjson.h"

/* ------------------------------------------------------------------------ */
/* Encoder                                                                   */
/* ------------------------------------------------------------------------ */

static _Thread_local const char *encode_error;

const char *wal_encode_error(void)
{
        return encode_error ? encode_error : "";
}

uint32_t wal_crc(const char *line_without_crc, size_t len)
{
        return (uint32_t)crc32_z(0L, (const unsigned char *)line_without_crc, len);
}

void wal_format_ts(int64_t ts_ms, char out[32])
{
        int64_t secs = ts_ms / 1000;
        int64_t ms = ts_ms % 1000;
        if (ms < 0) {
                ms += 1000;
                secs--;
        }
        time_t t = (time_t)secs;
        struct tm tm;
        if (!gmtime_r(&t, &tm)) {
                memset(&tm, 0, sizeof(tm));
                tm.tm_year = 70;
                tm.tm_mday = 1;
        }
        char buf[128];
        snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)ms);
        size_t n = strnlen(buf, 31);
        memcpy(out, buf, n);
        out[n] = '\0';
}

/* Field writer: the first error sticks, later calls do nothing. */
struct enc {
        struct kbuf *b;
        int r;
        const char *err;
};

static void enc_fail(struct enc *e, int r, const char *err)
{
        if (e->r == 0) {
                e->r = r;
                e->err = err;
        }
}

static void enc_key(struct enc *e, const char *key)
{
        if (e->r == 0) {
                int r = kbuf_printf(e->b, ",\"%s\":", key);
                if (r < 0)
                        enc_fail(e, r, "out of memory");
        }
}

/* A string member; NULL is an error (err names it). */
static void enc_str(struct enc *e, const char *key, const char *val, const char *err)
{
        if (e->r)
                return;
        if (!val) {
                enc_fail(e, -EINVAL, err);
                return;
        }
        enc_key(e, key);
        if (e->r)
                return;
        int r = kbuf_json_string(e->b, val, strlen(val));
        if (r == -EILSEQ)
                enc_fail(e, -EINVAL, "a string is not valid UTF-8");
        else if (r < 0)
                enc_fail(e, r, "out of memory");
}

static void enc_opt_str(struct enc *e, const char *key, const char *val)
{
        if (val)
                enc_str(e, key, val, NULL);
}

static void enc_raw(struct enc *e, const char *key, const char *raw)
{
        enc_key(e, key);
        if (e->r == 0) {
                int r = kbuf_puts(e->b, raw);
                if (r < 0)
                        enc_fail(e, r, "out of memory");
        }
}

static void enc_int(struct enc *e, const char *key, long long v)
{
        enc_key(e, key);
        if (e->r == 0) {
                int r = kbuf_printf(e->b, "%lld", v);
                if (r < 0)
                        enc_fail(e, r, "out of memory");
        }
}

/* A JSON text, validated and re-written compactly (document order). */
static void enc_json(struct enc *e, const char *key, const char *json, const char *err)
{
        if (e->r || !json)
                return;
        struct kjson_arena *a = kjson_arena_new();
        if (!a) {
                enc_fail(e, -ENOMEM, "out of memory");
                return;
        }
        struct kjson *v = NULL;
        struct kjson_error jerr;
        int r = kjson_parse(a, json, strlen(json), &v, &jerr);
        if (r < 0) {
                enc_fail(e, r == -ENOMEM ? r : -EINVAL, err);
        } else {
                enc_key(e, key);
                if (e->r == 0 && (r = kjson_write(e->b, v)) < 0)
                        enc_fail(e, r, "out of memory");
        }
        kjson_arena_free(a);
}

/* The normalized steps array: exactly the five keys, in the WAL's order. */
static int steps_json(const struct wal_step *steps, size_t n, struct kbuf *out)
{
        struct enc e = { .b = out };
        if (n > 0 && !steps)
                return -EINVAL;
        if (kbuf_putc(out, '[') < 0)
                return -ENOMEM;
        for (size_t i = 0; i < n && e.r == 0; i++) {
                const struct wal_step *s = &steps[i];
                if (kbuf_puts(out, i ? ",{\"step_id\":" : "{\"step_id\":") < 0) {
                        enc_fail(&e, -ENOMEM, "out of memory");
                        break;
                }
                if (!s->step_id) {
                        enc_fail(&e, -EINVAL, "a step has no step_id");
                        break;
                }
                if (kbuf_json_string(out, s->step_id, strlen(s->step_id)) < 0) {
                        enc_fail(&e, -EINVAL, "a step_id is not valid UTF-8");
                        break;
                }
                enc_str(&e, "tool", s->tool, "a step has no tool");
                enc_str(&e, "params_hash", s->params_hash, "a step has no params_hash");
                enc_str(&e, "pre_hash", s->pre_hash, "a step has no pre_hash");
                enc_str(&e, "expected_post_hash", s->expected_post_hash,
                        "a step has no expected_post_hash");
                if (e.r == 0 && kbuf_putc(out, '}') < 0)
                        enc_fail(&e, -ENOMEM, "out of memory");
        }
        if (e.r == 0 && kbuf_putc(out, ']') < 0)
                enc_fail(&e, -ENOMEM, "out of memory");
        if (e.r)
                encode_error = e.err;
        return e.r;
}

static void enc_plan_commit(struct enc *e, const struct wal_record *rec)
{
        enc_str(e, "plan_id", rec->plan_id, "plan_commit needs plan_id");
        enc_str(e, "mandate_id", rec->mandate_id, "plan_commit needs mandate_id");
        if (e->r == 0 && rec->cycle < 1)
                enc_fail(e, -EINVAL, "plan_commit needs a positive cycle");
        enc_int(e, "cycle", rec->cycle);
        if (e->r)
                return;

        struct kbuf steps = KBUF_INIT;
        char hash[CANON_HASH_STRLEN];
        int r = steps_json(rec->steps, rec->nsteps, &steps);
        if (r < 0) {
                enc_fail(e, r, encode_error);
                goto out;
        }
        if ((r = canon_init()) < 0 ||
            (r = canon_hash_json(steps.data, steps.len, hash, NULL)) < 0) {
                enc_fail(e, r == -ENOMEM ? r : -EINVAL, "cannot hash the steps");
                goto out;
        }
        enc_str(e, "plan_hash", hash, NULL);
        enc_raw(e, "steps", steps.data);
out:
        kbuf_free(&steps);
}

static bool finalize_status_ok(const char *s)
{
        return s && (!strcmp(s, "succeeded") || !strcmp(s, "failed") ||
                     !strcmp(s, "abandoned"));
}

static void enc_body(struct enc *e, const struct wal_record *rec)
{
        switch (rec->op) {
        case WAL_OP_PLAN_COMMIT:
                enc_plan_commit(e, rec);
                break;
        case WAL_OP_APPEND:
                enc_str(e, "step_id", rec->step_id, "append needs step_id");
                enc_str(e, "plan_id", rec->plan_id, "append needs plan_id");
                enc_str(e, "idem_key", rec->idem_key, "append needs idem_key");
                enc_raw(e, "status", "\"pending\"");
                break;
        case WAL_OP_EXECUTING:
                enc_str(e, "step_id", rec->step_id, "executing needs step_id");
                enc_raw(e, "status", "\"executing\"");
                enc_str(e, "pre_hash", rec->pre_hash, "executing needs pre_hash");
                break;
        case WAL_OP_COMPLETED:
                enc_str(e, "step_id", rec->step_id, "completed needs step_id");
                enc_raw(e, "status", "\"completed\"");
                enc_str(e, "post_hash", rec->post_hash, "completed needs post_hash");
                enc_str(e, "result_hash", rec->result_hash, "completed needs result_hash");
                if (rec->recovered)
                        enc_raw(e, "recovered", "true");
                enc_json(e, "evidence", rec->evidence_json, "evidence is not valid JSON");
                enc_json(e, "result", rec->result_json, "result is not valid JSON");
                break;
        case WAL_OP_FAILED:
                enc_str(e, "step_id", rec->step_id, "failed needs step_id");
                enc_raw(e, "status", "\"failed\"");
                enc_str(e, "error_class", rec->error_class, "failed needs error_class");
                if (e->r == 0 && !rec->error_msg)
                        enc_fail(e, -EINVAL, "failed needs error_msg");
                enc_key(e, "error_msg");
                if (e->r == 0) {
                        int r = kbuf_json_string_lossy(e->b, rec->error_msg,
                                                       strlen(rec->error_msg),
                                                       WAL_ERROR_MSG_MAX_CHARS);
                        if (r < 0)
                                enc_fail(e, r, "out of memory");
                }
                break;
        case WAL_OP_NEEDS_REVIEW:
                enc_str(e, "step_id", rec->step_id, "needs_review needs step_id");
                enc_raw(e, "status", "\"needs_review\"");
                enc_opt_str(e, "reason", rec->reason);
                enc_json(e, "evidence", rec->evidence_json, "evidence is not valid JSON");
                break;
        case WAL_OP_RESET:
                enc_str(e, "step_id", rec->step_id, "reset needs step_id");
                enc_raw(e, "status", "\"pending\"");
                enc_raw(e, "reset", "true");
                break;
        case WAL_OP_FINALIZE:
                enc_str(e, "plan_id", rec->plan_id, "plan_finalize needs plan_id");
                if (e->r == 0 && !finalize_status_ok(rec->status))
                        enc_fail(e, -EINVAL,
                                 "plan_finalize status must be succeeded, failed or abandoned");
                enc_str(e, "status", rec->status, NULL);
                enc_opt_str(e, "reason", rec->reason);
                break;
        case WAL_OP_OPERATOR:
                enc_str(e, "mandate_id", rec->mandate_id, "operator needs mandate_id");
                enc_str(e, "action", rec->action, "operator needs action");
                enc_opt_str(e, "step_id", rec->step_id);
                enc_int(e, "uid", rec->uid);
                enc_str(e, "reason", rec->reason, "operator needs reason");
                break;
        default:
                enc_fail(e, -EINVAL, "unknown op");
                break;
        }
}

static const char *op_name(enum wal_op op)
{
        switch (op) {
        case WAL_OP_PLAN_COMMIT:
                return "plan_commit";
        case WAL_OP_APPEND:
                return "append";
        case WAL_OP_FINALIZE:
                return "plan_finalize";
        case WAL_OP_OPERATOR:
                return "operator";
        default:
                return "transition";
        }
}

int wal_encode(const struct wal_record *r, int64_t ts_ms, struct kbuf *out)
{
        encode_error = NULL;
        if (!r || !out) {
                encode_error = "no record";
                return -EINVAL;
        }
        size_t start = out->len;
        struct enc e = { .b = out };
        if (kbuf_printf(out, "{\"op\":\"%s\"", op_name(r->op)) < 0)
                enc_fail(&e, -ENOMEM, "out of memory");
        enc_body(&e, r);

        char ts[32];
        wal_format_ts(ts_ms, ts);
        enc_str(&e, "ts", ts, NULL);
        if (e.r == 0 && kbuf_putc(out, '}') < 0)
                enc_fail(&e, -ENOMEM, "out of memory");
        if (e.r == 0) {
                uint32_t crc = wal_crc(out->data + start, out->len - start);
                out->len--; /* drop the '}' again */
                if (kbuf_printf(out, ",\"crc\":\"%08x\"}\n", crc) < 0)
                        enc_fail(&e, -ENOMEM, "out of memory");
        }
        if (e.r) {
                out->len = start;
                if (out->data)
                        out->data[start] = '\0';
                encode_error = e.err;
                return e.r;
        }
        return 0;
}
