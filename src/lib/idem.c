/* SPDX-License-Identifier: MIT */
/* idem: the persistent idempotency store (docs/design.md §11).  See idem.h for the
 * contract: an in-memory store that produces log records, and a log that
 * loads, appends and compacts them. */
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
#include "kairos/statedir.h"
#include "kairos/strmap.h"
#include "kairos/wal.h"

#define LOG_MAX_BYTES ((size_t)1 << 30)
#define B64 sodium_base64_VARIANT_ORIGINAL

struct entry {
        struct entry *prev, *next;      /* LRU list: completed/failed only */
        bool in_lru;
        enum idem_state state;
        int64_t created_ms;
        int64_t finished_ms;
        uint64_t lsn;                   /* its last record (0: loaded, durable) */
        unsigned char *result;
        size_t result_len;
        char *error_class;
        char *error_msg;
        char *reason;
        char tool[IDEM_TOOL_MAX + 1];
        char fp[CANON_HASH_STRLEN];     /* "" if unknown (salvaged from a bad line) */
        struct idem_step_owner owner;        /* owner.mandate "" if none */
        char *wpath;                    /* write claim: path, NULL if none */
        char wsha[IDEM_SHA256_HEX + 1];
        uint64_t wbytes;
        char key[];
};

struct idem_store {
        struct strmap *map;
        struct entry *mru, *lru;        /* LRU list ends */
        size_t count[4];
        int64_t ttl_ms;
        int64_t ttl_sec;
        size_t capacity;
        int64_t (*now_ms)(void *ctx);
        void *clock_ctx;
        struct kbuf pending;
        uint64_t lsn;
        uint64_t durable_lsn;
        uint64_t log_records;
        uint64_t hits, misses, conflicts, mismatches, evictions, expirations, full, forgets;
        bool quarantined;
        int error;
        bool loaded;
};

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

/* ---- names and validation ---- */

const char *idem_state_name(enum idem_state st)
{
        switch (st) {
        case IDEM_ST_PROCESSING:
                return "processing";
        case IDEM_ST_COMPLETED:
                return "completed";
        case IDEM_ST_FAILED:
                return "failed";
        case IDEM_ST_INTERRUPTED:
                return "interrupted";
        }
        return "unknown";
}

const char *idem_outcome_name(enum idem_outcome o)
{
        switch (o) {
        case IDEM_MISS:
                return "miss";
        case IDEM_PROCEED:
                return "proceed";
        case IDEM_HIT_COMPLETED:
                return "hit";
        case IDEM_HIT_FAILED:
                return "cached_error";
        case IDEM_IN_PROGRESS:
                return "in_progress";
        case IDEM_INTERRUPTED:
                return "interrupted";
        case IDEM_MISMATCH:
                return "mismatch";
        case IDEM_STORE_FULL:
                return "store_full";
        }
        return "unknown";
}

static bool is_name_char(unsigned char c)
{
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '_' || c == '.' || c == '-';
}

/* [A-Za-z0-9_.-]{1,max} over exactly n bytes */
static bool valid_name(const char *s, size_t n, size_t max)
{
        if (n == 0 || n > max)
                return false;
        for (size_t i = 0; i < n; i++)
                if (!is_name_char((unsigned char)s[i]))
                        return false;
        return true;
}

int idem_owner_check(const struct idem_step_owner *o)
{
        if (!o || !valid_name(o->mandate, strnlen(o->mandate, sizeof(o->mandate)),
                              IDEM_OWNER_ID_MAX) ||
            !valid_name(o->step, strnlen(o->step, sizeof(o->step)), IDEM_OWNER_ID_MAX) ||
            o->attempt == 0)
                return -EINVAL;
        return 0;
}

static bool valid_explicit_key(const char *k, size_t n)
{
        if (n == 0 || n > IDEM_KEY_MAX || !utf8_valid(k, n))
                return false;
        for (size_t i = 0; i < n; i++) {
                unsigned char c = (unsigned char)k[i];
                if (c < 0x20 || c == 0x7f)
                        return false;
        }
        return !(n >= 8 && memcmp(k, "content:", 8) == 0);
}

