/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "kairos/fold.h"
#include "kairos/kbuf.h"
#include "kairos/kio.h"
#include "kairos/kjson.h"
#include "kairos/planner.h"
#include "kairos/wal.h"

#define TS_MS 1776686400123LL /* 2026-04-20T12:00:00.123Z */
#define TS "2026-04-20T12:00:00.123Z"

/* ---- a recording / failing kio wrapped around kio_posix ---------------- */

#define LOG_MAX 256

enum { OP_OPEN, OP_WRITE, OP_FDATASYNC, OP_FSYNC, OP_CLOSE, OP_FTRUNCATE, OP_RENAME, OP_UNLINK,
       OP_MKDIR, OP_FSYNC_DIR, OP_N };

struct rec {
        char log[LOG_MAX][300];
        int n;
        int calls[OP_N];
        int fail_op;        /* -1 = none */
        int fail_nth;       /* fail calls nth.. of fail_op (1-based); 0 = every */
        bool fail_once;     /* only the nth call, not the later ones */
        int fail_err;
        int short_nth;      /* write call that writes only half its bytes (0 = none) */
        int eintr_nth;      /* write call that returns -EINTR (0 = none) */
};

static void rec_init(struct rec *r)
{
        memset(r, 0, sizeof(*r));
        r->fail_op = -1;
}

static void rec_log(struct rec *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rec_log(struct rec *r, const char *fmt, ...)
{
        if (r->n >= LOG_MAX)
                return;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->log[r->n++], sizeof(r->log[0]), fmt, ap);
        va_end(ap);
}

/* Count the call; return the injected error for it, or 0. */
static int rec_call(struct rec *r, int op)
{
        int k = ++r->calls[op];
        if (r->fail_op != op)
                return 0;
        if (r->fail_nth == 0)
                return r->fail_err;
        if (r->fail_once ? k == r->fail_nth : k >= r->fail_nth)
                return r->fail_err;
        return 0;
}

static int r_open(void *ctx, const char *path, int flags, mode_t mode)
{
        rec_log(ctx, "open %s%s%s", path, (flags & O_TRUNC) ? " TRUNC" : "",
                (flags & O_APPEND) ? " APPEND" : "");
        int f = rec_call(ctx, OP_OPEN);
        return f ? f : kio_posix()->open(NULL, path, flags, mode);
}

static int r_openat(void *ctx, int dirfd, const char *name, int flags, mode_t mode)
{
        rec_log(ctx, "openat %s%s", name, (flags & O_APPEND) ? " APPEND" : "");
        int f = rec_call(ctx, OP_OPEN);
        return f ? f : kio_posix()->openat(NULL, dirfd, name, flags, mode);
}

static ssize_t r_write(void *ctx, int fd, const void *buf, size_t n)
{
        struct rec *r = ctx;
        rec_log(r, "write %zu", n);
        int f = rec_call(r, OP_WRITE);
        if (f)
                return f;
        if (r->calls[OP_WRITE] == r->eintr_nth)
                return -EINTR;
        if (r->calls[OP_WRITE] == r->short_nth)
                n /= 2;
        return kio_posix()->write(NULL, fd, buf, n);
}

static int r_fdatasync(void *ctx, int fd)
{
        rec_log(ctx, "fdatasync");
        int f = rec_call(ctx, OP_FDATASYNC);
        return f ? f : kio_posix()->fdatasync(NULL, fd);
}

static int r_fsync(void *ctx, int fd)
{
        rec_log(ctx, "fsync");
        int f = rec_call(ctx, OP_FSYNC);
        return f ? f : kio_posix()->fsync(NULL, fd);
}

static int r_close(void *ctx, int fd)
{
        rec_log(ctx, "close");
        rec_call(ctx, OP_CLOSE);
        return kio_posix()->close(NULL, fd);
}

static int r_ftruncate(void *ctx, int fd, off_t len)
{
        rec_log(ctx, "ftruncate %lld", (long long)len);
        int f = rec_call(ctx, OP_FTRUNCATE);
        return f ? f : kio_posix()->ftruncate(NULL, fd, len);
}

static int r_rename(void *ctx, const char *from, const char *to)
{
        rec_log(ctx, "rename %s %s", from, to);
        int f = rec_call(ctx, OP_RENAME);
        return f ? f : kio_posix()->rename(NULL, from, to);
}

static int r_unlink(void *ctx, const char *path)
{
        rec_log(ctx, "unlink %s", path);
        int f = rec_call(ctx, OP_UNLINK);
        return f ? f : kio_posix()->unlink(NULL, path);
}

static int r_mkdir(void *ctx, const char *path, mode_t mode)
{
        rec_log(ctx, "mkdir %s", path);
        int f = rec_call(ctx, OP_MKDIR);
        return f ? f : kio_posix()->mkdir(NULL, path, mode);
}

static int r_fsync_dir(void *ctx, const char *path)
{
        rec_log(ctx, "fsync_dir %s", path);
        int f = rec_call(ctx, OP_FSYNC_DIR);
        return f ? f : kio_posix()->fsync_dir(NULL, path);
}

static struct kio rec_kio(struct rec *r)
{
        struct kio io = {
                .open = r_open,
                .write = r_write,
                .fdatasync = r_fdatasync,
                .fsync = r_fsync,
                .close = r_close,
                .ftruncate = r_ftruncate,
                .rename = r_rename,
                .unlink = r_unlink,
                .mkdir = r_mkdir,
                .fsync_dir = r_fsync_dir,
                .ctx = r,
                .openat = r_openat,
        };
        return io;
}

/* Index of the first log entry at or after `from` equal to want, or -1. */
static int log_find(const struct rec *r, int from, const char *want)
{
        for (int i = from; i < r->n; i++) {
                if (strcmp(r->log[i], want) == 0)
                        return i;
        }
        return -1;
}

static int64_t fixed_clock(void *ctx)
{
        return *(const int64_t *)ctx;
}

/* ---- fixtures and file helpers -------------------------------------------- */

struct fx {
        char dir[64];
        char wal[160];
        int64_t now;
        struct rec rec;
        struct kio io;
        struct wal_options opt;
};

static int setup(void **state)
{
        struct fx *f = calloc(1, sizeof(*f));
        if (!f)
                return -1;
        strcpy(f->dir, "/tmp/wal-test-XXXXXX");
        if (!mkdtemp(f->dir)) {
                free(f);
                return -1;
        }
        snprintf(f->wal, sizeof(f->wal), "%s/wal/mnd_plan_ae607245ac43.wal.jsonl", f->dir);
        f->now = TS_MS;
        rec_init(&f->rec);
        f->io = rec_kio(&f->rec);
        f->opt = (struct wal_options){ .io = &f->io, .now_ms = fixed_clock, .clock_ctx = &f->now };
        *state = f;
        return 0;
}

static int teardown(void **state)
{
        struct fx *f = *state;
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->dir);
        int r = system(cmd);
        free(f);
        return r == 0 ? 0 : -1;
}

static char *slurp(const char *path, size_t *len)
{
        FILE *fp = fopen(path, "rb");
        if (!fp)
                return NULL;
        struct kbuf b = KBUF_INIT;
        char chunk[4096];
        size_t n;
        while ((n = fread(chunk, 1, sizeof(chunk), fp)) > 0)
                assert_int_equal(kbuf_append(&b, chunk, n), 0);
        fclose(fp);
        *len = b.len;
        return kbuf_steal(&b);
}

static void spit(const char *path, const char *data, size_t len)
{
        FILE *fp = fopen(path, "wb");
        assert_non_null(fp);
        assert_int_equal(fwrite(data, 1, len, fp), len);
        assert_int_equal(fclose(fp), 0);
}

static bool exists(const char *path)
{
        struct stat st;
        return stat(path, &st) == 0;
}

static size_t count_lines(const char *s, size_t len)
{
        size_t n = 0;
        for (size_t i = 0; i < len; i++)
                n += s[i] == '\n';
        return n;
}

/* Encode a record with the fixed ts. */
static char *enc(const struct wal_record *r)
{
        struct kbuf b = KBUF_INIT;
        assert_int_equal(wal_encode(r, TS_MS, &b), 0);
        return kbuf_steal(&b);
}

/* The line a body `{...,"ts":"..."}` becomes: crc computed independently. */
static char *with_crc(const char *body)
{
        size_t n = strlen(body);
        assert_true(n > 0 && body[n - 1] == '}');
        uLong crc = crc32(0L, (const Bytef *)body, (uInt)n);
        struct kbuf b = KBUF_INIT;
        assert_int_equal(kbuf_append(&b, body, n - 1), 0);
        assert_int_equal(kbuf_printf(&b, ",\"crc\":\"%08lx\"}\n", crc), 0);
        return kbuf_steal(&b);
}

static void expect_encoded(const struct wal_record *r, const char *body)
{
        char *got = enc(r);
        char *want = with_crc(body);
        assert_string_equal(got, want);
        free(got);
        free(want);
}

/* A line's crc field verifies (line with or without its '\n'). */
static bool crc_ok(const char *line, size_t len)
{
        if (len && line[len - 1] == '\n')
                len--;
        static const char tag[] = ",\"crc\":\"";
        const size_t field = sizeof(tag) - 1 + 8 + 1; /* ,"crc":"xxxxxxxx" */
        if (len < field + 1 || line[len - 1] != '}')
                return false;
        const char *f = line + len - 1 - field;
        if (memcmp(f, tag, sizeof(tag) - 1) != 0 || f[field - 1] != '"')
                return false;
        char hex[9];
        memcpy(hex, f + sizeof(tag) - 1, 8);
        hex[8] = '\0';
        struct kbuf b = KBUF_INIT;
        assert_int_equal(kbuf_append(&b, line, (size_t)(f - line)), 0);
        assert_int_equal(kbuf_putc(&b, '}'), 0);
        char want[9];
        snprintf(want, sizeof(want), "%08x", wal_crc(b.data, b.len));
        kbuf_free(&b);
        return strcmp(hex, want) == 0;
}

/* ---- encoder: exact bytes -------------------------------------------------- */

static void test_format_ts(void **state)
{
        (void)state;
        char ts[32];
        wal_format_ts(TS_MS, ts);
        assert_string_equal(ts, TS);
        wal_format_ts(0, ts);
        assert_string_equal(ts, "1970-01-01T00:00:00.000Z");
        wal_format_ts(-1, ts);
        assert_string_equal(ts, "1969-12-31T23:59:59.999Z");
        wal_format_ts(951782400007LL, ts); /* leap day */
        assert_string_equal(ts, "2000-02-29T00:00:00.007Z");
}

static void test_crc_golden(void **state)
{
        (void)state;
        /* crc value computed with Python's zlib.crc32 */
        struct wal_record r = {
                .op = WAL_OP_APPEND,
                .step_id = "observe_001",
                .plan_id = "plan_ae607245ac43",
                .idem_key = "mnd_plan_ae607245ac43/observe_001",
        };
        char *got = enc(&r);
        assert_string_equal(got,
                            "{\"op\":\"append\",\"step_id\":\"observe_001\",\"plan_id\":"
                            "\"plan_ae607245ac43\",\"idem_key\":\"mnd_plan_ae607245ac43/"
                            "observe_001\",\"status\":\"pending\",\"ts\":\"" TS
                            "\",\"crc\":\"60e1e7f6\"}\n");
        assert_true(crc_ok(got, strlen(got)));
        /* flip one byte of the body: the crc no longer verifies */
        got[10] ^= 1;
        assert_false(crc_ok(got, strlen(got)));
        free(got);
}

static void test_encode_plan_commit_golden_hash(void **state)
{
        (void)state;
        struct wal_step s = { "s1", "t", "ph", "pre", "post" };
        struct wal_record r = {
                .op = WAL_OP_PLAN_COMMIT,
                .plan_id = "plan_x",
                .mandate_id = "mnd_plan_x",
                .cycle = 1,
                .steps = &s,
                .nsteps = 1,
        };
        expect_encoded(&r, "{\"op\":\"plan_commit\",\"plan_id\":\"plan_x\",\"mandate_id\":"
                           "\"mnd_plan_x\",\"cycle\":1,\"plan_hash\":\"sha256-9c580c3be4a149be94"
                           "6a9a9a647a294b99d817eeaa7f9fe54168808e853ce77b\",\"steps\":[{"
                           "\"step_id\":\"s1\",\"tool\":\"t\",\"params_hash\":\"ph\","
                           "\"pre_hash\":\"pre\",\"expected_post_hash\":\"post\"}],\"ts\":\"" TS
                           "\"}");

        /* two steps, cycle as an integer */
        struct wal_step two[2] = { { "a_002", "ooda.a", "p1", "q1", "r1" },
                                   { "b_002", "ooda.b", "p2", "q2", "r2" } };
        r.steps = two;
        r.nsteps = 2;
        r.cycle = 12;
        char *got = enc(&r);
        assert_non_null(strstr(got, "\"cycle\":12,\"plan_hash\":\"sha256-"));
        assert_non_null(strstr(got, "\"steps\":[{\"step_id\":\"a_002\",\"tool\":\"ooda.a\","
                                    "\"params_hash\":\"p1\",\"pre_hash\":\"q1\","
                                    "\"expected_post_hash\":\"r1\"},{\"step_id\":\"b_002\","));
        assert_null(strstr(got, "sha256-9c580c3b"));
        free(got);
}

