/* SPDX-License-Identifier: MIT */
#include "control.h"

#include <errno.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "kairos/dlist.h"
#include "kairos/kbuf.h"
#include "kairos/kio.h"
#include "kairos/kmem.h"
#include "control_proto.h"
#include "log.h"
#include "metrics.h"

struct control_server {
        uv_pipe_t pipe;
        char *path;
        struct daemon *d;
        struct control_client *clients;  /* open connections */
        struct control_limits lim;
        unsigned nclients;     /* admitted connections */
        unsigned nrefusing;    /* refused connections waiting for their first request */
        size_t queued;         /* reply bytes of every client not yet written */
        uv_timer_t linger;     /* closes refused connections that send nothing */
        uv_idle_t turns;       /* runs while a connection has lines left for its next turn */
        uv_timer_t refusals_timer; /* ends the interval of the refusals logged */
        struct refusal_count {
                uid_t uid;
                bool other;          /* uids beyond CONTROL_REFUSAL_UIDS */
                unsigned long more;  /* refused since the one logged */
                char last[300];      /* the last one's reason */
        } refusals[CONTROL_REFUSAL_UIDS + 1];
        unsigned nrefusals;    /* uids refused in this interval */
        uint64_t refusal_log_ms;
        unsigned open_handles; /* pipe, linger, turns, refusals_timer: freed when all are closed */
};

struct control_client {
        uv_pipe_t pipe;
        struct daemon *d;
        struct kbuf in;        /* bytes read and not yet handled */
        struct kbuf out;       /* replies gathered while a write runs */
        unsigned refs;         /* 1 for the connection + 1 per pending request and write */
        unsigned inflight;     /* requests dispatched and not yet answered */
        bool held_big;         /* queued more than CONTROL_TRIM_AFTER at some point */
        size_t queued;         /* bytes of replies not yet written (out + the write) */
        bool writing;          /* a write is in flight */
        bool close_when_written;
        bool closing;
        bool hangup;           /* answered for the last time: handle nothing more */
        bool reading;
        bool pumping;          /* inside client_pump */
        bool has_line;         /* `in` holds a whole line not yet handled */
        bool admitted;         /* counted in srv->nclients */
        bool refusing;         /* counted in srv->nrefusing */
        uid_t uid;
        gid_t gid;
        pid_t pid;
        uint64_t refused_ms;   /* when it was refused (monotonic) */
        struct control_server *srv;
        struct control_client *prev, *next;
        char *refusal;         /* not served: the next request gets this error, then hang up */
        const char *refusal_code;
        struct control_claim *claims;  /* kept on behalf of this connection */
};

struct write_req {
        uv_write_t req;
        char *data;
        size_t len;
        struct control_client *client;
};

static void client_pump(struct control_client *c);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

/* ---- limits ---- */

/* max_clients = min(CONTROL_MAX_CLIENTS, fd_limit - reserve -
 * CONTROL_MAX_REFUSING - 1), at least CONTROL_MIN_CLIENTS: the connections,
 * the refused ones and the reserve stay below fd_limit. */
static void limits_compute(unsigned long fd_limit, unsigned max_concurrent_mandates,
                           struct control_limits *ret)
{
        unsigned long reserve = CONTROL_FD_RESERVE_BASE +
                                (unsigned long)CONTROL_FD_RESERVE_PER_MANDATE *
                                        max_concurrent_mandates;
        /* connections + refusals + reserve < fd_limit */
        unsigned long room = fd_limit > reserve + CONTROL_MAX_REFUSING + 1 ?
                                     fd_limit - reserve - CONTROL_MAX_REFUSING - 1 :
                                     0;
        unsigned long max = room < CONTROL_MAX_CLIENTS ? room : CONTROL_MAX_CLIENTS;
        if (max < CONTROL_MIN_CLIENTS)
                max = CONTROL_MIN_CLIENTS;
        ret->fd_limit = fd_limit;
        ret->fd_reserve = reserve;
        ret->max_clients = (unsigned)max;
        ret->max_per_uid = max < CONTROL_MAX_CLIENTS_PER_UID ? (unsigned)max :
                                                               CONTROL_MAX_CLIENTS_PER_UID;
        ret->reserved = (unsigned)(max / 16 ? max / 16 : 1);
        ret->newcomers = (unsigned)((max - ret->reserved) / 16 ? (max - ret->reserved) / 16 : 1);
        ret->fits = (unsigned long)max + CONTROL_MAX_REFUSING + reserve < fd_limit;
}

