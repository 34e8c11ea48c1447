/* SPDX-License-Identifier: MIT */
/* idem_log: the idempotency store's log (docs/design.md §11, idem.h): loads
 * it into a store (torn tails repaired, corruption quarantined), appends
 * and compacts the records the store produced. */
#include "kairos/idem.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "kairos/crcline.h"
#include "kairos/kio.h"
#include "kairos/kjson.h"
#include "kairos/kmem.h"
#include "kairos/statedir.h"
#include "kairos/strmap.h"
#include "kairos/wal.h"

#include "idem_internal.h"

#define LOG_MAX_BYTES ((size_t)1 << 30)

struct idem_log {
        const struct kio *io;
        char *dir;
        char *path;
        int fd;
        off_t size;                     /* end of the last durable-intended record */
        int error;
        bool quarantined;
        uint64_t flushes;
        int64_t (*now_ms)(void *ctx);
        void *clock_ctx;
};

/* ---- loading ---- */

struct loader {
        struct idem_store *s;
        struct kjson_arena *arena;
        struct idem_load_info *info;
};

static bool get_i64(const struct kjson *obj, const char *name, int64_t *out)
{
        const struct kjson *v = kjson_get(obj, name);
        if (!v || v->type != KJSON_NUMBER || v->u.num.is_float || v->u.num.len > 19)
                return false;
        char buf[24];
        memcpy(buf, v->u.num.text, v->u.num.len);
        buf[v->u.num.len] = '\0';
        errno = 0;
        char *end;
        long long x = strtoll(buf, &end, 10);
        if (errno || *end)
                return false;
        *out = x;
        return true;
}

/* A string member without embedded NULs. */
static const struct kjson *get_cstr(const struct kjson *obj, const char *name)
{
        const struct kjson *v = kjson_get(obj, name);
        if (!v || v->type != KJSON_STRING || strlen(v->u.str.ptr) != v->u.str.len)
                return NULL;
        return v;
}

static int decode_b64(const struct kjson *v, unsigned char **out, size_t *len)
{
        *out = NULL;
        *len = 0;
        size_t max = v->u.str.len / 4 * 3 + 3;
        if (max > IDEM_RESULT_MAX + 3)
                return -EINVAL;
        if (v->u.str.len == 0)
                return 0;
        unsigned char *b = malloc(max);
        if (!b)
                return -ENOMEM;
        const char *end = NULL;
        if (sodium_base642bin(b, max, v->u.str.ptr, v->u.str.len, NULL, len, &end, B64) != 0 ||
            end != v->u.str.ptr + v->u.str.len || *len > IDEM_RESULT_MAX) {
                free(b);
                return -EINVAL;
        }
        *out = b;
        return 0;
}

/* Find or create the entry for a loaded record, reset to a clean slate. */
static int load_entry(struct idem_store *s, const char *key, size_t tool_len, const char *fp,
                      int64_t created, struct entry **out)
{
        struct entry *e = strmap_get(s->map, key);
        if (!e)
                return idem_entry_add(s, key, tool_len, fp, created, out);
        idem_entry_clear_payload(e);
        memcpy(e->tool, key, tool_len);
        e->tool[tool_len] = '\0';
        snprintf(e->fp, sizeof(e->fp), "%s", fp ? fp : "");
        e->created_ms = created;
        e->finished_ms = 0;
        e->owner = (struct idem_step_owner){ 0 };
        e->client = (struct idem_client){ 0 };
        free(e->wpath);
        e->wpath = NULL;
        free(e->check);
        e->check = NULL;
        *out = e;
        return 0;
}

/* An optional object member: 0 absent, 1 (*ret) present, -EINVAL not an object. */
static int get_obj(const struct kjson *obj, const char *name, const struct kjson **ret)
{
        *ret = kjson_get(obj, name);
        if (!*ret)
                return 0;
        return (*ret)->type == KJSON_OBJECT ? 1 : -EINVAL;
}

/* The optional write claim of a record into e: 0 (absent, or kept),
 * -EINVAL, -ENOMEM. */
