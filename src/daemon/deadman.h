/* SPDX-License-Identifier: MIT */
/* deadman: kills this node's handlers at its lease deadline even when
 * kairosd itself cannot (stopped by SIGSTOP, hung, or dead) — cluster mode.
 * deadman_start forks a small watcher process before kairosd starts any
 * thread; kairosd sends it the deadline (CLOCK_MONOTONIC) and the handler
 * process groups to watch, each with its cgroup directory if it has one.
 * What it kills and when, its signals, its limits (DEADMAN_MAX_WATCHED,
 * the overflow) and process id reuse: docs/design.md §14, "The deadman".
 * deadman_stop is the clean end: the watcher exits and kills nothing.
 *
 * Calls: every function but deadman_start and deadman_stop is one write(2)
 * of one record (at most PIPE_BUF bytes, hence atomic), never blocks (the
 * write end is non-blocking), takes no lock and allocates nothing: they may
 * be called from any thread, and deadman_watch/deadman_unwatch also in a
 * child between clone/fork and exec.  A full pipe (the watcher is stopped
 * or starved) is -EAGAIN and the record is not sent; a dead watcher is
 * -EPIPE (kairosd ignores SIGPIPE).  The write end is O_CLOEXEC, so
 * handlers never inherit it.  kairosd must unwatch a handler's group before
 * it reaps the group's leader. */
#pragma once

#include <stdint.h>
#include <stdbool.h>
#include <sys/types.h>

/* The most groups the watcher keeps at once. */
#define DEADMAN_MAX_WATCHED 4096
/* The longest cgroup directory path, NUL excluded. */
#define DEADMAN_CGROUP_PATH_MAX 1007

struct deadman;

/* Fork the watcher.  Call it in kairosd before any thread exists (the
 * child of a fork may only call async-signal-safe functions otherwise) and
 * after kairosd moved into its leaf cgroup (cgroup_ctl_new: the delegated
 * cgroup must hold kairosd alone when it looks).  0 and *ret, or a negative
 * errno (pipe, fork, ENOMEM). */
int deadman_start(struct deadman **ret);

/* The deadline, in milliseconds of CLOCK_MONOTONIC (a later one renews, an
 * earlier one shortens); 0: none.  -EINVAL for a negative one. */
int deadman_set_deadline(struct deadman *dm, int64_t mono_ms);

/* Watch process group pgid and, if cgroup_dir is not NULL nor empty, the
 * cgroup at that absolute path (it must be on a cgroup file system when
 * the kill comes; else only the group is killed).  Watching a group again
 * replaces its cgroup.  -EINVAL: pgid <= 1, kairosd's own group, the
 * watcher's, or a cgroup_dir that is relative or holds a "..";
 * -ENAMETOOLONG: cgroup_dir longer than DEADMAN_CGROUP_PATH_MAX. */
int deadman_watch(struct deadman *dm, pid_t pgid, const char *cgroup_dir);

/* Forget pgid (and its cgroup); unknown to the watcher: nothing happens.
 * Before its leader is reaped (above).  -EINVAL: pgid <= 1. */
int deadman_unwatch(struct deadman *dm, pid_t pgid);

/* The clean end: the watcher exits without killing anything, and is
 * reaped.  Waits at most about 2 s; a watcher that did not get the word
 * (pipe full) sees end-of-file instead and kills what it watches.  NULL is
 * fine. */
void deadman_stop(struct deadman *dm);

/* How many times the watcher killed at a deadline (while it watched
 * something) so far, counted before it kills: a handler that was watched
 * and died by SIGKILL while this changed was killed by the watcher (or
 * would have been), not by its own fault.  0 for NULL. */
uint64_t deadman_kills(const struct deadman *dm);

/* The watcher's pid (for the log). */
pid_t deadman_pid(const struct deadman *dm);

/* Close every fd from lowfd up (close_range, else one by one); only
 * async-signal-safe calls: for a child between fork and exec (the watcher,
 * the keeper). */
void deadman_close_from(int lowfd);
/* Wait at most ms for pid, a child of ours, to exit (on its pidfd when
 * pidfd >= 0, else polling), then SIGKILL and reap it.  True if it had to
 * be killed (the watcher's and the keeper's bounded exits). */
bool deadman_reap_within(pid_t pid, int pidfd, int ms);

/* Test support: a watcher that keeps at most max_watched groups. */
int deadman_start_max(struct deadman **ret, unsigned max_watched);
