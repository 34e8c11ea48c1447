/* SPDX-License-Identifier: MIT */
/* Control commands.  Anything that touches a WAL runs as a job on the
 * mandate's serial queue; the reply is sent only after the records it wrote
 * are durable. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chronos.h"
#include "commands.h"
#include "control.h"
#include "executor.h"
#include "idem_service.h"
#include "kairos/canon.h"
#include "kairos/carry.h"
#include "kairos/dlist.h"
#include "kairos/fold.h"
#include "kairos/kbuf.h"
#include "kairos/kio.h"
#include "kairos/kjson.h"
#include "kairos/kmem.h"
#include "kairos/planner.h"
#include "kairos/showdoc.h"
#include <time.h>
#include "kairos/wal.h"
#include "log.h"
#include "metrics.h"
#include "opreads.h"

/* ---- status / list ---- */

/* a mandate no node here holds (opreads.h, below) */
static void remote_show(struct control_request *req, const char *id);
static void remote_take(struct control_request *req, const char *id);
/* What a retry needs of the mandate named. */
struct retry_target {
        const char *id, *schedule, *fired_at; /* NULL: unknown */
        const char *status;                   /* its status's name */
        bool ended, done;
        bool remote;      /* no node's here (opreads.h) */
        int db_last;      /* the tick's highest retry number on other nodes (opreads.h) */
};
static void retry_target(struct control_request *req, const struct retry_target *t,
                         const struct carry *carried);
static struct retry_target retry_target_of(const struct mandate *m);
/* wait requests waiting (below) */
static unsigned waiters_count(void);

/* The result of an operation (result.h) as the reply to req. */
static void reply_result(void *ctx, const struct op_result *r)
{
        struct control_request *req = ctx;
        if (!r->code)
                control_reply_ok(req, r->result);
        else
                control_reply_error_detail(req, r->code, r->detail, "%s", r->message);
}

/* ret_after: the cursor's id (it may be a mandate of another node: f->after
 * then NULL). */
static int parse_filter(struct control_request *req, struct history_filter *f, size_t *limit,
                        const char **ret_after)
{
        bool failed;
        const char *status = control_arg_string(req, "status", false, &failed);
        if (failed)
                return -EINVAL;
        f->status = -1;
        if (status && (f->status = mandate_status_parse(status)) < 0) {
                char all[512] = "";
                size_t off = 0;
                for (int i = 0; i < MANDATE__STATUS_MAX && off < sizeof all; i++)
                        off += (size_t)snprintf(all + off, sizeof all - off, "%s%s",
                                                i ? ", " : "", mandate_status_name(i));
                control_reply_error(req, "bad_argument",
                                    "args.status: no status '%s' (one of: %s)", status, all);
                return -EINVAL;
        }
        f->schedule = control_arg_string(req, "schedule", false, &failed);
        if (failed)
                return -EINVAL;
        f->since = control_arg_string(req, "since", false, &failed);
        if (failed)
                return -EINVAL;
        if (f->since && planner_parse_fired_at(f->since, NULL) < 0) {
                control_reply_error(req, "bad_argument",
                                    "args.since: not a time YYYY-MM-DDTHH:MM:SSZ: %s", f->since);
                return -EINVAL;
        }
        const char *after = control_arg_string(req, "after", false, &failed);
        if (failed)
                return -EINVAL;
        *ret_after = after;
        if (after && !(f->after = mandate_find(req->d, after)) && !req->d->opreads->others) {
                control_reply_error(req, "not_found", "args.after: no mandate %s (pruned?)",
                                    after);
                return -EINVAL;
        }
        json_t *lv = json_object_get(req->args, "limit");
        *limit = 0;
        if (lv && (!json_is_integer(lv) || json_integer_value(lv) < 0 ||
                   json_integer_value(lv) > HISTORY_LIST_MAX)) {
                control_reply_error(req, "bad_argument", "args.limit: must be an integer 0..%d",
                                    HISTORY_LIST_MAX);
                return -EINVAL;
        }
        if (lv)
                *limit = (size_t)json_integer_value(lv);
        return 0;
}

static void cmd_list(struct control_request *req)
{
        struct history_filter f = { 0 };
        size_t limit;
        const char *after;
        if (parse_filter(req, &f, &limit, &after) < 0)
                return;
        /* the rows of other nodes too (opreads.h) */
        if (req->d->opreads->list(req->d, &(struct opreads_list){ &f, limit, after },
                                  (struct op_reply){ reply_result, req }))
                return;
        if (f.schedule && history_schedule_unknown(req->d, f.schedule)) {
                control_reply_error(req, "not_found", HISTORY_NO_SCHEDULE_FMT, f.schedule);
                return;
        }
        json_t *res = NULL;
        if (history_list(req->d, &f, limit, &res) < 0) {
                control_reply_error(req, "internal", "out of memory");
                return;
        }
        control_reply_ok(req, res);
}

static void cmd_status(struct control_request *req)
{
        struct daemon *d = req->d;
        unsigned counts[MANDATE__STATUS_MAX];
        mandates_count(d, counts);
        json_t *by = json_object();
        for (int s = 0; s < MANDATE__STATUS_MAX; s++)
                json_object_set_new(by, mandate_status_name(s), json_integer(counts[s]));
        const struct recovery_summary *r = &d->recovery;
        json_t *rec = json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:I, s:s+}",
                                "files", r->files, "resumed", r->resumed, "paused_review",
                                r->paused_review, "quarantined", r->quarantined, "io_errors",
                                r->io_errors, "torn_repaired", r->torn_repaired, "already_done",
                                r->already_done, "safe_to_retry", r->safe_to_retry,
                                "manual_review", r->manual_review, "duration_ms",
                                (json_int_t)r->duration_ms, "summary", "", "");
        char summary[200];
        snprintf(summary, sizeof summary, "%u resumed, %u paused for review, %u quarantined",
                 r->resumed, r->paused_review, r->quarantined);
        json_object_set_new(rec, "summary", json_string(summary));
        size_t nsched = 0;
        for (size_t i = 0; i < d->cfg->nschedules; i++)
                nsched += !d->cfg->schedules[i].retained;
        json_t *broken = json_array();
        for (size_t i = 0; i < d->cfg->nbroken; i++)
                json_array_append_new(broken, json_string(d->cfg->broken[i].name));
        json_t *sched = json_pack("{s:I, s:I, s:o}", "total",
                                  (json_int_t)(nsched + d->cfg->nbroken), "broken",
                                  (json_int_t)d->cfg->nbroken, "broken_names", broken);
        json_t *res = json_pack("{s:s, s:i, s:I, s:b, s:b, s:s, s:s?, s:i, s:o, s:o, s:I, s:o}",
                                "version", KAIROS_VERSION, "pid", (int)getpid(), "uptime_sec",
                                (json_int_t)((now_ms_monotonic() - d->started_ms) / 1000),
                                "ready", d->ready, "stopping", d->stopping, "state_directory",
                                d->cfg->state_directory, "config", d->config_path, "mandates",
                                (int)strmap_size(d->mandates), "by_status", by, "recovery", rec,
                                "fdatasync_calls", (json_int_t)d->flushes_total, "schedules",
                                sched);
        json_t *cl = d->opreads->status(d);
        if (res && cl)
                json_object_set_new(res, "cluster", cl);
        if (res)
                json_object_set_new(res, "wait_requests", json_integer(waiters_count()));
        control_reply_ok(req, res);
}

static json_t *mandate_json(const struct mandate *m)
{
        json_t *o = history_mandate_json(m);
        if (o && m->retry_of) {
                json_object_set_new(o, "retry_of", json_string(m->retry_of));
                json_object_set_new(o, "retry", json_integer(m->retry));
        }
        return o;
}

/* The retries of m (mandates whose retry_of is m), for show: sorted by
 * retry number. */
static json_t *retried_by_json(struct daemon *d, const struct mandate *m)
{
        struct showdoc_rows rows;
        if (history_rows(d, &rows) < 0)
                return json_array();
        return showdoc_retried_by(&rows, m->id);
}

/* ---- jobs on a mandate's queue ---- */

enum op_kind { OP_SHOW, OP_PAUSE, OP_RESUME, OP_RESOLVE, OP_APPROVE };
enum resolve_mode { RESOLVE_DONE, RESOLVE_RETRY, RESOLVE_ABANDON };

struct mandate_op {
        struct control_request *req;
        struct mandate *m;
        enum op_kind kind;
        enum resolve_mode mode;
        char *reason;
        char *step;
        uid_t uid;
        /* results (filled on the pool thread) */
        const char *err_code;
        char err_msg[512];
        json_t *result;
        uint64_t flushes_before, flushes_after;
        bool wal_failed;
        /* resolve --retry|--done: the step's interrupted tool calls are
         * settled (idem_service_settle_step) between the check and the
         * resolution's records, which name them (keys) */
        bool settle;
        json_t *keys;
};

