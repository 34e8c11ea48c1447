/* SPDX-License-Identifier: MIT */
/* metrics: see metrics.h.  Counters are small tables of label pairs (linear
 * search: a few dozen rows); the number of rows is bounded, a row past the
 * bound is counted under the labels "other". */
#include "metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "daemon.h"
#include "idem_service.h"
#include "kairos/idem.h"
#include "kairos/kio.h"
#include "kairos/planner.h"
#include "log.h"
#include "opreads.h"

#define MSET_MAX_ROWS 512

struct mrow {
        char *l[3];
        uint64_t v;
};

/* A counter with two or three labels. */
struct mset {
        struct mrow *rows;
        size_t n, cap;
};

static const double handler_bounds[] = { 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
                                         120, 300, 600, 1800, 3600 };
#define HANDLER_NB (sizeof handler_bounds / sizeof handler_bounds[0])
static const double sync_bounds[] = { 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                      0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10 };
#define SYNC_NB (sizeof sync_bounds / sizeof sync_bounds[0])

struct metrics {
        struct daemon *d;
        double start_time;                 /* seconds since the epoch */
        struct mset fires, steps, verdicts, control;
        uint64_t handler_counts[PLANNER_PHASES][HANDLER_NB + 1];
        uint64_t handler_sum_us[PLANNER_PHASES];
        uint64_t retries[PLANNER_PHASES];  /* retry_wait records written */
        /* written by pool threads */
        _Atomic uint64_t sync_counts[SYNC_NB + 1];
        _Atomic uint64_t sync_sum_ns;
        struct kio io;
        struct wal_options walopt;
        /* MetricsFile= */
        uv_timer_t timer;
        struct serialq q;
        char *file;
        uint64_t interval_sec;
        bool started, stopped, writing;
        int last_error;                    /* of the last write, 0 = fine */
        char last_stage[16];
};

/* ---- counters ---- */

static void mset_free(struct mset *s)
{
        for (size_t i = 0; i < s->n; i++)
                for (int k = 0; k < 3; k++)
                        free(s->rows[i].l[k]);
        free(s->rows);
        *s = (struct mset){ 0 };
}

static bool same(const char *x, const char *y)
{
        return x && y ? strcmp(x, y) == 0 : x == y;
}

/* c is NULL for a counter with two labels. */
static void mset_inc(struct mset *s, const char *a, const char *b, const char *c)
{
        for (size_t i = 0; i < s->n; i++)
                if (same(s->rows[i].l[0], a) && same(s->rows[i].l[1], b) &&
                    same(s->rows[i].l[2], c)) {
                        s->rows[i].v++;
                        return;
                }
        if (s->n >= MSET_MAX_ROWS && strcmp(a, "other") != 0) {
                mset_inc(s, "other", "other", c ? "other" : NULL);
                return;
        }
        if (s->n == s->cap) {
                size_t cap = s->cap ? s->cap * 2 : 16;
                struct mrow *r = realloc(s->rows, cap * sizeof(*r));
                if (!r)
                        return;
                s->rows = r;
                s->cap = cap;
        }
        struct mrow row = { { strdup(a), strdup(b), c ? strdup(c) : NULL }, 1 };
        if (!row.l[0] || !row.l[1] || (c && !row.l[2])) {
                for (int k = 0; k < 3; k++)
                        free(row.l[k]);
                return;
        }
        s->rows[s->n++] = row;
}

void metrics_fire(struct metrics *mx, const char *schedule, bool manual)
{
        if (mx)
                mset_inc(&mx->fires, schedule ? schedule : "", manual ? "manual" : "timer", NULL);
}

void metrics_step(struct metrics *mx, int phase, enum wal_op op, uint64_t handler_started_us)
{
        if (!mx || phase < 0 || phase >= PLANNER_PHASES)
                return;
        const char *outcome = op == WAL_OP_COMPLETED ? "completed"
                              : op == WAL_OP_FAILED  ? "failed"
                                                     : "needs_review";
        mset_inc(&mx->steps, planner_phase_name((enum planner_phase)phase), outcome, NULL);
        if (!handler_started_us)
                return;
        uint64_t now = now_us_monotonic();
        uint64_t us = now > handler_started_us ? now - handler_started_us : 0;
        mx->handler_counts[phase][om_bucket_index(handler_bounds, HANDLER_NB, (double)us / 1e6)]++;
        mx->handler_sum_us[phase] += us;
}

