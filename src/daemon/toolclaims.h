/* SPDX-License-Identifier: MIT */
/* toolclaims: where a step's tool calls are claimed, one driver per
 * backend (docs/design.md §14, "Drivers").  The idempotency service
 * (idem_run.c, idem_write.c, idem_core.c) hands a call from a running
 * step at an epoch to d->toolclaims and keeps in its local store what the
 * driver does not take; it never asks which driver runs.  main.c picks one
 * at start:
 *   toolclaims_files     (driver_files.c) one host: every claim is in the
 *                        local store;
 *   toolclaims_postgres  (cluster_idem.c, -Dpostgres=enabled only) a
 *                        step's calls in the cluster's database, fenced by
 *                        (mandate, epoch).
 * Each hook answers true when the driver took the call (and answers it). */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "daemon.h"
#include "result.h"

struct idem_call;
struct idem_claim;
struct idem_step_owner;
struct write_op;

struct toolclaims {
        const char *name;
        /* m is no longer this node's: its calls are fenced */
        bool (*dropped)(const struct mandate *m);
        /* tool-begin of step's call at epoch (> 0): claimed by the driver */
        bool (*begin)(struct idem_call *call, const char *key, const char *tool, const char *fp,
                      const struct idem_step_owner *step, int64_t epoch);
        /* tool-finish of claim c (freed when taken) */
        bool (*finish)(struct idem_call *call, struct idem_claim *c, json_int_t exit_status,
                       const char *out, const char *err, const char *eclass, const char *emsg);
        /* the caller of claim c went (why: for the log; c freed when taken) */
        bool (*closed)(struct idem_claim *c, const char *why);
        /* tool-write of step at epoch (> 0): claimed by the driver, then
         * written (idem_write_work), its outcome recorded by write_done */
        bool (*write_begin)(struct write_op *op, const struct idem_step_owner *step,
                            int64_t epoch);
        bool (*write_done)(struct write_op *op);
        /* resolve --retry|--done of a step, or its probe's word
         * (idem_service_settle_step): answered to by the driver (NULL, or
         * false: the local store) */
        bool (*settle_step)(struct daemon *d, const char *mandate_id, const char *step_id,
                            bool complete, uid_t uid, const char *reason, const char *how,
                            struct op_reply to);
};

extern const struct toolclaims toolclaims_files;
extern const struct toolclaims toolclaims_postgres; /* (built with PostgreSQL only) */
