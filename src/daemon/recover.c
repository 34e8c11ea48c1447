/* SPDX-License-Identifier: MIT */
/* Startup recovery (docs/design.md §8): every <state>/wal/NAME.wal.jsonl is opened
 * (torn tail repaired, corruption quarantined), folded, planned by the pure
 * recovery planner, and the planned records are appended — on the thread
 * pool, in chunks of WALs (see RECOVER_CHUNK), without a sync per WAL.  When every job is done,
 * ONE syncfs of the WALs' file system makes all those records (and the
 * removal of WALs that held nothing) durable; only then READY=1 and the
 * executor runs anything (executor_kick waits for ready).  If the syncfs
 * fails, every mandate recovery wrote to is paused wal_io_error: its records
 * may be lost, and nothing acts on a record that is not durable.  A WAL that
 * needs no record is only read. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon.h"
#include "hooks.h"
#include "executor.h"
#include "kairos/decide.h"
#include "kairos/evidence.h"
#include "kairos/fold.h"
#include "kairos/kbuf.h"
#include "kairos/kio.h"
#include "kairos/planner.h"
#include "kairos/showdoc.h"
#include "kairos/recovery.h"
#include "kairos/statedir.h"
#include "kairos/strmap.h"
#include "kairos/wal.h"
#include "log.h"
#include "metrics.h"
#include "probe.h"
#include "toolhold.h"
#include "driver.h"
#include "idem_service.h"

#include <jansson.h>

#define WAL_SUFFIX ".wal.jsonl"

struct recover_decision {
        char *plan_id;      /* one block: plan_id, step_id, reason, evidence */
        char *step_id;
        enum verdict_kind kind;
        const char *source; /* evidence_source_name */
        char *reason;
        char *evidence;     /* JSON */
        const char *action; /* what recovery did */
};

struct recover_job {
        struct mandate *m;
        struct daemon *d;
        bool in_chunk;               /* part of a struct recover_chunk (not freed alone) */
        int error;                   /* open/read failure */
        bool corrupt;
        size_t bad_line, bad_offset;
        char bad_reason[128];
        bool had_summary;            /* the mandate ended before (summary loaded) */
        bool empty;                  /* no record at all: removed (see recover_work) */
        int unlink_error;
        bool torn;
        size_t torn_bytes;
        char *torn_path;             /* where the torn bytes were kept */
        int io_error;                /* append failure */
        bool unsynced;               /* appended to, or unlinked: waits for the syncfs */
        struct recover_decision *decisions;
        size_t ndecisions;
        enum mandate_status status;
        char *reason;
        char *review_step;
        char *probe_step;            /* PROBING: the step its probe decides */
        char *plan_id;
        long long cycle;
        uint64_t flushes;
        char *schedule, *fired_at, *goal;   /* from the mandate record */
        char *retry_of;                     /* ... a retry's, with its number */
        int retry;
        int64_t started_ms;                 /* its ts (or the first record's) */
        /* cluster mode: a mandate taken over from another node */
        bool adopt;
        void (*adopt_cb)(void *ctx, struct mandate *m, int err);
        void *adopt_ctx;
        char *prev_owner;
        struct evidence_index *ix;          /* its tool calls (owned) */
        struct strmap *schedules;           /* the declarations when it was taken (owned) */
        /* a step whose tool calls outlived the last kairosd (toolhold.h) */
        bool again;                         /* decided again after such a wait: no wait */
        bool not_ours;                      /* ... the mandate changed meanwhile */
        bool held;                          /* waits for them: nothing decided */
        char *hold_step;
        struct toolhold_client *hold;       /* TOOLHOLD_MAX, only when a call may hold */
        size_t nhold;
        uint64_t grace_ms;
        bool ended;                         /* the WAL says the mandate is over: */
        enum decide_end end;                /* ... how, and why */
        char *end_reason;
};

static void (*recovery_done_cb)(struct daemon *d);
static unsigned pending_jobs;
static unsigned recover_inflight;       /* jobs on the pool (RECOVER_WINDOW) */

/* What the closing syncfs covers: the mandates recovery appended records
 * to (paused wal_io_error if it fails) and how many WALs it unlinked. */
static struct {
        struct mandate **m;
        size_t n, cap;
        size_t unlinked;
        struct daemon *d;
        int error;
} unsynced;

/* Writeback started while the scan goes on: once EARLY_SYNC_MIN more WALs
 * were written to, a syncfs runs on the admin queue while the pool reads
 * the next ones, so that the closing syncfs (queued after it on the same
 * queue) finds little left to write and READY=1 comes sooner.  It adds
 * durability, never takes any away: the closing syncfs still covers every
 * record, and nothing acts on one before it.  A failure is kept and counts
 * as the closing syncfs's own (a syncfs reports a write-back error once:
 * the closing one may not see it again). */
#define EARLY_SYNC_MIN 1024

static struct early_sync {
        size_t since;           /* WALs written to since the last one was queued */
        size_t min;             /* EARLY_SYNC_MIN, lower under test hooks */
        bool inflight;
        int error;              /* the first failure (sticky) */
} early;

/* Evidence beyond the WAL, built once before the first job and read-only
 * while jobs run (the pool threads only read it); freed when recovery ends. */
static struct {
        struct evidence_index *ix;      /* tool calls by owner mandate */
        struct strmap *schedules;       /* name → struct evidence_schedule */
        int wal_dir;                    /* wal/, open: each WAL opened by its name */
} snap = { .wal_dir = -1 };

static void schedules_free(struct strmap *schedules)
{
        strmap_free_with(schedules, free);
}

static void snap_free(void)
{
        schedules_free(snap.schedules);
        evidence_index_free(snap.ix);
        snap.schedules = NULL;
        snap.ix = NULL;
        if (snap.wal_dir >= 0)
                close(snap.wal_dir);
        snap.wal_dir = -1;
}

/* The schedules' declarations (Effects=, EffectsVia=, commands, Probe=):
 * name → struct evidence_schedule. */
static int schedules_map(const struct config *cfg, struct strmap **ret)
{
        struct strmap *map = strmap_new();
        if (!map)
                return -ENOMEM;
        for (size_t i = 0; i < cfg->nschedules; i++) {
                struct evidence_schedule *es = malloc(sizeof(*es));
                if (!es) {
                        schedules_free(map);
                        return -ENOMEM;
                }
                evidence_schedule_from_config(&cfg->schedules[i], es);
                if (strmap_put(map, cfg->schedules[i].name, es) < 0) {
                        free(es);
                        schedules_free(map);
                        return -ENOMEM;
                }
        }
        *ret = map;
        return 0;
}

