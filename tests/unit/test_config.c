/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <ftw.h>
#include <stdbool.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "kairos/config.h"

/* ---- temp dir helpers -------------------------------------------------- */

static char root[PATH_MAX];

#define XSNPRINTF(buf, ...) do { \
                int n_ = snprintf(buf, sizeof(buf), __VA_ARGS__); \
                assert_true(n_ >= 0 && (size_t)n_ < sizeof(buf)); \
        } while (0)

static int setup_root(void **state)
{
        (void)state;
        strcpy(root, "/tmp/kairos-test-config-XXXXXX");
        return mkdtemp(root) ? 0 : -1;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
        (void)st;
        (void)flag;
        (void)ftw;
        return remove(path);
}

static int teardown_root(void **state)
{
        (void)state;
        return nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void mkdirs_for(const char *path)
{
        char tmp[PATH_MAX];
        XSNPRINTF(tmp, "%s", path);
        for (char *p = tmp + strlen(root) + 1; (p = strchr(p, '/')); p++) {
                *p = '\0';
                if (mkdir(tmp, 0755) < 0)
                        assert_int_equal(errno, EEXIST);
                *p = '/';
        }
}

/* Write root/rel. */
static void put(const char *rel, const char *text)
{
        char path[PATH_MAX];
        XSNPRINTF(path, "%s/%s", root, rel);
        mkdirs_for(path);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
        assert_int_equal(fclose(f), 0);
}

static char *rooted(const char *rel)
{
        static char path[PATH_MAX];
        XSNPRINTF(path, "%s/%s", root, rel);
        return path;
}

/* Load root/kairosd.conf and expect it to fail with rc and exactly the
 * messages in want (each is appended to the temp dir path), as
 * kairosd --check-config sees them: a load that succeeds with broken
 * schedules counts as -EINVAL with their errors. */
static void expect_load_errors(int rc, const char *const *want)
{
        struct config *c = (struct config *)0x1;
        struct config_errors errs = { 0 };
        char main_path[PATH_MAX];
        XSNPRINTF(main_path, "%s/kairosd.conf", root);
        int got = config_load(main_path, NULL, &c, &errs);
        if (got == 0) {
                assert_non_null(c);
                assert_int_equal(errs.n, 0);
                for (size_t i = 0; i < c->nbroken; i++) {
                        assert_true(c->broken[i].errors.n > 0);
                        for (size_t k = 0; k < c->broken[i].errors.n; k++) {
                                char **m = realloc(errs.msgs, (errs.n + 1) * sizeof(*m));
                                assert_non_null(m);
                                errs.msgs = m;
                                m[errs.n] = strdup(c->broken[i].errors.msgs[k]);
                                assert_non_null(m[errs.n++]);
                        }
                        /* a broken schedule is not among the schedules */
                        for (size_t j = 0; j < c->nschedules; j++)
                                assert_string_not_equal(c->schedules[j].name, c->broken[i].name);
                }
                if (c->nbroken)
                        got = -EINVAL;
                config_free(c);
                c = NULL;
        }
        assert_int_equal(got, rc);
        assert_null(c);
        size_t n = 0;
        while (want[n])
                n++;
        bool same = errs.n == n;
        for (size_t i = 0; same && i < n; i++)
                same = strncmp(errs.msgs[i], root, strlen(root)) == 0 &&
                       strcmp(errs.msgs[i] + strlen(root), want[i]) == 0;
        if (!same) {
                for (size_t i = 0; i < errs.n; i++)
                        print_message("got:  %s\n", errs.msgs[i]);
                for (size_t i = 0; i < n; i++)
                        print_message("want: %s%s\n", root, want[i]);
        }
        assert_int_equal(errs.n, n);
        for (size_t i = 0; i < n; i++) {
                char full[PATH_MAX + 512];
                XSNPRINTF(full, "%s%s", root, want[i]);
                assert_string_equal(errs.msgs[i], full);
        }
        config_errors_free(&errs);
        assert_null(errs.msgs);
        assert_int_equal(errs.n, 0);
}

/* A main file with text and one error in it. */
static void expect_main_error(const char *text, const char *want)
{
        put("kairosd.conf", text);
        if (unlink(rooted("schedules.d/x.conf")) < 0)
                assert_int_equal(errno, ENOENT);
        expect_load_errors(-EINVAL, (const char *const[]){ want, NULL });
}

/* A valid main file, one schedule x.conf with text, one error. */
static void expect_schedule_error(const char *text, const char *want)
{
        put("kairosd.conf", "");
        put("schedules.d/x.conf", text);
        expect_load_errors(-EINVAL, (const char *const[]){ want, NULL });
}

/* ---- valid configurations ---------------------------------------------- */

static const char main_conf[] =
        "# kairosd main configuration\r\n"
        "\r\n"
        "[Daemon]\r\n"
        "  StateDirectory =  /srv/kairos/state  \r\n"
        "ControlSocket=/run/k/ctl.sock\r\n"
        "SocketGroup=ops\r\n"
        "HandlerUser=jobs\r\n"
        "MaxConcurrentMandates=8\r\n"
        "GracefulTimeoutSec=2min\r\n"
        "LogLevel=debug\r\n"
        "; another comment\r\n"
        "[Idempotency]\r\n"
        "TTLSec=1d 2h\r\n"
        "MaxEntries=500\r\n"
        "MaxEntries=10000000\r\n" /* the last one wins */
        "MaxWriteBytes=100M\r\n"
        "WriteRoots=/srv/a /srv/b \\\r\n"
        "# a comment inside a continuation is skipped\r\n"
        "    /srv/c\r\n";

static const char full_schedule[] =
        "[Schedule]\n"
        "Cron=30 2 * * MON-FRI\n"
        "TimeZone=Europe/Berlin\n"
        "Enabled=no\n"
        "MissedPolicy=catch_up_bounded\n"
        "MaxCatchUpRuns=7\n"
        "StaleAfter=12h\n"
        "MissedGraceSec=2min\n"
        "Concurrency=reject\n"
        "\n"
        "[Mandate]\n"
        "Goal=Write the \\\n"
        "   ; skipped\n"
        "  nightly report\n"
        "MaxCycles=10\n"
        "\n"
        "[Exec]\n"
        "Observe=/usr/bin/obs --all\n"
        "Orient=/usr/bin/orient \"a b\"\n"
        "Decide=decide\n"
        "Act=/usr/bin/act\n"
        "Reflect=/usr/bin/reflect -v\n"
        "TimeoutSec=1h30min\n"
        "Environment=A=1\n"
        "Environment=\"B=two words\" D=4 'E=\"q\"' F=a\\ b\n"
        "Environment=A=3\n"
        "Environment=C=\n"
        "WorkingDirectory=/srv/work\n"
        "Probe=/usr/bin/probe --quick\n";

static void test_full_valid_set(void **state)
{
        (void)state;
        put("kairosd.conf", main_conf);
        put("kairosd.conf.d/10-first.conf",
            "[Daemon]\nMaxConcurrentMandates=16\nLogLevel=warning\n"
            "[Idempotency]\nWriteRoots=/srv/d /srv/a\n");
        put("kairosd.conf.d/20-second.conf", "[Daemon]\nMaxConcurrentMandates=32\n");
        put("kairosd.conf.d/README", "not a config file at all\n");
        put("kairosd.conf.d/30-off.conf.disabled", "[Nope]\n");
        put("schedules.d/nightly-report.conf", full_schedule);
        put("schedules.d/alpha.conf", "[Schedule]\nCron=@hourly\n");
        put("schedules.d/notes.txt", "garbage\n");

        struct config *c = NULL;
        struct config_errors errs = { 0 };
        assert_int_equal(config_load(rooted("kairosd.conf"), NULL, &c, &errs), 0);
        assert_int_equal(errs.n, 0);
        assert_non_null(c);

        assert_string_equal(c->config_path, rooted("kairosd.conf"));
        assert_string_equal(c->schedules_dir, rooted("schedules.d"));
        assert_string_equal(c->state_directory, "/srv/kairos/state");
        assert_string_equal(c->control_socket, "/run/k/ctl.sock");
        assert_string_equal(c->socket_group, "ops");
        assert_string_equal(c->handler_user, "jobs");
        assert_int_equal(c->max_concurrent_mandates, 32);
        assert_int_equal(c->graceful_timeout_sec, 120);
        assert_int_equal(c->log_level, 4);
        assert_int_equal(c->idem_ttl_sec, 86400 + 7200);
        assert_int_equal(c->idem_max_entries, 10000000);
        assert_true(c->max_write_bytes == 100u << 20);
        assert_int_equal(c->nwrite_roots, 4);
        assert_string_equal(c->write_roots[0], "/srv/a");
        assert_string_equal(c->write_roots[1], "/srv/b");
        assert_string_equal(c->write_roots[2], "/srv/c");
        assert_string_equal(c->write_roots[3], "/srv/d");
        assert_null(c->write_roots[4]);

        assert_int_equal(c->nschedules, 2);
        const struct config_schedule *a = &c->schedules[0];
        assert_string_equal(a->name, "alpha");
        assert_string_equal(a->path, rooted("schedules.d/alpha.conf"));
        assert_string_equal(a->cron, "@hourly");
        assert_string_equal(a->time_zone, "UTC");
        assert_true(a->enabled);
        assert_int_equal(a->missed_policy, MISSED_SKIP);
        assert_int_equal(a->max_catch_up_runs, 5);
        assert_int_equal(a->stale_after_sec, 48 * 3600);
        assert_int_equal(a->concurrency, CONCURRENCY_QUEUE);
        assert_string_equal(a->goal, "alpha");
        assert_int_equal(a->max_cycles, 1);
        assert_int_equal(a->missed_grace_sec, 300);
        assert_int_equal(a->warnings.n, 0);
        assert_false(a->retained);
        for (int i = 0; i < CONFIG_PHASES; i++)
                assert_null(a->exec[i]);
        assert_int_equal(a->timeout_sec, 300);
        assert_null(a->environment);
        assert_int_equal(a->nenvironment, 0);
        assert_null(a->working_directory);
        assert_null(a->probe);

        const struct config_schedule *s = &c->schedules[1];
        assert_string_equal(s->name, "nightly-report");
        assert_string_equal(s->path, rooted("schedules.d/nightly-report.conf"));
        assert_string_equal(s->cron, "30 2 * * MON-FRI");
        assert_string_equal(s->time_zone, "Europe/Berlin");
        assert_false(s->enabled);
        assert_int_equal(s->missed_policy, MISSED_CATCH_UP_BOUNDED);
        assert_int_equal(s->max_catch_up_runs, 7);
        assert_int_equal(s->stale_after_sec, 12 * 3600);
        assert_int_equal(s->concurrency, CONCURRENCY_REJECT);
        /* "Write the \" + "  nightly report": the backslash became a space */
        assert_string_equal(s->goal, "Write the    nightly report");
        assert_int_equal(s->max_cycles, 10);
        assert_int_equal(s->missed_grace_sec, 120);
        assert_string_equal(s->exec[0], "/usr/bin/obs --all");
        assert_string_equal(s->exec[1], "/usr/bin/orient \"a b\"");
        assert_string_equal(s->exec[2], "decide");
        assert_string_equal(s->exec[3], "/usr/bin/act");
        assert_string_equal(s->exec[4], "/usr/bin/reflect -v");
        assert_int_equal(s->timeout_sec, 5400);
        assert_int_equal(s->nenvironment, 6);
        assert_string_equal(s->environment[0], "A=3");
        assert_string_equal(s->environment[1], "B=two words");
        assert_string_equal(s->environment[2], "D=4");
        assert_string_equal(s->environment[3], "E=\"q\"");
        assert_string_equal(s->environment[4], "F=a b");
        assert_string_equal(s->environment[5], "C=");
        assert_null(s->environment[6]);
        assert_string_equal(s->working_directory, "/srv/work");
        assert_string_equal(s->probe, "/usr/bin/probe --quick");

        config_free(c);
        config_errors_free(&errs);
}

static void test_defaults_and_state_dir(void **state)
{
        (void)state;
        put("kairosd.conf", "# nothing\n");
        struct config *c = NULL;
        struct config_errors errs = { 0 };
        assert_int_equal(config_load(rooted("kairosd.conf"), NULL, &c, &errs), 0);
        assert_string_equal(c->state_directory, "/var/lib/kairos");
        assert_string_equal(c->control_socket, "/run/kairos/control.sock");
        assert_string_equal(c->socket_group, "kairos");
        assert_null(c->handler_user); /* handlers run as kairosd's user */
        assert_int_equal(c->max_concurrent_mandates, 4);
        assert_int_equal(c->graceful_timeout_sec, 120);
        assert_int_equal(c->log_level, 6);
        assert_int_equal(c->idem_ttl_sec, 86400);
        assert_int_equal(c->idem_max_entries, 10000);
        assert_true(c->max_write_bytes == CONFIG_MAX_WRITE_BYTES_DEFAULT);
        assert_null(c->write_roots);
        assert_int_equal(c->nwrite_roots, 0);
        assert_null(c->schedules);
        assert_int_equal(c->nschedules, 0);
        config_free(c);

        /* state_dir overrides StateDirectory= */
        put("kairosd.conf", "[Daemon]\nStateDirectory=/srv/x\n");
        assert_int_equal(config_load(rooted("kairosd.conf"), "/tmp/elsewhere", &c, &errs), 0);
        assert_string_equal(c->state_directory, "/tmp/elsewhere");
        assert_string_equal(c->control_socket, "/run/kairos/control.sock");
        config_free(c);
        assert_int_equal(errs.n, 0);
}

static void test_schedules_sorted_by_name(void **state)
{
        (void)state;
        put("kairosd.conf", "");
        /* file order is a-b.conf, a.conf, b.conf ('-' < '.'); names sort a, a-b, b */
        put("schedules.d/b.conf", "[Schedule]\nCron=@daily\n");
        put("schedules.d/a-b.conf", "[Schedule]\nCron=@weekly\n");
        put("schedules.d/a.conf", "[Schedule]\nCron=@monthly\n");
        struct config *c = NULL;
        assert_int_equal(config_load(rooted("kairosd.conf"), NULL, &c, NULL), 0);
        assert_int_equal(c->nschedules, 3);
        assert_string_equal(c->schedules[0].name, "a");
        assert_string_equal(c->schedules[0].cron, "@monthly");
        assert_string_equal(c->schedules[1].name, "a-b");
        assert_string_equal(c->schedules[1].cron, "@weekly");
        assert_string_equal(c->schedules[2].name, "b");
        assert_string_equal(c->schedules[2].cron, "@daily");
        config_free(c);
}

static void test_lists_reset_and_last_wins(void **state)
{
        (void)state;
        static const char text[] =
                "[Schedule]\n"
                "Cron=* * * * *\n"
                "Cron=5 * * * *\n"
                "[Exec]\n"
                "Environment=A=1\n"
                "Environment=B=2\n"
                "Environment=\n"
                "Environment=C=3\n"
                "Act=/bin/true\n"
                "Act=\n"
                "TimeoutSec=10\n"
                "TimeoutSec=20s\n"
                "WorkingDirectory=/srv\n"
                "WorkingDirectory=\n"
                "[Mandate]\n"
                "Goal=first\n"
                "Goal=\n";
        struct config_schedule s;
        struct config_errors errs = { 0 };
        assert_int_equal(config_parse_schedule("n", "/etc/n.conf", text, strlen(text), &s,
                                               &errs), 0);
        assert_int_equal(errs.n, 0);
        assert_string_equal(s.cron, "5 * * * *");
        assert_int_equal(s.nenvironment, 1);
        assert_string_equal(s.environment[0], "C=3");
        assert_null(s.exec[3]);
        assert_int_equal(s.timeout_sec, 20);
        assert_null(s.working_directory);
        assert_string_equal(s.goal, "n"); /* reset to the default */
        config_schedule_clear(&s);
        assert_null(s.name);

        /* WriteRoots= accumulates, "" resets, duplicates dropped */
        put("kairosd.conf", "[Idempotency]\nWriteRoots=/a /b\nWriteRoots=\nWriteRoots=/c\n"
            "WriteRoots=/d\t/c\n");
        struct config *c = NULL;
        assert_int_equal(config_load(rooted("kairosd.conf"), NULL, &c, &errs), 0);
        assert_int_equal(c->nwrite_roots, 2);
        assert_string_equal(c->write_roots[0], "/c");
        assert_string_equal(c->write_roots[1], "/d");
        config_free(c);
}

static void test_parse_schedule_errors_without_list(void **state)
{
        (void)state;
        struct config_schedule s;
        memset(&s, 0x5a, sizeof(s));
        assert_int_equal(config_parse_schedule("n", "/n.conf", "[Schedule]\n", 11, &s, NULL),
                         -EINVAL);
        assert_null(s.name);
        assert_null(s.environment);
}

/* config_parse_main: the text of one main file, no files read. */
static void test_parse_main_text(void **state)
{
        (void)state;
        struct config *c = NULL;
        struct config_errors errs = { 0 };
        assert_int_equal(config_parse_main("/etc/k.conf", main_conf, strlen(main_conf), &c,
                                           &errs), 0);
        assert_int_equal(errs.n, 0);
        assert_string_equal(c->config_path, "/etc/k.conf");
        assert_null(c->schedules_dir);
        assert_int_equal(c->nschedules, 0);
        assert_string_equal(c->state_directory, "/srv/kairos/state");
        assert_string_equal(c->control_socket, "/run/k/ctl.sock");
        assert_int_equal(c->log_level, 7);
        assert_int_equal(c->idem_max_entries, 10000000);
        assert_int_equal(c->nwrite_roots, 3);
        assert_string_equal(c->write_roots[2], "/srv/c");
        config_free(c);

        /* empty text (NULL with length 0): the defaults */
        assert_int_equal(config_parse_main("/etc/k.conf", NULL, 0, &c, &errs), 0);
        assert_string_equal(c->state_directory, "/var/lib/kairos");
        assert_int_equal(c->max_concurrent_mandates, 4);
        config_free(c);

        /* errors name the path and the line; nothing is returned */
        c = (struct config *)&c;
        static const char bad[] = "[Daemon]\nLogLevel=loud\n[Schedule]\n";
        assert_int_equal(config_parse_main("/etc/k.conf", bad, strlen(bad), &c, &errs), -EINVAL);
        assert_null(c);
        assert_int_equal(errs.n, 2);
        assert_string_equal(errs.msgs[0], "/etc/k.conf:2: LogLevel=: \"loud\" is not one of: "
                            "emerg, alert, crit, err, warning, notice, info, debug");
        assert_string_equal(errs.msgs[1], "/etc/k.conf:3: unknown section [Schedule] "
                            "(expected [Daemon], [Idempotency], [Notify] or [Cluster])");
        config_errors_free(&errs);
        assert_int_equal(config_parse_main("/etc/k.conf", bad, strlen(bad), &c, NULL), -EINVAL);
        assert_int_equal(config_parse_main(NULL, "", 0, &c, NULL), -EINVAL);
        assert_int_equal(config_parse_main("/k", NULL, 1, &c, NULL), -EINVAL);
        assert_int_equal(config_parse_main("/k", "", 0, NULL, NULL), -EINVAL);
}

static void test_bool_words(void **state)
{
        (void)state;
        static const struct {
                const char *w;
                bool v;
        } cases[] = {
                { "yes", true }, { "no", false }, { "true", true }, { "false", false },
                { "on", true }, { "off", false }, { "1", true }, { "0", false },
                { "YES", true }, { "Off", false },
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                char text[128];
                XSNPRINTF(text, "[Schedule]\nCron=@daily\nEnabled=%s\n",
                         cases[i].w);
                struct config_schedule s;
                assert_int_equal(config_parse_schedule("n", "/n.conf", text, strlen(text), &s,
                                                       NULL), 0);
                assert_int_equal(s.enabled, cases[i].v);
                config_schedule_clear(&s);
        }
}

static void test_log_levels(void **state)
{
        (void)state;
        static const char *const words[] = {
                "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug",
        };
        for (int i = 0; i < 8; i++) {
                char text[64];
                XSNPRINTF(text, "[Daemon]\nLogLevel=%s\n", words[i]);
                put("kairosd.conf", text);
                struct config *c = NULL;
                assert_int_equal(config_load(rooted("kairosd.conf"), NULL, &c, NULL), 0);
                assert_int_equal(c->log_level, i);
                config_free(c);
        }
}

/* ---- one test per error class ------------------------------------------ */

static void test_err_unknown_section(void **state)
{
        (void)state;
        /* keys of an unknown section are not reported again */
        expect_main_error("[Daemon]\n[Deamon]\nLogLevel=info\n",
                          "/kairosd.conf:2: unknown section [Deamon] "
                          "(expected [Daemon], [Idempotency], [Notify] or [Cluster])");
        expect_schedule_error("[Schedule]\nCron=@daily\n[Daemon]\n",
                              "/schedules.d/x.conf:3: unknown section [Daemon] "
                              "(expected [Schedule], [Mandate], [Exec] or [Notify])");
}

static void test_err_malformed_section(void **state)
{
        (void)state;
        expect_main_error("[Daemon\n", "/kairosd.conf:1: malformed section header \"[Daemon\"");
        expect_main_error("[Daemon] x\n",
                          "/kairosd.conf:1: malformed section header \"[Daemon] x\"");
        expect_main_error("[]\n", "/kairosd.conf:1: malformed section header \"[]\"");
}

static void test_err_unknown_key(void **state)
{
        (void)state;
        expect_main_error("[Daemon]\n\nLogLvl = info\n",
                          "/kairosd.conf:3: LogLvl=: unknown key in [Daemon]");
        /* keys are case-sensitive and belong to their section */
        expect_main_error("[Idempotency]\nLogLevel=info\n",
                          "/kairosd.conf:2: LogLevel=: unknown key in [Idempotency]");
}

static void test_err_key_outside_section(void **state)
{
        (void)state;
        expect_main_error("# first\nLogLevel=info\n[Daemon]\n",
                          "/kairosd.conf:2: LogLevel=: assignment outside of any section");
}

static void test_err_line_without_equals(void **state)
{
        (void)state;
        expect_main_error("[Daemon]\nLogLevel info\n",
                          "/kairosd.conf:2: missing '=' in \"LogLevel info\" "
                          "(expected Key=Value or [Section])");
        expect_main_error("[Daemon]\n = info\n", "/kairosd.conf:2: missing key before '='");
}

static void test_err_duplicate_section(void **state)
{
        (void)state;
        expect_main_error("[Daemon]\nLogLevel=info\n\n[Daemon]\nSocketGroup=x\n",
                          "/kairosd.conf:4: duplicate section [Daemon] (first at line 1)");
}

static void test_err_duplicate_section_is_per_file(void **state)
{
        (void)state;
        put("kairosd.conf", "[Daemon]\nLogLevel=info\n");
        put("kairosd.conf.d/a.conf", "[Daemon]\nLogLevel=err\n");
        struct config *c = NULL;
        assert_int_equal(config_load(rooted("kairosd.conf"), NULL, &c, NULL), 0);
        assert_int_equal(c->log_level, 3);
        config_free(c);
}

static void test_err_bad_bool(void **state)
{
        (void)state;
        expect_schedule_error("[Schedule]\nCron=@daily\nEnabled=maybe\n",
                              "/schedules.d/x.conf:3: Enabled=: \"maybe\" is not a boolean "
                              "(use yes/no, true/false, on/off, 1/0)");
}

static void test_err_bad_number(void **state)
{
        (void)state;
        expect_main_error("[Daemon]\nMaxConcurrentMandates=12a\n",
                          "/kairosd.conf:2: MaxConcurrentMandates=: \"12a\" is not a number");
        expect_main_error("[Daemon]\nMaxConcurrentMandates=-1\n",
                          "/kairosd.conf:2: MaxConcurrentMandates=: \"-1\" is not a number");
        expect_main_error("[Daemon]\nMaxConcurrentMandates=+4\n",
                          "/kairosd.conf:2: MaxConcurrentMandates=: \"+4\" is not a number");
}

static void test_err_number_out_of_range(void **state)
{
        (void)state;
        expect_main_error("[Daemon]\nMaxConcurrentMandates=0\n",
                          "/kairosd.conf:2: MaxConcurrentMandates=: 0 out of range 1..1024");
        expect_main_error("[Daemon]\nMaxConcurrentMandates=1025\n",
                          "/kairosd.conf:2: MaxConcurrentMandates=: 1025 out of range 1..1024");
        expect_main_error("[Idempotency]\nMaxEntries=10000001\n",
                          "/kairosd.conf:2: MaxEntries=: 10000001 out of range 1..10000000");
        expect_main_error("[Idempotency]\nMaxEntries=99999999999999999999999\n",
                          "/kairosd.conf:2: MaxEntries=: 99999999999999999999999 out of range "
                          "1..10000000");
        expect_schedule_error("[Schedule]\nCron=@daily\n[Mandate]\nMaxCycles=11\n",
                              "/schedules.d/x.conf:4: MaxCycles=: 11 out of range 1..10");
        expect_schedule_error("[Schedule]\nCron=@daily\nMissedGraceSec=3601\n",
                              "/schedules.d/x.conf:3: MissedGraceSec=: 3601 out of range "
                              "0..3600 seconds");
        expect_schedule_error("[Schedule]\nCron=@daily\nMaxCatchUpRuns=1001\n",
                              "/schedules.d/x.conf:3: MaxCatchUpRuns=: 1001 out of range "
                              "1..1000");
        expect_schedule_error("[Schedule]\nCron=@daily\n[Exec]\nTimeoutSec=0\n",
                              "/schedules.d/x.conf:4: TimeoutSec=: 0 out of range "
                              "1..3153600000 seconds");
        expect_main_error("[Idempotency]\nTTLSec=0min\n",
                          "/kairosd.conf:2: TTLSec=: 0min out of range 1..3153600000 seconds");
        expect_main_error("[Daemon]\nGracefulTimeoutSec=36501d\n",
                          "/kairosd.conf:2: GracefulTimeoutSec=: 36501d out of range "
                          "0..3153600000 seconds");
        expect_main_error("[Daemon]\nGracefulTimeoutSec=99999999999999999999\n",
                          "/kairosd.conf:2: GracefulTimeoutSec=: 99999999999999999999 out of "
                          "range 0..3153600000 seconds");
}

static void test_err_bad_duration(void **state)
{
        (void)state;
        expect_main_error("[Daemon]\nGracefulTimeoutSec=5 minutes\n",
                          "/kairosd.conf:2: GracefulTimeoutSec=: \"5 minutes\" is not a valid "
                          "duration (e.g. 30, 30s, 5min, 2h, 1d, 1h30min)");
        expect_schedule_error("[Schedule]\nCron=@daily\nStaleAfter=2 days\n",
                              "/schedules.d/x.conf:3: StaleAfter=: \"2 days\" is not a valid "
                              "duration (e.g. 30, 30s, 5min, 2h, 1d, 1h30min)");
}

static void test_err_bad_enum(void **state)
{
        (void)state;
        expect_main_error("[Daemon]\nLogLevel=verbose\n",
                          "/kairosd.conf:2: LogLevel=: \"verbose\" is not one of: emerg, alert, "
                          "crit, err, warning, notice, info, debug");
        expect_schedule_error("[Schedule]\nCron=@daily\nMissedPolicy=catch_up\n",
                              "/schedules.d/x.conf:3: MissedPolicy=: \"catch_up\" is not one "
                              "of: skip, catch_up_once, catch_up_bounded");
        expect_schedule_error("[Schedule]\nCron=@daily\nConcurrency=Queue\n",
                              "/schedules.d/x.conf:3: Concurrency=: \"Queue\" is not one of: "
                              "queue, allow, reject");
        /* keys that never had an effect are refused, never ignored */
        expect_schedule_error("[Schedule]\nCron=@daily\n[Mandate]\nRiskBudget=low\n",
                              "/schedules.d/x.conf:4: RiskBudget=: not supported (it never had "
                              "an effect and was removed; delete the line)");
        expect_schedule_error("[Schedule]\nCron=@daily\n[Mandate]\nCheckpointEvery=1\n",
                              "/schedules.d/x.conf:4: CheckpointEvery=: not supported (it never "
                              "had an effect and was removed; delete the line)");
        expect_schedule_error("[Schedule]\nCron=@daily\nRiskBudget=low\n",
                              "/schedules.d/x.conf:3: RiskBudget=: unknown key in [Schedule]");
}

static void test_err_relative_path(void **state)
{
        (void)state;
        expect_main_error("[Daemon]\nStateDirectory=var/lib/kairos\n",
                          "/kairosd.conf:2: StateDirectory=: \"var/lib/kairos\" is not an "
                          "absolute path");
        expect_main_error("[Idempotency]\nWriteRoots=/srv/ok srv/bad\n",
                          "/kairosd.conf:2: WriteRoots=: \"srv/bad\" is not an absolute path");
        expect_main_error("[Idempotency]\nTTLSec=1h\nMaxWriteBytes=1 GB\n",
                          "/kairosd.conf:3: MaxWriteBytes=: \"1 GB\" is not valid (expected "
                          "bytes with an optional K, M, G or T suffix, or infinity)");
        expect_main_error("[Idempotency]\nMaxWriteBytes=0\n",
                          "/kairosd.conf:2: MaxWriteBytes=: \"0\" is not valid (expected "
                          "bytes with an optional K, M, G or T suffix, or infinity)");
        expect_schedule_error("[Schedule]\nCron=@daily\n[Exec]\nWorkingDirectory=./w\n",
                              "/schedules.d/x.conf:4: WorkingDirectory=: \"./w\" is not an "
                              "absolute path");
        expect_main_error("[Daemon]\nStateDirectory=/srv/../etc\n",
                          "/kairosd.conf:2: StateDirectory=: \"/srv/../etc\" must not contain "
                          "\"..\"");
        /* ".." inside a name is fine */
        put("kairosd.conf", "[Daemon]\nStateDirectory=/srv/a..b/..c\n");
        struct config *c = NULL;
        assert_int_equal(config_load(rooted("kairosd.conf"), NULL, &c, NULL), 0);
        assert_string_equal(c->state_directory, "/srv/a..b/..c");
        config_free(c);
}

static void test_err_empty_required_value(void **state)
{
        (void)state;
        expect_main_error("[Daemon]\nSocketGroup=\n",
                          "/kairosd.conf:2: SocketGroup=: empty value (a value is required)");
        expect_main_error("[Daemon]\nStateDirectory=   \n",
                          "/kairosd.conf:2: StateDirectory=: empty value (a value is required)");
        expect_schedule_error("[Schedule]\nCron=\n",
                              "/schedules.d/x.conf:2: Cron=: empty value (a value is required)");
        expect_schedule_error("[Schedule]\nCron=@daily\nMaxCatchUpRuns=\n",
                              "/schedules.d/x.conf:3: MaxCatchUpRuns=: empty value (a value is "
                              "required)");
}

static void test_err_missing_cron(void **state)
{
        (void)state;
        expect_schedule_error("[Schedule]\nEnabled=yes\n",
                              "/schedules.d/x.conf: Cron=: missing (required in [Schedule])");
        expect_schedule_error("",
                              "/schedules.d/x.conf: Cron=: missing (required in [Schedule])");
}

static void test_err_invalid_schedule_name(void **state)
{
        (void)state;
        put("kairosd.conf", "");
        put("schedules.d/bad name.conf", "[Schedule]\nCron=@daily\n");
        put("schedules.d/.conf", "[Schedule]\nCron=@daily\n");
        char long_name[80];
        memset(long_name, 'n', 65);
        strcpy(long_name + 65, ".conf");
        char rel[128];
        XSNPRINTF(rel, "schedules.d/%s", long_name);
        put(rel, "[Schedule]\nCron=@daily\n");
        char want_long[256];
        XSNPRINTF(want_long,
                 "/schedules.d/%s: invalid schedule name \"%.65s\" (1 to 64 of A-Z a-z 0-9 _ -)",
                 long_name, long_name);
        expect_load_errors(-EINVAL, (const char *const[]){
                "/schedules.d/.conf: invalid schedule name \"\" (1 to 64 of A-Z a-z 0-9 _ -)",
                "/schedules.d/bad name.conf: invalid schedule name \"bad name\" "
                "(1 to 64 of A-Z a-z 0-9 _ -)",
                want_long,
                NULL });

        /* 64 characters is fine */
        assert_int_equal(unlink(rooted("schedules.d/bad name.conf")), 0);
        assert_int_equal(unlink(rooted("schedules.d/.conf")), 0);
        assert_int_equal(unlink(rooted(rel)), 0);
        long_name[64] = '\0';
        XSNPRINTF(rel, "schedules.d/%s.conf", long_name);
        put(rel, "[Schedule]\nCron=@daily\n");
        struct config *c = NULL;
        assert_int_equal(config_load(rooted("kairosd.conf"), NULL, &c, NULL), 0);
        assert_int_equal(c->nschedules, 1);
        assert_string_equal(c->schedules[0].name, long_name);
        config_free(c);
}

static void test_valid_schedule_name(void **state)
{
        (void)state;
        assert_true(config_valid_schedule_name("a"));
        assert_true(config_valid_schedule_name("Nightly_report-2"));
        assert_true(config_valid_schedule_name(
                "0123456789012345678901234567890123456789012345678901234567890123"));
        assert_false(config_valid_schedule_name(
                "01234567890123456789012345678901234567890123456789012345678901234"));
        assert_false(config_valid_schedule_name(""));
        assert_false(config_valid_schedule_name(NULL));
        assert_false(config_valid_schedule_name("a b"));
        assert_false(config_valid_schedule_name("a/b"));
        assert_false(config_valid_schedule_name(".."));
        assert_false(config_valid_schedule_name("a.b"));
        assert_false(config_valid_schedule_name("\xc3\xa9t\xc3\xa9"));
}

static void test_err_bad_cron(void **state)
{
        (void)state;
        expect_schedule_error("[Schedule]\nCron=60 * * * *\n",
                              "/schedules.d/x.conf:2: Cron=: invalid expression \"60 * * * *\": "
                              "minute: 60 out of range 0-59");
        expect_schedule_error("[Schedule]\nCron=0 0 31 2 *\n",
                              "/schedules.d/x.conf:2: Cron=: expression \"0 0 31 2 *\" never "
                              "matches any date");
}

static void test_err_unknown_time_zone(void **state)
{
        (void)state;
        expect_schedule_error("[Schedule]\nCron=@daily\nTimeZone=Mars/Olympus_Mons\n",
                              "/schedules.d/x.conf:3: TimeZone=: unknown time zone "
                              "\"Mars/Olympus_Mons\"");
        expect_schedule_error("[Schedule]\nCron=@daily\nTimeZone=../../etc/passwd\n",
                              "/schedules.d/x.conf:3: TimeZone=: invalid time zone name "
                              "\"../../etc/passwd\"");
}

static void test_err_unreadable_file(void **state)
{
        (void)state;
        /* the main file itself: -errno, and the message says why */
        expect_load_errors(-ENOENT, (const char *const[]){
                "/kairosd.conf: cannot read: No such file or directory", NULL });

        /* a drop-in that cannot be read is an error like any other */
        put("kairosd.conf", "");
        assert_int_equal(mkdir(rooted("kairosd.conf.d"), 0755), 0);
        assert_int_equal(mkdir(rooted("kairosd.conf.d/x.conf"), 0755), 0);
        assert_int_equal(mkdir(rooted("schedules.d"), 0755), 0);
        assert_int_equal(symlink("/nonexistent/kairos", rooted("schedules.d/dangling.conf")), 0);
        assert_int_equal(mkfifo(rooted("schedules.d/fifo.conf"), 0644), 0);
        expect_load_errors(-EINVAL, (const char *const[]){
                "/kairosd.conf.d/x.conf: cannot read: Is a directory",
                "/schedules.d/dangling.conf: cannot read: No such file or directory",
                "/schedules.d/fifo.conf: cannot read: not a regular file",
                NULL });

        /* a schedules.d that is not a directory */
        assert_int_equal(rmdir(rooted("kairosd.conf.d/x.conf")), 0);
        assert_int_equal(unlink(rooted("schedules.d/dangling.conf")), 0);
        assert_int_equal(unlink(rooted("schedules.d/fifo.conf")), 0);
        assert_int_equal(rmdir(rooted("schedules.d")), 0);
        put("schedules.d", "");
        expect_load_errors(-EINVAL, (const char *const[]){
                "/schedules.d: cannot read directory: Not a directory", NULL });
}

static void test_dev_null_masks_a_file(void **state)
{
        (void)state;
        put("kairosd.conf", "[Daemon]\nLogLevel=err\n");
        assert_int_equal(mkdir(rooted("kairosd.conf.d"), 0755), 0);
        assert_int_equal(symlink("/dev/null", rooted("kairosd.conf.d/masked.conf")), 0);
        struct config *c = NULL;
        assert_int_equal(config_load(rooted("kairosd.conf"), NULL, &c, NULL), 0);
        assert_int_equal(c->log_level, 3);
        config_free(c);
        /* a masked schedule is no schedule (an empty file would lack Cron=) */
        put("schedules.d/a.conf", "[Schedule]\nCron=@daily\n");
        assert_int_equal(symlink("/dev/null", rooted("schedules.d/m.conf")), 0);
        assert_int_equal(config_load(rooted("kairosd.conf"), NULL, &c, NULL), 0);
        assert_int_equal(c->nschedules, 1);
        assert_string_equal(c->schedules[0].name, "a");
        config_free(c);
        c = NULL;
        assert_int_equal(config_load(rooted("kairosd.conf"), "", &c, NULL), -EINVAL);
        assert_null(c);
}

static void test_err_bad_command_line(void **state)
{
        (void)state;
        expect_schedule_error("[Schedule]\nCron=@daily\n[Exec]\nAct=/bin/echo \"unterminated\n",
                              "/schedules.d/x.conf:4: Act=: cannot split command line: "
                              "unbalanced double quote");
        expect_schedule_error("[Schedule]\nCron=@daily\n[Exec]\nObserve='\n",
                              "/schedules.d/x.conf:4: Observe=: cannot split command line: "
                              "unbalanced single quote");
        expect_schedule_error("[Schedule]\nCron=@daily\n[Exec]\nProbe=/bin/x \\q\n",
                              "/schedules.d/x.conf:4: Probe=: cannot split command line: "
                              "unknown escape sequence");
        expect_schedule_error("[Schedule]\nCron=@daily\n[Exec]\nReflect=\"\" arg\n",
                              "/schedules.d/x.conf:4: Reflect=: empty command name");
}

static void test_err_bad_environment(void **state)
{
        (void)state;
        expect_schedule_error("[Schedule]\nCron=@daily\n[Exec]\nEnvironment=1A=x\n",
                              "/schedules.d/x.conf:4: Environment=: \"1A=x\" is not a valid "
                              "assignment (expected NAME=VALUE, NAME of A-Z a-z 0-9 _ not "
                              "starting with a digit; quote a value with blanks: "
                              "\"NAME=a b\")");
        expect_schedule_error("[Schedule]\nCron=@daily\n[Exec]\nEnvironment=NOVALUE\n",
                              "/schedules.d/x.conf:4: Environment=: \"NOVALUE\" is not a valid "
                              "assignment (expected NAME=VALUE, NAME of A-Z a-z 0-9 _ not "
                              "starting with a digit; quote a value with blanks: "
                              "\"NAME=a b\")");
        /* several on a line: each bad one named, the line split as systemd does */
        put("kairosd.conf", "");
        put("schedules.d/x.conf", "[Schedule]\nCron=@daily\n[Exec]\n"
            "Environment=\"A=1 2\" B=3 hello \"C=x\" 9=z\n"
            "Environment=\"D=unterminated\n"
            "Environment=E=1 KAIROS_X=2\n");
        expect_load_errors(-EINVAL, (const char *const[]){
                "/schedules.d/x.conf:4: Environment=: \"hello\" is not a valid assignment "
                "(expected NAME=VALUE, NAME of A-Z a-z 0-9 _ not starting with a digit; quote "
                "a value with blanks: \"NAME=a b\")",
                "/schedules.d/x.conf:4: Environment=: \"9=z\" is not a valid assignment "
                "(expected NAME=VALUE, NAME of A-Z a-z 0-9 _ not starting with a digit; quote "
                "a value with blanks: \"NAME=a b\")",
                "/schedules.d/x.conf:5: Environment=: cannot split \"\"D=unterminated\": "
                "unbalanced double quote",
                "/schedules.d/x.conf:6: Environment=: \"KAIROS_X\" is reserved (KAIROS_* "
                "variables are set by kairosd)",
                NULL });
        expect_schedule_error("[Schedule]\nCron=@daily\n[Exec]\nEnvironment=KAIROS_GOAL=x\n",
                              "/schedules.d/x.conf:4: Environment=: \"KAIROS_GOAL\" is reserved "
                              "(KAIROS_* variables are set by kairosd)");
}

static void test_err_socket_path_too_long(void **state)
{
        (void)state;
        char text[300], want[400], path[200];
        memset(path, 'p', sizeof(path));
        path[0] = '/';
        path[108] = '\0';
        XSNPRINTF(text, "[Daemon]\nControlSocket=%s\n", path);
        XSNPRINTF(want, "/kairosd.conf:2: ControlSocket=: path too long for a unix "
                 "socket (at most 107 bytes)");
        expect_main_error(text, want);
        path[107] = '\0';
        XSNPRINTF(text, "[Daemon]\nControlSocket=%s\n", path);
        put("kairosd.conf", text);
        struct config *c = NULL;
        assert_int_equal(config_load(rooted("kairosd.conf"), NULL, &c, NULL), 0);
        assert_string_equal(c->control_socket, path);
        config_free(c);
}

static void test_err_control_character(void **state)
{
        (void)state;
        static const char text[] = "[Daemon]\nSocketGroup=a\x01z\nLogLevel=info\n";
        expect_main_error(text, "/kairosd.conf:2: control character in line");
        /* the line after it still counts (and a NUL byte is a control character) */
        put("kairosd.conf", "[Daemon]\n");
        FILE *f = fopen(rooted("kairosd.conf"), "a");
        assert_non_null(f);
        assert_int_equal(fwrite("SocketGroup=a\0b\nLogLevel=nope\n", 1, 30, f), 30);
        assert_int_equal(fclose(f), 0);
        expect_load_errors(-EINVAL, (const char *const[]){
                "/kairosd.conf:2: control character in line",
                "/kairosd.conf:3: LogLevel=: \"nope\" is not one of: emerg, alert, crit, err, "
                "warning, notice, info, debug",
                NULL });
}

static void test_continuation_line_numbers(void **state)
{
        (void)state;
        /* an error names the first line of a continued line; later lines count
         * on; a comment ending in a backslash does not continue */
        put("kairosd.conf", "[Daemon]\nLogLevel=in\\\n  fo\n# note \\\n"
            "MaxConcurrentMandates=x\n");
        expect_load_errors(-EINVAL, (const char *const[]){
                "/kairosd.conf:2: LogLevel=: \"in   fo\" is not one of: emerg, alert, crit, "
                "err, warning, notice, info, debug",
                "/kairosd.conf:5: MaxConcurrentMandates=: \"x\" is not a number",
                NULL });

        /* a backslash on the last line (no newline at the end) just ends it */
        put("kairosd.conf", "[Daemon]\nSocketGroup=ops\\");
        struct config *c = NULL;
        assert_int_equal(config_load(rooted("kairosd.conf"), NULL, &c, NULL), 0);
        assert_string_equal(c->socket_group, "ops");
        config_free(c);
}

static void test_errors_collected_across_files(void **state)
{
        (void)state;
        put("kairosd.conf", "[Daemon]\nLogLvl=info\nMaxConcurrentMandates=0\n"
            "[Idempotency]\nWriteRoots=/a \\\n  b\nTTLSec=x\n");
        put("kairosd.conf.d/10-a.conf", "[Daemon]\nLogLevel=loud\n");
        put("kairosd.conf.d/20-b.conf", "Stray\n");
        put("schedules.d/bad.name.conf", "[Schedule]\nCron=@daily\n");
        put("schedules.d/ok.conf", "[Schedule]\nCron=@daily\n[Mandate]\nMaxCycles=0\n");
        put("schedules.d/zz.conf", "[Exec]\nTimeoutSec=soon\n");
        expect_load_errors(-EINVAL, (const char *const[]){
                "/kairosd.conf:2: LogLvl=: unknown key in [Daemon]",
                "/kairosd.conf:3: MaxConcurrentMandates=: 0 out of range 1..1024",
                "/kairosd.conf:5: WriteRoots=: \"b\" is not an absolute path",
                "/kairosd.conf:7: TTLSec=: \"x\" is not a valid duration "
                "(e.g. 30, 30s, 5min, 2h, 1d, 1h30min)",
                "/kairosd.conf.d/10-a.conf:2: LogLevel=: \"loud\" is not one of: emerg, alert, "
                "crit, err, warning, notice, info, debug",
                "/kairosd.conf.d/20-b.conf:1: missing '=' in \"Stray\" "
                "(expected Key=Value or [Section])",
                "/schedules.d/bad.name.conf: invalid schedule name \"bad.name\" "
                "(1 to 64 of A-Z a-z 0-9 _ -)",
                "/schedules.d/ok.conf:4: MaxCycles=: 0 out of range 1..10",
                "/schedules.d/zz.conf:2: TimeoutSec=: \"soon\" is not a valid duration "
                "(e.g. 30, 30s, 5min, 2h, 1d, 1h30min)",
                "/schedules.d/zz.conf: Cron=: missing (required in [Schedule])",
                NULL });
}

/* A schedule file with errors is skipped: the others load, the main file is
 * fine, the broken one is listed with its errors. */
static void test_broken_schedule_skipped(void **state)
{
        (void)state;
        put("kairosd.conf", "[Daemon]\nLogLevel=err\n");
        put("schedules.d/a.conf", "[Schedule]\nCron=@daily\n");
        put("schedules.d/b.conf", "[Schedule]\nCron=61 * * * *\nBogus=1\n");
        put("schedules.d/c.conf", "[Schedule]\nCron=@hourly\n");
        struct config *c = NULL;
        struct config_errors errs = { 0 };
        assert_int_equal(config_load(rooted("kairosd.conf"), NULL, &c, &errs), 0);
        assert_int_equal(errs.n, 0);
        assert_int_equal(c->nschedules, 2);
        assert_string_equal(c->schedules[0].name, "a");
        assert_string_equal(c->schedules[1].name, "c");
        assert_int_equal(c->nbroken, 1);
        assert_string_equal(c->broken[0].name, "b");
        assert_string_equal(c->broken[0].path, rooted("schedules.d/b.conf"));
        assert_int_equal(c->broken[0].errors.n, 2);
        char want[PATH_MAX + 128];
        XSNPRINTF(want, "%s:2: Cron=: invalid expression \"61 * * * *\": minute: 61 out of "
                  "range 0-59", rooted("schedules.d/b.conf"));
        assert_string_equal(c->broken[0].errors.msgs[0], want);
        assert_non_null(config_find_broken(c, "b"));
        assert_null(config_find_broken(c, "a"));
        assert_null(config_find_schedule(c, "b"));
        assert_non_null(config_find_schedule(c, "c"));
        config_free(c);

        /* main-only: schedules are not read at all */
        assert_int_equal(config_load_main_only(rooted("kairosd.conf"), NULL, &c, &errs), 0);
        assert_int_equal(c->nschedules, 0);
        assert_int_equal(c->nbroken, 0);
        assert_int_equal(c->log_level, 3);
        config_free(c);

        /* a broken main file still fails, with the schedules' errors after its own */
        put("kairosd.conf", "[Daemon]\nLogLevel=loud\n");
        assert_int_equal(config_load(rooted("kairosd.conf"), NULL, &c, &errs), -EINVAL);
        assert_null(c);
        assert_int_equal(errs.n, 3);
        assert_non_null(strstr(errs.msgs[0], "/kairosd.conf:2: LogLevel=:"));
        assert_non_null(strstr(errs.msgs[1], "/schedules.d/b.conf:2: Cron=:"));
        assert_non_null(strstr(errs.msgs[2], "/schedules.d/b.conf:3: Bogus=: unknown key"));
        config_errors_free(&errs);
        assert_int_equal(config_load_main_only(rooted("kairosd.conf"), NULL, &c, &errs),
                         -EINVAL);
        assert_int_equal(errs.n, 1);
        config_errors_free(&errs);
}

/* After a reload that breaks a schedule, its old configuration stays (for
 * its running mandates), marked retained; a schedule new and broken has none. */
static void test_retain_broken(void **state)
{
        (void)state;
        put("kairosd.conf", "");
        put("schedules.d/a.conf", "[Schedule]\nCron=@daily\n[Exec]\nAct=/bin/old\n");
        put("schedules.d/b.conf", "[Schedule]\nCron=@hourly\n");
        struct config *old = NULL, *neu = NULL, *third = NULL;
        assert_int_equal(config_load(rooted("kairosd.conf"), NULL, &old, NULL), 0);
        put("schedules.d/a.conf", "[Schedule]\nCron=@daily\n[Exec]\nAct=/bin/new \"\n");
        put("schedules.d/n.conf", "[Schedule]\n");
        assert_int_equal(config_load(rooted("kairosd.conf"), NULL, &neu, NULL), 0);
        assert_int_equal(neu->nbroken, 2);
        assert_int_equal(neu->nschedules, 1);
        assert_int_equal(config_retain_broken(neu, old), 1);
        assert_int_equal(neu->nschedules, 2);
        const struct config_schedule *a = config_find_schedule(neu, "a");
        assert_non_null(a);
        assert_true(a->retained);
        assert_string_equal(a->exec[3], "/bin/old");
        assert_string_equal(neu->schedules[0].name, "a"); /* still sorted */
        assert_false(config_find_schedule(neu, "b")->retained);
        assert_null(config_find_schedule(neu, "n"));
        assert_null(config_find_schedule(old, "a")); /* moved, not copied */
        config_free(old);
        /* broken again at the next reload: retained again */
        assert_int_equal(config_load(rooted("kairosd.conf"), NULL, &third, NULL), 0);
        assert_int_equal(config_retain_broken(third, neu), 1);
        assert_string_equal(config_find_schedule(third, "a")->exec[3], "/bin/old");
        config_free(neu);
        config_free(third);
        assert_int_equal(config_retain_broken(NULL, NULL), -EINVAL);
}

/* The step retry policy: the schedule's keys, a phase's own overriding
 * them, defaults (no retry, 1 s doubling to 60 s, failures but timeouts),
 * an empty value back to the default, and every bad value with file:line. */
static void test_retry_policy(void **state)
{
        (void)state;
        struct config_schedule s;
        struct config_errors errs = { 0 };
        const char *text = "[Schedule]\nCron=@daily\n[Exec]\n"
                           "RetryAttempts=3\n"
                           "RetryBackoffSec=0.3 factor=1.5 max=10 jitter=10%\n"
                           "RetryOn=exit_status 75 timeout\n"
                           "ActRetryAttempts=5\n"
                           "ActRetryOn=failure\n"
                           "ReflectRetryAttempts=1\nReflectRetryAttempts=\n";
        assert_int_equal(config_parse_schedule("x", "/s/x.conf", text, strlen(text), &s, &errs),
                         0);
        assert_int_equal(errs.n, 0);
        const struct retry_policy *o = &s.retry[0], *a = &s.retry[3], *r = &s.retry[4];
        assert_int_equal(o->attempts, 3);
        assert_int_equal(o->first_ms, 300);
        assert_int_equal(o->factor_pct, 150);
        assert_int_equal(o->max_ms, 10000);
        assert_int_equal(o->jitter_pct, 10);
        assert_int_equal(o->on, RETRY_ON_EXIT_STATUS | RETRY_ON_TIMEOUT);
        assert_true(retry_matches(o, "exit_status", "exit status 75\nboom"));
        assert_false(retry_matches(o, "exit_status", "exit status 1"));
        assert_true(retry_matches(o, "timeout", "no exit"));
        assert_false(retry_matches(o, "cancelled", "x"));
        assert_false(retry_matches(o, "signal", "x"));
        assert_int_equal(a->attempts, 5);
        assert_int_equal(a->first_ms, 300); /* inherited */
        assert_int_equal(a->on, RETRY_ON_FAILURE);
        assert_true(retry_matches(a, "signal", "killed"));
        assert_false(retry_matches(a, "timeout", "no exit"));
        assert_int_equal(r->attempts, 3); /* reset: the schedule's */
        /* delays: 300, 450, 675, ... at most 10 s, plus up to 10% */
        assert_int_equal(retry_delay_ms(o, 1, 0), 300);
        assert_int_equal(retry_delay_ms(o, 2, 0), 450);
        assert_int_equal(retry_delay_ms(o, 3, 0), 675);
        assert_int_equal(retry_delay_ms(o, 50, 0), 10000);
        assert_int_equal(retry_delay_ms(o, 1, UINT32_MAX), 329);
        config_schedule_clear(&s);

        /* defaults: no retry */
        text = "[Schedule]\nCron=@daily\n";
        assert_int_equal(config_parse_schedule("x", "/s/x.conf", text, strlen(text), &s, &errs),
                         0);
        assert_int_equal(s.retry[3].attempts, 0);
        assert_int_equal(s.retry[3].first_ms, 1000);
        assert_int_equal(s.retry[3].factor_pct, 200);
        assert_int_equal(s.retry[3].max_ms, 60000);
        assert_false(retry_matches(&s.retry[3], "exit_status", "exit status 1"));
        config_schedule_clear(&s);

        text = "[Schedule]\nCron=@daily\n[Exec]\n"
               "RetryAttempts=101\n"
               "RetryAttempts=-1\n"
               "RetryBackoffSec=\n"
               "RetryBackoffSec=fast\n"
               "ActRetryBackoffSec=2 factor=0.5\n"
               "ActRetryBackoffSec=2 max=1\n"
               "ActRetryBackoffSec=2 jitter=10\n"
               "ActRetryBackoffSec=2 speed=3\n"
               "ActRetryBackoffSec=0.0001\n"
               "RetryOn=cancelled\n"
               "RetryOn=256\n"
               "ObserveRetryTimes=2\n";
        assert_int_equal(config_parse_schedule("x", "/s/x.conf", text, strlen(text), &s, &errs),
                         -EINVAL);
        assert_int_equal(errs.n, 11);
        assert_string_equal(errs.msgs[0], "/s/x.conf:4: RetryAttempts=: \"101\" is not a number "
                                          "of retries 0..100");
        assert_string_equal(errs.msgs[1], "/s/x.conf:5: RetryAttempts=: \"-1\" is not a number "
                                          "of retries 0..100");
        assert_string_equal(errs.msgs[2], "/s/x.conf:7: RetryBackoffSec=: \"fast\": the first "
                                          "wait must be seconds such as 2 or 0.3 (at most 3 "
                                          "decimals)");
        assert_non_null(strstr(errs.msgs[3], ":8: ActRetryBackoffSec=: \"2 factor=0.5\": factor="));
        assert_non_null(strstr(errs.msgs[4], ":9: ActRetryBackoffSec=: \"2 max=1\": max= is less"));
        assert_non_null(strstr(errs.msgs[5], ":10: ActRetryBackoffSec=: \"2 jitter=10\": expected"));
        assert_non_null(strstr(errs.msgs[6], ":11: ActRetryBackoffSec=: \"2 speed=3\": expected"));
        assert_non_null(strstr(errs.msgs[7], ":12: ActRetryBackoffSec=: \"0.0001\": the first"));
        assert_non_null(strstr(errs.msgs[8], ":13: RetryOn=: \"cancelled\" is not failure"));
        assert_non_null(strstr(errs.msgs[9], ":14: RetryOn=: \"256\" is not failure"));
        assert_non_null(strstr(errs.msgs[10], ":15: ") );
        assert_non_null(strstr(errs.msgs[10], "ObserveRetryTimes"));
        config_errors_free(&errs);
}

/* A command-line argument that looks like JSON whose quotes were eaten: a
 * warning with file:line, the schedule is valid all the same. */
static void test_warn_eaten_json_quotes(void **state)
{
        (void)state;
        struct config_schedule s;
        struct config_errors errs = { 0 };
        const char *text = "[Schedule]\nCron=@daily\n[Exec]\n"
                           "Reflect=/bin/echo {\"kairos\":{\"done\":true}}\n"
                           "Act=/bin/echo '{\"kairos\":{\"done\":true}}'\n"
                           "Observe=/bin/echo [1,2] {a:b}\n";
        assert_int_equal(config_parse_schedule("x", "/s/x.conf", text, strlen(text), &s, &errs),
                         0);
        assert_int_equal(errs.n, 0);
        assert_int_equal(s.warnings.n, 1);
        assert_string_equal(s.warnings.msgs[0],
                            "/s/x.conf:4: Reflect=: argument 1 '{kairos:{done:true}}' looks like "
                            "JSON whose double quotes were removed by the command-line quoting; "
                            "put it in single quotes, e.g. '{\"kairos\":{\"done\":true}}'");
        config_schedule_clear(&s);
        assert_int_equal(s.warnings.n, 0);
}

/* An Effects= phase whose `kairosctl tool run` gets a per-attempt value: a
 * warning with file:line and the value; the schedule is valid all the same. */
static void test_warn_tool_run_attempt_args(void **state)
{
        (void)state;
        struct config_schedule s;
        struct config_errors errs = { 0 };
        const char *text =
                "[Schedule]\nCron=@daily\n[Exec]\n"
                /* 4: not an effects phase: no warning */
                "Observe=kairosctl tool run --key $KAIROS_IDEM_KEY -- /bin/echo $KAIROS_ATTEMPT\n"
                /* 5: a word of the line */
                "Act=/usr/bin/kairosctl --socket /run/k.sock --json tool run --key "
                "$KAIROS_IDEM_KEY -- /usr/bin/send n=${KAIROS_ATTEMPT}\n"
                /* 6: in a shell script, after a clean call */
                "Reflect=/bin/sh -c 'echo $$KAIROS_ATTEMPT; \"$$KAIROSCTL\" tool run --key k -- "
                "true; $$KAIROSCTL tool run --key k2 -- curl -d \"$$(date +%s)\" x'\n"
                /* 7: only values every attempt shares */
                "Decide=kairosctl tool run --key $KAIROS_IDEM_KEY -- /bin/echo $KAIROS_STEP_ID\n"
                "Effects=act reflect decide\n";
        assert_int_equal(config_parse_schedule("x", "/s/x.conf", text, strlen(text), &s, &errs),
                         0);
        assert_int_equal(errs.n, 0);
        assert_int_equal(s.warnings.n, 2);
        const char *tail = ", which changes from one attempt of the step to the next: the run "
                           "after a crash makes the same call with other arguments, refused as "
                           "a mismatch (exit 65), or without --key runs the effect again; pass "
                           "only what every attempt passes alike (e.g. $KAIROS_IDEM_KEY)";
        char want[1024];
        snprintf(want, sizeof want, "/s/x.conf:5: Act=: 'kairosctl tool run' gets "
                 "$KAIROS_ATTEMPT%s", tail);
        assert_string_equal(s.warnings.msgs[0], want);
        snprintf(want, sizeof want, "/s/x.conf:6: Reflect=: 'kairosctl tool run' gets "
                 "$(date%s", tail);
        assert_string_equal(s.warnings.msgs[1], want);
        config_schedule_clear(&s);

        /* a clean schedule: none; a per-attempt value outside the call: none */
        text = "[Schedule]\nCron=@daily\n[Exec]\n"
               "Act=/bin/sh -c 'kairosctl tool run --key \"$$KAIROS_IDEM_KEY\" -- send; "
               "echo $$KAIROS_ATTEMPT $$RANDOM'\n"
               "EffectsVia=kairosctl\n";
        assert_int_equal(config_parse_schedule("x", "/s/x.conf", text, strlen(text), &s, &errs),
                         0);
        assert_int_equal(errs.n, 0);
        assert_int_equal(s.warnings.n, 0);
        config_schedule_clear(&s);

        /* every name of the list, the shell's too */
        static const char *const bad[] = { "$KAIROS_EPOCH", "${KAIROS_NODE}", "$RANDOM",
                                           "$SRANDOM", "$EPOCHSECONDS", "$EPOCHREALTIME",
                                           "$BASHPID", "`date`" };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                char t[512];
                snprintf(t, sizeof t, "[Schedule]\nCron=@daily\n[Exec]\nAct=/bin/sh -c "
                         "'kairosctl tool run -- send x%s'\n", bad[i]);
                for (char *c = strchr(t, '$'); c; c = strchr(c + 2, '$')) {
                        memmove(c + 1, c, strlen(c) + 1); /* $$: a literal $ for the shell */
                }
                assert_int_equal(config_parse_schedule("x", "/s/x.conf", t, strlen(t), &s, &errs),
                                 0);
                assert_int_equal(errs.n, 0);
                assert_int_equal(s.warnings.n, 1);
                assert_non_null(strstr(s.warnings.msgs[0], "/s/x.conf:4: Act=: "));
                config_schedule_clear(&s);
        }
}

