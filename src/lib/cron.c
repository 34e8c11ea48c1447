/* SPDX-License-Identifier: MIT */
/* cron: parser, matcher, TZif reader and next-occurrence search.
 *
 * Times are handled as Unix seconds (int64).  A zone is a sorted table of
 * transitions (from the TZif file) followed by the footer's POSIX TZ rule;
 * local time = UTC + offset.  No libc time zone state is touched, so every
 * function here is safe to call from any thread. */
#include "kairos/cron.h"
#include "kairos/kmem.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Internal computations clamp to +-8.9 million years, far from int64
 * overflow; the public functions accept only [CRON_TIME_MIN, CRON_TIME_MAX]. */
#define TIME_LIMIT ((int64_t)1 << 48)
#define SEARCH_SPAN ((int64_t)8 * 366 * 86400)
/* Offsets beyond this are rejected when loading a zone (RFC 8536 suggests
 * -89999..93599); it bounds the window searched when mapping local -> UTC. */
#define MAX_UTOFF 100000
#define TZ_MAX_FILE (1 << 20)

/* ------------------------------------------------------------------------ */
/* Civil calendar (proleptic Gregorian), after H. Hinnant's algorithms.      */

static int64_t floor_div(int64_t a, int64_t b)
{
        int64_t q = a / b;
        if ((a % b != 0) && ((a < 0) != (b < 0)))
                q--;
        return q;
}

static int64_t days_from_civil(int64_t y, unsigned m, unsigned d)
{
        y -= m <= 2;
        const int64_t era = (y >= 0 ? y : y - 399) / 400;
        const unsigned yoe = (unsigned)(y - era * 400);
        const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
        const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        return era * 146097 + (int64_t)doe - 719468;
}

static void civil_from_days(int64_t z, int64_t *y, unsigned *m, unsigned *d)
{
        z += 719468;
        const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
        const unsigned doe = (unsigned)(z - era * 146097);
        const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
        const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        const unsigned mp = (5 * doy + 2) / 153;
        *d = doy - (153 * mp + 2) / 5 + 1;
        *m = mp < 10 ? mp + 3 : mp - 9;
        *y = (int64_t)yoe + era * 400 + (*m <= 2);
}