static bool is_lower_hex(unsigned char c)
{
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

static bool valid_write_claim(const char *path, size_t path_len, const char *sha, size_t sha_len)
{
        if (!path || path_len == 0 || path_len > IDEM_WRITE_PATH_MAX ||
            memchr(path, '\0', path_len) || !sha || sha_len != IDEM_SHA256_HEX)
                return false;
        for (size_t i = 0; i < sha_len; i++)
                if (!((sha[i] >= '0' && sha[i] <= '9') || (sha[i] >= 'a' && sha[i] <= 'f')))
                        return false;
        return true;
}

static bool valid_fp(const char *fp, size_t n)
{
        if (n != CANON_HASH_STRLEN - 1 || memcmp(fp, "sha256-", 7) != 0)
                return false;
        for (size_t i = 7; i < n; i++)
                if (!is_lower_hex((unsigned char)fp[i]))
                        return false;
        return true;
}

/* A full key: "<tool>:<explicit>" or "<tool>:content:<64 hex>".  *tool_len
 * receives the length of the tool part. */
static bool valid_full_key(const char *k, size_t n, size_t *tool_len)
{
        const char *colon = memchr(k, ':', n);
        if (!colon)
                return false;
        size_t t = (size_t)(colon - k);
        const char *rest = colon + 1;
        size_t rn = n - t - 1;
        if (!valid_name(k, t, IDEM_TOOL_MAX))
                return false;
        *tool_len = t;
        if (rn >= 8 && memcmp(rest, "content:", 8) == 0) {
                if (rn != 8 + 64)
                        return false;
                for (size_t i = 8; i < rn; i++)
                        if (!is_lower_hex((unsigned char)rest[i]))
                                return false;
                return true;
        }
        return valid_explicit_key(rest, rn);
}

/* Copy text as valid UTF-8 (invalid bytes → U+FFFD, control characters kept,
 * NUL cannot occur), at most max_chars code points. */
static char *clean_text(const char *s, size_t max_chars)
{
        struct kbuf b = KBUF_INIT;
        const unsigned char *p = (const unsigned char *)s;
        size_t n = strlen(s), chars = 0;
        int r = kbuf_reserve(&b, n + 1); /* data is never NULL below */

        for (size_t i = 0; r == 0 && i < n && chars < max_chars; chars++) {
                size_t l = p[i] < 0x80 ? 1 : utf8_seq_len(p + i, n - i);
                if (l == 0) {
                        r = kbuf_append(&b, "\xEF\xBF\xBD", 3);
                        i++;
                } else {
                        r = kbuf_append(&b, s + i, l);
                        i += l;
                }
        }
        if (r < 0) {
                kbuf_free(&b);
                return NULL;
        }
        return kbuf_steal(&b);
}

int idem_make_key(const struct idem_request *req, char key[IDEM_FULL_KEY_SIZE],
                  char fingerprint[CANON_HASH_STRLEN])
{
        if (!req || !req->tool)
                return -EINVAL;
        size_t tl = strlen(req->tool);
        if (!valid_name(req->tool, tl, IDEM_TOOL_MAX))
                return -EINVAL;
        size_t kl = 0;
        if (req->key) {
                kl = strlen(req->key);
                if (!valid_explicit_key(req->key, kl))
                        return -EINVAL;
        }
        if (req->fingerprint) {
                size_t fl = strlen(req->fingerprint);
                if (!valid_fp(req->fingerprint, fl))
                        return -EINVAL;
                memcpy(fingerprint, req->fingerprint, fl + 1);
        } else {
                if (!req->input_json)
                        return -EINVAL;
                int r = canon_hash_json(req->input_json, req->input_len, fingerprint, NULL);
                if (r < 0)
                        return r;
        }
        memcpy(key, req->tool, tl);
        key[tl] = ':';
        if (req->key) {
                memcpy(key + tl + 1, req->key, kl + 1);
        } else {
                memcpy(key + tl + 1, "content:", 8);
                memcpy(key + tl + 9, fingerprint + 7, 65); /* 64 hex + NUL */
        }
        return 0;
}

/* ---- the store: entries, LRU, counts ---- */

static int64_t default_now_ms(void *ctx)
{
        (void)ctx;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t store_now(const struct idem_store *s)
{
        return s->now_ms(s->clock_ctx);
}

static bool is_finished(const struct entry *e)
{
        return e->state == IDEM_ST_COMPLETED || e->state == IDEM_ST_FAILED;
}

static void lru_unlink(struct idem_store *s, struct entry *e)
{
        if (!e->in_lru)
                return;
        if (e->prev)
                e->prev->next = e->next;
        else
                s->mru = e->next;
        if (e->next)
                e->next->prev = e->prev;
        else
                s->lru = e->prev;
        e->prev = e->next = NULL;
        e->in_lru = false;
}

static void lru_push_mru(struct idem_store *s, struct entry *e)
{
        lru_unlink(s, e);
        e->prev = NULL;
        e->next = s->mru;
        if (s->mru)
                s->mru->prev = e;
        else
                s->lru = e;
        s->mru = e;
        e->in_lru = true;
}

/* Change state, keeping counts and LRU membership right. */
static void set_state(struct idem_store *s, struct entry *e, enum idem_state st)
{
        s->count[e->state]--;
        e->state = st;
        s->count[st]++;
        if (is_finished(e))
                lru_push_mru(s, e);
        else
                lru_unlink(s, e);
}

static void clear_payload(struct entry *e)
{
        free(e->result);
        free(e->error_class);
        free(e->error_msg);
        free(e->reason);
        e->result = NULL;
        e->result_len = 0;
        e->error_class = e->error_msg = e->reason = NULL;
}

static void entry_free(struct entry *e)
{
        if (!e)
                return;
        clear_payload(e);
        free(e->wpath);
        free(e);
}

/* A new entry in the map (state processing, counted). */
static int entry_add(struct idem_store *s, const char *key, size_t tool_len, const char *fp,
                     int64_t created_ms, struct entry **out)
{
        size_t kl = strlen(key);
        struct entry *e = calloc(1, sizeof(*e) + kl + 1);
        if (!e)
                return -ENOMEM;
        memcpy(e->key, key, kl + 1);
        memcpy(e->tool, key, tool_len);
        e->tool[tool_len] = '\0';
        snprintf(e->fp, sizeof(e->fp), "%s", fp ? fp : "");
        e->state = IDEM_ST_PROCESSING;
        e->created_ms = created_ms;
        int r = strmap_put(s->map, e->key, e);
        if (r < 0) {
                free(e);
                return r;
        }
        s->count[IDEM_ST_PROCESSING]++;
        *out = e;
        return 0;
}

static void entry_drop(struct idem_store *s, struct entry *e)
{
        lru_unlink(s, e);
        strmap_remove(s->map, e->key);
        s->count[e->state]--;
        entry_free(e);
}

static bool expired(const struct idem_store *s, const struct entry *e, int64_t now)
{
        return is_finished(e) && now - e->finished_ms >= s->ttl_ms;
}

/* The live entry for key: an expired one is dropped (a miss). */
static struct entry *find_live(struct idem_store *s, const char *key)
{
        struct entry *e = strmap_get(s->map, key);
        if (e && expired(s, e, store_now(s))) {
                entry_drop(s, e);
                s->expirations++;
                return NULL;
        }
        return e;
}

int idem_store_new(const struct idem_options *opt, struct idem_store **out)
{
        struct idem_options def = { 0 };
        if (!out)
                return -EINVAL;
        *out = NULL;
        if (!opt)
                opt = &def;
        if (opt->ttl_sec < 0 || opt->ttl_sec > INT64_MAX / 1000)
                return -EINVAL;
        int r = canon_init();
        if (r < 0)
                return r;
        struct idem_store *s = calloc(1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        s->map = strmap_new();
        if (!s->map) {
                free(s);
                return -ENOMEM;
        }
        s->ttl_sec = opt->ttl_sec ? opt->ttl_sec : IDEM_DEFAULT_TTL_SEC;
        s->ttl_ms = s->ttl_sec * 1000;
        s->capacity = opt->capacity ? opt->capacity : IDEM_DEFAULT_CAPACITY;
        s->now_ms = opt->now_ms ? opt->now_ms : default_now_ms;
        s->clock_ctx = opt->now_ms ? opt->clock_ctx : NULL;
        *out = s;
        return 0;
}

void idem_store_free(struct idem_store *s)
{
        if (!s)
                return;
        size_t pos = 0;
        const char *k;
        void *v;
        while (strmap_next(s->map, &pos, &k, &v) == 0)
                entry_free(v);
        strmap_free(s->map);
        kbuf_free(&s->pending);
        free(s);
}

/* ---- record encoding ---- */

static int put_b64(struct kbuf *b, const void *data, size_t n)
{
        if (n > IDEM_RESULT_MAX)
                return -EFBIG;
        size_t enc = sodium_base64_ENCODED_LEN(n, B64);
        int r = kbuf_putc(b, '"');
        if (r == 0)
                r = kbuf_reserve(b, enc + 1);
        if (r < 0)
                return r;
        sodium_bin2base64(b->data + b->len, enc, data ? data : (const void *)"", n, B64);
        b->len += enc - 1;
        return kbuf_putc(b, '"');
}

static int put_str(struct kbuf *b, const char *name, const char *v)
{
        int r = kbuf_printf(b, ",\"%s\":", name);
        if (r == 0)
                r = kbuf_json_string_lossy(b, v ? v : "", v ? strlen(v) : 0, 0);
        return r;
}

/* Append one record line for entry e under op (forget: uid and reason).
 * On failure nothing is appended. */
static int encode_record(struct kbuf *b, const char *op, const struct entry *e, long long uid,
                         const char *forget_reason, int64_t ts_ms)
{
        size_t start = b->len;
        char ts[32];
        int r;

        wal_format_ts(ts_ms, ts);
        r = kbuf_printf(b, "{\"op\":\"%s\"", op);
        if (r == 0)
                r = put_str(b, "key", e->key);
        if (r < 0)
                goto fail;
        if (strcmp(op, "forget") == 0) {
                if ((r = kbuf_printf(b, ",\"uid\":%lld", uid)) < 0 ||
                    (r = put_str(b, "reason", forget_reason)) < 0)
                        goto fail;
        } else {
                if ((r = put_str(b, "tool", e->tool)) < 0 || (r = put_str(b, "fp", e->fp)) < 0 ||
                    (r = kbuf_printf(b, ",\"created\":%lld", (long long)e->created_ms)) < 0)
                        goto fail;
                if (e->owner.mandate[0] &&
                    ((r = kbuf_printf(b, ",\"owner\":{\"mandate\":\"%s\",\"step\":\"%s\","
                                         "\"attempt\":%u}",
                                      e->owner.mandate, e->owner.step, e->owner.attempt)) < 0))
                        goto fail;
                if (e->wpath &&
                    ((r = kbuf_printf(b, ",\"write\":{\"sha256\":\"%s\",\"bytes\":%llu",
                                      e->wsha, (unsigned long long)e->wbytes)) < 0 ||
                     (r = put_str(b, "path", e->wpath)) < 0 || (r = kbuf_puts(b, "}")) < 0))
                        goto fail;
                if (is_finished(e) &&
                    (r = kbuf_printf(b, ",\"finished\":%lld", (long long)e->finished_ms)) < 0)
                        goto fail;
                if (e->state == IDEM_ST_FAILED &&
                    ((r = put_str(b, "error_class", e->error_class)) < 0 ||
                     (r = put_str(b, "error_msg", e->error_msg)) < 0))
                        goto fail;
                if (is_finished(e) && ((r = kbuf_puts(b, ",\"result\":")) < 0 ||
                                       (r = put_b64(b, e->result, e->result_len)) < 0))
                        goto fail;
                if (e->state == IDEM_ST_INTERRUPTED && (r = put_str(b, "reason", e->reason)) < 0)
                        goto fail;
        }
        if ((r = kbuf_printf(b, ",\"ts\":\"%s\"}", ts)) < 0 || (r = crcline_seal(b, start)) < 0)
                goto fail;
        return 0;
fail:
        b->len = start;
        if (b->data)
                b->data[start] = '\0';
        return r;
}

static const char *op_of(const struct entry *e)
{
        switch (e->state) {
        case IDEM_ST_PROCESSING:
                return "begin";
        case IDEM_ST_COMPLETED:
                return "complete";
        case IDEM_ST_FAILED:
                return "fail";
        case IDEM_ST_INTERRUPTED:
                return "interrupt";
        }
        return "begin";
}

/* Produce e's current-state record (or a forget) into pending. */
static int emit(struct idem_store *s, struct entry *e, const char *op, long long uid,
                const char *reason, uint64_t *lsn)
{
        int r = encode_record(&s->pending, op ? op : op_of(e), e, uid, reason, store_now(s));
        if (r < 0)
                return r;
        s->lsn++;
        s->log_records++;
        e->lsn = s->lsn;
        if (lsn)
                *lsn = s->lsn;
        return 0;
}

static int writable(const struct idem_store *s)
{
        if (s->error)
                return s->error;
        return s->quarantined ? -EBADMSG : 0;
}

/* ---- the operations ---- */

static void fill_view(const struct idem_store *s, const struct entry *e, struct idem_view *v,
                      bool cached)
{
        if (!v)
                return;
        *v = (struct idem_view){
                .key = e->key,
                .tool = e->tool,
                .fingerprint = e->fp,
                .state = e->state,
                .cached = cached,
                .durable = e->lsn <= s->durable_lsn,
                .created_ms = e->created_ms,
                .result = e->result,
                .result_len = e->result_len,
                .error_class = e->error_class,
                .error_msg = e->error_msg,
                .reason = e->reason,
                .owner = e->owner.mandate[0] ? &e->owner : NULL,
        };
        if (e->wpath)
                v->write = (struct idem_write_claim){ .path = e->wpath, .sha256 = e->wsha,
                                                      .bytes = e->wbytes };
        if (is_finished(e)) {
                v->finished_ms = e->finished_ms;
                v->expires_ms = e->finished_ms + s->ttl_ms;
                if (!v->result)
                        v->result = "";
        }
}

/* The decision for an existing live entry. */
static int decide(struct idem_store *s, struct entry *e, const char *fp, struct idem_view *v)
{
        if (e->fp[0] && strcmp(e->fp, fp) != 0) {
                s->mismatches++;
                fill_view(s, e, v, false);
                return IDEM_MISMATCH;
        }
        if (e->state == IDEM_ST_INTERRUPTED) {
                s->conflicts++;
                fill_view(s, e, v, false);
                return IDEM_INTERRUPTED;
        }
        if (e->state == IDEM_ST_PROCESSING || e->lsn > s->durable_lsn) {
                s->conflicts++;
                fill_view(s, e, v, false);
                return IDEM_IN_PROGRESS;
        }
        s->hits++;
        lru_push_mru(s, e);
        fill_view(s, e, v, true);
        return e->state == IDEM_ST_COMPLETED ? IDEM_HIT_COMPLETED : IDEM_HIT_FAILED;
}

int idem_lookup(struct idem_store *s, const struct idem_request *req, struct idem_view *v)
{
        char key[IDEM_FULL_KEY_SIZE], fp[CANON_HASH_STRLEN];
        if (!s)
                return -EINVAL;
        int r = idem_make_key(req, key, fp);
        if (r < 0)
                return r;
        struct entry *e = find_live(s, key);
        if (!e) {
                s->misses++;
                return IDEM_MISS;
        }
        return decide(s, e, fp, v);
}

/* Make room for one more entry: evict least recently used finished ones. */
static bool make_room(struct idem_store *s)
{
        int64_t now = store_now(s);
        while (strmap_size(s->map) >= s->capacity) {
                struct entry *e = s->lru;
                if (!e)
                        return false;
                if (expired(s, e, now))
                        s->expirations++;
                else
                        s->evictions++;
                entry_drop(s, e);
        }
        return true;
}

int idem_begin(struct idem_store *s, const struct idem_request *req, struct idem_view *v,
               uint64_t *lsn)
{
        char key[IDEM_FULL_KEY_SIZE], fp[CANON_HASH_STRLEN];
        if (lsn)
                *lsn = 0;
        if (!s)
                return -EINVAL;
        int r = idem_make_key(req, key, fp);
        if (r < 0)
                return r;
        if (req->owner && idem_owner_check(req->owner) < 0)
                return -EINVAL;
        if (req->write && !valid_write_claim(req->write->path,
                                             req->write->path ? strlen(req->write->path) : 0,
                                             req->write->sha256,
                                             req->write->sha256 ? strlen(req->write->sha256) : 0))
                return -EINVAL;
        struct entry *e = find_live(s, key);
        if (e)
                return decide(s, e, fp, v);
        if ((r = writable(s)) < 0)
                return r;
        s->misses++;
        if (!make_room(s)) {
                s->full++;
                return IDEM_STORE_FULL;
        }
        r = entry_add(s, key, strlen(req->tool), fp, store_now(s), &e);
        if (r < 0)
                return r;
        if (req->owner)
                e->owner = *req->owner;
        if (req->write) {
                if (!(e->wpath = strdup(req->write->path))) {
                        entry_drop(s, e);
                        return -ENOMEM;
                }
                memcpy(e->wsha, req->write->sha256, IDEM_SHA256_HEX + 1);
                e->wbytes = req->write->bytes;
        }
        r = emit(s, e, NULL, 0, NULL, lsn);
        if (r < 0) {
                entry_drop(s, e);
                return r;
        }
        fill_view(s, e, v, false);
        return IDEM_PROCEED;
}

static int processing_entry(struct idem_store *s, const char *key, struct entry **out)
{
        int r = writable(s);
        if (r < 0)
                return r;
        if (!key)
                return -EINVAL;
        struct entry *e = strmap_get(s->map, key);
        if (!e)
                return -ENOENT;
        if (e->state != IDEM_ST_PROCESSING)
                return -ESTALE;
        *out = e;
        return 0;
}

/* processing → completed/failed with the given payload (taken over). */
static int finish(struct idem_store *s, struct entry *e, enum idem_state st,
                  unsigned char *result, size_t len, char *cls, char *msg, uint64_t *lsn)
{
        enum idem_state old_state = e->state;
        int64_t old_finished = e->finished_ms;

        e->result = result;
        e->result_len = len;
        e->error_class = cls;
        e->error_msg = msg;
        e->finished_ms = store_now(s);
        set_state(s, e, st);
        int r = emit(s, e, NULL, 0, NULL, lsn);
        if (r < 0) {
                set_state(s, e, old_state);
                e->finished_ms = old_finished;
                clear_payload(e);
        }
        return r;
}

static int copy_result(const void *result, size_t len, unsigned char **out)
{
        *out = NULL;
        if (len > IDEM_RESULT_MAX)
                return -EFBIG;
        if (len == 0)
                return 0;
        if (!result)
                return -EINVAL;
        *out = malloc(len);
        if (!*out)
                return -ENOMEM;
        memcpy(*out, result, len);
        return 0;
}

int idem_complete(struct idem_store *s, const char *key, const void *result, size_t len,
                  uint64_t *lsn)
{
        struct entry *e;
        unsigned char *copy;
        if (lsn)
                *lsn = 0;
        if (!s)
                return -EINVAL;
        int r = processing_entry(s, key, &e);
        if (r < 0 || (r = copy_result(result, len, &copy)) < 0)
                return r;
        return finish(s, e, IDEM_ST_COMPLETED, copy, len, NULL, NULL, lsn);
}

int idem_fail(struct idem_store *s, const char *key, const char *error_class,
              const char *error_msg, const void *result, size_t len, uint64_t *lsn)
{
        struct entry *e;
        unsigned char *copy = NULL;
        if (lsn)
                *lsn = 0;
        if (!s || !error_class || !valid_name(error_class, strlen(error_class), IDEM_CLASS_MAX))
                return -EINVAL;
        int r = processing_entry(s, key, &e);
        if (r < 0 || (r = copy_result(result, len, &copy)) < 0)
                return r;
        char *cls = strdup(error_class);
        char *msg = clean_text(error_msg ? error_msg : "", IDEM_TEXT_MAX_CHARS);
        if (!cls || !msg) {
                free(copy);
                free(cls);
                free(msg);
                return -ENOMEM;
        }
        return finish(s, e, IDEM_ST_FAILED, copy, len, cls, msg, lsn);
}

int idem_interrupt(struct idem_store *s, const char *key, const char *reason, uint64_t *lsn)
{
        struct entry *e;
        if (lsn)
                *lsn = 0;
        if (!s)
                return -EINVAL;
        int r = processing_entry(s, key, &e);
        if (r < 0)
                return r;
        char *why = clean_text(reason ? reason : "caller_vanished", IDEM_TEXT_MAX_CHARS);
        if (!why)
                return -ENOMEM;
        e->reason = why;
        set_state(s, e, IDEM_ST_INTERRUPTED);
        r = emit(s, e, NULL, 0, NULL, lsn);
        if (r < 0) {
                set_state(s, e, IDEM_ST_PROCESSING);
                clear_payload(e);
        }
        return r;
}

/* Drop e with a forget record (uid, reason) in the log. */
static int drop_recorded(struct idem_store *s, struct entry *e, long long uid, const char *reason,
                         uint64_t *lsn)
{
        char *why = clean_text(reason ? reason : "", IDEM_TEXT_MAX_CHARS);
        if (!why)
                return -ENOMEM;
        int r = emit(s, e, "forget", uid, why, lsn);
        free(why);
        if (r < 0)
                return r;
        entry_drop(s, e);
        return 0;
}

int idem_forget(struct idem_store *s, const char *key, long long uid, const char *reason,
                uint64_t *lsn)
{
        if (lsn)
                *lsn = 0;
        if (!s || !key)
                return -EINVAL;
        int r = writable(s);
        if (r < 0)
                return r;
        struct entry *e = strmap_get(s->map, key);
        if (!e)
                return -ENOENT;
        if (e->state == IDEM_ST_PROCESSING)
                return -EBUSY;
        r = drop_recorded(s, e, uid, reason, lsn);
        if (r == 0)
                s->forgets++;
        return r;
}

int idem_abandon(struct idem_store *s, const char *key, const char *reason, uint64_t *lsn)
{
        struct entry *e;
        if (lsn)
                *lsn = 0;
        if (!s)
                return -EINVAL;
        int r = processing_entry(s, key, &e);
        if (r < 0)
                return r;
        return drop_recorded(s, e, -1, reason, lsn);
}

/* An entry settle may decide: processing or interrupted. */
static int open_entry(struct idem_store *s, const char *key, struct entry **out)
{
        int r = writable(s);
        if (r < 0)
                return r;
        if (!key)
                return -EINVAL;
        struct entry *e = strmap_get(s->map, key);
        if (!e)
                return -ENOENT;
        if (e->state != IDEM_ST_PROCESSING && e->state != IDEM_ST_INTERRUPTED)
                return -ESTALE;
        *out = e;
        return 0;
}

int idem_settle_complete(struct idem_store *s, const char *key, const void *result, size_t len,
                         uint64_t *lsn)
{
        struct entry *e;
        unsigned char *copy;
        if (lsn)
                *lsn = 0;
        if (!s)
                return -EINVAL;
        int r = open_entry(s, key, &e);
        if (r < 0 || (r = copy_result(result, len, &copy)) < 0)
                return r;
        enum idem_state old = e->state;
        char *reason = e->reason;
        e->reason = NULL;
        r = finish(s, e, IDEM_ST_COMPLETED, copy, len, NULL, NULL, lsn);
        if (r < 0) {
                set_state(s, e, old);
                e->reason = reason;
        } else {
                free(reason);
        }
        return r;
}

int idem_settle_abandon(struct idem_store *s, const char *key, const char *reason,
                        uint64_t *lsn)
{
        struct entry *e;
        if (lsn)
                *lsn = 0;
        if (!s)
                return -EINVAL;
        int r = open_entry(s, key, &e);
        if (r < 0)
                return r;
        return drop_recorded(s, e, -2, reason, lsn);
}

int idem_get(struct idem_store *s, const char *key, struct idem_view *v)
{
        if (!s || !key)
                return -EINVAL;
        struct entry *e = find_live(s, key);
        if (!e)
                return -ENOENT;
        fill_view(s, e, v, false);
        return 0;
}

int idem_foreach(struct idem_store *s, int (*fn)(const struct idem_view *v, void *ctx), void *ctx)
{
        size_t pos = 0;
        const char *k;
        void *val;
        if (!s || !fn)
                return -EINVAL;
        while (strmap_next(s->map, &pos, &k, &val) == 0) {
                struct idem_view v;
                fill_view(s, val, &v, false);
                int r = fn(&v, ctx);
                if (r)
                        return r;
        }
        return 0;
}

size_t idem_sweep(struct idem_store *s)
{
        size_t n = 0;
        int64_t now = store_now(s);
        for (struct entry *e = s->lru, *prev; e; e = prev) {
                prev = e->prev;
                if (expired(s, e, now)) {
                        entry_drop(s, e);
                        s->expirations++;
                        n++;
                }
        }
        return n;
}

void idem_stats(const struct idem_store *s, struct idem_stats *st)
{
        *st = (struct idem_stats){
                .size = strmap_size(s->map),
                .capacity = s->capacity,
                .ttl_sec = s->ttl_sec,
                .processing = s->count[IDEM_ST_PROCESSING],
                .completed = s->count[IDEM_ST_COMPLETED],
                .failed = s->count[IDEM_ST_FAILED],
                .interrupted = s->count[IDEM_ST_INTERRUPTED],
                .hits = s->hits,
                .misses = s->misses,
                .conflicts = s->conflicts,
                .mismatches = s->mismatches,
                .evictions = s->evictions,
                .expirations = s->expirations,
                .store_full = s->full,
                .forgets = s->forgets,
                .log_records = s->log_records,
                .lsn = s->lsn,
                .durable_lsn = s->durable_lsn,
                .quarantined = s->quarantined,
                .error = s->error,
        };
}

/* ---- record handoff, compaction ---- */

size_t idem_pending_bytes(const struct idem_store *s)
{
        return s->pending.len;
}

int idem_take_pending(struct idem_store *s, struct kbuf *out, uint64_t *upto_lsn)
{
        *upto_lsn = 0;
        if (s->pending.len == 0)
                return 0;
        if (out->len == 0) {
                struct kbuf tmp = *out;
                *out = s->pending;
                s->pending = tmp;
                kbuf_reset(&s->pending);
        } else {
                int r = kbuf_append(out, s->pending.data, s->pending.len);
                if (r < 0)
                        return r;
                kbuf_reset(&s->pending);
        }
        *upto_lsn = s->lsn;
        return 0;
}

void idem_durable(struct idem_store *s, uint64_t lsn)
{
        if (lsn > s->lsn)
                lsn = s->lsn;
        if (lsn > s->durable_lsn)
                s->durable_lsn = lsn;
}

void idem_set_failed(struct idem_store *s, int err)
{
        if (!s->error)
                s->error = err < 0 ? err : -EIO;
}

bool idem_needs_compaction(const struct idem_store *s)
{
        return !s->quarantined && !s->error && s->log_records >= IDEM_COMPACT_MIN_RECORDS &&
               s->log_records > 2 * (uint64_t)strmap_size(s->map);
}

int idem_snapshot(struct idem_store *s, struct kbuf *out, struct idem_snapshot *snap)
{
        if (s->pending.len)
                return -EBUSY;
        if (s->error)
                return s->error;
        idem_sweep(s);
        size_t start = out->len, pos = 0;
        uint64_t n = 0;
        int64_t now = store_now(s);
        const char *k;
        void *v;
        int r = 0;

        while (r == 0 && strmap_next(s->map, &pos, &k, &v) == 0) {
                struct entry *e = v;
                if (!is_finished(e) && (r = encode_record(out, op_of(e), e, 0, NULL, now)) == 0)
                        n++;
        }
        for (struct entry *e = s->lru; r == 0 && e; e = e->prev)
                if ((r = encode_record(out, op_of(e), e, 0, NULL, now)) == 0)
                        n++;
        if (r < 0) {
                out->len = start;
                if (out->data)
                        out->data[start] = '\0';
                return r;
        }
        snap->lsn = s->lsn;
        snap->records = n;
        return 0;
}

void idem_compacted(struct idem_store *s, const struct idem_snapshot *snap)
{
        s->log_records = snap->records + (s->lsn - snap->lsn);
        idem_durable(s, snap->lsn);
        s->quarantined = false;
}

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
                return entry_add(s, key, tool_len, fp, created, out);
        clear_payload(e);
        memcpy(e->tool, key, tool_len);
        e->tool[tool_len] = '\0';
        snprintf(e->fp, sizeof(e->fp), "%s", fp ? fp : "");
        e->created_ms = created;
        e->finished_ms = 0;
        e->owner = (struct idem_step_owner){ 0 };
        free(e->wpath);
        e->wpath = NULL;
        *out = e;
        return 0;
}

/* The optional write claim of a record into e: 0 (absent, or kept),
 * -EINVAL, -ENOMEM. */
static int get_write(const struct kjson *obj, char **ret_path, char sha[IDEM_SHA256_HEX + 1],
                     uint64_t *ret_bytes)
{
        *ret_path = NULL;
        const struct kjson *v = kjson_get(obj, "write");
        if (!v)
                return 0;
        if (v->type != KJSON_OBJECT)
                return -EINVAL;
        const struct kjson *p = get_cstr(v, "path"), *h = get_cstr(v, "sha256");
        int64_t bytes = -1;
        if (!p || !h || !get_i64(v, "bytes", &bytes) || bytes < 0 ||
            !valid_write_claim(p->u.str.ptr, p->u.str.len, h->u.str.ptr, h->u.str.len))
                return -EINVAL;
        if (!(*ret_path = strdup(p->u.str.ptr)))
                return -ENOMEM;
        memcpy(sha, h->u.str.ptr, IDEM_SHA256_HEX + 1);
        *ret_bytes = (uint64_t)bytes;
        return 0;
}

/* The optional owner of a record: 0 (absent: *o cleared, or valid), -EINVAL. */
static int get_owner(const struct kjson *obj, struct idem_step_owner *o)
{
        *o = (struct idem_step_owner){ 0 };
        const struct kjson *v = kjson_get(obj, "owner");
        if (!v)
                return 0;
        if (v->type != KJSON_OBJECT)
                return -EINVAL;
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
        enum idem_state st;
        if (strcmp(op, "begin") == 0)
                st = IDEM_ST_PROCESSING;
        else if (strcmp(op, "complete") == 0)
                st = IDEM_ST_COMPLETED;
        else if (strcmp(op, "fail") == 0)
                st = IDEM_ST_FAILED;
        else if (strcmp(op, "interrupt") == 0)
                st = IDEM_ST_INTERRUPTED;
        else if (is_forget)
                st = IDEM_ST_PROCESSING;
        else
                return 0;
        if (!key || !valid_full_key(key->u.str.ptr, key->u.str.len, &tool_len))
                return -EINVAL;
        if (is_forget) {
                struct entry *e = strmap_get(s->map, key->u.str.ptr);
                if (e)
                        entry_drop(s, e);
                return 1;
        }
        const struct kjson *tool = get_cstr(obj, "tool");
        const struct kjson *fp = get_cstr(obj, "fp");
        int64_t created = 0, finished = 0;
        /* an interrupted entry salvaged from a bad line has no known fingerprint */
        if (!tool || tool->u.str.len != tool_len ||
            memcmp(tool->u.str.ptr, key->u.str.ptr, tool_len) != 0 || !fp ||
            !(valid_fp(fp->u.str.ptr, fp->u.str.len) ||
              (st == IDEM_ST_INTERRUPTED && fp->u.str.len == 0)) ||
            !get_i64(obj, "created", &created))
                return -EINVAL;

        unsigned char *result = NULL;
        size_t result_len = 0;
        char *cls = NULL, *msg = NULL, *reason = NULL;
        struct idem_step_owner owner;
        char *wpath = NULL, wsha[IDEM_SHA256_HEX + 1];
        uint64_t wbytes = 0;
        int r = get_owner(obj, &owner);
        if (r < 0 || (r = get_write(obj, &wpath, wsha, &wbytes)) < 0)
                return r;
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
                if (!c || !m || !valid_name(c->u.str.ptr, c->u.str.len, IDEM_CLASS_MAX))
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
        e->wpath = wpath;
        if (wpath) {
                memcpy(e->wsha, wsha, sizeof wsha);
                e->wbytes = wbytes;
        }
        e->finished_ms = finished;
        e->lsn = 0;
        set_state(s, e, st);
        return 1;
out:
        free(result);
        free(cls);
        free(msg);
        free(reason);
        free(wpath);
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
        if (!key || !valid_full_key(key->u.str.ptr, key->u.str.len, &tool_len))
                return 0;
        struct entry *e = strmap_get(ld->s->map, key->u.str.ptr);
        if (!e && (r = entry_add(ld->s, key->u.str.ptr, tool_len, NULL, 0, &e)) < 0)
                return r;
        clear_payload(e);
        e->reason = strdup("corrupt_record");
        if (!e->reason)
                return -ENOMEM;
        e->finished_ms = 0;
        set_state(ld->s, e, IDEM_ST_INTERRUPTED);
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
                set_state(s, e, IDEM_ST_INTERRUPTED);
                info->interrupted++;
        }
        info->expired = idem_sweep(s);
        while (strmap_size(s->map) > s->capacity && s->lru) {
                entry_drop(s, s->lru);
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
        int r = kio_write_all(io, fd, bytes, n, NULL);
        if (r == 0)
                r = io->fdatasync(io->ctx, fd);
        int rc = io->close(io->ctx, fd);
        if (r == 0)
                r = rc;
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

int idem_log_open(const char *dir, const struct kio *io, struct idem_store *s,
                  struct idem_log **out, struct idem_load_info *info)
{
        struct idem_load_info dummy;
        if (!dir || !*dir || !s || !out)
                return -EINVAL;
        *out = NULL;
        if (s->loaded || s->lsn || strmap_size(s->map))
                return -EINVAL;
        if (!info)
                info = &dummy;
        memset(info, 0, sizeof(*info));

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
        int r = -ENOMEM;
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
        if (!dir || !*dir || !s)
                return -EINVAL;
        if (s->loaded || s->lsn || strmap_size(s->map))
                return -EINVAL;
        if (!info)
                info = &dummy;
        memset(info, 0, sizeof(*info));
        char *path = NULL;
        if (asprintf(&path, "%s/%s", dir, IDEM_LOG_NAME) < 0)
                return -ENOMEM;
        char *data = NULL;
        size_t len = 0, good_end = 0;
        struct loader ld = { .s = s, .info = info };
        int r = kio_read_file(path, LOG_MAX_BYTES, 0, &data, &len);
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
        free(l->dir);
        free(l->path);
        free(l);
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
