/* SPDX-License-Identifier: MIT */
/* The PostgreSQL driver of the operator's reads (opreads.h): list, show and
 * retry see every node's mandates in the database; a mandate no node here
 * holds is taken for resolve, approve, resume and cancel (cluster_take).
 * Built with -Dpostgres=enabled only (docs/design.md §14). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "kairos/fold.h"
#include "kairos/kbuf.h"
#include "kairos/kmem.h"
#include "kairos/wal.h"
#include "opreads.h"
#include "pgstore.h"


/* The database's status of a mandate no node here knows, as a status of
 * kairosctl(1); and back, for a filter (NULL: no row of the database has
 * that status). */
static const char *db_status_name(const char *db)
{
        if (!db)
                return "running";
        if (strcmp(db, "succeeded") == 0)
                return mandate_status_name(MANDATE_DONE);
        return db; /* running, failed, paused, abandoned, cancelled: the same words */
}

/* A row waiting for its schedule's slot in the cluster (Concurrency=queue)
 * is what one host calls a queued mandate: runnable. */
static const char *db_row_status(const struct pgstore_mandate_row *r)
{
        if (r->slot_waiting)
                return mandate_status_name(MANDATE_RUNNABLE);
        /* released paused: as its node said (a review, an approval) */
        if (r->paused_as && strcmp(r->status, "paused") == 0) {
                if (strcmp(r->paused_as, mandate_status_name(MANDATE_PAUSED_REVIEW)) == 0)
                        return mandate_status_name(MANDATE_PAUSED_REVIEW);
                if (strcmp(r->paused_as, mandate_status_name(MANDATE_AWAITING_APPROVAL)) == 0)
                        return mandate_status_name(MANDATE_AWAITING_APPROVAL);
        }
        return db_status_name(r->status);
}

static const char *db_status_of(int status)
{
        switch (status) {
        case MANDATE_RUNNING: return "running";
        case MANDATE_RUNNABLE: return "running"; /* (the rows waiting for a slot) */
        case MANDATE_DONE: return "succeeded";
        case MANDATE_FAILED: return "failed";
        case MANDATE_PAUSED: return "paused";
        case MANDATE_PAUSED_REVIEW: return "paused";      /* (paused_as says which) */
        case MANDATE_AWAITING_APPROVAL: return "paused";
        case MANDATE_ABANDONED: return "abandoned";
        case MANDATE_CANCELLED: return "cancelled";
        default: return NULL;
        }
}

/* m is this node's (not dropped, not being handed back as paused). */
static bool pg_holds(const struct mandate *m)
{
        return !cluster_dropped(m) && !m->cluster_parking;
}

/* A mandate this node knows and holds (or finished): its own row wins. */
static struct mandate *known_here(struct daemon *d, const char *id)
{
        struct mandate *m = mandate_find(d, id);
        return m && pg_holds(m) ? m : NULL;
}

static int64_t key_ms(const char *ts)
{
        int64_t ms = -1;
        return ts && wal_parse_ts(ts, &ms) == 0 ? ms : -1;
}

struct list_job {
        struct daemon *d;
        struct op_reply to;
        struct history_filter f;
        size_t limit;
        char *status, *schedule, *since, *after;
        size_t margin;              /* rows of the database this node may override */
        bool skip_db;               /* the status filter is one no row there has */
        /* results */
        int err;
        char errmsg[256];
        struct pgstore_mandate_row *rows;
        size_t nrows, total;
        bool after_found;
        bool db_uncut;              /* the cursor is not in the database: cut here */
        int64_t after_ms;           /* the cursor's key (fired_at, else created) */
};

static void list_job_free(struct list_job *j)
{
        pgstore_mandate_rows_free(j->rows, j->nrows);
        FREE_ALL(j->status, j->schedule, j->since, j->after, j);
}

