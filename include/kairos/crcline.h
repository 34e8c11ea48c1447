/* SPDX-License-Identifier: MIT */
/* crcline: files of JSON lines sealed by a crc, with the torn-tail rule —
 * the one reader and sealer behind the WAL (fold.c, wal.c) and the
 * idempotency log (idem.c).  See docs/ for the format.
 *
 * A sealed line is a JSON object that ends with ,"crc":"xxxxxxxx"} where
 * xxxxxxxx is the lowercase hex CRC-32 of the line without that field (the
 * object closed by its '}'), then '\n'.  A legacy line (CRCLINE_LEGACY) has
 * no crc and must end with its "ts" member, so a damaged crc field never
 * passes as legacy.
 *
 * The scanner splits on '\n', strips one trailing '\r', skips blank lines
 * and hands each good record to a callback.  A bad line is corruption unless
 * it is the last non-blank line and could be a strict prefix of one record
 * (a torn write): only NUL bytes or whitespace, an incomplete JSON object,
 * or a whole good record missing its '\n'.  A complete crc-valid record
 * followed by more bytes (a lost newline merged two records) is corruption.
 * An unterminated line is never handed to the callback.
 *
 * Two modes:
 *   stop (default)      the first bad line followed by a non-blank line ends
 *                       the scan: nothing after it is read (the WAL);
 *                       a terminated last line may be torn too;
 *   CRCLINE_KEEP_GOING  every bad line is reported to the bad callback and
 *                       the scan goes on (the idempotency log salvages the
 *                       keys it names); only an unterminated last line can
 *                       be torn.
 * The scanner never allocates beyond the caller's arena, never loops. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kairos/kbuf.h"
#include "kairos/kjson.h"

#define CRCLINE_SUFFIX_LEN 18 /* ,"crc":"xxxxxxxx"} */

enum {
        CRCLINE_LEGACY = 1u << 0,     /* accept lines without crc that end with "ts" */
        CRCLINE_KEEP_GOING = 1u << 1, /* see above */
        CRCLINE_OWN = 1u << 2,        /* a line this process wrote itself: the record's
                                       * "result" is kept as text (kjson_parse_trusted)
                                       * and its crc is not computed again */
};

/* Record callback results besides 0 and -errno. */
#define CRCLINE_REJECT 1 /* the record is well formed but unusable: a bad line */

enum crcline_status {
        CRCLINE_CLEAN,
        CRCLINE_TORN,
        CRCLINE_CORRUPT,
};

struct crcline_scan {
        unsigned flags;
        /* A good, terminated record (obj lives in arena until the next line).
         * Returns 0, CRCLINE_REJECT (reason in reject_reason, may be NULL) or -errno. */
        int (*record)(void *ctx, const struct kjson *obj, size_t line, bool legacy);
        /* KEEP_GOING: every bad line (l, n without '\n'); may be NULL. */
        int (*bad)(void *ctx, const char *l, size_t n, size_t line, size_t offset,
                   const char *why);
        /* May be NULL.  Tried first on a terminated line whose crc field is
         * well formed and matches (not with CRCLINE_OWN): returns 1 when it
         * took the line as a good record (as record() returning 0 would),
         * 0 to have the line parsed and checked as usual (it must have
         * changed nothing then), or -errno.  A fast path must never decide
         * what the checks would refuse: on any doubt it returns 0. */
        int (*fast)(void *ctx, const char *l, size_t n, size_t line);
        void *ctx;
        struct kjson_arena *arena;   /* scratch for parsing; reset per line */
        const char *reject_reason;   /* set by record() before CRCLINE_REJECT */
};

struct crcline_result {
        enum crcline_status status;
        size_t lines;            /* lines seen (incl. blank and bad) */
        size_t records;          /* good records accepted by the callback */
        size_t legacy_records;
        size_t good_end;         /* byte offset just past the last good record */
        size_t complete_end;     /* byte offset just past the last '\n' */
        size_t bad_lines;        /* bad lines (KEEP_GOING counts all; stop: 0 or 1) */
        size_t bad_line;         /* TORN/CORRUPT: 1-based line of the (first) bad line */
        size_t bad_offset;       /* ... and its byte offset */
        char bad_reason[128];
        size_t torn_bytes;       /* TORN: bytes from the torn line to the end */
};

/* Scan data[0..len).  Returns 0 (the verdict in *ret), or the first negative
 * value a callback returned, or -ENOMEM. */
int crcline_scan(struct crcline_scan *s, const char *data, size_t len,
                 struct crcline_result *ret);

/* The line l[0..n) ends with a well-formed crc field; *ret_crc its value. */
bool crcline_has_suffix(const char *l, size_t n, uint32_t *ret_crc);
/* CRC-32 of a sealed line without its crc field (n includes the suffix). */
uint32_t crcline_body_crc(const char *l, size_t n);
/* Seal the record b->data[start..] (a JSON object ending with '}'): replace
 * the '}' by ,"crc":"xxxxxxxx"}\n.  -EINVAL if it does not end with '}'. */
int crcline_seal(struct kbuf *b, size_t start);

/* Check one non-blank line without its '\n'.  Returns 1 (good: *ret_obj in
 * arena, *ret_legacy), 0 (bad: reason) or -ENOMEM. */
int crcline_check(struct kjson_arena *arena, unsigned flags, const char *l, size_t n,
                  const struct kjson **ret_obj, bool *ret_legacy, char *reason, size_t rlen);

const char *crcline_status_name(enum crcline_status s);
