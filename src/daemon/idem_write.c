/* SPDX-License-Identifier: MIT */
/* idem_write: tool-write and the settling of interrupted writes
 * (idem_write.h). */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "idem_write.h"
#include "kairos/beneath.h"
#include "kairos/kmem.h"
#include "log.h"

/* ---- tool-write ---- */

/* WriteRoots=: one descriptor per configured root, opened (O_PATH) by the
 * first tool write after start or reload and kept until the next reload,
 * so a root's own path is resolved once; everything below it is walked
 * with beneath_open_dir (no symbolic link, never out of the tree).  A set
 * is shared by the write_ops that use it (refs on the loop thread); its
 * descriptors and paths are touched only by jobs of write_q, which run one
 * at a time. */
struct write_root {
        char *path;             /* as configured, without a trailing '/' ("/" stays) */
        char *real;             /* its resolved path, once opened */
        int fd;                 /* -1 until opened */
        int error;              /* errno of the last failed open */
};

struct write_roots {
        unsigned refs;
        size_t n;
        struct write_root r[];
};

void idem_write_roots_unref(struct write_roots *rs)
{
        if (!rs || --rs->refs > 0)
                return;
        for (size_t i = 0; i < rs->n; i++) {
                if (rs->r[i].fd >= 0)
                        close(rs->r[i].fd);
                free(rs->r[i].path);
                free(rs->r[i].real);
        }
        free(rs);
}

/* Loop: the set for cfg (nothing opened yet). */
struct write_roots *idem_write_roots_new(const struct config *cfg)
{
        struct write_roots *rs = calloc(1, sizeof(*rs) + cfg->nwrite_roots * sizeof(rs->r[0]));
        if (!rs)
                return NULL;
        rs->refs = 1;
        for (size_t i = 0; i < cfg->nwrite_roots; i++) {
                struct write_root *r = &rs->r[rs->n];
                size_t len = strlen(cfg->write_roots[i]);
                while (len > 1 && cfg->write_roots[i][len - 1] == '/')
                        len--;
                if (!(r->path = strndup(cfg->write_roots[i], len))) {
                        idem_write_roots_unref(rs);
                        return NULL;
                }
                r->fd = -1;
                rs->n++;
        }
        return rs;
}

/* Pool (write_q): open the roots not open yet (a root that did not exist
 * is tried again at the next write). */
static void roots_open(struct write_roots *rs)
{
        for (size_t i = 0; i < rs->n; i++) {
                struct write_root *r = &rs->r[i];
                if (r->fd >= 0)
                        continue;
                r->fd = open(r->path, O_PATH | O_DIRECTORY | O_CLOEXEC);
                r->error = r->fd < 0 ? errno : 0;
                if (r->fd >= 0 && !r->real)
                        r->real = realpath(r->path, NULL);
        }
}

static void op_release(struct write_op *op)
{
        idem_write_roots_unref(op->roots);
        FREE_ALL(op->explicit_key, op->path, op->content);
        if (op->dfd >= 0)
                close(op->dfd);
        FREE_ALL(op->base, op->shown, op->tmp, op->chunk, op);
}

/* write_q: a streamed write's temporary file goes (it was never renamed). */
static void discard_work(void *arg)
{
        struct write_op *op = arg;
        if (op->tmp_fd >= 0)
                close(op->tmp_fd);
        op->tmp_fd = -1;
        if (op->tmp && op->dfd >= 0)
                unlinkat(op->dfd, op->tmp, 0);
}

static void discard_done(void *arg)
{
        struct write_op *op = arg;
        if (op->refused)
                idem_core_error_detail(op->refused, op->code,
                                       json_pack("{s:s, s:b}", "key", op->key, "cached", 0),
                                       "%s", op->msg);
        op_release(op);
}

void idem_write_op_free(struct write_op *op)
{
        if (!op)
                return;
        if (op->tmp_fd < 0 && !op->tmp) {
                op_release(op);
                return;
        }
        if (serialq_submit(&op->svc->write_q, discard_work, discard_done, op) < 0) {
                discard_work(op); /* out of memory: here rather than never */
                discard_done(op);
        }
}

void idem_write_refuse(struct write_op *op, const char *code, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(op->msg, sizeof op->msg, fmt, ap);
        va_end(ap);
        op->code = code;
}

static void roots_text(const struct write_roots *rs, char *buf, size_t len)
{
        size_t used = 0;
        buf[0] = '\0';
        if (rs->n == 0) {
                snprintf(buf, len, "(none configured)");
                return;
        }
        for (size_t i = 0; i < rs->n && used < len; i++)
                used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? " " : "",
                                         rs->r[i].path);
}

/* The length of root if path is root itself or below it, else 0. */
static size_t under(const char *path, const char *root)
{
        if (!root)
                return 0;
        if (strcmp(root, "/") == 0)
                return 1;
        size_t n = strlen(root);
        return strncmp(path, root, n) == 0 && (path[n] == '\0' || path[n] == '/') ? n : 0;
}

/* path without empty and "." components and without a trailing '/';
 * *ret_dir: it ended in '/' or "/.".  -EINVAL for a ".." component. */
