/* SPDX-License-Identifier: MIT */
/* kjson: strict RFC 8259 parser into an arena (see kjson.h).
 *
 * The parser is recursive descent with an explicit depth limit.  Array items
 * and object members are collected on scratch stacks owned by the arena and
 * copied into the arena when their container closes, so every container is
 * one contiguous allocation.  Error codes separate "the input stopped early"
 * (KJSON_E_EOF: it is a strict prefix of a valid document) from "this byte
 * can never be valid here" (KJSON_E_SYNTAX, KJSON_E_UTF8), which is how the
 * WAL fold tells a torn tail from corruption. */
#include "kairos/kjson.h"

#include <errno.h>
#include <stdalign.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kairos/kbuf.h"

/* ---------------------------------------------------------------- arena */

/* Chunks start small and double up to ARENA_CHUNK: a one-line parse (a WAL
 * record, a request) takes a few KB, and a 64 KB block per arena made
 * every arena's free a consolidation of the malloc heap. */
#define ARENA_CHUNK (64u * 1024u)
#define ARENA_FIRST_CHUNK (4u * 1024u)

struct arena_chunk {
        struct arena_chunk *next;
        size_t cap;     /* usable bytes after the header */
        size_t used;
        alignas(max_align_t) unsigned char data[];
};

struct kjson_arena {
        struct arena_chunk *head;
        struct arena_chunk *cur;
        size_t grow;    /* the size of the next new chunk (0: the first) */
        /* scratch stacks of the parser, kept across parses */
        struct kjson **vstack;
        size_t vtop, vcap;
        struct kjson_member *mstack;
        size_t mtop, mcap;
};

struct kjson_arena *kjson_arena_new(void)
{
        return calloc(1, sizeof(struct kjson_arena));
}

void kjson_arena_reset(struct kjson_arena *a)
{
        if (!a)
                return;
        for (struct arena_chunk *c = a->head; c; c = c->next)
                c->used = 0;
        a->cur = a->head;
        a->vtop = 0;
        a->mtop = 0;
}

size_t kjson_arena_capacity(const struct kjson_arena *a)
{
        size_t n = 0;
        for (const struct arena_chunk *c = a ? a->head : NULL; c; c = c->next)
                n += c->cap;
        return n;
}

void kjson_arena_free(struct kjson_arena *a)
{
        if (!a)
                return;
        struct arena_chunk *c = a->head;
        while (c) {
                struct arena_chunk *n = c->next;
                free(c);
                c = n;
        }
        free(a->vstack);
        free(a->mstack);
        free(a);
}

static struct arena_chunk *chunk_new(struct kjson_arena *a, size_t need)
{
        size_t grow = a->grow ? a->grow : ARENA_FIRST_CHUNK;
        size_t cap = need > grow ? need : grow;
        if (cap > SIZE_MAX - sizeof(struct arena_chunk))
                return NULL;
        struct arena_chunk *c = malloc(sizeof(struct arena_chunk) + cap);
        if (!c)
                return NULL;
        c->next = NULL;
        c->cap = cap;
        c->used = 0;
        a->grow = grow < ARENA_CHUNK ? 2 * grow : ARENA_CHUNK;
        return c;
}

int kjson_arena_reserve(struct kjson_arena *a, size_t n, void **ret_mem, size_t *ret_len)
{
        if (a->cur || (a->head && a->head->used))
                return -EBUSY;
        if (!a->head || a->head->cap < n) {
                struct arena_chunk *c = chunk_new(a, n);
                if (!c)
                        return -ENOMEM;
                if (a->head) {
                        c->next = a->head->next;
                        free(a->head);
                }
                a->head = c;
        }
        *ret_mem = a->head->data;
        *ret_len = a->head->cap;
        return 0;
}

