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
 *   -EBUSY    nothing to take over; or (pgstore_mandate_take) the mandate is
 *             running under a live lease
 *   -EALREADY the mandate has ended (pgstore_mandate_take)
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
/* false once a call found the connection broken (until pgstore_reset
 * succeeds); no round trip. */
bool pgstore_connected(const struct pgstore *s);
/* Whether the last call's -ENOTCONN was a write refused as read-only
 * (SQLSTATE 25006: a standby, a fenced old primary): it wrote nothing, so
 * any call may be asked again once pgstore_reset found the primary. */
bool pgstore_refused_read_only(const struct pgstore *s);
/* Before a call whose outcome must not be unknown for want of a live
 * connection (a tool call's claim or end): a round trip, and a reconnect if
 * the connection broke meanwhile (the server restarted, ...).  0: the
 * connection answers now. */
int pgstore_ping(struct pgstore *s);
const char *pgstore_error(const struct pgstore *s);
/* The database's clock now (ms since the epoch), for a node's skew and for
 * a tick claim refused with -ETIME. */
int pgstore_db_now(struct pgstore *s, int64_t *ret_ms);
/* This session's synchronous_standby_names and synchronous_commit (what
 * the server's acknowledgement of a commit promises; freed by the
 * caller). */
int pgstore_commit_settings(struct pgstore *s, char **ret_standby_names,
                            char **ret_synchronous_commit);

/* Create or migrate the schema to PGSCHEMA_VERSION, in one transaction under
 * an advisory lock (concurrent callers wait, then find nothing to do). */
int pgstore_migrate(struct pgstore *s, int *ret_from, int *ret_to);
/* 0 if the schema is absent. */
int pgstore_schema_version(struct pgstore *s, int *ret_version);

int pgstore_node_heartbeat(struct pgstore *s, const char *node, int64_t incarnation,
                           int64_t lease_ms);
/* A new incarnation of node (1, or one more than its last), alive for
 * lease_ms from the database's now. */
int pgstore_node_register(struct pgstore *s, const char *node, int64_t lease_ms,
                          int64_t *ret_incarnation);
/* In one transaction: the node's heartbeat, and lease_ms more for each
 * mandate ids[i] the node still owns, running, at epochs[i].  -ESTALE (and
 * nothing renewed) if the node is registered at another incarnation.
 * *ret_renewed: n bools (malloc'd; NULL when n is 0), false = lost: not this
 * node's at that epoch any more, not running, or absent.  n 0: a plain
 * heartbeat. */
int pgstore_renew_held(struct pgstore *s, const char *node, int64_t incarnation,
                       const char *const *ids, const int64_t *epochs, size_t n,
                       int64_t lease_ms, bool **ret_renewed);

struct pgstore_claim {
        bool won;
        char *mandate_id;  /* the winner's (NULL: rejected) */
        char *claimed_by;
        int64_t epoch;     /* 1 if won, else 0 */
        /* pgstore_claim_tick_reject: the tick was refused, now or by an
         * earlier claim, while mandate busy was unfinished (busy_status:
         * running or paused, as then) */
        bool rejected;
        char *busy;
        char *busy_status;
};
void pgstore_claim_free(struct pgstore_claim *c);

/* Claim the tick (schedule, fired_at_ms): if no node has, create the mandate
 * owned by node at epoch 1 with a lease of lease_ms, and its first rows
 * (lines, may be empty), all in one transaction.  Otherwise *ret tells the
 * winner.  Exactly one caller wins a tick. */
int pgstore_claim_tick(struct pgstore *s, const char *schedule, int64_t fired_at_ms,
                       const char *mandate_id, const char *node, int64_t lease_ms,
                       const char *lines, size_t len, struct pgstore_claim *ret);
/* As pgstore_claim_tick, for a schedule with Concurrency=reject: under the
 * schedule's slot lock, the tick is refused (ret->rejected, ret->busy) while
 * another mandate of the schedule is running or paused in the database, and
 * the refusal is remembered: every later claim of the tick gets it. */
int pgstore_claim_tick_reject(struct pgstore *s, const char *schedule, int64_t fired_at_ms,
                              const char *mandate_id, const char *node, int64_t lease_ms,
                              const char *lines, size_t len, struct pgstore_claim *ret);
/* Concurrency=queue across the cluster: take the one slot of the mandate's
 * schedule for mandate_id, fenced (-ESTALE unless it is running at epoch).
 * *ret_taken: it holds the slot (now, or already: a takeover inherits it);
 * otherwise it waits in line (from its first refused take, by the
 * database's clock) and *ret_holder (malloc'd, may be NULL) names the
 * mandate it waits for.  The slot is freed when the mandate's status leaves
 * running (pgstore_mandate_finish) or by pgstore_slot_release. */