static void list_work(void *arg)
{
        struct list_job *j = arg;
        int r = 0;
        struct pgstore *s = cluster_thread_store_why(j->d, &r, j->errmsg, sizeof j->errmsg);
        if (!s) {
                j->err = r;
                return;
        }
        if (j->after) {
                struct pgstore_mandate_filter a = { .since_ms = -1, .mandate_id = j->after };
                struct pgstore_mandate_row *ar = NULL;
                size_t an = 0;
                if ((r = pgstore_mandates_list(s, &a, &ar, &an, NULL)) == 0 && an == 1) {
                        j->after_found = true;
                        j->after_ms = ar[0].fired_ms >= 0 ? ar[0].fired_ms : ar[0].created_ms;
                }
                pgstore_mandate_rows_free(ar, an);
                if (r < 0)
                        goto fail;
        }
        /* a cursor the database does not know (maybe this node does): every
         * row, cut on the loop */
        j->db_uncut = j->after && !j->after_found;
        if (j->skip_db)
                return;
        struct pgstore_mandate_filter f = {
                .status = j->status, .schedule = j->schedule, .since_ms = -1,
                .after = j->db_uncut ? NULL : j->after,
                .limit = j->limit && !j->db_uncut ? j->limit + j->margin : 0,
        };
        if (j->since && wal_parse_ts(j->since, &f.since_ms) < 0)
                f.since_ms = -1;
        r = pgstore_mandates_list(s, &f, &j->rows, &j->nrows, &j->total);
        if (r == 0)
                return;
fail:
        j->err = r;
        cluster_thread_failed(s, r, j->errmsg, sizeof j->errmsg);
}

struct merged {
        int64_t ms;
        const char *id;
        json_t *row;     /* borrowed */
};

static int cmp_merged(const void *a, const void *b)
{
        const struct merged *x = a, *y = b;
        if (x->ms != y->ms)
                return x->ms > y->ms ? -1 : 1;
        return -strcmp(x->id, y->id);
}

static void set_owner(json_t *row, const char *node, int64_t epoch)
{
        json_object_set_new(row, "node", node ? json_string(node) : json_null());
        json_object_set_new(row, "epoch", epoch > 0 ? json_integer(epoch) : json_null());
}

static json_t *str_or_null(const char *s)
{
        return s ? json_string(s) : json_null();
}

static json_t *db_row_json(const struct pgstore_mandate_row *r)
{
        bool paused = strcmp(r->status, "paused") == 0;
        json_t *o = json_pack("{s:s, s:s, s:s?, s:n, s:n, s:I, s:s?, s:s?}", "id", r->mandate_id,
                              "status", db_row_status(r), "reason",
                              paused ? r->paused_reason : NULL, "review_step",
                              "plan_id", "cycle", (json_int_t)0, "schedule", r->schedule,
                              "fired_at", r->fired_at);
        json_object_set_new(o, "started_at", history_ms_json(r->created_ms));
        json_object_set_new(o, "ended_at", history_ms_json(r->ended_ms));
        json_object_set_new(o, "duration_ms",
                            r->created_ms > 0 && r->ended_ms >= r->created_ms
                                    ? json_integer(r->ended_ms - r->created_ms)
                                    : json_null());
        set_owner(o, r->owner, r->epoch);
        return o;
}

/* The rows of the database merged with this node's own (richer: status,
 * reason, cycle, times), newest first, then the filters, cursor and limit
 * as history_list applies them. */
