/* SPDX-License-Identifier: MIT */
/* The executor: mandates run here.  Everything a mandate does is decided from
 * its WAL (the source of truth) by one kind of job, `advance`, which runs on
 * the mandate's serial queue: append the records of what just happened, fold
 * the WAL, decide what comes next, append the records of that, and make all
 * of it durable with ONE fdatasync.  Only then does the loop act on it
 * (spawn the next handler, pause, or finish).  So completed(N) and
 * executing(N+1) share a flush, as do completed(reflect), plan_finalize and
 * the next cycle's plan_commit + executing(observe). */
#include "executor.h"
#include "hooks.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <pwd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "result.h"
#include "kairos/canon.h"
#include "kairos/decide.h"
#include "kairos/fold.h"
#include "kairos/kbuf.h"
#include "kairos/kio.h"
#include "kairos/kjson.h"
#include "kairos/idem.h"
#include "kairos/planner.h"
#include "kairos/strmap.h"
#include "kairos/wal.h"
#include "log.h"
#include "metrics.h"
#include "runner.h"

#define MAX_OUTPUT (1024 * 1024)
#define STDERR_TAIL 2048
#define STDERR_LOG_MAX (64 * 1024)  /* bytes of a step's stderr that are logged */
#define STDERR_LINE_MAX 4096        /* bytes of one logged line */
#define KILL_GRACE_MS 5000
#define MAX_BATCH 8
#define SPAWN_RETRY_MIN_MS 100
#define SPAWN_RETRY_MAX_MS 5000

/* ------------------------------------------------------------------------ */
/* The advance job                                                          */
/* ------------------------------------------------------------------------ */

enum next_kind {
        NEXT_NONE,           /* stop here (shutdown, or nothing to decide) */
        NEXT_RUN_STEP,       /* spawn the handler of `step` */
        NEXT_AWAIT_APPROVAL, /* act asked for approval */
        NEXT_REVIEW,         /* a step needs a human */
        NEXT_PAUSE,          /* cannot go on (schedule missing, ...) */
        NEXT_END,            /* the mandate is over: archived */
};

struct advance {
        struct mandate *m;
        struct op_reply reply;        /* fire: answered when durable */
        bool decide;                  /* fold + decide + act (false: only append + flush) */
        /* records to append first (strings owned by `owned`) */
        struct wal_record pre[MAX_BATCH];
        size_t npre;
        struct planner_plan plan;     /* storage for a plan_commit in pre */
        struct wal_step wsteps[PLANNER_PHASES];
        char *owned[32];
        size_t nowned;
        /* configuration snapshot */
        unsigned max_cycles;
        bool has_command[PLANNER_PHASES];
        unsigned completed_inline[PLANNER_PHASES]; /* steps without a command, completed */
        char *schedule;
        char *fired_at;
        char *goal;
        int retry;                 /* the mandate's retry number (planner.h) */
        bool schedule_known;
        /* results */
        int error;                    /* WAL failure (negative errno) */
        char errmsg[256];
        enum next_kind next;
        enum mandate_status end_status;
        char *reason;
        long long cycle;
        char *plan_id;
        char *step_id;
        char *idem_key;
        char *expected_post;
        char *archive_path;           /* NEXT_END: where the WAL went */
        unsigned attempt;
        int phase;
        struct kbuf stdin_doc;
        uint64_t flushes;
        bool cycle_finished;
        /* kairosctl cancel: record the end instead of deciding */
        bool cancel, cancel_too_late;
        char *cancel_reason;
        long long cancel_uid;
        struct op_reply cancel_reply;
        char *interrupted;            /* the step whose handler the cancel stopped */
};

struct mandate_cancel {
        char *reason;
        uid_t uid;
        struct op_reply reply;
        bool submitted;               /* its advance job is queued */
};

static char *own(struct advance *a, const char *s)
{
        if (!s || a->nowned == sizeof a->owned / sizeof a->owned[0])
                return NULL;
        char *c = strdup(s);
        if (c)
                a->owned[a->nowned++] = c;
        return c;
}

static void advance_free(struct advance *a)
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
        kbuf_free(&a->stdin_doc);
        free(a);
}

static struct advance *advance_new(struct mandate *m)
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
        for (int i = 0; sc && i < PLANNER_PHASES; i++)
                a->has_command[i] = sc->exec[i] && *sc->exec[i];
        a->schedule = m->schedule ? strdup(m->schedule) : NULL;
        a->fired_at = m->fired_at ? strdup(m->fired_at) : NULL;
        a->goal = m->goal ? strdup(m->goal) : NULL;
        a->retry = m->retry;
        return a;
}

static void set_plan_records(struct advance *a, struct wal_record *r, const struct planner_plan *p)
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

static const struct fold_plan *plan_of_cycle(const struct fold *f, long long cycle)
{
        for (size_t i = f->nplans; i-- > 0;)
                if (f->plans[i].cycle == cycle && !f->plans[i].orphan_reason)
                        return &f->plans[i];
        return NULL;
}

static const char *reflect_result(const struct fold *f, const struct fold_plan *p)
{
        if (!p || p->nsteps < PLANNER_PHASES)
                return NULL;
        const struct fold_step *s = plan_step(f, p, PLANNER_PHASES - 1);
        return s->state == STEP_COMPLETED ? s->result_json : NULL;
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

/* The stdin document of a step: mandate, plan, step, goal, the results of
 * the earlier phases of this cycle and the previous cycle's reflect. */
static void build_stdin(struct advance *a, const struct fold *f, const struct fold_plan *p,
                        size_t idx)
{
        struct kbuf *b = &a->stdin_doc;
        kbuf_reset(b);
        kbuf_puts(b, "{\"mandate\":{\"id\":");
        kbuf_json_string_lossy(b, a->m->id, strlen(a->m->id), 0);
        kbuf_puts(b, ",\"schedule\":");
        if (a->schedule)
                kbuf_json_string_lossy(b, a->schedule, strlen(a->schedule), 0);
        else
                kbuf_puts(b, "null");
        kbuf_puts(b, ",\"fired_at\":");
        if (a->fired_at)
                kbuf_json_string_lossy(b, a->fired_at, strlen(a->fired_at), 0);
        else
                kbuf_puts(b, "null");
        kbuf_printf(b, ",\"max_cycles\":%u},\"goal\":", a->max_cycles);
        const char *goal = a->goal ? a->goal : (a->schedule ? a->schedule : "");
        kbuf_json_string_lossy(b, goal, strlen(goal), 0);
        kbuf_puts(b, ",\"plan\":{\"plan_id\":");
        kbuf_json_string_lossy(b, p->plan_id, strlen(p->plan_id), 0);
        kbuf_printf(b, ",\"cycle\":%lld},\"step\":{\"step_id\":", p->cycle);
        const struct fold_step *s = plan_step(f, p, idx);
        kbuf_json_string_lossy(b, s->step_id, strlen(s->step_id), 0);
        kbuf_printf(b, ",\"phase\":\"%s\",\"attempt\":%u,\"idem_key\":",
                    planner_phase_name((enum planner_phase)idx), a->attempt);
        kbuf_json_string_lossy(b, a->idem_key, strlen(a->idem_key), 0);
        kbuf_puts(b, "},\"results\":{");
        bool first = true;
        for (size_t i = 0; i < idx; i++) {
                const struct fold_step *e = plan_step(f, p, i);
                if (e->state != STEP_COMPLETED)
                        continue;
                kbuf_printf(b, "%s\"%s\":%s", first ? "" : ",",
                            planner_phase_name((enum planner_phase)i),
                            e->result_json ? e->result_json : "null");
                first = false;
        }
        kbuf_puts(b, "},\"previous_reflect\":");
        const char *prev = reflect_result(f, plan_of_cycle(f, p->cycle - 1));
        kbuf_puts(b, prev ? prev : "null");
        kbuf_puts(b, "}\n");
}

/* Bring the mandate's fold up to date with its WAL: fold the bytes after
 * the last folded record (what was appended since — by this job, a command
 * or recovery).  Reads each byte of the WAL once over the mandate's life. */
static int fold_catch_up(struct mandate *m)
{
        int r;
        if (!m->fold && (r = fold_new(&m->fold)) < 0)
                return r;
        int fd;
        do
                fd = open(m->wal_path, O_RDONLY | O_CLOEXEC);
        while (fd < 0 && errno == EINTR);
        if (fd < 0)
                return -errno;
        struct kbuf b = KBUF_INIT;
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
        size_t used = 0;
        if (r == 0 && b.len)
                r = fold_feed(m->fold, b.data, b.len, &used);
        /* keep what was folded: the archive is made from it, not read again */
        if (used && kbuf_append(&m->wal_bytes, b.data, used) < 0)
                kbuf_free(&m->wal_bytes);
        kbuf_free(&b);
        return r;
}

static void drop_fold(struct mandate *m)
{
        fold_free(m->fold);
        m->fold = NULL;
        kbuf_free(&m->wal_bytes);
}

static enum mandate_status end_status(enum decide_end e)
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
                for (size_t i = 0; i < n->nrecords && !a->error; i++)
                        append_rec(a, m->wal, &n->records[i]);
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
                        break;
                case DECIDE_PAUSE:
                        a->next = NEXT_PAUSE;
                        set_str(&a->reason, n->reason);
                        break;
                case DECIDE_END:
                        a->next = NEXT_END;
                        a->end_status = end_status(n->end);
                        set_str(&a->reason, n->reason);
                        break;
                default:
                        a->next = NEXT_NONE;
                        break;
                }
                break;
        }
        free(n);
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
        int64_t ended_ms = now_ms_realtime();
        kbuf_printf(&b, ",\"cycles\":%lld,\"ended_at\":%lld,\"started_ms\":%lld,\"ended_ms\":%lld,"
                    "\"archive\":", a->cycle, (long long)(ended_ms / 1000),
                    (long long)a->m->started_ms, (long long)ended_ms);
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
                                          .status = "abandoned", .reason = why };
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

