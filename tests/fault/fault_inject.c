/* SPDX-License-Identifier: MIT */
/* fault_inject: an LD_PRELOAD shim that makes the real kairosd see disk
 * errors (issue 8, part 2).  It wraps the calls the daemon makes on its WAL
 * and state files (open/openat/creat, write/pwrite, fdatasync, fsync, rename,
 * renameat, renameat2, unlink, ftruncate) and, driven by the environment, fails the N-th
 * call of one kind on a file whose path matches:
 *
 *   KAIROS_FAULT="OP:N:KIND[:sticky][,OP:N:KIND...]"
 *       OP    open | write | fdatasync | fsync | rename | unlink | ftruncate
 *       N     the N-th matching call of OP (1-based, counted over the process)
 *       KIND  eio | enospc | eintr        fail with that errno, nothing done
 *             short                        write half the bytes, then the next
 *                                          write on that fd fails with ENOSPC
 *             partial                      write half the bytes (a legal short
 *                                          write; the next write goes through)
 *       sticky   every matching call of OP from the N-th on fails (a disk
 *                that stays broken); default: only the N-th
 *   KAIROS_FAULT_PATH  a substring: only files whose path contains it are
 *       counted and failed.  A directory fd counts too when it is opened, in
 *       the same thread, for the directory of the last matching path (the
 *       "fsync the parent after create/rename/unlink" pattern).  Without it
 *       nothing matches.  Sockets, pipes, stderr and every fd the shim did not
 *       see opened are never touched.
 *   KAIROS_FAULT_LOG   if set, a file that gets one line per matching call:
 *       "call OP N PATH ok|errno" and "inject OP N KIND PATH synced=S" (S =
 *       successful fdatasync/fsync calls on matching files before it).
 *
 * Every injection is also reported on stderr ("<4>kairos-fault: injected
 * ..."), so a test sees it in order with the daemon's own log lines. */
/* This file defines open and open64, pwrite and pwrite64, ... each under its
 * own name: no redirection of the plain names to the 64-bit ones. */
#undef _FILE_OFFSET_BITS
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

/* The shim's own entry points (its public ABI is libc's). */
int open(const char *path, int flags, ...);
int open64(const char *path, int flags, ...);
int openat(int dfd, const char *path, int flags, ...);
int openat64(int dfd, const char *path, int flags, ...);
int creat(const char *path, mode_t mode);
int creat64(const char *path, mode_t mode);
int close(int fd);
ssize_t write(int fd, const void *buf, size_t n);
ssize_t pwrite(int fd, const void *buf, size_t n, off_t off);
ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off);
int fdatasync(int fd);
int fsync(int fd);
int rename(const char *from, const char *to);
int renameat(int fdfrom, const char *from, int fdto, const char *to);
int renameat2(int fdfrom, const char *from, int fdto, const char *to, unsigned flags);
int unlink(const char *path);
int ftruncate(int fd, off_t len);
int ftruncate64(int fd, off_t len);

enum op { OP_OPEN, OP_WRITE, OP_FDATASYNC, OP_FSYNC, OP_RENAME, OP_UNLINK, OP_FTRUNCATE, OP__MAX };
static const char *const op_names[OP__MAX] = { "open",   "write",  "fdatasync", "fsync",
                                               "rename", "unlink", "ftruncate" };

enum kind { K_NONE, K_EIO, K_ENOSPC, K_EINTR, K_SHORT, K_PARTIAL };
static const char *const kind_names[] = { "none", "eio", "enospc", "eintr", "short", "partial" };

#define MAX_RULES 16
#define MAX_FDS 4096

struct rule {
        enum op op;
        unsigned long n;
        enum kind kind;
        bool sticky;
};

struct tracked {
        bool on;
        bool short_pending; /* the next write fails with ENOSPC */
        dev_t dev;
        ino_t ino;
        char *path;
};