/* ---- connections ---- */

static void client_unref(struct control_client *c)
{
        if (--c->refs == 0) {
                /* A client that made us hold megabytes (its requests, their
                 * replies) leaves them in the allocator's free lists: give
                 * them back to the system once it is gone. */
                bool big = c->in.cap + c->out.cap > CONTROL_TRIM_AFTER || c->held_big;
                free(c->refusal);
                kbuf_free(&c->in);
                kbuf_free(&c->out);
                free(c);
                if (big)
                        malloc_trim(0);
        }
}

static void on_client_closed(uv_handle_t *h)
{
        client_unref(h->data);
}

/* The connection is gone: hand every claim back to its owner. */
static void client_drop_claims(struct control_client *c)
{
        while (c->claims) {
                struct control_claim *cl = c->claims;
                control_claim_release(cl);
                cl->on_close(cl);
        }
}

static void on_turn(uv_idle_t *h);

/* All connections together were over their budget and no longer are: wake
 * the ones it paused (in the next turn of the loop). */
static void server_wake(struct control_server *srv, bool was_over)
{
        if (srv && was_over && srv->queued <= CONTROL_MAX_QUEUED_TOTAL)
                uv_idle_start(&srv->turns, on_turn);
}

static void client_unlink(struct control_client *c)
{
        struct control_server *srv = c->srv;
        if (!srv)
                return;
        bool was_over = srv->queued > CONTROL_MAX_QUEUED_TOTAL;
        DLIST_UNLINK(srv->clients, c);
        if (c->admitted)
                srv->nclients--;
        if (c->refusing)
                srv->nrefusing--;
        srv->queued -= c->queued;
        c->srv = NULL;
        server_wake(srv, was_over);
}

static void client_close(struct control_client *c)
{
        if (c->closing)
                return;
        c->closing = true;
        c->hangup = true;
        client_drop_claims(c);
        client_unlink(c);
        /* Nothing more is read or sent: give the buffers back now. */
        kbuf_free(&c->in);
        c->queued -= c->out.len;
        kbuf_free(&c->out);
        c->has_line = false;
        uv_read_stop((uv_stream_t *)&c->pipe);
        c->reading = false;
        uv_close((uv_handle_t *)&c->pipe, on_client_closed);
}

static bool over_total(const struct control_server *srv)
{
        return srv && srv->queued > CONTROL_MAX_QUEUED_TOTAL;
}

static void client_flush(struct control_client *c);

static void on_written(uv_write_t *req, int status)
{
        struct write_req *w = (struct write_req *)req;
        struct control_client *c = w->client;
        struct control_server *srv = c->srv;
        bool was_over = over_total(srv);
        c->writing = false;
        c->queued -= w->len;
        if (srv)
                srv->queued -= w->len;
        free(w->data);
        free(w);
        if (status < 0)
                client_close(c);
        else if (c->out.len > 0)
                client_flush(c);
        else if (c->close_when_written)
                client_close(c);
        else
                client_pump(c);
        server_wake(srv, was_over);
        client_unref(c);
}

/* Hand what has gathered in c->out to one write; the next gathers while it
 * runs.  Replies are copied into one growing buffer (big ones come straight
 * from the kernel and go back to it when freed) rather than kept as many
 * small allocations. */
static void client_flush(struct control_client *c)
{
        if (c->writing || c->closing || c->out.len == 0)
                return;
        struct write_req *w = calloc(1, sizeof(*w));
        if (!w) {
                client_close(c);
                return;
        }
        w->len = c->out.len;
        w->data = kbuf_steal(&c->out);
        w->client = c;
        c->refs++;
        c->writing = true;
        uv_buf_t buf = uv_buf_init(w->data, (unsigned)w->len);
        if (uv_write(&w->req, (uv_stream_t *)&c->pipe, &buf, 1, on_written) < 0) {
                c->writing = false;
                c->queued -= w->len;
                if (c->srv)
                        c->srv->queued -= w->len;
                free(w->data);
                free(w);
                client_unref(c);
                client_close(c);
        }
}