int pgstore_slot_take(struct pgstore *s, const char *mandate_id, int64_t epoch,
                      bool *ret_taken, char **ret_holder);
/* Give the slot back (and leave the line) while the mandate stays running:
 * awaiting an approval or a review.  Fenced; holding nothing is no error. */
int pgstore_slot_release(struct pgstore *s, const char *mandate_id, int64_t epoch);
/* A mandate that is not a tick (fire now, a retry): epoch 1, owned by node. */
int pgstore_mandate_create(struct pgstore *s, const char *mandate_id, const char *schedule,
                           const char *node, int64_t lease_ms, const char *lines, size_t len);

/* kairosctl retry in the cluster (docs/design.md §3): retry number `retry`
 * of the tick (schedule, fired_at_ms), of mandate retry_of; forced: the
 * operator gave a reason (a tick that ended succeeded may run again). */
struct pgstore_retry {
        const char *mandate_id;
        const char *schedule;
        int64_t fired_at_ms;
        const char *retry_of;
        int retry;
        bool forced;
};
/* Create the retry's mandate as pgstore_mandate_create does, compare-and-set
 * under the tick's lock in one transaction: *ret_created, or not and
 * *ret_busy (malloc'd) is the tick's mandate that refused it, with its
 * status *ret_busy_status (malloc'd): running or paused (unfinished; the
 * retry itself when an earlier call created it), succeeded (not forced), or
 * whatever the status of an ended mandate that holds the id already.  At
 * most one retry of a tick is unfinished, whoever writes. */
int pgstore_retry_create(struct pgstore *s, const struct pgstore_retry *rt, const char *node,
                         int64_t lease_ms, const char *lines, size_t len, bool *ret_created,
                         char **ret_busy, char **ret_busy_status, char **ret_busy_owner);
/* The highest retry number of the tick in the database (0: none). */
int pgstore_tick_last_retry(struct pgstore *s, const char *schedule, int64_t fired_at_ms,
                            int *ret_retry);
/* The retries of mandate retry_of (its tick: schedule, fired_at_ms), by
 * retry number: *ret_ids (malloc'd, pgstore_strings_free), *ret_n. */
int pgstore_tick_retries_of(struct pgstore *s, const char *schedule, int64_t fired_at_ms,
                            const char *retry_of, char ***ret_ids, size_t *ret_n);
void pgstore_strings_free(char **v, size_t n);

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
 * abandoned), fenced by epoch: the lease ends, ended_at is set.  A paused
 * mandate stays the last owner's until pgstore_mandate_take. */
int pgstore_mandate_finish(struct pgstore *s, const char *mandate_id, int64_t epoch,
                           const char *status);

/* pgstore_mandate_finish(.., "paused") and how: paused_as its status word
 * (paused, paused_review, awaiting_approval), reason (may be NULL) why;
 * both cleared once the row leaves paused (schema version 7). */
int pgstore_mandate_park(struct pgstore *s, const char *mandate_id, int64_t epoch,
                         const char *paused_as, const char *reason);

/* Take mandate_id for an operator's action (resolve, approve) from any
 * node: a paused one, or a running one whose lease ended more than grace_ms
 * ago by the database's clock.  Owner = node, epoch + 1, running, lease_ms;
 * the old epochs' processing tool calls become interrupted.  *ret_epoch the
 * new epoch; *ret_prev_owner (may be NULL; malloc'd, may be NULL) the last
 * owner.  -EBUSY running under a live lease (its owner acts), -EALREADY
 * ended (succeeded, failed, abandoned), -ENOENT no such mandate. */
int pgstore_mandate_take(struct pgstore *s, const char *mandate_id, const char *node,
                         int64_t lease_ms, int64_t grace_ms, int64_t *ret_epoch,
                         char **ret_prev_owner);

