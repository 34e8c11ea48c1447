/* SPDX-License-Identifier: MIT */
/* Fuzz target for the WAL fold and the recovery planner.  Invariants (any
 * violation aborts):
 *   - the fold of any bytes succeeds, is deterministic and self-consistent
 *     (indices in range, every step findable, offsets within the input);
 *   - good_end <= len; a clean fold ends at a line boundary; a torn or
 *     corrupt one names a bad line at or after good_end;
 *   - folding data[0..good_end) again is CLEAN with the same state;
 *   - a non-corrupt fold can be planned; appending the planned records to
 *     data[0..good_end) and planning again yields no new record and the
 *     same open plans (recovery run twice gives the same answer);
 *   - fold_buffer (its fast path for plain lines) and fold_buffer_tree give
 *     the same state and decisions, on the input and on it sealed again. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kairos/fold.h"
#include "kairos/kbuf.h"
#include "kairos/recovery.h"
#include "kairos/wal.h"

#include "../unit/fold_digest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                           \
        do {                                                                                  \
                if (!(cond)) {                                                                \
                        fprintf(stderr, "fuzz_fold: invariant violated: %s (line %d)\n", #cond, \
                                __LINE__);                                                    \
                        abort();                                                              \
                }                                                                             \
        } while (0)

static bool same_str(const char *a, const char *b)
{
        return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

static void check_consistent(const struct fold *f, size_t len)
{
        CHECK(f->good_end <= len);
        CHECK(f->records <= f->lines);
        CHECK(f->legacy_records <= f->records);
        CHECK(f->unknown_ops <= f->records);
        CHECK(f->noperators <= f->records);
        if (f->status != FOLD_CLEAN) {
                CHECK(f->bad_line >= 1 && f->bad_line <= f->lines);
                CHECK(f->bad_offset >= f->good_end && f->bad_offset < len);
                CHECK(f->bad_reason[0] != '\0');
        }
        for (size_t i = 0; i < f->nplans; i++) {
                const struct fold_plan *p = &f->plans[i];
                CHECK(p->plan_id);
                CHECK(fold_find_plan(f, p->plan_id) == p);
                for (size_t j = 0; j < p->nsteps; j++) {
                        CHECK(p->steps[j] < f->nsteps);
                        CHECK(f->steps[p->steps[j]].plan == i);
                }
        }
        for (size_t i = 0; i < f->nsteps; i++) {
                const struct fold_step *s = &f->steps[i];
                CHECK(s->step_id && s->plan < f->nplans);
                const struct fold_step *cur = fold_find_step(f, s->step_id);
                CHECK(cur && strcmp(cur->step_id, s->step_id) == 0);
        }
}

static void check_same(const struct fold *a, const struct fold *b)
{
        CHECK(a->records == b->records && a->legacy_records == b->legacy_records);
        CHECK(a->unknown_ops == b->unknown_ops && a->noperators == b->noperators);
        CHECK(a->nplans == b->nplans && a->nsteps == b->nsteps);
        CHECK(a->good_end == b->good_end);
        for (size_t i = 0; i < a->nplans; i++) {
                const struct fold_plan *p = &a->plans[i], *q = &b->plans[i];
                CHECK(same_str(p->plan_id, q->plan_id) && same_str(p->mandate_id, q->mandate_id));
                CHECK(p->finalized == q->finalized && same_str(p->final_status, q->final_status));
                CHECK(p->nsteps == q->nsteps && p->cycle == q->cycle);
                for (size_t j = 0; j < p->nsteps; j++)
                        CHECK(p->steps[j] == q->steps[j]);
        }
        for (size_t i = 0; i < a->nsteps; i++) {
                const struct fold_step *s = &a->steps[i], *t = &b->steps[i];
                CHECK(same_str(s->step_id, t->step_id) && same_str(s->status, t->status));
                CHECK(same_str(s->observed_pre_hash, t->observed_pre_hash));
                CHECK(same_str(s->post_hash, t->post_hash) && same_str(s->result_hash, t->result_hash));
                CHECK(same_str(s->result_json, t->result_json));
                CHECK(same_str(s->evidence_json, t->evidence_json));
                CHECK(s->executions == t->executions && s->resets == t->resets);
        }
}

static void check_recovery(const struct fold *f, const uint8_t *data)
{
        struct recovery *r = NULL;
        int ret = recovery_plan_fold(f, &r);
        if (f->status == FOLD_CORRUPT) {
                CHECK(ret == -EBADMSG && !r);
                return;
        }
        if (ret == -ENOMEM)
                return;
        CHECK(ret == 0 && r);

        size_t n = recovery_record_count(r);
        CHECK(recovery_record_at(r, n) == NULL);
        for (size_t i = 0; i < r->nplans; i++) {
                const struct recovery_plan *rp = &r->plans[i];
                CHECK(rp->plan < f->nplans && !f->plans[rp->plan].finalized);
                if (rp->outcome == RECOVERY_RESUME)
                        CHECK(rp->resume_step < f->nsteps);
                if (rp->outcome == RECOVERY_PAUSED_REVIEW)
                        CHECK(rp->pause_step && rp->pause_reason);
                if (rp->outcome == RECOVERY_FINALIZED_FAILED || rp->outcome == RECOVERY_FINALIZED_SUCCEEDED)
                        CHECK(rp->has_finalize);
        }

        /* apply the records after the good prefix, as the daemon does */
        struct kbuf b = KBUF_INIT;
        bool encoded = kbuf_append(&b, data, f->good_end) == 0;
        for (size_t i = 0; encoded && i < n; i++) {
                const struct wal_record *rec = recovery_record_at(r, i);
                CHECK(rec);
                encoded = wal_encode(rec, 1776686400000LL + (int64_t)i, &b) == 0;
        }
        if (encoded) {
                struct fold *f2 = NULL;
                struct recovery *r2 = NULL;
                if (fold_buffer(b.data, b.len, &f2) == 0) {
                        CHECK(f2->status == FOLD_CLEAN);
                        CHECK(f2->records == f->records + n);
                        /* as the daemon folds: the file's prefix, then the
                         * records it appended itself (fold_feed_own) */
                        struct fold *f3 = NULL;
                        size_t used = 0, used_own = 0;
                        if (fold_new(&f3) == 0 &&
                            fold_feed(f3, b.data, f->good_end, &used) == 0 &&
                            fold_feed_own(f3, b.data + used, b.len - used, &used_own) == 0) {
                                CHECK(used == f->good_end && used + used_own == b.len);
                                check_same(f2, f3);
                        }
                        fold_free(f3);
                        if (recovery_plan_fold(f2, &r2) == 0) {
                                CHECK(recovery_record_count(r2) == 0);
                                size_t open = 0;
                                for (size_t i = 0; i < r->nplans; i++) {
                                        const struct recovery_plan *a = &r->plans[i];
                                        if (a->outcome != RECOVERY_RESUME &&
                                            a->outcome != RECOVERY_PAUSED_REVIEW)
                                                continue;
                                        CHECK(open < r2->nplans);
                                        const struct recovery_plan *c = &r2->plans[open++];
                                        CHECK(c->plan == a->plan && c->outcome == a->outcome);
                                        if (a->outcome == RECOVERY_RESUME)
                                                CHECK(c->resume_step == a->resume_step);
                                        else
                                                CHECK(same_str(c->pause_step, a->pause_step) &&
                                                      same_str(c->pause_reason, a->pause_reason));
                                }
                                CHECK(open == r2->nplans);
                        }
                        recovery_free(r2);
                }
                fold_free(f2);
        }
        kbuf_free(&b);
        recovery_free(r);
}

