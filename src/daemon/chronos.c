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

#include "cluster.h"
#include "daemon.h"
#include "executor.h"
#include "kairos/canon.h"
#include "kairos/cron.h"
#include "kairos/kio.h"
#include "kairos/missed.h"
#include "kairos/planner.h"
#include "log.h"
#ifdef KAIROS_HAVE_PGSTORE
#include "pgstore.h"
#endif

#define NEVER INT64_MIN
_Static_assert(NEVER == MISSED_NEVER, "one value for never");

struct sched {
        char *name;
        struct cron_expr expr;
        struct cron_tz *tz;
        const struct config_schedule *cfg;  /* in d->cfg (refreshed on reload); NULL for a
                                             * broken schedule without a retained one */
        const char *error;                  /* broken: its first error (in d->cfg) */
        bool broken;                        /* its file has errors: never fires */
        bool frozen;                        /* its next fire cannot be represented (the
                                             * clock is beyond year 9999): state kept */
        int64_t last_evaluated;             /* NEVER: first sight */
        int64_t last_fire;
        int64_t next_fire;                  /* NEVER: none */
        bool paused;
        char *pause_reason;
        /* cluster mode (docs/design.md §14, "Ticks") */
        char hash[CANON_HASH_STRLEN];       /* of its timing configuration */
        char *foreign_hash;                 /* another node's, warned about */
        int64_t hole_lo, hole_hi;           /* on-time ticks whose fire failed for want of
                                             * the database; NEVER: none */
        int64_t local_from;                 /* its last evaluation in chronos.json at start,
                                             * until a round reached its row; NEVER: none */
};

/* A tick that fires: queued, and handed to the executor a few per loop turn,
 * so that a large catch-up never blocks the loop. */
#define FIRES_PER_TURN 32
struct pending_fire {
        struct pending_fire *next;
        char *schedule;
        int64_t t;
        const char *why;                    /* static text */
};

struct chronos {
        struct daemon *d;
        struct pending_fire *fire_head, *fire_tail;
        size_t nqueued;
        size_t nunanswered;                 /* fires queued or not yet durable: chronos.json
                                             * waits for them (docs/design.md §9) */
        uv_idle_t idle;
        bool idle_init;
        struct sched *s;
        size_t n;
        int tfd;
        uv_poll_t poll;
        bool poll_active;
        bool writing, dirty;
        bool stopped;
        bool clock_absurd;                  /* the last evaluation refused the clock */
        char *list_text;                    /* the `schedules` result as JSON text */
        size_t list_len;
        uint64_t list_fp;                   /* ... for this state of the schedules */
        /* cluster mode: the schedule rounds in the database (one at a time) */
        bool db_busy, db_dirty;
        bool db_down;                       /* the last round failed (logged once) */
        uv_timer_t db_retry;
        bool db_timer_init;
};

static struct chronos *C(const struct daemon *d)
{
        return d->chronos;
}

static void fmt_time(int64_t t, char out[PLANNER_FIRED_AT_LEN])
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

static void sched_clear(struct sched *s)
{
        free(s->name);
        free(s->pause_reason);
        free(s->foreign_hash);
        cron_tz_free(s->tz);
        memset(s, 0, sizeof(*s));
}

/* A broken schedule: a name and its first error, no expression. */
static int sched_build_broken(struct sched *s, const struct config_broken *b,
                              const struct config_schedule *retained)
{
        memset(s, 0, sizeof(*s));
        s->last_evaluated = s->last_fire = s->next_fire = NEVER;
        s->hole_lo = s->hole_hi = s->local_from = NEVER;
        s->broken = true;
        s->error = b->errors.n ? b->errors.msgs[0] : "broken";
        s->cfg = retained;
        s->name = strdup(b->name);
        return s->name ? 0 : -ENOMEM;
}

static const char *policy_name(enum config_missed_policy p);

/* What decides which ticks fire, hashed: nodes that share a schedule must
 * agree on it (cluster mode compares it with the database's row). */