static json_t *str_or_null(const char *s)
{
        return s ? json_string(s) : json_null();
}

/* Reply with result (stolen), its placeholders replaced by their values'
 * text (showdoc_print). */
static void reply_ok_raw(struct control_request *req, json_t *result)
{
        struct kbuf b = KBUF_INIT;
        int r = showdoc_print(result, &b);
        json_decref(result);
        if (r < 0)
                control_reply_error(req, "internal", "cannot print the reply: %s",
                                    strerror(-r));
        else
                control_reply_ok_text(req, b.data, b.len);
        kbuf_free(&b);
}

static void op_fail(struct mandate_op *op, const char *code, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
static void op_fail(struct mandate_op *op, const char *code, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(op->err_msg, sizeof op->err_msg, fmt, ap);
        va_end(ap);
        op->err_code = code;
}

static void op_wal_error(struct mandate_op *op, int r)
{
        if (r == -EBADMSG) {
                op_fail(op, "quarantined", "the WAL of %s is corrupt and quarantined",
                        op->m->id);
                return;
        }
        op->wal_failed = true;
        op_fail(op, "wal_io_error", "writing the WAL of %s failed: %s", op->m->id,
                strerror(-r));
}

/* The keys, sep between them (a key holds no control character); NULL when
 * out of memory. */
static char *join_keys(json_t *keys, const char *sep)
{
        struct kbuf b = KBUF_INIT;
        size_t i;
        json_t *k;
        json_array_foreach(keys, i, k)
                if (kbuf_printf(&b, "%s%s", i ? sep : "", json_string_value(k)) < 0) {
                        kbuf_free(&b);
                        return NULL;
                }
        return b.data;
}

static void do_resolve(struct mandate_op *op, struct mandate *m)
{
        struct fold *f = NULL;
        int r = fold_file(m->wal_path, &f);
        if (r < 0) {
                op_fail(op, "wal_io_error", "cannot read %s: %s", m->wal_path, strerror(-r));
                return;
        }
        const struct fold_step *s = fold_find_step(f, op->step);
        if (!s) {
                op_fail(op, "not_found", "mandate %s has no step %s", m->id, op->step);
                goto out;
        }
        if (s->state != STEP_NEEDS_REVIEW) {
                op_fail(op, "conflict", "step %s is %s, not needs_review: nothing to resolve",
                        op->step, s->status ? s->status : "pending");
                goto out;
        }
        static const char *const actions[] = { "resolve_done", "resolve_retry",
                                               "resolve_abandon" };
        /* first its tool calls (the loop, then here again): released or
         * completed durably before the resolution is written */
        if (op->mode != RESOLVE_ABANDON && !op->keys) {
                op->settle = true;
                goto out;
        }
        char *keys = NULL;
        size_t nkeys = json_array_size(op->keys);
        if (nkeys && !(keys = join_keys(op->keys, "\n"))) {
                op_fail(op, "internal", "out of memory");
                goto out;
        }
        if ((r = mandate_wal_open(m)) < 0 ||
            (r = wal_operator(m->wal, m->id, actions[op->mode], op->step, (long long)op->uid,
                              op->reason)) < 0 ||
            (nkeys && (r = wal_operator(m->wal, m->id,
                                        op->mode == RESOLVE_DONE ? "tool_calls_completed"
                                                                 : "tool_calls_released",
                                        op->step, (long long)op->uid, keys)) < 0)) {
                free(keys);
                goto wal_err;
        }
        free(keys);
        op->flushes_before = wal_flush_count(m->wal);
        switch (op->mode) {
        case RESOLVE_DONE: {
                char null_hash[CANON_HASH_STRLEN];
                canon_hash_json("null", 4, null_hash, NULL);
                char ev[160];
                snprintf(ev, sizeof ev, "{\"reason\":\"operator_resolved_done\",\"uid\":%lld}",
                         (long long)op->uid);
                r = wal_mark_completed(m->wal, op->step, s->expected_post_hash ? s->expected_post_hash : "",
                                       null_hash, false, ev, NULL);
                break;
        }
        case RESOLVE_RETRY:
                r = wal_mark_reset(m->wal, op->step);
                break;
        case RESOLVE_ABANDON:
                r = wal_finalize_plan(m->wal, s->plan_id ? s->plan_id : "", PLAN_ABANDONED,
                                      op->reason);
                break;
        }
        if (r == 0)
                r = wal_flush(m->wal);
        if (r < 0)
                goto wal_err;
        op->result = json_pack("{s:s, s:s, s:s}", "mandate", m->id, "step", op->step, "action",
                               actions[op->mode]);
        if (op->mode != RESOLVE_ABANDON)
                json_object_set(op->result,
                                op->mode == RESOLVE_DONE ? "tool_calls_completed"
                                                         : "tool_calls_released",
                                op->keys);
        goto out;
wal_err:
        op_wal_error(op, r);
out:
        fold_free(f);
}

static void op_work(void *arg)
{
        struct mandate_op *op = arg;
        struct mandate *m = op->m;
        int r = 0;
        bool had_wal = m->wal != NULL;
        op->flushes_before = m->wal ? wal_flush_count(m->wal) : 0;
        switch (op->kind) {
        case OP_SHOW: {
                struct fold *f = NULL;
                if (m->archived)
                        r = showdoc_fold_file(m->wal_path, true, &f);
                else
                        r = fold_file(m->wal_path, &f);
                if (r < 0) {
                        op_fail(op, r == -ENOENT ? "not_found" : "wal_io_error",
                                "cannot read %s: %s", m->wal_path, strerror(-r));
                        return;
                }
                op->result = showdoc_fold_json(f);
                fold_free(f);
                return;
        }
        case OP_PAUSE:
        case OP_RESUME:
        case OP_APPROVE:
                if ((r = mandate_wal_open(m)) < 0 ||
                    (r = wal_operator(m->wal, m->id,
                                      op->kind == OP_PAUSE    ? "pause"
                                      : op->kind == OP_RESUME ? "resume"
                                                              : "approve",
                                      op->step, (long long)op->uid, op->reason)) < 0 ||
                    (r = wal_flush(m->wal)) < 0) {
                        op_wal_error(op, r);
                        break;
                }
                op->result = json_pack("{s:s}", "mandate", m->id);
                break;
        case OP_RESOLVE:
                do_resolve(op, m);
                break;
        }
        if (m->wal) {
                op->flushes_after = wal_flush_count(m->wal);
                /* A descriptor opened for this command is not kept. */
                if (!had_wal) {
                        wal_close(m->wal);
                        m->wal = NULL;
                }
        }
}

static void resolve_settled(void *ctx, const struct op_result *r);

static void op_free(struct mandate_op *op)
{
        if (!op)
                return;
        json_decref(op->result);
        json_decref(op->keys);
        FREE_ALL(op->reason, op->step, op);
}

static bool ids_have(json_t *ids, json_t *id)
{
        size_t i;
        json_t *o;
        json_array_foreach(ids, i, o)
                if (json_equal(o, id))
                        return true;
        return false;
}

/* show of a mandate held here: its retries made beyond this node too
 * (opreads.h): their list when it has every one of its history (in retry
 * order), else those of its history and then the others. */
static void show_retried_by(void *ctx, json_t *ids)
{
        struct mandate_op *op = ctx;
        json_t *mine = json_object_get(op->result, "retried_by");
        size_t i;
        json_t *id;
        bool all = ids != NULL;
        json_array_foreach(mine, i, id)
                all = all && ids_have(ids, id);
        if (all) {
                json_object_set_new(op->result, "retried_by", json_deep_copy(ids));
        } else if (mine) {
                json_array_foreach(ids, i, id)
                        if (!ids_have(mine, id))
                                json_array_append(mine, id);
        }
        reply_ok_raw(op->req, op->result);
        op->result = NULL;
        op_free(op);
}

static void op_done(void *arg)
{
        struct mandate_op *op = arg;
        struct mandate *m = op->m;
        struct daemon *d = m->d;
        uint64_t delta = op->flushes_after > op->flushes_before
                                 ? op->flushes_after - op->flushes_before
                                 : 0;
        m->flushes += delta;
        d->flushes_total += delta;
        if (op->settle && !op->err_code) {
                op->settle = false;
                idem_service_settle_step(d, m->id, op->step, op->mode == RESOLVE_DONE, op->uid,
                                         op->reason, NULL,
                                         (struct op_reply){ .done = resolve_settled, .ctx = op });
                return;
        }
        m->busy--;
        if (op->wal_failed) {
                mandate_set_status(m, MANDATE_WAL_IO_ERROR, "wal_io_error");
                log_event(LOG_ERR, MSGID_WAL_IO_ERROR, LOG_FIELDS({ "MANDATE_ID", m->id }),
                          "%s; mandate paused (wal_io_error)", op->err_msg);
        }
        if (op->err_code) {
                control_reply_error(op->req, op->err_code, "%s", op->err_msg);
                goto out;
        }
        char uid[32];
        snprintf(uid, sizeof uid, "%u", (unsigned)op->uid);
        switch (op->kind) {
        case OP_SHOW: {
                /* each step's tool calls, from the idempotency store */
                json_t *calls = idem_service_calls_json(d, m->id);
                showdoc_set_tool_calls(op->result, calls);
                json_decref(calls);
                json_t *mj = mandate_json(m);
                json_object_set_new(mj, "retried_by", retried_by_json(d, m));
                json_object_set_new(mj, "fired_at", str_or_null(m->fired_at));
                d->opreads->owner(d, m, mj);
                json_object_update_missing(op->result, mj);
                json_decref(mj);
                break;
        }
        case OP_PAUSE:
                mandate_set_status(m, MANDATE_PAUSED, op->reason ? op->reason : "operator");
                log_event(LOG_NOTICE, MSGID_OPERATOR,
                          LOG_FIELDS({ "MANDATE_ID", m->id }, { "OPERATOR_UID", uid }),
                          "mandate %s paused by uid %s: %s", m->id, uid,
                          op->reason ? op->reason : "");
                break;
        case OP_RESUME:
                executor_enqueue(m);
                log_event(LOG_NOTICE, MSGID_OPERATOR,
                          LOG_FIELDS({ "MANDATE_ID", m->id }, { "OPERATOR_UID", uid }),
                          "mandate %s resumed by uid %s", m->id, uid);
                break;
        case OP_APPROVE:
                executor_enqueue(m);
                log_event(LOG_NOTICE, MSGID_OPERATOR,
                          LOG_FIELDS({ "MANDATE_ID", m->id }, { "STEP_ID", op->step },
                                     { "OPERATOR_UID", uid }),
                          "mandate %s approved by uid %s", m->id, uid);
                break;
        case OP_RESOLVE: {
                static const char *const modes[] = { "done", "retry", "abandon" };
                char *keys_text = json_array_size(op->keys) ? join_keys(op->keys, ", ") : NULL;
                /* The executor decides from the WAL what comes next (for an
                 * abandoned plan: the end of the mandate). */
                executor_enqueue(m);
                log_event(LOG_NOTICE, MSGID_OPERATOR,
                          LOG_FIELDS({ "MANDATE_ID", m->id }, { "STEP_ID", op->step },
                                     { "OPERATOR_UID", uid }),
                          "step %s of %s resolved --%s by uid %s: %s%s%s", op->step, m->id,
                          modes[op->mode], uid, op->reason,
                          op->mode == RESOLVE_ABANDON ? ""
                          : op->mode == RESOLVE_DONE  ? "; tool calls completed: "
                                                      : "; tool calls released: ",
                          op->mode == RESOLVE_ABANDON ? ""
                          : json_array_size(op->keys) ? (keys_text ? keys_text : "?")
                                                      : "none");
                free(keys_text);
                break;
        }
        }
        /* An abandoned plan ends the mandate: that is the state it goes to
         * (the executor archives it next), not the "runnable" of its way there. */
        bool abandoned = op->kind == OP_RESOLVE && op->mode == RESOLVE_ABANDON;
        json_object_set_new(op->result, "status",
                            json_string(abandoned ? mandate_status_name(MANDATE_ABANDONED)
                                                  : mandate_status_name(m->status)));
        if (op->kind == OP_SHOW && d->opreads->retried_by(d, m, show_retried_by, op) == 0) {
                op = NULL; /* answered with its retries beyond this node (show_retried_by) */
        } else {
                if (op->kind == OP_SHOW)
                        reply_ok_raw(op->req, op->result);
                else
                        control_reply_ok(op->req, op->result);
                op->result = NULL;
        }
        daemon_update_status(d);
        executor_kick(d);
out:
        op_free(op);
}

/* The step's tool calls are settled (r->result: {keys}): now the
 * resolution. */
static void resolve_settled(void *ctx, const struct op_result *r)
{
        struct mandate_op *op = ctx;
        struct mandate *m = op->m;
#ifdef KAIROS_TEST_HOOKS
        /* kairosd dies between the settled calls and the resolution */
        if (!r->code && getenv("KAIROS_TEST_RESOLVE_CRASH"))
                raise(SIGKILL);
#endif
        if (!r->code) {
                op->keys = json_incref(json_object_get(r->result, "keys"));
                json_decref(r->result);
                if (op->keys && serialq_submit(&m->q, op_work, op_done, op) == 0)
                        return;
        }
        m->busy--;
        if (r->code)
                control_reply_error_detail(op->req, r->code, r->detail, "%s", r->message);
        else
                control_reply_error(op->req, "internal", "out of memory");
        json_decref(op->keys);
        FREE_ALL(op->reason, op->step, op);
        daemon_update_status(m->d);
        executor_kick(m->d);
}

/* ret_remote (may be NULL): where other nodes hold mandates (opreads.h), a
 * mandate this node does not hold (unknown here, or released or lost) is
 * not an error: *ret_remote is its id and nothing is replied (once per
 * request: not after it was taken for the request). */
static struct mandate *arg_mandate_at(struct control_request *req, const char **ret_remote)
{
        bool failed;
        const char *id = control_arg_string(req, "mandate", true, &failed);
        if (ret_remote)
                *ret_remote = NULL;
        if (failed)
                return NULL;
        /* an id or a unique prefix of one */
        struct mandate *m;
        const struct mandate *cand[11];
        int r = history_resolve(req->d, id, &m, cand, sizeof cand / sizeof cand[0]);
        bool remote_ok = ret_remote && req->d->opreads->others && !req->taken_remote;
        if (remote_ok && r == 0 && !req->d->opreads->holds(m)) {
                *ret_remote = m->id;   /* (valid until the loop runs on) */
                return NULL;
        }
        if (remote_ok && r == -ENOENT) {
                *ret_remote = id;
                return NULL;
        }
        if (r == -EEXIST) {
                json_t *list = json_array();
                struct kbuf b = KBUF_INIT;
                for (size_t i = 0; cand[i]; i++) {
                        json_array_append_new(list, json_string(cand[i]->id));
                        kbuf_printf(&b, "\n  %s", cand[i]->id);
                }
                control_reply_error_detail(req, "ambiguous", json_pack("{s:o}", "candidates", list),
                                           "mandate prefix '%s' is ambiguous; candidates:%s%s", id,
                                           b.data ? b.data : "",
                                           json_array_size(list) >= 10 ? "\n  ..." : "");
                kbuf_free(&b);
        } else if (r < 0) {
                control_reply_error(req, "not_found", "no mandate %s", id);
        }
        return m;
}

/* A string argument that is absent (when not required) or not empty:
 * false after replying bad_argument. */
static bool arg_text(struct control_request *req, const char *name, bool required,
                     const char **ret)
{
        bool failed;
        *ret = control_arg_string(req, name, required, &failed);
        if (!failed && *ret && !**ret) {
                control_reply_error(req, "bad_argument", "args.%s: must not be empty", name);
                failed = true;
        }
        return !failed;
}

static void submit_op(struct control_request *req, struct mandate *m, enum op_kind kind,
                      enum resolve_mode mode, const char *reason, const char *step)
{
        struct mandate_op *op = calloc(1, sizeof(*op));
        if (!op || (reason && !(op->reason = strdup(reason))) ||
            (step && !(op->step = strdup(step)))) {
                op_free(op);
                control_reply_error(req, "internal", "out of memory");
                return;
        }
        op->req = req;
        op->m = m;
        op->kind = kind;
        op->mode = mode;
        op->uid = req->uid;
        m->busy++;
        if (serialq_submit(&m->q, op_work, op_done, op) < 0) {
                m->busy--;
                op_free(op);
                control_reply_error(req, "internal", "out of memory");
        }
}

/* ---- a mandate no node here holds (opreads.h) ---- */

static void remote_shown(void *ctx, const struct op_result *r, json_t *calls)
{
        struct control_request *req = ctx;
        if (r->code) {
                reply_result(req, r);
                return;
        }
        showdoc_set_tool_calls(r->result, calls);
        reply_ok_raw(req, r->result);
}

static void remote_show(struct control_request *req, const char *id)
{
        if (req->d->opreads->show(req->d, id, showdoc_fold_json, remote_shown, req) < 0)
                control_reply_error(req, "internal", "out of memory");
}

/* resolve, approve, resume, cancel of a mandate this node does not hold:
 * taken, then the command runs again, now on a mandate of this node. */
static void taken(void *ctx, int err, const char *detail)
{
        struct control_request *req = ctx;
        const char *id = json_string_value(json_object_get(req->args, "mandate"));
        if (err == -EBUSY) {
                /* "NODE" or "NODE UNTIL" (opreads.h) */
                char node[64];
                const char *sp = detail ? strchr(detail, ' ') : NULL;
                snprintf(node, sizeof node, "%.*s", sp ? (int)(sp - detail) : 63,
                         detail && *detail ? detail : "?");
                const char *until = sp && strlen(sp + 1) >= 19 ? sp + 1 : NULL;
                if (until)
                        control_reply_error_detail(
                                req, "busy",
                                json_pack("{s:s, s:s}", "node", node, "until", until),
                                "mandate %s is held by node %s until %.8s (its lease, if %s "
                                "does not renew it), then any node may take it: run the "
                                "command there or wait",
                                id, node, until + 11, node);
                else
                        control_reply_error_detail(req, "busy",
                                                   json_pack("{s:s}", "node", node),
                                                   "mandate %s is held by node %s: run the "
                                                   "command there or wait",
                                                   id, node);
        } else if (err == -EALREADY)
                control_reply_error(req, "conflict", "mandate %s has ended (%s)", id, detail);
        else if (err == -ENOENT)
                control_reply_error(req, "not_found", "no mandate %s", id);
        else if (err == -ESHUTDOWN)
                control_reply_error(req, "shutting_down", "kairosd is shutting down");
        else if (err)
                control_reply_error(req, "cluster_unavailable", "cannot take mandate %s: %s", id,
                                    detail && *detail ? detail : strerror(-err));
        else {
                req->taken_remote = true;
                commands_dispatch(req);
        }
}

static void remote_take(struct control_request *req, const char *id)
{
        if (req->d->opreads->take(req->d, id, taken, req) < 0)
                control_reply_error(req, "internal", "out of memory");
}

static bool refuse_if_stopping(struct control_request *req)
{
        if (!req->d->stopping)
                return false;
        control_reply_error(req, "shutting_down", "kairosd is shutting down");
        return true;
}

static bool refuse_unwritable(struct control_request *req, struct mandate *m)
{
        if (m->status == MANDATE_QUARANTINED) {
                control_reply_error(req, "quarantined",
                                    "mandate %s is quarantined (its WAL is corrupt); inspect it "
                                    "with kairosctl wal verify %s",
                                    m->id, m->wal_path);
                return true;
        }
        if (m->status == MANDATE_WAL_IO_ERROR) {
                control_reply_error(req, "wal_io_error",
                                    "mandate %s had a WAL I/O error; it is retried after a restart",
                                    m->id);
                return true;
        }
        return false;
}

static void cmd_show(struct control_request *req)
{
        const char *remote;
        struct mandate *m = arg_mandate_at(req, &remote);
        if (m)
                submit_op(req, m, OP_SHOW, 0, NULL, NULL);
        else if (remote)
                remote_show(req, remote);
}

/* pause/resume --schedule NAME */
static bool schedule_pause(struct control_request *req, bool pause)
{
        bool failed;
        if (!json_object_get(req->args, "schedule"))
                return false;
        const char *name = control_arg_string(req, "schedule", true, &failed);
        if (failed)
                return true;
        const char *reason = NULL;
        if (pause) {
                reason = control_arg_string(req, "reason", false, &failed);
                if (failed)
                        return true;
        }
        int r = chronos_set_paused(req->d, name, pause, reason);
        if (r == -ENOENT)
                control_reply_error(req, "not_found", "no schedule named '%s'", name);
        else if (r == 1)
                control_reply_error(req, "conflict", "schedule %s is already %s", name,
                                    pause ? "paused" : "running");
        else
                control_reply_ok(req, json_pack("{s:s, s:b}", "schedule", name, "paused", pause));
        return true;
}

/* The mandate a pause or cancel changes, with its reason (arg_text): NULL
 * after replying, or after a mandate of no node here went to remote_take
 * (taken here first, then the command runs again; or busy, naming the
 * node that runs it). */
static struct mandate *arg_own_mandate(struct control_request *req, bool reason_required,
                                       const char **ret_reason)
{
        const char *remote;
        struct mandate *m = arg_mandate_at(req, &remote);
        if ((!m && !remote) || refuse_if_stopping(req) || (m && refuse_unwritable(req, m)) ||
            !arg_text(req, "reason", reason_required, ret_reason))
                return NULL;
        if (remote)
                remote_take(req, remote);
        return remote ? NULL : m;
}

/* The mandate a resume or approve changes: NULL after replying, or after
 * a mandate of no node here went to remote_take (taken here, then the
 * command runs again). */
static struct mandate *arg_held_mandate(struct control_request *req)
{
        const char *remote;
        struct mandate *m = arg_mandate_at(req, &remote);
        if (remote && !refuse_if_stopping(req))
                remote_take(req, remote);
        if (!m || refuse_if_stopping(req) || refuse_unwritable(req, m))
                return NULL;
        return m;
}

static void cmd_pause(struct control_request *req)
{
        if (schedule_pause(req, true))
                return;
        const char *reason;
        struct mandate *m = arg_own_mandate(req, false, &reason);
        if (!m)
                return;
        if (m->status == MANDATE_PAUSED || m->status == MANDATE_PAUSED_REVIEW ||
            m->status == MANDATE_PROBING || mandate_status_is_final(m->status)) {
                control_reply_error(req, "conflict", "mandate %s is %s: cannot pause it", m->id,
                                    mandate_status_name(m->status));
                return;
        }
        submit_op(req, m, OP_PAUSE, 0, reason ? reason : "paused by operator", NULL);
}

static void cmd_cancel(struct control_request *req)
{
        const char *reason;
        struct mandate *m = arg_own_mandate(req, true, &reason);
        if (!m)
                return;
        if (mandate_status_is_final(m->status)) {
                control_reply_error(req, "conflict", "mandate %s is %s: nothing to cancel", m->id,
                                    mandate_status_name(m->status));
                return;
        }
        if (m->cancel) {
                control_reply_error(req, "conflict", "mandate %s is being cancelled already",
                                    m->id);
                return;
        }
        executor_cancel(m, reason, req->uid, reply_result, req);
}

static void cmd_resume(struct control_request *req)
{
        if (schedule_pause(req, false))
                return;
        struct mandate *m = arg_held_mandate(req);
        if (!m)
                return;
        if (req->taken_remote && m->status != MANDATE_PAUSED &&
            m->status != MANDATE_PAUSED_REVIEW && m->status != MANDATE_AWAITING_APPROVAL) {
                /* taking it over resumed it (an operator's pause lasts as
                 * long as its node holds it, as it lasts until a restart) */
                control_reply_ok(req, json_pack("{s:s, s:s}", "mandate", m->id, "status",
                                                mandate_status_name(m->status)));
                return;
        }
        if (m->status == MANDATE_PAUSED_REVIEW) {
                control_reply_error(req, "conflict",
                                    "mandate %s is paused for review of step %s: use kairosctl "
                                    "resolve %s %s --done|--retry|--abandon --reason TEXT",
                                    m->id, m->review_step ? m->review_step : "?", m->id,
                                    m->review_step ? m->review_step : "STEP");
                return;
        }
        if (m->status != MANDATE_PAUSED) {
                control_reply_error(req, "conflict", "mandate %s is %s, not paused", m->id,
                                    mandate_status_name(m->status));
                return;
        }
        submit_op(req, m, OP_RESUME, 0, "resumed by operator", NULL);
}

static void cmd_resolve(struct control_request *req)
{
        const char *remote;
        struct mandate *m = arg_mandate_at(req, &remote);
        if ((!m && !remote) || refuse_if_stopping(req) || (m && refuse_unwritable(req, m)))
                return;
        const char *step, *action, *reason;
        if (!control_arg_required(req, "step", &step, "action", &action, "reason", &reason, NULL))
                return;
        enum resolve_mode mode;
        if (strcmp(action, "done") == 0)
                mode = RESOLVE_DONE;
        else if (strcmp(action, "retry") == 0)
                mode = RESOLVE_RETRY;
        else if (strcmp(action, "abandon") == 0)
                mode = RESOLVE_ABANDON;
        else {
                control_reply_error(req, "bad_argument",
                                    "args.action: must be done, retry or abandon, not '%s'",
                                    action);
                return;
        }
        if (!*reason) {
                control_reply_error(req, "bad_argument", "args.reason: must not be empty");
                return;
        }
        if (remote)
                remote_take(req, remote);
        else
                submit_op(req, m, OP_RESOLVE, mode, reason, step);
}

/* The tick's rule (planner_retry_check) over the mandates of m's tick this
 * node knows: its WALs and its archive, so it holds across a restart.  A
 * retry is registered on the loop (fire_tick's mandate_add) before anything
 * asynchronous, so the check and the creation are one step for every other
 * request; a retry whose creation failed is no longer registered (or no
 * longer counts: opreads.h) and blocks nothing.  In cluster mode the
 * database checks the same rule again across the nodes when it creates the
 * retry. */
static bool refuse_tick_retry(struct control_request *req, const char *id, const char *schedule,
                              const char *fired_at, bool has_reason)
{
        struct planner_tick_mandate stack[16], *v = stack;
        size_t n = 0, cap = sizeof stack / sizeof stack[0], pos = 0, which;
        const char *k;
        void *p;
        enum planner_retry_verdict verdict;
        bool refused = true;
        while (strmap_next(req->d->mandates, &pos, &k, &p) == 0) {
                const struct mandate *o = p;
                if (!o->schedule || !o->fired_at || strcmp(o->schedule, schedule) != 0 ||
                    strcmp(o->fired_at, fired_at) != 0 || !req->d->opreads->counts(o))
                        continue;
                if (n == cap) {
                        size_t ncap = 2 * cap;
                        struct planner_tick_mandate *nv = malloc(ncap * sizeof(*nv));
                        if (!nv)
                                goto oom;
                        memcpy(nv, v, n * sizeof(*nv));
                        if (v != stack)
                                free(v);
                        v = nv;
                        cap = ncap;
                }
                v[n++] = (struct planner_tick_mandate){
                        .id = o->id, .retry = o->retry,
                        .state = o->status == MANDATE_DONE ? PLANNER_TICK_DONE
                                 : mandate_status_is_final(o->status)     ? PLANNER_TICK_ENDED
                                                           : PLANNER_TICK_UNFINISHED,
                };
        }
        if (planner_retry_check(v, n, has_reason, &verdict, &which) < 0)
                goto oom;
        const struct mandate *u =
                verdict == PLANNER_RETRY_UNFINISHED ? mandate_find(req->d, v[which].id) : NULL;
        if (u && req->d->opreads->retry_creating(u)) {
                /* another node's retry may still win it: not named as the
                 * tick's retry */
                control_reply_error_detail(
                        req, "conflict", json_pack("{s:s}", "creating", u->id),
                        "the tick of %s (%s at %s) has a retry being made: mandate %s, not yet "
                        "committed; one retry of a tick at a time",
                        id, schedule, fired_at, u->id);
        } else if (verdict == PLANNER_RETRY_UNFINISHED) {
                control_reply_error_detail(
                        req, "conflict", json_pack("{s:s}", "unfinished", v[which].id),
                        "the tick of %s (%s at %s) has an unfinished %s: mandate %s is %s; "
                        "one retry of a tick at a time",
                        id, schedule, fired_at, v[which].retry ? "retry" : "mandate",
                        v[which].id, u ? mandate_status_name(u->status) : "unfinished");
        } else if (verdict == PLANNER_RETRY_NEEDS_REASON) {
                control_reply_error(req, "conflict",
                                    "the tick of %s (%s at %s) ended done as mandate %s: "
                                    "retrying it repeats its work; give --reason to do it "
                                    "anyway",
                                    id, schedule, fired_at, v[which].id);
        } else {
                refused = false;
        }
        goto out;
oom:
        control_reply_error(req, "internal", "out of memory");
out:
        if (v != stack)
                free(v);
        return refused;
}

/* retry --from: the steps of the mandate retried, read off the loop on its
 * queue, then the retry made (retry_target again: the checks hold at the
 * moment it is created). */
struct retry_from {
        struct control_request *req;
        struct mandate *m;          /* NULL: another node's (its rows read by opreads) */
        char *id, *schedule, *fired_at, *status; /* ... that mandate's, copied */
        bool ended, done;
        char *from;
        int db_last;
        int error;             /* reading its WAL */
        int refused;           /* carry_select */
        char msg[256];
        struct fold *f;
        struct carry carry;    /* borrows from f */
};

static void retry_from_work(void *arg)
{
        struct retry_from *j = arg;
        const struct mandate *m = j->m;
        j->error = m->archived ? showdoc_fold_file(m->wal_path, true, &j->f)
                               : fold_file(m->wal_path, &j->f);
        if (!j->error)
                j->refused = carry_select(j->f, j->from, &j->carry, j->msg, sizeof j->msg);
}

static void retry_from_done(void *arg)
{
        struct retry_from *j = arg;
        struct mandate *m = j->m;
        m->busy--;
        if (j->error) {
                control_reply_error(j->req, "wal_io_error", "cannot read %s: %s", m->wal_path,
                                    strerror(-j->error));
        } else if (j->refused) {
                control_reply_error(j->req, "bad_argument", "%s", j->msg);
        } else {
                struct retry_target rt = retry_target_of(m);
                rt.db_last = j->db_last;
                retry_target(j->req, &rt, &j->carry);
        }
        fold_free(j->f);
        free(j->from);
        free(j);
}

static void retry_from_free(struct retry_from *j)
{
        fold_free(j->f);
        FREE_ALL(j->from, j->id, j->schedule, j->fired_at, j->status, j);
}

/* retry --from of another node's mandate: its rows, folded by the driver
 * (opreads.h); then as for one of this node's. */
static void retry_from_folded(void *ctx, int err, const char *errmsg, struct fold *f)
{
        struct retry_from *j = ctx;
        j->f = f;
        if (err == -ENOENT) {
                control_reply_error(j->req, "not_found", "no mandate %s", j->id);
        } else if (err) {
                control_reply_error(j->req, "cluster_unavailable",
                                    "cannot read the steps of mandate %s: %s", j->id,
                                    errmsg && *errmsg ? errmsg : strerror(-err));
        } else if (carry_select(j->f, j->from, &j->carry, j->msg, sizeof j->msg) < 0) {
                control_reply_error(j->req, "bad_argument", "%s", j->msg);
        } else {
                struct retry_target rt = {
                        .id = j->id, .schedule = j->schedule, .fired_at = j->fired_at,
                        .status = j->status, .ended = j->ended, .done = j->done,
                        .remote = true, .db_last = j->db_last,
                };
                retry_target(j->req, &rt, &j->carry);
        }
        retry_from_free(j);
}

/* The reply of a retry --from names the step it runs from. */
static void retry_from_reply(void *ctx, const struct op_result *r)
{
        struct control_request *req = ctx;
        const char *from = json_string_value(json_object_get(req->args, "from"));
        if (!r->code && r->result && from)
                json_object_set_new(r->result, "from", json_string(from));
        reply_result(req, r);
}

/* Start reading t's steps for retry --from FROM (t is this node's). */
static void retry_from_read(struct control_request *req, const struct retry_target *t,
                            const char *from)
{
        struct mandate *m = t->remote ? NULL : mandate_find(req->d, t->id);
        struct retry_from *j = calloc(1, sizeof(*j));
        if (!j || !(j->from = strdup(from))) {
                free(j);
                control_reply_error(req, "internal", "out of memory");
                return;
        }
        j->req = req;
        j->m = m;
        j->db_last = t->db_last;
        if (!m) {
                /* another node's mandate (opreads.h): its rows, read
                 * through the driver (an ended mandate's rows are final) */
                j->ended = t->ended;
                j->done = t->done;
                if (!(j->id = strdup(t->id)) ||
                    (t->schedule && !(j->schedule = strdup(t->schedule))) ||
                    (t->fired_at && !(j->fired_at = strdup(t->fired_at))) ||
                    (t->status && !(j->status = strdup(t->status))) ||
                    req->d->opreads->fold(req->d, t->id, retry_from_folded, j) < 0) {
                        retry_from_free(j);
                        control_reply_error(req, "internal", "out of memory");
                }
                return;
        }
        m->busy++;
        if (serialq_submit(&m->q, retry_from_work, retry_from_done, j) < 0) {
                m->busy--;
                free(j->from);
                free(j);
                control_reply_error(req, "internal", "out of memory");
        }
}

/* Retry t's tick (args.reason validated by cmd_retry): refused unless t has
 * ended, one that ended done needs a reason, then the tick's rule.  With
 * args.from, the steps to carry are read first (carried NULL), then the
 * same checks again and the retry made with them. */
static void retry_target(struct control_request *req, const struct retry_target *t,
                         const struct carry *carried)
{
        bool failed;
        const char *reason = control_arg_string(req, "reason", false, &failed);
        if (failed || refuse_if_stopping(req))
                return;
        if (!t->ended) {
                control_reply_error(req, "conflict",
                                    "mandate %s is %s: only a mandate that has ended can be "
                                    "retried",
                                    t->id, t->status);
                return;
        }
        if (t->done && !reason) {
                control_reply_error(req, "conflict",
                                    "mandate %s ended done: retrying it repeats its work; give "
                                    "--reason to do it anyway",
                                    t->id);
                return;
        }
        if (!t->schedule || !t->fired_at) {
                control_reply_error(req, "conflict",
                                    "mandate %s has no mandate record: its schedule and tick are "
                                    "unknown",
                                    t->id);
                return;
        }
        if (refuse_tick_retry(req, t->id, t->schedule, t->fired_at, reason != NULL))
                return;
        char id[PLANNER_ID_MAX];
        int n = t->db_last + 1;
        for (; n <= PLANNER_MAX_RETRY; n++)
                if (planner_retry_mandate_id(t->schedule, t->fired_at, n, id) < 0 ||
                    !mandate_find(req->d, id))
                        break;
        if (n > PLANNER_MAX_RETRY) {
                control_reply_error(req, "conflict", "the tick of %s has been retried %d times",
                                    t->id, PLANNER_MAX_RETRY);
                return;
        }
        const char *from = control_arg_string(req, "from", false, &failed);
        if (failed)
                return;
        if (from && !carried) {
                retry_from_read(req, t, from);
                return;
        }
        struct executor_retry rt = {
                .schedule = t->schedule, .fired_at = t->fired_at, .retry_of = t->id,
                .reason = reason ? reason : "retried by operator", .retry = n,
                .uid = (long long)req->uid, .forced = reason != NULL, .carried = carried,
        };
        executor_retry(req->d, &rt, carried ? retry_from_reply : reply_result, req);
}

static struct retry_target retry_target_of(const struct mandate *m)
{
        return (struct retry_target){
                .id = m->id, .schedule = m->schedule, .fired_at = m->fired_at,
                .status = mandate_status_name(m->status), .ended = mandate_status_is_final(m->status),
                .done = m->status == MANDATE_DONE,
        };
}

/* The tick beyond this node (opreads.h) of the mandate cmd_retry named. */
static void retry_tick(void *ctx, const struct op_result *err, const struct opreads_tick *t)
{
        struct control_request *req = ctx;
        if (err) {
                reply_result(req, err);
                return;
        }
        struct retry_target rt;
        if (t->remote) {
                rt = (struct retry_target){
                        .id = t->id, .schedule = t->schedule, .fired_at = t->fired_at,
                        .status = t->status, .ended = t->ended, .done = t->done,
                        .remote = true,
                };
        } else {
                struct mandate *m = mandate_find(req->d, t->id);
                if (!m) {
                        control_reply_error(req, "not_found", "no mandate %s", t->id);
                        return;
                }
                rt = retry_target_of(m);
        }
        rt.db_last = t->last;
        retry_target(req, &rt, NULL);
}

/* retry MANDATE [--reason T] [--from STEP]: a new mandate for the same tick
 * (retry N, the first N not taken), refused unless MANDATE has ended; one
 * that ended done needs a reason.  --from: the new mandate takes the steps
 * of STEP's cycle before STEP as completed, with their results, and runs
 * from STEP (carry.h).  MANDATE may be another node's, and the other nodes are
 * asked first for the tick's retries (opreads.h: tick). */
static void cmd_retry(struct control_request *req)
{
        const char *remote = NULL;
        struct mandate *m = arg_mandate_at(req, &remote);
        if ((!m && !remote) || refuse_if_stopping(req))
                return;
        const char *reason, *from;
        if (!arg_text(req, "reason", false, &reason) || !arg_text(req, "from", false, &from))
                return;
        if (req->d->opreads->tick(req->d, m ? m->id : remote, !m, m ? m->schedule : NULL,
                                  m ? m->fired_at : NULL, retry_tick, req) < 0)
                control_reply_error(req, "internal", "out of memory");
}

/* args.schedule, a well-formed schedule name; NULL: answered (the field
 * named). */
static const char *arg_schedule(struct control_request *req)
{
        bool failed;
        const char *schedule = control_arg_string(req, "schedule", true, &failed);
        if (failed)
                return NULL;
        if (!planner_valid_name(schedule)) {
                control_reply_error(req, "bad_argument",
                                    "args.schedule: '%s' is not a schedule name ([A-Za-z0-9_-]{1,64})",
                                    schedule);
                return NULL;
        }
        return schedule;
}

static void cmd_fire(struct control_request *req)
{
        bool failed;
        if (refuse_if_stopping(req))
                return;
        const char *schedule = arg_schedule(req);
        if (!schedule)
                return;
        const char *at = control_arg_string(req, "at", false, &failed);
        if (failed)
                return;
        char now[PLANNER_FIRED_AT_LEN];
        if (at) {
                if (planner_parse_fired_at(at, NULL) < 0) {
                        control_reply_error(req, "bad_argument",
                                            "args.at: '%s' is not a UTC time YYYY-MM-DDTHH:MM:SSZ",
                                            at);
                        return;
                }
        } else {
                planner_format_fired_at((int64_t)time(NULL), now);
                at = now;
        }
        executor_fire(req->d, schedule, at, reply_result, req);
}

/* backfill: the ticks of a range, fired one after the other through the
 * fire path of `fire` (a tick with a mandate already is not fired again);
 * the answer lists each tick's outcome once all are answered. */
struct backfill {
        struct control_request *req;
        char *schedule;
        int64_t *ticks;
        size_t n, next;
        json_t *out;
        size_t fired, existing, failed;
        bool stepping, pending;     /* (an answer within executor_fire: no recursion) */
};

static void backfill_step(struct backfill *b);

static void backfill_answered(void *ctx, const struct op_result *r)
{
        struct backfill *b = ctx;
        char at[PLANNER_FIRED_AT_LEN];
        planner_format_fired_at(b->ticks[b->next - 1], at);
        json_t *o;
        if (r->code) {
                b->failed++;
                o = json_pack("{s:s, s:s, s:s}", "fired_at", at, "error", r->code, "message",
                              r->message);
        } else {
                bool fired = json_is_true(json_object_get(r->result, "fired"));
                fired ? b->fired++ : b->existing++;
                o = json_pack("{s:s, s:O?, s:b, s:O?}", "fired_at", at, "mandate",
                              json_object_get(r->result, "mandate"), "fired", fired, "status",
                              json_object_get(r->result, "status"));
        }
        if (o)
                json_array_append_new(b->out, o);
        json_decref(r->result);
        json_decref(r->detail);
        b->pending = false;
        if (!b->stepping)
                backfill_step(b);
}

static void backfill_step(struct backfill *b)
{
        b->stepping = true;
        while (b->next < b->n && !b->req->d->stopping) {
                char at[PLANNER_FIRED_AT_LEN];
                planner_format_fired_at(b->ticks[b->next++], at);
                b->pending = true;
                executor_fire(b->req->d, b->schedule, at, backfill_answered, b);
                if (b->pending) {
                        b->stepping = false;
                        return; /* backfill_answered goes on */
                }
        }
        b->stepping = false;
        control_reply_ok(b->req, json_pack("{s:s, s:b, s:o, s:I, s:I, s:I, s:I}", "schedule",
                                           b->schedule, "dry_run", false, "ticks", b->out,
                                           "fired", (json_int_t)b->fired, "existing",
                                           (json_int_t)b->existing, "failed",
                                           (json_int_t)b->failed, "not_fired",
                                           (json_int_t)(b->n - b->next)));
        FREE_ALL(b->schedule, b->ticks, b);
}

static bool arg_time(struct control_request *req, const char *key, int64_t *ret)
{
        bool failed;
        const char *v = control_arg_string(req, key, true, &failed);
        if (failed)
                return false;
        if (planner_parse_fired_at(v, ret) < 0) {
                control_reply_error(req, "bad_argument",
                                    "args.%s: '%s' is not a UTC time YYYY-MM-DDTHH:MM:SSZ", key, v);
                return false;
        }
        return true;
}

static void cmd_backfill(struct control_request *req)
{
        if (refuse_if_stopping(req))
                return;
        const char *schedule = arg_schedule(req);
        if (!schedule)
                return;
        int64_t from, to;
        if (!arg_time(req, "from", &from) || !arg_time(req, "to", &to))
                return;
        if (from > to) {
                control_reply_error(req, "bad_argument", "args.from: %s is after args.to %s",
                                    json_string_value(json_object_get(req->args, "from")),
                                    json_string_value(json_object_get(req->args, "to")));
                return;
        }
        json_t *mv = json_object_get(req->args, "max");
        json_int_t max = CHRONOS_BACKFILL_MAX;
        if (mv && (!json_is_integer(mv) || json_integer_value(mv) < 1 ||
                   json_integer_value(mv) > CHRONOS_BACKFILL_HARD_MAX)) {
                control_reply_error(req, "bad_argument", "args.max: must be an integer 1..%d",
                                    CHRONOS_BACKFILL_HARD_MAX);
                return;
        }
        if (mv)
                max = json_integer_value(mv);
        json_t *dv = json_object_get(req->args, "dry_run");
        if (dv && !json_is_boolean(dv)) {
                control_reply_error(req, "bad_argument", "args.dry_run: must be a boolean");
                return;
        }
        int64_t *ticks = malloc((size_t)max * sizeof(*ticks));
        size_t n = 0;
        int r = ticks ? chronos_backfill_ticks(req->d, schedule, from, to, (size_t)max, ticks, &n)
                      : -ENOMEM;
        if (r == -ENOENT)
                control_reply_error(req, "not_found", "no schedule named '%s'", schedule);
        else if (r == -EBADR)
                control_reply_error(req, "schedule_broken", "schedule '%s' is broken", schedule);
        else if (r == -E2BIG)
                control_reply_error(req, "too_many",
                                    "schedule %s has more than %lld ticks in [%s, %s] (args.max; "
                                    "kairosctl backfill --max N, at most %d)",
                                    schedule, (long long)max,
                                    json_string_value(json_object_get(req->args, "from")),
                                    json_string_value(json_object_get(req->args, "to")),
                                    CHRONOS_BACKFILL_HARD_MAX);
        else if (r == -ERANGE)
                control_reply_error(req, "bad_argument", "args.from/args.to: out of range");
        else if (r < 0)
                control_reply_error(req, "internal", "out of memory");
        if (r < 0) {
                free(ticks);
                return;
        }
        if (json_is_true(dv) || n == 0) {
                json_t *arr = json_array();
                for (size_t i = 0; i < n; i++) {
                        char at[PLANNER_FIRED_AT_LEN];
                        planner_format_fired_at(ticks[i], at);
                        json_array_append_new(arr, json_pack("{s:s}", "fired_at", at));
                }
                free(ticks);
                control_reply_ok(req, json_pack("{s:s, s:b, s:o, s:I}", "schedule", schedule,
                                                "dry_run", json_is_true(dv), "ticks", arr,
                                                "count", (json_int_t)n));
                return;
        }
        struct backfill *b = calloc(1, sizeof(*b));
        char *name = strdup(schedule);
        json_t *out = json_array();
        if (!b || !name || !out) {
                json_decref(out);
                FREE_ALL(b, name, ticks);
                control_reply_error(req, "internal", "out of memory");
                return;
        }
        *b = (struct backfill){ .req = req, .schedule = name, .ticks = ticks, .n = n, .out = out };
        log_event(LOG_NOTICE, MSGID_OPERATOR, LOG_FIELDS({ "SCHEDULE", schedule }),
                  "schedule %s: backfill of %zu tick%s in [%s, %s]", schedule, n,
                  n == 1 ? "" : "s", json_string_value(json_object_get(req->args, "from")),
                  json_string_value(json_object_get(req->args, "to")));
        backfill_step(b);
}

static void cmd_approve(struct control_request *req)
{
        struct mandate *m = arg_held_mandate(req);
        if (!m)
                return;
        if (m->status != MANDATE_AWAITING_APPROVAL) {
                control_reply_error(req, "conflict", "mandate %s is %s, not awaiting approval",
                                    m->id, mandate_status_name(m->status));
                return;
        }
        bool failed;
        const char *reason = control_arg_string(req, "reason", false, &failed);
        if (failed)
                return;
        submit_op(req, m, OP_APPROVE, 0, reason && *reason ? reason : "approved by operator",
                  m->review_step);
}

static void cmd_schedules(struct control_request *req)
{
        bool failed;
        const char *next = control_arg_string(req, "next", false, &failed);
        if (failed)
                return;
        if (!next) {
                /* 10,000 schedules are 2 MB of JSON: built once per change */
                size_t len;
                const char *text = chronos_list_text(req->d, &len);
                if (!text)
                        control_reply_error(req, "internal", "out of memory");
                else
                        control_reply_ok_text(req, text, len);
                return;
        }
        json_t *nv = json_object_get(req->args, "n");
        json_int_t n = 5;
        if (nv && (!json_is_integer(nv) || json_integer_value(nv) < 1 ||
                   json_integer_value(nv) > 1000)) {
                control_reply_error(req, "bad_argument", "args.n: must be an integer 1..1000");
                return;
        }
        if (nv)
                n = json_integer_value(nv);
        json_t *out;
        int r = chronos_next_json(req->d, next, (unsigned)n, &out);
        if (r == -EBADR) {
                const struct config_broken *b = config_find_broken(req->d->cfg, next);
                control_reply_error(req, "schedule_broken", "schedule '%s' is broken: %s", next,
                                    b && b->errors.n ? b->errors.msgs[0] : "?");
                return;
        }
        if (r < 0) {
                control_reply_error(req, "not_found", "no schedule named '%s'", next);
                return;
        }
        control_reply_ok(req, out);
}

#ifdef KAIROS_TEST_HOOKS
/* Test hook: set chronos's clock (seconds since the epoch). */
static void cmd_test_clock(struct control_request *req)
{
        json_t *v = json_object_get(req->args, "now");
        if (!json_is_integer(v) || json_integer_value(v) < 0) {
                control_reply_error(req, "bad_argument", "args.now: must be a non-negative integer");
                return;
        }
        chronos_test_set_clock(req->d, (int64_t)json_integer_value(v));
        history_prune_now(req->d);
        control_reply_ok(req, json_pack("{s:I}", "now", json_integer_value(v)));
}

/* Test hook: block the event loop for `seconds` (the watchdog must notice). */
static void cmd_test_stall(struct control_request *req)
{
        json_t *v = json_object_get(req->args, "seconds");
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 3600) {
                control_reply_error(req, "bad_argument", "args.seconds: must be 0..3600");
                return;
        }
        /* Read it before replying: the reply frees req and its args. */
        json_int_t seconds = json_integer_value(v);
        log_warning("test hook: stalling the event loop for %lld s", (long long)seconds);
        control_reply_ok(req, json_pack("{s:I}", "stalling", seconds));
        struct timespec ts = { (time_t)seconds, 0 };
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
}
#endif

