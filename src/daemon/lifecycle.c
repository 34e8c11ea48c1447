/* SPDX-License-Identifier: MIT */
/* lifecycle: the daemon's state as a whole — configuration reloads,
 * signals, the status dump and the graceful stop.  main.c wires these.  The
 * clock is clock.c, the STATUS= line status.c: the modules below call
 * those, never up into lifecycle. */
#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chronos.h"
#include "driver.h"
#include "daemon.h"
#include "executor.h"
#include "hooks.h"
#include "probe.h"
#include "toolhold.h"
#include "idem_service.h"
#include "kairos/kbuf.h"
#include "log.h"
#include "metrics.h"

static void status_dump(struct daemon *d)
{
        unsigned c[MANDATE__STATUS_MAX];
        mandates_count(d, c);
        struct kbuf b = KBUF_INIT;
        for (int s = 0; s < MANDATE__STATUS_MAX; s++)
                if (c[s])
                        kbuf_printf(&b, "%s%s=%u", b.len ? " " : "", mandate_status_name(s), c[s]);
        log_event(LOG_INFO, MSGID_STATUS_DUMP, NULL, 0,
                  "status: %zu mandate%s (%s); recovery: %u resumed, %u paused for review, %u "
                  "quarantined; %llu fdatasync call%s; config %s",
                  strmap_size(d->mandates), strmap_size(d->mandates) == 1 ? "" : "s", b.data ? b.data : "none", d->recovery.resumed,
                  d->recovery.paused_review, d->recovery.quarantined,
                  (unsigned long long)d->flushes_total, d->flushes_total == 1 ? "" : "s",
                  d->config_path ? d->config_path : "built-in");
        kbuf_free(&b);
}

/* ---- config ---- */

gid_t daemon_lookup_group(const char *name)
{
        struct group *g = name ? getgrnam(name) : NULL;
        return g ? g->gr_gid : (gid_t)-1;
}

int daemon_load_config(const char *path, const char *state_dir, struct config **out,
                       struct config_errors *errs)
{
        if (!path)
                return config_builtin(state_dir, out);
        return config_load(path, state_dir, out, errs);
}

/* Into the journal: every error of each broken schedule file (it is skipped,
 * the others run) and every warning. */
void daemon_log_schedule_problems(const struct config *c)
{
        for (size_t i = 0; i < c->nbroken; i++) {
                const struct config_broken *b = &c->broken[i];
                for (size_t k = 0; k < b->errors.n; k++)
                        log_event(LOG_ERR, NULL, LOG_FIELDS({ "SCHEDULE", b->name }), "%s",
                                  b->errors.msgs[k]);
                log_event(LOG_ERR, NULL, LOG_FIELDS({ "SCHEDULE", b->name }),
                          "schedule %s is broken (%zu error%s in %s): skipped, the other "
                          "schedules run",
                          b->name, b->errors.n, b->errors.n == 1 ? "" : "s", b->path);
        }
        for (size_t i = 0; i < c->nschedules; i++)
                for (size_t k = 0; !c->schedules[i].retained && k < c->schedules[i].warnings.n;
                     k++)
                        log_event(LOG_WARNING, NULL,
                                  LOG_FIELDS({ "SCHEDULE", c->schedules[i].name }),
                                  "warning: %s", c->schedules[i].warnings.msgs[k]);
}

/* ---- reload ---- */

struct reload_job {
        struct daemon *d;
        void (*done)(void *ctx, const struct op_result *r);
        void *ctx;
        struct config *cfg;
        struct config_errors errs;
        int r;
};

static void reload_work(void *arg)
{
        struct reload_job *j = arg;
        j->r = daemon_load_config(j->d->config_path, j->d->state_dir_override, &j->cfg, &j->errs);
}

