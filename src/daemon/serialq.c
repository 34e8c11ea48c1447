/* SPDX-License-Identifier: MIT */
#include "serialq.h"

#include <errno.h>
#include <stdlib.h>

struct serialq_job {
        void (*work)(void *arg);
        void (*done)(void *arg);
        void *arg;
        struct serialq_job *next;
};

static void start_next(struct serialq *q);

/* set once at start, before the first job (serialq_set_thread_done) */
static void (*thread_done)(void);

void serialq_set_thread_done(void (*fn)(void))
{
        thread_done = fn;
}

static void on_work(uv_work_t *req)
{
        struct serialq *q = req->data;
        q->head->work(q->head->arg);
        /* a database connection the job was lent goes back (cluster mode) */
        if (thread_done)
                thread_done();
}

static void on_after_work(uv_work_t *req, int status)
{
        (void)status; /* jobs are never cancelled */
        struct serialq *q = req->data;
        struct serialq_job *job = q->head;
        q->head = job->next;
        if (!q->head)
                q->tail = NULL;
        q->busy = false;
        struct serialq_group *g = q->group;
        bool more = q->head != NULL;
        /* `done` runs before the next job starts, so it never races with a
         * later job of the same queue.  If the queue is now empty, `done`
         * may free the queue's owner: q is not touched again then. */
        if (job->done)
                job->done(job->arg);
        free(job);
        if (more && !q->busy)
                start_next(q);
        if (g && --g->inflight == 0 && g->drained)
                g->drained(g->ctx);
}

static void start_next(struct serialq *q)
{
        q->busy = true;
        q->req.data = q;
        int r = uv_queue_work(q->loop, &q->req, on_work, on_after_work);
        if (r < 0)
                abort(); /* only fails for a NULL work callback */
}

void serialq_init(struct serialq *q, uv_loop_t *loop, struct serialq_group *group)
{
        *q = (struct serialq){ .loop = loop, .group = group };
}

int serialq_submit(struct serialq *q, void (*work)(void *arg), void (*done)(void *arg),
                   void *arg)
{
        struct serialq_job *job = calloc(1, sizeof(*job));
        if (!job)
                return -ENOMEM;
        *job = (struct serialq_job){ work, done, arg, NULL };
        if (q->tail)
                q->tail->next = job;
        else
                q->head = job;
        q->tail = job;
        if (q->group)
                q->group->inflight++;
        if (!q->busy)
                start_next(q);
        return 0;
}

bool serialq_idle(const struct serialq *q)
{
        return !q->busy && !q->head;
}
