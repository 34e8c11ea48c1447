/* SPDX-License-Identifier: MIT */
/* bench_chronos: next-fire computations per second (run by hand, not a test).
 *
 *   build/tests/bench/bench_chronos [-n SCHEDULES] [--rounds R] [--seed S]
 *
 * A mixed set of N (default 10,000) schedules is generated deterministically:
 * minutely steps, hourly and daily times, weekday ranges, day-of-month lists,
 * the day-of-month/day-of-week OR rule, macros up to @yearly and rare dates
 * (29 February), each in UTC or one of a few IANA zones with and without DST.
 * Measured in process with cron_parse + cron_next (include/kairos/cron.h):
 *   (a) parses per second;
 *   (b) next-fire computations per second over the whole set, from R start
 *       times spread over two years (DST transitions included);
 *   (c) the same per class of expression and for UTC vs zones;
 *   (d) chained: the next 10 fires of every schedule (what a preview does).
 * The kairosd side (idle CPU with 10,000 schedules loaded) is
 * tests/bench/bench_chronos.py. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kairos/cron.h"

#define NCLASSES 10

static const char *const class_names[NCLASSES] = {
        "*/S minutes",  "hourly at M",   "daily at H:M",  "weekdays H:M", "dom list",
        "dom|dow (OR)", "hour ranges/S", "@macro",        "monthly/yearly", "29 Feb",
};

static const char *const zones[] = {
        "UTC",           "Europe/Berlin",      "America/New_York", "Asia/Tokyo",
        "Australia/Sydney", "Asia/Kolkata",    "America/Sao_Paulo", "Pacific/Chatham",
};
#define NZONES (sizeof(zones) / sizeof(zones[0]))

struct sched {
        char text[96];
        int cls;
        int zone;
        struct cron_expr e;
};

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint64_t rng(void)
{
        uint64_t x = rng_state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        return rng_state = x;
}

static unsigned rnd(unsigned n)
{
        return (unsigned)(rng() % n);
}

