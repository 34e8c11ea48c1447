/* SPDX-License-Identifier: MIT */
/* probe: Probe= after READY=1 (probe.h). */
#include "probe.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon.h"
#include "executor.h"
#include "hooks.h"
#include "idem_service.h"
#include "kairos/decide.h"
#include "kairos/evidence.h"
#include "kairos/dlist.h"
#include "kairos/fold.h"
#include "kairos/kbuf.h"
#include "kairos/kmem.h"
#include "kairos/planner.h"
#include "kairos/probeout.h"
#include "kairos/recovery.h"
#include "kairos/stepdoc.h"
#include "kairos/verdict.h"
#include "kairos/wal.h"
#include "log.h"
#include "metrics.h"
#include "child.h"
#include "runenv.h"

/* One probe: waiting, preparing (on the mandate's queue), running. */
struct probe_job {
        struct mandate *m;
        struct probe_job *next, *prev;
        char *step_id;
        /* what the loop read from the configuration for the pool */
        unsigned max_cycles;
        /* prepared on the pool */
        int prep_error;               /* -errno; 1: the step is no longer open */
        char *doc;
        size_t doc_len;
        char *plan_id, *idem_key;
        long long cycle;
        unsigned attempt;
        int phase;
        /* the process */
        char **argv, **env;
        char *cwd, *cmdline;
        unsigned timeout_sec;
        struct child child;
        char start_error[256];
        /* an interrupted call's own check runs instead of Probe= */
        bool is_check;
        struct idem_check_call chk;
};

/* The probe's word, decided again on the mandate's queue. */
struct probe_decision {
        struct mandate *m;
        char *step_id;
        struct probe_word word;
        bool have_ev;
        struct recovery_evidence ev;  /* the schedule's, read on the loop */
        /* a call's check spoke: the store's evidence after it (ix, em) */
        bool is_check;
        char check_key[IDEM_FULL_KEY_SIZE];
        struct evidence_index *ix;
        struct evidence_mandate em;
        bool have_em;
        /* results */
        int error;
        char errmsg[256];
        bool still_probing;
        enum decide_mandate outcome;
        char *review_step, *review_reason, *plan_id;
        long long cycle;
        struct {
                char *step_id, *reason, *evidence;
                const char *action;   /* what was done, as recovery logs it */
                enum verdict_kind kind;
        } decs[PLANNER_PHASES * 2];
        size_t ndecs;
        uint64_t flushes;
};

static struct {
        struct daemon *d;
        bool ready, stopping;
        struct probe_job *q_head, *q_tail;   /* waiting for READY=1 or a free slot */
        struct probe_job *running;           /* preparing or running */
        unsigned nrunning;
} P;

static void start_next(void);

static void job_free(struct probe_job *j)
{
        FREE_ALL(j->step_id, j->doc, j->plan_id, j->idem_key);
        config_strv_free(j->argv);
        free(j->env);
        free(j->cwd);
        free(j->cmdline);
        idem_check_call_release(&j->chk);
        child_free(&j->child);
        free(j);
}

/* The job leaves the running list (its slot is free again) and goes. */
static void job_end(struct probe_job *j)
{
        DLIST_UNLINK(P.running, j);
        P.nrunning--;
        job_free(j);
        start_next();
}

static const struct config_schedule *schedule_of(const struct mandate *m)
{
        const struct config *cfg = m->d->cfg;
        for (size_t i = 0; m->schedule && i < cfg->nschedules; i++)
                if (strcmp(cfg->schedules[i].name, m->schedule) == 0)
                        return &cfg->schedules[i];
        return NULL;
}

/* ---- deciding again with the probe's word ---- */

static void decision_free(struct probe_decision *pd)
{
        probe_word_clear(&pd->word);
        if (pd->have_em)
                evidence_mandate_release(&pd->em);
        evidence_index_free(pd->ix);
        FREE_ALL(pd->step_id, pd->review_step, pd->review_reason, pd->plan_id);
        for (size_t i = 0; i < pd->ndecs; i++) {
                FREE_ALL(pd->decs[i].step_id, pd->decs[i].reason, pd->decs[i].evidence);
        }
        free(pd);
}