static struct {
        pthread_once_t once;
        pthread_mutex_t lock;
        struct rule rules[MAX_RULES];
        size_t nrules;
        char *match;
        int log_fd;
        unsigned long count[OP__MAX];
        unsigned long synced;
        unsigned long injected;
        struct tracked fds[MAX_FDS];
        int (*open)(const char *, int, ...);
        int (*openat)(int, const char *, int, ...);
        int (*close)(int);
        ssize_t (*write)(int, const void *, size_t);
        ssize_t (*pwrite)(int, const void *, size_t, off_t);
        int (*fdatasync)(int);
        int (*fsync)(int);
        int (*rename)(const char *, const char *);
        int (*renameat)(int, const char *, int, const char *);
        int (*renameat2)(int, const char *, int, const char *, unsigned);
        int (*unlink)(const char *);
        int (*ftruncate)(int, off_t);
} S = { .once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER, .log_fd = -1 };

/* The directory of the last matching path this thread touched. */
static _Thread_local char last_dir[4096];

/* ---- set-up ---------------------------------------------------------------- */

static void raw_puts(int fd, const char *s)
{
        size_t n = strlen(s);
        while (n > 0) {
                long w = syscall(SYS_write, fd, s, n);
                if (w < 0 && errno == EINTR)
                        continue;
                if (w <= 0)
                        return;
                s += w;
                n -= (size_t)w;
        }
}

static void die(const char *what)
{
        raw_puts(2, "kairos-fault: bad KAIROS_FAULT: ");
        raw_puts(2, what);
        raw_puts(2, "\n");
        _exit(70);
}

static int parse_op(const char *s, size_t len)
{
        for (int i = 0; i < OP__MAX; i++)
                if (strlen(op_names[i]) == len && strncasecmp(s, op_names[i], len) == 0)
                        return i;
        return -1;
}

static int parse_kind(const char *s, size_t len)
{
        for (int i = K_EIO; i <= K_PARTIAL; i++)
                if (strlen(kind_names[i]) == len && strncasecmp(s, kind_names[i], len) == 0)
                        return i;
        return -1;
}

static void parse_rule(char *spec)
{
        if (S.nrules == MAX_RULES)
                die("too many rules");
        char *f[4] = { NULL };
        size_t nf = 0;
        for (char *save = NULL, *t = strtok_r(spec, ":", &save); t;
             t = strtok_r(NULL, ":", &save)) {
                if (nf == 4)
                        die(spec);
                f[nf++] = t;
        }
        if (nf < 3)
                die("want OP:N:KIND");
        int op = parse_op(f[0], strlen(f[0]));
        int kind = parse_kind(f[2], strlen(f[2]));
        char *end;
        unsigned long n = strtoul(f[1], &end, 10);
        if (op < 0 || kind < 0 || *end || n == 0)
                die(f[0]);
        if ((kind == K_SHORT || kind == K_PARTIAL) && op != OP_WRITE)
                die("short/partial only for write");
        if (nf == 4 && strcmp(f[3], "sticky") != 0)
                die(f[3]);
        S.rules[S.nrules++] = (struct rule){ (enum op)op, n, (enum kind)kind, nf == 4 };
}

static void *next_sym(const char *name)
{
        void *p = dlsym(RTLD_NEXT, name);
        if (!p) {
                raw_puts(2, "kairos-fault: no next symbol ");
                raw_puts(2, name);
                raw_puts(2, "\n");
                _exit(70);
        }
        return p;
}

