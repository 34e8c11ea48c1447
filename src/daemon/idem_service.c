/* SPDX-License-Identifier: MIT */
/* idem_service: the idempotency store behind the control socket.  See
 * idem_service.h. */
#include "idem_service.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cluster.h"
#include "kairos/beneath.h"
#include "kairos/evidence.h"
#include "kairos/idem.h"
#include "kairos/kbuf.h"
#include "kairos/kio.h"
#include "log.h"
#ifdef KAIROS_HAVE_PGSTORE
#include "pgstore.h"
#endif

#define B64 sodium_base64_VARIANT_ORIGINAL
/* The tool name of tool-write entries (tool-begin may not use kairos.*). */
#define WRITE_TOOL "kairos.write"
#define INTERRUPT_REASON "the caller's connection closed before tool-finish"
#define STOP_REASON "kairosd stopped while the caller ran the tool"

/* Someone waiting for records to become durable. */
struct waiter {
        struct waiter *next;
        uint64_t lsn;
        void (*done)(struct waiter *w, int err);
};

/* A tool-begin claim, held by its owner (idem_service.h). */
struct idem_claim {
        const void *owner_id;
        void *hold;                        /* the owner's handle; NULL once released */
        void (*release)(void *hold);
        struct idem_service *svc;
        struct idem_claim *prev, *next;
        char key[IDEM_FULL_KEY_SIZE];
        /* cluster mode: claimed in the database for this step's mandate at
         * epoch (0: in the local store) */
        int64_t epoch;
        char mandate[IDEM_OWNER_ID_MAX + 1];
};

struct idem_service {
        struct daemon *d;
        struct idem_store *store;
        struct idem_log *log;
        char *dir;
        struct serialq log_q;      /* load, appends + fdatasync, compaction: in order */
        struct serialq write_q;    /* tool-write: path checks and file writes */
        void (*loaded_cb)(struct daemon *d);
        bool loaded;
        int load_error;
        struct idem_load_info info;
        bool busy;                 /* a log job in flight */
        struct waiter *waiters;
        struct idem_claim *claims;
        size_t nclaims;
        uint64_t flushes;          /* fdatasync calls of the log (copied after each job) */
        uint64_t compactions;
        uint64_t compact_not_before; /* log records: retry a failed compaction later */
        int64_t clock_offset_ms;   /* test hook */
        struct write_roots *roots; /* WriteRoots= opened; NULL until the first tool write */
        unsigned beneath_flags;    /* BENEATH_NO_OPENAT2 (test hook) */
        idem_step_lookup_fn step_of; /* attributes a call to a running step */
        struct write_roots *settle_roots; /* WriteRoots= for settling writes at load */
        json_t *settled;           /* what the load settled: [{key,path,outcome,why}] */
        int crash_at;              /* test hook: SIGKILL inside a tool write (1 before its
                                    * rename, 2 after it) */
};

struct write_roots;
static void roots_unref(struct write_roots *rs);
static void sha256_hex(const void *data, size_t len, char out[IDEM_SHA256_HEX + 1]);

static struct idem_service *SVC(struct daemon *d)
{
        return d->idem;
}

void idem_service_set_step_lookup(struct daemon *d, idem_step_lookup_fn fn)
{
        if (SVC(d))
                SVC(d)->step_of = fn;
}

/* The step a call comes from: the running step whose handler's process
 * group the caller (its SO_PEERCRED pid) is in.  Never from the request
 * itself: a caller cannot claim to be another step.  false: from no step. */
static bool call_step(const struct idem_call *call, struct idem_step_owner *ret)
{
        struct idem_service *svc = SVC(call->d);
        return svc->step_of && call->pid > 0 && svc->step_of(call->d, call->pid, ret) == 0;
}

static json_t *step_owner_json(const struct idem_step_owner *o)
{
        if (!o)
                return json_null();
        return json_pack("{s:s, s:s, s:I}", "mandate", o->mandate, "step", o->step, "attempt",
                         (json_int_t)o->attempt);
}

/* ---- clock, formatting ---- */

static int64_t svc_now_ms(void *ctx)
{
        struct idem_service *svc = ctx;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + svc->clock_offset_ms;
}

static json_t *ms_json(int64_t ms)
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

static json_t *b64_json(const void *data, size_t len)
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
static int b64_decode(const char *s, unsigned char **out, size_t *len)
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

/* ---- the log: flushes, durability, compaction ---- */

struct log_job {
        struct idem_service *svc;
        struct kbuf data;
        uint64_t upto;
        bool compact;
        struct idem_snapshot snap;
        int r;
};

static void kick(struct idem_service *svc);

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
        kick(svc);
}

/* Start the next log job if none runs: pending records first, else a due
 * compaction. */
static void kick(struct idem_service *svc)
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
static void wait_durable(struct idem_service *svc, struct waiter *w, uint64_t lsn,
                         void (*done)(struct waiter *w, int err))
{
        w->lsn = lsn;
        w->done = done;
        w->next = svc->waiters;
        svc->waiters = w;
        kick(svc);
        wake(svc);
}

/* ---- calls and their results ---- */

static struct idem_call *call_dup(const struct idem_call *in)
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

/* Deliver the result and free the call (exactly one result per call). */
static void deliver(struct idem_call *call, json_t *result, const char *code, json_t *detail,
                    const char *message)
{
        struct op_result r = { .result = result, .code = code, .message = message,
                                 .detail = detail };
        call->done(call->ctx, &r);
        free(call);
}

static void call_ok(struct idem_call *call, json_t *result)
{
        deliver(call, result ? result : json_object(), NULL, NULL, NULL);
}

static void call_error_detail(struct idem_call *call, const char *code, json_t *detail,
                              const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void call_error_detail(struct idem_call *call, const char *code, json_t *detail,
                              const char *fmt, ...)
{
        char msg[2048];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        deliver(call, NULL, code, detail, msg);
}

#define call_error(call, code, ...) call_error_detail(call, code, NULL, __VA_ARGS__)

/* A string argument: NULL when absent (*failed: answered bad_argument). */
static const char *call_arg_string(struct idem_call *call, const char *name, bool required,
                                   bool *failed)
{
        json_t *v = json_object_get(call->args, name);
        *failed = false;
        if (!v || json_is_null(v)) {
                if (required) {
                        *failed = true;
                        call_error(call, "bad_argument", "args.%s: required", name);
                }
                return NULL;
        }
        if (!json_is_string(v)) {
                *failed = true;
                call_error(call, "bad_argument", "args.%s: must be a string", name);
                return NULL;
        }
        return json_string_value(v);
}

static void claim_closed(struct idem_claim *c);

void idem_claim_owner_gone(struct idem_claim *c)
{
        c->hold = NULL;
        claim_closed(c);
}

/* ---- errors ---- */

static bool unavailable(struct idem_call *call)
{
        struct idem_service *svc = SVC(call->d);
        if (svc && svc->store && svc->loaded)
                return false;
        if (svc && svc->load_error)
                call_error(call, "unavailable",
                                    "the idempotency store could not be loaded from %s: %s",
                                    svc->dir, strerror(-svc->load_error));
        else
                call_error(call, "unavailable", "the idempotency store is not loaded");
        return true;
}

/* A store error of a mutation. */
static void reply_store_error(struct idem_call *call, int r)
{
        struct idem_service *svc = SVC(call->d);
        if (r == -EBADMSG)
                call_error(call, "quarantined",
                                    "the idempotency log %s is corrupt: the store is "
                                    "quarantined (lookups only) until it is repaired",
                                    svc->log ? idem_log_path(svc->log) : svc->dir);
        else if (r == -ENOMEM)
                call_error(call, "internal", "out of memory");
        else
                call_error(call, "io_error", "the idempotency log failed: %s",
                                    strerror(-r));
}

/* The answer to a begin that found an entry: a cached result (ok reply) or
 * a conflict (error reply).  v is the store's view (valid until the next
 * mutation: used at once). */
static void reply_existing(struct idem_call *call, enum idem_outcome o,
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
                                                    b64_json(v->result, v->result_len));
                }
                json_object_set_new(res, "outcome",
                                    json_string(o == IDEM_HIT_COMPLETED ? "completed" : "failed"));
                json_object_set_new(res, "cached", json_true());
                json_object_set_new(res, "key", json_string(v->key));
                json_object_set_new(res, "tool", json_string(v->tool));
                json_object_set_new(res, "created_at", ms_json(v->created_ms));
                json_object_set_new(res, "finished_at", ms_json(v->finished_ms));
                if (o == IDEM_HIT_FAILED) {
                        json_object_set_new(res, "error_class",
                                            json_string(v->error_class ? v->error_class : ""));
                        json_object_set_new(res, "error_msg",
                                            json_string(v->error_msg ? v->error_msg : ""));
                }
                call_ok(call, res);
                return;
        }
        case IDEM_IN_PROGRESS:
                call_error_detail(
                        call, "in_progress", json_pack("{s:s}", "key", v->key),
                        "key %s is in progress: another caller is running it (or its result is "
                        "not durable yet); try again later",
                        v->key);
                return;
        case IDEM_INTERRUPTED:
                call_error_detail(
                        call, "interrupted",
                        json_pack("{s:s, s:s?}", "key", v->key, "reason", v->reason),
                        "key %s is interrupted (%s): its caller vanished before reporting a "
                        "result; find out whether the side effect happened, then run "
                        "'kairosctl idem forget %s --reason TEXT'",
                        v->key, v->reason ? v->reason : "no reason recorded", v->key);
                return;
        case IDEM_MISMATCH:
                call_error_detail(
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
                call_error(call, "store_full",
                                    "the idempotency store is full: %zu entries (MaxEntries=%zu), "
                                    "none of them finished (%zu processing, %zu interrupted); "
                                    "finish or forget some",
                                    st.size, st.capacity, st.processing, st.interrupted);
                return;
        }
        default:
                call_error(call, "internal", "unexpected outcome %s",
                                    idem_outcome_name(o));
                return;
        }
}

/* ---- claims ---- */

static void claim_free(struct idem_claim *c)
{
        struct idem_service *svc = c->svc;
        if (c->hold)
                c->release(c->hold);
        if (c->prev)
                c->prev->next = c->next;
        else
                svc->claims = c->next;
        if (c->next)
                c->next->prev = c->prev;
        svc->nclaims--;
        free(c);
}

#ifdef KAIROS_HAVE_PGSTORE
static void pg_release(struct daemon *d, const char *key, const char *mandate, int64_t epoch,
                       bool drop, const char *why);
#endif

