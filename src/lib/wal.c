/* SPDX-License-Identifier: MIT */
/* wal: the per-mandate write-ahead log (docs/design.md §6): the record encoder, the
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
#include "kairos/crcline.h"
#include "kairos/fold.h"
#include "kairos/kjson.h"
#include "kairos/statedir.h"

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

/* The text of ts_ms as gmtime_r and snprintf make it, for any value. */
static size_t format_ts_slow(int64_t secs, int ms, char out[32])
{
        time_t t = (time_t)secs;
        struct tm tm;
        if (!gmtime_r(&t, &tm)) {
                memset(&tm, 0, sizeof(tm));
                tm.tm_year = 70;
                tm.tm_mday = 1;
        }
        char buf[128];
        snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
        size_t n = strnlen(buf, 31);
        memcpy(out, buf, n);
        out[n] = '\0';
        return n;
}

/* The text up to the milliseconds of the last second formatted, kept per
 * thread: records written close together (start-up recovery appends to
 * thousands of WALs in the same second) share it, and only the three digits
 * of the milliseconds are written each time.  Kept only when the text has
 * the usual 24 bytes: then every field before them has its fixed width and
 * the milliseconds are bytes 20 to 22. */
#define TS_LEN 24
#define TS_MS_AT 20
static _Thread_local int64_t ts_secs_kept;
static _Thread_local bool ts_kept;
static _Thread_local char ts_text_kept[TS_MS_AT];

void wal_format_ts(int64_t ts_ms, char out[32])
{
        int64_t secs = ts_ms / 1000;
        int64_t ms = ts_ms % 1000;
        if (ms < 0) {
                ms += 1000;
                secs--;
        }
        if (!ts_kept || ts_secs_kept != secs) {
                size_t n = format_ts_slow(secs, (int)ms, out);
                if (n == TS_LEN && out[TS_MS_AT - 1] == '.') {
                        memcpy(ts_text_kept, out, TS_MS_AT);
                        ts_secs_kept = secs;
                        ts_kept = true;
                }
                return;
        }
        memcpy(out, ts_text_kept, TS_MS_AT);
        out[TS_MS_AT] = (char)('0' + ms / 100);
        out[TS_MS_AT + 1] = (char)('0' + ms / 10 % 10);
        out[TS_MS_AT + 2] = (char)('0' + ms % 10);
        out[TS_MS_AT + 3] = 'Z';
        out[TS_LEN] = '\0';
}