static void *arena_alloc_aligned(struct kjson_arena *a, size_t n, size_t align)
{
        struct arena_chunk *c = a->cur;
        if (c) {
                size_t off = (c->used + align - 1) & ~(align - 1);
                if (off <= c->cap && n <= c->cap - off) {
                        c->used = off + n;
                        return c->data + off;
                }
        }
        /* Move on to the next chunk (kept from an earlier parse) when it is
         * big enough, otherwise replace it by one that is: the list never
         * holds more chunks than the largest single parse needed. */
        if (n > SIZE_MAX - align)
                return NULL;
        struct arena_chunk *next = c ? c->next : a->head;
        if (!next || next->cap < n) {
                struct arena_chunk *nc = chunk_new(a, n);
                if (!nc)
                        return NULL;
                if (next) {
                        nc->next = next->next;
                        free(next);
                }
                if (c)
                        c->next = nc;
                else
                        a->head = nc;
                next = nc;
        }
        next->used = n;
        a->cur = next;
        return next->data;      /* chunk data is max-aligned */
}

void *kjson_arena_alloc(struct kjson_arena *a, size_t n)
{
        if (!a)
                return NULL;
        return arena_alloc_aligned(a, n ? n : 1, alignof(max_align_t));
}

char *kjson_arena_strndup(struct kjson_arena *a, const char *s, size_t n)
{
        if (!a || n == SIZE_MAX)
                return NULL;
        char *p = arena_alloc_aligned(a, n + 1, 1);
        if (!p)
                return NULL;
        if (n)
                memcpy(p, s, n);
        p[n] = '\0';
        return p;
}

/* --------------------------------------------------------------- parser */

/* Short strings that recur (member names, "UTC", ...) are stored once per
 * parse: a direct-mapped cache of strings already decoded without an
 * escape, so that the same raw bytes are the same text.  With literals made
 * once per parse too, a reply of 10,000 alike objects takes a third less
 * memory (and page faults). */
#define INTERN_MAX 32
#define INTERN_SLOTS 256

struct intern {
        const char *s; /* in the arena; NULL: empty slot */
        size_t len;
};

struct parser {
        struct kjson_arena *a;
        const unsigned char *start;
        const unsigned char *p;
        const unsigned char *end;
        struct kjson_error *err;
        struct kjson *lit[KJSON_TRUE + 1]; /* null, false, true: one node each */
        struct intern *intern;             /* INTERN_SLOTS, or NULL: none */
        const char *const *raw_keys;       /* kjson_parse_trusted */
        int max_depth;                     /* KJSON_MAX_DEPTH; less: kjson_parse_nested */
        bool loose;                        /* the text is not kjson_write's of its value */
};

/* below this, a parse does not pay for the cache */
#define INTERN_FROM (16u * 1024u)

static size_t intern_slot(const unsigned char *s, size_t len)
{
        uint32_t h = 2166136261u;
        for (size_t i = 0; i < len; i++)
                h = (h ^ s[i]) * 16777619u;
        return h % INTERN_SLOTS;
}

static const char *const error_strings[] = {
        [KJSON_OK] = "ok",
        [KJSON_E_EOF] = "unexpected end of input",
        [KJSON_E_SYNTAX] = "syntax error",
        [KJSON_E_UTF8] = "invalid UTF-8 or lone surrogate",
        [KJSON_E_DEPTH] = "nesting too deep",
        [KJSON_E_TRAILING] = "trailing bytes after the value",
        [KJSON_E_NOMEM] = "out of memory",
};

const char *kjson_error_string(enum kjson_error_code code)
{
        if ((unsigned)code >= sizeof(error_strings) / sizeof(error_strings[0]))
                return "unknown error";
        return error_strings[code];
}

static int fail_at(struct parser *P, enum kjson_error_code code, const unsigned char *at)
{
        P->err->code = code;
        P->err->offset = (size_t)(at - P->start);
        P->err->message = kjson_error_string(code);
        return -1;
}

static int fail_eof(struct parser *P)
{
        return fail_at(P, KJSON_E_EOF, P->end);
}

static int fail_nomem(struct parser *P)
{
        return fail_at(P, KJSON_E_NOMEM, P->p);
}

static inline void skip_ws(struct parser *P)
{
        const unsigned char *p = P->p, *end = P->end;
        while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
                p++;
        P->loose |= p != P->p;
        P->p = p;
}

