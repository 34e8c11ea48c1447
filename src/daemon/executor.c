/* SPDX-License-Identifier: MIT */
/* The executor: mandates run here (executor.h).  This file is the mandates'
 * life on the loop: fire and retry, the queue and its concurrency slots,
 * cancel, acting on what each advance job decided (spawn the next handler,
 * pause, end), the graceful stop.  What a mandate does is decided from its
 * WAL by the advance job (executor_advance.c); handlers run in
 * executor_handler.c; finished mandates are archived in executor_archive.c;
 * what they share is executor_internal.h. */
#include "executor.h"
#include "hooks.h"
#include "toolhold.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "executor_internal.h"
#include "kairos/carry.h"
#include "kairos/strmap.h"
#include "driver.h"
#include "log.h"
#include "metrics.h"

void executor_release_slot(struct mandate *m)
{
        if (m->holds_slot) {
                m->holds_slot = false;
                m->d->executor->running--;
        }
}

void executor_check_idle(struct daemon *d)
{
        if (d->stopping && d->executor->running == 0 && d->executor->idle) {
                if (archive_busy(d)) {
                        if (!d->executor->arch_syncing && !d->executor->arch_unlinking)
                                archive_flush(d);
                        return;
                }
                void (*cb)(struct daemon *) = d->executor->idle;
                d->executor->idle = NULL;
                cb(d);
        }
}

static void finish_fire_reply(struct advance *a, bool fired)
{
        if (!op_reply_wanted(&a->reply))
                return;
        if (a->error) {
                op_reply_error(&a->reply, "wal_io_error", "%s", a->errmsg);
        } else {
                json_t *res = json_pack("{s:s, s:s, s:s, s:b, s:s}", "mandate", a->m->id,
                                        "schedule", a->m->schedule, "fired_at",
                                        a->m->fired_at, "fired", fired, "status",
                                        mandate_status_name(a->m->status));
                if (res && a->m->retry_of) {
                        json_object_set_new(res, "retry_of", json_string(a->m->retry_of));
                        json_object_set_new(res, "retry", json_integer(a->m->retry));
                }
                op_reply_ok(&a->reply, res);
        }
}

static void retry_timer_closed(uv_handle_t *h)
{
        free(h);
}

void executor_retry_stop(struct mandate *m)
{
        if (!m->retry_timer)
                return;
        uv_timer_stop(m->retry_timer);
        uv_close((uv_handle_t *)m->retry_timer, retry_timer_closed);
        m->retry_timer = NULL;
}

/* The wait is over: decide again (the step runs again, from its WAL). */
static void retry_due(uv_timer_t *t)
{
        struct mandate *m = t->data;
        executor_retry_stop(m);
        struct advance *a = advance_new(m);
        if (!a) {
                log_error("out of memory: cannot retry a step of %s", m->id);
                executor_release_slot(m);
                return;
        }
        a->decide = !m->d->stopping && m->status != MANDATE_PAUSED;
        executor_submit(m, a);
}

/* A failed step waits for its retry: its retry_wait record is durable.
 * The mandate keeps its slot; the wait is a timer on the loop (after a
 * restart the WAL's due time arms it again). */
static void retry_wait(struct mandate *m, struct advance *a)
{
        struct daemon *d = m->d;
        int64_t now = now_ms_realtime();
        uint64_t delay = a->retry_due_ms > now ? (uint64_t)(a->retry_due_ms - now) : 0;
        char why[160];
        snprintf(why, sizeof why, "retry_wait: %s runs again in %.3f s", a->step_id,
                 (double)delay / 1000.0);
        mandate_set_status(m, MANDATE_RUNNING, why);
        executor_retry_stop(m);
        uv_timer_t *t = malloc(sizeof(*t));
        if (!t || uv_timer_init(d->loop, t) < 0) {
                free(t);
                log_error("out of memory: cannot wait for the retry of %s %s", m->id,
                          a->step_id);
                executor_release_slot(m);
                return;
        }
        t->data = m;
        m->retry_timer = t;
        free(m->step_id);
        m->step_id = strdup(a->step_id);
        uv_timer_start(t, retry_due, delay, 0);
        log_event(LOG_NOTICE, NULL, LOG_FIELDS({ "MANDATE_ID", m->id }, { "STEP_ID", a->step_id }),
                  "%s %s: retried in %.3f s", m->id, a->step_id, (double)delay / 1000.0);
}

