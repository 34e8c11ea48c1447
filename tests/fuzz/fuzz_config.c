/* SPDX-License-Identifier: MIT */
/* Fuzz target for the configuration parser: the input is parsed both as a
 * schedule file (config_parse_schedule) and as a main file
 * (config_parse_main).  Invariants (any violation aborts):
 *   - the result is 0, -EINVAL or -ENOMEM; -EINVAL comes with at least one
 *     message and leaves nothing behind, 0 with none;
 *   - every message is "PATH:LINE: …" with LINE within the input, or
 *     "PATH: …" (file-level);
 *   - the parse is deterministic (the same messages), and the same without
 *     an error list;
 *   - a parsed configuration satisfies every documented constraint (ranges,
 *     absolute paths, valid cron and zone, splittable commands, unique
 *     environment names and write roots, NULL-terminated lists, [Cluster]
 *     keys only with Backend=postgres, which has them all);
 *   - written back as a canonical file (one Key=Value per field), it parses
 *     again, without error, to the same configuration. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#include "kairos/config.h"
#include "kairos/cron.h"
#include "kairos/kbuf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                           \
        do {                                                                                  \
                if (!(cond)) {                                                                \
                        fprintf(stderr, "fuzz_config: invariant violated: %s (line %d)\n",    \
                                #cond, __LINE__);                                             \
                        abort();                                                              \
                }                                                                             \
        } while (0)

#define SCHED_NAME "fz-1"
#define SCHED_PATH "/etc/kairos/schedules.d/fz-1.conf"
#define MAIN_PATH "/etc/kairos/kairosd.conf"

static const char *const missed_words[] = { "skip", "catch_up_once", "catch_up_bounded" };
static const char *const concurrency_words[] = { "queue", "allow", "reject" };
static const char *const log_levels[] = {
        "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug",
};

static bool same_str(const char *a, const char *b)
{
        return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

static size_t count_lines(const char *s, size_t n)
{
        size_t lines = 1;
        for (size_t i = 0; i < n; i++)
                lines += s[i] == '\n';
        return lines;
}

static void check_messages(const struct config_errors *e, const char *path, size_t nlines)
{
        size_t pl = strlen(path);
        for (size_t i = 0; i < e->n; i++) {
                const char *m = e->msgs[i];
                CHECK(m && strncmp(m, path, pl) == 0 && m[pl] == ':');
                const char *p = m + pl + 1;
                if (*p == ' ') {
                        CHECK(p[1] != '\0');
                        continue;
                }
                char *end;
                unsigned long line = strtoul(p, &end, 10);
                CHECK(end != p && *end == ':' && end[1] == ' ' && end[2] != '\0');
                CHECK(line >= 1 && line <= nlines);
        }
}

static void check_same_errors(const struct config_errors *a, const struct config_errors *b)
{
        CHECK(a->n == b->n);
        for (size_t i = 0; i < a->n; i++)
                CHECK(strcmp(a->msgs[i], b->msgs[i]) == 0);
}

static bool abs_path_ok(const char *p)
{
        if (!p || p[0] != '/')
                return false;
        for (const char *s = p; (s = strstr(s, "..")); s += 2)
                if (s[-1] == '/' && (s[2] == '/' || s[2] == '\0'))
                        return false;
        return true;
}

static void check_command(const char *cmd)
{
        char **argv;
        size_t argc;
        int r = config_split_command(cmd, &argv, &argc);
        if (r == -ENOMEM)
                return;
        CHECK(r == 0 && argc >= 1 && argv[0][0] != '\0' && !argv[argc]);
        config_strv_free(argv);
}

/* A loaded command line names only variables its kind may use, and expands
 * from any environment (here: its names with their own names as values). */
static void check_command_vars(const char *cmd, enum config_command_kind kind, char **environment)
{
        int r = config_check_command_vars(cmd, kind, environment, NULL, 0);
        CHECK(r == 0 || r == -ENOMEM);
        char **argv;
        size_t argc;
        r = config_expand_command(cmd, environment, &argv, &argc, NULL, 0);
        if (r == -ENOMEM)
                return;
        CHECK(r == 0 && !argv[argc]);
        config_strv_free(argv);
}

