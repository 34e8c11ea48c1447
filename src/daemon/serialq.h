/* SPDX-License-Identifier: MIT */
/* serialq: blocking jobs (WAL appends and flushes, file reads) run on
 * threads of its own (libuv's thread pool if they cannot be started),
 * strictly one after another per queue (one queue per mandate), so one slow
 * fdatasync never stalls the loop or other mandates.  `work` runs on one of
 * those threads; `done` runs on the loop thread afterwards. */
#pragma once

#include <stdbool.h>
#include <uv.h>

struct serialq_job;

/* Counts jobs in flight over all queues (for a clean shutdown). */
struct serialq_group {
        unsigned inflight;
        void (*drained)(void *ctx);  /* called when inflight drops to 0 */
        void *ctx;
};

struct serialq {
        uv_loop_t *loop;
        struct serialq_group *group;
        struct serialq_job *head, *tail;
        struct serialq *next_ready;  /* in the threads' list of queues to run or done */
        bool busy;
};

void serialq_init(struct serialq *q, uv_loop_t *loop, struct serialq_group *group);
/* Queue a job.  -ENOMEM (then nothing is queued). */
int serialq_submit(struct serialq *q, void (*work)(void *arg), void (*done)(void *arg),
                   void *arg);
bool serialq_idle(const struct serialq *q);
/* Before the loop's handles are closed (on the loop thread): wait for the
 * jobs running on serialq's threads and run their `done`; later jobs go to
 * libuv's thread pool. */
void serialq_stop(uv_loop_t *loop);
/* fn runs on the pool thread after each job's work (cluster mode: the
 * connection the job was lent goes back).  Set once at start, before the
 * first job; NULL: nothing. */
void serialq_set_thread_done(void (*fn)(void));