static void advance_done(void *arg)
{
        struct advance *a = arg;
        struct mandate *m = a->m;
        struct daemon *d = m->d;
        m->flushes += a->flushes;
        d->flushes_total += a->flushes;
        m->busy--;
        if (a->started_ms > 0)
                m->started_ms = a->started_ms;
        if (a->plan_id) {
                free(m->plan_id);
                m->plan_id = strdup(a->plan_id);
                m->cycle = a->cycle;
        }
        if (a->error && d->drv->own.barrier_failed(m, a->error, a->errmsg, &a->reply,
                                                    a->cancel ? &a->cancel_reply : NULL)) {
                /* (postgres: the mandate is not this node's any more) */
                executor_release_slot(m);
                if (a->cancel)
                        executor_cancel_drop(m);
                goto out;
        }
        if (a->error) {
                bool corrupt = a->error == -EBADMSG;
                mandate_set_status(m, corrupt ? MANDATE_QUARANTINED : MANDATE_WAL_IO_ERROR,
                                   corrupt ? "wal_corrupt" : "wal_io_error");
                log_event(LOG_ERR, corrupt ? MSGID_WAL_CORRUPT : MSGID_WAL_IO_ERROR,
                          LOG_FIELDS({ "MANDATE_ID", m->id }),
                          "mandate %s paused (%s): %s", m->id, m->reason, a->errmsg);
                mandate_wal_close(m);
                finish_fire_reply(a, true);
                op_reply_error(&a->cancel_reply, "wal_io_error", "%s", a->errmsg);
                if (a->cancel)
                        executor_cancel_drop(m);
                executor_release_slot(m);
                goto out;
        }
        finish_fire_reply(a, true);
        if (a->log_fired)
                log_event(LOG_NOTICE, NULL,
                          LOG_FIELDS({ "MANDATE_ID", m->id }, { "SCHEDULE", m->schedule }),
                          "fired %s at %s: mandate %s", m->schedule, m->fired_at, m->id);
        own_hold(m);
        for (int i = 0; i < PLANNER_PHASES; i++) {
                for (unsigned k = 0; k < a->completed_inline[i]; k++)
                        metrics_step(d->metrics, i, WAL_OP_COMPLETED, 0);
                for (unsigned k = 0; k < a->retries_written[i]; k++)
                        metrics_retry(d->metrics, i);
        }
        if (a->cancel && a->cancel_too_late) {
                op_reply_error(&a->cancel_reply, "conflict",
                               "mandate %s ended (%s) before the cancel took effect", m->id,
                               mandate_status_name(m->status));
                executor_cancel_drop(m);
                goto out;
        }
        if (op_reply_wanted(&a->cancel_reply))
                op_reply_ok(&a->cancel_reply,
                            json_pack("{s:s, s:s, s:s?}", "mandate", m->id, "status",
                                      mandate_status_name(MANDATE_CANCELLED), "interrupted",
                                      a->interrupted));
        if (a->cancel) {
                executor_cancel_drop(m);
        } else if (m->cancel && a->next != NEXT_END) {
                /* a cancel came while this was decided: it ends here */
                if (a->cycle_finished)
                        d->cycles_completed++;
                executor_cancel_submit(m, NULL);
                goto out;
        }
        if (a->cycle_finished)
                d->cycles_completed++;
        if (!a->cancel && (!a->decide || d->stopping) && a->next != NEXT_END) {
                /* recorded; the mandate goes on after the restart */
                if (m->status == MANDATE_RUNNING)
                        mandate_set_status(m, MANDATE_RUNNABLE, NULL);
                executor_release_slot(m);
                goto out;
        }
        switch (a->next) {
        case NEXT_RUN_STEP:
                mandate_set_status(m, MANDATE_RUNNING, NULL);
                handler_spawn(m, a);
                break;
        case NEXT_AWAIT_APPROVAL:
                mandate_set_status(m, MANDATE_AWAITING_APPROVAL, a->reason);
                free(m->review_step);
                m->review_step = a->step_id ? strdup(a->step_id) : NULL;
                log_event(LOG_NOTICE, NULL, LOG_FIELDS({ "MANDATE_ID", m->id }),
                          "mandate %s awaits approval (%s): kairosctl approve %s", m->id,
                          a->reason, m->id);
                hooks_event(d, HOOK_APPROVAL, m, m->review_step, NULL);
                executor_release_slot(m);
                d->drv->own.slot_release(m);
                break;
        case NEXT_REVIEW:
                mandate_set_status(m, MANDATE_PAUSED_REVIEW, a->reason);
                m->review_step = a->step_id ? strdup(a->step_id) : NULL;
                log_event(LOG_WARNING, MSGID_PAUSED_REVIEW,
                          LOG_FIELDS({ "MANDATE_ID", m->id }, { "STEP_ID", m->review_step }),
                          "mandate %s paused for review at step %s (%s)", m->id,
                          m->review_step ? m->review_step : "?", a->reason);
                hooks_event(d, HOOK_REVIEW, m, m->review_step, a->review_evidence);
                executor_release_slot(m);
                d->drv->own.slot_release(m);
                break;
        case NEXT_PAUSE:
                mandate_set_status(m, MANDATE_PAUSED, a->reason);
                log_event(LOG_WARNING, NULL, LOG_FIELDS({ "MANDATE_ID", m->id }),
                          "mandate %s paused: %s", m->id, a->reason);
                executor_release_slot(m);
                d->drv->own.slot_release(m);
                break;
        case NEXT_END:
                m->ended_ms = a->ended_ms ? a->ended_ms : now_ms_realtime();
                m->down_ms = a->down_ms;
                mandate_set_status(m, a->end_status, a->reason);
                log_event(LOG_NOTICE, NULL, LOG_FIELDS({ "MANDATE_ID", m->id }),
                          "mandate %s %s after %lld cycle%s (%s)", m->id,
                          mandate_status_name(a->end_status), a->cycle, a->cycle == 1 ? "" : "s",
                          a->reason ? a->reason : "");
                if (a->end_status == MANDATE_FAILED || a->end_status == MANDATE_TERMINATED) {
                        /* not seen failing here (a restart came between):
                         * what its failed record says */
                        if (!m->failure) {
                                m->failure = a->wal_failure;
                                a->wal_failure = NULL;
                        }
                        hooks_event(d, HOOK_FAILURE, m, NULL, NULL);
                }
                free(m->failure); /* its page is made: not kept with the history */
                m->failure = NULL;
                executor_release_slot(m);
                own_release(m); /* (postgres: its row says it ended, its slot is free) */
                if (a->end_synced)
                        archive_synced(m, a->archive_path, a->unlink_error);
                else
                        archive_enqueue(m, a->archive_path);
                a->archive_path = NULL;
                break;
        case NEXT_RETRY_WAIT:
                retry_wait(m, a);
                break;
        case NEXT_RETRY_EVIDENCE: {
                /* its effect is journaled: its evidence decides, as after a
                 * crash (an interrupted call: its check, the probe or a
                 * human; none: run again, its finished calls answered from
                 * the store) */
                char why[160];
                snprintf(why, sizeof why, "retry of %s: deciding it from its evidence",
                         a->step_id);
                executor_release_slot(m);
                mandate_set_status(m, MANDATE_PROBING, why);
                /* recovery appends through a descriptor of its own: the
                 * next advance folds the file again, its records included */
                mandate_wal_close(m);
                fold_free(m->fold);
                m->fold = NULL;
                kbuf_free(&m->wal_bytes);
                if (d->up.recover_again)
                        d->up.recover_again(d, m->id);
                break;
        }
        case NEXT_NONE:
                executor_release_slot(m);
                break;
        }
out:
        advance_free(a);
        daemon_update_status(d);
        executor_kick(d);
        /* nothing runs: no batch would grow, archive now */
        if (d->executor->running == 0 && d->executor->arch_npending)
                archive_flush(d);
        executor_check_idle(d);
}