static int normalize(const char *path, char *out, size_t size, bool *ret_dir)
{
        size_t o = 0;
        *ret_dir = false;
        for (const char *s = path; *s;) {
                while (*s == '/')
                        s++;
                size_t n = strcspn(s, "/");
                if (n == 2 && s[0] == '.' && s[1] == '.')
                        return -EINVAL;
                *ret_dir = n == 0 || (n == 1 && s[0] == '.');
                if (!*ret_dir) {
                        if (o + 1 + n >= size)
                                return -ENAMETOOLONG;
                        out[o++] = '/';
                        memcpy(out + o, s, n);
                        o += n;
                }
                s += n;
        }
        if (o == 0)
                out[o++] = '/';
        out[o] = '\0';
        return 0;
}

/* Pool (write_q): is op->path a file within a WriteRoots= directory?  Opens
 * its directory beneath the root (op->dfd, op->base, op->shown) or refuses;
 * the file itself is checked by check_file. */
static void check_path(struct write_op *op)
{
        char roots[1024], norm[PATH_MAX];
        const char *p = op->path;
        bool dir_only;
        op->code = NULL;
        roots_text(op->roots, roots, sizeof roots);
        if (p[0] != '/') {
                idem_write_refuse(op, "path_refused",
                       "%s: not an absolute path; tool write takes an absolute path within "
                       "WriteRoots= (%s)",
                       p, roots);
                return;
        }
        int r = normalize(p, norm, sizeof norm, &dir_only);
        if (r == -EINVAL) {
                idem_write_refuse(op, "path_refused",
                       "%s: '..' is not allowed in the path; write within WriteRoots= (%s)", p,
                       roots);
                return;
        }
        if (r < 0) {
                idem_write_refuse(op, "path_refused", "%s: %s", p, strerror(-r));
                return;
        }
        /* The root: the longest that holds the path, as configured or
         * resolved. */
        struct write_roots *rs = op->roots;
        roots_open(rs);
        const struct write_root *root = NULL;
        size_t best = 0;
        bool any_root = false;
        char why[1024] = "";
        size_t wused = 0;
        for (size_t i = 0; i < rs->n; i++) {
                const struct write_root *w = &rs->r[i];
                if (w->fd < 0) {
                        if (wused < sizeof why)
                                wused += (size_t)snprintf(why + wused, sizeof why - wused,
                                                          "; WriteRoots= %s: %s", w->path,
                                                          strerror(w->error));
                        continue;
                }
                any_root = true;
                size_t n = under(norm, w->path), m = under(norm, w->real);
                if (m > n)
                        n = m;
                if (n > best) {
                        best = n;
                        root = w;
                }
        }
        if (!root) {
                if (rs->n == 0)
                        idem_write_refuse(op, "path_refused",
                               "%s: tool write is not enabled: no WriteRoots= in the "
                               "[Idempotency] section of the configuration",
                               p);
                else if (!any_root)
                        idem_write_refuse(op, "path_refused", "%s: no WriteRoots= directory exists (%s)%s",
                               p, roots, why);
                else
                        idem_write_refuse(op, "path_refused", "%s: not within WriteRoots= (%s)%s", p,
                               roots, why);
                return;
        }
        const char *rel = norm + best;
        while (*rel == '/')
                rel++;
        if (!*rel) {
                idem_write_refuse(op, "path_refused",
                       "%s: names a directory (the WriteRoots= directory %s itself), not a file",
                       p, root->path);
                return;
        }
        if (dir_only) {
                idem_write_refuse(op, "path_refused", "%s: names a directory, not a file", p);
                return;
        }
        const char *slash = strrchr(rel, '/');
        const char *base = slash ? slash + 1 : rel;
        size_t dlen = slash ? (size_t)(slash - rel) : 0;
        char dir[PATH_MAX];
        memcpy(dir, rel, dlen);
        dir[dlen] = '\0';
        /* Reported paths start with the root as the caller named it. */
        size_t plen = (size_t)(rel - norm);
        int dfd = -1;
        size_t bad = 0;
        r = beneath_open_dir(root->fd, dir, op->beneath_flags, &dfd, &bad);
        if (r < 0) {
                int blen = (int)(plen + bad);
                if (r == -ELOOP && bad)
                        idem_write_refuse(op, "path_refused",
                               "%s: %.*s is a symbolic link; tool write follows no symbolic "
                               "link below a WriteRoots= directory (name the real path)",
                               p, blen, norm);
                else if (r == -ELOOP)
                        idem_write_refuse(op, "path_refused",
                               "%s: a directory on the path is a symbolic link; tool write "
                               "follows no symbolic link below a WriteRoots= directory (name "
                               "the real path)",
                               p);
                else if (r == -ENOTDIR && bad)
                        idem_write_refuse(op, "path_refused", "%s: %.*s is not a directory", p, blen,
                               norm);
                else if (r == -ENOENT && bad)
                        idem_write_refuse(op, "path_refused",
                               "%s: its directory cannot be resolved: %.*s does not exist", p,
                               blen, norm);
                else
                        idem_write_refuse(op, "path_refused",
                               "%s: its directory cannot be resolved below WriteRoots= %s: %s",
                               p, root->path, strerror(-r));
                return;
        }
        if (op->dfd >= 0)
                close(op->dfd);
        op->dfd = dfd;
        free(op->base);
        free(op->shown);
        op->base = strdup(base);
        op->shown = strdup(norm);
        if (!op->base || !op->shown)
                idem_write_refuse(op, "internal", "out of memory");
}

