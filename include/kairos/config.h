/* SPDX-License-Identifier: MIT */
/* config: kairosd.conf (+ kairosd.conf.d/ drop-ins) and schedules.d/NAME.conf
 * (DESIGN §9, §10, §12).  systemd-style INI, table-driven; every error names
 * file:line and the key.  Pure: no libuv, no logging. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum config_missed_policy { MISSED_SKIP, MISSED_CATCH_UP_ONCE, MISSED_CATCH_UP_BOUNDED };
enum config_concurrency { CONCURRENCY_QUEUE, CONCURRENCY_ALLOW, CONCURRENCY_REJECT };
enum config_risk { RISK_LOW, RISK_MEDIUM };

#define CONFIG_PHASES 5  /* Observe Orient Decide Act Reflect */

struct config_schedule {
        char *name;                    /* from the file name, [A-Za-z0-9_-]{1,64} */
        char *path;                    /* the file it came from */
        char *cron;                    /* Cron=, validated with cron_parse */
        char *time_zone;               /* TimeZone= [UTC], validated with cron_tz_load */
        bool enabled;                  /* Enabled= [yes] */
        enum config_missed_policy missed_policy;
        unsigned max_catch_up_runs;    /* [5] */
        uint64_t stale_after_sec;      /* [48h] */
        enum config_concurrency concurrency;
        char *goal;                    /* [the schedule name] */
        unsigned max_cycles;           /* [3] 1..10 */
        unsigned checkpoint_every;     /* [1] 1..3 */
        enum config_risk risk_budget;  /* [low] */
        char *exec[CONFIG_PHASES];     /* command lines, NULL = none */
        uint64_t timeout_sec;          /* [300] */
        char **environment;            /* "K=V", repeatable */
        size_t nenvironment;
        char *working_directory;
        char *probe;
};

struct config {
        char *config_path;             /* NULL for the built-in configuration */
        char *schedules_dir;           /* NULL: none */
        /* [Daemon] */
        char *state_directory;         /* [/var/lib/kairos] */
        char *control_socket;          /* [/run/kairos/control.sock] */
        char *socket_group;            /* [kairos] */
        unsigned max_concurrent_mandates; /* [4] */
        uint64_t graceful_timeout_sec; /* [120] */
        int log_level;                 /* syslog priority, [info] = 6 */
        /* [Idempotency] */
        uint64_t idem_ttl_sec;         /* [86400] */
        unsigned idem_max_entries;     /* [10000] */
        char **write_roots;
        size_t nwrite_roots;
        /* schedules, sorted by name */
        struct config_schedule *schedules;
        size_t nschedules;
};

/* Error list: each entry a full message "FILE:LINE: Key=: what is wrong". */
struct config_errors {
        char **msgs;
        size_t n;
};
void config_errors_free(struct config_errors *e);

/* Load PATH, its PATH.d/ drop-ins ("kairosd.conf.d/*.conf", lexical order)
 * and the schedules in <dir of PATH>/schedules.d/*.conf.  state_dir, if not
 * NULL, overrides StateDirectory=.  Returns 0, or -EINVAL with every error
 * collected in errs (nothing returned), or -errno for I/O on PATH itself
 * (also described in errs). */
int config_load(const char *path, const char *state_dir, struct config **out,
                struct config_errors *errs);

/* The built-in configuration: defaults, StateDirectory=state_dir,
 * ControlSocket=state_dir/control.sock, no schedules. */
int config_builtin(const char *state_dir, struct config **out);

/* Parse one schedule file (used by config_load; exposed for tests/fuzzing). */
int config_parse_schedule(const char *name, const char *path, const char *text, size_t len,
                          struct config_schedule *out, struct config_errors *errs);

void config_free(struct config *c);

/* Durations: "30", "30s", "5min", "2h", "1d" (and combinations "1h30min"). */
int config_parse_duration(const char *s, uint64_t *out_sec);
bool config_valid_schedule_name(const char *name);

const char *config_phase_key(int phase); /* "Observe" ... "Reflect" */