void executor_submit(struct mandate *m, struct advance *a)
{
        if (mandate_submit(m, advance_work, advance_done, a) < 0) {
                log_error("out of memory: cannot advance %s", m->id);
                finish_fire_reply(a, false);
                op_reply_error(&a->cancel_reply, "internal", "out of memory");
                if (a->cancel)
                        executor_cancel_drop(m);
                advance_free(a);
                executor_release_slot(m);
        }
}

void executor_cancel_drop(struct mandate *m)
{
        struct mandate_cancel *c = m->cancel;
        if (!c)
                return;
        m->cancel = NULL;
        op_reply_error(&c->reply, "internal", "the cancel of %s was dropped", m->id);
        free(c->reason);
        free(c);
}

/* Queue the cancel's records (a: a job that already holds the interrupted
 * step's record, or NULL). */
void executor_cancel_submit(struct mandate *m, struct advance *a)
{
        struct mandate_cancel *c = m->cancel;
        if (c->submitted) {
                if (a)
                        executor_submit(m, a);
                return;
        }
        if (!a && !(a = advance_new(m))) {
                log_error("out of memory: cannot cancel %s", m->id);
                executor_cancel_drop(m);
                return;
        }
        c->submitted = true;
        a->cancel = true;
        a->decide = false;
        a->cancel_reason = strdup(c->reason);
        a->cancel_uid = (long long)c->uid;
        a->cancel_reply = c->reply;
        c->reply = (struct op_reply){ 0 };
        if (!a->cancel_reason) {
                op_reply_error(&a->cancel_reply, "internal", "out of memory");
                advance_free(a);
                executor_cancel_drop(m);
                return;
        }
        executor_submit(m, a);
}

