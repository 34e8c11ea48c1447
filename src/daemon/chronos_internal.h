/* SPDX-License-Identifier: MIT */
/* The chronos' state, shared with its ticks drivers (driver.h: the postgres
 * driver's cluster_ticks.c); the chronos' interface is chronos.h. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon.h"
#include "kairos/cron.h"
#include "kairos/missed.h"
#include "kairos/planner.h"

#define NEVER INT64_MIN
_Static_assert(NEVER == MISSED_NEVER, "one value for never");

struct sched {
        char *name;
        struct cron_expr expr;
        struct cron_tz *tz;
        const struct config_schedule *cfg;  /* in d->cfg (refreshed on reload); NULL for a
                                             * broken schedule without a retained one */
        const char *error;                  /* broken: its first error (in d->cfg) */
        bool broken;                        /* its file has errors: never fires */
        bool frozen;                        /* its next fire cannot be represented (the
                                             * clock is beyond year 9999): state kept */
        int64_t last_evaluated;             /* NEVER: first sight */
        int64_t last_fire;
        int64_t next_fire;                  /* NEVER: none */
        bool paused;
        char *pause_reason;
        /* the last missed period with ticks not fired (schedules shows it) */
        uint64_t skipped;                   /* 0: none */
        bool skipped_more;                  /* skipped is a lower bound */
        int64_t skipped_first, skipped_last;
        const char *skipped_reason;         /* static text */
        /* ticks the executor refused (Concurrency=reject, ...) since start */
        uint64_t refused;
        int64_t refused_last;
        char *refused_reason;
        void *drv_state;                    /* the ticks driver's (driver.h: sched_new) */
};

/* A tick that fires: queued, and handed to the executor a few per loop turn,
 * so that a large catch-up never blocks the loop. */
#define FIRES_PER_TURN 32
struct pending_fire {
        struct pending_fire *next;
        char *schedule;
        int64_t t;
        const char *why;                    /* static text */
};

struct chronos {
        struct daemon *d;
        struct pending_fire *fire_head, *fire_tail;
        size_t nunanswered;                 /* fires queued or not yet durable: chronos.json
                                             * waits for them (docs/design.md §9) */
        uv_idle_t idle;
        bool idle_init;
        struct sched *s;
        size_t n;
        int tfd;
        uv_poll_t poll;
        bool poll_active;
        bool writing, dirty;
        bool stopped;
        bool clock_absurd;                  /* the last evaluation refused the clock */
        char *list_text;                    /* the `schedules` result as JSON text */
        size_t list_len;
        uint64_t list_fp;                   /* ... for this state of the schedules */
        void *drv_state;                    /* the ticks driver's (driver.h) */
};

static inline struct chronos *C(const struct daemon *d)
{
        return d->chronos;
}

/* t as fired_at text, "-" for NEVER */
void chronos_fmt_time(int64_t t, char out[PLANNER_FIRED_AT_LEN]);
struct sched *chronos_find(struct chronos *c, const char *name);
const char *chronos_policy_name(enum config_missed_policy p);
struct missed_rule chronos_rule_of(const struct config_schedule *cfg);
/* Queue the fire of tick t of s (why: for the log, static text). */
void chronos_fire_tick(struct chronos *c, struct sched *s, int64_t t, const char *why);
/* The ticks of p not fired, if any: kept for `schedules` and logged with the
 * count, the first and the last (since: the start of the period). */
struct missed_plan;
void chronos_note_skipped(struct chronos *c, struct sched *s, const struct missed_plan *p,
                          int64_t since);
