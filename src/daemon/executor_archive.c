/* SPDX-License-Identifier: MIT */
/* Archiving finished mandates, in batches (docs/design.md §6, rule 4). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"
#include "executor_internal.h"
#include "kairos/kio.h"
#include "log.h"

/* ---- archiving finished mandates, in batches ----
 *
 * A finished mandate's summary and archive are written (not synced) by its
 * last advance job; the WAL stays.  Finished mandates gather here until
 * ARCHIVE_BATCH of them wait, ARCHIVE_DELAY_MS passed, nothing runs any
 * more (no mandate holds a slot) or the daemon stops; then ONE syncfs makes every archive and summary of the batch
 * durable (or, on a file system where syncfs is no barrier, an fdatasync
 * of each and an fsync of their directories: statedir_sync_mode), and only then is each WAL unlinked (a job on the mandate's own
 * queue, which also points the mandate at its archive).  The unlinks need
 * no sync of their own: the next batch's syncfs (or the last one at
 * shutdown) covers them, and a WAL that comes back after a crash is
 * finalized, so the next start ends and archives it again. */

#define ARCHIVE_BATCH 64
#define ARCHIVE_DELAY_MS 1000

struct archive_batch {
        struct daemon *d;
        struct mandate **m;
        char *const *archives; /* m[i]'s archive path (d->executor->arch_batch_paths) */
        size_t n;
        int error;
        bool spares;           /* WAL spares made before the sync (mandate.c) */
};

struct archive_unlink {
        struct mandate *m;
        char *archive_path;
        int error;
};

bool archive_busy(const struct daemon *d)
{
        return d->executor->arch_npending || d->executor->arch_syncing || d->executor->arch_unlinking || d->executor->arch_unsynced;
}

static void on_archive_timer(uv_timer_t *t)
{
        archive_flush(t->data);
}

void archive_enqueue(struct mandate *m, char *archive_path)
{
        struct daemon *d = m->d;
        if (!archive_path) {
                /* (out of memory in the job: the WAL stays; the next start ends it again) */
                log_error("mandate %s: no archive path; its WAL stays", m->id);
                return;
        }
        if (d->executor->arch_npending == d->executor->arch_cap) {
                size_t cap = d->executor->arch_cap ? d->executor->arch_cap * 2 : 16;
                struct mandate **pm = realloc(d->executor->arch_pending, cap * sizeof(*pm));
                char **pp = realloc(d->executor->arch_paths, cap * sizeof(*pp));
                if (pm)
                        d->executor->arch_pending = pm;
                if (pp)
                        d->executor->arch_paths = pp;
                if (!pm || !pp) {
                        log_error("mandate %s: out of memory; its WAL stays", m->id);
                        free(archive_path);
                        return;
                }
                d->executor->arch_cap = cap;
        }
        m->busy++; /* alive until its WAL is gone */
        d->executor->arch_pending[d->executor->arch_npending] = m;
        d->executor->arch_paths[d->executor->arch_npending++] = archive_path;
        if (d->executor->arch_npending >= ARCHIVE_BATCH || d->stopping) {
                archive_flush(d);
                return;
        }
        if (!d->executor->arch_timer_init) {
                uv_timer_init(d->loop, &d->executor->arch_timer);
                d->executor->arch_timer.data = d;
                d->executor->arch_timer_init = true;
        }
        if (!uv_is_active((uv_handle_t *)&d->executor->arch_timer))
                uv_timer_start(&d->executor->arch_timer, on_archive_timer, ARCHIVE_DELAY_MS, 0);
}

static void archive_unlink_work(void *arg)
{
        struct archive_unlink *u = arg;
        const struct kio *io = kio_posix();
        u->error = io->unlink(io->ctx, u->m->wal_path);
        if (u->error == -ENOENT)
                u->error = 0; /* gone already */
}

/* m's WAL was unlinked (error: how that failed): m points at its archive */
static void wal_unlinked(struct mandate *m, char *archive_path, int error)
{
        struct daemon *d = m->d;
        if (error) {
                mandate_set_status(m, MANDATE_WAL_IO_ERROR, "wal_io_error");
                log_event(LOG_ERR, MSGID_WAL_IO_ERROR, LOG_FIELDS({ "MANDATE_ID", m->id }),
                          "mandate %s paused (%s): removing %s after archiving: %s", m->id,
                          m->reason, m->wal_path, strerror(-error));
                free(archive_path);
        } else {
                log_event(LOG_INFO, NULL, LOG_FIELDS({ "MANDATE_ID", m->id }),
                          "mandate %s: WAL archived (%s)", m->id, archive_path);
                free(m->wal_path);
                m->wal_path = archive_path;
                m->archived = true;
                d->executor->arch_unsynced = true;
                history_finished(m); /* retention counts archived mandates */
        }
}

static void archive_unlink_done(void *arg)
{
        struct archive_unlink *u = arg;
        struct mandate *m = u->m;
        struct daemon *d = m->d;
        wal_unlinked(m, u->archive_path, u->error);
        m->busy--;
        d->executor->arch_unlinking--;
        free(u);
        daemon_update_status(d);
        if (d->executor->arch_unlinking == 0)
                executor_check_idle(d);
}

/* Its archive and summary are durable: the WAL goes (a job on the
 * mandate's queue).  false: out of memory, the WAL stays (the next start
 * ends and archives it again); archive_path is freed either way. */
static bool unlink_wal(struct mandate *m, char *archive_path)
{
        struct archive_unlink *u = archive_path ? calloc(1, sizeof(*u)) : NULL;
        if (u) {
                u->m = m;
                u->archive_path = archive_path;
        }
        if (!u || serialq_submit(&m->q, archive_unlink_work, archive_unlink_done, u) < 0) {
                log_error("mandate %s: out of memory; its WAL stays", m->id);
                free(archive_path);
                free(u);
                return false;
        }
        m->d->executor->arch_unlinking++;
        return true;
}