void executor_cancel(struct mandate *m, const char *reason, uid_t by,
                     void (*done)(void *ctx, const struct op_result *r), void *ctx)
{
        struct op_reply reply = { done, ctx };
        struct mandate_cancel *c = calloc(1, sizeof(*c));
        if (!c || !(c->reason = strdup(reason))) {
                free(c);
                op_reply_error(&reply, "internal", "out of memory");
                return;
        }
        c->uid = by;
        c->reply = reply;
        m->cancel = c;
        toolhold_cancel(m); /* a tool run that outlived the last kairosd */
        executor_retry_stop(m); /* a step waiting for its retry: it ends here */
        char uid[32];
        snprintf(uid, sizeof uid, "%u", (unsigned)by);
        log_event(LOG_NOTICE, MSGID_OPERATOR,
                  LOG_FIELDS({ "MANDATE_ID", m->id }, { "OPERATOR_UID", uid }),
                  "mandate %s cancelled by uid %s: %s%s", m->id, uid, reason,
                  m->run && (m->run->started || m->run->starting) && !m->run->child.exited
                          ? " (stopping its handler)"
                          : "");
        struct exec_run *run = m->run;
        if (run && run->waiting_retry) {
                /* never started: the cancel records it */
                child_cancel_after(&run->child);
                run->waiting_retry = false;
                m->run = NULL;
                run->finished = true;
                handler_close(run);
                run = NULL;
        }
        if (run && run->started && !run->child.exited) {
                handler_stop(run); /* run_finished submits the cancel */
                return;
        }
        if (run)
                return; /* starting (on_job_started stops it) or ending: run_finished submits */
        /* (an advance in flight runs first: its result is recorded, nothing
         * new starts after it) */
        executor_cancel_submit(m, NULL);
}

void executor_enqueue(struct mandate *m)
{
        if (m->holds_slot) {
                /* resumed while its handler still runs: it simply goes on */
                mandate_set_status(m, MANDATE_RUNNING, NULL);
                return;
        }
        if (m->queued) {
                mandate_set_status(m, MANDATE_RUNNABLE, NULL);
                return;
        }
        mandate_set_status(m, MANDATE_RUNNABLE, NULL);
        m->queued = true;
        m->next_queued = NULL;
        struct daemon *d = m->d;
        if (d->executor->queue_tail)
                d->executor->queue_tail->next_queued = m;
        else
                d->executor->queue_head = m;
        d->executor->queue_tail = m;
}

static const struct config_schedule *schedule_cfg(const struct daemon *d, const char *name)
{
        for (size_t i = 0; name && i < d->cfg->nschedules; i++)
                if (strcmp(d->cfg->schedules[i].name, name) == 0)
                        return &d->cfg->schedules[i];
        return NULL;
}

/* Another mandate of the same schedule that is (running) or (not finished). */
static struct mandate *sibling(const struct daemon *d, const struct mandate *self,
                               const char *schedule, bool running_only)
{
        size_t pos = 0;
        const char *k;
        void *v;
        while (strmap_next(d->mandates, &pos, &k, &v) == 0) {
                struct mandate *o = v;
                if (o == self || !o->schedule || strcmp(o->schedule, schedule) != 0)
                        continue;
                /* (cluster: a lost or refused claim, not this node's) */
                if (own_dropped(o) && !o->holds_slot)
                        continue;
                if (running_only ? o->holds_slot : !mandate_status_is_final(o->status))
                        return o;
        }
        return NULL;
}

