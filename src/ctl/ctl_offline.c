/* SPDX-License-Identifier: MIT */
/* kairosctl offline commands (docs/design.md §12): wal dump, wal verify,
 * recover --dry-run, canon, plan.  They use the core library directly and
 * never change a file. */
#include <dirent.h>
#include <stdarg.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <time.h>

#include "ctl.h"
#include "ctl_probe.h"
#include "kairos/canon.h"
#include "kairos/config.h"
#include "kairos/evidence.h"
#include "kairos/idem.h"
#include "kairos/fold.h"
#include "kairos/kbuf.h"
#include "kairos/kio.h"
#include "kairos/kjson.h"
#include "kairos/kmem.h"
#include "kairos/planner.h"
#include "kairos/decide.h"
#include "kairos/probeout.h"
#include "kairos/recovery.h"
#include "kairos/showdoc.h"
#include "kairos/statedir.h"
#include "kairos/strmap.h"
#include "kairos/verdict.h"
#include "kairos/wal.h"

#define WAL_SUFFIX ".wal.jsonl"

/* ---- shared ---------------------------------------------------------- */

struct loaded_wal {
        char *data;
        size_t len;
        struct fold *fold;
};

static void loaded_wal_free(struct loaded_wal *w)
{
        fold_free(w->fold);
        free(w->data);
        w->fold = NULL;
        w->data = NULL;
}

/* An archive (<state>/archive/ID.wal.jsonl.gz) is read like the WAL it
 * holds.  Recognised by its magic bytes, not its name. */
#define GZIP_OUT_MAX ((size_t)1 << 30)

static bool is_gzip(const char *data, size_t len)
{
        return len >= 2 && (unsigned char)data[0] == 0x1f && (unsigned char)data[1] == 0x8b;
}

/* Read a WAL, plain or gzip-compressed.  Returns 0 or a printed error's
 * exit status: CTL_EXIT_NOINPUT (unreadable), CTL_EXIT_DATAERR (a damaged
 * gzip file). */
static int read_wal(const char *path, char **ret_data, size_t *ret_len)
{
        struct kbuf b = KBUF_INIT;
        const char *why;
        char *data;
        size_t len;
        int r;

        r = ctl_read_file(path, &data, &len);
        if (r < 0)
                return ctl_file_error(path, r);
        if (!is_gzip(data, len)) {
                *ret_data = data;
                *ret_len = len;
                return 0;
        }
        r = kio_gunzip(data, len, GZIP_OUT_MAX, &b, &why);
        free(data);
        if (r < 0) {
                kbuf_free(&b);
                fputs("kairosctl: ", stderr);
                ctl_put_safe(stderr, path);
                if (r == -EBADMSG) {
                        fputs(": damaged gzip file: ", stderr);
                        ctl_put_safe(stderr, why);
                        fputc('\n', stderr);
                        return CTL_EXIT_DATAERR;
                }
                if (r == -EFBIG) {
                        fputs(": gzip file expands beyond 1 GiB\n", stderr);
                        return CTL_EXIT_DATAERR;
                }
                fprintf(stderr, ": %s\n", strerror(-r));
                return CTL_EXIT_OSERR;
        }
        if (!b.data && kbuf_reserve(&b, 1) < 0)
                return ctl_errno_error("gzip", -ENOMEM);
        b.data[b.len] = '\0';
        *ret_len = b.len;
        *ret_data = kbuf_steal(&b);
        return 0;
}

/* Read and fold a WAL.  Returns 0 or a printed error's exit status. */
static int load_wal(const char *path, struct loaded_wal *w)
{
        int r;

        memset(w, 0, sizeof(*w));
        r = read_wal(path, &w->data, &w->len);
        if (r)
                return r;
        r = fold_buffer(w->data, w->len, &w->fold);
        if (r < 0) {
                free(w->data);
                w->data = NULL;
                return ctl_errno_error("fold", r);
        }
        return 0;
}

static size_t torn_bytes(const struct loaded_wal *w)
{
        return w->fold->bad_offset <= w->len ? w->len - w->fold->bad_offset : 0;
}

/* "torn tail at line L, byte offset O (N bytes): REASON" or
 * "corrupt at line L, byte offset O: REASON"; nothing for a clean file. */
static void print_problem(const struct loaded_wal *w)
{
        const struct fold *f = w->fold;

        if (f->status == FOLD_TORN)
                printf("torn tail at line %zu, byte offset %zu (%zu bytes): ", f->bad_line,
                       f->bad_offset, torn_bytes(w));
        else if (f->status == FOLD_CORRUPT)
                printf("corrupt at line %zu, byte offset %zu: ", f->bad_line, f->bad_offset);
        else
                return;
        ctl_put_safe(stdout, f->bad_reason);
}

static json_t *problem_json(const struct loaded_wal *w)
{
        const struct fold *f = w->fold;

        if (f->status == FOLD_CLEAN)
                return json_null();
        json_t *o = json_pack("{s:I,s:I}", "line", (json_int_t)f->bad_line, "offset",
                              (json_int_t)f->bad_offset);
        if (!o)
                return NULL;
        if (f->status == FOLD_TORN)
                json_object_set_new(o, "bytes", json_integer((json_int_t)torn_bytes(w)));
        json_object_set_new(o, "reason", ctl_json_str(f->bad_reason));
        return o;
}

static bool blank(const char *s, size_t n)
{
        for (size_t i = 0; i < n; i++)
                if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
                        return false;
        return true;
}

/* "sha256-" + 12 hex + "…" for display; other strings unchanged. */
static void put_short(const char *s)
{
        if (s && strncmp(s, "sha256-", 7) == 0 && strlen(s) == 71) {
                printf("%.19s…", s);
                return;
        }
        ctl_put_safe(stdout, s);
}

/* ---- wal dump -------------------------------------------------------- */

/* A member's value for the text dump: strings (hashes shortened), numbers
 * and literals as written, arrays/objects as a short compact JSON. */
static void put_value(const struct kjson *v)
{
        struct kbuf b = KBUF_INIT;

        switch (v->type) {
        case KJSON_STRING:
                put_short(v->u.str.ptr);
                return;
        case KJSON_NUMBER:
                printf("%.*s", (int)(v->u.num.len > 40 ? 40 : v->u.num.len), v->u.num.text);
                return;
        case KJSON_NULL:
                fputs("null", stdout);
                return;
        case KJSON_TRUE:
        case KJSON_FALSE:
                fputs(v->type == KJSON_TRUE ? "true" : "false", stdout);
                return;
        default:
                break;
        }
        if (kjson_write(&b, v) == 0 && b.data) {
                if (b.len > 60)
                        memcpy(b.data + 57, "...", 4);
                ctl_put_safe(stdout, b.data);
        }
        kbuf_free(&b);
}

/* Print " key=value" for every member except the ones shown in columns
 * (subject_key and status_key hold the subject and status columns). */
static void put_fields(const struct kjson *rec, const char *subject_key, const char *status_key)
{
        static const char *const skip[] = { "op", "ts", "crc", NULL };

        for (size_t i = 0; i < rec->u.obj.n; i++) {
                const struct kjson_member *m = &rec->u.obj.members[i];
                bool skipped = (subject_key && strcmp(m->key, subject_key) == 0) ||
                               (status_key && strcmp(m->key, status_key) == 0);
                for (size_t k = 0; skip[k]; k++)
                        if (strcmp(m->key, skip[k]) == 0)
                                skipped = true;
                if (skipped)
                        continue;
                if (strcmp(m->key, "steps") == 0 && m->value->type == KJSON_ARRAY) {
                        printf(" steps=%zu", m->value->u.arr.n);
                        continue;
                }
                putchar(' ');
                ctl_put_safe(stdout, m->key);
                putchar('=');
                put_value(m->value);
        }
}

static void dump_record(size_t lineno, const char *line, size_t n, struct kjson_arena *arena)
{
        struct kjson *rec = NULL;
        struct kjson_error err;
        const char *op, *subject, *status;

        kjson_arena_reset(arena);
        if (kjson_parse(arena, line, n, &rec, &err) < 0 || rec->type != KJSON_OBJECT) {
                printf("%6zu  (not a record)\n", lineno);
                return;
        }
        op = kjson_get_str(rec, "op");
        bool is_operator = op && strcmp(op, "operator") == 0;
        const char *subject_key = is_operator ? "mandate_id" : "step_id";
        const char *status_key = is_operator ? "action" : "status";
        subject = kjson_get_str(rec, subject_key);
        if (!subject) {
                subject_key = "plan_id";
                subject = kjson_get_str(rec, subject_key);
        }
        status = kjson_get_str(rec, status_key);

        printf("%6zu  ", lineno);
        ctl_put_safe(stdout, kjson_get_str(rec, "ts"));
        fputs("  ", stdout);
        ctl_put_safe(stdout, op ? op : "(no op)");
        for (size_t k = op ? strlen(op) : 7; k < 14; k++)
                putchar(' ');
        ctl_put_safe(stdout, subject);
        if (status) {
                putchar(' ');
                ctl_put_safe(stdout, status);
        }
        put_fields(rec, subject ? subject_key : NULL, status ? status_key : NULL);
        if (!kjson_get(rec, "crc"))
                fputs(" [legacy, no crc]", stdout);
        putchar('\n');
}

