/* SPDX-License-Identifier: MIT */
/* cron: 5-field cron expressions and next-occurrence computation
 * in UTC or an IANA time zone.  Pure, no libuv; time zones are read from the
 * system's TZif files once and then used without touching global state. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

struct cron_expr {
        uint64_t minutes;       /* bit m: minute m (0..59) */
        uint32_t hours;         /* bit h (0..23) */
        uint32_t days;          /* bit d (1..31) */
        uint16_t months;        /* bit m (1..12) */
        uint8_t weekdays;       /* bit w (0..6, 0 = Sunday) */
        bool dom_restricted;    /* day-of-month not the full range */
        bool dow_restricted;    /* day-of-week not the full range */
};

/* Parse "m h dom mon dow" (with *, N, N-M, lists, * /S, N-M/S, N/S = N-max/S,
 * JAN..DEC, SUN..SAT case-insensitive, 7 = Sunday, also in ranges such as
 * 5-7) or @hourly @daily @weekly @monthly @yearly (@annually, @midnight).
 * For day-of-week, '*' and N/S run up to 6.  A day field is "restricted"
 * unless its set is the full range (so 1-31, * /1, 0-7 are unrestricted,
 * * /2 is restricted).  -EINVAL with a message naming the field and the token
 * in err (may be NULL), e.g. "minute: 60 out of range 0-59",
 * "expected 5 fields, got 4", "day-of-week: bad token '1..5'",
 * "minute: step 0 in '* /0'", "hour: reversed range '5-1'",
 * "minute: empty item in '1,,2'", "unknown macro '@foo'".
 * *out is written only on success. */
int cron_parse(const char *text, struct cron_expr *out, char *err, size_t errlen);

/* Does the expression match this broken-down local time? (minute granularity) */
bool cron_matches(const struct cron_expr *e, int minute, int hour, int mday, int month,
                  int wday);

/* The range of every time function below: the instants (Unix seconds) from
 * 1970-01-01T00:00:00Z to 9999-12-31T23:59:59Z.  Outside it they return
 * -ERANGE; cron_next never answers outside it. */
#define CRON_TIME_MIN INT64_C(0)
#define CRON_TIME_MAX INT64_C(253402300799)
/* Naive local times (cron_tz_local_to_utc) may lie this far beyond the range
 * (more than any UTC offset), so that every instant in it can be mapped. */
#define CRON_LOCAL_SLACK INT64_C(172800)

/* A loaded time zone. */
struct cron_tz;

/* Load an IANA zone ("UTC", "Europe/Berlin") from the zoneinfo directory
 * (TZDIR or /usr/share/zoneinfo).  -EINVAL for a bad name (no "..", not
 * absolute, only [A-Za-z0-9_+/-]), -ENOENT if unknown (or not a TZif file),
 * -EBADMSG for a malformed TZif file.  "UTC" is built in (no tzdata needed).
 * TZif v1, v2 and v3 are read (the 64-bit section when present; the footer
 * POSIX TZ rule applies after the last transition).  Leap seconds ignored. */
int cron_tz_load(const char *name, struct cron_tz **out);
void cron_tz_free(struct cron_tz *tz);
const char *cron_tz_name(const struct cron_tz *tz);  /* NULL tz: "UTC" */

/* UTC offset (seconds east of Greenwich) in force at Unix time t; tz NULL =
 * UTC.  -ERANGE if t is outside [CRON_TIME_MIN, CRON_TIME_MAX]. */
int cron_tz_utc_offset(const struct cron_tz *tz, int64_t t, int32_t *ret_off);

/* The Unix times at which the local wall-clock time `local` (Unix seconds
 * of the naive local date-time, i.e. UTC + offset) occurs, ascending: 0 in a
 * DST gap, 2 in a fall-back overlap, else 1 (near the ends of the range they
 * may lie up to a day outside it).  The count in *ret_n.  -ERANGE if local is
 * more than CRON_LOCAL_SLACK outside the range. */
#define CRON_TZ_MAX_CANDIDATES 4
int cron_tz_local_to_utc(const struct cron_tz *tz, int64_t local,
                         int64_t out[CRON_TZ_MAX_CANDIDATES], size_t *ret_n);

/* Broken-down local time of t in tz (NULL = UTC), like localtime_r but
 * thread-safe and without global state; tm_gmtoff set, tm_zone = "".
 * -ERANGE if t is outside [CRON_TIME_MIN, CRON_TIME_MAX]. */
int cron_tz_localtime(const struct cron_tz *tz, int64_t t, struct tm *out);

/* The first matching time strictly after `after` (Unix seconds), in zone tz
 * (NULL = UTC).  Local times that do not exist (DST gap) are skipped; a local
 * time that occurs twice fires once (its first occurrence).  Does not iterate
 * minute by minute over long gaps.  -ENOENT if nothing matches within 8 years
 * (e.g. "0 0 31 2 *") or before the end of CRON_TIME_MAX; -ERANGE if `after`
 * is outside [CRON_TIME_MIN, CRON_TIME_MAX]. */
int cron_next(const struct cron_expr *e, const struct cron_tz *tz, int64_t after,
              int64_t *next);
