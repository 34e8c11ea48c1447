/* SPDX-License-Identifier: MIT */
/* Tests of the idempotency store (docs/design.md §11): the original's right
 * behaviours, each fixed bug of §13 item 6 with a test that fails on the
 * original behaviour, and the persistence (reload, torn tails at every byte,
 * bit flips, compaction, I/O errors through a failing kio). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "kairos/canon.h"
#include "kairos/idem.h"
#include "kairos/kbuf.h"
#include "kairos/kio.h"
#include "kairos/wal.h"

#define T0 1776686400123LL /* 2026-04-20T12:00:00.123Z */

/* ---- a counting / failing kio around kio_posix ---------------------------- */

enum { OP_OPEN, OP_WRITE, OP_FDATASYNC, OP_FSYNC, OP_CLOSE, OP_FTRUNCATE, OP_RENAME, OP_UNLINK,
       OP_MKDIR, OP_FSYNC_DIR, OP_N };

struct fio {
        int calls[OP_N];
        int fail_op;        /* -1: none */
        int fail_nth;       /* fail the nth call and every later one (1-based) */
        int fail_err;
        int short_nth;      /* this write call writes half its bytes, the next fails */
        bool nosync;        /* fdatasync/fsync/fsync_dir do nothing (speed) */
};

static int fio_call(struct fio *f, int op)
{
        int k = ++f->calls[op];
        if (f->fail_op == op && k >= f->fail_nth)
                return f->fail_err;
        return 0;
}

static int f_open(void *ctx, const char *path, int flags, mode_t mode)
{
        int e = fio_call(ctx, OP_OPEN);
        return e ? e : kio_posix()->open(NULL, path, flags, mode);
}

static ssize_t f_write(void *ctx, int fd, const void *buf, size_t n)
{
        struct fio *f = ctx;
        int e = fio_call(f, OP_WRITE);
        if (e)
                return e;
        if (f->short_nth && f->calls[OP_WRITE] == f->short_nth) {
                f->fail_op = OP_WRITE;
                f->fail_nth = f->short_nth + 1;
                f->fail_err = -ENOSPC;
                n /= 2;
        }
        return kio_posix()->write(NULL, fd, buf, n);
}

static int f_fdatasync(void *ctx, int fd)
{
        struct fio *f = ctx;
        int e = fio_call(f, OP_FDATASYNC);
        return e ? e : f->nosync ? 0 : kio_posix()->fdatasync(NULL, fd);
}

static int f_fsync(void *ctx, int fd)
{
        struct fio *f = ctx;
        int e = fio_call(f, OP_FSYNC);
        return e ? e : f->nosync ? 0 : kio_posix()->fsync(NULL, fd);
}

static int f_close(void *ctx, int fd)
{
        fio_call(ctx, OP_CLOSE);
        return kio_posix()->close(NULL, fd);
}

static int f_ftruncate(void *ctx, int fd, off_t len)
{
        int e = fio_call(ctx, OP_FTRUNCATE);
        return e ? e : kio_posix()->ftruncate(NULL, fd, len);
}

static int f_rename(void *ctx, const char *from, const char *to)
{
        int e = fio_call(ctx, OP_RENAME);
        return e ? e : kio_posix()->rename(NULL, from, to);
}

static int f_unlink(void *ctx, const char *path)
{
        int e = fio_call(ctx, OP_UNLINK);
        return e ? e : kio_posix()->unlink(NULL, path);
}

static int f_mkdir(void *ctx, const char *path, mode_t mode)
{
        int e = fio_call(ctx, OP_MKDIR);
        return e ? e : kio_posix()->mkdir(NULL, path, mode);
}

static int f_fsync_dir(void *ctx, const char *path)
{
        struct fio *f = ctx;
        int e = fio_call(f, OP_FSYNC_DIR);
        return e ? e : f->nosync ? 0 : kio_posix()->fsync_dir(NULL, path);
}

/* ---- fixture ------------------------------------------------------------ */

struct fx {
        char dir[64];
        char sub[128];          /* the store's directory */
        char log[192];
        int64_t now;
        struct fio fio;
        struct kio io;
        struct idem_options opt;
        struct idem_store *s;
        struct idem_log *l;
        struct idem_load_info info;
};

static int64_t fake_clock(void *ctx)
{
        return *(const int64_t *)ctx;
}

static int setup(void **state)
{
        struct fx *f = calloc(1, sizeof(*f));
        if (!f)
                return -1;
        snprintf(f->dir, sizeof(f->dir), "/tmp/test_idem.XXXXXX");
        if (!mkdtemp(f->dir)) {
                free(f);
                return -1;
        }
        snprintf(f->sub, sizeof(f->sub), "%s/state/idem", f->dir);
        snprintf(f->log, sizeof(f->log), "%s/%s", f->sub, IDEM_LOG_NAME);
        f->now = T0;
        f->fio.fail_op = -1;
        f->io = (struct kio){ f_open, f_write, f_fdatasync, f_fsync, f_close, f_ftruncate,
                              f_rename, f_unlink, f_mkdir, f_fsync_dir, NULL, &f->fio };
        f->opt = (struct idem_options){ .now_ms = fake_clock, .clock_ctx = &f->now };
        *state = f;
        return 0;
}

static void rm_rf(const char *path)
{
        DIR *d = opendir(path);
        if (d) {
                struct dirent *de;
                while ((de = readdir(d))) {
                        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
                                continue;
                        char p[1024];
                        snprintf(p, sizeof(p), "%s/%s", path, de->d_name);
                        rm_rf(p);
                }
                closedir(d);
                rmdir(path);
        } else {
                unlink(path);
        }
}

static int teardown(void **state)
{
        struct fx *f = *state;
        idem_log_close(f->l);
        idem_store_free(f->s);
        rm_rf(f->dir);
        free(f);
        return 0;
}

/* A store without a log, for the in-memory semantics. */
static void mem_store(struct fx *f)
{
        assert_int_equal(idem_store_new(&f->opt, &f->s), 0);
}

/* Close and reopen store + log from the directory. */
static int reopen(struct fx *f)
{
        idem_log_close(f->l);
        idem_store_free(f->s);
        f->l = NULL;
        f->s = NULL;
        assert_int_equal(idem_store_new(&f->opt, &f->s), 0);
        return idem_log_open(f->sub, &f->io, f->s, &f->l, &f->info);
}

/* Make every produced record durable: through the log if there is one,
 * else by acknowledging them (in-memory tests). */
static void ack(struct fx *f)
{
        if (f->l) {
                assert_int_equal(idem_sync(f->s, f->l), 0);
                return;
        }
        struct kbuf b = KBUF_INIT;
        uint64_t upto = 0;
        assert_int_equal(idem_take_pending(f->s, &b, &upto), 0);
        idem_durable(f->s, upto);
        kbuf_free(&b);
}

static struct idem_request rq(const char *tool, const char *key, const char *input)
{
        return (struct idem_request){ .tool = tool, .key = key, .input_json = input,
                                      .input_len = strlen(input) };
}

/* begin + complete + durable: a finished call. */
static void run_ok(struct fx *f, const char *tool, const char *key, const char *input,
                   const void *res, size_t len)
{
        struct idem_request r = rq(tool, key, input);
        struct idem_view v;
        uint64_t lsn;
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        char k[IDEM_FULL_KEY_SIZE];
        snprintf(k, sizeof(k), "%s", v.key);
        assert_int_equal(idem_complete(f->s, k, res, len, &lsn), 0);
        ack(f);
}

static char *slurp(const char *path, size_t *len)
{
        FILE *fp = fopen(path, "rb");
        if (!fp)
                return NULL;
        struct kbuf b = KBUF_INIT;
        char tmp[4096];
        size_t n;
        while ((n = fread(tmp, 1, sizeof(tmp), fp)) > 0)
                assert_int_equal(kbuf_append(&b, tmp, n), 0);
        fclose(fp);
        if (!b.data)
                assert_int_equal(kbuf_reserve(&b, 1), 0);
        *len = b.len;
        return kbuf_steal(&b);
}

static void spit(const char *path, const void *data, size_t len)
{
        FILE *fp = fopen(path, "wb");
        assert_non_null(fp);
        if (len)
                assert_int_equal(fwrite(data, 1, len, fp), len);
        assert_int_equal(fclose(fp), 0);
}

static size_t count_lines(const char *d, size_t n)
{
        size_t c = 0;
        for (size_t i = 0; i < n; i++)
                c += d[i] == '\n';
        return c;
}

/* ==== the original's right behaviours ===================================== */

static void test_content_key_stable_across_key_order(void **state)
{
        struct fx *f = *state;
        char k1[IDEM_FULL_KEY_SIZE], k2[IDEM_FULL_KEY_SIZE];
        char fp1[CANON_HASH_STRLEN], fp2[CANON_HASH_STRLEN], want[CANON_HASH_STRLEN];
        struct idem_request a = rq("fs_write", NULL, "{\"path\":\"/x\",\"content\":\"hi\"}");
        struct idem_request b = rq("fs_write", NULL, "{ \"content\" : \"hi\", \"path\":\"/x\" }");

        assert_int_equal(idem_make_key(&a, k1, fp1), 0);
        assert_int_equal(idem_make_key(&b, k2, fp2), 0);
        assert_string_equal(k1, k2);
        assert_string_equal(fp1, fp2);
        /* the key is tool:content:<sha256 hex of the canonical JSON> */
        const char *canon = "{\"content\":\"hi\",\"path\":\"/x\"}";
        canon_hash_bytes(canon, strlen(canon), want);
        assert_string_equal(fp1, want);
        char key[IDEM_FULL_KEY_SIZE];
        snprintf(key, sizeof(key), "fs_write:content:%s", want + 7);
        assert_string_equal(k1, key);

        /* and the store treats the reordered input as the same call */
        mem_store(f);
        run_ok(f, "fs_write", NULL, a.input_json, "R", 1);
        struct idem_view v;
        assert_int_equal(idem_begin(f->s, &b, &v, NULL), IDEM_HIT_COMPLETED);
        assert_memory_equal(v.result, "R", 1);
}