/* A mandate row for `kairosctl list` on any node. */
struct pgstore_mandate_row {
        char *mandate_id;
        char *schedule;         /* NULL: none */
        char *fired_at;         /* as in the WAL (YYYY-MM-DDTHH:MM:SSZ, or with .mmm when
                                 * not whole seconds); NULL: none */
        int64_t fired_ms;       /* -1: none */
        char *status;           /* running, succeeded, failed, paused, abandoned */
        char *owner;            /* NULL: none */
        int64_t epoch;
        bool leased;            /* running with a lease: lease_left_ms holds */
        int64_t lease_left_ms;  /* by the database's clock; negative: expired that long ago */
        int64_t last_seq;
        int64_t created_ms;
        int64_t ended_ms;       /* -1: not ended (or ended before schema version 2) */
        bool slot_waiting;      /* running, waiting for its schedule's slot (queued) */
        char *paused_as;        /* paused: how its node released it (paused_review, ...);
                                 * NULL: not said (or not paused) */
        char *paused_reason;    /* ... and why; NULL: none */
};
struct pgstore_mandate_filter {
        const char *status;     /* NULL: any */
        const char *schedule;   /* NULL: any */
        int64_t since_ms;       /* fired_at >= since_ms; -1: any */
        const char *after;      /* cursor: the rows strictly after this mandate; NULL: first */
        size_t limit;           /* 0: all */
        const char *mandate_id; /* only this mandate; NULL: any */
};
void pgstore_mandate_rows_free(struct pgstore_mandate_row *rows, size_t n);
/* The mandates matching f, newest first (fired_at, else created_at, then
 * mandate_id, descending: the daemon's order); *ret_total (may be NULL) how
 * many match after the cursor, limit aside.  -ENOENT: no mandate f->after. */
int pgstore_mandates_list(struct pgstore *s, const struct pgstore_mandate_filter *f,
                          struct pgstore_mandate_row **ret_rows, size_t *ret_n,
                          size_t *ret_total);

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
        char *fingerprint;         /* the stored one (MISMATCH: not the caller's) */
        int64_t created_ms;        /* the entry's (CLAIMED: now) */
        int64_t updated_ms;        /* CACHED: when it finished */
};
void pgstore_idem_claim_free(struct pgstore_idem_claim *c);
/* Claim the tool call key for (mandate_id, epoch), made by attempt of
 * step_id, fenced: -ESTALE unless the mandate is running at epoch. */
int pgstore_idem_claim(struct pgstore *s, const char *key, const char *tool,
                       const char *fingerprint, const char *mandate_id, int64_t epoch,
                       const char *node, const char *step_id, uint32_t attempt,
                       int64_t ttl_ms, struct pgstore_idem_claim *ret);
/* End a claimed call (failed: false = completed), fenced the same way. */
int pgstore_idem_finish(struct pgstore *s, const char *key, const char *mandate_id,
                        int64_t epoch, bool failed, const char *result, size_t result_len);
/* A claimed call whose caller went before its result: interrupted, or (drop:
 * it is known to have done nothing) forgotten, so that a retry runs it.
 * Fenced the same way. */
int pgstore_idem_release(struct pgstore *s, const char *key, const char *mandate_id,
                         int64_t epoch, bool drop);

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
        int64_t reviews;           /* mandates it released paused for review */
};
void pgstore_node_rows_free(struct pgstore_node_row *rows, size_t n);
int pgstore_node_rows(struct pgstore *s, struct pgstore_node_row **ret_rows, size_t *ret_n);

/* A row of kairos_idem, for recovery's evidence after a takeover. */
struct pgstore_idem_row {
        char *key;
        char *tool;
        char *step_id;          /* NULL: not made by a step */
        uint32_t attempt;       /* 0: not recorded (schema version 1) */
        char *state;            /* processing, completed, failed, interrupted */
        char *owner;            /* the node that claimed it */
        int64_t epoch;
        int64_t created_ms;
        int64_t updated_ms;
};
void pgstore_idem_rows_free(struct pgstore_idem_row *rows, size_t n);
/* Every tool call of the mandate, by step, creation and key (none: *ret_rows
 * NULL, *ret_n 0). */
int pgstore_idem_of_mandate(struct pgstore *s, const char *mandate_id,
                            struct pgstore_idem_row **ret_rows, size_t *ret_n);

/* An operator resolved step_id of mandate_id (kairosctl resolve) on node,
 * which holds the mandate at epoch: the step's interrupted calls are
 * dropped (result NULL: --retry, so a re-run runs them) or completed with
 * result, which expires after ttl_ms (--done), in one statement.  Their
 * keys, one a line, in *ret_keys (owned; "" for none).  -ESTALE unless
 * node holds the mandate at epoch (nothing changed). */
int pgstore_idem_settle_step(struct pgstore *s, const char *mandate_id, const char *step_id,
                             const char *node, int64_t epoch, const char *result,
                             size_t result_len, int64_t ttl_ms, char **ret_keys);

struct evidence_index;
/* The rows (of mandate_id, from pgstore_idem_of_mandate) as a known
 * evidence index (kairos/evidence.h) holding that mandate's calls: rows
 * without a step are left out; a finished call's finish time is its
 * updated time.  -EBADMSG: a row with an unknown state.  No database. */
int pgstore_idem_evidence(const char *mandate_id, const struct pgstore_idem_row *rows, size_t n,
                          struct evidence_index **ret_ix);