static void cmd_reload(struct control_request *req)
{
        if (refuse_if_stopping(req))
                return;
        daemon_reload(req->d, reply_result, req);
}

struct command {
        const char *name;
        void (*fn)(struct control_request *req);
        bool while_stopping;   /* answered during a graceful stop */
        /* fn NULL: a call of the idempotency service's idem (step: made by a
         * step's handler, which waits for its start to be reported) */
        void (*idem)(const struct idem_call *call);
        bool step;
};

/* ---- metrics ---- */

/* {format?: "prometheus"|"openmetrics"} → {format, content_type, text}. */
static void cmd_metrics(struct control_request *req)
{
        bool failed = false;
        const char *fmt = control_arg_string(req, "format", false, &failed);
        if (failed)
                return;
        enum om_format f = OM_PROMETHEUS;
        if (fmt && strcmp(fmt, "openmetrics") == 0) {
                f = OM_OPENMETRICS;
        } else if (fmt && strcmp(fmt, "prometheus") != 0) {
                control_reply_error(req, "bad_argument",
                                    "args.format: must be \"prometheus\" or \"openmetrics\"");
                return;
        }
        struct kbuf text = KBUF_INIT;
        if (!req->d->metrics || metrics_render(req->d->metrics, f, &text) < 0) {
                kbuf_free(&text);
                control_reply_error(req, "internal", "out of memory");
                return;
        }
        control_reply_ok(req, json_pack("{s:s, s:s, s:s}", "format",
                                        f == OM_OPENMETRICS ? "openmetrics" : "prometheus",
                                        "content_type",
                                        f == OM_OPENMETRICS
                                                ? "application/openmetrics-text; version=1.0.0; "
                                                  "charset=utf-8"
                                                : "text/plain; version=0.0.4; charset=utf-8",
                                        "text", text.data ? text.data : ""));
        kbuf_free(&text);
}

