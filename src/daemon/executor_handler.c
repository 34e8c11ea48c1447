/* SPDX-License-Identifier: MIT */
/* Handler runs: a step's handler program runs in its own process group
 * through the runner (runner.h) with the environment, stdin document and
 * output handling of kairosd(8), HANDLERS; how it ended becomes the step's
 * records (an advance job, executor_advance.c). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "executor.h"
#include "executor_internal.h"
#include "kairos/canon.h"
#include "kairos/idem.h"
#include "kairos/kjson.h"
#include "kairos/recovery.h"
#include "kairos/strmap.h"
#include "driver.h"
#include "hooks.h"
#include "log.h"
#include "metrics.h"
#include "runenv.h"

#define MAX_OUTPUT (1024 * 1024)
#define STDERR_LOG_MAX (64 * 1024)  /* bytes of a step's stderr that are logged */
#define STDERR_LINE_MAX 4096        /* bytes of one logged line */
#define SPAWN_RETRY_MIN_MS 100
#define SPAWN_RETRY_MAX_MS 5000

static void run_free_spawn_args(struct exec_run *run)
{
        config_strv_free(run->argv);
        run->argv = NULL;
        free(run->env);         /* (runenv_build: one allocation) */
        run->env = NULL;
        run->cwd = NULL;        /* (in the run's allocation) */
}

static void groups_add(struct exec_run *run);
static void start_reported(struct executor *e, bool gone);
static void groups_remove(struct exec_run *run);
static void run_finished(struct exec_run *run);

/* One stdin document's buffer kept for the next (a document holds the
 * earlier results, up to 1 MiB each: a new one each step was an mmap and
 * its page faults).  Put back on the loop thread, taken by the advance job
 * on a pool thread; at most one, of at most STDIN_SPARE_MAX bytes. */
#define STDIN_SPARE_MIN (128u * 1024u)
#define STDIN_SPARE_MAX (8u * 1024u * 1024u)
static _Atomic(char *) stdin_spare; /* its capacity in its first bytes */

static void stdin_spare_put(char *buf, size_t cap)
{
        if (!buf || cap < STDIN_SPARE_MIN || cap > STDIN_SPARE_MAX) {
                free(buf);
                return;
        }
        memcpy(buf, &cap, sizeof cap);
        free(atomic_exchange(&stdin_spare, buf));
}

void executor_stdin_buffer(struct kbuf *b)
{
        if (b->data)
                return;
        char *buf = atomic_exchange(&stdin_spare, NULL);
        if (!buf)
                return;
        size_t cap;
        memcpy(&cap, buf, sizeof cap);
        *b = (struct kbuf){ .data = buf, .len = 0, .cap = cap };
        buf[0] = '\0';
}

static void live_add(struct executor *e, struct exec_run *run)
{
        run->live_prev = NULL;
        run->live_next = e->live;
        if (e->live)
                e->live->live_prev = run;
        e->live = run;
}

static void live_remove(struct executor *e, struct exec_run *run)
{
        if (run->live_prev)
                run->live_prev->live_next = run->live_next;
        else if (e->live == run)
                e->live = run->live_next;
        if (run->live_next)
                run->live_next->live_prev = run->live_prev;
        run->live_prev = run->live_next = NULL;
}

void executor_close_runs(struct daemon *d)
{
        if (!d->executor)
                return;
        for (struct exec_run *run = d->executor->live; run; run = run->live_next) {
                if (!run->finished)
                        log_warning("%s %s: the handler's run was still open when the loop "
                                    "ended: closed (its step is decided at the next start)",
                                    run->m->id, run->step_id);
                handler_close(run);
        }
}

static void on_run_closed(struct child *c)
{
        struct exec_run *run = c->data;
        live_remove(run->m->d->executor, run);
        run_free_spawn_args(run);
        child_free(c);
        kbuf_free(&run->err_line);
        stdin_spare_put(run->stdin_doc, run->stdin_cap);
        free(run);
}

void handler_close(struct exec_run *run)
{
        child_close(&run->child);
}

/* The handler is over: its records (the child's handles close after). */
static void on_run_done(struct child *c)
{
        struct exec_run *run = c->data;
        groups_remove(run);
        run->finished = true;
        run_finished(run);
}

void handler_kill(struct exec_run *run, int sig)
{
        child_kill(&run->child, sig);
}

static void log_stderr_line(struct exec_run *run, const char *p, size_t n, const char *mark)
{
        if (n && p[n - 1] == '\r')
                n--;
        char *line = strndup(p, n);
        if (!line)
                return;
        log_event(LOG_INFO, NULL,
                  LOG_FIELDS({ "MANDATE_ID", run->m->id }, { "STEP_ID", run->step_id }),
                  "%s %s: %s%s", run->m->id, run->step_id, line, mark);
        free(line);
}

/* A piece of at most STDERR_LINE_MAX bytes of b that does not end inside a
 * UTF-8 character (unless it is not UTF-8 at all). */
