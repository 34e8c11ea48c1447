/* SPDX-License-Identifier: MIT */
/* cgroup: each handler in its own cgroup below kairosd's delegated one
 * (under systemd, Delegate=yes), with memory.max, pids.max and cpu.max from
 * the schedule's MemoryMax=, TasksMax= and CPUQuota=, a controller cgroup
 * v2 cannot give taken from its v1 hierarchy; the child joins it before
 * exec, and when the handler exits the cgroup is killed and removed, so
 * nothing it started outlives its step.  How the cgroups are found, made
 * and killed on v2, hybrid and v1 hosts: docs/design.md, "Handler cgroups".
 *
 * Without any such cgroup (not under systemd, no Delegate=, nothing
 * writable) cgroup_ctl_new gives NULL and why: handlers run as before, in
 * their own process group, and the limits are not enforced (kairosd warns). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct cgroup_ctl;

struct cgroup_limits {
        uint64_t memory_max;    /* bytes; 0 none, UINT64_MAX "max" */
        uint64_t tasks_max;     /* 0 none, UINT64_MAX "max" */
        uint64_t cpu_quota_pct; /* 0 none */
};

/* Where a handler's cgroup lives: the cgroup v2 hierarchy and the v1
 * hierarchies of memory, pids and cpu (each where the controller came from
 * v1; CGROUP_AT_V2 also without controllers, for the kill). */
enum { CGROUP_AT_V2, CGROUP_AT_MEMORY, CGROUP_AT_PIDS, CGROUP_AT_CPU, CGROUP_AT_N };

struct cgroup_handler {
        char name[96];              /* below kairosd's cgroup, the same in each hierarchy */
        int dir_fd[CGROUP_AT_N];    /* the handler's cgroup directories, -1 none */
        int procs_fd[CGROUP_AT_N];  /* their cgroup.procs, open for writing, -1 none; the
                                     * child writes "0" to each before exec */
};

/* 0 and *ret: the delegated cgroup, ready; or 0 and *ret NULL with why
 * filled: none (handlers get no cgroup); a negative errno: a delegated
 * cgroup that could not be set up (also described in why). */
int cgroup_ctl_new(struct cgroup_ctl **ret, char *why, size_t why_len);
void cgroup_ctl_free(struct cgroup_ctl *c);
/* The directory of kairosd's cgroup in the first hierarchy used (the v2 one
 * if any: *ret_v2), below which each handler's cgroup has its name: 0, or
 * -ENAMETOOLONG / -ENOENT. */
int cgroup_ctl_kill_dir(const struct cgroup_ctl *c, char *buf, size_t len, bool *ret_v2);
enum { CGROUP_MEMORY = 1, CGROUP_PIDS = 2, CGROUP_CPU = 4 };
/* The controllers enabled for handlers, and the names of those that could
 * not be ("memory pids", "" none): a limit that needs a missing one is not
 * set (kairosd warns at start and reload). */
unsigned cgroup_ctl_controllers(const struct cgroup_ctl *c);
const char *cgroup_ctl_missing(const struct cgroup_ctl *c);
/* Where handlers' cgroups go, for the log: "/sys/fs/cgroup/system.slice/kairosd.service",
 * then ", memory on cgroup v1 at /sys/fs/cgroup/memory/…" for each v1 one. */
const char *cgroup_ctl_where(const struct cgroup_ctl *c);

/* Create the handler's cgroup, named after hint (sanitized) and a counter,
 * and set its limits.  Not thread-safe against itself (one thread calls it).
 * On failure nothing is left and *ret_what names the file that failed. */
int cgroup_handler_create(struct cgroup_ctl *c, const char *hint, const struct cgroup_limits *l,
                          struct cgroup_handler *ret, const char **ret_what);
/* Has it a cgroup at all? */
bool cgroup_handler_active(const struct cgroup_handler *h);
/* Did the OOM killer kill a process of it (v2: memory.events oom_kill > 0;
 * v1: memory.oom_control oom_kill > 0)? */
bool cgroup_handler_oom_killed(const struct cgroup_handler *h);
/* SIGKILL what it holds now, without waiting (cgroup.kill; on v1, or
 * before Linux 5.14, each pid listed once).  For the loop: small reads of
 * cgroupfs only. */
void cgroup_handler_kill(const struct cgroup_handler *h);
/* Close the cgroup.procs fds (once the child has joined). */
void cgroup_handler_close_procs(struct cgroup_handler *h);
/* Close every fd, leaving the directories behind. */
void cgroup_handler_abandon(struct cgroup_handler *h);
/* SIGKILL everything in it (cgroup.kill; without it, each pid of
 * cgroup.procs, repeated until empty or timeout_ms), then rmdir it in each
 * hierarchy (waiting up to timeout_ms for it to empty) and close its fds.  0 or a negative
 * errno (the directory may be left behind). */
int cgroup_handler_destroy(struct cgroup_ctl *c, struct cgroup_handler *h, int timeout_ms);
void cgroup_handler_init(struct cgroup_handler *h);

/* Parsers of /proc/self/cgroup and /proc/self/mountinfo (for the tests).
 * cgroup_parse_own: the path of the v2 hierarchy ("0::/PATH", controller
 * NULL) or of the v1 one of controller ("ID:a,b:/PATH"); 0 and *ret
 * (malloc'ed), -ENOENT or -ENOMEM.  cgroup_parse_mountinfo: the mount point
 * of controller's v1 hierarchy (type "cgroup", controller one of the super
 * options) and its root ("/", but in a bind mount of a cgroup below it);
 * a mount point with an escaped character is skipped; 0 or -ENOENT. */
int cgroup_parse_own(FILE *f, const char *controller, char **ret);
int cgroup_parse_mountinfo(FILE *f, const char *controller, char *ret_mnt, size_t mnt_len,
                           char *ret_root, size_t root_len);
