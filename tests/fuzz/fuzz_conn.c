/* SPDX-License-Identifier: MIT */
/* Fuzz target: the live control connection.  The real control module
 * (src/daemon/control.c) runs on a libuv loop inside the fuzz process; its
 * peers are socketpairs the input drives: requests written in pieces split
 * anywhere, pipelined, oversize lines, replies read slowly or never,
 * half-closes and disconnects in the middle of a request, several
 * connections at once under small connection limits.  The command handler
 * is a stub that answers at once, later ("slow"), with a big reply ("big"),
 * or keeps a claim on the connection ("claim").
 *
 * Checked: every reply line is a JSON object with "v":1 and a boolean "ok",
 * an error has a string code and message; no reply line is longer than the
 * biggest reply the stub makes; every claim is handed back when its
 * connection goes; nothing leaks (ASan) and the loop ends with no handle
 * left once the server is stopped. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "commands.h"
#include "control.h"
#include "kairos/kbuf.h"
#include "log.h"
#include "metrics.h"

#define MAX_CONNS 48   /* more than CONTROL_MAX_REFUSING refused at once */
#define MAX_PENDING 512
#define MAX_CLAIMS 256
#define BIG_MAX (256 * 1024)

/* ---- what the control module needs from the rest of kairosd ---- */

void log_event_at(const char *file, int line, const char *func, int priority,
                  const char *message_id, const struct log_field *fields, size_t n,
                  const char *fmt, ...)
{
        (void)file;
        (void)line;
        (void)func;
        (void)priority;
        (void)message_id;
        (void)fields;
        (void)n;
        (void)fmt;
}

uint64_t now_ms_monotonic(void)
{
        return 0;
}

bool commands_known(const char *cmd)
{
        return cmd && strcmp(cmd, "status") == 0;
}

void metrics_control(struct metrics *mx, const char *command, const char *code)
{
        (void)mx;
        (void)command;
        (void)code;
}

static struct control_request *pending[MAX_PENDING];
static size_t npending;
static struct control_claim *claims[MAX_CLAIMS];
static size_t nclaims;

static void claim_forget(struct control_claim *cc)
{
        for (size_t i = 0; i < nclaims; i++)
                if (claims[i] == cc) {
                        claims[i] = claims[--nclaims];
                        break;
                }
        free(cc);
}

static void claim_closed(struct control_claim *cc)
{
        if (cc->client)
                abort();   /* detached before on_close */
        claim_forget(cc);
}

void commands_dispatch(struct control_request *req)
{
        const char *cmd = req->cmd;
        if (strcmp(cmd, "slow") == 0 && npending < MAX_PENDING) {
                pending[npending++] = req;
                return;
        }
        if (strcmp(cmd, "big") == 0) {
                json_t *nv = json_object_get(req->args, "n");
                size_t n = json_is_integer(nv) ? (size_t)json_integer_value(nv) % BIG_MAX : 1000;
                char *s = malloc(n + 1);
                if (!s)
                        abort();
                memset(s, 'b', n);
                s[n] = '\0';
                control_reply_ok(req, json_pack("{s:s}", "big", s));
                free(s);
                return;
        }
        if (strcmp(cmd, "claim") == 0 && nclaims < MAX_CLAIMS) {
                struct control_claim *cc = calloc(1, sizeof(*cc));
                if (!cc)
                        abort();
                if (control_claim_attach(req, cc, claim_closed))
                        claims[nclaims++] = cc;
                else
                        free(cc);
                control_reply_ok(req, NULL);
                return;
        }
        if (strcmp(cmd, "unclaim") == 0) {
                for (size_t i = 0; i < nclaims; i++)
                        if (control_claim_owned_by(claims[i], req)) {
                                struct control_claim *cc = claims[i];
                                control_claim_release(cc);
                                claim_forget(cc);
                                break;
                        }
                control_reply_ok(req, NULL);
                return;
        }
        if (strcmp(cmd, "arg") == 0) {
                bool failed;
                const char *x = control_arg_string(req, "x", true, &failed);
                if (failed)
                        return;
                control_reply_ok(req, json_pack("{s:s}", "x", x));
                return;
        }
        if (strcmp(cmd, "err") == 0) {
                control_reply_error_detail(req, "some_error", json_pack("{s:i}", "n", 1),
                                           "failed: %s", cmd);
                return;
        }
        control_reply_ok(req, json_pack("{s:s}", "cmd", cmd));
}

