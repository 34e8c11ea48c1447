/* SPDX-License-Identifier: MIT */
/* Answers of operations (result.h). */
#include "result.h"

#include <stdarg.h>
#include <stdio.h>

void op_reply_ok(struct op_reply *to, json_t *result)
{
        struct op_reply r = *to;
        *to = (struct op_reply){ 0 };
        if (!r.done) {
                json_decref(result);
                return;
        }
        r.done(r.ctx, &(struct op_result){ .result = result ? result : json_object() });
}

void op_reply_error(struct op_reply *to, const char *code, const char *fmt, ...)
{
        struct op_reply r = *to;
        *to = (struct op_reply){ 0 };
        if (!r.done)
                return;
        char msg[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        r.done(r.ctx, &(struct op_result){ .code = code, .message = msg });
}
