/* SPDX-License-Identifier: MIT */
/* hooks: [Notify] commands (hooks.h). */
#include "hooks.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon.h"
#include "runenv.h"
#include "kairos/dlist.h"
#include "kairos/kbuf.h"
#include "kairos/kmem.h"
#include "log.h"
#include "child.h"

#define HOOK_OUTPUT_MAX 2048      /* bytes of stdout + stderr kept for the log */

/* Failures folded into one page: how many, of which schedules. */
#define FOLD_MAX_SCHEDULES 64
#define FOLD_MAX_CLASSES 16
struct hook_fold {
        char *cmd;                    /* the OnFailure= command they share */
        unsigned long count;
        unsigned long unnamed;        /* of schedules beyond FOLD_MAX_SCHEDULES */
        size_t nschedules;
        struct {
                char *name;
                unsigned long count;
        } schedules[FOLD_MAX_SCHEDULES];
        char first_at[32];
        char *first_mandate, *last_mandate;
        size_t nclasses;              /* error classes of the failed steps */
        struct {
                char *name;
                unsigned long count;
        } classes[FOLD_MAX_CLASSES];
};

struct hook_run {
        struct hooks *h;
        struct hook_run *next, *prev; /* the queue, then the running list */
        enum hook_event ev;
        struct hook_fold *fold;       /* failures folded into this page: its
                                       * argv, env and doc made when it starts */
        char *label;                  /* "OnFailure for MANDATE (failure)" */
        char *mandate;
        char **argv, **env;
        char *cwd;                    /* the state directory (a reload may replace cfg) */
        char *doc;
        size_t doc_len;
        struct child child;
        char output[HOOK_OUTPUT_MAX];
        size_t output_len, output_dropped;
};

/* Two queues: the pages for a human (review, approval), at most one per
 * mandate and run first, and the failure pages, at most HOOKS_MAX_QUEUED
 * (more are folded into one page per command, queued behind them). */
struct hook_queue {
        struct hook_run *head, *tail;
        unsigned n;
};

struct hooks {
        struct daemon *d;
        bool ready, stopping;
        struct hook_queue reviews, failures;
        unsigned folds;               /* fold pages among failures */
        struct hook_run *running_list;
        unsigned running;
        uint64_t timeout_ms;
};

static const char *const event_names[] = {
        [HOOK_REVIEW] = "review", [HOOK_APPROVAL] = "approval", [HOOK_FAILURE] = "failure",
};

static void foldpage_free(struct hook_fold *f)
{
        if (!f)
                return;
        free(f->cmd);
        for (size_t i = 0; i < f->nschedules; i++)
                free(f->schedules[i].name);
        for (size_t i = 0; i < f->nclasses; i++)
                free(f->classes[i].name);
        FREE_ALL(f->first_mandate, f->last_mandate, f);
}

static void hook_free(struct hook_run *run)
{
        foldpage_free(run->fold);
        config_strv_free(run->argv);
        free(run->env);
        child_free(&run->child);
        FREE_ALL(run->label, run->mandate, run->cwd, run->doc, run);
}

static void start_next(struct hooks *h);

static void on_closed(struct child *c)
{
        struct hook_run *run = c->data;
        struct hooks *h = run->h;
        DLIST_UNLINK(h->running_list, run);
        h->running--;
        hook_free(run);
        start_next(h);
}

/* The output kept, as one line: control characters shown as spaces. */
static void output_text(const struct hook_run *run, char *out, size_t len)
{
        size_t n = run->output_len < len - 1 ? run->output_len : len - 1;
        while (n && (run->output[n - 1] == '\n' || run->output[n - 1] == ' '))
                n--;
        for (size_t i = 0; i < n; i++) {
                unsigned char c = (unsigned char)run->output[i];
                out[i] = c < 0x20 || c == 0x7f ? ' ' : (char)c;
        }
        out[n] = '\0';
}

