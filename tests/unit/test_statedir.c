/* SPDX-License-Identifier: MIT */
/* statedir: the state directory's layout and modes. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cmocka.h>

#include "kairos/statedir.h"
#include "kairos/wal.h"

static void test_paths(void **state)
{
        (void)state;
        struct statedir sd;
        char *p = NULL;
        assert_int_equal(statedir_init(&sd, "/var/lib/kairos"), 0);
        assert_string_equal(sd.wal, "/var/lib/kairos/wal");
        assert_string_equal(sd.archive, "/var/lib/kairos/archive");
        assert_string_equal(sd.mandates, "/var/lib/kairos/mandates");
        assert_string_equal(sd.idem, "/var/lib/kairos/idem");
        assert_int_equal(statedir_wal_path(&sd, "mnd_a", &p), 0);
        assert_string_equal(p, "/var/lib/kairos/wal/mnd_a.wal.jsonl");
        /* the archive path is the one wal_archive_file writes */
        char *q = NULL;
        assert_int_equal(wal_archive_path(p, sd.archive, &q), 0);
        free(p);
        assert_int_equal(statedir_archive_path(&sd, "mnd_a", &p), 0);
        assert_string_equal(p, "/var/lib/kairos/archive/mnd_a.wal.jsonl.gz");
        assert_string_equal(p, q);
        free(p);
        free(q);
        assert_int_equal(statedir_summary_path(&sd, "mnd_a", &p), 0);
        assert_string_equal(p, "/var/lib/kairos/mandates/mnd_a.json");
        free(p);
        assert_int_equal(statedir_file_path(&sd, "chronos.json", &p), 0);
        assert_string_equal(p, "/var/lib/kairos/chronos.json");
        free(p);
        /* an id names one file inside its directory, nothing else */
        assert_int_equal(statedir_wal_path(&sd, "../x", &p), -EINVAL);
        assert_int_equal(statedir_wal_path(&sd, "", &p), -EINVAL);
        assert_int_equal(statedir_summary_path(&sd, "..", &p), -EINVAL);
        assert_int_equal(statedir_file_path(&sd, "a/b", &p), -EINVAL);
        statedir_free(&sd);
        assert_int_equal(statedir_init(&sd, ""), -EINVAL);
}

static void test_entry_id(void **state)
{
        (void)state;
        char id[16];
        assert_true(statedir_entry_id("mnd_a.wal.jsonl", STATEDIR_WAL_SUFFIX, id, sizeof id));
        assert_string_equal(id, "mnd_a");
        assert_false(statedir_entry_id(".wal.jsonl", STATEDIR_WAL_SUFFIX, id, sizeof id));
        assert_false(statedir_entry_id(".hidden.wal.jsonl", STATEDIR_WAL_SUFFIX, id, sizeof id));
        assert_false(statedir_entry_id("mnd_a.wal.jsonl.torn.1", STATEDIR_WAL_SUFFIX, id,
                                       sizeof id));
        assert_false(statedir_entry_id("a_very_long_mandate_id.json", STATEDIR_SUMMARY_SUFFIX, id,
                                       sizeof id));
        assert_true(statedir_entry_id("m.json", STATEDIR_SUMMARY_SUFFIX, id, sizeof id));
        assert_string_equal(id, "m");
}

static void test_create_modes(void **state)
{
        (void)state;
        char base[] = "/tmp/statedir-test-XXXXXX";
        assert_non_null(mkdtemp(base));
        char root[128];
        snprintf(root, sizeof root, "%s/a/state", base);
        mode_t old = umask(022);
        struct statedir sd;
        const char *failed = NULL;
        assert_int_equal(statedir_init(&sd, root), 0);
        assert_int_equal(statedir_create(&sd, NULL, &failed), 0);
        assert_null(failed);
        const char *dirs[] = { sd.root, sd.wal, sd.archive, sd.mandates };
        for (size_t i = 0; i < 4; i++) {
                struct stat st;
                assert_int_equal(stat(dirs[i], &st), 0);
                assert_true(S_ISDIR(st.st_mode));
                assert_int_equal(st.st_mode & 0777, STATEDIR_DIR_MODE);
        }
        /* again: existing directories are fine */
        assert_int_equal(statedir_create(&sd, NULL, &failed), 0);
        /* a file where a directory should be names the path */
        statedir_free(&sd);
        char file[160];
        snprintf(file, sizeof file, "%s/plain", base);
        FILE *fp = fopen(file, "w");
        assert_non_null(fp);
        fclose(fp);
        assert_int_equal(statedir_init(&sd, file), 0);
        assert_int_equal(statedir_create(&sd, NULL, &failed), -ENOTDIR);
        assert_string_equal(failed, file);
        statedir_free(&sd);
        umask(old);
        char cmd[160];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
        assert_int_equal(system(cmd), 0);
}