static int get_write(const struct kjson *obj, char **ret_path, char sha[IDEM_SHA256_HEX + 1],
                     uint64_t *ret_bytes)
{
        *ret_path = NULL;
        const struct kjson *v;
        int r = get_obj(obj, "write", &v);
        if (r <= 0)
                return r;
        const struct kjson *p = get_cstr(v, "path"), *h = get_cstr(v, "sha256");
        int64_t bytes = -1;
        if (!p || !h || !get_i64(v, "bytes", &bytes) || bytes < 0 ||
            !idem_valid_write_claim(p->u.str.ptr, p->u.str.len, h->u.str.ptr, h->u.str.len))
                return -EINVAL;
        if (!(*ret_path = strdup(p->u.str.ptr)))
                return -ENOMEM;
        memcpy(sha, h->u.str.ptr, IDEM_SHA256_HEX + 1);
        *ret_bytes = (uint64_t)bytes;
        return 0;
}

/* The optional check of a record (compact JSON, idem_valid_check): 0
 * (absent, or kept in *ret), -EINVAL, -ENOMEM. */
static int get_check(const struct kjson *obj, char **ret)
{
        *ret = NULL;
        const struct kjson *v = kjson_get(obj, "check");
        if (!v)
                return 0;
        struct kbuf b = KBUF_INIT;
        int r = kjson_write(&b, v);
        if (r == 0 && !idem_valid_check(b.data, b.len))
                r = -EINVAL;
        if (r == 0)
                *ret = kbuf_steal(&b);
        kbuf_free(&b);
        return r;
}

/* The optional owner of a record: 0 (absent: *o cleared, or valid), -EINVAL. */
static int get_owner(const struct kjson *obj, struct idem_step_owner *o)
{
        *o = (struct idem_step_owner){ 0 };
        const struct kjson *v;
        int r = get_obj(obj, "owner", &v);
        if (r <= 0)
                return r;
        const struct kjson *m = get_cstr(v, "mandate"), *st = get_cstr(v, "step");
        int64_t attempt = 0;
        if (!m || !st || m->u.str.len > IDEM_OWNER_ID_MAX || st->u.str.len > IDEM_OWNER_ID_MAX ||
            !get_i64(v, "attempt", &attempt) || attempt < 1 || attempt > UINT32_MAX)
                return -EINVAL;
        memcpy(o->mandate, m->u.str.ptr, m->u.str.len + 1);
        memcpy(o->step, st->u.str.ptr, st->u.str.len + 1);
        o->attempt = (uint32_t)attempt;
        return idem_owner_check(o);
}

/* The optional client of a record: 0 (absent: *c cleared, or valid), -EINVAL. */
static int get_client(const struct kjson *obj, struct idem_client *c)
{
        *c = (struct idem_client){ 0 };
        const struct kjson *v;
        int r = get_obj(obj, "client", &v);
        if (r <= 0)
                return r;
        int64_t pid = 0, start = -1;
        if (!get_i64(v, "pid", &pid) || pid < 1 ||
            pid > INT32_MAX || !get_i64(v, "start", &start) || start < 0)
                return -EINVAL;
        c->pid = (int32_t)pid;
        c->start = (uint64_t)start;
        return 0;
}

/* Apply one good record.  1: applied, 0: unknown op (ignored), -EINVAL: a
 * known op with missing or bad fields, -ENOMEM. */