static void on_done(struct child *c)
{
        struct hook_run *run = c->data;
        char what[128], text[HOOK_OUTPUT_MAX + 1], more[64] = "";
        bool ok = false;
        if (c->timed_out)
                snprintf(what, sizeof what, "timed out after %llu ms (killed)",
                         (unsigned long long)run->h->timeout_ms);
        else if (c->term_signal)
                snprintf(what, sizeof what, "killed by signal %d (%s)", c->term_signal,
                         strsignal(c->term_signal));
        else if (c->exit_status != 0)
                snprintf(what, sizeof what, "failed with exit status %d", c->exit_status);
        else {
                snprintf(what, sizeof what, "succeeded");
                ok = true;
        }
        output_text(run, text, sizeof text);
        if (run->output_dropped)
                snprintf(more, sizeof more, " (%zu more bytes not logged)", run->output_dropped);
        log_event(ok ? LOG_INFO : LOG_WARNING, NULL,
                  LOG_FIELDS({ "MANDATE_ID", run->mandate }),
                  "hook %s %s; the mandate is not affected%s%s%s", run->label, what,
                  text[0] ? "; output: " : "", text, more);
        child_close(c);
}

/* stdout and stderr, as they come, into one buffer for the log */
static void on_read(struct child *c, int fd, const char *p, size_t n)
{
        (void)fd;
        struct hook_run *run = c->data;
        size_t room = sizeof run->output - run->output_len;
        size_t take = n < room ? n : room;
        if (p)
                memcpy(run->output + run->output_len, p, take);
        run->output_len += take;
        run->output_dropped += n - take;
}

static void on_started(struct child *c)
{
        struct hook_run *run = c->data;
        config_strv_clear(&run->argv);
        free(run->env);
        run->env = NULL;
        if (c->err) {
                log_event(LOG_WARNING, NULL, LOG_FIELDS({ "MANDATE_ID", run->mandate }),
                          "hook %s cannot start: %s%s%s; the mandate is not affected",
                          run->label, c->err_what ? c->err_what : "",
                          c->err_what ? ": " : "", strerror(-c->err));
                child_close(c);
                return;
        }
        log_event(LOG_INFO, NULL, LOG_FIELDS({ "MANDATE_ID", run->mandate }),
                  "hook %s started (pid %d)", run->label, (int)c->pid);
        if (run->h->stopping)
                child_kill(c, SIGKILL);
}

static void queue_push(struct hook_queue *q, struct hook_run *run)
{
        DQUEUE_PUSH_TAIL(q->head, q->tail, run);
        q->n++;
}

static void queue_remove(struct hook_queue *q, struct hook_run *run)
{
        DQUEUE_UNLINK(q->head, q->tail, run);
        run->next = run->prev = NULL;
        q->n--;
}

static int foldpage_prepare(struct hooks *h, struct hook_run *run);

static void start_one(struct hooks *h, struct hook_run *run)
{
        struct daemon *d = h->d;
        DLIST_PUSH(h->running_list, run);
        h->running++;
        struct child *c = &run->child;
        child_init(c, d->loop);
        c->argv = run->argv;
        c->envp = run->env;
        c->cwd = run->cwd;
        c->in = run->doc;
        c->in_len = run->doc_len;
        c->timeout_ms = h->timeout_ms;
        c->read = on_read;
        c->started = on_started;
        c->done = on_done;
        c->closed = on_closed;
        c->data = run;
        int r = child_start(c, d->runner);
        if (r < 0) {
                log_event(LOG_WARNING, NULL, LOG_FIELDS({ "MANDATE_ID", run->mandate }),
                          "hook %s cannot start: %s; the mandate is not affected", run->label,
                          strerror(-r));
                        child_close(c);
        }
}

