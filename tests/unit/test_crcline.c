/* SPDX-License-Identifier: MIT */
/* crcline: sealing, checking and scanning JSON lines with a crc. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <zlib.h>
#include <stdio.h>

#include "kairos/crcline.h"
#include "kairos/kbuf.h"
#include "kairos/kjson.h"

/* Append a sealed line for the object text obj. */
static void sealed(struct kbuf *b, const char *obj)
{
        size_t start = b->len;
        assert_int_equal(kbuf_puts(b, obj), 0);
        assert_int_equal(crcline_seal(b, start), 0);
}

struct seen {
        size_t records, bad, rejects_left;
        size_t bad_lines[8];
        char last_op[32];
};

static int on_record(void *ctx, const struct kjson *obj, size_t line, bool legacy)
{
        struct seen *s = ctx;
        (void)line;
        (void)legacy;
        const char *op = kjson_get_str(obj, "op");
        snprintf(s->last_op, sizeof s->last_op, "%s", op ? op : "");
        if (op && strcmp(op, "reject") == 0)
                return CRCLINE_REJECT;
        s->records++;
        return 0;
}

static int on_bad(void *ctx, const char *l, size_t n, size_t line, size_t offset, const char *why)
{
        struct seen *s = ctx;
        (void)l;
        (void)n;
        (void)offset;
        (void)why;
        if (s->bad < 8)
                s->bad_lines[s->bad] = line;
        s->bad++;
        return 0;
}

static int scan(const struct kbuf *b, unsigned flags, struct seen *s, struct crcline_result *res)
{
        struct kjson_arena *a = kjson_arena_new();
        assert_non_null(a);
        struct crcline_scan sc = { .flags = flags, .record = on_record, .bad = on_bad, .ctx = s,
                                   .arena = a };
        memset(s, 0, sizeof(*s));
        int r = crcline_scan(&sc, b->data ? b->data : "", b->len, res);
        kjson_arena_free(a);
        return r;
}

static void test_seal_and_check(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        sealed(&b, "{\"op\":\"x\",\"ts\":\"t\"}");
        assert_int_equal(b.data[b.len - 1], '\n');
        uint32_t crc;
        assert_true(crcline_has_suffix(b.data, b.len - 1, &crc));
        assert_int_equal(crcline_body_crc(b.data, b.len - 1), crc);
        struct kjson_arena *a = kjson_arena_new();
        const struct kjson *obj = NULL;
        bool legacy = true;
        char why[96];
        assert_int_equal(crcline_check(a, 0, b.data, b.len - 1, &obj, &legacy, why, sizeof why), 1);
        assert_false(legacy);
        /* one flipped bit in the body: crc mismatch */
        b.data[8] ^= 1;
        assert_int_equal(crcline_check(a, 0, b.data, b.len - 1, &obj, &legacy, why, sizeof why), 0);
        assert_string_equal(why, "crc mismatch");
        /* a line this process sealed in memory (CRCLINE_OWN): its crc is
         * not computed again (a changed letter goes unseen), its suffix is
         * still required */
        b.data[8] ^= 1;
        b.data[7] ^= 1;
        assert_int_equal(crcline_check(a, 0, b.data, b.len - 1, &obj, &legacy, why, sizeof why), 0);
        assert_int_equal(crcline_check(a, CRCLINE_OWN, b.data, b.len - 1, &obj, &legacy, why,
                                       sizeof why), 1);
        const char *own_leg = "{\"op\":\"x\",\"ts\":\"t\"}";
        assert_int_equal(crcline_check(a, CRCLINE_OWN, own_leg, strlen(own_leg), &obj, &legacy,
                                       why, sizeof why), 0);
        /* legacy lines only when asked, and only ending with ts */
        const char *leg = "{\"op\":\"x\",\"ts\":\"t\"}";
        assert_int_equal(crcline_check(a, 0, leg, strlen(leg), &obj, &legacy, why, sizeof why), 0);
        assert_int_equal(crcline_check(a, CRCLINE_LEGACY, leg, strlen(leg), &obj, &legacy, why,
                                       sizeof why), 1);
        assert_true(legacy);
        const char *nots = "{\"ts\":\"t\",\"op\":\"x\"}";
        assert_int_equal(crcline_check(a, CRCLINE_LEGACY, nots, strlen(nots), &obj, &legacy, why,
                                       sizeof why), 0);
        /* a seal needs a closing brace */
        struct kbuf c = KBUF_INIT;
        kbuf_puts(&c, "[1]x");
        assert_int_equal(crcline_seal(&c, 0), -EINVAL);
        kbuf_free(&c);
        kjson_arena_free(a);
        kbuf_free(&b);
}

