/* SPDX-License-Identifier: MIT */
/* canon: canonical JSON and content hashes (docs/design.md §4). */
#include "kairos/canon.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

int canon_init(void)
{
        return sodium_init() < 0 ? -EIO : 0;
}

static void hash_string(const unsigned char h[crypto_hash_sha256_BYTES],
                        char out[CANON_HASH_STRLEN])
{
        static const char hex[] = "0123456789abcdef";

        memcpy(out, "sha256-", 7);
        for (size_t i = 0; i < crypto_hash_sha256_BYTES; i++) {
                out[7 + 2 * i] = hex[h[i] >> 4];
                out[7 + 2 * i + 1] = hex[h[i] & 15];
        }
        out[7 + 2 * crypto_hash_sha256_BYTES] = '\0';
}

void canon_hash_bytes(const void *data, size_t len, char out[CANON_HASH_STRLEN])
{
        unsigned char h[crypto_hash_sha256_BYTES];

        crypto_hash_sha256(h, data ? data : (const void *)"", len);
        hash_string(h, out);
}

/* ------------------------------------------------------------- doubles */

/* Shortest decimal digits that read back as d (d finite, > 0): digits
 * without trailing zeros into dig (NUL-terminated), *decpt such that
 * d = 0.DIGITS x 10^decpt.  Among candidates of the shortest length the one
 * nearest to d wins, as dtoa mode 0 does. */
static void shortest_digits(double d, char dig[32], int *decpt)
{
        char buf[40];

        for (int prec = 1; prec <= 17; prec++) {
                snprintf(buf, sizeof(buf), "%.*e", prec - 1, d);
                /* buf: D[.DDD]e±XX */
                char *e = strchr(buf, 'e');
                int exp10 = atoi(e + 1);
                size_t n = 0;
                for (char *p = buf; p < e; p++)
                        if (*p != '.')
                                dig[n++] = *p;
                dig[n] = '\0';
                bool ok = strtod(buf, NULL) == d;
                if (!ok && prec < 17) {
                        /* The correctly rounded candidate can fall outside
                         * the rounding interval on its narrow side (d a power
                         * of two) while its neighbour on the wide side lies
                         * inside: try both neighbours. */
                        for (int dir = -1; dir <= 1 && !ok; dir += 2) {
                                char cand[32];
                                int cexp = exp10;
                                memcpy(cand, dig, n + 1);
                                int i = (int)n - 1;
                                if (dir > 0) {
                                        while (i >= 0 && cand[i] == '9')
                                                cand[i--] = '0';
                                        if (i < 0) {
                                                /* 99..9 + 1 = 100..0 */
                                                cand[0] = '1';
                                                cexp++;
                                        } else {
                                                cand[i]++;
                                        }
                                } else {
                                        while (i >= 0 && cand[i] == '0')
                                                cand[i--] = '9';
                                        if (i < 0)
                                                continue;
                                        cand[i]--;
                                        if (cand[0] == '0') {
                                                /* 10..0 - 1 = 99..9, one digit less */
                                                memmove(cand, cand + 1, n);
                                                cand[n - 1] = '9';
                                                cand[n] = '\0';
                                                cexp--;
                                        }
                                }
                                char tb[48];
                                snprintf(tb, sizeof(tb), "%c.%se%d", cand[0], cand + 1, cexp);
                                if (strtod(tb, NULL) == d) {
                                        memcpy(dig, cand, n + 1);
                                        exp10 = cexp;
                                        ok = true;
                                }
                        }
                }
                if (ok) {
                        while (n > 1 && dig[n - 1] == '0')
                                dig[--n] = '\0';
                        *decpt = exp10 + 1;
                        return;
                }
        }
        /* %.16e always round-trips; not reached */
        *decpt = 0;
}

/* d = [-]0.DIG x 10^decpt written as Ruby's flo_to_s does: fixed notation
 * when the point falls inside the digits, or for up to DBL_DIG (15) integer
 * digits, or for 0.000ddd; exponent form otherwise. */
