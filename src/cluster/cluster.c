/* SPDX-License-Identifier: MIT */
/* cluster: kairosd as a node of many sharing PostgreSQL (cluster.h,
 * docs/design.md §14).
 *
 * Three places run its code:
 *   pool threads   the barrier of each WAL (claim, create, fenced append)
 *                  on a connection of the node's pool, lent for the job;
 *   the heartbeat thread  node heartbeat, lease renewal of the mandates
 *                  this node holds, takeover of expired ones (their rows
 *                  become the WAL file), removal of forgotten WAL files;
 *   the loop       holding and dropping mandates, the fence timer (kills
 *                  every handler when the lease deadline passes), adopting
 *                  taken mandates through recovery.
 * The two threads and the loop share `struct cluster`'s lists under
 * c->lock; the heartbeat thread tells the loop through c->async. */
#include "driver_postgres.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"

#include <jansson.h>

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "deadman.h"
#include "kairos/evidence.h"
#include "kairos/kbuf.h"
#include "kairos/kio.h"
#include "kairos/kmem.h"
#include "kairos/statedir.h"
#include "kairos/wal.h"
#include "log.h"

/* A clock this far off the database's is shown and warned about (it is
 * also what the tick claim allows ahead of the database's clock). */
#define CLUSTER_SKEW_BOUND_MS 2000
#include "pgstore.h"

#define TAKEOVER_PER_ROUND 16
#define TAKEOVER_POLL_MS 1000        /* between heartbeats, look for expired leases */
#define FENCE_TICK_MS 200
/* after a failed beat the next one comes this soon (at most a ninth of the
 * lease): a database back from an outage is renewed with before the
 * deadline passes */
#define RENEW_RETRY_MS 250
/* The connections a node's pool threads share (docs/design.md §14): each
 * costs the database a backend, whose first calls (start, catalog caches,
 * the functions compiled, their plans) cost it more CPU than a hundred
 * barriers; a barrier holds one for one round trip. */
#define POOL_CONNS 4

enum cev_kind { CEV_LOST, CEV_TAKEN };

struct cev {
        enum cev_kind kind;
        char *id;
        int64_t epoch;
        char *prev_owner;
        char *why;
        struct evidence_index *ix;   /* CEV_TAKEN: its tool calls */
        /* CEV_TAKEN by an operator's command: told once adopted */
        void (*cb)(void *ctx, struct mandate *m, int err);
        void *ctx;
        struct cev *next;
};

struct take_job;

struct held {
        char *id;
        int64_t epoch;
        bool lost;          /* not renewed any more */
};

struct cluster {
        struct daemon *d;
        char *node, *conninfo;
        int64_t lease_ms, grace_ms, incarnation;

        pthread_mutex_t lock;
        pthread_cond_t cond;
        bool stop;
        bool takeover;                 /* READY: take over expired mandates */
        bool thread_started;
        pthread_t thread;
        /* under lock */
        struct held *held;
        size_t nheld, capheld;
        int64_t deadline_ms;           /* monotonic: the lease may end after this */
        struct cev *ev_head, *ev_tail;
        char **unlink;                 /* forgotten WAL files, removed by the thread */
        size_t nunlink, capunlink;
        /* the pool threads' connections (cluster_thread_store): at most
         * POOL_CONNS, each lent to one thread for one job at a time */
        struct pgstore *stores[POOL_CONNS];
        struct pgstore *idle[POOL_CONNS];
        size_t nstores, nidle, nconnecting;
        pthread_cond_t store_cond;     /* a connection was given back */
        unsigned renew_failures;
        char renew_error[256];
        /* this node's clock minus the database's, as of the last beat
         * (skew_known: measured once at least) */
        int64_t skew_ms;
        bool skew_known, skew_over;     /* beyond CLUSTER_SKEW_BOUND_MS (warned) */
        int64_t test_skew_ms;           /* test hook: added to this node's clock */
        bool deadman_dead;             /* its watcher is gone: act no more */
        bool superseded;               /* a newer kairosd registered this NodeName= */
        struct pgstore_node_row *nodes;  /* the cluster's nodes at the last beat */
        size_t nnodes;
        int64_t nodes_at_ms;
        /* loop only */
        uv_async_t async;
        uv_timer_t fence_timer;
        bool fenced;                   /* the deadline passed: everything dropped */
        bool deadman_reported;
        bool superseded_reported;
        struct deadman *deadman;       /* forked at start (pgd_prefork) */
        uv_timer_t slot_timer;         /* ask again for refused slots (cluster_executor.c) */
        struct cev *adopt_head;        /* taken, waiting for the old copy to go */
        struct serialq ops_q;          /* operators' reads and takes (cluster_submit) */
        struct take_job *waiters;      /* taken for a command, waiting to settle */
        /* under lock: ids being taken for a command (their copy is written
         * before the loop adopts them) */
        char *taking[8];
        size_t ntaking;
};

/* the deadman between pgd_prefork and pgd_start (one daemon per process) */
static struct deadman *deadman;

static void park_scan(struct cluster *c);
static int finish_as(struct mandate *m, const char *status);
static void check_waiters(struct cluster *c);

static __thread struct pgstore *tls_store;     /* lent to this thread until its job ends */
static __thread struct cluster *tls_cluster;
static struct daemon *log_daemon;

static long long epoch_lookup(const char *mandate_id)
{
        struct mandate *m = log_daemon ? mandate_find(log_daemon, mandate_id) : NULL;
        return m ? (long long)m->epoch : 0;
}

/* The mandate's tool calls in kairos_idem (a takeover has just marked the
 * old epochs' processing ones interrupted) as recovery's evidence.  A row
 * this build cannot read makes it unknown: the store then decides no step. */
static int evidence_index(struct pgstore *s, const char *mandate_id,
                          struct evidence_index **ret_ix)
{
        struct pgstore_idem_row *rows = NULL;
        size_t n = 0;
        int r = pgstore_idem_of_mandate(s, mandate_id, &rows, &n);
        if (r == 0)
                r = pgstore_idem_evidence(mandate_id, rows, n, ret_ix);
        pgstore_idem_rows_free(rows, n);
        if (r == -EBADMSG)
                r = evidence_index_unknown(ret_ix);
        return r;
}

static int64_t mono_ms(void)
{
        return (int64_t)now_ms_monotonic();
}

/* ---- the connection of a pool thread ---- */

void cluster_thread_failed(struct pgstore *s, int r, char *buf, size_t len)
{
        snprintf(buf, len, "%s", pgstore_error(s));
        if (r == -ENOTCONN)
                (void)pgstore_reset(s);
}

/* why this thread's last cluster_thread_store failed */
static __thread char tls_store_err[256];

const char *cluster_thread_error(void)
{
        return tls_store_err[0] ? tls_store_err : "cannot connect to the database";
}

struct pgstore *cluster_thread_store(struct daemon *d, int *ret_err)
{
        struct cluster *c = d->cluster;
        if (!c) {
                *ret_err = -EPROTONOSUPPORT;
                return NULL;
        }
        if (tls_store)
                return tls_store;
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += (time_t)(c->lease_ms / 2000);
        until.tv_nsec += (long)(c->lease_ms / 2 % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
        }
        struct pgstore *s = NULL;
        int r = 0;
        tls_store_err[0] = '\0';
        pthread_mutex_lock(&c->lock);
        while (!s) {
                if (c->nidle) {
                        s = c->idle[--c->nidle];
                        if (pgstore_connected(s))
                                break;
                        /* broken under an earlier job (the server
                         * restarted): made again before it is lent, or
                         * back to the pool and the reason to the caller */
                        pthread_mutex_unlock(&c->lock);
                        r = pgstore_reset(s);
                        if (r < 0)
                                snprintf(tls_store_err, sizeof tls_store_err, "%s",
                                         pgstore_error(s));
                        pthread_mutex_lock(&c->lock);
                        if (r < 0) {
                                c->idle[c->nidle++] = s;
                                s = NULL;
                                pthread_cond_signal(&c->store_cond);
                        }
                        break;
                }
                if (c->nstores + c->nconnecting < POOL_CONNS) {
                        c->nconnecting++;
                        pthread_mutex_unlock(&c->lock);
                        char err[256];
                        r = pgstore_connect(c->conninfo, &s, err, sizeof err);
                        if (r < 0)
                                snprintf(tls_store_err, sizeof tls_store_err, "%s", err);
                        pthread_mutex_lock(&c->lock);
                        c->nconnecting--;
                        if (r < 0) {
                                /* another thread may try its own */
                                pthread_cond_signal(&c->store_cond);
                                break;
                        }
                        c->stores[c->nstores++] = s;
                        break;
                }
                /* every connection is lent: one comes back within a call's
                 * time, unless the database does not answer */
                if (pthread_cond_timedwait(&c->store_cond, &c->lock, &until) == ETIMEDOUT) {
                        r = -ETIMEDOUT;
                        snprintf(tls_store_err, sizeof tls_store_err,
                                 "every connection to the database is busy");
                        break;
                }
        }
        pthread_mutex_unlock(&c->lock);
        if (!s) {
                *ret_err = r;
                return NULL;
        }
        tls_store = s;
        tls_cluster = c;
        return s;
}

