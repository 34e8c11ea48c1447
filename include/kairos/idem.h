/* SPDX-License-Identifier: MIT */
/* idem: the persistent idempotency store (docs/design.md §11).
 *
 * Two halves, so the daemon can keep the first on its event loop and run the
 * second on its (serialized) thread pool:
 *
 *   struct idem_store  pure in-memory state: hash map + LRU list, O(1)
 *                      lookups.  Every mutation (begin, complete, fail,
 *                      interrupt, forget) appends its log record to an
 *                      internal pending buffer and returns the record's
 *                      sequence number (lsn).  Not thread-safe: one thread.
 *   struct idem_log    the file <dir>/idem.jsonl: load at startup (torn tail
 *                      repaired, corruption reported), append + fdatasync of
 *                      record bytes, compaction.  Touches no store state
 *                      after idem_log_open, so it may run on another thread
 *                      while the store serves lookups.
 *
 * The handoff (loop thread):
 *     idem_take_pending(s, &buf, &lsn)   → pool: idem_log_append(log, buf)
 *     on success: idem_durable(s, lsn)   on failure: idem_set_failed(s, err)
 * Records must reach the log in the order they were produced (one serialized
 * queue).  The caller of begin may run its tool only once the begin record is
 * durable (idem_durable with an lsn >= the begin's); the caller of
 * complete/fail may be answered only once that record is durable.  Until
 * then a duplicate of a finished entry is answered IDEM_IN_PROGRESS, never
 * with a result that is not durable yet.
 *
 * Keys: "<tool>:<key>" for an explicit key, "<tool>:content:<sha256 hex of
 * the canonical JSON of the input>" otherwise.  Tool names are
 * [A-Za-z0-9_.-]{1,64}; explicit keys are 1..512 bytes of UTF-8 without
 * control characters and must not start with "content:".  Every entry keeps
 * the input fingerprint (canonical hash "sha256-<hex>" of the input); the same
 * explicit key with another fingerprint is IDEM_MISMATCH.
 *
 * States: processing → completed | failed; processing → interrupted (caller
 * vanished, or the daemon died: every processing entry of a loaded log comes
 * back interrupted).  TTL applies to completed/failed entries, counted from
 * their finish, and is checked on every lookup (an expired entry is a miss
 * and is dropped there).  At capacity the least recently used
 * completed/failed entry is evicted; processing and interrupted entries
 * never are (nothing evictable → IDEM_STORE_FULL).  Interrupted entries stay
 * until an operator forgets them.
 *
 * Log format: one JSON object per line ending ,"crc":"xxxxxxxx"}\n (crc as
 * wal_crc), keys in this order; every record but forget is self-contained
 * (it carries the entry's whole state), so replay sets state, never merges:
 *   {"op":"begin","key","tool","fp","created"[,"owner"][,"write"][,"check"][,"client"],"ts"}
 *   {"op":"complete","key","tool","fp","created"[,"owner"][,"write"][,"check"][,"client"],"finished","result","ts"}
 *   {"op":"fail","key","tool","fp","created"[,"owner"][,"write"][,"check"][,"client"],"finished","error_class","error_msg","result","ts"}
 *   {"op":"interrupt","key","tool","fp","created"[,"owner"][,"write"][,"check"][,"client"],"reason","ts"}
 *   {"op":"forget","key","uid","reason","ts"}
 * owner = {"mandate":ID,"step":STEP_ID,"attempt":N}: the step whose handler
 * made the call (attributed by kairosd from the caller's process group; see
 * docs/design.md §11); absent for calls from outside any step.
 * write = {"sha256":HEX,"bytes":N,"path":P}: a tool write's claim (struct
 * idem_write_claim); absent in logs written before it existed and for other
 * tools.
 * check = {"cmd":[WORD...],"argv":[...]}: a tool run's check (kairosctl tool
 * run --check) and the call's own command line, as the caller gave them
 * (idem_valid_check); absent in logs written before it existed and for
 * calls without one.
 * client = {"pid":N,"start":T}: the process that holds a tool run's claim
 * (struct idem_client), so that a kairosd started again can tell whether it
 * still runs (docs/design.md §11); absent for calls from outside any step.
 * created/finished are ms since the epoch, result is the payload in base64,
 * ts the record's time (YYYY-MM-DDTHH:MM:SS.mmmZ).  Unknown ops are ignored.
 *
 * Corruption (a bad line that is not a torn tail): every good record is
 * loaded (before and after the bad line), a bad line that still parses and
 * names a key leaves that key interrupted, the first bad line is reported,
 * and the store and log are QUARANTINED: lookups work, every mutation fails
 * with -EBADMSG and the file is never written, until an operator-initiated
 * compaction (idem_snapshot + idem_log_compact + idem_compacted) keeps a copy
 * of the corrupt file as idem.jsonl.corrupt.<unix-seconds> and rewrites the
 * log from the loaded entries.
 *
 * Errors are negative errno codes; decisions are enum idem_outcome values. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kairos/canon.h"
#include "kairos/kbuf.h"
#include "kairos/kio.h"

#define IDEM_DEFAULT_TTL_SEC 86400
#define IDEM_DEFAULT_CAPACITY 10000
#define IDEM_TOOL_MAX 64
#define IDEM_KEY_MAX 512
/* "<tool>:<key>" + NUL */
#define IDEM_FULL_KEY_SIZE (IDEM_TOOL_MAX + 1 + IDEM_KEY_MAX + 1)
/* largest result payload (bytes, before base64) */
#define IDEM_RESULT_MAX (16u * 1024 * 1024)
/* error_class bytes; error_msg and reasons are cut at this many characters */
#define IDEM_CLASS_MAX 64
#define IDEM_TEXT_MAX_CHARS 1000
/* compaction is due when the log holds more than twice the live entries and
 * at least this many records */
