/* SPDX-License-Identifier: MIT */
/* conninfo: a connection string from a command-line argument (conninfo.h). */
#include "conninfo.h"

#include <errno.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CONNINFO_FILE_MAX 65536

/* -EINVAL when libpq cannot parse it (why: libpq's message, one line),
 * else whether it sets a password (1) or not (0). */
static int has_password(const char *conninfo, char *why, size_t why_len)
{
        char *err = NULL;
        PQconninfoOption *opts = PQconninfoParse(conninfo, &err);
        if (!opts) {
                if (!err)
                        return -ENOMEM;
                /* the message quotes no value, but may span lines */
                snprintf(why, why_len, "not a connection string libpq can read: %s", err);
                for (char *p = why; *p; p++)
                        if (*p == '\n')
                                *p = ' ';
                size_t n = strlen(why);
                while (n && why[n - 1] == ' ')
                        why[--n] = '\0';
                PQfreemem(err);
                return -EINVAL;
        }
        bool pw = false;
        for (PQconninfoOption *o = opts; o->keyword; o++)
                if (strcmp(o->keyword, "password") == 0 && o->val && *o->val)
                        pw = true;
        PQconninfoFree(opts);
        return pw;
}

static int read_conninfo_file(const char *path, char **ret, char *why, size_t why_len)
{
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        struct stat st;
        char *buf = NULL;
        size_t len = 0;
        int r = 0;
        if (fd < 0 || fstat(fd, &st) < 0) {
                r = -errno;
                snprintf(why, why_len, "cannot read %s: %s", path, strerror(-r));
                goto out;
        }
        if (!S_ISREG(st.st_mode) || st.st_size > CONNINFO_FILE_MAX) {
                snprintf(why, why_len, "%s: %s", path, S_ISREG(st.st_mode)
                         ? "too large for a connection string (at most 64 KiB)"
                         : "not a regular file");
                r = -EINVAL;
                goto out;
        }
        buf = malloc(CONNINFO_FILE_MAX + 1);
        if (!buf) {
                r = -ENOMEM;
                goto out;
        }
        for (;;) {
                ssize_t n = read(fd, buf + len, CONNINFO_FILE_MAX + 1 - len);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0) {
                        r = -errno;
                        snprintf(why, why_len, "cannot read %s: %s", path, strerror(-r));
                        goto out;
                }
                if (n == 0)
                        break;
                len += (size_t)n;
                if (len > CONNINFO_FILE_MAX) {
                        snprintf(why, why_len, "%s: too large for a connection string (at "
                                 "most 64 KiB)", path);
                        r = -EINVAL;
                        goto out;
                }
        }
        while (len && strchr(" \t\r\n", buf[len - 1]))
                len--;
        buf[len] = '\0';
        if (len == 0 || memchr(buf, '\0', len)) {
                snprintf(why, why_len, "%s: %s", path, len ? "holds a NUL byte"
                                                           : "is empty (no connection string)");
                r = -EINVAL;
                goto out;
        }
        *ret = buf;
        buf = NULL;
out:
        if (fd >= 0)
                close(fd);
        free(buf);
        return r;
}

int conninfo_from_arg(const char *arg, char **ret_conninfo, char *why, size_t why_len)
{
        char *s = NULL;
        int r;
        if (!arg || !ret_conninfo || !why || !why_len)
                return -EINVAL;
        why[0] = '\0';
        if (arg[0] == '@') {
                r = read_conninfo_file(arg + 1, &s, why, why_len);
                if (r < 0)
                        return r;
                r = has_password(s, why, why_len);
        } else {
                if (!(s = strdup(arg)))
                        return -ENOMEM;
                r = has_password(s, why, why_len);
                if (r == 1) {
                        snprintf(why, why_len, "the connection string holds a password, which "
                                 "every user of this host can read in /proc/PID/cmdline: "
                                 "write it in a file given as @FILE (mode 0600), or leave it "
                                 "to ~/.pgpass, PGPASSFILE or PGPASSWORD");
                        r = -EINVAL;
                }
        }
        if (r < 0) {
                free(s);
                return r;
        }
        *ret_conninfo = s;
        return 0;
}
