/* SPDX-License-Identifier: MIT */
#include "notify.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <time.h>

#include "log.h"

/* One socket for the daemon's life, each datagram sent to NOTIFY_SOCKET's
 * address: sd_notify makes, sizes and closes a socket per call (about ten
 * system calls; two status changes per mandate).  An address that is not a
 * path or an abstract name (vsock:…) goes through sd_notify. */
enum { NOTIFY_UNKNOWN, NOTIFY_OWN, NOTIFY_SD };
static int notify_mode = NOTIFY_UNKNOWN;
static int notify_fd = -1;
static struct sockaddr_un notify_addr;
static socklen_t notify_addrlen;

static void notify_open(void)
{
        notify_mode = NOTIFY_SD;
        const char *e = getenv("NOTIFY_SOCKET");
        size_t n = e ? strlen(e) : 0;
        if (n < 2 || (e[0] != '/' && e[0] != '@') || n > sizeof notify_addr.sun_path)
                return; /* unset (sd_notify: nothing), or not ours to parse */
        if (e[0] == '/' && n == sizeof notify_addr.sun_path)
                return; /* no room for its terminating NUL */
        int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return;
        int sndbuf = 8 * 1024 * 1024; /* as sd_notify asks (best effort) */
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
        notify_addr.sun_family = AF_UNIX;
        memcpy(notify_addr.sun_path, e, n);
        if (e[0] == '@')
                notify_addr.sun_path[0] = '\0';
        notify_addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n +
                                     (e[0] == '/'));
        notify_fd = fd;
        notify_mode = NOTIFY_OWN;
}

/* A notice the manager never got (a lost READY=1 has the start time out):
 * the first such failure is a warning, later ones debug. */
static void notify_failed(const char *state, int err)
{
        static bool warned;
        const char *nl = strchr(state, '\n');
        int len = nl ? (int)(nl - state) : (int)strlen(state);
        if (!warned)
                log_warning("cannot notify the service manager (%.*s): %s", len, state,
                            strerror(err));
        else
                log_debug("cannot notify the service manager (%.*s): %s", len, state,
                          strerror(err));
        warned = true;
}

static void notify_send(const char *state)
{
        if (notify_mode == NOTIFY_UNKNOWN)
                notify_open();
        if (notify_mode == NOTIFY_OWN) {
                ssize_t n;
                do
                        n = sendto(notify_fd, state, strlen(state), MSG_NOSIGNAL,
                                   (struct sockaddr *)&notify_addr, notify_addrlen);
                while (n < 0 && errno == EINTR);
                if (n < 0)
                        notify_failed(state, errno);
                return;
        }
        int r = sd_notify(0, state);
        if (r < 0)
                notify_failed(state, -r);
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
