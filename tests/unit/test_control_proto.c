/* SPDX-License-Identifier: MIT */
/* control_proto: one request line → parsed request or the error reply's
 * code, message and id (src/daemon/control_proto.c). */
#include <errno.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "control_proto.h"

static int parse(const char *line, struct control_parsed *p, char *err, size_t errlen)
{
        return control_parse_request(line, strlen(line), p, err, errlen);
}

static void test_valid_requests(void **state)
{
        (void)state;
        struct control_parsed p;
        char err[300];

        assert_int_equal(parse("{\"v\":1,\"id\":7,\"cmd\":\"status\"}", &p, err, sizeof err), 0);
        assert_string_equal(err, "");
        assert_int_equal(json_integer_value(p.id), 7);
        assert_string_equal(p.cmd, "status");
        assert_null(p.args);
        control_parsed_clear(&p);
        assert_null(p.root);

        assert_int_equal(parse(" {\"cmd\":\"fire\",\"args\":{\"schedule\":\"x\"},\"id\":-3,"
                               "\"v\":1,\"extra\":[1]} ", &p, err, sizeof err), 0);
        assert_int_equal(json_integer_value(p.id), -3);
        assert_string_equal(p.cmd, "fire");
        assert_string_equal(json_string_value(json_object_get(p.args, "schedule")), "x");
        control_parsed_clear(&p);

        /* not NUL-terminated: only len bytes are read */
        const char buf[] = "{\"v\":1,\"id\":1,\"cmd\":\"a\"}GARBAGE";
        assert_int_equal(control_parse_request(buf, 24, &p, err, sizeof err), 0);
        control_parsed_clear(&p);
}

static void test_malformed(void **state)
{
        (void)state;
        struct control_parsed p;
        char err[300];
        static const char *const bad[] = {
                "", "{", "{\"v\":1,\"id\":1,\"cmd\":\"x\"} x", "{\"v\":1,\"v\":1,\"id\":1,\"cmd\":\"x\"}",
                "{\"v\":1,\"id\":1,\"cmd\":\"a\\u0000b\"}", "\xff",
                "5", /* jansson wants an object or an array at the top */
                NULL,
        };
        for (size_t i = 0; bad[i]; i++) {
                assert_int_equal(parse(bad[i], &p, err, sizeof err), -EBADMSG);
                assert_null(p.root);
                assert_null(p.id);
                assert_memory_equal(err, "malformed JSON at byte ", 23);
        }
        assert_int_equal(control_parse_request(NULL, 0, &p, err, sizeof err), -EBADMSG);
        /* a short buffer: truncated, terminated */
        char small[10];
        assert_int_equal(parse("{", &p, small, sizeof small), -EBADMSG);
        assert_string_equal(small, "malformed");
        assert_int_equal(parse("{", &p, NULL, 0), -EBADMSG);
}

static void expect_invalid(const char *line, const char *problem, bool has_id, json_int_t id)
{
        struct control_parsed p;
        char err[300];
        assert_int_equal(parse(line, &p, err, sizeof err), -EINVAL);
        assert_string_equal(err, problem);
        assert_non_null(p.root);
        assert_null(p.cmd);
        assert_null(p.args);
        if (has_id)
                assert_int_equal(json_integer_value(p.id), id);
        else
                assert_null(p.id);
        control_parsed_clear(&p);
}

static void test_invalid_requests(void **state)
{
        (void)state;
        expect_invalid("[1]", "a request must be a JSON object", false, 0);
        expect_invalid("{\"id\":4,\"cmd\":\"x\"}", "v: must be 1", true, 4);
        expect_invalid("{\"v\":2,\"id\":4,\"cmd\":\"x\"}", "v: must be 1", true, 4);
        expect_invalid("{\"v\":1.0,\"id\":4,\"cmd\":\"x\"}", "v: must be 1", true, 4);
        expect_invalid("{\"v\":1,\"id\":\"4\",\"cmd\":\"x\"}", "id: must be an integer", false, 0);
        expect_invalid("{\"v\":1,\"cmd\":\"x\"}", "id: must be an integer", false, 0);
        expect_invalid("{\"v\":1,\"id\":5,\"cmd\":null}", "cmd: must be a string", true, 5);
        expect_invalid("{\"v\":1,\"id\":5,\"cmd\":\"x\",\"args\":null}", "args: must be an object",
                       true, 5);
        expect_invalid("{\"v\":1,\"id\":5,\"cmd\":\"x\",\"args\":[]}", "args: must be an object",
                       true, 5);
        /* the id is reported even when v is wrong (for the error reply) */
        expect_invalid("{\"v\":0,\"id\":9}", "v: must be 1", true, 9);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_valid_requests),
                cmocka_unit_test(test_malformed),
                cmocka_unit_test(test_invalid_requests),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
