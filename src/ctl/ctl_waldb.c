/* SPDX-License-Identifier: MIT */
/* kairosctl wal dump --db / wal verify --db: a mandate's WAL rows in cluster
 * mode's PostgreSQL table kairos_wal (docs/design.md §14), exported as the
 * WAL file they stand for, or checked row by row.  Read-only.  Built with
 * the store only with -Dpostgres=enabled; otherwise --db is a usage error
 * saying so. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctl.h"

#ifndef KAIROS_HAVE_PGSTORE

static int not_built(const char *cmd)
{
        return ctl_usage_error("%s --db: not built in (this kairosctl was built without "
                               "PostgreSQL support, meson -Dpostgres=enabled)", cmd);
}

int ctl_wal_dump_db(const struct ctl_opts *o, const char *conninfo, const char *mandate,
                    const char *output)
{
        (void)o;
        (void)conninfo;
        (void)mandate;
        (void)output;
        return not_built("wal dump");
}

int ctl_wal_verify_db(const struct ctl_opts *o, const char *conninfo, int n, char **mandates)
{
        (void)o;
        (void)conninfo;
        (void)n;
        (void)mandates;
        return not_built("wal verify");
}

#else

#include "kairos/crcline.h"
#include "kairos/kbuf.h"
#include "kairos/kjson.h"
#include "conninfo.h"
#include "pgstore.h"

/* Problems printed per mandate; the rest are counted. */
#define MAX_PROBLEMS_SHOWN 100

/* Connect to what --db ARG stands for (conninfo.h: "@FILE", never a
 * password on the command line); CTL_EXIT_USAGE or CTL_EXIT_NOINPUT after
 * saying why (the conninfo is not printed: it may hold a password). */
static int connect_db(const char *cmd, const char *arg, struct pgstore **ret)
{
        char err[512] = "";
        char *conninfo = NULL;
        int r = conninfo_from_arg(arg, &conninfo, err, sizeof err);
        if (r == -ENOMEM)
                return ctl_errno_error(cmd, r);
        if (r == -EINVAL && arg[0] != '@')
                return ctl_usage_error("%s --db: %s", cmd, err);
        if (r < 0)
                return ctl_error(CTL_EXIT_NOINPUT, "%s --db: %s", cmd, err);
        r = pgstore_connect(conninfo, ret, err, sizeof err);
        free(conninfo);

        if (r < 0) {
                /* libpq's reason may span lines: one line here */
                for (char *p = err; *p; p++)
                        if (*p == '\n' || *p == '\t')
                                *p = ' ';
                size_t n = strlen(err);
                while (n && err[n - 1] == ' ')
                        err[--n] = '\0';
                return ctl_error(CTL_EXIT_NOINPUT, "cannot connect to the database: %s",
                                 *err ? err : strerror(-r));
        }
        return 0;
}

/* A store error: no such mandate and a lost connection are unreadable
 * input (66), anything else too. */
static int store_error(struct pgstore *s, const char *mandate, int r)
{
        fputs("kairosctl: ", stderr);
        ctl_put_safe(stderr, mandate);
        if (r == -ENOENT)
                fputs(": no such mandate in the database\n", stderr);
        else {
                fputs(": ", stderr);
                ctl_put_safe(stderr, pgstore_error(s));
                fputc('\n', stderr);
        }
        return r == -ENOMEM ? CTL_EXIT_OSERR : CTL_EXIT_NOINPUT;
}

/* The bytes to PATH, whole or not at all: a temporary file beside it,
 * fsync, rename.  -errno. */