int wal_parse_ts(const char *ts, int64_t *ret_ms)
{
        *ret_ms = 0;
        if (!ts)
                return -EINVAL;
        size_t n = strlen(ts);
        int ms = 0;
        if (n == 24 && ts[19] == '.' && ts[23] == 'Z') {
                for (int i = 20; i < 23; i++) {
                        if (ts[i] < '0' || ts[i] > '9')
                                return -EINVAL;
                        ms = ms * 10 + (ts[i] - '0');
                }
        } else if (n != 20) {
                return -EINVAL;
        }
        char base[21];
        memcpy(base, ts, 19);
        base[19] = 'Z';
        base[20] = '\0';
        int64_t secs;
        int r = planner_parse_fired_at(base, &secs);
        if (r < 0)
                return r;
        *ret_ms = secs * 1000 + ms;
        return 0;
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
                int r = kbuf_append(e->b, ",\"", 2);
                if (r == 0)
                        r = kbuf_puts(e->b, key);
                if (r == 0)
                        r = kbuf_append(e->b, "\":", 2);
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

/* A failed record's stderr: its last WAL_STDERR_MAX_BYTES bytes, from a
 * UTF-8 character (invalid UTF-8 replaced). */
static void enc_stderr(struct enc *e, const char *tail)
{
        size_t len = strlen(tail), start = len > WAL_STDERR_MAX_BYTES ? len - WAL_STDERR_MAX_BYTES : 0;
        while (start < len && ((unsigned char)tail[start] & 0xc0) == 0x80)
                start++;
        enc_key(e, "stderr");
        if (e->r == 0) {
                int r = kbuf_json_string_lossy(e->b, tail + start, len - start, 0);
                if (r < 0)
                        enc_fail(e, r, "out of memory");
        }
}

/* The parse arena of enc_json, kept per thread and reset after each use:
 * start-up recovery encodes a record with evidence for thousands of WALs
 * in a row on each pool thread, and an arena made and freed per record was
 * a malloc and a free each time.  A text longer than ENC_ARENA_KEEP_INPUT
 * gets an arena of its own, freed at once, so what a thread keeps stays
 * small (a reset arena keeps every chunk it grew to, and a parse takes
 * many times the bytes of its text). */
#define ENC_ARENA_KEEP_INPUT (4u * 1024u)
static _Thread_local struct kjson_arena *enc_arena_kept;

/* A JSON text, validated and written compactly (document order): a text
 * that already is what kjson_write would write of it (the parse says so) is
 * copied as it is, any other is written again from its parse. */
static void enc_json(struct enc *e, const char *key, const char *json, const char *err)
{
        if (e->r || !json)
                return;
        size_t len = strlen(json);
        bool keep = len <= ENC_ARENA_KEEP_INPUT;
        struct kjson_arena *a = keep ? enc_arena_kept : NULL;
        if (!a && !(a = kjson_arena_new())) {
                enc_fail(e, -ENOMEM, "out of memory");
                return;
        }
        if (keep)
                enc_arena_kept = a;
        struct kjson *v = NULL;
        struct kjson_error jerr;
        bool compact = false;
        int r = kjson_parse_nested(a, json, len, 0, &v, &compact, &jerr);
        if (r < 0) {
                enc_fail(e, r == -ENOMEM ? r : -EINVAL, err);
        } else {
                enc_key(e, key);
                if (e->r == 0 &&
                    (r = compact ? kbuf_append(e->b, json, len) : kjson_write(e->b, v)) < 0)
                        enc_fail(e, r, "out of memory");
        }
        if (keep)
                kjson_arena_reset(a);
        else
                kjson_arena_free(a);
}

/* A result its maker already wrote compactly from a parse (kjson_write): its
 * bytes are what enc_json would write, so they are copied by length. */
static void enc_result(struct enc *e, const struct wal_record *rec)
{
        if (!rec->result_compact || !rec->result_json) {
                enc_json(e, "result", rec->result_json, "result is not valid JSON");
                return;
        }
        enc_key(e, "result");
        if (e->r == 0) {
                size_t n = rec->result_len ? rec->result_len : strlen(rec->result_json);
                int r = kbuf_append(e->b, rec->result_json, n);
                if (r < 0)
                        enc_fail(e, r, "out of memory");
        }
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
                if (rec->carried_from)
                        enc_str(e, "carried_from", rec->carried_from, NULL);
                enc_json(e, "evidence", rec->evidence_json, "evidence is not valid JSON");
                enc_result(e, rec);
                break;
        case WAL_OP_FAILED:
                enc_str(e, "step_id", rec->step_id, "failed needs step_id");
                enc_raw(e, "status", "\"failed\"");
                enc_str(e, "error_class", rec->error_class, "failed needs error_class");
                enc_key(e, "error_msg");
                if (e->r == 0) {
                        /* NULL is "" (older writers wrote an empty string) */
                        const char *msg = rec->error_msg ? rec->error_msg : "";
                        int r = kbuf_json_string_lossy(e->b, msg, strlen(msg),
                                                       WAL_ERROR_MSG_MAX_CHARS);
                        if (r < 0)
                                enc_fail(e, r, "out of memory");
                }
                if (rec->has_exit_status)
                        enc_int(e, "exit_status", rec->exit_status);
                if (rec->exit_signal > 0)
                        enc_int(e, "signal", rec->exit_signal);
                if (rec->stderr_tail)
                        enc_stderr(e, rec->stderr_tail);
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
                /* recovery's grounds for running it again (optional) */
                enc_json(e, "evidence", rec->evidence_json, "evidence is not valid JSON");
                break;
        case WAL_OP_FINALIZE:
                enc_str(e, "plan_id", rec->plan_id, "plan_finalize needs plan_id");
                if (e->r == 0 && !plan_status_name(rec->status))
                        enc_fail(e, -EINVAL,
                                 "plan_finalize status must be succeeded, failed or abandoned");
                enc_str(e, "status", plan_status_name(rec->status), NULL);
                enc_opt_str(e, "reason", rec->reason);
                break;
        case WAL_OP_OPERATOR:
                enc_str(e, "mandate_id", rec->mandate_id, "operator needs mandate_id");
                enc_str(e, "action", rec->action, "operator needs action");
                enc_opt_str(e, "step_id", rec->step_id);
                enc_int(e, "uid", rec->uid);
                enc_str(e, "reason", rec->reason, "operator needs reason");
                break;
        case WAL_OP_MANDATE:
                enc_str(e, "mandate_id", rec->mandate_id, "mandate needs mandate_id");
                enc_str(e, "schedule", rec->schedule, "mandate needs schedule");
                enc_str(e, "fired_at", rec->fired_at, "mandate needs fired_at");
                enc_opt_str(e, "goal", rec->goal);
                if (rec->retry_of) {
                        if (rec->retry < 1)
                                enc_fail(e, -EINVAL, "mandate retry_of needs retry >= 1");
                        enc_str(e, "retry_of", rec->retry_of, NULL);
                        enc_int(e, "retry", rec->retry);
                }
                break;
        case WAL_OP_OWNER:
                enc_str(e, "mandate_id", rec->mandate_id, "owner needs mandate_id");
                enc_str(e, "node", rec->node, "owner needs node");
                if (e->r == 0 && rec->epoch < 1)
                        enc_fail(e, -EINVAL, "owner needs epoch >= 1");
                enc_int(e, "epoch", rec->epoch);
                enc_opt_str(e, "prev_owner", rec->prev_owner);
                break;
        case WAL_OP_RETRY_WAIT:
                enc_str(e, "step_id", rec->step_id, "retry_wait needs step_id");
                if (e->r == 0 && rec->attempt < 1)
                        enc_fail(e, -EINVAL, "retry_wait needs attempt >= 1");
                enc_int(e, "attempt", rec->attempt);
                enc_str(e, "error_class", rec->error_class, "retry_wait needs error_class");
                if (e->r == 0 && rec->due_ms < 0)
                        enc_fail(e, -EINVAL, "retry_wait needs due_ms >= 0");
                enc_int(e, "due_ms", rec->due_ms);
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
        case WAL_OP_MANDATE:
                return "mandate";
        case WAL_OP_OWNER:
                return "owner";
        case WAL_OP_RETRY_WAIT:
                return "retry_wait";
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
        if (kbuf_puts(out, "{\"op\":\"") < 0 || kbuf_puts(out, op_name(r->op)) < 0 ||
            kbuf_putc(out, '"') < 0)
                enc_fail(&e, -ENOMEM, "out of memory");
        enc_body(&e, r);

        /* the time's text is ASCII with nothing to escape: copied as it is */
        char ts[32];
        wal_format_ts(ts_ms, ts);
        enc_key(&e, "ts");
        if (e.r == 0 && (kbuf_putc(out, '"') < 0 || kbuf_puts(out, ts) < 0 ||
                         kbuf_putc(out, '"') < 0))
                enc_fail(&e, -ENOMEM, "out of memory");
        if (e.r == 0 && kbuf_putc(out, '}') < 0)
                enc_fail(&e, -ENOMEM, "out of memory");
        if (e.r == 0 && crcline_seal(out, start) < 0)
                enc_fail(&e, -ENOMEM, "out of memory");
        if (e.r) {
                out->len = start;
                if (out->data)
                        out->data[start] = '\0';
                encode_error = e.err;
                return e.r;
        }
        return 0;
}

/* ------------------------------------------------------------------------ */
/* Spares                                                                    */
/* ------------------------------------------------------------------------ */

#define SPARE_NAME_MAX 32

struct spare {
        char name[SPARE_NAME_MAX];
        uint64_t seq;        /* when it joined the pool (created or found) */
        bool durable;        /* a sync that began after seq returned 0 */
};

struct wal_spares {
        pthread_mutex_t lock;
        const struct kio *io;
        char *dir;
        unsigned max, n;
        struct spare v[WAL_SPARES_MAX];
        uint64_t seq;
        unsigned long long next_name;
};

int wal_spares_new(const struct kio *io, const char *dir, unsigned max,
                   struct wal_spares **ret_spares)
{
        if (!dir || !*dir || !ret_spares || max > WAL_SPARES_MAX)
                return -EINVAL;
        *ret_spares = NULL;
        struct wal_spares *s = calloc(1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        if (!(s->dir = strdup(dir))) {
                free(s);
                return -ENOMEM;
        }
        if (pthread_mutex_init(&s->lock, NULL) != 0) {
                free(s->dir);
                free(s);
                return -ENOMEM;
        }
        s->io = io ? io : kio_posix();
        s->max = max;
        s->next_name = 1;
        *ret_spares = s;
        return 0;
}

void wal_spares_free(struct wal_spares *s)
{
        if (!s)
                return;
        pthread_mutex_destroy(&s->lock);
        free(s->dir);
        free(s);
}

bool wal_spare_name(const char *name)
{
        size_t pl = strlen(WAL_SPARE_PREFIX);
        if (!name || strncmp(name, WAL_SPARE_PREFIX, pl) != 0 || !name[pl] ||
            strlen(name) >= SPARE_NAME_MAX)
                return false;
        for (const char *p = name + pl; *p; p++)
                if (*p < '0' || *p > '9')
                        return false;
        return true;
}

static int spare_path(const struct wal_spares *s, const char *name, char *out, size_t n)
{
        int len = snprintf(out, n, "%s/%s", s->dir, name);
        return len < 0 || (size_t)len >= n ? -ENAMETOOLONG : 0;
}

int wal_spares_found(struct wal_spares *s, const char *name)
{
        if (!s || !wal_spare_name(name))
                return -EINVAL;
        int r = 0;
        pthread_mutex_lock(&s->lock);
        for (unsigned i = 0; i < s->n; i++)
                if (strcmp(s->v[i].name, name) == 0)
                        goto out;
        if (s->n >= s->max) {
                r = -ENOSPC;
                goto out;
        }
        struct spare *sp = &s->v[s->n++];
        snprintf(sp->name, sizeof sp->name, "%s", name);
        sp->seq = ++s->seq;
        sp->durable = false;
        /* new names start past the ones found */
        unsigned long long k = strtoull(name + strlen(WAL_SPARE_PREFIX), NULL, 10);
        if (k >= s->next_name && k < ULLONG_MAX)
                s->next_name = k + 1;
out:
        pthread_mutex_unlock(&s->lock);
        return r;
}

int wal_spares_fill(struct wal_spares *s, uint64_t *ret_mark)
{
        if (!s || !ret_mark)
                return -EINVAL;
        const struct kio *io = s->io;
        int r = 0;
        pthread_mutex_lock(&s->lock);
        /* a name taken by a file the pool does not hold is skipped */
        for (unsigned tries = 0; s->n < s->max && tries < 4 * WAL_SPARES_MAX; tries++) {
                struct spare *sp = &s->v[s->n];
                char path[PATH_MAX];
                snprintf(sp->name, sizeof sp->name, WAL_SPARE_PREFIX "%llu", s->next_name++);
                if ((r = spare_path(s, sp->name, path, sizeof path)) < 0)
                        break;
                int fd = io->open(io->ctx, path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                                  WAL_FILE_MODE);
                if (fd == -EEXIST)
                        continue;
                if (fd < 0) {
                        r = fd;
                        break;
                }
                io->close(io->ctx, fd);
                sp->seq = ++s->seq;
                sp->durable = false;
                s->n++;
                r = 0;
        }
        *ret_mark = s->seq;
        pthread_mutex_unlock(&s->lock);
        return r;
}

void wal_spares_covered(struct wal_spares *s, uint64_t mark, int r)
{
        if (!s)
                return;
        pthread_mutex_lock(&s->lock);
        for (unsigned i = 0; i < s->n;) {
                struct spare *sp = &s->v[i];
                if (sp->durable || sp->seq > mark) {
                        i++;
                } else if (r == 0) {
                        sp->durable = true;
                        i++;
                } else {
                        /* its entry may be lost: never used (a file left
                         * behind is found again at the next start) */
                        char path[PATH_MAX];
                        if (spare_path(s, sp->name, path, sizeof path) == 0)
                                (void)s->io->unlink(s->io->ctx, path);
                        *sp = s->v[--s->n];
                }
        }
        pthread_mutex_unlock(&s->lock);
}

static unsigned spares_count(const struct wal_spares *s, bool durable)
{
        if (!s)
                return 0;
        struct wal_spares *m = (struct wal_spares *)s;
        unsigned k = 0;
        pthread_mutex_lock(&m->lock);
        for (unsigned i = 0; i < s->n; i++)
                k += s->v[i].durable == durable;
        pthread_mutex_unlock(&m->lock);
        return k;
}

unsigned wal_spares_durable(const struct wal_spares *s)
{
        return spares_count(s, true);
}

unsigned wal_spares_pending(const struct wal_spares *s)
{
        return spares_count(s, false);
}

/* Rename from to to, never over a file named to (-EEXIST): by the
 * kernel where io and the file system offer it, else a look first (a file
 * made in between is replaced: only where neither offers it). */
static int rename_noreplace(const struct kio *io, const char *from, const char *to)
{
        if (io->rename_noreplace) {
                int r = io->rename_noreplace(io->ctx, from, to);
                if (r != -EINVAL && r != -ENOSYS)
                        return r;
        }
        struct stat st;
        if (lstat(to, &st) == 0)
                return -EEXIST;
        if (errno != ENOENT)
                return -errno;
        return io->rename(io->ctx, from, to);
}

int wal_spares_take(struct wal_spares *s, const char *path)
{
        if (!s || !path)
                return -EINVAL;
        struct spare sp = { .name = "" };
        pthread_mutex_lock(&s->lock);
        for (unsigned i = s->n; i-- > 0;)
                if (s->v[i].durable) {
                        sp = s->v[i];
                        s->v[i] = s->v[--s->n];
                        break;
                }
        pthread_mutex_unlock(&s->lock);
        if (!*sp.name)
                return -ENOENT;
        char from[PATH_MAX];
        int r = spare_path(s, sp.name, from, sizeof from);
        if (r == 0)
                r = rename_noreplace(s->io, from, path);
        if (r == -EEXIST) {
                /* path is taken: the spare stays one */
                pthread_mutex_lock(&s->lock);
                if (s->n < s->max)
                        s->v[s->n++] = sp;
                pthread_mutex_unlock(&s->lock);
        }
        return r;
}

/* A mandate id as a file name: no path, no hidden name. */
static bool id_is_name(const char *id, size_t idlen)
{
        size_t n = id ? strlen(id) : 0;
        if (n == 0 || n >= idlen || n + strlen(STATEDIR_WAL_SUFFIX) >= 256 || id[0] == '.')
                return false;
        return strchr(id, '/') == NULL;
}

/* The first line of a spare, read to tell what it holds: at most this
 * many bytes (a first record names who fired a mandate: far smaller).  A
 * longer line is no record kairosd began, torn or not: left as it is. */
#define SPARE_PEEK_MAX (16u * 1024 * 1024)

/* The first line of the regular file path (opened without following a
 * link, without blocking on a FIFO) onto b: *ret_file false if it is no
 * regular file of one name (a link, a FIFO, a directory, a device, a file
 * with a second name elsewhere: never read, never a WAL); *ret_long if no
 * newline came in SPARE_PEEK_MAX bytes. */
static int spare_first_line(const char *path, struct kbuf *b, bool *ret_file, bool *ret_long)
{
        *ret_file = false;
        *ret_long = false;
        int fd;
        do
                fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
        while (fd < 0 && errno == EINTR);
        if (fd < 0)
                return errno == ELOOP ? 0 : -errno; /* ELOOP: a symbolic link */
        struct stat st;
        int r = fstat(fd, &st) < 0 ? -errno : 0;
        if (r < 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1)
                goto out;
        *ret_file = true;
        for (;;) {
                if ((r = kbuf_reserve(b, 64 * 1024)) < 0)
                        goto out;
                size_t room = b->cap - b->len - 1;
                if (room > SPARE_PEEK_MAX - b->len)
                        room = SPARE_PEEK_MAX - b->len;
                ssize_t k = read(fd, b->data + b->len, room);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0) {
                        r = -errno;
                        goto out;
                }
                const char *nl = memchr(b->data + b->len, '\n', (size_t)k);
                if (nl) {
                        b->len = (size_t)(nl - b->data) + 1;
                        break;
                }
                b->len += (size_t)k;
                if (k == 0)
                        break;
                if (b->len >= SPARE_PEEK_MAX) {
                        *ret_long = true;
                        break;
                }
        }
        b->data[b->len] = '\0';
out:
        close(fd);
        return r;
}

int wal_spare_peek(const char *dir, const char *name, enum wal_spare_found *ret_found,
                   char *ret_id, size_t idlen)
{
        if (!dir || !name || !ret_found || !ret_id || idlen == 0)
                return -EINVAL;
        *ret_found = WAL_SPARE_UNNAMED;
        ret_id[0] = '\0';
        char path[PATH_MAX], to[PATH_MAX];
        int len = snprintf(path, sizeof path, "%s/%s", dir, name);
        if (len < 0 || (size_t)len >= sizeof path)
                return -ENAMETOOLONG;
        struct kbuf b = KBUF_INIT;
        struct fold *f = NULL;
        bool file, toolong;
        int r = spare_first_line(path, &b, &file, &toolong);
        if (r < 0)
                goto out;
        if (!file) {
                *ret_found = WAL_SPARE_NOT_FILE;
                goto out;
        }
        if (b.len == 0) {
                *ret_found = WAL_SPARE_EMPTY;
                goto out;
        }
        if (toolong)
                goto out;
        if ((r = fold_buffer(b.data, b.len, &f)) < 0)
                goto out;
        if (f->good_end == 0 && f->status != FOLD_CORRUPT) {
                /* a torn first line: never flushed, nothing acknowledged */
                *ret_found = WAL_SPARE_REMOVED;
                goto out;
        }
        /* the first record names the mandate (a step's record with no plan
         * before it names none) */
        const char *id = f->mandate.mandate_id;
        if (!id && f->nplans && !f->plans[0].orphan_reason)
                id = f->plans[0].mandate_id;
        if (!id_is_name(id, idlen))
                goto out;
        snprintf(ret_id, idlen, "%s", id);
        len = snprintf(to, sizeof to, "%s/%s%s", dir, id, STATEDIR_WAL_SUFFIX);
        if (len < 0 || (size_t)len >= sizeof to) {
                r = -ENAMETOOLONG;
                goto out;
        }
        struct stat st;
        *ret_found = lstat(to, &st) == 0 || errno != ENOENT ? WAL_SPARE_CONFLICT
                                                             : WAL_SPARE_ADOPTED;
out:
        fold_free(f);
        kbuf_free(&b);
        return r;
}

int wal_spare_adopt(const struct kio *io, const char *dir, const char *name,
                    enum wal_spare_found *ret_found, char *ret_id, size_t idlen)
{
        int r = wal_spare_peek(dir, name, ret_found, ret_id, idlen);
        if (r < 0 || (*ret_found != WAL_SPARE_REMOVED && *ret_found != WAL_SPARE_ADOPTED))
                return r;
        if (!io)
                io = kio_posix();
        char path[PATH_MAX], to[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (*ret_found == WAL_SPARE_REMOVED)
                return io->unlink(io->ctx, path);
        snprintf(to, sizeof to, "%s/%s%s", dir, ret_id, STATEDIR_WAL_SUFFIX);
        r = rename_noreplace(io, path, to);
        if (r == -EEXIST) {
                /* made since it was looked for: never replaced */
                *ret_found = WAL_SPARE_CONFLICT;
                return 0;
        }
        if (r < 0)
                *ret_found = WAL_SPARE_UNNAMED;
        return r;
}

/* ------------------------------------------------------------------------ */
/* Writer                                                                    */
/* ------------------------------------------------------------------------ */

struct wal {
        pthread_mutex_t lock;
        const struct kio *io;
        int64_t (*now_ms)(void *ctx);
        void *clock_ctx;
        char *path;
        int fd;
        enum wal_state state;
        int error;
        off_t size;          /* end of the last whole record */
        size_t pending;      /* appended since the last flush */
        uint64_t flush_count;
        bool dir_exists;
        bool exists;
        bool at_dir;
        int dir_fd;
        int64_t records;     /* good lines in the file */
        /* cluster mode: the barrier hook and the lines since the last barrier */
        int (*barrier)(void *ctx, int64_t first_seq, const char *lines, size_t len);
        void *barrier_ctx;
        struct kbuf unbarriered;
        /* keep_appended: the lines since the last take, from offset kept_at */
        bool keep;
        bool kept_lost;      /* one could not be kept: the reader reads the file */
        off_t kept_at;
        struct kbuf kept;
        struct wal_spares *spares;
};

static int64_t realtime_ms(void *ctx)
{
        (void)ctx;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t wal_now(const struct wal *w)
{
        return w->now_ms(w->clock_ctx);
}


/* Keep the torn bytes in <path>.torn.<secs> (or .torn.<secs>.<n> if taken). */
static int save_torn(struct wal *w, const char *bytes, size_t n, char *torn_path,
                     size_t torn_path_size)
{
        const struct kio *io = w->io;
        int64_t ms = wal_now(w);
        long long secs = (long long)(ms >= 0 ? ms / 1000 : (ms - 999) / 1000);
        int fd = -EEXIST;
        for (int k = 0; k < 100 && fd == -EEXIST; k++) {
                int len = k == 0 ? snprintf(torn_path, torn_path_size, "%s.torn.%lld", w->path,
                                            secs)
                                 : snprintf(torn_path, torn_path_size, "%s.torn.%lld.%d",
                                            w->path, secs, k);
                if (len < 0 || (size_t)len >= torn_path_size)
                        return -ENAMETOOLONG;
                fd = io->open(io->ctx, torn_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                              WAL_FILE_MODE);
        }
        if (fd < 0)
                return fd;
        int r = kio_write_close(io, fd, bytes, n, true);
        if (r == 0)
                r = kio_fsync_parent(io, torn_path);
        return r;
}

static int open_append(struct wal *w, int extra_flags)
{
        return w->io->open(w->io->ctx, w->path,
                           O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | extra_flags, WAL_FILE_MODE);
}

static void set_info_bad(struct wal_open_info *info, const struct fold *f)
{
        info->bad_line = f->bad_line;
        info->bad_offset = f->bad_offset;
        snprintf(info->bad_reason, sizeof(info->bad_reason), "%s", f->bad_reason);
}

/* The read buffer of WALs opened through a descriptor, kept per thread for
 * the next one (recovery opens thousands in a row on a few pool threads);
 * one that grew beyond READ_KEEP_MAX is given back after use. */
#define READ_KEEP_MAX (256u * 1024u)
static _Thread_local struct kbuf read_buf = KBUF_INIT;

/* An existing file: scan it, repair a torn tail or quarantine. */
static int open_existing(struct wal *w, struct wal_open_info *info, struct fold **ret_fold)
{
        const struct kio *io = w->io;
        char *data = NULL;
        size_t len = 0;
        struct fold *f = NULL;
        /* opened for reading and appending already (wal_options.exists):
         * read through that descriptor, no second open */
        bool have_fd = w->fd >= 0;
        int r;
        if (have_fd) {
                read_buf.len = 0;
                r = kio_read_fd_kbuf(w->fd, 0, &read_buf);
                len = read_buf.len;
        } else {
                r = kio_read_file(w->path, 0, 0, &data, &len);
        }
        if (r < 0)
                goto out;
        const char *bytes = have_fd ? read_buf.data : data;
        if (len == 0) {
                /* Possibly created by an open whose directory fsync never
                 * succeeded (no record can have been acknowledged): redo it. */
                if ((r = kio_fsync_parent(io, w->path)) < 0)
                        goto out;
        }
        if ((r = fold_buffer(bytes, len, &f)) < 0)
                goto out;

        if (f->status == FOLD_CORRUPT) {
                w->state = WAL_STATE_QUARANTINED;
                if (have_fd) {
                        io->close(io->ctx, w->fd);
                        w->fd = -1;
                }
                info->corrupt = true;
                set_info_bad(info, f);
                r = 0;
                goto out;
        }
        if (f->status == FOLD_TORN && f->good_end < len) {
                set_info_bad(info, f);
                r = save_torn(w, bytes + f->good_end, len - f->good_end, info->torn_path,
                              sizeof(info->torn_path));
                if (r < 0)
                        goto out;
                if (!have_fd && (w->fd = open_append(w, 0)) < 0) {
                        r = w->fd;
                        goto out;
                }
                if ((r = io->ftruncate(io->ctx, w->fd, (off_t)f->good_end)) < 0 ||
                    (r = io->fdatasync(io->ctx, w->fd)) < 0)
                        goto out;
                info->torn_repaired = true;
                info->torn_bytes = len - f->good_end;
        } else if (!have_fd && (w->fd = open_append(w, 0)) < 0) {
                r = w->fd;
                goto out;
        }
        if (have_fd) {
                w->size = (off_t)(info->torn_repaired ? f->good_end : len);
        } else {
                struct stat st;
                if (fstat(w->fd, &st) < 0) {
                        r = -errno;
                        goto out;
                }
                w->size = st.st_size;
        }
        w->records = 0;
        size_t end = f->good_end < len ? f->good_end : len;
        for (const char *p = bytes, *e = bytes + end;
             p < e && (p = memchr(p, '\n', (size_t)(e - p))) != NULL; p++)
                w->records++;
        r = 0;
out:
        if (r == 0 && ret_fold) {
                *ret_fold = f;
                f = NULL;
        }
        fold_free(f);
        free(data);
        if (read_buf.cap > READ_KEEP_MAX)
                kbuf_free(&read_buf);
        return r;
}

static int open_new_or_existing(struct wal *w, struct wal_open_info *info,
                                struct fold **ret_fold)
{
        const struct kio *io = w->io;
        /* (known to exist, as at start: no copy of the path to cut) */
        if (!w->dir_exists) {
                char *dir = strdup(w->path);
                if (!dir)
                        return -ENOMEM;
                char *slash = strrchr(dir, '/');
                int r = 0;
                if (slash && slash != dir) {
                        *slash = '\0';
                        r = kio_mkdir_p(io, dir, STATEDIR_DIR_MODE);
                }
                free(dir);
                if (r < 0)
                        return r;
        }

        /* Known to exist (recovery found it): one open, for reading and
         * appending; gone meanwhile, it is created as below. */
        if (w->exists) {
                /* no access-time update (an inode write per WAL read): the
                 * file is kairosd's own; where the flag is refused, without */
                const char *name = strrchr(w->path, '/');
                bool at = w->at_dir && io->openat && name;
                int flags = O_RDWR | O_APPEND | O_CLOEXEC | O_NOATIME;
                w->fd = at ? io->openat(io->ctx, w->dir_fd, name + 1, flags, 0)
                           : io->open(io->ctx, w->path, flags, 0);
                if (w->fd == -EPERM) {
                        flags &= ~O_NOATIME;
                        w->fd = at ? io->openat(io->ctx, w->dir_fd, name + 1, flags, 0)
                                   : io->open(io->ctx, w->path, flags, 0);
                }
                if (w->fd >= 0)
                        return open_existing(w, info, ret_fold);
                if (w->fd != -ENOENT)
                        return w->fd;
                w->fd = -1;
        }
        /* A new file from a durable spare: renamed to its name, no
         * directory fsync (docs/design.md §6, rule 1).  Whether it exists
         * is asked first: a rename would replace it. */
        if (w->spares && !w->exists) {
                int fd = io->open(io->ctx, w->path, O_RDWR | O_APPEND | O_CLOEXEC, 0);
                if (fd >= 0) {
                        w->fd = fd;
                        return open_existing(w, info, ret_fold);
                }
                if (fd != -ENOENT)
                        return fd;
                if (wal_spares_take(w->spares, w->path) == 0) {
                        /* never through a link put in the spare's place */
                        if ((fd = io->open(io->ctx, w->path,
                                           O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0)) < 0)
                                return fd;
                        w->fd = fd;
                        w->size = 0;
                        info->created = true;
                        info->from_spare = true;
                        return 0;
                }
        }
        /* O_EXCL tells creation from an existing file without a race. */
        int fd = open_append(w, O_EXCL);
        if (fd == -EEXIST)
                return open_existing(w, info, ret_fold);
        if (fd < 0)
                return fd;
        w->fd = fd;
        w->size = 0;
        info->created = true;
        /* shared with other WALs created at the same moment */
        return kio_fsync_parent_shared(io, w->path);
}

int wal_open(const char *path, const struct wal_options *opt, struct wal **out,
             struct wal_open_info *info)
{
        return wal_open_folded(path, opt, out, info, NULL);
}

int wal_open_folded(const char *path, const struct wal_options *opt, struct wal **out,
                    struct wal_open_info *info, struct fold **ret_fold)
{
        struct wal_open_info dummy;
        if (!path || !*path || !out)
                return -EINVAL;
        *out = NULL;
        if (!info)
                info = &dummy;
        memset(info, 0, sizeof(*info));

        struct wal *w = calloc(1, sizeof(*w));
        if (!w)
                return -ENOMEM;
        w->fd = -1;
        w->io = opt && opt->io ? opt->io : kio_posix();
        w->now_ms = opt && opt->now_ms ? opt->now_ms : realtime_ms;
        w->clock_ctx = opt ? opt->clock_ctx : NULL;
        w->dir_exists = opt && opt->dir_exists;
        w->exists = opt && opt->exists;
        w->at_dir = opt && opt->at_dir;
        w->dir_fd = opt ? opt->dir_fd : -1;
        w->barrier = opt ? opt->barrier : NULL;
        w->barrier_ctx = opt ? opt->barrier_ctx : NULL;
        w->keep = opt && opt->keep_appended;
        w->spares = opt ? opt->spares : NULL;
        w->state = WAL_STATE_OK;
        w->path = strdup(path);
        if (!w->path) {
                free(w);
                return -ENOMEM;
        }
        if (pthread_mutex_init(&w->lock, NULL) != 0) {
                free(w->path);
                free(w);
                return -ENOMEM;
        }
        if (ret_fold)
                *ret_fold = NULL;
        int r = open_new_or_existing(w, info, ret_fold);
        if (r < 0) {
                if (ret_fold) {
                        fold_free(*ret_fold);
                        *ret_fold = NULL;
                }
                if (w->fd >= 0)
                        w->io->close(w->io->ctx, w->fd);
                pthread_mutex_destroy(&w->lock);
                free(w->path);
                free(w);
                return r;
        }
        w->kept_at = w->size;
        *out = w;
        return 0;
}

/* Close the descriptor under the lock; the object stays (CLOSED). */
static int close_locked(struct wal *w)
{
        int r = 0;
        if (w->fd >= 0) {
                r = w->io->close(w->io->ctx, w->fd);
                w->fd = -1;
        }
        w->state = WAL_STATE_CLOSED;
        return r;
}

int wal_shutdown(struct wal *w)
{
        if (!w)
                return -EINVAL;
        pthread_mutex_lock(&w->lock);
        int r = close_locked(w);
        pthread_mutex_unlock(&w->lock);
        return r;
}

int wal_close(struct wal *w)
{
        if (!w)
                return 0;
        int r = wal_shutdown(w);
        pthread_mutex_destroy(&w->lock);
        kbuf_free(&w->unbarriered);
        kbuf_free(&w->kept);
        free(w->path);
        free(w);
        return r;
}

static struct wal *unconst(const struct wal *w)
{
        return (struct wal *)w;
}

enum wal_state wal_state(const struct wal *w)
{
        pthread_mutex_lock(&unconst(w)->lock);
        enum wal_state s = w->state;
        pthread_mutex_unlock(&unconst(w)->lock);
        return s;
}

int wal_error(const struct wal *w)
{
        pthread_mutex_lock(&unconst(w)->lock);
        int e = w->error;
        pthread_mutex_unlock(&unconst(w)->lock);
        return e;
}

const char *wal_path(const struct wal *w)
{
        return w->path;
}

uint64_t wal_flush_count(const struct wal *w)
{
        pthread_mutex_lock(&unconst(w)->lock);
        uint64_t n = w->flush_count;
        pthread_mutex_unlock(&unconst(w)->lock);
        return n;
}

size_t wal_pending(const struct wal *w)
{
        pthread_mutex_lock(&unconst(w)->lock);
        size_t n = w->pending;
        pthread_mutex_unlock(&unconst(w)->lock);
        return n;
}

/* Why an append/flush is refused in the current state, or 0. */
static int refused_locked(const struct wal *w)
{
        switch (w->state) {
        case WAL_STATE_OK:
                return 0;
        case WAL_STATE_QUARANTINED:
                return -EBADMSG;
        case WAL_STATE_FAILED:
                return w->error;
        case WAL_STATE_CLOSED:
        default:
                return -EBADF;
        }
}

static void fail_locked(struct wal *w, int err)
{
        w->state = WAL_STATE_FAILED;
        w->error = err < 0 ? err : -EIO;
}

int wal_append(struct wal *w, const struct wal_record *rec)
{
        if (!w || !rec)
                return -EINVAL;
        /* A refused WAL reports its state, not a complaint about the record. */
        pthread_mutex_lock(&w->lock);
        int r = refused_locked(w);
        pthread_mutex_unlock(&w->lock);
        if (r < 0)
                return r;
        struct kbuf line = KBUF_INIT;
        r = wal_encode(rec, wal_now(w), &line);
        if (r < 0)
                goto out;

        pthread_mutex_lock(&w->lock);
        r = refused_locked(w);
        if (r == 0) {
                size_t written = 0;
                r = kio_write_all(w->io, w->fd, line.data, line.len, &written);
                if (r == 0 && written != line.len)
                        r = -EIO;
                if (r < 0) {
                        /* Cut any partial line away before anything else. */
                        w->io->ftruncate(w->io->ctx, w->fd, w->size);
                        fail_locked(w, r);
                } else if (w->barrier && kbuf_append(&w->unbarriered, line.data, line.len) < 0) {
                        /* the line is in the file but could never reach the
                         * barrier: nothing after the last barrier holds */
                        w->io->ftruncate(w->io->ctx, w->fd, w->size);
                        fail_locked(w, r = -ENOMEM);
                } else {
                        if (w->keep && !w->kept_lost && !w->kept.len) {
                                /* (the first line since the last take: kept
                                 * as it is, not copied) */
                                kbuf_free(&w->kept);
                                w->kept = line;
                                line = (struct kbuf)KBUF_INIT;
                        } else if (w->keep && !w->kept_lost &&
                                   kbuf_append(&w->kept, line.data, line.len) < 0) {
                                kbuf_free(&w->kept);
                                w->kept_lost = true;
                        }
                        w->size += (off_t)written;
                        w->pending++;
                        w->records++;
                }
        }
        pthread_mutex_unlock(&w->lock);
out:
        kbuf_free(&line);
        return r;
}

int64_t wal_records(const struct wal *w)
{
        if (!w)
                return 0;
        pthread_mutex_lock(&unconst(w)->lock);
        int64_t n = w->records;
        pthread_mutex_unlock(&unconst(w)->lock);
        return n;
}

int wal_take_appended(struct wal *w, struct kbuf *out, uint64_t *ret_at)
{
        if (!w || !out || out->len || !ret_at)
                return -EINVAL;
        pthread_mutex_lock(&w->lock);
        int r = w->keep && !w->kept_lost ? 0 : -ENODATA;
        *ret_at = (uint64_t)w->kept_at;
        if (r == 0) {
                kbuf_free(out);
                *out = w->kept;
                w->kept = (struct kbuf)KBUF_INIT;
        } else {
                kbuf_free(&w->kept);
        }
        w->kept_lost = false;
        w->kept_at = w->size;
        pthread_mutex_unlock(&w->lock);
        return r;
}

int wal_flush(struct wal *w)
{
        if (!w)
                return -EINVAL;
        pthread_mutex_lock(&w->lock);
        int r = refused_locked(w);
        if (r == 0 && w->pending > 0) {
                w->flush_count++;
                if (w->barrier) {
                        int64_t first = w->records - (int64_t)w->pending + 1;
                        r = w->barrier(w->barrier_ctx, first, w->unbarriered.data,
                                       w->unbarriered.len);
                        if (r == 0)
                                w->unbarriered.len = 0;
                } else {
                        r = w->io->fdatasync(w->io->ctx, w->fd);
                }
                if (r < 0)
                        fail_locked(w, r); /* never fdatasync this fd again */
                else
                        w->pending = 0;
        }
        pthread_mutex_unlock(&w->lock);
        return r;
}

/* ---- one function per op ------------------------------------------------- */

int wal_commit_plan(struct wal *w, const char *plan_id, const char *mandate_id, long long cycle,
                    const struct wal_step *steps, size_t nsteps)
{
        struct wal_record r = {
                .op = WAL_OP_PLAN_COMMIT,
                .plan_id = plan_id,
                .mandate_id = mandate_id,
                .cycle = cycle,
                .steps = steps,
                .nsteps = nsteps,
        };
        return wal_append(w, &r);
}

int wal_commit_planner_plan(struct wal *w, const struct planner_plan *p)
{
        if (!p)
                return -EINVAL;
        struct wal_step steps[PLANNER_PHASES];
        for (size_t i = 0; i < PLANNER_PHASES; i++) {
                steps[i] = (struct wal_step){
                        .step_id = p->steps[i].step_id,
                        .tool = p->steps[i].tool,
                        .params_hash = p->steps[i].params_hash,
                        .pre_hash = p->steps[i].pre_hash,
                        .expected_post_hash = p->steps[i].expected_post_hash,
                };
        }
        return wal_commit_plan(w, p->plan_id, p->mandate_id, p->cycle, steps, PLANNER_PHASES);
}

int wal_append_pending(struct wal *w, const char *step_id, const char *plan_id,
                       const char *idem_key)
{
        struct wal_record r = {
                .op = WAL_OP_APPEND,
                .step_id = step_id,
                .plan_id = plan_id,
                .idem_key = idem_key,
        };
        return wal_append(w, &r);
}

int wal_mark_executing(struct wal *w, const char *step_id, const char *pre_hash)
{
        struct wal_record r = { .op = WAL_OP_EXECUTING, .step_id = step_id, .pre_hash = pre_hash };
        return wal_append(w, &r);
}

int wal_mark_completed(struct wal *w, const char *step_id, const char *post_hash,
                       const char *result_hash, bool recovered, const char *evidence_json,
                       const char *result_json)
{
        struct wal_record r = {
                .op = WAL_OP_COMPLETED,
                .step_id = step_id,
                .post_hash = post_hash,
                .result_hash = result_hash,
                .recovered = recovered,
                .evidence_json = evidence_json,
                .result_json = result_json,
        };
        return wal_append(w, &r);
}

int wal_mark_failed(struct wal *w, const char *step_id, const char *error_class,
                    const char *error_msg)
{
        struct wal_record r = {
                .op = WAL_OP_FAILED,
                .step_id = step_id,
                .error_class = error_class,
                .error_msg = error_msg,
        };
        return wal_append(w, &r);
}

int wal_mark_needs_review(struct wal *w, const char *step_id, const char *reason,
                          const char *evidence_json)
{
        struct wal_record r = {
                .op = WAL_OP_NEEDS_REVIEW,
                .step_id = step_id,
                .reason = reason,
                .evidence_json = evidence_json,
        };
        return wal_append(w, &r);
}

int wal_mark_reset(struct wal *w, const char *step_id)
{
        struct wal_record r = { .op = WAL_OP_RESET, .step_id = step_id };
        return wal_append(w, &r);
}

int wal_finalize_plan(struct wal *w, const char *plan_id, enum plan_status status,
                      const char *reason)
{
        struct wal_record r = {
                .op = WAL_OP_FINALIZE,
                .plan_id = plan_id,
                .status = status,
                .reason = reason,
        };
        return wal_append(w, &r);
}

int wal_operator(struct wal *w, const char *mandate_id, const char *action,
                 const char *step_id, long long uid, const char *reason)
{
        struct wal_record r = {
                .op = WAL_OP_OPERATOR,
                .mandate_id = mandate_id,
                .action = action,
                .step_id = step_id,
                .uid = uid,
                .reason = reason,
        };
        return wal_append(w, &r);
}

int wal_mandate(struct wal *w, const char *mandate_id, const char *schedule, const char *fired_at,
                const char *goal)
{
        struct wal_record r = {
                .op = WAL_OP_MANDATE,
                .mandate_id = mandate_id,
                .schedule = schedule,
                .fired_at = fired_at,
                .goal = goal,
        };
        return wal_append(w, &r);
}

/* ------------------------------------------------------------------------ */
/* Archive                                                                   */
/* ------------------------------------------------------------------------ */

static int gzip_buffer(const char *data, size_t len, struct kbuf *out)
{
        z_stream zs;
        memset(&zs, 0, sizeof(zs));
        if (deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8,
                         Z_DEFAULT_STRATEGY) != Z_OK)
                return -ENOMEM;
        int r = 0;
        const unsigned char *in = (const unsigned char *)data;
        size_t left = len;
        int zr;
        do {
                if (zs.avail_in == 0 && left > 0) {
                        uInt chunk = left > UINT_MAX / 2 ? UINT_MAX / 2 : (uInt)left;
                        zs.next_in = (unsigned char *)in;
                        zs.avail_in = chunk;
                        in += chunk;
                        left -= chunk;
                }
                /* a small WAL's whole archive at once: no buffer past
                 * malloc's mmap threshold (an mmap, a munmap and their page
                 * faults per archive) */
                uLong bound = deflateBound(&zs, (uLong)len);
                if ((r = kbuf_reserve(out, bound < 65536 ? (size_t)bound : 65536)) < 0)
                        break;
                zs.next_out = (unsigned char *)out->data + out->len;
                zs.avail_out = (uInt)(out->cap - out->len - 1);
                uInt before = zs.avail_out;
                zr = deflate(&zs, left == 0 ? Z_FINISH : Z_NO_FLUSH);
                out->len += before - zs.avail_out;
                out->data[out->len] = '\0';
                if (zr != Z_OK && zr != Z_STREAM_END && zr != Z_BUF_ERROR) {
                        r = -EIO;
                        break;
                }
        } while (zr != Z_STREAM_END);
        deflateEnd(&zs);
        return r;
}

int wal_archive_path(const char *wal_path, const char *archive_dir, char **ret_path)
{
        if (!wal_path || !archive_dir || !*archive_dir)
                return -EINVAL;
        const char *base = strrchr(wal_path, '/');
        base = base ? base + 1 : wal_path;
        if (!*base)
                return -EINVAL;
        size_t n = strlen(archive_dir) + 1 + strlen(base) + sizeof(".gz");
        char *p = malloc(n);
        if (!p)
                return -ENOMEM;
        snprintf(p, n, "%s/%s.gz", archive_dir, base);
        *ret_path = p;
        return 0;
}

static int archive_file(const struct kio *io, const char *wal_path, const char *bytes,
                        size_t nbytes, const char *archive_dir, bool sync, char **dest)
{
        if (!wal_path || !*wal_path || !archive_dir || !*archive_dir)
                return -EINVAL;
        if (!io)
                io = kio_posix();
        if (dest)
                *dest = NULL;
        char *data = NULL, *tmp = NULL, *final = NULL;
        size_t len = 0;
        struct kbuf gz = KBUF_INIT;
        int fd = -1;
        int r = wal_archive_path(wal_path, archive_dir, &final);
        if (r < 0)
                return r;
        if (!bytes && (r = kio_read_file(wal_path, 0, 0, &data, &len)) < 0)
                goto out;
        if ((r = gzip_buffer(bytes ? bytes : data, bytes ? nbytes : len, &gz)) < 0)
                goto out;
        if (asprintf(&tmp, "%s.tmp", final) < 0) {
                tmp = NULL;
                r = -ENOMEM;
                goto out;
        }
        /* The archive directory exists but for the first archive (or after
         * someone removed it): made only when the file cannot be, not
         * asked for (a mkdir and a stat) for every mandate. */
        fd = io->open(io->ctx, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, WAL_FILE_MODE);
        if (fd == -ENOENT) {
                if ((r = kio_mkdir_p(io, archive_dir, STATEDIR_DIR_MODE)) < 0)
                        goto out;
                fd = io->open(io->ctx, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                              WAL_FILE_MODE);
        }
        if (fd < 0) {
                r = fd;
                goto out;
        }
        r = kio_write_close(io, fd, gz.data, gz.len, sync);
        fd = -1;
        if (r == 0)
                r = io->rename(io->ctx, tmp, final);
        if (r < 0) {
                io->unlink(io->ctx, tmp);
                goto out;
        }
        if (!sync)
                goto done;
        if ((r = io->fsync_dir(io->ctx, archive_dir)) < 0)
                goto out;
        /* The archive is durable: only now may the WAL go. */
        if ((r = io->unlink(io->ctx, wal_path)) < 0)
                goto out;
        if ((r = kio_fsync_parent(io, wal_path)) < 0)
                goto out;
done:
        if (dest) {
                *dest = final;
                final = NULL;
        }
out:
        free(data);
        free(tmp);
        free(final);
        kbuf_free(&gz);
        return r;
}

int wal_archive_file(const struct kio *io, const char *wal_path, const char *archive_dir,
                     char **dest)
{
        return archive_file(io, wal_path, NULL, 0, archive_dir, true, dest);
}

int wal_archive_stage(const struct kio *io, const char *wal_path, const char *archive_dir,
                      char **dest)
{
        return archive_file(io, wal_path, NULL, 0, archive_dir, false, dest);
}

int wal_archive_stage_bytes(const struct kio *io, const char *wal_path, const char *bytes,
                            size_t nbytes, const char *archive_dir, char **dest)
{
        if (!bytes)
                return -EINVAL;
        return archive_file(io, wal_path, bytes, nbytes, archive_dir, false, dest);
}

int wal_archive(struct wal *w, const char *archive_dir, char **dest)
{
        if (dest)
                *dest = NULL;
        if (!w)
                return -EINVAL;
        pthread_mutex_lock(&w->lock);
        int refused = w->state == WAL_STATE_CLOSED ? 0 : refused_locked(w);
        pthread_mutex_unlock(&w->lock);
        const struct kio *io = w->io;
        char *path = strdup(w->path);
        int r = wal_close(w);
        if (!path)
                return -ENOMEM;
        if (refused < 0)
                r = refused;
        else if (r == 0)
                r = wal_archive_file(io, path, archive_dir, dest);
        free(path);
        return r;
}
