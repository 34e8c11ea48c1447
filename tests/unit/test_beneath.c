/* SPDX-License-Identifier: MIT */
/* beneath_open_dir: both ways (openat2 and the per-component walk) refuse
 * every symbolic link, "..", absolute paths and non-directories, and name
 * the offending component. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "kairos/beneath.h"

struct tree {
        char dir[64];
        int root_fd;
};

static void mkpath(const struct tree *t, const char *rel, char *out, size_t n)
{
        snprintf(out, n, "%s/%s", t->dir, rel);
}

/* dir/root/{a/b, a/file, a/in -> b, a/up -> ../a, out -> ../outside}, dir/outside */
static int setup(void **state)
{
        struct tree *t = calloc(1, sizeof(*t));
        char p[256], q[256];
        snprintf(t->dir, sizeof t->dir, "/tmp/kairos-beneath-XXXXXX");
        assert_non_null(mkdtemp(t->dir));
        const char *dirs[] = { "root", "root/a", "root/a/b", "outside" };
        for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
                mkpath(t, dirs[i], p, sizeof p);
                assert_int_equal(mkdir(p, 0755), 0);
        }
        mkpath(t, "root/a/file", p, sizeof p);
        int fd = open(p, O_WRONLY | O_CREAT, 0644);
        assert_true(fd >= 0);
        close(fd);
        mkpath(t, "root/a/in", p, sizeof p);
        assert_int_equal(symlink("b", p), 0);
        mkpath(t, "root/a/up", p, sizeof p);
        assert_int_equal(symlink("../a", p), 0);
        mkpath(t, "root/out", p, sizeof p);
        mkpath(t, "outside", q, sizeof q);
        assert_int_equal(symlink(q, p), 0);
        mkpath(t, "root", p, sizeof p);
        t->root_fd = open(p, O_PATH | O_DIRECTORY | O_CLOEXEC);
        assert_true(t->root_fd >= 0);
        *state = t;
        return 0;
}

static int teardown(void **state)
{
        struct tree *t = *state;
        char cmd[128];
        close(t->root_fd);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", t->dir);
        assert_int_equal(system(cmd), 0);
        free(t);
        return 0;
}

static void same_dir(const struct tree *t, int fd, const char *rel)
{
        char p[256];
        struct stat a, b;
        mkpath(t, rel, p, sizeof p);
        assert_int_equal(fstat(fd, &a), 0);
        assert_int_equal(stat(p, &b), 0);
        assert_true(a.st_ino == b.st_ino && a.st_dev == b.st_dev);
        /* readable and syncable: what tool write needs of it */
        assert_int_equal(fsync(fd), 0);
        assert_int_equal(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY);
}

static void expect(const struct tree *t, unsigned flags, const char *rel, int err,
                   const char *bad)
{
        int fd = -1;
        size_t bad_len = 12345;
        int r = beneath_open_dir(t->root_fd, rel, flags, &fd, &bad_len);
        if (r != err)
                fail_msg("%s (flags %u): %d, expected %d", rel, flags, r, err);
        if (err == 0) {
                assert_int_equal(bad_len, 0);
                close(fd);
                return;
        }
        assert_int_equal(fd, -1);
        if (bad)
                assert_int_equal(bad_len, strlen(bad));
        else
                assert_int_equal(bad_len, 0);
}

static void run_all(const struct tree *t, unsigned flags)
{
        int fd;
        const char *self[] = { "", ".", "./", ".//." };
        for (size_t i = 0; i < sizeof self / sizeof self[0]; i++) {
                assert_int_equal(beneath_open_dir(t->root_fd, self[i], flags, &fd, NULL), 0);
                same_dir(t, fd, "root");
                close(fd);
        }
        assert_int_equal(beneath_open_dir(t->root_fd, "a//./b/", flags, &fd, NULL), 0);
        same_dir(t, fd, "root/a/b");
        close(fd);
        expect(t, flags, "a/b", 0, NULL);
        /* symbolic links: out of the tree, within it, at the end or inside */
        expect(t, flags, "out", -ELOOP, "out");
        expect(t, flags, "out/x", -ELOOP, "out");
        expect(t, flags, "a/in", -ELOOP, "a/in");
        expect(t, flags, "a/./in/", -ELOOP, "a/./in");
        expect(t, flags, "a/up/b", -ELOOP, "a/up");
        /* not a directory, missing */
        expect(t, flags, "a/file", -ENOTDIR, "a/file");
        expect(t, flags, "a/file/x", -ENOTDIR, "a/file");
        expect(t, flags, "a/nope/b", -ENOENT, "a/nope");
        /* refused before any lookup */
        expect(t, flags, "..", -EINVAL, NULL);
        expect(t, flags, "a/../a", -EINVAL, NULL);
        expect(t, flags, "a/b/..", -EINVAL, NULL);
        expect(t, flags, "/tmp", -EINVAL, NULL);
        /* ".." inside a name is just a name */
        expect(t, flags, "a/..b", -ENOENT, "a/..b");
}

static void test_openat2(void **state)
{
        run_all(*state, 0);
}

static void test_component_walk(void **state)
{
        run_all(*state, BENEATH_NO_OPENAT2);
}

static void test_bad_arguments(void **state)
{
        struct tree *t = *state;
        int fd;
        assert_int_equal(beneath_open_dir(-1, "a", 0, &fd, NULL), -EINVAL);
        assert_int_equal(beneath_open_dir(t->root_fd, NULL, 0, &fd, NULL), -EINVAL);
        char longname[400];
        memset(longname, 'x', sizeof longname - 1);
        longname[sizeof longname - 1] = '\0';
        assert_int_equal(beneath_open_dir(t->root_fd, longname, BENEATH_NO_OPENAT2, &fd, NULL),
                         -ENAMETOOLONG);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_openat2, setup, teardown),
                cmocka_unit_test_setup_teardown(test_component_walk, setup, teardown),
                cmocka_unit_test_setup_teardown(test_bad_arguments, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