void metrics_retry(struct metrics *mx, int phase)
{
        if (mx && phase >= 0 && phase < PLANNER_PHASES)
                mx->retries[phase]++;
}

static int render_retries(struct metrics *mx, enum om_format f, struct kbuf *out)
{
        int r = om_family(out, f, "kairos_step_retries", OM_COUNTER, NULL,
                          "Failed steps tried again (RetryAttempts=), by phase.");
        for (int i = 0; r >= 0 && i < PLANNER_PHASES; i++) {
                struct om_label l[] = { { "phase", planner_phase_name((enum planner_phase)i) } };
                r = om_sample_u64(out, "kairos_step_retries", OM_COUNTER, l, 1, mx->retries[i]);
        }
        return r;
}

void metrics_verdict(struct metrics *mx, const char *verdict, const char *source,
                     const char *reason)
{
        if (mx)
                mset_inc(&mx->verdicts, verdict ? verdict : "", source ? source : "",
                         reason ? reason : "");
}

void metrics_control(struct metrics *mx, const char *command, const char *code)
{
        if (mx)
                mset_inc(&mx->control, command ? command : "unknown", code ? code : "ok", NULL);
}

/* ---- fdatasync timing (pool threads) ---- */

static int timed_fdatasync(void *ctx, int fd)
{
        struct metrics *mx = ctx;
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        int r = kio_posix()->fdatasync(kio_posix()->ctx, fd);
        clock_gettime(CLOCK_MONOTONIC, &b);
        int64_t ns = (int64_t)(b.tv_sec - a.tv_sec) * 1000000000 + (b.tv_nsec - a.tv_nsec);
        if (ns < 0)
                ns = 0;
        atomic_fetch_add(&mx->sync_counts[om_bucket_index(sync_bounds, SYNC_NB, (double)ns / 1e9)],
                         1);
        atomic_fetch_add(&mx->sync_sum_ns, (uint64_t)ns);
        return r;
}

const struct wal_options *metrics_wal_options(struct metrics *mx)
{
        return mx ? &mx->walopt : NULL;
}

/* ---- rendering ---- */

/* names: the label names, NULL-terminated (two or three). */
static int render_mset(struct kbuf *out, enum om_format f, const char *name, const char *help,
                       const struct mset *s, const char *const *names)
{
        int r = om_family(out, f, name, OM_COUNTER, NULL, help);
        size_t n = names[2] ? 3 : 2;
        for (size_t i = 0; r >= 0 && i < s->n; i++) {
                struct om_label l[3];
                for (size_t k = 0; k < n; k++)
                        l[k] = (struct om_label){ names[k], s->rows[i].l[k] };
                r = om_sample_u64(out, name, OM_COUNTER, l, n, s->rows[i].v);
        }
        return r;
}

