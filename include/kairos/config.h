/* SPDX-License-Identifier: MIT */
/* config: kairosd.conf (+ kairosd.conf.d/ drop-ins) and schedules.d/NAME.conf
 *.  systemd-style INI, table-driven; every error names
 * file:line and the key.  Pure: no libuv, no logging. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kairos/retry.h"

enum config_missed_policy { MISSED_SKIP, MISSED_CATCH_UP_ONCE, MISSED_CATCH_UP_BOUNDED };
enum config_concurrency { CONCURRENCY_QUEUE, CONCURRENCY_ALLOW, CONCURRENCY_REJECT };
enum config_effects_via { EFFECTS_VIA_NONE, EFFECTS_VIA_KAIROSCTL };

#define CONFIG_PHASES 5  /* Observe Orient Decide Act Reflect */

/* Error or warning list: each entry a full message "FILE:LINE: Key=: what is
 * wrong", "FILE:LINE: what is wrong" (lines without a key) or "FILE: ..."
 * (file-level).  Zero-initialize before the first use; functions append to
 * it. */
struct config_errors {
        char **msgs;
        size_t n;
};
void config_errors_free(struct config_errors *e);

struct config_schedule {
        char *name;                    /* from the file name, [A-Za-z0-9_-]{1,64} */
        char *path;                    /* the file it came from */
        char *cron;                    /* Cron=, validated with cron_parse */
        char *time_zone;               /* TimeZone= [UTC], validated with cron_tz_load */
        bool enabled;                  /* Enabled= [yes] */
        enum config_missed_policy missed_policy;
        unsigned max_catch_up_runs;    /* [5] 1..1000 */
        uint64_t stale_after_sec;      /* [48h] */
        uint64_t missed_grace_sec;     /* MissedGraceSec= [300] 0..3600 */
        enum config_concurrency concurrency;
        char *goal;                    /* [the schedule name] */
        unsigned max_cycles;           /* [1] 1..10 */
        char *exec[CONFIG_PHASES];     /* command lines, NULL = none */
        uint64_t timeout_sec;          /* [300] */
        char **environment;            /* "K=V", repeatable, several per line split and
                                        * unquoted as systemd does; NULL-terminated
                                        * (NULL when empty); a later K replaces an earlier */
        size_t nenvironment;
        char *working_directory;       /* absolute path or NULL */
        char *probe;                   /* command line or NULL: run for an interrupted
                                        * effectful step that no other evidence decides */
        uint64_t probe_timeout_sec;    /* ProbeTimeoutSec= [30] */
        unsigned effects;              /* Effects= [act]: bit (1 << phase) per phase that
                                        * changes the world outside kairos */
        enum config_effects_via effects_via; /* EffectsVia= [none] */
        /* [Notify]: NULL = the daemon's default, "" = none for this schedule */
        char *on_review;               /* OnReview= */
        char *on_failure;              /* OnFailure= */
        struct config_errors warnings; /* what is suspicious but valid, "FILE:LINE: Key=: ..." */
        bool retained;                 /* the file is broken now: this is the configuration
                                        * it had before (config_retain_broken), kept for its
                                        * running mandates; it does not fire */
        /* per-handler limits, enforced in the handler's own cgroup (only
         * with a delegated cgroup: kairosd under systemd with Delegate=yes) */
        uint64_t memory_max;           /* MemoryMax= bytes; 0 unset, CONFIG_LIMIT_INFINITY */
        uint64_t tasks_max;            /* TasksMax=; 0 unset, CONFIG_LIMIT_INFINITY */
        uint64_t cpu_quota_pct;        /* CPUQuota= percent of one CPU; 0 unset */
        /* RetryAttempts=, RetryBackoffSec=, RetryOn= and their per-phase
         * forms (ActRetryAttempts=, ...): retry[phase] is what applies to
         * that phase (the schedule's keys, overridden by the phase's);
         * retry[CONFIG_PHASES] holds the schedule's keys alone */
        struct retry_policy retry[CONFIG_PHASES + 1];
};

/* A schedule file with errors: skipped, the others run. */
struct config_broken {
        char *name;                    /* from the file name (may be an invalid name) */
        char *path;
        struct config_errors errors;   /* at least one */
};

enum config_backend {
        CONFIG_BACKEND_FILES,
        CONFIG_BACKEND_POSTGRES,
};