struct pgstore *cluster_thread_store_why(struct daemon *d, int *ret_err, char *why, size_t len)
{
        struct pgstore *s = cluster_thread_store(d, ret_err);
        if (!s)
                snprintf(why, len, "%s", cluster_thread_error());
        return s;
}

void cluster_thread_done(void)
{
        struct cluster *c = tls_cluster;
        if (!tls_store || !c)
                return;
        pthread_mutex_lock(&c->lock);
        c->idle[c->nidle++] = tls_store;
        pthread_cond_signal(&c->store_cond);
        pthread_mutex_unlock(&c->lock);
        tls_store = NULL;
        tls_cluster = NULL;
}

/* Run op until it is not a broken connection, reconnecting, for at most
 * half a lease (then the lease may be gone anyway). */
void cluster_backoff(unsigned attempt)
{
        struct timespec ts = { 0, (long)(attempt < 5 ? 100 << attempt : 2000) * 1000000L };
        if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec = ts.tv_nsec / 1000000000L;
                ts.tv_nsec %= 1000000000L;
        }
        nanosleep(&ts, NULL);
}

/* ---- the barrier of a WAL (pool thread) ---- */

/* kairosctl retry: compare-and-set per tick in the database (docs/design.md
 * §3).  Refused: -EBUSY with the mandate that refused it in cluster_busy
 * (unfinished, or ended succeeded while no reason was given). */
static int create_retry(struct cluster *c, struct pgstore *s, struct mandate *m,
                        int64_t fired_ms, const char *lines, size_t len)
{
        struct pgstore_retry rt = { .mandate_id = m->id, .schedule = m->schedule,
                                    .fired_at_ms = fired_ms, .retry_of = m->retry_of,
                                    .retry = m->retry, .forced = m->retry_forced };
        bool created;
        char *busy, *busy_status, *busy_owner;
        int r = pgstore_retry_create(s, &rt, c->node, c->lease_ms, lines, len, &created, &busy,
                                     &busy_status, &busy_owner);
        if (r < 0)
                return r;
        if (created) {
                m->epoch = 1;
                return 0;
        }
        /* Its own id: an earlier attempt of this node whose commit was
         * unknown (its rows are these bytes); another node's retry of the
         * same number has the same id, maybe even the same bytes (made in
         * the same millisecond), and is never taken for ours */
        r = -EBUSY;
        bool ours = strcmp(busy_owner, c->node) == 0;
        free(busy_owner);
        if (ours && strcmp(busy, m->id) == 0 && strcmp(busy_status, "running") == 0) {
                int a = pgstore_wal_append(s, m->id, 1, 1, lines, len, NULL);
                if (a == 0)
                        m->epoch = 1;
                if (a == 0 || a == -ENOTCONN || a == -ECONNREFUSED || a == -ETIMEDOUT)
                        r = a; /* (a broken connection: the barrier asks again) */
        }
        free(CM(m)->busy);
        free(CM(m)->busy_status);
        CM(m)->busy = r ? busy : NULL;
        CM(m)->busy_status = r ? busy_status : NULL;
        if (!r) {
                free(busy);
                free(busy_status);
        }
        return r;
}

static int claim_or_create(struct cluster *c, struct pgstore *s, struct mandate *m,
                           const char *lines, size_t len)
{
        int64_t fired_ms;
        if (wal_parse_ts(m->fired_at, &fired_ms) < 0)
                return -EINVAL;
        if (m->retry_of)
                return create_retry(c, s, m, fired_ms, lines, len);
        struct pgstore_claim cl;
        int r = CM(m)->reject
                        ? pgstore_claim_tick_reject(s, m->schedule, fired_ms, m->id, c->node,
                                                    c->lease_ms, lines, len, &cl)
                        : pgstore_claim_tick(s, m->schedule, fired_ms, m->id, c->node, c->lease_ms,
                                             lines, len, &cl);
        if (r < 0)
                return r;
        if (cl.rejected) {
                /* Concurrency=reject: another mandate of the schedule is
                 * unfinished in the cluster (said by advance_done) */
                free(CM(m)->busy);
                free(CM(m)->busy_status);
                CM(m)->busy = cl.busy;
                CM(m)->busy_status = cl.busy_status;
                cl.busy = cl.busy_status = NULL;
                r = -EBUSY;
        } else if (cl.won) {
                m->epoch = 1;
        } else if (cl.claimed_by && strcmp(cl.claimed_by, c->node) == 0 && cl.mandate_id &&
                   strcmp(cl.mandate_id, m->id) == 0) {
                /* Ours: an earlier attempt whose commit was unknown, or an
                 * older incarnation of this node.  The rows tell: identical
                 * bytes are this attempt's. */
                r = pgstore_wal_append(s, m->id, 1, 1, lines, len, NULL);
                if (r == 0)
                        m->epoch = 1;
                else
                        r = -EALREADY;
        } else {
                free(CM(m)->winner);
                CM(m)->winner = cl.claimed_by ? strdup(cl.claimed_by) : NULL;
                r = -EALREADY;
        }
        pgstore_claim_free(&cl);
        return r;
}

/* A tick claim refused as ahead of the database's clock (this node's clock
 * runs fast): the claim waits until the tick is due by the database's clock,
 * a second at a time (the mandate may be dropped meanwhile), then claims it.
 * It waits at most SKEW_WAIT_MAX_MS in all: a clock that far ahead is broken
 * (the barrier fails with -ETIME, logged). */
#define SKEW_WAIT_MAX_MS (10 * 60 * 1000)

/* How long until the tick of m is due by the database's clock (<= 0: due
 * now), at most a second. */
static int64_t skew_wait_ms(struct pgstore *s, const struct mandate *m)
{
        int64_t fired_ms, db_ms;
        if (wal_parse_ts(m->fired_at, &fired_ms) < 0)
                return 0;
        if (pgstore_db_now(s, &db_ms) < 0)
                return 1000;
        int64_t w = fired_ms - db_ms;
        return w > 1000 ? 1000 : w;
}

static int wal_barrier(void *ctx, int64_t first_seq, const char *lines, size_t len)
{
        struct mandate *m = ctx;
        struct cluster *c = m->d->cluster;
        int64_t give_up = mono_ms() + c->lease_ms / 2;
        int64_t skew_give_up = mono_ms() + SKEW_WAIT_MAX_MS;
        bool not_due = false;           /* refused as ahead of the database's clock */
        int r = 0;
        for (unsigned attempt = 0;; attempt++) {
                /* never claimed (its claim failed): that failure, not a
                 * fence, since no node may hold it */
                if (__atomic_load_n(&CM(m)->dropped, __ATOMIC_ACQUIRE))
                        return m->epoch == 0 && CM(m)->claim_err ? CM(m)->claim_err : -ESTALE;
                struct pgstore *s = cluster_thread_store(m->d, &r);
                int64_t w = s && not_due ? skew_wait_ms(s, m) : 0;
                /* (kairosd stopping: the tick is left to the other nodes
                 * rather than holding the stop up for the skew) */
                if (w > 0 && mono_ms() < skew_give_up &&
                    !__atomic_load_n(&m->d->stopping, __ATOMIC_RELAXED)) {
                        /* not yet due by the database's clock: nobody may
                         * claim it yet, this node neither (its connection
                         * goes back to the pool meanwhile) */
                        cluster_thread_done();
                        struct timespec ts = { w / 1000, (long)(w % 1000) * 1000000L };
                        nanosleep(&ts, NULL);
                        continue;
                }
                if (s) {
                        if (m->epoch == 0 && first_seq == 1)
                                r = claim_or_create(c, s, m, lines, len);
                        else if (m->epoch == 0)
                                /* its claim failed (this mandate's, or an
                                 * earlier attempt's whose rows are still
                                 * being forgotten here): not fenced, no
                                 * node may hold it */
                                r = CM(m)->claim_err ? CM(m)->claim_err : -EAGAIN;
                        else
                                r = pgstore_wal_append(s, m->id, m->epoch, first_seq, lines, len,
                                                       NULL);
                        if (r < 0)
                                snprintf(CM(m)->db_error, sizeof CM(m)->db_error, "%s",
                                         pgstore_error(s));
                        if (r == -ENOTCONN && pgstore_reset(s) < 0)
                                r = -ENOTCONN;
                        if (r == -ETIME && m->epoch == 0 && mono_ms() < skew_give_up &&
                            !__atomic_load_n(&m->d->stopping, __ATOMIC_RELAXED)) {
                                not_due = true;
                                give_up = mono_ms() + c->lease_ms / 2;
                                continue;  /* (keeps its connection: asks the time) */
                        }
                } else {
                        snprintf(CM(m)->db_error, sizeof CM(m)->db_error, "%s",
                                 cluster_thread_error());
                }
                if ((r != -ENOTCONN && r != -ECONNREFUSED && r != -ETIMEDOUT) ||
                    mono_ms() >= give_up) {
                        /* a claim that failed, not lost: kept for what
                         * comes after it (a later flush, a second fire) */
                        if (m->epoch == 0 && first_seq == 1 && r < 0 && r != -EALREADY &&
                            r != -EBUSY && r != -ESTALE)
                                CM(m)->claim_err = r;
                        return r;
                }
                cluster_thread_done();  /* others may use it meanwhile */
                cluster_backoff(attempt);
        }
}

void pgd_wal_options(struct mandate *m, struct wal_options *o)
{
        if (!m->d->cluster)
                return;
        o->barrier = wal_barrier;
        o->barrier_ctx = m;
}

