/* SPDX-License-Identifier: MIT */
/* kairosctl tool run / tool write / idem stats|get|forget: the idempotency
 * store of kairosd (docs/design.md §11).
 *
 * tool run --key K [--tool NAME] [--check CHECK] -- CMD ARGS...
 *   claims "NAME:K" from the daemon (tool-begin) on a connection that stays
 *   open while CMD runs: the daemon answers "proceed" only once the claim is
 *   durable; a connection that closes before tool-finish leaves the key
 *   interrupted.  CMD runs here with our stdin; its stdout and stderr are
 *   passed through and captured; tool-finish reports the exit status and
 *   both streams (base64), and is answered once that record is durable.  A
 *   duplicate replays the cached exit status, stdout and stderr byte for
 *   byte without running CMD.  --check CHECK (split like a command line of
 *   kairos.schedule(5), nothing expanded) goes with the claim: recovery runs
 *   it for a call a crash cut off (docs/design.md §8).
 * tool write --key K PATH
 *   stdin → PATH, written atomically by the daemon (within WriteRoots=,
 *   following no symbolic link below a root), once per key; a write that
 *   failed before the file was replaced is not kept under its key.  stdin
 *   streams to the daemon in parts, up to its MaxWriteBytes=. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "kairos/config.h"
#include "kairos/kbuf.h"

/* The control socket takes requests up to 1 MiB: stdout + stderr of a run
 * are kept up to this many bytes, which fit base64-encoded in one
 * request. */
#define CTL_TOOL_CAPTURE_MAX (700u * 1024)
#define CTL_TOOL_DEFAULT "cmd"

/* ---- helpers ---------------------------------------------------------- */

/* Exactly one argument (what) after the options: 0, or the usage error. */
static int want_one(const char *cmd, int npos, const char *what)
{
        if (npos == 1)
                return 0;
        return ctl_usage_error(npos ? "%s: expected only %s" : "%s: missing %s", cmd, what);
}

static json_t *b64_json(const void *data, size_t len)
{
        size_t n = sodium_base64_ENCODED_LEN(len, sodium_base64_VARIANT_ORIGINAL);
        char *buf = malloc(n);
        json_t *v;

        if (!buf)
                return NULL;
        sodium_bin2base64(buf, n, data, len, sodium_base64_VARIANT_ORIGINAL);
        v = json_string(buf);
        free(buf);
        return v;
}

/* Decode a base64 string member (absent: empty).  -EINVAL when malformed. */
static int b64_member(json_t *obj, const char *name, unsigned char **out, size_t *len)
{
        const char *s = json_string_value(json_object_get(obj, name));
        size_t n = s ? strlen(s) : 0;

        *out = malloc(n / 4 * 3 + 3);
        *len = 0;
        if (!*out)
                return -ENOMEM;
        if (n && sodium_base642bin(*out, n / 4 * 3 + 3, s, n, NULL, len, NULL,
                                   sodium_base64_VARIANT_ORIGINAL) != 0) {
                free(*out);
                *out = NULL;
                return -EINVAL;
        }
        return 0;
}

static const char *jstr(json_t *obj, const char *key)
{
        return json_string_value(json_object_get(obj, key));
}

/* The key: --key, else $KAIROS_IDEM_KEY (what kairosd gives a handler). */
static const char *pick_key(const char *key)
{
        const char *env;

        if (key)
                return key;
        env = getenv("KAIROS_IDEM_KEY");
        return env && *env ? env : NULL;
}

/* A key such as "$KAIROS_IDEM_KEY" that no shell or kairosd expanded: every
 * run of every step would share it, and all but the first would be answered
 * from the store without running.  The usage error's status, or 0. */
static int refuse_unexpanded_key(const char *cmd, const char *key)
{
        if (key[0] != '$' && !strstr(key, "${"))
                return 0;
        fprintf(stderr, "kairosctl: %s: the key \"", cmd);
        ctl_put_safe(stderr, key);
        fputs("\" holds a variable that nothing expanded: every run would share it (in an Exec "
              "line write $KAIROS_IDEM_KEY as a word of its own or ${KAIROS_IDEM_KEY}, which "
              "kairosd expands; in a shell script \"$KAIROS_IDEM_KEY\"; or leave --key out) "
              "(see kairosctl --help)\n", stderr);
        return CTL_EXIT_USAGE;
}

/* In cluster mode kairosd gives a handler the epoch its node holds the
 * mandate at (KAIROS_EPOCH); tool run and tool write pass it on, and kairosd
 * refuses ("fenced") a call whose mandate is at another epoch, or no longer
 * on that node.  Sets args.epoch; 0, or a usage error's exit status for a
 * KAIROS_EPOCH that is not a positive integer (args freed then; args NULL:
 * out of memory). */
