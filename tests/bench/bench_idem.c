/* SPDX-License-Identifier: MIT */
/* bench_idem: the idempotency store benchmark (run by hand, not a test).
 *
 *   build/tests/bench/bench_idem [--dir DIR] [--entries N] [--lookups M] [--pairs P]
 *
 * In one run:
 *   (a) lookups/s on a warm in-process store of N finished entries (explicit
 *       keys, fingerprint precomputed as the daemon has it after parsing the
 *       request), random keys, all hits;
 *   (a') the same, hashing a small JSON input on every lookup (content keys);
 *   (b) durable begin+finish pairs/s: idem_begin → append + fdatasync →
 *       idem_complete → append + fdatasync, through idem_sync on a real log;
 *   (c) the baseline: write(2) + fdatasync(2) of the same two lines, O_APPEND,
 *       in the same directory.
 * (b) and (c) run interleaved in chunks of 25 pairs, rotating which goes
 * first, so the noise of a shared disk hits both alike. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "kairos/canon.h"
#include "kairos/idem.h"
#include "kairos/kbuf.h"

#define CHUNK 25

struct bench {
        const char *dir_arg;
        char dir[4096];
        long entries;
        long lookups;
        long pairs;
};

static double now_s(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what, int err)
{
        fprintf(stderr, "bench_idem: %s: %s\n", what, strerror(err < 0 ? -err : err));
        exit(1);
}

static long parse_long(const char *opt, const char *v, long min)
{
        char *end;
        errno = 0;
        long n = strtol(v, &end, 10);
        if (errno || *end || end == v || n < min) {
                fprintf(stderr, "bench_idem: %s needs an integer >= %ld\n", opt, min);
                exit(64);
        }
        return n;
}

static void parse_args(struct bench *b, int argc, char **argv)
{
        for (int i = 1; i < argc; i++) {
                const char *a = argv[i];
                if (strcmp(a, "--help") == 0) {
                        printf("Usage: bench_idem [--dir DIR] [--entries N] [--lookups M] "
                               "[--pairs P]\n"
                               "  --dir DIR     where to write (a temp dir is made inside) "
                               "[/var/tmp]\n"
                               "  --entries N   warm store size [10000]\n"
                               "  --lookups M   lookups to time [5000000]\n"
                               "  --pairs P     durable begin+finish pairs per method [1000]\n");
                        exit(0);
                }
                if (i + 1 >= argc) {
                        fprintf(stderr, "bench_idem: unknown option or missing value: %s\n", a);
                        exit(64);
                }
                if (strcmp(a, "--dir") == 0)
                        b->dir_arg = argv[++i];
                else if (strcmp(a, "--entries") == 0)
                        b->entries = parse_long(a, argv[++i], 1);
                else if (strcmp(a, "--lookups") == 0)
                        b->lookups = parse_long(a, argv[++i], 1);
                else if (strcmp(a, "--pairs") == 0)
                        b->pairs = parse_long(a, argv[++i], CHUNK);
                else {
                        fprintf(stderr, "bench_idem: unknown option %s\n", a);
                        exit(64);
                }
        }
}

static const char *fs_name(unsigned long type)
{
        switch (type) {
        case 0xEF53: return "ext2/3/4";
        case 0x58465342: return "xfs";
        case 0x9123683E: return "btrfs";
        case 0x01021994: return "tmpfs";
        case 0x794c7630: return "overlayfs";
        default: return "unknown";
        }
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;

static uint64_t rng(void)
{
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        return rng_state;
}

/* A typical cached `tool run` result: exit status, stdout, stderr. */
static const char result[] =
        "{\"exit\":0}\0deployed web-1 web-2 web-3 in 4182 ms\n\0warning: slow host web-2\n";

/* ---- (a) lookups ---- */