static int snap_schedules(const struct config *cfg)
{
        return schedules_map(cfg, &snap.schedules);
}

static int keep_decision(struct recover_job *j, const struct fold *f,
                         const struct fold_plan *p, const struct recovery_decision *dec)
{
        struct recover_decision *n =
                realloc(j->decisions, (j->ndecisions + 1) * sizeof(*j->decisions));
        if (!n)
                return -ENOMEM;
        j->decisions = n;
        struct kbuf ev = KBUF_INIT;
        verdict_evidence_json(&dec->verdict, &ev);
        /* its texts in one block (plan_id first): one free on the loop, not four */
        const char *plan = p->plan_id ? p->plan_id : "";
        const char *step = f->steps[dec->step].step_id;
        const char *reason = dec->verdict.reason ? dec->verdict.reason : "";
        size_t lp = strlen(plan) + 1, ls = strlen(step) + 1, lr = strlen(reason) + 1;
        size_t le = ev.data ? ev.len + 1 : 0;
        char *blk = malloc(lp + ls + lr + le);
        if (!blk) {
                kbuf_free(&ev);
                return -ENOMEM;
        }
        memcpy(blk, plan, lp);
        memcpy(blk + lp, step, ls);
        memcpy(blk + lp + ls, reason, lr);
        if (le) {
                memcpy(blk + lp + ls + lr, ev.data, ev.len);
                blk[lp + ls + lr + ev.len] = '\0';
        }
        kbuf_free(&ev);
        j->decisions[j->ndecisions++] = (struct recover_decision){
                .plan_id = blk,
                .step_id = blk + lp,
                .kind = dec->verdict.kind,
                .source = evidence_source_name(&dec->verdict),
                .reason = blk + lp + ls,
                .evidence = le ? blk + lp + ls + lr : NULL,
                .action = recovery_action_text(dec),
        };
        return 0;
}

/* The mandate's state after recovery, as decide_recover said. */
static void settle_status(struct recover_job *j, const struct fold *f,
                          const struct decide_recovery *dr)
{
        j->status = MANDATE_RUNNABLE;  /* the executor decides what comes next */
        if (f->mandate.schedule)
                j->schedule = strdup(f->mandate.schedule);
        if (f->mandate.fired_at)
                j->fired_at = strdup(f->mandate.fired_at);
        if (f->mandate.goal)
                j->goal = strdup(f->mandate.goal);
        if (f->mandate.retry_of && f->mandate.retry >= 1 && f->mandate.retry <= PLANNER_MAX_RETRY) {
                j->retry_of = strdup(f->mandate.retry_of);
                j->retry = (int)f->mandate.retry;
        }
        wal_parse_ts(f->mandate.ts ? f->mandate.ts : f->first_ts, &j->started_ms);
        if (f->nplans > 0) {
                const struct fold_plan *last = &f->plans[f->nplans - 1];
                j->plan_id = strdup(last->plan_id ? last->plan_id : "");
                j->cycle = last->cycle;
        }
        if (dr->mandate == DECIDE_MANDATE_PROBING) {
                j->status = MANDATE_PROBING;
                j->probe_step = strdup(dr->probe_step);
        }
        if (dr->mandate == DECIDE_MANDATE_PAUSED_REVIEW) {
                j->status = MANDATE_PAUSED_REVIEW;
                j->review_step = strdup(dr->review_step);
                j->reason = strdup(dr->review_reason);
        }
}

/* The hold (toolhold.h), a step of its own before anything is recorded: a
 * step of the mandate has open tool calls whose clients still run (they
 * outlived the last kairosd; only the step that was running can have
 * them).  Whatever recovery would decide for it (a human, a probe, a check,
 * a re-run), the call is still making its effect: nothing is decided now.
 * true, with their pidfds in j->hold. */
static bool hold_running_calls(struct recover_job *j, const struct evidence_index *ix)
{
        const struct evidence_call *calls;
        size_t n = ix ? evidence_index_calls(ix, j->m->id, &calls) : 0;
        if (j->grace_ms == 0)
                return false;
        for (size_t i = 0; i < n; i++) {
                if ((calls[i].state != IDEM_ST_PROCESSING &&
                     calls[i].state != IDEM_ST_INTERRUPTED) || calls[i].client.pid <= 0)
                        continue;
                /* (allocated here, not in every job: a job per WAL is in flight) */
                if (!j->hold && !(j->hold = calloc(TOOLHOLD_MAX, sizeof(*j->hold))))
                        return false;
                j->nhold = toolhold_find(calls, n, calls[i].step, j->hold, TOOLHOLD_MAX);
                if (j->nhold == 0)
                        continue;
                if (!(j->hold_step = strdup(calls[i].step))) {
                        toolhold_release(j->hold, j->nhold);
                        j->nhold = 0;
                        return false;
                }
                return true;
        }
        return false;
}

