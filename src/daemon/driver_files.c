/* SPDX-License-Identifier: MIT */
/* The files driver (driver.h): kairosd on one host.  The WAL file and its
 * fdatasync are the truth; every mandate and every tick is this node's; the
 * chronos decides its missed ticks itself (chronos.json). */
#include "opreads.h"
#include "toolclaims.h"
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "driver.h"

static void wal_options(struct mandate *m, struct wal_options *o) {}
static void wal_failed(const struct mandate *m, int err, char *buf, size_t len)
{
        snprintf(buf, len, "fdatasync of %s: %s", m->wal_path, strerror(-err));
}

static int ticks_attach(struct chronos *c) { return 0; }
static int sched_new(struct chronos *c, struct sched *s) { return 0; }
static void sched_carry(struct sched *s, struct sched *old) {}
static void sched_none(struct sched *s) {}
static void ticks_none(struct chronos *c) {}
static bool ticks_missed_here(const struct chronos *c) { return true; }
static bool ticks_unclaimed(struct chronos *c, const char *name, int64_t t,
                            const struct op_result *r) { return false; }

static int own_attach(struct mandate *m) { return 0; }
static void own_none(struct mandate *m) {}
static void own_drop_(struct mandate *m, const char *why) {}
static bool own_never(const struct mandate *m) { return false; }
static bool own_keep(struct mandate *m) { return false; }
static bool own_may_act_(const struct daemon *d) { return true; }
static const char *own_node_(const struct daemon *d) { return NULL; }
static int own_finish_(struct mandate *m, enum mandate_status end, char *err,
                       size_t errlen) { return 0; }
static bool own_fired(struct mandate *m, const struct config_schedule *sc) { return false; }
static bool own_slot_ready(struct mandate *m) { return true; }
/* a failed barrier is the mandate's own WAL error (executor.c) */
static bool own_barrier_failed(struct mandate *m, int err, const char *errmsg,
                               struct op_reply *reply, struct op_reply *cancel_reply)
{
        return false;
}
/* one host has no fence: a killed handler is the step's own failure */
static uint64_t own_kill_mark(const struct daemon *d) { return 0; }
static bool own_killed_here(struct mandate *m, uint64_t mark) { return false; }

/* operator's reads (opreads.h): every mandate is this node's, nothing lies
 * beyond it */
static bool reads_holds(const struct mandate *m) { return true; }
static bool reads_retry_creating(const struct mandate *m) { return false; }
static json_t *reads_status(struct daemon *d) { return NULL; }
static void reads_owner(struct daemon *d, const struct mandate *m, json_t *mj) {}
static bool reads_list(struct daemon *d, const struct opreads_list *q, struct op_reply to)
{ return false; }
/* (not reached: no mandate is another node's) */
static int reads_show(struct daemon *d, const char *id, json_t *(*render)(const struct fold *f),
                      opreads_show_cb cb, void *ctx)
{
        cb(ctx, &(struct op_result){ .code = "not_found", .message = "no such mandate" }, NULL);
        return 0;
}
static int reads_take(struct daemon *d, const char *id, opreads_take_cb cb, void *ctx)
{
        cb(ctx, -ENOENT, NULL);
        return 0;
}
/* the tick of a mandate of this node: nothing beyond it */
static int reads_tick(struct daemon *d, const char *id, bool remote, const char *schedule,
                      const char *fired_at, opreads_tick_cb cb, void *ctx)
{
        cb(ctx, NULL, &(struct opreads_tick){ .id = id });
        return 0;
}

/* (not reached: no mandate is another node's) */
static int reads_fold(struct daemon *d, const char *id, opreads_fold_cb cb, void *ctx)
{
        cb(ctx, -ENOENT, NULL, NULL);
        return 0;
}

/* one host: its history holds every retry */
static int reads_retried_by(struct daemon *d, const struct mandate *m, opreads_retries_cb cb,
                            void *ctx)
{
        cb(ctx, NULL);
        return 0;
}

const struct opreads opreads_files = {
        .name = "files", .others = false, .holds = reads_holds, .counts = reads_holds,
        .retry_creating = reads_retry_creating, .status = reads_status, .owner = reads_owner,
        .list = reads_list, .show = reads_show, .take = reads_take, .tick = reads_tick,
        .fold = reads_fold, .retried_by = reads_retried_by,
};

/* tool-call claims (toolclaims.h): every claim is in the local store
 * (idem_core.c), none is the driver's */
static bool claims_dropped(const struct mandate *m) { return false; }
static bool claims_begin(struct idem_call *call, const char *key, const char *tool,
                         const char *fp, const struct idem_step_owner *step, int64_t epoch)
{ return false; }
static bool claims_finish(struct idem_call *call, struct idem_claim *c, json_int_t exit_status,
                          const char *out, const char *err, const char *eclass, const char *emsg)
{ return false; }
static bool claims_closed(struct idem_claim *c, const char *why) { return false; }
static bool claims_write_begin(struct write_op *op, const struct idem_step_owner *step,
                               int64_t epoch) { return false; }
static bool claims_write_done(struct write_op *op) { return false; }

const struct toolclaims toolclaims_files = {
        .name = "files", .dropped = claims_dropped, .begin = claims_begin,
        .finish = claims_finish, .closed = claims_closed, .write_begin = claims_write_begin,
        .write_done = claims_write_done,
};

static int start(struct daemon *d, char *err, size_t errlen) { return 0; }
static int prefork(struct daemon *d, struct deadman **ret_deadman)
{
        *ret_deadman = NULL;
        return 0;
}
static void daemon_none(struct daemon *d) {}
static json_t *status(struct daemon *d) { return NULL; }
static void thread_done(void) {}
static int init_db(const char *arg) { return 1; } /* (main.c asks the postgres driver) */

const struct driver files_driver = {
        .name = "files",
        .opreads = &opreads_files,
        .toolclaims = &toolclaims_files,
        .start = start,
        .prefork = prefork,
        .ready = daemon_none,
        .quiesce = daemon_none,
        .stop = daemon_none,
        .free = daemon_none,
        .status = status,
        .thread_done = thread_done,
        .init_db = init_db,
        .wal = { .options = wal_options, .failed = wal_failed },
        .ticks = { .attach = ticks_attach, .detach = ticks_none, .sched_new = sched_new,
                   .sched_carry = sched_carry, .sched_loaded = sched_none,
                   .sched_free = sched_none,
                   .missed_here = ticks_missed_here, .unclaimed = ticks_unclaimed,
                   .round = ticks_none, .settled = ticks_none, .stop = ticks_none },
        .own = { .attach = own_attach, .detach = own_none, .hold = own_none,
                 .release = own_none, .drop = own_drop_, .dropped = own_never,
                 .retry_creating = own_never, .forget_dropped = own_keep,
                 .may_act = own_may_act_, .node = own_node_, .finish = own_finish_,
                 .fired = own_fired, .slot_ready = own_slot_ready,
                 .slot_release = own_none, .barrier_failed = own_barrier_failed,
                 .kill_mark = own_kill_mark, .killed_here = own_killed_here },
};
