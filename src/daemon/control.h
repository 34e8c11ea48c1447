/* SPDX-License-Identifier: MIT */
/* control: the control socket (DESIGN §12).  AF_UNIX stream, mode 0660,
 * group SocketGroup=; every peer checked with SO_PEERCRED; one JSON request
 * per line {"v":1,"id":N,"cmd":"…","args":{…}} → one reply per line
 * {"v":1,"id":N,"ok":true,"result":{…}} or
 * {"v":1,"id":N,"ok":false,"error":{"code":"…","message":"…"}}.
 * Requests over 1 MiB are refused and the connection closed. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <sys/types.h>

#include "daemon.h"

#define CONTROL_MAX_REQUEST (1024 * 1024)

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
};

/* Reply and free the request (exactly one of these per request). result is stolen. */
void control_reply_ok(struct control_request *req, json_t *result);
void control_reply_error(struct control_request *req, const char *code, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
/* Error with extra detail object (stolen), e.g. the list of config errors. */
void control_reply_error_detail(struct control_request *req, const char *code, json_t *detail,
                                const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Argument helper: return the value or NULL after replying with an error
 * ("bad_argument", naming the field).  *failed is set when it replied. */
const char *control_arg_string(struct control_request *req, const char *name, bool required,
                               bool *failed);

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

/* The peer check: root, the daemon's uid, or a member of group gid. */
bool control_peer_allowed(uid_t uid, gid_t gid, const gid_t *groups, size_t ngroups,
                          gid_t socket_gid);

/* commands.c */
void commands_dispatch(struct control_request *req);