static void recover_work(void *arg)
{
        struct recover_job *j = arg;
        struct wal *w = NULL;
        struct fold *f = NULL;
        const struct recovery *rec = NULL;
        struct decide_recovery dr = { .recovery = NULL };
        struct evidence_mandate em = { .n = 0 };
        struct wal_open_info info;

        /* The directory was made at start: no mkdir -p per WAL.  The file is
         * read once: the fold that opening it made is the one planned on. */
        const struct wal_options *mo = metrics_wal_options(j->d->metrics);
        struct wal_options wopt = mo ? *mo : (struct wal_options){ 0 };
        wopt.dir_exists = true;
        wopt.exists = true;
        /* at start, opened by name in wal/ (a path walk less per WAL) */
        size_t dl = strlen(j->d->paths.wal);
        if (!j->adopt && snap.wal_dir >= 0 && strncmp(j->m->wal_path, j->d->paths.wal, dl) == 0 &&
            j->m->wal_path[dl] == '/' && !strchr(j->m->wal_path + dl + 1, '/')) {
                wopt.at_dir = true;
                wopt.dir_fd = snap.wal_dir;
        }
        j->d->drv->wal.options(j->m, &wopt);
        int r = wal_open_folded(j->m->wal_path, &wopt, &w, &info, &f);
        if (r < 0) {
                j->error = r;
                return;
        }
        j->torn = info.torn_repaired;
        j->torn_bytes = info.torn_bytes;
        if (j->torn)
                j->torn_path = strdup(info.torn_path);
        if (info.corrupt) {
                j->corrupt = true;
                j->bad_line = info.bad_line;
                j->bad_offset = info.bad_offset;
                snprintf(j->bad_reason, sizeof j->bad_reason, "%s", info.bad_reason);
                j->status = MANDATE_QUARANTINED;
                j->reason = strdup("wal_corrupt");
                /* What came before the bad line, for list and show. */
                if (f && f->nplans > 0) {
                        const struct fold_plan *last = &f->plans[f->nplans - 1];
                        j->plan_id = last->plan_id ? strdup(last->plan_id) : NULL;
                        j->cycle = last->cycle;
                }
                goto out;
        }
        if (!f && (r = fold_file(j->m->wal_path, &f)) < 0) {
                j->error = r;
                goto out;
        }
        /* Evidence beyond the WAL: the schedule's declarations and the
         * store's record of this mandate's tool calls.  A schedule that is
         * no longer configured declares nothing: the WAL alone decides. */
        bool later = j->adopt || j->again; /* its own evidence, not the start's */
        const struct evidence_schedule *es =
                !f->mandate.schedule ? NULL
                : later              ? strmap_get(j->schedules, f->mandate.schedule)
                : snap.schedules     ? strmap_get(snap.schedules, f->mandate.schedule)
                                     : NULL;
        if (es && (r = evidence_for_mandate(later ? j->ix : snap.ix, j->m->id, es, &em)) < 0) {
                j->error = r;
                goto out;
        }
        /* a step whose retry is due, its effect journaled: decided now */
        if (es && j->again)
                em.ev.retry_now_ms = now_ms_realtime();
        if ((r = decide_recover(f, j->had_summary, es ? &em.ev : NULL, &dr)) < 0) {
                j->error = r;
                goto out;
        }
        if (dr.file == DECIDE_FILE_REMOVE) {
                /* a fire that was never acknowledged: the file goes */
                j->empty = true;
                j->flushes = wal_flush_count(w);
                wal_close(w);
                w = NULL;
                const struct kio *io = kio_posix();
                /* durable with the closing syncfs; a crash before it
                 * leaves the file, and the next start removes it again */
                if ((r = io->unlink(io->ctx, j->m->wal_path)) < 0)
                        j->unlink_error = r;
                else
                        j->unsynced = true;
                goto out;
        }
        if (dr.file == DECIDE_FILE_QUARANTINE) {
                j->corrupt = true;
                j->bad_line = f->bad_line;
                j->bad_offset = f->bad_offset;
                snprintf(j->bad_reason, sizeof j->bad_reason, "%s", f->bad_reason);
                j->status = MANDATE_QUARANTINED;
                j->reason = strdup("wal_corrupt");
                goto out;
        }
        rec = dr.recovery;
        /* (the configuration cannot change before READY=1) */
        if (!later)
                j->grace_ms = j->d->cfg->tool_grace_sec * 1000;
        if (!later && hold_running_calls(j, snap.ix)) {
                settle_status(j, f, &dr);
                free(j->reason);
                free(j->review_step);
                free(j->probe_step);
                j->review_step = j->probe_step = NULL;
                j->held = true;
                j->status = MANDATE_PROBING;
                if (asprintf(&j->reason, "%s: waiting for tool call %s (client pid %d, it "
                             "outlived the last kairosd), up to ToolGraceSec=%llu",
                             j->hold_step, j->hold[0].key, (int)j->hold[0].pid,
                             (unsigned long long)(j->grace_ms / 1000)) < 0)
                        j->reason = NULL;
                goto out;
        }
        size_t appended = 0;
        if (j->adopt) {
                /* who holds it now, before what it decides */
                struct wal_record own = { .op = WAL_OP_OWNER, .mandate_id = j->m->id,
                                          .node = own_node(j->d), .epoch = j->m->epoch,
                                          .prev_owner = j->prev_owner };
                r = wal_append(w, &own);
        }
        for (size_t i = 0; i < rec->nplans && r == 0; i++) {
                const struct recovery_plan *rp = &rec->plans[i];
                const struct fold_plan *p = &f->plans[rp->plan];
                for (size_t k = 0; k < rp->ndecisions && r == 0; k++) {
                        const struct recovery_decision *dec = &rp->decisions[k];
                        if (dec->has_record) {
                                r = wal_append(w, &dec->record);
                                appended++;
                        }
                        if (r == 0)
                                r = keep_decision(j, f, p, dec);
                }
                if (r == 0 && rp->has_finalize) {
                        r = wal_append(w, &rp->finalize);
                        appended++;
                }
        }
        /* No barrier here: the closing syncfs is the barrier of every WAL
         * (nothing runs before it; see the top of this file).  A mandate
         * taken over in cluster mode has its own: one transaction. */
        if (r == 0 && later)
                r = wal_flush(w);
        else if (r == 0 && appended)
                j->unsynced = true;
        if (r < 0) {
                j->io_error = r;
                j->status = MANDATE_WAL_IO_ERROR;
                j->reason = strdup("wal_io_error");
                goto out;
        }
        settle_status(j, f, &dr);
        /* (not for a mandate taken over while kairosd runs: the
         * configuration may be reloaded meanwhile; the executor finds its
         * end the same way) */
        if (j->status == MANDATE_RUNNABLE && !later) {
                /* Over already (ended before its archive was durable)?  Then
                 * it only needs its archive finished.  The configuration
                 * cannot change before READY=1, so reading it here is safe. */
                const struct config *cfg = j->d->cfg;
                const struct config_schedule *sc = NULL;
                for (size_t i = 0; f->mandate.schedule && i < cfg->nschedules; i++)
                        if (strcmp(cfg->schedules[i].name, f->mandate.schedule) == 0)
                                sc = &cfg->schedules[i];
                struct decide_input in = {
                        .mandate_id = j->m->id, .schedule = f->mandate.schedule,
                        .fired_at = f->mandate.fired_at, .retry = j->retry,
                        .schedule_known = sc != NULL, .max_cycles = sc ? sc->max_cycles : 1,
                };
                /* (2.7 KB: the pool thread's own, not on its stack and not
                 * a malloc per WAL, one large enough to consolidate malloc's
                 * fast bins each time) */
                static _Thread_local struct decide_next next;
                struct decide_next *n = &next;
                /* (the records recovery just appended are not in f: only a
                 * plan recovery left alone can be over) */
                if (recovery_record_count(rec) == 0 && decide_next(f, &in, n) == 0 &&
                    n->kind == DECIDE_END) {
                        j->ended = true;
                        j->end = n->end;
                        j->end_reason = n->reason ? strdup(n->reason) : NULL;
                }
        }
out:
        if (w) {
                j->flushes = wal_flush_count(w);
                wal_close(w);
        }
        decide_recovery_release(&dr);
        evidence_mandate_release(&em);
        fold_free(f);
}

