/* SPDX-License-Identifier: MIT */
/* clock: what time it is, for every module of the daemon — milliseconds
 * on the monotonic and the real-time clock, microseconds on the monotonic
 * one, and the scheduler's seconds, which the test hook test-clock may fake
 * (d->fake_clock).  It calls no other module: everyone may call it. */
#include <time.h>

#include "daemon.h"

uint64_t now_ms_monotonic(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t now_us_monotonic(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

int64_t now_ms_realtime(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t clock_now(const struct daemon *d)
{
        if (d->fake_clock)
                return d->fake_now;
        return (int64_t)time(NULL);
}