static void list_done(void *arg)
{
        struct list_job *j = arg;
        struct daemon *d = j->d;
        json_t *local = NULL, *res = NULL, *dbrows = NULL;
        struct merged *v = NULL;
        if (j->err) {
                op_reply_error(&j->to, "cluster_unavailable",
                               "cannot read the mandates of the cluster: %s", j->errmsg);
                goto out;
        }
        const struct mandate *after_m = j->after ? known_here(d, j->after) : NULL;
        if (j->after && !after_m && !j->after_found) {
                op_reply_error(&j->to, "not_found", "args.after: no mandate %s (pruned?)",
                               j->after);
                goto out;
        }
        int64_t after_ms = after_m ? key_ms(after_m->fired_at) : j->after_ms;
        struct history_filter lf = j->f;
        lf.after = NULL;   /* the cut is made below, on both */
        if (history_list(d, &lf, 0, &local) < 0)
                goto oom;
        json_t *lrows = json_object_get(local, "mandates");
        size_t cap = json_array_size(lrows) + j->nrows, n = 0;
        v = cap ? calloc(cap, sizeof(*v)) : NULL;
        if (cap && !v)
                goto oom;
        size_t i;
        json_t *row;
        json_array_foreach(lrows, i, row) {
                const char *id = json_string_value(json_object_get(row, "id"));
                struct mandate *m = id ? known_here(d, id) : NULL;
                if (!m)
                        continue;   /* dropped: the database's row says */
                int64_t ms = key_ms(m->fired_at);
                if (j->after && (ms > after_ms || (ms == after_ms && strcmp(id, j->after) >= 0)))
                        continue;
                set_owner(row, m->epoch > 0 ? cluster_node(d) : NULL, m->epoch);
                v[n++] = (struct merged){ ms, id, row };
        }
        size_t overridden = 0;
        dbrows = json_array();
        for (size_t k = 0; k < j->nrows; k++) {
                const struct pgstore_mandate_row *r = &j->rows[k];
                struct mandate *m = known_here(d, r->mandate_id);
                if (m) {
                        overridden++;
                        /* its owner and epoch as the database has them */
                        for (size_t x = 0; x < n; x++)
                                if (strcmp(v[x].id, r->mandate_id) == 0)
                                        set_owner(v[x].row, r->owner, r->epoch);
                        continue;
                }
                int64_t ms = r->fired_ms >= 0 ? r->fired_ms : r->created_ms;
                if (j->f.status >= 0 &&
                    strcmp(db_row_status(r), mandate_status_name(j->f.status)) != 0) {
                        overridden++;   /* running and runnable share the database's word */
                        continue;
                }
                if (j->db_uncut &&
                    (ms > after_ms || (ms == after_ms && strcmp(r->mandate_id, j->after) >= 0))) {
                        overridden++;   /* (not a row after the cursor) */
                        continue;
                }
                json_t *o = db_row_json(r);
                if (!o || json_array_append_new(dbrows, o) < 0)
                        goto oom;
                v[n++] = (struct merged){ ms, r->mandate_id, o };
        }
        if (n > 1)
                qsort(v, n, sizeof(*v), cmp_merged);
        size_t kept = n < j->limit || !j->limit ? n : j->limit;
        size_t nlocal = n - (j->nrows - overridden);
        size_t total = j->total >= overridden ? j->total - overridden + nlocal : n;
        if (total < n)
                total = n;
        /* nothing in the database nor here under that name, whatever the time */
        if (total == 0 && j->f.schedule && j->f.status < 0 && !j->f.since && !j->after &&
            history_schedule_unknown(d, j->f.schedule)) {
                op_reply_error(&j->to, "not_found", HISTORY_NO_SCHEDULE_FMT, j->f.schedule);
                json_decref(dbrows);
                goto out;
        }
        json_t *arr = json_array();
        for (size_t k = 0; k < kept; k++)
                json_array_append(arr, v[k].row);
        res = json_pack("{s:o, s:I, s:b}", "mandates", arr, "total", (json_int_t)total, "more",
                        total > kept);
        if (!res)
                goto oom;
        if (total > kept && kept)
                json_object_set_new(res, "next", json_string(v[kept - 1].id));
        json_decref(dbrows);
        op_reply_ok(&j->to, res);
        goto out;
oom:
        json_decref(dbrows);
        op_reply_error(&j->to, "internal", "out of memory");
out:
        free(v);
        json_decref(local);
        list_job_free(j);
}

