/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kairos/kbuf.h"
#include "kairos/kjson.h"

/* Parse a copy of s[0..len) in a buffer of exactly len bytes, so that ASan
 * catches any read past the end. */
static int parse_exact(struct kjson_arena *a, const char *s, size_t len, struct kjson **out,
                       struct kjson_error *err)
{
        char *copy = malloc(len ? len : 1);
        assert_non_null(copy);
        if (len)
                memcpy(copy, s, len);
        int r = kjson_parse(a, len ? copy : NULL, len, out, err);
        free(copy);
        return r;
}

static enum kjson_error_code code_of(const char *s)
{
        struct kjson_arena *a = kjson_arena_new();
        assert_non_null(a);
        struct kjson *v = NULL;
        struct kjson_error err;
        int r = parse_exact(a, s, strlen(s), &v, &err);
        kjson_arena_free(a);
        if (r == 0)
                return KJSON_OK;
        assert_int_equal(r, -EINVAL);
        return err.code;
}

/* Parse then write; the written text is the caller's to free. */
static char *roundtrip(const char *s)
{
        struct kjson_arena *a = kjson_arena_new();
        struct kjson *v = NULL;
        struct kjson_error err;
        assert_int_equal(kjson_parse(a, s, strlen(s), &v, &err), 0);
        struct kbuf b = KBUF_INIT;
        assert_int_equal(kjson_write(&b, v), 0);
        kjson_arena_free(a);
        return kbuf_steal(&b);
}

#define assert_code(s, c) assert_int_equal(code_of(s), (c))

static void test_scalars(void **state)
{
        (void)state;
        struct kjson_arena *a = kjson_arena_new();
        struct kjson *v;
        struct kjson_error err;

        assert_int_equal(kjson_parse(a, "null", 4, &v, &err), 0);
        assert_int_equal(v->type, KJSON_NULL);
        assert_int_equal(kjson_parse(a, " true ", 6, &v, &err), 0);
        assert_int_equal(v->type, KJSON_TRUE);
        assert_int_equal(kjson_parse(a, "\t\r\nfalse\n", 9, &v, &err), 0);
        assert_int_equal(v->type, KJSON_FALSE);

        assert_int_equal(kjson_parse(a, "-12", 3, &v, &err), 0);
        assert_int_equal(v->type, KJSON_NUMBER);
        assert_int_equal(v->u.num.len, 3);
        assert_memory_equal(v->u.num.text, "-12", 3);
        assert_false(v->u.num.is_float);

        assert_int_equal(kjson_parse(a, "\"hi\"", 4, &v, &err), 0);
        assert_int_equal(v->type, KJSON_STRING);
        assert_int_equal(v->u.str.len, 2);
        assert_string_equal(v->u.str.ptr, "hi");
        kjson_arena_free(a);
}

static void test_numbers_keep_text(void **state)
{
        (void)state;
        static const struct {
                const char *text;
                bool is_float;
        } cases[] = {
                { "0", false },
                { "-0", false },
                { "12345678901234567890123456789012345678901234567890", false },
                { "-98765432109876543210", false },
                { "1.0", true },
                { "1.50", true },
                { "1e5", true },
                { "1E+5", true },
                { "-2.5e-05", true },
                { "0.000", true },
                { "1e400", true },
        };
        struct kjson_arena *a = kjson_arena_new();
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                struct kjson *v;
                struct kjson_error err;
                size_t n = strlen(cases[i].text);
                assert_int_equal(parse_exact(a, cases[i].text, n, &v, &err), 0);
                assert_int_equal(v->type, KJSON_NUMBER);
                assert_int_equal(v->u.num.len, n);
                assert_memory_equal(v->u.num.text, cases[i].text, n);
                assert_int_equal(v->u.num.text[n], '\0');
                assert_int_equal(v->u.num.is_float, cases[i].is_float);
        }
        kjson_arena_free(a);
}

static void test_bad_numbers(void **state)
{
        (void)state;
        assert_code("01", KJSON_E_TRAILING);
        assert_code("[01]", KJSON_E_SYNTAX);
        assert_code("+1", KJSON_E_SYNTAX);
        assert_code(".5", KJSON_E_SYNTAX);
        assert_code("1.e5", KJSON_E_SYNTAX);
        assert_code("1.x", KJSON_E_SYNTAX);
        assert_code("1ex", KJSON_E_SYNTAX);
        assert_code("1e+x", KJSON_E_SYNTAX);
        assert_code("-x", KJSON_E_SYNTAX);
        assert_code("--1", KJSON_E_SYNTAX);
        assert_code("NaN", KJSON_E_SYNTAX);
        assert_code("Infinity", KJSON_E_SYNTAX);
        assert_code("-Infinity", KJSON_E_SYNTAX);
        assert_code("0x10", KJSON_E_TRAILING);
        assert_code("[1,2,]", KJSON_E_SYNTAX);
        assert_code("[,1]", KJSON_E_SYNTAX);
}