static void test_different_input_different_key(void **state)
{
        struct fx *f = *state;
        char k1[IDEM_FULL_KEY_SIZE], k2[IDEM_FULL_KEY_SIZE];
        char fp1[CANON_HASH_STRLEN], fp2[CANON_HASH_STRLEN];
        struct idem_request a = rq("fs_write", NULL, "{\"path\":\"/x\",\"content\":\"hi\"}");
        struct idem_request b = rq("fs_write", NULL, "{\"path\":\"/x\",\"content\":\"ho\"}");
        assert_int_equal(idem_make_key(&a, k1, fp1), 0);
        assert_int_equal(idem_make_key(&b, k2, fp2), 0);
        assert_string_not_equal(k1, k2);
        assert_string_not_equal(fp1, fp2);

        mem_store(f);
        run_ok(f, "fs_write", NULL, a.input_json, "1", 1);
        uint64_t lsn;
        assert_int_equal(idem_begin(f->s, &b, NULL, &lsn), IDEM_PROCEED);
        assert_true(lsn > 0);
}

static void test_completed_duplicate_returns_cached_result(void **state)
{
        struct fx *f = *state;
        const char payload[] = "exit=0\0stdout\nline\0\xff\x01stderr";
        struct idem_request r = rq("cmd_run", "deploy-42", "[\"deploy\",\"v2\"]");
        struct idem_view v;
        uint64_t lsn;
        int runs = 0;

        mem_store(f);
        for (int i = 0; i < 3; i++) {
                int o = idem_begin(f->s, &r, &v, &lsn);
                if (o == IDEM_PROCEED) {
                        runs++;
                        assert_int_equal(idem_complete(f->s, "cmd_run:deploy-42", payload,
                                                       sizeof(payload), &lsn), 0);
                        ack(f);
                        continue;
                }
                assert_int_equal(o, IDEM_HIT_COMPLETED);
                assert_true(v.cached);
                assert_int_equal(v.state, IDEM_ST_COMPLETED);
                assert_int_equal(v.result_len, sizeof(payload));
                assert_memory_equal(v.result, payload, sizeof(payload));
                assert_int_equal(lsn, 0);
        }
        assert_int_equal(runs, 1);
        struct idem_stats st;
        idem_stats(f->s, &st);
        assert_int_equal(st.hits, 2);
        assert_int_equal(st.misses, 1);
}

static void test_failed_duplicate_returns_cached_error_with_class(void **state)
{
        struct fx *f = *state;
        struct idem_request r = rq("fs_write", NULL, "{\"path\":\"/ro/x\"}");
        struct idem_view v;
        uint64_t lsn;

        mem_store(f);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        char key[IDEM_FULL_KEY_SIZE];
        snprintf(key, sizeof(key), "%s", v.key);
        assert_int_equal(idem_fail(f->s, key, "permission_denied", "open /ro/x: EACCES",
                                   "exit=1", 6, &lsn), 0);
        ack(f);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_HIT_FAILED);
        assert_true(v.cached);
        assert_int_equal(v.state, IDEM_ST_FAILED);
        /* the class survives (the original wrapped it into a generic cached error) */
        assert_string_equal(v.error_class, "permission_denied");
        assert_string_equal(v.error_msg, "open /ro/x: EACCES");
        assert_int_equal(v.result_len, 6);
        assert_memory_equal(v.result, "exit=1", 6);
        assert_string_equal(idem_outcome_name(IDEM_HIT_FAILED), "cached_error");
}

static void test_explicit_keys(void **state)
{
        struct fx *f = *state;
        struct idem_view v;
        uint64_t lsn;
        mem_store(f);
        run_ok(f, "fs_write", "user-123-write", "{\"c\":1}", "A", 1);
        struct idem_request same = rq("fs_write", "user-123-write", "{\"c\":1}");
        assert_int_equal(idem_begin(f->s, &same, &v, &lsn), IDEM_HIT_COMPLETED);
        assert_string_equal(v.key, "fs_write:user-123-write");
        assert_memory_equal(v.result, "A", 1);
        /* another explicit key with the same input is another call */
        struct idem_request other = rq("fs_write", "user-124-write", "{\"c\":1}");
        assert_int_equal(idem_begin(f->s, &other, &v, &lsn), IDEM_PROCEED);
        /* and the content key of that input is yet another one */
        struct idem_request content = rq("fs_write", NULL, "{\"c\":1}");
        assert_int_equal(idem_lookup(f->s, &content, &v), IDEM_MISS);
        assert_int_equal(idem_get(f->s, "fs_write:user-123-write", &v), 0);
        assert_int_equal(idem_get(f->s, "fs_write:user-125-write", &v), -ENOENT);
}

static void test_stats(void **state)
{
        struct fx *f = *state;
        struct idem_stats st;
        struct idem_view v;
        uint64_t lsn;

        f->opt.capacity = 5;
        f->opt.ttl_sec = 100;
        mem_store(f);
        run_ok(f, "t", "a", "1", "x", 1);
        run_ok(f, "t", "b", "1", "x", 1);
        struct idem_request c = rq("t", "c", "1");
        assert_int_equal(idem_begin(f->s, &c, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_fail(f->s, "t:c", "boom", "m", NULL, 0, &lsn), 0);
        struct idem_request d = rq("t", "d", "1");
        assert_int_equal(idem_begin(f->s, &d, &v, &lsn), IDEM_PROCEED);
        struct idem_request e = rq("t", "e", "1");
        assert_int_equal(idem_begin(f->s, &e, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_interrupt(f->s, "t:e", "client_closed", &lsn), 0);
        ack(f);

        struct idem_request a = rq("t", "a", "1");
        assert_int_equal(idem_lookup(f->s, &a, &v), IDEM_HIT_COMPLETED);       /* hit */
        assert_int_equal(idem_begin(f->s, &c, &v, &lsn), IDEM_HIT_FAILED);     /* hit */
        assert_int_equal(idem_begin(f->s, &d, &v, &lsn), IDEM_IN_PROGRESS);    /* conflict */
        assert_int_equal(idem_begin(f->s, &e, &v, &lsn), IDEM_INTERRUPTED);    /* conflict */
        struct idem_request a2 = rq("t", "a", "2");
        assert_int_equal(idem_begin(f->s, &a2, &v, &lsn), IDEM_MISMATCH);      /* mismatch */
        struct idem_request g = rq("t", "g", "1");
        assert_int_equal(idem_begin(f->s, &g, &v, &lsn), IDEM_PROCEED);        /* miss, evicts b */
        struct idem_request h = rq("t", "h", "1");
        assert_int_equal(idem_lookup(f->s, &h, &v), IDEM_MISS);                /* miss */

        idem_stats(f->s, &st);
        assert_int_equal(st.size, 5);
        assert_int_equal(st.capacity, 5);
        assert_int_equal(st.ttl_sec, 100);
        assert_int_equal(st.processing, 2);
        assert_int_equal(st.completed, 1);
        assert_int_equal(st.failed, 1);
        assert_int_equal(st.interrupted, 1);
        assert_int_equal(st.hits, 2);
        assert_int_equal(st.misses, 7); /* a b c d e g h */
        assert_int_equal(st.conflicts, 2);
        assert_int_equal(st.mismatches, 1);
        assert_int_equal(st.evictions, 1);
        assert_int_equal(st.expirations, 0);
        assert_int_equal(idem_get(f->s, "t:b", &v), -ENOENT);

        f->now += 100 * 1000;
        assert_int_equal(idem_sweep(f->s), 2); /* a and c */
        idem_stats(f->s, &st);
        assert_int_equal(st.expirations, 2);
        assert_int_equal(st.size, 3);
}

/* ==== the fixed bugs ====================================================== */

/* Original: a duplicate arriving while the first call was processing ran the
 * handler again. */
static void test_duplicate_while_processing_is_in_progress(void **state)
{
        struct fx *f = *state;
        struct idem_request r = rq("cmd_run", "k", "{\"a\":1}");
        struct idem_view v;
        uint64_t lsn1, lsn2;
        int runs = 0;

        mem_store(f);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn1), IDEM_PROCEED);
        runs++;
        assert_false(v.durable);
        /* before and after the begin is durable: never a second execution */
        for (int i = 0; i < 2; i++) {
                int o = idem_begin(f->s, &r, &v, &lsn2);
                if (o == IDEM_PROCEED)
                        runs++;
                assert_int_equal(o, IDEM_IN_PROGRESS);
                assert_int_equal(v.state, IDEM_ST_PROCESSING);
                ack(f);
        }
        /* finished but not yet durable: still in progress, no result served */
        assert_int_equal(idem_complete(f->s, "cmd_run:k", "out", 3, &lsn2), 0);
        assert_true(lsn2 > lsn1);
        assert_int_equal(idem_begin(f->s, &r, &v, NULL), IDEM_IN_PROGRESS);
        idem_durable(f->s, lsn2);
        assert_int_equal(idem_begin(f->s, &r, &v, NULL), IDEM_HIT_COMPLETED);
        assert_int_equal(runs, 1);
        struct idem_stats st;
        idem_stats(f->s, &st);
        assert_int_equal(st.conflicts, 3);
        assert_string_equal(idem_outcome_name(IDEM_IN_PROGRESS), "in_progress");
}

/* Original: expiry only by a periodic sweeper, so lookups served expired entries. */
static void test_expiry_checked_on_lookup(void **state)
{
        struct fx *f = *state;
        struct idem_request r = rq("t", "k", "1");
        struct idem_view v;
        uint64_t lsn;

        f->opt.ttl_sec = 10;
        mem_store(f);
        run_ok(f, "t", "k", "1", "old", 3);
        f->now += 9999;
        assert_int_equal(idem_lookup(f->s, &r, &v), IDEM_HIT_COMPLETED);
        assert_int_equal(v.expires_ms, T0 + 10000);
        f->now = T0 + 10000;
        /* no sweeper call: the lookup itself sees the expiry */
        assert_int_equal(idem_lookup(f->s, &r, &v), IDEM_MISS);
        struct idem_stats st;
        idem_stats(f->s, &st);
        assert_int_equal(st.expirations, 1);
        assert_int_equal(st.size, 0);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        /* idem_get too checks the TTL */
        assert_int_equal(idem_complete(f->s, "t:k", "new", 3, &lsn), 0);
        ack(f);
        assert_int_equal(idem_get(f->s, "t:k", &v), 0);
        f->now += 10000;
        assert_int_equal(idem_get(f->s, "t:k", &v), -ENOENT);
        /* in-flight entries never expire */
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        f->now += 1000LL * 1000 * 1000;
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_IN_PROGRESS);
}

