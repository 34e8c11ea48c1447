/* SPDX-License-Identifier: MIT */
/* statedir: the state directory's layout (see statedir.h). */
#include "kairos/kmem.h"
#include "kairos/statedir.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "kairos/wal.h"

/* dir/namesuffix (copied by length: a path per WAL at start) */
static int join(const char *dir, const char *name, const char *suffix, char **ret)
{
        size_t dl = strlen(dir), nl = strlen(name), sl = strlen(suffix);
        char *p = malloc(dl + 1 + nl + sl + 1);
        if (!p)
                return -ENOMEM;
        memcpy(p, dir, dl);
        p[dl] = '/';
        memcpy(p + dl + 1, name, nl);
        memcpy(p + dl + 1 + nl, suffix, sl + 1);
        *ret = p;
        return 0;
}

/* An id names one file inside a directory. */
static bool valid_id(const char *id)
{
        return id && *id && !strchr(id, '/') && strcmp(id, ".") != 0 && strcmp(id, "..") != 0;
}

void statedir_free(struct statedir *sd)
{
        if (!sd)
                return;
        FREE_ALL(sd->root, sd->wal, sd->archive, sd->mandates, sd->idem);
        memset(sd, 0, sizeof(*sd));
}

int statedir_init(struct statedir *sd, const char *root)
{
        memset(sd, 0, sizeof(*sd));
        if (!root || !*root)
                return -EINVAL;
        sd->root = strdup(root);
        if (!sd->root || join(root, "wal", "", &sd->wal) < 0 ||
            join(root, "archive", "", &sd->archive) < 0 ||
            join(root, "mandates", "", &sd->mandates) < 0 || join(root, "idem", "", &sd->idem) < 0) {
                statedir_free(sd);
                return -ENOMEM;
        }
        return 0;
}

int statedir_wal_path(const struct statedir *sd, const char *id, char **ret_path)
{
        if (!valid_id(id))
                return -EINVAL;
        return join(sd->wal, id, STATEDIR_WAL_SUFFIX, ret_path);
}

int statedir_archive_path(const struct statedir *sd, const char *id, char **ret_path)
{
        char *wal = NULL;
        int r = statedir_wal_path(sd, id, &wal);
        if (r == 0)
                r = wal_archive_path(wal, sd->archive, ret_path);
        free(wal);
        return r;
}

int statedir_summary_path(const struct statedir *sd, const char *id, char **ret_path)
{
        if (!valid_id(id))
                return -EINVAL;
        return join(sd->mandates, id, STATEDIR_SUMMARY_SUFFIX, ret_path);
}

int statedir_file_path(const struct statedir *sd, const char *name, char **ret_path)
{
        if (!valid_id(name))
                return -EINVAL;
        return join(sd->root, name, "", ret_path);
}

bool statedir_entry_id(const char *name, const char *suffix, char *ret_id, size_t idlen)
{
        size_t n = strlen(name), sl = strlen(suffix);
        if (name[0] == '.' || n <= sl || strcmp(name + n - sl, suffix) != 0 || n - sl >= idlen)
                return false;
        memcpy(ret_id, name, n - sl);
        ret_id[n - sl] = '\0';
        return true;
}

int statedir_create(const struct statedir *sd, const struct kio *io, const char **ret_failed)
{
        const char *dirs[] = { sd->root, sd->wal, sd->archive, sd->mandates };
        int r = 0;
        *ret_failed = NULL;
        if (!io)
                io = kio_posix();
        for (size_t i = 0; i < sizeof dirs / sizeof dirs[0] && r == 0; i++)
                if ((r = kio_mkdir_p(io, dirs[i], STATEDIR_DIR_MODE)) < 0)
                        *ret_failed = dirs[i];
        /* kio_mkdir_p fsyncs the parent of a directory it creates, but not of
         * one that already exists, and a previous run may have created it and
         * then failed that fsync: make the entries durable at each start
         * (the state directory in its parent, the subdirectories in it). */
        const char *durable[] = { sd->wal, sd->root };
        for (size_t i = 0; i < sizeof durable / sizeof durable[0] && r == 0; i++)
                if ((r = kio_fsync_parent(io, durable[i])) < 0)
                        *ret_failed = durable[i];
        return r;
}

/* File systems whose syncfs(2) makes every file, rename and unlink on them
 * durable (their sync_fs writes back and flushes the whole file system).
 * Anything else is synced file by file: FUSE passes no syncfs to its server,
 * NFS, SMB, 9p and ceph promise nothing of it. */
