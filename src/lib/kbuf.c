/* SPDX-License-Identifier: MIT */
#include "kairos/kbuf.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kbuf_free(struct kbuf *b)
{
        free(b->data);
        b->data = NULL;
        b->len = b->cap = 0;
}

void kbuf_reset(struct kbuf *b)
{
        kbuf_truncate(b, 0);
}

void kbuf_truncate(struct kbuf *b, size_t len)
{
        b->len = len;
        if (b->data)
                b->data[len] = '\0';
}

int kbuf_reserve(struct kbuf *b, size_t extra)
{
        if (extra > SIZE_MAX - b->len - 1)
                return -ENOMEM;
        size_t need = b->len + extra + 1;
        if (need <= b->cap)
                return 0;
        size_t cap = b->cap ? b->cap : 64;
        while (cap < need) {
                if (cap > SIZE_MAX / 2) {
                        cap = need;
                        break;
                }
                cap *= 2;
        }
        char *p = realloc(b->data, cap);
        if (!p)
                return -ENOMEM;
        b->data = p;
        b->cap = cap;
        return 0;
}

int kbuf_append(struct kbuf *b, const void *p, size_t n)
{
        /* room (and the NUL's) already there: no call to reserve */
        int r = n < b->cap - b->len ? 0 : kbuf_reserve(b, n);
        if (r < 0)
                return r;
        if (n)
                memcpy(b->data + b->len, p, n);
        b->len += n;
        b->data[b->len] = '\0';
        return 0;
}

int kbuf_puts(struct kbuf *b, const char *s)
{
        return kbuf_append(b, s, strlen(s));
}

int kbuf_putc(struct kbuf *b, char c)
{
        if (b->cap - b->len < 2)
                return kbuf_append(b, &c, 1);
        b->data[b->len++] = c;
        b->data[b->len] = '\0';
        return 0;
}

int kbuf_vprintf(struct kbuf *b, const char *fmt, va_list ap)
{
        /* Formatted straight into the room there is: one pass when it fits
         * (most do), a second into a buffer made big enough otherwise. */
        size_t room = b->data && b->cap > b->len ? b->cap - b->len : 0;
        va_list ap2;
        va_copy(ap2, ap);
        int n = vsnprintf(room ? b->data + b->len : NULL, room, fmt, ap2);
        va_end(ap2);
        if (n >= 0 && (size_t)n < room) {
                b->len += (size_t)n;
                return 0;
        }
        if (room)
                b->data[b->len] = '\0';        /* what did not fit is not in */
        if (n < 0)
                return -EINVAL;
        int r = kbuf_reserve(b, (size_t)n);
        if (r < 0)
                return r;
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
        b->len += (size_t)n;
        return 0;
}

int kbuf_printf(struct kbuf *b, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        int r = kbuf_vprintf(b, fmt, ap);
        va_end(ap);
        return r;
}

char *kbuf_steal(struct kbuf *b)
{
        char *p = b->data;
        if (!p)
                p = calloc(1, 1);
        b->data = NULL;
        b->len = b->cap = 0;
        return p;
}

size_t utf8_seq_len(const unsigned char *s, size_t n)
{
        if (n == 0)
                return 0;
        unsigned char c = s[0];
        if (c < 0x80)
                return 1;
        size_t len;
        uint32_t min;
        uint32_t cp;
        if ((c & 0xE0) == 0xC0) {
                len = 2;
                min = 0x80;
                cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
                len = 3;
                min = 0x800;
                cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
                len = 4;
                min = 0x10000;
                cp = c & 0x07;
        } else {
                return 0;
        }
        if (n < len)
                return 0;
        for (size_t i = 1; i < len; i++) {
                if ((s[i] & 0xC0) != 0x80)
                        return 0;
                cp = (cp << 6) | (s[i] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
                return 0;
        return len;
}

bool utf8_valid(const char *s, size_t n)
{
        const unsigned char *p = (const unsigned char *)s;
        size_t i = 0;
        while (i < n) {
                if (p[i] < 0x80) {
                        i++;
                        continue;
                }
                size_t l = utf8_seq_len(p + i, n - i);
                if (l == 0)
                        return false;
                i += l;
        }
        return true;
}

static int put_escape(struct kbuf *b, unsigned char c)
{
        static const char two[] = {
                ['"'] = '"', ['\\'] = '\\', ['\b'] = 'b', ['\f'] = 'f',
                ['\n'] = 'n', ['\r'] = 'r', ['\t'] = 't',
        };
        static const char hex[] = "0123456789abcdef";
        if (c < sizeof two && two[c])
                return kbuf_append(b, (char[2]){ '\\', two[c] }, 2);
        char e[6] = { '\\', 'u', '0', '0', hex[c >> 4], hex[c & 15] };
        return kbuf_append(b, e, 6);
}

static bool needs_escape(unsigned char c)
{
        return c < 0x20 || c == '"' || c == '\\';
}

int kbuf_json_string(struct kbuf *b, const char *s, size_t n)
{
        const unsigned char *p = (const unsigned char *)s;
        /* The usual string (printable ASCII without a quote or a backslash:
         * names, hashes, times) in one pass and one copy; from the first
         * other byte on, the check of the rest as UTF-8 (an ASCII prefix is
         * valid UTF-8 by itself) and the escapes. */
        size_t plain = 0;
        while (plain < n && p[plain] >= 0x20 && p[plain] < 0x80 && p[plain] != '"' &&
               p[plain] != '\\')
                plain++;
        if (plain < n && !utf8_valid(s + plain, n - plain))
                return -EILSEQ;
        size_t start_len = b->len;
        int r = kbuf_reserve(b, n + 2);
        if (r < 0)
                return r;
        b->data[b->len++] = '"';
        if (plain == n) {
                if (n)
                        memcpy(b->data + b->len, s, n);
                b->len += n;
                b->data[b->len++] = '"';
                b->data[b->len] = '\0';
                return 0;
        }
        size_t run = 0;
        for (size_t i = plain; i < n; i++) {
                if (!needs_escape(p[i]))
                        continue;
                if ((r = kbuf_append(b, s + run, i - run)) < 0 || (r = put_escape(b, p[i])) < 0)
                        goto fail;
                run = i + 1;
        }
        if ((r = kbuf_append(b, s + run, n - run)) < 0 || (r = kbuf_putc(b, '"')) < 0)
                goto fail;
        return 0;
fail:
        kbuf_truncate(b, start_len);
        return r;
}

int kbuf_json_string_lossy(struct kbuf *b, const char *s, size_t n, size_t max_chars)
{
        static const char replacement[] = "\xEF\xBF\xBD";
        size_t start_len = b->len;
        const unsigned char *p = (const unsigned char *)s;
        size_t chars = 0;
        int r = kbuf_putc(b, '"');
        for (size_t i = 0; r == 0 && i < n && (max_chars == 0 || chars < max_chars); chars++) {
                if (p[i] < 0x80) {
                        r = needs_escape(p[i]) ? put_escape(b, p[i]) : kbuf_putc(b, (char)p[i]);
                        i++;
                        continue;
                }
                size_t l = utf8_seq_len(p + i, n - i);
                if (l == 0) {
                        r = kbuf_append(b, replacement, 3);
                        i++;
                } else {
                        r = kbuf_append(b, s + i, l);
                        i += l;
                }
        }
        if (r == 0)
                r = kbuf_putc(b, '"');
        if (r < 0)
                kbuf_truncate(b, start_len);
        return r;
}