static void bench_lookups(const struct bench *b)
{
        struct idem_store *s;
        struct idem_options opt = { .capacity = (size_t)b->entries };
        struct kbuf pend = KBUF_INIT;
        char fp[CANON_HASH_STRLEN];
        char input[64];
        uint64_t lsn;
        int r;

        if ((r = idem_store_new(&opt, &s)) < 0)
                die("idem_store_new", r);
        char (*keys)[32] = calloc((size_t)b->entries, sizeof(*keys));
        if (!keys)
                die("calloc", ENOMEM);
        snprintf(input, sizeof(input), "{\"cmd\":[\"deploy\",\"web\"],\"v\":2}");
        if ((r = canon_hash_json(input, strlen(input), fp, NULL)) < 0)
                die("canon_hash_json", r);
        for (long i = 0; i < b->entries; i++) {
                snprintf(keys[i], sizeof(keys[i]), "deploy-%06ld", i);
                struct idem_request rq = { .tool = "cmd_run", .key = keys[i], .fingerprint = fp };
                struct idem_view v;
                if ((r = idem_begin(s, &rq, &v, &lsn)) != IDEM_PROCEED)
                        die("idem_begin", r < 0 ? r : EPROTO);
                char full[IDEM_FULL_KEY_SIZE];
                snprintf(full, sizeof(full), "%s", v.key);
                if ((r = idem_complete(s, full, result, sizeof(result), &lsn)) < 0)
                        die("idem_complete", r);
        }
        if ((r = idem_take_pending(s, &pend, &lsn)) < 0)
                die("idem_take_pending", r);
        idem_durable(s, lsn);
        kbuf_free(&pend);

        /* warm-up */
        long hits = 0;
        for (long i = 0; i < 100000; i++) {
                struct idem_request rq = { .tool = "cmd_run",
                                           .key = keys[rng() % (uint64_t)b->entries],
                                           .fingerprint = fp };
                hits += idem_lookup(s, &rq, NULL) == IDEM_HIT_COMPLETED;
        }
        hits = 0;
        double t0 = now_s();
        for (long i = 0; i < b->lookups; i++) {
                struct idem_request rq = { .tool = "cmd_run",
                                           .key = keys[rng() % (uint64_t)b->entries],
                                           .fingerprint = fp };
                hits += idem_lookup(s, &rq, NULL) == IDEM_HIT_COMPLETED;
        }
        double dt = now_s() - t0;
        if (hits != b->lookups)
                die("lookups missed", EPROTO);
        printf("(a)  lookups, warm store of %ld entries, explicit keys: %.0f lookups/s "
               "(%.0f ns each, %ld lookups, all hits)%s\n",
               b->entries, (double)b->lookups / dt, dt / (double)b->lookups * 1e9, b->lookups,
               (double)b->lookups / dt >= 1e6 ? "" : "  BELOW TARGET 1,000,000/s");
        idem_store_free(s);

        /* (a') content keys: the input is canonicalized and hashed on every lookup */
        opt.capacity = (size_t)b->entries;
        if ((r = idem_store_new(&opt, &s)) < 0)
                die("idem_store_new", r);
        for (long i = 0; i < b->entries; i++) {
                snprintf(input, sizeof(input), "{\"path\":\"/srv/out/%06ld\",\"mode\":420}", i);
                struct idem_request rq = { .tool = "fs_write", .input_json = input,
                                           .input_len = strlen(input) };
                struct idem_view v;
                if ((r = idem_begin(s, &rq, &v, &lsn)) != IDEM_PROCEED)
                        die("idem_begin", r < 0 ? r : EPROTO);
                char full[IDEM_FULL_KEY_SIZE];
                snprintf(full, sizeof(full), "%s", v.key);
                if ((r = idem_complete(s, full, result, sizeof(result), &lsn)) < 0)
                        die("idem_complete", r);
        }
        if ((r = idem_take_pending(s, &pend, &lsn)) < 0)
                die("idem_take_pending", r);
        idem_durable(s, lsn);
        kbuf_free(&pend);
        long n = b->lookups / 10 > 0 ? b->lookups / 10 : 1;
        hits = 0;
        t0 = now_s();
        for (long i = 0; i < n; i++) {
                snprintf(input, sizeof(input), "{\"mode\":420,\"path\":\"/srv/out/%06ld\"}",
                         (long)(rng() % (uint64_t)b->entries));
                struct idem_request rq = { .tool = "fs_write", .input_json = input,
                                           .input_len = strlen(input) };
                hits += idem_lookup(s, &rq, NULL) == IDEM_HIT_COMPLETED;
        }
        dt = now_s() - t0;
        if (hits != n)
                die("content lookups missed", EPROTO);
        printf("(a') lookups, content keys (canonical JSON + SHA-256 per lookup): %.0f "
               "lookups/s (%.0f ns each)\n",
               (double)n / dt, dt / (double)n * 1e9);
        idem_store_free(s);
        free(keys);
}