static void init(void)
{
        S.open = next_sym("open64");
        S.openat = next_sym("openat64");
        S.close = next_sym("close");
        S.write = next_sym("write");
        S.pwrite = next_sym("pwrite64");
        S.fdatasync = next_sym("fdatasync");
        S.fsync = next_sym("fsync");
        S.rename = next_sym("rename");
        S.renameat = next_sym("renameat");
        S.renameat2 = next_sym("renameat2");
        S.unlink = next_sym("unlink");
        S.ftruncate = next_sym("ftruncate64");

        const char *m = getenv("KAIROS_FAULT_PATH");
        if (m && *m)
                S.match = strdup(m);
        const char *spec = getenv("KAIROS_FAULT");
        if (spec && *spec) {
                char *copy = strdup(spec);
                char *save = NULL;
                for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
                        parse_rule(t);
                free(copy);
        }
        const char *log = getenv("KAIROS_FAULT_LOG");
        if (log && *log)
                S.log_fd = (int)syscall(SYS_openat, AT_FDCWD, log,
                                        O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
}

static void ensure_init(void)
{
        pthread_once(&S.once, init);
}

/* ---- matching -------------------------------------------------------------- */

static void remember_dir(const char *path)
{
        const char *slash = strrchr(path, '/');
        size_t n = slash ? (size_t)(slash - path) : 0;
        if (n >= sizeof last_dir)
                n = 0;
        memcpy(last_dir, path, n);
        last_dir[n] = '\0';
}

/* Does a path call concern the mandate's files?  A directory matches only
 * as the very next path call after a matching one in the same thread (the
 * daemon's worker threads serve every mandate: a later fsync of wal/ may be
 * another mandate's). */
static bool path_matches(const char *path, bool is_dir)
{
        if (!S.match || !path)
                return false;
        if (strstr(path, S.match)) {
                if (is_dir)
                        last_dir[0] = '\0';
                else
                        remember_dir(path);
                return true;
        }
        bool parent = is_dir && last_dir[0] && strcmp(path, last_dir) == 0;
        last_dir[0] = '\0';
        return parent;
}

/* Is fd a tracked file (still the one that was opened)?  Caller holds the lock. */
static struct tracked *tracked_locked(int fd)
{
        if (fd < 0 || fd >= MAX_FDS || !S.fds[fd].on)
                return NULL;
        struct tracked *t = &S.fds[fd];
        struct stat st;
        if (fstat(fd, &st) < 0 || st.st_dev != t->dev || st.st_ino != t->ino) {
                /* closed behind our back and reused: not ours any more */
                free(t->path);
                memset(t, 0, sizeof(*t));
                return NULL;
        }
        return t;
}

static void track(int fd, const char *path)
{
        struct stat st;
        if (fd < 0 || fd >= MAX_FDS || fstat(fd, &st) < 0)
                return;
        pthread_mutex_lock(&S.lock);
        struct tracked *t = &S.fds[fd];
        free(t->path);
        *t = (struct tracked){ .on = true, .dev = st.st_dev, .ino = st.st_ino,
                               .path = strdup(path) };
        pthread_mutex_unlock(&S.lock);
}

static void untrack(int fd)
{
        if (fd < 0 || fd >= MAX_FDS)
                return;
        pthread_mutex_lock(&S.lock);
        if (S.fds[fd].on) {
                free(S.fds[fd].path);
                memset(&S.fds[fd], 0, sizeof(S.fds[fd]));
        }
        pthread_mutex_unlock(&S.lock);
}

/* ---- the decision ---------------------------------------------------------- */

static void logf_locked(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_locked(const char *fmt, ...)
{
        if (S.log_fd < 0)
                return;
        char buf[4608];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
        raw_puts(S.log_fd, buf);
}

/* Count a matching call of op on path; return the fault to inject (K_NONE
 * for none) and the call's number in *nth.  Caller holds the lock. */
static enum kind decide_locked(enum op op, const char *path, unsigned long *nth)
{
        unsigned long n = ++S.count[op];
        *nth = n;
        for (size_t i = 0; i < S.nrules; i++) {
                const struct rule *r = &S.rules[i];
                if (r->op == op && (n == r->n || (r->sticky && n > r->n))) {
                        S.injected++;
                        logf_locked("inject %s %lu %s %s synced=%lu\n", op_names[op], n,
                                    kind_names[r->kind], path, S.synced);
                        char msg[4608];
                        snprintf(msg, sizeof msg,
                                 "<4>kairos-fault: injected %s into %s #%lu on %s\n",
                                 kind_names[r->kind], op_names[op], n, path);
                        raw_puts(2, msg);
                        return r->kind;
                }
        }
        return K_NONE;
}

static int kind_errno(enum kind k)
{
        switch (k) {
        case K_ENOSPC:
        case K_SHORT:
                return ENOSPC;
        case K_EINTR:
                return EINTR;
        default:
                return EIO;
        }
}

static void log_result_locked(enum op op, unsigned long n, const char *path, long rc, int err)
{
        if (rc < 0)
                logf_locked("call %s %lu %s %s\n", op_names[op], n, path, strerrorname_np(err));
        else
                logf_locked("call %s %lu %s ok\n", op_names[op], n, path);
}

/* A path call (open, rename, unlink): count, maybe fail, else run it. */
#define PATH_CALL(OP, PATH, IS_DIR, EXPR)                                                  \
        do {                                                                               \
                ensure_init();                                                             \
                if (!path_matches((PATH), (IS_DIR)))                                       \
                        return (EXPR);                                                     \
                pthread_mutex_lock(&S.lock);                                               \
                unsigned long nth_;                                                        \
                enum kind k_ = decide_locked((OP), (PATH), &nth_);                         \
                pthread_mutex_unlock(&S.lock);                                             \
                if (k_ != K_NONE) {                                                        \
                        errno = kind_errno(k_);                                            \
                        return -1;                                                         \
                }                                                                          \
                long rc_ = (long)(EXPR);                                                   \
                int e_ = errno;                                                            \
                pthread_mutex_lock(&S.lock);                                               \
                log_result_locked((OP), nth_, (PATH), rc_, e_);                            \
                pthread_mutex_unlock(&S.lock);                                             \
                errno = e_;                                                                \
                return rc_;                                                                \
        } while (0)

/* ---- open ------------------------------------------------------------------ */

static int do_open(int dfd, const char *path, int flags, mode_t mode)
{
        ensure_init();
        bool is_dir = (flags & O_DIRECTORY) != 0;
        int fd;
        if (!path_matches(path, is_dir))
                return dfd == AT_FDCWD ? S.open(path, flags, mode)
                                       : S.openat(dfd, path, flags, mode);
        pthread_mutex_lock(&S.lock);
        unsigned long nth;
        enum kind k = decide_locked(OP_OPEN, path, &nth);
        pthread_mutex_unlock(&S.lock);
        if (k != K_NONE) {
                errno = kind_errno(k);
                return -1;
        }
        fd = dfd == AT_FDCWD ? S.open(path, flags, mode) : S.openat(dfd, path, flags, mode);
        int e = errno;
        if (fd >= 0)
                track(fd, path);
        pthread_mutex_lock(&S.lock);
        log_result_locked(OP_OPEN, nth, path, fd, e);
        pthread_mutex_unlock(&S.lock);
        errno = e;
        return fd;
}

static mode_t mode_arg(int flags, va_list ap)
{
        return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int)
                                                                       : 0;
}

int open(const char *path, int flags, ...)
{
        va_list ap;
        va_start(ap, flags);
        mode_t mode = mode_arg(flags, ap);
        va_end(ap);
        return do_open(AT_FDCWD, path, flags, mode);
}

int open64(const char *path, int flags, ...)
{
        va_list ap;
        va_start(ap, flags);
        mode_t mode = mode_arg(flags, ap);
        va_end(ap);
        return do_open(AT_FDCWD, path, flags, mode);
}

int openat(int dfd, const char *path, int flags, ...)
{
        va_list ap;
        va_start(ap, flags);
        mode_t mode = mode_arg(flags, ap);
        va_end(ap);
        return do_open(dfd, path, flags, mode);
}

int openat64(int dfd, const char *path, int flags, ...)
{
        va_list ap;
        va_start(ap, flags);
        mode_t mode = mode_arg(flags, ap);
        va_end(ap);
        return do_open(dfd, path, flags, mode);
}

int creat(const char *path, mode_t mode)
{
        return do_open(AT_FDCWD, path, O_WRONLY | O_CREAT | O_TRUNC, mode);
}

int creat64(const char *path, mode_t mode)
{
        return do_open(AT_FDCWD, path, O_WRONLY | O_CREAT | O_TRUNC, mode);
}

int close(int fd)
{
        ensure_init();
        untrack(fd);
        return S.close(fd);
}

/* ---- fd calls -------------------------------------------------------------- */

static ssize_t do_write(int fd, const void *buf, size_t n, off_t off, bool positional)
{
        ensure_init();
#define REAL_WRITE(LEN) (positional ? S.pwrite(fd, buf, (LEN), off) : S.write(fd, buf, (LEN)))
        if (fd < 0 || fd >= MAX_FDS || !S.fds[fd].on)
                return REAL_WRITE(n);
        pthread_mutex_lock(&S.lock);
        struct tracked *t = tracked_locked(fd);
        if (!t) {
                pthread_mutex_unlock(&S.lock);
                return REAL_WRITE(n);
        }
        char path[4096];
        snprintf(path, sizeof path, "%s", t->path ? t->path : "?");
        unsigned long nth;
        enum kind k = decide_locked(OP_WRITE, path, &nth);
        if (k == K_NONE && t->short_pending) {
                /* the write after a short one: the disk is full */
                t->short_pending = false;
                logf_locked("inject write %lu enospc-after-short %s synced=%lu\n", nth, path,
                            S.synced);
                pthread_mutex_unlock(&S.lock);
                errno = ENOSPC;
                return -1;
        }
        if (k == K_SHORT)
                t->short_pending = true;
        pthread_mutex_unlock(&S.lock);

        if (k == K_EIO || k == K_ENOSPC || k == K_EINTR) {
                errno = kind_errno(k);
                return -1;
        }
        size_t len = n;
        if (k == K_SHORT || k == K_PARTIAL) {
                if (n < 2) {
                        errno = ENOSPC;
                        return -1;
                }
                len = n / 2;
        }
        ssize_t rc = REAL_WRITE(len);
        int e = errno;
        pthread_mutex_lock(&S.lock);
        log_result_locked(OP_WRITE, nth, path, rc, e);
        pthread_mutex_unlock(&S.lock);
        errno = e;
        return rc;
#undef REAL_WRITE
}

ssize_t write(int fd, const void *buf, size_t n)
{
        return do_write(fd, buf, n, 0, false);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
        return do_write(fd, buf, n, off, true);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off)
{
        return do_write(fd, buf, n, off, true);
}

/* fdatasync, fsync, ftruncate: count, maybe fail, else run. */
static long fd_call(enum op op, int fd, off_t len)
{
        ensure_init();
#define REAL_CALL()                                                                        \
        (op == OP_FDATASYNC ? S.fdatasync(fd)                                              \
         : op == OP_FSYNC   ? S.fsync(fd)                                                  \
                            : S.ftruncate(fd, len))
        if (fd < 0 || fd >= MAX_FDS || !S.fds[fd].on)
                return REAL_CALL();
        pthread_mutex_lock(&S.lock);
        struct tracked *t = tracked_locked(fd);
        if (!t) {
                pthread_mutex_unlock(&S.lock);
                return REAL_CALL();
        }
        char path[4096];
        snprintf(path, sizeof path, "%s", t->path ? t->path : "?");
        unsigned long nth;
        enum kind k = decide_locked(op, path, &nth);
        pthread_mutex_unlock(&S.lock);
        if (k != K_NONE) {
                errno = kind_errno(k);
                return -1;
        }
        long rc = REAL_CALL();
        int e = errno;
        pthread_mutex_lock(&S.lock);
        if (rc == 0 && op != OP_FTRUNCATE)
                S.synced++;
        log_result_locked(op, nth, path, rc, e);
        pthread_mutex_unlock(&S.lock);
        errno = e;
        return rc;
#undef REAL_CALL
}

int fdatasync(int fd)
{
        return (int)fd_call(OP_FDATASYNC, fd, 0);
}

int fsync(int fd)
{
        return (int)fd_call(OP_FSYNC, fd, 0);
}

int ftruncate(int fd, off_t len)
{
        return (int)fd_call(OP_FTRUNCATE, fd, len);
}

int ftruncate64(int fd, off_t len)
{
        return (int)fd_call(OP_FTRUNCATE, fd, len);
}

/* ---- path calls ------------------------------------------------------------ */

int rename(const char *from, const char *to)
{
        PATH_CALL(OP_RENAME, from, false, S.rename(from, to));
}

int renameat(int fdfrom, const char *from, int fdto, const char *to)
{
        PATH_CALL(OP_RENAME, from, false, S.renameat(fdfrom, from, fdto, to));
}

int renameat2(int fdfrom, const char *from, int fdto, const char *to, unsigned flags)
{
        PATH_CALL(OP_RENAME, from, false, S.renameat2(fdfrom, from, fdto, to, flags));
}

int unlink(const char *path)
{
        PATH_CALL(OP_UNLINK, path, false, S.unlink(path));
}
