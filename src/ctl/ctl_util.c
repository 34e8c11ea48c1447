/* SPDX-License-Identifier: MIT */
/* kairosctl: option parsing, messages, file reading and output helpers
 * shared by every command. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "kairos/kjson.h"
#include "kairos/kio.h"
#include "kairos/kbuf.h"

/* "kairosctl: MESSAGE" and end on stderr */
static void say(const char *end, const char *fmt, va_list ap)
{
        fputs("kairosctl: ", stderr);
        vfprintf(stderr, fmt, ap);
        fputs(end, stderr);
}

int ctl_usage_error(const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        say(" (see kairosctl --help)\n", fmt, ap);
        va_end(ap);
        return CTL_EXIT_USAGE;
}

int ctl_error(int status, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        say("\n", fmt, ap);
        va_end(ap);
        return status;
}

int ctl_file_error(const char *path, int err)
{
        if (err < 0)
                err = -err;
        fputs("kairosctl: ", stderr);
        ctl_put_safe(stderr, strcmp(path, "-") == 0 ? "(stdin)" : path);
        fprintf(stderr, ": %s\n", strerror(err));
        return CTL_EXIT_NOINPUT;
}

int ctl_errno_error(const char *what, int r)
{
        return ctl_error(r == -ENOMEM ? CTL_EXIT_OSERR : CTL_EXIT_SOFTWARE, "%s: %s", what,
                         strerror(r < 0 ? -r : r));
}

int ctl_not_implemented(const char *cmd, bool online)
{
        if (online)
                fprintf(stderr, "kairosctl: %s needs the daemon (not yet implemented)\n", cmd);
        else
                fprintf(stderr, "kairosctl: %s is not yet implemented\n", cmd);
        return CTL_EXIT_USAGE;
}

static const struct ctl_option *find_option(const struct ctl_option *opts, const char *name,
                                            size_t n)
{
        for (; opts && opts->name; opts++)
                if (strlen(opts->name) == n && strncmp(opts->name, name, n) == 0)
                        return opts;
        return NULL;
}

int ctl_parse_options(const char *cmd, int argc, char **argv, const struct ctl_option *opts,
                      int *npos)
{
        int pos = 0;
        bool only_pos = false;

        for (int i = 0; i < argc; i++) {
                const char *a = argv[i];
                if (only_pos || a[0] != '-' || a[1] == '\0') {
                        argv[pos++] = argv[i];
                        continue;
                }
                if (strcmp(a, "--") == 0) {
                        only_pos = true;
                        continue;
                }
                if (a[1] != '-')
                        return ctl_usage_error("%s: unknown option '%s'", cmd, a);
                const char *name = a + 2;
                const char *eq = strchr(name, '=');
                size_t n = eq ? (size_t)(eq - name) : strlen(name);
                const struct ctl_option *opt = find_option(opts, name, n);
                if (!opt)
                        return ctl_usage_error("%s: unknown option '--%.*s'", cmd, (int)n, name);
                if (!opt->has_arg) {
                        if (eq)
                                return ctl_usage_error("%s: option '--%s' takes no value", cmd,
                                                       opt->name);
                        *opt->flag = true;
                        continue;
                }
                if (eq) {
                        *opt->value = eq + 1;
                } else {
                        if (i + 1 >= argc)
                                return ctl_usage_error("%s: option '--%s' needs a value", cmd,
                                                       opt->name);
                        *opt->value = argv[++i];
                }
        }
        *npos = pos;
        return 0;
}

int ctl_read_file(const char *path, char **data, size_t *len)
{
        if (strcmp(path, "-") == 0)
                return kio_read_fd(STDIN_FILENO, 0, 0, data, len);
        return kio_read_file(path, 0, 0, data, len);
}