static void test_encode_every_op(void **state)
{
        (void)state;
        struct wal_record r = { .op = WAL_OP_EXECUTING, .step_id = "act_001", .pre_hash = "h0" };
        expect_encoded(&r, "{\"op\":\"transition\",\"step_id\":\"act_001\",\"status\":"
                           "\"executing\",\"pre_hash\":\"h0\",\"ts\":\"" TS "\"}");

        r = (struct wal_record){ .op = WAL_OP_COMPLETED, .step_id = "act_001",
                                 .post_hash = "h1", .result_hash = "h2" };
        expect_encoded(&r, "{\"op\":\"transition\",\"step_id\":\"act_001\",\"status\":"
                           "\"completed\",\"post_hash\":\"h1\",\"result_hash\":\"h2\",\"ts\":\"" TS
                           "\"}");
        r.recovered = true;
        r.evidence_json = " { \"why\" : [1, 2.50, \"x y\"], \"a\":null } ";
        r.result_json = "{\"z\":1,\"a\":{\"k\":true}}";
        expect_encoded(&r, "{\"op\":\"transition\",\"step_id\":\"act_001\",\"status\":"
                           "\"completed\",\"post_hash\":\"h1\",\"result_hash\":\"h2\","
                           "\"recovered\":true,\"evidence\":{\"why\":[1,2.50,\"x y\"],\"a\":null},"
                           "\"result\":{\"z\":1,\"a\":{\"k\":true}},\"ts\":\"" TS "\"}");
        r.recovered = false;
        r.evidence_json = NULL;
        r.result_json = "\"line\\nbreak\"";
        expect_encoded(&r, "{\"op\":\"transition\",\"step_id\":\"act_001\",\"status\":"
                           "\"completed\",\"post_hash\":\"h1\",\"result_hash\":\"h2\","
                           "\"result\":\"line\\nbreak\",\"ts\":\"" TS "\"}");

        r = (struct wal_record){ .op = WAL_OP_FAILED, .step_id = "act_001",
                                 .error_class = "HandlerExit", .error_msg = "exit 3" };
        expect_encoded(&r, "{\"op\":\"transition\",\"step_id\":\"act_001\",\"status\":\"failed\","
                           "\"error_class\":\"HandlerExit\",\"error_msg\":\"exit 3\",\"ts\":\"" TS
                           "\"}");

        r = (struct wal_record){ .op = WAL_OP_NEEDS_REVIEW, .step_id = "act_001" };
        expect_encoded(&r, "{\"op\":\"transition\",\"step_id\":\"act_001\",\"status\":"
                           "\"needs_review\",\"ts\":\"" TS "\"}");
        r.reason = "ambiguous";
        r.evidence_json = "{\"pre\":\"a\"}";
        expect_encoded(&r, "{\"op\":\"transition\",\"step_id\":\"act_001\",\"status\":"
                           "\"needs_review\",\"reason\":\"ambiguous\",\"evidence\":{\"pre\":\"a\"},"
                           "\"ts\":\"" TS "\"}");
        r.reason = NULL;
        expect_encoded(&r, "{\"op\":\"transition\",\"step_id\":\"act_001\",\"status\":"
                           "\"needs_review\",\"evidence\":{\"pre\":\"a\"},\"ts\":\"" TS "\"}");

        r = (struct wal_record){ .op = WAL_OP_RESET, .step_id = "act_001" };
        expect_encoded(&r, "{\"op\":\"transition\",\"step_id\":\"act_001\",\"status\":\"pending\","
                           "\"reset\":true,\"ts\":\"" TS "\"}");
        r.evidence_json = "{\"reason\":\"effects_journaled\",\"tool_calls\":[]}";
        expect_encoded(&r, "{\"op\":\"transition\",\"step_id\":\"act_001\",\"status\":\"pending\","
                           "\"reset\":true,\"evidence\":{\"reason\":\"effects_journaled\","
                           "\"tool_calls\":[]},\"ts\":\"" TS "\"}");

        r = (struct wal_record){ .op = WAL_OP_FINALIZE, .plan_id = "plan_x", .status = PLAN_SUCCEEDED };
        expect_encoded(&r, "{\"op\":\"plan_finalize\",\"plan_id\":\"plan_x\",\"status\":"
                           "\"succeeded\",\"ts\":\"" TS "\"}");
        r.status = PLAN_ABANDONED;
        r.reason = "operator";
        expect_encoded(&r, "{\"op\":\"plan_finalize\",\"plan_id\":\"plan_x\",\"status\":"
                           "\"abandoned\",\"reason\":\"operator\",\"ts\":\"" TS "\"}");

        r = (struct wal_record){ .op = WAL_OP_OPERATOR, .mandate_id = "mnd_x", .action = "resume",
                                 .uid = 1000, .reason = "checked by hand" };
        expect_encoded(&r, "{\"op\":\"operator\",\"mandate_id\":\"mnd_x\",\"action\":\"resume\","
                           "\"uid\":1000,\"reason\":\"checked by hand\",\"ts\":\"" TS "\"}");
        r.step_id = "act_001";
        r.action = "mark_done";
        r.uid = 0;
        expect_encoded(&r, "{\"op\":\"operator\",\"mandate_id\":\"mnd_x\",\"action\":"
                           "\"mark_done\",\"step_id\":\"act_001\",\"uid\":0,\"reason\":"
                           "\"checked by hand\",\"ts\":\"" TS "\"}");

        r = (struct wal_record){ .op = WAL_OP_MANDATE, .mandate_id = "mnd_plan_ae607245ac43",
                                 .schedule = "daily", .fired_at = "2026-04-20T12:00:00Z" };
        expect_encoded(&r, "{\"op\":\"mandate\",\"mandate_id\":\"mnd_plan_ae607245ac43\","
                           "\"schedule\":\"daily\",\"fired_at\":\"2026-04-20T12:00:00Z\","
                           "\"ts\":\"" TS "\"}");
        r.goal = "ship the \"report\"";
        expect_encoded(&r, "{\"op\":\"mandate\",\"mandate_id\":\"mnd_plan_ae607245ac43\","
                           "\"schedule\":\"daily\",\"fired_at\":\"2026-04-20T12:00:00Z\","
                           "\"goal\":\"ship the \\\"report\\\"\",\"ts\":\"" TS "\"}");
        r.goal = NULL;
        r.retry_of = "mnd_plan_ae607245ac43";
        r.retry = 2;
        expect_encoded(&r, "{\"op\":\"mandate\",\"mandate_id\":\"mnd_plan_ae607245ac43\","
                           "\"schedule\":\"daily\",\"fired_at\":\"2026-04-20T12:00:00Z\","
                           "\"retry_of\":\"mnd_plan_ae607245ac43\",\"retry\":2,"
                           "\"ts\":\"" TS "\"}");
        struct kbuf b = KBUF_INIT;
        r.retry = 0;
        assert_int_equal(wal_encode(&r, 0, &b), -EINVAL);
        assert_string_equal(wal_encode_error(), "mandate retry_of needs retry >= 1");
        r.retry_of = NULL;
        r.schedule = NULL;
        assert_int_equal(wal_encode(&r, 0, &b), -EINVAL);
        assert_string_equal(wal_encode_error(), "mandate needs schedule");
        kbuf_free(&b);
}

/* retry_wait: a failed attempt waits for its retry (docs/design.md §6). */
static void test_encode_retry_wait(void **state)
{
        (void)state;
        struct wal_record r = { .op = WAL_OP_RETRY_WAIT, .step_id = "act_001", .attempt = 2,
                                .error_class = "exit_status", .due_ms = 1776686400123LL };
        expect_encoded(&r, "{\"op\":\"retry_wait\",\"step_id\":\"act_001\",\"attempt\":2,"
                           "\"error_class\":\"exit_status\",\"due_ms\":1776686400123,"
                           "\"ts\":\"" TS "\"}");
        struct kbuf b = KBUF_INIT;
        r.attempt = 0;
        assert_int_equal(wal_encode(&r, 0, &b), -EINVAL);
        assert_string_equal(wal_encode_error(), "retry_wait needs attempt >= 1");
        r.attempt = 1;
        r.error_class = NULL;
        assert_int_equal(wal_encode(&r, 0, &b), -EINVAL);
        assert_string_equal(wal_encode_error(), "retry_wait needs error_class");
        r.error_class = "timeout";
        r.due_ms = -1;
        assert_int_equal(wal_encode(&r, 0, &b), -EINVAL);
        assert_string_equal(wal_encode_error(), "retry_wait needs due_ms >= 0");
        kbuf_free(&b);
}

static void test_encode_escaping(void **state)
{
        (void)state;
        struct wal_record r = { .op = WAL_OP_EXECUTING, .step_id = "a\"b\\c/d\ne\x01\xc3\xa9",
                                .pre_hash = "h" };
        expect_encoded(&r, "{\"op\":\"transition\",\"step_id\":\"a\\\"b\\\\c/d\\ne\\u0001\xc3\xa9\","
                           "\"status\":\"executing\",\"pre_hash\":\"h\",\"ts\":\"" TS "\"}");
        /* no raw newline anywhere but the end, whatever the input */
        r = (struct wal_record){ .op = WAL_OP_FAILED, .step_id = "s", .error_class = "E\tx",
                                 .error_msg = "multi\nline\r\nmessage" };
        char *got = enc(&r);
        assert_ptr_equal(strchr(got, '\n'), got + strlen(got) - 1);
        assert_non_null(strstr(got, "\"error_class\":\"E\\tx\",\"error_msg\":"
                                    "\"multi\\nline\\r\\nmessage\""));
        free(got);
}

static void test_encode_error_msg_cut_at_500_characters(void **state)
{
        (void)state;
        struct kbuf msg = KBUF_INIT;
        struct kbuf want = KBUF_INIT;
        /* 600 two-byte characters: 500 kept (1000 bytes), not 250 */
        for (int i = 0; i < 600; i++)
                assert_int_equal(kbuf_puts(&msg, "\xc3\xa9"), 0);
        assert_int_equal(kbuf_puts(&want, "{\"op\":\"transition\",\"step_id\":\"s\",\"status\":"
                                          "\"failed\",\"error_class\":\"E\",\"error_msg\":\""),
                         0);
        for (int i = 0; i < 500; i++)
                assert_int_equal(kbuf_puts(&want, "\xc3\xa9"), 0);
        assert_int_equal(kbuf_puts(&want, "\",\"ts\":\"" TS "\"}"), 0);
        struct wal_record r = { .op = WAL_OP_FAILED, .step_id = "s", .error_class = "E",
                                .error_msg = msg.data };
        expect_encoded(&r, want.data);

        /* mixed widths: 499 ASCII then a 4-byte and a 3-byte character: the cut
         * falls after the 4-byte one, never inside it */
        kbuf_reset(&msg);
        kbuf_reset(&want);
        for (int i = 0; i < 499; i++)
                assert_int_equal(kbuf_putc(&msg, 'x'), 0);
        assert_int_equal(kbuf_puts(&msg, "\xf0\x9f\x98\x80\xe6\x97\xa5tail"), 0);
        assert_int_equal(kbuf_puts(&want, "{\"op\":\"transition\",\"step_id\":\"s\",\"status\":"
                                          "\"failed\",\"error_class\":\"E\",\"error_msg\":\""),
                         0);
        for (int i = 0; i < 499; i++)
                assert_int_equal(kbuf_putc(&want, 'x'), 0);
        assert_int_equal(kbuf_puts(&want, "\xf0\x9f\x98\x80\",\"ts\":\"" TS "\"}"), 0);
        r.error_msg = msg.data;
        expect_encoded(&r, want.data);

        /* exactly 500 characters: unchanged */
        kbuf_reset(&msg);
        for (int i = 0; i < 500; i++)
                assert_int_equal(kbuf_puts(&msg, "\xe6\x97\xa5"), 0);
        r.error_msg = msg.data;
        char *got = enc(&r);
        assert_non_null(strstr(got, msg.data));
        free(got);

        kbuf_free(&msg);
        kbuf_free(&want);
}

static void test_encode_error_msg_invalid_utf8_replaced(void **state)
{
        (void)state;
        /* NULL error_msg is written as "" (the original's error_msg.to_s) */
        struct wal_record n = { .op = WAL_OP_FAILED, .step_id = "s", .error_class = "E" };
        expect_encoded(&n, "{\"op\":\"transition\",\"step_id\":\"s\",\"status\":\"failed\","
                           "\"error_class\":\"E\",\"error_msg\":\"\",\"ts\":\"" TS "\"}");
        struct wal_record r = { .op = WAL_OP_FAILED, .step_id = "s", .error_class = "E",
                                .error_msg = "ab\xff" "cd\xc3" };
        expect_encoded(&r, "{\"op\":\"transition\",\"step_id\":\"s\",\"status\":\"failed\","
                           "\"error_class\":\"E\",\"error_msg\":\"ab\xef\xbf\xbd" "cd\xef\xbf\xbd\","
                           "\"ts\":\"" TS "\"}");
}

static void expect_einval(const struct wal_record *r)
{
        struct kbuf b = KBUF_INIT;
        assert_int_equal(kbuf_puts(&b, "keep"), 0);
        assert_int_equal(wal_encode(r, TS_MS, &b), -EINVAL);
        assert_string_equal(b.data, "keep");
        assert_true(strlen(wal_encode_error()) > 0);
        kbuf_free(&b);
}

static void test_encode_rejects_bad_records(void **state)
{
        (void)state;
        struct wal_record r = { .op = WAL_OP_COMPLETED, .step_id = "s", .post_hash = "p",
                                .result_hash = "h", .evidence_json = "{\"a\":}" };
        expect_einval(&r);
        r.evidence_json = NULL;
        r.result_json = "{} {}";
        expect_einval(&r);
        r.result_json = "";
        expect_einval(&r);
        r.result_json = NULL;
        r.post_hash = NULL;
        expect_einval(&r);
        assert_string_equal(wal_encode_error(), "completed needs post_hash");

        r = (struct wal_record){ .op = WAL_OP_NEEDS_REVIEW, .step_id = "s",
                                 .evidence_json = "[1,2" };
        expect_einval(&r);
        r = (struct wal_record){ .op = WAL_OP_EXECUTING, .step_id = "bad\xff", .pre_hash = "h" };
        expect_einval(&r);
        r = (struct wal_record){ .op = WAL_OP_EXECUTING, .step_id = "s" };
        expect_einval(&r);
        r = (struct wal_record){ .op = WAL_OP_FINALIZE, .plan_id = "p", .status = PLAN_OTHER };
        expect_einval(&r);
        r.status = PLAN_OPEN;
        expect_einval(&r);
        r = (struct wal_record){ .op = WAL_OP_FAILED, .step_id = "s", .error_msg = "m" };
        expect_einval(&r);
        r = (struct wal_record){ .op = WAL_OP_OPERATOR, .mandate_id = "m", .action = "pause" };
        expect_einval(&r);
        struct wal_step st = { "s1", "t", NULL, "pre", "post" };
        r = (struct wal_record){ .op = WAL_OP_PLAN_COMMIT, .plan_id = "p", .mandate_id = "m",
                                 .cycle = 1, .steps = &st, .nsteps = 1 };
        expect_einval(&r);
        st.params_hash = "ph";
        r.cycle = 0;
        expect_einval(&r);
        r = (struct wal_record){ .op = (enum wal_op)99 };
        expect_einval(&r);

        /* a good encode after a failure clears the message */
        r = (struct wal_record){ .op = WAL_OP_RESET, .step_id = "s" };
        char *got = enc(&r);
        assert_string_equal(wal_encode_error(), "");
        free(got);
}