#define IDEM_COMPACT_MIN_RECORDS 32
#define IDEM_LOG_NAME "idem.jsonl"

enum idem_state {
        IDEM_ST_PROCESSING,
        IDEM_ST_COMPLETED,
        IDEM_ST_FAILED,
        IDEM_ST_INTERRUPTED,
};

/* "processing", "completed", "failed", "interrupted" */
const char *idem_state_name(enum idem_state st);

enum idem_outcome {
        IDEM_MISS,           /* lookup only: no (live) entry */
        IDEM_PROCEED,        /* begin: a new processing entry; run the tool once
                              * the returned lsn is durable */
        IDEM_HIT_COMPLETED,  /* duplicate: the cached result (view->result) */
        IDEM_HIT_FAILED,     /* duplicate: the cached error, class kept,
                              * view->cached set */
        IDEM_IN_PROGRESS,    /* processing, or finished but not durable yet */
        IDEM_INTERRUPTED,    /* needs an operator: inspect, then idem forget */
        IDEM_MISMATCH,       /* same explicit key, other input fingerprint */
        IDEM_STORE_FULL,     /* at capacity and nothing evictable */
};

/* "miss", "proceed", "hit", "cached_error", "in_progress", "interrupted",
 * "mismatch", "store_full" (the protocol's error codes for the last four) */
const char *idem_outcome_name(enum idem_outcome o);

struct idem_options {
        int64_t ttl_sec;                  /* 0: IDEM_DEFAULT_TTL_SEC; < 0: -EINVAL */
        size_t capacity;                  /* 0: IDEM_DEFAULT_CAPACITY */
        int64_t (*now_ms)(void *ctx);     /* NULL: CLOCK_REALTIME */
        void *clock_ctx;
};

/* The step a call belongs to.  mandate and step are [A-Za-z0-9_.-]{1,64};
 * attempt >= 1.  An empty mandate means no owner. */
#define IDEM_OWNER_ID_MAX 64
struct idem_step_owner {
        char mandate[IDEM_OWNER_ID_MAX + 1];
        char step[IDEM_OWNER_ID_MAX + 1];
        uint32_t attempt;
};

/* The check of a call (docs/design.md §11): a JSON object
 * {"cmd":[WORD...],"argv":[...]} in compact form, cmd 1..IDEM_CHECK_WORDS
 * non-empty strings, argv an array, the whole at most IDEM_CHECK_MAX bytes. */
#define IDEM_CHECK_MAX (64u * 1024)
#define IDEM_CHECK_WORDS 256
bool idem_valid_check(const char *json, size_t len);
/* json as a check in the compact form the store keeps (*ret owned), or
 * -EINVAL when it is no valid check, -ENOMEM. */
int idem_check_normalize(const char *json, size_t len, char **ret);

