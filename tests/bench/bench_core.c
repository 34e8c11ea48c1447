/* SPDX-License-Identifier: MIT */
/* bench_core: the core benchmark (run by hand, not a test).
 *
 *   build/tests/bench/bench_core [--dir DIR] [--records N] [--cycles C] [--fold-mb M]
 *
 * In one run, on one disk:
 *   (a) durable appends/s of the WAL writer, wal_flush after every record;
 *   (b) the baseline: write(2) + fdatasync(2) of the same bytes, O_APPEND;
 *   (c) SQLite, journal_mode=WAL, synchronous=FULL, one INSERT per
 *       transaction of the same bytes (when built with sqlite3);
 *   (d) fdatasync calls per five-step cycle under the durability barrier;
 *   (e) fold throughput over at least M MB of realistic WAL.
 * (a), (b) and (c) run interleaved in chunks of 25 records, rotating which goes
 * first, so drift and noise of a shared disk hit all three alike. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#ifdef HAVE_SQLITE3
#include <sqlite3.h>
#endif

#include "kairos/canon.h"
#include "kairos/fold.h"
#include "kairos/kbuf.h"
#include "kairos/planner.h"
#include "kairos/wal.h"

#ifndef BENCH_DEFAULT_DIR
#define BENCH_DEFAULT_DIR "/var/tmp"
#endif

#define WARMUP 20
#define CHUNK 25          /* records per interleaved chunk */
#define STEP_ID "act_001"

struct bench {
        const char *dir_arg;
        char dir[4096];
        long records;
        long cycles;
        long fold_mb;
        char line[1024];       /* the record (a completed transition), with '\n' */
        size_t line_len;
        const char *post_hash;
        char result_hash[CANON_HASH_STRLEN];
        const char *result_json;
};