static void test_clean_blank_crlf(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        sealed(&b, "{\"op\":\"a\"}");
        kbuf_puts(&b, "  \n");
        sealed(&b, "{\"op\":\"b\"}");
        b.data[b.len - 1] = '\r';
        kbuf_putc(&b, '\n');
        struct seen s;
        struct crcline_result res;
        assert_int_equal(scan(&b, 0, &s, &res), 0);
        assert_int_equal(res.status, CRCLINE_CLEAN);
        assert_int_equal(s.records, 2);
        assert_int_equal(res.records, 2);
        assert_int_equal(res.lines, 3);
        assert_int_equal(res.good_end, b.len);
        assert_int_equal(res.complete_end, b.len);
        kbuf_free(&b);
}

static void test_torn_tails(void **state)
{
        (void)state;
        struct kbuf good = KBUF_INIT;
        sealed(&good, "{\"op\":\"a\"}");
        size_t boundary = good.len;
        struct kbuf rec = KBUF_INIT;
        sealed(&rec, "{\"op\":\"b\",\"x\":\"yyyy\"}");
        /* every strict prefix of the second record is torn, in both modes */
        for (size_t k = 1; k < rec.len; k++) {
                for (int mode = 0; mode < 2; mode++) {
                        struct kbuf b = KBUF_INIT;
                        kbuf_append(&b, good.data, good.len);
                        kbuf_append(&b, rec.data, k);
                        struct seen s;
                        struct crcline_result res;
                        assert_int_equal(scan(&b, mode ? CRCLINE_KEEP_GOING : 0, &s, &res), 0);
                        assert_int_equal(res.status, CRCLINE_TORN);
                        assert_int_equal(s.records, 1);
                        assert_int_equal(res.good_end, boundary);
                        assert_int_equal(res.torn_bytes, k);
                        assert_int_equal(res.bad_offset, boundary);
                        assert_int_equal(s.bad, 0);
                        kbuf_free(&b);
                }
        }
        /* NUL bytes after the last record */
        struct kbuf z = KBUF_INIT;
        kbuf_append(&z, good.data, good.len);
        kbuf_append(&z, "\0\0\0\0", 4);
        struct seen s;
        struct crcline_result res;
        assert_int_equal(scan(&z, 0, &s, &res), 0);
        assert_int_equal(res.status, CRCLINE_TORN);
        assert_int_equal(res.torn_bytes, 4);
        kbuf_free(&z);
        kbuf_free(&rec);
        kbuf_free(&good);
}

