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

#include "kairos/strmap.h"

static void test_put_get_replace_remove(void **state)
{
        (void)state;
        struct strmap *m = strmap_new();
        assert_non_null(m);
        int a = 1, b = 2;
        assert_null(strmap_get(m, "x"));
        assert_int_equal(strmap_put(m, "x", &a), 0);
        assert_ptr_equal(strmap_get(m, "x"), &a);
        assert_int_equal(strmap_put(m, "x", &b), 0);
        assert_ptr_equal(strmap_get(m, "x"), &b);
        assert_int_equal(strmap_size(m), 1);
        assert_ptr_equal(strmap_remove(m, "x"), &b);
        assert_null(strmap_get(m, "x"));
        assert_null(strmap_remove(m, "x"));
        assert_int_equal(strmap_size(m), 0);
        strmap_free(m);
}

static void test_many_keys_with_churn(void **state)
{
        (void)state;
        struct strmap *m = strmap_new();
        char key[32];
        for (uintptr_t i = 0; i < 20000; i++) {
                snprintf(key, sizeof key, "k%lu", (unsigned long)i);
                assert_int_equal(strmap_put(m, key, (void *)(i + 1)), 0);
        }
        for (uintptr_t i = 0; i < 20000; i += 2) {
                snprintf(key, sizeof key, "k%lu", (unsigned long)i);
                assert_ptr_equal(strmap_remove(m, key), (void *)(i + 1));
        }
        /* re-insert over tombstones many times: must not fill up or lose keys */
        for (int round = 0; round < 5; round++)
                for (uintptr_t i = 0; i < 20000; i += 2) {
                        snprintf(key, sizeof key, "k%lu", (unsigned long)i);
                        assert_int_equal(strmap_put(m, key, (void *)(i + 7)), 0);
                        assert_non_null(strmap_remove(m, key));
                }
        assert_int_equal(strmap_size(m), 10000);
        size_t pos = 0, seen = 0;
        const char *k;
        void *v;
        while (strmap_next(m, &pos, &k, &v) == 0) {
                unsigned long n = strtoul(k + 1, NULL, 10);
                assert_int_equal(n % 2, 1);
                assert_ptr_equal(v, (void *)(uintptr_t)(n + 1));
                seen++;
        }
        assert_int_equal(seen, 10000);
        strmap_free(m);
}

/* strmap_reserve on an empty map, on one with keys and tombstones, and for
 * 0 more: every key put before and after is found, the removed are not. */
static void test_reserve(void **state)
{
        (void)state;
        struct strmap *m = strmap_new();
        char key[32];
        assert_int_equal(strmap_reserve(m, 0), 0);
        assert_int_equal(strmap_reserve(m, 1000), 0);
        for (uintptr_t i = 0; i < 1000; i++) {
                snprintf(key, sizeof key, "k%lu", (unsigned long)i);
                assert_int_equal(strmap_put(m, key, (void *)(i + 1)), 0);
        }
        for (uintptr_t i = 0; i < 1000; i += 2) {
                snprintf(key, sizeof key, "k%lu", (unsigned long)i);
                assert_ptr_equal(strmap_remove(m, key), (void *)(i + 1));
        }
        assert_int_equal(strmap_reserve(m, 0), 0);
        assert_int_equal(strmap_reserve(m, 5000), 0);
        for (uintptr_t i = 1000; i < 6000; i++) {
                snprintf(key, sizeof key, "k%lu", (unsigned long)i);
                assert_int_equal(strmap_put(m, key, (void *)(i + 1)), 0);
        }
        assert_int_equal(strmap_size(m), 5500);
        for (uintptr_t i = 0; i < 6000; i++) {
                snprintf(key, sizeof key, "k%lu", (unsigned long)i);
                if (i < 1000 && i % 2 == 0)
                        assert_null(strmap_get(m, key));
                else
                        assert_ptr_equal(strmap_get(m, key), (void *)(i + 1));
        }
        strmap_free(m);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_put_get_replace_remove),
                cmocka_unit_test(test_many_keys_with_churn),
                cmocka_unit_test(test_reserve),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
