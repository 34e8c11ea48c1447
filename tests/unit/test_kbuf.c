/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kairos/kbuf.h"

/* printf into the room there is, and past it: the same text either way,
 * always NUL-terminated at len */
static void test_printf_fits_or_grows(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        assert_int_equal(kbuf_printf(&b, "%s", ""), 0);        /* no buffer yet */
        assert_int_equal(b.len, 0);
        assert_string_equal(b.data, "");
        assert_int_equal(kbuf_puts(&b, "ab"), 0);
        size_t cap = b.cap;
        assert_int_equal(kbuf_printf(&b, "%d", 7), 0);         /* fits */
        assert_int_equal(b.cap, cap);
        assert_string_equal(b.data, "ab7");
        char big[300];
        memset(big, 'q', sizeof big - 1);
        big[sizeof big - 1] = '\0';
        assert_true(b.cap - b.len < sizeof big);
        assert_int_equal(kbuf_printf(&b, "<%s>%d", big, 12), 0);   /* does not */
        assert_int_equal(b.len, 3 + 1 + 299 + 1 + 2);
        assert_int_equal(memcmp(b.data, "ab7<qqq", 7), 0);
        assert_string_equal(b.data + b.len - 4, "q>12");
        assert_int_equal(b.data[b.len], '\0');
        kbuf_free(&b);
}

static void test_append_printf_steal(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        assert_int_equal(kbuf_puts(&b, "ab"), 0);
        assert_int_equal(kbuf_printf(&b, "%d-%s", 42, "x"), 0);
        assert_string_equal(b.data, "ab42-x");
        assert_int_equal(b.len, 6);
        for (int i = 0; i < 1000; i++)
                assert_int_equal(kbuf_putc(&b, 'z'), 0);
        assert_int_equal(b.len, 1006);
        char *s = kbuf_steal(&b);
        assert_null(b.data);
        assert_int_equal(strlen(s), 1006);
        free(s);
        kbuf_free(&b);
}

static void expect_json(const char *in, size_t n, const char *want)
{
        struct kbuf b = KBUF_INIT;
        assert_int_equal(kbuf_json_string(&b, in, n), 0);
        assert_string_equal(b.data, want);
        kbuf_free(&b);
}

static void test_json_escapes(void **state)
{
        (void)state;
        expect_json("a\"b\\c", 5, "\"a\\\"b\\\\c\"");
        expect_json("\b\f\n\r\t", 5, "\"\\b\\f\\n\\r\\t\"");
        expect_json("\x01\x1f\x7f", 3, "\"\\u0001\\u001f\x7f\"");
        expect_json("a/b\xc3\xa9", 5, "\"a/b\xc3\xa9\"");
        expect_json("\0x", 2, "\"\\u0000x\"");
        expect_json("", 0, "\"\"");
}

static void test_json_rejects_bad_utf8(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        assert_int_equal(kbuf_puts(&b, "keep"), 0);
        assert_int_equal(kbuf_json_string(&b, "\xc3", 1), -EILSEQ);
        assert_int_equal(kbuf_json_string(&b, "\xed\xa0\x80", 3), -EILSEQ); /* surrogate */
        assert_int_equal(kbuf_json_string(&b, "\xc0\xaf", 2), -EILSEQ);     /* overlong */
        assert_int_equal(kbuf_json_string(&b, "\xf4\x90\x80\x80", 4), -EILSEQ); /* > U+10FFFF */
        assert_string_equal(b.data, "keep");
        kbuf_free(&b);
}

/* kbuf_json_string as it was: the whole string checked as UTF-8, then
 * copied in runs between escapes. */
static int ref_json_string(struct kbuf *b, const char *s, size_t n)
{
        if (!utf8_valid(s, n))
                return -EILSEQ;
        static const char hex[] = "0123456789abcdef";
        int r = kbuf_putc(b, '"');
        for (size_t i = 0; r == 0 && i < n; i++) {
                unsigned char c = (unsigned char)s[i];
                const char *two = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\b' ? "\\b"
                                : c == '\f' ? "\\f" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                                : c == '\t' ? "\\t" : NULL;
                if (two)
                        r = kbuf_puts(b, two);
                else if (c < 0x20)
                        r = kbuf_printf(b, "\\u00%c%c", hex[c >> 4], hex[c & 15]);
                else
                        r = kbuf_putc(b, (char)c);
        }
        return r == 0 ? kbuf_putc(b, '"') : r;
}

