/* SPDX-License-Identifier: MIT */
/* kairosctl cron next EXPR [--from T] [-n N] [--tz Z] (offline): the next
 * fire times of a cron expression, computed by the same code as kairosd's
 * scheduler (include/kairos/cron.h).  Also the "-n N" option and the local
 * time format shared with `schedules next`. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl.h"
#include "kairos/cron.h"
#include "kairos/kbuf.h"
#include "kairos/planner.h"

#define CRON_NEXT_DEFAULT 5
#define CRON_NEXT_MAX 1000

int ctl_take_count(const char *cmd, int *argc, char **argv, int *count, bool *given)
{
        int out = 0;
        const char *v = NULL;

        *given = false;
        for (int i = 0; i < *argc; i++) {
                if (strcmp(argv[i], "--") == 0) {
                        while (i < *argc)
                                argv[out++] = argv[i++];
                        break;
                }
                if (strcmp(argv[i], "-n") == 0 || strcmp(argv[i], "--count") == 0) {
                        if (i + 1 >= *argc)
                                return ctl_usage_error("%s: option '%s' needs a value", cmd,
                                                       argv[i]);
                        v = argv[++i];
                } else if (strncmp(argv[i], "-n", 2) == 0 && argv[i][2] >= '0' &&
                           argv[i][2] <= '9') {
                        v = argv[i] + 2;
                } else if (strncmp(argv[i], "--count=", 8) == 0) {
                        v = argv[i] + 8;
                } else {
                        argv[out++] = argv[i];
                        continue;
                }
                char *end;
                errno = 0;
                long n = strtol(v, &end, 10);
                if (errno || end == v || *end || n < 1 || n > CRON_NEXT_MAX)
                        return ctl_usage_error("%s: -n '%s' is not a count 1..%d", cmd, v,
                                               CRON_NEXT_MAX);
                *count = (int)n;
                *given = true;
        }
        *argc = out;
        argv[out] = NULL;
        return 0;
}

int ctl_format_local(const struct cron_tz *tz, int64_t t, char *buf, size_t len,
                     char offset[7])
{
        struct tm tm;
        int r = cron_tz_localtime(tz, t, &tm);

        if (r < 0)
                return r;
        long off = tm.tm_gmtoff;
        char sign = off < 0 ? '-' : '+';
        if (off < 0)
                off = -off;
        unsigned hh = (unsigned)(off / 3600) % 100, mm = (unsigned)(off % 3600 / 60);
        offset[0] = sign;
        offset[1] = (char)('0' + hh / 10);
        offset[2] = (char)('0' + hh % 10);
        offset[3] = ':';
        offset[4] = (char)('0' + mm / 10);
        offset[5] = (char)('0' + mm % 10);
        offset[6] = '\0';
        snprintf(buf, len, "%04d-%02d-%02dT%02d:%02d:%02d%s", tm.tm_year + 1900, tm.tm_mon + 1,
                 tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, offset);
        return 0;
}

int ctl_load_tz(const char *cmd, const char *name, struct cron_tz **out)
{
        int r = cron_tz_load(name, out);

        if (r == 0)
                return 0;
        if (r == -EINVAL)
                return ctl_error(CTL_EXIT_DATAERR, "%s: '%s' is not a time zone name (IANA, "
                                 "e.g. Europe/Berlin)", cmd, name);
        if (r == -ENOENT)
                return ctl_error(CTL_EXIT_DATAERR, "%s: unknown time zone '%s'", cmd, name);
        if (r == -EBADMSG)
                return ctl_error(CTL_EXIT_DATAERR, "%s: the zoneinfo file of '%s' is malformed",
                                 cmd, name);
        return ctl_errno_error("loading the time zone", r);
}

/* Join the positional words: "cron next 0 9 '*' '*' 1-5" works as well as
 * one quoted expression. */
static char *join_words(int n, char **words)
{
        struct kbuf b = KBUF_INIT;

        for (int i = 0; i < n; i++)
                if ((i && kbuf_putc(&b, ' ') < 0) || kbuf_puts(&b, words[i]) < 0) {
                        kbuf_free(&b);
                        return NULL;
                }
        return kbuf_steal(&b);
}

int ctl_cmd_cron_next(const struct ctl_opts *o, int argc, char **argv)
{
        const char *from_s = NULL, *tz_name = NULL;
        const struct ctl_option opts[] = {
                { "from", true, &from_s, NULL },
                { "tz", true, &tz_name, NULL },
                { NULL, false, NULL, NULL },
        };
        struct cron_expr e;
        struct cron_tz *tz = NULL;
        char err[256], *expr = NULL;
        int npos, count = CRON_NEXT_DEFAULT, r;
        bool given;
        int64_t from;

        r = ctl_take_count("cron next", &argc, argv, &count, &given);
        if (r == 0)
                r = ctl_parse_options("cron next", argc, argv, opts, &npos);
        if (r)
                return r;
        if (npos == 0)
                return ctl_usage_error("cron next: missing EXPR (e.g. '0 9 * * 1-5')");
        if (from_s) {
                if (planner_parse_fired_at(from_s, &from) < 0)
                        return ctl_usage_error("cron next: --from '%s' is not a UTC time "
                                               "YYYY-MM-DDTHH:MM:SSZ",
                                               from_s);
        } else {
                from = (int64_t)time(NULL);
        }
        expr = join_words(npos, argv);
        if (!expr)
                return ctl_error(CTL_EXIT_OSERR, "out of memory");
        if (cron_parse(expr, &e, err, sizeof err) < 0) {
                r = ctl_error(CTL_EXIT_DATAERR, "%s", err);
                goto out;
        }
        if (tz_name && (r = ctl_load_tz("cron next", tz_name, &tz)) != 0)
                goto out;

        char from_buf[PLANNER_FIRED_AT_LEN];
        planner_format_fired_at(from, from_buf);
        json_t *list = o->json ? json_array() : NULL;
        int64_t t = from, next;
        int found = 0;
        r = CTL_EXIT_OK;
        for (int i = 0; i < count; i++) {
                int cr = cron_next(&e, tz, t, &next);
                if (cr == -ENOENT)
                        break;
                if (cr < 0) {
                        r = ctl_errno_error("cron next", cr);
                        break;
                }
                char utc[PLANNER_FIRED_AT_LEN], local[64], offset[7];
                if (planner_format_fired_at(next, utc) < 0 ||
                    ctl_format_local(tz, next, local, sizeof local, offset) < 0) {
                        r = ctl_error(CTL_EXIT_DATAERR, "cron next: a time out of range");
                        break;
                }
                if (list)
                        json_array_append_new(list, json_pack("{s:s, s:s, s:s}", "utc", utc,
                                                              "local", local, "utc_offset",
                                                              offset));
                else if (tz)
                        printf("%s  %s\n", utc, local);
                else
                        printf("%s\n", utc);
                found++;
                t = next;
        }
        if (r == CTL_EXIT_OK && list) {
                r = ctl_json_print(json_pack("{s:s, s:s, s:s, s:o}", "expr", expr, "time_zone",
                                             cron_tz_name(tz), "from", from_buf, "next", list));
                list = NULL;
        }
        json_decref(list);
        if (r == CTL_EXIT_OK && found == 0)
                r = ctl_error(CTL_EXIT_DATAERR,
                              "cron next: '%s' never matches (nothing within 8 years after %s)",
                              expr, from_buf);
out:
        cron_tz_free(tz);
        free(expr);
        return r;
}
