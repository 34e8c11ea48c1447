/* SPDX-License-Identifier: MIT */
#include "serialq.h"

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

struct serialq_job {
        void (*work)(void *arg);
        void (*done)(void *arg);
        void *arg;
        struct serialq_job *next;
        /* libuv's pool runs it (after serialq_stop, or without the threads):
         * here, not in struct serialq, where every mandate carried its 128
         * bytes for the few jobs that ever need it */
        uv_work_t req;
};

/* one per mandate, in struct mandate: kept to its six words (100,000
 * mandates at start-up) */
_Static_assert(sizeof(struct serialq) <= 6 * sizeof(void *), "struct serialq grew");

/* The threads that run the jobs, for the loop of the first queue: as many
 * as libuv's pool would have (UV_THREADPOOL_SIZE, which kairosd sets to 16
 * unless it is set; else 4), so startup recovery's lanes run as widely as
 * before.  A queue
 * whose head job is to run goes into `todo`; a thread takes it, runs the
 * job and puts the queue into `done`; the loop is woken through an eventfd
 * only when `done` was empty (the completions of one wake-up in one
 * callback), and a thread only when one waits: the one that went idle
 * last (its stack and heap still in the cache; a condition wakes them in
 * turn), through a futex of its own, woken after the unlock (libuv's pool
 * signals under its mutex, and the woken thread blocks on it at once) and
 * waited on without the mutex (pthread_cond_wait takes the mutex back
 * marked contended: one more futex wake at its next unlock).  Without them (a thread or the
 * eventfd could not be made, or a queue of another loop) the jobs go to
 * libuv's thread pool as before. */
#define SERIALQ_THREADS 4
#define SERIALQ_THREADS_MAX 1024

/* an idle thread: `asleep` is its futex, cleared by the one that wakes it */
struct idler {
        struct idler *next;   /* under lock: the idle stack */
        uint32_t asleep;      /* atomic */
};

static struct engine {
        uv_loop_t *loop;     /* NULL: not started; its threads serve this loop only */
        bool failed;         /* libuv's pool then */
        pthread_mutex_t lock;
        pthread_cond_t done_cond;               /* serialq_stop waits on it */
        pthread_cond_t ready_cond;              /* engine_start waits on it */
        unsigned ready;                         /* under lock: threads started */
        bool draining;                          /* under lock */
        struct serialq *todo_head, *todo_tail;  /* under lock */
        struct serialq *done_head, *done_tail;  /* under lock */
        struct idler *idle;                     /* under lock: the last one idle first */
        int done_fd;
        uv_poll_t poll;
        unsigned running;                       /* the loop's: queues in todo, run or done */
} engine = { .lock = PTHREAD_MUTEX_INITIALIZER,
             .done_cond = PTHREAD_COND_INITIALIZER, .ready_cond = PTHREAD_COND_INITIALIZER,
             .done_fd = -1 };

static void start_next(struct serialq *q);

/* set once at start, before the first job (serialq_set_thread_done) */
static void (*thread_done)(void);

void serialq_set_thread_done(void (*fn)(void))
{
        thread_done = fn;
}

static void run_head(struct serialq *q)
{
        q->head->work(q->head->arg);
        /* a database connection the job was lent goes back (cluster mode) */
        if (thread_done)
                thread_done();
}

static void on_work(uv_work_t *req)
{
        run_head(req->data);
}

