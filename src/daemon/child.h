/* SPDX-License-Identifier: MIT */
/* child: one supervised child process on the loop, for handlers, hooks and
 * probes alike.  On top of the runner (runner.h): it feeds the child's stdin
 * a document, reads its stdout (kept up to a cap: more kills it) and its
 * stderr (its last CHILD_TAIL bytes kept), ends it at its timeout (SIGTERM,
 * then SIGKILL every CHILD_KILL_GRACE_MS while it lives) and reports once
 * that it is over: it exited and both outputs ended, or — at the timeout or
 * a grace with the child already gone — something that left its process
 * group still holds its output open (no more is read).
 *
 * Use: zero a struct child, set its options, child_start(); done() comes
 * once (not after a failed start: started() tells it); child_close() then
 * closes its handles and closed() says the struct may be freed. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "kairos/kbuf.h"
#include "runner.h"

#define CHILD_TAIL 2048             /* bytes of stderr kept: its end */
#define CHILD_KILL_GRACE_MS 5000    /* from SIGTERM to SIGKILL */

struct child;
typedef void (*child_cb)(struct child *c);
/* A piece read from fd 1 or 2; p NULL, n 0: that output ended. */
typedef void (*child_read_cb)(struct child *c, int fd, const char *p, size_t n);

struct child {
        /* options, set before child_start; argv, envp and cwd must live until
         * started(), in until done() */
        char **argv, **envp;
        const char *cwd;
        const char *cg_hint;          /* names its cgroup (runner.h) */
        struct cgroup_limits limits;
        const char *in;               /* stdin; closed once written */
        size_t in_len;
        bool quiet;                   /* its start reported with its exit, if
                                       * quick (runner_job.quiet): its timeout
                                       * counts from the report */
        uint64_t timeout_ms;
        size_t out_max;               /* stdout kept in out; more: overflow, SIGKILL;
                                       * 0: not kept */
        child_read_cb read;           /* optional: each piece as it is read */
        child_cb started;             /* it runs (pid), or err: nothing runs */
        child_cb done;                /* it is over (see above) */
        child_cb closed;              /* its handles are closed: free it now */
        void *data;
        /* results */
        int err;                      /* of the start: 0 or a negative errno */
        const char *err_what;         /* what failed (runner.h) */
        pid_t pid;                    /* also its process group */
        bool running;                 /* started, not reaped */
        bool exited, timed_out, overflow, oom_killed, finished;
        int exit_status, term_signal;
        struct kbuf out;
        char tail[CHILD_TAIL];
        size_t tail_len;
        /* private */
        struct runner_job job;
        uv_loop_t *loop;
        uv_pipe_t pin, pout, perr;
        uv_timer_t timer;
        uv_write_t wreq;
        unsigned open_handles;        /* 0: never made, or all closed */
        bool out_eof, err_eof;
        child_cb after;               /* child_after's */
};

/* Make its handles on loop (once, before child_start or child_after). */
void child_init(struct child *c, uv_loop_t *loop);
/* Spawn it through r.  0: started() follows; a negative errno: nothing
 * happens (runner_spawn). */
int child_start(struct child *c, struct runner *r);
/* sig to its process group while it runs (runner_kill). */
void child_kill(struct child *c, int sig);
/* SIGTERM now, SIGKILL after the grace (instead of its timeout). */
void child_stop(struct child *c);
/* Before a start: cb in ms (on its timer); child_cancel_after stops it. */
void child_after(struct child *c, uint64_t ms, child_cb cb);
void child_cancel_after(struct child *c);
/* Keep p as if the child had written it to stderr. */
void child_tail_add(struct child *c, const char *p, size_t n);
/* Close its handles (closed() follows); nothing if child_init never ran. */
void child_close(struct child *c);
/* Free what it holds (after closed(), or if child_init never ran). */
void child_free(struct child *c);
