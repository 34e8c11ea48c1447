/* SPDX-License-Identifier: MIT */
/* History: `list` served from the registry's ordered index (mandate.c:
 * newest first, filters, a limit and a cursor found by binary search: the
 * first page costs its rows, not the registry), MANDATE prefixes, and the retention of
 * finished mandates (KeepFinished=, KeepFinishedSec=): their summaries and
 * archives are removed on the thread pool. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chronos.h"
#include "daemon.h"
#include "kairos/kio.h"
#include "kairos/kmem.h"
#include "kairos/planner.h"
#include "kairos/showdoc.h"
#include "kairos/wal.h"
#include "log.h"

#define RETENTION_PERIOD_MS (60 * 1000)

static bool finished(const struct mandate *m)
{
        return m->archived && (m->status == MANDATE_DONE || m->status == MANDATE_FAILED ||
                               m->status == MANDATE_TERMINATED || m->status == MANDATE_ABANDONED);
}

/* ---- prefixes ---- */

int history_resolve(struct daemon *d, const char *arg, struct mandate **ret,
                    const struct mandate **ret_candidates, size_t max)
{
        *ret = NULL;
        if (!arg || !*arg)
                return -ENOENT;
        struct mandate *m = mandate_find(d, arg);
        if (m) {
                *ret = m;
                return 0;
        }
        size_t len = strlen(arg), found = 0, pos = 0;
        const char *k;
        void *v;
        while (strmap_next(d->mandates, &pos, &k, &v) == 0) {
                if (strncmp(k, arg, len) != 0)
                        continue;
                if (found < max)
                        ret_candidates[found] = v;
                if (found++ == 0)
                        *ret = v;
        }
        if (found < max)
                ret_candidates[found] = NULL;
        else if (max)
                ret_candidates[max - 1] = NULL;
        if (found == 0)
                return -ENOENT;
        if (found > 1) {
                *ret = NULL;
                return -EEXIST;
        }
        return 0;
}

/* ---- list ---- */

void history_row(const struct mandate *m, struct showdoc_mandate *ret)
{
        *ret = (struct showdoc_mandate){
                .id = m->id, .status = mandate_status_name(m->status), .reason = m->reason,
                .review_step = m->review_step, .plan_id = m->plan_id, .cycle = m->cycle,
                .schedule = m->schedule, .fired_at = m->fired_at, .fired_key = m->fired_key,
                .started_ms = m->started_ms, .ended_ms = m->ended_ms, .down_ms = m->down_ms,
                .retry_of = m->retry_of, .retry = m->retry,
        };
}

static void row_at(void *ctx, size_t i, struct showdoc_mandate *ret)
{
        struct mandate *const *v = ctx;
        history_row(v[i], ret);
}

int history_rows(struct daemon *d, struct showdoc_rows *ret)
{
        struct mandate *const *v;
        size_t n;
        int r = mandates_ordered(d, &v, &n);
        if (r < 0)
                return r;
        *ret = (struct showdoc_rows){ .n = n, .get = row_at, .ctx = (void *)v };
        return 0;
}

json_t *history_ms_json(int64_t ms)
{
        return showdoc_ms_json(ms);
}

json_t *history_mandate_json(const struct mandate *m)
{
        struct showdoc_mandate row;
        history_row(m, &row);
        return showdoc_mandate_json(&row);
}

int history_list(struct daemon *d, const struct history_filter *filter, size_t limit,
                 json_t **ret_result)
{
        struct showdoc_rows rows;
        int r = history_rows(d, &rows);
        if (r < 0)
                return r;
        struct showdoc_mandate after;
        if (filter->after)
                history_row(filter->after, &after);
        struct showdoc_filter f = {
                .status = filter->status >= 0 ? mandate_status_name(filter->status) : NULL,
                .schedule = filter->schedule, .since = filter->since,
                .after = filter->after ? &after : NULL,
        };
        return showdoc_list(&rows, &f, limit, ret_result);
}

/* ---- retention ---- */

struct prune_job {
        uv_work_t req;
        struct daemon *d;
        char **paths;            /* per mandate its summary, then its archive */
        size_t npaths;
        size_t by_count, by_age;
        size_t removed, errors;
        int first_error;
        char *error_path;
};

static struct {
        uv_timer_t timer;
        bool started;
        bool running;            /* a prune job is on the pool */
        bool again;              /* asked for while one ran */
        /* No finished mandate ended before oldest_ms: exact after each
         * scan, lowered as mandates finish, so a bound. */
        int64_t oldest_ms;
        bool oldest_known;
} hist;

