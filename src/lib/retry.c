/* SPDX-License-Identifier: MIT */
/* retry: the step retry policy (see kairos/retry.h). */
#include "kairos/retry.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void retry_policy_init(struct retry_policy *p)
{
        *p = (struct retry_policy){ .attempts = 0, .first_ms = 1000, .factor_pct = 200,
                                    .max_ms = 60000, .jitter_pct = 0, .on = RETRY_ON_FAILURE };
}

void retry_policy_inherit(struct retry_policy *ph, const struct retry_policy *s)
{
        if (!ph->set_attempts)
                ph->attempts = s->attempts;
        if (!ph->set_backoff) {
                ph->first_ms = s->first_ms;
                ph->factor_pct = s->factor_pct;
                ph->max_ms = s->max_ms;
                ph->jitter_pct = s->jitter_pct;
        }
        if (!ph->set_on) {
                ph->on = s->on;
                memcpy(ph->exit_codes, s->exit_codes, sizeof ph->exit_codes);
        }
}

/* "12", "0.3", "1.25" → thousandths; at most 3 decimals. */
static int parse_milli(const char *s, size_t n, uint64_t max, uint64_t *ret)
{
        uint64_t v = 0;
        size_t i = 0, dec = 0;
        bool dot = false, digit = false;
        for (; i < n; i++) {
                char c = s[i];
                if (c == '.' && !dot) {
                        dot = true;
                        continue;
                }
                if (c < '0' || c > '9')
                        return -EINVAL;
                digit = true;
                if (dot && ++dec > 3)
                        return -EINVAL;
                v = v * 10 + (uint64_t)(c - '0');
                if (v > max * 1000)
                        return -ERANGE;
        }
        if (!digit)
                return -EINVAL;
        for (; dec < 3; dec++)
                v *= 10;
        if (v > max)
                return -ERANGE;
        *ret = v;
        return 0;
}

/* The next word of a space-separated value: false at its end. */
static bool next_word(const char **s, size_t *ret_len)
{
        while (**s == ' ' || **s == '\t')
                (*s)++;
        if (!**s)
                return false;
        *ret_len = strcspn(*s, " \t");
        return true;
}

int retry_parse_backoff(const char *v, struct retry_policy *p, const char **why)
{
        struct retry_policy q = *p;
        bool first = true;
        const char *s = v;
        *why = NULL;
        q.factor_pct = 200;
        q.max_ms = 60000;
        q.jitter_pct = 0;
        bool max_given = false;
        for (size_t n; next_word(&s, &n); s += n) {
                uint64_t x;
                int r;
                if (first) {
                        r = parse_milli(s, n, RETRY_BACKOFF_MAX_MS, &x);
                        if (r < 0) {
                                *why = r == -ERANGE ? "the first wait is over 24 h"
                                                    : "the first wait must be seconds such "
                                                      "as 2 or 0.3 (at most 3 decimals)";
                                return -EINVAL;
                        }
                        q.first_ms = x;
                        first = false;
                } else if (n > 7 && strncmp(s, "factor=", 7) == 0) {
                        r = parse_milli(s + 7, n - 7, 100000, &x);
                        if (r < 0 || x < 1000 || x > 100000) {
                                *why = "factor= must be a number from 1 to 100 (such as 2 "
                                       "or 1.5)";
                                return -EINVAL;
                        }
                        q.factor_pct = (unsigned)(x / 10);
                } else if (n > 4 && strncmp(s, "max=", 4) == 0) {
                        r = parse_milli(s + 4, n - 4, RETRY_BACKOFF_MAX_MS, &x);
                        if (r < 0) {
                                *why = r == -ERANGE ? "max= is over 24 h"
                                                    : "max= must be seconds such as 60";
                                return -EINVAL;
                        }
                        q.max_ms = x;
                        max_given = true;
                } else if (n > 7 && strncmp(s, "jitter=", 7) == 0 && s[n - 1] == '%') {
                        r = parse_milli(s + 7, n - 8, 100000, &x);
                        if (r < 0 || x % 1000 || x > 100000) {
                                *why = "jitter= must be a whole percentage from 0% to 100%";
                                return -EINVAL;
                        }
                        q.jitter_pct = (unsigned)(x / 1000);
                } else {
                        *why = "expected FIRST [factor=F] [max=SEC] [jitter=P%]";
                        return -EINVAL;
                }
        }
        if (first) {
                *why = "the first wait is missing";
                return -EINVAL;
        }
        if (!max_given && q.max_ms < q.first_ms)
                q.max_ms = q.first_ms;
        if (q.max_ms < q.first_ms) {
                *why = "max= is less than the first wait";
                return -EINVAL;
        }
        q.set_backoff = true;
        *p = q;
        return 0;
}

