/* SPDX-License-Identifier: MIT */
/* evidence: what recovery knows beyond the WAL (docs/design.md §8), gathered
 * so that kairosd's startup recovery and `kairosctl recover --dry-run` hand
 * the same struct recovery_evidence to the same decision.  Pure, no I/O.
 *
 *   evidence_index     the idempotency store's tool calls by owner mandate,
 *                      built once from a loaded store (idem_foreach) and
 *                      read-only afterwards: any number of threads may read
 *                      it at once.  Per mandate the calls are sorted by step,
 *                      start and key.
 *   evidence_schedule  what a schedule declares: the phases that change the
 *                      world (Effects=), EffectsVia=, which phases have a
 *                      command, Probe=.
 *   evidence_mandate   one mandate's struct recovery_evidence (and the
 *                      storage it points into).
 *
 * A store that could not be loaded, or is quarantined, knows nothing for
 * sure: the index is then "unknown" and no step is decided by the store
 * (neither tool_call_interrupted nor effects_journaled). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kairos/config.h"
#include "kairos/idem.h"
#include "kairos/planner.h"
#include "kairos/recovery.h"

struct evidence_call {
        const char *key;          /* full key, "<tool>:<key>" */
        const char *tool;
        const char *step;         /* owner step_id */
        uint32_t attempt;         /* owner attempt */
        enum idem_state state;
        int64_t created_ms;
        int64_t finished_ms;      /* 0 unless completed/failed */
        const char *check;        /* its own check (tool run --check; idem.h), or NULL */
        struct idem_client client; /* the process that claimed it (.pid 0: not known) */
};
/* qsort order of a mandate's calls: by step, then start, then key. */
int evidence_call_cmp(const void *a, const void *b);

struct evidence_index;

/* Every owned entry of s (TTL not checked: the store was just loaded and
 * swept).  s NULL: an "unknown" index (the store is not available). */
int evidence_index_build(struct idem_store *s, struct evidence_index **ret_ix);
/* A known index of mandate_id's calls (copied; key, tool and step
 * required): the evidence of one mandate from elsewhere than the local store
 * (cluster mode: its rows in the database).  n 0: known, no calls. */
int evidence_index_from_calls(const char *mandate_id, const struct evidence_call *calls,
                              size_t n, struct evidence_index **ret_ix);
/* An index that knows nothing (store unavailable or quarantined). */
int evidence_index_unknown(struct evidence_index **ret_ix);
void evidence_index_free(struct evidence_index *ix);
/* false for an "unknown" index */
bool evidence_index_known(const struct evidence_index *ix);
/* The calls owned by mandate_id (count returned; *ret_calls borrows from ix,
 * NULL when none). */
size_t evidence_index_calls(const struct evidence_index *ix, const char *mandate_id,
                            const struct evidence_call **ret_calls);
/* Entries in the index. */
size_t evidence_index_size(const struct evidence_index *ix);

struct evidence_schedule {
        unsigned effects;                  /* Effects= bits (1 << phase) */
        bool effects_via_kairosctl;        /* EffectsVia=kairosctl */
        bool has_command[PLANNER_PHASES];
        bool has_probe;                    /* Probe= set */
};

void evidence_schedule_from_config(const struct config_schedule *sc,
                                   struct evidence_schedule *ret);

struct evidence_mandate {
        struct recovery_evidence ev;       /* hand &ev to decide_recover */
        struct recovery_step_evidence *steps;
        char **json;                       /* one per step (steps[i].idem_json) */
        size_t n;
};

/* The evidence of one mandate: the schedule's declarations and, per step
 * that owns tool calls, how many are still open (processing or interrupted)
 * or finished, how many open ones carry a check, and as idem_json the open ones if any, else the finished ones:
 * [{"key","tool","state","attempt","started"}...] (started: UTC,
 * 2026-01-01T00:00:00.000Z).  ix may be NULL (= unknown).  Release with
 * evidence_mandate_release. */
int evidence_for_mandate(const struct evidence_index *ix, const char *mandate_id,
                         const struct evidence_schedule *es, struct evidence_mandate *ret);
void evidence_mandate_release(struct evidence_mandate *em);

/* The calls as the JSON array above (all of them), appended to out. */
int evidence_calls_json(const struct evidence_call *calls, size_t n, struct kbuf *out);
/* ms since the epoch as 2026-01-01T00:00:00.000Z. */
#define EVIDENCE_TS_SIZE 64
void evidence_format_ms(int64_t ms, char buf[EVIDENCE_TS_SIZE]);


/* Which source decided a verdict: "wal" (the step's records, §7), "step"
 * (what the step is: declared_rerunnable, no_command), "idem" (the
 * idempotency store: tool_call_interrupted, effects_journaled) or "probe". */
const char *evidence_source_name(const struct verdict *v);