static void timing_hash(const struct config_schedule *cfg, char out[CANON_HASH_STRLEN])
{
        char *text = NULL;
        if (asprintf(&text,
                     "cron=%s\ntime_zone=%s\nmissed_policy=%s\nmax_catch_up_runs=%u\n"
                     "stale_after_sec=%llu\nmissed_grace_sec=%llu\n",
                     cfg->cron, cfg->time_zone ? cfg->time_zone : "UTC",
                     policy_name(cfg->missed_policy), cfg->max_catch_up_runs,
                     (unsigned long long)cfg->stale_after_sec,
                     (unsigned long long)cfg->missed_grace_sec) < 0) {
                snprintf(out, CANON_HASH_STRLEN, "unknown");
                return;
        }
        canon_hash_bytes(text, strlen(text), out);
        free(text);
}

static int sched_build(struct sched *s, const struct config_schedule *cfg)
{
        char err[256];
        memset(s, 0, sizeof(*s));
        s->last_evaluated = s->last_fire = s->next_fire = NEVER;
        s->hole_lo = s->hole_hi = s->local_from = NEVER;
        timing_hash(cfg, s->hash);
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

static struct sched *find(struct chronos *c, const char *name)
{
        for (size_t i = 0; i < c->n; i++)
                if (strcmp(c->s[i].name, name) == 0)
                        return &c->s[i];
        return NULL;
}

/* ---- evaluation ---- */

static void db_round(struct chronos *c);

/* A fire is durable or final: once none is left, chronos.json may say so. */
static void fire_settled(struct chronos *c)
{
        if (c->nunanswered && --c->nunanswered == 0) {
                if (c->dirty)
                        save_state(c);
                if (c->db_dirty)
                        db_round(c);
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

static struct sched *find(struct chronos *c, const char *name);

/* Cluster mode: an on-time tick whose claim could not reach the database
 * is fired again by the next round that does (docs/design.md §14). */
static bool note_hole(struct chronos *c, const char *name, int64_t t, const struct op_result *r)
{
        if (!c || !c->d->cluster || strcmp(r->code, "cluster_unavailable") != 0)
                return false;
        struct sched *s = find(c, name);
        if (!s)
                return false;
        if (s->hole_lo == NEVER || t < s->hole_lo)
                s->hole_lo = t;
        if (s->hole_hi == NEVER || t > s->hole_hi)
                s->hole_hi = t;
        c->db_dirty = true; /* a round once the fires are answered */
        return true;
}

static void on_fire_answered(void *ctx, const struct op_result *r)
{
        struct fire_wait *w = ctx;
        struct chronos *c = C(w->d);
        if (r->code)
                log_event(LOG_WARNING, NULL, LOG_FIELDS({ "SCHEDULE", w->schedule }),
                          "schedule %s: tick not fired: %s (%s)%s", w->schedule, r->message,
                          r->code,
                          note_hole(c, w->schedule, w->t, r)
                                  ? ": it is fired again once the database answers, "
                                    "if the missed-run policy says so"
                                  : "");
        else if (r->result && json_is_false(json_object_get(r->result, "fired")))
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
        fmt_time(t, at);
        log_event(LOG_INFO, NULL, LOG_FIELDS({ "SCHEDULE", name }),
                  "schedule %s: tick %s fires%s", name, at, why);
        size_t n = strlen(name) + 1;
        struct fire_wait *w = malloc(sizeof(*w) + n);
        if (!w) {
                /* nobody waits: chronos.json may count this tick before its
                 * mandate is durable (only when memory is exhausted) */
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
                c->nqueued--;
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

static void fire_tick(struct chronos *c, struct sched *s, int64_t t, const char *why)
{
        if (s->last_fire == NEVER || t > s->last_fire)
                s->last_fire = t;
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
        c->nqueued++;
        uv_idle_start(&c->idle, on_idle);
}

static const char *policy_name(enum config_missed_policy p)
{
        return p == MISSED_SKIP ? "skip" : p == MISSED_CATCH_UP_ONCE ? "catch_up_once"
                                                                    : "catch_up_bounded";
}

static struct missed_rule rule_of(const struct config_schedule *cfg)
{
        return (struct missed_rule){ .policy = cfg->missed_policy,
                                     .max_catch_up_runs = cfg->max_catch_up_runs,
                                     .stale_after_sec = cfg->stale_after_sec,
                                     .grace_sec = cfg->missed_grace_sec };
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
                fmt_time(s->last_evaluated, from);
                fmt_time(now, to);
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
        struct missed_rule rule = rule_of(cfg);
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
        /* Cluster mode: this node fires the on-time ticks; the missed ones
         * are the cluster's, decided once by the round that wins the
         * schedule's row (db_after). */
        bool cluster = c->d->cluster != NULL;
        if (p->dropped && !cluster) {
                char from[PLANNER_FIRED_AT_LEN];
                fmt_time(s->last_evaluated, from);
                log_event(LOG_NOTICE, NULL, LOG_FIELDS({ "SCHEDULE", s->name }),
                          "schedule %s: %s%llu missed tick%s since %s dropped "
                          "(MissedPolicy=%s%s)",
                          s->name, p->dropped_more ? "more than " : "",
                          (unsigned long long)p->dropped, p->dropped == 1 ? "" : "s", from,
                          policy_name(cfg->missed_policy), p->stale ? ", stale" : "");
        }
        for (size_t i = cluster ? p->ncatch_up : 0; i < p->nfire; i++) {
                bool late = now - p->fire[i] > MISSED_ON_TIME_SEC;
                fire_tick(c, s, p->fire[i],
                          i < p->ncatch_up ? " (catch-up)" : late ? " (late, within MissedGraceSec=)"
                                                                  : "");
        }
        free(p);
        s->last_evaluated = now;
}

/* ---- cluster mode: the schedule rows (docs/design.md §14, "Ticks") ----
 *
 * Each node fires the on-time ticks it evaluates (the tick claim makes one
 * mandate of each).  The missed ones are decided once for the cluster: after
 * an evaluation whose fires are all answered, one pool job reads every
 * schedule's row and moves its last_evaluated_at on to this node's
 * evaluation under compare-and-set (pgstore_schedule_advance at the version
 * read).  The node whose set wins owns the window (row's last evaluation,
 * its own] and fires the missed ticks of it, by the schedule's policy; a
 * node that loses re-reads the row and fires nothing for that window.  A
 * database that does not answer changes nothing for on-time ticks: the
 * round is logged once and tried again every DB_RETRY_MS. */

#define DB_RETRY_MS 5000

#ifdef KAIROS_HAVE_PGSTORE
enum db_outcome { DB_NOT_REACHED, DB_WON, DB_LOST, DB_BEHIND };

struct db_item {
        char *name;
        char hash[CANON_HASH_STRLEN];
        int64_t upto;              /* this node's evaluation (s) */
        int64_t next_fire;         /* (s), NEVER: none */
        int64_t local_from;        /* (s) sched.local_from */
        enum db_outcome outcome;
        int64_t prev_ms;           /* the row's last_evaluated_at as read (-1: none) */
        int64_t after_ms;          /* ... after the round (-1: none) */
        char *db_hash;             /* the row's config_hash as read (NULL: no row) */
};

struct db_job {
        uv_work_t req;
        struct daemon *d;
        struct db_item *items;
        size_t n;
        int r;
        char err[256];
};

static void db_job_free(struct db_job *j)
{
        for (size_t i = 0; i < j->n; i++) {
                free(j->items[i].name);
                free(j->items[i].db_hash);
        }
        free(j->items);
        free(j);
}

/* Pool thread: one connection (lent for the job), every schedule in turn; the
 * first failure ends the round (the rest waits for the next). */
static void db_work_run(uv_work_t *w)
{
        struct db_job *j = w->data;
        int r = 0;
        struct pgstore *s = cluster_thread_store(j->d, &r);
        if (!s) {
                j->r = r < 0 ? r : -EIO;
                snprintf(j->err, sizeof j->err, "cannot connect: %s", strerror(-j->r));
                return;
        }
        for (size_t i = 0; i < j->n && r == 0; i++) {
                struct db_item *it = &j->items[i];
                struct pgstore_schedule st;
                if ((r = pgstore_schedule_get(s, it->name, &st)) < 0)
                        break;
                it->db_hash = st.config_hash;
                st.config_hash = NULL;
                it->prev_ms = it->after_ms = st.last_evaluated_ms;
                if (st.last_evaluated_ms >= it->upto * 1000) {
                        it->outcome = DB_BEHIND;
                        continue;
                }
                int64_t v;
                r = pgstore_schedule_advance(s, it->name, it->hash, st.version, it->upto * 1000,
                                             it->next_fire == NEVER ? -1 : it->next_fire * 1000,
                                             &v);
                if (r == 0) {
                        it->outcome = DB_WON;
                        it->after_ms = it->upto * 1000;
                        /* its first row: the window starts at this node's
                         * own last evaluation (a node that ran on its own
                         * before the cluster, or a new database) */
                        if (st.version == 0 && it->local_from != NEVER)
                                it->prev_ms = it->local_from * 1000;
                } else if (r == -EAGAIN) {
                        /* another node got there first: read what it wrote */
                        if ((r = pgstore_schedule_get(s, it->name, &st)) < 0)
                                break;
                        it->outcome = DB_LOST;
                        it->after_ms = st.last_evaluated_ms;
                        pgstore_schedule_free(&st);
                }
        }
        j->r = r;
        if (r < 0) {
                snprintf(j->err, sizeof j->err, "%s", pgstore_error(s));
                if (r == -ENOTCONN)
                        (void)pgstore_reset(s);
        }
}

static void db_work(uv_work_t *w)
{
        db_work_run(w);
        cluster_thread_done();  /* its connection goes back to the pool */
}

static bool sched_fires(const struct sched *s)
{
        return !s->broken && !s->frozen && s->cfg && s->cfg->enabled && !s->paused;
}

/* This node won the window (prev, it->upto] of s: its missed ticks fire
 * here, by the policy. */
static void db_fire_window(struct chronos *c, struct sched *s, const struct db_item *it)
{
        int64_t prev = it->prev_ms < 0 ? NEVER : it->prev_ms / 1000;
        int64_t upto = it->upto;
        if (prev == NEVER || prev >= upto)
                return; /* the schedule's first evaluation in the cluster */
        struct missed_rule rule = rule_of(s->cfg);
        struct missed_plan *p = malloc(sizeof(*p));
        int r = p ? missed_plan(&s->expr, s->tz, &rule, prev, s->last_fire, upto, p) : -ENOMEM;
        if (r < 0) {
                log_error("schedule %s: cannot evaluate its missed ticks: %s", s->name,
                          strerror(-r));
                free(p);
                return;
        }
        char from[PLANNER_FIRED_AT_LEN], to[PLANNER_FIRED_AT_LEN];
        fmt_time(prev, from);
        fmt_time(upto, to);
        if (p->dropped)
                log_event(LOG_NOTICE, NULL, LOG_FIELDS({ "SCHEDULE", s->name }),
                          "schedule %s: %s%llu missed tick%s since %s dropped "
                          "(MissedPolicy=%s%s)",
                          s->name, p->dropped_more ? "more than " : "",
                          (unsigned long long)p->dropped, p->dropped == 1 ? "" : "s", from,
                          policy_name(s->cfg->missed_policy), p->stale ? ", stale" : "");
        if (p->ncatch_up)
                log_event(LOG_INFO, NULL, LOG_FIELDS({ "SCHEDULE", s->name }),
                          "schedule %s: this node evaluates the missed ticks of (%s, %s] for "
                          "the cluster: %zu to fire",
                          s->name, from, to, p->ncatch_up);
        for (size_t i = 0; i < p->ncatch_up; i++)
                fire_tick(c, s, p->fire[i], " (catch-up)");
        free(p);
}

/* The database answers again: this node's on-time ticks whose claims
 * failed are fired again while they are still on time (their claims
 * decide, as for any on-time tick); older ones are missed ticks, decided by
 * the missed-run policy of the window they fell in. */
static void db_refire_holes(struct chronos *c, struct sched *s, int64_t upto)
{
        if (s->hole_lo == NEVER)
                return;
        struct missed_rule rule = rule_of(s->cfg);
        uint64_t window = rule.grace_sec > MISSED_ON_TIME_SEC ? rule.grace_sec
                                                              : MISSED_ON_TIME_SEC;
        int64_t g = upto - (int64_t)window - 1, t = g, next;
        if (s->hole_lo <= g) {
                char at[PLANNER_FIRED_AT_LEN];
                fmt_time(s->hole_lo, at);
                log_event(LOG_NOTICE, NULL, LOG_FIELDS({ "SCHEDULE", s->name }),
                          "schedule %s: its ticks since %s that could not be claimed are no "
                          "longer on time: the missed-run policy decides them",
                          s->name, at);
        }
        if (t < s->hole_lo - 1)
                t = s->hole_lo - 1;
        int64_t hi = s->hole_hi;
        s->hole_lo = s->hole_hi = NEVER; /* a fire that fails again sets them again */
        for (size_t n = 0; n < MISSED_ON_TIME_MAX && cron_next(&s->expr, s->tz, t, &next) == 0 &&
                           next <= hi && next <= upto;
             n++) {
                fire_tick(c, s, next, " (again: the database answers)");
                t = next;
        }
}

static void on_db_retry(uv_timer_t *t);

static void db_retry_later(struct chronos *c)
{
        if (c->db_timer_init && !c->stopped && !uv_is_active((uv_handle_t *)&c->db_retry))
                uv_timer_start(&c->db_retry, on_db_retry, DB_RETRY_MS, 0);
}

static void db_after(uv_work_t *w, int status)
{
        struct db_job *j = w->data;
        struct chronos *c = C(j->d);
        if (status == UV_ECANCELED && j->r == 0) {
                j->r = -ECANCELED;
                snprintf(j->err, sizeof j->err, "cancelled");
        }
        if (!c) {
                db_job_free(j);
                return;
        }
        c->db_busy = false;
        /* what was reached, even in a round that failed half-way */
        for (size_t i = 0; i < j->n; i++) {
                struct db_item *it = &j->items[i];
                struct sched *s = it->outcome == DB_NOT_REACHED ? NULL : find(c, it->name);
                if (!s)
                        continue;
                int64_t after = it->after_ms < 0 ? NEVER : it->after_ms / 1000;
                s->local_from = NEVER;
                if (it->db_hash && strcmp(it->db_hash, s->hash) != 0) {
                        if (!s->foreign_hash || strcmp(s->foreign_hash, it->db_hash) != 0) {
                                log_event(LOG_WARNING, NULL, LOG_FIELDS({ "SCHEDULE", s->name }),
                                          "schedule %s: another node evaluates it with other "
                                          "timing (Cron=, TimeZone=, MissedPolicy=, "
                                          "MaxCatchUpRuns=, StaleAfter=, MissedGraceSec=): "
                                          "its hash in the database is %s, this node's %s; "
                                          "nodes must share their schedule files",
                                          s->name, it->db_hash, s->hash);
                                free(s->foreign_hash);
                                s->foreign_hash = strdup(it->db_hash);
                        }
                } else if (it->db_hash && s->foreign_hash) {
                        log_notice("schedule %s: the nodes agree on its timing again", s->name);
                        free(s->foreign_hash);
                        s->foreign_hash = NULL;
                }
                if (c->stopped)
                        continue;
                if (it->outcome == DB_LOST) {
                        char at[PLANNER_FIRED_AT_LEN];
                        fmt_time(after, at);
                        log_event(LOG_INFO, NULL, LOG_FIELDS({ "SCHEDULE", s->name }),
                                  "schedule %s: another node evaluated it up to %s first: the "
                                  "missed ticks are that node's",
                                  s->name, at);
                }
                if (!sched_fires(s)) {
                        s->hole_lo = s->hole_hi = NEVER;
                        continue;
                }
                if (it->outcome == DB_WON)
                        db_fire_window(c, s, it);
                db_refire_holes(c, s, it->upto);
        }
        if (j->r < 0) {
                if (!c->db_down)
                        log_event(LOG_WARNING, NULL, NULL, 0,
                                  "the schedules' state in the database cannot be read or "
                                  "written (%s): on-time ticks fire from this node's state, "
                                  "missed ones wait; trying again every %d s",
                                  j->err, DB_RETRY_MS / 1000);
                c->db_down = true;
                c->db_dirty = true;
                db_retry_later(c);
        } else if (c->db_down) {
                c->db_down = false;
                log_notice("the schedules' state in the database is reachable again");
        }
        db_job_free(j);
        if (c->db_dirty && !c->db_down)
                db_round(c);
}

static void on_db_retry(uv_timer_t *t)
{
        struct chronos *c = t->data;
        db_round(c);
}
#endif /* KAIROS_HAVE_PGSTORE */

/* Start a round, or note that one is due once the fires are answered and
 * the round in flight is over. */
static void db_round(struct chronos *c)
{
#ifdef KAIROS_HAVE_PGSTORE
        if (!c->d->cluster || c->stopped)
                return;
        if (c->db_busy || c->nunanswered) {
                c->db_dirty = true;
                return;
        }
        if (!cluster_may_act(c->d)) {
                /* its claims would fail: wait for the lease to be renewed */
                c->db_dirty = true;
                db_retry_later(c);
                return;
        }
        c->db_dirty = false;
        if (c->db_timer_init)
                uv_timer_stop(&c->db_retry);
        struct db_job *j = calloc(1, sizeof(*j));
        if (!j || !(j->items = calloc(c->n ? c->n : 1, sizeof(*j->items)))) {
                free(j);
                log_error("out of memory: the schedules' state is not written to the database");
                return;
        }
        j->d = c->d;
        for (size_t i = 0; i < c->n; i++) {
                const struct sched *s = &c->s[i];
                if (s->broken || s->frozen || s->last_evaluated == NEVER)
                        continue;
                struct db_item *it = &j->items[j->n];
                if (!(it->name = strdup(s->name))) {
                        db_job_free(j);
                        return;
                }
                j->n++;
                memcpy(it->hash, s->hash, sizeof it->hash);
                it->upto = s->last_evaluated;
                it->next_fire = s->next_fire;
                it->local_from = s->local_from;
                it->prev_ms = it->after_ms = -1;
        }
        if (j->n == 0) {
                db_job_free(j);
                return;
        }
        j->req.data = j;
        if (uv_queue_work(c->d->loop, &j->req, db_work, db_after) < 0) {
                db_job_free(j);
                c->db_dirty = true;
                db_retry_later(c);
                return;
        }
        c->db_busy = true;
#else
        (void)c;
#endif
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
        db_round(c);
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
                s->local_from = s->last_evaluated;
                s->last_fire = json_time(json_object_get(o, "last_fire_at"));
                s->paused = json_is_true(json_object_get(o, "paused"));
                const char *why = json_string_value(json_object_get(o, "pause_reason"));
                s->pause_reason = why ? strdup(why) : NULL;
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
                if (r < 0) {
                        log_error("schedule %s: cannot use Cron=%s TimeZone=%s: %s",
                                  cfg->schedules[i].name, cfg->schedules[i].cron,
                                  cfg->schedules[i].time_zone, strerror(-r));
                        sched_clear(&s[n]);
                        continue;
                }
                n++;
        }
        for (size_t i = 0; i < cfg->nbroken; i++) {
                const struct config_schedule *kept = config_find_schedule(cfg, cfg->broken[i].name);
                if (sched_build_broken(&s[n], &cfg->broken[i], kept) < 0) {
                        sched_clear(&s[n]);
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
#ifdef KAIROS_HAVE_PGSTORE
        if (d->cluster) {
                if ((r = uv_timer_init(d->loop, &c->db_retry)) < 0)
                        return r;
                c->db_retry.data = c;
                c->db_timer_init = true;
        }
#endif
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
                struct sched *old = find(c, s[i].name);
                if (!old)
                        continue;
                s[i].last_evaluated = old->last_evaluated;
                s[i].last_fire = old->last_fire;
                s[i].frozen = old->frozen;
                if (s[i].broken)
                        s[i].next_fire = old->next_fire;
                s[i].paused = old->paused;
                s[i].pause_reason = old->pause_reason;
                old->pause_reason = NULL;
                s[i].hole_lo = old->hole_lo;
                s[i].local_from = old->local_from;
                s[i].hole_hi = old->hole_hi;
                if (strcmp(s[i].hash, old->hash) == 0) {
                        s[i].foreign_hash = old->foreign_hash;
                        old->foreign_hash = NULL;
                }
        }
        for (size_t i = 0; i < c->n; i++)
                sched_clear(&c->s[i]);
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
        if (c->db_timer_init) {
                uv_timer_stop(&c->db_retry);
                uv_close((uv_handle_t *)&c->db_retry, NULL);
                c->db_timer_init = false;
        }
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
                sched_clear(&c->s[i]);
        free(c->s);
        free(c->list_text);
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

json_t *chronos_list_json(struct daemon *d)
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
                        cfg ? policy_name(cfg->missed_policy) : NULL, "concurrency",
                        cfg ? concurrency_name(cfg->concurrency) : NULL, "enabled",
                        cfg && cfg->enabled && !s->broken, "paused", s->paused, "state",
                        sched_state(s));
                if (s->pause_reason)
                        json_object_set_new(o, "pause_reason", json_string(s->pause_reason));
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

/* Everything chronos_list_json shows, hashed: a cheap loop over integers. */
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
                json_t *j = chronos_list_json(d);
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
        struct sched *s = c ? find(c, name) : NULL;
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

int chronos_set_paused(struct daemon *d, const char *name, bool paused, const char *reason)
{
        struct chronos *c = C(d);
        struct sched *s = c ? find(c, name) : NULL;
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
