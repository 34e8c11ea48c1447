/* SPDX-License-Identifier: MIT */
/* procstat: the fields of /proc/PID/stat that tell one process from a later
 * one given the same pid (docs/design.md §11, a tool call's client).  The
 * parser is pure; procstat_read reads the file (procfs: served from memory,
 * never waits on a disk). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct procstat {
        char state;         /* R, S, D, Z, ... */
        int32_t pgrp;       /* its process group */
        uint64_t start;     /* start time, clock ticks after boot (field 22) */
};

/* Parse the text of /proc/PID/stat (the name in parentheses may hold any
 * byte, ')' and spaces included: the fields follow the last ')').  0, or
 * -EINVAL when it is not such a text. */
int procstat_parse(const char *text, size_t len, struct procstat *ret);

/* Is the process now described by st the one that had start time
 * recorded_start?  Not when it started at another time (the pid was given to
 * a later process) nor when it is a zombie (it has exited). */
bool procstat_same_process(const struct procstat *st, uint64_t recorded_start);

/* Read and parse /proc/PID/stat.  0, -ESRCH when there is no such process
 * (or pid <= 0), -EINVAL when its text does not parse, or -errno. */
int procstat_read(int pid, struct procstat *ret);
