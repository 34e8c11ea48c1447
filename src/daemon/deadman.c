/* SPDX-License-Identifier: MIT */
/* deadman: see deadman.h. */
#include "deadman.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/magic.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif
#ifndef CGROUP_SUPER_MAGIC
#define CGROUP_SUPER_MAGIC 0x27e0eb
#endif

/* The watcher looks at its parent and the clock at least this often, even
 * without a deadline (a kairosd gone without an end-of-file, a resume). */
#define WATCHER_TICK_MS 1000
/* Rounds of killing what cgroup.procs lists (without cgroup.kill), and the
 * pause between two while something is still listed. */
#define CGROUP_KILL_ROUNDS 100
#define CGROUP_KILL_PAUSE_MS 5
/* How long deadman_stop waits for room in the pipe, then for the exit. */
#define STOP_SEND_MS 1000
#define STOP_EXIT_MS 1000

enum { REC_WATCH = 1, REC_UNWATCH, REC_DEADLINE, REC_STOP };

/* One message, kairosd -> watcher: one write(2), atomic in a pipe. */
struct rec {
        uint32_t type;
        int32_t pgid;
        int64_t ms;
        char cgroup[DEADMAN_CGROUP_PATH_MAX + 1];
};
_Static_assert(sizeof(struct rec) == 1024, "a record is 1 KiB");
_Static_assert(sizeof(struct rec) <= PIPE_BUF, "a record is written atomically");

struct deadman {
        int fd;          /* the write end, O_CLOEXEC | O_NONBLOCK */
        pid_t pid;       /* the watcher */
        pid_t own_pgid;  /* kairosd's process group: never watched */
        uint64_t *kills; /* shared with the watcher (deadman_kills) */
};

/* ---- small helpers (the watcher's too: no allocation) ---- */

