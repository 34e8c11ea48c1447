/* SPDX-License-Identifier: MIT */
/* Standalone driver for the libFuzzer targets: feeds every file named on the
 * command line (directories are walked recursively, in sorted order) to
 * LLVMFuzzerTestOneInput, so the seed corpora run in the ordinary test suite
 * and under ASan/UBSan without libFuzzer.  A target reports a violated
 * invariant by aborting; this driver fails only if an input cannot be read. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t n_inputs;

static int run_file(const char *path)
{
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
                fprintf(stderr, "%s: %s\n", path, strerror(errno));
                return -1;
        }
        struct stat st;
        if (fstat(fd, &st) < 0) {
                fprintf(stderr, "%s: %s\n", path, strerror(errno));
                close(fd);
                return -1;
        }
        size_t size = (size_t)st.st_size;
        /* exactly size bytes (at least 1 for malloc), so ASan sees over-reads */
        uint8_t *buf = malloc(size ? size : 1);
        if (!buf) {
                close(fd);
                return -1;
        }
        size_t got = 0;
        while (got < size) {
                ssize_t r = read(fd, buf + got, size - got);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r <= 0) {
                        fprintf(stderr, "%s: short read\n", path);
                        free(buf);
                        close(fd);
                        return -1;
                }
                got += (size_t)r;
        }
        close(fd);
        LLVMFuzzerTestOneInput(size ? buf : NULL, size);
        free(buf);
        n_inputs++;
        return 0;
}

static int name_cmp(const struct dirent **a, const struct dirent **b)
{
        return strcmp((*a)->d_name, (*b)->d_name);
}

static int run_path(const char *path)
{
        struct stat st;
        if (stat(path, &st) < 0) {
                fprintf(stderr, "%s: %s\n", path, strerror(errno));
                return -1;
        }
        if (!S_ISDIR(st.st_mode))
                return run_file(path);

        struct dirent **ents;
        int n = scandir(path, &ents, NULL, name_cmp);
        if (n < 0) {
                fprintf(stderr, "%s: %s\n", path, strerror(errno));
                return -1;
        }
        int rc = 0;
        for (int i = 0; i < n; i++) {
                const char *name = ents[i]->d_name;
                if (name[0] != '.') {
                        size_t len = strlen(path) + strlen(name) + 2;
                        char *child = malloc(len);
                        if (!child) {
                                rc = -1;
                        } else {
                                snprintf(child, len, "%s/%s", path, name);
                                if (run_path(child) < 0)
                                        rc = -1;
                                free(child);
                        }
                }
                free(ents[i]);
        }
        free(ents);
        return rc;
}

int main(int argc, char **argv)
{
        if (argc < 2) {
                fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
                return 64;
        }
        int rc = 0;
        for (int i = 1; i < argc; i++)
                if (run_path(argv[i]) < 0)
                        rc = 1;
        printf("%zu inputs run\n", n_inputs);
        return rc;
}