static void keep_decisions(struct probe_decision *pd, const struct fold *f,
                           const struct recovery *rec)
{
        for (size_t i = 0; i < rec->nplans; i++)
                for (size_t k = 0; k < rec->plans[i].ndecisions; k++) {
                        const struct recovery_decision *dec = &rec->plans[i].decisions[k];
                        if (pd->ndecs == sizeof pd->decs / sizeof pd->decs[0])
                                return;
                        struct kbuf ev = KBUF_INIT;
                        verdict_evidence_json(&dec->verdict, &ev);
                        pd->decs[pd->ndecs].step_id = strdup(f->steps[dec->step].step_id);
                        pd->decs[pd->ndecs].reason =
                                strdup(dec->verdict.reason ? dec->verdict.reason : "");
                        pd->decs[pd->ndecs].evidence = kbuf_steal(&ev);
                        pd->decs[pd->ndecs].kind = dec->verdict.kind;
                        pd->decs[pd->ndecs].action = recovery_action_text(dec);
                        pd->ndecs++;
                }
}

static void decide_work(void *arg)
{
        struct probe_decision *pd = arg;
        struct mandate *m = pd->m;
        struct fold *f = NULL;
        struct decide_recovery dr = { .recovery = NULL };
        struct recovery_step_evidence se = {
                .step_id = pd->step_id, .probe = pd->word.probe,
                .probe_result_json = pd->word.result_json, .probe_output = pd->word.output,
        };
        int r = fold_file(m->wal_path, &f);
        if (r == 0 && f->status == FOLD_CORRUPT)
                r = -EBADMSG;
        if (r < 0) {
                pd->error = r;
                snprintf(pd->errmsg, sizeof pd->errmsg, "folding %s: %s", m->wal_path,
                         strerror(-r));
                goto out;
        }
        pd->ev.steps = &se;
        pd->ev.nsteps = 1;
        const struct recovery_evidence *ev = pd->have_ev ? &pd->ev : NULL;
        if (pd->is_check) {
                /* the store's evidence after the check settled its call (or
                 * the check's word when it could not say) */
                ev = &pd->em.ev;
                for (size_t i = 0; i < pd->em.n; i++)
                        if (strcmp(pd->em.steps[i].step_id, pd->step_id) == 0 &&
                            pd->word.probe == RECOVERY_PROBE_FAILED) {
                                pd->em.steps[i].check = RECOVERY_PROBE_FAILED;
                                pd->em.steps[i].check_key = pd->check_key;
                                pd->em.steps[i].check_output = pd->word.output;
                        }
        }
        /* (a summary only matters to a WAL without plans: this one has one) */
        if ((r = decide_recover(f, true, ev, &dr)) < 0) {
                pd->error = r;
                snprintf(pd->errmsg, sizeof pd->errmsg, "deciding %s: %s", m->id, strerror(-r));
                goto out;
        }
        if (dr.mandate == DECIDE_MANDATE_PROBING) {
                /* a check settled its call: another check, or Probe=, is next
                 * (a probe's word is always taken) */
                pd->still_probing = true;
                goto out;
        }
        size_t n = recovery_record_count(dr.recovery);
        if (n && (r = mandate_wal_open(m)) < 0) {
                pd->error = r;
                snprintf(pd->errmsg, sizeof pd->errmsg, "opening %s: %s", m->wal_path,
                         strerror(-r));
                goto out;
        }
        uint64_t before = n ? wal_flush_count(m->wal) : 0;
        for (size_t i = 0; i < n && r == 0; i++)
                r = wal_append(m->wal, recovery_record_at(dr.recovery, i));
        if (r == 0 && n)
                r = wal_flush(m->wal);
        if (n)
                pd->flushes = wal_flush_count(m->wal) - before;
        if (r < 0) {
                pd->error = r;
                snprintf(pd->errmsg, sizeof pd->errmsg, "appending to %s: %s", m->wal_path,
                         strerror(-r));
                goto out;
        }
        keep_decisions(pd, f, dr.recovery);
        pd->outcome = dr.mandate;
        if (dr.mandate == DECIDE_MANDATE_PAUSED_REVIEW) {
                pd->review_step = strdup(dr.review_step);
                pd->review_reason = strdup(dr.review_reason);
        }
        if (f->nplans > 0) {
                const struct fold_plan *last = &f->plans[f->nplans - 1];
                pd->plan_id = last->plan_id ? strdup(last->plan_id) : NULL;
                pd->cycle = last->cycle;
        }
out:
        decide_recovery_release(&dr);
        fold_free(f);
}

