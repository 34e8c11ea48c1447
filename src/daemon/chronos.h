/* SPDX-License-Identifier: MIT */
/* chronos: the scheduler.  Schedules follow the wall clock: one
 * timerfd on CLOCK_REALTIME armed at the next fire with
 * TFD_TIMER_CANCEL_ON_SET, so a clock step is noticed at once and the next
 * fire recomputed.  Which ticks of (last evaluation, now] fire is the pure
 * rule of src/lib/missed.c (MissedPolicy=, StaleAfter=, MissedGraceSec=);
 * every fire has its own fired_at, is queued and handed to the same entry
 * point as `kairosctl fire` a few per loop turn.  Broken schedule files are
 * listed (state broken) and never fire; a clock outside years 1970-9999 is
 * refused with the state kept.  State (last evaluated, last fire, next fire, paused) is
 * kept in <state>/chronos.json, replaced atomically.  In cluster mode the
 * missed ticks are decided once for the cluster, on each schedule's row in
 * the database under compare-and-set (docs/design.md §14, "Ticks"). */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

struct daemon;

/* Load chronos.json, build the schedules of the current configuration,
 * evaluate (missed ticks) and arm the timer.  Call once, after recovery. */
int chronos_start(struct daemon *d);
/* The configuration changed (reload): add, remove and change schedules,
 * keeping the state of those that stay. */
void chronos_reload(struct daemon *d);
void chronos_stop(struct daemon *d);
void chronos_free(struct daemon *d);

/* kairosctl schedules [next NAME -n N] as JSON text, kept until a schedule changes (owned by chronos;
 * valid until the next call or a reload).  NULL: out of memory. */
const char *chronos_list_text(struct daemon *d, size_t *ret_len);
/* -ENOENT: no such schedule. */
int chronos_next_json(struct daemon *d, const char *name, unsigned n, json_t **out);
/* kairosctl backfill: at most this many ticks unless the operator says
 * more (--max), and never more than CHRONOS_BACKFILL_HARD_MAX. */
#define CHRONOS_BACKFILL_MAX 100
#define CHRONOS_BACKFILL_HARD_MAX 10000
/* The ticks of schedule name in [from, to] (ascending) into ret_ticks (room
 * for max), their count into *ret_n: -ENOENT no such schedule, -EBADR
 * broken, -E2BIG more than max (*ret_n = max + 1), -ERANGE a time outside
 * the cron range. */
int chronos_backfill_ticks(struct daemon *d, const char *name, int64_t from, int64_t to,
                           size_t max, int64_t *ret_ticks, size_t *ret_n);
/* kairosctl pause/resume --schedule NAME.  -ENOENT, or 1 if nothing changed. */
int chronos_set_paused(struct daemon *d, const char *name, bool paused, const char *reason);

/* Test hook (only with -Dtest_hooks=true): replace the clock by `now` and
 * evaluate as if the wall clock had been set to it. */
void chronos_test_set_clock(struct daemon *d, int64_t now);