static void test_containers(void **state)
{
        (void)state;
        struct kjson_arena *a = kjson_arena_new();
        struct kjson *v;
        struct kjson_error err;
        const char *s = " { \"a\" : [1, \"x\", {\"b\":null}, []] , \"c\":{} } ";

        assert_int_equal(kjson_parse(a, s, strlen(s), &v, &err), 0);
        assert_int_equal(v->type, KJSON_OBJECT);
        assert_int_equal(v->u.obj.n, 2);
        assert_string_equal(v->u.obj.members[0].key, "a");
        assert_string_equal(v->u.obj.members[1].key, "c");
        const struct kjson *arr = v->u.obj.members[0].value;
        assert_int_equal(arr->type, KJSON_ARRAY);
        assert_int_equal(arr->u.arr.n, 4);
        assert_int_equal(arr->u.arr.items[0]->type, KJSON_NUMBER);
        assert_int_equal(arr->u.arr.items[1]->type, KJSON_STRING);
        assert_int_equal(arr->u.arr.items[2]->type, KJSON_OBJECT);
        assert_int_equal(arr->u.arr.items[2]->u.obj.n, 1);
        assert_int_equal(arr->u.arr.items[3]->type, KJSON_ARRAY);
        assert_int_equal(arr->u.arr.items[3]->u.arr.n, 0);
        const struct kjson *c = kjson_get(v, "c");
        assert_non_null(c);
        assert_int_equal(c->type, KJSON_OBJECT);
        assert_int_equal(c->u.obj.n, 0);
        kjson_arena_free(a);
}

static void test_large_containers(void **state)
{
        (void)state;
        /* more items than the initial scratch stacks, nested */
        struct kbuf b = KBUF_INIT;
        assert_int_equal(kbuf_puts(&b, "[[1]"), 0);
        for (int i = 0; i < 5000; i++)
                assert_int_equal(kbuf_printf(&b, ",{\"k%d\":%d,\"arr\":[%d,%d]}", i, i, i, -i), 0);
        assert_int_equal(kbuf_puts(&b, "]"), 0);

        struct kjson_arena *a = kjson_arena_new();
        struct kjson *v;
        struct kjson_error err;
        assert_int_equal(kjson_parse(a, b.data, b.len, &v, &err), 0);
        assert_int_equal(v->u.arr.n, 5001);
        const struct kjson *o = v->u.arr.items[4000];
        assert_int_equal(o->u.obj.n, 2);
        assert_string_equal(o->u.obj.members[0].key, "k3999");
        const struct kjson *arr = kjson_get(o, "arr");
        assert_int_equal(arr->u.arr.n, 2);
        assert_memory_equal(arr->u.arr.items[1]->u.num.text, "-3999", 5);

        struct kbuf w = KBUF_INIT;
        assert_int_equal(kjson_write(&w, v), 0);
        assert_int_equal(w.len, b.len);
        assert_memory_equal(w.data, b.data, b.len);
        kbuf_free(&w);
        kbuf_free(&b);
        kjson_arena_free(a);
}

static void test_strings_escapes(void **state)
{
        (void)state;
        struct kjson_arena *a = kjson_arena_new();
        struct kjson *v;
        struct kjson_error err;
        const char *s = "\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\\u0041\\u00e9\\u20AC\\ud83d\\ude00\"";

        assert_int_equal(parse_exact(a, s, strlen(s), &v, &err), 0);
        const char *want = "a\"b\\c/d\b\f\n\r\tA\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";
        assert_int_equal(v->u.str.len, strlen(want));
        assert_memory_equal(v->u.str.ptr, want, strlen(want));
        assert_int_equal(v->u.str.ptr[v->u.str.len], '\0');

        /* \u0000 is kept; the length counts it */
        assert_int_equal(kjson_parse(a, "\"x\\u0000y\"", 10, &v, &err), 0);
        assert_int_equal(v->u.str.len, 3);
        assert_memory_equal(v->u.str.ptr, "x\0y", 3);

        /* raw UTF-8 is kept verbatim */
        const char *u = "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80/\"";
        assert_int_equal(parse_exact(a, u, strlen(u), &v, &err), 0);
        assert_int_equal(v->u.str.len, strlen(u) - 2);
        assert_memory_equal(v->u.str.ptr, u + 1, strlen(u) - 2);

        /* escaped quotes and backslash runs before the closing quote */
        const char *q = "[\"\\\\\",\"\\\\\\\"\",\"\\\"\\\\\"]";
        assert_int_equal(parse_exact(a, q, strlen(q), &v, &err), 0);
        assert_int_equal(v->u.arr.n, 3);
        assert_string_equal(v->u.arr.items[0]->u.str.ptr, "\\");
        assert_string_equal(v->u.arr.items[1]->u.str.ptr, "\\\"");
        assert_string_equal(v->u.arr.items[2]->u.str.ptr, "\"\\");
        kjson_arena_free(a);
}

