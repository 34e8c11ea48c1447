/* SPDX-License-Identifier: MIT */
/* kio: the I/O seam (docs/design.md §6).  kio_posix() is the real implementation;
 * the helpers below only ever touch files through a struct kio. */
#include "kairos/kio.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "kairos/kbuf.h"

static int posix_open(void *ctx, const char *path, int flags, mode_t mode)
{
        (void)ctx;
        int fd;
        do
                fd = open(path, flags, mode);
        while (fd < 0 && errno == EINTR);
        return fd < 0 ? -errno : fd;
}

static int posix_openat(void *ctx, int dirfd, const char *name, int flags, mode_t mode)
{
        (void)ctx;
        int fd;
        do
                fd = openat(dirfd, name, flags, mode);
        while (fd < 0 && errno == EINTR);
        return fd < 0 ? -errno : fd;
}

static ssize_t posix_write(void *ctx, int fd, const void *buf, size_t n)
{
        (void)ctx;
        ssize_t r;
        do
                r = write(fd, buf, n);
        while (r < 0 && errno == EINTR);
        return r < 0 ? -errno : r;
}

static int posix_fdatasync(void *ctx, int fd)
{
        (void)ctx;
        int r;
        do
                r = fdatasync(fd);
        while (r < 0 && errno == EINTR);
        return r < 0 ? -errno : 0;
}

static int posix_fsync(void *ctx, int fd)
{
        (void)ctx;
        int r;
        do
                r = fsync(fd);
        while (r < 0 && errno == EINTR);
        return r < 0 ? -errno : 0;
}

static int posix_close(void *ctx, int fd)
{
        (void)ctx;
        /* Linux always releases the descriptor, even on EINTR: never retry. */
        if (close(fd) < 0 && errno != EINTR)
                return -errno;
        return 0;
}

static int posix_ftruncate(void *ctx, int fd, off_t len)
{
        (void)ctx;
        int r;
        do
                r = ftruncate(fd, len);
        while (r < 0 && errno == EINTR);
        return r < 0 ? -errno : 0;
}

static int posix_rename(void *ctx, const char *from, const char *to)
{
        (void)ctx;
        int r;
        do
                r = rename(from, to);
        while (r < 0 && errno == EINTR);
        return r < 0 ? -errno : 0;
}

static int posix_rename_noreplace(void *ctx, const char *from, const char *to)
{
        (void)ctx;
        int r;
        do
                r = renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE);
        while (r < 0 && errno == EINTR);
        return r < 0 ? -errno : 0;
}

static int posix_unlink(void *ctx, const char *path)
{
        (void)ctx;
        int r;
        do
                r = unlink(path);
        while (r < 0 && errno == EINTR);
        return r < 0 ? -errno : 0;
}

static int posix_mkdir(void *ctx, const char *path, mode_t mode)
{
        (void)ctx;
        int r;
        do
                r = mkdir(path, mode);
        while (r < 0 && errno == EINTR);
        return r < 0 ? -errno : 0;
}

