/* SPDX-License-Identifier: MIT */
/* kairosctl recover --dry-run --probe: a step's Probe= run offline, as
 * kairosd runs it (the step's KAIROS_* environment plus KAIROS_PROBE=1, the
 * schedule's Environment= and WorkingDirectory=, the step's document on
 * stdin, ProbeTimeoutSec=, its own process group, killed whole when it
 * ends), judged by the same probe_judge. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "ctl.h"
#include "ctl_probe.h"
#include "kairos/kbuf.h"
#include "kairos/planner.h"
#include "kairos/probeout.h"
#include "kairos/stepdoc.h"

#define KILL_GRACE_MS 5000
#define ERR_TAIL 2048

static int env_add(char ***env, size_t *n, const char *k, const char *v)
{
        if (!v)
                return 0;
        char **e = realloc(*env, (*n + 2) * sizeof(char *));
        if (!e)
                return -ENOMEM;
        *env = e;
        if (asprintf(&e[*n], "%s=%s", k, v) < 0)
                return -ENOMEM;
        e[++*n] = NULL;
        return 0;
}

static char **probe_env(const struct config *cfg, const struct config_schedule *sc,
                        const struct fold *f, const struct fold_plan *p,
                        const struct fold_step *s, int phase, const char *mandate_id,
                        const char *idem_key, const struct ctl_check_call *call)
{
        char attempt[16], cycle[24], self[PATH_MAX], *kairosctl = NULL;
        ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
        if (k > 0) {
                self[k] = '\0';
                kairosctl = self;
        }
        snprintf(attempt, sizeof attempt, "%u", s->executions);
        snprintf(cycle, sizeof cycle, "%lld", p->cycle);
        const char *goal = f->mandate.goal ? f->mandate.goal : f->mandate.schedule;
        const char *kv[][2] = {
                { "PATH", getenv("PATH") ? getenv("PATH") : "/usr/local/bin:/usr/bin:/bin" },
                { "LANG", getenv("LANG") },
                { "HOME", getenv("HOME") },
                { "USER", getenv("USER") },
                { "LOGNAME", getenv("LOGNAME") },
                { "KAIROSCTL", kairosctl },
                { "KAIROS_MANDATE_ID", mandate_id },
                { "KAIROS_PLAN_ID", p->plan_id },
                { "KAIROS_STEP_ID", s->step_id },
                { "KAIROS_PHASE", planner_phase_name((enum planner_phase)phase) },
                { "KAIROS_CYCLE", cycle },
                { "KAIROS_IDEM_KEY", idem_key },
                { "KAIROS_SCHEDULE", f->mandate.schedule },
                { "KAIROS_FIRED_AT", f->mandate.fired_at },
                { "KAIROS_GOAL", goal },
                { "KAIROS_ATTEMPT", attempt },
                { "KAIROS_CONTROL_SOCKET", cfg->control_socket },
                { call ? "KAIROS_CHECK" : "KAIROS_PROBE", "1" },
                { "KAIROS_TOOL", call ? call->tool : NULL },
                { "KAIROS_TOOL_KEY", call ? call->key : NULL },
        };
        char **env = calloc(1, sizeof(char *));
        size_t n = 0;
        int r = env ? 0 : -ENOMEM;
        for (size_t i = 0; r == 0 && i < sizeof kv / sizeof kv[0]; i++)
                r = env_add(&env, &n, kv[i][0], kv[i][1]);
        for (size_t i = 0; r == 0 && i < sc->nenvironment; i++) {
                char *eq = strchr(sc->environment[i], '=');
                char *name = eq ? strndup(sc->environment[i], (size_t)(eq - sc->environment[i]))
                                : NULL;
                r = name ? env_add(&env, &n, name, eq + 1) : -ENOMEM;
                free(name);
        }
        if (r < 0) {
                config_strv_free(env);
                return NULL;
        }
        return env;
}

struct proc {
        pid_t pid;
        int in, out, err;
        const char *doc;
        size_t doc_len, doc_off;
        struct kbuf out_buf;
        bool overflow, timed_out;
        char tail[ERR_TAIL];
        size_t tail_len;
};


/* Feed stdin, read stdout and stderr until both end and the probe exited
 * (then its process group is killed: nothing of it outlives it); SIGTERM
 * the group at the deadline, SIGKILL 5 s later.  *ret_status: waitpid's. */