static void test_string_errors(void **state)
{
        (void)state;
        /* raw control characters */
        assert_code("\"a\nb\"", KJSON_E_SYNTAX);
        assert_code("\"\t\"", KJSON_E_SYNTAX);
        assert_code("\"\x01\"", KJSON_E_SYNTAX);
        assert_code("\"\x1f\"", KJSON_E_SYNTAX);
        assert_code("\"\x7f\"", KJSON_OK);
        /* bad escapes */
        assert_code("\"\\x\"", KJSON_E_SYNTAX);
        assert_code("\"\\U0041\"", KJSON_E_SYNTAX);
        assert_code("\"\\u00g0\"", KJSON_E_SYNTAX);
        assert_code("\"\\u12\"", KJSON_E_SYNTAX);
        assert_code("\"\\'\"", KJSON_E_SYNTAX);
        /* lone / misordered surrogates */
        assert_code("\"\\ud800\"", KJSON_E_UTF8);
        assert_code("\"\\udc00\"", KJSON_E_UTF8);
        assert_code("\"\\ud800x\"", KJSON_E_UTF8);
        assert_code("\"\\ud800\\n\"", KJSON_E_UTF8);
        assert_code("\"\\ud800\\ud800\"", KJSON_E_UTF8);
        assert_code("\"\\ude00\\ud83d\"", KJSON_E_UTF8);
        assert_code("\"\\ud800\\u0041\"", KJSON_E_UTF8);
        /* invalid UTF-8 bytes */
        assert_code("\"\x80\"", KJSON_E_UTF8);
        assert_code("\"\xc0\xaf\"", KJSON_E_UTF8);       /* overlong */
        assert_code("\"\xc1\xbf\"", KJSON_E_UTF8);
        assert_code("\"\xe0\x80\xaf\"", KJSON_E_UTF8);   /* overlong */
        assert_code("\"\xed\xa0\x80\"", KJSON_E_UTF8);   /* encoded surrogate */
        assert_code("\"\xf4\x90\x80\x80\"", KJSON_E_UTF8); /* > U+10FFFF */
        assert_code("\"\xf5\x80\x80\x80\"", KJSON_E_UTF8);
        assert_code("\"\xff\"", KJSON_E_UTF8);
        assert_code("\"\xc3x\"", KJSON_E_UTF8);
        assert_code("\"\xe2\x82x\"", KJSON_E_UTF8);
        assert_code("\"\xc3\"", KJSON_E_UTF8);           /* truncated before the quote */
        assert_code("\"\xf4\x8f\xbf\xbf\"", KJSON_OK);  /* U+10FFFF */
        assert_code("\"\xef\xbf\xbf\"", KJSON_OK);
        /* invalid UTF-8 in keys */
        assert_code("{\"\xff\":1}", KJSON_E_UTF8);
        /* bytes outside strings */
        assert_code("\xef\xbb\xbf{}", KJSON_E_SYNTAX);   /* BOM */
        assert_code("'a'", KJSON_E_SYNTAX);
}

static void test_error_codes(void **state)
{
        (void)state;
        /* EOF: a strict prefix of some valid document */
        static const char *const eof[] = {
                "", " ", "\n\t\r ", "{", "[", "\"", "{\"op\":\"ap", "{\"a\":1,", "[1,2", "tr",
                "t", "nul", "fals", "-", "1.", "1e", "1E-", "-0.", "{\"a\"", "{\"a\":",
                "{\"a\" ", "[[[", "\"\\", "\"\\u", "\"\\u12", "\"\\ud83d", "\"\\ud83d\\",
                "\"\\ud83d\\u", "\"\\ud83d\\ude0", "\"\xc3", "\"\xe2\x82", "\"\xf0\x9f\x98",
                "[1 ", "{\"a\":[", "{\"a\":{\"b\":", "[\"x\",", "{ ", "[true",
        };
        for (size_t i = 0; i < sizeof(eof) / sizeof(eof[0]); i++) {
                struct kjson_arena *a = kjson_arena_new();
                struct kjson *v;
                struct kjson_error err;
                int r = parse_exact(a, eof[i], strlen(eof[i]), &v, &err);
                if (r != -EINVAL || err.code != KJSON_E_EOF)
                        fail_msg("'%s': r=%d code=%d", eof[i], r, err.code);
                assert_int_equal(err.offset, strlen(eof[i]));
                kjson_arena_free(a);
        }
        /* SYNTAX: a byte that can never be valid there */
        static const char *const syntax[] = {
                "x", "}", "]", ",", ":", "{\"a\" 1}", "{\"a\":1 \"b\":2}", "{a:1}", "{\"a\":}",
                "[1 2]", "tx", "nulx", "falsy", "{\"a\":1,}", "[}", "{]", "{,}", "{\"a\",1}",
                "{\"a\":1]", "[1}", "\"\\q\"", "-a", "1.e",
        };
        for (size_t i = 0; i < sizeof(syntax) / sizeof(syntax[0]); i++)
                if (code_of(syntax[i]) != KJSON_E_SYNTAX)
                        fail_msg("'%s': code=%d", syntax[i], code_of(syntax[i]));
        /* TRAILING: a complete value followed by more bytes */
        static const char *const trailing[] = {
                "{}x", "{} {}", "1 2", "\"a\"\"b\"", "[]]", "true false", "nullx", "{\"a\":1}}",
                "0 1", "-0-", "1.5.", "{\"op\":\"x\"}{\"op\"",
        };
        for (size_t i = 0; i < sizeof(trailing) / sizeof(trailing[0]); i++)
                if (code_of(trailing[i]) != KJSON_E_TRAILING)
                        fail_msg("'%s': code=%d", trailing[i], code_of(trailing[i]));
}