static struct kjson *node_new(struct parser *P, enum kjson_type t)
{
        struct kjson *v = arena_alloc_aligned(P->a, sizeof(*v), alignof(struct kjson));
        if (v)
                v->type = t;
        return v;
}

static int parse_value(struct parser *P, int depth, struct kjson **out);

static int parse_literal(struct parser *P, const char *lit, size_t n, enum kjson_type t,
                         struct kjson **out)
{
        const unsigned char *p = P->p;
        size_t avail = (size_t)(P->end - p);
        size_t m = avail < n ? avail : n;
        for (size_t i = 0; i < m; i++)
                if (p[i] != (unsigned char)lit[i])
                        return fail_at(P, KJSON_E_SYNTAX, p + i);
        if (avail < n)
                return fail_eof(P);
        struct kjson *v = P->lit[t] ? P->lit[t] : (P->lit[t] = node_new(P, t));
        if (!v)
                return fail_nomem(P);
        P->p = p + n;
        *out = v;
        return 0;
}

static inline bool is_digit(unsigned char c)
{
        return c >= '0' && c <= '9';
}

/* One digit or more from at; *ret_p: past them. */
static int digits(struct parser *P, const unsigned char **ret_p, const unsigned char *at)
{
        if (at == P->end)
                return fail_eof(P);
        if (!is_digit(*at))
                return fail_at(P, KJSON_E_SYNTAX, at);
        while (at < P->end && is_digit(*at))
                at++;
        *ret_p = at;
        return 0;
}

static int parse_number(struct parser *P, struct kjson **out)
{
        const unsigned char *s = P->p, *p = s, *end = P->end;
        bool is_float = false;

        if (*p == '-') {
                p++;
                if (p == end)
                        return fail_eof(P);
        }
        if (*p == '0') {
                p++;
        } else if (*p >= '1' && *p <= '9') {
                p++;
                while (p < end && is_digit(*p))
                        p++;
        } else {
                return fail_at(P, KJSON_E_SYNTAX, p);
        }
        if (p < end && *p == '.') {
                is_float = true;
                if (digits(P, &p, p + 1) < 0)
                        return -1;
        }
        if (p < end && (*p == 'e' || *p == 'E')) {
                is_float = true;
                p++;
                if (p < end && (*p == '+' || *p == '-'))
                        p++;
                if (digits(P, &p, p) < 0)
                        return -1;
        }
        struct kjson *v = node_new(P, KJSON_NUMBER);
        if (!v)
                return fail_nomem(P);
        size_t len = (size_t)(p - s);
        char *text = kjson_arena_strndup(P->a, (const char *)s, len);
        if (!text)
                return fail_nomem(P);
        v->u.num.text = text;
        v->u.num.len = len;
        v->u.num.is_float = is_float;
        P->p = p;
        *out = v;
        return 0;
}

static int hexval(unsigned char c)
{
        if (c >= '0' && c <= '9')
                return c - '0';
        if (c >= 'a' && c <= 'f')
                return c - 'a' + 10;
        if (c >= 'A' && c <= 'F')
                return c - 'A' + 10;
        return -1;
}

/* Read 4 hex digits at p.  Returns 0 and *cp, or fails (EOF/SYNTAX). */
static int read_hex4(struct parser *P, const unsigned char *p, uint32_t *cp)
{
        uint32_t v = 0;
        for (int i = 0; i < 4; i++) {
                if (p + i >= P->end)
                        return fail_eof(P);
                int h = hexval(p[i]);
                if (h < 0)
                        return fail_at(P, KJSON_E_SYNTAX, p + i);
                v = (v << 4) | (uint32_t)h;
        }
        *cp = v;
        return 0;
}

/* Validate the UTF-8 sequence at p (first byte >= 0x80).  Returns its length,
 * 0 if it is malformed, or -1 if the input ends inside a sequence that could
 * still become valid. */