static void pump(struct proc *p, unsigned timeout_sec, int *ret_status)
{
        int64_t deadline = ctl_mono_ms() + (int64_t)timeout_sec * 1000, kill_at = 0;
        int pidfd = (int)syscall(SYS_pidfd_open, p->pid, 0);
        bool exited = false, killed = false;
        char buf[65536];
        while (p->out >= 0 || p->err >= 0 || !exited) {
                struct pollfd fds[4] = { { p->in, POLLOUT, 0 }, { p->out, POLLIN, 0 },
                                         { p->err, POLLIN, 0 },
                                         { exited ? -1 : pidfd, POLLIN, 0 } };
                int64_t now = ctl_mono_ms(), until = kill_at ? kill_at : deadline;
                if (now >= until) {
                        if (killed)
                                break; /* its output is held by something outside */
                        if (!kill_at) {
                                p->timed_out = true;
                                kill(-p->pid, SIGTERM);
                                kill_at = now + KILL_GRACE_MS;
                        } else {
                                kill(-p->pid, SIGKILL);
                                killed = true;
                                kill_at = now + KILL_GRACE_MS;
                        }
                        continue;
                }
                int64_t wait = until - now;
                if (pidfd < 0 && !exited && wait > 50)
                        wait = 50; /* no pidfd (an old kernel): look at the probe often */
                int k = poll(fds, 4, (int)wait);
                if (k < 0 && errno != EINTR)
                        break;
                if (!exited && waitpid(p->pid, ret_status, WNOHANG) == p->pid) {
                        exited = true;
                        kill(-p->pid, SIGKILL); /* what is left of its group */
                }
                if (k <= 0)
                        continue;
                if (p->in >= 0 && fds[0].revents) {
                        ssize_t w = write(p->in, p->doc + p->doc_off, p->doc_len - p->doc_off);
                        if (w > 0)
                                p->doc_off += (size_t)w;
                        if (w < 0 || p->doc_off == p->doc_len) {
                                close(p->in);
                                p->in = -1;
                        }
                }
                for (int i = 1; i < 3; i++) {
                        int *fd = i == 1 ? &p->out : &p->err;
                        if (*fd < 0 || !fds[i].revents)
                                continue;
                        ssize_t n = read(*fd, buf, sizeof buf);
                        if (n < 0 && errno == EINTR)
                                continue;
                        if (n <= 0) {
                                close(*fd);
                                *fd = -1;
                        } else if (i == 2) {
                                probe_tail_keep(p->tail, ERR_TAIL, &p->tail_len, buf, (size_t)n);
                        } else if (!p->overflow &&
                                   (p->out_buf.len + (size_t)n > PROBE_STDOUT_MAX ||
                                    kbuf_append(&p->out_buf, buf, (size_t)n) < 0)) {
                                p->overflow = true;
                                kill(-p->pid, SIGKILL);
                        }
                }
        }
        if (!exited) {
                kill(-p->pid, SIGKILL);
                while (waitpid(p->pid, ret_status, 0) < 0 && errno == EINTR)
                        ;
        }
        int *ends[] = { &p->in, &p->out, &p->err };
        for (size_t i = 0; i < 3; i++)
                if (*ends[i] >= 0) {
                        close(*ends[i]);
                        *ends[i] = -1;
                }
        if (pidfd >= 0)
                close(pidfd);
}

/* Start argv in its own process group with stdin/stdout/stderr on pipes. */
static int start(char **argv, char **env, const char *cwd, struct proc *p, char *why,
                 size_t whylen)
{
        int fds[4][2] = { { -1, -1 }, { -1, -1 }, { -1, -1 }, { -1, -1 } };
        int *pin = fds[0], *pout = fds[1], *perr = fds[2], *pst = fds[3];
        pid_t pid = -1;
        for (int i = 0; i < 4; i++)
                if (pipe2(fds[i], O_CLOEXEC) < 0)
                        goto fail;
        pid = fork();
        if (pid < 0)
                goto fail;
        if (pid == 0) {
                setpgid(0, 0);
                signal(SIGPIPE, SIG_DFL);
                dup2(pin[0], 0);
                dup2(pout[1], 1);
                dup2(perr[1], 2);
                int e = 0;
                const char *stage = "chdir";
                if (chdir(cwd) == 0) {
                        stage = "execute";
                        execvpe(argv[0], argv, env);
                }
                e = errno;
                char msg[256];
                int n = snprintf(msg, sizeof msg, "%s: %s", stage, strerror(e));
                (void)!write(pst[1], msg, (size_t)n);
                _exit(127);
        }
        setpgid(pid, pid);
        close(pin[0]);
        close(pout[1]);
        close(perr[1]);
        close(pst[1]);
        ssize_t n = read(pst[0], why, whylen - 1);
        why[n > 0 ? n : 0] = '\0';
        close(pst[0]);
        p->pid = pid;
        p->in = pin[1];
        p->out = pout[0];
        p->err = perr[0];
        fcntl(p->in, F_SETFL, O_NONBLOCK);
        return 0;
fail:;
        int e = -errno;
        for (int i = 0; i < 4; i++)
                for (int k = 0; k < 2; k++)
                        if (fds[i][k] >= 0)
                                close(fds[i][k]);
        return e;
}

/* The check's argv (words of "cmd") and its stdin {"tool","key","argv"}
 * (replacing doc), as kairosd gives them. */
