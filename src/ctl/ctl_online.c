/* SPDX-License-Identifier: MIT */
/* kairosctl online commands (docs/design.md §12): status, list, show, fire, pause,
 * resume, approve, resolve, reload.  Each one is a single request over kairosd's control
 * socket (AF_UNIX stream, one JSON object per line) answered by one reply
 * line.  The client is blocking with a deadline: every wait is a poll()
 * bounded by the time left, every system call is restarted on EINTR, and a
 * reply is read up to CTL_REPLY_MAX bytes. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "kairos/cron.h"
#include "kairos/kbuf.h"
#include "kairos/kjson.h"
#include "kairos/kmem.h"
#include "kairos/planner.h"

#define CTL_REPLY_MAX (16u * 1024 * 1024)
#define CTL_TIMEOUT_MS_DEFAULT 30000
#define CTL_REQUEST_ID 1

/* ---- transport ------------------------------------------------------- */

struct conn {
        const char *path;
        int fd;
        int64_t deadline;       /* CLOCK_MONOTONIC, ms */
        int timeout_ms;
        bool quiet_timeout;     /* no reply in time: CTL_EXIT_TIMEOUT, nothing printed */
};

/* --socket, else $KAIROS_CONTROL_SOCKET, else the default. */
const char *ctl_socket_path(const struct ctl_opts *o)
{
        const char *env;

        if (o->socket_path)
                return o->socket_path;
        env = getenv("KAIROS_CONTROL_SOCKET");
        if (env && *env)
                return env;
        return CTL_DEFAULT_SOCKET;
}

/* $KAIROSCTL_TIMEOUT: seconds (fractions allowed) for the whole exchange. */
static int timeout_ms(int *out)
{
        const char *env = getenv("KAIROSCTL_TIMEOUT");
        char *end;
        double sec;

        *out = CTL_TIMEOUT_MS_DEFAULT;
        if (!env || !*env)
                return 0;
        errno = 0;
        sec = strtod(env, &end);
        if (errno != 0 || *end != '\0' || !isfinite(sec) || sec <= 0 || sec > 86400)
                return ctl_usage_error("KAIROSCTL_TIMEOUT: '%s' is not a number of seconds "
                                       "(0 < N <= 86400)",
                                       env);
        *out = (int)(sec * 1000 + 0.999);
        return 0;
}

/* Wait until fd is ready for `events` or the deadline passes.
 * Returns 0, -ETIMEDOUT or -errno. */
static int conn_wait(struct conn *c, short events)
{
        for (;;) {
                int64_t left = c->deadline - ctl_mono_ms();
                if (left <= 0)
                        return -ETIMEDOUT;
                struct pollfd p = { .fd = c->fd, .events = events };
                int n = poll(&p, 1, left > INT32_MAX ? INT32_MAX : (int)left);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (n > 0)
                        return 0;
        }
}

static int set_timeout_opt(int fd, int opt, int64_t ms)
{
        struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };

        if (ms <= 0)
                tv.tv_usec = 1000;
        return setsockopt(fd, SOL_SOCKET, opt, &tv, sizeof(tv)) < 0 ? -errno : 0;
}

/* Connect (blocking, bounded by SO_SNDTIMEO: a full listen backlog makes an
 * AF_UNIX connect wait), then switch to non-blocking for the exchange. */
static int conn_open(struct conn *c)
{
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        size_t n = strlen(c->path);
        int r, flags;

        if (n >= sizeof(sa.sun_path))
                return -ENAMETOOLONG;
        memcpy(sa.sun_path, c->path, n + 1);
        c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (c->fd < 0)
                return -errno;
        r = set_timeout_opt(c->fd, SO_SNDTIMEO, c->deadline - ctl_mono_ms());
        if (r < 0)
                return r;
        for (;;) {
                if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
                        break;
                if (errno == EINTR) {
                        if (ctl_mono_ms() >= c->deadline)
                                return -ETIMEDOUT;
                        continue;
                }
                if (errno == EISCONN)
                        break;
                /* SO_SNDTIMEO expired while the backlog stayed full */
                if (errno == EAGAIN || errno == EINPROGRESS)
                        return -ETIMEDOUT;
                return -errno;
        }
        flags = fcntl(c->fd, F_GETFL);
        if (flags < 0 || fcntl(c->fd, F_SETFL, flags | O_NONBLOCK) < 0)
                return -errno;
        return 0;
}

static int conn_send(struct conn *c, const char *data, size_t len)
{
        while (len > 0) {
                ssize_t n = send(c->fd, data, len, MSG_NOSIGNAL);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EAGAIN || errno == EWOULDBLOCK) {
                                int r = conn_wait(c, POLLOUT);
                                if (r < 0)
                                        return r;
                                continue;
                        }
                        return -errno;
                }
                data += n;
                len -= (size_t)n;
        }
        return 0;
}

/* Read one line (without its '\n') into `line`, NUL-terminated.
 * Returns 0, -ETIMEDOUT, -ENODATA (closed before any byte), -EPROTO (closed
 * in the middle of the line), -EMSGSIZE (over CTL_REPLY_MAX) or -errno. */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* Fault in the pages of [p, p + n) in one call (Linux 5.14): a page fault
 * each costs more than the parse of its bytes; best effort. */
static void populate(void *p, size_t n)
{
        uintptr_t page = 4096, a = ((uintptr_t)p + page - 1) & ~(page - 1);
        uintptr_t e = ((uintptr_t)p + n) & ~(page - 1);
        if (n >= 16 * page && e > a)
                (void)madvise((void *)a, e - a, MADV_POPULATE_WRITE);
}

static int conn_recv_line(struct conn *c, struct kbuf *line)
{
        size_t scanned = 0;

        for (;;) {
                char *nl = line->len > scanned ? memchr(line->data + scanned, '\n',
                                                        line->len - scanned)
                                               : NULL;
                if (nl) {
                        if ((size_t)(nl - line->data) > CTL_REPLY_MAX)
                                return -EMSGSIZE;
                        line->len = (size_t)(nl - line->data);
                        line->data[line->len] = '\0';
                        return 0;
                }
                scanned = line->len;
                if (line->len > CTL_REPLY_MAX)
                        return -EMSGSIZE;
                size_t had = line->cap;
                int r = kbuf_reserve(line, 65536 + 1);
                if (r < 0)
                        return r;
                if (line->cap > had)
                        populate(line->data + line->len, line->cap - line->len);
                ssize_t n = recv(c->fd, line->data + line->len, line->cap - line->len - 1, 0);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EAGAIN || errno == EWOULDBLOCK) {
                                r = conn_wait(c, POLLIN);
                                if (r < 0)
                                        return r;
                                continue;
                        }
                        return -errno;
                }
                if (n == 0)
                        return line->len == 0 ? -ENODATA : -EPROTO;
                line->len += (size_t)n;
                line->data[line->len] = '\0';
        }
}

static int unreachable(const char *fmt_path_first, const char *path, const char *rest)
{
        fputs("kairosctl: ", stderr);
        fputs(fmt_path_first, stderr);
        ctl_put_safe(stderr, path);
        fputs(rest, stderr);
        fputc('\n', stderr);
        return CTL_EXIT_UNREACHABLE;
}

/* list and show say how to read the history without kairosd when none
 * answers: the command, or NULL. */
static const char *offline_hint;

static int connect_error(const char *path, int r)
{
        char rest[512];
        const char *hint = "";
        char offline[256];

        struct stat st;

        if (r == -ECONNREFUSED && stat(path, &st) == 0 && !S_ISSOCK(st.st_mode)) {
                hint = " (not a socket)";
        } else if ((r == -ENOENT || r == -ECONNREFUSED) && offline_hint &&
                   access(CTL_DEFAULT_STATE_DIR, R_OK | X_OK) == 0) {
                snprintf(offline, sizeof offline,
                         " (is kairosd running?  Without it: kairosctl %s --state-dir "
                         CTL_DEFAULT_STATE_DIR " ...)", offline_hint);
                hint = offline;
        } else if (r == -ENOENT || r == -ECONNREFUSED) {
                hint = " (is kairosd running?)";
        } else if (r == -EACCES || r == -EPERM) {
                hint = " (root, kairosd's user or the socket's group may connect)";
        } else if (r == -ETIMEDOUT) {
                hint = " (kairosd is not accepting connections)";
        }
        snprintf(rest, sizeof(rest), ": %s%s", strerror(-r), hint);
        unreachable("cannot connect to ", path, rest);
        /* not allowed: refused, as when kairosd itself says so (kairosctl(1),
         * EXIT STATUS), not "cannot be reached" */
        return r == -EACCES || r == -EPERM ? CTL_EXIT_REFUSED : CTL_EXIT_UNREACHABLE;
}

static int recv_error(const struct conn *c, int r)
{
        char rest[256];

        switch (r) {
        case -ETIMEDOUT:
                snprintf(rest, sizeof(rest), " within %d.%03d s", c->timeout_ms / 1000,
                         c->timeout_ms % 1000);
                return unreachable("no reply from ", c->path, rest);
        case -ENODATA:
                return unreachable("", c->path, " closed the connection without a reply");
        case -EPROTO:
                return unreachable("", c->path, " closed the connection in the middle of a reply");
        case -EMSGSIZE:
                return unreachable("the reply from ", c->path, " is larger than 16 MiB");
        case -ENOMEM:
                return ctl_errno_error("reading the reply", r);
        default:
                snprintf(rest, sizeof(rest), " failed: %s", strerror(-r));
                return unreachable("reading the reply from ", c->path, rest);
        }
}

static int bad_reply(const struct conn *c, const char *why)
{
        char rest[512];

        snprintf(rest, sizeof(rest), ": %s", why);
        return unreachable("malformed reply from ", c->path, rest);
}

/* ---- request / reply -------------------------------------------------- */

/* Print the daemon's refusal: the message on stderr (for config_invalid also
 * every error of detail.errors, one per line); with --json the error object
 * on stdout as well.  Returns CTL_EXIT_REFUSED. */
static int print_refusal(const struct ctl_opts *o, json_t *error)
{
        json_t *errors = json_object_get(json_object_get(error, "detail"), "errors");
        const char *code = json_string_value(json_object_get(error, "code"));
        size_t i;
        json_t *e;

        fputs("kairosctl: ", stderr);
        ctl_put_safe_lines(stderr, json_string_value(json_object_get(error, "message")),
                           "  ");
        fputc('\n', stderr);
        if (code && strcmp(code, "config_invalid") == 0 && json_is_array(errors))
                json_array_foreach(errors, i, e) {
                        if (!json_is_string(e))
                                continue;
                        fputs("  ", stderr);
                        ctl_put_safe(stderr, json_string_value(e));
                        fputc('\n', stderr);
                }
        if (o->json && ctl_json_print(json_incref(error)) != 0)
                return CTL_EXIT_IOERR;
        return CTL_EXIT_REFUSED;
}