static void advance_work(void *arg)
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
        if (!a->error && (r = wal_flush(m->wal)) < 0) {
                a->error = r;
                snprintf(a->errmsg, sizeof a->errmsg, "fdatasync of %s: %s", m->wal_path,
                         strerror(-r));
        }
        a->flushes = wal_flush_count(m->wal) - flushes_before;
        if (!a->error && a->next == NEXT_END) {
                char *dest = NULL;
                const char *archive_dir = m->d->paths.archive;
                char *arch_path = NULL;
                if (statedir_archive_path(&m->d->paths, m->id, &arch_path) < 0)
                        arch_path = NULL;
                /* The summary first, then the archive, neither synced: the
                 * finalized WAL stays the truth until one syncfs for a batch
                 * of finished mandates has made both durable (archive_*
                 * below); only then does the WAL go.  A crash before that
                 * finds the WAL at the next start, and the end is decided
                 * and archived again. */
                if (!arch_path || (r = write_summary(a, &m->d->paths, arch_path)) < 0) {
                        r = arch_path ? r : -ENOMEM;
                        a->error = r;
                        snprintf(a->errmsg, sizeof a->errmsg, "writing the summary of %s: %s",
                                 m->id, strerror(-r));
                } else {
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
                        }
                        free(dest);
                        a->archive_path = arch_path;
                        arch_path = NULL;
                }
                free(arch_path);
        }
        if (a->error || a->next == NEXT_END)
                drop_fold(m);
}

/* ------------------------------------------------------------------------ */
/* Handlers                                                                  */
/* ------------------------------------------------------------------------ */

struct exec_run {
        struct mandate *m;
        struct runner_job job;        /* the process (runner.h) */
        char **argv, **env;           /* owned: the job's argv and environment */
        char *cwd;
        char *cmdline;
        bool starting;                /* handed to the runner, not started yet */
        bool waiting_retry;           /* its start failed for want of resources */
        bool started;
        unsigned retry_ms, tries;
        uv_pipe_t in, out, err;
        uv_timer_t timer;
        unsigned open_handles;
        char *stdin_doc;
        size_t stdin_len;
        uv_write_t stdin_req;
        struct kbuf out_buf;
        struct kbuf err_line;
        char err_tail[STDERR_TAIL];
        size_t err_tail_len;
        size_t err_accepted, err_dropped; /* stderr bytes logged / not logged */
        bool exited, out_eof, err_eof, finished;
        int64_t exit_status;
        int term_signal;
        bool overflow, timed_out, killed_for_shutdown, spawn_failed, oom_killed;
        char spawn_error[256];
        unsigned timeout_sec;
        struct cgroup_limits limits;  /* the schedule's MemoryMax= etc. */
        unsigned attempt;
        pid_t pid;
        int phase;
        char *step_id;
        char *expected_post;
        uint64_t started_ms;       /* now_ms_monotonic() at the spawn */
};

static void start_advance(struct mandate *m, struct advance *a);
static void mandate_cancel_free(struct mandate *m);
static void submit_cancel(struct mandate *m, struct advance *a);
static void run_finished(struct exec_run *run);

static void release_slot(struct mandate *m)
{
        if (m->holds_slot) {
                m->holds_slot = false;
                m->d->running--;
        }
}

/* ---- archiving finished mandates, in batches ----
 *
 * A finished mandate's summary and archive are written (not synced) by its
 * last advance job; the WAL stays.  Finished mandates gather here until
 * ARCHIVE_BATCH of them wait, ARCHIVE_DELAY_MS passed, nothing runs any
 * more (no mandate holds a slot) or the daemon stops; then ONE syncfs makes every archive and summary of the batch
 * durable, and only then is each WAL unlinked (a job on the mandate's own
 * queue, which also points the mandate at its archive).  The unlinks need
 * no sync of their own: the next batch's syncfs (or the last one at
 * shutdown) covers them, and a WAL that comes back after a crash is
 * finalized, so the next start ends and archives it again. */

#define ARCHIVE_BATCH 64
#define ARCHIVE_DELAY_MS 1000

struct archive_batch {
        struct daemon *d;
        struct mandate **m;
        size_t n;
        int error;
};

struct archive_unlink {
        struct mandate *m;
        char *archive_path;
        int error;
};

static void check_idle(struct daemon *d);
static void archive_flush(struct daemon *d);

static bool archive_busy(const struct daemon *d)
{
        return d->arch_npending || d->arch_syncing || d->arch_unlinking || d->arch_unsynced;
}

static void on_archive_timer(uv_timer_t *t)
{
        archive_flush(t->data);
}

static void archive_enqueue(struct mandate *m, char *archive_path)
{
        struct daemon *d = m->d;
        if (!archive_path) {
                /* (out of memory in the job: the WAL stays; the next start ends it again) */
                log_error("mandate %s: no archive path; its WAL stays", m->id);
                return;
        }
        if (d->arch_npending == d->arch_cap) {
                size_t cap = d->arch_cap ? d->arch_cap * 2 : 16;
                struct mandate **pm = realloc(d->arch_pending, cap * sizeof(*pm));
                char **pp = realloc(d->arch_paths, cap * sizeof(*pp));
                if (pm)
                        d->arch_pending = pm;
                if (pp)
                        d->arch_paths = pp;
                if (!pm || !pp) {
                        log_error("mandate %s: out of memory; its WAL stays", m->id);
                        free(archive_path);
                        return;
                }
                d->arch_cap = cap;
        }
        m->busy++; /* alive until its WAL is gone */
        d->arch_pending[d->arch_npending] = m;
        d->arch_paths[d->arch_npending++] = archive_path;
        if (d->arch_npending >= ARCHIVE_BATCH || d->stopping) {
                archive_flush(d);
                return;
        }
        if (!d->arch_timer_init) {
                uv_timer_init(d->loop, &d->arch_timer);
                d->arch_timer.data = d;
                d->arch_timer_init = true;
        }
        if (!uv_is_active((uv_handle_t *)&d->arch_timer))
                uv_timer_start(&d->arch_timer, on_archive_timer, ARCHIVE_DELAY_MS, 0);
}

static void archive_unlink_work(void *arg)
{
        struct archive_unlink *u = arg;
        const struct kio *io = kio_posix();
        u->error = io->unlink(io->ctx, u->m->wal_path);
        if (u->error == -ENOENT)
                u->error = 0; /* gone already */
}

static void archive_unlink_done(void *arg)
{
        struct archive_unlink *u = arg;
        struct mandate *m = u->m;
        struct daemon *d = m->d;
        if (u->error) {
                mandate_set_status(m, MANDATE_WAL_IO_ERROR, "wal_io_error");
                log_event(LOG_ERR, MSGID_WAL_IO_ERROR, LOG_FIELDS({ "MANDATE_ID", m->id }),
                          "mandate %s paused (%s): removing %s after archiving: %s", m->id,
                          m->reason, m->wal_path, strerror(-u->error));
                free(u->archive_path);
        } else {
                log_event(LOG_INFO, NULL, LOG_FIELDS({ "MANDATE_ID", m->id }),
                          "mandate %s: WAL archived (%s)", m->id, u->archive_path);
                free(m->wal_path);
                m->wal_path = u->archive_path;
                m->archived = true;
                d->arch_unsynced = true;
                history_finished(m); /* retention counts archived mandates */
        }
        m->busy--;
        d->arch_unlinking--;
        free(u);
        daemon_update_status(d);
        if (d->arch_unlinking == 0)
                check_idle(d);
}

static void archive_sync_work(void *arg)
{
        struct archive_batch *b = arg;
        b->error = kio_syncfs(kio_posix(), b->d->cfg->state_directory);
}

static void archive_sync_done(void *arg)
{
        struct archive_batch *b = arg;
        struct daemon *d = b->d;
        d->arch_syncing = false;
        d->syncfs_calls++;
        if (b->error) {
                /* Nothing is unlinked: the WALs stay the truth; a later batch
                 * (or the next start) tries again. */
                log_event(LOG_ERR, MSGID_WAL_IO_ERROR, NULL, 0,
                          "syncfs of %s failed: %s; %zu finished WAL%s kept", d->cfg->state_directory,
                          strerror(-b->error), b->n, b->n == 1 ? "" : "s");
                for (size_t i = 0; i < b->n; i++)
                        b->m[i]->busy--;
        } else {
                d->arch_unsynced = false;
                for (size_t i = 0; i < b->n; i++) {
                        struct archive_unlink *u = calloc(1, sizeof(*u));
                        struct mandate *m = b->m[i];
                        if (u) {
                                u->m = m;
                                u->archive_path = d->arch_batch_paths[i];
                                d->arch_batch_paths[i] = NULL;
                        }
                        if (!u || serialq_submit(&m->q, archive_unlink_work, archive_unlink_done,
                                                 u) < 0) {
                                log_error("mandate %s: out of memory; its WAL stays", m->id);
                                if (u)
                                        free(u->archive_path);
                                free(u);
                                m->busy--;
                                continue;
                        }
                        d->arch_unlinking++;
                }
        }
        for (size_t i = 0; i < b->n; i++)
                free(d->arch_batch_paths[i]);
        free(d->arch_batch_paths);
        d->arch_batch_paths = NULL;
        free(b->m);
        free(b);
        if (d->arch_npending >= ARCHIVE_BATCH || (d->stopping && d->arch_npending))
                archive_flush(d);
        else if (d->arch_npending && d->arch_timer_init &&
                 !uv_is_active((uv_handle_t *)&d->arch_timer))
                uv_timer_start(&d->arch_timer, on_archive_timer, ARCHIVE_DELAY_MS, 0);
        check_idle(d);
}

/* Start a batch: one syncfs for every finished mandate waiting (or, with
 * none waiting, for the unlinks since the last one). */
