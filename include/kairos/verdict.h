/* SPDX-License-Identifier: MIT */
/* verdict: the IdempotencyCheck (docs/design.md §7).  Pure function, no I/O; first
 * matching row wins. */
#pragma once

#include "kairos/fold.h"
#include "kairos/kbuf.h"

enum verdict_kind {
        VERDICT_ALREADY_DONE,
        VERDICT_SAFE_TO_RETRY,
        VERDICT_MANUAL_REVIEW,
};

/* The step as folded from the WAL; NULL = absent ("" is present but empty). */
struct verdict_step {
        enum step_status state;
        const char *status;              /* as recorded (text), for the evidence */
        const char *pre_hash;            /* expected pre, from the plan */
        const char *expected_post_hash;
        const char *observed_pre_hash;   /* from the executing record */
        const char *post_hash;
        const char *result_hash;
};

/* Which evidence keys the row reports (besides reason). */
enum {
        VERDICT_EV_RESULT_HASH = 1 << 0,
        VERDICT_EV_STATUS = 1 << 1,
        VERDICT_EV_OBSERVED_PRE = 1 << 2,
        VERDICT_EV_EXPECTED_PRE = 1 << 3,
};

struct verdict {
        enum verdict_kind kind;
        int row;                    /* 1..6 of the table */
        const char *reason;         /* evidence.reason */
        const char *post_hash;      /* already_done only */
        unsigned evidence;          /* VERDICT_EV_* */
        const char *result_hash;
        const char *status;         /* "" when the step had none */
        const char *observed_pre_hash;
        const char *expected_pre_hash;
        const char *extra_json;     /* more evidence members ("k":v,...), or NULL */
};

/* current_pre / current_post: world-state hashes at recovery time, or NULL.
 * Pointers in out borrow from s and the arguments. */
void verdict_check(const struct verdict_step *s, const char *current_pre, const char *current_post,
                   struct verdict *out);

/* Evidence object as JSON, keys in the legacy order, absent values null:
 * {"reason":…[,"result_hash"][,"status"][,"observed_pre_hash","expected_pre_hash"]} */
int verdict_evidence_json(const struct verdict *v, struct kbuf *out);

const char *verdict_kind_name(enum verdict_kind k);