static int add_epoch(json_t *args)
{
        const char *env = getenv("KAIROS_EPOCH");
        int status = 0;
        if (!args)
                return ctl_error(CTL_EXIT_OSERR, "out of memory");
        if (!env || !*env)
                return 0;
        char *end;
        errno = 0;
        long long v = strtoll(env, &end, 10);
        if (errno || *end || v < 1 || env[0] < '0' || env[0] > '9')
                status = ctl_usage_error("KAIROS_EPOCH: not a positive integer: '%s'", env);
        else if (json_object_set_new(args, "epoch", json_integer(v)) < 0)
                status = ctl_error(CTL_EXIT_OSERR, "out of memory");
        if (status)
                json_decref(args);
        return status;
}

/* The daemon said no to a claim: in_progress / interrupted / store_full →
 * 75 (try again later, or an operator must look), mismatch → 65, fenced
 * (cluster mode: the mandate is at another epoch, or no longer this node's)
 * and anything else → 1.  The message is the daemon's; for interrupted it names what to
 * do.  With --json the error object is printed on stdout too. */
static int claim_refused(const struct ctl_opts *o, json_t *error)
{
        const char *code = jstr(error, "code");
        int status;

        if (!code)
                code = "";
        if (strcmp(code, "in_progress") == 0 || strcmp(code, "interrupted") == 0 ||
            strcmp(code, "store_full") == 0)
                status = CTL_EXIT_TEMPFAIL;
        else if (strcmp(code, "mismatch") == 0)
                status = CTL_EXIT_DATAERR;
        else if (strcmp(code, "fenced") == 0)
                status = CTL_EXIT_REFUSED;
        else
                return ctl_print_refusal(o, error);
        fprintf(stderr, "kairosctl: %s: ", code);
        ctl_put_safe(stderr, jstr(error, "message"));
        fputc('\n', stderr);
        if (o->json && ctl_json_print(json_incref(error)) != 0)
                return CTL_EXIT_IOERR;
        return status;
}

/* ---- tool run: the child ------------------------------------------------ */

struct capture {
        struct kbuf out, err;
        size_t total;           /* bytes seen on both streams */
        bool too_large;
        bool pass;              /* pass through to our stdout/stderr */
};

static void take(struct capture *cap, struct kbuf *b, int fd_out, const char *data, size_t n)
{
        cap->total += n;
        if (cap->pass)
                (void)ctl_write_all(fd_out, data, n); /* a closed stdout is not the tool's fault */
        if (cap->too_large)
                return;
        if (cap->out.len + cap->err.len + n > CTL_TOOL_CAPTURE_MAX || kbuf_append(b, data, n) < 0) {
                cap->too_large = true;
                kbuf_free(&cap->out);
                kbuf_free(&cap->err);
        }
}

/* Run argv with our stdin; stdout/stderr captured (and passed through).
 * Returns 0 with *wstatus, or the errno of a failed exec as a positive
 * number in *exec_errno (then *wstatus is meaningless), or -errno. */
static int run_child(char **argv, struct capture *cap, int *wstatus, int *exec_errno)
{
        int out[2] = { -1, -1 }, err[2] = { -1, -1 }, ex[2] = { -1, -1 };
        int r = 0;
        pid_t pid;

        *exec_errno = 0;
        if (pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0 || pipe2(ex, O_CLOEXEC) < 0) {
                r = -errno;
                goto out;
        }
        fflush(stdout);
        fflush(stderr);
        pid = fork();
        if (pid < 0) {
                r = -errno;
                goto out;
        }
        if (pid == 0) {
                signal(SIGPIPE, SIG_DFL);
                if (dup2(out[1], STDOUT_FILENO) < 0 || dup2(err[1], STDERR_FILENO) < 0)
                        _exit(127);
                execvp(argv[0], argv);
                int e = errno;
                (void)!write(ex[1], &e, sizeof e);
                _exit(127);
        }
        close(out[1]);
        close(err[1]);
        close(ex[1]);
        out[1] = err[1] = ex[1] = -1;

        struct pollfd p[2] = { { .fd = out[0], .events = POLLIN },
                               { .fd = err[0], .events = POLLIN } };
        char buf[65536];
        while (p[0].fd >= 0 || p[1].fd >= 0) {
                if (poll(p, 2, -1) < 0) {
                        if (errno == EINTR)
                                continue;
                        r = -errno;
                        break;
                }
                for (int i = 0; i < 2; i++) {
                        if (p[i].fd < 0 || !p[i].revents)
                                continue;
                        ssize_t n = read(p[i].fd, buf, sizeof buf);
                        if (n < 0 && errno == EINTR)
                                continue;
                        if (n <= 0) {
                                close(p[i].fd);
                                if (i == 0)
                                        out[0] = -1;
                                else
                                        err[0] = -1;
                                p[i].fd = -1;
                                continue;
                        }
                        take(cap, i == 0 ? &cap->out : &cap->err,
                             i == 0 ? STDOUT_FILENO : STDERR_FILENO, buf, (size_t)n);
                }
        }
        while (waitpid(pid, wstatus, 0) < 0) {
                if (errno != EINTR) {
                        if (r == 0)
                                r = -errno;
                        break;
                }
        }
        int e = 0;
        ssize_t n;
        while ((n = read(ex[0], &e, sizeof e)) < 0 && errno == EINTR)
                ;
        if (n == (ssize_t)sizeof e)
                *exec_errno = e;
out:
        for (int i = 0; i < 2; i++) {
                if (out[i] >= 0)
                        close(out[i]);
                if (err[i] >= 0)
                        close(err[i]);
                if (ex[i] >= 0)
                        close(ex[i]);
        }
        return r;
}

