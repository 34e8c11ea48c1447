/* SPDX-License-Identifier: MIT */
/* config: a strict, table-driven systemd-style INI parser for kairosd.conf,
 * its drop-ins and schedules.d/NAME.conf.
 *
 * Every error is collected (never only the first) as one message
 *   "FILE:LINE: Key=: what is wrong"   (a bad assignment)
 *   "FILE:LINE: what is wrong"         (a line without a key)
 *   "FILE: what is wrong"              (file-level) */
#include "kairos/config.h"
#include "kairos/kmem.h"
#include "kairos/planner.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include "kairos/cron.h"
#include "kairos/kbuf.h"
#include "kairos/missed.h"

#define CONFIG_FILE_MAX (1024 * 1024)
#define MAX_SECTIONS 8

_Static_assert(sizeof(enum config_missed_policy) == sizeof(int), "enum stored as int");
_Static_assert(sizeof(enum config_concurrency) == sizeof(int), "enum stored as int");

/* ---- error collection ------------------------------------------------- */

struct errctx {
        struct config_errors *errs; /* may be NULL: only counted */
        size_t n;                   /* errors reported through this context */
        bool oom;
};

__attribute__((format(printf, 2, 3)))
static void err_add(struct errctx *ec, const char *fmt, ...)
{
        ec->n++;
        if (!ec->errs)
                return;
        struct kbuf b = KBUF_INIT;
        va_list ap;
        va_start(ap, fmt);
        int r = kbuf_vprintf(&b, fmt, ap);
        va_end(ap);
        if (r < 0 || !b.data) {
                kbuf_free(&b);
                ec->oom = true;
                return;
        }
        char **m = realloc(ec->errs->msgs, (ec->errs->n + 1) * sizeof(*m));
        if (!m) {
                kbuf_free(&b);
                ec->oom = true;
                return;
        }
        ec->errs->msgs = m;
        m[ec->errs->n++] = kbuf_steal(&b);
}

void config_errors_free(struct config_errors *e)
{
        if (!e)
                return;
        kmem_free_strv(e->msgs, e->n);
        e->msgs = NULL;
        e->n = 0;
}

static const char *errno_str(int err, char *buf, size_t len)
{
        /* GNU strerror_r (we build with _GNU_SOURCE): thread-safe. */
        return strerror_r(err, buf, len);
}

/* ---- string vectors ---------------------------------------------------- */

void config_strv_free(char **v)
{
        if (!v)
                return;
        for (char **p = v; *p; p++)
                free(*p);
        free(v);
}

/* Append s (taken over) to the NULL-terminated vector *v of *n entries. */
static int strv_push(char ***v, size_t *n, char *s)
{
        char **p = realloc(*v, (*n + 2) * sizeof(*p));
        if (!p)
                return -ENOMEM;
        p[(*n)++] = s;
        p[*n] = NULL;
        *v = p;
        return 0;
}

void config_strv_clear(char ***v)
{
        config_strv_free(*v);
        *v = NULL;
}

static void strv_reset(char ***v, size_t *n)
{
        config_strv_clear(v);
        *n = 0;
}

static int set_str(char **field, const char *value)
{
        char *d = strdup(value);
        if (!d)
                return -ENOMEM;
        free(*field);
        *field = d;
        return 0;
}

/* ---- value grammars ---------------------------------------------------- */

static bool is_blank(char c)
{
        return c == ' ' || c == '\t';
}

static bool is_digit(char c)
{
        return c >= '0' && c <= '9';
}