static void test_encoded_lines_fold_clean(void **state)
{
        (void)state;
        /* every op the encoder writes is a good record for the fold */
        struct wal_step s = { "act_001", "t", "ph", "pre", "post" };
        struct wal_record recs[] = {
                { .op = WAL_OP_PLAN_COMMIT, .plan_id = "plan_x", .mandate_id = "mnd_x",
                  .cycle = 1, .steps = &s, .nsteps = 1 },
                { .op = WAL_OP_APPEND, .step_id = "act_001", .plan_id = "plan_x",
                  .idem_key = "mnd_x/act_001" },
                { .op = WAL_OP_EXECUTING, .step_id = "act_001", .pre_hash = "pre" },
                { .op = WAL_OP_COMPLETED, .step_id = "act_001", .post_hash = "post",
                  .result_hash = "rh", .result_json = "[1]" },
                { .op = WAL_OP_OPERATOR, .mandate_id = "mnd_x", .action = "note", .uid = 5,
                  .reason = "r" },
                { .op = WAL_OP_FINALIZE, .plan_id = "plan_x", .status = PLAN_SUCCEEDED },
        };
        struct kbuf all = KBUF_INIT;
        for (size_t i = 0; i < sizeof(recs) / sizeof(recs[0]); i++)
                assert_int_equal(wal_encode(&recs[i], TS_MS, &all), 0);
        struct fold *f = NULL;
        assert_int_equal(fold_buffer(all.data, all.len, &f), 0);
        assert_int_equal(f->status, FOLD_CLEAN);
        assert_int_equal(f->records, 6);
        assert_int_equal(f->legacy_records, 0);
        assert_int_equal(f->nplans, 1);
        assert_true(f->plans[0].finalized);
        const struct fold_step *st = fold_find_step(f, "act_001");
        assert_non_null(st);
        assert_string_equal(st->status, "completed");
        fold_free(f);
        kbuf_free(&all);
}

/* ---- writer ---------------------------------------------------------------- */

static void test_create_fsyncs_parent(void **state)
{
        struct fx *f = *state;
        struct wal *w = NULL;
        struct wal_open_info info;
        assert_int_equal(wal_open(f->wal, &f->opt, &w, &info), 0);
        assert_true(info.created);
        assert_false(info.torn_repaired);
        assert_false(info.corrupt);
        assert_int_equal(wal_state(w), WAL_STATE_OK);
        assert_string_equal(wal_path(w), f->wal);

        struct stat st;
        assert_int_equal(stat(f->wal, &st), 0);
        /* group-readable: members of the daemon's group run the offline commands */
        assert_int_equal(st.st_mode & 0777, 0640);
        assert_int_equal(st.st_size, 0);

        /* mkdir <dir>/wal (fsync of <dir>), open with O_APPEND and never
         * O_TRUNC, then fsync of <dir>/wal */
        char want[300], waldir[200];
        snprintf(waldir, sizeof(waldir), "%s/wal", f->dir);
        snprintf(want, sizeof(want), "mkdir %s", waldir);
        int i = log_find(&f->rec, 0, want);
        assert_true(i >= 0);
        snprintf(want, sizeof(want), "fsync_dir %s", f->dir);
        i = log_find(&f->rec, i, want);
        assert_true(i >= 0);
        snprintf(want, sizeof(want), "open %s APPEND", f->wal);
        i = log_find(&f->rec, i, want);
        assert_true(i >= 0);
        snprintf(want, sizeof(want), "fsync_dir %s", waldir);
        assert_true(log_find(&f->rec, i, want) > i);
        for (int k = 0; k < f->rec.n; k++)
                assert_null(strstr(f->rec.log[k], "TRUNC"));
        assert_int_equal(wal_close(w), 0);

        /* reopening an empty WAL (its creator may have died before the
         * directory fsync) fsyncs the directory again */
        rec_init(&f->rec);
        assert_int_equal(wal_open(f->wal, &f->opt, &w, &info), 0);
        assert_false(info.created);
        snprintf(want, sizeof(want), "fsync_dir %s", waldir);
        assert_true(log_find(&f->rec, 0, want) >= 0);
        assert_int_equal(wal_mark_reset(w, "s"), 0);
        assert_int_equal(wal_close(w), 0);

        /* reopening a non-empty WAL fsyncs no directory */
        rec_init(&f->rec);
        assert_int_equal(wal_open(f->wal, &f->opt, &w, &info), 0);
        assert_false(info.created);
        assert_int_equal(f->rec.calls[OP_FSYNC_DIR], 0);
        assert_int_equal(f->rec.calls[OP_FTRUNCATE], 0);
        assert_int_equal(wal_close(w), 0);
        assert_int_equal(wal_close(NULL), 0);
}

static void test_reopen_does_not_truncate(void **state)
{
        struct fx *f = *state;
        struct wal *w = NULL;
        assert_int_equal(wal_open(f->wal, &f->opt, &w, NULL), 0);
        assert_int_equal(wal_append_pending(w, "observe_001", "plan_x", "mnd_x/observe_001"), 0);
        assert_int_equal(wal_mark_executing(w, "observe_001", "pre"), 0);
        assert_int_equal(wal_flush(w), 0);
        assert_int_equal(wal_close(w), 0);
        size_t len1;
        char *before = slurp(f->wal, &len1);
        assert_int_equal(count_lines(before, len1), 2);

        f->now += 1000;
        assert_int_equal(wal_open(f->wal, &f->opt, &w, NULL), 0);
        assert_int_equal(wal_mark_completed(w, "observe_001", "post", "rh", false, NULL, NULL),
                         0);
        assert_int_equal(wal_flush(w), 0);
        assert_int_equal(wal_close(w), 0);
        size_t len2;
        char *after = slurp(f->wal, &len2);
        assert_true(len2 > len1);
        assert_memory_equal(after, before, len1);
        assert_int_equal(count_lines(after, len2), 3);
        assert_non_null(strstr(after + len1, "\"ts\":\"2026-04-20T12:00:01.123Z\""));
        free(before);
        free(after);
}

static void test_one_line_per_op(void **state)
{
        struct fx *f = *state;
        struct wal *w = NULL;
        assert_int_equal(wal_open(f->wal, &f->opt, &w, NULL), 0);
        struct wal_step s = { "s1", "t", "ph", "pre", "post" };
        assert_int_equal(wal_commit_plan(w, "plan_x", "mnd_x", 1, &s, 1), 0);
        assert_int_equal(wal_append_pending(w, "s1", "plan_x", "mnd_x/s1"), 0);
        assert_int_equal(wal_mark_executing(w, "s1", "pre"), 0);
        assert_int_equal(wal_mark_completed(w, "s1", "post", "rh", true, "{\"e\":1}", "[2]"), 0);
        assert_int_equal(wal_mark_failed(w, "s1", "E", "boom"), 0);
        assert_int_equal(wal_mark_needs_review(w, "s1", "why", NULL), 0);
        assert_int_equal(wal_mark_reset(w, "s1"), 0);
        assert_int_equal(wal_finalize_plan(w, "plan_x", PLAN_ABANDONED, "gone"), 0);
        assert_int_equal(wal_operator(w, "mnd_x", "resume", NULL, 1000, "ok"), 0);
        assert_int_equal(wal_pending(w), 9);
        /* a record the encoder refuses is not written and changes nothing */
        assert_int_equal(wal_finalize_plan(w, "plan_x", (enum plan_status)99, NULL), -EINVAL);
        assert_int_equal(wal_mark_completed(w, "s1", "post", "rh", false, "{", NULL), -EINVAL);
        assert_int_equal(wal_state(w), WAL_STATE_OK);
        assert_int_equal(wal_pending(w), 9);
        assert_int_equal(wal_close(w), 0);

        const struct wal_record want[] = {
                { .op = WAL_OP_PLAN_COMMIT, .plan_id = "plan_x", .mandate_id = "mnd_x",
                  .cycle = 1, .steps = &s, .nsteps = 1 },
                { .op = WAL_OP_APPEND, .step_id = "s1", .plan_id = "plan_x",
                  .idem_key = "mnd_x/s1" },
                { .op = WAL_OP_EXECUTING, .step_id = "s1", .pre_hash = "pre" },
                { .op = WAL_OP_COMPLETED, .step_id = "s1", .post_hash = "post",
                  .result_hash = "rh", .recovered = true, .evidence_json = "{\"e\":1}",
                  .result_json = "[2]" },
                { .op = WAL_OP_FAILED, .step_id = "s1", .error_class = "E", .error_msg = "boom" },
                { .op = WAL_OP_NEEDS_REVIEW, .step_id = "s1", .reason = "why" },
                { .op = WAL_OP_RESET, .step_id = "s1" },
                { .op = WAL_OP_FINALIZE, .plan_id = "plan_x", .status = PLAN_ABANDONED,
                  .reason = "gone" },
                { .op = WAL_OP_OPERATOR, .mandate_id = "mnd_x", .action = "resume",
                  .uid = 1000, .reason = "ok" },
        };
        struct kbuf all = KBUF_INIT;
        for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
                assert_int_equal(wal_encode(&want[i], TS_MS, &all), 0);
        size_t len;
        char *got = slurp(f->wal, &len);
        assert_int_equal(len, all.len);
        assert_memory_equal(got, all.data, len);
        assert_int_equal(count_lines(got, len), 9);
        /* the first line carries the golden plan_hash */
        assert_non_null(strstr(got, "\"cycle\":1,\"plan_hash\":\"sha256-9c580c3be4a149be946a9a9a6"
                                    "47a294b99d817eeaa7f9fe54168808e853ce77b\",\"steps\":"));
        free(got);
        kbuf_free(&all);
}

static void test_commit_planner_plan(void **state)
{
        struct fx *f = *state;
        struct planner_plan p;
        assert_int_equal(planner_build("daily", "2026-04-20T12:00:00Z", 1, &p), 0);
        assert_string_equal(p.plan_id, "plan_ae607245ac43");
        struct wal *w = NULL;
        assert_int_equal(wal_open(f->wal, &f->opt, &w, NULL), 0);
        assert_int_equal(wal_commit_planner_plan(w, &p), 0);
        assert_int_equal(wal_close(w), 0);
        size_t len;
        char *got = slurp(f->wal, &len);
        char want[200];
        snprintf(want, sizeof(want), "\"plan_id\":\"%s\",\"mandate_id\":\"%s\",\"cycle\":1,"
                 "\"plan_hash\":\"%s\",", p.plan_id, p.mandate_id, p.plan_hash);
        assert_non_null(strstr(got, want));
        for (int i = 0; i < PLANNER_PHASES; i++) {
                snprintf(want, sizeof(want), "{\"step_id\":\"%s\",\"tool\":\"%s\",",
                         p.steps[i].step_id, p.steps[i].tool);
                assert_non_null(strstr(got, want));
        }
        assert_int_equal(count_lines(got, len), 1);
        free(got);
}

static void test_flush_barrier(void **state)
{
        struct fx *f = *state;
        struct wal *w = NULL;
        assert_int_equal(wal_open(f->wal, &f->opt, &w, NULL), 0);
        int base = f->rec.calls[OP_FDATASYNC]; /* creation does not fdatasync the file */
        assert_int_equal(base, 0);

        /* nothing pending: no fdatasync */
        assert_int_equal(wal_flush(w), 0);
        assert_int_equal(f->rec.calls[OP_FDATASYNC], 0);
        assert_int_equal(wal_flush_count(w), 0);

        for (int i = 0; i < 7; i++)
                assert_int_equal(wal_mark_reset(w, "s"), 0);
        assert_int_equal(wal_pending(w), 7);
        assert_int_equal(f->rec.calls[OP_WRITE], 7); /* one write per record */
        assert_int_equal(f->rec.calls[OP_FDATASYNC], 0);
        assert_int_equal(wal_flush(w), 0);
        assert_int_equal(f->rec.calls[OP_FDATASYNC], 1);
        assert_int_equal(wal_flush_count(w), 1);
        assert_int_equal(wal_pending(w), 0);

        /* again with nothing new: still one */
        assert_int_equal(wal_flush(w), 0);
        assert_int_equal(f->rec.calls[OP_FDATASYNC], 1);
        assert_int_equal(wal_flush_count(w), 1);

        /* a five-step cycle with the barrier rule: 6 flushes */
        for (int step = 0; step < 5; step++) {
                if (step == 0)
                        assert_int_equal(wal_mark_reset(w, "plan"), 0); /* plan_commit */
                assert_int_equal(wal_mark_executing(w, "s", "pre"), 0);
                assert_int_equal(wal_flush(w), 0); /* before spawning */
                assert_int_equal(wal_mark_completed(w, "s", "post", "rh", false, NULL, NULL), 0);
        }
        assert_int_equal(wal_finalize_plan(w, "p", PLAN_SUCCEEDED, NULL), 0);
        assert_int_equal(wal_flush(w), 0);
        assert_int_equal(wal_flush_count(w), 1 + 6);
        assert_int_equal(f->rec.calls[OP_FDATASYNC], 1 + 6);
        assert_int_equal(wal_close(w), 0);
}

struct thread_arg {
        struct wal *w;
        int id;
        int errors;
};

#define THREADS 8
#define PER_THREAD 100

static void *append_thread(void *p)
{
        struct thread_arg *a = p;
        for (int i = 0; i < PER_THREAD; i++) {
                char step[32], key[64];
                snprintf(step, sizeof(step), "t%d_%03d", a->id, i);
                snprintf(key, sizeof(key), "mnd_x/%s", step);
                if (wal_append_pending(a->w, step, "plan_x", key) != 0)
                        a->errors++;
                if (i % 10 == 9 && wal_flush(a->w) != 0)
                        a->errors++;
        }
        return NULL;
}

static int cmp_str(const void *a, const void *b)
{
        return strcmp(*(char *const *)a, *(char *const *)b);
}

