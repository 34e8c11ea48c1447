/* SPDX-License-Identifier: MIT */
/* executor: runs mandates.  Each cycle is the planner's five steps; each
 * step's handler program runs in its own process group (runner.h) with the
 * environment, stdin document and output handling of kairosd(8), HANDLERS.  Every transition goes to
 * the WAL first, on the mandate's serial queue: the executing record is
 * durable before the handler is spawned, and completed(N) shares one flush
 * with executing(N+1).  The WAL is the source of truth: a mandate (re)starts
 * by folding its WAL and going on from its first unfinished step. */
#pragma once

#include "daemon.h"
#include "kairos/decide.h"
#include "result.h"

/* Operations a client asks for (fire, retry, cancel) answer through
 * done(ctx, result), exactly once, on the loop thread (commands.c turns the
 * result into the reply); done NULL: nobody asked. */

/* kairosctl retry: retry number `retry` (>= 1) of the tick (schedule,
 * fired_at), a new mandate whose mandate record names retry_of; the reply
 * (like fire's) comes once its first records are durable. */
struct carry;
struct executor_retry {
        const char *schedule, *fired_at, *retry_of, *reason;
        int retry;
        long long uid;
        bool forced;       /* the operator gave a reason (a done tick may run again) */
        /* kairosctl retry --from: the new mandate starts at carried->cycle
         * and takes carried->steps as completed, carried from retry_of's
         * (docs/design.md §6); NULL: the whole tick again.  Borrowed for the
         * call. */
        const struct carry *carried;
};
void executor_retry(struct daemon *d, const struct executor_retry *rt,
                    void (*done)(void *ctx, const struct op_result *r), void *ctx);
/* Fire SCHEDULE at fired_at: plan committed durably, then the answer (or a
 * no-op answer if that (schedule, fired_at) was fired before). */
void executor_fire(struct daemon *d, const char *schedule, const char *fired_at,
                   void (*done)(void *ctx, const struct op_result *r), void *ctx);
/* The same for the schedule's own clock (chronos): counted as a timer fire. */
void executor_fire_timer(struct daemon *d, const char *schedule, const char *fired_at,
                         void (*done)(void *ctx, const struct op_result *r), void *ctx);

/* kairosctl cancel: a running handler gets SIGTERM (its process group),
 * SIGKILL 5 s later; its step is recorded failed (error_class cancelled) —
 * an act that was interrupted stays visible as such — then an operator
 * record (action cancel), the open plan finalized abandoned, and the
 * mandate ends cancelled (archived).  Answers when that is durable; `by`
 * is the uid the operator record names. */
void executor_cancel(struct mandate *m, const char *reason, uid_t by,
                     void (*done)(void *ctx, const struct op_result *r), void *ctx);

/* A mandate became runnable (recovery, resume, resolve, approve): queue it. */
void executor_enqueue(struct mandate *m);
/* A mandate whose WAL says it is over (found at start before its archive was
 * durable): shown with its final status at once, and archived (no slot). */
void executor_finish(struct mandate *m, enum decide_end end, const char *reason);
/* Start queued mandates while fewer than MaxConcurrentMandates run. */
void executor_kick(struct daemon *d);

/* Graceful stop: no new steps; running handlers get GracefulTimeoutSec, then
 * are killed and their steps marked needs_review (killed_at_shutdown).
 * Calls done(d) once nothing runs any more. */
void executor_shutdown(struct daemon *d, void (*done)(struct daemon *d));


void executor_free_mandate(struct mandate *m);
/* sig to the process group of m's running handler, if one runs (cluster
 * mode: the mandate is no longer this node's). */
void executor_kill_handler(struct mandate *m, int sig);

/* The running step whose handler's process group pid is in: 0 and *ret
 * filled, or -ESRCH (tool calls are attributed with it). */
struct idem_step_owner;
int executor_step_of(struct daemon *d, pid_t pid, struct idem_step_owner *ret);
/* A handler's process can call kairosd (kairosctl tool run) before the
 * runner's report of its start has reached the loop, when its process group
 * is not known yet.  executor_start_pending: pid's group is no running
 * handler's while starts are unreported.  executor_after_start: cb(ctx,
 * false) runs on the loop after the next start report (ask again then), or
 * cb(ctx, true) when the executor is freed first; -ENOMEM: not queued. */
bool executor_start_pending(struct daemon *d, pid_t pid);
int executor_after_start(struct daemon *d, void (*cb)(void *ctx, bool gone), void *ctx);
/* add: pid, a tool call's client still in the process group of a running
 * step's handler, is about to lead a process group of its own for the call
 * (runner_add_tool_group; 0 or a negative errno).  !add: that call is over. */
int executor_tool_group(struct daemon *d, pid_t pid, bool add);

/* Once at start, before the loop runs: the process runner (runner.h) and
 * what every handler's environment gets besides its step's variables (HOME,
 * USER, LOGNAME, KAIROSCTL, PATH).  -errno if the runner cannot start. */
int executor_init(struct daemon *d);
/* At start and after a reload: warn of each schedule whose MemoryMax=,
 * TasksMax= or CPUQuota= cannot be enforced (no delegated cgroup). */
void executor_check_limits(struct daemon *d);
/* After the loop ended: a handler's run still open (never the case when
 * the stop waited for every mandate) is closed, with a warning, so the
 * last turn of the loop frees it. */
void executor_close_runs(struct daemon *d);
/* After the loop has ended: stop the runner, free the executor's state. */
void executor_free(struct daemon *d);
/* Mandates holding a slot (running a step or about to). */
unsigned executor_running(const struct daemon *d);