/* ---- what the loop holds ---- */

static struct held *held_find(struct cluster *c, const char *id)
{
        for (size_t i = 0; i < c->nheld; i++)
                if (strcmp(c->held[i].id, id) == 0)
                        return &c->held[i];
        return NULL;
}

void pgd_hold(struct mandate *m)
{
        struct cluster *c = m->d->cluster;
        if (!c || CM(m)->held || m->epoch <= 0)
                return;
        char *id = strdup(m->id);
        if (!id)
                return;
        pthread_mutex_lock(&c->lock);
        struct held *h = held_find(c, m->id);
        if (h) {
                h->epoch = m->epoch;
                h->lost = false;
                free(id);
        } else {
                if (c->nheld == c->capheld) {
                        size_t cap = c->capheld ? 2 * c->capheld : 64;
                        struct held *n = realloc(c->held, cap * sizeof(*n));
                        if (n) {
                                c->held = n;
                                c->capheld = cap;
                        }
                }
                if (c->nheld < c->capheld)
                        c->held[c->nheld++] = (struct held){ .id = id, .epoch = m->epoch };
                else
                        free(id);
        }
        pthread_mutex_unlock(&c->lock);
        CM(m)->held = true;
}

void pgd_release(struct mandate *m)
{
        struct cluster *c = m->d->cluster;
        CM(m)->db_slot = false; /* freed with the row's end or park */
        if (!c || !CM(m)->held)
                return;
        pthread_mutex_lock(&c->lock);
        struct held *h = held_find(c, m->id);
        if (h) {
                free(h->id);
                *h = c->held[--c->nheld];
        }
        pthread_mutex_unlock(&c->lock);
        CM(m)->held = false;
}

const char *pgd_node(const struct daemon *d)
{
        return d->cluster ? d->cluster->node : NULL;
}

int64_t cluster_lease_ms(const struct daemon *d)
{
        return d->cluster ? d->cluster->lease_ms : 0;
}

bool pgd_may_act(const struct daemon *d)
{
        struct cluster *c = d->cluster;
        if (!c)
                return true;
        pthread_mutex_lock(&c->lock);
        int64_t deadline = c->deadline_ms;
        bool guarded = !c->deadman_dead;
        pthread_mutex_unlock(&c->lock);
        return guarded && deadline > 0 && mono_ms() < deadline - c->lease_ms / 3;
}

int64_t cluster_deadline_ms(const struct daemon *d)
{
        struct cluster *c = d->cluster;
        if (!c)
                return 0;
        pthread_mutex_lock(&c->lock);
        int64_t deadline = c->deadline_ms;
        pthread_mutex_unlock(&c->lock);
        return deadline;
}

/* The file of a forgotten mandate goes (on the heartbeat thread: no I/O on
 * the loop). */
static void forget_file(struct cluster *c, const char *path)
{
        char *p = strdup(path);
        if (!p)
                return;
        pthread_mutex_lock(&c->lock);
        if (c->nunlink == c->capunlink) {
                size_t cap = c->capunlink ? 2 * c->capunlink : 16;
                char **n = realloc(c->unlink, cap * sizeof(*n));
                if (n) {
                        c->unlink = n;
                        c->capunlink = cap;
                }
        }
        if (c->nunlink < c->capunlink) {
                c->unlink[c->nunlink++] = p;
                p = NULL;
        }
        pthread_mutex_unlock(&c->lock);
        free(p);
}

void pgd_drop(struct mandate *m, const char *why)
{
        struct cluster *c = m->d->cluster;
        if (!c || __atomic_load_n(&CM(m)->dropped, __ATOMIC_ACQUIRE))
                return;
        __atomic_store_n(&CM(m)->dropped, true, __ATOMIC_RELEASE);
        char ep[24];
        snprintf(ep, sizeof ep, "%lld", (long long)m->epoch);
        /* (a lost tick claim was never this node's: said by the caller) */
        if (m->epoch > 0)
                log_event(LOG_NOTICE, NULL, LOG_FIELDS({ "MANDATE_ID", m->id }, { "EPOCH", ep }),
                          "mandate %s: no longer held by node %s (%s): another node takes it "
                          "over",
                          m->id, c->node, why);
        pthread_mutex_lock(&c->lock);
        struct held *h = held_find(c, m->id);
        if (h)
                h->lost = true;
        pthread_mutex_unlock(&c->lock);
        if (m->d->up.kill_handler)
                m->d->up.kill_handler(m, SIGKILL);
        /* a queued mandate leaves the queue when its turn comes (executor_kick
         * skips dropped ones); an idle one goes at the next fence tick */
}

uint64_t pgd_kill_mark(const struct daemon *d)
{
        return d->cluster ? deadman_kills(d->cluster->deadman) : 0;
}

bool pgd_killed_here(struct mandate *m, uint64_t mark)
{
        struct cluster *c = m->d->cluster;
        if (!c)
                return false;
        /* The deadman may kill at a deadline that a renewal answered just
         * after (the database came back): kairosd's own deadline has moved
         * on, the deadman's count says it killed. */
        int64_t deadline = cluster_deadline_ms(m->d);
        bool lapsed = deadline > 0 && mono_ms() >= deadline;
        if (!pgd_dropped(m) && !lapsed && deadman_kills(c->deadman) == mark)
                return false;
        pgd_drop(m, lapsed || deadman_kills(c->deadman) != mark
                            ? "its handler was killed at this node's lease deadline"
                            : "its handler was killed when it was dropped");
        return true;
}

bool pgd_dropped(const struct mandate *m)
{
        return __atomic_load_n(&CM(m)->dropped, __ATOMIC_ACQUIRE);
}

bool pgd_retry_creating(const struct mandate *m)
{
        return m->d->cluster && m->retry_of && m->flushes == 0 &&
               (m->status == MANDATE_RUNNING || m->status == MANDATE_RUNNABLE);
}

static bool sweepable(const struct mandate *m)
{
        return pgd_dropped(m) && !m->busy && !m->queued && !m->holds_slot && !m->run &&
               serialq_idle(&m->q);
}

/* Forget one dropped mandate (sweepable).  false: still busy, forgotten
 * later. */
static bool forget_dropped(struct cluster *c, struct mandate *m)
{
        if (m->wal) {
                wal_close(m->wal);
                m->wal = NULL;
        }
        /* (a newer copy of its rows, taken over, waits to be adopted
         * under the same name: the file is that copy now) */
        bool retaken = false;
        for (struct cev *e = c->adopt_head; e && !retaken; e = e->next)
                retaken = strcmp(e->id, m->id) == 0;
        pthread_mutex_lock(&c->lock);
        for (size_t t = 0; t < c->ntaking && !retaken; t++)
                retaken = strcmp(c->taking[t], m->id) == 0;
        pthread_mutex_unlock(&c->lock);
        if (!retaken)
                forget_file(c, m->wal_path);
        pgd_release(m);
        if (mandate_remove(m) < 0) {
                log_debug("mandate %s: busy, forgotten later", m->id);
                return false;
        }
        return true;
}

/* Forget dropped mandates once nothing of theirs runs. */
static void sweep(struct cluster *c)
{
        struct daemon *d = c->d;
        size_t pos = 0;
        const char *k;
        void *v;
        struct mandate *gone[64];
        size_t n = 0;
        while (n < 64 && strmap_next(d->mandates, &pos, &k, &v) == 0) {
                struct mandate *m = v;
                if (sweepable(m))
                        gone[n++] = m;
        }
        for (size_t i = 0; i < n; i++)
                forget_dropped(c, gone[i]);
}

bool pgd_forget_dropped(struct mandate *m)
{
        struct cluster *c = m->d->cluster;
        return c && sweepable(m) && forget_dropped(c, m);
}

/* ---- adopting taken mandates (loop) ---- */

static void cev_free(struct cev *e)
{
        if (e->cb)
                e->cb(e->ctx, NULL, -ESHUTDOWN);
        FREE_ALL(e->id, e->prev_owner, e->why);
        evidence_index_free(e->ix);
        free(e);
}

static bool adopt(struct cluster *c, struct cev *e)
{
        struct daemon *d = c->d;
        struct mandate *old = mandate_find(d, e->id);
        if (old) {
                /* our old copy (lost, or its lease ran out): it must go first */
                pgd_drop(old, "taken over at a newer epoch");
                return false;
        }
        if (d->stopping)
                return true;   /* (cev_free tells a command) */
        char *path = NULL;
        struct mandate *m = statedir_wal_path(&d->paths, e->id, &path) < 0
                                    ? NULL
                                    : mandate_add(d, e->id, path);
        free(path);
        if (!m) {
                log_error("mandate %s: taken over but out of memory: it is taken again later",
                          e->id);
                return true;
        }
        m->epoch = e->epoch;
        pgd_hold(m);
        char ep[24];
        snprintf(ep, sizeof ep, "%lld", (long long)e->epoch);
        log_event(LOG_NOTICE, MSGID_RECOVERY,
                  LOG_FIELDS({ "MANDATE_ID", m->id }, { "EPOCH", ep },
                             { "PREV_OWNER", e->prev_owner }),
                  "mandate %s: taken over from %s at epoch %lld: deciding its interrupted steps",
                  m->id, e->prev_owner ? e->prev_owner : "nobody", (long long)e->epoch);
        d->up.adopt(d, m, e->prev_owner, e->ix, e->cb, e->ctx);
        e->ix = NULL;
        e->cb = NULL;
        return true;
}

