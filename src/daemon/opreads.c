/* SPDX-License-Identifier: MIT */
/* The files driver of the operator's reads (opreads.h): kairosd on one
 * host, where every mandate is this node's and nothing lies beyond it. */
#include <errno.h>

#include "opreads.h"

static bool files_holds(const struct mandate *m)
{
        return true;
}

static bool files_retry_creating(const struct mandate *m)
{
        return false;
}

static json_t *files_status(struct daemon *d)
{
        return NULL;
}

static void files_owner(struct daemon *d, const struct mandate *m, json_t *mj)
{
}

static bool files_list(struct daemon *d, const struct opreads_list *q, struct op_reply to)
{
        return false;
}

/* (not reached: no mandate is another node's) */
static int files_show(struct daemon *d, const char *id, json_t *(*render)(const struct fold *f),
                      opreads_show_cb cb, void *ctx)
{
        cb(ctx, &(struct op_result){ .code = "not_found", .message = "no such mandate" }, NULL);
        return 0;
}

static int files_take(struct daemon *d, const char *id, opreads_take_cb cb, void *ctx)
{
        cb(ctx, -ENOENT, NULL);
        return 0;
}

/* The tick of a mandate of this node: nothing beyond it. */
static int files_tick(struct daemon *d, const char *id, bool remote, const char *schedule,
                      const char *fired_at, opreads_tick_cb cb, void *ctx)
{
        cb(ctx, NULL, &(struct opreads_tick){ .id = id });
        return 0;
}

const struct opreads opreads_files = {
        .name = "files",
        .others = false,
        .holds = files_holds,
        .counts = files_holds,
        .retry_creating = files_retry_creating,
        .status = files_status,
        .owner = files_owner,
        .list = files_list,
        .show = files_show,
        .take = files_take,
        .tick = files_tick,
};