static void test_error_offsets(void **state)
{
        (void)state;
        struct kjson_arena *a = kjson_arena_new();
        struct kjson *v;
        struct kjson_error err;

        assert_int_equal(kjson_parse(a, "[1, x]", 6, &v, &err), -EINVAL);
        assert_int_equal(err.code, KJSON_E_SYNTAX);
        assert_int_equal(err.offset, 4);
        assert_non_null(err.message);
        assert_string_equal(err.message, kjson_error_string(KJSON_E_SYNTAX));

        assert_int_equal(kjson_parse(a, "{\"a\":1} x", 9, &v, &err), -EINVAL);
        assert_int_equal(err.code, KJSON_E_TRAILING);
        assert_int_equal(err.offset, 8);

        assert_int_equal(kjson_parse(a, "[\"ab\xff\"]", 7, &v, &err), -EINVAL);
        assert_int_equal(err.code, KJSON_E_UTF8);
        assert_int_equal(err.offset, 4);

        assert_int_equal(kjson_parse(a, "\"a\\ud800b\"", 10, &v, &err), -EINVAL);
        assert_int_equal(err.code, KJSON_E_UTF8);
        assert_int_equal(err.offset, 2);

        assert_int_equal(kjson_parse(a, "\"a\nb\"", 5, &v, &err), -EINVAL);
        assert_int_equal(err.offset, 2);

        /* error strings are distinct and never NULL */
        for (int c = KJSON_OK; c <= KJSON_E_NOMEM; c++) {
                assert_non_null(kjson_error_string(c));
                for (int d = KJSON_OK; d < c; d++)
                        assert_string_not_equal(kjson_error_string(c), kjson_error_string(d));
        }
        assert_non_null(kjson_error_string(99));
        kjson_arena_free(a);
}

/* Every strict prefix of a document that does not end a value is EOF; the
 * full document parses.  Buffers are exact-size, so ASan sees over-reads. */
static void test_every_prefix_is_eof(void **state)
{
        (void)state;
        static const char *const docs[] = {
                "{\"op\":\"plan_commit\",\"plan_id\":\"plan_ae607245ac43\",\"cycle\":1,"
                "\"steps\":[{\"step_id\":\"observe_001\",\"tool\":\"ooda.observe\"}],"
                "\"ts\":\"2026-04-20T12:00:00.123Z\",\"crc\":\"0badf00d\"}",
                "[1,-2.5e+10,0.0,true,false,null,\"\\u00e9\\ud83d\\ude00\xe2\x82\xac\",{},[],{\"\":[]}]",
                "\"\\\\\\\"\\/\\b\\f\\n\\r\\t\"",
                "{ \"a\" : [ 1 , { \"b\" : \"c\" } ] }",
                "[[[[[[[[[[]]]]]]]]]]",
        };
        struct kjson_arena *a = kjson_arena_new();
        for (size_t d = 0; d < sizeof(docs) / sizeof(docs[0]); d++) {
                size_t n = strlen(docs[d]);
                struct kjson *v;
                struct kjson_error err;
                for (size_t cut = 0; cut < n; cut++) {
                        kjson_arena_reset(a);
                        int r = parse_exact(a, docs[d], cut, &v, &err);
                        if (r != -EINVAL || err.code != KJSON_E_EOF)
                                fail_msg("doc %zu cut %zu: r=%d code=%d", d, cut, r, err.code);
                        assert_int_equal(err.offset, cut);
                }
                kjson_arena_reset(a);
                assert_int_equal(parse_exact(a, docs[d], n, &v, &err), 0);
                /* the document with one more byte after it is trailing */
                char *more = malloc(n + 1);
                memcpy(more, docs[d], n);
                more[n] = 'x';
                assert_int_equal(kjson_parse(a, more, n + 1, &v, &err), -EINVAL);
                assert_int_equal(err.code, KJSON_E_TRAILING);
                assert_int_equal(err.offset, n);
                free(more);
        }
        kjson_arena_free(a);
}

static void test_prefix_of_number(void **state)
{
        (void)state;
        /* a bare top-level number is complete, its prefixes too when they
         * end in a digit */
        assert_code("1", KJSON_OK);
        assert_code("12", KJSON_OK);
        assert_code("-0", KJSON_OK);
        assert_code("1.5", KJSON_OK);
        assert_code("1.5e", KJSON_E_EOF);
        assert_code("1.5e+", KJSON_E_EOF);
        assert_code("1.5e+3", KJSON_OK);
        assert_code("[12", KJSON_E_EOF);
        assert_code("{\"a\":12", KJSON_E_EOF);
}

static void test_does_not_read_past_len(void **state)
{
        (void)state;
        struct kjson_arena *a = kjson_arena_new();
        struct kjson *v;
        struct kjson_error err;
        /* the bytes after len would complete the value; they must not count */
        const char *s = "[1,2]";
        assert_int_equal(kjson_parse(a, s, 4, &v, &err), -EINVAL);
        assert_int_equal(err.code, KJSON_E_EOF);
        assert_int_equal(kjson_parse(a, "true", 3, &v, &err), -EINVAL);
        assert_int_equal(err.code, KJSON_E_EOF);
        assert_int_equal(kjson_parse(a, "123", 2, &v, &err), 0);
        assert_int_equal(v->u.num.len, 2);
        assert_string_equal(v->u.num.text, "12");
        assert_int_equal(kjson_parse(a, "\"ab\"", 3, &v, &err), -EINVAL);
        assert_int_equal(err.code, KJSON_E_EOF);
        /* an embedded NUL is not whitespace */
        assert_int_equal(kjson_parse(a, "{}\0", 3, &v, &err), -EINVAL);
        assert_int_equal(err.code, KJSON_E_TRAILING);
        assert_int_equal(kjson_parse(a, "\"a\0b\"", 5, &v, &err), -EINVAL);
        assert_int_equal(err.code, KJSON_E_SYNTAX);
        assert_int_equal(kjson_parse(a, NULL, 0, &v, &err), -EINVAL);
        assert_int_equal(err.code, KJSON_E_EOF);
        kjson_arena_free(a);
}