static void dump_records(const struct loaded_wal *w, struct kjson_arena *arena)
{
        const struct fold *f = w->fold;
        size_t lineno = 0, after = 0, off = 0;

        while (off < w->len) {
                const char *line = w->data + off;
                const char *nl = memchr(line, '\n', w->len - off);
                size_t n = nl ? (size_t)(nl - line) : w->len - off;
                size_t next = off + n + (nl ? 1 : 0);

                lineno++;
                if (f->status != FOLD_CLEAN && off >= f->bad_offset) {
                        if (off == f->bad_offset) {
                                printf("%6zu  ", lineno);
                                print_problem(w);
                                putchar('\n');
                        } else if (!blank(line, n)) {
                                after++;
                        }
                } else if (!blank(line, n)) {
                        dump_record(lineno, line, n, arena);
                }
                off = next;
        }
        if (after)
                printf("        (%zu more line%s after it, not folded)\n", after,
                       after == 1 ? "" : "s");
}

static void dump_summary(const char *path, const struct loaded_wal *w)
{
        const struct fold *f = w->fold;
        size_t unfinished = 0;

        for (size_t i = 0; i < f->nplans; i++)
                unfinished += !f->plans[i].finalized;
        printf("\nfile: ");
        ctl_put_safe(stdout, path);
        printf("\nstatus: %s (%zu records, %zu legacy unchecked", fold_status_name(f->status),
               f->records, f->legacy_records);
        if (f->unknown_ops)
                printf(", %zu unknown ops ignored", f->unknown_ops);
        printf(")\n");
        if (f->status != FOLD_CLEAN) {
                printf("problem: ");
                print_problem(w);
                putchar('\n');
        }
        printf("plans: %zu (%zu finalized, %zu not finalized)\n", f->nplans,
               f->nplans - unfinished, unfinished);
        for (size_t i = 0; i < f->nplans; i++) {
                const struct fold_plan *p = &f->plans[i];
                printf("  ");
                ctl_put_safe(stdout, p->plan_id);
                printf(" cycle %lld ", p->cycle);
                ctl_put_safe(stdout, p->mandate_id);
                if (p->finalized) {
                        printf(" finalized ");
                        ctl_put_safe(stdout, p->final_status);
                } else {
                        printf(" NOT FINALIZED");
                }
                if (p->orphan_reason) {
                        printf(" (");
                        ctl_put_safe(stdout, p->orphan_reason);
                        putchar(')');
                }
                putchar('\n');
                for (size_t k = 0; k < p->nsteps; k++) {
                        const struct fold_step *s = &f->steps[p->steps[k]];
                        printf("    ");
                        ctl_put_safe(stdout, s->step_id);
                        putchar(' ');
                        ctl_put_safe(stdout, s->status ? s->status : "(no status)");
                        if (s->reason) {
                                printf(" reason=");
                                ctl_put_safe(stdout, s->reason);
                        }
                        if (s->error_class) {
                                printf(" error_class=");
                                ctl_put_safe(stdout, s->error_class);
                        }
                        putchar('\n');
                }
        }
}

static json_t *step_json(const struct fold_step *s)
{
        json_t *o = json_object();

        if (!o)
                return NULL;
        json_object_set_new(o, "step_id", ctl_json_str(s->step_id));
        json_object_set_new(o, "plan_id", ctl_json_str(s->plan_id));
        json_object_set_new(o, "tool", ctl_json_str(s->tool));
        json_object_set_new(o, "params_hash", ctl_json_str(s->params_hash));
        json_object_set_new(o, "pre_hash", ctl_json_str(s->pre_hash));
        json_object_set_new(o, "expected_post_hash", ctl_json_str(s->expected_post_hash));
        json_object_set_new(o, "idem_key", ctl_json_str(s->idem_key));
        json_object_set_new(o, "status", ctl_json_str(s->status));
        json_object_set_new(o, "finalized", json_boolean(fold_step_finalized(s)));
        json_object_set_new(o, "observed_pre_hash", ctl_json_str(s->observed_pre_hash));
        json_object_set_new(o, "post_hash", ctl_json_str(s->post_hash));
        json_object_set_new(o, "result_hash", ctl_json_str(s->result_hash));
        json_object_set_new(o, "result", ctl_json_raw(s->result_json));
        json_object_set_new(o, "evidence", ctl_json_raw(s->evidence_json));
        json_object_set_new(o, "error_class", ctl_json_str(s->error_class));
        json_object_set_new(o, "error_msg", ctl_json_str(s->error_msg));
        json_object_set_new(o, "reason", ctl_json_str(s->reason));
        json_object_set_new(o, "recovered", json_boolean(s->recovered));
        json_object_set_new(o, "executions", json_integer(s->executions));
        json_object_set_new(o, "resets", json_integer(s->resets));
        return o;
}

static json_t *plan_json(const struct fold *f, const struct fold_plan *p)
{
        json_t *o = json_object(), *steps = json_array();

        if (!o || !steps) {
                json_decref(o);
                json_decref(steps);
                return NULL;
        }
        json_object_set_new(o, "plan_id", ctl_json_str(p->plan_id));
        json_object_set_new(o, "mandate_id", ctl_json_str(p->mandate_id));
        json_object_set_new(o, "cycle", json_integer(p->cycle));
        json_object_set_new(o, "plan_hash", ctl_json_str(p->plan_hash));
        json_object_set_new(o, "finalized", json_boolean(p->finalized));
        json_object_set_new(o, "final_status", ctl_json_str(p->final_status));
        json_object_set_new(o, "final_reason", ctl_json_str(p->final_reason));
        json_object_set_new(o, "orphan_reason", ctl_json_str(p->orphan_reason));
        json_object_set_new(o, "line", json_integer((json_int_t)p->line));
        for (size_t k = 0; k < p->nsteps; k++)
                json_array_append_new(steps, step_json(&f->steps[p->steps[k]]));
        json_object_set_new(o, "steps", steps);
        return o;
}

static json_t *dump_json(const char *path, const struct loaded_wal *w)
{
        const struct fold *f = w->fold;
        json_t *o = json_object(), *plans = json_array(), *open = json_array(),
               *ops = json_array();

        if (!o || !plans || !open || !ops) {
                json_decref(o);
                json_decref(plans);
                json_decref(open);
                json_decref(ops);
                return NULL;
        }
        json_object_set_new(o, "file", ctl_json_str(path));
        json_object_set_new(o, "status", json_string(fold_status_name(f->status)));
        json_object_set_new(o, "bytes", json_integer((json_int_t)w->len));
        json_object_set_new(o, "lines", json_integer((json_int_t)f->lines));
        json_object_set_new(o, "records", json_integer((json_int_t)f->records));
        json_object_set_new(o, "legacy_records", json_integer((json_int_t)f->legacy_records));
        json_object_set_new(o, "unknown_ops", json_integer((json_int_t)f->unknown_ops));
        json_object_set_new(o, "good_end", json_integer((json_int_t)f->good_end));
        json_object_set_new(o, "problem", problem_json(w));
        for (size_t i = 0; i < f->nplans; i++) {
                json_array_append_new(plans, plan_json(f, &f->plans[i]));
                if (!f->plans[i].finalized)
                        json_array_append_new(open, ctl_json_str(f->plans[i].plan_id));
        }
        for (size_t i = 0; i < f->noperators; i++) {
                const struct fold_operator *op = &f->operators[i];
                json_t *j = json_object();
                if (!j)
                        continue;
                json_object_set_new(j, "mandate_id", ctl_json_str(op->mandate_id));
                json_object_set_new(j, "action", ctl_json_str(op->action));
                json_object_set_new(j, "step_id", ctl_json_str(op->step_id));
                json_object_set_new(j, "uid", json_integer(op->uid));
                json_object_set_new(j, "reason", ctl_json_str(op->reason));
                json_object_set_new(j, "ts", ctl_json_str(op->ts));
                json_object_set_new(j, "line", json_integer((json_int_t)op->line));
                json_array_append_new(ops, j);
        }
        json_object_set_new(o, "plans", plans);
        json_object_set_new(o, "plans_not_finalized", open);
        json_object_set_new(o, "operators", ops);
        return o;
}

int ctl_cmd_wal_dump(const struct ctl_opts *o, int argc, char **argv)
{
        struct loaded_wal w;
        struct kjson_arena *arena;
        int npos, r;

        const char *db = NULL, *output = NULL;
        const struct ctl_option opts[] = {
                { "db", true, &db, NULL },
                { "output", true, &output, NULL },
                { NULL, false, NULL, NULL },
        };

        r = ctl_parse_options("wal dump", argc, argv, opts, &npos);
        if (r)
                return r;
        if (db) {
                if (npos != 1)
                        return ctl_usage_error("wal dump --db needs exactly one MANDATE");
                if (o->json)
                        return ctl_usage_error("wal dump --db writes the WAL's own bytes: "
                                               "--json does not apply (wal verify --db "
                                               "--json describes the rows)");
                return ctl_wal_dump_db(o, db, argv[0], output);
        }
        if (output)
                return ctl_usage_error("wal dump: --output goes with --db (a FILE is printed "
                                       "record by record)");
        if (npos != 1)
                return ctl_usage_error("wal dump needs exactly one FILE");
        r = load_wal(argv[0], &w);
        if (r)
                return r;
        if (o->json) {
                r = ctl_json_print(dump_json(argv[0], &w));
                loaded_wal_free(&w);
                return r;
        }
        arena = kjson_arena_new();
        if (!arena) {
                loaded_wal_free(&w);
                return ctl_errno_error("kjson", -ENOMEM);
        }
        dump_records(&w, arena);
        dump_summary(argv[0], &w);
        kjson_arena_free(arena);
        loaded_wal_free(&w);
        return CTL_EXIT_OK;
}

/* ---- wal verify ------------------------------------------------------ */