static int format_digits(bool neg, const char *dig, int decpt, struct kbuf *out)
{
        char tmp[64];
        size_t k = 0;
        int n = (int)strlen(dig);

        if (neg)
                tmp[k++] = '-';
        if (decpt > 0 && (decpt < n || decpt <= 15)) {
                for (int i = 0; i < decpt; i++)
                        tmp[k++] = i < n ? dig[i] : '0';
                tmp[k++] = '.';
                if (decpt < n) {
                        for (int i = decpt; i < n; i++)
                                tmp[k++] = dig[i];
                } else {
                        tmp[k++] = '0';
                }
        } else if (decpt <= 0 && decpt > -4) {
                tmp[k++] = '0';
                tmp[k++] = '.';
                for (int i = 0; i < -decpt; i++)
                        tmp[k++] = '0';
                for (int i = 0; i < n; i++)
                        tmp[k++] = dig[i];
        } else {
                tmp[k++] = dig[0];
                tmp[k++] = '.';
                if (n > 1) {
                        for (int i = 1; i < n; i++)
                                tmp[k++] = dig[i];
                } else {
                        tmp[k++] = '0';
                }
                k += (size_t)snprintf(tmp + k, sizeof(tmp) - k, "e%+03d", decpt - 1);
        }
        return kbuf_append(out, tmp, k);
}

int canon_format_double(double d, struct kbuf *out)
{
        char dig[32];
        int decpt;

        if (!isfinite(d))
                return -EDOM;
        if (d == 0)
                return kbuf_puts(out, signbit(d) ? "-0.0" : "0.0");
        shortest_digits(fabs(d), dig, &decpt);
        return format_digits(d < 0, dig, decpt, out);
}

/* The shortest digits of a JSON number's text without converting it: a
 * decimal of at most DBL_DIG (15) significant digits, well inside the normal
 * range, reads back from the double it denotes (C11 5.2.4.2.2), and no other
 * decimal of 15 digits or fewer denotes the same double; so its own digits
 * (without leading and trailing zeros) are the shortest ones, the ones
 * shortest_digits finds from the double.  false: not such a text (more
 * digits, zero, an exponent out of range, not a number): convert it. */
static bool text_digits(const char *t, size_t n, bool *ret_neg, char dig[32], int *ret_decpt)
{
        size_t i = 0, k = 0;
        int point = 0, lead = 0;
        bool seen = false;
        *ret_neg = n && t[0] == '-';
        i = *ret_neg;
        if (i >= n || t[i] < '0' || t[i] > '9')
                return false;
        for (int part = 0; part < 2; part++) {
                if (part == 1) {
                        if (i >= n || t[i] != '.')
                                break;
                        if (++i >= n || t[i] < '0' || t[i] > '9')
                                return false;
                }
                for (; i < n && t[i] >= '0' && t[i] <= '9'; i++) {
                        if (part == 0)
                                point++;
                        if (!seen && t[i] == '0') {
                                lead++;
                                continue;
                        }
                        seen = true;
                        if (k == 31)
                                return false;
                        dig[k++] = t[i];
                }
        }
        if (!seen)
                return false;
        long exp10 = 0;
        if (i < n && (t[i] == 'e' || t[i] == 'E')) {
                bool eneg = false;
                if (++i < n && (t[i] == '+' || t[i] == '-'))
                        eneg = t[i++] == '-';
                size_t e0 = i;
                for (; i < n && t[i] >= '0' && t[i] <= '9' && i - e0 < 6; i++)
                        exp10 = exp10 * 10 + (t[i] - '0');
                if (i == e0)
                        return false;
                exp10 = eneg ? -exp10 : exp10;
        }
        if (i != n)
                return false;
        while (k > 1 && dig[k - 1] == '0')
                k--;
        if (k > 15)
                return false;
        dig[k] = '\0';
        long decpt = point - lead + exp10;
        if (decpt < -290 || decpt > 290)
                return false;
        *ret_decpt = (int)decpt;
        return true;
}

