/* SPDX-License-Identifier: MIT */
/* The advance job.  Everything a mandate does is decided from
 * its WAL (the source of truth) by one kind of job, `advance`, which runs on
 * the mandate's serial queue: append the records of what just happened, fold
 * the WAL, decide what comes next, append the records of that, and make all
 * of it durable with ONE fdatasync.  Only then does the loop act on it
 * (spawn the next handler, pause, or finish).  So completed(N) and
 * executing(N+1) share a flush, as do completed(reflect), plan_finalize and
 * the next cycle's plan_commit + executing(observe). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <sodium.h>

#include "executor_internal.h"
#include "kairos/canon.h"
#include "kairos/fold.h"
#include "kairos/kio.h"
#include "kairos/idem.h"
#include "kairos/stepdoc.h"
#include "driver.h"
#include "hooks.h"
#include "log.h"

char *advance_own(struct advance *a, const char *s)
{
        if (!s || a->nowned == sizeof a->owned / sizeof a->owned[0])
                return NULL;
        char *c = strdup(s);
        if (c)
                a->owned[a->nowned++] = c;
        return c;
}

char *advance_take(struct advance *a, char *s)
{
        if (s && a->nowned < sizeof a->owned / sizeof a->owned[0])
                return a->owned[a->nowned++] = s;
        free(s);
        return NULL;
}

void advance_free(struct advance *a)
{
        for (size_t i = 0; i < a->nowned; i++)
                free(a->owned[i]);
        free(a->schedule);
        free(a->fired_at);
        free(a->goal);
        free(a->reason);
        free(a->plan_id);
        free(a->step_id);
        free(a->idem_key);
        free(a->expected_post);
        free(a->archive_path);
        free(a->cancel_reason);
        free(a->interrupted);
        free(a->wal_failure);
        free(a->review_evidence);
        kbuf_free(&a->stdin_doc);
        free(a);
}

struct advance *advance_new(struct mandate *m)
{
        struct advance *a = calloc(1, sizeof(*a));
        if (!a)
                return NULL;
        a->m = m;
        a->decide = true;
        a->phase = -1;
        struct daemon *d = m->d;
        const struct config_schedule *sc = NULL;
        for (size_t i = 0; m->schedule && i < d->cfg->nschedules; i++)
                if (strcmp(d->cfg->schedules[i].name, m->schedule) == 0)
                        sc = &d->cfg->schedules[i];
        a->schedule_known = sc != NULL;
        a->max_cycles = sc ? sc->max_cycles : 1;
        for (int i = 0; sc && i < PLANNER_PHASES; i++) {
                a->has_command[i] = sc->exec[i] && *sc->exec[i];
                a->retry_policy[i] = sc->retry[i];
                if (sc->effects_via == EFFECTS_VIA_KAIROSCTL && (sc->effects & (1u << i)) &&
                    a->has_command[i])
                        a->retry_evidence_phases |= 1u << i;
        }
        a->schedule = m->schedule ? strdup(m->schedule) : NULL;
        a->fired_at = m->fired_at ? strdup(m->fired_at) : NULL;
        a->goal = m->goal ? strdup(m->goal) : NULL;
        a->retry = m->retry;
        /* (a barrier of the driver's own, a transaction: not alone) */
        struct wal_options wo = { 0 };
        d->drv->wal.options(m, &wo);
        const struct executor *x = d->executor;
        a->end_alone = !wo.barrier && d->sync_mode == STATEDIR_SYNC_FS && x->running <= 1 &&
                       !x->queue_head && !x->arch_npending && !x->arch_syncing;
        return a;
}

void advance_set_plan(struct advance *a, struct wal_record *r, const struct planner_plan *p)
{
        a->plan = *p;
        for (int i = 0; i < PLANNER_PHASES; i++)
                a->wsteps[i] = (struct wal_step){ a->plan.steps[i].step_id, a->plan.steps[i].tool,
                                                  a->plan.steps[i].params_hash,
                                                  a->plan.steps[i].pre_hash,
                                                  a->plan.steps[i].expected_post_hash };
        *r = (struct wal_record){ .op = WAL_OP_PLAN_COMMIT, .plan_id = a->plan.plan_id,
                                  .mandate_id = a->plan.mandate_id, .cycle = a->plan.cycle,
                                  .steps = a->wsteps, .nsteps = PLANNER_PHASES };
}

