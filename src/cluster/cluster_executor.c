/* SPDX-License-Identifier: MIT */
/* The executor's side of the postgres driver (cluster.h, driver.h): a claim
 * the database refused or lost, and Concurrency= across the cluster (the
 * schedule's one slot in the database, docs/design.md §14).  Its state is
 * the mandate's struct cluster_mandate. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver_postgres.h"
#include "executor.h"
#include "log.h"

/* ---- Concurrency=queue across the cluster (docs/design.md §14) ---- */

struct slot_job {
        struct mandate *m;
        bool release;
        int err;
        bool taken;
        char *holder;
};

static void slot_work(void *arg)
{
        struct slot_job *j = arg;
        j->err = j->release ? cluster_slot_release(j->m)
                            : cluster_slot_take(j->m, &j->taken, &j->holder);
}

static void on_slot_timer(uv_timer_t *t)
{
        executor_kick(t->data);
}

/* Ask again in a second: another node's mandate may end meanwhile. */
static void slot_retry_later(struct daemon *d)
{
        if (d->stopping)
                return;
        uv_timer_t *t = cluster_slot_timer(d);
        if (!uv_is_active((uv_handle_t *)t))
                uv_timer_start(t, on_slot_timer, 1000, 0);
}

static void slot_done(void *arg)
{
        struct slot_job *j = arg;
        struct mandate *m = j->m;
        struct daemon *d = m->d;
        m->busy--;
        if (!j->release) {
                CM(m)->slot_taking = false;
                if (j->err == -ESTALE) {
                        own_drop(m, "fenced: another node holds it");
                } else if (j->err < 0) {
                        /* ("": the database did not answer; said once) */
                        if (!CM(m)->slot_waits_for || *CM(m)->slot_waits_for)
                                log_warning("mandate %s: cannot take the slot of schedule %s in "
                                            "the database (%s): asking again every second",
                                            m->id, m->schedule, strerror(-j->err));
                        free(CM(m)->slot_waits_for);
                        CM(m)->slot_waits_for = strdup("");
                        slot_retry_later(d);
                } else if (j->taken) {
                        if (CM(m)->slot_waits_for)
                                log_info("mandate %s: takes the slot of schedule %s (waited "
                                         "for %s)",
                                         m->id, m->schedule,
                                         *CM(m)->slot_waits_for ? CM(m)->slot_waits_for
                                                            : "the database");
                        free(CM(m)->slot_waits_for);
                        CM(m)->slot_waits_for = NULL;
                        /* (a paused or dropped one gives it back at its end) */
                        CM(m)->db_slot = true;
                } else {
                        if (!CM(m)->slot_waits_for ||
                            (j->holder && strcmp(j->holder, CM(m)->slot_waits_for) != 0))
                                log_event(LOG_INFO, NULL,
                                          LOG_FIELDS({ "MANDATE_ID", m->id },
                                                     { "SCHEDULE", m->schedule }),
                                          "mandate %s waits for mandate %s of schedule %s "
                                          "(Concurrency=queue, in the cluster)",
                                          m->id, j->holder ? j->holder : "?", m->schedule);
                        free(CM(m)->slot_waits_for);
                        CM(m)->slot_waits_for = j->holder ? j->holder : strdup("?");
                        j->holder = NULL;
                        slot_retry_later(d);
                }
        } else if (j->err < 0 && j->err != -ESTALE) {
                /* its row keeps the slot until the mandate's end or park */
                log_warning("mandate %s: cannot give back the slot of schedule %s in the "
                            "database (%s): it is freed when the mandate is parked or ends",
                            m->id, m->schedule, strerror(-j->err));
        }
        free(j->holder);
        free(j);
        executor_kick(d);
}

static int slot_submit(struct mandate *m, bool release)
{
        struct slot_job *j = calloc(1, sizeof(*j));
        if (!j)
                return -ENOMEM;
        j->m = m;
        j->release = release;
        if (mandate_submit(m, slot_work, slot_done, j) < 0) {
                free(j);
                return -ENOMEM;
        }
        return 0;
}

/* The mandate stops running but goes on later (approval, review, pause):
 * its schedule's slot goes back (after the records queued before). */
void pgx_slot_release(struct mandate *m)
{
        if (!CM(m)->db_slot)
                return;
        CM(m)->db_slot = false;
        if (slot_submit(m, true) < 0)
                log_warning("out of memory: the slot of %s is freed when it is parked or ends",
                            m->id);
}

/* Cluster mode, Concurrency=queue: may m start, holding its schedule's slot
 * in the database?  If not, it is asked for (one take at a time, after the
 * records queued before: the claim first). */