struct config {
        char *config_path;             /* NULL for the built-in configuration */
        char *schedules_dir;           /* the directory searched; NULL for the built-in */
        /* [Daemon] */
        char *state_directory;         /* [/var/lib/kairos] */
        char *control_socket;          /* [/run/kairos/control.sock] */
        char *socket_group;            /* [kairos] */
        char *handler_user;            /* HandlerUser= [none: kairosd's own user] */
        unsigned max_concurrent_mandates; /* [4] */
        uint64_t graceful_timeout_sec; /* [120] */
        int log_level;                 /* syslog priority, [info] = 6 */
        char *metrics_file;            /* MetricsFile= absolute path or NULL [none] */
        uint64_t metrics_interval_sec; /* MetricsIntervalSec= [15] */
        unsigned keep_finished;        /* [1000] finished mandates kept; 0: no count limit */
        uint64_t keep_finished_sec;    /* [30d] age of the oldest kept; 0: no age limit */
        /* [Idempotency] */
        uint64_t idem_ttl_sec;         /* [86400] */
        unsigned idem_max_entries;     /* [10000] */
        char **write_roots;            /* absolute paths, NULL-terminated (NULL when empty);
                                        * accumulate over lines and drop-ins, "" resets */
        size_t nwrite_roots;
        uint64_t max_write_bytes;      /* MaxWriteBytes= [1 GiB] (a tool write's size);
                                        * CONFIG_LIMIT_INFINITY; 0 (empty): the default */
        uint64_t tool_grace_sec;       /* ToolGraceSec= [300]: how long recovery waits for
                                        * a tool run that outlived kairosd; 0: not at all */
        /* [Notify]: command lines, NULL = none */
        char *on_review;               /* OnReview= */
        char *on_failure;              /* OnFailure= */
        /* [Cluster] (docs/design.md §14) */
        enum config_backend backend;   /* Backend= [files] */
        char *cluster_conninfo;        /* ConnectionString= (libpq); NULL unless postgres */
        char *node_name;               /* NodeName= [the host name]; NULL unless postgres */
        unsigned lease_sec;            /* LeaseSec= [10] */
        /* schedules, sorted by name */
        struct config_schedule *schedules;
        size_t nschedules;
        /* schedule files with errors, sorted by name */
        struct config_broken *broken;
        size_t nbroken;
};


/* Load PATH, its drop-ins PATH.d/NAME.conf (e.g. kairosd.conf.d/, lexical
 * order, later files override earlier keys) and the schedules
 * <dir of PATH>/schedules.d/NAME.conf (only *.conf; sorted by name).  A
 * missing drop-in or schedules directory is fine.  state_dir, if not NULL,
 * overrides StateDirectory=.
 * A schedule file with errors does not fail the load: it is listed in
 * (*out)->broken with its errors, and the other schedules are loaded.
 * Returns 0 (broken schedules or not), or -EINVAL if the main file, a
 * drop-in or the schedules directory has errors, with every error of every
 * file (broken schedules' after the others) collected in errs (may be NULL;
 * nothing returned), or -errno if PATH itself cannot be read (also described
 * in errs).  config_load_main_only does not read schedules.d at all. */
int config_load(const char *path, const char *state_dir, struct config **out,
                struct config_errors *errs);
int config_load_main_only(const char *path, const char *state_dir, struct config **out,
                          struct config_errors *errs);

/* After a reload: for every schedule broken in new_cfg that old_cfg ran (or
 * retained), move its old configuration into new_cfg->schedules marked
 * `retained`, so that its running mandates keep the configuration they had.
 * Returns the number moved, or -ENOMEM (new_cfg unchanged). */
int config_retain_broken(struct config *new_cfg, struct config *old_cfg);
/* After a reload: the [Cluster] keys take effect only at a restart.  Give
 * new_cfg the running values of old_cfg's (swapped, so that each config
 * still owns its strings) and return how many of Backend=, ConnectionString=,
 * NodeName=, LeaseSec= differed, their names ("NodeName=, LeaseSec=") in
 * ret_keys (truncated to keys_len; never a value).  -EINVAL on NULL. */
int config_keep_cluster(struct config *new_cfg, struct config *old_cfg, char *ret_keys,
                        size_t keys_len);
/* The schedule named `name`, retained ones included, or NULL. */
const struct config_schedule *config_find_schedule(const struct config *c, const char *name);
/* The broken schedule file named `name`, or NULL. */
const struct config_broken *config_find_broken(const struct config *c, const char *name);

/* The built-in configuration: defaults, StateDirectory=state_dir,
 * ControlSocket=state_dir/control.sock, no schedules. */
int config_builtin(const char *state_dir, struct config **out);

