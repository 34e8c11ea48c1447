/* SPDX-License-Identifier: MIT */
/* toolhold: see toolhold.h. */
#include "toolhold.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <uv.h>

#include "daemon.h"
#include "kairos/dlist.h"
#include "kairos/kmem.h"
#include "kairos/procstat.h"
#include "log.h"
#include "runner.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

struct hold;

struct watch {
        struct hold *h;
        uv_poll_t poll;
        bool polling;
        struct toolhold_client c;
        bool exited;
        bool spared;               /* runner_spare_group: the keeper leaves it */
};

struct hold {
        struct hold *prev, *next;
        struct daemon *d;
        char *mandate_id;
        char *step_id;
        uint64_t grace_ms;
        toolhold_decide_fn decide;
        uv_timer_t timer;
        struct watch w[TOOLHOLD_MAX];
        size_t n;
        unsigned open_handles;
        bool ending;
};

static struct hold *holds;

/* ---- finding the clients (any thread) ---- */

static bool same_start(pid_t pid, uint64_t start)
{
        struct procstat st;
        return procstat_read((int)pid, &st) == 0 && procstat_same_process(&st, start);
}

size_t toolhold_find(const struct evidence_call *calls, size_t n, const char *step_id,
                     struct toolhold_client *out, size_t max)
{
        size_t k = 0;
        for (size_t i = 0; i < n && k < max; i++) {
                const struct evidence_call *c = &calls[i];
                if ((c->state != IDEM_ST_PROCESSING && c->state != IDEM_ST_INTERRUPTED) ||
                    c->client.pid <= 0 || strcmp(c->step, step_id) != 0)
                        continue;
                /* the pidfd first: if the start time then matches, it is the
                 * client's (its pid cannot be reused while it runs) */
                int fd = (int)syscall(SYS_pidfd_open, (pid_t)c->client.pid, 0);
                if (fd < 0)
                        continue;
                if (!same_start(c->client.pid, c->client.start)) {
                        close(fd);
                        continue;
                }
                (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
                out[k] = (struct toolhold_client){ .pidfd = fd, .pid = c->client.pid };
                snprintf(out[k].key, sizeof out[k].key, "%s", c->key);
                k++;
        }
        return k;
}

void toolhold_release(struct toolhold_client *clients, size_t n)
{
        for (size_t i = 0; i < n; i++)
                if (clients[i].pidfd >= 0) {
                        close(clients[i].pidfd);
                        clients[i].pidfd = -1;
                }
}

/* ---- the hold (the loop) ---- */

static void hold_unref(struct hold *h)
{
        if (--h->open_handles)
                return;
        for (size_t i = 0; i < h->n; i++)
                if (h->w[i].c.pidfd >= 0)
                        close(h->w[i].c.pidfd);
        FREE_ALL(h->mandate_id, h->step_id, h);
}

static void timer_closed(uv_handle_t *handle)
{
        hold_unref(handle->data);
}

static void poll_closed(uv_handle_t *handle)
{
        struct watch *w = handle->data;
        hold_unref(w->h);
}

/* Out of the list, its handles closed (freed after). */
static void hold_end(struct hold *h)
{
        if (h->ending)
                return;
        h->ending = true;
        DLIST_UNLINK(holds, h);
        for (size_t i = 0; i < h->n; i++)
                if (h->w[i].spared)
                        (void)runner_spare_group(h->d->runner, h->w[i].c.pid, false);
        h->open_handles = 1;
        uv_timer_stop(&h->timer);
        for (size_t i = 0; i < h->n; i++)
                if (h->w[i].polling) {
                        uv_poll_stop(&h->w[i].poll);
                        h->open_handles++;
                        uv_close((uv_handle_t *)&h->w[i].poll, poll_closed);
                }
        uv_close((uv_handle_t *)&h->timer, timer_closed);
}

/* SIGKILL the process groups of the clients still running (each leads its
 * own; its pidfd not readable yet: the pid is still the client's). */
static void kill_clients(struct hold *h)
{
        for (size_t i = 0; i < h->n; i++) {
                struct watch *w = &h->w[i];
                if (w->exited || w->c.pidfd < 0)
                        continue;
                kill(-w->c.pid, SIGKILL);
                (void)syscall(SYS_pidfd_send_signal, w->c.pidfd, SIGKILL, NULL, 0);
        }
}

/* The hold is over: decide, unless the mandate went meanwhile. */
static void hold_decide(struct hold *h, const char *why)
{
        struct daemon *d = h->d;
        struct mandate *m = mandate_find(d, h->mandate_id);
        if (!m || m->status != MANDATE_PROBING || m->cancel) {
                kill_clients(h);
                hold_end(h);
                return;
        }
        log_event(LOG_NOTICE, MSGID_RECOVERY,
                  LOG_FIELDS({ "MANDATE_ID", h->mandate_id }, { "STEP_ID", h->step_id }),
                  "recovery: %s %s: %s; deciding the step now", h->mandate_id, h->step_id, why);
        toolhold_decide_fn decide = h->decide;
        char *id = h->mandate_id;
        h->mandate_id = NULL;
        hold_end(h);
        decide(d, id);
        free(id);
}

static void on_grace(uv_timer_t *t)
{
        struct hold *h = t->data;
        for (size_t i = 0; i < h->n; i++) {
                struct watch *w = &h->w[i];
                if (w->exited)
                        continue;
                log_event(LOG_WARNING, MSGID_RECOVERY,
                          LOG_FIELDS({ "MANDATE_ID", h->mandate_id }, { "STEP_ID", h->step_id },
                                     { "IDEM_KEY", w->c.key }),
                          "recovery: %s %s: tool call %s (client pid %d) still runs after "
                          "ToolGraceSec=%llu passed: killed",
                          h->mandate_id, h->step_id, w->c.key, (int)w->c.pid,
                          (unsigned long long)(h->grace_ms / 1000));
        }
        kill_clients(h);
        hold_decide(h, "the wait for its tool call is over");
}

static void on_exit_poll(uv_poll_t *p, int status, int events)
{
        (void)events;
        struct watch *w = p->data;
        struct hold *h = w->h;
        if (h->ending)
                return;
        w->exited = true;
        uv_poll_stop(p);
        if (status == 0)
                log_event(LOG_NOTICE, NULL,
                          LOG_FIELDS({ "MANDATE_ID", h->mandate_id }, { "STEP_ID", h->step_id },
                                     { "IDEM_KEY", w->c.key }),
                          "recovery: %s %s: the client of tool call %s (pid %d) exited",
                          h->mandate_id, h->step_id, w->c.key, (int)w->c.pid);
        for (size_t i = 0; i < h->n; i++)
                if (!h->w[i].exited)
                        return;
        hold_decide(h, "the client of its tool call exited without finishing the call");
}

void toolhold_start(struct mandate *m, const char *step_id, struct toolhold_client *clients,
                    size_t n, uint64_t grace_ms, toolhold_decide_fn decide)
{
        struct daemon *d = m->d;
        struct hold *h = calloc(1, sizeof(*h));
        if (n > TOOLHOLD_MAX)
                n = TOOLHOLD_MAX;
        if (!h || !(h->mandate_id = strdup(m->id)) || !(h->step_id = strdup(step_id))) {
                if (h) {
                        free(h->mandate_id);
                        free(h);
                }
                toolhold_release(clients, n);
                log_error("%s %s: out of memory waiting for its tool calls: deciding now", m->id,
                          step_id);
                decide(d, m->id);
                return;
        }
        h->d = d;
        h->grace_ms = grace_ms;
        h->decide = decide;
        h->n = n;
        uv_timer_init(d->loop, &h->timer);
        h->timer.data = h;
        DLIST_PUSH(holds, h);
        for (size_t i = 0; i < n; i++) {
                struct watch *w = &h->w[i];
                w->h = h;
                w->c = clients[i];
                clients[i].pidfd = -1;
                if (uv_poll_init(d->loop, &w->poll, w->c.pidfd) == 0) {
                        w->poll.data = w;
                        w->polling = true;
                        if (uv_poll_start(&w->poll, UV_READABLE, on_exit_poll) < 0)
                                w->exited = true;
                } else {
                        w->exited = true;
                }
                /* the keeper spares it if this kairosd dies too */
                w->spared = !w->exited && runner_spare_group(d->runner, w->c.pid, true) == 0;
                log_event(LOG_NOTICE, MSGID_RECOVERY,
                          LOG_FIELDS({ "MANDATE_ID", m->id }, { "STEP_ID", step_id },
                                     { "IDEM_KEY", w->c.key }),
                          "recovery: %s %s: tool call %s still runs (client pid %d, it "
                          "outlived the last kairosd): the step is decided when it finishes, "
                          "its client exits or ToolGraceSec=%llu passes",
                          m->id, step_id, w->c.key, (int)w->c.pid,
                          (unsigned long long)(grace_ms / 1000));
        }
        uv_timer_start(&h->timer, on_grace, grace_ms, 0);
        for (size_t i = 0; i < n; i++)
                if (!h->w[i].exited)
                        return;
        hold_decide(h, "no client to wait for");
}

void toolhold_finished(struct daemon *d, const char *mandate_id)
{
        for (struct hold *h = holds; h; h = h->next)
                if (h->d == d && h->mandate_id && strcmp(h->mandate_id, mandate_id) == 0) {
                        hold_decide(h, "its tool call was finished by its client");
                        return;
                }
}

void toolhold_cancel(struct mandate *m)
{
        for (struct hold *h = holds; h; h = h->next)
                if (h->mandate_id && strcmp(h->mandate_id, m->id) == 0) {
                        kill_clients(h);
                        hold_end(h);
                        return;
                }
}

void toolhold_stop(struct daemon *d)
{
        for (struct hold *h = holds, *next; h; h = next) {
                next = h->next;
                if (h->d != d)
                        continue;
                /* a stop leaves nothing of kairosd's behind (under the
                 * shipped unit's KillMode=process systemd does not kill
                 * them): the next start decides the step without them */
                for (size_t i = 0; i < h->n; i++)
                        if (!h->w[i].exited && h->w[i].c.pidfd >= 0)
                                log_info("mandate %s %s: kairosd stops: the tool call's "
                                         "client (pid %d) killed",
                                         h->mandate_id, h->step_id, (int)h->w[i].c.pid);
                kill_clients(h);
                hold_end(h);
        }
}