static void log_decision(const struct mandate *m, const struct recover_decision *rd)
{
        log_event(LOG_NOTICE, MSGID_RECOVERY,
                  LOG_FIELDS({ "MANDATE_ID", m->id }, { "PLAN_ID", rd->plan_id },
                             { "STEP_ID", rd->step_id },
                             { "VERDICT", verdict_kind_name(rd->kind) },
                             { "EVIDENCE", rd->evidence }),
                  "recovery: %s %s: %s (%s): %s", m->id, rd->step_id, verdict_kind_name(rd->kind),
                  rd->reason, rd->action);
}

static void submit_more(struct daemon *d);

static void early_work(void *arg)
{
        struct daemon *d = arg;
        int r = kio_syncfs(kio_posix(), d->paths.wal);
        if (r < 0 && early.error == 0)
                early.error = r;
}

static void early_done(void *arg)
{
        (void)arg;
        early.inflight = false;
}

/* On the loop, after each chunk is settled: start the writeback of what
 * was written since the last one, if none is running. */
static void early_sync(struct daemon *d)
{
        if (d->sync_mode != STATEDIR_SYNC_FS || early.inflight || early.since < early.min ||
            pending_jobs == 0)
                return;
        if (serialq_submit(&d->admin_q, early_work, early_done, d) == 0) {
                early.inflight = true;
                early.since = 0;
        }
}

static void recovery_complete(struct daemon *d)
{
        free(unsynced.m);
        unsynced.m = NULL;
        unsynced.n = unsynced.cap = unsynced.unlinked = 0;
        d->recovery.duration_ms = now_ms_monotonic() - d->recovery.started_ms;
        recovery_done_cb(d);
}

/* Where syncfs is no barrier (statedir_sync_mode): each WAL recovery wrote
 * to, then the directory (the WALs it unlinked). */
static int sync_files(void)
{
        const struct kio *io = kio_posix();
        int r = 0;
        for (size_t i = 0; i < unsynced.n && r == 0; i++)
                r = kio_fdatasync_path(io, unsynced.m[i]->wal_path);
        return r < 0 ? r : io->fsync_dir(io->ctx, unsynced.d->paths.wal);
}

static void sync_work(void *arg)
{
        (void)arg;
        unsynced.error = unsynced.d->sync_mode == STATEDIR_SYNC_FILES
                                 ? sync_files()
                                 : kio_syncfs(kio_posix(), unsynced.d->paths.wal);
}

static void sync_done(void *arg)
{
        (void)arg;
        struct daemon *d = unsynced.d;
        int r = unsynced.error < 0 ? unsynced.error : early.error;
        if (r < 0) {
                log_event(LOG_ERR, MSGID_WAL_IO_ERROR, NULL, 0,
                          "recovery: %s of %s failed: %s; the %zu mandate%s recovery wrote "
                          "to paused (wal_io_error)",
                          d->sync_mode == STATEDIR_SYNC_FS ? "syncfs" : "syncing the WALs",
                          d->paths.wal, strerror(-r), unsynced.n, unsynced.n == 1 ? "" : "s");
                for (size_t i = 0; i < unsynced.n; i++) {
                        struct mandate *m = unsynced.m[i];
                        d->recovery.io_errors++;
                        mandate_set_status(m, MANDATE_WAL_IO_ERROR, "wal_io_error");
                        log_event(LOG_ERR, MSGID_WAL_IO_ERROR,
                                  LOG_FIELDS({ "MANDATE_ID", m->id }, { "WAL", m->wal_path }),
                                  "recovery: %s: recovery records not made durable: %s; "
                                  "mandate paused (wal_io_error)",
                                  m->wal_path, strerror(-r));
                }
        }
        recovery_complete(d);
}

/* Every job is done: one syncfs for all they wrote (or a sync of each), then READY. */
static void recovery_sync(struct daemon *d)
{
        if (unsynced.n == 0 && unsynced.unlinked == 0) {
                recovery_complete(d);
                return;
        }
        unsynced.d = d;
        unsynced.error = 0;
        if (serialq_submit(&d->admin_q, sync_work, sync_done, NULL) < 0) {
                unsynced.error = -ENOMEM;
                sync_done(NULL);
        }
}