/* Pages for a human first, then the failures in their order. */
static void start_next(struct hooks *h)
{
        while (h->ready && !h->stopping && h->running < HOOKS_MAX_RUNNING) {
                struct hook_queue *q = h->reviews.head ? &h->reviews : &h->failures;
                struct hook_run *run = q->head;
                if (!run)
                        break;
                queue_remove(q, run);
                if (run->fold) {
                        h->folds--;
                        int r = foldpage_prepare(h, run);
                        if (r < 0) {
                                if (r == -ENOMEM)
                                        log_warning("hooks: out of memory: a page for %lu "
                                                    "folded failures not sent",
                                                    run->fold->count);
                                hook_free(run);
                                continue;
                        }
                }
                start_one(h, run);
        }
}

int hooks_init(struct daemon *d)
{
        struct hooks *h = calloc(1, sizeof(*h));
        if (!h)
                return -ENOMEM;
        h->d = d;
        h->timeout_ms = (uint64_t)HOOKS_TIMEOUT_SEC * 1000;
#ifdef KAIROS_TEST_HOOKS
        const char *t = getenv("KAIROS_TEST_HOOK_TIMEOUT_MS");
        if (t && *t)
                h->timeout_ms = strtoull(t, NULL, 10);
#endif
        d->hooks = h;
        return 0;
}

void hooks_ready(struct daemon *d)
{
        struct hooks *h = d->hooks;
        if (!h)
                return;
        h->ready = true;
        start_next(h);
}

/* The command for ev: the schedule's [Notify] key if set ("" = none), else
 * the daemon's. */
static const char *hook_command(const struct config *cfg, enum hook_event ev,
                                const char *schedule, const char **ret_key)
{
        bool review = ev != HOOK_FAILURE;
        *ret_key = review ? "OnReview" : "OnFailure";
        for (size_t i = 0; schedule && i < cfg->nschedules; i++) {
                const struct config_schedule *s = &cfg->schedules[i];
                if (strcmp(s->name, schedule) != 0)
                        continue;
                const char *v = review ? s->on_review : s->on_failure;
                if (v)
                        return *v ? v : NULL;
        }
        const char *v = review ? cfg->on_review : cfg->on_failure;
        return v && *v ? v : NULL;
}

static void json_field(struct kbuf *b, const char *name, const char *v, bool first)
{
        kbuf_printf(b, "%s\"%s\":", first ? "" : ",", name);
        v ? (void)kbuf_json_string_lossy(b, v, strlen(v), 0) : (void)kbuf_puts(b, "null");
}

