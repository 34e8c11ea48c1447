/* SPDX-License-Identifier: MIT */
/* retry: the step retry policy of a schedule (RetryAttempts=,
 * RetryBackoffSec=, RetryOn=; kairos.schedule(5), docs/design.md §10).
 * Pure, no I/O. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

/* RetryOn= classes (bits). */
enum {
        RETRY_ON_EXIT_STATUS = 1u << 0,
        RETRY_ON_SIGNAL = 1u << 1,
        RETRY_ON_OOM = 1u << 2,
        RETRY_ON_SPAWN_ERROR = 1u << 3,
        RETRY_ON_OUTPUT_TOO_LARGE = 1u << 4,
        RETRY_ON_TIMEOUT = 1u << 5,
};
/* "failure": every failure but a timeout (a cancel is never retried). */
#define RETRY_ON_FAILURE                                                                       \
        (RETRY_ON_EXIT_STATUS | RETRY_ON_SIGNAL | RETRY_ON_OOM | RETRY_ON_SPAWN_ERROR |         \
         RETRY_ON_OUTPUT_TOO_LARGE)

#define RETRY_ATTEMPTS_MAX 100
#define RETRY_BACKOFF_MAX_MS (24ull * 3600 * 1000)

struct retry_policy {
        unsigned attempts;        /* RetryAttempts= [0]: retries after the first attempt */
        uint64_t first_ms;        /* RetryBackoffSec= FIRST [1 s] */
        unsigned factor_pct;      /* factor= [2]: ×100 (200) */
        uint64_t max_ms;          /* max= [60 s] */
        unsigned jitter_pct;      /* jitter= [0%]: up to this share of the delay added */
        unsigned on;              /* RetryOn= [failure]: RETRY_ON_* bits */
        uint64_t exit_codes[4];   /* RetryOn= numbers: bit n for exit status n; none set:
                                   * every exit status (if RETRY_ON_EXIT_STATUS) */
        /* which of the three keys were given (per phase: the others inherit) */
        bool set_attempts, set_backoff, set_on;
};

/* The defaults: no retry. */
void retry_policy_init(struct retry_policy *p);
/* A per-phase policy: every key not given there comes from the schedule's. */
void retry_policy_inherit(struct retry_policy *phase, const struct retry_policy *schedule);

/* "FIRST [factor=F] [max=SEC] [jitter=P%]" (seconds with up to 3 decimals).
 * -EINVAL with a phrase in *ret_why (static text). */
int retry_parse_backoff(const char *v, struct retry_policy *p, const char **ret_why);
/* Space-separated: failure, exit_status, signal, oom, spawn_error,
 * output_too_large, timeout, or exit statuses 1..255.  -EINVAL with the
 * offending word copied into why (at most len bytes). */
int retry_parse_on(const char *v, struct retry_policy *p, char *why, unsigned len);

/* Is a failure of this class (and, for exit_status, its message "exit
 * status N ...") retried by p?  cancelled never is. */
bool retry_matches(const struct retry_policy *p, const char *error_class,
                   const char *error_msg);
/* The wait before retry n (1-based): first × factor^(n-1), at most max,
 * plus jitter × rand/2^32 of it. */
uint64_t retry_delay_ms(const struct retry_policy *p, unsigned n, uint32_t rand);
