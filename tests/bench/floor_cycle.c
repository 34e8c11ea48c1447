// SPDX-License-Identifier: MIT
/*
 * floor_cycle: the floor of a one-cycle, five-step mandate, in C.
 *
 *   build/tests/bench/floor_cycle --dir DIR [--handler CMD] [-n MANDATES]
 *
 * Does, one mandate at a time, what kairosd must do for a mandate of five
 * phases each running CMD (split on blanks, executed without a shell, as
 * kairosd does), and nothing more:
 *
 *   M's WAL: the spare the mandate before made (open M's name: ENOENT; rename
 *   DIR/wal/.spare-N to DIR/wal/M.wal.jsonl, open it O_APPEND; no fsync of
 *   wal/), or, for the first, create it (O_CREAT|O_EXCL|O_APPEND) and fsync
 *   DIR/wal once (and every time where kairosd makes no spares: a file
 *   system that may lose a rename never synced, statedir_renames_atomic)
 *   append mandate + plan_commit + append/executing(observe); fdatasync   (1)
 *   for each of the 5 phases:
 *     posix_spawn CMD in its own process group with stdin/stdout/stderr
 *     pipes, write a ~350-byte JSON document to stdin, read stdout and
 *     stderr to EOF, waitpid;
 *     append completed(phase) + append/executing(next phase); fdatasync (2-5),
 *     or, after reflect, completed(reflect) + plan_finalize (no fdatasync:
 *     a mandate that ends alone has them made durable by its syncfs)
 *   write DIR/mandates/M.json (tmp + rename), the gzip archive of the WAL
 *   (from memory, tmp + rename) in DIR/archive, a new spare (O_CREAT|O_EXCL,
 *   empty; where kairosd makes them), syncfs (which makes it durable), unlink the WAL.
 *
 * Record sizes are those kairosd writes (strace -y of a one-cycle mandate).
 * The fsync-family calls (5 fdatasync, 1 syncfs; 1 fsync of wal/ for the
 * first mandate) mirror kairosd's; their count is printed.  It never reads the WAL back.
 *
 * Prints one line for tests/bench/bench_cycle.py:
 *   floor_cycle mandates N wall_s T syncs S
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "kairos/statedir.h"

extern char **environ;

static const char *const phases[5] = { "observe", "orient", "decide", "act", "reflect" };

static long syncs;

static double now(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what)
{
        fprintf(stderr, "floor_cycle: %s: %s\n", what, strerror(errno));
        exit(1);
}

/* A JSON-ish record of exactly len bytes (newline included). */
static size_t record(char *buf, size_t len, const char *op, const char *step)
{
        int n = snprintf(buf, len, "{\"op\":\"%s\",\"step_id\":\"%s_001\",\"ts\":\"2026-04-20T12:00:00.000Z\",\"pad\":\"",
                         op, step);
        size_t i = (size_t)n;
        while (i + 3 < len)
                buf[i++] = 'x';
        buf[i++] = '"';
        buf[i++] = '}';
        buf[i++] = '\n';
        return i;
}

struct wal {
        int fd;
        char *mem;
        size_t len, cap;
};

static void wal_append(struct wal *w, const char *op, const char *step, size_t len)
{
        char buf[4096];
        size_t n = record(buf, len, op, step);
        if (write(w->fd, buf, n) != (ssize_t)n)
                die("write WAL");
        if (w->len + n > w->cap) {
                w->cap = (w->len + n) * 2;
                w->mem = realloc(w->mem, w->cap);
                if (!w->mem)
                        die("realloc");
        }
        memcpy(w->mem + w->len, buf, n);
        w->len += n;
}

static void wal_barrier(struct wal *w)
{
        if (fdatasync(w->fd) < 0)
                die("fdatasync");
        syncs++;
}

