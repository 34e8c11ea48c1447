/* SPDX-License-Identifier: MIT */
/* idem_core: the idempotency service's shared parts (idem_core.h). */

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "control_proto.h"
#include "idem_core.h"
#include "kairos/dlist.h"
#include "kairos/procstat.h"
#include "log.h"

bool idem_core_step(const struct idem_call *call, struct idem_step_owner *ret)
{
        struct idem_service *svc = SVC(call->d);
        return svc->step_of && call->pid > 0 && svc->step_of(call->d, call->pid, ret) == 0;
}

json_t *idem_core_step_json(const struct idem_step_owner *o)
{
        if (!o)
                return json_null();
        return json_pack("{s:s, s:s, s:I}", "mandate", o->mandate, "step", o->step, "attempt",
                         (json_int_t)o->attempt);
}

/* ---- clock, formatting ---- */

int64_t idem_core_now_ms(void *ctx)
{
        struct idem_service *svc = ctx;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + svc->clock_offset_ms;
}

json_t *idem_core_ms_json(int64_t ms)
{
        if (ms <= 0)
                return json_null();
        time_t t = (time_t)(ms / 1000);
        struct tm tm;
        char buf[96];
        if (!gmtime_r(&t, &tm))
                return json_null();
        snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ms % 1000));
        return json_string(buf);
}

json_t *idem_core_b64_json(const void *data, size_t len)
{
        size_t n = sodium_base64_ENCODED_LEN(len, B64);
        char *buf = malloc(n);
        if (!buf)
                return NULL;
        sodium_bin2base64(buf, n, data, len, B64);
        json_t *v = json_string(buf);
        free(buf);
        return v;
}

/* Decode base64 text; -EINVAL if malformed. */
int idem_core_b64_decode(const char *s, unsigned char **out, size_t *len)
{
        size_t n = strlen(s);
        *len = 0;
        *out = malloc(n / 4 * 3 + 3);
        if (!*out)
                return -ENOMEM;
        if (n && sodium_base642bin(*out, n / 4 * 3 + 3, s, n, NULL, len, NULL, B64) != 0) {
                free(*out);
                *out = NULL;
                return -EINVAL;
        }
        return 0;
}

void idem_core_sha256_hex(const void *data, size_t len, char out[IDEM_SHA256_HEX + 1])
{
        unsigned char h[crypto_hash_sha256_BYTES];
        crypto_hash_sha256(h, data ? data : (const void *)"", len);
        sodium_bin2hex(out, IDEM_SHA256_HEX + 1, h, sizeof h);
}