/* ---- wait: answered when the mandate settles ---- */

/* A wait request is kept until its mandate settles (is no longer runnable,
 * running, idle or probing), its connection closes, or kairosd stops. */
struct waiter {
        struct control_claim cc;     /* its connection: gone, the waiter goes */
        struct waiter *prev, *next;
        struct control_request *req;
        char *id;
};

static struct {
        struct waiter *head;
        unsigned n;
        uv_timer_t turn;             /* a status changed: look on the next turn */
        bool turn_ready;
} W;

static unsigned waiters_count(void)
{
        return W.n;
}

static bool wait_settled(enum mandate_status s)
{
        return s != MANDATE_RUNNABLE && s != MANDATE_RUNNING && s != MANDATE_IDLE &&
               s != MANDATE_PROBING;
}

static void waiter_free(struct waiter *w)
{
        DLIST_UNLINK(W.head, w);
        W.n--;
        control_claim_release(&w->cc);
        free(w->id);
        free(w);
}

/* The connection closed: the request goes unanswered. */
static void waiter_gone(struct control_claim *cc)
{
        struct waiter *w = (struct waiter *)cc;
        struct control_request *req = w->req;
        waiter_free(w);
        control_reply_error(req, "gone", "the connection closed"); /* (goes nowhere) */
}