int ctl_cmd_wal_verify(const struct ctl_opts *o, int argc, char **argv)
{
        int npos, r, worst = CTL_EXIT_OK;
        bool unreadable = false;
        json_t *files = NULL;

        const char *db = NULL;
        const struct ctl_option opts[] = {
                { "db", true, &db, NULL },
                { NULL, false, NULL, NULL },
        };

        r = ctl_parse_options("wal verify", argc, argv, opts, &npos);
        if (r)
                return r;
        if (db) {
                if (npos < 1)
                        return ctl_usage_error("wal verify --db needs at least one MANDATE");
                return ctl_wal_verify_db(o, db, npos, argv);
        }
        if (npos < 1)
                return ctl_usage_error("wal verify needs at least one FILE");
        if (o->json && !(files = json_array()))
                return ctl_errno_error("json", -ENOMEM);

        for (int i = 0; i < npos; i++) {
                struct loaded_wal w;
                const struct fold *f;

                fflush(stdout);
                r = load_wal(argv[i], &w);
                if (r == CTL_EXIT_DATAERR) {
                        /* a damaged archive: its content is corrupt */
                        worst = 2;
                        if (files)
                                json_array_append_new(
                                        files, json_pack("{s:o,s:s,s:{s:s}}", "file",
                                                         ctl_json_str(argv[i]), "status",
                                                         "corrupt", "problem", "reason",
                                                         "damaged gzip file"));
                        else {
                                ctl_put_safe(stdout, argv[i]);
                                printf(": corrupt: damaged gzip file\n");
                        }
                        continue;
                }
                if (r != 0) {
                        unreadable = true;
                        if (files)
                                json_array_append_new(
                                        files, json_pack("{s:o,s:s}", "file",
                                                         ctl_json_str(argv[i]), "status",
                                                         "unreadable"));
                        continue;
                }
                f = w.fold;
                if (f->status == FOLD_CORRUPT)
                        worst = 2;
                else if (f->status == FOLD_TORN && worst < 1)
                        worst = 1;
                if (files) {
                        json_t *j = json_pack("{s:o,s:s,s:I,s:I,s:I,s:o}", "file",
                                              ctl_json_str(argv[i]), "status",
                                              fold_status_name(f->status), "bytes",
                                              (json_int_t)w.len, "records",
                                              (json_int_t)f->records, "legacy_unchecked",
                                              (json_int_t)f->legacy_records, "problem",
                                              problem_json(&w));
                        json_array_append_new(files, j);
                } else {
                        ctl_put_safe(stdout, argv[i]);
                        if (f->status == FOLD_CLEAN)
                                printf(": ok (%zu record%s, %zu legacy unchecked)",
                                       f->records, f->records == 1 ? "" : "s",
                                       f->legacy_records);
                        else
                                printf(": ");
                        print_problem(&w);
                        putchar('\n');
                }
                loaded_wal_free(&w);
        }
        if (files) {
                json_t *top = json_pack("{s:o,s:i}", "files", files, "exit", worst);
                r = ctl_json_print(top);
                if (r)
                        return r;
        }
        return unreadable ? CTL_EXIT_NOINPUT : worst;
}

/* ---- recover --dry-run ------------------------------------------------ */

struct recover_totals {
        size_t files, unreadable, torn, corrupt, clean, removed;
        size_t unfinished, outcomes[5], records, would_probe;
};

/* What recovery knows beyond the WALs, as kairosd would at its start: the
 * configuration's schedules and the idempotency store's calls by owner. */
struct recover_evidence {
        const struct config *cfg;          /* NULL: no configuration */
        struct evidence_index *ix;
        bool probe;                        /* --probe: run the probes */
};

/* The schedule's declarations, or NULL (not configured: the WAL alone). */
static bool schedule_evidence(const struct recover_evidence *re, const struct fold *f,
                              struct evidence_schedule *es)
{
        if (!re->cfg || !f->mandate.schedule)
                return false;
        for (size_t i = 0; i < re->cfg->nschedules; i++)
                if (strcmp(re->cfg->schedules[i].name, f->mandate.schedule) == 0) {
                        evidence_schedule_from_config(&re->cfg->schedules[i], es);
                        return true;
                }
        return false;
}

