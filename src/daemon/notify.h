/* SPDX-License-Identifier: MIT */
/* notify: the sd_notify protocol (READY, STATUS, RELOADING, STOPPING,
 * WATCHDOG, EXTEND_TIMEOUT_USEC) and the watchdog timer.  Without
 * NOTIFY_SOCKET everything is silently skipped. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

void notify_ready(void);
void notify_status(const char *status); /* rate-limited once started */
/* From here STATUS= changes are rate-limited on loop's timer (notify.c);
 * stop: the waiting one sent, the timer closed, later changes sent at once. */
void notify_status_start(uv_loop_t *loop);
void notify_status_stop(void);
void notify_reloading(void);          /* RELOADING=1 + MONOTONIC_USEC= */
void notify_stopping(void);
void notify_extend_timeout(uint64_t usec);

struct notify_watchdog {
        uv_timer_t timer;
        uint64_t interval_ms;             /* half of WATCHDOG_USEC */
        bool (*healthy)(void *ctx);       /* ping only while this says yes */
        void *ctx;
        bool active;
};

/* Start pinging WATCHDOG=1 at half of WATCHDOG_USEC if the manager asked for
 * it (WATCHDOG_USEC set and WATCHDOG_PID our pid).  Returns 1 if started, 0
 * if no watchdog was requested, <0 on error. */
int notify_watchdog_start(uv_loop_t *loop, struct notify_watchdog *w,
                          bool (*healthy)(void *ctx), void *ctx);
void notify_watchdog_stop(struct notify_watchdog *w);
