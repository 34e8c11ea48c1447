/* SPDX-License-Identifier: MIT */
/* The PostgreSQL driver of tool-call claims (toolclaims.h): a step's tool
 * call (tool-begin, tool-finish, tool-write) at an epoch is claimed and
 * finished in the cluster's database, fenced by (mandate, epoch); calls
 * from no step stay in the local store.  Built with -Dpostgres=enabled
 * only (docs/design.md §14). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "idem_write.h"
#include "log.h"
#include "pgstore.h"
#include "kairos/kmem.h"

/* One database call of a tool call, on a pool thread (a connection lent for
 * the job, cluster_thread_store); done runs on the loop. */
enum pg_op { PG_CLAIM, PG_FINISH, PG_RELEASE, PG_SETTLE };

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
        struct op_reply to;            /* PG_SETTLE */
        char *keys;                    /* PG_SETTLE: the keys settled, one a line */
        void (*done)(struct pg_job *j);
        void *ctx;
};

static void pg_job_free(struct pg_job *j)
{
        if (!j)
                return;
        pgstore_idem_claim_free(&j->claim);
        FREE_ALL(j->keys, j->result, j->node, j);
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
                                 s ? pgstore_error(s) : cluster_thread_error());
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

static void pg_work(uv_work_t *w)
{
        struct pg_job *j = w->data;
        struct pgstore *s;
        int r = 0;
        bool repeated = false;
        for (unsigned tries = 0;; tries++) {
                if (!(s = pg_reach(j)))
                        goto out;
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
                case PG_SETTLE:
                        r = pgstore_idem_settle_step(s, j->mandate, j->step, j->node, j->epoch,
                                                     j->result, j->result_len, j->ttl_ms,
                                                     &j->keys);
                        break;
                }
                /* the effect has happened: a finish whose outcome is unknown
                 * is made again (the next call on this thread reconnects);
                 * any call refused as read-only wrote nothing and is asked
                 * again of the primary a failover promoted */
                if (r != -ENOTCONN || tries == 8 ||
                    (j->op != PG_FINISH && !pgstore_refused_read_only(s)))
                        break;
                (void)pgstore_reset(s);
                repeated = repeated || j->op == PG_FINISH;
        }
        if (r == -ESTALE && repeated && pg_finished_before(s, j))
                r = 0;
        j->r = r;
        if (r < 0)
                cluster_thread_failed(s, r, j->err, sizeof j->err);
out:
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

/* pg_submit for a call, answered "cannot queue the WHAT" when it cannot be. */
static void pg_submit_call(struct pg_job *j, void (*done)(struct pg_job *j),
                           struct idem_call *call, const char *what)
{
        if (pg_submit(j, done, call) < 0) {
                pg_job_free(j);
                idem_core_error(call, "internal", "cannot queue the %s", what);
        }
}

/* A database call of a tool call failed: fenced (the mandate is another
 * node's now, or at another epoch: this node gives it up) or idem_core_unavailable. */