/* Check the reply's shape; returns NULL or what is wrong with it. */
static const char *check_reply(json_t *reply, json_int_t want_id)
{
        json_t *v = json_object_get(reply, "v"), *id = json_object_get(reply, "id");
        json_t *ok = json_object_get(reply, "ok"), *error;

        if (!json_is_object(reply))
                return "not a JSON object";
        if (!json_is_integer(v) || json_integer_value(v) != 1)
                return "v is not 1";
        if (!json_is_boolean(ok))
                return "ok is not true or false";
        if (json_is_true(ok)) {
                if (!json_is_integer(id) || json_integer_value(id) != want_id)
                        return "id does not match the request";
                if (!json_is_object(json_object_get(reply, "result")))
                        return "result is not an object";
                return NULL;
        }
        /* An error may carry a null id (the daemon could not read one); the
         * connection carried this request only. */
        if (!(json_is_null(id) || (json_is_integer(id) && json_integer_value(id) == want_id)))
                return "id does not match the request";
        error = json_object_get(reply, "error");
        if (!json_is_object(error) || !json_is_string(json_object_get(error, "code")) ||
            !json_is_string(json_object_get(error, "message")))
                return "error has no code and message";
        return NULL;
}

struct ctl_session {
        const struct ctl_opts *o;
        struct conn c;
        json_int_t next_id;
};

int ctl_session_open(const struct ctl_opts *o, struct ctl_session **out)
{
        struct ctl_session *s;
        int status, r;

        *out = NULL;
        s = calloc(1, sizeof(*s));
        if (!s)
                return ctl_error(CTL_EXIT_OSERR, "out of memory");
        s->o = o;
        s->c = (struct conn){ .path = ctl_socket_path(o), .fd = -1 };
        s->next_id = CTL_REQUEST_ID;
        status = timeout_ms(&s->c.timeout_ms);
        if (status != 0) {
                free(s);
                return status;
        }
        s->c.deadline = ctl_mono_ms() + s->c.timeout_ms;
        r = conn_open(&s->c);
        if (r < 0) {
                status = connect_error(s->c.path, r);
                ctl_session_close(s);
                return status;
        }
        *out = s;
        return CTL_EXIT_OK;
}

void ctl_session_close(struct ctl_session *s)
{
        if (!s)
                return;
        if (s->c.fd >= 0)
                close(s->c.fd);
        free(s);
}

/* A request that acts was sent and no reply came (a timeout, the
 * connection closed): kairosd may have done it.  Say so, and how to look. */
static void outcome_unknown(const char *cmd, json_t *args)
{
        static const char *const acting[] = { "fire", "retry", "cancel", "resolve", "approve",
                                              "resume", "pause", "backfill" };
        bool acts = false;
        for (size_t i = 0; i < sizeof acting / sizeof acting[0]; i++)
                acts = acts || strcmp(cmd, acting[i]) == 0;
        if (!acts)
                return;
        const char *sched = json_string_value(json_object_get(args, "schedule"));
        const char *mid = json_string_value(json_object_get(args, "mandate"));
        fputs("kairosctl: outcome unknown: the request reached kairosd, which may have done "
              "it; check with ",
              stderr);
        if (sched && (strcmp(cmd, "fire") == 0 || strcmp(cmd, "backfill") == 0)) {
                fputs("kairosctl list --schedule ", stderr);
                ctl_put_safe(stderr, sched);
        } else if (mid) {
                fputs("kairosctl show ", stderr);
                ctl_put_safe(stderr, mid);
                if (strcmp(cmd, "retry") == 0)
                        fputs(" (retried_by)", stderr);
        } else if (sched) {
                fputs("kairosctl schedules", stderr);
        } else {
                fputs("kairosctl list", stderr);
        }
        fputs(" before doing it again\n", stderr);
}

/* Send one request and read its reply line (*ret_id: the request's id);
 * CTL_EXIT_OK or an exit status (printed). */
static int session_exchange(struct ctl_session *s, const char *cmd, json_t *args,
                            struct kbuf *line, json_int_t *ret_id)
{
        struct conn *c = &s->c;
        json_t *req = NULL;
        char *text = NULL;
        json_int_t id = s->next_id++;
        int status, r;

        *ret_id = id;
        c->deadline = ctl_mono_ms() + c->timeout_ms;
        req = json_pack("{s:i, s:I, s:s, s:o}", "v", 1, "id", id, "cmd", cmd, "args",
                        args ? args : json_object());
        text = req ? json_dumps(req, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (!text || kbuf_puts(line, text) < 0 || kbuf_putc(line, '\n') < 0) {
                status = ctl_error(CTL_EXIT_OSERR, "out of memory");
                goto out;
        }
        r = conn_send(c, line->data, line->len);
        if (r < 0) {
                char rest[256];
                snprintf(rest, sizeof(rest), ": %s",
                         r == -ETIMEDOUT ? "timed out" : strerror(-r));
                status = unreachable("cannot send the request to ", c->path, rest);
                goto out;
        }
        kbuf_reset(line);
        r = conn_recv_line(c, line);
        if (r == -ETIMEDOUT && c->quiet_timeout)
                status = CTL_EXIT_TIMEOUT;
        else
                status = r < 0 ? recv_error(c, r) : CTL_EXIT_OK;
        if (r < 0 && r != -EMSGSIZE && r != -ENOMEM && !c->quiet_timeout)
                outcome_unknown(cmd, args);
out:
        json_decref(req);
        free(text);
        return status;
}

/* The reply line of request `id` read with jansson: result, refusal, or a
 * bad reply. */
static int session_reply(struct ctl_session *s, const struct kbuf *line, json_int_t id,
                         json_t **result, json_t **error)
{
        json_t *reply;
        json_error_t jerr;
        const char *why;
        int status;

        /* A handler's result may hold "\u0000": keep it (printed escaped). */
        reply = json_loadb(line->data, line->len, JSON_ALLOW_NUL, &jerr);
        if (!reply)
                return bad_reply(&s->c, jerr.text);
        why = check_reply(reply, id);
        if (why) {
                status = bad_reply(&s->c, why);
                goto out;
        }
        if (json_is_false(json_object_get(reply, "ok"))) {
                if (error) {
                        *error = json_incref(json_object_get(reply, "error"));
                        status = CTL_EXIT_REFUSED;
                } else {
                        status = print_refusal(s->o, json_object_get(reply, "error"));
                }
                goto out;
        }
        *result = json_incref(json_object_get(reply, "result"));
        status = CTL_EXIT_OK;
out:
        json_decref(reply);
        return status;
}

int ctl_session_call(struct ctl_session *s, const char *cmd, json_t *args, json_t **result,
                     json_t **error)
{
        struct kbuf line = KBUF_INIT;
        json_int_t id;
        int status;

        *result = NULL;
        if (error)
                *error = NULL;
        status = session_exchange(s, cmd, args, &line, &id);
        if (status == CTL_EXIT_OK)
                status = session_reply(s, &line, id, result, error);
        kbuf_free(&line);
        return status;
}

/* A kjson number that is exactly the integer n. */
static bool kjson_is_int(const struct kjson *v, json_int_t n)
{
        char text[32];
        int len = snprintf(text, sizeof text, "%" JSON_INTEGER_FORMAT, n);
        return v && v->type == KJSON_NUMBER && !v->u.num.is_float &&
               v->u.num.len == (size_t)len && memcmp(v->u.num.text, text, (size_t)len) == 0;
}

/* As ctl_call, the result parsed into the arena `a` (kjson: no allocation
 * per value, 4x faster than jansson on a 2 MB reply).  A reply that is not a
 * plain success goes the jansson way, so refusals and bad replies read the
 * same as with ctl_call. */
static int ctl_call_kjson(const struct ctl_opts *o, const char *cmd, json_t *args,
                          struct kjson_arena *a, const struct kjson **ret_result)
{
        struct ctl_session *s;
        struct kbuf line = KBUF_INIT;
        struct kjson *reply = NULL;
        struct kjson_error kerr;
        json_t *result = NULL;
        json_int_t id;
        int status;

        *ret_result = NULL;
        status = ctl_session_open(o, &s);
        if (status != CTL_EXIT_OK) {
                json_decref(args);
                return status;
        }
        status = session_exchange(s, cmd, args, &line, &id);
        if (status != CTL_EXIT_OK)
                goto out;
        /* the tree takes about 2.5x the text: one chunk, its pages in */
        void *mem;
        size_t memlen;
        if (line.len >= 65536 && line.len < SIZE_MAX / 3 &&
            kjson_arena_reserve(a, 3 * line.len, &mem, &memlen) == 0)
                populate(mem, memlen);
        if (kjson_parse(a, line.data, line.len, &reply, &kerr) == 0 &&
            reply->type == KJSON_OBJECT && kjson_is_int(kjson_get(reply, "v"), 1) &&
            kjson_get(reply, "ok") && kjson_get(reply, "ok")->type == KJSON_TRUE &&
            kjson_is_int(kjson_get(reply, "id"), id) && kjson_get(reply, "result") &&
            kjson_get(reply, "result")->type == KJSON_OBJECT) {
                *ret_result = kjson_get(reply, "result");
                goto out;
        }
        status = session_reply(s, &line, id, &result, NULL);
        if (status == CTL_EXIT_OK) /* not reached: a success parses either way */
                status = bad_reply(&s->c, "unreadable reply");
        json_decref(result);
out:
        kbuf_free(&line);
        ctl_session_close(s);
        return status;
}

int ctl_call(const struct ctl_opts *o, const char *cmd, json_t *args, json_t **result)
{
        struct ctl_session *s;
        int status;

        *result = NULL;
        status = ctl_session_open(o, &s);
        if (status != CTL_EXIT_OK) {
                json_decref(args);
                return status;
        }
        status = ctl_session_call(s, cmd, args, result, NULL);
        ctl_session_close(s);
        return status;
}

int ctl_print_refusal(const struct ctl_opts *o, json_t *error)
{
        return print_refusal(o, error);
}

/* ---- text output helpers ---------------------------------------------- */

static const char *jstr(json_t *obj, const char *key)
{
        return json_string_value(json_object_get(obj, key));
}

static json_int_t jint(json_t *obj, const char *key)
{
        return json_integer_value(json_object_get(obj, key));
}

/* The escaped form of s as ctl_put_safe prints it (malloc'ed), or NULL. */
static char *safe_str(const char *s)
{
        char *buf = NULL;
        size_t len = 0;
        const unsigned char *p = (const unsigned char *)(s ? s : "");

        /* plain ASCII (nearly every cell) is printed as it is */
        while (*p >= 0x20 && *p < 0x7f && *p != '\\')
                p++;
        if (s && *p == '\0')
                return strdup(s);
        FILE *f = open_memstream(&buf, &len);

        if (!f)
                return NULL;
        ctl_put_safe(f, s);
        if (fclose(f) != 0) {
                free(buf);
                return NULL;
        }
        return buf;
}

/* As safe_str, a text of several lines kept as lines (joined by '\n'). */
static char *safe_str_lines(const char *s)
{
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);

