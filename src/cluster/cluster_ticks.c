/* SPDX-License-Identifier: MIT */
/* The postgres driver's schedule state and tick claims (driver.h, ticks):
 * the schedules' rows in the database, shared by every node's chronos
 * (chronos_internal.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chronos_internal.h"
#include "driver_postgres.h"
#include "kairos/canon.h"
#include "log.h"
#include "pgstore.h"

/* A schedule's state here (s->drv_state), kept across reloads. */
struct sched_ticks {
        char hash[CANON_HASH_STRLEN];       /* of its timing configuration */
        char *foreign_hash;                 /* another node's, warned about */
        int64_t hole_lo, hole_hi;           /* on-time ticks whose fire failed for want of
                                             * the database; NEVER: none */
        int64_t local_from;                 /* its last evaluation in chronos.json at start,
                                             * until a round reached its row; NEVER: none */
};

static struct sched_ticks *ST(const struct sched *s)
{
        return s->drv_state;
}

/* ---- the schedule rows (docs/design.md §14, "Ticks") ----
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
/* the unclaimed ticks counted for their line, at most */
#define HOLE_COUNT_MAX 100000UL

/* The chronos' state in this driver (c->drv_state): the rounds, one at a
 * time. */
struct ticks_state {
        bool busy, dirty;
        bool down;                          /* the last round failed (logged once) */
        uv_timer_t retry;
        bool timer_init;
};

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
static void db_work(uv_work_t *w)
{
        struct db_job *j = w->data;
        int r = 0;
        struct pgstore *s = cluster_thread_store(j->d, &r);
        if (!s) {
                j->r = r < 0 ? r : -EIO;
                snprintf(j->err, sizeof j->err, "cannot connect: %s", cluster_thread_error());
                goto out;
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
        if (r < 0)
                cluster_thread_failed(s, r, j->err, sizeof j->err);
out:
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
        struct missed_rule rule = chronos_rule_of(s->cfg);
        struct missed_plan *p = malloc(sizeof(*p));
        int r = p ? missed_plan(&s->expr, s->tz, &rule, prev, s->last_fire, upto, p) : -ENOMEM;
        if (r < 0) {
                log_error("schedule %s: cannot evaluate its missed ticks: %s", s->name,
                          strerror(-r));
                free(p);
                return;
        }
        char from[PLANNER_FIRED_AT_LEN], to[PLANNER_FIRED_AT_LEN];
        chronos_fmt_time(prev, from);
        chronos_fmt_time(upto, to);
        chronos_note_skipped(c, s, p, prev);
        if (p->ncatch_up)
                log_event(LOG_INFO, NULL, LOG_FIELDS({ "SCHEDULE", s->name }),
                          "schedule %s: this node evaluates the missed ticks of (%s, %s] for "
                          "the cluster: %zu to fire",
                          s->name, from, to, p->ncatch_up);
        for (size_t i = 0; i < p->ncatch_up; i++)
                chronos_fire_tick(c, s, p->fire[i], " (catch-up)");
        free(p);
}

/* The database answers again: this node's on-time ticks whose claims
 * failed are fired again while they are still on time (their claims
 * decide, as for any on-time tick); older ones are missed ticks, decided by
 * the missed-run policy of the window they fell in. */
static void db_refire_holes(struct chronos *c, struct sched *s, int64_t upto)
{
        if (ST(s)->hole_lo == NEVER)
                return;
        struct missed_rule rule = chronos_rule_of(s->cfg);
        uint64_t window = rule.grace_sec > MISSED_ON_TIME_SEC ? rule.grace_sec
                                                              : MISSED_ON_TIME_SEC;
        int64_t g = upto - (int64_t)window - 1, t = g, next;
        if (ST(s)->hole_lo <= g) {
                /* no tick goes without a line: the ones gone past the
                 * on-time window, counted (the policy's own line, on the
                 * node that evaluates their window, says what it did) */
                int64_t end = ST(s)->hole_hi < g ? ST(s)->hole_hi : g, last = ST(s)->hole_lo;
                int64_t k = ST(s)->hole_lo - 1;
                unsigned long n = 0;
                for (; n < HOLE_COUNT_MAX && cron_next(&s->expr, s->tz, k, &next) == 0 &&
                       next <= end;
                     n++)
                        last = k = next;
                char at[PLANNER_FIRED_AT_LEN], to[PLANNER_FIRED_AT_LEN];
                chronos_fmt_time(ST(s)->hole_lo, at);
                chronos_fmt_time(last, to);
                log_event(LOG_NOTICE, NULL, LOG_FIELDS({ "SCHEDULE", s->name }),
                          "schedule %s: its ticks since %s that could not be claimed are no "
                          "longer on time: the missed-run policy decides them (%s%lu, first "
                          "%s, last %s)",
                          s->name, at, n == HOLE_COUNT_MAX ? "more than " : "", n, at, to);
        }
        if (t < ST(s)->hole_lo - 1)
                t = ST(s)->hole_lo - 1;
        int64_t hi = ST(s)->hole_hi;
        ST(s)->hole_lo = ST(s)->hole_hi = NEVER; /* a fire that fails again sets them again */
        size_t n = 0;
        for (; n < MISSED_ON_TIME_MAX && cron_next(&s->expr, s->tz, t, &next) == 0 &&
               next <= hi && next <= upto;
             n++) {
                chronos_fire_tick(c, s, next, " (again: the database answers)");
                t = next;
        }
        if (n == MISSED_ON_TIME_MAX && cron_next(&s->expr, s->tz, t, &next) == 0 && next <= hi &&
            next <= upto) {
                /* no tick goes without a line */
                char first[PLANNER_FIRED_AT_LEN], last[PLANNER_FIRED_AT_LEN];
                chronos_fmt_time(next, first);
                chronos_fmt_time(hi < upto ? hi : upto, last);
                log_event(LOG_WARNING, NULL, LOG_FIELDS({ "SCHEDULE", s->name }),
                          "schedule %s: its unclaimed ticks from %s to %s are not fired again "
                          "(at most %d at once): dropped",
                          s->name, first, last, MISSED_ON_TIME_MAX);
        }
}

static void on_db_retry(uv_timer_t *t);

static void db_retry_later(struct chronos *c)
{
        struct ticks_state *ts = c->drv_state;
        if (ts->timer_init && !c->stopped && !uv_is_active((uv_handle_t *)&ts->retry))
                uv_timer_start(&ts->retry, on_db_retry, DB_RETRY_MS, 0);
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
        struct ticks_state *ts = c->drv_state;
        ts->busy = false;
        /* what was reached, even in a round that failed half-way */
        for (size_t i = 0; i < j->n; i++) {
                struct db_item *it = &j->items[i];
                struct sched *s = it->outcome == DB_NOT_REACHED ? NULL : chronos_find(c, it->name);
                if (!s)
                        continue;
                int64_t after = it->after_ms < 0 ? NEVER : it->after_ms / 1000;
                ST(s)->local_from = NEVER;
                if (it->db_hash && strcmp(it->db_hash, ST(s)->hash) != 0) {
                        if (!ST(s)->foreign_hash || strcmp(ST(s)->foreign_hash, it->db_hash) != 0) {
                                log_event(LOG_WARNING, NULL, LOG_FIELDS({ "SCHEDULE", s->name }),
                                          "schedule %s: another node evaluates it with other "
                                          "timing (Cron=, TimeZone=, MissedPolicy=, "
                                          "MaxCatchUpRuns=, StaleAfter=, MissedGraceSec=): "
                                          "its hash in the database is %s, this node's %s; "
                                          "nodes must share their schedule files",
                                          s->name, it->db_hash, ST(s)->hash);
                                free(ST(s)->foreign_hash);
                                ST(s)->foreign_hash = strdup(it->db_hash);
                        }
                } else if (it->db_hash && ST(s)->foreign_hash) {
                        log_notice("schedule %s: the nodes agree on its timing again", s->name);
                        free(ST(s)->foreign_hash);
                        ST(s)->foreign_hash = NULL;
                }
                if (c->stopped)
                        continue;
                if (it->outcome == DB_LOST) {
                        char at[PLANNER_FIRED_AT_LEN];
                        chronos_fmt_time(after, at);
                        log_event(LOG_INFO, NULL, LOG_FIELDS({ "SCHEDULE", s->name }),
                                  "schedule %s: another node evaluated it up to %s first: the "
                                  "missed ticks are that node's",
                                  s->name, at);
                }
                if (!sched_fires(s)) {
                        ST(s)->hole_lo = ST(s)->hole_hi = NEVER;
                        continue;
                }
                if (it->outcome == DB_WON)
                        db_fire_window(c, s, it);
                db_refire_holes(c, s, it->upto);
        }
        if (j->r < 0) {
                if (!ts->down)
                        log_event(LOG_WARNING, NULL, NULL, 0,
                                  "the schedules' state in the database cannot be read or "
                                  "written (%s): on-time ticks fire from this node's state, "
                                  "missed ones wait; trying again every %d s",
                                  j->err, DB_RETRY_MS / 1000);
                ts->down = true;
                ts->dirty = true;
                db_retry_later(c);
        } else if (ts->down) {
                ts->down = false;
                log_notice("the schedules' state in the database is reachable again");
        }
        db_job_free(j);
        if (ts->dirty && !ts->down)
                pgt_round(c);
}

static void on_db_retry(uv_timer_t *t)
{
        struct chronos *c = t->data;
        pgt_round(c);
}

/* ---- the ticks driver (driver.h) ---- */

int pgt_attach(struct chronos *c)
{
        struct ticks_state *ts = calloc(1, sizeof(*ts));
        if (!ts)
                return -ENOMEM;
        int r = uv_timer_init(c->d->loop, &ts->retry);
        if (r < 0) {
                free(ts);
                return r;
        }
        ts->retry.data = c;
        ts->timer_init = true;
        c->drv_state = ts;
        return 0;
}

/* What decides which ticks fire, hashed: nodes that share a schedule must
 * agree on it (compared with the database's row). */
static void timing_hash(const struct config_schedule *cfg, char out[CANON_HASH_STRLEN])
{
        char *text = NULL;
        if (asprintf(&text,
                     "cron=%s\ntime_zone=%s\nmissed_policy=%s\nmax_catch_up_runs=%u\n"
                     "stale_after_sec=%llu\nmissed_grace_sec=%llu\n",
                     cfg->cron, cfg->time_zone ? cfg->time_zone : "UTC",
                     chronos_policy_name(cfg->missed_policy), cfg->max_catch_up_runs,
                     (unsigned long long)cfg->stale_after_sec,
                     (unsigned long long)cfg->missed_grace_sec) < 0) {
                snprintf(out, CANON_HASH_STRLEN, "unknown");
                return;
        }
        canon_hash_bytes(text, strlen(text), out);
        free(text);
}

int pgt_sched_new(struct chronos *c, struct sched *s)
{
        struct sched_ticks *st = calloc(1, sizeof(*st));
        if (!st)
                return -ENOMEM;
        st->hole_lo = st->hole_hi = st->local_from = NEVER;
        if (!s->broken)
                timing_hash(s->cfg, st->hash);
        s->drv_state = st;
        return 0;
}

void pgt_sched_carry(struct sched *s, struct sched *old)
{
        ST(s)->hole_lo = ST(old)->hole_lo;
        ST(s)->local_from = ST(old)->local_from;
        ST(s)->hole_hi = ST(old)->hole_hi;
        if (strcmp(ST(s)->hash, ST(old)->hash) == 0) {
                ST(s)->foreign_hash = ST(old)->foreign_hash;
                ST(old)->foreign_hash = NULL;
        }
}

void pgt_sched_loaded(struct sched *s)
{
        ST(s)->local_from = s->last_evaluated;
}

void pgt_sched_free(struct sched *s)
{
        struct sched_ticks *st = s->drv_state;
        if (st)
                free(st->foreign_hash);
        free(st);
        s->drv_state = NULL;
}

/* after the loop is closed */
void pgt_detach(struct chronos *c)
{
        free(c->drv_state);
        c->drv_state = NULL;
}

void pgt_stop(struct chronos *c)
{
        struct ticks_state *ts = c->drv_state;
        if (ts && ts->timer_init) {
                uv_timer_stop(&ts->retry);
                uv_close((uv_handle_t *)&ts->retry, NULL);
                ts->timer_init = false;
        }
}

/* This node fires the on-time ticks; the missed ones are the cluster's,
 * decided once by the round that wins the schedule's row (db_after). */
bool pgt_missed_here(const struct chronos *c)
{
        (void)c;
        return false;
}

void pgt_settled(struct chronos *c)
{
        struct ticks_state *ts = c->drv_state;
        if (ts && ts->dirty)
                pgt_round(c);
}

/* Start a round, or note that one is due once the fires are answered and
 * the round in flight is over. */
void pgt_round(struct chronos *c)
{
        struct ticks_state *ts = c->drv_state;
        if (!ts || c->stopped)
                return;
        if (ts->busy || c->nunanswered) {
                ts->dirty = true;
                return;
        }
        if (!own_may_act(c->d)) {
                /* its claims would fail: wait for the lease to be renewed */
                ts->dirty = true;
                db_retry_later(c);
                return;
        }
        ts->dirty = false;
        if (ts->timer_init)
                uv_timer_stop(&ts->retry);
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
                memcpy(it->hash, ST(s)->hash, sizeof it->hash);
                it->upto = s->last_evaluated;
                it->next_fire = s->next_fire;
                it->local_from = ST(s)->local_from;
                it->prev_ms = it->after_ms = -1;
        }
        if (j->n == 0) {
                db_job_free(j);
                return;
        }
        j->req.data = j;
        if (uv_queue_work(c->d->loop, &j->req, db_work, db_after) < 0) {
                db_job_free(j);
                ts->dirty = true;
                db_retry_later(c);
                return;
        }
        ts->busy = true;
}

/* An on-time tick whose claim could not reach the database
 * is fired again by the next round that does (docs/design.md §14). */
bool pgt_unclaimed(struct chronos *c, const char *name, int64_t t, const struct op_result *r)
{
        if (!c || !c->drv_state || strcmp(r->code, "cluster_unavailable") != 0)
                return false;
        struct ticks_state *ts = c->drv_state;
        struct sched *s = chronos_find(c, name);
        if (!s)
                return false;
        if (ST(s)->hole_lo == NEVER || t < ST(s)->hole_lo)
                ST(s)->hole_lo = t;
        if (ST(s)->hole_hi == NEVER || t > ST(s)->hole_hi)
                ST(s)->hole_hi = t;
        ts->dirty = true; /* a round once the fires are answered */
        return true;
}
