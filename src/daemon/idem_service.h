/* SPDX-License-Identifier: MIT */
/* idem_service: kairosd's idempotency store.  The store
 * (include/kairos/idem.h) lives on the loop thread; its
 * log <state>/idem/idem.jsonl is loaded, appended, fdatasync'ed and compacted
 * by jobs of a serial queue of its own on the thread pool, so no fdatasync
 * ever blocks the loop.  Records produced while a flush runs go out together
 * in the next one (group commit).
 *
 * It knows nothing of the control protocol: each operation takes a call
 * (its arguments as a JSON object, who asks) and reports once through the
 * call's done callback; commands.c turns requests into calls and results
 * into replies.
 *
 * Operations (args → result; errors carry the store's codes in_progress,
 * interrupted, mismatch, store_full, and quarantined, io_error, unavailable):
 *   tool-begin  {tool, key? | input?, fingerprint?}
 *               → {outcome:"proceed", key, ...} once the begin record is
 *                 durable; the claim belongs to the call's owner: if it goes
 *                 before tool-finish the entry becomes interrupted;
 *               → {outcome:"completed"|"failed", cached:true, key,
 *                  exit_status, stdout, stderr (base64), error_class?, ...}
 *   tool-finish {key, exit_status, stdout, stderr, error_class?, error_msg?}
 *               (only by the owner holding the claim; answered once the
 *               finish record is durable)
 *   tool-write  {key, path, content (base64)} → atomic write within
 *               WriteRoots= (no symbolic link below a root), once per key;
 *               one that failed before the rename is not kept; at most
 *               MaxWriteBytes= ("too_large").  With {key, path, stream:true}
 *               and no content, a duplicate is answered as above, else
 *               {outcome:"send", key, max_bytes} opens a write on the
 *               connection: tool-write-data {data (base64)} → {bytes} (the
 *               total so far) appends to its temporary file, one part at a
 *               time; tool-write-end {} claims the key with the content's
 *               sha256 and length and renames, answered as tool-write.  A
 *               connection that closes before the end leaves nothing.
 *   idem-stats, idem-get {key}, idem-forget {key, reason}
 * tool-begin and tool-write take args.epoch? (kairosctl: KAIROS_EPOCH): a
 * call from a step whose mandate this node holds at another epoch, or no
 * longer holds, or with an epoch from no step, is refused "fenced".  A
 * step's calls go to the driver of tool-call claims (toolclaims.h): in
 * cluster mode they are claimed and finished in the database (pool threads,
 * fenced by (mandate, epoch): "fenced" when the database refuses, and the
 * node gives the mandate up); the local store keeps the calls of no step.
 *   test-idem-clock {advance_sec} (test hooks only)
 *
 * The operations are answered by idem_run.c (tool-begin, tool-finish),
 * idem_write.c (tool-write) and idem_admin.c (idem-*), over idem_core.c. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <sys/types.h>

#include "daemon.h"
#include "kairos/idem.h"
#include "result.h"


struct idem_claim;

/* Who holds tool-begin claims (commands.c: the connection a request came
 * on).  A claim is tied to its owner by attach, which returns false (and
 * ties nothing) when the owner is already gone; when the owner goes away
 * before tool-finish it calls idem_claim_owner_gone for each claim still
 * tied (the entry becomes interrupted); release unties a claim that
 * tool-finish ended.  Only a call with the same id may finish a claim. */
struct idem_owner {
        const void *id;
        void *ctx;
        bool (*attach)(void *ctx, struct idem_claim *c, void **ret_hold);
        void (*release)(void *hold);
};

struct idem_call {
        struct daemon *d;
        json_t *args;              /* an object; must stay valid until done runs */
        uid_t uid;                 /* who asks (idem-forget records it) */
        pid_t pid;                 /* its process (SO_PEERCRED): tool calls are
                                    * attributed to the step of its process group */
        struct idem_owner owner;   /* tool-begin, tool-finish */
        /* Runs exactly once, on the loop thread, possibly before the
         * operation returns. */
        void (*done)(void *ctx, const struct op_result *r);
        void *ctx;
};

/* Create the store (TTLSec=, MaxEntries=) and load <state>/idem/ on the
 * service's queue; loaded(d) runs on the loop when done, also when the load
 * failed (the daemon runs on; tool commands then answer "unavailable"). */
int idem_service_start(struct daemon *d, void (*loaded)(struct daemon *d));
/* A reload is about to take cfg: TTLSec= and MaxEntries= changes need a
 * restart (logged); WriteRoots= are opened again at the next tool-write. */
void idem_service_reload(struct daemon *d, const struct config *cfg);
/* After the loop has stopped. */
void idem_service_free(struct daemon *d);

