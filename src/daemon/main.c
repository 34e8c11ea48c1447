/* SPDX-License-Identifier: MIT */
/* kairosd: crash-safe scheduled mandates.  Runs in the foreground. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "chronos.h"
#include "commands.h"
#include "control.h"
#include "daemon.h"
#include "driver.h"
#include "executor.h"
#include "hooks.h"
#include "probe.h"
#include "runner.h"
#include "idem_service.h"
#include "kairos/canon.h"
#include "kairos/evidence.h"
#include "kairos/kio.h"
#include "log.h"
#include "metrics.h"

#define DEFAULT_CONFIG "/etc/kairos/kairosd.conf"

#ifdef KAIROS_HAVE_PGSTORE
#include "driver_postgres.h"
#endif

/* The drivers of this build (driver.h), by [Cluster] Backend=: one is
 * chosen at start; a backend without one was not built in. */
static const struct driver *const drivers[] = {
        [CONFIG_BACKEND_FILES] = &files_driver,
#ifdef KAIROS_HAVE_PGSTORE
        [CONFIG_BACKEND_POSTGRES] = &postgres_driver,
#endif
};

static const struct driver *driver_of(enum config_backend backend)
{
        return (size_t)backend < sizeof drivers / sizeof drivers[0] ? drivers[backend] : NULL;
}

static void usage(FILE *f)
{
        fprintf(f,
                "Usage: kairosd [OPTIONS]\n"
                "Run scheduled mandates crash-safely (in the foreground).\n\n"
                "  -c, --config PATH    configuration file (default " DEFAULT_CONFIG ")\n"
                "      --state-dir DIR  state directory; alone, runs on the built-in\n"
                "                       configuration (no files under /etc needed)\n"
                "      --check-config   validate the configuration and schedules, print a\n"
                "                       summary or every error, exit 0 or 1\n"
                "      --main-only      with --check-config: only kairosd.conf and its\n"
                "                       drop-ins (a broken schedule does not stop kairosd)\n"
                "      --init-db CONNINFO|@FILE\n"
                "                       create or migrate the PostgreSQL schema of cluster\n"
                "                       mode (a libpq connection string, without a password;\n"
                "                       @FILE: read it from FILE), then exit\n"
                "      --version        print the version\n"
                "  -h, --help           this help\n");
}

/* ---- config ---- */

static int check_config(const char *path, const char *state_dir, bool main_only)
{
        struct config *c = NULL;
        struct config_errors errs = { 0 };
        int r = path && main_only ? config_load_main_only(path, state_dir, &c, &errs)
                                  : daemon_load_config(path, state_dir, &c, &errs);
        if (r == 0 && c->nbroken) {
                /* the strict gate: a broken schedule is an error here */
                size_t n = 0;
                for (size_t i = 0; i < c->nbroken; i++)
                        for (size_t k = 0; k < c->broken[i].errors.n; k++, n++)
                                fprintf(stderr, "%s\n", c->broken[i].errors.msgs[k]);
                fprintf(stderr, "kairosd: %zu schedule%s broken (%zu error%s); kairosd would "
                        "skip %s and run the others\n",
                        c->nbroken, c->nbroken == 1 ? "" : "s", n, n == 1 ? "" : "s",
                        c->nbroken == 1 ? "it" : "them");
                config_free(c);
                return 1;
        }
        if (r < 0) {
                for (size_t i = 0; i < errs.n; i++)
                        fprintf(stderr, "%s\n", errs.msgs[i]);
                if (errs.n == 0)
                        fprintf(stderr, "kairosd: %s: %s\n", path ? path : "built-in",
                                strerror(-r));
                fprintf(stderr, "kairosd: configuration has %zu error%s\n", errs.n,
                        errs.n == 1 ? "" : "s");
                config_errors_free(&errs);
                return 1;
        }
        printf("configuration %s: ok\n", path ? path : "(built-in)");
        printf("state directory: %s\ncontrol socket: %s\n", c->state_directory,
               c->control_socket);
        if (c->backend == CONFIG_BACKEND_POSTGRES) /* never the connection string */
                printf("cluster: postgres, node %s, lease %u s\n", c->node_name, c->lease_sec);
        if (main_only) {
                printf("schedules: not checked (--main-only)\n");
        } else {
                printf("schedules: %zu\n", c->nschedules);
                for (size_t i = 0; i < c->nschedules; i++) {
                        const struct config_schedule *s = &c->schedules[i];
                        printf("  %s: %s (%s)%s\n", s->name, s->cron, s->time_zone,
                               s->enabled ? "" : " disabled");
                        for (size_t k = 0; k < s->warnings.n; k++)
                                fprintf(stderr, "warning: %s\n", s->warnings.msgs[k]);
                        if (config_schedule_has_limits(s))
                                printf("    note: MemoryMax=, TasksMax=, CPUQuota= are enforced "
                                       "only with a delegated cgroup (under systemd, "
                                       "Delegate=yes); elsewhere kairosd warns and does not "
                                       "enforce them\n");
                }
        }
        config_free(c);
        return 0;
}

