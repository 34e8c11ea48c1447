/* SPDX-License-Identifier: MIT */
/* The mandate registry: in-memory state derived from the WALs. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "driver.h"
#include "kairos/fold.h"
#include "kairos/kio.h"
#include "log.h"
#include "kairos/showdoc.h"
#include "kairos/wal.h"

/* the names kairosctl list --state-dir knows too (kairos/showdoc.h) */
_Static_assert(MANDATE__STATUS_MAX == SHOWDOC_NSTATUS, "showdoc_status_names");
#define status_names showdoc_status_names

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

/* Its id in the same allocation (nothing replaces it), wal_path owned (freed
 * on failure too). */
static struct mandate *mandate_new(struct daemon *d, const char *id, char *wal_path)
{
        size_t idl = strlen(id) + 1;
        struct mandate *m = wal_path ? calloc(1, sizeof(*m) + idl) : NULL;
        if (!m) {
                free(wal_path);
                return NULL;
        }
        m->d = d;
        m->id = memcpy((char *)(m + 1), id, idl);
        m->wal_path = wal_path;
        if (strmap_put(d->mandates, id, m) < 0) {
                free(m->wal_path);
                free(m);
                return NULL;
        }
        if (d->drv->own.attach(m) < 0) {
                strmap_remove(d->mandates, id);
                free(m->wal_path);
                free(m);
                return NULL;
        }
        serialq_init(&m->q, d->loop, &d->jobs);
        m->status = MANDATE_IDLE;
        d->status_count[MANDATE_IDLE]++;
        m->fired_key = -1;
        /* the ordered index takes it in when next asked for */
        if (d->norder_added == d->order_added_cap) {
                size_t cap = d->order_added_cap ? 2 * d->order_added_cap : 64;
                struct mandate **n = realloc(d->order_added, cap * sizeof(*n));
                if (n) {
                        d->order_added = n;
                        d->order_added_cap = cap;
                }
        }
        if (d->norder_added < d->order_added_cap) {
                d->order_added[d->norder_added++] = m;
                m->order_added = true;
        } else {
                d->order_stale = true;
        }
        return m;
}

struct mandate *mandate_add(struct daemon *d, const char *id, const char *wal_path)
{
        return mandate_new(d, id, strdup(wal_path));
}

struct mandate *mandate_add_path(struct daemon *d, const char *id, char *wal_path)
{
        return mandate_new(d, id, wal_path);
}

struct mandate *mandate_find(struct daemon *d, const char *id)
{
        return strmap_get(d->mandates, id);
}

void mandate_set_status(struct mandate *m, enum mandate_status s, const char *reason)
{
        m->d->status_count[m->status]--;
        m->d->status_count[s]++;
        m->status = s;
        free(m->reason);
        m->reason = reason ? strdup(reason) : NULL;
        if (s != MANDATE_PAUSED_REVIEW) {
                free(m->review_step);
                m->review_step = NULL;
        }
        if (m->d->up.status_changed)
                m->d->up.status_changed(m);
}

static int64_t fired_key(const char *s)
{
        return showdoc_fired_key(s);
}

void mandate_set_fired_at(struct mandate *m, char *fired_at)
{
        free(m->fired_at);
        m->fired_at = fired_at;
        m->fired_key = fired_key(fired_at);
        /* its place in the index moves (a new one has none yet) */
        if (!m->order_added)
                m->d->order_stale = true;
}

int mandate_order(const struct mandate *a, const struct mandate *b)
{
        return showdoc_order(a->fired_key, a->fired_at, a->id, b->fired_key, b->fired_at, b->id);
}

static int cmp_oldest_first(const void *a, const void *b)
{
        return -mandate_order(*(struct mandate *const *)a, *(struct mandate *const *)b);
}

static int order_rebuild(struct daemon *d)
{
        size_t n = strmap_size(d->mandates);
        if (n > d->ordered_cap) {
                struct mandate **v = realloc(d->ordered, n * sizeof(*v));
                if (!v)
                        return -ENOMEM;
                d->ordered = v;
                d->ordered_cap = n;
        }
        size_t pos = 0, i = 0;
        const char *k;
        void *v;
        while (strmap_next(d->mandates, &pos, &k, &v) == 0)
                d->ordered[i++] = v;
        d->nordered = i;
        if (i > 1) /* an empty registry has no array (qsort wants one) */
                qsort(d->ordered, i, sizeof(*d->ordered), cmp_oldest_first);
        for (size_t j = 0; j < d->norder_added; j++)
                d->order_added[j]->order_added = false;
        d->norder_added = 0;
        d->order_stale = false;
        return 0;
}

