/* SPDX-License-Identifier: MIT */
/* commands: speaks the control protocol (docs/design.md §2).  main.c hands
 * these to control (control_set_commands). */
#pragma once

#include <stdbool.h>

struct control_request;

/* Carry out one request; it is answered through control_reply_*. */
void commands_dispatch(struct control_request *req);
/* Is cmd the name of a command? */
bool commands_known(const char *cmd);
/* wait: a request waits for its mandate to settle; at most
 * COMMANDS_WAIT_MAX_PER_CONN per connection and COMMANDS_WAIT_MAX in all
 * (beyond: "too_many_waiters"). */
#define COMMANDS_WAIT_MAX_PER_CONN 16
#define COMMANDS_WAIT_MAX 1024
struct mandate;
struct daemon;
/* A mandate's status changed (daemon_upcalls.status_changed): its waiters
 * are answered on the next turn of the loop if it settled. */
void commands_status_changed(struct mandate *m);
/* kairosd stops (daemon_upcalls.stopping): every waiter is answered,
 * "shutting_down" unless its mandate settled. */
void commands_stopping(struct daemon *d);