static void run_handler(char **argv, const char *doc)
{
        int in[2], out[2], err[2];
        if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0)
                die("pipe2");
        posix_spawn_file_actions_t fa;
        posix_spawnattr_t at;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, in[0], 0);
        posix_spawn_file_actions_adddup2(&fa, out[1], 1);
        posix_spawn_file_actions_adddup2(&fa, err[1], 2);
        posix_spawnattr_init(&at);
        sigset_t none, all;
        sigemptyset(&none);
        sigfillset(&all);
        posix_spawnattr_setsigmask(&at, &none);
        posix_spawnattr_setsigdefault(&at, &all);
        posix_spawnattr_setpgroup(&at, 0);
        posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                              POSIX_SPAWN_SETSIGDEF);
        pid_t pid;
        int r = posix_spawn(&pid, argv[0], &fa, &at, argv, environ);
        if (r) {
                errno = r;
                die(argv[0]);
        }
        posix_spawn_file_actions_destroy(&fa);
        posix_spawnattr_destroy(&at);
        close(in[0]);
        close(out[1]);
        close(err[1]);
        /* a handler that does not read its stdin closes it: EPIPE, ignored */
        (void)!write(in[1], doc, strlen(doc));
        close(in[1]);
        struct pollfd p[2] = { { out[0], POLLIN, 0 }, { err[0], POLLIN, 0 } };
        int open_fds = 2;
        char buf[65536];
        while (open_fds) {
                if (poll(p, 2, -1) < 0) {
                        if (errno == EINTR)
                                continue;
                        die("poll");
                }
                for (int i = 0; i < 2; i++) {
                        if (p[i].fd < 0 || !p[i].revents)
                                continue;
                        ssize_t n = read(p[i].fd, buf, sizeof buf);
                        if (n <= 0) {
                                close(p[i].fd);
                                p[i].fd = -1;
                                open_fds--;
                        }
                }
        }
        int st;
        while (waitpid(pid, &st, 0) < 0)
                if (errno != EINTR)
                        die("waitpid");
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                fprintf(stderr, "floor_cycle: %s failed (status 0x%x)\n", argv[0], st);
                exit(1);
        }
}

static void write_file(const char *path, const void *data, size_t len)
{
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
        if (fd < 0)
                die(tmp);
        if (write(fd, data, len) != (ssize_t)len)
                die("write");
        close(fd);
        if (rename(tmp, path) < 0)
                die("rename");
}

/* A spare made before the last syncfs (durable), as kairosd keeps them
 * where a rename never synced survives a crash whole (the same decision:
 * statedir_renames_atomic); elsewhere each WAL is created and wal/ fsynced. */
static bool spares;
static bool spare_ready;
static char spare[4096];

static void one_mandate(const char *dir, char **argv, long i)
{
        char path[4096], doc[512];
        snprintf(path, sizeof path, "%s/wal/mnd_floor%08ld.wal.jsonl", dir, i);
        struct wal w = { 0 };
        if (spare_ready) {
                if (open(path, O_RDWR | O_APPEND | O_CLOEXEC) >= 0 || errno != ENOENT)
                        die("the WAL exists");
                if (rename(spare, path) < 0)
                        die("rename spare");
                spare_ready = false;
                w.fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
                if (w.fd < 0)
                        die(path);
        } else {
                w.fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0640);
                if (w.fd < 0)
                        die(path);
                char wdir[4096];
                snprintf(wdir, sizeof wdir, "%s/wal", dir);
                int dfd = open(wdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                if (dfd < 0 || fsync(dfd) < 0)
                        die("fsync wal/");
                syncs++;
                close(dfd);
        }

        wal_append(&w, "mandate", "none", 171);
        wal_append(&w, "plan_commit", "none", 1811);
        wal_append(&w, "append", phases[0], 185);
        wal_append(&w, "transition", phases[0], 199);
        wal_barrier(&w);
        for (int ph = 0; ph < 5; ph++) {
                snprintf(doc, sizeof doc,
                         "{\"mandate\":{\"id\":\"mnd_floor%08ld\",\"schedule\":\"bench\",\"fired_at\":"
                         "\"2025-01-01T00:00:00Z\",\"cycle\":1},\"step\":{\"id\":\"%s_001\",\"phase\":\"%s\","
                         "\"attempt\":1},\"plan\":{\"id\":\"plan_floor%08ld\"},\"previous\":[],"
                         "\"effects\":\"observe\",\"deadline\":\"2025-01-01T00:10:00Z\"}\n",
                         i, phases[ph], phases[ph], i);
                run_handler(argv, doc);
                wal_append(&w, "transition", phases[ph], 301);
                if (ph < 4) {
                        wal_append(&w, "append", phases[ph + 1], 183);
                        wal_append(&w, "transition", phases[ph + 1], 198);
                        wal_barrier(&w);
                } else {
                        wal_append(&w, "plan_finalize", "none", 123);
                }
        }
        close(w.fd);

        char summary[307 + 1];
        size_t n = record(summary, sizeof summary - 1, "summary", "none");
        snprintf(path, sizeof path, "%s/mandates/mnd_floor%08ld.json", dir, i);
        write_file(path, summary, n);

        z_stream z = { 0 };
        if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
                die("deflateInit2");
        uLong bound = deflateBound(&z, w.len);
        unsigned char *gz = malloc(bound);
        if (!gz)
                die("malloc");
        z.next_in = (unsigned char *)w.mem;
        z.avail_in = w.len;
        z.next_out = gz;
        z.avail_out = bound;
        if (deflate(&z, Z_FINISH) != Z_STREAM_END)
                die("deflate");
        snprintf(path, sizeof path, "%s/archive/mnd_floor%08ld.wal.jsonl.gz", dir, i);
        write_file(path, gz, z.total_out);
        deflateEnd(&z);
        free(gz);

        if (spares) {
                snprintf(spare, sizeof spare, "%s/wal/.spare-%ld", dir, i + 1);
                int pfd = open(spare, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
                if (pfd < 0)
                        die("spare");
                close(pfd);
        }
        int sfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (sfd < 0 || syncfs(sfd) < 0)
                die("syncfs");
        syncs++;
        close(sfd);
        spare_ready = spares;
        snprintf(path, sizeof path, "%s/wal/mnd_floor%08ld.wal.jsonl", dir, i);
        if (unlink(path) < 0)
                die("unlink WAL");
        free(w.mem);
}

/* The floor's own CPU (its process's CPU-time clock, ns: not its
 * handlers'), s: what kairosd's own CPU per step is set beside. */
static double own_cpu(void)
{
        struct timespec ts;
        if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) < 0)
                die("clock_gettime");
        return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void usage(void)
{
        fprintf(stderr, "usage: floor_cycle --dir DIR [--handler CMD] [-n MANDATES]\n");
        exit(2);
}

