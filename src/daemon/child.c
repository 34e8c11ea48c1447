/* SPDX-License-Identifier: MIT */
/* child: see child.h. */
#include "child.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "kairos/probeout.h"

#define READ_CHUNK 65536

/* Read buffer for what is not kept: consumed in the read callback (the loop
 * is one thread). */
static char scratch[READ_CHUNK];

static void finish(struct child *c)
{
        if (c->finished)
                return;
        c->finished = true;
        uv_timer_stop(&c->timer);
        c->done(c);
}

static void maybe_finish(struct child *c)
{
        if (!c->out_eof || !c->err_eof)
                return;
        if (c->exited) {
                finish(c);
                return;
        }
        /* Its output ended: it has most likely exited just now (a process
         * closes its files right before it becomes a zombie).  Reaped now if
         * so (on_exited finishes), not after one more wait of the loop for
         * its pidfd. */
        if (c->running)
                (void)runner_reap_exited(&c->job);
}

static void on_closed(uv_handle_t *h)
{
        struct child *c = h->data;
        if (--c->open_handles == 0 && c->closed)
                c->closed(c);
}

void child_close(struct child *c)
{
        if (!c->loop)
                return;
        uv_handle_t *hs[] = { (uv_handle_t *)&c->pin, (uv_handle_t *)&c->pout,
                              (uv_handle_t *)&c->perr, (uv_handle_t *)&c->timer };
        for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
                if (!uv_is_closing(hs[i]))
                        uv_close(hs[i], on_closed);
}

void child_free(struct child *c)
{
        kbuf_free(&c->out);
}

void child_kill(struct child *c, int sig)
{
        if (c->running)
                runner_kill(&c->job, sig);
}

static void on_kill_timer(uv_timer_t *t)
{
        struct child *c = t->data;
        if (c->exited) {
                finish(c); /* something outside its group holds its output open */
                return;
        }
        child_kill(c, SIGKILL);
        uv_timer_start(&c->timer, on_kill_timer, CHILD_KILL_GRACE_MS, 0);
}

void child_stop(struct child *c)
{
        child_kill(c, SIGTERM);
        uv_timer_stop(&c->timer);
        uv_timer_start(&c->timer, on_kill_timer, CHILD_KILL_GRACE_MS, 0);
}

static void on_timeout(uv_timer_t *t)
{
        struct child *c = t->data;
        c->timed_out = true;
        if (c->exited) {
                finish(c);
                return;
        }
        child_stop(c);
}

static void on_after(uv_timer_t *t)
{
        struct child *c = t->data;
        child_cb cb = c->after;
        c->after = NULL;
        cb(c);
}

void child_after(struct child *c, uint64_t ms, child_cb cb)
{
        c->after = cb;
        uv_timer_start(&c->timer, on_after, ms, 0);
}

void child_cancel_after(struct child *c)
{
        c->after = NULL;
        uv_timer_stop(&c->timer);
}

static void on_exited(struct runner_job *job, int exit_status, int term_signal)
{
        struct child *c = job->data;
        c->running = false;
        c->exited = true;
        c->exit_status = exit_status;
        c->term_signal = term_signal;
        c->oom_killed = job->oom_killed;
        maybe_finish(c);
}