static void reload_done(void *arg)
{
        struct reload_job *j = arg;
        struct daemon *d = j->d;
        d->reloading = false;
        if (j->r < 0) {
                json_t *list = json_array();
                struct kbuf all = KBUF_INIT;
                for (size_t i = 0; i < j->errs.n; i++) {
                        json_array_append_new(list, json_string(j->errs.msgs[i]));
                        kbuf_printf(&all, "%s%s", i ? "; " : "", j->errs.msgs[i]);
                }
                if (j->errs.n == 0)
                        kbuf_printf(&all, "%s", strerror(-j->r));
                log_event(LOG_ERR, MSGID_RELOAD_FAILED, NULL, 0,
                          "reload failed, keeping the running configuration: %s",
                          all.data ? all.data : "");
                if (j->done) {
                        char msg[128];
                        snprintf(msg, sizeof msg,
                                 "configuration invalid (%zu error%s), kept the running one",
                                 j->errs.n, j->errs.n == 1 ? "" : "s");
                        j->done(j->ctx, &(struct op_result){
                                                .code = "config_invalid",
                                                .message = msg,
                                                .detail = json_pack("{s:o}", "errors", list) });
                } else {
                        json_decref(list);
                }
                kbuf_free(&all);
                config_errors_free(&j->errs);
        } else {
                struct config *old = d->cfg;
                if (strcmp(old->state_directory, j->cfg->state_directory) != 0 ||
                    strcmp(old->control_socket, j->cfg->control_socket) != 0)
                        log_warning("reload: StateDirectory= and ControlSocket= changes take "
                                    "effect at the next restart");
                /* Keep the running paths; take everything else. */
                char *sd = j->cfg->state_directory, *cs = j->cfg->control_socket;
                j->cfg->state_directory = old->state_directory;
                j->cfg->control_socket = old->control_socket;
                old->state_directory = sd;
                old->control_socket = cs;
                /* HandlerUser= too: the runner holds the one resolved at start */
                if ((old->handler_user || j->cfg->handler_user) &&
                    (!old->handler_user || !j->cfg->handler_user ||
                     strcmp(old->handler_user, j->cfg->handler_user) != 0))
                        log_warning("reload: HandlerUser= changes take effect at the next "
                                    "restart");
                char *hu = j->cfg->handler_user;
                j->cfg->handler_user = old->handler_user;
                old->handler_user = hu;
                /* [Cluster]: the running values too (never log a value: the
                 * connection string may hold a password) */
                char keys[128];
                if (config_keep_cluster(j->cfg, old, keys, sizeof(keys)) > 0)
                        log_warning("reload: [Cluster] %s changed: kept the running value; "
                                    "[Cluster] changes take effect at the next restart", keys);
                /* A schedule broken now keeps, for its running mandates, the
                 * configuration it had; it does not fire. */
                if (config_retain_broken(j->cfg, old) < 0)
                        log_error("out of memory keeping the configuration of broken schedules");
                daemon_log_schedule_problems(j->cfg);
                idem_service_reload(d, j->cfg);
                d->cfg = j->cfg;
                config_free(old);
                log_set_level(d->cfg->log_level);
                d->socket_gid = daemon_lookup_group(d->cfg->socket_group);
                metrics_reload(d->metrics);
                chronos_reload(d);
                executor_check_limits(d);
                size_t good = 0;
                for (size_t i = 0; i < d->cfg->nschedules; i++)
                        good += !d->cfg->schedules[i].retained;
                log_event(LOG_NOTICE, MSGID_RELOAD_OK, NULL, 0,
                          "configuration reloaded: %zu schedule%s, %zu broken", good,
                          good == 1 ? "" : "s", d->cfg->nbroken);
                if (j->done)
                        j->done(j->ctx,
                                &(struct op_result){
                                        .result = json_pack("{s:b, s:i, s:i}", "reloaded", 1,
                                                            "schedules", (int)good, "broken",
                                                            (int)d->cfg->nbroken) });
        }
        notify_ready();
        daemon_update_status(d);
        free(j);
}

static void reload_error(void (*done)(void *ctx, const struct op_result *r), void *ctx,
                         const char *code, const char *message)
{
        if (done)
                done(ctx, &(struct op_result){ .code = code, .message = message });
}

void daemon_reload(struct daemon *d, void (*done)(void *ctx, const struct op_result *r),
                   void *ctx)
{
        if (d->reloading) {
                reload_error(done, ctx, "conflict", "a reload is already running");
                return;
        }
        struct reload_job *j = calloc(1, sizeof(*j));
        if (!j) {
                reload_error(done, ctx, "internal", "out of memory");
                return;
        }
        j->d = d;
        j->done = done;
        j->ctx = ctx;
        d->reloading = true;
        notify_reloading();
        log_info("reloading configuration from %s",
                 d->config_path ? d->config_path : "(built-in)");
        if (serialq_submit(&d->admin_q, reload_work, reload_done, j) < 0) {
                d->reloading = false;
                free(j);
                notify_ready();
                reload_error(done, ctx, "internal", "out of memory");
        }
}

/* ---- stop, signals ---- */

void daemon_on_jobs_drained(void *ctx)
{
        struct daemon *d = ctx;
        if (d->stopping && executor_running(d) == 0)
                uv_stop(d->loop);
}

static void on_stop_timeout(uv_timer_t *t)
{
        struct daemon *d = t->data;
        log_warning("stop timed out with %u jobs in flight", d->jobs.inflight);
        uv_stop(d->loop);
}

static void on_executor_idle(struct daemon *d)
{
        /* Nothing runs any more: let the queued file work finish, then stop. */
        if (d->jobs.inflight == 0)
                uv_stop(d->loop);
}

void daemon_stop(struct daemon *d, int exit_code)
{
        if (d->stopping)
                return;
        d->stopping = true;
        d->exit_code = exit_code;
        notify_stopping();
        log_event(LOG_NOTICE, MSGID_STOPPING, NULL, 0,
                  "stopping: %u mandate%s running, %u jobs in flight", executor_running(d),
                  executor_running(d) == 1 ? "" : "s", d->jobs.inflight);
        /* The control socket stays: read-only commands are answered until
         * the loop ends (commands.c refuses the others). */
        chronos_stop(d);
        d->drv->quiesce(d);
        metrics_stop(d->metrics);
        history_stop(d);
        notify_watchdog_stop(&d->watchdog);
        notify_status_stop();
        uv_signal_stop(&d->sig_hup);
        uv_signal_stop(&d->sig_usr1);
        uv_timer_stop(&d->extend_timer);
        /* A backstop in case a job hangs in the kernel. */
        uv_timer_start(&d->stop_timer, on_stop_timeout,
                       (d->cfg->graceful_timeout_sec + 30) * 1000, 0);
        hooks_stop(d);
        probe_stop(d);
        toolhold_stop(d);
        if (d->up.stopping)
                d->up.stopping(d);
        executor_shutdown(d, on_executor_idle);
}

void daemon_on_signal(uv_signal_t *s, int signum)
{
        struct daemon *d = s->data;
        switch (signum) {
        case SIGTERM:
        case SIGINT:
                log_info("received %s", signum == SIGTERM ? "SIGTERM" : "SIGINT");
                daemon_stop(d, d->exit_code);  /* 0 unless a failure asked for the stop */
                break;
        case SIGHUP:
                if (d->ready)
                        daemon_reload(d, NULL, NULL);
                break;
        case SIGUSR1:
                status_dump(d);
                break;
        }
}

void daemon_on_extend(uv_timer_t *t)
{
        struct daemon *d = t->data;
        notify_extend_timeout(10 * 1000 * 1000);
        daemon_update_status(d);
}