static size_t piece_len(const char *b, size_t n)
{
        if (n <= STDERR_LINE_MAX)
                return n;
        size_t k = STDERR_LINE_MAX;
        for (int back = 0; back < 4 && k > 0; back++, k--)
                if (((unsigned char)b[k] & 0xc0) != 0x80)
                        return k;
        return STDERR_LINE_MAX;
}

/* stderr goes to the log line by line: the first STDERR_LOG_MAX bytes of a
 * step, in lines of at most STDERR_LINE_MAX bytes (a longer line is logged
 * in pieces, each but the last ending in "…"); what comes after is counted
 * and reported in one line at the end.  The tail for the error message
 * (the child's) sees everything. */
static void stderr_consume(struct exec_run *run, const char *p, size_t n)
{
        struct kbuf *b = &run->err_line;
        size_t room = STDERR_LOG_MAX - run->err_accepted;
        size_t take = n < room ? n : room;
        run->err_accepted += take;
        run->err_dropped += n - take;
        if (take && kbuf_append(b, p, take) < 0)
                return; /* out of memory: not logged (the tail has it) */
        size_t start = 0;
        for (;;) {
                char *nl = memchr(b->data + start, '\n', b->len - start);
                size_t len = nl ? (size_t)(nl - (b->data + start)) : b->len - start;
                if (len > STDERR_LINE_MAX) {
                        size_t k = piece_len(b->data + start, len);
                        log_stderr_line(run, b->data + start, k, "\u2026");
                        start += k;
                        continue;
                }
                if (!nl)
                        break;
                log_stderr_line(run, b->data + start, len, "");
                start += len + 1;
        }
        /* Nothing more will be logged: do not keep a partial line waiting. */
        if (run->err_accepted == STDERR_LOG_MAX && b->len > start) {
                log_stderr_line(run, b->data + start, b->len - start, "");
                start = b->len;
        }
        memmove(b->data, b->data + start, b->len - start);
        b->len -= start;
}

static void on_run_read(struct child *c, int fd, const char *p, size_t n)
{
        struct exec_run *run = c->data;
        struct kbuf *b = &run->err_line;
        if (fd != 2)
                return;
        if (!p) {
                if (b->len)
                        log_stderr_line(run, b->data, b->len, "");
                b->len = 0;
                if (run->err_dropped)
                        log_event(LOG_WARNING, NULL,
                                  LOG_FIELDS({ "MANDATE_ID", run->m->id },
                                             { "STEP_ID", run->step_id }),
                                  "%s %s: \u2026 %zu bytes of stderr dropped (only the first %d "
                                  "bytes of a step are logged)",
                                  run->m->id, run->step_id, run->err_dropped, STDERR_LOG_MAX);
                return;
        }
        stderr_consume(run, p, n);
}

void executor_free(struct daemon *d)
{
        runner_free(d->runner);
        d->runner = NULL;
        handler_user_clear(&d->handler_user);
        struct executor *e = d->executor;
        if (!e)
                return;
        start_reported(e, true);
        strmap_free(e->handler_groups);
        cgroup_ctl_free(e->cgroup);
        free(e->arch_pending);
        free(e->arch_paths);
        free(e);
        d->executor = NULL;
        free(atomic_exchange(&stdin_spare, NULL));
}

unsigned executor_running(const struct daemon *d)
{
        return d->executor ? d->executor->running : 0;
}


void executor_check_limits(struct daemon *d)
{
        unsigned have = cgroup_ctl_controllers(d->executor->cgroup);
        for (size_t i = 0; i < d->cfg->nschedules; i++) {
                const struct config_schedule *s = &d->cfg->schedules[i];
                bool mem = s->memory_max && !(have & CGROUP_MEMORY);
                bool pids = s->tasks_max && !(have & CGROUP_PIDS);
                bool cpu = s->cpu_quota_pct && !(have & CGROUP_CPU);
                if (d->executor->cgroup && (mem || pids || cpu))
                        log_warning("schedule %s: %s%s%snot enforced: no such controller in "
                                    "%s (missing: %s)", s->name, mem ? "MemoryMax= " : "",
                                    pids ? "TasksMax= " : "", cpu ? "CPUQuota= " : "",
                                    cgroup_ctl_where(d->executor->cgroup), cgroup_ctl_missing(d->executor->cgroup));
                else if (!d->executor->cgroup && config_schedule_has_limits(s))
                        log_warning("schedule %s: %s%s%snot enforced: no delegated cgroup (%s)",
                                    s->name, s->memory_max ? "MemoryMax= " : "",
                                    s->tasks_max ? "TasksMax= " : "",
                                    s->cpu_quota_pct ? "CPUQuota= " : "", d->executor->cgroup_why);
        }
}

/* Running handlers by process group ("PGID" -> struct exec_run *), for
 * attributing tool calls to steps. */
static void group_key(pid_t pgid, char key[24])
{
        snprintf(key, 24, "%d", (int)pgid);
}

static void groups_add(struct exec_run *run)
{
        char key[24];
        group_key(run->pid, key);
        if (strmap_put(run->m->d->executor->handler_groups, key, run) < 0)
                log_warning("%s %s: out of memory: its tool calls are not attributed to it",
                            run->m->id, run->step_id);
}

