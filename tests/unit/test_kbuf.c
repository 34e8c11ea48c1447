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
                cmocka_unit_test(test_json_lossy_cuts_characters),
                cmocka_unit_test(test_utf8),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
