/* SPDX-License-Identifier: MIT */
/* verdict: the IdempotencyCheck (docs/design.md §7).  First match wins:
 *
 *   1 post_hash non-empty                         already_done  wal_recorded_completion
 *   2 expected_post and current_post equal        already_done  current_state_matches_expected_post
 *   3 status needs_review                          manual_review explicitly_marked_needs_review
 *   4 no observed_pre, status not executing/completed  safe_to_retry never_reached_executing
 *   5 pre_hash and current_pre equal               safe_to_retry current_pre_matches_expected
 *   6 otherwise                                    manual_review interrupted_during_execution
 *
 * NULL means absent; "" is present (as in legacy files, where "" is
 * truthy) except for row 1, which also requires a non-empty post_hash.  A
 * NULL status compares as "" (status.to_s). */
#include "kairos/verdict.h"
#include "kairos/kmem.h"

#include <errno.h>
#include <string.h>

static void verdict_set(struct verdict *out, enum verdict_kind kind, int row, const char *reason,
                        unsigned evidence)
{
        out->kind = kind;
        out->row = row;
        out->reason = reason;
        out->evidence = evidence;
}

void verdict_check(const struct verdict_step *s, const char *current_pre, const char *current_post,
                   struct verdict *out)
{
        const char *status = s->status ? s->status : "";

        *out = (struct verdict){
                .status = status,
                .result_hash = s->result_hash,
                .observed_pre_hash = s->observed_pre_hash,
                .expected_pre_hash = s->pre_hash,
        };

        if (s->post_hash && s->post_hash[0]) {
                verdict_set(out, VERDICT_ALREADY_DONE, 1, "wal_recorded_completion",
                            VERDICT_EV_RESULT_HASH);
                out->post_hash = s->post_hash;
                return;
        }

        if (s->expected_post_hash && current_post && strcmp(current_post, s->expected_post_hash) == 0) {
                verdict_set(out, VERDICT_ALREADY_DONE, 2, "current_state_matches_expected_post", 0);
                out->post_hash = current_post;
                return;
        }

        if (s->state == STEP_NEEDS_REVIEW) {
                verdict_set(out, VERDICT_MANUAL_REVIEW, 3, "explicitly_marked_needs_review",
                            VERDICT_EV_STATUS);
                return;
        }

        if (!s->observed_pre_hash && s->state != STEP_EXECUTING && s->state != STEP_COMPLETED) {
                verdict_set(out, VERDICT_SAFE_TO_RETRY, 4, "never_reached_executing",
                            VERDICT_EV_STATUS);
                return;
        }

        if (s->pre_hash && current_pre && strcmp(current_pre, s->pre_hash) == 0) {
                verdict_set(out, VERDICT_SAFE_TO_RETRY, 5, "current_pre_matches_expected", 0);
                return;
        }

        verdict_set(out, VERDICT_MANUAL_REVIEW, 6, "interrupted_during_execution",
                    VERDICT_EV_STATUS | VERDICT_EV_OBSERVED_PRE | VERDICT_EV_EXPECTED_PRE);
}

/* A member after the first: its key already written as JSON (",\"key\":"),
 * its value a string or null. */
static int put_member(struct kbuf *out, const char *lead, size_t lead_len, const char *value)
{
        int r = kbuf_append(out, lead, lead_len);
        if (r < 0)
                return r;
        if (!value)
                return kbuf_append(out, "null", 4);
        return kbuf_json_string(out, value, strlen(value));
}

#define LEAD(key) ",\"" key "\":", sizeof(",\"" key "\":") - 1

int verdict_evidence_json(const struct verdict *v, struct kbuf *out)
{
        size_t start = out->len;
        int r;

        if (!v->reason)
                return -EINVAL;

        const struct {
                unsigned bit;
                const char *lead;
                size_t lead_len;
                const char *value;
        } members[] = {
                { VERDICT_EV_RESULT_HASH, LEAD("result_hash"), v->result_hash },
                { VERDICT_EV_STATUS, LEAD("status"), v->status },
                { VERDICT_EV_OBSERVED_PRE, LEAD("observed_pre_hash"), v->observed_pre_hash },
                { VERDICT_EV_EXPECTED_PRE, LEAD("expected_pre_hash"), v->expected_pre_hash },
        };
        /* Room for the text with nothing to escape, made at once: the
         * buffer grows as member by member, to the same size (a caller may
         * keep it as it is), but in one step. */
        size_t room = sizeof("{\"reason\":\"\"}") - 1 + strlen(v->reason);
        for (size_t i = 0; i < sizeof members / sizeof members[0]; i++)
                if (v->evidence & members[i].bit)
                        room += members[i].lead_len +
                                (members[i].value ? strlen(members[i].value) + 2 : 4);
        if (v->extra_json && *v->extra_json)
                room += 1 + strlen(v->extra_json);
        r = kbuf_reserve(out, room);
        if (r < 0)
                goto fail;
        r = kbuf_append(out, "{\"reason\":", sizeof("{\"reason\":") - 1);
        if (r < 0)
                goto fail;
        r = kbuf_json_string(out, v->reason, strlen(v->reason));
        if (r < 0)
                goto fail;
        for (size_t i = 0; i < sizeof members / sizeof members[0]; i++)
                if ((v->evidence & members[i].bit) &&
                    (r = put_member(out, members[i].lead, members[i].lead_len,
                                    members[i].value)) < 0)
                        goto fail;
        if (v->extra_json && *v->extra_json) {
                r = kbuf_putc(out, ',');
                if (r >= 0)
                        r = kbuf_puts(out, v->extra_json);
                if (r < 0)
                        goto fail;
        }
        r = kbuf_putc(out, '}');
        if (r < 0)
                goto fail;
        return 0;

fail:
        kbuf_truncate(out, start);
        return r;
}

const char *verdict_kind_name(enum verdict_kind k)
{
        static const char *const names[] = {
                [VERDICT_ALREADY_DONE] = "already_done", [VERDICT_SAFE_TO_RETRY] = "safe_to_retry",
                [VERDICT_MANUAL_REVIEW] = "manual_review",
        };
        return ENUM_NAME(names, k, "unknown");
}