static void utc_now(char at[32])
{
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(at, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* A hook's environment: PATH and the others handlers get, the control
 * socket, then kv (NULL values left out).  NULL when out of memory. */
#define HOOK_ENV_MAX 24
static char **hook_env(struct daemon *d, const char *const (*kv)[2], size_t nkv)
{
        const char *all[HOOK_ENV_MAX][2] = { { "KAIROS_CONTROL_SOCKET", d->cfg->control_socket } };
        for (size_t i = 0; i < nkv && i + 1 < HOOK_ENV_MAX; i++) {
                all[i + 1][0] = kv[i][0];
                all[i + 1][1] = kv[i][1];
        }
        return runenv_build(all, nkv + 1 < HOOK_ENV_MAX ? nkv + 1 : HOOK_ENV_MAX, NULL, 0);
}

/* One word of a shell command line: as is when it has nothing the shell
 * reads, else in single quotes. */
static void shell_word(struct kbuf *b, const char *w)
{
        if (*w && strspn(w, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                            "0123456789_-+=.,/:@%") == strlen(w)) {
                kbuf_puts(b, w);
                return;
        }
        kbuf_putc(b, '\'');
        for (; *w; w++)
                *w == '\'' ? (void)kbuf_puts(b, "'\\''") : (void)kbuf_putc(b, *w);
        kbuf_putc(b, '\'');
}

/* The command that shows mandate id: kairosctl (its path when known), the
 * control socket, show id.  NULL when out of memory. */
static char *show_command(struct daemon *d, const char *id)
{
        const char *path, *home, *user, *ctl;
        runenv_get(&path, &home, &user, &ctl);
        struct kbuf b = KBUF_INIT;
        shell_word(&b, ctl ? ctl : "kairosctl");
        kbuf_puts(&b, " --socket ");
        shell_word(&b, d->cfg->control_socket);
        kbuf_puts(&b, " show ");
        shell_word(&b, id);
        return kbuf_steal(&b);
}

const char *hooks_stderr_last(const char *s)
{
        size_t len = strlen(s), start = len > HOOKS_STDERR_MAX ? len - HOOKS_STDERR_MAX : 0;
        while (start < len && ((unsigned char)s[start] & 0xc0) == 0x80)
                start++;
        unsigned lines = 0;
        for (size_t i = len; i-- > start;)
                if (s[i] == '\n' && ++lines == HOOKS_STDERR_LINES) {
                        start = i + 1;
                        break;
                }
        return s + start;
}

/* s copied to *p (advanced past it), or NULL for NULL. */
static char *put_str(char **p, const char *s)
{
        if (!s)
                return NULL;
        size_t n = strlen(s) + 1;
        char *out = memcpy(*p, s, n);
        *p += n;
        return out;
}

struct hook_failure *hooks_failure_copy(const struct hook_failure *f)
{
        const char *tail = hooks_stderr_last(f->stderr_tail ? f->stderr_tail : "");
        size_t size = sizeof(struct hook_failure) + strlen(tail) + 1;
        const char *strs[] = { f->step, f->error_class, f->error_msg };
        for (size_t i = 0; i < 3; i++)
                size += strs[i] ? strlen(strs[i]) + 1 : 0;
        struct hook_failure *c = malloc(size);
        if (!c)
                return NULL;
        char *p = (char *)(c + 1);
        *c = (struct hook_failure){ .exit_status = f->exit_status,
                                    .exit_signal = f->exit_signal,
                                    .attempt = f->attempt };
        c->step = put_str(&p, f->step);
        c->error_class = put_str(&p, f->error_class);
        c->error_msg = put_str(&p, f->error_msg);
        c->stderr_tail = put_str(&p, tail);
        return c;
}

void hooks_note_failure(struct mandate *m, const struct hook_failure *f)
{
        free(m->failure);
        m->failure = hooks_failure_copy(f);
}

/* A failure beyond HOOKS_MAX_QUEUED waiting: counted in the fold page of
 * its command that waits (a new one queued behind the failures if none). */
static void foldpage_add(struct hooks *h, const char *cmd, const struct mandate *m)
{
        struct hook_run *run = NULL;
        for (struct hook_run *r = h->failures.head; r && !run; r = r->next)
                if (r->fold && strcmp(r->fold->cmd, cmd) == 0)
                        run = r;
        if (!run) {
                run = calloc(1, sizeof(*run));
                struct hook_fold *f = run ? calloc(1, sizeof(*f)) : NULL;
                if (f)
                        f->cmd = strdup(cmd);
                if (!f || !f->cmd) {
                        log_warning("hooks: out of memory: the failure page for %s not sent",
                                    m->id);
                        foldpage_free(f);
                        free(run);
                        return;
                }
                run->h = h;
                run->ev = HOOK_FAILURE;
                run->fold = f;
                utc_now(f->first_at);
                queue_push(&h->failures, run);
                h->folds++;
                log_warning("hooks: %u failure pages waiting; the next failures (from %s on) "
                            "are folded into one page that counts them",
                            HOOKS_MAX_QUEUED, m->id);
        }
        struct hook_fold *f = run->fold;
        f->count++;
        if (!f->first_mandate)
                f->first_mandate = strdup(m->id);
        free(f->last_mandate);
        f->last_mandate = strdup(m->id);
        const char *cls = m->failure && m->failure->error_class ? m->failure->error_class
                                                                : "unknown";
        size_t k = 0;
        while (k < f->nclasses && strcmp(f->classes[k].name, cls) != 0)
                k++;
        if (k < f->nclasses)
                f->classes[k].count++;
        else if (k < FOLD_MAX_CLASSES && (f->classes[k].name = strdup(cls)) != NULL)
                f->classes[f->nclasses++].count = 1;
        const char *name = m->schedule ? m->schedule : "";
        for (size_t i = 0; i < f->nschedules; i++)
                if (strcmp(f->schedules[i].name, name) == 0) {
                        f->schedules[i].count++;
                        return;
                }
        if (f->nschedules < FOLD_MAX_SCHEDULES &&
            (f->schedules[f->nschedules].name = strdup(name)) != NULL)
                f->schedules[f->nschedules++].count = 1;
        else
                f->unnamed++;
}

/* The fold page is about to start: its command, environment and document
 * (kairosd(8), NOTIFY). */
static int foldpage_prepare(struct hooks *h, struct hook_run *run)
{
        struct hook_fold *f = run->fold;
        char at[32], count[24];
        utc_now(at);
        snprintf(count, sizeof count, "%lu", f->count);
        struct kbuf names = KBUF_INIT, b = KBUF_INIT;
        kbuf_printf(&b, "{\"event\":\"failures\",\"count\":%lu,\"schedules\":{", f->count);
        for (size_t i = 0; i < f->nschedules; i++) {
                if (i) {
                        kbuf_putc(&names, ' ');
                        kbuf_putc(&b, ',');
                }
                kbuf_puts(&names, f->schedules[i].name);
                kbuf_json_string_lossy(&b, f->schedules[i].name, strlen(f->schedules[i].name),
                                       0);
                kbuf_printf(&b, ":%lu", f->schedules[i].count);
        }
        kbuf_printf(&b, "},\"unnamed\":%lu,\"error_classes\":{", f->unnamed);
        struct kbuf classes = KBUF_INIT;
        for (size_t i = 0; i < f->nclasses; i++) {
                kbuf_printf(&classes, "%s%s=%lu", i ? " " : "", f->classes[i].name,
                            f->classes[i].count);
                if (i)
                        kbuf_putc(&b, ',');
                kbuf_json_string_lossy(&b, f->classes[i].name, strlen(f->classes[i].name), 0);
                kbuf_printf(&b, ":%lu", f->classes[i].count);
        }
        kbuf_puts(&b, "}");
        json_field(&b, "first_mandate", f->first_mandate, false);
        json_field(&b, "last_mandate", f->last_mandate, false);
        char *list = NULL;
        const char *path, *home, *user, *ctl;
        runenv_get(&path, &home, &user, &ctl);
        struct kbuf lb = KBUF_INIT;
        shell_word(&lb, ctl ? ctl : "kairosctl");
        kbuf_puts(&lb, " --socket ");
        shell_word(&lb, h->d->cfg->control_socket);
        kbuf_puts(&lb, " list --status failed");
        list = kbuf_steal(&lb);
        json_field(&b, "list", list, false);
        json_field(&b, "first_at", f->first_at, false);
        json_field(&b, "at", at, false);
        kbuf_puts(&b, "}\n");
        run->doc_len = b.len;
        run->doc = kbuf_steal(&b);
        const char *const kv[][2] = {
                { "KAIROS_EVENT", "failures" },
                { "KAIROS_FOLDED", count },
                { "KAIROS_SCHEDULES", names.data ? names.data : "" },
                { "KAIROS_ERROR_CLASSES", classes.data ? classes.data : "" },
                { "KAIROS_FIRST_MANDATE_ID", f->first_mandate },
                { "KAIROS_LAST_MANDATE_ID", f->last_mandate },
                { "KAIROS_LIST", list },
        };
        run->env = hook_env(h->d, kv, sizeof kv / sizeof kv[0]);
        run->cwd = strdup(h->d->cfg->state_directory);
        if (asprintf(&run->label, "OnFailure for %lu folded failures (failures)", f->count) < 0)
                run->label = NULL;
        int r = !run->doc || !run->env || !run->cwd || !run->label || !list ? -ENOMEM : 0;
        kbuf_free(&classes);
        free(list);
        /* its $NAME and ${NAME} expand from its environment */
        char why[256] = "";
        if (r == 0)
                r = runenv_command(f->cmd, run->env, &run->argv, why, sizeof why);
        if (r == -EINVAL)
                log_warning("hooks: a page for %lu folded failures not sent: cannot prepare %s: "
                            "%s", f->count, f->cmd, why[0] ? why : "cannot split it");
        if (r == 0)
                log_warning("hooks: %lu failures folded into one page (schedules: %s%s)",
                            f->count, kv[2][1], f->unnamed ? " and more" : "");
        kbuf_free(&names);
        return r;
}

void hooks_event(struct daemon *d, enum hook_event ev, const struct mandate *m,
                 const char *step, const char *evidence)
{
        struct hooks *h = d->hooks;
        if (!h || h->stopping)
                return;
        const char *key;
        const char *cmd = hook_command(d->cfg, ev, m->schedule, &key);
        if (!cmd)
                return;
        if (ev == HOOK_FAILURE && h->failures.n - h->folds >= HOOKS_MAX_QUEUED) {
                foldpage_add(h, cmd, m);
                return;
        }
        const char *status = mandate_status_name(m->status);
        char at[32];
        utc_now(at);
        /* a failure: its last failed execution, if this kairosd saw it */
        const struct hook_failure *fl = ev == HOOK_FAILURE ? m->failure : NULL;
        char exit_status[16] = "", exit_signal[16] = "", attempt[16] = "";
        if (fl && fl->exit_status >= 0)
                snprintf(exit_status, sizeof exit_status, "%d", fl->exit_status);
        if (fl && fl->exit_signal > 0)
                snprintf(exit_signal, sizeof exit_signal, "%d", fl->exit_signal);
        if (fl && fl->attempt)
                snprintf(attempt, sizeof attempt, "%u", fl->attempt);
        if (fl && !step)
                step = fl->step;
        char *show = show_command(d, m->id);

        struct hook_run *run = calloc(1, sizeof(*run));
        if (!run) {
                log_warning("hook %s for %s: out of memory; the mandate is not affected", key,
                            m->id);
                free(show);
                return;
        }
        run->h = h;
        run->ev = ev;
        run->mandate = strdup(m->id);
        if (asprintf(&run->label, "%s for %s (%s)", key, m->id, event_names[ev]) < 0)
                run->label = NULL;

        struct kbuf b = KBUF_INIT;
        kbuf_puts(&b, "{");
        json_field(&b, "event", event_names[ev], true);
        json_field(&b, "mandate", m->id, false);
        json_field(&b, "schedule", m->schedule, false);
        json_field(&b, "fired_at", m->fired_at, false);
        json_field(&b, "status", status, false);
        json_field(&b, "reason", m->reason, false);
        json_field(&b, "step", step, false);
        if (fl) {
                json_field(&b, "error_class", fl->error_class, false);
                json_field(&b, "error", fl->error_msg, false);
                kbuf_puts(&b, ",\"exit_status\":");
                exit_status[0] ? (void)kbuf_puts(&b, exit_status) : (void)kbuf_puts(&b, "null");
                kbuf_puts(&b, ",\"exit_signal\":");
                exit_signal[0] ? (void)kbuf_puts(&b, exit_signal) : (void)kbuf_puts(&b, "null");
                kbuf_puts(&b, ",\"attempt\":");
                attempt[0] ? (void)kbuf_puts(&b, attempt) : (void)kbuf_puts(&b, "null");
                json_field(&b, "stderr", fl->stderr_tail, false);
        }
        if (evidence && *evidence)
                kbuf_printf(&b, ",\"evidence\":%s", evidence);
        json_field(&b, "show", show, false);
        json_field(&b, "at", at, false);
        kbuf_puts(&b, "}\n");
        run->doc_len = b.len;
        run->doc = kbuf_steal(&b);

        const char *const kv[][2] = {
                { "KAIROS_EVENT", event_names[ev] },
                { "KAIROS_MANDATE_ID", m->id },
                { "KAIROS_SCHEDULE", m->schedule },
                { "KAIROS_FIRED_AT", m->fired_at },
                { "KAIROS_STATUS", status },
                { "KAIROS_REASON", m->reason },
                { "KAIROS_STEP_ID", step },
                { "KAIROS_ERROR_CLASS", fl ? fl->error_class : NULL },
                { "KAIROS_ERROR", fl ? fl->error_msg : NULL },
                { "KAIROS_EXIT_STATUS", exit_status[0] ? exit_status : NULL },
                { "KAIROS_EXIT_SIGNAL", exit_signal[0] ? exit_signal : NULL },
                { "KAIROS_ATTEMPT", attempt[0] ? attempt : NULL },
                { "KAIROS_STDERR", fl ? fl->stderr_tail : NULL },
                { "KAIROS_EVIDENCE", evidence && *evidence ? evidence : NULL },
                { "KAIROS_SHOW", show },
        };
        run->env = hook_env(d, kv, sizeof kv / sizeof kv[0]);
        run->cwd = strdup(d->cfg->state_directory);
        bool nomem = !show;
        free(show);
        if (nomem || !run->env || !run->cwd || !run->doc || !run->mandate || !run->label) {
                log_warning("hook %s for %s: out of memory; the mandate is not affected", key,
                            m->id);
                hook_free(run);
                return;
        }
        /* its $NAME and ${NAME} expand from its environment */
        char why[256] = "";
        int r = runenv_command(cmd, run->env, &run->argv, why, sizeof why);
        if (r < 0) {
                log_warning("hook %s for %s: cannot prepare %s: %s; the mandate is not affected",
                            key, m->id, cmd, r == -EINVAL && why[0] ? why : strerror(-r));
                hook_free(run);
                return;
        }
        if (ev == HOOK_FAILURE) {
                queue_push(&h->failures, run);
        } else {
                /* One page per mandate waits: the latest replaces an older. */
                for (struct hook_run *o = h->reviews.head; o; o = o->next)
                        if (strcmp(o->mandate, m->id) == 0) {
                                queue_remove(&h->reviews, o);
                                hook_free(o);
                                break;
                        }
                queue_push(&h->reviews, run);
        }
        start_next(h);
}

void hooks_stop(struct daemon *d)
{
        struct hooks *h = d->hooks;
        if (!h)
                return;
        h->stopping = true;
        unsigned dropped = h->reviews.n + h->failures.n;
        unsigned long folded = 0;
        struct hook_queue *qs[] = { &h->reviews, &h->failures };
        for (size_t i = 0; i < 2; i++)
                while (qs[i]->head) {
                        struct hook_run *run = qs[i]->head;
                        if (run->fold)
                                folded += run->fold->count;
                        queue_remove(qs[i], run);
                        hook_free(run);
                }
        h->folds = 0;
        if (dropped)
                log_warning("hooks: %u waiting hook%s not run (stopping)%s", dropped,
                            dropped == 1 ? "" : "s",
                            folded ? "; one of them the page of folded failures" : "");
        for (struct hook_run *run = h->running_list; run; run = run->next)
                child_kill(&run->child, SIGKILL);
}

void hooks_free(struct daemon *d)
{
        struct hooks *h = d->hooks;
        if (!h)
                return;
        struct hook_queue *qs[] = { &h->reviews, &h->failures };
        for (size_t i = 0; i < 2; i++)
                while (qs[i]->head) {
                        struct hook_run *run = qs[i]->head;
                        queue_remove(qs[i], run);
                        hook_free(run);
                }
        while (h->running_list) {
                struct hook_run *run = h->running_list;
                h->running_list = run->next;
                hook_free(run);
        }
        free(h);
        d->hooks = NULL;
}