static void nest(struct kbuf *b, int depth, char open, char close)
{
        for (int i = 0; i < depth; i++)
                assert_int_equal(kbuf_putc(b, open), 0);
        for (int i = 0; i < depth; i++)
                assert_int_equal(kbuf_putc(b, close), 0);
}

static void test_depth_limit(void **state)
{
        (void)state;
        struct kjson_arena *a = kjson_arena_new();
        struct kjson *v;
        struct kjson_error err;
        struct kbuf b = KBUF_INIT;

        nest(&b, KJSON_MAX_DEPTH, '[', ']');
        assert_int_equal(kjson_parse(a, b.data, b.len, &v, &err), 0);
        kbuf_reset(&b);
        nest(&b, KJSON_MAX_DEPTH + 1, '[', ']');
        assert_int_equal(kjson_parse(a, b.data, b.len, &v, &err), -EINVAL);
        assert_int_equal(err.code, KJSON_E_DEPTH);
        assert_int_equal(err.offset, KJSON_MAX_DEPTH);

        /* objects count too */
        kbuf_reset(&b);
        for (int i = 0; i < KJSON_MAX_DEPTH; i++)
                assert_int_equal(kbuf_puts(&b, "{\"a\":"), 0);
        assert_int_equal(kbuf_puts(&b, "1"), 0);
        for (int i = 0; i < KJSON_MAX_DEPTH; i++)
                assert_int_equal(kbuf_putc(&b, '}'), 0);
        assert_int_equal(kjson_parse(a, b.data, b.len, &v, &err), 0);
        kbuf_reset(&b);
        for (int i = 0; i <= KJSON_MAX_DEPTH; i++)
                assert_int_equal(kbuf_puts(&b, "{\"a\":"), 0);
        assert_int_equal(kjson_parse(a, b.data, b.len, &v, &err), -EINVAL);
        assert_int_equal(err.code, KJSON_E_DEPTH);

        /* very deep input fails fast, no stack overflow */
        kbuf_reset(&b);
        nest(&b, 100000, '[', ']');
        assert_int_equal(kjson_parse(a, b.data, b.len, &v, &err), -EINVAL);
        assert_int_equal(err.code, KJSON_E_DEPTH);
        kbuf_free(&b);
        kjson_arena_free(a);
}

static void test_get_last_wins(void **state)
{
        (void)state;
        struct kjson_arena *a = kjson_arena_new();
        struct kjson *v;
        struct kjson_error err;
        const char *s = "{\"op\":\"a\",\"n\":1,\"op\":\"b\",\"x\":null,\"ab\":\"p\",\"a\":2}";

        assert_int_equal(kjson_parse(a, s, strlen(s), &v, &err), 0);
        assert_string_equal(kjson_get_str(v, "op"), "b");
        assert_null(kjson_get_str(v, "n"));         /* not a string */
        assert_null(kjson_get_str(v, "missing"));
        assert_non_null(kjson_get(v, "x"));
        assert_int_equal(kjson_get(v, "x")->type, KJSON_NULL);
        assert_null(kjson_get(v, "o"));             /* prefix of a key */
        assert_null(kjson_get(v, "opx"));
        assert_string_equal(kjson_get_str(v, "ab"), "p");
        assert_int_equal(kjson_get(v, "a")->type, KJSON_NUMBER);
        assert_null(kjson_get(NULL, "a"));
        struct kjson *arr;
        assert_int_equal(kjson_parse(a, "[1]", 3, &arr, &err), 0);
        assert_null(kjson_get(arr, "a"));
        assert_null(kjson_get_str(arr, "a"));

        /* a key holding a NUL does not match its C-string prefix */
        assert_int_equal(kjson_parse(a, "{\"k\\u0000z\":1}", 14, &v, &err), 0);
        assert_int_equal(v->u.obj.members[0].key_len, 3);
        assert_null(kjson_get(v, "k"));
        kjson_arena_free(a);
}

/* kjson_parse_trusted: a raw key's object or array at the top level is kept
 * as its text (strings with quotes and brackets followed); other members,
 * and a raw key's scalar or nested occurrence, are built as usual. */