static int utf8_check(const unsigned char *p, const unsigned char *end)
{
        unsigned char c = p[0];
        int len;
        unsigned char lo = 0x80, hi = 0xBF;     /* range of the second byte */

        if (c >= 0xC2 && c <= 0xDF) {
                len = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
                len = 3;
                if (c == 0xE0)
                        lo = 0xA0;
                else if (c == 0xED)
                        hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
                len = 4;
                if (c == 0xF0)
                        lo = 0x90;
                else if (c == 0xF4)
                        hi = 0x8F;
        } else {
                return 0;
        }
        for (int i = 1; i < len; i++) {
                if (p + i >= end)
                        return -1;
                unsigned char b = p[i];
                if (i == 1 ? (b < lo || b > hi) : (b & 0xC0) != 0x80)
                        return 0;
        }
        return len;
}

static char *put_utf8(char *d, uint32_t cp)
{
        if (cp < 0x80) {
                *d++ = (char)cp;
        } else if (cp < 0x800) {
                *d++ = (char)(0xC0 | (cp >> 6));
                *d++ = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
                *d++ = (char)(0xE0 | (cp >> 12));
                *d++ = (char)(0x80 | ((cp >> 6) & 0x3F));
                *d++ = (char)(0x80 | (cp & 0x3F));
        } else {
                *d++ = (char)(0xF0 | (cp >> 18));
                *d++ = (char)(0x80 | ((cp >> 12) & 0x3F));
                *d++ = (char)(0x80 | ((cp >> 6) & 0x3F));
                *d++ = (char)(0x80 | (cp & 0x3F));
        }
        return d;
}

/* Decode the escape at p (p[0] == '\\'); writes to *dp, returns the input
 * position after it, or NULL with the error set. */
static const unsigned char *decode_escape(struct parser *P, const unsigned char *p, char **dp)
{
        const unsigned char *esc = p;
        char *d = *dp;

        if (p + 1 >= P->end) {
                fail_eof(P);
                return NULL;
        }
        switch (p[1]) {
        case '"': *d++ = '"'; break;
        case '\\': *d++ = '\\'; break;
        case '/': *d++ = '/'; P->loose = true; break;
        case 'b': *d++ = '\b'; break;
        case 'f': *d++ = '\f'; break;
        case 'n': *d++ = '\n'; break;
        case 'r': *d++ = '\r'; break;
        case 't': *d++ = '\t'; break;
        case 'u': {
                uint32_t cp, lo;
                if (read_hex4(P, p + 2, &cp) < 0)
                        return NULL;
                /* kbuf_json_string's own \u escapes: below 0x20, lowercase,
                 * and none of the one-letter ones */
                P->loose |= cp >= 0x20 || cp == '\b' || cp == '\t' || cp == '\n' ||
                            cp == '\f' || cp == '\r' || (p[5] >= 'A' && p[5] <= 'F');
                p += 6;
                if (cp >= 0xDC00 && cp <= 0xDFFF) {
                        fail_at(P, KJSON_E_UTF8, esc);
                        return NULL;
                }
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                        if (p >= P->end) {
                                fail_eof(P);
                                return NULL;
                        }
                        if (p[0] != '\\') {
                                fail_at(P, KJSON_E_UTF8, esc);
                                return NULL;
                        }
                        if (p + 1 >= P->end) {
                                fail_eof(P);
                                return NULL;
                        }
                        if (p[1] != 'u') {
                                fail_at(P, KJSON_E_UTF8, esc);
                                return NULL;
                        }
                        if (read_hex4(P, p + 2, &lo) < 0)
                                return NULL;
                        if (lo < 0xDC00 || lo > 0xDFFF) {
                                fail_at(P, KJSON_E_UTF8, esc);
                                return NULL;
                        }
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                        p += 6;
                }
                *dp = put_utf8(d, cp);
                return p;
        }
        default:
                fail_at(P, KJSON_E_SYNTAX, p + 1);
                return NULL;
        }
        *dp = d;
        return p + 2;
}

static inline bool plain_byte(unsigned char c)
{
        return c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
}

