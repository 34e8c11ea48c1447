/* SPDX-License-Identifier: MIT */
/* What an operation reports back to whoever asked for it (commands.c turns
 * it into a control reply): a result, or an error code, message and
 * optional detail object.  The receiver takes result and detail; message
 * is valid during the callback only. */
#pragma once

#include <jansson.h>
#include <stdbool.h>

struct op_result {
        json_t *result;            /* ok: the result object; NULL on error */
        const char *code;          /* NULL when ok; else e.g. "bad_argument" */
        const char *message;       /* error only */
        json_t *detail;            /* error only: extra fields, or NULL */
};

/* Whom an operation answers: done(ctx, result) once, on the loop thread;
 * done NULL when nobody asked (e.g. a timer's fire). */
struct op_reply {
        void (*done)(void *ctx, const struct op_result *r);
        void *ctx;
};

/* Someone waits for the answer. */
static inline bool op_reply_wanted(const struct op_reply *to)
{
        return to->done != NULL;
}
/* Answer with result (stolen; dropped when nobody asked) and forget the
 * receiver: a second answer goes nowhere. */
void op_reply_ok(struct op_reply *to, json_t *result);
/* Answer with an error: code and a message (printf format; cut at 1023
 * bytes, as control replies are), and forget the receiver. */
void op_reply_error(struct op_reply *to, const char *code, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