        if (!f)
                return NULL;
        ctl_put_safe_lines(f, s, "");
        if (fclose(f) != 0) {
                free(buf);
                return NULL;
        }
        return buf;
}

/* Columns counted in code points (escaped text is ASCII or valid UTF-8). */
static size_t text_width(const char *s)
{
        size_t w = 0;

        for (; s && *s; s++)
                if (((unsigned char)*s & 0xc0) != 0x80)
                        w++;
        return w;
}

static void put_padded(const char *s, size_t width)
{
        size_t w = text_width(s);

        fputs(s, stdout);
        while (w++ < width)
                putchar(' ');
}

/* A table of escaped cells, printed with aligned columns (the last column
 * is not padded). */
struct table {
        size_t ncols, nrows;
        char **cells;           /* nrows * ncols */
        size_t *width;
        /* table_set keeps a pointer to a plain-ASCII cell (nothing to
         * escape) instead of a copy: the caller's texts outlive the table */
        bool borrow;
        unsigned char *owned;   /* nrows * ncols: 1 if cells[i] is ours */
};

static int table_init(struct table *t, size_t ncols, size_t nrows)
{
        t->ncols = ncols;
        t->nrows = nrows;
        t->borrow = false;
        t->cells = calloc(ncols * nrows > 0 ? ncols * nrows : 1, sizeof(*t->cells));
        t->owned = calloc(ncols * nrows > 0 ? ncols * nrows : 1, 1);
        t->width = calloc(ncols, sizeof(*t->width));
        return t->cells && t->owned && t->width ? 0 : -ENOMEM;
}

/* s printed as it is: plain ASCII, nothing ctl_put_safe would escape */
static bool plain_ascii(const char *s, size_t *ret_len)
{
        const unsigned char *p = (const unsigned char *)s;

        while (*p >= 0x20 && *p < 0x7f && *p != '\\')
                p++;
        *ret_len = (size_t)(p - (const unsigned char *)s);
        return *p == '\0';
}

static void table_put(struct table *t, size_t i, char *e, bool owned, size_t width)
{
        size_t col = i % t->ncols;

        if (t->owned[i])
                free(t->cells[i]);
        t->cells[i] = e;
        t->owned[i] = owned;
        if (width > t->width[col])
                t->width[col] = width;
}

static int table_set(struct table *t, size_t row, size_t col, const char *s)
{
        size_t i = row * t->ncols + col, len;

        if (t->borrow && s && plain_ascii(s, &len)) {
                table_put(t, i, (char *)s, false, len);
                return 0;
        }
        char *e = safe_str(s);
        if (!e)
                return -ENOMEM;
        table_put(t, i, e, true, text_width(e));
        return 0;
}

/* The last column may hold several lines (table_set_lines): the lines
 * after the first start under the column. */
static int table_set_lines(struct table *t, size_t row, size_t col, const char *s)
{
        char *e = safe_str_lines(s);
        size_t i = row * t->ncols + col;

        if (!e)
                return -ENOMEM;
        if (t->owned[i])
                free(t->cells[i]);
        t->cells[i] = e;
        t->owned[i] = 1;
        return 0;
}

static void put_last_cell(const char *s, const char *indent, size_t offset)
{
        for (; *s; s++) {
                putchar(*s);
                if (*s != '\n')
                        continue;
                fputs(indent, stdout);
                for (size_t i = 0; i < offset; i++)
                        putchar(' ');
        }
}

static void table_print(const struct table *t, const char *indent)
{
        for (size_t r = 0; r < t->nrows; r++) {
                fputs(indent, stdout);
                size_t last = t->ncols, offset = 0;
                /* no padding after the last non-empty cell */
                while (last > 1 && !(t->cells[r * t->ncols + last - 1] &&
                                     *t->cells[r * t->ncols + last - 1]))
                        last--;
                for (size_t col = 0; col < last; col++) {
                        const char *s = t->cells[r * t->ncols + col];
                        if (col + 1 == last) {
                                put_last_cell(s ? s : "", indent, offset);
                        } else {
                                offset += t->width[col] + 2;
                                put_padded(s ? s : "", t->width[col]);
                                fputs("  ", stdout);
                        }
                }
                putchar('\n');
        }
}

static void table_free(struct table *t)
{
        for (size_t i = 0; t->cells && t->owned && i < t->ncols * t->nrows; i++)
                if (t->owned[i])
                        free(t->cells[i]);
        FREE_ALL(t->cells, t->owned, t->width);
        t->owned = NULL;
        t->cells = NULL;
        t->width = NULL;
}

static const char *plural(json_int_t n)
{
        return n == 1 ? "" : "s";
}

static void put_duration(json_int_t sec)
{
        if (sec < 0)
                sec = 0;
        if (sec >= 86400)
                printf("%lldd %lldh %lldm", (long long)(sec / 86400), (long long)(sec % 86400 / 3600),
                       (long long)(sec % 3600 / 60));
        else if (sec >= 3600)
                printf("%lldh %lldm %llds", (long long)(sec / 3600), (long long)(sec % 3600 / 60),
                       (long long)(sec % 60));
        else if (sec >= 60)
                printf("%lldm %llds", (long long)(sec / 60), (long long)(sec % 60));
        else
                printf("%llds", (long long)sec);
}

/* Common prologue: no positional arguments beyond `want`. */
static int want_args(const char *cmd, int npos, int want, const char *what)
{
        if (npos < want)
                return ctl_usage_error("%s: missing %s", cmd, what);
        if (npos > want)
                return ctl_usage_error("%s: unexpected argument(s)%s%s", cmd,
                                       want ? "; expected only " : "", want ? what : "");
        return 0;
}

/* Run a request and print the result as JSON (--json) or through `text`. */
static int run(const struct ctl_opts *o, const char *cmd, json_t *args, int (*text)(json_t *))
{
        json_t *result;
        int status = ctl_call(o, cmd, args, &result);

        if (status != CTL_EXIT_OK)
                return status;
        if (o->json)
                return ctl_json_print(result);
        status = text(result);
        json_decref(result);
        return status;
}

/* ---- status ----------------------------------------------------------- */

static int text_status(json_t *r)
{
        json_t *by = json_object_get(r, "by_status"), *rec = json_object_get(r, "recovery");
        json_t *v;
        const char *k, *config = jstr(r, "config");
        bool first = true;

        fputs("kairosd ", stdout);
        ctl_put_safe(stdout, jstr(r, "version"));
        printf(" (pid %lld), up ", (long long)jint(r, "pid"));
        put_duration(jint(r, "uptime_sec"));
        printf(", %s\n", json_is_true(json_object_get(r, "stopping")) ? "stopping"
                         : json_is_true(json_object_get(r, "ready"))  ? "ready"
                                                                      : "not ready");
        fputs("State directory: ", stdout);
        ctl_put_safe(stdout, jstr(r, "state_directory"));
        fputs("\nConfiguration:   ", stdout);
        if (config)
                ctl_put_safe(stdout, config);
        else
                fputs("(built-in defaults)", stdout);
        printf("\nMandates:        %lld", (long long)jint(r, "mandates"));
        json_object_foreach(by, k, v) {
                if (jint(by, k) <= 0)
                        continue;
                printf("%s%lld ", first ? " (" : ", ", (long long)json_integer_value(v));
                ctl_put_safe(stdout, k);
                first = false;
        }
        fputs(first ? "\n" : ")\n", stdout);
        fputs("Recovery:        ", stdout);
        ctl_put_safe(stdout, jstr(rec, "summary"));
        printf(" (%lld file%s, %lld torn tail%s repaired, %lld I/O error%s, %lld ms)\n",
               (long long)jint(rec, "files"), plural(jint(rec, "files")),
               (long long)jint(rec, "torn_repaired"), plural(jint(rec, "torn_repaired")),
               (long long)jint(rec, "io_errors"), plural(jint(rec, "io_errors")),
               (long long)jint(rec, "duration_ms"));
        printf("fdatasync calls: %lld\n", (long long)jint(r, "fdatasync_calls"));
        json_t *sc = json_object_get(r, "schedules"), *names = json_object_get(sc, "broken_names");
        if (json_is_object(sc)) {
                printf("Schedules:       %lld", (long long)jint(sc, "total"));
                if (jint(sc, "broken") > 0) {
                        printf(", %lld of them broken (skipped):", (long long)jint(sc, "broken"));
                        size_t i;
                        json_t *nm;
                        json_array_foreach(names, i, nm) {
                                if (!json_is_string(nm))
                                        continue;
                                putchar(' ');
                                ctl_put_safe(stdout, json_string_value(nm));
                        }
                }
                putchar('\n');
        }
        json_t *cl = json_object_get(r, "cluster");
        if (json_is_object(cl)) {
                fputs("Cluster node:    ", stdout);
                ctl_put_safe(stdout, jstr(cl, "node"));
                printf(" (PostgreSQL), lease %lld s, %lld.%lld s left%s, %lld mandate%s held\n",
                       (long long)jint(cl, "lease_sec"), (long long)jint(cl, "lease_left_ms") / 1000,
                       (long long)(jint(cl, "lease_left_ms") % 1000) / 100,
                       json_is_true(json_object_get(cl, "may_act")) ? "" : " (not acting: renewing)",
                       (long long)jint(cl, "held"), plural(jint(cl, "held")));
                if (jstr(cl, "renew_error")) {
                        printf("Renewal:         %lld failure%s: ", (long long)jint(cl, "renew_failures"),
                               plural(jint(cl, "renew_failures")));
                        ctl_put_safe(stdout, jstr(cl, "renew_error"));
                        putchar('\n');
                }
                json_t *skew = json_object_get(cl, "clock_skew");
                if (json_is_object(skew))
                        printf("Clock skew:      %+.1f s off the database's clock%s\n",
                               json_number_value(json_object_get(skew, "offset_sec")),
                               json_is_true(json_object_get(skew, "over_bound"))
                                       ? " (beyond the bound: fix time synchronization)"
                                       : "");
                json_t *nodes = json_object_get(cl, "nodes"), *n;
                size_t i;
                json_array_foreach(nodes, i, n) {
                        fputs(i ? "                 " : "Nodes:           ", stdout);
                        ctl_put_safe(stdout, jstr(n, "node"));
                        printf(" %s, %lld mandate%s",
                               json_is_true(json_object_get(n, "alive")) ? "alive" : "expired",
                               (long long)jint(n, "mandates"), plural(jint(n, "mandates")));
                        if (jint(n, "reviews") > 0)
                                printf(", %lld review%s released", (long long)jint(n, "reviews"),
                                       plural(jint(n, "reviews")));
                        putchar('\n');
                }
                if (json_is_integer(json_object_get(cl, "reviews_waiting")))
                        printf("Reviews:         %lld paused for review in the cluster (released: "
                               "resolve on any node)\n",
                               (long long)jint(cl, "reviews_waiting"));
        }
        return CTL_EXIT_OK;
}