/* Queue one reply line (the pieces, then a newline) behind what waits for
 * the client, counted in its queued bytes and the server's: every reply goes
 * this way, so client_may_take() sees all of them. */
static void client_queue(struct control_client *c, const struct iovec *parts, size_t nparts)
{
        if (c->closing)
                return;
        size_t n = 1;
        int r = 0;
        for (size_t i = 0; r == 0 && i < nparts; i++) {
                r = kbuf_append(&c->out, parts[i].iov_base, parts[i].iov_len);
                n += parts[i].iov_len;
        }
        if (r == 0)
                r = kbuf_putc(&c->out, '\n');
        if (r < 0) {
                client_close(c);
                return;
        }
        c->queued += n;
        if (c->queued > CONTROL_TRIM_AFTER)
                c->held_big = true;
        if (c->srv)
                c->srv->queued += n;
        client_flush(c);
}

static void client_send(struct control_client *c, json_t *reply, bool close_after)
{
        char *text = json_dumps(reply, JSON_COMPACT);
        json_decref(reply);
        if (close_after) {
                c->hangup = true;
                c->close_when_written = true;
        }
        if (!text || c->closing) {
                free(text);
                if (!c->closing && close_after && !c->writing)
                        client_close(c);
                return;
        }
        client_queue(c, &(struct iovec){ text, strlen(text) }, 1);
        free(text);
}

static json_t *error_reply(json_t *id, const char *code, const char *message, json_t *detail)
{
        json_t *err = json_pack("{s:s, s:s}", "code", code, "message", message);
        if (detail)
                json_object_set_new(err, "detail", detail);
        return json_pack("{s:i, s:O, s:b, s:o}", "v", 1, "id", id ? id : json_null(), "ok", 0,
                         "error", err);
}

static void request_free(struct control_request *req)
{
        struct control_client *c = req->client;
        json_decref(req->root);
        json_decref(req->args);
        free(req);
        c->inflight--;
        client_pump(c);
        client_unref(c);
}

/* commands.c's entry points (control_set_commands) */
static struct control_commands commands;

void control_set_commands(const struct control_commands *c)
{
        commands = *c;
}

/* Counted by command (unknown ones as "unknown") and code ("ok"). */
static void count_reply(const struct control_request *req, const char *code)
{
        metrics_control(req->d->metrics, commands.known(req->cmd) ? req->cmd : NULL, code);
}

void control_reply_ok(struct control_request *req, json_t *result)
{
        count_reply(req, NULL);
        json_t *reply = json_pack("{s:i, s:O, s:b, s:o}", "v", 1, "id", req->id, "ok", 1,
                                  "result", result ? result : json_object());
        client_send(req->client, reply, false);
        request_free(req);
}

void control_reply_ok_text(struct control_request *req, const char *result, size_t len)
{
        struct control_client *c = req->client;
        count_reply(req, NULL);
        char *id = json_dumps(req->id ? req->id : json_null(), JSON_ENCODE_ANY | JSON_COMPACT);
        static const char head[] = "{\"v\":1,\"id\":", mid[] = ",\"ok\":true,\"result\":";
        if (!id) {
                client_close(c);
        } else {
                struct iovec parts[] = { { (void *)head, sizeof head - 1 },
                                         { id, strlen(id) },
                                         { (void *)mid, sizeof mid - 1 },
                                         { (void *)result, len },
                                         { "}", 1 } };
                client_queue(c, parts, sizeof parts / sizeof parts[0]);
        }
        free(id);
        request_free(req);
}

static void reply_error_v(struct control_request *req, const char *code, json_t *detail,
                          const char *fmt, va_list ap)
{
        char msg[1024];
        vsnprintf(msg, sizeof msg, fmt, ap);
        count_reply(req, code);
        client_send(req->client, error_reply(req->id, code, msg, detail), false);
        request_free(req);
}

void control_reply_error(struct control_request *req, const char *code, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        reply_error_v(req, code, NULL, fmt, ap);
        va_end(ap);
}

void control_reply_error_detail(struct control_request *req, const char *code, json_t *detail,
                                const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        reply_error_v(req, code, detail, fmt, ap);
        va_end(ap);
}