static void test_threads_all_intact(void **state)
{
        struct fx *f = *state;
        struct wal *w = NULL;
        struct wal_options opt = { 0 }; /* real kio, real clock */
        assert_int_equal(wal_open(f->wal, &opt, &w, NULL), 0);
        pthread_t t[THREADS];
        struct thread_arg args[THREADS];
        for (int i = 0; i < THREADS; i++) {
                args[i] = (struct thread_arg){ .w = w, .id = i };
                assert_int_equal(pthread_create(&t[i], NULL, append_thread, &args[i]), 0);
        }
        for (int i = 0; i < THREADS; i++) {
                assert_int_equal(pthread_join(t[i], NULL), 0);
                assert_int_equal(args[i].errors, 0);
        }
        assert_int_equal(wal_flush(w), 0);
        assert_int_equal(wal_pending(w), 0);
        assert_true(wal_flush_count(w) >= 1);
        assert_int_equal(wal_close(w), 0);

        size_t len;
        char *data = slurp(f->wal, &len);
        assert_int_equal(count_lines(data, len), THREADS * PER_THREAD);
        char *ids[THREADS * PER_THREAD];
        size_t n = 0;
        struct kjson_arena *a = kjson_arena_new();
        assert_non_null(a);
        char *line = data;
        while (line < data + len) {
                char *nl = memchr(line, '\n', (size_t)(data + len - line));
                assert_non_null(nl);
                size_t ll = (size_t)(nl - line);
                assert_true(crc_ok(line, ll));
                struct kjson *v = NULL;
                struct kjson_error err;
                assert_int_equal(kjson_parse(a, line, ll, &v, &err), 0);
                assert_int_equal(v->type, KJSON_OBJECT);
                assert_string_equal(kjson_get_str(v, "op"), "append");
                const char *sid = kjson_get_str(v, "step_id");
                assert_non_null(sid);
                char key[64];
                snprintf(key, sizeof(key), "mnd_x/%s", sid);
                assert_string_equal(kjson_get_str(v, "idem_key"), key);
                assert_true(n < THREADS * PER_THREAD);
                ids[n++] = strdup(sid);
                line = nl + 1;
        }
        kjson_arena_free(a);
        assert_int_equal(n, THREADS * PER_THREAD);
        qsort(ids, n, sizeof(ids[0]), cmp_str);
        for (size_t i = 1; i < n; i++)
                assert_true(strcmp(ids[i - 1], ids[i]) < 0);
        for (size_t i = 0; i < n; i++)
                free(ids[i]);
        free(data);
}

/* Two good records written by the WAL itself. */
static void write_two_records(struct fx *f)
{
        struct wal *w = NULL;
        struct wal_options opt = { .now_ms = fixed_clock, .clock_ctx = &f->now };
        assert_int_equal(wal_open(f->wal, &opt, &w, NULL), 0);
        assert_int_equal(wal_append_pending(w, "observe_001", "plan_x", "mnd_x/observe_001"), 0);
        assert_int_equal(wal_mark_executing(w, "observe_001", "pre"), 0);
        assert_int_equal(wal_flush(w), 0);
        assert_int_equal(wal_close(w), 0);
}

/* at_dir (recovery at start): the WAL is opened by its name relative to the
 * directory it was handed, not by its whole path: here another directory
 * holding a WAL of the same name with one record more is the one read and
 * appended to. */
static void test_exists_at_dir_opens_by_name(void **state)
{
        struct fx *f = *state;
        write_two_records(f);
        size_t len;
        char *two = slurp(f->wal, &len);
        char other[128], other_wal[256];
        snprintf(other, sizeof other, "%s/other", f->dir);
        assert_int_equal(mkdir(other, 0700), 0);
        const char *name = strrchr(f->wal, '/') + 1;
        snprintf(other_wal, sizeof other_wal, "%s/%s", other, name);
        struct kbuf three = KBUF_INIT;
        struct wal_record rec = { .op = WAL_OP_COMPLETED, .step_id = "observe_001",
                                  .post_hash = "post", .result_hash = "rh" };
        assert_int_equal(kbuf_append(&three, two, len), 0);
        assert_int_equal(wal_encode(&rec, TS_MS, &three), 0);
        spit(other_wal, three.data, three.len);
        int dfd = open(other, O_PATH | O_DIRECTORY | O_CLOEXEC);
        assert_true(dfd >= 0);

        f->opt.exists = true;
        f->opt.at_dir = true;
        f->opt.dir_fd = dfd;
        struct wal *w = NULL;
        struct fold *fo = NULL;
        struct wal_open_info info;
        assert_int_equal(wal_open_folded(f->wal, &f->opt, &w, &info, &fo), 0);
        assert_int_equal(f->rec.calls[OP_OPEN], 1);
        char want[300];
        snprintf(want, sizeof want, "openat %s APPEND", name);
        assert_true(log_find(&f->rec, 0, want) >= 0);
        assert_int_equal(fo->records, 3);       /* the other directory's file */
        fold_free(fo);
        assert_int_equal(wal_mark_executing(w, "orient_001", "pre"), 0);
        assert_int_equal(wal_flush(w), 0);
        assert_int_equal(wal_close(w), 0);
        close(dfd);
        size_t n;
        char *after = slurp(other_wal, &n);
        assert_true(n > three.len);
        assert_memory_equal(after, three.data, three.len);
        free(after);
        char *same = slurp(f->wal, &n);     /* the path's own file: untouched */
        assert_int_equal(n, len);
        assert_memory_equal(same, two, len);
        free(same);
        free(two);
        kbuf_free(&three);
}

static void test_torn_tail_repaired(void **state)
{
        struct fx *f = *state;
        write_two_records(f);
        size_t good_len;
        char *good = slurp(f->wal, &good_len);

        /* a torn write: a prefix of the third record, no newline */
        struct wal_record third = { .op = WAL_OP_COMPLETED, .step_id = "observe_001",
                                    .post_hash = "post", .result_hash = "rh" };
        char *third_line = enc(&third);
        size_t frag_len = strlen(third_line) / 2;
        struct kbuf torn = KBUF_INIT;
        assert_int_equal(kbuf_append(&torn, good, good_len), 0);
        assert_int_equal(kbuf_append(&torn, third_line, frag_len), 0);
        spit(f->wal, torn.data, torn.len);

        struct wal *w = NULL;
        struct wal_open_info info;
        assert_int_equal(wal_open(f->wal, &f->opt, &w, &info), 0);
        assert_int_equal(wal_state(w), WAL_STATE_OK);
        assert_true(info.torn_repaired);
        assert_false(info.corrupt);
        assert_false(info.created);
        assert_int_equal(info.torn_bytes, frag_len);
        char torn_path[300];
        snprintf(torn_path, sizeof(torn_path), "%s.torn.1776686400", f->wal);
        assert_string_equal(info.torn_path, torn_path);

        /* the fragment is kept, durably, before the WAL is cut */
        size_t tl;
        char *kept = slurp(torn_path, &tl);
        assert_non_null(kept);
        assert_int_equal(tl, frag_len);
        assert_memory_equal(kept, third_line, frag_len);
        free(kept);
        char want[400];
        snprintf(want, sizeof(want), "open %s", torn_path);
        int i = log_find(&f->rec, 0, want);
        assert_true(i >= 0);
        i = log_find(&f->rec, i, "fdatasync");
        assert_true(i >= 0);
        snprintf(want, sizeof(want), "fsync_dir %s/wal", f->dir);
        i = log_find(&f->rec, i, want);
        assert_true(i >= 0);
        snprintf(want, sizeof(want), "ftruncate %zu", good_len);
        i = log_find(&f->rec, i, want);
        assert_true(i >= 0);
        assert_true(log_find(&f->rec, i, "fdatasync") > i);

        /* the file ends at the last good record */
        size_t cut_len;
        char *cut = slurp(f->wal, &cut_len);
        assert_int_equal(cut_len, good_len);
        assert_memory_equal(cut, good, good_len);
        free(cut);

        /* the next append reads back as a whole line (the original glued it to
         * the fragment and lost it) */
        assert_int_equal(wal_mark_completed(w, "observe_001", "post", "rh", false, NULL, NULL), 0);
        assert_int_equal(wal_flush(w), 0);
        assert_int_equal(wal_close(w), 0);
        size_t len;
        char *after = slurp(f->wal, &len);
        assert_int_equal(len, good_len + strlen(third_line));
        assert_memory_equal(after + good_len, third_line, strlen(third_line));
        struct fold *fo = NULL;
        assert_int_equal(fold_buffer(after, len, &fo), 0);
        assert_int_equal(fo->status, FOLD_CLEAN);
        assert_int_equal(fo->records, 3);
        fold_free(fo);

        /* a second torn repair in the same second keeps the first one's bytes */
        assert_int_equal(kbuf_append(&torn, "", 0), 0);
        kbuf_reset(&torn);
        assert_int_equal(kbuf_append(&torn, after, len), 0);
        assert_int_equal(kbuf_puts(&torn, "{\"op\":\"tra"), 0);
        spit(f->wal, torn.data, torn.len);
        assert_int_equal(wal_open(f->wal, &f->opt, &w, &info), 0);
        assert_true(info.torn_repaired);
        assert_string_not_equal(info.torn_path, torn_path);
        kept = slurp(info.torn_path, &tl);
        assert_int_equal(tl, 10);
        free(kept);
        kept = slurp(torn_path, &tl);
        assert_int_equal(tl, frag_len);
        free(kept);
        assert_int_equal(wal_close(w), 0);

        free(after);
        free(third_line);
        free(good);
        kbuf_free(&torn);
}

/* A WAL the caller knows exists (recovery): one open, read and appended
 * through that one descriptor; its fold handed back; a torn tail cut through
 * it; gone meanwhile, created as usual. */
static void test_exists_one_open(void **state)
{
        struct fx *f = *state;
        write_two_records(f);
        size_t good_len;
        char *good = slurp(f->wal, &good_len);
        f->opt.exists = true;
        /* an access time older than its change: a plain read would update it */
        struct timespec times[2] = { { .tv_sec = 1000000000 }, { .tv_nsec = UTIME_OMIT } };
        assert_int_equal(utimensat(AT_FDCWD, f->wal, times, 0), 0);
        struct stat st;

        struct wal *w = NULL;
        struct fold *fo = NULL;
        struct wal_open_info info;
        assert_int_equal(wal_open_folded(f->wal, &f->opt, &w, &info, &fo), 0);
        assert_int_equal(f->rec.calls[OP_OPEN], 1);
        assert_non_null(fo);
        assert_int_equal(fo->records, 2);
        assert_false(info.created);
        fold_free(fo);
        assert_int_equal(wal_mark_completed(w, "observe_001", "post", "rh", false, NULL, NULL), 0);
        assert_int_equal(wal_flush(w), 0);
        assert_int_equal(wal_close(w), 0);
        assert_int_equal(f->rec.calls[OP_OPEN], 1);
        assert_int_equal(stat(f->wal, &st), 0);
        assert_int_equal(st.st_atime, 1000000000); /* read without touching its atime */
        size_t len;
        char *after = slurp(f->wal, &len);
        assert_true(len > good_len);
        assert_memory_equal(after, good, good_len);
        assert_int_equal(fold_buffer(after, len, &fo), 0);
        assert_int_equal(fo->status, FOLD_CLEAN);
        assert_int_equal(fo->records, 3);
        fold_free(fo);

        /* torn: the fragment kept, the WAL cut, through the same descriptor */
        struct kbuf torn = KBUF_INIT;
        assert_int_equal(kbuf_append(&torn, after, len), 0);
        assert_int_equal(kbuf_append(&torn, "{\"op\":\"comp", 12), 0);
        spit(f->wal, torn.data, torn.len);
        rec_init(&f->rec);
        assert_int_equal(wal_open(f->wal, &f->opt, &w, &info), 0);
        assert_true(info.torn_repaired);
        assert_int_equal(info.torn_bytes, 12);
        assert_int_equal(f->rec.calls[OP_OPEN], 2); /* the WAL and its .torn file */
        assert_int_equal(wal_mark_executing(w, "orient_001", "pre"), 0);
        assert_int_equal(wal_flush(w), 0);
        assert_int_equal(wal_close(w), 0);
        char *cut = slurp(f->wal, &good_len);
        assert_memory_equal(cut, after, len);
        assert_int_equal(fold_buffer(cut, good_len, &fo), 0);
        assert_int_equal(fo->status, FOLD_CLEAN);
        assert_int_equal(fo->records, 4);
        fold_free(fo);
        free(cut);
        kbuf_free(&torn);
        free(after);
        free(good);

        /* gone: created, its directory synced */
        assert_int_equal(unlink(f->wal), 0);
        rec_init(&f->rec);
        assert_int_equal(wal_open(f->wal, &f->opt, &w, &info), 0);
        assert_true(info.created);
        assert_int_equal(f->rec.calls[OP_OPEN], 2); /* ENOENT, then O_EXCL */
        assert_int_equal(f->rec.calls[OP_FSYNC_DIR], 1);
        assert_int_equal(wal_close(w), 0);
}

static void test_corrupt_quarantined(void **state)
{
        struct fx *f = *state;
        write_two_records(f);
        size_t len;
        char *good = slurp(f->wal, &len);
        char *nl = memchr(good, '\n', len);
        size_t first_len = (size_t)(nl - good) + 1;
        /* garbage between the two good records */
        struct kbuf bad = KBUF_INIT;
        assert_int_equal(kbuf_append(&bad, good, first_len), 0);
        assert_int_equal(kbuf_puts(&bad, "garbage that is not json\n"), 0);
        assert_int_equal(kbuf_append(&bad, good + first_len, len - first_len), 0);
        spit(f->wal, bad.data, bad.len);

        struct wal *w = NULL;
        struct wal_open_info info;
        assert_int_equal(wal_open(f->wal, &f->opt, &w, &info), 0);
        assert_int_equal(wal_state(w), WAL_STATE_QUARANTINED);
        assert_int_equal(wal_error(w), 0); /* not an I/O failure */
        assert_true(info.corrupt);
        assert_false(info.torn_repaired);
        assert_int_equal(info.bad_line, 2);
        assert_int_equal(info.bad_offset, first_len);
        assert_true(strlen(info.bad_reason) > 0);

        int writes = f->rec.calls[OP_WRITE];
        assert_int_equal(wal_mark_reset(w, "observe_001"), -EBADMSG);
        assert_int_equal(wal_append_pending(w, "x", "p", "k"), -EBADMSG);
        assert_int_equal(wal_flush(w), -EBADMSG);
        assert_int_equal(f->rec.calls[OP_WRITE], writes);
        assert_int_equal(f->rec.calls[OP_FTRUNCATE], 0);
        assert_int_equal(f->rec.calls[OP_FDATASYNC], 0);
        assert_int_equal(wal_close(w), 0);

        size_t after_len;
        char *after = slurp(f->wal, &after_len);
        assert_int_equal(after_len, bad.len);
        assert_memory_equal(after, bad.data, bad.len);
        char torn_path[300];
        snprintf(torn_path, sizeof(torn_path), "%s.torn.1776686400", f->wal);
        assert_false(exists(torn_path));

        /* a quarantined WAL is not archived either */
        assert_int_equal(wal_open(f->wal, &f->opt, &w, NULL), 0);
        char arch[200];
        snprintf(arch, sizeof(arch), "%s/archive", f->dir);
        char *dest = (char *)1;
        assert_int_equal(wal_archive(w, arch, &dest), -EBADMSG);
        assert_null(dest);
        assert_true(exists(f->wal));

        free(after);
        free(good);
        kbuf_free(&bad);
}

