/* SPDX-License-Identifier: MIT */
/* runner: see runner.h. */
#include "runner.h"
#include "deadman.h"

#include <dirent.h>
#include <errno.h>
#include <linux/capability.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <semaphore.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

#ifndef CLOSE_RANGE_UNSHARE
#define CLOSE_RANGE_UNSHARE (1U << 1)
#endif


#define CHILD_STACK (256 * 1024)
/* A child whose pipes are all below this takes them directly (one word
 * of the descriptor table's bitmaps copied), not through the slots */
#define RUNNER_DIRECT_FDS 64
#define KEEPER_MAX_GROUPS 65536
#define KEEPER_EXIT_MS 5000 /* from its socket's close to its exit, at most */

/* clone3(2), spelled out here (linux/sched.h clashes with sched.h): the
 * arguments of its first version, and the flag that resets every handled
 * signal to SIG_DFL in the child (Linux 5.5). */
struct clone3_args {
        uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
};
#define RUNNER_CLONE_CLEAR_SIGHAND 0x100000000ULL
#define RUNNER_CLONE_PIDFD 0x1000ULL

enum { STAGE_SETUP = 1, STAGE_CGROUP, STAGE_USER, STAGE_CHDIR, STAGE_EXEC };

/* How long the runner's thread waits for a killed handler cgroup to empty
 * before it gives up removing it. */
#define CGROUP_EMPTY_MS 5000

struct cg_cleanup {
        struct cg_cleanup *next;
        struct cgroup_handler h;
};

struct runner {
        uv_loop_t *loop;
        pid_t self;
        /* the thread */
        pthread_t thread;
        bool thread_started;
        pthread_mutex_t lock;
        /* posted on every change the thread waits for (a job, a cleanup,
         * the quit): not a condition variable, which takes the lock back
         * marked contended, so the thread's next unlock was a futex wake
         * per spawn with nobody to wake */
        sem_t sem;
        /* quiet reports (runner_job.quiet), under lock: some are in the
         * done list without a wake of the loop (the thread wakes it at
         * quiet_end, CLOCK_MONOTONIC ms, if they are still there); the
         * loop wants its next report to wake it (runner_release) */
        bool unwoken, wake_wanted;
        int64_t quiet_end;
        int quiet_ms;
        struct runner_job *todo_head, *todo_tail;  /* loop -> thread */
        struct runner_job *done_head, *done_tail;  /* thread -> loop */
        struct cg_cleanup *cleanup;                /* loop -> thread: cgroups to remove */
        struct cgroup_ctl *cg;                     /* NULL: no handler cgroups */
        const struct handler_user *user;           /* NULL: kairosd's own user */
        unsigned long cg_left;                     /* the thread's: cgroups it could not remove */
        bool quit;
        void *stack;
        /* thread -> loop: an eventfd the loop polls, not a uv_async (whose
         * loop side spins, up to a sched_yield, while the sender is still
         * in its write) */
        int wake_fd;
        uv_poll_t wake;
        /* the loop */
        uv_signal_t sigchld;
        /* The pidfds of the handlers started by clone3 and of the keeper,
         * in an epoll set the loop polls: their exits are read there, and
         * SIGCHLD is left to its default (discarded where it is sent)
         * instead of waking whichever thread it interrupts and costing
         * libuv's signal pipe.  -1: SIGCHLD for all.  Watched on SIGCHLD
         * too (sigchld_on) once a child has no pidfd (clone without
         * clone3, the keeper's pidfd_open failed). */
        int pid_ep;
        uv_poll_t pid_poll;
        bool sigchld_on;
        int keeper_pidfd;          /* under lock; -1 none */
        bool want_sigchld;         /* under lock: the keeper has no pidfd */
        struct runner_job **live;  /* started, not reaped */
        size_t nlive, cap;
        struct deadman *dm;        /* cluster mode: watches each handler's group */
        /* the thread's, read by the child: the spawning handler's cgroup
         * directory for the deadman, "" none */
        char dm_cgroup[DEADMAN_CGROUP_PATH_MAX + 1];
        int keeper_fd;             /* changed by the thread only, under lock */
        /* Spawning with a shared descriptor table (CLONE_FILES): the child
         * unshares and closes in one close_range(CLOSE_RANGE_UNSHARE), which
         * copies only the descriptors below its first argument, instead of
         * clone copying the daemon's whole table (one reference per open
         * file, more with every running handler) for the child to close
         * again.  The child's stdio travels in three descriptors opened at
         * start (low numbers), filled by the thread before each clone and
         * pointed back at /dev/null after it.  See docs/design.md. */
        bool share_files;
        int slot[3];               /* the thread's; -1: not opened */
        int slot_null;             /* /dev/null, to empty the slots */
        int slot_hi;               /* the highest of slot[] */
        int direct_fds;            /* RUNNER_DIRECT_FDS (tests: another) */
        pid_t keeper;
        bool keeper_gone;          /* under lock: the thread starts a new one */
        /* The keeper's table of handler process groups, shared with it
         * (MAP_SHARED, made before it is forked; a new keeper inherits it):
         * the child writes its group into its job's slot before it execs,
         * the loop clears the slot before it reaps the child.  No message
         * per step. */
        int32_t *groups;
        /* ... and, per slot, the handler's cgroup and its tool-call groups,
         * with the directory the cgroups are below (same lifetime) */
        struct keeper_shared *ks;
        uint32_t *free_slots;      /* under lock: slots given back */
        size_t nfree;
        uint32_t slot_next;        /* under lock: slots never used from here */
        /* the signals kairosd ignores (SIG_IGN survives exec and
         * CLONE_CLEAR_SIGHAND): the child resets these, NSIG ends */
        int ignored[NSIG];
        bool no_clone3;            /* the thread's: clone3 failed once (ENOSYS…) */
        bool test_keeper_stall;    /* KAIROS_TEST_KEEPER_STALL (test builds) */
};

/* The open-file limit kairosd started with.  kairosd raises its own soft
 * limit (many connections and WALs); its handlers get the one it was given,
 * as any program started by the same parent would (a program using select()
 * breaks with descriptors above 1023).  Read before main() can change it. */
static struct rlimit initial_nofile;
static bool initial_nofile_known;

__attribute__((constructor)) static void note_initial_nofile(void)
{
        initial_nofile_known = getrlimit(RLIMIT_NOFILE, &initial_nofile) == 0;
}

/* ---- the keeper ---- */

/* What the keeper needs besides the groups to leave nothing of kairosd's
 * behind but running tool calls (docs/design.md §10): the directory of
 * kairosd's cgroup in one hierarchy (the v2 one if any; runner_set_cgroup)
 * and, per slot, the process groups of the handler's tool calls
 * (runner_add_tool_group). */
struct keeper_slot {
        int32_t calls[RUNNER_TOOL_GROUPS];
};
struct keeper_shared {
        char root[4096];
        int32_t v2;  /* root is on cgroup v2 (subtree_control) */
        int32_t spare_pid;  /* cluster mode: the deadman's pid, spared (it ends by itself) */
        /* the clients of calls an earlier kairosd left, held (toolhold) */
        int32_t held[RUNNER_HELD_MAX];
        struct keeper_slot slot[KEEPER_MAX_GROUPS];
};

/* The keeper's own (static: it allocates nothing) */
#define KEEPER_MAX_CALLS 4096
static struct keeper_sweep {
        pid_t self, daemon, deadman;
        int32_t calls[KEEPER_MAX_CALLS];
        size_t ncalls;
        unsigned killed;
        bool spared;
} sweep;

static bool keeper_is_call(pid_t pgid)
{
        for (size_t i = 0; pgid > 0 && i < sweep.ncalls; i++)
                if (sweep.calls[i] == pgid)
                        return true;
        return false;
}

