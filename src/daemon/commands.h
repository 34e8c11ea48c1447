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