int ctl_cmd_status(const struct ctl_opts *o, int argc, char **argv)
{
        int npos, r;

        r = ctl_parse_options("status", argc, argv, NULL, &npos);
        if (r == 0)
                r = want_args("status", npos, 0, "");
        return r ? r : run(o, "status", NULL, text_status);
}

/* ---- list ------------------------------------------------------------- */

/* "step S: REASON" for a mandate paused for review, else its reason; in
 * cluster mode then "on node N (epoch E)". */
static char *review_text(json_t *m)
{
        const char *step = jstr(m, "review_step"), *reason = jstr(m, "reason");
        const char *node = jstr(m, "node");
        struct kbuf b = KBUF_INIT;
        int r = 0;

        if (step)
                r = kbuf_printf(&b, "step %s%s%s", step, reason ? ": " : "", reason ? reason : "");
        else
                r = kbuf_puts(&b, reason ? reason : "");
        if (r == 0 && node)
                r = kbuf_printf(&b, "%son node %s (epoch %lld)", step || reason ? "; " : "", node,
                                (long long)jint(m, "epoch"));
        if (r < 0) {
                kbuf_free(&b);
                return NULL;
        }
        return kbuf_steal(&b);
}

/* "2026-04-20T12:00:00.123Z" → "2026-04-20 12:00:00" (UTC). */
static void short_time(const char *ts, char out[24])
{
        if (!ts || strlen(ts) < 19) {
                snprintf(out, 24, "-");
                return;
        }
        snprintf(out, 24, "%.10s %.8s", ts, ts + 11);
}

/* A duration in ms as "850ms", "12.3s", "4m05s", "2h03m", "3d04h". */
static void human_duration(json_t *v, char out[32])
{
        if (!json_is_integer(v)) {
                snprintf(out, 32, "-");
                return;
        }
        long long ms = json_integer_value(v), s = ms / 1000;
        if (ms < 1000)
                snprintf(out, 32, "%lldms", ms);
        else if (s < 60)
                snprintf(out, 32, "%lld.%llds", s, (ms % 1000) / 100);
        else if (s < 3600)
                snprintf(out, 32, "%lldm%02llds", s / 60, s % 60);
        else if (s < 86400)
                snprintf(out, 32, "%lldh%02lldm", s / 3600, (s % 3600) / 60);
        else
                snprintf(out, 32, "%lldd%02lldh", s / 86400, (s % 86400) / 3600);
}

static int text_list(json_t *r)
{
        static const char *const head[] = { "ID",    "SCHEDULE", "FIRED AT", "STATUS", "CYCLE",
                                            "STARTED", "ENDED", "DURATION", "REASON" };
        enum { NCOL = sizeof head / sizeof head[0] };
        json_t *ms = json_object_get(r, "mandates"), *m;
        struct table t;
        size_t i;
        int status = CTL_EXIT_OK;

        if (json_array_size(ms) == 0) {
                puts("no mandates");
                return CTL_EXIT_OK;
        }
        if (table_init(&t, NCOL, json_array_size(ms) + 1) < 0)
                goto oom;
        for (size_t c = 0; c < NCOL; c++)
                if (table_set(&t, 0, c, head[c]) < 0)
                        goto oom;
        json_array_foreach(ms, i, m) {
                char cycle[32], started[24], ended[24], dur[32], *review = review_text(m);
                snprintf(cycle, sizeof(cycle), "%lld", (long long)jint(m, "cycle"));
                short_time(jstr(m, "started_at"), started);
                short_time(jstr(m, "ended_at"), ended);
                human_duration(json_object_get(m, "duration_ms"), dur);
                const char *cells[NCOL] = { jstr(m, "id"),   jstr(m, "schedule"),
                                            jstr(m, "fired_at"), jstr(m, "status"),
                                            cycle,           started,
                                            ended,           dur,
                                            review };
                for (size_t c = 0; review && c < NCOL; c++)
                        if ((c + 1 == NCOL ? table_set_lines(&t, i + 1, c, cells[c])
                                           : table_set(&t, i + 1, c, cells[c] ? cells[c] : "-")) <
                            0) {
                                free(review);
                                goto oom;
                        }
                if (!review)
                        goto oom;
                free(review);
        }
        table_print(&t, "");
        long long total = jint(r, "total");
        if (json_is_true(json_object_get(r, "more")))
                printf("(%zu of %lld shown; the next page: --after %s, or --limit 0 for all)\n",
                       json_array_size(ms), total, jstr(r, "next") ? jstr(r, "next") : "?");
        goto out;
oom:
        status = ctl_error(CTL_EXIT_OSERR, "out of memory");
out:
        table_free(&t);
        return status;
}

/* --since: a time YYYY-MM-DDTHH:MM:SSZ, or a duration ago (30min, 2h, 7d). */
static int since_arg(const char *v, char out[PLANNER_FIRED_AT_LEN])
{
        if (planner_parse_fired_at(v, NULL) == 0) {
                snprintf(out, PLANNER_FIRED_AT_LEN, "%s", v);
                return 0;
        }
        char *end;
        errno = 0;
        long long n = strtoll(v, &end, 10);
        if (errno || end == v || n < 0)
                return -EINVAL;
        long long unit;
        if (!strcmp(end, "") || !strcmp(end, "s"))
                unit = 1;
        else if (!strcmp(end, "min") || !strcmp(end, "m"))
                unit = 60;
        else if (!strcmp(end, "h"))
                unit = 3600;
        else if (!strcmp(end, "d"))
                unit = 86400;
        else
                return -EINVAL;
        if (n > (long long)(time(NULL) / unit))
                return -EINVAL;
        return planner_format_fired_at((int64_t)time(NULL) - n * unit, out);
}

int ctl_cmd_list(const struct ctl_opts *o, int argc, char **argv)
{
        const char *status = NULL, *schedule = NULL, *since = NULL, *limit = NULL, *after = NULL;
        const char *state_dir = NULL;
        const struct ctl_option opts[] = {
                { "status", true, &status, NULL },     { "schedule", true, &schedule, NULL },
                { "since", true, &since, NULL },       { "limit", true, &limit, NULL },
                { "after", true, &after, NULL },       { "state-dir", true, &state_dir, NULL },
                { NULL },
        };
        int npos, r;

        r = ctl_parse_options("list", argc, argv, opts, &npos);
        if (r == 0)
                r = want_args("list", npos, 0, "");
        if (r == 0 && state_dir && !*state_dir)
                r = ctl_usage_error("list: --state-dir needs a directory");
        if (r)
                return r;
        json_t *args = json_object();
        long long lim = 1000;
        if (limit) {
                char *end;
                errno = 0;
                lim = strtoll(limit, &end, 10);
                if (errno || end == limit || *end || lim < 0 || lim > 100000) {
                        json_decref(args);
                        return ctl_usage_error("list: --limit must be 0..100000 (0: all)");
                }
        }
        json_object_set_new(args, "limit", json_integer(lim));
        char since_abs[PLANNER_FIRED_AT_LEN];
        if (since) {
                if (since_arg(since, since_abs) < 0) {
                        json_decref(args);
                        return ctl_usage_error("list: --since needs YYYY-MM-DDTHH:MM:SSZ or a "
                                               "duration such as 30min, 2h, 7d");
                }
                json_object_set_new(args, "since", json_string(since_abs));
        }
        if (status)
                json_object_set_new(args, "status", json_string(status));
        if (schedule)
                json_object_set_new(args, "schedule", json_string(schedule));
        if (after)
                json_object_set_new(args, "after", json_string(after));
        if (!state_dir) {
                offline_hint = "list";
                return run(o, "list", args, text_list);
        }
        /* without kairosd: the same document from the state directory */
        json_t *result;
        r = ctl_offline_list(o, state_dir, args, &result);
        json_decref(args);
        if (r != CTL_EXIT_OK)
                return r;
        if (o->json)
                return ctl_json_print(result);
        r = text_list(result);
        json_decref(result);
        return r;
}

/* ---- show ------------------------------------------------------------- */

static void put_field(const char *label, const char *value)
{
        printf("  %-10s ", label);
        ctl_put_safe_lines(stdout, value, "             ");
        putchar('\n');
}

/* REASON / ERROR column of a step: "reason; error: CLASS: MSG". */
static char *step_detail(json_t *s)
{
        const char *reason = jstr(s, "reason"), *cls = jstr(s, "error_class");
        const char *msg = jstr(s, "error_msg"), *carried = jstr(s, "carried_from");
        struct kbuf b = KBUF_INIT;
        int r = kbuf_puts(&b, reason ? reason : "");

        /* retry --from: completed here with the result of that step */
        if (r == 0 && carried)
                r = kbuf_printf(&b, "%scarried from %s", reason ? "; " : "", carried);

        if (r == 0 && (cls || (msg && *msg)))
                r = kbuf_printf(&b, "%serror: %s%s%s", reason ? "; " : "", cls ? cls : "",
                                cls && msg && *msg ? ": " : "", msg ? msg : "");
        if (r < 0) {
                kbuf_free(&b);
                return NULL;
        }
        if (!b.data)
                return strdup("");
        return kbuf_steal(&b);
}

/* RECOVERED column: "operator" for a step an operator resolved (resolve
 * --done/--retry/--abandon), "probe" for one recovery completed on its
 * probe's word (Probe=), else whether recovery completed it. */
static const char *recovered_text(json_t *s, json_t *ops)
{
        const char *step = jstr(s, "step_id");
        json_t *op;
        size_t i;

        json_array_foreach(ops, i, op) {
                const char *action = jstr(op, "action"), *id = jstr(op, "step_id");
                if (step && id && action && strncmp(action, "resolve_", 8) == 0 &&
                    strcmp(id, step) == 0)
                        return "operator";
        }
        if (!json_is_true(json_object_get(s, "recovered")))
                return "no";
        const char *source = jstr(json_object_get(s, "evidence"), "source");
        return source && strcmp(source, "probe") == 0 ? "probe" : "yes";
}