/* ---- tool run: outliving kairosd (docs/design.md §10) ------------------ */

/* How long past ToolGraceSec= a call whose kairosd died keeps its result
 * waiting for a kairosd to answer again. */
#define CTL_TOOL_LATE_MARGIN_SEC 60
/* The wait between two tries: doubled from the first, up to the last. */
#define CTL_TOOL_LATE_FIRST_MS 100
#define CTL_TOOL_LATE_MAX_MS 2000

static void nap_ms(int64_t ms)
{
        struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000 };
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
}

/* Does a kairosd accept connections on path?  Quietly. */
static bool socket_answers(const char *path)
{
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        if (strlen(path) >= sizeof sa.sun_path)
                return false;
        strcpy(sa.sun_path, path);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return false;
        bool ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
        close(fd);
        return ok;
}

/* A handler that is kairosctl itself leads its handler's process group and
 * cannot leave it: the call runs in a child of ours, which can, while we
 * wait for it and exit as it did.  Returns -1 in the child (go on), else the
 * exit status to end with. */
static int fork_for_own_group(void)
{
        if (getpgrp() != getpid() || !getenv("KAIROS_MANDATE_ID"))
                return -1;
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid < 0)
                return -1; /* then in the handler's group, as before */
        if (pid == 0)
                return -1;
        int ws;
        while (waitpid(pid, &ws, 0) < 0)
                if (errno != EINTR)
                        return CTL_EXIT_OSERR;
        return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

/* The kairosd that answered tool-begin is gone (its connection broke before
 * tool-finish was answered): keep the result, try the socket again and
 * again until a kairosd answers there, then finish the call there as a late
 * one (it completes the claim that the new kairosd loaded as interrupted).
 * At most grace_sec + CTL_TOOL_LATE_MARGIN_SEC.  The exit status of CMD, or
 * 75 when no kairosd took the result. */
static int finish_late(const struct ctl_opts *o, const char *full, const char *fp, json_t *fin,
                       int exit_status, json_int_t grace_sec)
{
        const char *path = ctl_socket_path(o);
        int64_t deadline = ctl_mono_ms() + ((int64_t)grace_sec + CTL_TOOL_LATE_MARGIN_SEC) * 1000;
        int64_t wait = CTL_TOOL_LATE_FIRST_MS;
        fputs("kairosctl: ", stderr);
        ctl_put_safe(stderr, full);
        fprintf(stderr, ": kairosd went away while the command ran (exit status %d); keeping its "
                "result for a kairosd to answer on ", exit_status);
        ctl_put_safe(stderr, path);
        fprintf(stderr, " (up to %lld s)\n",
                (long long)grace_sec + CTL_TOOL_LATE_MARGIN_SEC);
        json_object_set_new(fin, "late", json_true());
        json_object_set_new(fin, "fingerprint", json_string(fp));
        while (ctl_mono_ms() < deadline) {
                if (!socket_answers(path)) {
                        nap_ms(wait);
                        wait = wait * 2 > CTL_TOOL_LATE_MAX_MS ? CTL_TOOL_LATE_MAX_MS : wait * 2;
                        continue;
                }
                struct ctl_session *s = NULL;
                json_t *res = NULL, *err = NULL;
                int status = ctl_session_open(o, &s);
                if (status == CTL_EXIT_OK)
                        status = ctl_session_call(s, "tool-finish", json_incref(fin), &res, &err);
                ctl_session_close(s);
                const char *code = jstr(err, "code");
                if (status == CTL_EXIT_OK) {
                        json_decref(res);
                        fputs("kairosctl: ", stderr);
                        ctl_put_safe(stderr, full);
                        fputs(": result recorded by the kairosd started again\n", stderr);
                        return exit_status;
                }
                bool again = status == CTL_EXIT_UNREACHABLE ||
                             (status == CTL_EXIT_REFUSED && code &&
                              strcmp(code, "unavailable") == 0);
                if (!again) {
                        fputs("kairosctl: ", stderr);
                        ctl_put_safe(stderr, full);
                        fputs(": the kairosd started again did not take the result: ", stderr);
                        ctl_put_safe(stderr, jstr(err, "message"));
                        fputc('\n', stderr);
                        json_decref(err);
                        return CTL_EXIT_TEMPFAIL;
                }
                json_decref(err);
                nap_ms(wait);
                wait = wait * 2 > CTL_TOOL_LATE_MAX_MS ? CTL_TOOL_LATE_MAX_MS : wait * 2;
        }
        fputs("kairosctl: ", stderr);
        ctl_put_safe(stderr, full);
        fprintf(stderr, ": no kairosd answered on the socket within %lld s: the result is lost, "
                "the call stays interrupted (see kairosctl idem get)\n",
                (long long)grace_sec + CTL_TOOL_LATE_MARGIN_SEC);
        return CTL_EXIT_TEMPFAIL;
}

