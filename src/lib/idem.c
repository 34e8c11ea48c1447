/* SPDX-License-Identifier: MIT */
/* idem: the persistent idempotency store (docs/design.md §11).  See idem.h for the
 * contract: an in-memory store that produces log records.  Its log, which
 * loads, appends and compacts them: idem_log.c. */
#include "kairos/idem.h"
#include "kairos/dlist.h"
#include "idem_internal.h"

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

/* ---- names and validation ---- */

const char *idem_state_name(enum idem_state st)
{
        static const char *const names[] = {
                [IDEM_ST_PROCESSING] = "processing", [IDEM_ST_COMPLETED] = "completed",
                [IDEM_ST_FAILED] = "failed", [IDEM_ST_INTERRUPTED] = "interrupted",
        };
        return ENUM_NAME(names, st, "unknown");
}

const char *idem_outcome_name(enum idem_outcome o)
{
        static const char *const names[] = {
                [IDEM_MISS] = "miss", [IDEM_PROCEED] = "proceed", [IDEM_HIT_COMPLETED] = "hit",
                [IDEM_HIT_FAILED] = "cached_error", [IDEM_IN_PROGRESS] = "in_progress",
                [IDEM_INTERRUPTED] = "interrupted", [IDEM_MISMATCH] = "mismatch",
                [IDEM_STORE_FULL] = "store_full",
        };
        return ENUM_NAME(names, o, "unknown");
}

static bool is_name_char(unsigned char c)
{
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '_' || c == '.' || c == '-';
}

