/* SPDX-License-Identifier: MIT */
/* probe: [Exec] Probe= — the world's word on a step that a crash left
 * interrupted and that nothing else decides (docs/design.md §8.1, source 4).
 *
 * Startup recovery decides every WAL before READY=1; a step that only its
 * probe can decide is left undecided (no record) and its mandate is handed
 * here with status `probing`.  After READY=1 (a slow probe never holds up
 * startup) each probe runs as a handler does, through the runner (runner.h):
 * its own process group and cgroup with the schedule's limits, dies with
 * kairosd, the step's KAIROS_* environment plus KAIROS_PROBE=1, the step's
 * document on stdin (the attempt that was interrupted), killed after
 * ProbeTimeoutSec= (SIGTERM, SIGKILL 5 s later).  Its run is judged by
 * probe_judge (kairos/probeout.h), and the decision is taken again with its
 * word by the same function as at startup (decide_recover), on the
 * mandate's serial queue: its records appended and made durable, then the
 * mandate resumes or is paused for review.  At most PROBES_MAX_RUNNING run
 * at once.  A probe whose mandate stopped probing meanwhile (cancelled), or
 * that was cut short by kairosd stopping, leaves nothing behind: the step
 * stays open and the next start probes it again.
 *
 * A step with interrupted tool calls that carry their own check (kairosctl
 * tool run --check) runs those checks first, one at a time, the same way;
 * each word settles its call in the store (idem_service_settle_check)
 * before the step is decided again from the store (docs/design.md §8).
 * The probe's word on a step with interrupted calls settles them too
 * (idem_service_settle_step), before its records. */
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