static void decide_done(void *arg)
{
        struct probe_decision *pd = arg;
        struct mandate *m = pd->m;
        struct daemon *d = m->d;
        m->busy--;
        m->flushes += pd->flushes;
        d->flushes_total += pd->flushes;
        struct recovery_summary *s = &d->recovery;
        for (size_t i = 0; i < pd->ndecs; i++) {
                log_event(LOG_NOTICE, MSGID_RECOVERY,
                          LOG_FIELDS({ "MANDATE_ID", m->id }, { "STEP_ID", pd->decs[i].step_id },
                                     { "VERDICT", verdict_kind_name(pd->decs[i].kind) },
                                     { "EVIDENCE", pd->decs[i].evidence }),
                          "recovery: %s %s: %s (%s): %s", m->id, pd->decs[i].step_id,
                          verdict_kind_name(pd->decs[i].kind), pd->decs[i].reason,
                          pd->decs[i].action);
                /* the probe's step: its source by its reason (after a check:
                 * the store, or the check) */
                const struct verdict why = { .reason = pd->decs[i].reason };
                metrics_verdict(d->metrics, verdict_kind_name(pd->decs[i].kind),
                                strcmp(pd->decs[i].step_id, pd->step_id) != 0 ? "wal"
                                : pd->is_check ? evidence_source_name(&why)
                                               : "probe",
                                pd->decs[i].reason);
                s->decisions++;
                if (pd->decs[i].kind == VERDICT_ALREADY_DONE)
                        s->already_done++;
                else if (pd->decs[i].kind == VERDICT_SAFE_TO_RETRY)
                        s->safe_to_retry++;
                else
                        s->manual_review++;
        }
        bool ours = m->status == MANDATE_PROBING && !m->cancel;
        if (pd->error) {
                bool corrupt = pd->error == -EBADMSG;
                log_event(LOG_ERR, corrupt ? MSGID_WAL_CORRUPT : MSGID_WAL_IO_ERROR,
                          LOG_FIELDS({ "MANDATE_ID", m->id }),
                          "mandate %s: the probe's word on %s cannot be recorded: %s", m->id,
                          pd->step_id, pd->errmsg);
                if (ours) {
                        mandate_wal_close(m);
                        mandate_set_status(m, corrupt ? MANDATE_QUARANTINED : MANDATE_WAL_IO_ERROR,
                                           corrupt ? "wal_corrupt" : "wal_io_error");
                }
        } else if (!ours) {
                log_info("%s: %s meanwhile; the probe's word on %s is recorded, nothing more",
                         m->id, m->cancel ? "being cancelled" : mandate_status_name(m->status),
                         pd->step_id);
        } else {
                if (pd->plan_id) {
                        free(m->plan_id);
                        m->plan_id = pd->plan_id;
                        pd->plan_id = NULL;
                        m->cycle = pd->cycle;
                }
                if (pd->still_probing && pd->is_check) {
                        /* the check settled its call: what is left of the step
                         * (another call's check, or Probe=) decides next */
                        struct mandate *mm = m;
                        char *step = pd->step_id;
                        pd->step_id = NULL;
                        decision_free(pd);
                        probe_enqueue(mm, step);
                        free(step);
                        daemon_update_status(d);
                        executor_kick(d);
                        return;
                }
                if (pd->still_probing || pd->outcome == DECIDE_MANDATE_PAUSED_REVIEW) {
                        const char *step = pd->review_step ? pd->review_step : pd->step_id;
                        const char *why = pd->review_reason ? pd->review_reason
                                                            : "probe_inconclusive";
                        mandate_set_status(m, MANDATE_PAUSED_REVIEW, why);
                        m->review_step = strdup(step);
                        log_event(LOG_WARNING, MSGID_PAUSED_REVIEW,
                                  LOG_FIELDS({ "MANDATE_ID", m->id }, { "STEP_ID", step }),
                                  "mandate %s paused for review at step %s (%s); resolve with "
                                  "kairosctl resolve %s %s --done|--retry|--abandon --reason TEXT",
                                  m->id, step, why, m->id, step);
                        const char *evidence = NULL;
                        for (size_t i = 0; i < pd->ndecs; i++)
                                if (strcmp(pd->decs[i].step_id, step) == 0)
                                        evidence = pd->decs[i].evidence;
                        hooks_event(d, HOOK_REVIEW, m, step, evidence);
                } else {
                        executor_enqueue(m);
                }
        }
        decision_free(pd);
        daemon_update_status(d);
        executor_kick(d);
}

/* The decision is taken on the mandate's queue (the word, and for a check
 * the store's evidence after it, in pd). */