static void archive_flush(struct daemon *d)
{
        if (d->arch_syncing)
                return; /* archive_sync_done starts the next batch */
        if (d->arch_timer_init)
                uv_timer_stop(&d->arch_timer);
        if (!d->arch_npending && !d->arch_unsynced)
                return;
        struct archive_batch *b = calloc(1, sizeof(*b));
        if (!b) {
                log_error("out of memory: archiving later");
                return;
        }
        b->d = d;
        b->m = d->arch_pending;
        b->n = d->arch_npending;
        d->arch_batch_paths = d->arch_paths;
        d->arch_pending = NULL;
        d->arch_paths = NULL;
        d->arch_npending = d->arch_cap = 0;
        if (serialq_submit(&d->admin_q, archive_sync_work, archive_sync_done, b) < 0) {
                log_error("out of memory: archiving later");
                d->arch_pending = b->m;
                d->arch_paths = d->arch_batch_paths;
                d->arch_npending = d->arch_cap = b->n;
                d->arch_batch_paths = NULL;
                free(b);
                return;
        }
        d->arch_syncing = true;
}

static void check_idle(struct daemon *d)
{
        if (d->stopping && d->running == 0 && d->executor_idle) {
                if (archive_busy(d)) {
                        if (!d->arch_syncing && !d->arch_unlinking)
                                archive_flush(d);
                        return;
                }
                void (*cb)(struct daemon *) = d->executor_idle;
                d->executor_idle = NULL;
                cb(d);
        }
}

static void run_free_spawn_args(struct exec_run *run)
{
        config_strv_free(run->argv);
        run->argv = NULL;
        config_strv_free(run->env);
        run->env = NULL;
        free(run->cwd);
        run->cwd = NULL;
}

static void groups_add(struct exec_run *run);
static void groups_remove(struct exec_run *run);

static void on_run_handle_closed(uv_handle_t *h)
{
        struct exec_run *run = h->data;
        if (--run->open_handles > 0)
                return;
        run_free_spawn_args(run);
        free(run->cmdline);
        kbuf_free(&run->out_buf);
        kbuf_free(&run->err_line);
        free(run->stdin_doc);
        free(run->step_id);
        free(run->expected_post);
        free(run);
}

static void run_close_handles(struct exec_run *run)
{
        uv_handle_t *hs[] = { (uv_handle_t *)&run->in, (uv_handle_t *)&run->out,
                              (uv_handle_t *)&run->err, (uv_handle_t *)&run->timer };
        for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
                if (hs[i]->data == run && !uv_is_closing(hs[i]))
                        uv_close(hs[i], on_run_handle_closed);
}

static void run_maybe_finish(struct exec_run *run)
{
        if (run->finished || !run->exited || !run->out_eof || !run->err_eof)
                return;
        run->finished = true;
        uv_timer_stop(&run->timer);
        run_finished(run);
}

static void kill_group(struct exec_run *run, int sig)
{
        if (run->started && !run->exited)
                runner_kill(&run->job, sig);
}

static void on_kill_timer(uv_timer_t *t)
{
        struct exec_run *run = t->data;
        kill_group(run, SIGKILL);
}

static void on_timeout(uv_timer_t *t)
{
        struct exec_run *run = t->data;
        run->timed_out = true;
        kill_group(run, SIGTERM);
        uv_timer_start(&run->timer, on_kill_timer, KILL_GRACE_MS, 0);
}

/* The runner reaped the handler (and killed what was left of its group). */
static void on_job_exited(struct runner_job *job, int exit_status, int term_signal)
{
        struct exec_run *run = job->data;
        groups_remove(run);
        run->exited = true;
        run->exit_status = exit_status;
        run->term_signal = term_signal;
        run->oom_killed = job->oom_killed;
        run_maybe_finish(run);
}

static void on_alloc_out(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
        (void)suggested;
        struct exec_run *run = h->data;
        struct kbuf *b = (uv_pipe_t *)h == &run->out ? &run->out_buf : &run->err_line;
        if (kbuf_reserve(b, 65536) < 0) {
                *buf = uv_buf_init(NULL, 0);
                return;
        }
        *buf = uv_buf_init(b->data + b->len, 65536);
}

static void on_read_out(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
        (void)buf;
        struct exec_run *run = s->data;
        if (n < 0) {
                run->out_eof = true;
                uv_read_stop(s);
                run_maybe_finish(run);
                return;
        }
        run->out_buf.len += (size_t)n;
        run->out_buf.data[run->out_buf.len] = '\0';
        if (run->out_buf.len > MAX_OUTPUT && !run->overflow) {
                run->overflow = true;
                kill_group(run, SIGKILL);
        }
        if (run->overflow)
                run->out_buf.len = MAX_OUTPUT; /* keep memory bounded */
}

static void tail_add(struct exec_run *run, const char *p, size_t n)
{
        if (n >= STDERR_TAIL) {
                memcpy(run->err_tail, p + n - STDERR_TAIL, STDERR_TAIL);
                run->err_tail_len = STDERR_TAIL;
                return;
        }
        if (run->err_tail_len + n > STDERR_TAIL) {
                size_t drop = run->err_tail_len + n - STDERR_TAIL;
                memmove(run->err_tail, run->err_tail + drop, run->err_tail_len - drop);
                run->err_tail_len -= drop;
        }
        memcpy(run->err_tail + run->err_tail_len, p, n);
        run->err_tail_len += n;
}

static void log_stderr_line(struct exec_run *run, const char *p, size_t n, const char *mark)
{
        if (n && p[n - 1] == '\r')
                n--;
        char *line = strndup(p, n);
        if (!line)
                return;
        log_event(LOG_INFO, NULL,
                  LOG_FIELDS({ "MANDATE_ID", run->m->id }, { "STEP_ID", run->step_id }),
                  "%s %s: %s%s", run->m->id, run->step_id, line, mark);
        free(line);
}

/* A piece of at most STDERR_LINE_MAX bytes of b that does not end inside a
 * UTF-8 character (unless it is not UTF-8 at all). */
static size_t piece_len(const char *b, size_t n)
{
        if (n <= STDERR_LINE_MAX)
                return n;
        size_t k = STDERR_LINE_MAX;
        for (int back = 0; back < 4 && k > 0; back++, k--)
                if (((unsigned char)b[k] & 0xc0) != 0x80)
                        return k;
        return STDERR_LINE_MAX;
}

/* stderr goes to the log line by line: the first STDERR_LOG_MAX bytes of a
 * step, in lines of at most STDERR_LINE_MAX bytes (a longer line is logged
 * in pieces, each but the last ending in "…"); what comes after is counted
 * and reported in one line at the end.  The tail for the error message sees
 * everything. */
static void stderr_consume(struct exec_run *run, size_t n)
{
        struct kbuf *b = &run->err_line;
        tail_add(run, b->data + b->len, n);
        size_t room = STDERR_LOG_MAX - run->err_accepted;
        size_t take = n < room ? n : room;
        run->err_accepted += take;
        run->err_dropped += n - take;
        b->len += take;
        size_t start = 0;
        for (;;) {
                char *nl = memchr(b->data + start, '\n', b->len - start);
                size_t len = nl ? (size_t)(nl - (b->data + start)) : b->len - start;
                if (len > STDERR_LINE_MAX) {
                        size_t k = piece_len(b->data + start, len);
                        log_stderr_line(run, b->data + start, k, "\u2026");
                        start += k;
                        continue;
                }
                if (!nl)
                        break;
                log_stderr_line(run, b->data + start, len, "");
                start += len + 1;
        }
        /* Nothing more will be logged: do not keep a partial line waiting. */
        if (run->err_accepted == STDERR_LOG_MAX && b->len > start) {
                log_stderr_line(run, b->data + start, b->len - start, "");
                start = b->len;
        }
        memmove(b->data, b->data + start, b->len - start);
        b->len -= start;
}

static void on_read_err(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
        (void)buf;
        struct exec_run *run = s->data;
        struct kbuf *b = &run->err_line;
        if (n < 0) {
                if (b->len)
                        log_stderr_line(run, b->data, b->len, "");
                b->len = 0;
                if (run->err_dropped)
                        log_event(LOG_WARNING, NULL,
                                  LOG_FIELDS({ "MANDATE_ID", run->m->id },
                                             { "STEP_ID", run->step_id }),
                                  "%s %s: \u2026 %zu bytes of stderr dropped (only the first %d "
                                  "bytes of a step are logged)",
                                  run->m->id, run->step_id, run->err_dropped, STDERR_LOG_MAX);
                run->err_eof = true;
                uv_read_stop(s);
                run_maybe_finish(run);
                return;
        }
        stderr_consume(run, (size_t)n);
}

static void on_stdin_written(uv_write_t *req, int status)
{
        (void)status; /* a handler that does not read stdin is fine */
        struct exec_run *run = req->data;
        if (!uv_is_closing((uv_handle_t *)&run->in))
                uv_close((uv_handle_t *)&run->in, on_run_handle_closed);
}

/* What every handler's environment has besides the step's own variables:
 * the daemon user's identity and where kairosctl is.  Found once at start
 * (getpwuid may ask NSS, which can block). */
static struct {
        char *home, *user;   /* of the daemon's user (getpwuid), NULL if unknown */
        char *kairosctl;     /* absolute path of kairosctl, NULL if not found */
        char *path;          /* PATH: kairosctl's directory, then kairosd's PATH */
} henv;

static bool is_executable_file(const char *path)
{
        struct stat st;
        return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* The kairosctl that belongs to this kairosd: next to it (a build tree
 * with both in one directory), ../ctl (the build tree: src/daemon and
 * src/ctl), ../bin (installed: /usr/sbin/kairosd and /usr/bin/kairosctl),
 * then the first one on PATH.  An absolute path without symlinks, or NULL. */
static char *find_kairosctl(void)
{
        char exe[PATH_MAX], cand[PATH_MAX + 32];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n > 0) {
                exe[n] = '\0';
                char *slash = strrchr(exe, '/');
                if (slash)
                        *slash = '\0';
                static const char *const rel[] = { "kairosctl", "../ctl/kairosctl",
                                                   "../bin/kairosctl" };
                for (size_t i = 0; slash && i < sizeof rel / sizeof rel[0]; i++) {
                        snprintf(cand, sizeof cand, "%s/%s", exe, rel[i]);
                        if (is_executable_file(cand))
                                return realpath(cand, NULL);
                }
        }
        const char *path = getenv("PATH");
        while (path && *path) {
                size_t len = strcspn(path, ":");
                if (len > 0 && len < PATH_MAX) {
                        snprintf(cand, sizeof cand, "%.*s/kairosctl", (int)len, path);
                        if (cand[0] == '/' && is_executable_file(cand))
                                return realpath(cand, NULL);
                }
                path += len + (path[len] == ':');
        }
        return NULL;
}

