/* SPDX-License-Identifier: MIT */
/* control_proto: parsing and validation of one control request line
 * (docs/design.md §12), {"v":1,"id":N,"cmd":"…","args":{…}}.  Pure: no libuv, no
 * daemon state; used by control.c and by the fuzz target. */
#pragma once

#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

struct control_parsed {
        json_t *root;           /* the parsed document, owned; NULL if not JSON */
        json_t *id;             /* root's "id" if it is an integer, else NULL (borrowed) */
        const char *cmd;        /* root's "cmd" (borrowed); set only on success */
        json_t *args;           /* root's "args" object (borrowed), NULL if absent;
                                 * set only on success */
};

/* Parse one request line (without its newline; any bytes, need not be
 * NUL-terminated).  Fills *out in every case (release it with
 * control_parsed_clear).  Returns
 *   0        a valid request: root is an object with "v":1, an integer
 *            "id", a string "cmd", and "args" absent or an object;
 *   -EBADMSG not JSON: root and id are NULL, err says "malformed JSON at
 *            byte N: …";
 *   -EINVAL  JSON but not a valid request: root is set, id is the integer
 *            id when there is one (so the error reply can name it), err says
 *            what is wrong ("v: must be 1", …).
 * err (errlen > 0) is always NUL-terminated. */
int control_parse_request(const char *line, size_t len, struct control_parsed *out, char *err,
                          size_t errlen);
void control_parsed_clear(struct control_parsed *p);

/* A request's string argument args.name: 0 with *ret the string (NULL when
 * absent or null and not required), or -EINVAL with *ret_why saying what
 * is wrong ("required", "must be a string"). */
int control_args_string(json_t *args, const char *name, bool required, const char **ret,
                        const char **ret_why);
/* Required string arguments in order: ap holds pairs of a name and its
 * const char **, then NULL.  0, or -EINVAL with *ret_name the first one
 * wrong and *ret_why what is wrong with it. */
int control_args_required(json_t *args, va_list ap, const char **ret_name, const char **ret_why);