static void test_closed_refuses(void **state)
{
        struct fx *f = *state;
        struct wal *w = NULL;
        assert_int_equal(wal_open(f->wal, &f->opt, &w, NULL), 0);
        assert_int_equal(wal_mark_reset(w, "s"), 0);
        assert_int_equal(wal_shutdown(w), 0);
        assert_int_equal(wal_state(w), WAL_STATE_CLOSED);
        int writes = f->rec.calls[OP_WRITE];
        assert_int_equal(wal_mark_reset(w, "s"), -EBADF);
        assert_int_equal(wal_flush(w), -EBADF);
        assert_int_equal(f->rec.calls[OP_WRITE], writes);
        assert_int_equal(f->rec.calls[OP_FDATASYNC], 0);
        assert_int_equal(wal_shutdown(w), 0); /* idempotent */
        assert_int_equal(f->rec.calls[OP_CLOSE], 1);
        assert_int_equal(wal_close(w), 0);
        size_t len;
        char *got = slurp(f->wal, &len);
        assert_int_equal(count_lines(got, len), 1);
        free(got);
}

static void test_write_eio_fails_wal(void **state)
{
        struct fx *f = *state;
        struct wal *w = NULL;
        assert_int_equal(wal_open(f->wal, &f->opt, &w, NULL), 0);
        f->rec.fail_op = OP_WRITE;
        f->rec.fail_nth = 3;
        f->rec.fail_err = -EIO;
        assert_int_equal(wal_mark_reset(w, "a"), 0);
        assert_int_equal(wal_mark_reset(w, "b"), 0);
        size_t good_len;
        char *good = slurp(f->wal, &good_len);
        assert_int_equal(wal_mark_reset(w, "c"), -EIO);
        assert_int_equal(wal_state(w), WAL_STATE_FAILED);
        assert_int_equal(wal_error(w), -EIO);
        char want[64];
        snprintf(want, sizeof(want), "ftruncate %zu", good_len);
        assert_true(log_find(&f->rec, 0, want) >= 0);

        /* sticky: no more writes, no fdatasync, the same error */
        f->rec.fail_op = -1;
        int writes = f->rec.calls[OP_WRITE];
        assert_int_equal(wal_mark_reset(w, "d"), -EIO);
        assert_int_equal(wal_mark_reset(w, NULL), -EIO); /* even for a bad record */
        assert_int_equal(wal_flush(w), -EIO);
        assert_int_equal(f->rec.calls[OP_WRITE], writes);
        assert_int_equal(f->rec.calls[OP_FDATASYNC], 0);
        assert_int_equal(wal_close(w), 0);

        size_t len;
        char *got = slurp(f->wal, &len);
        assert_int_equal(len, good_len);
        assert_memory_equal(got, good, len);
        free(got);
        free(good);
}

static void test_short_write_truncated(void **state)
{
        struct fx *f = *state;
        struct wal *w = NULL;
        assert_int_equal(wal_open(f->wal, &f->opt, &w, NULL), 0);
        assert_int_equal(wal_mark_reset(w, "a"), 0);
        size_t good_len;
        char *good = slurp(f->wal, &good_len);

        /* write 2 lands half the line, write 3 (the rest) hits ENOSPC */
        f->rec.short_nth = 2;
        f->rec.fail_op = OP_WRITE;
        f->rec.fail_nth = 3;
        f->rec.fail_err = -ENOSPC;
        assert_int_equal(wal_mark_completed(w, "a", "post", "rh", false, NULL, NULL), -ENOSPC);
        assert_int_equal(f->rec.calls[OP_WRITE], 3);
        assert_int_equal(wal_state(w), WAL_STATE_FAILED);
        assert_int_equal(wal_error(w), -ENOSPC);

        /* no partial line is left behind */
        size_t len;
        char *got = slurp(f->wal, &len);
        assert_int_equal(len, good_len);
        assert_memory_equal(got, good, len);
        free(got);
        char want[64];
        snprintf(want, sizeof(want), "ftruncate %zu", good_len);
        assert_true(log_find(&f->rec, 0, want) >= 0);

        assert_int_equal(wal_mark_reset(w, "b"), -ENOSPC);
        assert_int_equal(wal_flush(w), -ENOSPC);
        assert_int_equal(f->rec.calls[OP_FDATASYNC], 0);
        assert_int_equal(wal_close(w), 0);
        free(good);
}

static void test_fdatasync_eio_never_retried(void **state)
{
        struct fx *f = *state;
        struct wal *w = NULL;
        assert_int_equal(wal_open(f->wal, &f->opt, &w, NULL), 0);
        f->rec.fail_op = OP_FDATASYNC;
        f->rec.fail_nth = 1;
        f->rec.fail_err = -EIO;
        assert_int_equal(wal_mark_reset(w, "a"), 0);
        assert_int_equal(wal_flush(w), -EIO);
        assert_int_equal(f->rec.calls[OP_FDATASYNC], 1);
        assert_int_equal(wal_flush_count(w), 1);
        assert_int_equal(wal_state(w), WAL_STATE_FAILED);
        assert_int_equal(wal_error(w), -EIO);

        /* the kernel may have dropped the pages: never fdatasync again */
        f->rec.fail_op = -1;
        assert_int_equal(wal_flush(w), -EIO);
        assert_int_equal(f->rec.calls[OP_FDATASYNC], 1);
        int writes = f->rec.calls[OP_WRITE];
        assert_int_equal(wal_mark_reset(w, "b"), -EIO);
        assert_int_equal(f->rec.calls[OP_WRITE], writes);
        assert_int_equal(wal_flush(w), -EIO);
        assert_int_equal(f->rec.calls[OP_FDATASYNC], 1);
        assert_int_equal(wal_flush_count(w), 1);
        assert_int_equal(wal_close(w), 0);
}

static void test_eintr_write_retried(void **state)
{
        struct fx *f = *state;
        struct wal *w = NULL;
        assert_int_equal(wal_open(f->wal, &f->opt, &w, NULL), 0);
        f->rec.eintr_nth = 1;
        assert_int_equal(wal_mark_executing(w, "s", "pre"), 0);
        assert_int_equal(f->rec.calls[OP_WRITE], 2);
        assert_int_equal(wal_state(w), WAL_STATE_OK);
        assert_int_equal(wal_flush(w), 0);
        assert_int_equal(wal_close(w), 0);
        struct wal_record r = { .op = WAL_OP_EXECUTING, .step_id = "s", .pre_hash = "pre" };
        char *want = enc(&r);
        size_t len;
        char *got = slurp(f->wal, &len);
        assert_int_equal(len, strlen(want));
        assert_memory_equal(got, want, len);
        free(got);
        free(want);
}

static void test_open_failures(void **state)
{
        struct fx *f = *state;
        struct wal *w = (struct wal *)1;
        /* the parent fsync on creation failing is an error */
        f->rec.fail_op = OP_FSYNC_DIR;
        f->rec.fail_nth = 0;
        f->rec.fail_err = -EIO;
        assert_int_equal(wal_open(f->wal, &f->opt, &w, NULL), -EIO);
        assert_null(w);
        f->rec.fail_op = OP_OPEN;
        f->rec.fail_err = -EACCES;
        char other[200];
        snprintf(other, sizeof(other), "%s/other.wal.jsonl", f->dir);
        assert_int_equal(wal_open(other, &f->opt, &w, NULL), -EACCES);
        assert_null(w);
        assert_int_equal(wal_open(NULL, &f->opt, &w, NULL), -EINVAL);
        assert_int_equal(wal_open("", &f->opt, &w, NULL), -EINVAL);
}

/* ---- archive --------------------------------------------------------------- */

static void test_archive(void **state)
{
        struct fx *f = *state;
        struct wal *w = NULL;
        assert_int_equal(wal_open(f->wal, &f->opt, &w, NULL), 0);
        for (int i = 0; i < 50; i++) {
                assert_int_equal(wal_mark_executing(w, "observe_001", "pre"), 0);
                assert_int_equal(wal_mark_failed(w, "observe_001", "E", "again and again"), 0);
        }
        assert_int_equal(wal_flush(w), 0);
        size_t len;
        char *orig = slurp(f->wal, &len);

        char arch[200], want_dest[260], tmp[270], want[600];
        snprintf(arch, sizeof(arch), "%s/archive/sub", f->dir);
        snprintf(want_dest, sizeof(want_dest), "%s/mnd_plan_ae607245ac43.wal.jsonl.gz", arch);
        snprintf(tmp, sizeof(tmp), "%s.tmp", want_dest);
        rec_init(&f->rec);
        char *dest = NULL;
        assert_int_equal(wal_archive(w, arch, &dest), 0);
        assert_non_null(dest);
        assert_string_equal(dest, want_dest);
        assert_false(exists(f->wal));
        assert_false(exists(tmp));

        /* gunzip: identical bytes */
        gzFile gz = gzopen(dest, "rb");
        assert_non_null(gz);
        char *back = malloc(len + 16);
        assert_non_null(back);
        int n = gzread(gz, back, (unsigned)len + 16);
        assert_int_equal(n, (int)len);
        assert_memory_equal(back, orig, len);
        assert_int_equal(gzclose(gz), Z_OK);
        struct stat st;
        assert_int_equal(stat(dest, &st), 0);
        assert_true((size_t)st.st_size < len); /* it is compressed */

        /* order: archive durable (tmp written, fdatasync, renamed, dir fsynced)
         * before the WAL is unlinked and its directory fsynced */
        snprintf(want, sizeof(want), "open %s TRUNC", tmp);
        int i = log_find(&f->rec, 0, want);
        assert_true(i >= 0);
        i = log_find(&f->rec, i, "fdatasync");
        assert_true(i >= 0);
        snprintf(want, sizeof(want), "rename %s %s", tmp, want_dest);
        i = log_find(&f->rec, i, want);
        assert_true(i >= 0);
        snprintf(want, sizeof(want), "fsync_dir %s", arch);
        i = log_find(&f->rec, i, want);
        assert_true(i >= 0);
        snprintf(want, sizeof(want), "unlink %s", f->wal);
        i = log_find(&f->rec, i, want);
        assert_true(i >= 0);
        snprintf(want, sizeof(want), "fsync_dir %s/wal", f->dir);
        assert_true(log_find(&f->rec, i, want) > i);
        /* the created archive dirs were fsynced into their parents */
        snprintf(want, sizeof(want), "fsync_dir %s", f->dir);
        assert_true(log_find(&f->rec, 0, want) >= 0);

        free(back);
        free(orig);
        free(dest);
}

/* The first half of a batched archive: the archive written from the bytes
 * given (or the file), renamed into place, nothing synced, the WAL kept. */
static void test_archive_stage(void **state)
{
        struct fx *f = *state;
        struct wal *w = NULL;
        assert_int_equal(wal_open(f->wal, &f->opt, &w, NULL), 0);
        assert_int_equal(wal_mark_executing(w, "observe_001", "pre"), 0);
        assert_int_equal(wal_flush(w), 0);
        assert_int_equal(wal_close(w), 0);
        size_t len;
        char *orig = slurp(f->wal, &len);
        char arch[200];
        snprintf(arch, sizeof(arch), "%s/archive", f->dir);
        assert_int_equal(mkdir(arch, 0700), 0); /* (creating it would sync its parent) */
        for (int from_bytes = 0; from_bytes < 2; from_bytes++) {
                rec_init(&f->rec);
                char *dest = NULL;
                if (from_bytes)
                        assert_int_equal(wal_archive_stage_bytes(&f->io, f->wal, orig, len, arch,
                                                                 &dest), 0);
                else
                        assert_int_equal(wal_archive_stage(&f->io, f->wal, arch, &dest), 0);
                assert_non_null(dest);
                assert_true(exists(f->wal));
                for (int i = 0; i < f->rec.n; i++) {
                        if (strncmp(f->rec.log[i], "fdatasync", 9) == 0 ||
                            strncmp(f->rec.log[i], "fsync", 5) == 0 ||
                            strncmp(f->rec.log[i], "unlink", 6) == 0)
                                fail_msg("staging synced or unlinked: %s", f->rec.log[i]);
                        /* the directory is there: not made again per archive */
                        if (strncmp(f->rec.log[i], "mkdir", 5) == 0)
                                fail_msg("staging into an existing directory: %s", f->rec.log[i]);
                }
                char want[600];
                snprintf(want, sizeof want, "rename %s.tmp %s", dest, dest);
                assert_true(log_find(&f->rec, 0, want) >= 0);
                gzFile gz = gzopen(dest, "rb");
                assert_non_null(gz);
                char back[4096];
                int n = gzread(gz, back, sizeof back);
                assert_int_equal(n, (int)len);
                assert_memory_equal(back, orig, len);
                assert_int_equal(gzclose(gz), Z_OK);
                free(dest);
        }
        assert_int_equal(wal_archive_stage_bytes(&f->io, f->wal, NULL, 0, arch, NULL), -EINVAL);
        free(orig);
}

static void test_archive_failure_keeps_wal(void **state)
{
        struct fx *f = *state;
        struct wal *w = NULL;
        assert_int_equal(wal_open(f->wal, &f->opt, &w, NULL), 0);
        assert_int_equal(wal_mark_reset(w, "s"), 0);
        assert_int_equal(wal_flush(w), 0);
        char arch[200], tmp[300];
        snprintf(arch, sizeof(arch), "%s/archive", f->dir);
        snprintf(tmp, sizeof(tmp), "%s/mnd_plan_ae607245ac43.wal.jsonl.gz.tmp", arch);
        f->rec.fail_op = OP_FDATASYNC;
        f->rec.fail_nth = 2; /* the archive's, not the WAL's */
        f->rec.fail_err = -EIO;
        char *dest = NULL;
        assert_int_equal(wal_archive(w, arch, &dest), -EIO);
        assert_null(dest);
        assert_true(exists(f->wal));
        assert_false(exists(tmp));
        assert_int_equal(f->rec.calls[OP_UNLINK], 1); /* the tmp only */

        /* the file-level entry point works on a path */
        f->rec.fail_op = -1;
        assert_int_equal(wal_archive_file(&f->io, f->wal, arch, NULL), 0);
        assert_false(exists(f->wal));
        assert_int_equal(wal_archive_file(&f->io, f->wal, arch, NULL), -ENOENT);
}


/* ---- the barrier hook of cluster mode ---- */

struct sink {
        int calls;
        int64_t first_seq[8];
        struct kbuf got;
        int fail;           /* returned by the next call (then 0) */
};