static void groups_remove(struct exec_run *run)
{
        char key[24];
        if (!run->pid)
                return;
        group_key(run->pid, key);
        if (strmap_get(run->m->d->executor->handler_groups, key) == run)
                strmap_remove(run->m->d->executor->handler_groups, key);
}

int executor_step_of(struct daemon *d, pid_t pid, struct idem_step_owner *ret)
{
        char key[24];
        pid_t pgid = getpgid(pid);
        if (pgid <= 0)
                return -ESRCH;
        group_key(pgid, key);
        struct exec_run *run = strmap_get(d->executor->handler_groups, key);
        if (!run || run->child.exited)
                return -ESRCH;
        *ret = (struct idem_step_owner){ .attempt = run->attempt };
        snprintf(ret->mandate, sizeof ret->mandate, "%s", run->m->id);
        snprintf(ret->step, sizeof ret->step, "%s", run->step_id);
        return idem_owner_check(ret) < 0 ? -ESRCH : 0;
}

struct start_waiter {
        struct start_waiter *next;
        void (*cb)(void *ctx, bool gone);
        void *ctx;
};

bool executor_start_pending(struct daemon *d, pid_t pid)
{
        if (!d->executor || !d->executor->nstarting)
                return false;
        pid_t pgid = getpgid(pid);
        if (pgid <= 0)
                return false;
        char key[24];
        group_key(pgid, key);
        return strmap_get(d->executor->handler_groups, key) == NULL;
}

int executor_after_start(struct daemon *d, void (*cb)(void *ctx, bool gone), void *ctx)
{
        struct start_waiter *w = malloc(sizeof(*w));
        if (!w)
                return -ENOMEM;
        *w = (struct start_waiter){ d->executor->start_waiters, cb, ctx };
        d->executor->start_waiters = w;
        /* a quiet start is reported now, not with its handler's exit */
        runner_release(d->runner);
        return 0;
}

/* A start was reported: every waiter asks again (it may wait again). */
static void start_reported(struct executor *e, bool gone)
{
        struct start_waiter *w = e->start_waiters;
        e->start_waiters = NULL;
        while (w) {
                struct start_waiter *next = w->next;
                w->cb(w->ctx, gone);
                free(w);
                w = next;
        }
}

int executor_tool_group(struct daemon *d, pid_t pid, bool add)
{
        if (!add) {
                runner_remove_tool_group(d->runner, pid);
                return 0;
        }
        char key[24];
        pid_t pgid = getpgid(pid);
        if (pgid <= 0)
                return -ESRCH;
        if (pgid == pid)
                return -EPERM; /* the handler itself: it cannot leave its group */
        group_key(pgid, key);
        struct exec_run *run = strmap_get(d->executor->handler_groups, key);
        if (!run || run->child.exited || !run->child.running)
                return -ESRCH;
        return runner_add_tool_group(&run->child.job, pid);
}

int executor_init(struct daemon *d)
{
        if (!(d->executor = calloc(1, sizeof(*d->executor))) ||
            !(d->executor->handler_groups = strmap_new()))
                return -ENOMEM;
        /* before anything is forked: the keeper and the deadman keep what
         * kairosd holds */
        char why[512];
        int r = creds_setup(d->cfg->handler_user, &d->handler_user, why, sizeof why);
        if (r < 0) {
                log_error("%s", why);
                return r;
        }
        /* before the runner: the keeper is forked into kairosd's leaf */
        r = cgroup_ctl_new(&d->executor->cgroup, d->executor->cgroup_why, sizeof d->executor->cgroup_why);
        if (r < 0)
                log_warning("handler cgroups: %s; handlers run without", d->executor->cgroup_why);
        else if (d->executor->cgroup)
                log_info("handler cgroups below %s%s%s", cgroup_ctl_where(d->executor->cgroup),
                         *cgroup_ctl_missing(d->executor->cgroup) ? ", controllers not available: " : "",
                         cgroup_ctl_missing(d->executor->cgroup));
        else
                log_info("no handler cgroups: %s", d->executor->cgroup_why);
        executor_check_limits(d);
        /* The driver's helpers (postgres: the deadman), forked before any
         * thread exists (the runner's is the first) and after kairosd moved
         * into its leaf cgroup, which the deadman must hold alone
         * (deadman.h) */
        struct deadman *deadman = NULL;
        if ((r = d->drv->prefork(d, &deadman)) < 0)
                return r;
        r = runner_new(d->loop, &d->runner);
        if (r < 0)
                return r;
        runner_set_cgroup(d->runner, d->executor->cgroup);
        if (d->handler_user.set) {
                runner_set_user(d->runner, &d->handler_user);
                log_info("handlers run as user %s (uid %u), in its home %s unless "
                         "WorkingDirectory= says otherwise", d->handler_user.name,
                         (unsigned)d->handler_user.uid, d->handler_user.home);
        } else {
                log_notice("handlers run as kairosd's own user (HandlerUser= is not set): a "
                           "handler can change its cgroup's limits, leave its cgroup, signal "
                           "kairosd and write its state; see kairosd(8), HANDLERS");
        }
        if (deadman)
                runner_set_deadman(d->runner, deadman);
        uid_t huid = d->handler_user.set ? d->handler_user.uid : getuid();
        runenv_init(huid);
        return 0;
}