static int64_t now_ms(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_REALTIME, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The record as the line recovery would append, without its '\n'; NULL on
 * an encoding failure (described in *err). */
static char *encode_record(const struct wal_record *rec, int *err)
{
        struct kbuf b = KBUF_INIT;

        *err = wal_encode(rec, now_ms(), &b);
        if (*err < 0) {
                kbuf_free(&b);
                return NULL;
        }
        if (b.len && b.data[b.len - 1] == '\n')
                b.data[--b.len] = '\0';
        return kbuf_steal(&b);
}

static int cmp_names(const void *a, const void *b)
{
        return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool has_wal_suffix(const char *name)
{
        size_t n = strlen(name), s = strlen(WAL_SUFFIX);
        return n > s && strcmp(name + n - s, WAL_SUFFIX) == 0;
}

/* Sorted names of the *.wal.jsonl regular files in dir, and of the spares
 * kairosd would adopt as WALs (wal_spare_peek).  -errno. */
static int list_wals(const char *dir, char ***out, size_t *count)
{
        DIR *d = opendir(dir);
        struct dirent *de;
        char **names = NULL;
        size_t n = 0, cap = 0;
        int r = 0;

        if (!d)
                return -errno;
        while ((de = readdir(d))) {
                char id[256];
                enum wal_spare_found sf;
                if (!has_wal_suffix(de->d_name) &&
                    !(wal_spare_name(de->d_name) &&
                      wal_spare_peek(dir, de->d_name, &sf, id, sizeof id) == 0 &&
                      sf == WAL_SPARE_ADOPTED))
                        continue;
                struct stat st;
                if (fstatat(dirfd(d), de->d_name, &st, 0) == 0 && !S_ISREG(st.st_mode))
                        continue;
                if (n == cap) {
                        size_t ncap = cap ? cap * 2 : 16;
                        char **p = realloc(names, ncap * sizeof(*p));
                        if (!p) {
                                r = -ENOMEM;
                                break;
                        }
                        names = p;
                        cap = ncap;
                }
                if (!(names[n] = strdup(de->d_name))) {
                        r = -ENOMEM;
                        break;
                }
                n++;
        }
        closedir(d);
        if (r < 0) {
                kmem_free_strv(names, n);
                return r;
        }
        if (n)
                qsort(names, n, sizeof(*names), cmp_names);
        *out = names;
        *count = n;
        return 0;
}

static void put_record_line(const char *indent, const struct wal_record *rec)
{
        int err;
        char *line = encode_record(rec, &err);

        printf("%swould append: ", indent);
        if (line)
                ctl_put_safe(stdout, line);
        else
                printf("(cannot encode: %s)", strerror(-err));
        putchar('\n');
        free(line);
}

static json_t *record_json(const struct wal_record *rec)
{
        int err;
        char *line = encode_record(rec, &err);
        json_t *v = line ? json_string(line) : json_null();

        free(line);
        return v ? v : json_null();
}

static json_t *evidence_json(const struct verdict *v)
{
        struct kbuf b = KBUF_INIT;
        json_t *j = NULL;

        if (verdict_evidence_json(v, &b) == 0 && b.data)
                j = ctl_json_raw(b.data);
        kbuf_free(&b);
        return j ? j : json_null();
}

/* A step only its probe can decide: run it (offline), say what it said, and
 * decide again with its word added to the evidence ev.  *dr is replaced. */
static int recover_probe(const struct config *cfg, const struct fold *f, bool had_summary,
                         const struct recovery_evidence *ev, struct decide_recovery *dr,
                         json_t *jf)
{
        const struct config_schedule *sc = NULL;
        for (size_t i = 0; i < cfg->nschedules; i++)
                if (strcmp(cfg->schedules[i].name, f->mandate.schedule) == 0)
                        sc = &cfg->schedules[i];
        struct probe_word w = { .probe = RECOVERY_PROBE_NONE };
        char *step = strdup(dr->probe_step);
        /* the store's evidence of every step, and the probe's word on its step */
        struct recovery_step_evidence *steps = calloc(ev->nsteps + 1, sizeof(*steps));
        int r = step && sc && steps ? ctl_probe_run(cfg, sc, f, step, NULL, &w) : -ENOMEM;
        if (r < 0) {
                free(steps);
                free(step);
                return r;
        }
        if (jf) {
                json_object_set_new(jf, "probe",
                                    json_pack("{s:o,s:s,s:o,s:o}", "step", ctl_json_str(step),
                                              "said", probe_word_name(w.probe), "result",
                                              w.result_json ? ctl_json_raw(w.result_json)
                                                            : json_null(),
                                              "output", ctl_json_str(w.output)));
        } else {
                printf("  probe of ");
                ctl_put_safe(stdout, step);
                printf(" said %s", probe_word_name(w.probe));
                if (w.result_json || w.output) {
                        printf(": ");
                        ctl_put_safe(stdout, w.result_json ? w.result_json : w.output);
                }
                putchar('\n');
        }
        size_t n = ev->nsteps, k = n;
        for (size_t i = 0; i < n; i++) {
                steps[i] = ev->steps[i];
                if (steps[i].step_id && strcmp(steps[i].step_id, step) == 0)
                        k = i;
        }
        if (k == n)
                steps[n++] = (struct recovery_step_evidence){ .step_id = step };
        steps[k].probe = w.probe;
        steps[k].probe_result_json = w.result_json;
        steps[k].probe_output = w.output;
        struct recovery_evidence with = *ev;
        with.steps = steps;
        with.nsteps = n;
        decide_recovery_release(dr);
        r = decide_recover(f, had_summary, &with, dr);
        /* (the decision keeps its own copies of what it took from w) */
        probe_word_clear(&w);
        free(steps);
        free(step);
        return r;
}

/* The step's interrupted calls with their own check (kairosctl tool run
 * --check), oldest first, run offline as kairosd runs them after its start;
 * each word settles its call in a copy of the evidence (done: completed,
 * not_started: released; the store itself is not touched) and the step is
 * decided again, until no check is left (Probe= is next) or one could not
 * say (tool_check_inconclusive).  *ix and *em are replaced (*own_ix: the
 * index this made, freed by the caller after *em). */
static int recover_checks(const struct config *cfg, const struct fold *f, bool had_summary,
                          const char *mid, const struct evidence_schedule *es,
                          const struct evidence_index **ix, struct evidence_index **own_ix,
                          struct evidence_mandate *em, struct decide_recovery *dr, json_t *jf)
{
        const struct config_schedule *sc = NULL;
        for (size_t i = 0; i < cfg->nschedules; i++)
                if (strcmp(cfg->schedules[i].name, f->mandate.schedule) == 0)
                        sc = &cfg->schedules[i];
        int r = 0;
        while (r == 0 && sc && dr->file == DECIDE_FILE_RECOVER &&
               dr->mandate == DECIDE_MANDATE_PROBING) {
                const struct evidence_call *c;
                size_t n = evidence_index_calls(*ix, mid, &c), k = n;
                char *step = strdup(dr->probe_step);
                if (!step)
                        return -ENOMEM;
                for (size_t i = 0; i < n && k == n; i++)
                        if (c[i].check && strcmp(c[i].step, step) == 0 &&
                            (c[i].state == IDEM_ST_INTERRUPTED ||
                             c[i].state == IDEM_ST_PROCESSING))
                                k = i;
                if (k == n) {
                        free(step);
                        break; /* none: Probe=, if any, is next */
                }
                struct ctl_check_call call = { .key = c[k].key, .tool = c[k].tool,
                                               .check = c[k].check };
                struct probe_word w = { .probe = RECOVERY_PROBE_NONE };
                r = ctl_probe_run(cfg, sc, f, step, &call, &w);
                if (r < 0) {
                        free(step);
                        return r;
                }
                if (jf) {
                        json_t *checks = json_object_get(jf, "checks");
                        if (!checks)
                                json_object_set_new(jf, "checks", checks = json_array());
                        json_array_append_new(
                                checks,
                                json_pack("{s:o,s:o,s:s,s:o,s:o}", "step", ctl_json_str(step),
                                          "key", ctl_json_str(c[k].key), "said",
                                          probe_word_name(w.probe), "result",
                                          w.result_json ? ctl_json_raw(w.result_json)
                                                        : json_null(),
                                          "output", ctl_json_str(w.output)));
                } else {
                        printf("  check of tool call ");
                        ctl_put_safe(stdout, c[k].key);
                        printf(" said %s", probe_word_name(w.probe));
                        if (w.result_json || w.output) {
                                printf(": ");
                                ctl_put_safe(stdout, w.result_json ? w.result_json : w.output);
                        }
                        printf(w.probe == RECOVERY_PROBE_DONE ? " (would complete the call)\n"
                               : w.probe == RECOVERY_PROBE_NOT_STARTED
                                       ? " (would release the call)\n"
                                       : "\n");
                }
                /* the calls as the check leaves them */
                struct evidence_call *copy = calloc(n ? n : 1, sizeof(*copy));
                size_t m = 0;
                for (size_t i = 0; copy && i < n; i++) {
                        if (i == k && w.probe == RECOVERY_PROBE_NOT_STARTED)
                                continue;
                        copy[m] = c[i];
                        if (i == k && w.probe == RECOVERY_PROBE_DONE)
                                copy[m].state = IDEM_ST_COMPLETED;
                        m++;
                }
                struct evidence_index *nix = NULL;
                r = copy ? evidence_index_from_calls(mid, copy, m, &nix) : -ENOMEM;
                free(copy);
                if (r == 0) {
                        evidence_mandate_release(em);
                        evidence_index_free(*own_ix);
                        *own_ix = nix;
                        *ix = nix;
                        r = evidence_for_mandate(nix, mid, es, em);
                }
                for (size_t i = 0; r == 0 && w.probe == RECOVERY_PROBE_FAILED && i < em->n; i++)
                        if (strcmp(em->steps[i].step_id, step) == 0) {
                                em->steps[i].check = RECOVERY_PROBE_FAILED;
                                em->steps[i].check_key = call.key;
                                em->steps[i].check_output = w.output;
                        }
                if (r == 0) {
                        decide_recovery_release(dr);
                        r = decide_recover(f, had_summary, &em->ev, dr);
                }
                /* (the decision keeps its own copies of what it took) */
                for (size_t i = 0; i < em->n; i++) {
                        em->steps[i].check_key = NULL;
                        em->steps[i].check_output = NULL;
                }
                bool stop = w.probe == RECOVERY_PROBE_FAILED;
                probe_word_clear(&w);
                free(step);
                if (stop)
                        break;
        }
        return r;
}

static void recover_plan_text(const struct fold *f, const struct recovery_plan *rp,
                              const struct evidence_schedule *es)
{
        const struct fold_plan *p = &f->plans[rp->plan];

        printf("  plan ");
        ctl_put_safe(stdout, p->plan_id);
        printf(" (cycle %lld, mandate ", p->cycle);
        ctl_put_safe(stdout, p->mandate_id);
        printf("): %s\n", recovery_outcome_name(rp->outcome));
        for (size_t i = 0; i < rp->ndecisions; i++) {
                const struct recovery_decision *d = &rp->decisions[i];
                const struct fold_step *s = &f->steps[d->step];
                printf("    ");
                ctl_put_safe(stdout, s->step_id);
                printf(" (status ");
                ctl_put_safe(stdout, s->status ? s->status : "none");
                printf("): %s, row %d, ", verdict_kind_name(d->verdict.kind), d->verdict.row);
                ctl_put_safe(stdout, d->verdict.reason);
                printf(" (from %s)\n", evidence_source_name(&d->verdict));
                if (d->has_record)
                        put_record_line("      ", &d->record);
                else
                        printf("      no record\n");
        }
        if (rp->has_finalize)
                put_record_line("    ", &rp->finalize);
        switch (rp->outcome) {
        case RECOVERY_RESUME:
                printf("    -> resumes at ");
                ctl_put_safe(stdout, rp->resume_step < f->nsteps ? f->steps[rp->resume_step].step_id
                                                                 : NULL);
                putchar('\n');
                break;
        case RECOVERY_PAUSED_REVIEW:
                printf("    -> mandate paused_review at ");
                ctl_put_safe(stdout, rp->pause_step);
                printf(" (");
                ctl_put_safe(stdout, rp->pause_reason);
                printf(")\n");
                break;
        case RECOVERY_FINALIZED_FAILED:
                printf("    -> plan finalized failed\n");
                break;
        case RECOVERY_FINALIZED_SUCCEEDED:
                printf("    -> plan finalized succeeded; the mandate goes on or ends\n");
                break;
        case RECOVERY_AWAIT_PROBE:
                printf("    -> would run the probe for ");
                ctl_put_safe(stdout, rp->probe_step);
                printf(" (kairosd runs it, or first the checks of the step's interrupted tool "
                       "calls, after READY=1; the mandate is probing meanwhile; --probe runs "
                       "them now)\n");
                break;
        }
}

static json_t *recover_plan_json(const struct fold *f, const struct recovery_plan *rp,
                                 const struct evidence_schedule *es)
{
        const struct fold_plan *p = &f->plans[rp->plan];
        json_t *o = json_object(), *ds = json_array();

        if (!o || !ds) {
                json_decref(o);
                json_decref(ds);
                return NULL;
        }
        json_object_set_new(o, "plan_id", ctl_json_str(p->plan_id));
        json_object_set_new(o, "mandate_id", ctl_json_str(p->mandate_id));
        json_object_set_new(o, "cycle", json_integer(p->cycle));
        json_object_set_new(o, "outcome", json_string(recovery_outcome_name(rp->outcome)));
        json_object_set_new(o, "resume_step",
                            rp->outcome == RECOVERY_RESUME && rp->resume_step < f->nsteps
                                    ? ctl_json_str(f->steps[rp->resume_step].step_id)
                                    : json_null());
        json_object_set_new(o, "pause_step", ctl_json_str(rp->pause_step));
        json_object_set_new(o, "pause_reason", ctl_json_str(rp->pause_reason));
        json_object_set_new(o, "probe_step", rp->outcome == RECOVERY_AWAIT_PROBE
                                                     ? ctl_json_str(rp->probe_step)
                                                     : json_null());
        for (size_t i = 0; i < rp->ndecisions; i++) {
                const struct recovery_decision *d = &rp->decisions[i];
                const struct fold_step *s = &f->steps[d->step];
                json_t *j = json_object();
                if (!j)
                        continue;
                json_object_set_new(j, "step_id", ctl_json_str(s->step_id));
                json_object_set_new(j, "status", ctl_json_str(s->status));
                json_object_set_new(j, "verdict", json_string(verdict_kind_name(d->verdict.kind)));
                json_object_set_new(j, "row", json_integer(d->verdict.row));
                json_object_set_new(j, "reason", ctl_json_str(d->verdict.reason));
                json_object_set_new(j, "source", json_string(evidence_source_name(&d->verdict)));
                json_object_set_new(j, "evidence", evidence_json(&d->verdict));
                json_object_set_new(j, "record", d->has_record ? record_json(&d->record)
                                                               : json_null());
                json_array_append_new(ds, j);
        }
        json_object_set_new(o, "decisions", ds);
        json_object_set_new(o, "finalize", rp->has_finalize ? record_json(&rp->finalize)
                                                            : json_null());
        return o;
}

/* One WAL file: print (or add to jfiles) what recovery would do. */
static void recover_file(const char *state_dir, const char *dir, const char *name,
                         const struct recover_evidence *re, json_t *jfiles,
                         struct recover_totals *t)
{
        struct loaded_wal w;
        struct decide_recovery dr = { .recovery = NULL };
        struct evidence_mandate em = { .n = 0 };
        struct evidence_index *own_ix = NULL;
        struct evidence_schedule es_buf, *es = NULL;
        const struct recovery *rec = NULL;
        json_t *jf = NULL, *jplans = NULL;
        char *path;
        int r;

        t->files++;
        if (asprintf(&path, "%s/%s", dir, name) < 0) {
                t->unreadable++;
                return;
        }
        fflush(stdout);
        if (load_wal(path, &w) != 0) {
                t->unreadable++;
                if (jfiles)
                        json_array_append_new(jfiles,
                                              json_pack("{s:o,s:s}", "file", ctl_json_str(path),
                                                        "status", "unreadable"));
                free(path);
                return;
        }
        const struct fold *f = w.fold;
        const char *action = f->status == FOLD_CORRUPT ? "quarantine"
                           : f->status == FOLD_TORN    ? "repair_torn_tail"
                                                       : NULL;
        if (jfiles) {
                jf = json_pack("{s:o,s:s,s:o,s:o}", "file", ctl_json_str(path), "status",
                               fold_status_name(f->status), "problem", problem_json(&w), "action",
                               ctl_json_str(action));
                jplans = json_array();
        } else {
                ctl_put_safe(stdout, path);
                printf(": %s", fold_status_name(f->status));
                if (f->status != FOLD_CLEAN) {
                        printf(", ");
                        print_problem(&w);
                }
                putchar('\n');
        }

        if (f->status == FOLD_CORRUPT) {
                t->corrupt++;
                if (!jfiles)
                        printf("  would quarantine the file: no appends, its mandate paused "
                               "(wal_corrupt)\n");
                goto out;
        }
        if (f->status == FOLD_TORN) {
                t->torn++;
                if (!jfiles)
                        printf("  would cut the torn tail (%zu bytes, kept in %s.torn.<seconds>)\n",
                               torn_bytes(&w), name);
        } else {
                t->clean++;
        }

        /* A summary (mandates/ID.json) says the mandate ran and ended. */
        char *summary = NULL;
        size_t nl = strlen(name) - strlen(WAL_SUFFIX);
        bool had_summary = false;
        if (asprintf(&summary, "%s/mandates/%.*s.json", state_dir, (int)nl, name) >= 0) {
                had_summary = access(summary, F_OK) == 0;
                free(summary);
        }
        /* the same evidence kairosd would use (see src/daemon/recover.c) */
        if (schedule_evidence(re, f, &es_buf)) {
                es = &es_buf;
                /* the mandate is the file's name, as kairosd names it */
                char *mid = strndup(name, strlen(name) - strlen(WAL_SUFFIX));
                r = mid ? evidence_for_mandate(re->ix, mid, es, &em) : -ENOMEM;
                free(mid);
        } else {
                r = 0;
        }
        if (r == 0)
                r = decide_recover(f, had_summary, es ? &em.ev : NULL, &dr);
        if (r == 0 && re->probe && es && dr.file == DECIDE_FILE_RECOVER &&
            dr.mandate == DECIDE_MANDATE_PROBING) {
                /* the calls' own checks first, then Probe= */
                const struct evidence_index *ix = re->ix;
                char *mid = strndup(name, strlen(name) - strlen(WAL_SUFFIX));
                r = mid ? recover_checks(re->cfg, f, had_summary, mid, es, &ix, &own_ix, &em,
                                         &dr, jf)
                        : -ENOMEM;
                free(mid);
                if (r == 0 && dr.file == DECIDE_FILE_RECOVER &&
                    dr.mandate == DECIDE_MANDATE_PROBING) {
                        const struct config_schedule *sc = config_find_schedule(
                                re->cfg, f->mandate.schedule);
                        if (sc && sc->probe && *sc->probe)
                                r = recover_probe(re->cfg, f, had_summary, &em.ev, &dr, jf);
                }
        }
        if (r < 0) {
                if (jfiles)
                        json_object_set_new(jf, "error", json_string(strerror(-r)));
                else
                        printf("  cannot plan recovery: %s\n", strerror(-r));
                goto out;
        }
        if (dr.file == DECIDE_FILE_REMOVE) {
                t->removed++;
                if (jfiles)
                        json_object_set_new(jf, "action", json_string("remove"));
                else
                        printf("  would remove the file: no plan, a fire that was never "
                               "acknowledged\n");
                goto out;
        }
        rec = dr.recovery;
        if (!jfiles && rec->nplans == 0)
                printf("  nothing to recover (%zu plan%s, all finalized)\n", f->nplans,
                       f->nplans == 1 ? "" : "s");
        for (size_t i = 0; i < rec->nplans; i++) {
                const struct recovery_plan *rp = &rec->plans[i];
                t->unfinished++;
                if ((unsigned)rp->outcome < 5)
                        t->outcomes[rp->outcome]++;
                /* (with --probe the probe ran: its word decided) */
                t->would_probe += rp->outcome == RECOVERY_AWAIT_PROBE;
                if (jfiles)
                        json_array_append_new(jplans, recover_plan_json(f, rp, es));
                else
                        recover_plan_text(f, rp, es);
        }
        t->records += recovery_record_count(rec);
out:
        if (jf) {
                json_object_set_new(jf, "plans", jplans ? jplans : json_array());
                json_array_append_new(jfiles, jf);
        } else {
                json_decref(jplans);
        }
        decide_recovery_release(&dr);
        evidence_mandate_release(&em);
        evidence_index_free(own_ix);
        loaded_wal_free(&w);
        free(path);
}

/* The configuration: --config, else the default one if it exists, else
 * none (every mandate is then decided from its WAL alone).  Returns 0 or an
 * exit status (errors printed). */
static int recover_config(const char *path, const char *state_dir, struct config **ret)
{
        struct config_errors errs = { 0 };
        bool explicit = path != NULL;
        *ret = NULL;
        if (!path) {
                if (access(CTL_DEFAULT_CONFIG, F_OK) != 0)
                        return 0;
                path = CTL_DEFAULT_CONFIG;
        }
        int r = config_load(path, state_dir, ret, &errs);
        if (r < 0) {
                size_t n = errs.n;
                for (size_t i = 0; i < errs.n; i++)
                        fprintf(stderr, "kairosctl: %s\n", errs.msgs[i]);
                config_errors_free(&errs);
                if (!explicit) {
                        /* not asked for: decide from the WALs alone, and say so */
                        fprintf(stderr, "kairosctl: recover: %s cannot be used; every mandate "
                                "is decided from its WAL alone (give a configuration with "
                                "--config)\n", path);
                        *ret = NULL;
                        return 0;
                }
                if (n == 0)
                        return ctl_file_error(path, -r);
                if (r != -EINVAL)  /* printed above: it cannot be read */
                        return CTL_EXIT_NOINPUT;
                return ctl_error(CTL_EXIT_DATAERR, "recover: the configuration %s has errors",
                                 path);
        }
        config_errors_free(&errs);
        return 0;
}

/* The idempotency store as kairosd would load it at its start, read without
 * changing anything; *ret_word says how it went. */
static int recover_idem(const char *state_dir, const struct config *cfg,
                        struct evidence_index **ret_ix, const char **ret_word,
                        struct idem_load_info *info)
{
        struct idem_options opt = { .ttl_sec = cfg ? (int64_t)cfg->idem_ttl_sec : 0,
                                    .capacity = cfg ? cfg->idem_max_entries : 0 };
        struct idem_store *s = NULL;
        char *dir = NULL;
        int r;
        *ret_word = "unreadable";
        if (asprintf(&dir, "%s/idem", state_dir) < 0)
                return -ENOMEM;
        if ((r = idem_store_new(&opt, &s)) < 0)
                goto out;
        r = idem_log_read(dir, s, info);
        if (r < 0 || info->corrupt) {
                *ret_word = r < 0 ? "unreadable" : "corrupt";
                r = evidence_index_unknown(ret_ix);
                goto out;
        }
        *ret_word = info->created ? "missing" : "loaded";
        r = evidence_index_build(s, ret_ix);
out:
        idem_store_free(s);
        free(dir);
        return r;
}

int ctl_cmd_recover(const struct ctl_opts *o, int argc, char **argv)
{
        const char *state_dir = NULL, *config_path = NULL;
        bool dry_run = false, probe = false;
        const struct ctl_option opts[] = {
                { "dry-run", false, NULL, &dry_run },
                { "state-dir", true, &state_dir, NULL },
                { "probe", false, NULL, &probe },
                { "config", true, &config_path, NULL },
                { NULL, false, NULL, NULL },
        };
        struct config *cfg = NULL;
        struct recover_evidence re = { NULL, NULL, false };
        struct idem_load_info iinfo;
        const char *idem_word = "unreadable";
        struct recover_totals t = { 0 };
        char **names = NULL, *waldir = NULL;
        size_t n = 0;
        json_t *jfiles = NULL;
        int npos, r;

        r = ctl_parse_options("recover", argc, argv, opts, &npos);
        if (r)
                return r;
        if (npos > 0)
                return ctl_usage_error("recover: unexpected argument '%s'", argv[0]);
        if (!dry_run)
                return ctl_usage_error("recover needs --dry-run: recovery itself runs inside "
                                       "kairosd at startup");
        if (state_dir && !*state_dir)
                return ctl_usage_error("recover: --state-dir needs a directory");
        if (config_path && !*config_path)
                return ctl_usage_error("recover: --config needs a file");
        r = canon_init();
        if (r < 0)
                return ctl_errno_error("canon_init", r);
        if ((r = recover_config(config_path, state_dir, &cfg)) != 0)
                return r;
        if (!state_dir)
                state_dir = cfg ? cfg->state_directory : CTL_DEFAULT_STATE_DIR;
        re.cfg = cfg;
        re.probe = probe;
        if (probe && !cfg) {
                r = ctl_usage_error("recover: --probe needs the configuration (its Probe= "
                                    "commands): none at " CTL_DEFAULT_CONFIG ", give --config");
                goto out;
        }

        struct stat st;
        if (stat(state_dir, &st) < 0) {
                r = ctl_file_error(state_dir, errno);
                goto out;
        }
        if (!S_ISDIR(st.st_mode)) {
                r = ctl_file_error(state_dir, ENOTDIR);
                goto out;
        }
        if (asprintf(&waldir, "%s/wal", state_dir) < 0) {
                waldir = NULL;
                r = ctl_errno_error("recover", -ENOMEM);
                goto out;
        }
        r = list_wals(waldir, &names, &n);
        if (r == -ENOENT) {
                r = 0;   /* a fresh state directory: nothing to recover */
        } else if (r < 0) {
                r = ctl_file_error(waldir, r);
                goto out;
        }
        if ((r = recover_idem(state_dir, cfg, &re.ix, &idem_word, &iinfo)) < 0) {
                r = ctl_errno_error("recover", r);
                goto out;
        }
        if (!evidence_index_known(re.ix))
                fprintf(stderr, "kairosctl: recover: the idempotency log in %s/idem is %s: tool "
                        "calls are not used as evidence (kairosd would use them if it can read "
                        "the log)\n", state_dir, idem_word);

        if (o->json && !(jfiles = json_array())) {
                r = ctl_errno_error("json", -ENOMEM);
                goto out;
        }
        if (!jfiles) {
                printf("state directory: ");
                ctl_put_safe(stdout, state_dir);
                printf(" (%zu WAL file%s in ", n, n == 1 ? "" : "s");
                ctl_put_safe(stdout, waldir);
                printf(")\nconfiguration: ");
                ctl_put_safe(stdout, cfg ? (config_path ? config_path : CTL_DEFAULT_CONFIG)
                                         : "none (each mandate decided from its WAL alone)");
                printf("\nidempotency log: %s", idem_word);
                if (evidence_index_known(re.ix))
                        printf(" (%zu call%s owned by steps)", evidence_index_size(re.ix),
                               evidence_index_size(re.ix) == 1 ? "" : "s");
                putchar('\n');
        }
        for (size_t i = 0; i < n; i++)
                recover_file(state_dir, waldir, names[i], &re, jfiles, &t);

        if (jfiles) {
                json_t *top = json_pack(
                        "{s:o,s:o,s:{s:s,s:I},s:b,s:o,s:{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,"
                        "s:I,s:I}}",
                        "state_dir", ctl_json_str(state_dir), "config",
                        ctl_json_str(cfg ? (config_path ? config_path : CTL_DEFAULT_CONFIG)
                                         : NULL),
                        "idem", "log", idem_word, "owned_calls",
                        (json_int_t)evidence_index_size(re.ix), "dry_run", 1, "files", jfiles,
                        "summary", "would_probe", (json_int_t)t.would_probe,
                        "files", (json_int_t)t.files, "unreadable", (json_int_t)t.unreadable,
                        "torn", (json_int_t)t.torn, "corrupt", (json_int_t)t.corrupt,
                        "removed", (json_int_t)t.removed, "unfinished_plans", (json_int_t)t.unfinished, "resume",
                        (json_int_t)t.outcomes[RECOVERY_RESUME], "paused_review",
                        (json_int_t)t.outcomes[RECOVERY_PAUSED_REVIEW], "finalized_failed",
                        (json_int_t)t.outcomes[RECOVERY_FINALIZED_FAILED],
                        "finalized_succeeded",
                        (json_int_t)t.outcomes[RECOVERY_FINALIZED_SUCCEEDED], "records",
                        (json_int_t)t.records);
                jfiles = NULL;
                r = ctl_json_print(top);
        } else {
                printf("summary: %zu file%s (%zu clean, %zu torn tail%s to repair, %zu corrupt "
                       "to quarantine", t.files, t.files == 1 ? "" : "s", t.clean, t.torn,
                       t.torn == 1 ? "" : "s", t.corrupt);
                if (t.removed)
                        printf(", %zu never acknowledged to remove", t.removed);
                if (t.unreadable)
                        printf(", %zu unreadable", t.unreadable);
                printf("); %zu unfinished plan%s: %zu resume, %zu paused for review, %zu "
                       "finalized failed, %zu finalized succeeded; %zu record%s to append\n",
                       t.unfinished, t.unfinished == 1 ? "" : "s",
                       t.outcomes[RECOVERY_RESUME], t.outcomes[RECOVERY_PAUSED_REVIEW],
                       t.outcomes[RECOVERY_FINALIZED_FAILED],
                       t.outcomes[RECOVERY_FINALIZED_SUCCEEDED], t.records,
                       t.records == 1 ? "" : "s");
                if (t.would_probe)
                        printf("%zu step%s would be probed (Probe=) after kairosd's start\n",
                               t.would_probe, t.would_probe == 1 ? "" : "s");
                printf("dry run: nothing was changed\n");
                r = 0;
        }
        if (r == 0 && t.unreadable)
                r = CTL_EXIT_NOINPUT;
out:
        json_decref(jfiles);
        kmem_free_strv(names, n);
        free(waldir);
        evidence_index_free(re.ix);
        config_free(cfg);
        return r;
}

/* ---- canon ------------------------------------------------------------ */

int ctl_cmd_canon(const struct ctl_opts *o, int argc, char **argv)
{
        bool hash = false;
        const struct ctl_option opts[] = {
                { "hash", false, NULL, &hash },
                { NULL, false, NULL, NULL },
        };
        struct kbuf out = KBUF_INIT;
        struct kjson_error err = { 0 };
        char hex[CANON_HASH_STRLEN];
        const char *path;
        char *data = NULL;
        size_t len = 0;
        int npos, r;

        r = ctl_parse_options("canon", argc, argv, opts, &npos);
        if (r)
                return r;
        if (npos > 1)
                return ctl_usage_error("canon takes at most one FILE (or - for stdin)");
        path = npos == 1 ? argv[0] : "-";
        r = canon_init();
        if (r < 0)
                return ctl_errno_error("canon_init", r);
        r = ctl_read_file(path, &data, &len);
        if (r < 0)
                return ctl_file_error(path, r);

        r = canon_json(data, len, &out, &err);
        if (r == -EINVAL) {
                fputs("kairosctl: ", stderr);
                ctl_put_safe(stderr, strcmp(path, "-") == 0 ? "(stdin)" : path);
                fprintf(stderr, ": invalid JSON at byte offset %zu: %s\n", err.offset,
                        err.message ? err.message : kjson_error_string(err.code));
                r = CTL_EXIT_DATAERR;
                goto out;
        }
        if (r == -EDOM) {
                fputs("kairosctl: ", stderr);
                ctl_put_safe(stderr, strcmp(path, "-") == 0 ? "(stdin)" : path);
                fputs(": a number is out of range (NaN or Infinity cannot be canonical)\n",
                      stderr);
                r = CTL_EXIT_DATAERR;
                goto out;
        }
        if (r < 0) {
                r = ctl_errno_error("canon", r);
                goto out;
        }
        canon_hash_bytes(out.data ? out.data : "", out.len, hex);
        if (o->json) {
                json_t *j = json_object();
                if (j) {
                        json_t *c = out.data ? json_stringn(out.data, out.len) : json_string("");
                        json_object_set_new(j, "canonical", c ? c : json_null());
                        json_object_set_new(j, "hash", json_string(hex));
                }
                r = ctl_json_print(j);
        } else if (hash) {
                printf("%s\n", hex);
                r = 0;
        } else {
                fwrite(out.data ? out.data : "", 1, out.len, stdout);
                putchar('\n');
                r = 0;
        }
out:
        kbuf_free(&out);
        free(data);
        return r;
}

/* ---- plan ------------------------------------------------------------- */

static bool parse_cycle(const char *s, int *out)
{
        long v = 0;

        if (!*s || strlen(s) > 4)
                return false;
        for (const char *p = s; *p; p++) {
                if (*p < '0' || *p > '9')
                        return false;
                v = v * 10 + (*p - '0');
        }
        if (v < 1 || v > PLANNER_MAX_CYCLE)
                return false;
        *out = (int)v;
        return true;
}

int ctl_cmd_plan(const struct ctl_opts *o, int argc, char **argv)
{
        const char *name = NULL, *fired_at = NULL, *cycle_s = NULL, *retry_s = NULL;
        const struct ctl_option opts[] = {
                { "name", true, &name, NULL },
                { "fired-at", true, &fired_at, NULL },
                { "cycle", true, &cycle_s, NULL },
                { "retry", true, &retry_s, NULL },
                { NULL, false, NULL, NULL },
        };
        struct planner_plan p;
        int npos, cycle = 1, retry = 0, r;

        r = ctl_parse_options("plan", argc, argv, opts, &npos);
        if (r)
                return r;
        if (npos > 0)
                return ctl_usage_error("plan: unexpected argument '%s'", argv[0]);
        if (!name)
                return ctl_usage_error("plan needs --name NAME");
        if (!fired_at)
                return ctl_usage_error("plan needs --fired-at YYYY-MM-DDTHH:MM:SSZ");
        if (!planner_valid_name(name))
                return ctl_usage_error("plan: invalid schedule name '%s': use 1 to 64 of "
                                       "A-Z a-z 0-9 _ -", name);
        if (planner_parse_fired_at(fired_at, NULL) < 0)
                return ctl_usage_error("plan: invalid --fired-at '%s': need a real UTC time "
                                       "as YYYY-MM-DDTHH:MM:SSZ, e.g. 2026-04-20T12:00:00Z",
                                       fired_at);
        if (cycle_s && !parse_cycle(cycle_s, &cycle))
                return ctl_usage_error("plan: invalid --cycle '%s': need an integer 1..%d",
                                       cycle_s, PLANNER_MAX_CYCLE);
        if (retry_s && !parse_cycle(retry_s, &retry)) /* the same range: 1..999 */
                return ctl_usage_error("plan: invalid --retry '%s': need an integer 1..%d",
                                       retry_s, PLANNER_MAX_RETRY);
        r = canon_init();
        if (r < 0)
                return ctl_errno_error("canon_init", r);
        r = planner_build_retry(name, fired_at, retry, cycle, &p);
        if (r < 0)
                return ctl_errno_error("planner", r);

        if (o->json) {
                json_t *steps = json_array();
                for (int i = 0; steps && i < PLANNER_PHASES; i++) {
                        const struct planner_step *s = &p.steps[i];
                        json_array_append_new(
                                steps, json_pack("{s:s,s:s,s:s,s:s,s:s}", "step_id", s->step_id,
                                                 "tool", s->tool, "params_hash", s->params_hash,
                                                 "pre_hash", s->pre_hash, "expected_post_hash",
                                                 s->expected_post_hash));
                }
                return ctl_json_print(json_pack("{s:s,s:s,s:i,s:s,s:s,s:i,s:s,s:o}", "name",
                                                name, "fired_at", fired_at, "retry", retry,
                                                "plan_id", p.plan_id, "mandate_id",
                                                p.mandate_id, "cycle", p.cycle, "plan_hash",
                                                p.plan_hash, "steps", steps));
        }
        printf("plan_id     %s\nmandate_id  %s\ncycle       %d\nplan_hash   %s\nsteps:\n",
               p.plan_id, p.mandate_id, p.cycle, p.plan_hash);
        for (int i = 0; i < PLANNER_PHASES; i++) {
                const struct planner_step *s = &p.steps[i];
                printf("  %-11s %-13s params_hash=%s pre_hash=%s expected_post_hash=%s "
                       "idem_key=%s/%s\n",
                       s->step_id, s->tool, s->params_hash, s->pre_hash, s->expected_post_hash,
                       p.mandate_id, s->step_id);
        }
        return CTL_EXIT_OK;
}

/* ---- list and show --state-dir: the history without kairosd ----------- */

/* The mandates the state directory holds, as kairosd's registry would
 * after its start: finished ones from their summaries (mandates/), the
 * others from their WALs (wal/; a WAL next to a summary is the summary's).
 * Nothing is written: every file is opened read-only. */
struct offline_reg {
        struct statedir paths;
        struct showdoc_mandate *v;    /* oldest first once sorted */
        char **where;                 /* per row: its archive (finished) or WAL */
        bool *archived;
        size_t n, cap;
        json_t **summaries;           /* own the summary rows' strings */
        size_t nsummaries;
        struct fold **folds;          /* own the WAL rows' strings */
        size_t nfolds;
        char **ids;                   /* own the WAL rows' ids */
        struct strmap *known;         /* the ids read so far */
};

#define OFFLINE_INTERRUPTED_STATUS "interrupted"
#define OFFLINE_INTERRUPTED_REASON "kairosd is not running: its next start recovers this mandate"

static void offline_reg_free(struct offline_reg *g)
{
        for (size_t i = 0; i < g->n; i++)
                free(g->where[i]);
        for (size_t i = 0; i < g->nsummaries; i++)
                json_decref(g->summaries[i]);
        for (size_t i = 0; i < g->nfolds; i++) {
                fold_free(g->folds[i]);
                free(g->ids[i]);
        }
        FREE_ALL(g->v, g->where, g->archived, g->summaries, g->folds, g->ids);
        strmap_free(g->known);
        statedir_free(&g->paths);
}

static int offline_push(struct offline_reg *g, const struct showdoc_mandate *m, const char *where,
                        bool archived)
{
        if (g->n == g->cap) {
                size_t cap = g->cap ? g->cap * 2 : 64;
                struct showdoc_mandate *v = realloc(g->v, cap * sizeof(*v));
                if (v)
                        g->v = v;
                char **w = v ? realloc(g->where, cap * sizeof(*w)) : NULL;
                if (w)
                        g->where = w;
                bool *a = w ? realloc(g->archived, cap * sizeof(*a)) : NULL;
                if (!a)
                        return -ENOMEM;
                g->archived = a;
                g->cap = cap;
        }
        if (strmap_put(g->known, m->id, (void *)1) < 0)
                return -ENOMEM;
        if (!(g->where[g->n] = strdup(where)))
                return -ENOMEM;
        g->v[g->n] = *m;
        g->archived[g->n] = archived;
        g->n++;
        return 0;
}

static int cmp_rows_oldest_first(const void *a, const void *b)
{
        const struct showdoc_mandate *x = a, *y = b;
        return -showdoc_order(x->fired_key, x->fired_at, x->id, y->fired_key, y->fired_at, y->id);
}

/* Sort the rows with their where/archived alongside: an index sort. */
static int offline_sort(struct offline_reg *g)
{
        struct row { struct showdoc_mandate m; char *where; bool archived; } *t;
        if (!g->n)
                return 0;
        if (!(t = malloc(g->n * sizeof(*t))))
                return -ENOMEM;
        for (size_t i = 0; i < g->n; i++)
                t[i] = (struct row){ g->v[i], g->where[i], g->archived[i] };
        qsort(t, g->n, sizeof(*t), cmp_rows_oldest_first);
        for (size_t i = 0; i < g->n; i++) {
                g->v[i] = t[i].m;
                g->where[i] = t[i].where;
                g->archived[i] = t[i].archived;
        }
        free(t);
        return 0;
}

static bool offline_known(const struct offline_reg *g, const char *id)
{
        return strmap_get(g->known, id) != NULL;
}

/* A mandate without a summary: what its WAL says of it. */
static int offline_add_wal(struct offline_reg *g, const char *id, const char *path)
{
        struct fold *f = NULL;
        int r = fold_file(path, &f);
        if (r < 0)
                return r;
        struct fold **fs = realloc(g->folds, (g->nfolds + 1) * sizeof(*fs));
        char **ids = fs ? realloc(g->ids, (g->nfolds + 1) * sizeof(*ids)) : NULL;
        if (fs)
                g->folds = fs;
        if (ids)
                g->ids = ids;
        char *own = ids ? strdup(id) : NULL;
        if (!own) {
                fold_free(f);
                return -ENOMEM;
        }
        g->folds[g->nfolds] = f;
        g->ids[g->nfolds++] = own;
        const struct fold_plan *p = f->nplans ? &f->plans[f->nplans - 1] : NULL;
        struct showdoc_mandate m = {
                .id = own, .status = OFFLINE_INTERRUPTED_STATUS,
                .reason = OFFLINE_INTERRUPTED_REASON,
                .plan_id = p ? p->plan_id : NULL, .cycle = p ? p->cycle : 0,
                .schedule = f->mandate.schedule, .fired_at = f->mandate.fired_at,
                .fired_key = showdoc_fired_key(f->mandate.fired_at),
                .retry_of = f->mandate.retry_of, .retry = (int)f->mandate.retry,
        };
        /* started: when it was fired, its mandate record (or first record) */
        wal_parse_ts(f->mandate.ts ? f->mandate.ts : f->first_ts, &m.started_ms);
        return offline_push(g, &m, path, false);
}

/* Read the registry of state_dir.  0, or an exit status after saying why. */
static int offline_load(const char *state_dir, struct offline_reg *g)
{
        int r = statedir_init(&g->paths, state_dir);
        if (r < 0)
                return ctl_errno_error("state directory", r);
        if (!(g->known = strmap_new()))
                return ctl_error(CTL_EXIT_OSERR, "out of memory");
        struct stat st;
        if (stat(state_dir, &st) < 0)
                return ctl_file_error(state_dir, errno);
        if (!S_ISDIR(st.st_mode))
                return ctl_file_error(state_dir, ENOTDIR);
        DIR *dir = opendir(g->paths.mandates);
        if (!dir && errno != ENOENT)
                return ctl_file_error(g->paths.mandates, errno);
        for (struct dirent *de; dir && (de = readdir(dir));) {
                char id[256], *path = NULL, why[160];
                struct showdoc_mandate m;
                const char *archive;
                json_t *j;
                if (!statedir_entry_id(de->d_name, STATEDIR_SUMMARY_SUFFIX, id, sizeof id))
                        continue;
                if (statedir_summary_path(&g->paths, id, &path) < 0) {
                        closedir(dir);
                        return ctl_error(CTL_EXIT_OSERR, "out of memory");
                }
                r = showdoc_summary_read(path, &m, &archive, &j, why, sizeof why);
                if (r < 0) {
                        /* as kairosd does at its start: said and left out */
                        fputs("kairosctl: ignoring the mandate summary ", stderr);
                        ctl_put_safe(stderr, path);
                        fprintf(stderr, ": %s\n", why);
                        free(path);
                        continue;
                }
                free(path);
                if (offline_known(g, m.id)) {
                        json_decref(j);
                        continue;
                }
                json_t **s = realloc(g->summaries, (g->nsummaries + 1) * sizeof(*s));
                if (!s) {
                        json_decref(j);
                        closedir(dir);
                        return ctl_error(CTL_EXIT_OSERR, "out of memory");
                }
                g->summaries = s;
                g->summaries[g->nsummaries++] = j;
                if (offline_push(g, &m, archive, true) < 0) {
                        closedir(dir);
                        return ctl_error(CTL_EXIT_OSERR, "out of memory");
                }
        }
        if (dir)
                closedir(dir);
        dir = opendir(g->paths.wal);
        if (!dir && errno != ENOENT)
                return ctl_file_error(g->paths.wal, errno);
        for (struct dirent *de; dir && (de = readdir(dir));) {
                char id[256], *path = NULL;
                /* a new WAL whose rename a crash undid: still under its
                 * spare's name until kairosd starts (wal.h) */
                enum wal_spare_found sf;
                bool spare = wal_spare_name(de->d_name) &&
                             wal_spare_peek(g->paths.wal, de->d_name, &sf, id, sizeof id) == 0 &&
                             sf == WAL_SPARE_ADOPTED;
                if ((!spare && !statedir_entry_id(de->d_name, STATEDIR_WAL_SUFFIX, id,
                                                  sizeof id)) ||
                    offline_known(g, id))
                        continue;
                if (spare ? asprintf(&path, "%s/%s", g->paths.wal, de->d_name) < 0
                          : statedir_wal_path(&g->paths, id, &path) < 0) {
                        closedir(dir);
                        return ctl_error(CTL_EXIT_OSERR, "out of memory");
                }
                r = offline_add_wal(g, id, path);
                if (r == -ENOMEM) {
                        free(path);
                        closedir(dir);
                        return ctl_error(CTL_EXIT_OSERR, "out of memory");
                }
                if (r < 0) {
                        fputs("kairosctl: ignoring the WAL ", stderr);
                        ctl_put_safe(stderr, path);
                        fprintf(stderr, ": %s\n", strerror(-r));
                }
                free(path);
        }
        if (dir)
                closedir(dir);
        if (offline_sort(g) < 0)
                return ctl_error(CTL_EXIT_OSERR, "out of memory");
        return 0;
}

static void offline_row(void *ctx, size_t i, struct showdoc_mandate *ret)
{
        const struct offline_reg *g = ctx;
        *ret = g->v[i];
}

/* A refusal worded as kairosd's (the same message, code and exit status). */
static int offline_refuse(const struct ctl_opts *o, const char *code, json_t *detail,
                          const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int offline_refuse(const struct ctl_opts *o, const char *code, json_t *detail,
                          const char *fmt, ...)
{
        char msg[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        json_t *e = json_pack("{s:s, s:s}", "code", code, "message", msg);
        if (e && detail)
                json_object_set_new(e, "detail", detail);
        else
                json_decref(detail);
        if (!e)
                return ctl_error(CTL_EXIT_OSERR, "out of memory");
        int r = ctl_print_refusal(o, e);
        json_decref(e);
        return r;
}

int ctl_offline_list(const struct ctl_opts *o, const char *state_dir, json_t *args,
                     json_t **ret_result)
{
        struct offline_reg g = { 0 };
        const char *status = json_string_value(json_object_get(args, "status"));
        const char *after = json_string_value(json_object_get(args, "after"));
        struct showdoc_filter f = {
                .status = status,
                .schedule = json_string_value(json_object_get(args, "schedule")),
                .since = json_string_value(json_object_get(args, "since")),
        };
        size_t limit = (size_t)json_integer_value(json_object_get(args, "limit"));
        int r;
        *ret_result = NULL;
        if (status && !showdoc_status_known(status)) {
                char all[512] = "";
                size_t off = 0;
                for (size_t i = 0; showdoc_status_names[i] && off < sizeof all; i++)
                        off += (size_t)snprintf(all + off, sizeof all - off, "%s%s",
                                                i ? ", " : "", showdoc_status_names[i]);
                r = offline_refuse(o, "bad_argument", NULL,
                                   "args.status: no status '%s' (one of: %s)", status, all);
                goto out;
        }
        if ((r = offline_load(state_dir, &g)) != 0)
                goto out;
        for (size_t i = 0; after && i < g.n && !f.after; i++)
                if (strcmp(g.v[i].id, after) == 0)
                        f.after = &g.v[i];
        if (after && !f.after) {
                r = offline_refuse(o, "not_found", NULL, "args.after: no mandate %s (pruned?)",
                                   after);
                goto out;
        }
        bool any_of_schedule = !f.schedule;
        for (size_t i = 0; i < g.n && !any_of_schedule; i++)
                any_of_schedule = g.v[i].schedule && strcmp(g.v[i].schedule, f.schedule) == 0;
        if (!any_of_schedule) {
                /* no configuration read: a schedule without any mandate kept */
                r = offline_refuse(o, "not_found", NULL,
                                   "args.schedule: no mandate of schedule '%s' is kept in %s",
                                   f.schedule, state_dir);
                goto out;
        }
        struct showdoc_rows rows = { .n = g.n, .get = offline_row, .ctx = &g };
        if (showdoc_list(&rows, &f, limit, ret_result) < 0)
                r = ctl_error(CTL_EXIT_OSERR, "out of memory");
out:
        offline_reg_free(&g);
        return r;
}

/* The idempotency store as kairosd would load it, read without changing
 * anything; NULL when it cannot be read (show's tool_calls: null). */
static struct idem_store *offline_idem(const struct statedir *paths)
{
        struct idem_options opt = { 0 };
        struct idem_store *s = NULL;
        struct idem_load_info info;
        if (idem_store_new(&opt, &s) < 0)
                return NULL;
        if (idem_log_read(paths->idem, s, &info) < 0 || info.corrupt) {
                idem_store_free(s);
                return NULL;
        }
        return s;
}

int ctl_offline_show(const struct ctl_opts *o, const char *state_dir, const char *arg,
                     struct kjson_arena *a, const struct kjson **ret_result)
{
        struct offline_reg g = { 0 };
        struct fold *f = NULL;
        struct idem_store *store = NULL;
        json_t *res = NULL, *calls = NULL;
        struct kbuf text = KBUF_INIT;
        int r;
        *ret_result = NULL;
        if ((r = offline_load(state_dir, &g)) != 0)
                goto out;
        /* an id or a unique prefix of one */
        size_t found = 0, at = 0, len = strlen(arg);
        for (size_t i = 0; i < g.n; i++)
                if (strcmp(g.v[i].id, arg) == 0) {
                        found = 1;
                        at = i;
                        break;
                }
        if (!found)
                for (size_t i = 0; len && i < g.n; i++)
                        if (strncmp(g.v[i].id, arg, len) == 0 && found++ == 0)
                                at = i;
        if (!found) {
                r = offline_refuse(o, "not_found", NULL, "no mandate %s", arg);
                goto out;
        }
        if (found > 1) {
                json_t *list = json_array();
                struct kbuf b = KBUF_INIT;
                size_t shown = 0;
                for (size_t i = 0; i < g.n && shown < 10; i++)
                        if (strncmp(g.v[i].id, arg, len) == 0) {
                                json_array_append_new(list, json_string(g.v[i].id));
                                kbuf_printf(&b, "\n  %s", g.v[i].id);
                                shown++;
                        }
                r = offline_refuse(o, "ambiguous", json_pack("{s:o}", "candidates", list),
                                   "mandate prefix '%s' is ambiguous; candidates:%s%s", arg,
                                   b.data ? b.data : "", found > 10 ? "\n  ..." : "");
                kbuf_free(&b);
                goto out;
        }
        const struct showdoc_mandate *m = &g.v[at];
        r = showdoc_fold_file(g.where[at], g.archived[at], &f);
        if (r < 0) {
                char msg[PATH_MAX + 64];
                snprintf(msg, sizeof msg, "cannot read %s: %s", g.where[at], strerror(-r));
                r = offline_refuse(o, r == -ENOENT ? "not_found" : "wal_io_error", NULL, "%s",
                                   msg);
                goto out;
        }
        /* the document kairosd's show makes (commands.c, OP_SHOW) */
        res = showdoc_fold_json(f);
        store = offline_idem(&g.paths);
        calls = store ? showdoc_calls_json(store, m->id) : NULL;
        showdoc_set_tool_calls(res, calls);
        json_t *mj = showdoc_mandate_json(m);
        if (mj && m->retry_of) {
                json_object_set_new(mj, "retry_of", json_string(m->retry_of));
                json_object_set_new(mj, "retry", json_integer(m->retry));
        }
        struct showdoc_rows rows = { .n = g.n, .get = offline_row, .ctx = &g };
        json_object_set_new(mj, "retried_by", showdoc_retried_by(&rows, m->id));
        json_object_set_new(mj, "fired_at", m->fired_at ? json_string(m->fired_at) : json_null());
        json_object_update_missing(res, mj);
        json_decref(mj);
        json_object_set_new(res, "status", json_string(m->status));
        struct kjson *v = NULL;
        struct kjson_error jerr;
        if (showdoc_print(res, &text) < 0 ||
            kjson_parse(a, text.data, text.len, &v, &jerr) < 0) {
                r = ctl_error(CTL_EXIT_OSERR, "out of memory");
                goto out;
        }
        *ret_result = v;
        r = 0;
out:
        kbuf_free(&text);
        json_decref(res);
        json_decref(calls);
        idem_store_free(store);
        fold_free(f);
        offline_reg_free(&g);
        return r;
}