/* Pool (write_q): the file in the verified directory is absent or a
 * regular file (a symbolic link is never replaced). */
static void check_file(struct write_op *op)
{
        struct stat st;
        if (fstatat(op->dfd, op->base, &st, AT_SYMLINK_NOFOLLOW) == 0) {
                if (S_ISLNK(st.st_mode))
                        idem_write_refuse(op, "path_refused",
                               "%s: is a symbolic link (tool write replaces no symbolic "
                               "link; name its target)",
                               op->path);
                else if (!S_ISREG(st.st_mode))
                        idem_write_refuse(op, "path_refused", "%s: exists and is not a regular file",
                               op->path);
        } else if (errno != ENOENT) {
                idem_write_refuse(op, "path_refused", "%s: %s", op->path, strerror(errno));
        }
}

static void check_work(void *arg)
{
        struct write_op *op = arg;
        check_path(op);
        if (!op->code)
                check_file(op);
}

/* Pool thread: in the directory verified by check_work (never by its path
 * again): the file is still absent or regular, then a temporary file,
 * write, fdatasync, rename, fsync of the directory. */
/* Pool (write_q): a temporary file next to op->base in op->dfd (its name
 * in op->tmp, open in op->tmp_fd), or refused. */
static void tmp_create(struct write_op *op)
{
        char tmp[NAME_MAX + 64];
        int fd = -1;
        for (int i = 0; i < 100 && fd < 0; i++) {
                uint32_t rnd = randombytes_random();
                snprintf(tmp, sizeof tmp, ".%.200s.kairos-tmp.%08x", op->base, rnd);
                fd = openat(op->dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
                            0644);
                if (fd < 0 && errno != EEXIST)
                        break;
        }
        if (fd < 0) {
                idem_write_refuse(op, "write_failed", "%s: cannot create a temporary file in its "
                       "directory: %s", op->path, strerror(errno));
                return;
        }
        if (!(op->tmp = strdup(tmp))) {
                unlinkat(op->dfd, tmp, 0);
                close(fd);
                idem_write_refuse(op, "internal", "out of memory");
                return;
        }
        op->tmp_fd = fd;
}

/* Pool: all of p to fd; 0 or an errno. */
static int write_full(int fd, const unsigned char *p, size_t left)
{
        while (left > 0) {
                ssize_t n = write(fd, p, left);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return errno;
                p += n;
                left -= (size_t)n;
        }
        return 0;
}

/* Pool: the temporary file's content is on disk and the file closed. */
static int tmp_sync(struct write_op *op)
{
        int e = fdatasync(op->tmp_fd) < 0 ? errno : 0;
        if (close(op->tmp_fd) < 0 && !e)
                e = errno;
        op->tmp_fd = -1;
        return e;
}

void idem_write_work(void *arg)
{
        struct write_op *op = arg;
        int e = 0;
        if (op->dfd < 0)
                check_path(op);
        if (!op->code)
                check_file(op);
        if (op->code)
                goto unstage;
        int dfd = op->dfd;
        /* a streamed write's content is in its temporary file already */
        if (!op->tmp) {
                tmp_create(op);
                if (op->code)
                        return;
                e = write_full(op->tmp_fd, op->content, op->len);
                int e2 = tmp_sync(op);
                if (!e)
                        e = e2;
        }
        const char *tmp = op->tmp;
#ifdef KAIROS_TEST_HOOKS
        if (!e && op->svc->crash_at == 1)
                raise(SIGKILL);
#endif
        if (!e && renameat(dfd, tmp, dfd, op->base) < 0)
                e = errno;
        if (e) {
                unlinkat(dfd, tmp, 0);
                free(op->tmp);
                op->tmp = NULL;
                idem_write_refuse(op, "write_failed", "%s: writing failed: %s", op->path, strerror(e));
                return;
        }
        free(op->tmp);
        op->tmp = NULL;
        op->renamed = true;
        if (fsync(dfd) < 0)
                idem_write_refuse(op, "write_failed", "%s: written, but its directory could not be "
                       "synced: %s", op->path, strerror(errno));
#ifdef KAIROS_TEST_HOOKS
        if (op->svc->crash_at == 2)
                raise(SIGKILL);
#endif
        return;
unstage:
        /* refused before the rename: a streamed content goes */
        if (op->tmp && op->dfd >= 0)
                unlinkat(op->dfd, op->tmp, 0);
        free(op->tmp);
        op->tmp = NULL;
}

void idem_write_reply(struct write_op *op, bool cached)
{
        idem_core_ok(op->call, json_pack("{s:s, s:s, s:s, s:I, s:b}", "outcome",
                                            cached ? "completed" : "written", "key", op->key,
                                            "path", op->shown ? op->shown : op->path,
                                            "bytes", (json_int_t)op->len, "cached", cached));
}