static void decide_submit(struct probe_decision *pd)
{
        struct mandate *m = pd->m;
        if (P.stopping || m->status != MANDATE_PROBING || m->cancel) {
                log_info("%s %s: the %s's word is not used (%s); the step stays open", m->id,
                         pd->step_id, pd->is_check ? "check" : "probe",
                         P.stopping ? "kairosd is stopping" : "no longer probing");
                decision_free(pd);
                return;
        }
        if (pd->is_check) {
                /* the store as the check left it: the step decided as if its
                 * call had finished (docs/design.md §8) */
                const struct config_schedule *sc = schedule_of(m);
                struct evidence_schedule es;
                evidence_schedule_from_config(sc, &es);
                if (idem_service_evidence_index(m->d, &pd->ix) < 0 ||
                    evidence_for_mandate(pd->ix, m->id, &es, &pd->em) < 0) {
                        log_error("%s %s: out of memory deciding after its check; the mandate "
                                  "stays probing until the next start", m->id, pd->step_id);
                        decision_free(pd);
                        return;
                }
                pd->have_em = true;
        } else {
                pd->have_ev = probe_schedule_evidence(m->d->cfg, m->schedule, &pd->ev);
        }
        if (mandate_submit(m, decide_work, decide_done, pd) < 0) {
                log_error("%s %s: out of memory recording its probe's word; the mandate stays "
                          "probing until the next start", m->id, pd->step_id);
                decision_free(pd);
        }
}

/* A word that could not be acted on: the step goes to a human with why. */
static void word_fails(struct probe_decision *pd, const char *what, const char *why)
{
        char *o = NULL;
        if (asprintf(&o, "%s said %s, but %s", pd->is_check ? "the check" : "the probe",
                     probe_word_name(pd->word.probe), why) < 0)
                o = NULL;
        probe_word_clear(&pd->word);
        pd->word.probe = RECOVERY_PROBE_FAILED;
        pd->word.output = o;
        log_event(LOG_WARNING, NULL,
                  LOG_FIELDS({ "MANDATE_ID", pd->m->id }, { "STEP_ID", pd->step_id }),
                  "%s %s: %s: %s", pd->m->id, pd->step_id, what, o ? o : why);
}

/* The check's call is settled (durable) or could not be. */
static void check_settled(void *ctx, int err)
{
        struct probe_decision *pd = ctx;
        pd->m->busy--;
        if (err < 0) {
                char why[IDEM_FULL_KEY_SIZE + 256];
                snprintf(why, sizeof why, "the call %s could not be settled in the store: %s",
                         pd->check_key, strerror(-err));
                word_fails(pd, "settling its call", why);
        } else {
                log_event(LOG_NOTICE, MSGID_RECOVERY,
                          LOG_FIELDS({ "MANDATE_ID", pd->m->id }, { "STEP_ID", pd->step_id },
                                     { "IDEM_KEY", pd->check_key }),
                          "recovery: %s %s: tool call %s %s by its check", pd->m->id,
                          pd->step_id, pd->check_key,
                          pd->word.probe == RECOVERY_PROBE_DONE ? "completed" : "released");
        }
        decide_submit(pd);
}

/* The probe spoke on a step with interrupted calls: they are settled with
 * its word (as resolve --done|--retry does) before the step is decided. */
static void probe_settled(void *ctx, const struct op_result *res)
{
        struct probe_decision *pd = ctx;
        pd->m->busy--;
        if (res->code) {
                char why[1200];
                snprintf(why, sizeof why, "the step's tool calls could not be %s: %s",
                         pd->word.probe == RECOVERY_PROBE_DONE ? "completed" : "released",
                         res->message ? res->message : res->code);
                word_fails(pd, "settling its tool calls", why);
        } else {
                json_t *keys = json_object_get(res->result, "keys");
                char *text = keys ? json_dumps(keys, JSON_COMPACT) : NULL;
                if (json_array_size(keys))
                        log_event(LOG_NOTICE, MSGID_RECOVERY,
                                  LOG_FIELDS({ "MANDATE_ID", pd->m->id },
                                             { "STEP_ID", pd->step_id }),
                                  "recovery: %s %s: tool calls %s %s by the probe's word",
                                  pd->m->id, pd->step_id, text ? text : "?",
                                  pd->word.probe == RECOVERY_PROBE_DONE ? "completed"
                                                                        : "released");
                free(text);
        }
        json_decref(res->result);
        json_decref(res->detail);
        decide_submit(pd);
}

