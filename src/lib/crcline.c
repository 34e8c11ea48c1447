/* SPDX-License-Identifier: MIT */
/* crcline: JSON lines sealed by a crc, the torn-tail rule and the corruption
 * verdict, shared by the WAL and the idempotency log (see crcline.h). */
#include "kairos/crcline.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <zlib.h>

#define KEY_IS(m, lit) \
        ((m)->key_len == sizeof(lit) - 1 && memcmp((m)->key, lit, sizeof(lit) - 1) == 0)

static bool is_lower_hex(unsigned char c)
{
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

bool crcline_has_suffix(const char *l, size_t n, uint32_t *ret_crc)
{
        if (n < CRCLINE_SUFFIX_LEN + 1)
                return false;
        const char *s = l + n - CRCLINE_SUFFIX_LEN;
        if (memcmp(s, ",\"crc\":\"", 8) != 0 || s[16] != '"' || s[17] != '}')
                return false;
        uint32_t v = 0;
        for (int i = 0; i < 8; i++) {
                unsigned char c = (unsigned char)s[8 + i];
                if (!is_lower_hex(c))
                        return false;
                v = (v << 4) | (uint32_t)(c <= '9' ? c - '0' : c - 'a' + 10);
        }
        *ret_crc = v;
        return true;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_CRC_FOLD 1

/* zlib's CRC-32 of whole 16-byte blocks (n >= 64, a multiple of 16) by
 * carry-less multiplication, folding 64 bytes at a time (Intel, "Fast CRC
 * Computation for Generic Polynomials Using PCLMULQDQ"; the bit-reflected
 * constants of the polynomial 0xEDB88320).  c is the running crc without
 * zlib's pre- and post-inversion.  Every line kairos writes or reads is
 * checked once; zlib's byte-wise crc32 was 6 % of startup recovery's CPU. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc_fold(uint32_t c,
                                                                  const unsigned char *p,
                                                                  size_t n)
{
        const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4);
        const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
        const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124);
        const __m128i poly = _mm_set_epi64x(0x01f7011641, 0x01db710641);
        const __m128i mask32 = _mm_setr_epi32(~0, 0, ~0, 0);
        __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8;

        x1 = _mm_loadu_si128((const __m128i *)(const void *)(p + 0x00));
        x2 = _mm_loadu_si128((const __m128i *)(const void *)(p + 0x10));
        x3 = _mm_loadu_si128((const __m128i *)(const void *)(p + 0x20));
        x4 = _mm_loadu_si128((const __m128i *)(const void *)(p + 0x30));
        x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)c));
        p += 64;
        n -= 64;
        x0 = k1k2;
        while (n >= 64) {
                x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
                x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
                x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
                x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
                x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
                x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
                x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
                x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
                x1 = _mm_xor_si128(_mm_xor_si128(x1, x5),
                                   _mm_loadu_si128((const __m128i *)(const void *)(p + 0x00)));
                x2 = _mm_xor_si128(_mm_xor_si128(x2, x6),
                                   _mm_loadu_si128((const __m128i *)(const void *)(p + 0x10)));
                x3 = _mm_xor_si128(_mm_xor_si128(x3, x7),
                                   _mm_loadu_si128((const __m128i *)(const void *)(p + 0x20)));
                x4 = _mm_xor_si128(_mm_xor_si128(x4, x8),
                                   _mm_loadu_si128((const __m128i *)(const void *)(p + 0x30)));
                p += 64;
                n -= 64;
        }
        /* four lanes into one */
        x0 = k3k4;
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
        while (n >= 16) {
                x2 = _mm_loadu_si128((const __m128i *)(const void *)p);
                x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
                x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
                x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
                p += 16;
                n -= 16;
        }
        /* 128 bits to 64 */
        x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
        x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
        x0 = k5k0;
        x2 = _mm_srli_si128(x1, 4);
        x1 = _mm_and_si128(x1, mask32);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_xor_si128(x1, x2);
        /* Barrett reduction to 32 bits */
        x0 = poly;
        x2 = _mm_and_si128(x1, mask32);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
        x2 = _mm_and_si128(x2, mask32);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x1 = _mm_xor_si128(x1, x2);
        return (uint32_t)_mm_extract_epi32(x1, 1);
}

static bool crc_fold_usable(void)
{
        static int usable = -1; /* (a benign race: every thread finds the same) */
        if (usable < 0)
                usable = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
        return usable;
}
#endif

static uLong crc_bytes(uLong c, const char *data, size_t n)
{
        const unsigned char *p = (const unsigned char *)data;
#ifdef HAVE_CRC_FOLD
        if (n >= 64 && crc_fold_usable()) {
                size_t whole = n & ~(size_t)15;
                c = ~crc_fold(~(uint32_t)c, p, whole) & 0xffffffffu;
                p += whole;
                n -= whole;
        }
#endif
        while (n > 0) {
                uInt chunk = n > UINT_MAX ? UINT_MAX : (uInt)n;
                c = crc32(c, p, chunk);
                p += chunk;
                n -= chunk;
        }
        return c;
}

uint32_t crcline_body_crc(const char *l, size_t n)
{
        uLong c = crc32(0L, Z_NULL, 0);
        c = crc_bytes(c, l, n - CRCLINE_SUFFIX_LEN);
        c = crc32(c, (const unsigned char *)"}", 1);
        return (uint32_t)c;
}

int crcline_seal(struct kbuf *b, size_t start)
{
        if (!b || start >= b->len || b->data[b->len - 1] != '}')
                return -EINVAL;
        uint32_t crc = (uint32_t)crc_bytes(crc32(0L, Z_NULL, 0), b->data + start,
                                           b->len - start);
        b->len--; /* the '}' was only for the crc */
        static const char hex[] = "0123456789abcdef";
        char s[] = ",\"crc\":\"00000000\"}\n";
        for (int i = 0; i < 8; i++)
                s[8 + i] = hex[(crc >> (28 - 4 * i)) & 15];
        return kbuf_append(b, s, sizeof s - 1);
}

int crcline_check(struct kjson_arena *arena, unsigned flags, const char *l, size_t n,
                  const struct kjson **ret_obj, bool *ret_legacy, char *reason, size_t rlen)
{
        struct kjson *v = NULL;
        struct kjson_error err = { 0 };
        uint32_t want = 0;
        size_t ncrc = 0;

        bool legacy = !crcline_has_suffix(l, n, &want);
        *ret_legacy = legacy;
        if (legacy && !(flags & CRCLINE_LEGACY)) {
                snprintf(reason, rlen, n < CRCLINE_SUFFIX_LEN + 1 ? "line too short"
                                                                  : "no crc field");
                return 0;
        }
        /* (a line this process sealed in memory a moment ago: its crc is
         * what the encoder computed, not computed again) */
        if (!legacy && !(flags & CRCLINE_OWN) && crcline_body_crc(l, n) != want) {
                snprintf(reason, rlen, "crc mismatch");
                return 0;
        }
        static const char *const own_raw[] = { "result", NULL };
        kjson_arena_reset(arena);
        int r = kjson_parse_trusted(arena, l, n, flags & CRCLINE_OWN ? own_raw : NULL, &v, &err);
        if (r == -ENOMEM || (r < 0 && err.code == KJSON_E_NOMEM))
                return -ENOMEM;
        if (r < 0) {
                snprintf(reason, rlen, "invalid JSON at column %zu: %s", err.offset + 1,
                         kjson_error_string(err.code));
                return 0;
        }
        if (v->type != KJSON_OBJECT) {
                snprintf(reason, rlen, "not a JSON object");
                return 0;
        }
        for (size_t i = 0; i < v->u.obj.n; i++)
                if (KEY_IS(&v->u.obj.members[i], "crc"))
                        ncrc++;
        if (!legacy) {
                /* the suffix guarantees the last member is the crc */
                if (ncrc != 1) {
                        snprintf(reason, rlen, "more than one crc field");
                        return 0;
                }
        } else {
                if (ncrc) {
                        snprintf(reason, rlen, "malformed crc field");
                        return 0;
                }
                if (v->u.obj.n == 0 || !KEY_IS(&v->u.obj.members[v->u.obj.n - 1], "ts")) {
                        snprintf(reason, rlen, "no crc and last field is not ts");
                        return 0;
                }
        }
        *ret_obj = v;
        return 1;
}

static bool is_blank(const char *l, size_t n)
{
        for (size_t i = 0; i < n; i++)
                if (l[i] != ' ' && l[i] != '\t' && l[i] != '\r')
                        return false;
        return true;
}

/* The last non-blank line, held back until we know nothing follows it. */
struct pending {
        bool set;
        bool terminated;
        bool good;          /* a whole good record, only its '\n' missing */
        const char *l;
        size_t n;
        size_t line;
        size_t offset;
        char reason[96];
};

/* Could the pending line be a strict prefix of one record (a torn write)? */
static int torn_prefix(struct crcline_scan *s, const struct pending *pb, bool *torn, char *why,
                       size_t wlen)
{
        struct kjson *v = NULL;
        struct kjson_error err = { 0 };
        size_t n = pb->n;

        *torn = false;
        if (pb->good) {
                *torn = true;
                snprintf(why, wlen, "torn tail: record without its newline");
                return 0;
        }
        while (n > 0 && pb->l[n - 1] == '\0')
                n--;
        if (is_blank(pb->l, n)) {
                *torn = !pb->terminated || n < pb->n;
                snprintf(why, wlen, "torn tail: %s", n < pb->n ? "NUL bytes" : "partial line");
                return 0;
        }
        if (n < pb->n) {
                /* a whole record, then zeros where its newline should be */
                const struct kjson *obj;
                bool legacy;
                char reason[96];
                int c = crcline_check(s->arena, s->flags, pb->l, n, &obj, &legacy, reason,
                                      sizeof(reason));
                if (c < 0)
                        return c;
                if (c == 1) {
                        *torn = true;
                        snprintf(why, wlen, "torn tail: record followed by NUL bytes");
                        return 0;
                }
        }
        /* every record starts with '{' */
        size_t i = 0;
        while (i < n && (pb->l[i] == ' ' || pb->l[i] == '\t'))
                i++;
        if (pb->l[i] != '{') {
                snprintf(why, wlen, "%s", pb->reason);
                return 0;
        }
        kjson_arena_reset(s->arena);
        int r = kjson_parse(s->arena, pb->l, n, &v, &err);
        if (r == 0) {
                /* a complete value that is not a good record */
                snprintf(why, wlen, "%s", pb->reason);
                return 0;
        }
        if (r == -ENOMEM || err.code == KJSON_E_NOMEM)
                return -ENOMEM;
        if (err.code == KJSON_E_EOF) {
                *torn = true;
                snprintf(why, wlen, "torn tail: incomplete record");
                return 0;
        }
        if (err.code == KJSON_E_TRAILING)
                snprintf(why, wlen, "complete record followed by more bytes (merged lines)");
        else
                snprintf(why, wlen, "%s", pb->reason);
        return 0;
}

static void set_bad(struct crcline_result *res, enum crcline_status st, size_t line,
                    size_t offset, const char *why)
{
        if (res->status == CRCLINE_CORRUPT && res->bad_line)
                return; /* the first bad line is the one to name */
        res->status = st;
        res->bad_line = line;
        res->bad_offset = offset;
        snprintf(res->bad_reason, sizeof(res->bad_reason), "%s", why);
}

/* A bad line in KEEP_GOING mode: reported, counted, and the scan goes on. */
static int report_bad(struct crcline_scan *s, struct crcline_result *res, const char *l, size_t n,
                      size_t line, size_t offset, const char *why)
{
        res->bad_lines++;
        set_bad(res, CRCLINE_CORRUPT, line, offset, why);
        return s->bad ? s->bad(s->ctx, l, n, line, offset, why) : 0;
}

/* The pending line at the end: torn or corrupt. */
static int settle_tail(struct crcline_scan *s, struct crcline_result *res, const struct pending *pb,
                       size_t len)
{
        char why[128];
        bool torn;
        int r = torn_prefix(s, pb, &torn, why, sizeof(why));
        if (r < 0)
                return r;
        if (torn) {
                if (res->status == CRCLINE_CLEAN)
                        set_bad(res, CRCLINE_TORN, pb->line, pb->offset, why);
                res->torn_bytes = len - pb->offset;
                return 0;
        }
        if (s->flags & CRCLINE_KEEP_GOING)
                return report_bad(s, res, pb->l, pb->n, pb->line, pb->offset,
                                  "unterminated line that is not a record prefix");
        res->bad_lines++;
        set_bad(res, CRCLINE_CORRUPT, pb->line, pb->offset, why);
        return 0;
}

int crcline_scan(struct crcline_scan *s, const char *data, size_t len, struct crcline_result *res)
{
        struct pending pb = { 0 };
        size_t pos = 0, line = 0;
        bool keep_going = s->flags & CRCLINE_KEEP_GOING;
        int r;

        memset(res, 0, sizeof(*res));
        res->status = CRCLINE_CLEAN;
        if (!data)
                len = 0;
        while (pos < len) {
                const char *l = data + pos;
                const char *nl = memchr(l, '\n', len - pos);
                size_t n = nl ? (size_t)(nl - l) : len - pos;
                size_t next = nl ? pos + n + 1 : len;
                bool terminated = nl != NULL;

                line++;
                if (terminated)
                        res->complete_end = next;
                if (n > 0 && l[n - 1] == '\r')
                        n--;
                if (is_blank(l, n)) {
                        if (!terminated && !pb.set) {
                                /* an unterminated run of whitespace: never append after it */
                                pb = (struct pending){ .set = true, .l = l, .n = n, .line = line,
                                                       .offset = pos };
                                snprintf(pb.reason, sizeof(pb.reason), "partial line");
                        }
                        pos = next;
                        continue;
                }
                if (pb.set) {
                        /* stop mode only: a bad line followed by another line */
                        char why[128];
                        snprintf(why, sizeof(why), "%s (followed by more records)", pb.reason);
                        res->bad_lines++;
                        set_bad(res, CRCLINE_CORRUPT, pb.line, pb.offset, why);
                        pb.set = false;
                        /* count the remaining lines, read nothing more */
                        for (pos = next; pos < len; line++) {
                                const char *q = memchr(data + pos, '\n', len - pos);
                                pos = q ? (size_t)(q - data) + 1 : len;
                        }
                        break;
                }

                uint32_t want;
                if (s->fast && terminated && !(s->flags & CRCLINE_OWN) &&
                    crcline_has_suffix(l, n, &want) && crcline_body_crc(l, n) == want) {
                        r = s->fast(s->ctx, l, n, line);
                        if (r < 0)
                                return r;
                        if (r == 1) {
                                res->records++;
                                res->good_end = next;
                                pos = next;
                                continue;
                        }
                }
                const struct kjson *obj = NULL;
                bool legacy = false;
                char reason[96];
                int c = crcline_check(s->arena, s->flags, l, n, &obj, &legacy, reason,
                                      sizeof(reason));
                if (c < 0)
                        return c;
                if (c == 1 && terminated) {
                        s->reject_reason = NULL;
                        r = s->record(s->ctx, obj, line, legacy);
                        if (r < 0)
                                return r;
                        if (r == 0) {
                                res->records++;
                                if (legacy)
                                        res->legacy_records++;
                                res->good_end = next;
                                pos = next;
                                continue;
                        }
                        /* CRCLINE_REJECT: a bad line like any other */
                        c = 0;
                        snprintf(reason, sizeof(reason), "%s",
                                 s->reject_reason ? s->reject_reason
                                                  : "record with missing or bad fields");
                }
                if (keep_going && terminated) {
                        if ((r = report_bad(s, res, l, n, line, pos, reason)) < 0)
                                return r;
                } else {
                        pb = (struct pending){ .set = true, .terminated = terminated,
                                               .good = c == 1, .l = l, .n = n, .line = line,
                                               .offset = pos };
                        snprintf(pb.reason, sizeof(pb.reason), "%s", reason);
                }
                pos = next;
        }
        res->lines = line;
        if (pb.set && (r = settle_tail(s, res, &pb, len)) < 0)
                return r;
        return 0;
}

const char *crcline_status_name(enum crcline_status s)
{
        switch (s) {
        case CRCLINE_CLEAN:
                return "clean";
        case CRCLINE_TORN:
                return "torn";
        case CRCLINE_CORRUPT:
                return "corrupt";
        }
        return "unknown";
}
