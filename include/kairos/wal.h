/* SPDX-License-Identifier: MIT */
/* wal: the per-mandate write-ahead log writer (docs/design.md §6).
 *
 * Records are encoded byte-identically to the legacy layout (same keys,
 * same order) and end with ,"crc":"xxxxxxxx"}.  Each append is one write(2)
 * of one whole line on an O_APPEND descriptor; durability is a barrier:
 * wal_flush() issues one fdatasync for everything written since the last one.
 * Appends and flushes are serialized by a mutex, so any thread may call them.
 *
 * A WAL is in one of four states.  OK: appends allowed.  QUARANTINED: the
 * file is corrupt (a bad line followed by good ones); nothing is ever
 * appended (-EBADMSG).  FAILED: a write or fdatasync failed; nothing after
 * the last good flush is acknowledged, every later call fails with the
 * original error and fdatasync is never retried on that descriptor.
 * CLOSED: -EBADF. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kairos/fold.h"
#include "kairos/kbuf.h"
#include "kairos/kio.h"
#include "kairos/planner.h"

#define WAL_ERROR_MSG_MAX_CHARS 500
/* A failed record's "stderr": the end of the handler's stderr, at most
 * this many bytes (cut at a UTF-8 character; the writer cuts a longer one) */
#define WAL_STDERR_MAX_BYTES 1024

enum wal_op {
        WAL_OP_PLAN_COMMIT,
        WAL_OP_APPEND,          /* step pending */
        WAL_OP_EXECUTING,
        WAL_OP_COMPLETED,
        WAL_OP_FAILED,
        WAL_OP_NEEDS_REVIEW,
        WAL_OP_RESET,
        WAL_OP_FINALIZE,
        WAL_OP_OPERATOR,
        WAL_OP_MANDATE,         /* kairos: who fired the mandate (first record of a WAL) */
        WAL_OP_OWNER,           /* cluster mode: a node took the mandate over */
        WAL_OP_RETRY_WAIT,      /* a failed step waits to be tried again */
};

struct wal_step {
        const char *step_id;
        const char *tool;
        const char *params_hash;
        const char *pre_hash;
        const char *expected_post_hash;
};

/* One record to encode.  Which fields are used depends on op; optional
 * fields are written only when non-NULL (recovered only when true).
 * evidence_json and result_json are JSON texts: they are validated and
 * written compactly (document order kept), never with raw newlines. */
struct wal_record {
        enum wal_op op;
        const char *step_id;
        const char *plan_id;
        /* plan_commit */
        const char *mandate_id;
        long long cycle;
        const struct wal_step *steps;
        size_t nsteps;
        /* append */
        const char *idem_key;
        /* executing */
        const char *pre_hash;
        /* completed */
        const char *post_hash;
        const char *result_hash;
        bool recovered;
        const char *evidence_json;  /* completed, needs_review, reset (optional) */
        const char *result_json;    /* completed */
        /* completed (optional): "MANDATE/STEP", the step is carried from
         * that step of another mandate, with its result (kairosctl retry
         * --from): nothing ran */
        const char *carried_from;
        /* result_json is the compact form of a parsed value (kjson_write's
         * bytes): written as it is, not read again */
        bool result_compact;
        size_t result_len;          /* strlen(result_json) when known; 0: not */
        /* failed */
        const char *error_class;
        const char *error_msg;      /* cut at 500 characters, invalid UTF-8 replaced */
        /* failed (optional): how the handler ended, for a page after a
         * restart: "exit_status" (has_exit_status), "signal" (> 0) and
         * "stderr" (its last lines, not NULL) */
        bool has_exit_status;
        int exit_status;
        int exit_signal;
        const char *stderr_tail;
        /* needs_review, finalize, operator */
        const char *reason;
        /* finalize: PLAN_SUCCEEDED, PLAN_FAILED or PLAN_ABANDONED (written
         * as its name; anything else is -EINVAL) */
        enum plan_status status;
        /* operator: {"op":"operator","mandate_id","action"[,"step_id"],"uid","reason","ts"} */
        const char *action;
        long long uid;
        /* mandate: {"op":"mandate","mandate_id","schedule","fired_at"[,"goal"]
         * [,"retry_of","retry"],"ts"}: a retry (kairosctl retry) names the
         * mandate it retries and its number N >= 1 (planner.h) */
        const char *schedule;
        const char *fired_at;
        const char *goal;
        const char *retry_of;
        long long retry;
        /* owner: {"op":"owner","mandate_id","node","epoch"[,"prev_owner"],"ts"}
         * (docs/design.md §14) */
        const char *node;
        long long epoch;
        const char *prev_owner;
        /* retry_wait: {"op":"retry_wait","step_id","attempt","error_class",
         * "due_ms","ts"}: attempt N of the step failed (error_class); it
         * runs again, under the same key, at due_ms (ms since the epoch) */
        long long attempt;
        long long due_ms;
};

