/* SPDX-License-Identifier: MIT */
/* crash_states: the crash-state generator of issue 8 (docs/design.md §6 and §8).
 *
 * 1. A recording kio performs every mutation for real in a scratch
 *    directory and logs it (create, write with offset and bytes, fdatasync,
 *    fsync, directory fsync, rename, ftruncate, unlink, mkdir, close).  A
 *    workload drives the real library through it: a mandate's whole life
 *    (create, cycles, a failed step, finalize, summary, archive), a WAL left
 *    with an executing step that recovery appends to, an unflushed record
 *    followed by a restart, a torn tail repaired on open, and a
 *    chronos.json-like file and a mandate summary replaced atomically
 *    (gamma's WAL is a spare: created ahead, made durable by a syncfs,
 *    renamed to gamma's name with no directory fsync, a spare made after
 *    that syncfs left uncovered).  The
 *    workload logs every acknowledgement it made: "the WAL holds these bytes
 *    once wal_flush returned", "file F has content C once
 *    kio_write_file_atomic returned", "the archive exists once wal_archive
 *    returned".
 * 2. The log is replayed on a model of the file system: per file its durable
 *    content (as of its last successful fdatasync) and the writes and
 *    truncations since; per directory its durable entries (as of its last
 *    fsync) and the creations, renames and unlinks since.  Before every
 *    mutating operation (and at the end) a power loss may leave: every
 *    pending write kept, dropped, filled with zeros, or torn (at a 512-byte
 *    sector boundary or at any byte, the rest dropped or zero-filled), in
 *    every combination; every pending ftruncate applied or undone; per
 *    directory any prefix of its pending entry operations (a creation,
 *    rename or unlink not followed by a directory fsync undone).  A failed
 *    fdatasync poisons the file: nothing pending on it ever becomes durable
 *    (the kernel may have dropped the pages).
 * 3. Every state is materialized in a fresh directory and the REAL recovery
 *    runs on it: wal_open (repair or quarantine), fold_file,
 *    recovery_plan_fold, its records appended and flushed, fold and plan
 *    again, open again; the atomically replaced files and the archive are
 *    read.  First, as kairosd's start does, every spare in wal/ is settled
 *    by wal_spare_adopt: one that holds gamma's records (its rename lost)
 *    must be adopted under gamma's name, never left or doubled.  The invariants of issue 8 are checked; a violation prints the
 *    seed, the crash point (the operation and the workload phase) and every
 *    choice, and fails the run.
 *
 * Variants re-run the workload with one injected failure -- the n-th file
 * sync fails (EIO), the n-th directory sync fails, or the n-th write lands
 * half and the next one fails (EIO) -- for every n.  Each checks that
 * nothing is acknowledged after the failure and that the failed WAL refuses
 * further appends and flushes, and samples crash states of its own log.
 *
 * Usage: crash_states [--exhaustive] [--seed S] [--states N] [--point K]
 *                     [--no-variants] [--variant K:N] [--verbose] [--quiet]
 * Environment: KAIROS_CRASH_STATES=N (sampled states of the main run,
 * default 6000), KAIROS_CRASH_SEED=S, TMPDIR. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "kairos/fold.h"
#include "kairos/kbuf.h"
#include "kairos/kio.h"
#include "kairos/planner.h"
#include "kairos/recovery.h"
#include "kairos/statedir.h"
#include "kairos/wal.h"

#if defined(__SANITIZE_ADDRESS__)
#define CS_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CS_SANITIZED 1
#endif
#endif
#ifdef CS_SANITIZED
#include <sanitizer/common_interface_defs.h>
#endif

#define MAX_FD 1024
#define NWAL 3
#define NFILE 2
#define MAXVER 8
#define SECTOR 512
#define FIRED "2026-04-20T12:00:00Z"
#define EXHAUSTIVE_CAP 200000.0

/* ------------------------------------------------------------------------ */
/* Utilities                                                                 */
/* ------------------------------------------------------------------------ */

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        fputs("crash_states: ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
        exit(2);
}

static void *xmalloc(size_t n)
{
        void *p = malloc(n ? n : 1);
        if (!p)
                die("out of memory");
        return p;
}

static void *xrealloc(void *p, size_t n)
{
        p = realloc(p, n ? n : 1);
        if (!p)
                die("out of memory");
        return p;
}

/* snprintf into a fixed buffer; a path that does not fit is fatal. */
static void pfmt(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void pfmt(char *out, size_t n, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        int r = vsnprintf(out, n, fmt, ap);
        va_end(ap);
        if (r < 0 || (size_t)r >= n)
                die("a path or text does not fit in %zu bytes", n);
}

static char *xstrdup(const char *s)
{
        char *d = strdup(s);
        if (!d)
                die("out of memory");
        return d;
}

#define GROW(ptr, n, cap)                                                                  \
        do {                                                                               \
                if ((n) >= (cap)) {                                                        \
                        (cap) = (cap) ? (cap) * 2 : 16;                                    \
                        (ptr) = xrealloc((ptr), (cap) * sizeof(*(ptr)));                   \
                }                                                                          \
        } while (0)

struct bytes {
        unsigned char *p;
        size_t n, cap;
};

static void b_reserve(struct bytes *b, size_t n)
{
        if (n > b->cap) {
                size_t c = b->cap ? b->cap : 256;
                while (c < n)
                        c *= 2;
                b->p = xrealloc(b->p, c);
                b->cap = c;
        }
}

/* Set the length, zero-filling any growth. */
static void b_resize(struct bytes *b, size_t n)
{
        b_reserve(b, n);
        if (n > b->n)
                memset(b->p + b->n, 0, n - b->n);
        b->n = n;
}

static void b_put(struct bytes *b, size_t off, const void *d, size_t n)
{
        if (off + n > b->n)
                b_resize(b, off + n);
        if (n)
                memcpy(b->p + off, d, n);
}

static void b_zero(struct bytes *b, size_t off, size_t n)
{
        if (off + n > b->n)
                b_resize(b, off + n);
        memset(b->p + off, 0, n);
}

static void b_copy(struct bytes *dst, const struct bytes *src)
{
        b_reserve(dst, src->n);
        if (src->n)
                memcpy(dst->p, src->p, src->n);
        dst->n = src->n;
}

static void b_set(struct bytes *dst, const void *d, size_t n)
{
        b_reserve(dst, n);
        if (n)
                memcpy(dst->p, d, n);
        dst->n = n;
}

static void b_free(struct bytes *b)
{
        free(b->p);
        *b = (struct bytes){ 0 };
}

static bool b_eq(const struct bytes *a, const void *d, size_t n)
{
        return a->n == n && (n == 0 || memcmp(a->p, d, n) == 0);
}

static int read_whole(const char *path, struct bytes *out)
{
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        out->n = 0;
        for (;;) {
                b_reserve(out, out->n + 65536);
                ssize_t r = read(fd, out->p + out->n, out->cap - out->n);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r < 0) {
                        int e = -errno;
                        close(fd);
                        return e;
                }
                if (r == 0)
                        break;
                out->n += (size_t)r;
        }
        close(fd);
        return 0;
}

static void write_whole(const char *path, const void *d, size_t n)
{
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0)
                die("create %s: %s", path, strerror(errno));
        const unsigned char *p = d;
        while (n > 0) {
                ssize_t r = write(fd, p, n);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r <= 0)
                        die("write %s: %s", path, strerror(errno));
                p += r;
                n -= (size_t)r;
        }
        close(fd);
}

static int rm_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
        (void)st;
        (void)flag;
        (void)ftw;
        return remove(path);
}

static void rm_rf(const char *path)
{
        if (access(path, F_OK) == 0 &&
            nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS) != 0)
                die("cannot remove %s: %s", path, strerror(errno));
}

static uint64_t splitmix(uint64_t *s)
{
        uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
}

/* Uniform in [0, n). */
static size_t rnd(uint64_t *s, size_t n)
{
        return n ? (size_t)(splitmix(s) % n) : 0;
}

static uint64_t fnv(uint64_t h, const void *d, size_t n)
{
        const unsigned char *p = d;
        for (size_t i = 0; i < n; i++) {
                h ^= p[i];
                h *= 0x100000001b3ULL;
        }
        return h;
}

