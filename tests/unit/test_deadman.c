/* SPDX-License-Identifier: MIT */
/* deadman: the watcher kills watched process groups (and cgroups) at the
 * deadline or when kairosd dies, and nothing else.  Real processes: each
 * "handler" is a child of this test leading its own process group, running
 * sleep 1000, with a grandchild running sleep 1000 too.  This test is a
 * child subreaper, so the grandchildren come back to it to be reaped.  No
 * sleep synchronizes: the test waits for a process to end (polling its
 * state with a deadline), or for the clock to pass the instant it tests. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "deadman.h"

/* How long a kill may take on a loaded machine (not a timing claim). */
#define GONE_MS 10000

static int64_t now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Let the clock pass t (what is tested is what happens by then). */
static void until(int64_t t)
{
        for (int64_t left; (left = t - now_ms()) > 0;)
                poll(NULL, 0, (int)left);
}

/* pid exists and has not exited (a zombie has). */
static bool running(pid_t pid)
{
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return false;
        ssize_t k = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (k <= 0)
                return false;
        buf[k] = '\0';
        char *p = strrchr(buf, ')');
        return p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

struct group {
        pid_t leader;     /* also the group id */
        pid_t grandchild; /* in the group, or in a session of its own */
        int leader_status, grandchild_status;
        bool leader_reaped, grandchild_reaped;
};

/* Every group spawned, for the end of a failed test. */
static pid_t spawned[64][2];
static size_t nspawned;
static char cgroup_made[1200];

/* A handler-like group: the leader joins cgroup_procs (if given) before
 * anything, starts the grandchild (setsid or not), execs sleep 1000; the
 * grandchild tells its pid once it is set up.  Their stdout and stderr are
 * /dev/null (the test's are the test runner's pipes). */
static void spawn_group(struct group *g, bool grandchild_setsid, const char *cgroup_procs)
{
        memset(g, 0, sizeof *g);
        int p[2];
        assert_int_equal(pipe2(p, O_CLOEXEC), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                setpgid(0, 0);
                int null = open("/dev/null", O_RDWR);
                if (null < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0)
                        _exit(126);
                if (cgroup_procs) {
                        int fd = open(cgroup_procs, O_WRONLY | O_CLOEXEC);
                        if (fd < 0 || write(fd, "0", 1) != 1)
                                _exit(126);
                        close(fd);
                }
                pid_t gc = fork();
                if (gc == 0) {
                        if (grandchild_setsid && setsid() < 0)
                                _exit(126);
                        gc = getpid();
                        if (write(p[1], &gc, sizeof gc) != sizeof gc)
                                _exit(126);
                        execlp("sleep", "sleep", "1000", (char *)NULL);
                        _exit(127);
                }
                if (gc < 0)
                        _exit(126);
                execlp("sleep", "sleep", "1000", (char *)NULL);
                _exit(127);
        }
        (void)setpgid(pid, pid); /* either of us may be first */
        close(p[1]);
        pid_t gc = 0;
        ssize_t k = read(p[0], &gc, sizeof gc);
        close(p[0]);
        if (nspawned < sizeof spawned / sizeof spawned[0]) {
                spawned[nspawned][0] = pid;
                spawned[nspawned++][1] = k == (ssize_t)sizeof gc ? gc : 0;
        }
        assert_int_equal(k, (ssize_t)sizeof gc);
        g->leader = pid;
        g->grandchild = gc;
        assert_true(running(g->leader));
        assert_true(running(g->grandchild));
}

static void reap(struct group *g)
{
        if (!g->leader_reaped && waitpid(g->leader, &g->leader_status, WNOHANG) == g->leader)
                g->leader_reaped = true;
        /* ours once the leader is gone (we are a subreaper) */
        if (!g->grandchild_reaped &&
            waitpid(g->grandchild, &g->grandchild_status, WNOHANG) == g->grandchild)
                g->grandchild_reaped = true;
}

static bool gone(struct group *g)
{
        reap(g);
        return !running(g->leader) && !running(g->grandchild);
}

/* Wait for both to end; when it was first seen (ms), or -1 if not by
 * GONE_MS. */
static int64_t wait_gone(struct group *g)
{
        int64_t end = now_ms() + GONE_MS;
        for (;;) {
                if (gone(g))
                        break;
                if (now_ms() > end)
                        return -1;
                poll(NULL, 0, 2);
        }
        int64_t seen = now_ms();
        /* both reaped, so that no zombie holds a pid */
        while (!g->leader_reaped || !g->grandchild_reaped) {
                reap(g);
                if (now_ms() > end)
                        break;
                poll(NULL, 0, 2);
        }
        assert_true(g->leader_reaped);
        assert_true(g->grandchild_reaped);
        return seen;
}

static void assert_killed(const struct group *g)
{
        assert_true(WIFSIGNALED(g->leader_status));
        assert_int_equal(WTERMSIG(g->leader_status), SIGKILL);
        assert_true(WIFSIGNALED(g->grandchild_status));
        assert_int_equal(WTERMSIG(g->grandchild_status), SIGKILL);
}

/* The end of a group the deadman left alone. */
static void end_group(struct group *g)
{
        kill(-g->leader, SIGKILL);
        kill(g->grandchild, SIGKILL);
        assert_true(wait_gone(g) >= 0);
}

static bool still_running(const struct group *g)
{
        return running(g->leader) && running(g->grandchild);
}

/* Alive when looked at before the deadline (a loaded machine may look too
 * late: then nothing is shown either way). */
static void assert_alive_before(const struct group *g, int64_t deadline)
{
        bool alive = still_running(g);
        if (now_ms() < deadline)
                assert_true(alive);
}

static void test_deadline_kills_group(void **state)
{
        (void)state;
        struct deadman *dm = NULL;
        assert_int_equal(deadman_start(&dm), 0);
        struct group g;
        spawn_group(&g, false, NULL);
        assert_int_equal(deadman_watch(dm, g.leader, NULL), 0);
        assert_int_equal(deadman_kills(dm), 0);
        int64_t deadline = now_ms() + 300;
        assert_int_equal(deadman_set_deadline(dm, deadline), 0);
        assert_alive_before(&g, deadline);
        int64_t seen = wait_gone(&g);
        assert_true(seen >= 0);
        assert_true(seen >= deadline); /* not before it */
        assert_killed(&g);
        /* counted before the kill: kairosd sees it once the group is gone */
        assert_int_equal(deadman_kills(dm), 1);
        assert_int_equal(deadman_kills(NULL), 0);
        /* the watcher lives on */
        assert_int_equal(kill(deadman_pid(dm), 0), 0);
        deadman_stop(dm);
}

static void test_not_before_deadline(void **state)
{
        (void)state;
        struct deadman *dm = NULL;
        assert_int_equal(deadman_start(&dm), 0);
        struct group g;
        spawn_group(&g, false, NULL);
        assert_int_equal(deadman_watch(dm, g.leader, NULL), 0);
        int64_t deadline = now_ms() + 1500;
        assert_int_equal(deadman_set_deadline(dm, deadline), 0);
        until(deadline - 700);
        bool alive = still_running(&g);
        /* conclusive only when looked at before the deadline */
        if (now_ms() < deadline)
                assert_true(alive);
        assert_true(wait_gone(&g) >= deadline);
        assert_killed(&g);
        deadman_stop(dm);
}

static void test_renewal_keeps_alive(void **state)
{
        (void)state;
        struct deadman *dm = NULL;
        assert_int_equal(deadman_start(&dm), 0);
        struct group g;
        spawn_group(&g, false, NULL);
        assert_int_equal(deadman_watch(dm, g.leader, NULL), 0);
        int64_t old = now_ms() + 1000;
        assert_int_equal(deadman_set_deadline(dm, old), 0);
        assert_int_equal(deadman_set_deadline(dm, now_ms() + 120000), 0);
        until(old + 700);
        assert_true(still_running(&g));
        assert_int_equal(deadman_kills(dm), 0); /* the renewal came first */
        /* shortened to now: it dies (the renewal was what kept it) */
        assert_int_equal(deadman_set_deadline(dm, now_ms()), 0);
        assert_true(wait_gone(&g) >= 0);
        assert_killed(&g);
        deadman_stop(dm);
}

static void test_unwatch_spares(void **state)
{
        (void)state;
        struct deadman *dm = NULL;
        assert_int_equal(deadman_start(&dm), 0);
        struct group a, b;
        spawn_group(&a, false, NULL);
        spawn_group(&b, false, NULL);
        assert_int_equal(deadman_watch(dm, a.leader, NULL), 0);
        assert_int_equal(deadman_watch(dm, b.leader, NULL), 0);
        assert_int_equal(deadman_unwatch(dm, a.leader), 0);
        assert_int_equal(deadman_unwatch(dm, 4242424), 0); /* unknown: nothing */
        assert_int_equal(deadman_set_deadline(dm, now_ms() + 300), 0);
        assert_true(wait_gone(&b) >= 0);
        assert_killed(&b);
        /* the records are read in order: a was forgotten before b died */
        assert_true(still_running(&a));
        deadman_stop(dm);
        end_group(&a);
}

static void test_no_deadline_no_kill(void **state)
{
        (void)state;
        struct deadman *dm = NULL;
        assert_int_equal(deadman_start(&dm), 0);
        struct group a, b;
        spawn_group(&a, false, NULL);
        spawn_group(&b, false, NULL);
        assert_int_equal(deadman_watch(dm, a.leader, NULL), 0);
        int64_t deadline = now_ms() + 1500;
        assert_int_equal(deadman_set_deadline(dm, deadline), 0);
        assert_int_equal(deadman_set_deadline(dm, 0), 0); /* none after all */
        assert_int_equal(deadman_watch(dm, b.leader, NULL), 0);
        assert_int_equal(deadman_unwatch(dm, b.leader), 0);
        until(deadline + 500);
        assert_true(still_running(&a));
        assert_true(still_running(&b));
        /* a deadline again: a was watched all along, b was not */
        assert_int_equal(deadman_set_deadline(dm, now_ms()), 0);
        assert_true(wait_gone(&a) >= 0);
        assert_killed(&a);
        assert_true(still_running(&b));
        deadman_stop(dm);
        end_group(&b);
}

static void test_watch_after_deadline_killed_at_once(void **state)
{
        (void)state;
        struct deadman *dm = NULL;
        assert_int_equal(deadman_start(&dm), 0);
        assert_int_equal(deadman_set_deadline(dm, now_ms() - 1), 0);
        struct group g;
        spawn_group(&g, false, NULL);
        assert_int_equal(deadman_watch(dm, g.leader, NULL), 0);
        assert_true(wait_gone(&g) >= 0);
        assert_killed(&g);
        deadman_stop(dm);
}

/* "kairosd" (a child of this test) starts the deadman, watches a group and
 * dies without deadman_stop: the watcher kills the group, then exits. */
static void test_eof_kills_and_exits(void **state)
{
        (void)state;
        struct group g;
        spawn_group(&g, false, NULL);
        int rep[2], go[2];
        assert_int_equal(pipe2(rep, O_CLOEXEC), 0);
        assert_int_equal(pipe2(go, O_CLOEXEC), 0);
        pid_t k = fork();
        assert_true(k >= 0);
        if (k == 0) {
                struct deadman *dm = NULL;
                if (deadman_start(&dm) < 0 || deadman_watch(dm, g.leader, NULL) < 0)
                        _exit(1);
                pid_t w = deadman_pid(dm);
                char c;
                if (write(rep[1], &w, sizeof w) != sizeof w || read(go[0], &c, 1) != 1)
                        _exit(1);
                _exit(0); /* as if killed: no deadman_stop */
        }
        close(rep[1]);
        close(go[0]);
        pid_t w = 0;
        assert_int_equal(read(rep[0], &w, sizeof w), (ssize_t)sizeof w);
        close(rep[0]);
        assert_true(w > 1);
        assert_true(still_running(&g));
        assert_int_equal(write(go[1], "x", 1), 1);
        close(go[1]);
        int st;
        assert_int_equal(waitpid(k, &st, 0), k);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        assert_true(wait_gone(&g) >= 0);
        assert_killed(&g);
        /* the watcher exited (it is ours to reap now: subreaper) */
        int64_t end = now_ms() + GONE_MS;
        pid_t r;
        while ((r = waitpid(w, &st, WNOHANG)) == 0 && now_ms() < end)
                poll(NULL, 0, 2);
        assert_int_equal(r, w);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
}

static void test_stop_kills_nothing(void **state)
{
        (void)state;
        struct deadman *dm = NULL;
        assert_int_equal(deadman_start(&dm), 0);
        pid_t w = deadman_pid(dm);
        struct group g;
        spawn_group(&g, false, NULL);
        assert_int_equal(deadman_watch(dm, g.leader, NULL), 0);
        int64_t deadline = now_ms() + 1500;
        assert_int_equal(deadman_set_deadline(dm, deadline), 0);
        deadman_stop(dm);
        /* reaped by deadman_stop */
        assert_int_equal(waitpid(w, NULL, WNOHANG), -1);
        assert_int_equal(errno, ECHILD);
        until(deadline + 500);
        assert_true(still_running(&g));
        end_group(&g);
        deadman_stop(NULL);
}

/* What a terminal or a kill of kairosd's group sends does not stop it. */
static void test_watcher_shape(void **state)
{
        (void)state;
        struct deadman *dm = NULL;
        assert_int_equal(deadman_start(&dm), 0);
        pid_t w = deadman_pid(dm);
        struct group g;
        spawn_group(&g, false, NULL);
        assert_int_equal(deadman_watch(dm, g.leader, NULL), 0);
        /* a group of its own (set after its signals: then they are ignored) */
        int64_t end = now_ms() + GONE_MS;
        while (getpgid(w) != w && now_ms() < end)
                poll(NULL, 0, 2);
        assert_int_equal(getpgid(w), w);
        assert_int_not_equal(getpgid(w), getpgrp());
        int sigs[] = { SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGTSTP, SIGUSR1, SIGUSR2, SIGPIPE };
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
                assert_int_equal(kill(w, sigs[i]), 0);
                assert_int_equal(kill(-w, sigs[i]), 0);
        }
        assert_int_equal(deadman_set_deadline(dm, now_ms()), 0);
        assert_true(wait_gone(&g) >= 0); /* it did its job after all those */
        assert_killed(&g);
        assert_int_equal(waitpid(w, NULL, WNOHANG), 0);
        char path[64], comm[64] = "";
        snprintf(path, sizeof path, "/proc/%d/comm", (int)w);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        assert_non_null(fgets(comm, sizeof comm, f));
        fclose(f);
        assert_string_equal(comm, "kairosd-deadman\n");
        /* only stdin, stdout (/dev/null), stderr and its pipe are open */
        snprintf(path, sizeof path, "/proc/%d/fd", (int)w);
        DIR *d = opendir(path);
        assert_non_null(d);
        int n = 0, highest = -1;
        for (struct dirent *e; (e = readdir(d));) {
                if (e->d_name[0] == '.')
                        continue;
                n++;
                if (atoi(e->d_name) > highest)
                        highest = atoi(e->d_name);
        }
        closedir(d);
        assert_int_equal(n, 4);
        assert_int_equal(highest, 3);
        deadman_stop(dm);
}