/* ---- tool run --------------------------------------------------------- */

/* Replay a finished entry: its stdout and stderr byte for byte, then its
 * exit status.  A cached failure also says so on stderr. */
static int replay(const struct ctl_opts *o, json_t *res)
{
        unsigned char *out = NULL, *err = NULL;
        size_t nout = 0, nerr = 0;
        json_t *st = json_object_get(res, "exit_status");
        bool failed = strcmp(jstr(res, "outcome") ? jstr(res, "outcome") : "", "failed") == 0;
        int status = json_is_integer(st) ? (int)json_integer_value(st) : 1;

        if (status < 0 || status > 255)
                status = 1;
        if (o->json)
                return ctl_json_print(json_incref(res)) ? CTL_EXIT_IOERR : status;
        if (b64_member(res, "stdout", &out, &nout) < 0 ||
            b64_member(res, "stderr", &err, &nerr) < 0) {
                free(out);
                return ctl_error(CTL_EXIT_UNREACHABLE, "the cached output of %s is not base64",
                                 jstr(res, "key"));
        }
        fflush(stdout);
        (void)ctl_write_all(STDOUT_FILENO, out, nout);
        (void)ctl_write_all(STDERR_FILENO, err, nerr);
        free(out);
        free(err);
        if (failed) {
                fputs("kairosctl: ", stderr);
                ctl_put_safe(stderr, jstr(res, "key"));
                fputs(": cached error from the first run (", stderr);
                ctl_put_safe(stderr, jstr(res, "error_class"));
                fputs("): ", stderr);
                ctl_put_safe(stderr, jstr(res, "error_msg"));
                fputc('\n', stderr);
        }
        return status;
}

/* {"argv":[...]}: each word a string, or {"b64":...} if not UTF-8. */
static json_t *argv_input(int argc, char **argv)
{
        json_t *list = json_array();

        for (int i = 0; list && i < argc; i++) {
                json_t *w = json_string(argv[i]);
                if (!w)
                        w = json_pack("{s:o}", "b64", b64_json(argv[i], strlen(argv[i])));
                if (!w || json_array_append_new(list, w) < 0) {
                        json_decref(list);
                        return NULL;
                }
        }
        return list ? json_pack("{s:o}", "argv", list) : NULL;
}

/* --check CHECK: split like a command line of kairos.schedule(5), without
 * expanding $NAME (config_split_command), into *ret (a JSON array of the
 * words); 0, or a usage error's exit status. */
static int check_words(const char *check, json_t **ret)
{
        char **words = NULL;
        size_t n = 0;
        *ret = NULL;
        int r = config_split_command(check, &words, &n);
        if (r == -ENOMEM)
                return ctl_error(CTL_EXIT_OSERR, "out of memory");
        if (r < 0 || n == 0) {
                config_strv_free(words);
                return ctl_usage_error("tool run: --check: %s (a command line such as "
                                       "--check 'my-check --for \"$KEY\"', quoted as in "
                                       "kairos.schedule(5), $NAME not expanded)",
                                       r < 0 ? "an unbalanced quote or a trailing backslash"
                                             : "empty");
        }
        json_t *list = json_array();
        for (size_t k = 0; list && k < n; k++) {
                json_t *w = json_string(words[k]);
                if (!w) {
                        config_strv_free(words);
                        json_decref(list);
                        return ctl_usage_error("tool run: --check: word %zu is not UTF-8",
                                               k + 1);
                }
                if (json_array_append_new(list, w) < 0) {
                        json_decref(list);
                        list = NULL;
                }
        }
        config_strv_free(words);
        if (!list)
                return ctl_error(CTL_EXIT_OSERR, "out of memory");
        *ret = list;
        return 0;
}