/* Encode one record as a full line: JSON, crc field, '\n'.  ts_ms is the
 * record's time in milliseconds since the epoch (written as
 * 2026-04-20T12:00:00.123Z).  -EINVAL names no field; see wal_encode_error. */
int wal_encode(const struct wal_record *r, int64_t ts_ms, struct kbuf *out);
/* What made the last wal_encode (or append) on this thread fail: a short
 * English phrase such as "completed needs post_hash", "" if none. */
const char *wal_encode_error(void);

/* crc of a line as kairos writes it: CRC-32 of the line without its
 * ,"crc":"xxxxxxxx" field.  Helpers for readers. */
uint32_t wal_crc(const char *line_without_crc, size_t len);

/* Format ms since the epoch as YYYY-MM-DDTHH:MM:SS.mmmZ (25 bytes incl. NUL). */
void wal_format_ts(int64_t ts_ms, char out[32]);
/* The inverse (also without milliseconds: YYYY-MM-DDTHH:MM:SSZ).  -EINVAL
 * (and *ret_ms = 0) for anything else, NULL included. */
int wal_parse_ts(const char *ts, int64_t *ret_ms);

enum wal_state {
        WAL_STATE_OK,
        WAL_STATE_QUARANTINED,
        WAL_STATE_FAILED,
        WAL_STATE_CLOSED,
};

struct wal_options {
        const struct kio *io;                 /* NULL: kio_posix() */
        int64_t (*now_ms)(void *ctx);         /* NULL: CLOCK_REALTIME */
        void *clock_ctx;
        bool dir_exists;                      /* the caller made the directory: no mkdir -p */
        bool exists;                          /* the caller found the file: opened once,
                                               * read and appended through one descriptor */
        /* with exists: the file's directory is open as dir_fd (borrowed):
         * the file is opened by its name relative to it (kio openat, where
         * the kio offers it), not by walking the whole path again */
        bool at_dir;
        int dir_fd;
        /* Cluster mode (docs/design.md §14): when set, a barrier (wal_flush)
         * hands the lines appended since the last barrier to barrier(ctx,
         * first_seq, lines, len) instead of calling fdatasync.  first_seq is
         * the 1-based position of the first of them among all the WAL's
         * records; len > 0.  It returns 0 (the lines are durable where it
         * keeps them) or a negative errno: the WAL then fails with it, as
         * after a failed fdatasync. */
        int (*barrier)(void *ctx, int64_t first_seq, const char *lines, size_t len);
        void *barrier_ctx;
        /* Keep the lines appended through this WAL in memory until
         * wal_take_appended() takes them: who appends folds what it wrote
         * without reading the file back. */
        bool keep_appended;
        /* Spares to create the file from (NULL: none; see below): a new
         * file is a durable spare renamed to path, with no directory
         * fsync; with none durable, a file created as without */
        struct wal_spares *spares;
};

struct wal_open_info {
        bool created;              /* the file did not exist */
        bool from_spare;           /* ... and was a spare renamed to its name */
        bool torn_repaired;        /* a torn tail was cut off */
        size_t torn_bytes;
        char torn_path[4096];      /* where the torn bytes were kept */
        bool corrupt;              /* quarantined */
        size_t bad_line;           /* 1-based line of the corruption */
        size_t bad_offset;         /* its byte offset */
        char bad_reason[128];
};

struct wal;

/* Mode of WALs, torn-tail copies and archives (group-readable for the
 * offline commands; see statedir.h). */
#define WAL_FILE_MODE 0640

/* Open or create (mode WAL_FILE_MODE, O_APPEND, never truncating good data).  On
 * creation the parent directory is fsynced.  An existing file is scanned: a
 * torn tail is saved to <path>.torn.<unix-seconds> and truncated away (then
 * fsynced); a corrupt file opens QUARANTINED.  info may be NULL. */