static int64_t clock_ms(clockid_t id)
{
        struct timespec ts;
        clock_gettime(id, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void deadman_close_from(int lowfd)
{
#ifdef SYS_close_range
        if (syscall(SYS_close_range, (unsigned)lowfd, ~0U, 0) == 0)
                return;
#endif
        long max = sysconf(_SC_OPEN_MAX);
        if (max < 0 || max > 1 << 20)
                max = 1 << 20;
        for (long fd = lowfd; fd < max; fd++)
                close((int)fd);
}

/* "/proc/PID/stat" into buf (at least 32 bytes). */
static void stat_path(pid_t pid, char *buf)
{
        char digits[16];
        int n = 0;
        unsigned v = (unsigned)pid;
        do {
                digits[n++] = (char)('0' + v % 10);
                v /= 10;
        } while (v);
        memcpy(buf, "/proc/", 6);
        size_t at = 6;
        while (n)
                buf[at++] = digits[--n];
        memcpy(buf + at, "/stat", 6);
}

/* Parent, process group and start time (clock ticks after boot) of pid,
 * from /proc/PID/stat.  0 or a negative errno. */
static int read_stat(pid_t pid, pid_t *ret_ppid, pid_t *ret_pgrp, uint64_t *ret_start)
{
        char path[32], buf[2048];
        stat_path(pid, path);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        ssize_t k;
        while ((k = read(fd, buf, sizeof buf - 1)) < 0 && errno == EINTR)
                ;
        int e = errno;
        close(fd);
        if (k < 0)
                return -e;
        buf[k] = '\0';
        /* the name may hold anything, ')' and spaces included: the fields
         * start after the last ')', with field 3 (the state) */
        char *p = strrchr(buf, ')');
        if (!p)
                return -EINVAL;
        p++;
        uint64_t field[23] = { 0 };
        for (int i = 3; i <= 22; i++) {
                while (*p == ' ')
                        p++;
                if (!*p)
                        return -EINVAL;
                uint64_t v = 0;
                for (; *p && *p != ' '; p++)
                        if (*p >= '0' && *p <= '9')
                                v = v * 10 + (uint64_t)(*p - '0');
                field[i] = v;
        }
        *ret_ppid = (pid_t)field[4];
        *ret_pgrp = (pid_t)field[5];
        *ret_start = field[22];
        return 0;
}

/* ---- the watcher (a forked process: no allocation after start) ---- */

struct entry {
        pid_t pgid;
        uint64_t start;  /* the leader's start time when watched, 0 unknown */
        char cgroup[DEADMAN_CGROUP_PATH_MAX + 1];
};

struct watcher {
        int fd;
        pid_t self, kairosd, kairosd_pgid;
        struct entry *e;
        size_t n, max;
        bool overflow;       /* a watch could not be kept */
        int64_t deadline;    /* CLOCK_BOOTTIME ms, 0 none */
        uint64_t *kills;     /* the kills at a deadline, shared with kairosd */
        bool eof, stop;
        struct rec in;       /* a record being read */
        size_t have;
};

static bool group_ok(const struct watcher *w, pid_t pgid)
{
        return pgid > 1 && pgid != w->self && pgid != w->kairosd && pgid != w->kairosd_pgid;
}

/* Call fn on each pid cgroup.procs below dir lists (not the watcher's nor
 * kairosd's).  How many were listed. */
static size_t each_listed(const struct watcher *w, int dir, void (*fn)(pid_t))
{
        int fd = openat(dir, "cgroup.procs", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return 0;
        size_t count = 0;
        uint64_t v = 0;
        bool digits = false;
        char buf[4096];
        for (;;) {
                ssize_t k = read(fd, buf, sizeof buf);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0)
                        break;
                for (ssize_t i = 0; i <= k; i++) {
                        if (i < k && buf[i] >= '0' && buf[i] <= '9') {
                                if (v < (uint64_t)INT_MAX)
                                        v = v * 10 + (uint64_t)(buf[i] - '0');
                                digits = true;
                                continue;
                        }
                        if (i == k)
                                break; /* a number may go on in the next read */
                        if (digits && v > 1 && v <= (uint64_t)INT_MAX &&
                            (pid_t)v != w->self && (pid_t)v != w->kairosd) {
                                count++;
                                if (fn)
                                        fn((pid_t)v);
                        }
                        v = 0;
                        digits = false;
                }
        }
        if (digits && v > 1 && v <= (uint64_t)INT_MAX && (pid_t)v != w->self &&
            (pid_t)v != w->kairosd) {
                count++;
                if (fn)
                        fn((pid_t)v);
        }
        close(fd);
        return count;
}

static void kill_pid(pid_t pid)
{
        kill(pid, SIGKILL);
}

/* The cgroup directory, if it is one (a cgroup file system), or -1. */
static int open_cgroup(const char *path)
{
        if (!path[0])
                return -1;
        int dir = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir < 0)
                return -1;
        struct statfs sf;
        if (fstatfs(dir, &sf) < 0 ||
            (sf.f_type != CGROUP2_SUPER_MAGIC && sf.f_type != CGROUP_SUPER_MAGIC)) {
                close(dir);
                return -1;
        }
        return dir;
}

static void kill_cgroup(const struct watcher *w, const char *path)
{
        int dir = open_cgroup(path);
        if (dir < 0)
                return;
        int kfd = openat(dir, "cgroup.kill", O_WRONLY | O_CLOEXEC);
        if (kfd >= 0) {
                bool done = write(kfd, "1", 1) == 1;
                close(kfd);
                if (done) {
                        close(dir);
                        return;
                }
        }
        /* cgroup v1, or before Linux 5.14: what is listed, until nothing is */
        for (int round = 0; round < CGROUP_KILL_ROUNDS; round++) {
                if (each_listed(w, dir, kill_pid) == 0)
                        break;
                poll(NULL, 0, CGROUP_KILL_PAUSE_MS);
        }
        close(dir);
}

/* Is e's group id still the group it was watched as?  No only when its
 * leader's id now belongs to a process started at another time. */
static bool same_group(const struct entry *e)
{
        pid_t ppid, pgrp;
        uint64_t start;
        if (e->start == 0 || read_stat(e->pgid, &ppid, &pgrp, &start) < 0)
                return true;
        return start == e->start;
}

static void kill_entry(const struct watcher *w, const struct entry *e)
{
        if (group_ok(w, e->pgid) && same_group(e))
                kill(-e->pgid, SIGKILL);
        kill_cgroup(w, e->cgroup);
}

/* Overflowed: kill the group of every child of kairosd that leads its own
 * (handlers), as long as kairosd is still our parent (its pid is its). */
static void kill_lost_groups(const struct watcher *w)
{
        if (getppid() != w->kairosd)
                return;
        int dir = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir < 0)
                return;
        char buf[4096] __attribute__((aligned(8)));
        for (;;) {
                long k = syscall(SYS_getdents64, dir, buf, sizeof buf);
                if (k <= 0)
                        break;
                for (long at = 0; at < k;) {
                        /* struct linux_dirent64: ino, off, reclen, type, name */
                        unsigned short reclen;
                        memcpy(&reclen, buf + at + 16, sizeof reclen);
                        const char *name = buf + at + 19;
                        at += reclen;
                        uint64_t v = 0;
                        const char *c = name;
                        for (; *c >= '0' && *c <= '9' && v < (uint64_t)INT_MAX; c++)
                                v = v * 10 + (uint64_t)(*c - '0');
                        if (*c || c == name || v > (uint64_t)INT_MAX)
                                continue;
                        pid_t pid = (pid_t)v, ppid, pgrp;
                        uint64_t start;
                        if (group_ok(w, pid) && read_stat(pid, &ppid, &pgrp, &start) == 0 &&
                            ppid == w->kairosd && pgrp == pid)
                                kill(-pid, SIGKILL);
                }
        }
        close(dir);
}