/* Parse one schedule file (used by config_load; exposed for tests/fuzzing).
 * path is only used in messages.  Returns 0 with *out filled (free it with
 * config_schedule_clear; warnings in out->warnings), or -EINVAL (errors
 * appended to errs, which may be NULL) / -ENOMEM, with *out left zeroed. */
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

/* Resource limits, parsed like systemd.  "infinity" is CONFIG_LIMIT_INFINITY.
 * MemoryMax=: bytes with an optional K, M, G or T suffix (base 1024), at
 * least 1; TasksMax=: a number >= 1; CPUQuota=: "N%" with N >= 1 (100% is
 * one CPU).  -EINVAL on bad syntax or 0, -ERANGE if too large. */
#define CONFIG_LIMIT_INFINITY UINT64_MAX
#define CONFIG_MAX_WRITE_BYTES_DEFAULT (UINT64_C(1) << 30)
/* ToolGraceSec= when not set (docs/design.md §10). */
#define CONFIG_TOOL_GRACE_SEC_DEFAULT 300
int config_parse_bytes(const char *s, uint64_t *ret_bytes);
int config_parse_tasks(const char *s, uint64_t *ret_tasks);
int config_parse_percent(const char *s, uint64_t *ret_pct);
/* Does the schedule set MemoryMax=, TasksMax= or CPUQuota= (to anything)? */
bool config_schedule_has_limits(const struct config_schedule *s);

const char *config_phase_key(int phase); /* "Observe" ... "Reflect", NULL out of range */
const char *config_phase_name(int phase); /* "observe" ... "reflect", NULL out of range */

/* Split the value of one Environment= line as systemd does: blank-separated
 * NAME=VALUE words, with the quoting of config_split_command
 * ("A=1 2" B=3 gives "A=1 2" and "B=3").  -EINVAL on bad quoting. */
int config_split_environment(const char *line, char ***argv_out, size_t *argc_out);

/* Split a command line like systemd (no shell): words separated by blanks;
 * "double quotes" with backslash escapes inside, 'single quotes' literal,
 * quotes may be glued to text (a"b c" is one word), outside quotes a
 * backslash escapes too.  Escapes: \\ \" \' \n \t \r and backslash-space.
 * argv is NULL-terminated (free with config_strv_free); an empty or blank
 * line gives argc 0.  -EINVAL on an unbalanced quote, a trailing backslash or
 * an unknown escape (nothing returned), -ENOMEM. */
int config_split_command(const char *cmdline, char ***argv_out, size_t *argc_out);
void config_strv_free(char **v);
/* config_strv_free(*v), then *v = NULL. */
void config_strv_clear(char ***v);

/* Variables in command lines (Observe= ... Reflect=, Probe=, OnReview=,
 * OnFailure=), expanded like systemd's Exec lines when the command starts,
 * after the line is split and unquoted: a word that is exactly $NAME becomes
 * NAME's value split at white space (zero or more words: none when unset or
 * empty); ${NAME} anywhere in a word becomes the value as it is (nothing
 * when unset); $$ becomes $; any other $ stays as it is ($NAME inside a
 * word is left for a shell, as in sh -c 'echo $HOME').  Quotes do not
 * stop the expansion: only $$ does. */
enum config_command_kind {
        CONFIG_COMMAND_HANDLER, /* Observe= ... Reflect= */
        CONFIG_COMMAND_PROBE,   /* Probe= */
        CONFIG_COMMAND_HOOK,    /* OnReview=, OnFailure= */
};
/* The names kairosd sets (or may set) for a command of that kind,
 * NULL-terminated; NULL for an unknown kind.  Static. */
const char *const *config_command_vars(enum config_command_kind kind);
/* At load: does every name the line expands belong to config_command_vars
 * (kind) or to environment ("NAME=VALUE", NULL-terminated, may be NULL;
 * hooks get no Environment=)?  0, or -EINVAL with why (the offending
 * reference, or the split error), or -ENOMEM. */
int config_check_command_vars(const char *cmdline, enum config_command_kind kind,
                              char *const *environment, char *why, size_t why_len);
/* At spawn: split cmdline (config_split_command) and expand each word from
 * env ("NAME=VALUE", NULL-terminated, as passed to the command; may be NULL),
 * a name not in env expanding to nothing.  ret_argv is NULL-terminated (free
 * with config_strv_free), ret_argc may be 0.  -EINVAL with why (may be NULL)
 * for a line that does not split or a malformed ${...}, -ENOMEM. */
int config_expand_command(const char *cmdline, char *const *env, char ***ret_argv,
                          size_t *ret_argc, char *why, size_t why_len);