/* [A-Za-z0-9_.-]{1,max} over exactly n bytes */
bool idem_valid_name(const char *s, size_t n, size_t max)
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
        if (!o || !idem_valid_name(o->mandate, strnlen(o->mandate, sizeof(o->mandate)),
                              IDEM_OWNER_ID_MAX) ||
            !idem_valid_name(o->step, strnlen(o->step, sizeof(o->step)), IDEM_OWNER_ID_MAX) ||
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

bool idem_valid_write_claim(const char *path, size_t path_len, const char *sha, size_t sha_len)
{
        if (!path || path_len == 0 || path_len > IDEM_WRITE_PATH_MAX ||
            memchr(path, '\0', path_len) || !sha || sha_len != IDEM_SHA256_HEX)
                return false;
        for (size_t i = 0; i < sha_len; i++)
                if (!((sha[i] >= '0' && sha[i] <= '9') || (sha[i] >= 'a' && sha[i] <= 'f')))
                        return false;
        return true;
}

/* The tree of a check (see idem_valid_check), or false. */
static bool check_tree_ok(const struct kjson *v)
{
        if (!v || v->type != KJSON_OBJECT)
                return false;
        const struct kjson *cmd = kjson_get(v, "cmd"), *argv = kjson_get(v, "argv");
        if (!cmd || cmd->type != KJSON_ARRAY || cmd->u.arr.n < 1 ||
            cmd->u.arr.n > IDEM_CHECK_WORDS || !argv || argv->type != KJSON_ARRAY)
                return false;
        for (size_t i = 0; i < cmd->u.arr.n; i++) {
                const struct kjson *w = cmd->u.arr.items[i];
                if (w->type != KJSON_STRING || w->u.str.len == 0 ||
                    memchr(w->u.str.ptr, '\0', w->u.str.len))
                        return false;
        }
        return true;
}

int idem_check_normalize(const char *json, size_t len, char **ret)
{
        *ret = NULL;
        if (!json || len == 0 || len > IDEM_CHECK_MAX)
                return -EINVAL;
        struct kjson_arena *a = kjson_arena_new();
        struct kjson *v = NULL;
        struct kjson_error err = { 0 };
        struct kbuf b = KBUF_INIT;
        int r = a ? kjson_parse(a, json, len, &v, &err) : -ENOMEM;
        if (r == 0 && !check_tree_ok(v))
                r = -EINVAL;
        if (r == 0)
                r = kjson_write(&b, v);
        if (r == 0 && b.len > IDEM_CHECK_MAX)
                r = -EINVAL;
        if (r == 0)
                *ret = kbuf_steal(&b);
        kbuf_free(&b);
        kjson_arena_free(a);
        return r == -ENOMEM || err.code == KJSON_E_NOMEM ? -ENOMEM : r < 0 ? -EINVAL : 0;
}

bool idem_valid_check(const char *json, size_t len)
{
        if (!json || len == 0 || len > IDEM_CHECK_MAX)
                return false;
        struct kjson_arena *a = kjson_arena_new();
        struct kjson *v = NULL;
        struct kjson_error err = { 0 };
        struct kbuf b = KBUF_INIT;
        bool ok = a && kjson_parse(a, json, len, &v, &err) == 0 && check_tree_ok(v) &&
                  kjson_write(&b, v) == 0 && b.len == len && memcmp(b.data, json, len) == 0;
        kbuf_free(&b);
        kjson_arena_free(a);
        return ok;
}

bool idem_valid_fp(const char *fp, size_t n)
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
bool idem_valid_full_key(const char *k, size_t n, size_t *tool_len)
{
        const char *colon = memchr(k, ':', n);
        if (!colon)
                return false;
        size_t t = (size_t)(colon - k);
        const char *rest = colon + 1;
        size_t rn = n - t - 1;
        if (!idem_valid_name(k, t, IDEM_TOOL_MAX))
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
        if (!idem_valid_name(req->tool, tl, IDEM_TOOL_MAX))
                return -EINVAL;
        size_t kl = 0;
        if (req->key) {
                kl = strlen(req->key);
                if (!valid_explicit_key(req->key, kl))
                        return -EINVAL;
        }
        if (req->fingerprint) {
                size_t fl = strlen(req->fingerprint);
                if (!idem_valid_fp(req->fingerprint, fl))
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
        DQUEUE_UNLINK(s->mru, s->lru, e);
        e->prev = e->next = NULL;
        e->in_lru = false;
}

static void lru_push_mru(struct idem_store *s, struct entry *e)
{
        lru_unlink(s, e);
        DQUEUE_PUSH_HEAD(s->mru, s->lru, e);
        e->in_lru = true;
}

/* Change state, keeping counts and LRU membership right. */
void idem_entry_set_state(struct idem_store *s, struct entry *e, enum idem_state st)
{
        s->count[e->state]--;
        e->state = st;
        s->count[st]++;
        if (is_finished(e))
                lru_push_mru(s, e);
        else
                lru_unlink(s, e);
}

void idem_entry_clear_payload(struct entry *e)
{
        FREE_ALL(e->result, e->error_class, e->error_msg, e->reason);
        e->result = NULL;
        e->result_len = 0;
        e->error_class = e->error_msg = e->reason = NULL;
}

static void entry_free(void *p)
{
        struct entry *e = p;
        if (!e)
                return;
        idem_entry_clear_payload(e);
        FREE_ALL(e->wpath, e->check, e);
}

/* A new entry in the map (state processing, counted). */
int idem_entry_add(struct idem_store *s, const char *key, size_t tool_len, const char *fp,
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

void idem_entry_drop(struct idem_store *s, struct entry *e)
{
        lru_unlink(s, e);
        strmap_remove(s->map, e->key);
        s->count[e->state]--;
        entry_free(e);
}

bool idem_entry_expired(const struct idem_store *s, const struct entry *e, int64_t now)
{
        return is_finished(e) && now - e->finished_ms >= s->ttl_ms;
}

/* The live entry for key: an expired one is dropped (a miss). */
static struct entry *find_live(struct idem_store *s, const char *key)
{
        struct entry *e = strmap_get(s->map, key);
        if (e && idem_entry_expired(s, e, store_now(s))) {
                idem_entry_drop(s, e);
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
        strmap_free_with(s->map, entry_free);
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
                if (e->check && ((r = kbuf_puts(b, ",\"check\":")) < 0 ||
                                 (r = kbuf_puts(b, e->check)) < 0))
                        goto fail;
                if (e->client.pid > 0 &&
                    (r = kbuf_printf(b, ",\"client\":{\"pid\":%d,\"start\":%llu}",
                                     (int)e->client.pid,
                                     (unsigned long long)e->client.start)) < 0)
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
        kbuf_truncate(b, start);
        return r;
}

static const char *const state_ops[] = {
        [IDEM_ST_PROCESSING] = "begin", [IDEM_ST_COMPLETED] = "complete",
        [IDEM_ST_FAILED] = "fail",      [IDEM_ST_INTERRUPTED] = "interrupt",
};

const char *idem_state_op(enum idem_state st)
{
        return ENUM_NAME(state_ops, st, "begin");
}

static const char *op_of(const struct entry *e)
{
        return idem_state_op(e->state);
}

bool idem_op_state(const char *op, enum idem_state *ret)
{
        for (size_t i = 0; i < sizeof state_ops / sizeof state_ops[0]; i++)
                if (state_ops[i] && strcmp(op, state_ops[i]) == 0) {
                        *ret = (enum idem_state)i;
                        return true;
                }
        return false;
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
                .client = e->client,
        };
        if (e->wpath)
                v->write = (struct idem_write_claim){ .path = e->wpath, .sha256 = e->wsha,
                                                      .bytes = e->wbytes };
        v->check = e->check;
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
                if (idem_entry_expired(s, e, now))
                        s->expirations++;
                else
                        s->evictions++;
                idem_entry_drop(s, e);
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
        if (req->write && !idem_valid_write_claim(req->write->path,
                                             req->write->path ? strlen(req->write->path) : 0,
                                             req->write->sha256,
                                             req->write->sha256 ? strlen(req->write->sha256) : 0))
                return -EINVAL;
        if (req->check && !idem_valid_check(req->check, strlen(req->check)))
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
        r = idem_entry_add(s, key, strlen(req->tool), fp, store_now(s), &e);
        if (r < 0)
                return r;
        if (req->owner)
                e->owner = *req->owner;
        if (req->client && req->client->pid > 0)
                e->client = *req->client;
        if (req->write) {
                if (!(e->wpath = strdup(req->write->path))) {
                        idem_entry_drop(s, e);
                        return -ENOMEM;
                }
                memcpy(e->wsha, req->write->sha256, IDEM_SHA256_HEX + 1);
                e->wbytes = req->write->bytes;
        }
        if (req->check && !(e->check = strdup(req->check))) {
                idem_entry_drop(s, e);
                return -ENOMEM;
        }
        r = emit(s, e, NULL, 0, NULL, lsn);
        if (r < 0) {
                idem_entry_drop(s, e);
                return r;
        }
        fill_view(s, e, v, false);
        return IDEM_PROCEED;
}

/* The entry of key that a call may finish: processing (settle: or
 * interrupted); *lsn zeroed first. */
static int entry_open(struct idem_store *s, const char *key, bool settle, uint64_t *lsn,
                      struct entry **out)
{
        if (lsn)
                *lsn = 0;
        if (!s)
                return -EINVAL;
        int r = writable(s);
        if (r < 0)
                return r;
        if (!key)
                return -EINVAL;
        struct entry *e = strmap_get(s->map, key);
        if (!e)
                return -ENOENT;
        if (e->state != IDEM_ST_PROCESSING && !(settle && e->state == IDEM_ST_INTERRUPTED))
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
        idem_entry_set_state(s, e, st);
        int r = emit(s, e, NULL, 0, NULL, lsn);
        if (r < 0) {
                idem_entry_set_state(s, e, old_state);
                e->finished_ms = old_finished;
                idem_entry_clear_payload(e);
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

/* processing (or, settling, interrupted) → completed; an interrupted
 * entry's reason goes with it, or stays when the record cannot be written. */
static int complete(struct idem_store *s, const char *key, bool settle, const void *result,
                    size_t len, uint64_t *lsn)
{
        struct entry *e;
        unsigned char *copy;
        int r = entry_open(s, key, settle, lsn, &e);
        if (r < 0 || (r = copy_result(result, len, &copy)) < 0)
                return r;
        enum idem_state old = e->state;
        char *reason = e->reason;
        e->reason = NULL;
        r = finish(s, e, IDEM_ST_COMPLETED, copy, len, NULL, NULL, lsn);
        if (r < 0) {
                idem_entry_set_state(s, e, old);
                e->reason = reason;
        } else {
                free(reason);
        }
        return r;
}

int idem_complete(struct idem_store *s, const char *key, const void *result, size_t len,
                  uint64_t *lsn)
{
        return complete(s, key, false, result, len, lsn);
}

int idem_fail(struct idem_store *s, const char *key, const char *error_class,
              const char *error_msg, const void *result, size_t len, uint64_t *lsn)
{
        struct entry *e;
        unsigned char *copy = NULL;
        if (lsn)
                *lsn = 0;
        if (!s || !error_class || !idem_valid_name(error_class, strlen(error_class), IDEM_CLASS_MAX))
                return -EINVAL;
        int r = entry_open(s, key, false, lsn, &e);
        if (r < 0 || (r = copy_result(result, len, &copy)) < 0)
                return r;
        char *cls = strdup(error_class);
        char *msg = clean_text(error_msg ? error_msg : "", IDEM_TEXT_MAX_CHARS);
        if (!cls || !msg) {
                FREE_ALL(copy, cls, msg);
                return -ENOMEM;
        }
        return finish(s, e, IDEM_ST_FAILED, copy, len, cls, msg, lsn);
}

int idem_interrupt(struct idem_store *s, const char *key, const char *reason, uint64_t *lsn)
{
        struct entry *e;
        int r = entry_open(s, key, false, lsn, &e);
        if (r < 0)
                return r;
        char *why = clean_text(reason ? reason : "caller_vanished", IDEM_TEXT_MAX_CHARS);
        if (!why)
                return -ENOMEM;
        e->reason = why;
        idem_entry_set_state(s, e, IDEM_ST_INTERRUPTED);
        r = emit(s, e, NULL, 0, NULL, lsn);
        if (r < 0) {
                idem_entry_set_state(s, e, IDEM_ST_PROCESSING);
                idem_entry_clear_payload(e);
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
        idem_entry_drop(s, e);
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
        int r = entry_open(s, key, false, lsn, &e);
        if (r < 0)
                return r;
        return drop_recorded(s, e, -1, reason, lsn);
}

int idem_settle_complete(struct idem_store *s, const char *key, const void *result, size_t len,
                         uint64_t *lsn)
{
        return complete(s, key, true, result, len, lsn);
}

int idem_settle_abandon(struct idem_store *s, const char *key, const char *reason,
                        uint64_t *lsn)
{
        struct entry *e;
        int r = entry_open(s, key, true, lsn, &e);
        if (r < 0)
                return r;
        return drop_recorded(s, e, -2, reason, lsn);
}

int idem_finish_late(struct idem_store *s, const char *key, const char *fp,
                     const char *error_class, const char *error_msg, const void *result,
                     size_t len, uint64_t *lsn)
{
        struct entry *e;
        unsigned char *copy = NULL;
        char *cls = NULL, *msg = NULL;
        if (lsn)
                *lsn = 0;
        if (!s || !fp ||
            (error_class && !idem_valid_name(error_class, strlen(error_class), IDEM_CLASS_MAX)))
                return -EINVAL;
        int r = entry_open(s, key, true, lsn, &e);
        if (r < 0)
                return r;
        if (e->state != IDEM_ST_INTERRUPTED)
                return -ESTALE;
        if (strcmp(e->fp, fp) != 0)
                return -EPERM;
        if ((r = copy_result(result, len, &copy)) < 0)
                return r;
        if (error_class) {
                cls = strdup(error_class);
                msg = clean_text(error_msg ? error_msg : "", IDEM_TEXT_MAX_CHARS);
                if (!cls || !msg) {
                        FREE_ALL(copy, cls, msg);
                        return -ENOMEM;
                }
        }
        char *why = e->reason;
        e->reason = NULL;
        r = finish(s, e, error_class ? IDEM_ST_FAILED : IDEM_ST_COMPLETED, copy, len, cls, msg,
                   lsn);
        if (r < 0)
                e->reason = why; /* still interrupted */
        else
                free(why);
        return r;
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
                if (idem_entry_expired(s, e, now)) {
                        idem_entry_drop(s, e);
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
                kbuf_truncate(out, start);
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