static double now_s(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int64_t now_ms(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_REALTIME, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void die(const char *what, int err)
{
        fprintf(stderr, "bench_core: %s: %s\n", what, strerror(err < 0 ? -err : err));
        exit(1);
}

static void usage(void)
{
        printf("Usage: bench_core [--dir DIR] [--records N] [--cycles C] [--fold-mb M]\n"
               "  --dir DIR      where to write (a temp dir is made inside) [%s]\n"
               "  --records N    durable records per method [2000]\n"
               "  --cycles C     five-step cycles for the flush count [20]\n"
               "  --fold-mb M    MB of WAL to fold [50]\n",
               BENCH_DEFAULT_DIR);
}

static long parse_long(const char *opt, const char *v, long min)
{
        char *end;
        long n;

        errno = 0;
        n = strtol(v, &end, 10);
        if (errno || *end || end == v || n < min) {
                fprintf(stderr, "bench_core: %s needs an integer >= %ld\n", opt, min);
                exit(64);
        }
        return n;
}

static void parse_args(struct bench *b, int argc, char **argv)
{
        for (int i = 1; i < argc; i++) {
                const char *a = argv[i];
                if (strcmp(a, "--help") == 0) {
                        usage();
                        exit(0);
                }
                if (i + 1 >= argc) {
                        fprintf(stderr, "bench_core: unknown option or missing value: %s\n", a);
                        exit(64);
                }
                if (strcmp(a, "--dir") == 0)
                        b->dir_arg = argv[++i];
                else if (strcmp(a, "--records") == 0)
                        b->records = parse_long(a, argv[++i], 1);
                else if (strcmp(a, "--cycles") == 0)
                        b->cycles = parse_long(a, argv[++i], 1);
                else if (strcmp(a, "--fold-mb") == 0)
                        b->fold_mb = parse_long(a, argv[++i], 1);
                else {
                        fprintf(stderr, "bench_core: unknown option %s\n", a);
                        exit(64);
                }
        }
}

static const char *fs_name(long type)
{
        switch ((unsigned long)type) {
        case 0xEF53: return "ext2/3/4";
        case 0x58465342: return "xfs";
        case 0x9123683E: return "btrfs";
        case 0x01021994: return "tmpfs";
        case 0x794c7630: return "overlayfs";
        case 0x2fc12fc1: return "zfs";
        case 0x6969: return "nfs";
        case 0x65735546: return "fuse";
        default: return "unknown";
        }
}

static void setup_dir(struct bench *b)
{
        struct statfs sf;
        char tmpl[4096];

        snprintf(tmpl, sizeof(tmpl), "%s/kairos-bench.XXXXXX", b->dir_arg);
        if (!mkdtemp(tmpl))
                die(tmpl, errno);
        snprintf(b->dir, sizeof(b->dir), "%s", tmpl);
        if (statfs(b->dir, &sf) < 0)
                die("statfs", errno);
        printf("dir: %s (%s)\n", b->dir, fs_name((long)sf.f_type));
        if ((unsigned long)sf.f_type == 0x01021994UL)
                printf("WARNING: tmpfs: fdatasync is free here, the durable figures mean "
                       "nothing; use --dir on a real disk\n");
}

static void path_in(const struct bench *b, const char *name, char *out, size_t n)
{
        snprintf(out, n, "%s/%s", b->dir, name);
}

/* The record every method writes: a completed transition with a small
 * result, as the executor writes after a handler. */
static void make_record(struct bench *b)
{
        static const char result[] =
                "{\"deployed\":true,\"version\":\"2026.04.20-1\",\"hosts\":[\"web-1\",\"web-2\","
                "\"web-3\"],\"duration_ms\":4182}";
        struct planner_plan p;
        struct kbuf out = KBUF_INIT;
        int r;

        r = planner_build("bench", "2026-04-20T12:00:00Z", 1, &p);
        if (r < 0)
                die("planner_build", r);
        static char post[CANON_HASH_STRLEN];
        memcpy(post, p.steps[PHASE_ACT].expected_post_hash, sizeof(post));
        b->post_hash = post;
        b->result_json = result;
        r = canon_hash_json(result, strlen(result), b->result_hash, NULL);
        if (r < 0)
                die("canon_hash_json", r);
        struct wal_record rec = {
                .op = WAL_OP_COMPLETED,
                .step_id = STEP_ID,
                .post_hash = b->post_hash,
                .result_hash = b->result_hash,
                .result_json = b->result_json,
        };
        r = wal_encode(&rec, now_ms(), &out);
        if (r < 0)
                die("wal_encode", r);
        if (out.len >= sizeof(b->line))
                die("record too long", E2BIG);
        memcpy(b->line, out.data, out.len);
        b->line_len = out.len;
        kbuf_free(&out);
}

/* ---- (c) SQLite ------------------------------------------------------- */

#ifdef HAVE_SQLITE3
struct sql {
        sqlite3 *db;
        sqlite3_stmt *st;
};

static void sql_exec(sqlite3 *db, const char *sql)
{
        char *err = NULL;

        if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK) {
                fprintf(stderr, "bench_core: sqlite: %s: %s\n", sql, err ? err : "?");
                exit(1);
        }
}

static void sql_open(const struct bench *b, struct sql *q)
{
        char path[4200];

        path_in(b, "bench.sqlite", path, sizeof(path));
        if (sqlite3_open(path, &q->db) != SQLITE_OK)
                die("sqlite3_open", EIO);
        sql_exec(q->db, "PRAGMA journal_mode=WAL");
        sql_exec(q->db, "PRAGMA synchronous=FULL");
        sql_exec(q->db, "CREATE TABLE log(id INTEGER PRIMARY KEY, rec BLOB NOT NULL)");
        if (sqlite3_prepare_v2(q->db, "INSERT INTO log(rec) VALUES(?)", -1, &q->st, NULL) !=
            SQLITE_OK)
                die("sqlite3_prepare_v2", EIO);
}

/* One INSERT per (autocommit) transaction. */
static double sql_chunk(const struct bench *b, struct sql *q, long n)
{
        double t0 = now_s();

        for (long i = 0; i < n; i++) {
                sqlite3_bind_blob(q->st, 1, b->line, (int)b->line_len, SQLITE_STATIC);
                if (sqlite3_step(q->st) != SQLITE_DONE)
                        die("sqlite3_step", EIO);
                sqlite3_reset(q->st);
        }
        return now_s() - t0;
}

static void sql_close(struct sql *q)
{
        sqlite3_finalize(q->st);
        sqlite3_close(q->db);
}
#endif

/* ---- (a) + (b) (+ (c)), interleaved ---------------------------------- */

static void check(int r, const char *what)
{
        if (r < 0)
                die(what, r);
}


static double wal_chunk(const struct bench *b, struct wal *w, long n)
{
        double t0 = now_s();

        for (long i = 0; i < n; i++) {
                int r = wal_mark_completed(w, STEP_ID, b->post_hash, b->result_hash, false, NULL,
                                           b->result_json);
                if (r < 0)
                        die("wal_mark_completed", r);
                r = wal_flush(w);
                if (r < 0)
                        die("wal_flush", r);
        }
        return now_s() - t0;
}

static double raw_chunk(const struct bench *b, int fd, long n)
{
        double t0 = now_s();

        for (long i = 0; i < n; i++) {
                ssize_t k = write(fd, b->line, b->line_len);
                if (k != (ssize_t)b->line_len)
                        die("write", k < 0 ? errno : EIO);
                if (fdatasync(fd) < 0)
                        die("fdatasync", errno);
        }
        return now_s() - t0;
}

static void bench_append(const struct bench *b, double *wal_rate, double *raw_rate,
                         double *sql_rate)
{
        char wal_path[4200], raw_path[4200];
        struct wal *w = NULL;
        double t[3] = { 0, 0, 0 };   /* raw, wal, sqlite */
        int methods = 2;
        uint64_t flushes0;
        int fd, r;
#ifdef HAVE_SQLITE3
        struct sql q;
        sql_open(b, &q);
        sql_chunk(b, &q, WARMUP);
        methods = 3;
#endif

        path_in(b, "append.wal.jsonl", wal_path, sizeof(wal_path));
        path_in(b, "append.raw.jsonl", raw_path, sizeof(raw_path));
        r = wal_open(wal_path, NULL, &w, NULL);
        if (r < 0)
                die("wal_open", r);
        fd = open(raw_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (fd < 0)
                die(raw_path, errno);
        if (fsync(fd) < 0)
                die("fsync", errno);

        wal_chunk(b, w, WARMUP);
        raw_chunk(b, fd, WARMUP);
        flushes0 = wal_flush_count(w);
        for (long done = 0, c = 0; done < b->records; done += CHUNK, c++) {
                long n = b->records - done < CHUNK ? b->records - done : CHUNK;
                for (int k = 0; k < methods; k++) {
                        int m = (int)((c + k) % methods);   /* rotate who goes first */
                        if (m == 0)
                                t[0] += raw_chunk(b, fd, n);
                        else if (m == 1)
                                t[1] += wal_chunk(b, w, n);
#ifdef HAVE_SQLITE3
                        else
                                t[2] += sql_chunk(b, &q, n);
#endif
                }
        }
        if (wal_flush_count(w) - flushes0 != (uint64_t)b->records)
                printf("WARNING: %" PRIu64 " WAL flushes for %ld records\n",
                       wal_flush_count(w) - flushes0, b->records);
        close(fd);
        wal_close(w);

        /* the writer's CPU cost: appends without flush (page cache only) */
        char cpu_path[4200];
        path_in(b, "cpu.wal.jsonl", cpu_path, sizeof(cpu_path));
        check(wal_open(cpu_path, NULL, &w, NULL), "wal_open");
        double t0 = now_s();
        for (long i = 0; i < 20000; i++)
                check(wal_mark_completed(w, STEP_ID, b->post_hash, b->result_hash, false, NULL,
                                         b->result_json),
                      "wal_mark_completed");
        double cpu = (now_s() - t0) / 20000;
        wal_close(w);
        unlink(cpu_path);

        *raw_rate = (double)b->records / t[0];
        *wal_rate = (double)b->records / t[1];
        *sql_rate = methods == 3 ? (double)b->records / t[2] : 0;
        printf("(a) WAL writer, wal_flush per record: %10.0f appends/s  (%7.1f us each)\n",
               *wal_rate, 1e6 / *wal_rate);
        printf("(b) raw write+fdatasync, O_APPEND:    %10.0f appends/s  (%7.1f us each)\n",
               *raw_rate, 1e6 / *raw_rate);
        printf("    (the writer's own cost per record, without fdatasync: %.1f us)\n", cpu * 1e6);
#ifdef HAVE_SQLITE3
        sql_close(&q);
        printf("(c) SQLite WAL, synchronous=FULL:     %10.0f inserts/s  (%7.1f us each)\n",
               *sql_rate, 1e6 / *sql_rate);
#else
        printf("(c) SQLite: not built (sqlite3 not found by meson)\n");
#endif
}

/* ---- (d) flushes per cycle -------------------------------------------- */

static double bench_cycles(const struct bench *b, double *cycle_rate)
{
        char path[4200];
        struct wal *w = NULL;
        struct fold *f = NULL;
        uint64_t total = 0, min = UINT64_MAX, max = 0;
        double t0;

        path_in(b, "cycles.wal.jsonl", path, sizeof(path));
        check(wal_open(path, NULL, &w, NULL), "wal_open");
        t0 = now_s();
        for (long c = 1; c <= b->cycles; c++) {
                struct planner_plan p;
                char idem[64];
                uint64_t before = wal_flush_count(w);
                int cycle = (int)((c - 1) % PLANNER_MAX_CYCLE) + 1;

                check(planner_build("cycles", "2026-04-20T12:00:00Z", cycle, &p),
                      "planner_build");
                /* plan_commit (+ pending records) + executing(observe): one barrier */
                check(wal_commit_planner_plan(w, &p), "wal_commit_planner_plan");
                for (int s = 0; s < PLANNER_PHASES; s++) {
                        snprintf(idem, sizeof(idem), "%s/%s", p.mandate_id, p.steps[s].step_id);
                        check(wal_append_pending(w, p.steps[s].step_id, p.plan_id, idem),
                              "wal_append_pending");
                }
                check(wal_mark_executing(w, p.steps[0].step_id, p.steps[0].pre_hash),
                      "wal_mark_executing");
                check(wal_flush(w), "wal_flush");
                /* completed(N) + executing(N+1): one barrier each */
                for (int s = 0; s + 1 < PLANNER_PHASES; s++) {
                        check(wal_mark_completed(w, p.steps[s].step_id,
                                                 p.steps[s].expected_post_hash, b->result_hash,
                                                 false, NULL, b->result_json),
                              "wal_mark_completed");
                        check(wal_mark_executing(w, p.steps[s + 1].step_id,
                                                 p.steps[s + 1].pre_hash),
                              "wal_mark_executing");
                        check(wal_flush(w), "wal_flush");
                }
                /* completed(reflect) + plan_finalize: one barrier */
                check(wal_mark_completed(w, p.steps[4].step_id, p.steps[4].expected_post_hash,
                                         b->result_hash, false, NULL, b->result_json),
                      "wal_mark_completed");
                check(wal_finalize_plan(w, p.plan_id, PLAN_SUCCEEDED, NULL), "wal_finalize_plan");
                check(wal_flush(w), "wal_flush");

                uint64_t n = wal_flush_count(w) - before;
                total += n;
                min = n < min ? n : min;
                max = n > max ? n : max;
        }
        double t = now_s() - t0;
        check(wal_close(w), "wal_close");

        /* sanity: the file folds clean with every plan finalized */
        check(fold_file(path, &f), "fold_file");
        size_t open_plans = 0;
        for (size_t i = 0; i < f->nplans; i++)
                open_plans += !f->plans[i].finalized;
        if (f->status != FOLD_CLEAN || open_plans)
                printf("WARNING: cycle WAL folds %s with %zu unfinished plans\n",
                       fold_status_name(f->status), open_plans);
        fold_free(f);

        double per = (double)total / (double)b->cycles;
        *cycle_rate = (double)b->cycles / t;
        printf("(d) fdatasync per five-step cycle:    %10.2f (min %" PRIu64 ", max %" PRIu64
               ", over %ld cycles; the original: 12); %.0f durable cycles/s\n",
               per, min, max, b->cycles, *cycle_rate);
        return per;
}

/* ---- (e) fold throughput ---------------------------------------------- */

struct corpus {
        struct kbuf text;      /* all mandates' WALs back to back */
        size_t *starts;        /* start of each mandate's WAL; starts[n] = text.len */
        size_t n;
        size_t plans;
};

static void put_record(struct kbuf *out, const struct wal_record *r, int64_t *ts)
{
        *ts += 37;
        check(wal_encode(r, *ts, out), "wal_encode");
}

/* A result of varying size, like a handler's output. */
static void make_result(struct kbuf *res, unsigned *seed, const char *phase, int cycle)
{
        static const char words[] = "lorem ipsum dolor sit amet consectetur adipiscing elit sed "
                                    "do eiusmod tempor incididunt ut labore et dolore magna";
        *seed = *seed * 1103515245u + 12345u;
        size_t len = 40 + (*seed >> 8) % 2400;

        kbuf_reset(res);
        kbuf_printf(res, "{\"phase\":\"%s\",\"cycle\":%d,\"ok\":true,\"summary\":\"", phase,
                    cycle);
        for (size_t i = 0; i < len; i++)
                kbuf_putc(res, words[(i + *seed) % (sizeof(words) - 1)]);
        kbuf_printf(res, "\",\"metrics\":{\"items\":%u,\"ratio\":0.25,\"hosts\":[\"a\",\"b\"]}}",
                    *seed % 1000);
}

static void build_corpus(struct corpus *c, size_t target)
{
        struct kbuf res = KBUF_INIT;
        size_t cap = 0;
        unsigned seed = 42;
        int64_t ts = 1776686400000LL;

        memset(c, 0, sizeof(*c));
        for (size_t m = 0; c->text.len < target; m++) {
                char name[32], idem[64], rh[CANON_HASH_STRLEN];

                if (c->n + 1 >= cap) {
                        cap = cap ? cap * 2 : 1024;
                        c->starts = realloc(c->starts, cap * sizeof(*c->starts));
                        if (!c->starts)
                                die("realloc", ENOMEM);
                }
                c->starts[c->n++] = c->text.len;
                snprintf(name, sizeof(name), "job-%06zu", m);
                for (int cycle = 1; cycle <= 3; cycle++) {
                        struct planner_plan p;
                        check(planner_build(name, "2026-04-20T12:00:00Z", cycle, &p),
                              "planner_build");
                        struct wal_step steps[PLANNER_PHASES];
                        for (int s = 0; s < PLANNER_PHASES; s++)
                                steps[s] = (struct wal_step){ p.steps[s].step_id, p.steps[s].tool,
                                                              p.steps[s].params_hash,
                                                              p.steps[s].pre_hash,
                                                              p.steps[s].expected_post_hash };
                        struct wal_record r = { .op = WAL_OP_PLAN_COMMIT, .plan_id = p.plan_id,
                                                .mandate_id = p.mandate_id, .cycle = cycle,
                                                .steps = steps, .nsteps = PLANNER_PHASES };
                        put_record(&c->text, &r, &ts);
                        for (int s = 0; s < PLANNER_PHASES; s++) {
                                snprintf(idem, sizeof(idem), "%s/%s", p.mandate_id,
                                         p.steps[s].step_id);
                                r = (struct wal_record){ .op = WAL_OP_APPEND,
                                                         .step_id = p.steps[s].step_id,
                                                         .plan_id = p.plan_id,
                                                         .idem_key = idem };
                                put_record(&c->text, &r, &ts);
                        }
                        for (int s = 0; s < PLANNER_PHASES; s++) {
                                r = (struct wal_record){ .op = WAL_OP_EXECUTING,
                                                         .step_id = p.steps[s].step_id,
                                                         .pre_hash = p.steps[s].pre_hash };
                                put_record(&c->text, &r, &ts);
                                make_result(&res, &seed, planner_phase_name(s), cycle);
                                check(canon_hash_json(res.data, res.len, rh, NULL),
                                      "canon_hash_json");
                                r = (struct wal_record){
                                        .op = WAL_OP_COMPLETED,
                                        .step_id = p.steps[s].step_id,
                                        .post_hash = p.steps[s].expected_post_hash,
                                        .result_hash = rh,
                                        .result_json = res.data,
                                };
                                put_record(&c->text, &r, &ts);
                        }
                        r = (struct wal_record){ .op = WAL_OP_FINALIZE, .plan_id = p.plan_id,
                                                 .status = PLAN_SUCCEEDED };
                        put_record(&c->text, &r, &ts);
                        c->plans++;
                }
        }
        c->starts[c->n] = c->text.len;
        kbuf_free(&res);
}

/* Fold every mandate's WAL; returns seconds (best of 3). */
static double fold_files(const struct corpus *c, size_t *bad)
{
        double best = 1e30;

        for (int rep = 0; rep < 3; rep++) {
                double t0 = now_s();
                *bad = 0;
                for (size_t i = 0; i < c->n; i++) {
                        struct fold *f = NULL;
                        check(fold_buffer(c->text.data + c->starts[i],
                                          c->starts[i + 1] - c->starts[i], &f),
                              "fold_buffer");
                        if (f->status != FOLD_CLEAN || f->nplans != 3)
                                (*bad)++;
                        fold_free(f);
                }
                double t = now_s() - t0;
                best = t < best ? t : best;
        }
        return best;
}

/* Fold everything as one file; returns seconds (best of 3). */
static double fold_one(const struct corpus *c, size_t *records)
{
        double best = 1e30;

        for (int rep = 0; rep < 3; rep++) {
                struct fold *f = NULL;
                double t0 = now_s();
                check(fold_buffer(c->text.data, c->text.len, &f), "fold_buffer");
                double t = now_s() - t0;
                *records = f->status == FOLD_CLEAN ? f->records : 0;
                fold_free(f);
                best = t < best ? t : best;
        }
        return best;
}

static double bench_fold(const struct bench *b, double *one_rate)
{
        struct corpus c;
        size_t bad = 0, records = 0;
        double t0 = now_s();

        build_corpus(&c, (size_t)b->fold_mb * 1000 * 1000);
        double gen = now_s() - t0;
        double mb = (double)c.text.len / 1e6;
        double t_files = fold_files(&c, &bad);
        double t_one = fold_one(&c, &records);
        double rate = mb / t_files;
        *one_rate = mb / t_one;
        printf("(e) fold, %.1f MB in %zu mandate WALs (%zu plans, avg %.0f bytes/record, "
               "generated in %.1f s):\n",
               mb, c.n, c.plans, (double)c.text.len / (double)(c.plans * 17), gen);
        printf("      per mandate file:               %10.1f MB/s%s\n", rate,
               bad ? "  (WARNING: some folds not clean)" : "");
        printf("      as one %.0f MB file:             %10.1f MB/s  (%zu records)%s\n", mb,
               *one_rate, records, records != c.plans * 17 ? "  (WARNING: record count)" : "");
        kbuf_free(&c.text);
        free(c.starts);
        return rate;
}

/* ---- main ----------------------------------------------------------- */

static void cleanup(const struct bench *b)
{
        static const char *const names[] = { "append.wal.jsonl", "append.raw.jsonl",
                                             "cycles.wal.jsonl", "bench.sqlite",
                                             "bench.sqlite-wal", "bench.sqlite-shm", NULL };
        char path[4200];

        for (size_t i = 0; names[i]; i++) {
                path_in(b, names[i], path, sizeof(path));
                unlink(path);
        }
        rmdir(b->dir);
}

static const char *verdict(bool ok)
{
        return ok ? "OK" : "BELOW TARGET";
}

int main(int argc, char **argv)
{
        struct bench b = { .dir_arg = BENCH_DEFAULT_DIR, .records = 2000, .cycles = 20,
                           .fold_mb = 50 };
        double wal_rate, raw_rate, sql_rate = 0, cycle_rate, fold_rate, fold_one_rate;
        double t0 = now_s();

        parse_args(&b, argc, argv);
        check(canon_init(), "canon_init");
        printf("kairos bench_core %s\n", KAIROS_VERSION);
        setup_dir(&b);
        make_record(&b);
        printf("record: %zu bytes (a completed transition with its result); %ld durable "
               "records per method\n\n",
               b.line_len, b.records);

        bench_append(&b, &wal_rate, &raw_rate, &sql_rate);
        double per_cycle = bench_cycles(&b, &cycle_rate);
        cleanup(&b);
        fold_rate = bench_fold(&b, &fold_one_rate);

        printf("\nratios and targets:\n");
        printf("  WAL / raw          %6.2f   (target >= 0.90)  %s\n", wal_rate / raw_rate,
               verdict(wal_rate / raw_rate >= 0.9));
        if (sql_rate > 0)
                printf("  WAL / SQLite       %6.2f\n", wal_rate / sql_rate);
        printf("  fold MB/s          %6.1f   (target >= 60; one big file %.1f)  %s\n",
               fold_rate, fold_one_rate, verdict(fold_rate >= 60 && fold_one_rate >= 60));
        printf("  flushes per cycle  %6.2f   (target 6)  %s\n", per_cycle,
               verdict(per_cycle <= 6.0 + 1e-9));
        printf("total time %.1f s\n", now_s() - t0);
        return 0;
}