/* Which file systems get one syncfs and which a sync of each file. */
static void test_sync_mode(void **state)
{
        (void)state;
        const char *fs = NULL;
        assert_int_equal(statedir_sync_mode_of(0xEF53, &fs), STATEDIR_SYNC_FS);
        assert_string_equal(fs, "ext4");
        assert_int_equal(statedir_sync_mode_of(0x58465342, &fs), STATEDIR_SYNC_FS);
        assert_string_equal(fs, "xfs");
        assert_int_equal(statedir_sync_mode_of(0x65735546, &fs), STATEDIR_SYNC_FILES);
        assert_string_equal(fs, "fuse");
        assert_int_equal(statedir_sync_mode_of(0x6969, &fs), STATEDIR_SYNC_FILES);
        assert_string_equal(fs, "nfs");
        /* not known to be a barrier: file by file */
        assert_int_equal(statedir_sync_mode_of(0x12345678, &fs), STATEDIR_SYNC_FILES);
        assert_string_equal(fs, "unknown");
        /* a sign-extended f_type of a 32-bit magic still matches */
        assert_int_equal(statedir_sync_mode_of((unsigned long)(long)(int)0xFF534D42, &fs),
                         STATEDIR_SYNC_FILES);
        assert_string_equal(fs, "cifs");
        enum statedir_sync mode;
        assert_int_equal(statedir_sync_mode("/nonexistent/kairos", &mode, &fs), -ENOENT);
        assert_int_equal(statedir_sync_mode("/proc", &mode, &fs), 0);
        assert_int_equal(mode, STATEDIR_SYNC_FILES); /* procfs is no known barrier */
}

/* Where a rename never synced survives a crash whole (WAL spares): the
 * journaled and copy-on-write file systems, ext4 only with a journal (its
 * jbd2 entry under /proc/fs/jbd2, found through /sys/dev/block). */
static void test_renames_atomic(void **state)
{
        (void)state;
        char root[] = "/tmp/kairos-renames-XXXXXX";
        assert_non_null(mkdtemp(root));
        char cmd[512];
        snprintf(cmd, sizeof cmd,
                 "mkdir -p '%s/sys/dev/block' '%s/sys/devices/virtual/block/vdb' "
                 "'%s/proc/fs/jbd2/vdb-8' && "
                 "ln -s ../../devices/virtual/block/vdb '%s/sys/dev/block/254:16' && "
                 "ln -s ../../devices/virtual/block/vdc '%s/sys/dev/block/254:32'",
                 root, root, root, root, root);
        assert_int_equal(system(cmd), 0);
        bool atomic = false;
        const char *why = NULL;
        /* ext4 on vdb has a journal, on vdc none */
        assert_int_equal(statedir_renames_atomic_of(0xEF53, makedev(254, 16), root, &atomic,
                                                    &why), 0);
        assert_true(atomic);
        assert_string_equal(why, "ext4 with a journal");
        assert_int_equal(statedir_renames_atomic_of(0xEF53, makedev(254, 32), root, &atomic,
                                                    &why), 0);
        assert_false(atomic);
        assert_string_equal(why, "ext4 without a journal");
        /* a device /sys does not know (no block device): no journal seen */
        atomic = true;
        assert_int_equal(statedir_renames_atomic_of(0xEF53, makedev(7, 99), root, &atomic,
                                                    &why), 0);
        assert_false(atomic);
        /* journaled or copy-on-write by their type */
        assert_int_equal(statedir_renames_atomic_of(0x58465342, makedev(254, 32), root,
                                                    &atomic, &why), 0);
        assert_true(atomic);
        assert_string_equal(why, "xfs");
        assert_int_equal(statedir_renames_atomic_of(0x01021994, 0, root, &atomic, &why), 0);
        assert_true(atomic);
        /* not known to keep one: FUSE, NFS, f2fs, overlayfs, the unknown */
        unsigned long no[] = { 0x65735546, 0x6969, 0xF2F52010, 0x794C7630, 0x12345678 };
        for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
                atomic = true;
                assert_int_equal(statedir_renames_atomic_of(no[i], 0, root, &atomic, &why), 0);
                assert_false(atomic);
        }
        assert_string_equal(why, "unknown");
        assert_int_equal(statedir_renames_atomic_of(0xEF53, 0, NULL, &atomic, &why), -EINVAL);
        /* the running system answers for a real path, and names a missing one */
        assert_int_equal(statedir_renames_atomic("/", &atomic, &why), 0);
        assert_int_equal(statedir_renames_atomic("/nonexistent/kairos", &atomic, &why), -ENOENT);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
        assert_int_equal(system(cmd), 0);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_paths),
                cmocka_unit_test(test_entry_id),
                cmocka_unit_test(test_create_modes),
                cmocka_unit_test(test_sync_mode),
                cmocka_unit_test(test_renames_atomic),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