void ctl_put_safe(FILE *f, const char *s)
{
        if (!s) {
                fputc('-', f);
                return;
        }
        const unsigned char *p = (const unsigned char *)s;
        size_t n = strlen(s);
        while (n > 0) {
                if (*p >= 0x80) {
                        size_t l = utf8_seq_len(p, n);
                        /* C1 controls (U+0080..U+009F) are escaped too */
                        if (l > 0 && !(l == 2 && p[0] == 0xc2 && p[1] < 0xa0)) {
                                fwrite(p, 1, l, f);
                                p += l;
                                n -= l;
                                continue;
                        }
                } else if (*p >= 0x20 && *p != 0x7f && *p != '\\') {
                        /* a run of plain ASCII at once (10,000-row tables) */
                        size_t run = 1;
                        while (run < n && p[run] >= 0x20 && p[run] < 0x7f && p[run] != '\\')
                                run++;
                        fwrite(p, 1, run, f);
                        p += run;
                        n -= run;
                        continue;
                }
                if (*p == '\\')
                        fputs("\\\\", f);
                else
                        fprintf(f, "\\x%02x", *p);
                p++;
                n--;
        }
}

void ctl_put_safe_lines(FILE *f, const char *s, const char *indent)
{
        if (!s) {
                fputc('-', f);
                return;
        }
        size_t n = strlen(s);
        while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r'))
                n--; /* no empty last line */
        for (;;) {
                const char *nl = memchr(s, '\n', n);
                size_t len = nl ? (size_t)(nl - s) : n;
                size_t keep = len > 0 && s[len - 1] == '\r' ? len - 1 : len;
                char *line = strndup(s, keep);
                ctl_put_safe(f, line ? line : "?");
                free(line);
                if (!nl)
                        break;
                fputc('\n', f);
                fputs(indent, f);
                s = nl + 1;
                n -= len + 1;
        }
}

json_t *ctl_json_str(const char *s)
{
        json_t *v;

        if (!s)
                return json_null();
        v = json_string(s);
        return v ? v : json_null();
}

json_t *ctl_json_raw(const char *text)
{
        json_t *v;

        if (!text)
                return json_null();
        v = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
        return v ? v : ctl_json_str(text);
}

/* A string as jansson dumps it (no JSON_ENSURE_ASCII, no JSON_ESCAPE_SLASH). */
static int kjson_dump_string(struct kbuf *b, const char *p, size_t n)
{
        int r = kbuf_putc(b, '"');
        size_t run = 0;
        for (size_t i = 0; r == 0 && i <= n; i++) {
                unsigned char c = i < n ? (unsigned char)p[i] : 0;
                if (i < n && c >= 0x20 && c != '"' && c != '\\') {
                        run++;
                        continue;
                }
                if (run)
                        r = kbuf_append(b, p + i - run, run);
                run = 0;
                if (r < 0 || i == n)
                        break;
                switch (c) {
                case '"': r = kbuf_puts(b, "\\\""); break;
                case '\\': r = kbuf_puts(b, "\\\\"); break;
                case '\b': r = kbuf_puts(b, "\\b"); break;
                case '\f': r = kbuf_puts(b, "\\f"); break;
                case '\n': r = kbuf_puts(b, "\\n"); break;
                case '\r': r = kbuf_puts(b, "\\r"); break;
                case '\t': r = kbuf_puts(b, "\\t"); break;
                default: r = kbuf_printf(b, "\\u%04X", c); break;
                }
        }
        return r < 0 ? r : kbuf_putc(b, '"');
}

/* The buffer's text out to f once it holds 64 KiB: a 3 MB document is
 * printed through a buffer of that size, not built whole first. */
static int dump_flush(struct kbuf *b, FILE *f)
{
        if (b->len < 65536)
                return 0;
        bool ok = fwrite(b->data, 1, b->len, f) == b->len;
        kbuf_reset(b);
        return ok ? 0 : -EIO;
}

