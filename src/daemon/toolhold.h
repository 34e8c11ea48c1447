/* SPDX-License-Identifier: MIT */
/* toolhold: recovery holds the decision of a step whose `tool run` outlived
 * a crash of kairosd (docs/design.md §8, §10, §11).
 *
 * A tool run's client (kairosctl) leads a process group of its own that the
 * keeper leaves alone when kairosd dies: its command runs on, and the client
 * keeps the outcome until a kairosd answers on the socket again.  Recovery
 * (recover.c) finds such a step from the idempotency store: an open call
 * whose recorded client (pid and start time) still runs — toolhold_find
 * opens a pidfd for each, on the pool.  Instead of deciding, it leaves the
 * mandate `probing` and hands the step here (toolhold_start, on the loop):
 * each client's pidfd is watched on the loop (uv_poll), with a timer of
 * ToolGraceSec=.  The step is decided again (the callback: recovery's
 * decision of the mandate, from the store as it is then) as soon as
 *  - a client finished its call (toolhold_finished, from tool-finish): the
 *    call is completed in the store, the step is decided as a finished call;
 *  - every client exited: a call left open is decided as before;
 *  - ToolGraceSec= passed: the clients still running are killed (their
 *    process groups), logged, and the step is decided as before.
 * A mandate cancelled meanwhile: its clients are killed, nothing decided
 * here.  kairosd stopping: the clients still running are killed (a stop
 * leaves no process of kairosd's behind), the watches end; the next start
 * decides the step without them. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kairos/evidence.h"

struct daemon;
struct mandate;

/* The most clients one step waits for. */
#define TOOLHOLD_MAX 8

struct toolhold_client {
        int pidfd;
        pid_t pid;
        char key[IDEM_FULL_KEY_SIZE];
};

/* On any thread: the clients of step_id's open calls among calls that still
 * run (a pidfd to each, opened before its start time is checked against the
 * recorded one: a pid given to a later process is not trusted).  How many
 * (at most max) in out. */
size_t toolhold_find(const struct evidence_call *calls, size_t n, const char *step_id,
                     struct toolhold_client *out, size_t max);
/* Close the pidfds of clients (not handed to toolhold_start). */
void toolhold_release(struct toolhold_client *clients, size_t n);

/* m (probing) waits for clients of step_id (taken over), at most grace_ms;
 * then decide(d, mandate_id) runs once, on the loop, unless m was
 * cancelled. */
typedef void (*toolhold_decide_fn)(struct daemon *d, const char *mandate_id);
void toolhold_start(struct mandate *m, const char *step_id, struct toolhold_client *clients,
                    size_t n, uint64_t grace_ms, toolhold_decide_fn decide);
/* A call of mandate_id's held step was finished by its client. */
void toolhold_finished(struct daemon *d, const char *mandate_id);
/* m is being cancelled: its held clients are killed. */
void toolhold_cancel(struct mandate *m);
/* kairosd stops: the clients still running are killed, every watch ends. */
void toolhold_stop(struct daemon *d);