void executor_finish(struct mandate *m, enum decide_end end, const char *reason)
{
        struct advance *a = advance_new(m);
        mandate_set_status(m, advance_end_status(end), reason);
        if (!a) {
                log_error("out of memory: cannot archive %s; its WAL stays", m->id);
                return;
        }
        /* the advance job decides the end again from the WAL and archives */
        executor_submit(m, a);
}

static void start_mandate(struct mandate *m)
{
        struct daemon *d = m->d;
        struct advance *a = advance_new(m);
        if (!a) {
                log_error("out of memory: cannot start %s", m->id);
                return;
        }
        m->holds_slot = true;
        d->executor->running++;
        mandate_set_status(m, MANDATE_RUNNING, NULL);
        executor_submit(m, a);
}

void executor_kick(struct daemon *d)
{
        if (d->stopping || !d->ready)
                return;
        /* FIFO, except that a mandate of a Concurrency=queue schedule waits
         * while another mandate of its schedule runs. */
        struct mandate **link = &d->executor->queue_head, *last = NULL;
        while (*link && d->executor->running < d->cfg->max_concurrent_mandates) {
                struct mandate *m = *link;
                /* paused or cancelled meanwhile */
                bool drop = m->status != MANDATE_RUNNABLE || m->cancel || own_dropped(m);
                const struct config_schedule *sc = schedule_cfg(d, m->schedule);
                if (!drop && sc && sc->concurrency == CONCURRENCY_QUEUE &&
                    (sibling(d, m, m->schedule, true) || !d->drv->own.slot_ready(m))) {
                        last = m;
                        link = &m->next_queued;
                        continue;
                }
                *link = m->next_queued;
                m->queued = false;
                m->next_queued = NULL;
                if (!drop)
                        start_mandate(m);
        }
        /* the tail is the last mandate left in the list */
        if (!*link) {
                d->executor->queue_tail = last;
        } else {
                struct mandate *t = *link;
                while (t->next_queued)
                        t = t->next_queued;
                d->executor->queue_tail = t;
        }
}

struct fire_dup {
        struct op_reply reply;
        struct mandate *m;
};

static void fire_dup_work(void *arg)
{
        (void)arg; /* nothing: only its place in the mandate's queue matters */
}

static void fire_dup_done(void *arg)
{
        struct fire_dup *dup = arg;
        struct mandate *m = dup->m;
        m->busy--;
        if (m->status == MANDATE_WAL_IO_ERROR || m->status == MANDATE_QUARANTINED)
                op_reply_error(&dup->reply, mandate_status_name(m->status),
                               "mandate %s of this fire is %s: %s", m->id,
                               mandate_status_name(m->status), m->reason ? m->reason : "");
        else
                op_reply_ok(&dup->reply,
                            json_pack("{s:s, s:s?, s:s?, s:b, s:s, s:s}", "mandate", m->id,
                                      "schedule", m->schedule, "fired_at", m->fired_at,
                                      "fired", 0, "status", mandate_status_name(m->status),
                                      "message", "already fired: nothing to do"));
        free(dup);
}

static void fire_tick(struct daemon *d, const char *schedule, const char *fired_at, int retry,
                      const struct executor_retry *rt, bool timer, struct op_reply reply);

void executor_fire(struct daemon *d, const char *schedule, const char *fired_at,
                   void (*done)(void *ctx, const struct op_result *r), void *ctx)
{
        fire_tick(d, schedule, fired_at, 0, NULL, false, (struct op_reply){ done, ctx });
}

void executor_fire_timer(struct daemon *d, const char *schedule, const char *fired_at,
                         void (*done)(void *ctx, const struct op_result *r), void *ctx)
{
        fire_tick(d, schedule, fired_at, 0, NULL, true, (struct op_reply){ done, ctx });
}

void executor_retry(struct daemon *d, const struct executor_retry *rt,
                    void (*done)(void *ctx, const struct op_result *r), void *ctx)
{
        fire_tick(d, rt->schedule, rt->fired_at, rt->retry, rt, false,
                  (struct op_reply){ done, ctx });
}

/* The records of the steps a retry --from takes as completed (rt->carried):
 * each step pending, then completed with the result of the step it is
 * carried from, marked carried_from; they are durable with the plan, so
 * the executor never runs them and recovery finds them completed. */
