/* SPDX-License-Identifier: MIT */
/* config: kairosd.conf (+ kairosd.conf.d/ drop-ins) and schedules.d/NAME.conf
 *.  systemd-style INI, table-driven; every error names
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
        char **environment;            /* "K=V", repeatable, one per line; NULL-terminated
                                        * (NULL when empty); a later K replaces an earlier */
        size_t nenvironment;
        char *working_directory;       /* absolute path or NULL */
        char *probe;                   /* command line or NULL */
};

struct config {
        char *config_path;             /* NULL for the built-in configuration */
        char *schedules_dir;           /* the directory searched; NULL for the built-in */
        /* [Daemon] */
        char *state_directory;         /* [/var/lib/kairos] */
        char *control_socket;          /* [/run/kairos/control.sock] */
        char *socket_group;            /* [kairos] */
        unsigned max_concurrent_mandates; /* [4] */
        uint64_t graceful_timeout_sec; /* [120] */
        int log_level;                 /* syslog priority, [info] = 6 */
        char *metrics_file;            /* MetricsFile= absolute path or NULL [none] */
        uint64_t metrics_interval_sec; /* MetricsIntervalSec= [15] */
        /* [Idempotency] */
        uint64_t idem_ttl_sec;         /* [86400] */
        unsigned idem_max_entries;     /* [10000] */
        char **write_roots;            /* absolute paths, NULL-terminated (NULL when empty);
                                        * accumulate over lines and drop-ins, "" resets */
        size_t nwrite_roots;
        /* schedules, sorted by name */
        struct config_schedule *schedules;
        size_t nschedules;
};

/* Error list: each entry a full message "FILE:LINE: Key=: what is wrong",
 * "FILE:LINE: what is wrong" (lines without a key) or "FILE: ..." (file-level).
 * Zero-initialize before the first use; functions append to it. */
struct config_errors {
        char **msgs;
        size_t n;
};
void config_errors_free(struct config_errors *e);

/* Load PATH, its drop-ins PATH.d/NAME.conf (e.g. kairosd.conf.d/, lexical
 * order, later files override earlier keys) and the schedules
 * <dir of PATH>/schedules.d/NAME.conf (only *.conf; sorted by name).  A
 * missing drop-in or schedules directory is fine.  state_dir, if not NULL,
 * overrides StateDirectory=.  Returns 0, or -EINVAL with every error of every
 * file collected in errs (may be NULL; nothing returned), or -errno if PATH
 * itself cannot be read (also described in errs, with the other files'
 * errors). */
int config_load(const char *path, const char *state_dir, struct config **out,
                struct config_errors *errs);

/* The built-in configuration: defaults, StateDirectory=state_dir,
 * ControlSocket=state_dir/control.sock, no schedules. */
int config_builtin(const char *state_dir, struct config **out);

/* Parse one schedule file (used by config_load; exposed for tests/fuzzing).
 * path is only used in messages.  Returns 0 with *out filled (free it with
 * config_schedule_clear), or -EINVAL (errors appended to errs, which may be
 * NULL) / -ENOMEM, with *out left zeroed. */
int config_parse_schedule(const char *name, const char *path, const char *text, size_t len,
                          struct config_schedule *out, struct config_errors *errs);
/* Parse the text of a main configuration file (kairosd.conf or one drop-in)
 * over the built-in defaults, as config_load does with PATH's own text, but
 * without drop-ins or schedules (exposed for tests/fuzzing).  path is
 * config_path and is used in messages; schedules_dir stays NULL.  Returns 0
 * with *out (free with config_free), or -EINVAL (errors appended to errs,
 * which may be NULL) / -ENOMEM, with *out set to NULL. */
int config_parse_main(const char *path, const char *text, size_t len, struct config **out,
                      struct config_errors *errs);
/* Free the contents of a schedule (not the struct itself) and zero it. */
void config_schedule_clear(struct config_schedule *s);

void config_free(struct config *c);

/* Durations: "30", "30s", "5min", "2h", "1d" (and combinations "1h30min",
 * "1h 30min"); units s sec min h d; a unitless number only on its own.
 * -EINVAL on bad syntax, -ERANGE if it does not fit in 64 bits. */
int config_parse_duration(const char *s, uint64_t *out_sec);
/* Upper bound the parser accepts for duration keys (100 years, in seconds). */
#define CONFIG_DURATION_MAX UINT64_C(3153600000)
bool config_valid_schedule_name(const char *name);

const char *config_phase_key(int phase); /* "Observe" ... "Reflect", NULL out of range */

/* Split a command line like systemd (no shell): words separated by blanks;
 * "double quotes" with backslash escapes inside, 'single quotes' literal,
 * quotes may be glued to text (a"b c" is one word), outside quotes a
 * backslash escapes too.  Escapes: \\ \" \' \n \t \r and backslash-space.
 * argv is NULL-terminated (free with config_strv_free); an empty or blank
 * line gives argc 0.  -EINVAL on an unbalanced quote, a trailing backslash or
 * an unknown escape (nothing returned), -ENOMEM. */
int config_split_command(const char *cmdline, char ***argv_out, size_t *argc_out);
void config_strv_free(char **v);
