/* SPDX-License-Identifier: MIT */
/* Fuzz target: kjson parser, canonicalizer and hashes.
 *
 * Invariants checked (abort() on violation):
 * - parse errors have a known code and an offset within the input;
 * - the parser's error classes are consistent: the bytes before a SYNTAX,
 *   UTF8 or DEPTH error are a strict prefix of a valid document (EOF), the
 *   bytes before a TRAILING error are a complete value, and every strict
 *   prefix of a complete non-number value is EOF (a torn tail is never
 *   mistaken for corruption, nor the reverse);
 * - kjson_write output re-parses and writes back identically;
 * - canonicalization succeeds or fails with -EDOM only; the canonical form
 *   re-parses, canonicalizes to the same bytes, and its hash is the hash of
 *   those bytes, whichever entry point computes it;
 * - the one-pass hash of compact text agrees with the tree's (check_compact). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kairos/canon.h"
#include "kairos/kbuf.h"
#include "kairos/kjson.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                     \
        do {                            \
                if (!(cond))            \
                        abort();        \
        } while (0)

static enum kjson_error_code parse_code(struct kjson_arena *a, const char *s, size_t n)
{
        struct kjson *v;
        struct kjson_error err;
        /* an exact-size copy, so that reads past n are caught */
        char *copy = malloc(n ? n : 1);
        CHECK(copy);
        if (n)
                memcpy(copy, s, n);
        kjson_arena_reset(a);
        int r = kjson_parse(a, copy, n, &v, &err);
        free(copy);
        if (r == 0)
                return KJSON_OK;
        CHECK(r == -EINVAL || r == -ENOMEM);
        return err.code;
}

