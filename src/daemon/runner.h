/* SPDX-License-Identifier: MIT */
/* runner: starts handler processes and tells when they end, without
 * re-executing kairosd and without blocking the loop.
 *
 * A spawn: the loop makes the three stdio pipes and hands the job to the
 * runner's own thread, which starts the child with clone3(CLONE_VM |
 * CLONE_VFORK | CLONE_CLEAR_SIGHAND) (clone on a kernel before 5.5) — no
 * copy of the daemon's page tables, the thread waits only until the child
 * has exec'd — and reports back through an eventfd the loop polls.  The child, before
 * exec: its own process group, PR_SET_PDEATHSIG SIGKILL (then getppid() to
 * close the race with a daemon that died meanwhile), writes its group into
 * the keeper's table, takes the pipes as fds 0-2, closes every other fd,
 * gets back the open-file soft limit kairosd started with, resets signal
 * dispositions (the kernel did the handled ones; the child the ones kairosd
 * ignores, known when the runner starts; every one of them one by one
 * without clone3) and, in one call, the mask, changes directory and execs
 * (searching the handler's PATH, /bin/sh for a file without #!).
 *
 * Exit: SIGCHLD on the loop; an exited handler is seen with
 * waitid(WNOWAIT), its whole process group is killed (SIGKILL) while the
 * zombie still holds the group id, then it is reaped.
 *
 * No handler and no child of it outlives kairosd:
 *  - a handler dies with kairosd by PR_SET_PDEATHSIG (set on the runner's
 *    thread, which lives as long as the daemon);
 *  - the keeper, a small process forked once at start (not an exec of
 *    kairosd), shares with kairosd a table of handler process groups
 *    (MAP_SHARED, made before the fork; a keeper started again after one
 *    was killed inherits it): each child writes its own group into its
 *    slot before it execs, kairosd clears the slot before it reaps the
 *    child — no message, no system call per step.  When kairosd dies,
 *    however (kill -9 included), the keeper reads end-of-file on its socket
 *    and SIGKILLs every group in the table, then exits.
 *  A grandchild that leaves the handler's process group (setsid, setpgid)
 *  escapes both, unless handlers have cgroups (below).  So does, on
 *  purpose, a tool call the handler's step registered in a group of its own
 *  (runner_add_tool_group): kairosd kills it with the handler, the keeper
 *  does not, so that it outlives a kairosd that dies (docs/design.md §10).
 *
 * With a delegated cgroup (runner_set_cgroup; cgroup.h) the runner's thread
 * creates the handler's own cgroup with its limits before the clone, the
 * child joins it (writes to its cgroup.procs) before anything else, and
 * when the handler exits the loop notes an OOM kill and kills the whole
 * cgroup (cgroup.kill; on cgroup v1, each pid it lists), setsid
 * grandchildren included; the thread then waits for it to empty and
 * removes it.  See docs/ and kairosd(8), HANDLERS. */
#pragma once

#include <stdbool.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <uv.h>

#include "cgroup.h"
#include "creds.h"

struct runner;
struct runner_job;

/* The most tool calls of one handler that run in a process group of their
 * own at once (runner_add_tool_group). */
#define RUNNER_TOOL_GROUPS 8

typedef void (*runner_started_cb)(struct runner_job *job);
typedef void (*runner_exited_cb)(struct runner_job *job, int exit_status, int term_signal);

struct runner_job {
        /* set by the caller; argv, envp and cwd must live until started */
        char **argv;                /* argv[0]: a path, or a name searched on envp's PATH */
        char **envp;
        const char *cwd;
        runner_started_cb started;  /* on the loop: err or pid + fds */
        runner_exited_cb exited;    /* on the loop: the handler was reaped */
        void *data;
        const char *cg_hint;        /* names the handler's cgroup (with a counter) */
        struct cgroup_limits limits; /* enforced only with a cgroup */
        /* quiet: the runner's thread writes in (in_len <= PIPE_BUF; it must
         * live until started) to the child's stdin and closes it (fd_in is
         * -1 in started), puts the child's pidfd into the loop's epoll set
         * itself and reports the start without waking the loop: the loop
         * takes the report when it wakes for the child's exit (or anything
         * else of the runner's), at the latest RUNNER_QUIET_MS after it, at
         * once after runner_release.  See docs/design.md. */
        bool quiet;
        const char *in;
        size_t in_len;
        /* results (valid in started) */
        int err;                    /* 0, or a negative errno: nothing runs */
        const char *err_what;       /* what failed: "pipe", "clone", "chdir", "execute" */
        pid_t pid;                  /* also the process group id */
        uint64_t started_us;        /* CLOCK_MONOTONIC when its clone returned (exec'd) */
        bool oom_killed;            /* valid in exited: the OOM killer killed in its cgroup */
        int fd_in, fd_out, fd_err;  /* the daemon's ends, owned by the caller after started */
        /* private */
        struct runner *r;
        struct runner_job *next;
        int child_fd[3];
        char **cands;               /* the paths to try, NULL-terminated */
        char **sh_argv;             /* /bin/sh CAND ARGS… for a file without #! */
        int child_errno;
        int child_stage;
        int keeper_slot;            /* its group's place in the keeper's table; -1 none */
        int pidfd;                  /* clone3's (CLONE_PIDFD): it exits without a signal; -1 none */
        bool clear_sighand;         /* started by clone3(CLONE_CLEAR_SIGHAND) */
        bool pid_watched;           /* its pidfd put in the epoll set by the thread (quiet) */
        bool direct_fds;            /* shared table: the child dup2()s child_fd, not the slots */
        int unshare_below;          /* shared table: the child keeps fds below this */
        bool reset_nofile;          /* the handler gets the open-file limit kairosd started with */
        struct rlimit nofile;
        struct cgroup_handler cgh;
        bool live;
        /* the process groups of its tool calls (runner_add_tool_group) */
        pid_t tool_groups[RUNNER_TOOL_GROUPS];
        unsigned ntool_groups;
};