static bool pg_list(struct daemon *d, const struct opreads_list *q, struct op_reply to)
{
        const struct history_filter *f = q->f;
        const char *after = q->after;
        struct list_job *j = calloc(1, sizeof(*j));
        if (!j)
                goto oom;
        j->d = d;
        j->to = to;
        j->f = *f;   /* (its strings are the request's: they live as long) */
        j->f.after = NULL;
        j->limit = q->limit;
        j->margin = strmap_size(d->mandates);
        if (f->status >= 0) {
                const char *st = db_status_of(f->status);
                j->skip_db = !st;
                if (st && !(j->status = strdup(st)))
                        goto oom;
        }
        if ((f->schedule && !(j->schedule = strdup(f->schedule))) ||
            (f->since && !(j->since = strdup(f->since))) || (after && !(j->after = strdup(after))))
                goto oom;
        if (cluster_submit(d, list_work, list_done, j) < 0)
                goto oom;
        return true;
oom:
        if (j)
                list_job_free(j);
        op_reply_error(&to, "internal", "out of memory");
        return true;
}

/* show of a mandate this node does not hold: its rows, folded. */
struct show_job {
        struct daemon *d;
        json_t *(*render)(const struct fold *f);
        opreads_show_cb cb;
        void *ctx;
        char *id;
        int err;
        char errmsg[256];
        struct pgstore_mandate_row *row;
        size_t nrow;
        json_t *result;    /* fold_json */
        json_t *calls;     /* step → tool calls, or NULL */
        char *review_step, *review_reason;
        char *plan_id;
        long long cycle;
        char *schedule, *fired_at, *retry_of, *started_at;
        long long retry;
        json_t *retried_by; /* its retries, from the database */
};

static void show_job_free(struct show_job *j)
{
        pgstore_mandate_rows_free(j->row, j->nrow);
        free(j->review_reason);
        json_decref(j->result);
        json_decref(j->calls);
        json_decref(j->retried_by);
        FREE_ALL(j->review_step, j->plan_id, j->schedule, j->fired_at, j->retry_of, j->started_at,
                 j->id, j);
}

static char *dup_or_null(const char *s)
{
        return s ? strdup(s) : NULL;
}

/* The retries of mandate id of the tick (schedule, fired_at) in the
 * database: every retry in cluster mode is made there (kairos_retry_create),
 * whichever node made it.  *ret NULL: no tick. */
static int tick_retries(struct pgstore *s, const char *schedule, const char *fired_at,
                        const char *id, json_t **ret)
{
        int64_t fired_ms;
        char **ids = NULL;
        size_t n = 0;
        *ret = NULL;
        if (!schedule || !fired_at || wal_parse_ts(fired_at, &fired_ms) < 0)
                return 0;
        int r = pgstore_tick_retries_of(s, schedule, fired_ms, id, &ids, &n);
        if (r < 0)
                return r;
        json_t *arr = json_array();
        for (size_t i = 0; arr && i < n; i++)
                json_array_append_new(arr, json_string(ids[i]));
        pgstore_strings_free(ids, n);
        *ret = arr;
        return arr ? 0 : -ENOMEM;
}