static bool is_ws(char c)
{
        return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static void check_canon(const struct kjson *v, const char *s, size_t n)
{
        struct kbuf c = KBUF_INIT, c2 = KBUF_INIT;
        char h1[CANON_HASH_STRLEN], h2[CANON_HASH_STRLEN], h3[CANON_HASH_STRLEN];

        int r = canon_write(&c, v);
        CHECK(r == 0 || r == -EDOM);
        CHECK(canon_hash_value(v, h1) == r);
        CHECK(canon_json(s, n, &c2, NULL) == r);
        CHECK(canon_hash_json(s, n, h2, NULL) == r);
        if (r == 0) {
                CHECK(c.len == c2.len && memcmp(c.data, c2.data, c.len) == 0);
                canon_hash_bytes(c.data, c.len, h3);
                CHECK(strcmp(h1, h3) == 0 && strcmp(h2, h3) == 0);
                CHECK(strncmp(h3, "sha256-", 7) == 0 && strlen(h3) == CANON_HASH_STRLEN - 1);
                /* compact: no whitespace outside strings is hard to check
                 * byte-wise; the fixed point below covers the format */
                kbuf_reset(&c2);
                CHECK(canon_json(c.data, c.len, &c2, NULL) == 0);
                CHECK(c.len == c2.len && memcmp(c.data, c2.data, c.len) == 0);
        } else {
                CHECK(c.len == 0 && c2.len == 0);
        }
        kbuf_free(&c);
        kbuf_free(&c2);
}

static void check_write(struct kjson_arena *b, const struct kjson *v)
{
        struct kbuf w = KBUF_INIT, w2 = KBUF_INIT;
        struct kjson *v2;
        CHECK(kjson_write(&w, v) == 0);
        kjson_arena_reset(b);
        CHECK(kjson_parse(b, w.data, w.len, &v2, NULL) == 0);
        CHECK(v2->type == v->type);
        CHECK(kjson_write(&w2, v2) == 0);
        CHECK(w.len == w2.len && memcmp(w.data, w2.data, w.len) == 0);
        /* kairos's own lines: a top-level member's container kept as its
         * text writes back byte for byte (any key of an object is tried) */
        if (v->type == KJSON_OBJECT && v->u.obj.n) {
                const char *keys[] = { v->u.obj.members[v->u.obj.n / 2].key, NULL };
                struct kjson *v3;
                struct kbuf w3 = KBUF_INIT;
                kjson_arena_reset(b);
                CHECK(kjson_parse_trusted(b, w.data, w.len, keys, &v3, NULL) == 0);
                CHECK(kjson_write(&w3, v3) == 0);
                CHECK(w.len == w3.len && memcmp(w.data, w3.data, w.len) == 0);
                kbuf_free(&w3);
        }
        kbuf_free(&w);
        kbuf_free(&w2);
}

/* A handler's result: the one-pass hash of compact text (canon_hash_compact)
 * takes only texts kjson reads and finds compact, and every one of those
 * without a backslash or an exponent, and gives their tree's hash; kjson's
 * word "compact" is kjson_write's bytes. */
static void check_compact(struct kjson_arena *b, const char *s, size_t n)
{
        char h1[CANON_HASH_STRLEN], h2[CANON_HASH_STRLEN];
        char *copy = malloc(n ? n : 1);
        CHECK(copy);
        if (n)
                memcpy(copy, s, n);
        int r = canon_hash_compact(copy, n, KJSON_MAX_DEPTH - 1, h1);
        CHECK(r == 0 || r == -EAGAIN);
        struct kjson *v = NULL;
        bool same = false;
        kjson_arena_reset(b);
        int p = kjson_parse_nested(b, copy, n, 1, &v, &same, NULL);
        int hr = p == 0 ? canon_hash_value(v, h2) : -1;
        if (r == 0)
                CHECK(p == 0 && same && hr == 0 && strcmp(h1, h2) == 0);
        else    /* (a number out of double range gives up, even where a
                 * later duplicate key drops it from the canonical form) */
                CHECK(!(p == 0 && same && hr == 0 && !memchr(copy, '\\', n) &&
                        !memchr(copy, 'e', n) && !memchr(copy, 'E', n)));
        if (p == 0 && same) {
                struct kbuf w = KBUF_INIT;
                CHECK(kjson_write(&w, v) == 0);
                CHECK(w.len == n && memcmp(w.data, copy, n) == 0);
                kbuf_free(&w);
        }
        free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        static struct kjson_arena *a, *b;
        const char *s = (const char *)data;
        struct kjson *v;
        struct kjson_error err;

        if (!a) {
                CHECK(canon_init() == 0);
                a = kjson_arena_new();
                b = kjson_arena_new();
                CHECK(a && b);
        }
        if (!s)
                s = "";
        check_compact(b, s, size);

        kjson_arena_reset(a);
        int r = kjson_parse(a, s, size, &v, &err);
        if (r < 0) {
                CHECK(r == -EINVAL);
                CHECK(err.code > KJSON_OK && err.code < KJSON_E_NOMEM);
                CHECK(err.offset <= size);
                CHECK(err.message && strcmp(err.message, kjson_error_string(err.code)) == 0);
                size_t off = err.offset;
                switch (err.code) {
                case KJSON_E_EOF:
                        CHECK(off == size);
                        break;
                case KJSON_E_SYNTAX:
                case KJSON_E_UTF8:
                case KJSON_E_DEPTH:
                        CHECK(off < size);
                        CHECK(parse_code(b, s, off) == KJSON_E_EOF);
                        break;
                case KJSON_E_TRAILING:
                        CHECK(off < size && !is_ws(s[off]));
                        CHECK(parse_code(b, s, off) == KJSON_OK);
                        break;
                default:
                        abort();
                }
                /* canonicalization rejects the same input */
                struct kbuf c = KBUF_INIT;
                struct kjson_error err2;
                CHECK(canon_json(s, size, &c, &err2) == -EINVAL);
                CHECK(err2.code == err.code && err2.offset == err.offset);
                CHECK(c.len == 0);
                kbuf_free(&c);
                return 0;
        }

        /* every strict prefix of a complete non-number value is EOF */
        size_t end = size;
        while (end > 0 && is_ws(s[end - 1]))
                end--;
        CHECK(end > 0);
        if (v->type != KJSON_NUMBER) {
                CHECK(parse_code(b, s, end - 1) == KJSON_E_EOF);
                size_t cut = (size * 2654435761u) % end;
                CHECK(parse_code(b, s, cut) == KJSON_E_EOF);
        }

        check_write(b, v);
        check_canon(v, s, size);
        return 0;
}
