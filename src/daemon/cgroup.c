/* SPDX-License-Identifier: MIT */
/* cgroup: see cgroup.h. */
#include "cgroup.h"
#include "kairos/kbuf.h"

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

/* The v1 hierarchies, by CGROUP_AT_*: the controller in
 * /proc/self/cgroup and in the mount options. */
static const char *const v1_names[CGROUP_AT_N] = { NULL, "memory", "pids", "cpu" };
static const unsigned v1_bits[CGROUP_AT_N] = { 0, CGROUP_MEMORY, CGROUP_PIDS, CGROUP_CPU };

struct cgroup_ctl {
        char *path;        /* v2: below the mount, NULL none */
        int root_fd[CGROUP_AT_N]; /* kairosd's cgroup in each hierarchy used, -1 none */
        unsigned long counter;
        unsigned controllers; /* CGROUP_MEMORY | CGROUP_PIDS | CGROUP_CPU enabled */
        unsigned v2_controllers; /* those of them on cgroup v2 */
        char missing[64];     /* the ones that could not be enabled, "" none */
        char where[1024];     /* cgroup_ctl_where */
        /* the hierarchy each v1 controller is in: its own CGROUP_AT_, or an
         * earlier one's where they are mounted together */
        int place_of[CGROUP_AT_N];
        char v1_mount[CGROUP_AT_N][512];
};

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

/* Is name one of the comma-separated words of list? */
static bool has_word(const char *list, size_t len, const char *name)
{
        size_t n = strlen(name);
        for (const char *p = list, *end = list + len; p < end;) {
                const char *e = memchr(p, ',', (size_t)(end - p));
                if (!e)
                        e = end;
                if ((size_t)(e - p) == n && memcmp(p, name, n) == 0)
                        return true;
                p = e + 1;
        }
        return false;
}

int cgroup_parse_own(FILE *f, const char *controller, char **ret)
{
        char line[4096];
        int r = -ENOENT;
        while (r == -ENOENT && fgets(line, sizeof line, f)) {
                line[strcspn(line, "\n")] = '\0';
                char *c1 = strchr(line, ':');
                char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
                if (!c2 || c2[1] != '/')
                        continue;
                bool match = controller ? has_word(c1 + 1, (size_t)(c2 - c1 - 1), controller)
                                        : strncmp(line, "0::", 3) == 0;
                if (!match)
                        continue;
                *ret = strdup(c2 + 1);
                r = *ret ? 0 : -ENOMEM;
        }
        return r;
}

/* Our cgroup path from /proc/self/cgroup (cgroup_parse_own). */
static int own_path(const char *controller, char **ret)
{
        FILE *f = fopen("/proc/self/cgroup", "re");
        if (!f)
                return -errno;
        int r = cgroup_parse_own(f, controller, ret);
        fclose(f);
        return r;
}

int cgroup_parse_mountinfo(FILE *f, const char *controller, char *ret_mnt, size_t mnt_len,
                           char *ret_root, size_t root_len)
{
        char line[4096];
        int r = -ENOENT;
        while (r == -ENOENT && fgets(line, sizeof line, f)) {
                line[strcspn(line, "\n")] = '\0';
                /* ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - TYPE SOURCE SUPEROPTS */
                char *sep = strstr(line, " - ");
                if (!sep)
                        continue;
                *sep = '\0';
                char *save = NULL, *tok[5] = { NULL };
                char *p = strtok_r(line, " ", &save);
                for (int i = 0; i < 5 && p; i++, p = strtok_r(NULL, " ", &save))
                        tok[i] = p;
                char *type = strtok_r(sep + 3, " ", &save);
                (void)strtok_r(NULL, " ", &save); /* source */
                char *super = strtok_r(NULL, " ", &save);
                if (!tok[4] || !type || !super || strcmp(type, "cgroup") != 0 ||
                    !has_word(super, strlen(super), controller))
                        continue;
                /* a mount point with an escaped character is not one we use */
                if (strchr(tok[4], '\\') || strchr(tok[3], '\\'))
                        continue;
                snprintf(ret_mnt, mnt_len, "%s", tok[4]);
                snprintf(ret_root, root_len, "%s", tok[3]);
                r = 0;
        }
        return r;
}

