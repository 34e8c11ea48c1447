/* SPDX-License-Identifier: MIT */
/* idem_service: kairosd's idempotency store (DESIGN §11) behind the control
 * socket.  The store (include/kairos/idem.h) lives on the loop thread; its
 * log <state>/idem/idem.jsonl is loaded, appended, fdatasync'ed and compacted
 * by jobs of a serial queue of its own on the thread pool, so no fdatasync
 * ever blocks the loop.  Records produced while a flush runs go out together
 * in the next one (group commit).
 *
 * Commands (args → result; errors carry the store's codes in_progress,
 * interrupted, mismatch, store_full, and quarantined, io_error, unavailable):
 *   tool-begin  {tool, key? | input?, fingerprint?}
 *               → {outcome:"proceed", key, ...} once the begin record is
 *                 durable; the claim belongs to the connection: if it closes
 *                 before tool-finish the entry becomes interrupted;
 *               → {outcome:"completed"|"failed", cached:true, key,
 *                  exit_status, stdout, stderr (base64), error_class?, ...}
 *   tool-finish {key, exit_status, stdout, stderr, error_class?, error_msg?}
 *               (only on the connection holding the claim; answered once the
 *               finish record is durable)
 *   tool-write  {key, path, content (base64)} → atomic write within
 *               WriteRoots= (no symbolic link below a root), once per key;
 *               one that failed before the rename is not kept
 *   idem-stats, idem-get {key}, idem-forget {key, reason}
 *   test-idem-clock {advance_sec} (test hooks only) */
#pragma once

#include "control.h"
#include "daemon.h"
#include "kairos/idem.h"

/* Create the store (TTLSec=, MaxEntries=) and load <state>/idem/ on the
 * service's queue; loaded(d) runs on the loop when done, also when the load
 * failed (the daemon runs on; tool commands then answer "unavailable"). */
int idem_service_start(struct daemon *d, void (*loaded)(struct daemon *d));
/* A reload is about to take cfg: TTLSec= and MaxEntries= changes need a
 * restart (logged); WriteRoots= are opened again at the next tool-write. */
void idem_service_reload(struct daemon *d, const struct config *cfg);
/* After the loop has stopped. */
void idem_service_free(struct daemon *d);
/* The store's counters; -EAGAIN while it is not loaded. */
int idem_service_stats(struct daemon *d, struct idem_stats *ret_stats);

void idem_cmd_tool_begin(struct control_request *req);
void idem_cmd_tool_finish(struct control_request *req);
void idem_cmd_tool_write(struct control_request *req);
void idem_cmd_stats(struct control_request *req);
void idem_cmd_get(struct control_request *req);
void idem_cmd_forget(struct control_request *req);
#ifdef KAIROS_TEST_HOOKS
/* Move the store's clock forward by advance_sec (TTL tests). */
void idem_cmd_test_clock(struct control_request *req);
#endif