static void process_adopts(struct cluster *c)
{
        struct cev **pp = &c->adopt_head;
        while (*pp) {
                struct cev *e = *pp;
                if (adopt(c, e)) {
                        *pp = e->next;
                        cev_free(e);
                } else {
                        pp = &e->next;
                }
        }
}

static void on_async(uv_async_t *h)
{
        struct cluster *c = h->data;
        pthread_mutex_lock(&c->lock);
        struct cev *list = c->ev_head;
        c->ev_head = c->ev_tail = NULL;
        pthread_mutex_unlock(&c->lock);
        while (list) {
                struct cev *e = list;
                list = e->next;
                e->next = NULL;
                if (e->kind == CEV_LOST) {
                        struct mandate *m = mandate_find(c->d, e->id);
                        if (m && m->epoch == e->epoch)
                                pgd_drop(m, e->why ? e->why : "lease not renewed");
                        cev_free(e);
                } else {
                        e->next = c->adopt_head;
                        c->adopt_head = e;
                }
        }
        process_adopts(c);
        sweep(c);
}

static void on_fence_tick(uv_timer_t *t)
{
        struct cluster *c = t->data;
        struct daemon *d = c->d;
        pthread_mutex_lock(&c->lock);
        bool deadman_dead = c->deadman_dead;
        bool superseded = c->superseded;
        pthread_mutex_unlock(&c->lock);
        if (superseded && !c->superseded_reported && !d->stopping) {
                c->superseded_reported = true;
                /* two kairosd under one name: the older one can never
                 * renew again; it stops, failed, rather than stay up doing
                 * nothing (its service then shows failed) */
                log_event(LOG_ERR, NULL, NULL, 0,
                          "node %s: a newer kairosd registered NodeName=%s (incarnation "
                          "after %lld): this one stops (exit 1); give each node a "
                          "NodeName= of its own",
                          c->node, c->node, (long long)c->incarnation);
                /* stopped as by SIGTERM, with this exit code */
                d->exit_code = 1;
                raise(SIGTERM);
        }
        if (deadman_dead && !c->deadman_reported) {
                c->deadman_reported = true;
                log_event(LOG_ERR, NULL, NULL, 0,
                          "node %s: the deadman (kairosd-deadman) is gone: no handler could be "
                          "stopped if kairosd were; this node starts nothing more (restart it)",
                          c->node);
        }
        int64_t deadline = cluster_deadline_ms(d);
        if (deadline > 0 && mono_ms() >= deadline) {
                if (!c->fenced) {
                        c->fenced = true;
                        log_event(LOG_ERR, NULL, NULL, 0,
                                  "node %s could not renew its lease (%s): every handler is "
                                  "killed and every mandate left to the other nodes",
                                  c->node, c->renew_error[0] ? c->renew_error : "no answer");
                }
                size_t pos = 0;
                const char *k;
                void *v;
                while (strmap_next(d->mandates, &pos, &k, &v) == 0) {
                        struct mandate *m = v;
                        if (m->epoch > 0 && !pgd_dropped(m))
                                pgd_drop(m, "this node's lease ended");
                }
        } else if (c->fenced && deadline > 0) {
                c->fenced = false;
                log_notice("node %s renews its lease again", c->node);
        }
        process_adopts(c);
        check_waiters(c);
        park_scan(c);
        sweep(c);
}

/* ---- the heartbeat thread ---- */

static void post(struct cluster *c, struct cev *e)
{
        pthread_mutex_lock(&c->lock);
        if (c->ev_tail)
                c->ev_tail->next = e;
        else
                c->ev_head = e;
        c->ev_tail = e;
        pthread_mutex_unlock(&c->lock);
        uv_async_send(&c->async);
}

static void post_lost(struct cluster *c, const char *id, int64_t epoch, const char *why)
{
        struct cev *e = calloc(1, sizeof(*e));
        if (!e || !(e->id = strdup(id)) || !(e->why = strdup(why))) {
                if (e)
                        cev_free(e);
                return;
        }
        e->kind = CEV_LOST;
        e->epoch = epoch;
        post(c, e);
}

static int renew(struct cluster *c, struct pgstore *s)
{
        pthread_mutex_lock(&c->lock);
        size_t n = 0;
        const char **ids = calloc(c->nheld + 1, sizeof(*ids));
        int64_t *epochs = calloc(c->nheld + 1, sizeof(*epochs));
        bool *renewed = NULL;
        for (size_t i = 0; ids && epochs && i < c->nheld; i++)
                if (!c->held[i].lost && (ids[n] = strdup(c->held[i].id)))
                        epochs[n++] = c->held[i].epoch;
        /* Past its deadline (kairosd or the host was stopped, or the
         * database did not answer for a lease) the node has killed, or is
         * killing, every handler and drops every mandate: it must not
         * extend those leases now, but end them, so that another node takes
         * them at once instead of a lease later. */
        bool expired = c->deadline_ms > 0 && mono_ms() >= c->deadline_ms;
        pthread_mutex_unlock(&c->lock);
        int r = ids && epochs ? 0 : -ENOMEM;
        if (r == 0 && expired && n) {
                /* (not released: they end by themselves, a lease later) */
                (void)pgstore_lease_release_many(s, c->node, ids, epochs, n, c->grace_ms);
                for (size_t i = 0; i < n; i++)
                        post_lost(c, ids[i], epochs[i], "this node's lease ended: handed over");
                for (size_t i = 0; i < n; i++)
                        free((char *)ids[i]);
                n = 0;
        }
        int64_t sent = mono_ms();
        bool held_back = false;
#ifdef KAIROS_TEST_HOOKS
        /* tests: while this file exists the heartbeat gets no answer (the
         * other connections do): the deadline passes with the database up */
        const char *hold = getenv("KAIROS_TEST_RENEW_HOLD");
        held_back = r == 0 && hold && *hold && access(hold, F_OK) == 0;
        if (held_back)
                r = -ETIMEDOUT;
#endif
        /* the node's heartbeat and the leases, in one transaction, refused
         * to an older incarnation of this node */
        if (r == 0)
                r = pgstore_renew_held(s, c->node, c->incarnation, ids, epochs, n, c->lease_ms,
                                       &renewed);
        if (r == 0) {
                pthread_mutex_lock(&c->lock);
                c->deadline_ms = sent + c->lease_ms;
                /* A dead deadman (-EPIPE) cannot guard handlers any more:
                 * this node then stops acting (pgd_may_act) and its
                 * mandates go to the other nodes.  A full pipe (-EAGAIN)
                 * leaves the earlier deadline: the safe side. */
                if (c->deadman && deadman_set_deadline(c->deadman, c->deadline_ms) == -EPIPE)
                        c->deadman_dead = true;
                c->renew_failures = 0;
                c->renew_error[0] = '\0';
                pthread_mutex_unlock(&c->lock);
                for (size_t i = 0; renewed && i < n; i++)
                        if (!renewed[i])
                                post_lost(c, ids[i], epochs[i],
                                          "its lease was not renewed: taken over or ended");
        } else {
                pthread_mutex_lock(&c->lock);
                c->renew_failures++;
                snprintf(c->renew_error, sizeof c->renew_error, "%s",
                         held_back      ? "held back (KAIROS_TEST_RENEW_HOLD)"
                         : r == -ENOMEM ? "out of memory"
                         : r == -ESTALE ? "a newer kairosd runs with this NodeName="
                                        : pgstore_error(s));
                if (r == -ESTALE)
                        c->superseded = true;
                pthread_mutex_unlock(&c->lock);
        }
        for (size_t i = 0; ids && i < n; i++)
                free((char *)ids[i]);
        FREE_ALL(ids, epochs, renewed);
        return r;
}

/* The rows of a taken mandate become its WAL file (unsynced: the rows are
 * the truth, the file a copy); *ret_e is the mandate to adopt, with its
 * tool calls as evidence.  Heartbeat or pool thread. */
static int load_copy(struct cluster *c, struct pgstore *s, const char *id, int64_t epoch,
                     const char *prev_owner, struct cev **ret_e)
{
        struct kbuf b = KBUF_INIT;
        int64_t nrows = 0;
        char *path = NULL;
        int r = pgstore_wal_read(s, id, &b, &nrows);
        if (r == 0)
                r = statedir_wal_path(&c->d->paths, id, &path);
        if (r == 0) {
                /* an older copy forgotten meanwhile must not take this one
                 * with it */
                pthread_mutex_lock(&c->lock);
                for (size_t i = 0; i < c->nunlink;)
                        if (strcmp(c->unlink[i], path) == 0) {
                                free(c->unlink[i]);
                                c->unlink[i] = c->unlink[--c->nunlink];
                        } else {
                                i++;
                        }
                pthread_mutex_unlock(&c->lock);
        }
        if (r == 0)
                r = kio_write_file_nosync(kio_posix(), path, b.data ? b.data : "", b.len,
                                          WAL_FILE_MODE);
        struct evidence_index *ix = NULL;
        if (r == 0)
                r = evidence_index(s, id, &ix);
        struct cev *e = r == 0 ? calloc(1, sizeof(*e)) : NULL;
        if (r == 0 && (!e || !(e->id = strdup(id)) ||
                       (prev_owner && !(e->prev_owner = strdup(prev_owner)))))
                r = -ENOMEM;
        if (r == 0) {
                e->kind = CEV_TAKEN;
                e->epoch = epoch;
                e->ix = ix;
                ix = NULL;
                *ret_e = e;
                e = NULL;
        }
        if (e)
                cev_free(e);
        evidence_index_free(ix);
        free(path);
        kbuf_free(&b);
        return r;
}