static int print_steps(json_t *steps, json_t *ops)
{
        static const char *const head[] = { "STEP",    "STATUS", "EXECUTIONS", "RECOVERED",
                                            "STARTED", "ENDED",  "DURATION",   "REASON/ERROR" };
        struct table t;
        json_t *s;
        size_t i;
        int r = table_init(&t, 8, json_array_size(steps) + 1);

        for (size_t col = 0; r == 0 && col < 8; col++)
                r = table_set(&t, 0, col, head[col]);
        json_array_foreach(steps, i, s) {
                char execs[32], *detail;
                const char *status = jstr(s, "status");
                if (r < 0)
                        break;
                snprintf(execs, sizeof(execs), "%lld", (long long)jint(s, "executions"));
                char started[24], ended[24], dur[32];
                short_time(jstr(s, "started_at"), started);
                short_time(jstr(s, "ended_at"), ended);
                human_duration(json_object_get(s, "duration_ms"), dur);
                detail = step_detail(s);
                if (!detail || table_set(&t, i + 1, 0, jstr(s, "step_id")) < 0 ||
                    table_set(&t, i + 1, 1, status ? status : "planned") < 0 ||
                    table_set(&t, i + 1, 2, execs) < 0 ||
                    table_set(&t, i + 1, 3, recovered_text(s, ops)) < 0 ||
                    table_set(&t, i + 1, 4, started) < 0 || table_set(&t, i + 1, 5, ended) < 0 ||
                    table_set(&t, i + 1, 6, dur) < 0 || table_set_lines(&t, i + 1, 7, detail) < 0)
                        r = -ENOMEM;
                free(detail);
        }
        if (r == 0)
                table_print(&t, "    ");
        table_free(&t);
        return r;
}

/* Each step's tool calls (from the idempotency store): key, tool, state,
 * attempt, start. */
static void print_tool_calls(json_t *steps)
{
        json_t *s, *c;
        size_t i, k;
        bool head = false;

        json_array_foreach(steps, i, s) {
                json_array_foreach(json_object_get(s, "tool_calls"), k, c) {
                        if (!head)
                                puts("    Tool calls:");
                        head = true;
                        fputs("      ", stdout);
                        ctl_put_safe(stdout, jstr(s, "step_id"));
                        printf(" (attempt %lld): ", (long long)jint(c, "attempt"));
                        ctl_put_safe(stdout, jstr(c, "state"));
                        fputs("  ", stdout);
                        ctl_put_safe(stdout, jstr(c, "key"));
                        fputs("  started ", stdout);
                        ctl_put_safe(stdout, jstr(c, "started"));
                        putchar('\n');
                }
        }
}

/* Each step's failed attempts that were tried again (RetryAttempts=):
 * when each ran, how it failed, and when the next attempt was due. */
static void print_retries(json_t *steps)
{
        json_t *s;
        size_t i;
        bool head = false;

        json_array_foreach(steps, i, s) {
                json_t *rs = json_object_get(s, "retries"), *t;
                size_t k;
                if (!json_is_array(rs))
                        continue;
                json_array_foreach(rs, k, t) {
                        if (!head)
                                puts("    Retried attempts:");
                        head = true;
                        fputs("      ", stdout);
                        ctl_put_safe(stdout, jstr(s, "step_id"));
                        printf(" attempt %lld: started ", jint(t, "attempt"));
                        ctl_put_safe(stdout, jstr(t, "started_at"));
                        fputs(", failed ", stdout);
                        ctl_put_safe(stdout, jstr(t, "failed_at"));
                        fputs(" (", stdout);
                        ctl_put_safe(stdout, jstr(t, "error_class"));
                        if (jstr(t, "error_msg") && *jstr(t, "error_msg")) {
                                fputs(": ", stdout);
                                ctl_put_safe(stdout, jstr(t, "error_msg"));
                        }
                        fputs("); retry due ", stdout);
                        ctl_put_safe(stdout, jstr(t, "due_at"));
                        putchar('\n');
                }
        }
}

/* Each step's interrupted execution (kairosd went down under it, or killed
 * it at shutdown): how long it ran, up to its last record before the
 * restart, and what decided it, on what evidence. */
static void print_interrupted(json_t *steps, json_t *ops)
{
        json_t *s;
        size_t i;
        bool head = false;

        json_array_foreach(steps, i, s) {
                json_t *in = json_object_get(s, "interrupted");
                if (!json_is_object(in))
                        continue;
                json_t *ev = json_object_get(in, "evidence");
                const char *decision = jstr(in, "decision"), *reason = jstr(ev, "reason");
                const char *source = jstr(ev, "source");
                long long n = jint(in, "execution");
                bool killed = json_is_true(json_object_get(ev, "killed_at_shutdown")) ||
                              (reason && strcmp(reason, "killed_at_shutdown") == 0);
                char dur[32];
                human_duration(json_object_get(in, "duration_ms"), dur);
                if (!head)
                        puts("    Interrupted executions:");
                head = true;
                fputs("      ", stdout);
                ctl_put_safe(stdout, jstr(s, "step_id"));
                printf(" execution %lld: ran %s ", n, dur);
                fputs(killed ? "until killed at shutdown (" :
                               "up to the last record before kairosd went down (", stdout);
                ctl_put_safe(stdout, jstr(in, "ended_at"));
                fputs("); ", stdout);
                if (!decision || strcmp(decision, "needs_review") == 0) {
                        fputs(killed && (!reason || strcmp(reason, "killed_at_shutdown") == 0)
                                      ? "waiting for a decision"
                                      : "sent to review",
                              stdout);
                } else {
                        if (strcmp(decision, "pending") == 0) {
                                if (jint(s, "executions") > n)
                                        printf("re-run as execution %lld", n + 1);
                                else
                                        fputs("to be run again", stdout);
                        } else {
                                ctl_put_safe(stdout, decision);
                        }
                        const char *by = strcmp(recovered_text(s, ops), "operator") == 0
                                                 ? "an operator"
                                         : source && strcmp(source, "probe") == 0
                                                 ? "its probe"
                                                 : "recovery";
                        printf(", decided by %s", by);
                }
                if (reason && strcmp(reason, "killed_at_shutdown") != 0) {
                        fputs(": ", stdout);
                        ctl_put_safe(stdout, reason);
                }
                if (jstr(in, "decided_at")) {
                        fputs(" at ", stdout);
                        ctl_put_safe(stdout, jstr(in, "decided_at"));
                }
                putchar('\n');
        }
}

static int text_show(json_t *r)
{
        json_t *plans = json_object_get(r, "plans"), *ops = json_object_get(r, "operators");
        json_t *p, *op;
        char num[32];
        size_t i;

        fputs("Mandate ", stdout);
        ctl_put_safe(stdout, jstr(r, "id"));
        putchar('\n');
        put_field("status:", jstr(r, "status"));
        if (jstr(r, "node")) {
                /* cluster mode: its owner (or last one) */
                printf("  %-10s ", "node:");
                ctl_put_safe(stdout, jstr(r, "node"));
                printf(" (epoch %lld)\n", (long long)jint(r, "epoch"));
        }
        if (jstr(r, "reason"))
                put_field("reason:", jstr(r, "reason"));
        if (jstr(r, "review_step"))
                put_field("review:", jstr(r, "review_step"));
        if (jstr(r, "schedule"))
                put_field("schedule:", jstr(r, "schedule"));
        if (jstr(r, "fired_at"))
                put_field("fired at:", jstr(r, "fired_at"));
        if (jstr(r, "retry_of")) {
                printf("  %-10s ", "retry of:");
                ctl_put_safe(stdout, jstr(r, "retry_of"));
                printf(" (retry %lld)\n", (long long)jint(r, "retry"));
        }
        if (json_array_size(json_object_get(r, "retried_by")) > 0) {
                json_t *id;
                size_t k;
                printf("  %-10s", "retried by:");
                json_array_foreach(json_object_get(r, "retried_by"), k, id) {
                        fputs(k ? ", " : " ", stdout);
                        ctl_put_safe(stdout, json_string_value(id));
                }
                putchar('\n');
        }
        if (jstr(r, "started_at"))
                put_field("started:", jstr(r, "started_at"));
        if (jstr(r, "ended_at"))
                put_field("ended:", jstr(r, "ended_at"));
        if (jstr(r, "plan_id"))
                put_field("plan:", jstr(r, "plan_id"));
        snprintf(num, sizeof(num), "%lld", (long long)jint(r, "cycle"));
        put_field("cycle:", num);
        printf("  %-10s ", "WAL:");
        ctl_put_safe(stdout, jstr(r, "wal_status"));
        printf(", %lld record%s\n", (long long)jint(r, "records"), plural(jint(r, "records")));

        json_array_foreach(plans, i, p) {
                fputs("\nPlan ", stdout);
                ctl_put_safe(stdout, jstr(p, "plan_id"));
                printf(" (cycle %lld): ", (long long)jint(p, "cycle"));
                if (json_is_true(json_object_get(p, "finalized"))) {
                        fputs("finalized ", stdout);
                        ctl_put_safe(stdout, jstr(p, "status"));
                        if (jstr(p, "reason")) {
                                fputs(": ", stdout);
                                ctl_put_safe(stdout, jstr(p, "reason"));
                        }
                } else {
                        fputs("open", stdout);
                }
                putchar('\n');
                if (print_steps(json_object_get(p, "steps"), ops) < 0)
                        return ctl_error(CTL_EXIT_OSERR, "out of memory");
                print_retries(json_object_get(p, "steps"));
                print_interrupted(json_object_get(p, "steps"), ops);
                print_tool_calls(json_object_get(p, "steps"));
        }
        if (json_array_size(ops) == 0)
                return CTL_EXIT_OK;
        puts("\nOperator actions:");
        json_array_foreach(ops, i, op) {
                fputs("  ", stdout);
                ctl_put_safe(stdout, jstr(op, "ts"));
                printf("  uid %lld  ", (long long)jint(op, "uid"));
                ctl_put_safe(stdout, jstr(op, "action"));
                if (jstr(op, "step_id")) {
                        putchar(' ');
                        ctl_put_safe(stdout, jstr(op, "step_id"));
                }
                if (jstr(op, "reason")) {
                        fputs(": ", stdout);
                        ctl_put_safe_lines(stdout, jstr(op, "reason"), "    ");
                }
                putchar('\n');
        }
        return CTL_EXIT_OK;
}

/* `show` of mandate: a handler's result may hold numbers jansson cannot
 * (integers beyond 64 bits): the reply is read with kjson, which keeps
 * every digit; --json prints it as it came, the text gets a jansson copy
 * (ret_text; NULL with --json).  Returns the exit status. */