static int apply(struct loader *ld, const struct kjson *obj)
{
        struct idem_store *s = ld->s;
        const char *op = kjson_get_str(obj, "op");
        const struct kjson *key = get_cstr(obj, "key");
        size_t tool_len;
        if (!op)
                return -EINVAL;
        bool is_forget = strcmp(op, "forget") == 0;
        enum idem_state st = IDEM_ST_PROCESSING;
        if (!is_forget && !idem_op_state(op, &st))
                return 0;
        if (!key || !idem_valid_full_key(key->u.str.ptr, key->u.str.len, &tool_len))
                return -EINVAL;
        if (is_forget) {
                struct entry *e = strmap_get(s->map, key->u.str.ptr);
                if (e)
                        idem_entry_drop(s, e);
                return 1;
        }
        const struct kjson *tool = get_cstr(obj, "tool");
        const struct kjson *fp = get_cstr(obj, "fp");
        int64_t created = 0, finished = 0;
        /* an interrupted entry salvaged from a bad line has no known fingerprint */
        if (!tool || tool->u.str.len != tool_len ||
            memcmp(tool->u.str.ptr, key->u.str.ptr, tool_len) != 0 || !fp ||
            !(idem_valid_fp(fp->u.str.ptr, fp->u.str.len) ||
              (st == IDEM_ST_INTERRUPTED && fp->u.str.len == 0)) ||
            !get_i64(obj, "created", &created))
                return -EINVAL;

        unsigned char *result = NULL;
        size_t result_len = 0;
        char *cls = NULL, *msg = NULL, *reason = NULL;
        struct idem_step_owner owner;
        struct idem_client client;
        char *wpath = NULL, wsha[IDEM_SHA256_HEX + 1];
        uint64_t wbytes = 0;
        char *check = NULL;
        int r = get_owner(obj, &owner);
        if (r < 0 || (r = get_client(obj, &client)) < 0 || (r = get_write(obj, &wpath, wsha, &wbytes)) < 0)
                return r;
        if ((r = get_check(obj, &check)) < 0) {
                free(wpath);
                return r;
        }
        r = -EINVAL;
        if (st == IDEM_ST_COMPLETED || st == IDEM_ST_FAILED) {
                const struct kjson *res = get_cstr(obj, "result");
                if (!get_i64(obj, "finished", &finished) || !res)
                        goto out;
                if ((r = decode_b64(res, &result, &result_len)) < 0)
                        goto out;
                r = -EINVAL;
        }
        if (st == IDEM_ST_FAILED) {
                const struct kjson *c = get_cstr(obj, "error_class");
                const struct kjson *m = get_cstr(obj, "error_msg");
                if (!c || !m || !idem_valid_name(c->u.str.ptr, c->u.str.len, IDEM_CLASS_MAX))
                        goto out;
                r = -ENOMEM;
                if (!(cls = strdup(c->u.str.ptr)) || !(msg = strdup(m->u.str.ptr)))
                        goto out;
        }
        if (st == IDEM_ST_INTERRUPTED) {
                const struct kjson *w = get_cstr(obj, "reason");
                r = -ENOMEM;
                if (!(reason = strdup(w ? w->u.str.ptr : "")))
                        goto out;
        }
        struct entry *e;
        if ((r = load_entry(s, key->u.str.ptr, tool_len, fp->u.str.ptr, created, &e)) < 0)
                goto out;
        e->result = result;
        e->result_len = result_len;
        e->error_class = cls;
        e->error_msg = msg;
        e->reason = reason;
        e->owner = owner;
        e->client = client;
        e->wpath = wpath;
        if (wpath) {
                memcpy(e->wsha, wsha, sizeof wsha);
                e->wbytes = wbytes;
        }
        free(e->check);
        e->check = check;
        e->finished_ms = finished;
        e->lsn = 0;
        idem_entry_set_state(s, e, st);
        return 1;
out:
        FREE_ALL(result, cls, msg, reason, wpath, check);
        return r;
}

/* A bad line that still names a key: that entry needs an operator. */
static int salvage(struct loader *ld, const char *l, size_t n)
{
        struct kjson *v = NULL;
        struct kjson_error err = { 0 };
        size_t tool_len;
        kjson_arena_reset(ld->arena);
        int r = kjson_parse(ld->arena, l, n, &v, &err);
        if (r == -ENOMEM || err.code == KJSON_E_NOMEM)
                return -ENOMEM;
        if (r < 0 || v->type != KJSON_OBJECT)
                return 0;
        const struct kjson *key = get_cstr(v, "key");
        if (!key || !idem_valid_full_key(key->u.str.ptr, key->u.str.len, &tool_len))
                return 0;
        struct entry *e = strmap_get(ld->s->map, key->u.str.ptr);
        if (!e && (r = idem_entry_add(ld->s, key->u.str.ptr, tool_len, NULL, 0, &e)) < 0)
                return r;
        idem_entry_clear_payload(e);
        e->reason = strdup("corrupt_record");
        if (!e->reason)
                return -ENOMEM;
        e->finished_ms = 0;
        idem_entry_set_state(ld->s, e, IDEM_ST_INTERRUPTED);
        return 0;
}

/* ---- the scan: lines, crc, torn tail (crcline.c) ---- */

static int replay_record(void *ctx, const struct kjson *obj, size_t line, bool legacy)
{
        struct loader *ld = ctx;
        (void)line;
        (void)legacy;
        int r = apply(ld, obj);
        if (r == -ENOMEM)
                return r;
        if (r == 0)
                ld->info->unknown_ops++;
        return r < 0 ? CRCLINE_REJECT : 0;
}