/* One cgroup and those below it: SIGKILL every process listed but kairosd
 * (a graceful exit waits for the keeper), the keeper and the processes of
 * a running tool call (their process group is the call's).  Async-signal-
 * safe calls only, no allocation. */
static void keeper_sweep_dir(int dfd, int depth)
{
        int fd = openat(dfd, "cgroup.procs", O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
                long pid = 0;
                char buf[4096];
                ssize_t k;
                while ((k = read(fd, buf, sizeof buf)) > 0 || (k < 0 && errno == EINTR)) {
                        for (ssize_t i = 0; i < k; i++) {
                                if (buf[i] >= '0' && buf[i] <= '9') {
                                        pid = pid * 10 + (buf[i] - '0');
                                        continue;
                                }
                                if (pid > 0 && pid != sweep.self && pid != sweep.daemon &&
                                    pid != sweep.deadman) {
                                        if (keeper_is_call(getpgid((pid_t)pid)))
                                                sweep.spared = true;
                                        else if (kill((pid_t)pid, SIGKILL) == 0)
                                                sweep.killed++;
                                }
                                pid = 0;
                        }
                }
                close(fd);
        }
        if (depth >= 16)
                return;
        char ents[2048];
        long n;
        while ((n = syscall(SYS_getdents64, dfd, ents, sizeof ents)) > 0) {
                for (long off = 0; off < n;) {
                        struct {
                                uint64_t ino;
                                int64_t off;
                                unsigned short reclen;
                                unsigned char type;
                                char name[];
                        } *e = (void *)(ents + off);
                        off += e->reclen;
                        if (e->type != DT_DIR || e->name[0] == '.')
                                continue;
                        int sub = openat(dfd, e->name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                        if (sub >= 0) {
                                keeper_sweep_dir(sub, depth + 1);
                                close(sub);
                        }
                }
        }
}

/* kairosd is gone (or exits): what is left in its cgroup, its handlers'
 * setsid children, processes a handler moved out of its own cgroup, dies,
 * but the running tool calls, pass after pass until a pass kills nothing
 * (what forks meanwhile is found by the next). */
static void keeper_sweep(const int32_t *groups, const struct keeper_shared *ks)
{
        if (!ks->root[0])
                return;
        sweep.ncalls = 0;
        sweep.deadman = __atomic_load_n(&ks->spare_pid, __ATOMIC_ACQUIRE);
        for (size_t i = 0; i < KEEPER_MAX_GROUPS; i++) {
                if (__atomic_load_n(&groups[i], __ATOMIC_ACQUIRE) <= 0)
                        continue;
                for (unsigned c = 0; c < RUNNER_TOOL_GROUPS; c++) {
                        int32_t g = __atomic_load_n(&ks->slot[i].calls[c], __ATOMIC_ACQUIRE);
                        if (g > 0 && sweep.ncalls < KEEPER_MAX_CALLS)
                                sweep.calls[sweep.ncalls++] = g;
                }
        }
        for (size_t i = 0; i < RUNNER_HELD_MAX; i++) {
                int32_t g = __atomic_load_n(&ks->held[i], __ATOMIC_ACQUIRE);
                if (g > 0 && sweep.ncalls < KEEPER_MAX_CALLS)
                        sweep.calls[sweep.ncalls++] = g;
        }
        for (int pass = 0; pass < 100; pass++) {
                int dfd = open(ks->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                if (dfd < 0)
                        return;
                sweep.killed = 0;
                keeper_sweep_dir(dfd, 0);
                close(dfd);
                if (!sweep.killed)
                        break;
        }
        /* a call spared: it outlives kairosd in a cgroup below kairosd's,
         * which must take a process again at the next start (systemd puts
         * the new kairosd there): cgroup v2 refuses that while controllers
         * are enabled for its children ("no internal processes"), so they
         * are disabled; the next kairosd enables them again */
        if (sweep.spared && ks->v2) {
                char path[sizeof ks->root + 32];
                size_t n = 0;
                for (const char *p = ks->root; *p && n < sizeof ks->root; p++)
                        path[n++] = *p;
                memcpy(path + n, "/cgroup.subtree_control", sizeof "/cgroup.subtree_control");
                static const char *const off[] = { "-memory", "-pids", "-cpu" };
                for (size_t i = 0; i < 3; i++) {
                        int fd = open(path, O_WRONLY | O_CLOEXEC);
                        if (fd >= 0) {
                                (void)!write(fd, off[i], strlen(off[i]));
                                close(fd);
                        }
                }
        }
}

/* Forked from the daemon; only async-signal-safe calls, no allocation. */
static void keeper_main(int sock, const int32_t *groups, const struct keeper_shared *ks,
                        bool stall)
{
        static const int ignore[] = { SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGPIPE, SIGQUIT };
        for (size_t i = 0; i < sizeof ignore / sizeof ignore[0]; i++)
                signal(ignore[i], SIG_IGN);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        int null = open("/dev/null", O_RDWR);
        if (sock != 3) {
                if (dup2(sock, 3) < 0)
                        _exit(1);
                sock = 3;
        }
        for (int fd = 0; fd < 3 && null >= 0; fd++)
                dup2(null, fd);
        deadman_close_from(4);
        prctl(PR_SET_NAME, "kairosd-keeper");
        sweep.self = getpid();
        sweep.daemon = getppid();
        for (;;) {
                char c;
                ssize_t k = recv(sock, &c, sizeof c, 0);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0)
                        break; /* end of file: kairosd is gone (or a broken socket) */
        }
        while (stall) /* a test hook: a keeper stuck at kairosd's exit */
                pause();
        for (size_t i = 0; i < KEEPER_MAX_GROUPS; i++) {
                int32_t g = __atomic_load_n(&groups[i], __ATOMIC_ACQUIRE);
                if (g > 0)
                        kill(-g, SIGKILL);
        }
        keeper_sweep(groups, ks);
        _exit(0);
}

static int keeper_start(struct runner *r)
{
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
                return -errno;
        pid_t pid = fork();
        if (pid < 0) {
                int e = errno;
                close(sv[0]);
                close(sv[1]);
                return -e;
        }
        if (pid == 0)
                keeper_main(sv[1], r->groups, r->ks, r->test_keeper_stall); /* no return */
        close(sv[1]);
        r->keeper = pid;
        r->keeper_fd = sv[0];
        r->keeper_pidfd = -1;
        if (r->pid_ep >= 0) {
                int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
                struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &r->keeper_pidfd };
                if (pfd >= 0 && epoll_ctl(r->pid_ep, EPOLL_CTL_ADD, pfd, &ev) < 0) {
                        close(pfd);
                        pfd = -1;
                }
                r->keeper_pidfd = pfd;
        }
        r->want_sigchld = r->keeper_pidfd < 0;
        return 0;
}

/* A slot of the table for a job (the thread, under lock); -1: the table is
 * full (the handler still dies with kairosd by PR_SET_PDEATHSIG). */
static int keeper_slot_take(struct runner *r)
{
        if (r->nfree)
                return (int)r->free_slots[--r->nfree];
        return r->slot_next < KEEPER_MAX_GROUPS ? (int)r->slot_next++ : -1;
}

/* No tool call yet in j's slot of the keeper's table (the thread, before
 * the clone: the child's group makes the slot count). */
static void keeper_slot_fill(struct runner *r, struct runner_job *j)
{
        if (j->keeper_slot < 0)
                return;
        struct keeper_slot *s = &r->ks->slot[j->keeper_slot];
        for (unsigned i = 0; i < RUNNER_TOOL_GROUPS; i++)
                __atomic_store_n(&s->calls[i], 0, __ATOMIC_RELEASE);
}

