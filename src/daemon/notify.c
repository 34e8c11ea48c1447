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

/* STATUS= is rate-limited on the loop: a change is sent at once if the last
 * one went out at least status_interval_ms ago, else it waits (only the
 * newest) for a timer at the end of that interval.  Two changes per mandate
 * (running, done) become at most a few datagrams a second however many
 * mandates run, and the manager still shows the current status within the
 * interval.  READY, RELOADING and STOPPING send a waiting status first (the
 * manager sees them in order), and the first change after READY is sent at
 * once; WATCHDOG and EXTEND_TIMEOUT_USEC never wait. */
enum { STATUS_INTERVAL_MS = 250 };
static uv_loop_t *status_loop;     /* rate-limited while set (loop thread only) */
static uv_timer_t status_timer;
static bool status_timer_ready;    /* initialised (closed by notify_status_stop) */
static uint64_t status_interval_ms = STATUS_INTERVAL_MS;
static uint64_t status_sent_at;    /* uv_now of the last STATUS= sent */
static bool status_sent_any;
static char status_last[512];      /* the last STATUS= sent */
static char status_pending[512];   /* the newest not yet sent; "" none */

static void status_send(const char *buf)
{
        snprintf(status_last, sizeof status_last, "%s", buf);
        status_pending[0] = '\0';
        status_sent_any = true;
        if (status_loop)
                status_sent_at = uv_now(status_loop);
        notify_send(buf);
}

static void status_flush(void)
{
        if (status_timer_ready)
                uv_timer_stop(&status_timer);
        if (status_pending[0] && strcmp(status_pending, status_last) != 0) {
                char buf[sizeof status_pending];
                memcpy(buf, status_pending, sizeof buf);
                status_send(buf);
        }
        status_pending[0] = '\0';
}

static void on_status_timer(uv_timer_t *t)
{
        (void)t;
        status_flush();
}

void notify_status_start(uv_loop_t *loop)
{
        status_loop = loop;
        status_sent_at = uv_now(loop);
#ifdef KAIROS_TEST_HOOKS
        const char *ms = getenv("KAIROS_TEST_STATUS_INTERVAL_MS");
        if (ms && *ms)
                status_interval_ms = strtoull(ms, NULL, 10);
#endif
}

void notify_status_stop(void)
{
        status_flush();
        if (status_timer_ready) {
                uv_close((uv_handle_t *)&status_timer, NULL);
                status_timer_ready = false;
        }
        status_loop = NULL;
}

void notify_ready(void)
{
        status_flush();
        notify_send("READY=1");
        /* the status that follows READY goes at once: `systemctl start`
         * returns at READY and the status is read right after */
        status_sent_any = false;
}

void notify_status(const char *status)
{
        /* Only changes are sent: the manager needs no repeats, and every
         * datagram is a chance to block on a full notify socket. */
        char buf[sizeof status_last];
        snprintf(buf, sizeof buf, "STATUS=%s", status);
        if (status_pending[0]) {
                /* one waits already: the timer sends the newest */
                if (strcmp(buf, status_last) == 0)
                        status_pending[0] = '\0';
                else
                        memcpy(status_pending, buf, sizeof buf);
                return;
        }
        if (strcmp(buf, status_last) == 0)
                return;
        uint64_t now = status_loop ? uv_now(status_loop) : 0;
        if (!status_loop || !status_sent_any || now - status_sent_at >= status_interval_ms) {
                status_send(buf);
                return;
        }
        if (!status_timer_ready) {
                if (uv_timer_init(status_loop, &status_timer) < 0) {
                        status_send(buf);
                        return;
                }
                uv_unref((uv_handle_t *)&status_timer); /* keeps no loop alive */
                status_timer_ready = true;
        }
        memcpy(status_pending, buf, sizeof buf);
        if (uv_timer_start(&status_timer, on_status_timer,
                           status_sent_at + status_interval_ms - now, 0) < 0)
                status_flush();
}

void notify_reloading(void)
{
        status_flush();
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
        status_flush();
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