static void show_work(void *arg)
{
        struct show_job *j = arg;
        int r = 0;
        struct pgstore *s = cluster_thread_store_why(j->d, &r, j->errmsg, sizeof j->errmsg);
        struct kbuf b = KBUF_INIT;
        struct fold *f = NULL;
        struct pgstore_idem_row *calls = NULL;
        size_t ncalls = 0;
        if (!s) {
                j->err = r;
                return;
        }
        struct pgstore_mandate_filter mf = { .since_ms = -1, .mandate_id = j->id };
        int64_t nrows = 0;
        if ((r = pgstore_mandates_list(s, &mf, &j->row, &j->nrow, NULL)) < 0)
                goto db_fail;
        if (j->nrow != 1) {
                j->err = -ENOENT;
                return;
        }
        if ((r = pgstore_wal_read(s, j->id, &b, &nrows)) < 0)
                goto db_fail;
        if ((r = fold_buffer(b.data ? b.data : "", b.len, &f)) < 0) {
                j->err = r;
                snprintf(j->errmsg, sizeof j->errmsg, "cannot fold its rows: %s", strerror(-r));
                goto out;
        }
        j->result = j->render(f);
        for (size_t i = 0; i < f->nsteps; i++)
                if (f->steps[i].state == STEP_NEEDS_REVIEW && !j->review_step) {
                        j->review_step = dup_or_null(f->steps[i].step_id);
                        j->review_reason = dup_or_null(f->steps[i].reason);
                }
        if (f->nplans) {
                j->plan_id = dup_or_null(f->plans[f->nplans - 1].plan_id);
                j->cycle = f->plans[f->nplans - 1].cycle;
        }
        j->schedule = dup_or_null(f->mandate.schedule);
        j->fired_at = dup_or_null(f->mandate.fired_at);
        j->retry_of = dup_or_null(f->mandate.retry_of);
        j->retry = f->mandate.retry;
        j->started_at = dup_or_null(f->mandate.ts ? f->mandate.ts : f->first_ts);
        if ((r = tick_retries(s, j->schedule ? j->schedule : j->row[0].schedule,
                              j->fired_at ? j->fired_at : j->row[0].fired_at, j->id,
                              &j->retried_by)) < 0)
                goto db_fail;
        /* each step's tool calls, from the database */
        if (pgstore_idem_of_mandate(s, j->id, &calls, &ncalls) == 0) {
                j->calls = json_object();
                for (size_t i = 0; i < ncalls; i++) {
                        const struct pgstore_idem_row *c = &calls[i];
                        if (!c->step_id)
                                continue;
                        json_t *arr = json_object_get(j->calls, c->step_id);
                        if (!arr) {
                                arr = json_array();
                                if (json_object_set_new(j->calls, c->step_id, arr) < 0)
                                        break;
                        }
                        bool finished = strcmp(c->state, "completed") == 0 ||
                                        strcmp(c->state, "failed") == 0;
                        json_array_append_new(
                                arr, json_pack("{s:s, s:s, s:s, s:I, s:o, s:o}", "key", c->key,
                                               "tool", c->tool, "state", c->state, "attempt",
                                               (json_int_t)c->attempt, "started",
                                               history_ms_json(c->created_ms), "finished",
                                               finished ? history_ms_json(c->updated_ms)
                                                        : json_null()));
                }
        }
        goto out;
db_fail:
        j->err = r;
        cluster_thread_failed(s, r, j->errmsg, sizeof j->errmsg);
out:
        pgstore_idem_rows_free(calls, ncalls);
        fold_free(f);
        kbuf_free(&b);
}

/* A database job on mandate id that failed (err), answered through to:
 * not_found, or cluster_unavailable "cannot WHAT mandate ID: WHY". */
static bool job_failed(struct op_reply *to, int err, const char *id, const char *what,
                       const char *why)
{
        if (err == -ENOENT)
                op_reply_error(to, "not_found", "no mandate %s", id);
        else if (err)
                op_reply_error(to, "cluster_unavailable", "cannot %s mandate %s: %s", what, id,
                               why);
        return err != 0;
}

static void show_error(void *ctx, const struct op_result *r)
{
        struct show_job *j = ctx;
        j->cb(j->ctx, r, NULL);
}