static int call_show(const struct ctl_opts *o, const char *state_dir, const char *mandate,
                     bool want_json, json_t **ret_text)
{
        struct kjson_arena *a = kjson_arena_new();
        const struct kjson *res = NULL;
        int status;

        *ret_text = NULL;
        if (!a)
                return ctl_error(CTL_EXIT_OSERR, "out of memory");
        if (state_dir) {
                status = ctl_offline_show(o, state_dir, mandate, a, &res);
        } else {
                status = ctl_call_kjson(o, "show", json_pack("{s:s}", "mandate", mandate), a,
                                        &res);
        }
        if (status == CTL_EXIT_OK && want_json)
                status = ctl_kjson_print(res);
        else if (status == CTL_EXIT_OK && !(*ret_text = ctl_kjson_to_json(res)))
                status = ctl_error(CTL_EXIT_OSERR, "out of memory");
        kjson_arena_free(a);
        return status;
}

int ctl_cmd_show(const struct ctl_opts *o, int argc, char **argv)
{
        json_t *res;
        int npos, r;

        const char *state_dir = NULL;
        const struct ctl_option opts[] = { { "state-dir", true, &state_dir, NULL }, { NULL } };
        r = ctl_parse_options("show", argc, argv, opts, &npos);
        if (r == 0)
                r = want_args("show", npos, 1, "MANDATE");
        if (r == 0 && state_dir && !*state_dir)
                r = ctl_usage_error("show: --state-dir needs a directory");
        if (r)
                return r;
        if (!state_dir)
                offline_hint = "show";
        r = call_show(o, state_dir, argv[0], o->json, &res);
        if (r == CTL_EXIT_OK && res)
                r = text_show(res);
        json_decref(res);
        return r;
}

/* ---- retry ------------------------------------------------------------ */

/* "MANDATE retried as NEW (retry N, STATUS)[ from STEP]" */
static int text_retry(json_t *r)
{
        ctl_put_safe(stdout, jstr(r, "retry_of"));
        fputs(" retried as ", stdout);
        ctl_put_safe(stdout, jstr(r, "mandate"));
        printf(" (retry %lld, ", (long long)jint(r, "retry"));
        ctl_put_safe(stdout, jstr(r, "status"));
        fputs(")", stdout);
        if (jstr(r, "from")) {
                fputs(" from ", stdout);
                ctl_put_safe(stdout, jstr(r, "from"));
        }
        putchar('\n');
        return CTL_EXIT_OK;
}

int ctl_cmd_retry(const struct ctl_opts *o, int argc, char **argv)
{
        const char *reason = NULL, *from = NULL;
        const struct ctl_option opts[] = { { "reason", true, &reason, NULL },
                                           { "from", true, &from, NULL },
                                           { NULL } };
        int npos, r;

        r = ctl_parse_options("retry", argc, argv, opts, &npos);
        if (r == 0)
                r = want_args("retry", npos, 1, "MANDATE");
        if (r == 0 && reason && !*reason)
                r = ctl_usage_error("retry: --reason must not be empty");
        if (r == 0 && from && !*from)
                r = ctl_usage_error("retry: --from must not be empty");
        if (r)
                return r;
        json_t *args = json_pack("{s:s}", "mandate", argv[0]);
        if (args && reason)
                json_object_set_new(args, "reason", json_string(reason));
        if (args && from)
                json_object_set_new(args, "from", json_string(from));
        return run(o, "retry", args, text_retry);
}

/* ---- wait ------------------------------------------------------------- */

/* What `wait` makes of a mandate status: -1 not settled yet, else the exit
 * status. */
static int wait_outcome(const char *status)
{
        static const char *const going[] = { "runnable", "running", "idle", "probing", NULL };
        static const char *const operator[] = { "paused", "paused_review", "awaiting_approval",
                                                "quarantined", "wal_io_error", NULL };

        if (!status)
                return -1;
        for (size_t i = 0; going[i]; i++)
                if (strcmp(status, going[i]) == 0)
                        return -1;
        if (strcmp(status, "done") == 0)
                return CTL_EXIT_OK;
        for (size_t i = 0; operator[i]; i++)
                if (strcmp(status, operator[i]) == 0)
                        return CTL_EXIT_OPERATOR;
        return CTL_EXIT_REFUSED; /* failed, terminated, abandoned, cancelled, ... */
}

static void sleep_ms(int64_t ms)
{
        struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000 };

        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
}

static int wait_report(const struct ctl_opts *o, json_t *r, int outcome, bool timed_out)
{
        if (o->json) {
                json_t *out = json_pack("{s:O?, s:O?, s:O?, s:O?, s:b, s:i}", "mandate",
                                        json_object_get(r, "id"), "status",
                                        json_object_get(r, "status"), "reason",
                                        json_object_get(r, "reason"), "review_step",
                                        json_object_get(r, "review_step"), "timed_out",
                                        timed_out, "exit", outcome);
                int st = ctl_json_print(out);
                return st ? st : outcome;
        }
        FILE *f = timed_out ? stderr : stdout;
        if (timed_out)
                fputs("kairosctl: wait: timed out: ", f);
        ctl_put_safe(f, jstr(r, "id"));
        fputs(": ", f);
        ctl_put_safe(f, jstr(r, "status"));
        if (jstr(r, "review_step")) {
                fputs(" (step ", f);
                ctl_put_safe(f, jstr(r, "review_step"));
                fputc(')', f);
        }
        if (jstr(r, "reason")) {
                fputs(": ", f);
                ctl_put_safe(f, jstr(r, "reason"));
        }
        fputc('\n', f);
        return outcome;
}

/* Poll `show` with a growing pause (50 ms doubling to 2 s) until the
 * mandate settles or the deadline (-1: none) passes: for a mandate another
 * node runs, or a kairosd without the wait command. */
static int wait_poll(const struct ctl_opts *o, const char *mandate, int64_t deadline)
{
        int64_t pause_ms = 50;

        for (;;) {
                json_t *res;
                int status = call_show(o, NULL, mandate, false, &res);
                if (status != CTL_EXIT_OK)
                        return status;
                int outcome = wait_outcome(jstr(res, "status"));
                if (outcome >= 0) {
                        status = wait_report(o, res, outcome, false);
                        json_decref(res);
                        return status;
                }
                int64_t now = ctl_mono_ms();
                if (deadline >= 0 && now >= deadline) {
                        status = wait_report(o, res, CTL_EXIT_TIMEOUT, true);
                        json_decref(res);
                        return status;
                }
                json_decref(res);
                sleep_ms(deadline >= 0 && deadline - now < pause_ms ? deadline - now : pause_ms);
                if (pause_ms < 2000)
                        pause_ms = pause_ms * 2 > 2000 ? 2000 : pause_ms * 2;
        }
}

/* One wait request, answered by kairosd when the mandate settles (or the
 * deadline passes: then one show says where it is). */
int ctl_cmd_wait(const struct ctl_opts *o, int argc, char **argv)
{
        const char *timeout = NULL;
        const struct ctl_option opts[] = { { "timeout", true, &timeout, NULL }, { NULL } };
        int64_t deadline = -1;
        int npos, r;

        r = ctl_parse_options("wait", argc, argv, opts, &npos);
        if (r == 0)
                r = want_args("wait", npos, 1, "MANDATE");
        if (r)
                return r;
        if (timeout) {
                char *end;
                errno = 0;
                double sec = strtod(timeout, &end);
                if (errno != 0 || end == timeout || *end != '\0' || !isfinite(sec) || sec < 0 ||
                    sec > 31536000) {
                        char *t = safe_str(timeout);
                        r = ctl_usage_error("wait: --timeout '%s' is not a number of seconds "
                                            "(0..31536000)",
                                            t ? t : "?");
                        free(t);
                        return r;
                }
                deadline = ctl_mono_ms() + (int64_t)(sec * 1000);
        }
        for (;;) {
                int64_t left = deadline >= 0 ? deadline - ctl_mono_ms() : INT32_MAX;
                if (left <= 0)
                        return wait_poll(o, argv[0], deadline); /* one show */
                struct ctl_session *s;
                int status = ctl_session_open(o, &s);
                if (status != CTL_EXIT_OK)
                        return status;
                s->c.timeout_ms = left > INT32_MAX ? INT32_MAX : (int)left;
                s->c.quiet_timeout = true;
                json_t *res = NULL, *err = NULL;
                status = ctl_session_call(s, "wait", json_pack("{s:s}", "mandate", argv[0]), &res,
                                          &err);
                ctl_session_close(s);
                if (status == CTL_EXIT_TIMEOUT)
                        continue; /* the deadline passed (or 24 days without one) */
                if (status == CTL_EXIT_OK) {
                        int outcome = wait_outcome(jstr(res, "status"));
                        status = wait_report(o, res, outcome >= 0 ? outcome : CTL_EXIT_REFUSED,
                                             false);
                        json_decref(res);
                        return status;
                }
                if (status != CTL_EXIT_REFUSED || !err)
                        return status;
                const char *code = jstr(err, "code");
                if (code && (strcmp(code, "poll") == 0 || strcmp(code, "unknown_command") == 0)) {
                        json_decref(err);
                        return wait_poll(o, argv[0], deadline);
                }
                status = print_refusal(o, err);
                /* kairosd stopped first: as when it cannot be reached */
                if (code && strcmp(code, "shutting_down") == 0)
                        status = CTL_EXIT_UNREACHABLE;
                json_decref(err);
                return status;
        }
}

/* ---- pause / resume / resolve ----------------------------------------- */

static int text_mandate_status(json_t *r)
{
        ctl_put_safe(stdout, jstr(r, "mandate"));
        if (jstr(r, "step")) {
                fputs(": step ", stdout);
                ctl_put_safe(stdout, jstr(r, "step"));
                putchar(' ');
                ctl_put_safe(stdout, jstr(r, "action"));
        }
        fputs(": ", stdout);
        ctl_put_safe(stdout, jstr(r, "status"));
        putchar('\n');
        /* resolve --retry|--done: the step's interrupted tool calls */
        for (int i = 0; i < 2; i++) {
                const char *name = i ? "tool_calls_completed" : "tool_calls_released";
                json_t *keys = json_object_get(r, name), *k;
                size_t n;
                json_array_foreach(keys, n, k) {
                        fputs(i ? "  completed tool call " : "  released tool call ", stdout);
                        ctl_put_safe(stdout, json_string_value(k));
                        putchar('\n');
                }
        }
        return CTL_EXIT_OK;
}