static void write_finished_durable(struct waiter *w, int err)
{
        struct write_op *op = (struct write_op *)w;
        if (err)
                idem_core_store_error(op->call, err);
        else if (op->code)
                idem_core_error_detail(op->call, op->code,
                                           json_pack("{s:s, s:b}", "key", op->key, "cached",
                                                     0),
                                           "%s", op->msg);
        else
                idem_write_reply(op, false);
        idem_write_op_free(op);
}

/* Loop: record the outcome.  A write that failed before its rename
 * changed nothing: its entry is dropped (a retry with the key writes);
 * one that may have replaced the file is kept, failed or completed. */

void idem_write_done(void *arg)
{
        struct write_op *op = arg;
        struct idem_service *svc = op->svc;
        uint64_t lsn = 0;
        int r;
        if (svc->d->toolclaims->write_done(op))
                return;
        if (op->code && !op->renamed) {
                r = idem_abandon(svc->store, op->key, op->msg, &lsn);
        } else if (op->code) {
                r = idem_fail(svc->store, op->key, strcmp(op->code, "path_refused") == 0
                                                           ? "path_refused"
                                                           : "write_failed",
                              op->msg, NULL, 0, &lsn);
        } else {
                json_t *pl = json_pack("{s:s, s:I}", "path", op->shown, "bytes",
                                       (json_int_t)op->len);
                char *text = pl ? json_dumps(pl, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
                json_decref(pl);
                r = text ? idem_complete(svc->store, op->key, text, strlen(text), &lsn)
                         : -ENOMEM;
                free(text);
        }
        if (r < 0) {
                log_error("cannot record the write of %s (%s): %s", op->path, op->key,
                          strerror(-r));
                idem_core_store_error(op->call, r);
                idem_write_op_free(op);
                return;
        }
        if (op->code)
                log_warning("tool write %s (%s) failed%s: %s", op->path, op->key,
                            op->renamed ? "" : ", nothing written, not kept", op->msg);
        idem_core_wait_durable(svc, &op->w, lsn, write_finished_durable);
}

static void write_begin_durable(struct waiter *w, int err)
{
        struct write_op *op = (struct write_op *)w;
        if (err) {
                idem_core_store_error(op->call, err);
                idem_write_op_free(op);
                return;
        }
        if (serialq_submit(&op->svc->write_q, idem_write_work, idem_write_done, op) < 0) {
                idem_write_refuse(op, "write_failed", "out of memory");
                idem_write_done(op);
        }
}

/* A duplicate of a write: answer as the first time. */
void idem_write_existing(struct write_op *op, enum idem_outcome o, const struct idem_view *v)
{
        if (o == IDEM_HIT_COMPLETED) {
                json_t *pl = json_loadb(v->result, v->result_len, 0, NULL);
                const char *path = json_string_value(json_object_get(pl, "path"));
                free(op->shown);
                op->shown = path ? strdup(path) : NULL;
                op->len = (size_t)json_integer_value(json_object_get(pl, "bytes"));
                json_decref(pl);
                idem_write_reply(op, true);
        } else if (o == IDEM_HIT_FAILED) {
                idem_core_error_detail(op->call,
                                           v->error_class &&
                                                           strcmp(v->error_class,
                                                                  "path_refused") == 0
                                                   ? "path_refused"
                                                   : "write_failed",
                                           json_pack("{s:s, s:b}", "key", v->key, "cached", 1),
                                           "%s (cached: the first write with key %s failed)",
                                           v->error_msg ? v->error_msg : "", v->key);
        } else {
                idem_core_existing(op->call, o, v, op->fp);
        }
        idem_write_op_free(op);
}

/* Loop: claim the key (after the path check, so a refused path is not
 * claimed), then write once the begin record is durable. */
static void begin_write(struct write_op *op)
{
        struct idem_service *svc = op->svc;
        struct idem_step_owner step;
        bool owned = idem_core_step(op->call, &step);
        int64_t epoch;
        if (!idem_core_epoch(op->call, owned ? &step : NULL, &epoch)) {
                idem_write_op_free(op);
                return;
        }
        if (owned && epoch > 0 && svc->d->toolclaims->write_begin(op, &step, epoch))
                return;
        struct idem_write_claim claim = { .path = op->path, .sha256 = op->sha,
                                          .bytes = op->len };
        struct idem_request ir = { .tool = WRITE_TOOL, .key = op->explicit_key,
                                   .fingerprint = op->fp,
                                   .owner = owned ? &step : NULL,
                                   .write = strlen(op->path) <= IDEM_WRITE_PATH_MAX ? &claim
                                                                                    : NULL };
        struct idem_view v;
        uint64_t lsn = 0;
        int r = idem_begin(svc->store, &ir, &v, &lsn);
        if (r < 0) {
                idem_core_store_error(op->call, r);
                idem_write_op_free(op);
                return;
        }
        if (r != IDEM_PROCEED) {
                idem_write_existing(op, (enum idem_outcome)r, &v);
                return;
        }
        idem_core_wait_durable(svc, &op->w, lsn, write_begin_durable);
}

static void check_done(void *arg)
{
        struct write_op *op = arg;
        if (op->code) {
                idem_core_error_detail(op->call, op->code,
                                           json_pack("{s:s, s:s, s:b}", "key", op->key, "path",
                                                     op->path, "cached", 0),
                                           "%s", op->msg);
                idem_write_op_free(op);
                return;
        }
        if (SVC(op->call->d)->load_error || !SVC(op->call->d)->store) {
                idem_core_unavailable(op->call);
                idem_write_op_free(op);
                return;
        }
        begin_write(op);
}

/* The largest tool write (MaxWriteBytes=). */
static uint64_t max_write_bytes(const struct daemon *d)
{
        return d->cfg->max_write_bytes ? d->cfg->max_write_bytes : CONFIG_MAX_WRITE_BYTES_DEFAULT;
}

static void refuse_too_large(struct idem_call *call, const char *key, uint64_t max)
{
        idem_core_error_detail(call, "too_large", json_pack("{s:s, s:b}", "key", key, "cached", 0),
                               "the content is larger than MaxWriteBytes= (%llu bytes, the "
                               "[Idempotency] section of kairosd.conf): nothing was written",
                               (unsigned long long)max);
}

static void too_large(struct write_op *op, uint64_t max)
{
        idem_write_refuse(op, "too_large",
                          "the content is larger than MaxWriteBytes= (%llu bytes, the "
                          "[Idempotency] section of kairosd.conf): nothing was written",
                          (unsigned long long)max);
}

/* A write_op for call's key and path (answered and NULL on a bad one). */
static struct write_op *op_new(struct idem_call *call, const char *key, const char *path)
{
        struct idem_service *svc = SVC(call->d);
        if (!svc->roots && !(svc->roots = idem_write_roots_new(call->d->cfg))) {
                idem_core_error(call, "internal", "out of memory");
                return NULL;
        }
        struct write_op *op = calloc(1, sizeof(*op));
        if (!op) {
                idem_core_error(call, "internal", "out of memory");
                return NULL;
        }
        op->svc = svc;
        op->call = call;
        op->dfd = -1;
        op->tmp_fd = -1;
        op->roots = svc->roots;
        op->roots->refs++;
        op->beneath_flags = svc->beneath_flags;
        /* The identity is the key and the path: content may differ on a
         * retry (a timestamp) and is still the same write. */
        json_t *input = json_pack("{s:s}", "path", path);
        char *text = input ? json_dumps(input, JSON_COMPACT) : NULL;
        json_decref(input);
        struct idem_request ir = { .tool = WRITE_TOOL, .key = key, .input_json = text,
                                   .input_len = text ? strlen(text) : 0 };
        int r = text ? idem_make_key(&ir, op->key, op->fp) : -ENOMEM;
        free(text);
        op->explicit_key = strdup(key);
        op->path = strdup(path);
        if (r == 0 && (!op->explicit_key || !op->path))
                r = -ENOMEM;
        if (r < 0) {
                if (r == -ENOMEM)
                        idem_core_error(call, "internal", "out of memory");
                else
                        idem_core_error(call, "bad_argument",
                                            "args.key: 1..512 bytes of UTF-8 without control "
                                            "characters, not starting with 'content:'");
                op->call = NULL;
                idem_write_op_free(op);
                return NULL;
        }
        return op;
}

/* ---- a streamed write: tool-write {stream:true}, tool-write-data,
 * tool-write-end on one connection ---- */

/* The stream ends refused: call (not NULL) is answered with op->code and
 * op->msg once its temporary file is gone. */
static void stream_drop(struct write_op *op, struct idem_call *call)
{
        struct idem_claim *c = op->stream;
        op->refused = call;
        op->stream = NULL;
        if (c)
                idem_core_claim_free(c); /* unties it from the connection */
        if (op->busy)
                op->gone = true; /* freed when its job is done */
        else
                idem_write_op_free(op);
}

/* The stream's connection went before tool-write-end. */
static void stream_gone(struct idem_claim *c)
{
        struct write_op *op = c->stream;
        c->hold = NULL;
        op->stream = NULL;
        idem_core_claim_free(c);
        if (op->busy)
                op->gone = true;
        else
                idem_write_op_free(op);
}

/* The stream of the call's connection (answered and NULL: none, or busy). */
static struct write_op *stream_of(struct idem_call *call)
{
        struct idem_service *svc = SVC(call->d);
        for (struct idem_claim *c = svc->claims; c; c = c->next) {
                if (!c->stream || c->owner_id != call->owner.id)
                        continue;
                if (c->stream->busy) {
                        idem_core_error(call, "bad_argument",
                                        "the previous part of the tool write on this "
                                        "connection is not answered yet");
                        return NULL;
                }
                return c->stream;
        }
        idem_core_error(call, "bad_argument",
                        "no tool write is open on this connection (tool-write with "
                        "args.stream first)");
        return NULL;
}

static void stream_open_work(void *arg)
{
        struct write_op *op = arg;
        check_work(op);
        if (op->code)
                return;
        tmp_create(op);
        crypto_hash_sha256_init(&op->hash);
}

static void stream_open_done(void *arg)
{
        struct write_op *op = arg;
        struct idem_service *svc = op->svc;
        if (op->code) {
                check_done(op); /* answers the refusal */
                return;
        }
        struct idem_claim *c = calloc(1, sizeof(*c));
        if (!c) {
                idem_core_error(op->call, "internal", "out of memory");
                idem_write_op_free(op);
                return;
        }
        c->stream = op;
        c->gone = stream_gone;
        op->stream = c;
        struct idem_call *call = op->call;
        op->call = NULL;
        /* false: the caller went already (stream_gone dropped op) */
        if (!idem_core_claim_adopt(svc, c, call)) {
                idem_core_error(call, "internal", "the connection closed");
                return;
        }
        uint64_t max = max_write_bytes(svc->d);
        idem_core_ok(call, json_pack("{s:s, s:s, s:o}", "outcome", "send", "key", op->key,
                                     "max_bytes", max == CONFIG_LIMIT_INFINITY
                                                          ? json_null()
                                                          : json_integer((json_int_t)max)));
}

/* tool-write {stream:true}: a duplicate is answered as such at once (its
 * content does not matter: the identity is the key and the path); else
 * the path is checked and a temporary file made for the content. */
static void stream_open(struct write_op *op)
{
        struct idem_service *svc = op->svc;
        struct idem_step_owner step;
        bool owned = idem_core_step(op->call, &step);
        int64_t epoch;
        if (!idem_core_epoch(op->call, owned ? &step : NULL, &epoch)) {
                op->call = NULL;
                idem_write_op_free(op);
                return;
        }
        struct idem_request ir = { .tool = WRITE_TOOL, .key = op->explicit_key,
                                   .fingerprint = op->fp };
        struct idem_view v;
        int r = idem_lookup(svc->store, &ir, &v);
        if (r < 0) {
                idem_core_store_error(op->call, r);
                op->call = NULL;
                idem_write_op_free(op);
                return;
        }
        if (r != IDEM_MISS) {
                idem_write_existing(op, (enum idem_outcome)r, &v);
                return;
        }
        if (serialq_submit(&svc->write_q, stream_open_work, stream_open_done, op) < 0) {
                idem_core_error(op->call, "internal", "out of memory");
                op->call = NULL;
                idem_write_op_free(op);
        }
}

static void chunk_work(void *arg)
{
        struct write_op *op = arg;
        op->chunk_err = write_full(op->tmp_fd, op->chunk, op->chunk_len);
        if (!op->chunk_err)
                crypto_hash_sha256_update(&op->hash, op->chunk, op->chunk_len);
}

static void chunk_done(void *arg)
{
        struct write_op *op = arg;
        struct idem_call *call = op->call;
        op->call = NULL;
        op->busy = false;
        free(op->chunk);
        op->chunk = NULL;
        if (op->gone) {
                idem_core_error(call, "internal", "the connection closed");
                idem_write_op_free(op);
                return;
        }
        if (op->chunk_err) {
                idem_write_refuse(op, "write_failed", "%s: writing failed: %s", op->path,
                                  strerror(op->chunk_err));
                stream_drop(op, call);
                return;
        }
        op->len += op->chunk_len;
        idem_core_ok(call, json_pack("{s:I}", "bytes", (json_int_t)op->len));
}

void idem_tool_write_data(const struct idem_call *in)
{
        const char *data;
        struct write_op *op;
        struct idem_call *call = idem_core_open(in, "data", &data, NULL);
        if (!call || !(op = stream_of(call)))
                return;
        /* (a reload may have lowered it meanwhile) */
        uint64_t max = max_write_bytes(call->d), room = op->len < max ? max - op->len : 0;
        size_t n = strlen(data) / 4 * 3; /* at most 2 more than it decodes to */
        int r = n > 2 && n - 2 > room ? -EFBIG
                                      : idem_core_b64_decode(data, &op->chunk, &op->chunk_len);
        if (r == 0 && op->chunk_len > room)
                r = -EFBIG;
        if (r < 0) {
                if (r == -EFBIG)
                        too_large(op, max);
                else
                        idem_write_refuse(op, "bad_argument", "args.data: %s",
                                          r == -EINVAL ? "not base64" : "out of memory");
                stream_drop(op, call);
                return;
        }
        op->call = call;
        op->busy = true;
        if (serialq_submit(&op->svc->write_q, chunk_work, chunk_done, op) < 0) {
                op->chunk_err = ENOMEM;
                chunk_done(op);
        }
}

static void end_work(void *arg)
{
        struct write_op *op = arg;
        unsigned char h[crypto_hash_sha256_BYTES];
        op->chunk_err = tmp_sync(op);
        crypto_hash_sha256_final(&op->hash, h);
        sodium_bin2hex(op->sha, sizeof op->sha, h, sizeof h);
}

static void end_done(void *arg)
{
        struct write_op *op = arg;
        op->busy = false;
        if (op->gone) {
                idem_core_error(op->call, "internal", "the connection closed");
                op->call = NULL;
                idem_write_op_free(op);
                return;
        }
        if (op->chunk_err) {
                idem_write_refuse(op, "write_failed", "%s: writing failed: %s", op->path,
                                  strerror(op->chunk_err));
                struct idem_call *call = op->call;
                op->call = NULL;
                stream_drop(op, call);
                return;
        }
        /* all there: claimed now, then renamed (idem_write_work) */
        struct idem_claim *c = op->stream;
        op->stream = NULL;
        idem_core_claim_free(c);
        begin_write(op);
}

void idem_tool_write_end(const struct idem_call *in)
{
        struct idem_call *call = idem_core_open(in, NULL);
        struct write_op *op;
        if (!call || !(op = stream_of(call)))
                return;
        op->call = call;
        op->busy = true;
        if (serialq_submit(&op->svc->write_q, end_work, end_done, op) < 0) {
                op->chunk_err = ENOMEM;
                end_done(op);
        }
}

void idem_tool_write(const struct idem_call *in)
{
        const char *key, *path, *content = NULL;
        bool failed = false;
        struct idem_call *call = idem_core_open(in, "key", &key, "path", &path, NULL);
        if (!call)
                return;
        json_t *sv = json_object_get(call->args, "stream");
        if (sv && !json_is_boolean(sv)) {
                idem_core_error(call, "bad_argument", "args.stream: must be true or false");
                return;
        }
        bool stream = json_is_true(sv);
        content = idem_core_arg_string(call, "content", !stream, &failed);
        if (failed)
                return;
        if (stream && content) {
                idem_core_error(call, "bad_argument",
                                "args.content: not with args.stream (send it with "
                                "tool-write-data)");
                return;
        }
        uint64_t max = max_write_bytes(call->d);
        if (!stream && strlen(content) / 4 * 3 > 2 && strlen(content) / 4 * 3 - 2 > max) {
                refuse_too_large(call, key, max);
                return;
        }
        struct write_op *op = op_new(call, key, path);
        if (!op)
                return;
        struct idem_service *svc = op->svc;
        if (stream) {
                stream_open(op);
                return;
        }
        int r = idem_core_b64_decode(content, &op->content, &op->len);
        if (r < 0) {
                idem_core_error(call, "bad_argument", "args.content: %s",
                                    r == -EINVAL ? "not base64" : "out of memory");
                op->call = NULL;
                idem_write_op_free(op);
                return;
        }
        if (op->len > max) {
                refuse_too_large(call, key, max);
                op->call = NULL;
                idem_write_op_free(op);
                return;
        }
        idem_core_sha256_hex(op->content, op->len, op->sha);
        /* Known key: a duplicate is answered without touching the path. */
        struct idem_view v;
        if (idem_get(svc->store, op->key, &v) == 0) {
                begin_write(op);
                return;
        }
        if (serialq_submit(&svc->write_q, check_work, check_done, op) < 0) {
                idem_core_error(call, "internal", "out of memory");
                op->call = NULL;
                idem_write_op_free(op);
        }
}

/* ---- settling tool writes a crash interrupted (docs/design.md §11) ---- */

enum settle_verdict { SETTLE_WRITTEN, SETTLE_NOT_WRITTEN, SETTLE_UNKNOWN };

/* Pool: does the file named by the claim hold the claimed content?  The
 * path is resolved beneath its WriteRoots= directory exactly as a tool
 * write resolves it (no symbolic link followed); the file is opened
 * O_NOFOLLOW.  why: for the log and the record. */
static enum settle_verdict settle_check(struct idem_service *svc,
                                        const struct idem_write_claim *w, char **ret_shown,
                                        char *why, size_t whylen)
{
        struct write_op op = { .svc = svc, .dfd = -1, .roots = svc->settle_roots,
                               .beneath_flags = svc->beneath_flags, .path = (char *)w->path };
        enum settle_verdict v = SETTLE_UNKNOWN;
        *ret_shown = NULL;
        check_path(&op);
        if (op.code) {
                snprintf(why, whylen, "%s", op.msg);
                goto out;
        }
        int fd = openat(op.dfd, op.base, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0 && errno == ENOENT) {
                snprintf(why, whylen, "the file does not exist: the write never reached its "
                         "rename");
                v = SETTLE_NOT_WRITTEN;
                goto out;
        }
        if (fd < 0) {
                snprintf(why, whylen, "the file cannot be opened: %s", strerror(errno));
                goto out;
        }
        struct stat st;
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
                snprintf(why, whylen, "the file is not a regular file");
                close(fd);
                goto out;
        }
        if ((uint64_t)st.st_size != w->bytes) {
                snprintf(why, whylen, "the file holds %lld bytes, the write %llu: its content "
                         "is not the write's",
                         (long long)st.st_size, (unsigned long long)w->bytes);
                v = SETTLE_NOT_WRITTEN;
                close(fd);
                goto out;
        }
        crypto_hash_sha256_state hs;
        crypto_hash_sha256_init(&hs);
        unsigned char buf[65536];
        uint64_t total = 0;
        for (;;) {
                ssize_t n = read(fd, buf, sizeof buf);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0) {
                        snprintf(why, whylen, "the file cannot be read: %s", strerror(errno));
                        close(fd);
                        goto out;
                }
                if (n == 0)
                        break;
                total += (uint64_t)n;
                crypto_hash_sha256_update(&hs, buf, (size_t)n);
        }
        close(fd);
        unsigned char h[crypto_hash_sha256_BYTES];
        char hex[IDEM_SHA256_HEX + 1];
        crypto_hash_sha256_final(&hs, h);
        sodium_bin2hex(hex, sizeof hex, h, sizeof h);
        if (total == w->bytes && strcmp(hex, w->sha256) == 0) {
                snprintf(why, whylen, "the file holds the write's content (sha256 %s, %llu "
                         "bytes): the write took effect",
                         hex, (unsigned long long)total);
                v = SETTLE_WRITTEN;
        } else {
                snprintf(why, whylen, "the file's content (sha256 %s) is not the write's "
                         "(sha256 %s)",
                         hex, w->sha256);
                v = SETTLE_NOT_WRITTEN;
        }