/* ---- the peers ---- */

struct peer {
        int fd;            /* -1: none */
        struct kbuf in;    /* reply bytes read, not yet a whole line */
};

static uv_loop_t loop;
static struct daemon d;
static struct config cfg;
static char sock_path[256];
static struct peer peers[MAX_CONNS];

static void check_reply(const char *line, size_t len)
{
        json_error_t jerr;
        json_t *r = json_loadb(line, len, 0, &jerr);
        if (!r || !json_is_object(r))
                abort();
        json_t *v = json_object_get(r, "v"), *ok = json_object_get(r, "ok");
        if (!json_is_integer(v) || json_integer_value(v) != 1 || !json_is_boolean(ok))
                abort();
        json_t *id = json_object_get(r, "id");
        if (!json_is_integer(id) && !json_is_null(id))
                abort();
        if (json_is_false(ok)) {
                json_t *e = json_object_get(r, "error");
                if (!json_is_string(json_object_get(e, "code")) ||
                    !json_is_string(json_object_get(e, "message")))
                        abort();
        } else if (!json_is_object(json_object_get(r, "result"))) {
                abort();
        }
        json_decref(r);
}

static void peer_read(struct peer *p, size_t max)
{
        char buf[16384];
        while (p->fd >= 0 && max > 0) {
                ssize_t n = recv(p->fd, buf, max < sizeof buf ? max : sizeof buf, 0);
                if (n <= 0)
                        return;
                max -= (size_t)n;
                if (kbuf_append(&p->in, buf, (size_t)n) < 0)
                        abort();
                char *nl;
                while (p->in.len > 0 && (nl = memchr(p->in.data, '\n', p->in.len))) {
                        size_t len = (size_t)(nl - p->in.data);
                        check_reply(p->in.data, len);
                        memmove(p->in.data, nl + 1, p->in.len - len - 1);
                        p->in.len -= len + 1;
                }
                if (p->in.len > BIG_MAX + 4096)
                        abort();   /* a reply line longer than any the stub makes */
        }
}

static void peer_close(struct peer *p)
{
        if (p->fd >= 0)
                close(p->fd);
        p->fd = -1;
        kbuf_free(&p->in);
}

static void peer_open(struct peer *p)
{
        int sv[2];
        if (p->fd >= 0)
                return;
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
                abort();
        if (control_adopt_fd(&d, sv[0]) < 0)
                abort();
        p->fd = sv[1];
}

static void peer_write(struct peer *p, const void *data, size_t len)
{
        if (p->fd >= 0 && len > 0)
                (void)send(p->fd, data, len, MSG_NOSIGNAL);
}

static void run_loop(unsigned n)
{
        while (n--)
                uv_run(&loop, UV_RUN_NOWAIT);
}

/* ---- the input ---- */

struct input {
        const uint8_t *p;
        size_t n;
};

static uint8_t next_byte(struct input *in)
{
        if (in->n == 0)
                return 0;
        in->n--;
        return *in->p++;
}

static const char *const canned[] = {
        "{\"v\":1,\"id\":1,\"cmd\":\"status\"}\n",
        "{\"v\":1,\"id\":2,\"cmd\":\"slow\"}\n",
        "{\"v\":1,\"id\":3,\"cmd\":\"big\",\"args\":{\"n\":8000}}\n",
        "{\"v\":1,\"id\":4,\"cmd\":\"claim\"}\n",
        "{\"v\":1,\"id\":5,\"cmd\":\"unclaim\"}\n",
        "{\"v\":1,\"id\":6,\"cmd\":\"arg\",\"args\":{\"x\":\"y\"}}\n",
        "{\"v\":1,\"id\":7,\"cmd\":\"arg\",\"args\":{\"x\":7}}\n",
        "{\"v\":1,\"id\":8,\"cmd\":\"err\"}\n",
        "{\"v\":2,\"id\":9,\"cmd\":\"status\"}\n",
        "not json\n",
        "\n\n",
        "{\"v\":1,\"id\":10,\"cmd\":\"big\",\"args\":{\"n\":4000}}\n",
};
#define NCANNED (sizeof canned / sizeof canned[0])