/* -EINVAL unless owner is a valid owner (see struct idem_step_owner). */
int idem_owner_check(const struct idem_step_owner *owner);

/* What a tool write claims to do, kept in its entry so that a write a
 * crash interrupted can be settled from the file (docs/design.md §11):
 * the path as the caller named it, the sha256 (64 lowercase hex digits) and
 * length of the content. */
#define IDEM_SHA256_HEX 64
#define IDEM_WRITE_PATH_MAX 4096
struct idem_write_claim {
        const char *path;             /* NULL: no claim */
        const char *sha256;
        uint64_t bytes;
};

/* The process that claimed a call: its pid and its start time (clock ticks
 * after boot, field 22 of /proc/PID/stat), which tells it from a later
 * process given the same pid.  pid 0: none. */
struct idem_client {
        int32_t pid;
        uint64_t start;
};

/* One call's identity. */
struct idem_request {
        const char *tool;
        const char *key;              /* explicit key, NULL: the content key */
        const char *input_json;       /* the call's input (JSON text) */
        size_t input_len;
        const char *fingerprint;      /* canonical hash of the input if already
                                       * known ("sha256-<hex>"); NULL: hashed
                                       * from input_json */
        const struct idem_step_owner *owner;    /* NULL: made outside any step; only
                                            * recorded by idem_begin for a new
                                            * entry */
        const struct idem_write_claim *write; /* NULL: none; recorded like owner */
        const char *check;            /* NULL: none; the check JSON (see the log format,
                                       * idem_valid_check), recorded like owner */
        const struct idem_client *client;     /* NULL: none; recorded like owner */
};

/* An entry as seen by a caller.  Pointers are borrowed from the store and
 * valid until the next call that mutates the store (any call but idem_get,
 * idem_stats, idem_pending_bytes). */
struct idem_view {
        const char *key;
        const char *tool;
        const char *fingerprint;
        enum idem_state state;
        bool cached;                 /* served to a duplicate from the store */
        bool durable;                /* its last record is durable */
        int64_t created_ms;
        int64_t finished_ms;         /* 0 unless completed/failed */
        int64_t expires_ms;          /* 0 unless completed/failed */
        const void *result;          /* completed/failed: payload (may hold NULs) */
        size_t result_len;
        const char *error_class;     /* failed */
        const char *error_msg;       /* failed */
        const char *reason;          /* interrupted: why */
        const struct idem_step_owner *owner; /* NULL: no owner */
        struct idem_write_claim write;       /* .path NULL: no claim */
        const char *check;                   /* NULL: none (the check JSON) */
        struct idem_client client;           /* .pid 0: none */
};

struct idem_stats {
        size_t size;
        size_t capacity;
        int64_t ttl_sec;
        size_t processing, completed, failed, interrupted;
        uint64_t hits;               /* duplicates answered from a finished entry */
        uint64_t misses;             /* lookups/begins that found no live entry */
        uint64_t conflicts;          /* in_progress and interrupted answers */
        uint64_t mismatches;
        uint64_t evictions;
        uint64_t expirations;
        uint64_t store_full;         /* begins refused for capacity */
        uint64_t forgets;
        uint64_t log_records;        /* records in the log (incl. pending) */
        uint64_t lsn;                /* last record produced */
        uint64_t durable_lsn;
        bool quarantined;
        int error;                   /* idem_set_failed's error, 0 if none */
};

struct idem_store;

int idem_store_new(const struct idem_options *opt, struct idem_store **out);
void idem_store_free(struct idem_store *s);

/* The full key and the input fingerprint of a request.  -EINVAL on a bad tool
 * or key, or (fingerprint NULL) input that is not JSON; -EDOM non-finite. */
int idem_make_key(const struct idem_request *req, char key[IDEM_FULL_KEY_SIZE],
                  char fingerprint[CANON_HASH_STRLEN]);

/* Decide without creating: IDEM_MISS, HIT_COMPLETED, HIT_FAILED, IN_PROGRESS,
 * INTERRUPTED or MISMATCH (v filled for all but MISS; v may be NULL).
 * Counts hits/misses/conflicts/mismatches; a hit becomes most recently used. */
int idem_lookup(struct idem_store *s, const struct idem_request *req, struct idem_view *v);

