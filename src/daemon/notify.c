/* SPDX-License-Identifier: MIT */
#include "notify.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <time.h>

#include "log.h"

static void notify_send(const char *state)
{
        int r = sd_notify(0, state);
        if (r < 0)
                log_debug("sd_notify(%s) failed: %s", state, strerror(-r));
}

void notify_ready(void)
{
        notify_send("READY=1");
}

void notify_status(const char *status)
{
        /* Only changes are sent: the manager needs no repeats, and every
         * datagram is a chance to block on a full notify socket. */
        static char last[512];
        char buf[512];
        snprintf(buf, sizeof buf, "STATUS=%s", status);
        if (strcmp(buf, last) == 0)
                return;
        snprintf(last, sizeof last, "%s", buf);
        notify_send(buf);
}

void notify_reloading(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t usec = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
        char buf[96];
        snprintf(buf, sizeof buf, "RELOADING=1\nMONOTONIC_USEC=%" PRIu64, usec);
        notify_send(buf);
}

void notify_stopping(void)
{
        /* Once: the manager needs it once, whichever exit path comes first. */
        static bool sent;
        if (sent)
                return;
        sent = true;
        notify_send("STOPPING=1");
}

void notify_extend_timeout(uint64_t usec)
{
        char buf[64];
        snprintf(buf, sizeof buf, "EXTEND_TIMEOUT_USEC=%" PRIu64, usec);
        notify_send(buf);
}

static void on_watchdog(uv_timer_t *t)
{
        struct notify_watchdog *w = t->data;
        if (!w->healthy || w->healthy(w->ctx))
                notify_send("WATCHDOG=1");
        else
                log_warning("event loop unhealthy: withholding the watchdog ping");
}

int notify_watchdog_start(uv_loop_t *loop, struct notify_watchdog *w,
                          bool (*healthy)(void *ctx), void *ctx)
{
        uint64_t usec = 0;
        w->active = false;
        int r = sd_watchdog_enabled(0, &usec);
        if (r <= 0 || usec == 0)
                return r < 0 ? r : 0;
        w->interval_ms = usec / 2000u;
        if (w->interval_ms == 0)
                w->interval_ms = 1;
        w->healthy = healthy;
        w->ctx = ctx;
        if ((r = uv_timer_init(loop, &w->timer)) < 0)
                return r;
        w->timer.data = w;
        if ((r = uv_timer_start(&w->timer, on_watchdog, 0, w->interval_ms)) < 0)
                return r;
        w->active = true;
        return 1;
}

void notify_watchdog_stop(struct notify_watchdog *w)
{
        if (!w->active)
                return;
        uv_timer_stop(&w->timer);
        uv_close((uv_handle_t *)&w->timer, NULL);
        w->active = false;
}