/* Starting a handler can fail for want of a resource that comes back:
 * file descriptors (EMFILE, ENFILE: e.g. many control connections), process
 * slots or memory for the child (EAGAIN, ENOMEM).  That is not the step's
 * fault: the step is started again after a pause (doubling from
 * SPAWN_RETRY_MIN_MS to SPAWN_RETRY_MAX_MS), logged, with nothing more in
 * the WAL — its executing record is already durable and stays the only one,
 * so KAIROS_ATTEMPT does not grow, and a crash meanwhile is seen at restart
 * as what it might be (interrupted during execution: a human decides). */
static bool spawn_error_is_transient(int err)
{
        return err == -EMFILE || err == -ENFILE || err == -EAGAIN || err == -ENOMEM;
}

static void run_start(struct exec_run *run);

void handler_stop(struct exec_run *run)
{
        child_stop(&run->child);
}

static void on_spawn_retry(struct child *c)
{
        struct exec_run *run = c->data;
        run->waiting_retry = false;
        run_start(run);
}

static void spawn_retry_later(struct exec_run *run, int err)
{
        struct mandate *m = run->m;
        run->retry_ms = run->retry_ms ? run->retry_ms * 2 : SPAWN_RETRY_MIN_MS;
        if (run->retry_ms > SPAWN_RETRY_MAX_MS)
                run->retry_ms = SPAWN_RETRY_MAX_MS;
        run->tries++;
        run->waiting_retry = true;
        log_event(LOG_WARNING, NULL,
                  LOG_FIELDS({ "MANDATE_ID", m->id }, { "STEP_ID", run->step_id }),
                  "%s %s: cannot start %s now: %s; trying again in %u ms (try %u; the handler "
                  "did not run)",
                  m->id, run->step_id, run->cmdline, strerror(-err), run->retry_ms, run->tries);
        child_after(&run->child, run->retry_ms, on_spawn_retry);
}

/* Stopping while a start waits for resources: the step was never started;
 * its executing record stays open and the next start of kairosd treats it
 * as interrupted. */
void handler_retry_give_up(struct exec_run *run)
{
        struct mandate *m = run->m;
        log_warning("%s %s: not started (no resources to start it) before the stop", m->id,
                    run->step_id);
        child_cancel_after(&run->child);
        m->run = NULL;
        run->finished = true;
        handler_close(run);
        if (m->status == MANDATE_RUNNING)
                mandate_set_status(m, MANDATE_RUNNABLE, NULL);
        executor_release_slot(m);
        executor_check_idle(m->d);
}

/* The step cannot start at all: it fails (spawn_error), or — a program that
 * cannot be executed — it fails as the shell's "exit status 127" would. */
static void run_start_failed(struct exec_run *run, int err, const char *what)
{
        if (what && strcmp(what, "execute") == 0) {
                char msg[512];
                snprintf(msg, sizeof msg, "kairosd: cannot execute '%s': %s",
                         run->argv ? run->argv[0] : "?", strerror(-err));
                log_stderr_line(run, msg, strlen(msg), "");
                child_tail_add(&run->child, msg, strlen(msg));
                run->child.exit_status = 127;
        } else {
                snprintf(run->spawn_error, sizeof run->spawn_error, "cannot start %s: %s%s%s",
                         run->cmdline, what ? what : "", what ? ": " : "", strerror(-err));
                run->spawn_failed = true;
        }
        run->child.exited = run->finished = true;
        run_finished(run);
}

static void run_started(struct child *job)
{
        struct exec_run *run = job->data;
        struct mandate *m = run->m;
        run->starting = false;
        if (job->err && m->cancel) {
                /* cancelled before it could start: the cancel records it */
                m->run = NULL;
                run->finished = true;
                handler_close(run);
                executor_cancel_submit(m, NULL);
                return;
        }
        if (job->err && spawn_error_is_transient(job->err) && !m->d->stopping) {
                spawn_retry_later(run, job->err);
                return;
        }
        if (run->tries)
                log_event(LOG_INFO, NULL,
                          LOG_FIELDS({ "MANDATE_ID", m->id }, { "STEP_ID", run->step_id }),
                          "%s %s: %s after %u tr%s", m->id, run->step_id,
                          job->err ? "cannot start it either" : "started", run->tries,
                          run->tries == 1 ? "y" : "ies");
        if (job->err) {
                run_start_failed(run, job->err, job->err_what);
                return;
        }
        run->started = true;
        run->pid = job->pid;
        /* from the clone's return (a quiet start is reported late) */
        run->started_us = job->job.started_us ? job->job.started_us : now_us_monotonic();
        groups_add(run);
        run_free_spawn_args(run);
        log_event(LOG_INFO, NULL,
                  LOG_FIELDS({ "MANDATE_ID", m->id }, { "STEP_ID", run->step_id }),
                  "%s %s: started %s (pid %d, attempt %u)", m->id, run->step_id, run->cmdline,
                  (int)run->pid, run->attempt);
        if (run->killed_for_shutdown)
                handler_kill(run, SIGKILL); /* started after GracefulTimeoutSec= ran out */
        else if (m->cancel)
                handler_stop(run);
}