/* ------------------------------------------------------------ canonical */

static bool volatile_key(const char *k, size_t n)
{
        /* "timestamp", "ts", "request_id", "trace_id", "nonce": told apart
         * by their length first (a key is checked once per member) */
        switch (n) {
        case 2:
                return memcmp(k, "ts", 2) == 0;
        case 5:
                return memcmp(k, "nonce", 5) == 0;
        case 8:
                return memcmp(k, "trace_id", 8) == 0;
        case 9:
                return memcmp(k, "timestamp", 9) == 0;
        case 10:
                return memcmp(k, "request_id", 10) == 0;
        default:
                return false;
        }
}

static int key_cmp(const struct kjson_member *a, const struct kjson_member *b)
{
        size_t n = a->key_len < b->key_len ? a->key_len : b->key_len;
        int c = n ? memcmp(a->key, b->key, n) : 0;
        if (c)
                return c;
        return (a->key_len > b->key_len) - (a->key_len < b->key_len);
}

struct member_ref {
        const struct kjson_member *m;
        size_t index;
};

/* An object's members in canonical order: qsort for many, an insertion
 * sort for a few (the same total order; no qsort buffer, no call per
 * comparison through libc's merge sort). */
#define SORT_SMALL_MAX 16
#define SORT_ELEM_MAX 64
static void sort_members(void *base, size_t n, size_t size,
                         int (*cmp)(const void *, const void *))
{
        if (n > SORT_SMALL_MAX || size > SORT_ELEM_MAX) {
                qsort(base, n, size, cmp);
                return;
        }
        unsigned char *v = base, x[SORT_ELEM_MAX];
        for (size_t i = 1; i < n; i++) {
                memcpy(x, v + i * size, size);
                size_t j = i;
                for (; j > 0 && cmp(v + (j - 1) * size, x) > 0; j--)
                        memcpy(v + j * size, v + (j - 1) * size, size);
                memcpy(v + j * size, x, size);
        }
}

static int member_ref_cmp(const void *pa, const void *pb)
{
        const struct member_ref *a = pa, *b = pb;
        int c = key_cmp(a->m, b->m);
        if (c)
                return c;
        return (a->index > b->index) - (a->index < b->index);
}

static int write_number(struct kbuf *out, const struct kjson *v)
{
        const char *t = v->u.num.text;
        size_t n = v->u.num.len;

        if (!t || n == 0)
                return -EINVAL;
        if (!v->u.num.is_float) {
                if (n == 2 && t[0] == '-' && t[1] == '0')
                        return kbuf_putc(out, '0');
                return kbuf_append(out, t, n);
        }
        char dig[32];
        int decpt;
        bool neg;
        if (text_digits(t, n, &neg, dig, &decpt))
                return format_digits(neg, dig, decpt, out);
        /* strtod needs a terminated copy: the tree may not come from kjson */
        char small[64];
        char *buf = n < sizeof(small) ? small : malloc(n + 1);
        if (!buf)
                return -ENOMEM;
        memcpy(buf, t, n);
        buf[n] = '\0';
        char *end;
        double d = strtod(buf, &end);
        bool whole = end == buf + n;
        if (buf != small)
                free(buf);
        if (!whole)
                return -EINVAL;
        return canon_format_double(d, out);
}

/* canon_hash_value hashes the canonical text as it is written: what the
 * buffer holds goes to the hash whenever it passes CANON_SPILL bytes, so a
 * result of 1 MiB is never held whole (nor its pages touched). */
#define CANON_SPILL (32u * 1024u)
/* The buffer's first size: a plan or a marker hashes a few KiB, and a
 * buffer of 2 * CANON_SPILL is past malloc's mmap threshold (an mmap, page
 * faults and a munmap per hash); a bigger text grows it by doubling. */
