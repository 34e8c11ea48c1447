/* SPDX-License-Identifier: MIT */
/* control: the control socket (docs/design.md §12).  AF_UNIX stream, mode 0660,
 * group SocketGroup=; every peer checked with SO_PEERCRED; one JSON request
 * per line {"v":1,"id":N,"cmd":"…","args":{…}} → one reply per line
 * {"v":1,"id":N,"ok":true,"result":{…}} or
 * {"v":1,"id":N,"ok":false,"error":{"code":"…","message":"…"}}.
 * Requests over 1 MiB are refused and the connection closed.  Every reply,
 * whatever builds it, is queued through one path that counts its bytes
 * against the limits below. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <sys/types.h>

#include "daemon.h"

#define CONTROL_MAX_REQUEST (1024 * 1024)

/* Limits of the control socket (kairosd(8), LIMITS).  A connection takes
 * no new request while CONTROL_MAX_INFLIGHT of its requests are being
 * worked on (a request waiting for a durable write counts), nor while more
 * than CONTROL_MAX_QUEUED bytes of its replies wait for it to read them,
 * nor, having replies waiting, while all connections together have more
 * than CONTROL_MAX_QUEUED_TOTAL waiting: it is simply not read until they
 * drain, so what it pipelines waits in its own socket. */
#define CONTROL_MAX_INFLIGHT 64
#define CONTROL_MAX_QUEUED (4u << 20)
#define CONTROL_MAX_QUEUED_TOTAL (16u << 20)
#define CONTROL_READ_SIZE 65536
/* a client that held more than this: memory trimmed when it leaves */
#define CONTROL_TRIM_AFTER (1u << 20)
/* Lines of one connection handled in one turn of the loop. */
#define CONTROL_BATCH 32
/* Connections: at most CONTROL_MAX_CLIENTS (fewer when the open-file limit
 * is low, never fewer than CONTROL_MIN_CLIENTS); the last 1/16 of them are
 * kept for root and kairosd's own user, and of the others the last 1/16 for
 * users who hold none (one each).  Other users share the rest: each may hold
 * CONTROL_MAX_CLIENTS_PER_UID, and no more than its share, the rest divided
 * by the number of users connected (itself included), never less than 1;
 * so a few users who open connections without end cannot lock out the
 * others (kairosd(8), LIMITS).
 * A refused connection gets a "too_many_clients" error for its first request
 * and is closed; at most CONTROL_MAX_REFUSING wait for that request (for
 * CONTROL_REFUSE_LINGER_MS), beyond that they get the error at once. */
#define CONTROL_MAX_CLIENTS 256
#define CONTROL_MIN_CLIENTS 8
#define CONTROL_MAX_CLIENTS_PER_UID 64
#define CONTROL_MAX_REFUSING 32
#define CONTROL_REFUSE_LINGER_MS 2000
/* A refused connection is logged once per uid per interval: the first at
 * once, the count of the others when the interval ends.  At most
 * CONTROL_REFUSAL_UIDS uids are told apart (the others counted together). */
#define CONTROL_REFUSAL_LOG_MS 10000
#define CONTROL_REFUSAL_UIDS 32
/* File descriptors kept out of the connections' reach: a base for the
 * daemon itself (lock, listening socket, idempotency log, state
 * directories, the loop's own descriptors, thread pool work) and a share per
 * concurrently running mandate (its WAL, the handler's pipes and pidfd, the
 * exec shim's). */
#define CONTROL_FD_RESERVE_BASE 64
#define CONTROL_FD_RESERVE_PER_MANDATE 16

struct control_limits {
        unsigned long fd_limit;     /* RLIMIT_NOFILE (soft) */
        unsigned long fd_reserve;   /* kept for everything but connections */
        unsigned max_clients;
        unsigned max_per_uid;
        unsigned reserved;          /* of max_clients, for root and kairosd's user only */
        unsigned newcomers;         /* of the rest, for a user's first connection only */
        bool fits;                  /* max_clients + refusing + reserve < fd_limit */
};

struct control_client;

struct control_request {
        struct daemon *d;
        struct control_client *client;
        json_t *id;           /* the request's id (a reference) */
        const char *cmd;
        json_t *args;         /* an object (possibly empty), owned */
        json_t *root;         /* the whole request, owned */
        uid_t uid;
        gid_t gid;
        pid_t pid;
        bool taken_remote;   /* its mandate was taken from another node for it */
};

/* Reply and free the request (exactly one of these per request). result is stolen. */
void control_reply_ok(struct control_request *req, json_t *result);
/* Reply with a result that is already JSON text (not parsed again). */
void control_reply_ok_text(struct control_request *req, const char *result, size_t len);
void control_reply_error(struct control_request *req, const char *code, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
/* Error with extra detail object (stolen), e.g. the list of config errors. */
void control_reply_error_detail(struct control_request *req, const char *code, json_t *detail,
                                const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Argument helper: return the value or NULL after replying with an error
 * ("bad_argument", naming the field).  *failed is set when it replied. */
const char *control_arg_string(struct control_request *req, const char *name, bool required,
                               bool *failed);
/* Required string arguments in order: pairs of a name and its const char
 * **, then NULL.  false: replied bad_argument. */
bool control_arg_required(struct control_request *req, ...);

/* Something a command keeps on behalf of the connection a request came on
 * (e.g. an idempotency claim, which must not outlive its caller).  When the
 * connection closes, every claim still attached to it is detached and its
 * on_close runs, once, on the loop thread; control_claim_release detaches
 * a claim without calling on_close.  The claim's memory belongs to its
 * owner (on_close may free it). */
struct control_claim {
        struct control_claim *prev, *next;
        struct control_client *client;   /* NULL: not attached */
        void (*on_close)(struct control_claim *c);
};
/* Attach c to req's connection.  false (nothing attached) if the connection
 * is already closing: the caller is gone. */
bool control_claim_attach(struct control_request *req, struct control_claim *c,
                          void (*on_close)(struct control_claim *c));
void control_claim_release(struct control_claim *c);
/* Is c attached to the connection req came on? */
bool control_claim_owned_by(const struct control_claim *c, const struct control_request *req);

/* Replace the limits control_start computed (the fuzz target uses small
 * ones); connections already open are not affected. */
void control_set_limits(struct daemon *d, const struct control_limits *lim);

/* Serve an already connected socket (e.g. one end of a socketpair) as a
 * control connection, exactly like an accepted one: peer check, limits.
 * The server must be running (control_start).  fd is taken over. */
int control_adopt_fd(struct daemon *d, int fd);

/* The commands' entry points (commands.h), set once at start before
 * control_start: control calls up into commands only through these. */
struct control_commands {
        void (*dispatch)(struct control_request *req);
        bool (*known)(const char *cmd);  /* is cmd the name of a command? */
};
void control_set_commands(const struct control_commands *c);