int wal_open(const char *path, const struct wal_options *opt, struct wal **out,
             struct wal_open_info *info);
/* The same, and *ret_fold (may be NULL: not wanted) receives the fold of an
 * existing file as it was read to open it (NULL for a new file): its good
 * records, what the file holds after a torn tail is cut.  Caller frees. */
struct fold;
int wal_open_folded(const char *path, const struct wal_options *opt, struct wal **out,
                    struct wal_open_info *info, struct fold **ret_fold);
/* Close (idempotent on NULL).  Does not flush: unflushed records are not durable. */
int wal_close(struct wal *w);
/* Close the descriptor but keep the object: the WAL is CLOSED and every later
 * append or flush returns -EBADF.  wal_close() still frees it. */
int wal_shutdown(struct wal *w);

enum wal_state wal_state(const struct wal *w);
/* The error that failed the WAL (negative errno), 0 if none. */
int wal_error(const struct wal *w);
const char *wal_path(const struct wal *w);
/* Records the WAL holds (its good lines, whether flushed or not). */
int64_t wal_records(const struct wal *w);
/* fdatasync calls (or barrier calls) issued on this WAL so far. */
uint64_t wal_flush_count(const struct wal *w);
/* Records appended since the last successful flush. */
size_t wal_pending(const struct wal *w);

/* Append one record (not yet durable). */
int wal_append(struct wal *w, const struct wal_record *r);
/* With keep_appended: move the lines appended since the last take (or the
 * open) into out, which must be empty (its storage is replaced), and set
 * *ret_at to the file offset of the first of them (the file's end when there
 * are none).  The lines are whole records as written, durable or not.
 * -ENODATA: they were not kept (the option is off, or memory ran out while
 * keeping them): read the file; keeping restarts at its current end. */
int wal_take_appended(struct wal *w, struct kbuf *out, uint64_t *ret_at);

/* Barrier: make everything appended so far durable (one fdatasync, none if
 * nothing is pending). */
int wal_flush(struct wal *w);

/* One function per op. */
int wal_commit_plan(struct wal *w, const char *plan_id, const char *mandate_id, long long cycle,
                    const struct wal_step *steps, size_t nsteps);
int wal_commit_planner_plan(struct wal *w, const struct planner_plan *p);
int wal_append_pending(struct wal *w, const char *step_id, const char *plan_id,
                       const char *idem_key);
int wal_mark_executing(struct wal *w, const char *step_id, const char *pre_hash);
int wal_mark_completed(struct wal *w, const char *step_id, const char *post_hash,
                       const char *result_hash, bool recovered, const char *evidence_json,
                       const char *result_json);
int wal_mark_failed(struct wal *w, const char *step_id, const char *error_class,
                    const char *error_msg);
int wal_mark_needs_review(struct wal *w, const char *step_id, const char *reason,
                          const char *evidence_json);
int wal_mark_reset(struct wal *w, const char *step_id);
int wal_finalize_plan(struct wal *w, const char *plan_id, enum plan_status status,
                      const char *reason);
int wal_operator(struct wal *w, const char *mandate_id, const char *action,
                 const char *step_id, long long uid, const char *reason);
int wal_mandate(struct wal *w, const char *mandate_id, const char *schedule, const char *fired_at,
                const char *goal);

/* Archive: gzip <wal> into <archive_dir>/<basename>.gz (written as .tmp,
 * fdatasync, rename, fsync of archive_dir), then unlink the WAL and fsync its
 * directory.  wal_archive closes w (even on failure).  dest (may be NULL)
 * receives the archive path (caller frees). */
int wal_archive(struct wal *w, const char *archive_dir, char **dest);
int wal_archive_file(const struct kio *io, const char *wal_path, const char *archive_dir,
                     char **dest);
/* Where wal_archive_file puts wal_path: <archive_dir>/<basename>.gz. */
int wal_archive_path(const char *wal_path, const char *archive_dir, char **ret_path);
/* The first half of an archive, for batches: gzip the WAL into
 * <archive_dir>/<basename>.gz (.tmp, rename) with no sync at all and keep
 * the WAL.  The caller makes the archive durable (kio_syncfs) before it
 * unlinks the WAL; until then the WAL is the truth. */