static int cmp_ended_desc(const void *a, const void *b)
{
        const struct mandate *x = *(const struct mandate *const *)a;
        const struct mandate *y = *(const struct mandate *const *)b;
        int64_t ex = x->ended_ms ? x->ended_ms : x->started_ms;
        int64_t ey = y->ended_ms ? y->ended_ms : y->started_ms;
        if (ex != ey)
                return ex > ey ? -1 : 1;
        return mandate_order(x, y);
}

static void prune_unlink(struct prune_job *j, const struct kio *io, size_t first)
{
        for (size_t i = first; i < j->npaths; i += 2) {
                int r = io->unlink(io->ctx, j->paths[i]);
                if (r == 0 || r == -ENOENT) {
                        j->removed += r == 0;
                        continue;
                }
                if (j->errors++ == 0) {
                        j->first_error = r;
                        j->error_path = strdup(j->paths[i]);
                }
        }
}

/* The archives go first, durably, then the summaries (one directory sync
 * each for the whole batch).  A crash in between leaves summaries whose
 * archives are gone: they register their mandates at the next start, beyond
 * retention still, and the next prune removes them.  The other order would
 * leave archives that no summary registers, which nothing would remove. */
static void prune_work(uv_work_t *w)
{
        struct prune_job *j = w->data;
        const struct kio *io = kio_posix();
        prune_unlink(j, io, 1);
        io->fsync_dir(io->ctx, j->d->paths.archive);
        prune_unlink(j, io, 0);
        io->fsync_dir(io->ctx, j->d->paths.mandates);
}

static void prune_start(struct daemon *d);

static void prune_done(uv_work_t *w, int status)
{
        (void)status;
        struct prune_job *j = w->data;
        struct daemon *d = j->d;
        log_event(j->errors ? LOG_WARNING : LOG_INFO, NULL, NULL, 0,
                  "retention: pruned %zu finished mandates (%zu beyond KeepFinished=%u, %zu older "
                  "than KeepFinishedSec=%llu): %zu files removed%s%s%s",
                  j->by_count + j->by_age, j->by_count, d->cfg->keep_finished, j->by_age,
                  (unsigned long long)d->cfg->keep_finished_sec, j->removed,
                  j->errors ? "; cannot remove " : "", j->errors ? j->error_path : "",
                  j->errors ? strerror(-j->first_error) : "");
        for (size_t i = 0; i < j->npaths; i++)
                free(j->paths[i]);
        FREE_ALL(j->paths, j->error_path, j);
        hist.running = false;
        if (hist.again && !d->stopping) {
                hist.again = false;
                prune_start(d);
        }
}

/* Pick the victims on the loop (they leave the registry at once), remove
 * their files on the pool. */