/* ---- durations ---------------------------------------------------------- */

static void test_durations(void **state)
{
        (void)state;
        static const struct {
                const char *s;
                uint64_t v;
        } good[] = {
                { "0", 0 }, { "30", 30 }, { "30s", 30 }, { "30sec", 30 }, { "5min", 300 },
                { "2h", 7200 }, { "1d", 86400 }, { "1h30min", 5400 }, { "1h 30min", 5400 },
                { "1d2h3min4s", 93784 }, { "1h\t5s", 3605 }, { "007", 7 },
                { "1min1min", 120 }, { "18446744073709551615", UINT64_MAX },
                { "213503982334601d", UINT64_C(213503982334601) * 86400 },
        };
        for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
                uint64_t v = 12345;
                int r = config_parse_duration(good[i].s, &v);
                if (r != 0)
                        print_message("duration \"%s\" rejected\n", good[i].s);
                assert_int_equal(r, 0);
                assert_int_equal(v, good[i].v);
        }
        static const char *const bad[] = {
                "", " 30", "30 ", "s", "30x", "5m", "5 min", "1h30", "30 1h", "1.5h",
                "-5", "+5", "1H", "5mins", "1h,30min", "1h  ", "min5",
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                uint64_t v = 12345;
                int r = config_parse_duration(bad[i], &v);
                if (r != -EINVAL)
                        print_message("duration \"%s\" gave %d\n", bad[i], r);
                assert_int_equal(r, -EINVAL);
                assert_int_equal(v, 12345);
        }
        static const char *const big[] = {
                "18446744073709551616", "213503982334602d", "18446744073709551615s 1s",
                "99999999999999999999999h",
        };
        for (size_t i = 0; i < sizeof(big) / sizeof(big[0]); i++) {
                uint64_t v = 12345;
                assert_int_equal(config_parse_duration(big[i], &v), -ERANGE);
                assert_int_equal(v, 12345);
        }
        uint64_t v;
        assert_int_equal(config_parse_duration(NULL, &v), -EINVAL);
}