static void test_parse_trusted(void **state)
{
        (void)state;
        static const char *const raw[] = { "result", NULL };
        const char *in = "{\"op\":\"completed\",\"result\": [{\"s\":\"]}\\\"[\\\\\"},"
                         "{\"result\":[1]}] ,\"x\":{\"result\":{\"a\":1}},\"n\":2}";
        struct kjson_arena *a = kjson_arena_new();
        struct kjson *v = NULL;
        assert_int_equal(kjson_parse_trusted(a, in, strlen(in), raw, &v, NULL), 0);
        const struct kjson *r = kjson_get(v, "result");
        assert_int_equal(r->type, KJSON_RAW);
        assert_int_equal(r->u.raw.len,
                         strlen("[{\"s\":\"]}\\\"[\\\\\"},{\"result\":[1]}]"));
        assert_memory_equal(r->u.raw.text, "[{\"s\":\"]}\\\"[\\\\\"},{\"result\":[1]}]",
                            r->u.raw.len);
        /* not at the top level: built */
        assert_int_equal(kjson_get(kjson_get(v, "x"), "result")->type, KJSON_OBJECT);
        assert_string_equal(kjson_get(v, "op")->u.str.ptr, "completed");
        assert_int_equal(kjson_get(v, "n")->type, KJSON_NUMBER);
        /* written back as its text */
        struct kbuf b = KBUF_INIT;
        assert_int_equal(kjson_write(&b, r), 0);
        assert_memory_equal(b.data, r->u.raw.text, r->u.raw.len);
        kbuf_free(&b);
        /* a scalar under a raw key is built */
        assert_int_equal(kjson_parse_trusted(a, "{\"result\":\"t\"}", 14, raw, &v, NULL), 0);
        assert_int_equal(kjson_get(v, "result")->type, KJSON_STRING);
        /* without keys it is kjson_parse */
        assert_int_equal(kjson_parse_trusted(a, in, strlen(in), NULL, &v, NULL), 0);
        assert_int_equal(kjson_get(v, "result")->type, KJSON_ARRAY);
        /* a cut raw value: the end of the input, not a value */
        struct kjson_error err;
        assert_int_equal(kjson_parse_trusted(a, "{\"result\":[{\"s\":\"]\"}", 20, raw, &v, &err),
                         -EINVAL);
        assert_int_equal(err.code, KJSON_E_EOF);
        assert_int_equal(kjson_parse_trusted(a, "{\"result\":[\"a\\\"]}", 17, raw, &v, &err),
                         -EINVAL);
        assert_int_equal(err.code, KJSON_E_EOF);
        kjson_arena_free(a);
}

/* kjson_parse_nested says whether the text is exactly what kjson_write
 * writes of its value (a handler's output then is the record's text):
 * never when there is whitespace or an escape kbuf_json_string does not
 * write. */
static void test_parse_nested_compact(void **state)
{
        (void)state;
        static const struct {
                const char *s;
                bool compact;
        } cases[] = {
                { "null", true },
                { "{\"b\":[1,2.50,-0,1E+2],\"a\":\"\\\"\\\\\\b\\f\\n\\r\\t\\u0000\\u001f\"}", true },
                { "\"\xc3\xa9\x7f/\"", true },
                { "{\"a\":1,\"a\":2}", true },
                { " null", false },
                { "null\t", false },
                { "[1, 2]", false },
                { "{\"a\":\n1}", false },
                { "[ ]", false },
                { "\"\\/\"", false },
                { "\"\\u00e9\"", false },
                { "\"\\u001F\"", false },
                { "\"\\u0008\"", false },
                { "\"\\u0009\"", false },
                { "\"\\u000a\"", false },
                { "\"\\u000c\"", false },
                { "\"\\u000d\"", false },
                { "\"\\ud83d\\ude00\"", false },
        };
        struct kjson_arena *a = kjson_arena_new();
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
                struct kjson *v;
                bool compact = !cases[i].compact;
                size_t n = strlen(cases[i].s);
                kjson_arena_reset(a);
                assert_int_equal(kjson_parse_nested(a, cases[i].s, n, 1, &v, &compact, NULL), 0);
                assert_int_equal(compact, cases[i].compact);
                struct kbuf w = KBUF_INIT;
                assert_int_equal(kjson_write(&w, v), 0);
                assert_int_equal(w.len == n && memcmp(w.data, cases[i].s, n) == 0,
                                 cases[i].compact);
                kbuf_free(&w);
        }
        kjson_arena_free(a);
}

/* kjson_parse_nested: the value's own nesting is limited by the levels
 * above it; one value only (two are trailing bytes, not the first). */
static void test_parse_nested(void **state)
{
        (void)state;
        struct kjson_arena *a = kjson_arena_new();
        struct kjson *v = NULL;
        struct kjson_error err;
        char deep[2 * KJSON_MAX_DEPTH + 2];
        for (int levels = 0; levels <= 2; levels++) {
                int ok = KJSON_MAX_DEPTH - levels;
                memset(deep, '[', (size_t)ok);
                memset(deep + ok, ']', (size_t)ok);
                assert_int_equal(kjson_parse_nested(a, deep, (size_t)(2 * ok), levels, &v, NULL, &err), 0);
                memset(deep, '[', (size_t)ok + 1);
                memset(deep + ok + 1, ']', (size_t)ok + 1);
                assert_int_equal(kjson_parse_nested(a, deep, (size_t)(2 * ok + 2), levels, &v, NULL, &err),
                                 -EINVAL);
                assert_int_equal(err.code, KJSON_E_DEPTH);
                assert_int_equal(err.offset, (size_t)ok);
        }
        assert_int_equal(kjson_parse_nested(a, "{\"a\":1},{\"b\":2}", 15, 1, &v, NULL, &err), -EINVAL);
        assert_int_equal(err.code, KJSON_E_TRAILING);
        assert_int_equal(err.offset, 7);
        kjson_arena_free(a);
}