/* A bad line that still names a key: that entry needs an operator. */
static int replay_bad(void *ctx, const char *l, size_t n, size_t line, size_t offset,
                      const char *why)
{
        (void)line;
        (void)offset;
        (void)why;
        return salvage(ctx, l, n);
}

/* Replay the log's bytes.  *good_end: end of the last complete line. */
static int replay(struct loader *ld, const char *data, size_t len, size_t *good_end)
{
        struct idem_load_info *info = ld->info;
        struct crcline_scan sc = {
                .flags = CRCLINE_KEEP_GOING,
                .record = replay_record,
                .bad = replay_bad,
                .ctx = ld,
                .arena = ld->arena,
        };
        struct crcline_result res;
        int r = crcline_scan(&sc, data, len, &res);
        if (r < 0)
                return r;
        info->records = res.records;
        info->torn_bytes = res.torn_bytes;
        if (res.bad_lines) {
                info->corrupt = true;
                info->bad_lines = res.bad_lines;
                info->bad_line = res.bad_line;
                info->bad_offset = res.bad_offset;
                snprintf(info->bad_reason, sizeof(info->bad_reason), "%s", res.bad_reason);
        }
        *good_end = res.complete_end;
        return 0;
}

/* After replay: processing → interrupted, TTL, capacity. */
static int finish_load(struct idem_store *s, struct idem_load_info *info)
{
        size_t pos = 0;
        const char *k;
        void *v;
        while (strmap_next(s->map, &pos, &k, &v) == 0) {
                struct entry *e = v;
                if (e->state != IDEM_ST_PROCESSING)
                        continue;
                free(e->reason);
                e->reason = strdup("daemon_restart");
                if (!e->reason)
                        return -ENOMEM;
                idem_entry_set_state(s, e, IDEM_ST_INTERRUPTED);
                info->interrupted++;
        }
        info->expired = idem_sweep(s);
        while (strmap_size(s->map) > s->capacity && s->lru) {
                idem_entry_drop(s, s->lru);
                s->evictions++;
                info->evicted++;
        }
        info->entries = strmap_size(s->map);
        s->log_records = info->records;
        return 0;
}