/* Like idem_lookup, but a miss creates a processing entry: IDEM_PROCEED
 * (*lsn = the begin record's) or IDEM_STORE_FULL.  *lsn is 0 for every other
 * outcome.  -EBADMSG quarantined, the idem_set_failed error when failed. */
int idem_begin(struct idem_store *s, const struct idem_request *req, struct idem_view *v,
               uint64_t *lsn);

/* processing → completed with the result payload (copied; up to
 * IDEM_RESULT_MAX bytes).  -ENOENT no such entry, -ESTALE not processing,
 * -EFBIG payload too large. */
int idem_complete(struct idem_store *s, const char *key, const void *result, size_t len,
                  uint64_t *lsn);
/* processing → failed, keeping error_class (1..64 bytes [A-Za-z0-9_.-]) and
 * error_msg (cut at IDEM_TEXT_MAX_CHARS, invalid UTF-8 replaced) and an
 * optional payload. */
int idem_fail(struct idem_store *s, const char *key, const char *error_class,
              const char *error_msg, const void *result, size_t len, uint64_t *lsn);
/* processing → interrupted (the caller vanished).  reason may be NULL. */
int idem_interrupt(struct idem_store *s, const char *key, const char *reason, uint64_t *lsn);
/* The caller itself: drop a processing entry whose call did nothing at all
 * (e.g. a tool write refused before any file was touched), so that a retry
 * with the key runs again.  Recorded like a forget with uid -1 and the
 * reason; not counted as a forget.  -ENOENT, -ESTALE not processing. */
int idem_abandon(struct idem_store *s, const char *key, const char *reason, uint64_t *lsn);
/* Settle an entry a crash left interrupted (or still processing) from
 * evidence outside the store: the call took effect → completed with the
 * result payload (as if the caller had finished it); it did not →
 * dropped, recorded like a forget with uid -2 and the reason, so a retry
 * with the key runs again.  -ENOENT, -ESTALE already finished. */
int idem_settle_complete(struct idem_store *s, const char *key, const void *result, size_t len,
                         uint64_t *lsn);
int idem_settle_abandon(struct idem_store *s, const char *key, const char *reason,
                        uint64_t *lsn);
/* The caller of an entry a kairosd crash left interrupted finished its call
 * after all (its command ran to the end while kairosd was down): interrupted
 * → completed, or failed with error_class/error_msg (not NULL), with the
 * result payload, as idem_complete/idem_fail.  fp must be the entry's input
 * fingerprint.  -ENOENT, -ESTALE not interrupted, -EPERM another fingerprint,
 * -EINVAL a bad error_class. */
int idem_finish_late(struct idem_store *s, const char *key, const char *fp,
                     const char *error_class, const char *error_msg, const void *result,
                     size_t len, uint64_t *lsn);
/* Operator: drop an entry (recorded with uid and reason).  -EBUSY while
 * processing (its caller may still be running the tool), -ENOENT. */
int idem_forget(struct idem_store *s, const char *key, long long uid, const char *reason,
                uint64_t *lsn);

/* Peek by full key (no stats, no LRU touch); the TTL is checked (an expired
 * entry is dropped and -ENOENT returned). */
int idem_get(struct idem_store *s, const char *key, struct idem_view *v);
/* Call fn for every live entry (TTL not checked, no stats, no LRU touch;
 * the store must not be changed from fn).  Stops at the first non-zero
 * return of fn and returns it; 0 after all entries. */
int idem_foreach(struct idem_store *s, int (*fn)(const struct idem_view *v, void *ctx), void *ctx);

/* Drop every expired entry now (optional: lookups check the TTL anyway).
 * Returns how many were dropped. */
size_t idem_sweep(struct idem_store *s);
void idem_stats(const struct idem_store *s, struct idem_stats *st);

/* ---- record handoff ---- */

/* Bytes of records produced and not yet taken. */
size_t idem_pending_bytes(const struct idem_store *s);
/* Move the pending records (whole lines) to the end of out; *upto_lsn = the
 * last record's lsn (0 and nothing appended if none). */
int idem_take_pending(struct idem_store *s, struct kbuf *out, uint64_t *upto_lsn);
/* Every record up to lsn is durable. */
void idem_durable(struct idem_store *s, uint64_t lsn);
/* The log failed (err < 0): every later mutation returns err; lookups go on. */
void idem_set_failed(struct idem_store *s, int err);

/* ---- compaction ---- */

