// SPDX-License-Identifier: MIT
/*
 * floor_startup: the floor of kairosd's startup recovery, in C, one thread.
 *
 *   build/tests/bench/floor_startup WALDIR
 *
 * Reads every *.wal.jsonl file of WALDIR fully; appends a ~200-byte record
 * to each one whose last record is a step left executing (an interrupted
 * step: recovery must record its verdict there); then one syncfs makes all
 * of them durable.  That is the least recovery must do with these WALs.
 * Each file is opened once, for reading and appending, without an access
 * time update (O_NOATIME; without it where refused), as kairosd does.
 *
 * Prints one line for tests/bench/bench_startup.py:
 *   floor_startup wals N appended A bytes_read B wall_s T
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return ts.tv_sec + ts.tv_nsec / 1e9;
}

static const char verdict[] =
        "{\"op\":\"transition\",\"step_id\":\"orient_001\",\"status\":\"needs_review\","
        "\"error_class\":\"interrupted\",\"error_msg\":\"kairosd stopped while the step ran\","
        "\"ts\":\"2026-04-20T12:00:00.000Z\",\"crc\":\"00000000\"}\n";

int main(int argc, char **argv)
{
        if (argc != 2) {
                fprintf(stderr, "usage: floor_startup WALDIR\n");
                return 2;
        }
        double t0 = now();
        int dfd = open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0) {
                fprintf(stderr, "floor_startup: %s: %s\n", argv[1], strerror(errno));
                return 1;
        }
        DIR *d = fdopendir(dup(dfd));
        if (!d) {
                fprintf(stderr, "floor_startup: %s: %s\n", argv[1], strerror(errno));
                return 1;
        }
        size_t cap = 1 << 16;
        char *buf = malloc(cap);
        long wals = 0, appended = 0;
        long long bytes = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
                size_t nl = strlen(e->d_name);
                if (nl < 10 || strcmp(e->d_name + nl - 10, ".wal.jsonl") != 0)
                        continue;
                int fd = openat(dfd, e->d_name, O_RDWR | O_APPEND | O_CLOEXEC | O_NOATIME);
                if (fd < 0 && errno == EPERM)
                        fd = openat(dfd, e->d_name, O_RDWR | O_APPEND | O_CLOEXEC);
                if (fd < 0) {
                        fprintf(stderr, "floor_startup: %s: %s\n", e->d_name, strerror(errno));
                        return 1;
                }
                size_t len = 0;
                for (;;) {
                        if (len == cap) {
                                cap *= 2;
                                buf = realloc(buf, cap);
                                if (!buf)
                                        return 1;
                        }
                        ssize_t n = read(fd, buf + len, cap - len);
                        if (n < 0) {
                                fprintf(stderr, "floor_startup: read %s: %s\n", e->d_name,
                                        strerror(errno));
                                return 1;
                        }
                        if (n == 0)
                                break;
                        len += (size_t)n;
                }
                bytes += (long long)len;
                wals++;
                /* the last record: from after the previous newline */
                size_t end = len && buf[len - 1] == '\n' ? len - 1 : len, start = end;
                while (start > 0 && buf[start - 1] != '\n')
                        start--;
                if (memmem(buf + start, end - start, "\"status\":\"executing\"", 20)) {
                        if (write(fd, verdict, sizeof verdict - 1) != (ssize_t)sizeof verdict - 1) {
                                fprintf(stderr, "floor_startup: write %s: %s\n", e->d_name,
                                        strerror(errno));
                                return 1;
                        }
                        appended++;
                }
                close(fd);
        }
        closedir(d);
        if (syncfs(dfd) < 0) {
                fprintf(stderr, "floor_startup: syncfs: %s\n", strerror(errno));
                return 1;
        }
        close(dfd);
        free(buf);
        printf("floor_startup wals %ld appended %ld bytes_read %lld wall_s %.6f\n", wals, appended,
               bytes, now() - t0);
        return 0;
}
