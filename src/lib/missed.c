/* SPDX-License-Identifier: MIT */
/* missed: the missed-tick policy as a pure function (see include/kairos/missed.h). */
#include "kairos/missed.h"

#include <errno.h>
#include <string.h>

/* The latest `keep` ticks seen, in a ring. */
struct ring {
        int64_t *t;
        size_t cap, n, head;
};

static void ring_push(struct ring *r, int64_t t)
{
        if (r->cap == 0)
                return;
        r->t[(r->head + r->n) % r->cap] = t;
        if (r->n < r->cap)
                r->n++;
        else
                r->head = (r->head + 1) % r->cap;
}

/* The ticks of (from, to], counted up to `cap`.  Returns true if every tick
 * was seen (*count exact), false if it stopped after `cap` ticks with more to
 * come.  The latest ticks seen are kept in r (reset first). */
static bool scan(const struct cron_expr *e, const struct cron_tz *tz, int64_t from, int64_t to,
                 uint64_t cap, struct ring *r, uint64_t *count)
{
        r->n = r->head = 0;
        *count = 0;
        int64_t t = from, next;
        while (t < to && cron_next(e, tz, t, &next) == 0 && next <= to) {
                if (*count == cap)
                        return false;
                ring_push(r, next);
                (*count)++;
                t = next;
        }
        return true;
}

/* The latest `keep` (> 0) ticks of (lo, hi], where there are more than
 * MISSED_COUNT_MAX of them: bisect for a start s with keep or keep + 1 ticks
 * in (s, hi].  The count of ticks in (s, hi] moves by at most one per second
 * of s, so this ends within log2(hi - lo) scans of keep + 1 ticks. */
static void latest_ticks(const struct cron_expr *e, const struct cron_tz *tz, int64_t lo,
                         int64_t hi, size_t keep, struct ring *r)
{
        int64_t a = lo, b = hi; /* (a, hi] has more than keep + 1 ticks, (b, hi] fewer than keep */
        uint64_t count;
        while (b - a > 1) {
                int64_t m = a + (b - a) / 2;
                if (!scan(e, tz, m, hi, keep + 1, r, &count))
                        a = m;
                else if (count >= keep)
                        return;
                else
                        b = m;
        }
        /* not reached (see above); keep what the last scan saw */
}

static bool rule_ok(const struct missed_rule *rule)
{
        if (rule->grace_sec > MISSED_GRACE_MAX_SEC)
                return false;
        switch (rule->policy) {
        case MISSED_SKIP:
        case MISSED_CATCH_UP_ONCE:
                return true;
        case MISSED_CATCH_UP_BOUNDED:
                return rule->max_catch_up_runs >= 1 &&
                       rule->max_catch_up_runs <= MISSED_CATCH_UP_MAX;
        }
        return false;
}

/* The latest tick of (lo, hi] into *ret (MISSED_NEVER if none): bounded work
 * (a scan of MISSED_COUNT_MAX ticks, then bisection). */
static void latest_tick(const struct cron_expr *e, const struct cron_tz *tz, int64_t lo,
                        int64_t hi, int64_t *ret, uint64_t *ret_count, bool *ret_more)
{
        int64_t one[2];
        struct ring r = { one, 2, 0, 0 };
        uint64_t n;
        *ret_more = false;
        if (!scan(e, tz, lo, hi, MISSED_COUNT_MAX, &r, &n)) {
                *ret_more = true;
                latest_ticks(e, tz, lo, hi, 1, &r);
        }
        *ret_count = n;
        *ret = r.n ? r.t[(r.head + r.n - 1) % r.cap] : MISSED_NEVER;
}

int missed_plan(const struct cron_expr *e, const struct cron_tz *tz,
                const struct missed_rule *rule, int64_t last_evaluated, int64_t last_fire,
                int64_t now, struct missed_plan *ret)
{
        if (!e || !rule || !ret || !rule_ok(rule))
                return -EINVAL;
        if (now < CRON_TIME_MIN || now > CRON_TIME_MAX || last_evaluated < CRON_TIME_MIN ||
            last_evaluated > CRON_TIME_MAX)
                return -ERANGE;
        ret->nfire = ret->ncatch_up = 0;
        ret->dropped = 0;
        ret->dropped_more = ret->stale = ret->covered = false;
        ret->dropped_first = ret->dropped_last = MISSED_NEVER;
        if (now <= last_evaluated)
                return 0;

        /* The current tick: the latest of (last_evaluated, now], if it is at
         * most max(MISSED_ON_TIME_SEC, grace_sec) old. */
        uint64_t window = rule->grace_sec > MISSED_ON_TIME_SEC ? rule->grace_sec
                                                               : MISSED_ON_TIME_SEC;
        int64_t g = now - (int64_t)window - 1;
        if (g < last_evaluated)
                g = last_evaluated;
        int64_t current;
        uint64_t n_on;
        bool on_more;
        latest_tick(e, tz, g, now, &current, &n_on, &on_more);
        (void)n_on;
        (void)on_more;

        size_t keep = 0;
        switch (rule->policy) {
        case MISSED_SKIP:
                break;
        case MISSED_CATCH_UP_ONCE:
                /* one run for the missed period: the current tick is it */
                keep = current == MISSED_NEVER ? 1 : 0;
                break;
        case MISSED_CATCH_UP_BOUNDED:
                keep = rule->max_catch_up_runs;
                if (last_fire != MISSED_NEVER && now - last_fire > 0 &&
                    (uint64_t)(now - last_fire) > rule->stale_after_sec) {
                        ret->stale = true;
                        keep = current == MISSED_NEVER ? 1 : 0;
                }
                break;
        }

        /* missed: the ticks of (last_evaluated, current) or (last_evaluated, now] */
        int64_t hi = current == MISSED_NEVER ? now : current - 1;
        int64_t buf[MISSED_CATCH_UP_MAX + 1];
        struct ring r_miss = { buf, keep + 1, 0, 0 };
        uint64_t n_miss = 0;
        if (hi > last_evaluated) {
                uint64_t cap = MISSED_COUNT_MAX > keep + 2 ? MISSED_COUNT_MAX : keep + 2;
                if (!scan(e, tz, last_evaluated, hi, cap, &r_miss, &n_miss)) {
                        n_miss = cap + 1; /* at least */
                        ret->dropped_more = true;
                        latest_ticks(e, tz, last_evaluated, hi, keep + 1, &r_miss);
                }
        }
        size_t kept = n_miss < keep ? (size_t)n_miss : keep;
        ret->dropped = n_miss - kept;
        ret->covered = ret->dropped && current != MISSED_NEVER &&
                       rule->policy != MISSED_SKIP && kept == 0;
        if (ret->dropped) {
                int64_t first;
                if (cron_next(e, tz, last_evaluated, &first) == 0)
                        ret->dropped_first = first;
                ret->dropped_last = r_miss.t[(r_miss.head + r_miss.n - 1 - kept) % r_miss.cap];
        }
        /* the catch-up runs ascending, then the current tick */
        for (size_t i = 0; i < kept; i++)
                ret->fire[i] = r_miss.t[(r_miss.head + r_miss.n - kept + i) % r_miss.cap];
        ret->ncatch_up = kept;
        ret->nfire = kept;
        if (current != MISSED_NEVER)
                ret->fire[ret->nfire++] = current;
        return 0;
}
