/* SPDX-License-Identifier: MIT */
/* procstat: the start time that tells a tool call's client from a later
 * process given its pid. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kairos/procstat.h"

static int parse(const char *s, struct procstat *st)
{
        return procstat_parse(s, strlen(s), st);
}

static void test_fields(void **state)
{
        (void)state;
        struct procstat st;
        /* fields 1..22: pid (comm) state ppid pgrp session tty_nr tpgid flags
         * minflt cminflt majflt cmajflt utime stime cutime cstime priority
         * nice num_threads itrealvalue starttime */
        assert_int_equal(parse("4242 (kairosctl) S 1 4242 100 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 "
                               "1 0 987654 1000 200\n", &st), 0);
        assert_int_equal(st.state, 'S');
        assert_int_equal(st.pgrp, 4242);
        assert_int_equal(st.start, 987654);
        /* a name with spaces and parentheses: the fields follow the last ')' */
        assert_int_equal(parse("7 (a) b) Z (c) R 1 9 9 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 55\n",
                               &st), 0);
        assert_int_equal(st.state, 'R');
        assert_int_equal(st.pgrp, 9);
        assert_int_equal(st.start, 55);
}

static void test_bad(void **state)
{
        (void)state;
        struct procstat st;
        assert_int_equal(parse("", &st), -EINVAL);
        assert_int_equal(parse("12 (x", &st), -EINVAL);
        assert_int_equal(parse("12 (x) S 1 2 3", &st), -EINVAL); /* cut before starttime */
        assert_int_equal(parse("12 (x) S 1 z 3 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5", &st), -EINVAL);
        assert_int_equal(parse("12 (x) S 1 2 3 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 "
                               "99999999999999999999999", &st), -EINVAL);
        assert_int_equal(procstat_parse(NULL, 0, &st), -EINVAL);
}

/* A reused pid: the process has another start time than the one recorded. */
static void test_reused_pid_not_trusted(void **state)
{
        (void)state;
        char buf[1024];
        int fd = open("/proc/self/stat", O_RDONLY);
        assert_true(fd >= 0);
        ssize_t n = read(fd, buf, sizeof buf);
        close(fd);
        assert_true(n > 0);
        struct procstat st;
        assert_int_equal(procstat_parse(buf, (size_t)n, &st), 0);
        assert_int_equal(st.pgrp, getpgrp());
        assert_true(procstat_same_process(&st, st.start));
        assert_false(procstat_same_process(&st, st.start + 1));
        assert_false(procstat_same_process(&st, st.start - 1));
        st.state = 'Z'; /* exited, not reaped yet */
        assert_false(procstat_same_process(&st, st.start));
        assert_false(procstat_same_process(NULL, 0));
}

static void test_read(void **state)
{
        (void)state;
        struct procstat st;
        assert_int_equal(procstat_read(getpid(), &st), 0);
        assert_int_equal(st.pgrp, getpgrp());
        assert_true(st.start > 0);
        assert_int_equal(procstat_read(0, &st), -ESRCH);
        assert_int_equal(procstat_read(-1, &st), -ESRCH);
        /* a pid above pid_max is never in use */
        assert_int_equal(procstat_read(0x7ffffff0, &st), -ESRCH);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_fields),
                cmocka_unit_test(test_bad),
                cmocka_unit_test(test_reused_pid_not_trusted),
                cmocka_unit_test(test_read),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