void executor_handler_env(const char **ret_path, const char **ret_home, const char **ret_user,
                          const char **ret_kairosctl)
{
        *ret_path = henv.path ? henv.path : "/usr/local/bin:/usr/bin:/bin";
        *ret_home = henv.home;
        *ret_user = henv.user;
        *ret_kairosctl = henv.kairosctl;
}

void executor_free(struct daemon *d)
{
        runner_free(d->runner);
        d->runner = NULL;
        strmap_free(d->handler_groups);
        d->handler_groups = NULL;
        cgroup_ctl_free(d->cgroup);
        d->cgroup = NULL;
}

void executor_check_limits(struct daemon *d)
{
        unsigned have = cgroup_ctl_controllers(d->cgroup);
        for (size_t i = 0; i < d->cfg->nschedules; i++) {
                const struct config_schedule *s = &d->cfg->schedules[i];
                bool mem = s->memory_max && !(have & CGROUP_MEMORY);
                bool pids = s->tasks_max && !(have & CGROUP_PIDS);
                bool cpu = s->cpu_quota_pct && !(have & CGROUP_CPU);
                if (d->cgroup && (mem || pids || cpu))
                        log_warning("schedule %s: %s%s%snot enforced: no such controller in "
                                    "%s (missing: %s)", s->name, mem ? "MemoryMax= " : "",
                                    pids ? "TasksMax= " : "", cpu ? "CPUQuota= " : "",
                                    cgroup_ctl_where(d->cgroup), cgroup_ctl_missing(d->cgroup));
                else if (!d->cgroup && config_schedule_has_limits(s))
                        log_warning("schedule %s: %s%s%snot enforced: no delegated cgroup (%s)",
                                    s->name, s->memory_max ? "MemoryMax= " : "",
                                    s->tasks_max ? "TasksMax= " : "",
                                    s->cpu_quota_pct ? "CPUQuota= " : "", d->cgroup_why);
        }
}

/* Running handlers by process group ("PGID" -> struct exec_run *), for
 * attributing tool calls to steps. */
static void group_key(pid_t pgid, char key[24])
{
        snprintf(key, 24, "%d", (int)pgid);
}

static void groups_add(struct exec_run *run)
{
        char key[24];
        group_key(run->pid, key);
        if (strmap_put(run->m->d->handler_groups, key, run) < 0)
                log_warning("%s %s: out of memory: its tool calls are not attributed to it",
                            run->m->id, run->step_id);
}

static void groups_remove(struct exec_run *run)
{
        char key[24];
        if (!run->pid)
                return;
        group_key(run->pid, key);
        if (strmap_get(run->m->d->handler_groups, key) == run)
                strmap_remove(run->m->d->handler_groups, key);
}

int executor_step_of(struct daemon *d, pid_t pid, struct idem_step_owner *ret)
{
        char key[24];
        pid_t pgid = getpgid(pid);
        if (pgid <= 0)
                return -ESRCH;
        group_key(pgid, key);
        struct exec_run *run = strmap_get(d->handler_groups, key);
        if (!run || run->exited)
                return -ESRCH;
        *ret = (struct idem_step_owner){ .attempt = run->attempt };
        snprintf(ret->mandate, sizeof ret->mandate, "%s", run->m->id);
        snprintf(ret->step, sizeof ret->step, "%s", run->step_id);
        return idem_owner_check(ret) < 0 ? -ESRCH : 0;
}

int executor_init(struct daemon *d)
{
        if (!(d->handler_groups = strmap_new()))
                return -ENOMEM;
        /* before the runner: the keeper is forked into kairosd's leaf */
        int r = cgroup_ctl_new(&d->cgroup, d->cgroup_why, sizeof d->cgroup_why);
        if (r < 0)
                log_warning("handler cgroups: %s; handlers run without", d->cgroup_why);
        else if (d->cgroup)
                log_info("handler cgroups below %s%s%s", cgroup_ctl_where(d->cgroup),
                         *cgroup_ctl_missing(d->cgroup) ? ", controllers not available: " : "",
                         cgroup_ctl_missing(d->cgroup));
        else
                log_info("no handler cgroups: %s", d->cgroup_why);
        executor_check_limits(d);
        r = runner_new(d->loop, &d->runner);
        if (r < 0)
                return r;
        runner_set_cgroup(d->runner, d->cgroup);
        struct passwd *pw = getpwuid(getuid());
        if (pw) {
                henv.home = strdup(pw->pw_dir);
                henv.user = strdup(pw->pw_name);
        } else {
                log_warning("uid %u has no passwd entry: handlers get no HOME, USER, LOGNAME",
                            (unsigned)getuid());
        }
        const char *path = getenv("PATH");
        if (!path || !*path)
                path = "/usr/local/bin:/usr/bin:/bin";
        henv.kairosctl = find_kairosctl();
        char *dir = henv.kairosctl ? strdup(henv.kairosctl) : NULL;
        char *slash = dir ? strrchr(dir, '/') : NULL;
        if (slash)
                *(slash == dir ? slash + 1 : slash) = '\0';
        size_t dlen = dir ? strlen(dir) : 0;
        if (dir && !(strncmp(path, dir, dlen) == 0 && (path[dlen] == ':' || !path[dlen]))) {
                if (asprintf(&henv.path, "%s:%s", dir, path) < 0)
                        henv.path = NULL;
        }
        if (!henv.path)
                henv.path = strdup(path);
        free(dir);
        if (henv.kairosctl)
                log_debug("handlers get KAIROSCTL=%s", henv.kairosctl);
        else
                log_warning("no kairosctl next to kairosd or on PATH: handlers get no KAIROSCTL");
        return 0;
}

static char *env_entry(const char *k, const char *v)
{
        char *e = NULL;
        if (asprintf(&e, "%s=%s", k, v ? v : "") < 0)
                return NULL;
        return e;
}

/* Starting a handler can fail for want of a resource that comes back:
 * file descriptors (EMFILE, ENFILE: e.g. many control connections), process
 * slots or memory for the child (EAGAIN, ENOMEM).  That is not the step's
 * fault: the step is started again after a pause (doubling from
 * SPAWN_RETRY_MIN_MS to SPAWN_RETRY_MAX_MS), logged, with nothing more in
 * the WAL — its executing record is already durable and stays the only one,
 * so KAIROS_ATTEMPT does not grow, and a crash meanwhile is seen at restart
 * as what it might be (interrupted during execution: a human decides). */
static bool spawn_error_is_transient(int err)
{
        return err == -EMFILE || err == -ENFILE || err == -EAGAIN || err == -ENOMEM;
}

static void run_start(struct exec_run *run);

static void cancel_stop_handler(struct exec_run *run)
{
        kill_group(run, SIGTERM);
        uv_timer_stop(&run->timer);
        uv_timer_start(&run->timer, on_kill_timer, KILL_GRACE_MS, 0);
}

static void on_spawn_retry(uv_timer_t *t)
{
        struct exec_run *run = t->data;
        run->waiting_retry = false;
        run_start(run);
}

static void spawn_retry_later(struct exec_run *run, int err)
{
        struct mandate *m = run->m;
        run->retry_ms = run->retry_ms ? run->retry_ms * 2 : SPAWN_RETRY_MIN_MS;
        if (run->retry_ms > SPAWN_RETRY_MAX_MS)
                run->retry_ms = SPAWN_RETRY_MAX_MS;
        run->tries++;
        run->waiting_retry = true;
        log_event(LOG_WARNING, NULL,
                  LOG_FIELDS({ "MANDATE_ID", m->id }, { "STEP_ID", run->step_id }),
                  "%s %s: cannot start %s now: %s; trying again in %u ms (try %u; the handler "
                  "did not run)",
                  m->id, run->step_id, run->cmdline, strerror(-err), run->retry_ms, run->tries);
        uv_timer_start(&run->timer, on_spawn_retry, run->retry_ms, 0);
}

/* Stopping while a start waits for resources: the step was never started;
 * its executing record stays open and the next start of kairosd treats it
 * as interrupted. */
static void spawn_retry_give_up(struct exec_run *run)
{
        struct mandate *m = run->m;
        log_warning("%s %s: not started (no resources to start it) before the stop", m->id,
                    run->step_id);
        uv_timer_stop(&run->timer);
        m->run = NULL;
        run->finished = true;
        run_close_handles(run);
        if (m->status == MANDATE_RUNNING)
                mandate_set_status(m, MANDATE_RUNNABLE, NULL);
        release_slot(m);
        check_idle(m->d);
}

/* The step cannot start at all: it fails (spawn_error), or — a program that
 * cannot be executed — it fails as the shell's "exit status 127" would. */
static void run_start_failed(struct exec_run *run, int err, const char *what)
{
        if (what && strcmp(what, "execute") == 0) {
                char msg[512];
                snprintf(msg, sizeof msg, "kairosd: cannot execute '%s': %s",
                         run->argv ? run->argv[0] : "?", strerror(-err));
                log_stderr_line(run, msg, strlen(msg), "");
                tail_add(run, msg, strlen(msg));
                run->exit_status = 127;
        } else {
                snprintf(run->spawn_error, sizeof run->spawn_error, "cannot start %s: %s%s%s",
                         run->cmdline, what ? what : "", what ? ": " : "", strerror(-err));
                run->spawn_failed = true;
        }
        run->exited = run->out_eof = run->err_eof = run->finished = true;
        run_finished(run);
}

