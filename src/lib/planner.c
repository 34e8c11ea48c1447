/* SPDX-License-Identifier: MIT */
/* planner: five OODA steps per cycle (docs/design.md §3, §5). */
#include "kairos/planner.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "kairos/kbuf.h"
#include "kairos/kjson.h"
#include "kairos/kmem.h"

static const char *const phase_names[PLANNER_PHASES] = {
        [PHASE_OBSERVE] = "observe", [PHASE_ORIENT] = "orient", [PHASE_DECIDE] = "decide",
        [PHASE_ACT] = "act",         [PHASE_REFLECT] = "reflect",
};

const char *planner_phase_name(enum planner_phase p)
{
        return ENUM_NAME(phase_names, p, NULL);
}

int planner_parse_step_id(const char *step_id, enum planner_phase *phase, int *cycle)
{
        if (!step_id)
                return -EINVAL;
        const char *us = strrchr(step_id, '_');
        if (!us)
                return -EINVAL;
        size_t plen = (size_t)(us - step_id);
        const char *d = us + 1;
        /* exactly three digits, cycle 1..999 */
        if (strlen(d) != 3)
                return -EINVAL;
        int c = 0;
        for (int i = 0; i < 3; i++) {
                if (d[i] < '0' || d[i] > '9')
                        return -EINVAL;
                c = c * 10 + (d[i] - '0');
        }
        if (c < 1 || c > PLANNER_MAX_CYCLE)
                return -EINVAL;
        for (int p = 0; p < PLANNER_PHASES; p++) {
                if (strlen(phase_names[p]) == plen && memcmp(phase_names[p], step_id, plen) == 0) {
                        if (phase)
                                *phase = (enum planner_phase)p;
                        if (cycle)
                                *cycle = c;
                        return 0;
                }
        }
        return -EINVAL;
}

static bool valid_args(const char *name, const char *fired_at)
{
        return name && *name && fired_at && *fired_at;
}

int planner_retry_plan_id(const char *name, const char *fired_at, int retry, int cycle,
                          char out[PLANNER_ID_MAX])
{
        static const char hex[] = "0123456789abcdef";
        unsigned char h[crypto_hash_sha256_BYTES];
        struct kbuf b = KBUF_INIT;
        int r;

        if (!valid_args(name, fired_at) || cycle < 1 || cycle > PLANNER_MAX_CYCLE || retry < 0 ||
            retry > PLANNER_MAX_RETRY)
                return -EINVAL;
        r = kbuf_printf(&b, "%s|%s", name, fired_at);
        if (r == 0 && retry > 0)
                r = kbuf_printf(&b, "|retry:%d", retry);
        if (r == 0 && cycle > 1)
                r = kbuf_printf(&b, "|%d", cycle);
        if (r < 0) {
                kbuf_free(&b);
                return r;
        }
        crypto_hash_sha256(h, (const unsigned char *)b.data, b.len);
        kbuf_free(&b);
        memcpy(out, "plan_", 5);
        for (int i = 0; i < 6; i++) {
                out[5 + 2 * i] = hex[h[i] >> 4];
                out[5 + 2 * i + 1] = hex[h[i] & 15];
        }
        out[17] = '\0';
        return 0;
}

int planner_plan_id(const char *name, const char *fired_at, int cycle, char out[PLANNER_ID_MAX])
{
        return planner_retry_plan_id(name, fired_at, 0, cycle, out);
}

int planner_retry_mandate_id(const char *name, const char *fired_at, int retry,
                             char out[PLANNER_ID_MAX])
{
        char pid[PLANNER_ID_MAX];
        int r = planner_retry_plan_id(name, fired_at, retry, 1, pid);
        if (r < 0)
                return r;
        memcpy(out, "mnd_", 4);
        memcpy(out + 4, pid, strlen(pid) + 1);      /* 4 + 17 + 1 <= PLANNER_ID_MAX */
        return 0;
}

int planner_mandate_id(const char *name, const char *fired_at, char out[PLANNER_ID_MAX])
{
        return planner_retry_mandate_id(name, fired_at, 0, out);
}

/* Canonical hash of a small object built as JSON text: compact as it is
 * made (kbuf_json_string), hashed in one pass without a tree (15 per plan);
 * parsed only if that pass gives up. */
