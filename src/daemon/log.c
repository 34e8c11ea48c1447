/* SPDX-License-Identifier: MIT */
#include "log.h"

#include <stdarg.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
/* CODE_FILE=/CODE_LINE=/CODE_FUNC= are the caller's (log_event_at's
 * arguments), not the location of the sd_journal_sendv call below. */
#define SD_JOURNAL_SUPPRESS_LOCATION
#include <systemd/sd-journal.h>
#include <unistd.h>

#include "kairos/kbuf.h"

static bool use_journal;
static bool plain;  /* stderr is a terminal (not the journal): the message only */
static const char *node_name;                 /* cluster mode: NODE= */
static long long (*epoch_of)(const char *mandate_id);
static pthread_t loop_thread;
static int level = LOG_INFO;
/* log_hold: per thread (only the holding thread's records are kept) */
static _Thread_local struct kbuf held = KBUF_INIT;
static _Thread_local bool holding;

void log_setup(int max_level)
{
        level = max_level;
        const char *js = getenv("JOURNAL_STREAM");
        struct stat st;
        unsigned long long dev, ino;
        use_journal = false;
        if (js && sscanf(js, "%llu:%llu", &dev, &ino) == 2 && fstat(STDERR_FILENO, &st) == 0)
                use_journal = (unsigned long long)st.st_dev == dev &&
                              (unsigned long long)st.st_ino == ino;
        plain = !use_journal && isatty(STDERR_FILENO);
}

void log_set_level(int max_level)
{
        level = max_level;
}

/* __FILE__ as the compiler saw it, relative to the build directory
 * ("../src/daemon/main.c"): name it from the top of the source tree. */
static const char *source_path(const char *file)
{
        while (strncmp(file, "../", 3) == 0)
                file += 3;
        while (strncmp(file, "./", 2) == 0)
                file += 2;
        return file;
}

#define JOURNAL_MAX_FIELDS 40

/* Append s to b with every control character escaped: C0 and DEL as \n, \r,
 * \t or \xNN, C1 (U+0080..U+009F, two bytes in UTF-8) as \u00NN.  A
 * handler's reason, an error message or a line of its stderr goes into log
 * records: an ESC or BEL of theirs must reach neither the terminal that shows
 * the log nor the record's line structure.  Backslashes are left as they are
 * (an escape in the text cannot hide a real control character). */
static int log_escape(struct kbuf *b, const char *s)
{
        static const char hex[] = "0123456789abcdef";
        int r = 0;
        for (const unsigned char *p = (const unsigned char *)s; r == 0 && *p; p++) {
                unsigned char c = *p;
                /* a run of plain bytes goes in at once */
                const unsigned char *q = p;
                while (*q >= 0x20 && *q != 0x7f && *q != 0xc2)
                        q++;
                if (q > p) {
                        r = kbuf_append(b, p, (size_t)(q - p));
                        p = q - 1;
                        continue;
                }
                if (c == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) {
                        char e[] = { '\\', 'u', '0', '0', hex[p[1] >> 4], hex[p[1] & 15] };
                        r = kbuf_append(b, e, sizeof e);
                        p++;
                } else if (c == '\n') {
                        r = kbuf_puts(b, "\\n");
                } else if (c == '\r') {
                        r = kbuf_puts(b, "\\r");
                } else if (c == '\t') {
                        r = kbuf_puts(b, "\\t");
                } else if (c < 0x20 || c == 0x7f) {
                        char e[] = { '\\', 'x', hex[c >> 4], hex[c & 15] };
                        r = kbuf_append(b, e, sizeof e);
                } else {
                        r = kbuf_putc(b, (char)c);
                }
        }
        return r;
}

/* name=value appended to b as one journal field; its place in *f */
struct jfield {
        size_t off, len;
};

static int jfield_add(struct kbuf *b, struct jfield *f, const char *name, const char *value)
{
        size_t off = b->len;
        int r = kbuf_puts(b, name);
        if (r == 0)
                r = kbuf_putc(b, '=');
        if (r == 0)
                r = kbuf_puts(b, value);
        if (r < 0) {
                kbuf_truncate(b, off);
                return r;
        }
        *f = (struct jfield){ off, b->len - off };
        return 0;
}

/* Every field into one buffer (one allocation, grown rarely), the iovecs
 * made once it no longer moves. */
