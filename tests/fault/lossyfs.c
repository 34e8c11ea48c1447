/* SPDX-License-Identifier: MIT */
/* lossyfs: a FUSE file system for power-loss tests.
 *
 *     lossyfs BACKING MOUNTPOINT
 *
 * Every name operation (create, mkdir, rename, unlink, rmdir) goes straight
 * to the backing directory and so survives a "power loss"; the bytes of a
 * file do not until the file is fsynced or fdatasynced: until then they live
 * in this process's memory only.  syncfs(2) of the mount does nothing for
 * them (FUSE file systems do not get it), which is the behaviour of such file
 * systems that kairosd has to cope with (docs/design.md §6, "Durable history
 * on every file system").  Killing this process (SIGKILL) is the power loss:
 * what was never synced is gone, exactly as with a page cache that never
 * reached the disk.  A clean unmount (SIGTERM, fusermount3 -u) is a power
 * loss too: nothing is flushed on the way out.
 *
 * LOSSYFS_WRITEBACK=SEED (a number) models a page cache that writes dirty
 * data back on its own, as a real one does at any moment: after a write
 * (one in four, chosen by a generator seeded with SEED) and at a rename of
 * a file with unsynced bytes (one in two), a random part of the file's
 * unsynced bytes that follows what already reached the backing file is
 * written to it, without a sync.  A power loss then leaves a file holding
 * more than was synced: any prefix of what was written since, down to the
 * byte (a torn record).  Never a hole, never new bytes over old ones: a file
 * written over in place (a truncation or a write below what reached the
 * backing file) is not written back until it is synced.
 *
 * Name operations are durable at once, which is more durable than a real
 * disk (there an unsynced create, rename or unlink can be lost): a first
 * model.
 *
 * Runs in the foreground, single-threaded.  Test-only; not installed. */
#define FUSE_USE_VERSION 31
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

static int backing = -1; /* the backing directory */

/* One file's bytes since its last sync (whole-file copy: test files are small). */
struct dirty {
        dev_t dev;
        ino_t ino;
        char *data;
        size_t len, cap;
        size_t landed;    /* data[0, landed) is what the backing file holds */
        bool overwritten; /* written or truncated below landed: no write-back */
        struct dirty *next;
};
static struct dirty *dirty_list;

/* LOSSYFS_WRITEBACK: on, and the state of its generator (xorshift64). */
static bool wb_on;
static unsigned long long wb_state;

static unsigned long long wb_rand(void)
{
        wb_state ^= wb_state << 13;
        wb_state ^= wb_state >> 7;
        wb_state ^= wb_state << 17;
        return wb_state;
}

static const char *rel(const char *path)
{
        while (*path == '/')
                path++;
        return *path ? path : ".";
}

static struct dirty *dirty_find(dev_t dev, ino_t ino)
{
        for (struct dirty *d = dirty_list; d; d = d->next)
                if (d->dev == dev && d->ino == ino)
                        return d;
        return NULL;
}

static int reserve(struct dirty *d, size_t n)
{
        if (n <= d->cap)
                return 0;
        size_t cap = d->cap ? d->cap : 4096;
        while (cap < n)
                cap *= 2;
        char *p = realloc(d->data, cap);
        if (!p)
                return -ENOMEM;
        memset(p + d->cap, 0, cap - d->cap);
        d->data = p;
        d->cap = cap;
        return 0;
}

/* The dirty copy of fd's file, made from its synced bytes on first use. */
static int dirty_get(int fd, struct dirty **ret)
{
        struct stat st;
        if (fstat(fd, &st) < 0)
                return -errno;
        struct dirty *d = dirty_find(st.st_dev, st.st_ino);
        if (d) {
                *ret = d;
                return 0;
        }
        d = calloc(1, sizeof(*d));
        if (!d)
                return -ENOMEM;
        d->dev = st.st_dev;
        d->ino = st.st_ino;
        if (reserve(d, (size_t)st.st_size + 1) < 0) {
                free(d);
                return -ENOMEM;
        }
        ssize_t n = st.st_size ? pread(fd, d->data, (size_t)st.st_size, 0) : 0;
        if (n < 0) {
                int e = -errno;
                free(d->data);
                free(d);
                return e;
        }
        d->len = d->landed = (size_t)n;
        d->next = dirty_list;
        dirty_list = d;
        *ret = d;
        return 0;
}

