/* SPDX-License-Identifier: MIT */
/* runenv_build and runenv_build_step: the entries, in their order, NULL
 * values left out, the array and its strings in one allocation (free() it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runenv.h"

/* env holds exactly want's entries after the known base ones, in one block:
 * the strings right after the array, one after another. */
static void check(char **env, const char *const *want)
{
        assert_non_null(env);
        const char *path, *home, *user, *kairosctl;
        runenv_get(&path, &home, &user, &kairosctl);
        const char *const base[][2] = {
                { "PATH", path }, { "LANG", getenv("LANG") }, { "HOME", home },
                { "USER", user }, { "LOGNAME", user },        { "KAIROSCTL", kairosctl },
        };
        size_t n = 0;
        char entry[4096];
        for (size_t i = 0; i < sizeof base / sizeof base[0]; i++) {
                if (!base[i][1])
                        continue;
                snprintf(entry, sizeof entry, "%s=%s", base[i][0], base[i][1]);
                assert_non_null(env[n]);
                assert_string_equal(env[n++], entry);
        }
        for (size_t i = 0; want[i]; i++) {
                assert_non_null(env[n]);
                assert_string_equal(env[n++], want[i]);
        }
        assert_null(env[n]);
        char *at = (char *)(env + n + 1);
        for (size_t i = 0; i < n; i++) {
                assert_ptr_equal(env[i], at);
                at += strlen(at) + 1;
        }
        free(env);
}

static void test_step_entries_in_one_allocation(void **state)
{
        (void)state;
        setenv("LANG", "C.UTF-8", 1);
        struct runenv_step s = {
                .mandate_id = "mnd_1", .plan_id = "plan_1", .step_id = "observe_001",
                .phase = 0, .cycle = 12345678901LL, .idem_key = "k", .schedule = "nightly",
                .fired_at = "2025-01-01T00:00:00Z", .goal = NULL, .attempt = 3,
                .control_socket = "/run/kairos/control.sock",
        };
        const char *const more[][2] = { { "KAIROS_NODE", "n1" }, { "KAIROS_EPOCH", NULL },
                                        { "EMPTY", "" } };
        char *extra[] = { "A=1", "B=", "LONG=" "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx" };
#define STEP(goal)                                                                           \
        "KAIROS_MANDATE_ID=mnd_1", "KAIROS_PLAN_ID=plan_1", "KAIROS_STEP_ID=observe_001",    \
                "KAIROS_PHASE=observe", "KAIROS_CYCLE=12345678901", "KAIROS_IDEM_KEY=k",     \
                "KAIROS_SCHEDULE=nightly", "KAIROS_FIRED_AT=2025-01-01T00:00:00Z",           \
                "KAIROS_GOAL=" goal, "KAIROS_ATTEMPT=3",                                     \
                "KAIROS_CONTROL_SOCKET=/run/kairos/control.sock"
        check(runenv_build_step(&s, more, 3, extra, 3),
              (const char *const[]){ STEP("nightly"), "KAIROS_NODE=n1", "EMPTY=", "A=1", "B=",
                                     extra[2], NULL });
        check(runenv_build_step(&s, NULL, 0, NULL, 0), (const char *const[]){ STEP("nightly"), NULL });
        s.goal = "a goal";
        unsetenv("LANG");
        check(runenv_build_step(&s, more, 1, extra, 1),
              (const char *const[]){ STEP("a goal"), "KAIROS_NODE=n1", "A=1", NULL });
        assert_null(runenv_build_step(&s, more, 5, NULL, 0)); /* at most 4 more */
#undef STEP
}

static void test_build_nothing_but_the_base(void **state)
{
        (void)state;
        check(runenv_build(NULL, 0, NULL, 0), (const char *const[]){ NULL });
        const char *const kv[][2] = { { "X", NULL }, { "Y", "2" } };
        check(runenv_build(kv, 2, NULL, 0), (const char *const[]){ "Y=2", NULL });
}

/* once: its values live as long as the process */
static int setup(void **state)
{
        (void)state;
        runenv_init(getuid());
        return 0;
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_step_entries_in_one_allocation),
                cmocka_unit_test(test_build_nothing_but_the_base),
        };
        return cmocka_run_group_tests(tests, setup, NULL);
}