static int render_state(struct metrics *mx, enum om_format f, struct kbuf *out)
{
        struct daemon *d = mx->d;
        int r;
        struct om_label v[] = { { "version", KAIROS_VERSION } };
        if ((r = om_family(out, f, "kairos_build_info", OM_GAUGE, NULL,
                           "The version of kairosd running (always 1).")) < 0 ||
            (r = om_sample_u64(out, "kairos_build_info", OM_GAUGE, v, 1, 1)) < 0 ||
            (r = om_family(out, f, "kairos_process_start_time_seconds", OM_GAUGE, "seconds",
                           "When kairosd started, in seconds since the epoch.")) < 0 ||
            (r = om_sample_double(out, "kairos_process_start_time_seconds", OM_GAUGE, NULL, 0,
                                  mx->start_time)) < 0 ||
            (r = om_family(out, f, "kairos_ready", OM_GAUGE, NULL,
                           "1 once recovery is over and the control socket answers.")) < 0 ||
            (r = om_sample_u64(out, "kairos_ready", OM_GAUGE, NULL, 0, d->ready)) < 0)
                return r;
        unsigned counts[MANDATE__STATUS_MAX];
        mandates_count(d, counts);
        if ((r = om_family(out, f, "kairos_mandates", OM_GAUGE, NULL,
                           "Mandates known to kairosd, by status.")) < 0)
                return r;
        for (int s = 0; s < MANDATE__STATUS_MAX; s++) {
                struct om_label l[] = { { "status", mandate_status_name(s) } };
                if ((r = om_sample_u64(out, "kairos_mandates", OM_GAUGE, l, 1, counts[s])) < 0)
                        return r;
        }
        if ((r = om_family(out, f, "kairos_reviews_waiting", OM_GAUGE, NULL,
                           "Mandates paused until an operator resolves a step.")) < 0 ||
            (r = om_sample_u64(out, "kairos_reviews_waiting", OM_GAUGE, NULL, 0,
                               counts[MANDATE_PAUSED_REVIEW])) < 0 ||
            (r = om_family(out, f, "kairos_cycles_completed", OM_COUNTER, NULL,
                           "Plan cycles finished since kairosd started.")) < 0 ||
            (r = om_sample_u64(out, "kairos_cycles_completed", OM_COUNTER, NULL, 0,
                               d->cycles_completed)) < 0)
                return r;
        /* cluster mode: this node's clock against the database's */
        json_t *cl = d->opreads && d->opreads->status ? d->opreads->status(d) : NULL;
        json_t *off = json_object_get(json_object_get(cl, "clock_skew"), "offset_sec");
        if (json_is_number(off) &&
            ((r = om_family(out, f, "kairos_cluster_clock_offset_seconds", OM_GAUGE, "seconds",
                            "Cluster mode: this node's clock minus the database's, as of the "
                            "last heartbeat.")) < 0 ||
             (r = om_sample_double(out, "kairos_cluster_clock_offset_seconds", OM_GAUGE, NULL, 0,
                                   json_number_value(off))) < 0)) {
                json_decref(cl);
                return r;
        }
        /* cluster mode: the reviews released paused in the database, held by
         * no node (the same figure on every node: take max, not sum) */
        json_t *rw = json_object_get(cl, "reviews_waiting");
        if (json_is_integer(rw) &&
            ((r = om_family(out, f, "kairos_cluster_reviews_waiting", OM_GAUGE, NULL,
                            "Cluster mode: mandates paused for review that their node "
                            "released (any node resolves them), in the whole cluster, as of "
                            "the last heartbeat.")) < 0 ||
             (r = om_sample_u64(out, "kairos_cluster_reviews_waiting", OM_GAUGE, NULL, 0,
                                (uint64_t)json_integer_value(rw))) < 0)) {
                json_decref(cl);
                return r;
        }
        json_decref(cl);
        return 0;
}

static int render_histograms(struct metrics *mx, enum om_format f, struct kbuf *out)
{
        int r = om_family(out, f, "kairos_handler_duration_seconds", OM_HISTOGRAM, "seconds",
                          "Wall time of handler runs, from spawn to exit, by phase.");
        for (int p = 0; r >= 0 && p < PLANNER_PHASES; p++) {
                struct om_label l[] = { { "phase", planner_phase_name((enum planner_phase)p) } };
                struct om_histogram h = { handler_bounds, HANDLER_NB, mx->handler_counts[p],
                                          (double)mx->handler_sum_us[p] / 1e6 };
                r = om_histogram_samples(out, "kairos_handler_duration_seconds", l, 1, &h);
        }
        if (r < 0)
                return r;
        uint64_t counts[SYNC_NB + 1];
        for (size_t i = 0; i <= SYNC_NB; i++)
                counts[i] = atomic_load(&mx->sync_counts[i]);
        struct om_histogram h = { sync_bounds, SYNC_NB, counts,
                                  (double)atomic_load(&mx->sync_sum_ns) / 1e9 };
        if ((r = om_family(out, f, "kairos_wal_fdatasync_duration_seconds", OM_HISTOGRAM,
                           "seconds", "Latency of each fdatasync of a mandate's WAL.")) < 0)
                return r;
        return om_histogram_samples(out, "kairos_wal_fdatasync_duration_seconds", NULL, 0, &h);
}