static void show_done(void *arg)
{
        struct show_job *j = arg;
        struct op_reply to = { .done = show_error, .ctx = j };
        if (job_failed(&to, j->err ? j->err : j->result ? 0 : -ENOMEM, j->id, "read",
                       j->err ? j->errmsg : "out of memory"))
                goto out;
        const struct pgstore_mandate_row *r = &j->row[0];
        /* a paused mandate with a step under review is what its owner
         * called paused_review */
        const char *status = db_row_status(r);
        if (strcmp(r->status, "paused") == 0 && j->review_step)
                status = mandate_status_name(MANDATE_PAUSED_REVIEW);
        bool review = strcmp(status, "paused_review") == 0;
        json_t *mj = json_pack("{s:s, s:s, s:s?, s:s?, s:s?, s:I, s:s?, s:o}", "id", r->mandate_id,
                               "status", status, "reason", review ? j->review_reason : NULL,
                               "review_step", review ? j->review_step : NULL,
                               "plan_id", j->plan_id, "cycle", (json_int_t)j->cycle, "schedule",
                               j->schedule ? j->schedule : r->schedule, "fired_at",
                               str_or_null(j->fired_at ? j->fired_at : r->fired_at));
        json_object_set_new(mj, "started_at", str_or_null(j->started_at));
        json_object_set_new(mj, "ended_at", history_ms_json(r->ended_ms));
        if (j->retry_of && j->retry >= 1) {
                json_object_set_new(mj, "retry_of", json_string(j->retry_of));
                json_object_set_new(mj, "retry", json_integer(j->retry));
        }
        json_object_set_new(mj, "retried_by",
                            j->retried_by ? json_incref(j->retried_by) : json_array());
        set_owner(mj, r->owner, r->epoch);
        json_object_update_missing(j->result, mj);
        json_decref(mj);
        j->cb(j->ctx, &(struct op_result){ .result = j->result }, j->calls);
        j->result = NULL;
out:
        show_job_free(j);
}

static int pg_show(struct daemon *d, const char *id, json_t *(*render)(const struct fold *f),
                   opreads_show_cb cb, void *ctx)
{
        struct show_job *j = calloc(1, sizeof(*j));
        if (!j || !(j->id = strdup(id))) {
                free(j);
                return -ENOMEM;
        }
        j->d = d;
        j->render = render;
        j->cb = cb;
        j->ctx = ctx;
        if (cluster_submit(d, show_work, show_done, j) < 0) {
                show_job_free(j);
                return -ENOMEM;
        }
        return 0;
}

/* resolve, approve, resume, cancel of a mandate this node does not hold:
 * take it (then the command runs again, on a mandate of this node). */
struct take_job {
        opreads_take_cb cb;
        void *ctx;
};

static void taken(void *ctx, struct mandate *m, int err, const char *detail)
{
        struct take_job t = *(struct take_job *)ctx;
        (void)m;
        free(ctx);
        if (err == -EALREADY)
                detail = detail && *detail ? db_status_name(detail) : "ended";
        t.cb(t.ctx, err, detail);
}

static int pg_take(struct daemon *d, const char *id, opreads_take_cb cb, void *ctx)
{
        struct take_job *t = malloc(sizeof(*t));
        if (!t)
                return -ENOMEM;
        *t = (struct take_job){ cb, ctx };
        if (cluster_take(d, id, taken, t) < 0) {
                free(t);
                return -ENOMEM;
        }
        return 0;
}

/* retry in cluster mode: the tick's highest retry number in the database
 * (another node may have made retries this one does not know), and for a
 * mandate this node does not hold, its row (tick and status).  The tick's
 * rule is then judged on the loop over what this node holds, and by the
 * database when it creates the retry (kairos_retry_create). */
struct retry_job {
        struct daemon *d;
        opreads_tick_cb cb;
        void *ctx;
        char *id;
        bool remote;
        char *schedule, *fired_at, *status;  /* remote: its row's */
        int last;
        int err;
        char errmsg[256];
};

static void retry_job_free(struct retry_job *j)
{
        FREE_ALL(j->id, j->schedule, j->fired_at, j->status, j);
}

