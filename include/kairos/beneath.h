/* SPDX-License-Identifier: MIT */
/* beneath: open a directory below a directory descriptor without following
 * any symbolic link and without ever leaving that directory's tree, however
 * the tree changes meanwhile (renames, symlink swaps).  Used by tool write to
 * stay within WriteRoots=.
 *
 * openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS) does the walk where the
 * kernel has it; elsewhere each component is opened with O_PATH | O_NOFOLLOW
 * relative to the previous one and must be a directory (fstat). */
#pragma once

#include <stddef.h>

/* Walk component by component even where openat2 exists (tests). */
#define BENEATH_NO_OPENAT2 0x1u

/* Open the directory rel (relative: no leading '/', no ".." component;
 * empty components and "." are skipped; "" or "." is root_fd's directory
 * itself) below the directory root_fd.  Every component must be a
 * directory and none may be a symbolic link, even one pointing within the
 * tree.  On success *ret_fd is an O_RDONLY | O_DIRECTORY | O_CLOEXEC
 * descriptor (usable for fsync) and 0 is returned.  Errors: -EINVAL rel is
 * absolute or has "..", -ELOOP a component is a symbolic link, -ENOTDIR one
 * is not a directory, -ENOENT one is missing, or what the kernel says
 * (-EACCES, -EXDEV, ...).  *ret_bad_len (may be NULL) is then the length of
 * the prefix of rel that ends with the offending component, or 0 when it is
 * not known (the tree changed while it was looked for). */
int beneath_open_dir(int root_fd, const char *rel, unsigned flags, int *ret_fd,
                     size_t *ret_bad_len);