/* ---- (b) durable pairs vs (c) raw fdatasync ---- */

struct durable {
        struct idem_store *s;
        struct idem_log *l;
        long next;
        double t;
        long done;
        int raw_fd;
        double raw_t;
        long raw_done;
        char line1[512], line2[1024];
        size_t len1, len2;
        uint64_t compactions;
};

static void pair_store(struct durable *d)
{
        char key[32], fp[CANON_HASH_STRLEN];
        const char *in = "{\"cmd\":[\"deploy\",\"web\"]}";
        uint64_t lsn;
        struct idem_view v;
        int r;

        snprintf(key, sizeof(key), "deploy-%08ld", d->next++);
        if ((r = canon_hash_json(in, strlen(in), fp, NULL)) < 0)
                die("canon_hash_json", r);
        struct idem_request rq = { .tool = "cmd_run", .key = key, .fingerprint = fp };
        if ((r = idem_begin(d->s, &rq, &v, &lsn)) != IDEM_PROCEED)
                die("idem_begin", r < 0 ? r : EPROTO);
        if ((r = idem_sync(d->s, d->l)) < 0) /* the begin is durable: run the tool */
                die("idem_sync begin", r);
        char full[IDEM_FULL_KEY_SIZE];
        snprintf(full, sizeof(full), "%s", v.key);
        if ((r = idem_complete(d->s, full, result, sizeof(result), &lsn)) < 0)
                die("idem_complete", r);
        if ((r = idem_sync(d->s, d->l)) < 0) /* the result is durable: answer */
                die("idem_sync complete", r);
        if (idem_needs_compaction(d->s)) {
                if ((r = idem_compact_sync(d->s, d->l)) < 0)
                        die("idem_compact_sync", r);
                d->compactions++;
        }
}

static void raw_write(int fd, const char *p, size_t n)
{
        while (n > 0) {
                ssize_t w = write(fd, p, n);
                if (w < 0 && errno == EINTR)
                        continue;
                if (w < 0)
                        die("write", errno);
                p += w;
                n -= (size_t)w;
        }
        if (fdatasync(fd) < 0)
                die("fdatasync", errno);
}

static void pair_raw(struct durable *d)
{
        raw_write(d->raw_fd, d->line1, d->len1);
        raw_write(d->raw_fd, d->line2, d->len2);
}

/* The two lines the store writes for one pair, for the raw loop. */
static void sample_lines(struct durable *d)
{
        struct idem_options opt = { 0 };
        struct idem_store *s;
        struct kbuf b = KBUF_INIT;
        uint64_t lsn;
        struct idem_view v;
        char fp[CANON_HASH_STRLEN];
        const char *in = "{\"cmd\":[\"deploy\",\"web\"]}";
        int r;

        if ((r = idem_store_new(&opt, &s)) < 0 || (r = canon_hash_json(in, strlen(in), fp, NULL)) < 0)
                die("sample", r);
        struct idem_request rq = { .tool = "cmd_run", .key = "deploy-00000000", .fingerprint = fp };
        if (idem_begin(s, &rq, &v, &lsn) != IDEM_PROCEED)
                die("sample begin", EPROTO);
        if ((r = idem_take_pending(s, &b, &lsn)) < 0 || b.len >= sizeof(d->line1))
                die("sample take", r < 0 ? r : E2BIG);
        memcpy(d->line1, b.data, b.len);
        d->len1 = b.len;
        kbuf_reset(&b);
        if ((r = idem_complete(s, "cmd_run:deploy-00000000", result, sizeof(result), &lsn)) < 0 ||
            (r = idem_take_pending(s, &b, &lsn)) < 0 || b.len >= sizeof(d->line2))
                die("sample complete", r < 0 ? r : E2BIG);
        memcpy(d->line2, b.data, b.len);
        d->len2 = b.len;
        kbuf_free(&b);
        idem_store_free(s);
}

