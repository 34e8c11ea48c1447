/* SPDX-License-Identifier: MIT */
/* beneath: see include/kairos/beneath.h. */
#include "kairos/beneath.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(SYS_openat2) && __has_include(<linux/openat2.h>)
#include <linux/openat2.h>
#define HAVE_OPENAT2 1
#endif

#define NAME_LEN_MAX 255

/* -EINVAL when rel is absolute or has a ".." component. */
static int check_rel(const char *rel)
{
        if (rel[0] == '/')
                return -EINVAL;
        for (const char *s = rel; *s;) {
                size_t n = strcspn(s, "/");
                if (n == 2 && s[0] == '.' && s[1] == '.')
                        return -EINVAL;
                s += n;
                while (*s == '/')
                        s++;
        }
        return 0;
}

/* One component at a time, each opened (O_PATH | O_NOFOLLOW) from the
 * previous directory and checked to be one; the last reopened for
 * reading. */
static int walk(int root_fd, const char *rel, int *ret_fd, size_t *ret_bad_len)
{
        int cur = root_fd;
        const char *s = rel;
        int r = 0;
        while (*s) {
                size_t n = strcspn(s, "/");
                const char *next = s + n;
                if (n == 0 || (n == 1 && s[0] == '.'))
                        goto skip;
                if (n > NAME_LEN_MAX) {
                        r = -ENAMETOOLONG;
                        goto bad;
                }
                char name[NAME_LEN_MAX + 1];
                memcpy(name, s, n);
                name[n] = '\0';
                /* O_PATH | O_NOFOLLOW opens whatever the name is (a
                 * symbolic link itself); fstat of that very object then
                 * tells what it is, whatever the name points to by now */
                int fd = openat(cur, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
                if (fd < 0) {
                        r = -errno;
                        goto bad;
                }
                struct stat st;
                if (fstat(fd, &st) < 0)
                        r = -errno;
                else if (S_ISLNK(st.st_mode))
                        r = -ELOOP;
                else if (!S_ISDIR(st.st_mode))
                        r = -ENOTDIR;
                if (r < 0) {
                        close(fd);
                        goto bad;
                }
                if (cur != root_fd)
                        close(cur);
                cur = fd;
        skip:
                s = next;
                while (*s == '/')
                        s++;
                continue;
        bad:
                if (ret_bad_len)
                        *ret_bad_len = (size_t)(next - rel);
                if (cur != root_fd)
                        close(cur);
                return r;
        }
        int fd = openat(cur, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                r = -errno;
        if (cur != root_fd)
                close(cur);
        if (r == 0)
                *ret_fd = fd;
        return r;
}

#ifdef HAVE_OPENAT2
/* -ENOSYS where the kernel (or a seccomp filter) has no openat2. */
static int open_beneath(int root_fd, const char *rel, int *ret_fd)
{
        struct open_how how = {
                .flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC,
                .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
        };
        /* EAGAIN: a rename elsewhere in the tree raced the lookup */
        for (int i = 0; i < 16; i++) {
                long fd = syscall(SYS_openat2, root_fd, *rel ? rel : ".", &how, sizeof how);
                if (fd >= 0) {
                        *ret_fd = (int)fd;
                        return 0;
                }
                if (errno != EAGAIN && errno != EINTR)
                        return errno == EPERM ? -ENOSYS : -errno;
        }
        return -EAGAIN;
}
#endif

int beneath_open_dir(int root_fd, const char *rel, unsigned flags, int *ret_fd,
                     size_t *ret_bad_len)
{
        if (ret_bad_len)
                *ret_bad_len = 0;
        if (!rel || !ret_fd || root_fd < 0)
                return -EINVAL;
        int r = check_rel(rel);
        if (r < 0)
                return r;
#ifdef HAVE_OPENAT2
        if (!(flags & BENEATH_NO_OPENAT2)) {
                r = open_beneath(root_fd, rel, ret_fd);
                if (r != -ENOSYS) {
                        if (r < 0 && ret_bad_len) {
                                /* which component?  the walk says (unless the
                                 * tree changed meanwhile) */
                                int fd, w = walk(root_fd, rel, &fd, ret_bad_len);
                                if (w == 0)
                                        close(fd);
                                if (w != r)
                                        *ret_bad_len = 0;
                        }
                        return r;
                }
        }
#else
        (void)flags;
#endif
        return walk(root_fd, rel, ret_fd, ret_bad_len);
}
