/* SPDX-License-Identifier: MIT */
/* kairosctl: shared declarations of the command-line tool.
 *
 * Adding a command is one row in the dispatch table of kairosctl.c plus one
 * function with the ctl_command_fn signature.  A command receives the
 * arguments after its name (global options already removed) and returns the
 * process exit status (CTL_EXIT_*). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

/* Exit statuses (sysexits.h values for the error cases). */
enum {
        CTL_EXIT_OK = 0,
        CTL_EXIT_REFUSED = 1,     /* online: the daemon said no */
        CTL_EXIT_UNREACHABLE = 2, /* online: cannot reach the daemon (or no valid reply) */
        CTL_EXIT_OPERATOR = 4,    /* wait: the mandate is paused for an operator */
        CTL_EXIT_USAGE = 64,      /* EX_USAGE */
        CTL_EXIT_DATAERR = 65,    /* EX_DATAERR: bad input data */
        CTL_EXIT_NOINPUT = 66,    /* EX_NOINPUT: a file could not be read */
        CTL_EXIT_SOFTWARE = 70,   /* EX_SOFTWARE: internal error */
        CTL_EXIT_OSERR = 71,      /* EX_OSERR: out of memory and the like */
        CTL_EXIT_IOERR = 74,      /* EX_IOERR: writing the output failed */
        CTL_EXIT_TIMEOUT = 124,   /* wait: timed out (as timeout(1)) */
        CTL_EXIT_TEMPFAIL = 75,   /* EX_TEMPFAIL: tool run/write: the key is in progress
                                   * or interrupted (try again / see an operator) */
};

#define CTL_DEFAULT_SOCKET "/run/kairos/control.sock"
#define CTL_DEFAULT_STATE_DIR "/var/lib/kairos"
#define CTL_DEFAULT_CONFIG "/etc/kairos/kairosd.conf"

/* Global options, accepted before or after the command. */
struct ctl_opts {
        const char *socket_path;  /* --socket PATH, NULL if not given (see ctl_socket_path) */
        bool json;                /* --json */
};

typedef int (*ctl_command_fn)(const struct ctl_opts *o, int argc, char **argv);

/* Per-command option parsing: "--name VALUE", "--name=VALUE", flags, "--"
 * ends the options, "-" is a positional.  Positional arguments are moved to
 * the front of argv, their count returned in *npos.  Returns 0, or prints a
 * usage error naming the command and returns CTL_EXIT_USAGE. */
struct ctl_option {
        const char *name;         /* without the leading "--" */
        bool has_arg;
        const char **value;       /* has_arg: receives the value */
        bool *flag;               /* !has_arg: set to true */
};
int ctl_parse_options(const char *cmd, int argc, char **argv, const struct ctl_option *opts,
                      int *npos);