/* The runner's report of a start: the run goes on, then the calls that
 * waited for it ask again (executor_after_start). */
static void on_run_started(struct child *job)
{
        struct executor *e = ((struct exec_run *)job->data)->m->d->executor;
        e->nstarting--;
        run_started(job);
        start_reported(e, false);
}

static void run_start(struct exec_run *run)
{
        struct child *c = &run->child;
        c->argv = run->argv;
        c->envp = run->env;
        c->cwd = run->cwd;
        run->kill_mark = run->m->d->drv->own.kill_mark(run->m->d);
        int r = child_start(c, run->m->d->runner);
        if (r == 0) {
                run->starting = true;
                run->m->d->executor->nstarting++;
                return;
        }
        if (spawn_error_is_transient(r) && !run->m->d->stopping) {
                spawn_retry_later(run, r);
                return;
        }
        run_start_failed(run, r, "pipe");
}

void handler_spawn(struct mandate *m, struct advance *a)
{
        struct daemon *d = m->d;
        const struct config_schedule *sc = NULL;
        for (size_t i = 0; i < d->cfg->nschedules; i++)
                if (strcmp(d->cfg->schedules[i].name, m->schedule) == 0)
                        sc = &d->cfg->schedules[i];
        if (!own_may_act(d) || own_dropped(m)) {
                /* its lease may end before the handler would: another node
                 * takes it over and decides (the step never started) */
                own_drop(m, "this node's lease is ending: no handler starts");
                executor_release_slot(m);
                return;
        }
        const char *cmdline = sc ? sc->exec[a->phase] : NULL;
        if (cmdline && !*cmdline)
                cmdline = NULL;
        const char *cwd = sc && sc->working_directory ? sc->working_directory
                          : d->handler_user.set       ? d->handler_user.home
                                                      : d->cfg->state_directory;
        /* the run and its strings in one allocation (the configuration's
         * may be reloaded while it runs: copies) */
        const char *const strs[] = { a->step_id, a->expected_post, cmdline,
                                     cmdline ? cwd : NULL };
        size_t lens[4], size = sizeof(struct exec_run);
        for (size_t i = 0; i < 4; i++)
                size += lens[i] = strs[i] ? strlen(strs[i]) + 1 : 0;
        struct exec_run *run = calloc(1, size);
        if (!run) {
                log_error("out of memory starting %s %s", m->id, a->step_id);
                executor_release_slot(m);
                return;
        }
        char *at = (char *)(run + 1), *copies[4];
        for (size_t i = 0; i < 4; i++) {
                copies[i] = strs[i] ? memcpy(at, strs[i], lens[i]) : NULL;
                at += lens[i];
        }
        run->m = m;
        run->phase = a->phase;
        run->attempt = a->attempt;
        run->step_id = copies[0];
        run->expected_post = copies[1];
        m->run = run;
        free(m->step_id);
        m->step_id = strdup(a->step_id);
        if (!cmdline) {
                /* No command: the phase completes at once with a null result. */
                run->child.exited = true;
                run->finished = true;
                run_finished(run);
                free(run);
                return;
        }
        /* environment */
        char epoch[24];
        snprintf(epoch, sizeof epoch, "%lld", (long long)m->epoch);
        const struct runenv_step step = {
                .mandate_id = m->id, .plan_id = a->plan_id, .step_id = a->step_id,
                .phase = a->phase, .cycle = a->cycle, .idem_key = a->idem_key,
                .schedule = m->schedule, .fired_at = m->fired_at, .goal = m->goal,
                .attempt = a->attempt, .control_socket = d->cfg->control_socket,
        };
        const char *const kv[][2] = {
                { "KAIROS_NODE", own_node(d) },
                { "KAIROS_EPOCH", m->epoch > 0 ? epoch : NULL },
        };
        char **env = runenv_build_step(&step, kv, sizeof kv / sizeof kv[0],
                                           sc ? sc->environment : NULL, sc ? sc->nenvironment : 0);
        /* the command line's $NAME and ${NAME} expand from that environment */
        char **argv = NULL, why[256] = "";
        int r = env ? runenv_command(cmdline, env, &argv, why, sizeof why) : -ENOMEM;
        if (r < 0) {
                /* (an empty command name was split: it cannot start) */
                snprintf(run->spawn_error, sizeof run->spawn_error, "cannot %s %s=: %s",
                         argv ? "start" : "split", config_phase_key(a->phase),
                         r == -EINVAL && why[0] ? why : strerror(-r));
                run->spawn_failed = true;
                run->child.exited = run->finished = true;
                config_strv_free(argv);
                free(env);
                run_finished(run);
                free(run);
                return;
        }
        run->argv = argv;
        run->env = env;
        run->cwd = copies[3];
        run->cmdline = copies[2];
        /* the document is the job's: taken, not copied (it holds the
         * earlier results, up to 1 MiB each) */
        size_t stdin_len = a->stdin_doc.data ? a->stdin_doc.len : 3;
        run->stdin_cap = a->stdin_doc.data ? a->stdin_doc.cap : 4;
        run->stdin_doc = a->stdin_doc.data ? a->stdin_doc.data : strdup("{}\n");
        a->stdin_doc = (struct kbuf)KBUF_INIT;
        run->timeout_sec = sc ? (unsigned)sc->timeout_sec : 300;
        struct child *c = &run->child;
        child_init(c, d->loop);
        if (sc)
                c->limits = (struct cgroup_limits){ sc->memory_max, sc->tasks_max,
                                                    sc->cpu_quota_pct };
        c->cg_hint = run->step_id;
        c->in = run->stdin_doc;
        c->in_len = run->stdin_doc ? stdin_len : 0;
        c->timeout_ms = (uint64_t)run->timeout_sec * 1000;
        c->quiet = true;
        c->out_max = MAX_OUTPUT;
        c->read = on_run_read;
        c->started = on_run_started;
        c->done = on_run_done;
        c->closed = on_run_closed;
        c->data = run;
        live_add(d->executor, run);
        if (!env || !run->stdin_doc) {
                run_start_failed(run, -ENOMEM, NULL);
                return;
        }
        run_start(run);
}

