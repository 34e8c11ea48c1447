/* SPDX-License-Identifier: MIT */
/* The files driver of tool-call claims (toolclaims.h): kairosd on one host
 * keeps every claim in its local store (idem_core.c). */
#include "toolclaims.h"

static bool files_dropped(const struct mandate *m)
{
        return false;
}

static bool files_begin(struct idem_call *call, const char *key, const char *tool,
                        const char *fp, const struct idem_step_owner *step, int64_t epoch)
{
        return false;
}

static bool files_finish(struct idem_call *call, struct idem_claim *c, json_int_t exit_status,
                         const char *out, const char *err, const char *eclass, const char *emsg)
{
        return false;
}

static bool files_closed(struct idem_claim *c, const char *why)
{
        return false;
}

static bool files_write_begin(struct write_op *op, const struct idem_step_owner *step,
                              int64_t epoch)
{
        return false;
}

static bool files_write_done(struct write_op *op)
{
        return false;
}

const struct toolclaims toolclaims_files = {
        .name = "files",
        .dropped = files_dropped,
        .begin = files_begin,
        .finish = files_finish,
        .closed = files_closed,
        .write_begin = files_write_begin,
        .write_done = files_write_done,
};