static void retry_work(void *arg)
{
        struct retry_job *j = arg;
        int r = 0;
        struct pgstore *s = cluster_thread_store_why(j->d, &r, j->errmsg, sizeof j->errmsg);
        struct pgstore_mandate_row *row = NULL;
        size_t nrow = 0;
        int64_t fired_ms;
        if (!s) {
                j->err = r;
                return;
        }
        if (j->remote) {
                struct pgstore_mandate_filter mf = { .since_ms = -1, .mandate_id = j->id };
                if ((r = pgstore_mandates_list(s, &mf, &row, &nrow, NULL)) < 0)
                        goto db_fail;
                if (nrow != 1) {
                        j->err = -ENOENT;
                        goto out;
                }
                j->schedule = dup_or_null(row[0].schedule);
                j->fired_at = dup_or_null(row[0].fired_at);
                j->status = dup_or_null(row[0].status);
                if (!j->status) {
                        j->err = -ENOMEM;
                        snprintf(j->errmsg, sizeof j->errmsg, "out of memory");
                        goto out;
                }
        }
        /* (a mandate of this node: its tick was copied on the loop) */
        if (j->schedule && j->fired_at && wal_parse_ts(j->fired_at, &fired_ms) == 0 &&
            (r = pgstore_tick_last_retry(s, j->schedule, fired_ms, &j->last)) < 0)
                goto db_fail;
        goto out;
db_fail:
        j->err = r;
        cluster_thread_failed(s, r, j->errmsg, sizeof j->errmsg);
out:
        pgstore_mandate_rows_free(row, nrow);
}

static void retry_error(void *ctx, const struct op_result *r)
{
        struct retry_job *j = ctx;
        j->cb(j->ctx, r, NULL);
}

static void retry_done(void *arg)
{
        struct retry_job *j = arg;
        struct op_reply to = { .done = retry_error, .ctx = j };
        if (job_failed(&to, j->err, j->id, "retry", j->errmsg))
                goto out;
        struct opreads_tick t = { .id = j->id, .last = j->last };
        if (j->remote) {
                bool unfinished = strcmp(j->status, "running") == 0 ||
                                  strcmp(j->status, "paused") == 0;
                t = (struct opreads_tick){
                        .id = j->id, .remote = true, .schedule = j->schedule, .fired_at = j->fired_at,
                        .status = db_status_name(j->status), .ended = !unfinished,
                        .done = strcmp(j->status, "succeeded") == 0, .last = j->last,
                };
        }
        j->cb(j->ctx, NULL, &t);
out:
        retry_job_free(j);
}

static int pg_tick(struct daemon *d, const char *id, bool remote, const char *schedule,
                   const char *fired_at, opreads_tick_cb cb, void *ctx)
{
        struct retry_job *j = calloc(1, sizeof(*j));
        if (!j || !(j->id = strdup(id)) ||
            (!remote && ((schedule && !(j->schedule = strdup(schedule))) ||
                         (fired_at && !(j->fired_at = strdup(fired_at))))))
                goto oom;
        j->d = d;
        j->cb = cb;
        j->ctx = ctx;
        j->remote = remote;
        if (cluster_submit(d, retry_work, retry_done, j) < 0)
                goto oom;
        return 0;
oom:
        if (j)
                retry_job_free(j);
        return -ENOMEM;
}

/* retry --from of a mandate no node here holds: its rows, folded (they
 * are final: only a mandate that ended is retried, and the retry is
 * created compare-and-set in the database). */
struct fold_job {
        struct daemon *d;
        opreads_fold_cb cb;
        void *ctx;
        char *id;
        int err;
        char errmsg[256];
        struct fold *f;
};