/* Take w out of the waiters (and off its connection) to be answered: a
 * reply may run the connection's next requests or close it, which must not
 * touch the waiters being walked. */
static void waiter_take(struct waiter *w, struct waiter ***tail)
{
        DLIST_UNLINK(W.head, w);
        W.n--;
        control_claim_release(&w->cc);
        w->next = NULL;
        **tail = w;
        *tail = &w->next;
}

/* Answer the waiters taken: the mandate's row if it settled (err NULL: it
 * had), else err. */
static void waiters_answer(struct daemon *d, struct waiter *list, const char *err)
{
        while (list) {
                struct waiter *w = list;
                list = w->next;
                struct mandate *m = mandate_find(d, w->id);
                if (m && (wait_settled(m->status) || !err)) /* (it settled when taken) */
                        control_reply_ok(w->req, mandate_json(m));
                else if (!m)
                        control_reply_error(w->req, "not_found", "no mandate %s", w->id);
                else
                        control_reply_error(w->req, "shutting_down", "%s before mandate %s "
                                            "settled (it is %s)", err, w->id,
                                            mandate_status_name(m->status));
                free(w->id);
                free(w);
        }
}

static void waiters_check(uv_timer_t *t)
{
        struct daemon *d = t->data;
        struct waiter *ready = NULL, **tail = &ready;
        for (struct waiter *w = W.head, *next; w; w = next) {
                next = w->next;
                struct mandate *m = mandate_find(d, w->id);
                if (!m || wait_settled(m->status))
                        waiter_take(w, &tail);
        }
        waiters_answer(d, ready, NULL);
}