char *idem_core_done_payload(const struct idem_write_claim *w, uid_t uid, const char *reason,
                             const char *how)
{
        json_t *by = json_pack("{s:I, s:s, s:s}", "uid", (json_int_t)uid, "reason", reason,
                               "how", how ? how : "kairosctl resolve --done");
        json_t *pl = w ? json_pack("{s:s, s:I, s:o}", "path", w->path, "bytes",
                                   (json_int_t)w->bytes, "completed_by", by)
                       : json_pack("{s:i, s:s, s:s, s:o}", "exit_status", 0, "stdout", "",
                                   "stderr", "", "completed_by", by);
        char *text = pl ? json_dumps(pl, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(pl);
        return text;
}

/* ---- the log: flushes, durability, compaction ---- */

struct log_job {
        struct idem_service *svc;
        struct kbuf data;
        uint64_t upto;
        bool compact;
        struct idem_snapshot snap;
        int r;
};

void idem_core_kick(struct idem_service *svc);

static void log_work(void *arg)
{
        struct log_job *j = arg;
        if (j->compact)
                j->r = idem_log_compact(j->svc->log, j->data.data, j->data.len);
        else
                j->r = idem_log_append(j->svc->log, j->data.data, j->data.len);
}

/* Answer every waiter whose records are durable, or all of them once the
 * log failed.  Callbacks may add waiters: collect first, then call. */
static void wake(struct idem_service *svc)
{
        struct idem_stats st;
        idem_stats(svc->store, &st);
        struct waiter *ready = NULL, **pp = &svc->waiters;
        while (*pp) {
                struct waiter *w = *pp;
                if (w->lsn <= st.durable_lsn || st.error) {
                        *pp = w->next;
                        w->next = ready;
                        ready = w;
                } else {
                        pp = &w->next;
                }
        }
        while (ready) {
                struct waiter *w = ready;
                ready = w->next;
                w->done(w, w->lsn <= st.durable_lsn ? 0 : st.error);
        }
}

static void log_done(void *arg)
{
        struct log_job *j = arg;
        struct idem_service *svc = j->svc;
        svc->busy = false;
        svc->flushes = idem_log_flush_count(svc->log);
        if (j->compact) {
                if (j->r == 0) {
                        idem_compacted(svc->store, &j->snap);
                        svc->compactions++;
                        log_info("idempotency log compacted: %llu records",
                                 (unsigned long long)j->snap.records);
                } else {
                        struct idem_stats st;
                        idem_stats(svc->store, &st);
                        svc->compact_not_before = st.log_records * 2;
                        log_warning("compacting the idempotency log %s failed: %s",
                                    idem_log_path(svc->log), strerror(-j->r));
                        int e = idem_log_error(svc->log);
                        if (e < 0)
                                idem_set_failed(svc->store, e);
                }
        } else if (j->r == 0) {
                idem_durable(svc->store, j->upto);
        } else {
                log_error("writing the idempotency log %s failed: %s; tool calls are refused "
                          "until kairosd is restarted",
                          idem_log_path(svc->log), strerror(-j->r));
                idem_set_failed(svc->store, j->r);
        }
        kbuf_free(&j->data);
        free(j);
        wake(svc);
        idem_core_kick(svc);
}

/* Start the next log job if none runs: pending records first, else a due
 * compaction. */
void idem_core_kick(struct idem_service *svc)
{
        if (svc->busy || !svc->log || !svc->store)
                return;
        struct log_job *j = calloc(1, sizeof(*j));
        if (!j)
                goto oom;
        j->svc = svc;
        if (idem_pending_bytes(svc->store) > 0) {
                if (idem_take_pending(svc->store, &j->data, &j->upto) < 0)
                        goto oom;
        } else {
                struct idem_stats st;
                idem_stats(svc->store, &st);
                if (!idem_needs_compaction(svc->store) ||
                    st.log_records < svc->compact_not_before ||
                    idem_snapshot(svc->store, &j->data, &j->snap) < 0) {
                        kbuf_free(&j->data);
                        free(j);
                        return;
                }
                j->compact = true;
        }
        svc->busy = true;
        if (serialq_submit(&svc->log_q, log_work, log_done, j) < 0) {
                svc->busy = false;
                goto oom;
        }
        return;
oom:
        if (j)
                kbuf_free(&j->data);
        free(j);
        log_error("out of memory writing the idempotency log");
        idem_set_failed(svc->store, -ENOMEM);
        wake(svc);
}

/* Call w->done once every record up to lsn is durable (at once if it is). */
void idem_core_wait_durable(struct idem_service *svc, struct waiter *w, uint64_t lsn,
                         void (*done)(struct waiter *w, int err))
{
        w->lsn = lsn;
        w->done = done;
        w->next = svc->waiters;
        svc->waiters = w;
        idem_core_kick(svc);
        wake(svc);
}

/* ---- calls and their results ---- */

struct idem_call *idem_core_call_dup(const struct idem_call *in)
{
        struct idem_call *call = malloc(sizeof(*call));
        if (!call) {
                struct op_result r = { .code = "internal", .message = "out of memory" };
                in->done(in->ctx, &r);
                return NULL;
        }
        *call = *in;
        return call;
}

struct idem_call *idem_core_open(const struct idem_call *in, ...)
{
        struct idem_call *call = idem_core_call_dup(in);
        if (!call || idem_core_unavailable(call))
                return NULL;
        const char *name, *why;
        va_list ap;
        va_start(ap, in);
        int r = control_args_required(call->args, ap, &name, &why);
        va_end(ap);
        if (r == 0)
                return call;
        idem_core_error(call, "bad_argument", "args.%s: %s", name, why);
        return NULL;
}

/* Deliver the result and free the call (exactly one result per call). */
static void deliver(struct idem_call *call, json_t *result, const char *code, json_t *detail,
                    const char *message)
{
        struct op_result r = { .result = result, .code = code, .message = message,
                                 .detail = detail };
        call->done(call->ctx, &r);
        free(call);
}

void idem_core_ok(struct idem_call *call, json_t *result)
{
        deliver(call, result ? result : json_object(), NULL, NULL, NULL);
}

void idem_core_error_detail(struct idem_call *call, const char *code, json_t *detail,
                              const char *fmt, ...)
{
        char msg[2048];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        deliver(call, NULL, code, detail, msg);
}

/* A string argument: NULL when absent (*failed: answered bad_argument). */
const char *idem_core_arg_string(struct idem_call *call, const char *name, bool required,
                                   bool *failed)
{
        const char *v, *why;
        *failed = control_args_string(call->args, name, required, &v, &why) < 0;
        if (*failed)
                idem_core_error(call, "bad_argument", "args.%s: %s", name, why);
        return v;
}

static void claim_closed(struct idem_claim *c);

void idem_claim_owner_gone(struct idem_claim *c)
{
        c->hold = NULL;
        claim_closed(c);
}

/* ---- errors ---- */

bool idem_core_unavailable(struct idem_call *call)
{
        struct idem_service *svc = SVC(call->d);
        if (svc && svc->store && svc->loaded)
                return false;
        if (svc && svc->load_error)
                idem_core_error(call, "unavailable",
                                    "the idempotency store could not be loaded from %s: %s",
                                    svc->dir, strerror(-svc->load_error));
        else
                idem_core_error(call, "unavailable", "the idempotency store is not loaded");
        return true;
}

/* A store error of a mutation. */
void idem_core_store_error(struct idem_call *call, int r)
{
        struct idem_service *svc = SVC(call->d);
        if (r == -EBADMSG)
                idem_core_error(call, "quarantined",
                                    "the idempotency log %s is corrupt: the store is "
                                    "quarantined (lookups only) until it is repaired",
                                    svc->log ? idem_log_path(svc->log) : svc->dir);
        else if (r == -ENOMEM)
                idem_core_error(call, "internal", "out of memory");
        else
                idem_core_error(call, "io_error", "the idempotency log failed: %s",
                                    strerror(-r));
}

/* The answer to a begin that found an entry: a cached result (ok reply) or
 * a conflict (error reply).  v is the store's view (valid until the next
 * mutation: used at once). */
void idem_core_existing(struct idem_call *call, enum idem_outcome o,
                           const struct idem_view *v, const char *given_fp)
{
        switch (o) {
        case IDEM_HIT_COMPLETED:
        case IDEM_HIT_FAILED: {
                json_t *res = NULL;
                if (v->result_len > 0)
                        res = json_loadb(v->result, v->result_len, 0, NULL);
                if (!json_is_object(res)) {
                        json_decref(res);
                        res = json_object();
                        if (v->result_len > 0)
                                json_object_set_new(res, "result_b64",
                                                    idem_core_b64_json(v->result, v->result_len));
                }
                json_object_set_new(res, "outcome",
                                    json_string(o == IDEM_HIT_COMPLETED ? "completed" : "failed"));
                json_object_set_new(res, "cached", json_true());
                json_object_set_new(res, "key", json_string(v->key));
                json_object_set_new(res, "tool", json_string(v->tool));
                json_object_set_new(res, "created_at", idem_core_ms_json(v->created_ms));
                json_object_set_new(res, "finished_at", idem_core_ms_json(v->finished_ms));
                if (o == IDEM_HIT_FAILED) {
                        json_object_set_new(res, "error_class",
                                            json_string(v->error_class ? v->error_class : ""));
                        json_object_set_new(res, "error_msg",
                                            json_string(v->error_msg ? v->error_msg : ""));
                }
                idem_core_ok(call, res);
                return;
        }
        case IDEM_IN_PROGRESS:
                idem_core_error_detail(
                        call, "in_progress", json_pack("{s:s}", "key", v->key),
                        "key %s is in progress: another caller is running it (or its result is "
                        "not durable yet); try again later",
                        v->key);
                return;
        case IDEM_INTERRUPTED:
                idem_core_error_detail(
                        call, "interrupted",
                        json_pack("{s:s, s:s?}", "key", v->key, "reason", v->reason),
                        "key %s is interrupted (%s): its caller vanished before reporting a "
                        "result; find out whether the side effect happened, then run "
                        "'kairosctl idem forget %s --reason TEXT'",
                        v->key, v->reason ? v->reason : "no reason recorded", v->key);
                return;
        case IDEM_MISMATCH:
                idem_core_error_detail(
                        call, "mismatch",
                        json_pack("{s:s, s:s, s:s?}", "key", v->key, "fingerprint",
                                  v->fingerprint, "given", given_fp),
                        "key %s was used with another input (stored %s, this call %s): the "
                        "same key must mean the same call",
                        v->key, v->fingerprint, given_fp ? given_fp : "?");
                return;
        case IDEM_STORE_FULL: {
                struct idem_stats st;
                idem_stats(SVC(call->d)->store, &st);
                idem_core_error(call, "store_full",
                                    "the idempotency store is full: %zu entries (MaxEntries=%zu), "
                                    "none of them finished (%zu processing, %zu interrupted); "
                                    "finish or forget some",
                                    st.size, st.capacity, st.processing, st.interrupted);
                return;
        }
        default:
                idem_core_error(call, "internal", "unexpected outcome %s",
                                    idem_outcome_name(o));
                return;
        }
}

/* ---- the client of a call ---- */

bool idem_core_client(const struct idem_call *call, struct idem_client *ret)
{
        struct procstat st;
        *ret = (struct idem_client){ 0 };
        if (procstat_read((int)call->pid, &st) < 0 || st.state == 'Z')
                return false;
        *ret = (struct idem_client){ .pid = (int32_t)call->pid, .start = st.start };
        return true;
}

/* ---- claims ---- */

void idem_core_claim_free(struct idem_claim *c)
{
        struct idem_service *svc = c->svc;
        if (c->group > 0 && svc->tool_group)
                (void)svc->tool_group(svc->d, c->group, false);
        if (c->hold)
                c->release(c->hold);
        DLIST_UNLINK(svc->claims, c);
        free(c);
}

static void claim_closed(struct idem_claim *c)
{
        struct idem_service *svc = c->svc;
        uint64_t lsn;
        bool stopping = svc->d->stopping;
        if (c->gone) {
                c->gone(c);
                return;
        }
        /* a claim of the driver's (toolclaims.h) */
        if (svc->d->toolclaims->closed(c, stopping ? STOP_REASON : INTERRUPT_REASON))
                return;
        int r = idem_interrupt(svc->store, c->key, stopping ? STOP_REASON : INTERRUPT_REASON,
                               &lsn);
        if (r == 0)
                log_event(LOG_WARNING, NULL, LOG_FIELDS({ "IDEM_KEY", c->key }),
                          "idempotency key %s interrupted: %s; review it with kairosctl idem "
                          "get %s",
                          c->key, stopping ? STOP_REASON : INTERRUPT_REASON, c->key);
        else if (r != -ESTALE && r != -ENOENT)
                log_error("cannot mark %s interrupted: %s", c->key, strerror(-r));
        idem_core_claim_free(c);
        idem_core_kick(svc);
}

/* c (its key set) becomes the claim of call's connection: listed in svc,
 * released when the caller goes.  false: the caller is already gone (the
 * claim was closed as such). */
bool idem_core_claim_adopt(struct idem_service *svc, struct idem_claim *c, struct idem_call *call)
{
        c->svc = svc;
        DLIST_PUSH(svc->claims, c);
        c->owner_id = call->owner.id;
        c->release = call->owner.release;
        if (!call->owner.attach || !call->owner.attach(call->owner.ctx, c, &c->hold)) {
                c->hold = NULL;
                claim_closed(c);
                return false;
        }
        return true;
}

struct idem_claim *idem_core_claim_find(struct idem_service *svc, const char *key)
{
        for (struct idem_claim *c = svc->claims; c; c = c->next)
                if (!c->stream && strcmp(c->key, key) == 0)
                        return c;
        return NULL;
}

/* ---- the epoch of a step's call (toolclaims.h) ---- */

/* A call from a step may carry (args.epoch: kairosctl sends KAIROS_EPOCH)
 * the epoch its handler was started at.  It must be the epoch this node
 * holds the step's mandate at, and the mandate still this node's; otherwise
 * the handler belongs to a mandate taken over or given up, and its tool does
 * not run ("fenced").  A call with an epoch from no running step of this
 * node is fenced too.  Replies and returns false on a refusal; *ret_epoch:
 * the mandate's epoch (0: no step, or the file backend). */
bool idem_core_epoch(struct idem_call *call, const struct idem_step_owner *step,
                       int64_t *ret_epoch)
{
        *ret_epoch = 0;
        json_t *ev = json_object_get(call->args, "epoch");
        bool given = ev && !json_is_null(ev);
        if (given && (!json_is_integer(ev) || json_integer_value(ev) < 1)) {
                idem_core_error(call, "bad_argument", "args.epoch: must be an integer >= 1");
                return false;
        }
        long long want = given ? (long long)json_integer_value(ev) : 0;
        struct mandate *m = step ? mandate_find(call->d, step->mandate) : NULL;
        if (!m) {
                if (!given)
                        return true;
                idem_core_error_detail(call, "fenced", json_pack("{s:I}", "given", (json_int_t)want),
                                  "the call is at epoch %lld but comes from no running step of "
                                  "this node (its mandate is no longer here): the tool does not "
                                  "run",
                                  want);
                return false;
        }
        if (call->d->toolclaims->dropped(m)) {
                idem_core_error_detail(call, "fenced",
                                  json_pack("{s:s, s:I}", "mandate", m->id, "epoch",
                                            (json_int_t)m->epoch),
                                  "mandate %s is no longer this node's (it held it at epoch "
                                  "%lld): the tool does not run",
                                  m->id, (long long)m->epoch);
                return false;
        }
        if (given && want != m->epoch) {
                idem_core_error_detail(call, "fenced",
                                  json_pack("{s:s, s:I, s:I}", "mandate", m->id, "epoch",
                                            (json_int_t)m->epoch, "given", (json_int_t)want),
                                  "mandate %s is at epoch %lld on this node, the call at epoch "
                                  "%lld: the tool does not run",
                                  m->id, (long long)m->epoch, want);
                return false;
        }
        *ret_epoch = m->epoch;
        return true;
}
