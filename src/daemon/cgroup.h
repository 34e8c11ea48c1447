/* SPDX-License-Identifier: MIT */
/* cgroup: each handler in its own cgroup below kairosd's delegated one.
 *
 * Under systemd with Delegate=yes, kairosd's service cgroup is its own to
 * manage (cgroup v2 only).  At start cgroup_ctl_new finds it
 * (/proc/self/cgroup), checks it is writable and holds kairosd alone, moves
 * kairosd into the leaf <service>/daemon (a cgroup with processes cannot
 * enable controllers for its children) and enables what it can of
 * +memory +pids +cpu in
 * <service>/cgroup.subtree_control.  Each handler then gets
 * <service>/h-<step id>-<counter>, with memory.max, pids.max and cpu.max from
 * the schedule's MemoryMax=, TasksMax= and CPUQuota=; the child joins it
 * before exec.  When the handler exits the cgroup is killed (cgroup.kill, or
 * every pid in cgroup.procs until it is empty) and removed, so nothing it
 * started outlives its step, setsid or not.
 *
 * On a hybrid host (controllers on cgroup v1) the v2 hierarchy at
 * /sys/fs/cgroup/unified serves for the kill alone.
 *
 * Without such a cgroup (not under systemd, no Delegate=yes, cgroup v1 only)
 * cgroup_ctl_new gives NULL and why: handlers run as before, in their own
 * process group, and the limits are not enforced (kairosd warns). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cgroup_ctl;

struct cgroup_limits {
        uint64_t memory_max;    /* bytes; 0 none, UINT64_MAX "max" */
        uint64_t tasks_max;     /* 0 none, UINT64_MAX "max" */
        uint64_t cpu_quota_pct; /* 0 none */
};

struct cgroup_handler {
        char name[96];          /* below the service cgroup */
        int dir_fd;             /* the handler's cgroup directory, -1 none */
        int procs_fd;           /* its cgroup.procs, open for writing, -1 none */
};

/* 0 and *ret: the delegated cgroup, ready; or 0 and *ret NULL with why
 * filled: none (handlers get no cgroup); a negative errno: a delegated
 * cgroup that could not be set up (also described in why). */
int cgroup_ctl_new(struct cgroup_ctl **ret, char *why, size_t why_len);
void cgroup_ctl_free(struct cgroup_ctl *c);
enum { CGROUP_MEMORY = 1, CGROUP_PIDS = 2, CGROUP_CPU = 4 };
/* The controllers enabled for handlers, and the names of those that could
 * not be ("memory pids", "" none): a limit that needs a missing one is not
 * set (kairosd warns at start and reload). */
unsigned cgroup_ctl_controllers(const struct cgroup_ctl *c);
const char *cgroup_ctl_missing(const struct cgroup_ctl *c);
/* The service cgroup's path below the mount, e.g. "/system.slice/kairosd.service". */
const char *cgroup_ctl_path(const struct cgroup_ctl *c);
/* The cgroup v2 mount: /sys/fs/cgroup, or /sys/fs/cgroup/unified on a
 * hybrid host (no controllers there: cgroups only for the kill). */
const char *cgroup_ctl_mount(const struct cgroup_ctl *c);

/* Create the handler's cgroup, named after hint (sanitized) and a counter,
 * and set its limits.  Not thread-safe against itself (one thread calls it).
 * On failure nothing is left and *ret_what names the file that failed. */
int cgroup_handler_create(struct cgroup_ctl *c, const char *hint, const struct cgroup_limits *l,
                          struct cgroup_handler *ret, const char **ret_what);
/* Did the OOM killer kill a process of it (memory.events oom_kill > 0)? */
bool cgroup_handler_oom_killed(const struct cgroup_handler *h);
/* SIGKILL everything in it (cgroup.kill; without it, each pid of
 * cgroup.procs, repeated until empty or timeout_ms), then rmdir it (waiting
 * up to timeout_ms for it to empty) and close its fds.  0 or a negative
 * errno (the directory may be left behind). */
int cgroup_handler_destroy(struct cgroup_ctl *c, struct cgroup_handler *h, int timeout_ms);
void cgroup_handler_init(struct cgroup_handler *h);