const char *control_arg_string(struct control_request *req, const char *name, bool required,
                               bool *failed)
{
        const char *v, *why;
        *failed = control_args_string(req->args, name, required, &v, &why) < 0;
        if (*failed)
                control_reply_error(req, "bad_argument", "args.%s: %s", name, why);
        return v;
}

bool control_arg_required(struct control_request *req, ...)
{
        const char *name, *why;
        va_list ap;
        va_start(ap, req);
        int r = control_args_required(req->args, ap, &name, &why);
        va_end(ap);
        if (r < 0)
                control_reply_error(req, "bad_argument", "args.%s: %s", name, why);
        return r == 0;
}

bool control_claim_attach(struct control_request *req, struct control_claim *cl,
                          void (*on_close)(struct control_claim *c))
{
        struct control_client *c = req->client;
        if (c->closing)
                return false;
        cl->on_close = on_close;
        cl->client = c;
        DLIST_PUSH(c->claims, cl);
        return true;
}

void control_claim_release(struct control_claim *cl)
{
        struct control_client *c = cl->client;
        if (!c)
                return;
        DLIST_UNLINK(c->claims, cl);
        cl->prev = cl->next = NULL;
        cl->client = NULL;
}

bool control_claim_owned_by(const struct control_claim *cl, const struct control_request *req)
{
        return cl->client && cl->client == req->client;
}

/* The peer check: root, the daemon's uid, or a member of group gid. */
static bool peer_allowed(uid_t uid, gid_t gid, const gid_t *groups, size_t ngroups,
                         gid_t socket_gid)
{
        if (uid == 0 || uid == geteuid())
                return true;
        if (socket_gid == (gid_t)-1)
                return false;
        if (gid == socket_gid)
                return true;
        for (size_t i = 0; i < ngroups; i++)
                if (groups[i] == socket_gid)
                        return true;
        return false;
}

static void handle_line(struct control_client *c, const char *line, size_t len)
{
        struct control_parsed pr;
        char problem[300];
        int r = control_parse_request(line, len, &pr, problem, sizeof problem);
        if (c->refusal) {
                /* Answer the request it sent (naming its id if it has
                 * one), then hang up. */
                metrics_control(c->d->metrics, NULL, c->refusal_code);
                client_send(c, error_reply(pr.id, c->refusal_code, c->refusal, NULL), true);
                control_parsed_clear(&pr);
                return;
        }
        if (r < 0) {
                metrics_control(c->d->metrics, NULL, "bad_request");
                client_send(c, error_reply(pr.id, "bad_request", problem, NULL), false);
                control_parsed_clear(&pr);
                return;
        }
        struct control_request *req = calloc(1, sizeof(*req));
        if (!req) {
                client_send(c, error_reply(pr.id, "internal", "out of memory", NULL), false);
                control_parsed_clear(&pr);
                return;
        }
        req->d = c->d;
        req->client = c;
        c->refs++;
        c->inflight++;
        req->root = pr.root;    /* taken over; id, cmd and args point into it */
        req->id = pr.id;
        req->cmd = pr.cmd;
        req->args = pr.args ? json_incref(pr.args) : json_object();
        req->uid = c->uid;
        req->gid = c->gid;
        req->pid = c->pid;
        commands.dispatch(req);
}

/* May the connection take another request now?  Not while it has
 * CONTROL_MAX_INFLIGHT requests being worked on, nor while more than
 * CONTROL_MAX_QUEUED bytes of its replies wait for it to read them, nor,
 * with replies of its own waiting, while all connections together have more
 * than CONTROL_MAX_QUEUED_TOTAL bytes waiting. */
static bool client_may_take(const struct control_client *c)
{
        if (c->hangup)
                return false;
        if (c->inflight >= CONTROL_MAX_INFLIGHT || c->queued > CONTROL_MAX_QUEUED)
                return false;
        return c->queued == 0 || !over_total(c->srv);
}

static void client_update_reading(struct control_client *c)
{
        bool want = !c->closing && !c->has_line && client_may_take(c);
        if (want == c->reading)
                return;
        if (want) {
                if (uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read) < 0) {
                        client_close(c);
                        return;
                }
        } else {
                uv_read_stop((uv_stream_t *)&c->pipe);
        }
        c->reading = want;
}

