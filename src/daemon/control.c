/* SPDX-License-Identifier: MIT */
#include "control.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kairos/kbuf.h"
#include "kairos/kio.h"
#include "control_proto.h"
#include "log.h"

struct control_server {
        uv_pipe_t pipe;
        char *path;
        struct daemon *d;
        struct control_client *clients;  /* open connections */
};

struct control_client {
        uv_pipe_t pipe;
        struct daemon *d;
        struct kbuf in;
        unsigned refs;         /* 1 for the connection + 1 per pending request */
        bool closing;
        uid_t uid;
        gid_t gid;
        pid_t pid;
        struct control_server *srv;
        struct control_client *prev, *next;
        char *refusal;         /* peer not allowed: every request gets this */
        struct control_claim *claims;  /* kept on behalf of this connection */
};

struct write_req {
        uv_write_t req;
        char *data;
        struct control_client *client;
        bool close_after;
};

static void client_unref(struct control_client *c)
{
        if (--c->refs == 0) {
                free(c->refusal);
                kbuf_free(&c->in);
                free(c);
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

static void client_close(struct control_client *c)
{
        if (c->closing)
                return;
        c->closing = true;
        client_drop_claims(c);
        if (c->srv) {
                if (c->prev)
                        c->prev->next = c->next;
                else
                        c->srv->clients = c->next;
                if (c->next)
                        c->next->prev = c->prev;
                c->srv = NULL;
        }
        uv_read_stop((uv_stream_t *)&c->pipe);
        uv_close((uv_handle_t *)&c->pipe, on_client_closed);
}

static void on_written(uv_write_t *req, int status)
{
        struct write_req *w = (struct write_req *)req;
        if (status < 0 || w->close_after)
                client_close(w->client);
        free(w->data);
        client_unref(w->client);
        free(w);
}

static void client_send(struct control_client *c, json_t *reply, bool close_after)
{
        char *text = json_dumps(reply, JSON_COMPACT);
        json_decref(reply);
        if (!text || c->closing) {
                free(text);
                return;
        }
        size_t n = strlen(text);
        char *line = realloc(text, n + 2);
        struct write_req *w = calloc(1, sizeof(*w));
        if (!line || !w) {
                free(line ? line : text);
                free(w);
                client_close(c);
                return;
        }
        line[n] = '\n';
        line[n + 1] = '\0';
        w->data = line;
        w->client = c;
        w->close_after = close_after;
        c->refs++;
        uv_buf_t buf = uv_buf_init(line, (unsigned)(n + 1));
        if (uv_write(&w->req, (uv_stream_t *)&c->pipe, &buf, 1, on_written) < 0) {
                free(line);
                free(w);
                client_unref(c);
                client_close(c);
        }
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
        json_decref(req->root);
        json_decref(req->args);
        client_unref(req->client);
        free(req);
}

void control_reply_ok(struct control_request *req, json_t *result)
{
        json_t *reply = json_pack("{s:i, s:O, s:b, s:o}", "v", 1, "id", req->id, "ok", 1,
                                  "result", result ? result : json_object());
        client_send(req->client, reply, false);
        request_free(req);
}

static void reply_error_v(struct control_request *req, const char *code, json_t *detail,
                          const char *fmt, va_list ap)
{
        char msg[1024];
        vsnprintf(msg, sizeof msg, fmt, ap);
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
        json_t *v = json_object_get(req->args, name);
        *failed = false;
        if (!v || json_is_null(v)) {
                if (required) {
                        *failed = true;
                        control_reply_error(req, "bad_argument", "args.%s: required", name);
                }
                return NULL;
        }
        if (!json_is_string(v)) {
                *failed = true;
                control_reply_error(req, "bad_argument", "args.%s: must be a string", name);
                return NULL;
        }
        return json_string_value(v);
}

bool control_claim_attach(struct control_request *req, struct control_claim *cl,
                          void (*on_close)(struct control_claim *c))
{
        struct control_client *c = req->client;
        if (c->closing)
                return false;
        cl->on_close = on_close;
        cl->client = c;
        cl->prev = NULL;
        cl->next = c->claims;
        if (c->claims)
                c->claims->prev = cl;
        c->claims = cl;
        return true;
}

void control_claim_release(struct control_claim *cl)
{
        struct control_client *c = cl->client;
        if (!c)
                return;
        if (cl->prev)
                cl->prev->next = cl->next;
        else
                c->claims = cl->next;
        if (cl->next)
                cl->next->prev = cl->prev;
        cl->prev = cl->next = NULL;
        cl->client = NULL;
}

bool control_claim_owned_by(const struct control_claim *cl, const struct control_request *req)
{
        return cl->client && cl->client == req->client;
}

bool control_peer_allowed(uid_t uid, gid_t gid, const gid_t *groups, size_t ngroups,
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
                client_send(c, error_reply(pr.id, "permission_denied", c->refusal, NULL), true);
                control_parsed_clear(&pr);
                return;
        }
        if (r < 0) {
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
        req->root = pr.root;    /* taken over; id, cmd and args point into it */
        req->id = pr.id;
        req->cmd = pr.cmd;
        req->args = pr.args ? json_incref(pr.args) : json_object();
        req->uid = c->uid;
        req->gid = c->gid;
        req->pid = c->pid;
        commands_dispatch(req);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
        (void)suggested;
        struct control_client *c = h->data;
        if (kbuf_reserve(&c->in, 65536) < 0) {
                *buf = uv_buf_init(NULL, 0);
                return;
        }
        *buf = uv_buf_init(c->in.data + c->in.len, 65536);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
        (void)buf;
        struct control_client *c = s->data;
        if (nread < 0) {
                client_close(c);
                return;
        }
        c->in.len += (size_t)nread;
        c->in.data[c->in.len] = '\0';
        size_t start = 0;
        for (;;) {
                char *nl = memchr(c->in.data + start, '\n', c->in.len - start);
                if (!nl)
                        break;
                size_t len = (size_t)(nl - (c->in.data + start));
                if (len > CONTROL_MAX_REQUEST) {
                        start = c->in.len;
                        goto too_large;
                }
                if (len > 0 && !c->closing)
                        handle_line(c, c->in.data + start, len);
                start += len + 1;
        }
        if (c->in.len - start > CONTROL_MAX_REQUEST)
                goto too_large;
        memmove(c->in.data, c->in.data + start, c->in.len - start);
        c->in.len -= start;
        return;
too_large:
        kbuf_reset(&c->in);
        uv_read_stop(s);
        client_send(c,
                    error_reply(NULL, "too_large", "request larger than 1 MiB; connection closed",
                                NULL),
                    true);
}

static void on_connection(uv_stream_t *server, int status)
{
        struct control_server *srv = server->data;
        if (status < 0)
                return;
        struct control_client *c = calloc(1, sizeof(*c));
        if (!c)
                return;
        c->d = srv->d;
        c->refs = 1;
        uv_pipe_init(srv->d->loop, &c->pipe, 0);
        c->pipe.data = c;
        c->srv = srv;
        c->next = srv->clients;
        if (srv->clients)
                srv->clients->prev = c;
        srv->clients = c;
        if (uv_accept(server, (uv_stream_t *)&c->pipe) < 0) {
                client_close(c);
                return;
        }
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
        if (!control_peer_allowed(c->uid, c->gid, groups, ngroups, srv->d->socket_gid)) {
                char msg[256];
                if (srv->d->socket_gid != (gid_t)-1)
                        snprintf(msg, sizeof msg,
                                 "uid %u is not allowed: the control socket serves root, uid %u "
                                 "and members of group %s",
                                 (unsigned)c->uid, (unsigned)geteuid(),
                                 srv->d->cfg->socket_group);
                else
                        snprintf(msg, sizeof msg,
                                 "uid %u is not allowed: the control socket serves root and uid "
                                 "%u (group %s does not exist)",
                                 (unsigned)c->uid, (unsigned)geteuid(),
                                 srv->d->cfg->socket_group);
                log_warning("control: refused a connection from uid %u pid %d", (unsigned)c->uid,
                            (int)c->pid);
                c->refusal = strdup(msg);
                if (!c->refusal)
                        client_close(c);
        }
        uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
}

static void on_server_closed(uv_handle_t *h)
{
        struct control_server *srv = h->data;
        free(srv->path);
        free(srv);
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
                free(dir);
                free(srv->path);
                free(srv);
                return -ENOMEM;
        }
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
        mode_t old = umask(0117);
        int r = uv_pipe_bind(&srv->pipe, path);
        umask(old);
        if (r == 0)
                r = uv_listen((uv_stream_t *)&srv->pipe, 128, on_connection);
        if (r < 0) {
                uv_close((uv_handle_t *)&srv->pipe, on_server_closed);
                return r;
        }
        if (chmod(path, 0660) < 0)
                log_warning("control: chmod %s: %s", path, strerror(errno));
        if (d->socket_gid != (gid_t)-1 && chown(path, (uid_t)-1, d->socket_gid) < 0)
                log_warning("control: chown %s to group %s: %s", path, d->cfg->socket_group,
                            strerror(errno));
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
        uv_close((uv_handle_t *)&srv->pipe, on_server_closed);
}