static void close_handle(uv_handle_t *h, void *arg)
{
        (void)arg;
        if (!uv_is_closing(h))
                uv_close(h, NULL);
}

/* A mandate's WAL options: metrics' sync timing, then the driver's barrier. */
static void wire_wal_options(struct mandate *m, struct wal_options *o)
{
        const struct wal_options *mo = metrics_wal_options(m->d->metrics);
        *o = mo ? *mo : (struct wal_options){ 0 };
        m->d->drv->wal.options(m, o);
}

/* The calls up a lower module makes, through the pointers it was given
 * (docs/design.md §2: data flows one way). */
static void wire_upcalls(struct daemon *d)
{
        d->up.wal_options = wire_wal_options;
        d->up.free_mandate = executor_free_mandate;
        d->up.recover_again = recover_again;
        d->up.kill_handler = executor_kill_handler;
        d->up.adopt = recover_adopt;
        d->up.status_changed = commands_status_changed;
        d->up.stopping = commands_stopping;
        control_set_commands(&(struct control_commands){ commands_dispatch, commands_known });
        serialq_set_thread_done(d->drv->thread_done);
}

static bool loop_healthy(void *ctx)
{
        struct daemon *d = ctx;
        return !d->stopping;
}

static void on_recovered(struct daemon *d)
{
        uv_timer_stop(&d->extend_timer);
        const struct recovery_summary *r = &d->recovery;
        if (d->stopping)
                return;
        int rc = control_start(d, d->cfg->control_socket);
        if (rc < 0) {
                log_error("cannot listen on %s: %s", d->cfg->control_socket, uv_strerror(rc));
                daemon_stop(d, 1);
                return;
        }
        d->ready = true;
        notify_ready();
        hooks_ready(d);
        probe_ready(d);
        daemon_update_status(d);
        log_event(LOG_NOTICE, MSGID_READY, NULL, 0,
                  "ready: recovered %u WAL files in %llu ms: %u resumed, %u paused for review, "
                  "%u quarantined; control socket %s",
                  r->files, (unsigned long long)r->duration_ms, r->resumed, r->paused_review,
                  r->quarantined, d->cfg->control_socket);
        executor_kick(d);
        d->drv->ready(d);
        metrics_start(d->metrics);
        history_start(d);
        if ((rc = chronos_start(d)) < 0)
                log_error("the scheduler cannot start: %s; schedules do not fire (kairosctl fire "
                          "still works)",
                          strerror(rc < 0 ? -rc : rc));
}

/* Startup: the idempotency store is loaded first, then recovery decides
 * with its record of tool calls (docs/design.md §8); READY=1 after both. */
