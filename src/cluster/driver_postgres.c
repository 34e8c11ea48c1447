/* SPDX-License-Identifier: MIT */
/* The postgres driver's table (driver.h, cluster.h): Backend=postgres. */
#include "opreads.h"
#include "toolclaims.h"
#include "driver_postgres.h"

const struct driver postgres_driver = {
        .name = "postgres",
        .opreads = &opreads_postgres,
        .toolclaims = &toolclaims_postgres,
        .start = pgd_start,
        .prefork = pgd_prefork,
        .ready = pgd_ready,
        .quiesce = pgd_quiesce,
        .stop = pgd_stop,
        .free = pgd_free,
        .status = pgd_status,
        .thread_done = cluster_thread_done,
        .init_db = pgd_init_db,
        .wal = { .options = pgd_wal_options, .failed = pgd_wal_failed },
        .ticks = { .attach = pgt_attach, .detach = pgt_detach, .sched_new = pgt_sched_new,
                   .sched_carry = pgt_sched_carry, .sched_loaded = pgt_sched_loaded,
                   .sched_free = pgt_sched_free, .missed_here = pgt_missed_here,
                   .unclaimed = pgt_unclaimed, .round = pgt_round, .settled = pgt_settled,
                   .stop = pgt_stop },
        .own = { .attach = pgd_attach, .detach = pgd_detach, .hold = pgd_hold,
                 .release = pgd_release, .drop = pgd_drop, .dropped = pgd_dropped,
                 .retry_creating = pgd_retry_creating, .forget_dropped = pgd_forget_dropped,
                 .may_act = pgd_may_act, .node = pgd_node, .finish = pgd_finish,
                 .fired = pgx_fired, .slot_ready = pgx_slot_ready,
                 .slot_release = pgx_slot_release, .barrier_failed = pgx_barrier_failed,
                 .kill_mark = pgd_kill_mark, .killed_here = pgd_killed_here },
};