static int hash_text(struct kbuf *b, char out[CANON_HASH_STRLEN])
{
        if (canon_hash_compact(b->data, b->len, KJSON_MAX_DEPTH - 1, out) == 0)
                return 0;
        return canon_hash_json(b->data, b->len, out, NULL);
}

static int params_hash(const char *phase, int order, int cycle, const char *plan_id,
                       const char *name, char out[CANON_HASH_STRLEN])
{
        struct kbuf b = KBUF_INIT;
        int r;

        if ((r = kbuf_puts(&b, "{\"phase\":")) < 0 ||
            (r = kbuf_json_string(&b, phase, strlen(phase))) < 0 ||
            (r = kbuf_printf(&b, ",\"order\":%d,\"cycle\":%d,\"plan_id\":", order, cycle)) < 0 ||
            (r = kbuf_json_string(&b, plan_id, strlen(plan_id))) < 0 ||
            (r = kbuf_puts(&b, ",\"mandate_name\":")) < 0 ||
            (r = kbuf_json_string(&b, name, strlen(name))) < 0 ||
            (r = kbuf_putc(&b, '}')) < 0)
                goto out;
        r = hash_text(&b, out);
out:
        kbuf_free(&b);
        return r;
}

static int marker_hash(const char *phase, int cycle, const char *state,
                       char out[CANON_HASH_STRLEN])
{
        struct kbuf b = KBUF_INIT;
        int r = kbuf_printf(&b, "{\"phase\":\"%s\",\"cycle\":%d,\"state\":\"%s\"}", phase, cycle,
                            state);
        if (r == 0)
                r = hash_text(&b, out);
        kbuf_free(&b);
        return r;
}

int planner_build(const char *name, const char *fired_at, int cycle, struct planner_plan *out)
{
        return planner_build_retry(name, fired_at, 0, cycle, out);
}

int planner_build_retry(const char *name, const char *fired_at, int retry, int cycle,
                        struct planner_plan *out)
{
        int r;

        if (!out || !valid_args(name, fired_at) || cycle < 1 || cycle > PLANNER_MAX_CYCLE)
                return -EINVAL;
        /* names become JSON strings: they must be valid UTF-8 */
        if (!utf8_valid(name, strlen(name)))
                return -EINVAL;
        memset(out, 0, sizeof(*out));
        if ((r = planner_retry_plan_id(name, fired_at, retry, cycle, out->plan_id)) < 0 ||
            (r = planner_retry_mandate_id(name, fired_at, retry, out->mandate_id)) < 0)
                return r;
        out->cycle = cycle;
        for (int i = 0; i < PLANNER_PHASES; i++) {
                struct planner_step *s = &out->steps[i];
                const char *ph = phase_names[i];
                snprintf(s->step_id, sizeof(s->step_id), "%s_%03d", ph, cycle);
                snprintf(s->tool, sizeof(s->tool), "ooda.%s", ph);
                if ((r = params_hash(ph, i, cycle, out->plan_id, name, s->params_hash)) < 0 ||
                    (r = marker_hash(ph, cycle, "pre", s->pre_hash)) < 0 ||
                    (r = marker_hash(ph, cycle, "post", s->expected_post_hash)) < 0)
                        return r;
        }
        struct kbuf b = KBUF_INIT;
        r = planner_steps_json(out, &b);
        if (r == 0)
                canon_hash_bytes(b.data, b.len, out->plan_hash);
        kbuf_free(&b);
        return r;
}

static int put_field(struct kbuf *b, const char *key, const char *val, size_t max, bool last)
{
        int r;
        if ((r = kbuf_json_string(b, key, strlen(key))) < 0 || (r = kbuf_putc(b, ':')) < 0 ||
            (r = kbuf_json_string(b, val, strnlen(val, max))) < 0)
                return r;
        return last ? 0 : kbuf_putc(b, ',');
}

