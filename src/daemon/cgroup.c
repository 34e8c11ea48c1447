/* SPDX-License-Identifier: MIT */
/* cgroup: see cgroup.h. */
#include "cgroup.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif

/* cgroup v2 at /sys/fs/cgroup, or (a "hybrid" host, controllers on v1)
 * at /sys/fs/cgroup/unified: there handlers get cgroups for the kill at
 * the end of their step, without controllers. */
static const char *const mounts[] = { "/sys/fs/cgroup", "/sys/fs/cgroup/unified" };
#define CPU_PERIOD_US 100000

struct cgroup_ctl {
        char *path;        /* below the mount */
        const char *mount; /* one of mounts[] */
        int root_fd;       /* the service cgroup */
        unsigned long counter;
        unsigned controllers; /* CGROUP_MEMORY | CGROUP_PIDS | CGROUP_CPU enabled */
        char missing[64];     /* the ones that could not be enabled, "" none */
};

__attribute__((format(printf, 3, 4)))
static void why_set(char *why, size_t len, const char *fmt, ...)
{
        if (!why || !len)
                return;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, len, fmt, ap);
        va_end(ap);
}

/* Read a small file below dir (NUL-terminated, at most len-1 bytes). */
static int read_at(int dir, const char *name, char *buf, size_t len)
{
        int fd = openat(dir, name, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        size_t n = 0;
        while (n + 1 < len) {
                ssize_t k = read(fd, buf + n, len - 1 - n);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0) {
                        int e = -errno;
                        close(fd);
                        return e;
                }
                if (k == 0)
                        break;
                n += (size_t)k;
        }
        buf[n] = '\0';
        close(fd);
        return 0;
}