/* The end of the handler's stderr, trailing blank lines and spaces trimmed
 * (NUL bytes shown as '?' so they do not end the text early). */
static void stderr_tail(const struct child *c, char out[CHILD_TAIL + 1])
{
        size_t n = c->tail_len;
        while (n && (c->tail[n - 1] == '\n' || c->tail[n - 1] == '\r' || c->tail[n - 1] == ' '))
                n--;
        for (size_t i = 0; i < n; i++)
                out[i] = c->tail[i] ? c->tail[i] : '?';
        out[n] = '\0';
}

/* Keep the last `max` UTF-8 characters of s, starting at a character. */
static void keep_last_chars(char *s, size_t max)
{
        size_t len = strlen(s), start = len, n = 0;
        for (size_t i = len; i-- > 0;) {
                if (((unsigned char)s[i] & 0xc0) == 0x80)
                        continue;
                if (n == max)
                        break;
                n++;
                start = i;
        }
        memmove(s, s + start, len - start + 1);
}

/* msg (ASCII) + ": " + the end of tail, WAL_ERROR_MSG_MAX_CHARS characters
 * at most in all: the WAL cuts a longer error_msg at its end, and the end of
 * stderr is where the reason is. */
static void append_tail(char *msg, size_t size, char *tail)
{
        size_t used = strlen(msg);
        if (!*tail || used + 2 >= WAL_ERROR_MSG_MAX_CHARS)
                return;
        keep_last_chars(tail, WAL_ERROR_MSG_MAX_CHARS - used - 2);
        snprintf(msg + used, size - used, ": %s", tail);
}

/* Is the handler's output JSON that the completed record can hold?  It is
 * read with the exact reader of canonical JSON (kjson: numbers keep their
 * digits, integers of any size and numbers beyond double range included).
 * The record nests the result one level deeper, and a record nested deeper
 * than KJSON_MAX_DEPTH could not be read back (the WAL would look corrupt):
 * such output is kept as text, like any other non-JSON output.  Output in
 * the compact form is read once, by the canonical hash (canon_hash_compact);
 * other output is parsed, and the one parse serves all: its canonical hash
 * goes to hash and,
 * unless the output is already its compact form (*ret_same: the bytes the
 * WAL holds are the output's own), that form to compact; so neither the
 * encoder nor the hash reads the text again.  Returns 0, or -EINVAL with
 * why it is not (err), or -ENOMEM. */
static int result_json_read(const char *out, size_t n, struct kbuf *compact, bool *ret_same,
                            char hash[CANON_HASH_STRLEN], struct kjson_error *err)
{
        /* most handlers print compact JSON: hashed in one pass, no tree */
        if (canon_hash_compact(out, n, KJSON_MAX_DEPTH - 1, hash) == 0) {
                *ret_same = true;
                return 0;
        }
        struct kjson_arena *ar = kjson_arena_new();
        struct kjson *v = NULL;
        int r = ar ? kjson_parse_nested(ar, out, n, 1, &v, ret_same, err) : -ENOMEM;
        if (r == 0) {
                const struct kjson *res = v;
                if (canon_hash_value(res, hash) < 0)
                        canon_hash_bytes(out, n, hash);
                if (!*ret_same && (r = kbuf_reserve(compact, n)) == 0)
                        r = kjson_write(compact, res);
        }
        kjson_arena_free(ar);
        return r;
}

