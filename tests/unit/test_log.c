/* SPDX-License-Identifier: MIT */
/* log.c: control characters of a message (a handler's reason, its stderr)
 * reach neither the stderr line nor the journal's MESSAGE= raw.  The journal
 * is sd_journal_sendv wrapped (-Wl,--wrap): what kairosd would send. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "log.h"

static char journal[4096];

int __wrap_sd_journal_sendv(const struct iovec *iov, int n);
int __wrap_sd_journal_sendv(const struct iovec *iov, int n)
{
        journal[0] = '\0';
        for (int i = 0; i < n; i++) {
                const char *p = iov[i].iov_base;
                if (iov[i].iov_len >= 8 && memcmp(p, "MESSAGE=", 8) == 0)
                        snprintf(journal, sizeof journal, "%.*s", (int)iov[i].iov_len, p);
        }
        return 0;
}

#define NASTY "pause: \x1b[31mred\x1b]0;title\x07 bell\nforged\r\x7f\xc2\x9b" "2J tab\there ok \xc3\xa9"
#define CLEAN "pause: \\x1b[31mred\\x1b]0;title\\x07 bell\\nforged\\r\\x7f\\u009b2J tab\\there ok \xc3\xa9"

static bool has_control(const char *s)
{
        for (const unsigned char *p = (const unsigned char *)s; *p; p++)
                if (*p < 0x20 || *p == 0x7f || (*p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f))
                        return true;
        return false;
}

static void test_stderr_line_escaped(void **state)
{
        (void)state;
        unsetenv("JOURNAL_STREAM");
        log_setup(LOG_INFO);
        FILE *tmp = tmpfile();
        assert_non_null(tmp);
        fflush(stderr);
        int saved = dup(STDERR_FILENO);
        assert_true(saved >= 0);
        assert_true(dup2(fileno(tmp), STDERR_FILENO) >= 0);
        log_event(LOG_WARNING, NULL, LOG_FIELDS({ "REASON", "a\x1b" "b c" }), "%s", NASTY);
        fflush(stderr);
        assert_true(dup2(saved, STDERR_FILENO) >= 0);
        close(saved);
        char line[4096] = "";
        rewind(tmp);
        size_t n = fread(line, 1, sizeof line - 1, tmp);
        fclose(tmp);
        line[n] = '\0';
        assert_string_equal(line, "<4>" CLEAN " REASON=\"a\\x1bb c\"\n");
        line[n - 1] = '\0';
        assert_false(has_control(line));
}

/* log_hold: the records are kept until log_hold(false), then written
 * together, in order, each one its own line as before; another thread's
 * records are not kept. */
static void *log_other(void *arg)
{
        (void)arg;
        log_event(LOG_NOTICE, NULL, NULL, 0, "other thread");
        return NULL;
}

static void test_hold_writes_together(void **state)
{
        (void)state;
        unsetenv("JOURNAL_STREAM");
        log_setup(LOG_INFO);
        int p[2];
        assert_int_equal(pipe2(p, O_NONBLOCK), 0);
        fflush(stderr);
        int saved = dup(STDERR_FILENO);
        assert_true(saved >= 0);
        assert_true(dup2(p[1], STDERR_FILENO) >= 0);
        char buf[4096];
        log_hold(true);
        log_event(LOG_NOTICE, NULL, LOG_FIELDS({ "MANDATE_ID", "m1" }), "first");
        log_event(LOG_NOTICE, NULL, NULL, 0, "second");
        assert_int_equal(read(p[0], buf, sizeof buf), -1);   /* nothing yet */
        assert_int_equal(errno, EAGAIN);
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, log_other, NULL), 0);
        assert_int_equal(pthread_join(t, NULL), 0);
        ssize_t n = read(p[0], buf, sizeof buf - 1);
        assert_true(n > 0);
        buf[n] = '\0';
        assert_string_equal(buf, "<5>other thread\n");
        log_hold(false);
        n = read(p[0], buf, sizeof buf - 1);
        assert_true(n > 0);
        buf[n] = '\0';
        assert_string_equal(buf, "<5>first MANDATE_ID=m1\n<5>second\n");
        log_event(LOG_NOTICE, NULL, NULL, 0, "third");     /* not held any more */
        n = read(p[0], buf, sizeof buf - 1);
        assert_true(n > 0);
        buf[n] = '\0';
        assert_string_equal(buf, "<5>third\n");
        assert_true(dup2(saved, STDERR_FILENO) >= 0);
        close(saved);
        close(p[0]);
        close(p[1]);
}

static void test_journal_message_escaped(void **state)
{
        (void)state;
        struct stat st;
        assert_int_equal(fstat(STDERR_FILENO, &st), 0);
        char js[64];
        snprintf(js, sizeof js, "%llu:%llu", (unsigned long long)st.st_dev,
                 (unsigned long long)st.st_ino);
        setenv("JOURNAL_STREAM", js, 1);
        log_setup(LOG_INFO);
        journal[0] = '\0';
        log_event(LOG_WARNING, NULL, NULL, 0, "%s", NASTY);
        assert_string_equal(journal, "MESSAGE=" CLEAN);
        assert_false(has_control(journal));
        unsetenv("JOURNAL_STREAM");
        log_setup(LOG_INFO);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_stderr_line_escaped),
                cmocka_unit_test(test_journal_message_escaped),
                cmocka_unit_test(test_hold_writes_together),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