static int write_file_atomic(const char *path, const char *data, size_t len)
{
        struct kbuf tmp = KBUF_INIT;
        int fd, r;

        if ((r = kbuf_printf(&tmp, "%s.tmp.%ld", path, (long)getpid())) < 0)
                return r;
        fd = open(tmp.data, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
        if (fd < 0) {
                r = -errno;
                kbuf_free(&tmp);
                return r;
        }
        r = ctl_write_all(fd, data, len);
        if (r == 0 && fsync(fd) < 0)
                r = -errno;
        if (close(fd) < 0 && r == 0)
                r = -errno;
        if (r == 0 && rename(tmp.data, path) < 0)
                r = -errno;
        if (r < 0)
                unlink(tmp.data);
        kbuf_free(&tmp);
        return r;
}

int ctl_wal_dump_db(const struct ctl_opts *o, const char *conninfo, const char *mandate,
                    const char *output)
{
        struct pgstore *s = NULL;
        struct kbuf b = KBUF_INIT;
        int64_t last_seq = 0, nrows = 0;
        int r, ret;

        (void)o;
        ret = connect_db("wal dump", conninfo, &s);
        if (ret)
                return ret;
        r = pgstore_wal_last_seq(s, mandate, &last_seq, NULL);
        if (r < 0) {
                ret = store_error(s, mandate, r);
                goto out;
        }
        r = pgstore_wal_read(s, mandate, &b, &nrows);
        if (r == -EIO) {
                /* the rows are not numbered 1..n: not a WAL file */
                fputs("kairosctl: ", stderr);
                ctl_put_safe(stderr, mandate);
                fputs(": the rows are not a complete WAL (", stderr);
                ctl_put_safe(stderr, pgstore_error(s));
                fputs("); see kairosctl wal verify --db\n", stderr);
                ret = CTL_EXIT_DATAERR;
                goto out;
        }
        if (r < 0) {
                ret = store_error(s, mandate, r);
                goto out;
        }
        if (nrows != last_seq) {
                fputs("kairosctl: ", stderr);
                ctl_put_safe(stderr, mandate);
                fprintf(stderr, ": the rows end at seq %lld but the mandate's last_seq is "
                        "%lld: not a complete WAL; see kairosctl wal verify --db\n",
                        (long long)nrows, (long long)last_seq);
                ret = CTL_EXIT_DATAERR;
                goto out;
        }
        if (output) {
                r = write_file_atomic(output, b.data ? b.data : "", b.len);
                if (r < 0) {
                        fputs("kairosctl: ", stderr);
                        ctl_put_safe(stderr, output);
                        fprintf(stderr, ": %s\n", strerror(-r));
                        ret = CTL_EXIT_IOERR;
                        goto out;
                }
        } else {
                fflush(stdout);
                r = ctl_write_all(STDOUT_FILENO, b.data ? b.data : "", b.len);
                if (r < 0) {
                        ret = ctl_error(CTL_EXIT_IOERR, "writing standard output: %s",
                                        strerror(-r));
                        goto out;
                }
        }
        ret = CTL_EXIT_OK;
out:
        kbuf_free(&b);
        pgstore_close(s);
        return ret;
}

/* ---- verify ---------------------------------------------------------- */

struct problems {
        const char *mandate;
        json_t *list;       /* --json: the problems, else NULL (printed) */
        size_t count;
};

static void problem(struct problems *p, int64_t seq, const char *reason, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));

static void problem(struct problems *p, int64_t seq, const char *reason, const char *fmt, ...)
{
        char detail[384];
        va_list ap;

        p->count++;
        if (p->count > MAX_PROBLEMS_SHOWN)
                return;
        va_start(ap, fmt);
        vsnprintf(detail, sizeof detail, fmt, ap);
        va_end(ap);
        if (p->list) {
                json_t *j = json_object();
                if (!j)
                        return;
                if (seq > 0)
                        json_object_set_new(j, "seq", json_integer(seq));
                else
                        json_object_set_new(j, "seq", json_null());
                json_object_set_new(j, "reason", json_string(reason));
                json_object_set_new(j, "detail", ctl_json_str(detail));
                json_array_append_new(p->list, j);
                return;
        }
        ctl_put_safe(stdout, p->mandate);
        if (seq > 0)
                printf(": seq %lld: %s: ", (long long)seq, reason);
        else
                printf(": %s: ", reason);
        ctl_put_safe(stdout, detail);
        putchar('\n');
}