static int take_one(struct cluster *c, struct pgstore *s, struct pgstore_takeover *t)
{
        struct cev *e = NULL;
        int r = load_copy(c, s, t->mandate_id, t->epoch, t->prev_owner, &e);
        if (r == 0)
                post(c, e);
        return r;
}

static void takeover_round(struct cluster *c, struct pgstore *s)
{
        for (int k = 0; k < TAKEOVER_PER_ROUND; k++) {
                pthread_mutex_lock(&c->lock);
                bool go = c->takeover && !c->stop &&
                          mono_ms() < c->deadline_ms - c->lease_ms / 3;
                pthread_mutex_unlock(&c->lock);
                if (!go)
                        return;
                struct pgstore_takeover t;
                int r = pgstore_lease_takeover(s, NULL, c->node, c->lease_ms, c->grace_ms, &t);
                if (r < 0)
                        return; /* -EBUSY: none */
                r = take_one(c, s, &t);
                if (r < 0) {
                        /* it stays ours at the new epoch; the lease is not
                         * renewed, so it is taken again (by anyone) */
                        log_warning("mandate %s: taken over at epoch %lld but cannot be loaded: "
                                    "%s",
                                    t.mandate_id, (long long)t.epoch,
                                    r == -EIO || r == -ENOTCONN ? pgstore_error(s)
                                                                : strerror(-r));
                }
                pgstore_takeover_free(&t);
        }
}

static void unlink_forgotten(struct cluster *c)
{
        pthread_mutex_lock(&c->lock);
        char **list = c->unlink;
        size_t n = c->nunlink;
        c->unlink = NULL;
        c->nunlink = c->capunlink = 0;
        pthread_mutex_unlock(&c->lock);
        for (size_t i = 0; i < n; i++) {
                (void)unlink(list[i]);
                free(list[i]);
        }
        free(list);
}

/* This node's clock against the database's, from one round trip (the
 * database's clock read half-way): kept for status and metrics, a warning
 * once when it goes beyond CLUSTER_SKEW_BOUND_MS and a notice once when it is
 * back within. */
static void measure_skew(struct cluster *c, struct pgstore *s)
{
        int64_t db_ms, m0 = mono_ms(), t0 = now_ms_realtime();
        if (pgstore_db_now(s, &db_ms) < 0)
                return;
        int64_t rtt = mono_ms() - m0;
        int64_t skew = t0 + rtt / 2 + c->test_skew_ms - db_ms;
        /* the round trip bounds the error: only a skew beyond it counts */
        int64_t sure = skew > 0 ? skew - rtt / 2 : skew + rtt / 2;
        if (sure > -rtt / 2 && sure < rtt / 2)
                sure = 0;
        bool over = sure > CLUSTER_SKEW_BOUND_MS || sure < -CLUSTER_SKEW_BOUND_MS;
        pthread_mutex_lock(&c->lock);
        bool was = c->skew_over;
        c->skew_ms = skew;
        c->skew_known = true;
        c->skew_over = over;
        pthread_mutex_unlock(&c->lock);
        if (over && !was)
                log_event(LOG_WARNING, NULL, NULL, 0,
                          "node %s: this node's clock is %+.1f s off the database's (more than "
                          "%d s): its cron ticks are claimed when they are due by the "
                          "database's clock, up to that much late; fix its time "
                          "synchronization (NTP)",
                          c->node, (double)skew / 1000.0, CLUSTER_SKEW_BOUND_MS / 1000);
        else if (!over && was)
                log_notice("node %s: this node's clock is within %d s of the database's again "
                           "(%+.1f s)",
                           c->node, CLUSTER_SKEW_BOUND_MS / 1000, (double)skew / 1000.0);
}


/* Once at start: whether the database acknowledges a commit that its
 * failover can lose (no synchronous standby, or synchronous_commit off or
 * local: the promoted standby lacks what the old primary acknowledged).
 * What it risks and how to set up a synchronous standby: kairosd(8),
 * docs/design.md §14. */
static void warn_losable_commits(struct pgstore *s)
{
        char *names = NULL, *commit = NULL;
        if (pgstore_commit_settings(s, &names, &commit) < 0) {
                log_debug("cluster: cannot read synchronous_standby_names and "
                          "synchronous_commit: %s", pgstore_error(s));
                return;
        }
        bool no_standby = names[0] == '\0';
        bool local = strcmp(commit, "off") == 0 || strcmp(commit, "local") == 0;
        if (no_standby || local)
                log_warning("cluster: the database acknowledges commits that a failover can "
                            "lose (%s%s%s%s): a fire, a tick's claim or a step's record "
                            "acknowledged by the primary may be missing on a promoted standby "
                            "(a tick fired again, an effect done twice); set up a synchronous "
                            "standby (synchronous_standby_names, synchronous_commit=on), see "
                            "kairosd(8)",
                            no_standby ? "synchronous_standby_names is empty: no synchronous "
                                         "standby"
                                       : "",
                            no_standby && local ? "; " : "",
                            local ? "synchronous_commit=" : "", local ? commit : "");
        free(names);
        free(commit);
}

static void *heartbeat_main(void *arg)
{
        struct cluster *c = arg;
        struct pgstore *s = NULL;
        char err[256];
        int64_t interval = c->lease_ms / 3;
        int64_t next_renew = 0;  /* due now */
        int r = 0;
        pthread_mutex_lock(&c->lock);
        while (!c->stop) {
                pthread_mutex_unlock(&c->lock);
                int64_t start = mono_ms();
                if (start < next_renew) {
                        /* between beats: only look for mandates to take over
                         * (every TAKEOVER_POLL_MS: the failover time is the
                         * lease, the grace and this) */
                        if (s && r == 0)
                                takeover_round(c, s);
                        unlink_forgotten(c);
                        goto wait;
                }
                r = 0;
                if (!s && (r = pgstore_connect(c->conninfo, &s, err, sizeof err)) < 0) {
                        pthread_mutex_lock(&c->lock);
                        c->renew_failures++;
                        snprintf(c->renew_error, sizeof c->renew_error, "%s", err);
                        pthread_mutex_unlock(&c->lock);
                }
                if (s) {
                        r = renew(c, s);
                        if (r == -ENOTCONN || r == -ECONNREFUSED)
                                (void)pgstore_reset(s);
                        else if (r == 0) {
                                struct pgstore_node_row *rows = NULL;
                                size_t n = 0;
                                if (pgstore_node_rows(s, &rows, &n) == 0) {
                                        pthread_mutex_lock(&c->lock);
                                        pgstore_node_rows_free(c->nodes, c->nnodes);
                                        c->nodes = rows;
                                        c->nnodes = n;
                                        c->nodes_at_ms = mono_ms();
                                        pthread_mutex_unlock(&c->lock);
                                }
                                measure_skew(c, s);
                                takeover_round(c, s);
                        }
                }
                unlink_forgotten(c);
                /* the next beat: a third of a lease after this one started,
                 * soon after a failure */
                next_renew = start + (r == 0                          ? interval
                                      : interval / 3 < RENEW_RETRY_MS ? interval / 3
                                                                      : RENEW_RETRY_MS);
        wait:;
                int64_t next = next_renew;
                if (r == 0 && start + TAKEOVER_POLL_MS < next)
                        next = start + TAKEOVER_POLL_MS;
                struct timespec ts;
                clock_gettime(CLOCK_MONOTONIC, &ts);
                int64_t now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
                int64_t wait = next - now;
                if (wait < 50)
                        wait = 50;
                ts.tv_sec += wait / 1000;
                ts.tv_nsec += (wait % 1000) * 1000000L;
                if (ts.tv_nsec >= 1000000000L) {
                        ts.tv_sec++;
                        ts.tv_nsec -= 1000000000L;
                }
                pthread_mutex_lock(&c->lock);
                while (!c->stop &&
                       pthread_cond_timedwait(&c->cond, &c->lock, &ts) != ETIMEDOUT)
                        ;
        }
        /* A graceful stop hands over what it held: the leases end now. */
        size_t n = 0;
        const char **ids = calloc(c->nheld + 1, sizeof(*ids));
        int64_t *epochs = calloc(c->nheld + 1, sizeof(*epochs));
        for (size_t i = 0; ids && epochs && i < c->nheld; i++)
                if (!c->held[i].lost) {
                        ids[n] = c->held[i].id;
                        epochs[n++] = c->held[i].epoch;
                }
        pthread_mutex_unlock(&c->lock);
        if (s && n)
                (void)pgstore_lease_release_many(s, c->node, ids, epochs, n, c->grace_ms);
        free(ids);
        free(epochs);
        pgstore_close(s);
        return NULL;
}

/* ---- paused mandates are released (loop, pool) ---- */

/* A mandate paused (by an operator, for review, awaiting approval) with
 * nothing in flight is not held: its row becomes paused (no lease), the node
 * forgets it, and any node's kairosctl resolve, approve or resume takes it
 * (cluster_take).  So every node sees it paused in the database, and no
 * node has to stay alive for it. */