/* On the loop: what one job found becomes the mandate's state. */
static void recover_settle(struct recover_job *j)
{
        struct mandate *m = j->m;
        struct daemon *d = j->d;
        struct recovery_summary *s = &d->recovery;

        m->flushes += j->flushes;
        d->flushes_total += j->flushes;
        if (j->unsynced)
                early.since++;
        if (j->unsynced && j->empty) {
                unsynced.unlinked++;
        } else if (j->unsynced && !j->io_error) {
                if (unsynced.n == unsynced.cap) {
                        size_t cap = unsynced.cap ? 2 * unsynced.cap : 256;
                        struct mandate **nm = realloc(unsynced.m, cap * sizeof(*nm));
                        if (nm) {
                                unsynced.m = nm;
                                unsynced.cap = cap;
                        }
                }
                if (unsynced.n < unsynced.cap) {
                        unsynced.m[unsynced.n++] = m;
                } else {
                        /* cannot remember it for the syncfs's verdict: not
                         * resumed, its records are not known durable */
                        j->io_error = -ENOMEM;
                }
        }
        if (j->torn) {
                s->torn_repaired++;
                log_event(LOG_WARNING, NULL,
                          LOG_FIELDS({ "MANDATE_ID", m->id }, { "WAL", m->wal_path }),
                          "recovery: %s: torn tail of %zu bytes cut off (kept in %s)",
                          m->wal_path, j->torn_bytes, j->torn_path ? j->torn_path : "?");
        }
        for (size_t i = 0; i < j->ndecisions; i++) {
                struct recover_decision *rd = &j->decisions[i];
                log_decision(m, rd);
                metrics_verdict(d->metrics, verdict_kind_name(rd->kind), rd->source, rd->reason);
                s->decisions++;
                if (rd->kind == VERDICT_ALREADY_DONE)
                        s->already_done++;
                else if (rd->kind == VERDICT_SAFE_TO_RETRY)
                        s->safe_to_retry++;
                else
                        s->manual_review++;
        }
        if (j->not_ours) {
                log_info("%s: %s meanwhile; its step is decided and recorded, nothing more",
                         m->id, m->cancel ? "being cancelled" : mandate_status_name(m->status));
        } else if (j->empty && !j->unlink_error) {
                log_event(LOG_NOTICE, MSGID_RECOVERY,
                          LOG_FIELDS({ "MANDATE_ID", m->id }, { "WAL", m->wal_path }),
                          "recovery: %s holds no plan (a fire that was never acknowledged): "
                          "removed", m->wal_path);
                if (mandate_remove(m) < 0)
                        mandate_set_status(m, MANDATE_PAUSED, "wal_empty: no record; fire again");
                m = NULL;
        } else if (j->empty) {
                s->io_errors++;
                mandate_set_status(m, MANDATE_WAL_IO_ERROR, "wal_io_error");
                log_event(LOG_ERR, MSGID_WAL_IO_ERROR,
                          LOG_FIELDS({ "MANDATE_ID", m->id }, { "WAL", m->wal_path }),
                          "recovery: %s holds no plan and cannot be removed: %s; mandate "
                          "paused (wal_io_error)",
                          m->wal_path, strerror(-j->unlink_error));
        } else if (j->error) {
                s->io_errors++;
                mandate_set_status(m, MANDATE_WAL_IO_ERROR, "wal_io_error");
                log_event(LOG_ERR, MSGID_WAL_IO_ERROR,
                          LOG_FIELDS({ "MANDATE_ID", m->id }, { "WAL", m->wal_path }),
                          "recovery: %s: cannot read: %s; mandate paused (wal_io_error)",
                          m->wal_path, strerror(-j->error));
        } else if (j->corrupt) {
                s->quarantined++;
                mandate_set_status(m, MANDATE_QUARANTINED, "wal_corrupt");
                free(m->plan_id);
                m->plan_id = j->plan_id;
                j->plan_id = NULL;
                m->cycle = j->cycle;
                char where[64];
                snprintf(where, sizeof where, "%zu", j->bad_line);
                log_event(LOG_ERR, MSGID_WAL_CORRUPT,
                          LOG_FIELDS({ "MANDATE_ID", m->id }, { "WAL", m->wal_path },
                                     { "WAL_LINE", where }),
                          "recovery: %s is corrupt at line %zu, byte offset %zu (%s): quarantined, "
                          "mandate paused (wal_corrupt); inspect with kairosctl wal verify",
                          m->wal_path, j->bad_line, j->bad_offset, j->bad_reason);
        } else if (j->io_error) {
                s->io_errors++;
                mandate_set_status(m, MANDATE_WAL_IO_ERROR, "wal_io_error");
                log_event(LOG_ERR, MSGID_WAL_IO_ERROR,
                          LOG_FIELDS({ "MANDATE_ID", m->id }, { "WAL", m->wal_path }),
                          "recovery: %s: cannot append recovery records: %s; mandate paused "
                          "(wal_io_error)",
                          m->wal_path, strerror(-j->io_error));
        } else {
                mandate_set_status(m, j->status, j->reason);
                /* a mandate with a summary (loaded before) has these already */
                free(m->schedule);
                free(m->goal);
                m->schedule = j->schedule;
                mandate_set_fired_at(m, j->fired_at);
                m->goal = j->goal;
                j->schedule = j->fired_at = j->goal = NULL;
                free(m->retry_of);
                m->retry_of = j->retry_of;
                m->retry = j->retry;
                j->retry_of = NULL;
                if (j->started_ms > 0)
                        m->started_ms = j->started_ms;
                free(m->plan_id);
                m->plan_id = j->plan_id;
                j->plan_id = NULL;
                m->cycle = j->cycle;
                if (j->status == MANDATE_PAUSED_REVIEW) {
                        m->review_step = j->review_step;
                        j->review_step = NULL;
                        s->paused_review++;
                        log_event(LOG_WARNING, MSGID_PAUSED_REVIEW,
                                  LOG_FIELDS({ "MANDATE_ID", m->id }, { "PLAN_ID", m->plan_id },
                                             { "STEP_ID", m->review_step }),
                                  "mandate %s paused for review at step %s (%s); resolve with "
                                  "kairosctl resolve %s %s --done|--retry|--abandon --reason TEXT",
                                  m->id, m->review_step, m->reason ? m->reason : "", m->id,
                                  m->review_step);
                        /* Notified once per start: sent after READY=1 (hooks.h). */
                        const char *evidence = NULL;
                        for (size_t i = 0; m->review_step && i < j->ndecisions; i++)
                                if (j->decisions[i].step_id &&
                                    strcmp(j->decisions[i].step_id, m->review_step) == 0)
                                        evidence = j->decisions[i].evidence;
                        hooks_event(d, HOOK_REVIEW, m, m->review_step, evidence);
                } else if (j->status == MANDATE_PROBING && j->held) {
                        toolhold_start(m, j->hold_step, j->hold, j->nhold, j->grace_ms,
                                       recover_again);
                } else if (j->status == MANDATE_PROBING) {
                        probe_enqueue(m, j->probe_step ? j->probe_step : "");
                } else if (j->ended) {
                        /* its end is in the WAL: only the archive is left to do */
                        executor_finish(m, j->end, j->end_reason);
                } else {
                        s->resumed++;
                        executor_enqueue(m);
                }
        }

        for (size_t i = 0; i < j->ndecisions; i++) {
                free(j->decisions[i].plan_id);   /* the block of its texts */
        }
        free(j->decisions);
        toolhold_release(j->hold, j->nhold);
        free(j->hold);
        free(j->hold_step);
        free(j->prev_owner);
        evidence_index_free(j->ix);
        schedules_free(j->schedules);
        free(j->torn_path);
        free(j->reason);
        free(j->end_reason);
        free(j->review_step);
        free(j->probe_step);
        free(j->plan_id);
        free(j->schedule);
        free(j->fired_at);
        free(j->goal);
        free(j->retry_of);
        if (!j->in_chunk)
                free(j);
}

