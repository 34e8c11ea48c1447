/* SPDX-License-Identifier: MIT */
#include "chronos.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "chronos_internal.h"
#include "daemon.h"
#include "driver.h"
#include "executor.h"
#include "kairos/cron.h"
#include "kairos/kio.h"
#include "kairos/missed.h"
#include "kairos/planner.h"
#include "log.h"

void chronos_fmt_time(int64_t t, char out[PLANNER_FIRED_AT_LEN])
{
        if (t == NEVER || planner_format_fired_at(t, out) < 0)
                snprintf(out, PLANNER_FIRED_AT_LEN, "-");
}

static json_t *time_json(int64_t t)
{
        char buf[PLANNER_FIRED_AT_LEN];
        if (t == NEVER || planner_format_fired_at(t, buf) < 0)
                return json_null();
        return json_string(buf);
}

static int64_t json_time(json_t *v)
{
        int64_t t;
        if (!json_is_string(v) || planner_parse_fired_at(json_string_value(v), &t) < 0)
                return NEVER;
        return t;
}

/* ---- chronos.json ---- */

struct save_job {
        struct chronos *c;
        char *path;
        char *text;
        int r;
};

static void save_work(void *arg)
{
        struct save_job *j = arg;
        j->r = kio_write_file_atomic(kio_posix(), j->path, j->text, strlen(j->text), 0640);
}

static void save_state(struct chronos *c);

static void save_done(void *arg)
{
        struct save_job *j = arg;
        struct chronos *c = j->c;
        if (j->r < 0)
                log_error("cannot write %s: %s", j->path, strerror(-j->r));
        free(j->path);
        free(j->text);
        free(j);
        c->writing = false;
        /* Also while stopping: the daemon waits for its file jobs, and the
         * newest state (a pause, the last evaluation) must not be lost. */
        if (c->dirty)
                save_state(c);
}

/* What a schedule skipped in its last missed period (chronos.json and
 * `schedules` alike). */
static json_t *skipped_json(const struct sched *s)
{
        return json_pack("{s:I, s:b, s:o, s:o, s:s}", "count", (json_int_t)s->skipped, "more",
                         s->skipped_more, "first", time_json(s->skipped_first), "last",
                         time_json(s->skipped_last), "reason", s->skipped_reason);
}

static json_t *state_json(struct chronos *c)
{
        json_t *all = json_object();
        for (size_t i = 0; i < c->n; i++) {
                struct sched *s = &c->s[i];
                json_t *o = json_pack("{s:o, s:o, s:o, s:b}", "last_evaluated_at",
                                      time_json(s->last_evaluated), "last_fire_at",
                                      time_json(s->last_fire), "next_fire_at",
                                      time_json(s->next_fire), "paused", s->paused);
                if (s->pause_reason)
                        json_object_set_new(o, "pause_reason", json_string(s->pause_reason));
                if (s->skipped)
                        json_object_set_new(o, "skipped", skipped_json(s));
                json_object_set_new(all, s->name, o);
        }
        return json_pack("{s:i, s:o}", "version", 1, "schedules", all);
}