static void dirty_drop(struct dirty *d)
{
        for (struct dirty **p = &dirty_list; *p; p = &(*p)->next)
                if (*p == d) {
                        *p = d->next;
                        free(d->data);
                        free(d);
                        return;
                }
}

/* The page cache writes some of d's unsynced bytes back on its own (one
 * time in `one_in`): a random number of the bytes after those that reached
 * the backing file, to fd (d's file), without a sync. */
static void writeback(int fd, struct dirty *d, unsigned one_in)
{
        if (!wb_on || d->overwritten || d->len <= d->landed || wb_rand() % one_in)
                return;
        size_t n = (size_t)(wb_rand() % (d->len - d->landed + 1));
        ssize_t w = n ? pwrite(fd, d->data + d->landed, n, (off_t)d->landed) : 0;
        if (w > 0)
                d->landed += (size_t)w;
}

static void fix_size(struct stat *st)
{
        struct dirty *d = dirty_find(st->st_dev, st->st_ino);
        if (d) {
                st->st_size = (off_t)d->len;
                st->st_blocks = (blkcnt_t)((d->len + 511) / 512);
        }
}

static int lfs_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
        int r = fi ? fstat((int)fi->fh, st) : fstatat(backing, rel(path), st, AT_SYMLINK_NOFOLLOW);
        if (r < 0)
                return -errno;
        fix_size(st);
        return 0;
}

static int lfs_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
                       struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
        (void)off;
        (void)fi;
        (void)flags;
        int fd = openat(backing, rel(path), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        DIR *dir = fdopendir(fd);
        if (!dir) {
                close(fd);
                return -errno;
        }
        struct dirent *e;
        while ((e = readdir(dir)))
                if (fill(buf, e->d_name, NULL, 0, 0))
                        break;
        closedir(dir);
        return 0;
}

/* A file opened (open or create) as fd: O_TRUNC empties its dirty copy
 * (its synced bytes stay on the backing file until a sync). */
static int opened(int fd, struct fuse_file_info *fi)
{
        if (fi->flags & O_TRUNC) {
                struct dirty *d;
                int r = dirty_get(fd, &d);
                if (r < 0) {
                        close(fd);
                        return r;
                }
                d->len = 0;
                d->overwritten = d->landed > 0;
        }
        fi->fh = (uint64_t)fd;
        return 0;
}