/* The WALs go to the pool RECOVER_CHUNK at a time, on RECOVER_LANES queues
 * of their own (not the mandates' queues: nothing else touches a mandate
 * before its job is settled, and the executor runs nothing before READY):
 * one hand-over to a pool thread and one wake-up of the loop per chunk, not
 * per WAL. */
#define RECOVER_CHUNK 64
#define RECOVER_LANES 16
/* While recover_start registers the mandates the loop runs nothing else, so
 * a lane cannot start its next job (that happens on the loop, when the one
 * before is done): the first jobs get a lane each (RECOVER_START_WINDOW /
 * RECOVER_CHUNK of them), so that the pool works through all of them while
 * the loop registers the rest, not 16 jobs and then nothing. */
#define RECOVER_START_LANES 128

struct recover_chunk {
        struct daemon *d;
        size_t n;
        /* in the chunk's own allocation: one calloc and one free on the
         * loop per chunk, not one per WAL */
        struct recover_job jobs[RECOVER_CHUNK];
};

static struct serialq lanes[RECOVER_START_LANES];
static unsigned next_lane, nlanes = RECOVER_LANES;
static bool lanes_fixed;        /* KAIROS_TEST_RECOVER_LANES: nlanes, also at start */

static void chunk_work(void *arg)
{
        struct recover_chunk *c = arg;
        for (size_t i = 0; i < c->n; i++)
                recover_work(&c->jobs[i]);
}

static void chunk_done(void *arg)
{
        struct recover_chunk *c = arg;
        struct daemon *d = c->d;
        size_t n = c->n;
        log_hold(true);         /* the chunk's lines in one write */
        for (size_t i = 0; i < n; i++)
                recover_settle(&c->jobs[i]);
        log_hold(false);
        free(c);
        recover_inflight -= n;
        submit_more(d);
        pending_jobs -= n;
        early_sync(d);
        if (pending_jobs == 0) {
                snap_free();
                recovery_sync(d);
        }
}

union name {
        size_t off;             /* in the block, while it may still move */
        const char *s;
};

static int cmp_name(const void *a, const void *b)
{
        return strcmp(((const union name *)a)->s, ((const union name *)b)->s);
}

/* A name and 8 of its bytes, big-endian (0 past its end): where the names
 * start to differ. */
struct name_key {
        uint64_t k;
        const char *s;
};

static int cmp_name_key(const void *a, const void *b)
{
        return strcmp(((const struct name_key *)a)->s, ((const struct name_key *)b)->s);
}

/* The names in strcmp order, as qsort with cmp_name would put them, in a
 * few passes over them: a radix sort of 8 bytes each, taken after the
 * prefix they all share (mandate ids do: mnd_...), then strcmp only among
 * names with the same 8 bytes.  (qsort: 1.7 million strcmp of names
 * spread over memory for 100,000 WALs, the loop alone meanwhile.)  Falls
 * back to qsort without the memory. */
static void sort_names(union name *names, size_t n)
{
        struct name_key *a = n > 1 ? malloc(n * sizeof(*a)) : NULL;
        struct name_key *b = n > 1 ? malloc(n * sizeof(*b)) : NULL;
        if (!a || !b) {
                free(a);
                free(b);
                if (n > 1)
                        qsort(names, n, sizeof(*names), cmp_name);
                return;
        }
        size_t pre = strlen(names[0].s);
        for (size_t i = 1; i < n && pre; i++) {
                size_t l = 0;
                while (l < pre && names[i].s[l] == names[0].s[l])
                        l++;
                pre = l;
        }
        for (size_t i = 0; i < n; i++) {
                const unsigned char *p = (const unsigned char *)names[i].s + pre;
                uint64_t k = 0;
                bool end = false;
                for (int c = 0; c < 8; c++) {
                        end = end || p[c] == 0;
                        k = k << 8 | (end ? 0 : p[c]);
                }
                a[i] = (struct name_key){ k, names[i].s };
        }
        /* least significant byte first; a byte all names share: no pass */
        for (unsigned shift = 0; shift < 64; shift += 8) {
                size_t count[256] = { 0 };
                for (size_t i = 0; i < n; i++)
                        count[(a[i].k >> shift) & 0xff]++;
                if (count[(a[0].k >> shift) & 0xff] == n)
                        continue;
                size_t pos = 0;
                for (unsigned c = 0; c < 256; c++) {
                        size_t t = count[c];
                        count[c] = pos;
                        pos += t;
                }
                for (size_t i = 0; i < n; i++)
                        b[count[(a[i].k >> shift) & 0xff]++] = a[i];
                struct name_key *t = a;
                a = b;
                b = t;
        }
        /* the same 8 bytes, none of them the end: the rest decides */
        for (size_t i = 0; i < n;) {
                size_t j = i + 1;
                while (j < n && a[j].k == a[i].k)
                        j++;
                if (j - i > 1 && (a[i].k & 0xff) != 0)
                        qsort(a + i, j - i, sizeof(*a), cmp_name_key);
                i = j;
        }
        for (size_t i = 0; i < n; i++)
                names[i].s = a[i].s;
        free(a);
        free(b);
}

/* id appended to the block of names, its offset to *names. */
static int names_add(union name **names, size_t *n, size_t *cap, char **blk, size_t *blen,
                     size_t *bcap, const char *id)
{
        size_t l = strlen(id) + 1;
        if (*n == *cap) {
                size_t nc = *cap ? *cap * 2 : 1024;
                union name *nn = realloc(*names, nc * sizeof(*nn));
                if (!nn)
                        return -ENOMEM;
                *names = nn;
                *cap = nc;
        }
        if (*blen + l > *bcap) {
                size_t nc = *bcap ? *bcap * 2 : 16384;
                while (nc < *blen + l)
                        nc *= 2;
                char *nb = realloc(*blk, nc);
                if (!nb)
                        return -ENOMEM;
                *blk = nb;
                *bcap = nc;
        }
        memcpy(*blk + *blen, id, l);
        (*names)[(*n)++].off = *blen;
        *blen += l;
        return 0;
}

/* Finished mandates are known by their summaries (mandates/ID.json), so
 * `list` and `show` find them and firing them again is a no-op. */
