/* SPDX-License-Identifier: MIT */
/* probeout: judging a probe's run (kairos/probeout.h). */
#include "kairos/probeout.h"
#include "kairos/evidence.h"
#include "kairos/kmem.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kairos/kbuf.h"
#include "kairos/kjson.h"
#include "kairos/planner.h"

/* Append s (n bytes) as plain UTF-8 text: invalid sequences and NUL bytes
 * become U+FFFD, at most max code points, "…" when cut; trailing newlines
 * and spaces dropped. */
static int put_text(struct kbuf *b, const char *s, size_t n, size_t max)
{
        static const char replacement[] = "\xEF\xBF\xBD";
        const unsigned char *p = (const unsigned char *)s;
        while (n && (p[n - 1] == '\n' || p[n - 1] == '\r' || p[n - 1] == ' '))
                n--;
        size_t chars = 0, i = 0;
        int r = 0;
        while (r == 0 && i < n && chars < max) {
                size_t l = p[i] && p[i] < 0x80 ? 1 : p[i] ? utf8_seq_len(p + i, n - i) : 0;
                r = l ? kbuf_append(b, s + i, l) : kbuf_append(b, replacement, 3);
                i += l ? l : 1;
                chars++;
        }
        if (r == 0 && i < n)
                r = kbuf_puts(b, "\u2026");
        return r;
}

/* The answer in stdout, strictly: 0 and *ret (DONE with *ret_result, or
 * NOT_STARTED), or -EINVAL with why in why. */
static int read_answer(const char *out, size_t n, enum recovery_probe *ret, char **ret_result,
                       const char **why)
{
        struct kjson_arena *ar = kjson_arena_new();
        struct kjson *v;
        struct kjson_error err = { 0 };
        int r;

        if (!ar)
                return -ENOMEM;
        r = kjson_parse(ar, out ? out : "", n, &v, &err);
        if (r == -ENOMEM)
                goto out;
        r = -EINVAL;
        if (n == 0) {
                *why = "no answer on stdout";
                goto out;
        }
        if (err.code != KJSON_OK || !v) {
                *why = "stdout is not JSON";
                goto out;
        }
        if (v->type != KJSON_OBJECT) {
                *why = "stdout is not a JSON object";
                goto out;
        }
        const struct kjson *state = NULL, *result = NULL;
        for (size_t i = 0; i < v->u.obj.n; i++) {
                const struct kjson_member *m = &v->u.obj.members[i];
                const struct kjson **slot = strcmp(m->key, "state") == 0    ? &state
                                            : strcmp(m->key, "result") == 0 ? &result
                                                                            : NULL;
                if (!slot || strlen(m->key) != m->key_len) {
                        *why = "a member other than state and result";
                        goto out;
                }
                if (*slot) {
                        *why = "a member given twice";
                        goto out;
                }
                *slot = m->value;
        }
        if (!state || state->type != KJSON_STRING || strlen(state->u.str.ptr) != state->u.str.len) {
                *why = "no state string";
                goto out;
        }
        if (strcmp(state->u.str.ptr, "not_started") == 0) {
                if (result) {
                        *why = "not_started with a result";
                        goto out;
                }
                *ret = RECOVERY_PROBE_NOT_STARTED;
                r = 0;
                goto out;
        }
        if (strcmp(state->u.str.ptr, "done") != 0) {
                *why = "state is neither done nor not_started";
                goto out;
        }
        if (!result) {
                *why = "done without a result";
                goto out;
        }
        struct kbuf b = KBUF_INIT;
        if (kjson_write(&b, result) < 0) {
                kbuf_free(&b);
                r = -ENOMEM;
                goto out;
        }
        *ret = RECOVERY_PROBE_DONE;
        *ret_result = kbuf_steal(&b);
        r = *ret_result ? 0 : -ENOMEM;
out:
        kjson_arena_free(ar);
        return r;
}