static int kjson_dump(struct kbuf *b, FILE *f, const struct kjson *v, size_t depth)
{
        static const char *const lit[] = { [KJSON_NULL] = "null", [KJSON_FALSE] = "false",
                                           [KJSON_TRUE] = "true" };
        bool obj = v->type == KJSON_OBJECT;
        size_t n;
        int r = 0;

        switch (v->type) {
        case KJSON_NULL:
        case KJSON_FALSE:
        case KJSON_TRUE:
                return kbuf_puts(b, lit[v->type]);
        case KJSON_NUMBER:
                return kbuf_append(b, v->u.num.text, v->u.num.len);
        case KJSON_STRING:
                return kjson_dump_string(b, v->u.str.ptr, v->u.str.len);
        case KJSON_RAW:
                return kbuf_append(b, v->u.raw.text, v->u.raw.len);
        case KJSON_ARRAY:
        case KJSON_OBJECT:
                break;
        }
        n = obj ? v->u.obj.n : v->u.arr.n;
        if (n == 0)
                return kbuf_puts(b, obj ? "{}" : "[]");
        r = kbuf_putc(b, obj ? '{' : '[');
        for (size_t i = 0; r == 0 && i < n; i++) {
                r = kbuf_puts(b, i ? ",\n" : "\n");
                r = r < 0 ? r : kbuf_printf(b, "%*s", (int)(2 * (depth + 1)), "");
                if (r == 0 && obj) {
                        const struct kjson_member *m = &v->u.obj.members[i];
                        r = kjson_dump_string(b, m->key, m->key_len);
                        r = r < 0 ? r : kbuf_puts(b, ": ");
                        r = r < 0 ? r : kjson_dump(b, f, m->value, depth + 1);
                } else if (r == 0) {
                        r = kjson_dump(b, f, v->u.arr.items[i], depth + 1);
                }
                r = r < 0 ? r : dump_flush(b, f);
        }
        if (r == 0 && depth)
                r = kbuf_printf(b, "\n%*s", (int)(2 * depth), "");
        else if (r == 0)
                r = kbuf_putc(b, '\n');
        return r < 0 ? r : kbuf_putc(b, obj ? '}' : ']');
}

int ctl_kjson_print(const struct kjson *v)
{
        struct kbuf b = KBUF_INIT;
        int r = kjson_dump(&b, stdout, v, 0);
        if (r == 0)
                r = kbuf_putc(&b, '\n');
        if (r == -EIO) {
                kbuf_free(&b);
                return CTL_EXIT_IOERR;
        }
        if (r < 0) {
                kbuf_free(&b);
                return ctl_error(CTL_EXIT_OSERR, "out of memory");
        }
        bool ok = fwrite(b.data, 1, b.len, stdout) == b.len;
        kbuf_free(&b);
        return ok ? 0 : CTL_EXIT_IOERR;
}

json_t *ctl_kjson_to_json(const struct kjson *v)
{
        json_t *o = NULL;
        switch (v->type) {
        case KJSON_NULL:
                return json_null();
        case KJSON_FALSE:
                return json_false();
        case KJSON_TRUE:
                return json_true();
        case KJSON_NUMBER:
                o = json_loadb(v->u.num.text, v->u.num.len, JSON_DECODE_ANY, NULL);
                if (!o) /* beyond 64 bits, or beyond double range (a real cannot be inf) */
                        o = json_real(strtod(v->u.num.text, NULL));
                return o ? o : json_stringn_nocheck(v->u.num.text, v->u.num.len);
        case KJSON_STRING:
                return json_stringn_nocheck(v->u.str.ptr, v->u.str.len);
        case KJSON_RAW:
                return json_loadb(v->u.raw.text, v->u.raw.len, JSON_DECODE_ANY, NULL);
        case KJSON_ARRAY:
                o = json_array();
                for (size_t i = 0; o && i < v->u.arr.n; i++) {
                        json_t *item = ctl_kjson_to_json(v->u.arr.items[i]);
                        if (!item || json_array_append_new(o, item) < 0) {
                                json_decref(o);
                                return NULL;
                        }
                }
                return o;
        case KJSON_OBJECT:
                o = json_object();
                for (size_t i = 0; o && i < v->u.obj.n; i++) {
                        const struct kjson_member *m = &v->u.obj.members[i];
                        json_t *item = ctl_kjson_to_json(m->value);
                        if (!item || json_object_setn_new_nocheck(o, m->key, m->key_len,
                                                                  item) < 0) {
                                json_decref(o);
                                return NULL;
                        }
                }
                return o;
        }
        return NULL;
}

int ctl_json_print(json_t *v)
{
        if (!v)
                return ctl_error(CTL_EXIT_OSERR, "out of memory");
        int r = json_dumpf(v, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
        json_decref(v);
        fputc('\n', stdout);
        return r == 0 ? 0 : CTL_EXIT_IOERR;
}

int ctl_write_all(int fd, const void *data, size_t len)
{
        const char *p = data;

        while (len > 0) {
                ssize_t n = write(fd, p, len);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                p += n;
                len -= (size_t)n;
        }
        return 0;
}

int64_t ctl_mono_ms(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