static void pg_reply_error(struct idem_call *call, struct pg_job *j, const char *what)
{
        if (j->r == -ESTALE || j->r == -ENOENT) {
                struct mandate *m = mandate_find(j->d, j->mandate);
                if (m && m->epoch == j->epoch)
                        cluster_drop(m, "a tool call of it was fenced");
                idem_core_error_detail(call, "fenced",
                                  json_pack("{s:s, s:s, s:I}", "key", j->key, "mandate",
                                            j->mandate, "epoch", (json_int_t)j->epoch),
                                  "%s: mandate %s is no longer this node's at epoch %lld (%s): %s",
                                  j->key, j->mandate, (long long)j->epoch, j->err, what);
                return;
        }
        idem_core_error_detail(call, "unavailable", json_pack("{s:s}", "key", j->key),
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
        idem_core_error_detail(call, "interrupted", json_pack("{s:s}", "key", key),
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
                        idem_core_existing(call, o, &v, j->fp);
                json_decref(pl);
                pg_job_free(j);
                return;
        }
        struct idem_claim *c = calloc(1, sizeof(*c));
        if (!c) {
                pg_release(j->d, j->key, j->mandate, j->epoch, true, "out of memory");
                idem_core_error(call, "internal", "out of memory");
                pg_job_free(j);
                return;
        }
        c->epoch = j->epoch;
        snprintf(c->key, sizeof c->key, "%s", j->key);
        snprintf(c->mandate, sizeof c->mandate, "%s", j->mandate);
        (void)idem_core_claim_adopt(svc, c, call);
        idem_core_ok(call, json_pack("{s:s, s:s, s:s, s:s, s:I}", "outcome", "proceed", "key", j->key,
                                "tool", j->tool, "fingerprint", j->fp, "epoch",
                                (json_int_t)j->epoch));
        pg_job_free(j);
}

static void pg_begin(struct idem_call *call, const char *key, const char *tool, const char *fp,
                     const struct idem_step_owner *step, int64_t epoch)
{
        struct pg_job *j = pg_job_new(call->d, PG_CLAIM, key, step->mandate, epoch);
        if (!j) {
                idem_core_error(call, "internal", "out of memory");
                return;
        }
        snprintf(j->tool, sizeof j->tool, "%s", tool);
        snprintf(j->fp, sizeof j->fp, "%s", fp);
        snprintf(j->step, sizeof j->step, "%s", step->step);
        j->attempt = step->attempt;
        pg_submit_call(j, pg_begin_done, call, "claim");
}

static void pg_finish_done(struct pg_job *j)
{
        struct idem_call *call = j->ctx;
        if (j->r < 0)
                pg_reply_error(call, j, "the result is not recorded");
        else
                idem_core_ok(call, json_pack("{s:s, s:s, s:b}", "key", j->key, "outcome",
                                        j->failed ? "failed" : "completed", "durable", 1));
        pg_job_free(j);
}

/* tool-finish of a call claimed in the database: the result there, fenced;
 * a failed call keeps error_class and error_msg in its payload. */
static void pg_finish(struct idem_call *call, struct idem_claim *c, json_int_t exit_status,
                      const char *out, const char *err, const char *eclass, const char *emsg)
{
        if (eclass && !pg_class_ok(eclass)) {
                idem_core_error(call, "bad_argument", "args.error_class: 1..64 of [A-Za-z0-9_.-]");
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
                idem_core_error(call, "internal", "out of memory");
                return;
        }
        j->failed = eclass != NULL;
        j->result = text;
        j->result_len = strlen(text);
        idem_core_claim_free(c);
        pg_submit_call(j, pg_finish_done, call, "finish");
}

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
                idem_core_error_detail(op->call, op->code,
                                  json_pack("{s:s, s:b}", "key", op->key, "cached", 0), "%s",
                                  op->msg);
        else
                idem_write_reply(op, false);
        idem_write_op_free(op);
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
                idem_core_error(op->call, "internal", "out of memory: the outcome of the write of %s "
                           "is not recorded", op->path);
                idem_write_op_free(op);
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
                idem_write_op_free(op);
                pg_job_free(j);
                return;
        }
        if (j->claim.outcome == PGSTORE_IDEM_CLAIMED) {
                op->epoch = j->epoch;
                snprintf(op->mandate, sizeof op->mandate, "%s", j->mandate);
                pg_job_free(j);
                if (serialq_submit(&op->svc->write_q, idem_write_work, idem_write_done, op) < 0) {
                        idem_write_refuse(op, "write_failed", "out of memory");
                        idem_write_done(op);
                }
                return;
        }
        struct idem_view v;
        json_t *pl;
        enum idem_outcome o = pg_view(j, &v, &pl);
        if (o == IDEM_INTERRUPTED) {
                pg_reply_interrupted(op->call, j->key);
                idem_write_op_free(op);
        } else {
                idem_write_existing(op, o, &v);
        }
        json_decref(pl);
        pg_job_free(j);
}

static void pg_write_begin(struct write_op *op, const struct idem_step_owner *step, int64_t epoch)
{
        struct pg_job *j = pg_job_new(op->call->d, PG_CLAIM, op->key, step->mandate, epoch);
        if (!j) {
                idem_core_error(op->call, "internal", "out of memory");
                idem_write_op_free(op);
                return;
        }
        snprintf(j->tool, sizeof j->tool, "%s", WRITE_TOOL);
        snprintf(j->fp, sizeof j->fp, "%s", op->fp);
        snprintf(j->step, sizeof j->step, "%s", step->step);
        j->attempt = step->attempt;
        if (pg_submit(j, pg_write_claimed, op) < 0) {
                pg_job_free(j);
                idem_core_error(op->call, "internal", "cannot queue the claim");
                idem_write_op_free(op);
        }
}