/* ---- built-in ------------------------------------------------------------ */

static void test_builtin(void **state)
{
        (void)state;
        struct config *c = NULL;
        assert_int_equal(config_builtin("/tmp/st", &c), 0);
        assert_null(c->config_path);
        assert_null(c->schedules_dir);
        assert_string_equal(c->state_directory, "/tmp/st");
        assert_string_equal(c->control_socket, "/tmp/st/control.sock");
        assert_string_equal(c->socket_group, "kairos");
        assert_int_equal(c->max_concurrent_mandates, 4);
        assert_int_equal(c->graceful_timeout_sec, 120);
        assert_int_equal(c->log_level, 6);
        assert_int_equal(c->idem_ttl_sec, 86400);
        assert_int_equal(c->idem_max_entries, 10000);
        assert_null(c->write_roots);
        assert_int_equal(c->nwrite_roots, 0);
        assert_null(c->schedules);
        assert_int_equal(c->nschedules, 0);
        config_free(c);

        assert_int_equal(config_builtin("/tmp/st/", &c), 0);
        assert_string_equal(c->control_socket, "/tmp/st/control.sock");
        config_free(c);

        c = NULL;
        assert_int_equal(config_builtin(NULL, &c), -EINVAL);
        assert_int_equal(config_builtin("", &c), -EINVAL);
        char longdir[200];
        memset(longdir, 'd', sizeof(longdir));
        longdir[0] = '/';
        longdir[150] = '\0';
        assert_int_equal(config_builtin(longdir, &c), -ENAMETOOLONG);
        assert_null(c);
        config_free(NULL);
}

