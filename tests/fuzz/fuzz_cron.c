/* SPDX-License-Identifier: MIT */
/* Fuzz target for the cron parser and the next-occurrence search.
 *
 * Input: the expression, optionally followed by a NUL byte, one byte that
 * selects a time zone and a decimal Unix time `after` (e.g.
 * "0 2 * * *\0\x01" "1774742400").  Without the tail every zone is tried
 * from two instants around DST changes.  An input starting with "TZif" is a
 * zone file instead: it is loaded with cron_tz_load (through a private
 * TZDIR) and, if accepted, a few expressions are checked in it as below, and
 * its offsets and local-to-UTC mapping are checked for consistency.
 *
 * Invariants (any violation aborts):
 *   - the domain: for an instant outside [CRON_TIME_MIN, CRON_TIME_MAX]
 *     (years 1970-9999) cron_next, cron_tz_utc_offset and cron_tz_localtime
 *     answer -ERANGE and write nothing, cron_tz_local_to_utc too beyond
 *     CRON_LOCAL_SLACK; inside it, the invariants below, and no answer lies
 *     outside it;
 *   - parsing gives 0 or -EINVAL; an error has a message (NUL-terminated,
 *     truncated cleanly to any errlen) and leaves *out untouched; a parsed
 *     expression has no bit outside its field's range and "restricted" flags
 *     that say whether a day field is the full range;
 *   - the parse ignores letter case and the kind of blank, and the
 *     expression written back as plain lists of numbers parses to the same;
 *   - cron_next: next > after; its local time in the zone is on a minute,
 *     matches the expression and is the first occurrence of that local time;
 *     no minute in (after, next) (checked up to a bound) matches except a
 *     repeat of a local time seen earlier; from any instant in [after, next)
 *     the answer is the same next; -ENOENT only for an expression no date can
 *     match (in UTC); it terminates (libFuzzer's -timeout catches a loop). */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kairos/cron.h"