static bool is_alpha(char c)
{
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

bool config_valid_schedule_name(const char *name)
{
        return name && planner_valid_name(name);
}

static const char *const phase_keys[CONFIG_PHASES] = {
        "Observe", "Orient", "Decide", "Act", "Reflect",
};

const char *config_phase_name(int phase)
{
        static const char *const names[CONFIG_PHASES] = { "observe", "orient", "decide", "act",
                                                           "reflect" };
        return phase >= 0 && phase < CONFIG_PHASES ? names[phase] : NULL;
}

const char *config_phase_key(int phase)
{
        if (phase < 0 || phase >= CONFIG_PHASES)
                return NULL;
        return phase_keys[phase];
}

/* Digits only; -EINVAL if not a number, -ERANGE if it overflows. */
static int parse_u64(const char *s, const char **end, uint64_t *out)
{
        const char *p = s;
        uint64_t v = 0;
        bool overflow = false;
        if (!is_digit(*p))
                return -EINVAL;
        for (; is_digit(*p); p++) {
                unsigned d = (unsigned)(*p - '0');
                if (v > (UINT64_MAX - d) / 10)
                        overflow = true;
                else
                        v = v * 10 + d;
        }
        *end = p;
        *out = v;
        return overflow ? -ERANGE : 0;
}

static const struct {
        const char *name;
        uint64_t mult;
} duration_units[] = {
        { "s", 1 }, { "sec", 1 }, { "min", 60 }, { "h", 3600 }, { "d", 86400 },
};

/* A decimal number then, after optional blanks, the rest in *ret_end. */
static int limit_number(const char *s, uint64_t *ret, const char **ret_end)
{
        if (!s || !ret)
                return -EINVAL;
        while (is_blank(*s))
                s++;
        if (*s < '0' || *s > '9')
                return -EINVAL;
        uint64_t n = 0;
        for (; *s >= '0' && *s <= '9'; s++) {
                if (n > (UINT64_MAX - 9) / 10)
                        return -ERANGE;
                n = n * 10 + (uint64_t)(*s - '0');
        }
        while (is_blank(*s))
                s++;
        *ret = n;
        *ret_end = s;
        return 0;
}

static bool limit_is_infinity(const char *s)
{
        while (is_blank(*s))
                s++;
        size_t n = strlen(s);
        while (n > 0 && is_blank(s[n - 1]))
                n--;
        return n == 8 && strncmp(s, "infinity", 8) == 0;
}

int config_parse_bytes(const char *s, uint64_t *ret_bytes)
{
        if (!s || !ret_bytes)
                return -EINVAL;
        if (limit_is_infinity(s)) {
                *ret_bytes = CONFIG_LIMIT_INFINITY;
                return 0;
        }
        uint64_t n, mult = 1;
        const char *e;
        int r = limit_number(s, &n, &e);
        if (r < 0)
                return r;
        switch (*e) {
        case '\0': break;
        case 'K': mult = UINT64_C(1) << 10; e++; break;
        case 'M': mult = UINT64_C(1) << 20; e++; break;
        case 'G': mult = UINT64_C(1) << 30; e++; break;
        case 'T': mult = UINT64_C(1) << 40; e++; break;
        default: return -EINVAL;
        }
        while (is_blank(*e))
                e++;
        if (*e != '\0' || n == 0)
                return -EINVAL;
        if (n > (UINT64_MAX - 1) / mult)
                return -ERANGE;
        *ret_bytes = n * mult;
        return 0;
}

int config_parse_tasks(const char *s, uint64_t *ret_tasks)
{
        if (!s || !ret_tasks)
                return -EINVAL;
        if (limit_is_infinity(s)) {
                *ret_tasks = CONFIG_LIMIT_INFINITY;
                return 0;
        }
        uint64_t n;
        const char *e;
        int r = limit_number(s, &n, &e);
        if (r < 0)
                return r;
        if (*e != '\0' || n == 0)
                return -EINVAL;
        if (n > INT32_MAX) /* pids.max is an int in the kernel */
                return -ERANGE;
        *ret_tasks = n;
        return 0;
}

int config_parse_percent(const char *s, uint64_t *ret_pct)
{
        if (!s || !ret_pct)
                return -EINVAL;
        uint64_t n;
        const char *e;
        int r = limit_number(s, &n, &e);
        if (r < 0)
                return r;
        if (*e != '%')
                return -EINVAL;
        e++;
        while (is_blank(*e))
                e++;
        if (*e != '\0' || n == 0)
                return -EINVAL;
        if (n > 100000) /* 1000 CPUs */
                return -ERANGE;
        *ret_pct = n;
        return 0;
}

bool config_schedule_has_limits(const struct config_schedule *s)
{
        return s && (s->memory_max || s->tasks_max || s->cpu_quota_pct);
}

int config_parse_duration(const char *s, uint64_t *out_sec)
{
        if (!s || !out_sec)
                return -EINVAL;
        const char *p = s;
        uint64_t total = 0;
        size_t ncomp = 0;
        bool range = false;

        for (;;) {
                if (ncomp > 0) {
                        if (*p == '\0')
                                break;
                        while (is_blank(*p))
                                p++;
                }
                uint64_t n;
                const char *e;
                int r = parse_u64(p, &e, &n);
                if (r == -EINVAL)
                        return -EINVAL;
                if (r == -ERANGE)
                        range = true;
                p = e;
                const char *u = p;
                while (is_alpha(*p))
                        p++;
                size_t ulen = (size_t)(p - u);
                uint64_t mult = 0;
                if (ulen == 0) {
                        /* a unitless number is seconds, and only on its own */
                        if (ncomp > 0 || *p != '\0')
                                return -EINVAL;
                        mult = 1;
                } else {
                        for (size_t i = 0; i < sizeof(duration_units) / sizeof(duration_units[0]); i++) {
                                if (strlen(duration_units[i].name) == ulen &&
                                    memcmp(duration_units[i].name, u, ulen) == 0)
                                        mult = duration_units[i].mult;
                        }
                        if (mult == 0)
                                return -EINVAL;
                }
                if (*p != '\0' && !is_blank(*p) && !is_digit(*p))
                        return -EINVAL;
                if (n > UINT64_MAX / mult || total > UINT64_MAX - n * mult)
                        range = true;
                else
                        total += n * mult;
                ncomp++;
        }
        if (range)
                return -ERANGE;
        *out_sec = total;
        return 0;
}

static int parse_bool(const char *s, bool *out)
{
        static const char *const yes[] = { "yes", "true", "on", "1" };
        static const char *const no[] = { "no", "false", "off", "0" };
        for (size_t i = 0; i < 4; i++) {
                if (strcasecmp(s, yes[i]) == 0) {
                        *out = true;
                        return 0;
                }
                if (strcasecmp(s, no[i]) == 0) {
                        *out = false;
                        return 0;
                }
        }
        return -EINVAL;
}

/* Absolute, and no ".." component.  Returns NULL or what is wrong. */
static const char *path_problem(const char *s)
{
        if (s[0] != '/')
                return "is not an absolute path";
        for (const char *p = s; (p = strstr(p, "..")); p += 2) {
                bool start = p[-1] == '/';
                bool end = p[2] == '/' || p[2] == '\0';
                if (start && end)
                        return "must not contain \"..\"";
        }
        return NULL;
}

static bool valid_env_name(const char *s, size_t n)
{
        if (n == 0 || is_digit(s[0]))
                return false;
        for (size_t i = 0; i < n; i++) {
                if (!(is_alpha(s[i]) || is_digit(s[i]) || s[i] == '_'))
                        return false;
        }
        return true;
}

/* ---- command lines ----------------------------------------------------- */

static int split_command(const char *cmdline, char ***argv_out, size_t *argc_out,
                         const char **why)
{
        char **argv = NULL;
        size_t argc = 0;
        struct kbuf w = KBUF_INIT;
        const char *p = cmdline;
        int r = 0;

        *why = NULL;
        for (;;) {
                while (is_blank(*p) || *p == '\n' || *p == '\r')
                        p++;
                if (*p == '\0')
                        break;
                kbuf_reset(&w);
                r = kbuf_reserve(&w, 0); /* an empty word ("") is still a word */
                if (r < 0)
                        goto fail;
                w.data[w.len] = '\0';
                char quote = 0;
                for (; *p; p++) {
                        char c = *p;
                        if (quote == '\'') {
                                if (c == '\'') {
                                        quote = 0;
                                        continue;
                                }
                        } else if (c == '\\') {
                                p++;
                                switch (*p) {
                                case '\0':
                                        *why = "trailing backslash";
                                        r = -EINVAL;
                                        goto fail;
                                case '\\': case '"': case '\'': case ' ':
                                        c = *p;
                                        break;
                                case 'n':
                                        c = '\n';
                                        break;
                                case 't':
                                        c = '\t';
                                        break;
                                case 'r':
                                        c = '\r';
                                        break;
                                default:
                                        *why = "unknown escape sequence";
                                        r = -EINVAL;
                                        goto fail;
                                }
                        } else if (quote == '"') {
                                if (c == '"') {
                                        quote = 0;
                                        continue;
                                }
                        } else if (c == '"' || c == '\'') {
                                quote = c;
                                continue;
                        } else if (is_blank(c) || c == '\n' || c == '\r') {
                                break;
                        }
                        r = kbuf_putc(&w, c);
                        if (r < 0)
                                goto fail;
                }
                if (quote) {
                        *why = quote == '"' ? "unbalanced double quote"
                                            : "unbalanced single quote";
                        r = -EINVAL;
                        goto fail;
                }
                char *word = kbuf_steal(&w);
                r = strv_push(&argv, &argc, word);
                if (r < 0) {
                        free(word);
                        goto fail;
                }
        }
        if (!argv) {
                argv = calloc(1, sizeof(*argv));
                if (!argv) {
                        r = -ENOMEM;
                        goto fail;
                }
        }
        kbuf_free(&w);
        *argv_out = argv;
        *argc_out = argc;
        return 0;
fail:
        kbuf_free(&w);
        config_strv_free(argv);
        return r;
}

int config_split_environment(const char *line, char ***argv_out, size_t *argc_out)
{
        return config_split_command(line, argv_out, argc_out);
}

int config_split_command(const char *cmdline, char ***argv_out, size_t *argc_out)
{
        const char *why;
        if (!cmdline || !argv_out || !argc_out)
                return -EINVAL;
        return split_command(cmdline, argv_out, argc_out, &why);
}

/* ---- variables in command lines ---------------------------------------- */

/* What kairosd puts in the environment of each kind of command
 * (man/kairosd.8.scd, HANDLERS and NOTIFY); a variable kairosd leaves
 * unset (LANG, KAIROSCTL, KAIROS_NODE outside cluster mode) is still a
 * name the command line may use: it expands to nothing. */
static const char *const handler_vars[] = {
        "PATH", "LANG", "HOME", "USER", "LOGNAME", "KAIROSCTL",
        "KAIROS_MANDATE_ID", "KAIROS_PLAN_ID", "KAIROS_STEP_ID", "KAIROS_PHASE",
        "KAIROS_CYCLE", "KAIROS_IDEM_KEY", "KAIROS_SCHEDULE", "KAIROS_FIRED_AT",
        "KAIROS_GOAL", "KAIROS_ATTEMPT", "KAIROS_CONTROL_SOCKET", "KAIROS_NODE",
        "KAIROS_EPOCH", NULL,
};
static const char *const probe_vars[] = {
        "PATH", "LANG", "HOME", "USER", "LOGNAME", "KAIROSCTL",
        "KAIROS_MANDATE_ID", "KAIROS_PLAN_ID", "KAIROS_STEP_ID", "KAIROS_PHASE",
        "KAIROS_CYCLE", "KAIROS_IDEM_KEY", "KAIROS_SCHEDULE", "KAIROS_FIRED_AT",
        "KAIROS_GOAL", "KAIROS_ATTEMPT", "KAIROS_CONTROL_SOCKET", "KAIROS_NODE",
        "KAIROS_EPOCH", "KAIROS_PROBE", NULL,
};
static const char *const hook_vars[] = {
        "PATH", "LANG", "HOME", "USER", "LOGNAME", "KAIROSCTL",
        "KAIROS_EVENT", "KAIROS_MANDATE_ID", "KAIROS_SCHEDULE", "KAIROS_FIRED_AT",
        "KAIROS_STATUS", "KAIROS_REASON", "KAIROS_STEP_ID", "KAIROS_CONTROL_SOCKET",
        "KAIROS_ERROR_CLASS", "KAIROS_ERROR", "KAIROS_EXIT_STATUS", "KAIROS_EXIT_SIGNAL",
        "KAIROS_ATTEMPT", "KAIROS_STDERR", "KAIROS_EVIDENCE", "KAIROS_SHOW",
        "KAIROS_FOLDED", "KAIROS_SCHEDULES", /* an OnFailure= page of folded failures */
        "KAIROS_ERROR_CLASSES", "KAIROS_FIRST_MANDATE_ID", "KAIROS_LAST_MANDATE_ID", "KAIROS_LIST",
        NULL,
};

const char *const *config_command_vars(enum config_command_kind kind)
{
        switch (kind) {
        case CONFIG_COMMAND_HANDLER:
                return handler_vars;
        case CONFIG_COMMAND_PROBE:
                return probe_vars;
        case CONFIG_COMMAND_HOOK:
                return hook_vars;
        }
        return NULL;
}

/* Where the names come from: checking (names only: kairosd's of a kind,
 * and the NAME of each NAME=VALUE of env) or expanding (env's values). */
struct var_source {
        const char *const *names;       /* checking: kairosd's names; NULL: expanding */
        char *const *env;               /* "NAME=VALUE", NULL-terminated, or NULL */
        const char *kind_doc;           /* checking: for messages */
};

/* The value of NAME (n bytes) in a "NAME=VALUE" list, or NULL. */
static const char *env_value(char *const *env, const char *name, size_t n)
{
        for (size_t i = 0; env && env[i]; i++)
                if (strncmp(env[i], name, n) == 0 && env[i][n] == '=')
                        return env[i] + n + 1;
        return NULL;
}

/* 0 with the value in *ret (NULL: unset, which expands to nothing), or
 * -ENOENT for a name the command cannot have (checking only). */
static int var_lookup(const struct var_source *src, const char *name, size_t n,
                      const char **ret)
{
        *ret = env_value(src->env, name, n);
        if (!src->names || *ret)
                return 0;
        for (size_t i = 0; src->names[i]; i++)
                if (strlen(src->names[i]) == n && strncmp(src->names[i], name, n) == 0)
                        return 0;
        return -ENOENT;
}

static void why_unknown(const struct var_source *src, const char *ref, size_t n, char *why,
                        size_t len)
{
        kbuf_setf(why, len, "unknown variable %.*s: %s gets only the variables of kairosd(8), "
                "%s%s (write $$ for a literal $)", (int)(n > 80 ? 80 : n), ref,
                src->kind_doc, src->names == handler_vars ? "HANDLERS" :
                src->names == probe_vars ? "HANDLERS (and KAIROS_PROBE)" : "NOTIFY",
                src->names == hook_vars ? "" : ", and those of Environment=");
}

static int push_dup(char ***v, size_t *n, const char *s, size_t len)
{
        char *d = strndup(s, len);
        if (!d || strv_push(v, n, d) < 0) {
                free(d);
                return -ENOMEM;
        }
        return 0;
}

/* One word of a split command line, expanded as systemd does: the word
 * "$NAME" becomes the value split at white space (zero or more words),
 * "${NAME}" anywhere in a word its value as is, "$$" one "$", and any other
 * "$" stays (e.g. "$NAME" inside a word, for a shell: "sh -c 'echo $HOME'").
 * Appends to out.  -EINVAL (why says it) for "${" without "}" or with no
 * name in it, or a name src does not know; -ENOMEM. */
static int expand_word(const struct var_source *src, const char *w, char ***out, size_t *nout,
                       char *why, size_t why_len)
{
        const char *v;
        int r;
        if (w[0] == '$' && w[1] != '{' && w[1] != '$' && valid_env_name(w + 1, strlen(w + 1))) {
                if (var_lookup(src, w + 1, strlen(w + 1), &v) < 0) {
                        why_unknown(src, w, strlen(w), why, why_len);
                        return -EINVAL;
                }
                for (const char *s = v ? v : ""; *s;) {
                        size_t skip = strspn(s, " \t\n\r");
                        s += skip;
                        size_t n = strcspn(s, " \t\n\r");
                        if (n && (r = push_dup(out, nout, s, n)) < 0)
                                return r;
                        s += n;
                }
                return 0;
        }
        struct kbuf b = KBUF_INIT;
        r = kbuf_append(&b, "", 0); /* "" stays a word */
        for (const char *s = w; r == 0 && *s; s++) {
                if (s[0] != '$' || (s[1] != '$' && s[1] != '{')) {
                        r = kbuf_putc(&b, *s);
                        continue;
                }
                if (s[1] == '$') {
                        r = kbuf_putc(&b, '$');
                        s++;
                        continue;
                }
                const char *name = s + 2, *end = strchr(name, '}');
                if (!end) {
                        kbuf_setf(why, why_len, "\"${\" without \"}\" in \"%.80s\" (write $$ for "
                                "a literal $)", w);
                        r = -EINVAL;
                        break;
                }
                size_t n = (size_t)(end - name);
                if (!valid_env_name(name, n)) {
                        kbuf_setf(why, why_len, "\"%.*s\" is not a variable name (A-Z a-z 0-9 _, "
                                "not starting with a digit; no ${NAME:-default}; write $$ for a "
                                "literal $)", (int)(n + 3 > 80 ? 80 : n + 3), s);
                        r = -EINVAL;
                        break;
                }
                if (var_lookup(src, name, n, &v) < 0) {
                        why_unknown(src, s, n + 3, why, why_len);
                        r = -EINVAL;
                        break;
                }
                if (v)
                        r = kbuf_puts(&b, v);
                s = end;
        }
        if (r == 0) {
                char *word = kbuf_steal(&b);
                r = strv_push(out, nout, word);
                if (r < 0)
                        free(word);
        }
        kbuf_free(&b);
        return r;
}

static int expand_command(const struct var_source *src, const char *cmdline, char ***ret_argv,
                          size_t *ret_argc, char *why, size_t why_len)
{
        char **words = NULL, **out = NULL;
        size_t nwords = 0, nout = 0;
        const char *split_why;
        int r = split_command(cmdline, &words, &nwords, &split_why);
        if (r < 0) {
                if (r == -EINVAL)
                        kbuf_setf(why, why_len, "cannot split command line: %s", split_why);
                return r;
        }
        for (size_t i = 0; r == 0 && i < nwords; i++)
                r = expand_word(src, words[i], &out, &nout, why, why_len);
        if (r == 0 && !out && !(out = calloc(1, sizeof(*out))))
                r = -ENOMEM;
        config_strv_free(words);
        if (r < 0) {
                config_strv_free(out);
                return r;
        }
        *ret_argv = out;
        *ret_argc = nout;
        return 0;
}

int config_check_command_vars(const char *cmdline, enum config_command_kind kind,
                              char *const *environment, char *why, size_t why_len)
{
        const char *const *names = config_command_vars(kind);
        if (!cmdline || !names)
                return -EINVAL;
        struct var_source src = {
                .names = names, .env = environment,
                .kind_doc = kind == CONFIG_COMMAND_HOOK ? "a hook"
                          : kind == CONFIG_COMMAND_PROBE ? "a probe" : "a handler",
        };
        char **argv;
        size_t argc;
        int r = expand_command(&src, cmdline, &argv, &argc, why, why_len);
        if (r == 0)
                config_strv_free(argv);
        return r;
}

int config_expand_command(const char *cmdline, char *const *env, char ***ret_argv,
                          size_t *ret_argc, char *why, size_t why_len)
{
        if (!cmdline || !ret_argv || !ret_argc)
                return -EINVAL;
        struct var_source src = { .env = env };
        return expand_command(&src, cmdline, ret_argv, ret_argc, why, why_len);
}

/* ---- the tables -------------------------------------------------------- */

enum key_type {
        KT_STRING,      /* non-empty string */
        KT_OPT_STRING,  /* string; empty = unset (NULL) */
        KT_PATH,        /* absolute path, non-empty */
        KT_OPT_PATH,    /* absolute path; empty = unset */
        KT_BOOL,        /* bool */
        KT_UNSIGNED,    /* unsigned in [min, max] */
        KT_DURATION,    /* uint64_t seconds in [min, max] */
        KT_ENUM,        /* int: index into words */
        KT_ENV_LIST,    /* repeatable NAME=VALUE; empty resets */
        KT_PATH_LIST,   /* space-separated absolute paths, accumulating; empty resets */
        KT_COMMAND,     /* command line; empty = none */
        KT_LIMIT,       /* uint64_t through parse_limit; empty = unset (0) */
        KT_PHASE_SET,   /* unsigned bit set of phases, space-separated names; empty = none */
        KT_RETRY_ATTEMPTS, /* struct retry_policy: RetryAttempts= (0..100); empty = unset */
        KT_RETRY_BACKOFF,  /* ... RetryBackoffSec= (retry_parse_backoff); empty = unset */
        KT_RETRY_ON,       /* ... RetryOn= (retry_parse_on); empty = unset */
};

/* Extra check of a string value: NULL if fine, else a message in buf. */
typedef const char *(*value_check_fn)(const char *value, char *buf, size_t len);

struct key_def {
        const char *name;
        enum key_type type;
        size_t offset;
        size_t count_offset;            /* lists: the size_t element count */
        uint64_t min, max;              /* KT_UNSIGNED, KT_DURATION */
        const char *const *words;       /* KT_ENUM, NULL-terminated */
        value_check_fn check;
        int (*parse_limit)(const char *, uint64_t *); /* KT_LIMIT */
        const char *limit_form;         /* KT_LIMIT: for messages */
        bool required;                  /* a missing key is a file-level error */
        bool empty_is_set;              /* KT_COMMAND: an empty value stores "" (none here,
                                         * not "the default"), not NULL */
        bool narrow;                    /* KT_DURATION: stored as unsigned (max <= UINT_MAX) */
        int vars;                       /* KT_COMMAND: VARS_*, 1 + the config_command_kind
                                         * whose variables it may name */
};

struct section_def {
        const char *name;
        const struct key_def *keys;
        const char *const *removed;     /* NULL-terminated, or NULL */
        bool secret;                    /* may hold a password: messages never show a line */
};

struct file_kind {
        const struct section_def *sections; /* NULL-name terminated */
        const char *expected;               /* for "unknown section" messages */
};

static const char *check_socket_path(const char *v, char *buf, size_t len)
{
        if (strlen(v) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
                snprintf(buf, len, "path too long for a unix socket (at most %zu bytes)",
                         sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
                return buf;
        }
        return NULL;
}

static const char *check_cron(const char *v, char *buf, size_t len)
{
        struct cron_expr e;
        char why[256] = "";
        if (cron_parse(v, &e, why, sizeof(why)) < 0) {
                snprintf(buf, len, "invalid expression \"%s\": %s", v,
                         why[0] ? why : "rejected");
                return buf;
        }
        /* "0 0 31 2 *" parses but never fires: surely a mistake. */
        int64_t next;
        if (cron_next(&e, NULL, 0, &next) == -ENOENT) {
                snprintf(buf, len, "expression \"%s\" never matches any date", v);
                return buf;
        }
        return NULL;
}

static const char *check_time_zone(const char *v, char *buf, size_t len)
{
        struct cron_tz *tz = NULL;
        int r = cron_tz_load(v, &tz);
        if (r >= 0) {
                cron_tz_free(tz);
                return NULL;
        }
        if (r == -ENOENT) {
                snprintf(buf, len, "unknown time zone \"%s\"", v);
        } else if (r == -EINVAL) {
                snprintf(buf, len, "invalid time zone name \"%s\"", v);
        } else {
                char eb[128];
                snprintf(buf, len, "cannot load time zone \"%s\": %s", v,
                         errno_str(-r, eb, sizeof(eb)));
        }
        return buf;
}

#define DFIELD(f) offsetof(struct config, f)
#define VARS_HANDLER (1 + CONFIG_COMMAND_HANDLER)
#define VARS_PROBE (1 + CONFIG_COMMAND_PROBE)
#define VARS_HOOK (1 + CONFIG_COMMAND_HOOK)
#define SFIELD(f) offsetof(struct config_schedule, f)
#define RFIELD(i) (offsetof(struct config_schedule, retry) + (i) * sizeof(struct retry_policy))

static const char *const log_levels[] = {
        "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug", NULL,
};
static const char *const missed_words[] = { "skip", "catch_up_once", "catch_up_bounded", NULL };
static const char *const concurrency_words[] = { "queue", "allow", "reject", NULL };
static const char *const effects_via_words[] = { "none", "kairosctl", NULL };
static const char *const backend_words[] = { "files", "postgres", NULL };
_Static_assert(sizeof(enum config_backend) == sizeof(int), "enum stored as int");
_Static_assert(CONFIG_BACKEND_FILES == 0 && CONFIG_BACKEND_POSTGRES == 1,
               "backend_words in the order of enum config_backend");

#define NODE_NAME_MAX 63

static bool valid_node_name(const char *v)
{
        size_t n = strlen(v);
        if (n < 1 || n > NODE_NAME_MAX)
                return false;
        for (size_t i = 0; i < n; i++)
                if (!is_alpha(v[i]) && !is_digit(v[i]) && !strchr("._-", v[i]))
                        return false;
        return true;
}

static const char *check_node_name(const char *v, char *buf, size_t len)
{
        if (valid_node_name(v))
                return NULL;
        size_t n = strlen(v);
        if (n > NODE_NAME_MAX)
                snprintf(buf, len, "too long (%zu characters; a node name is 1 to %d of "
                         "A-Z a-z 0-9 . _ -)", n, NODE_NAME_MAX);
        else
                snprintf(buf, len, "\"%s\" is not a valid node name (1 to %d of "
                         "A-Z a-z 0-9 . _ -)", v, NODE_NAME_MAX);
        return buf;
}

static const struct key_def daemon_keys[] = {
        { .name = "StateDirectory", .type = KT_PATH, .offset = DFIELD(state_directory) },
        { .name = "ControlSocket", .type = KT_PATH, .offset = DFIELD(control_socket),
          .check = check_socket_path },
        { .name = "SocketGroup", .type = KT_STRING, .offset = DFIELD(socket_group) },
        { .name = "HandlerUser", .type = KT_OPT_STRING, .offset = DFIELD(handler_user) },
        { .name = "MaxConcurrentMandates", .type = KT_UNSIGNED,
          .offset = DFIELD(max_concurrent_mandates), .min = 1, .max = 1024 },
        { .name = "GracefulTimeoutSec", .type = KT_DURATION,
          .offset = DFIELD(graceful_timeout_sec), .min = 0, .max = CONFIG_DURATION_MAX },
        { .name = "LogLevel", .type = KT_ENUM, .offset = DFIELD(log_level), .words = log_levels },
        { .name = "MetricsFile", .type = KT_OPT_PATH, .offset = DFIELD(metrics_file) },
        { .name = "MetricsIntervalSec", .type = KT_DURATION,
          .offset = DFIELD(metrics_interval_sec), .min = 1, .max = 86400 },
        { .name = "KeepFinished", .type = KT_UNSIGNED, .offset = DFIELD(keep_finished),
          .min = 0, .max = 100000000 },
        { .name = "KeepFinishedSec", .type = KT_DURATION, .offset = DFIELD(keep_finished_sec),
          .min = 0, .max = CONFIG_DURATION_MAX },
        { .name = NULL },
};

static const struct key_def idempotency_keys[] = {
        { .name = "TTLSec", .type = KT_DURATION, .offset = DFIELD(idem_ttl_sec),
          .min = 1, .max = CONFIG_DURATION_MAX },
        { .name = "MaxEntries", .type = KT_UNSIGNED, .offset = DFIELD(idem_max_entries),
          .min = 1, .max = 10000000 },
        { .name = "WriteRoots", .type = KT_PATH_LIST, .offset = DFIELD(write_roots),
          .count_offset = DFIELD(nwrite_roots) },
        { .name = "MaxWriteBytes", .type = KT_LIMIT, .offset = DFIELD(max_write_bytes),
          .parse_limit = config_parse_bytes,
          .limit_form = "bytes with an optional K, M, G or T suffix, or infinity" },
        { .name = "ToolGraceSec", .type = KT_DURATION, .offset = DFIELD(tool_grace_sec),
          .min = 0, .max = CONFIG_DURATION_MAX },
        { .name = NULL },
};

static const struct key_def notify_keys[] = {
        { .name = "OnReview", .type = KT_COMMAND, .offset = DFIELD(on_review),
          .vars = VARS_HOOK },
        { .name = "OnFailure", .type = KT_COMMAND, .offset = DFIELD(on_failure),
          .vars = VARS_HOOK },
        { .name = NULL },
};

/* Cluster mode (docs/design.md §14).  The keys other than Backend= are only
 * valid with Backend=postgres: checked once every file is read
 * (cluster_finish), since a drop-in may set Backend=.  ConnectionString=
 * may hold a password: no message ever shows its value. */
static const struct key_def cluster_keys[] = {
        { .name = "Backend", .type = KT_ENUM, .offset = DFIELD(backend),
          .words = backend_words },
        { .name = "ConnectionString", .type = KT_OPT_STRING, .offset = DFIELD(cluster_conninfo) },
        { .name = "NodeName", .type = KT_OPT_STRING, .offset = DFIELD(node_name),
          .check = check_node_name },
        { .name = "LeaseSec", .type = KT_DURATION, .offset = DFIELD(lease_sec), .narrow = true,
          .min = 3, .max = 300 },
        { .name = NULL },
};
enum { CLUSTER_BACKEND, CLUSTER_CONNINFO, CLUSTER_NODE_NAME, CLUSTER_LEASE, CLUSTER_KEYS };

static const struct section_def main_sections[] = {
        { "Daemon", daemon_keys, NULL, false },
        { "Idempotency", idempotency_keys, NULL, false },
        { "Notify", notify_keys, NULL, false },
        { "Cluster", cluster_keys, NULL, true },
        { NULL, NULL, NULL, false },
};

static const struct key_def schedule_keys[] = {
        { .name = "Cron", .type = KT_STRING, .offset = SFIELD(cron), .check = check_cron,
          .required = true },
        { .name = "TimeZone", .type = KT_STRING, .offset = SFIELD(time_zone),
          .check = check_time_zone },
        { .name = "Enabled", .type = KT_BOOL, .offset = SFIELD(enabled) },
        { .name = "MissedPolicy", .type = KT_ENUM, .offset = SFIELD(missed_policy),
          .words = missed_words },
        { .name = "MaxCatchUpRuns", .type = KT_UNSIGNED, .offset = SFIELD(max_catch_up_runs),
          .min = 1, .max = MISSED_CATCH_UP_MAX },
        { .name = "StaleAfter", .type = KT_DURATION, .offset = SFIELD(stale_after_sec),
          .min = 0, .max = CONFIG_DURATION_MAX },
        { .name = "MissedGraceSec", .type = KT_DURATION, .offset = SFIELD(missed_grace_sec),
          .min = 0, .max = MISSED_GRACE_MAX_SEC },
        { .name = "Concurrency", .type = KT_ENUM, .offset = SFIELD(concurrency),
          .words = concurrency_words },
        { .name = NULL },
};

static const struct key_def mandate_keys[] = {
        { .name = "Goal", .type = KT_OPT_STRING, .offset = SFIELD(goal) },
        { .name = "MaxCycles", .type = KT_UNSIGNED, .offset = SFIELD(max_cycles),
          .min = 1, .max = 10 },
        { .name = NULL },
};
/* Keys kairos once accepted and that never had an effect: an error, never ignored. */
static const char *const mandate_removed[] = { "CheckpointEvery", "RiskBudget", NULL };

static const struct key_def exec_keys[] = {
        { .name = "Observe", .type = KT_COMMAND, .offset = SFIELD(exec[0]),
          .vars = VARS_HANDLER },
        { .name = "Orient", .type = KT_COMMAND, .offset = SFIELD(exec[1]),
          .vars = VARS_HANDLER },
        { .name = "Decide", .type = KT_COMMAND, .offset = SFIELD(exec[2]),
          .vars = VARS_HANDLER },
        { .name = "Act", .type = KT_COMMAND, .offset = SFIELD(exec[3]),
          .vars = VARS_HANDLER },
        { .name = "Reflect", .type = KT_COMMAND, .offset = SFIELD(exec[4]),
          .vars = VARS_HANDLER },
        { .name = "TimeoutSec", .type = KT_DURATION, .offset = SFIELD(timeout_sec),
          .min = 1, .max = CONFIG_DURATION_MAX },
        { .name = "Environment", .type = KT_ENV_LIST, .offset = SFIELD(environment),
          .count_offset = SFIELD(nenvironment) },
        { .name = "WorkingDirectory", .type = KT_OPT_PATH, .offset = SFIELD(working_directory) },
        { .name = "Probe", .type = KT_COMMAND, .offset = SFIELD(probe), .vars = VARS_PROBE },
        { .name = "MemoryMax", .type = KT_LIMIT, .offset = SFIELD(memory_max),
          .parse_limit = config_parse_bytes,
          .limit_form = "bytes with an optional K, M, G or T suffix, or infinity" },
        { .name = "TasksMax", .type = KT_LIMIT, .offset = SFIELD(tasks_max),
          .parse_limit = config_parse_tasks, .limit_form = "a number of tasks, or infinity" },
        { .name = "CPUQuota", .type = KT_LIMIT, .offset = SFIELD(cpu_quota_pct),
          .parse_limit = config_parse_percent, .limit_form = "a percentage such as 50% or 200%" },
        { .name = "ProbeTimeoutSec", .type = KT_DURATION, .offset = SFIELD(probe_timeout_sec),
          .min = 1, .max = CONFIG_DURATION_MAX },
        { .name = "Effects", .type = KT_PHASE_SET, .offset = SFIELD(effects) },
        { .name = "EffectsVia", .type = KT_ENUM, .offset = SFIELD(effects_via),
          .words = effects_via_words },
        /* the step retry policy: RFIELD(CONFIG_PHASES) is the schedule's own,
         * parsed into a scratch policy, then given to each phase that does
         * not set the key itself (parse_schedule) */
        { .name = "RetryAttempts", .type = KT_RETRY_ATTEMPTS, .offset = RFIELD(CONFIG_PHASES) },
        { .name = "RetryBackoffSec", .type = KT_RETRY_BACKOFF, .offset = RFIELD(CONFIG_PHASES) },
        { .name = "RetryOn", .type = KT_RETRY_ON, .offset = RFIELD(CONFIG_PHASES) },
        { .name = "ObserveRetryAttempts", .type = KT_RETRY_ATTEMPTS, .offset = RFIELD(0) },
        { .name = "ObserveRetryBackoffSec", .type = KT_RETRY_BACKOFF, .offset = RFIELD(0) },
        { .name = "ObserveRetryOn", .type = KT_RETRY_ON, .offset = RFIELD(0) },
        { .name = "OrientRetryAttempts", .type = KT_RETRY_ATTEMPTS, .offset = RFIELD(1) },
        { .name = "OrientRetryBackoffSec", .type = KT_RETRY_BACKOFF, .offset = RFIELD(1) },
        { .name = "OrientRetryOn", .type = KT_RETRY_ON, .offset = RFIELD(1) },
        { .name = "DecideRetryAttempts", .type = KT_RETRY_ATTEMPTS, .offset = RFIELD(2) },
        { .name = "DecideRetryBackoffSec", .type = KT_RETRY_BACKOFF, .offset = RFIELD(2) },
        { .name = "DecideRetryOn", .type = KT_RETRY_ON, .offset = RFIELD(2) },
        { .name = "ActRetryAttempts", .type = KT_RETRY_ATTEMPTS, .offset = RFIELD(3) },
        { .name = "ActRetryBackoffSec", .type = KT_RETRY_BACKOFF, .offset = RFIELD(3) },
        { .name = "ActRetryOn", .type = KT_RETRY_ON, .offset = RFIELD(3) },
        { .name = "ReflectRetryAttempts", .type = KT_RETRY_ATTEMPTS, .offset = RFIELD(4) },
        { .name = "ReflectRetryBackoffSec", .type = KT_RETRY_BACKOFF, .offset = RFIELD(4) },
        { .name = "ReflectRetryOn", .type = KT_RETRY_ON, .offset = RFIELD(4) },
        { .name = NULL },
};

static const struct key_def schedule_notify_keys[] = {
        { .name = "OnReview", .type = KT_COMMAND, .offset = SFIELD(on_review),
          .empty_is_set = true, .vars = VARS_HOOK },
        { .name = "OnFailure", .type = KT_COMMAND, .offset = SFIELD(on_failure),
          .empty_is_set = true, .vars = VARS_HOOK },
        { .name = NULL },
};

static const struct section_def schedule_sections[] = {
        { "Schedule", schedule_keys, NULL, false },
        { "Mandate", mandate_keys, mandate_removed, false },
        { "Exec", exec_keys, NULL, false },
        { "Notify", schedule_notify_keys, NULL, false },
        { NULL, NULL, NULL, false },
};

static const struct file_kind main_kind = {
        main_sections, "[Daemon], [Idempotency], [Notify] or [Cluster]",
};
static const struct file_kind schedule_kind = {
        schedule_sections, "[Schedule], [Mandate], [Exec] or [Notify]",
};

/* ---- the parser -------------------------------------------------------- */

/* Where a [Cluster] key got its value: the last valid, non-empty assignment
 * over the main file and its drop-ins (file NULL: never, or reset). */
struct key_origin {
        char *file;
        unsigned line;
};

struct parser {
        const char *file;
        const struct file_kind *kind;
        void *target;
        struct errctx *ec;
        struct errctx *wc;              /* warnings, or NULL: not collected */
        int section;                    /* index, or -1 none yet, -2 unknown */
        unsigned seen[MAX_SECTIONS];    /* line of the first header, 0 = not seen */
        uint64_t assigned[MAX_SECTIONS]; /* bit i: keys[i] was given (even if bad) */
        struct key_origin *cluster;     /* [CLUSTER_KEYS] (main files), or NULL */
        /* the command keys whose variables are checked once the whole file
         * is read (Environment= may come after them: Observe= ... Reflect=,
         * Probe=), with their last line */
        struct {
                const struct key_def *k;
                unsigned line;
        } late[CONFIG_PHASES + 1];
        size_t nlate;
};

__attribute__((format(printf, 4, 5)))
static void perr(struct parser *p, unsigned line, const char *key, const char *fmt, ...)
{
        char what[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(what, sizeof(what), fmt, ap);
        va_end(ap);
        if (key)
                err_add(p->ec, "%s:%u: %s=: %s", p->file, line, key, what);
        else
                err_add(p->ec, "%s:%u: %s", p->file, line, what);
}

__attribute__((format(printf, 4, 5)))
static void pwarn(struct parser *p, unsigned line, const char *key, const char *fmt, ...)
{
        if (!p->wc)
                return;
        char what[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(what, sizeof(what), fmt, ap);
        va_end(ap);
        err_add(p->wc, "%s:%u: %s=: %s", p->file, line, key, what);
}

static void join_words(const char *const *w, char *buf, size_t len)
{
        size_t off = 0;
        buf[0] = '\0';
        for (size_t i = 0; w[i] && off < len; i++) {
                int n = snprintf(buf + off, len - off, "%s%s", i ? ", " : "", w[i]);
                if (n < 0)
                        break;
                off += (size_t)n;
        }
}

/* One NAME=VALUE word of an Environment= line. */
static void set_env_word(struct parser *p, unsigned line, const struct key_def *k, char *base,
                         const char *v)
{
        char ***list = (char ***)(base + k->offset);
        size_t *n = (size_t *)(base + k->count_offset);
        const char *eq = strchr(v, '=');
        size_t nlen = eq ? (size_t)(eq - v) : 0;
        if (!eq || !valid_env_name(v, nlen)) {
                perr(p, line, k->name, "\"%s\" is not a valid assignment (expected NAME=VALUE, "
                     "NAME of A-Z a-z 0-9 _ not starting with a digit; quote a value with "
                     "blanks: \"NAME=a b\")", v);
                return;
        }
        if (nlen >= 7 && strncmp(v, "KAIROS_", 7) == 0) {
                perr(p, line, k->name, "\"%.*s\" is reserved (KAIROS_* variables are set by "
                     "kairosd)", (int)nlen, v);
                return;
        }
        char *d = strdup(v);
        if (!d) {
                p->ec->oom = true;
                return;
        }
        for (size_t i = 0; i < *n; i++) {
                if (strncmp((*list)[i], v, nlen + 1) == 0) {
                        free((*list)[i]);
                        (*list)[i] = d;
                        return;
                }
        }
        if (strv_push(list, n, d) < 0) {
                free(d);
                p->ec->oom = true;
        }
}

/* Environment=: several NAME=VALUE words on a line, quoted as systemd does. */
static void set_env(struct parser *p, unsigned line, const struct key_def *k, char *base,
                    const char *v)
{
        char **words;
        size_t nwords;
        const char *why;
        int r = split_command(v, &words, &nwords, &why);
        if (r == -ENOMEM) {
                p->ec->oom = true;
                return;
        }
        if (r < 0) {
                perr(p, line, k->name, "cannot split \"%s\": %s", v, why);
                return;
        }
        for (size_t i = 0; i < nwords && !p->ec->oom; i++)
                set_env_word(p, line, k, base, words[i]);
        config_strv_free(words);
}

static void set_path_list(struct parser *p, unsigned line, const struct key_def *k,
                          char *base, const char *v)
{
        char ***list = (char ***)(base + k->offset);
        size_t *n = (size_t *)(base + k->count_offset);
        char **add = NULL;
        size_t nadd = 0;
        bool bad = false;

        for (const char *s = v; *s;) {
                while (is_blank(*s))
                        s++;
                if (!*s)
                        break;
                const char *e = s;
                while (*e && !is_blank(*e))
                        e++;
                char *w = strndup(s, (size_t)(e - s));
                if (!w || strv_push(&add, &nadd, w) < 0) {
                        free(w);
                        p->ec->oom = true;
                        goto out;
                }
                const char *why = path_problem(w);
                if (why) {
                        perr(p, line, k->name, "\"%s\" %s", w, why);
                        bad = true;
                }
                s = e;
        }
        if (bad)
                goto out;
        for (size_t i = 0; i < nadd; i++) {
                bool dup = false;
                for (size_t j = 0; j < *n && !dup; j++)
                        dup = strcmp((*list)[j], add[i]) == 0;
                if (dup)
                        continue;
                if (strv_push(list, n, add[i]) < 0) {
                        p->ec->oom = true;
                        goto out;
                }
                add[i] = NULL;
        }
out:
        kmem_free_strv(add, nadd);
}

/* An argument like {kairos:{done:true}} from Reflect=/bin/echo {"kairos":...}:
 * JSON whose double quotes the command-line quoting removed. */
static void warn_eaten_quotes(struct parser *p, unsigned line, const char *key,
                              const char *cmdline, char **argv, size_t argc)
{
        if (!strchr(cmdline, '"'))
                return;
        for (size_t i = 1; i < argc; i++) {
                const char *a = argv[i];
                if ((a[0] != '{' && a[0] != '[') || strchr(a, '"') || !strchr(a, ':'))
                        continue;
                pwarn(p, line, key, "argument %zu '%s' looks like JSON whose double quotes were "
                      "removed by the command-line quoting; put it in single quotes, e.g. "
                      "'{\"kairos\":{\"done\":true}}'", i, a);
                return;
        }
}

/* "act reflect": a set of phase names (each at most once). */
static void set_phase_set(struct parser *p, unsigned line, const struct key_def *k, char *base,
                          const char *v)
{
        unsigned set = 0;
        const char *w = v;
        while (*w) {
                size_t n = strcspn(w, " \t");
                if (n == 0) {
                        w++;
                        continue;
                }
                int phase = -1;
                for (int i = 0; i < CONFIG_PHASES; i++)
                        if (strlen(config_phase_name(i)) == n &&
                            strncmp(config_phase_name(i), w, n) == 0)
                                phase = i;
                if (phase < 0) {
                        perr(p, line, k->name,
                             "\"%.*s\" is not a phase (observe orient decide act reflect)",
                             (int)(n > 64 ? 64 : n), w);
                        return;
                }
                if (set & (1u << phase)) {
                        perr(p, line, k->name, "%s is listed twice", config_phase_name(phase));
                        return;
                }
                set |= 1u << phase;
                w += n;
        }
        *(unsigned *)(base + k->offset) = set;
}

static void check_vars(struct parser *p, unsigned line, const struct key_def *k,
                       const char *v, char *const *environment)
{
        char why[512];
        int r = config_check_command_vars(v, (enum config_command_kind)(k->vars - 1),
                                          environment, why, sizeof(why));
        if (r == -ENOMEM)
                p->ec->oom = true;
        else if (r < 0)
                perr(p, line, k->name, "%s", why);
}

static void assign(struct parser *p, unsigned line, const struct key_def *k, const char *v)
{
        char *base = p->target;
        char buf[512];
        const char *why;
        uint64_t u;
        int r;

        /* empty assignments */
        if (v[0] == '\0') {
                switch (k->type) {
                case KT_OPT_STRING:
                case KT_OPT_PATH:
                case KT_COMMAND: {
                        char **f = (char **)(base + k->offset);
                        free(*f);
                        *f = NULL;
                        if (k->empty_is_set && set_str(f, "") < 0)
                                p->ec->oom = true;
                        return;
                }
                case KT_LIMIT:
                        *(uint64_t *)(base + k->offset) = 0;
                        return;
                case KT_ENV_LIST:
                case KT_PATH_LIST:
                        strv_reset((char ***)(base + k->offset), (size_t *)(base + k->count_offset));
                        return;
                case KT_PHASE_SET:
                        *(unsigned *)(base + k->offset) = 0;
                        return;
                case KT_RETRY_ATTEMPTS:
                case KT_RETRY_BACKOFF:
                case KT_RETRY_ON: {
                        struct retry_policy *rp = (struct retry_policy *)(base + k->offset);
                        struct retry_policy def;
                        retry_policy_init(&def);
                        if (k->type == KT_RETRY_ATTEMPTS) {
                                rp->attempts = def.attempts;
                                rp->set_attempts = false;
                        } else if (k->type == KT_RETRY_BACKOFF) {
                                rp->first_ms = def.first_ms;
                                rp->factor_pct = def.factor_pct;
                                rp->max_ms = def.max_ms;
                                rp->jitter_pct = def.jitter_pct;
                                rp->set_backoff = false;
                        } else {
                                rp->on = def.on;
                                memset(rp->exit_codes, 0, sizeof rp->exit_codes);
                                rp->set_on = false;
                        }
                        return;
                }
                default:
                        perr(p, line, k->name, "empty value (a value is required)");
                        return;
                }
        }

        switch (k->type) {
        case KT_PATH:
        case KT_OPT_PATH:
                why = path_problem(v);
                if (why) {
                        perr(p, line, k->name, "\"%s\" %s", v, why);
                        return;
                }
                __attribute__((fallthrough));
        case KT_STRING:
        case KT_OPT_STRING:
                if (k->check && (why = k->check(v, buf, sizeof(buf)))) {
                        perr(p, line, k->name, "%s", why);
                        return;
                }
                if (set_str((char **)(base + k->offset), v) < 0)
                        p->ec->oom = true;
                return;
        case KT_BOOL: {
                bool b;
                if (parse_bool(v, &b) < 0) {
                        perr(p, line, k->name, "\"%s\" is not a boolean "
                             "(use yes/no, true/false, on/off, 1/0)", v);
                        return;
                }
                *(bool *)(base + k->offset) = b;
                return;
        }
        case KT_UNSIGNED: {
                const char *e;
                r = parse_u64(v, &e, &u);
                if (r == -EINVAL || *e != '\0') {
                        perr(p, line, k->name, "\"%s\" is not a number", v);
                        return;
                }
                if (r == -ERANGE || u < k->min || u > k->max) {
                        perr(p, line, k->name, "%s out of range %llu..%llu", v,
                             (unsigned long long)k->min, (unsigned long long)k->max);
                        return;
                }
                *(unsigned *)(base + k->offset) = (unsigned)u;
                return;
        }
        case KT_DURATION:
                r = config_parse_duration(v, &u);
                if (r == -EINVAL) {
                        perr(p, line, k->name, "\"%s\" is not a valid duration "
                             "(e.g. 30, 30s, 5min, 2h, 1d, 1h30min)", v);
                        return;
                }
                if (r < 0 || u < k->min || u > k->max) {
                        perr(p, line, k->name, "%s out of range %llu..%llu seconds", v,
                             (unsigned long long)k->min, (unsigned long long)k->max);
                        return;
                }
                if (k->narrow)
                        *(unsigned *)(base + k->offset) = (unsigned)u;
                else
                        *(uint64_t *)(base + k->offset) = u;
                return;
        case KT_LIMIT:
                r = k->parse_limit(v, &u);
                if (r < 0) {
                        perr(p, line, k->name, "\"%s\" is %s (expected %s)", v,
                             r == -ERANGE ? "too large" : "not valid", k->limit_form);
                        return;
                }
                *(uint64_t *)(base + k->offset) = u;
                return;
        case KT_ENUM:
                for (int i = 0; k->words[i]; i++) {
                        if (strcmp(k->words[i], v) == 0) {
                                *(int *)(base + k->offset) = i;
                                return;
                        }
                }
                join_words(k->words, buf, sizeof(buf));
                perr(p, line, k->name, "\"%s\" is not one of: %s", v, buf);
                return;
        case KT_ENV_LIST:
                set_env(p, line, k, base, v);
                return;
        case KT_PHASE_SET:
                set_phase_set(p, line, k, base, v);
                return;
        case KT_RETRY_ATTEMPTS: {
                struct retry_policy *rp = (struct retry_policy *)(base + k->offset);
                const char *e;
                r = parse_u64(v, &e, &u);
                if (r < 0 || *e != '\0' || u > RETRY_ATTEMPTS_MAX) {
                        perr(p, line, k->name, "\"%s\" is not a number of retries 0..%d", v,
                             RETRY_ATTEMPTS_MAX);
                        return;
                }
                rp->attempts = (unsigned)u;
                rp->set_attempts = true;
                return;
        }
        case KT_RETRY_BACKOFF: {
                struct retry_policy *rp = (struct retry_policy *)(base + k->offset);
                if (retry_parse_backoff(v, rp, &why) < 0)
                        perr(p, line, k->name, "\"%s\": %s", v, why);
                return;
        }
        case KT_RETRY_ON: {
                struct retry_policy *rp = (struct retry_policy *)(base + k->offset);
                if (retry_parse_on(v, rp, buf, sizeof buf) < 0)
                        perr(p, line, k->name, "\"%s\" is not failure, exit_status, signal, "
                             "oom, spawn_error, output_too_large, timeout or an exit status "
                             "1..255 (a cancel is never retried)", buf);
                return;
        }
        case KT_PATH_LIST:
                set_path_list(p, line, k, base, v);
                return;
        case KT_COMMAND: {
                char **argv;
                size_t argc;
                r = split_command(v, &argv, &argc, &why);
                if (r == -ENOMEM) {
                        p->ec->oom = true;
                        return;
                }
                if (r < 0) {
                        perr(p, line, k->name, "cannot split command line: %s", why);
                        return;
                }
                bool empty = argc == 0 || argv[0][0] == '\0';
                if (!empty)
                        warn_eaten_quotes(p, line, k->name, v, argv, argc);
                config_strv_free(argv);
                if (empty) {
                        perr(p, line, k->name, "empty command name");
                        return;
                }
                if (set_str((char **)(base + k->offset), v) < 0) {
                        p->ec->oom = true;
                        return;
                }
                if (k->vars == VARS_HOOK) {
                        check_vars(p, line, k, v, NULL);
                        return;
                }
                size_t i = 0;
                while (i < p->nlate && p->late[i].k != k)
                        i++;
                /* (one slot per such key of exec_keys: never full) */
                if (i < sizeof(p->late) / sizeof(p->late[0])) {
                        p->late[i].k = k;
                        p->late[i].line = line;
                        p->nlate += i == p->nlate;
                }
                return;
        }
        }
}

/* The variables of the command keys recorded by assign, against the
 * schedule's final Environment=. */
static void check_late_vars(struct parser *p, char *const *environment)
{
        for (size_t i = 0; i < p->nlate; i++) {
                const char *v = *(char **)((char *)p->target + p->late[i].k->offset);
                if (v && *v)
                        check_vars(p, p->late[i].line, p->late[i].k, v, environment);
        }
}

/* What a `kairosctl tool run` in an effects phase's command line must not
 * pass: a value that changes from one attempt of the step to the next.
 * After a crash the step runs again and makes the same call with the same
 * key, which then carries other arguments: refused (exit 65, mismatch);
 * without --key the content key differs and the effect runs twice.  The
 * names kairosd sets per attempt (KAIROS_ATTEMPT; KAIROS_EPOCH and
 * KAIROS_NODE change when another node takes a mandate over) and what a
 * shell makes new each time. */
static const char *const attempt_vars[] = {
        "KAIROS_ATTEMPT", "KAIROS_EPOCH", "KAIROS_NODE", "RANDOM", "SRANDOM",
        "EPOCHSECONDS", "EPOCHREALTIME", "BASHPID", NULL,
};
static const char *const attempt_subst[] = { "$(date", "`date", NULL };

static bool is_name_char(char c)
{
        return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
               c == '_';
}

/* The first per-attempt value in w[0, n) ("$KAIROS_ATTEMPT", "$(date"), or NULL. */
static const char *attempt_value(const char *w, size_t n, char *buf, size_t len)
{
        for (size_t i = 0; i < n; i++) {
                if (w[i] != '$' && w[i] != '`')
                        continue;
                for (size_t k = 0; attempt_subst[k]; k++) {
                        size_t m = strlen(attempt_subst[k]);
                        if (m <= n - i && memcmp(w + i, attempt_subst[k], m) == 0 &&
                            (m == n - i || !is_name_char(w[i + m])))
                                return attempt_subst[k];
                }
                if (w[i] != '$')
                        continue;
                size_t j = i + 1 + (i + 1 < n && w[i + 1] == '{');
                for (size_t k = 0; attempt_vars[k]; k++) {
                        size_t m = strlen(attempt_vars[k]);
                        if (m <= n - j && memcmp(w + j, attempt_vars[k], m) == 0 &&
                            (j + m == n || !is_name_char(w[j + m]))) {
                                snprintf(buf, len, "$%s", attempt_vars[k]);
                                return buf;
                        }
                }
        }
        return NULL;
}

/* Is the word w[0, n) kairosctl: a path ending in it, or $KAIROSCTL? */
static bool is_kairosctl(const char *w, size_t n)
{
        while (n && (*w == '"' || *w == '\'')) /* (inside a shell script) */
                w++, n--;
        while (n && (w[n - 1] == '"' || w[n - 1] == '\''))
                n--;
        if ((n == 10 && memcmp(w, "$KAIROSCTL", 10) == 0) ||
            (n == 12 && memcmp(w, "${KAIROSCTL}", 12) == 0))
                return true;
        return n >= 9 && memcmp(w + n - 9, "kairosctl", 9) == 0 &&
               (n == 9 || w[n - 10] == '/');
}

/* The next word of t from *pos (blank-separated; a shell separator - a
 * newline, ; & | - is a word of its own): its start and length, 0 at the end. */
static size_t next_word(const char *t, size_t *pos, const char **w)
{
        size_t i = *pos;
        while (t[i] == ' ' || t[i] == '\t')
                i++;
        *w = t + i;
        size_t n = 0;
        if (strchr("\n;&|", t[i]) && t[i])
                n = 1;
        else
                while (t[i + n] && !strchr(" \t\n;&|", t[i + n]))
                        n++;
        *pos = i + n;
        return n;
}

/* An effects phase's command line (a whole line, or a shell script in one
 * of its arguments) that calls `kairosctl tool run` with a per-attempt
 * value among its arguments: warned, with the value. */
static void warn_attempt_args(struct parser *p, unsigned line, const char *key,
                              const char *cmdline)
{
        char **argv;
        size_t argc;
        const char *why;
        struct kbuf t = KBUF_INIT;
        int r = split_command(cmdline, &argv, &argc, &why);
        if (r < 0) {
                p->ec->oom |= r == -ENOMEM; /* (a line that cannot be split was an error) */
                return;
        }
        /* the words joined, each $$ one $ (as when the command starts) */
        for (size_t i = 0; i < argc; i++) {
                if (i && kbuf_putc(&t, ' ') < 0)
                        goto oom;
                for (const char *c = argv[i]; *c; c++) {
                        if (c[0] == '$' && c[1] == '$')
                                c++;
                        if (kbuf_putc(&t, *c) < 0)
                                goto oom;
                }
        }
        size_t pos = 0, n;
        const char *w;
        while (t.data && (n = next_word(t.data, &pos, &w)) > 0) {
                if (!is_kairosctl(w, n))
                        continue;
                /* global options, then "tool run" */
                size_t at = pos;
                while ((n = next_word(t.data, &at, &w)) > 0 && w[0] == '-')
                        if (n == 8 && memcmp(w, "--socket", 8) == 0)
                                next_word(t.data, &at, &w);
                if (n != 4 || memcmp(w, "tool", 4) != 0 || next_word(t.data, &at, &w) != 3 ||
                    memcmp(w, "run", 3) != 0)
                        continue;
                char buf[32];
                while ((n = next_word(t.data, &at, &w)) > 0 && !strchr("\n;&|", w[0])) {
                        const char *v = attempt_value(w, n, buf, sizeof buf);
                        if (!v)
                                continue;
                        pwarn(p, line, key,
                              "'kairosctl tool run' gets %s, which changes from one attempt "
                              "of the step to the next: the run after a crash makes the same "
                              "call with other arguments, refused as a mismatch (exit 65), or "
                              "without --key runs the effect again; pass only what every "
                              "attempt passes alike (e.g. $KAIROS_IDEM_KEY)", v);
                        goto out;
                }
                pos = at;
        }
        goto out;
oom:
        p->ec->oom = true;
out:
        kbuf_free(&t);
        config_strv_free(argv);
}

/* The Effects= phases' commands, once Effects= is known. */
static void warn_effect_commands(struct parser *p, const struct config_schedule *sc)
{
        for (size_t i = 0; i < p->nlate; i++) {
                const struct key_def *k = p->late[i].k;
                for (int ph = 0; ph < CONFIG_PHASES; ph++) {
                        if (k->offset != offsetof(struct config_schedule, exec[ph]) ||
                            !(sc->effects & (1u << ph)) || !sc->exec[ph] || !*sc->exec[ph])
                                continue;
                        warn_attempt_args(p, p->late[i].line, k->name, sc->exec[ph]);
                }
        }
}

static void rtrim(char *s)
{
        size_t n = strlen(s);
        while (n > 0 && is_blank(s[n - 1]))
                s[--n] = '\0';
}

static char *ltrim(char *s)
{
        while (is_blank(*s))
                s++;
        return s;
}

static void section_header(struct parser *p, unsigned line, char *s)
{
        size_t n = strlen(s);
        if (n < 3 || s[n - 1] != ']' || strpbrk(s + 1, "[]") != s + n - 1) {
                perr(p, line, NULL, "malformed section header \"%s\"", s);
                p->section = -2;
                return;
        }
        s[n - 1] = '\0';
        const char *name = s + 1;
        const struct section_def *sec = p->kind->sections;
        for (int i = 0; sec[i].name; i++) {
                if (strcmp(sec[i].name, name) != 0)
                        continue;
                if (p->seen[i]) {
                        perr(p, line, NULL, "duplicate section [%s] (first at line %u)",
                             name, p->seen[i]);
                } else {
                        p->seen[i] = line;
                }
                p->section = i;
                return;
        }
        perr(p, line, NULL, "unknown section [%s] (expected %s)", name, p->kind->expected);
        p->section = -2;
}

/* A key as the tables spell them: letters and digits, at most 64. */
static bool plain_key(const char *k)
{
        size_t n = 0;
        for (; k[n]; n++)
                if (!is_alpha(k[n]) && !is_digit(k[n]))
                        return false;
        return n >= 1 && n <= 64;
}

static void note_origin(struct parser *p, struct key_origin *o, unsigned line, bool set)
{
        free(o->file);
        *o = (struct key_origin){ 0 };
        if (!set)
                return;
        o->file = strdup(p->file);
        if (!o->file)
                p->ec->oom = true;
        o->line = line;
}

static void process_line(struct parser *p, unsigned line, char *s)
{
        if (s[0] == '[') {
                section_header(p, line, s);
                return;
        }
        char *eq = strchr(s, '=');
        if (!eq) {
                if (p->section >= 0 && p->kind->sections[p->section].secret)
                        perr(p, line, NULL, "missing '=' (expected Key=Value or [Section]; "
                             "the line is not shown: [%s] may hold a password)",
                             p->kind->sections[p->section].name);
                else
                        perr(p, line, NULL, "missing '=' in \"%s\" (expected Key=Value or "
                             "[Section])", s);
                return;
        }
        *eq = '\0';
        rtrim(s);
        const char *key = s;
        const char *value = ltrim(eq + 1);
        if (key[0] == '\0') {
                perr(p, line, NULL, "missing key before '='");
                return;
        }
        if (p->section == -1) {
                perr(p, line, key, "assignment outside of any section");
                return;
        }
        if (p->section == -2)
                return; /* the header is already reported */
        const struct section_def *sec = &p->kind->sections[p->section];
        for (size_t i = 0; sec->keys[i].name; i++) {
                if (strcmp(sec->keys[i].name, key) == 0) {
                        p->assigned[p->section] |= UINT64_C(1) << i;
                        size_t nerr = p->ec->n;
                        assign(p, line, &sec->keys[i], value);
                        if (p->cluster && sec->keys == cluster_keys && p->ec->n == nerr)
                                note_origin(p, &p->cluster[i], line, value[0] != '\0');
                        return;
                }
        }
        for (size_t i = 0; sec->removed && sec->removed[i]; i++) {
                if (strcmp(sec->removed[i], key) == 0) {
                        perr(p, line, key, "not supported (it never had an effect and was "
                             "removed; delete the line)");
                        return;
                }
        }
        if (sec->secret && !plain_key(key)) {
                /* e.g. a connection URI alone on its line: its "key" is
                 * everything up to its first '=', password included */
                perr(p, line, NULL, "not a key of [%s] (the line is not shown: [%s] may "
                     "hold a password)", sec->name, sec->name);
                return;
        }
        perr(p, line, key, "unknown key in [%s]", sec->name);
}

static bool raw_is_blank(const char *s, size_t n)
{
        for (size_t i = 0; i < n; i++) {
                if (!is_blank(s[i]))
                        return false;
        }
        return true;
}

static bool raw_is_comment(const char *s, size_t n)
{
        size_t i = 0;
        while (i < n && is_blank(s[i]))
                i++;
        return i < n && (s[i] == '#' || s[i] == ';');
}

static bool raw_has_control(const char *s, size_t n)
{
        for (size_t i = 0; i < n; i++) {
                unsigned char c = (unsigned char)s[i];
                if ((c < 0x20 && c != '\t') || c == 0x7f)
                        return true;
        }
        return false;
}

static void kbuf_rtrim_blank(struct kbuf *b)
{
        while (b->len > 0 && is_blank(b->data[b->len - 1]))
                b->data[--b->len] = '\0';
}

/* Run the parser over text.  Lines end in LF or CRLF.  A trailing backslash
 * joins the next line (the backslash becomes a space); comment lines inside
 * a continuation are skipped, as systemd does.  Errors name the first line. */
static void parse_text(struct parser *p, const char *text, size_t len)
{
        struct kbuf lb = KBUF_INIT;
        unsigned lineno = 0, start = 0;
        bool cont = false, bad = false;
        size_t pos = 0;

        while (pos < len) {
                const char *s = text + pos;
                const char *nl = memchr(s, '\n', len - pos);
                size_t n = nl ? (size_t)(nl - s) : len - pos;
                pos += n + (nl ? 1 : 0);
                lineno++;
                if (n > 0 && s[n - 1] == '\r')
                        n--;

                if (!cont) {
                        if (raw_is_blank(s, n) || raw_is_comment(s, n))
                                continue;
                        start = lineno;
                        bad = false;
                        kbuf_reset(&lb);
                } else if (raw_is_comment(s, n)) {
                        continue;
                }
                if (raw_has_control(s, n)) {
                        perr(p, lineno, NULL, "control character in line");
                        bad = true;
                }
                if (kbuf_append(&lb, s, n) < 0 || kbuf_reserve(&lb, 0) < 0) {
                        p->ec->oom = true;
                        goto out;
                }
                kbuf_rtrim_blank(&lb);
                if (lb.len > 0 && lb.data[lb.len - 1] == '\\') {
                        lb.data[lb.len - 1] = ' ';
                        cont = true;
                        continue;
                }
                cont = false;
                if (!bad)
                        process_line(p, start, ltrim(lb.data));
        }
        if (cont && !bad) {
                kbuf_rtrim_blank(&lb);
                process_line(p, start, ltrim(lb.data));
        }
out:
        kbuf_free(&lb);
}

static void check_required(struct parser *p)
{
        const struct section_def *sec = p->kind->sections;
        for (int s = 0; sec[s].name; s++) {
                for (size_t i = 0; sec[s].keys[i].name; i++) {
                        if (sec[s].keys[i].required && !(p->assigned[s] & (UINT64_C(1) << i)))
                                err_add(p->ec, "%s: %s=: missing (required in [%s])", p->file,
                                        sec[s].keys[i].name, sec[s].name);
                }
        }
}

/* ---- files ------------------------------------------------------------- */

/* 0, or 1 for a symlink to /dev/null (masked: empty text), or -errno. */
static int read_file(const char *path, char **data, size_t *len)
{
        /* O_NONBLOCK: a FIFO must not hang us; it is refused below. */
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd < 0)
                return -errno;
        struct kbuf b = KBUF_INIT;
        struct stat st;
        int r = 0;
        if (fstat(fd, &st) < 0) {
                r = -errno;
                close(fd);
                return r;
        }
        if (S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3)) {
                /* a symlink to /dev/null masks a file, as in systemd */
                close(fd);
                *data = strdup("");
                *len = 0;
                return *data ? 1 : -ENOMEM;
        }
        if (!S_ISREG(st.st_mode)) {
                close(fd);
                return S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
        }
        for (;;) {
                if (b.len > CONFIG_FILE_MAX) {
                        r = -EFBIG;
                        break;
                }
                r = kbuf_reserve(&b, 65536);
                if (r < 0)
                        break;
                ssize_t got = read(fd, b.data + b.len, 65536);
                if (got < 0) {
                        if (errno == EINTR)
                                continue;
                        r = -errno;
                        break;
                }
                if (got == 0)
                        break;
                b.len += (size_t)got;
                b.data[b.len] = '\0';
        }
        close(fd);
        if (r < 0) {
                kbuf_free(&b);
                return r;
        }
        *len = b.len;
        *data = kbuf_steal(&b);
        return 0;
}

static void file_error(struct errctx *ec, const char *path, int r)
{
        char eb[128];
        if (r == -EINVAL)
                err_add(ec, "%s: cannot read: not a regular file", path);
        else
                err_add(ec, "%s: cannot read: %s", path, errno_str(-r, eb, sizeof(eb)));
}

static int cmp_str(const void *a, const void *b)
{
        return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The *.conf entries of dir, sorted.  A missing directory gives none. */
static int list_conf(const char *dir, struct errctx *ec, char ***out, size_t *nout)
{
        char **v = NULL;
        size_t n = 0;
        *out = NULL;
        *nout = 0;
        DIR *d = opendir(dir);
        if (!d) {
                if (errno == ENOENT)
                        return 0;
                char eb[128];
                err_add(ec, "%s: cannot read directory: %s", dir,
                        errno_str(errno, eb, sizeof(eb)));
                return 0;
        }
        struct dirent *de;
        errno = 0;
        while ((de = readdir(d))) {
                size_t l = strlen(de->d_name);
                if (l < 5 || strcmp(de->d_name + l - 5, ".conf") != 0)
                        continue;
                char *s = strdup(de->d_name);
                if (!s || strv_push(&v, &n, s) < 0) {
                        free(s);
                        config_strv_free(v);
                        closedir(d);
                        ec->oom = true;
                        return -ENOMEM;
                }
        }
        if (errno != 0) {
                char eb[128];
                err_add(ec, "%s: cannot read directory: %s", dir,
                        errno_str(errno, eb, sizeof(eb)));
        }
        closedir(d);
        if (n)
                qsort(v, n, sizeof(*v), cmp_str);
        *out = v;
        *nout = n;
        return 0;
}

static char *path_join(const char *a, const char *b)
{
        struct kbuf k = KBUF_INIT;
        size_t la = strlen(a);
        bool slash = la > 0 && a[la - 1] == '/';
        if (kbuf_printf(&k, "%s%s%s", a, slash ? "" : "/", b) < 0) {
                kbuf_free(&k);
                return NULL;
        }
        return kbuf_steal(&k);
}

/* ---- schedules --------------------------------------------------------- */

void config_schedule_clear(struct config_schedule *s)
{
        if (!s)
                return;
        FREE_ALL(s->name, s->path, s->cron, s->time_zone, s->goal);
        for (int i = 0; i < CONFIG_PHASES; i++)
                free(s->exec[i]);
        config_strv_free(s->environment);
        free(s->working_directory);
        free(s->probe);
        config_errors_free(&s->warnings);
        free(s->on_review);
        free(s->on_failure);
        memset(s, 0, sizeof(*s));
}

static int schedule_defaults(struct config_schedule *s, const char *name, const char *path)
{
        memset(s, 0, sizeof(*s));
        s->name = strdup(name);
        s->path = strdup(path);
        s->time_zone = strdup("UTC");
        s->enabled = true;
        s->missed_policy = MISSED_SKIP;
        s->max_catch_up_runs = 5;
        s->stale_after_sec = 48 * 3600;
        s->concurrency = CONCURRENCY_QUEUE;
        s->missed_grace_sec = 300;
        s->max_cycles = 1;
        s->timeout_sec = 300;
        s->probe_timeout_sec = 30;
        s->effects = 1u << 3; /* act */
        s->effects_via = EFFECTS_VIA_NONE;
        for (int i = 0; i <= CONFIG_PHASES; i++)
                retry_policy_init(&s->retry[i]);
        if (!s->name || !s->path || !s->time_zone)
                return -ENOMEM;
        return 0;
}

static int parse_schedule(const char *name, const char *path, const char *text, size_t len,
                          struct config_schedule *out, struct errctx *ec)
{
        size_t before = ec->n;
        int r = schedule_defaults(out, name, path);
        if (r < 0)
                goto fail;
        if (!config_valid_schedule_name(name))
                err_add(ec, "%s: invalid schedule name \"%s\" (1 to 64 of A-Z a-z 0-9 _ -)",
                        path, name);

        struct errctx wc = { .errs = &out->warnings };
        struct parser p = {
                .file = path, .kind = &schedule_kind, .target = out, .ec = ec, .wc = &wc,
                .section = -1,
        };
        parse_text(&p, text, len);
        if (!ec->oom) {
                check_late_vars(&p, out->environment);
                warn_effect_commands(&p, out);
        }
        if (wc.oom)
                ec->oom = true;
        if (ec->oom) {
                r = -ENOMEM;
                goto fail;
        }
        check_required(&p);
        for (int i = 0; i < CONFIG_PHASES; i++)
                retry_policy_inherit(&out->retry[i], &out->retry[CONFIG_PHASES]);
        if (!out->goal) {
                out->goal = strdup(name);
                if (!out->goal)
                        ec->oom = true;
        }
        if (ec->oom) {
                r = -ENOMEM;
                goto fail;
        }
        if (ec->n != before) {
                r = -EINVAL;
                goto fail;
        }
        return 0;
fail:
        config_schedule_clear(out);
        return r;
}

int config_parse_schedule(const char *name, const char *path, const char *text, size_t len,
                          struct config_schedule *out, struct config_errors *errs)
{
        if (!name || !path || (!text && len) || !out)
                return -EINVAL;
        struct errctx ec = { .errs = errs };
        return parse_schedule(name, path, text ? text : "", len, out, &ec);
}

static int cmp_schedule(const void *a, const void *b)
{
        const struct config_schedule *x = a, *y = b;
        return strcmp(x->name, y->name);
}

static int cmp_broken(const void *a, const void *b)
{
        const struct config_broken *x = a, *y = b;
        return strcmp(x->name, y->name);
}

static void broken_clear(struct config_broken *b)
{
        free(b->name);
        free(b->path);
        config_errors_free(&b->errors);
        memset(b, 0, sizeof(*b));
}

const struct config_schedule *config_find_schedule(const struct config *c, const char *name)
{
        for (size_t i = 0; c && name && i < c->nschedules; i++)
                if (c->schedules[i].name && strcmp(c->schedules[i].name, name) == 0)
                        return &c->schedules[i];
        return NULL;
}

const struct config_broken *config_find_broken(const struct config *c, const char *name)
{
        for (size_t i = 0; c && name && i < c->nbroken; i++)
                if (strcmp(c->broken[i].name, name) == 0)
                        return &c->broken[i];
        return NULL;
}

int config_retain_broken(struct config *new_cfg, struct config *old_cfg)
{
        if (!new_cfg || !old_cfg)
                return -EINVAL;
        size_t add = 0;
        for (size_t i = 0; i < new_cfg->nbroken; i++)
                if (config_find_schedule(old_cfg, new_cfg->broken[i].name))
                        add++;
        if (add == 0)
                return 0;
        struct config_schedule *v = realloc(new_cfg->schedules,
                                            (new_cfg->nschedules + add) * sizeof(*v));
        if (!v)
                return -ENOMEM;
        new_cfg->schedules = v;
        for (size_t i = 0; i < new_cfg->nbroken; i++) {
                struct config_schedule *o =
                        (struct config_schedule *)config_find_schedule(old_cfg,
                                                                       new_cfg->broken[i].name);
                if (!o)
                        continue;
                v[new_cfg->nschedules] = *o;
                v[new_cfg->nschedules].retained = true;
                new_cfg->nschedules++;
                /* taken over: the old entry stays, empty (no name) */
                memset(o, 0, sizeof(*o));
        }
        if (new_cfg->nschedules > 1)
                qsort(new_cfg->schedules, new_cfg->nschedules, sizeof(*v), cmp_schedule);
        return (int)add;
}

static bool same_opt_str(const char *a, const char *b)
{
        return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

static void swap_str(char **a, char **b)
{
        char *t = *a;
        *a = *b;
        *b = t;
}

int config_keep_cluster(struct config *new_cfg, struct config *old_cfg, char *ret_keys,
                        size_t keys_len)
{
        if (!new_cfg || !old_cfg || (!ret_keys && keys_len))
                return -EINVAL;
        bool changed[CLUSTER_KEYS] = {
                [CLUSTER_BACKEND] = new_cfg->backend != old_cfg->backend,
                [CLUSTER_CONNINFO] = !same_opt_str(new_cfg->cluster_conninfo,
                                                   old_cfg->cluster_conninfo),
                [CLUSTER_NODE_NAME] = !same_opt_str(new_cfg->node_name, old_cfg->node_name),
                [CLUSTER_LEASE] = new_cfg->lease_sec != old_cfg->lease_sec,
        };
        new_cfg->backend = old_cfg->backend;
        swap_str(&new_cfg->cluster_conninfo, &old_cfg->cluster_conninfo);
        swap_str(&new_cfg->node_name, &old_cfg->node_name);
        new_cfg->lease_sec = old_cfg->lease_sec;
        int n = 0;
        size_t off = 0;
        if (keys_len)
                ret_keys[0] = '\0';
        for (int i = 0; i < CLUSTER_KEYS; i++) {
                if (!changed[i])
                        continue;
                if (off < keys_len) {
                        int w = snprintf(ret_keys + off, keys_len - off, "%s%s=",
                                         n ? ", " : "", cluster_keys[i].name);
                        off = w < 0 ? keys_len : off + (size_t)w;
                }
                n++;
        }
        return n;
}

/* ---- the whole configuration ------------------------------------------- */

void config_free(struct config *c)
{
        if (!c)
                return;
        FREE_ALL(c->config_path, c->schedules_dir, c->state_directory, c->control_socket,
                 c->socket_group, c->handler_user, c->metrics_file);
        config_strv_free(c->write_roots);
        free(c->on_review);
        free(c->on_failure);
        if (c->cluster_conninfo) /* it may hold a password */
                explicit_bzero(c->cluster_conninfo, strlen(c->cluster_conninfo));
        free(c->cluster_conninfo);
        free(c->node_name);
        for (size_t i = 0; i < c->nschedules; i++)
                config_schedule_clear(&c->schedules[i]);
        free(c->schedules);
        for (size_t i = 0; i < c->nbroken; i++)
                broken_clear(&c->broken[i]);
        free(c->broken);
        free(c);
}

static struct config *config_new(void)
{
        struct config *c = calloc(1, sizeof(*c));
        if (!c)
                return NULL;
        c->state_directory = strdup("/var/lib/kairos");
        c->control_socket = strdup("/run/kairos/control.sock");
        c->socket_group = strdup("kairos");
        c->max_concurrent_mandates = 4;
        c->graceful_timeout_sec = 120;
        c->log_level = 6; /* info */
        c->metrics_interval_sec = 15;
        c->keep_finished = 1000;
        c->keep_finished_sec = 30 * 86400;
        c->idem_ttl_sec = 86400;
        c->idem_max_entries = 10000;
        c->max_write_bytes = CONFIG_MAX_WRITE_BYTES_DEFAULT;
        c->tool_grace_sec = CONFIG_TOOL_GRACE_SEC_DEFAULT;
        c->backend = CONFIG_BACKEND_FILES;
        c->lease_sec = 10;
        if (!c->state_directory || !c->control_socket || !c->socket_group) {
                config_free(c);
                return NULL;
        }
        return c;
}

int config_builtin(const char *state_dir, struct config **out)
{
        if (!state_dir || !state_dir[0] || !out)
                return -EINVAL;
        struct config *c = config_new();
        if (!c)
                return -ENOMEM;
        char *sock = path_join(state_dir, "control.sock");
        if (!sock || set_str(&c->state_directory, state_dir) < 0) {
                free(sock);
                config_free(c);
                return -ENOMEM;
        }
        free(c->control_socket);
        c->control_socket = sock;
        if (strlen(sock) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
                config_free(c);
                return -ENAMETOOLONG;
        }
        *out = c;
        return 0;
}

/* Parse the text of one main or drop-in file into c, noting in cluster
 * where the [Cluster] keys are set. */
static void parse_main_text(struct config *c, const char *path, const char *text, size_t len,
                            struct errctx *ec, struct key_origin *cluster)
{
        struct parser p = {
                .file = path, .kind = &main_kind, .target = c, .ec = ec, .section = -1,
                .cluster = cluster,
        };
        parse_text(&p, text, len);
}

static void origins_free(struct key_origin *o)
{
        for (int i = 0; i < CLUSTER_KEYS; i++)
                free(o[i].file);
}

/* Once the main file and its drop-ins are read: the [Cluster] keys as a
 * whole.  ConnectionString=, NodeName= and LeaseSec= only go with
 * Backend=postgres, which needs ConnectionString= and a build with
 * PostgreSQL; NodeName= defaults to the host name.  Messages name keys,
 * never the connection string. */
static void cluster_finish(struct config *c, const struct key_origin *o, struct errctx *ec)
{
        if (c->backend == CONFIG_BACKEND_FILES) {
                for (int i = CLUSTER_CONNINFO; i < CLUSTER_KEYS; i++)
                        if (o[i].file)
                                err_add(ec, "%s:%u: %s=: only valid with Backend=postgres (the "
                                        "backend is files)", o[i].file, o[i].line,
                                        cluster_keys[i].name);
                return;
        }
        const struct key_origin *b = &o[CLUSTER_BACKEND];
#ifndef KAIROS_HAVE_POSTGRES
        err_add(ec, "%s:%u: Backend=: kairosd was built without PostgreSQL support "
                "(-Dpostgres=enabled)", b->file, b->line);
#endif
        if (!c->cluster_conninfo)
                err_add(ec, "%s:%u: Backend=: postgres needs ConnectionString= (a libpq "
                        "connection string or URI) in [Cluster]", b->file, b->line);
        if (!c->node_name) {
                char host[256] = "";
                if (gethostname(host, sizeof(host) - 1) < 0) {
                        char eb[128];
                        err_add(ec, "%s:%u: Backend=: no NodeName= and the host name cannot be "
                                "read (%s); set NodeName=", b->file, b->line,
                                errno_str(errno, eb, sizeof(eb)));
                } else if (!valid_node_name(host)) {
                        err_add(ec, "%s:%u: Backend=: no NodeName= and the host name \"%.*s\" "
                                "is not a valid node name (1 to %d of A-Z a-z 0-9 . _ -); set "
                                "NodeName=", b->file, b->line, 64, host, NODE_NAME_MAX);
                } else if (set_str(&c->node_name, host) < 0) {
                        ec->oom = true;
                }
        }
}

/* Parse one main or drop-in file into c.  Returns -errno if unreadable. */
static int load_main_file(struct config *c, const char *path, struct errctx *ec,
                          struct key_origin *cluster)
{
        char *text;
        size_t len;
        int r = read_file(path, &text, &len);
        if (r < 0) {
                if (r == -ENOMEM)
                        ec->oom = true;
                else
                        file_error(ec, path, r);
                return r;
        }
        parse_main_text(c, path, text, len, ec, cluster);
        free(text);
        return 0;
}

static void load_dropins(struct config *c, const char *path, struct errctx *ec,
                         struct key_origin *cluster)
{
        char *dir = NULL, **names = NULL;
        size_t n = 0;
        struct kbuf k = KBUF_INIT;
        if (kbuf_printf(&k, "%s.d", path) < 0) {
                ec->oom = true;
                goto out;
        }
        dir = kbuf_steal(&k);
        if (list_conf(dir, ec, &names, &n) < 0)
                goto out;
        for (size_t i = 0; i < n && !ec->oom; i++) {
                char *f = path_join(dir, names[i]);
                if (!f) {
                        ec->oom = true;
                        break;
                }
                load_main_file(c, f, ec, cluster);
                free(f);
        }
out:
        kbuf_free(&k);
        config_strv_free(names);
        free(dir);
}

static char *schedules_dir_of(const char *path)
{
        const char *slash = strrchr(path, '/');
        struct kbuf k = KBUF_INIT;
        int r;
        if (!slash)
                r = kbuf_puts(&k, "schedules.d");
        else
                r = kbuf_printf(&k, "%.*s/schedules.d", (int)(slash - path), path);
        if (r < 0) {
                kbuf_free(&k);
                return NULL;
        }
        return kbuf_steal(&k);
}

/* A schedule file with errors: recorded in c->broken with them (taken over). */
static void add_broken(struct config *c, const char *name, const char *path,
                       struct config_errors *errs, struct errctx *ec)
{
        struct config_broken *b = &c->broken[c->nbroken];
        b->name = strdup(name);
        b->path = strdup(path);
        if (!b->name || !b->path) {
                broken_clear(b);
                config_errors_free(errs);
                ec->oom = true;
                return;
        }
        b->errors = *errs;
        *errs = (struct config_errors){ 0 };
        c->nbroken++;
}

static void load_schedules(struct config *c, struct errctx *ec)
{
        char **names = NULL;
        size_t n = 0;
        if (list_conf(c->schedules_dir, ec, &names, &n) < 0 || n == 0)
                goto out;
        c->schedules = calloc(n, sizeof(*c->schedules));
        c->broken = calloc(n, sizeof(*c->broken));
        if (!c->schedules || !c->broken) {
                ec->oom = true;
                goto out;
        }
        for (size_t i = 0; i < n && !ec->oom; i++) {
                char *f = path_join(c->schedules_dir, names[i]);
                char *name = strndup(names[i], strlen(names[i]) - 5);
                char *text = NULL;
                size_t len = 0;
                /* each file's errors on their own: a broken file is skipped */
                struct config_errors ferrs = { 0 };
                struct errctx fec = { .errs = &ferrs };
                int r = (!f || !name) ? -ENOMEM : read_file(f, &text, &len);
                if (r == -ENOMEM) {
                        fec.oom = true;
                } else if (r < 0) {
                        if (!config_valid_schedule_name(name))
                                err_add(&fec, "%s: invalid schedule name \"%s\" "
                                        "(1 to 64 of A-Z a-z 0-9 _ -)", f, name);
                        file_error(&fec, f, r);
                } else if (r == 1) {
                        /* masked with a symlink to /dev/null: no schedule */
                } else if (parse_schedule(name, f, text, len,
                                          &c->schedules[c->nschedules], &fec) == 0) {
                        c->nschedules++;
                }
                if (fec.oom)
                        ec->oom = true;
                else if (fec.n > 0)
                        add_broken(c, name, f, &ferrs, ec);
                config_errors_free(&ferrs);
                FREE_ALL(text, name, f);
        }
        if (c->nschedules > 1)
                qsort(c->schedules, c->nschedules, sizeof(*c->schedules), cmp_schedule);
        if (c->nbroken > 1)
                qsort(c->broken, c->nbroken, sizeof(*c->broken), cmp_broken);
out:
        config_strv_free(names);
}

/* The configuration at path: its main file (or, text given, that text for
 * it and nothing else read), its drop-ins, its schedules unless main_only. */
static int load(const char *path, const char *text, size_t len, const char *state_dir,
                bool main_only, struct config **out, struct config_errors *errs)
{
        if (!path || !out || (!text && (!path[0] || (state_dir && !state_dir[0]))))
                return -EINVAL;
        *out = NULL;
        struct errctx ec = { .errs = errs };
        struct config *c = config_new();
        if (!c)
                return -ENOMEM;
        c->config_path = strdup(path);
        if (!text)
                c->schedules_dir = schedules_dir_of(path);
        if (!c->config_path || (!text && !c->schedules_dir)) {
                config_free(c);
                return -ENOMEM;
        }
        struct key_origin cluster[CLUSTER_KEYS] = { 0 };
        int rmain = 0;
        if (text)
                parse_main_text(c, path, text, len, &ec, cluster);
        else
                rmain = load_main_file(c, path, &ec, cluster);
        if (!ec.oom && !text)
                load_dropins(c, path, &ec, cluster);
        if (!ec.oom && rmain == 0)
                cluster_finish(c, cluster, &ec);
        origins_free(cluster);
        if (!ec.oom && !main_only)
                load_schedules(c, &ec);
        if (!ec.oom && state_dir && set_str(&c->state_directory, state_dir) < 0)
                ec.oom = true;

        if (ec.oom) {
                config_free(c);
                return -ENOMEM;
        }
        if (ec.n > 0) {
                /* every error of every file: the broken schedules' too */
                for (size_t i = 0; i < c->nbroken && !ec.oom; i++)
                        for (size_t k = 0; k < c->broken[i].errors.n; k++)
                                err_add(&ec, "%s", c->broken[i].errors.msgs[k]);
                config_free(c);
                if (ec.oom)
                        return -ENOMEM;
                return rmain < 0 ? rmain : -EINVAL;
        }
        *out = c;
        return 0;
}

int config_load(const char *path, const char *state_dir, struct config **out,
                struct config_errors *errs)
{
        return load(path, NULL, 0, state_dir, false, out, errs);
}

int config_load_main_only(const char *path, const char *state_dir, struct config **out,
                          struct config_errors *errs)
{
        return load(path, NULL, 0, state_dir, true, out, errs);
}

int config_parse_main(const char *path, const char *text, size_t len, struct config **out,
                      struct config_errors *errs)
{
        if (!text && len)
                return -EINVAL;
        return load(path, text ? text : "", len, NULL, true, out, errs);
}
