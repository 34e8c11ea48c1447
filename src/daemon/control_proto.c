/* SPDX-License-Identifier: MIT */
#include "control_proto.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static void set_err(char *err, size_t errlen, const char *msg)
{
        if (err && errlen > 0)
                snprintf(err, errlen, "%s", msg);
}

/* What is wrong with a parsed document as a request, or NULL. */
static const char *request_problem(json_t *root)
{
        json_t *v = json_object_get(root, "v");
        json_t *args = json_object_get(root, "args");

        if (!json_is_object(root))
                return "a request must be a JSON object";
        if (!json_is_integer(v) || json_integer_value(v) != 1)
                return "v: must be 1";
        if (!json_is_integer(json_object_get(root, "id")))
                return "id: must be an integer";
        if (!json_is_string(json_object_get(root, "cmd")))
                return "cmd: must be a string";
        if (args && !json_is_object(args))
                return "args: must be an object";
        return NULL;
}

int control_parse_request(const char *line, size_t len, struct control_parsed *out, char *err,
                          size_t errlen)
{
        json_error_t jerr;

        memset(out, 0, sizeof(*out));
        set_err(err, errlen, "");
        out->root = json_loadb(line ? line : "", line ? len : 0, JSON_REJECT_DUPLICATES, &jerr);
        if (!out->root) {
                if (err && errlen > 0)
                        snprintf(err, errlen, "malformed JSON at byte %d: %s", jerr.position,
                                 jerr.text);
                return -EBADMSG;
        }
        json_t *id = json_object_get(out->root, "id");
        if (json_is_integer(id))
                out->id = id;
        const char *problem = request_problem(out->root);
        if (problem) {
                set_err(err, errlen, problem);
                return -EINVAL;
        }
        out->cmd = json_string_value(json_object_get(out->root, "cmd"));
        out->args = json_object_get(out->root, "args");
        return 0;
}

void control_parsed_clear(struct control_parsed *p)
{
        if (!p)
                return;
        json_decref(p->root);
        memset(p, 0, sizeof(*p));
}

int control_args_string(json_t *args, const char *name, bool required, const char **ret,
                        const char **ret_why)
{
        json_t *v = json_object_get(args, name);
        *ret = NULL;
        if (!v || json_is_null(v)) {
                *ret_why = "required";
                return required ? -EINVAL : 0;
        }
        if (!json_is_string(v)) {
                *ret_why = "must be a string";
                return -EINVAL;
        }
        *ret = json_string_value(v);
        return 0;
}

int control_args_required(json_t *args, va_list ap, const char **ret_name, const char **ret_why)
{
        for (const char *name; (name = va_arg(ap, const char *));) {
                const char **out = va_arg(ap, const char **);
                if (control_args_string(args, name, true, out, ret_why) < 0) {
                        *ret_name = name;
                        return -EINVAL;
                }
        }
        return 0;
}
