/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <time.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <zlib.h>

#include "kairos/kbuf.h"
#include "kairos/kio.h"

/* ---- a recording / failing kio wrapped around kio_posix ---------------- */

#define LOG_MAX 64

struct rec {
        char log[LOG_MAX][256];
        int n;
        const char *fail_op;   /* name of the op to fail, NULL = none */
        int fail_nth;          /* fail the nth call of that op (1-based); 0 = every */
        int fail_err;          /* negative errno */
        int seen;              /* calls of fail_op so far */
        size_t write_cap;      /* > 0: write at most this many bytes per call */
        int eintr_every_other; /* write: return -EINTR on every other call */
        int write_calls;
};

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

static int rec_fail(struct rec *r, const char *op)
{
        if (!r->fail_op || strcmp(r->fail_op, op) != 0)
                return 0;
        r->seen++;
        if (r->fail_nth == 0 || r->fail_nth == r->seen)
                return r->fail_err;
        return 0;
}

static int r_open(void *ctx, const char *path, int flags, mode_t mode)
{
        rec_log(ctx, "open %s", path);
        int f = rec_fail(ctx, "open");
        return f ? f : kio_posix()->open(NULL, path, flags, mode);
}

static ssize_t r_write(void *ctx, int fd, const void *buf, size_t n)
{
        struct rec *r = ctx;
        rec_log(r, "write %zu", n);
        r->write_calls++;
        if (r->eintr_every_other && r->write_calls % 2 == 1)
                return -EINTR;
        int f = rec_fail(r, "write");
        if (f)
                return f;
        if (r->write_cap && n > r->write_cap)
                n = r->write_cap;
        return kio_posix()->write(NULL, fd, buf, n);
}

static int r_fdatasync(void *ctx, int fd)
{
        rec_log(ctx, "fdatasync");
        int f = rec_fail(ctx, "fdatasync");
        return f ? f : kio_posix()->fdatasync(NULL, fd);
}

static int r_fsync(void *ctx, int fd)
{
        rec_log(ctx, "fsync");
        int f = rec_fail(ctx, "fsync");
        return f ? f : kio_posix()->fsync(NULL, fd);
}

static int r_close(void *ctx, int fd)
{
        rec_log(ctx, "close");
        return kio_posix()->close(NULL, fd);
}

static int r_ftruncate(void *ctx, int fd, off_t len)
{
        rec_log(ctx, "ftruncate %lld", (long long)len);
        int f = rec_fail(ctx, "ftruncate");
        return f ? f : kio_posix()->ftruncate(NULL, fd, len);
}

static int r_rename(void *ctx, const char *from, const char *to)
{
        rec_log(ctx, "rename %s %s", from, to);
        int f = rec_fail(ctx, "rename");
        return f ? f : kio_posix()->rename(NULL, from, to);
}

static int r_unlink(void *ctx, const char *path)
{
        rec_log(ctx, "unlink %s", path);
        int f = rec_fail(ctx, "unlink");
        return f ? f : kio_posix()->unlink(NULL, path);
}

static int r_mkdir(void *ctx, const char *path, mode_t mode)
{
        rec_log(ctx, "mkdir %s", path);
        int f = rec_fail(ctx, "mkdir");
        return f ? f : kio_posix()->mkdir(NULL, path, mode);
}

static int r_fsync_dir(void *ctx, const char *path)
{
        rec_log(ctx, "fsync_dir %s", path);
        int f = rec_fail(ctx, "fsync_dir");
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
        };
        return io;
}

/* The rest of the log, from index *i, must continue with exactly want. */
static void expect_log(struct rec *r, int *i, const char *want)
{
        assert_true(*i < r->n);
        assert_string_equal(r->log[*i], want);
        (*i)++;
}

/* ---- fixtures ------------------------------------------------------------ */

struct fx {
        char dir[64];
};