static json_t *finish_args(const char *key, const struct capture *cap, int wstatus,
                           int exec_errno, const char *prog, int *exit_status)
{
        json_t *a = json_pack("{s:s}", "key", key);
        char msg[512];

        if (!a)
                return NULL;
        if (exec_errno) {
                *exit_status = 127;
                snprintf(msg, sizeof msg, "cannot execute '%s': %s", prog, strerror(exec_errno));
                json_object_set_new(a, "error_class", json_string("exec_failed"));
                json_object_set_new(a, "error_msg", json_string(msg));
        } else if (WIFSIGNALED(wstatus)) {
                int sig = WTERMSIG(wstatus);
                *exit_status = 128 + sig;
                snprintf(msg, sizeof msg, "killed by signal %d (SIG%s)", sig,
                         sigabbrev_np(sig) ? sigabbrev_np(sig) : "?");
                json_object_set_new(a, "error_class", json_string("signal"));
                json_object_set_new(a, "error_msg", json_string(msg));
        } else {
                *exit_status = WEXITSTATUS(wstatus);
        }
        if (cap->too_large && !exec_errno) {
                snprintf(msg, sizeof msg,
                         "stdout and stderr were %zu bytes, more than the %u that are kept; "
                         "the exit status was %d",
                         cap->total, CTL_TOOL_CAPTURE_MAX, *exit_status);
                json_object_set_new(a, "error_class", json_string("output_too_large"));
                json_object_set_new(a, "error_msg", json_string(msg));
        }
        json_object_set_new(a, "exit_status", json_integer(*exit_status));
        json_object_set_new(a, "stdout", b64_json(cap->out.data ? cap->out.data : "",
                                                  cap->out.len));
        json_object_set_new(a, "stderr", b64_json(cap->err.data ? cap->err.data : "",
                                                  cap->err.len));
        return a;
}

int ctl_cmd_tool_run(const struct ctl_opts *o, int argc, char **argv)
{
        const char *key = NULL, *tool = CTL_TOOL_DEFAULT, *check = NULL;
        struct ctl_session *s = NULL;
        json_t *res = NULL, *err = NULL, *fin = NULL;
        struct capture cap = { .out = KBUF_INIT, .err = KBUF_INIT, .pass = !o->json };
        char *full = NULL, *fp = NULL;
        int i, status;

        /* Options up to "--" or the first word of CMD. */
        for (i = 0; i < argc; i++) {
                const char *a = argv[i];
                if (strcmp(a, "--") == 0) {
                        i++;
                        break;
                }
                if (a[0] != '-')
                        break;
                const char **dst = NULL;
                const char *name = NULL;
                if (strncmp(a, "--key", 5) == 0 && (a[5] == '\0' || a[5] == '='))
                        dst = &key, name = "key";
                else if (strncmp(a, "--tool", 6) == 0 && (a[6] == '\0' || a[6] == '='))
                        dst = &tool, name = "tool";
                else if (strncmp(a, "--check", 7) == 0 && (a[7] == '\0' || a[7] == '='))
                        dst = &check, name = "check";
                else
                        return ctl_usage_error("tool run: unknown option '%s' (put CMD after "
                                               "--)",
                                               a);
                const char *eq = strchr(a, '=');
                if (eq) {
                        *dst = eq + 1;
                } else {
                        if (i + 1 >= argc)
                                return ctl_usage_error("tool run: option '--%s' needs a value",
                                                       name);
                        *dst = argv[++i];
                }
        }
        key = pick_key(key);
        if (!key)
                return ctl_usage_error("tool run needs --key K (or $KAIROS_IDEM_KEY)");
        if (!*key || !*tool)
                return ctl_usage_error("tool run: --key and --tool must not be empty");
        if ((status = refuse_unexpanded_key("tool run", key)))
                return status;
        if (i >= argc)
                return ctl_usage_error("tool run: missing CMD (tool run --key K -- CMD ARGS...)");
        char **cmd = argv + i;
        int ncmd = argc - i;
        json_t *check_json = NULL;
        if (check && (status = check_words(check, &check_json)))
                return status;

        /* (before anything is sent: the child is the caller) */
        if ((status = fork_for_own_group()) >= 0) {
                json_decref(check_json);
                return status;
        }
        json_t *input = argv_input(ncmd, cmd);
        if (!input) {
                json_decref(check_json);
                return ctl_error(CTL_EXIT_OSERR, "out of memory");
        }
        json_t *begin = json_pack("{s:s, s:s, s:o}", "tool", tool, "key", key, "input", input);
        if (begin && check_json &&
            json_object_set_new(begin, "check", json_pack("{s:o}", "cmd", check_json)) < 0) {
                json_decref(begin);
                begin = NULL;
        }
        if ((status = add_epoch(begin)))
                return status;
        status = ctl_session_open(o, &s);
        if (status != CTL_EXIT_OK) {
                json_decref(begin);
                return status;
        }
        status = ctl_session_call(s, "tool-begin", begin, &res, &err);
        if (status == CTL_EXIT_REFUSED) {
                status = claim_refused(o, err);
                goto out;
        }
        if (status != CTL_EXIT_OK)
                goto out;
        const char *outcome = jstr(res, "outcome");
        if (!outcome || strcmp(outcome, "proceed") != 0) {
                status = replay(o, res);
                goto out;
        }
        full = jstr(res, "key") ? strdup(jstr(res, "key")) : NULL;
        if (!full) {
                status = ctl_error(CTL_EXIT_UNREACHABLE, "tool-begin: the reply has no key");
                goto out;
        }
        /* kairosd registered our process id as a group of this step's: lead
         * it, and the call outlives a kairosd that dies (the keeper kills the
         * handler's group, not ours; kairosd kills ours with the handler's) */
        bool own_group = json_is_true(json_object_get(res, "own_group")) && setpgid(0, 0) == 0;
        json_int_t grace_sec = json_integer_value(json_object_get(res, "grace_sec"));
        fp = jstr(res, "fingerprint") ? strdup(jstr(res, "fingerprint")) : NULL;

        int wstatus = 0, exec_errno = 0, exit_status = 0;
        signal(SIGPIPE, SIG_IGN);
        int r = run_child(cmd, &cap, &wstatus, &exec_errno);
        if (r < 0) {
                /* Nothing ran: leave the key to the daemon (our connection
                 * closes, the claim becomes interrupted). */
                status = ctl_errno_error("running CMD", r);
                goto out;
        }
        if (exec_errno) {
                fputs("kairosctl: cannot execute '", stderr);
                ctl_put_safe(stderr, cmd[0]);
                fprintf(stderr, "': %s\n", strerror(exec_errno));
        }
        fin = finish_args(full, &cap, wstatus, exec_errno, cmd[0], &exit_status);
        if (!fin) {
                status = ctl_error(CTL_EXIT_OSERR, "out of memory");
                goto out;
        }
        json_decref(res);
        res = NULL;
        status = ctl_session_call(s, "tool-finish", json_incref(fin), &res, &err);
        if (status == CTL_EXIT_UNREACHABLE && own_group && fp) {
                status = finish_late(o, full, fp, fin, exit_status, grace_sec);
                goto out;
        }
        if (status == CTL_EXIT_REFUSED) {
                fputs("kairosctl: ", stderr);
                ctl_put_safe(stderr, full);
                fputs(": the result could not be recorded: ", stderr);
                ctl_put_safe(stderr, jstr(err, "message"));
                fputc('\n', stderr);
                if (o->json)
                        ctl_json_print(json_incref(err));
                goto out;
        }
        if (status != CTL_EXIT_OK)
                goto out;
        if (o->json) {
                json_object_set_new(fin, "outcome", json_string(jstr(res, "outcome")
                                                                         ? jstr(res, "outcome")
                                                                         : "completed"));
                json_object_set_new(fin, "cached", json_false());
                if (ctl_json_print(json_incref(fin)) != 0) {
                        status = CTL_EXIT_IOERR;
                        goto out;
                }
        } else if (cap.too_large) {
                fputs("kairosctl: ", stderr);
                ctl_put_safe(stderr, full);
                fprintf(stderr,
                        ": the output (%zu bytes) is too large to keep: a duplicate gets "
                        "the exit status only\n",
                        cap.total);
        }
        status = exit_status;
out:
        free(full);
        free(fp);
        kbuf_free(&cap.out);
        kbuf_free(&cap.err);
        json_decref(fin);
        json_decref(res);
        json_decref(err);
        ctl_session_close(s);
        return status;
}