/* Original: capacity evicted the oldest entries whatever their state, so an
 * in-flight call's result was silently dropped. */
static void test_inflight_never_evicted(void **state)
{
        struct fx *f = *state;
        struct idem_view v;
        uint64_t lsn;
        char key[16];

        f->opt.capacity = 3;
        mem_store(f);
        for (int i = 0; i < 3; i++) {
                snprintf(key, sizeof(key), "p%d", i);
                struct idem_request r = rq("t", key, "1");
                assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        }
        assert_int_equal(idem_interrupt(f->s, "t:p0", NULL, &lsn), 0);
        struct idem_request x = rq("t", "x", "1");
        assert_int_equal(idem_begin(f->s, &x, &v, &lsn), IDEM_STORE_FULL);
        assert_int_equal(lsn, 0);
        assert_string_equal(idem_outcome_name(IDEM_STORE_FULL), "store_full");
        struct idem_stats st;
        idem_stats(f->s, &st);
        assert_int_equal(st.size, 3);
        assert_int_equal(st.store_full, 1);
        assert_int_equal(st.evictions, 0);
        for (int i = 0; i < 3; i++) {
                snprintf(key, sizeof(key), "t:p%d", i);
                assert_int_equal(idem_get(f->s, key, &v), 0);
        }
        /* once one finishes, it (and only it) can make room */
        assert_int_equal(idem_complete(f->s, "t:p1", "r", 1, &lsn), 0);
        ack(f);
        assert_int_equal(idem_begin(f->s, &x, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_get(f->s, "t:p1", &v), -ENOENT);
        assert_int_equal(idem_get(f->s, "t:p0", &v), 0);
        assert_int_equal(idem_get(f->s, "t:p2", &v), 0);
}

static void test_eviction_lru_order_mixed(void **state)
{
        struct fx *f = *state;
        struct idem_view v;
        uint64_t lsn;

        f->opt.capacity = 4;
        mem_store(f);
        run_ok(f, "t", "A", "1", "a", 1);
        run_ok(f, "t", "B", "1", "b", 1);
        struct idem_request c = rq("t", "C", "1");
        assert_int_equal(idem_begin(f->s, &c, &v, &lsn), IDEM_PROCEED);
        run_ok(f, "t", "D", "1", "d", 1);
        /* touch A: the LRU order of finished entries is now B, D, A */
        struct idem_request a = rq("t", "A", "1");
        assert_int_equal(idem_lookup(f->s, &a, &v), IDEM_HIT_COMPLETED);

        struct idem_request e = rq("t", "E", "1");
        assert_int_equal(idem_begin(f->s, &e, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_get(f->s, "t:B", &v), -ENOENT);
        assert_int_equal(idem_get(f->s, "t:D", &v), 0);
        struct idem_request g = rq("t", "F", "1");
        assert_int_equal(idem_begin(f->s, &g, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_get(f->s, "t:D", &v), -ENOENT);
        assert_int_equal(idem_get(f->s, "t:A", &v), 0);
        struct idem_request h = rq("t", "G", "1");
        assert_int_equal(idem_begin(f->s, &h, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_get(f->s, "t:A", &v), -ENOENT);
        /* C, E, F, G are all in flight */
        struct idem_request i = rq("t", "H", "1");
        assert_int_equal(idem_begin(f->s, &i, &v, &lsn), IDEM_STORE_FULL);
        assert_int_equal(idem_get(f->s, "t:C", &v), 0);
        assert_int_equal(v.state, IDEM_ST_PROCESSING);
        struct idem_stats st;
        idem_stats(f->s, &st);
        assert_int_equal(st.evictions, 3);
        assert_int_equal(st.processing, 4);
}

/* Original: explicit keys were not scoped by tool. */
static void test_explicit_key_two_tools_no_collision(void **state)
{
        struct fx *f = *state;
        struct idem_view v;
        mem_store(f);
        run_ok(f, "fs_write", "req-1", "{}", "write-result", 12);
        /* same explicit key and input on another tool: its own call */
        struct idem_request r = rq("cmd_run", "req-1", "{}");
        uint64_t lsn;
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_complete(f->s, "cmd_run:req-1", "run-result", 10, &lsn), 0);
        ack(f);
        assert_int_equal(idem_lookup(f->s, &r, &v), IDEM_HIT_COMPLETED);
        assert_memory_equal(v.result, "run-result", 10);
        struct idem_request w = rq("fs_write", "req-1", "{}");
        assert_int_equal(idem_lookup(f->s, &w, &v), IDEM_HIT_COMPLETED);
        assert_memory_equal(v.result, "write-result", 12);
        /* a tool name cannot smuggle a colon, an explicit key cannot pose as a content key */
        char k[IDEM_FULL_KEY_SIZE], fp[CANON_HASH_STRLEN];
        struct idem_request bad = rq("fs:write", "x", "{}");
        assert_int_equal(idem_make_key(&bad, k, fp), -EINVAL);
        bad = rq("fs_write", "content:abc", "{}");
        assert_int_equal(idem_make_key(&bad, k, fp), -EINVAL);
}

/* Original: no fingerprint, a reused explicit key returned another call's result. */
static void test_mismatch_detected(void **state)
{
        struct fx *f = *state;
        struct idem_view v;
        uint64_t lsn;
        int runs = 0;
        mem_store(f);
        run_ok(f, "fs_write", "k", "{\"content\":\"A\"}", "ok-A", 4);
        struct idem_request b = rq("fs_write", "k", "{\"content\":\"B\"}");
        int o = idem_begin(f->s, &b, &v, &lsn);
        runs += o == IDEM_PROCEED;
        assert_int_equal(o, IDEM_MISMATCH);
        assert_int_equal(lsn, 0);
        assert_false(v.cached);
        char fpa[CANON_HASH_STRLEN];
        assert_int_equal(canon_hash_json("{\"content\":\"A\"}", 15, fpa, NULL), 0);
        assert_string_equal(v.fingerprint, fpa);
        /* also while processing */
        struct idem_request p = rq("fs_write", "p", "{\"content\":\"A\"}");
        assert_int_equal(idem_begin(f->s, &p, &v, &lsn), IDEM_PROCEED);
        struct idem_request p2 = rq("fs_write", "p", "{\"content\":\"C\"}");
        assert_int_equal(idem_begin(f->s, &p2, &v, &lsn), IDEM_MISMATCH);
        /* a precomputed fingerprint is compared the same way */
        struct idem_request pre = { .tool = "fs_write", .key = "k", .fingerprint = fpa };
        assert_int_equal(idem_lookup(f->s, &pre, &v), IDEM_HIT_COMPLETED);
        struct idem_stats st;
        idem_stats(f->s, &st);
        assert_int_equal(st.mismatches, 2);
        assert_int_equal(runs, 0);
}

static void test_interrupted_and_forget(void **state)
{
        struct fx *f = *state;
        struct idem_request r = rq("cmd_run", "k", "[]");
        struct idem_view v;
        uint64_t lsn;
        mem_store(f);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        /* the caller may still be running it: an operator cannot forget it */
        assert_int_equal(idem_forget(f->s, "cmd_run:k", 0, "oops", &lsn), -EBUSY);
        assert_int_equal(idem_interrupt(f->s, "cmd_run:k", "client_closed", &lsn), 0);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_INTERRUPTED);
        assert_string_equal(v.reason, "client_closed");
        assert_int_equal(idem_complete(f->s, "cmd_run:k", "x", 1, &lsn), -ESTALE);
        assert_int_equal(idem_forget(f->s, "cmd_run:k", 1000, "checked by hand", &lsn), 0);
        assert_true(lsn > 0);
        assert_int_equal(idem_forget(f->s, "cmd_run:k", 1000, "again", &lsn), -ENOENT);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        struct kbuf b = KBUF_INIT;
        uint64_t upto;
        assert_int_equal(idem_take_pending(f->s, &b, &upto), 0);
        assert_int_equal(count_lines(b.data, b.len), 4);
        assert_non_null(strstr(b.data, "{\"op\":\"forget\",\"key\":\"cmd_run:k\",\"uid\":1000,"
                                       "\"reason\":\"checked by hand\","));
        kbuf_free(&b);
}

static void test_bad_arguments(void **state)
{
        struct fx *f = *state;
        struct idem_view v;
        uint64_t lsn;
        char k[IDEM_FULL_KEY_SIZE], fp[CANON_HASH_STRLEN];
        char longkey[IDEM_KEY_MAX + 2];
        memset(longkey, 'k', sizeof(longkey) - 1);
        longkey[sizeof(longkey) - 1] = '\0';
        struct idem_request bad[] = {
                rq("", "k", "1"), rq("a b", "k", "1"), rq("t", "", "1"), rq("t", "a\nb", "1"),
                rq("t", longkey, "1"), rq("t", "k", "{bad"), rq("t", "\xff", "1"),
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
                assert_int_equal(idem_make_key(&bad[i], k, fp), -EINVAL);
        struct idem_request badfp = { .tool = "t", .key = "k", .fingerprint = "sha256-xyz" };
        assert_int_equal(idem_make_key(&badfp, k, fp), -EINVAL);
        longkey[IDEM_KEY_MAX] = '\0';
        struct idem_request ok = rq("t", longkey, "1");
        assert_int_equal(idem_make_key(&ok, k, fp), 0);

        mem_store(f);
        assert_int_equal(idem_begin(f->s, &bad[0], &v, &lsn), -EINVAL);
        assert_int_equal(idem_complete(f->s, "t:nope", "x", 1, &lsn), -ENOENT);
        struct idem_request r = rq("t", "k", "1");
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_complete(f->s, "t:k", "x", (size_t)IDEM_RESULT_MAX + 1, &lsn),
                         -EFBIG);
        assert_int_equal(idem_fail(f->s, "t:k", "bad class", "m", NULL, 0, &lsn), -EINVAL);
        assert_int_equal(idem_fail(f->s, "t:k", "exit_status", "bad \xff utf8", NULL, 0, &lsn),
                         0);
        assert_int_equal(idem_get(f->s, "t:k", &v), 0);
        assert_string_equal(v.error_msg, "bad \xEF\xBF\xBD utf8");
        assert_int_equal(idem_complete(f->s, "t:k", "x", 1, &lsn), -ESTALE);
        struct idem_options neg = { .ttl_sec = -1 };
        struct idem_store *s2 = NULL;
        assert_int_equal(idem_store_new(&neg, &s2), -EINVAL);
        assert_null(s2);
}

/* ==== persistence ========================================================= */

static void open_fresh(struct fx *f)
{
        assert_int_equal(idem_store_new(&f->opt, &f->s), 0);
        assert_int_equal(idem_log_open(f->sub, &f->io, f->s, &f->l, &f->info), 0);
}

/* Original: state lost on restart. */
static void test_reload_after_begin_only_is_interrupted(void **state)
{
        struct fx *f = *state;
        struct idem_request r = rq("cmd_run", "k", "[\"x\"]");
        struct idem_view v;
        uint64_t lsn;

        open_fresh(f);
        assert_true(f->info.created);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        int syncs = f->fio.calls[OP_FDATASYNC];
        assert_int_equal(idem_sync(f->s, f->l), 0);
        assert_int_equal(f->fio.calls[OP_FDATASYNC], syncs + 1);
        assert_int_equal(idem_get(f->s, "cmd_run:k", &v), 0);
        assert_true(v.durable);
        /* the daemon dies here (nothing else written) */
        assert_int_equal(reopen(f), 0);
        assert_false(f->info.created);
        assert_int_equal(f->info.records, 1);
        assert_int_equal(f->info.interrupted, 1);
        assert_false(f->info.corrupt);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_INTERRUPTED);
        assert_string_equal(v.reason, "daemon_restart");
        assert_string_equal(idem_outcome_name(IDEM_INTERRUPTED), "interrupted");
        /* an operator clears it; the forget is durable and survives too */
        assert_int_equal(idem_forget(f->s, "cmd_run:k", 0, "ran by hand", &lsn), 0);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        assert_int_equal(reopen(f), 0);
        assert_int_equal(idem_get(f->s, "cmd_run:k", &v), -ENOENT);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
}

/* A call that did nothing is dropped by its caller: a retry proceeds, the
 * drop is logged as a forget (uid -1) and survives a reload. */
static void test_abandon(void **state)
{
        struct fx *f = *state;
        struct idem_request r = rq("kairos.write", "k", "{}");
        struct idem_view v;
        uint64_t lsn;
        open_fresh(f);
        assert_int_equal(idem_abandon(f->s, "kairos.write:k", "x", &lsn), -ENOENT);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_abandon(f->s, "kairos.write:k", "nothing written: EACCES", &lsn),
                         0);
        assert_true(lsn > 0);
        assert_int_equal(idem_get(f->s, "kairos.write:k", &v), -ENOENT);
        struct idem_stats st;
        idem_stats(f->s, &st);
        assert_int_equal(st.forgets, 0);
        assert_int_equal(st.processing, 0);
        assert_int_equal(st.size, 0);
        /* only processing entries: a finished one is the caller's answer */
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_complete(f->s, "kairos.write:k", "{}", 2, &lsn), 0);
        assert_int_equal(idem_abandon(f->s, "kairos.write:k", "x", &lsn), -ESTALE);
        assert_int_equal(idem_get(f->s, "kairos.write:k", &v), 0);
        struct idem_request r2 = rq("kairos.write", "k2", "{}");
        assert_int_equal(idem_begin(f->s, &r2, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_abandon(f->s, "kairos.write:k2", "refused", &lsn), 0);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        assert_int_equal(reopen(f), 0);
        assert_int_equal(f->info.interrupted, 0);
        assert_int_equal(idem_get(f->s, "kairos.write:k2", &v), -ENOENT);
        assert_int_equal(idem_get(f->s, "kairos.write:k", &v), 0);
        assert_int_equal(idem_begin(f->s, &r2, &v, &lsn), IDEM_PROCEED);
}

