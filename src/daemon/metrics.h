/* SPDX-License-Identifier: MIT */
/* metrics: counters the daemon keeps about itself, rendered as Prometheus
 * text or OpenMetrics (include/kairos/openmetrics.h) for `kairosctl metrics`
 * and, with MetricsFile=, written to a file every MetricsIntervalSec= for
 * node_exporter's textfile collector (docs: kairosd(8), METRICS).
 *
 * State lives in one struct metrics, reached only through these functions;
 * every function accepts NULL (then does nothing).  All run on the loop
 * thread except the fdatasync timing, which the WAL's kio calls on pool
 * threads (atomics). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "kairos/kbuf.h"
#include "kairos/openmetrics.h"
#include "kairos/wal.h"

struct daemon;
struct metrics;

/* Needs d->loop and d->jobs; NULL if out of memory (the daemon runs on). */
struct metrics *metrics_new(struct daemon *d);
/* After the loop has stopped (its timer closed by then). */
void metrics_free(struct metrics *mx);
/* Start writing MetricsFile= (if set): now, then every MetricsIntervalSec=. */
void metrics_start(struct metrics *mx);
/* d->cfg was replaced: take the new MetricsFile= / MetricsIntervalSec=. */
void metrics_reload(struct metrics *mx);
/* No more writes (the file is left as it is). */
void metrics_stop(struct metrics *mx);

/* Options for wal_open whose kio times every fdatasync (NULL for mx NULL). */
const struct wal_options *metrics_wal_options(struct metrics *mx);

/* Counting sites. */
void metrics_fire(struct metrics *mx, const char *schedule, bool manual);
/* A step ended with record op (completed, failed, needs_review);
 * handler_started_us: now_us_monotonic() at its spawn, 0 if no handler ran
 * (microseconds: a fast handler's run is a few hundred of them, which whole
 * milliseconds would count as 0). */
void metrics_step(struct metrics *mx, int phase, enum wal_op op, uint64_t handler_started_us);
/* A failed step of this phase waits for its retry (a retry_wait record). */
void metrics_retry(struct metrics *mx, int phase);
/* source: where the evidence came from ("wal": the step's records and
 * hashes); reason: the evidence's reason. */
void metrics_verdict(struct metrics *mx, const char *verdict, const char *source,
                     const char *reason);
/* A control reply: command NULL when unknown or unparsable, code NULL for ok. */
void metrics_control(struct metrics *mx, const char *command, const char *code);

/* The whole exposition. */
int metrics_render(struct metrics *mx, enum om_format f, struct kbuf *out);