/* Messages on stderr, all starting with "kairosctl: ". */
/* One line, with a hint to --help; returns CTL_EXIT_USAGE. */
int ctl_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "kairosctl: PATH: <strerror>"; returns CTL_EXIT_NOINPUT. */
int ctl_file_error(const char *path, int err);
/* "kairosctl: <message>" for any other failure; returns `status`. */
int ctl_error(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* An errno-style failure (-ENOMEM etc.) of an internal call. */
int ctl_errno_error(const char *what, int r);

/* Read a whole file ("-" = stdin) into a malloc'ed, NUL-terminated buffer.
 * Returns 0 or -errno. */
int ctl_read_file(const char *path, char **data, size_t *len);

/* All of len bytes to fd (EINTR retried): 0 or -errno. */
int ctl_write_all(int fd, const void *data, size_t len);

/* CLOCK_MONOTONIC in milliseconds. */
int64_t ctl_mono_ms(void);

/* Print s with control characters and invalid bytes escaped (\xNN), so
 * untrusted WAL content cannot drive the terminal.  NULL prints "-". */
void ctl_put_safe(FILE *f, const char *s);
/* The same for a text of several lines: each line escaped, the lines on
 * lines of their own, every line after the first starting with `indent`
 * (a trailing newline and a "\r" before "\n" are dropped). */
void ctl_put_safe_lines(FILE *f, const char *s, const char *indent);

/* JSON output helpers (jansson).  ctl_json_str: a string or null (invalid
 * UTF-8 becomes null, never a failure).  ctl_json_raw: parse JSON text into a
 * value; text that jansson cannot hold (e.g. integers beyond 64 bits) is
 * kept as a string; NULL gives null. */
json_t *ctl_json_str(const char *s);
json_t *ctl_json_raw(const char *text);
/* Print v (pretty, key order kept) followed by '\n' and release it.
 * Returns 0, or CTL_EXIT_SOFTWARE if v is NULL (allocation failed). */
int ctl_json_print(json_t *v);
/* The same for a kjson value, byte for byte as ctl_json_print lays it out
 * (numbers as the daemon wrote them). */
struct kjson;
int ctl_kjson_print(const struct kjson *v);
/* A jansson copy of v, for the text output: a number jansson cannot hold
 * becomes the nearest real (an integer beyond 64 bits) or its text (beyond
 * the range of a double).  NULL on ENOMEM. */
json_t *ctl_kjson_to_json(const struct kjson *v);

/* The message for commands that are declared but have no implementation
 * yet.  Returns CTL_EXIT_USAGE. */
int ctl_not_implemented(const char *cmd, bool online);

/* Offline commands (ctl_offline.c). */
int ctl_cmd_wal_dump(const struct ctl_opts *o, int argc, char **argv);
int ctl_cmd_wal_verify(const struct ctl_opts *o, int argc, char **argv);
/* wal dump --db / wal verify --db (ctl_waldb.c): a mandate's rows in cluster
 * mode's PostgreSQL; without PostgreSQL support in the build a usage error. */
int ctl_wal_dump_db(const struct ctl_opts *o, const char *conninfo, const char *mandate,
                    const char *output);
int ctl_wal_verify_db(const struct ctl_opts *o, const char *conninfo, int n, char **mandates);
int ctl_cmd_recover(const struct ctl_opts *o, int argc, char **argv);
int ctl_cmd_canon(const struct ctl_opts *o, int argc, char **argv);
int ctl_cmd_plan(const struct ctl_opts *o, int argc, char **argv);
int ctl_cmd_cron_next(const struct ctl_opts *o, int argc, char **argv);
/* list and show --state-dir: the documents kairosd would answer, made from
 * the state directory without it (nothing written).  0 with the result, or
 * an exit status after saying why (a refusal as kairosd words it).
 * ctl_offline_list takes the request's args; ctl_offline_show's result is
 * in a. */
int ctl_offline_list(const struct ctl_opts *o, const char *state_dir, json_t *args,
                     json_t **ret_result);
struct kjson_arena;
struct kjson;
int ctl_offline_show(const struct ctl_opts *o, const char *state_dir, const char *mandate,
                     struct kjson_arena *a, const struct kjson **ret_result);

/* Online commands (ctl_online.c): one request over the control socket. */
int ctl_cmd_status(const struct ctl_opts *o, int argc, char **argv);
int ctl_cmd_list(const struct ctl_opts *o, int argc, char **argv);
int ctl_cmd_show(const struct ctl_opts *o, int argc, char **argv);
int ctl_cmd_retry(const struct ctl_opts *o, int argc, char **argv);
int ctl_cmd_wait(const struct ctl_opts *o, int argc, char **argv);
int ctl_cmd_fire(const struct ctl_opts *o, int argc, char **argv);
int ctl_cmd_backfill(const struct ctl_opts *o, int argc, char **argv);
int ctl_cmd_pause(const struct ctl_opts *o, int argc, char **argv);
int ctl_cmd_resume(const struct ctl_opts *o, int argc, char **argv);
int ctl_cmd_approve(const struct ctl_opts *o, int argc, char **argv);
int ctl_cmd_cancel(const struct ctl_opts *o, int argc, char **argv);
int ctl_cmd_resolve(const struct ctl_opts *o, int argc, char **argv);
int ctl_cmd_reload(const struct ctl_opts *o, int argc, char **argv);
int ctl_cmd_metrics(const struct ctl_opts *o, int argc, char **argv);
int ctl_cmd_schedules(const struct ctl_opts *o, int argc, char **argv);
int ctl_cmd_schedules_next(const struct ctl_opts *o, int argc, char **argv);

/* The idempotency store (ctl_tool.c). */
int ctl_cmd_tool_run(const struct ctl_opts *o, int argc, char **argv);
int ctl_cmd_tool_write(const struct ctl_opts *o, int argc, char **argv);
int ctl_cmd_idem_stats(const struct ctl_opts *o, int argc, char **argv);
int ctl_cmd_idem_get(const struct ctl_opts *o, int argc, char **argv);
int ctl_cmd_idem_forget(const struct ctl_opts *o, int argc, char **argv);

/* The control socket: --socket, else $KAIROS_CONTROL_SOCKET (non-empty),
 * else CTL_DEFAULT_SOCKET. */
const char *ctl_socket_path(const struct ctl_opts *o);

/* Send one request {"v":1,"id":1,"cmd":cmd,"args":args} (args stolen; NULL
 * is {}) and read the one reply line, within $KAIROSCTL_TIMEOUT seconds
 * [30].  Returns CTL_EXIT_OK with *result (a new reference to the reply's
 * result object), or an exit status after printing why on stderr:
 * CTL_EXIT_REFUSED when the daemon replied with an error (with o->json the
 * error object is also printed on stdout), CTL_EXIT_UNREACHABLE when it
 * could not be reached or its reply was not valid, CTL_EXIT_USAGE for a bad
 * $KAIROSCTL_TIMEOUT. */
int ctl_call(const struct ctl_opts *o, const char *cmd, json_t *args, json_t **result);

/* A connection for several requests in turn (tool run keeps its claim on
 * the key for as long as the connection is open).  ctl_session_open returns
 * CTL_EXIT_OK or an exit status after printing why (like ctl_call).
 * ctl_session_call: like ctl_call, each request with its own
 * $KAIROSCTL_TIMEOUT; if error is not NULL, a refusal is not printed but
 * returned there (a new reference) with CTL_EXIT_REFUSED. */
struct ctl_session;
int ctl_session_open(const struct ctl_opts *o, struct ctl_session **out);
int ctl_session_call(struct ctl_session *s, const char *cmd, json_t *args, json_t **result,
                     json_t **error);
void ctl_session_close(struct ctl_session *s);
/* Print a refusal as ctl_call does (message on stderr; with --json the error
 * object on stdout).  Returns CTL_EXIT_REFUSED. */
int ctl_print_refusal(const struct ctl_opts *o, json_t *error);

/* "-n N" / "-nN" / "--count N" (1..1000) taken out of argv (up to a "--"),
 * compacting the rest; *given tells whether it was there.  Returns 0 or
 * CTL_EXIT_USAGE after printing why. */
int ctl_take_count(const char *cmd, int *argc, char **argv, int *count, bool *given);
/* Local time of t in tz (NULL = UTC) as YYYY-MM-DDTHH:MM:SS+HH:MM; offset
 * receives "+HH:MM".  -ERANGE for an absurd t. */
struct cron_tz;
int ctl_format_local(const struct cron_tz *tz, int64_t t, char *buf, size_t len,
                     char offset[7]);
/* cron_tz_load with messages: 0, or an exit status (65 bad or unknown zone). */
int ctl_load_tz(const char *cmd, const char *name, struct cron_tz **out);