static void kill_all(struct watcher *w)
{
        for (size_t i = 0; i < w->n; i++)
                kill_entry(w, &w->e[i]);
        w->n = 0;
        if (w->overflow)
                kill_lost_groups(w);
        w->overflow = false;
}

static struct entry *find(struct watcher *w, pid_t pgid)
{
        for (size_t i = 0; i < w->n; i++)
                if (w->e[i].pgid == pgid)
                        return &w->e[i];
        return NULL;
}

/* Forget groups that no longer exist and whose cgroup (if any) is empty. */
static void prune(struct watcher *w)
{
        for (size_t i = 0; i < w->n;) {
                struct entry *e = &w->e[i];
                bool alive = kill(-e->pgid, 0) == 0 || errno != ESRCH;
                if (!alive) {
                        int dir = open_cgroup(e->cgroup);
                        if (dir >= 0) {
                                alive = each_listed(w, dir, NULL) > 0;
                                close(dir);
                        }
                }
                if (alive)
                        i++;
                else
                        *e = w->e[--w->n];
        }
}

static void watch(struct watcher *w, const struct rec *r)
{
        if (!group_ok(w, r->pgid))
                return;
        struct entry *e = find(w, r->pgid);
        if (!e) {
                if (w->n == w->max)
                        prune(w);
                if (w->n == w->max) {
                        w->overflow = true;
                        return;
                }
                e = &w->e[w->n++];
        }
        e->pgid = r->pgid;
        pid_t ppid, pgrp;
        if (read_stat(r->pgid, &ppid, &pgrp, &e->start) < 0)
                e->start = 0;
        e->cgroup[0] = '\0';
        if (memchr(r->cgroup, '\0', sizeof r->cgroup) && r->cgroup[0] == '/')
                memcpy(e->cgroup, r->cgroup, sizeof e->cgroup);
}

static void apply(struct watcher *w, const struct rec *r)
{
        switch (r->type) {
        case REC_WATCH:
                watch(w, r);
                break;
        case REC_UNWATCH: {
                struct entry *e = find(w, r->pgid);
                if (e)
                        *e = w->e[--w->n];
                break;
        }
        case REC_DEADLINE:
                if (r->ms == 0)
                        w->deadline = 0;
                else if (r->ms > 0) /* the same instant on CLOCK_BOOTTIME (>= ms > 0) */
                        w->deadline = r->ms - clock_ms(CLOCK_MONOTONIC) +
                                      clock_ms(CLOCK_BOOTTIME);
                break;
        case REC_STOP:
                w->stop = true;
                break;
        default:
                break;
        }
}

/* Read every record written so far. */
static void drain(struct watcher *w)
{
        while (!w->stop) {
                ssize_t k = read(w->fd, (char *)&w->in + w->have, sizeof w->in - w->have);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                        return;
                if (k <= 0) {
                        w->eof = true; /* kairosd is gone (or the pipe broke) */
                        return;
                }
                w->have += (size_t)k;
                if (w->have == sizeof w->in) {
                        apply(w, &w->in);
                        w->have = 0;
                }
        }
}