/* "schedule NAME paused" / "schedule NAME resumed" */
static int text_schedule_paused(json_t *r)
{
        fputs("schedule ", stdout);
        ctl_put_safe(stdout, jstr(r, "schedule"));
        puts(json_is_true(json_object_get(r, "paused")) ? " paused" : " resumed");
        return CTL_EXIT_OK;
}

static int check_schedule_name(const char *cmd, const char *name)
{
        char *safe;
        int r;

        if (planner_valid_name(name))
                return 0;
        safe = safe_str(name);
        r = ctl_usage_error("%s: '%s' is not a schedule name ([A-Za-z0-9_-]{1,64})", cmd,
                            safe ? safe : "?");
        free(safe);
        return r;
}

int ctl_cmd_pause(const struct ctl_opts *o, int argc, char **argv)
{
        const char *reason = NULL, *schedule = NULL;
        const struct ctl_option opts[] = { { "reason", true, &reason, NULL },
                                           { "schedule", true, &schedule, NULL },
                                           { NULL } };
        int npos, r;

        r = ctl_parse_options("pause", argc, argv, opts, &npos);
        if (r == 0)
                r = schedule ? want_args("pause --schedule", npos, 0, "")
                             : want_args("pause", npos, 1, "MANDATE");
        if (r == 0 && reason && !*reason)
                r = ctl_usage_error("pause: --reason must not be empty");
        if (r == 0 && schedule)
                r = check_schedule_name("pause", schedule);
        if (r)
                return r;
        if (schedule)
                return run(o, "pause",
                           reason ? json_pack("{s:s, s:s}", "schedule", schedule, "reason",
                                              reason)
                                  : json_pack("{s:s}", "schedule", schedule),
                           text_schedule_paused);
        return run(o, "pause",
                   reason ? json_pack("{s:s, s:s}", "mandate", argv[0], "reason", reason)
                          : json_pack("{s:s}", "mandate", argv[0]),
                   text_mandate_status);
}

int ctl_cmd_resume(const struct ctl_opts *o, int argc, char **argv)
{
        const char *schedule = NULL;
        const struct ctl_option opts[] = { { "schedule", true, &schedule, NULL }, { NULL } };
        int npos, r;

        r = ctl_parse_options("resume", argc, argv, opts, &npos);
        if (r == 0)
                r = schedule ? want_args("resume --schedule", npos, 0, "")
                             : want_args("resume", npos, 1, "MANDATE");
        if (r == 0 && schedule)
                r = check_schedule_name("resume", schedule);
        if (r)
                return r;
        if (schedule)
                return run(o, "resume", json_pack("{s:s}", "schedule", schedule),
                           text_schedule_paused);
        return run(o, "resume", json_pack("{s:s}", "mandate", argv[0]), text_mandate_status);
}

int ctl_cmd_resolve(const struct ctl_opts *o, int argc, char **argv)
{
        const char *reason = NULL, *action = NULL;
        bool done = false, retry = false, abandon = false;
        const struct ctl_option opts[] = {
                { "done", false, NULL, &done },       { "retry", false, NULL, &retry },
                { "abandon", false, NULL, &abandon }, { "reason", true, &reason, NULL },
                { NULL },
        };
        int npos, r;

        r = ctl_parse_options("resolve", argc, argv, opts, &npos);
        if (r == 0)
                r = want_args("resolve", npos, 2, "MANDATE STEP");
        if (r)
                return r;
        if (done + retry + abandon != 1)
                return ctl_usage_error("resolve: give exactly one of --done, --retry, --abandon");
        action = done ? "done" : retry ? "retry" : "abandon";
        if (!reason || !*reason)
                return ctl_usage_error("resolve: --reason TEXT is required (why this is safe)");
        return run(o, "resolve",
                   json_pack("{s:s, s:s, s:s, s:s}", "mandate", argv[0], "step", argv[1],
                             "action", action, "reason", reason),
                   text_mandate_status);
}

/* ---- fire / approve ---------------------------------------------------- */

/* "fired S at T: mandate M (STATUS)", or for a (schedule, fired_at) fired
 * before "S at T: already fired (mandate M, STATUS)"; in cluster mode, for a
 * tick another node claimed, "S at T: already fired (mandate M, claimed by
 * node N)". */
static int text_fire(json_t *r)
{
        bool fired = json_is_true(json_object_get(r, "fired"));

        if (fired)
                fputs("fired ", stdout);
        ctl_put_safe(stdout, jstr(r, "schedule"));
        fputs(" at ", stdout);
        ctl_put_safe(stdout, jstr(r, "fired_at"));
        fputs(fired ? ": mandate " : ": already fired (mandate ", stdout);
        ctl_put_safe(stdout, jstr(r, "mandate"));
        fputs(fired ? " (" : ", ", stdout);
        ctl_put_safe(stdout, jstr(r, "status"));
        if (!fired && jstr(r, "node")) {
                fputs(" by node ", stdout);
                ctl_put_safe(stdout, jstr(r, "node"));
        }
        fputs(")\n", stdout);
        return CTL_EXIT_OK;
}

int ctl_cmd_fire(const struct ctl_opts *o, int argc, char **argv)
{
        const char *at = NULL;
        const struct ctl_option opts[] = { { "at", true, &at, NULL }, { NULL } };
        int npos, r;

        r = ctl_parse_options("fire", argc, argv, opts, &npos);
        if (r == 0)
                r = want_args("fire", npos, 1, "SCHEDULE");
        if (r)
                return r;
        if (!planner_valid_name(argv[0])) {
                char *name = safe_str(argv[0]);
                r = ctl_usage_error("fire: '%s' is not a schedule name ([A-Za-z0-9_-]{1,64})",
                                    name ? name : "?");
                free(name);
                return r;
        }
        if (at && planner_parse_fired_at(at, NULL) < 0) {
                char *t = safe_str(at);
                r = ctl_usage_error("fire: --at '%s' is not a UTC time YYYY-MM-DDTHH:MM:SSZ",
                                    t ? t : "?");
                free(t);
                return r;
        }
        return run(o, "fire",
                   at ? json_pack("{s:s, s:s}", "schedule", argv[0], "at", at)
                      : json_pack("{s:s}", "schedule", argv[0]),
                   text_fire);
}

/* One line per tick: the dry run's ticks, or each tick's outcome. */
static int text_backfill(json_t *r)
{
        json_t *ticks = json_object_get(r, "ticks"), *t;
        size_t i;
        bool dry = json_is_true(json_object_get(r, "dry_run"));
        int rc = CTL_EXIT_OK;

        json_array_foreach(ticks, i, t) {
                ctl_put_safe(stdout, jstr(t, "fired_at"));
                if (dry) {
                        fputs(": would fire\n", stdout);
                } else if (jstr(t, "error")) {
                        fputs(": not fired: ", stdout);
                        ctl_put_safe(stdout, jstr(t, "message"));
                        fputs(" (", stdout);
                        ctl_put_safe(stdout, jstr(t, "error"));
                        fputs(")\n", stdout);
                        rc = CTL_EXIT_REFUSED;
                } else {
                        bool fired = json_is_true(json_object_get(t, "fired"));
                        fputs(fired ? ": fired, mandate " : ": already fired, mandate ", stdout);
                        ctl_put_safe(stdout, jstr(t, "mandate"));
                        fputs(" (", stdout);
                        ctl_put_safe(stdout, jstr(t, "status"));
                        fputs(")\n", stdout);
                }
        }
        fputs("schedule ", stdout);
        ctl_put_safe(stdout, jstr(r, "schedule"));
        if (dry)
                printf(": %zu tick%s to fire (dry run)\n", json_array_size(ticks),
                       json_array_size(ticks) == 1 ? "" : "s");
        else
                printf(": %lld fired, %lld already fired, %lld not fired\n",
                       (long long)jint(r, "fired"), (long long)jint(r, "existing"),
                       (long long)(jint(r, "failed") + jint(r, "not_fired")));
        if (!dry && jint(r, "not_fired") > 0)
                rc = CTL_EXIT_REFUSED;
        return rc;
}

int ctl_cmd_backfill(const struct ctl_opts *o, int argc, char **argv)
{
        const char *from = NULL, *to = NULL, *max = NULL;
        bool dry = false;
        const struct ctl_option opts[] = { { "from", true, &from, NULL },
                                           { "to", true, &to, NULL },
                                           { "max", true, &max, NULL },
                                           { "dry-run", false, NULL, &dry },
                                           { NULL } };
        int npos, r;

        r = ctl_parse_options("backfill", argc, argv, opts, &npos);
        if (r == 0)
                r = want_args("backfill", npos, 1, "SCHEDULE");
        if (r)
                return r;
        if (!planner_valid_name(argv[0])) {
                char *name = safe_str(argv[0]);
                r = ctl_usage_error("backfill: '%s' is not a schedule name ([A-Za-z0-9_-]{1,64})",
                                    name ? name : "?");
                free(name);
                return r;
        }
        const char *const which[] = { "from", "to" };
        const char *const val[] = { from, to };
        int64_t t[2];
        for (int i = 0; i < 2; i++) {
                if (!val[i])
                        return ctl_usage_error("backfill: --%s TIME is required", which[i]);
                if (planner_parse_fired_at(val[i], &t[i]) < 0) {
                        char *s = safe_str(val[i]);
                        r = ctl_usage_error("backfill: --%s '%s' is not a UTC time "
                                            "YYYY-MM-DDTHH:MM:SSZ",
                                            which[i], s ? s : "?");
                        free(s);
                        return r;
                }
        }
        if (t[0] > t[1])
                return ctl_usage_error("backfill: --from %s is after --to %s", from, to);
        long long n = 0;
        if (max) {
                char *end;
                errno = 0;
                n = strtoll(max, &end, 10);
                if (errno || end == max || *end || n < 1 || n > 10000) {
                        char *s = safe_str(max);
                        r = ctl_usage_error("backfill: --max '%s' is not an integer 1..10000",
                                            s ? s : "?");
                        free(s);
                        return r;
                }
        }
        json_t *args = json_pack("{s:s, s:s, s:s, s:b}", "schedule", argv[0], "from", from, "to",
                                 to, "dry_run", dry);
        if (args && max)
                json_object_set_new(args, "max", json_integer(n));
        return run(o, "backfill", args, text_backfill);
}

/* "M: approved (STATUS)" */
static int text_approve(json_t *r)
{
        ctl_put_safe(stdout, jstr(r, "mandate"));
        fputs(": approved (", stdout);
        ctl_put_safe(stdout, jstr(r, "status"));
        fputs(")\n", stdout);
        return CTL_EXIT_OK;
}

