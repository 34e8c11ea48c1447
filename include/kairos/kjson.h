/* SPDX-License-Identifier: MIT */
/* kjson: a strict RFC 8259 parser into an arena-allocated tree that keeps
 * every number's exact text (so integers of any size survive unchanged) and
 * every object's members in document order.  jansson cannot hold integers
 * beyond 64 bits, which canonical hashing must keep digit for digit. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

enum kjson_type {
        KJSON_NULL,
        KJSON_FALSE,
        KJSON_TRUE,
        KJSON_NUMBER,
        KJSON_STRING,
        KJSON_ARRAY,
        KJSON_OBJECT,
        KJSON_RAW,      /* an unbuilt value: only from kjson_parse_trusted */
};

struct kjson;

struct kjson_member {
        const char *key;      /* decoded UTF-8, NUL-terminated */
        size_t key_len;
        struct kjson *value;
};

struct kjson {
        enum kjson_type type;
        union {
                struct {
                        const char *text; /* the number exactly as written */
                        size_t len;
                        bool is_float;    /* has a fraction or exponent */
                } num;
                struct {
                        const char *ptr;  /* decoded UTF-8, NUL-terminated (may hold NULs) */
                        size_t len;
                } str;
                struct {
                        struct kjson **items;
                        size_t n;
                } arr;
                struct {
                        struct kjson_member *members;
                        size_t n;
                } obj;
                struct {
                        const char *text; /* in the parsed input, not copied */
                        size_t len;
                } raw;
        } u;
};

/* Parse errors.  KJSON_E_EOF means the text ended before the value was
 * complete: the input is a strict prefix of some valid document, which is
 * how the WAL fold tells a torn tail from corruption. */
enum kjson_error_code {
        KJSON_OK = 0,
        KJSON_E_EOF,        /* input is a strict prefix of a valid value */
        KJSON_E_SYNTAX,     /* unexpected byte */
        KJSON_E_UTF8,       /* invalid UTF-8 or lone surrogate */
        KJSON_E_DEPTH,      /* nesting deeper than KJSON_MAX_DEPTH */
        KJSON_E_TRAILING,   /* a complete value followed by more bytes */
        KJSON_E_NOMEM,
};

#define KJSON_MAX_DEPTH 128

struct kjson_error {
        enum kjson_error_code code;
        size_t offset;      /* byte offset of the problem in the input */
        const char *message;
};

/* Arena: all nodes and strings of one or more parses; freed at once. */
struct kjson_arena;

struct kjson_arena *kjson_arena_new(void);
void kjson_arena_reset(struct kjson_arena *a);  /* drop all nodes, keep memory */
void kjson_arena_free(struct kjson_arena *a);
/* The bytes its chunks hold (used or not): what keeping it for reuse keeps. */
size_t kjson_arena_capacity(const struct kjson_arena *a);
/* Make the arena's first chunk hold n bytes before a parse (an arena with
 * nothing allocated yet); *ret_mem, *ret_len: that chunk, for a caller that
 * wants its pages in before use.  0 or -ENOMEM / -EBUSY (in use). */
int kjson_arena_reserve(struct kjson_arena *a, size_t n, void **ret_mem, size_t *ret_len);

/* Parse exactly one JSON value from s[0..len) (surrounding whitespace allowed).
 * Returns 0 and *out, or -EINVAL with *err filled (-ENOMEM on allocation failure). */
int kjson_parse(struct kjson_arena *a, const char *s, size_t len, struct kjson **out,
                struct kjson_error *err);
/* As kjson_parse, for a value that will be nested inside levels_above
 * containers: its own containers nest at most KJSON_MAX_DEPTH - levels_above
 * deep (deeper: KJSON_E_DEPTH), so the whole can be read back.  With
 * ret_compact (may be NULL): whether s[0..len) is byte for byte what
 * kjson_write writes of the value (no whitespace; no escape but the ones
 * kbuf_json_string writes), so that a caller may keep the text instead. */
int kjson_parse_nested(struct kjson_arena *a, const char *s, size_t len, int levels_above,
                       struct kjson **out, bool *ret_compact, struct kjson_error *err);
/* As kjson_parse, for a line this process wrote itself from parsed values
 * (its own WAL records): a member of the top-level object whose key is in
 * raw_keys (NULL-terminated) and whose value is an object or an array is
 * not built but kept as KJSON_RAW, its text pointing into s (valid while s
 * is).  Inside such a value only the brackets and the strings' quotes are
 * followed; nothing else is checked.  kjson_write writes a KJSON_RAW value
 * as its text; canonical hashing refuses it. */
int kjson_parse_trusted(struct kjson_arena *a, const char *s, size_t len,
                        const char *const *raw_keys, struct kjson **out,
                        struct kjson_error *err);

/* Object lookup: the LAST member with that key (JSON.parse semantics), or NULL. */
const struct kjson *kjson_get(const struct kjson *obj, const char *key);
/* String value of member `key` if it is a string, else NULL. */
const char *kjson_get_str(const struct kjson *obj, const char *key);

const char *kjson_error_string(enum kjson_error_code code);

/* Arena allocation for callers that keep strings next to parsed trees. */
void *kjson_arena_alloc(struct kjson_arena *a, size_t n);
char *kjson_arena_strndup(struct kjson_arena *a, const char *s, size_t n);

/* Append v compactly, members in document order, numbers exactly as written,
 * strings escaped as kbuf_json_string does.  (Not canonical: see canon.h.) */
struct kbuf;
int kjson_write(struct kbuf *out, const struct kjson *v);