int mandates_ordered(struct daemon *d, struct mandate *const **ret, size_t *ret_n)
{
        /* many new ones at once (start-up, a burst): one sort is cheaper */
        if (d->order_stale || d->norder_added > 64 + d->nordered / 8) {
                int r = order_rebuild(d);
                if (r < 0)
                        return r;
        }
        if (d->norder_added && d->nordered + d->norder_added > d->ordered_cap) {
                size_t cap = 2 * (d->nordered + d->norder_added);
                struct mandate **v = realloc(d->ordered, cap * sizeof(*v));
                if (!v)
                        return -ENOMEM;
                d->ordered = v;
                d->ordered_cap = cap;
        }
        /* new mandates are mostly the newest: each goes in near the end */
        for (size_t j = 0; j < d->norder_added; j++) {
                struct mandate *m = d->order_added[j];
                size_t lo = 0, hi = d->nordered;
                while (lo < hi) {
                        size_t mid = lo + (hi - lo) / 2;
                        if (mandate_order(d->ordered[mid], m) > 0)
                                lo = mid + 1;   /* older than m */
                        else
                                hi = mid;
                }
                memmove(d->ordered + lo + 1, d->ordered + lo,
                        (d->nordered - lo) * sizeof(*d->ordered));
                d->ordered[lo] = m;
                d->nordered++;
                m->order_added = false;
        }
        d->norder_added = 0;
        *ret = d->ordered;
        *ret_n = d->nordered;
        return 0;
}

int mandate_submit(struct mandate *m, void (*work)(void *arg), void (*done)(void *arg), void *arg)
{
        m->busy++;
        int r = serialq_submit(&m->q, work, done, arg);
        if (r < 0)
                m->busy--;
        return r;
}

int mandate_wal_open(struct mandate *m)
{
        if (m->wal)
                return 0;
        struct wal_open_info info;
        /* the daemon made wal/ at start: no mkdir -p per open */
        struct wal_options opt = { 0 };
        if (m->d->up.wal_options)
                m->d->up.wal_options(m, &opt);
        opt.dir_exists = true;
        opt.keep_appended = true; /* folded from memory (executor_advance.c) */
        /* a barrier of the driver's own (cluster mode) creates its files as
         * before: spares are for files whose own syncs are the barrier, on
         * a file system whose syncfs is one (docs/design.md §6 rule 1) */
        if (!opt.barrier && m->d->sync_mode == STATEDIR_SYNC_FS)
                opt.spares = m->d->spares;
        int r = wal_open(m->wal_path, &opt, &m->wal, &info);
        if (r < 0)
                return r;
        if (wal_state(m->wal) == WAL_STATE_QUARANTINED)
                return -EBADMSG;
        return 0;
}

/* Recovery's scan of wal/ saw these spares (settled after it). */
static struct {
        char **v;
        size_t n, cap;
} seen;

int mandate_spare_seen(const char *name)
{
        if (seen.n == seen.cap) {
                size_t cap = seen.cap ? 2 * seen.cap : 16;
                char **v = realloc(seen.v, cap * sizeof(*v));
                if (!v)
                        return -ENOMEM;
                seen.v = v;
                seen.cap = cap;
        }
        if (!(seen.v[seen.n] = strdup(name)))
                return -ENOMEM;
        seen.n++;
        return 0;
}