/* Start the runner: its thread, the keeper and the SIGCHLD watch. */
int runner_new(uv_loop_t *loop, struct runner **ret);
/* Stop its thread, on the loop once it has ended and before it closes its
 * handles: a job it has not started is never started (its callbacks are
 * never called), one started but not yet reported is killed and reaped.
 * The thread never touches the loop again. */
void runner_stop(struct runner *r);
/* Stop its thread (runner_stop, if not done) and the keeper. */
void runner_free(struct runner *r);

/* Cluster mode: every process started from now on is watched by dm (its
 * process group, and its cgroup if it has one, killed at the node's lease
 * deadline or when kairosd dies; deadman.h); dm lives longer than r. */
struct deadman;
void runner_set_deadman(struct runner *r, struct deadman *dm);
/* Give each handler its own cgroup from now on (c lives longer than r). */
void runner_set_cgroup(struct runner *r, struct cgroup_ctl *c);
/* Run every job as u (HandlerUser=; creds.h) from now on: the child joins
 * its cgroup as kairosd, then takes u's groups and ids and drops every
 * capability before it executes (u lives longer than r). */
void runner_set_user(struct runner *r, const struct handler_user *u);

/* The longest a quiet start's report waits for the loop to wake, ms. */
#define RUNNER_QUIET_MS 5

/* Quiet starts (runner_job.quiet) are reported now: the loop waits for
 * one (a tool call of a handler whose start it has not seen). */
void runner_release(struct runner *r);

/* Start job.  0: started() will be called; a negative errno: nothing
 * happens (EMFILE, ENFILE: no fds for the pipes; ENOMEM; ESHUTDOWN: after
 * runner_stop). */
int runner_spawn(struct runner *r, struct runner_job *job);

/* Signal the job's process group and those of its tool calls (nothing once
 * it was reaped); SIGKILL with a cgroup kills the whole cgroup. */
void runner_kill(struct runner_job *job, int sig);

/* Has the job's process exited?  Then it is reaped now, as when its exit
 * is seen (exited() called before this returns true), not after the loop's
 * next wait for its pidfd or SIGCHLD.  false: still running (or reaped). */
bool runner_reap_exited(struct runner_job *job);

/* A tool call of the job (a `kairosctl tool run` its handler started) runs
 * in process group pgid of its own, not in the handler's: it is not in the
 * keeper's table, so it outlives a kairosd that dies (docs/design.md §10),
 * but every signal runner_kill sends the handler goes to it too (after the
 * handler's group), and it is SIGKILLed when the handler exits, as the
 * handler's group is.  With a deadman (cluster mode) it is watched as the
 * handler is.  0; -ESRCH the job is not running; -ENOSPC it has
 * RUNNER_TOOL_GROUPS already; -EAGAIN the deadman cannot take it. */
int runner_add_tool_group(struct runner_job *job, pid_t pgid);
/* pgid's call is over (finished, or its connection closed): forgotten. */
void runner_remove_tool_group(struct runner *r, pid_t pgid);
/* A process group of a call an earlier kairosd left (toolhold), which the
 * keeper must spare too when this kairosd dies (spare), or no longer (its
 * hold ended): 0, or -ENOSPC (RUNNER_HELD_MAX held already: it dies then). */
#define RUNNER_HELD_MAX 64
int runner_spare_group(struct runner *r, pid_t pgid, bool spare);