static int carry_records(struct advance *a, const struct mandate *m,
                         const struct carry_step *steps, size_t n, const char *plan_id)
{
        for (size_t i = 0; i < n; i++) {
                const struct carry_step *s = &steps[i];
                char key[PLANNER_ID_MAX + PLANNER_STEP_ID_MAX + 2];
                char *from = NULL;
                snprintf(key, sizeof key, "%s/%s", m->id, s->step_id);
                if (asprintf(&from, "%s/%s", m->retry_of, s->step_id) < 0)
                        return -ENOMEM;
                char *carried_from = advance_own(a, from);
                free(from);
                const char *step_id = advance_own(a, s->step_id);
                const char *idem_key = advance_own(a, key);
                const char *post = advance_own(a, s->post_hash);
                const char *hash = advance_own(a, s->result_hash);
                const char *result = s->result_json ? advance_own(a, s->result_json) : "null";
                if (!carried_from || !step_id || !idem_key || !post || !hash || !result ||
                    a->npre + 2 > MAX_BATCH)
                        return -ENOMEM;
                a->pre[a->npre++] = (struct wal_record){ .op = WAL_OP_APPEND, .step_id = step_id,
                                                         .plan_id = plan_id,
                                                         .idem_key = idem_key };
                a->pre[a->npre++] = (struct wal_record){
                        .op = WAL_OP_COMPLETED, .step_id = step_id, .post_hash = post,
                        .result_hash = hash, .result_json = result, .carried_from = carried_from,
                };
        }
        return 0;
}

/* The cycle before the one a retry --from runs (c->prev_status not
 * PLAN_OPEN): its plan, its completed steps carried, finalized as it was. */
static int carry_prev_cycle(struct advance *a, const struct mandate *m, const struct carry *c,
                            int retry)
{
        if (c->prev_status == PLAN_OPEN)
                return 0;
        struct planner_plan *pp = &a->prev_plan;
        int r = planner_build_retry(m->schedule, m->fired_at, retry, (int)c->cycle - 1, pp);
        if (r < 0)
                return r;
        for (int i = 0; i < PLANNER_PHASES; i++)
                a->prev_wsteps[i] = (struct wal_step){ pp->steps[i].step_id, pp->steps[i].tool,
                                                       pp->steps[i].params_hash,
                                                       pp->steps[i].pre_hash,
                                                       pp->steps[i].expected_post_hash };
        if (a->npre + 2 + 2 * c->prev_nsteps > MAX_BATCH)
                return -ENOMEM;
        a->pre[a->npre++] = (struct wal_record){ .op = WAL_OP_PLAN_COMMIT, .plan_id = pp->plan_id,
                                                 .mandate_id = pp->mandate_id,
                                                 .cycle = pp->cycle, .steps = a->prev_wsteps,
                                                 .nsteps = PLANNER_PHASES };
        if ((r = carry_records(a, m, c->prev_steps, c->prev_nsteps, pp->plan_id)) < 0)
                return r;
        const char *reason = c->prev_reason ? advance_own(a, c->prev_reason) : NULL;
        if (c->prev_reason && !reason)
                return -ENOMEM;
        a->pre[a->npre++] = (struct wal_record){ .op = WAL_OP_FINALIZE, .plan_id = pp->plan_id,
                                                 .status = c->prev_status, .reason = reason };
        return 0;
}

/* Fire (schedule, fired_at): its first mandate (retry 0), or with rt a
 * retry of it (kairosctl retry); timer: the schedule's clock fired it. */