static int failed(const struct probe_run *run, const char *what, struct probe_word *w)
{
        struct kbuf b = KBUF_INIT;
        int r = kbuf_puts(&b, what);
        if (r == 0 && run->out_len) {
                r = kbuf_puts(&b, "; stdout: ");
                if (r == 0)
                        r = put_text(&b, run->out, run->out_len, PROBE_EVIDENCE_MAX);
        }
        if (r == 0 && run->err_len) {
                r = kbuf_puts(&b, "; stderr: ");
                if (r == 0)
                        r = put_text(&b, run->err, run->err_len, PROBE_EVIDENCE_MAX);
        }
        if (r < 0) {
                kbuf_free(&b);
                return r;
        }
        w->probe = RECOVERY_PROBE_FAILED;
        w->output = kbuf_steal(&b);
        return w->output ? 0 : -ENOMEM;
}

int probe_judge(const struct probe_run *run, struct probe_word *w)
{
        if (!w)
                return -EINVAL;
        *w = (struct probe_word){ .probe = RECOVERY_PROBE_FAILED };
        if (!run)
                return -EINVAL;

        struct kbuf what = KBUF_INIT;
        int r;
        if (run->start_error)
                r = kbuf_printf(&what, "the probe could not start: %s", run->start_error);
        else if (run->timed_out)
                r = kbuf_printf(&what, "no answer within ProbeTimeoutSec=%u (killed)",
                                run->timeout_sec);
        else if (run->out_overflow)
                r = kbuf_printf(&what, "more than %d bytes on stdout", PROBE_STDOUT_MAX);
        else if (run->term_signal)
                r = kbuf_printf(&what, "killed by signal %d", run->term_signal);
        else if (run->exit_status != 0)
                r = kbuf_printf(&what, "exit status %d", run->exit_status);
        else {
                const char *why = NULL;
                r = read_answer(run->out, run->out_len, &w->probe, &w->result_json, &why);
                if (r != -EINVAL) {
                        kbuf_free(&what);
                        return r;
                }
                r = kbuf_printf(&what, "not a probe answer (%s; expected {\"state\":\"done\","
                                "\"result\":...} or {\"state\":\"not_started\"})", why);
        }
        if (r == 0)
                r = failed(run, what.data, w);
        kbuf_free(&what);
        return r;
}

void probe_tail_keep(char *tail, size_t cap, size_t *tail_len, const char *p, size_t n)
{
        if (n >= cap) {
                memcpy(tail, p + n - cap, cap);
                *tail_len = cap;
                return;
        }
        if (*tail_len + n > cap) {
                size_t drop = *tail_len + n - cap;
                memmove(tail, tail + drop, *tail_len - drop);
                *tail_len -= drop;
        }
        memcpy(tail + *tail_len, p, n);
        *tail_len += n;
}

void probe_word_clear(struct probe_word *w)
{
        if (!w)
                return;
        free(w->result_json);
        free(w->output);
        *w = (struct probe_word){ .probe = RECOVERY_PROBE_NONE };
}

bool probe_schedule_evidence(const struct config *cfg, const char *schedule,
                             struct recovery_evidence *ret)
{
        const struct config_schedule *sc =
                cfg && schedule ? config_find_schedule(cfg, schedule) : NULL;
        if (!sc || !sc->probe || !*sc->probe)
                return false;
        /* the schedule's declarations as startup recovery reads them
         * (evidence.h); the store is counted as unknown: it did not decide
         * the step at the start (else no probe would run), and nothing it
         * could say about a mandate that only waits has changed since */
        struct evidence_schedule es;
        struct evidence_mandate em;
        evidence_schedule_from_config(sc, &es);
        if (evidence_for_mandate(NULL, "", &es, &em) < 0)
                return false;
        *ret = em.ev;
        evidence_mandate_release(&em);
        return true;
}

const char *probe_word_name(enum recovery_probe p)
{
        static const char *const names[] = {
                [RECOVERY_PROBE_NONE] = "none", [RECOVERY_PROBE_DONE] = "done",
                [RECOVERY_PROBE_NOT_STARTED] = "not_started", [RECOVERY_PROBE_FAILED] = "failed",
        };
        return ENUM_NAME(names, p, "unknown");
}