static const struct {
        const char *name;
        unsigned bits;
} on_words[] = {
        { "failure", RETRY_ON_FAILURE },
        { "exit_status", RETRY_ON_EXIT_STATUS },
        { "signal", RETRY_ON_SIGNAL },
        { "oom", RETRY_ON_OOM },
        { "spawn_error", RETRY_ON_SPAWN_ERROR },
        { "output_too_large", RETRY_ON_OUTPUT_TOO_LARGE },
        { "timeout", RETRY_ON_TIMEOUT },
};

int retry_parse_on(const char *v, struct retry_policy *p, char *why, unsigned len)
{
        unsigned on = 0;
        uint64_t codes[4] = { 0 };
        bool any = false;
        const char *s = v;
        for (size_t n; next_word(&s, &n); s += n) {
                bool ok = false;
                for (size_t i = 0; i < sizeof on_words / sizeof on_words[0]; i++)
                        if (strlen(on_words[i].name) == n && strncmp(s, on_words[i].name, n) == 0) {
                                on |= on_words[i].bits;
                                ok = true;
                        }
                if (!ok && n <= 3 && s[0] >= '1' && s[0] <= '9') {
                        unsigned c = 0;
                        ok = true;
                        for (size_t i = 0; i < n; i++) {
                                if (s[i] < '0' || s[i] > '9')
                                        ok = false;
                                c = c * 10 + (unsigned)(s[i] - '0');
                        }
                        if (ok && c <= 255) {
                                codes[c / 64] |= 1ull << (c % 64);
                                on |= RETRY_ON_EXIT_STATUS;
                        } else {
                                ok = false;
                        }
                }
                if (!ok) {
                        snprintf(why, len, "%.*s", (int)(n > 64 ? 64 : n), s);
                        return -EINVAL;
                }
                any = true;
        }
        if (!any) {
                snprintf(why, len, "%s", "");
                return -EINVAL;
        }
        p->on = on;
        memcpy(p->exit_codes, codes, sizeof codes);
        p->set_on = true;
        return 0;
}

bool retry_matches(const struct retry_policy *p, const char *cls, const char *msg)
{
        if (!p || !cls || p->attempts == 0)
                return false;
        for (size_t i = 0; i < sizeof on_words / sizeof on_words[0]; i++) {
                if (strcmp(on_words[i].name, cls) != 0 || i == 0)
                        continue;
                if (!(p->on & on_words[i].bits))
                        return false;
                if (on_words[i].bits != RETRY_ON_EXIT_STATUS)
                        return true;
                bool some = false;
                for (int k = 0; k < 4; k++)
                        some |= p->exit_codes[k] != 0;
                if (!some)
                        return true;
                /* kairosd writes "exit status N" (executor_handler.c) */
                unsigned c = 0;
                if (!msg || strncmp(msg, "exit status ", 12) != 0)
                        return false;
                const char *d = msg + 12;
                if (*d < '0' || *d > '9')
                        return false;
                for (; *d >= '0' && *d <= '9' && c < 1000; d++)
                        c = c * 10 + (unsigned)(*d - '0');
                return c <= 255 && (p->exit_codes[c / 64] >> (c % 64) & 1);
        }
        return false; /* cancelled, or a class kairos does not know */
}

uint64_t retry_delay_ms(const struct retry_policy *p, unsigned n, uint32_t rand)
{
        uint64_t d = p->first_ms;
        for (unsigned i = 1; i < n && d < p->max_ms; i++)
                d = d * p->factor_pct / 100;
        if (d > p->max_ms)
                d = p->max_ms;
        d += d * p->jitter_pct / 100 * rand >> 32;
        return d;
}