/* j's tool-call groups into its slot (the loop). */
static void keeper_calls_sync(struct runner *r, struct runner_job *j)
{
        if (j->keeper_slot < 0)
                return;
        struct keeper_slot *s = &r->ks->slot[j->keeper_slot];
        for (unsigned i = 0; i < RUNNER_TOOL_GROUPS; i++)
                __atomic_store_n(&s->calls[i], i < j->ntool_groups ? (int32_t)j->tool_groups[i] : 0,
                                 __ATOMIC_RELEASE);
}

/* j's group is about to be reaped (or was never there): out of the table. */
static void keeper_forget(struct runner *r, struct runner_job *j)
{
        if (j->keeper_slot < 0)
                return;
        __atomic_store_n(&r->groups[j->keeper_slot], 0, __ATOMIC_RELEASE);
        pthread_mutex_lock(&r->lock);
        r->free_slots[r->nfree++] = (uint32_t)j->keeper_slot;
        pthread_mutex_unlock(&r->lock);
        j->keeper_slot = -1;
}

/* The keeper died (someone killed it): the runner's thread starts another
 * before its next spawn.  Groups the old one held are not known to the new
 * one; they still die with kairosd by PR_SET_PDEATHSIG (their leaders). */
static void keeper_check(struct runner *r)
{
        int status;
        pthread_mutex_lock(&r->lock);
        pid_t k = r->keeper;
        pthread_mutex_unlock(&r->lock);
        if (k <= 0 || waitpid(k, &status, WNOHANG) != k)
                return;
        pthread_mutex_lock(&r->lock);
        if (r->keeper_pidfd >= 0)
                close(r->keeper_pidfd); /* out of the epoll set with it */
        r->keeper_pidfd = -1;
        pthread_mutex_unlock(&r->lock);
        log_warning("the handler keeper (pid %d) died (%s %d): starting another", (int)k,
                    WIFSIGNALED(status) ? "signal" : "exit status",
                    WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        pthread_mutex_lock(&r->lock);
        r->keeper = 0;
        r->keeper_gone = true;
        pthread_mutex_unlock(&r->lock);
}

/* ---- the child (between clone and exec) ---- */

/* Runs on its own stack in the daemon's memory while the runner's thread
 * waits (CLONE_VFORK): async-signal-safe calls only, nothing allocated,
 * nothing of the daemon's memory changed but the job's child_* fields. */
__attribute__((no_sanitize("address", "undefined"))) static int child_main(void *arg)
{
        struct runner_job *j = arg;
        struct runner *r = j->r;
        j->child_stage = STAGE_SETUP;
        /* every signal is blocked (the runner's thread blocks them all):
         * reset the handlers first, so none of the daemon's runs here —
         * clone3 did it (CLONE_CLEAR_SIGHAND) but for the ignored ones */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        if (j->clear_sighand) {
                for (const int *sig = r->ignored; *sig; sig++)
                        (void)sigaction(*sig, &dfl, NULL);
        } else {
                for (int sig = 1; sig < NSIG; sig++)
                        if (sig != SIGKILL && sig != SIGSTOP)
                                (void)sigaction(sig, &dfl, NULL);
        }
        if (setpgid(0, 0) < 0 || prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
                goto fail;
        if (getppid() != r->self) {
                errno = ESRCH; /* kairosd died before we were ready */
                goto fail;
        }
        /* into the handler's cgroup, in each hierarchy it has one */
        for (int at = 0; at < CGROUP_AT_N; at++) {
                if (j->cgh.procs_fd[at] < 0)
                        continue;
                j->child_stage = STAGE_CGROUP;
                if (write(j->cgh.procs_fd[at], "0", 1) < 0)
                        goto fail;
                j->child_stage = STAGE_SETUP;
        }
        /* HandlerUser=: its groups and ids, no capability (raw system calls:
         * glibc's wrappers would signal the daemon's threads to change theirs
         * too).  The credential change clears the parent-death signal: set
         * again, and kairosd checked again. */
        const struct handler_user *u = r->user;
        if (u && u->set) {
                j->child_stage = STAGE_USER;
                struct __user_cap_header_struct ch = { _LINUX_CAPABILITY_VERSION_3, 0 };
                struct __user_cap_data_struct cd[2];
                memset(cd, 0, sizeof cd);
                if (syscall(SYS_setgroups, u->ngroups, u->groups) < 0 ||
                    syscall(SYS_setresgid, u->gid, u->gid, u->gid) < 0 ||
                    syscall(SYS_setresuid, u->uid, u->uid, u->uid) < 0 ||
                    syscall(SYS_capset, &ch, cd) < 0 || prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
                        goto fail;
                if (getppid() != r->self) {
                        errno = ESRCH;
                        goto fail;
                }
                j->child_stage = STAGE_SETUP;
        }
        /* into the keeper's table (without a slot the handler still dies
         * with kairosd) */
        int32_t me = (int32_t)getpid();
        if (j->keeper_slot >= 0)
                __atomic_store_n(&r->groups[j->keeper_slot], me, __ATOMIC_RELEASE);
        /* cluster mode: killed at the lease deadline even if kairosd is
         * stopped (one write(2); deadman.h) */
        if (r->dm)
                (void)deadman_watch(r->dm, me, r->dm_cgroup);
        if (r->share_files) {
                /* a table of our own holding only fds 0..unshare_below - 1
                 * (up to the slots, or up to the pipes themselves when they
                 * are low: direct_fds): nothing below changes the daemon's
                 * descriptors */
                if (syscall(SYS_close_range, (unsigned)j->unshare_below, ~0U,
                            CLOSE_RANGE_UNSHARE) < 0)
                        goto fail;
                for (int fd = 0; fd < 3; fd++) {
                        if (j->child_fd[fd] == fd) {
                                if (fcntl(fd, F_SETFD, 0) < 0)
                                        goto fail;
                        } else if (dup2(j->direct_fds ? j->child_fd[fd] : r->slot[fd], fd) < 0) {
                                goto fail;
                        }
                }
        }
        for (int fd = 0; fd < 3 && !r->share_files; fd++) {
                if (j->child_fd[fd] == fd) {
                        if (fcntl(fd, F_SETFD, 0) < 0)
                                goto fail;
                } else if (dup2(j->child_fd[fd], fd) < 0) {
                        goto fail;
                }
        }
        deadman_close_from(3);
        if (j->reset_nofile && setrlimit(RLIMIT_NOFILE, &j->nofile) < 0)
                goto fail;
        j->child_stage = STAGE_CHDIR;
        if (j->cwd && chdir(j->cwd) < 0)
                goto fail;
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        j->child_stage = STAGE_EXEC;
        int err = ENOENT;
        for (char **c = j->cands; *c; c++) {
                execve(*c, j->argv, j->envp);
                if (errno == ENOEXEC) {
                        j->sh_argv[1] = *c;
                        execve("/bin/sh", j->sh_argv, j->envp);
                }
                /* as execvp: remember a permission problem, go on for the
                 * ones that mean "not here" */
                if (errno == EACCES)
                        err = EACCES;
                else if (errno != ENOENT && errno != ENOTDIR && errno != ENOEXEC) {
                        err = errno;
                        break;
                }
        }
        errno = err;
fail:
        j->child_errno = errno ? errno : EIO;
        _exit(127);
}

/* ---- the runner's thread ---- */

#if defined(__x86_64__) && defined(SYS_clone3)
/* clone3 starting fn(arg) on the stack the arguments name (the child never
 * returns into C: fn ends in exec or _exit).  The new child's registers are
 * the parent's: fn and arg ride in r12 and r13. */
__attribute__((no_sanitize("address", "undefined"))) static long
clone3_run(struct clone3_args *ca, int (*fn)(void *), void *arg)
{
        long ret;
        register void *rfn __asm__("r12") = (void *)fn;
        register void *rarg __asm__("r13") = arg;
        __asm__ volatile("syscall\n\t"
                         "test %%rax, %%rax\n\t"
                         "jnz 1f\n\t"
                         "xor %%ebp, %%ebp\n\t"
                         "mov %%r13, %%rdi\n\t"
                         "call *%%r12\n\t"
                         "mov %%eax, %%edi\n\t"
                         "mov $60, %%eax\n\t" /* exit */
                         "syscall\n\t"
                         "ud2\n"
                         "1:"
                         : "=a"(ret)
                         : "0"((long)SYS_clone3), "D"(ca), "S"(sizeof *ca), "r"(rfn), "r"(rarg)
                         : "rcx", "r11", "memory");
        return ret;
}
#endif

/* The child, started with clone3(CLONE_CLEAR_SIGHAND) where the kernel has
 * it (its handled signals already reset: no rt_sigaction per signal), else
 * with clone.  A pid, or -1 with errno. */
static pid_t clone_child(struct runner *r, struct runner_job *j, int flags)
{
#if defined(__x86_64__) && defined(SYS_clone3)
        if (!r->no_clone3) {
                struct clone3_args ca = {
                        .flags = (uint64_t)(flags & ~0xff) | RUNNER_CLONE_CLEAR_SIGHAND,
                        .exit_signal = (uint64_t)(flags & 0xff),
                        .stack = (uint64_t)(uintptr_t)r->stack, .stack_size = CHILD_STACK,
                };
                /* its exit read from a pidfd on the loop: no signal, and
                 * every wait for it says __WALL */
                if (r->pid_ep >= 0) {
                        ca.flags |= RUNNER_CLONE_PIDFD;
                        ca.pidfd = (uint64_t)(uintptr_t)&j->pidfd;
                        ca.exit_signal = 0;
                }
                j->clear_sighand = true;
                long pid = clone3_run(&ca, child_main, j);
                if (pid >= 0)
                        return (pid_t)pid;
                if (pid != -ENOSYS && pid != -EINVAL && pid != -E2BIG && pid != -EPERM) {
                        errno = (int)-pid;
                        return -1;
                }
                /* an older kernel, or a filter that refuses clone3: clone
                 * from now on */
                r->no_clone3 = true;
        }
#endif
        j->clear_sighand = false;
        j->pidfd = -1;
        return clone(child_main, (char *)r->stack + CHILD_STACK, flags, j);
}

/* The path of h's cgroup for the deadman (it kills by path, in a process
 * of its own): the v2 one, else a v1 one; "" none. */
static void deadman_cgroup(struct runner *r, const struct cgroup_handler *h)
{
        r->dm_cgroup[0] = '\0';
        int fd = -1;
        for (int at = 0; at < CGROUP_AT_N && fd < 0; at++)
                fd = h->dir_fd[at];
        if (!r->dm || fd < 0)
                return;
        char link[64];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, r->dm_cgroup, sizeof r->dm_cgroup);
        /* none rather than a cut one */
        r->dm_cgroup[n > 0 && (size_t)n < sizeof r->dm_cgroup && r->dm_cgroup[0] == '/' ? n : 0] =
                '\0';
}

static void thread_spawn(struct runner *r, struct runner_job *j)
{
        j->child_errno = 0;
        j->child_stage = 0;
        j->pidfd = -1;
        struct rlimit cur;
        j->reset_nofile = initial_nofile_known && getrlimit(RLIMIT_NOFILE, &cur) == 0 &&
                          cur.rlim_cur != initial_nofile.rlim_cur &&
                          initial_nofile.rlim_cur <= cur.rlim_max;
        if (j->reset_nofile)
                j->nofile = (struct rlimit){ initial_nofile.rlim_cur, cur.rlim_max };
        cgroup_handler_init(&j->cgh);
        pid_t pid = -1;
        if (r->cg) {
                const char *what;
                int e = cgroup_handler_create(r->cg, j->cg_hint, &j->limits, &j->cgh, &what);
                if (e < 0) {
                        j->err = e;
                        j->err_what = what;
                        goto out;
                }
        }
        deadman_cgroup(r, &j->cgh);
        keeper_slot_fill(r, j);
        int flags = CLONE_VM | CLONE_VFORK | SIGCHLD;
        /* pipes below RUNNER_DIRECT_FDS (a daemon running a few handlers):
         * the child's table is copied up to them and takes them as they
         * are, which costs it less than the thread's three dup3 into the
         * slots and three back */
        int hi = j->child_fd[0];
        for (int i = 1; i < 3; i++)
                if (j->child_fd[i] > hi)
                        hi = j->child_fd[i];
        j->direct_fds = r->share_files && hi < r->direct_fds;
        j->unshare_below = j->direct_fds ? hi + 1 : r->slot_hi + 1;
        if (r->share_files) {
                for (int i = 0; i < 3 && !j->direct_fds; i++)
                        if (j->child_fd[i] != i && dup3(j->child_fd[i], r->slot[i], O_CLOEXEC) < 0) {
                                j->err = -errno;
                                j->err_what = "dup3";
                                goto out;
                        }
                flags |= CLONE_FILES;
        }
        pid = clone_child(r, j, flags);
        if (pid < 0) {
                j->err = -errno;
                j->err_what = "clone";
        } else if (j->child_errno) {
                /* the child could not exec: it is gone (_exit), reap it here
                 * (the deadman forgets it first: its id is free once reaped) */
                if (r->dm)
                        (void)deadman_unwatch(r->dm, pid);
                keeper_forget(r, j);
                while (waitpid(pid, NULL, __WALL) < 0 && errno == EINTR)
                        ;
                j->err = -j->child_errno;
                j->err_what = j->child_stage == STAGE_CHDIR    ? "chdir"
                              : j->child_stage == STAGE_EXEC   ? "execute"
                              : j->child_stage == STAGE_CGROUP ? "cgroup.procs"
                              : j->child_stage == STAGE_USER   ? "HandlerUser="
                                                               : "setup";
        } else {
                j->pid = pid;
                struct timespec ts;
                clock_gettime(CLOCK_MONOTONIC, &ts);
                j->started_us = (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
        }
out:
        /* the slots must not keep the pipes open (end of file on stdout) */
        for (int i = 0; i < 3 && r->share_files && !j->direct_fds; i++)
                if (dup3(r->slot_null, r->slot[i], O_CLOEXEC) < 0) {
                        /* not seen (the slot is open, below the limit): never
                         * fill a slot that may be someone else's by now */
                        close(r->slot[i]);
                        r->slot[i] = -1;
                        r->share_files = false;
                }
        if (j->err && j->pidfd >= 0) {
                close(j->pidfd);
                j->pidfd = -1;
        }
        if (j->err)
                keeper_forget(r, j); /* the slot back (it never ran, or is reaped) */
        if (j->err && cgroup_handler_active(&j->cgh) &&
            cgroup_handler_destroy(r->cg, &j->cgh, CGROUP_EMPTY_MS) < 0)
                r->cg_left++;
        cgroup_handler_close_procs(&j->cgh);
        for (int i = 0; i < 3; i++) {
                close(j->child_fd[i]);
                j->child_fd[i] = -1;
        }
}

static int64_t mono_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Under r->lock: the loop woken (after the unlock: *wake) for what the
 * done list holds, if it holds quiet reports past their end. */
static void quiet_due(struct runner *r, bool *wake)
{
        if (r->unwoken && mono_ms() >= r->quiet_end) {
                r->unwoken = false;
                *wake = *wake || r->done_head;
        }
}

static void wake_loop(struct runner *r)
{
        uint64_t one = 1;
        while (write(r->wake_fd, &one, sizeof one) < 0 && errno == EINTR)
                ;
}

/* Under r->lock: wait for the next post (the caller checks again); with
 * quiet reports waiting, at most until their end (then the loop is woken
 * for them). */
static void thread_wait(struct runner *r)
{
        if (r->unwoken) {
                int64_t end = r->quiet_end;
                pthread_mutex_unlock(&r->lock);
                struct timespec ts = { (time_t)(end / 1000), (long)(end % 1000) * 1000000L };
                while (sem_clockwait(&r->sem, CLOCK_MONOTONIC, &ts) < 0 && errno == EINTR)
                        ;
                pthread_mutex_lock(&r->lock);
                bool wake = false;
                quiet_due(r, &wake);
                if (wake) {
                        pthread_mutex_unlock(&r->lock);
                        wake_loop(r);
                        pthread_mutex_lock(&r->lock);
                }
                return;
        }
        pthread_mutex_unlock(&r->lock);
        while (sem_wait(&r->sem) < 0 && errno == EINTR)
                ;
        pthread_mutex_lock(&r->lock);
}

/* A quiet job started (runner_job.quiet): its stdin written here (an empty
 * pipe takes PIPE_BUF bytes at once; EPIPE: a child that does not read its
 * stdin is fine) and closed.  false: reported as any other. */
static bool quiet_start(struct runner *r, struct runner_job *j)
{
        if (!j->quiet || j->err || j->pidfd < 0 || r->pid_ep < 0 || r->quiet_ms <= 0 ||
            j->in_len > PIPE_BUF)
                return false;
        while (j->in_len && write(j->fd_in, j->in, j->in_len) < 0 && errno == EINTR)
                ;
        close(j->fd_in);
        j->fd_in = -1;
        return true;
}

static void *thread_main(void *arg)
{
        struct runner *r = arg;
        /* named apart from the loop ("kairosd") and the jobs' threads: a
         * step's handoffs (loop, kairosd-jobs, kairosd-runner) are told
         * apart in `perf sched timehist` and `top -H`
         * (tests/bench/bench_handoffs.py); a child shows the name until
         * its exec */
        prctl(PR_SET_NAME, "kairosd-runner");
        pthread_mutex_lock(&r->lock);
        for (;;) {
                while (!r->todo_head && !r->cleanup && !r->quit)
                        thread_wait(r);
                if (r->cleanup) {
                        struct cg_cleanup *c = r->cleanup;
                        r->cleanup = c->next;
                        pthread_mutex_unlock(&r->lock);
                        if (cgroup_handler_destroy(r->cg, &c->h, CGROUP_EMPTY_MS) < 0)
                                r->cg_left++;
                        free(c);
                        pthread_mutex_lock(&r->lock);
                        continue;
                }
                /* stopping: start nothing more (runner_stop drops the
                 * jobs left; the loop may be about to close its handles) */
                if (r->quit)
                        break;
#ifdef KAIROS_TEST_HOOKS
                /* a spawn held until kairosd stops (the file says it is
                 * held): the stop must not start it */
                const char *hold = getenv("KAIROS_TEST_RUNNER_HOLD");
                if (hold && *hold && !r->quit) {
                        int fd = open(hold, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
                        if (fd >= 0)
                                close(fd);
                        while (!r->quit)
                                thread_wait(r);
                        continue;
                }
#endif
                struct runner_job *j = r->todo_head;
                r->todo_head = j->next;
                if (!r->todo_head)
                        r->todo_tail = NULL;
                if (r->keeper_gone) {
                        r->keeper_gone = false;
                        if (r->keeper_fd >= 0)
                                close(r->keeper_fd);
                        r->keeper_fd = -1;
                        (void)keeper_start(r);
                }
                j->keeper_slot = keeper_slot_take(r);
                /* quiet reports go now, not after a spawn that may take
                 * long (a cgroup, a slow working directory) */
                bool before = r->unwoken && r->done_head;
                if (r->unwoken)
                        r->unwoken = false;
                pthread_mutex_unlock(&r->lock);
                if (before)
                        wake_loop(r);
                thread_spawn(r, j);
                bool quiet = quiet_start(r, j);
#ifdef KAIROS_TEST_HOOKS
                /* the report of a start reaches the loop late: the child
                 * runs (and may call kairosd) before the loop knows its pid */
                const char *late = getenv("KAIROS_TEST_START_REPORT_DELAY_MS");
                if (late && *late && j->err == 0) {
                        long ms = strtol(late, NULL, 10);
                        struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
                        while (ms > 0 && nanosleep(&ts, &ts) < 0 && errno == EINTR)
                                ;
                }
#endif
                pthread_mutex_lock(&r->lock);
                j->next = NULL;
                if (r->done_tail)
                        r->done_tail->next = j;
                else
                        r->done_head = j;
                r->done_tail = j;
                bool wake = true;
                if (quiet && !r->wake_wanted) {
                        /* its exit wakes the loop, which takes the report
                         * first (on_pidfds): added under the lock, after
                         * the report, so the loop finds it there */
                        struct epoll_event ev = { .events = EPOLLIN, .data.ptr = j };
                        if (epoll_ctl(r->pid_ep, EPOLL_CTL_ADD, j->pidfd, &ev) == 0) {
                                j->pid_watched = true;
                                wake = false;
                                if (!r->unwoken) {
                                        r->unwoken = true;
                                        r->quiet_end = mono_ms() + r->quiet_ms;
                                }
                        }
                }
                if (wake) {
                        /* this wake takes every report */
                        r->unwoken = r->wake_wanted = false;
                } else {
                        quiet_due(r, &wake);
                }
                /* woken after the unlock: the loop takes the lock at once */
                pthread_mutex_unlock(&r->lock);
                if (wake)
                        wake_loop(r);
                pthread_mutex_lock(&r->lock);
        }
        pthread_mutex_unlock(&r->lock);
        return NULL;
}

/* ---- the loop ---- */

static void job_free_prep(struct runner_job *j)
{
        free(j->cands);
        j->cands = NULL;
        free(j->sh_argv);
        j->sh_argv = NULL;
}

static int live_add(struct runner *r, struct runner_job *j)
{
        if (r->nlive == r->cap) {
                size_t cap = r->cap ? r->cap * 2 : 16;
                struct runner_job **n = realloc(r->live, cap * sizeof(*n));
                if (!n)
                        return -ENOMEM;
                r->live = n;
                r->cap = cap;
        }
        r->live[r->nlive++] = j;
        j->live = true;
        return 0;
}

/* The job's cgroup, if any: kill all of it now, remove it on the thread. */
static void cgroup_end(struct runner *r, struct runner_job *j)
{
        if (!cgroup_handler_active(&j->cgh))
                return;
        j->oom_killed = cgroup_handler_oom_killed(&j->cgh);
        cgroup_handler_kill(&j->cgh);
        struct cg_cleanup *c = malloc(sizeof(*c));
        if (!c) {
                /* cannot hand it over: leave the (killed) directories behind */
                cgroup_handler_abandon(&j->cgh);
        } else {
                c->h = j->cgh;
                pthread_mutex_lock(&r->lock);
                c->next = r->cleanup;
                r->cleanup = c;
                pthread_mutex_unlock(&r->lock);
                sem_post(&r->sem);
        }
        cgroup_handler_init(&j->cgh);
}

/* j's tool-call groups: SIGKILLed and forgotten (its handler is over). */
static void tool_groups_end(struct runner *r, struct runner_job *j)
{
        for (unsigned i = 0; i < j->ntool_groups; i++) {
                kill(-j->tool_groups[i], SIGKILL);
                if (r->dm)
                        (void)deadman_unwatch(r->dm, j->tool_groups[i]);
        }
        j->ntool_groups = 0;
}

/* Has j exited?  Then kill what is left of its group, reap it, report. */
static bool check_exit(struct runner *r, size_t i, bool exited)
{
        struct runner_job *j = r->live[i];
        siginfo_t si;
        memset(&si, 0, sizeof si);
        if (!exited && (waitid(P_PID, (id_t)j->pid, &si, WEXITED | WNOHANG | WNOWAIT | __WALL) < 0 ||
                        si.si_pid == 0))
                return false;
        /* the zombie still holds the group id: no other group can have it */
        kill(-j->pid, SIGKILL);
        tool_groups_end(r, j);
        cgroup_end(r, j);
        keeper_forget(r, j);
        if (r->dm)
                (void)deadman_unwatch(r->dm, j->pid); /* before the reap (deadman.h) */
        if (j->pidfd >= 0) {
                close(j->pidfd); /* out of the epoll set with it */
                j->pidfd = -1;
        }
        int status = 0;
        while (waitpid(j->pid, &status, __WALL) < 0 && errno == EINTR)
                ;
        r->live[i] = r->live[--r->nlive];
        j->live = false;
        j->exited(j, WIFEXITED(status) ? WEXITSTATUS(status) : 0,
                  WIFSIGNALED(status) ? WTERMSIG(status) : 0);
        return true;
}

static void on_sigchld(uv_signal_t *h, int sig)
{
        (void)sig;
        struct runner *r = h->data;
        for (size_t i = 0; i < r->nlive;)
                if (r->live[i]->pidfd >= 0 || !check_exit(r, i, false))
                        i++; /* one with a pidfd sends no signal */
        keeper_check(r);
}

static void collect(struct runner *r);

/* A pidfd is readable once its process has exited (a zombie). */
static void on_pidfds(uv_poll_t *h, int status, int events)
{
        (void)status;
        (void)events;
        struct runner *r = h->data;
        /* the quiet reports first: an exit here may be of a start the loop
         * has not taken yet (its pidfd is added after its report) */
        collect(r);
        struct epoll_event ev[16];
        int n;
        while ((n = epoll_wait(r->pid_ep, ev, 16, 0)) < 0 && errno == EINTR)
                ;
        for (int k = 0; k < n; k++) {
                if (ev[k].data.ptr == &r->keeper_pidfd) {
                        keeper_check(r);
                        continue;
                }
                /* still live (an earlier one's callback may have ended it) */
                for (size_t i = 0; i < r->nlive; i++)
                        if (r->live[i] == ev[k].data.ptr) {
                                check_exit(r, i, true);
                                break;
                        }
        }
}

/* SIGCHLD watched from now on (a child without a pidfd). */
static void sigchld_watch(struct runner *r)
{
        if (r->sigchld_on)
                return;
        r->sigchld_on = true;
        uv_signal_start(&r->sigchld, on_sigchld, SIGCHLD);
}

/* The thread's reports, taken on the loop. */
static void collect(struct runner *r)
{
        pthread_mutex_lock(&r->lock);
        struct runner_job *j = r->done_head;
        r->done_head = r->done_tail = NULL;
        r->unwoken = false;
        bool want = r->want_sigchld;
        pthread_mutex_unlock(&r->lock);
        if (want && !r->sigchld_on) {
                sigchld_watch(r);
                keeper_check(r); /* it may be gone already */
        }
        while (j) {
                struct runner_job *next = j->next;
                j->next = NULL;
                job_free_prep(j);
                struct epoll_event ev = { .events = EPOLLIN, .data.ptr = j };
                if (j->err == 0 &&
                    (live_add(r, j) < 0 ||
                     (j->pidfd >= 0 && !j->pid_watched &&
                      epoll_ctl(r->pid_ep, EPOLL_CTL_ADD, j->pidfd, &ev) < 0))) {
                        /* cannot watch it: end it now (it has not read its stdin) */
                        if (j->live) {
                                r->nlive--; /* the last one */
                                j->live = false;
                        }
                        kill(-j->pid, SIGKILL);
                        cgroup_end(r, j);
                        keeper_forget(r, j);
                        if (r->dm)
                                (void)deadman_unwatch(r->dm, j->pid);
                        if (j->pidfd >= 0)
                                close(j->pidfd);
                        j->pidfd = -1;
                        while (waitpid(j->pid, NULL, __WALL) < 0 && errno == EINTR)
                                ;
                        j->err = -ENOMEM;
                        j->err_what = "watch";
                }
                if (j->err) {
                        close(j->fd_in);
                        close(j->fd_out);
                        close(j->fd_err);
                        j->fd_in = j->fd_out = j->fd_err = -1;
                }
                j->started(j);
                /* it may have exited before we watched it (its pidfd, if
                 * any, is readable then: the epoll set says so) */
                if (j->err == 0 && j->live && j->pidfd < 0)
                        sigchld_watch(r);
                if (j->err == 0 && j->live && j->pidfd < 0)
                        for (size_t i = 0; i < r->nlive; i++)
                                if (r->live[i] == j) {
                                        check_exit(r, i, false);
                                        break;
                                }
                j = next;
        }
}

static void on_wake(uv_poll_t *h, int status, int events)
{
        (void)status;
        (void)events;
        struct runner *r = h->data;
        uint64_t n;
        while (read(r->wake_fd, &n, sizeof n) < 0 && errno == EINTR)
                ; /* EAGAIN: nothing (more) to count; the list says what is done */
        collect(r);
}

void runner_release(struct runner *r)
{
        if (!r)
                return;
        pthread_mutex_lock(&r->lock);
        bool wake = r->unwoken && r->done_head;
        if (wake)
                r->unwoken = false;
        else
                r->wake_wanted = true; /* the next report wakes it */
        pthread_mutex_unlock(&r->lock);
        if (wake)
                wake_loop(r);
}

/* The paths to try for argv[0]: itself if it has a '/', else each
 * directory of PATH (from envp; an empty entry is the working directory). */
static int prepare_candidates(struct runner_job *j)
{
        const char *name = j->argv[0];
        size_t argc = 0;
        while (j->argv[argc])
                argc++;
        j->sh_argv = calloc(argc + 2, sizeof(char *));
        if (!j->sh_argv)
                return -ENOMEM;
        j->sh_argv[0] = "/bin/sh";
        for (size_t i = 1; i < argc; i++)
                j->sh_argv[i + 1] = j->argv[i];
        if (strchr(name, '/')) {
                j->cands = calloc(2, sizeof(char *));
                if (!j->cands)
                        return -ENOMEM;
                j->cands[0] = (char *)name;
                return 0;
        }
        const char *path = "/usr/local/bin:/usr/bin:/bin";
        for (char **e = j->envp; e && *e; e++)
                if (strncmp(*e, "PATH=", 5) == 0)
                        path = *e + 5;
        size_t ndirs = 1, nlen = strlen(name), plen = strlen(path);
        for (const char *p = path; *p; p++)
                ndirs += *p == ':';
        /* one block: the pointers, then the strings */
        size_t size = (ndirs + 1) * sizeof(char *) + plen + ndirs * (nlen + 3);
        char **c = malloc(size);
        if (!c)
                return -ENOMEM;
        char *s = (char *)(c + ndirs + 1);
        size_t k = 0;
        for (const char *p = path;;) {
                size_t len = strcspn(p, ":");
                c[k++] = s;
                if (len == 0) {
                        s += sprintf(s, "%s", name) + 1;
                } else {
                        memcpy(s, p, len);
                        s += len;
                        s += sprintf(s, "/%s", name) + 1;
                }
                if (!p[len])
                        break;
                p += len + 1;
        }
        c[k] = NULL;
        j->cands = c;
        return 0;
}

int runner_spawn(struct runner *r, struct runner_job *j)
{
        int p[3][2] = { { -1, -1 }, { -1, -1 }, { -1, -1 } };
        int e = 0;
        j->r = r;
        j->err = 0;
        j->err_what = NULL;
        j->pid = 0;
        j->fd_in = j->fd_out = j->fd_err = -1;
        j->next = NULL;
        j->live = false;
        j->oom_killed = false;
        j->keeper_slot = -1;
        j->ntool_groups = 0;
        j->pid_watched = false;
        j->started_us = 0;
        cgroup_handler_init(&j->cgh);
        if (!j->argv || !j->argv[0])
                return -EINVAL;
        for (int i = 0; i < 3; i++)
                if (pipe2(p[i], O_CLOEXEC) < 0) {
                        e = -errno;
                        goto fail;
                }
        if ((e = prepare_candidates(j)) < 0)
                goto fail;
        /* stdin: the child reads p[0][0]; stdout, stderr: the child writes [1] */
        j->child_fd[0] = p[0][0];
        j->child_fd[1] = p[1][1];
        j->child_fd[2] = p[2][1];
        j->fd_in = p[0][1];
        j->fd_out = p[1][0];
        j->fd_err = p[2][0];
        pthread_mutex_lock(&r->lock);
        if (r->quit) { /* runner_stop: nothing starts any more */
                pthread_mutex_unlock(&r->lock);
                e = -ESHUTDOWN;
                goto fail;
        }
        if (r->todo_tail)
                r->todo_tail->next = j;
        else
                r->todo_head = j;
        r->todo_tail = j;
        pthread_mutex_unlock(&r->lock);
        /* signalled after the unlock: woken under the lock, the thread
         * would block on it at once (a futex wait and wake per spawn) */
        sem_post(&r->sem);
        return 0;
fail:
        job_free_prep(j);
        for (int i = 0; i < 3; i++)
                for (int k = 0; k < 2; k++)
                        if (p[i][k] >= 0)
                                close(p[i][k]);
        j->fd_in = j->fd_out = j->fd_err = -1;
        return e;
}

void runner_kill(struct runner_job *j, int sig)
{
        if (!j->live || j->pid <= 0)
                return;
        kill(-j->pid, sig);
        /* after the handler's: a call still in the handler's group (it has
         * not left it yet) got the signal there */
        for (unsigned i = 0; i < j->ntool_groups; i++)
                kill(-j->tool_groups[i], sig);
        if (sig == SIGKILL)
                cgroup_handler_kill(&j->cgh);
}

bool runner_reap_exited(struct runner_job *j)
{
        if (!j->live || j->pid <= 0)
                return false;
        struct runner *r = j->r;
        for (size_t i = 0; i < r->nlive; i++)
                if (r->live[i] == j)
                        return check_exit(r, i, false);
        return false;
}

int runner_add_tool_group(struct runner_job *j, pid_t pgid)
{
        if (!j->live || j->pid <= 0 || pgid <= 0)
                return -ESRCH;
        if (j->ntool_groups == RUNNER_TOOL_GROUPS)
                return -ENOSPC;
        if (j->r->dm) {
                int e = deadman_watch(j->r->dm, pgid, NULL);
                if (e < 0)
                        return e;
        }
        j->tool_groups[j->ntool_groups++] = pgid;
        keeper_calls_sync(j->r, j);
        return 0;
}

void runner_remove_tool_group(struct runner *r, pid_t pgid)
{
        for (size_t k = 0; k < r->nlive; k++) {
                struct runner_job *j = r->live[k];
                for (unsigned i = 0; i < j->ntool_groups; i++) {
                        if (j->tool_groups[i] != pgid)
                                continue;
                        j->tool_groups[i] = j->tool_groups[--j->ntool_groups];
                        keeper_calls_sync(r, j);
                        if (r->dm)
                                (void)deadman_unwatch(r->dm, pgid);
                        return;
                }
        }
}

int runner_spare_group(struct runner *r, pid_t pgid, bool spare)
{
        if (!r || pgid <= 0)
                return -EINVAL;
        int32_t want = spare ? 0 : (int32_t)pgid;
        for (size_t i = 0; i < RUNNER_HELD_MAX; i++)
                if (__atomic_load_n(&r->ks->held[i], __ATOMIC_ACQUIRE) == want) {
                        __atomic_store_n(&r->ks->held[i], spare ? (int32_t)pgid : 0,
                                         __ATOMIC_RELEASE);
                        return 0;
                }
        return spare ? -ENOSPC : 0;
}

void runner_set_deadman(struct runner *r, struct deadman *dm)
{
        r->dm = dm;
        __atomic_store_n(&r->ks->spare_pid, dm ? (int32_t)deadman_pid(dm) : 0, __ATOMIC_RELEASE);
}

void runner_set_cgroup(struct runner *r, struct cgroup_ctl *c)
{
        r->cg = c;
        /* for the keeper (shared with it): where the handlers' cgroups are */
        bool v2 = false;
        if (c && cgroup_ctl_kill_dir(c, r->ks->root, sizeof r->ks->root, &v2) == 0)
                r->ks->v2 = v2;
        else
                r->ks->root[0] = '\0';
}

void runner_set_user(struct runner *r, const struct handler_user *u)
{
        r->user = u;
}

/* fds 0-2 must be open: a pipe made later must never get one of them. */
static void ensure_stdio(void)
{
        for (int fd = 0; fd < 3; fd++)
                if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
                        int n = open("/dev/null", O_RDWR);
                        if (n >= 0 && n != fd) {
                                dup2(n, fd);
                                close(n);
                        }
                }
}

static int probe_main(void *arg)
{
        struct runner *r = arg;
        if (syscall(SYS_close_range, (unsigned)r->slot_hi + 1, ~0U, CLOSE_RANGE_UNSHARE) < 0)
                _exit(1);
        r->share_files = true; /* the memory is the daemon's (CLONE_VM) */
        _exit(0);
}

/* The slots, and whether this kernel unshares in close_range (5.9 and
 * later): tried once in a child sharing our memory and descriptors.
 * Without it each spawn copies the table as before. */
static void share_files_probe(struct runner *r)
{
        for (int i = 0; i < 3; i++)
                if ((r->slot[i] = open("/dev/null", O_RDWR | O_CLOEXEC)) < 0)
                        return;
        if ((r->slot_null = open("/dev/null", O_RDWR | O_CLOEXEC)) < 0)
                return;
        r->slot_hi = r->slot[0];
        for (int i = 1; i < 3; i++)
                if (r->slot[i] > r->slot_hi)
                        r->slot_hi = r->slot[i];
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        pid_t pid = clone(probe_main, (char *)r->stack + CHILD_STACK,
                          CLONE_VM | CLONE_VFORK | CLONE_FILES | SIGCHLD, r);
        if (pid > 0)
                while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
                        ;
        else
                r->share_files = false;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
}

int runner_new(uv_loop_t *loop, struct runner **ret)
{
        ensure_stdio();
        struct runner *r = calloc(1, sizeof(*r));
        if (!r)
                return -ENOMEM;
        r->loop = loop;
        r->self = getpid();
        r->keeper_fd = -1;
        r->wake_fd = -1;
        r->pid_ep = -1;
        r->quiet_ms = RUNNER_QUIET_MS;
        r->direct_fds = RUNNER_DIRECT_FDS;
        r->keeper_pidfd = -1;
        r->slot[0] = r->slot[1] = r->slot[2] = r->slot_null = -1;
        pthread_mutex_init(&r->lock, NULL);
        sem_init(&r->sem, 0, 0);
        int e;
        r->stack = mmap(NULL, CHILD_STACK, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
        if (r->stack == MAP_FAILED) {
                e = -errno;
                r->stack = NULL;
                goto fail;
        }
        /* the keeper's table, shared with it: made before it is forked */
        r->groups = mmap(NULL, KEEPER_MAX_GROUPS * sizeof(int32_t), PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (r->groups == MAP_FAILED) {
                e = -errno;
                r->groups = NULL;
                goto fail;
        }
        r->ks = mmap(NULL, sizeof(*r->ks), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (r->ks == MAP_FAILED) {
                e = -errno;
                r->ks = NULL;
                goto fail;
        }
        if (!(r->free_slots = malloc(KEEPER_MAX_GROUPS * sizeof(uint32_t)))) {
                e = -ENOMEM;
                goto fail;
        }
        /* exits read from pidfds: SIGCHLD at its default, not an ignore
         * inherited from our parent (its children would be reaped by the
         * kernel); without an epoll set, every exit by SIGCHLD */
        signal(SIGCHLD, SIG_DFL);
        r->pid_ep = epoll_create1(EPOLL_CLOEXEC);
        /* what the child resets besides what clone3 clears (SIGPIPE…) */
        size_t n = 0;
        for (int sig = 1; sig < NSIG; sig++) {
                struct sigaction sa;
                if (sig != SIGKILL && sig != SIGSTOP && sigaction(sig, NULL, &sa) == 0 &&
                    !(sa.sa_flags & SA_SIGINFO) && sa.sa_handler == SIG_IGN)
                        r->ignored[n++] = sig;
        }
        r->ignored[n] = 0;
#ifdef KAIROS_TEST_HOOKS
        /* a kernel without clone3: clone, and exits by SIGCHLD */
        const char *no3 = getenv("KAIROS_TEST_NO_CLONE3");
        r->no_clone3 = no3 && *no3;
        /* a keeper that never exits once kairosd closes its socket */
        const char *stall = getenv("KAIROS_TEST_KEEPER_STALL");
        r->test_keeper_stall = stall && *stall;
        /* quiet reports wait at most this (0: every start wakes the loop) */
        const char *quiet = getenv("KAIROS_TEST_QUIET_MS");
        if (quiet && *quiet)
                r->quiet_ms = (int)strtol(quiet, NULL, 10);
        /* pipes taken directly only below this fd (0: always the slots) */
        const char *direct = getenv("KAIROS_TEST_RUNNER_DIRECT_FDS");
        if (direct && *direct)
                r->direct_fds = (int)strtol(direct, NULL, 10);
#endif
        if ((e = keeper_start(r)) < 0)
                goto fail;
        share_files_probe(r);
        r->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (r->wake_fd < 0) {
                e = -errno;
                goto fail;
        }
        if ((e = uv_poll_init(loop, &r->wake, r->wake_fd)) < 0)
                goto fail;
        r->wake.data = r;
        uv_poll_start(&r->wake, UV_READABLE, on_wake);
        uv_signal_init(loop, &r->sigchld);
        r->sigchld.data = r;
        if (r->pid_ep >= 0 && uv_poll_init(loop, &r->pid_poll, r->pid_ep) < 0) {
                if (r->keeper_pidfd >= 0)
                        close(r->keeper_pidfd);
                r->keeper_pidfd = -1;
                r->want_sigchld = true;
                close(r->pid_ep);
                r->pid_ep = -1;
        }
        if (r->pid_ep >= 0) {
                r->pid_poll.data = r;
                uv_poll_start(&r->pid_poll, UV_READABLE, on_pidfds);
        }
        if (r->want_sigchld)
                sigchld_watch(r);
        /* the thread blocks every signal: the daemon's handlers never run on
         * it, and a child starts with every signal blocked */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        e = -pthread_create(&r->thread, NULL, thread_main, r);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (e < 0) {
                uv_close((uv_handle_t *)&r->wake, NULL);
                uv_close((uv_handle_t *)&r->sigchld, NULL);
                if (r->pid_ep >= 0)
                        uv_close((uv_handle_t *)&r->pid_poll, NULL);
                goto fail;
        }
        r->thread_started = true;
        *ret = r;
        return 0;
fail:
        runner_free(r);
        return e;
}

/* A job the thread started that the loop never saw: end it now. */
static void end_unseen(struct runner *r, struct runner_job *j)
{
        if (j->err == 0) {
                kill(-j->pid, SIGKILL);
                if (cgroup_handler_active(&j->cgh))
                        cgroup_handler_kill(&j->cgh);
                keeper_forget(r, j);
                if (r->dm)
                        (void)deadman_unwatch(r->dm, j->pid);
                if (j->pidfd >= 0)
                        close(j->pidfd);
                j->pidfd = -1;
                while (waitpid(j->pid, NULL, __WALL) < 0 && errno == EINTR)
                        ;
                if (cgroup_handler_active(&j->cgh) &&
                    cgroup_handler_destroy(r->cg, &j->cgh, CGROUP_EMPTY_MS) < 0)
                        r->cg_left++;
        }
        close(j->fd_in);
        close(j->fd_out);
        close(j->fd_err);
        j->fd_in = j->fd_out = j->fd_err = -1;
        job_free_prep(j);
}

void runner_stop(struct runner *r)
{
        if (!r || !r->thread_started)
                return;
        pthread_mutex_lock(&r->lock);
        r->quit = true;
        sem_post(&r->sem);
        pthread_mutex_unlock(&r->lock);
        pthread_join(r->thread, NULL);
        r->thread_started = false;
        /* the thread is gone: the lists are the loop's */
        unsigned dropped = 0, ended = 0;
        for (struct runner_job *j = r->todo_head, *next; j; j = next) {
                next = j->next;
                j->next = NULL;
                for (int i = 0; i < 3; i++) {
                        close(j->child_fd[i]);
                        j->child_fd[i] = -1;
                }
                j->err = -ECANCELED;
                end_unseen(r, j);
                dropped++;
        }
        r->todo_head = r->todo_tail = NULL;
        for (struct runner_job *j = r->done_head, *next; j; j = next) {
                next = j->next;
                j->next = NULL;
                ended += j->err == 0;
                end_unseen(r, j);
        }
        r->done_head = r->done_tail = NULL;
        if (dropped || ended)
                log_info("stopping: %u handler%s not started, %u started too late and killed",
                         dropped, dropped == 1 ? "" : "s", ended);
}

/* The keeper's exit once its socket is closed: a kill of what handlers
 * left and a sweep of their cgroups, milliseconds.  A keeper still there
 * after KEEPER_EXIT_MS is stuck: killed, so kairosd's stop never hangs on
 * it (and it is not left behind, orphaned). */
static void keeper_reap(struct runner *r)
{
        if (r->keeper > 0 && deadman_reap_within(r->keeper, r->keeper_pidfd, KEEPER_EXIT_MS))
                log_warning("the handler keeper (pid %d) did not exit within %d ms of its "
                            "socket's close: killed (what handlers left behind in their "
                            "cgroups may still run)",
                            (int)r->keeper, KEEPER_EXIT_MS);
}

void runner_free(struct runner *r)
{
        if (!r)
                return;
        runner_stop(r);
        if (r->keeper_fd >= 0)
                close(r->keeper_fd); /* the keeper sees end-of-file and exits */
        keeper_reap(r);
        if (r->stack)
                munmap(r->stack, CHILD_STACK);
        if (r->groups)
                munmap(r->groups, KEEPER_MAX_GROUPS * sizeof(int32_t));
        if (r->ks)
                munmap(r->ks, sizeof(*r->ks));
        free(r->free_slots);
        if (r->wake_fd >= 0)
                close(r->wake_fd); /* its poll handle closed with the loop's */
        if (r->keeper_pidfd >= 0)
                close(r->keeper_pidfd);
        if (r->pid_ep >= 0)
                close(r->pid_ep); /* its poll handle closed with the loop's */
        for (int i = 0; i < 3; i++)
                if (r->slot[i] >= 0)
                        close(r->slot[i]);
        if (r->slot_null >= 0)
                close(r->slot_null);
        while (r->cleanup) { /* only if the thread never ran */
                struct cg_cleanup *c = r->cleanup;
                r->cleanup = c->next;
                cgroup_handler_abandon(&c->h);
                free(c);
        }
        pthread_mutex_destroy(&r->lock);
        sem_destroy(&r->sem);
        free(r->live);
        free(r);
}