static int render_idem(struct metrics *mx, enum om_format f, struct kbuf *out)
{
        struct idem_stats st;
        if (idem_service_stats(mx->d, &st) < 0)
                return 0; /* not loaded: nothing to say */
        int r;
        const char *results[] = { "hit", "miss", "conflict", "mismatch" };
        uint64_t vals[] = { st.hits, st.misses, st.conflicts, st.mismatches };
        if ((r = om_family(out, f, "kairos_idempotency_requests", OM_COUNTER, NULL,
                           "Idempotency store answers: hit (a finished entry answered), miss "
                           "(no live entry), conflict (in progress or interrupted), mismatch "
                           "(same key, other input).")) < 0)
                return r;
        for (size_t i = 0; i < 4; i++) {
                struct om_label l[] = { { "result", results[i] } };
                if ((r = om_sample_u64(out, "kairos_idempotency_requests", OM_COUNTER, l, 1,
                                       vals[i])) < 0)
                        return r;
        }
        if ((r = om_family(out, f, "kairos_idempotency_entries", OM_GAUGE, NULL,
                           "Entries in the idempotency store.")) < 0)
                return r;
        return om_sample_u64(out, "kairos_idempotency_entries", OM_GAUGE, NULL, 0, st.size);
}

int metrics_render(struct metrics *mx, enum om_format f, struct kbuf *out)
{
        if (!mx)
                return -EINVAL;
        int r;
        if ((r = render_state(mx, f, out)) < 0 ||
            (r = render_mset(out, f, "kairos_fires", "Mandates fired, by schedule and source "
                             "(timer: the schedule's clock; manual: kairosctl fire or retry).",
                             &mx->fires, (const char *const[]){ "schedule", "source", NULL })) < 0 ||
            (r = render_mset(out, f, "kairos_steps", "Steps ended, by phase and outcome.",
                             &mx->steps, (const char *const[]){ "phase", "outcome", NULL })) < 0 ||
            (r = render_retries(mx, f, out)) < 0 ||
            (r = render_mset(out, f, "kairos_recovery_verdicts",
                             "Recovery decisions about interrupted steps, by verdict, the source "
                             "of the evidence and the reason.",
                             &mx->verdicts,
                             (const char *const[]){ "verdict", "source", "reason", NULL })) < 0 ||
            (r = render_histograms(mx, f, out)) < 0 || (r = render_idem(mx, f, out)) < 0 ||
            (r = render_mset(out, f, "kairos_control_requests",
                             "Control requests answered, by command and reply code (ok or the "
                             "error code).",
                             &mx->control, (const char *const[]){ "command", "code", NULL })) < 0)
                return r;
        return om_end(out, f);
}

/* ---- MetricsFile= ---- */

struct mwrite {
        struct metrics *mx;
        char *path, *tmp;
        struct kbuf text;
        int error;
        const char *stage;
};

static void mwrite_free(struct mwrite *w)
{
        free(w->path);
        free(w->tmp);
        kbuf_free(&w->text);
        free(w);
}

/* Pool thread: a temporary file beside the target, then rename over it (the
 * textfile collector reads *.prom only, so it never sees the temporary).  No
 * fsync: losing the file in a crash costs one interval. */
static void mwrite_work(void *arg)
{
        struct mwrite *w = arg;
        /* A fresh file: never write through a link someone left there. */
        (void)unlink(w->tmp);
        int fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0) {
                w->error = -errno;
                w->stage = "create";
                return;
        }
        /* Readable by node_exporter's user whatever the umask (the unit's
         * is 0027). */
        if (fchmod(fd, 0644) < 0) {
                w->error = -errno;
                w->stage = "chmod";
        }
        size_t done = 0;
        while (!w->error && done < w->text.len) {
                ssize_t n = write(fd, w->text.data + done, w->text.len - done);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0) {
                        w->error = n < 0 ? -errno : -EIO;
                        w->stage = "write";
                        break;
                }
                done += (size_t)n;
        }
        if (close(fd) < 0 && !w->error) {
                w->error = -errno;
                w->stage = "write";
        }
        if (!w->error && rename(w->tmp, w->path) < 0) {
                w->error = -errno;
                w->stage = "rename";
        }
        if (w->error)
                unlink(w->tmp);
}

