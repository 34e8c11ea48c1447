/* SPDX-License-Identifier: MIT */
/* What an operation reports back to whoever asked for it (commands.c turns
 * it into a control reply): a result, or an error code, message and
 * optional detail object.  The receiver takes result and detail; message
 * is valid during the callback only. */
#pragma once

#include <jansson.h>

struct op_result {
        json_t *result;            /* ok: the result object; NULL on error */
        const char *code;          /* NULL when ok; else e.g. "bad_argument" */
        const char *message;       /* error only */
        json_t *detail;            /* error only: extra fields, or NULL */
};