static void too_large(struct control_client *c)
{
        kbuf_free(&c->in);
        c->has_line = false;
        client_send(c,
                    error_reply(NULL, "too_large", "request larger than 1 MiB; connection closed",
                                NULL),
                    true);
}

static void on_turn(uv_idle_t *h)
{
        struct control_server *srv = h->data;
        bool more = false;
        struct control_client *next;
        for (struct control_client *o = srv->clients; o; o = next) {
                next = o->next;
                /* lines left from its last turn, or paused and free to go on */
                if ((o->has_line || !o->reading) && client_may_take(o))
                        client_pump(o);
                if (!o->closing && o->has_line && client_may_take(o))
                        more = true;
        }
        if (!more)
                uv_idle_stop(&srv->turns);
}

/* Handle the whole lines read so far, as far as the limits allow and at
 * most CONTROL_BATCH of them (the rest in a later turn of the loop, after
 * the other connections had theirs), then read on or pause. */
static void client_pump(struct control_client *c)
{
        if (c->pumping || c->closing)
                return;
        c->pumping = true;
        size_t start = 0;
        unsigned handled = 0;
        bool large = false;
        while (client_may_take(c) && start < c->in.len && handled < CONTROL_BATCH) {
                char *nl = memchr(c->in.data + start, '\n', c->in.len - start);
                if (!nl)
                        break;
                size_t len = (size_t)(nl - (c->in.data + start));
                if (len > CONTROL_MAX_REQUEST) {
                        large = true;
                        break;
                }
                if (len > 0) {
                        handle_line(c, c->in.data + start, len);
                        handled++;
                }
                start += len + 1;
        }
        if (c->closing) {
                c->pumping = false;
                return;
        }
        if (!large && start > 0) {
                memmove(c->in.data, c->in.data + start, c->in.len - start);
                c->in.len -= start;
                c->in.data[c->in.len] = '\0';
        }
        c->has_line = c->in.len > 0 && memchr(c->in.data, '\n', c->in.len) != NULL;
        if (large || (!c->has_line && c->in.len > CONTROL_MAX_REQUEST))
                too_large(c);
        else if (c->in.len == 0 && c->in.cap > CONTROL_READ_SIZE)
                kbuf_free(&c->in);    /* keep no big buffer for an idle connection */
        c->pumping = false;
        client_update_reading(c);
        if (c->has_line && c->srv && client_may_take(c))
                uv_idle_start(&c->srv->turns, on_turn);
}

/* One read buffer for every connection: what a read brings is handled or
 * copied into the connection's own buffer before the next read. */
static char read_buf[CONTROL_READ_SIZE];

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
        (void)h;
        (void)suggested;
        *buf = uv_buf_init(read_buf, sizeof read_buf);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
        struct control_client *c = s->data;
        if (nread < 0) {
                client_close(c);
                return;
        }
        if (nread == 0 || c->hangup)
                return;
        if (kbuf_append(&c->in, buf->base, (size_t)nread) < 0) {
                client_close(c);
                return;
        }
        client_pump(c);
}

/* ---- admission ---- */

/* Root, kairosd's own user and HandlerUser= (the handlers' tool calls). */
static bool uid_privileged(const struct control_server *srv, uid_t uid)
{
        return uid == 0 || uid == geteuid() ||
               (srv->d->handler_user.set && uid == srv->d->handler_user.uid);
}

/* uid's admitted connections; *ret_users: the users other than root and
 * kairosd's own that hold connections, uid counted in. */
static unsigned count_uid(const struct control_server *srv, uid_t uid, unsigned *ret_users)
{
        unsigned n = 0, users = 1;
        for (const struct control_client *o = srv->clients; o; o = o->next) {
                if (!o->admitted)
                        continue;
                if (o->uid == uid) {
                        n++;
                        continue;
                }
                if (uid_privileged(srv, o->uid))
                        continue;
                /* counted once: at its first connection in the list */
                bool first = true;
                for (const struct control_client *p = srv->clients; p != o; p = p->next)
                        if (p->admitted && p->uid == o->uid) {
                                first = false;
                                break;
                        }
                users += first;
        }
        *ret_users = users;
        return n;
}