/* ---- tool write ------------------------------------------------------- */

/* On stderr: a handler's stdout is its step's result, which this line
 * would turn into text (kairosctl(1)). */
static void text_write(json_t *r)
{
        fprintf(stderr, "kairosctl: wrote %lld bytes to ",
                (long long)json_integer_value(json_object_get(r, "bytes")));
        ctl_put_safe(stderr, jstr(r, "path"));
        if (json_is_true(json_object_get(r, "cached"))) {
                fputs(" (key ", stderr);
                ctl_put_safe(stderr, jstr(r, "key"));
                fputs(" was done before: not written again)", stderr);
        }
        fputc('\n', stderr);
}

/* stdin as it comes, in parts that fit one request base64-encoded. */
#define CTL_WRITE_PART (512u * 1024)

/* Up to len bytes of stdin (fewer only at its end): the count, or -errno. */
static ssize_t read_part(unsigned char *buf, size_t len)
{
        size_t got = 0;
        while (got < len) {
                ssize_t n = read(STDIN_FILENO, buf + got, len - got);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return -errno;
                if (n == 0)
                        break;
                got += (size_t)n;
        }
        return (ssize_t)got;
}

/* A request of the write (args stolen); 0 or the exit status, *ret_res
 * the result. */
static int write_call(const struct ctl_opts *o, struct ctl_session *s, const char *method,
                      json_t *args, json_t **ret_res)
{
        json_t *err = NULL;
        int status;
        *ret_res = NULL;
        if ((status = add_epoch(args)))
                return status;
        status = ctl_session_call(s, method, args, ret_res, &err);
        if (status == CTL_EXIT_REFUSED) {
                const char *code = jstr(err, "code");
                if (code && strcmp(code, "too_large") == 0) {
                        fputs("kairosctl: tool write: ", stderr);
                        ctl_put_safe(stderr, jstr(err, "message"));
                        fputc('\n', stderr);
                        status = CTL_EXIT_DATAERR;
                        if (o->json && ctl_json_print(json_incref(err)) != 0)
                                status = CTL_EXIT_IOERR;
                } else {
                        status = claim_refused(o, err);
                }
        }
        json_decref(err);
        return status;
}