static void mwrite_done(void *arg)
{
        struct mwrite *w = arg;
        struct metrics *mx = w->mx;
        mx->writing = false;
        const char *stage = w->error ? w->stage : "";
        /* Logged once per change of outcome, never fatal. */
        if (w->error != mx->last_error || strcmp(stage, mx->last_stage) != 0) {
                if (w->error)
                        log_warning("MetricsFile=%s: %s of %s failed: %s (tried again every "
                                    "%llus; logged again only when this changes)",
                                    w->path, w->stage, w->tmp, strerror(-w->error),
                                    (unsigned long long)mx->interval_sec);
                else if (mx->last_error)
                        log_notice("MetricsFile=%s: written again", w->path);
                mx->last_error = w->error;
                snprintf(mx->last_stage, sizeof mx->last_stage, "%s", stage);
        }
        mwrite_free(w);
}

static char *tmp_path(const char *path)
{
        const char *slash = strrchr(path, '/');
        size_t dirlen = slash ? (size_t)(slash - path) : 0;
        char *tmp = NULL;
        if (asprintf(&tmp, "%.*s/.%s.tmp", (int)dirlen, path, slash ? slash + 1 : path) < 0)
                return NULL;
        return tmp;
}

static void on_metrics_timer(uv_timer_t *t)
{
        struct metrics *mx = t->data;
        if (!mx->file || mx->writing || mx->stopped)
                return; /* the previous write is still running: skip this turn */
        struct mwrite *w = calloc(1, sizeof(*w));
        if (!w)
                return;
        w->mx = mx;
        w->path = strdup(mx->file);
        w->tmp = tmp_path(mx->file);
        if (!w->path || !w->tmp || metrics_render(mx, OM_PROMETHEUS, &w->text) < 0 ||
            serialq_submit(&mx->q, mwrite_work, mwrite_done, w) < 0) {
                mwrite_free(w);
                return;
        }
        mx->writing = true;
}

static void arm(struct metrics *mx)
{
        uv_timer_stop(&mx->timer);
        if (mx->started && !mx->stopped && mx->file)
                uv_timer_start(&mx->timer, on_metrics_timer, 0, mx->interval_sec * 1000);
}

static void take_config(struct metrics *mx)
{
        const struct config *c = mx->d->cfg;
        free(mx->file);
        mx->file = c->metrics_file ? strdup(c->metrics_file) : NULL;
        mx->interval_sec = c->metrics_interval_sec;
        mx->last_error = 0;
        mx->last_stage[0] = '\0';
}

void metrics_start(struct metrics *mx)
{
        if (!mx)
                return;
        mx->started = true;
        take_config(mx);
        arm(mx);
}

void metrics_reload(struct metrics *mx)
{
        if (!mx)
                return;
        const struct config *c = mx->d->cfg;
        bool same = (c->metrics_file ? mx->file && strcmp(c->metrics_file, mx->file) == 0
                                     : !mx->file) &&
                    c->metrics_interval_sec == mx->interval_sec;
        if (same || !mx->started)
                return;
        take_config(mx);
        arm(mx);
}

void metrics_stop(struct metrics *mx)
{
        if (!mx)
                return;
        mx->stopped = true;
        uv_timer_stop(&mx->timer);
}

struct metrics *metrics_new(struct daemon *d)
{
        struct metrics *mx = calloc(1, sizeof(*mx));
        if (!mx)
                return NULL;
        mx->d = d;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        mx->start_time = (double)ts.tv_sec + (double)(ts.tv_nsec / 1000000) / 1000.0;
        mx->io = *kio_posix();
        mx->io.fdatasync = timed_fdatasync;
        mx->io.ctx = mx; /* the other kio_posix functions ignore ctx */
        mx->walopt = (struct wal_options){ .io = &mx->io };
        uv_timer_init(d->loop, &mx->timer);
        mx->timer.data = mx;
        serialq_init(&mx->q, d->loop, &d->jobs);
        return mx;
}

void metrics_free(struct metrics *mx)
{
        if (!mx)
                return;
        mset_free(&mx->fires);
        mset_free(&mx->steps);
        mset_free(&mx->verdicts);
        mset_free(&mx->control);
        free(mx->file);
        free(mx);
}
