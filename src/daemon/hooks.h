/* SPDX-License-Identifier: MIT */
/* hooks: [Notify] OnReview= and OnFailure= — commands run when a mandate
 * needs a human or ended badly (kairosd.conf(5), kairosd(8), NOTIFY).
 *
 * The executor and the recovery report an event with hooks_event() once the
 * state it reports is durable; the hook runs later, through the runner
 * (runner.h), with the mandate's KAIROS_* variables and the event as one
 * JSON document on stdin.  At most HOOKS_MAX_RUNNING run at once.  Pages
 * for a human (review, approval) are never dropped: one per mandate waits
 * (the latest), ahead of the failures.  At most HOOKS_MAX_QUEUED failure
 * pages wait; the failures beyond are folded into one page per command that
 * says how many and of which schedules (event "failures"); each is
 * bounded in time (SIGTERM after HOOKS_TIMEOUT_SEC, SIGKILL 5 s later) and
 * in the output kept for the log.  A hook never changes a mandate: whatever
 * it does or however it ends is only logged.  Events reported before
 * hooks_ready() (the recovery's) wait in the queue until then. */
#pragma once

#define HOOKS_MAX_RUNNING 4
#define HOOKS_MAX_QUEUED 64
#define HOOKS_TIMEOUT_SEC 30
/* The end of a failed step's stderr a failure page carries: its last
 * HOOKS_STDERR_LINES lines, HOOKS_STDERR_MAX bytes at most. */
#define HOOKS_STDERR_LINES 10
#define HOOKS_STDERR_MAX 1024

struct daemon;
struct mandate;

enum hook_event {
        HOOK_REVIEW,    /* paused_review: OnReview= */
        HOOK_APPROVAL,  /* awaiting_approval: OnReview= */
        HOOK_FAILURE,   /* ended failed or terminated: OnFailure= */
};

/* A step's execution that failed, as its handler ended: what an OnFailure=
 * page says of the failure (kairosd(8), NOTIFY). */
struct hook_failure {
        char *step;
        char *error_class;            /* exit_status, signal, timeout, oom, ... */
        char *error_msg;              /* the failed record's error_msg */
        int exit_status;              /* -1: it did not exit (killed, not started) */
        int exit_signal;              /* 0: no signal ended it */
        unsigned attempt;             /* KAIROS_ATTEMPT of that execution */
        char *stderr_tail;            /* its last lines (bounded above), "" none */
};

/* The start of the last HOOKS_STDERR_LINES lines of s, HOOKS_STDERR_MAX
 * bytes at most, at a UTF-8 character. */
const char *hooks_stderr_last(const char *s);

/* Keep f (copied, its stderr cut to the bound above) as m's last failure,
 * replacing an older one (out of memory: m keeps none).  The copy is one
 * allocation: free(m->failure) frees it. */
void hooks_note_failure(struct mandate *m, const struct hook_failure *f);
/* f copied as above (one allocation, for free()); NULL when out of memory.
 * Touches nothing else: callable on a pool thread. */
struct hook_failure *hooks_failure_copy(const struct hook_failure *f);

int hooks_init(struct daemon *d);
/* READY=1 was sent: start what waits. */
void hooks_ready(struct daemon *d);
/* m's state (status, reason) is durable: run the hook configured for it, if
 * any.  step: the step concerned, or NULL; evidence: the recovery's evidence
 * for it (a JSON object), or NULL. */
void hooks_event(struct daemon *d, enum hook_event ev, const struct mandate *m,
                 const char *step, const char *evidence);
/* kairosd stops: queued hooks are dropped, running ones killed. */
void hooks_stop(struct daemon *d);
/* After the loop ended (its handles closed) and the runner was freed. */
void hooks_free(struct daemon *d);