void child_tail_add(struct child *c, const char *p, size_t n)
{
        probe_tail_keep(c->tail, CHILD_TAIL, &c->tail_len, p, n);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
        (void)suggested;
        struct child *c = h->data;
        if ((uv_pipe_t *)h != &c->pout || c->out_max == 0) {
                *buf = uv_buf_init(scratch, sizeof scratch);
                return;
        }
        /* stdout is read where it is kept, but its first read into the
         * scratch buffer and copied by its length: most handlers write a
         * little or nothing, and a kept buffer of READ_CHUNK is past
         * malloc's mmap threshold (an mmap, page faults and a munmap per
         * step) */
        if (c->out.len == 0) {
                *buf = uv_buf_init(scratch, sizeof scratch);
                return;
        }
        if (kbuf_reserve(&c->out, READ_CHUNK) < 0) {
                *buf = uv_buf_init(NULL, 0); /* UV_ENOBUFS: read as its end */
                return;
        }
        *buf = uv_buf_init(c->out.data + c->out.len, READ_CHUNK);
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
        struct child *c = s->data;
        int fd = (uv_pipe_t *)s == &c->pout ? 1 : 2;
        bool copy = fd == 1 && c->out_max && n > 0 && buf->base == scratch;
        if (copy && kbuf_reserve(&c->out, (size_t)n) < 0)
                n = UV_ENOBUFS; /* as when on_alloc finds no memory: its end */
        if (n < 0) {
                uv_read_stop(s);
                if (c->read)
                        c->read(c, fd, NULL, 0);
                /* closed at its end, not when the child is: the loop drops
                 * it from epoll once (a pipe left there after its end is
                 * reported again as hung up, then removed twice) */
                if (!uv_is_closing((uv_handle_t *)s))
                        uv_close((uv_handle_t *)s, on_closed);
                if (fd == 1)
                        c->out_eof = true;
                else
                        c->err_eof = true;
                maybe_finish(c);
                return;
        }
        if (c->read && n > 0)
                c->read(c, fd, buf->base, (size_t)n);
        if (fd == 2) {
                child_tail_add(c, buf->base, (size_t)n);
                return;
        }
        if (c->out_max == 0)
                return;
        if (copy)
                memcpy(c->out.data + c->out.len, scratch, (size_t)n);
        c->out.len += (size_t)n;
        c->out.data[c->out.len] = '\0';
        if (c->out.len > c->out_max && !c->overflow) {
                c->overflow = true;
                child_kill(c, SIGKILL);
        }
        if (c->overflow)
                c->out.len = c->out_max; /* keep memory bounded */
}

static void on_written(uv_write_t *req, int status)
{
        (void)status; /* a child that does not read its stdin is fine */
        struct child *c = req->data;
        if (!uv_is_closing((uv_handle_t *)&c->pin))
                uv_close((uv_handle_t *)&c->pin, on_closed);
}

static void on_started(struct runner_job *job)
{
        struct child *c = job->data;
        c->err = job->err;
        c->err_what = job->err_what;
        if (job->err) {
                c->started(c);
                return;
        }
        c->pid = job->pid;
        c->running = !c->exited;
        uv_pipe_open(&c->pout, job->fd_out);
        uv_pipe_open(&c->perr, job->fd_err);
        uv_read_start((uv_stream_t *)&c->pout, on_alloc, on_read);
        uv_read_start((uv_stream_t *)&c->perr, on_alloc, on_read);
        if (job->fd_in < 0) {
                /* written and closed by the runner's thread (quiet) */
                uv_close((uv_handle_t *)&c->pin, on_closed);
        } else if (c->in_len <= PIPE_BUF) {
                /* An empty pipe takes PIPE_BUF bytes at once (its least
                 * room is a page): written and closed here, without the
                 * pipe's handle (libuv's fcntl, ioctl and epoll_ctl for
                 * it).  EPIPE: a child that does not read its stdin is
                 * fine, as in on_written. */
                while (c->in_len && write(job->fd_in, c->in, c->in_len) < 0 && errno == EINTR)
                        ;
                close(job->fd_in);
                uv_close((uv_handle_t *)&c->pin, on_closed);
        } else {
                uv_pipe_open(&c->pin, job->fd_in);
                uv_buf_t b = uv_buf_init((char *)c->in, (unsigned)c->in_len);
                c->wreq.data = c;
                if (uv_write(&c->wreq, (uv_stream_t *)&c->pin, &b, 1, on_written) < 0)
                        uv_close((uv_handle_t *)&c->pin, on_closed);
        }
        uv_timer_start(&c->timer, on_timeout, c->timeout_ms, 0);
        c->started(c);
}

void child_init(struct child *c, uv_loop_t *loop)
{
        c->loop = loop;
        uv_pipe_init(loop, &c->pin, 0);
        uv_pipe_init(loop, &c->pout, 0);
        uv_pipe_init(loop, &c->perr, 0);
        uv_timer_init(loop, &c->timer);
        c->pin.data = c->pout.data = c->perr.data = c->timer.data = c;
        c->open_handles = 4;
}

int child_start(struct child *c, struct runner *r)
{
        c->job = (struct runner_job){ .argv = c->argv, .envp = c->envp, .cwd = c->cwd,
                                      .started = on_started, .exited = on_exited, .data = c,
                                      .cg_hint = c->cg_hint, .limits = c->limits,
                                      .quiet = c->quiet, .in = c->in, .in_len = c->in_len };
        return runner_spawn(r, &c->job);
}