/* Keep bytes in <path>.<what>.<secs>[.k] (new file, durable). */
static int save_aside(struct idem_log *l, const char *what, const char *bytes, size_t n,
                      char *dest, size_t dest_size)
{
        const struct kio *io = l->io;
        int64_t ms = l->now_ms(l->clock_ctx);
        long long secs = (long long)(ms >= 0 ? ms / 1000 : (ms - 999) / 1000);
        int fd = -EEXIST;
        for (int k = 0; k < 100 && fd == -EEXIST; k++) {
                int len = k == 0 ? snprintf(dest, dest_size, "%s.%s.%lld", l->path, what, secs)
                                 : snprintf(dest, dest_size, "%s.%s.%lld.%d", l->path, what,
                                            secs, k);
                if (len < 0 || (size_t)len >= dest_size)
                        return -ENAMETOOLONG;
                fd = io->open(io->ctx, dest, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        }
        if (fd < 0)
                return fd;
        int r = kio_write_close(io, fd, bytes, n, true);
        if (r == 0)
                r = io->fsync_dir(io->ctx, l->dir);
        return r;
}

static int open_append(struct idem_log *l)
{
        return l->io->open(l->io->ctx, l->path, O_WRONLY | O_APPEND | O_CLOEXEC, 0600);
}

static int load_existing(struct idem_log *l, struct idem_store *s, struct idem_load_info *info)
{
        const struct kio *io = l->io;
        char *data = NULL;
        size_t len = 0, good_end = 0;
        struct loader ld = { .s = s, .info = info };
        int r = kio_read_file(l->path, LOG_MAX_BYTES, 0, &data, &len);
        if (r < 0)
                return r;
        ld.arena = kjson_arena_new();
        if (!ld.arena) {
                r = -ENOMEM;
                goto out;
        }
        if (len == 0 && (r = io->fsync_dir(io->ctx, l->dir)) < 0)
                goto out;
        if ((r = replay(&ld, data, len, &good_end)) < 0)
                goto out;
        if ((r = finish_load(s, info)) < 0)
                goto out;
        if (info->corrupt) {
                info->torn_bytes = 0;
                l->quarantined = true;
                s->quarantined = true;
                r = 0;
                goto out;
        }
        l->fd = open_append(l);
        if (l->fd < 0) {
                r = l->fd;
                goto out;
        }
        if (good_end < len) {
                r = save_aside(l, "torn", data + good_end, len - good_end, info->torn_path,
                               sizeof(info->torn_path));
                if (r == 0)
                        r = io->ftruncate(io->ctx, l->fd, (off_t)good_end);
                if (r == 0)
                        r = io->fdatasync(io->ctx, l->fd);
                if (r < 0)
                        goto out;
                l->flushes++;
                info->torn_repaired = true;
                info->torn_bytes = len - good_end;
        }
        l->size = (off_t)good_end;
        r = 0;
out:
        kjson_arena_free(ld.arena);
        free(data);
        return r;
}

/* What both loaders check first: a directory and an empty store never
 * loaded; *info zeroed (dummy when the caller wants none). */
static int load_begin(const char *dir, const struct idem_store *s, struct idem_load_info **info,
                      struct idem_load_info *dummy)
{
        if (!dir || !*dir || !s || s->loaded || s->lsn || strmap_size(s->map))
                return -EINVAL;
        if (!*info)
                *info = dummy;
        memset(*info, 0, sizeof(**info));
        return 0;
}

int idem_log_open(const char *dir, const struct kio *io, struct idem_store *s,
                  struct idem_log **out, struct idem_load_info *info)
{
        struct idem_load_info dummy;
        if (!out)
                return -EINVAL;
        *out = NULL;
        int r = load_begin(dir, s, &info, &dummy);
        if (r < 0)
                return r;

        struct idem_log *l = calloc(1, sizeof(*l));
        if (!l)
                return -ENOMEM;
        l->io = io ? io : kio_posix();
        l->fd = -1;
        l->now_ms = s->now_ms;
        l->clock_ctx = s->clock_ctx;
        l->dir = strdup(dir);
        size_t need = strlen(dir) + 1 + strlen(IDEM_LOG_NAME) + 1;
        l->path = malloc(need);
        r = -ENOMEM;
        if (!l->dir || !l->path)
                goto fail;
        snprintf(l->path, need, "%s/%s", dir, IDEM_LOG_NAME);
        if ((r = kio_mkdir_p(l->io, dir, STATEDIR_DIR_MODE)) < 0)
                goto fail;
        int fd = l->io->open(l->io->ctx, l->path,
                             O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0) {
                l->fd = fd;
                info->created = true;
                if ((r = l->io->fsync_dir(l->io->ctx, l->dir)) < 0)
                        goto fail;
        } else if (fd == -EEXIST) {
                if ((r = load_existing(l, s, info)) < 0)
                        goto fail;
        } else {
                r = fd;
                goto fail;
        }
        s->loaded = true;
        *out = l;
        return 0;
fail:
        idem_log_close(l);
        return r;
}

int idem_log_read(const char *dir, struct idem_store *s, struct idem_load_info *info)
{
        struct idem_load_info dummy;
        int r = load_begin(dir, s, &info, &dummy);
        if (r < 0)
                return r;
        char *path = NULL;
        if (asprintf(&path, "%s/%s", dir, IDEM_LOG_NAME) < 0)
                return -ENOMEM;
        char *data = NULL;
        size_t len = 0, good_end = 0;
        struct loader ld = { .s = s, .info = info };
        r = kio_read_file(path, LOG_MAX_BYTES, 0, &data, &len);
        free(path);
        if (r == -ENOENT) {
                info->created = true;
                s->loaded = true;
                return 0;
        }
        if (r < 0)
                return r;
        if (!(ld.arena = kjson_arena_new())) {
                r = -ENOMEM;
                goto out;
        }
        if ((r = replay(&ld, data, len, &good_end)) < 0 || (r = finish_load(s, info)) < 0)
                goto out;
        if (info->corrupt) {
                info->torn_bytes = 0;
                s->quarantined = true;
        } else {
                info->torn_bytes = len - good_end;
        }
        s->loaded = true;
        r = 0;
out:
        kjson_arena_free(ld.arena);
        free(data);
        return r;
}

int idem_log_close(struct idem_log *l)
{
        int r = 0;
        if (!l)
                return 0;
        if (l->fd >= 0)
                r = l->io->close(l->io->ctx, l->fd);
        FREE_ALL(l->dir, l->path, l);
        return r;
}

int idem_log_error(const struct idem_log *l)
{
        if (l->error)
                return l->error;
        return l->quarantined ? -EBADMSG : 0;
}

const char *idem_log_path(const struct idem_log *l)
{
        return l->path;
}

uint64_t idem_log_flush_count(const struct idem_log *l)
{
        return l->flushes;
}

int idem_log_append(struct idem_log *l, const void *data, size_t len)
{
        const struct kio *io = l->io;
        int r = idem_log_error(l);
        if (r < 0)
                return r;
        if (l->fd < 0)
                return -EBADF;
        if (len == 0)
                return 0;
        size_t written = 0;
        r = kio_write_all(io, l->fd, data, len, &written);
        if (r < 0) {
                /* a partial batch must not stay in front of later records */
                if (written > 0)
                        (void)io->ftruncate(io->ctx, l->fd, l->size);
                l->error = r;
                return r;
        }
        r = io->fdatasync(io->ctx, l->fd);
        l->flushes++;
        if (r < 0) {
                /* never fdatasync this descriptor again */
                l->error = r;
                return r;
        }
        l->size += (off_t)len;
        return 0;
}

static int copy_corrupt_aside(struct idem_log *l)
{
        char *data = NULL;
        size_t len = 0;
        char dest[4096];
        int r = kio_read_file(l->path, LOG_MAX_BYTES, 0, &data, &len);
        if (r == 0)
                r = save_aside(l, "corrupt", data, len, dest, sizeof(dest));
        free(data);
        return r;
}

int idem_log_compact(struct idem_log *l, const void *data, size_t len)
{
        const struct kio *io = l->io;
        if (l->error)
                return l->error;
        int r;
        if (l->quarantined && (r = copy_corrupt_aside(l)) < 0)
                return r;
        size_t need = strlen(l->path) + 5;
        char *tmp = malloc(need);
        if (!tmp)
                return -ENOMEM;
        snprintf(tmp, need, "%s.tmp", l->path);
        int fd = io->open(io->ctx, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0) {
                r = fd;
                goto out;
        }
        r = kio_write_all(io, fd, data, len, NULL);
        if (r == 0 && (r = io->fdatasync(io->ctx, fd)) == 0)
                l->flushes++;
        int rc = io->close(io->ctx, fd);
        if (r == 0)
                r = rc;
        if (r == 0)
                r = io->rename(io->ctx, tmp, l->path);
        if (r < 0) {
                /* the old log is untouched and stays in use */
                (void)io->unlink(io->ctx, tmp);
                goto out;
        }
        /* from here on the old descriptor points at the replaced file */
        if (l->fd >= 0)
                (void)io->close(io->ctx, l->fd);
        l->fd = -1;
        r = io->fsync_dir(io->ctx, l->dir);
        if (r == 0) {
                l->fd = open_append(l);
                if (l->fd < 0)
                        r = l->fd;
        }
        if (r < 0) {
                l->fd = -1;
                l->error = r;
                goto out;
        }
        l->size = (off_t)len;
        l->quarantined = false;
out:
        free(tmp);
        return r;
}

/* ---- blocking conveniences ---- */

int idem_sync(struct idem_store *s, struct idem_log *l)
{
        struct kbuf b = KBUF_INIT;
        uint64_t upto;
        int r = idem_take_pending(s, &b, &upto);
        if (r == 0 && b.len) {
                r = idem_log_append(l, b.data, b.len);
                if (r == 0)
                        idem_durable(s, upto);
                else
                        idem_set_failed(s, r);
        }
        kbuf_free(&b);
        return r;
}

int idem_compact_sync(struct idem_store *s, struct idem_log *l)
{
        struct kbuf b = KBUF_INIT;
        struct idem_snapshot snap;
        int r = idem_sync(s, l);
        if (r == 0)
                r = idem_snapshot(s, &b, &snap);
        if (r == 0)
                r = idem_log_compact(l, b.data ? b.data : "", b.len);
        if (r == 0)
                idem_compacted(s, &snap);
        else if (idem_log_error(l) < 0 && idem_log_error(l) != -EBADMSG)
                idem_set_failed(s, idem_log_error(l));
        kbuf_free(&b);
        return r;
}

