/* SPDX-License-Identifier: MIT */
/* openmetrics: metrics text (see include/kairos/openmetrics.h). */
#include "kairos/openmetrics.h"
#include "kairos/kmem.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *type_word(enum om_type t)
{
        static const char *const names[] = {
                [OM_COUNTER] = "counter", [OM_HISTOGRAM] = "histogram", [OM_GAUGE] = "gauge",
        };
        return ENUM_NAME(names, t, "gauge");
}

/* HELP text: backslash and newline escaped (both formats). */
static int escape_help(struct kbuf *out, const char *s)
{
        for (; *s; s++) {
                int r = *s == '\\'   ? kbuf_puts(out, "\\\\")
                        : *s == '\n' ? kbuf_puts(out, "\\n")
                                     : kbuf_putc(out, *s);
                if (r < 0)
                        return r;
        }
        return 0;
}

int om_escape_label_value(struct kbuf *out, const char *v)
{
        for (; *v; v++) {
                int r = *v == '\\'   ? kbuf_puts(out, "\\\\")
                        : *v == '"'  ? kbuf_puts(out, "\\\"")
                        : *v == '\n' ? kbuf_puts(out, "\\n")
                                     : kbuf_putc(out, *v);
                if (r < 0)
                        return r;
        }
        return 0;
}

void om_format_double(double v, char out[32])
{
        if (isnan(v)) {
                strcpy(out, "NaN");
                return;
        }
        if (isinf(v)) {
                strcpy(out, v > 0 ? "+Inf" : "-Inf");
                return;
        }
        /* Plain decimals where they are short ("10", "0.0001"), else %g. */
        double a = fabs(v);
        if (v == 0 || (a >= 1e-6 && a < 1e15)) {
                for (int prec = 0; prec <= 17; prec++) {
                        snprintf(out, 32, "%.*f", prec, v);
                        if (strtod(out, NULL) == v)
                                return;
                }
        }
        for (int prec = 1; prec <= 17; prec++) {
                snprintf(out, 32, "%.*g", prec, v);
                if (strtod(out, NULL) == v)
                        return;
        }
}

int om_family(struct kbuf *out, enum om_format f, const char *name, enum om_type t,
              const char *unit, const char *help)
{
        /* Prometheus text names the samples; OpenMetrics names the family. */
        const char *suffix = f == OM_PROMETHEUS && t == OM_COUNTER ? "_total" : "";
        int r;
        if ((r = kbuf_printf(out, "# HELP %s%s ", name, suffix)) < 0 ||
            (r = escape_help(out, help)) < 0 ||
            (r = kbuf_printf(out, "\n# TYPE %s%s %s\n", name, suffix, type_word(t))) < 0)
                return r;
        if (f == OM_OPENMETRICS && unit && (r = kbuf_printf(out, "# UNIT %s %s\n", name, unit)) < 0)
                return r;
        return 0;
}

/* name{a="x",b="y"[,extra="v"]} followed by a space. */
static int sample_head(struct kbuf *out, const char *name, const char *suffix,
                       const struct om_label *labels, size_t nlabels, const char *extra_name,
                       const char *extra_value)
{
        int r;
        if ((r = kbuf_printf(out, "%s%s", name, suffix)) < 0)
                return r;
        size_t n = nlabels + (extra_name ? 1 : 0);
        if (n && (r = kbuf_putc(out, '{')) < 0)
                return r;
        for (size_t i = 0; i < n; i++) {
                const char *k = i < nlabels ? labels[i].name : extra_name;
                const char *v = i < nlabels ? labels[i].value : extra_value;
                if ((r = kbuf_printf(out, "%s%s=\"", i ? "," : "", k)) < 0 ||
                    (r = om_escape_label_value(out, v ? v : "")) < 0 || (r = kbuf_putc(out, '"')) < 0)
                        return r;
        }
        if (n && (r = kbuf_putc(out, '}')) < 0)
                return r;
        return kbuf_putc(out, ' ');
}

int om_sample_u64(struct kbuf *out, const char *name, enum om_type t, const struct om_label *labels,
                  size_t nlabels, uint64_t value)
{
        int r = sample_head(out, name, t == OM_COUNTER ? "_total" : "", labels, nlabels, NULL, NULL);
        return r < 0 ? r : kbuf_printf(out, "%llu\n", (unsigned long long)value);
}

int om_sample_double(struct kbuf *out, const char *name, enum om_type t,
                     const struct om_label *labels, size_t nlabels, double value)
{
        char v[32];
        om_format_double(value, v);
        int r = sample_head(out, name, t == OM_COUNTER ? "_total" : "", labels, nlabels, NULL, NULL);
        return r < 0 ? r : kbuf_printf(out, "%s\n", v);
}

size_t om_bucket_index(const double *bounds, size_t nbounds, double v)
{
        size_t i = 0;
        while (i < nbounds && !(v <= bounds[i]))
                i++;
        return i;
}

int om_histogram_samples(struct kbuf *out, const char *name, const struct om_label *labels,
                         size_t nlabels, const struct om_histogram *h)
{
        uint64_t cum = 0;
        int r;
        for (size_t i = 0; i <= h->nbounds; i++) {
                char le[32];
                if (i < h->nbounds)
                        om_format_double(h->bounds[i], le);
                else
                        strcpy(le, "+Inf");
                cum += h->counts[i];
                if ((r = sample_head(out, name, "_bucket", labels, nlabels, "le", le)) < 0 ||
                    (r = kbuf_printf(out, "%llu\n", (unsigned long long)cum)) < 0)
                        return r;
        }
        char sum[32];
        om_format_double(h->sum, sum);
        if ((r = sample_head(out, name, "_sum", labels, nlabels, NULL, NULL)) < 0 ||
            (r = kbuf_printf(out, "%s\n", sum)) < 0 ||
            (r = sample_head(out, name, "_count", labels, nlabels, NULL, NULL)) < 0 ||
            (r = kbuf_printf(out, "%llu\n", (unsigned long long)cum)) < 0)
                return r;
        return 0;
}

int om_end(struct kbuf *out, enum om_format f)
{
        return f == OM_OPENMETRICS ? kbuf_puts(out, "# EOF\n") : 0;
}