static void test_write(void **state)
{
        (void)state;
        static const struct {
                const char *in, *out;
        } cases[] = {
                { " { \"b\" : 1 , \"a\" : [ true , false , null ] } ", "{\"b\":1,\"a\":[true,false,null]}" },
                { "[1.50, -0, 1E+5, 12345678901234567890123]", "[1.50,-0,1E+5,12345678901234567890123]" },
                { "\"\\u002f\\/\\u00e9\\u0001\\u001F\\\"\"", "\"//\xc3\xa9\\u0001\\u001f\\\"\"" },
                { "{\"a\":1,\"a\":2}", "{\"a\":1,\"a\":2}" },
                { "{}", "{}" },
                { "[]", "[]" },
                { "\"\\b\\f\\n\\r\\t\"", "\"\\b\\f\\n\\r\\t\"" },
                { "{\"k\\u0000\":\"\\u0000\"}", "{\"k\\u0000\":\"\\u0000\"}" },
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                char *w = roundtrip(cases[i].in);
                assert_string_equal(w, cases[i].out);
                free(w);
        }

        /* appends after existing content */
        struct kbuf b = KBUF_INIT;
        assert_int_equal(kbuf_puts(&b, "x="), 0);
        struct kjson_arena *a = kjson_arena_new();
        struct kjson *v;
        assert_int_equal(kjson_parse(a, "[1]", 3, &v, NULL), 0);
        assert_int_equal(kjson_write(&b, v), 0);
        assert_string_equal(b.data, "x=[1]");

        /* a hand-built tree with invalid UTF-8 fails and leaves the buffer */
        struct kjson bad = { .type = KJSON_STRING };
        bad.u.str.ptr = "\xff";
        bad.u.str.len = 1;
        struct kjson_member m = { "k", 1, &bad };
        struct kjson obj = { .type = KJSON_OBJECT };
        obj.u.obj.members = &m;
        obj.u.obj.n = 1;
        assert_int_equal(kjson_write(&b, &obj), -EILSEQ);
        assert_int_equal(b.len, 5);
        assert_string_equal(b.data, "x=[1]");
        kbuf_free(&b);
        kjson_arena_free(a);
}

static void test_arena(void **state)
{
        (void)state;
        struct kjson_arena *a = kjson_arena_new();
        assert_non_null(a);

        /* alloc is max-aligned, strndup terminates */
        for (int i = 0; i < 100; i++) {
                void *p = kjson_arena_alloc(a, (size_t)i * 7 + 1);
                assert_non_null(p);
                assert_int_equal((uintptr_t)p % _Alignof(max_align_t), 0);
                memset(p, 0xAB, (size_t)i * 7 + 1);
        }
        char *s = kjson_arena_strndup(a, "hello world", 5);
        assert_string_equal(s, "hello");
        s = kjson_arena_strndup(a, "", 0);
        assert_string_equal(s, "");

        /* a block bigger than a chunk */
        size_t big = 1u << 20;
        unsigned char *p = kjson_arena_alloc(a, big);
        assert_non_null(p);
        memset(p, 1, big);

        /* reset keeps memory: the first allocation after a reset is at the
         * first allocation's address again */
        kjson_arena_reset(a);
        void *first = kjson_arena_alloc(a, 16);
        kjson_arena_reset(a);
        assert_ptr_equal(kjson_arena_alloc(a, 16), first);

        /* many parse/reset rounds keep working and do not grow without bound
         * (ASan/LSan check the frees) */
        const char *doc = "{\"op\":\"transition\",\"step_id\":\"act_001\",\"status\":\"completed\"}";
        for (int i = 0; i < 20000; i++) {
                struct kjson *v;
                kjson_arena_reset(a);
                assert_int_equal(kjson_parse(a, doc, strlen(doc), &v, NULL), 0);
                assert_string_equal(kjson_get_str(v, "status"), "completed");
        }

        /* trees from several parses coexist without reset */
        struct kjson *v1, *v2;
        kjson_arena_reset(a);
        assert_int_equal(kjson_parse(a, "\"one\"", 5, &v1, NULL), 0);
        assert_int_equal(kjson_parse(a, "\"two\"", 5, &v2, NULL), 0);
        assert_string_equal(v1->u.str.ptr, "one");
        assert_string_equal(v2->u.str.ptr, "two");

        kjson_arena_reset(NULL);
        kjson_arena_free(NULL);
        assert_null(kjson_arena_alloc(NULL, 1));
        kjson_arena_free(a);
}

static void test_big_string(void **state)
{
        (void)state;
        /* a string longer than a chunk, with escapes */
        struct kbuf b = KBUF_INIT;
        assert_int_equal(kbuf_putc(&b, '"'), 0);
        for (int i = 0; i < 50000; i++)
                assert_int_equal(kbuf_puts(&b, "ab\\n"), 0);
        assert_int_equal(kbuf_putc(&b, '"'), 0);
        struct kjson_arena *a = kjson_arena_new();
        struct kjson *v;
        assert_int_equal(kjson_parse(a, b.data, b.len, &v, NULL), 0);
        assert_int_equal(v->u.str.len, 150000);
        assert_memory_equal(v->u.str.ptr + 149997, "ab\n", 3);
        kbuf_free(&b);
        kjson_arena_free(a);
}

