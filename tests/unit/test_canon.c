/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>

#include <cmocka.h>

#include "kairos/canon.h"
#include "kairos/kbuf.h"
#include "kairos/kjson.h"

struct vector {
        const char *input;
        const char *canonical;
        const char *hash;
};

/* docs/design.md §4, verbatim. */
static const struct vector golden[] = {
        { "{\"x\":1,\"a\":2}",
          "{\"a\":2,\"x\":1}",
          "sha256-8d4245d4258fe0902fa060395639a0c8c76cd53bae33b899c45a439005129809" },
        { "{\"b\":1,\"a\":\"sym\"}",
          "{\"a\":\"sym\",\"b\":1}",
          "sha256-7795d5dbc639d23e29255cf3c4fadde4faba880efb9279b74eefc5c1b1c4aff0" },
        { "{\"a\":{\"ts\":\"x\",\"keep\":2},\"b\":[{\"nonce\":\"n\",\"k\":3}],\"request_id\":\"r\"}",
          "{\"a\":{\"keep\":2},\"b\":[{\"k\":3}]}",
          "sha256-a2888d12ba4dd2563ea3ca1200debabf5031cb831144ac38f06b01e96e1ad5d2" },
        { "{\"n\":null,\"t\":true,\"f\":false}",
          "{\"f\":false,\"n\":null,\"t\":true}",
          "sha256-22e00dc2f7b01420f940fbdbfbdf34fa0667cc6500186495023ba37722cbd05e" },
        { "[3,{\"z\":1,\"ts\":9}]",
          "[3,{\"z\":1}]",
          "sha256-b8c8b625ea3175e25abc24b2f4a595948a855ff6b0aee6a64d28d002e708a378" },
        { "\"str\"",
          "\"str\"",
          "sha256-72495b0e1f3c6c961f46d3f249ce968ac758c43b88e50d32aa138681f8a38804" },
        { "{\"phase\":\"observe\",\"cycle\":1,\"state\":\"pre\"}",
          "{\"cycle\":1,\"phase\":\"observe\",\"state\":\"pre\"}",
          "sha256-3e02fda9bdfd78947f64676ba85058fde6c1b94ba361087a722618d887087926" },
        { "{\"b\":1,\"B\":2,\"_\":3,\"aa\":4,\"a\":5,\"\xc3\xa9\":6}",
          "{\"B\":2,\"_\":3,\"a\":5,\"aa\":4,\"b\":1,\"\xc3\xa9\":6}",
          "sha256-71cac729f38b67307d6340548934afb670044a7a3d343e9565345f172742b9e3" },
        { "{\"f\":1.0,\"g\":1e20,\"h\":0.1,\"i\":-0.0,\"j\":2.5e-5,\"big\":12345678901234567890}",
          "{\"big\":12345678901234567890,\"f\":1.0,\"g\":1.0e+20,\"h\":0.1,\"i\":-0.0,\"j\":2.5e-05}",
          "sha256-e2328e0e4f3a07dd5f03a6e64a5620488d7357b6e5894685a79474d73d9677b8" },
};

/* Produced by the original's algorithm in Ruby 3.1 (JSON.parse, drop the
 * volatile keys, sort_by key, JSON.generate, Digest::SHA256). */