static void on_job_started(struct runner_job *job)
{
        struct exec_run *run = job->data;
        struct mandate *m = run->m;
        run->starting = false;
        if (job->err && m->cancel) {
                /* cancelled before it could start: the cancel records it */
                m->run = NULL;
                run->finished = true;
                run_close_handles(run);
                submit_cancel(m, NULL);
                return;
        }
        if (job->err && spawn_error_is_transient(job->err) && !m->d->stopping) {
                spawn_retry_later(run, job->err);
                return;
        }
        if (run->tries)
                log_event(LOG_INFO, NULL,
                          LOG_FIELDS({ "MANDATE_ID", m->id }, { "STEP_ID", run->step_id }),
                          "%s %s: %s after %u tr%s", m->id, run->step_id,
                          job->err ? "cannot start it either" : "started", run->tries,
                          run->tries == 1 ? "y" : "ies");
        if (job->err) {
                run_start_failed(run, job->err, job->err_what);
                return;
        }
        run->started = true;
        run->pid = job->pid;
        run->started_ms = now_ms_monotonic();
        groups_add(run);
        uv_pipe_open(&run->in, job->fd_in);
        uv_pipe_open(&run->out, job->fd_out);
        uv_pipe_open(&run->err, job->fd_err);
        run_free_spawn_args(run);
        uv_read_start((uv_stream_t *)&run->out, on_alloc_out, on_read_out);
        uv_read_start((uv_stream_t *)&run->err, on_alloc_out, on_read_err);
        uv_buf_t buf = uv_buf_init(run->stdin_doc, (unsigned)run->stdin_len);
        run->stdin_req.data = run;
        if (uv_write(&run->stdin_req, (uv_stream_t *)&run->in, &buf, 1, on_stdin_written) < 0)
                uv_close((uv_handle_t *)&run->in, on_run_handle_closed);
        uv_timer_start(&run->timer, on_timeout, (uint64_t)run->timeout_sec * 1000, 0);
        log_event(LOG_INFO, NULL,
                  LOG_FIELDS({ "MANDATE_ID", m->id }, { "STEP_ID", run->step_id }),
                  "%s %s: started %s (pid %d, attempt %u)", m->id, run->step_id, run->cmdline,
                  (int)run->pid, run->attempt);
        if (run->killed_for_shutdown)
                kill_group(run, SIGKILL); /* started after GracefulTimeoutSec= ran out */
        else if (m->cancel)
                cancel_stop_handler(run);
}

static void run_start(struct exec_run *run)
{
        run->job = (struct runner_job){ .argv = run->argv, .envp = run->env, .cwd = run->cwd,
                                        .started = on_job_started, .exited = on_job_exited,
                                        .data = run, .cg_hint = run->step_id,
                                        .limits = run->limits };
        int r = runner_spawn(run->m->d->runner, &run->job);
        if (r == 0) {
                run->starting = true;
                return;
        }
        if (spawn_error_is_transient(r) && !run->m->d->stopping) {
                spawn_retry_later(run, r);
                return;
        }
        run_start_failed(run, r, "pipe");
}

static void spawn_handler(struct mandate *m, struct advance *a)
{
        struct daemon *d = m->d;
        const struct config_schedule *sc = NULL;
        for (size_t i = 0; i < d->cfg->nschedules; i++)
                if (strcmp(d->cfg->schedules[i].name, m->schedule) == 0)
                        sc = &d->cfg->schedules[i];
        struct exec_run *run = calloc(1, sizeof(*run));
        if (!run) {
                log_error("out of memory starting %s %s", m->id, a->step_id);
                release_slot(m);
                return;
        }
        run->m = m;
        run->phase = a->phase;
        run->attempt = a->attempt;
        run->step_id = strdup(a->step_id);
        run->expected_post = a->expected_post ? strdup(a->expected_post) : NULL;
        m->run = run;
        free(m->step_id);
        m->step_id = strdup(a->step_id);
        const char *cmdline = sc ? sc->exec[a->phase] : NULL;
        if (!cmdline || !*cmdline) {
                /* No command: the phase completes at once with a null result. */
                run->exited = run->out_eof = run->err_eof = true;
                run->finished = true;
                run_finished(run);
                free(run->step_id);
                free(run->expected_post);
                free(run);
                return;
        }
        char **argv = NULL;
        size_t argc = 0;
        int r = config_split_command(cmdline, &argv, &argc);
        if (r < 0 || argc == 0) {
                snprintf(run->spawn_error, sizeof run->spawn_error, "cannot split %s=: %s",
                         config_phase_key(a->phase), strerror(r < 0 ? -r : EINVAL));
                run->spawn_failed = true;
                run->exited = run->out_eof = run->err_eof = run->finished = true;
                config_strv_free(argv);
                run_finished(run);
                free(run->step_id);
                free(run->expected_post);
                free(run);
                return;
        }
        run->argv = argv;
        /* environment */
        char attempt[16], cycle[24];
        snprintf(attempt, sizeof attempt, "%u", a->attempt);
        snprintf(cycle, sizeof cycle, "%lld", a->cycle);
        struct {
                const char *k, *v;
        } kv[] = {
                { "PATH", henv.path ? henv.path : "/usr/local/bin:/usr/bin:/bin" },
                { "LANG", getenv("LANG") },
                { "HOME", henv.home },
                { "USER", henv.user },
                { "LOGNAME", henv.user },
                { "KAIROSCTL", henv.kairosctl },
                { "KAIROS_MANDATE_ID", m->id },
                { "KAIROS_PLAN_ID", a->plan_id },
                { "KAIROS_STEP_ID", a->step_id },
                { "KAIROS_PHASE", planner_phase_name((enum planner_phase)a->phase) },
                { "KAIROS_CYCLE", cycle },
                { "KAIROS_IDEM_KEY", a->idem_key },
                { "KAIROS_SCHEDULE", m->schedule },
                { "KAIROS_FIRED_AT", m->fired_at },
                { "KAIROS_GOAL", m->goal ? m->goal : m->schedule },
                { "KAIROS_ATTEMPT", attempt },
                { "KAIROS_CONTROL_SOCKET", d->cfg->control_socket },
        };
        size_t nkv = sizeof kv / sizeof kv[0];
        char **env = calloc(nkv + (sc ? sc->nenvironment : 0) + 1, sizeof(char *));
        size_t ne = 0;
        for (size_t i = 0; env && i < nkv; i++)
                if (kv[i].v && (env[ne] = env_entry(kv[i].k, kv[i].v)))
                        ne++;
        for (size_t i = 0; env && sc && i < sc->nenvironment; i++)
                if ((env[ne] = strdup(sc->environment[i])))
                        ne++;
        run->env = env;
        const char *cwd = sc && sc->working_directory ? sc->working_directory
                                                      : d->cfg->state_directory;
        run->cwd = strdup(cwd);
        run->cmdline = strdup(cmdline);
        run->stdin_doc = strdup(a->stdin_doc.data ? a->stdin_doc.data : "{}\n");
        run->stdin_len = run->stdin_doc ? strlen(run->stdin_doc) : 0;
        run->timeout_sec = sc ? (unsigned)sc->timeout_sec : 300;
        if (sc)
                run->limits = (struct cgroup_limits){ sc->memory_max, sc->tasks_max,
                                                      sc->cpu_quota_pct };

        uv_pipe_init(d->loop, &run->in, 0);
        uv_pipe_init(d->loop, &run->out, 0);
        uv_pipe_init(d->loop, &run->err, 0);
        uv_timer_init(d->loop, &run->timer);
        run->in.data = run->out.data = run->err.data = run->timer.data = run;
        run->open_handles = 4;
        if (!env || !run->cwd || !run->cmdline || !run->stdin_doc) {
                if (!run->cmdline)
                        run->cmdline = strdup("?");
                run_start_failed(run, -ENOMEM, NULL);
                return;
        }
        run_start(run);
}

/* The end of the handler's stderr, trailing blank lines and spaces trimmed
 * (NUL bytes shown as '?' so they do not end the text early). */
static void stderr_tail(const struct exec_run *run, char out[STDERR_TAIL + 1])
{
        size_t n = run->err_tail_len;
        while (n && (run->err_tail[n - 1] == '\n' || run->err_tail[n - 1] == '\r' ||
                     run->err_tail[n - 1] == ' '))
                n--;
        for (size_t i = 0; i < n; i++)
                out[i] = run->err_tail[i] ? run->err_tail[i] : '?';
        out[n] = '\0';
}

/* Keep the last `max` UTF-8 characters of s, starting at a character. */
static void keep_last_chars(char *s, size_t max)
{
        size_t len = strlen(s), start = len, n = 0;
        for (size_t i = len; i-- > 0;) {
                if (((unsigned char)s[i] & 0xc0) == 0x80)
                        continue;
                if (n == max)
                        break;
                n++;
                start = i;
        }
        memmove(s, s + start, len - start + 1);
}

/* msg (ASCII) + ": " + the end of tail, WAL_ERROR_MSG_MAX_CHARS characters
 * at most in all: the WAL cuts a longer error_msg at its end, and the end of
 * stderr is where the reason is. */
static void append_tail(char *msg, size_t size, char *tail)
{
        size_t used = strlen(msg);
        if (!*tail || used + 2 >= WAL_ERROR_MSG_MAX_CHARS)
                return;
        keep_last_chars(tail, WAL_ERROR_MSG_MAX_CHARS - used - 2);
        snprintf(msg + used, size - used, ": %s", tail);
}

/* Is the handler's output JSON that the completed record can hold?  It is
 * read with the exact reader of canonical JSON (kjson: numbers keep their
 * digits, integers of any size and numbers beyond double range included).
 * The record nests the result one level deeper, and a record nested deeper
 * than KJSON_MAX_DEPTH could not be read back (the WAL would look corrupt):
 * such output is kept as text, like any other non-JSON output.  Returns 0,
 * or -EINVAL with why it is not (err), or -ENOMEM. */
