/* SPDX-License-Identifier: MIT */
/* runenv: what every handler's, hook's and probe's environment has besides
 * its own variables — PATH, HOME, USER and KAIROSCTL — found once at start.
 * Below the executor, hooks and probe, which all read it. */
#include <errno.h>
#include <limits.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kairos/config.h"
#include "kairos/planner.h"
#include "log.h"
#include "runenv.h"

/* What every handler's environment has besides the step's own variables:
 * the daemon user's identity and where kairosctl is.  Found once at start
 * (getpwuid may ask NSS, which can block). */
static struct {
        char *home, *user;   /* of the daemon's user (getpwuid), NULL if unknown */
        char *kairosctl;     /* absolute path of kairosctl, NULL if not found */
        char *path;          /* PATH: kairosctl's directory, then kairosd's PATH */
} henv;

static bool is_executable_file(const char *path)
{
        struct stat st;
        return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* The kairosctl that belongs to this kairosd: next to it (a build tree
 * with both in one directory), ../ctl (the build tree: src/daemon and
 * src/ctl), ../bin (installed: /usr/sbin/kairosd and /usr/bin/kairosctl),
 * then the first one on PATH.  An absolute path without symlinks, or NULL. */
static char *find_kairosctl(void)
{
        char exe[PATH_MAX], cand[PATH_MAX + 32];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n > 0) {
                exe[n] = '\0';
                char *slash = strrchr(exe, '/');
                if (slash)
                        *slash = '\0';
                static const char *const rel[] = { "kairosctl", "../ctl/kairosctl",
                                                   "../bin/kairosctl" };
                for (size_t i = 0; slash && i < sizeof rel / sizeof rel[0]; i++) {
                        snprintf(cand, sizeof cand, "%s/%s", exe, rel[i]);
                        if (is_executable_file(cand))
                                return realpath(cand, NULL);
                }
        }
        const char *path = getenv("PATH");
        while (path && *path) {
                size_t len = strcspn(path, ":");
                if (len > 0 && len < PATH_MAX) {
                        snprintf(cand, sizeof cand, "%.*s/kairosctl", (int)len, path);
                        if (cand[0] == '/' && is_executable_file(cand))
                                return realpath(cand, NULL);
                }
                path += len + (path[len] == ':');
        }
        return NULL;
}

void runenv_init(uid_t huid)
{
        struct passwd *pw = getpwuid(huid);
        if (pw) {
                henv.home = strdup(pw->pw_dir);
                henv.user = strdup(pw->pw_name);
        } else {
                log_warning("uid %u has no passwd entry: handlers get no HOME, USER, LOGNAME",
                            (unsigned)huid);
        }
        const char *path = getenv("PATH");
        if (!path || !*path)
                path = "/usr/local/bin:/usr/bin:/bin";
        henv.kairosctl = find_kairosctl();
        char *dir = henv.kairosctl ? strdup(henv.kairosctl) : NULL;
        char *slash = dir ? strrchr(dir, '/') : NULL;
        if (slash)
                *(slash == dir ? slash + 1 : slash) = '\0';
        size_t dlen = dir ? strlen(dir) : 0;
        if (dir && !(strncmp(path, dir, dlen) == 0 && (path[dlen] == ':' || !path[dlen]))) {
                if (asprintf(&henv.path, "%s:%s", dir, path) < 0)
                        henv.path = NULL;
        }
        if (!henv.path)
                henv.path = strdup(path);
        free(dir);
        if (henv.kairosctl)
                log_debug("handlers get KAIROSCTL=%s", henv.kairosctl);
        else
                log_warning("no kairosctl next to kairosd or on PATH: handlers get no KAIROSCTL");
}

void runenv_get(const char **ret_path, const char **ret_home, const char **ret_user,
                const char **ret_kairosctl)
{
        *ret_path = henv.path ? henv.path : "/usr/local/bin:/usr/bin:/bin";
        *ret_home = henv.home;
        *ret_user = henv.user;
        *ret_kairosctl = henv.kairosctl;
}