static const struct vector reference[] = {
        { "[{\"step_id\":\"s1\",\"tool\":\"t\",\"params_hash\":\"ph\",\"pre_hash\":\"pre\",\"expected_post_hash\":\"post\"}]",
          "[{\"expected_post_hash\":\"post\",\"params_hash\":\"ph\",\"pre_hash\":\"pre\",\"step_id\":\"s1\",\"tool\":\"t\"}]",
          "sha256-9c580c3be4a149be946a9a9a647a294b99d817eeaa7f9fe54168808e853ce77b" },
        { "[0.1,1e-4,1e-5,123456789.123,1e16,1e15,5e-324,1.7976931348623157e308,-1.5,100,100.0,1E2,0.5e1,-0,-0.0,1e-400,-1e-400]",
          "[0.1,0.0001,1.0e-05,123456789.123,1.0e+16,1.0e+15,5.0e-324,1.7976931348623157e+308,-1.5,100,100.0,100.0,5.0,0,-0.0,0.0,-0.0]",
          "sha256-7c5b0264b8aefc2aa3916d4c5d188f46d1bb1a9e4c2bb1ef0efe1d4012d494f0" },
        { "[-123456789012345678901234567890,18446744073709551616,-9223372036854775809]",
          "[-123456789012345678901234567890,18446744073709551616,-9223372036854775809]",
          "sha256-375498d997cc6ceee08e06d44ca97d153960e67e5e0a175ec6b6fb3d73ecbf67" },
        { "{\"a\":1,\"a\":2,\"b\":{\"x\":1,\"x\":{\"ts\":1,\"y\":2}}}",
          "{\"a\":2,\"b\":{\"x\":{\"y\":2}}}",
          "sha256-10db5bb41f62656c29650ee2d76c69640345b688d013b6229539f9629ccc2a8b" },
        { "{\"z\":[{\"timestamp\":1,\"trace_id\":2,\"nonce\":3,\"request_id\":4,\"ts\":5}],\"tsx\":1,\"Ts\":2,\"nonces\":3}",
          "{\"Ts\":2,\"nonces\":3,\"tsx\":1,\"z\":[{}]}",
          "sha256-a036340438754acd6be4222194ba0e2195ccf31e09274358fec9cc85e08991db" },
        { "{\"\\u00e9\":1,\"e\":2,\"\\u20ac\":3,\"\\ud83d\\ude00\":4,\"z\":5,\"Z\":6,\"\":7,\"ab\":8,\"a\":9}",
          "{\"\":7,\"Z\":6,\"a\":9,\"ab\":8,\"e\":2,\"z\":5,\"\303\251\":1,\"\342\202\254\":3,\"\360\237\230\200\":4}",
          "sha256-4dccbae3f4aab356501ab304c851655a294e34b02a68c7b0d4f56959e80964d1" },
        { "\"a\\\"b\\\\c/d\\b\\f\\n\\r\\t\\u0001\\u001f\\u007f\\u2028\303\251\360\237\230\200\"",
          "\"a\\\"b\\\\c/d\\b\\f\\n\\r\\t\\u0001\\u001f\177\342\200\250\303\251\360\237\230\200\"",
          "sha256-9faaad2ee003402701c696fd80cbb60ab36db6fa25c1ba4da2ef5722dbb972f4" },
        { "{\"k\\n\":\"\\u0000\"}",
          "{\"k\\n\":\"\\u0000\"}",
          "sha256-09047bb5f32e9f9eb0bbf3d99c72cdbda0345094c9bd4a7e3a091422e3cb1dcb" },
        { "[[[{\"b\":[{\"d\":1,\"c\":2}],\"a\":null}]]]",
          "[[[{\"a\":null,\"b\":[{\"c\":2,\"d\":1}]}]]]",
          "sha256-2eb6ad151ed25709674f437bad1839083c240895f3fd06299f66cb7602ab3a78" },
        { "[]",
          "[]",
          "sha256-4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945" },
        { "{}",
          "{}",
          "sha256-44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a" },
        { "[5.960464477539063e-08,5.684341886080802e-14,7.120236347223045e-307,1234567890123456.5,9007199254740993,9007199254740993.0,1e22,1e23,0.001,0.0001,0.00012345,0.000012345,123456789012345.0,1e14]",
          "[5.960464477539063e-08,5.684341886080802e-14,7.120236347223045e-307,1234567890123456.5,9007199254740993,9.007199254740992e+15,1.0e+22,1.0e+23,0.001,0.0001,0.00012345,1.2345e-05,123456789012345.0,100000000000000.0]",
          "sha256-3ea11bdee1ce3f1dd4500c5a803dc8b75cabf5108b9442d56eeabd97dbb8125b" },
        { "{\"ts\":{\"a\":1}}",
          "{}",
          "sha256-44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a" },
        { "true",
          "true",
          "sha256-b5bea41b6c623f7c09f1bf24dcae58ebab3c0cdd90ad966bc43a45b44867e12b" },
        { "null",
          "null",
          "sha256-74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b" },
        { "-0",
          "0",
          "sha256-5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9" },
        { "12.0",
          "12.0",
          "sha256-77c52f3feed5acdd119b1f8449d5ccc2d39be94bd0314d5b7302f36e20b6cea9" },
};

#define N(a) (sizeof(a) / sizeof((a)[0]))

static void check_vector(const struct vector *v)
{
        struct kbuf b = KBUF_INIT;
        struct kjson_error err;
        char hash[CANON_HASH_STRLEN];

        int r = canon_json(v->input, strlen(v->input), &b, &err);
        if (r != 0)
                fail_msg("%s: r=%d", v->input, r);
        if (strcmp(b.data, v->canonical) != 0)
                fail_msg("%s:\n got  %s\n want %s", v->input, b.data, v->canonical);
        assert_int_equal(b.len, strlen(v->canonical));
        assert_int_equal(canon_hash_json(v->input, strlen(v->input), hash, &err), 0);
        assert_string_equal(hash, v->hash);
        /* the hash is the hash of the canonical bytes */
        char h2[CANON_HASH_STRLEN];
        canon_hash_bytes(b.data, b.len, h2);
        assert_string_equal(h2, v->hash);
        /* canonical form is a fixed point */
        kbuf_reset(&b);
        assert_int_equal(canon_json(v->canonical, strlen(v->canonical), &b, &err), 0);
        assert_string_equal(b.data, v->canonical);
        kbuf_free(&b);
}

static void test_golden_vectors(void **state)
{
        (void)state;
        for (size_t i = 0; i < N(golden); i++)
                check_vector(&golden[i]);
}

static void test_reference_vectors(void **state)
{
        (void)state;
        for (size_t i = 0; i < N(reference); i++)
                check_vector(&reference[i]);
}

