/* SPDX-License-Identifier: MIT */
/* The parsers of /proc/self/cgroup and /proc/self/mountinfo that find
 * kairosd's cgroups on cgroup v2, hybrid and v1 hosts. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cgroup.h"

static FILE *text(const char *s)
{
        FILE *f = fmemopen((void *)s, strlen(s), "r");
        assert_non_null(f);
        return f;
}

static const char *const HYBRID_CGROUP =
        "9:name=systemd:/system.slice/kairosd.service\n"
        "8:pids:/system.slice/kairosd.service\n"
        "6:freezer:/\n"
        "4:memory:/system.slice/kairosd.service\n"
        "3:cpuset:/\n"
        "2:cpu,cpuacct:/system.slice/kairosd.service/x\n"
        "0::/system.slice/kairosd.service\n";

static char *own(const char *content, const char *controller, int *ret_r)
{
        FILE *f = text(content);
        char *path = NULL;
        *ret_r = cgroup_parse_own(f, controller, &path);
        fclose(f);
        return path;
}

static void test_own_path_by_hierarchy(void **state)
{
        (void)state;
        int r;
        char *p = own(HYBRID_CGROUP, NULL, &r);
        assert_int_equal(r, 0);
        assert_string_equal(p, "/system.slice/kairosd.service");
        free(p);
        p = own(HYBRID_CGROUP, "memory", &r);
        assert_int_equal(r, 0);
        assert_string_equal(p, "/system.slice/kairosd.service");
        free(p);
        /* one word of a hierarchy with several controllers */
        p = own(HYBRID_CGROUP, "cpu", &r);
        assert_int_equal(r, 0);
        assert_string_equal(p, "/system.slice/kairosd.service/x");
        free(p);
        /* "cpu" is not "cpuset", and "systemd" is not "name=systemd" */
        p = own("3:cpuset:/a\n9:name=systemd:/b\n", "cpu", &r);
        assert_int_equal(r, -ENOENT);
        assert_null(p);
        p = own("9:name=systemd:/b\n", "systemd", &r);
        assert_int_equal(r, -ENOENT);
        /* a v1 host: no "0::" line */
        p = own("4:memory:/a\n", NULL, &r);
        assert_int_equal(r, -ENOENT);
        /* a v2 host has only it */
        p = own("0::/user.slice\n", "memory", &r);
        assert_int_equal(r, -ENOENT);
        p = own("0::/user.slice\n", NULL, &r);
        assert_int_equal(r, 0);
        assert_string_equal(p, "/user.slice");
        free(p);
}

static const char *const MOUNTINFO =
        "25 30 0:22 / /sys rw,nosuid - sysfs sysfs rw\n"
        "30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "31 30 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup "
        "rw,cpu,cpuacct\n"
        "33 30 0:30 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n"
        "34 30 0:31 /kairos /srv/mem rw,relatime shared:4 master:2 - cgroup cgroup rw,memory\n"
        "35 30 0:35 / /sys/fs/cgroup/my\\040pids rw,relatime - cgroup cgroup rw,pids\n"
        "39 30 0:36 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n"
        "40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

static int mountinfo(const char *controller, char *mnt, char *root)
{
        FILE *f = text(MOUNTINFO);
        int r = cgroup_parse_mountinfo(f, controller, mnt, 256, root, 256);
        fclose(f);
        return r;
}

static void test_mountinfo_finds_v1_hierarchies(void **state)
{
        (void)state;
        char mnt[256], root[256];
        assert_int_equal(mountinfo("cpu", mnt, root), 0);
        assert_string_equal(mnt, "/sys/fs/cgroup/cpu,cpuacct");
        assert_string_equal(root, "/");
        /* optional fields before " - ", and a bind mount of a cgroup below the root */
        assert_int_equal(mountinfo("memory", mnt, root), 0);
        assert_string_equal(mnt, "/srv/mem");
        assert_string_equal(root, "/kairos");
        /* an escaped mount point is not used */
        assert_int_equal(mountinfo("pids", mnt, root), -ENOENT);
        /* not a word of the options; cgroup2 is not v1; named hierarchies */
        assert_int_equal(mountinfo("cpus", mnt, root), -ENOENT);
        assert_int_equal(mountinfo("systemd", mnt, root), -ENOENT);
        assert_int_equal(mountinfo("freezer", mnt, root), -ENOENT);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_own_path_by_hierarchy),
                cmocka_unit_test(test_mountinfo_finds_v1_hierarchies),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
