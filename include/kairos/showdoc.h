/* SPDX-License-Identifier: MIT */
/* showdoc: the documents `list` and `show` answer (kairosctl(1)), made from
 * what the state directory holds: a mandate's fold, its summary, the
 * idempotency store's calls.  kairosd answers with them over the control
 * socket; kairosctl list|show --state-dir makes the same ones from the files
 * while kairosd is down.  Pure (no loop, no logging); uses jansson. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kairos/fold.h"
#include "kairos/kbuf.h"

struct idem_store;

/* The fields of a mandate that list's rows and show share.  Strings are
 * borrowed; NULL = unknown. */
struct showdoc_mandate {
        const char *id;
        const char *status;           /* its status's name */
        const char *reason;
        const char *review_step;
        const char *plan_id;
        long long cycle;
        const char *schedule;
        const char *fired_at;
        int64_t fired_key;            /* showdoc_fired_key(fired_at) */
        int64_t started_ms, ended_ms; /* 0: unknown */
        int64_t down_ms;              /* of that, the restarts' (fold.down_ms) */
        const char *retry_of;         /* a retry: the mandate it retries */
        int retry;                    /* ... its number (>= 1) */
};

/* The names of a mandate's statuses (kairosd(8), MANDATE STATUSES), in the
 * order of kairosd's enum mandate_status, NULL-terminated. */
#define SHOWDOC_NSTATUS 14
extern const char *const showdoc_status_names[SHOWDOC_NSTATUS + 1];
bool showdoc_status_known(const char *name);

/* "YYYY-MM-DDTHH:MM:SSZ" -> YYYYMMDDHHMMSS (two such texts compare as their
 * keys do); -1 for NULL or any other form. */
int64_t showdoc_fired_key(const char *fired_at);
/* list's order: < 0 when a comes before b (newer: later fired_at, then
 * the greater id). */
int showdoc_order(int64_t a_key, const char *a_fired_at, const char *a_id, int64_t b_key,
                  const char *b_fired_at, const char *b_id);

/* A time (ms since the epoch) as list and show print it; null if <= 0. */
json_t *showdoc_ms_json(int64_t ms);
/* id, status, reason, review_step, plan_id, cycle, schedule, fired_at,
 * started_at, ended_at (list's row and show's head). */
json_t *showdoc_mandate_json(const struct showdoc_mandate *m);
/* A row of list: the above and duration_ms (ended - started - down). */
json_t *showdoc_row_json(const struct showdoc_mandate *m);

/* list: the rows of src (n of them, oldest first; get(ctx, i, ret) gives
 * the i-th) matching f, newest first, at most limit (0: all), and total,
 * more, next. */
struct showdoc_filter {
        const char *status;           /* NULL: any */
        const char *schedule;         /* NULL: any */
        const char *since;            /* fired_at >= since; NULL: any */
        const struct showdoc_mandate *after; /* cursor: rows strictly after it */
};
struct showdoc_rows {
        size_t n;
        void (*get)(void *ctx, size_t i, struct showdoc_mandate *ret);
        void *ctx;
};
int showdoc_list(const struct showdoc_rows *src, const struct showdoc_filter *f, size_t limit,
                 json_t **ret_result);

/* A finished mandate's summary (StateDirectory/mandates/ID.json, written
 * when it ended): *ret_m's strings point into *ret_json (decref it after).
 * ret_archive: its archive's path.  -EINVAL (missing fields; why says
 * which), or the error of reading the file. */
int showdoc_summary_read(const char *path, struct showdoc_mandate *ret_m,
                         const char **ret_archive, json_t **ret_json, char *why, size_t why_len);

/* Fold a WAL as show reads it: gzipped (an archive) or plain. */
int showdoc_fold_file(const char *path, bool gzipped, struct fold **ret_fold);
/* show's plans, steps and operators of f: {"wal_status","records","plans",
 * "operators"}.  A handler's result and a recovery's evidence go in as
 * placeholders that showdoc_print turns back into the WAL's exact text. */
json_t *showdoc_fold_json(const struct fold *f);
/* The tool calls owned by mandate's steps in s: {step_id: [{key, tool,
 * state, attempt, started, finished}, ...]}, sorted by step, start and key;
 * NULL when out of memory. */
json_t *showdoc_calls_json(struct idem_store *s, const char *mandate);
/* Each step of show's plans gets "tool_calls": its calls from calls, []
 * when none, null when calls is NULL (the store unknown). */
void showdoc_set_tool_calls(json_t *result, json_t *calls);
/* The retries of a mandate, for show: ids of those whose retry_of it is,
 * sorted by retry number. */
json_t *showdoc_retried_by(const struct showdoc_rows *src, const char *id);
/* result printed compactly into out (appended), its placeholders replaced by
 * their values' text.  0, -ENOMEM. */
int showdoc_print(json_t *result, struct kbuf *out);