int ctl_cmd_approve(const struct ctl_opts *o, int argc, char **argv)
{
        const char *reason = NULL;
        const struct ctl_option opts[] = { { "reason", true, &reason, NULL }, { NULL } };
        int npos, r;

        r = ctl_parse_options("approve", argc, argv, opts, &npos);
        if (r == 0)
                r = want_args("approve", npos, 1, "MANDATE");
        if (r == 0 && reason && !*reason)
                r = ctl_usage_error("approve: --reason must not be empty");
        if (r)
                return r;
        return run(o, "approve",
                   reason ? json_pack("{s:s, s:s}", "mandate", argv[0], "reason", reason)
                          : json_pack("{s:s}", "mandate", argv[0]),
                   text_approve);
}

/* ---- cancel ----------------------------------------------------------- */

static int text_cancel(json_t *r)
{
        ctl_put_safe(stdout, jstr(r, "mandate"));
        fputs(": cancelled", stdout);
        if (json_is_string(json_object_get(r, "interrupted"))) {
                fputs(" (its handler of step ", stdout);
                ctl_put_safe(stdout, jstr(r, "interrupted"));
                fputs(" was stopped)", stdout);
        }
        fputc('\n', stdout);
        return CTL_EXIT_OK;
}

int ctl_cmd_cancel(const struct ctl_opts *o, int argc, char **argv)
{
        const char *reason = NULL;
        const struct ctl_option opts[] = { { "reason", true, &reason, NULL }, { NULL } };
        int npos, r;

        r = ctl_parse_options("cancel", argc, argv, opts, &npos);
        if (r == 0)
                r = want_args("cancel", npos, 1, "MANDATE");
        if (r == 0 && (!reason || !*reason))
                r = ctl_usage_error("cancel: --reason T is required");
        if (r)
                return r;
        return run(o, "cancel", json_pack("{s:s, s:s}", "mandate", argv[0], "reason", reason),
                   text_cancel);
}

/* ---- reload ----------------------------------------------------------- */

static int text_reload(json_t *r)
{
        printf("configuration reloaded: %lld schedule%s", (long long)jint(r, "schedules"),
               plural(jint(r, "schedules")));
        if (jint(r, "broken") > 0)
                printf(", %lld broken (skipped; see kairosctl schedules)",
                       (long long)jint(r, "broken"));
        putchar('\n');
        return CTL_EXIT_OK;
}

int ctl_cmd_reload(const struct ctl_opts *o, int argc, char **argv)
{
        int npos, r;

        r = ctl_parse_options("reload", argc, argv, NULL, &npos);
        if (r == 0)
                r = want_args("reload", npos, 0, "");
        return r ? r : run(o, "reload", NULL, text_reload);
}

/* ---- schedules ---------------------------------------------------------- */

/* `schedules` reads its reply with kjson: with 10,000 schedules it is 2 MB. */
static bool kis(const struct kjson *obj, const char *key, enum kjson_type t)
{
        const struct kjson *v = kjson_get(obj, key);
        return v && v->type == t;
}

static const char *schedule_state(const struct kjson *s)
{
        const char *state = kjson_get_str(s, "state");
        if (state && strcmp(state, "broken") == 0)
                return "broken";
        if (kis(s, "enabled", KJSON_FALSE))
                return "disabled";
        if (kis(s, "paused", KJSON_TRUE))
                return "paused";
        return "enabled";
}

static int text_schedules(const struct kjson *r)
{
        static const char *const head[] = { "NAME",   "CRON",   "ZONE",        "NEXT",
                                            "LAST",   "POLICY", "CONCURRENCY", "STATE" };
        const struct kjson *list = kjson_get(r, "schedules");
        size_t n = list && list->type == KJSON_ARRAY ? list->u.arr.n : 0;
        struct table t;
        int rc = 0;

        if (n == 0) {
                puts("no schedules");
                return CTL_EXIT_OK;
        }
        rc = table_init(&t, 8, n + 1);
        t.borrow = true; /* the cells live in the arena or are literals */
        for (size_t col = 0; rc == 0 && col < 8; col++)
                rc = table_set(&t, 0, col, head[col]);
        for (size_t i = 0; rc == 0 && i < n; i++) {
                const struct kjson *s = list->u.arr.items[i];
                const char *next = kjson_get_str(s, "next_fire_at");
                const char *last = kjson_get_str(s, "last_fire_at");
                const char *cells[] = { kjson_get_str(s, "name"),  kjson_get_str(s, "cron"),
                                        kjson_get_str(s, "time_zone"), next ? next : "-",
                                        last ? last : "-", kjson_get_str(s, "missed_policy"),
                                        kjson_get_str(s, "concurrency"), schedule_state(s) };
                for (size_t col = 0; rc == 0 && col < 8; col++)
                        rc = table_set(&t, i + 1, col, cells[col] ? cells[col] : "-");
        }
        if (rc == 0)
                table_print(&t, "");
        table_free(&t);
        /* each broken schedule's first error, below the table */
        for (size_t i = 0; rc == 0 && i < n; i++) {
                const struct kjson *s = list->u.arr.items[i];
                const char *err = kjson_get_str(s, "error");
                if (strcmp(schedule_state(s), "broken") != 0)
                        continue;
                /* (NAME: broken: ... read "broken: broken:" for a schedule
                 * named broken) */
                fputs("schedule ", stdout);
                ctl_put_safe(stdout, kjson_get_str(s, "name"));
                fputs(" is broken: ", stdout);
                ctl_put_safe(stdout, err ? err : "?");
                putchar('\n');
        }
        /* the last missed period with ticks not fired, and why */
        for (size_t i = 0; rc == 0 && i < n; i++) {
                const struct kjson *s = list->u.arr.items[i];
                const struct kjson *sk = kjson_get(s, "skipped");
                const struct kjson *cnt = sk ? kjson_get(sk, "count") : NULL;
                if (!cnt || cnt->type != KJSON_NUMBER)
                        continue;
                const char *first = kjson_get_str(sk, "first"), *last = kjson_get_str(sk, "last");
                const char *why = kjson_get_str(sk, "reason");
                fputs("schedule ", stdout);
                ctl_put_safe(stdout, kjson_get_str(s, "name"));
                const char *num = cnt->u.num.text;
                printf(" skipped %s%s missed tick%s, %s to %s: ",
                       kis(sk, "more", KJSON_TRUE) ? "more than " : "", num,
                       strcmp(num, "1") == 0 ? "" : "s", first ? first : "-", last ? last : "-");
                ctl_put_safe(stdout, why ? why : "?");
                putchar('\n');
        }
        /* ticks the daemon refused to fire (e.g. Concurrency=reject) */
        for (size_t i = 0; rc == 0 && i < n; i++) {
                const struct kjson *s = list->u.arr.items[i];
                const struct kjson *rf = kjson_get(s, "refused");
                const struct kjson *cnt = rf ? kjson_get(rf, "count") : NULL;
                if (!cnt || cnt->type != KJSON_NUMBER)
                        continue;
                const char *num = cnt->u.num.text, *last = kjson_get_str(rf, "last");
                const char *why = kjson_get_str(rf, "reason");
                fputs("schedule ", stdout);
                ctl_put_safe(stdout, kjson_get_str(s, "name"));
                printf(" refused %s tick%s since kairosd started, the last %s: ", num,
                       strcmp(num, "1") == 0 ? "" : "s", last ? last : "-");
                ctl_put_safe(stdout, why ? why : "?");
                putchar('\n');
        }
        return rc == 0 ? CTL_EXIT_OK : ctl_error(CTL_EXIT_OSERR, "out of memory");
}

int ctl_cmd_schedules(const struct ctl_opts *o, int argc, char **argv)
{
        int npos, r;

        r = ctl_parse_options("schedules", argc, argv, NULL, &npos);
        if (r == 0)
                r = want_args("schedules", npos, 0, "");
        if (r)
                return r;
        struct kjson_arena *a = kjson_arena_new();
        const struct kjson *res;
        if (!a)
                return ctl_error(CTL_EXIT_OSERR, "out of memory");
        r = ctl_call_kjson(o, "schedules", NULL, a, &res);
        if (r == CTL_EXIT_OK)
                r = o->json ? ctl_kjson_print(res) : text_schedules(res);
        kjson_arena_free(a);
        return r;
}

/* One line per time: UTC, and for a schedule in another zone its local time. */
static int text_schedules_next(json_t *r)
{
        const char *zone = jstr(r, "time_zone");
        struct cron_tz *tz = NULL;
        json_t *t;
        size_t i;

        if (zone && strcmp(zone, "UTC") != 0 && cron_tz_load(zone, &tz) < 0)
                tz = NULL; /* the daemon knows it; this host may not: UTC only */
        json_array_foreach(json_object_get(r, "next"), i, t) {
                int64_t when;
                char local[64], offset[7];
                ctl_put_safe(stdout, json_string_value(t));
                if (tz && json_string_value(t) &&
                    planner_parse_fired_at(json_string_value(t), &when) == 0 &&
                    ctl_format_local(tz, when, local, sizeof local, offset) == 0)
                        printf("  %s", local);
                putchar('\n');
        }
        if (json_array_size(json_object_get(r, "next")) == 0) {
                fputs("kairosctl: schedule ", stderr);
                ctl_put_safe(stderr, jstr(r, "name"));
                fputs(" has no fire time ahead\n", stderr);
        }
        cron_tz_free(tz);
        return CTL_EXIT_OK;
}

int ctl_cmd_schedules_next(const struct ctl_opts *o, int argc, char **argv)
{
        int npos, count = 5, r;
        bool given;

        r = ctl_take_count("schedules next", &argc, argv, &count, &given);
        if (r == 0)
                r = ctl_parse_options("schedules next", argc, argv, NULL, &npos);
        if (r == 0)
                r = want_args("schedules next", npos, 1, "NAME");
        if (r == 0)
                r = check_schedule_name("schedules next", argv[0]);
        if (r)
                return r;
        return run(o, "schedules", json_pack("{s:s, s:i}", "next", argv[0], "n", count),
                   text_schedules_next);
}

/* ---- metrics ------------------------------------------------------------ */

/* The text as kairosd rendered it, byte for byte. */
static int text_metrics(json_t *r)
{
        const char *t = jstr(r, "text");
        if (t)
                fputs(t, stdout);
        return CTL_EXIT_OK;
}

int ctl_cmd_metrics(const struct ctl_opts *o, int argc, char **argv)
{
        bool om = false;
        const struct ctl_option opts[] = { { "openmetrics", false, NULL, &om }, { NULL } };
        int npos, r;

        r = ctl_parse_options("metrics", argc, argv, opts, &npos);
        if (r == 0)
                r = want_args("metrics", npos, 0, "");
        return r ? r
                 : run(o, "metrics",
                       json_pack("{s:s}", "format", om ? "openmetrics" : "prometheus"),
                       text_metrics);
}