#define CANON_FIRST (4096u - 1u)

static void spill(struct kbuf *out, crypto_hash_sha256_state *st)
{
        if (st && out->len >= CANON_SPILL) {
                crypto_hash_sha256_update(st, (const unsigned char *)out->data, out->len);
                out->len = 0;
        }
}

static int write_canon(struct kbuf *out, const struct kjson *v, int depth,
                       crypto_hash_sha256_state *st);

static int write_object(struct kbuf *out, const struct kjson *v, int depth,
                        crypto_hash_sha256_state *st)
{
        size_t n = v->u.obj.n;
        /* most objects are small: their members sorted on the stack */
        struct member_ref small[16];
        struct member_ref *refs = small;
        size_t k = 0;
        int r;

        if (n > sizeof(small) / sizeof(small[0]) && !(refs = malloc(n * sizeof(*refs))))
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                const struct kjson_member *m = &v->u.obj.members[i];
                if (!m->key && m->key_len) {
                        r = -EINVAL;
                        goto out;
                }
                if (!volatile_key(m->key, m->key_len))
                        refs[k++] = (struct member_ref){ m, i };
        }
        sort_members(refs, k, sizeof(*refs), member_ref_cmp);

        bool first = true;
        if ((r = kbuf_putc(out, '{')) < 0)
                goto out;
        for (size_t i = 0; i < k; i++) {
                /* duplicate keys: the last one in document order wins */
                if (i + 1 < k && key_cmp(refs[i].m, refs[i + 1].m) == 0)
                        continue;
                if (!first && (r = kbuf_putc(out, ',')) < 0)
                        goto out;
                first = false;
                const struct kjson_member *m = refs[i].m;
                if ((r = kbuf_json_string(out, m->key ? m->key : "", m->key_len)) < 0 ||
                    (r = kbuf_putc(out, ':')) < 0 ||
                    (r = write_canon(out, m->value, depth + 1, st)) < 0)
                        goto out;
                spill(out, st);
        }
        r = kbuf_putc(out, '}');
out:
        if (refs != small)
                free(refs);
        return r;
}

static int write_canon(struct kbuf *out, const struct kjson *v, int depth,
                       crypto_hash_sha256_state *st)
{
        int r;

        if (!v || depth > KJSON_MAX_DEPTH)
                return -EINVAL;
        switch (v->type) {
        case KJSON_NULL:
                return kbuf_append(out, "null", 4);
        case KJSON_FALSE:
                return kbuf_append(out, "false", 5);
        case KJSON_TRUE:
                return kbuf_append(out, "true", 4);
        case KJSON_NUMBER:
                return write_number(out, v);
        case KJSON_STRING:
                return kbuf_json_string(out, v->u.str.ptr ? v->u.str.ptr : "", v->u.str.len);
        case KJSON_ARRAY:
                if ((r = kbuf_putc(out, '[')) < 0)
                        return r;
                for (size_t i = 0; i < v->u.arr.n; i++) {
                        if (i && (r = kbuf_putc(out, ',')) < 0)
                                return r;
                        if ((r = write_canon(out, v->u.arr.items[i], depth + 1, st)) < 0)
                                return r;
                        spill(out, st);
                }
                return kbuf_putc(out, ']');
        case KJSON_OBJECT:
                return write_object(out, v, depth, st);
        case KJSON_RAW:
                return -EINVAL; /* unparsed text has no canonical form here */
        }
        return -EINVAL;
}

int canon_write(struct kbuf *out, const struct kjson *v)
{
        size_t start = out->len;
        int r = write_canon(out, v, 0, NULL);
        if (r < 0) {
                out->len = start;
                if (out->data)
                        out->data[start] = '\0';
        }
        return r;
}