/* [Notify]: the daemon's defaults (empty = none) and the schedule's
 * overrides (unset = the default, empty = none for this schedule). */
static void test_notify(void **state)
{
        (void)state;
        struct config *c = NULL;
        static const char main_text[] = "[Notify]\nOnReview=/usr/bin/page \"on call\"\n"
                                        "OnFailure=/bin/mail-me\nOnFailure=\n";
        assert_int_equal(config_parse_main("/k.conf", main_text, strlen(main_text), &c, NULL), 0);
        assert_string_equal(c->on_review, "/usr/bin/page \"on call\"");
        assert_null(c->on_failure);
        config_free(c);
        assert_int_equal(config_parse_main("/k.conf", "", 0, &c, NULL), 0);
        assert_null(c->on_review);
        assert_null(c->on_failure);
        config_free(c);

        struct config_schedule s;
        static const char sched[] = "[Schedule]\nCron=@daily\n[Notify]\nOnReview=\n";
        assert_int_equal(config_parse_schedule("x", "/x.conf", sched, strlen(sched), &s, NULL), 0);
        assert_non_null(s.on_review);
        assert_string_equal(s.on_review, "");
        assert_null(s.on_failure);
        config_schedule_clear(&s);
        static const char sched2[] = "[Schedule]\nCron=@daily\n[Notify]\nOnFailure=hook x\n";
        assert_int_equal(config_parse_schedule("x", "/x.conf", sched2, strlen(sched2), &s, NULL),
                         0);
        assert_null(s.on_review);
        assert_string_equal(s.on_failure, "hook x");
        config_schedule_clear(&s);

        expect_main_error("[Notify]\nOnReview=\"unbalanced\n",
                          "/kairosd.conf:2: OnReview=: cannot split command line: "
                          "unbalanced double quote");
        expect_main_error("[Notify]\nOnFail=x\n", "/kairosd.conf:2: OnFail=: unknown key in [Notify]");
        expect_schedule_error("[Schedule]\nCron=@daily\n[Notify]\nOnFailure=\"\"\n",
                              "/schedules.d/x.conf:4: OnFailure=: empty command name");
}