static void load_summary(struct daemon *d, const char *path)
{
        struct showdoc_mandate sm;
        const char *archive;
        json_t *j;
        char why[160];
        if (showdoc_summary_read(path, &sm, &archive, &j, why, sizeof why) < 0) {
                log_warning("ignoring the mandate summary %s: %s", path, why);
                return;
        }
        struct mandate *m = mandate_find(d, sm.id) ? NULL : mandate_add(d, sm.id, archive);
        if (m) {
                int st = mandate_status_parse(sm.status);
                mandate_set_status(m, st < 0 ? MANDATE_DONE : st, sm.reason);
                if (sm.schedule)
                        m->schedule = strdup(sm.schedule);
                if (sm.fired_at)
                        mandate_set_fired_at(m, strdup(sm.fired_at));
                if (sm.retry_of && sm.retry <= PLANNER_MAX_RETRY) {
                        m->retry_of = strdup(sm.retry_of);
                        m->retry = sm.retry;
                }
                if (sm.plan_id)
                        m->plan_id = strdup(sm.plan_id);
                m->cycle = sm.cycle;
                m->started_ms = sm.started_ms;
                m->ended_ms = sm.ended_ms;
                m->down_ms = sm.down_ms;
                m->archived = true;
        }
        json_decref(j);
}

int recover_load_finished(struct daemon *d)
{
        DIR *dir = opendir(d->paths.mandates);
        if (!dir)
                return errno == ENOENT ? 0 : -errno;
        struct dirent *de;
        while ((de = readdir(dir))) {
                char id[256], *path = NULL;
                if (!statedir_entry_id(de->d_name, STATEDIR_SUMMARY_SUFFIX, id, sizeof id) ||
                    statedir_summary_path(&d->paths, id, &path) < 0)
                        continue;
                load_summary(d, path);
                free(path);
        }
        closedir(dir);
        return 0;
}

/* The WALs found at start, opened a window at a time: a job (and its
 * buffers) exists only while it is in flight, so memory does not grow with
 * the number of WALs. */
/* Two chunks a lane: the next one waits on its lane while the loop settles
 * the one before, so no lane idles meanwhile. */
#define RECOVER_WINDOW (RECOVER_CHUNK * 2 * RECOVER_LANES)

static struct {
        struct mandate **todo;
        size_t n, next;
        bool registering;       /* recover_start still registers: todo grows */
} pend;

/* While recover_start registers the mandates (the loop busy with that
 * alone), the pool gets more at once: it starts on the first WALs while the
 * loop registers the others, instead of waiting for the whole registry. */
#define RECOVER_START_WINDOW (RECOVER_CHUNK * RECOVER_START_LANES)

static void submit_more(struct daemon *d)
{
        size_t window = pend.registering ? RECOVER_START_WINDOW : RECOVER_WINDOW;
        while (pend.next < pend.n && recover_inflight < window) {
                struct recover_chunk *c = calloc(1, sizeof(*c));
                if (!c)
                        break;
                c->d = d;
                while (c->n < RECOVER_CHUNK && pend.next < pend.n) {
                        struct mandate *m = pend.todo[pend.next];
                        struct recover_job *j = &c->jobs[c->n++];
                        j->m = m;
                        j->d = d;
                        j->in_chunk = true;
                        j->had_summary = m->archived;
                        m->archived = false;
                        pend.next++;
                }
                unsigned use = pend.registering && !lanes_fixed ? RECOVER_START_LANES : nlanes;
                struct serialq *lane = &lanes[next_lane++ % use];
                if (!lane->loop)
                        serialq_init(lane, d->loop, &d->jobs);
                pending_jobs += c->n;
                recover_inflight += c->n;
                if (serialq_submit(lane, chunk_work, chunk_done, c) < 0) {
                        pending_jobs -= c->n;
                        recover_inflight -= c->n;
                        for (size_t i = 0; i < c->n; i++) {
                                mandate_set_status(c->jobs[i].m, MANDATE_WAL_IO_ERROR,
                                                   "wal_io_error");
                                d->recovery.io_errors++;
                        }
                        free(c);
                }
        }
        if (pend.next == pend.n && !pend.registering) {
                free(pend.todo);
                pend.todo = NULL;
                pend.n = pend.next = 0;
        }
}