/* ---- deciding from the fold (pool thread) ---- */

static const struct fold_step *plan_step(const struct fold *f, const struct fold_plan *p,
                                         size_t i)
{
        return &f->steps[p->steps[i]];
}

static int append_rec(struct advance *a, struct wal *w, const struct wal_record *r)
{
        int e = wal_append(w, r);
        if (e < 0 && !a->error) {
                /* an encoding problem has a detail; an I/O error (ENOSPC) has none */
                const char *detail = e == -EINVAL ? wal_encode_error() : "";
                a->error = e;
                snprintf(a->errmsg, sizeof a->errmsg, "appending to %s: %s%s%s%s", wal_path(w),
                         strerror(-e), *detail ? " (" : "", detail, *detail ? ")" : "");
        }
        return e;
}

/* The stdin document of a step (kairos/stepdoc.h). */
static void build_stdin(struct advance *a, const struct fold *f, const struct fold_plan *p,
                        size_t idx)
{
        struct stepdoc_input in = { .mandate_id = a->m->id, .schedule = a->schedule,
                                    .fired_at = a->fired_at, .goal = a->goal,
                                    .max_cycles = a->max_cycles, .attempt = a->attempt,
                                    .idem_key = a->idem_key };
        executor_stdin_buffer(&a->stdin_doc);
        (void)stepdoc_build(f, p, idx, &in, &a->stdin_doc);
}

/* Fold bytes into the mandate's fold and keep them (the archive is made
 * from them, not read again); own: bytes this process appended itself. */
static int fold_more(struct mandate *m, struct kbuf *b, bool own)
{
        size_t used = 0;
        int r = !b->len ? 0
                : own   ? fold_feed_own(m->fold, b->data, b->len, &used)
                        : fold_feed(m->fold, b->data, b->len, &used);
        struct kbuf *kept = &m->wal_bytes;
        if (used == b->len && used > kept->len && b->cap - b->len > kept->len) {
                /* (a line with a big result: the bytes kept so far go in
                 * front of it, in its own buffer, rather than it after them
                 * in a buffer grown for it) */
                memmove(b->data + kept->len, b->data, used + 1);
                if (kept->len)
                        memcpy(b->data, kept->data, kept->len);
                b->len += kept->len;
                kbuf_free(kept);
                *kept = *b;
                *b = (struct kbuf)KBUF_INIT;
        } else if (used && kbuf_append(kept, b->data, used) < 0) {
                kbuf_free(kept);
        }
        return r;
}

/* Bring the mandate's fold up to date with its WAL: fold the records after
 * the last folded one.  What was appended through m->wal (by this job, a
 * command, a probe) comes from memory: the file is never read back while
 * the mandate runs.  The file is read only for what this handle did not
 * write (a WAL reopened after recovery or another process) or when memory
 * ran out keeping the lines. */
static int fold_catch_up(struct mandate *m)
{
        int r;
        if (!m->fold && (r = fold_new(&m->fold)) < 0)
                return r;
        struct kbuf b = KBUF_INIT;
        uint64_t at = 0;
        if (m->wal && wal_take_appended(m->wal, &b, &at) == 0 && at == m->fold->good_end) {
                r = fold_more(m, &b, true);
                kbuf_free(&b);
                return r;
        }
        kbuf_free(&b); /* (what was kept is in the file: read from there) */
        int fd;
        do
                fd = open(m->wal_path, O_RDONLY | O_CLOEXEC);
        while (fd < 0 && errno == EINTR);
        if (fd < 0)
                return -errno;
        off_t off = (off_t)m->fold->good_end;
        r = 0;
        for (;;) {
                if ((r = kbuf_reserve(&b, 16384)) < 0)
                        break;
                ssize_t k = pread(fd, b.data + b.len, b.cap - b.len - 1, off + (off_t)b.len);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0) {
                        r = -errno;
                        break;
                }
                if (k == 0)
                        break;
                b.len += (size_t)k;
        }
        close(fd);
        if (r == 0)
                r = fold_more(m, &b, false);
        kbuf_free(&b);
        return r;
}

static void drop_fold(struct mandate *m)
{
        fold_free(m->fold);
        m->fold = NULL;
        kbuf_free(&m->wal_bytes);
}