int wal_archive_stage(const struct kio *io, const char *wal_path, const char *archive_dir,
                      char **dest);
/* The same from the WAL's bytes already in memory (the whole file). */
int wal_archive_stage_bytes(const struct kio *io, const char *wal_path, const char *bytes,
                            size_t nbytes, const char *archive_dir, char **dest);

/* Spares (docs/design.md §6, rule 1): empty files created ahead in a WAL
 * directory under the name WAL_SPARE_PREFIX<n> (hidden: no reader of WALs
 * lists them), made durable in batches by a sync that runs anyway.  A new
 * WAL takes a durable spare and renames it to its own name without a
 * directory fsync: its first fdatasync makes its records durable, and a
 * crash may leave them under the spare's name (a rename is atomic: one
 * name or the other), where the next start adopts them
 * (wal_spare_adopt).  Only a spare whose covering sync began after its
 * creation and returned 0 is durable; the others are never used.  Any
 * thread may call these. */
#define WAL_SPARE_PREFIX ".spare-"
#define WAL_SPARES_MAX 16   /* at most this many spares per directory */
struct wal_spares;
/* A pool of at most max (<= WAL_SPARES_MAX) spares in dir (no I/O). */
int wal_spares_new(const struct kio *io, const char *dir, unsigned max,
                   struct wal_spares **ret_spares);
void wal_spares_free(struct wal_spares *s);
/* name is a spare's (WAL_SPARE_PREFIX then digits). */
bool wal_spare_name(const char *name);
/* An empty spare found in dir (by a scan): kept, not yet durable.
 * -ENOSPC: the pool is full (the caller removes it). */
int wal_spares_found(struct wal_spares *s, const char *name);
/* Create spares (empty, no sync) until the pool holds max, and set
 * *ret_mark: once a sync of the directory (or its file system) that
 * started after this call has returned, wal_spares_covered(s, mark, r)
 * with its result.  Best effort: an error leaves fewer spares. */
int wal_spares_fill(struct wal_spares *s, uint64_t *ret_mark);
/* The sync for mark returned r: 0, every spare that existed at mark is
 * durable; an error, those not yet durable are removed (never used). */
void wal_spares_covered(struct wal_spares *s, uint64_t mark, int r);
/* Spares that are durable / not yet. */
unsigned wal_spares_durable(const struct wal_spares *s);
unsigned wal_spares_pending(const struct wal_spares *s);
/* Rename a durable spare to path (in the pool's directory; no sync),
 * never over a file named path: -EEXIST then (the spare kept).  -ENOENT:
 * none is durable. */
int wal_spares_take(struct wal_spares *s, const char *path);

/* What wal_spare_adopt found in a spare. */
enum wal_spare_found {
        WAL_SPARE_EMPTY,      /* no byte: a spare still (wal_spares_found) */
        WAL_SPARE_REMOVED,    /* no complete record (a torn first line, never
                               * flushed, never acknowledged): unlinked */
        WAL_SPARE_ADOPTED,    /* renamed to <mandate>.wal.jsonl: a new WAL
                               * whose rename a crash undid */
        WAL_SPARE_UNNAMED,    /* bytes but no record naming a mandate (or a
                               * first line longer than any record): left */
        WAL_SPARE_CONFLICT,   /* <mandate>.wal.jsonl exists too: left, never merged */
        WAL_SPARE_NOT_FILE,   /* no regular file of one name (a symbolic link,
                               * FIFO, directory, device, hard link): never
                               * opened to read or write, left */
};
/* Read the spare dir/name (its first line only) and settle it as above;
 * *ret_id (idlen bytes) receives the mandate it names (ADOPTED,
 * CONFLICT); a WAL made meanwhile is never replaced.  The rename is not
 * synced: the caller fsyncs dir once after every adoption, before any
 * record is appended to the adopted files' new names. */
int wal_spare_adopt(const struct kio *io, const char *dir, const char *name,
                    enum wal_spare_found *ret_found, char *ret_id, size_t idlen);
/* The same, read only: what wal_spare_adopt would find and do (for the
 * offline readers: a mandate whose WAL is still under a spare's name). */
int wal_spare_peek(const char *dir, const char *name, enum wal_spare_found *ret_found,
                   char *ret_id, size_t idlen);