static void test_phase_keys(void **state)
{
        (void)state;
        assert_string_equal(config_phase_key(0), "Observe");
        assert_string_equal(config_phase_key(1), "Orient");
        assert_string_equal(config_phase_key(2), "Decide");
        assert_string_equal(config_phase_key(3), "Act");
        assert_string_equal(config_phase_key(4), "Reflect");
        assert_null(config_phase_key(5));
        assert_null(config_phase_key(-1));
}

/* ---- command splitting --------------------------------------------------- */

static void expect_split(const char *cmd, const char *const *want)
{
        char **argv = NULL;
        size_t argc = 99;
        assert_int_equal(config_split_command(cmd, &argv, &argc), 0);
        size_t n = 0;
        while (want[n])
                n++;
        assert_int_equal(argc, n);
        for (size_t i = 0; i < n; i++)
                assert_string_equal(argv[i], want[i]);
        assert_null(argv[n]);
        config_strv_free(argv);
}

static void test_split_command(void **state)
{
        (void)state;
        expect_split("/bin/echo hello world", (const char *const[]){
                "/bin/echo", "hello", "world", NULL });
        expect_split("  a \t  b  ", (const char *const[]){ "a", "b", NULL });
        expect_split("", (const char *const[]){ NULL });
        expect_split(" \t ", (const char *const[]){ NULL });
        expect_split("echo \"a b\" 'c d'", (const char *const[]){ "echo", "a b", "c d", NULL });
        expect_split("x\"a b\"y'c'", (const char *const[]){ "xa byc", NULL });
        expect_split("echo \"\" ''", (const char *const[]){ "echo", "", "", NULL });
        expect_split("echo \"say \\\"hi\\\" \\\\ now\"", (const char *const[]){
                "echo", "say \"hi\" \\ now", NULL });
        expect_split("echo 'no \\n escapes \"here\"'", (const char *const[]){
                "echo", "no \\n escapes \"here\"", NULL });
        expect_split("echo \"\\n\\t\\r\"", (const char *const[]){ "echo", "\n\t\r", NULL });
        expect_split("echo a\\ b \\'c\\'", (const char *const[]){ "echo", "a b", "'c'", NULL });
        expect_split("sh -c 'echo $HOME; ls | wc'", (const char *const[]){
                "sh", "-c", "echo $HOME; ls | wc", NULL });
        expect_split("echo \"it's\"", (const char *const[]){ "echo", "it's", NULL });

        static const char *const bad[] = {
                "echo \"open", "echo 'open", "echo trailing\\", "echo \\q", "echo \"\\x41\"",
                "a\"b",
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                char **argv = (char **)0x1;
                size_t argc = 99;
                assert_int_equal(config_split_command(bad[i], &argv, &argc), -EINVAL);
                assert_ptr_equal(argv, (char **)0x1);
                assert_int_equal(argc, 99);
        }
        char **argv;
        size_t argc;
        assert_int_equal(config_split_command(NULL, &argv, &argc), -EINVAL);
        config_strv_free(NULL);
}