int canon_json(const char *text, size_t len, struct kbuf *out, struct kjson_error *err)
{
        struct kjson_arena *a = kjson_arena_new();
        struct kjson *v;
        int r;

        if (!a)
                return -ENOMEM;
        r = kjson_parse(a, text, len, &v, err);
        if (r == 0)
                r = canon_write(out, v);
        kjson_arena_free(a);
        return r;
}

int canon_hash_value(const struct kjson *v, char out[CANON_HASH_STRLEN])
{
        struct kbuf b = KBUF_INIT;
        crypto_hash_sha256_state st;
        unsigned char h[crypto_hash_sha256_BYTES];
        int r = kbuf_reserve(&b, CANON_FIRST);
        if (r == 0) {
                crypto_hash_sha256_init(&st);
                r = write_canon(&b, v, 0, &st);
        }
        if (r == 0) {
                crypto_hash_sha256_update(&st, (const unsigned char *)b.data, b.len);
                crypto_hash_sha256_final(&st, h);
                hash_string(h, out);
        }
        kbuf_free(&b);
        return r;
}

int canon_hash_json(const char *text, size_t len, char out[CANON_HASH_STRLEN],
                    struct kjson_error *err)
{
        struct kjson_arena *a = kjson_arena_new();
        struct kjson *v;
        int r;

        if (!a)
                return -ENOMEM;
        r = kjson_parse(a, text, len, &v, err);
        if (r == 0)
                r = canon_hash_value(v, out);
        kjson_arena_free(a);
        return r;
}

/* ------------------------------------------- compact text, without a tree */

/* canon_hash_compact reads the text once and writes the canonical form as
 * it goes: a string, number or literal is its own canonical text (numbers
 * through write_number), an array is its items in order, and an object is
 * its members as written, reordered at its close only when they are not
 * already sorted, unique and free of volatile keys.  Anything outside the
 * compact form (whitespace, an escape kbuf_json_string does not write, a
 * backslash in a key) or outside JSON gives up: -EAGAIN, and the caller
 * parses the text (kjson) and hashes the tree, which says what is wrong. */

#define CANON_FAST_MEMBERS 32
#define CANON_FAST_OUT 2048

struct fast_member {
        const unsigned char *key; /* in the text: no escapes */
        size_t key_len;
        size_t off, len;          /* "key":value in the output */
        size_t index;
        bool drop;                /* a volatile key */
};


struct fast {
        const unsigned char *p, *end;
        struct kbuf out;
        crypto_hash_sha256_state st;
        struct fast_member *ms;   /* small's until it outgrows it */
        size_t mtop, mcap;
        struct fast_member *small;
        int max_depth;
        int open_objects;         /* while one is open, nothing is hashed yet */
        bool out_heap;            /* out outgrew the caller's stack buffer */
};

/* out: the kbuf functions, but its first bytes on canon_hash_compact's
 * stack (a malloc and a free per hash otherwise) */
static int out_reserve(struct fast *F, size_t extra)
{
        struct kbuf *b = &F->out;
        if (extra > SIZE_MAX - b->len - 1)
                return -ENOMEM;
        size_t need = b->len + extra + 1;
        if (need <= b->cap)
                return 0;
        size_t ncap = b->cap;
        while (ncap < need)
                ncap = ncap > SIZE_MAX / 2 ? need : 2 * ncap;
        char *nd = F->out_heap ? realloc(b->data, ncap) : malloc(ncap);
        if (!nd)
                return -ENOMEM;
        if (!F->out_heap)
                memcpy(nd, b->data, b->len + 1);
        F->out_heap = true;
        b->data = nd;
        b->cap = ncap;
        return 0;
}

static int out_append(struct fast *F, const void *p, size_t n)
{
        if (out_reserve(F, n) < 0)
                return -ENOMEM;
        memcpy(F->out.data + F->out.len, p, n);
        F->out.len += n;
        F->out.data[F->out.len] = '\0';
        return 0;
}