static int result_json_check(const char *out, size_t n, struct kjson_error *err)
{
        struct kbuf wrapped = KBUF_INIT;
        struct kjson_arena *ar = kjson_arena_new();
        struct kjson *v;
        int r = -ENOMEM;
        if (ar && kbuf_putc(&wrapped, '[') == 0 && kbuf_append(&wrapped, out, n) == 0 &&
            kbuf_putc(&wrapped, ']') == 0)
                r = kjson_parse(ar, wrapped.data, wrapped.len, &v, err);
        if (r == -EINVAL && err->offset > 0)
                err->offset--; /* an offset in the output, not in the wrapper */
        kjson_arena_free(ar);
        kbuf_free(&wrapped);
        return r;
}

/* The handler is over: turn what happened into the records of the step. */
static void run_finished(struct exec_run *run)
{
        struct mandate *m = run->m;
        struct daemon *d = m->d;
        m->run = NULL;
        struct advance *a = advance_new(m);
        if (!a) {
                log_error("out of memory finishing %s %s", m->id, run->step_id);
                release_slot(m);
                return;
        }
        /* While stopping, or paused by an operator, a finished step is
         * recorded but nothing new starts. */
        a->decide = !d->stopping && m->status != MANDATE_PAUSED;
        struct wal_record *r = &a->pre[a->npre++];
        const char *step = own(a, run->step_id);
        char tail[STDERR_TAIL + 1];
        stderr_tail(run, tail);
        char msg[STDERR_TAIL + 256];
        if (run->killed_for_shutdown) {
                *r = (struct wal_record){ .op = WAL_OP_NEEDS_REVIEW, .step_id = step,
                                          .reason = "killed_at_shutdown",
                                          .evidence_json = "{\"reason\":\"killed_at_shutdown\"}" };
        } else if (run->spawn_failed) {
                *r = (struct wal_record){ .op = WAL_OP_FAILED, .step_id = step,
                                          .error_class = "spawn_error",
                                          .error_msg = own(a, run->spawn_error) };
        } else if (run->overflow) {
                *r = (struct wal_record){ .op = WAL_OP_FAILED, .step_id = step,
                                          .error_class = "output_too_large",
                                          .error_msg = "the handler wrote more than 1 MiB to stdout" };
        } else if (run->timed_out) {
                snprintf(msg, sizeof msg, "no exit within TimeoutSec=%u", run->timeout_sec);
                append_tail(msg, sizeof msg, tail);
                *r = (struct wal_record){ .op = WAL_OP_FAILED, .step_id = step,
                                          .error_class = "timeout", .error_msg = own(a, msg) };
        } else if (run->oom_killed && (run->term_signal || run->exit_status != 0)) {
                snprintf(msg, sizeof msg, "killed by the OOM killer: over MemoryMax= (%s)",
                         run->term_signal ? strsignal(run->term_signal) : "exit status");
                append_tail(msg, sizeof msg, tail);
                *r = (struct wal_record){ .op = WAL_OP_FAILED, .step_id = step,
                                          .error_class = "oom", .error_msg = own(a, msg) };
        } else if (run->term_signal) {
                snprintf(msg, sizeof msg, "killed by signal %d (%s)", run->term_signal,
                         strsignal(run->term_signal));
                append_tail(msg, sizeof msg, tail);
                *r = (struct wal_record){ .op = WAL_OP_FAILED, .step_id = step,
                                          .error_class = "signal", .error_msg = own(a, msg) };
        } else if (run->exit_status != 0) {
                snprintf(msg, sizeof msg, "exit status %lld", (long long)run->exit_status);
                append_tail(msg, sizeof msg, tail);
                *r = (struct wal_record){ .op = WAL_OP_FAILED, .step_id = step,
                                          .error_class = "exit_status", .error_msg = own(a, msg) };
        } else {
                /* Completed: stdout is the result (JSON, or text kept as a string). */
                struct kbuf res = KBUF_INIT;
                size_t n = run->out_buf.len;
                const char *out = run->out_buf.data ? run->out_buf.data : "";
                while (n && (out[n - 1] == '\n' || out[n - 1] == '\r' || out[n - 1] == ' '))
                        n--;
                char hash[CANON_HASH_STRLEN];
                if (n == 0) {
                        kbuf_puts(&res, "null");
                } else {
                        struct kjson_error jerr = { 0 };
                        int jr = result_json_check(out, n, &jerr);
                        if (jr == 0) {
                                kbuf_append(&res, out, n);
                        } else {
                                kbuf_json_string_lossy(&res, out, n, 0);
                                if (jr == -EINVAL)
                                        log_event(LOG_INFO, NULL,
                                                  LOG_FIELDS({ "MANDATE_ID", m->id },
                                                             { "STEP_ID", run->step_id }),
                                                  "%s %s: the output is not JSON (%s at byte "
                                                  "%zu): kept as text",
                                                  m->id, run->step_id,
                                                  kjson_error_string(jerr.code), jerr.offset);
                        }
                }
                if (canon_hash_json(res.data, res.len, hash, NULL) < 0)
                        canon_hash_bytes(res.data, res.len, hash);
                *r = (struct wal_record){ .op = WAL_OP_COMPLETED, .step_id = step,
                                          .post_hash = own(a, run->expected_post ? run->expected_post : ""),
                                          .result_hash = own(a, hash),
                                          .result_json = own(a, res.data) };
                kbuf_free(&res);
        }
        if (m->cancel && r->op != WAL_OP_COMPLETED && !run->killed_for_shutdown) {
                /* stopped by the cancel: an interrupted step, recorded as such */
                char how[64];
                if (run->term_signal)
                        snprintf(how, sizeof how, "signal %d", run->term_signal);
                else
                        snprintf(how, sizeof how, "exit status %lld",
                                 (long long)run->exit_status);
                snprintf(msg, sizeof msg, "cancelled by uid %u while it ran: %s (the handler "
                         "was stopped: %s)", (unsigned)m->cancel->uid, m->cancel->reason, how);
                *r = (struct wal_record){ .op = WAL_OP_FAILED, .step_id = step,
                                          .error_class = "cancelled", .error_msg = own(a, msg) };
        }
        metrics_step(d->metrics, run->phase, r->op, run->pid ? run->started_ms : 0);
        if (r->op == WAL_OP_COMPLETED && !r->result_json) {
                a->npre = 0;
                log_error("out of memory recording %s %s", m->id, run->step_id);
        }
        log_event(r->op == WAL_OP_COMPLETED ? LOG_INFO : LOG_WARNING, NULL,
                  LOG_FIELDS({ "MANDATE_ID", m->id }, { "STEP_ID", run->step_id }),
                  "%s %s: %s%s%s", m->id, run->step_id,
                  r->op == WAL_OP_COMPLETED ? "completed"
                  : r->op == WAL_OP_FAILED  ? "failed"
                                            : "needs review",
                  r->error_msg ? ": " : "", r->error_msg ? r->error_msg : "");
        if (run->in.data == run)
                run_close_handles(run);
        if (m->cancel && !run->killed_for_shutdown) {
                a->interrupted = strdup(run->step_id);
                submit_cancel(m, a);
                return;
        }
        if (m->cancel) {
                /* the stop came first: the step is recorded for review */
                op_reply_error(&m->cancel->reply, "stopping",
                               "kairosd is stopping: the cancel of %s was not "
                               "completed (its step is recorded for review)",
                               m->id);
                mandate_cancel_free(m);
        }
        start_advance(m, a);
}

/* ------------------------------------------------------------------------ */
/* Mandate flow on the loop                                                  */
/* ------------------------------------------------------------------------ */

static void finish_fire_reply(struct advance *a, bool fired)
{
        if (!op_reply_wanted(&a->reply))
                return;
        if (a->error) {
                op_reply_error(&a->reply, "wal_io_error", "%s", a->errmsg);
        } else {
                json_t *res = json_pack("{s:s, s:s, s:s, s:b, s:s}", "mandate", a->m->id,
                                        "schedule", a->m->schedule, "fired_at",
                                        a->m->fired_at, "fired", fired, "status",
                                        mandate_status_name(a->m->status));
                if (res && a->m->retry_of) {
                        json_object_set_new(res, "retry_of", json_string(a->m->retry_of));
                        json_object_set_new(res, "retry", json_integer(a->m->retry));
                }
                op_reply_ok(&a->reply, res);
        }
}