static void fold_work(void *arg)
{
        struct fold_job *j = arg;
        int r = 0;
        struct pgstore *s = cluster_thread_store_why(j->d, &r, j->errmsg, sizeof j->errmsg);
        struct kbuf b = KBUF_INIT;
        int64_t nrows = 0;
        if (!s) {
                j->err = r;
                return;
        }
        if ((r = pgstore_wal_read(s, j->id, &b, &nrows)) < 0) {
                j->err = r;
                cluster_thread_failed(s, r, j->errmsg, sizeof j->errmsg);
        } else if (nrows == 0) {
                j->err = -ENOENT;
        } else if ((r = fold_buffer(b.data ? b.data : "", b.len, &j->f)) < 0) {
                j->err = r;
                snprintf(j->errmsg, sizeof j->errmsg, "cannot fold its rows: %s", strerror(-r));
        }
        kbuf_free(&b);
}

static void fold_done(void *arg)
{
        struct fold_job *j = arg;
        j->cb(j->ctx, j->err, j->errmsg, j->err ? NULL : j->f);
        if (j->err)
                fold_free(j->f);
        free(j->id);
        free(j);
}

static int pg_fold(struct daemon *d, const char *id, opreads_fold_cb cb, void *ctx)
{
        struct fold_job *j = calloc(1, sizeof(*j));
        if (!j || !(j->id = strdup(id))) {
                free(j);
                return -ENOMEM;
        }
        j->d = d;
        j->cb = cb;
        j->ctx = ctx;
        if (cluster_submit(d, fold_work, fold_done, j) < 0) {
                free(j->id);
                free(j);
                return -ENOMEM;
        }
        return 0;
}

/* show of a mandate held here: its retries in the database (a retry of it
 * another node made is not in this node's history). */
struct retries_job {
        struct daemon *d;
        opreads_retries_cb cb;
        void *ctx;
        char *id, *schedule, *fired_at;
        int err;
        json_t *ids;
};

static void retries_work(void *arg)
{
        struct retries_job *j = arg;
        int r = 0;
        struct pgstore *s = cluster_thread_store(j->d, &r);
        if (!s) {
                j->err = r;
                return;
        }
        if ((j->err = tick_retries(s, j->schedule, j->fired_at, j->id, &j->ids)) < 0)
                cluster_thread_failed(s, j->err, NULL, 0);
}

static void retries_done(void *arg)
{
        struct retries_job *j = arg;
        j->cb(j->ctx, j->err ? NULL : j->ids);
        json_decref(j->ids);
        FREE_ALL(j->id, j->schedule, j->fired_at, j);
}

static int pg_retried_by(struct daemon *d, const struct mandate *m, opreads_retries_cb cb,
                         void *ctx)
{
        struct retries_job *j = calloc(1, sizeof(*j));
        if (!j || !(j->id = strdup(m->id)) || (m->schedule && !(j->schedule = strdup(m->schedule))) ||
            (m->fired_at && !(j->fired_at = strdup(m->fired_at))))
                goto oom;
        j->d = d;
        j->cb = cb;
        j->ctx = ctx;
        if (cluster_submit(d, retries_work, retries_done, j) < 0)
                goto oom;
        return 0;
oom:
        if (j) {
                FREE_ALL(j->id, j->schedule, j->fired_at, j);
        }
        return -ENOMEM;
}

/* ---- the driver ---- */

static bool pg_counts(const struct mandate *m)
{
        return !cluster_dropped(m);
}

static void pg_owner(struct daemon *d, const struct mandate *m, json_t *mj)
{
        json_object_set_new(mj, "node", m->epoch > 0 ? json_string(cluster_node(d)) : json_null());
        json_object_set_new(mj, "epoch", m->epoch > 0 ? json_integer(m->epoch) : json_null());
}

const struct opreads opreads_postgres = {
        .name = "postgres",
        .others = true,
        .holds = pg_holds,
        .counts = pg_counts,
        .retry_creating = cluster_retry_creating,
        .status = cluster_status,
        .owner = pg_owner,
        .list = pg_list,
        .show = pg_show,
        .take = pg_take,
        .tick = pg_tick,
        .fold = pg_fold,
        .retried_by = pg_retried_by,
};