/* ---- the driver ---- */

static bool pg_closed(struct idem_claim *c, const char *why)
{
        if (c->epoch <= 0)
                return false;
        pg_release(c->svc->d, c->key, c->mandate, c->epoch, false, why);
        idem_core_claim_free(c);
        return true;
}

static bool pg_begin_hook(struct idem_call *call, const char *key, const char *tool,
                          const char *fp, const struct idem_step_owner *step, int64_t epoch)
{
        json_t *chk = json_object_get(call->args, "check");
        if (chk && !json_is_null(chk)) {
                /* the database keeps no check: refused rather than kept
                 * without one (docs/design.md §14) */
                idem_core_error(call, "unsupported",
                                "args.check: kairosctl tool run --check is not supported in "
                                "cluster mode (the claim is in the cluster's database, which "
                                "keeps no check); run without --check, use the schedule's "
                                "Probe=");
                return true;
        }
        pg_begin(call, key, tool, fp, step, epoch);
        return true;
}

static bool pg_finish_hook(struct idem_call *call, struct idem_claim *c, json_int_t exit_status,
                           const char *out, const char *err, const char *eclass,
                           const char *emsg)
{
        if (c->epoch <= 0)
                return false;
        pg_finish(call, c, exit_status, out, err, eclass, emsg);
        return true;
}

static bool pg_write_begin_hook(struct write_op *op, const struct idem_step_owner *step,
                                int64_t epoch)
{
        pg_write_begin(op, step, epoch);
        return true;
}

static bool pg_write_done_hook(struct write_op *op)
{
        if (op->epoch <= 0)
                return false;
        pg_write_done(op);
        return true;
}

/* resolve --retry|--done of a step: its interrupted calls in the
 * database are dropped or completed there, in one statement fenced by the
 * mandate's owner and epoch (this node holds it: resolve took it). */
static void pg_settled(struct pg_job *j)
{
        if (j->r == -ESTALE)
                op_reply_error(&j->to, "fenced",
                               "mandate %s is no longer this node's at epoch %lld: the tool "
                               "calls of step %s were not settled; nothing was resolved",
                               j->mandate, (long long)j->epoch, j->step);
        else if (j->r < 0)
                op_reply_error(&j->to, "unavailable",
                               "the tool calls of step %s are in the cluster's database: %s; "
                               "nothing was resolved",
                               j->step, j->err);
        else {
                json_t *keys = json_array();
                for (char *k = j->keys, *nl; keys && k && *k; k = nl ? nl + 1 : NULL) {
                        nl = strchr(k, '\n');
                        json_array_append_new(keys, json_stringn(k, nl ? (size_t)(nl - k)
                                                                        : strlen(k)));
                }
                if (keys)
                        op_reply_ok(&j->to, json_pack("{s:o}", "keys", keys));
                else
                        op_reply_error(&j->to, "internal", "out of memory");
        }
        pg_job_free(j);
}

static bool pg_settle_step_hook(struct daemon *d, const char *mandate_id, const char *step_id,
                                bool complete, uid_t uid, const char *reason,
                                const char *how, struct op_reply to)
{
        struct mandate *m = mandate_find(d, mandate_id);
        struct pg_job *j = pg_job_new(d, PG_SETTLE, "", mandate_id, m ? m->epoch : 0);
        if (!j || (complete && !(j->result = idem_core_done_payload(NULL, uid, reason, how)))) {
                pg_job_free(j);
                op_reply_error(&to, "internal", "out of memory");
                return true;
        }
        j->result_len = j->result ? strlen(j->result) : 0;
        snprintf(j->step, sizeof j->step, "%s", step_id);
        j->to = to;
        if (pg_submit(j, pg_settled, NULL) < 0) {
                op_reply_error(&j->to, "internal", "out of memory");
                pg_job_free(j);
        }
        return true;
}

const struct toolclaims toolclaims_postgres = {
        .name = "postgres",
        .dropped = cluster_dropped,
        .begin = pg_begin_hook,
        .finish = pg_finish_hook,
        .closed = pg_closed,
        .write_begin = pg_write_begin_hook,
        .write_done = pg_write_done_hook,
        .settle_step = pg_settle_step_hook,
};