static void fire_tick(struct daemon *d, const char *schedule, const char *fired_at, int retry,
                      const struct executor_retry *rt, bool timer, struct op_reply reply)
{
        const struct config_schedule *sc = NULL;
        for (size_t i = 0; i < d->cfg->nschedules; i++)
                if (strcmp(d->cfg->schedules[i].name, schedule) == 0)
                        sc = &d->cfg->schedules[i];
        const struct config_broken *broken = config_find_broken(d->cfg, schedule);
        if (broken) {
                /* (a retained configuration only serves mandates already running) */
                op_reply_error(&reply, "schedule_broken",
                               "schedule '%s' is broken, fix its file and reload: %s", schedule,
                               broken->errors.n ? broken->errors.msgs[0] : "?");
                return;
        }
        if (!sc) {
                op_reply_error(&reply, "not_found", "no schedule named '%s'", schedule);
                return;
        }
        if (!own_may_act(d)) {
                op_reply_error(&reply, "cluster_unavailable",
                               "node %s cannot renew its lease: it claims no tick now",
                               own_node(d));
                return;
        }
        struct planner_plan p;
        const struct carry *carried = rt ? rt->carried : NULL;
        if (planner_build_retry(schedule, fired_at, retry, carried ? (int)carried->cycle : 1,
                                &p) < 0) {
                op_reply_error(&reply, "bad_argument", "cannot plan %s at %s", schedule,
                               fired_at);
                return;
        }
        struct mandate *m = mandate_find(d, p.mandate_id);
        if (m && own_forget_dropped(m))
                m = NULL; /* the database decides this fire */
        if (m && !op_reply_wanted(&reply)) {
                log_info("schedule %s at %s: mandate %s exists already (%s): nothing to do",
                         schedule, fired_at, m->id, mandate_status_name(m->status));
                return;
        }
        if (m) {
                /* Answer after the jobs already queued for it — above all the
                 * first fire's own flush — so "already fired" is never said
                 * of a plan that is not durable yet. */
                struct fire_dup *dup = calloc(1, sizeof(*dup));
                if (!dup) {
                        op_reply_error(&reply, "internal", "out of memory");
                        return;
                }
                dup->reply = reply;
                dup->m = m;
                if (mandate_submit(m, fire_dup_work, fire_dup_done, dup) < 0) {
                        free(dup);
                        op_reply_error(&reply, "internal", "out of memory");
                }
                return;
        }
        struct mandate *busy = sc->concurrency == CONCURRENCY_REJECT
                                       ? sibling(d, NULL, schedule, false)
                                       : NULL;
        if (busy) {
                log_event(LOG_NOTICE, NULL, LOG_FIELDS({ "SCHEDULE", schedule }),
                          "fire of %s at %s rejected: mandate %s is still %s (Concurrency=reject)",
                          schedule, fired_at, busy->id, mandate_status_name(busy->status));
                op_reply_error(&reply, "rejected",
                               "schedule %s has Concurrency=reject and mandate %s is still %s",
                               schedule, busy->id, mandate_status_name(busy->status));
                return;
        }
        char *path = NULL;
        m = statedir_wal_path(&d->paths, p.mandate_id, &path) < 0
                    ? NULL
                    : mandate_add(d, p.mandate_id, path);
        free(path);
        if (!m) {
                op_reply_error(&reply, "internal", "out of memory");
                return;
        }
        m->schedule = strdup(schedule);
        mandate_set_fired_at(m, strdup(fired_at));
        m->goal = sc->goal ? strdup(sc->goal) : NULL;
        if (rt) {
                m->retry_of = strdup(rt->retry_of);
                m->retry = retry;
                m->retry_forced = rt->forced;
        }
        m->started_ms = now_ms_realtime();
        struct advance *a = advance_new(m);
        if (!a) {
                op_reply_error(&reply, "internal", "out of memory");
                return;
        }
        a->reply = reply;
        a->pre[a->npre++] = (struct wal_record){ .op = WAL_OP_MANDATE, .mandate_id = advance_own(a, m->id),
                                                 .schedule = advance_own(a, schedule),
                                                 .fired_at = advance_own(a, fired_at),
                                                 .goal = advance_own(a, m->goal),
                                                 .retry_of = advance_own(a, m->retry_of),
                                                 .retry = m->retry };
        if (rt)
                a->pre[a->npre++] = (struct wal_record){
                        .op = WAL_OP_OPERATOR, .mandate_id = advance_own(a, m->id), .action = "retry",
                        .uid = rt->uid, .reason = advance_own(a, rt->reason),
                };
        if (carried && carry_prev_cycle(a, m, carried, retry) < 0) {
                op_reply_error(&a->reply, "internal", "out of memory");
                advance_free(a);
                return;
        }
        advance_set_plan(a, &a->pre[a->npre++], &p);
        if (carried && carry_records(a, m, carried->steps, carried->nsteps, a->plan.plan_id) < 0) {
                op_reply_error(&a->reply, "internal", "out of memory");
                advance_free(a);
                return;
        }
        /* With a free slot the first step's executing record shares the flush
         * of the plan_commit; otherwise the plan waits in the queue.  In
         * cluster mode a Concurrency=queue mandate always waits there: its
         * schedule's slot is taken in the database once its claim committed
         * (the claim must not hold an executing record without it), and a
         * Concurrency=reject tick is claimed only while no mandate of the
         * schedule is unfinished in the cluster. */
        bool wait_turn = d->drv->own.fired(m, sc) ||
                         (sc->concurrency == CONCURRENCY_QUEUE && sibling(d, m, schedule, true));
        if (!d->stopping && d->ready && !wait_turn &&
            d->executor->running < d->cfg->max_concurrent_mandates && !d->executor->queue_head) {
                m->holds_slot = true;
                d->executor->running++;
                mandate_set_status(m, MANDATE_RUNNING, NULL);
        } else {
                a->decide = false;
                mandate_set_status(m, MANDATE_RUNNABLE, NULL);
                m->queued = true;
                if (d->executor->queue_tail)
                        d->executor->queue_tail->next_queued = m;
                else
                        d->executor->queue_head = m;
                d->executor->queue_tail = m;
        }
        if (rt)
                log_event(LOG_NOTICE, MSGID_OPERATOR,
                          LOG_FIELDS({ "MANDATE_ID", m->id }, { "SCHEDULE", schedule }),
                          "retry %d of %s at %s by uid %lld: mandate %s (retries %s%s%s): %s",
                          retry, schedule, fired_at, (long long)rt->uid, m->id, rt->retry_of,
                          carried ? " from " : "", carried ? carried->from_step : "",
                          rt->reason);
        else if (d->drv->own.node(d))
                a->log_fired = true;  /* a node of a cluster: once its claim is won */
        else
                log_event(LOG_NOTICE, NULL,
                          LOG_FIELDS({ "MANDATE_ID", m->id }, { "SCHEDULE", schedule }),
                          "fired %s at %s: mandate %s", schedule, fired_at, m->id);
        metrics_fire(d->metrics, schedule, !timer);
        executor_submit(m, a);
}