static int check_argv(const struct ctl_check_call *call, char ***ret_argv, struct kbuf *doc)
{
        json_t *chk = json_loads(call->check, 0, NULL);
        json_t *cmd = json_object_get(chk, "cmd");
        const char *colon = strchr(call->key, ':');
        size_t n = json_array_size(cmd);
        char **argv = n ? calloc(n + 1, sizeof(*argv)) : NULL;
        int r = argv ? 0 : chk && !n ? -EINVAL : -ENOMEM;
        for (size_t i = 0; r == 0 && i < n; i++) {
                const char *w = json_string_value(json_array_get(cmd, i));
                if (!w || !(argv[i] = strdup(w)))
                        r = w ? -ENOMEM : -EINVAL;
        }
        json_t *in = r == 0 ? json_pack("{s:s, s:s, s:O}", "tool", call->tool, "key",
                                        colon ? colon + 1 : call->key, "argv",
                                        json_object_get(chk, "argv"))
                            : NULL;
        char *text = in ? json_dumps(in, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (r == 0 && !text)
                r = -ENOMEM;
        if (r == 0) {
                doc->len = 0;
                r = kbuf_puts(doc, text);
        }
        free(text);
        json_decref(in);
        json_decref(chk);
        if (r < 0) {
                config_strv_free(argv);
                return r;
        }
        *ret_argv = argv;
        return 0;
}

int ctl_probe_run(const struct config *cfg, const struct config_schedule *sc,
                  const struct fold *f, const char *step_id, const struct ctl_check_call *call,
                  struct probe_word *ret)
{
        const struct fold_step *s = fold_find_step(f, step_id);
        if (!s || s->plan >= f->nplans || (!call && !sc->probe))
                return -ENOENT;
        const struct fold_plan *p = &f->plans[s->plan];
        size_t idx = 0;
        while (idx < p->nsteps && &f->steps[p->steps[idx]] != s)
                idx++;
        if (idx == p->nsteps)
                return -ENOENT;
        const char *mandate_id = f->mandate.mandate_id ? f->mandate.mandate_id : p->mandate_id;
        char *idem_key = NULL;
        if (asprintf(&idem_key, "%s/%s", mandate_id ? mandate_id : "", step_id) < 0)
                return -ENOMEM;
        struct stepdoc_input in = { .mandate_id = mandate_id, .schedule = f->mandate.schedule,
                                    .fired_at = f->mandate.fired_at, .goal = f->mandate.goal,
                                    .max_cycles = sc->max_cycles, .attempt = s->executions,
                                    .idem_key = idem_key };
        struct kbuf doc = KBUF_INIT;
        char **argv = NULL, **env = NULL;
        size_t argc = 0;
        struct proc pr = { .pid = -1, .in = -1, .out = -1, .err = -1 };
        char why[256] = "";
        int r = stepdoc_build(f, p, idx, &in, &doc);
        if (r == 0 && !(env = probe_env(cfg, sc, f, p, s, (int)idx, mandate_id, idem_key,
                                        call)))
                r = -ENOMEM;
        if (r == 0 && call) {
                /* the call's check: its words as given, its stdin the call */
                r = check_argv(call, &argv, &doc);
        } else if (r == 0 && (r = config_expand_command(sc->probe, env, &argv, &argc, NULL,
                                                        0)) == 0 &&
                   (argc == 0 || !argv[0][0])) {
                /* its $NAME and ${NAME} expand from its environment, as in kairosd */
                r = -EINVAL;
        }
        /* a probe that does not read its stdin must not kill kairosctl */
        void (*old_pipe)(int) = signal(SIGPIPE, SIG_IGN);
        if (r == 0) {
                const char *cwd = sc->working_directory ? sc->working_directory
                                                        : cfg->state_directory;
                r = start(argv, env, cwd, &pr, why, sizeof why);
        }
        struct probe_run run = { .timeout_sec = (unsigned)sc->probe_timeout_sec };
        if (r == 0 && why[0]) {
                run.start_error = why;
                close(pr.in);
                close(pr.out);
                close(pr.err);
        }
        int status = 0;
        if (r == 0 && why[0]) {
                while (waitpid(pr.pid, &status, 0) < 0 && errno == EINTR)
                        ;
        } else if (r == 0) {
                pr.doc = doc.data;
                pr.doc_len = doc.len;
                pump(&pr, run.timeout_sec, &status);
        }
        if (r == 0) {
                run.out = pr.out_buf.data;
                run.out_len = pr.out_buf.len;
                run.out_overflow = pr.overflow;
                run.err = pr.tail;
                run.err_len = pr.tail_len;
                run.timed_out = pr.timed_out;
                run.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
                run.term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
                r = probe_judge(&run, ret);
        }
        signal(SIGPIPE, old_pipe);
        kbuf_free(&pr.out_buf);
        kbuf_free(&doc);
        config_strv_free(argv);
        config_strv_free(env);
        free(idem_key);
        return r;
}
