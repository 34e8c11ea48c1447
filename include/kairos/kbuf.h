/* SPDX-License-Identifier: MIT */
/* kbuf: a growable byte buffer, plus the JSON string escaper shared by the
 * canonicalizer and the WAL encoder (one escaping rule for both, docs/design.md §4). */
#pragma once

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

struct kbuf {
        char *data;   /* always NUL-terminated when non-NULL */
        size_t len;
        size_t cap;
};

#define KBUF_INIT { NULL, 0, 0 }

void kbuf_free(struct kbuf *b);
void kbuf_reset(struct kbuf *b);          /* len = 0, keeps memory */
void kbuf_truncate(struct kbuf *b, size_t len); /* back to len (<= b->len), keeps memory */
int kbuf_reserve(struct kbuf *b, size_t extra);
int kbuf_append(struct kbuf *b, const void *p, size_t n);
int kbuf_puts(struct kbuf *b, const char *s);
int kbuf_putc(struct kbuf *b, char c);
int kbuf_printf(struct kbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int kbuf_vprintf(struct kbuf *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
/* Hand the data over to the caller (who frees it); the buffer is emptied. */
char *kbuf_steal(struct kbuf *b);

/* Append `s` (n bytes) as a quoted JSON string: `"` and `\` escaped, control
 * characters as \b \f \n \r \t or \u00xx (lowercase hex), '/' and non-ASCII
 * verbatim.  Returns -EILSEQ (and appends nothing) if s is not valid UTF-8. */
int kbuf_json_string(struct kbuf *b, const char *s, size_t n);
/* Same, but invalid UTF-8 sequences become U+FFFD and at most max_chars code
 * points are kept (0 = no limit).  Never fails on content. */
int kbuf_json_string_lossy(struct kbuf *b, const char *s, size_t n, size_t max_chars);

/* UTF-8 helpers. */
bool utf8_valid(const char *s, size_t n);
/* Length of the next well-formed UTF-8 sequence at s (1..4), or 0 if malformed. */
size_t utf8_seq_len(const unsigned char *s, size_t n);

/* Format into a caller's fixed buffer (a "why" for an error); nothing when
 * there is none (dst NULL or len 0). */
__attribute__((format(printf, 3, 4)))
static inline void kbuf_setf(char *dst, size_t len, const char *fmt, ...)
{
        if (!dst || !len)
                return;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(dst, len, fmt, ap);
        va_end(ap);
}
