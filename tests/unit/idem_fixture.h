/* SPDX-License-Identifier: MIT */
/* The fixture of the idempotency store's tests (test_idem.c: the store,
 * test_idem_log.c: its log): a store and log in a temporary directory, a
 * fake clock, and a counting / failing kio around kio_posix. */
#pragma once

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

static __attribute__((unused)) int fio_call(struct fio *f, int op)
{
        int k = ++f->calls[op];
        if (f->fail_op == op && k >= f->fail_nth)
                return f->fail_err;
        return 0;
}

static __attribute__((unused)) int f_open(void *ctx, const char *path, int flags, mode_t mode)
{
        int e = fio_call(ctx, OP_OPEN);
        return e ? e : kio_posix()->open(NULL, path, flags, mode);
}

static __attribute__((unused)) ssize_t f_write(void *ctx, int fd, const void *buf, size_t n)
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

static __attribute__((unused)) int f_fdatasync(void *ctx, int fd)
{
        struct fio *f = ctx;
        int e = fio_call(f, OP_FDATASYNC);
        return e ? e : f->nosync ? 0 : kio_posix()->fdatasync(NULL, fd);
}

static __attribute__((unused)) int f_fsync(void *ctx, int fd)
{
        struct fio *f = ctx;
        int e = fio_call(f, OP_FSYNC);
        return e ? e : f->nosync ? 0 : kio_posix()->fsync(NULL, fd);
}

static __attribute__((unused)) int f_close(void *ctx, int fd)
{
        fio_call(ctx, OP_CLOSE);
        return kio_posix()->close(NULL, fd);
}

static __attribute__((unused)) int f_ftruncate(void *ctx, int fd, off_t len)
{
        int e = fio_call(ctx, OP_FTRUNCATE);
        return e ? e : kio_posix()->ftruncate(NULL, fd, len);
}

static __attribute__((unused)) int f_rename(void *ctx, const char *from, const char *to)
{
        int e = fio_call(ctx, OP_RENAME);
        return e ? e : kio_posix()->rename(NULL, from, to);
}

static __attribute__((unused)) int f_unlink(void *ctx, const char *path)
{
        int e = fio_call(ctx, OP_UNLINK);
        return e ? e : kio_posix()->unlink(NULL, path);
}

static __attribute__((unused)) int f_mkdir(void *ctx, const char *path, mode_t mode)
{
        int e = fio_call(ctx, OP_MKDIR);
        return e ? e : kio_posix()->mkdir(NULL, path, mode);
}

static __attribute__((unused)) int f_fsync_dir(void *ctx, const char *path)
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

static __attribute__((unused)) int64_t fake_clock(void *ctx)
{
        return *(const int64_t *)ctx;
}

static __attribute__((unused)) int setup(void **state)
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
                              f_rename, f_unlink, f_mkdir, f_fsync_dir, NULL, &f->fio, NULL,
                              NULL };
        f->opt = (struct idem_options){ .now_ms = fake_clock, .clock_ctx = &f->now };
        *state = f;
        return 0;
}

static __attribute__((unused)) void rm_rf(const char *path)
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

static __attribute__((unused)) int teardown(void **state)
{
        struct fx *f = *state;
        idem_log_close(f->l);
        idem_store_free(f->s);
        rm_rf(f->dir);
        free(f);
        return 0;
}

/* A store without a log, for the in-memory semantics. */
static __attribute__((unused)) void mem_store(struct fx *f)
{
        assert_int_equal(idem_store_new(&f->opt, &f->s), 0);
}

/* Close and reopen store + log from the directory. */
static __attribute__((unused)) int reopen(struct fx *f)
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
static __attribute__((unused)) void ack(struct fx *f)
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

static __attribute__((unused)) struct idem_request rq(const char *tool, const char *key, const char *input)
{
        return (struct idem_request){ .tool = tool, .key = key, .input_json = input,
                                      .input_len = strlen(input) };
}

/* begin + complete + durable: a finished call. */
static __attribute__((unused)) void run_ok(struct fx *f, const char *tool, const char *key, const char *input,
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

static __attribute__((unused)) char *slurp(const char *path, size_t *len)
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

static __attribute__((unused)) void spit(const char *path, const void *data, size_t len)
{
        FILE *fp = fopen(path, "wb");
        assert_non_null(fp);
        if (len)
                assert_int_equal(fwrite(data, 1, len, fp), len);
        assert_int_equal(fclose(fp), 0);
}

static __attribute__((unused)) size_t count_lines(const char *d, size_t n)
{
        size_t c = 0;
        for (size_t i = 0; i < n; i++)
                c += d[i] == '\n';
        return c;
}