#include "kairos/kbuf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                           \
        do {                                                                                  \
                if (!(cond)) {                                                                \
                        fprintf(stderr, "fuzz_cron: invariant violated: %s (line %d)\n",      \
                                #cond, __LINE__);                                             \
                        abort();                                                              \
                }                                                                             \
        } while (0)

#define DAYS_ALL UINT32_C(0xFFFFFFFE)

static const char *const zone_names[] = {
        NULL /* built-in UTC */, "Europe/Berlin", "America/New_York", "Australia/Lord_Howe",
        "Asia/Kathmandu", "Pacific/Apia", "Europe/Dublin", "America/Sao_Paulo",
        "Africa/Casablanca", "Europe/Amsterdam", "America/St_Johns",
};
#define NZONES (sizeof(zone_names) / sizeof(zone_names[0]))
static struct cron_tz *zones[NZONES];
static bool zone_ok[NZONES];

/* A private TZDIR for the zone files under test. */
static char tzdir[] = "/tmp/kairos-fuzz-cron-XXXXXX";
static char tzfile[sizeof(tzdir) + 16];

static char tzsub[sizeof(tzdir) + 4];

static void remove_tzdir(void)
{
        unlink(tzfile);
        rmdir(tzsub);
        rmdir(tzdir);
}

static void load_zones(void)
{
        static bool loaded;
        if (loaded)
                return;
        loaded = true;
        zone_ok[0] = true;
        for (size_t i = 1; i < NZONES; i++) {
                int r = cron_tz_load(zone_names[i], &zones[i]);
                /* a system without tzdata: those zones are skipped */
                CHECK(r == 0 || r == -ENOENT);
                zone_ok[i] = r == 0;
        }
        /* the system zones are loaded: from now on TZDIR is ours */
        CHECK(mkdtemp(tzdir));
        snprintf(tzsub, sizeof(tzsub), "%s/Fz", tzdir);
        snprintf(tzfile, sizeof(tzfile), "%s/Zone", tzsub);
        CHECK(mkdir(tzsub, 0700) == 0);
        CHECK(setenv("TZDIR", tzdir, 1) == 0);
        atexit(remove_tzdir);
}

static bool is_blank(char c)
{
        return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static void check_expr(const struct cron_expr *e)
{
        CHECK((e->minutes >> 60) == 0 && e->minutes);
        CHECK((e->hours >> 24) == 0 && e->hours);
        CHECK((e->days & 1) == 0 && e->days);
        CHECK((e->months & ~UINT16_C(0x1FFE)) == 0 && e->months);
        CHECK((e->weekdays & 0x80) == 0 && e->weekdays);
        CHECK(e->dom_restricted == (e->days != DAYS_ALL));
        CHECK(e->dow_restricted == (e->weekdays != 0x7F));
}

static bool same_expr(const struct cron_expr *a, const struct cron_expr *b)
{
        return a->minutes == b->minutes && a->hours == b->hours && a->days == b->days &&
               a->months == b->months && a->weekdays == b->weekdays &&
               a->dom_restricted == b->dom_restricted && a->dow_restricted == b->dow_restricted;
}

static int parse_check(const char *text, struct cron_expr *out)
{
        char err[256], small[6];
        struct cron_expr e, sentinel;
        memset(&sentinel, 0xa5, sizeof(sentinel));
        e = sentinel;
        memset(err, 'x', sizeof(err));
        int r = cron_parse(text, &e, err, sizeof(err));
        CHECK(r == 0 || r == -EINVAL);
        CHECK(memchr(err, '\0', sizeof(err)));
        if (r < 0) {
                CHECK(err[0] != '\0');
                CHECK(memcmp(&e, &sentinel, sizeof(e)) == 0);
        } else {
                CHECK(err[0] == '\0');
                check_expr(&e);
        }
        struct cron_expr e2 = sentinel;
        memset(small, 'x', sizeof(small));
        CHECK(cron_parse(text, &e2, small, sizeof(small)) == r);
        CHECK(memchr(small, '\0', sizeof(small)) && strncmp(small, err, strlen(small)) == 0);
        CHECK(strlen(small) == (strlen(err) < sizeof(small) ? strlen(err) : sizeof(small) - 1));
        CHECK(memcmp(&e, &e2, sizeof(e)) == 0);
        e2 = sentinel;
        CHECK(cron_parse(text, &e2, NULL, 0) == r);
        CHECK(memcmp(&e, &e2, sizeof(e)) == 0);
        *out = e;
        return r;
}

/* Upper case, every blank a space: the same result. */
static void check_variants(const char *text, int r, const struct cron_expr *e)
{
        size_t n = strlen(text);
        char *v = malloc(n + 1);
        CHECK(v);
        for (size_t i = 0; i <= n; i++) {
                char c = text[i];
                v[i] = c >= 'a' && c <= 'z' ? (char)(c - 'a' + 'A') : is_blank(c) ? ' ' : c;
        }
        struct cron_expr e2;
        CHECK(cron_parse(v, &e2, NULL, 0) == r);
        if (r == 0)
                CHECK(same_expr(e, &e2));
        free(v);
}

static int put_field(struct kbuf *b, uint64_t mask, int lo, int hi, bool last)
{
        bool first = true;
        for (int i = lo; i <= hi; i++) {
                if (!((mask >> i) & 1))
                        continue;
                if (kbuf_printf(b, "%s%d", first ? "" : ",", i) < 0)
                        return -ENOMEM;
                first = false;
        }
        return kbuf_puts(b, last ? "" : " ");
}

/* Written back as lists of numbers, it parses to the same expression. */
static void check_rewrite(const struct cron_expr *e)
{
        struct kbuf b = KBUF_INIT;
        if (put_field(&b, e->minutes, 0, 59, false) == 0 &&
            put_field(&b, e->hours, 0, 23, false) == 0 &&
            put_field(&b, e->days, 1, 31, false) == 0 &&
            put_field(&b, e->months, 1, 12, false) == 0 &&
            put_field(&b, e->weekdays, 0, 6, true) == 0) {
                struct cron_expr e2;
                char err[256];
                int r = cron_parse(b.data, &e2, err, sizeof(err));
                if (r != 0)
                        fprintf(stderr, "rewrite '%s': %s\n", b.data, err);
                CHECK(r == 0 && same_expr(e, &e2));
        }
        kbuf_free(&b);
}

/* Can any date match (some year)?  Only then may UTC say -ENOENT not. */
static bool some_date_matches(const struct cron_expr *e)
{
        static const unsigned mdays[13] = { 0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
        if (e->dow_restricted)
                return true; /* every month has every weekday */
        for (unsigned m = 1; m <= 12; m++) {
                if (!((e->months >> m) & 1))
                        continue;
                for (unsigned d = 1; d <= mdays[m]; d++)
                        if ((e->days >> d) & 1)
                                return true;
        }
        return false;
}

static bool in_range(int64_t t)
{
        return t >= CRON_TIME_MIN && t <= CRON_TIME_MAX;
}

/* The offset at an instant in range. */
static int32_t off_at(const struct cron_tz *tz, int64_t t)
{
        int32_t o = INT32_MIN;
        CHECK(cron_tz_utc_offset(tz, t, &o) == 0);
        return o;
}

/* The instants showing a local time, ascending, within a day or so of it. */
static size_t to_utc(const struct cron_tz *tz, int64_t local, int64_t cand[CRON_TZ_MAX_CANDIDATES])
{
        size_t nc = 99;
        CHECK(cron_tz_local_to_utc(tz, local, cand, &nc) == 0);
        CHECK(nc <= CRON_TZ_MAX_CANDIDATES);
        for (size_t i = 0; i < nc; i++)
                CHECK(cand[i] - local <= 100000 && local - cand[i] <= 100000 &&
                      (i == 0 || cand[i] > cand[i - 1]));
        return nc;
}

/* Every time function answers -ERANGE for an instant outside the range. */
static void check_out_of_range(const struct cron_expr *e, const struct cron_tz *tz, int64_t t)
{
        int32_t o = 7;
        int64_t next = 7, cand[CRON_TZ_MAX_CANDIDATES];
        size_t nc = 7;
        struct tm tm;
        CHECK(cron_tz_utc_offset(tz, t, &o) == -ERANGE && o == 7);
        CHECK(cron_tz_localtime(tz, t, &tm) == -ERANGE);
        CHECK(cron_next(e, tz, t, &next) == -ERANGE && next == 7);
        int r = cron_tz_local_to_utc(tz, t, cand, &nc);
        if (t < CRON_TIME_MIN - CRON_LOCAL_SLACK || t > CRON_TIME_MAX + CRON_LOCAL_SLACK)
                CHECK(r == -ERANGE && nc == 7);
        else
                CHECK(r == 0 && nc <= CRON_TZ_MAX_CANDIDATES);
}

static bool local_matches(const struct cron_expr *e, const struct cron_tz *tz, int64_t t,
                          bool *on_minute)
{
        struct tm tm;
        CHECK(cron_tz_localtime(tz, t, &tm) == 0);
        *on_minute = tm.tm_sec == 0;
        return cron_matches(e, tm.tm_min, tm.tm_hour, tm.tm_mday, tm.tm_mon + 1, tm.tm_wday);
}

/* t fires: on a local minute, matching, the first occurrence of its local time. */
static void check_fires(const struct cron_expr *e, const struct cron_tz *tz, int64_t t)
{
        bool on_minute;
        CHECK(local_matches(e, tz, t, &on_minute));
        CHECK(on_minute);
        int64_t cand[CRON_TZ_MAX_CANDIDATES];
        size_t nc = to_utc(tz, t + off_at(tz, t), cand);
        CHECK(nc >= 1 && cand[0] == t);
}

/* Every local minute in (after, min(next, after + span)) that matches must be
 * a repeat of an earlier occurrence of the same local time. */
static void check_none_between(const struct cron_expr *e, const struct cron_tz *tz,
                               int64_t after, int64_t next, int64_t span)
{
        int64_t end = next - after > span ? after + span : next;
        int64_t t = after + 1;
        while (t < end) {
                int32_t o = off_at(tz, t);
                int64_t l = t + o;
                int64_t lm = l % 60 == 0 ? l : l - ((l % 60) + 60) % 60 + 60;
                int64_t u = lm - o;
                if (u > CRON_TIME_MAX)
                        break; /* (end is at most CRON_TIME_MAX) */
                if (off_at(tz, u) != o) {
                        t++; /* a transition in (t, u]: step over it */
                        continue;
                }
                if (u >= end)
                        break;
                bool on_minute;
                if (local_matches(e, tz, u, &on_minute)) {
                        CHECK(on_minute);
                        int64_t cand[CRON_TZ_MAX_CANDIDATES];
                        size_t nc = to_utc(tz, lm, cand);
                        CHECK(nc >= 2 && cand[0] < u);
                }
                t = u + 1;
        }
}

static void check_next(const struct cron_expr *e, size_t zi, int64_t after, int64_t span)
{
        const struct cron_tz *tz = zones[zi];
        int64_t next = 0;
        int r = cron_next(e, tz, after, &next);
        if (!in_range(after)) {
                CHECK(r == -ERANGE);
                check_out_of_range(e, tz, after);
                return;
        }
        if (r == -ENOENT) {
                /* never, or not before the end of the range */
                if (zi == 0 && after < CRON_TIME_MAX - 8 * 366 * 86400)
                        CHECK(!some_date_matches(e));
                if (CRON_TIME_MAX - after <= span)
                        check_none_between(e, tz, after, CRON_TIME_MAX + 1, span);
                return;
        }
        CHECK(r == 0);
        CHECK(next > after && next <= CRON_TIME_MAX);
        check_fires(e, tz, next);
        check_none_between(e, tz, after, next, span);

        /* the same answer from any instant in [after, next) */
        int64_t mid = after + (next - after) / 2, n2;
        CHECK(cron_next(e, tz, mid, &n2) == 0 && n2 == next);
        CHECK(cron_next(e, tz, next - 1, &n2) == 0 && n2 == next);

        /* and the one after it */
        r = cron_next(e, tz, next, &n2);
        if (r == 0) {
                CHECK(n2 > next && n2 <= CRON_TIME_MAX);
                check_fires(e, tz, n2);
        } else {
                CHECK(r == -ENOENT);
        }
}

/* The zone's own consistency: offsets in range, and every local time maps
 * to the instants that show it. */
static void check_zone_mapping(const struct cron_tz *tz, int64_t t)
{
        if (!in_range(t)) {
                struct cron_expr e;
                CHECK(cron_parse("* * * * *", &e, NULL, 0) == 0);
                check_out_of_range(&e, tz, t);
                return;
        }
        int32_t o = off_at(tz, t);
        CHECK(o >= -100000 && o <= 100000);
        int64_t cand[CRON_TZ_MAX_CANDIDATES];
        size_t nc = to_utc(tz, t + o, cand);
        bool found = false;
        for (size_t i = 0; i < nc; i++) {
                if (in_range(cand[i]))
                        CHECK(cand[i] + off_at(tz, cand[i]) == t + o);
                found = found || cand[i] == t;
        }
        CHECK(found);
}

static void fuzz_zone_file(const uint8_t *data, size_t size)
{
        int fd = open(tzfile, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        CHECK(fd >= 0);
        CHECK(write(fd, data, size) == (ssize_t)size);
        CHECK(close(fd) == 0);

        struct cron_tz *tz = NULL;
        int r = cron_tz_load("Fz/Zone", &tz);
        CHECK(r == 0 || r == -EBADMSG || r == -ENOENT || r == -ENOMEM);
        if (r < 0) {
                CHECK(!tz);
                return;
        }
        CHECK(tz && strcmp(cron_tz_name(tz), "Fz/Zone") == 0);

        static const char *const exprs[] = { "* * * * *", "30 2 * * *", "0 0 29 2 *",
                                             "*/7 1,13 * * SUN" };
        static const int64_t afters[] = { -2147483648LL, 0, 1774742400, 1793509200,
                                          4102444800LL, CRON_TIME_MAX - 3 * 86400 };
        size_t slot = NZONES - 1;
        struct cron_tz *saved = zones[slot];
        bool saved_ok = zone_ok[slot];
        zones[slot] = tz;
        zone_ok[slot] = true;
        for (size_t k = 0; k < sizeof(afters) / sizeof(afters[0]); k++) {
                for (int64_t d = 0; d < 4 * 86400; d += 3 * 3600 + 61)
                        check_zone_mapping(tz, afters[k] + d);
                for (size_t i = 0; i < sizeof(exprs) / sizeof(exprs[0]); i++) {
                        struct cron_expr e;
                        CHECK(cron_parse(exprs[i], &e, NULL, 0) == 0);
                        check_next(&e, slot, afters[k], 3 * 3600);
                }
        }
        zones[slot] = saved;
        zone_ok[slot] = saved_ok;
        cron_tz_free(tz);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        load_zones();
        if (size >= 4 && memcmp(data, "TZif", 4) == 0) {
                fuzz_zone_file(data, size);
                return 0;
        }

        /* the expression: up to the first NUL */
        const uint8_t *nul = memchr(data ? data : (const uint8_t *)"", '\0', size);
        size_t elen = nul ? (size_t)(nul - data) : size;
        char *text = malloc(elen + 1);
        CHECK(text);
        if (elen)
                memcpy(text, data, elen);
        text[elen] = '\0';

        struct cron_expr e;
        int r = parse_check(text, &e);
        check_variants(text, r, &e);
        if (r < 0) {
                free(text);
                return 0;
        }
        check_rewrite(&e);
        CHECK(!cron_matches(&e, 60, 0, 1, 1, 0) && !cron_matches(&e, 0, 24, 1, 1, 0));
        CHECK(!cron_matches(&e, 0, 0, 0, 1, 0) && !cron_matches(&e, 0, 0, 1, 13, 0));
        CHECK(!cron_matches(NULL, 0, 0, 1, 1, 0));

        if (nul && size - elen >= 2) {
                /* one zone, one instant, a long check */
                size_t zi = data[elen + 1] % NZONES;
                size_t tl = size - elen - 2;
                char num[32];
                if (tl >= sizeof(num))
                        tl = sizeof(num) - 1;
                memcpy(num, data + elen + 2, tl);
                num[tl] = '\0';
                char *end;
                errno = 0;
                long long after = strtoll(num, &end, 10);
                if (zone_ok[zi] && end != num && errno == 0)
                        check_next(&e, zi, (int64_t)after, 2 * 86400);
        } else {
                /* every zone, around two DST changes (Europe, US), briefly */
                static const int64_t afters[] = { 1774742400, 1793509200 };
                for (size_t zi = 0; zi < NZONES; zi++) {
                        if (!zone_ok[zi])
                                continue;
                        for (size_t k = 0; k < 2; k++)
                                check_next(&e, zi, afters[k], 3 * 3600);
                }
        }
        free(text);
        return 0;
}