int planner_steps_json(const struct planner_plan *p, struct kbuf *out)
{
        size_t start = out->len;
        int r = kbuf_putc(out, '[');

        /* keys in canonical (bytewise) order, so these bytes are what
         * plan_hash hashes */
#define FIELD(f, last) put_field(out, #f, s->f, sizeof(s->f), last)
        for (int i = 0; r == 0 && i < PLANNER_PHASES; i++) {
                const struct planner_step *s = &p->steps[i];
                if ((i && (r = kbuf_putc(out, ',')) < 0) || (r = kbuf_putc(out, '{')) < 0 ||
                    (r = FIELD(expected_post_hash, false)) < 0 ||
                    (r = FIELD(params_hash, false)) < 0 ||
                    (r = FIELD(pre_hash, false)) < 0 ||
                    (r = FIELD(step_id, false)) < 0 ||
                    (r = FIELD(tool, true)) < 0 ||
                    (r = kbuf_putc(out, '}')) < 0)
                        break;
        }
#undef FIELD
        if (r == 0)
                r = kbuf_putc(out, ']');
        if (r < 0)
                kbuf_truncate(out, start);
        return r;
}

bool planner_valid_name(const char *name)
{
        size_t n = strlen(name);
        if (n < 1 || n > 64)
                return false;
        for (size_t i = 0; i < n; i++) {
                char c = name[i];
                if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                      c == '_' || c == '-'))
                        return false;
        }
        return true;
}

static bool parse_digits(const char *s, size_t n, int *out)
{
        int v = 0;
        for (size_t i = 0; i < n; i++) {
                if (s[i] < '0' || s[i] > '9')
                        return false;
                v = v * 10 + (s[i] - '0');
        }
        *out = v;
        return true;
}

/* Days since 1970-01-01 of a civil date (proleptic Gregorian). */
static int64_t days_from_civil(int64_t y, int m, int d)
{
        y -= m <= 2;
        int64_t era = (y >= 0 ? y : y - 399) / 400;
        int64_t yoe = y - era * 400;
        int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
        int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        return era * 146097 + doe - 719468;
}

int planner_parse_fired_at(const char *s, int64_t *unix_seconds)
{
        static const int mdays[] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
        int y, mo, d, h, mi, se;
        if (strlen(s) != 20 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' ||
            s[16] != ':' || s[19] != 'Z')
                return -EINVAL;
        if (!parse_digits(s, 4, &y) || !parse_digits(s + 5, 2, &mo) ||
            !parse_digits(s + 8, 2, &d) || !parse_digits(s + 11, 2, &h) ||
            !parse_digits(s + 14, 2, &mi) || !parse_digits(s + 17, 2, &se))
                return -EINVAL;
        if (y < 1970 || mo < 1 || mo > 12 || d < 1 || h > 23 || mi > 59 || se > 59)
                return -EINVAL;
        int dim = mdays[mo - 1];
        if (mo == 2 && ((y % 4 == 0 && y % 100 != 0) || y % 400 == 0))
                dim = 29;
        if (d > dim)
                return -EINVAL;
        if (unix_seconds)
                *unix_seconds = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + se;
        return 0;
}

int planner_format_fired_at(int64_t t, char out[PLANNER_FIRED_AT_LEN])
{
        if (t < 0)
                return -EINVAL;
        struct tm tm;
        time_t tt = (time_t)t;
        if (!gmtime_r(&tt, &tm) || tm.tm_year + 1900 > 9999)
                return -EINVAL;
        /* every field is in range after gmtime_r: the text is exactly 20 bytes */
        strftime(out, PLANNER_FIRED_AT_LEN, "%Y-%m-%dT%H:%M:%SZ", &tm);
        return 0;
}

int planner_retry_check(const struct planner_tick_mandate *v, size_t n, bool has_reason,
                        enum planner_retry_verdict *ret_verdict, size_t *ret_which)
{
        size_t unfinished = n, done = n;
        if ((n && !v) || !ret_verdict || !ret_which)
                return -EINVAL;
        for (size_t i = 0; i < n; i++) {
                switch (v[i].state) {
                case PLANNER_TICK_UNFINISHED:
                        if (unfinished == n || v[i].retry > v[unfinished].retry)
                                unfinished = i;
                        break;
                case PLANNER_TICK_DONE:
                        if (done == n || v[i].retry > v[done].retry)
                                done = i;
                        break;
                case PLANNER_TICK_ENDED:
                        break;
                default:
                        return -EINVAL;
                }
        }
        if (unfinished < n) {
                *ret_verdict = PLANNER_RETRY_UNFINISHED;
                *ret_which = unfinished;
        } else if (done < n && !has_reason) {
                *ret_verdict = PLANNER_RETRY_NEEDS_REASON;
                *ret_which = done;
        } else {
                *ret_verdict = PLANNER_RETRY_ALLOWED;
                *ret_which = n;
        }
        return 0;
}