static void test_corruption(void **state)
{
        (void)state;
        struct seen s;
        struct crcline_result res;
        /* a bad line followed by a good one: corrupt, nothing after it read */
        struct kbuf b = KBUF_INIT;
        sealed(&b, "{\"op\":\"a\"}");
        size_t bad_at = b.len;
        kbuf_puts(&b, "{\"op\":\"garbage\n");
        sealed(&b, "{\"op\":\"c\"}");
        assert_int_equal(scan(&b, 0, &s, &res), 0);
        assert_int_equal(res.status, CRCLINE_CORRUPT);
        assert_int_equal(s.records, 1);
        assert_int_equal(res.bad_line, 2);
        assert_int_equal(res.bad_offset, bad_at);
        assert_int_equal(res.lines, 3);
        assert_non_null(strstr(res.bad_reason, "followed by more records"));
        /* keep going: the good line after it is read, the bad one reported */
        assert_int_equal(scan(&b, CRCLINE_KEEP_GOING, &s, &res), 0);
        assert_int_equal(res.status, CRCLINE_CORRUPT);
        assert_int_equal(s.records, 2);
        assert_int_equal(s.bad, 1);
        assert_int_equal(s.bad_lines[0], 2);
        assert_int_equal(res.bad_lines, 1);
        kbuf_free(&b);

        /* a lost newline merged two records: never a torn tail */
        struct kbuf m = KBUF_INIT;
        sealed(&m, "{\"op\":\"a\"}");
        m.len--;
        sealed(&m, "{\"op\":\"b\"}");
        m.len--;
        m.data[m.len] = '\0';
        assert_int_equal(scan(&m, 0, &s, &res), 0);
        assert_int_equal(res.status, CRCLINE_CORRUPT);
        assert_non_null(strstr(res.bad_reason, "merged"));
        assert_int_equal(s.records, 0);
        assert_int_equal(scan(&m, CRCLINE_KEEP_GOING, &s, &res), 0);
        assert_int_equal(res.status, CRCLINE_CORRUPT);
        assert_int_equal(s.bad, 1);
        kbuf_free(&m);
}

static void test_reject_is_bad(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        sealed(&b, "{\"op\":\"reject\"}");
        sealed(&b, "{\"op\":\"a\"}");
        sealed(&b, "{\"op\":\"reject\"}");
        struct seen s;
        struct crcline_result res;
        assert_int_equal(scan(&b, CRCLINE_KEEP_GOING, &s, &res), 0);
        assert_int_equal(res.status, CRCLINE_CORRUPT);
        assert_int_equal(res.bad_lines, 2);
        assert_int_equal(res.bad_line, 1);
        assert_int_equal(s.records, 1);
        assert_string_equal(res.bad_reason, "record with missing or bad fields");
        kbuf_free(&b);
}

/* The crc of every length and alignment (the folded path takes lines of
 * 64 bytes and more, whole 16-byte blocks, zlib the rest) is zlib's. */
static void test_crc_every_length(void **state)
{
        (void)state;
        unsigned char bytes[1200];
        uint32_t x = 12345;
        for (size_t i = 0; i < sizeof bytes; i++) {
                x = x * 1103515245u + 12345u;
                bytes[i] = (unsigned char)(x >> 16);
        }
        for (size_t off = 0; off < 16; off += 3) {
                for (size_t n = 1; n + off <= sizeof bytes - 16; n += (n < 300 ? 1 : 37)) {
                        struct kbuf b = KBUF_INIT;
                        assert_int_equal(kbuf_append(&b, "{", 1), 0);
                        assert_int_equal(kbuf_append(&b, (const char *)bytes + off, n), 0);
                        assert_int_equal(kbuf_append(&b, "}", 1), 0);
                        uLong want = crc32(crc32(0L, Z_NULL, 0), (const Bytef *)b.data,
                                           (uInt)b.len);
                        assert_int_equal(crcline_seal(&b, 0), 0);
                        char hex[9];
                        snprintf(hex, sizeof hex, "%08lx", want & 0xffffffffUL);
                        assert_memory_equal(b.data + b.len - 11, hex, 8);
                        /* and the reader agrees */
                        assert_int_equal(crcline_body_crc(b.data, b.len - 1),
                                         (uint32_t)(want & 0xffffffffUL));
                        kbuf_free(&b);
                }
        }
}

static void test_names(void **state)
{
        (void)state;
        assert_string_equal(crcline_status_name(CRCLINE_CLEAN), "clean");
        assert_string_equal(crcline_status_name(CRCLINE_TORN), "torn");
        assert_string_equal(crcline_status_name(CRCLINE_CORRUPT), "corrupt");
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_seal_and_check),
                cmocka_unit_test(test_clean_blank_crlf),
                cmocka_unit_test(test_torn_tails),
                cmocka_unit_test(test_corruption),
                cmocka_unit_test(test_reject_is_bad),
                cmocka_unit_test(test_crc_every_length),
                cmocka_unit_test(test_names),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