/* The run is over: judge it, then decide again on the mandate's queue. */
static void decide(struct probe_job *j)
{
        struct mandate *m = j->m;
        const struct child *c = &j->child;
        char tail[CHILD_TAIL + 1];
        memcpy(tail, c->tail, c->tail_len);
        tail[c->tail_len] = '\0';
        struct probe_run run = {
                .out = c->out.data, .out_len = c->out.len, .out_overflow = c->overflow,
                .err = tail, .err_len = c->tail_len, .exit_status = c->exit_status,
                .term_signal = c->term_signal, .timed_out = c->timed_out,
                .timeout_sec = j->timeout_sec,
                .start_error = j->start_error[0] ? j->start_error : NULL,
        };
        struct probe_decision *pd = calloc(1, sizeof(*pd));
        if (!pd || !(pd->step_id = strdup(j->step_id)) || probe_judge(&run, &pd->word) < 0) {
                log_error("%s %s: out of memory judging its probe; the mandate stays probing "
                          "until the next start", m->id, j->step_id);
                if (pd)
                        decision_free(pd);
                return;
        }
        pd->m = m;
        pd->is_check = j->is_check;
        if (j->is_check)
                snprintf(pd->check_key, sizeof pd->check_key, "%s", j->chk.key);
        log_event(pd->word.probe == RECOVERY_PROBE_FAILED ? LOG_WARNING : LOG_NOTICE, NULL,
                  LOG_FIELDS({ "MANDATE_ID", m->id }, { "STEP_ID", j->step_id }),
                  "%s %s: the %s%s said %s%s%s", m->id, j->step_id,
                  j->is_check ? "check of tool call " : "probe", j->is_check ? j->chk.key : "",
                  probe_word_name(pd->word.probe), pd->word.output ? ": " : "",
                  pd->word.output ? pd->word.output : "");
        if (P.stopping || m->status != MANDATE_PROBING || m->cancel) {
                decide_submit(pd); /* (drops it, saying why) */
                return;
        }
        bool done = pd->word.probe == RECOVERY_PROBE_DONE;
        if (pd->word.probe == RECOVERY_PROBE_FAILED) {
                decide_submit(pd);
        } else if (j->is_check) {
                /* (the mandate is kept alive until the call is settled) */
                m->busy++;
                char why[IDEM_FULL_KEY_SIZE + 128];
                snprintf(why, sizeof why,
                         "released by its check at recovery (it said not_started): %s %s",
                         m->id, j->step_id);
                idem_service_settle_check(m->d, j->chk.key, done, pd->word.result_json, why,
                                          check_settled, pd);
        } else if (idem_service_step_may_own_open(m->d, m->id, j->step_id)) {
                m->busy++;
                idem_service_settle_step(m->d, m->id, j->step_id, done, getuid(),
                                         done ? "its probe said done"
                                              : "its probe said not_started",
                                         "the schedule's Probe= at recovery",
                                         (struct op_reply){ .done = probe_settled, .ctx = pd });
        } else {
                decide_submit(pd);
        }
}

/* ---- the process ---- */

static void on_closed(struct child *c)
{
        job_end(c->data);
}

static void on_done(struct child *c)
{
        decide(c->data);
        child_close(c);
}

static void on_started(struct child *c)
{
        struct probe_job *j = c->data;
        config_strv_clear(&j->argv);
        free(j->env);
        j->env = NULL;
        struct mandate *m = j->m;
        if (c->err) {
                snprintf(j->start_error, sizeof j->start_error, "%s%s%s",
                         c->err_what ? c->err_what : "", c->err_what ? ": " : "",
                         strerror(-c->err));
                on_done(c);
                return;
        }
        log_event(LOG_INFO, NULL, LOG_FIELDS({ "MANDATE_ID", m->id }, { "STEP_ID", j->step_id }),
                  "%s %s: %s started: %s (pid %d, ProbeTimeoutSec=%u)", m->id, j->step_id,
                  j->is_check ? "the check of a tool call" : "probe", j->cmdline, (int)c->pid,
                  j->timeout_sec);
        if (P.stopping)
                child_kill(c, SIGKILL);
}

