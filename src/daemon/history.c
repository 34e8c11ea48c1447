/* SPDX-License-Identifier: MIT */
/* History: `list` served from the mandate registry (newest first, filters,
 * a limit and a cursor, no sort of the whole registry: the first rows are
 * picked with a bounded heap), MANDATE prefixes, and the retention of
 * finished mandates (KeepFinished=, KeepFinishedSec=): their summaries and
 * archives are removed on the thread pool. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chronos.h"
#include "daemon.h"
#include "kairos/kio.h"
#include "kairos/planner.h"
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

/* Newest first: fired_at descending (none: oldest), then id descending.
 * < 0: a comes before b. */
static int order(const struct mandate *a, const struct mandate *b)
{
        if (a->fired_key >= 0 && b->fired_key >= 0 && a->fired_key != b->fired_key)
                return a->fired_key < b->fired_key ? 1 : -1;
        const char *fa = a->fired_at ? a->fired_at : "", *fb = b->fired_at ? b->fired_at : "";
        int c = strcmp(fb, fa);
        return c ? c : strcmp(b->id, a->id);
}

static bool matches(const struct history_filter *f, const struct mandate *m)
{
        if (f->status >= 0 && (int)m->status != f->status)
                return false;
        if (f->schedule && (!m->schedule || strcmp(m->schedule, f->schedule) != 0))
                return false;
        if (f->since && (!m->fired_at || strcmp(m->fired_at, f->since) < 0))
                return false;
        if (f->after && order(m, f->after) <= 0)
                return false;
        return true;
}

/* A max-heap on `order`: the root is the last of the rows kept. */
static void sift_down(const struct mandate **h, size_t n, size_t i)
{
        for (;;) {
                size_t l = 2 * i + 1, r = l + 1, big = i;
                if (l < n && order(h[l], h[big]) > 0)
                        big = l;
                if (r < n && order(h[r], h[big]) > 0)
                        big = r;
                if (big == i)
                        return;
                const struct mandate *t = h[i];
                h[i] = h[big];
                h[big] = t;
                i = big;
        }
}

static void sift_up(const struct mandate **h, size_t i)
{
        while (i > 0) {
                size_t p = (i - 1) / 2;
                if (order(h[i], h[p]) <= 0)
                        return;
                const struct mandate *t = h[i];
                h[i] = h[p];
                h[p] = t;
                i = p;
        }
}

static int cmp_order(const void *a, const void *b)
{
        return order(*(const struct mandate *const *)a, *(const struct mandate *const *)b);
}

static json_t *ms_json(int64_t ms)
{
        if (ms <= 0)
                return json_null();
        char ts[32];
        wal_format_ts(ms, ts);
        return json_string(ts);
}

static json_t *row_json(const struct mandate *m)
{
        json_t *o = json_pack("{s:s, s:s, s:s?, s:s?, s:s?, s:I, s:s?, s:s?}", "id", m->id,
                              "status", mandate_status_name(m->status), "reason", m->reason,
                              "review_step", m->review_step, "plan_id", m->plan_id, "cycle",
                              (json_int_t)m->cycle, "schedule", m->schedule, "fired_at",
                              m->fired_at);
        json_object_set_new(o, "started_at", ms_json(m->started_ms));
        json_object_set_new(o, "ended_at", ms_json(m->ended_ms));
        json_object_set_new(o, "duration_ms",
                            m->started_ms > 0 && m->ended_ms >= m->started_ms
                                    ? json_integer(m->ended_ms - m->started_ms)
                                    : json_null());
        return o;
}

int history_list(struct daemon *d, const struct history_filter *f, size_t limit,
                 json_t **ret_result)
{
        size_t n = strmap_size(d->mandates);
        size_t cap = limit && limit < n ? limit : n;
        const struct mandate **h = calloc(cap ? cap : 1, sizeof(*h));
        if (!h)
                return -ENOMEM;
        size_t kept = 0, total = 0, pos = 0;
        const char *k;
        void *v;
        while (strmap_next(d->mandates, &pos, &k, &v) == 0) {
                const struct mandate *m = v;
                if (!matches(f, m))
                        continue;
                total++;
                if (kept < cap) {
                        h[kept] = m;
                        sift_up(h, kept++);
                } else if (kept && order(m, h[0]) < 0) {
                        h[0] = m;
                        sift_down(h, kept, 0);
                }
        }
        qsort(h, kept, sizeof(*h), cmp_order);
        json_t *arr = json_array();
        for (size_t i = 0; i < kept; i++)
                json_array_append_new(arr, row_json(h[i]));
        json_t *res = json_pack("{s:o, s:I, s:b}", "mandates", arr, "total", (json_int_t)total,
                                "more", total > kept);
        if (total > kept && kept)
                json_object_set_new(res, "next", json_string(h[kept - 1]->id));
        free(h);
        if (!res)
                return -ENOMEM;
        *ret_result = res;
        return 0;
}

/* ---- retention ---- */

struct prune_job {
        uv_work_t req;
        struct daemon *d;
        char **paths;            /* summaries and archives, in that order per mandate */
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
} hist;

static int cmp_ended_desc(const void *a, const void *b)
{
        const struct mandate *x = *(const struct mandate *const *)a;
        const struct mandate *y = *(const struct mandate *const *)b;
        int64_t ex = x->ended_ms ? x->ended_ms : x->started_ms;
        int64_t ey = y->ended_ms ? y->ended_ms : y->started_ms;
        if (ex != ey)
                return ex > ey ? -1 : 1;
        return order(x, y);
}

static void prune_work(uv_work_t *w)
{
        struct prune_job *j = w->data;
        const struct kio *io = kio_posix();
        for (size_t i = 0; i < j->npaths; i++) {
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
        /* one directory sync each, for the whole batch */
        io->fsync_dir(io->ctx, j->d->paths.mandates);
        io->fsync_dir(io->ctx, j->d->paths.archive);
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
        free(j->paths);
        free(j->error_path);
        free(j);
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
        int64_t now_ms = chronos_now(d) * 1000;
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
                /* the summary first: it is what registers the mandate at start */
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

void history_finished(struct mandate *m)
{
        struct daemon *d = m->d;
        if (d->ready && !d->stopping && d->cfg->keep_finished)
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