void commands_status_changed(struct mandate *m)
{
        /* (its reason and review step are set just after: answered on the
         * next turn of the loop) */
        if (W.n && W.turn_ready)
                uv_timer_start(&W.turn, waiters_check, 0, 0);
        (void)m;
}

void commands_stopping(struct daemon *d)
{
        struct waiter *all = NULL, **tail = &all;
        while (W.head)
                waiter_take(W.head, &tail);
        if (W.turn_ready)
                uv_timer_stop(&W.turn);
        waiters_answer(d, all, "kairosd is stopping");
}

static void cmd_wait(struct control_request *req)
{
        const char *remote;
        struct mandate *m = arg_mandate_at(req, &remote);
        if (!m && remote) {
                /* another node runs it: nothing here sees it end */
                control_reply_error(req, "poll",
                                    "mandate %s is not this node's: ask show until it settles",
                                    remote);
                return;
        }
        if (!m)
                return;
        if (wait_settled(m->status)) {
                control_reply_ok(req, mandate_json(m));
                return;
        }
        if (req->d->stopping) {
                control_reply_error(req, "shutting_down",
                                    "kairosd is stopping before mandate %s settled (it is %s)",
                                    m->id, mandate_status_name(m->status));
                return;
        }
        unsigned mine = 0;
        for (struct waiter *w = W.head; w; w = w->next)
                mine += control_claim_owned_by(&w->cc, req);
        if (W.n >= COMMANDS_WAIT_MAX || mine >= COMMANDS_WAIT_MAX_PER_CONN) {
                control_reply_error(req, "too_many_waiters",
                                    "too many wait requests %s (at most %u per connection and %u "
                                    "in all): wait for mandate %s later",
                                    W.n >= COMMANDS_WAIT_MAX ? "in all" : "on this connection",
                                    (unsigned)COMMANDS_WAIT_MAX_PER_CONN,
                                    (unsigned)COMMANDS_WAIT_MAX, m->id);
                return;
        }
        struct waiter *w = calloc(1, sizeof(*w));
        if (!w || !(w->id = strdup(m->id))) {
                free(w);
                control_reply_error(req, "internal", "out of memory");
                return;
        }
        if (!W.turn_ready) {
                uv_timer_init(req->d->loop, &W.turn);
                W.turn.data = req->d;
                W.turn_ready = true;
        }
        w->req = req;
        if (!control_claim_attach(req, &w->cc, waiter_gone)) {
                free(w->id);
                free(w);
                control_reply_error(req, "gone", "the connection closed"); /* (goes nowhere) */
                return;
        }
        DLIST_PUSH(W.head, w);
        W.n++;
}