struct idem_snapshot {
        uint64_t lsn;          /* the store's lsn when it was taken */
        uint64_t records;      /* records in the snapshot */
};

/* More than twice the live entries in the log (and at least
 * IDEM_COMPACT_MIN_RECORDS records); never when quarantined or failed. */
bool idem_needs_compaction(const struct idem_store *s);
/* Append one record per live entry (state-preserving; processing and
 * interrupted first, then finished ones from least to most recently used).
 * -EBUSY if records are pending (take them first: the snapshot must follow
 * them in the log queue). */
int idem_snapshot(struct idem_store *s, struct kbuf *out, struct idem_snapshot *snap);
/* The snapshot replaced the log: recount, mark it durable, lift quarantine. */
void idem_compacted(struct idem_store *s, const struct idem_snapshot *snap);

/* ---- the log file ---- */

struct idem_load_info {
        bool created;                /* no log existed */
        size_t records;              /* good records replayed */
        size_t entries;              /* live entries after the load */
        size_t interrupted;          /* processing entries that came back interrupted */
        size_t expired;              /* finished entries dropped for the TTL */
        size_t evicted;              /* dropped for capacity */
        size_t unknown_ops;
        bool torn_repaired;
        size_t torn_bytes;
        char torn_path[4096];        /* where the torn bytes were kept */
        bool corrupt;                /* quarantined */
        size_t bad_lines;
        size_t bad_line;             /* first bad line, 1-based */
        size_t bad_offset;           /* its byte offset */
        char bad_reason[128];
};

struct idem_log;

/* Create dir (0700, mkdir -p) and open or create <dir>/idem.jsonl (0600,
 * O_APPEND), replaying it into s, which must be new (nothing loaded, nothing
 * produced).  A torn tail is kept in idem.jsonl.torn.<unix-seconds> and cut
 * off (ftruncate + fdatasync) before anything is appended.  A corrupt file
 * quarantines log and store (info->corrupt; returns 0).  io NULL: kio_posix.
 * info may be NULL.  -EFBIG for a log over 1 GiB.  On failure s may hold a
 * partial load: free it, do not use it. */
int idem_log_open(const char *dir, const struct kio *io, struct idem_store *s,
                  struct idem_log **out, struct idem_load_info *info);
/* Read <dir>/idem.jsonl into s (new, as for idem_log_open) without
 * changing anything on disk: no directory or file is created, no lock is
 * taken, a torn tail is only counted (info->torn_bytes), never cut.  Every
 * processing entry comes back interrupted, the TTL and capacity apply as at
 * a daemon's start; a corrupt file quarantines s (info->corrupt).  No log:
 * info->created, an empty store.  For offline tools (kairosctl recover
 * --dry-run) reading a state directory a kairosd may be using. */
int idem_log_read(const char *dir, struct idem_store *s, struct idem_load_info *info);
/* Close (NULL ok).  Does not flush: records not appended are not durable. */
int idem_log_close(struct idem_log *l);

/* Append whole record lines and fdatasync them (one flush for the batch).
 * On a write or fdatasync error the log is FAILED: a short write is
 * truncated away, nothing is acknowledged, every later call returns the
 * first error and fdatasync is never issued on the descriptor again.
 * -EBADMSG when quarantined. */
int idem_log_append(struct idem_log *l, const void *data, size_t len);
/* Replace the log with a snapshot: idem.jsonl.tmp, fdatasync, close, rename,
 * fsync of dir, reopen.  A failure before the rename leaves the old log in
 * use (the error is returned, the log stays usable); after it, the log is
 * FAILED.  A quarantined log first keeps a copy of itself in
 * idem.jsonl.corrupt.<unix-seconds> and is released from quarantine. */
int idem_log_compact(struct idem_log *l, const void *data, size_t len);

/* 0, or the error that failed the log (-EBADMSG while quarantined). */
int idem_log_error(const struct idem_log *l);
const char *idem_log_path(const struct idem_log *l);
uint64_t idem_log_flush_count(const struct idem_log *l);

/* Blocking conveniences for tests and offline tools (the daemon runs the two
 * halves itself): take pending → append → durable or set_failed. */
int idem_sync(struct idem_store *s, struct idem_log *l);
/* idem_sync, then snapshot → compact → compacted. */
int idem_compact_sync(struct idem_store *s, struct idem_log *l);
