/* SPDX-License-Identifier: MIT */
/* canon: canonical JSON and content hashes, byte-compatible with legacy files
 * (docs/design.md §4): volatile keys removed at every depth, keys sorted bytewise,
 * compact, Ruby's Float#to_s float format, integers exact. */
#pragma once

#include <stddef.h>

#include "kairos/kbuf.h"
#include "kairos/kjson.h"

/* "sha256-" + 64 hex + NUL */
#define CANON_HASH_STRLEN 72

/* Append the canonical form of v.  -EDOM for NaN/Infinity (a float literal
 * out of double range), -ENOMEM. */
int canon_write(struct kbuf *out, const struct kjson *v);

/* Parse JSON text and append its canonical form.  -EINVAL on bad JSON (err
 * filled when non-NULL), -EDOM on non-finite numbers. */
int canon_json(const char *text, size_t len, struct kbuf *out, struct kjson_error *err);

/* Canonical hash of JSON text / of a parsed value. */
int canon_hash_json(const char *text, size_t len, char out[CANON_HASH_STRLEN],
                    struct kjson_error *err);
int canon_hash_value(const struct kjson *v, char out[CANON_HASH_STRLEN]);

/* The canonical hash of text that is one JSON value in the compact form
 * kjson_write gives (no whitespace, no escape but kbuf_json_string's, no
 * backslash in a key), nesting at most max_depth containers: the hash
 * canon_hash_value gives of its parse, read in one pass without a tree.
 * 0; -EAGAIN when the text is not such a value (not JSON, not compact, out
 * of double range, out of memory): parse it and hash the tree instead, which
 * says why.  On 0, kjson_parse_nested at that depth reads the text and
 * finds it compact. */
int canon_hash_compact(const char *text, size_t len, int max_depth,
                       char out[CANON_HASH_STRLEN]);

/* "sha256-" + hex SHA-256 of raw bytes. */
void canon_hash_bytes(const void *data, size_t len, char out[CANON_HASH_STRLEN]);

/* Format a double the way Ruby's Float#to_s prints it:
 * 1.0, 1.0e+20, 2.5e-05, -0.0, 0.1.  -EDOM if not finite. */
int canon_format_double(double d, struct kbuf *out);

/* Must be called once before hashing (sodium_init); safe to call repeatedly. */
int canon_init(void);