/* ---- the idempotency service (idem_service.h) ---- */

/* A claim tied to the connection its tool-begin came on. */
struct conn_hold {
        struct control_claim cc;
        struct idem_claim *claim;
};

static void hold_closed(struct control_claim *cc)
{
        struct conn_hold *h = (struct conn_hold *)cc;
        struct idem_claim *c = h->claim;
        free(h);
        idem_claim_owner_gone(c);
}

/* Out of memory: as if the connection were gone (the entry is marked
 * interrupted, never left processing without an owner). */
static bool hold_attach(void *ctx, struct idem_claim *c, void **ret_hold)
{
        struct control_request *req = ctx;
        struct conn_hold *h = calloc(1, sizeof(*h));
        if (!h)
                return false;
        h->claim = c;
        if (!control_claim_attach(req, &h->cc, hold_closed)) {
                free(h);
                return false;
        }
        *ret_hold = h;
        return true;
}

static void hold_release(void *hold)
{
        struct conn_hold *h = hold;
        control_claim_release(&h->cc);
        free(h);
}

static void idem_call(struct control_request *req, void (*op)(const struct idem_call *call))
{
        struct idem_call call = {
                .d = req->d,
                .args = req->args,
                .uid = req->uid,
                .pid = req->pid,
                .owner = { .id = req->client, .ctx = req, .attach = hold_attach,
                           .release = hold_release },
                .done = reply_result,
                .ctx = req,
        };
        op(&call);
}