static int sink_barrier(void *ctx, int64_t first_seq, const char *lines, size_t len)
{
        struct sink *k = ctx;
        if (k->calls < 8)
                k->first_seq[k->calls] = first_seq;
        k->calls++;
        if (k->fail) {
                int e = k->fail;
                k->fail = 0;
                return e;
        }
        assert_true(len > 0);
        assert_int_equal(lines[len - 1], '\n');
        assert_int_equal(kbuf_append(&k->got, lines, len), 0);
        return 0;
}

static void test_barrier_hook_replaces_fdatasync(void **state)
{
        struct fx *f = *state;
        struct sink k = { .got = KBUF_INIT };
        struct wal_options o = f->opt;
        o.barrier = sink_barrier;
        o.barrier_ctx = &k;
        struct wal *w = NULL;
        assert_int_equal(wal_open(f->wal, &o, &w, NULL), 0);
        assert_int_equal(wal_flush(w), 0); /* nothing pending: no barrier */
        assert_int_equal(k.calls, 0);
        assert_int_equal(wal_append_pending(w, "observe_001", "plan_x", "k"), 0);
        assert_int_equal(wal_mark_executing(w, "observe_001", "pre"), 0);
        assert_int_equal(wal_flush(w), 0);
        assert_int_equal(k.calls, 1);
        assert_int_equal(k.first_seq[0], 1);
        assert_int_equal(wal_records(w), 2);
        assert_int_equal(f->rec.calls[OP_FDATASYNC], 0);
        assert_int_equal(wal_close(w), 0);
        /* reopened, the records already in the file are counted */
        assert_int_equal(wal_open(f->wal, &o, &w, NULL), 0);
        assert_int_equal(wal_records(w), 2);
        assert_int_equal(wal_mark_completed(w, "observe_001", "post", "rh", false, NULL, NULL),
                         0);
        assert_int_equal(wal_flush(w), 0);
        assert_int_equal(k.first_seq[1], 3);
        size_t len;
        char *file = slurp(f->wal, &len);
        /* the sink got exactly the file's bytes, barrier by barrier */
        assert_int_equal(k.got.len, len);
        assert_memory_equal(k.got.data, file, len);
        free(file);
        /* a refused barrier fails the WAL with its error */
        assert_int_equal(wal_mark_reset(w, "observe_001"), 0);
        k.fail = -ESTALE;
        assert_int_equal(wal_flush(w), -ESTALE);
        assert_int_equal(wal_state(w), WAL_STATE_FAILED);
        assert_int_equal(wal_mark_reset(w, "observe_001"), -ESTALE);
        assert_int_equal(wal_flush(w), -ESTALE);
        assert_int_equal(k.calls, 3);
        assert_int_equal(f->rec.calls[OP_FDATASYNC], 0);
        assert_int_equal(wal_close(w), 0);
        kbuf_free(&k.got);
}

static void test_encode_owner(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        struct wal_record r = { .op = WAL_OP_OWNER, .mandate_id = "mnd_x", .node = "n2",
                                .epoch = 3, .prev_owner = "n1" };
        assert_int_equal(wal_encode(&r, TS_MS, &b), 0);
        assert_non_null(strstr(b.data, "{\"op\":\"owner\",\"mandate_id\":\"mnd_x\",\"node\":\"n2\","
                                        "\"epoch\":3,\"prev_owner\":\"n1\",\"ts\":"));
        struct fold *fo = NULL;
        assert_int_equal(fold_buffer(b.data, b.len, &fo), 0);
        assert_int_equal(fo->status, FOLD_CLEAN);
        assert_int_equal(fo->owner_records, 1);
        assert_int_equal(fo->unknown_ops, 0);
        fold_free(fo);
        b.len = 0;
        r.epoch = 0;
        assert_int_equal(wal_encode(&r, TS_MS, &b), -EINVAL);
        assert_string_equal(wal_encode_error(), "owner needs epoch >= 1");
        r.epoch = 1;
        r.node = NULL;
        assert_int_equal(wal_encode(&r, TS_MS, &b), -EINVAL);
        kbuf_free(&b);
}

/* keep_appended: the lines appended come back from memory, byte for byte
 * what the file holds after the offset given; a reopen starts at the end;
 * without the option, or after a failed write, -ENODATA. */
static void test_take_appended(void **state)
{
        struct fx *f = *state;
        struct wal *w = NULL;
        struct kbuf b = KBUF_INIT;
        uint64_t at = 99;
        assert_int_equal(wal_open(f->wal, &f->opt, &w, NULL), 0);
        assert_int_equal(wal_mark_reset(w, "a"), 0);
        assert_int_equal(wal_take_appended(w, &b, &at), -ENODATA);
        assert_int_equal(b.len, 0);
        assert_int_equal(wal_close(w), 0);

        struct wal_options o = f->opt;
        o.keep_appended = true;
        size_t len0;
        char *file = slurp(f->wal, &len0);
        free(file);
        assert_int_equal(wal_open(f->wal, &o, &w, NULL), 0);
        assert_int_equal(wal_take_appended(w, &b, &at), 0);
        assert_int_equal(at, len0);
        assert_int_equal(b.len, 0);
        assert_int_equal(wal_mark_reset(w, "b"), 0);
        assert_int_equal(wal_mark_reset(w, "c"), 0);
        assert_int_equal(wal_take_appended(w, &b, &at), 0);
        assert_int_equal(at, len0);
        size_t len;
        file = slurp(f->wal, &len);
        assert_int_equal(b.len, len - len0);
        assert_memory_equal(b.data, file + len0, b.len);
        free(file);
        struct kbuf nonempty = b;
        assert_int_equal(wal_take_appended(w, &nonempty, &at), -EINVAL);
        kbuf_free(&b);
        /* taken once: the next take starts after them */
        assert_int_equal(wal_mark_reset(w, "d"), 0);
        assert_int_equal(wal_take_appended(w, &b, &at), 0);
        assert_int_equal(at, len);
        assert_non_null(strstr(b.data, "\"step_id\":\"d\""));
        kbuf_free(&b);
        /* a failed write keeps nothing of its line */
        f->rec.fail_op = OP_WRITE;
        f->rec.fail_nth = f->rec.calls[OP_WRITE] + 1;
        f->rec.fail_err = -ENOSPC;
        assert_int_equal(wal_mark_reset(w, "e"), -ENOSPC);
        assert_int_equal(wal_take_appended(w, &b, &at), 0);
        assert_int_equal(b.len, 0);
        assert_int_equal(wal_close(w), 0);
        kbuf_free(&b);
}

/* A result already written compactly from its parse (result_compact) is
 * copied by length: the line is byte for byte the one the encoder makes when
 * it parses the text itself, and the text is not read again (what is given
 * is what is written, so a text that is not compact shows the copy). */
static void test_encode_compact_result(void **state)
{
        (void)state;
        static const char *const texts[] = {
                "null", "true", "-0", "1.50e+3", "123456789012345678901234567890",
                "\"a\\u00e9\\/\\u0000b\"", " [ 1 , { \"k\" : [ ] , \"a\" : 2.0 } ] ",
                "{\"z\":1,\"a\":{\"b\":[true,false,null,\"\\n\"]}}",
        };
        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
                struct kjson_arena *ar = kjson_arena_new();
                assert_non_null(ar);
                struct kjson *v = NULL;
                struct kjson_error err;
                assert_int_equal(kjson_parse(ar, texts[i], strlen(texts[i]), &v, &err), 0);
                struct kbuf compact = KBUF_INIT;
                assert_int_equal(kjson_write(&compact, v), 0);
                struct wal_record parsed = { .op = WAL_OP_COMPLETED, .step_id = "s1",
                                             .post_hash = "", .result_hash = "sha256-x",
                                             .evidence_json = "{\"e\": 1}",
                                             .result_json = texts[i] };
                struct wal_record given = parsed;
                given.result_json = compact.data;
                given.result_compact = true;
                char *a = enc(&parsed), *b = enc(&given);
                assert_string_equal(a, b);
                /* its length given: the same line */
                given.result_len = compact.len;
                char *c = enc(&given);
                assert_string_equal(a, c);
                free(a);
                free(b);
                free(c);
                kbuf_free(&compact);
                kjson_arena_free(ar);
        }
        struct wal_record r = { .op = WAL_OP_COMPLETED, .step_id = "s1", .post_hash = "",
                                .result_hash = "sha256-x", .result_json = "[1, 2]",
                                .result_compact = true };
        char *line = enc(&r);
        assert_non_null(strstr(line, ",\"result\":[1, 2],"));
        free(line);
        /* a length given is the length copied (the text need not end there) */
        r.result_json = "[1,2]TAIL";
        r.result_len = 5;
        line = enc(&r);
        assert_non_null(strstr(line, ",\"result\":[1,2],"));
        assert_null(strstr(line, "TAIL"));
        free(line);
}

/* ---- the encoder's fast paths against the plain ones --------------------- */

/* wal_format_ts as it was: gmtime_r and snprintf for every call. */
static void ref_format_ts(int64_t ts_ms, char out[32])
{
        int64_t secs = ts_ms / 1000;
        int64_t ms = ts_ms % 1000;
        if (ms < 0) {
                ms += 1000;
                secs--;
        }
        time_t t = (time_t)secs;
        struct tm tm;
        if (!gmtime_r(&t, &tm)) {
                memset(&tm, 0, sizeof(tm));
                tm.tm_year = 70;
                tm.tm_mday = 1;
        }
        char buf[128];
        snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)ms);
        size_t n = strnlen(buf, 31);
        memcpy(out, buf, n);
        out[n] = '\0';
}

static uint64_t rnd_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
        uint64_t x = rnd_state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        return rnd_state = x;
}

static unsigned rnd_n(unsigned n)
{
        return (unsigned)(rnd() % n);
}

static size_t diff_n(size_t dflt)
{
        const char *s = getenv("KAIROS_WAL_ENC_DIFF_N");
        return s && *s ? (size_t)strtoull(s, NULL, 10) : dflt;
}

static void expect_ts(int64_t ms)
{
        char got[32], want[32];
        memset(got, 'x', sizeof got);
        wal_format_ts(ms, got);
        ref_format_ts(ms, want);
        if (strcmp(got, want) != 0)
                fail_msg("ts %lld: got %s, want %s", (long long)ms, got, want);
}

/* The time kept per thread is the same text as gmtime_r's every time: in
 * one second and across seconds, before 1970, years beyond four digits or
 * before year 0, values gmtime_r refuses, back and forth between seconds. */
static void test_format_ts_same_as_gmtime(void **state)
{
        (void)state;
        static const int64_t fixed[] = {
                0, 1, 999, 1000, -1, -999, -1000, -1001, TS_MS, TS_MS + 1, TS_MS - 123,
                TS_MS - 124, 951782400007LL, 253402300799999LL /* 9999-12-31T23:59:59.999 */,
                253402300800000LL /* year 10000 */, -62167219200000LL /* year 0 */,
                -62167219200001LL /* year -1 */, -62198755200000LL, INT64_MAX, INT64_MIN,
                INT64_MAX - 999, INT64_MIN + 1000, 67767976233532799LL, 67767976233532LL * 1000,
        };
        for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
                expect_ts(fixed[i]);
                expect_ts(fixed[i]); /* again: from what was kept */
                expect_ts(TS_MS);
        }
        /* every millisecond of a few seconds, each second twice in turn */
        for (int64_t base = TS_MS - 2500; base < TS_MS + 2500; base += 7) {
                expect_ts(base);
                expect_ts(base + 1000);
                expect_ts(base);
        }
        size_t n = diff_n(20000);
        for (size_t i = 0; i < n; i++) {
                int64_t ms;
                switch (rnd_n(4)) {
                case 0: /* near now */
                        ms = TS_MS + (int64_t)rnd_n(86400000) - 43200000;
                        break;
                case 1: /* any year 0 .. 9999 and some beyond */
                        ms = (int64_t)(rnd() % 700000000000000ull) - 100000000000000LL;
                        break;
                case 2: /* anything */
                        ms = (int64_t)rnd();
                        break;
                default: /* the next millisecond or second */
                        ms = TS_MS + (int64_t)(i % 3000);
                        break;
                }
                expect_ts(ms);
        }
}

/* A JSON text in many spellings of its value: whitespace anywhere or
 * nowhere, every escape in several forms (\/, \u with either case, surrogate
 * pairs, \u0000), UTF-8 raw, numbers of any size, containers nested. */
static void gen_ws(struct kbuf *b, bool loose)
{
        static const char ws[] = " \t\n\r";
        if (loose && rnd_n(3) == 0)
                for (unsigned k = 1 + rnd_n(2); k > 0; k--)
                        assert_int_equal(kbuf_putc(b, ws[rnd_n(4)]), 0);
}

static void gen_string(struct kbuf *b, bool loose)
{
        static const char *const plain[] = { "a", "Z", " ", "0", "step", "sha256-", "{", "]",
                                             ":", ",", "'", "~", "\x7f", "\xc3\xa9",
                                             "\xe2\x80\xa8", "\xf0\x9f\x98\x80" };
        /* an escape and the forms it may take; the first is kbuf_json_string's */
        static const char *const esc[][4] = {
                { "\\\"", "\\u0022", NULL }, { "\\\\", "\\u005c", "\\u005C", NULL },
                { "/", "\\/", "\\u002f", NULL }, { "\\n", "\\u000a", "\\u000A", NULL },
                { "\\t", "\\u0009", NULL }, { "\\b", "\\u0008", NULL },
                { "\\f", "\\u000c", NULL }, { "\\r", "\\u000d", NULL },
                { "\\u0000", NULL }, { "\\u001f", "\\u001F", NULL }, { "\\u0001", NULL },
                { "\\u001b", "\\u001B", NULL }, { "\xc3\xa9", "\\u00e9", "\\u00E9", NULL },
                { "\xf0\x9f\x98\x80", "\\ud83d\\ude00", "\\uD83D\\uDE00", NULL },
                { "\xe2\x80\xa8", "\\u2028", NULL }, { "A", "\\u0041", NULL },
        };
        assert_int_equal(kbuf_putc(b, '"'), 0);
        for (unsigned k = rnd_n(8); k > 0; k--) {
                if (rnd_n(2)) {
                        assert_int_equal(kbuf_puts(b, plain[rnd_n(sizeof plain / sizeof plain[0])]), 0);
                        continue;
                }
                const char *const *forms = esc[rnd_n(sizeof esc / sizeof esc[0])];
                unsigned nforms = 0;
                while (nforms < 4 && forms[nforms])
                        nforms++;
                assert_int_equal(kbuf_puts(b, forms[loose ? rnd_n(nforms) : 0]), 0);
        }
        assert_int_equal(kbuf_putc(b, '"'), 0);
}