/* fold_buffer (with its fast path) and fold_buffer_tree (without) agree on
 * data[0..len): the same state, the same recovery decisions. */
static void check_fast_path(const char *data, size_t len)
{
        struct fold *a = NULL, *b = NULL;
        if (fold_buffer(data, len, &a) == 0 && fold_buffer_tree(data, len, &b) == 0) {
                CHECK(b->fast_records == 0 && a->fast_records <= a->records);
                char *da = fold_digest_full(a), *db = fold_digest_full(b);
                CHECK(da && db && strcmp(da, db) == 0);
                free(da);
                free(db);
        }
        fold_free(a);
        fold_free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        struct fold *f = NULL, *again = NULL, *prefix = NULL;

        if (fold_buffer((const char *)data, size, &f) < 0)
                return 0; /* -ENOMEM only */
        check_consistent(f, size);
        CHECK(f->good_end == 0 || data[f->good_end - 1] == '\n');
        if (f->status == FOLD_CLEAN && f->good_end < size) {
                /* only blank lines after the last record */
                for (size_t i = f->good_end; i < size; i++)
                        CHECK(data[i] == ' ' || data[i] == '\t' || data[i] == '\r' || data[i] == '\n');
        }

        if (fold_buffer((const char *)data, size, &again) == 0) {
                CHECK(again->status == f->status && again->bad_offset == f->bad_offset);
                check_same(f, again);
                fold_free(again);
        }

        if (fold_buffer((const char *)data, f->good_end, &prefix) == 0) {
                CHECK(prefix->status == FOLD_CLEAN);
                check_same(f, prefix);
                fold_free(prefix);
        }

        /* hostile bytes fed as if this process wrote them: no memory error,
         * a consistent fold (what it accepts is not checked: it trusts) */
        struct fold *own = NULL;
        size_t used = 0;
        if (fold_new(&own) == 0) {
                (void)fold_feed_own(own, (const char *)data, size, &used);
                check_consistent(own, size);
                fold_free(own);
        }

        check_recovery(f, data);
        fold_free(f);

        /* the fast path against the tree, on the bytes as they are and with
         * every line sealed again (so that the changes a fuzzer makes reach
         * the parsers instead of failing their crc) */
        check_fast_path((const char *)data, size);
        struct kbuf sealed = KBUF_INIT;
        if (fold_reseal((const char *)data, size, &sealed) == 0)
                check_fast_path(sealed.data, sealed.len);
        kbuf_free(&sealed);
        return 0;
}