static void test_reload_after_finish_replays_bytes(void **state)
{
        struct fx *f = *state;
        unsigned char payload[1000];
        for (size_t i = 0; i < sizeof(payload); i++)
                payload[i] = (unsigned char)(i * 7);
        struct idem_request r = rq("cmd_run", "k", "[\"x\"]");
        struct idem_request e = rq("fs_write", NULL, "{\"p\":\"/ro\"}");
        struct idem_request z = rq("cmd_run", "empty", "[]");
        struct idem_view v;
        uint64_t lsn;

        open_fresh(f);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_begin(f->s, &e, &v, &lsn), IDEM_PROCEED);
        char ekey[IDEM_FULL_KEY_SIZE];
        snprintf(ekey, sizeof(ekey), "%s", v.key);
        assert_int_equal(idem_begin(f->s, &z, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        assert_int_equal(idem_complete(f->s, "cmd_run:k", payload, sizeof(payload), &lsn), 0);
        assert_int_equal(idem_fail(f->s, ekey, "permission_denied", "line1\nline2 \"q\"",
                                   "\0err", 4, &lsn), 0);
        assert_int_equal(idem_complete(f->s, "cmd_run:empty", NULL, 0, &lsn), 0);
        assert_int_equal(idem_sync(f->s, f->l), 0);

        f->now += 3600 * 1000;
        assert_int_equal(reopen(f), 0);
        assert_int_equal(f->info.records, 6);
        assert_int_equal(f->info.entries, 3);
        assert_int_equal(f->info.interrupted, 0);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_HIT_COMPLETED);
        assert_int_equal(v.result_len, sizeof(payload));
        assert_memory_equal(v.result, payload, sizeof(payload));
        assert_int_equal(v.created_ms, T0);
        assert_int_equal(v.finished_ms, T0);
        assert_int_equal(idem_begin(f->s, &e, &v, &lsn), IDEM_HIT_FAILED);
        assert_string_equal(v.error_class, "permission_denied");
        assert_string_equal(v.error_msg, "line1\nline2 \"q\"");
        assert_int_equal(v.result_len, 4);
        assert_memory_equal(v.result, "\0err", 4);
        assert_int_equal(idem_begin(f->s, &z, &v, &lsn), IDEM_HIT_COMPLETED);
        assert_int_equal(v.result_len, 0);
        assert_non_null(v.result);

        /* the TTL counts across restarts */
        f->now = T0 + 86400LL * 1000;
        assert_int_equal(reopen(f), 0);
        assert_int_equal(f->info.expired, 3);
        assert_int_equal(f->info.entries, 0);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
}

/* ---- a realistic log and an independent model of it ---- */

struct mrec {
        const char *key;
        const char *op;         /* begin complete fail interrupt forget */
        const char *payload;
        size_t len;
};

static const char big_payload[] =
        "exit_status=0\0stdout:\n"
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor\n"
        "incididunt ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud\n"
        "\x01\x02\x03\xff\xfe stderr: warning: something \"quoted\" \\ back\n";

static const struct mrec model[] = {
        { "run:content:", "begin", NULL, 0 },           /* key filled in at run time */
        { "run:content:", "complete", "A\0B", 3 },
        { "write:k1", "begin", NULL, 0 },
        { "write:k1", "fail", "E", 1 },
        { "run:k2", "begin", NULL, 0 },
        { "run:k2", "interrupt", NULL, 0 },
        { "run:k2", "forget", NULL, 0 },
        { "run:k3", "begin", NULL, 0 },
        { "run:k3", "complete", "", 0 },
        { "run:k4", "begin", NULL, 0 },
        { "run:k5", "begin", NULL, 0 },
        { "run:k5", "complete", big_payload, sizeof(big_payload) },
        { "run:k6", "begin", NULL, 0 },
        { "run:k6", "interrupt", NULL, 0 },
};
#define NMODEL (sizeof(model) / sizeof(model[0]))

static char content_key[IDEM_FULL_KEY_SIZE];

static const char *mkey(size_t i)
{
        return strcmp(model[i].key, "run:content:") == 0 ? content_key : model[i].key;
}

/* Calls a step made (owned): their owner is in every record of them. */
static bool model_owned(const char *key)
{
        return !strcmp(key, "write:k1") || !strcmp(key, "run:k4") || !strcmp(key, "run:k6");
}

static const struct idem_step_owner model_owner = { .mandate = "mnd_plan_0123456789ab",
                                                    .step = "act_001", .attempt = 3 };

/* Write the model's records through the store, one sync each. */
static void write_model(struct fx *f)
{
        struct idem_view v;
        uint64_t lsn;
        open_fresh(f);
        for (size_t i = 0; i < NMODEL; i++) {
                const char *op = model[i].op;
                if (!strcmp(op, "begin")) {
                        char tool[16];
                        const char *colon = strchr(model[i].key, ':');
                        snprintf(tool, sizeof(tool), "%.*s", (int)(colon - model[i].key),
                                 model[i].key);
                        bool content = strcmp(colon + 1, "content:") == 0;
                        struct idem_request r = rq(tool, content ? NULL : colon + 1,
                                                   "{\"cmd\":[\"echo\",\"a\"]}");
                        if (model_owned(model[i].key))
                                r.owner = &model_owner;
                        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
                        if (i == 0)
                                snprintf(content_key, sizeof(content_key), "%s", v.key);
                } else if (!strcmp(op, "complete")) {
                        assert_int_equal(idem_complete(f->s, mkey(i), model[i].payload,
                                                       model[i].len, &lsn), 0);
                } else if (!strcmp(op, "fail")) {
                        assert_int_equal(idem_fail(f->s, mkey(i), "exit_status", "exit 3",
                                                   model[i].payload, model[i].len, &lsn), 0);
                } else if (!strcmp(op, "interrupt")) {
                        assert_int_equal(idem_interrupt(f->s, mkey(i), "client_closed", &lsn), 0);
                } else {
                        assert_int_equal(idem_forget(f->s, mkey(i), 1000, "operator", &lsn), 0);
                }
                assert_int_equal(idem_sync(f->s, f->l), 0);
        }
        idem_log_close(f->l);
        idem_store_free(f->s);
        f->l = NULL;
        f->s = NULL;
}