/* Only what a parser can put there: no control characters, no blank at
 * either end, no trailing backslash (it would continue the line). */
static void check_value(const char *v)
{
        size_t n = strlen(v);
        CHECK(n > 0 && v[0] != ' ' && v[0] != '\t' && v[n - 1] != ' ' && v[n - 1] != '\t');
        CHECK(v[n - 1] != '\\');
        for (size_t i = 0; i < n; i++)
                CHECK((unsigned char)v[i] >= 0x20 ? v[i] != 0x7f : v[i] == '\t');
}

static void check_list(char **v, size_t n)
{
        if (n == 0) {
                CHECK(!v);
                return;
        }
        CHECK(v && !v[n]);
        for (size_t i = 0; i < n; i++)
                CHECK(v[i]);
}

static void check_schedule(const struct config_schedule *s)
{
        CHECK(strcmp(s->name, SCHED_NAME) == 0 && strcmp(s->path, SCHED_PATH) == 0);
        CHECK(s->cron && s->time_zone && s->goal);
        check_value(s->cron);
        struct cron_expr e;
        CHECK(cron_parse(s->cron, &e, NULL, 0) == 0);
        int64_t next;
        int r = cron_next(&e, NULL, 0, &next);
        CHECK(r == 0 && next > 0);
        struct cron_tz *tz = NULL;
        r = cron_tz_load(s->time_zone, &tz);
        CHECK(r == 0 || r == -ENOMEM);
        cron_tz_free(tz);
        CHECK((unsigned)s->missed_policy <= MISSED_CATCH_UP_BOUNDED);
        CHECK((unsigned)s->concurrency <= CONCURRENCY_REJECT);
        CHECK(s->max_catch_up_runs >= 1 && s->max_catch_up_runs <= 1000);
        CHECK(s->stale_after_sec <= CONFIG_DURATION_MAX);
        CHECK(s->max_cycles >= 1 && s->max_cycles <= 10);
        CHECK(s->missed_grace_sec <= 3600);
        CHECK(!s->retained);
        for (size_t i = 0; i < s->warnings.n; i++)
                CHECK(strncmp(s->warnings.msgs[i], SCHED_PATH ":", strlen(SCHED_PATH) + 1) == 0);
        CHECK(s->timeout_sec >= 1 && s->timeout_sec <= CONFIG_DURATION_MAX);
        check_value(s->goal);
        for (int i = 0; i < CONFIG_PHASES; i++) {
                if (s->exec[i]) {
                        check_value(s->exec[i]);
                        check_command(s->exec[i]);
                        check_command_vars(s->exec[i], CONFIG_COMMAND_HANDLER, s->environment);
                }
        }
        if (s->probe) {
                check_value(s->probe);
                check_command(s->probe);
                check_command_vars(s->probe, CONFIG_COMMAND_PROBE, s->environment);
        }
        if (s->on_review && *s->on_review)
                check_command_vars(s->on_review, CONFIG_COMMAND_HOOK, NULL);
        if (s->on_failure && *s->on_failure)
                check_command_vars(s->on_failure, CONFIG_COMMAND_HOOK, NULL);
        if (s->working_directory) {
                check_value(s->working_directory);
                CHECK(abs_path_ok(s->working_directory));
        }
        check_list(s->environment, s->nenvironment);
        for (size_t i = 0; i < s->nenvironment; i++) {
                const char *v = s->environment[i];
                const char *eq = strchr(v, '=');
                CHECK(eq && eq > v && !(v[0] >= '0' && v[0] <= '9'));
                CHECK(strncmp(v, "KAIROS_", 7) != 0 || eq - v < 7);
                for (const char *p = v; p < eq; p++)
                        CHECK((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                              (*p >= '0' && *p <= '9') || *p == '_');
                for (size_t j = 0; j < i; j++)
                        CHECK(strncmp(s->environment[j], v, (size_t)(eq - v) + 1) != 0);
        }
}

static void check_same_schedule(const struct config_schedule *a, const struct config_schedule *b)
{
        CHECK(same_str(a->name, b->name) && same_str(a->cron, b->cron));
        CHECK(same_str(a->time_zone, b->time_zone) && a->enabled == b->enabled);
        CHECK(a->missed_policy == b->missed_policy && a->concurrency == b->concurrency);
        CHECK(a->max_catch_up_runs == b->max_catch_up_runs);
        CHECK(a->stale_after_sec == b->stale_after_sec);
        CHECK(same_str(a->goal, b->goal) && a->max_cycles == b->max_cycles);
        CHECK(a->missed_grace_sec == b->missed_grace_sec);
        for (int i = 0; i < CONFIG_PHASES; i++)
                CHECK(same_str(a->exec[i], b->exec[i]));
        CHECK(a->timeout_sec == b->timeout_sec && a->nenvironment == b->nenvironment);
        for (size_t i = 0; i < a->nenvironment; i++)
                CHECK(strcmp(a->environment[i], b->environment[i]) == 0);
        CHECK(same_str(a->working_directory, b->working_directory));
        CHECK(same_str(a->probe, b->probe));
}

/* The schedule as a canonical file. */
static int write_schedule(const struct config_schedule *s, struct kbuf *b)
{
        int r = kbuf_printf(b, "[Schedule]\nCron=%s\nTimeZone=%s\nEnabled=%s\n"
                            "MissedPolicy=%s\nMaxCatchUpRuns=%u\nStaleAfter=%llu\n"
                            "MissedGraceSec=%llu\nConcurrency=%s\n[Mandate]\nGoal=%s\n"
                            "MaxCycles=%u\n[Exec]\nTimeoutSec=%llu\n",
                            s->cron, s->time_zone, s->enabled ? "yes" : "no",
                            missed_words[s->missed_policy], s->max_catch_up_runs,
                            (unsigned long long)s->stale_after_sec,
                            (unsigned long long)s->missed_grace_sec,
                            concurrency_words[s->concurrency], s->goal, s->max_cycles,
                            (unsigned long long)s->timeout_sec);
        for (int i = 0; r >= 0 && i < CONFIG_PHASES; i++)
                if (s->exec[i])
                        r = kbuf_printf(b, "%s=%s\n", config_phase_key(i), s->exec[i]);
        for (size_t i = 0; r >= 0 && i < s->nenvironment; i++) {
                /* one quoted word per line, escaped as the splitter reads it */
                r = kbuf_puts(b, "Environment=\"");
                for (const char *c = s->environment[i]; r >= 0 && *c; c++) {
                        switch (*c) {
                        case '\\': r = kbuf_puts(b, "\\\\"); break;
                        case '"': r = kbuf_puts(b, "\\\""); break;
                        case '\n': r = kbuf_puts(b, "\\n"); break;
                        case '\t': r = kbuf_puts(b, "\\t"); break;
                        case '\r': r = kbuf_puts(b, "\\r"); break;
                        default: r = kbuf_putc(b, *c); break;
                        }
                }
                if (r >= 0)
                        r = kbuf_puts(b, "\"\n");
        }
        if (r >= 0 && s->working_directory)
                r = kbuf_printf(b, "WorkingDirectory=%s\n", s->working_directory);
        if (r >= 0 && s->probe)
                r = kbuf_printf(b, "Probe=%s\n", s->probe);
        return r < 0 ? r : 0;
}

static void fuzz_schedule(const char *text, size_t size)
{
        struct config_schedule s, again, none;
        struct config_errors e = { 0 }, e2 = { 0 };
        size_t nlines = count_lines(text, size);

        memset(&s, 0x5a, sizeof(s));
        int r = config_parse_schedule(SCHED_NAME, SCHED_PATH, text, size, &s, &e);
        CHECK(r == 0 || r == -EINVAL || r == -ENOMEM);
        if (r == -ENOMEM)
                goto out;
        check_messages(&e, SCHED_PATH, nlines);
        memset(&again, 0x5a, sizeof(again));
        int r2 = config_parse_schedule(SCHED_NAME, SCHED_PATH, text, size, &again, &e2);
        if (r2 != -ENOMEM) {
                CHECK(r2 == r);
                check_same_errors(&e, &e2);
                if (r == 0)
                        check_same_schedule(&s, &again);
                config_schedule_clear(&again);
        }
        memset(&none, 0x5a, sizeof(none));
        r2 = config_parse_schedule(SCHED_NAME, SCHED_PATH, text, size, &none, NULL);
        CHECK(r2 == r || r2 == -ENOMEM);
        config_schedule_clear(&none);
        if (r < 0) {
                CHECK(e.n >= 1);
                CHECK(!s.name && !s.cron && !s.environment && !s.goal);
                goto out;
        }
        CHECK(e.n == 0);
        check_schedule(&s);

        struct kbuf b = KBUF_INIT;
        if (write_schedule(&s, &b) == 0) {
                struct config_schedule back;
                struct config_errors e3 = { 0 };
                r2 = config_parse_schedule(SCHED_NAME, SCHED_PATH, b.data, b.len, &back, &e3);
                if (r2 != -ENOMEM) {
                        if (r2 != 0)
                                fprintf(stderr, "re-parse: %s\n", e3.n ? e3.msgs[0] : "?");
                        CHECK(r2 == 0);
                        check_same_schedule(&s, &back);
                        config_schedule_clear(&back);
                }
                config_errors_free(&e3);
        }
        kbuf_free(&b);
        config_schedule_clear(&s);
out:
        config_errors_free(&e);
        config_errors_free(&e2);
}

static void check_main(const struct config *c)
{
        CHECK(same_str(c->config_path, MAIN_PATH) && !c->schedules_dir);
        CHECK(!c->schedules && c->nschedules == 0);
        CHECK(abs_path_ok(c->state_directory) && abs_path_ok(c->control_socket));
        check_value(c->state_directory);
        check_value(c->control_socket);
        CHECK(strlen(c->control_socket) < sizeof(((struct sockaddr_un *)0)->sun_path));
        CHECK(c->socket_group);
        check_value(c->socket_group);
        CHECK(c->max_concurrent_mandates >= 1 && c->max_concurrent_mandates <= 1024);
        CHECK(c->graceful_timeout_sec <= CONFIG_DURATION_MAX);
        CHECK(c->log_level >= 0 && c->log_level <= 7);
        CHECK(c->idem_ttl_sec >= 1 && c->idem_ttl_sec <= CONFIG_DURATION_MAX);
        CHECK(c->idem_max_entries >= 1 && c->idem_max_entries <= 10000000);
        /* [Cluster]: the other keys only with postgres, which has them all */
        CHECK(c->backend == CONFIG_BACKEND_FILES || c->backend == CONFIG_BACKEND_POSTGRES);
        if (c->backend == CONFIG_BACKEND_FILES) {
                CHECK(!c->cluster_conninfo && !c->node_name && c->lease_sec == 10);
        } else {
                CHECK(c->cluster_conninfo && c->node_name);
                check_value(c->cluster_conninfo);
                size_t n = strlen(c->node_name);
                CHECK(n >= 1 && n <= 63 &&
                      strspn(c->node_name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                             "0123456789._-") == n);
                CHECK(c->lease_sec >= 3 && c->lease_sec <= 300);
        }
        check_list(c->write_roots, c->nwrite_roots);
        for (size_t i = 0; i < c->nwrite_roots; i++) {
                CHECK(abs_path_ok(c->write_roots[i]));
                CHECK(!strpbrk(c->write_roots[i], " \t"));
                check_value(c->write_roots[i]);
                for (size_t j = 0; j < i; j++)
                        CHECK(strcmp(c->write_roots[i], c->write_roots[j]) != 0);
        }
}

static void check_same_main(const struct config *a, const struct config *b)
{
        CHECK(same_str(a->state_directory, b->state_directory));
        CHECK(same_str(a->control_socket, b->control_socket));
        CHECK(same_str(a->socket_group, b->socket_group));
        CHECK(a->max_concurrent_mandates == b->max_concurrent_mandates);
        CHECK(a->graceful_timeout_sec == b->graceful_timeout_sec);
        CHECK(a->log_level == b->log_level && a->idem_ttl_sec == b->idem_ttl_sec);
        CHECK(a->idem_max_entries == b->idem_max_entries && a->nwrite_roots == b->nwrite_roots);
        CHECK(a->backend == b->backend && a->lease_sec == b->lease_sec);
        CHECK(same_str(a->cluster_conninfo, b->cluster_conninfo));
        CHECK(same_str(a->node_name, b->node_name));
        for (size_t i = 0; i < a->nwrite_roots; i++)
                CHECK(strcmp(a->write_roots[i], b->write_roots[i]) == 0);
}

static int write_main(const struct config *c, struct kbuf *b)
{
        int r = kbuf_printf(b, "[Daemon]\nStateDirectory=%s\nControlSocket=%s\nSocketGroup=%s\n"
                            "MaxConcurrentMandates=%u\nGracefulTimeoutSec=%llu\nLogLevel=%s\n"
                            "[Idempotency]\nTTLSec=%llu\nMaxEntries=%u\n",
                            c->state_directory, c->control_socket, c->socket_group,
                            c->max_concurrent_mandates,
                            (unsigned long long)c->graceful_timeout_sec,
                            log_levels[c->log_level], (unsigned long long)c->idem_ttl_sec,
                            c->idem_max_entries);
        /* one root per line, or all on one */
        for (size_t i = 0; r >= 0 && i < c->nwrite_roots; i++)
                r = kbuf_printf(b, "WriteRoots=%s\n", c->write_roots[i]);
        if (r >= 0 && c->backend == CONFIG_BACKEND_POSTGRES)
                r = kbuf_printf(b, "[Cluster]\nBackend=postgres\nConnectionString=%s\n"
                                "NodeName=%s\nLeaseSec=%u\n", c->cluster_conninfo,
                                c->node_name, c->lease_sec);
        return r < 0 ? r : 0;
}

static void fuzz_main(const char *text, size_t size)
{
        struct config *c = (struct config *)&c, *again = NULL, *none = NULL;
        struct config_errors e = { 0 }, e2 = { 0 };

        int r = config_parse_main(MAIN_PATH, text, size, &c, &e);
        CHECK(r == 0 || r == -EINVAL || r == -ENOMEM);
        if (r == -ENOMEM)
                goto out;
        check_messages(&e, MAIN_PATH, count_lines(text, size));
        int r2 = config_parse_main(MAIN_PATH, text, size, &again, &e2);
        if (r2 != -ENOMEM) {
                CHECK(r2 == r);
                check_same_errors(&e, &e2);
                if (r == 0)
                        check_same_main(c, again);
        }
        config_free(again);
        r2 = config_parse_main(MAIN_PATH, text, size, &none, NULL);
        CHECK(r2 == r || r2 == -ENOMEM);
        config_free(none);
        if (r < 0) {
                CHECK(e.n >= 1 && !c);
                goto out;
        }
        CHECK(e.n == 0 && c);
        check_main(c);

        struct kbuf b = KBUF_INIT;
        if (write_main(c, &b) == 0) {
                struct config *back = NULL;
                struct config_errors e3 = { 0 };
                r2 = config_parse_main(MAIN_PATH, b.data, b.len, &back, &e3);
                if (r2 != -ENOMEM) {
                        if (r2 != 0)
                                fprintf(stderr, "re-parse: %s\n", e3.n ? e3.msgs[0] : "?");
                        CHECK(r2 == 0);
                        check_same_main(c, back);
                }
                config_free(back);
                config_errors_free(&e3);
        }
        kbuf_free(&b);
out:
        if (r == 0)
                config_free(c);
        config_errors_free(&e);
        config_errors_free(&e2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        /* an exact-size copy (NULL when empty), so reads past size are caught */
        char *text = size ? malloc(size) : NULL;
        if (size && !text)
                return 0;
        if (size)
                memcpy(text, data, size);
        fuzz_schedule(text, size);
        fuzz_main(text, size);
        free(text);
        return 0;
}