/* A step's tool call (tool-begin, tool-write) from a process whose handler's
 * start the runner has not reported yet: asked again after the report,
 * so that it is attributed to its step (docs/design.md §11). */
struct idem_waiting {
        struct control_request *req;
        void (*op)(const struct idem_call *call);
};

static void step_call(struct control_request *req, void (*op)(const struct idem_call *call));

static void step_call_again(void *ctx, bool gone)
{
        struct idem_waiting *w = ctx;
        struct control_request *req = w->req;
        void (*op)(const struct idem_call *call) = w->op;
        free(w);
        if (gone)
                control_reply_error(req, "unavailable", "kairosd is stopping");
        else
                step_call(req, op);
}

static void step_call(struct control_request *req, void (*op)(const struct idem_call *call))
{
        struct idem_waiting *w;
        if (req->pid > 0 && executor_start_pending(req->d, req->pid) &&
            (w = malloc(sizeof(*w)))) {
                *w = (struct idem_waiting){ req, op };
                if (executor_after_start(req->d, step_call_again, w) == 0)
                        return;
                free(w);
        }
        idem_call(req, op);
}

/* While kairosd stops (up to GracefulTimeoutSec=), the commands that only
 * read are still answered, and so are a running handler's tool calls; every
 * other command is refused with "shutting_down". */
#define CMD(n, f, stop) { .name = n, .fn = f, .while_stopping = stop }
#define IDEM(n, op, stop, st) { .name = n, .idem = op, .while_stopping = stop, .step = st }
static const struct command commands[] = {
        CMD("status", cmd_status, true),        CMD("list", cmd_list, true),
        CMD("show", cmd_show, true),            CMD("schedules", cmd_schedules, true),
        CMD("pause", cmd_pause, false),         CMD("resume", cmd_resume, false),
        CMD("resolve", cmd_resolve, false),     CMD("reload", cmd_reload, false),
        CMD("fire", cmd_fire, false),           CMD("approve", cmd_approve, false),
        CMD("backfill", cmd_backfill, false),
        CMD("retry", cmd_retry, false),        CMD("cancel", cmd_cancel, false),
        CMD("wait", cmd_wait, true),
        IDEM("tool-begin", idem_tool_begin, true, true),
        IDEM("tool-finish", idem_tool_finish, true, false),
        IDEM("tool-write", idem_tool_write, true, true),
        IDEM("tool-write-data", idem_tool_write_data, true, false),
        IDEM("tool-write-end", idem_tool_write_end, true, false),
        IDEM("idem-stats", idem_stats_get, true, false),
        IDEM("idem-get", idem_get_entry, true, false),
        IDEM("idem-forget", idem_forget_entry, false, false),
        CMD("metrics", cmd_metrics, true),
#ifdef KAIROS_TEST_HOOKS
        CMD("test-clock", cmd_test_clock, false),
        CMD("test-stall", cmd_test_stall, false),
        IDEM("test-idem-clock", idem_test_clock, false, false),
#endif
};

bool commands_known(const char *cmd)
{
        for (size_t i = 0; cmd && i < sizeof commands / sizeof commands[0]; i++)
                if (strcmp(cmd, commands[i].name) == 0)
                        return true;
        return false;
}

void commands_dispatch(struct control_request *req)
{
        for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
                if (strcmp(req->cmd, commands[i].name) == 0) {
                        if (req->d->stopping && !commands[i].while_stopping)
                                control_reply_error(req, "shutting_down",
                                                    "kairosd is shutting down: %s is refused; "
                                                    "status, list, show, schedules and idem "
                                                    "stats/get still answer until it exits",
                                                    req->cmd);
                        else if (commands[i].fn)
                                commands[i].fn(req);
                        else
                                (commands[i].step ? step_call : idem_call)(req, commands[i].idem);
                        return;
                }
        control_reply_error(req, "unknown_command", "unknown command '%s'", req->cmd);
}
