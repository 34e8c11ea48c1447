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
        ret->dropped_more = ret->stale = false;
        if (now <= last_evaluated)
                return 0;

        size_t keep = 0;
        switch (rule->policy) {
        case MISSED_SKIP:
                break;
        case MISSED_CATCH_UP_ONCE:
                keep = 1;
                break;
        case MISSED_CATCH_UP_BOUNDED:
                keep = rule->max_catch_up_runs;
                if (last_fire != MISSED_NEVER && now - last_fire > 0 &&
                    (uint64_t)(now - last_fire) > rule->stale_after_sec) {
                        ret->stale = true;
                        keep = 1;
                }
                break;
        }

        /* on time: [now - window, now], i.e. (g, now] */
        uint64_t window = rule->grace_sec > MISSED_ON_TIME_SEC ? rule->grace_sec
                                                               : MISSED_ON_TIME_SEC;
        int64_t g = now - (int64_t)window - 1;
        if (g < last_evaluated)
                g = last_evaluated;
        int64_t ontime[MISSED_ON_TIME_MAX];
        struct ring r_on = { ontime, MISSED_ON_TIME_MAX, 0, 0 };
        uint64_t n_on;
        bool all_on = scan(e, tz, g, now, MISSED_ON_TIME_MAX, &r_on, &n_on);
        if (!all_on) {
                /* (not with a bounded grace; counted as dropped all the same) */
                uint64_t more;
                struct ring none = { NULL, 0, 0, 0 };
                scan(e, tz, r_on.t[(r_on.head + r_on.n - 1) % r_on.cap], now, MISSED_COUNT_MAX,
                     &none, &more);
                ret->dropped += more;
        }
        /* a stale schedule runs once, counting an on-time tick */
        if (ret->stale && n_on > 0)
                keep = 0;

        /* missed: (last_evaluated, g] */
        struct ring r_miss = { ret->fire, keep, 0, 0 };
        uint64_t n_miss = 0;
        if (g > last_evaluated) {
                /* (more than keep + 1 ticks when it stops: see latest_ticks) */
                uint64_t cap = MISSED_COUNT_MAX > keep + 1 ? MISSED_COUNT_MAX : keep + 2;
                if (scan(e, tz, last_evaluated, g, cap, &r_miss, &n_miss)) {
                        ret->dropped += n_miss - (n_miss < keep ? n_miss : keep);
                } else {
                        ret->dropped += cap + 1 - keep; /* at least */
                        ret->dropped_more = true;
                        if (keep)
                                latest_ticks(e, tz, last_evaluated, g, keep, &r_miss);
                }
        }
        /* ascending: the ring's order, then the on-time ticks */
        int64_t tmp[MISSED_CATCH_UP_MAX];
        for (size_t i = 0; i < r_miss.n; i++)
                tmp[i] = r_miss.t[(r_miss.head + i) % r_miss.cap];
        memcpy(ret->fire, tmp, r_miss.n * sizeof(*tmp));
        ret->ncatch_up = r_miss.n;
        for (size_t i = 0; i < r_on.n; i++)
                ret->fire[ret->ncatch_up + i] = r_on.t[(r_on.head + i) % r_on.cap];
        ret->nfire = ret->ncatch_up + r_on.n;
        return 0;
}