/* ---- refusals in the log ---- */

static void refusals_flush(struct control_server *srv)
{
        for (unsigned i = 0; i < srv->nrefusals; i++) {
                struct refusal_count *r = &srv->refusals[i];
                if (!r->more)
                        continue;
                if (r->other)
                        log_warning("control: refused %lu more connections from other uids in "
                                    "the last %g s (the last: %s)",
                                    r->more, (double)srv->refusal_log_ms / 1000, r->last);
                else
                        log_warning("control: refused %lu more connection%s from uid %u in the "
                                    "last %g s (the last: %s)",
                                    r->more, r->more == 1 ? "" : "s", (unsigned)r->uid,
                                    (double)srv->refusal_log_ms / 1000, r->last);
        }
        srv->nrefusals = 0;
}

static void on_refusals_timer(uv_timer_t *t)
{
        refusals_flush(t->data);
}

/* Log a refused connection: the first of its uid in an interval at once,
 * the others counted and logged as one line when the interval ends. */
static void refusal_log(struct control_server *srv, const struct control_client *c,
                        const char *msg)
{
        struct refusal_count *r = NULL;
        for (unsigned i = 0; i < srv->nrefusals && !r; i++)
                if (srv->refusals[i].other || srv->refusals[i].uid == c->uid)
                        r = &srv->refusals[i];
        if (r) {
                r->more++;
                snprintf(r->last, sizeof r->last, "%s", msg);
                return;
        }
        if (srv->nrefusals == 0)
                uv_timer_start(&srv->refusals_timer, on_refusals_timer, srv->refusal_log_ms, 0);
        r = &srv->refusals[srv->nrefusals++];
        *r = (struct refusal_count){ .uid = c->uid, .other = srv->nrefusals > CONTROL_REFUSAL_UIDS };
        if (r->other) {
                r->more = 1;
                snprintf(r->last, sizeof r->last, "%s", msg);
                return;
        }
        log_warning("control: refused a connection from uid %u pid %d: %s (more from this uid "
                    "in the next %g s are counted, then logged as one line)",
                    (unsigned)c->uid, (int)c->pid, msg, (double)srv->refusal_log_ms / 1000);
}

static void on_linger(uv_timer_t *t)
{
        struct control_server *srv = t->data;
        uint64_t now = now_ms_monotonic();
        struct control_client *next;
        for (struct control_client *o = srv->clients; o; o = next) {
                next = o->next;
                if (o->refusing && !o->hangup && now - o->refused_ms >= CONTROL_REFUSE_LINGER_MS)
                        client_send(o, error_reply(NULL, o->refusal_code, o->refusal, NULL),
                                    true);
        }
        if (srv->nrefusing == 0)
                uv_timer_stop(&srv->linger);
}

/* Refuse the connection: its first request gets the error (with the
 * request's id), then it is closed.  A refused connection that sends
 * nothing gets the error without an id after CONTROL_REFUSE_LINGER_MS, and
 * beyond CONTROL_MAX_REFUSING of them, at once. */
static void client_refuse(struct control_client *c, const char *code, const char *msg)
{
        struct control_server *srv = c->srv;
        c->refusal_code = code;
        c->refusal = strdup(msg);
        if (!c->refusal) {
                client_close(c);
                return;
        }
        if (srv->nrefusing >= CONTROL_MAX_REFUSING) {
                client_send(c, error_reply(NULL, code, msg, NULL), true);
                return;
        }
        c->refusing = true;
        c->refused_ms = now_ms_monotonic();
        if (srv->nrefusing++ == 0)
                uv_timer_start(&srv->linger, on_linger, CONTROL_REFUSE_LINGER_MS / 4,
                               CONTROL_REFUSE_LINGER_MS / 4);
        client_update_reading(c);
}

/* The peer is allowed on the socket: is there room for one more connection?
 * All together max_clients, of which the last `reserved` only root,
 * kairosd's own user and HandlerUser= may take, and of the others the last `newcomers` only a
 * user who holds none.  Each other user may hold max_per_uid, and no more
 * than its share: what is left for them divided by the users who hold
 * connections (itself counted), at least 1. */
