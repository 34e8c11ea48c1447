/* SPDX-License-Identifier: MIT */
/* cron: 5-field cron expressions (DESIGN §9) and next-occurrence computation
 * in UTC or an IANA time zone.  Pure, no libuv; time zones are read from the
 * system's TZif files once and then used without touching global state. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cron_expr {
        uint64_t minutes;       /* bit m: minute m (0..59) */
        uint32_t hours;         /* bit h (0..23) */
        uint32_t days;          /* bit d (1..31) */
        uint16_t months;        /* bit m (1..12) */
        uint8_t weekdays;       /* bit w (0..6, 0 = Sunday) */
        bool dom_restricted;    /* day-of-month not the full range */
        bool dow_restricted;    /* day-of-week not the full range */
};

/* Parse "m h dom mon dow" (with *, N, N-M, lists, * /S, N-M/S, JAN..DEC,
 * SUN..SAT, 7 = Sunday) or @hourly @daily @weekly @monthly @yearly
 * (@annually, @midnight).  -EINVAL with a message naming the field and the
 * token in err, e.g. "minute: 60 out of range 0-59". */
int cron_parse(const char *text, struct cron_expr *out, char *err, size_t errlen);

/* Does the expression match this broken-down local time? (minute granularity) */
bool cron_matches(const struct cron_expr *e, int minute, int hour, int mday, int month,
                  int wday);

/* A loaded time zone. */
struct cron_tz;

/* Load an IANA zone ("UTC", "Europe/Berlin") from the zoneinfo directory
 * (TZDIR or /usr/share/zoneinfo).  -EINVAL for a bad name (no "..", not
 * absolute), -ENOENT if unknown. */
int cron_tz_load(const char *name, struct cron_tz **out);
void cron_tz_free(struct cron_tz *tz);
const char *cron_tz_name(const struct cron_tz *tz);

/* The first matching time strictly after `after` (Unix seconds), in zone tz
 * (NULL = UTC).  Local times that do not exist (DST gap) are skipped; a local
 * time that occurs twice fires once (its first occurrence).  Does not iterate
 * minute by minute over long gaps.  -ENOENT if nothing matches within 8 years
 * (e.g. "0 0 31 2 *"). */
int cron_next(const struct cron_expr *e, const struct cron_tz *tz, int64_t after,
              int64_t *next);