static void gen_value(struct kbuf *b, int depth, bool loose)
{
        static const char *const nums[] = {
                "0", "-0", "1", "-1", "1.50", "2.0", "1e5", "1E+5", "-2.5e-300", "0.000001",
                "123456789012345678901234567890", "-98765432109876543210987654321.0e-99999",
                "18446744073709551616", "9007199254740993",
        };
        gen_ws(b, loose);
        unsigned kind = rnd_n(depth < 5 ? 8 : 5);
        switch (kind) {
        case 0:
                assert_int_equal(kbuf_puts(b, (const char *[]){ "null", "true", "false" }[rnd_n(3)]), 0);
                break;
        case 1:
        case 2:
                assert_int_equal(kbuf_puts(b, nums[rnd_n(sizeof nums / sizeof nums[0])]), 0);
                break;
        case 3:
        case 4:
                gen_string(b, loose);
                break;
        default: {
                bool obj = kind != 5;
                assert_int_equal(kbuf_putc(b, obj ? '{' : '['), 0);
                for (unsigned i = 0, n = rnd_n(5); i < n; i++) {
                        if (i)
                                assert_int_equal(kbuf_putc(b, ','), 0);
                        if (obj) {
                                gen_ws(b, loose);
                                gen_string(b, loose);
                                gen_ws(b, loose);
                                assert_int_equal(kbuf_putc(b, ':'), 0);
                        }
                        gen_value(b, depth + 1, loose);
                }
                gen_ws(b, loose);
                assert_int_equal(kbuf_putc(b, obj ? '}' : ']'), 0);
                break;
        }
        }
        gen_ws(b, loose);
}

/* The line of a record with that evidence as the encoder wrote it before it
 * copied compact texts: the evidence parsed in an arena of its own and
 * written again by kjson_write, the rest of the line written here by hand. */
static char *ref_line(const char *head, const char *evidence, int64_t ts_ms)
{
        struct kjson_arena *a = kjson_arena_new();
        assert_non_null(a);
        struct kjson *v = NULL;
        struct kjson_error err;
        assert_int_equal(kjson_parse(a, evidence, strlen(evidence), &v, &err), 0);
        char ts[32];
        ref_format_ts(ts_ms, ts);
        struct kbuf b = KBUF_INIT;
        assert_int_equal(kbuf_puts(&b, head), 0);
        assert_int_equal(kbuf_puts(&b, ",\"evidence\":"), 0);
        assert_int_equal(kjson_write(&b, v), 0);
        assert_int_equal(kbuf_printf(&b, ",\"ts\":\"%s\"}", ts), 0);
        kjson_arena_free(a);
        char *line = with_crc(b.data);
        kbuf_free(&b);
        return line;
}

static void expect_evidence_line(const char *evidence, int64_t ts_ms)
{
        /* evidence is the last member before the time in these three */
        static const char *const heads[] = {
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"needs_review\","
                "\"reason\":\"r\"",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"pending\",\"reset\":true",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"completed\","
                "\"post_hash\":\"p\",\"result_hash\":\"h\",\"recovered\":true",
        };
        const struct wal_record recs[] = {
                { .op = WAL_OP_NEEDS_REVIEW, .step_id = "s1", .reason = "r",
                  .evidence_json = evidence },
                { .op = WAL_OP_RESET, .step_id = "s1", .evidence_json = evidence },
                { .op = WAL_OP_COMPLETED, .step_id = "s1", .post_hash = "p",
                  .result_hash = "h", .recovered = true, .evidence_json = evidence },
        };
        unsigned i = rnd_n(3);
        struct kbuf got = KBUF_INIT;
        /* (after something already in the buffer, as a WAL's pending bytes) */
        assert_int_equal(kbuf_puts(&got, "before\n"), 0);
        int r = wal_encode(&recs[i], ts_ms, &got);
        if (r != 0)
                fail_msg("evidence %s: %d %s", evidence, r, wal_encode_error());
        char *want = ref_line(heads[i], evidence, ts_ms);
        if (strcmp(got.data + 7, want) != 0)
                fail_msg("evidence %s:\n got %s want %s", evidence, got.data + 7, want);
        free(want);
        kbuf_free(&got);
}

/* wal_encode's evidence (and a result not marked compact) is the same line
 * as the parse and kjson_write of it in an arena of its own made: for texts
 * already compact (copied) and for any other spelling (written again), one
 * after another on the thread's kept arena, small and large, with refused
 * texts in between. */
static void test_encode_evidence_same_as_reparse(void **state)
{
        (void)state;
        static const char *const odd[] = {
                "{}", "[]", "null", "0", "\"\"", "{ }", "[ ]", " {}", "{} ", "\t[1]\n",
                "{\"a\":\"\\/\"}", "{\"a\":\"/\"}", "\"\\u00e9\"", "\"\\u00E9\"", "\"\xc3\xa9\"",
                "\"\\u001f\"", "\"\\u001F\"", "\"\\u000a\"", "\"\\n\"", "\"\\u0000\"",
                "\"\\ud83d\\ude00\"", "{\"\\u0041\":1}", "{\"A\":1}", "{\"a\":1,\"a\":2}",
                "[123456789012345678901234567890,-0,1E400,1.50]",
                "{\"reason\":\"interrupted_during_execution\",\"status\":\"executing\","
                "\"observed_pre_hash\":\"sha256-0\",\"expected_pre_hash\":\"sha256-1\"}",
                "{\"reason\":\"effects_journaled\",\"tool_calls\":[]}",
                " { \"why\" : [1, 2.50, \"x y\"], \"a\":null } ",
        };
        for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++)
                expect_evidence_line(odd[i], TS_MS + (int64_t)i);

        /* containers 128 deep are taken, 129 refused, as before */
        struct kbuf deep = KBUF_INIT;
        for (int i = 0; i < 129; i++)
                assert_int_equal(kbuf_putc(&deep, '['), 0);
        for (int i = 0; i < 129; i++)
                assert_int_equal(kbuf_putc(&deep, ']'), 0);
        struct wal_record r = { .op = WAL_OP_RESET, .step_id = "s1", .evidence_json = deep.data };
        struct kbuf b = KBUF_INIT;
        assert_int_equal(wal_encode(&r, TS_MS, &b), -EINVAL);
        assert_string_equal(wal_encode_error(), "evidence is not valid JSON");
        assert_int_equal(b.len, 0);
        /* (one pair less) */
        kbuf_truncate(&deep, deep.len - 1);
        expect_evidence_line(deep.data + 1, TS_MS);
        kbuf_free(&deep);

        /* larger than what a thread keeps an arena for: both spellings */
        struct kbuf big = KBUF_INIT, big_loose = KBUF_INIT;
        assert_int_equal(kbuf_puts(&big, "{\"x\":["), 0);
        assert_int_equal(kbuf_puts(&big_loose, "{ \"x\" : [ "), 0);
        for (int i = 0; i < 6000; i++) {
                assert_int_equal(kbuf_printf(&big, "%s\"v\\u0001%d\"", i ? "," : "", i), 0);
                assert_int_equal(kbuf_printf(&big_loose, "%s\"v\\u0001%d\" ", i ? ", " : "", i), 0);
        }
        assert_int_equal(kbuf_puts(&big, "]}"), 0);
        assert_int_equal(kbuf_puts(&big_loose, "] }"), 0);
        assert_true(big.len > 64 * 1024);
        expect_evidence_line(big.data, TS_MS);
        expect_evidence_line(big_loose.data, TS_MS);
        kbuf_free(&big);
        kbuf_free(&big_loose);

        static const char *const bad[] = { "", " ", "{", "{\"a\":}", "[1,2", "{} {}", "\"\xff\"",
                                           "\"\\ud83d\"", "01", "[1,]", "\"\\u00g0\"", "nul" };
        size_t n = diff_n(4000);
        for (size_t i = 0; i < n; i++) {
                bool loose = rnd_n(2);
                struct kbuf t = KBUF_INIT;
                gen_value(&t, 0, loose);
                expect_evidence_line(t.data, TS_MS + (int64_t)rnd_n(5000));
                /* its compact form, copied */
                struct kjson_arena *a = kjson_arena_new();
                assert_non_null(a);
                struct kjson *v = NULL;
                struct kjson_error err;
                assert_int_equal(kjson_parse(a, t.data, t.len, &v, &err), 0);
                struct kbuf c = KBUF_INIT;
                assert_int_equal(kjson_write(&c, v), 0);
                expect_evidence_line(c.data, TS_MS);
                /* a result not marked compact goes the same way */
                struct wal_record rc = { .op = WAL_OP_COMPLETED, .step_id = "s1", .post_hash = "p",
                                         .result_hash = "h", .result_json = t.data };
                char *got = enc(&rc);
                struct kbuf want = KBUF_INIT;
                assert_int_equal(kbuf_printf(&want,
                                             "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":"
                                             "\"completed\",\"post_hash\":\"p\",\"result_hash\":"
                                             "\"h\",\"result\":%s,\"ts\":\"" TS "\"}",
                                             c.data), 0);
                char *wl = with_crc(want.data);
                assert_string_equal(got, wl);
                free(wl);
                free(got);
                kbuf_free(&want);
                kbuf_free(&c);
                kjson_arena_free(a);
                kbuf_free(&t);
                if (i % 16 == 0) {
                        r.evidence_json = bad[rnd_n(sizeof bad / sizeof bad[0])];
                        assert_int_equal(wal_encode(&r, TS_MS, &b), -EINVAL);
                        assert_string_equal(wal_encode_error(), "evidence is not valid JSON");
                }
        }
        kbuf_free(&b);
}

static bool file_exists(const char *dir, const char *name)
{
        char p[300];
        struct stat st;
        snprintf(p, sizeof(p), "%s/%s", dir, name);
        return stat(p, &st) == 0;
}

static void put_file(const char *dir, const char *name, const char *data, size_t n)
{
        char p[300];
        snprintf(p, sizeof(p), "%s/%s", dir, name);
        FILE *fp = fopen(p, "wb");
        assert_non_null(fp);
        assert_int_equal(fwrite(data, 1, n, fp), n);
        fclose(fp);
}

/* Spares (docs/design.md §6): made with no sync, usable only once a sync
 * begun after them returned 0; a new WAL takes one by a rename with no
 * directory fsync; a spare holding records is adopted under its mandate's
 * name, a torn one removed, an empty one kept, a double never merged. */
static void test_spares(void **state)
{
        struct fx *f = *state;
        char waldir[200];
        snprintf(waldir, sizeof(waldir), "%s/wal", f->dir);
        assert_int_equal(mkdir(waldir, 0750), 0);
        const char *id = "mnd_plan_ae607245ac43";
        assert_true(wal_spare_name(".spare-1"));
        assert_true(wal_spare_name(".spare-18446744073709551615"));
        assert_false(wal_spare_name(".spare-"));
        assert_false(wal_spare_name(".spare-1x"));
        assert_false(wal_spare_name("spare-1"));
        assert_false(wal_spare_name("x.wal.jsonl"));

        struct wal_spares *sp = NULL;
        assert_int_equal(wal_spares_new(&f->io, waldir, WAL_SPARES_MAX + 1, &sp), -EINVAL);
        assert_int_equal(wal_spares_new(&f->io, waldir, 3, &sp), 0);
        assert_int_equal(wal_spares_take(sp, f->wal), -ENOENT);
        uint64_t mark = 0;
        rec_init(&f->rec);
        assert_int_equal(wal_spares_fill(sp, &mark), 0);
        assert_int_equal(f->rec.calls[OP_FSYNC_DIR], 0);
        assert_int_equal(wal_spares_pending(sp), 3);
        assert_int_equal(wal_spares_durable(sp), 0);
        assert_true(file_exists(waldir, ".spare-1") && file_exists(waldir, ".spare-3"));

        /* none durable: created as without spares (its directory fsynced) */
        struct wal *w = NULL;
        struct wal_open_info info;
        struct wal_options opt = f->opt;
        opt.spares = sp;
        char other[200];
        snprintf(other, sizeof(other), "%s/wal/mnd_plan_000000000001.wal.jsonl", f->dir);
        rec_init(&f->rec);
        assert_int_equal(wal_open(other, &opt, &w, &info), 0);
        assert_true(info.created);
        assert_false(info.from_spare);
        assert_int_equal(f->rec.calls[OP_FSYNC_DIR], 1);
        assert_int_equal(wal_close(w), 0);

        /* a failed covering sync: those spares are never used */
        wal_spares_covered(sp, mark, -EIO);
        assert_int_equal(wal_spares_pending(sp) + wal_spares_durable(sp), 0);
        assert_false(file_exists(waldir, ".spare-1"));

        assert_int_equal(wal_spares_fill(sp, &mark), 0);
        wal_spares_covered(sp, mark, 0);
        assert_int_equal(wal_spares_durable(sp), 3);

        /* an existing file is opened, no spare taken */
        rec_init(&f->rec);
        assert_int_equal(wal_open(other, &opt, &w, &info), 0);
        assert_false(info.created);
        assert_int_equal(f->rec.calls[OP_RENAME], 0);
        assert_int_equal(wal_close(w), 0);

        /* a new one: a durable spare renamed, no directory fsync */
        rec_init(&f->rec);
        assert_int_equal(wal_open(f->wal, &opt, &w, &info), 0);
        assert_true(info.created);
        assert_true(info.from_spare);
        assert_int_equal(f->rec.calls[OP_RENAME], 1);
        assert_int_equal(f->rec.calls[OP_FSYNC_DIR], 0);
        assert_int_equal(wal_spares_durable(sp), 2);
        assert_int_equal(wal_mandate(w, id, "s", "2026-04-20T12:00:00Z", NULL), 0);
        assert_int_equal(wal_mark_reset(w, "s1"), 0);
        assert_int_equal(wal_flush(w), 0);
        assert_int_equal(wal_close(w), 0);

        /* one made after a sync began is not covered by it */
        uint64_t before = mark;
        assert_int_equal(wal_spares_fill(sp, &mark), 0);
        assert_true(mark > before);
        wal_spares_covered(sp, before, 0);
        assert_int_equal(wal_spares_durable(sp), 2);
        assert_int_equal(wal_spares_pending(sp), 1);
        wal_spares_covered(sp, mark, 0);
        assert_int_equal(wal_spares_durable(sp), 3);
        /* found ones join as not durable; the pool is bounded */
        assert_int_equal(wal_spares_found(sp, ".spare-77"), -ENOSPC);
        wal_spares_free(sp);

        /* the rename lost: the records under the spare's name */
        char spare[300], wal_bytes[4096];
        snprintf(spare, sizeof(spare), "%s/.spare-50", waldir);
        assert_int_equal(rename(f->wal, spare), 0);
        FILE *fp = fopen(spare, "rb");
        assert_non_null(fp);
        size_t n = fread(wal_bytes, 1, sizeof(wal_bytes), fp);
        fclose(fp);
        enum wal_spare_found what;
        char got[64];
        assert_int_equal(wal_spare_peek(waldir, ".spare-50", &what, got, sizeof(got)), 0);
        assert_int_equal(what, WAL_SPARE_ADOPTED);
        assert_true(file_exists(waldir, ".spare-50")); /* peek changes nothing */
        assert_int_equal(wal_spare_adopt(&f->io, waldir, ".spare-50", &what, got, sizeof(got)),
                         0);
        assert_int_equal(what, WAL_SPARE_ADOPTED);
        assert_string_equal(got, id);
        assert_false(file_exists(waldir, ".spare-50"));
        assert_true(file_exists(waldir, "mnd_plan_ae607245ac43.wal.jsonl"));

        /* the same records twice: left, never merged */
        put_file(waldir, ".spare-51", wal_bytes, n);
        assert_int_equal(wal_spare_adopt(&f->io, waldir, ".spare-51", &what, got, sizeof(got)),
                         0);
        assert_int_equal(what, WAL_SPARE_CONFLICT);
        assert_string_equal(got, id);
        assert_true(file_exists(waldir, ".spare-51"));

        /* a first record cut: removed; empty: a spare still */
        put_file(waldir, ".spare-52", wal_bytes, 20);
        assert_int_equal(wal_spare_adopt(&f->io, waldir, ".spare-52", &what, got, sizeof(got)),
                         0);
        assert_int_equal(what, WAL_SPARE_REMOVED);
        assert_false(file_exists(waldir, ".spare-52"));
        put_file(waldir, ".spare-53", "", 0);
        assert_int_equal(wal_spare_adopt(&f->io, waldir, ".spare-53", &what, got, sizeof(got)),
                         0);
        assert_int_equal(what, WAL_SPARE_EMPTY);
        assert_true(file_exists(waldir, ".spare-53"));
        /* records that name no mandate: left */
        const char *noid = "{\"op\":\"reset\",\"step_id\":\"s\",\"ts\":\"" TS "\"}\n";
        put_file(waldir, ".spare-54", noid, strlen(noid));
        assert_int_equal(wal_spare_adopt(&f->io, waldir, ".spare-54", &what, got, sizeof(got)),
                         0);
        assert_int_equal(what, WAL_SPARE_UNNAMED);
        assert_true(file_exists(waldir, ".spare-54"));
        assert_int_equal(wal_spare_adopt(&f->io, waldir, ".spare-99", &what, got, sizeof(got)),
                         -ENOENT);
}