static void client_admit(struct control_client *c)
{
        struct control_server *srv = c->srv;
        const struct control_limits *lim = &srv->lim;
        bool privileged = uid_privileged(srv, c->uid);
        unsigned users;
        unsigned held = count_uid(srv, c->uid, &users);
        unsigned pool = lim->max_clients > lim->reserved ? lim->max_clients - lim->reserved : 1;
        unsigned share = pool / users ? pool / users : 1;
        if (share > lim->max_per_uid)
                share = lim->max_per_uid;
        unsigned cap = privileged ? lim->max_clients
                       : held == 0 ? pool
                       : pool > lim->newcomers ? pool - lim->newcomers : 1;
        char msg[300];
        if (privileged && held >= lim->max_per_uid) {
                snprintf(msg, sizeof msg,
                         "too many connections: uid %u already has %u open, the most one user "
                         "may have; close some and try again",
                         (unsigned)c->uid, lim->max_per_uid);
        } else if (!privileged && held >= share) {
                snprintf(msg, sizeof msg,
                         "too many connections: uid %u already has %u open, the most one user "
                         "may have while %u users are connected (at most %u); close some and "
                         "try again",
                         (unsigned)c->uid, held, users, lim->max_per_uid);
        } else if (srv->nclients >= cap) {
                snprintf(msg, sizeof msg,
                         "too many connections: %u open, the most kairosd serves%s; try again "
                         "later",
                         srv->nclients,
                         privileged ? "" : " to users other than root and its own");
        } else {
                c->admitted = true;
                srv->nclients++;
                client_update_reading(c);
                return;
        }
        refusal_log(srv, c, msg);
        client_refuse(c, "too_many_clients", msg);
}

static struct control_client *client_new(struct control_server *srv)
{
        struct control_client *c = calloc(1, sizeof(*c));
        if (!c)
                return NULL;
        c->d = srv->d;
        c->refs = 1;
        uv_pipe_init(srv->d->loop, &c->pipe, 0);
        c->pipe.data = c;
        c->srv = srv;
        c->next = srv->clients;
        if (srv->clients)
                srv->clients->prev = c;
        srv->clients = c;
        return c;
}

/* A new connection: check who it is, then admit or refuse it. */
static void client_start(struct control_client *c)
{
        struct control_server *srv = c->srv;
        uv_os_fd_t fd;
        struct ucred cred;
        socklen_t len = sizeof cred;
        if (uv_fileno((uv_handle_t *)&c->pipe, &fd) < 0 ||
            getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
                client_close(c);
                return;
        }
        c->uid = cred.uid;
        c->gid = cred.gid;
        c->pid = cred.pid;
        gid_t groups[256];
        socklen_t glen = sizeof groups;
        size_t ngroups = 0;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &glen) == 0)
                ngroups = glen / sizeof(gid_t);
        if (peer_allowed(c->uid, c->gid, groups, ngroups, srv->d->socket_gid)) {
                client_admit(c);
                return;
        }
        char msg[256];
        if (srv->d->socket_gid != (gid_t)-1)
                snprintf(msg, sizeof msg,
                         "uid %u is not allowed: the control socket serves root, uid %u "
                         "and members of group %s",
                         (unsigned)c->uid, (unsigned)geteuid(), srv->d->cfg->socket_group);
        else
                snprintf(msg, sizeof msg,
                         "uid %u is not allowed: the control socket serves root and uid "
                         "%u (group %s does not exist)",
                         (unsigned)c->uid, (unsigned)geteuid(), srv->d->cfg->socket_group);
        refusal_log(srv, c, msg);
        client_refuse(c, "permission_denied", msg);
}

static void on_connection(uv_stream_t *server, int status)
{
        struct control_server *srv = server->data;
        if (status < 0)
                return;
        struct control_client *c = client_new(srv);
        if (!c)
                return;
        if (uv_accept(server, (uv_stream_t *)&c->pipe) < 0) {
                client_close(c);
                return;
        }
        client_start(c);
}

void control_set_limits(struct daemon *d, const struct control_limits *lim)
{
        if (d->control)
                d->control->lim = *lim;
}

