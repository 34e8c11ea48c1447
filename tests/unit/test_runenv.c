/* SPDX-License-Identifier: MIT */
/* runenv_build_step_one: the same entries as runenv_build_step, in the same
 * order, the array and its strings in one allocation (free() it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runenv.h"
#include "kairos/config.h"

static void check_same(const struct runenv_step *s, const char *const (*more)[2], size_t nmore,
                       char *const *extra, size_t nextra)
{
        char **a = runenv_build_step(s, more, nmore, extra, nextra);
        char **b = runenv_build_step_one(s, more, nmore, extra, nextra);
        assert_non_null(a);
        assert_non_null(b);
        size_t n = 0;
        for (; a[n]; n++) {
                assert_non_null(b[n]);
                assert_string_equal(a[n], b[n]);
        }
        assert_null(b[n]);
        /* one block: the strings right after the array, one after another */
        char *at = (char *)(b + n + 1);
        for (size_t i = 0; i < n; i++) {
                assert_ptr_equal(b[i], at);
                at += strlen(at) + 1;
        }
        config_strv_free(a);
        free(b);
}

static void test_one_allocation_same_entries(void **state)
{
        (void)state;
        setenv("LANG", "C.UTF-8", 1);
        runenv_init(getuid());
        struct runenv_step s = {
                .mandate_id = "mnd_1", .plan_id = "plan_1", .step_id = "observe_001",
                .phase = 0, .cycle = 12345678901LL, .idem_key = "k", .schedule = "nightly",
                .fired_at = "2025-01-01T00:00:00Z", .goal = NULL, .attempt = 3,
                .control_socket = "/run/kairos/control.sock",
        };
        const char *const more[][2] = { { "KAIROS_NODE", "n1" }, { "KAIROS_EPOCH", NULL },
                                        { "EMPTY", "" } };
        char *extra[] = { "A=1", "B=", "LONG=" "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx" };
        check_same(&s, more, 3, extra, 3);
        check_same(&s, NULL, 0, NULL, 0);
        s.goal = "a goal";
        unsetenv("LANG");
        check_same(&s, more, 1, extra, 1);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_one_allocation_same_entries),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
