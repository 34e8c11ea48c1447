/* SPDX-License-Identifier: MIT */
/* pg_load_wal CONNINFO MANDATE FILE [N...]: write a file WAL's lines into
 * cluster mode's PostgreSQL as MANDATE's rows, through pgstore as kairosd
 * would: the first barrier creates the mandate (epoch 1), the others are
 * fenced appends.  Barriers of N lines each, the Ns taken in turn (default
 * 3).  For tests (tests/cluster/test_waldb.py). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pgstore.h"

static char *read_all(const char *path, size_t *ret_len)
{
        FILE *f = fopen(path, "rb");
        char *data = NULL;
        size_t len = 0, cap = 0, n;

        if (!f)
                return NULL;
        for (;;) {
                if (cap - len < 65536) {
                        char *p = realloc(data, cap + 65536 + 1);
                        if (!p) {
                                free(data);
                                fclose(f);
                                return NULL;
                        }
                        data = p;
                        cap += 65536;
                }
                n = fread(data + len, 1, cap - len, f);
                len += n;
                if (n == 0)
                        break;
        }
        fclose(f);
        data[len] = '\0';
        *ret_len = len;
        return data;
}

/* The byte offset after the next n lines from off (or the end). */
static size_t after_lines(const char *data, size_t len, size_t off, long n)
{
        while (n-- > 0 && off < len) {
                const char *nl = memchr(data + off, '\n', len - off);
                off = nl ? (size_t)(nl - data) + 1 : len;
        }
        return off;
}

int main(int argc, char **argv)
{
        struct pgstore *s = NULL;
        char err[512];
        size_t len, off, end;
        int64_t last = 0;
        long sizes[64];
        int nsizes = 0, k = 0, r;

        if (argc < 4) {
                fprintf(stderr, "usage: pg_load_wal CONNINFO MANDATE FILE [N...]\n");
                return 64;
        }
        for (int i = 4; i < argc && nsizes < 64; i++)
                if ((sizes[nsizes++] = strtol(argv[i], NULL, 10)) < 1)
                        return 64;
        if (!nsizes)
                sizes[nsizes++] = 3;
        char *data = read_all(argv[3], &len);
        if (!data) {
                perror(argv[3]);
                return 66;
        }
        if (pgstore_connect(argv[1], &s, err, sizeof err) < 0) {
                fprintf(stderr, "pg_load_wal: %s\n", err);
                free(data);
                return 1;
        }
        end = after_lines(data, len, 0, sizes[k++ % nsizes]);
        r = pgstore_mandate_create(s, argv[2], "loaded", "loader", 600000, data, end);
        for (off = end; r == 0 && off < len; off = end) {
                end = after_lines(data, len, off, sizes[k++ % nsizes]);
                r = pgstore_wal_append(s, argv[2], 1, 0, data + off, end - off, &last);
        }
        if (r < 0)
                fprintf(stderr, "pg_load_wal: %s: %s\n", strerror(-r), pgstore_error(s));
        else
                printf("%d barriers\n", k);
        pgstore_close(s);
        free(data);
        return r < 0 ? 1 : 0;
}