/* Random strings, mostly plain ASCII with an odd byte anywhere (a quote, a
 * backslash, a control, DEL, UTF-8 of every length, invalid UTF-8, NUL), and
 * the plain ones alone: the same bytes and returns as the reference, after
 * text already in the buffer, which a refusal leaves as it was. */
static void test_json_string_same_as_reference(void **state)
{
        (void)state;
        static const char *const odd[] = { "\"", "\\", "\n", "\x01", "\x1f", "\x7f", "\0",
                                           "\xc3\xa9", "\xe2\x80\xa8", "\xf0\x9f\x98\x80",
                                           "\xc3", "\xff", "\x80", "\xbf", "\xed\xa0\x80", "\xc0\xaf",
                                           "/" };
        unsigned seed = 7;
        for (int i = 0; i < 20000; i++) {
                char s[64];
                size_t n = 0;
                seed = seed * 1103515245u + 12345u;
                size_t len = (seed >> 8) % 40;
                bool plain = i % 3 == 0;
                while (n < len) {
                        seed = seed * 1103515245u + 12345u;
                        unsigned x = seed >> 8;
                        if (!plain && x % 8 == 0) {
                                const char *o = odd[(x / 8) % (sizeof odd / sizeof odd[0])];
                                size_t ol = *o ? strlen(o) : 1;
                                if (n + ol > sizeof s)
                                        break;
                                memcpy(s + n, o, ol);
                                n += ol;
                        } else {
                                s[n++] = (char)(0x20 + x % 95);
                        }
                }
                struct kbuf got = KBUF_INIT, want = KBUF_INIT;
                assert_int_equal(kbuf_puts(&got, "pre"), 0);
                assert_int_equal(kbuf_puts(&want, "pre"), 0);
                int rg = kbuf_json_string(&got, s, n);
                int rw = ref_json_string(&want, s, n);
                assert_int_equal(rg, rw);
                if (rw < 0)
                        kbuf_truncate(&want, 3);
                assert_int_equal(got.len, want.len);
                assert_memory_equal(got.data, want.data, want.len + 1);
                kbuf_free(&got);
                kbuf_free(&want);
        }
        struct kbuf b = KBUF_INIT;
        assert_int_equal(kbuf_json_string(&b, NULL, 0), 0);
        assert_string_equal(b.data, "\"\"");
        kbuf_free(&b);
}

static void test_json_lossy_cuts_characters(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        /* 3 characters, 6 bytes: a cut at 2 characters keeps whole code points */
        assert_int_equal(kbuf_json_string_lossy(&b, "\xc3\xa9\xc3\xa9\xc3\xa9", 6, 2), 0);
        assert_string_equal(b.data, "\"\xc3\xa9\xc3\xa9\"");
        kbuf_reset(&b);
        assert_int_equal(kbuf_json_string_lossy(&b, "a\xff\n", 3, 0), 0);
        assert_string_equal(b.data, "\"a\xef\xbf\xbd\\n\"");
        kbuf_free(&b);
}

static void test_utf8(void **state)
{
        (void)state;
        assert_true(utf8_valid("\xf0\x9f\x98\x80", 4));
        assert_false(utf8_valid("\xf0\x9f\x98", 3));
        assert_int_equal(utf8_seq_len((const unsigned char *)"\xe2\x82\xac", 3), 3);
        assert_int_equal(utf8_seq_len((const unsigned char *)"\x80", 1), 0);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_append_printf_steal),
                cmocka_unit_test(test_printf_fits_or_grows),
                cmocka_unit_test(test_json_escapes),
                cmocka_unit_test(test_json_rejects_bad_utf8),
                cmocka_unit_test(test_json_string_same_as_reference),
                cmocka_unit_test(test_json_lossy_cuts_characters),
                cmocka_unit_test(test_utf8),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