static void start_recovery(struct daemon *d)
{
        struct evidence_index *ix = NULL;
        int r = idem_service_evidence_index(d, &ix);
        if (r < 0)
                log_warning("cannot index the idempotency store for recovery: %s; tool calls "
                            "are not used as evidence", strerror(-r));
        else if (!evidence_index_known(ix))
                log_warning("the idempotency store is not available: recovery does not use "
                            "tool calls as evidence (EffectsVia=kairosctl promises nothing)");
        if (!d->mandates) {
                evidence_index_free(ix);
                r = -ENOMEM;
        } else {
                r = recover_start(d, ix, on_recovered);
        }
        if (r < 0) {
                log_error("recovery cannot start: %s", strerror(-r));
                daemon_stop(d, 1);
        }
}

/* Connections, WALs and handlers' pipes all take file descriptors: use
 * the whole hard limit (the control socket sizes its limits from it). */
static void raise_fd_limit(void)
{
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) < 0) {
                log_warning("getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
                return;
        }
        unsigned long long old = (unsigned long long)rl.rlim_cur;
        if (rl.rlim_cur == rl.rlim_max) {
                log_info("open-file limit: %llu", old);
                return;
        }
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
                log_warning("cannot raise the open-file limit from %llu to %llu: %s", old,
                            (unsigned long long)rl.rlim_max, strerror(errno));
        else
                log_info("open-file limit raised from %llu to %llu", old,
                         (unsigned long long)rl.rlim_max);
}

static int take_lock(struct daemon *d)
{
        char path[4096];
        snprintf(path, sizeof path, "%s/kairosd.pid", d->cfg->state_directory);
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) {
                fprintf(stderr, "kairosd: %s: %s\n", path, strerror(errno));
                return -errno;
        }
        if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
                int e = errno;
                char pid[32] = "";
                ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
                if (n > 0) {
                        pid[n] = '\0';
                        pid[strcspn(pid, "\n")] = '\0';
                }
                if (e == EWOULDBLOCK)
                        fprintf(stderr,
                                "kairosd: another kairosd (pid %s) is already using state "
                                "directory %s\n",
                                *pid ? pid : "?", d->cfg->state_directory);
                else
                        fprintf(stderr, "kairosd: cannot lock %s: %s\n", path, strerror(e));
                close(fd);
                return -e;
        }
        char pid[32];
        int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
        if (ftruncate(fd, 0) < 0 || pwrite(fd, pid, (size_t)n, 0) != n)
                log_warning("cannot write %s: %s", path, strerror(errno));
        d->lock_fd = fd;
        return 0;
}

/* The state directories belong to SocketGroup= with the setgid bit, so the
 * WALs and archives created in them (mode 0640) carry that group and its
 * members can run the offline commands (kairosctl wal verify, recover
 * --dry-run).  A mode that is right is left alone: under the shipped unit
 * (RestrictSUIDSGID=) kairosd may not set the bit, systemd and tmpfiles.d set
 * it (StateDirectoryMode=2750) and new directories inherit it.  Best effort:
 * a daemon that may not chgrp or chmod says so and goes on. */
static void share_with_group(struct daemon *d)
{
        const char *dirs[] = { d->paths.root, d->paths.wal, d->paths.archive, d->paths.mandates };
        for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
                struct stat st;
                if (stat(dirs[i], &st) < 0)
                        continue;
                if (d->socket_gid != (gid_t)-1 && st.st_gid != d->socket_gid &&
                    chown(dirs[i], (uid_t)-1, d->socket_gid) < 0) {
                        log_warning("cannot give %s to the group %s: %s", dirs[i],
                                    d->cfg->socket_group, strerror(errno));
                        continue;
                }
                mode_t want = STATEDIR_DIR_MODE | (d->socket_gid != (gid_t)-1 ? S_ISGID : 0);
                mode_t have = st.st_mode & 07777;
                /* (a setgid bit not asked for does no harm) */
                if ((have & 0777) == STATEDIR_DIR_MODE && (have & S_ISGID) >= (want & S_ISGID))
                        continue;
                if (chmod(dirs[i], want) < 0)
                        log_warning("cannot set the mode of %s to %04o (it is %04o): %s%s",
                                    dirs[i], (unsigned)want, (unsigned)have, strerror(errno),
                                    errno == EPERM && (want & S_ISGID)
                                            ? " (set it once: chmod g+s, or "
                                              "systemd-tmpfiles --create kairos.conf)"
                                            : "");
        }
}