/* ---- graceful stop ---- */

static void on_grace_timeout(uv_timer_t *t)
{
        struct daemon *d = t->data;
        size_t pos = 0;
        const char *k;
        void *v;
        while (strmap_next(d->mandates, &pos, &k, &v) == 0) {
                struct mandate *m = v;
                if (m->run && !m->run->finished) {
                        log_warning("%s %s: still running after GracefulTimeoutSec=%llu: killed",
                                    m->id, m->run->step_id,
                                    (unsigned long long)d->cfg->graceful_timeout_sec);
                        m->run->killed_for_shutdown = true;
                        handler_kill(m->run, SIGKILL);
                }
        }
}

void executor_shutdown(struct daemon *d, void (*done)(struct daemon *d))
{
        d->executor->idle = done;
        size_t pos = 0;
        const char *k;
        void *v;
        while (strmap_next(d->mandates, &pos, &k, &v) == 0) {
                struct mandate *m = v;
                if (m->run && m->run->waiting_retry)
                        handler_retry_give_up(m->run);
                if (m->retry_timer) {
                        /* its retry_wait record is durable: the next start
                         * waits for the rest of it */
                        executor_retry_stop(m);
                        mandate_set_status(m, MANDATE_RUNNABLE, NULL);
                        executor_release_slot(m);
                }
        }
        if (d->executor->running == 0) {
                executor_check_idle(d);
                return;
        }
        log_info("waiting up to %llus for %u running mandate%s",
                 (unsigned long long)d->cfg->graceful_timeout_sec, d->executor->running,
                 d->executor->running == 1 ? "" : "s");
        uv_timer_init(d->loop, &d->executor->grace_timer);
        d->executor->grace_timer.data = d;
        uv_timer_start(&d->executor->grace_timer, on_grace_timeout, d->cfg->graceful_timeout_sec * 1000, 0);
}

void executor_kill_handler(struct mandate *m, int sig)
{
        if (m->run && !m->run->finished)
                handler_kill(m->run, sig);
}

void executor_free_mandate(struct mandate *m)
{
        if (m->cancel)
                m->cancel->reply = (struct op_reply){ 0 }; /* the loop is gone: nobody to answer */
        executor_cancel_drop(m);
        free(m->fired_at);
        free(m->goal);
        free(m->retry_of);
        free(m->step_id);
}