/* P->p is at the opening quote. */
static int parse_string_raw(struct parser *P, const char **out, size_t *out_len)
{
        const unsigned char *p = P->p + 1, *end = P->end;

        /* Pass 1: find the closing quote; the raw length bounds the decoded
         * length (escapes only shrink). */
        const unsigned char *q = p;
        while (q < end) {
                const unsigned char *hit = memchr(q, '"', (size_t)(end - q));
                if (!hit) {
                        q = end;
                        break;
                }
                /* count the backslashes right before the quote */
                const unsigned char *b = hit;
                while (b > p && b[-1] == '\\')
                        b--;
                q = hit;
                if (((size_t)(hit - b) & 1) == 0)
                        break;
                q = hit + 1;
        }
        size_t raw = (size_t)((q < end ? q : end) - p);
        size_t slot = INTERN_SLOTS;
        if (P->intern && q < end && raw <= INTERN_MAX) {
                slot = intern_slot(p, raw);
                const struct intern *in = &P->intern[slot];
                /* the same bytes as a string decoded without escapes: valid,
                 * and decoded they are themselves */
                if (in->s && in->len == raw && memcmp(in->s, p, raw) == 0) {
                        *out = in->s;
                        *out_len = raw;
                        P->p = q + 1;
                        return 0;
                }
        }
        char *buf = arena_alloc_aligned(P->a, raw + 1, 1);
        if (!buf)
                return fail_nomem(P);

        /* Pass 2: decode and validate. */
        char *d = buf;
        for (;;) {
                const unsigned char *run = p;
                while (p < end && plain_byte(*p))
                        p++;
                if (p > run) {
                        memcpy(d, run, (size_t)(p - run));
                        d += p - run;
                }
                if (p >= end)
                        return fail_eof(P);
                unsigned char c = *p;
                if (c == '"') {
                        p++;
                        break;
                }
                if (c == '\\') {
                        p = decode_escape(P, p, &d);
                        if (!p)
                                return -1;
                        continue;
                }
                if (c < 0x20)
                        return fail_at(P, KJSON_E_SYNTAX, p);
                int l = utf8_check(p, end);
                if (l < 0)
                        return fail_eof(P);
                if (l == 0)
                        return fail_at(P, KJSON_E_UTF8, p);
                memcpy(d, p, (size_t)l);
                d += l;
                p += l;
        }
        *d = '\0';
        *out = buf;
        *out_len = (size_t)(d - buf);
        P->p = p;
        if (slot < INTERN_SLOTS && *out_len == raw && !memchr(buf, '\\', raw))
                P->intern[slot] = (struct intern){ buf, raw };
        return 0;
}

static int parse_string(struct parser *P, struct kjson **out)
{
        struct kjson *v = node_new(P, KJSON_STRING);
        if (!v)
                return fail_nomem(P);
        if (parse_string_raw(P, &v->u.str.ptr, &v->u.str.len) < 0)
                return -1;
        *out = v;
        return 0;
}

static int vpush(struct parser *P, struct kjson *v)
{
        struct kjson_arena *a = P->a;
        if (a->vtop == a->vcap) {
                size_t ncap = a->vcap ? a->vcap * 2 : 64;
                struct kjson **n = realloc(a->vstack, ncap * sizeof(*n));
                if (!n)
                        return fail_nomem(P);
                a->vstack = n;
                a->vcap = ncap;
        }
        a->vstack[a->vtop++] = v;
        return 0;
}

static int mpush(struct parser *P, const char *key, size_t key_len, struct kjson *v)
{
        struct kjson_arena *a = P->a;
        if (a->mtop == a->mcap) {
                size_t ncap = a->mcap ? a->mcap * 2 : 64;
                struct kjson_member *n = realloc(a->mstack, ncap * sizeof(*n));
                if (!n)
                        return fail_nomem(P);
                a->mstack = n;
                a->mcap = ncap;
        }
        a->mstack[a->mtop++] = (struct kjson_member){ key, key_len, v };
        return 0;
}

/* After an item of an array or object: 1 at ',' (another item follows),
 * 0 at `close`, -1 (error set) otherwise. */