/* q's head job has run: on the loop */
static void after_work(struct serialq *q)
{
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

static void on_after_work(uv_work_t *req, int status)
{
        (void)status; /* jobs are never cancelled */
        after_work(req->data);
}

static void idler_wait(struct idler *me)
{
        while (__atomic_load_n(&me->asleep, __ATOMIC_ACQUIRE))
                (void)syscall(SYS_futex, &me->asleep, FUTEX_WAIT_PRIVATE, 1, NULL, NULL, 0);
}

static void idler_wake(struct idler *w)
{
        __atomic_store_n(&w->asleep, 0, __ATOMIC_RELEASE);
        (void)syscall(SYS_futex, &w->asleep, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static void *engine_thread(void *arg)
{
        struct engine *e = arg;
        struct idler me = { NULL, 0 };
        pthread_setname_np(pthread_self(), "kairosd-jobs");
        pthread_mutex_lock(&e->lock);
        e->ready++;
        pthread_cond_signal(&e->ready_cond);
        for (;;) {
                while (!e->todo_head) {
                        /* on the idle stack until one pops and wakes it */
                        me.asleep = 1;
                        me.next = e->idle;
                        e->idle = &me;
                        pthread_mutex_unlock(&e->lock);
                        idler_wait(&me);
                        pthread_mutex_lock(&e->lock);
                }
                struct serialq *q = e->todo_head;
                e->todo_head = q->next_ready;
                if (!e->todo_head)
                        e->todo_tail = NULL;
                pthread_mutex_unlock(&e->lock);
                run_head(q);
                pthread_mutex_lock(&e->lock);
                q->next_ready = NULL;
                bool wake = !e->done_head;
                if (e->done_tail)
                        e->done_tail->next_ready = q;
                else
                        e->done_head = q;
                e->done_tail = q;
                if (e->draining)
                        pthread_cond_signal(&e->done_cond);
                if (wake) {
                        /* idle before the loop hears of it (nothing else
                         * to take): the next job the loop hands out, often
                         * that queue's next, comes back to this thread */
                        bool idle = !e->todo_head;
                        if (idle) {
                                me.asleep = 1;
                                me.next = e->idle;
                                e->idle = &me;
                        }
                        pthread_mutex_unlock(&e->lock);
                        uint64_t one = 1;
                        while (write(e->done_fd, &one, sizeof one) < 0 && errno == EINTR)
                                ;
                        if (idle)
                                idler_wait(&me);
                        pthread_mutex_lock(&e->lock);
                }
        }
        return NULL;
}

static void finish_done(struct engine *e, struct serialq *q)
{
        while (q) {
                struct serialq *next = q->next_ready;
                q->next_ready = NULL;
                /* the loop runs while a job is out (as libuv's requests
                 * keep it), not for the idle threads */
                if (--e->running == 0)
                        uv_unref((uv_handle_t *)&e->poll);
                after_work(q);
                q = next;
        }
}

static void on_done(uv_poll_t *h, int status, int events)
{
        (void)status;
        (void)events;
        struct engine *e = h->data;
        uint64_t n;
        while (read(e->done_fd, &n, sizeof n) < 0 && errno == EINTR)
                ; /* EAGAIN: nothing (more) to count; the list says what is done */
        pthread_mutex_lock(&e->lock);
        struct serialq *q = e->done_head;
        e->done_head = e->done_tail = NULL;
        pthread_mutex_unlock(&e->lock);
        finish_done(e, q);
}

void serialq_stop(uv_loop_t *loop)
{
        struct engine *e = &engine;
        if (e->loop != loop)
                return;
        /* what runs (and what its `done` queues) ends here, on the loop
         * thread: the loop's handles, this one's too, are closed next */
        while (e->running) {
                pthread_mutex_lock(&e->lock);
                e->draining = true;
                while (!e->done_head)
                        pthread_cond_wait(&e->done_cond, &e->lock);
                struct serialq *q = e->done_head;
                e->done_head = e->done_tail = NULL;
                e->draining = false;
                pthread_mutex_unlock(&e->lock);
                finish_done(e, q);
        }
        /* later jobs: libuv's pool (its threads stay idle), never started again */
        e->loop = NULL;
        e->failed = true;
}

/* The threads for loop, once (on the loop thread). */
static void engine_start(uv_loop_t *loop)
{
        struct engine *e = &engine;
        if (e->loop || e->failed)
                return;
        e->failed = true;
        e->done_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (e->done_fd < 0)
                return;
        if (uv_poll_init(loop, &e->poll, e->done_fd) < 0) {
                close(e->done_fd);
                e->done_fd = -1;
                return;
        }
        /* no signal handler of the daemon runs on them */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        unsigned want = SERIALQ_THREADS;
        const char *env = getenv("UV_THREADPOOL_SIZE");
        if (env) { /* read as libuv reads it */
                long v = atol(env);
                want = v < 1 ? 1 : v > SERIALQ_THREADS_MAX ? SERIALQ_THREADS_MAX : (unsigned)v;
        }
        unsigned started = 0;
        for (; started < want; started++) {
                pthread_t t;
                if (pthread_create(&t, NULL, engine_thread, e) != 0)
                        break;
                pthread_detach(t);
        }
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        /* Each thread is past its start (its name set, waiting for work)
         * before the daemon goes on: a process forked later (the keeper)
         * must not inherit a lock a starting thread held (the sanitizers'
         * thread registry; a child of a threaded process may only use what
         * is safe after fork, and a lock taken by another thread never is). */
        pthread_mutex_lock(&e->lock);
        while (e->ready < started)
                pthread_cond_wait(&e->ready_cond, &e->lock);
        pthread_mutex_unlock(&e->lock);
        e->poll.data = e;
        uv_poll_start(&e->poll, UV_READABLE, on_done);
        uv_unref((uv_handle_t *)&e->poll);
        if (started == 0) {
                uv_close((uv_handle_t *)&e->poll, NULL); /* its fd stays open: never reused */
                return;
        }
        e->failed = false;
        e->loop = loop;
}

static void start_next(struct serialq *q)
{
        q->busy = true;
        struct engine *e = &engine;
        if (e->loop == q->loop) {
                if (e->running++ == 0)
                        uv_ref((uv_handle_t *)&e->poll);
                q->next_ready = NULL;
                pthread_mutex_lock(&e->lock);
                if (e->todo_tail)
                        e->todo_tail->next_ready = q;
                else
                        e->todo_head = q;
                e->todo_tail = q;
                struct idler *w = e->idle;
                if (w)
                        e->idle = w->next;
                pthread_mutex_unlock(&e->lock);
                if (w)
                        idler_wake(w);
                return;
        }
        /* the head job's own request: it is freed only after on_after_work */
        q->head->req.data = q;
        int r = uv_queue_work(q->loop, &q->head->req, on_work, on_after_work);
        if (r < 0)
                abort(); /* only fails for a NULL work callback */
}

void serialq_init(struct serialq *q, uv_loop_t *loop, struct serialq_group *group)
{
        *q = (struct serialq){ .loop = loop, .group = group };
        engine_start(loop);
}

int serialq_submit(struct serialq *q, void (*work)(void *arg), void (*done)(void *arg),
                   void *arg)
{
        struct serialq_job *job = calloc(1, sizeof(*job));
        if (!job)
                return -ENOMEM;
        job->work = work;
        job->done = done;
        job->arg = arg;
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