/* A large text: recurring short strings and the literals are stored once,
 * escaped ones decoded each time; the reserved chunk takes the tree. */
static void test_large_shares_strings(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        assert_int_equal(kbuf_putc(&b, '['), 0);
        for (int i = 0; i < 2000; i++)
                assert_int_equal(kbuf_printf(&b, "%s{\"ab\":\"UTC\",\"a\\u0062\":\"x\\\\y\","
                                                 "\"t\":true,\"n\":null,\"i\":%d}",
                                             i ? "," : "", i),
                                 0);
        assert_int_equal(kbuf_putc(&b, ']'), 0);
        assert_true(b.len > 16 * 1024);
        struct kjson_arena *a = kjson_arena_new();
        void *mem;
        size_t memlen;
        assert_int_equal(kjson_arena_reserve(a, 3 * b.len, &mem, &memlen), 0);
        assert_true(memlen >= 3 * b.len);
        struct kjson *v;
        assert_int_equal(kjson_parse(a, b.data, b.len, &v, NULL), 0);
        assert_true((char *)v >= (char *)mem && (char *)v < (char *)mem + memlen);
        assert_int_equal(kjson_arena_reserve(a, 10, &mem, &memlen), -EBUSY);
        assert_int_equal(v->u.arr.n, 2000);
        const struct kjson *x = v->u.arr.items[0], *y = v->u.arr.items[1999];
        for (size_t m = 0; m < 5; m++) {
                assert_string_equal(x->u.obj.members[m].key, y->u.obj.members[m].key);
                assert_int_equal(x->u.obj.members[m].key_len, y->u.obj.members[m].key_len);
        }
        /* shared: the same raw bytes, no escape */
        assert_ptr_equal(x->u.obj.members[0].key, y->u.obj.members[0].key);
        assert_ptr_equal(x->u.obj.members[0].value->u.str.ptr,
                         y->u.obj.members[0].value->u.str.ptr);
        assert_string_equal(y->u.obj.members[0].value->u.str.ptr, "UTC");
        assert_ptr_equal(kjson_get(x, "t"), kjson_get(y, "t"));
        assert_ptr_equal(kjson_get(x, "n"), kjson_get(y, "n"));
        /* "a\u0062" is "ab" decoded, never the stored raw "ab" */
        assert_string_equal(x->u.obj.members[1].key, "ab");
        assert_ptr_not_equal(x->u.obj.members[1].key, x->u.obj.members[0].key);
        assert_int_equal(kjson_get(y, "i")->u.num.len, 4);
        assert_memory_equal(kjson_get(y, "i")->u.num.text, "1999", 4);
        assert_string_equal(x->u.obj.members[1].value->u.str.ptr, "x\\y");
        assert_string_equal(y->u.obj.members[1].value->u.str.ptr, "x\\y");
        assert_int_equal(kjson_get(y, "t")->type, KJSON_TRUE);
        assert_int_equal(kjson_get(y, "n")->type, KJSON_NULL);
        kjson_arena_reset(a);
        assert_int_equal(kjson_parse(a, "\"UTC\"", 5, &v, NULL), 0);
        assert_string_equal(v->u.str.ptr, "UTC");
        kbuf_free(&b);
        kjson_arena_free(a);
}

static void test_bad_args(void **state)
{
        (void)state;
        struct kjson_arena *a = kjson_arena_new();
        struct kjson *v;
        struct kjson_error err;
        assert_int_equal(kjson_parse(NULL, "1", 1, &v, &err), -EINVAL);
        assert_int_equal(kjson_parse(a, NULL, 3, &v, &err), -EINVAL);
        assert_int_equal(kjson_parse(a, "1", 1, NULL, &err), -EINVAL);
        /* err may be NULL */
        assert_int_equal(kjson_parse(a, "[", 1, &v, NULL), -EINVAL);
        kjson_arena_free(a);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_scalars),
                cmocka_unit_test(test_numbers_keep_text),
                cmocka_unit_test(test_bad_numbers),
                cmocka_unit_test(test_containers),
                cmocka_unit_test(test_large_containers),
                cmocka_unit_test(test_strings_escapes),
                cmocka_unit_test(test_string_errors),
                cmocka_unit_test(test_error_codes),
                cmocka_unit_test(test_error_offsets),
                cmocka_unit_test(test_every_prefix_is_eof),
                cmocka_unit_test(test_prefix_of_number),
                cmocka_unit_test(test_does_not_read_past_len),
                cmocka_unit_test(test_depth_limit),
                cmocka_unit_test(test_get_last_wins),
                cmocka_unit_test(test_write),
                cmocka_unit_test(test_parse_trusted),
                cmocka_unit_test(test_parse_nested),
                cmocka_unit_test(test_parse_nested_compact),
                cmocka_unit_test(test_arena),
                cmocka_unit_test(test_big_string),
                cmocka_unit_test(test_large_shares_strings),
                cmocka_unit_test(test_bad_args),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
