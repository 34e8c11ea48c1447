/* SPDX-License-Identifier: MIT */
/* procstat: see kairos/procstat.h. */
#include "kairos/procstat.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
#include <stdbool.h>
#include <string.h>

/* The unsigned decimal at *p (advanced past it); false if none or too large. */
static bool number(const char **p, const char *end, uint64_t *ret)
{
        uint64_t v = 0;
        const char *s = *p;
        if (s >= end || *s < '0' || *s > '9')
                return false;
        for (; s < end && *s >= '0' && *s <= '9'; s++) {
                if (v > (UINT64_MAX - 9) / 10)
                        return false;
                v = v * 10 + (uint64_t)(*s - '0');
        }
        *p = s;
        *ret = v;
        return true;
}

int procstat_parse(const char *text, size_t len, struct procstat *ret)
{
        if (!text || !ret)
                return -EINVAL;
        const char *end = text + len, *close = NULL;
        for (const char *p = text; p < end; p++)
                if (*p == ')')
                        close = p;
        if (!close || close + 3 >= end || close[1] != ' ')
                return -EINVAL;
        /* field 3, the state, then fields 4 (ppid) to 22 (starttime): each
         * an integer (some may be negative: tty_nr, ...) after one space */
        const char *p = close + 2;
        char state = *p++;
        uint64_t v = 0, pgrp = 0;
        for (int field = 4; field <= 22; field++) {
                if (p >= end || *p != ' ')
                        return -EINVAL;
                p++;
                if (p < end && *p == '-')
                        p++;
                if (!number(&p, end, &v))
                        return -EINVAL;
                if (field == 5)
                        pgrp = v;
        }
        if (pgrp > INT32_MAX)
                return -EINVAL;
        *ret = (struct procstat){ .state = state, .pgrp = (int32_t)pgrp, .start = v };
        return 0;
}

bool procstat_same_process(const struct procstat *st, uint64_t recorded_start)
{
        return st && st->state != 'Z' && st->state != 'X' && st->start == recorded_start;
}

int procstat_read(int pid, struct procstat *ret)
{
        char path[64], buf[1024];
        if (pid <= 0)
                return -ESRCH;
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return errno == ENOENT ? -ESRCH : -errno;
        ssize_t n = read(fd, buf, sizeof buf);
        int e = errno;
        close(fd);
        if (n < 0)
                return e == ESRCH ? -ESRCH : -e;
        if (n == 0)
                return -ESRCH;
        return procstat_parse(buf, (size_t)n, ret);
}