static void setup(void)
{
        static bool done;
        if (done)
                return;
        done = true;
        signal(SIGPIPE, SIG_IGN);
        if (uv_loop_init(&loop) < 0)
                abort();
        char dir[] = "/tmp/kairos-fuzz-conn-XXXXXX";
        if (!mkdtemp(dir))
                abort();
        snprintf(sock_path, sizeof sock_path, "%s/control.sock", dir);
        cfg.socket_group = "kairos";
        cfg.max_concurrent_mandates = 4;
        d.loop = &loop;
        d.cfg = &cfg;
        d.socket_gid = (gid_t)-1;
        control_set_commands(&(struct control_commands){ commands_dispatch, commands_known });
        for (int i = 0; i < MAX_CONNS; i++)
                peers[i].fd = -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        setup();
        if (control_start(&d, sock_path) < 0)
                abort();
        struct input in = { data, size };
        /* Small limits, so that refusals happen. */
        uint8_t l = next_byte(&in);
        struct control_limits lim = {
                .fd_limit = 1024,
                .max_clients = 1u + (l & 7u),
                .max_per_uid = 1u + ((l >> 3) & 7u),
                .reserved = (l >> 6) & 1u,
        };
        control_set_limits(&d, &lim);
        static char blob[65536];
        memset(blob, 'x', sizeof blob);
        struct peer *cur = &peers[0];
        peer_open(cur);
        unsigned ops = 0;
        while (in.n > 0 && ops++ < 2000) {
                uint8_t op = next_byte(&in);
                uint8_t arg = next_byte(&in);
                switch (op % 11) {
                case 0: { /* raw bytes from the input, split anywhere */
                        size_t len = arg < in.n ? arg : in.n;
                        peer_write(cur, in.p, len);
                        in.p += len;
                        in.n -= len;
                        break;
                }
                case 1:
                        peer_write(cur, canned[arg % NCANNED], strlen(canned[arg % NCANNED]));
                        break;
                case 2: { /* a canned request cut in two, the loop runs between */
                        const char *s = canned[arg % NCANNED];
                        size_t len = strlen(s), cut = next_byte(&in) % (len + 1);
                        peer_write(cur, s, cut);
                        run_loop(1);
                        peer_write(cur, s + cut, len - cut);
                        break;
                }
                case 3:
                        run_loop(1u + arg % 4u);
                        break;
                case 4:
                        peer_read(cur, 1024u * (1u + arg));
                        break;
                case 5: /* answer the oldest slow request */
                        if (npending > 0) {
                                struct control_request *r = pending[0];
                                memmove(pending, pending + 1, --npending * sizeof pending[0]);
                                if (arg & 1)
                                        control_reply_error(r, "late", "late %d", arg);
                                else
                                        control_reply_ok(r, NULL);
                        }
                        break;
                case 6:
                        cur = &peers[arg % MAX_CONNS];
                        peer_open(cur);
                        break;
                case 7:
                        if (cur->fd >= 0)
                                shutdown(cur->fd, SHUT_WR);
                        break;
                case 8:
                        peer_close(cur);
                        break;
                case 9: /* 64 KiB without a newline, up to 17 times (over 1 MiB) */
                        for (unsigned i = 0; i <= arg % 17u; i++) {
                                peer_write(cur, blob, sizeof blob);
                                run_loop(1);
                        }
                        break;
                case 10: { /* pipelined: the same request many times in one write */
                        const char *s = canned[arg % NCANNED];
                        size_t len = strlen(s);
                        unsigned times = 1u + (next_byte(&in) & 63u);
                        struct kbuf b = KBUF_INIT;
                        for (unsigned i = 0; i < times; i++)
                                if (kbuf_append(&b, s, len) < 0)
                                        abort();
                        peer_write(cur, b.data, b.len);
                        kbuf_free(&b);
                        break;
                }
                }
        }
        run_loop(4);
        for (int i = 0; i < MAX_CONNS; i++) {
                peer_read(&peers[i], 1u << 20);
                peer_close(&peers[i]);
        }
        run_loop(2);
        /* Stop the server (it closes what is left), then answer the slow
         * requests, as the daemon does when it stops. */
        control_stop(&d);
        while (npending > 0)
                control_reply_ok(pending[--npending], NULL);
        uv_run(&loop, UV_RUN_DEFAULT);
        if (nclaims != 0 || uv_loop_alive(&loop))
                abort();
        return 0;
}