static void claim_closed(struct idem_claim *c)
{
        struct idem_service *svc = c->svc;
        uint64_t lsn;
        bool stopping = svc->d->stopping;
#ifdef KAIROS_HAVE_PGSTORE
        if (c->epoch > 0) {
                pg_release(svc->d, c->key, c->mandate, c->epoch, false,
                           stopping ? STOP_REASON : INTERRUPT_REASON);
                claim_free(c);
                return;
        }
#endif
        int r = idem_interrupt(svc->store, c->key, stopping ? STOP_REASON : INTERRUPT_REASON,
                               &lsn);
        if (r == 0)
                log_event(LOG_WARNING, NULL, LOG_FIELDS({ "IDEM_KEY", c->key }),
                          "idempotency key %s interrupted: %s; review it with kairosctl idem "
                          "get %s",
                          c->key, stopping ? STOP_REASON : INTERRUPT_REASON, c->key);
        else if (r != -ESTALE && r != -ENOENT)
                log_error("cannot mark %s interrupted: %s", c->key, strerror(-r));
        claim_free(c);
        kick(svc);
}

/* c (its key set) becomes the claim of call's connection: listed in svc,
 * released when the caller goes.  false: the caller is already gone (the
 * claim was closed as such). */
static bool claim_adopt(struct idem_service *svc, struct idem_claim *c, struct idem_call *call)
{
        c->svc = svc;
        c->next = svc->claims;
        if (svc->claims)
                svc->claims->prev = c;
        svc->claims = c;
        svc->nclaims++;
        c->owner_id = call->owner.id;
        c->release = call->owner.release;
        if (!call->owner.attach || !call->owner.attach(call->owner.ctx, c, &c->hold)) {
                c->hold = NULL;
                claim_closed(c);
                return false;
        }
        return true;
}


static struct idem_claim *claim_find(struct idem_service *svc, const char *key)
{
        for (struct idem_claim *c = svc->claims; c; c = c->next)
                if (strcmp(c->key, key) == 0)
                        return c;
        return NULL;
}

/* ---- cluster mode: a step's tool calls in the database ---- */

/* A call from a step may carry (args.epoch: kairosctl sends KAIROS_EPOCH)
 * the epoch its handler was started at.  It must be the epoch this node
 * holds the step's mandate at, and the mandate still this node's; otherwise
 * the handler belongs to a mandate taken over or given up, and its tool does
 * not run ("fenced").  A call with an epoch from no running step of this
 * node is fenced too.  Replies and returns false on a refusal; *ret_epoch:
 * the mandate's epoch (0: no step, or the file backend). */
