/* SPDX-License-Identifier: MIT */
/* kio: the one seam through which every WAL and state-file mutation goes
 * (docs/design.md §6 "I/O seam"), so tests can substitute a recording implementation
 * (to generate crash states) or a failing one (to inject errors).
 * Every function returns 0 (write: bytes written; open: a fd) or -errno. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct kbuf;

struct kio {
        int (*open)(void *ctx, const char *path, int flags, mode_t mode);
        ssize_t (*write)(void *ctx, int fd, const void *buf, size_t n);
        int (*fdatasync)(void *ctx, int fd);
        int (*fsync)(void *ctx, int fd);
        int (*close)(void *ctx, int fd);
        int (*ftruncate)(void *ctx, int fd, off_t len);
        int (*rename)(void *ctx, const char *from, const char *to);
        int (*unlink)(void *ctx, const char *path);
        int (*mkdir)(void *ctx, const char *path, mode_t mode);
        /* open the directory, fsync it, close it */
        int (*fsync_dir)(void *ctx, const char *path);
        /* make everything on the file system that holds path durable
         * (syncfs); NULL: not offered (kio_syncfs says -ENOSYS) */
        int (*syncfs)(void *ctx, const char *path);
        void *ctx;
        /* open name relative to the directory dirfd (openat); NULL: not
         * offered (the caller opens the whole path with open) */
        int (*openat)(void *ctx, int dirfd, const char *name, int flags, mode_t mode);
        /* rename, never over an existing to (-EEXIST; renameat2
         * RENAME_NOREPLACE); -EINVAL where the file system refuses the
         * flag; NULL: not offered */
        int (*rename_noreplace)(void *ctx, const char *from, const char *to);
};

/* The real thing: plain POSIX calls, EINTR retried. */
const struct kio *kio_posix(void);

/* Helpers built on a kio. */
/* Write all n bytes (retrying partial writes and EINTR).  On failure returns
 * -errno and *written (if non-NULL) tells how many bytes did land. */
int kio_write_all(const struct kio *io, int fd, const void *buf, size_t n, size_t *written);
/* Write all n bytes, fdatasync if sync, then close fd (closed on every
 * path): the first error, or 0. */
int kio_write_close(const struct kio *io, int fd, const void *buf, size_t n, bool sync);
/* syncfs of the file system that holds path: one call makes every file,
 * rename and unlink on it durable.  -ENOSYS when io offers none. */
int kio_syncfs(const struct kio *io, const char *path);
/* Replace path by data (path.tmp, rename) without any sync: durable only
 * after a later kio_syncfs (or fsyncs). */
int kio_write_file_nosync(const struct kio *io, const char *path, const void *data, size_t n,
                          mode_t mode);
/* Open path (for writing), fdatasync it, close it: makes a file written
 * earlier (e.g. by kio_write_file_nosync) durable where no syncfs is a
 * barrier (statedir_sync_mode). */
int kio_fdatasync_path(const struct kio *io, const char *path);
/* fsync the directory that contains path. */
int kio_fsync_parent(const struct kio *io, const char *path);
/* kio_fsync_parent, shared by concurrent callers (group commit): returns
 * once an fsync of the directory that began after the call has completed;
 * threads creating files in one directory at once share one fsync. */
int kio_fsync_parent_shared(const struct kio *io, const char *path);
/* mkdir -p; fsyncs the parent of every directory it creates. */
int kio_mkdir_p(const struct kio *io, const char *path, mode_t mode);
/* Atomic replace: write path.tmp, fdatasync, close, rename over path, fsync dir. */
int kio_write_file_atomic(const struct kio *io, const char *path, const void *data, size_t n,
                          mode_t mode);

/* Reading (not a mutation: plain POSIX, never through a struct kio).
 * The one reader of whole files: *ret_data is NUL-terminated (never NULL on
 * success; the caller frees), *ret_len excludes the NUL.  max: the most
 * bytes accepted (0: no limit), -EFBIG beyond it.  KIO_READ_GZIP: a file
 * that starts with the gzip magic is decompressed (max applies to the
 * decompressed bytes); -EBADMSG if it is not valid gzip. */
#define KIO_READ_GZIP 1u
int kio_read_file(const char *path, size_t max, unsigned flags, char **ret_data,
                  size_t *ret_len);
/* The same from an open descriptor (not closed), e.g. standard input. */
int kio_read_fd(int fd, size_t max, unsigned flags, char **ret_data, size_t *ret_len);
/* The same (no flags) onto b from b->len on, b kept by the caller: a buffer
 * used again for the next file, not a new one each time (it is given room
 * for 16 KB, and a file that fits is read without an fstat).  0 or -errno
 * (-EFBIG beyond max bytes; 0: no limit); b NUL-terminated either way. */
int kio_read_fd_kbuf(int fd, size_t max, struct kbuf *b);
/* Inflate every gzip member of data[0..len) (as gzip(1) reads them) onto out,
 * NUL-terminated: 0, -EFBIG beyond max bytes, -ENOMEM, or -EBADMSG with
 * *ret_why (may be NULL) saying what is damaged (zlib's word, or that the
 * data ends inside the stream). */
struct kbuf;
int kio_gunzip(const char *data, size_t len, size_t max, struct kbuf *out, const char **ret_why);
