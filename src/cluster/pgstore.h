/* SPDX-License-Identifier: MIT */
/* pgstore: the PostgreSQL side of cluster mode (docs/design.md §14): the
 * schema's migrations, tick claims, mandate leases with epochs, fenced WAL
 * appends and reads, fenced tool-call claims.
 *
 * Every call is blocking (libpq's synchronous API) and must run on a worker
 * thread, never on the event loop.  A struct pgstore holds one connection
 * and is not thread-safe: one per thread, or one at a time.
 *
 * Functions return 0 or a negative errno; pgstore_error() has the message:
 *   -ESTALE   fenced: the mandate is at another epoch, or not this node's,
 *             or not running (or a node's older incarnation): nothing was
 *             written
 *   -ENOENT   no such mandate
 *   -EEXIST   the mandate exists already (pgstore_mandate_create)
 *   -EILSEQ   the append does not start right after the last row, and is
 *             not a byte-identical repeat of rows already stored
 *   -ETIME    the tick is more than 2 s ahead of the database's clock
 *   -EAGAIN   the schedule state moved on since it was read: read again
 *   -ETIMEDOUT  lock_timeout or statement_timeout: nothing was written
 *   -EBADMSG  a line is not one sealed WAL record ending in '\n' (nothing
 *             sent)
 *   -EBUSY    nothing to take over
 *   -ENOTCONN the connection broke: the outcome of the last call is
 *             unknown (re-read, then repeat: appends with an explicit
 *             first_seq are idempotent); pgstore_reset() reconnects
 *   -EPROTONOSUPPORT  the database's schema is newer than this build
 *   -EIO      any other database error
 * Lines are WAL records exactly as the file WAL holds them: the bytes of a
 * barrier are one or more lines, each ending in '\n' and sealed with its crc
 * field. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kbuf;
struct pgstore;

/* conninfo: a libpq connection string or URI ("" = libpq's defaults and
 * PG* environment).  Its own settings win over kairos's defaults
 * (connect_timeout=10, TCP keepalives, tcp_user_timeout=15000, options
 * with statement_timeout=30s, lock_timeout=10s and
 * idle_in_transaction_session_timeout=60s, application_name=kairosd).  On
 * failure (-ECONNREFUSED: could not connect) err holds libpq's reason. */
int pgstore_connect(const char *conninfo, struct pgstore **ret, char *err, size_t errlen);
void pgstore_close(struct pgstore *s);
/* Reconnect after -ENOTCONN. */
int pgstore_reset(struct pgstore *s);
const char *pgstore_error(const struct pgstore *s);

/* Create or migrate the schema to PGSCHEMA_VERSION, in one transaction under
 * an advisory lock (concurrent callers wait, then find nothing to do). */
int pgstore_migrate(struct pgstore *s, int *ret_from, int *ret_to);
/* 0 if the schema is absent. */
int pgstore_schema_version(struct pgstore *s, int *ret_version);

int pgstore_node_heartbeat(struct pgstore *s, const char *node, int64_t incarnation,
                           int64_t lease_ms);

struct pgstore_claim {
        bool won;
        char *mandate_id;  /* the winner's */
        char *claimed_by;
        int64_t epoch;     /* 1 if won, else 0 */
};
void pgstore_claim_free(struct pgstore_claim *c);

/* Claim the tick (schedule, fired_at_ms): if no node has, create the mandate
 * owned by node at epoch 1 with a lease of lease_ms, and its first rows
 * (lines, may be empty), all in one transaction.  Otherwise *ret tells the
 * winner.  Exactly one caller wins a tick. */
int pgstore_claim_tick(struct pgstore *s, const char *schedule, int64_t fired_at_ms,
                       const char *mandate_id, const char *node, int64_t lease_ms,
                       const char *lines, size_t len, struct pgstore_claim *ret);
/* A mandate that is not a tick (fire now, a retry): epoch 1, owned by node. */
int pgstore_mandate_create(struct pgstore *s, const char *mandate_id, const char *schedule,
                           const char *node, int64_t lease_ms, const char *lines, size_t len);

/* Extend the lease to lease_ms from the database's now. */
int pgstore_lease_renew(struct pgstore *s, const char *mandate_id, const char *node,
                        int64_t epoch, int64_t lease_ms);

struct pgstore_takeover {
        char *mandate_id;
        int64_t epoch;         /* the new one */
        char *prev_owner;      /* may be NULL */
        int64_t interrupted;   /* processing tool calls marked interrupted */
};
void pgstore_takeover_free(struct pgstore_takeover *t);
/* Take mandate_id (NULL: any) if its lease ended more than grace_ms ago by
 * the database's clock: owner = node, epoch + 1.  -EBUSY: none to take. */
int pgstore_lease_takeover(struct pgstore *s, const char *mandate_id, const char *node,
                           int64_t lease_ms, int64_t grace_ms, struct pgstore_takeover *ret);

/* Mark a running mandate ended (status: succeeded, failed, paused,
 * abandoned), fenced by epoch. */