/* Check the rows of one mandate; returns 0 or -ENOMEM. */
static int check_rows(const struct pgstore_wal_row *rows, size_t n, int64_t last_seq,
                      int64_t mandate_epoch, struct problems *p)
{
        struct kjson_arena *arena = kjson_arena_new();
        int64_t expect = 1, max_epoch = 0;

        if (!arena)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                const struct pgstore_wal_row *w = &rows[i];
                const struct kjson *obj;
                char why[128];
                bool legacy;
                size_t body;
                uint32_t crc;

                if (w->seq != expect) {
                        if (w->seq == expect + 1)
                                problem(p, w->seq, "gap", "row %lld is missing",
                                        (long long)expect);
                        else
                                problem(p, w->seq, "gap", "rows %lld..%lld are missing",
                                        (long long)expect, (long long)w->seq - 1);
                }
                expect = w->seq + 1;
                if (w->epoch < max_epoch)
                        problem(p, w->seq, "epoch_back",
                                "epoch %lld after epoch %lld (an append under an old epoch)",
                                (long long)w->epoch, (long long)max_epoch);
                if (w->epoch > max_epoch)
                        max_epoch = w->epoch;
                if (w->epoch > mandate_epoch)
                        problem(p, w->seq, "epoch_ahead",
                                "epoch %lld beyond the mandate's epoch %lld",
                                (long long)w->epoch, (long long)mandate_epoch);
                if (w->len == 0 || w->line[w->len - 1] != '\n') {
                        problem(p, w->seq, "no_newline", "the line does not end in a newline");
                        continue;
                }
                body = w->len - 1;
                if (memchr(w->line, '\n', body)) {
                        problem(p, w->seq, "several_lines", "the row holds more than one line");
                        continue;
                }
                kjson_arena_reset(arena);
                int r = crcline_check(arena, 0, w->line, body, &obj, &legacy, why, sizeof why);
                if (r < 0) {
                        kjson_arena_free(arena);
                        return r;
                }
                if (r == 0) {
                        problem(p, w->seq, "bad_record", "%s", why);
                        continue;
                }
                if (crcline_has_suffix(w->line, body, &crc) && w->crc != (int64_t)crc)
                        problem(p, w->seq, "crc_column",
                                "the crc column (%lld) is not the line's crc (%lu)",
                                (long long)w->crc, (unsigned long)crc);
        }
        if (expect - 1 != last_seq)
                problem(p, 0, "last_seq", "the rows end at seq %lld, the mandate's last_seq "
                        "is %lld", (long long)(expect - 1), (long long)last_seq);
        kjson_arena_free(arena);
        return 0;
}

int ctl_wal_verify_db(const struct ctl_opts *o, const char *conninfo, int n, char **mandates)
{
        struct pgstore *s = NULL;
        json_t *out = NULL;
        int ret, worst = CTL_EXIT_OK;
        bool unreadable = false;

        ret = connect_db("wal verify", conninfo, &s);
        if (ret)
                return ret;
        if (o->json && !(out = json_array())) {
                pgstore_close(s);
                return ctl_errno_error("json", -ENOMEM);
        }
        for (int i = 0; i < n; i++) {
                struct pgstore_wal_row *rows = NULL;
                size_t nrows = 0;
                int64_t last_seq = 0, epoch = 0;
                struct problems p = { .mandate = mandates[i] };
                int r;

                fflush(stdout);
                r = pgstore_wal_last_seq(s, mandates[i], &last_seq, &epoch);
                if (r == 0)
                        r = pgstore_wal_rows(s, mandates[i], &rows, &nrows);
                if (r < 0) {
                        int e = store_error(s, mandates[i], r);
                        if (e == CTL_EXIT_OSERR) {
                                json_decref(out);
                                pgstore_close(s);
                                return e;
                        }
                        unreadable = true;
                        if (out)
                                json_array_append_new(
                                        out, json_pack("{s:o,s:s}", "mandate",
                                                       ctl_json_str(mandates[i]), "status",
                                                       "unreadable"));
                        continue;
                }
                if (out && !(p.list = json_array()))
                        r = -ENOMEM;
                if (r == 0)
                        r = check_rows(rows, nrows, last_seq, epoch, &p);
                pgstore_wal_rows_free(rows, nrows);
                if (r < 0) {
                        json_decref(p.list);
                        json_decref(out);
                        pgstore_close(s);
                        return ctl_errno_error("wal verify", r);
                }
                if (p.count)
                        worst = 2;
                if (out) {
                        json_array_append_new(
                                out, json_pack("{s:o,s:s,s:I,s:I,s:I,s:I,s:o}", "mandate",
                                               ctl_json_str(mandates[i]), "status",
                                               p.count ? "corrupt" : "clean", "rows",
                                               (json_int_t)nrows, "last_seq",
                                               (json_int_t)last_seq, "epoch", (json_int_t)epoch,
                                               "problem_count", (json_int_t)p.count,
                                               "problems", p.list));
                } else {
                        ctl_put_safe(stdout, mandates[i]);
                        if (p.count == 0)
                                printf(": ok (%zu row%s, epoch %lld)\n", nrows,
                                       nrows == 1 ? "" : "s", (long long)epoch);
                        else if (p.count > MAX_PROBLEMS_SHOWN)
                                printf(": corrupt (%zu problems, the first %d shown)\n",
                                       p.count, MAX_PROBLEMS_SHOWN);
                        else
                                printf(": corrupt (%zu problem%s)\n", p.count,
                                       p.count == 1 ? "" : "s");
                }
        }
        pgstore_close(s);
        if (out) {
                ret = ctl_json_print(json_pack("{s:o,s:i}", "mandates", out, "exit",
                                               unreadable ? CTL_EXIT_NOINPUT : worst));
                if (ret)
                        return ret;
        }
        return unreadable ? CTL_EXIT_NOINPUT : worst;
}

#endif