enum mandate_status advance_end_status(enum decide_end e)
{
        switch (e) {
        case DECIDE_END_DONE:
                return MANDATE_DONE;
        case DECIDE_END_FAILED:
                return MANDATE_FAILED;
        case DECIDE_END_TERMINATED:
                return MANDATE_TERMINATED;
        case DECIDE_END_ABANDONED:
                return MANDATE_ABANDONED;
        case DECIDE_END_CANCELLED:
                return MANDATE_CANCELLED;
        }
        return MANDATE_FAILED;
}

static void set_str(char **dst, const char *src)
{
        free(*dst);
        *dst = src ? strdup(src) : NULL;
}

/* A review: the evidence its page carries, the step's needs_review
 * record's (as recovery's and the probe's reviews carry theirs). */
static void review_evidence(struct advance *a, const struct fold *f, const char *step_id)
{
        const struct fold_step *s = f && step_id ? fold_find_step(f, step_id) : NULL;
        if (s && s->state == STEP_NEEDS_REVIEW && s->evidence_json)
                set_str(&a->review_evidence, s->evidence_json);
}

/* The mandate ends failed or terminated: the failed step of its last plan
 * as its failed record says (step, class, exit, stderr, attempt). */
static void failure_from_wal(struct advance *a, const struct fold *f)
{
        const struct fold_plan *p = NULL;
        for (size_t i = f ? f->nplans : 0; i-- > 0;)
                if (!f->plans[i].orphan_reason) {
                        p = &f->plans[i];
                        break;
                }
        for (size_t i = 0; p && i < p->nsteps; i++) {
                const struct fold_step *s = plan_step(f, p, i);
                if (s->state != STEP_FAILED)
                        continue;
                a->wal_failure = hooks_failure_copy(&(struct hook_failure){
                        .step = (char *)s->step_id,
                        .error_class = (char *)s->error_class,
                        .error_msg = (char *)s->error_msg,
                        .exit_status = s->has_exit_status ? s->exit_status : -1,
                        .exit_signal = s->exit_signal,
                        .attempt = s->executions,
                        .stderr_tail = (char *)s->stderr_tail });
                return;
        }
}

/* The retry delay's jitter: 4 random bytes, drawn from a per-thread pool
 * refilled by one call for 256 draws (randombytes_random asks the kernel
 * each time: a getrandom per job, though a retry is rarely scheduled). */
static uint32_t jitter_draw(void)
{
        static __thread uint32_t pool[256];
        static __thread unsigned left;
        if (left == 0) {
                randombytes_buf(pool, sizeof pool);
                left = sizeof pool / sizeof pool[0];
        }
        return pool[--left];
}

/* Decide and append until a decision needs the loop (a spawn, a pause, the
 * end) or there is nothing to do. */