/* Check the store against the model replayed up to record n (exclusive). */
static void check_model(struct idem_store *s, size_t n)
{
        for (size_t i = 0; i < NMODEL; i++) {
                const char *key = mkey(i);
                int st = -1; /* -1: absent */
                const struct mrec *last = NULL;
                for (size_t j = 0; j < n; j++) {
                        if (strcmp(mkey(j), key) != 0)
                                continue;
                        const char *op = model[j].op;
                        st = !strcmp(op, "begin") ? IDEM_ST_PROCESSING
                           : !strcmp(op, "complete") ? IDEM_ST_COMPLETED
                           : !strcmp(op, "fail") ? IDEM_ST_FAILED
                           : !strcmp(op, "interrupt") ? IDEM_ST_INTERRUPTED : -1;
                        last = &model[j];
                }
                if (st == IDEM_ST_PROCESSING)
                        st = IDEM_ST_INTERRUPTED;
                struct idem_view v;
                int r = idem_get(s, key, &v);
                if (st < 0) {
                        assert_int_equal(r, -ENOENT);
                        continue;
                }
                assert_int_equal(r, 0);
                assert_int_equal(v.state, st);
                if (model_owned(key)) {
                        assert_non_null(v.owner);
                        assert_string_equal(v.owner->mandate, model_owner.mandate);
                        assert_string_equal(v.owner->step, model_owner.step);
                        assert_int_equal(v.owner->attempt, model_owner.attempt);
                } else {
                        assert_null(v.owner);
                }
                if (st == IDEM_ST_COMPLETED || st == IDEM_ST_FAILED) {
                        assert_int_equal(v.result_len, last->len);
                        if (last->len)
                                assert_memory_equal(v.result, last->payload, last->len);
                }
        }
}

static void nosync(struct fx *f)
{
        f->fio.nosync = true;
}

static void test_model_reload(void **state)
{
        struct fx *f = *state;
        nosync(f);
        write_model(f);
        assert_int_equal(reopen(f), 0);
        assert_int_equal(f->info.records, NMODEL);
        assert_false(f->info.corrupt);
        assert_false(f->info.torn_repaired);
        check_model(f->s, NMODEL);
}

/* Torn tail at every byte offset: load never fails, keeps exactly the complete
 * records, keeps the torn bytes aside, cuts them off, and the next record
 * lands cleanly after them (the original glued it to the fragment). */
static void test_torn_tail_every_offset(void **state)
{
        struct fx *f = *state;
        size_t len;
        nosync(f);
        write_model(f);
        char *full = slurp(f->log, &len);
        assert_non_null(full);
        assert_int_equal(count_lines(full, len), NMODEL);

        for (size_t k = 0; k <= len; k++) {
                spit(f->log, full, k);
                /* the offline reader sees the same, and leaves the file as is */
                struct idem_store *ro;
                struct idem_load_info ri;
                struct stat rst;
                assert_int_equal(idem_store_new(&f->opt, &ro), 0);
                assert_int_equal(idem_log_read(f->sub, ro, &ri), 0);
                assert_false(ri.corrupt);
                assert_int_equal(ri.records, count_lines(full, k));
                check_model(ro, count_lines(full, k));
                idem_store_free(ro);
                assert_int_equal(stat(f->log, &rst), 0);
                assert_int_equal((size_t)rst.st_size, k);
                assert_int_equal(reopen(f), 0);
                size_t complete = count_lines(full, k);
                size_t boundary = 0;
                for (size_t i = 0; i < k; i++)
                        if (full[i] == '\n')
                                boundary = i + 1;
                assert_false(f->info.corrupt);
                assert_int_equal(f->info.records, complete);
                assert_int_equal(f->info.torn_repaired, boundary < k);
                check_model(f->s, complete);
                struct stat st;
                assert_int_equal(stat(f->log, &st), 0);
                assert_int_equal((size_t)st.st_size, boundary);
                if (boundary < k) {
                        assert_int_equal(f->info.torn_bytes, k - boundary);
                        size_t tl;
                        char *torn = slurp(f->info.torn_path, &tl);
                        assert_non_null(torn);
                        assert_int_equal(tl, k - boundary);
                        assert_memory_equal(torn, full + boundary, tl);
                        free(torn);
                        unlink(f->info.torn_path);
                }
                /* append after the repair, reload: clean, one more record */
                struct idem_request r = rq("after", "x", "1");
                uint64_t lsn;
                assert_int_equal(idem_begin(f->s, &r, NULL, &lsn), IDEM_PROCEED);
                assert_int_equal(idem_sync(f->s, f->l), 0);
                assert_int_equal(reopen(f), 0);
                assert_false(f->info.corrupt);
                assert_false(f->info.torn_repaired);
                assert_int_equal(f->info.records, complete + 1);
                struct idem_view v;
                assert_int_equal(idem_get(f->s, "after:x", &v), 0);
                assert_int_equal(v.state, IDEM_ST_INTERRUPTED);
        }
        /* NUL bytes after the last record (a crash that extended the file) */
        char *z = calloc(1, len + 64);
        assert_non_null(z);
        memcpy(z, full, len);
        spit(f->log, z, len + 64);
        assert_int_equal(reopen(f), 0);
        assert_false(f->info.corrupt);
        assert_true(f->info.torn_repaired);
        assert_int_equal(f->info.records, NMODEL);
        free(z);
        free(full);
}

/* Every single-bit flip is reported (line, offset), the store refuses to
 * write, keeps every good record, and an operator compaction repairs it. */
