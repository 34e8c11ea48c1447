/* SPDX-License-Identifier: MIT */
/* Fuzz target for the control protocol's request parser
 * (src/daemon/control_proto.c).  The input is split into lines as the
 * daemon's reader does, and each line, as well as the whole input, is parsed.
 * Invariants (any violation aborts):
 *   - the outcome is one of 0 / -EBADMSG / -EINVAL, with the fields each
 *     promises: a valid request has an object root with v 1, an integer id
 *     (the one in root), a string cmd and args absent or an object; a
 *     malformed line has no root and no id; an invalid request names its
 *     integer id when it has one and never another;
 *   - the message is NUL-terminated, fits any errlen (even 1) and is a
 *     prefix of the full message; it is empty only on success;
 *   - the parse is deterministic, and a valid request dumped compactly by
 *     jansson (what kairosctl sends) parses back to the same id, cmd and args. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                           \
        do {                                                                                  \
                if (!(cond)) {                                                                \
                        fprintf(stderr, "fuzz_control: invariant violated: %s (line %d)\n",   \
                                #cond, __LINE__);                                             \
                        abort();                                                              \
                }                                                                             \
        } while (0)

static const char *const problems[] = {
        "a request must be a JSON object", "v: must be 1", "id: must be an integer",
        "cmd: must be a string", "args: must be an object", NULL,
};

static bool known_problem(const char *s)
{
        for (size_t i = 0; problems[i]; i++)
                if (strcmp(s, problems[i]) == 0)
                        return true;
        return false;
}

static void check_fields(int r, const struct control_parsed *p, const char *err)
{
        CHECK(strlen(err) < 300);
        switch (r) {
        case 0: {
                CHECK(err[0] == '\0');
                CHECK(json_is_object(p->root));
                json_t *v = json_object_get(p->root, "v");
                CHECK(json_is_integer(v) && json_integer_value(v) == 1);
                CHECK(json_is_integer(p->id) && p->id == json_object_get(p->root, "id"));
                json_t *cmd = json_object_get(p->root, "cmd");
                CHECK(json_is_string(cmd) && p->cmd == json_string_value(cmd));
                CHECK(p->args == json_object_get(p->root, "args"));
                CHECK(!p->args || json_is_object(p->args));
                break;
        }
        case -EBADMSG:
                CHECK(!p->root && !p->id && !p->cmd && !p->args);
                CHECK(strncmp(err, "malformed JSON at byte ", 23) == 0);
                break;
        case -EINVAL: {
                CHECK(p->root && !p->cmd && !p->args);
                CHECK(known_problem(err));
                json_t *id = json_object_get(p->root, "id");
                if (json_is_integer(id))
                        CHECK(p->id == id);
                else
                        CHECK(!p->id);
                break;
        }
        default:
                CHECK(!"unexpected return value");
        }
}

static void check_roundtrip(const struct control_parsed *p)
{
        char *text = json_dumps(p->root, JSON_COMPACT);
        if (!text)
                return; /* out of memory */
        CHECK(!strchr(text, '\n'));
        struct control_parsed q;
        char err[300];
        int r = control_parse_request(text, strlen(text), &q, err, sizeof err);
        CHECK(r == 0);
        CHECK(json_integer_value(q.id) == json_integer_value(p->id));
        CHECK(strcmp(q.cmd, p->cmd) == 0);
        CHECK(!q.args == !p->args);
        if (p->args)
                CHECK(json_equal(q.args, p->args));
        CHECK(json_equal(q.root, p->root));
        control_parsed_clear(&q);
        free(text);
}

static void check_line(const char *line, size_t len)
{
        /* an exact-size copy, so that reads past len are caught */
        char *copy = malloc(len ? len : 1);
        CHECK(copy);
        if (len)
                memcpy(copy, line, len);

        struct control_parsed p, q;
        char err[300], small[8];
        int r = control_parse_request(len ? copy : NULL, len, &p, err, sizeof err);
        check_fields(r, &p, err);

        /* deterministic, and the message truncates cleanly */
        memset(small, 'x', sizeof small);
        int r2 = control_parse_request(len ? copy : NULL, len, &q, small, sizeof small);
        CHECK(r2 == r);
        CHECK(strlen(small) < sizeof small && strncmp(small, err, strlen(small)) == 0);
        CHECK(strlen(small) == (strlen(err) < sizeof small ? strlen(err) : sizeof small - 1));
        CHECK(!p.root == !q.root && !p.id == !q.id);
        if (p.root)
                CHECK(json_equal(p.root, q.root));
        control_parsed_clear(&q);

        char one = 'x';
        r2 = control_parse_request(len ? copy : NULL, len, &q, &one, 1);
        CHECK(r2 == r && one == '\0');
        control_parsed_clear(&q);
        r2 = control_parse_request(len ? copy : NULL, len, &q, NULL, 0);
        CHECK(r2 == r);
        control_parsed_clear(&q);

        if (r == 0)
                check_roundtrip(&p);
        control_parsed_clear(&p);
        CHECK(!p.root && !p.id);
        free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        const char *s = (const char *)data;

        check_line(s, size);
        /* the daemon's reader: one request per line, empty lines skipped */
        size_t start = 0;
        while (start < size) {
                const char *nl = memchr(s + start, '\n', size - start);
                size_t len = nl ? (size_t)(nl - (s + start)) : size - start;
                if (!nl && start == 0)
                        break; /* a single line: already done */
                if (len > 0)
                        check_line(s + start, len);
                start += len + 1;
        }
        return 0;
}