static int write_at(int dir, const char *name, const char *s)
{
        int fd = openat(dir, name, O_WRONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        ssize_t k;
        do
                k = write(fd, s, strlen(s));
        while (k < 0 && errno == EINTR);
        int e = k < 0 ? -errno : 0;
        close(fd);
        return e;
}

/* Our cgroup v2 path from /proc/self/cgroup ("0::/PATH"). */
static int own_path(char **ret)
{
        FILE *f = fopen("/proc/self/cgroup", "re");
        if (!f)
                return -errno;
        char line[4096];
        int r = -ENOENT;
        while (fgets(line, sizeof line, f)) {
                if (strncmp(line, "0::/", 4) != 0)
                        continue;
                line[strcspn(line, "\n")] = '\0';
                *ret = strdup(line + 3);
                r = *ret ? 0 : -ENOMEM;
                break;
        }
        fclose(f);
        return r;
}

/* Does cgroup.procs of dir list exactly pid? */
static int holds_only(int dir, pid_t pid, bool *ret)
{
        char buf[256];
        int r = read_at(dir, "cgroup.procs", buf, sizeof buf);
        if (r < 0)
                return r;
        char me[32];
        snprintf(me, sizeof me, "%d\n", (int)pid);
        *ret = strcmp(buf, me) == 0;
        return 0;
}

int cgroup_ctl_new(struct cgroup_ctl **ret, char *why, size_t why_len)
{
        *ret = NULL;
        struct statfs sf;
        const char *mnt = NULL;
        for (size_t i = 0; i < sizeof mounts / sizeof mounts[0] && !mnt; i++)
                if (statfs(mounts[i], &sf) == 0 && sf.f_type == CGROUP2_SUPER_MAGIC)
                        mnt = mounts[i];
        if (!mnt) {
                why_set(why, why_len, "no cgroup v2 hierarchy at %s or %s", mounts[0],
                        mounts[1]);
                return 0;
        }
        char *path = NULL;
        int r = own_path(&path);
        if (r < 0) {
                why_set(why, why_len, "no cgroup v2 entry in /proc/self/cgroup");
                return r == -ENOMEM ? r : 0;
        }
        char full[4096 + 64];
        snprintf(full, sizeof full, "%s%s", mnt, path);
        int fd = open(full, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        bool alone = false;
        if (fd < 0 || strcmp(path, "/") == 0 ||
            faccessat(fd, ".", W_OK, AT_EACCESS) < 0 ||
            faccessat(fd, "cgroup.procs", W_OK, AT_EACCESS) < 0 ||
            faccessat(fd, "cgroup.subtree_control", W_OK, AT_EACCESS) < 0) {
                why_set(why, why_len, "cgroup %s is not delegated to kairosd (not writable; "
                        "under systemd: Delegate=yes)", path);
                goto none;
        }
        if (holds_only(fd, getpid(), &alone) < 0 || !alone) {
                why_set(why, why_len, "cgroup %s holds other processes than kairosd", path);
                goto none;
        }
        struct cgroup_ctl *c = calloc(1, sizeof(*c));
        if (!c) {
                r = -ENOMEM;
                goto fail;
        }
        c->path = path;
        c->mount = mnt;
        c->root_fd = fd;
        /* kairosd into the leaf "daemon" */
        if (mkdirat(fd, "daemon", 0755) < 0 && errno != EEXIST) {
                r = -errno;
                why_set(why, why_len, "cannot create %s/daemon: %s", path, strerror(-r));
                goto fail_c;
        }
        int dfd = openat(fd, "daemon", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        r = dfd < 0 ? -errno : write_at(dfd, "cgroup.procs", "0");
        if (dfd >= 0)
                close(dfd);
        if (r < 0) {
                why_set(why, why_len, "cannot move kairosd into %s/daemon: %s", path,
                        strerror(-r));
                goto fail_c;
        }
        /* a controller missing here fails only the handlers that need it */
        static const char *const ctl[] = { "+memory", "+pids", "+cpu" };
        for (size_t i = 0; i < 3; i++) {
                if (write_at(fd, "cgroup.subtree_control", ctl[i]) == 0) {
                        c->controllers |= 1u << i;
                } else {
                        size_t n = strlen(c->missing);
                        snprintf(c->missing + n, sizeof c->missing - n, "%s%s", n ? " " : "",
                                 ctl[i] + 1);
                }
        }
        *ret = c;
        return 0;
fail_c:
        cgroup_ctl_free(c);
        return r;
none:
        if (fd >= 0)
                close(fd);
        free(path);
        return 0;
fail:
        if (fd >= 0)
                close(fd);
        free(path);
        return r;
}

void cgroup_ctl_free(struct cgroup_ctl *c)
{
        if (!c)
                return;
        if (c->root_fd >= 0)
                close(c->root_fd);
        free(c->path);
        free(c);
}

unsigned cgroup_ctl_controllers(const struct cgroup_ctl *c)
{
        return c ? c->controllers : 0;
}

const char *cgroup_ctl_missing(const struct cgroup_ctl *c)
{
        return c ? c->missing : "";
}

const char *cgroup_ctl_path(const struct cgroup_ctl *c)
{
        return c ? c->path : NULL;
}

const char *cgroup_ctl_mount(const struct cgroup_ctl *c)
{
        return c ? c->mount : NULL;
}

void cgroup_handler_init(struct cgroup_handler *h)
{
        h->name[0] = '\0';
        h->dir_fd = -1;
        h->procs_fd = -1;
}

static void limit_str(uint64_t v, char *buf, size_t len)
{
        if (v == UINT64_MAX)
                snprintf(buf, len, "max");
        else
                snprintf(buf, len, "%" PRIu64, v);
}

int cgroup_handler_create(struct cgroup_ctl *c, const char *hint, const struct cgroup_limits *l,
                          struct cgroup_handler *h, const char **ret_what)
{
        cgroup_handler_init(h);
        *ret_what = "mkdir";
        /* h-<hint, sanitized, at most 64>-<counter> */
        char safe[65];
        size_t n = 0;
        for (const char *p = hint ? hint : ""; *p && n < sizeof safe - 1; p++)
                safe[n++] = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                                            (*p >= '0' && *p <= '9') || *p == '-' || *p == '_'
                                    ? *p
                                    : '_';
        safe[n] = '\0';
        /* a directory left by an earlier kairosd may have the name: the next */
        int r = -EEXIST;
        for (int tries = 0; r == -EEXIST && tries < 100; tries++) {
                snprintf(h->name, sizeof h->name, "h-%s-%lu", safe, ++c->counter);
                r = mkdirat(c->root_fd, h->name, 0755) < 0 ? -errno : 0;
        }
        if (r < 0) {
                h->name[0] = '\0';
                return r;
        }
        h->dir_fd = openat(c->root_fd, h->name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (h->dir_fd < 0) {
                r = -errno;
                goto fail;
        }
        char buf[64];
        /* a limit whose controller is missing is skipped (kairosd warned) */
        if (l->memory_max && (c->controllers & CGROUP_MEMORY)) {
                *ret_what = "memory.max";
                limit_str(l->memory_max, buf, sizeof buf);
                if ((r = write_at(h->dir_fd, "memory.max", buf)) < 0)
                        goto fail;
                /* the OOM killer ends the handler as a whole, not one process of it */
                *ret_what = "memory.oom.group";
                if ((r = write_at(h->dir_fd, "memory.oom.group", "1")) < 0)
                        goto fail;
        }
        if (l->tasks_max && (c->controllers & CGROUP_PIDS)) {
                *ret_what = "pids.max";
                limit_str(l->tasks_max, buf, sizeof buf);
                if ((r = write_at(h->dir_fd, "pids.max", buf)) < 0)
                        goto fail;
        }
        if (l->cpu_quota_pct && (c->controllers & CGROUP_CPU)) {
                *ret_what = "cpu.max";
                snprintf(buf, sizeof buf, "%" PRIu64 " %d",
                         l->cpu_quota_pct * (CPU_PERIOD_US / 100), CPU_PERIOD_US);
                if ((r = write_at(h->dir_fd, "cpu.max", buf)) < 0)
                        goto fail;
        }
        *ret_what = "cgroup.procs";
        h->procs_fd = openat(h->dir_fd, "cgroup.procs", O_WRONLY | O_CLOEXEC);
        if (h->procs_fd < 0) {
                r = -errno;
                goto fail;
        }
        *ret_what = NULL;
        return 0;
fail:
        if (h->dir_fd >= 0)
                close(h->dir_fd);
        unlinkat(c->root_fd, h->name, AT_REMOVEDIR);
        cgroup_handler_init(h);
        return r;
}

bool cgroup_handler_oom_killed(const struct cgroup_handler *h)
{
        char buf[512];
        if (h->dir_fd < 0 || read_at(h->dir_fd, "memory.events", buf, sizeof buf) < 0)
                return false;
        const char *p = strstr(buf, "oom_kill ");
        return p && (p == buf || p[-1] == '\n') && strtoull(p + 9, NULL, 10) > 0;
}

static int64_t now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Is the cgroup empty ("populated 0" in cgroup.events)? */
static bool is_empty(int dir)
{
        char buf[256];
        if (read_at(dir, "cgroup.events", buf, sizeof buf) < 0)
                return true; /* gone */
        return strstr(buf, "populated 0") != NULL;
}

/* Without cgroup.kill (before Linux 5.14): SIGKILL every pid listed, once. */
static void kill_listed(int dir)
{
        char buf[8192];
        if (read_at(dir, "cgroup.procs", buf, sizeof buf) < 0)
                return;
        for (char *p = buf, *e; *p; p = e) {
                long pid = strtol(p, &e, 10);
                if (e == p)
                        break;
                if (pid > 0)
                        kill((pid_t)pid, SIGKILL);
                while (*e == '\n')
                        e++;
        }
}

int cgroup_handler_destroy(struct cgroup_ctl *c, struct cgroup_handler *h, int timeout_ms)
{
        if (h->dir_fd < 0)
                return 0;
        if (h->procs_fd >= 0)
                close(h->procs_fd);
        h->procs_fd = -1;
        bool has_kill = write_at(h->dir_fd, "cgroup.kill", "1") == 0;
        int64_t deadline = now_ms() + timeout_ms;
        int r = 0;
        for (;;) {
                if (!has_kill)
                        kill_listed(h->dir_fd);
                if (is_empty(h->dir_fd))
                        break;
                int64_t left = deadline - now_ms();
                if (left <= 0) {
                        r = -EBUSY;
                        break;
                }
                /* cgroup.events changes raise POLLPRI */
                int efd = openat(h->dir_fd, "cgroup.events", O_RDONLY | O_CLOEXEC);
                if (efd < 0)
                        break;
                char tmp[256];
                (void)!read(efd, tmp, sizeof tmp);
                if (!is_empty(h->dir_fd)) {
                        struct pollfd pfd = { .fd = efd, .events = POLLPRI };
                        (void)poll(&pfd, 1, left < 50 ? (int)left : 50);
                }
                close(efd);
        }
        close(h->dir_fd);
        h->dir_fd = -1;
        if (r == 0 && unlinkat(c->root_fd, h->name, AT_REMOVEDIR) < 0 && errno != ENOENT)
                r = -errno;
        return r;
}