int recover_start(struct daemon *d, struct evidence_index *ix, void (*done)(struct daemon *d))
{
        recovery_done_cb = done;
        early = (struct early_sync){ .min = EARLY_SYNC_MIN };
#ifdef KAIROS_TEST_HOOKS
        const char *em = getenv("KAIROS_TEST_EARLY_SYNC_MIN");
        if (em && *em)
                early.min = strtoul(em, NULL, 10);
        const char *nl = getenv("KAIROS_TEST_RECOVER_LANES");
        if (nl && *nl && strtoul(nl, NULL, 10) >= 1 && strtoul(nl, NULL, 10) <= RECOVER_LANES) {
                nlanes = (unsigned)strtoul(nl, NULL, 10);
                lanes_fixed = true;
        }
#endif
        d->recovery.started_ms = now_ms_monotonic();
        snap.ix = ix;
        int r = snap_schedules(d->cfg);
        snap.wal_dir = open(d->paths.wal, O_PATH | O_DIRECTORY | O_CLOEXEC);
        DIR *dir = r < 0 ? NULL : opendir(d->paths.wal);
        if (!dir) {
                r = r < 0 ? r : -errno;
                snap_free();
                return r;
        }
        /* The ids, one after another in one block (not a strdup each:
         * 100,000 allocations and frees on the loop before a job starts,
         * 2 MB more peak RSS); their offsets first, pointers once the
         * block stops moving. */
        char *blk = NULL;
        size_t blen = 0, bcap = 0;
        union name *names = NULL;
        size_t n = 0, cap = 0;
        struct dirent *de;
        while ((de = readdir(dir))) {
                char id[256];
                if (wal_spare_name(de->d_name)) {
                        if ((r = mandate_spare_seen(de->d_name)) < 0)
                                break;
                        continue;
                }
                if (!statedir_entry_id(de->d_name, STATEDIR_WAL_SUFFIX, id, sizeof id))
                        continue;
                if ((r = names_add(&names, &n, &cap, &blk, &blen, &bcap, id)) < 0)
                        break;
        }
        closedir(dir);
        /* the spares, settled once the scan is over (a file renamed while
         * readdir runs may be seen again): those adopted are WALs too */
        char **adopted = NULL;
        size_t nadopted = 0;
        int rs = mandate_spares_settle(d, &adopted, &nadopted);
        r = r < 0 ? r : rs;
        for (size_t i = 0; i < nadopted; i++) {
                if (r == 0)
                        r = names_add(&names, &n, &cap, &blk, &blen, &bcap, adopted[i]);
                free(adopted[i]);
        }
        free(adopted);
        for (size_t i = 0; r == 0 && i < n; i++)
                names[i].s = blk + names[i].off;
        if (r == 0 && n > 1)
                sort_names(names, n);
        if (r == 0 && n && !(pend.todo = calloc(n, sizeof(*pend.todo))))
                r = -ENOMEM;

        /* Register every mandate before any job is settled (list, show and
         * fire know them during recovery), and open their WALs a window at a
         * time.  The first windows go to the pool while the loop registers
         * the rest: a job reads only its own mandate's id and path, and
         * nothing is settled before this function returns. */
        /* the id map sized once for all of them (not a table per power of
         * two on the way, each touched and dropped: 3,000 page faults at
         * 100,000 WALs); if that fails, the puts grow it as before */
        (void)strmap_reserve(d->mandates, n);
        pending_jobs = 1; /* held until every job is queued */
        pend.registering = true;
        /* (no summary loaded: a mandate is known only if its name came
         * twice, sorted next to each other) */
        bool known = strmap_size(d->mandates) > 0;
        for (size_t i = 0; r == 0 && i < n; i++) {
                char *path = NULL;
                const char *id = names[i].s;
                if ((r = statedir_wal_path(&d->paths, id, &path)) < 0)
                        break;
                /* A WAL next to a summary: the end was recorded but the WAL
                 * not yet archived.  The WAL wins; the executor ends it again.
                 * (archived stays true until the job starts: it says "had a
                 * summary".) */
                struct mandate *m =
                        known || (i > 0 && strcmp(names[i - 1].s, id) == 0) ? mandate_find(d, id)
                                                                           : NULL;
                if (m) {
                        free(m->wal_path);
                        m->wal_path = path;
                } else {
                        m = mandate_add_path(d, id, path);
                        if (m)
                                m->archived = false;
                }
                if (!m) {
                        r = -ENOMEM;
                        break;
                }
                pend.todo[pend.n++] = m;
                d->recovery.files++;
                if (pend.n % RECOVER_CHUNK == 0)
                        submit_more(d);
        }
        pend.registering = false;
        free(names);
        free(blk);
        if (r < 0) {
                /* (jobs already on the pool finish; their settling finds
                 * recovery failed: kairosd stops) */
                pend.n = pend.next;
                if (pend.next == 0) {
                        free(pend.todo);
                        pend.todo = NULL;
                        pend.n = 0;
                }
                if (--pending_jobs == 0)
                        snap_free();
                return r;
        }
        submit_more(d);
        if (--pending_jobs == 0) {
                snap_free();
                recovery_sync(d);
        }
        return 0;
}

/* ---- cluster mode: a mandate taken over from another node ---- */

static void adopt_work(void *arg)
{
        recover_work(arg);
}

static void adopt_done(void *arg)
{
        struct recover_job *j = arg;
        struct mandate *m = j->m;
        struct daemon *d = j->d;
        m->busy--;
        int err = 0;
        if (j->error || j->io_error) {
                /* fenced again, or the rows cannot be read: not ours */
                err = j->io_error == -ESTALE ? -ESTALE : -EIO;
                own_drop(m, j->io_error == -ESTALE ? "fenced while taking it over"
                                                   : "cannot record the takeover");
                j->error = j->io_error = 0;
                j->status = MANDATE_PAUSED;
        }
        void (*cb)(void *ctx, struct mandate *m, int err) = j->adopt_cb;
        void *ctx = j->adopt_ctx;
        recover_settle(j);
        daemon_update_status(d);
        if (cb)
                cb(ctx, m, err);
        executor_kick(d);
}

void recover_adopt(struct daemon *d, struct mandate *m, const char *prev_owner,
                   struct evidence_index *ix, void (*done)(void *ctx, struct mandate *m, int err),
                   void *ctx)
{
        struct recover_job *j = calloc(1, sizeof(*j));
        if (!j || (prev_owner && !(j->prev_owner = strdup(prev_owner)))) {
                free(j);
                evidence_index_free(ix);
                goto oom;
        }
        j->m = m;
        j->d = d;
        j->adopt = true;
        j->adopt_cb = done;
        j->adopt_ctx = ctx;
        j->ix = ix;
        if (schedules_map(d->cfg, &j->schedules) < 0) {
                evidence_index_free(j->ix);
                free(j->prev_owner);
                free(j);
                goto oom;
        }
        if (mandate_submit(m, adopt_work, adopt_done, j) < 0) {
                evidence_index_free(j->ix);
                schedules_free(j->schedules);
                free(j->prev_owner);
                free(j);
                goto oom;
        }
        return;
oom:
        own_drop(m, "out of memory");
        if (done)
                done(ctx, m, -ENOMEM);
}

/* ---- a step that waited for its tool calls (toolhold.h) ---- */

static void again_done(void *arg)
{
        struct recover_job *j = arg;
        struct mandate *m = j->m;
        struct daemon *d = j->d;
        m->busy--;
        j->not_ours = m->status != MANDATE_PROBING || m->cancel;
        recover_settle(j);
        daemon_update_status(d);
        executor_kick(d);
}

void recover_again(struct daemon *d, const char *mandate_id)
{
        struct mandate *m = mandate_find(d, mandate_id);
        struct recover_job *j = m ? calloc(1, sizeof(*j)) : NULL;
        if (!m)
                return;
        if (!j)
                goto oom;
        j->m = m;
        j->d = d;
        j->again = true;
        j->had_summary = true; /* (it has a plan) */
        if (idem_service_evidence_index(d, &j->ix) < 0) {
                free(j);
                goto oom;
        }
        if (schedules_map(d->cfg, &j->schedules) < 0 ||
            mandate_submit(m, recover_work, again_done, j) < 0) {
                evidence_index_free(j->ix);
                schedules_free(j->schedules);
                free(j);
                goto oom;
        }
        return;
oom:
        log_error("%s: out of memory deciding it after its tool call; it stays probing until "
                  "the next start", mandate_id);
}
