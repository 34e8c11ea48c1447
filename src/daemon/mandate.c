/* SPDX-License-Identifier: MIT */
/* The mandate registry: in-memory state derived from the WALs. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "executor.h"
#include "kairos/fold.h"
#include "kairos/wal.h"
#include "metrics.h"

static const char *const status_names[MANDATE__STATUS_MAX] = {
        [MANDATE_RUNNABLE] = "runnable",
        [MANDATE_RUNNING] = "running",
        [MANDATE_IDLE] = "idle",
        [MANDATE_PAUSED] = "paused",
        [MANDATE_PAUSED_REVIEW] = "paused_review",
        [MANDATE_PROBING] = "probing",
        [MANDATE_AWAITING_APPROVAL] = "awaiting_approval",
        [MANDATE_QUARANTINED] = "quarantined",
        [MANDATE_WAL_IO_ERROR] = "wal_io_error",
        [MANDATE_DONE] = "done",
        [MANDATE_FAILED] = "failed",
        [MANDATE_TERMINATED] = "terminated",
        [MANDATE_ABANDONED] = "abandoned",
        [MANDATE_CANCELLED] = "cancelled",
};

const char *mandate_status_name(enum mandate_status s)
{
        return s < MANDATE__STATUS_MAX ? status_names[s] : "unknown";
}

int mandate_status_parse(const char *name)
{
        for (int s = 0; name && s < MANDATE__STATUS_MAX; s++)
                if (strcmp(status_names[s], name) == 0)
                        return s;
        return -ENOENT;
}

struct mandate *mandate_add(struct daemon *d, const char *id, const char *wal_path)
{
        struct mandate *m = calloc(1, sizeof(*m));
        if (!m)
                return NULL;
        m->d = d;
        m->id = strdup(id);
        m->wal_path = strdup(wal_path);
        if (!m->id || !m->wal_path || strmap_put(d->mandates, id, m) < 0) {
                free(m->id);
                free(m->wal_path);
                free(m);
                return NULL;
        }
        serialq_init(&m->q, d->loop, &d->jobs);
        m->status = MANDATE_IDLE;
        return m;
}

struct mandate *mandate_find(struct daemon *d, const char *id)
{
        return strmap_get(d->mandates, id);
}

void mandate_set_status(struct mandate *m, enum mandate_status s, const char *reason)
{
        m->status = s;
        free(m->reason);
        m->reason = reason ? strdup(reason) : NULL;
        if (s != MANDATE_PAUSED_REVIEW) {
                free(m->review_step);
                m->review_step = NULL;
        }
}

int mandate_wal_open(struct mandate *m)
{
        if (m->wal)
                return 0;
        struct wal_open_info info;
        /* the daemon made wal/ at start: no mkdir -p per open */
        const struct wal_options *mo = metrics_wal_options(m->d->metrics);
        struct wal_options opt = mo ? *mo : (struct wal_options){ 0 };
        opt.dir_exists = true;
        int r = wal_open(m->wal_path, &opt, &m->wal, &info);
        if (r < 0)
                return r;
        if (wal_state(m->wal) == WAL_STATE_QUARANTINED)
                return -EBADMSG;
        return 0;
}

void mandate_wal_close(struct mandate *m)
{
        if (!m->wal)
                return;
        m->flushes += wal_flush_count(m->wal);
        wal_close(m->wal);
        m->wal = NULL;
}

void mandates_count(struct daemon *d, unsigned counts[MANDATE__STATUS_MAX])
{
        memset(counts, 0, sizeof(unsigned) * MANDATE__STATUS_MAX);
        size_t pos = 0;
        const char *k;
        void *v;
        while (strmap_next(d->mandates, &pos, &k, &v) == 0) {
                struct mandate *m = v;
                counts[m->status]++;
        }
}

static void mandate_free(struct mandate *m)
{
        if (m->wal)
                wal_close(m->wal);
        fold_free(m->fold);
        kbuf_free(&m->wal_bytes);
        free(m->id);
        free(m->wal_path);
        free(m->reason);
        free(m->review_step);
        free(m->plan_id);
        free(m->schedule);
        executor_free_mandate(m);
        free(m);
}

int mandate_remove(struct mandate *m)
{
        if (m->busy || m->queued || m->holds_slot || m->run || !serialq_idle(&m->q))
                return -EBUSY;
        strmap_remove(m->d->mandates, m->id);
        mandate_free(m);
        return 0;
}

void mandates_free(struct daemon *d)
{
        size_t pos = 0;
        const char *k;
        void *v;
        while (strmap_next(d->mandates, &pos, &k, &v) == 0)
                mandate_free(v);
        strmap_free(d->mandates);
        d->mandates = NULL;
}
