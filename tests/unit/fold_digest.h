/* SPDX-License-Identifier: MIT */
/* Shared by test_fold.c and tests/fuzz/fuzz_fold.c: everything a fold holds
 * and what recovery decides from it, as text, to compare fold_buffer (its
 * fast path for plain lines) with fold_buffer_tree (every line through the
 * general parser) byte for byte; and lines sealed again after a change, so
 * that a changed line reaches the parsers instead of failing its crc. */
#pragma once

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kairos/crcline.h"
#include "kairos/fold.h"
#include "kairos/kbuf.h"
#include "kairos/recovery.h"
#include "kairos/wal.h"

static void fd_str(struct kbuf *d, const char *k, const char *v)
{
        if (v)
                kbuf_printf(d, " %s=\"%s\"", k, v);
        else
                kbuf_printf(d, " %s=-", k);
}

static void fd_step(struct kbuf *d, const struct fold_step *s)
{
        kbuf_printf(d, "step plan=%zu state=%d len=%zu exit=%d/%d/%d rec=%d exec=%u resets=%u "
                       "intr=%u retries=%u due=%lld waiting=%d",
                    s->plan, (int)s->state, s->result_len, s->has_exit_status, s->exit_status,
                    s->exit_signal, s->recovered, s->executions, s->resets,
                    s->interrupted_execution, s->retries, s->retry_due_ms, s->retry_waiting);
        fd_str(d, "id", s->step_id);
        fd_str(d, "plan_id", s->plan_id);
        fd_str(d, "tool", s->tool);
        fd_str(d, "params", s->params_hash);
        fd_str(d, "pre", s->pre_hash);
        fd_str(d, "exp_post", s->expected_post_hash);
        fd_str(d, "idem", s->idem_key);
        fd_str(d, "status", s->status);
        fd_str(d, "obs", s->observed_pre_hash);
        fd_str(d, "post", s->post_hash);
        fd_str(d, "rhash", s->result_hash);
        fd_str(d, "result", s->result_json);
        fd_str(d, "evidence", s->evidence_json);
        fd_str(d, "eclass", s->error_class);
        fd_str(d, "emsg", s->error_msg);
        fd_str(d, "stderr", s->stderr_tail);
        fd_str(d, "reason", s->reason);
        fd_str(d, "started", s->started_ts);
        fd_str(d, "ended", s->ended_ts);
        fd_str(d, "istarted", s->interrupted_started_ts);
        fd_str(d, "iended", s->interrupted_ended_ts);
        fd_str(d, "decided", s->decided_ts);
        fd_str(d, "dstatus", s->decided_status);
        fd_str(d, "devidence", s->decided_evidence_json);
        fd_str(d, "carried", s->carried_from);
        kbuf_putc(d, '\n');
}

/* What recovery decides from f (the WAL alone): outcomes and the records
 * it would append, encoded. */
static void fd_recovery(struct kbuf *d, const struct fold *f)
{
        struct recovery *r = NULL;
        int ret = recovery_plan_fold(f, &r);
        kbuf_printf(d, "recovery %d\n", ret);
        if (ret < 0)
                return;
        for (size_t i = 0; i < r->nplans; i++) {
                const struct recovery_plan *rp = &r->plans[i];
                kbuf_printf(d, "rplan %zu %s resume=%zu", rp->plan,
                            recovery_outcome_name(rp->outcome), rp->resume_step);
                fd_str(d, "pause", rp->pause_step);
                fd_str(d, "why", rp->pause_reason);
                fd_str(d, "probe", rp->probe_step);
                kbuf_putc(d, '\n');
        }
        for (size_t i = 0; i < recovery_record_count(r); i++) {
                int e = wal_encode(recovery_record_at(r, i), 1776686400000LL, d);
                if (e < 0)
                        kbuf_printf(d, "encode %d\n", e);
        }
        recovery_free(r);
}