static bool parkable(enum mandate_status st)
{
        return st == MANDATE_PAUSED || st == MANDATE_PAUSED_REVIEW ||
               st == MANDATE_AWAITING_APPROVAL;
}

struct park_job {
        struct mandate *m;
        char *as, *reason;      /* its status and reason, copied on the loop */
        int err;
};

/* finish_as(m, "paused"), saying how and why (every node lists it so, and
 * counts a review released here: pgstore_mandate_park) */
static void park_work(void *arg)
{
        struct park_job *pj = arg;
        struct mandate *m = pj->m;
        int r = 0;
        struct pgstore *s = cluster_thread_store_why(m->d, &r, CM(m)->db_error,
                                                     sizeof CM(m)->db_error);
        if (!s) {
                pj->err = r;
                return;
        }
        r = pgstore_mandate_park(s, m->id, m->epoch, pj->as, pj->reason);
        if (r < 0)
                snprintf(CM(m)->db_error, sizeof CM(m)->db_error, "%s", pgstore_error(s));
        pj->err = r;
}

static void park_done(void *arg)
{
        struct park_job *pj = arg;
        struct mandate *m = pj->m;
        struct daemon *d = m->d;
        struct cluster *c = d->cluster;
        m->busy--;
        m->cluster_parking = false;
        char ep[24];
        snprintf(ep, sizeof ep, "%lld", (long long)m->epoch);
        if (pj->err == 0) {
                log_event(LOG_NOTICE, NULL, LOG_FIELDS({ "MANDATE_ID", m->id }, { "EPOCH", ep }),
                          "mandate %s is %s: released by node %s (paused in the database; "
                          "kairosctl resolve, approve or resume on any node takes it)",
                          m->id, mandate_status_name(m->status), c->node);
                pgd_release(m);
                /* forgotten (sweep) without a word more: nothing of it runs */
                __atomic_store_n(&CM(m)->dropped, true, __ATOMIC_RELEASE);
        } else if (pj->err == -ESTALE) {
                pgd_drop(m, "fenced while releasing it paused");
        } else {
                CM(m)->park_after = mono_ms() + 1000;   /* again later */
        }
        FREE_ALL(pj->as, pj->reason, pj);
        sweep(c);
        daemon_update_status(d);
}

static bool waited_for(struct cluster *c, const char *id);

static void park_scan(struct cluster *c)
{
        struct daemon *d = c->d;
        if (c->fenced || d->stopping)
                return;
        int64_t now = mono_ms();
        size_t pos = 0;
        const char *k;
        void *v;
        while (strmap_next(d->mandates, &pos, &k, &v) == 0) {
                struct mandate *m = v;
                if (m->epoch <= 0 || !CM(m)->held || pgd_dropped(m) ||
                    m->cluster_parking || !parkable(m->status) || m->busy || m->queued ||
                    m->holds_slot || m->run || m->cancel || !serialq_idle(&m->q) ||
                    now < CM(m)->park_after || waited_for(c, m->id))
                        continue;
                struct park_job *pj = calloc(1, sizeof(*pj));
                if (!pj)
                        return;
                pj->m = m;
                if (!(pj->as = strdup(mandate_status_name(m->status))) ||
                    (m->reason && !(pj->reason = strdup(m->reason)))) {
                        free(pj->as);
                        free(pj);
                        return;
                }
                m->cluster_parking = true;
                if (mandate_submit(m, park_work, park_done, pj) < 0) {
                        m->cluster_parking = false;
                        FREE_ALL(pj->as, pj->reason, pj);
                        return;
                }
        }
}

/* ---- taking a mandate for an operator's command ---- */

struct take_job {
        struct cluster *c;
        char *id;
        cluster_take_cb cb;
        void *ctx;
        int err;
        char detail[256];
        struct cev *e;
        int64_t deadline;          /* waiting to settle: not after */
        struct take_job *next;
};

static void take_job_free(struct take_job *tj)
{
        if (tj->e)
                cev_free(tj->e);
        free(tj->id);
        free(tj);
}

static void taking_set(struct cluster *c, const char *id, bool on)
{
        pthread_mutex_lock(&c->lock);
        for (size_t i = 0; i < c->ntaking; i++)
                if (strcmp(c->taking[i], id) == 0) {
                        if (!on) {
                                free(c->taking[i]);
                                c->taking[i] = c->taking[--c->ntaking];
                        }
                        on = false;
                        break;
                }
        if (on && c->ntaking < sizeof c->taking / sizeof c->taking[0] &&
            (c->taking[c->ntaking] = strdup(id)))
                c->ntaking++;
        pthread_mutex_unlock(&c->lock);
}

static bool waited_for(struct cluster *c, const char *id)
{
        for (struct take_job *tj = c->waiters; tj; tj = tj->next)
                if (strcmp(tj->id, id) == 0)
                        return true;
        return false;
}

static void take_work(void *arg)
{
        struct take_job *tj = arg;
        struct cluster *c = tj->c;
        int r = 0;
        struct pgstore *s = cluster_thread_store_why(c->d, &r, tj->detail, sizeof tj->detail);
        if (!s) {
                tj->err = r;
                return;
        }
        int64_t epoch = 0;
        char *prev = NULL;
        r = pgstore_mandate_take(s, tj->id, c->node, c->lease_ms, c->grace_ms, &epoch, &prev);
        bool repeated = false;
        if (r == -ENOTCONN && pgstore_reset(s) == 0) {
                repeated = true;
                r = pgstore_mandate_take(s, tj->id, c->node, c->lease_ms, c->grace_ms, &epoch,
                                         &prev);
        }
        if (r == -EBUSY || r == -EALREADY) {
                /* who holds it, or how it ended (a repeat after an unknown
                 * outcome may find it taken by the first try: ours) */
                struct pgstore_mandate_filter f = { .since_ms = -1, .mandate_id = tj->id };
                struct pgstore_mandate_row *rows = NULL;
                size_t n = 0;
                if (pgstore_mandates_list(s, &f, &rows, &n, NULL) == 0 && n == 1) {
                        if (r == -EBUSY && repeated && rows[0].owner &&
                            strcmp(rows[0].owner, c->node) == 0) {
                                r = 0;
                                epoch = rows[0].epoch;
                        } else if (r == -EBUSY && rows[0].leased) {
                                /* the node, and when its hold ends if it
                                 * does not renew: its lease and the grace
                                 * (kairos_mandate_take), by the database's
                                 * clock, said in this node's */
                                int64_t left = rows[0].lease_left_ms + c->grace_ms;
                                time_t t = (time_t)((now_ms_realtime() +
                                                     (left > 0 ? left : 0) + 999) / 1000);
                                struct tm tm;
                                char until[32] = "";
                                if (gmtime_r(&t, &tm))
                                        strftime(until, sizeof until, "%Y-%m-%dT%H:%M:%SZ",
                                                 &tm);
                                snprintf(tj->detail, sizeof tj->detail, "%s%s%s",
                                         rows[0].owner ? rows[0].owner : "?",
                                         *until ? " " : "", until);
                        } else {
                                snprintf(tj->detail, sizeof tj->detail, "%s",
                                         r == -EBUSY ? (rows[0].owner ? rows[0].owner : "?")
                                                     : rows[0].status);
                        }
                }
                pgstore_mandate_rows_free(rows, n);
        } else if (r < 0 && r != -ENOENT) {
                cluster_thread_failed(s, r, tj->detail, sizeof tj->detail);
        }
        if (r == 0) {
                taking_set(c, tj->id, true);
                r = load_copy(c, s, tj->id, epoch, prev, &tj->e);
                if (r < 0) {
                        /* ours at the new epoch, not renewed: taken again later */
                        taking_set(c, tj->id, false);
                        snprintf(tj->detail, sizeof tj->detail, "cannot load its rows: %s",
                                 r == -EIO || r == -ENOTCONN ? pgstore_error(s) : strerror(-r));
                }
        }
        free(prev);
        tj->err = r;
}

static void take_adopted(void *ctx, struct mandate *m, int err)
{
        struct take_job *tj = ctx;
        struct cluster *c = tj->c;
        (void)m;
        if (err) {
                snprintf(tj->detail, sizeof tj->detail, "%s",
                         err == -ESHUTDOWN ? "kairosd is shutting down"
                                           : "taken, but given up while adopting it");
                tj->cb(tj->ctx, NULL, err, tj->detail);
                take_job_free(tj);
                return;
        }
        /* the command goes on once the executor has had its say (awaiting
         * approval, paused for review, running), or after two leases */
        tj->deadline = mono_ms() + 2 * c->lease_ms;
        tj->next = c->waiters;
        c->waiters = tj;
        check_waiters(c);
}

static void check_waiters(struct cluster *c)
{
        struct daemon *d = c->d;
        int64_t now = mono_ms();
        struct take_job **pp = &c->waiters;
        while (*pp) {
                struct take_job *tj = *pp;
                struct mandate *m = mandate_find(d, tj->id);
                bool gone = !m || pgd_dropped(m);
                bool settled = gone || d->stopping || now >= tj->deadline ||
                               (m->status != MANDATE_RUNNABLE && m->status != MANDATE_PROBING &&
                                !m->busy) ||
                               m->run;
                if (!settled) {
                        pp = &tj->next;
                        continue;
                }
                *pp = tj->next;
                if (gone)
                        tj->cb(tj->ctx, NULL, -ESTALE, "given up while taking it over");
                else
                        tj->cb(tj->ctx, m, 0, NULL);
                take_job_free(tj);
                pp = &c->waiters;   /* the callback may have changed the list */
        }
}