static bool is_leap(int64_t y)
{
        return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

static unsigned days_in_month(int64_t y, unsigned m)
{
        static const unsigned char dim[12] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
        return m == 2 && is_leap(y) ? 29 : dim[m - 1];
}

/* 0 = Sunday; day 0 (1970-01-01) was a Thursday. */
static unsigned weekday_of(int64_t days)
{
        return (unsigned)(((days % 7) + 7 + 4) % 7);
}

/* ------------------------------------------------------------------------ */
/* Parser                                                                    */

struct field_spec {
        const char *name;
        int min, max;           /* accepted values */
        int star_max;           /* upper end of '*' and of 'N/S' */
        const char *const *names;
        int name_base;
};

static const char *const month_names[] = { "JAN", "FEB", "MAR", "APR", "MAY", "JUN",
                                           "JUL", "AUG", "SEP", "OCT", "NOV", "DEC", NULL };
static const char *const dow_names[] = { "SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT", NULL };

enum { F_MINUTE, F_HOUR, F_DOM, F_MONTH, F_DOW, F_COUNT };

static const struct field_spec field_specs[F_COUNT] = {
        { "minute", 0, 59, 59, NULL, 0 },
        { "hour", 0, 23, 23, NULL, 0 },
        { "day-of-month", 1, 31, 31, NULL, 0 },
        { "month", 1, 12, 12, month_names, 1 },
        { "day-of-week", 0, 7, 6, dow_names, 0 },
};

#define TOKEN_MAX 48

/* A printable, bounded copy of an input token for error messages. */
static void token_copy(char *dst, const char *s, size_t n)
{
        size_t k = n > TOKEN_MAX ? TOKEN_MAX : n;
        for (size_t i = 0; i < k; i++) {
                unsigned char c = (unsigned char)s[i];
                dst[i] = (c < 0x20 || c >= 0x7f) ? '?' : (char)c;
        }
        if (k < n) {
                memcpy(dst + k, "...", 3);
                k += 3;
        }
        dst[k] = '\0';
}

__attribute__((format(printf, 3, 4)))
static int fail(char *err, size_t errlen, const char *fmt, ...)
{
        if (err && errlen > 0) {
                va_list ap;
                va_start(ap, fmt);
                vsnprintf(err, errlen, fmt, ap);
                va_end(ap);
        }
        return -EINVAL;
}

static bool is_digit(char c)
{
        return c >= '0' && c <= '9';
}

static bool is_alpha(char c)
{
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static bool is_space(char c)
{
        return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static char ascii_upper(char c)
{
        return (c >= 'a' && c <= 'z') ? (char)(c - 'a' + 'A') : c;
}

/* Parse a number or a name at s[*i..n).  1: parsed; 0: nothing usable here;
 * -EINVAL: a number out of range (message written). */
static int parse_value(const struct field_spec *f, const char *s, size_t n, size_t *i, int *val,
                       char *err, size_t errlen)
{
        size_t st = *i, j = st;

        if (j < n && is_digit(s[j])) {
                long v = 0;
                while (j < n && is_digit(s[j])) {
                        if (v < 1000000)
                                v = v * 10 + (s[j] - '0');
                        j++;
                }
                if (v < f->min || v > f->max) {
                        char tok[TOKEN_MAX + 4];
                        token_copy(tok, s + st, j - st);
                        return fail(err, errlen, "%s: %s out of range %d-%d", f->name, tok,
                                    f->min, f->max);
                }
                *val = (int)v;
                *i = j;
                return 1;
        }
        if (!f->names)
                return 0;
        while (j < n && is_alpha(s[j]))
                j++;
        if (j - st != 3)
                return 0;
        for (int k = 0; f->names[k]; k++) {
                const char *nm = f->names[k];
                if (ascii_upper(s[st]) == nm[0] && ascii_upper(s[st + 1]) == nm[1] &&
                    ascii_upper(s[st + 2]) == nm[2]) {
                        *val = k + f->name_base;
                        *i = j;
                        return 1;
                }
        }
        return 0;
}

static int bad_token(const struct field_spec *f, const char *s, size_t n, char *err, size_t errlen)
{
        char tok[TOKEN_MAX + 4];
        token_copy(tok, s, n);
        return fail(err, errlen, "%s: bad token '%s'", f->name, tok);
}

/* One list item: '*', N, N-M, each optionally followed by /S. */
static int parse_item(const struct field_spec *f, const char *s, size_t n, uint64_t *mask,
                      char *err, size_t errlen)
{
        size_t p = 0;
        while (p < n && s[p] != '/')
                p++;
        bool has_step = p < n;
        int lo, hi, r;

        if (p == 1 && s[0] == '*') {
                lo = f->min;
                hi = f->star_max;
        } else {
                size_t i = 0;
                r = parse_value(f, s, p, &i, &lo, err, errlen);
                if (r < 0)
                        return r;
                if (r == 0)
                        return bad_token(f, s, n, err, errlen);
                if (i < p && s[i] == '-') {
                        i++;
                        r = parse_value(f, s, p, &i, &hi, err, errlen);
                        if (r < 0)
                                return r;
                        if (r == 0 || i != p)
                                return bad_token(f, s, n, err, errlen);
                        if (hi < lo) {
                                char tok[TOKEN_MAX + 4];
                                token_copy(tok, s, n);
                                return fail(err, errlen, "%s: reversed range '%s'", f->name, tok);
                        }
                } else {
                        if (i != p)
                                return bad_token(f, s, n, err, errlen);
                        hi = has_step ? (lo > f->star_max ? lo : f->star_max) : lo;
                }
        }

        int step = 1;
        if (has_step) {
                size_t j = p + 1;
                long v = 0;
                if (j >= n)
                        return bad_token(f, s, n, err, errlen);
                for (; j < n; j++) {
                        if (!is_digit(s[j]))
                                return bad_token(f, s, n, err, errlen);
                        if (v < 1000000)
                                v = v * 10 + (s[j] - '0');
                }
                char tok[TOKEN_MAX + 4];
                token_copy(tok, s, n);
                if (v == 0)
                        return fail(err, errlen, "%s: step 0 in '%s'", f->name, tok);
                int span = f->star_max - f->min + 1;
                if (v > span)
                        return fail(err, errlen, "%s: step in '%s' out of range 1-%d", f->name,
                                    tok, span);
                step = (int)v;
        }

        for (int v = lo; v <= hi; v += step)
                *mask |= (uint64_t)1 << (f == &field_specs[F_DOW] && v == 7 ? 0 : v);
        return 0;
}

static int parse_field(const struct field_spec *f, const char *s, size_t n, uint64_t *mask,
                       char *err, size_t errlen)
{
        size_t st = 0;
        *mask = 0;
        for (size_t i = 0; i <= n; i++) {
                if (i < n && s[i] != ',')
                        continue;
                if (i == st) {
                        char tok[TOKEN_MAX + 4];
                        token_copy(tok, s, n);
                        return fail(err, errlen, "%s: empty item in '%s'", f->name, tok);
                }
                int r = parse_item(f, s + st, i - st, mask, err, errlen);
                if (r < 0)
                        return r;
                st = i + 1;
        }
        return 0;
}

static const struct {
        const char *name;
        const char *expr;
} macros[] = {
        { "@yearly", "0 0 1 1 *" },  { "@annually", "0 0 1 1 *" }, { "@monthly", "0 0 1 * *" },
        { "@weekly", "0 0 * * 0" },  { "@daily", "0 0 * * *" },    { "@midnight", "0 0 * * *" },
        { "@hourly", "0 * * * *" },
};

#define DAYS_ALL UINT32_C(0xFFFFFFFE)
#define DOW_ALL 0x7F

int cron_parse(const char *text, struct cron_expr *out, char *err, size_t errlen)
{
        if (err && errlen > 0)
                err[0] = '\0';
        if (!text || !out)
                return fail(err, errlen, "no expression");

        size_t len = strlen(text), i = 0;
        while (i < len && is_space(text[i]))
                i++;
        if (i < len && text[i] == '@') {
                size_t st = i;
                while (i < len && !is_space(text[i]))
                        i++;
                size_t mlen = i - st;
                while (i < len && is_space(text[i]))
                        i++;
                char tok[TOKEN_MAX + 4];
                if (i < len) {
                        token_copy(tok, text + i, len - i);
                        return fail(err, errlen, "unexpected '%s' after a macro", tok);
                }
                for (size_t k = 0; k < sizeof(macros) / sizeof(macros[0]); k++) {
                        if (strlen(macros[k].name) != mlen)
                                continue;
                        bool eq = true;
                        for (size_t c = 0; c < mlen && eq; c++)
                                eq = ascii_upper(text[st + c]) == ascii_upper(macros[k].name[c]);
                        if (eq)
                                return cron_parse(macros[k].expr, out, err, errlen);
                }
                token_copy(tok, text + st, mlen);
                return fail(err, errlen, "unknown macro '%s'", tok);
        }

        const char *fs[F_COUNT] = { 0 };
        size_t fl[F_COUNT] = { 0 };
        size_t nfields = 0;
        while (i < len) {
                size_t st = i;
                while (i < len && !is_space(text[i]))
                        i++;
                if (nfields < F_COUNT) {
                        fs[nfields] = text + st;
                        fl[nfields] = i - st;
                }
                nfields++;
                while (i < len && is_space(text[i]))
                        i++;
        }
        if (nfields != F_COUNT)
                return fail(err, errlen, "expected 5 fields, got %zu", nfields);

        uint64_t m[F_COUNT];
        for (int k = 0; k < F_COUNT; k++) {
                int r = parse_field(&field_specs[k], fs[k], fl[k], &m[k], err, errlen);
                if (r < 0)
                        return r;
        }
        struct cron_expr e = {
                .minutes = m[F_MINUTE],
                .hours = (uint32_t)m[F_HOUR],
                .days = (uint32_t)m[F_DOM],
                .months = (uint16_t)m[F_MONTH],
                .weekdays = (uint8_t)m[F_DOW],
        };
        e.dom_restricted = e.days != DAYS_ALL;
        e.dow_restricted = e.weekdays != DOW_ALL;
        *out = e;
        return 0;
}

/* ------------------------------------------------------------------------ */
/* Matching                                                                  */

static bool day_matches(const struct cron_expr *e, unsigned mday, unsigned wday)
{
        bool dom = (e->days >> mday) & 1;
        bool dow = (e->weekdays >> wday) & 1;
        if (e->dom_restricted && e->dow_restricted)
                return dom || dow;
        return (e->dom_restricted ? dom : true) && (e->dow_restricted ? dow : true);
}

bool cron_matches(const struct cron_expr *e, int minute, int hour, int mday, int month, int wday)
{
        if (!e || minute < 0 || minute > 59 || hour < 0 || hour > 23 || mday < 1 || mday > 31 ||
            month < 1 || month > 12 || wday < 0 || wday > 7)
                return false;
        if (wday == 7)
                wday = 0;
        return ((e->minutes >> minute) & 1) && ((e->hours >> hour) & 1) &&
               ((e->months >> month) & 1) && day_matches(e, (unsigned)mday, (unsigned)wday);
}

/* ------------------------------------------------------------------------ */
/* Time zones                                                                */

enum rule_kind { RULE_JULIAN1 /* Jn */, RULE_JULIAN0 /* n */, RULE_MWD /* Mm.w.d */ };

struct tz_rule {
        enum rule_kind kind;
        int a, b, c;            /* day number, or month, week, weekday */
        int32_t time;           /* seconds after local midnight (may be <0 or >24h) */
};

struct cron_tz {
        char *name;
        size_t ntrans;
        int64_t *trans;         /* ascending */
        int32_t *offs;          /* UTC offset (seconds east) from trans[i] on */
        int32_t off0;           /* before the first transition (time type 0) */
        bool has_footer;        /* the POSIX rule applies from the last transition on */
        bool has_dst;
        int32_t std_off, dst_off;
        struct tz_rule start, end;
};

/* Local time of a rule's instant in year y, as local seconds. */
static int64_t rule_local(const struct tz_rule *r, int64_t y)
{
        int64_t day;
        switch (r->kind) {
        case RULE_JULIAN1: {
                int n = r->a - 1;       /* 1..365, February 29 never counted */
                if (is_leap(y) && r->a >= 60)
                        n++;
                day = days_from_civil(y, 1, 1) + n;
                break;
        }
        case RULE_JULIAN0:
                day = days_from_civil(y, 1, 1) + r->a;
                break;
        case RULE_MWD:
        default: {
                unsigned m = (unsigned)r->a;
                int64_t first = days_from_civil(y, m, 1);
                unsigned w1 = weekday_of(first);
                unsigned d = (unsigned)(r->c - (int)w1 + 7) % 7; /* first such weekday, 0-based */
                d += (unsigned)(r->b - 1) * 7;
                while (d >= days_in_month(y, m))
                        d -= 7;
                day = first + d;
                break;
        }
        }
        return day * 86400 + r->time;
}

static void rule_year(const struct cron_tz *tz, int64_t y, int64_t *s, int64_t *e)
{
        *s = rule_local(&tz->start, y) - tz->std_off;
        *e = rule_local(&tz->end, y) - tz->dst_off;
}

static int64_t year_of(int64_t t)
{
        int64_t y;
        unsigned m, d;
        civil_from_days(floor_div(t, 86400), &y, &m, &d);
        return y;
}

static int32_t footer_offset(const struct cron_tz *tz, int64_t t)
{
        if (!tz->has_dst)
                return tz->std_off;
        int64_t s, e;
        rule_year(tz, year_of(t + tz->std_off), &s, &e);
        bool dst = s < e ? (t >= s && t < e) : !(t >= e && t < s);
        return dst ? tz->dst_off : tz->std_off;
}

static int64_t clamp_time(int64_t t)
{
        return t < -TIME_LIMIT ? -TIME_LIMIT : t > TIME_LIMIT ? TIME_LIMIT : t;
}

static bool in_range(int64_t t)
{
        return t >= CRON_TIME_MIN && t <= CRON_TIME_MAX;
}

static int32_t utc_offset(const struct cron_tz *tz, int64_t t)
{
        if (!tz)
                return 0;
        t = clamp_time(t);
        size_t n = tz->ntrans;
        if (n == 0 || t >= tz->trans[n - 1]) {
                if (tz->has_footer)
                        return footer_offset(tz, t);
                return n ? tz->offs[n - 1] : tz->off0;
        }
        if (t < tz->trans[0])
                return tz->off0;
        size_t lo = 0, hi = n - 1;      /* trans[lo] <= t < trans[hi] */
        while (hi - lo > 1) {
                size_t mid = lo + (hi - lo) / 2;
                if (tz->trans[mid] <= t)
                        lo = mid;
                else
                        hi = mid;
        }
        return tz->offs[lo];
}

int cron_tz_utc_offset(const struct cron_tz *tz, int64_t t, int32_t *ret_off)
{
        if (!ret_off)
                return -EINVAL;
        if (!in_range(t))
                return -ERANGE;
        *ret_off = utc_offset(tz, t);
        return 0;
}

/* The first instant > t at which the offset may change; INT64_MAX if none. */
static int64_t next_transition(const struct cron_tz *tz, int64_t t)
{
        if (!tz)
                return INT64_MAX;
        size_t n = tz->ntrans;
        if (n > 0 && t < tz->trans[n - 1]) {
                size_t lo = 0, hi = n - 1;      /* smallest i with trans[i] > t */
                if (tz->trans[0] > t)
                        return tz->trans[0];
                while (hi - lo > 1) {
                        size_t mid = lo + (hi - lo) / 2;
                        if (tz->trans[mid] > t)
                                hi = mid;
                        else
                                lo = mid;
                }
                return tz->trans[hi];
        }
        if (!tz->has_footer || !tz->has_dst)
                return INT64_MAX;
        int64_t best = INT64_MAX, y = year_of(t);
        for (int64_t yy = y - 1; yy <= y + 2; yy++) {
                int64_t s, e;
                rule_year(tz, yy, &s, &e);
                if (s > t && s < best)
                        best = s;
                if (e > t && e < best)
                        best = e;
        }
        return best;
}

static size_t local_to_utc(const struct cron_tz *tz, int64_t local,
                           int64_t out[CRON_TZ_MAX_CANDIDATES])
{
        local = clamp_time(local);
        if (!tz) {
                out[0] = local;
                return 1;
        }
        /* Every u with u + off(u) == local lies within MAX_UTOFF of local:
         * collect the offsets in force around it and test each. */
        int32_t offs[64];
        size_t noffs = 0;
        int64_t t = local - 2 * 86400, end = local + 2 * 86400;
        offs[noffs++] = utc_offset(tz, t);
        /* (bounded even for a crafted file with a transition every second) */
        for (int steps = 0; noffs < 64 && steps < 4096; steps++) {
                t = next_transition(tz, t);
                if (t > end)
                        break;
                int32_t o = utc_offset(tz, t);
                bool seen = false;
                for (size_t k = 0; k < noffs; k++)
                        seen = seen || offs[k] == o;
                if (!seen)
                        offs[noffs++] = o;
        }
        size_t n = 0;
        for (size_t k = 0; k < noffs && n < CRON_TZ_MAX_CANDIDATES; k++) {
                int64_t u = local - offs[k];
                if (utc_offset(tz, u) != offs[k])
                        continue;
                size_t j = n;
                while (j > 0 && out[j - 1] > u) {
                        out[j] = out[j - 1];
                        j--;
                }
                out[j] = u;
                n++;
        }
        return n;
}

int cron_tz_local_to_utc(const struct cron_tz *tz, int64_t local,
                         int64_t out[CRON_TZ_MAX_CANDIDATES], size_t *ret_n)
{
        if (!out || !ret_n)
                return -EINVAL;
        if (local < CRON_TIME_MIN - CRON_LOCAL_SLACK || local > CRON_TIME_MAX + CRON_LOCAL_SLACK)
                return -ERANGE;
        *ret_n = local_to_utc(tz, local, out);
        return 0;
}

int cron_tz_localtime(const struct cron_tz *tz, int64_t t, struct tm *out)
{
        if (!out)
                return -EINVAL;
        if (!in_range(t))
                return -ERANGE;
        int32_t off = utc_offset(tz, t);
        int64_t l = t + off, days = floor_div(l, 86400), secs = l - days * 86400, y;
        unsigned m, d;
        civil_from_days(days, &y, &m, &d);
        memset(out, 0, sizeof(*out));
        out->tm_year = (int)(y - 1900);
        out->tm_mon = (int)m - 1;
        out->tm_mday = (int)d;
        out->tm_hour = (int)(secs / 3600);
        out->tm_min = (int)(secs % 3600 / 60);
        out->tm_sec = (int)(secs % 60);
        out->tm_wday = (int)weekday_of(days);
        out->tm_yday = (int)(days - days_from_civil(y, 1, 1));
        out->tm_isdst = tz && tz->has_dst && off == tz->dst_off && off != tz->std_off;
        out->tm_gmtoff = off;
        out->tm_zone = "";
        return 0;
}

/* --- POSIX TZ strings (the TZif footer) --- */

static bool tzs_name(const char **p)
{
        const char *s = *p;
        if (*s == '<') {
                s++;
                while (*s && *s != '>') {
                        if (!is_alpha(*s) && !is_digit(*s) && *s != '+' && *s != '-')
                                return false;
                        s++;
                }
                if (*s != '>' || s - *p < 4)
                        return false;
                *p = s + 1;
                return true;
        }
        while (is_alpha(*s))
                s++;
        if (s - *p < 3)
                return false;
        *p = s;
        return true;
}

/* [+-]hh[:mm[:ss]] with hh <= max_h; seconds. */
static bool tzs_time(const char **p, int max_h, int32_t *out)
{
        const char *s = *p;
        int sign = 1;
        if (*s == '+' || *s == '-')
                sign = *s++ == '-' ? -1 : 1;
        int32_t part[3] = { 0, 0, 0 };
        for (int k = 0; k < 3; k++) {
                if (k > 0) {
                        if (*s != ':')
                                break;
                        s++;
                }
                if (!is_digit(*s))
                        return false;
                int v = 0, nd = 0;
                while (is_digit(*s) && nd < 3) {
                        v = v * 10 + (*s++ - '0');
                        nd++;
                }
                if (is_digit(*s) || (k > 0 && v > 59) || (k == 0 && v > max_h))
                        return false;
                part[k] = v;
        }
        *out = sign * (part[0] * 3600 + part[1] * 60 + part[2]);
        *p = s;
        return true;
}

static bool tzs_num(const char **p, int min, int max, int *out)
{
        const char *s = *p;
        int v = 0, nd = 0;
        if (!is_digit(*s))
                return false;
        while (is_digit(*s) && nd < 4) {
                v = v * 10 + (*s++ - '0');
                nd++;
        }
        if (is_digit(*s) || v < min || v > max)
                return false;
        *out = v;
        *p = s;
        return true;
}

static bool tzs_rule(const char **p, struct tz_rule *r)
{
        const char *s = *p;
        if (*s == 'J') {
                s++;
                r->kind = RULE_JULIAN1;
                if (!tzs_num(&s, 1, 365, &r->a))
                        return false;
        } else if (*s == 'M') {
                s++;
                r->kind = RULE_MWD;
                if (!tzs_num(&s, 1, 12, &r->a) || *s++ != '.' || !tzs_num(&s, 1, 5, &r->b) ||
                    *s++ != '.' || !tzs_num(&s, 0, 6, &r->c))
                        return false;
        } else {
                r->kind = RULE_JULIAN0;
                if (!tzs_num(&s, 0, 365, &r->a))
                        return false;
        }
        r->time = 2 * 3600;
        if (*s == '/') {
                s++;
                if (!tzs_time(&s, 167, &r->time))
                        return false;
        }
        *p = s;
        return true;
}

static int parse_posix_tz(struct cron_tz *tz, const char *s)
{
        int32_t v;
        if (!tzs_name(&s) || !tzs_time(&s, 24, &v))
                return -EBADMSG;
        tz->std_off = -v;
        tz->dst_off = tz->std_off;
        tz->has_dst = false;
        if (*s == '\0')
                return 0;
        if (!tzs_name(&s))
                return -EBADMSG;
        tz->has_dst = true;
        tz->dst_off = tz->std_off + 3600;
        if (*s != ',' && *s != '\0') {
                if (!tzs_time(&s, 24, &v))
                        return -EBADMSG;
                tz->dst_off = -v;
        }
        if (*s == '\0') {
                /* No rule: the POSIX default (US rules). */
                tz->start = (struct tz_rule){ RULE_MWD, 3, 2, 0, 7200 };
                tz->end = (struct tz_rule){ RULE_MWD, 11, 1, 0, 7200 };
                return 0;
        }
        if (*s++ != ',' || !tzs_rule(&s, &tz->start) || *s++ != ',' || !tzs_rule(&s, &tz->end) ||
            *s != '\0')
                return -EBADMSG;
        return 0;
}

/* --- TZif --- */

struct tzif_hdr {
        uint32_t isut, isstd, leap, time, type, chars;
};

static uint32_t be32(const unsigned char *p)
{
        return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int64_t be64(const unsigned char *p)
{
        return (int64_t)((uint64_t)be32(p) << 32 | be32(p + 4));
}

static int tzif_header(const unsigned char *p, size_t len, struct tzif_hdr *h, int *version)
{
        if (len < 44 || memcmp(p, "TZif", 4) != 0)
                return -ENOENT;
        *version = p[4] == 0 ? 1 : p[4] - '0';
        h->isut = be32(p + 20);
        h->isstd = be32(p + 24);
        h->leap = be32(p + 28);
        h->time = be32(p + 32);
        h->type = be32(p + 36);
        h->chars = be32(p + 40);
        if (h->type == 0 || h->type > 256 || (h->isstd != 0 && h->isstd != h->type) ||
            (h->isut != 0 && h->isut != h->type))
                return -EBADMSG;
        return 0;
}

static uint64_t tzif_block_size(const struct tzif_hdr *h, unsigned tsize)
{
        return (uint64_t)h->time * tsize + h->time + (uint64_t)h->type * 6 + h->chars +
               (uint64_t)h->leap * (tsize + 4) + h->isstd + h->isut;
}

static int tzif_block(struct cron_tz *tz, const struct tzif_hdr *h, const unsigned char *p,
                      unsigned tsize)
{
        const unsigned char *tp = p, *ip = p + (size_t)h->time * tsize;
        const unsigned char *ty = ip + h->time;
        int32_t offs[256];

        for (uint32_t k = 0; k < h->type; k++) {
                int32_t o = (int32_t)be32(ty + 6 * k);
                if (o < -MAX_UTOFF || o > MAX_UTOFF)
                        return -EBADMSG;
                offs[k] = o;
        }
        tz->off0 = offs[0];
        if (h->time > 0) {
                tz->trans = calloc(h->time, sizeof(*tz->trans));
                tz->offs = calloc(h->time, sizeof(*tz->offs));
                if (!tz->trans || !tz->offs)
                        return -ENOMEM;
        }
        for (uint32_t k = 0; k < h->time; k++) {
                int64_t t = tsize == 8 ? be64(tp + 8 * k) : (int32_t)be32(tp + 4 * k);
                if (ip[k] >= h->type || t < -TIME_LIMIT || t > TIME_LIMIT ||
                    (k > 0 && t <= tz->trans[k - 1]))
                        return -EBADMSG;
                tz->trans[k] = t;
                tz->offs[k] = offs[ip[k]];
        }
        tz->ntrans = h->time;
        return 0;
}

static int tzif_parse(struct cron_tz *tz, const unsigned char *p, size_t len)
{
        struct tzif_hdr h;
        int version, r = tzif_header(p, len, &h, &version);
        if (r < 0)
                return r;
        uint64_t sz = tzif_block_size(&h, 4);
        if (sz > len - 44)
                return -EBADMSG;
        if (version < 2)
                return tzif_block(tz, &h, p + 44, 4);

        size_t off = 44 + (size_t)sz;
        r = tzif_header(p + off, len - off, &h, &version);
        if (r < 0)
                return -EBADMSG;
        off += 44;
        sz = tzif_block_size(&h, 8);
        if (sz > len - off)
                return -EBADMSG;
        r = tzif_block(tz, &h, p + off, 8);
        if (r < 0)
                return r;
        off += (size_t)sz;

        /* Footer: "\n<POSIX TZ>\n" (may be empty). */
        if (off >= len || p[off] != '\n')
                return -EBADMSG;
        const unsigned char *f = p + off + 1;
        const unsigned char *nl = memchr(f, '\n', len - off - 1);
        if (!nl || nl - f > 255)
                return -EBADMSG;
        if (nl == f)
                return 0;
        char buf[256];
        memcpy(buf, f, (size_t)(nl - f));
        buf[nl - f] = '\0';
        if (strlen(buf) != (size_t)(nl - f))
                return -EBADMSG;
        r = parse_posix_tz(tz, buf);
        if (r < 0)
                return r;
        tz->has_footer = true;
        return 0;
}

static bool tz_name_ok(const char *name)
{
        size_t n = strlen(name);
        if (n == 0 || n > 255 || name[0] == '/' || strstr(name, ".."))
                return false;
        for (size_t i = 0; i < n; i++) {
                char c = name[i];
                if (!is_alpha(c) && !is_digit(c) && c != '_' && c != '+' && c != '-' && c != '/')
                        return false;
        }
        return true;
}

static int read_file(const char *path, unsigned char **buf, size_t *len)
{
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
                return errno == ENOTDIR || errno == ENAMETOOLONG || errno == ELOOP ? -ENOENT
                                                                                   : -errno;
        struct stat st;
        int r = 0;
        unsigned char *b = NULL;
        if (fstat(fd, &st) < 0) {
                r = -errno;
                goto out;
        }
        if (!S_ISREG(st.st_mode)) {
                r = -ENOENT;
                goto out;
        }
        if (st.st_size > TZ_MAX_FILE) {
                r = -EBADMSG;
                goto out;
        }
        size_t cap = (size_t)st.st_size + 1, n = 0;
        b = malloc(cap);
        if (!b) {
                r = -ENOMEM;
                goto out;
        }
        for (;;) {
                ssize_t k = read(fd, b + n, cap - n);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        r = -errno;
                        goto out;
                }
                if (k == 0)
                        break;
                n += (size_t)k;
                if (n == cap) {         /* grew while reading */
                        r = -EBADMSG;
                        goto out;
                }
        }
        *buf = b;
        *len = n;
        b = NULL;
out:
        free(b);
        close(fd);
        return r;
}

int cron_tz_load(const char *name, struct cron_tz **out)
{
        if (!name || !out)
                return -EINVAL;
        *out = NULL;
        if (!tz_name_ok(name))
                return -EINVAL;

        struct cron_tz *tz = calloc(1, sizeof(*tz));
        if (!tz)
                return -ENOMEM;
        int r = 0;
        unsigned char *buf = NULL;
        size_t len = 0;
        tz->name = strdup(name);
        if (!tz->name) {
                r = -ENOMEM;
                goto fail;
        }
        /* "UTC" never needs tzdata. */
        if (strcmp(name, "UTC") == 0)
                goto done;

        const char *dir = getenv("TZDIR");
        if (!dir || !*dir)
                dir = "/usr/share/zoneinfo";
        char path[PATH_MAX];
        if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, name) >= sizeof(path)) {
                r = -ENOENT;
                goto fail;
        }
        r = read_file(path, &buf, &len);
        if (r == -ENOENT && strcmp(name, "Etc/UTC") == 0) {
                r = 0;
                goto done;
        }
        if (r < 0)
                goto fail;
        r = tzif_parse(tz, buf, len);
        if (r < 0)
                goto fail;
done:
        free(buf);
        *out = tz;
        return 0;
fail:
        free(buf);
        cron_tz_free(tz);
        return r;
}

void cron_tz_free(struct cron_tz *tz)
{
        if (!tz)
                return;
        FREE_ALL(tz->name, tz->trans, tz->offs, tz);
}

const char *cron_tz_name(const struct cron_tz *tz)
{
        return tz ? tz->name : "UTC";
}

/* ------------------------------------------------------------------------ */
/* Next occurrence                                                           */

static unsigned next_bit64(uint64_t mask, unsigned from, unsigned limit)
{
        /* smallest bit >= from and < limit, or limit */
        if (from >= limit)
                return limit;
        uint64_t m = mask & (~UINT64_C(0) << from);
        if (!m)
                return limit;
        unsigned b = (unsigned)__builtin_ctzll(m);
        return b < limit ? b : limit;
}

/* Days of month (y, m) on which e may fire: bit d for day d. */
static uint32_t month_day_mask(const struct cron_expr *e, int64_t y, unsigned m)
{
        unsigned nd = days_in_month(y, m);
        unsigned w = weekday_of(days_from_civil(y, m, 1));
        uint32_t valid = (uint32_t)(((UINT64_C(1) << (nd + 1)) - 1) & ~UINT64_C(1));
        uint32_t dow = 0;
        for (unsigned d = 1; d <= nd; d++, w = (w + 1) % 7)
                if ((e->weekdays >> w) & 1)
                        dow |= UINT32_C(1) << d;
        uint32_t dom = e->days & valid;
        if (e->dom_restricted && e->dow_restricted)
                return dom | dow;
        return (e->dom_restricted ? dom : valid) & (e->dow_restricted ? dow : valid);
}

/* Smallest minute-aligned local time L with lo <= L < hi matching e, in
 * naive local time (no zone).  Skips whole months, days and hours. */
static int naive_next(const struct cron_expr *e, int64_t lo, int64_t hi, int64_t *out)
{
        const uint64_t minutes = e->minutes & ((UINT64_C(1) << 60) - 1);
        const uint32_t hours = e->hours & 0xFFFFFFu;
        const uint32_t months = e->months & 0x1FFEu;
        if (!minutes || !hours || !months)
                return -ENOENT;

        int64_t start = floor_div(lo, 60) * 60;
        if (start < lo)
                start += 60;
        int64_t days = floor_div(start, 86400), secs = start - days * 86400, y;
        unsigned m, d, h = (unsigned)(secs / 3600), mi = (unsigned)(secs % 3600 / 60);
        civil_from_days(days, &y, &m, &d);

        int64_t cache_y = INT64_MIN;
        unsigned cache_m = 0;
        uint32_t dmask = 0;

        for (;;) {
                if (days * 86400 + h * 3600 + mi * 60 >= hi)
                        return -ENOENT;
                if (!((months >> m) & 1)) {
                        unsigned nm = next_bit64(months, m + 1, 13);
                        if (nm == 13) {
                                y++;
                                nm = next_bit64(months, 1, 13);
                        }
                        m = nm;
                        d = 1;
                        h = mi = 0;
                        days = days_from_civil(y, m, 1);
                        continue;
                }
                if (cache_y != y || cache_m != m) {
                        dmask = month_day_mask(e, y, m);
                        cache_y = y;
                        cache_m = m;
                }
                if (!((dmask >> d) & 1)) {
                        unsigned nd = next_bit64(dmask, d + 1, 32);
                        h = mi = 0;
                        if (nd == 32) {         /* next month */
                                if (++m == 13) {
                                        m = 1;
                                        y++;
                                }
                                d = 1;
                                days = days_from_civil(y, m, 1);
                        } else {
                                days += nd - d;
                                d = nd;
                        }
                        continue;
                }
                if (!((hours >> h) & 1)) {
                        unsigned nh = next_bit64(hours, h + 1, 24);
                        mi = 0;
                        if (nh < 24) {
                                h = nh;
                                continue;
                        }
                        h = 24;         /* fall through to the day roll below */
                } else if (!((minutes >> mi) & 1)) {
                        unsigned nmi = next_bit64(minutes, mi + 1, 60);
                        if (nmi < 60) {
                                mi = nmi;
                                continue;
                        }
                        mi = 0;
                        h++;
                        if (h < 24)
                                continue;
                } else {
                        *out = days * 86400 + h * 3600 + mi * 60;
                        return 0;
                }
                /* h == 24: the next day */
                h = 0;
                days++;
                if (++d > days_in_month(y, m)) {
                        d = 1;
                        if (++m == 13) {
                                m = 1;
                                y++;
                        }
                }
        }
}

int cron_next(const struct cron_expr *e, const struct cron_tz *tz, int64_t after, int64_t *next)
{
        if (!e || !next)
                return -EINVAL;
        if (!in_range(after))
                return -ERANGE;
        /* nothing after the end of the supported range */
        const int64_t limit = after > CRON_TIME_MAX - SEARCH_SPAN ? CRON_TIME_MAX
                                                                   : after + SEARCH_SPAN;

        /* Walk the UTC timeline segment by segment; within a segment the
         * offset is constant, so local time is monotonic in UTC there. */
        int64_t t = after + 1;
        for (;;) {
                int32_t o = utc_offset(tz, t);
                int64_t seg_end = next_transition(tz, t);
                if (seg_end > limit + 1)
                        seg_end = limit + 1;
                int64_t lo = t + o, hi = seg_end + o, l;
                while (naive_next(e, lo, hi, &l) == 0) {
                        int64_t u = l - o, cand[CRON_TZ_MAX_CANDIDATES];
                        /* A repeated local time fires only at its first
                         * occurrence; an earlier occurrence would lie in an
                         * earlier segment, hence at or before `after`. */
                        size_t nc = tz ? local_to_utc(tz, l, cand) : 0;
                        if (nc == 0 || cand[0] >= u) {
                                *next = u;
                                return 0;
                        }
                        lo = l + 60;
                }
                if (seg_end > limit)
                        return -ENOENT;
                t = seg_end;
        }
}