/* The environment of a handler of the step, plus KAIROS_PROBE=1. */
static char **probe_env(const struct probe_job *j, const struct config_schedule *sc)
{
        const struct mandate *m = j->m;
        const struct runenv_step step = {
                .mandate_id = m->id, .plan_id = j->plan_id, .step_id = j->step_id,
                .phase = j->phase, .cycle = j->cycle, .idem_key = j->idem_key,
                .schedule = m->schedule, .fired_at = m->fired_at, .goal = m->goal,
                .attempt = j->attempt, .control_socket = m->d->cfg->control_socket,
        };
        const char *const kv[][2] = { { "KAIROS_PROBE", "1" } };
        return runenv_build_step(&step, kv, 1, sc->environment, sc->nenvironment);
}

static void spawn_check(struct probe_job *j, const struct config_schedule *sc);

/* Start a probe's or a check's child, as the step's handler would run:
 * the schedule's limits and cgroup, the step's document on stdin,
 * ProbeTimeoutSec=, stdout bounded. */
static int start_child(struct probe_job *j, const struct config_schedule *sc,
                       struct runner *runner)
{
        struct child *c = &j->child;
        c->argv = j->argv;
        c->envp = j->env;
        c->cwd = j->cwd;
        c->cg_hint = j->step_id;
        c->limits = (struct cgroup_limits){ sc->memory_max, sc->tasks_max, sc->cpu_quota_pct };
        c->in = j->doc;
        c->in_len = j->doc_len;
        c->timeout_ms = (uint64_t)j->timeout_sec * 1000;
        c->out_max = PROBE_STDOUT_MAX;
        return child_start(c, runner);
}


/* The environment of a handler of the step (KAIROS_IDEM_KEY the step's, as
 * for the probe: one script may serve both), plus KAIROS_CHECK=1,
 * KAIROS_TOOL and KAIROS_TOOL_KEY (the call's full key). */
static char **check_env(const struct probe_job *j, const struct config_schedule *sc)
{
        const struct mandate *m = j->m;
        const struct runenv_step step = {
                .mandate_id = m->id, .plan_id = j->plan_id, .step_id = j->step_id,
                .phase = j->phase, .cycle = j->cycle,
                .idem_key = j->idem_key, .schedule = m->schedule,
                .fired_at = m->fired_at, .goal = m->goal, .attempt = j->attempt,
                .control_socket = m->d->cfg->control_socket,
        };
        const char *const kv[][2] = {
                { "KAIROS_CHECK", "1" },
                { "KAIROS_TOOL", j->chk.tool },
                { "KAIROS_TOOL_KEY", j->chk.key },
        };
        return runenv_build_step(&step, kv, 3, sc->environment, sc->nenvironment);
}

/* The check's argv and stdin ({"tool","key","argv"}) from the call's
 * check (idem.h): 0, -EINVAL, -ENOMEM. */