static int prepare_dirs(struct daemon *d)
{
        const char *failed = NULL;
        int r = statedir_init(&d->paths, d->cfg->state_directory);
        if (r == 0)
                r = statedir_create(&d->paths, kio_posix(), &failed);
        if (r == 0)
                r = wal_spares_new(kio_posix(), d->paths.wal, DAEMON_WAL_SPARES, &d->spares);
        if (r < 0) {
                fprintf(stderr, "kairosd: cannot create %s: %s\n",
                        failed ? failed : d->cfg->state_directory, strerror(-r));
                return r;
        }
        share_with_group(d);
        const char *fs = NULL;
        if ((r = statedir_sync_mode(d->cfg->state_directory, &d->sync_mode, &fs)) < 0) {
                fprintf(stderr, "kairosd: cannot tell the file system of %s: %s\n",
                        d->cfg->state_directory, strerror(-r));
                return r;
        }
        if (d->sync_mode == STATEDIR_SYNC_FILES)
                log_notice("%s is on %s, where syncfs(2) is no barrier: finished mandates are "
                           "made durable file by file (fdatasync, directory fsync)",
                           d->cfg->state_directory, fs);
        /* WAL spares are renamed with no fsync of wal/: only where such a
         * rename survives a crash whole (docs/design.md §6 rule 1) */
        bool atomic = false;
        const char *why = NULL;
        if ((r = statedir_renames_atomic(d->paths.wal, &atomic, &why)) < 0) {
                fprintf(stderr, "kairosd: cannot tell how %s keeps a rename: %s\n",
                        d->paths.wal, strerror(-r));
                return r;
        }
        if (!atomic) {
                wal_spares_free(d->spares);
                d->spares = NULL;
                if (d->sync_mode == STATEDIR_SYNC_FS)
                        log_notice("%s is on %s, where a rename not synced may not survive a "
                                   "crash whole: every new WAL file is made durable by an "
                                   "fsync of its directory (no spares)",
                                   d->paths.wal, why);
        }
        return 0;
}