/* Everything f holds, then recovery's decisions; free() the result. */
static char *fold_digest_full(const struct fold *f)
{
        struct kbuf d = KBUF_INIT;
        const struct fold_mandate *m = &f->mandate;

        kbuf_printf(&d, "status=%s lines=%zu records=%zu legacy=%zu unknown=%zu owner=%zu "
                        "good_end=%zu bad=%zu@%zu \"%s\" down=%lld\n",
                    fold_status_name(f->status), f->lines, f->records, f->legacy_records,
                    f->unknown_ops, f->owner_records, f->good_end, f->bad_line, f->bad_offset,
                    f->bad_reason, (long long)f->down_ms);
        fd_str(&d, "first", f->first_ts);
        fd_str(&d, "last", f->last_ts);
        kbuf_printf(&d, "\nmandate line=%zu retry=%lld", m->line, m->retry);
        fd_str(&d, "id", m->mandate_id);
        fd_str(&d, "schedule", m->schedule);
        fd_str(&d, "fired", m->fired_at);
        fd_str(&d, "goal", m->goal);
        fd_str(&d, "retry_of", m->retry_of);
        fd_str(&d, "ts", m->ts);
        kbuf_putc(&d, '\n');
        for (size_t i = 0; i < f->nplans; i++) {
                const struct fold_plan *p = &f->plans[i];
                kbuf_printf(&d, "plan cycle=%lld fin=%d state=%d line=%zu", p->cycle,
                            p->finalized, (int)p->final_state, p->line);
                fd_str(&d, "id", p->plan_id);
                fd_str(&d, "mandate", p->mandate_id);
                fd_str(&d, "hash", p->plan_hash);
                fd_str(&d, "fstatus", p->final_status);
                fd_str(&d, "freason", p->final_reason);
                fd_str(&d, "orphan", p->orphan_reason);
                for (size_t j = 0; j < p->nsteps; j++)
                        kbuf_printf(&d, " s%zu", p->steps[j]);
                kbuf_putc(&d, '\n');
        }
        for (size_t i = 0; i < f->nsteps; i++)
                fd_step(&d, &f->steps[i]);
        for (size_t i = 0; i < f->noperators; i++) {
                const struct fold_operator *o = &f->operators[i];
                kbuf_printf(&d, "operator uid=%lld line=%zu", o->uid, o->line);
                fd_str(&d, "mandate", o->mandate_id);
                fd_str(&d, "action", o->action);
                fd_str(&d, "step", o->step_id);
                fd_str(&d, "reason", o->reason);
                fd_str(&d, "ts", o->ts);
                kbuf_putc(&d, '\n');
        }
        for (size_t i = 0; i < f->nretries; i++) {
                const struct fold_retry *t = &f->retries[i];
                kbuf_printf(&d, "retry step=%zu attempt=%lld due=%lld", t->step, t->attempt,
                            t->due_ms);
                fd_str(&d, "eclass", t->error_class);
                fd_str(&d, "emsg", t->error_msg);
                fd_str(&d, "started", t->started_ts);
                fd_str(&d, "ended", t->ended_ts);
                fd_str(&d, "ts", t->ts);
                kbuf_putc(&d, '\n');
        }
        fd_recovery(&d, f);
        return kbuf_steal(&d);
}

/* data[0..len) with every line that ends in '}' sealed (again): a crc field
 * that is there gets the right value, a line without one gets one.  Other
 * lines are copied as they are. */
static int fold_reseal(const char *data, size_t len, struct kbuf *out)
{
        size_t pos = 0;
        int r = 0;
        while (pos < len && r >= 0) {
                const char *l = data + pos;
                const char *nl = memchr(l, '\n', len - pos);
                size_t n = nl ? (size_t)(nl - l) : len - pos;
                size_t body = n;
                /* a well-formed crc suffix: ,"crc":"xxxxxxxx"} (18 bytes) */
                if (n >= 19 && memcmp(l + n - 18, ",\"crc\":\"", 8) == 0 && l[n - 2] == '"' &&
                    l[n - 1] == '}')
                        body = n - 18;
                else if (n >= 2 && l[n - 1] == '}')
                        body = n - 1;
                else
                        body = SIZE_MAX;
                if (body == SIZE_MAX) {
                        r = kbuf_append(out, l, n);
                } else {
                        size_t start = out->len;
                        if ((r = kbuf_append(out, l, body)) >= 0 && (r = kbuf_putc(out, '}')) >= 0)
                                r = crcline_seal(out, start);
                        /* (crcline_seal appends its own '\n') */
                        if (r >= 0 && out->len > 0 && out->data[out->len - 1] == '\n')
                                out->len--;
                }
                if (r >= 0 && nl)
                        r = kbuf_putc(out, '\n');
                pos += n + (nl ? 1 : 0);
        }
        return r < 0 ? r : 0;
}
