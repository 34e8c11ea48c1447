/* SPDX-License-Identifier: MIT */
/* log: structured logging for kairosd.  When stderr is connected to the
 * journal (JOURNAL_STREAM names our stderr), records go through journald's
 * native protocol with MESSAGE_ID= and fields such as MANDATE_ID=; otherwise
 * each record is one "<N>message key=value…" line on stderr. */
#pragma once

#include <stddef.h>
#include <syslog.h>

/* Stable message ids (sd-id128 style, 32 hex). */
#define MSGID_STARTED          "3a1f5e0c6b2d4e8f9a7b1c2d3e4f5a60"
#define MSGID_READY            "3a1f5e0c6b2d4e8f9a7b1c2d3e4f5a61"
#define MSGID_RECOVERY         "3a1f5e0c6b2d4e8f9a7b1c2d3e4f5a62"
#define MSGID_PAUSED_REVIEW    "3a1f5e0c6b2d4e8f9a7b1c2d3e4f5a63"
#define MSGID_WAL_CORRUPT      "3a1f5e0c6b2d4e8f9a7b1c2d3e4f5a64"
#define MSGID_RELOAD_OK        "3a1f5e0c6b2d4e8f9a7b1c2d3e4f5a65"
#define MSGID_RELOAD_FAILED    "3a1f5e0c6b2d4e8f9a7b1c2d3e4f5a66"
#define MSGID_STOPPING         "3a1f5e0c6b2d4e8f9a7b1c2d3e4f5a67"
#define MSGID_WAL_IO_ERROR     "3a1f5e0c6b2d4e8f9a7b1c2d3e4f5a68"
#define MSGID_OPERATOR         "3a1f5e0c6b2d4e8f9a7b1c2d3e4f5a69"
#define MSGID_STATUS_DUMP      "3a1f5e0c6b2d4e8f9a7b1c2d3e4f5a6a"

/* One structured field; value NULL = field omitted. */
struct log_field {
        const char *name;    /* e.g. "MANDATE_ID" */
        const char *value;
};

/* Decide the output once at start (reads JOURNAL_STREAM); level filters. */
void log_setup(int max_level);
void log_set_level(int max_level);
int log_get_level(void);
int log_level_from_string(const char *s);

/* Log one record.  message_id may be NULL.  fields may be NULL (n = 0). */
void log_event(int priority, const char *message_id, const struct log_field *fields, size_t n,
               const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#define log_error(...) log_event(LOG_ERR, NULL, NULL, 0, __VA_ARGS__)
#define log_warning(...) log_event(LOG_WARNING, NULL, NULL, 0, __VA_ARGS__)
#define log_notice(...) log_event(LOG_NOTICE, NULL, NULL, 0, __VA_ARGS__)
#define log_info(...) log_event(LOG_INFO, NULL, NULL, 0, __VA_ARGS__)
#define log_debug(...) log_event(LOG_DEBUG, NULL, NULL, 0, __VA_ARGS__)
#define LOG_FIELDS(...) ((const struct log_field[]){ __VA_ARGS__ }), \
        (sizeof((const struct log_field[]){ __VA_ARGS__ }) / sizeof(struct log_field))