/* Attribution of tool calls to steps: fn(d, pid, ret) fills *ret with the
 * running step whose handler's process group pid belongs to and returns 0,
 * or returns -ESRCH.  Every claim (tool-begin, tool-write) made from such a
 * process is recorded with that owner (docs/design.md §11). */
typedef int (*idem_step_lookup_fn)(struct daemon *d, pid_t pid, struct idem_step_owner *ret);
void idem_service_set_step_lookup(struct daemon *d, idem_step_lookup_fn fn);
/* The process groups of tool calls (docs/design.md §10): fn(d, pid, true)
 * before a `tool run` of a running step is told to lead a process group of
 * its own (0, or it stays in its handler's), fn(d, pid, false) once the
 * call is over on its connection. */
typedef int (*idem_tool_group_fn)(struct daemon *d, pid_t pid, bool add);
void idem_service_set_tool_groups(struct daemon *d, idem_tool_group_fn fn);
/* The store's owned calls by mandate, for recovery (kairos/evidence.h): a
 * snapshot of the loaded store, or an "unknown" index when the store is not
 * loaded, quarantined or failed (no call can then be ruled out). */
struct evidence_index;
int idem_service_evidence_index(struct daemon *d, struct evidence_index **ret_ix);
/* The tool calls owned by mandate_id's steps, for show: {step_id: [{key,
 * tool, state, attempt, started, finished}, ...]} (ms times as UTC text,
 * finished null while open), sorted by step, start and key; NULL while the
 * store is not loaded (or out of memory). */
json_t *idem_service_calls_json(struct daemon *d, const char *mandate_id);
/* The store's counters; -EAGAIN while it is not loaded. */
int idem_service_stats(struct daemon *d, struct idem_stats *ret_stats);

/* An operator resolved a step under review (kairosctl resolve; how NULL),
 * or its probe spoke at recovery (how names it, uid is kairosd's): its
 * interrupted tool calls (owned by step_id of mandate_id, any attempt) are
 * released (complete false: forgotten, recorded with uid and reason, so
 * that the step's re-run runs each once) or completed by the operator
 * (complete true: a duplicate is answered from the store, the result
 * saying who completed it).  Answers to once those records are durable:
 * {"keys": [...]} (none: []), or an error (the store not loaded; in
 * cluster mode: a driver that cannot do it refuses, naming the keys). */
void idem_service_settle_step(struct daemon *d, const char *mandate_id, const char *step_id,
                              bool complete, uid_t uid, const char *reason, const char *how,
                              struct op_reply to);

/* An interrupted call of a step that carries its own check (kairosctl tool
 * run --check; docs/design.md §8): the oldest one of step_id of
 * mandate_id → 1 and *ret (release it), none → 0, or -ENOMEM. */
struct idem_check_call {
        char key[IDEM_FULL_KEY_SIZE];  /* "<tool>:<key>" */
        char tool[IDEM_TOOL_MAX + 1];
        char *check;                   /* {"cmd":[...],"argv":[...]} (owned) */
        int64_t created_ms;
        bool interrupted;
};
int idem_service_step_check(struct daemon *d, const char *mandate_id, const char *step_id,
                            struct idem_check_call *ret);
void idem_check_call_release(struct idem_check_call *c);
/* Whether step_id of mandate_id may own open (interrupted) calls: the
 * local store holds one, or the claims driver keeps them elsewhere. */
bool idem_service_step_may_own_open(struct daemon *d, const char *mandate_id,
                                    const char *step_id);
/* Settle call key by its check's word: done → completed (its result
 * {"exit_status":0,"stdout":"","stderr":"","settled":"by its check",
 * "check_result":V}, V from result_json), else released (recorded like a
 * forget, uid -2, reason why).  cb(ctx, 0 or -errno) once durable. */
void idem_service_settle_check(struct daemon *d, const char *key, bool done,
                               const char *result_json, const char *why,
                               void (*cb)(void *ctx, int err), void *ctx);

void idem_tool_begin(const struct idem_call *call);
void idem_tool_finish(const struct idem_call *call);
void idem_tool_write(const struct idem_call *call);
void idem_tool_write_data(const struct idem_call *call);
void idem_tool_write_end(const struct idem_call *call);
void idem_stats_get(const struct idem_call *call);
void idem_get_entry(const struct idem_call *call);
void idem_forget_entry(const struct idem_call *call);
#ifdef KAIROS_TEST_HOOKS
/* Move the store's clock forward by advance_sec (TTL tests). */
void idem_test_clock(const struct idem_call *call);
#endif
/* The owner of c went away before tool-finish (see struct idem_owner). */
void idem_claim_owner_gone(struct idem_claim *c);