/* ---- variables in command lines ----------------------------------------- */

static void expect_expand(const char *cmd, char *const *env, const char *const *want)
{
        char **argv = NULL;
        size_t argc = 99;
        char why[256] = "";
        assert_int_equal(config_expand_command(cmd, env, &argv, &argc, why, sizeof why), 0);
        size_t n = 0;
        while (want[n])
                n++;
        for (size_t i = 0; i < argc && i < n; i++)
                if (strcmp(argv[i], want[i]) != 0)
                        print_message("word %zu: got \"%s\", want \"%s\"\n", i, argv[i], want[i]);
        assert_int_equal(argc, n);
        for (size_t i = 0; i < n; i++)
                assert_string_equal(argv[i], want[i]);
        assert_null(argv[n]);
        config_strv_free(argv);
}

static void test_expand_command(void **state)
{
        (void)state;
        char *env[] = { "KAIROS_IDEM_KEY=mnd_plan_1/act_001", "X=x", "SP= two  words ",
                        "EMPTY=", "D=a$b", NULL };
        /* a word of its own: the value, split at white space */
        expect_expand("kairosctl tool run --key $KAIROS_IDEM_KEY -- true", env,
                      (const char *const[]){ "kairosctl", "tool", "run", "--key",
                                             "mnd_plan_1/act_001", "--", "true", NULL });
        expect_expand("prog $SP end", env, (const char *const[]){ "prog", "two", "words", "end",
                                                                  NULL });
        expect_expand("prog $EMPTY $UNSET end", env, (const char *const[]){ "prog", "end", NULL });
        /* quotes are gone by then: "$SP" still splits, as in systemd */
        expect_expand("prog \"$SP\"", env, (const char *const[]){ "prog", "two", "words", NULL });
        /* ${NAME}: inside a word, as it is */
        expect_expand("prog --key=${KAIROS_IDEM_KEY} a${X}b${X}", env, (const char *const[]){
                "prog", "--key=mnd_plan_1/act_001", "axbx", NULL });
        expect_expand("prog ${SP} \"${SP}\" ${EMPTY} ${UNSET}", env, (const char *const[]){
                "prog", " two  words ", " two  words ", "", "", NULL });
        /* $$: one $, never expanded further; a value is not expanded again */
        expect_expand("prog $$ $$X a$$b $${X} $$$$ ${D}", env, (const char *const[]){
                "prog", "$", "$X", "a$b", "${X}", "$$", "a$b", NULL });
        /* any other $ stays: inside a word (for a shell), not a name */
        expect_expand("sh -c 'echo $X; echo $1' $1 $ a$X $X-y $-", env, (const char *const[]){
                "sh", "-c", "echo $X; echo $1", "$1", "$", "a$X", "$X-y", "$-", NULL });
        expect_expand("prog", NULL, (const char *const[]){ "prog", NULL });
        expect_expand("$UNSET", env, (const char *const[]){ NULL });

        static const char *const bad[][2] = {
                { "prog ${X", "\"${\" without \"}\" in \"${X\"" },
                { "prog a${}b", "\"${}\" is not a variable name" },
                { "prog ${1X}", "\"${1X}\" is not a variable name" },
                { "prog ${X:-d}", "\"${X:-d}\" is not a variable name" },
                { "prog \"open", "cannot split command line: unbalanced double quote" },
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                char **argv = (char **)0x1, why[256] = "";
                size_t argc = 99;
                assert_int_equal(config_expand_command(bad[i][0], env, &argv, &argc, why,
                                                       sizeof why), -EINVAL);
                assert_ptr_equal(argv, (char **)0x1);
                assert_int_equal(argc, 99);
                if (strncmp(why, bad[i][1], strlen(bad[i][1])) != 0)
                        print_message("got: %s\nwant: %s...\n", why, bad[i][1]);
                assert_int_equal(strncmp(why, bad[i][1], strlen(bad[i][1])), 0);
        }
        char **argv;
        size_t argc;
        assert_int_equal(config_expand_command(NULL, env, &argv, &argc, NULL, 0), -EINVAL);
}

static void test_command_vars(void **state)
{
        (void)state;
        char why[512];
        char *env[] = { "MINE=1", NULL };
        /* each kind knows kairosd's names for it, plus Environment='s for
         * handlers and probes */
        assert_int_equal(config_check_command_vars("a $KAIROS_IDEM_KEY ${KAIROS_EPOCH} $MINE",
                                                   CONFIG_COMMAND_HANDLER, env, why, sizeof why),
                         0);
        assert_int_equal(config_check_command_vars("a $KAIROS_PROBE", CONFIG_COMMAND_PROBE, NULL,
                                                   why, sizeof why), 0);
        assert_int_equal(config_check_command_vars("a $KAIROS_PROBE", CONFIG_COMMAND_HANDLER,
                                                   NULL, why, sizeof why), -EINVAL);
        assert_string_equal(why, "unknown variable $KAIROS_PROBE: a handler gets only the "
                            "variables of kairosd(8), HANDLERS, and those of Environment= "
                            "(write $$ for a literal $)");
        assert_int_equal(config_check_command_vars("a ${KAIROS_EVENT} $KAIROSCTL",
                                                   CONFIG_COMMAND_HOOK, NULL, why, sizeof why), 0);
        /* (an OnFailure= page of folded failures) */
        assert_int_equal(config_check_command_vars("a ${KAIROS_FOLDED} $KAIROS_SCHEDULES",
                                                   CONFIG_COMMAND_HOOK, NULL, why, sizeof why), 0);
        assert_int_equal(config_check_command_vars("a x${KAIROS_IDEM_KEY}",
                                                   CONFIG_COMMAND_HOOK, NULL, why, sizeof why),
                         -EINVAL);
        assert_string_equal(why, "unknown variable ${KAIROS_IDEM_KEY}: a hook gets only the "
                            "variables of kairosd(8), NOTIFY (write $$ for a literal $)");
        /* $NAME inside a word is not expanded, so not checked */
        assert_int_equal(config_check_command_vars("sh -c 'echo $NOPE' a$NOPE $$NOPE",
                                                   CONFIG_COMMAND_HANDLER, NULL, why, sizeof why),
                         0);
        for (const char *const *v = config_command_vars(CONFIG_COMMAND_PROBE); *v; v++)
                assert_true(strcmp(*v, "PATH") == 0 || strcmp(*v, "LANG") == 0 ||
                            strcmp(*v, "HOME") == 0 || strcmp(*v, "USER") == 0 ||
                            strcmp(*v, "LOGNAME") == 0 || strncmp(*v, "KAIROS", 6) == 0);
        assert_null(config_command_vars((enum config_command_kind)7));

        /* at load: the unknown name is an error naming file:line and key */
        expect_schedule_error("[Schedule]\nCron=@daily\n[Exec]\n"
                              "Act=kairosctl tool run --key $KAIROS_IDEM -- true\n",
                              "/schedules.d/x.conf:4: Act=: unknown variable $KAIROS_IDEM: a "
                              "handler gets only the variables of kairosd(8), HANDLERS, and "
                              "those of Environment= (write $$ for a literal $)");
        expect_schedule_error("[Schedule]\nCron=@daily\n[Exec]\nProbe=p ${X\n",
                              "/schedules.d/x.conf:4: Probe=: \"${\" without \"}\" in \"${X\" "
                              "(write $$ for a literal $)");
        expect_schedule_error("[Schedule]\nCron=@daily\n[Notify]\nOnReview=page $MINE\n"
                              "[Exec]\nEnvironment=MINE=1\n",
                              "/schedules.d/x.conf:4: OnReview=: unknown variable $MINE: a hook "
                              "gets only the variables of kairosd(8), NOTIFY (write $$ for a "
                              "literal $)");
        /* the last assignment's line; Environment= reset after it */
        expect_schedule_error("[Schedule]\nCron=@daily\n[Exec]\nEnvironment=MINE=1\n"
                              "Decide=a\nDecide=b ${MINE}\nEnvironment=\n",
                              "/schedules.d/x.conf:6: Decide=: unknown variable ${MINE}: a "
                              "handler gets only the variables of kairosd(8), HANDLERS, and "
                              "those of Environment= (write $$ for a literal $)");
        expect_main_error("[Notify]\nOnFailure=mail ${KAIROS_GOAL}\n",
                          "/kairosd.conf:2: OnFailure=: unknown variable ${KAIROS_GOAL}: a hook "
                          "gets only the variables of kairosd(8), NOTIFY (write $$ for a "
                          "literal $)");

        /* Environment= names are known wherever the line is; $$ and ${X} in a
         * word load as written (expanded only when the command starts) */
        struct config_schedule s;
        struct config_errors errs = { 0 };
        static const char text[] = "[Schedule]\nCron=@daily\n[Exec]\n"
                                   "Act=prog --key=${KAIROS_IDEM_KEY} $MINE $$HOME a${MINE}b\n"
                                   "Probe=probe $KAIROS_PROBE ${MINE}\n"
                                   "Environment=MINE=1\n"
                                   "[Notify]\nOnFailure=mail $$ ${KAIROS_STATUS}\n";
        assert_int_equal(config_parse_schedule("x", "/x.conf", text, strlen(text), &s, &errs), 0);
        assert_int_equal(errs.n, 0);
        assert_string_equal(s.exec[3], "prog --key=${KAIROS_IDEM_KEY} $MINE $$HOME a${MINE}b");
        char *env2[] = { "KAIROS_IDEM_KEY=k/act_001", "MINE=1", NULL };
        expect_expand(s.exec[3], env2, (const char *const[]){ "prog", "--key=k/act_001", "1",
                                                              "$HOME", "a1b", NULL });
        config_schedule_clear(&s);
}

/* ---- resource limits ---------------------------------------------------- */

static void test_limit_values(void **state)
{
        (void)state;
        static const struct {
                int (*fn)(const char *, uint64_t *);
                const char *s;
                int r;
                uint64_t v;
        } cases[] = {
                { config_parse_bytes, "1", 0, 1 },
                { config_parse_bytes, "4096", 0, 4096 },
                { config_parse_bytes, "20M", 0, UINT64_C(20) << 20 },
                { config_parse_bytes, "512K", 0, UINT64_C(512) << 10 },
                { config_parse_bytes, "2G", 0, UINT64_C(2) << 30 },
                { config_parse_bytes, "3T", 0, UINT64_C(3) << 40 },
                { config_parse_bytes, "infinity", 0, CONFIG_LIMIT_INFINITY },
                { config_parse_bytes, "0", -EINVAL, 0 },
                { config_parse_bytes, "0M", -EINVAL, 0 },
                { config_parse_bytes, "20m", -EINVAL, 0 },
                { config_parse_bytes, "20MB", -EINVAL, 0 },
                { config_parse_bytes, "1.5G", -EINVAL, 0 },
                { config_parse_bytes, "-1", -EINVAL, 0 },
                { config_parse_bytes, "M", -EINVAL, 0 },
                { config_parse_bytes, "", -EINVAL, 0 },
                { config_parse_bytes, "infinite", -EINVAL, 0 },
                { config_parse_bytes, "20%", -EINVAL, 0 },
                { config_parse_bytes, "99999999999T", -ERANGE, 0 },
                { config_parse_bytes, "99999999999999999999", -ERANGE, 0 },
                { config_parse_tasks, "1", 0, 1 },
                { config_parse_tasks, "64", 0, 64 },
                { config_parse_tasks, "infinity", 0, CONFIG_LIMIT_INFINITY },
                { config_parse_tasks, "0", -EINVAL, 0 },
                { config_parse_tasks, "10K", -EINVAL, 0 },
                { config_parse_tasks, "10%", -EINVAL, 0 },
                { config_parse_tasks, "x", -EINVAL, 0 },
                { config_parse_tasks, "4294967296", -ERANGE, 0 },
                { config_parse_percent, "50%", 0, 50 },
                { config_parse_percent, "200%", 0, 200 },
                { config_parse_percent, "1%", 0, 1 },
                { config_parse_percent, "50", -EINVAL, 0 },
                { config_parse_percent, "0%", -EINVAL, 0 },
                { config_parse_percent, "50%%", -EINVAL, 0 },
                { config_parse_percent, "infinity", -EINVAL, 0 },
                { config_parse_percent, "0.5%", -EINVAL, 0 },
                { config_parse_percent, "100001%", -ERANGE, 0 },
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                uint64_t v = 12345;
                int r = cases[i].fn(cases[i].s, &v);
                if (r != cases[i].r)
                        print_message("limit \"%s\": %d, expected %d\n", cases[i].s, r,
                                      cases[i].r);
                assert_int_equal(r, cases[i].r);
                assert_int_equal(v, r == 0 ? cases[i].v : 12345);
        }
}