out:
        if (op.dfd >= 0)
                close(op.dfd);
        free(op.base);
        if (v == SETTLE_WRITTEN)
                *ret_shown = op.shown;
        else
                free(op.shown);
        return v;
}

struct settle_item {
        char key[IDEM_FULL_KEY_SIZE];
        char *path;
        char sha[IDEM_SHA256_HEX + 1];
        uint64_t bytes;
};

struct settle_list {
        struct settle_item *v;
        size_t n, cap;
        int err;
};

static int collect_open_write(const struct idem_view *v, void *arg)
{
        struct settle_list *l = arg;
        if ((v->state != IDEM_ST_INTERRUPTED && v->state != IDEM_ST_PROCESSING) ||
            strcmp(v->tool, WRITE_TOOL) != 0 || !v->write.path)
                return 0;
        if (l->n == l->cap) {
                size_t cap = l->cap ? l->cap * 2 : 8;
                struct settle_item *nv = realloc(l->v, cap * sizeof(*nv));
                if (!nv) {
                        l->err = -ENOMEM;
                        return 1;
                }
                l->v = nv;
                l->cap = cap;
        }
        struct settle_item *it = &l->v[l->n];
        snprintf(it->key, sizeof it->key, "%s", v->key);
        memcpy(it->sha, v->write.sha256, sizeof it->sha);
        it->bytes = v->write.bytes;
        if (!(it->path = strdup(v->write.path))) {
                l->err = -ENOMEM;
                return 1;
        }
        l->n++;
        return 0;
}

