/* SPDX-License-Identifier: MIT */
/* toolhold: recovery holds the decision of a step whose `tool run` outlived
 * a crash of kairosd (docs/design.md §8, §10, §11; "The hold").  Recovery
 * (recover.c) finds the step's open calls whose recorded client still runs
 * (toolhold_find, on the pool), leaves the mandate `probing` and hands the
 * step here (toolhold_start, on the loop): each client's pidfd is watched,
 * with a timer of ToolGraceSec=.  The step is decided again (the callback)
 * as soon as a client finished its call (toolhold_finished, from
 * tool-finish), every client exited, or ToolGraceSec= passed (the clients
 * still running are killed).  A cancelled mandate or kairosd stopping kills
 * the clients still running and decides nothing here. */
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