/* The handler is over: turn what happened into the records of the step. */
static void run_finished(struct exec_run *run)
{
        struct mandate *m = run->m;
        struct daemon *d = m->d;
        m->run = NULL;
        struct advance *a = advance_new(m);
        if (!a) {
                log_error("out of memory finishing %s %s", m->id, run->step_id);
                executor_release_slot(m);
                return;
        }
        /* While stopping, or paused by an operator, a finished step is
         * recorded but nothing new starts. */
        a->decide = !d->stopping && m->status != MANDATE_PAUSED;
        if (!run->killed_for_shutdown && !run->spawn_failed &&
            run->child.term_signal == SIGKILL && d->drv->own.killed_here(m, run->kill_mark)) {
                /* The node's own fence or deadman: not the step's failure.
                 * Nothing is recorded at this epoch; the next holder of m
                 * decides the step by evidence (docs/design.md §14). */
                log_event(LOG_WARNING, NULL,
                          LOG_FIELDS({ "MANDATE_ID", m->id }, { "STEP_ID", run->step_id }),
                          "%s %s: the handler was killed by this node's fence (its lease "
                          "could not be renewed in time): nothing recorded, the mandate's "
                          "next holder decides the step by evidence",
                          m->id, run->step_id);
                handler_close(run);
                if (m->cancel) {
                        op_reply_error(&m->cancel->reply, "fenced",
                                       "the cancel of %s was not completed: this node lost "
                                       "its lease (cancel it again on the node that holds it)",
                                       m->id);
                        executor_cancel_drop(m);
                }
                a->decide = false;
                executor_submit(m, a);
                return;
        }
        struct wal_record *r = &a->pre[a->npre++];
        const char *step = advance_own(a, run->step_id);
        const struct child *c = &run->child;
        char tail[CHILD_TAIL + 1];
        stderr_tail(c, tail);
        char msg[CHILD_TAIL + 256];
        if (run->killed_for_shutdown) {
                *r = (struct wal_record){ .op = WAL_OP_NEEDS_REVIEW, .step_id = step,
                                          .reason = RECOVERY_KILLED_AT_SHUTDOWN,
                                          .evidence_json = "{\"reason\":\"" RECOVERY_KILLED_AT_SHUTDOWN "\"}" };
        } else if (run->spawn_failed) {
                *r = (struct wal_record){ .op = WAL_OP_FAILED, .step_id = step,
                                          .error_class = "spawn_error",
                                          .error_msg = advance_own(a, run->spawn_error) };
        } else if (c->overflow) {
                *r = (struct wal_record){ .op = WAL_OP_FAILED, .step_id = step,
                                          .error_class = "output_too_large",
                                          .error_msg = "the handler wrote more than 1 MiB to stdout" };
        } else if (c->timed_out) {
                snprintf(msg, sizeof msg, "no exit within TimeoutSec=%u", run->timeout_sec);
                append_tail(msg, sizeof msg, tail);
                *r = (struct wal_record){ .op = WAL_OP_FAILED, .step_id = step,
                                          .error_class = "timeout", .error_msg = advance_own(a, msg) };
        } else if (c->oom_killed && (c->term_signal || c->exit_status != 0)) {
                snprintf(msg, sizeof msg, "killed by the OOM killer: over MemoryMax= (%s)",
                         c->term_signal ? strsignal(c->term_signal) : "exit status");
                append_tail(msg, sizeof msg, tail);
                *r = (struct wal_record){ .op = WAL_OP_FAILED, .step_id = step,
                                          .error_class = "oom", .error_msg = advance_own(a, msg) };
        } else if (c->term_signal) {
                snprintf(msg, sizeof msg, "killed by signal %d (%s)", c->term_signal,
                         strsignal(c->term_signal));
                append_tail(msg, sizeof msg, tail);
                *r = (struct wal_record){ .op = WAL_OP_FAILED, .step_id = step,
                                          .error_class = "signal", .error_msg = advance_own(a, msg) };
        } else if (c->exit_status != 0) {
                snprintf(msg, sizeof msg, "exit status %lld", (long long)c->exit_status);
                append_tail(msg, sizeof msg, tail);
                *r = (struct wal_record){ .op = WAL_OP_FAILED, .step_id = step,
                                          .error_class = "exit_status", .error_msg = advance_own(a, msg) };
        } else {
                /* Completed: stdout is the result (JSON, or text kept as a string). */
                struct kbuf res = KBUF_INIT;
                size_t n = c->out.len;
                const char *out = c->out.data ? c->out.data : "";
                while (n && (out[n - 1] == '\n' || out[n - 1] == '\r' || out[n - 1] == ' '))
                        n--;
                char hash[CANON_HASH_STRLEN];
                bool compact = false, same = false;
                if (n == 0) {
                        kbuf_puts(&res, "null");
                } else {
                        struct kjson_error jerr = { 0 };
                        int jr = result_json_read(out, n, &res, &same, hash, &jerr);
                        if (jr == 0 && same) {
                                /* the output is its compact form: the
                                 * record takes its buffer (no copy) */
                                compact = true;
                                kbuf_free(&res);
                                res = run->child.out;
                                run->child.out = (struct kbuf)KBUF_INIT;
                                res.len = n;
                                res.data[n] = '\0';
                        } else if (jr == 0) {
                                compact = true;
                        } else {
                                kbuf_reset(&res);
                                kbuf_json_string_lossy(&res, out, n, 0);
                                if (jr == -EINVAL)
                                        log_event(LOG_INFO, NULL,
                                                  LOG_FIELDS({ "MANDATE_ID", m->id },
                                                             { "STEP_ID", run->step_id }),
                                                  "%s %s: the output is not JSON (%s at byte "
                                                  "%zu): kept as text",
                                                  m->id, run->step_id,
                                                  kjson_error_string(jerr.code), jerr.offset);
                        }
                }
                /* null (no output) or the output as a string: made
                 * compact here, hashed in one pass unless that gives up */
                if (!compact && canon_hash_compact(res.data, res.len, KJSON_MAX_DEPTH - 1, hash) < 0 &&
                    canon_hash_json(res.data, res.len, hash, NULL) < 0)
                        canon_hash_bytes(res.data, res.len, hash);
                *r = (struct wal_record){ .op = WAL_OP_COMPLETED, .step_id = step,
                                          .post_hash = advance_own(a, run->expected_post ? run->expected_post : ""),
                                          .result_hash = advance_own(a, hash),
                                          .result_json = advance_take(a, res.data),
                                          .result_compact = compact,
                                          .result_len = res.len };
        }
#ifdef KAIROS_TEST_HOOKS
        /* test hook: a handler that exits with this status asks for a human,
         * with evidence: the review the executor decides while running */
        const char *rx = getenv("KAIROS_TEST_REVIEW_EXIT");
        if (rx && *rx && r->op == WAL_OP_FAILED && !run->spawn_failed && !c->term_signal &&
            c->exit_status == strtoll(rx, NULL, 10)) {
                snprintf(msg, sizeof msg, "{\"reason\":\"test_review_exit\",\"exit_status\":%lld}",
                         (long long)c->exit_status);
                *r = (struct wal_record){ .op = WAL_OP_NEEDS_REVIEW, .step_id = step,
                                          .reason = "test_review_exit",
                                          .evidence_json = advance_own(a, msg) };
        }
#endif
        if (m->cancel && r->op != WAL_OP_COMPLETED && !run->killed_for_shutdown) {
                /* stopped by the cancel: an interrupted step, recorded as such */
                char how[64];
                if (c->term_signal)
                        snprintf(how, sizeof how, "signal %d", c->term_signal);
                else
                        snprintf(how, sizeof how, "exit status %lld",
                                 (long long)c->exit_status);
                snprintf(msg, sizeof msg, "cancelled by uid %u while it ran: %s (the handler "
                         "was stopped: %s)", (unsigned)m->cancel->uid, m->cancel->reason, how);
                *r = (struct wal_record){ .op = WAL_OP_FAILED, .step_id = step,
                                          .error_class = "cancelled", .error_msg = advance_own(a, msg) };
        }
        if (r->op == WAL_OP_FAILED) {
                /* what an OnFailure= page says of it (hooks.h), in the
                 * record too: a page after a restart says the same */
                char last[CHILD_TAIL + 1];
                stderr_tail(c, last);
                bool exited = !run->spawn_failed && !c->term_signal;
                const char *page_tail = hooks_stderr_last(last);
                r->has_exit_status = exited;
                r->exit_status = exited ? (int)c->exit_status : 0;
                r->exit_signal = run->spawn_failed ? 0 : c->term_signal;
                r->stderr_tail = *page_tail ? advance_own(a, page_tail) : NULL;
                hooks_note_failure(m, &(struct hook_failure){
                                              .step = (char *)run->step_id,
                                              .error_class = (char *)r->error_class,
                                              .error_msg = (char *)r->error_msg,
                                              .exit_status = exited ? (int)c->exit_status : -1,
                                              .exit_signal = run->spawn_failed ? 0 : c->term_signal,
                                              .attempt = run->attempt,
                                              .stderr_tail = last });
        }
        metrics_step(d->metrics, run->phase, r->op, run->pid ? run->started_us : 0);
        if (r->op == WAL_OP_COMPLETED && !r->result_json) {
                a->npre = 0;
                log_error("out of memory recording %s %s", m->id, run->step_id);
        }
        log_event(r->op == WAL_OP_COMPLETED ? LOG_INFO : LOG_WARNING, NULL,
                  LOG_FIELDS({ "MANDATE_ID", m->id }, { "STEP_ID", run->step_id }),
                  "%s %s: %s%s%s", m->id, run->step_id,
                  r->op == WAL_OP_COMPLETED ? "completed"
                  : r->op == WAL_OP_FAILED  ? "failed"
                                            : "needs review",
                  r->error_msg ? ": " : "", r->error_msg ? r->error_msg : "");
        handler_close(run);
        if (m->cancel && !run->killed_for_shutdown) {
                a->interrupted = strdup(run->step_id);
                executor_cancel_submit(m, a);
                return;
        }
        if (m->cancel) {
                /* the stop came first: the step is recorded for review */
                op_reply_error(&m->cancel->reply, "stopping",
                               "kairosd is stopping: the cancel of %s was not "
                               "completed (its step is recorded for review)",
                               m->id);
                executor_cancel_drop(m);
        }
        executor_submit(m, a);
}
