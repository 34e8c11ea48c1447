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

/* Argument helpers: return the value or NULL after replying with an error
 * ("bad_argument", naming the field).  *failed is set when they replied. */
const char *control_arg_string(struct control_request *req, const char *name, bool required,
                               bool *failed);
int control_arg_bool(struct control_request *req, const char *name, bool *out, bool *failed);

/* The peer check: root, the daemon's uid, or a member of group gid. */
bool control_peer_allowed(uid_t uid, gid_t gid, const gid_t *groups, size_t ngroups,
                          gid_t socket_gid);

/* commands.c */
void commands_dispatch(struct control_request *req);