/* Entries copied by length (asprintf's formatting was most of the cost of
 * a step's environment), the array and its strings in one allocation: one
 * malloc a step, not one per entry. */
char **runenv_build(const char *const (*kv)[2], size_t nkv, char *const *extra, size_t nextra)
{
        const char *path, *home, *user, *kairosctl;
        runenv_get(&path, &home, &user, &kairosctl);
        const char *const base[][2] = {
                { "PATH", path }, { "LANG", getenv("LANG") }, { "HOME", home },
                { "USER", user }, { "LOGNAME", user },        { "KAIROSCTL", kairosctl },
        };
        size_t nbase = sizeof base / sizeof base[0], all = nbase + nkv + nextra;
        size_t bytes = 0, count = all;
        for (size_t i = 0; i < all; i++) {
                const char *const *p = i < nbase ? base[i] : i < nbase + nkv ? kv[i - nbase] : NULL;
                if (p && !p[1])
                        count--;
                else
                        bytes += p ? strlen(p[0]) + strlen(p[1]) + 2 : strlen(extra[i - nbase - nkv]) + 1;
        }
        char **env = malloc((count + 1) * sizeof(char *) + bytes);
        if (!env)
                return NULL;
        char *at = (char *)(env + count + 1);
        size_t ne = 0;
        for (size_t i = 0; i < all; i++) {
                const char *const *p = i < nbase ? base[i] : i < nbase + nkv ? kv[i - nbase] : NULL;
                if (p && !p[1])
                        continue;
                size_t n = p ? strlen(p[0]) : 0, v = strlen(p ? p[1] : extra[i - nbase - nkv]);
                env[ne++] = at;
                if (p) {
                        memcpy(at, p[0], n);
                        at[n++] = '=';
                }
                memcpy(at + n, p ? p[1] : extra[i - nbase - nkv], v + 1);
                at += n + v + 1;
        }
        env[ne] = NULL;
        return env;
}

char **runenv_build_step(const struct runenv_step *s, const char *const (*more)[2], size_t nmore,
                         char *const *extra, size_t nextra)
{
        char attempt[16], cycle[24];
        snprintf(attempt, sizeof attempt, "%u", s->attempt);
        snprintf(cycle, sizeof cycle, "%lld", s->cycle);
        const char *kv[11 + 4][2] = {
                { "KAIROS_MANDATE_ID", s->mandate_id },
                { "KAIROS_PLAN_ID", s->plan_id },
                { "KAIROS_STEP_ID", s->step_id },
                { "KAIROS_PHASE", planner_phase_name((enum planner_phase)s->phase) },
                { "KAIROS_CYCLE", cycle },
                { "KAIROS_IDEM_KEY", s->idem_key },
                { "KAIROS_SCHEDULE", s->schedule },
                { "KAIROS_FIRED_AT", s->fired_at },
                { "KAIROS_GOAL", s->goal ? s->goal : s->schedule },
                { "KAIROS_ATTEMPT", attempt },
                { "KAIROS_CONTROL_SOCKET", s->control_socket },
        };
        if (nmore > 4)
                return NULL;
        if (nmore)
                memcpy(kv[11], more, nmore * sizeof *more);
        return runenv_build((const char *const (*)[2])kv, 11 + nmore, extra, nextra);
}

int runenv_command(const char *cmdline, char *const *env, char ***ret_argv, char *why,
                   size_t why_len)
{
        size_t argc = 0;
        int r = config_expand_command(cmdline, env, ret_argv, &argc, why, why_len);
        if (r == 0 && (argc == 0 || !(*ret_argv)[0][0])) {
                snprintf(why, why_len, "the command name is empty once its variables are "
                         "expanded");
                r = -EINVAL;
        }
        return r;
}