static void watcher_setup(int *fd)
{
        static const int ignore[] = { SIGINT,  SIGTERM, SIGHUP,  SIGQUIT, SIGTSTP,
                                      SIGTTIN, SIGTTOU, SIGUSR1, SIGUSR2, SIGPIPE };
        for (size_t i = 0; i < sizeof ignore / sizeof ignore[0]; i++)
                signal(ignore[i], SIG_IGN);
        signal(SIGCHLD, SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        /* a group of its own: what is sent to kairosd's group is not for us */
        (void)setpgid(0, 0);
        if (*fd != 3) {
                if (dup2(*fd, 3) < 0)
                        _exit(1);
                *fd = 3;
        }
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null >= 0) {
                dup2(null, 0);
                dup2(null, 1);
        }
        deadman_close_from(4); /* stderr stays: a sanitizer's report goes somewhere */
        prctl(PR_SET_NAME, "kairosd-deadman");
        int fl = fcntl(3, F_GETFL);
        if (fl < 0 || fcntl(3, F_SETFL, fl | O_NONBLOCK) < 0)
                _exit(1);
}

__attribute__((noreturn)) static void watcher_main(int fd, pid_t kairosd, pid_t kairosd_pgid,
                                                   unsigned max, uint64_t *kills)
{
        watcher_setup(&fd);
        struct watcher w = { .fd = fd, .self = getpid(), .kairosd = kairosd,
                             .kairosd_pgid = kairosd_pgid, .max = max, .kills = kills };
        w.e = mmap(NULL, max * sizeof(struct entry), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (w.e == MAP_FAILED)
                _exit(1);
        for (;;) {
                drain(&w);
                if (w.stop)
                        _exit(0);
                if (w.eof || getppid() != kairosd) {
                        kill_all(&w);
                        _exit(0);
                }
                int64_t now = clock_ms(CLOCK_BOOTTIME), timeout = WATCHER_TICK_MS;
                if (w.deadline) {
                        if (now >= w.deadline) {
                                /* counted before the kill: kairosd reaps
                                 * a handler only after it died */
                                if (w.n || w.overflow)
                                        __atomic_add_fetch(w.kills, 1, __ATOMIC_SEQ_CST);
                                kill_all(&w);
                        } else if (w.deadline - now < timeout) {
                                timeout = w.deadline - now;
                        }
                }
                struct pollfd p = { .fd = fd, .events = POLLIN };
                (void)poll(&p, 1, (int)timeout);
        }
}

/* ---- kairosd's side ---- */

int deadman_start_max(struct deadman **ret, unsigned max_watched)
{
        if (max_watched == 0 || max_watched > DEADMAN_MAX_WATCHED)
                return -EINVAL;
        struct deadman *dm = calloc(1, sizeof(*dm));
        if (!dm)
                return -ENOMEM;
        int p[2] = { -1, -1 };
        int r;
        dm->kills = mmap(NULL, sizeof(*dm->kills), PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (dm->kills == MAP_FAILED) {
                r = -errno;
                dm->kills = NULL;
                goto fail;
        }
        if (pipe2(p, O_CLOEXEC) < 0) {
                r = -errno;
                goto fail;
        }
        /* room for a stalled watcher: 1 MiB is 1024 records (best effort) */
        (void)fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
        int fl = fcntl(p[1], F_GETFL);
        if (fl < 0 || fcntl(p[1], F_SETFL, fl | O_NONBLOCK) < 0) {
                r = -errno;
                goto fail;
        }
        pid_t me = getpid(), my_pgid = getpgrp();
        pid_t pid = fork();
        if (pid < 0) {
                r = -errno;
                goto fail;
        }
        if (pid == 0) {
                close(p[1]);
                watcher_main(p[0], me, my_pgid, max_watched, dm->kills);
        }
        close(p[0]);
        dm->fd = p[1];
        dm->pid = pid;
        dm->own_pgid = my_pgid;
        *ret = dm;
        return 0;
fail:
        if (p[0] >= 0) {
                close(p[0]);
                close(p[1]);
        }
        if (dm->kills)
                munmap(dm->kills, sizeof(*dm->kills));
        free(dm);
        return r;
}

int deadman_start(struct deadman **ret)
{
        return deadman_start_max(ret, DEADMAN_MAX_WATCHED);
}

/* Both also called in a handler's child between clone(CLONE_VM) and exec
 * (runner.c): not instrumented, like the runner's child_main. */
__attribute__((no_sanitize("address", "undefined"))) static void rec_init(struct rec *r,
                                                                        uint32_t type)
{
        memset(r, 0, sizeof *r);
        r->type = type;
}

__attribute__((no_sanitize("address", "undefined"))) static int send_rec(const struct deadman *dm,
                                                                       const struct rec *r)
{
        for (;;) {
                ssize_t k = write(dm->fd, r, sizeof *r);
                if (k == (ssize_t)sizeof *r)
                        return 0;
                if (k >= 0)
                        return -EIO; /* cannot happen: at most PIPE_BUF bytes */
                if (errno != EINTR)
                        return -errno;
        }
}

int deadman_set_deadline(struct deadman *dm, int64_t mono_ms)
{
        if (mono_ms < 0)
                return -EINVAL;
        struct rec r;
        rec_init(&r, REC_DEADLINE);
        r.ms = mono_ms;
        return send_rec(dm, &r);
}

__attribute__((no_sanitize("address", "undefined"))) int deadman_watch(struct deadman *dm, pid_t pgid,
                                                                         const char *cgroup_dir)
{
        if (pgid <= 1 || pgid == dm->own_pgid || pgid == dm->pid)
                return -EINVAL;
        struct rec r;
        rec_init(&r, REC_WATCH);
        r.pgid = pgid;
        if (cgroup_dir && cgroup_dir[0]) {
                /* by hand: no libc string call in a child before exec */
                if (cgroup_dir[0] != '/')
                        return -EINVAL;
                size_t n = 0;
                for (; cgroup_dir[n]; n++) {
                        if (n == DEADMAN_CGROUP_PATH_MAX)
                                return -ENAMETOOLONG;
                        r.cgroup[n] = cgroup_dir[n];
                }
                for (size_t k = 1; k + 1 < n; k++) /* no ".." component */
                        if (r.cgroup[k - 1] == '/' && r.cgroup[k] == '.' && r.cgroup[k + 1] == '.' &&
                            (k + 2 == n || r.cgroup[k + 2] == '/'))
                                return -EINVAL;
        }
        return send_rec(dm, &r);
}

int deadman_unwatch(struct deadman *dm, pid_t pgid)
{
        if (pgid <= 1)
                return -EINVAL;
        struct rec r;
        rec_init(&r, REC_UNWATCH);
        r.pgid = pgid;
        return send_rec(dm, &r);
}

pid_t deadman_pid(const struct deadman *dm)
{
        return dm->pid;
}

uint64_t deadman_kills(const struct deadman *dm)
{
        return dm ? __atomic_load_n(dm->kills, __ATOMIC_SEQ_CST) : 0;
}

bool deadman_reap_within(pid_t pid, int pidfd, int ms)
{
        int64_t until = clock_ms(CLOCK_MONOTONIC) + ms;
        for (;;) {
                pid_t k = waitpid(pid, NULL, WNOHANG);
                if (k == pid || (k < 0 && errno != EINTR))
                        return false; /* reaped, or not ours to reap */
                if (k < 0)
                        continue;
                int64_t left = until - clock_ms(CLOCK_MONOTONIC);
                if (left <= 0)
                        break;
                /* a pidfd turns readable at the exit; without one, poll */
                struct pollfd p = { .fd = pidfd, .events = POLLIN };
                if (pidfd >= 0)
                        (void)poll(&p, 1, (int)left);
                else
                        (void)poll(NULL, 0, left < 5 ? (int)left : 5);
        }
        kill(pid, SIGKILL);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
                ;
        return true;
}

void deadman_stop(struct deadman *dm)
{
        if (!dm)
                return;
        struct rec r;
        rec_init(&r, REC_STOP);
        int64_t until = clock_ms(CLOCK_MONOTONIC) + STOP_SEND_MS;
        while (send_rec(dm, &r) == -EAGAIN) {
                int64_t left = until - clock_ms(CLOCK_MONOTONIC);
                if (left <= 0)
                        break; /* it will see end-of-file instead */
                struct pollfd p = { .fd = dm->fd, .events = POLLOUT };
                (void)poll(&p, 1, (int)left);
        }
        close(dm->fd);
        (void)deadman_reap_within(dm->pid, -1, STOP_EXIT_MS);
        munmap(dm->kills, sizeof(*dm->kills));
        free(dm);
}