static void decide_loop(struct advance *a)
{
        struct mandate *m = a->m;
        struct decide_input in = {
                .mandate_id = m->id,
                .schedule = a->schedule,
                .fired_at = a->fired_at,
                .schedule_known = a->schedule_known,
                .max_cycles = a->max_cycles,
                .retry = a->retry,
                .retry_policy = a->retry_policy,
                .now_ms = now_ms_realtime(),
                .jitter_rand = jitter_draw(),
                .retry_evidence_phases = a->retry_evidence_phases,
        };
        memcpy(in.has_command, a->has_command, sizeof in.has_command);
        struct decide_next *n = malloc(sizeof(*n));
        if (!n) {
                a->error = -ENOMEM;
                snprintf(a->errmsg, sizeof a->errmsg, "deciding %s: out of memory", m->id);
                return;
        }
        /* Bounded: every pass appends a record that moves the mandate on
         * (MaxCycles <= 10 cycles of at most 7 passes). */
        for (int pass = 0; pass < 256 && !a->error; pass++) {
                int r = fold_catch_up(m);
                if (r == 0)
                        r = decide_next(m->fold, &in, n);
                if (r < 0) {
                        bool corrupt = r == -EBADMSG;
                        a->error = r;
                        snprintf(a->errmsg, sizeof a->errmsg, "folding %s: %s", m->wal_path,
                                 corrupt && m->fold ? m->fold->bad_reason : strerror(-r));
                        drop_fold(m);
                        break;
                }
                if (n->plan_id) {
                        set_str(&a->plan_id, n->plan_id);
                        a->cycle = n->cycle;
                }
                for (size_t i = 0; i < n->nrecords && !a->error; i++) {
                        append_rec(a, m->wal, &n->records[i]);
                        enum planner_phase ph;
                        if (n->records[i].op == WAL_OP_RETRY_WAIT &&
                            planner_parse_step_id(n->records[i].step_id, &ph, NULL) == 0)
                                a->retries_written[ph]++;
                }
                if (a->error)
                        break;
                if (n->cycle_finished)
                        a->cycle_finished = true;
                if (n->kind == DECIDE_COMPLETE_STEP && n->phase >= 0)
                        a->completed_inline[n->phase]++;
                if (n->again)
                        continue;
                switch (n->kind) {
                case DECIDE_RUN_STEP:
                        set_str(&a->step_id, n->step_id);
                        set_str(&a->idem_key, n->idem_key);
                        set_str(&a->expected_post, n->expected_post);
                        a->attempt = n->attempt;
                        a->phase = n->phase;
                        /* fold what was just appended, for the stdin document */
                        if ((r = fold_catch_up(m)) < 0) {
                                a->error = r;
                                snprintf(a->errmsg, sizeof a->errmsg, "folding %s: %s",
                                         m->wal_path, strerror(-r));
                                drop_fold(m);
                                break;
                        }
                        build_stdin(a, m->fold, &m->fold->plans[n->plan], (size_t)n->phase);
                        a->next = NEXT_RUN_STEP;
                        break;
                case DECIDE_AWAIT_APPROVAL:
                case DECIDE_REVIEW:
                        a->next = n->kind == DECIDE_REVIEW ? NEXT_REVIEW : NEXT_AWAIT_APPROVAL;
                        set_str(&a->step_id, n->step_id);
                        set_str(&a->reason, n->reason);
                        if (n->kind == DECIDE_REVIEW)
                                review_evidence(a, m->fold, n->step_id);
                        break;
                case DECIDE_PAUSE:
                        a->next = NEXT_PAUSE;
                        set_str(&a->reason, n->reason);
                        break;
                case DECIDE_RETRY_EVIDENCE:
                        a->next = NEXT_RETRY_EVIDENCE;
                        set_str(&a->step_id, n->step_id);
                        break;
                case DECIDE_RETRY_WAIT:
                        a->next = NEXT_RETRY_WAIT;
                        a->retry_due_ms = n->due_ms;
                        set_str(&a->step_id, n->step_id);
                        break;
                case DECIDE_END:
                        a->next = NEXT_END;
                        a->end_status = advance_end_status(n->end);
                        set_str(&a->reason, n->reason);
                        break;
                default:
                        a->next = NEXT_NONE;
                        break;
                }
                break;
        }
        free(n);
        /* started: its mandate record's time (or its first record's), as
         * recovery and kairosctl list --state-dir read it */
        const struct fold *f = m->fold;
        if (f && !a->error) {
                wal_parse_ts(f->mandate.ts ? f->mandate.ts : f->first_ts, &a->started_ms);
                a->down_ms = f->down_ms;
        }
}

static int write_summary(struct advance *a, const struct statedir *paths, const char *archive)
{
        struct kbuf b = KBUF_INIT;
        kbuf_puts(&b, "{\"mandate_id\":");
        kbuf_json_string_lossy(&b, a->m->id, strlen(a->m->id), 0);
        kbuf_puts(&b, ",\"schedule\":");
        a->schedule ? (void)kbuf_json_string_lossy(&b, a->schedule, strlen(a->schedule), 0)
                    : (void)kbuf_puts(&b, "null");
        kbuf_puts(&b, ",\"fired_at\":");
        a->fired_at ? (void)kbuf_json_string_lossy(&b, a->fired_at, strlen(a->fired_at), 0)
                    : (void)kbuf_puts(&b, "null");
        kbuf_printf(&b, ",\"status\":\"%s\",\"reason\":", mandate_status_name(a->end_status));
        a->reason ? (void)kbuf_json_string_lossy(&b, a->reason, strlen(a->reason), 0)
                  : (void)kbuf_puts(&b, "null");
        if (a->m->retry_of) {
                kbuf_puts(&b, ",\"retry_of\":");
                kbuf_json_string_lossy(&b, a->m->retry_of, strlen(a->m->retry_of), 0);
                kbuf_printf(&b, ",\"retry\":%d", a->m->retry);
        }
        if (a->plan_id) {
                kbuf_puts(&b, ",\"plan_id\":");
                kbuf_json_string_lossy(&b, a->plan_id, strlen(a->plan_id), 0);
        }
        /* the end the registry says too (list is the same after a restart) */
        int64_t ended_ms = a->ended_ms = now_ms_realtime();
        kbuf_printf(&b, ",\"cycles\":%lld,\"ended_at\":%lld,\"started_ms\":%lld,\"ended_ms\":%lld,",
                    a->cycle, (long long)(ended_ms / 1000),
                    (long long)(a->started_ms > 0 ? a->started_ms : a->m->started_ms),
                    (long long)ended_ms);
        if (a->down_ms > 0)
                kbuf_printf(&b, "\"down_ms\":%lld,", (long long)a->down_ms);
        kbuf_puts(&b, "\"archive\":");
        kbuf_json_string_lossy(&b, archive, strlen(archive), 0);
        kbuf_puts(&b, "}\n");
        char *path = NULL;
        int r = statedir_summary_path(paths, a->m->id, &path);
        if (r == 0)
                r = kio_write_file_nosync(kio_posix(), path, b.data, b.len, STATEDIR_FILE_MODE);
        free(path);
        kbuf_free(&b);
        return r;
}