int main(int argc, char **argv)
{
        static const struct option opts[] = {
                { "config", required_argument, NULL, 'c' },
                { "state-dir", required_argument, NULL, 's' },
                { "check-config", no_argument, NULL, 'k' },
                { "main-only", no_argument, NULL, 'm' },
                { "init-db", required_argument, NULL, 'I' },
                { "version", no_argument, NULL, 'V' },
                { "help", no_argument, NULL, 'h' },
                { 0 },
        };
        const char *config_path = NULL, *state_dir = NULL, *init_db = NULL;
        bool check = false, explicit_config = false, main_only = false;

        /* Fixed thresholds: a reply buffer of a client (up to the control
         * module's bounds) is mmapped and goes back to the system when it is
         * freed.  glibc would otherwise raise the mmap threshold after the
         * first such free and keep later ones on the heap for good, so a
         * client that made kairosd queue megabytes would leave them behind. */
        mallopt(M_MMAP_THRESHOLD, 128 * 1024);
        mallopt(M_TRIM_THRESHOLD, 1024 * 1024);
        int c;
        while ((c = getopt_long(argc, argv, "c:h", opts, NULL)) != -1) {
                switch (c) {
                case 'c':
                        config_path = optarg;
                        explicit_config = true;
                        break;
                case 's':
                        state_dir = optarg;
                        break;
                case 'k':
                        check = true;
                        break;
                case 'm':
                        main_only = true;
                        break;
                case 'I':
                        init_db = optarg;
                        break;
                case 'V':
                        printf("kairosd %s\n", KAIROS_VERSION);
                        return 0;
                case 'h':
                        usage(stdout);
                        return 0;
                default:
                        fprintf(stderr, "Try 'kairosd --help'.\n");
                        return 64;
                }
        }
        if (optind < argc) {
                fprintf(stderr, "kairosd: unexpected argument '%s'\nTry 'kairosd --help'.\n",
                        argv[optind]);
                return 64;
        }
        if (init_db) {
                if (explicit_config || state_dir || check || main_only) {
                        fprintf(stderr, "kairosd: --init-db goes alone\n"
                                "Try 'kairosd --help'.\n");
                        return 64;
                }
                const struct driver *pg = driver_of(CONFIG_BACKEND_POSTGRES);
                if (!pg) {
                        fprintf(stderr, "kairosd: --init-db: this kairosd was built without "
                                "PostgreSQL support (meson setup -Dpostgres=enabled, with "
                                "libpq-dev)\n");
                        return 1;
                }
                return pg->init_db(init_db);
        }
        if (state_dir && state_dir[0] != '/') {
                fprintf(stderr, "kairosd: --state-dir must be an absolute path: %s\n", state_dir);
                return 64;
        }
        /* --state-dir alone: the built-in configuration. */
        if (!explicit_config && !state_dir)
                config_path = DEFAULT_CONFIG;

        if (canon_init() < 0) {
                fprintf(stderr, "kairosd: libsodium initialisation failed\n");
                return 1;
        }
        if (main_only && !check) {
                fprintf(stderr, "kairosd: --main-only goes with --check-config\n"
                        "Try 'kairosd --help'.\n");
                return 64;
        }
        if (check)
                return check_config(config_path, state_dir, main_only);

        struct daemon dd = { .lock_fd = -1 }, *d = &dd;
        struct config_errors errs = { 0 };
        int r = daemon_load_config(config_path, state_dir, &d->cfg, &errs);
        if (r < 0) {
                for (size_t i = 0; i < errs.n; i++)
                        fprintf(stderr, "%s\n", errs.msgs[i]);
                if (errs.n == 0)
                        fprintf(stderr, "kairosd: %s: %s\n", config_path, strerror(-r));
                config_errors_free(&errs);
                notify_stopping();
                return 1;
        }
        if (config_path)
                d->config_path = strdup(config_path);
        if (state_dir)
                d->state_dir_override = strdup(state_dir);
        log_setup(d->cfg->log_level);
        if (!(d->drv = driver_of(d->cfg->backend))) {
                /* (the configuration refuses it already) */
                log_error("cluster mode cannot start: kairosd was built without PostgreSQL "
                          "support (-Dpostgres=enabled)");
                notify_stopping();
                config_free(d->cfg);
                free(d->config_path);
                free(d->state_dir_override);
                return 1;
        }
        raise_fd_limit();
        d->socket_gid = daemon_lookup_group(d->cfg->socket_group);
        int exit_code = 1;
        if (prepare_dirs(d) < 0 || take_lock(d) < 0) {
                notify_stopping();
                goto out;
        }
        /* Parallel fdatasyncs during recovery; a busy disk should not starve the
         * loop.  (Handlers are started by the runner's own thread with
         * clone(CLONE_VM): the number of pool threads costs nothing there.) */
        setenv("UV_THREADPOOL_SIZE", "16", 0);

        d->loop = uv_default_loop();
        wire_upcalls(d);
        d->started_ms = now_ms_monotonic();
        d->mandates = strmap_new();
        d->jobs = (struct serialq_group){ .drained = daemon_on_jobs_drained, .ctx = d };
        serialq_init(&d->admin_q, d->loop, &d->jobs);
        if (!(d->metrics = metrics_new(d)))
                log_warning("out of memory: no metrics");
        uv_signal_t *sigs[] = { &d->sig_term, &d->sig_int, &d->sig_hup, &d->sig_usr1 };
        int signums[] = { SIGTERM, SIGINT, SIGHUP, SIGUSR1 };
        for (int i = 0; i < 4; i++) {
                uv_signal_init(d->loop, sigs[i]);
                sigs[i]->data = d;
                uv_signal_start(sigs[i], daemon_on_signal, signums[i]);
        }
        uv_timer_init(d->loop, &d->extend_timer);
        d->extend_timer.data = d;
        uv_timer_init(d->loop, &d->stop_timer);
        d->stop_timer.data = d;
        signal(SIGPIPE, SIG_IGN);

        log_event(LOG_INFO, MSGID_STARTED, NULL, 0,
                  "kairosd %s starting: config %s, state directory %s", KAIROS_VERSION,
                  d->config_path ? d->config_path : "built-in", d->cfg->state_directory);
        daemon_log_schedule_problems(d->cfg);
        if (notify_watchdog_start(d->loop, &d->watchdog, loop_healthy, d) < 0)
                log_warning("cannot start the watchdog timer");
        notify_status("recovering");
        notify_extend_timeout(10 * 1000 * 1000);
        uv_timer_start(&d->extend_timer, daemon_on_extend, 5000, 5000);
        /* (executor_init also forks the driver's helpers: the deadman) */
        if ((r = executor_init(d)) < 0 || (r = hooks_init(d)) < 0) {
                log_error("cannot start the process runner: %s", strerror(-r));
                notify_stopping();
                executor_free(d);
                hooks_free(d);
                uv_loop_close(d->loop);
                goto out_free;
        }
        char cerr[512];
        if ((r = d->drv->start(d, cerr, sizeof cerr)) < 0) {
                log_error("cluster mode cannot start: %s", cerr);
                notify_stopping();
                executor_free(d);
                hooks_free(d);
                uv_loop_close(d->loop);
                exit_code = 1;
                goto out_free;
        }
        notify_status_start(d->loop); /* (no start failure past here: daemon_stop stops it) */
        d->opreads = d->drv->opreads;
        d->toolclaims = d->drv->toolclaims;
        if (d->mandates && (r = recover_load_finished(d)) < 0)
                log_warning("cannot read %s: %s", d->paths.mandates, strerror(-r));
        if ((r = idem_service_start(d, start_recovery)) == 0) {
                idem_service_set_step_lookup(d, executor_step_of);
                idem_service_set_tool_groups(d, executor_tool_group);
        }
        if (r < 0) {
                log_error("the idempotency store cannot start: %s", strerror(-r));
                start_recovery(d);
        }

        uv_run(d->loop, UV_RUN_DEFAULT);

        /* Close every handle and let the pool finish what it runs. */
        if (!d->stopping)
                daemon_stop(d, d->exit_code);
        d->drv->stop(d);
        control_stop(d);
        runner_stop(d->runner); /* its thread wakes the loop: joined before the close */
        serialq_stop(d->loop);
        executor_close_runs(d);
        uv_walk(d->loop, close_handle, NULL);
        uv_run(d->loop, UV_RUN_DEFAULT);
        exit_code = d->exit_code;
        log_event(LOG_INFO, MSGID_STOPPING, NULL, 0, "stopped (exit %d)", exit_code);
        uv_loop_close(d->loop);
        executor_free(d);
        hooks_free(d);
        probe_free(d);
        chronos_free(d);
        idem_service_free(d);
        mandates_free(d);
        d->drv->free(d);  /* (its deadman: every handler was reaped, nothing to kill) */
        metrics_free(d->metrics);
        d->metrics = NULL;
out_free: /* (a start that failed half way) */
        if (d->mandates)
                mandates_free(d);
        metrics_free(d->metrics);
out:
        wal_spares_free(d->spares);
        config_free(d->cfg);
        free(d->config_path);
        free(d->state_dir_override);
        statedir_free(&d->paths);
        if (d->lock_fd >= 0)
                close(d->lock_fd);
        return exit_code;
}
