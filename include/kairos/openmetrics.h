/* SPDX-License-Identifier: MIT */
/* openmetrics: render metrics as text, in one of two formats.
 *
 * OM_PROMETHEUS: the Prometheus text exposition format 0.0.4 — what
 * node_exporter's textfile collector reads and `promtool check metrics`
 * checks: # HELP and # TYPE name the sample name (a counter's ends in
 * _total), no # UNIT, no # EOF.
 * OM_OPENMETRICS: OpenMetrics 1.0 text — a counter family is named without
 * _total and its sample with it, # UNIT for families with a unit, # EOF last.
 *
 * Pure: appends to a kbuf; every function returns 0 or -ENOMEM (the buffer
 * may then hold a partial text; discard it). */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "kairos/kbuf.h"

enum om_format { OM_PROMETHEUS, OM_OPENMETRICS };
enum om_type { OM_GAUGE, OM_COUNTER, OM_HISTOGRAM };

struct om_label {
        const char *name;   /* [a-zA-Z_][a-zA-Z0-9_]* (not checked) */
        const char *value;  /* any bytes; escaped */
};

/* The metadata lines of a family.  name is the family name (a counter's
 * without _total); unit may be NULL (with a unit, name must end in _UNIT). */
int om_family(struct kbuf *out, enum om_format f, const char *name, enum om_type t,
              const char *unit, const char *help);

/* One sample of a gauge (value as given) or a counter (name + "_total"). */
int om_sample_u64(struct kbuf *out, const char *name, enum om_type t, const struct om_label *labels,
                  size_t nlabels, uint64_t value);
int om_sample_double(struct kbuf *out, const char *name, enum om_type t,
                     const struct om_label *labels, size_t nlabels, double value);

/* A histogram's samples: name_bucket{…,le="b"} (cumulative, bounds ascending,
 * then le="+Inf"), name_sum, name_count.  counts has nbounds + 1 entries, not
 * cumulative: counts[i] observations <= bounds[i] (and > bounds[i-1]),
 * counts[nbounds] the ones above the last bound. */
struct om_histogram {
        const double *bounds;
        size_t nbounds;
        const uint64_t *counts;
        double sum;
};
int om_histogram_samples(struct kbuf *out, const char *name, const struct om_label *labels,
                         size_t nlabels, const struct om_histogram *h);
/* The index in counts of an observation v: the first bound >= v, or nbounds. */
size_t om_bucket_index(const double *bounds, size_t nbounds, double v);

/* The end of the exposition: "# EOF\n" for OpenMetrics, nothing otherwise. */
int om_end(struct kbuf *out, enum om_format f);

/* Append v escaped as a label value (\ " and newline), without quotes. */
int om_escape_label_value(struct kbuf *out, const char *v);
/* The shortest decimal text that reads back as v ("+Inf", "-Inf", "NaN"). */
void om_format_double(double v, char out[32]);