static int posix_fsync_dir(void *ctx, const char *path)
{
        int fd = posix_open(ctx, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
        if (fd < 0)
                return fd;
        int r = posix_fsync(ctx, fd);
        /* A filesystem that cannot fsync directories (EINVAL) has nothing to
         * make durable this way; every other error is real. */
        if (r == -EINVAL)
                r = 0;
        int rc = posix_close(ctx, fd);
        return r < 0 ? r : rc;
}

static int posix_syncfs(void *ctx, const char *path)
{
        int fd = posix_open(ctx, path, O_RDONLY | O_CLOEXEC, 0);
        if (fd < 0)
                return fd;
        int r;
        do
                r = syncfs(fd);
        while (r < 0 && errno == EINTR);
        r = r < 0 ? -errno : 0;
        int rc = posix_close(ctx, fd);
        return r < 0 ? r : rc;
}

static const struct kio kio_posix_impl = {
        .open = posix_open,
        .write = posix_write,
        .fdatasync = posix_fdatasync,
        .fsync = posix_fsync,
        .close = posix_close,
        .ftruncate = posix_ftruncate,
        .rename = posix_rename,
        .unlink = posix_unlink,
        .mkdir = posix_mkdir,
        .fsync_dir = posix_fsync_dir,
        .syncfs = posix_syncfs,
        .ctx = NULL,
        .openat = posix_openat,
        .rename_noreplace = posix_rename_noreplace,
};

const struct kio *kio_posix(void)
{
        return &kio_posix_impl;
}

int kio_write_all(const struct kio *io, int fd, const void *buf, size_t n, size_t *written)
{
        const char *p = buf;
        size_t done = 0;
        int r = 0;

        while (done < n) {
                ssize_t w = io->write(io->ctx, fd, p + done, n - done);
                if (w == -EINTR)
                        continue;
                if (w < 0) {
                        r = (int)w;
                        break;
                }
                if (w == 0 || (size_t)w > n - done) {
                        /* No progress (or a nonsensical count): never spin. */
                        r = -EIO;
                        break;
                }
                done += (size_t)w;
        }
        if (written)
                *written = done;
        return r;
}

/* The directory part of path: "." for a bare name, "/" for "/x". */
static char *dir_of(const char *path)
{
        const char *slash = strrchr(path, '/');
        if (!slash)
                return strdup(".");
        while (slash > path && slash[-1] == '/')
                slash--;
        if (slash == path)
                return strdup("/");
        return strndup(path, (size_t)(slash - path));
}

int kio_fsync_parent(const struct kio *io, const char *path)
{
        if (!path || !*path)
                return -EINVAL;
        char *dir = dir_of(path);
        if (!dir)
                return -ENOMEM;
        int r = io->fsync_dir(io->ctx, dir);
        free(dir);
        return r;
}

/* Group commit of directory fsyncs: callers that need "an fsync of this
 * directory that began after my change" share one.  One fsync runs at a
 * time; whoever arrives while it runs waits for the next one, which the
 * first waiter to wake starts for all of them. */
static struct {
        pthread_mutex_t lock;
        pthread_cond_t cond;
        bool running;
        uint64_t started;        /* fsyncs started so far */
        uint64_t last_gen;       /* the last one that completed ... */
        const struct kio *last_io;
        char last_dir[4096];     /* ... its directory ... */
        int last_err;            /* ... and its result */
} group = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

int kio_fsync_parent_shared(const struct kio *io, const char *path)
{
        if (!path || !*path)
                return -EINVAL;
        char *dir = dir_of(path);
        if (!dir)
                return -ENOMEM;
        if (strlen(dir) >= sizeof group.last_dir) {
                int r = io->fsync_dir(io->ctx, dir);
                free(dir);
                return r;
        }
        int r = 0;
        pthread_mutex_lock(&group.lock);
        uint64_t need = group.started + 1; /* one that starts after now */
        for (;;) {
                if (group.last_gen >= need && group.last_io == io &&
                    strcmp(group.last_dir, dir) == 0) {
                        r = group.last_err;
                        break;
                }
                if (group.running) {
                        pthread_cond_wait(&group.cond, &group.lock);
                        continue;
                }
                group.running = true;
                uint64_t gen = ++group.started;
                pthread_mutex_unlock(&group.lock);
                int e = io->fsync_dir(io->ctx, dir);
                pthread_mutex_lock(&group.lock);
                group.running = false;
                group.last_gen = gen;
                group.last_io = io;
                snprintf(group.last_dir, sizeof group.last_dir, "%s", dir);
                group.last_err = e;
                pthread_cond_broadcast(&group.cond);
                if (gen >= need) {
                        r = e;
                        break;
                }
        }
        pthread_mutex_unlock(&group.lock);
        free(dir);
        return r;
}

static bool is_dir(const char *path)
{
        struct stat st;
        return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int kio_mkdir_p(const struct kio *io, const char *path, mode_t mode)
{
        if (!path || !*path)
                return -EINVAL;
        char *p = strdup(path);
        if (!p)
                return -ENOMEM;
        size_t len = strlen(p);
        while (len > 1 && p[len - 1] == '/')
                p[--len] = '\0';

        /* The whole path first: where it exists (the common case: the
         * archive directory of every mandate) that is one call, not a
         * mkdir and a stat per component.  Created, its parent existed:
         * the walk would have done the same. */
        int r = 0;
        if (len > 1 || p[0] != '/') {
                r = io->mkdir(io->ctx, p, mode);
                if (r == 0)
                        r = kio_fsync_parent(io, p);
                else if (r == -EEXIST && is_dir(p))
                        r = 0;
                else
                        r = 1; /* walk it */
                if (r <= 0) {
                        free(p);
                        return r;
                }
                r = 0;
        }
        char *cur = p;
        for (;;) {
                while (*cur == '/')
                        cur++;
                char *end = strchr(cur, '/');
                bool last = end == NULL;
                if (!last)
                        *end = '\0';
                if (*p && !(p[0] == '/' && p[1] == '\0')) {
                        r = io->mkdir(io->ctx, p, mode);
                        if (r == 0) {
                                r = kio_fsync_parent(io, p);
                        } else if (r == -EEXIST) {
                                r = is_dir(p) ? 0 : -ENOTDIR;
                        }
                        if (r < 0)
                                break;
                }
                if (last)
                        break;
                *end = '/';
                cur = end + 1;
        }
        free(p);
        return r;
}

int kio_write_file_atomic(const struct kio *io, const char *path, const void *data, size_t n,
                          mode_t mode)
{
        if (!path || !*path)
                return -EINVAL;
        size_t plen = strlen(path);
        char *tmp = malloc(plen + sizeof(".tmp"));
        if (!tmp)
                return -ENOMEM;
        memcpy(tmp, path, plen);
        memcpy(tmp + plen, ".tmp", sizeof(".tmp"));

        int fd = io->open(io->ctx, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
        int r;
        if (fd < 0) {
                r = fd;
                goto out;
        }
        r = kio_write_close(io, fd, data, n, true);
        if (r == 0)
                r = io->rename(io->ctx, tmp, path);
        if (r < 0) {
                io->unlink(io->ctx, tmp);
                goto out;
        }
        r = kio_fsync_parent(io, path);
out:
        free(tmp);
        return r;
}

/* ---- reading ------------------------------------------------------------ */

/* sized: the size is asked first (fstat) and room made for it at once */
static int read_all(int fd, size_t max, bool sized, struct kbuf *b)
{
        struct stat st;
        int r;
        if (sized && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
                if ((uint64_t)st.st_size > max)
                        return -EFBIG;
                if ((r = kbuf_reserve(b, (size_t)st.st_size + 1)) < 0)
                        return r;
        }
        for (;;) {
                if (b->cap - b->len <= 1 && (r = kbuf_reserve(b, b->cap > 65536 ? b->cap : 65536)) < 0)
                        return r;
                ssize_t n = read(fd, b->data + b->len, b->cap - b->len - 1);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return -errno;
                if (n == 0)
                        return 0;
                b->len += (size_t)n;
                b->data[b->len] = '\0';
                if (b->len > max)
                        return -EFBIG;
        }
}

int kio_gunzip(const char *data, size_t len, size_t max, struct kbuf *out, const char **ret_why)
{
        z_stream zs;
        const char *why = NULL;
        memset(&zs, 0, sizeof(zs));
        if (inflateInit2(&zs, 15 + 16) != Z_OK)
                return -ENOMEM;
        int r = 0, zr = Z_OK;
        const unsigned char *in = (const unsigned char *)data;
        size_t left = len;
        while (r == 0) {
                if (zs.avail_in == 0 && left > 0) {
                        uInt chunk = left > UINT_MAX / 2 ? UINT_MAX / 2 : (uInt)left;
                        zs.next_in = (unsigned char *)in;
                        zs.avail_in = chunk;
                        in += chunk;
                        left -= chunk;
                }
                if ((r = kbuf_reserve(out, 65536)) < 0)
                        break;
                zs.next_out = (unsigned char *)out->data + out->len;
                zs.avail_out = (uInt)(out->cap - out->len - 1);
                uInt before = zs.avail_out;
                zr = inflate(&zs, Z_NO_FLUSH);
                out->len += before - zs.avail_out;
                out->data[out->len] = '\0';
                if (out->len > max) {
                        r = -EFBIG;
                        break;
                }
                if (zr == Z_STREAM_END) {
                        if (zs.avail_in == 0 && left == 0)
                                break;
                        /* concatenated members, as gzip(1) reads them */
                        if (inflateReset(&zs) != Z_OK)
                                r = -EBADMSG;
                        continue;
                }
                if (zr == Z_MEM_ERROR) {
                        r = -ENOMEM;
                } else if (zr == Z_BUF_ERROR && !zs.avail_in && !left) {
                        why = "truncated: the compressed data ends before the end of the gzip "
                              "stream";
                        r = -EBADMSG;
                } else if (zr != Z_OK && zr != Z_BUF_ERROR) {
                        r = -EBADMSG;
                }
        }
        if (r == -EBADMSG && !why)
                why = zs.msg ? zs.msg : "invalid compressed data";
        if (ret_why)
                *ret_why = why;
        inflateEnd(&zs);
        return r;
}

#define READ_ROOM (16u * 1024u)

int kio_read_fd_kbuf(int fd, size_t max, struct kbuf *b)
{
        if (max == 0 || max > SIZE_MAX / 2)
                max = SIZE_MAX / 2;
        /* room for a small file at once, kept with the buffer: no fstat */
        int r = b->cap - b->len < READ_ROOM ? kbuf_reserve(b, READ_ROOM) : 0;
        if (r == 0)
                r = read_all(fd, max, false, b);
        if (r == 0 && !b->data)
                r = kbuf_reserve(b, 1);
        if (b->data)
                b->data[b->len] = '\0';
        return r;
}

int kio_read_fd(int fd, size_t max, unsigned flags, char **ret_data, size_t *ret_len)
{
        struct kbuf b = KBUF_INIT;
        if (max == 0 || max > SIZE_MAX / 2)
                max = SIZE_MAX / 2;
        int r = read_all(fd, max, true, &b);
        if (r == 0 && (flags & KIO_READ_GZIP) && b.len >= 2 &&
            (unsigned char)b.data[0] == 0x1f && (unsigned char)b.data[1] == 0x8b) {
                struct kbuf plain = KBUF_INIT;
                r = kio_gunzip(b.data, b.len, max, &plain, NULL);
                kbuf_free(&b);
                b = plain;
        }
        if (r == 0 && !b.data)
                r = kbuf_reserve(&b, 1);
        if (r < 0) {
                kbuf_free(&b);
                return r;
        }
        b.data[b.len] = '\0';
        *ret_len = b.len;
        *ret_data = kbuf_steal(&b);
        return 0;
}

int kio_read_file(const char *path, size_t max, unsigned flags, char **ret_data, size_t *ret_len)
{
        if (!path || !*path)
                return -EINVAL;
        int fd;
        do
                fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        while (fd < 0 && errno == EINTR);
        if (fd < 0)
                return -errno;
        int r = kio_read_fd(fd, max, flags, ret_data, ret_len);
        close(fd);
        return r;
}

int kio_write_close(const struct kio *io, int fd, const void *buf, size_t n, bool sync)
{
        int r = kio_write_all(io, fd, buf, n, NULL);
        if (r == 0 && sync)
                r = io->fdatasync(io->ctx, fd);
        int rc = io->close(io->ctx, fd);
        return r == 0 ? rc : r;
}

int kio_syncfs(const struct kio *io, const char *path)
{
        if (!io->syncfs)
                return -ENOSYS;
        return io->syncfs(io->ctx, path);
}

int kio_fdatasync_path(const struct kio *io, const char *path)
{
        /* for writing: some network file systems (older SMB clients)
         * refuse to flush through a read-only handle */
        int fd = io->open(io->ctx, path, O_WRONLY | O_CLOEXEC | O_NOCTTY, 0);
        if (fd < 0)
                return fd;
        int r = io->fdatasync(io->ctx, fd);
        int rc = io->close(io->ctx, fd);
        return r < 0 ? r : rc;
}

int kio_write_file_nosync(const struct kio *io, const char *path, const void *data, size_t n,
                          mode_t mode)
{
        char tmp[4096];
        if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
                return -ENAMETOOLONG;
        int fd = io->open(io->ctx, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
        if (fd < 0)
                return fd;
        int r = kio_write_close(io, fd, data, n, false);
        if (r == 0)
                r = io->rename(io->ctx, tmp, path);
        if (r < 0)
                io->unlink(io->ctx, tmp);
        return r;
}