static bool call_epoch(struct idem_call *call, const struct idem_step_owner *step,
                       int64_t *ret_epoch)
{
        *ret_epoch = 0;
        json_t *ev = json_object_get(call->args, "epoch");
        bool given = ev && !json_is_null(ev);
        if (given && (!json_is_integer(ev) || json_integer_value(ev) < 1)) {
                call_error(call, "bad_argument", "args.epoch: must be an integer >= 1");
                return false;
        }
        long long want = given ? (long long)json_integer_value(ev) : 0;
        struct mandate *m = step ? mandate_find(call->d, step->mandate) : NULL;
        if (!m) {
                if (!given)
                        return true;
                call_error_detail(call, "fenced", json_pack("{s:I}", "given", (json_int_t)want),
                                  "the call is at epoch %lld but comes from no running step of "
                                  "this node (its mandate is no longer here): the tool does not "
                                  "run",
                                  want);
                return false;
        }
        if (cluster_dropped(m)) {
                call_error_detail(call, "fenced",
                                  json_pack("{s:s, s:I}", "mandate", m->id, "epoch",
                                            (json_int_t)m->epoch),
                                  "mandate %s is no longer this node's (it held it at epoch "
                                  "%lld): the tool does not run",
                                  m->id, (long long)m->epoch);
                return false;
        }
        if (given && want != m->epoch) {
                call_error_detail(call, "fenced",
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

#ifdef KAIROS_HAVE_PGSTORE
/* One database call of a tool call, on a pool thread (a connection lent for
 * the job, cluster_thread_store); done runs on the loop. */
enum pg_op { PG_CLAIM, PG_FINISH, PG_RELEASE };

struct pg_job {
        uv_work_t req;
        struct daemon *d;
        enum pg_op op;
        char key[IDEM_FULL_KEY_SIZE];
        char tool[IDEM_TOOL_MAX + 1];
        char fp[CANON_HASH_STRLEN];
        char mandate[IDEM_OWNER_ID_MAX + 1];
        char step[IDEM_OWNER_ID_MAX + 1];
        uint32_t attempt;
        int64_t epoch;
        int64_t ttl_ms;
        char *node;
        bool failed;               /* PG_FINISH */
        bool drop;                 /* PG_RELEASE: forget it (it did nothing) */
        char *result;              /* PG_FINISH */
        size_t result_len;
        int r;
        char err[512];
        struct pgstore_idem_claim claim;
        void (*done)(struct pg_job *j);
        void *ctx;
};

static void pg_job_free(struct pg_job *j)
{
        if (!j)
                return;
        pgstore_idem_claim_free(&j->claim);
        free(j->result);
        free(j->node);
        free(j);
}

static struct pg_job *pg_job_new(struct daemon *d, enum pg_op op, const char *key,
                                 const char *mandate, int64_t epoch)
{
        struct pg_job *j = calloc(1, sizeof(*j));
        const char *node = cluster_node(d);
        if (!j || !node || !(j->node = strdup(node))) {
                free(j);
                return NULL;
        }
        j->d = d;
        j->op = op;
        j->epoch = epoch;
        j->ttl_ms = (int64_t)d->cfg->idem_ttl_sec * 1000;
        snprintf(j->key, sizeof j->key, "%s", key);
        snprintf(j->mandate, sizeof j->mandate, "%s", mandate);
        return j;
}

/* The connection lent to this pool thread, checked: a connection the server dropped
 * meanwhile (a restart) is found and replaced now, not by the call itself,
 * whose outcome would be unknown.  A database that does not answer is waited
 * for until a second past the node's own deadline (half a lease at least,
 * three at most): at the deadline the node kills its handlers, the caller
 * with them, and leaves its mandates to the other nodes, whose recovery
 * decides the step from the calls' rows.  Giving up earlier would fail a
 * step that may act.  NULL: j->r and j->err say why. */
static struct pgstore *pg_reach(struct pg_job *j)
{
        int64_t start = (int64_t)now_ms_monotonic();
        int64_t lease = cluster_lease_ms(j->d);
        int r = 0;
        for (unsigned attempt = 0;; attempt++) {
                struct pgstore *s = cluster_thread_store(j->d, &r);
                if (s && (r = pgstore_ping(s)) == 0)
                        return s;
                /* the deadline moves on while the node renews (its own
                 * connection may get through when this one cannot: the
                 * server out of connection slots); three leases at most */
                int64_t give_up = cluster_deadline_ms(j->d) + 1000;
                if (give_up < start + lease / 2)
                        give_up = start + lease / 2;
                if (give_up > start + 3 * lease)
                        give_up = start + 3 * lease;
                if ((int64_t)now_ms_monotonic() >= give_up) {
                        j->r = r < 0 ? r : -EIO;
                        snprintf(j->err, sizeof j->err, "cannot reach the database: %s",
                                 s ? pgstore_error(s) : strerror(-j->r));
                        return NULL;
                }
                cluster_thread_done();  /* others may use it meanwhile */
                cluster_backoff(attempt);
        }
}

/* After a finish whose outcome was unknown was repeated and refused as not
 * processing: the row in the state this job wrote, at its epoch, is its own
 * commit (a key's call at an epoch has one finisher: this job). */
static bool pg_finished_before(struct pgstore *s, const struct pg_job *j)
{
        struct pgstore_idem_row *rows = NULL;
        size_t n = 0;
        bool found = false;
        if (pgstore_idem_of_mandate(s, j->mandate, &rows, &n) < 0)
                return false;
        for (size_t i = 0; i < n && !found; i++)
                found = strcmp(rows[i].key, j->key) == 0 && rows[i].epoch == j->epoch &&
                        strcmp(rows[i].state, j->failed ? "failed" : "completed") == 0;
        pgstore_idem_rows_free(rows, n);
        return found;
}

static void pg_work_run(uv_work_t *w)
{
        struct pg_job *j = w->data;
        struct pgstore *s;
        int r = 0;
        bool repeated = false;
        for (unsigned tries = 0;; tries++) {
                if (!(s = pg_reach(j)))
                        return;
                switch (j->op) {
                case PG_CLAIM:
                        r = pgstore_idem_claim(s, j->key, j->tool, j->fp, j->mandate, j->epoch,
                                               j->node, j->step, j->attempt, j->ttl_ms,
                                               &j->claim);
                        break;
                case PG_FINISH:
                        r = pgstore_idem_finish(s, j->key, j->mandate, j->epoch, j->failed,
                                                j->result, j->result_len);
                        break;
                case PG_RELEASE:
                        r = pgstore_idem_release(s, j->key, j->mandate, j->epoch, j->drop);
                        break;
                }
                /* the effect has happened: a finish whose outcome is unknown
                 * is made again (the next call on this thread reconnects) */
                if (r != -ENOTCONN || j->op != PG_FINISH || tries == 8)
                        break;
                (void)pgstore_reset(s);
                repeated = true;
        }
        if (r == -ESTALE && repeated && pg_finished_before(s, j))
                r = 0;
        j->r = r;
        if (r < 0) {
                snprintf(j->err, sizeof j->err, "%s", pgstore_error(s));
                /* the next call on this connection reconnects */
                if (r == -ENOTCONN)
                        (void)pgstore_reset(s);
        }
}

static void pg_work(uv_work_t *w)
{
        pg_work_run(w);
        cluster_thread_done();  /* its connection goes back to the pool */
}

static void pg_after(uv_work_t *w, int status)
{
        struct pg_job *j = w->data;
        if (status == UV_ECANCELED) {
                j->r = -ECANCELED;
                snprintf(j->err, sizeof j->err, "cancelled");
        }
        j->done(j);
}

static int pg_submit(struct pg_job *j, void (*done)(struct pg_job *j), void *ctx)
{
        j->done = done;
        j->ctx = ctx;
        j->req.data = j;
        return uv_queue_work(j->d->loop, &j->req, pg_work, pg_after);
}

/* A database call of a tool call failed: fenced (the mandate is another
 * node's now, or at another epoch: this node gives it up) or unavailable. */
static void pg_reply_error(struct idem_call *call, struct pg_job *j, const char *what)
{
        if (j->r == -ESTALE || j->r == -ENOENT) {
                struct mandate *m = mandate_find(j->d, j->mandate);
                if (m && m->epoch == j->epoch)
                        cluster_drop(m, "a tool call of it was fenced");
                call_error_detail(call, "fenced",
                                  json_pack("{s:s, s:s, s:I}", "key", j->key, "mandate",
                                            j->mandate, "epoch", (json_int_t)j->epoch),
                                  "%s: mandate %s is no longer this node's at epoch %lld (%s): %s",
                                  j->key, j->mandate, (long long)j->epoch, j->err, what);
                return;
        }
        call_error_detail(call, "unavailable", json_pack("{s:s}", "key", j->key),
                          "%s: the cluster's database: %s: %s", j->key, j->err, what);
}

/* The entry the claim found, as the local store's view of it (replies are
 * the same).  *ret_payload: the parsed result, kept alive by the caller
 * while v is used. */
static enum idem_outcome pg_view(struct pg_job *j, struct idem_view *v, json_t **ret_payload)
{
        const struct pgstore_idem_claim *c = &j->claim;
        *ret_payload = NULL;
        *v = (struct idem_view){ .key = j->key, .tool = j->tool,
                                 .fingerprint = c->fingerprint ? c->fingerprint : "?",
                                 .created_ms = c->created_ms, .durable = true };
        switch (c->outcome) {
        case PGSTORE_IDEM_IN_PROGRESS:
                v->state = IDEM_ST_PROCESSING;
                return IDEM_IN_PROGRESS;
        case PGSTORE_IDEM_INTERRUPTED:
                v->state = IDEM_ST_INTERRUPTED;
                return IDEM_INTERRUPTED;
        case PGSTORE_IDEM_MISMATCH:
                return IDEM_MISMATCH;
        case PGSTORE_IDEM_CACHED:
                v->state = c->failed ? IDEM_ST_FAILED : IDEM_ST_COMPLETED;
                v->cached = true;
                v->finished_ms = c->updated_ms;
                v->result = c->result;
                v->result_len = c->result_len;
                if (c->result_len)
                        *ret_payload = json_loadb(c->result, c->result_len, 0, NULL);
                v->error_class = json_string_value(json_object_get(*ret_payload, "error_class"));
                v->error_msg = json_string_value(json_object_get(*ret_payload, "error_msg"));
                return c->failed ? IDEM_HIT_FAILED : IDEM_HIT_COMPLETED;
        case PGSTORE_IDEM_CLAIMED:
                break;
        }
        return IDEM_PROCEED;
}

/* Interrupted in the database: only recovery (after a takeover) or an
 * operator reading the evidence knows whether its side effect happened. */
static void pg_reply_interrupted(struct idem_call *call, const char *key)
{
        call_error_detail(call, "interrupted", json_pack("{s:s}", "key", key),
                          "key %s is interrupted in the cluster's database: its caller (or its "
                          "node) went before reporting a result; find out whether the side "
                          "effect happened",
                          key);
}

static void pg_release_done(struct pg_job *j)
{
        if (j->r == 0)
                log_event(LOG_WARNING, NULL, LOG_FIELDS({ "IDEM_KEY", j->key }),
                          "idempotency key %s of mandate %s %s in the cluster's database: %s",
                          j->key, j->mandate, j->drop ? "forgotten" : "interrupted",
                          j->result ? j->result : "its caller went");
        else if (j->r != -ESTALE && j->r != -ENOENT)
                log_error("cannot mark %s interrupted in the cluster's database: %s", j->key,
                          j->err);
        pg_job_free(j);
}

/* The caller of a claimed call went (why: for the log). */
static void pg_release(struct daemon *d, const char *key, const char *mandate, int64_t epoch,
                       bool drop, const char *why)
{
        struct pg_job *j = pg_job_new(d, PG_RELEASE, key, mandate, epoch);
        if (j) {
                j->drop = drop;
                j->result = why ? strdup(why) : NULL;
        }
        if (!j || pg_submit(j, pg_release_done, NULL) < 0) {
                log_error("cannot mark %s interrupted in the cluster's database: out of memory",
                          key);
                pg_job_free(j);
        }
}

static bool pg_class_ok(const char *c)
{
        size_t n = strlen(c);
        if (n < 1 || n > 64)
                return false;
        for (; *c; c++)
                if (!(*c >= 'a' && *c <= 'z') && !(*c >= 'A' && *c <= 'Z') &&
                    !(*c >= '0' && *c <= '9') && *c != '_' && *c != '.' && *c != '-')
                        return false;
        return true;
}
#endif /* KAIROS_HAVE_PGSTORE */

/* ---- tool-begin / tool-finish ---- */

struct begin_op {
        struct waiter w;
        struct idem_call *call;
        char key[IDEM_FULL_KEY_SIZE];
        char fp[CANON_HASH_STRLEN];
        char tool[IDEM_TOOL_MAX + 1];
};

static void begin_durable(struct waiter *w, int err)
{
        struct begin_op *op = (struct begin_op *)w;
        if (err)
                reply_store_error(op->call, err);
        else
                call_ok(op->call, json_pack("{s:s, s:s, s:s, s:s}", "outcome", "proceed",
                                                    "key", op->key, "tool", op->tool,
                                                    "fingerprint", op->fp));
        free(op);
}

/* The request's identity: tool, key or input, fingerprint.  Replies and
 * returns false on a bad argument. */
static bool parse_identity(struct idem_call *call, const char *tool, const char *key,
                           char full[IDEM_FULL_KEY_SIZE], char fp[CANON_HASH_STRLEN])
{
        bool failed;
        const char *given_fp = call_arg_string(call, "fingerprint", false, &failed);
        if (failed)
                return false;
        json_t *input = json_object_get(call->args, "input");
        char *text = NULL;
        if (input)
                text = json_dumps(input, JSON_COMPACT | JSON_ENCODE_ANY);
        else if (!given_fp && !key) {
                call_error(call, "bad_argument",
                                    "give args.key or args.input (for a content key)");
                return false;
        }
        struct idem_request ir = { .tool = tool,
                                   .key = key,
                                   .input_json = text ? text : "null",
                                   .input_len = text ? strlen(text) : 4,
                                   .fingerprint = given_fp };
        int r = idem_make_key(&ir, full, fp);
        free(text);
        if (r < 0) {
                call_error(call, "bad_argument",
                                    "bad identity: the tool must be 1..64 of [A-Za-z0-9_.-], the "
                                    "key 1..512 bytes of UTF-8 without control characters, not "
                                    "starting with 'content:', a fingerprint 'sha256-<64 hex>'");
                return false;
        }
        return true;
}

#ifdef KAIROS_HAVE_PGSTORE
/* tool-begin of a step's call in cluster mode: claimed in the database,
 * fenced by (mandate, epoch); the claim is the caller's connection's as in
 * the local store. */
static void pg_begin_done(struct pg_job *j)
{
        struct idem_call *call = j->ctx;
        struct idem_service *svc = SVC(j->d);
        if (j->r < 0) {
                pg_reply_error(call, j, "the tool does not run");
                pg_job_free(j);
                return;
        }
        if (j->claim.outcome != PGSTORE_IDEM_CLAIMED) {
                struct idem_view v;
                json_t *pl;
                enum idem_outcome o = pg_view(j, &v, &pl);
                if (o == IDEM_INTERRUPTED)
                        pg_reply_interrupted(call, j->key);
                else
                        reply_existing(call, o, &v, j->fp);
                json_decref(pl);
                pg_job_free(j);
                return;
        }
        struct idem_claim *c = calloc(1, sizeof(*c));
        if (!c) {
                pg_release(j->d, j->key, j->mandate, j->epoch, true, "out of memory");
                call_error(call, "internal", "out of memory");
                pg_job_free(j);
                return;
        }
        c->epoch = j->epoch;
        snprintf(c->key, sizeof c->key, "%s", j->key);
        snprintf(c->mandate, sizeof c->mandate, "%s", j->mandate);
        (void)claim_adopt(svc, c, call);
        call_ok(call, json_pack("{s:s, s:s, s:s, s:s, s:I}", "outcome", "proceed", "key", j->key,
                                "tool", j->tool, "fingerprint", j->fp, "epoch",
                                (json_int_t)j->epoch));
        pg_job_free(j);
}

static void pg_begin(struct idem_call *call, const char *key, const char *tool, const char *fp,
                     const struct idem_step_owner *step, int64_t epoch)
{
        struct pg_job *j = pg_job_new(call->d, PG_CLAIM, key, step->mandate, epoch);
        if (!j) {
                call_error(call, "internal", "out of memory");
                return;
        }
        snprintf(j->tool, sizeof j->tool, "%s", tool);
        snprintf(j->fp, sizeof j->fp, "%s", fp);
        snprintf(j->step, sizeof j->step, "%s", step->step);
        j->attempt = step->attempt;
        if (pg_submit(j, pg_begin_done, call) < 0) {
                pg_job_free(j);
                call_error(call, "internal", "cannot queue the claim");
        }
}

static void pg_finish_done(struct pg_job *j)
{
        struct idem_call *call = j->ctx;
        if (j->r < 0)
                pg_reply_error(call, j, "the result is not recorded");
        else
                call_ok(call, json_pack("{s:s, s:s, s:b}", "key", j->key, "outcome",
                                        j->failed ? "failed" : "completed", "durable", 1));
        pg_job_free(j);
}

/* tool-finish of a call claimed in the database: the result there, fenced;
 * a failed call keeps error_class and error_msg in its payload. */
static void pg_finish(struct idem_call *call, struct idem_claim *c, json_int_t exit_status,
                      const char *out, const char *err, const char *eclass, const char *emsg)
{
        if (eclass && !pg_class_ok(eclass)) {
                call_error(call, "bad_argument", "args.error_class: 1..64 of [A-Za-z0-9_.-]");
                return;
        }
        json_t *payload = json_pack("{s:I, s:s, s:s}", "exit_status", exit_status, "stdout", out,
                                    "stderr", err);
        if (payload && eclass) {
                json_object_set_new(payload, "error_class", json_string(eclass));
                json_object_set_new(payload, "error_msg", json_string(emsg ? emsg : ""));
        }
        char *text = payload ? json_dumps(payload, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(payload);
        struct pg_job *j = text ? pg_job_new(call->d, PG_FINISH, c->key, c->mandate, c->epoch)
                                : NULL;
        if (!j) {
                free(text);
                call_error(call, "internal", "out of memory");
                return;
        }
        j->failed = eclass != NULL;
        j->result = text;
        j->result_len = strlen(text);
        claim_free(c);
        if (pg_submit(j, pg_finish_done, call) < 0) {
                pg_job_free(j);
                call_error(call, "internal", "cannot queue the finish");
        }
}
#endif

void idem_tool_begin(const struct idem_call *in)
{
        struct idem_call *call = call_dup(in);
        if (!call)
                return;
        struct idem_service *svc = SVC(call->d);
        bool failed;
        if (unavailable(call))
                return;
        const char *tool = call_arg_string(call, "tool", true, &failed);
        if (failed)
                return;
        const char *key = call_arg_string(call, "key", false, &failed);
        if (failed)
                return;
        if (strncmp(tool, "kairos.", 7) == 0) {
                call_error(call, "bad_argument",
                                    "args.tool: names starting with 'kairos.' are reserved");
                return;
        }
        struct begin_op *op = calloc(1, sizeof(*op));
        struct idem_claim *c = calloc(1, sizeof(*c));
        if (!op || !c) {
                free(op);
                free(c);
                call_error(call, "internal", "out of memory");
                return;
        }
        if (!parse_identity(call, tool, key, op->key, op->fp))
                goto out;
        snprintf(op->tool, sizeof op->tool, "%s", tool);
        struct idem_step_owner step;
        bool owned = call_step(call, &step);
        int64_t epoch;
        if (!call_epoch(call, owned ? &step : NULL, &epoch))
                goto out;
#ifdef KAIROS_HAVE_PGSTORE
        if (owned && epoch > 0 && call->d->cluster) {
                pg_begin(call, op->key, op->tool, op->fp, &step, epoch);
                goto out;
        }
#endif
        struct idem_request ir = { .tool = tool, .key = key, .fingerprint = op->fp,
                                   .owner = owned ? &step : NULL };
        struct idem_view v;
        uint64_t lsn = 0;
        int r = idem_begin(svc->store, &ir, &v, &lsn);
        if (r < 0) {
                reply_store_error(call, r);
                goto out;
        }
        if (r != IDEM_PROCEED) {
                reply_existing(call, (enum idem_outcome)r, &v, op->fp);
                goto out;
        }
        /* The claim is this connection's from now on. */
        snprintf(c->key, sizeof c->key, "%s", op->key);
        (void)claim_adopt(svc, c, call); /* (closed at once if the caller is gone) */
        c = NULL;
        op->call = call;
        wait_durable(svc, &op->w, lsn, begin_durable);
        return;
out:
        free(op);
        free(c);
}

struct finish_op {
        struct waiter w;
        struct idem_call *call;
        char key[IDEM_FULL_KEY_SIZE];
        bool failed;
};

static void finish_durable(struct waiter *w, int err)
{
        struct finish_op *op = (struct finish_op *)w;
        if (err)
                reply_store_error(op->call, err);
        else
                call_ok(op->call,
                                 json_pack("{s:s, s:s, s:b}", "key", op->key, "outcome",
                                           op->failed ? "failed" : "completed", "durable", 1));
        free(op);
}

/* A base64 argument, validated; returns false after replying. */
static bool arg_b64(struct idem_call *call, const char *name, const char **out)
{
        bool failed;
        const char *s = call_arg_string(call, name, false, &failed);
        if (failed)
                return false;
        unsigned char *bin;
        size_t n;
        int r = b64_decode(s ? s : "", &bin, &n);
        if (r < 0) {
                call_error(call, "bad_argument", "args.%s: %s", name,
                                    r == -EINVAL ? "not base64" : "out of memory");
                return false;
        }
        free(bin);
        *out = s ? s : "";
        return true;
}

void idem_tool_finish(const struct idem_call *in)
{
        struct idem_call *call = call_dup(in);
        if (!call)
                return;
        struct idem_service *svc = SVC(call->d);
        bool failed;
        if (unavailable(call))
                return;
        const char *key = call_arg_string(call, "key", true, &failed);
        if (failed)
                return;
        json_t *es = json_object_get(call->args, "exit_status");
        if (!json_is_integer(es) || json_integer_value(es) < 0 ||
            json_integer_value(es) > 255) {
                call_error(call, "bad_argument", "args.exit_status: must be 0..255");
                return;
        }
        const char *out, *err;
        if (!arg_b64(call, "stdout", &out) || !arg_b64(call, "stderr", &err))
                return;
        const char *eclass = call_arg_string(call, "error_class", false, &failed);
        if (failed)
                return;
        const char *emsg = call_arg_string(call, "error_msg", false, &failed);
        if (failed)
                return;
        struct idem_claim *c = claim_find(svc, key);
        if (!c || !c->owner_id || c->owner_id != call->owner.id) {
                call_error(call, "conflict",
                                    "key %s is not claimed on this connection: send tool-begin "
                                    "first (on the same connection)",
                                    key);
                return;
        }
#ifdef KAIROS_HAVE_PGSTORE
        if (c->epoch > 0) {
                pg_finish(call, c, json_integer_value(es), out, err, eclass, emsg);
                return;
        }
#endif
        json_t *payload = json_pack("{s:I, s:s, s:s}", "exit_status", json_integer_value(es),
                                    "stdout", out, "stderr", err);
        char *text = payload ? json_dumps(payload, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(payload);
        struct finish_op *op = calloc(1, sizeof(*op));
        if (!text || !op) {
                free(text);
                free(op);
                call_error(call, "internal", "out of memory");
                return;
        }
        uint64_t lsn = 0;
        int r;
        if (eclass)
                r = idem_fail(svc->store, key, eclass, emsg ? emsg : "", text, strlen(text),
                              &lsn);
        else
                r = idem_complete(svc->store, key, text, strlen(text), &lsn);
        free(text);
        if (r == -EINVAL) {
                free(op);
                call_error(call, "bad_argument",
                                    "args.error_class: 1..64 of [A-Za-z0-9_.-]");
                return;
        }
        if (r < 0) {
                free(op);
                reply_store_error(call, r);
                return;
        }
        claim_free(c);
        op->call = call;
        op->failed = eclass != NULL;
        snprintf(op->key, sizeof op->key, "%s", key);
        wait_durable(svc, &op->w, lsn, finish_durable);
}

/* ---- tool-write ---- */

/* WriteRoots=: one descriptor per configured root, opened (O_PATH) by the
 * first tool write after start or reload and kept until the next reload,
 * so a root's own path is resolved once; everything below it is walked
 * with beneath_open_dir (no symbolic link, never out of the tree).  A set
 * is shared by the write_ops that use it (refs on the loop thread); its
 * descriptors and paths are touched only by jobs of write_q, which run one
 * at a time. */
struct write_root {
        char *path;             /* as configured, without a trailing '/' ("/" stays) */
        char *real;             /* its resolved path, once opened */
        int fd;                 /* -1 until opened */
        int error;              /* errno of the last failed open */
};

struct write_roots {
        unsigned refs;
        size_t n;
        struct write_root r[];
};

static void roots_unref(struct write_roots *rs)
{
        if (!rs || --rs->refs > 0)
                return;
        for (size_t i = 0; i < rs->n; i++) {
                if (rs->r[i].fd >= 0)
                        close(rs->r[i].fd);
                free(rs->r[i].path);
                free(rs->r[i].real);
        }
        free(rs);
}

/* Loop: the set for cfg (nothing opened yet). */
static struct write_roots *roots_new(const struct config *cfg)
{
        struct write_roots *rs = calloc(1, sizeof(*rs) + cfg->nwrite_roots * sizeof(rs->r[0]));
        if (!rs)
                return NULL;
        rs->refs = 1;
        for (size_t i = 0; i < cfg->nwrite_roots; i++) {
                struct write_root *r = &rs->r[rs->n];
                size_t len = strlen(cfg->write_roots[i]);
                while (len > 1 && cfg->write_roots[i][len - 1] == '/')
                        len--;
                if (!(r->path = strndup(cfg->write_roots[i], len))) {
                        roots_unref(rs);
                        return NULL;
                }
                r->fd = -1;
                rs->n++;
        }
        return rs;
}

/* Pool (write_q): open the roots not open yet (a root that did not exist
 * is tried again at the next write). */
static void roots_open(struct write_roots *rs)
{
        for (size_t i = 0; i < rs->n; i++) {
                struct write_root *r = &rs->r[i];
                if (r->fd >= 0)
                        continue;
                r->fd = open(r->path, O_PATH | O_DIRECTORY | O_CLOEXEC);
                r->error = r->fd < 0 ? errno : 0;
                if (r->fd >= 0 && !r->real)
                        r->real = realpath(r->path, NULL);
        }
}

struct write_op {
        struct waiter w;
        struct idem_service *svc;
        struct idem_call *call;
        char key[IDEM_FULL_KEY_SIZE];
        char fp[CANON_HASH_STRLEN];
        char *explicit_key;
        char *path;              /* as given */
        struct write_roots *roots; /* WriteRoots= when the request came */
        unsigned beneath_flags;
        unsigned char *content;
        size_t len;
        char sha[IDEM_SHA256_HEX + 1]; /* of content */
        /* results of the pool jobs */
        int dfd;                 /* the verified directory, or -1 */
        char *base;              /* the file name in it */
        char *shown;             /* the path as reported: root + '/' + the rest */
        const char *code;        /* refused: error code */
        char msg[2048];
        bool renamed;            /* the file may have been replaced */
        uint64_t lsn;
        /* cluster mode: claimed in the database for this step's mandate at
         * epoch (0: in the local store) */
        int64_t epoch;
        char mandate[IDEM_OWNER_ID_MAX + 1];
};

static void write_op_free(struct write_op *op)
{
        roots_unref(op->roots);
        free(op->explicit_key);
        free(op->path);
        free(op->content);
        if (op->dfd >= 0)
                close(op->dfd);
        free(op->base);
        free(op->shown);
        free(op);
}

static void refuse(struct write_op *op, const char *code, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
static void refuse(struct write_op *op, const char *code, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(op->msg, sizeof op->msg, fmt, ap);
        va_end(ap);
        op->code = code;
}

static void roots_text(const struct write_roots *rs, char *buf, size_t len)
{
        size_t used = 0;
        buf[0] = '\0';
        if (rs->n == 0) {
                snprintf(buf, len, "(none configured)");
                return;
        }
        for (size_t i = 0; i < rs->n && used < len; i++)
                used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? " " : "",
                                         rs->r[i].path);
}

/* The length of root if path is root itself or below it, else 0. */
static size_t under(const char *path, const char *root)
{
        if (!root)
                return 0;
        if (strcmp(root, "/") == 0)
                return 1;
        size_t n = strlen(root);
        return strncmp(path, root, n) == 0 && (path[n] == '\0' || path[n] == '/') ? n : 0;
}

/* path without empty and "." components and without a trailing '/';
 * *ret_dir: it ended in '/' or "/.".  -EINVAL for a ".." component. */
static int normalize(const char *path, char *out, size_t size, bool *ret_dir)
{
        size_t o = 0;
        *ret_dir = false;
        for (const char *s = path; *s;) {
                while (*s == '/')
                        s++;
                size_t n = strcspn(s, "/");
                if (n == 2 && s[0] == '.' && s[1] == '.')
                        return -EINVAL;
                *ret_dir = n == 0 || (n == 1 && s[0] == '.');
                if (!*ret_dir) {
                        if (o + 1 + n >= size)
                                return -ENAMETOOLONG;
                        out[o++] = '/';
                        memcpy(out + o, s, n);
                        o += n;
                }
                s += n;
        }
        if (o == 0)
                out[o++] = '/';
        out[o] = '\0';
        return 0;
}

/* Pool (write_q): is op->path a file within a WriteRoots= directory?  Opens
 * its directory beneath the root (op->dfd, op->base, op->shown) or refuses;
 * the file itself is checked by check_file. */
static void check_path(struct write_op *op)
{
        char roots[1024], norm[PATH_MAX];
        const char *p = op->path;
        bool dir_only;
        op->code = NULL;
        roots_text(op->roots, roots, sizeof roots);
        if (p[0] != '/') {
                refuse(op, "path_refused",
                       "%s: not an absolute path; tool write takes an absolute path within "
                       "WriteRoots= (%s)",
                       p, roots);
                return;
        }
        int r = normalize(p, norm, sizeof norm, &dir_only);
        if (r == -EINVAL) {
                refuse(op, "path_refused",
                       "%s: '..' is not allowed in the path; write within WriteRoots= (%s)", p,
                       roots);
                return;
        }
        if (r < 0) {
                refuse(op, "path_refused", "%s: %s", p, strerror(-r));
                return;
        }
        /* The root: the longest that holds the path, as configured or
         * resolved. */
        struct write_roots *rs = op->roots;
        roots_open(rs);
        const struct write_root *root = NULL;
        size_t best = 0;
        bool any_root = false;
        char why[1024] = "";
        size_t wused = 0;
        for (size_t i = 0; i < rs->n; i++) {
                const struct write_root *w = &rs->r[i];
                if (w->fd < 0) {
                        if (wused < sizeof why)
                                wused += (size_t)snprintf(why + wused, sizeof why - wused,
                                                          "; WriteRoots= %s: %s", w->path,
                                                          strerror(w->error));
                        continue;
                }
                any_root = true;
                size_t n = under(norm, w->path), m = under(norm, w->real);
                if (m > n)
                        n = m;
                if (n > best) {
                        best = n;
                        root = w;
                }
        }
        if (!root) {
                if (rs->n == 0)
                        refuse(op, "path_refused",
                               "%s: tool write is not enabled: no WriteRoots= in the "
                               "[Idempotency] section of the configuration",
                               p);
                else if (!any_root)
                        refuse(op, "path_refused", "%s: no WriteRoots= directory exists (%s)%s",
                               p, roots, why);
                else
                        refuse(op, "path_refused", "%s: not within WriteRoots= (%s)%s", p,
                               roots, why);
                return;
        }
        const char *rel = norm + best;
        while (*rel == '/')
                rel++;
        if (!*rel) {
                refuse(op, "path_refused",
                       "%s: names a directory (the WriteRoots= directory %s itself), not a file",
                       p, root->path);
                return;
        }
        if (dir_only) {
                refuse(op, "path_refused", "%s: names a directory, not a file", p);
                return;
        }
        const char *slash = strrchr(rel, '/');
        const char *base = slash ? slash + 1 : rel;
        size_t dlen = slash ? (size_t)(slash - rel) : 0;
        char dir[PATH_MAX];
        memcpy(dir, rel, dlen);
        dir[dlen] = '\0';
        /* Reported paths start with the root as the caller named it. */
        size_t plen = (size_t)(rel - norm);
        int dfd = -1;
        size_t bad = 0;
        r = beneath_open_dir(root->fd, dir, op->beneath_flags, &dfd, &bad);
        if (r < 0) {
                int blen = (int)(plen + bad);
                if (r == -ELOOP && bad)
                        refuse(op, "path_refused",
                               "%s: %.*s is a symbolic link; tool write follows no symbolic "
                               "link below a WriteRoots= directory (name the real path)",
                               p, blen, norm);
                else if (r == -ELOOP)
                        refuse(op, "path_refused",
                               "%s: a directory on the path is a symbolic link; tool write "
                               "follows no symbolic link below a WriteRoots= directory (name "
                               "the real path)",
                               p);
                else if (r == -ENOTDIR && bad)
                        refuse(op, "path_refused", "%s: %.*s is not a directory", p, blen,
                               norm);
                else if (r == -ENOENT && bad)
                        refuse(op, "path_refused",
                               "%s: its directory cannot be resolved: %.*s does not exist", p,
                               blen, norm);
                else
                        refuse(op, "path_refused",
                               "%s: its directory cannot be resolved below WriteRoots= %s: %s",
                               p, root->path, strerror(-r));
                return;
        }
        if (op->dfd >= 0)
                close(op->dfd);
        op->dfd = dfd;
        free(op->base);
        free(op->shown);
        op->base = strdup(base);
        op->shown = strdup(norm);
        if (!op->base || !op->shown)
                refuse(op, "internal", "out of memory");
}

/* Pool (write_q): the file in the verified directory is absent or a
 * regular file (a symbolic link is never replaced). */
static void check_file(struct write_op *op)
{
        struct stat st;
        if (fstatat(op->dfd, op->base, &st, AT_SYMLINK_NOFOLLOW) == 0) {
                if (S_ISLNK(st.st_mode))
                        refuse(op, "path_refused",
                               "%s: is a symbolic link (tool write replaces no symbolic "
                               "link; name its target)",
                               op->path);
                else if (!S_ISREG(st.st_mode))
                        refuse(op, "path_refused", "%s: exists and is not a regular file",
                               op->path);
        } else if (errno != ENOENT) {
                refuse(op, "path_refused", "%s: %s", op->path, strerror(errno));
        }
}

static void check_work(void *arg)
{
        struct write_op *op = arg;
        check_path(op);
        if (!op->code)
                check_file(op);
}

/* Pool thread: in the directory verified by check_work (never by its path
 * again): the file is still absent or regular, then a temporary file,
 * write, fdatasync, rename, fsync of the directory. */
static void write_work(void *arg)
{
        struct write_op *op = arg;
        if (op->dfd < 0)
                check_path(op);
        if (!op->code)
                check_file(op);
        if (op->code)
                return;
        int dfd = op->dfd;
        char tmp[NAME_MAX + 64];
        int fd = -1;
        for (int i = 0; i < 100 && fd < 0; i++) {
                uint32_t rnd = randombytes_random();
                snprintf(tmp, sizeof tmp, ".%.200s.kairos-tmp.%08x", op->base, rnd);
                fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
                            0644);
                if (fd < 0 && errno != EEXIST)
                        break;
        }
        if (fd < 0) {
                refuse(op, "write_failed", "%s: cannot create a temporary file in its "
                       "directory: %s", op->path, strerror(errno));
                return;
        }
        const unsigned char *p = op->content;
        size_t left = op->len;
        int e = 0;
        while (left > 0 && !e) {
                ssize_t n = write(fd, p, left);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        e = errno;
                else {
                        p += n;
                        left -= (size_t)n;
                }
        }
        if (!e && fdatasync(fd) < 0)
                e = errno;
        if (close(fd) < 0 && !e)
                e = errno;
#ifdef KAIROS_TEST_HOOKS
        if (!e && op->svc->crash_at == 1)
                raise(SIGKILL);
#endif
        if (!e && renameat(dfd, tmp, dfd, op->base) < 0)
                e = errno;
        if (e) {
                unlinkat(dfd, tmp, 0);
                refuse(op, "write_failed", "%s: writing failed: %s", op->path, strerror(e));
                return;
        }
        op->renamed = true;
        if (fsync(dfd) < 0)
                refuse(op, "write_failed", "%s: written, but its directory could not be "
                       "synced: %s", op->path, strerror(errno));
#ifdef KAIROS_TEST_HOOKS
        if (op->svc->crash_at == 2)
                raise(SIGKILL);
#endif
}

static void write_reply(struct write_op *op, bool cached)
{
        call_ok(op->call, json_pack("{s:s, s:s, s:s, s:I, s:b}", "outcome",
                                            cached ? "completed" : "written", "key", op->key,
                                            "path", op->shown ? op->shown : op->path,
                                            "bytes", (json_int_t)op->len, "cached", cached));
}

static void write_finished_durable(struct waiter *w, int err)
{
        struct write_op *op = (struct write_op *)w;
        if (err)
                reply_store_error(op->call, err);
        else if (op->code)
                call_error_detail(op->call, op->code,
                                           json_pack("{s:s, s:b}", "key", op->key, "cached",
                                                     0),
                                           "%s", op->msg);
        else
                write_reply(op, false);
        write_op_free(op);
}

/* Loop: record the outcome.  A write that failed before its rename
 * changed nothing: its entry is dropped (a retry with the key writes);
 * one that may have replaced the file is kept, failed or completed. */
#ifdef KAIROS_HAVE_PGSTORE
static void pg_write_done(struct write_op *op);
#endif

static void write_done(void *arg)
{
        struct write_op *op = arg;
        struct idem_service *svc = op->svc;
        uint64_t lsn = 0;
        int r;
#ifdef KAIROS_HAVE_PGSTORE
        if (op->epoch > 0) {
                pg_write_done(op);
                return;
        }
#endif
        if (op->code && !op->renamed) {
                r = idem_abandon(svc->store, op->key, op->msg, &lsn);
        } else if (op->code) {
                r = idem_fail(svc->store, op->key, strcmp(op->code, "path_refused") == 0
                                                           ? "path_refused"
                                                           : "write_failed",
                              op->msg, NULL, 0, &lsn);
        } else {
                json_t *pl = json_pack("{s:s, s:I}", "path", op->shown, "bytes",
                                       (json_int_t)op->len);
                char *text = pl ? json_dumps(pl, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
                json_decref(pl);
                r = text ? idem_complete(svc->store, op->key, text, strlen(text), &lsn)
                         : -ENOMEM;
                free(text);
        }
        if (r < 0) {
                log_error("cannot record the write of %s (%s): %s", op->path, op->key,
                          strerror(-r));
                reply_store_error(op->call, r);
                write_op_free(op);
                return;
        }
        if (op->code)
                log_warning("tool write %s (%s) failed%s: %s", op->path, op->key,
                            op->renamed ? "" : ", nothing written, not kept", op->msg);
        wait_durable(svc, &op->w, lsn, write_finished_durable);
}

static void write_begin_durable(struct waiter *w, int err)
{
        struct write_op *op = (struct write_op *)w;
        if (err) {
                reply_store_error(op->call, err);
                write_op_free(op);
                return;
        }
        if (serialq_submit(&op->svc->write_q, write_work, write_done, op) < 0) {
                refuse(op, "write_failed", "out of memory");
                write_done(op);
        }
}

/* A duplicate of a write: answer as the first time. */
static void write_existing(struct write_op *op, enum idem_outcome o, const struct idem_view *v)
{
        if (o == IDEM_HIT_COMPLETED) {
                json_t *pl = json_loadb(v->result, v->result_len, 0, NULL);
                const char *path = json_string_value(json_object_get(pl, "path"));
                free(op->shown);
                op->shown = path ? strdup(path) : NULL;
                op->len = (size_t)json_integer_value(json_object_get(pl, "bytes"));
                json_decref(pl);
                write_reply(op, true);
        } else if (o == IDEM_HIT_FAILED) {
                call_error_detail(op->call,
                                           v->error_class &&
                                                           strcmp(v->error_class,
                                                                  "path_refused") == 0
                                                   ? "path_refused"
                                                   : "write_failed",
                                           json_pack("{s:s, s:b}", "key", v->key, "cached", 1),
                                           "%s (cached: the first write with key %s failed)",
                                           v->error_msg ? v->error_msg : "", v->key);
        } else {
                reply_existing(op->call, o, v, op->fp);
        }
        write_op_free(op);
}

#ifdef KAIROS_HAVE_PGSTORE
/* tool-write of a step in cluster mode: claimed in the database (fenced),
 * written, and its outcome recorded there; a write that failed before its
 * rename changed nothing and is forgotten (a retry writes). */
static void pg_write_finished(struct pg_job *j)
{
        struct write_op *op = j->ctx;
        if (j->r < 0)
                pg_reply_error(op->call, j,
                               op->renamed ? "written, but its outcome is not recorded"
                                           : "nothing is written");
        else if (op->code)
                call_error_detail(op->call, op->code,
                                  json_pack("{s:s, s:b}", "key", op->key, "cached", 0), "%s",
                                  op->msg);
        else
                write_reply(op, false);
        write_op_free(op);
        pg_job_free(j);
}

static void pg_write_done(struct write_op *op)
{
        bool drop = op->code && !op->renamed;
        struct pg_job *j = pg_job_new(op->call->d, drop ? PG_RELEASE : PG_FINISH, op->key,
                                      op->mandate, op->epoch);
        json_t *pl = NULL;
        if (j && !drop) {
                if (op->code)
                        pl = json_pack("{s:s, s:s}", "error_class",
                                       strcmp(op->code, "path_refused") == 0 ? "path_refused"
                                                                             : "write_failed",
                                       "error_msg", op->msg);
                else
                        pl = json_pack("{s:s, s:I}", "path", op->shown, "bytes",
                                       (json_int_t)op->len);
                j->result = pl ? json_dumps(pl, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
                j->result_len = j->result ? strlen(j->result) : 0;
                j->failed = op->code != NULL;
        }
        json_decref(pl);
        if (j && drop)
                j->drop = true;
        if (!j || (!drop && !j->result) || pg_submit(j, pg_write_finished, op) < 0) {
                pg_job_free(j);
                call_error(op->call, "internal", "out of memory: the outcome of the write of %s "
                           "is not recorded", op->path);
                write_op_free(op);
                return;
        }
        if (op->code)
                log_warning("tool write %s (%s) failed%s: %s", op->path, op->key,
                            op->renamed ? "" : ", nothing written, not kept", op->msg);
}

static void pg_write_claimed(struct pg_job *j)
{
        struct write_op *op = j->ctx;
        if (j->r < 0) {
                pg_reply_error(op->call, j, "nothing is written");
                write_op_free(op);
                pg_job_free(j);
                return;
        }
        if (j->claim.outcome == PGSTORE_IDEM_CLAIMED) {
                op->epoch = j->epoch;
                snprintf(op->mandate, sizeof op->mandate, "%s", j->mandate);
                pg_job_free(j);
                if (serialq_submit(&op->svc->write_q, write_work, write_done, op) < 0) {
                        refuse(op, "write_failed", "out of memory");
                        write_done(op);
                }
                return;
        }
        struct idem_view v;
        json_t *pl;
        enum idem_outcome o = pg_view(j, &v, &pl);
        if (o == IDEM_INTERRUPTED) {
                pg_reply_interrupted(op->call, j->key);
                write_op_free(op);
        } else {
                write_existing(op, o, &v);
        }
        json_decref(pl);
        pg_job_free(j);
}

static void pg_write_begin(struct write_op *op, const struct idem_step_owner *step, int64_t epoch)
{
        struct pg_job *j = pg_job_new(op->call->d, PG_CLAIM, op->key, step->mandate, epoch);
        if (!j) {
                call_error(op->call, "internal", "out of memory");
                write_op_free(op);
                return;
        }
        snprintf(j->tool, sizeof j->tool, "%s", WRITE_TOOL);
        snprintf(j->fp, sizeof j->fp, "%s", op->fp);
        snprintf(j->step, sizeof j->step, "%s", step->step);
        j->attempt = step->attempt;
        if (pg_submit(j, pg_write_claimed, op) < 0) {
                pg_job_free(j);
                call_error(op->call, "internal", "cannot queue the claim");
                write_op_free(op);
        }
}
#endif

/* Loop: claim the key (after the path check, so a refused path is not
 * claimed), then write once the begin record is durable. */
static void begin_write(struct write_op *op)
{
        struct idem_service *svc = op->svc;
        struct idem_step_owner step;
        bool owned = call_step(op->call, &step);
        int64_t epoch;
        if (!call_epoch(op->call, owned ? &step : NULL, &epoch)) {
                write_op_free(op);
                return;
        }
#ifdef KAIROS_HAVE_PGSTORE
        if (owned && epoch > 0 && svc->d->cluster) {
                pg_write_begin(op, &step, epoch);
                return;
        }
#endif
        struct idem_write_claim claim = { .path = op->path, .sha256 = op->sha,
                                          .bytes = op->len };
        struct idem_request ir = { .tool = WRITE_TOOL, .key = op->explicit_key,
                                   .fingerprint = op->fp,
                                   .owner = owned ? &step : NULL,
                                   .write = strlen(op->path) <= IDEM_WRITE_PATH_MAX ? &claim
                                                                                    : NULL };
        struct idem_view v;
        uint64_t lsn = 0;
        int r = idem_begin(svc->store, &ir, &v, &lsn);
        if (r < 0) {
                reply_store_error(op->call, r);
                write_op_free(op);
                return;
        }
        if (r != IDEM_PROCEED) {
                write_existing(op, (enum idem_outcome)r, &v);
                return;
        }
        wait_durable(svc, &op->w, lsn, write_begin_durable);
}

static void check_done(void *arg)
{
        struct write_op *op = arg;
        if (op->code) {
                call_error_detail(op->call, op->code,
                                           json_pack("{s:s, s:s, s:b}", "key", op->key, "path",
                                                     op->path, "cached", 0),
                                           "%s", op->msg);
                write_op_free(op);
                return;
        }
        if (SVC(op->call->d)->load_error || !SVC(op->call->d)->store) {
                unavailable(op->call);
                write_op_free(op);
                return;
        }
        begin_write(op);
}

void idem_tool_write(const struct idem_call *in)
{
        struct idem_call *call = call_dup(in);
        if (!call)
                return;
        struct idem_service *svc = SVC(call->d);
        bool failed;
        if (unavailable(call))
                return;
        const char *key = call_arg_string(call, "key", true, &failed);
        if (failed)
                return;
        const char *path = call_arg_string(call, "path", true, &failed);
        if (failed)
                return;
        const char *content = call_arg_string(call, "content", true, &failed);
        if (failed)
                return;
        if (!svc->roots && !(svc->roots = roots_new(call->d->cfg))) {
                call_error(call, "internal", "out of memory");
                return;
        }
        struct write_op *op = calloc(1, sizeof(*op));
        if (!op) {
                call_error(call, "internal", "out of memory");
                return;
        }
        op->svc = svc;
        op->call = call;
        op->dfd = -1;
        op->roots = svc->roots;
        op->roots->refs++;
        op->beneath_flags = svc->beneath_flags;
        int r = b64_decode(content, &op->content, &op->len);
        if (r < 0) {
                call_error(call, "bad_argument", "args.content: %s",
                                    r == -EINVAL ? "not base64" : "out of memory");
                write_op_free(op);
                return;
        }
        sha256_hex(op->content, op->len, op->sha);
        /* The identity is the key and the path: content may differ on a
         * retry (a timestamp) and is still the same write. */
        json_t *input = json_pack("{s:s}", "path", path);
        char *text = input ? json_dumps(input, JSON_COMPACT) : NULL;
        json_decref(input);
        struct idem_request ir = { .tool = WRITE_TOOL, .key = key, .input_json = text,
                                   .input_len = text ? strlen(text) : 0 };
        r = text ? idem_make_key(&ir, op->key, op->fp) : -ENOMEM;
        free(text);
        op->explicit_key = strdup(key);
        op->path = strdup(path);
        if (r == 0 && (!op->explicit_key || !op->path))
                r = -ENOMEM;
        if (r < 0) {
                if (r == -ENOMEM)
                        call_error(call, "internal", "out of memory");
                else
                        call_error(call, "bad_argument",
                                            "args.key: 1..512 bytes of UTF-8 without control "
                                            "characters, not starting with 'content:'");
                write_op_free(op);
                return;
        }
        /* Known key: a duplicate is answered without touching the path. */
        struct idem_view v;
        if (idem_get(svc->store, op->key, &v) == 0) {
                begin_write(op);
                return;
        }
        if (serialq_submit(&svc->write_q, check_work, check_done, op) < 0) {
                call_error(call, "internal", "out of memory");
                write_op_free(op);
        }
}

/* ---- operator commands ---- */

int idem_service_evidence_index(struct daemon *d, struct evidence_index **ret)
{
        struct idem_service *svc = SVC(d);
        struct idem_stats st;
        if (!svc || !svc->loaded || !svc->store)
                return evidence_index_unknown(ret);
        idem_stats(svc->store, &st);
        if (st.quarantined || st.error)
                return evidence_index_unknown(ret);
        return evidence_index_build(svc->store, ret);
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
        /* borrowed: the store does not change while this runs (loop thread) */
        c->calls[c->n++] = (struct evidence_call){
                .key = v->key, .tool = v->tool, .step = v->owner->step,
                .attempt = v->owner->attempt, .state = v->state,
                .created_ms = v->created_ms, .finished_ms = v->finished_ms,
        };
        return 0;
}

static int cmp_calls(const void *a, const void *b)
{
        const struct evidence_call *x = a, *y = b;
        int c = strcmp(x->step, y->step);
        if (c)
                return c;
        if (x->created_ms != y->created_ms)
                return x->created_ms < y->created_ms ? -1 : 1;
        return strcmp(x->key, y->key);
}

json_t *idem_service_calls_json(struct daemon *d, const char *mandate_id)
{
        struct idem_service *svc = SVC(d);
        if (!svc || !svc->loaded || !svc->store || !mandate_id)
                return NULL;
        struct calls_ctx c = { .mandate = mandate_id };
        if (idem_foreach(svc->store, collect_call, &c) < 0) {
                free(c.calls);
                return NULL;
        }
        if (c.n > 1)
                qsort(c.calls, c.n, sizeof(*c.calls), cmp_calls);
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

int idem_service_stats(struct daemon *d, struct idem_stats *ret_stats)
{
        struct idem_service *svc = SVC(d);
        if (!svc || !svc->store || !svc->loaded)
                return -EAGAIN;
        idem_stats(svc->store, ret_stats);
        return 0;
}

void idem_stats_get(const struct idem_call *in)
{
        struct idem_call *call = call_dup(in);
        if (!call)
                return;
        struct idem_service *svc = SVC(call->d);
        json_t *roots = json_array();
        for (size_t i = 0; i < call->d->cfg->nwrite_roots; i++)
                json_array_append_new(roots, json_string(call->d->cfg->write_roots[i]));
        if (!svc || !svc->store || !svc->loaded) {
                char why[512];
                snprintf(why, sizeof why, "cannot load %s: %s", svc ? svc->dir : "?",
                         strerror(svc && svc->load_error ? -svc->load_error : EAGAIN));
                call_ok(call, json_pack("{s:b, s:s, s:o}", "available", 0, "error", why,
                                                "write_roots", roots));
                return;
        }
        struct idem_stats st;
        idem_stats(svc->store, &st);
        json_t *res = json_pack(
                "{s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, "
                "s:I, s:I, s:I, s:b}",
                "available", 1, "size", (json_int_t)st.size, "capacity",
                (json_int_t)st.capacity, "ttl_sec", (json_int_t)st.ttl_sec, "processing",
                (json_int_t)st.processing, "completed", (json_int_t)st.completed, "failed",
                (json_int_t)st.failed, "interrupted", (json_int_t)st.interrupted, "hits",
                (json_int_t)st.hits, "misses", (json_int_t)st.misses, "conflicts",
                (json_int_t)st.conflicts, "mismatches", (json_int_t)st.mismatches, "evictions",
                (json_int_t)st.evictions, "expirations", (json_int_t)st.expirations,
                "store_full", (json_int_t)st.store_full, "forgets", (json_int_t)st.forgets,
                "log_records", (json_int_t)st.log_records, "lsn", (json_int_t)st.lsn,
                "quarantined", st.quarantined);
        json_object_set_new(res, "durable_lsn", json_integer((json_int_t)st.durable_lsn));
        json_object_set_new(res, "error", st.error ? json_string(strerror(-st.error))
                                                   : json_null());
        json_object_set_new(res, "log_path", json_string(idem_log_path(svc->log)));
        json_object_set_new(res, "log_flushes", json_integer((json_int_t)svc->flushes));
        json_object_set_new(res, "compactions", json_integer((json_int_t)svc->compactions));
        json_object_set_new(res, "claims", json_integer((json_int_t)svc->nclaims));
        json_object_set_new(res, "write_roots", roots);
        call_ok(call, res);
}

/* The entry named by args.key: the full key "TOOL:KEY", or KEY alone for
 * a tool run ("cmd:KEY") or a tool write ("kairos.write:KEY").  Replies
 * not_found and returns -ENOENT. */
static int find_entry(struct idem_call *call, const char *key, struct idem_view *v,
                      char full[IDEM_FULL_KEY_SIZE])
{
        static const char *const prefixes[] = { "", "cmd:", WRITE_TOOL ":" };
        struct idem_service *svc = SVC(call->d);
        for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
                size_t pl = strlen(prefixes[i]), kl = strlen(key);
                if (pl + kl >= IDEM_FULL_KEY_SIZE)
                        continue;
                memcpy(full, prefixes[i], pl);
                memcpy(full + pl, key, kl + 1);
                if (idem_get(svc->store, full, v) == 0)
                        return 0;
        }
        call_error(call, "not_found",
                            "no idempotency entry %s (nor cmd:%s, " WRITE_TOOL ":%s)", key, key,
                            key);
        return -ENOENT;
}

void idem_get_entry(const struct idem_call *in)
{
        struct idem_call *call = call_dup(in);
        if (!call)
                return;
        bool failed;
        if (unavailable(call))
                return;
        const char *key = call_arg_string(call, "key", true, &failed);
        if (failed)
                return;
        struct idem_view v;
        char full[IDEM_FULL_KEY_SIZE];
        if (find_entry(call, key, &v, full) < 0)
                return;
        json_t *res = json_pack("{s:s, s:s, s:s, s:s, s:b, s:o, s:o, s:o}", "key", v.key, "tool",
                                v.tool, "fingerprint", v.fingerprint, "state",
                                idem_state_name(v.state), "durable", v.durable, "created_at",
                                ms_json(v.created_ms), "finished_at", ms_json(v.finished_ms),
                                "expires_at", ms_json(v.expires_ms));
        if (v.error_class)
                json_object_set_new(res, "error_class", json_string(v.error_class));
        if (v.error_msg)
                json_object_set_new(res, "error_msg", json_string(v.error_msg));
        if (v.reason)
                json_object_set_new(res, "reason", json_string(v.reason));
        json_object_set_new(res, "owner", step_owner_json(v.owner));
        if (v.result_len > 0) {
                json_t *pl = json_loadb(v.result, v.result_len, 0, NULL);
                json_object_set_new(res, "result", pl ? pl : json_pack("{s:o}", "result_b64",
                                                                      b64_json(v.result,
                                                                               v.result_len)));
        }
        call_ok(call, res);
}

struct forget_op {
        struct waiter w;
        struct idem_call *call;
        char key[IDEM_FULL_KEY_SIZE];
        const char *state;
};

static void forget_durable(struct waiter *w, int err)
{
        struct forget_op *op = (struct forget_op *)w;
        if (err)
                reply_store_error(op->call, err);
        else
                call_ok(op->call, json_pack("{s:s, s:s, s:b, s:I}", "key", op->key,
                                                    "state", op->state, "forgotten", 1, "uid",
                                                    (json_int_t)op->call->uid));
        free(op);
}

void idem_forget_entry(const struct idem_call *in)
{
        struct idem_call *call = call_dup(in);
        if (!call)
                return;
        struct idem_service *svc = SVC(call->d);
        bool failed;
        if (unavailable(call))
                return;
        const char *key = call_arg_string(call, "key", true, &failed);
        if (failed)
                return;
        const char *reason = call_arg_string(call, "reason", true, &failed);
        if (failed)
                return;
        if (!*reason) {
                call_error(call, "bad_argument", "args.reason: must not be empty");
                return;
        }
        struct idem_view v;
        char full[IDEM_FULL_KEY_SIZE];
        if (find_entry(call, key, &v, full) < 0)
                return;
        struct forget_op *op = calloc(1, sizeof(*op));
        if (!op) {
                call_error(call, "internal", "out of memory");
                return;
        }
        op->state = idem_state_name(v.state);
        uint64_t lsn = 0;
        int r = idem_forget(svc->store, full, (long long)call->uid, reason, &lsn);
        if (r == -EBUSY) {
                free(op);
                call_error(call, "conflict",
                                    "key %s is processing: its caller may still be running "
                                    "the tool; it can be forgotten once it is finished or "
                                    "interrupted",
                                    full);
                return;
        }
        if (r < 0) {
                free(op);
                reply_store_error(call, r);
                return;
        }
        char uid[32];
        snprintf(uid, sizeof uid, "%u", (unsigned)call->uid);
        log_event(LOG_NOTICE, MSGID_OPERATOR,
                  LOG_FIELDS({ "IDEM_KEY", full }, { "OPERATOR_UID", uid }),
                  "idempotency key %s (%s) forgotten by uid %s: %s", full, op->state, uid,
                  reason);
        op->call = call;
        snprintf(op->key, sizeof op->key, "%s", full);
        wait_durable(svc, &op->w, lsn, forget_durable);
}

#ifdef KAIROS_TEST_HOOKS
void idem_test_clock(const struct idem_call *in)
{
        struct idem_call *call = call_dup(in);
        if (!call)
                return;
        struct idem_service *svc = SVC(call->d);
        json_t *v = json_object_get(call->args, "advance_sec");
        if (!svc || !json_is_integer(v) || json_integer_value(v) < 0) {
                call_error(call, "bad_argument",
                                    "args.advance_sec: must be a non-negative integer");
                return;
        }
        svc->clock_offset_ms += (int64_t)json_integer_value(v) * 1000;
        log_warning("test hook: the idempotency store's clock is %lld s ahead",
                    (long long)(svc->clock_offset_ms / 1000));
        call_ok(call, json_pack("{s:I}", "offset_sec",
                                        (json_int_t)(svc->clock_offset_ms / 1000)));
}
#endif

/* ---- start / stop ---- */

static void sha256_hex(const void *data, size_t len, char out[IDEM_SHA256_HEX + 1])
{
        unsigned char h[crypto_hash_sha256_BYTES];
        crypto_hash_sha256(h, data ? data : (const void *)"", len);
        sodium_bin2hex(out, IDEM_SHA256_HEX + 1, h, sizeof h);
}

/* ---- settling tool writes a crash interrupted (docs/design.md §11) ---- */

enum settle_verdict { SETTLE_WRITTEN, SETTLE_NOT_WRITTEN, SETTLE_UNKNOWN };

/* Pool: does the file named by the claim hold the claimed content?  The
 * path is resolved beneath its WriteRoots= directory exactly as a tool
 * write resolves it (no symbolic link followed); the file is opened
 * O_NOFOLLOW.  why: for the log and the record. */
static enum settle_verdict settle_check(struct idem_service *svc,
                                        const struct idem_write_claim *w, char **ret_shown,
                                        char *why, size_t whylen)
{
        struct write_op op = { .svc = svc, .dfd = -1, .roots = svc->settle_roots,
                               .beneath_flags = svc->beneath_flags, .path = (char *)w->path };
        enum settle_verdict v = SETTLE_UNKNOWN;
        *ret_shown = NULL;
        check_path(&op);
        if (op.code) {
                snprintf(why, whylen, "%s", op.msg);
                goto out;
        }
        int fd = openat(op.dfd, op.base, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0 && errno == ENOENT) {
                snprintf(why, whylen, "the file does not exist: the write never reached its "
                         "rename");
                v = SETTLE_NOT_WRITTEN;
                goto out;
        }
        if (fd < 0) {
                snprintf(why, whylen, "the file cannot be opened: %s", strerror(errno));
                goto out;
        }
        struct stat st;
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
                snprintf(why, whylen, "the file is not a regular file");
                close(fd);
                goto out;
        }
        if ((uint64_t)st.st_size != w->bytes) {
                snprintf(why, whylen, "the file holds %lld bytes, the write %llu: its content "
                         "is not the write's",
                         (long long)st.st_size, (unsigned long long)w->bytes);
                v = SETTLE_NOT_WRITTEN;
                close(fd);
                goto out;
        }
        crypto_hash_sha256_state hs;
        crypto_hash_sha256_init(&hs);
        unsigned char buf[65536];
        uint64_t total = 0;
        for (;;) {
                ssize_t n = read(fd, buf, sizeof buf);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0) {
                        snprintf(why, whylen, "the file cannot be read: %s", strerror(errno));
                        close(fd);
                        goto out;
                }
                if (n == 0)
                        break;
                total += (uint64_t)n;
                crypto_hash_sha256_update(&hs, buf, (size_t)n);
        }
        close(fd);
        unsigned char h[crypto_hash_sha256_BYTES];
        char hex[IDEM_SHA256_HEX + 1];
        crypto_hash_sha256_final(&hs, h);
        sodium_bin2hex(hex, sizeof hex, h, sizeof h);
        if (total == w->bytes && strcmp(hex, w->sha256) == 0) {
                snprintf(why, whylen, "the file holds the write's content (sha256 %s, %llu "
                         "bytes): the write took effect",
                         hex, (unsigned long long)total);
                v = SETTLE_WRITTEN;
        } else {
                snprintf(why, whylen, "the file's content (sha256 %s) is not the write's "
                         "(sha256 %s)",
                         hex, w->sha256);
                v = SETTLE_NOT_WRITTEN;
        }
out:
        if (op.dfd >= 0)
                close(op.dfd);
        free(op.base);
        if (v == SETTLE_WRITTEN)
                *ret_shown = op.shown;
        else
                free(op.shown);
        return v;
}

struct settle_item {
        char key[IDEM_FULL_KEY_SIZE];
        char *path;
        char sha[IDEM_SHA256_HEX + 1];
        uint64_t bytes;
};

struct settle_list {
        struct settle_item *v;
        size_t n, cap;
        int err;
};

static int collect_open_write(const struct idem_view *v, void *arg)
{
        struct settle_list *l = arg;
        if ((v->state != IDEM_ST_INTERRUPTED && v->state != IDEM_ST_PROCESSING) ||
            strcmp(v->tool, WRITE_TOOL) != 0 || !v->write.path)
                return 0;
        if (l->n == l->cap) {
                size_t cap = l->cap ? l->cap * 2 : 8;
                struct settle_item *nv = realloc(l->v, cap * sizeof(*nv));
                if (!nv) {
                        l->err = -ENOMEM;
                        return 1;
                }
                l->v = nv;
                l->cap = cap;
        }
        struct settle_item *it = &l->v[l->n];
        snprintf(it->key, sizeof it->key, "%s", v->key);
        memcpy(it->sha, v->write.sha256, sizeof it->sha);
        it->bytes = v->write.bytes;
        if (!(it->path = strdup(v->write.path))) {
                l->err = -ENOMEM;
                return 1;
        }
        l->n++;
        return 0;
}

/* Pool, at load (before anything else uses the store): every tool write
 * that a crash left open is decided from its file — the content it claimed
 * is there → completed (a retry replays it); it is not → dropped (a retry
 * writes; the write is an atomic replace, so it never reached its rename,
 * or the file was replaced since).  Unreadable → left interrupted for an
 * operator.  The records are made durable here. */
static void settle_writes(struct idem_service *svc)
{
        struct settle_list l = { 0 };
        idem_foreach(svc->store, collect_open_write, &l);
        if (!(svc->settled = json_array()))
                l.err = -ENOMEM;
        for (size_t i = 0; i < l.n && !l.err; i++) {
                struct settle_item *it = &l.v[i];
                struct idem_write_claim w = { .path = it->path, .sha256 = it->sha,
                                              .bytes = it->bytes };
                char why[2200], *shown = NULL;
                enum settle_verdict v = settle_check(svc, &w, &shown, why, sizeof why);
                int r = 0;
                const char *outcome = "left_interrupted";
                if (v == SETTLE_WRITTEN) {
                        json_t *pl = json_pack("{s:s, s:I, s:s}", "path", shown ? shown : it->path,
                                               "bytes", (json_int_t)it->bytes, "settled",
                                               "at kairosd start, from the file");
                        char *text = pl ? json_dumps(pl, JSON_COMPACT | JSON_PRESERVE_ORDER)
                                        : NULL;
                        json_decref(pl);
                        r = text ? idem_settle_complete(svc->store, it->key, text, strlen(text),
                                                        NULL)
                                 : -ENOMEM;
                        free(text);
                        outcome = "completed";
                } else if (v == SETTLE_NOT_WRITTEN) {
                        char reason[2400];
                        snprintf(reason, sizeof reason, "settled at kairosd start: %s", why);
                        r = idem_settle_abandon(svc->store, it->key, reason, NULL);
                        outcome = "dropped";
                }
                free(shown);
                if (r < 0)
                        outcome = "left_interrupted";
                json_array_append_new(svc->settled,
                                      json_pack("{s:s, s:s, s:s, s:s}", "key", it->key, "path",
                                                it->path, "outcome", outcome, "why",
                                                r < 0 ? strerror(-r) : why));
        }
        for (size_t i = 0; i < l.n; i++)
                free(l.v[i].path);
        free(l.v);
        if (idem_pending_bytes(svc->store) == 0)
                return;
        struct kbuf b = { 0 };
        uint64_t upto = 0;
        int r = idem_take_pending(svc->store, &b, &upto);
        if (r == 0)
                r = idem_log_append(svc->log, b.data, b.len);
        kbuf_free(&b);
        if (r == 0)
                idem_durable(svc->store, upto);
        else
                idem_set_failed(svc->store, r);
}

static void load_work(void *arg)
{
        struct idem_service *svc = arg;
        svc->load_error = idem_log_open(svc->dir, NULL, svc->store, &svc->log, &svc->info);
        if (svc->load_error == 0 && !svc->info.corrupt && svc->settle_roots)
                settle_writes(svc);
}

static void load_done(void *arg)
{
        struct idem_service *svc = arg;
        const struct idem_load_info *in = &svc->info;
        if (svc->load_error < 0) {
                log_error("the idempotency store cannot be loaded from %s: %s; tool run and "
                          "tool write are refused until this is fixed and kairosd restarted",
                          svc->dir, strerror(-svc->load_error));
                idem_store_free(svc->store);
                svc->store = NULL;
                svc->log = NULL;
        } else {
                svc->loaded = true;
                svc->flushes = idem_log_flush_count(svc->log);
                if (in->torn_repaired)
                        log_warning("idempotency log %s: torn tail of %zu bytes repaired (kept "
                                    "in %s)",
                                    idem_log_path(svc->log), in->torn_bytes, in->torn_path);
                if (in->corrupt)
                        log_error("idempotency log %s is corrupt at line %zu (byte %zu: %s; %zu "
                                  "bad lines): the store is quarantined, lookups only",
                                  idem_log_path(svc->log), in->bad_line, in->bad_offset,
                                  in->bad_reason, in->bad_lines);
                log_info("idempotency store: %zu entries loaded from %s (%zu records, %zu "
                         "interrupted, %zu expired)",
                         in->entries, idem_log_path(svc->log), in->records, in->interrupted,
                         in->expired);
                size_t settled = 0, i;
                json_t *it;
                json_array_foreach(svc->settled, i, it) {
                        const char *outcome = json_string_value(json_object_get(it, "outcome"));
                        if (strcmp(outcome, "left_interrupted") != 0)
                                settled++;
                        log_notice("tool write %s (%s) interrupted by the crash: %s — %s",
                                   json_string_value(json_object_get(it, "path")),
                                   json_string_value(json_object_get(it, "key")),
                                   strcmp(outcome, "completed") == 0
                                           ? "completed from the file"
                                   : strcmp(outcome, "dropped") == 0
                                           ? "dropped, a retry writes it"
                                           : "left interrupted for review",
                                   json_string_value(json_object_get(it, "why")));
                }
                if (in->interrupted > settled)
                        log_warning("%zu idempotency key%s came back interrupted (their "
                                    "callers were running when kairosd stopped): review them "
                                    "with kairosctl idem get KEY",
                                    in->interrupted - settled,
                                    in->interrupted - settled == 1 ? "" : "s");
        }
        json_decref(svc->settled);
        svc->settled = NULL;
        roots_unref(svc->settle_roots);
        svc->settle_roots = NULL;
        void (*cb)(struct daemon *d) = svc->loaded_cb;
        svc->loaded_cb = NULL;
        if (cb)
                cb(svc->d);
        kick(svc);
}

int idem_service_start(struct daemon *d, void (*loaded)(struct daemon *d))
{
        struct idem_service *svc = calloc(1, sizeof(*svc));
        if (!svc)
                return -ENOMEM;
        svc->d = d;
        svc->loaded_cb = loaded;
        serialq_init(&svc->log_q, d->loop, &d->jobs);
        serialq_init(&svc->write_q, d->loop, &d->jobs);
#ifdef KAIROS_TEST_HOOKS
        /* walk below WriteRoots= as where the kernel has no openat2 */
        if (getenv("KAIROS_TEST_NO_OPENAT2"))
                svc->beneath_flags = BENEATH_NO_OPENAT2;
        /* die by SIGKILL inside every tool write: before its rename, or after
         * it and before the finish record */
        const char *crash = getenv("KAIROS_TEST_WRITE_CRASH");
        if (crash)
                svc->crash_at = strcmp(crash, "before_rename") == 0  ? 1
                                : strcmp(crash, "after_rename") == 0 ? 2
                                                                     : 0;
#endif
        struct idem_options opt = { .ttl_sec = (int64_t)d->cfg->idem_ttl_sec,
                                    .capacity = d->cfg->idem_max_entries,
                                    .now_ms = svc_now_ms,
                                    .clock_ctx = svc };
        int r;
        if (asprintf(&svc->dir, "%s/idem", d->cfg->state_directory) < 0) {
                svc->dir = NULL;
                r = -ENOMEM;
                goto fail;
        }
        if ((r = idem_store_new(&opt, &svc->store)) < 0)
                goto fail;
        if (!(svc->settle_roots = roots_new(d->cfg))) {
                r = -ENOMEM;
                goto fail;
        }
        d->idem = svc;
        if ((r = serialq_submit(&svc->log_q, load_work, load_done, svc)) < 0) {
                d->idem = NULL;
                goto fail;
        }
        return 0;
fail:
        roots_unref(svc->settle_roots);
        idem_store_free(svc->store);
        free(svc->dir);
        free(svc);
        return r;
}

void idem_service_reload(struct daemon *d, const struct config *cfg)
{
        if (!SVC(d))
                return;
        /* WriteRoots= are opened again at the next tool write */
        roots_unref(SVC(d)->roots);
        SVC(d)->roots = NULL;
        if (cfg->idem_ttl_sec != d->cfg->idem_ttl_sec ||
            cfg->idem_max_entries != d->cfg->idem_max_entries)
                log_warning("reload: [Idempotency] TTLSec= and MaxEntries= changes take effect "
                            "at the next restart");
}

void idem_service_free(struct daemon *d)
{
        struct idem_service *svc = SVC(d);
        if (!svc)
                return;
        while (svc->claims)
                claim_free(svc->claims);
        roots_unref(svc->roots);
        roots_unref(svc->settle_roots);
        json_decref(svc->settled);
        idem_log_close(svc->log);
        idem_store_free(svc->store);
        free(svc->dir);
        free(svc);
        d->idem = NULL;
}