/* The content streams to kairosd (tool-write with stream, tool-write-data
 * per part, tool-write-end): never held whole here. */
int ctl_cmd_tool_write(const struct ctl_opts *o, int argc, char **argv)
{
        const char *key = NULL;
        const struct ctl_option opts[] = { { "key", true, &key, NULL }, { NULL } };
        json_t *res = NULL;
        struct ctl_session *s = NULL;
        unsigned char *buf = NULL;
        int npos, status;

        status = ctl_parse_options("tool write", argc, argv, opts, &npos);
        if (status == 0)
                status = want_one("tool write", npos, "PATH");
        if (status)
                return status;
        key = pick_key(key);
        if (!key || !*key)
                return ctl_usage_error("tool write needs --key K (or $KAIROS_IDEM_KEY)");
        if ((status = refuse_unexpanded_key("tool write", key)))
                return status;
        if (!(buf = malloc(CTL_WRITE_PART)))
                return ctl_error(CTL_EXIT_OSERR, "out of memory");
        status = ctl_session_open(o, &s);
        if (status != CTL_EXIT_OK)
                goto out;
        status = write_call(o, s, "tool-write",
                            json_pack("{s:s, s:s, s:b}", "key", key, "path", argv[0], "stream",
                                      1),
                            &res);
        if (status != CTL_EXIT_OK)
                goto out;
        /* a duplicate is answered at once: nothing to send */
        if (strcmp(jstr(res, "outcome") ? jstr(res, "outcome") : "", "send") == 0) {
                for (;;) {
                        ssize_t n = read_part(buf, CTL_WRITE_PART);
                        if (n < 0) {
                                /* the connection closes: kairosd keeps nothing */
                                status = ctl_file_error("-", (int)n);
                                goto out;
                        }
                        if (n == 0)
                                break;
                        json_decref(res);
                        status = write_call(o, s, "tool-write-data",
                                            json_pack("{s:o}", "data", b64_json(buf, (size_t)n)),
                                            &res);
                        if (status != CTL_EXIT_OK)
                                goto out;
                        if ((size_t)n < CTL_WRITE_PART)
                                break;
                }
                json_decref(res);
                status = write_call(o, s, "tool-write-end", json_object(), &res);
                if (status != CTL_EXIT_OK)
                        goto out;
        }
        if (o->json)
                status = ctl_json_print(json_incref(res));
        else
                text_write(res);
out:
        json_decref(res);
        free(buf);
        ctl_session_close(s);
        return status;
}

/* ---- idem stats / get / forget ---------------------------------------- */

static long long jint(json_t *obj, const char *key)
{
        return (long long)json_integer_value(json_object_get(obj, key));
}

static int text_stats(json_t *r)
{
        if (json_is_false(json_object_get(r, "available"))) {
                fputs("Store:       unavailable: ", stdout);
                ctl_put_safe(stdout, jstr(r, "error"));
                putchar('\n');
                return CTL_EXIT_OK;
        }
        printf("Entries:     %lld of %lld (%lld processing, %lld completed, %lld failed, "
               "%lld interrupted)\n",
               jint(r, "size"), jint(r, "capacity"), jint(r, "processing"),
               jint(r, "completed"), jint(r, "failed"), jint(r, "interrupted"));
        printf("TTL:         %lld s\n", jint(r, "ttl_sec"));
        printf("Lookups:     %lld hits, %lld misses, %lld conflicts, %lld mismatches\n",
               jint(r, "hits"), jint(r, "misses"), jint(r, "conflicts"), jint(r, "mismatches"));
        printf("Dropped:     %lld evicted, %lld expired, %lld forgotten; %lld refused "
               "(store full)\n",
               jint(r, "evictions"), jint(r, "expirations"), jint(r, "forgets"),
               jint(r, "store_full"));
        fputs("Log:         ", stdout);
        ctl_put_safe(stdout, jstr(r, "log_path"));
        printf(", %lld records, %lld fdatasync calls, %lld compactions\n", jint(r, "log_records"),
               jint(r, "log_flushes"), jint(r, "compactions"));
        fputs("State:       ", stdout);
        if (json_is_true(json_object_get(r, "quarantined")))
                fputs("quarantined (the log is corrupt; lookups only)", stdout);
        else if (jstr(r, "error"))
                ctl_put_safe(stdout, jstr(r, "error"));
        else
                fputs("ok", stdout);
        putchar('\n');
        fputs("WriteRoots:  ", stdout);
        json_t *roots = json_object_get(r, "write_roots"), *v;
        size_t i;
        if (json_array_size(roots) == 0)
                fputs("(none: tool write is refused)", stdout);
        json_array_foreach(roots, i, v) {
                if (i)
                        putchar(' ');
                ctl_put_safe(stdout, json_string_value(v));
        }
        putchar('\n');
        return CTL_EXIT_OK;
}

