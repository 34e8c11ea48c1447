/* SPDX-License-Identifier: MIT */
/* The files driver (driver.h): kairosd on one host.  The WAL file and its
 * fdatasync are the truth; every mandate and every tick is this node's; the
 * chronos decides its missed ticks itself (chronos.json). */
#include "opreads.h"
#include "toolclaims.h"
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
static bool own_barrier_failed(struct advance *a) { return false; }

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
                 .slot_release = own_none, .barrier_failed = own_barrier_failed },
};