static double now_s(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ------------------------------------------------------------------------ */
/* The operation log                                                         */
/* ------------------------------------------------------------------------ */

enum opk {
        K_CREATE,       /* dir, name, ino: a new file */
        K_MKDIR,        /* dir, name, ino: a new directory */
        K_OPEN,         /* fd, ino (no effect) */
        K_WRITE,        /* fd, ino, off, data, len */
        K_TRUNC,        /* fd, ino, off = new length (also O_TRUNC of an open) */
        K_DATASYNC,     /* fd, ino: fdatasync returned 0 */
        K_FSYNC,        /* fd, ino: fsync returned 0 */
        K_SYNCFAIL,     /* fd, ino: an injected fdatasync/fsync failure */
        K_WRITEFAIL,    /* fd, ino: an injected write failure */
        K_RENAME,       /* dir, name -> name2, ino (ino2 replaced, -1 none) */
        K_UNLINK,       /* dir, name, ino */
        K_FSYNC_DIR,    /* ino (a directory) */
        K_DIRSYNCFAIL,  /* ino: an injected directory fsync failure */
        K_SYNCFS,       /* syncfs returned 0: everything pending is durable */
        K_CLOSE,        /* fd, ino (no effect) */
        /* what the workload did and acknowledged (no effect on the disk) */
        K_BEGIN_WAL,    /* subject: a wal_open / wal_flush call starts */
        K_ACK_WAL,      /* subject, len: the WAL holds its first len bytes, durably */
        K_BEGIN_FILE,   /* subject, version: kio_write_file_atomic starts */
        K_ACK_FILE,     /* subject, version: it returned 0 */
        K_BEGIN_ARCHIVE,
        K_ACK_ARCHIVE,
};

struct op {
        enum opk k;
        int fd;
        int ino;
        int ino2;
        int dir;
        const char *name;
        const char *name2;
        size_t off;
        unsigned char *data;
        size_t len;
        int subject;
        int version;
        const char *phase;
};

static bool op_mutates(const struct op *o)
{
        switch (o->k) {
        case K_CREATE:
        case K_MKDIR:
        case K_WRITE:
        case K_TRUNC:
        case K_DATASYNC:
        case K_FSYNC:
        case K_SYNCFAIL:
        case K_RENAME:
        case K_UNLINK:
        case K_FSYNC_DIR:
        case K_SYNCFS:
                return true;
        default:
                return false;
        }
}

struct live {
        char *rel;
        int ino;
};

struct rec {
        char root[PATH_MAX];
        size_t rootlen;
        struct op *ops;
        size_t nops, opcap;
        struct live *live;
        size_t nlive, livecap;
        int nnodes;
        size_t nodecap;
        bool *isdir;
        char **nodepath;
        int fdino[MAX_FD];
        bool fdappend[MAX_FD];
        const char *phase;
        /* injection: 0 = none, else the 1-based call that fails */
        int fail_sync_at, fail_dirsync_at, fail_write_at;
        int nsync, ndirsync, nwrite;
        bool write_fail_next;
        bool injected;
};

static struct op *rec_add(struct rec *R, enum opk k)
{
        GROW(R->ops, R->nops, R->opcap);
        struct op *o = &R->ops[R->nops++];
        *o = (struct op){ .k = k, .fd = -1, .ino = -1, .ino2 = -1, .dir = -1, .subject = -1,
                          .version = -1, .phase = R->phase };
        return o;
}

static const char *rel_of(const struct rec *R, const char *path)
{
        if (strncmp(path, R->root, R->rootlen) != 0)
                return NULL;
        if (path[R->rootlen] == '\0')
                return "";
        if (path[R->rootlen] != '/')
                return NULL;
        return path + R->rootlen + 1;
}

static int live_get(const struct rec *R, const char *rel)
{
        for (size_t i = 0; i < R->nlive; i++)
                if (strcmp(R->live[i].rel, rel) == 0)
                        return R->live[i].ino;
        return -1;
}

static void live_del(struct rec *R, const char *rel)
{
        for (size_t i = 0; i < R->nlive; i++)
                if (strcmp(R->live[i].rel, rel) == 0) {
                        free(R->live[i].rel);
                        R->live[i] = R->live[--R->nlive];
                        return;
                }
}

static void live_set(struct rec *R, const char *rel, int ino)
{
        live_del(R, rel);
        GROW(R->live, R->nlive, R->livecap);
        R->live[R->nlive++] = (struct live){ xstrdup(rel), ino };
}

static int new_node(struct rec *R, bool dir, const char *rel)
{
        if ((size_t)R->nnodes >= R->nodecap) {
                R->nodecap = R->nodecap ? R->nodecap * 2 : 64;
                R->isdir = xrealloc(R->isdir, R->nodecap * sizeof(*R->isdir));
                R->nodepath = xrealloc(R->nodepath, R->nodecap * sizeof(*R->nodepath));
        }
        R->isdir[R->nnodes] = dir;
        R->nodepath[R->nnodes] = xstrdup(rel);
        return R->nnodes++;
}

/* The directory inode and the entry name of rel (a persistent copy). */
static int split_rel(struct rec *R, const char *rel, const char **name)
{
        const char *slash = strrchr(rel, '/');
        int dir;
        if (!slash) {
                dir = 0;
                *name = xstrdup(rel);
        } else {
                char *parent = strndup(rel, (size_t)(slash - rel));
                if (!parent)
                        die("out of memory");
                dir = live_get(R, parent);
                free(parent);
                *name = xstrdup(slash + 1);
        }
        if (dir < 0 || !R->isdir[dir])
                die("no parent directory for %s", rel);
        return dir;
}

static const char *must_rel(const struct rec *R, const char *path)
{
        const char *rel = rel_of(R, path);
        if (!rel)
                die("an operation outside the scratch directory: %s", path);
        return rel;
}

static int r_open(void *ctx, const char *path, int flags, mode_t mode)
{
        struct rec *R = ctx;
        const char *rel = must_rel(R, path);
        bool existed = access(path, F_OK) == 0;
        int fd;
        do
                fd = open(path, flags, mode);
        while (fd < 0 && errno == EINTR);
        if (fd < 0)
                return -errno;
        if (fd >= MAX_FD)
                die("descriptor %d too high", fd);
        int ino;
        if (!existed) {
                const char *name;
                int dir = split_rel(R, rel, &name);
                ino = new_node(R, false, rel);
                struct op *o = rec_add(R, K_CREATE);
                o->dir = dir;
                o->name = name;
                o->ino = ino;
                live_set(R, rel, ino);
        } else {
                ino = live_get(R, rel);
                if (ino < 0)
                        die("open of a file the log does not know: %s", rel);
                if (flags & O_TRUNC) {
                        struct op *o = rec_add(R, K_TRUNC);
                        o->fd = fd;
                        o->ino = ino;
                        o->off = 0;
                }
        }
        struct op *o = rec_add(R, K_OPEN);
        o->fd = fd;
        o->ino = ino;
        R->fdino[fd] = ino;
        R->fdappend[fd] = (flags & O_APPEND) != 0;
        return fd;
}

static int fd_ino(const struct rec *R, int fd)
{
        if (fd < 0 || fd >= MAX_FD || R->fdino[fd] < 0)
                die("operation on an unknown descriptor %d", fd);
        return R->fdino[fd];
}

static ssize_t r_write(void *ctx, int fd, const void *buf, size_t n)
{
        struct rec *R = ctx;
        int ino = fd_ino(R, fd);
        if (R->write_fail_next) {
                R->write_fail_next = false;
                struct op *o = rec_add(R, K_WRITEFAIL);
                o->fd = fd;
                o->ino = ino;
                return -EIO;
        }
        size_t m = n;
        if (++R->nwrite == R->fail_write_at) {
                R->injected = true;
                m = n / 2;
                if (m == 0) {
                        struct op *o = rec_add(R, K_WRITEFAIL);
                        o->fd = fd;
                        o->ino = ino;
                        return -EIO;
                }
                R->write_fail_next = true;
        }
        off_t off;
        if (R->fdappend[fd]) {
                struct stat st;
                if (fstat(fd, &st) < 0)
                        die("fstat: %s", strerror(errno));
                off = st.st_size;
        } else {
                off = lseek(fd, 0, SEEK_CUR);
                if (off < 0)
                        die("lseek: %s", strerror(errno));
        }
        ssize_t w;
        do
                w = write(fd, buf, m);
        while (w < 0 && errno == EINTR);
        if (w < 0)
                return -errno;
        if (w > 0) {
                struct op *o = rec_add(R, K_WRITE);
                o->fd = fd;
                o->ino = ino;
                o->off = (size_t)off;
                o->len = (size_t)w;
                o->data = xmalloc((size_t)w);
                memcpy(o->data, buf, (size_t)w);
        }
        return w;
}

static int do_sync(struct rec *R, int fd, bool data_only)
{
        int ino = fd_ino(R, fd);
        if (++R->nsync == R->fail_sync_at) {
                R->injected = true;
                struct op *o = rec_add(R, K_SYNCFAIL);
                o->fd = fd;
                o->ino = ino;
                return -EIO;
        }
        int r;
        do
                r = data_only ? fdatasync(fd) : fsync(fd);
        while (r < 0 && errno == EINTR);
        if (r < 0)
                die("real fsync failed: %s", strerror(errno));
        struct op *o = rec_add(R, data_only ? K_DATASYNC : K_FSYNC);
        o->fd = fd;
        o->ino = ino;
        return 0;
}

static int r_fdatasync(void *ctx, int fd)
{
        return do_sync(ctx, fd, true);
}

static int r_fsync(void *ctx, int fd)
{
        return do_sync(ctx, fd, false);
}

static int r_close(void *ctx, int fd)
{
        struct rec *R = ctx;
        int ino = fd_ino(R, fd);
        struct op *o = rec_add(R, K_CLOSE);
        o->fd = fd;
        o->ino = ino;
        R->fdino[fd] = -1;
        if (close(fd) < 0 && errno != EINTR)
                return -errno;
        return 0;
}

static int r_ftruncate(void *ctx, int fd, off_t len)
{
        struct rec *R = ctx;
        int ino = fd_ino(R, fd);
        int r;
        do
                r = ftruncate(fd, len);
        while (r < 0 && errno == EINTR);
        if (r < 0)
                return -errno;
        struct op *o = rec_add(R, K_TRUNC);
        o->fd = fd;
        o->ino = ino;
        o->off = (size_t)len;
        return 0;
}

static int r_rename(void *ctx, const char *from, const char *to)
{
        struct rec *R = ctx;
        const char *rf = must_rel(R, from), *rt = must_rel(R, to);
        const char *nf, *nt;
        int df = split_rel(R, rf, &nf), dt = split_rel(R, rt, &nt);
        if (df != dt)
                die("rename across directories is not modelled: %s -> %s", rf, rt);
        int ino = live_get(R, rf);
        int ino2 = live_get(R, rt);
        if (rename(from, to) < 0) {
                int e = -errno;
                free((char *)nf);
                free((char *)nt);
                return e;
        }
        if (ino < 0)
                die("rename of a file the log does not know: %s", rf);
        struct op *o = rec_add(R, K_RENAME);
        o->dir = df;
        o->name = nf;
        o->name2 = nt;
        o->ino = ino;
        o->ino2 = ino2;
        live_del(R, rf);
        live_set(R, rt, ino);
        free(R->nodepath[ino]);
        R->nodepath[ino] = xstrdup(rt);
        return 0;
}

static int r_unlink(void *ctx, const char *path)
{
        struct rec *R = ctx;
        const char *rel = must_rel(R, path);
        int ino = live_get(R, rel);
        if (unlink(path) < 0)
                return -errno;
        if (ino < 0)
                die("unlink of a file the log does not know: %s", rel);
        const char *name;
        struct op *o = rec_add(R, K_UNLINK);
        o->dir = split_rel(R, rel, &name);
        o->name = name;
        o->ino = ino;
        live_del(R, rel);
        return 0;
}

static int r_mkdir(void *ctx, const char *path, mode_t mode)
{
        struct rec *R = ctx;
        const char *rel = rel_of(R, path);
        if (mkdir(path, mode) < 0)
                return -errno;
        if (!rel)
                die("mkdir outside the scratch directory: %s", path);
        const char *name;
        int dir = split_rel(R, rel, &name);
        int ino = new_node(R, true, rel);
        struct op *o = rec_add(R, K_MKDIR);
        o->dir = dir;
        o->name = name;
        o->ino = ino;
        live_set(R, rel, ino);
        return 0;
}

static int r_fsync_dir(void *ctx, const char *path)
{
        struct rec *R = ctx;
        const char *rel = must_rel(R, path);
        int ino = live_get(R, rel);
        if (ino < 0 || !R->isdir[ino])
                die("fsync of an unknown directory %s", rel);
        if (++R->ndirsync == R->fail_dirsync_at) {
                R->injected = true;
                struct op *o = rec_add(R, K_DIRSYNCFAIL);
                o->ino = ino;
                return -EIO;
        }
        int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        if (fsync(fd) < 0 && errno != EINVAL)
                die("real directory fsync failed: %s", strerror(errno));
        close(fd);
        struct op *o = rec_add(R, K_FSYNC_DIR);
        o->ino = ino;
        return 0;
}

/* syncfs: every file's writes and every directory's entries durable. */
static int r_syncfs(void *ctx, const char *path)
{
        struct rec *R = ctx;
        (void)must_rel(R, path);
        int fd = open(R->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        if (syncfs(fd) < 0)
                die("real syncfs failed: %s", strerror(errno));
        close(fd);
        rec_add(R, K_SYNCFS);
        return 0;
}

static void rec_init(struct rec *R, const char *root)
{
        memset(R, 0, sizeof(*R));
        snprintf(R->root, sizeof(R->root), "%s", root);
        R->rootlen = strlen(R->root);
        for (int i = 0; i < MAX_FD; i++)
                R->fdino[i] = -1;
        new_node(R, true, "");
        live_set(R, "", 0);
        R->phase = "setup";
}

static void rec_free(struct rec *R)
{
        for (size_t i = 0; i < R->nops; i++) {
                free(R->ops[i].data);
                free((char *)R->ops[i].name);
                free((char *)R->ops[i].name2);
        }
        free(R->ops);
        for (size_t i = 0; i < R->nlive; i++)
                free(R->live[i].rel);
        free(R->live);
        for (int i = 0; i < R->nnodes; i++)
                free(R->nodepath[i]);
        free(R->nodepath);
        free(R->isdir);
}

static struct kio rec_kio(struct rec *R)
{
        return (struct kio){
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
                .syncfs = r_syncfs,
                .ctx = R,
        };
}

static void op_describe(const struct rec *R, size_t i, char *out, size_t n)
{
        if (i >= R->nops) {
                snprintf(out, n, "end of the workload");
                return;
        }
        const struct op *o = &R->ops[i];
        const char *p = o->ino >= 0 ? R->nodepath[o->ino] : "?";
        switch (o->k) {
        case K_CREATE:
                snprintf(out, n, "#%zu create %s/%s", i, R->nodepath[o->dir], o->name);
                break;
        case K_MKDIR:
                snprintf(out, n, "#%zu mkdir %s/%s", i, R->nodepath[o->dir], o->name);
                break;
        case K_OPEN:
                snprintf(out, n, "#%zu open %s (fd %d)", i, p, o->fd);
                break;
        case K_WRITE:
                snprintf(out, n, "#%zu write %s [%zu, +%zu)", i, p, o->off, o->len);
                break;
        case K_TRUNC:
                snprintf(out, n, "#%zu ftruncate %s to %zu", i, p, o->off);
                break;
        case K_DATASYNC:
                snprintf(out, n, "#%zu fdatasync %s", i, p);
                break;
        case K_FSYNC:
                snprintf(out, n, "#%zu fsync %s", i, p);
                break;
        case K_SYNCFAIL:
                snprintf(out, n, "#%zu fdatasync %s FAILED (injected)", i, p);
                break;
        case K_WRITEFAIL:
                snprintf(out, n, "#%zu write %s FAILED (injected)", i, p);
                break;
        case K_RENAME:
                snprintf(out, n, "#%zu rename %s/%s -> %s", i, R->nodepath[o->dir], o->name,
                         o->name2);
                break;
        case K_UNLINK:
                snprintf(out, n, "#%zu unlink %s/%s", i, R->nodepath[o->dir], o->name);
                break;
        case K_FSYNC_DIR:
                snprintf(out, n, "#%zu fsync dir '%s'", i, p);
                break;
        case K_DIRSYNCFAIL:
                snprintf(out, n, "#%zu fsync dir '%s' FAILED (injected)", i, p);
                break;
        case K_SYNCFS:
                snprintf(out, n, "#%zu syncfs", i);
                break;
        case K_CLOSE:
                snprintf(out, n, "#%zu close %s (fd %d)", i, p, o->fd);
                break;
        case K_BEGIN_WAL:
                snprintf(out, n, "#%zu [begin WAL call %d]", i, o->subject);
                break;
        case K_ACK_WAL:
                snprintf(out, n, "#%zu [ack WAL %d: %zu bytes]", i, o->subject, o->len);
                break;
        case K_BEGIN_FILE:
                snprintf(out, n, "#%zu [begin atomic file %d v%d]", i, o->subject, o->version);
                break;
        case K_ACK_FILE:
                snprintf(out, n, "#%zu [ack atomic file %d v%d]", i, o->subject, o->version);
                break;
        case K_BEGIN_ARCHIVE:
                snprintf(out, n, "#%zu [begin archive]", i);
                break;
        case K_ACK_ARCHIVE:
                snprintf(out, n, "#%zu [ack archive]", i);
                break;
        }
}

/* ------------------------------------------------------------------------ */
/* The workload                                                              */
/* ------------------------------------------------------------------------ */

static const char *const wal_names[NWAL] = { "alpha", "beta", "gamma" };
static const char *const file_names[NFILE] = { "chronos.json", "mandate summary" };

struct wl {
        struct rec *R;
        struct kio io;
        int64_t clock;
        struct wal_options wopt;
        struct wal_spares *spares;      /* gamma's WAL is taken from them */
        char root[PATH_MAX];
        char state[PATH_MAX], waldir[PATH_MAX], archdir[PATH_MAX], mandir[PATH_MAX];
        char mandate_id[NWAL][PLANNER_ID_MAX];
        char wal_path[NWAL][PATH_MAX];
        char wal_rel[NWAL][PATH_MAX];
        struct bytes wal_final[NWAL];   /* every record the WAL ever held, in order */
        char file_path[NFILE][PATH_MAX];
        char file_rel[NFILE][PATH_MAX];
        struct bytes ver[NFILE][MAXVER];
        int nver[NFILE];
        char arch_rel[PATH_MAX];
        struct bytes arch_payload;      /* the WAL content the archive must hold */
        unsigned violations;            /* found while running the workload */
        const char *run;
};

static int64_t wl_clock(void *ctx)
{
        struct wl *x = ctx;
        return x->clock += 1000;
}

static void wl_violation(struct wl *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void wl_violation(struct wl *x, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "VIOLATION [run %s, phase \"%s\", op #%zu]: ", x->run, x->R->phase,
                x->R->nops);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
        x->violations++;
}

static void mark(struct wl *x, enum opk k, int subject, int version, size_t len)
{
        struct op *o = rec_add(x->R, k);
        o->subject = subject;
        o->version = version;
        o->len = len;
}

static void phase(struct wl *x, const char *p)
{
        x->R->phase = p;
}

static void atomic_write(struct wl *x, int F, const char *content)
{
        if (x->nver[F] >= MAXVER)
                die("too many versions");
        int v = x->nver[F]++;
        b_set(&x->ver[F][v], content, strlen(content));
        mark(x, K_BEGIN_FILE, F, v, 0);
        int r = kio_write_file_atomic(&x->io, x->file_path[F], content, strlen(content), 0640);
        if (r == 0)
                mark(x, K_ACK_FILE, F, v, 0);
        else if (!x->R->injected)
                die("kio_write_file_atomic: %s", strerror(-r));
}

struct mrun {
        struct wl *x;
        int W;
        struct wal *w;
        bool dead;
        struct wal_open_info info;
        struct planner_plan p[2];
};

/* A library call failed: legitimate only after an injected failure; then
 * the WAL must be failed and refuse everything without touching the disk. */
static void m_failed(struct mrun *m, int r, const char *what)
{
        struct wl *x = m->x;
        if (!x->R->injected)
                die("%s failed without an injected failure: %s (%s)", what, strerror(-r),
                    wal_encode_error());
        m->dead = true;
        if (!m->w)
                return;
        if (wal_state(m->w) != WAL_STATE_FAILED)
                wl_violation(x, "%s failed (%s) but the WAL is not FAILED", what, strerror(-r));
        size_t before = x->R->nops;
        int a = wal_mark_reset(m->w, "probe_001");
        int f = wal_flush(m->w);
        if (a >= 0 || f >= 0)
                wl_violation(x, "a failed WAL still accepts appends (%d) or flushes (%d)", a, f);
        for (size_t i = before; i < x->R->nops; i++)
                if (x->R->ops[i].k != K_OPEN && x->R->ops[i].k != K_CLOSE) {
                        wl_violation(x, "a failed WAL still touched the disk");
                        break;
                }
}

static void m_do(struct mrun *m, int r, const char *what)
{
        if (r < 0)
                m_failed(m, r, what);
}

#define DO(m, call)                                                                        \
        do {                                                                               \
                if (!(m)->dead)                                                            \
                        m_do((m), (call), #call);                                          \
        } while (0)

static void m_ack(struct mrun *m)
{
        struct stat st;
        if (stat(m->x->wal_path[m->W], &st) < 0)
                die("stat %s: %s", m->x->wal_path[m->W], strerror(errno));
        mark(m->x, K_ACK_WAL, m->W, 0, (size_t)st.st_size);
}

static void m_open(struct mrun *m)
{
        if (m->dead)
                return;
        mark(m->x, K_BEGIN_WAL, m->W, 0, 0);
        int r = wal_open(m->x->wal_path[m->W], &m->x->wopt, &m->w, &m->info);
        if (r < 0) {
                m->w = NULL;
                m_failed(m, r, "wal_open");
                return;
        }
        if (m->info.corrupt)
                die("the workload's own WAL is corrupt: %s", m->info.bad_reason);
        /* the file exists; opening an existing file makes nothing durable
         * (records a previous process wrote without a flush stay
         * unacknowledged).  A spare renamed is not acknowledged by its open:
         * its name may still be lost; its first flush acknowledges it (as
         * kairosd's reply to the fire comes after that flush). */
        if (!m->info.from_spare)
                mark(m->x, K_ACK_WAL, m->W, 0, 0);
}

static void m_flush(struct mrun *m)
{
        if (m->dead)
                return;
        mark(m->x, K_BEGIN_WAL, m->W, 0, 0);
        int r = wal_flush(m->w);
        if (r < 0)
                m_failed(m, r, "wal_flush");
        else
                m_ack(m);
}

static void m_close(struct mrun *m)
{
        if (m->w)
                wal_close(m->w);
        m->w = NULL;
}

static const struct planner_step *pstep(struct mrun *m, int cycle, int i)
{
        return &m->p[cycle].steps[i];
}

static void m_start(struct mrun *m, int cycle, int i)
{
        const struct planner_step *s = pstep(m, cycle, i);
        char key[256];
        snprintf(key, sizeof(key), "%s/%s", m->x->mandate_id[m->W], s->step_id);
        DO(m, wal_append_pending(m->w, s->step_id, m->p[cycle].plan_id, key));
        DO(m, wal_mark_executing(m->w, s->step_id, s->pre_hash));
}

static void m_complete(struct mrun *m, int cycle, int i)
{
        const struct planner_step *s = pstep(m, cycle, i);
        char result[512];
        /* results of varied sizes, some spanning sector boundaries */
        snprintf(result, sizeof(result),
                 "{\"phase\":%d,\"cycle\":%d,\"note\":\"%.*s\",\"kairos\":{\"done\":false}}", i,
                 cycle + 1, 40 + 60 * i,
                 "the handler wrote a report; the handler wrote a report; the handler wrote a "
                 "report; the handler wrote a report; the handler wrote a report; the handler "
                 "wrote a report; the handler wrote a report; the handler wrote a report.");
        DO(m, wal_mark_completed(m->w, s->step_id, s->expected_post_hash, s->params_hash, false,
                                 NULL, result));
}

static void m_init(struct mrun *m, struct wl *x, int W)
{
        memset(m, 0, sizeof(*m));
        m->x = x;
        m->W = W;
        for (int c = 0; c < 2; c++)
                if (planner_build(wal_names[W], FIRED, c + 1, &m->p[c]) < 0)
                        die("planner_build");
}

static void m_capture(struct mrun *m)
{
        if (read_whole(m->x->wal_path[m->W], &m->x->wal_final[m->W]) < 0)
                m->x->wal_final[m->W].n = 0;
}

/* What the daemon's recovery does: fold, plan, append every record with no
 * sync of its own and close the WAL; once every WAL is done, ONE syncfs,
 * and only then anything acts on the records (READY=1): the WAL is opened
 * again for the executor. */
static size_t m_recover(struct mrun *m)
{
        if (m->dead)
                return 0;
        struct fold *f = NULL;
        struct recovery *rec = NULL;
        size_t n = 0;
        if (fold_file(m->x->wal_path[m->W], &f) < 0 || recovery_plan_fold(f, &rec) < 0)
                die("the workload cannot plan its own recovery");
        n = recovery_record_count(rec);
        for (size_t i = 0; i < n; i++)
                DO(m, wal_append(m->w, recovery_record_at(rec, i)));
        recovery_free(rec);
        fold_free(f);
        if (!n || m->dead)
                return n;
        m_close(m);
        mark(m->x, K_BEGIN_WAL, m->W, 0, 0);
        int r = kio_syncfs(&m->x->io, m->x->state);
        if (r < 0) {
                m_failed(m, r, "syncfs");
                return n;
        }
        m_ack(m);
        m_open(m);
        return n;
}

static const char *chronos_text(int v)
{
        static char buf[2048];
        int n = snprintf(buf, sizeof(buf), "{\"version\":1,\"generation\":%d,\"schedules\":{", v);
        for (int i = 0; i < 3 + 4 * v; i++)
                n += snprintf(buf + n, sizeof(buf) - (size_t)n,
                              "%s\"sched%02d\":{\"last_fire\":\"2026-04-20T12:%02d:00Z\","
                              "\"paused\":false}",
                              i ? "," : "", i, (i + v) % 60);
        snprintf(buf + n, sizeof(buf) - (size_t)n, "}}\n");
        return buf;
}

static void life_alpha(struct wl *x)
{
        struct mrun mm, *m = &mm;
        m_init(m, x, 0);

        phase(x, "alpha: wal_open creates the WAL");
        m_open(m);
        phase(x, "alpha: mandate + plan_commit + append/executing(observe), one flush");
        DO(m, wal_mandate(m->w, m->p[0].mandate_id, "alpha", FIRED, "prove the WAL"));
        DO(m, wal_commit_planner_plan(m->w, &m->p[0]));
        m_start(m, 0, 0);
        m_flush(m);
        phase(x, "alpha: completed(observe) + append/executing(orient)");
        m_complete(m, 0, 0);
        m_start(m, 0, 1);
        m_flush(m);
        phase(x, "alpha: completed(orient) + append/executing(decide)");
        m_complete(m, 0, 1);
        m_start(m, 0, 2);
        m_flush(m);
        phase(x, "alpha: failed(decide) + plan_finalize(failed) + cycle 2 plan_commit + observe");
        DO(m, wal_mark_failed(m->w, pstep(m, 0, 2)->step_id, "exit_status",
                              "handler exited with status 3"));
        DO(m, wal_finalize_plan(m->w, m->p[0].plan_id, PLAN_FAILED, "step_failed"));
        DO(m, wal_commit_planner_plan(m->w, &m->p[1]));
        m_start(m, 1, 0);
        m_flush(m);

        phase(x, "chronos.json v2");
        atomic_write(x, 0, chronos_text(2));

        static const char *const ph[] = {
                "alpha: cycle 2 completed(observe) + orient",
                "alpha: cycle 2 completed(orient) + decide",
                "alpha: cycle 2 completed(decide) + act",
                "alpha: cycle 2 completed(act) + reflect",
        };
        for (int i = 0; i < 4; i++) {
                phase(x, ph[i]);
                m_complete(m, 1, i);
                m_start(m, 1, i + 1);
                m_flush(m);
        }
        /* As a mandate that ends alone: its last records get no fdatasync;
         * the syncfs after its summary and archive is their barrier. */
        phase(x, "alpha: completed(reflect) + plan_finalize(succeeded), not flushed");
        m_complete(m, 1, 4);
        DO(m, wal_finalize_plan(m->w, m->p[1].plan_id, PLAN_SUCCEEDED, NULL));
        m_capture(m);
        b_copy(&x->arch_payload, &x->wal_final[0]);

        if (m->dead) {
                m_close(m);
                return;
        }
        /* As kairosd ends a mandate: summary and archive written unsynced,
         * one syncfs for the batch (here: of the mandate alone, which also
         * makes its last records durable), the WAL unlinked, the next
         * batch's syncfs (or the one at the stop) makes the unlink durable. */
        phase(x, "alpha: mandate summary written unsynced (batch)");
        int r = kio_mkdir_p(&x->io, x->mandir, 0750);
        if (r < 0 && !x->R->injected)
                die("kio_mkdir_p: %s", strerror(-r));
        int sv = -1;
        if (r == 0) {
                char summary[PATH_MAX + 1024];
                pfmt(summary, sizeof(summary),
                         "{\"mandate_id\":\"%s\",\"schedule\":\"alpha\",\"fired_at\":\"%s\","
                         "\"status\":\"done\",\"reason\":\"MaxCycles reached\",\"cycles\":2,"
                         "\"archive\":\"%s/%s.wal.jsonl.gz\"}\n",
                         x->mandate_id[0], FIRED, x->archdir, x->mandate_id[0]);
                if (x->nver[1] >= MAXVER)
                        die("too many versions");
                sv = x->nver[1]++;
                b_set(&x->ver[1][sv], summary, strlen(summary));
                mark(x, K_BEGIN_FILE, 1, sv, 0);
                r = kio_write_file_nosync(&x->io, x->file_path[1], summary, strlen(summary),
                                          0640);
                if (r < 0 && !x->R->injected)
                        die("kio_write_file_nosync: %s", strerror(-r));
        }
        if (r < 0) {
                m_close(m);
                return;
        }
        phase(x, "alpha: archive staged (gzip, rename, no sync), syncfs, WAL unlinked");
        mark(x, K_BEGIN_ARCHIVE, 0, 0, 0);
        char *wpath = xstrdup(wal_path(m->w));
        wal_close(m->w);
        m->w = NULL;
        char *dest = NULL;
        r = wal_archive_stage(&x->io, wpath, x->archdir, &dest);
        free(dest);
        if (r == 0) {
                mark(x, K_BEGIN_WAL, m->W, 0, 0);
                r = kio_syncfs(&x->io, x->state);
        }
        if (r == 0) {
                m_ack(m);
                mark(x, K_ACK_FILE, 1, sv, 0);
                r = x->io.unlink(x->io.ctx, wpath);
        }
        phase(x, "alpha: the next batch's syncfs");
        if (r == 0)
                r = kio_syncfs(&x->io, x->state);
        free(wpath);
        if (r == 0)
                mark(x, K_ACK_ARCHIVE, 0, 0, 0);
        else if (!x->R->injected)
                die("archive batch: %s", strerror(-r));
}

static void life_beta(struct wl *x)
{
        struct mrun mm, *m = &mm;
        m_init(m, x, 1);

        phase(x, "beta: wal_open creates the WAL");
        m_open(m);
        phase(x, "beta: mandate + plan_commit + observe");
        DO(m, wal_mandate(m->w, m->p[0].mandate_id, "beta", FIRED, NULL));
        DO(m, wal_commit_planner_plan(m->w, &m->p[0]));
        m_start(m, 0, 0);
        m_flush(m);
        phase(x, "beta: completed(observe) + executing(orient), then the daemon dies");
        m_complete(m, 0, 0);
        m_start(m, 0, 1);
        m_flush(m);
        m_close(m);

        phase(x, "beta: restart, recovery appends needs_review(orient)");
        m_open(m);
        size_t n = m_recover(m);
        if (!m->dead && n != 1)
                die("beta: recovery planned %zu records, expected 1", n);
        phase(x, "beta: operator resolve --retry (operator + reset)");
        DO(m, wal_operator(m->w, x->mandate_id[1], "resolve_retry", pstep(m, 0, 1)->step_id, 0,
                           "crash-state workload"));
        DO(m, wal_mark_reset(m->w, pstep(m, 0, 1)->step_id));
        m_flush(m);
        phase(x, "beta: orient runs again");
        m_start(m, 0, 1);
        m_flush(m);
        phase(x, "beta: completed(orient) + decide");
        m_complete(m, 0, 1);
        m_start(m, 0, 2);
        m_flush(m);
        phase(x, "beta: completed(decide) appended, the daemon dies before the flush");
        m_complete(m, 0, 2);
        m_close(m);
        phase(x, "beta: restart 2, recovery resumes at act (no record)");
        m_open(m);
        n = m_recover(m);
        if (!m->dead && n != 0)
                die("beta: recovery 2 planned %zu records, expected 0", n);
        phase(x, "beta: append/executing(act)");
        m_start(m, 0, 3);
        m_flush(m);
        m_capture(m);
        m_close(m);
}

static void life_gamma(struct wl *x)
{
        struct mrun mm, *m = &mm;
        m_init(m, x, 2);

        phase(x, "gamma: two spares made ahead (no sync)");
        uint64_t mark_at = 0;
        if (wal_spares_new(&x->io, x->waldir, 2, &x->spares) < 0)
                die("wal_spares_new");
        int r = wal_spares_fill(x->spares, &mark_at);
        if (r < 0 && !x->R->injected)
                die("wal_spares_fill: %s", strerror(-r));
        phase(x, "gamma: the syncfs that makes the spares durable");
        wal_spares_covered(x->spares, mark_at, kio_syncfs(&x->io, x->state));
        phase(x, "gamma: wal_open takes a spare (renamed, no fsync of wal/)");
        x->wopt.spares = x->spares;
        m_open(m);
        x->wopt.spares = NULL;
        if (!m->dead && !m->info.from_spare && !x->R->injected)
                die("gamma: the WAL was not made from a spare");
        phase(x, "gamma: a spare made again, not covered yet");
        (void)wal_spares_fill(x->spares, &mark_at);
        phase(x, "gamma: mandate + plan_commit + observe");
        DO(m, wal_mandate(m->w, m->p[0].mandate_id, "gamma", FIRED, "torn tail"));
        DO(m, wal_commit_planner_plan(m->w, &m->p[0]));
        m_start(m, 0, 0);
        m_flush(m);
        m_close(m);
        if (!m->dead) {
                phase(x, "gamma: completed(observe) torn: half a record, then the crash");
                const struct planner_step *s = pstep(m, 0, 0);
                struct wal_record rc = { .op = WAL_OP_COMPLETED, .step_id = s->step_id,
                                         .post_hash = s->expected_post_hash,
                                         .result_hash = s->params_hash };
                struct kbuf line = KBUF_INIT;
                if (wal_encode(&rc, wl_clock(x), &line) < 0)
                        die("wal_encode");
                int fd = x->io.open(x->io.ctx, x->wal_path[2], O_WRONLY | O_APPEND | O_CLOEXEC,
                                    0600);
                if (fd < 0)
                        die("open: %s", strerror(-fd));
                (void)kio_write_all(&x->io, fd, line.data, line.len / 2, NULL);
                x->io.close(x->io.ctx, fd);
                kbuf_free(&line);
        }
        phase(x, "gamma: restart, wal_open repairs the torn tail");
        m_open(m);
        if (!m->dead && !m->info.torn_repaired && !x->R->injected)
                die("gamma: the torn tail was not repaired");
        phase(x, "gamma: recovery appends needs_review(observe)");
        m_recover(m);
        phase(x, "gamma: operator resolve --done + orient");
        DO(m, wal_operator(m->w, x->mandate_id[2], "resolve_done", pstep(m, 0, 0)->step_id, 0,
                           "crash-state workload"));
        DO(m, wal_mark_completed(m->w, pstep(m, 0, 0)->step_id,
                                 pstep(m, 0, 0)->expected_post_hash, "",
                                 false, "{\"reason\":\"operator_resolved_done\",\"uid\":0}",
                                 NULL));
        m_start(m, 0, 1);
        m_flush(m);
        m_capture(m);
        m_close(m);
}

static void wl_init(struct wl *x, struct rec *R, const char *root, const char *run)
{
        memset(x, 0, sizeof(*x));
        x->R = R;
        x->run = run;
        x->io = rec_kio(R);
        x->clock = 1776686400000LL;
        x->wopt = (struct wal_options){ .io = &x->io, .now_ms = wl_clock, .clock_ctx = x };
        pfmt(x->root, sizeof(x->root), "%s", root);
        pfmt(x->state, sizeof(x->state), "%s/state", root);
        pfmt(x->waldir, sizeof(x->waldir), "%s/wal", x->state);
        pfmt(x->archdir, sizeof(x->archdir), "%s/archive", x->state);
        pfmt(x->mandir, sizeof(x->mandir), "%s/mandates", x->state);
        for (int W = 0; W < NWAL; W++) {
                if (planner_mandate_id(wal_names[W], FIRED, x->mandate_id[W]) < 0)
                        die("planner_mandate_id");
                pfmt(x->wal_rel[W], sizeof(x->wal_rel[W]), "state/wal/%s.wal.jsonl",
                         x->mandate_id[W]);
                pfmt(x->wal_path[W], sizeof(x->wal_path[W]), "%s/%s", root, x->wal_rel[W]);
        }
        pfmt(x->file_rel[0], sizeof(x->file_rel[0]), "state/chronos.json");
        pfmt(x->file_rel[1], sizeof(x->file_rel[1]), "state/mandates/%s.json",
                 x->mandate_id[0]);
        for (int F = 0; F < NFILE; F++)
                pfmt(x->file_path[F], sizeof(x->file_path[F]), "%s/%s", root, x->file_rel[F]);
        pfmt(x->arch_rel, sizeof(x->arch_rel), "state/archive/%s.wal.jsonl.gz",
                 x->mandate_id[0]);
}

static void wl_free(struct wl *x)
{
        wal_spares_free(x->spares);
        x->spares = NULL;
        for (int W = 0; W < NWAL; W++)
                b_free(&x->wal_final[W]);
        for (int F = 0; F < NFILE; F++)
                for (int v = 0; v < MAXVER; v++)
                        b_free(&x->ver[F][v]);
        b_free(&x->arch_payload);
}

/* Scan the log for acknowledgements the failure rules forbid. */
static void check_log(struct wl *x)
{
        const struct rec *R = x->R;
        for (size_t j = 0; j < R->nops; j++) {
                const struct op *a = &R->ops[j];
                enum opk begin;
                if (a->k == K_ACK_WAL)
                        begin = K_BEGIN_WAL;
                else if (a->k == K_ACK_FILE)
                        begin = K_BEGIN_FILE;
                else if (a->k == K_ACK_ARCHIVE)
                        begin = K_BEGIN_ARCHIVE;
                else
                        continue;
                size_t i = j;
                while (i > 0 && !(R->ops[i - 1].k == begin && R->ops[i - 1].subject == a->subject))
                        i--;
                for (size_t q = i; q < j; q++) {
                        enum opk k = R->ops[q].k;
                        if (k == K_SYNCFAIL || k == K_WRITEFAIL || k == K_DIRSYNCFAIL) {
                                char d[256];
                                op_describe(R, q, d, sizeof(d));
                                wl_violation(x, "op #%zu acknowledged although %s in the same call",
                                             j, d);
                        }
                }
        }
        /* after a failed sync or write on a descriptor, until it is closed:
         * no write, no sync, and no acknowledgement of that WAL (a later
         * open is a restart) */
        for (size_t i = 0; i < R->nops; i++) {
                const struct op *f = &R->ops[i];
                if (f->k != K_SYNCFAIL && f->k != K_WRITEFAIL)
                        continue;
                int subject = -1;
                for (int W = 0; W < NWAL; W++)
                        if (strcmp(R->nodepath[f->ino], x->wal_rel[W]) == 0)
                                subject = W;
                for (size_t q = i + 1; q < R->nops; q++) {
                        const struct op *o = &R->ops[q];
                        if (o->fd == f->fd) {
                                if (o->k == K_CLOSE)
                                        break;
                                if (o->k == K_WRITE || o->k == K_DATASYNC ||
                                    o->k == K_FSYNC || o->k == K_SYNCFAIL)
                                        wl_violation(x, "op #%zu touches fd %d after its failure "
                                                        "at op #%zu", q, f->fd, i);
                                else if (o->k == K_TRUNC && f->k == K_SYNCFAIL)
                                        wl_violation(x, "op #%zu truncates fd %d after its failed "
                                                        "sync", q, f->fd);
                        }
                        if (subject >= 0 && o->k == K_ACK_WAL && o->subject == subject)
                                wl_violation(x, "WAL %s acknowledged at op #%zu after the failure "
                                                "at op #%zu", wal_names[subject], q, i);
                }
        }
}

static void run_workload(struct wl *x)
{
        phase(x, "setup: state directory");
        int r = kio_mkdir_p(&x->io, x->state, 0700);
        if (r < 0 && !x->R->injected)
                die("kio_mkdir_p: %s", strerror(-r));
        if (r < 0) {
                /* kairosd does not start without its state directory made
                 * durable (statedir_create): nothing runs, nothing is
                 * acknowledged */
                phase(x, "end");
                check_log(x);
                return;
        }
        phase(x, "chronos.json v1");
        atomic_write(x, 0, chronos_text(1));
        life_alpha(x);
        life_beta(x);
        life_gamma(x);
        phase(x, "chronos.json v3");
        atomic_write(x, 0, chronos_text(3));
        phase(x, "end");
        check_log(x);
        /* sanity: every acknowledged length lies within the final content */
        for (size_t i = 0; i < x->R->nops; i++) {
                const struct op *o = &x->R->ops[i];
                if (o->k == K_ACK_WAL && o->len > x->wal_final[o->subject].n)
                        die("acknowledged %zu bytes of %s but it ends at %zu", o->len,
                            wal_names[o->subject], x->wal_final[o->subject].n);
        }
}

/* ------------------------------------------------------------------------ */
/* The file-system model                                                     */
/* ------------------------------------------------------------------------ */

struct ment {
        const char *name;
        int ino;
};

struct ents {
        struct ment *e;
        size_t n, cap;
};

static int ents_get(const struct ents *e, const char *name)
{
        for (size_t i = 0; i < e->n; i++)
                if (strcmp(e->e[i].name, name) == 0)
                        return e->e[i].ino;
        return -1;
}

static void ents_del(struct ents *e, const char *name)
{
        for (size_t i = 0; i < e->n; i++)
                if (strcmp(e->e[i].name, name) == 0) {
                        memmove(&e->e[i], &e->e[i + 1], (e->n - i - 1) * sizeof(e->e[0]));
                        e->n--;
                        return;
                }
}

static void ents_set(struct ents *e, const char *name, int ino)
{
        for (size_t i = 0; i < e->n; i++)
                if (strcmp(e->e[i].name, name) == 0) {
                        e->e[i].ino = ino;
                        return;
                }
        GROW(e->e, e->n, e->cap);
        e->e[e->n++] = (struct ment){ name, ino };
}

static void ents_copy(struct ents *dst, const struct ents *src)
{
        dst->n = 0;
        for (size_t i = 0; i < src->n; i++) {
                GROW(dst->e, dst->n, dst->cap);
                dst->e[dst->n++] = src->e[i];
        }
}

static void ns_apply(struct ents *e, const struct op *o)
{
        switch (o->k) {
        case K_CREATE:
        case K_MKDIR:
                ents_set(e, o->name, o->ino);
                break;
        case K_RENAME:
                ents_del(e, o->name);
                ents_set(e, o->name2, o->ino);
                break;
        case K_UNLINK:
                ents_del(e, o->name);
                break;
        default:
                break;
        }
}

struct mnode {
        bool dir;
        struct bytes dur, cur;
        size_t *pend;
        size_t npend, pcap;
        bool poisoned;
        struct ents dents, cents;
        size_t *dpend;
        size_t ndpend, dpcap;
};

/* What the workload had acknowledged before the crash. */
struct acks {
        long long wal[NWAL];   /* -1: not even the creation */
        int file_acked[NFILE];
        int file_begun[NFILE];
        bool arch_begun, arch_acked;
};

struct model {
        const struct rec *R;
        struct mnode *n;
        size_t nn;
        size_t at;             /* ops [0, at) applied */
        struct acks acks;
};

static void model_init(struct model *M, const struct rec *R)
{
        memset(M, 0, sizeof(*M));
        M->R = R;
        M->nn = (size_t)R->nnodes;
        M->n = calloc(M->nn, sizeof(*M->n));
        if (!M->n)
                die("out of memory");
        M->n[0].dir = true;
        for (int W = 0; W < NWAL; W++)
                M->acks.wal[W] = -1;
        for (int F = 0; F < NFILE; F++)
                M->acks.file_acked[F] = M->acks.file_begun[F] = -1;
}

static void model_free(struct model *M)
{
        for (size_t i = 0; i < M->nn; i++) {
                b_free(&M->n[i].dur);
                b_free(&M->n[i].cur);
                free(M->n[i].pend);
                free(M->n[i].dpend);
                free(M->n[i].dents.e);
                free(M->n[i].cents.e);
        }
        free(M->n);
}

static void apply_data(struct bytes *b, const struct op *o)
{
        if (o->k == K_WRITE)
                b_put(b, o->off, o->data, o->len);
        else if (o->k == K_TRUNC)
                b_resize(b, o->off);
}

static void model_step(struct model *M)
{
        const struct op *o = &M->R->ops[M->at];
        size_t idx = M->at++;
        struct mnode *n = o->ino >= 0 ? &M->n[o->ino] : NULL;
        switch (o->k) {
        case K_CREATE:
        case K_MKDIR:
                n->dir = o->k == K_MKDIR;
                /* fall through */
        case K_RENAME:
        case K_UNLINK: {
                struct mnode *d = &M->n[o->dir];
                ns_apply(&d->cents, o);
                GROW(d->dpend, d->ndpend, d->dpcap);
                d->dpend[d->ndpend++] = idx;
                break;
        }
        case K_WRITE:
        case K_TRUNC:
                apply_data(&n->cur, o);
                GROW(n->pend, n->npend, n->pcap);
                n->pend[n->npend++] = idx;
                break;
        case K_DATASYNC:
        case K_FSYNC:
                if (!n->poisoned) {
                        b_copy(&n->dur, &n->cur);
                        n->npend = 0;
                }
                break;
        case K_SYNCFAIL:
                n->poisoned = true;
                break;
        case K_FSYNC_DIR:
                ents_copy(&n->dents, &n->cents);
                n->ndpend = 0;
                break;
        case K_SYNCFS:
                for (size_t i = 0; i < M->nn; i++) {
                        struct mnode *q = &M->n[i];
                        if (M->R->isdir[i]) {
                                ents_copy(&q->dents, &q->cents);
                                q->ndpend = 0;
                        } else if (!q->poisoned) {
                                b_copy(&q->dur, &q->cur);
                                q->npend = 0;
                        }
                }
                break;
        case K_ACK_WAL:
                if ((long long)o->len > M->acks.wal[o->subject])
                        M->acks.wal[o->subject] = (long long)o->len;
                break;
        case K_BEGIN_FILE:
                M->acks.file_begun[o->subject] = o->version;
                break;
        case K_ACK_FILE:
                M->acks.file_acked[o->subject] = o->version;
                break;
        case K_BEGIN_ARCHIVE:
                M->acks.arch_begun = true;
                break;
        case K_ACK_ARCHIVE:
                M->acks.arch_acked = true;
                break;
        default:
                break;
        }
}

/* ------------------------------------------------------------------------ */
/* Crash states: items and choices                                          */
/* ------------------------------------------------------------------------ */

enum item_kind { IT_WRITE, IT_TRUNC, IT_DIR };

enum alt {
        A_KEEP,
        A_DROP,
        A_ZERO,        /* the size grew, the data never landed */
        A_TORN,        /* [0, cut) landed, the rest dropped */
        A_TORN_ZERO,   /* [0, cut) landed, the rest zeros */
};

static const char *const alt_names[] = { "keep", "drop", "zero", "torn", "torn+zero" };

struct item {
        enum item_kind k;
        int node;
        size_t op;      /* IT_WRITE / IT_TRUNC */
        size_t nd;      /* IT_DIR: pending entry operations */
};

struct choice {
        int alt;        /* IT_DIR: the prefix kept; IT_TRUNC: 0 applied, 1 undone */
        size_t cut;
};

struct point {
        size_t k;
        struct item *it;
        size_t nit, itcap;
        int *node_item;   /* first item of a node's pending data ops, or -1 */
        int *dir_item;    /* the item of a directory, or -1 */
};

static bool reachable(const struct model *M, int ino)
{
        if (ino == 0)
                return true;
        for (size_t d = 0; d < M->nn; d++) {
                const struct mnode *n = &M->n[d];
                if (!n->dir)
                        continue;
                for (size_t i = 0; i < n->dents.n; i++)
                        if (n->dents.e[i].ino == ino)
                                return true;
                for (size_t i = 0; i < n->cents.n; i++)
                        if (n->cents.e[i].ino == ino)
                                return true;
                for (size_t i = 0; i < n->ndpend; i++)
                        if (M->R->ops[n->dpend[i]].ino == ino)
                                return true;
        }
        return false;
}

static void point_build(struct point *P, const struct model *M)
{
        P->k = M->at;
        P->nit = 0;
        P->node_item = xrealloc(P->node_item, M->nn * sizeof(int));
        P->dir_item = xrealloc(P->dir_item, M->nn * sizeof(int));
        for (size_t i = 0; i < M->nn; i++) {
                const struct mnode *n = &M->n[i];
                P->node_item[i] = P->dir_item[i] = -1;
                if (!reachable(M, (int)i))
                        continue;
                if (n->dir && n->ndpend) {
                        GROW(P->it, P->nit, P->itcap);
                        P->dir_item[i] = (int)P->nit;
                        P->it[P->nit++] = (struct item){ .k = IT_DIR, .node = (int)i,
                                                         .nd = n->ndpend };
                }
                if (!n->dir && n->npend) {
                        P->node_item[i] = (int)P->nit;
                        for (size_t j = 0; j < n->npend; j++) {
                                const struct op *o = &M->R->ops[n->pend[j]];
                                GROW(P->it, P->nit, P->itcap);
                                P->it[P->nit++] = (struct item){
                                        .k = o->k == K_WRITE ? IT_WRITE : IT_TRUNC,
                                        .node = (int)i,
                                        .op = n->pend[j],
                                };
                        }
                }
        }
}

static void point_free(struct point *P)
{
        free(P->it);
        free(P->node_item);
        free(P->dir_item);
}

/* The coarse alternatives of an item (the exhaustive product's radix). */
static size_t coarse_alts(const struct model *M, const struct item *it, struct choice *out,
                          size_t cap)
{
        size_t n = 0;
#define ADD(a, c)                                                                          \
        do {                                                                               \
                if (n < cap)                                                               \
                        out[n++] = (struct choice){ (a), (c) };                            \
        } while (0)
        switch (it->k) {
        case IT_DIR:
                for (size_t p = 0; p <= it->nd; p++)
                        ADD((int)p, 0);
                break;
        case IT_TRUNC:
                ADD(0, 0);
                ADD(1, 0);
                break;
        case IT_WRITE: {
                const struct op *o = &M->R->ops[it->op];
                ADD(A_KEEP, 0);
                ADD(A_DROP, 0);
                ADD(A_ZERO, 0);
                if (o->len < 2)
                        break;
                for (size_t s = (o->off / SECTOR + 1) * SECTOR; s < o->off + o->len; s += SECTOR) {
                        ADD(A_TORN, s - o->off);
                        ADD(A_TORN_ZERO, s - o->off);
                }
                size_t cuts[3] = { 1, o->len / 2, o->len - 1 };
                for (int i = 0; i < 3; i++) {
                        bool dup = false;
                        for (int j = 0; j < i; j++)
                                dup |= cuts[j] == cuts[i];
                        if (!dup && cuts[i] >= 1 && cuts[i] < o->len)
                                ADD(A_TORN, cuts[i]);
                }
                ADD(A_TORN_ZERO, o->len / 2);
                break;
        }
        }
#undef ADD
        return n;
}

#define MAX_ALTS 64

static double point_space(const struct model *M, const struct point *P, bool sampled)
{
        double s = 1;
        struct choice tmp[MAX_ALTS];
        for (size_t i = 0; i < P->nit; i++) {
                size_t a = coarse_alts(M, &P->it[i], tmp, MAX_ALTS);
                if (sampled && P->it[i].k == IT_WRITE)
                        a += M->R->ops[P->it[i].op].len; /* random cuts */
                s *= (double)a;
                if (s > 1e12)
                        return 1e12;
        }
        return s;
}

/* ------------------------------------------------------------------------ */
/* Materialized states                                                       */
/* ------------------------------------------------------------------------ */

struct sent {
        char rel[PATH_MAX];
        bool dir;
        int ino;
        struct bytes data;
};

struct mstate {
        struct sent *e;
        size_t n, cap;
        struct ents *dirents;  /* per node, the entries after the crash */
        size_t ndirents;
};

static void node_content(const struct model *M, const struct point *P, const struct choice *ch,
                         int ino, struct bytes *out)
{
        const struct mnode *n = &M->n[ino];
        b_copy(out, &n->dur);
        if (!n->npend)
                return;
        int base = P->node_item[ino];
        for (size_t j = 0; j < n->npend; j++) {
                const struct op *o = &M->R->ops[n->pend[j]];
                const struct choice *c = base >= 0 ? &ch[base + (int)j] : NULL;
                int alt = c ? c->alt : A_KEEP;
                if (o->k == K_TRUNC) {
                        if (alt == 0)
                                apply_data(out, o);
                        continue;
                }
                switch (alt) {
                case A_KEEP:
                        b_put(out, o->off, o->data, o->len);
                        break;
                case A_DROP:
                        break;
                case A_ZERO:
                        b_zero(out, o->off, o->len);
                        break;
                case A_TORN:
                        b_put(out, o->off, o->data, c->cut);
                        break;
                case A_TORN_ZERO:
                        b_put(out, o->off, o->data, c->cut);
                        b_zero(out, o->off + c->cut, o->len - c->cut);
                        break;
                }
        }
}

static void ms_walk(struct mstate *S, const struct model *M, const struct point *P,
                    const struct choice *ch, int dir, const char *prefix, int depth)
{
        if (depth > 16)
                die("directory loop in the model");
        const struct ents *e = &S->dirents[dir];
        for (size_t i = 0; i < e->n; i++) {
                if (S->n >= S->cap) {
                        size_t nc = S->cap ? S->cap * 2 : 32;
                        S->e = xrealloc(S->e, nc * sizeof(*S->e));
                        memset(S->e + S->cap, 0, (nc - S->cap) * sizeof(*S->e));
                        S->cap = nc;
                }
                struct sent *s = &S->e[S->n++];
                snprintf(s->rel, sizeof(s->rel), "%s%s%s", prefix, *prefix ? "/" : "",
                         e->e[i].name);
                s->ino = e->e[i].ino;
                s->dir = M->n[s->ino].dir;
                s->data.n = 0;
                if (s->dir) {
                        char sub[PATH_MAX];
                        snprintf(sub, sizeof(sub), "%s", s->rel);
                        ms_walk(S, M, P, ch, s->ino, sub, depth + 1);
                } else {
                        node_content(M, P, ch, s->ino, &s->data);
                }
        }
}

static void ms_build(struct mstate *S, const struct model *M, const struct point *P,
                     const struct choice *ch)
{
        if (S->ndirents < M->nn) {
                S->dirents = xrealloc(S->dirents, M->nn * sizeof(*S->dirents));
                for (size_t i = S->ndirents; i < M->nn; i++)
                        S->dirents[i] = (struct ents){ 0 };
                S->ndirents = M->nn;
        }
        for (size_t d = 0; d < M->nn; d++) {
                const struct mnode *n = &M->n[d];
                if (!n->dir)
                        continue;
                ents_copy(&S->dirents[d], &n->dents);
                size_t keep = P->dir_item[d] >= 0 ? (size_t)ch[P->dir_item[d]].alt : 0;
                for (size_t j = 0; j < keep && j < n->ndpend; j++)
                        ns_apply(&S->dirents[d], &M->R->ops[n->dpend[j]]);
        }
        S->n = 0; /* the entries keep their buffers for reuse */
        ms_walk(S, M, P, ch, 0, "", 0);
}

static void ms_free(struct mstate *S)
{
        for (size_t i = 0; i < S->cap; i++)
                b_free(&S->e[i].data);
        free(S->e);
        for (size_t i = 0; i < S->ndirents; i++)
                free(S->dirents[i].e);
        free(S->dirents);
}

static uint64_t ms_hash(const struct mstate *S)
{
        uint64_t h = 0xcbf29ce484222325ULL;
        for (size_t i = 0; i < S->n; i++) {
                h = fnv(h, S->e[i].rel, strlen(S->e[i].rel) + 1);
                h = fnv(h, &S->e[i].dir, sizeof(S->e[i].dir));
                h = fnv(h, &S->e[i].data.n, sizeof(S->e[i].data.n));
                h = fnv(h, S->e[i].data.p, S->e[i].data.n);
        }
        return h;
}

static const struct sent *ms_find(const struct mstate *S, const char *rel)
{
        for (size_t i = 0; i < S->n; i++)
                if (strcmp(S->e[i].rel, rel) == 0)
                        return &S->e[i];
        return NULL;
}

static void ms_write(const struct mstate *S, const char *dir)
{
        rm_rf(dir);
        if (mkdir(dir, 0700) < 0)
                die("mkdir %s: %s", dir, strerror(errno));
        for (size_t i = 0; i < S->n; i++) {
                char p[PATH_MAX * 2];
                snprintf(p, sizeof(p), "%s/%s", dir, S->e[i].rel);
                if (S->e[i].dir) {
                        if (mkdir(p, 0700) < 0)
                                die("mkdir %s: %s", p, strerror(errno));
                } else {
                        write_whole(p, S->e[i].data.p, S->e[i].data.n);
                }
        }
}

/* The durable content of rel (through durable entries only), or NULL. */
static const struct bytes *durable_of(const struct model *M, const char *rel)
{
        int ino = 0;
        char buf[PATH_MAX];
        snprintf(buf, sizeof(buf), "%s", rel);
        for (char *tok = buf, *slash; tok; tok = slash ? slash + 1 : NULL) {
                slash = strchr(tok, '/');
                if (slash)
                        *slash = '\0';
                if (!M->n[ino].dir)
                        return NULL;
                ino = ents_get(&M->n[ino].dents, tok);
                if (ino < 0)
                        return NULL;
        }
        return M->n[ino].dir ? NULL : &M->n[ino].dur;
}

/* ------------------------------------------------------------------------ */
/* Checking one state                                                        */
/* ------------------------------------------------------------------------ */

struct stats {
        uint64_t states;        /* distinct states checked */
        uint64_t violations;    /* violation messages */
        uint64_t bad_states;
        uint64_t quarantined;   /* WAL files quarantined by recovery */
        uint64_t q_avoidable;   /* ... with no complete record after the bad bytes */
        uint64_t repaired;      /* torn tails repaired */
        uint64_t recovered;     /* WALs recovery appended records to */
        uint64_t absent;        /* WALs absent in the state */
        uint64_t rearchived;    /* finished WALs archived again */
        uint64_t adopted;       /* spares holding records, adopted */
        uint64_t spares_removed; /* spares with no whole record, removed */
        uint64_t attempts;
};

struct opts {
        uint64_t seed;
        uint64_t states;
        bool exhaustive;
        bool variants;
        bool verbose;
        bool quiet;
        long point;             /* -1: all */
        int only_kind;          /* --variant: 0 none, 1 fdatasync, 2 dir fsync, 3 write */
        int only_n;
};

struct checker {
        const struct opts *o;
        const char *run;
        struct wl *x;
        const struct model *M;
        const struct point *P;
        const struct choice *ch;
        const struct mstate *S;
        char dir[PATH_MAX];      /* where states are materialized */
        struct stats *st;
        bool state_bad;
        unsigned printed;
        struct kio nosync;
        int64_t clock;
};

static char g_desc[16384];

static void describe_state(struct checker *c)
{
        const struct model *M = c->M;
        const struct point *P = c->P;
        char opd[512];
        op_describe(M->R, P->k, opd, sizeof(opd));
        size_t n = (size_t)snprintf(g_desc, sizeof(g_desc),
                                    "  run %s, seed %" PRIu64 ", crash point %zu: before %s "
                                    "(phase \"%s\")\n",
                                    c->run, c->o->seed, P->k, opd,
                                    P->k < M->R->nops ? M->R->ops[P->k].phase
                                                      : M->R->ops[M->R->nops - 1].phase);
        for (size_t i = 0; i < P->nit && n < sizeof(g_desc) - 256; i++) {
                const struct item *it = &P->it[i];
                const struct choice *ch = &c->ch[i];
                if (it->k == IT_DIR) {
                        n += (size_t)snprintf(g_desc + n, sizeof(g_desc) - n,
                                              "    dir '%s': %d of %zu pending entry ops kept\n",
                                              M->R->nodepath[it->node], ch->alt, it->nd);
                } else {
                        char d[512];
                        op_describe(M->R, it->op, d, sizeof(d));
                        if (it->k == IT_TRUNC)
                                n += (size_t)snprintf(g_desc + n, sizeof(g_desc) - n,
                                                      "    %s: %s\n", d,
                                                      ch->alt ? "undone" : "applied");
                        else if (ch->alt == A_TORN || ch->alt == A_TORN_ZERO)
                                n += (size_t)snprintf(g_desc + n, sizeof(g_desc) - n,
                                                      "    %s: %s at +%zu\n", d,
                                                      alt_names[ch->alt], ch->cut);
                        else
                                n += (size_t)snprintf(g_desc + n, sizeof(g_desc) - n,
                                                      "    %s: %s\n", d, alt_names[ch->alt]);
                }
        }
}

static void violation(struct checker *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void violation(struct checker *c, const char *fmt, ...)
{
        c->st->violations++;
        if (!c->state_bad) {
                c->state_bad = true;
                c->st->bad_states++;
        }
        if (c->printed++ >= 20)
                return;
        va_list ap;
        va_start(ap, fmt);
        fputs("VIOLATION: ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
        fputs(g_desc, stderr);
}

static int64_t rec_clock(void *ctx)
{
        struct checker *c = ctx;
        return c->clock += 1000;
}

static int ns_sync(void *ctx, int fd)
{
        (void)ctx;
        (void)fd;
        return 0;
}

static int ns_sync_dir(void *ctx, const char *path)
{
        (void)ctx;
        (void)path;
        return 0;
}

/* Complete lines of w shared with the expected content, in bytes. */
static size_t line_prefix(const unsigned char *d, size_t n, const struct bytes *expect)
{
        size_t m = 0, lines_end = 0;
        while (m < n && m < expect->n && d[m] == expect->p[m]) {
                if (d[m] == '\n')
                        lines_end = m + 1;
                m++;
        }
        return lines_end;
}

static bool has_prefix(const struct bytes *b, const struct bytes *expect, size_t n)
{
        return b->n >= n && (n == 0 || memcmp(b->p, expect->p, n) == 0);
}

/* Is the line [p, p+n) (with its '\n') one of the records ever written? */
static bool is_written_line(const struct bytes *expect, const unsigned char *p, size_t n)
{
        size_t i = 0;
        while (i < expect->n) {
                const unsigned char *nl = memchr(expect->p + i, '\n', expect->n - i);
                size_t len = nl ? (size_t)(nl - (expect->p + i)) + 1 : expect->n - i;
                if (len == n && memcmp(expect->p + i, p, n) == 0)
                        return true;
                i += len;
        }
        return false;
}

static void encode_recovery(const struct fold *f, const struct recovery *r, struct kbuf *out)
{
        kbuf_reset(out);
        for (size_t i = 0; i < r->nplans; i++)
                kbuf_printf(out, "plan %s outcome %s resume %zu pause %s\n",
                            f->plans[r->plans[i].plan].plan_id,
                            recovery_outcome_name(r->plans[i].outcome), r->plans[i].resume_step,
                            r->plans[i].pause_step ? r->plans[i].pause_step : "-");
        size_t n = recovery_record_count(r);
        for (size_t i = 0; i < n; i++)
                if (wal_encode(recovery_record_at(r, i), 0, out) < 0)
                        kbuf_printf(out, "unencodable record %zu: %s\n", i, wal_encode_error());
}

static const struct fold_step *find_step(const struct fold *f, const char *id)
{
        return f ? fold_find_step(f, id) : NULL;
}

static bool step_completed(const struct fold_step *s)
{
        return s && s->status && strcmp(s->status, "completed") == 0;
}

static int plan_recovery(struct checker *c, const char *what, const struct fold *f,
                         struct recovery **r)
{
        int e = recovery_plan_fold(f, r);
        if (e < 0) {
                violation(c, "%s: recovery_plan_fold failed: %s", what, strerror(-e));
                *r = NULL;
        }
        return e;
}

static int gunzip(const struct bytes *in, struct bytes *out);

/* A finished mandate whose WAL survived (the crash came before its archive,
 * or undid the unlink) is archived again at the next start: over a leftover
 * .gz.tmp and over an existing archive. */
static void rearchive(struct checker *c, const char *path, const struct fold *f)
{
        if (!f->nplans)
                return;
        for (size_t i = 0; i < f->nplans; i++)
                if (!f->plans[i].finalized)
                        return;
        char adir[PATH_MAX * 2], apath[PATH_MAX * 2];
        snprintf(adir, sizeof(adir), "%s/state/archive", c->dir);
        snprintf(apath, sizeof(apath), "%s/%s", c->dir, c->x->arch_rel);
        struct bytes wal = { 0 }, gz = { 0 }, out = { 0 };
        if (read_whole(path, &wal) < 0)
                die("read %s", path);
        c->st->rearchived++;
        int e = wal_archive_file(&c->nosync, path, adir, NULL);
        if (e < 0)
                violation(c, "archiving the finished WAL again failed: %s", strerror(-e));
        else if (access(path, F_OK) == 0)
                violation(c, "the WAL is still there after archiving it again");
        else if (read_whole(apath, &gz) < 0 || gunzip(&gz, &out) < 0 ||
                 !b_eq(&out, wal.p, wal.n))
                violation(c, "the archive written again does not hold the WAL");
        b_free(&wal);
        b_free(&gz);
        b_free(&out);
}

/* The full recovery of one WAL, and the WAL invariants. */
static void check_wal(struct checker *c, int W)
{
        struct wl *x = c->x;
        const struct bytes *E = &x->wal_final[W];
        const struct sent *s = ms_find(c->S, x->wal_rel[W]);
        long long acked = c->M->acks.wal[W];
        const char *nm = wal_names[W];

        if (!s || s->dir) {
                c->st->absent++;
                if (acked >= 0 && W == 0) {
                        const struct sent *a = ms_find(c->S, x->arch_rel);
                        if (!a)
                                violation(c, "WAL %s is gone and so is its archive "
                                             "(its creation and %lld bytes were acknowledged)",
                                          nm, acked);
                } else if (acked >= 0) {
                        violation(c, "WAL %s is gone (its creation and %lld bytes were "
                                     "acknowledged)", nm, acked);
                }
                return;
        }
        if (W == 0 && c->M->acks.arch_acked)
                violation(c, "WAL %s exists although wal_archive returned (unlink not durable)",
                          nm);

        const struct bytes *C0 = &s->data;
        if (acked > 0 && !has_prefix(C0, E, (size_t)acked))
                violation(c, "WAL %s: acknowledged bytes lost by the crash (%lld acknowledged, "
                             "%zu intact)", nm, acked, line_prefix(C0->p, C0->n, E));

        /* the oracle: complete written lines, then what? */
        size_t pb = line_prefix(C0->p, C0->n, E);
        size_t m = 0;
        while (m < C0->n && m < E->n && C0->p[m] == E->p[m])
                m++;
        size_t nz = C0->n;
        while (nz > pb && C0->p[nz - 1] == '\0')
                nz--;
        bool pure_torn = nz <= m;   /* a strict prefix of the next record, then NULs */

        struct fold *f0 = NULL;
        int e = fold_buffer((const char *)C0->p, C0->n, &f0);
        if (e < 0) {
                violation(c, "WAL %s: fold_buffer failed: %s", nm, strerror(-e));
                return;
        }
        if (pure_torn) {
                enum fold_status want = C0->n == pb ? FOLD_CLEAN : FOLD_TORN;
                if (f0->status != want || f0->good_end != pb)
                        violation(c, "WAL %s: a clean torn tail (%zu good bytes + %zu torn) folds "
                                     "%s with good_end %zu (%s)", nm, pb, C0->n - pb,
                                  fold_status_name(f0->status), f0->good_end, f0->bad_reason);
        }
        if (f0->status != FOLD_CORRUPT) {
                if (f0->good_end < pb)
                        violation(c, "WAL %s: fold %s stops at %zu before written records up to "
                                     "%zu (records dropped)", nm, fold_status_name(f0->status),
                                  f0->good_end, pb);
                if (f0->good_end > pb)
                        violation(c, "WAL %s: fold accepted bytes [%zu, %zu) that were never "
                                     "written as records", nm, pb, f0->good_end);
                /* no complete written record may hide behind the torn tail */
                size_t i = f0->good_end;
                while (i < C0->n) {
                        const unsigned char *nl = memchr(C0->p + i, '\n', C0->n - i);
                        if (!nl)
                                break;
                        size_t len = (size_t)(nl - (C0->p + i)) + 1;
                        if (is_written_line(E, C0->p + i, len)) {
                                violation(c, "WAL %s: fold says %s but a complete record at "
                                             "offset %zu is silently dropped", nm,
                                          fold_status_name(f0->status), i);
                                break;
                        }
                        i += len;
                }
        }

        /* the real recovery */
        char path[PATH_MAX * 2];
        snprintf(path, sizeof(path), "%s/%s", c->dir, x->wal_rel[W]);
        struct wal_options ro = { .io = &c->nosync, .now_ms = rec_clock, .clock_ctx = c };
        struct wal *w = NULL;
        struct wal_open_info info;
        struct bytes C1 = { 0 };
        struct fold *f1 = NULL, *f1b = NULL, *f2 = NULL, *fd = NULL;
        struct recovery *r1 = NULL, *r1b = NULL, *r2 = NULL;
        struct kbuf k1 = KBUF_INIT, k2 = KBUF_INIT;

        e = wal_open(path, &ro, &w, &info);
        if (e < 0) {
                violation(c, "WAL %s: recovery's wal_open failed: %s", nm, strerror(-e));
                goto out;
        }
        if (read_whole(path, &C1) < 0)
                die("read %s", path);
        if (f0->status == FOLD_CORRUPT) {
                c->st->quarantined++;
                bool later = false;
                for (size_t i = pb; i < C0->n && !later;) {
                        const unsigned char *nl = memchr(C0->p + i, '\n', C0->n - i);
                        if (!nl)
                                break;
                        size_t len = (size_t)(nl - (C0->p + i)) + 1;
                        /* a written record, possibly behind garbage on its line */
                        for (size_t k = i; k < i + len && !later; k++)
                                later = C0->p[k] == '{' &&
                                        is_written_line(E, C0->p + k, i + len - k);
                        i += len;
                }
                if (!later)
                        c->st->q_avoidable++;
                if (!info.corrupt || wal_state(w) != WAL_STATE_QUARANTINED)
                        violation(c, "WAL %s: corrupt (%s) but not quarantined", nm,
                                  f0->bad_reason);
                if (!b_eq(&C1, C0->p, C0->n))
                        violation(c, "WAL %s: quarantine modified the file", nm);
                e = wal_mark_reset(w, "probe_001");
                if (e != -EBADMSG)
                        violation(c, "WAL %s: quarantined WAL accepted an append (%d)", nm, e);
                if (fold_file(path, &f1) == 0 && recovery_plan_fold(f1, &r1) != -EBADMSG)
                        violation(c, "WAL %s: recovery planned a corrupt WAL", nm);
                goto out;
        }
        if (info.corrupt) {
                violation(c, "WAL %s: quarantined a %s file (%s)", nm,
                          fold_status_name(f0->status), info.bad_reason);
                goto out;
        }
        if (f0->status == FOLD_TORN && f0->good_end < C0->n) {
                c->st->repaired++;
                if (!info.torn_repaired)
                        violation(c, "WAL %s: torn tail not repaired on open", nm);
                if (!b_eq(&C1, C0->p, f0->good_end))
                        violation(c, "WAL %s: the repair left %zu bytes, expected the %zu good "
                                     "ones", nm, C1.n, f0->good_end);
        } else if (!b_eq(&C1, C0->p, C0->n)) {
                violation(c, "WAL %s: wal_open changed a clean file", nm);
        }
        if (acked > 0 && !has_prefix(&C1, E, (size_t)acked))
                violation(c, "WAL %s: acknowledged bytes lost by the repair", nm);
        const struct bytes *D = durable_of(c->M, x->wal_rel[W]);
        size_t dlen = D ? line_prefix(D->p, D->n, E) : 0;
        if (dlen && !has_prefix(&C1, E, dlen))
                violation(c, "WAL %s: durable records [0, %zu) lost by the repair", nm, dlen);

        if ((e = fold_file(path, &f1)) < 0) {
                violation(c, "WAL %s: fold_file failed: %s", nm, strerror(-e));
                goto out;
        }
        if (f1->status != FOLD_CLEAN)
                violation(c, "WAL %s: %s after wal_open (%s)", nm, fold_status_name(f1->status),
                          f1->bad_reason);
        if (f1->records != f0->records)
                violation(c, "WAL %s: %zu records after the repair, %zu before", nm, f1->records,
                          f0->records);
        if (plan_recovery(c, "first plan", f1, &r1) < 0)
                goto out;
        /* the same state twice gives the same answer */
        if (fold_file(path, &f1b) < 0 || plan_recovery(c, "second plan", f1b, &r1b) < 0)
                goto out;
        encode_recovery(f1, r1, &k1);
        encode_recovery(f1b, r1b, &k2);
        if (k1.len != k2.len || (k1.len && memcmp(k1.data, k2.data, k1.len) != 0))
                violation(c, "WAL %s: recovery planned twice on the same state differs", nm);

        /* completed stays completed; executing never becomes completed */
        for (size_t i = 0; i < r1->nplans; i++)
                for (size_t j = 0; j < r1->plans[i].ndecisions; j++) {
                        const struct recovery_decision *d = &r1->plans[i].decisions[j];
                        const struct fold_step *fs = &f1->steps[d->step];
                        if (step_completed(fs))
                                violation(c, "WAL %s: completed step %s classified %s", nm,
                                          fs->step_id, verdict_kind_name(d->verdict.kind));
                        if (!fs->post_hash && d->verdict.kind == VERDICT_ALREADY_DONE)
                                violation(c, "WAL %s: step %s (%s, no completed record) "
                                             "classified already_done", nm, fs->step_id,
                                          fs->status ? fs->status : "pending");
                }

        size_t n = recovery_record_count(r1);
        for (size_t i = 0; i < n; i++)
                if ((e = wal_append(w, recovery_record_at(r1, i))) < 0) {
                        violation(c, "WAL %s: appending recovery record %zu failed: %s", nm, i,
                                  strerror(-e));
                        goto out;
                }
        if (n && (e = wal_flush(w)) < 0) {
                violation(c, "WAL %s: flushing the recovery records failed: %s", nm,
                          strerror(-e));
                goto out;
        }
        if (n)
                c->st->recovered++;
        wal_close(w);
        w = NULL;

        /* a second start: nothing to repair, nothing more to append */
        e = wal_open(path, &ro, &w, &info);
        if (e < 0 || info.corrupt || info.torn_repaired) {
                violation(c, "WAL %s: the second open after recovery: %s%s%s", nm,
                          e < 0 ? strerror(-e) : "", info.corrupt ? "quarantined" : "",
                          info.torn_repaired ? "repaired again" : "");
                goto out;
        }
        if ((e = fold_file(path, &f2)) < 0) {
                violation(c, "WAL %s: fold after recovery failed: %s", nm, strerror(-e));
                goto out;
        }
        if (f2->status != FOLD_CLEAN || f2->records != f1->records + n)
                violation(c, "WAL %s: after recovery %s with %zu records, expected clean with %zu",
                          nm, fold_status_name(f2->status), f2->records, f1->records + n);
        if (plan_recovery(c, "plan after recovery", f2, &r2) < 0)
                goto out;
        if (recovery_record_count(r2) != 0)
                violation(c, "WAL %s: recovery is not idempotent: %zu more records after it ran",
                          nm, recovery_record_count(r2));
        for (size_t i = 0; i < f1->nsteps; i++) {
                const struct fold_step *a = &f1->steps[i];
                const struct fold_step *b = find_step(f2, a->step_id);
                if (step_completed(a) && !step_completed(b))
                        violation(c, "WAL %s: completed step %s is %s after recovery", nm,
                                  a->step_id, b && b->status ? b->status : "gone");
                if (!step_completed(a) && a->executions && step_completed(b))
                        violation(c, "WAL %s: executing step %s (no completed record) is "
                                     "completed after recovery", nm, a->step_id);
        }
        /* every step whose completed record was durable */
        if (dlen && fold_buffer((const char *)E->p, dlen, &fd) == 0)
                for (size_t i = 0; i < fd->nsteps; i++)
                        if (step_completed(&fd->steps[i]) &&
                            !step_completed(find_step(f2, fd->steps[i].step_id)))
                                violation(c, "WAL %s: step %s had a durable completed record "
                                             "but is not completed after recovery", nm,
                                          fd->steps[i].step_id);
        if (W == 0)
                rearchive(c, path, f2);
out:
        if (w)
                wal_close(w);
        b_free(&C1);
        kbuf_free(&k1);
        kbuf_free(&k2);
        recovery_free(r1);
        recovery_free(r1b);
        recovery_free(r2);
        fold_free(f0);
        fold_free(f1);
        fold_free(f1b);
        fold_free(f2);
        fold_free(fd);
}

static int gunzip(const struct bytes *in, struct bytes *out)
{
        z_stream zs;
        memset(&zs, 0, sizeof(zs));
        if (inflateInit2(&zs, 15 + 16) != Z_OK)
                return -ENOMEM;
        zs.next_in = in->p;
        zs.avail_in = (uInt)in->n;
        out->n = 0;
        int zr;
        do {
                b_reserve(out, out->n + 65536);
                zs.next_out = out->p + out->n;
                zs.avail_out = (uInt)(out->cap - out->n);
                uInt before = zs.avail_out;
                zr = inflate(&zs, Z_NO_FLUSH);
                out->n += before - zs.avail_out;
        } while (zr == Z_OK && (zs.avail_in > 0 || zs.avail_out == 0));
        bool whole = zr == Z_STREAM_END && zs.avail_in == 0;
        inflateEnd(&zs);
        return whole ? 0 : -EBADMSG;
}

static void check_files(struct checker *c)
{
        struct wl *x = c->x;
        const struct acks *a = &c->M->acks;
        for (int F = 0; F < NFILE; F++) {
                const struct sent *s = ms_find(c->S, x->file_rel[F]);
                int lo = a->file_acked[F], hi = a->file_begun[F];
                if (!s) {
                        if (lo >= 0)
                                violation(c, "%s is gone (version %d was acknowledged)",
                                          file_names[F], lo);
                        continue;
                }
                bool ok = false;
                for (int v = lo < 0 ? 0 : lo; v <= hi && !ok; v++)
                        ok = b_eq(&x->ver[F][v], s->data.p, s->data.n);
                /* The summary is written unsynced (the batch's syncfs makes it
                 * durable before the WAL goes): not yet acknowledged and with
                 * its WAL still there, any content is allowed -- kairosd
                 * ignores a summary it cannot read, and the WAL makes the
                 * next start end the mandate and write it again. */
                if (!ok && F == 1 && lo < 0 && ms_find(c->S, x->wal_rel[0]))
                        ok = true;
                if (!ok) {
                        int older = -1;
                        for (int v = 0; v < lo; v++)
                                if (b_eq(&x->ver[F][v], s->data.p, s->data.n))
                                        older = v;
                        if (older >= 0)
                                violation(c, "%s holds version %d, older than the acknowledged "
                                             "version %d", file_names[F], older, lo);
                        else
                                violation(c, "%s holds %zu bytes that are no complete version "
                                             "(acknowledged %d, begun %d)%s", file_names[F],
                                          s->data.n, lo, hi, s->data.n ? "" : ": empty");
                }
        }
        const struct sent *s = ms_find(c->S, x->arch_rel);
        if (s) {
                struct bytes out = { 0 };
                /* written unsynced, like the summary: until the batch's syncfs
                 * it may hold anything while the WAL is there (the next start
                 * archives the WAL again) */
                bool wal_kept = ms_find(c->S, x->wal_rel[0]) != NULL;
                if (!a->arch_begun)
                        violation(c, "the archive exists before wal_archive was called");
                else if ((gunzip(&s->data, &out) < 0 || !b_eq(&x->arch_payload, out.p, out.n)) &&
                         (a->arch_acked || !wal_kept))
                        violation(c, "the archive exists but does not hold the whole WAL "
                                     "(%zu bytes gzip)", s->data.n);
                b_free(&out);
        } else if (a->arch_acked) {
                violation(c, "the archive is gone although wal_archive returned");
        }
}

static void alarm_handler(int sig)
{
        (void)sig;
        static const char msg[] = "VIOLATION: recovery did not finish within 60 s (a loop?)\n";
        ssize_t r = write(2, msg, sizeof(msg) - 1);
        r = write(2, g_desc, strnlen(g_desc, sizeof(g_desc)));
        (void)r;
        _exit(3);
}

static void crash_report(void)
{
        static const char msg[] = "VIOLATION: recovery crashed in this state:\n";
        ssize_t r = write(2, msg, sizeof(msg) - 1);
        r = write(2, g_desc, strnlen(g_desc, sizeof(g_desc)));
        (void)r;
}

#ifndef CS_SANITIZED
static void fatal_handler(int sig)
{
        crash_report();
        signal(sig, SIG_DFL);
        raise(sig);
}
#endif

/* Dedup of states within one crash point. */
struct hset {
        uint64_t *v;
        size_t n, cap;
};

static bool hset_add(struct hset *h, uint64_t key)
{
        if (key == 0)
                key = 1;
        if ((h->n + 1) * 2 > h->cap) {
                size_t nc = h->cap ? h->cap * 2 : 1024;
                uint64_t *nv = calloc(nc, sizeof(*nv));
                if (!nv)
                        die("out of memory");
                for (size_t i = 0; i < h->cap; i++)
                        if (h->v[i])
                                for (size_t j = h->v[i] & (nc - 1);; j = (j + 1) & (nc - 1))
                                        if (!nv[j]) {
                                                nv[j] = h->v[i];
                                                break;
                                        }
                free(h->v);
                h->v = nv;
                h->cap = nc;
        }
        for (size_t j = key & (h->cap - 1);; j = (j + 1) & (h->cap - 1)) {
                if (h->v[j] == key)
                        return false;
                if (!h->v[j]) {
                        h->v[j] = key;
                        h->n++;
                        return true;
                }
        }
}

static void hset_clear(struct hset *h)
{
        if (h->v)
                memset(h->v, 0, h->cap * sizeof(*h->v));
        h->n = 0;
}

/* Materialize, dedup, check.  Returns true if the state was new. */
/* What kairosd's start does before recovery: each spare in wal/ settled
 * by the real wal_spare_adopt (on disk), the state's entries renamed or
 * dropped to match.  A spare holding records must be adopted under the
 * name of the mandate they are; two files for one mandate never. */
static void settle_spares(struct checker *c, struct mstate *S)
{
        char waldir[PATH_MAX * 2];
        snprintf(waldir, sizeof(waldir), "%s/state/wal", c->dir);
        const char *pre = "state/wal/";
        size_t pl = strlen(pre);
        for (size_t i = 0; i < S->n; i++) {
                struct sent *e = &S->e[i];
                if (e->dir || strncmp(e->rel, pre, pl) != 0 || !wal_spare_name(e->rel + pl))
                        continue;
                enum wal_spare_found what;
                char id[PLANNER_ID_MAX];
                int r = wal_spare_adopt(&c->nosync, waldir, e->rel + pl, &what, id, sizeof id);
                if (r < 0) {
                        violation(c, "spare %s: wal_spare_adopt failed: %s", e->rel,
                                  strerror(-r));
                        continue;
                }
                switch (what) {
                case WAL_SPARE_EMPTY:
                        if (e->data.n)
                                violation(c, "spare %s holds %zu bytes but was found empty",
                                          e->rel, e->data.n);
                        break;
                case WAL_SPARE_REMOVED:
                        c->st->spares_removed++;
                        e->rel[0] = '\0';
                        break;
                case WAL_SPARE_ADOPTED:
                        c->st->adopted++;
                        if (strcmp(id, c->x->mandate_id[2]) != 0)
                                violation(c, "spare %s adopted as %s: only gamma's WAL came "
                                             "from a spare", e->rel, id);
                        snprintf(e->rel, sizeof(e->rel), "%s%s%s", pre, id, STATEDIR_WAL_SUFFIX);
                        break;
                case WAL_SPARE_CONFLICT:
                        violation(c, "spare %s and the WAL of %s both exist: the rename made "
                                     "two files of one", e->rel, id);
                        break;
                case WAL_SPARE_UNNAMED:
                        /* bytes no record names: nothing in it was acknowledged
                         * (check_wal says so if gamma's were) */
                        break;
                case WAL_SPARE_NOT_FILE:
                        violation(c, "spare %s is no regular file", e->rel);
                        break;
                }
        }
}

static bool try_state(struct checker *c, struct mstate *S, struct hset *seen,
                      const struct choice *ch)
{
        c->ch = ch;
        c->st->attempts++;
        ms_build(S, c->M, c->P, ch);
        if (!hset_add(seen, ms_hash(S)))
                return false;
        c->S = S;
        c->state_bad = false;
        describe_state(c);
        if (c->o->verbose)
                fputs(g_desc, stderr);
        ms_write(S, c->dir);
        alarm(60);
        settle_spares(c, S);
        for (int W = 0; W < NWAL; W++)
                check_wal(c, W);
        check_files(c);
        alarm(0);
        c->st->states++;
        return true;
}

/* ------------------------------------------------------------------------ */
/* Generating the states of one crash point                                  */
/* ------------------------------------------------------------------------ */

static void random_torn(uint64_t *rs, const struct op *o, struct choice *out)
{
        if (o->len < 2) {
                out->alt = (int)rnd(rs, 3);
                out->cut = 0;
                return;
        }
        out->alt = rnd(rs, 2) ? A_TORN : A_TORN_ZERO;
        size_t first = (o->off / SECTOR + 1) * SECTOR;
        if (first < o->off + o->len && rnd(rs, 2)) {
                size_t nsec = (o->off + o->len - first + SECTOR - 1) / SECTOR;
                out->cut = first + rnd(rs, nsec) * SECTOR - o->off;
        } else {
                out->cut = 1 + rnd(rs, o->len - 1);
        }
}

static void random_choice(const struct model *M, const struct point *P, uint64_t *rs,
                          struct choice *ch)
{
        bool consistent = rnd(rs, 2);
        for (size_t i = 0; i < P->nit; i++) {
                const struct item *it = &P->it[i];
                if (it->k == IT_DIR) {
                        ch[i] = (struct choice){ (int)rnd(rs, it->nd + 1), 0 };
                        continue;
                }
                if (it->k == IT_TRUNC) {
                        ch[i] = (struct choice){ (int)rnd(rs, 2), 0 };
                        continue;
                }
                const struct op *o = &M->R->ops[it->op];
                switch (rnd(rs, 5)) {
                case 0:
                        ch[i] = (struct choice){ A_KEEP, 0 };
                        break;
                case 1:
                        ch[i] = (struct choice){ A_DROP, 0 };
                        break;
                case 2:
                        ch[i] = (struct choice){ A_ZERO, 0 };
                        break;
                default:
                        random_torn(rs, o, &ch[i]);
                        break;
                }
        }
        if (!consistent)
                return;
        /* per file: its pending writes land in order up to a cut */
        for (size_t i = 0; i < M->nn; i++) {
                int base = P->node_item[i];
                if (base < 0)
                        continue;
                size_t np = M->n[i].npend;
                size_t cut = rnd(rs, np + 1);
                bool zero_tail = rnd(rs, 4) == 0;
                for (size_t j = 0; j < np; j++) {
                        struct choice *c = &ch[base + (int)j];
                        const struct item *it = &P->it[base + (int)j];
                        if (it->k == IT_TRUNC)
                                c->alt = j < cut ? 0 : 1;
                        else if (j < cut)
                                *c = (struct choice){ A_KEEP, 0 };
                        else if (j > cut)
                                *c = (struct choice){ zero_tail ? A_ZERO : A_DROP, 0 };
                        else if (rnd(rs, 3))
                                random_torn(rs, &M->R->ops[it->op], c);
                }
        }
}

static void extreme_choice(const struct point *P, bool all, struct choice *ch)
{
        for (size_t i = 0; i < P->nit; i++) {
                const struct item *it = &P->it[i];
                if (it->k == IT_DIR)
                        ch[i] = (struct choice){ all ? (int)it->nd : 0, 0 };
                else if (it->k == IT_TRUNC)
                        ch[i] = (struct choice){ all ? 0 : 1, 0 };
                else
                        ch[i] = (struct choice){ all ? A_KEEP : A_DROP, 0 };
        }
}

static void gen_sampled(struct checker *c, struct mstate *S, struct hset *seen, uint64_t quota,
                        uint64_t *rs)
{
        const struct point *P = c->P;
        struct choice *ch = xmalloc((P->nit + 1) * sizeof(*ch));
        uint64_t got = 0, tries = 0;
        for (int e = 0; e < 2 && got < quota; e++) {
                extreme_choice(P, e == 0, ch);
                got += try_state(c, S, seen, ch);
        }
        while (got < quota && tries++ < 8 * quota + 16) {
                random_choice(c->M, P, rs, ch);
                got += try_state(c, S, seen, ch);
        }
        free(ch);
}

static void gen_exhaustive(struct checker *c, struct mstate *S, struct hset *seen, uint64_t *rs)
{
        const struct point *P = c->P;
        const struct model *M = c->M;
        size_t nit = P->nit;
        struct choice *ch = xmalloc((nit + 1) * sizeof(*ch));
        struct choice (*alts)[MAX_ALTS] = xmalloc((nit + 1) * sizeof(*alts));
        size_t *na = xmalloc((nit + 1) * sizeof(*na));
        size_t *idx = calloc(nit + 1, sizeof(*idx));
        if (!idx)
                die("out of memory");
        double space = 1;
        for (size_t i = 0; i < nit; i++) {
                na[i] = coarse_alts(M, &P->it[i], alts[i], MAX_ALTS);
                space *= (double)na[i];
        }
        if (space <= EXHAUSTIVE_CAP) {
                for (;;) {
                        for (size_t i = 0; i < nit; i++)
                                ch[i] = alts[i][idx[i]];
                        try_state(c, S, seen, ch);
                        size_t i = 0;
                        while (i < nit && ++idx[i] == na[i])
                                idx[i++] = 0;
                        if (i == nit)
                                break;
                }
        } else {
                fprintf(stderr, "crash point %zu: %.0f combinations, sampling %.0f\n", P->k,
                        space, EXHAUSTIVE_CAP);
                for (uint64_t t = 0; t < (uint64_t)EXHAUSTIVE_CAP; t++) {
                        for (size_t i = 0; i < nit; i++)
                                ch[i] = alts[i][rnd(rs, na[i])];
                        try_state(c, S, seen, ch);
                }
        }
        /* every byte: one write torn anywhere, the earlier ones of its file
         * landed, the later ones not, everything else as it happened */
        for (size_t i = 0; i < nit; i++) {
                if (P->it[i].k != IT_WRITE)
                        continue;
                const struct op *o = &M->R->ops[P->it[i].op];
                for (size_t cut = 1; cut < o->len; cut++)
                        for (int z = 0; z < 2; z++) {
                                extreme_choice(P, true, ch);
                                for (size_t j = i + 1; j < nit; j++)
                                        if (P->it[j].node == P->it[i].node &&
                                            P->it[j].k != IT_DIR)
                                                ch[j] = (struct choice){ P->it[j].k == IT_TRUNC
                                                                                 ? 1
                                                                                 : A_DROP,
                                                                         0 };
                                ch[i] = (struct choice){ z ? A_TORN_ZERO : A_TORN, cut };
                                try_state(c, S, seen, ch);
                        }
        }
        free(idx);
        free(na);
        free(alts);
        free(ch);
}

struct run_result {
        struct stats st;
        unsigned driver_violations;
        size_t ops, points;
        double secs;
};

static void run_one(const struct opts *o, bool exhaustive, const char *run, const char *wlbase,
                    const char *tmpbase, int fail_sync,
                    int fail_dirsync, int fail_write, uint64_t target, struct run_result *res,
                    int *nsync, int *ndirsync, int *nwrite, bool *injected)
{
        double t0 = now_s();
        char root[PATH_MAX], sdir[PATH_MAX];
        snprintf(root, sizeof(root), "%s/workload", wlbase);
        snprintf(sdir, sizeof(sdir), "%s/state", tmpbase);
        rm_rf(root);
        if (mkdir(root, 0700) < 0)
                die("mkdir %s: %s", root, strerror(errno));

        struct rec R;
        rec_init(&R, root);
        R.fail_sync_at = fail_sync;
        R.fail_dirsync_at = fail_dirsync;
        R.fail_write_at = fail_write;
        struct wl x;
        wl_init(&x, &R, root, run);
        run_workload(&x);
        *nsync = R.nsync;
        *ndirsync = R.ndirsync;
        *nwrite = R.nwrite;
        *injected = R.injected;
        memset(res, 0, sizeof(*res));
        res->driver_violations = x.violations;
        res->ops = R.nops;

        /* crash points: before every mutating operation, and at the end; a
         * variant's log equals the main run's up to its injected failure, so
         * only the points after it are new */
        size_t first = 0;
        if (fail_sync || fail_dirsync || fail_write)
                for (first = 0; first < R.nops; first++)
                        if (R.ops[first].k == K_SYNCFAIL || R.ops[first].k == K_WRITEFAIL ||
                            R.ops[first].k == K_DIRSYNCFAIL)
                                break;
        size_t npts = 0;
        size_t *pts = xmalloc((R.nops + 1) * sizeof(*pts));
        for (size_t i = first; i < R.nops; i++)
                if (op_mutates(&R.ops[i]))
                        pts[npts++] = i;
        pts[npts++] = R.nops;
        res->points = npts;

        /* pass 1: the size of every point's space, to share the quota */
        double *space = xmalloc(npts * sizeof(*space));
        uint64_t *quota = xmalloc(npts * sizeof(*quota));
        struct model M;
        struct point P = { 0 };
        model_init(&M, &R);
        for (size_t p = 0; p < npts; p++) {
                while (M.at < pts[p])
                        model_step(&M);
                point_build(&P, &M);
                space[p] = point_space(&M, &P, true);
        }
        model_free(&M);
        {
                size_t *order = xmalloc(npts * sizeof(*order));
                for (size_t i = 0; i < npts; i++)
                        order[i] = i;
                for (size_t i = 1; i < npts; i++)
                        for (size_t j = i; j > 0 && space[order[j]] < space[order[j - 1]]; j--) {
                                size_t t = order[j];
                                order[j] = order[j - 1];
                                order[j - 1] = t;
                        }
                uint64_t left = target;
                for (size_t i = 0; i < npts; i++) {
                        size_t p = order[i];
                        uint64_t share = (left + (npts - i) - 1) / (npts - i);
                        uint64_t q = space[p] < (double)share ? (uint64_t)space[p] : share;
                        if (q < 1)
                                q = 1;
                        quota[p] = q;
                        left = left > q ? left - q : 0;
                }
                free(order);
        }

        /* pass 2: generate and check */
        struct checker c = { 0 };
        c.o = o;
        c.run = run;
        c.x = &x;
        c.st = &res->st;
        snprintf(c.dir, sizeof(c.dir), "%s", sdir);
        c.nosync = *kio_posix();
        c.nosync.fdatasync = ns_sync;
        c.nosync.fsync = ns_sync;
        c.nosync.fsync_dir = ns_sync_dir;
        c.clock = 1776690000000LL;
        struct mstate S = { 0 };
        struct hset seen = { 0 };
        uint64_t carry = 0;
        model_init(&M, &R);
        c.M = &M;
        c.P = &P;
        for (size_t p = 0; p < npts; p++) {
                while (M.at < pts[p])
                        model_step(&M);
                if (o->point >= 0 && (size_t)o->point != pts[p])
                        continue;
                point_build(&P, &M);
                hset_clear(&seen);
                uint64_t rs = o->seed ^ (0x9e3779b97f4a7c15ULL * (pts[p] + 1)) ^
                              ((uint64_t)(fail_sync * 7919 + fail_dirsync * 104729 +
                                          fail_write * 1299709) << 20);
                uint64_t before = res->st.states;
                if (exhaustive) {
                        gen_exhaustive(&c, &S, &seen, &rs);
                        if (!o->quiet)
                                printf("  point %zu/%zu (before op #%zu, %zu choices): %" PRIu64
                                       " states, %" PRIu64 " so far, %" PRIu64
                                       " violations, %.0f s\n",
                                       p + 1, npts, pts[p], P.nit, res->st.states - before,
                                       res->st.states, res->st.violations, now_s() - t0);
                } else {
                        /* a point with fewer distinct states than its share
                         * passes the rest on */
                        uint64_t q = quota[p] + carry;
                        gen_sampled(&c, &S, &seen, q, &rs);
                        uint64_t got = res->st.states - before;
                        carry = got < q ? q - got : 0;
                }
        }
        model_free(&M);
        point_free(&P);
        ms_free(&S);
        free(seen.v);
        free(space);
        free(quota);
        free(pts);
        rm_rf(sdir);
        rm_rf(root);
        wl_free(&x);
        rec_free(&R);
        res->secs = now_s() - t0;
}

static uint64_t env_u64(const char *name, uint64_t def)
{
        const char *v = getenv(name);
        if (!v || !*v)
                return def;
        char *end;
        errno = 0;
        unsigned long long n = strtoull(v, &end, 0);
        if (errno || *end)
                die("%s: not a number: %s", name, v);
        return n;
}

static void usage(void)
{
        fputs("usage: crash_states [--exhaustive] [--seed S] [--states N] [--point K]\n"
              "                    [--no-variants] [--variant K:N] [--verbose] [--quiet]\n"
              "  --states N     crash states of the main run (sampled mode; default 6000,\n"
              "                 or KAIROS_CRASH_STATES)\n"
              "  --exhaustive   every combination of every crash point (capped at 200000 per\n"
              "                 point, sampled beyond) plus every byte of every torn write\n"
              "  --seed S       the sampling seed (default: KAIROS_CRASH_SEED or 1)\n"
              "  --point K      only the crash point before operation K\n"
              "  --no-variants  skip the injected-failure variants\n"
              "  --variant K:N  only the variant whose N-th call of K fails\n"
              "                 (K = fdatasync, dirsync or write), with the whole budget\n",
              stderr);
        exit(64);
}

static void add_stats(struct stats *a, const struct stats *b)
{
        a->states += b->states;
        a->violations += b->violations;
        a->bad_states += b->bad_states;
        a->quarantined += b->quarantined;
        a->adopted += b->adopted;
        a->spares_removed += b->spares_removed;
        a->q_avoidable += b->q_avoidable;
        a->repaired += b->repaired;
        a->recovered += b->recovered;
        a->absent += b->absent;
        a->rearchived += b->rearchived;
        a->attempts += b->attempts;
}

int main(int argc, char **argv)
{
        struct opts o = {
                .seed = env_u64("KAIROS_CRASH_SEED", 1),
                .states = env_u64("KAIROS_CRASH_STATES", 6000),
                .variants = true,
                .point = -1,
        };
        for (int i = 1; i < argc; i++) {
                const char *a = argv[i];
                if (!strcmp(a, "--exhaustive"))
                        o.exhaustive = true;
                else if (!strcmp(a, "--no-variants"))
                        o.variants = false;
                else if (!strcmp(a, "--verbose"))
                        o.verbose = true;
                else if (!strcmp(a, "--quiet"))
                        o.quiet = true;
                else if (!strcmp(a, "--seed") && i + 1 < argc)
                        o.seed = strtoull(argv[++i], NULL, 0);
                else if (!strcmp(a, "--states") && i + 1 < argc)
                        o.states = strtoull(argv[++i], NULL, 0);
                else if (!strcmp(a, "--point") && i + 1 < argc)
                        o.point = strtol(argv[++i], NULL, 0);
                else if (!strcmp(a, "--variant") && i + 1 < argc) {
                        const char *v = argv[++i];
                        const char *colon = strchr(v, ':');
                        if (!colon)
                                usage();
                        size_t kl = (size_t)(colon - v);
                        o.only_kind = !strncmp(v, "fdatasync", kl) && kl == 9 ? 1
                                      : !strncmp(v, "dirsync", kl) && kl == 7 ? 2
                                      : !strncmp(v, "write", kl) && kl == 5   ? 3
                                                                              : 0;
                        o.only_n = atoi(colon + 1);
                        if (!o.only_kind || o.only_n < 1)
                                usage();
                }
                else
                        usage();
        }
        setvbuf(stdout, NULL, _IOLBF, 0);
        signal(SIGALRM, alarm_handler);
#ifdef CS_SANITIZED
        __sanitizer_set_death_callback(crash_report);
#else
        signal(SIGSEGV, fatal_handler);
        signal(SIGBUS, fatal_handler);
        signal(SIGABRT, fatal_handler);
        signal(SIGFPE, fatal_handler);
#endif
        /* The main workload runs on TMPDIR (a real file system, real syncs);
         * the states and the variants' workloads on a tmpfs when there is one
         * (thousands of small trees; their syncs prove nothing). */
        const char *tmp = getenv("TMPDIR");
        const char *fast = getenv("KAIROS_CRASH_TMPDIR");
        struct stat fst;
        if (!fast || !*fast)
                fast = stat("/dev/shm", &fst) == 0 && S_ISDIR(fst.st_mode) &&
                                       access("/dev/shm", W_OK | X_OK) == 0
                               ? "/dev/shm"
                               : (tmp && *tmp ? tmp : "/tmp");
        char base[PATH_MAX], sbase[PATH_MAX];
        snprintf(base, sizeof(base), "%s/kairos-crash-states-wl-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        snprintf(sbase, sizeof(sbase), "%s/kairos-crash-states-XXXXXX", fast);
        if (!mkdtemp(base) || !mkdtemp(sbase))
                die("mkdtemp: %s", strerror(errno));

        double t0 = now_s();
        struct stats total = { 0 };
        unsigned driver = 0;
        struct run_result res;
        int nsync, ndirsync, nwrite;
        bool inj;
        printf("crash_states: seed %" PRIu64 ", %s\n", o.seed,
               o.exhaustive ? "exhaustive" : "sampled");
        if (o.only_kind) {
                /* one variant only, with the whole budget (a reproducer) */
                char name[64];
                snprintf(name, sizeof(name), "variant %d:%d", o.only_kind, o.only_n);
                run_one(&o, o.exhaustive, name, sbase, sbase, o.only_kind == 1 ? o.only_n : 0,
                        o.only_kind == 2 ? o.only_n : 0, o.only_kind == 3 ? o.only_n : 0,
                        o.states, &res, &nsync, &ndirsync, &nwrite, &inj);
                rm_rf(base);
                rm_rf(sbase);
                printf("crash states: %" PRIu64 " checked, %" PRIu64 " violations (%.1f s)\n",
                       res.st.states, res.st.violations + res.driver_violations, now_s() - t0);
                return res.st.violations + res.driver_violations || !inj ? 1 : 0;
        }
        run_one(&o, o.exhaustive, "main", base, sbase, 0, 0, 0, o.states, &res, &nsync, &ndirsync, &nwrite, &inj);
        add_stats(&total, &res.st);
        driver += res.driver_violations;
        printf("main run: %zu operations (%d file syncs, %d dir syncs, %d writes), %zu crash "
               "points, %" PRIu64 " states, %" PRIu64 " violations, %.1f s\n",
               res.ops, nsync, ndirsync, nwrite, res.points, res.st.states, res.st.violations,
               res.secs);
        uint64_t main_states = res.st.states;

        if (o.variants) {
                /* one injected failure per run, for every n */
                uint64_t per = o.exhaustive ? 5000 : o.states / 100 < 20 ? 20 : o.states / 100;
                int counts[3] = { nsync, ndirsync, nwrite };
                static const char *const kinds[3] = { "fdatasync", "dir fsync", "write" };
                for (int kind = 0; kind < 3; kind++) {
                        struct stats vs = { 0 };
                        unsigned vd = 0;
                        double vt = now_s();
                        int runs = 0;
                        for (int n = 1; n <= counts[kind]; n++) {
                                char name[64];
                                snprintf(name, sizeof(name), "fail %s #%d", kinds[kind], n);
                                int a, b, d;
                                run_one(&o, false, name, sbase, sbase, kind == 0 ? n : 0, kind == 1 ? n : 0,
                                        kind == 2 ? n : 0, per, &res, &a, &b, &d, &inj);
                                if (!inj)
                                        die("%s: the failure was never injected", name);
                                add_stats(&vs, &res.st);
                                vd += res.driver_violations;
                                runs++;
                        }
                        printf("variants fail-%s: %d runs, %" PRIu64 " states, %" PRIu64
                               " violations (+%u in the workload), %.1f s\n",
                               kinds[kind], runs, vs.states, vs.violations, vd, now_s() - vt);
                        add_stats(&total, &vs);
                        driver += vd;
                }
        }
        rm_rf(base);
        rm_rf(sbase);

        printf("quarantined WALs: %" PRIu64 " (%" PRIu64 " with no complete record after the "
               "bad bytes), torn tails repaired: %" PRIu64
               ", WALs recovery appended to: %" PRIu64 ", absent WALs: %" PRIu64
               ", finished WALs archived again: %" PRIu64 "\n",
               total.quarantined, total.q_avoidable, total.repaired, total.recovered, total.absent,
               total.rearchived);
        printf("spares holding records adopted: %" PRIu64 ", spares with no whole record "
               "removed: %" PRIu64 "\n", total.adopted, total.spares_removed);
        printf("crash states: %" PRIu64 " checked, %" PRIu64 " violations (%.1f s)\n",
               total.states, total.violations + driver, now_s() - t0);
        if (total.violations + driver)
                return 1;
        if (o.point < 0 && !o.exhaustive && main_states < 5000 && o.states >= 5000) {
                fprintf(stderr, "crash_states: only %" PRIu64 " distinct states in the main run\n",
                        main_states);
                return 1;
        }
        return 0;
}
