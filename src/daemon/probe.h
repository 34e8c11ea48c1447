/* SPDX-License-Identifier: MIT */
/* probe: [Exec] Probe= — the world's word on a step that a crash left
 * interrupted and that nothing else decides (docs/design.md §8.1, source 4;
 * §8 for the checks of tool calls).
 *
 * Recovery hands a mandate here with status `probing`; after READY=1 its
 * probe runs as a handler does, through the runner (runner.h), with the
 * step's KAIROS_* environment plus KAIROS_PROBE=1 and the step's document
 * on stdin, killed after ProbeTimeoutSec= (SIGTERM, SIGKILL 5 s later);
 * probe_judge (kairos/probeout.h) judges the run and decide_recover takes
 * the decision again with its word, on the mandate's serial queue.  At most
 * PROBES_MAX_RUNNING run at once.  A step's interrupted tool calls that
 * carry their own check (kairosctl tool run --check) run those checks
 * first, one at a time; each word settles its call in the store
 * (idem_service_settle_check), and the probe's word settles the step's
 * calls (idem_service_settle_step), before its records. */
#pragma once

#include <stdbool.h>

#include "kairos/config.h"
#include "kairos/probeout.h"
#include "kairos/recovery.h"

#define PROBES_MAX_RUNNING 8

struct daemon;
struct mandate;

/* Recovery left step_id of m for its probe: m becomes `probing`; the probe
 * runs after probe_ready. */
void probe_enqueue(struct mandate *m, const char *step_id);
/* READY=1 was sent: start the probes. */
void probe_ready(struct daemon *d);
/* kairosd stops: waiting probes are dropped, running ones killed (nothing
 * is recorded for them). */
void probe_stop(struct daemon *d);
/* After the loop ended (its handles closed). */
void probe_free(struct daemon *d);