static void test_raw_string_hash(void **state)
{
        (void)state;
        char h[CANON_HASH_STRLEN];
        canon_hash_bytes("summarize", 9, h);
        assert_string_equal(h, "sha256-bae9264d6d972b80f4fe23b4a22b599a1585c7faa7473232694978240159f3fe");
        assert_int_equal(strlen(h), CANON_HASH_STRLEN - 1);
        canon_hash_bytes("", 0, h);
        assert_string_equal(h, "sha256-e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        canon_hash_bytes(NULL, 0, h);
        assert_string_equal(h, "sha256-e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

static void test_plan_hash_example(void **state)
{
        (void)state;
        const char *steps = "[{\"step_id\":\"s1\",\"tool\":\"t\",\"params_hash\":\"ph\","
                            "\"pre_hash\":\"pre\",\"expected_post_hash\":\"post\"}]";
        char h[CANON_HASH_STRLEN];
        assert_int_equal(canon_hash_json(steps, strlen(steps), h, NULL), 0);
        assert_string_equal(h, "sha256-9c580c3be4a149be946a9a9a647a294b99d817eeaa7f9fe54168808e853ce77b");
}

static void test_init(void **state)
{
        (void)state;
        assert_int_equal(canon_init(), 0);
        assert_int_equal(canon_init(), 0);
}

static const struct {
        double d;
        const char *text;
} doubles[] = {
        /* from Ruby 3.1 Float#to_s */
        { 0.1, "0.1" },
        { 0.0001, "0.0001" },
        { 1.0e-05, "1.0e-05" },
        { 123456789.123, "123456789.123" },
        { 1.0e+16, "1.0e+16" },
        { 1.0e+15, "1.0e+15" },
        { 5.0e-324, "5.0e-324" },
        { 1.7976931348623157e+308, "1.7976931348623157e+308" },
        { -1.5, "-1.5" },
        { 1.0, "1.0" },
        { 100.0, "100.0" },
        { 1.0e+20, "1.0e+20" },
        { 2.5e-05, "2.5e-05" },
        { -0.0, "-0.0" },
        { 0.0, "0.0" },
        { 5.960464477539063e-08, "5.960464477539063e-08" },     /* 2^-24 */
        { 5.684341886080802e-14, "5.684341886080802e-14" },     /* 2^-44 */
        { 7.120236347223045e-307, "7.120236347223045e-307" },
        { 1234567890123456.5, "1234567890123456.5" },
        { 9.007199254740992e+15, "9.007199254740992e+15" },
        { 1.0e+22, "1.0e+22" },
        { 1.0e+23, "1.0e+23" },
        { 0.001, "0.001" },
        { 0.00012345, "0.00012345" },
        { 1.2345e-05, "1.2345e-05" },
        { 123456789012345.0, "123456789012345.0" },
        { 100000000000000.0, "100000000000000.0" },
        { 999999999999999.9, "999999999999999.9" },
        { 9999999999999998.0, "9.999999999999998e+15" },
        { 1.5e+15, "1.5e+15" },
        { 1.0e+100, "1.0e+100" },
        { -1.0e-100, "-1.0e-100" },
        { 2.2250738585072014e-308, "2.2250738585072014e-308" },
        { 0.30000000000000004, "0.30000000000000004" },
        { 0.3333333333333333, "0.3333333333333333" },
        { -0.6666666666666666, "-0.6666666666666666" },
        { 1.0e+21, "1.0e+21" },
        { 12.5, "12.5" },
        { -1234.5678, "-1234.5678" },
        { 9.223372036854776e+18, "9.223372036854776e+18" },
        { 1.5e-323, "1.5e-323" },
};

static void test_format_double(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        for (size_t i = 0; i < N(doubles); i++) {
                kbuf_reset(&b);
                assert_int_equal(canon_format_double(doubles[i].d, &b), 0);
                if (strcmp(b.data, doubles[i].text) != 0)
                        fail_msg("%.17g: got %s want %s", doubles[i].d, b.data, doubles[i].text);
        }
        kbuf_reset(&b);
        assert_int_equal(canon_format_double(INFINITY, &b), -EDOM);
        assert_int_equal(canon_format_double(-INFINITY, &b), -EDOM);
        assert_int_equal(canon_format_double(NAN, &b), -EDOM);
        assert_int_equal(b.len, 0);
        kbuf_free(&b);
}

/* Every printed double reads back as the same double. */
static void test_format_double_roundtrip(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        uint64_t x = 0x9E3779B97F4A7C15ull;
        for (int i = 0; i < 20000; i++) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                double d;
                memcpy(&d, &x, sizeof(d));
                if (!isfinite(d))
                        continue;
                kbuf_reset(&b);
                assert_int_equal(canon_format_double(d, &b), 0);
                double back = strtod(b.data, NULL);
                if (memcmp(&back, &d, sizeof(d)) != 0)
                        fail_msg("%a printed as %s", d, b.data);
                /* at most 17 significant digits, always a '.' */
                assert_non_null(strchr(b.data, '.'));
        }
        kbuf_free(&b);
}

static void test_float_literals(void **state)
{
        (void)state;
        static const struct {
                const char *in, *out;
        } cases[] = {
                { "1E2", "100.0" },
                { "1e+2", "100.0" },
                { "0.5e1", "5.0" },
                { "-0.0", "-0.0" },
                { "0e0", "0.0" },
                { "-0e5", "-0.0" },
                { "1e-400", "0.0" },         /* underflow reads as zero */
                { "-1e-400", "-0.0" },
                { "2.50", "2.5" },
                { "100.000", "100.0" },
                { "1.0000000000000000000000001", "1.0" },
                { "0.1000000000000000055511151231257827", "0.1" },
                { "[1.0,1]", "[1.0,1]" },
        };
        struct kbuf b = KBUF_INIT;
        for (size_t i = 0; i < N(cases); i++) {
                kbuf_reset(&b);
                assert_int_equal(canon_json(cases[i].in, strlen(cases[i].in), &b, NULL), 0);
                assert_string_equal(b.data, cases[i].out);
        }
        kbuf_free(&b);
}

static void test_integers_exact(void **state)
{
        (void)state;
        static const struct {
                const char *in, *out;
        } cases[] = {
                { "-0", "0" },
                { "0", "0" },
                { "-1", "-1" },
                { "9223372036854775807", "9223372036854775807" },
                { "9223372036854775808", "9223372036854775808" },
                { "-9223372036854775809", "-9223372036854775809" },
                { "-123456789012345678901234567890123456789012345678901234567890",
                  "-123456789012345678901234567890123456789012345678901234567890" },
                { "[-0,-0.0]", "[0,-0.0]" },
        };
        struct kbuf b = KBUF_INIT;
        for (size_t i = 0; i < N(cases); i++) {
                kbuf_reset(&b);
                assert_int_equal(canon_json(cases[i].in, strlen(cases[i].in), &b, NULL), 0);
                assert_string_equal(b.data, cases[i].out);
        }
        kbuf_free(&b);
}

static void test_volatile_keys(void **state)
{
        (void)state;
        static const struct {
                const char *in, *out;
        } cases[] = {
                { "{\"timestamp\":1,\"ts\":2,\"request_id\":3,\"trace_id\":4,\"nonce\":5}", "{}" },
                { "{\"TS\":1,\"ts_\":2,\"t\":3,\"nonce \":4,\"Nonce\":5}",
                  "{\"Nonce\":5,\"TS\":1,\"nonce \":4,\"t\":3,\"ts_\":2}" },
                { "[{\"ts\":1},[{\"a\":{\"nonce\":[1]}}]]", "[{},[{\"a\":{}}]]" },
                { "{\"a\":[\"ts\",\"nonce\"]}", "{\"a\":[\"ts\",\"nonce\"]}" },  /* values stay */
                { "{\"ts\":1,\"ts\":2,\"a\":1}", "{\"a\":1}" },
                { "{\"t\\u0073\":1}", "{}" },                                  /* escaped key */
                { "{\"ts\\u0000\":1}", "{\"ts\\u0000\":1}" },                  /* not "ts" */
        };
        struct kbuf b = KBUF_INIT;
        for (size_t i = 0; i < N(cases); i++) {
                kbuf_reset(&b);
                assert_int_equal(canon_json(cases[i].in, strlen(cases[i].in), &b, NULL), 0);
                assert_string_equal(b.data, cases[i].out);
        }
        kbuf_free(&b);
}

static void test_sorting_and_duplicates(void **state)
{
        (void)state;
        static const struct {
                const char *in, *out;
        } cases[] = {
                /* shorter prefix first, bytewise (uppercase before lowercase) */
                { "{\"ab\":1,\"a\":2,\"abc\":3,\"A\":4,\"\":5}",
                  "{\"\":5,\"A\":4,\"a\":2,\"ab\":1,\"abc\":3}" },
                /* UTF-8 byte order: U+00E9 (c3 a9) < U+20AC (e2 82 ac) < U+1F600 (f0 ...) */
                { "{\"\\ud83d\\ude00\":1,\"\xe2\x82\xac\":2,\"\\u00e9\":3,\"~\":4}",
                  "{\"~\":4,\"\xc3\xa9\":3,\"\xe2\x82\xac\":2,\"\xf0\x9f\x98\x80\":1}" },
                /* keys differing after a NUL */
                { "{\"a\\u0000b\":1,\"a\":2,\"a\\u0000a\":3}",
                  "{\"a\":2,\"a\\u0000a\":3,\"a\\u0000b\":1}" },
                /* duplicates: last value wins, at every depth */
                { "{\"a\":1,\"b\":0,\"a\":2,\"a\":3}", "{\"a\":3,\"b\":0}" },
                { "[{\"k\":{\"x\":1},\"k\":{\"y\":2}}]", "[{\"k\":{\"y\":2}}]" },
                /* a duplicate whose last value is removed-key-free */
                { "{\"a\":{\"ts\":1},\"a\":{\"b\":1,\"ts\":2}}", "{\"a\":{\"b\":1}}" },
                /* arrays keep their order */
                { "[3,1,2,{\"b\":1,\"a\":2},[\"z\",\"a\"]]", "[3,1,2,{\"a\":2,\"b\":1},[\"z\",\"a\"]]" },
        };
        struct kbuf b = KBUF_INIT;
        for (size_t i = 0; i < N(cases); i++) {
                kbuf_reset(&b);
                assert_int_equal(canon_json(cases[i].in, strlen(cases[i].in), &b, NULL), 0);
                if (strcmp(b.data, cases[i].out) != 0)
                        fail_msg("%s: got %s want %s", cases[i].in, b.data, cases[i].out);
        }
        /* many keys in reverse order */
        struct kbuf in = KBUF_INIT, want = KBUF_INIT;
        assert_int_equal(kbuf_putc(&in, '{'), 0);
        assert_int_equal(kbuf_putc(&want, '{'), 0);
        for (int i = 999; i >= 0; i--)
                assert_int_equal(kbuf_printf(&in, "%s\"k%04d\":%d", i == 999 ? "" : ",", i, i), 0);
        for (int i = 0; i < 1000; i++)
                assert_int_equal(kbuf_printf(&want, "%s\"k%04d\":%d", i ? "," : "", i, i), 0);
        assert_int_equal(kbuf_putc(&in, '}'), 0);
        assert_int_equal(kbuf_putc(&want, '}'), 0);
        kbuf_reset(&b);
        assert_int_equal(canon_json(in.data, in.len, &b, NULL), 0);
        assert_string_equal(b.data, want.data);
        kbuf_free(&in);
        kbuf_free(&want);
        kbuf_free(&b);
}

static void test_strings_and_whitespace(void **state)
{
        (void)state;
        static const struct {
                const char *in, *out;
        } cases[] = {
                { " { \"a\" :\t[ 1 ,\n2 ] }\r\n", "{\"a\":[1,2]}" },
                { "\"\\/\\u00e9\\u20ac\"", "\"/\xc3\xa9\xe2\x82\xac\"" },
                { "\"\\u0001\\u001f\\u007f\\u0000\"", "\"\\u0001\\u001f\x7f\\u0000\"" },
                { "\"\\b\\f\\n\\r\\t\\\"\\\\\"", "\"\\b\\f\\n\\r\\t\\\"\\\\\"" },
                { "\"\\u000B\\u001A\"", "\"\\u000b\\u001a\"" },
        };
        struct kbuf b = KBUF_INIT;
        for (size_t i = 0; i < N(cases); i++) {
                kbuf_reset(&b);
                assert_int_equal(canon_json(cases[i].in, strlen(cases[i].in), &b, NULL), 0);
                assert_string_equal(b.data, cases[i].out);
        }
        kbuf_free(&b);
}

static void test_deep_nesting(void **state)
{
        (void)state;
        struct kbuf in = KBUF_INIT, out = KBUF_INIT;
        for (int i = 0; i < KJSON_MAX_DEPTH - 1; i++)
                assert_int_equal(kbuf_puts(&in, "{\"z\":1,\"a\":"), 0);
        assert_int_equal(kbuf_puts(&in, "[]"), 0);
        for (int i = 0; i < KJSON_MAX_DEPTH - 1; i++)
                assert_int_equal(kbuf_putc(&in, '}'), 0);
        assert_int_equal(canon_json(in.data, in.len, &out, NULL), 0);
        assert_int_equal(out.len, in.len);
        assert_memory_equal(out.data, "{\"a\":{\"a\":", 10);
        kbuf_free(&in);
        kbuf_free(&out);
}

static void test_errors(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        struct kjson_error err;
        char h[CANON_HASH_STRLEN];

        assert_int_equal(kbuf_puts(&b, "keep"), 0);
        /* non-finite numbers */
        assert_int_equal(canon_json("1e400", 5, &b, &err), -EDOM);
        assert_int_equal(canon_json("{\"a\":[-1e400]}", 14, &b, &err), -EDOM);
        assert_int_equal(canon_json("[1,2,{\"x\":1.8e308}]", 19, &b, &err), -EDOM);
        assert_int_equal(canon_hash_json("1e400", 5, h, &err), -EDOM);
        /* NaN-like text is a syntax error */
        assert_int_equal(canon_json("NaN", 3, &b, &err), -EINVAL);
        assert_int_equal(err.code, KJSON_E_SYNTAX);
        assert_int_equal(canon_json("[Infinity]", 10, &b, &err), -EINVAL);
        assert_int_equal(err.code, KJSON_E_SYNTAX);
        assert_int_equal(err.offset, 1);
        assert_int_equal(canon_json("[-Infinity]", 11, &b, &err), -EINVAL);
        assert_int_equal(err.offset, 2);
        /* bad JSON */
        assert_int_equal(canon_json("{\"a\":1,}", 8, &b, &err), -EINVAL);
        assert_int_equal(err.code, KJSON_E_SYNTAX);
        assert_int_equal(err.offset, 7);
        assert_int_equal(canon_json("{\"a\":", 5, &b, &err), -EINVAL);
        assert_int_equal(err.code, KJSON_E_EOF);
        assert_int_equal(canon_json("{} {}", 5, &b, &err), -EINVAL);
        assert_int_equal(err.code, KJSON_E_TRAILING);
        assert_int_equal(canon_hash_json("[", 1, h, &err), -EINVAL);
        assert_int_equal(canon_json("", 0, &b, NULL), -EINVAL);
        /* nothing was appended by any failure */
        assert_string_equal(b.data, "keep");
        assert_int_equal(b.len, 4);
        kbuf_free(&b);
}

static void test_hand_built_trees(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        char h[CANON_HASH_STRLEN];

        /* number text that is not NUL-terminated */
        const char digits[] = "2.50xyz";
        struct kjson num = { .type = KJSON_NUMBER };
        num.u.num.text = digits;
        num.u.num.len = 4;
        num.u.num.is_float = true;
        assert_int_equal(canon_write(&b, &num), 0);
        assert_string_equal(b.data, "2.5");

        /* a long float literal (heap copy path) */
        char longnum[200];
        memset(longnum, '0', sizeof(longnum));
        longnum[0] = '1';
        longnum[1] = '.';
        longnum[199] = '1';
        num.u.num.text = longnum;
        num.u.num.len = sizeof(longnum);
        kbuf_reset(&b);
        assert_int_equal(canon_write(&b, &num), 0);
        assert_string_equal(b.data, "1.0");

        /* invalid number text */
        num.u.num.text = "1.5x";
        num.u.num.len = 4;
        kbuf_reset(&b);
        assert_int_equal(canon_write(&b, &num), -EINVAL);
        num.u.num.len = 0;
        assert_int_equal(canon_write(&b, &num), -EINVAL);

        /* invalid UTF-8 in a key: -EILSEQ, nothing appended */
        struct kjson one = { .type = KJSON_NUMBER };
        one.u.num.text = "1";
        one.u.num.len = 1;
        struct kjson_member m[2] = { { "ok", 2, &one }, { "\xff", 1, &one } };
        struct kjson obj = { .type = KJSON_OBJECT };
        obj.u.obj.members = m;
        obj.u.obj.n = 2;
        kbuf_reset(&b);
        assert_int_equal(canon_write(&b, &obj), -EILSEQ);
        assert_int_equal(b.len, 0);
        assert_int_equal(canon_hash_value(&obj, h), -EILSEQ);

        /* hash of a value equals hash of its text */
        obj.u.obj.n = 1;
        assert_int_equal(canon_hash_value(&obj, h), 0);
        char h2[CANON_HASH_STRLEN];
        assert_int_equal(canon_hash_json("{\"ok\":1}", 8, h2, NULL), 0);
        assert_string_equal(h, h2);

        /* NULL child */
        struct kjson *items[1] = { NULL };
        struct kjson arr = { .type = KJSON_ARRAY };
        arr.u.arr.items = items;
        arr.u.arr.n = 1;
        assert_int_equal(canon_write(&b, &arr), -EINVAL);
        kbuf_free(&b);
}

static void test_value_from_parse(void **state)
{
        (void)state;
        struct kjson_arena *a = kjson_arena_new();
        struct kjson *v;
        const char *s = "{\"result\":{\"b\":[1.50,{\"ts\":1,\"y\":true}],\"a\":null},\"op\":\"x\"}";
        assert_int_equal(kjson_parse(a, s, strlen(s), &v, NULL), 0);
        char h[CANON_HASH_STRLEN];
        assert_int_equal(canon_hash_value(kjson_get(v, "result"), h), 0);
        char want[CANON_HASH_STRLEN];
        const char *c = "{\"a\":null,\"b\":[1.5,{\"y\":true}]}";
        canon_hash_bytes(c, strlen(c), want);
        assert_string_equal(h, want);
        kjson_arena_free(a);
}

/* A number's text of at most 15 significant digits is written from its own
 * digits, never converted: the same bytes as from the double it denotes
 * (the shortest digits that read back), for random texts of 1 to 17 digits,
 * leading and trailing zeros, points, exponents near and past the range. */
/* The tree's hash of text, the way a result was hashed before the one-pass
 * reader: parse (one level nested, as a record holds it), canon_hash_value. */
static int tree_hash(const char *s, size_t n, char h[CANON_HASH_STRLEN], bool *ret_same)
{
        struct kjson_arena *a = kjson_arena_new();
        struct kjson *v;
        int r = kjson_parse_nested(a, s, n, 1, &v, ret_same, NULL);
        if (r == 0)
                r = canon_hash_value(v, h);
        kjson_arena_free(a);
        return r;
}

/* A handler's compact output is hashed in one pass without a tree
 * (canon_hash_compact): the same hash as the tree's for every escape
 * kbuf_json_string writes, UTF-8, numbers in every form, keys out of order,
 * duplicate and volatile keys, at any depth the record allows; anything
 * else is left to the tree (-EAGAIN), which finds it not compact or not
 * JSON. */
/* The members of the open objects on the stack until there are many: every
 * count around the stack's room (32), with an object open inside the last
 * member, hashes as the tree does. */
static void test_hash_compact_member_room(void **state)
{
        (void)state;
        for (int n = 1; n <= 70; n++) {
                struct kbuf b = KBUF_INIT;
                kbuf_putc(&b, '{');
                for (int i = n; i > 0; i--)
                        kbuf_printf(&b, "%s\"m%03d\":%s", i == n ? "" : ",", i,
                                    i == 1 ? "{\"y\":[{\"b\":1,\"a\":2}],\"x\":0}" : "7");
                kbuf_putc(&b, '}');
                char h1[CANON_HASH_STRLEN], h2[CANON_HASH_STRLEN];
                bool compact = false;
                assert_int_equal(canon_hash_compact(b.data, b.len, KJSON_MAX_DEPTH - 1, h1), 0);
                assert_int_equal(tree_hash(b.data, b.len, h2, &compact), 0);
                assert_string_equal(h1, h2);
                kbuf_free(&b);
        }
}

/* The canonical text on the stack until it is long (2 KiB): every length
 * around that, an object rewritten at its close after it moved, hashes as
 * the tree does. */
static void test_hash_compact_out_room(void **state)
{
        (void)state;
        char pad[2200];
        memset(pad, 'p', sizeof pad);
        for (int n = 1980; n <= 2100; n++) {
                struct kbuf b = KBUF_INIT;
                kbuf_printf(&b, "[{\"z\":\"%.*s\",\"a\":{\"y\":1,\"b\":2}},{\"b\":1,\"a\":0}]",
                            n, pad);
                char h1[CANON_HASH_STRLEN], h2[CANON_HASH_STRLEN];
                bool compact = false;
                assert_int_equal(canon_hash_compact(b.data, b.len, KJSON_MAX_DEPTH - 1, h1), 0);
                assert_int_equal(tree_hash(b.data, b.len, h2, &compact), 0);
                assert_string_equal(h1, h2);
                kbuf_free(&b);
        }
}

static void test_hash_compact(void **state)
{
        (void)state;
        static const char *const same[] = {
                "null", "true", "false", "0", "-0", "-0.0", "1", "-12",
                "123456789012345678901234567890", "1.5", "1.50", "0.1", "100.0", "1e2",
                "1E+2", "2.5e-05", "1.0e-7", "-1.5E3", "1e22", "123456789012345678.5",
                "0.000001", "4.35", "1.7976931348623157e308", "5e-324",
                "\"\"", "\"plain\"", "\"\\\"\\\\\\b\\f\\n\\r\\t\"",
                "\"\\u0000\\u0001\\u001f\\u000b\\u0011\"", "\"/\x7f\"",
                "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xef\xbf\xbf\"",
                "[]", "{}", "[[]]", "[{}]", "[1,\"a\",null,true,[2.50]]",
                "{\"b\":1,\"a\":2}", "{\"a\":1,\"b\":2}", "{\"a\":1,\"a\":2}",
                "{\"b\":{\"d\":[1,{\"z\":0,\"y\":1}],\"c\":2},\"a\":3,\"b\":4}",
                "{\"ts\":1,\"x\":{\"nonce\":2,\"trace_id\":3,\"request_id\":4,\"timestamp\":5}}",
                "{\"\xc3\xa9\":1,\"e\":2,\"\":3,\"ee\":4}",
                "{\"k\":\"\\\"}\\\\\",\"j\":\"[{\"}",
                "[{\"id\":0,\"name\":\"item-000000\",\"score\":0.5,\"tags\":[\"a\",\"bb\"],"
                "\"ok\":true}]",
        };
        for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
                char h1[CANON_HASH_STRLEN], h2[CANON_HASH_STRLEN];
                bool compact = false;
                size_t n = strlen(same[i]);
                assert_int_equal(canon_hash_compact(same[i], n, KJSON_MAX_DEPTH - 1, h1), 0);
                assert_int_equal(tree_hash(same[i], n, h2, &compact), 0);
                assert_true(compact);
                assert_string_equal(h1, h2);
        }
        /* a member order kept as written when it is canonical, rewritten
         * otherwise: many members (sorted by qsort) too */
        struct kbuf b = KBUF_INIT;
        kbuf_putc(&b, '{');
        for (int i = 40; i > 0; i--)
                kbuf_printf(&b, "%s\"k%02d\":[%d,{\"z\":%d,\"a\":\"%d\"}]", i == 40 ? "" : ",",
                            i % 23, i, i, i);
        kbuf_putc(&b, '}');
        char h1[CANON_HASH_STRLEN], h2[CANON_HASH_STRLEN];
        bool compact = false;
        assert_int_equal(canon_hash_compact(b.data, b.len, KJSON_MAX_DEPTH - 1, h1), 0);
        assert_int_equal(tree_hash(b.data, b.len, h2, &compact), 0);
        assert_string_equal(h1, h2);
        /* deep: 127 containers are a result's limit (the record is one more) */
        kbuf_reset(&b);
        for (int i = 0; i < KJSON_MAX_DEPTH - 1; i++)
                kbuf_puts(&b, i % 2 ? "{\"k\":" : "[");
        kbuf_puts(&b, "1");
        for (int i = KJSON_MAX_DEPTH - 1; i-- > 0;)
                kbuf_puts(&b, i % 2 ? "}" : "]");
        assert_int_equal(canon_hash_compact(b.data, b.len, KJSON_MAX_DEPTH - 1, h1), 0);
        assert_int_equal(tree_hash(b.data, b.len, h2, &compact), 0);
        assert_string_equal(h1, h2);
        kbuf_reset(&b);
        for (int i = 0; i < KJSON_MAX_DEPTH; i++)
                kbuf_putc(&b, '[');
        for (int i = 0; i < KJSON_MAX_DEPTH; i++)
                kbuf_putc(&b, ']');
        assert_int_equal(canon_hash_compact(b.data, b.len, KJSON_MAX_DEPTH - 1, h1), -EAGAIN);
        assert_int_equal(tree_hash(b.data, b.len, h2, &compact), -EINVAL);
        kbuf_free(&b);

        /* left to the tree: not compact, or not JSON, or no canonical form */
        static const char *const other[] = {
                "", " 1", "1 ", "[1, 2]", "{\"a\" :1}", "[\n]", "\"\\/\"", "\"\\u00e9\"",
                "\"\\u001F\"", "\"\\u0008\"", "\"\\u000a\"", "{\"a\\u0000\":1}",
                "{\"a\\n\":1}", "nul", "[1,]", "{\"a\":1,}", "01", "1.", "-", "+1", ".5",
                "1e", "[1]]", "[1", "\"a", "\"\x01\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"",
                "\"\xf4\x90\x80\x80\"", "\"\xe2\x82\"", "1e400", "[-1e999]", "{\"a\":1}x",
                "tru", "nan", "{1:2}", "{\"a\"}",
        };
        for (size_t i = 0; i < sizeof other / sizeof other[0]; i++)
                assert_int_equal(canon_hash_compact(other[i], strlen(other[i]),
                                                    KJSON_MAX_DEPTH - 1, h1),
                                 -EAGAIN);
}

static void test_float_text_same_as_double(void **state)
{
        (void)state;
        uint64_t x = 0x9e3779b97f4a7c15ULL;
        for (int round = 0; round < 60000; round++) {
                char t[80];
                size_t k = 0;
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                if (x & 1)
                        t[k++] = '-';
                int ndig = 1 + (int)((x >> 1) % 17);
                int point = (int)((x >> 6) % (unsigned)(ndig + 1));
                int zeros = (int)((x >> 11) % 4);
                char dg[20];
                for (int i = 0; i < ndig; i++) {
                        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                        /* digit 0 often: trailing and inner zeros */
                        dg[i] = (char)('0' + ((x & 3) == 0 ? 0 : (int)((x >> 8) % 10)));
                }
                if (point && dg[0] == '0')
                        dg[0] = '7'; /* no leading zero in the integer part */
                if (point == 0)
                        t[k++] = '0';
                for (int i = 0; i < point; i++)
                        t[k++] = dg[i];
                if (point < ndig || !((x >> 30) & 1)) {
                        t[k++] = '.';
                        for (int z = 0; point == 0 && z < zeros; z++)
                                t[k++] = '0';
                        for (int i = point; i < ndig; i++)
                                t[k++] = dg[i];
                        if (point == ndig)
                                t[k++] = '0';
                }
                if ((x >> 30) & 1) {
                        int e = (int)((x >> 32) % 641) - 320;
                        k += (size_t)snprintf(t + k, sizeof t - k, "%s%d", (x >> 40) & 1 ? "E" : "e",
                                              e);
                }
                t[k] = '\0';
                struct kbuf via_text = KBUF_INIT, via_double = KBUF_INIT;
                int r1 = canon_json(t, k, &via_text, NULL);
                double d = strtod(t, NULL);
                int r2 = isfinite(d) ? canon_format_double(d, &via_double) : -EDOM;
                if (r1 == 0 && r2 == 0 && strcmp(via_text.data, via_double.data) != 0)
                        fail_msg("%s: %s from the text, %s from the double", t, via_text.data,
                                 via_double.data);
                if ((r1 == 0) != (r2 == 0))
                        fail_msg("%s: %d from the text, %d from the double", t, r1, r2);
                kbuf_free(&via_text);
                kbuf_free(&via_double);
        }
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_init),
                cmocka_unit_test(test_golden_vectors),
                cmocka_unit_test(test_reference_vectors),
                cmocka_unit_test(test_raw_string_hash),
                cmocka_unit_test(test_plan_hash_example),
                cmocka_unit_test(test_format_double),
                cmocka_unit_test(test_format_double_roundtrip),
                cmocka_unit_test(test_float_literals),
                cmocka_unit_test(test_float_text_same_as_double),
                cmocka_unit_test(test_integers_exact),
                cmocka_unit_test(test_volatile_keys),
                cmocka_unit_test(test_sorting_and_duplicates),
                cmocka_unit_test(test_strings_and_whitespace),
                cmocka_unit_test(test_deep_nesting),
                cmocka_unit_test(test_errors),
                cmocka_unit_test(test_hand_built_trees),
                cmocka_unit_test(test_value_from_parse),
                cmocka_unit_test(test_hash_compact),
                cmocka_unit_test(test_hash_compact_member_room),
                cmocka_unit_test(test_hash_compact_out_room),
        };
        canon_init();
        return cmocka_run_group_tests(tests, NULL, NULL);
}