/* The mount point of controller's v1 hierarchy and its root (cgroup_parse_mountinfo). */
static int v1_mount(const char *controller, char *ret_mnt, size_t mnt_len, char *ret_root,
                    size_t root_len)
{
        FILE *f = fopen("/proc/self/mountinfo", "re");
        if (!f)
                return -errno;
        int r = cgroup_parse_mountinfo(f, controller, ret_mnt, mnt_len, ret_root, root_len);
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

/* The cgroup directory full, open in *ret_fd if kairosd may take it as its
 * own: 1; 0 not writable (v2: nor its cgroup.subtree_control), -1 it holds
 * other processes than kairosd (*ret_fd -1 then). */
static int open_own(const char *full, bool v2, int *ret_fd)
{
        int fd = open(full, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        bool alone = false;
        int r = 1;
        if (fd < 0 || faccessat(fd, ".", W_OK, AT_EACCESS) < 0 ||
            faccessat(fd, "cgroup.procs", W_OK, AT_EACCESS) < 0 ||
            (v2 && faccessat(fd, "cgroup.subtree_control", W_OK, AT_EACCESS) < 0))
                r = 0;
        else if (holds_only(fd, getpid(), &alone) < 0 || !alone)
                r = -1;
        if (r < 1 && fd >= 0) {
                close(fd);
                fd = -1;
        }
        *ret_fd = fd;
        return r;
}

/* kairosd's cgroup v2: 1 set up in c, 0 none (why filled), or a negative
 * errno (a delegated cgroup that could not be set up; why filled). */
static int setup_v2(struct cgroup_ctl *c, char *why, size_t why_len)
{
        struct statfs sf;
        const char *mnt = NULL;
        for (size_t i = 0; i < sizeof mounts / sizeof mounts[0] && !mnt; i++)
                if (statfs(mounts[i], &sf) == 0 && sf.f_type == CGROUP2_SUPER_MAGIC)
                        mnt = mounts[i];
        if (!mnt) {
                kbuf_setf(why, why_len, "no cgroup v2 hierarchy at %s or %s", mounts[0],
                        mounts[1]);
                return 0;
        }
        char *path = NULL;
        int r = own_path(NULL, &path);
        if (r < 0) {
                kbuf_setf(why, why_len, "no cgroup v2 entry in /proc/self/cgroup");
                return r == -ENOMEM ? r : 0;
        }
        char full[4096 + 64];
        snprintf(full, sizeof full, "%s%s", mnt, path);
        int fd = -1;
        int own = strcmp(path, "/") == 0 ? 0 : open_own(full, true, &fd);
        if (own == 0)
                kbuf_setf(why, why_len, "cgroup %s is not delegated to kairosd (not writable; "
                        "under systemd: Delegate=yes)", path);
        else if (own < 0)
                kbuf_setf(why, why_len, "cgroup %s holds other processes than kairosd", path);
        if (own < 1) {
                free(path);
                return 0;
        }
        c->path = path;
        c->root_fd[CGROUP_AT_V2] = fd;
        /* kairosd into the leaf "daemon" */
        if (mkdirat(fd, "daemon", 0755) < 0 && errno != EEXIST) {
                r = -errno;
                kbuf_setf(why, why_len, "cannot create %s/daemon: %s", path, strerror(-r));
                return r;
        }
        int dfd = openat(fd, "daemon", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        r = dfd < 0 ? -errno : write_at(dfd, "cgroup.procs", "0");
        if (dfd >= 0)
                close(dfd);
        if (r < 0) {
                kbuf_setf(why, why_len, "cannot move kairosd into %s/daemon: %s", path,
                        strerror(-r));
                return r;
        }
        /* a controller missing here may come from cgroup v1 (setup_v1) */
        static const char *const ctl[] = { "+memory", "+pids", "+cpu" };
        for (size_t i = 0; i < 3; i++)
                if (write_at(fd, "cgroup.subtree_control", ctl[i]) == 0)
                        c->v2_controllers |= 1u << i;
        c->controllers = c->v2_controllers;
        snprintf(c->where, sizeof c->where, "%s%s", mnt, path);
        return 1;
}

/* kairosd's cgroup in the v1 hierarchy of controller at: 1 set up in c, 0
 * not usable (*ret_why says why), or -ENOMEM. */
static int setup_v1(struct cgroup_ctl *c, int at, const char **ret_why)
{
        const char *name = v1_names[at];
        char mnt[512], root[512];
        if (v1_mount(name, mnt, sizeof mnt, root, sizeof root) < 0) {
                *ret_why = "no cgroup v1 hierarchy";
                return 0;
        }
        char *path = NULL;
        int r = own_path(name, &path);
        if (r < 0) {
                *ret_why = "no entry in /proc/self/cgroup";
                return r == -ENOMEM ? r : 0;
        }
        /* a bind mount of a cgroup below the hierarchy's root shows it */
        const char *rel = path;
        size_t rlen = strcmp(root, "/") == 0 ? 0 : strlen(root);
        if (rlen && (strncmp(path, root, rlen) != 0 || (path[rlen] && path[rlen] != '/'))) {
                *ret_why = "kairosd's cgroup is not below the mount";
                free(path);
                return 0;
        }
        rel += rlen;
        /* mounted with an earlier controller (e.g. memory,pids): the same cgroups */
        for (int k = CGROUP_AT_MEMORY; k < at; k++)
                if (c->root_fd[k] >= 0 && strcmp(c->v1_mount[k], mnt) == 0) {
                        c->place_of[at] = k;
                        c->controllers |= v1_bits[at];
                        free(path);
                        return 1;
                }
        char full[4096 + 600];
        snprintf(full, sizeof full, "%s%s", mnt, rel);
        int fd = -1;
        int own = strcmp(path, "/") == 0 ? 2 : open_own(full, false, &fd);
        if (own != 1) {
                *ret_why = own == 2   ? "kairosd is in the root cgroup"
                           : own == 0 ? "kairosd's cgroup is not writable (not delegated)"
                                      : "kairosd's cgroup holds other processes";
                free(path);
                return 0;
        }
        c->root_fd[at] = fd;
        c->controllers |= v1_bits[at];
        snprintf(c->v1_mount[at], sizeof c->v1_mount[at], "%s", mnt);
        size_t n = strlen(c->where);
        snprintf(c->where + n, sizeof c->where - n, "%s%s (%s, cgroup v1)", n ? ", " : "", full,
                 name);
        free(path);
        return 1;
}

int cgroup_ctl_new(struct cgroup_ctl **ret, char *why, size_t why_len)
{
        *ret = NULL;
        struct cgroup_ctl *c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        for (int at = 0; at < CGROUP_AT_N; at++) {
                c->root_fd[at] = -1;
                c->place_of[at] = at;
        }
        int r = setup_v2(c, why, why_len);
        if (r < 0)
                goto fail;
        /* each controller cgroup v2 does not give, from cgroup v1 */
        const char *v1_why = NULL;
        for (int at = CGROUP_AT_MEMORY; at < CGROUP_AT_N; at++) {
                if (c->controllers & v1_bits[at])
                        continue;
                const char *w = NULL;
                if ((r = setup_v1(c, at, &w)) < 0)
                        goto fail;
                if (r == 0 && !v1_why)
                        v1_why = w;
        }
        bool any = false;
        for (int at = 0; at < CGROUP_AT_N; at++)
                any = any || c->root_fd[at] >= 0;
        if (!any) {
                size_t n = why ? strlen(why) : 0;
                if (why && n < why_len)
                        snprintf(why + n, why_len - n, "; cgroup v1 memory: %s",
                                 v1_why ? v1_why : "none");
                cgroup_ctl_free(c);
                return 0;
        }
        for (int at = CGROUP_AT_MEMORY; at < CGROUP_AT_N; at++)
                if (!(c->controllers & v1_bits[at])) {
                        size_t n = strlen(c->missing);
                        snprintf(c->missing + n, sizeof c->missing - n, "%s%s", n ? " " : "",
                                 v1_names[at]);
                }
        *ret = c;
        return 0;
fail:
        cgroup_ctl_free(c);
        return r;
}

void cgroup_ctl_free(struct cgroup_ctl *c)
{
        if (!c)
                return;
        for (int at = 0; at < CGROUP_AT_N; at++)
                if (c->root_fd[at] >= 0)
                        close(c->root_fd[at]);
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

const char *cgroup_ctl_where(const struct cgroup_ctl *c)
{
        return c ? c->where : "";
}

int cgroup_ctl_kill_dir(const struct cgroup_ctl *c, char *buf, size_t len, bool *ret_v2)
{
        for (int at = 0; at < CGROUP_AT_N; at++) {
                if (c->root_fd[at] < 0)
                        continue;
                char link[64];
                snprintf(link, sizeof link, "/proc/self/fd/%d", c->root_fd[at]);
                ssize_t n = readlink(link, buf, len);
                if (n <= 0 || (size_t)n >= len || buf[0] != '/')
                        return -ENAMETOOLONG;
                buf[n] = '\0';
                *ret_v2 = at == CGROUP_AT_V2;
                return 0;
        }
        return -ENOENT;
}

void cgroup_handler_init(struct cgroup_handler *h)
{
        h->name[0] = '\0';
        for (int at = 0; at < CGROUP_AT_N; at++)
                h->dir_fd[at] = h->procs_fd[at] = -1;
}

bool cgroup_handler_active(const struct cgroup_handler *h)
{
        for (int at = 0; at < CGROUP_AT_N; at++)
                if (h->dir_fd[at] >= 0)
                        return true;
        return false;
}

void cgroup_handler_close_procs(struct cgroup_handler *h)
{
        for (int at = 0; at < CGROUP_AT_N; at++)
                if (h->procs_fd[at] >= 0) {
                        close(h->procs_fd[at]);
                        h->procs_fd[at] = -1;
                }
}

void cgroup_handler_abandon(struct cgroup_handler *h)
{
        cgroup_handler_close_procs(h);
        for (int at = 0; at < CGROUP_AT_N; at++)
                if (h->dir_fd[at] >= 0)
                        close(h->dir_fd[at]);
        cgroup_handler_init(h);
}

static void limit_str(uint64_t v, bool v1, char *buf, size_t len)
{
        if (v == UINT64_MAX)
                snprintf(buf, len, v1 ? "-1" : "max");
        else
                snprintf(buf, len, "%" PRIu64, v);
}

/* Remove the handler's cgroup directories (closed or not) from each hierarchy. */
static int remove_dirs(struct cgroup_ctl *c, struct cgroup_handler *h)
{
        int r = 0;
        for (int at = 0; at < CGROUP_AT_N; at++) {
                if (h->dir_fd[at] >= 0) {
                        close(h->dir_fd[at]);
                        h->dir_fd[at] = -1;
                }
                if (c->root_fd[at] >= 0 && h->name[0] &&
                    unlinkat(c->root_fd[at], h->name, AT_REMOVEDIR) < 0 && errno != ENOENT &&
                    r == 0)
                        r = -errno;
        }
        return r;
}

/* Make h->name in every hierarchy: 0, -EEXIST (none left behind), or an error. */
static int make_dirs(struct cgroup_ctl *c, struct cgroup_handler *h)
{
        for (int at = 0; at < CGROUP_AT_N; at++) {
                if (c->root_fd[at] < 0)
                        continue;
                int r = mkdirat(c->root_fd[at], h->name, 0755) < 0 ? -errno : 0;
                if (r == 0) {
                        h->dir_fd[at] = openat(c->root_fd[at], h->name,
                                               O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                        if (h->dir_fd[at] < 0) {
                                r = -errno;
                                unlinkat(c->root_fd[at], h->name, AT_REMOVEDIR);
                        }
                }
                if (r < 0) {
                        /* undo the ones made: the name is not removed where it was there before */
                        for (int k = 0; k < at; k++)
                                if (h->dir_fd[k] >= 0) {
                                        close(h->dir_fd[k]);
                                        h->dir_fd[k] = -1;
                                        unlinkat(c->root_fd[k], h->name, AT_REMOVEDIR);
                                }
                        return r;
                }
        }
        return 0;
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
                r = make_dirs(c, h);
        }
        if (r < 0) {
                cgroup_handler_init(h);
                return r;
        }
        char buf[64];
        /* a limit whose controller is missing is skipped (kairosd warned) */
        int v2 = h->dir_fd[CGROUP_AT_V2];
        if (l->memory_max && (c->v2_controllers & CGROUP_MEMORY)) {
                *ret_what = "memory.max";
                limit_str(l->memory_max, false, buf, sizeof buf);
                if ((r = write_at(v2, "memory.max", buf)) < 0)
                        goto fail;
                /* the OOM killer ends the handler as a whole, not one process of it */
                *ret_what = "memory.oom.group";
                if ((r = write_at(v2, "memory.oom.group", "1")) < 0)
                        goto fail;
        } else if (l->memory_max && (c->controllers & CGROUP_MEMORY)) {
                /* cgroup v1 has no oom.group: the OOM killer picks one process */
                *ret_what = "memory.limit_in_bytes";
                limit_str(l->memory_max, true, buf, sizeof buf);
                if ((r = write_at(h->dir_fd[CGROUP_AT_MEMORY], "memory.limit_in_bytes", buf)) < 0)
                        goto fail;
        }
        if (l->tasks_max && (c->controllers & CGROUP_PIDS)) {
                *ret_what = "pids.max";
                limit_str(l->tasks_max, false, buf, sizeof buf);
                int dir = (c->v2_controllers & CGROUP_PIDS) ? v2
                                                            : h->dir_fd[c->place_of[CGROUP_AT_PIDS]];
                if ((r = write_at(dir, "pids.max", buf)) < 0)
                        goto fail;
        }
        uint64_t quota = l->cpu_quota_pct * (CPU_PERIOD_US / 100);
        if (l->cpu_quota_pct && (c->v2_controllers & CGROUP_CPU)) {
                *ret_what = "cpu.max";
                snprintf(buf, sizeof buf, "%" PRIu64 " %d", quota, CPU_PERIOD_US);
                if ((r = write_at(v2, "cpu.max", buf)) < 0)
                        goto fail;
        } else if (l->cpu_quota_pct && (c->controllers & CGROUP_CPU)) {
                int dir = h->dir_fd[c->place_of[CGROUP_AT_CPU]];
                *ret_what = "cpu.cfs_period_us";
                snprintf(buf, sizeof buf, "%d", CPU_PERIOD_US);
                if ((r = write_at(dir, "cpu.cfs_period_us", buf)) < 0)
                        goto fail;
                *ret_what = "cpu.cfs_quota_us";
                snprintf(buf, sizeof buf, "%" PRIu64, quota);
                if ((r = write_at(dir, "cpu.cfs_quota_us", buf)) < 0)
                        goto fail;
        }
        *ret_what = "cgroup.procs";
        for (int at = 0; at < CGROUP_AT_N; at++) {
                if (h->dir_fd[at] < 0)
                        continue;
                h->procs_fd[at] = openat(h->dir_fd[at], "cgroup.procs", O_WRONLY | O_CLOEXEC);
                if (h->procs_fd[at] < 0) {
                        r = -errno;
                        goto fail;
                }
        }
        *ret_what = NULL;
        return 0;
fail:
        cgroup_handler_close_procs(h);
        remove_dirs(c, h);
        cgroup_handler_init(h);
        return r;
}

/* Is there an "oom_kill N" line with N > 0 in file of dir? */
static bool oom_kill_counted(int dir, const char *file)
{
        char buf[1024];
        if (dir < 0 || read_at(dir, file, buf, sizeof buf) < 0)
                return false;
        for (const char *p = buf; (p = strstr(p, "oom_kill ")); p += 9)
                if (p == buf || p[-1] == '\n')
                        return strtoull(p + 9, NULL, 10) > 0;
        return false;
}

bool cgroup_handler_oom_killed(const struct cgroup_handler *h)
{
        return oom_kill_counted(h->dir_fd[CGROUP_AT_V2], "memory.events") ||
               oom_kill_counted(h->dir_fd[CGROUP_AT_MEMORY], "memory.oom_control");
}

static int64_t now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Is the cgroup v2 empty ("populated 0" in cgroup.events)? */
static bool is_empty(int dir)
{
        char buf[256];
        if (read_at(dir, "cgroup.events", buf, sizeof buf) < 0)
                return true; /* gone */
        return strstr(buf, "populated 0") != NULL;
}

/* SIGKILL every pid listed in cgroup.procs, once: false if none was listed. */
static bool kill_listed(int dir)
{
        char buf[8192];
        if (read_at(dir, "cgroup.procs", buf, sizeof buf) < 0)
                return false;
        bool any = false;
        for (char *p = buf, *e; *p; p = e) {
                long pid = strtol(p, &e, 10);
                if (e == p)
                        break;
                if (pid > 0) {
                        kill((pid_t)pid, SIGKILL);
                        any = true;
                }
                while (*e == '\n')
                        e++;
        }
        return any;
}

/* cgroup.kill in v2: true if done (every process is in it). */
static bool kill_v2(const struct cgroup_handler *h)
{
        return h->dir_fd[CGROUP_AT_V2] >= 0 &&
               write_at(h->dir_fd[CGROUP_AT_V2], "cgroup.kill", "1") == 0;
}

void cgroup_handler_kill(const struct cgroup_handler *h)
{
        if (kill_v2(h))
                return;
        for (int at = 0; at < CGROUP_AT_N; at++)
                if (h->dir_fd[at] >= 0)
                        (void)kill_listed(h->dir_fd[at]);
}

/* Wait for the cgroup v2 to empty (cgroup.events raises POLLPRI), killing
 * what is listed each round without cgroup.kill. */
static int wait_v2(int dir, bool has_kill, int64_t deadline)
{
        for (;;) {
                if (!has_kill)
                        kill_listed(dir);
                if (is_empty(dir))
                        return 0;
                int64_t left = deadline - now_ms();
                if (left <= 0)
                        return -EBUSY;
                int efd = openat(dir, "cgroup.events", O_RDONLY | O_CLOEXEC);
                if (efd < 0)
                        return 0; /* gone */
                char tmp[256];
                (void)!read(efd, tmp, sizeof tmp);
                if (!is_empty(dir)) {
                        struct pollfd pfd = { .fd = efd, .events = POLLPRI };
                        (void)poll(&pfd, 1, left < 50 ? (int)left : 50);
                }
                close(efd);
        }
}

/* Without cgroup v2: kill what the v1 cgroups list until they list nothing
 * (cgroup v1 tells no event when a cgroup empties: look again every 10 ms). */
static int wait_v1(const struct cgroup_handler *h, int64_t deadline)
{
        for (;;) {
                bool any = false;
                for (int at = CGROUP_AT_MEMORY; at < CGROUP_AT_N; at++)
                        if (h->dir_fd[at] >= 0 && kill_listed(h->dir_fd[at]))
                                any = true;
                if (!any)
                        return 0;
                if (now_ms() >= deadline)
                        return -EBUSY;
                struct timespec ts = { 0, 10 * 1000 * 1000 };
                nanosleep(&ts, NULL);
        }
}

int cgroup_handler_destroy(struct cgroup_ctl *c, struct cgroup_handler *h, int timeout_ms)
{
        if (!cgroup_handler_active(h))
                return 0;
        cgroup_handler_close_procs(h);
        int64_t deadline = now_ms() + timeout_ms;
        int r = h->dir_fd[CGROUP_AT_V2] >= 0 ? wait_v2(h->dir_fd[CGROUP_AT_V2], kill_v2(h), deadline)
                                             : wait_v1(h, deadline);
        if (r < 0) {
                cgroup_handler_abandon(h);
                return r;
        }
        /* a v1 cgroup may still be busy a moment after its last task left */
        for (;;) {
                r = remove_dirs(c, h);
                if (r != -EBUSY || now_ms() >= deadline)
                        break;
                struct timespec ts = { 0, 10 * 1000 * 1000 };
                nanosleep(&ts, NULL);
        }
        cgroup_handler_init(h);
        return r;
}
