/* SPDX-License-Identifier: MIT */
/* deadman: kills this node's handlers at its lease deadline even when
 * kairosd itself cannot (stopped by SIGSTOP, hung, or dead) — cluster mode
 * (docs/design.md §14).
 *
 * deadman_start forks a small watcher process (not an exec of kairosd),
 * before kairosd starts any thread.  kairosd tells it, through a pipe of
 * fixed-size records, a deadline on CLOCK_MONOTONIC and the handler process
 * groups to watch, each with its cgroup directory if it has one.  The
 * watcher SIGKILLs every watched group (kill(-pgid)) and cgroup (writes "1"
 * to cgroup.kill; without it, SIGKILLs every pid of cgroup.procs until it
 * is empty, a bounded number of rounds) and forgets them:
 *  - when the deadline passes (then it goes on waiting: while the deadline
 *    is past, a group watched later is killed at once);
 *  - when the pipe reaches end-of-file: kairosd is gone (kill -9
 *    included).  Then it exits.
 * deadman_stop is the clean end: the watcher exits and kills nothing.
 *
 * The watcher closes every descriptor it inherited (but stderr), leaves
 * kairosd's process group (its own, so a terminal's ^C or ^Z or a
 * `kill -TERM -PGID` of kairosd's group does not reach it), ignores SIGINT,
 * SIGTERM, SIGHUP, SIGQUIT, SIGTSTP, SIGTTIN, SIGTTOU, SIGUSR1, SIGUSR2 and
 * SIGPIPE, is named "kairosd-deadman", allocates one table at start and
 * nothing after, and waits only in poll() with a timeout taken from the
 * deadline.  It reads every record already written before it acts on a
 * deadline, so a renewal or an unwatch written before the deadline is
 * never late.  A deadline is held on CLOCK_BOOTTIME once received, so a
 * host that was suspended past it kills at resume (within a second).
 *
 * The watched set holds at most DEADMAN_MAX_WATCHED groups.  A watch
 * beyond that (after forgetting groups that no longer exist) cannot be
 * kept: the watcher then remembers it overflowed, and at the deadline it
 * also kills the process group of every child of kairosd that leads its own
 * group (handlers do, kairosd's own helpers do not) — found in /proc — so
 * that a group it could not record still dies.  Past EOF the overflowed
 * groups are left to PR_SET_PDEATHSIG and the runner's keeper.
 *
 * Process id reuse: kairosd must unwatch a handler's group before it reaps
 * the group's leader.  Until the leader is reaped its pid (the group id)
 * cannot be given to another process, so while kairosd is stopped no
 * watched group id can be reused; and the watcher reads every unwatch
 * written before it kills.  It also notes the leader's start time when it
 * is told to watch and does not kill a group whose leader id now belongs to
 * a process that started at another time.  The window left is a stale
 * entry (an unwatch lost to a full pipe) whose id was reused by a new group
 * whose own leader has already exited.
 *
 * Calls: every function but deadman_start and deadman_stop is one write(2)
 * of one record (at most PIPE_BUF bytes, hence atomic), never blocks (the
 * write end is non-blocking), takes no lock and allocates nothing: they may
 * be called from any thread, and deadman_watch/deadman_unwatch also in a
 * child between clone/fork and exec.  A full pipe (the watcher is stopped
 * or starved) is -EAGAIN and the record is not sent; a dead watcher is
 * -EPIPE (kairosd ignores SIGPIPE).  The write end is O_CLOEXEC, so
 * handlers never inherit it. */
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