static void test_bad_input(void **state)
{
        (void)state;
        struct deadman *dm = NULL;
        assert_int_equal(deadman_start(&dm), 0);
        assert_int_equal(deadman_watch(dm, 0, NULL), -EINVAL);
        assert_int_equal(deadman_watch(dm, 1, NULL), -EINVAL);
        assert_int_equal(deadman_watch(dm, -1, NULL), -EINVAL);
        assert_int_equal(deadman_watch(dm, -1234, NULL), -EINVAL);
        assert_int_equal(deadman_watch(dm, getpgrp(), NULL), -EINVAL);
        assert_int_equal(deadman_watch(dm, deadman_pid(dm), NULL), -EINVAL);
        assert_int_equal(deadman_unwatch(dm, 0), -EINVAL);
        assert_int_equal(deadman_unwatch(dm, 1), -EINVAL);
        assert_int_equal(deadman_unwatch(dm, -7), -EINVAL);
        assert_int_equal(deadman_set_deadline(dm, -1), -EINVAL);
        struct group g;
        spawn_group(&g, false, NULL);
        assert_int_equal(deadman_watch(dm, g.leader, "sys/fs/cgroup/x"), -EINVAL);
        assert_int_equal(deadman_watch(dm, g.leader, "/sys/fs/cgroup/../../etc"), -EINVAL);
        assert_int_equal(deadman_watch(dm, g.leader, "/sys/fs/cgroup/x/.."), -EINVAL);
        char longp[DEADMAN_CGROUP_PATH_MAX + 2];
        memset(longp, 'a', sizeof longp - 1);
        longp[0] = '/';
        longp[sizeof longp - 1] = '\0';
        assert_int_equal(deadman_watch(dm, g.leader, longp), -ENAMETOOLONG);
        longp[DEADMAN_CGROUP_PATH_MAX] = '\0'; /* the longest allowed */
        assert_int_equal(deadman_watch(dm, g.leader, longp), 0);
        assert_int_equal(deadman_watch(dm, g.leader, "/no/such/x..y"), 0); /* a name, not ".." */
        /* a directory that is no cgroup: its "cgroup.kill" is not written */
        char dir[] = "/tmp/deadman-test-XXXXXX";
        assert_non_null(mkdtemp(dir));
        char file[64];
        snprintf(file, sizeof file, "%s/cgroup.kill", dir);
        int fd = open(file, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        close(fd);
        assert_int_equal(deadman_watch(dm, g.leader, dir), 0);
        assert_int_equal(deadman_set_deadline(dm, now_ms()), 0);
        assert_true(wait_gone(&g) >= 0); /* the group all the same */
        assert_killed(&g);
        struct stat st;
        assert_int_equal(stat(file, &st), 0);
        assert_int_equal(st.st_size, 0);
        unlink(file);
        rmdir(dir);
        /* and this process, its group and the watcher are still here */
        assert_int_equal(kill(deadman_pid(dm), 0), 0);
        deadman_stop(dm);
}

/* The pipe full (the watcher stopped): a write fails at once, nothing
 * blocks; the watcher, continued, reads it all and works.  A dead watcher
 * is -EPIPE. */
static void test_full_pipe_and_dead_watcher(void **state)
{
        (void)state;
        struct deadman *dm = NULL;
        assert_int_equal(deadman_start(&dm), 0);
        pid_t w = deadman_pid(dm);
        struct group g;
        spawn_group(&g, false, NULL);
        assert_int_equal(kill(w, SIGSTOP), 0);
        int r = 0;
        int64_t t0 = now_ms();
        for (int i = 0; i < 100000 && (r = deadman_unwatch(dm, 4242424)) == 0; i++)
                ;
        assert_int_equal(r, -EAGAIN);
        assert_int_equal(deadman_watch(dm, g.leader, NULL), -EAGAIN);
        assert_true(now_ms() - t0 < GONE_MS);
        assert_int_equal(kill(w, SIGCONT), 0);
        /* room again once it has read */
        int64_t end = now_ms() + GONE_MS;
        while ((r = deadman_watch(dm, g.leader, NULL)) == -EAGAIN && now_ms() < end)
                poll(NULL, 0, 2);
        assert_int_equal(r, 0);
        assert_int_equal(deadman_set_deadline(dm, now_ms()), 0);
        assert_true(wait_gone(&g) >= 0);
        assert_killed(&g);
        /* killed behind our back: writes say so */
        assert_int_equal(kill(w, SIGKILL), 0);
        assert_int_equal(waitpid(w, NULL, 0), w);
        assert_int_equal(deadman_unwatch(dm, 4242424), -EPIPE);
        deadman_stop(dm); /* nothing left to reap: returns */
}

/* A full table forgets groups that ended first. */
static void test_full_table_prunes(void **state)
{
        (void)state;
        struct deadman *dm = NULL;
        assert_int_equal(deadman_start_max(&dm, 2), 0);
        struct group a, b, c, d;
        spawn_group(&a, false, NULL);
        spawn_group(&b, false, NULL);
        spawn_group(&c, false, NULL);
        spawn_group(&d, false, NULL); /* never watched */
        assert_int_equal(deadman_watch(dm, a.leader, NULL), 0);
        assert_int_equal(deadman_watch(dm, b.leader, NULL), 0);
        end_group(&a); /* a ends: its entry can go */
        assert_int_equal(deadman_watch(dm, c.leader, NULL), 0);
        assert_int_equal(deadman_set_deadline(dm, now_ms()), 0);
        assert_true(wait_gone(&b) >= 0);
        assert_true(wait_gone(&c) >= 0);
        assert_killed(&b);
        assert_killed(&c);
        /* no overflow: an unwatched child group is left alone */
        assert_true(still_running(&d));
        deadman_stop(dm);
        end_group(&d);
}

/* A watch that does not fit: at the deadline every group led by a child of
 * kairosd (here, this test) dies, the unrecorded one included. */
static void test_overflow_kills_child_groups(void **state)
{
        (void)state;
        struct deadman *dm = NULL;
        assert_int_equal(deadman_start_max(&dm, 2), 0);
        struct group a, b, c;
        spawn_group(&a, false, NULL);
        spawn_group(&b, false, NULL);
        spawn_group(&c, false, NULL);
        assert_int_equal(deadman_watch(dm, a.leader, NULL), 0);
        assert_int_equal(deadman_watch(dm, b.leader, NULL), 0);
        assert_int_equal(deadman_watch(dm, c.leader, NULL), 0); /* not kept */
        int64_t deadline = now_ms() + 300;
        assert_int_equal(deadman_set_deadline(dm, deadline), 0);
        assert_alive_before(&c, deadline);
        assert_true(wait_gone(&c) >= deadline);
        assert_true(wait_gone(&a) >= 0);
        assert_true(wait_gone(&b) >= 0);
        assert_killed(&a);
        assert_killed(&b);
        assert_killed(&c);
        assert_int_equal(kill(deadman_pid(dm), 0), 0); /* not itself */
        deadman_stop(dm);
}

/* ---- cgroups: a grandchild that left the group (setsid) dies with the
 * cgroup.  Skipped where no cgroup can be made (not root, no cgroupfs). */

/* The mount point of a cgroup file system: cgroup2 (v2), or a v1 one. */
static bool find_cgroup_mount(bool v2, char *ret, size_t len)
{
        FILE *f = fopen("/proc/self/mountinfo", "r");
        if (!f)
                return false;
        char line[4096];
        bool found = false;
        while (!found && fgets(line, sizeof line, f)) {
                /* ID PARENT MAJ:MIN ROOT MOUNT OPTS [OPTIONAL...] - TYPE SOURCE SUPER */
                char root[1024], mnt[1024], type[64];
                const char *dash = strstr(line, " - ");
                if (!dash || sscanf(line, "%*s %*s %*s %1023s %1023s", root, mnt) != 2 ||
                    sscanf(dash + 3, "%63s", type) != 1 || strcmp(root, "/") != 0)
                        continue;
                if (v2 ? strcmp(type, "cgroup2") == 0 : strcmp(type, "cgroup") == 0) {
                        snprintf(ret, len, "%s", mnt);
                        found = true;
                }
        }
        fclose(f);
        return found;
}

static void cgroup_test(bool v2)
{
        char mnt[1024], dir[1200], procs[1300];
        if (!find_cgroup_mount(v2, mnt, sizeof mnt)) {
                skip();
                return;
        }
        snprintf(dir, sizeof dir, "%s/kairos-deadman-test-%d", mnt, (int)getpid());
        snprintf(procs, sizeof procs, "%s/cgroup.procs", dir);
        if (mkdir(dir, 0755) < 0 || access(procs, W_OK) < 0) {
                rmdir(dir);
                skip();
                return;
        }
        snprintf(cgroup_made, sizeof cgroup_made, "%s", dir);
        struct deadman *dm = NULL;
        assert_int_equal(deadman_start(&dm), 0);
        struct group g;
        spawn_group(&g, true, procs);
        assert_int_not_equal(getpgid(g.grandchild), g.leader); /* out of the group */
        assert_int_equal(deadman_watch(dm, g.leader, dir), 0);
        int64_t deadline = now_ms() + 300;
        assert_int_equal(deadman_set_deadline(dm, deadline), 0);
        assert_alive_before(&g, deadline);
        assert_true(wait_gone(&g) >= deadline);
        assert_killed(&g);
        deadman_stop(dm);
        int64_t end = now_ms() + GONE_MS;
        while (rmdir(dir) < 0 && errno == EBUSY && now_ms() < end)
                poll(NULL, 0, 2);
        assert_int_equal(access(dir, F_OK), -1);
        cgroup_made[0] = '\0';
}

static void test_cgroup_v2(void **state)
{
        (void)state;
        cgroup_test(true);
}

static void test_cgroup_v1(void **state)
{
        (void)state;
        cgroup_test(false);
}

int main(void)
{
        /* kairosd ignores SIGPIPE; grandchildren come back to us */
        signal(SIGPIPE, SIG_IGN);
        if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0) {
                perror("PR_SET_CHILD_SUBREAPER");
                return 1;
        }
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_deadline_kills_group),
                cmocka_unit_test(test_not_before_deadline),
                cmocka_unit_test(test_renewal_keeps_alive),
                cmocka_unit_test(test_unwatch_spares),
                cmocka_unit_test(test_no_deadline_no_kill),
                cmocka_unit_test(test_watch_after_deadline_killed_at_once),
                cmocka_unit_test(test_eof_kills_and_exits),
                cmocka_unit_test(test_stop_kills_nothing),
                cmocka_unit_test(test_watcher_shape),
                cmocka_unit_test(test_bad_input),
                cmocka_unit_test(test_full_pipe_and_dead_watcher),
                cmocka_unit_test(test_full_table_prunes),
                cmocka_unit_test(test_overflow_kills_child_groups),
                cmocka_unit_test(test_cgroup_v2),
                cmocka_unit_test(test_cgroup_v1),
        };
        int failed = cmocka_run_group_tests(tests, NULL, NULL);
        /* what a failed test left behind */
        for (size_t i = 0; i < nspawned; i++) {
                kill(-spawned[i][0], SIGKILL);
                if (spawned[i][1] > 0)
                        kill(spawned[i][1], SIGKILL);
        }
        int64_t end = now_ms() + GONE_MS;
        while (waitpid(-1, NULL, WNOHANG) >= 0 && now_ms() < end)
                poll(NULL, 0, 2);
        if (cgroup_made[0])
                rmdir(cgroup_made);
        return failed;
}