static const struct {
        unsigned long magic;
        const char *name;
        enum statedir_sync mode;
} fs_table[] = {
        { 0xEF53, "ext4", STATEDIR_SYNC_FS }, /* also ext2, ext3 */
        { 0x58465342, "xfs", STATEDIR_SYNC_FS },
        { 0x9123683E, "btrfs", STATEDIR_SYNC_FS },
        { 0xF2F52010, "f2fs", STATEDIR_SYNC_FS },
        { 0x2FC12FC1, "zfs", STATEDIR_SYNC_FS },
        { 0xCA451A4E, "bcachefs", STATEDIR_SYNC_FS },
        { 0x3153464A, "jfs", STATEDIR_SYNC_FS },
        { 0x794C7630, "overlayfs", STATEDIR_SYNC_FS }, /* syncs its upper file system */
        { 0x01021994, "tmpfs", STATEDIR_SYNC_FS },     /* nothing survives a reboot anyway */
        { 0x858458F6, "ramfs", STATEDIR_SYNC_FS },
        { 0x65735546, "fuse", STATEDIR_SYNC_FILES },
        { 0x6969, "nfs", STATEDIR_SYNC_FILES },
        { 0xFF534D42, "cifs", STATEDIR_SYNC_FILES },
        { 0xFE534D42, "smb2", STATEDIR_SYNC_FILES },
        { 0x01021997, "9p", STATEDIR_SYNC_FILES },
        { 0x00C36400, "ceph", STATEDIR_SYNC_FILES },
};

enum statedir_sync statedir_sync_mode_of(unsigned long f_type, const char **ret_fs_name)
{
        for (size_t i = 0; i < sizeof fs_table / sizeof fs_table[0]; i++)
                if (fs_table[i].magic == (f_type & 0xFFFFFFFFul)) {
                        *ret_fs_name = fs_table[i].name;
                        return fs_table[i].mode;
                }
        *ret_fs_name = "unknown";
        return STATEDIR_SYNC_FILES;
}

int statedir_sync_mode(const char *path, enum statedir_sync *ret_mode, const char **ret_fs_name)
{
        struct statfs sf;
        if (statfs(path, &sf) < 0)
                return -errno;
        *ret_mode = statedir_sync_mode_of((unsigned long)sf.f_type, ret_fs_name);
        return 0;
}

/* An ext4 (or ext3) file system with a journal has a jbd2 entry named after
 * its device: /proc/fs/jbd2/<dev>-8 (the device's name from
 * /sys/dev/block/<major>:<minor>). */
static int ext4_has_journal(dev_t dev, const char *sysroot, bool *ret_journal)
{
        char link[PATH_MAX], target[PATH_MAX], jbd[PATH_MAX];
        int n = snprintf(link, sizeof link, "%s/sys/dev/block/%u:%u", sysroot, major(dev),
                         minor(dev));
        if (n < 0 || (size_t)n >= sizeof link)
                return -ENAMETOOLONG;
        ssize_t len = readlink(link, target, sizeof target - 1);
        if (len < 0) {
                /* no block device (a device-less mount): no jbd2 entry */
                if (errno == ENOENT) {
                        *ret_journal = false;
                        return 0;
                }
                return -errno;
        }
        target[len] = '\0';
        const char *name = strrchr(target, '/');
        name = name ? name + 1 : target;
        n = snprintf(jbd, sizeof jbd, "%s/proc/fs/jbd2/%s-8", sysroot, name);
        if (n < 0 || (size_t)n >= sizeof jbd)
                return -ENAMETOOLONG;
        struct stat st;
        if (stat(jbd, &st) == 0) {
                *ret_journal = S_ISDIR(st.st_mode);
                return 0;
        }
        if (errno != ENOENT)
                return -errno;
        *ret_journal = false;
        return 0;
}

int statedir_renames_atomic_of(unsigned long f_type, dev_t dev, const char *sysroot,
                               bool *ret_atomic, const char **ret_why)
{
        static const struct {
                unsigned long magic;
                const char *name;
        } atomic[] = {
                { 0x58465342, "xfs" },    { 0x9123683E, "btrfs" }, { 0x2FC12FC1, "zfs" },
                { 0xCA451A4E, "bcachefs" }, { 0x3153464A, "jfs" }, { 0x01021994, "tmpfs" },
                { 0x858458F6, "ramfs" },
        };
        if (!sysroot || !ret_atomic || !ret_why)
                return -EINVAL;
        f_type &= 0xFFFFFFFFul;
        for (size_t i = 0; i < sizeof atomic / sizeof atomic[0]; i++)
                if (atomic[i].magic == f_type) {
                        *ret_atomic = true;
                        *ret_why = atomic[i].name;
                        return 0;
                }
        if (f_type == 0xEF53) {
                bool journal = false;
                int r = ext4_has_journal(dev, sysroot, &journal);
                if (r < 0)
                        return r;
                *ret_atomic = journal;
                *ret_why = journal ? "ext4 with a journal" : "ext4 without a journal";
                return 0;
        }
        const char *fs = NULL;
        (void)statedir_sync_mode_of(f_type, &fs);
        *ret_atomic = false;
        *ret_why = fs;
        return 0;
}

int statedir_renames_atomic(const char *path, bool *ret_atomic, const char **ret_why)
{
        struct statfs sf;
        struct stat st;
        if (!path || statfs(path, &sf) < 0 || stat(path, &st) < 0)
                return path ? -errno : -EINVAL;
        return statedir_renames_atomic_of((unsigned long)sf.f_type, st.st_dev, "", ret_atomic,
                                          ret_why);
}