static int setup(void **state)
{
        struct fx *f = calloc(1, sizeof(*f));
        if (!f)
                return -1;
        strcpy(f->dir, "/tmp/kio-test-XXXXXX");
        if (!mkdtemp(f->dir)) {
                free(f);
                return -1;
        }
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

static char *read_all(const char *path, size_t *len)
{
        FILE *fp = fopen(path, "rb");
        if (!fp)
                return NULL;
        char *buf = malloc(65536);
        assert_non_null(buf);
        *len = fread(buf, 1, 65535, fp);
        buf[*len] = '\0';
        fclose(fp);
        return buf;
}

static bool exists(const char *path)
{
        struct stat st;
        return stat(path, &st) == 0;
}

/* ---- kio_posix -------------------------------------------------------------- */

static void test_posix_returns_negative_errno(void **state)
{
        struct fx *f = *state;
        const struct kio *io = kio_posix();
        char p[128];

        snprintf(p, sizeof(p), "%s/missing/x", f->dir);
        assert_int_equal(io->open(io->ctx, p, O_RDONLY, 0), -ENOENT);
        assert_int_equal(io->unlink(io->ctx, p), -ENOENT);
        assert_int_equal(io->rename(io->ctx, p, p), -ENOENT);
        assert_int_equal(io->fsync_dir(io->ctx, p), -ENOENT);
        assert_int_equal(io->mkdir(io->ctx, f->dir, 0700), -EEXIST);
        assert_int_equal(io->fdatasync(io->ctx, -1), -EBADF);
        assert_int_equal(io->fsync(io->ctx, -1), -EBADF);
        assert_int_equal(io->ftruncate(io->ctx, -1, 0), -EBADF);
        assert_int_equal(io->write(io->ctx, -1, "x", 1), -EBADF);
        assert_int_equal(io->close(io->ctx, -1), -EBADF);

        snprintf(p, sizeof(p), "%s/f", f->dir);
        int fd = io->open(io->ctx, p, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        assert_int_equal(io->write(io->ctx, fd, "hello", 5), 5);
        assert_int_equal(io->fdatasync(io->ctx, fd), 0);
        assert_int_equal(io->fsync(io->ctx, fd), 0);
        assert_int_equal(io->ftruncate(io->ctx, fd, 2), 0);
        assert_int_equal(io->close(io->ctx, fd), 0);
        assert_int_equal(io->fsync_dir(io->ctx, f->dir), 0);
        size_t len;
        char *got = read_all(p, &len);
        assert_non_null(got);
        assert_int_equal(len, 2);
        assert_memory_equal(got, "he", 2);
        free(got);
        /* fsync_dir of a regular file is not a directory */
        assert_int_equal(io->fsync_dir(io->ctx, p), -ENOTDIR);
}

/* ---- kio_write_all -------------------------------------------------------- */

static void test_write_all_partial_and_eintr(void **state)
{
        struct fx *f = *state;
        struct rec r = { .write_cap = 3, .eintr_every_other = 1 };
        struct kio io = rec_kio(&r);
        char p[128];
        snprintf(p, sizeof(p), "%s/w", f->dir);
        int fd = io.open(io.ctx, p, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        assert_true(fd >= 0);

        const char *msg = "0123456789abcdefghij"; /* 20 bytes: 7 partial writes of <= 3 */
        size_t written = 999;
        assert_int_equal(kio_write_all(&io, fd, msg, 20, &written), 0);
        assert_int_equal(written, 20);
        /* 7 real writes plus 7 EINTRs */
        assert_int_equal(r.write_calls, 14);
        io.close(io.ctx, fd);

        size_t len;
        char *got = read_all(p, &len);
        assert_int_equal(len, 20);
        assert_memory_equal(got, msg, 20);
        free(got);
}

static void test_write_all_reports_landed_bytes(void **state)
{
        struct fx *f = *state;
        /* 4 bytes per call; the third call fails with ENOSPC: 8 bytes landed */
        struct rec r = { .write_cap = 4, .fail_op = "write", .fail_nth = 3, .fail_err = -ENOSPC };
        struct kio io = rec_kio(&r);
        char p[128];
        snprintf(p, sizeof(p), "%s/w", f->dir);
        int fd = io.open(io.ctx, p, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        size_t written = 0;
        assert_int_equal(kio_write_all(&io, fd, "0123456789abcdef", 16, &written), -ENOSPC);
        assert_int_equal(written, 8);
        io.close(io.ctx, fd);
        size_t len;
        char *got = read_all(p, &len);
        assert_int_equal(len, 8);
        free(got);
        /* written may be NULL */
        fd = io.open(io.ctx, p, O_WRONLY | O_CLOEXEC, 0);
        r.seen = 0;
        r.fail_nth = 1;
        assert_int_equal(kio_write_all(&io, fd, "x", 1, NULL), -ENOSPC);
        io.close(io.ctx, fd);
}

static ssize_t zero_write(void *ctx, int fd, const void *buf, size_t n)
{
        (void)buf;
        (void)n;
        (void)fd;
        int *calls = ctx;
        (*calls)++;
        return 0;
}

static void test_write_all_zero_progress_does_not_spin(void **state)
{
        (void)state;
        int calls = 0;
        struct kio io = *kio_posix();
        io.write = zero_write;
        io.ctx = &calls;
        size_t written = 7;
        assert_int_equal(kio_write_all(&io, 1, "abc", 3, &written), -EIO);
        assert_int_equal(written, 0);
        assert_int_equal(calls, 1);
        /* nothing to write: no call at all */
        assert_int_equal(kio_write_all(&io, 1, "", 0, &written), 0);
        assert_int_equal(calls, 1);
}

/* ---- kio_fsync_parent ----------------------------------------------------- */

static void test_fsync_parent_names_the_directory(void **state)
{
        struct fx *f = *state;
        struct rec r = { 0 };
        struct kio io = rec_kio(&r);
        char p[128];
        snprintf(p, sizeof(p), "%s/file", f->dir);
        assert_int_equal(kio_fsync_parent(&io, p), 0);
        char want[160];
        snprintf(want, sizeof(want), "fsync_dir %s", f->dir);
        int i = 0;
        expect_log(&r, &i, want);

        snprintf(p, sizeof(p), "%s//file", f->dir);
        assert_int_equal(kio_fsync_parent(&io, p), 0);
        expect_log(&r, &i, want);

        /* failures are passed on: a missing parent */
        snprintf(p, sizeof(p), "%s/nope/file", f->dir);
        assert_int_equal(kio_fsync_parent(&io, p), -ENOENT);
        i++;

        r.fail_op = "fsync_dir";
        r.fail_err = -EIO;
        assert_int_equal(kio_fsync_parent(&io, "relative"), -EIO);
        expect_log(&r, &i, "fsync_dir .");
        assert_int_equal(kio_fsync_parent(&io, "/etc"), -EIO);
        expect_log(&r, &i, "fsync_dir /");
        assert_int_equal(r.n, i);
        assert_int_equal(kio_fsync_parent(&io, ""), -EINVAL);
}

/* ---- kio_mkdir_p ---------------------------------------------------------- */

static void test_mkdir_p_fsyncs_each_created_parent(void **state)
{
        struct fx *f = *state;
        char p[128], a[128], ab[128], want[200];
        snprintf(a, sizeof(a), "%s/a", f->dir);
        snprintf(ab, sizeof(ab), "%s/a/b", f->dir);
        snprintf(p, sizeof(p), "%s/a/b/c/", f->dir);

        /* pre-create a: only b and c are created */
        assert_int_equal(mkdir(a, 0700), 0);

        struct rec r = { 0 };
        struct kio io = rec_kio(&r);
        assert_int_equal(kio_mkdir_p(&io, p, 0700), 0);
        assert_true(exists(ab));
        char abc[140];
        snprintf(abc, sizeof(abc), "%s/c", ab);
        struct stat st;
        assert_int_equal(stat(abc, &st), 0);
        assert_true(S_ISDIR(st.st_mode));
        assert_int_equal(st.st_mode & 0777, 0700);

        /* created: b (fsync a), c (fsync a/b); every existing prefix only mkdir'd */
        int created_fsyncs = 0;
        for (int k = 0; k < r.n; k++) {
                if (strncmp(r.log[k], "fsync_dir ", 10) == 0)
                        created_fsyncs++;
        }
        assert_int_equal(created_fsyncs, 2);
        int i = 0;
        while (i < r.n && strncmp(r.log[i], "mkdir ", 6) == 0 &&
               strcmp(r.log[i] + 6, ab) != 0)
                i++;
        snprintf(want, sizeof(want), "mkdir %s", ab);
        expect_log(&r, &i, want);
        snprintf(want, sizeof(want), "fsync_dir %s", a);
        expect_log(&r, &i, want);
        snprintf(want, sizeof(want), "mkdir %s", abc);
        expect_log(&r, &i, want);
        snprintf(want, sizeof(want), "fsync_dir %s", ab);
        expect_log(&r, &i, want);
        assert_int_equal(i, r.n);

        /* all existing: no fsync at all, and one mkdir (of the whole path),
         * not one per component */
        r.n = 0;
        assert_int_equal(kio_mkdir_p(&io, p, 0700), 0);
        for (int k = 0; k < r.n; k++)
                assert_true(strncmp(r.log[k], "mkdir ", 6) == 0);
        assert_int_equal(r.n, 1);
        snprintf(want, sizeof(want), "mkdir %s", abc);
        assert_string_equal(r.log[0], want);

        /* a regular file in the way */
        char file[160];
        snprintf(file, sizeof(file), "%s/plain", f->dir);
        int fd = open(file, O_WRONLY | O_CREAT, 0600);
        assert_true(fd >= 0);
        close(fd);
        snprintf(p, sizeof(p), "%s/plain/sub", f->dir);
        assert_int_equal(kio_mkdir_p(&io, p, 0700), -ENOTDIR);

        /* the parent fsync failing is reported */
        r.fail_op = "fsync_dir";
        r.fail_err = -EIO;
        snprintf(p, sizeof(p), "%s/z", f->dir);
        assert_int_equal(kio_mkdir_p(&io, p, 0700), -EIO);
        r.fail_op = "mkdir";
        r.fail_err = -EACCES;
        snprintf(p, sizeof(p), "%s/y/x", f->dir);
        assert_int_equal(kio_mkdir_p(&io, p, 0700), -EACCES);
        assert_false(exists(p));
}

/* ---- kio_write_file_atomic ------------------------------------------------ */

static void test_write_file_atomic_sequence(void **state)
{
        struct fx *f = *state;
        char p[128], tmp[140], want[300];
        snprintf(p, sizeof(p), "%s/state.json", f->dir);
        snprintf(tmp, sizeof(tmp), "%s.tmp", p);

        struct rec r = { 0 };
        struct kio io = rec_kio(&r);
        assert_int_equal(kio_write_file_atomic(&io, p, "{\"a\":1}\n", 8, 0640), 0);
        size_t len;
        char *got = read_all(p, &len);
        assert_int_equal(len, 8);
        assert_memory_equal(got, "{\"a\":1}\n", 8);
        free(got);
        struct stat st;
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0640); /* umask 022 set in main */
        assert_false(exists(tmp));

        int i = 0;
        snprintf(want, sizeof(want), "open %s", tmp);
        expect_log(&r, &i, want);
        expect_log(&r, &i, "write 8");
        expect_log(&r, &i, "fdatasync");
        expect_log(&r, &i, "close");
        snprintf(want, sizeof(want), "rename %s %s", tmp, p);
        expect_log(&r, &i, want);
        snprintf(want, sizeof(want), "fsync_dir %s", f->dir);
        expect_log(&r, &i, want);
        assert_int_equal(i, r.n);

        /* replace: the new content wins whole */
        assert_int_equal(kio_write_file_atomic(&io, p, "{}", 2, 0600), 0);
        got = read_all(p, &len);
        assert_int_equal(len, 2);
        free(got);
}

static void check_atomic_failure(const char *dir, const char *op, int err)
{
        char p[128], tmp[140];
        snprintf(p, sizeof(p), "%s/state.json", dir);
        snprintf(tmp, sizeof(tmp), "%s.tmp", p);
        struct rec ok = { 0 };
        struct kio io = rec_kio(&ok);
        assert_int_equal(kio_write_file_atomic(&io, p, "old", 3, 0600), 0);

        struct rec r = { .fail_op = op, .fail_err = err };
        io = rec_kio(&r);
        assert_int_equal(kio_write_file_atomic(&io, p, "new content", 11, 0600), err);
        assert_false(exists(tmp));
        size_t len;
        char *got = read_all(p, &len);
        assert_int_equal(len, 3);
        assert_memory_equal(got, "old", 3);
        free(got);
        /* on failure nothing is renamed after the failing step */
        for (int k = 0; k < r.n; k++) {
                if (strcmp(op, "rename") != 0)
                        assert_true(strncmp(r.log[k], "rename ", 7) != 0);
        }
}

static void test_write_file_atomic_failures_remove_tmp(void **state)
{
        struct fx *f = *state;
        check_atomic_failure(f->dir, "write", -ENOSPC);
        check_atomic_failure(f->dir, "fdatasync", -EIO);
        check_atomic_failure(f->dir, "rename", -EXDEV);

        /* open failing: nothing to clean, error passed on */
        char p[128];
        snprintf(p, sizeof(p), "%s/other", f->dir);
        struct rec r = { .fail_op = "open", .fail_err = -EMFILE };
        struct kio io = rec_kio(&r);
        assert_int_equal(kio_write_file_atomic(&io, p, "x", 1, 0600), -EMFILE);
        assert_false(exists(p));

        /* the final directory fsync failing is reported (data is in place) */
        struct rec r2 = { .fail_op = "fsync_dir", .fail_err = -EIO };
        io = rec_kio(&r2);
        assert_int_equal(kio_write_file_atomic(&io, p, "x", 1, 0600), -EIO);
        assert_true(exists(p));
}

/* ---- kio_read_file ------------------------------------------------------- */

static void put_file(const char *path, const void *data, size_t n)
{
        FILE *fp = fopen(path, "wb");
        assert_non_null(fp);
        assert_int_equal(fwrite(data, 1, n, fp), n);
        fclose(fp);
}

/* kio_read_fd_kbuf: appended from b->len on, into a buffer used again;
 * an empty file leaves it "" (not NULL); beyond max, -EFBIG */
static void test_read_fd_kbuf_reuses(void **state)
{
        struct fx *f = *state;
        char path[128], empty[128];
        snprintf(path, sizeof path, "%s/r.txt", f->dir);
        snprintf(empty, sizeof empty, "%s/empty", f->dir);
        FILE *fp = fopen(path, "w");
        assert_non_null(fp);
        fputs("hello world", fp);
        fclose(fp);
        fp = fopen(empty, "w");
        assert_non_null(fp);
        fclose(fp);
        struct kbuf b = KBUF_INIT;
        int fd = open(empty, O_RDONLY | O_CLOEXEC);
        assert_int_equal(kio_read_fd_kbuf(fd, 0, &b), 0);
        close(fd);
        assert_non_null(b.data);
        assert_string_equal(b.data, "");
        assert_int_equal(kbuf_puts(&b, ">"), 0);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        assert_int_equal(kio_read_fd_kbuf(fd, 0, &b), 0);
        close(fd);
        assert_string_equal(b.data, ">hello world");
        char *kept = b.data;
        b.len = 0;
        fd = open(path, O_RDONLY | O_CLOEXEC);
        assert_int_equal(kio_read_fd_kbuf(fd, 0, &b), 0);
        close(fd);
        assert_ptr_equal(b.data, kept);          /* the same buffer */
        assert_int_equal(b.len, 11);
        assert_string_equal(b.data, "hello world");
        b.len = 0;
        fd = open(path, O_RDONLY | O_CLOEXEC);
        assert_int_equal(kio_read_fd_kbuf(fd, 5, &b), -EFBIG);
        close(fd);
        kbuf_free(&b);
}

static void test_read_file_plain_gzip_and_limits(void **state)
{
        struct fx *f = *state;
        char plain[128], gz[128], bad[128], empty[128];
        snprintf(plain, sizeof plain, "%s/a.txt", f->dir);
        snprintf(gz, sizeof gz, "%s/a.txt.gz", f->dir);
        snprintf(bad, sizeof bad, "%s/bad.gz", f->dir);
        snprintf(empty, sizeof empty, "%s/empty", f->dir);
        /* 200 KiB of text, twice as one gzip file of two members */
        size_t n = 200 * 1024;
        char *text = malloc(n);
        assert_non_null(text);
        for (size_t i = 0; i < n; i++)
                text[i] = (char)('a' + i % 23);
        put_file(plain, text, n);
        gzFile g = gzopen(gz, "wb");
        assert_non_null(g);
        assert_int_equal(gzwrite(g, text, (unsigned)n), (int)n);
        gzclose(g);
        g = gzopen(gz, "ab");
        assert_int_equal(gzwrite(g, text, (unsigned)n), (int)n);
        gzclose(g);
        put_file(empty, "", 0);

        char *data = NULL;
        size_t len = 0;
        assert_int_equal(kio_read_file(plain, 0, 0, &data, &len), 0);
        assert_int_equal(len, n);
        assert_memory_equal(data, text, n);
        assert_int_equal(data[len], '\0');
        free(data);
        /* without the flag a gzip file is bytes */
        assert_int_equal(kio_read_file(gz, 0, 0, &data, &len), 0);
        assert_int_equal((unsigned char)data[0], 0x1f);
        free(data);
        assert_int_equal(kio_read_file(gz, 0, KIO_READ_GZIP, &data, &len), 0);
        assert_int_equal(len, 2 * n);
        assert_memory_equal(data, text, n);
        assert_memory_equal(data + n, text, n);
        free(data);
        /* plain files pass through the gzip flag unchanged */
        assert_int_equal(kio_read_file(plain, 0, KIO_READ_GZIP, &data, &len), 0);
        assert_int_equal(len, n);
        free(data);
        /* limits: on the file and on what it decompresses to */
        assert_int_equal(kio_read_file(plain, n - 1, 0, &data, &len), -EFBIG);
        assert_int_equal(kio_read_file(gz, n, KIO_READ_GZIP, &data, &len), -EFBIG);
        /* a truncated gzip file is an error, never a short read */
        size_t gzlen = 0;
        char *raw = NULL;
        assert_int_equal(kio_read_file(gz, 0, 0, &raw, &gzlen), 0);
        put_file(bad, raw, gzlen / 3);
        free(raw);
        assert_int_equal(kio_read_file(bad, 0, KIO_READ_GZIP, &data, &len), -EBADMSG);
        /* an empty file is an empty string, not NULL */
        data = NULL;
        assert_int_equal(kio_read_file(empty, 0, 0, &data, &len), 0);
        assert_non_null(data);
        assert_int_equal(len, 0);
        free(data);
        char missing[160];
        snprintf(missing, sizeof missing, "%s/missing", f->dir);
        assert_int_equal(kio_read_file(missing, 0, 0, &data, &len), -ENOENT);
        free(text);
}

/* ---- the shared (group commit) directory fsync --------------------------- */

struct slow_dir {
        pthread_mutex_t lock;
        int calls;
        int err;
};

static int slow_fsync_dir(void *ctx, const char *path)
{
        struct slow_dir *s = ctx;
        (void)path;
        pthread_mutex_lock(&s->lock);
        s->calls++;
        int e = s->err;
        pthread_mutex_unlock(&s->lock);
        /* the latency of a real directory fsync, so callers overlap */
        struct timespec ts = { 0, 2 * 1000 * 1000 };
        nanosleep(&ts, NULL);
        return e;
}

struct shared_arg {
        const struct kio *io;
        int r;
};

static void *shared_thread(void *p)
{
        struct shared_arg *a = p;
        a->r = kio_fsync_parent_shared(a->io, "/some/dir/file");
        return NULL;
}

static void test_fsync_parent_shared(void **state)
{
        (void)state;
        struct slow_dir s = { .lock = PTHREAD_MUTEX_INITIALIZER };
        struct kio io = { .fsync_dir = slow_fsync_dir, .ctx = &s };
        /* one after the other: never an fsync that began before the call */
        assert_int_equal(kio_fsync_parent_shared(&io, "/some/dir/a"), 0);
        assert_int_equal(kio_fsync_parent_shared(&io, "/some/dir/b"), 0);
        assert_int_equal(s.calls, 2);
        /* the error of the fsync that covered the caller */
        s.err = -EIO;
        assert_int_equal(kio_fsync_parent_shared(&io, "/some/dir/c"), -EIO);
        s.err = 0;
        assert_int_equal(kio_fsync_parent_shared(&io, "/some/dir/c"), 0);
        /* many at once: each covered, by at most one fsync each */
        enum { N = 16 };
        pthread_t t[N];
        struct shared_arg a[N];
        s.calls = 0;
        for (int i = 0; i < N; i++) {
                a[i] = (struct shared_arg){ .io = &io, .r = 1 };
                assert_int_equal(pthread_create(&t[i], NULL, shared_thread, &a[i]), 0);
        }
        for (int i = 0; i < N; i++) {
                pthread_join(t[i], NULL);
                assert_int_equal(a[i].r, 0);
        }
        assert_true(s.calls >= 1 && s.calls <= N);
        printf("16 concurrent callers shared %d directory fsyncs\n", s.calls);
}

int main(void)
{
        umask(022);
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_posix_returns_negative_errno, setup, teardown),
                cmocka_unit_test_setup_teardown(test_write_all_partial_and_eintr, setup, teardown),
                cmocka_unit_test_setup_teardown(test_write_all_reports_landed_bytes, setup,
                                                teardown),
                cmocka_unit_test(test_write_all_zero_progress_does_not_spin),
                cmocka_unit_test_setup_teardown(test_fsync_parent_names_the_directory, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_mkdir_p_fsyncs_each_created_parent, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_write_file_atomic_sequence, setup, teardown),
                cmocka_unit_test_setup_teardown(test_read_fd_kbuf_reuses, setup, teardown),
                cmocka_unit_test_setup_teardown(test_read_file_plain_gzip_and_limits, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_write_file_atomic_failures_remove_tmp, setup,
                                                teardown),
                cmocka_unit_test(test_fsync_parent_shared),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
