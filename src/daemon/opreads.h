/* SPDX-License-Identifier: MIT */
/* opreads: the operator's reads and takes across nodes, one driver per
 * backend (docs/design.md §14, "Drivers").  commands.c asks d->opreads what
 * lies beyond this node's own mandates (list, show, retry) and hands it the
 * commands that act on a mandate no node here holds (cancel, resolve,
 * approve, resume); it never asks which driver runs.  main.c picks one at
 * start:
 *   opreads_files      (driver_files.c) one host: every mandate is this node's;
 *   opreads_postgres   (cluster_commands.c, -Dpostgres=enabled only) the
 *                      cluster's rows in PostgreSQL.
 * A driver fills every pointer.  Answers reach commands.c through the
 * callbacks it gives (result.h): a driver never sees a request. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon.h"
#include "result.h"

struct fold;

/* list: the filter as parsed (its strings live as long as the request). */
struct opreads_list {
        const struct history_filter *f; /* f->after: the cursor if known here */
        size_t limit;                   /* 0: all */
        const char *after;              /* the cursor's id as given, or NULL */
};

/* show of a mandate no node here holds: r->result (the mandate's object,
 * stolen) or an error; calls (borrowed, may be NULL): step -> tool calls. */
typedef void (*opreads_show_cb)(void *ctx, const struct op_result *r, json_t *calls);

/* retry: what the tick of mandate id looks like beyond this node. */
struct opreads_tick {
        const char *id;                 /* the mandate asked about */
        bool remote;                    /* the mandate is no node's here: */
        const char *schedule, *fired_at; /* its row's tick, */
        const char *status;             /* and status (a word of kairosctl(1)) */
        bool ended, done;
        int last;                       /* the tick's highest retry number there */
};
/* err: an error to answer (the tick is then NULL). */
typedef void (*opreads_tick_cb)(void *ctx, const struct op_result *err,
                                const struct opreads_tick *t);
/* fold: the rows of mandate id folded (stolen by the callback), or err
 * (-ENOENT: no such mandate; other: errmsg says why) and f NULL. */
typedef void (*opreads_fold_cb)(void *ctx, int err, const char *errmsg, struct fold *f);
/* retried_by: the ids of the retries of a mandate beyond this node's
 * history, by retry number (borrowed), or NULL: none known there (or the
 * database did not answer). */
typedef void (*opreads_retries_cb)(void *ctx, json_t *ids);
/* take: err 0 once the mandate is this node's; else -EBUSY (detail: the
 * node holding it, then, after a space, when its hold ends unless it
 * renews it, YYYY-MM-DDTHH:MM:SSZ, if known), -EALREADY (detail: its status, a word of
 * kairosctl(1)), -ENOENT, -ESHUTDOWN, other (detail: why). */
typedef void (*opreads_take_cb)(void *ctx, int err, const char *detail);

struct opreads {
        const char *name;
        /* Mandates of other nodes exist: an id unknown here, or one this
         * node does not hold, is asked of the driver (show, take, retry). */
        bool others;
        /* m is this node's to act on (false: dropped, or being handed back). */
        bool (*holds)(const struct mandate *m);
        /* m counts for its tick's retry rule (false: dropped). */
        bool (*counts)(const struct mandate *m);
        /* a retry this node is still creating (another node may win it) */
        bool (*retry_creating)(const struct mandate *m);
        /* status: the "cluster" object, or NULL */
        json_t *(*status)(struct daemon *d);
        /* show of m held here: its node and epoch into mj */
        void (*owner)(struct daemon *d, const struct mandate *m, json_t *mj);
        /* list: answer to (op_result) with the rows of every node; false:
         * not this driver's (the caller lists this node's own). */
        bool (*list)(struct daemon *d, const struct opreads_list *q, struct op_reply to);
        /* show of id, no node's here: render (fold to its JSON) runs on a
         * pool thread.  -ENOMEM: cb is not called. */
        int (*show)(struct daemon *d, const char *id, json_t *(*render)(const struct fold *f),
                    opreads_show_cb cb, void *ctx);
        /* take id for an operator's command.  -ENOMEM: cb is not called. */
        int (*take)(struct daemon *d, const char *id, opreads_take_cb cb, void *ctx);
        /* retry of id (remote: no node's here; else a mandate of this node
         * of schedule's tick fired_at).  -ENOMEM: cb is not called. */
        int (*tick)(struct daemon *d, const char *id, bool remote, const char *schedule,
                    const char *fired_at, opreads_tick_cb cb, void *ctx);
        /* the rows of id, no node's here, folded off the loop (retry
         * --from).  -ENOMEM: cb is not called. */
        int (*fold)(struct daemon *d, const char *id, opreads_fold_cb cb, void *ctx);
        /* show of m held here: its retries beyond this node (made on any
         * node).  -ENOMEM: cb is not called. */
        int (*retried_by)(struct daemon *d, const struct mandate *m, opreads_retries_cb cb,
                          void *ctx);
};

extern const struct opreads opreads_files;
extern const struct opreads opreads_postgres; /* (built with PostgreSQL only) */