/* One spare: 1 and *ret_id when it held a mandate's records (renamed). */
static int spare_settle(struct daemon *d, const char *name, char *ret_id, size_t idlen)
{
        const char *dir = d->paths.wal;
        enum wal_spare_found what;
        int r = wal_spare_adopt(kio_posix(), dir, name, &what, ret_id, idlen);
        if (r < 0) {
                log_error("%s/%s: cannot settle this spare WAL file: %s; left as it is", dir,
                          name, strerror(-r));
                return 0;
        }
        switch (what) {
        case WAL_SPARE_EMPTY:
                if (wal_spares_found(d->spares, name) < 0) {
                        char path[4096];
                        snprintf(path, sizeof path, "%s/%s", dir, name);
                        (void)unlink(path); /* more than the pool holds */
                }
                return 0;
        case WAL_SPARE_REMOVED:
                log_info("%s/%s: a spare WAL file with no whole record (a fire never "
                         "acknowledged): removed", dir, name);
                return 0;
        case WAL_SPARE_ADOPTED:
                log_notice("%s/%s holds the records of mandate %s (a crash undid its rename): "
                           "renamed to %s%s", dir, name, ret_id, ret_id, STATEDIR_WAL_SUFFIX);
                return 1;
        case WAL_SPARE_UNNAMED:
                log_error("%s/%s: a spare WAL file with bytes but no record naming a mandate: "
                          "left as it is (kairosctl wal verify %s/%s)", dir, name, dir, name);
                return 0;
        case WAL_SPARE_NOT_FILE:
                log_error("%s/%s: a spare WAL file's name on no regular file of its own (a "
                          "symbolic link, FIFO, directory, device or second link): never "
                          "used, left as it is; remove it", dir, name);
                return 0;
        case WAL_SPARE_CONFLICT:
                log_error("%s/%s holds records of mandate %s, whose WAL %s/%s%s exists too: "
                          "both left as they are, never merged; compare them (kairosctl wal "
                          "verify) and remove the wrong one", dir, name, ret_id, dir, ret_id,
                          STATEDIR_WAL_SUFFIX);
                return 0;
        }
        return 0;
}

int mandate_spares_settle(struct daemon *d, char ***ret_ids, size_t *ret_n)
{
        char **ids = seen.n ? calloc(seen.n, sizeof(*ids)) : NULL;
        size_t n = 0;
        int r = seen.n && !ids ? -ENOMEM : 0;
        for (size_t i = 0; i < seen.n; i++) {
                char id[256];
                if (r == 0 && spare_settle(d, seen.v[i], id, sizeof id) == 1 &&
                    !(ids[n++] = strdup(id)))
                        r = -ENOMEM;
                free(seen.v[i]);
        }
        free(seen.v);
        seen.v = NULL;
        seen.n = seen.cap = 0;
        if (r == 0 && n) {
                r = kio_posix()->fsync_dir(kio_posix()->ctx, d->paths.wal);
                if (r < 0)
                        log_error("fsync of %s after adopting spare WAL files: %s",
                                  d->paths.wal, strerror(-r));
        }
        if (r < 0) {
                for (size_t i = 0; i < n; i++)
                        free(ids[i]);
                free(ids);
                ids = NULL;
                n = 0;
        }
        *ret_ids = ids;
        *ret_n = n;
        return r;
}

uint64_t mandate_spares_fill(struct daemon *d)
{
        uint64_t mark = 0;
        (void)wal_spares_fill(d->spares, &mark); /* fewer spares: more creations */
        return mark;
}

void mandate_spares_covered(struct daemon *d, uint64_t mark, int r)
{
        wal_spares_covered(d->spares, mark, r);
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
        memcpy(counts, d->status_count, sizeof(unsigned) * MANDATE__STATUS_MAX);
}

static void mandate_free(void *p)
{
        struct mandate *m = p;
        if (m->wal)
                wal_close(m->wal);
        fold_free(m->fold);
        kbuf_free(&m->wal_bytes);
        free(m->wal_path);
        free(m->reason);
        free(m->review_step);
        free(m->failure); /* one allocation (hooks.h) */
        free(m->plan_id);
        free(m->schedule);
        if (m->d->up.free_mandate)
                m->d->up.free_mandate(m);
        m->d->drv->own.detach(m);
        free(m);
}

int mandate_remove(struct mandate *m)
{
        if (m->busy || m->queued || m->holds_slot || m->run || !serialq_idle(&m->q))
                return -EBUSY;
        strmap_remove(m->d->mandates, m->id);
        m->d->status_count[m->status]--;
        /* the index holds it: rebuilt when next asked for */
        m->d->order_stale = true;
        for (size_t j = 0; j < m->d->norder_added; j++)
                if (m->d->order_added[j] == m)
                        m->d->order_added[j] = m->d->order_added[--m->d->norder_added];
        mandate_free(m);
        return 0;
}

void mandates_free(struct daemon *d)
{
        strmap_free_with(d->mandates, mandate_free);
        d->mandates = NULL;
        wal_spares_free(d->spares);
        d->spares = NULL;
        memset(d->status_count, 0, sizeof d->status_count);
        free(d->ordered);
        free(d->order_added);
        d->ordered = d->order_added = NULL;
        d->nordered = d->norder_added = d->ordered_cap = d->order_added_cap = 0;
}
