/* SPDX-License-Identifier: MIT */
/* statedir: the one owner of the state directory's layout and modes.
 *
 *   <root>/wal/<id>.wal.jsonl            open mandates' WALs
 *   <root>/archive/<id>.wal.jsonl.gz     finished mandates' WALs
 *   <root>/mandates/<id>.json            finished mandates' summaries
 *   <root>/idem/                          the idempotency log
 *   <root>/<name>                         chronos.json, kairosd.pid, ...
 *
 * Directories are STATEDIR_DIR_MODE (group may traverse and read), WALs,
 * archives and summaries STATEDIR_FILE_MODE, so members of the daemon's
 * group can run the offline commands on them. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "kairos/kio.h"

#define STATEDIR_DIR_MODE 0750
#define STATEDIR_FILE_MODE 0640
#define STATEDIR_WAL_SUFFIX ".wal.jsonl"
#define STATEDIR_SUMMARY_SUFFIX ".json"

struct statedir {
        char *root;
        char *wal;
        char *archive;
        char *mandates;
        char *idem;
};

/* Compute the layout below root (nothing touched on disk). */
int statedir_init(struct statedir *sd, const char *root);
void statedir_free(struct statedir *sd);

/* Paths of one mandate's files (the caller frees *ret_path). */
int statedir_wal_path(const struct statedir *sd, const char *id, char **ret_path);
int statedir_archive_path(const struct statedir *sd, const char *id, char **ret_path);
int statedir_summary_path(const struct statedir *sd, const char *id, char **ret_path);
/* <root>/<name>. */
int statedir_file_path(const struct statedir *sd, const char *name, char **ret_path);

/* The mandate id of a directory entry NAME<suffix> (false: not one). */
bool statedir_entry_id(const char *name, const char *suffix, char *ret_id, size_t idlen);

/* Create root, wal/, archive/, mandates/ (mkdir -p, STATEDIR_DIR_MODE) and
 * make every entry durable in its parent, also for directories a previous
 * run created and then failed to fsync. *ret_failed names the path that
 * failed (not owned). */
int statedir_create(const struct statedir *sd, const struct kio *io, const char **ret_failed);

/* How files written without a sync of their own (summaries, archives, the
 * records recovery appends) are made durable on the file system that holds
 * path (docs/design.md §6 "Durable history on every file system"):
 * STATEDIR_SYNC_FS where one syncfs(2) is a barrier for the whole file
 * system (ext4, xfs, btrfs, ...), STATEDIR_SYNC_FILES elsewhere (FUSE, NFS,
 * SMB, 9p, ceph, any file system not known to be one): an fdatasync of each
 * file and an fsync of each directory.  *ret_fs_name names the file system
 * ("ext4", "fuse", "unknown"; static). */
enum statedir_sync {
        STATEDIR_SYNC_FS,
        STATEDIR_SYNC_FILES,
};
int statedir_sync_mode(const char *path, enum statedir_sync *ret_mode, const char **ret_fs_name);
/* The same from the f_type of statfs(2) (pure: for tests). */
enum statedir_sync statedir_sync_mode_of(unsigned long f_type, const char **ret_fs_name);

/* Whether a rename never synced survives a crash whole on the file system
 * that holds path: afterwards the file is under its old name or its new
 * one, never neither nor both (metadata journaled or copied on write).
 * WAL spares are renamed with no fsync of their directory only where it
 * does (docs/design.md §6 rule 1): xfs, btrfs, zfs, bcachefs, jfs, tmpfs,
 * ramfs, and ext4 with a journal (ext4 without one, ext2, is not: its
 * directory blocks are written back in any order).  *ret_why says which
 * ("ext4 without a journal"; static). */
int statedir_renames_atomic(const char *path, bool *ret_atomic, const char **ret_why);
/* The same from the f_type and st_dev of path, looking for the device's
 * journal under sysroot ("" for the running system: /sys/dev/block and
 * /proc/fs/jbd2; a test tree otherwise). */
int statedir_renames_atomic_of(unsigned long f_type, dev_t dev, const char *sysroot,
                               bool *ret_atomic, const char **ret_why);