static int next_item(struct parser *P, char close)
{
        skip_ws(P);
        if (P->p >= P->end) {
                fail_eof(P);
                return -1;
        }
        if (*P->p == ',') {
                P->p++;
                return 1;
        }
        if (*P->p == close)
                return 0;
        fail_at(P, KJSON_E_SYNTAX, P->p);
        return -1;
}

/* Whitespace, then not the end of the input, and want there (0: anything). */
static int ws_then(struct parser *P, unsigned char want)
{
        skip_ws(P);
        if (P->p >= P->end)
                return fail_eof(P);
        if (want && *P->p != want)
                return fail_at(P, KJSON_E_SYNTAX, P->p);
        return 0;
}

/* The container of type t opening at P->p: its node, P->p past the bracket
 * and whitespace; NULL: failed. */
static struct kjson *container_open(struct parser *P, int depth, enum kjson_type t)
{
        if (depth > P->max_depth) {
                fail_at(P, KJSON_E_DEPTH, P->p);
                return NULL;
        }
        struct kjson *v = node_new(P, t);
        if (!v) {
                fail_nomem(P);
                return NULL;
        }
        P->p++;
        return ws_then(P, 0) < 0 ? NULL : v;
}

/* A container's n items of size bytes from its stack into the arena
 * (*ret NULL when there are none). */
static int container_items(struct parser *P, const void *stack, size_t n, size_t size,
                           size_t align, void **ret)
{
        *ret = NULL;
        if (!n)
                return 0;
        if (!(*ret = arena_alloc_aligned(P->a, n * size, align)))
                return fail_nomem(P);
        memcpy(*ret, stack, n * size);
        return 0;
}

static int parse_array(struct parser *P, int depth, struct kjson **out)
{
        struct kjson *v = container_open(P, depth, KJSON_ARRAY);
        if (!v)
                return -1;
        size_t base = P->a->vtop;
        int r = -1;

        if (*P->p != ']') {
                for (;;) {
                        struct kjson *item;
                        if (parse_value(P, depth, &item) < 0 || vpush(P, item) < 0)
                                goto out;
                        int more = next_item(P, ']');
                        if (more < 0)
                                goto out;
                        if (!more)
                                break;
                }
        }
        P->p++;
        void *items;
        v->u.arr.n = P->a->vtop - base;
        if (container_items(P, v->u.arr.n ? P->a->vstack + base : NULL, v->u.arr.n,
                            sizeof(struct kjson *),
                            alignof(struct kjson *), &items) < 0)
                goto out;
        v->u.arr.items = items;
        *out = v;
        r = 0;
out:
        P->a->vtop = base;
        return r;
}

/* kjson_parse_trusted: the object or array at P->p, skipped to its end by
 * its brackets (outside strings) and kept as its text.  One pass over the
 * bytes (a result of 1 MiB holds some 100,000 short strings: a call per
 * string cost more than the scan). */
static int parse_raw(struct parser *P, struct kjson **out)
{
        const unsigned char *start = P->p, *p = P->p, *end = P->end;
        size_t depth = 0;
        for (;;) {
                if (p >= end)
                        return fail_eof(P);
                unsigned char c = *p++;
                if (c == '"') {
                        while (p < end && *p != '"' && *p != '\\')
                                p++;
                        while (p < end && *p == '\\') {
                                if (end - p < 2)
                                        return fail_eof(P);
                                p += 2; /* the escaped byte, whatever it is */
                                while (p < end && *p != '"' && *p != '\\')
                                        p++;
                        }
                        if (p >= end)
                                return fail_eof(P);
                        p++;
                } else if (c == '{' || c == '[') {
                        depth++;
                } else if ((c == '}' || c == ']') && --depth == 0) {
                        break;
                }
        }
        P->p = p;
        struct kjson *v = node_new(P, KJSON_RAW);
        if (!v)
                return fail_nomem(P);
        v->u.raw.text = (const char *)start;
        v->u.raw.len = (size_t)(p - start);
        *out = v;
        return 0;
}

