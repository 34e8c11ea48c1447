/* SPDX-License-Identifier: MIT */
/* stepdoc: the JSON document a step's handler reads on stdin (kairosd(8),
 * HANDLERS): mandate, goal, plan, step, the results of the earlier phases of
 * its cycle and the previous cycle's reflect.  Pure; the executor gives it to
 * every handler, and a probe gets the same document for the step it judges. */
#pragma once

#include <stddef.h>

#include "kairos/fold.h"
#include "kairos/kbuf.h"

struct stepdoc_input {
        const char *mandate_id;
        const char *schedule;     /* NULL: unknown */
        const char *fired_at;     /* NULL: unknown */
        const char *goal;         /* NULL: the schedule's name */
        unsigned max_cycles;
        unsigned attempt;
        const char *idem_key;
};

/* The document of step idx of plan p (a plan of f), one line with its
 * newline, into out (emptied first).  0 or -ENOMEM. */
int stepdoc_build(const struct fold *f, const struct fold_plan *p, size_t idx,
                  const struct stepdoc_input *in, struct kbuf *out);
