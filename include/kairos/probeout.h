/* SPDX-License-Identifier: MIT */
/* probeout: what a probe's run says (docs/design.md §8.1, source 4).  Pure,
 * no I/O: kairosd (after READY=1) and `kairosctl recover --dry-run --probe`
 * run the probe their own way and both judge its end with probe_judge, so
 * they cannot read the same output differently.
 *
 * The answer is the probe's stdout, strictly one of
 *     {"state":"done","result":VALUE}     → RECOVERY_PROBE_DONE (VALUE kept)
 *     {"state":"not_started"}             → RECOVERY_PROBE_NOT_STARTED
 * (whitespace around it allowed, no other member, no member twice), from a
 * probe that exited 0 in time.  Anything else — another document, text,
 * nothing, more than PROBE_STDOUT_MAX bytes, a non-zero exit, a signal, a
 * timeout, a probe that could not start — is RECOVERY_PROBE_FAILED, with
 * what happened and what it printed (at most PROBE_EVIDENCE_MAX characters
 * of each stream) as the evidence an operator reads. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "kairos/config.h"
#include "kairos/recovery.h"

#define PROBE_STDOUT_MAX (1024 * 1024) /* bytes of stdout read; more is an error */
#define PROBE_EVIDENCE_MAX 1024        /* characters of stdout (and stderr) kept */

/* How the probe ended, as the caller saw it. */
struct probe_run {
        const char *out;          /* stdout (up to PROBE_STDOUT_MAX bytes), may be NULL */
        size_t out_len;
        bool out_overflow;        /* it wrote more than PROBE_STDOUT_MAX bytes */
        const char *err;          /* the end of stderr, may be NULL */
        size_t err_len;
        int exit_status;
        int term_signal;          /* 0: it exited */
        bool timed_out;           /* killed after ProbeTimeoutSec= */
        unsigned timeout_sec;     /* ... which was this */
        const char *start_error;  /* it could not start: why (then nothing else counts) */
};

struct probe_word {
        enum recovery_probe probe;  /* DONE, NOT_STARTED or FAILED */
        char *result_json;          /* DONE: the result, compact JSON */
        char *output;               /* FAILED: what happened and what it printed (UTF-8) */
};

/* Judge a probe's run.  0 and *ret_word (release with probe_word_clear),
 * -EINVAL on a NULL argument, -ENOMEM. */
int probe_judge(const struct probe_run *run, struct probe_word *ret_word);
void probe_word_clear(struct probe_word *w);
/* The evidence for the decision taken again with a probe's word: the
 * schedule's declarations through evidence.h (Effects=, which phases have a
 * command, Probe=), the idempotency store counted as unknown (it did not
 * decide the step at the start, so EffectsVia= does not either): false,
 * nothing set, when the schedule has no Probe= or is not in cfg. */
bool probe_schedule_evidence(const struct config *cfg, const char *schedule,
                             struct recovery_evidence *ret);
/* Keep the last cap bytes of a stream in tail (*tail_len of them held) after
 * p[0..n) is appended: the stderr tail that kairosd's children (probes,
 * handlers, hooks) and kairosctl's probe keep alike. */
void probe_tail_keep(char *tail, size_t cap, size_t *tail_len, const char *p, size_t n);
/* "done", "not_started", "failed" ("none" for RECOVERY_PROBE_NONE). */
const char *probe_word_name(enum recovery_probe p);