bool pgx_slot_ready(struct mandate *m)
{
        if (CM(m)->db_slot)
                return true;
        if (!CM(m)->slot_taking && CM(m)->held && m->epoch > 0 && !own_dropped(m)) {
                if (slot_submit(m, false) == 0)
                        CM(m)->slot_taking = true;
                else
                        slot_retry_later(m->d);
        }
        return false;
}

/* A fire made m: the claim of its tick says how (Concurrency=reject:
 * claimed only while no mandate of the schedule is unfinished in the
 * cluster); a Concurrency=queue mandate always waits in the queue, its
 * schedule's slot taken in the database once its claim committed (the
 * claim must not hold an executing record without it). */
bool pgx_fired(struct mandate *m, const struct config_schedule *sc)
{
        CM(m)->reject = sc->concurrency == CONCURRENCY_REJECT;
        return sc->concurrency == CONCURRENCY_QUEUE;
}

/* Cluster mode: the database refused a retry (kairos_retry_create): the
 * tick's mandate CM(m)->busy is unfinished, or it ended done and no reason
 * was given, or it holds the retry's id already; as on one host
 * (commands.c). */
static void retry_refused(struct mandate *m, struct op_reply *reply)
{
        const char *busy = CM(m)->busy ? CM(m)->busy : "?";
        const char *st = CM(m)->busy_status ? CM(m)->busy_status : "?";
        bool unfinished = strcmp(st, "running") == 0 || strcmp(st, "paused") == 0;
        if (unfinished)
                op_reply_error(reply, "conflict",
                               "the tick of %s (%s at %s) has an unfinished retry: mandate %s is "
                               "%s in the cluster; one retry of a tick at a time",
                               m->retry_of, m->schedule, m->fired_at, busy, st);
        else if (strcmp(st, "succeeded") == 0 && strcmp(busy, m->id) != 0)
                op_reply_error(reply, "conflict",
                               "the tick of %s (%s at %s) ended done as mandate %s: retrying it "
                               "repeats its work; give --reason to do it anyway",
                               m->retry_of, m->schedule, m->fired_at, busy);
        else
                op_reply_error(reply, "conflict",
                               "retry %d of the tick of %s (%s at %s) exists already in the "
                               "cluster (mandate %s, %s): try again",
                               m->retry, m->retry_of, m->schedule, m->fired_at, busy, st);
        log_info("retry %d of %s at %s refused by the database: mandate %s is %s", m->retry,
                 m->schedule, m->fired_at, busy, st);
        own_drop(m, "its retry was refused");
}

/* A barrier that failed means the mandate is not this node's any more
 * (docs/design.md §14). */
bool pgx_barrier_failed(struct mandate *m, int err, const char *errmsg, struct op_reply *reply,
                        struct op_reply *cancel_reply)
{
        if (cancel_reply)
                op_reply_error(cancel_reply, "fenced",
                               "mandate %s is no longer held by this node", m->id);
        CM(m)->db_slot = false;
        if (err == -EBUSY && m->retry_of) {
                retry_refused(m, reply);
        } else if (err == -EBUSY) {
                /* Concurrency=reject, decided by the database under
                 * the schedule's lock: as on one host */
                const char *busy = CM(m)->busy ? CM(m)->busy : "?";
                const char *st = CM(m)->busy_status ? CM(m)->busy_status : "?";
                log_event(LOG_NOTICE, NULL, LOG_FIELDS({ "SCHEDULE", m->schedule }),
                          "fire of %s at %s rejected: mandate %s is still %s "
                          "(Concurrency=reject, in the cluster)",
                          m->schedule, m->fired_at, busy, st);
                op_reply_error(reply, "rejected",
                               "schedule %s has Concurrency=reject and mandate %s is "
                               "still %s",
                               m->schedule, busy, st);
                own_drop(m, "its tick was rejected (Concurrency=reject)");
        } else if (err == -EALREADY) {
                if (op_reply_wanted(reply))
                        op_reply_ok(reply,
                                    json_pack("{s:s, s:s, s:s, s:b, s:s, s:s?}", "mandate",
                                              m->id, "schedule", m->schedule, "fired_at",
                                              m->fired_at, "fired", false, "status",
                                              "claimed", "node", CM(m)->winner));
                log_debug("schedule %s at %s: claimed by node %s: nothing to do here",
                         m->schedule, m->fired_at,
                         CM(m)->winner ? CM(m)->winner : "?");
                own_drop(m, "its tick was claimed by another node");
        } else {
                op_reply_error(reply, err == -ESTALE ? "fenced" : "cluster_unavailable", "%s",
                               errmsg);
                own_drop(m, err == -ESTALE ? "fenced: another node holds it" : errmsg);
        }
        return true;
}