int pgstore_mandate_finish(struct pgstore *s, const char *mandate_id, int64_t epoch,
                           const char *status);

struct pgstore_schedule {
        char *config_hash;          /* NULL: no row yet (version 0) */
        int64_t last_evaluated_ms;  /* -1: never */
        int64_t next_fire_ms;       /* -1: none */
        int64_t version;
};
void pgstore_schedule_free(struct pgstore_schedule *st);
int pgstore_schedule_get(struct pgstore *s, const char *name, struct pgstore_schedule *ret);
/* Compare-and-set: store the new state if the row is still at version (0:
 * no row yet) and last_evaluated_ms does not go backwards; *ret_version the
 * new version.  -EAGAIN: another node got there first. */
int pgstore_schedule_advance(struct pgstore *s, const char *name, const char *config_hash,
                             int64_t version, int64_t last_evaluated_ms, int64_t next_fire_ms,
                             int64_t *ret_version);

/* Append one barrier's lines in one transaction, fenced by epoch inside the
 * database.  first_seq 0: after the last row; else the seq of the first
 * line (a repeat of identical rows is a no-op).  *ret_last_seq (may be NULL)
 * the mandate's last seq after the call. */
int pgstore_wal_append(struct pgstore *s, const char *mandate_id, int64_t epoch,
                       int64_t first_seq, const char *lines, size_t len,
                       int64_t *ret_last_seq);
/* Append the mandate's rows, in seq order, to out: its WAL file's bytes. */
int pgstore_wal_read(struct pgstore *s, const char *mandate_id, struct kbuf *out,
                     int64_t *ret_nrows);
/* One row of kairos_wal as stored, for checking it (kairosctl wal verify
 * --db): nothing is assumed about the rows, gaps and bad lines included. */
struct pgstore_wal_row {
        int64_t seq;
        int64_t epoch;
        int64_t crc;      /* the crc column; -1: NULL */
        char *line;       /* the bytes as stored, NUL-terminated */
        size_t len;
};
void pgstore_wal_rows_free(struct pgstore_wal_row *rows, size_t n);
/* Every row of the mandate in seq order (none: *ret_rows NULL, *ret_n 0). */
int pgstore_wal_rows(struct pgstore *s, const char *mandate_id, struct pgstore_wal_row **ret_rows,
                     size_t *ret_n);
int pgstore_wal_last_seq(struct pgstore *s, const char *mandate_id, int64_t *ret_last_seq,
                         int64_t *ret_epoch);

enum pgstore_idem_outcome {
        PGSTORE_IDEM_CLAIMED,      /* run the tool */
        PGSTORE_IDEM_IN_PROGRESS,
        PGSTORE_IDEM_INTERRUPTED,
        PGSTORE_IDEM_MISMATCH,
        PGSTORE_IDEM_CACHED,       /* completed or failed: replay the result */
};
struct pgstore_idem_claim {
        enum pgstore_idem_outcome outcome;
        bool failed;               /* CACHED: the cached state is failed */
        char *result;              /* CACHED: the stored result, may be NULL */
        size_t result_len;
};
void pgstore_idem_claim_free(struct pgstore_idem_claim *c);
/* Claim the tool call key for (mandate_id, epoch), fenced: -ESTALE unless the
 * mandate is running at epoch. */
int pgstore_idem_claim(struct pgstore *s, const char *key, const char *tool,
                       const char *fingerprint, const char *mandate_id, int64_t epoch,
                       const char *node, const char *step_id, int64_t ttl_ms,
                       struct pgstore_idem_claim *ret);
/* End a claimed call (failed: false = completed), fenced the same way. */
int pgstore_idem_finish(struct pgstore *s, const char *key, const char *mandate_id,
                        int64_t epoch, bool failed, const char *result, size_t result_len);

/* Renew the leases of the mandates node holds, in one statement: ids[i] at
 * epochs[i], while still owned by node, at that epoch and running.
 * ret_renewed[i] false: lost (taken over, ended, or not this node's). */
int pgstore_lease_renew_many(struct pgstore *s, const char *node, const char *const *ids,
                             const int64_t *epochs, size_t n, int64_t lease_ms, bool *ret_renewed);
/* A graceful stop hands its mandates over: their leases end now (more than
 * grace_ms ago), so that any node may take them at once. */
int pgstore_lease_release_many(struct pgstore *s, const char *node, const char *const *ids,
                               const int64_t *epochs, size_t n, int64_t grace_ms);

/* The cluster's nodes, for kairosctl status. */
struct pgstore_node_row {
        char *node;
        int64_t incarnation;
        int64_t expires_in_ms;     /* by the database's clock; < 0: expired */
        int64_t held;              /* running mandates it owns */
};
void pgstore_node_rows_free(struct pgstore_node_row *rows, size_t n);
int pgstore_node_rows(struct pgstore *s, struct pgstore_node_row **ret_rows, size_t *ret_n);