static void put_spare_line(const char *dir, const char *name, const char *id, off_t hole)
{
        struct wal_record r = { .op = WAL_OP_MANDATE, .mandate_id = id, .schedule = "s",
                                .fired_at = "2026-04-20T12:00:00Z" };
        char *line = enc(&r);
        size_t n = strlen(line);
        if (n == 0 || line[n - 1] != '\n') {
                line = realloc(line, n + 2);
                assert_non_null(line);
                strcpy(line + n++, "\n");
        }
        put_file(dir, name, line, n);
        free(line);
        if (hole) {
                char p[300];
                snprintf(p, sizeof(p), "%s/%s", dir, name);
                assert_int_equal(truncate(p, (off_t)n + hole), 0);
        }
}

static long max_rss_kb(void)
{
        struct rusage ru;
        assert_int_equal(getrusage(RUSAGE_SELF, &ru), 0);
        return ru.ru_maxrss;
}

/* A spare's name on anything but a regular file of its own is never
 * opened to read (a FIFO would block) nor taken (writes would go through
 * a link); only its first line is read (a huge file is never read whole);
 * a mandate id that is no file name is never adopted; a WAL that exists
 * is never replaced by a take or an adoption. */
static void test_spares_hostile(void **state)
{
        struct fx *f = *state;
        char waldir[200], p[300], outside[300];
        snprintf(waldir, sizeof(waldir), "%s/wal", f->dir);
        assert_int_equal(mkdir(waldir, 0750), 0);
        snprintf(outside, sizeof(outside), "%s/outside", f->dir);
        put_file(f->dir, "outside", "", 0);
        enum wal_spare_found what;
        char got[64];
        alarm(20); /* a FIFO opened to read blocks: fail, never hang */

        /* FIFO, directory, links: left, never read */
        snprintf(p, sizeof(p), "%s/.spare-60", waldir);
        assert_int_equal(mkfifo(p, 0600), 0);
        snprintf(p, sizeof(p), "%s/.spare-61", waldir);
        assert_int_equal(mkdir(p, 0700), 0);
        snprintf(p, sizeof(p), "%s/.spare-62", waldir);
        assert_int_equal(symlink(outside, p), 0);
        snprintf(p, sizeof(p), "%s/.spare-63", waldir);
        assert_int_equal(symlink("/dev/zero", p), 0);
        snprintf(p, sizeof(p), "%s/.spare-64", waldir);
        assert_int_equal(symlink("/nonexistent/x", p), 0);
        snprintf(p, sizeof(p), "%s/.spare-65", waldir);
        assert_int_equal(link(outside, p), 0);
        for (int i = 60; i <= 65; i++) {
                char name[32];
                snprintf(name, sizeof(name), ".spare-%d", i);
                assert_int_equal(wal_spare_peek(waldir, name, &what, got, sizeof(got)), 0);
                assert_int_equal(what, WAL_SPARE_NOT_FILE);
                assert_int_equal(wal_spare_adopt(&f->io, waldir, name, &what, got, sizeof(got)),
                                 0);
                assert_int_equal(what, WAL_SPARE_NOT_FILE);
                struct stat st;
                snprintf(p, sizeof(p), "%s/%s", waldir, name);
                assert_int_equal(lstat(p, &st), 0);
        }

        /* 1 GiB with no newline: no record kairosd began; left, and never
         * read whole */
        long rss = max_rss_kb();
        snprintf(p, sizeof(p), "%s/.spare-66", waldir);
        put_file(waldir, ".spare-66", "x", 1);
        assert_int_equal(truncate(p, (off_t)1 << 30), 0);
        assert_int_equal(wal_spare_adopt(&f->io, waldir, ".spare-66", &what, got, sizeof(got)),
                         0);
        assert_int_equal(what, WAL_SPARE_UNNAMED);
        assert_true(file_exists(waldir, ".spare-66"));
        /* a first record, then a 1 GiB hole: adopted from its first line */
        put_spare_line(waldir, ".spare-67", "mnd_big", (off_t)1 << 30);
        assert_int_equal(wal_spare_peek(waldir, ".spare-67", &what, got, sizeof(got)), 0);
        assert_int_equal(what, WAL_SPARE_ADOPTED);
        assert_string_equal(got, "mnd_big");
        assert_true(max_rss_kb() - rss < 128 * 1024);

        /* ids that are no file name: left */
        const char *bad[] = { "../x", "a/b", "..", ".hidden" };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                char body[200];
                snprintf(body, sizeof(body),
                         "{\"op\":\"mandate\",\"mandate_id\":\"%s\",\"schedule\":\"s\","
                         "\"fired_at\":\"2026-04-20T12:00:00Z\",\"ts\":\"" TS "\"}",
                         bad[i]);
                char *line = with_crc(body);
                put_file(waldir, ".spare-68", line, strlen(line));
                free(line);
                assert_int_equal(wal_spare_adopt(&f->io, waldir, ".spare-68", &what, got,
                                                 sizeof(got)),
                                 0);
                assert_int_equal(what, WAL_SPARE_UNNAMED);
                assert_true(file_exists(waldir, ".spare-68"));
        }
        /* a step's record with no plan before it names no mandate */
        char *orphan = with_crc("{\"op\":\"started\",\"step_id\":\"s1\",\"plan_id\":\"p\","
                                "\"ts\":\"" TS "\"}");
        put_file(waldir, ".spare-69", orphan, strlen(orphan));
        free(orphan);
        assert_int_equal(wal_spare_peek(waldir, ".spare-69", &what, got, sizeof(got)), 0);
        assert_int_equal(what, WAL_SPARE_UNNAMED);

        /* names past any counter: new ones still made */
        struct wal_spares *sp = NULL;
        assert_int_equal(wal_spares_new(kio_posix(), waldir, 4, &sp), 0);
        put_file(waldir, ".spare-99999999999999999999", "", 0);
        put_file(waldir, ".spare-18446744073709551614", "", 0);
        assert_int_equal(wal_spares_found(sp, ".spare-99999999999999999999"), 0);
        assert_int_equal(wal_spares_found(sp, ".spare-18446744073709551614"), 0);
        uint64_t mark;
        assert_int_equal(wal_spares_fill(sp, &mark), 0);
        assert_int_equal(wal_spares_pending(sp), 4);
        wal_spares_covered(sp, mark, 0);

        /* a WAL made between the look and the take is never replaced: by
         * the kernel (kio_posix), or by a look (a kio without it) */
        for (int k = 0; k < 2; k++) {
                struct wal_spares *s2 = sp;
                if (k == 1) {
                        assert_int_equal(wal_spares_new(&f->io, waldir, 4, &s2), 0);
                        assert_int_equal(wal_spares_fill(s2, &mark), 0);
                        wal_spares_covered(s2, mark, 0);
                }
                snprintf(p, sizeof(p), "%s/mnd_taken.wal.jsonl", waldir);
                put_file(waldir, "mnd_taken.wal.jsonl", "mine\n", 5);
                unsigned before = wal_spares_durable(s2);
                assert_int_equal(wal_spares_take(s2, p), -EEXIST);
                assert_int_equal(wal_spares_durable(s2), before); /* kept */
                size_t n = 0;
                char *data = slurp(p, &n);
                assert_int_equal(n, 5);
                assert_memory_equal(data, "mine\n", 5);
                free(data);
                if (k == 1)
                        wal_spares_free(s2);
        }
        wal_spares_free(sp);

        /* an adoption never replaces a WAL made after the look either */
        put_spare_line(waldir, ".spare-70", "mnd_taken", 0);
        assert_int_equal(wal_spare_adopt(&f->io, waldir, ".spare-70", &what, got, sizeof(got)),
                         0);
        assert_int_equal(what, WAL_SPARE_CONFLICT);
        assert_true(file_exists(waldir, ".spare-70"));

        /* a spare swapped for a link after it was made: the WAL is never
         * written through it */
        char sub[200];
        snprintf(sub, sizeof(sub), "%s/swap", f->dir);
        assert_int_equal(mkdir(sub, 0750), 0);
        assert_int_equal(wal_spares_new(kio_posix(), sub, 1, &sp), 0);
        assert_int_equal(wal_spares_fill(sp, &mark), 0);
        wal_spares_covered(sp, mark, 0);
        snprintf(p, sizeof(p), "%s/.spare-1", sub);
        assert_int_equal(unlink(p), 0);
        assert_int_equal(symlink(outside, p), 0);
        struct wal_options o2 = f->opt;
        o2.io = kio_posix();
        o2.spares = sp;
        struct wal *w = NULL;
        struct wal_open_info info;
        char swapped[300];
        snprintf(swapped, sizeof(swapped), "%s/mnd_swapped.wal.jsonl", sub);
        int rw = wal_open(swapped, &o2, &w, &info);
        if (rw == 0) {
                (void)wal_mandate(w, "mnd_swapped", "s", "2026-04-20T12:00:00Z", NULL);
                (void)wal_flush(w);
                (void)wal_close(w);
        }
        assert_int_equal(rw, -ELOOP);
        struct stat ost;
        assert_int_equal(stat(outside, &ost), 0);
        assert_int_equal(ost.st_size, 0);
        wal_spares_free(sp);

        /* a full file system: fewer spares, those made usable */
        char full[200];
        snprintf(full, sizeof(full), "%s/full", f->dir);
        assert_int_equal(mkdir(full, 0750), 0);
        assert_int_equal(wal_spares_new(&f->io, full, 4, &sp), 0);
        rec_init(&f->rec);
        f->rec.fail_op = OP_OPEN;
        f->rec.fail_nth = 2;
        f->rec.fail_err = -ENOSPC;
        assert_int_equal(wal_spares_fill(sp, &mark), -ENOSPC);
        assert_int_equal(wal_spares_pending(sp), 1);
        wal_spares_covered(sp, mark, 0);
        assert_int_equal(wal_spares_durable(sp), 1);
        f->rec.fail_op = -1;
        wal_spares_free(sp);
        alarm(0);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_format_ts),
                cmocka_unit_test(test_crc_golden),
                cmocka_unit_test(test_encode_owner),
                T(test_barrier_hook_replaces_fdatasync),
                cmocka_unit_test(test_encode_plan_commit_golden_hash),
                cmocka_unit_test(test_encode_every_op),
                cmocka_unit_test(test_encode_retry_wait),
                cmocka_unit_test(test_encode_escaping),
                cmocka_unit_test(test_encode_error_msg_cut_at_500_characters),
                cmocka_unit_test(test_encode_error_msg_invalid_utf8_replaced),
                cmocka_unit_test(test_encode_rejects_bad_records),
                cmocka_unit_test(test_encode_compact_result),
                cmocka_unit_test(test_format_ts_same_as_gmtime),
                cmocka_unit_test(test_encode_evidence_same_as_reparse),
                cmocka_unit_test(test_encoded_lines_fold_clean),
                T(test_create_fsyncs_parent),
                T(test_spares),
                T(test_spares_hostile),
                T(test_reopen_does_not_truncate),
                T(test_exists_at_dir_opens_by_name),
                T(test_one_line_per_op),
                T(test_commit_planner_plan),
                T(test_flush_barrier),
                T(test_threads_all_intact),
                T(test_torn_tail_repaired),
                T(test_exists_one_open),
                T(test_corrupt_quarantined),
                T(test_closed_refuses),
                T(test_write_eio_fails_wal),
                T(test_short_write_truncated),
                T(test_fdatasync_eio_never_retried),
                T(test_eintr_write_retried),
                T(test_open_failures),
                T(test_archive),
                T(test_archive_stage),
                T(test_archive_failure_keeps_wal),
                T(test_take_appended),
        };
#undef T
        return cmocka_run_group_tests(tests, NULL, NULL);
}