static void take_done(void *arg)
{
        struct take_job *tj = arg;
        struct cluster *c = tj->c;
        if (tj->err) {
                tj->cb(tj->ctx, NULL, tj->err, tj->detail);
                take_job_free(tj);
                return;
        }
        struct cev *e = tj->e;
        tj->e = NULL;
        e->cb = take_adopted;
        e->ctx = tj;
        e->next = c->adopt_head;
        c->adopt_head = e;
        taking_set(c, tj->id, false);
        process_adopts(c);
}

int cluster_take(struct daemon *d, const char *mandate_id, cluster_take_cb cb, void *ctx)
{
        struct cluster *c = d->cluster;
        if (!c)
                return -EPROTONOSUPPORT;
        struct take_job *tj = calloc(1, sizeof(*tj));
        if (!tj || !(tj->id = strdup(mandate_id))) {
                free(tj);
                return -ENOMEM;
        }
        tj->c = c;
        tj->cb = cb;
        tj->ctx = ctx;
        if (serialq_submit(&c->ops_q, take_work, take_done, tj) < 0) {
                take_job_free(tj);
                return -ENOMEM;
        }
        return 0;
}

int cluster_submit(struct daemon *d, void (*work)(void *arg), void (*done)(void *arg),
                   void *arg)
{
        struct cluster *c = d->cluster;
        if (!c)
                return -EPROTONOSUPPORT;
        return serialq_submit(&c->ops_q, work, done, arg);
}

/* ---- start and stop ---- */

static int clear_copies(struct daemon *d, char *err, size_t errlen)
{
        /* The WAL files of a node are copies of rows; a previous run's are
         * stale (the rows moved on or were taken over).  But a state
         * directory that ran the file backend holds the only copy of its
         * mandates: refuse rather than lose them. */
        char *marker = NULL;
        if (asprintf(&marker, "%s/cluster-node", d->paths.root) < 0)
                return -ENOMEM;
        bool was_cluster = access(marker, F_OK) == 0;
        DIR *dir = opendir(d->paths.wal);
        int r = 0;
        size_t nwal = 0;
        if (dir) {
                struct dirent *de;
                while ((de = readdir(dir))) {
                        char id[256];
                        enum wal_spare_found sf;
                        /* a file-backend WAL still under its spare's name
                         * (a crash undid its rename): unfinished too */
                        if (!was_cluster && wal_spare_name(de->d_name) &&
                            wal_spare_peek(d->paths.wal, de->d_name, &sf, id, sizeof id) == 0 &&
                            sf == WAL_SPARE_ADOPTED)
                                nwal++;
                        if (!statedir_entry_id(de->d_name, STATEDIR_WAL_SUFFIX, id, sizeof id))
                                continue;
                        nwal++;
                        if (was_cluster && unlinkat(dirfd(dir), de->d_name, 0) < 0 &&
                            errno != ENOENT) {
                                r = -errno;
                                snprintf(err, errlen, "cannot remove %s/%s: %s", d->paths.wal,
                                         de->d_name, strerror(errno));
                                break;
                        }
                }
                closedir(dir);
        }
        if (r == 0 && !was_cluster && nwal) {
                snprintf(err, errlen,
                         "%s holds %zu unfinished mandate%s of the file backend: finish them "
                         "with Backend=files before this state directory joins a cluster",
                         d->paths.wal, nwal, nwal == 1 ? "" : "s");
                r = -EEXIST;
        }
        if (r == 0 && !was_cluster) {
                r = kio_write_file_atomic(kio_posix(), marker, d->cfg->node_name,
                                          strlen(d->cfg->node_name), STATEDIR_FILE_MODE);
                if (r < 0)
                        snprintf(err, errlen, "cannot write %s: %s", marker, strerror(-r));
        }
        free(marker);
        return r;
}

int pgd_start(struct daemon *d, char *err, size_t errlen)
{
        const struct config *cfg = d->cfg;
        struct cluster *c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        c->d = d;
        c->node = strdup(cfg->node_name ? cfg->node_name : "");
        c->conninfo = strdup(cfg->cluster_conninfo ? cfg->cluster_conninfo : "");
        c->lease_ms = (int64_t)cfg->lease_sec * 1000;
#ifdef KAIROS_TEST_HOOKS
        const char *skew = getenv("KAIROS_TEST_CLOCK_SKEW_MS");
        if (skew) {
                c->test_skew_ms = strtoll(skew, NULL, 10);
                log_warning("test hook: this node's clock is taken as %s ms off", skew);
        }
#endif
        /* The node's handlers run until its lease can end (the renewal's
         * send time + the lease, by its own monotonic clock: the database
         * set the lease later), and others take over grace_ms after it has
         * ended (by the database's): the grace is the slack for the two
         * clocks' rates and the deadman's kill (docs/design.md §14). */
        c->grace_ms = c->lease_ms / 10 > 1000 ? c->lease_ms / 10 : 1000;
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        if (!c->node || !c->conninfo || pthread_mutex_init(&c->lock, NULL) != 0 ||
            pthread_cond_init(&c->cond, &ca) != 0 ||
            pthread_cond_init(&c->store_cond, &ca) != 0) {
                pthread_condattr_destroy(&ca);
                FREE_ALL(c->node, c->conninfo, c);
                return -ENOMEM;
        }
        pthread_condattr_destroy(&ca);
        c->deadman = deadman;
        deadman = NULL;
        d->cluster = c;
        int r = clear_copies(d, err, errlen);
        if (r < 0)
                goto fail;
        /* The schema first (created or migrated), then the node's first
         * heartbeat: from here on it has a deadline. */
        struct pgstore *s = NULL;
        char perr[256];
        r = pgstore_connect(c->conninfo, &s, perr, sizeof perr);
        if (r < 0) {
                snprintf(err, errlen, "cannot connect to the database (ConnectionString=): %s",
                         perr);
                goto fail;
        }
        int from = 0, to = 0;
        int64_t sent = mono_ms();
        if ((r = pgstore_migrate(s, &from, &to)) < 0 ||
            (r = pgstore_node_register(s, c->node, c->lease_ms, &c->incarnation)) < 0) {
                snprintf(err, errlen, "the database refuses node %s: %s", c->node,
                         r == -EPROTONOSUPPORT
                                 ? "its schema is newer than this kairosd"
                                 : pgstore_error(s));
                pgstore_close(s);
                goto fail;
        }
        warn_losable_commits(s);
        pgstore_close(s);
        c->deadline_ms = sent + c->lease_ms;
        if (c->deadman)
                (void)deadman_set_deadline(c->deadman, c->deadline_ms);
        if (from != to)
                log_notice("cluster: the database schema was migrated from version %d to %d",
                           from, to);
        /* The thread first, so that a failure leaves no handle of c on the
         * loop; it wakes the loop only after a section under c->lock (post),
         * which it cannot enter before the handles are made. */
        pthread_mutex_lock(&c->lock);
        if ((r = -pthread_create(&c->thread, NULL, heartbeat_main, c)) < 0) {
                pthread_mutex_unlock(&c->lock);
                snprintf(err, errlen, "cannot start the heartbeat thread: %s", strerror(-r));
                goto fail;
        }
        c->thread_started = true;
        serialq_init(&c->ops_q, d->loop, &d->jobs);
        uv_timer_init(d->loop, &c->slot_timer);
        c->slot_timer.data = d;
        uv_async_init(d->loop, &c->async, on_async);
        c->async.data = c;
        uv_timer_init(d->loop, &c->fence_timer);
        c->fence_timer.data = c;
        uv_timer_start(&c->fence_timer, on_fence_tick, FENCE_TICK_MS, FENCE_TICK_MS);
        pthread_mutex_unlock(&c->lock);
        log_daemon = d;
        log_set_node(c->node, epoch_lookup);
        log_notice("cluster: node %s (incarnation %lld) on PostgreSQL, LeaseSec=%u", c->node,
                   (long long)c->incarnation, cfg->lease_sec);
        return 0;
fail:
        d->cluster = NULL;
        deadman = c->deadman;
        pthread_mutex_destroy(&c->lock);
        pthread_cond_destroy(&c->cond);
        pthread_cond_destroy(&c->store_cond);
        FREE_ALL(c->node, c->conninfo, c);
        return r;
}

void pgd_ready(struct daemon *d)
{
        struct cluster *c = d->cluster;
        if (!c)
                return;
        pthread_mutex_lock(&c->lock);
        c->takeover = true;
        pthread_cond_signal(&c->cond);
        pthread_mutex_unlock(&c->lock);
}

void pgd_quiesce(struct daemon *d)
{
        struct cluster *c = d->cluster;
        if (!c)
                return;
        pthread_mutex_lock(&c->lock);
        c->takeover = false;
        pthread_mutex_unlock(&c->lock);
        uv_timer_stop(&c->slot_timer);
        check_waiters(c);   /* stopping: each command answers now */
}