static bool raw_key(const struct parser *P, int depth, const char *key)
{
        if (!P->raw_keys || depth != 1)
                return false;
        for (const char *const *k = P->raw_keys; *k; k++)
                if (strcmp(*k, key) == 0)
                        return true;
        return false;
}

static int parse_object(struct parser *P, int depth, struct kjson **out)
{
        struct kjson *v = container_open(P, depth, KJSON_OBJECT);
        if (!v)
                return -1;
        size_t base = P->a->mtop;
        int r = -1;

        if (*P->p != '}') {
                for (;;) {
                        const char *key;
                        size_t key_len;
                        struct kjson *item;

                        if (ws_then(P, '"') < 0 || parse_string_raw(P, &key, &key_len) < 0 ||
                            ws_then(P, ':') < 0)
                                goto out;
                        P->p++;
                        skip_ws(P);
                        bool raw = P->p < P->end && (*P->p == '{' || *P->p == '[') &&
                                   raw_key(P, depth, key);
                        if ((raw ? parse_raw(P, &item) : parse_value(P, depth, &item)) < 0 ||
                            mpush(P, key, key_len, item) < 0)
                                goto out;
                        int more = next_item(P, '}');
                        if (more < 0)
                                goto out;
                        if (!more)
                                break;
                }
        }
        P->p++;
        void *members;
        v->u.obj.n = P->a->mtop - base;
        if (container_items(P, v->u.obj.n ? P->a->mstack + base : NULL, v->u.obj.n,
                            sizeof(struct kjson_member),
                            alignof(struct kjson_member), &members) < 0)
                goto out;
        v->u.obj.members = members;
        *out = v;
        r = 0;
out:
        P->a->mtop = base;
        return r;
}

/* depth: number of containers enclosing this value. */
static int parse_value(struct parser *P, int depth, struct kjson **out)
{
        skip_ws(P);
        if (P->p >= P->end)
                return fail_eof(P);
        switch (*P->p) {
        case '{':
                return parse_object(P, depth + 1, out);
        case '[':
                return parse_array(P, depth + 1, out);
        case '"':
                return parse_string(P, out);
        case 't':
                return parse_literal(P, "true", 4, KJSON_TRUE, out);
        case 'f':
                return parse_literal(P, "false", 5, KJSON_FALSE, out);
        case 'n':
                return parse_literal(P, "null", 4, KJSON_NULL, out);
        case '-':
        case '0': case '1': case '2': case '3': case '4':
        case '5': case '6': case '7': case '8': case '9':
                return parse_number(P, out);
        default:
                return fail_at(P, KJSON_E_SYNTAX, P->p);
        }
}

static int parse_top(struct kjson_arena *a, const char *s, size_t len,
                     const char *const *raw_keys, int max_depth, struct kjson **out,
                     bool *ret_compact, struct kjson_error *err)
{
        struct kjson_error dummy;
        if (!err)
                err = &dummy;
        err->code = KJSON_OK;
        err->offset = 0;
        err->message = kjson_error_string(KJSON_OK);
        if (!a || !out || (!s && len)) {
                err->code = KJSON_E_SYNTAX;
                err->message = kjson_error_string(KJSON_E_SYNTAX);
                return -EINVAL;
        }
        if (!s)
                s = "";

        struct parser P = {
                .a = a,
                .start = (const unsigned char *)s,
                .p = (const unsigned char *)s,
                .end = (const unsigned char *)s + len,
                .err = err,
                .raw_keys = raw_keys,
                .max_depth = max_depth,
        };
        struct kjson *v = NULL;
        int r = 0;
        if (len >= INTERN_FROM) {
                P.intern = arena_alloc_aligned(a, INTERN_SLOTS * sizeof(struct intern),
                                               alignof(struct intern));
                if (!P.intern)
                        r = fail_nomem(&P);
                else
                        memset(P.intern, 0, INTERN_SLOTS * sizeof(struct intern));
        }
        if (r == 0)
                r = parse_value(&P, 0, &v);
        if (r == 0) {
                skip_ws(&P);
                if (P.p < P.end)
                        r = fail_at(&P, KJSON_E_TRAILING, P.p);
        }
        /* a failed parse may leave scratch entries of enclosing containers */
        a->vtop = 0;
        a->mtop = 0;
        if (r < 0)
                return err->code == KJSON_E_NOMEM ? -ENOMEM : -EINVAL;
        *out = v;
        if (ret_compact)
                *ret_compact = !P.loose;
        return 0;
}