static void advance_done(void *arg)
{
        struct advance *a = arg;
        struct mandate *m = a->m;
        struct daemon *d = m->d;
        m->flushes += a->flushes;
        d->flushes_total += a->flushes;
        m->busy--;
        if (a->plan_id) {
                free(m->plan_id);
                m->plan_id = strdup(a->plan_id);
                m->cycle = a->cycle;
        }
        if (a->error) {
                bool corrupt = a->error == -EBADMSG;
                mandate_set_status(m, corrupt ? MANDATE_QUARANTINED : MANDATE_WAL_IO_ERROR,
                                   corrupt ? "wal_corrupt" : "wal_io_error");
                log_event(LOG_ERR, corrupt ? MSGID_WAL_CORRUPT : MSGID_WAL_IO_ERROR,
                          LOG_FIELDS({ "MANDATE_ID", m->id }),
                          "mandate %s paused (%s): %s", m->id, m->reason, a->errmsg);
                mandate_wal_close(m);
                finish_fire_reply(a, true);
                op_reply_error(&a->cancel_reply, "wal_io_error", "%s", a->errmsg);
                if (a->cancel)
                        mandate_cancel_free(m);
                release_slot(m);
                goto out;
        }
        finish_fire_reply(a, true);
        for (int i = 0; i < PLANNER_PHASES; i++)
                for (unsigned k = 0; k < a->completed_inline[i]; k++)
                        metrics_step(d->metrics, i, WAL_OP_COMPLETED, 0);
        if (a->cancel && a->cancel_too_late) {
                op_reply_error(&a->cancel_reply, "conflict",
                               "mandate %s ended (%s) before the cancel took effect", m->id,
                               mandate_status_name(m->status));
                mandate_cancel_free(m);
                goto out;
        }
        if (op_reply_wanted(&a->cancel_reply))
                op_reply_ok(&a->cancel_reply,
                            json_pack("{s:s, s:s, s:s?}", "mandate", m->id, "status",
                                      mandate_status_name(MANDATE_CANCELLED), "interrupted",
                                      a->interrupted));
        if (a->cancel) {
                mandate_cancel_free(m);
        } else if (m->cancel && a->next != NEXT_END) {
                /* a cancel came while this was decided: it ends here */
                if (a->cycle_finished)
                        d->cycles_completed++;
                submit_cancel(m, NULL);
                goto out;
        }
        if (a->cycle_finished)
                d->cycles_completed++;
        if (!a->cancel && (!a->decide || d->stopping) && a->next != NEXT_END) {
                /* recorded; the mandate goes on after the restart */
                if (m->status == MANDATE_RUNNING)
                        mandate_set_status(m, MANDATE_RUNNABLE, NULL);
                release_slot(m);
                goto out;
        }
        switch (a->next) {
        case NEXT_RUN_STEP:
                mandate_set_status(m, MANDATE_RUNNING, NULL);
                spawn_handler(m, a);
                break;
        case NEXT_AWAIT_APPROVAL:
                mandate_set_status(m, MANDATE_AWAITING_APPROVAL, a->reason);
                free(m->review_step);
                m->review_step = a->step_id ? strdup(a->step_id) : NULL;
                log_event(LOG_NOTICE, NULL, LOG_FIELDS({ "MANDATE_ID", m->id }),
                          "mandate %s awaits approval (%s): kairosctl approve %s", m->id,
                          a->reason, m->id);
                hooks_event(d, HOOK_APPROVAL, m, m->review_step, NULL);
                release_slot(m);
                break;
        case NEXT_REVIEW:
                mandate_set_status(m, MANDATE_PAUSED_REVIEW, a->reason);
                m->review_step = a->step_id ? strdup(a->step_id) : NULL;
                log_event(LOG_WARNING, MSGID_PAUSED_REVIEW,
                          LOG_FIELDS({ "MANDATE_ID", m->id }, { "STEP_ID", m->review_step }),
                          "mandate %s paused for review at step %s (%s)", m->id,
                          m->review_step ? m->review_step : "?", a->reason);
                hooks_event(d, HOOK_REVIEW, m, m->review_step, NULL);
                release_slot(m);
                break;
        case NEXT_PAUSE:
                mandate_set_status(m, MANDATE_PAUSED, a->reason);
                log_event(LOG_WARNING, NULL, LOG_FIELDS({ "MANDATE_ID", m->id }),
                          "mandate %s paused: %s", m->id, a->reason);
                release_slot(m);
                break;
        case NEXT_END:
                m->ended_ms = now_ms_realtime();
                mandate_set_status(m, a->end_status, a->reason);
                log_event(LOG_NOTICE, NULL, LOG_FIELDS({ "MANDATE_ID", m->id }),
                          "mandate %s %s after %lld cycle%s (%s)", m->id,
                          mandate_status_name(a->end_status), a->cycle, a->cycle == 1 ? "" : "s",
                          a->reason ? a->reason : "");
                if (a->end_status == MANDATE_FAILED || a->end_status == MANDATE_TERMINATED)
                        hooks_event(d, HOOK_FAILURE, m, NULL, NULL);
                release_slot(m);
                archive_enqueue(m, a->archive_path);
                a->archive_path = NULL;
                break;
        case NEXT_NONE:
                release_slot(m);
                break;
        }
out:
        advance_free(a);
        daemon_update_status(d);
        executor_kick(d);
        /* nothing runs: no batch would grow, archive now */
        if (d->running == 0 && d->arch_npending)
                archive_flush(d);
        check_idle(d);
}

static void start_advance(struct mandate *m, struct advance *a)
{
        m->busy++;
        if (serialq_submit(&m->q, advance_work, advance_done, a) < 0) {
                m->busy--;
                log_error("out of memory: cannot advance %s", m->id);
                finish_fire_reply(a, false);
                op_reply_error(&a->cancel_reply, "internal", "out of memory");
                if (a->cancel)
                        mandate_cancel_free(m);
                advance_free(a);
                release_slot(m);
        }
}

static void mandate_cancel_free(struct mandate *m)
{
        struct mandate_cancel *c = m->cancel;
        if (!c)
                return;
        m->cancel = NULL;
        op_reply_error(&c->reply, "internal", "the cancel of %s was dropped", m->id);
        free(c->reason);
        free(c);
}

/* Queue the cancel's records (a: a job that already holds the interrupted
 * step's record, or NULL). */
static void submit_cancel(struct mandate *m, struct advance *a)
{
        struct mandate_cancel *c = m->cancel;
        if (c->submitted) {
                if (a)
                        start_advance(m, a);
                return;
        }
        if (!a && !(a = advance_new(m))) {
                log_error("out of memory: cannot cancel %s", m->id);
                mandate_cancel_free(m);
                return;
        }
        c->submitted = true;
        a->cancel = true;
        a->decide = false;
        a->cancel_reason = strdup(c->reason);
        a->cancel_uid = (long long)c->uid;
        a->cancel_reply = c->reply;
        c->reply = (struct op_reply){ 0 };
        if (!a->cancel_reason) {
                op_reply_error(&a->cancel_reply, "internal", "out of memory");
                advance_free(a);
                mandate_cancel_free(m);
                return;
        }
        start_advance(m, a);
}

void executor_cancel(struct mandate *m, const char *reason, uid_t by,
                     void (*done)(void *ctx, const struct op_result *r), void *ctx)
{
        struct op_reply reply = { done, ctx };
        struct mandate_cancel *c = calloc(1, sizeof(*c));
        if (!c || !(c->reason = strdup(reason))) {
                free(c);
                op_reply_error(&reply, "internal", "out of memory");
                return;
        }
        c->uid = by;
        c->reply = reply;
        m->cancel = c;
        char uid[32];
        snprintf(uid, sizeof uid, "%u", (unsigned)by);
        log_event(LOG_NOTICE, MSGID_OPERATOR,
                  LOG_FIELDS({ "MANDATE_ID", m->id }, { "OPERATOR_UID", uid }),
                  "mandate %s cancelled by uid %s: %s%s", m->id, uid, reason,
                  m->run && (m->run->started || m->run->starting) && !m->run->exited
                          ? " (stopping its handler)"
                          : "");
        struct exec_run *run = m->run;
        if (run && run->waiting_retry) {
                /* never started: the cancel records it */
                uv_timer_stop(&run->timer);
                run->waiting_retry = false;
                m->run = NULL;
                run->finished = true;
                run_close_handles(run);
                run = NULL;
        }
        if (run && run->started && !run->exited) {
                cancel_stop_handler(run); /* run_finished submits the cancel */
                return;
        }
        if (run)
                return; /* starting (on_job_started stops it) or ending: run_finished submits */
        /* (an advance in flight runs first: its result is recorded, nothing
         * new starts after it) */
        submit_cancel(m, NULL);
}

void executor_enqueue(struct mandate *m)
{
        if (m->holds_slot) {
                /* resumed while its handler still runs: it simply goes on */
                mandate_set_status(m, MANDATE_RUNNING, NULL);
                return;
        }
        if (m->queued) {
                mandate_set_status(m, MANDATE_RUNNABLE, NULL);
                return;
        }
        mandate_set_status(m, MANDATE_RUNNABLE, NULL);
        m->queued = true;
        m->next_queued = NULL;
        struct daemon *d = m->d;
        if (d->queue_tail)
                d->queue_tail->next_queued = m;
        else
                d->queue_head = m;
        d->queue_tail = m;
}

static const struct config_schedule *schedule_cfg(const struct daemon *d, const char *name)
{
        for (size_t i = 0; name && i < d->cfg->nschedules; i++)
                if (strcmp(d->cfg->schedules[i].name, name) == 0)
                        return &d->cfg->schedules[i];
        return NULL;
}

static bool is_final_status(enum mandate_status s)
{
        return s == MANDATE_DONE || s == MANDATE_FAILED || s == MANDATE_TERMINATED ||
               s == MANDATE_ABANDONED || s == MANDATE_CANCELLED;
}

/* Another mandate of the same schedule that is (running) or (not finished). */
static struct mandate *sibling(const struct daemon *d, const struct mandate *self,
                               const char *schedule, bool running_only)
{
        size_t pos = 0;
        const char *k;
        void *v;
        while (strmap_next(d->mandates, &pos, &k, &v) == 0) {
                struct mandate *o = v;
                if (o == self || !o->schedule || strcmp(o->schedule, schedule) != 0)
                        continue;
                if (running_only ? o->holds_slot : !is_final_status(o->status))
                        return o;
        }
        return NULL;
}

void executor_finish(struct mandate *m, enum decide_end end, const char *reason)
{
        struct advance *a = advance_new(m);
        mandate_set_status(m, end_status(end), reason);
        if (!a) {
                log_error("out of memory: cannot archive %s; its WAL stays", m->id);
                return;
        }
        /* the advance job decides the end again from the WAL and archives */
        start_advance(m, a);
}

static void start_mandate(struct mandate *m)
{
        struct daemon *d = m->d;
        struct advance *a = advance_new(m);
        if (!a) {
                log_error("out of memory: cannot start %s", m->id);
                return;
        }
        m->holds_slot = true;
        d->running++;
        mandate_set_status(m, MANDATE_RUNNING, NULL);
        start_advance(m, a);
}

