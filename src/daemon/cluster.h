/* SPDX-License-Identifier: MIT */
/* cluster: kairosd as one node of many sharing PostgreSQL ([Cluster]
 * Backend=postgres; docs/design.md §14).
 *
 * The rows in the database are the truth.  A node keeps, for each mandate
 * it holds, an unsynced copy of the mandate's rows as its WAL file (so
 * fold, decide and recovery read what they always read), and every WAL
 * barrier is one fenced transaction instead of an fdatasync (wal.h,
 * wal_options.barrier): the first barrier of a tick claims it (one winner),
 * every later one appends at the mandate's epoch.  A barrier that fails —
 * fenced (-ESTALE), lost claim (-EALREADY), database unreachable — means
 * the node no longer holds the mandate: it appends nothing more, kills its
 * handler and forgets it; whoever takes it over decides from the rows.
 *
 * A heartbeat thread (its own connection, never the loop, never the pool)
 * renews the node and the leases of the mandates it holds; mandates not
 * renewed are lost.  A node that cannot renew stops spawning and claiming
 * (cluster_may_act) and kills every handler before its leases can end
 * (monotonic clock, drift margin); the deadman process (deadman.h) does the
 * same if kairosd itself is stopped.  Expired mandates of any node are
 * taken over (epoch + 1), their rows copied to the WAL file, an owner
 * record appended, and startup recovery's decision runs on them.
 *
 * Without -Dpostgres=enabled every function is a stub: cluster_start
 * returns -EPROTONOSUPPORT. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct daemon;
struct mandate;
struct pgstore;
struct wal_options;

/* Backend=postgres: connect, create or migrate the schema, register the
 * node (a new incarnation), start the heartbeat thread and the deadman.
 * Before recovery.  -errno with a message in err. */
int cluster_start(struct daemon *d, char *err, size_t errlen);
/* READY: from now on the node takes over expired mandates. */
void cluster_ready(struct daemon *d);
/* Stopping: take over nothing more (what it holds is handed over by
 * cluster_stop). */
void cluster_quiesce(struct daemon *d);
/* Once the loop has stopped running mandates: stop the heartbeat thread,
 * handing over the mandates still held (their leases end at once). */
void cluster_stop(struct daemon *d);
/* After the loop is closed. */
void cluster_free(struct daemon *d);

/* This node's name (NodeName=), NULL with the file backend. */
const char *cluster_node(const struct daemon *d);
/* LeaseSec= in ms (0: file backend); the monotonic ms after which this
 * node's leases may have ended (0: file backend). */
int64_t cluster_lease_ms(const struct daemon *d);
int64_t cluster_deadline_ms(const struct daemon *d);
/* May this node spawn a handler or claim a tick now?  true with the file
 * backend; false once its lease is too close to its end. */
bool cluster_may_act(const struct daemon *d);

/* A connection for the calling pool thread's job: one of the node's few
 * (connected on first use, reconnected after a broken connection), lent to
 * this thread until cluster_thread_done; the same one on every call in
 * between.  Waits while every connection is lent, at most half a lease
 * (-ETIMEDOUT).  NULL and *ret_err on failure.  Never on the loop thread. */
struct pgstore *cluster_thread_store(struct daemon *d, int *ret_err);
/* The end of a pool thread's job: the connection it was lent, if any, goes
 * back to the node's pool.  Called by every job runner (serialq, ...). */
void cluster_thread_done(void);

/* Fill o's barrier hook for m's WAL (wal.h): with the file backend nothing
 * changes. */
void cluster_wal_options(struct mandate *m, struct wal_options *o);

/* m is held by this node (renewed with the node) / no longer (ended,
 * lost, dropped). */
void cluster_hold(struct mandate *m);
void cluster_release(struct mandate *m);
/* m is no longer this node's (fenced, claim lost, lease ended): nothing
 * more reaches the database, its handler is killed, and it is forgotten
 * once nothing of it runs.  why: for the log. */
void cluster_drop(struct mandate *m, const char *why);
bool cluster_dropped(const struct mandate *m);
/* A retry this node is still creating (its first barrier, the database's
 * kairos_retry_create, has not answered): another node's retry of the same
 * tick may still win it.  Always false with the file backend. */
bool cluster_retry_creating(const struct mandate *m);
/* m is no longer this node's (dropped: a lost or refused claim, fenced)
 * and nothing of it runs: forget it now (as the sweep at the next fence
 * tick would), so that a fire of its tick asks the database again instead
 * of answering from the stale copy.  false: kept (not dropped, or busy;
 * always with the file backend). */
bool cluster_forget_dropped(struct mandate *m);
/* For kairosctl status: this node, its lease, the cluster's nodes (as of
 * the last heartbeat); NULL with the file backend. */
typedef struct json_t json_t;
json_t *cluster_status(struct daemon *d);
/* Pool thread: the mandate ended (status succeeded, failed or abandoned). */
int cluster_finish(struct mandate *m, const char *status);
/* Pool thread, Concurrency=queue across the cluster (docs/design.md §14,
 * "Concurrency"): take the one slot of m's schedule in the database
 * (pgstore_slot_take, fenced by m's epoch): *ret_taken, else *ret_holder
 * (malloc'd, may be NULL) the mandate m waits for.  -ESTALE: not this
 * node's; other errors: the database did not answer (try again later). */
int cluster_slot_take(struct mandate *m, bool *ret_taken, char **ret_holder);
/* Pool thread: give the slot back while m stays running (it waits for an
 * approval or a review). */
int cluster_slot_release(struct mandate *m);
/* Take mandate_id, which this node does not hold, for an operator's command
 * (resolve, approve, resume): on a pool thread pgstore_mandate_take (a
 * paused mandate, or one whose lease ended; epoch + 1), its rows into the
 * WAL file, then adopted through recovery as a takeover is.  cb runs once
 * on the loop: err 0 with m once the adoption settled (the executor has
 * decided: paused for review, awaiting approval, paused or running), or an
 * error: -EBUSY (detail: the node holding it under a live lease), -EALREADY
 * (detail: how it ended), -ENOENT, -ESHUTDOWN, other (detail: why).  A
 * paused mandate with nothing in flight is released by its node (its row
 * marked paused, the node forgets it: docs/design.md §14). */
typedef void (*cluster_take_cb)(void *ctx, struct mandate *m, int err, const char *detail);
int cluster_take(struct daemon *d, const char *mandate_id, cluster_take_cb cb, void *ctx);
/* Run work on a pool thread (cluster_thread_store there), one at a time
 * for operators' reads of the database; done on the loop. */
int cluster_submit(struct daemon *d, void (*work)(void *arg), void (*done)(void *arg),
                   void *arg);
/* Pool thread, between attempts to reach the database: sleep 0.1, 0.2,
 * 0.4, 0.8, 1.6, then 2 s. */
void cluster_backoff(unsigned attempt);
/* The tool calls of mandate_id as recovery's evidence (heartbeat thread). */
struct evidence_index;
int cluster_evidence_index(struct pgstore *s, const char *mandate_id,
                           struct evidence_index **ret_ix);