int kjson_parse(struct kjson_arena *a, const char *s, size_t len, struct kjson **out,
                struct kjson_error *err)
{
        return parse_top(a, s, len, NULL, KJSON_MAX_DEPTH, out, NULL, err);
}

int kjson_parse_nested(struct kjson_arena *a, const char *s, size_t len, int levels_above,
                       struct kjson **out, bool *ret_compact, struct kjson_error *err)
{
        if (levels_above < 0 || levels_above >= KJSON_MAX_DEPTH)
                levels_above = KJSON_MAX_DEPTH - 1;
        return parse_top(a, s, len, NULL, KJSON_MAX_DEPTH - levels_above, out, ret_compact,
                         err);
}

int kjson_parse_trusted(struct kjson_arena *a, const char *s, size_t len,
                        const char *const *raw_keys, struct kjson **out,
                        struct kjson_error *err)
{
        return parse_top(a, s, len, raw_keys, KJSON_MAX_DEPTH, out, NULL, err);
}

/* --------------------------------------------------------------- access */

const struct kjson *kjson_get(const struct kjson *obj, const char *key)
{
        if (!obj || obj->type != KJSON_OBJECT || !key)
                return NULL;
        size_t klen = strlen(key);
        for (size_t i = obj->u.obj.n; i-- > 0;) {
                const struct kjson_member *m = &obj->u.obj.members[i];
                if (m->key_len == klen && memcmp(m->key, key, klen) == 0)
                        return m->value;
        }
        return NULL;
}

const char *kjson_get_str(const struct kjson *obj, const char *key)
{
        const struct kjson *v = kjson_get(obj, key);
        if (!v || v->type != KJSON_STRING)
                return NULL;
        return v->u.str.ptr;
}

/* ---------------------------------------------------------------- write */

static int write_value(struct kbuf *out, const struct kjson *v, int depth)
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
                if (!v->u.num.text || v->u.num.len == 0)
                        return -EINVAL;
                return kbuf_append(out, v->u.num.text, v->u.num.len);
        case KJSON_STRING:
                return kbuf_json_string(out, v->u.str.ptr ? v->u.str.ptr : "", v->u.str.len);
        case KJSON_ARRAY:
                if ((r = kbuf_putc(out, '[')) < 0)
                        return r;
                for (size_t i = 0; i < v->u.arr.n; i++) {
                        if (i && (r = kbuf_putc(out, ',')) < 0)
                                return r;
                        if ((r = write_value(out, v->u.arr.items[i], depth + 1)) < 0)
                                return r;
                }
                return kbuf_putc(out, ']');
        case KJSON_OBJECT:
                if ((r = kbuf_putc(out, '{')) < 0)
                        return r;
                for (size_t i = 0; i < v->u.obj.n; i++) {
                        const struct kjson_member *m = &v->u.obj.members[i];
                        if (i && (r = kbuf_putc(out, ',')) < 0)
                                return r;
                        if ((r = kbuf_json_string(out, m->key ? m->key : "", m->key_len)) < 0 ||
                            (r = kbuf_putc(out, ':')) < 0 ||
                            (r = write_value(out, m->value, depth + 1)) < 0)
                                return r;
                }
                return kbuf_putc(out, '}');
        case KJSON_RAW:
                return kbuf_append(out, v->u.raw.text, v->u.raw.len);
        }
        return -EINVAL;
}

int kjson_write(struct kbuf *out, const struct kjson *v)
{
        size_t start = out->len;
        int r = write_value(out, v, 0);
        if (r < 0) {
                out->len = start;
                if (out->data)
                        out->data[start] = '\0';
        }
        return r;
}