static void test_limit_keys(void **state)
{
        (void)state;
        const char *text = "[Schedule]\nCron=* * * * *\n[Exec]\nAct=/bin/true\n"
                           "MemoryMax=1G\nMemoryMax=20M\nTasksMax=infinity\nTasksMax=16\n"
                           "CPUQuota=50%\nCPUQuota=\n";
        struct config_schedule s;
        struct config_errors errs = { 0 };
        assert_int_equal(config_parse_schedule("n", "/n.conf", text, strlen(text), &s, &errs), 0);
        assert_int_equal(errs.n, 0);
        assert_int_equal(s.memory_max, UINT64_C(20) << 20);
        assert_int_equal(s.tasks_max, 16);
        assert_int_equal(s.cpu_quota_pct, 0); /* reset by the empty value */
        assert_true(config_schedule_has_limits(&s));
        config_schedule_clear(&s);

        text = "[Schedule]\nCron=* * * * *\n[Exec]\nAct=/bin/true\n";
        assert_int_equal(config_parse_schedule("n", "/n.conf", text, strlen(text), &s, &errs), 0);
        assert_false(config_schedule_has_limits(&s));
        config_schedule_clear(&s);

        text = "[Schedule]\nCron=* * * * *\n[Exec]\nMemoryMax=20 MB\nTasksMax=0\n"
               "CPUQuota=50\n";
        assert_int_equal(config_parse_schedule("n", "/n.conf", text, strlen(text), &s, &errs),
                         -EINVAL);
        assert_int_equal(errs.n, 3);
        assert_non_null(strstr(errs.msgs[0], "/n.conf:4: MemoryMax=: \"20 MB\" is not valid"));
        assert_non_null(strstr(errs.msgs[1], "/n.conf:5: TasksMax=: \"0\" is not valid"));
        assert_non_null(strstr(errs.msgs[2], "/n.conf:6: CPUQuota=: \"50\" is not valid "
                                             "(expected a percentage such as 50% or 200%)"));
        config_errors_free(&errs);
}

/* Effects=, EffectsVia=, Probe=, ProbeTimeoutSec=: what recovery may use as
 * evidence (defaults: act changes the world, nothing promised, 30 s). */
static void load_one_schedule(const char *text, struct config **c)
{
        struct config_errors errs = { 0 };
        put("kairosd.conf", "");
        put("schedules.d/x.conf", text);
        assert_int_equal(config_load(rooted("kairosd.conf"), NULL, c, &errs), 0);
        assert_int_equal(errs.n, 0);
        assert_int_equal((*c)->nschedules, 1);
}

static void test_effects_keys(void **state)
{
        (void)state;
        struct config *c = NULL;
        load_one_schedule("[Schedule]\nCron=@daily\n", &c);
        assert_int_equal(c->schedules[0].effects, 1u << 3);
        assert_int_equal(c->schedules[0].effects_via, EFFECTS_VIA_NONE);
        assert_int_equal(c->schedules[0].probe_timeout_sec, 30);
        assert_null(c->schedules[0].probe);
        config_free(c);

        load_one_schedule("[Schedule]\nCron=@daily\n[Exec]\nEffects=decide  act\treflect\n"
                          "EffectsVia=kairosctl\nProbe=/bin/probe -x\nProbeTimeoutSec=2min\n",
                          &c);
        assert_int_equal(c->schedules[0].effects, (1u << 2) | (1u << 3) | (1u << 4));
        assert_int_equal(c->schedules[0].effects_via, EFFECTS_VIA_KAIROSCTL);
        assert_string_equal(c->schedules[0].probe, "/bin/probe -x");
        assert_int_equal(c->schedules[0].probe_timeout_sec, 120);
        config_free(c);

        /* empty: no phase changes the world; a later line replaces */
        load_one_schedule("[Schedule]\nCron=@daily\n[Exec]\nEffects=act\nEffects=\n", &c);
        assert_int_equal(c->schedules[0].effects, 0);
        config_free(c);
        assert_string_equal(config_phase_name(0), "observe");
        assert_string_equal(config_phase_name(4), "reflect");
        assert_null(config_phase_name(5));
        assert_null(config_phase_name(-1));
}

static void test_err_effects_keys(void **state)
{
        (void)state;
        expect_schedule_error("[Schedule]\nCron=@daily\n[Exec]\nEffects=act deploy\n",
                              "/schedules.d/x.conf:4: Effects=: \"deploy\" is not a phase "
                              "(observe orient decide act reflect)");
        expect_schedule_error("[Schedule]\nCron=@daily\n[Exec]\nEffects=Act\n",
                              "/schedules.d/x.conf:4: Effects=: \"Act\" is not a phase "
                              "(observe orient decide act reflect)");
        expect_schedule_error("[Schedule]\nCron=@daily\n[Exec]\nEffects=act act\n",
                              "/schedules.d/x.conf:4: Effects=: act is listed twice");
        expect_schedule_error("[Schedule]\nCron=@daily\n[Exec]\nEffectsVia=tools\n",
                              "/schedules.d/x.conf:4: EffectsVia=: \"tools\" is not one of: "
                              "none, kairosctl");
        expect_schedule_error("[Schedule]\nCron=@daily\n[Exec]\nProbeTimeoutSec=0\n",
                              "/schedules.d/x.conf:4: ProbeTimeoutSec=: 0 out of range "
                              "1..3153600000 seconds");
        expect_schedule_error("[Schedule]\nCron=@daily\n[Mandate]\nEffects=act\n",
                              "/schedules.d/x.conf:4: Effects=: unknown key in [Mandate]");
}

/* ---- [Cluster] ----------------------------------------------------------- */

#define SECRET "s3cr3t-pw"
#define CONNINFO "host=db.example user=kairos password=" SECRET " dbname=kairos"

/* kairosd.conf and (if not NULL) the drop-in kairosd.conf.d/50-cluster.conf;
 * any other drop-in removed. */
static void put_cluster(const char *main_text, const char *dropin)
{
        put("kairosd.conf", main_text);
        if (unlink(rooted("kairosd.conf.d/50-cluster.conf")) < 0)
                assert_int_equal(errno, ENOENT);
        if (dropin)
                put("kairosd.conf.d/50-cluster.conf", dropin);
}

/* The load fails with exactly want (relative to the temp dir), and no
 * message shows the password of the connection string. */
static void expect_cluster_errors(const char *main_text, const char *dropin,
                                  const char *const *want)
{
        put_cluster(main_text, dropin);
        expect_load_errors(-EINVAL, want);
        struct config *c = NULL;
        struct config_errors errs = { 0 };
        assert_int_equal(config_load(rooted("kairosd.conf"), NULL, &c, &errs), -EINVAL);
        assert_null(c);
        assert_true(errs.n > 0);
        for (size_t i = 0; i < errs.n; i++)
                assert_null(strstr(errs.msgs[i], SECRET));
        config_errors_free(&errs);
}

static struct config *load_cluster(const char *main_text, const char *dropin)
{
        put_cluster(main_text, dropin);
        struct config *c = NULL;
        struct config_errors errs = { 0 };
        int r = config_load(rooted("kairosd.conf"), NULL, &c, &errs);
        for (size_t i = 0; i < errs.n; i++)
                print_message("unexpected: %s\n", errs.msgs[i]);
        assert_int_equal(r, 0);
        assert_int_equal(errs.n, 0);
        assert_non_null(c);
        return c;
}

static void test_cluster_defaults(void **state)
{
        (void)state;
        /* no [Cluster], an empty one, Backend=files: the file backend */
        static const char *const texts[] = { "", "[Cluster]\n", "[Cluster]\nBackend=files\n" };
        for (size_t i = 0; i < 3; i++) {
                struct config *c = load_cluster(texts[i], NULL);
                assert_int_equal(c->backend, CONFIG_BACKEND_FILES);
                assert_null(c->cluster_conninfo);
                assert_null(c->node_name);
                assert_int_equal(c->lease_sec, 10);
                config_free(c);
        }
        /* the keys reset by an empty value are not set: fine with files */
        struct config *c = load_cluster("[Cluster]\nConnectionString=" CONNINFO "\n"
                                        "NodeName=a\n",
                                        "[Cluster]\nConnectionString=\nNodeName=\n");
        assert_int_equal(c->backend, CONFIG_BACKEND_FILES);
        assert_null(c->cluster_conninfo);
        assert_null(c->node_name);
        config_free(c);
        /* the built-in configuration */
        assert_int_equal(config_builtin("/tmp/kb", &c), 0);
        assert_int_equal(c->backend, CONFIG_BACKEND_FILES);
        assert_null(c->cluster_conninfo);
        assert_null(c->node_name);
        assert_int_equal(c->lease_sec, 10);
        config_free(c);
}

static void test_err_cluster_keys_with_files(void **state)
{
        (void)state;
        expect_cluster_errors("[Cluster]\nConnectionString=" CONNINFO "\n", NULL,
                              (const char *const[]){
                                      "/kairosd.conf:2: ConnectionString=: only valid with "
                                      "Backend=postgres (the backend is files)",
                                      NULL });
        expect_cluster_errors("[Cluster]\nBackend=files\nNodeName=n1\n", NULL,
                              (const char *const[]){
                                      "/kairosd.conf:3: NodeName=: only valid with "
                                      "Backend=postgres (the backend is files)",
                                      NULL });
        /* even the default value */
        expect_cluster_errors("[Cluster]\nLeaseSec=10\n", NULL,
                              (const char *const[]){
                                      "/kairosd.conf:2: LeaseSec=: only valid with "
                                      "Backend=postgres (the backend is files)",
                                      NULL });
        /* a drop-in sets Backend=files over the main file's postgres: each key
         * is named where it was set last (in key order) */
        expect_cluster_errors("[Daemon]\nLogLevel=info\n[Cluster]\nBackend=postgres\n"
                              "LeaseSec=20\nConnectionString=" CONNINFO "\n",
                              "[Cluster]\nBackend=files\nLeaseSec=30\nNodeName=n1\n",
                              (const char *const[]){
                                      "/kairosd.conf:6: ConnectionString=: only valid with "
                                      "Backend=postgres (the backend is files)",
                                      "/kairosd.conf.d/50-cluster.conf:4: NodeName=: only "
                                      "valid with Backend=postgres (the backend is files)",
                                      "/kairosd.conf.d/50-cluster.conf:3: LeaseSec=: only "
                                      "valid with Backend=postgres (the backend is files)",
                                      NULL });
        /* a bad value is reported once, as a bad value */
        expect_cluster_errors("[Cluster]\nLeaseSec=1\n", NULL,
                              (const char *const[]){
                                      "/kairosd.conf:2: LeaseSec=: 1 out of range 3..300 "
                                      "seconds",
                                      NULL });
}