void archive_synced(struct mandate *m, char *archive_path, int error)
{
        if (!archive_path)
                return; /* (advance_work sets end_synced only with a path) */
        /* (the caller updates the status and checks for idle after) */
        m->busy++; /* as a mandate whose WAL is unlinked: alive through it */
        wal_unlinked(m, archive_path, error);
        m->busy--;
}

/* File by file: each summary and archive, then the directories that name
 * them and the WAL directory (the unlinks since the last batch). */
static int archive_sync_files(const struct archive_batch *b)
{
        const struct kio *io = kio_posix();
        const struct statedir *paths = &b->d->paths;
        int r = 0;
        for (size_t i = 0; i < b->n && r == 0; i++) {
                char *summary = NULL;
                r = statedir_summary_path(paths, b->m[i]->id, &summary);
                if (r == 0)
                        r = kio_fdatasync_path(io, summary);
                if (r == 0)
                        r = kio_fdatasync_path(io, b->archives[i]);
                free(summary);
        }
        if (r == 0 && b->n)
                r = io->fsync_dir(io->ctx, paths->mandates);
        if (r == 0 && b->n)
                r = io->fsync_dir(io->ctx, paths->archive);
        if (r == 0)
                r = io->fsync_dir(io->ctx, paths->wal);
        return r;
}

static void archive_sync_work(void *arg)
{
        struct archive_batch *b = arg;
        /* spares for the next mandates, made durable by this syncfs too */
        uint64_t mark = b->spares ? mandate_spares_fill(b->d) : 0;
        b->error = b->d->sync_mode == STATEDIR_SYNC_FILES
                           ? archive_sync_files(b)
                           : kio_syncfs(kio_posix(), b->d->cfg->state_directory);
        if (b->spares)
                mandate_spares_covered(b->d, mark, b->error);
}

static void archive_sync_done(void *arg)
{
        struct archive_batch *b = arg;
        struct daemon *d = b->d;
        d->executor->arch_syncing = false;
        if (b->error) {
                /* Nothing is unlinked: the WALs stay the truth; a later batch
                 * (or the next start) tries again. */
                log_event(LOG_ERR, MSGID_WAL_IO_ERROR, NULL, 0,
                          "%s of %s failed: %s; %zu finished WAL%s kept",
                          d->sync_mode == STATEDIR_SYNC_FS ? "syncfs" : "syncing the archives",
                          d->cfg->state_directory, strerror(-b->error), b->n,
                          b->n == 1 ? "" : "s");
                for (size_t i = 0; i < b->n; i++)
                        b->m[i]->busy--;
        } else {
                d->executor->arch_unsynced = false;
                for (size_t i = 0; i < b->n; i++) {
                        char *path = d->executor->arch_batch_paths[i];
                        d->executor->arch_batch_paths[i] = NULL;
                        if (!unlink_wal(b->m[i], path))
                                b->m[i]->busy--;
                }
        }
        for (size_t i = 0; i < b->n; i++)
                free(d->executor->arch_batch_paths[i]);
        free(d->executor->arch_batch_paths);
        d->executor->arch_batch_paths = NULL;
        free(b->m);
        free(b);
        if (d->executor->arch_npending >= ARCHIVE_BATCH || (d->stopping && d->executor->arch_npending))
                archive_flush(d);
        else if (d->executor->arch_npending && d->executor->arch_timer_init &&
                 !uv_is_active((uv_handle_t *)&d->executor->arch_timer))
                uv_timer_start(&d->executor->arch_timer, on_archive_timer, ARCHIVE_DELAY_MS, 0);
        executor_check_idle(d);
}

/* Start a batch: one syncfs for every finished mandate waiting (or, with
 * none waiting, for the unlinks since the last one). */
void archive_flush(struct daemon *d)
{
        if (d->executor->arch_syncing)
                return; /* archive_sync_done starts the next batch */
        if (d->executor->arch_timer_init)
                uv_timer_stop(&d->executor->arch_timer);
        if (!d->executor->arch_npending && !d->executor->arch_unsynced)
                return;
        struct archive_batch *b = calloc(1, sizeof(*b));
        if (!b) {
                log_error("out of memory: archiving later");
                return;
        }
        b->d = d;
        b->m = d->executor->arch_pending;
        b->n = d->executor->arch_npending;
        /* (not for the stop's batch; not where the driver's barrier is the
         * WALs' own: its files are not made from spares; not where syncfs
         * is no barrier: an unsynced rename is not known to be atomic
         * there, docs/design.md §6 rule 1) */
        struct wal_options wo = { 0 };
        bool spares = b->n && !d->stopping && d->sync_mode == STATEDIR_SYNC_FS;
        if (spares)
                d->drv->wal.options(b->m[0], &wo);
        b->spares = spares && !wo.barrier;
        d->executor->arch_batch_paths = d->executor->arch_paths;
        b->archives = d->executor->arch_batch_paths;
        d->executor->arch_pending = NULL;
        d->executor->arch_paths = NULL;
        d->executor->arch_npending = d->executor->arch_cap = 0;
        if (serialq_submit(&d->admin_q, archive_sync_work, archive_sync_done, b) < 0) {
                log_error("out of memory: archiving later");
                d->executor->arch_pending = b->m;
                d->executor->arch_paths = d->executor->arch_batch_paths;
                d->executor->arch_npending = d->executor->arch_cap = b->n;
                d->executor->arch_batch_paths = NULL;
                free(b);
                return;
        }
        d->executor->arch_syncing = true;
}
