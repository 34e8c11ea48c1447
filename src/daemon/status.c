/* SPDX-License-Identifier: MIT */
/* status: the STATUS= line systemd shows, from the mandate registry's
 * counts.  Below every module that changes a mandate's status, so each of
 * them updates it by calling down. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "daemon.h"

void daemon_update_status(struct daemon *d)
{
        unsigned c[MANDATE__STATUS_MAX];
        mandates_count(d, c);
        /* called on every change of a mandate: the line is made again only
         * when what it shows changed (one process, one loop: static) */
        static unsigned last_c[MANDATE__STATUS_MAX];
        static bool last_ready, known;
        static unsigned last_files;
        static size_t last_broken;
        if (known && last_ready == d->ready && last_files == d->recovery.files &&
            last_broken == d->cfg->nbroken && memcmp(last_c, c, sizeof c) == 0)
                return;
        memcpy(last_c, c, sizeof c);
        last_ready = d->ready;
        last_files = d->recovery.files;
        last_broken = d->cfg->nbroken;
        known = true;
        char buf[320];
        if (!d->ready) {
                snprintf(buf, sizeof buf, "recovering: %u WAL file%s", d->recovery.files,
                         d->recovery.files == 1 ? "" : "s");
        } else {
                int n = snprintf(buf, sizeof buf,
                                 "%u mandate%s running, %u runnable, %u paused for review, "
                                 "%u paused, %u quarantined",
                                 c[MANDATE_RUNNING], c[MANDATE_RUNNING] == 1 ? "" : "s",
                                 c[MANDATE_RUNNABLE], c[MANDATE_PAUSED_REVIEW],
                                 c[MANDATE_PAUSED],
                                 c[MANDATE_QUARANTINED] + c[MANDATE_WAL_IO_ERROR]);
                if (c[MANDATE_PROBING] && n > 0 && (size_t)n < sizeof buf)
                        n += snprintf(buf + n, sizeof buf - (size_t)n, ", %u probing",
                                      c[MANDATE_PROBING]);
                if (d->cfg->nbroken && n > 0 && (size_t)n < sizeof buf)
                        snprintf(buf + n, sizeof buf - (size_t)n, "; %zu schedule%s broken",
                                 d->cfg->nbroken, d->cfg->nbroken == 1 ? "" : "s");
        }
        notify_status(buf);
}