static void save_state(struct chronos *c)
{
        struct daemon *d = c->d;
        /* A tick counts as evaluated in chronos.json only once its mandate
         * is durable: saving earlier would lose it in a crash. */
        if (c->writing || c->nunanswered) {
                c->dirty = true;
                return;
        }
        c->dirty = false;
        struct save_job *j = calloc(1, sizeof(*j));
        json_t *st = state_json(c);
        char *text = json_dumps(st, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        json_decref(st);
        if (!j || !text || asprintf(&j->path, "%s/chronos.json", d->cfg->state_directory) < 0) {
                free(j);
                free(text);
                log_error("out of memory saving chronos.json");
                return;
        }
        size_t n = strlen(text);
        j->text = realloc(text, n + 2);
        if (!j->text) {
                j->text = text;
        } else {
                j->text[n] = '\n';
                j->text[n + 1] = '\0';
        }
        j->c = c;
        c->writing = true;
        if (serialq_submit(&d->admin_q, save_work, save_done, j) < 0) {
                c->writing = false;
                free(j->path);
                free(j->text);
                free(j);
        }
}

/* ---- schedules ---- */

static void sched_clear(struct chronos *c, struct sched *s)
{
        c->d->drv->ticks.sched_free(s);
        free(s->name);
        free(s->pause_reason);
        free(s->refused_reason);
        cron_tz_free(s->tz);
        memset(s, 0, sizeof(*s));
}

/* A broken schedule: a name and its first error, no expression. */
static int sched_build_broken(struct sched *s, const struct config_broken *b,
                              const struct config_schedule *retained)
{
        memset(s, 0, sizeof(*s));
        s->last_evaluated = s->last_fire = s->next_fire = s->refused_last = NEVER;
        s->broken = true;
        s->error = b->errors.n ? b->errors.msgs[0] : "broken";
        s->cfg = retained;
        s->name = strdup(b->name);
        return s->name ? 0 : -ENOMEM;
}

static int sched_build(struct sched *s, const struct config_schedule *cfg)
{
        char err[256];
        memset(s, 0, sizeof(*s));
        s->last_evaluated = s->last_fire = s->next_fire = s->refused_last = NEVER;
        int r = cron_parse(cfg->cron, &s->expr, err, sizeof err);
        if (r < 0)
                return r; /* the config parser validated it already */
        if (cfg->time_zone && strcmp(cfg->time_zone, "UTC") != 0 &&
            (r = cron_tz_load(cfg->time_zone, &s->tz)) < 0)
                return r;
        s->name = strdup(cfg->name);
        s->cfg = cfg;
        return s->name ? 0 : -ENOMEM;
}

struct sched *chronos_find(struct chronos *c, const char *name)
{
        for (size_t i = 0; i < c->n; i++)
                if (strcmp(c->s[i].name, name) == 0)
                        return &c->s[i];
        return NULL;
}

/* ---- evaluation ---- */

/* A fire is durable or final: once none is left, chronos.json may say so. */
static void fire_settled(struct chronos *c)
{
        if (c->nunanswered && --c->nunanswered == 0) {
                if (c->dirty)
                        save_state(c);
                c->d->drv->ticks.settled(c);
        }
}

/* The executor's answer to a fire: its mandate is durable (or the fire was
 * refused, which is as final).  The daemon, not the chronos, is the
 * context: chronos_free may come first at exit. */
struct fire_wait {
        struct daemon *d;
        int64_t t;
        char schedule[];
};

static void on_fire_answered(void *ctx, const struct op_result *r)
{
        struct fire_wait *w = ctx;
        struct chronos *c = C(w->d);
        if (r->code)
                log_event(LOG_WARNING, NULL, LOG_FIELDS({ "SCHEDULE", w->schedule }),
                          "schedule %s: tick not fired: %s (%s)%s", w->schedule, r->message,
                          r->code,
                          w->d->drv->ticks.unclaimed(c, w->schedule, w->t, r)
                                  ? ": it is fired again once the database answers, "
                                    "if the missed-run policy says so"
                                  : "");
        if (r->code && c) {
                struct sched *s = chronos_find(c, w->schedule);
                if (s) {
                        s->refused++;
                        if (s->refused_last == NEVER || w->t > s->refused_last)
                                s->refused_last = w->t;
                        free(s->refused_reason);
                        s->refused_reason = r->message ? strdup(r->message) : NULL;
                }
        }
        if (!r->code && c) {
                /* LAST: only ticks that have a mandate */
                struct sched *s = chronos_find(c, w->schedule);
                if (s && (s->last_fire == NEVER || w->t > s->last_fire)) {
                        s->last_fire = w->t;
                        c->dirty = true;
                }
        }
        if (!r->code && r->result && json_is_false(json_object_get(r->result, "fired")))
                log_info("schedule %s at %s: mandate %s exists already (%s): nothing to do",
                         w->schedule, json_string_value(json_object_get(r->result, "fired_at")),
                         json_string_value(json_object_get(r->result, "mandate")),
                         json_string_value(json_object_get(r->result, "status")));
        json_decref(r->result);
        json_decref(r->detail);
        free(w);
        if (c)
                fire_settled(c);
}

static void fire_now(struct chronos *c, const char *name, int64_t t, const char *why)
{
        char at[PLANNER_FIRED_AT_LEN];
        chronos_fmt_time(t, at);
        log_event(LOG_INFO, NULL, LOG_FIELDS({ "SCHEDULE", name }),
                  "schedule %s: tick %s fires%s", name, at, why);
        size_t n = strlen(name) + 1;
        struct fire_wait *w = malloc(sizeof(*w) + n);
        if (!w) {
                /* nobody waits: chronos.json may count this tick before its
                 * mandate is durable (only when memory is exhausted) */
                struct sched *s = chronos_find(c, name);
                if (s && (s->last_fire == NEVER || t > s->last_fire))
                        s->last_fire = t;
                executor_fire_timer(c->d, name, at, NULL, NULL);
                fire_settled(c);
                return;
        }
        w->d = c->d;
        w->t = t;
        memcpy(w->schedule, name, n);
        executor_fire_timer(c->d, name, at, on_fire_answered, w);
}

/* Hand up to max queued fires to the executor, oldest first. */
static void drain_fires(struct chronos *c, size_t max)
{
        for (size_t i = 0; i < max && c->fire_head; i++) {
                struct pending_fire *f = c->fire_head;
                c->fire_head = f->next;
                if (!c->fire_head)
                        c->fire_tail = NULL;
                fire_now(c, f->schedule, f->t, f->why);
                free(f->schedule);
                free(f);
        }
}

static void on_idle(uv_idle_t *h)
{
        struct chronos *c = h->data;
        drain_fires(c, FIRES_PER_TURN);
        if (!c->fire_head)
                uv_idle_stop(&c->idle);
}

void chronos_fire_tick(struct chronos *c, struct sched *s, int64_t t, const char *why)
{
        c->nunanswered++;
        struct pending_fire *f = c->idle_init && !c->stopped ? calloc(1, sizeof(*f)) : NULL;
        if (f)
                f->schedule = strdup(s->name);
        if (!f || !f->schedule) {
                free(f);
                fire_now(c, s->name, t, why);
                return;
        }
        f->t = t;
        f->why = why;
        if (c->fire_tail)
                c->fire_tail->next = f;
        else
                c->fire_head = f;
        c->fire_tail = f;
        uv_idle_start(&c->idle, on_idle);
}

const char *chronos_policy_name(enum config_missed_policy p)
{
        return p == MISSED_SKIP ? "skip" : p == MISSED_CATCH_UP_ONCE ? "catch_up_once"
                                                                    : "catch_up_bounded";
}

struct missed_rule chronos_rule_of(const struct config_schedule *cfg)
{
        return (struct missed_rule){ .policy = cfg->missed_policy,
                                     .max_catch_up_runs = cfg->max_catch_up_runs,
                                     .stale_after_sec = cfg->stale_after_sec,
                                     .grace_sec = cfg->missed_grace_sec };
}

/* Why ticks were skipped (schedules, chronos.json). */
static const char *const skipped_reasons[] = {
        "MissedPolicy=skip", "the current tick runs for the missed period",
        "stale: older than StaleAfter=", "beyond MaxCatchUpRuns=",
};

void chronos_note_skipped(struct chronos *c, struct sched *s, const struct missed_plan *p,
                          int64_t since)
{
        (void)c;
        if (!p->dropped)
                return;
        const char *policy = chronos_policy_name(s->cfg->missed_policy);
        s->skipped = p->dropped;
        s->skipped_more = p->dropped_more;
        s->skipped_first = p->dropped_first;
        s->skipped_last = p->dropped_last;
        s->skipped_reason = skipped_reasons[s->cfg->missed_policy == MISSED_SKIP ? 0
                                            : p->covered                        ? 1
                                            : p->stale                          ? 2
                                                                                : 3];
        char from[PLANNER_FIRED_AT_LEN], first[PLANNER_FIRED_AT_LEN], last[PLANNER_FIRED_AT_LEN];
        chronos_fmt_time(since, from);
        chronos_fmt_time(p->dropped_first, first);
        chronos_fmt_time(p->dropped_last, last);
        log_event(LOG_NOTICE, NULL, LOG_FIELDS({ "SCHEDULE", s->name }),
                  "schedule %s: %s%llu missed tick%s since %s dropped "
                  "(MissedPolicy=%s%s%s): first %s, last %s",
                  s->name, p->dropped_more ? "more than " : "",
                  (unsigned long long)p->dropped, p->dropped == 1 ? "" : "s", from, policy,
                  p->stale ? ", stale" : "",
                  p->covered ? ", the current tick runs for them" : "", first, last);
}

static void evaluate_one(struct chronos *c, struct sched *s, int64_t now)
{
        const struct config_schedule *cfg = s->cfg;
        if (s->broken)
                return; /* its ticks count as missed when its file is fixed */
        if (s->last_evaluated == NEVER) {
                /* First sight: never fire retroactively. */
                s->last_evaluated = now;
                return;
        }
        if (now < s->last_evaluated) {
                char from[PLANNER_FIRED_AT_LEN], to[PLANNER_FIRED_AT_LEN];
                chronos_fmt_time(s->last_evaluated, from);
                chronos_fmt_time(now, to);
                log_notice("schedule %s: the clock went back from %s to %s; ticks already "
                           "fired are not fired again",
                           s->name, from, to);
                s->last_evaluated = now;
                return;
        }
        if (!cfg->enabled || s->paused) {
                s->last_evaluated = now;
                return;
        }
        /* Ticks in (last_evaluated, now]: the pure rule says which fire. */
        struct missed_rule rule = chronos_rule_of(cfg);
        struct missed_plan *p = malloc(sizeof(*p));
        if (!p) {
                log_error("schedule %s: out of memory evaluating its ticks", s->name);
                return;
        }
        int r = missed_plan(&s->expr, s->tz, &rule, s->last_evaluated, s->last_fire, now, p);
        if (r < 0) {
                log_error("schedule %s: cannot evaluate its ticks: %s", s->name, strerror(-r));
                free(p);
                return;
        }
        /* Its ticks driver may decide the missed ones elsewhere (postgres:
         * the round that wins the schedule's row); this node fires the
         * on-time ticks. */
        bool missed_here = c->d->drv->ticks.missed_here(c);
        if (missed_here)
                chronos_note_skipped(c, s, p, s->last_evaluated);
        /* The current tick first: catch-up runs never make it wait for them
         * (queue) nor be rejected by them (reject). */
        if (p->nfire > p->ncatch_up) {
                int64_t t = p->fire[p->ncatch_up];
                chronos_fire_tick(c, s, t,
                                  now - t > MISSED_ON_TIME_SEC ? " (late, within MissedGraceSec=)"
                                                               : "");
        }
        for (size_t i = 0; missed_here && i < p->ncatch_up; i++)
                chronos_fire_tick(c, s, p->fire[i], " (catch-up)");
        free(p);
        s->last_evaluated = now;
}

static void arm(struct chronos *c);

/* A clock kairos cannot schedule on (before 1970 or after year 9999, e.g. a
 * fake or broken RTC): nothing is evaluated and chronos.json keeps its values. */
static bool clock_usable(struct chronos *c, int64_t now)
{
        bool ok = now >= CRON_TIME_MIN && now <= CRON_TIME_MAX;
        if (!ok && !c->clock_absurd)
                log_event(LOG_ERR, NULL, NULL, 0,
                          "the wall clock says %lld s since 1970, outside what kairos can "
                          "schedule (years 1970 to 9999): no schedule is evaluated and "
                          "chronos.json keeps its values until the clock is set right",
                          (long long)now);
        else if (ok && c->clock_absurd)
                log_notice("the wall clock is usable again: evaluating the schedules");
        c->clock_absurd = !ok;
        return ok;
}

static void evaluate(struct chronos *c)
{
        int64_t now = clock_now(c->d);
        if (!clock_usable(c, now)) {
                arm(c);
                return;
        }
        for (size_t i = 0; i < c->n; i++) {
                struct sched *s = &c->s[i];
                if (s->broken)
                        continue;
                /* The next fire first: if it cannot be represented (nothing
                 * matches before the end of year 9999), keep the state as is. */
                int64_t next;
                bool can = cron_next(&s->expr, s->tz, now, &next) == 0;
                if (!can) {
                        if (!s->frozen)
                                log_event(LOG_ERR, NULL, LOG_FIELDS({ "SCHEDULE", s->name }),
                                          "schedule %s: no fire can be represented after "
                                          "the clock's %lld s (nothing after year 9999): "
                                          "not evaluated, its state kept",
                                          s->name, (long long)now);
                        s->frozen = true;
                        continue;
                }
                s->frozen = false;
                evaluate_one(c, s, now);
                s->next_fire = next;
        }
        save_state(c);
        c->d->drv->ticks.round(c);
        arm(c);
}

static void on_timer(uv_poll_t *p, int status, int events)
{
        (void)events;
        struct chronos *c = p->data;
        if (status < 0)
                return;
        uint64_t expirations;
        ssize_t n = read(c->tfd, &expirations, sizeof expirations);
        if (n < 0 && errno == ECANCELED)
                log_notice("the wall clock was set: recomputing the next fires");
        else if (n < 0 && errno == EAGAIN)
                return;
        evaluate(c);
}

static void arm(struct chronos *c)
{
        if (c->tfd < 0 || c->stopped)
                return;
        int64_t next = NEVER;
        for (size_t i = 0; i < c->n; i++) {
                const struct sched *s = &c->s[i];
                if (s->broken || s->frozen || s->next_fire == NEVER || !s->cfg->enabled ||
                    s->paused)
                        continue;
                if (next == NEVER || s->next_fire < next)
                        next = s->next_fire;
        }
        struct itimerspec its = { 0 };
        if (c->d->fake_clock)
                next = NEVER; /* the test drives the clock */
        if (next != NEVER) {
                its.it_value.tv_sec = (time_t)next;
        } else {
                /* Nothing to fire: still watch for clock steps, far away on
                 * the real clock (a fake clock in the past would make it
                 * expire at once, again and again). */
                its.it_value.tv_sec = time(NULL) + 365 * 86400;
        }
        if (timerfd_settime(c->tfd, TFD_TIMER_ABSTIME | TFD_TIMER_CANCEL_ON_SET, &its, NULL) < 0)
                log_error("timerfd_settime: %s", strerror(errno));
}

/* ---- lifecycle ---- */

/* The last skipped period as chronos.json keeps it (state_json); one
 * this kairosd cannot read is left out. */
static void load_skipped(struct sched *s, json_t *o)
{
        json_t *n = json_object_get(o, "count");
        const char *why = json_string_value(json_object_get(o, "reason"));
        if (!json_is_integer(n) || json_integer_value(n) < 1 || !why)
                return;
        for (size_t i = 0; i < sizeof skipped_reasons / sizeof skipped_reasons[0]; i++)
                if (strcmp(why, skipped_reasons[i]) == 0) {
                        s->skipped = (uint64_t)json_integer_value(n);
                        s->skipped_more = json_is_true(json_object_get(o, "more"));
                        s->skipped_first = json_time(json_object_get(o, "first"));
                        s->skipped_last = json_time(json_object_get(o, "last"));
                        s->skipped_reason = skipped_reasons[i];
                        return;
                }
}

static void load_state(struct chronos *c)
{
        char *path = NULL;
        if (asprintf(&path, "%s/chronos.json", c->d->cfg->state_directory) < 0)
                return;
        json_error_t err;
        json_t *root = json_load_file(path, 0, &err);
        if (!root) {
                if (access(path, F_OK) == 0)
                        log_error("%s: %s (line %d): starting the schedules afresh", path,
                                  err.text, err.line);
                free(path);
                return;
        }
        json_t *all = json_object_get(root, "schedules");
        for (size_t i = 0; i < c->n; i++) {
                struct sched *s = &c->s[i];
                json_t *o = json_object_get(all, s->name);
                if (!json_is_object(o))
                        continue;
                s->last_evaluated = json_time(json_object_get(o, "last_evaluated_at"));
                c->d->drv->ticks.sched_loaded(s);
                s->last_fire = json_time(json_object_get(o, "last_fire_at"));
                s->paused = json_is_true(json_object_get(o, "paused"));
                const char *why = json_string_value(json_object_get(o, "pause_reason"));
                s->pause_reason = why ? strdup(why) : NULL;
                load_skipped(s, json_object_get(o, "skipped"));
        }
        json_decref(root);
        free(path);
}

static int cmp_sched(const void *a, const void *b)
{
        return strcmp(((const struct sched *)a)->name, ((const struct sched *)b)->name);
}

static int build_all(struct chronos *c, struct sched **out, size_t *nout)
{
        const struct config *cfg = c->d->cfg;
        size_t cap = cfg->nschedules + cfg->nbroken;
        struct sched *s = calloc(cap ? cap : 1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        size_t n = 0;
        for (size_t i = 0; i < cfg->nschedules; i++) {
                if (cfg->schedules[i].retained)
                        continue; /* listed with the broken ones */
                int r = sched_build(&s[n], &cfg->schedules[i]);
                if (r == 0)
                        r = c->d->drv->ticks.sched_new(c, &s[n]);
                if (r < 0) {
                        log_error("schedule %s: cannot use Cron=%s TimeZone=%s: %s",
                                  cfg->schedules[i].name, cfg->schedules[i].cron,
                                  cfg->schedules[i].time_zone, strerror(-r));
                        sched_clear(c, &s[n]);
                        continue;
                }
                n++;
        }
        for (size_t i = 0; i < cfg->nbroken; i++) {
                const struct config_schedule *kept = config_find_schedule(cfg, cfg->broken[i].name);
                if (sched_build_broken(&s[n], &cfg->broken[i], kept) < 0 ||
                    c->d->drv->ticks.sched_new(c, &s[n]) < 0) {
                        sched_clear(c, &s[n]);
                        continue;
                }
                n++;
        }
        if (n > 1)
                qsort(s, n, sizeof(*s), cmp_sched);
        *out = s;
        *nout = n;
        return 0;
}

int chronos_start(struct daemon *d)
{
        struct chronos *c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        c->d = d;
        c->tfd = -1;
        d->chronos = c;
#ifdef KAIROS_TEST_HOOKS
        const char *fake = getenv("KAIROS_TEST_CLOCK");
        if (fake) {
                d->fake_clock = true;
                d->fake_now = strtoll(fake, NULL, 10);
                log_warning("test hook: chronos runs on a fake clock starting at %s", fake);
        }
#endif
        int r = build_all(c, &c->s, &c->n);
        if (r < 0)
                return r;
        load_state(c);
        c->tfd = timerfd_create(CLOCK_REALTIME, TFD_NONBLOCK | TFD_CLOEXEC);
        if (c->tfd < 0)
                return -errno;
        if ((r = uv_poll_init(d->loop, &c->poll, c->tfd)) < 0)
                return r;
        c->poll.data = c;
        c->poll_active = true;
        if ((r = uv_idle_init(d->loop, &c->idle)) < 0)
                return r;
        c->idle.data = c;
        c->idle_init = true;
        if ((r = d->drv->ticks.attach(c)) < 0)
                return r;
        if ((r = uv_poll_start(&c->poll, UV_READABLE, on_timer)) < 0)
                return r;
        evaluate(c);
        return 0;
}

void chronos_reload(struct daemon *d)
{
        struct chronos *c = C(d);
        if (!c || c->stopped)
                return;
        struct sched *s;
        size_t n;
        if (build_all(c, &s, &n) < 0) {
                log_error("out of memory reloading the schedules");
                return;
        }
        /* Keep the state of schedules that stay. */
        for (size_t i = 0; i < n; i++) {
                struct sched *old = chronos_find(c, s[i].name);
                if (!old)
                        continue;
                s[i].last_evaluated = old->last_evaluated;
                s[i].last_fire = old->last_fire;
                s[i].frozen = old->frozen;
                if (s[i].broken)
                        s[i].next_fire = old->next_fire;
                s[i].paused = old->paused;
                s[i].skipped = old->skipped;
                s[i].skipped_more = old->skipped_more;
                s[i].skipped_first = old->skipped_first;
                s[i].skipped_last = old->skipped_last;
                s[i].skipped_reason = old->skipped_reason;
                s[i].refused = old->refused;
                s[i].refused_last = old->refused_last;
                s[i].refused_reason = old->refused_reason;
                old->refused_reason = NULL;
                s[i].pause_reason = old->pause_reason;
                old->pause_reason = NULL;
                c->d->drv->ticks.sched_carry(&s[i], old);
        }
        for (size_t i = 0; i < c->n; i++)
                sched_clear(c, &c->s[i]);
        free(c->s);
        c->s = s;
        c->n = n;
        free(c->list_text); /* a reload: never trust the fingerprint across it */
        c->list_text = NULL;
        evaluate(c);
}

static void on_poll_closed(uv_handle_t *h)
{
        struct chronos *c = h->data;
        if (c->tfd >= 0)
                close(c->tfd);
        c->tfd = -1;
}

void chronos_stop(struct daemon *d)
{
        struct chronos *c = C(d);
        if (!c || c->stopped)
                return;
        c->stopped = true;
        /* every tick already evaluated gets its mandate (created, not started) */
        drain_fires(c, SIZE_MAX);
        if (c->idle_init) {
                uv_idle_stop(&c->idle);
                uv_close((uv_handle_t *)&c->idle, NULL);
        }
        c->d->drv->ticks.stop(c);
        if (c->poll_active) {
                uv_poll_stop(&c->poll);
                uv_close((uv_handle_t *)&c->poll, on_poll_closed);
                c->poll_active = false;
        } else if (c->tfd >= 0) {
                close(c->tfd);
                c->tfd = -1;
        }
}

void chronos_free(struct daemon *d)
{
        struct chronos *c = C(d);
        if (!c)
                return;
        if (c->tfd >= 0)
                close(c->tfd);
        while (c->fire_head) {
                struct pending_fire *f = c->fire_head;
                c->fire_head = f->next;
                free(f->schedule);
                free(f);
        }
        for (size_t i = 0; i < c->n; i++)
                sched_clear(c, &c->s[i]);
        free(c->s);
        free(c->list_text);
        d->drv->ticks.detach(c);
        free(c);
        d->chronos = NULL;
        d->fake_clock = false; /* the real clock again, as before chronos_create */
}

/* ---- queries and operator actions ---- */

static const char *concurrency_name(enum config_concurrency cc)
{
        return cc == CONCURRENCY_QUEUE ? "queue" : cc == CONCURRENCY_ALLOW ? "allow" : "reject";
}

static const char *sched_state(const struct sched *s)
{
        return s->broken ? "broken" : !s->cfg->enabled ? "disabled" : s->paused ? "paused"
                                                                                : "enabled";
}

static json_t *list_json(struct daemon *d)
{
        struct chronos *c = C(d);
        json_t *arr = json_array();
        size_t nbroken = 0;
        for (size_t i = 0; c && i < c->n; i++) {
                const struct sched *s = &c->s[i];
                const struct config_schedule *cfg = s->cfg;
                bool fires = !s->broken && !s->frozen && cfg->enabled && !s->paused;
                json_t *o = json_pack(
                        "{s:s, s:s?, s:s?, s:o, s:o, s:s?, s:s?, s:b, s:b, s:s}", "name",
                        s->name, "cron", cfg ? cfg->cron : NULL, "time_zone",
                        cfg ? (cfg->time_zone ? cfg->time_zone : "UTC") : NULL, "next_fire_at",
                        time_json(fires ? s->next_fire : NEVER), "last_fire_at",
                        time_json(s->last_fire), "missed_policy",
                        cfg ? chronos_policy_name(cfg->missed_policy) : NULL, "concurrency",
                        cfg ? concurrency_name(cfg->concurrency) : NULL, "enabled",
                        cfg && cfg->enabled && !s->broken, "paused", s->paused, "state",
                        sched_state(s));
                if (s->pause_reason)
                        json_object_set_new(o, "pause_reason", json_string(s->pause_reason));
                if (s->skipped)
                        json_object_set_new(o, "skipped", skipped_json(s));
                if (s->refused)
                        json_object_set_new(
                                o, "refused",
                                json_pack("{s:I, s:o, s:s?}", "count", (json_int_t)s->refused,
                                          "last", time_json(s->refused_last), "reason",
                                          s->refused_reason));
                if (s->broken) {
                        json_object_set_new(o, "error", json_string(s->error));
                        nbroken++;
                }
                json_array_append_new(arr, o);
        }
        return json_pack("{s:o, s:I}", "schedules", arr, "broken", (json_int_t)nbroken);
}

static uint64_t fp_mix(uint64_t h, uint64_t v)
{
        h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
        return h * 1099511628211ULL;
}

/* Everything list_json shows, hashed: a cheap loop over integers. */
static uint64_t list_fingerprint(const struct chronos *c)
{
        uint64_t h = fp_mix(1469598103934665603ULL, c->n);
        h = fp_mix(h, (uint64_t)(uintptr_t)c->s);
        for (size_t i = 0; i < c->n; i++) {
                const struct sched *s = &c->s[i];
                h = fp_mix(h, (uint64_t)(uintptr_t)s->cfg);
                h = fp_mix(h, (uint64_t)s->next_fire);
                h = fp_mix(h, (uint64_t)s->last_fire);
                h = fp_mix(h, (uint64_t)s->paused << 1 | (uint64_t)(s->cfg && s->cfg->enabled) |
                                      (uint64_t)s->broken << 2 | (uint64_t)s->frozen << 3);
                h = fp_mix(h, (uint64_t)(uintptr_t)s->error);
                h = fp_mix(h, s->skipped);
                h = fp_mix(h, (uint64_t)s->skipped_first);
                h = fp_mix(h, (uint64_t)s->skipped_last);
                h = fp_mix(h, (uint64_t)(uintptr_t)s->skipped_reason);
                h = fp_mix(h, s->refused);
                for (const char *p = s->pause_reason; p && *p; p++)
                        h = fp_mix(h, (unsigned char)*p);
        }
        return h;
}

const char *chronos_list_text(struct daemon *d, size_t *ret_len)
{
        struct chronos *c = C(d);
        if (!c) {
                *ret_len = strlen("{\"schedules\":[]}");
                return "{\"schedules\":[]}";
        }
        uint64_t fp = list_fingerprint(c);
        if (!c->list_text || fp != c->list_fp) {
                json_t *j = list_json(d);
                char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
                json_decref(j);
                if (!text)
                        return NULL;
                free(c->list_text);
                c->list_text = text;
                c->list_len = strlen(text);
                c->list_fp = fp;
        }
        *ret_len = c->list_len;
        return c->list_text;
}

int chronos_next_json(struct daemon *d, const char *name, unsigned n, json_t **out)
{
        struct chronos *c = C(d);
        struct sched *s = c ? chronos_find(c, name) : NULL;
        if (!s)
                return -ENOENT;
        if (s->broken)
                return -EBADR;
        json_t *arr = json_array();
        int64_t t = clock_now(d), next;
        for (unsigned i = 0; i < n && cron_next(&s->expr, s->tz, t, &next) == 0; i++) {
                json_array_append_new(arr, time_json(next));
                t = next;
        }
        *out = json_pack("{s:s, s:s, s:s, s:o}", "name", s->name, "cron", s->cfg->cron,
                         "time_zone", s->cfg->time_zone ? s->cfg->time_zone : "UTC", "next",
                         arr);
        return 0;
}

int chronos_backfill_ticks(struct daemon *d, const char *name, int64_t from, int64_t to,
                           size_t max, int64_t *ret_ticks, size_t *ret_n)
{
        struct chronos *c = C(d);
        struct sched *s = c ? chronos_find(c, name) : NULL;
        if (!s)
                return -ENOENT;
        if (s->broken)
                return -EBADR;
        if (from < CRON_TIME_MIN + 1 || to > CRON_TIME_MAX || from > to)
                return -ERANGE;
        size_t n = 0;
        int64_t t = from - 1, next;
        while (cron_next(&s->expr, s->tz, t, &next) == 0 && next <= to) {
                if (n == max) {
                        *ret_n = max + 1;
                        return -E2BIG;
                }
                ret_ticks[n++] = next;
                t = next;
        }
        *ret_n = n;
        return 0;
}

int chronos_set_paused(struct daemon *d, const char *name, bool paused, const char *reason)
{
        struct chronos *c = C(d);
        struct sched *s = c ? chronos_find(c, name) : NULL;
        if (!s)
                return -ENOENT;
        if (s->paused == paused)
                return 1;
        s->paused = paused;
        free(s->pause_reason);
        s->pause_reason = paused && reason ? strdup(reason) : NULL;
        log_event(LOG_NOTICE, MSGID_OPERATOR, LOG_FIELDS({ "SCHEDULE", name }),
                  "schedule %s %s%s%s", name, paused ? "paused" : "resumed",
                  paused && reason ? ": " : "", paused && reason ? reason : "");
        /* Ticks while paused are not fired later: evaluation starts now. */
        evaluate(c);
        return 0;
}

void chronos_test_set_clock(struct daemon *d, int64_t now)
{
        struct chronos *c = C(d);
        if (!c)
                return;
        d->fake_clock = true;
        d->fake_now = now;
        evaluate(c);
}