int main(int argc, char **argv)
{
        const char *dir = NULL, *handler = "/bin/true";
        long n = 20;
        static const struct option opts[] = {
                { "dir", required_argument, NULL, 'd' },
                { "handler", required_argument, NULL, 'H' },
                { "mandates", required_argument, NULL, 'n' },
                { 0, 0, 0, 0 },
        };
        int c;
        while ((c = getopt_long(argc, argv, "n:", opts, NULL)) != -1) {
                switch (c) {
                case 'd': dir = optarg; break;
                case 'H': handler = optarg; break;
                case 'n': {
                        char *end;
                        n = strtol(optarg, &end, 10);
                        if (*end || n <= 0) {
                                fprintf(stderr, "floor_cycle: -n %s: not a positive number\n", optarg);
                                return 2;
                        }
                        break;
                }
                default: usage();
                }
        }
        if (!dir || optind != argc)
                usage();

        char *copy = strdup(handler);
        char *hargv[64];
        int k = 0;
        for (char *s = strtok(copy, " \t"); s && k < 63; s = strtok(NULL, " \t"))
                hargv[k++] = s;
        hargv[k] = NULL;
        if (k == 0 || hargv[0][0] != '/') {
                fprintf(stderr, "floor_cycle: --handler %s: an absolute path is needed\n", handler);
                return 2;
        }
        signal(SIGPIPE, SIG_IGN);
        const char *sub[] = { "wal", "mandates", "archive" };
        for (int i = 0; i < 3; i++) {
                char p[4096];
                snprintf(p, sizeof p, "%s/%s", dir, sub[i]);
                if (mkdir(p, 0750) < 0 && errno != EEXIST)
                        die(p);
        }
        const char *why = NULL;
        char wal[4096];
        snprintf(wal, sizeof wal, "%s/wal", dir);
        if (statedir_renames_atomic(wal, &spares, &why) < 0)
                die("statfs");
        double t0 = now(), cpu0 = own_cpu();
        for (long i = 0; i < n; i++)
                one_mandate(dir, hargv, i);
        double wall = now() - t0, cpu = own_cpu() - cpu0;
        printf("floor_cycle mandates %ld wall_s %.6f syncs %ld cpu_s %.6f\n", n, wall, syncs, cpu);
        free(copy);
        return 0;
}
