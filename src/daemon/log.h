/* SPDX-License-Identifier: MIT */
/* log: structured logging for kairosd.  When stderr is connected to the
 * journal (JOURNAL_STREAM names our stderr), records go through journald's
 * native protocol with MESSAGE_ID= and fields such as MANDATE_ID=; otherwise
 * each record is one "<N>message key=value…" line on stderr. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <syslog.h>

/* Message ids of key events: random 128-bit ids (made once with
 * `systemd-id128 new`; never reuse one for another meaning).  Each has an
 * entry in systemd/kairos.catalog (what happened, what to do), shown by
 * `journalctl -x`; kairosd(8), LOGGING, lists them.  tests/integration/
 * test_docs.py checks that the three agree. */
#define MSGID_STARTED          "afcbab5dc471480bb88d5790de91807c"
#define MSGID_READY            "75ab7998df7543c4bd827aa194c7e80a"
#define MSGID_RECOVERY         "18bdc554e03d428190b39e2f450603bf"
#define MSGID_PAUSED_REVIEW    "abdc88397616471ab4cb13c8364bd754"
#define MSGID_WAL_CORRUPT      "6590912e75784dc9b4e8097c3b0e6e2f"
#define MSGID_RELOAD_OK        "8e0fa489eeb3436dbb812bc34c236b22"
#define MSGID_RELOAD_FAILED    "f80dd3277a284c3699dd59af11f30286"
#define MSGID_STOPPING         "86d3ca1379414226ac96748c6127f9ee"
#define MSGID_WAL_IO_ERROR     "531e30fa417e4b69900c11758b19b06e"
#define MSGID_OPERATOR         "38b3d666a44e47ada15e4ea48e911887"
#define MSGID_STATUS_DUMP      "ba3294abc1f74f65a1ac7951ab543039"

/* One structured field; value NULL = field omitted. */
struct log_field {
        const char *name;    /* e.g. "MANDATE_ID" */
        const char *value;
};

/* Decide the output once at start (reads JOURNAL_STREAM); level filters. */
void log_setup(int max_level);
void log_set_level(int max_level);

/* Cluster mode (from the loop thread, once): every record gets NODE=node
 * (a string that outlives logging), and a record with MANDATE_ID= logged
 * on this thread gets EPOCH= from epoch_lookup (> 0 only). */
/* Between log_hold(true) and log_hold(false), on the thread that called it,
 * records meant for stderr are kept and written together (one write, not
 * one per record) at log_hold(false) or when 64 KB are kept: recovery logs
 * a line per decision.  Journal records are sent one by one as ever. */
void log_hold(bool on);

void log_set_node(const char *node, long long (*epoch_lookup)(const char *mandate_id));

/* Log one record.  message_id may be NULL.  fields may be NULL (n = 0).
 * A macro, so that the journal's CODE_FILE=, CODE_LINE= and CODE_FUNC= name
 * the caller, not this module. */
#define log_event(...) log_event_at(__FILE__, __LINE__, __func__, __VA_ARGS__)
void log_event_at(const char *file, int line, const char *func, int priority,
                  const char *message_id, const struct log_field *fields, size_t n,
                  const char *fmt, ...) __attribute__((format(printf, 8, 9)));

#define log_error(...) log_event(LOG_ERR, NULL, NULL, 0, __VA_ARGS__)
#define log_warning(...) log_event(LOG_WARNING, NULL, NULL, 0, __VA_ARGS__)
#define log_notice(...) log_event(LOG_NOTICE, NULL, NULL, 0, __VA_ARGS__)
#define log_info(...) log_event(LOG_INFO, NULL, NULL, 0, __VA_ARGS__)
#define log_debug(...) log_event(LOG_DEBUG, NULL, NULL, 0, __VA_ARGS__)
#define LOG_FIELDS(...) ((const struct log_field[]){ __VA_ARGS__ }), \
        (sizeof((const struct log_field[]){ __VA_ARGS__ }) / sizeof(struct log_field))