static int check_command(struct probe_job *j)
{
        json_t *chk = json_loads(j->chk.check, 0, NULL);
        json_t *cmd = json_object_get(chk, "cmd");
        const char *colon = strchr(j->chk.key, ':');
        size_t n = json_array_size(cmd);
        int r = 0;
        if (!chk || !n) {
                r = chk ? -EINVAL : -ENOMEM;
                goto out;
        }
        if (!(j->argv = calloc(n + 1, sizeof(*j->argv)))) {
                r = -ENOMEM;
                goto out;
        }
        for (size_t i = 0; i < n; i++) {
                const char *w = json_string_value(json_array_get(cmd, i));
                if (!w || !(j->argv[i] = strdup(w))) {
                        r = w ? -ENOMEM : -EINVAL;
                        goto out;
                }
        }
        json_t *in = json_pack("{s:s, s:s, s:O}", "tool", j->chk.tool, "key",
                               colon ? colon + 1 : j->chk.key, "argv",
                               json_object_get(chk, "argv"));
        free(j->doc);
        j->doc = in ? json_dumps(in, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(in);
        if (!j->doc) {
                r = -ENOMEM;
                goto out;
        }
        j->doc_len = strlen(j->doc);
        /* what the log says it ran */
        struct kbuf b = KBUF_INIT;
        for (size_t i = 0; i < n && r == 0; i++)
                r = kbuf_printf(&b, "%s%s", i ? " " : "", j->argv[i]);
        free(j->cmdline);
        j->cmdline = r == 0 ? kbuf_steal(&b) : NULL;
        kbuf_free(&b);
        if (r == 0 && !j->cmdline)
                r = -ENOMEM;
out:
        json_decref(chk);
        return r;
}

static void spawn(struct probe_job *j)
{
        struct mandate *m = j->m;
        struct daemon *d = m->d;
        const struct config_schedule *sc = schedule_of(m);
        struct child *c = &j->child;
        child_init(c, d->loop);
        c->started = on_started;
        c->done = on_done;
        c->closed = on_closed;
        c->data = j;
        if (j->is_check) {
                spawn_check(j, sc);
                return;
        }
        if (!sc || !sc->probe || !*sc->probe) {
                /* reloaded without it meanwhile */
                snprintf(j->start_error, sizeof j->start_error,
                         "the schedule has no Probe= any more");
                on_done(c);
                return;
        }
        j->timeout_sec = (unsigned)sc->probe_timeout_sec;
        j->cmdline = strdup(sc->probe);
        j->cwd = strdup(sc->working_directory ? sc->working_directory : d->cfg->state_directory);
        char why[256] = "";
        int r = 0;
        if (!j->cmdline || !j->cwd || !(j->env = probe_env(j, sc)))
                r = -ENOMEM;
        /* its $NAME and ${NAME} expand from its environment */
        if (r == 0)
                r = runenv_command(sc->probe, j->env, &j->argv, why, sizeof why);
        if (r == 0)
                r = start_child(j, sc, d->runner);
        if (r < 0) {
                snprintf(j->start_error, sizeof j->start_error, "%s",
                         r == -EINVAL && why[0] ? why : strerror(-r));
                on_done(c);
        }
}

/* An interrupted call's own check: run like the probe (the schedule's
 * limits, cgroup, ProbeTimeoutSec=), its protocol the probe's. */
static void spawn_check(struct probe_job *j, const struct config_schedule *sc)
{
        struct mandate *m = j->m;
        struct child *c = &j->child;
        int r = 0;
        if (!sc) {
                snprintf(j->start_error, sizeof j->start_error,
                         "the schedule %s is no longer configured", m->schedule ? m->schedule : "");
                on_done(c);
                return;
        }
        j->timeout_sec = (unsigned)sc->probe_timeout_sec;
        j->cwd = strdup(sc->working_directory ? sc->working_directory
                                              : m->d->cfg->state_directory);
        if (!j->cwd || !(j->env = check_env(j, sc)))
                r = -ENOMEM;
        if (r == 0)
                r = check_command(j);
        if (r == 0)
                r = start_child(j, sc, m->d->runner);
        if (r < 0) {
                snprintf(j->start_error, sizeof j->start_error, "%s",
                         r == -EINVAL ? "the call's check is not a command line" : strerror(-r));
                on_done(c);
        }
}

/* ---- preparing: the step's document, from the WAL (pool thread) ---- */

static void prep_work(void *arg)
{
        struct probe_job *j = arg;
        struct fold *f = NULL;
        int r = fold_file(j->m->wal_path, &f);
        if (r < 0) {
                j->prep_error = r;
                return;
        }
        const struct fold_step *s = fold_find_step(f, j->step_id);
        if (f->status == FOLD_CORRUPT) {
                j->prep_error = -EBADMSG;
        } else if (!recovery_step_interrupted(s) || s->plan >= f->nplans) {
                j->prep_error = 1;
        } else {
                const struct fold_plan *p = &f->plans[s->plan];
                size_t idx = 0;
                while (idx < p->nsteps && &f->steps[p->steps[idx]] != s)
                        idx++;
                j->attempt = s->executions;
                j->phase = idx < PLANNER_PHASES ? (int)idx : 0;
                j->cycle = p->cycle;
                j->plan_id = strdup(p->plan_id ? p->plan_id : "");
                if (asprintf(&j->idem_key, "%s/%s", j->m->id, j->step_id) < 0)
                        j->idem_key = NULL;
                struct stepdoc_input in = {
                        .mandate_id = j->m->id, .schedule = f->mandate.schedule,
                        .fired_at = f->mandate.fired_at, .goal = f->mandate.goal,
                        .max_cycles = j->max_cycles, .attempt = j->attempt,
                        .idem_key = j->idem_key,
                };
                struct kbuf b = KBUF_INIT;
                if (idx == p->nsteps || !j->plan_id || !j->idem_key ||
                    stepdoc_build(f, p, idx, &in, &b) < 0)
                        j->prep_error = idx == p->nsteps ? 1 : -ENOMEM;
                j->doc_len = b.len;
                j->doc = kbuf_steal(&b);
        }
        fold_free(f);
}

static void prep_done(void *arg)
{
        struct probe_job *j = arg;
        struct mandate *m = j->m;
        m->busy--;
        if (P.stopping || m->status != MANDATE_PROBING || m->cancel) {
                job_end(j);
                return;
        }
        if (j->prep_error == 1) {
                /* decided meanwhile: the executor goes on from the WAL */
                executor_enqueue(m);
                executor_kick(m->d);
                job_end(j);
                return;
        }
        if (j->prep_error < 0) {
                bool corrupt = j->prep_error == -EBADMSG;
                log_event(LOG_ERR, corrupt ? MSGID_WAL_CORRUPT : MSGID_WAL_IO_ERROR,
                          LOG_FIELDS({ "MANDATE_ID", m->id }),
                          "mandate %s: cannot read %s for the probe of %s: %s; mandate paused "
                          "(%s)", m->id, m->wal_path, j->step_id, strerror(-j->prep_error),
                          corrupt ? "wal_corrupt" : "wal_io_error");
                mandate_set_status(m, corrupt ? MANDATE_QUARANTINED : MANDATE_WAL_IO_ERROR,
                                   corrupt ? "wal_corrupt" : "wal_io_error");
                daemon_update_status(m->d);
                job_end(j);
                return;
        }
        /* an interrupted call of the step with its own check comes first */
        int r = idem_service_step_check(m->d, m->id, j->step_id, &j->chk);
        if (r < 0) {
                log_error("%s %s: out of memory finding its calls' checks; the mandate stays "
                          "probing until the next start", m->id, j->step_id);
                job_end(j);
                return;
        }
        j->is_check = r == 1;
        spawn(j);
}

static void start_next(void)
{
        while (P.ready && !P.stopping && P.q_head && P.nrunning < PROBES_MAX_RUNNING) {
                struct probe_job *j = P.q_head;
                P.q_head = j->next;
                if (!P.q_head)
                        P.q_tail = NULL;
                DLIST_PUSH(P.running, j);
                P.nrunning++;
                const struct config_schedule *sc = schedule_of(j->m);
                j->max_cycles = sc ? sc->max_cycles : 1;
                if (mandate_submit(j->m, prep_work, prep_done, j) < 0) {
                        log_error("%s %s: out of memory starting its probe; the mandate stays "
                                  "probing until the next start", j->m->id, j->step_id);
                        job_end(j);
                        return;
                }
        }
}

void probe_enqueue(struct mandate *m, const char *step_id)
{
        struct probe_job *j = calloc(1, sizeof(*j));
        char why[PLANNER_STEP_ID_MAX + 64];
        snprintf(why, sizeof why, "awaiting the probe of %s", step_id);
        mandate_set_status(m, MANDATE_PROBING, why);
        if (!j || !(j->step_id = strdup(step_id))) {
                free(j);
                log_error("%s %s: out of memory queueing its probe; the mandate stays probing "
                          "until the next start", m->id, step_id);
                return;
        }
        P.d = m->d;
        j->m = m;
        if (P.q_tail)
                P.q_tail->next = j;
        else
                P.q_head = j;
        P.q_tail = j;
        log_event(LOG_NOTICE, NULL, LOG_FIELDS({ "MANDATE_ID", m->id }, { "STEP_ID", step_id }),
                  "recovery: %s %s: interrupted; its tool calls' checks or its probe decide (after "
                  "READY=1)", m->id,
                  step_id);
        start_next();
}

void probe_ready(struct daemon *d)
{
        P.d = d;
        P.ready = true;
        start_next();
}

void probe_stop(struct daemon *d)
{
        (void)d;
        P.stopping = true;
        unsigned dropped = 0;
        while (P.q_head) {
                struct probe_job *j = P.q_head;
                P.q_head = j->next;
                job_free(j);
                dropped++;
        }
        P.q_tail = NULL;
        if (dropped)
                log_info("%u probe%s not run (stopping): their steps stay open", dropped,
                         dropped == 1 ? "" : "s");
        for (struct probe_job *j = P.running; j; j = j->next)
                child_kill(&j->child, SIGKILL);
}

void probe_free(struct daemon *d)
{
        (void)d;
        while (P.q_head) {
                struct probe_job *j = P.q_head;
                P.q_head = j->next;
                job_free(j);
        }
        while (P.running) {
                struct probe_job *j = P.running;
                P.running = j->next;
                job_free(j);
        }
        P.q_tail = NULL;
        P.nrunning = 0;
}