static int lfs_open(const char *path, struct fuse_file_info *fi)
{
        /* O_APPEND is the kernel's business (it passes the offset); the
         * backing file is opened for reading and writing whatever the caller
         * asked, so that a sync can write the dirty bytes back. */
        int flags = (fi->flags & ~(O_APPEND | O_ACCMODE | O_CREAT | O_EXCL)) | O_RDWR | O_CLOEXEC;
        int fd = openat(backing, rel(path), flags);
        if (fd < 0 && errno == EISDIR)
                fd = openat(backing, rel(path), O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        return opened(fd, fi);
}

static int lfs_create(const char *path, mode_t mode, struct fuse_file_info *fi)
{
        int fd = openat(backing, rel(path), O_RDWR | O_CREAT | O_CLOEXEC |
                                                    (fi->flags & O_EXCL),
                        mode);
        if (fd < 0)
                return -errno;
        return opened(fd, fi);
}

static int lfs_read(const char *path, char *buf, size_t n, off_t off, struct fuse_file_info *fi)
{
        (void)path;
        struct stat st;
        if (fstat((int)fi->fh, &st) < 0)
                return -errno;
        struct dirty *d = dirty_find(st.st_dev, st.st_ino);
        if (!d) {
                ssize_t r = pread((int)fi->fh, buf, n, off);
                return r < 0 ? -errno : (int)r;
        }
        if ((size_t)off >= d->len)
                return 0;
        if (n > d->len - (size_t)off)
                n = d->len - (size_t)off;
        memcpy(buf, d->data + off, n);
        return (int)n;
}

static int lfs_write(const char *path, const char *buf, size_t n, off_t off,
                     struct fuse_file_info *fi)
{
        (void)path;
        struct dirty *d;
        int r = dirty_get((int)fi->fh, &d);
        if (r < 0)
                return r;
        if ((r = reserve(d, (size_t)off + n)) < 0)
                return r;
        memcpy(d->data + off, buf, n);
        if ((size_t)off < d->landed)
                d->overwritten = true;
        if ((size_t)off + n > d->len)
                d->len = (size_t)off + n;
        writeback((int)fi->fh, d, 4);
        return (int)n;
}

static int truncate_fd(int fd, off_t len)
{
        struct dirty *d;
        int r = dirty_get(fd, &d);
        if (r < 0)
                return r;
        if ((r = reserve(d, (size_t)len)) < 0)
                return r;
        if ((size_t)len > d->len)
                memset(d->data + d->len, 0, (size_t)len - d->len);
        d->len = (size_t)len;
        if (d->len < d->landed)
                d->overwritten = true;
        return 0;
}

static int lfs_truncate(const char *path, off_t len, struct fuse_file_info *fi)
{
        if (fi)
                return truncate_fd((int)fi->fh, len);
        int fd = openat(backing, rel(path), O_RDWR | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        int r = truncate_fd(fd, len);
        close(fd);
        return r;
}

/* The one way bytes reach the backing file. */
static int lfs_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
        (void)path;
        int fd = (int)fi->fh;
        struct stat st;
        if (fstat(fd, &st) < 0)
                return -errno;
        struct dirty *d = dirty_find(st.st_dev, st.st_ino);
        if (d) {
                size_t done = 0;
                while (done < d->len) {
                        ssize_t w = pwrite(fd, d->data + done, d->len - done, (off_t)done);
                        if (w < 0)
                                return -errno;
                        done += (size_t)w;
                }
                if (ftruncate(fd, (off_t)d->len) < 0)
                        return -errno;
                dirty_drop(d);
        }
        return (datasync ? fdatasync(fd) : fsync(fd)) < 0 ? -errno : 0;
}

static int lfs_release(const char *path, struct fuse_file_info *fi)
{
        (void)path;
        close((int)fi->fh);
        return 0;
}

static int lfs_opendir(const char *path, struct fuse_file_info *fi)
{
        int fd = openat(backing, rel(path), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        fi->fh = (uint64_t)fd;
        return 0;
}

static int lfs_releasedir(const char *path, struct fuse_file_info *fi)
{
        return lfs_release(path, fi);
}

static int lfs_fsyncdir(const char *path, int datasync, struct fuse_file_info *fi)
{
        (void)path;
        return (datasync ? fdatasync((int)fi->fh) : fsync((int)fi->fh)) < 0 ? -errno : 0;
}

static int lfs_mkdir(const char *path, mode_t mode)
{
        return mkdirat(backing, rel(path), mode) < 0 ? -errno : 0;
}

static int lfs_rmdir(const char *path)
{
        return unlinkat(backing, rel(path), AT_REMOVEDIR) < 0 ? -errno : 0;
}

static int lfs_unlink(const char *path)
{
        struct stat st;
        if (fstatat(backing, rel(path), &st, AT_SYMLINK_NOFOLLOW) < 0)
                return -errno;
        if (unlinkat(backing, rel(path), 0) < 0)
                return -errno;
        struct dirty *d = st.st_nlink <= 1 ? dirty_find(st.st_dev, st.st_ino) : NULL;
        if (d)
                dirty_drop(d);
        return 0;
}

static int lfs_rename(const char *from, const char *to, unsigned int flags)
{
        if (flags)
                return -EINVAL;
        struct stat st;
        if (wb_on && fstatat(backing, rel(from), &st, AT_SYMLINK_NOFOLLOW) == 0) {
                /* a file renamed over another is often written back now
                 * (ext4's auto_da_alloc) */
                struct dirty *d = dirty_find(st.st_dev, st.st_ino);
                int fd = d ? openat(backing, rel(from), O_WRONLY | O_CLOEXEC) : -1;
                if (fd >= 0) {
                        writeback(fd, d, 2);
                        close(fd);
                }
        }
        bool replaced = fstatat(backing, rel(to), &st, AT_SYMLINK_NOFOLLOW) == 0;
        if (renameat(backing, rel(from), backing, rel(to)) < 0)
                return -errno;
        struct dirty *d = replaced && st.st_nlink <= 1 ? dirty_find(st.st_dev, st.st_ino) : NULL;
        if (d)
                dirty_drop(d);
        return 0;
}

static int lfs_chmod(const char *path, mode_t mode, struct fuse_file_info *fi)
{
        int r = fi ? fchmod((int)fi->fh, mode) : fchmodat(backing, rel(path), mode, 0);
        return r < 0 ? -errno : 0;
}

static int lfs_chown(const char *path, uid_t uid, gid_t gid, struct fuse_file_info *fi)
{
        int r = fi ? fchown((int)fi->fh, uid, gid)
                   : fchownat(backing, rel(path), uid, gid, AT_SYMLINK_NOFOLLOW);
        return r < 0 ? -errno : 0;
}

static int lfs_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi)
{
        int r = fi ? futimens((int)fi->fh, tv)
                   : utimensat(backing, rel(path), tv, AT_SYMLINK_NOFOLLOW);
        return r < 0 ? -errno : 0;
}

static int lfs_statfs(const char *path, struct statvfs *sv)
{
        (void)path;
        return fstatvfs(backing, sv) < 0 ? -errno : 0;
}

static void *lfs_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
        (void)conn;
        /* every size comes from here: the kernel must not trust a cached one */
        cfg->attr_timeout = 0;
        cfg->entry_timeout = 0;
        cfg->negative_timeout = 0;
        cfg->use_ino = 1;
        return NULL;
}