static int call_print(const struct ctl_opts *o, const char *cmd, json_t *args,
                      int (*text)(json_t *))
{
        json_t *res;
        int status = ctl_call(o, cmd, args, &res);

        if (status != CTL_EXIT_OK)
                return status;
        status = o->json ? ctl_json_print(json_incref(res)) : text(res);
        json_decref(res);
        return status;
}

int ctl_cmd_idem_stats(const struct ctl_opts *o, int argc, char **argv)
{
        int npos, r = ctl_parse_options("idem stats", argc, argv, NULL, &npos);

        if (r)
                return r;
        if (npos)
                return ctl_usage_error("idem stats: unexpected argument(s)");
        return call_print(o, "idem-stats", NULL, text_stats);
}

static void field(const char *label, const char *value)
{
        if (!value)
                return;
        printf("  %-12s ", label);
        ctl_put_safe(stdout, value);
        putchar('\n');
}

static int text_get(json_t *r)
{
        json_t *res = json_object_get(r, "result");
        char num[64];

        fputs("Key ", stdout);
        ctl_put_safe(stdout, jstr(r, "key"));
        putchar('\n');
        field("state:", jstr(r, "state"));
        field("tool:", jstr(r, "tool"));
        field("fingerprint:", jstr(r, "fingerprint"));
        field("created:", jstr(r, "created_at"));
        field("finished:", jstr(r, "finished_at"));
        field("expires:", jstr(r, "expires_at"));
        field("reason:", jstr(r, "reason"));
        field("error:", jstr(r, "error_class"));
        field("message:", jstr(r, "error_msg"));
        field("durable:", json_is_true(json_object_get(r, "durable")) ? "yes" : "no");
        json_t *owner = json_object_get(r, "owner");
        if (json_is_object(owner)) {
                char who[256];
                snprintf(who, sizeof who, "%s %s (attempt %lld)", jstr(owner, "mandate"),
                         jstr(owner, "step"), jint(owner, "attempt"));
                field("owner:", who);
        } else {
                field("owner:", "none (not called from a step's handler)");
        }
        json_t *chk = json_object_get(json_object_get(r, "check"), "cmd");
        if (json_is_array(chk)) {
                /* the words as stored (the call's own check) */
                printf("  %-12s ", "check:");
                size_t i;
                json_t *w;
                json_array_foreach(chk, i, w) {
                        if (i)
                                putchar(' ');
                        ctl_put_safe(stdout, json_string_value(w));
                }
                putchar('\n');
        }
        if (json_is_integer(json_object_get(res, "exit_status"))) {
                snprintf(num, sizeof num, "%lld", jint(res, "exit_status"));
                field("exit status:", num);
        }
        static const char *const streams[] = { "stdout", "stderr" };
        for (int i = 0; i < 2; i++) {
                unsigned char *data;
                size_t n;
                if (!json_is_string(json_object_get(res, streams[i])))
                        continue;
                if (b64_member(res, streams[i], &data, &n) == 0) {
                        snprintf(num, sizeof num, "%zu bytes", n);
                        printf("  %-12s %s\n", streams[i][3] == 'o' ? "stdout:" : "stderr:", num);
                        free(data);
                }
        }
        if (jstr(res, "path")) {
                field("path:", jstr(res, "path"));
                snprintf(num, sizeof num, "%lld bytes", jint(res, "bytes"));
                field("written:", num);
        }
        if (strcmp(jstr(r, "state") ? jstr(r, "state") : "", "interrupted") == 0) {
                fputs("\nIts caller vanished before reporting a result: find out whether the "
                      "side effect happened, then\n  kairosctl idem forget ",
                      stdout);
                ctl_put_safe(stdout, jstr(r, "key"));
                fputs(" --reason TEXT\n", stdout);
        }
        return CTL_EXIT_OK;
}

int ctl_cmd_idem_get(const struct ctl_opts *o, int argc, char **argv)
{
        int npos, r = ctl_parse_options("idem get", argc, argv, NULL, &npos);

        if (r == 0)
                r = want_one("idem get", npos, "KEY");
        if (r)
                return r;
        return call_print(o, "idem-get", json_pack("{s:s}", "key", argv[0]), text_get);
}

static int text_forget(json_t *r)
{
        fputs("forgot ", stdout);
        ctl_put_safe(stdout, jstr(r, "key"));
        printf(" (was %s)\n", jstr(r, "state") ? jstr(r, "state") : "?");
        return CTL_EXIT_OK;
}

int ctl_cmd_idem_forget(const struct ctl_opts *o, int argc, char **argv)
{
        const char *reason = NULL;
        const struct ctl_option opts[] = { { "reason", true, &reason, NULL }, { NULL } };
        int npos, r = ctl_parse_options("idem forget", argc, argv, opts, &npos);

        if (r == 0)
                r = want_one("idem forget", npos, "KEY");
        if (r)
                return r;
        if (!reason || !*reason)
                return ctl_usage_error("idem forget: --reason TEXT is required (why it is safe)");
        return call_print(o, "idem-forget", json_pack("{s:s, s:s}", "key", argv[0], "reason",
                                                      reason),
                          text_forget);
}