/* Pool, at load (before anything else uses the store): every tool write
 * that a crash left open is decided from its file — the content it claimed
 * is there → completed (a retry replays it); it is not → dropped (a retry
 * writes; the write is an atomic replace, so it never reached its rename,
 * or the file was replaced since).  Unreadable → left interrupted for an
 * operator.  The records are made durable here. */
void idem_write_settle(struct idem_service *svc)
{
        struct settle_list l = { 0 };
        idem_foreach(svc->store, collect_open_write, &l);
        if (!(svc->settled = json_array()))
                l.err = -ENOMEM;
        for (size_t i = 0; i < l.n && !l.err; i++) {
                struct settle_item *it = &l.v[i];
                struct idem_write_claim w = { .path = it->path, .sha256 = it->sha,
                                              .bytes = it->bytes };
                char why[2200], *shown = NULL;
                enum settle_verdict v = settle_check(svc, &w, &shown, why, sizeof why);
                int r = 0;
                const char *outcome = "left_interrupted";
                if (v == SETTLE_WRITTEN) {
                        json_t *pl = json_pack("{s:s, s:I, s:s}", "path", shown ? shown : it->path,
                                               "bytes", (json_int_t)it->bytes, "settled",
                                               "at kairosd start, from the file");
                        char *text = pl ? json_dumps(pl, JSON_COMPACT | JSON_PRESERVE_ORDER)
                                        : NULL;
                        json_decref(pl);
                        r = text ? idem_settle_complete(svc->store, it->key, text, strlen(text),
                                                        NULL)
                                 : -ENOMEM;
                        free(text);
                        outcome = "completed";
                } else if (v == SETTLE_NOT_WRITTEN) {
                        char reason[2400];
                        snprintf(reason, sizeof reason, "settled at kairosd start: %s", why);
                        r = idem_settle_abandon(svc->store, it->key, reason, NULL);
                        outcome = "dropped";
                }
                free(shown);
                if (r < 0)
                        outcome = "left_interrupted";
                json_array_append_new(svc->settled,
                                      json_pack("{s:s, s:s, s:s, s:s}", "key", it->key, "path",
                                                it->path, "outcome", outcome, "why",
                                                r < 0 ? strerror(-r) : why));
        }
        for (size_t i = 0; i < l.n; i++)
                free(l.v[i].path);
        free(l.v);
        if (idem_pending_bytes(svc->store) == 0)
                return;
        struct kbuf b = { 0 };
        uint64_t upto = 0;
        int r = idem_take_pending(svc->store, &b, &upto);
        if (r == 0)
                r = idem_log_append(svc->log, b.data, b.len);
        kbuf_free(&b);
        if (r == 0)
                idem_durable(svc->store, upto);
        else
                idem_set_failed(svc->store, r);
}