static void prune_start(struct daemon *d)
{
        if (hist.running) {
                hist.again = true;
                return;
        }
        unsigned keep = d->cfg->keep_finished;
        uint64_t keep_sec = d->cfg->keep_finished_sec;
        if (!keep && !keep_sec)
                return;
        size_t n = 0, cap = 0, pos = 0;
        struct mandate **all = NULL;
        const char *k;
        void *v;
        int64_t now_ms = clock_now(d) * 1000;
        int64_t cutoff = keep_sec ? now_ms - (int64_t)keep_sec * 1000 : INT64_MIN;
        /* First a count and the oldest end, without sorting: mostly nothing
         * is due, and a mandate's end must not cost a sort of the history. */
        size_t nfinished = 0;
        int64_t oldest = INT64_MAX;
        while (strmap_next(d->mandates, &pos, &k, &v) == 0) {
                const struct mandate *m = v;
                if (!finished(m))
                        continue;
                nfinished++;
                int64_t e = m->ended_ms ? m->ended_ms : m->started_ms;
                if (e > 0 && e < oldest)
                        oldest = e;
        }
        hist.oldest_ms = oldest;
        hist.oldest_known = true;
        if ((!keep || nfinished <= keep) && (!keep_sec || oldest >= cutoff))
                return;
        pos = 0;
        while (strmap_next(d->mandates, &pos, &k, &v) == 0) {
                struct mandate *m = v;
                if (!finished(m))
                        continue;
                if (n == cap) {
                        size_t nc = cap ? cap * 2 : 256;
                        struct mandate **na = realloc(all, nc * sizeof(*na));
                        if (!na)
                                goto out;
                        all = na;
                        cap = nc;
                }
                all[n++] = m;
        }
        size_t start = keep && n > keep ? keep : n;
        /* beyond the count, or older than the age (from the newest on) */
        if (n > 1)
                qsort(all, n, sizeof(*all), cmp_ended_desc);
        for (size_t i = 0; i < start; i++) {
                int64_t e = all[i]->ended_ms ? all[i]->ended_ms : all[i]->started_ms;
                if (keep_sec && e > 0 && e < cutoff) {
                        start = i;
                        break;
                }
        }
        if (start >= n)
                goto out;
        struct prune_job *j = calloc(1, sizeof(*j));
        if (!j || !(j->paths = calloc(2 * (n - start), sizeof(char *)))) {
                free(j);
                goto out;
        }
        j->d = d;
        j->req.data = j;
        for (size_t i = start; i < n; i++) {
                struct mandate *m = all[i];
                char *summary = NULL;
                if (m->busy || statedir_summary_path(&d->paths, m->id, &summary) < 0)
                        continue;
                char *archive = strdup(m->wal_path);
                if (!archive || mandate_remove(m) < 0) {
                        free(summary);
                        free(archive);
                        continue;
                }
                /* even: summaries, odd: archives (see prune_work) */
                j->paths[j->npaths++] = summary;
                j->paths[j->npaths++] = archive;
                if (keep && i >= keep)
                        j->by_count++;
                else
                        j->by_age++;
        }
        hist.running = true;
        if (uv_queue_work(d->loop, &j->req, prune_work, prune_done) < 0) {
                hist.running = false;
                for (size_t i = 0; i < j->npaths; i++)
                        free(j->paths[i]);
                free(j->paths);
                free(j);
        }
        daemon_update_status(d);
out:
        free(all);
}

static void on_timer(uv_timer_t *t)
{
        struct daemon *d = t->data;
        if (!d->stopping)
                prune_start(d);
}

/* Nothing is due if no more mandates have a finished status than are kept
 * (the archived ones, which the scan counts, are fewer) and none ended
 * before the cutoff: a mandate's end then costs no scan of the registry. */
static bool nothing_due(struct daemon *d)
{
        if (!hist.oldest_known)
                return false;
        const unsigned *c = d->status_count;
        size_t nfinished = (size_t)c[MANDATE_DONE] + c[MANDATE_FAILED] + c[MANDATE_TERMINATED] +
                           c[MANDATE_ABANDONED];
        uint64_t keep_sec = d->cfg->keep_finished_sec;
        int64_t cutoff = keep_sec ? clock_now(d) * 1000 - (int64_t)keep_sec * 1000 : INT64_MIN;
        unsigned keep = d->cfg->keep_finished;
        return (!keep || nfinished <= keep) && (!keep_sec || hist.oldest_ms >= cutoff);
}

void history_finished(struct mandate *m)
{
        struct daemon *d = m->d;
        int64_t e = m->ended_ms ? m->ended_ms : m->started_ms;
        if (e > 0 && e < hist.oldest_ms)
                hist.oldest_ms = e;
        if (d->ready && !d->stopping && d->cfg->keep_finished && !nothing_due(d))
                prune_start(d);
}

void history_start(struct daemon *d)
{
        if (!hist.started) {
                uv_timer_init(d->loop, &hist.timer);
                hist.timer.data = d;
                hist.started = true;
                uv_timer_start(&hist.timer, on_timer, RETENTION_PERIOD_MS, RETENTION_PERIOD_MS);
        }
        prune_start(d);
}

void history_prune_now(struct daemon *d)
{
        prune_start(d);
}

void history_stop(struct daemon *d)
{
        (void)d;
        if (hist.started) {
                uv_timer_stop(&hist.timer);
                uv_close((uv_handle_t *)&hist.timer, NULL);
                hist.started = false;
        }
}

bool history_schedule_unknown(struct daemon *d, const char *name)
{
        if (config_find_schedule(d->cfg, name) || config_find_broken(d->cfg, name))
                return false;
        struct history_filter f = { .status = -1, .schedule = name };
        json_t *res = NULL;
        if (history_list(d, &f, 1, &res) < 0)
                return false;
        bool none = json_integer_value(json_object_get(res, "total")) == 0;
        json_decref(res);
        return none;
}