void pgd_stop(struct daemon *d)
{
        struct cluster *c = d->cluster;
        if (!c)
                return;
        pthread_mutex_lock(&c->lock);
        c->stop = true;
        c->takeover = false;
        pthread_cond_signal(&c->cond);
        pthread_mutex_unlock(&c->lock);
        if (c->thread_started)
                pthread_join(c->thread, NULL);
        c->thread_started = false;
        uv_timer_stop(&c->fence_timer);
}

void pgd_free(struct daemon *d)
{
        struct cluster *c = d->cluster;
        if (!c) {
                deadman_stop(deadman);  /* every handler was reaped: nothing to kill */
                deadman = NULL;
                return;
        }
        pgd_stop(d);
        for (size_t i = 0; i < c->nheld; i++)
                free(c->held[i].id);
        free(c->held);
        pgstore_node_rows_free(c->nodes, c->nnodes);
        for (size_t i = 0; i < c->nstores; i++)
                pgstore_close(c->stores[i]);
        kmem_free_strv(c->unlink, c->nunlink);
        for (size_t i = 0; i < c->ntaking; i++)
                free(c->taking[i]);
        while (c->waiters) {
                struct take_job *tj = c->waiters;
                c->waiters = tj->next;
                take_job_free(tj);
        }
        while (c->ev_head) {
                struct cev *e = c->ev_head;
                c->ev_head = e->next;
                cev_free(e);
        }
        while (c->adopt_head) {
                struct cev *e = c->adopt_head;
                c->adopt_head = e->next;
                if (e->cb == take_adopted) {
                        /* (its request is gone with the control socket) */
                        take_job_free(e->ctx);
                        e->cb = NULL;
                }
                cev_free(e);
        }
        pthread_mutex_destroy(&c->lock);
        pthread_cond_destroy(&c->cond);
        pthread_cond_destroy(&c->store_cond);
        free(c->node);
        free(c->conninfo);
        deadman_stop(c->deadman);  /* every handler was reaped: nothing to kill */
        free(c);
        d->cluster = NULL;
}

json_t *pgd_status(struct daemon *d)
{
        struct cluster *c = d->cluster;
        if (!c)
                return NULL;
        int64_t now = mono_ms();
        pthread_mutex_lock(&c->lock);
        size_t held = 0;
        for (size_t i = 0; i < c->nheld; i++)
                held += !c->held[i].lost;
        json_t *nodes = json_array();
        int64_t reviews = 0;
        for (size_t i = 0; i < c->nnodes; i++) {
                /* as of the last beat, aged since */
                int64_t left = c->nodes[i].expires_in_ms - (now - c->nodes_at_ms);
                reviews += c->nodes[i].reviews;
                json_array_append_new(nodes,
                                      json_pack("{s:s, s:I, s:b, s:I, s:I, s:I}", "node",
                                                c->nodes[i].node, "incarnation",
                                                (json_int_t)c->nodes[i].incarnation, "alive",
                                                left > 0, "lease_left_ms",
                                                (json_int_t)(left > 0 ? left : 0), "mandates",
                                                (json_int_t)c->nodes[i].held, "reviews",
                                                (json_int_t)c->nodes[i].reviews));
        }
        int64_t left = c->deadline_ms > 0 ? c->deadline_ms - now : 0;
        json_t *skew = c->skew_known
                               ? json_pack("{s:f, s:b, s:f}", "offset_sec",
                                           (double)c->skew_ms / 1000.0, "over_bound",
                                           c->skew_over, "bound_sec",
                                           (double)CLUSTER_SKEW_BOUND_MS / 1000.0)
                               : json_null();
        json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:I, s:b, s:I, s:I, s:s?, s:o, s:o}", "backend",
                              "postgres", "node", c->node, "incarnation",
                              (json_int_t)c->incarnation, "lease_sec",
                              (json_int_t)(c->lease_ms / 1000), "lease_left_ms",
                              (json_int_t)(left > 0 ? left : 0), "may_act",
                              c->deadline_ms > 0 && now < c->deadline_ms - c->lease_ms / 3,
                              "held", (json_int_t)held, "renew_failures",
                              (json_int_t)c->renew_failures, "renew_error",
                              c->renew_error[0] ? c->renew_error : NULL, "nodes", nodes,
                              "clock_skew", skew);
        /* the reviews the nodes released (paused in the database: held by
         * none, counted here on every node), as of the last beat */
        json_object_set_new(o, "reviews_waiting", json_integer(reviews));
        pthread_mutex_unlock(&c->lock);
        return o;
}

static int finish_as(struct mandate *m, const char *status)
{
        int r = 0;
        struct pgstore *s = cluster_thread_store_why(m->d, &r, CM(m)->db_error,
                                                     sizeof CM(m)->db_error);
        if (!s) {
                return r;
        }
        r = pgstore_mandate_finish(s, m->id, m->epoch, status);
        if (r < 0)
                snprintf(CM(m)->db_error, sizeof CM(m)->db_error, "%s", pgstore_error(s));
        return r;
}

int cluster_slot_take(struct mandate *m, bool *ret_taken, char **ret_holder)
{
        *ret_taken = false;
        *ret_holder = NULL;
        if (pgd_dropped(m) || m->epoch <= 0)
                return -ESTALE;
        int r = 0;
        struct pgstore *s = cluster_thread_store(m->d, &r);
        if (!s)
                return r;
        r = pgstore_slot_take(s, m->id, m->epoch, ret_taken, ret_holder);
        if (r == -ENOTCONN && pgstore_reset(s) == 0)   /* (a take repeated is the same take) */
                r = pgstore_slot_take(s, m->id, m->epoch, ret_taken, ret_holder);
        return r;
}

int cluster_slot_release(struct mandate *m)
{
        if (pgd_dropped(m) || m->epoch <= 0)
                return -ESTALE;
        int r = 0;
        struct pgstore *s = cluster_thread_store(m->d, &r);
        if (!s)
                return r;
        r = pgstore_slot_release(s, m->id, m->epoch);
        if (r == -ENOTCONN && pgstore_reset(s) == 0)
                r = pgstore_slot_release(s, m->id, m->epoch);
        return r;
}


int pgd_finish(struct mandate *m, enum mandate_status end, char *err, size_t errlen)
{
        /* its rows say it ended; the row says so too (for list and
         * takeover); fenced: a node that lost it meanwhile changes
         * nothing, and the new owner ends it again */
        static const char *const db_status[] = {
                [MANDATE_DONE] = "succeeded", [MANDATE_FAILED] = "failed",
                [MANDATE_CANCELLED] = "cancelled",
        };
        const char *st = (size_t)end < sizeof db_status / sizeof db_status[0] && db_status[end]
                                 ? db_status[end]
                                 : "abandoned";
        int r = finish_as(m, st);
        if (r < 0)
                snprintf(err, errlen, "recording the end of %s in the database: %s", m->id,
                         CM(m)->db_error[0] ? CM(m)->db_error : strerror(-r));
        return r;
}

/* The message of a barrier that failed: the barrier is a transaction. */
void pgd_wal_failed(const struct mandate *m, int r, char *buf, size_t len)
{
        /* the database's own words (and SQLSTATE) when it gave any: a full
         * disk is not "Input/output error", too many clients not
         * "Connection refused" */
        const char *db = CM(m) && CM(m)->db_error[0] ? CM(m)->db_error : NULL;
        /* (a later flush of a mandate whose claim failed says that claim's
         * cause: no node holds it, it is not fenced) */
        bool unclaimed = CM(m) && m->epoch == 0 && CM(m)->claim_err == r && r != 0;
        snprintf(buf, len, "committing %s to the database: %s%s%s%s", m->id,
                 unclaimed ? "the claim of its tick failed: " : "",
                 r == -ESTALE     ? "fenced: another node holds it now"
                 : r == -EALREADY ? "its tick was claimed by another node"
                 : r == -EBUSY    ? "its tick was rejected (Concurrency=reject)"
                 : r == -ETIME    ? "the tick is still ahead of the database's clock after "
                                    "10 minutes: this node's clock is wrong"
                 : r == -ENOTCONN ? "the connection broke (outcome unknown)"
                 : r == -EAGAIN && m->epoch == 0
                         ? "an earlier attempt at its tick on this node was not claimed and is "
                           "still being forgotten: try again in a moment"
                 : db             ? db
                                  : strerror(-r),
                 r == -ENOTCONN && db ? ": " : "", r == -ENOTCONN && db ? db : "");
}

/* Before any thread exists (executor_init): the deadman (deadman.h), held
 * here until pgd_start gives it to the node. */
int pgd_prefork(struct daemon *d, struct deadman **ret_deadman)
{
        (void)d;
        int r = deadman_start(&deadman);
        if (r < 0) {
                log_error("cluster mode cannot start its deadman: %s", strerror(-r));
                return r;
        }
        *ret_deadman = deadman;
        return 0;
}

int pgd_attach(struct mandate *m)
{
        return (m->drv_state = calloc(1, sizeof(struct cluster_mandate))) ? 0 : -ENOMEM;
}

void pgd_detach(struct mandate *m)
{
        struct cluster_mandate *cm = m->drv_state;
        if (!cm)
                return;
        FREE_ALL(cm->winner, cm->busy, cm->busy_status, cm->slot_waits_for, cm);
        m->drv_state = NULL;
}

uv_timer_t *cluster_slot_timer(struct daemon *d)
{
        return &d->cluster->slot_timer;
}