int control_adopt_fd(struct daemon *d, int fd)
{
        struct control_server *srv = d->control;
        if (!srv)
                return -ENOTCONN;
        struct control_client *c = client_new(srv);
        if (!c)
                return -ENOMEM;
        int r = uv_pipe_open(&c->pipe, fd);
        if (r < 0) {
                close(fd);
                client_close(c);
                return r;
        }
        client_start(c);
        return 0;
}

/* ---- the server ---- */

static void on_server_closed(uv_handle_t *h)
{
        struct control_server *srv = h->data;
        if (--srv->open_handles > 0)
                return;
        free(srv->path);
        free(srv);
}

static void server_free(struct control_server *srv)
{
        srv->open_handles = 4;
        refusals_flush(srv);
        uv_close((uv_handle_t *)&srv->refusals_timer, on_server_closed);
        uv_close((uv_handle_t *)&srv->linger, on_server_closed);
        uv_close((uv_handle_t *)&srv->turns, on_server_closed);
        uv_close((uv_handle_t *)&srv->pipe, on_server_closed);
}

static void limits_log(const struct control_limits *lim)
{
        log_info("control: at most %u connections (%u per user and no more than a fair share, "
                 "the last %u for root and kairosd's user, %u more for users' first "
                 "connections); open-file limit %lu, %lu kept for WALs and handlers",
                 lim->max_clients, lim->max_per_uid, lim->reserved, lim->newcomers,
                 lim->fd_limit, lim->fd_reserve);
        if (!lim->fits)
                log_warning("control: the open-file limit %lu is too low for %u connections "
                            "and %lu descriptors for WALs and handlers; raise LimitNOFILE=",
                            lim->fd_limit, lim->max_clients, lim->fd_reserve);
}

int control_start(struct daemon *d, const char *path)
{
        struct control_server *srv = calloc(1, sizeof(*srv));
        if (!srv)
                return -ENOMEM;
        srv->d = d;
        srv->path = strdup(path);
        char *dir = strdup(path);
        if (!srv->path || !dir) {
                FREE_ALL(dir, srv->path, srv);
                return -ENOMEM;
        }
        struct rlimit rl;
        unsigned long fd_limit = 1024;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
                fd_limit = (unsigned long)rl.rlim_cur;
        limits_compute(fd_limit, d->cfg->max_concurrent_mandates, &srv->lim);
        char *slash = strrchr(dir, '/');
        if (slash && slash != dir) {
                *slash = '\0';
                kio_mkdir_p(kio_posix(), dir, 0755);
        }
        free(dir);
        /* The state lock is held: a socket file left here is stale. */
        unlink(path);
        uv_pipe_init(d->loop, &srv->pipe, 0);
        srv->pipe.data = srv;
        uv_timer_init(d->loop, &srv->linger);
        srv->linger.data = srv;
        uv_idle_init(d->loop, &srv->turns);
        srv->turns.data = srv;
        uv_timer_init(d->loop, &srv->refusals_timer);
        srv->refusals_timer.data = srv;
        srv->refusal_log_ms = CONTROL_REFUSAL_LOG_MS;
#ifdef KAIROS_TEST_HOOKS
        const char *t = getenv("KAIROS_TEST_REFUSAL_LOG_MS");
        if (t && *t)
                srv->refusal_log_ms = strtoull(t, NULL, 10);
#endif
        mode_t old = umask(0117);
        int r = uv_pipe_bind(&srv->pipe, path);
        umask(old);
        if (r == 0)
                r = uv_listen((uv_stream_t *)&srv->pipe, 128, on_connection);
        if (r < 0) {
                server_free(srv);
                return r;
        }
        if (chmod(path, 0660) < 0)
                log_warning("control: chmod %s: %s", path, strerror(errno));
        if (d->socket_gid != (gid_t)-1 && chown(path, (uid_t)-1, d->socket_gid) < 0)
                log_warning("control: chown %s to group %s: %s", path, d->cfg->socket_group,
                            strerror(errno));
        limits_log(&srv->lim);
        d->control = srv;
        return 0;
}

void control_stop(struct daemon *d)
{
        struct control_server *srv = d->control;
        if (!srv)
                return;
        d->control = NULL;
        while (srv->clients)
                client_close(srv->clients);
        unlink(srv->path);
        server_free(srv);
}