static int out_putc(struct fast *F, char c)
{
        return out_append(F, &c, 1);
}

#define GIVE_UP (-EAGAIN)

static int fast_value(struct fast *F, int depth);

/* The string at F->p (its opening quote): past it, and whether it holds a
 * backslash.  Only the escapes kbuf_json_string writes are taken (so its
 * text is its canonical text). */
static int fast_string(struct fast *F, bool *ret_escaped)
{
        const unsigned char *p = F->p + 1, *end = F->end;
        bool escaped = false;
        for (;;) {
                while (p < end && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\')
                        p++;
                if (p >= end || *p < 0x20)
                        return GIVE_UP;
                if (*p == '"')
                        break;
                if (*p == '\\') {
                        escaped = true;
                        if (end - p < 2)
                                return GIVE_UP;
                        unsigned char e = p[1];
                        if (e == '"' || e == '\\' || e == 'b' || e == 'f' || e == 'n' ||
                            e == 'r' || e == 't') {
                                p += 2;
                                continue;
                        }
                        /* \u00XX below 0x20, lowercase, not a one-letter one */
                        if (e != 'u' || end - p < 6 || p[2] != '0' || p[3] != '0' ||
                            (p[4] != '0' && p[4] != '1'))
                                return GIVE_UP;
                        unsigned char x = p[5];
                        int lo = x >= '0' && x <= '9' ? x - '0'
                                 : x >= 'a' && x <= 'f' ? x - 'a' + 10 : -1;
                        int cp = (p[4] - '0') * 16 + lo;
                        if (lo < 0 || cp == '\b' || cp == '\t' || cp == '\n' || cp == '\f' ||
                            cp == '\r')
                                return GIVE_UP;
                        p += 6;
                        continue;
                }
                /* a UTF-8 sequence (p[0] >= 0x80) as kjson accepts it */
                size_t l = utf8_seq_len(p, (size_t)(end - p));
                if (!l)
                        return GIVE_UP;
                p += l;
        }
        F->p = p + 1;
        *ret_escaped = escaped;
        return 0;
}

static int fast_number(struct fast *F)
{
        const unsigned char *s = F->p, *p = s, *end = F->end;
        bool is_float = false;
        if (p < end && *p == '-')
                p++;
        if (p < end && *p == '0') {
                p++;
        } else if (p < end && *p >= '1' && *p <= '9') {
                while (p < end && *p >= '0' && *p <= '9')
                        p++;
        } else {
                return GIVE_UP;
        }
        if (p < end && *p == '.') {
                is_float = true;
                if (++p >= end || *p < '0' || *p > '9')
                        return GIVE_UP;
                while (p < end && *p >= '0' && *p <= '9')
                        p++;
        }
        if (p < end && (*p == 'e' || *p == 'E')) {
                is_float = true;
                if (++p < end && (*p == '+' || *p == '-'))
                        p++;
                if (p >= end || *p < '0' || *p > '9')
                        return GIVE_UP;
                while (p < end && *p >= '0' && *p <= '9')
                        p++;
        }
        struct kjson v = { .type = KJSON_NUMBER };
        v.u.num.text = (const char *)s;
        v.u.num.len = (size_t)(p - s);
        v.u.num.is_float = is_float;
        F->p = p;
        return write_number(&F->out, &v) < 0 ? GIVE_UP : 0;
}

static int fast_literal(struct fast *F, const char *lit, size_t n)
{
        if ((size_t)(F->end - F->p) < n || memcmp(F->p, lit, n) != 0)
                return GIVE_UP;
        F->p += n;
        return out_append(F, lit, n) < 0 ? GIVE_UP : 0;
}

static int fast_member_cmp(const void *pa, const void *pb)
{
        const struct fast_member *a = pa, *b = pb;
        size_t n = a->key_len < b->key_len ? a->key_len : b->key_len;
        int c = n ? memcmp(a->key, b->key, n) : 0;
        if (c)
                return c;
        if (a->key_len != b->key_len)
                return a->key_len < b->key_len ? -1 : 1;
        return (a->index > b->index) - (a->index < b->index);
}

static bool same_key(const struct fast_member *a, const struct fast_member *b)
{
        return a->key_len == b->key_len && memcmp(a->key, b->key, a->key_len) == 0;
}

/* The object's members ms[base..] are in the output from start on, as
 * written: in canonical order as they are, or rewritten so. */
static int fast_object_close(struct fast *F, size_t base, size_t start)
{
        struct fast_member *m = F->ms + base;
        size_t n = F->mtop - base;
        /* sorted, no key twice, none volatile: as written */
        bool in_order = true;
        for (size_t i = 0; i < n && in_order; i++) {
                if (m[i].drop) {
                        in_order = false;
                } else if (i) {
                        size_t k = m[i - 1].key_len < m[i].key_len ? m[i - 1].key_len
                                                                   : m[i].key_len;
                        int c = k ? memcmp(m[i - 1].key, m[i].key, k) : 0;
                        in_order = c < 0 || (c == 0 && m[i - 1].key_len < m[i].key_len);
                }
        }
        if (in_order)
                return out_putc(F, '}') < 0 ? GIVE_UP : 0;
        sort_members(m, n, sizeof(*m), fast_member_cmp);
        /* the object again after the output (room made once: it is no
         * longer than the members as written), then moved down to start */
        size_t at = F->out.len;
        if (out_reserve(F, at - start + 2) < 0)
                return GIVE_UP;
        char *d = F->out.data + at, *o = F->out.data;
        *d++ = '{';
        for (size_t i = 0; i < n; i++) {
                /* duplicate keys: the last one in document order wins */
                if (m[i].drop || (i + 1 < n && same_key(&m[i], &m[i + 1])))
                        continue;
                if (d[-1] != '{')
                        *d++ = ',';
                memcpy(d, o + m[i].off, m[i].len);
                d += m[i].len;
        }
        *d++ = '}';
        size_t len = (size_t)(d - (o + at));
        memmove(o + start, o + at, len);
        F->out.len = start + len;
        o[F->out.len] = '\0';
        return 0;
}

static int fast_object(struct fast *F, int depth)
{
        size_t start = F->out.len, base = F->mtop;
        int r = GIVE_UP;
        F->p++;
        F->open_objects++;
        if (out_putc(F, '{') < 0)
                goto out;
        if (F->p < F->end && *F->p == '}') {
                F->p++;
                r = out_putc(F, '}') < 0 ? GIVE_UP : 0;
                goto out;
        }
        for (size_t index = 0;; index++) {
                if (F->p >= F->end || *F->p != '"')
                        goto out;
                const unsigned char *key = F->p + 1;
                bool escaped;
                if (fast_string(F, &escaped) < 0 || escaped || F->p >= F->end || *F->p != ':')
                        goto out;
                size_t key_len = (size_t)(F->p - 1 - key);
                if (index && out_putc(F, ',') < 0)
                        goto out;
                size_t off = F->out.len;
                if (out_append(F, key - 1, key_len + 2) < 0 ||
                    out_putc(F, ':') < 0)
                        goto out;
                F->p++;
                if (fast_value(F, depth) < 0)
                        goto out;
                if (F->mtop == F->mcap) {
                        size_t ncap = F->mcap ? 2 * F->mcap : 64;
                        struct fast_member *nm =
                                F->ms == F->small ? malloc(ncap * sizeof(*nm))
                                                  : realloc(F->ms, ncap * sizeof(*nm));
                        if (!nm)
                                goto out;
                        if (F->ms == F->small)
                                memcpy(nm, F->small, F->mtop * sizeof(*nm));
                        F->ms = nm;
                        F->mcap = ncap;
                }
                F->ms[F->mtop++] = (struct fast_member){
                        key, key_len, off, F->out.len - off, index,
                        volatile_key((const char *)key, key_len) };
                if (F->p >= F->end)
                        goto out;
                if (*F->p == '}')
                        break;
                if (*F->p++ != ',')
                        goto out;
        }
        F->p++;
        r = fast_object_close(F, base, start);
out:
        F->mtop = base;
        F->open_objects--;
        return r;
}

static void fast_spill(struct fast *F)
{
        if (!F->open_objects && F->out.len >= CANON_SPILL) {
                crypto_hash_sha256_update(&F->st, (const unsigned char *)F->out.data,
                                          F->out.len);
                F->out.len = 0;
        }
}

static int fast_array(struct fast *F, int depth)
{
        F->p++;
        if (out_putc(F, '[') < 0)
                return GIVE_UP;
        if (F->p < F->end && *F->p == ']') {
                F->p++;
                return out_putc(F, ']') < 0 ? GIVE_UP : 0;
        }
        for (;;) {
                if (fast_value(F, depth) < 0)
                        return GIVE_UP;
                fast_spill(F);
                if (F->p >= F->end)
                        return GIVE_UP;
                if (*F->p == ']')
                        break;
                if (*F->p++ != ',' || out_putc(F, ',') < 0)
                        return GIVE_UP;
        }
        F->p++;
        return out_putc(F, ']') < 0 ? GIVE_UP : 0;
}

/* depth: the containers around this value */
static int fast_value(struct fast *F, int depth)
{
        if (F->p >= F->end)
                return GIVE_UP;
        switch (*F->p) {
        case '{':
                return depth + 1 > F->max_depth ? GIVE_UP : fast_object(F, depth + 1);
        case '[':
                return depth + 1 > F->max_depth ? GIVE_UP : fast_array(F, depth + 1);
        case '"': {
                const unsigned char *s = F->p;
                bool escaped;
                if (fast_string(F, &escaped) < 0)
                        return GIVE_UP;
                return out_append(F, s, (size_t)(F->p - s)) < 0 ? GIVE_UP : 0;
        }
        case 't':
                return fast_literal(F, "true", 4);
        case 'f':
                return fast_literal(F, "false", 5);
        case 'n':
                return fast_literal(F, "null", 4);
        default:
                return fast_number(F);
        }
}

int canon_hash_compact(const char *text, size_t len, int max_depth,
                       char out[CANON_HASH_STRLEN])
{
        /* the members of the objects open at once: on the stack unless
         * there are many (a malloc and a free per hash otherwise) */
        struct fast_member small[CANON_FAST_MEMBERS];
        char first_bytes[CANON_FAST_OUT];
        first_bytes[0] = '\0';
        struct fast F = { .p = (const unsigned char *)text,
                          .end = (const unsigned char *)text + len,
                          .out = { first_bytes, 0, sizeof first_bytes },
                          .max_depth = max_depth, .ms = small, .mcap = CANON_FAST_MEMBERS,
                          .small = small };
        unsigned char h[crypto_hash_sha256_BYTES];
        /* the canonical text of a compact one is about as long: room for
         * it, up to the spill */
        size_t first = len < 2 * CANON_SPILL ? len : 2 * CANON_SPILL;
        int r = text && len && out_reserve(&F, first) == 0 ? 0 : GIVE_UP;
        if (r == 0) {
                crypto_hash_sha256_init(&F.st);
                r = fast_value(&F, 0);
        }
        if (r == 0 && F.p != F.end)
                r = GIVE_UP;
        if (r == 0) {
                crypto_hash_sha256_update(&F.st, (const unsigned char *)F.out.data, F.out.len);
                crypto_hash_sha256_final(&F.st, h);
                hash_string(h, out);
        }
        if (F.out_heap)
                free(F.out.data);
        if (F.ms != small)
                free(F.ms);
        return r;
}