static void test_bit_flips_reported(void **state)
{
        struct fx *f = *state;
        size_t len;
        nosync(f);
        write_model(f);
        char *full = slurp(f->log, &len);
        assert_non_null(full);
        char *buf = malloc(len);
        assert_non_null(buf);

        size_t line = 1, line_start = 0;
        for (size_t i = 0; i < len; i++) {
                for (int bit = 0; bit < 8; bit++) {
                        if (bit != (int)(i % 8) && line != 5 && line != NMODEL)
                                continue; /* every bit of two lines, one bit elsewhere */
                        memcpy(buf, full, len);
                        buf[i] ^= (char)(1u << bit);
                        spit(f->log, buf, len);
                        assert_int_equal(reopen(f), 0);
                        assert_true(f->info.corrupt);
                        assert_int_equal(f->info.bad_line, line);
                        assert_int_equal(f->info.bad_offset, line_start);
                        assert_true(f->info.records >= NMODEL - 2);
                        assert_int_equal(idem_log_error(f->l), -EBADMSG);
                        struct idem_stats st;
                        idem_stats(f->s, &st);
                        assert_true(st.quarantined);
                        struct idem_request r = rq("new", "x", "1");
                        uint64_t lsn;
                        assert_int_equal(idem_begin(f->s, &r, NULL, &lsn), -EBADMSG);
                }
                if (full[i] == '\n') {
                        line++;
                        line_start = i + 1;
                }
        }
        /* the file was never touched by a quarantined load */
        size_t l2;
        char *after = slurp(f->log, &l2);
        assert_int_equal(l2, len);
        assert_memory_equal(after, buf, len);
        free(after);

        /* a flipped payload byte of run:k5's complete: the key is not served
         * and not forgotten, it needs an operator */
        memcpy(buf, full, len);
        char *k5 = strstr(buf, "{\"op\":\"complete\",\"key\":\"run:k5\"");
        assert_non_null(k5);
        char *res = strstr(k5, "\"result\":\"");
        res[12] ^= 0x01;
        spit(f->log, buf, len);
        assert_int_equal(reopen(f), 0);
        assert_true(f->info.corrupt);
        assert_int_equal(f->info.bad_line, 12);
        struct idem_view v;
        assert_int_equal(idem_get(f->s, "run:k5", &v), 0);
        assert_int_equal(v.state, IDEM_ST_INTERRUPTED);
        assert_string_equal(v.reason, "corrupt_record");
        /* records after the bad line were kept: run:k6 interrupted, run:k3 completed */
        assert_int_equal(idem_get(f->s, "run:k6", &v), 0);
        assert_int_equal(v.state, IDEM_ST_INTERRUPTED);
        struct idem_request k3 = rq("run", "k3", "{\"cmd\":[\"echo\",\"a\"]}");
        assert_int_equal(idem_lookup(f->s, &k3, &v), IDEM_HIT_COMPLETED);
        assert_false(idem_needs_compaction(f->s));

        /* operator repair: the corrupt file is kept, the log rewritten */
        assert_int_equal(idem_compact_sync(f->s, f->l), 0);
        assert_int_equal(idem_log_error(f->l), 0);
        char corrupt[512];
        snprintf(corrupt, sizeof(corrupt), "%s.corrupt.%lld", f->log, (long long)(T0 / 1000));
        char *kept = slurp(corrupt, &l2);
        assert_non_null(kept);
        assert_int_equal(l2, len);
        assert_memory_equal(kept, buf, len);
        free(kept);
        struct idem_request r = rq("new", "x", "1");
        uint64_t lsn;
        assert_int_equal(idem_begin(f->s, &r, NULL, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        assert_int_equal(reopen(f), 0);
        assert_false(f->info.corrupt);
        assert_int_equal(idem_get(f->s, "run:k5", &v), 0);
        assert_int_equal(v.state, IDEM_ST_INTERRUPTED);
        assert_int_equal(idem_lookup(f->s, &k3, &v), IDEM_HIT_COMPLETED);
        assert_int_equal(idem_get(f->s, "new:x", &v), 0);
        free(buf);
        free(full);
}

static void test_load_unknown_ops_and_bad_records(void **state)
{
        struct fx *f = *state;
        nosync(f);
        open_fresh(f);
        struct idem_request r = rq("t", "k", "1");
        uint64_t lsn;
        assert_int_equal(idem_begin(f->s, &r, NULL, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_complete(f->s, "t:k", "v", 1, &lsn), 0);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        idem_log_close(f->l);
        f->l = NULL;

        /* a crc-valid record of an op from the future: ignored */
        struct kbuf b = KBUF_INIT;
        const char *body = "{\"op\":\"future\",\"key\":\"t:k\",\"x\":1}";
        char line[256];
        /* the crc of the line without ,"crc":"...", as the writer computes it */
        uint32_t crc = wal_crc(body, strlen(body));
        snprintf(line, sizeof(line), "%.*s,\"crc\":\"%08x\"}\n", (int)strlen(body) - 1, body, crc);
        size_t len;
        char *old = slurp(f->log, &len);
        assert_int_equal(kbuf_append(&b, old, len), 0);
        assert_int_equal(kbuf_puts(&b, line), 0);
        spit(f->log, b.data, b.len);
        assert_int_equal(reopen(f), 0);
        assert_false(f->info.corrupt);
        assert_int_equal(f->info.unknown_ops, 1);
        assert_int_equal(f->info.records, 3);
        struct idem_view v;
        assert_int_equal(idem_lookup(f->s, &r, &v), IDEM_HIT_COMPLETED);

        /* a crc-valid begin without its fingerprint: corruption, not ignored */
        body = "{\"op\":\"begin\",\"key\":\"t:z\",\"tool\":\"t\",\"created\":1}";
        crc = wal_crc(body, strlen(body));
        snprintf(line, sizeof(line), "%.*s,\"crc\":\"%08x\"}\n", (int)strlen(body) - 1, body, crc);
        kbuf_reset(&b);
        assert_int_equal(kbuf_append(&b, old, len), 0);
        assert_int_equal(kbuf_puts(&b, line), 0);
        spit(f->log, b.data, b.len);
        assert_int_equal(reopen(f), 0);
        assert_true(f->info.corrupt);
        assert_int_equal(f->info.bad_line, 3);
        assert_int_equal(f->info.bad_offset, len);
        assert_string_equal(f->info.bad_reason, "record with missing or bad fields");
        /* its key is kept for review */
        assert_int_equal(idem_get(f->s, "t:z", &v), 0);
        assert_int_equal(v.state, IDEM_ST_INTERRUPTED);
        free(old);
        kbuf_free(&b);
}

/* Compaction keeps every live entry (state, payload, LRU order) and drops
 * forgotten, expired and evicted ones. */
/* The owner of a call (the step whose handler made it) is kept in the entry,
 * in every record of it, across a reload and a compaction; a bad owner is
 * refused; idem_foreach finds a step's calls. */
struct owned_count {
        const char *mandate, *step;
        int n, processing;
};

static int count_owned(const struct idem_view *v, void *ctx)
{
        struct owned_count *c = ctx;
        if (v->owner && strcmp(v->owner->mandate, c->mandate) == 0 &&
            strcmp(v->owner->step, c->step) == 0) {
                c->n++;
                c->processing += v->state == IDEM_ST_PROCESSING ||
                                 v->state == IDEM_ST_INTERRUPTED;
        }
        return 0;
}

static void test_owner_recorded_and_reloaded(void **state)
{
        struct fx *f = *state;
        struct idem_step_owner o = { .mandate = "mnd_plan_0123456789ab", .step = "act_001",
                                .attempt = 2 };
        struct idem_request r = rq("cmd_run", "k1", "[\"x\"]");
        struct idem_request r2 = rq("cmd_run", "k2", "[\"y\"]");
        struct idem_request r3 = rq("cmd_run", "k3", "[\"z\"]");
        struct idem_view v;
        uint64_t lsn;

        open_fresh(f);
        r.owner = &o;
        r2.owner = &o;
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        assert_non_null(v.owner);
        assert_string_equal(v.owner->step, "act_001");
        assert_int_equal(idem_complete(f->s, "cmd_run:k1", "ok", 2, &lsn), 0);
        assert_int_equal(idem_begin(f->s, &r2, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_begin(f->s, &r3, &v, &lsn), IDEM_PROCEED);
        assert_null(v.owner);
        assert_int_equal(idem_sync(f->s, f->l), 0);

        size_t len;
        char *log = slurp(f->log, &len);
        assert_non_null(strstr(log, ",\"owner\":{\"mandate\":\"mnd_plan_0123456789ab\","
                                    "\"step\":\"act_001\",\"attempt\":2},"));
        free(log);

        /* the daemon dies: k2 comes back interrupted, still owned */
        assert_int_equal(reopen(f), 0);
        assert_false(f->info.corrupt);
        assert_int_equal(idem_get(f->s, "cmd_run:k1", &v), 0);
        assert_non_null(v.owner);
        assert_string_equal(v.owner->mandate, "mnd_plan_0123456789ab");
        assert_int_equal(v.owner->attempt, 2);
        assert_int_equal(idem_get(f->s, "cmd_run:k2", &v), 0);
        assert_int_equal(v.state, IDEM_ST_INTERRUPTED);
        assert_non_null(v.owner);
        assert_int_equal(idem_get(f->s, "cmd_run:k3", &v), 0);
        assert_null(v.owner);

        struct owned_count c = { "mnd_plan_0123456789ab", "act_001", 0, 0 };
        assert_int_equal(idem_foreach(f->s, count_owned, &c), 0);
        assert_int_equal(c.n, 2);
        assert_int_equal(c.processing, 1);

        /* compaction keeps the owners */
        assert_int_equal(idem_compact_sync(f->s, f->l), 0);
        assert_int_equal(reopen(f), 0);
        c = (struct owned_count){ "mnd_plan_0123456789ab", "act_001", 0, 0 };
        assert_int_equal(idem_foreach(f->s, count_owned, &c), 0);
        assert_int_equal(c.n, 2);
        assert_int_equal(c.processing, 1);
}

/* A tool write's claim (path, sha256, bytes) is kept in every record of its
 * entry, across a reload and a compaction; a log without it still loads;
 * settle decides an interrupted entry: completed (a duplicate replays it) or
 * dropped (recorded as a forget with uid -2: a retry proceeds). */
static void test_write_claim_and_settle(void **state)
{
        struct fx *f = *state;
        static const char sha[] =
                "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        struct idem_write_claim w = { .path = "/srv/out/a \"q\"", .sha256 = sha, .bytes = 12 };
        struct idem_request r1 = rq("kairos.write", "k1", "{}");
        struct idem_request r2 = rq("kairos.write", "k2", "{}");
        struct idem_request r3 = rq("kairos.write", "k3", "{}");
        struct idem_view v;
        uint64_t lsn;

        open_fresh(f);
        struct idem_write_claim bad = { .path = "/x", .sha256 = "0123", .bytes = 1 };
        r1.write = &bad;
        assert_int_equal(idem_begin(f->s, &r1, &v, &lsn), -EINVAL);
        r1.write = r2.write = &w;
        assert_int_equal(idem_begin(f->s, &r1, &v, &lsn), IDEM_PROCEED);
        assert_string_equal(v.write.path, w.path);
        assert_string_equal(v.write.sha256, sha);
        assert_int_equal(v.write.bytes, 12);
        assert_int_equal(idem_begin(f->s, &r2, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_begin(f->s, &r3, &v, &lsn), IDEM_PROCEED);
        assert_null(v.write.path);
        /* not finished: settle is for open entries only */
        assert_int_equal(idem_settle_complete(f->s, "kairos.write:nope", "x", 1, &lsn), -ENOENT);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        size_t len;
        char *log = slurp(f->log, &len);
        assert_non_null(strstr(log, ",\"write\":{\"sha256\":\"0123456789abcdef0123456789abcdef"
                                    "0123456789abcdef0123456789abcdef\",\"bytes\":12,"
                                    "\"path\":\"/srv/out/a \\\"q\\\"\"},"));
        free(log);

        /* the daemon dies: both come back interrupted, with their claims */
        assert_int_equal(reopen(f), 0);
        assert_int_equal(f->info.interrupted, 3);
        assert_int_equal(idem_get(f->s, "kairos.write:k1", &v), 0);
        assert_int_equal(v.state, IDEM_ST_INTERRUPTED);
        assert_string_equal(v.write.path, w.path);
        assert_string_equal(v.write.sha256, sha);
        assert_int_equal(v.write.bytes, 12);
        assert_int_equal(idem_get(f->s, "kairos.write:k3", &v), 0);
        assert_null(v.write.path);
        assert_int_equal(idem_settle_complete(f->s, "kairos.write:k1", "{\"path\":1}", 10, &lsn),
                         0);
        assert_int_equal(idem_settle_abandon(f->s, "kairos.write:k2", "no file", &lsn), 0);
        assert_int_equal(idem_settle_complete(f->s, "kairos.write:k1", "x", 1, &lsn), -ESTALE);
        assert_int_equal(idem_settle_abandon(f->s, "kairos.write:k1", "x", &lsn), -ESTALE);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        log = slurp(f->log, &len);
        assert_non_null(strstr(log, "{\"op\":\"forget\",\"key\":\"kairos.write:k2\","
                                    "\"uid\":-2,\"reason\":\"no file\""));
        free(log);
        assert_int_equal(reopen(f), 0);
        assert_int_equal(f->info.interrupted, 1);
        assert_int_equal(idem_begin(f->s, &r1, &v, &lsn), IDEM_HIT_COMPLETED);
        assert_memory_equal(v.result, "{\"path\":1}", 10);
        assert_string_equal(v.write.path, w.path);
        assert_int_equal(idem_begin(f->s, &r2, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        /* compaction keeps the claims */
        assert_int_equal(idem_compact_sync(f->s, f->l), 0);
        assert_int_equal(reopen(f), 0);
        assert_int_equal(idem_get(f->s, "kairos.write:k2", &v), 0);
        assert_int_equal(v.state, IDEM_ST_INTERRUPTED);
        assert_string_equal(v.write.sha256, sha);
        assert_int_equal(idem_get(f->s, "kairos.write:k1", &v), 0);
        assert_string_equal(v.write.path, w.path);
}

/* idem_log_read: an offline reader (kairosctl recover --dry-run) sees what a
 * daemon's start would (processing → interrupted, owners) and changes nothing
 * on disk: no directory made, a torn tail counted but not cut, no lock. */
static void test_log_read_only(void **state)
{
        struct fx *f = *state;
        struct idem_step_owner o = { .mandate = "mnd_plan_0123456789ab", .step = "act_001",
                                     .attempt = 1 };
        struct idem_request r = rq("cmd_run", "k1", "[\"x\"]");
        struct idem_request r2 = rq("cmd_run", "k2", "[\"y\"]");
        struct idem_view v;
        uint64_t lsn;
        struct idem_store *ro = NULL;
        struct idem_load_info info;
        struct stat st;

        /* no log, no directory: an empty store, nothing created */
        assert_int_equal(idem_store_new(&f->opt, &ro), 0);
        assert_int_equal(idem_log_read(f->sub, ro, &info), 0);
        assert_true(info.created);
        assert_int_equal(stat(f->sub, &st), -1);
        idem_store_free(ro);

        open_fresh(f);
        r.owner = &o;
        r2.owner = &o;
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_complete(f->s, "cmd_run:k1", "ok", 2, &lsn), 0);
        assert_int_equal(idem_begin(f->s, &r2, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        /* a torn tail after the good records */
        FILE *fp = fopen(f->log, "ab");
        assert_non_null(fp);
        fputs("{\"op\":\"begin\",\"key\":\"cmd_run:k3\"", fp);
        fclose(fp);
        size_t before_len, after_len;
        char *before = slurp(f->log, &before_len);

        assert_int_equal(idem_store_new(&f->opt, &ro), 0);
        assert_int_equal(idem_log_read(f->sub, ro, &info), 0);
        assert_false(info.created);
        assert_false(info.corrupt);
        assert_int_equal(info.entries, 2);
        assert_int_equal(info.interrupted, 1);
        assert_true(info.torn_bytes > 0);
        assert_false(info.torn_repaired);
        assert_int_equal(idem_get(ro, "cmd_run:k1", &v), 0);
        assert_int_equal(v.state, IDEM_ST_COMPLETED);
        assert_non_null(v.owner);
        assert_string_equal(v.owner->step, "act_001");
        assert_int_equal(idem_get(ro, "cmd_run:k2", &v), 0);
        assert_int_equal(v.state, IDEM_ST_INTERRUPTED);
        /* a second load into the same store is refused */
        assert_int_equal(idem_log_read(f->sub, ro, &info), -EINVAL);
        idem_store_free(ro);

        char *after = slurp(f->log, &after_len);
        assert_int_equal(before_len, after_len);
        assert_memory_equal(before, after, before_len);
        free(before);
        free(after);
        /* nothing kept aside either */
        DIR *d = opendir(f->sub);
        assert_non_null(d);
        struct dirent *de;
        int files = 0;
        while ((de = readdir(d)))
                files += de->d_name[0] != '.';
        closedir(d);
        assert_int_equal(files, 1);
}

static int stop_at_first(const struct idem_view *v, void *ctx)
{
        (*(int *)ctx)++;
        return 7;
}

static void test_owner_bad_refused(void **state)
{
        struct fx *f = *state;
        struct idem_view v;
        uint64_t lsn;
        mem_store(f);
        struct idem_step_owner bad[] = {
                { .mandate = "", .step = "act_001", .attempt = 1 },
                { .mandate = "m", .step = "", .attempt = 1 },
                { .mandate = "m", .step = "act_001", .attempt = 0 },
                { .mandate = "m/..", .step = "act_001", .attempt = 1 },
                { .mandate = "m", .step = "a\"b", .attempt = 1 },
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                struct idem_request r = rq("t", "k", "{}");
                r.owner = &bad[i];
                assert_int_equal(idem_owner_check(&bad[i]), -EINVAL);
                assert_int_equal(idem_begin(f->s, &r, &v, &lsn), -EINVAL);
        }
        struct idem_stats st;
        idem_stats(f->s, &st);
        assert_int_equal(st.size, 0);
        assert_int_equal(idem_foreach(f->s, NULL, NULL), -EINVAL);
        run_ok(f, "t", "a", "{}", "x", 1);
        run_ok(f, "t", "b", "{}", "x", 1);
        int calls = 0;
        assert_int_equal(idem_foreach(f->s, stop_at_first, &calls), 7);
        assert_int_equal(calls, 1);
}

static void test_owner_bad_in_log_is_corruption(void **state)
{
        struct fx *f = *state;
        struct idem_step_owner o = { .mandate = "mnd_x", .step = "act_001", .attempt = 1 };
        struct idem_request r = rq("t", "k", "{}");
        struct idem_view v;
        uint64_t lsn;
        r.owner = &o;
        open_fresh(f);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_complete(f->s, "t:k", "ok", 2, &lsn), 0);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        /* rewrite the first record's owner with attempt 0 and a valid crc */
        size_t len;
        char *log = slurp(f->log, &len);
        char *nl = memchr(log, '\n', len);
        assert_non_null(nl);
        char *p = strstr(log, "\"attempt\":1}");
        assert_true(p && p < nl);
        p[10] = '0';
        char *crc = strstr(log, ",\"crc\":\"");
        assert_true(crc && crc < nl);
        char line[4096];
        size_t head = (size_t)(crc - log);
        memcpy(line, log, head);
        line[head] = '}';
        char hex[9];
        snprintf(hex, sizeof(hex), "%08x", wal_crc(line, head + 1));
        memcpy(crc + 8, hex, 8);
        spit(f->log, log, len);
        free(log);
        assert_int_equal(reopen(f), 0);
        assert_true(f->info.corrupt);
        assert_int_equal(f->info.bad_line, 1);
}

static void test_compaction(void **state)
{
        struct fx *f = *state;
        struct idem_view v;
        uint64_t lsn;
        char key[32], res[32];

        f->opt.ttl_sec = 1000;
        f->opt.capacity = 100;
        nosync(f);
        open_fresh(f);
        for (int i = 0; i < 40; i++) {
                snprintf(key, sizeof(key), "k%02d", i);
                snprintf(res, sizeof(res), "result-%02d", i);
                struct idem_request r = rq("t", key, "{}");
                assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
                snprintf(key, sizeof(key), "t:k%02d", i);
                assert_int_equal(idem_complete(f->s, key, res, strlen(res), &lsn), 0);
                assert_int_equal(idem_sync(f->s, f->l), 0);
                if (i == 9)
                        f->now += 500 * 1000; /* k00..k09 will expire first */
        }
        for (int i = 10; i < 20; i++) {
                snprintf(key, sizeof(key), "t:k%02d", i);
                assert_int_equal(idem_forget(f->s, key, 0, "test", &lsn), 0);
        }
        struct idem_request p = rq("t", "proc", "{}");
        assert_int_equal(idem_begin(f->s, &p, &v, &lsn), IDEM_PROCEED);
        struct idem_request q = rq("t", "intr", "{}");
        assert_int_equal(idem_begin(f->s, &q, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_interrupt(f->s, "t:intr", "client_closed", &lsn), 0);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        f->now += 600 * 1000; /* k00..k09 expired, k10.. not */

        struct idem_stats st;
        idem_stats(f->s, &st);
        assert_int_equal(st.log_records, 80 + 10 + 3);
        assert_true(idem_needs_compaction(f->s));
        assert_int_equal(idem_compact_sync(f->s, f->l), 0);
        idem_stats(f->s, &st);
        assert_int_equal(st.size, 22);
        assert_int_equal(st.log_records, 22);
        assert_false(idem_needs_compaction(f->s));
        size_t len;
        char *data = slurp(f->log, &len);
        assert_int_equal(count_lines(data, len), 22);
        assert_null(strstr(data, "\"t:k00\""));
        assert_null(strstr(data, "\"t:k15\""));
        assert_null(strstr(data, "forget"));
        free(data);
        struct stat sb;
        char tmp[256];
        snprintf(tmp, sizeof(tmp), "%s.tmp", f->log);
        assert_int_equal(stat(tmp, &sb), -1);

        /* reload with a capacity of 21: the LRU one (k20) goes, in-flight stay */
        f->opt.capacity = 21;
        assert_int_equal(reopen(f), 0);
        assert_int_equal(f->info.records, 22);
        assert_int_equal(f->info.evicted, 1);
        assert_int_equal(idem_get(f->s, "t:k20", &v), -ENOENT);
        for (int i = 21; i < 40; i++) {
                snprintf(key, sizeof(key), "t:k%02d", i);
                snprintf(res, sizeof(res), "result-%02d", i);
                assert_int_equal(idem_get(f->s, key, &v), 0);
                assert_int_equal(v.state, IDEM_ST_COMPLETED);
                assert_int_equal(v.result_len, strlen(res));
                assert_memory_equal(v.result, res, strlen(res));
        }
        assert_int_equal(idem_get(f->s, "t:proc", &v), 0);
        assert_int_equal(v.state, IDEM_ST_INTERRUPTED);
        assert_int_equal(idem_get(f->s, "t:intr", &v), 0);
        assert_string_equal(v.reason, "client_closed");
        for (int i = 0; i < 20; i++) {
                snprintf(key, sizeof(key), "t:k%02d", i);
                assert_int_equal(idem_get(f->s, key, &v), -ENOENT);
        }
}

/* Records produced after a snapshot are appended after the compaction. */
static void test_snapshot_protocol(void **state)
{
        struct fx *f = *state;
        uint64_t lsn, upto;
        struct kbuf pend = KBUF_INIT, snapb = KBUF_INIT;
        struct idem_snapshot snap;
        nosync(f);
        open_fresh(f);
        struct idem_request a = rq("t", "a", "1");
        assert_int_equal(idem_begin(f->s, &a, NULL, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_snapshot(f->s, &snapb, &snap), -EBUSY);
        assert_int_equal(idem_take_pending(f->s, &pend, &upto), 0);
        assert_int_equal(upto, lsn);
        assert_int_equal(idem_snapshot(f->s, &snapb, &snap), 0);
        assert_int_equal(snap.records, 1);
        /* the loop goes on while the pool works */
        assert_int_equal(idem_complete(f->s, "t:a", "r", 1, &lsn), 0);
        /* pool: the queued append, then the compaction */
        assert_int_equal(idem_log_append(f->l, pend.data, pend.len), 0);
        idem_durable(f->s, upto);
        assert_int_equal(idem_log_compact(f->l, snapb.data, snapb.len), 0);
        idem_compacted(f->s, &snap);
        struct idem_view v;
        assert_int_equal(idem_lookup(f->s, &a, &v), IDEM_IN_PROGRESS); /* complete not durable */
        assert_int_equal(idem_sync(f->s, f->l), 0);
        assert_int_equal(idem_lookup(f->s, &a, &v), IDEM_HIT_COMPLETED);
        struct idem_stats st;
        idem_stats(f->s, &st);
        assert_int_equal(st.log_records, 2);
        assert_int_equal(reopen(f), 0);
        assert_int_equal(f->info.records, 2);
        assert_int_equal(idem_lookup(f->s, &a, &v), IDEM_HIT_COMPLETED);
        kbuf_free(&pend);
        kbuf_free(&snapb);
}

/* A failing rename: the old log stays in use, nothing is lost. */
static void test_compaction_failure_keeps_old_log(void **state)
{
        struct fx *f = *state;
        uint64_t lsn;
        nosync(f);
        open_fresh(f);
        run_ok(f, "t", "a", "1", "A", 1);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        f->fio.fail_op = OP_RENAME;
        f->fio.fail_nth = 1;
        f->fio.fail_err = -EIO;
        assert_int_equal(idem_compact_sync(f->s, f->l), -EIO);
        f->fio.fail_op = -1;
        assert_int_equal(idem_log_error(f->l), 0);
        struct idem_stats st;
        idem_stats(f->s, &st);
        assert_int_equal(st.error, 0);
        struct idem_request b = rq("t", "b", "1");
        assert_int_equal(idem_begin(f->s, &b, NULL, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        assert_int_equal(reopen(f), 0);
        assert_int_equal(f->info.records, 3);
        struct idem_view v;
        struct idem_request a = rq("t", "a", "1");
        assert_int_equal(idem_lookup(f->s, &a, &v), IDEM_HIT_COMPLETED);
        assert_int_equal(idem_get(f->s, "t:b", &v), 0);
}

/* fdatasync EIO: reported, nothing acknowledged, never fsynced again on that
 * descriptor, every later mutation refused (lookups still answered). */
static void test_fdatasync_eio(void **state)
{
        struct fx *f = *state;
        struct idem_view v;
        uint64_t lsn;
        open_fresh(f);
        run_ok(f, "t", "done", "1", "D", 1);
        assert_int_equal(idem_sync(f->s, f->l), 0);

        struct idem_request a = rq("t", "a", "1");
        assert_int_equal(idem_begin(f->s, &a, &v, &lsn), IDEM_PROCEED);
        f->fio.fail_op = OP_FDATASYNC;
        f->fio.fail_nth = 1;
        f->fio.fail_err = -EIO;
        f->fio.calls[OP_FDATASYNC] = 0;
        assert_int_equal(idem_sync(f->s, f->l), -EIO);
        assert_int_equal(f->fio.calls[OP_FDATASYNC], 1);
        /* the begin was not acknowledged: its caller must not run the tool */
        assert_int_equal(idem_get(f->s, "t:a", &v), 0);
        assert_false(v.durable);
        struct idem_stats st;
        idem_stats(f->s, &st);
        assert_int_equal(st.error, -EIO);
        assert_true(st.durable_lsn < lsn);
        assert_int_equal(idem_log_error(f->l), -EIO);

        /* everything later fails with the first error, without touching the fd */
        f->fio.fail_op = -1;
        int writes = f->fio.calls[OP_WRITE];
        struct idem_request b = rq("t", "b", "1");
        assert_int_equal(idem_begin(f->s, &b, &v, &lsn), -EIO);
        assert_int_equal(idem_complete(f->s, "t:a", "x", 1, &lsn), -EIO);
        assert_int_equal(idem_log_append(f->l, "x\n", 2), -EIO);
        assert_int_equal(idem_sync(f->s, f->l), 0); /* nothing pending */
        assert_int_equal(idem_compact_sync(f->s, f->l), -EIO);
        assert_int_equal(f->fio.calls[OP_FDATASYNC], 1);
        assert_int_equal(f->fio.calls[OP_WRITE], writes);
        /* a finished, durable entry is still served */
        struct idem_request d = rq("t", "done", "1");
        assert_int_equal(idem_lookup(f->s, &d, &v), IDEM_HIT_COMPLETED);
        /* after a restart the un-acknowledged begin is interrupted (it may have landed) */
        assert_int_equal(reopen(f), 0);
        assert_int_equal(idem_get(f->s, "t:a", &v), 0);
        assert_int_equal(v.state, IDEM_ST_INTERRUPTED);
}

/* A short write is truncated away before anything else; the log is failed. */
static void test_short_write_truncated(void **state)
{
        struct fx *f = *state;
        uint64_t lsn;
        nosync(f);
        open_fresh(f);
        run_ok(f, "t", "a", "1", "A", 1);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        struct stat st;
        assert_int_equal(stat(f->log, &st), 0);
        off_t good = st.st_size;

        struct idem_request b = rq("t", "b", "1");
        assert_int_equal(idem_begin(f->s, &b, NULL, &lsn), IDEM_PROCEED);
        f->fio.short_nth = f->fio.calls[OP_WRITE] + 1;
        int syncs = f->fio.calls[OP_FDATASYNC];
        assert_int_equal(idem_sync(f->s, f->l), -ENOSPC);
        assert_int_equal(f->fio.calls[OP_FDATASYNC], syncs);
        assert_int_equal(stat(f->log, &st), 0);
        assert_int_equal(st.st_size, good);
        assert_int_equal(idem_log_error(f->l), -ENOSPC);
        f->fio.fail_op = -1;
        f->fio.short_nth = 0;
        assert_int_equal(reopen(f), 0);
        assert_false(f->info.corrupt);
        assert_false(f->info.torn_repaired);
        assert_int_equal(f->info.records, 2);
}

/* The begin record's fdatasync happens inside idem_sync, before the caller
 * is told to proceed, and open fsyncs the new log's directory. */
static void test_durability_calls(void **state)
{
        struct fx *f = *state;
        uint64_t lsn;
        open_fresh(f);
        assert_true(f->fio.calls[OP_FSYNC_DIR] >= 1);
        struct idem_request a = rq("t", "a", "1");
        struct idem_request b = rq("t", "b", "1");
        assert_int_equal(idem_begin(f->s, &a, NULL, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_begin(f->s, &b, NULL, &lsn), IDEM_PROCEED);
        assert_true(idem_pending_bytes(f->s) > 0);
        int syncs = f->fio.calls[OP_FDATASYNC];
        assert_int_equal(idem_sync(f->s, f->l), 0);
        /* one barrier for both records */
        assert_int_equal(f->fio.calls[OP_FDATASYNC], syncs + 1);
        assert_int_equal(idem_log_flush_count(f->l), 1);
        assert_int_equal(idem_pending_bytes(f->s), 0);
        struct stat st;
        assert_int_equal(stat(f->log, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0600);
        assert_int_equal(stat(f->sub, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0750); /* STATEDIR_DIR_MODE, like every state dir */
        /* a store that already holds entries cannot be loaded into */
        struct idem_log *l2 = NULL;
        assert_int_equal(idem_log_open(f->sub, &f->io, f->s, &l2, NULL), -EINVAL);
        assert_null(l2);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_content_key_stable_across_key_order, setup, teardown),
                cmocka_unit_test_setup_teardown(test_owner_recorded_and_reloaded, setup, teardown),
                cmocka_unit_test_setup_teardown(test_write_claim_and_settle, setup, teardown),
                cmocka_unit_test_setup_teardown(test_owner_bad_refused, setup, teardown),
                cmocka_unit_test_setup_teardown(test_owner_bad_in_log_is_corruption, setup, teardown),
                cmocka_unit_test_setup_teardown(test_different_input_different_key, setup, teardown),
                cmocka_unit_test_setup_teardown(test_completed_duplicate_returns_cached_result, setup, teardown),
                cmocka_unit_test_setup_teardown(test_failed_duplicate_returns_cached_error_with_class, setup, teardown),
                cmocka_unit_test_setup_teardown(test_explicit_keys, setup, teardown),
                cmocka_unit_test_setup_teardown(test_stats, setup, teardown),
                cmocka_unit_test_setup_teardown(test_duplicate_while_processing_is_in_progress, setup, teardown),
                cmocka_unit_test_setup_teardown(test_expiry_checked_on_lookup, setup, teardown),
                cmocka_unit_test_setup_teardown(test_inflight_never_evicted, setup, teardown),
                cmocka_unit_test_setup_teardown(test_eviction_lru_order_mixed, setup, teardown),
                cmocka_unit_test_setup_teardown(test_explicit_key_two_tools_no_collision, setup, teardown),
                cmocka_unit_test_setup_teardown(test_mismatch_detected, setup, teardown),
                cmocka_unit_test_setup_teardown(test_interrupted_and_forget, setup, teardown),
                cmocka_unit_test_setup_teardown(test_abandon, setup, teardown),
                cmocka_unit_test_setup_teardown(test_bad_arguments, setup, teardown),
                cmocka_unit_test_setup_teardown(test_reload_after_begin_only_is_interrupted, setup, teardown),
                cmocka_unit_test_setup_teardown(test_reload_after_finish_replays_bytes, setup, teardown),
                cmocka_unit_test_setup_teardown(test_model_reload, setup, teardown),
                cmocka_unit_test_setup_teardown(test_torn_tail_every_offset, setup, teardown),
                cmocka_unit_test_setup_teardown(test_bit_flips_reported, setup, teardown),
                cmocka_unit_test_setup_teardown(test_load_unknown_ops_and_bad_records, setup, teardown),
                cmocka_unit_test_setup_teardown(test_compaction, setup, teardown),
                cmocka_unit_test_setup_teardown(test_snapshot_protocol, setup, teardown),
                cmocka_unit_test_setup_teardown(test_compaction_failure_keeps_old_log, setup, teardown),
                cmocka_unit_test_setup_teardown(test_fdatasync_eio, setup, teardown),
                cmocka_unit_test_setup_teardown(test_short_write_truncated, setup, teardown),
                cmocka_unit_test_setup_teardown(test_durability_calls, setup, teardown),
                cmocka_unit_test_setup_teardown(test_log_read_only, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