static double now_s(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void make_expr(struct sched *s)
{
        static const char *const macros[] = { "@hourly", "@daily", "@weekly", "@monthly",
                                              "@yearly" };
        static const unsigned steps[] = { 1, 2, 5, 10, 15, 20, 30 };
        static const char *const dows[] = { "1-5", "MON-FRI", "0,6", "SAT,SUN", "2-4", "5-7" };
        char *t = s->text;
        size_t n = sizeof s->text;
        s->cls = (int)rnd(NCLASSES);
        switch (s->cls) {
        case 0:
                snprintf(t, n, "*/%u * * * *", steps[rnd(7)]);
                break;
        case 1:
                snprintf(t, n, "%u * * * *", rnd(60));
                break;
        case 2:
                snprintf(t, n, "%u %u * * *", rnd(60), rnd(24));
                break;
        case 3:
                snprintf(t, n, "%u %u * * %s", rnd(60), rnd(24), dows[rnd(6)]);
                break;
        case 4:
                snprintf(t, n, "%u %u 1,%u,%u * *", rnd(60), rnd(24), 2 + rnd(13), 15 + rnd(16));
                break;
        case 5:
                snprintf(t, n, "%u %u %u * %u", rnd(60), rnd(24), 1 + rnd(28), rnd(7));
                break;
        case 6:
                snprintf(t, n, "%u %u-%u/%u * * *", rnd(60), rnd(8), 12 + rnd(12), 1 + rnd(4));
                break;
        case 7:
                snprintf(t, n, "%s", macros[rnd(5)]);
                break;
        case 8:
                if (rnd(2))
                        snprintf(t, n, "%u %u %u * *", rnd(60), rnd(24), 1 + rnd(28));
                else
                        snprintf(t, n, "%u %u %u %s *", rnd(60), rnd(24), 1 + rnd(28),
                                 (const char *[]){ "JAN", "APR", "JUL", "OCT", "DEC" }[rnd(5)]);
                break;
        default:
                snprintf(t, n, "%u %u 29 2 *", rnd(60), rnd(24));
                break;
        }
        s->zone = rnd(2) ? 0 : (int)(1 + rnd(NZONES - 1)); /* half UTC */
}

static void usage(void)
{
        fprintf(stderr, "usage: bench_chronos [-n SCHEDULES] [--rounds R] [--seed S]\n");
        exit(64);
}

int main(int argc, char **argv)
{
        long nsched = 10000, rounds = 20;
        for (int i = 1; i < argc; i++) {
                if (i + 1 < argc && strcmp(argv[i], "-n") == 0)
                        nsched = strtol(argv[++i], NULL, 10);
                else if (i + 1 < argc && strcmp(argv[i], "--rounds") == 0)
                        rounds = strtol(argv[++i], NULL, 10);
                else if (i + 1 < argc && strcmp(argv[i], "--seed") == 0)
                        rng_state = strtoull(argv[++i], NULL, 0) | 1;
                else
                        usage();
        }
        if (nsched < 1 || rounds < 1)
                usage();

        struct cron_tz *tz[NZONES] = { 0 };
        for (size_t z = 1; z < NZONES; z++) {
                int r = cron_tz_load(zones[z], &tz[z]);
                if (r < 0) {
                        fprintf(stderr, "bench_chronos: zone %s: %s (using UTC)\n", zones[z],
                                strerror(-r));
                        tz[z] = NULL;
                }
        }
        struct sched *s = calloc((size_t)nsched, sizeof(*s));
        if (!s)
                return 1;
        for (long i = 0; i < nsched; i++)
                make_expr(&s[i]);

        /* (a) parse */
        char err[256];
        int parse_reps = 10;
        double t0 = now_s();
        for (int rep = 0; rep < parse_reps; rep++)
                for (long i = 0; i < nsched; i++)
                        if (cron_parse(s[i].text, &s[i].e, err, sizeof err) < 0) {
                                fprintf(stderr, "bench_chronos: '%s': %s\n", s[i].text, err);
                                return 1;
                        }
        double parse_s = now_s() - t0;

        /* (b) + (c) next fire from R start times over 2026-2027 */
        const int64_t base = 1767225600; /* 2026-01-01T00:00:00Z */
        int64_t *starts = calloc((size_t)rounds, sizeof(*starts));
        for (long r = 0; r < rounds; r++)
                starts[r] = base + (int64_t)(rng() % (2 * 365 * 86400ULL));
        double cls_time[NCLASSES] = { 0 }, zone_time[2] = { 0 };
        long cls_count[NCLASSES] = { 0 }, zone_count[2] = { 0 };
        long total = 0, failures = 0;
        volatile int64_t sink = 0;
        double all0 = now_s();
        for (long r = 0; r < rounds; r++) {
                for (long i = 0; i < nsched; i++) {
                        int64_t next;
                        if (cron_next(&s[i].e, tz[s[i].zone], starts[r], &next) < 0)
                                failures++;
                        else
                                sink += next;
                }
                total += nsched;
        }
        double all_s = now_s() - all0;
        /* per class: a separate pass timing each call group (the clock reads
         * are amortized over the rounds of one schedule) */
        for (long i = 0; i < nsched; i++) {
                double c0 = now_s();
                for (long r = 0; r < rounds; r++) {
                        int64_t next;
                        if (cron_next(&s[i].e, tz[s[i].zone], starts[r], &next) == 0)
                                sink += next;
                }
                double dt = now_s() - c0;
                cls_time[s[i].cls] += dt;
                cls_count[s[i].cls] += rounds;
                zone_time[s[i].zone != 0 && tz[s[i].zone]] += dt;
                zone_count[s[i].zone != 0 && tz[s[i].zone]] += rounds;
        }

        /* (d) chained previews: next 10 fires of each schedule */
        double ch0 = now_s();
        long chained = 0;
        for (long i = 0; i < nsched; i++) {
                int64_t t = base;
                for (int k = 0; k < 10; k++) {
                        int64_t next;
                        if (cron_next(&s[i].e, tz[s[i].zone], t, &next) < 0)
                                break;
                        t = next;
                        chained++;
                }
        }
        double chained_s = now_s() - ch0;
        (void)sink;

        printf("kairos chronos benchmark: %ld schedules (%ld rounds of start times), "
               "%zu zones\n",
               nsched, rounds, NZONES);
        printf("(a) cron_parse:          %10.0f parses/s\n", parse_reps * nsched / parse_s);
        printf("(b) cron_next, mixed:    %10.0f next-fire computations/s (%.2f us each; "
               "%ld of %ld without a fire)\n",
               total / all_s, all_s / total * 1e6, failures, total);
        printf("    all %ld schedules once: %.2f ms\n", nsched, all_s / rounds * 1e3);
        printf("(c) per class:\n");
        for (int k = 0; k < NCLASSES; k++)
                if (cls_count[k])
                        printf("      %-16s %10.0f /s  (%ld calls)\n", class_names[k],
                               cls_count[k] / cls_time[k], cls_count[k]);
        printf("      %-16s %10.0f /s\n", "UTC", zone_count[0] / zone_time[0]);
        if (zone_count[1])
                printf("      %-16s %10.0f /s\n", "IANA zones", zone_count[1] / zone_time[1]);
        printf("(d) chained previews:    %10.0f next-fire computations/s (next 10 of each)\n",
               chained / chained_s);
        for (size_t z = 0; z < NZONES; z++)
                cron_tz_free(tz[z]);
        free(starts);
        free(s);
        return 0;
}