/* The records of a cancel (pool thread): a step left executing (its
 * handler stopped, or never started) failed with error_class cancelled, the
 * operator record, the open plan finalized abandoned; then the end. */
static void cancel_work(struct advance *a, struct wal *w)
{
        int r = fold_catch_up(a->m);
        const struct fold *f = a->m->fold;
        if (r < 0 || !f || f->status == FOLD_CORRUPT) {
                a->error = r < 0 ? r : -EBADMSG;
                snprintf(a->errmsg, sizeof a->errmsg, "folding %s: %s", a->m->wal_path,
                         r < 0 || !f ? strerror(r < 0 ? -r : ENOMEM) : f->bad_reason);
                drop_fold(a->m);
                return;
        }
        char msg[600];
        snprintf(msg, sizeof msg, "cancelled by uid %lld before the handler started: %s",
                 a->cancel_uid, a->cancel_reason);
        const struct fold_plan *open = NULL;
        for (size_t i = f->nplans; i-- > 0;)
                if (!f->plans[i].orphan_reason) {
                        open = f->plans[i].finalized ? NULL : &f->plans[i];
                        break;
                }
        for (size_t i = 0; open && i < open->nsteps && !a->error; i++) {
                const struct fold_step *s = plan_step(f, open, i);
                if (s->state != STEP_EXECUTING)
                        continue;
                struct wal_record rec = { .op = WAL_OP_FAILED, .step_id = s->step_id,
                                          .error_class = "cancelled", .error_msg = msg };
                append_rec(a, w, &rec);
        }
        struct wal_record op = { .op = WAL_OP_OPERATOR, .mandate_id = a->m->id,
                                 .action = "cancel", .step_id = a->interrupted,
                                 .uid = a->cancel_uid, .reason = a->cancel_reason };
        append_rec(a, w, &op);
        char why[600];
        snprintf(why, sizeof why, "cancelled: %s", a->cancel_reason);
        if (open) {
                struct wal_record fin = { .op = WAL_OP_FINALIZE, .plan_id = open->plan_id,
                                          .status = PLAN_ABANDONED, .reason = why };
                append_rec(a, w, &fin);
                a->cycle = open->cycle;
                free(a->plan_id);
                a->plan_id = strdup(open->plan_id);
        } else if (f->nplans) {
                a->cycle = f->plans[f->nplans - 1].cycle;
        }
        a->next = NEXT_END;
        a->end_status = MANDATE_CANCELLED;
        set_str(&a->reason, why);
}

/* The syncfs of a mandate ending alone; the spares for the next mandates
 * are created before it, so it makes them durable too (docs/design.md §6). */
static int end_syncfs(struct daemon *d)
{
        uint64_t mark = mandate_spares_fill(d);
        int r = kio_syncfs(kio_posix(), d->cfg->state_directory);
        mandate_spares_covered(d, mark, r);
        return r;
}