static const struct fuse_operations ops = {
        .init = lfs_init,
        .getattr = lfs_getattr,
        .readdir = lfs_readdir,
        .open = lfs_open,
        .create = lfs_create,
        .read = lfs_read,
        .write = lfs_write,
        .truncate = lfs_truncate,
        .fsync = lfs_fsync,
        .release = lfs_release,
        .opendir = lfs_opendir,
        .releasedir = lfs_releasedir,
        .fsyncdir = lfs_fsyncdir,
        .mkdir = lfs_mkdir,
        .rmdir = lfs_rmdir,
        .unlink = lfs_unlink,
        .rename = lfs_rename,
        .chmod = lfs_chmod,
        .chown = lfs_chown,
        .utimens = lfs_utimens,
        .statfs = lfs_statfs,
};

int main(int argc, char **argv)
{
        if (argc != 3) {
                fprintf(stderr, "usage: lossyfs BACKING MOUNTPOINT\n");
                return 64;
        }
        const char *seed = getenv("LOSSYFS_WRITEBACK");
        if (seed && *seed) {
                char *end;
                errno = 0;
                wb_state = strtoull(seed, &end, 10);
                if (errno || *end) {
                        fprintf(stderr, "lossyfs: LOSSYFS_WRITEBACK=%s: not a number\n", seed);
                        return 64;
                }
                wb_state = wb_state * 0x9E3779B97F4A7C15ull + 1;
                if (!wb_state)
                        wb_state = 1; /* xorshift's one fixed point */
                wb_on = true;
        }
        backing = open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (backing < 0) {
                fprintf(stderr, "lossyfs: %s: %s\n", argv[1], strerror(errno));
                return 66;
        }
        char *fargv[] = { argv[0], "-f", "-s", "-o", "default_permissions,allow_other,fsname=lossyfs",
                          argv[2], NULL };
        return fuse_main(6, fargv, &ops, NULL);
}
