/* SPDX-License-Identifier: MIT */
/* carry: which steps of an ended mandate a retry from one of its steps
 * takes as completed (kairosctl retry --from; docs/design.md §6, "Carried
 * steps").  Pure, no I/O. */
#pragma once

#include <stddef.h>

#include "kairos/fold.h"
#include "kairos/planner.h"

/* One step taken as completed, with its recorded result.  Strings are
 * borrowed from the fold. */
struct carry_step {
        const char *step_id;
        const char *post_hash;
        const char *result_hash;
        const char *result_json;   /* NULL: the record held none ("null" is written) */
};

struct carry {
        long long cycle;           /* the cycle of the step to run from */
        const char *from_step;     /* its step id (borrowed) */
        struct carry_step steps[PLANNER_PHASES - 1]; /* the steps before it, in plan order */
        size_t nsteps;
        /* cycle >= 2: the cycle before it as it ended (finalized with
         * prev_status, prev_reason), with its steps that completed, so the
         * steps of `cycle` read its reflect (previous_reflect) as they did;
         * prev_status PLAN_OPEN: none (cycle 1, or it was never finalized) */
        enum plan_status prev_status;
        const char *prev_reason;
        struct carry_step prev_steps[PLANNER_PHASES];
        size_t prev_nsteps;
};

/* The step `from` of the mandate folded in f — a step id of it ("act_002")
 * or a phase name ("act": that phase's step in the mandate's last cycle) —
 * and the steps of its cycle before it, each of which must have completed;
 * and the cycle before it, finalized, with its completed steps.
 * 0, or -EINVAL with a message naming args.from in msg (a step that is not
 * in the mandate; a step before it that did not complete).  msg may be
 * NULL. */
int carry_select(const struct fold *f, const char *from, struct carry *ret_carry, char *msg,
                 size_t msg_size);