void advance_work(void *arg)
{
        struct advance *a = arg;
        struct mandate *m = a->m;
        if (a->cancel && m->archived) {
                a->cancel_too_late = true; /* it ended by itself just before */
                return;
        }
        int r = mandate_wal_open(m);
        if (r < 0) {
                a->error = r;
                snprintf(a->errmsg, sizeof a->errmsg, "opening %s: %s", m->wal_path,
                         r == -EBADMSG ? "the WAL is corrupt" : strerror(-r));
                return;
        }
        uint64_t flushes_before = wal_flush_count(m->wal);
        for (size_t i = 0; i < a->npre && !a->error; i++)
                append_rec(a, m->wal, &a->pre[i]);
        if (a->cancel && !a->error)
                cancel_work(a, m->wal);
        else if (a->decide && !a->error)
                decide_loop(a);
        /* Ending alone: the syncfs after the summary and the archive is the
         * barrier of the last records too (nothing acts on them before it). */
        bool end_by_syncfs = a->end_alone && a->next == NEXT_END;
        if (!a->error && !end_by_syncfs && (r = wal_flush(m->wal)) < 0) {
                a->error = r;
                m->d->drv->wal.failed(m, r, a->errmsg, sizeof a->errmsg);
        }
        a->flushes = wal_flush_count(m->wal) - flushes_before;
        /* the driver records the end too (postgres: the mandate's row) */
        if (!a->error && a->next == NEXT_END &&
            (r = own_finish(m, a->end_status, a->errmsg, sizeof a->errmsg)) < 0)
                a->error = r;
        if (!a->error && a->next == NEXT_END) {
                char *dest = NULL;
                const char *archive_dir = m->d->paths.archive;
                char *arch_path = NULL;
                if (statedir_archive_path(&m->d->paths, m->id, &arch_path) < 0)
                        arch_path = NULL;
                /* The summary first, then the archive, neither synced: the
                 * finalized WAL stays the truth until one syncfs for a batch
                 * of finished mandates has made both durable
                 * (executor_archive.c); only then does the WAL go.  A crash before that
                 * finds the WAL at the next start, and the end is decided
                 * and archived again. */
                if (!arch_path || (r = write_summary(a, &m->d->paths, arch_path)) < 0) {
                        r = arch_path ? r : -ENOMEM;
                        a->error = r;
                        snprintf(a->errmsg, sizeof a->errmsg, "writing the summary of %s: %s",
                                 m->id, strerror(-r));
                } else {
                        /* the last records too: the archive is made from memory */
                        (void)fold_catch_up(m);
                        wal_close(m->wal);
                        m->wal = NULL;
                        /* from the bytes folded when they are the whole file */
                        struct stat st;
                        bool whole = m->fold && m->wal_bytes.len == m->fold->good_end &&
                                     stat(m->wal_path, &st) == 0 &&
                                     (uint64_t)st.st_size == m->wal_bytes.len && m->wal_bytes.data;
                        r = whole ? wal_archive_stage_bytes(kio_posix(), m->wal_path,
                                                            m->wal_bytes.data, m->wal_bytes.len,
                                                            archive_dir, &dest)
                                  : wal_archive_stage(kio_posix(), m->wal_path, archive_dir,
                                                      &dest);
                        if (r < 0) {
                                a->error = r;
                                snprintf(a->errmsg, sizeof a->errmsg, "archiving %s: %s",
                                         m->wal_path, strerror(-r));
                        } else if (end_by_syncfs &&
                                   (r = end_syncfs(m->d)) < 0) {
                                /* its last records may be lost: wal_io_error */
                                a->error = r;
                                snprintf(a->errmsg, sizeof a->errmsg, "syncfs of %s: %s",
                                         m->d->cfg->state_directory, strerror(-r));
                        } else {
                                a->end_synced = end_by_syncfs;
                        }
                        if (a->end_synced) {
                                /* durable: the WAL goes now, in this job
                                 * (not a second job on the queue after a
                                 * turn of the loop) */
                                const struct kio *io = kio_posix();
                                r = io->unlink(io->ctx, m->wal_path);
                                a->unlink_error = r == -ENOENT ? 0 : r; /* gone already */
                        }
                        free(dest);
                        a->archive_path = arch_path;
                        arch_path = NULL;
                }
                free(arch_path);
        }
        if (!a->error && a->next == NEXT_END &&
            (a->end_status == MANDATE_FAILED || a->end_status == MANDATE_TERMINATED))
                failure_from_wal(a, m->fold);
        if (a->error || a->next == NEXT_END)
                drop_fold(m);
}