static void bench_durable(const struct bench *b)
{
        struct durable d = { 0 };
        struct idem_options opt = { 0 };
        struct idem_load_info info;
        char path[4200];
        int r;

        sample_lines(&d);
        if ((r = idem_store_new(&opt, &d.s)) < 0)
                die("idem_store_new", r);
        snprintf(path, sizeof(path), "%s/idem", b->dir);
        if ((r = idem_log_open(path, NULL, d.s, &d.l, &info)) < 0)
                die("idem_log_open", r);
        snprintf(path, sizeof(path), "%s/raw.jsonl", b->dir);
        d.raw_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
        if (d.raw_fd < 0)
                die(path, errno);
        /* warm-up both */
        for (int i = 0; i < 10; i++) {
                pair_store(&d);
                pair_raw(&d);
        }
        for (long chunk = 0; d.done < b->pairs; chunk++) {
                for (int k = 0; k < 2; k++) {
                        bool store_turn = (chunk + k) % 2 == 0;
                        double t0 = now_s();
                        for (int i = 0; i < CHUNK; i++)
                                store_turn ? pair_store(&d) : pair_raw(&d);
                        double dt = now_s() - t0;
                        if (store_turn) {
                                d.t += dt;
                                d.done += CHUNK;
                        } else {
                                d.raw_t += dt;
                                d.raw_done += CHUNK;
                        }
                }
        }
        double ps = (double)d.done / d.t, raw = (double)d.raw_done / d.raw_t;
        printf("(b)  durable begin+finish pairs (2 fdatasync each): %.0f pairs/s "
               "(%.2f ms per pair, %ld pairs, %" PRIu64 " compactions, %" PRIu64 " flushes)\n",
               ps, 1e3 / ps, d.done, d.compactions, idem_log_flush_count(d.l));
        printf("(c)  raw write+fdatasync of the same 2 lines (%zu + %zu bytes): %.0f pairs/s "
               "(%.2f ms per pair)\n",
               d.len1, d.len2, raw, 1e3 / raw);
        printf("     store / raw = %.2f\n", ps / raw);
        close(d.raw_fd);
        idem_log_close(d.l);
        idem_store_free(d.s);
        unlink(path);
        snprintf(path, sizeof(path), "%s/idem/%s", b->dir, IDEM_LOG_NAME);
        unlink(path);
        snprintf(path, sizeof(path), "%s/idem", b->dir);
        rmdir(path);
}

int main(int argc, char **argv)
{
        struct bench b = { .dir_arg = "/var/tmp", .entries = 10000, .lookups = 5000000,
                           .pairs = 1000 };
        struct statfs sf;
        int r;

        parse_args(&b, argc, argv);
        if ((r = canon_init()) < 0)
                die("canon_init", r);
        snprintf(b.dir, sizeof(b.dir), "%s/kairos-bench-idem.XXXXXX", b.dir_arg);
        if (!mkdtemp(b.dir))
                die(b.dir, errno);
        if (statfs(b.dir, &sf) < 0)
                die("statfs", errno);
        printf("dir: %s (%s)\n", b.dir, fs_name((unsigned long)sf.f_type));
        if ((unsigned long)sf.f_type == 0x01021994UL)
                printf("WARNING: tmpfs: fdatasync is free here, the durable figures mean "
                       "nothing; use --dir on a real disk\n");
        bench_lookups(&b);
        bench_durable(&b);
        rmdir(b.dir);
        return 0;
}