static void test_err_cluster_values(void **state)
{
        (void)state;
        expect_main_error("[Cluster]\nBackend=mysql\n",
                          "/kairosd.conf:2: Backend=: \"mysql\" is not one of: files, postgres");
        expect_main_error("[Cluster]\nBackend=\n",
                          "/kairosd.conf:2: Backend=: empty value (a value is required)");
        expect_main_error("[Cluster]\nBackend=Postgres\n",
                          "/kairosd.conf:2: Backend=: \"Postgres\" is not one of: files, "
                          "postgres");
        expect_main_error("[Cluster]\nLeaseSec=2\n",
                          "/kairosd.conf:2: LeaseSec=: 2 out of range 3..300 seconds");
        expect_main_error("[Cluster]\nLeaseSec=301\n",
                          "/kairosd.conf:2: LeaseSec=: 301 out of range 3..300 seconds");
        expect_main_error("[Cluster]\nLeaseSec=5min 1s\n",
                          "/kairosd.conf:2: LeaseSec=: 5min 1s out of range 3..300 seconds");
        expect_main_error("[Cluster]\nLeaseSec=99999999999999999999\n",
                          "/kairosd.conf:2: LeaseSec=: 99999999999999999999 out of range "
                          "3..300 seconds");
        expect_main_error("[Cluster]\nLeaseSec=10x\n",
                          "/kairosd.conf:2: LeaseSec=: \"10x\" is not a valid duration "
                          "(e.g. 30, 30s, 5min, 2h, 1d, 1h30min)");
        expect_main_error("[Cluster]\nLeaseSec=\n",
                          "/kairosd.conf:2: LeaseSec=: empty value (a value is required)");
        expect_main_error("[Cluster]\nNodeName=node 1\n",
                          "/kairosd.conf:2: NodeName=: \"node 1\" is not a valid node name "
                          "(1 to 63 of A-Z a-z 0-9 . _ -)");
        expect_main_error("[Cluster]\nNodeName=n\xc3\xa9ud\n",
                          "/kairosd.conf:2: NodeName=: \"n\xc3\xa9ud\" is not a valid node "
                          "name (1 to 63 of A-Z a-z 0-9 . _ -)");
        expect_main_error("[Cluster]\nNodeName=a/b\n",
                          "/kairosd.conf:2: NodeName=: \"a/b\" is not a valid node name "
                          "(1 to 63 of A-Z a-z 0-9 . _ -)");
        char text[256];
        XSNPRINTF(text, "[Cluster]\nNodeName=%s\n",
                  "a234567890123456789012345678901234567890123456789012345678901234");
        expect_main_error(text, "/kairosd.conf:2: NodeName=: too long (64 characters; a node "
                          "name is 1 to 63 of A-Z a-z 0-9 . _ -)");
        expect_main_error("[Cluster]\nNodes=3\n", "/kairosd.conf:2: Nodes=: unknown key in "
                          "[Cluster]");
        /* an unknown "key" that is no key name is not shown either: a URI
         * alone on its line would show its password */
        expect_cluster_errors("[Cluster]\nBackend=files\n"
                              "postgresql://k:" SECRET "@db/k?sslmode=require\n", NULL,
                              (const char *const[]){
                                      "/kairosd.conf:3: not a key of [Cluster] (the line is "
                                      "not shown: [Cluster] may hold a password)",
                                      NULL });
        expect_main_error("[Daemon]\na b=1\n", "/kairosd.conf:2: a b=: unknown key in "
                          "[Daemon]");
        expect_main_error("[Cluster]\nBackend=files\n[Cluster]\n",
                          "/kairosd.conf:3: duplicate section [Cluster] (first at line 1)");
        /* a line without '=' in [Cluster] is not shown: it may be a
         * connection string URI with its password */
        expect_cluster_errors("[Cluster]\nConnectionString postgresql://k:" SECRET "@db/k\n",
                              NULL,
                              (const char *const[]){
                                      "/kairosd.conf:2: missing '=' (expected Key=Value or "
                                      "[Section]; the line is not shown: [Cluster] may hold a "
                                      "password)",
                                      NULL });
}

#ifdef KAIROS_HAVE_POSTGRES
static void test_cluster_postgres(void **state)
{
        (void)state;
        struct config *c = load_cluster("[Cluster]\nBackend=postgres\n"
                                        "ConnectionString=" CONNINFO "\n"
                                        "NodeName=node-1.dc_2\nLeaseSec=1min\n", NULL);
        assert_int_equal(c->backend, CONFIG_BACKEND_POSTGRES);
        assert_string_equal(c->cluster_conninfo, CONNINFO);
        assert_string_equal(c->node_name, "node-1.dc_2");
        assert_int_equal(c->lease_sec, 60);
        config_free(c);

        /* the bounds; NodeName= of 1 and 63 characters */
        c = load_cluster("[Cluster]\nBackend=postgres\nConnectionString=postgresql:///k\n"
                         "LeaseSec=3\nNodeName=x\n", NULL);
        assert_int_equal(c->lease_sec, 3);
        assert_string_equal(c->node_name, "x");
        config_free(c);
        static const char n63[] =
                "a23456789012345678901234567890123456789012345678901234567890123";
        c = load_cluster("[Cluster]\nBackend=postgres\nConnectionString=postgresql:///k\n"
                         "LeaseSec=5min\nNodeName=a23456789012345678901234567890123456789012"
                         "345678901234567890123\n", NULL);
        assert_int_equal(c->lease_sec, 300);
        assert_string_equal(c->node_name, n63);
        config_free(c);

        /* the defaults: the host name (read at load time), 10 s */
        char host[256] = "";
        assert_int_equal(gethostname(host, sizeof(host) - 1), 0);
        c = load_cluster("[Cluster]\nBackend=postgres\nConnectionString=" CONNINFO "\n", NULL);
        assert_string_equal(c->node_name, host);
        assert_int_equal(c->lease_sec, 10);
        config_free(c);
        /* an empty NodeName= is the default again */
        c = load_cluster("[Cluster]\nBackend=postgres\nConnectionString=" CONNINFO "\n"
                         "NodeName=n1\n", "[Cluster]\nNodeName=\n");
        assert_string_equal(c->node_name, host);
        config_free(c);

        /* a drop-in sets Backend=postgres for the main file's keys */
        c = load_cluster("[Cluster]\nConnectionString=" CONNINFO "\nNodeName=n2\nLeaseSec=30\n",
                         "[Cluster]\nBackend=postgres\n");
        assert_int_equal(c->backend, CONFIG_BACKEND_POSTGRES);
        assert_string_equal(c->node_name, "n2");
        assert_int_equal(c->lease_sec, 30);
        config_free(c);

        /* config_parse_main checks the same */
        c = NULL;
        static const char t[] = "[Cluster]\nBackend=postgres\nConnectionString=x\n";
        assert_int_equal(config_parse_main("/k.conf", t, strlen(t), &c, NULL), 0);
        assert_string_equal(c->node_name, host);
        config_free(c);
}

static void test_err_cluster_postgres(void **state)
{
        (void)state;
        expect_cluster_errors("[Cluster]\nBackend=postgres\nNodeName=n1\n", NULL,
                              (const char *const[]){
                                      "/kairosd.conf:2: Backend=: postgres needs "
                                      "ConnectionString= (a libpq connection string or URI) "
                                      "in [Cluster]",
                                      NULL });
        /* reset by a drop-in: missing; named where Backend= was set last */
        expect_cluster_errors("[Cluster]\nBackend=postgres\nConnectionString=" CONNINFO "\n",
                              "[Cluster]\nConnectionString=\nBackend=postgres\n",
                              (const char *const[]){
                                      "/kairosd.conf.d/50-cluster.conf:3: Backend=: postgres "
                                      "needs ConnectionString= (a libpq connection string or "
                                      "URI) in [Cluster]",
                                      NULL });
        struct config *c = NULL;
        struct config_errors errs = { 0 };
        static const char t[] = "[Cluster]\nBackend=postgres\n";
        assert_int_equal(config_parse_main("/k.conf", t, strlen(t), &c, &errs), -EINVAL);
        assert_null(c);
        assert_int_equal(errs.n, 1);
        assert_string_equal(errs.msgs[0], "/k.conf:2: Backend=: postgres needs "
                            "ConnectionString= (a libpq connection string or URI) in "
                            "[Cluster]");
        config_errors_free(&errs);
}
#else
static void test_err_cluster_not_built(void **state)
{
        (void)state;
        expect_cluster_errors("[Cluster]\nBackend=postgres\nConnectionString=" CONNINFO "\n"
                              "NodeName=n1\nLeaseSec=20\n", NULL,
                              (const char *const[]){
                                      "/kairosd.conf:2: Backend=: kairosd was built without "
                                      "PostgreSQL support (-Dpostgres=enabled)",
                                      NULL });
        /* named in the drop-in that sets it; every error reported */
        expect_cluster_errors("[Cluster]\nNodeName=n1\n",
                              "[Daemon]\nLogLevel=info\n[Cluster]\nBackend=postgres\n",
                              (const char *const[]){
                                      "/kairosd.conf.d/50-cluster.conf:4: Backend=: kairosd "
                                      "was built without PostgreSQL support "
                                      "(-Dpostgres=enabled)",
                                      "/kairosd.conf.d/50-cluster.conf:4: Backend=: postgres "
                                      "needs ConnectionString= (a libpq connection string or "
                                      "URI) in [Cluster]",
                                      NULL });
        struct config *c = NULL;
        struct config_errors errs = { 0 };
        static const char t[] = "[Cluster]\nBackend=postgres\nConnectionString=x\n";
        assert_int_equal(config_parse_main("/k.conf", t, strlen(t), &c, &errs), -EINVAL);
        assert_null(c);
        assert_int_equal(errs.n, 1);
        assert_string_equal(errs.msgs[0], "/k.conf:2: Backend=: kairosd was built without "
                            "PostgreSQL support (-Dpostgres=enabled)");
        config_errors_free(&errs);
}
#endif

/* A reload keeps the running [Cluster] values and names the changed keys. */
static void test_keep_cluster(void **state)
{
        (void)state;
        struct config *old = NULL, *neu = NULL;
        assert_int_equal(config_parse_main("/k.conf", "", 0, &old, NULL), 0);
        assert_int_equal(config_parse_main("/k.conf", "", 0, &neu, NULL), 0);
        char keys[128] = "junk";
        assert_int_equal(config_keep_cluster(neu, old, keys, sizeof(keys)), 0);
        assert_string_equal(keys, "");

        /* the running one is postgres (set by hand: the parser may not
         * accept it in this build), the new one files */
        old->backend = CONFIG_BACKEND_POSTGRES;
        old->cluster_conninfo = strdup(CONNINFO);
        old->node_name = strdup("n1");
        old->lease_sec = 20;
        assert_non_null(old->cluster_conninfo);
        assert_non_null(old->node_name);
        assert_int_equal(config_keep_cluster(neu, old, keys, sizeof(keys)), 4);
        assert_string_equal(keys, "Backend=, ConnectionString=, NodeName=, LeaseSec=");
        assert_int_equal(neu->backend, CONFIG_BACKEND_POSTGRES);
        assert_string_equal(neu->cluster_conninfo, CONNINFO);
        assert_string_equal(neu->node_name, "n1");
        assert_int_equal(neu->lease_sec, 20);
        assert_null(old->cluster_conninfo); /* swapped: each frees its own */
        assert_null(old->node_name);
        config_free(old);

        /* only NodeName= and LeaseSec= differ */
        assert_int_equal(config_parse_main("/k.conf", "", 0, &old, NULL), 0);
        old->backend = CONFIG_BACKEND_POSTGRES;
        old->cluster_conninfo = strdup(CONNINFO);
        old->node_name = strdup("n2");
        assert_non_null(old->cluster_conninfo);
        assert_non_null(old->node_name);
        assert_int_equal(config_keep_cluster(neu, old, keys, sizeof(keys)), 2);
        assert_string_equal(keys, "NodeName=, LeaseSec=");
        assert_string_equal(neu->node_name, "n2");
        assert_int_equal(neu->lease_sec, 10);
        assert_string_equal(old->node_name, "n1");
        /* nothing changed; a short buffer is truncated */
        assert_int_equal(config_keep_cluster(neu, neu, keys, sizeof(keys)), 0);
        assert_string_equal(keys, "");
        old->lease_sec = 11;
        char small[8];
        assert_int_equal(config_keep_cluster(neu, old, small, sizeof(small)), 2);
        assert_string_equal(small, "NodeNam");
        assert_string_equal(neu->node_name, "n1");
        assert_int_equal(neu->lease_sec, 11);
        /* old now holds what neu had: NodeName= differs, LeaseSec= not */
        assert_int_equal(config_keep_cluster(neu, old, NULL, 0), 1);
        assert_int_equal(config_keep_cluster(NULL, old, NULL, 0), -EINVAL);
        assert_int_equal(config_keep_cluster(neu, old, NULL, 1), -EINVAL);
        config_free(old);
        config_free(neu);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup_root, teardown_root)

int main(void)
{
        const struct CMUnitTest tests[] = {
                T(test_full_valid_set),
                T(test_limit_values),
                T(test_limit_keys),
                T(test_defaults_and_state_dir),
                T(test_schedules_sorted_by_name),
                T(test_lists_reset_and_last_wins),
                T(test_parse_schedule_errors_without_list),
                T(test_parse_main_text),
                T(test_bool_words),
                T(test_log_levels),
                T(test_err_unknown_section),
                T(test_err_malformed_section),
                T(test_err_unknown_key),
                T(test_err_key_outside_section),
                T(test_err_line_without_equals),
                T(test_err_duplicate_section),
                T(test_err_duplicate_section_is_per_file),
                T(test_err_bad_bool),
                T(test_err_bad_number),
                T(test_err_number_out_of_range),
                T(test_err_bad_duration),
                T(test_err_bad_enum),
                T(test_err_relative_path),
                T(test_err_empty_required_value),
                T(test_err_missing_cron),
                T(test_err_invalid_schedule_name),
                T(test_valid_schedule_name),
                T(test_err_bad_cron),
                T(test_err_unknown_time_zone),
                T(test_err_unreadable_file),
                T(test_dev_null_masks_a_file),
                T(test_err_bad_command_line),
                T(test_err_bad_environment),
                T(test_err_socket_path_too_long),
                T(test_err_control_character),
                T(test_continuation_line_numbers),
                T(test_errors_collected_across_files),
                T(test_durations),
                T(test_builtin),
                T(test_notify),
                T(test_phase_keys),
                T(test_split_command),
                T(test_expand_command),
                cmocka_unit_test_setup_teardown(test_command_vars, setup_root, teardown_root),
                cmocka_unit_test_setup_teardown(test_broken_schedule_skipped, setup_root,
                                                teardown_root),
                cmocka_unit_test_setup_teardown(test_retain_broken, setup_root, teardown_root),
                cmocka_unit_test(test_retry_policy),
                cmocka_unit_test(test_warn_eaten_json_quotes),
                cmocka_unit_test(test_warn_tool_run_attempt_args),
                T(test_effects_keys),
                T(test_err_effects_keys),
                T(test_cluster_defaults),
                T(test_err_cluster_keys_with_files),
                T(test_err_cluster_values),
#ifdef KAIROS_HAVE_POSTGRES
                T(test_cluster_postgres),
                T(test_err_cluster_postgres),
#else
                T(test_err_cluster_not_built),
#endif
                T(test_keep_cluster),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
