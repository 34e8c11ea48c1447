// SPDX-License-Identifier: MIT
/*
 * floor_result: the data-flow floor of a handler result, in C.
 *
 *   build/tests/bench/floor_result --dir DIR --result FILE [-n CYCLES]
 *
 * What a five-step cycle must do with the result of its first step, FILE
 * (e.g. 1 MB of JSON), and nothing more, each byte once where once is
 * enough: read it from the stdout pipe of a child (`cat FILE`), read it
 * once with the JSON reader (kjson), write its canonical form once to a
 * SHA-256 (canon), append it once to a WAL in DIR (one record, one
 * fdatasync), copy it by its length into the stdin documents of the four
 * later steps and write each into the stdin pipe of a child that reads it
 * (`cat > /dev/null`), gzip the WAL once.  The same is done with a result of
 * `null`; the difference is the CPU the result adds.
 *
 * Prints one line for tests/bench/bench_result.py (CPU of this process,
 * user + system, not of its children; per cycle, in ms):
 *   floor_result cycles N big_ms B small_ms S added_ms A
 */
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "kairos/canon.h"
#include "kairos/kbuf.h"
#include "kairos/kjson.h"

extern char **environ;

static void die(const char *what)
{
        fprintf(stderr, "floor_result: %s: %s\n", what, strerror(errno));
        exit(1);
}

static double cpu_ms(void)
{
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
               (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

/* Run argv with a pipe on stdin (fed with in) or stdout (read into out). */
static void child(char **argv, const struct kbuf *in, struct kbuf *out)
{
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0)
                die("pipe2");
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, in ? p[0] : p[1], in ? 0 : 1);
        pid_t pid;
        int r = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
        if (r) {
                errno = r;
                die(argv[0]);
        }
        posix_spawn_file_actions_destroy(&fa);
        if (in) {
                close(p[0]);
                for (size_t off = 0; off < in->len;) {
                        ssize_t k = write(p[1], in->data + off, in->len - off);
                        if (k < 0 && errno == EINTR)
                                continue;
                        if (k < 0)
                                die("write stdin");
                        off += (size_t)k;
                }
                close(p[1]);
        } else {
                close(p[1]);
                for (;;) {
                        if (kbuf_reserve(out, 65536) < 0)
                                die("kbuf");
                        ssize_t k = read(p[0], out->data + out->len, 65536);
                        if (k < 0 && errno == EINTR)
                                continue;
                        if (k < 0)
                                die("read stdout");
                        if (k == 0)
                                break;
                        out->len += (size_t)k;
                }
                close(p[0]);
        }
        int st;
        while (waitpid(pid, &st, 0) < 0)
                if (errno != EINTR)
                        die("waitpid");
}

static void one_cycle(const char *dir, const char *file, long i)
{
        char *cat_out[] = { "/bin/cat", (char *)file, NULL };
        char *cat_in[] = { "/bin/sh", "-c", "cat > /dev/null", NULL };
        struct kbuf res = KBUF_INIT, canon = KBUF_INIT, rec = KBUF_INIT, doc = KBUF_INIT;
        child(cat_out, NULL, &res);
        while (res.len && (res.data[res.len - 1] == '\n' || res.data[res.len - 1] == ' '))
                res.len--;
        struct kjson_arena *a = kjson_arena_new();
        struct kjson *v;
        if (!a || kjson_parse(a, res.data, res.len, &v, NULL) < 0)
                die("the result is not JSON");
        char hash[CANON_HASH_STRLEN];
        if (canon_write(&canon, v) < 0)
                die("canon");
        canon_hash_bytes(canon.data, canon.len, hash);
        kjson_arena_free(a);

        /* the WAL: the completed record holding the result, one fdatasync */
        char path[4096];
        snprintf(path, sizeof path, "%s/floor%08ld.wal.jsonl", dir, i);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0640);
        if (fd < 0)
                die(path);
        kbuf_printf(&rec, "{\"op\":\"transition\",\"step_id\":\"observe_001\",\"status\":"
                          "\"completed\",\"result_hash\":\"%s\",\"result\":", hash);
        kbuf_append(&rec, res.data, res.len);
        kbuf_puts(&rec, ",\"crc\":\"00000000\"}\n");
        if (write(fd, rec.data, rec.len) != (ssize_t)rec.len || fdatasync(fd) < 0)
                die("WAL");
        close(fd);
        /* the four later steps' stdin: the result copied by its length */
        for (int s = 1; s < 5; s++) {
                kbuf_reset(&doc);
                kbuf_puts(&doc, "{\"mandate\":{},\"step\":{},\"results\":{\"observe\":");
                kbuf_append(&doc, res.data, res.len);
                kbuf_puts(&doc, "},\"previous_reflect\":null}\n");
                child(cat_in, &doc, NULL);
        }
        /* the archive: the WAL gzipped once */
        z_stream z = { 0 };
        if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) !=
            Z_OK)
                die("deflateInit2");
        uLong bound = deflateBound(&z, rec.len);
        unsigned char *gz = malloc(bound);
        if (!gz)
                die("malloc");
        z.next_in = (unsigned char *)rec.data;
        z.avail_in = (uInt)rec.len;
        z.next_out = gz;
        z.avail_out = (uInt)bound;
        if (deflate(&z, Z_FINISH) != Z_STREAM_END)
                die("deflate");
        deflateEnd(&z);
        free(gz);
        unlink(path);
        kbuf_free(&res);
        kbuf_free(&canon);
        kbuf_free(&rec);
        kbuf_free(&doc);
}

int main(int argc, char **argv)
{
        const char *dir = NULL, *file = NULL;
        long n = 10;
        for (int i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc)
                        dir = argv[++i];
                else if (strcmp(argv[i], "--result") == 0 && i + 1 < argc)
                        file = argv[++i];
                else if (strcmp(argv[i], "-n") == 0 && i + 1 < argc)
                        n = atol(argv[++i]);
                else
                        dir = NULL, i = argc;
        }
        if (!dir || !file || n < 1) {
                fprintf(stderr, "usage: floor_result --dir DIR --result FILE [-n CYCLES]\n");
                return 2;
        }
        char small[4200];
        snprintf(small, sizeof small, "%s/null.json", dir);
        FILE *f = fopen(small, "w");
        if (!f || fputs("null\n", f) < 0 || fclose(f) != 0)
                die(small);
        if (canon_init() < 0)
                die("canon_init");
        double t0 = cpu_ms();
        for (long i = 0; i < n; i++)
                one_cycle(dir, file, i);
        double big = (cpu_ms() - t0) / (double)n;
        t0 = cpu_ms();
        for (long i = 0; i < n; i++)
                one_cycle(dir, small, i);
        double nul = (cpu_ms() - t0) / (double)n;
        unlink(small);
        printf("floor_result cycles %ld big_ms %.3f small_ms %.3f added_ms %.3f\n", n, big, nul,
               big - nul);
        return 0;
}