static void log_journal(const char *file, int line, const char *func, int priority,
                        const char *message_id, const struct log_field *fields, size_t n,
                        const char *msg)
{
        struct jfield f[JOURNAL_MAX_FIELDS];
        struct iovec iov[JOURNAL_MAX_FIELDS];
        size_t k = 0;
        struct kbuf b = KBUF_INIT;
        if (kbuf_reserve(&b, 512) < 0 || kbuf_puts(&b, "MESSAGE=") < 0 ||
            log_escape(&b, msg) < 0) {
                kbuf_free(&b);
                return;
        }
        f[k++] = (struct jfield){ 0, b.len };
        char num[24];
        snprintf(num, sizeof num, "%d", priority);
        if (jfield_add(&b, &f[k], "PRIORITY", num) == 0)
                k++;
        if (message_id && jfield_add(&b, &f[k], "MESSAGE_ID", message_id) == 0)
                k++;
        if (jfield_add(&b, &f[k], "CODE_FILE", source_path(file)) == 0)
                k++;
        snprintf(num, sizeof num, "%d", line);
        if (jfield_add(&b, &f[k], "CODE_LINE", num) == 0)
                k++;
        if (jfield_add(&b, &f[k], "CODE_FUNC", func) == 0)
                k++;
        for (size_t i = 0; i < n && k < JOURNAL_MAX_FIELDS; i++)
                if (fields[i].value && jfield_add(&b, &f[k], fields[i].name, fields[i].value) == 0)
                        k++;
        for (size_t i = 0; i < k; i++)
                iov[i] = (struct iovec){ b.data + f[i].off, f[i].len };
        sd_journal_sendv(iov, (int)k);
        kbuf_free(&b);
}

static void log_stderr(int priority, const struct log_field *fields, size_t n, const char *msg)
{
        struct kbuf b = KBUF_INIT;
        /* One record is one line: a newline inside would forge a record.
         * On a terminal, a person reads it: the time and the message (a
         * warning or worse says so), no syslog prefix, no journal fields. */
        if (plain) {
                char when[16] = "";
                time_t now = time(NULL);
                struct tm tm;
                if (localtime_r(&now, &tm))
                        strftime(when, sizeof when, "%H:%M:%S ", &tm);
                kbuf_printf(&b, "%s%s", when,
                            priority <= LOG_ERR       ? "error: "
                            : priority == LOG_WARNING ? "warning: "
                                                      : "");
                n = 0;
        } else {
                char pri[16];
                int len = snprintf(pri, sizeof pri, "<%d>", priority);
                kbuf_reserve(&b, 256);
                kbuf_append(&b, pri, (size_t)len);
        }
        log_escape(&b, msg);
        for (size_t i = 0; i < n; i++) {
                if (!fields[i].value)
                        continue;
                bool quote = strpbrk(fields[i].value, " \t\"") != NULL || !*fields[i].value;
                kbuf_putc(&b, ' ');
                kbuf_puts(&b, fields[i].name);
                kbuf_puts(&b, quote ? "=\"" : "=");
                log_escape(&b, fields[i].value);
                if (quote)
                        kbuf_putc(&b, '"');
        }
        kbuf_putc(&b, '\n');
        if (holding && b.data &&
            kbuf_append(&held, b.data, b.len) == 0) {
                if (held.len >= 64 * 1024)
                        log_hold(true);
        } else if (b.data) {
                fwrite(b.data, 1, b.len, stderr);
                fflush(stderr);
        }
        kbuf_free(&b);
}

void log_hold(bool on)
{
        if (held.len) {
                fwrite(held.data, 1, held.len, stderr);
                fflush(stderr);
                held.len = 0;
        }
        if (!on)
                kbuf_free(&held);
        holding = on;
}

void log_event_at(const char *file, int line, const char *func, int priority,
                  const char *message_id, const struct log_field *fields, size_t n,
                  const char *fmt, ...)
{
        if (priority > level)
                return;
        /* the message on the stack unless it is long */
        char small[512];
        char *msg = small, *big = NULL;
        va_list ap;
        va_start(ap, fmt);
        int r = vsnprintf(small, sizeof small, fmt, ap);
        va_end(ap);
        if (r < 0)
                return;
        if ((size_t)r >= sizeof small) {
                va_start(ap, fmt);
                r = vasprintf(&big, fmt, ap);
                va_end(ap);
                if (r < 0)
                        return;
                msg = big;
        }
        /* Cluster mode: every entry names the node, and one about a mandate
         * its epoch (looked up on the loop thread only: the registry is the
         * loop's). */
        struct log_field all[JOURNAL_MAX_FIELDS];
        char epoch[24];
        if (node_name && n + 2 <= JOURNAL_MAX_FIELDS) {
                if (n)
                        memcpy(all, fields, n * sizeof(*fields));
                const char *mandate = NULL;
                bool has_epoch = false;
                for (size_t i = 0; i < n; i++) {
                        if (strcmp(fields[i].name, "MANDATE_ID") == 0)
                                mandate = fields[i].value;
                        else if (strcmp(fields[i].name, "EPOCH") == 0)
                                has_epoch = true;
                }
                all[n++] = (struct log_field){ "NODE", node_name };
                long long e = 0;
                if (mandate && !has_epoch && epoch_of &&
                    pthread_equal(pthread_self(), loop_thread) && (e = epoch_of(mandate)) > 0) {
                        snprintf(epoch, sizeof epoch, "%lld", e);
                        all[n++] = (struct log_field){ "EPOCH", epoch };
                }
                fields = all;
        }
        if (use_journal)
                log_journal(file, line, func, priority, message_id, fields, n, msg);
        else
                log_stderr(priority, fields, n, msg);
        free(big);
}

void log_set_node(const char *node, long long (*epoch_lookup)(const char *mandate_id))
{
        node_name = node;
        epoch_of = epoch_lookup;
        loop_thread = pthread_self();
}