void executor_kick(struct daemon *d)
{
        if (d->stopping || !d->ready)
                return;
        /* FIFO, except that a mandate of a Concurrency=queue schedule waits
         * while another mandate of its schedule runs. */
        struct mandate **link = &d->queue_head, *last = NULL;
        while (*link && d->running < d->cfg->max_concurrent_mandates) {
                struct mandate *m = *link;
                /* paused or cancelled meanwhile */
                bool drop = m->status != MANDATE_RUNNABLE || m->cancel;
                const struct config_schedule *sc = schedule_cfg(d, m->schedule);
                if (!drop && sc && sc->concurrency == CONCURRENCY_QUEUE &&
                    sibling(d, m, m->schedule, true)) {
                        last = m;
                        link = &m->next_queued;
                        continue;
                }
                *link = m->next_queued;
                m->queued = false;
                m->next_queued = NULL;
                if (!drop)
                        start_mandate(m);
        }
        /* the tail is the last mandate left in the list */
        if (!*link) {
                d->queue_tail = last;
        } else {
                struct mandate *t = *link;
                while (t->next_queued)
                        t = t->next_queued;
                d->queue_tail = t;
        }
}

struct fire_dup {
        struct op_reply reply;
        struct mandate *m;
};

static void fire_dup_work(void *arg)
{
        (void)arg; /* nothing: only its place in the mandate's queue matters */
}

static void fire_dup_done(void *arg)
{
        struct fire_dup *dup = arg;
        struct mandate *m = dup->m;
        m->busy--;
        if (m->status == MANDATE_WAL_IO_ERROR || m->status == MANDATE_QUARANTINED)
                op_reply_error(&dup->reply, mandate_status_name(m->status),
                               "mandate %s of this fire is %s: %s", m->id,
                               mandate_status_name(m->status), m->reason ? m->reason : "");
        else
                op_reply_ok(&dup->reply,
                            json_pack("{s:s, s:s?, s:s?, s:b, s:s, s:s}", "mandate", m->id,
                                      "schedule", m->schedule, "fired_at", m->fired_at,
                                      "fired", 0, "status", mandate_status_name(m->status),
                                      "message", "already fired: nothing to do"));
        free(dup);
}

static void fire_tick(struct daemon *d, const char *schedule, const char *fired_at, int retry,
                      const struct executor_retry *rt, struct op_reply reply);

void executor_fire(struct daemon *d, const char *schedule, const char *fired_at,
                   void (*done)(void *ctx, const struct op_result *r), void *ctx)
{
        fire_tick(d, schedule, fired_at, 0, NULL, (struct op_reply){ done, ctx });
}

void executor_retry(struct daemon *d, const struct executor_retry *rt,
                    void (*done)(void *ctx, const struct op_result *r), void *ctx)
{
        fire_tick(d, rt->schedule, rt->fired_at, rt->retry, rt, (struct op_reply){ done, ctx });
}

/* Fire (schedule, fired_at): its first mandate (retry 0), or with rt a
 * retry of it (kairosctl retry). */
static void fire_tick(struct daemon *d, const char *schedule, const char *fired_at, int retry,
                      const struct executor_retry *rt, struct op_reply reply)
{
        const struct config_schedule *sc = NULL;
        for (size_t i = 0; i < d->cfg->nschedules; i++)
                if (strcmp(d->cfg->schedules[i].name, schedule) == 0)
                        sc = &d->cfg->schedules[i];
        const struct config_broken *broken = config_find_broken(d->cfg, schedule);
        if (broken) {
                /* (a retained configuration only serves mandates already running) */
                op_reply_error(&reply, "schedule_broken",
                               "schedule '%s' is broken, fix its file and reload: %s", schedule,
                               broken->errors.n ? broken->errors.msgs[0] : "?");
                return;
        }
        if (!sc) {
                op_reply_error(&reply, "not_found", "no schedule named '%s'", schedule);
                return;
        }
        struct planner_plan p;
        if (planner_build_retry(schedule, fired_at, retry, 1, &p) < 0) {
                op_reply_error(&reply, "bad_argument", "cannot plan %s at %s", schedule,
                               fired_at);
                return;
        }
        struct mandate *m = mandate_find(d, p.mandate_id);
        if (m && !op_reply_wanted(&reply)) {
                log_info("schedule %s at %s: mandate %s exists already (%s): nothing to do",
                         schedule, fired_at, m->id, mandate_status_name(m->status));
                return;
        }
        if (m) {
                /* Answer after the jobs already queued for it — above all the
                 * first fire's own flush — so "already fired" is never said
                 * of a plan that is not durable yet. */
                struct fire_dup *dup = calloc(1, sizeof(*dup));
                if (!dup) {
                        op_reply_error(&reply, "internal", "out of memory");
                        return;
                }
                dup->reply = reply;
                dup->m = m;
                m->busy++;
                if (serialq_submit(&m->q, fire_dup_work, fire_dup_done, dup) < 0) {
                        m->busy--;
                        free(dup);
                        op_reply_error(&reply, "internal", "out of memory");
                }
                return;
        }
        struct mandate *busy = sc->concurrency == CONCURRENCY_REJECT
                                       ? sibling(d, NULL, schedule, false)
                                       : NULL;
        if (busy) {
                log_event(LOG_NOTICE, NULL, LOG_FIELDS({ "SCHEDULE", schedule }),
                          "fire of %s at %s rejected: mandate %s is still %s (Concurrency=reject)",
                          schedule, fired_at, busy->id, mandate_status_name(busy->status));
                op_reply_error(&reply, "rejected",
                               "schedule %s has Concurrency=reject and mandate %s is still %s",
                               schedule, busy->id, mandate_status_name(busy->status));
                return;
        }
        char *path = NULL;
        m = statedir_wal_path(&d->paths, p.mandate_id, &path) < 0
                    ? NULL
                    : mandate_add(d, p.mandate_id, path);
        free(path);
        if (!m) {
                op_reply_error(&reply, "internal", "out of memory");
                return;
        }
        m->schedule = strdup(schedule);
        m->fired_at = strdup(fired_at);
        m->goal = sc->goal ? strdup(sc->goal) : NULL;
        if (rt) {
                m->retry_of = strdup(rt->retry_of);
                m->retry = retry;
        }
        m->started_ms = now_ms_realtime();
        struct advance *a = advance_new(m);
        if (!a) {
                op_reply_error(&reply, "internal", "out of memory");
                return;
        }
        a->reply = reply;
        a->pre[a->npre++] = (struct wal_record){ .op = WAL_OP_MANDATE, .mandate_id = own(a, m->id),
                                                 .schedule = own(a, schedule),
                                                 .fired_at = own(a, fired_at),
                                                 .goal = own(a, m->goal),
                                                 .retry_of = own(a, m->retry_of),
                                                 .retry = m->retry };
        if (rt)
                a->pre[a->npre++] = (struct wal_record){
                        .op = WAL_OP_OPERATOR, .mandate_id = own(a, m->id), .action = "retry",
                        .uid = rt->uid, .reason = own(a, rt->reason),
                };
        set_plan_records(a, &a->pre[a->npre++], &p);
        /* With a free slot the first step's executing record shares the flush
         * of the plan_commit; otherwise the plan waits in the queue. */
        bool wait_turn = sc->concurrency == CONCURRENCY_QUEUE && sibling(d, m, schedule, true);
        if (!d->stopping && d->ready && !wait_turn &&
            d->running < d->cfg->max_concurrent_mandates && !d->queue_head) {
                m->holds_slot = true;
                d->running++;
                mandate_set_status(m, MANDATE_RUNNING, NULL);
        } else {
                a->decide = false;
                mandate_set_status(m, MANDATE_RUNNABLE, NULL);
                m->queued = true;
                if (d->queue_tail)
                        d->queue_tail->next_queued = m;
                else
                        d->queue_head = m;
                d->queue_tail = m;
        }
        if (rt)
                log_event(LOG_NOTICE, MSGID_OPERATOR,
                          LOG_FIELDS({ "MANDATE_ID", m->id }, { "SCHEDULE", schedule }),
                          "retry %d of %s at %s by uid %lld: mandate %s (retries %s): %s", retry,
                          schedule, fired_at, (long long)rt->uid, m->id, rt->retry_of, rt->reason);
        else
                log_event(LOG_NOTICE, NULL,
                          LOG_FIELDS({ "MANDATE_ID", m->id }, { "SCHEDULE", schedule }),
                          "fired %s at %s: mandate %s", schedule, fired_at, m->id);
        metrics_fire(d->metrics, schedule, op_reply_wanted(&reply));
        start_advance(m, a);
}

/* ---- graceful stop ---- */

static void on_grace_timeout(uv_timer_t *t)
{
        struct daemon *d = t->data;
        size_t pos = 0;
        const char *k;
        void *v;
        while (strmap_next(d->mandates, &pos, &k, &v) == 0) {
                struct mandate *m = v;
                if (m->run && !m->run->finished) {
                        log_warning("%s %s: still running after GracefulTimeoutSec=%llu: killed",
                                    m->id, m->run->step_id,
                                    (unsigned long long)d->cfg->graceful_timeout_sec);
                        m->run->killed_for_shutdown = true;
                        kill_group(m->run, SIGKILL);
                }
        }
}

void executor_shutdown(struct daemon *d, void (*done)(struct daemon *d))
{
        d->executor_idle = done;
        size_t pos = 0;
        const char *k;
        void *v;
        while (strmap_next(d->mandates, &pos, &k, &v) == 0) {
                struct mandate *m = v;
                if (m->run && m->run->waiting_retry)
                        spawn_retry_give_up(m->run);
        }
        if (d->running == 0) {
                check_idle(d);
                return;
        }
        log_info("waiting up to %llus for %u running mandate%s",
                 (unsigned long long)d->cfg->graceful_timeout_sec, d->running,
                 d->running == 1 ? "" : "s");
        uv_timer_init(d->loop, &d->grace_timer);
        d->grace_timer.data = d;
        uv_timer_start(&d->grace_timer, on_grace_timeout, d->cfg->graceful_timeout_sec * 1000, 0);
}

void executor_free_mandate(struct mandate *m)
{
        if (m->cancel)
                m->cancel->reply = (struct op_reply){ 0 }; /* the loop is gone: nobody to answer */
        mandate_cancel_free(m);
        free(m->fired_at);
        free(m->goal);
        free(m->retry_of);
        free(m->step_id);
}
