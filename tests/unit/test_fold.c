/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmocka.h>
#include <zlib.h>

#include "kairos/fold.h"
#include "kairos/kbuf.h"
#include "kairos/wal.h"

#include "fold_digest.h"

/* ------------------------------------------------------------ helpers */

/* Append obj (a JSON object without crc) as a kairos line: the crc is the
 * CRC-32 of obj itself, which is the line without ,"crc":"…". */
static void rec(struct kbuf *b, const char *obj)
{
        size_t n = strlen(obj);
        assert_true(n >= 2 && obj[n - 1] == '}');
        uint32_t crc = (uint32_t)crc32(0L, (const unsigned char *)obj, (uInt)n);
        assert_int_equal(kbuf_append(b, obj, n - 1), 0);
        assert_int_equal(kbuf_printf(b, ",\"crc\":\"%08x\"}\n", crc), 0);
}

/* A legacy line (the original wrote no crc). */
static void legacy(struct kbuf *b, const char *obj)
{
        assert_int_equal(kbuf_puts(b, obj), 0);
        assert_int_equal(kbuf_putc(b, '\n'), 0);
}

static struct fold *fold_kbuf(const struct kbuf *b, size_t len)
{
        struct fold *f = NULL;
        assert_int_equal(fold_buffer(b->data, len, &f), 0);
        assert_non_null(f);
        return f;
}

static struct fold *fold_str(const char *s)
{
        struct fold *f = NULL;
        assert_int_equal(fold_buffer(s, strlen(s), &f), 0);
        assert_non_null(f);
        return f;
}

static void put_opt(struct kbuf *d, const char *k, const char *v)
{
        kbuf_printf(d, "%s=%s;", k, v ? v : "(null)");
}

/* Everything the fold holds, as text (to compare two folds). */
static char *digest(const struct fold *f)
{
        struct kbuf d = KBUF_INIT;

        kbuf_printf(&d, "records=%zu legacy=%zu unknown=%zu\n", f->records, f->legacy_records,
                    f->unknown_ops);
        for (size_t i = 0; i < f->nplans; i++) {
                const struct fold_plan *p = &f->plans[i];
                kbuf_printf(&d, "plan %s cycle=%lld fin=%d line=%zu ", p->plan_id, p->cycle,
                            p->finalized, p->line);
                put_opt(&d, "mandate", p->mandate_id);
                put_opt(&d, "hash", p->plan_hash);
                put_opt(&d, "fstatus", p->final_status);
                put_opt(&d, "freason", p->final_reason);
                put_opt(&d, "orphan", p->orphan_reason);
                for (size_t j = 0; j < p->nsteps; j++)
                        kbuf_printf(&d, " s%zu", p->steps[j]);
                kbuf_putc(&d, '\n');
        }
        for (size_t i = 0; i < f->nsteps; i++) {
                const struct fold_step *s = &f->steps[i];
                kbuf_printf(&d, "step %s plan=%zu exec=%u resets=%u rec=%d ", s->step_id, s->plan,
                            s->executions, s->resets, s->recovered);
                put_opt(&d, "plan_id", s->plan_id);
                put_opt(&d, "tool", s->tool);
                put_opt(&d, "params", s->params_hash);
                put_opt(&d, "pre", s->pre_hash);
                put_opt(&d, "exp_post", s->expected_post_hash);
                put_opt(&d, "idem", s->idem_key);
                put_opt(&d, "status", s->status);
                put_opt(&d, "obs", s->observed_pre_hash);
                put_opt(&d, "post", s->post_hash);
                put_opt(&d, "result_hash", s->result_hash);
                put_opt(&d, "result", s->result_json);
                put_opt(&d, "evidence", s->evidence_json);
                put_opt(&d, "eclass", s->error_class);
                put_opt(&d, "emsg", s->error_msg);
                put_opt(&d, "reason", s->reason);
                kbuf_putc(&d, '\n');
        }
        for (size_t i = 0; i < f->noperators; i++) {
                const struct fold_operator *o = &f->operators[i];
                kbuf_printf(&d, "operator uid=%lld line=%zu ", o->uid, o->line);
                put_opt(&d, "mandate", o->mandate_id);
                put_opt(&d, "action", o->action);
                put_opt(&d, "step", o->step_id);
                put_opt(&d, "reason", o->reason);
                put_opt(&d, "ts", o->ts);
                kbuf_putc(&d, '\n');
        }
        return kbuf_steal(&d);
}

#define TS "\"ts\":\"2026-04-20T12:00:00.123Z\""
#define PLAN(id, cycle, steps)                                                                   \
        "{\"op\":\"plan_commit\",\"plan_id\":\"" id "\",\"mandate_id\":\"mnd_x\",\"cycle\":" #cycle \
        ",\"plan_hash\":\"sha256-h" id "\",\"steps\":[" steps "]," TS "}"
#define STEP(id)                                                                                 \
        "{\"step_id\":\"" id "\",\"tool\":\"ooda.t\",\"params_hash\":\"ph-" id                    \
        "\",\"pre_hash\":\"pre-" id "\",\"expected_post_hash\":\"post-" id "\"}"
#define APPEND(sid, pid)                                                                         \
        "{\"op\":\"append\",\"step_id\":\"" sid "\",\"plan_id\":\"" pid "\",\"idem_key\":\"mnd_x/" sid \
        "\",\"status\":\"pending\"," TS "}"
#define EXECUTING(sid)                                                                           \
        "{\"op\":\"transition\",\"step_id\":\"" sid "\",\"status\":\"executing\",\"pre_hash\":\"obs-" sid \
        "\"," TS "}"
#define COMPLETED(sid)                                                                           \
        "{\"op\":\"transition\",\"step_id\":\"" sid "\",\"status\":\"completed\",\"post_hash\":\"ph-" sid \
        "\",\"result_hash\":\"rh-" sid "\",\"result\":{\"ok\":true,\"n\":12345678901234567890}," TS "}"
#define FINALIZE(pid, st) "{\"op\":\"plan_finalize\",\"plan_id\":\"" pid "\",\"status\":\"" st "\"," TS "}"

/* A realistic multi-plan WAL holding every op. */
static void realistic_wal(struct kbuf *b)
{
        /* cycle 1: three steps, all completed, finalized */
        rec(b, PLAN("plan_a", 1, STEP("observe_001") "," STEP("act_001") "," STEP("reflect_001")));
        rec(b, APPEND("observe_001", "plan_a"));
        rec(b, EXECUTING("observe_001"));
        rec(b, COMPLETED("observe_001"));
        rec(b, APPEND("act_001", "plan_a"));
        rec(b, EXECUTING("act_001"));
        rec(b, "{\"op\":\"transition\",\"step_id\":\"act_001\",\"status\":\"completed\",\"post_hash\":"
               "\"p\",\"result_hash\":\"r\",\"recovered\":true,\"evidence\":{\"reason\":"
               "\"wal_recorded_completion\",\"result_hash\":null}," TS "}");
        rec(b, APPEND("reflect_001", "plan_a"));
        rec(b, EXECUTING("reflect_001"));
        rec(b, COMPLETED("reflect_001"));
        rec(b, FINALIZE("plan_a", "succeeded"));
        /* cycle 2: a failed step, finalized failed */
        rec(b, PLAN("plan_b", 2, STEP("observe_002") "," STEP("act_002")));
        rec(b, APPEND("observe_002", "plan_b"));
        rec(b, EXECUTING("observe_002"));
        rec(b, "{\"op\":\"transition\",\"step_id\":\"observe_002\",\"status\":\"failed\","
               "\"error_class\":\"HandlerExit\",\"error_msg\":\"exit 3: caf\xc3\xa9 \\u00e9 \\\"q\\\"\"," TS "}");
        rec(b, "{\"op\":\"plan_finalize\",\"plan_id\":\"plan_b\",\"status\":\"failed\",\"reason\":"
               "\"step_failed\"," TS "}");
        /* cycle 3: reset, review, operator, an unknown op; left open */
        rec(b, PLAN("plan_c", 3, STEP("observe_003") "," STEP("act_003")));
        rec(b, APPEND("observe_003", "plan_c"));
        rec(b, EXECUTING("observe_003"));
        rec(b, "{\"op\":\"transition\",\"step_id\":\"observe_003\",\"status\":\"pending\",\"reset\":true," TS "}");
        rec(b, EXECUTING("observe_003"));
        rec(b, "{\"op\":\"transition\",\"step_id\":\"observe_003\",\"status\":\"needs_review\",\"reason\":"
               "\"interrupted_during_execution\",\"evidence\":{\"reason\":\"interrupted_during_execution\","
               "\"status\":\"executing\",\"observed_pre_hash\":\"o\",\"expected_pre_hash\":null}," TS "}");
        rec(b, "{\"op\":\"operator\",\"mandate_id\":\"mnd_x\",\"action\":\"resolve_done\",\"step_id\":"
               "\"observe_003\",\"uid\":1000,\"reason\":\"checked by hand\"," TS "}");
        rec(b, "{\"op\":\"future_op\",\"x\":[1,2,{\"y\":null}]," TS "}");
        rec(b, COMPLETED("observe_003"));
        rec(b, APPEND("act_003", "plan_c"));
}

/* ------------------------------------------------------------ basics */

static void test_empty(void **state)
{
        (void)state;
        struct fold *f = fold_str("");
        assert_int_equal(f->status, FOLD_CLEAN);
        assert_int_equal(f->nplans, 0);
        assert_int_equal(f->records, 0);
        assert_int_equal(f->good_end, 0);
        fold_free(f);

        assert_int_equal(fold_buffer(NULL, 0, &f), 0);
        assert_int_equal(f->status, FOLD_CLEAN);
        fold_free(f);
        fold_free(NULL);
}

static void test_realistic_state(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        realistic_wal(&b);
        struct fold *f = fold_kbuf(&b, b.len);

        assert_int_equal(f->status, FOLD_CLEAN);
        assert_int_equal(f->records, 26);
        assert_int_equal(f->lines, 26);
        assert_int_equal(f->legacy_records, 0);
        assert_int_equal(f->unknown_ops, 1);
        assert_int_equal(f->good_end, b.len);
        assert_int_equal(f->nplans, 3);
        assert_int_equal(f->nsteps, 7);

        /* plans vs plans not finalized */
        assert_true(f->plans[0].finalized);
        assert_string_equal(f->plans[0].final_status, "succeeded");
        assert_null(f->plans[0].final_reason);
        assert_true(f->plans[1].finalized);
        assert_string_equal(f->plans[1].final_status, "failed");
        assert_string_equal(f->plans[1].final_reason, "step_failed");
        assert_false(f->plans[2].finalized);
        assert_null(f->plans[2].final_status);
        assert_string_equal(f->plans[2].plan_id, "plan_c");
        assert_int_equal(f->plans[2].cycle, 3);
        assert_string_equal(f->plans[2].mandate_id, "mnd_x");
        assert_string_equal(f->plans[2].plan_hash, "sha256-hplan_c");
        assert_int_equal(f->plans[2].line, 17);
        assert_null(f->plans[2].orphan_reason);
        assert_int_equal(f->plans[0].nsteps, 3);

        const struct fold_step *s = fold_find_step(f, "act_001");
        assert_non_null(s);
        assert_string_equal(s->status, "completed");
        assert_string_equal(s->tool, "ooda.t");
        assert_string_equal(s->params_hash, "ph-act_001");
        assert_string_equal(s->pre_hash, "pre-act_001");
        assert_string_equal(s->expected_post_hash, "post-act_001");
        assert_string_equal(s->idem_key, "mnd_x/act_001");
        assert_string_equal(s->observed_pre_hash, "obs-act_001");
        assert_string_equal(s->post_hash, "p");
        assert_true(s->recovered);
        assert_string_equal(s->evidence_json, "{\"reason\":\"wal_recorded_completion\",\"result_hash\":null}");
        assert_int_equal(s->executions, 1);
        assert_ptr_equal(&f->plans[s->plan], fold_find_plan(f, "plan_a"));
        assert_true(fold_step_finalized(s));

        s = fold_find_step(f, "observe_001");
        assert_string_equal(s->result_json, "{\"ok\":true,\"n\":12345678901234567890}");
        assert_false(s->recovered);

        s = fold_find_step(f, "observe_002");
        assert_string_equal(s->status, "failed");
        assert_string_equal(s->error_class, "HandlerExit");
        assert_string_equal(s->error_msg, "exit 3: caf\xc3\xa9 \xc3\xa9 \"q\"");
        assert_true(fold_step_finalized(s));
        s = fold_find_step(f, "act_002");
        assert_null(s->status);
        assert_false(fold_step_finalized(s));

        s = fold_find_step(f, "observe_003");
        assert_string_equal(s->status, "completed");
        assert_string_equal(s->reason, "interrupted_during_execution");
        assert_int_equal(s->executions, 2);
        assert_int_equal(s->resets, 1);

        s = fold_find_step(f, "act_003");
        assert_string_equal(s->status, "pending");
        assert_false(fold_step_finalized(s));

        assert_int_equal(f->noperators, 1);
        assert_string_equal(f->operators[0].action, "resolve_done");
        assert_string_equal(f->operators[0].mandate_id, "mnd_x");
        assert_string_equal(f->operators[0].step_id, "observe_003");
        assert_string_equal(f->operators[0].reason, "checked by hand");
        assert_string_equal(f->operators[0].ts, "2026-04-20T12:00:00.123Z");
        assert_int_equal(f->operators[0].uid, 1000);
        assert_int_equal(f->operators[0].line, 23);

        assert_null(fold_find_step(f, "nope"));
        assert_null(fold_find_plan(f, "nope"));
        fold_free(f);
        kbuf_free(&b);
}

static void test_orphan_append(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        rec(&b, APPEND("s9", "plan_z"));
        rec(&b, "{\"op\":\"append\",\"step_id\":\"s8\",\"idem_key\":\"k8\",\"status\":\"pending\"," TS "}");
        rec(&b, APPEND("s7", "plan_z"));
        rec(&b, EXECUTING("s7"));
        struct fold *f = fold_kbuf(&b, b.len);

        assert_int_equal(f->status, FOLD_CLEAN);
        assert_int_equal(f->nplans, 2);
        const struct fold_plan *p = fold_find_plan(f, "plan_z");
        assert_non_null(p);
        assert_string_equal(p->mandate_id, "unknown");
        assert_string_equal(p->orphan_reason, "orphan_steps_detected");
        assert_false(p->finalized);
        assert_int_equal(p->nsteps, 2); /* s9 and s7 share it */
        assert_string_equal(f->steps[p->steps[0]].step_id, "s9");
        assert_string_equal(f->steps[p->steps[1]].step_id, "s7");
        assert_string_equal(f->steps[p->steps[1]].status, "executing");

        p = fold_find_plan(f, "__orphan_s8");
        assert_non_null(p);
        assert_string_equal(p->orphan_reason, "orphan_steps_detected");
        const struct fold_step *s = fold_find_step(f, "s8");
        assert_string_equal(s->idem_key, "k8");
        assert_string_equal(s->status, "pending");
        assert_string_equal(s->plan_id, "__orphan_s8");
        fold_free(f);
        kbuf_free(&b);
}

static void test_duplicate_plan_commit(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        rec(&b, PLAN("plan_a", 1, STEP("s1") "," STEP("s2")));
        rec(&b, PLAN("plan_b", 1, STEP("t1")));
        rec(&b, FINALIZE("plan_a", "abandoned"));
        rec(&b, PLAN("plan_a", 2, STEP("s3")));
        struct fold *f = fold_kbuf(&b, b.len);

        assert_int_equal(f->nplans, 2);
        assert_string_equal(f->plans[0].plan_id, "plan_a"); /* kept its position */
        assert_string_equal(f->plans[1].plan_id, "plan_b");
        assert_int_equal(f->plans[0].cycle, 2);
        assert_int_equal(f->plans[0].nsteps, 1);
        assert_string_equal(f->steps[f->plans[0].steps[0]].step_id, "s3");
        assert_false(f->plans[0].finalized); /* replaced: a new plan record */
        assert_int_equal(f->plans[0].line, 4);
        fold_free(f);
        kbuf_free(&b);
}

static void test_step_takeover(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        rec(&b, PLAN("plan_a", 1, STEP("s1")));
        rec(&b, EXECUTING("s1"));
        rec(&b, PLAN("plan_b", 1, STEP("s1")));
        rec(&b, COMPLETED("s1"));
        struct fold *f = fold_kbuf(&b, b.len);

        assert_int_equal(f->nsteps, 2);
        const struct fold_step *old = &f->steps[f->plans[0].steps[0]];
        const struct fold_step *cur = &f->steps[f->plans[1].steps[0]];
        assert_ptr_equal(fold_find_step(f, "s1"), cur);
        assert_string_equal(old->status, "executing");
        assert_null(old->post_hash);
        assert_string_equal(cur->status, "completed");
        assert_null(cur->observed_pre_hash);
        assert_string_equal(cur->plan_id, "plan_b");
        fold_free(f);
        kbuf_free(&b);
}

static void test_unknown_step_and_plan_ignored(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        rec(&b, PLAN("plan_a", 1, STEP("s1")));
        rec(&b, EXECUTING("ghost"));
        rec(&b, COMPLETED("ghost"));
        rec(&b, FINALIZE("plan_ghost", "succeeded"));
        struct fold *f = fold_kbuf(&b, b.len);

        assert_int_equal(f->status, FOLD_CLEAN);
        assert_int_equal(f->records, 4);
        assert_int_equal(f->nplans, 1);
        assert_int_equal(f->nsteps, 1);
        assert_null(fold_find_step(f, "ghost"));
        assert_null(fold_find_plan(f, "plan_ghost"));
        assert_false(f->plans[0].finalized);
        assert_null(f->steps[0].status);
        fold_free(f);
        kbuf_free(&b);
}

static void test_mandate_record(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        struct fold *f = fold_kbuf(&b, 0);
        assert_int_equal(f->mandate.line, 0);
        assert_null(f->mandate.schedule);
        fold_free(f);
        rec(&b, "{\"op\":\"mandate\",\"mandate_id\":\"mnd_x\",\"schedule\":\"daily\","
                "\"fired_at\":\"2026-04-20T12:00:00Z\",\"goal\":\"g\",\"ts\":\"t\"}");
        rec(&b, PLAN("plan_a", 1, STEP("s1")));
        f = fold_kbuf(&b, b.len);
        assert_int_equal(f->status, FOLD_CLEAN);
        assert_int_equal(f->unknown_ops, 0);
        assert_int_equal(f->mandate.line, 1);
        assert_string_equal(f->mandate.mandate_id, "mnd_x");
        assert_string_equal(f->mandate.schedule, "daily");
        assert_string_equal(f->mandate.fired_at, "2026-04-20T12:00:00Z");
        assert_string_equal(f->mandate.goal, "g");
        assert_null(f->mandate.retry_of);
        assert_int_equal(f->mandate.retry, 0);
        assert_int_equal(f->nplans, 1);
        fold_free(f);
        /* a retry names the mandate it retries and its number */
        rec(&b, "{\"op\":\"mandate\",\"mandate_id\":\"mnd_y\",\"schedule\":\"daily\","
                "\"fired_at\":\"2026-04-20T12:00:00Z\",\"retry_of\":\"mnd_x\",\"retry\":3,"
                "\"ts\":\"t\"}");
        f = fold_kbuf(&b, b.len);
        assert_int_equal(f->status, FOLD_CLEAN);
        assert_string_equal(f->mandate.retry_of, "mnd_x");
        assert_int_equal(f->mandate.retry, 3);
        fold_free(f);
        kbuf_free(&b);
}

static void test_multi_cycle(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        rec(&b, PLAN("plan_1", 1, STEP("observe_001") "," STEP("act_001")));
        rec(&b, COMPLETED("observe_001"));
        rec(&b, COMPLETED("act_001"));
        rec(&b, FINALIZE("plan_1", "succeeded"));
        rec(&b, PLAN("plan_2", 2, STEP("observe_002") "," STEP("act_002")));
        rec(&b, EXECUTING("observe_002"));
        struct fold *f = fold_kbuf(&b, b.len);

        assert_int_equal(f->nplans, 2);
        assert_int_equal(f->plans[0].cycle, 1);
        assert_int_equal(f->plans[1].cycle, 2);
        assert_true(f->plans[0].finalized);
        assert_false(f->plans[1].finalized);
        assert_string_equal(fold_find_step(f, "observe_001")->status, "completed");
        assert_string_equal(fold_find_step(f, "observe_002")->status, "executing");
        assert_null(fold_find_step(f, "act_002")->status);
        assert_int_equal(fold_find_step(f, "observe_002")->plan, 1);
        fold_free(f);
        kbuf_free(&b);
}

static void test_fields_applied_only_when_present(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        rec(&b, PLAN("plan_a", 1, STEP("s1")));
        rec(&b, COMPLETED("s1"));
        /* a later needs_review without hashes keeps them; unknown keys ignored */
        rec(&b, "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"needs_review\",\"extra\":{\"a\":1},"
                "\"post_hash\":null," TS "}");
        rec(&b, "{\"op\":\"transition\",\"step_id\":\"s1\"," TS "}");
        struct fold *f = fold_kbuf(&b, b.len);

        const struct fold_step *s = fold_find_step(f, "s1");
        assert_string_equal(s->status, "needs_review");
        assert_string_equal(s->post_hash, "ph-s1");
        assert_string_equal(s->result_hash, "rh-s1");
        assert_null(s->reason);
        assert_false(fold_step_finalized(s)); /* needs_review is not final */
        fold_free(f);
        kbuf_free(&b);
}

static void test_crlf_and_blank_lines(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        struct kbuf c = KBUF_INIT;
        rec(&c, PLAN("plan_a", 1, STEP("s1")));
        /* the crc line with CRLF */
        kbuf_append(&b, c.data, c.len - 1);
        kbuf_puts(&b, "\r\n\n   \n\t\r\n");
        kbuf_puts(&b, "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"executing\",\"pre_hash\":\"o\"," TS "}\r\n");
        kbuf_puts(&b, "\r\n");
        struct fold *f = fold_kbuf(&b, b.len);

        assert_int_equal(f->status, FOLD_CLEAN);
        assert_int_equal(f->records, 2);
        assert_int_equal(f->legacy_records, 1);
        assert_int_equal(f->lines, 6);
        assert_string_equal(fold_find_step(f, "s1")->observed_pre_hash, "o");
        /* good_end: just past the last record's newline */
        assert_int_equal(f->good_end, b.len - 2);
        fold_free(f);
        kbuf_free(&b);
        kbuf_free(&c);
}

static void test_legacy_lines(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        legacy(&b, PLAN("plan_a", 1, STEP("s1")));
        legacy(&b, "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"executing\",\"pre_hash\":\"o\",\"ts\":\"t\"}");
        rec(&b, COMPLETED("s1"));
        legacy(&b, " { \"op\" : \"plan_finalize\" , \"plan_id\" : \"plan_a\" , \"status\" : \"succeeded\" , \"ts\" : 1 } ");
        struct fold *f = fold_kbuf(&b, b.len);

        assert_int_equal(f->status, FOLD_CLEAN);
        assert_int_equal(f->records, 4);
        assert_int_equal(f->legacy_records, 3);
        assert_true(f->plans[0].finalized);
        assert_string_equal(fold_find_step(f, "s1")->status, "completed");
        fold_free(f);
        kbuf_free(&b);
}

/* A legacy line must end with ts, and any crc field must be exact. */
static void expect_bad_middle_line(const char *bad, const char *reason_part)
{
        struct kbuf b = KBUF_INIT;
        rec(&b, PLAN("plan_a", 1, STEP("s1")));
        size_t off = b.len;
        legacy(&b, bad);
        rec(&b, COMPLETED("s1"));
        struct fold *f = fold_kbuf(&b, b.len);

        assert_int_equal(f->status, FOLD_CORRUPT);
        assert_int_equal(f->bad_line, 2);
        assert_int_equal(f->bad_offset, off);
        assert_int_equal(f->good_end, off);
        assert_int_equal(f->records, 1);
        assert_null(fold_find_step(f, "s1")->status); /* nothing after it is folded */
        if (reason_part && !strstr(f->bad_reason, reason_part))
                fail_msg("reason '%s' lacks '%s'", f->bad_reason, reason_part);
        fold_free(f);
        kbuf_free(&b);
}

static void test_bad_lines(void **state)
{
        (void)state;
        /* legacy, but ts not last (e.g. a flipped bit in the crc key name) */
        expect_bad_middle_line("{\"op\":\"append\",\"step_id\":\"s1\",\"ts\":\"t\",\"crd\":\"0badc0de\"}", "ts");
        expect_bad_middle_line("{\"op\":\"append\",\"step_id\":\"s1\"}", "ts");
        expect_bad_middle_line("{}", "ts");
        /* crc: uppercase hex, wrong length, not a string, not last, duplicated */
        expect_bad_middle_line("{\"op\":\"append\",\"ts\":\"t\",\"crc\":\"0BADC0DE\"}", "crc");
        expect_bad_middle_line("{\"op\":\"append\",\"ts\":\"t\",\"crc\":\"0badc0d\"}", "crc");
        expect_bad_middle_line("{\"op\":\"append\",\"ts\":\"t\",\"crc\":\"0badc0de0\"}", "crc");
        expect_bad_middle_line("{\"op\":\"append\",\"ts\":\"t\",\"crc\":12345678}", "crc");
        expect_bad_middle_line("{\"op\":\"append\",\"crc\":\"0badc0de\",\"ts\":\"t\"}", "crc");
        expect_bad_middle_line("{\"op\":\"append\",\"ts\":\"t\",\"crc\":\"0badc0de\"}", "crc mismatch");
        /* not JSON, not an object (§13 bug 2) */
        expect_bad_middle_line("garbage", "JSON");
        expect_bad_middle_line("{\"op\":\"append\",\"ts\":\"t\"", "JSON");
        expect_bad_middle_line("[1,2]", "object");
        expect_bad_middle_line("\"str\"", "object");
        expect_bad_middle_line("42", "object");
        expect_bad_middle_line("null", "object");

        /* NUL bytes in the middle of the file are not a torn tail */
        struct kbuf b = KBUF_INIT;
        rec(&b, PLAN("plan_a", 1, STEP("s1")));
        size_t off = b.len;
        kbuf_append(&b, "\0\0\0\n", 4);
        rec(&b, COMPLETED("s1"));
        struct fold *f = fold_kbuf(&b, b.len);
        assert_int_equal(f->status, FOLD_CORRUPT);
        assert_int_equal(f->bad_offset, off);
        fold_free(f);
        kbuf_free(&b);
}

static void test_crc_line_with_two_crc_fields(void **state)
{
        (void)state;
        /* valid crc suffix, but another top-level crc member before it */
        struct kbuf b = KBUF_INIT;
        rec(&b, "{\"op\":\"append\",\"crc\":\"00000000\",\"ts\":\"t\"}");
        rec(&b, "{\"op\":\"append\",\"ts\":\"t\"}");
        struct fold *f = fold_kbuf(&b, b.len);
        assert_int_equal(f->status, FOLD_CORRUPT);
        assert_int_equal(f->bad_line, 1);
        assert_int_equal(f->records, 0);
        fold_free(f);
        kbuf_free(&b);

        /* a nested crc key is just data */
        rec(&b, PLAN("plan_a", 1, STEP("s1")));
        rec(&b, "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"completed\",\"post_hash\":\"p\","
                "\"result\":{\"crc\":\"00000000\"}," TS "}");
        f = fold_kbuf(&b, b.len);
        assert_int_equal(f->status, FOLD_CLEAN);
        assert_string_equal(fold_find_step(f, "s1")->result_json, "{\"crc\":\"00000000\"}");
        fold_free(f);
        kbuf_free(&b);
}

/* ------------------------------------------------------------ FIXes */

/* FIX (§13 bug 3): a reset clears the hashes of the interrupted execution.
 * The original kept observed_pre_hash, so the step stayed ambiguous. */
static void test_reset_clears_hashes(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        rec(&b, PLAN("plan_a", 1, STEP("s1")));
        rec(&b, EXECUTING("s1"));
        rec(&b, "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"completed\",\"post_hash\":\"\","
                "\"result_hash\":\"r\"," TS "}");
        rec(&b, "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"pending\",\"reset\":true," TS "}");
        struct fold *f = fold_kbuf(&b, b.len);

        const struct fold_step *s = fold_find_step(f, "s1");
        assert_string_equal(s->status, "pending");
        assert_null(s->observed_pre_hash);
        assert_null(s->post_hash);
        assert_null(s->result_hash);
        assert_int_equal(s->resets, 1);
        assert_int_equal(s->executions, 1);
        fold_free(f);
        kbuf_free(&b);

        /* pending without reset:true is no reset */
        rec(&b, PLAN("plan_a", 1, STEP("s1")));
        rec(&b, EXECUTING("s1"));
        rec(&b, "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"pending\",\"reset\":false," TS "}");
        f = fold_kbuf(&b, b.len);
        s = fold_find_step(f, "s1");
        assert_string_equal(s->observed_pre_hash, "obs-s1");
        assert_int_equal(s->resets, 0);
        fold_free(f);
        kbuf_free(&b);
}

#define AT(t) "\"ts\":\"2026-04-20T12:00:0" t "Z\""

/* An interrupted execution: until the last record before the restart (an
 * operator's record does not count), then what decided it; a kill at
 * shutdown ends at its needs_review record and a later word replaces the
 * decision; a plain completion is no interruption. */
static void test_interrupted_execution(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        rec(&b, PLAN("plan_a", 1, STEP("s1")));
        rec(&b, "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"executing\","
                "\"pre_hash\":\"p\"," AT("1.000") "}");
        rec(&b, "{\"op\":\"append\",\"step_id\":\"x\",\"plan_id\":\"plan_a\",\"idem_key\":\"k\","
                "\"status\":\"pending\"," AT("2.000") "}");
        rec(&b, "{\"op\":\"operator\",\"mandate_id\":\"mnd_x\",\"action\":\"pause\",\"uid\":0,"
                AT("8.000") "}");
        rec(&b, "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"pending\",\"reset\":true,"
                "\"evidence\":{\"reason\":\"effects_journaled\"}," AT("9.000") "}");
        rec(&b, "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"executing\","
                "\"pre_hash\":\"p\"," AT("9.100") "}");
        rec(&b, "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"completed\","
                "\"post_hash\":\"q\",\"result_hash\":\"r\"," AT("9.200") "}");
        struct fold *f = fold_kbuf(&b, b.len);
        const struct fold_step *s = fold_find_step(f, "s1");
        assert_int_equal(s->executions, 2);
        assert_int_equal(s->interrupted_execution, 1);
        assert_string_equal(s->interrupted_started_ts, "2026-04-20T12:00:01.000Z");
        assert_string_equal(s->interrupted_ended_ts, "2026-04-20T12:00:02.000Z");
        assert_string_equal(s->decided_ts, "2026-04-20T12:00:09.000Z");
        assert_string_equal(s->decided_status, "pending");
        assert_string_equal(s->decided_evidence_json, "{\"reason\":\"effects_journaled\"}");
        assert_string_equal(s->started_ts, "2026-04-20T12:00:09.100Z");
        /* the restart's time: the last record before it (the append; the
         * operator's is after it) to the first after it */
        assert_int_equal(f->down_ms, 7000);
        fold_free(f);
        kbuf_free(&b);

        /* killed at shutdown, decided after the restart by an operator */
        rec(&b, PLAN("plan_a", 1, STEP("s1")));
        rec(&b, "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"executing\","
                "\"pre_hash\":\"p\"," AT("1.000") "}");
        rec(&b, "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"needs_review\","
                "\"reason\":\"killed_at_shutdown\",\"evidence\":{\"reason\":\"killed_at_shutdown\"},"
                AT("3.000") "}");
        rec(&b, "{\"op\":\"operator\",\"mandate_id\":\"mnd_x\",\"action\":\"resolve_done\","
                "\"step_id\":\"s1\",\"uid\":0," AT("8.000") "}");
        rec(&b, "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"completed\","
                "\"post_hash\":\"q\",\"result_hash\":\"r\",\"recovered\":true,"
                "\"evidence\":{\"reason\":\"operator_resolved\"}," AT("8.000") "}");
        f = fold_kbuf(&b, b.len);
        s = fold_find_step(f, "s1");
        assert_int_equal(s->interrupted_execution, 1);
        assert_string_equal(s->interrupted_ended_ts, "2026-04-20T12:00:03.000Z");
        assert_string_equal(s->decided_status, "completed");
        assert_string_equal(s->decided_evidence_json, "{\"reason\":\"operator_resolved\"}");
        assert_int_equal(f->down_ms, 0); /* the wait is the operator's review's */
        fold_free(f);
        kbuf_free(&b);

        /* killed at shutdown, decided by recovery after the restart */
        rec(&b, PLAN("plan_a", 1, STEP("s1")));
        rec(&b, "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"executing\","
                "\"pre_hash\":\"p\"," AT("1.000") "}");
        rec(&b, "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"needs_review\","
                "\"reason\":\"killed_at_shutdown\",\"evidence\":{\"reason\":\"killed_at_shutdown\"},"
                AT("3.000") "}");
        rec(&b, "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"pending\",\"reset\":true,"
                "\"evidence\":{\"reason\":\"no_side_effects\",\"killed_at_shutdown\":true},"
                AT("7.500") "}");
        f = fold_kbuf(&b, b.len);
        assert_int_equal(fold_find_step(f, "s1")->interrupted_execution, 1);
        assert_int_equal(f->down_ms, 4500);
        fold_free(f);
        kbuf_free(&b);

        /* a handler's own completion is no interruption */
        rec(&b, PLAN("plan_a", 1, STEP("s1")));
        rec(&b, EXECUTING("s1"));
        rec(&b, COMPLETED("s1"));
        f = fold_kbuf(&b, b.len);
        s = fold_find_step(f, "s1");
        assert_int_equal(s->interrupted_execution, 0);
        assert_null(s->interrupted_started_ts);
        assert_null(s->decided_ts);
        fold_free(f);
        kbuf_free(&b);
}

/* FIX (torn tail): a partial last line is reported and not folded. */
static void test_torn_tail(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        struct kbuf last = KBUF_INIT;
        rec(&b, PLAN("plan_a", 1, STEP("s1")));
        rec(&b, EXECUTING("s1"));
        size_t end = b.len;
        rec(&last, COMPLETED("s1"));
        kbuf_append(&b, last.data, last.len);

        /* cut inside the record */
        struct fold *f = fold_kbuf(&b, end + 40);
        assert_int_equal(f->status, FOLD_TORN);
        assert_int_equal(f->bad_line, 3);
        assert_int_equal(f->bad_offset, end);
        assert_int_equal(f->good_end, end);
        assert_int_equal(f->records, 2);
        assert_string_equal(fold_find_step(f, "s1")->status, "executing");
        fold_free(f);

        /* a whole record missing only its newline: torn, not folded */
        f = fold_kbuf(&b, b.len - 1);
        assert_int_equal(f->status, FOLD_TORN);
        assert_int_equal(f->records, 2);
        assert_int_equal(f->good_end, end);
        assert_string_equal(fold_find_step(f, "s1")->status, "executing");
        fold_free(f);

        /* a zero-filled tail (delayed allocation after a crash) */
        kbuf_free(&b);
        rec(&b, PLAN("plan_a", 1, STEP("s1")));
        end = b.len;
        kbuf_append(&b, "\0\0\0\0\0\0\0\0", 8);
        f = fold_kbuf(&b, b.len);
        assert_int_equal(f->status, FOLD_TORN);
        assert_int_equal(f->good_end, end);
        assert_int_equal(f->records, 1);
        fold_free(f);

        /* a prefix followed by zeros */
        b.len = end;
        kbuf_append(&b, "{\"op\":\"trans\0\0\0\0", 16);
        f = fold_kbuf(&b, b.len);
        assert_int_equal(f->status, FOLD_TORN);
        fold_free(f);

        /* a whole record, then zeros instead of its newline */
        b.len = end;
        kbuf_append(&b, last.data, last.len - 1);
        kbuf_append(&b, "\0\0", 2);
        f = fold_kbuf(&b, b.len);
        assert_int_equal(f->status, FOLD_TORN);
        assert_int_equal(f->good_end, end);
        fold_free(f);

        /* an unterminated run of blanks is torn too (never append after it) */
        b.len = end;
        kbuf_append(&b, "  ", 2);
        f = fold_kbuf(&b, b.len);
        assert_int_equal(f->status, FOLD_TORN);
        assert_int_equal(f->good_end, end);
        fold_free(f);

        kbuf_free(&b);
        kbuf_free(&last);
}

/* A bad last line that cannot be a prefix of one record is corruption. */
static void test_bad_last_line_is_corrupt(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        struct kbuf two = KBUF_INIT;
        rec(&b, PLAN("plan_a", 1, STEP("s1")));
        size_t end = b.len;

        /* FIX: a flipped newline merged two crc-valid records */
        rec(&two, EXECUTING("s1"));
        rec(&two, COMPLETED("s1"));
        size_t nl = strchr(two.data, '\n') - two.data;
        two.data[nl] ^= 0x40; /* '\n' -> 'J' */
        kbuf_append(&b, two.data, two.len);
        struct fold *f = fold_kbuf(&b, b.len);
        assert_int_equal(f->status, FOLD_CORRUPT);
        assert_int_equal(f->bad_line, 2);
        assert_int_equal(f->bad_offset, end);
        assert_int_equal(f->records, 1);
        assert_non_null(strstr(f->bad_reason, "merged"));
        fold_free(f);
        /* ... also when the merged line lost its final newline */
        f = fold_kbuf(&b, b.len - 1);
        assert_int_equal(f->status, FOLD_CORRUPT);
        fold_free(f);

        /* a complete object with a bad crc, as the last line */
        b.len = end;
        kbuf_puts(&b, "{\"op\":\"append\",\"ts\":\"t\",\"crc\":\"0badc0de\"}\n");
        f = fold_kbuf(&b, b.len);
        assert_int_equal(f->status, FOLD_CORRUPT);
        assert_int_equal(f->bad_line, 2);
        fold_free(f);

        /* a non-object value as the last line (§13 bug 2) */
        b.len = end;
        kbuf_puts(&b, "42\n");
        f = fold_kbuf(&b, b.len);
        assert_int_equal(f->status, FOLD_CORRUPT);
        assert_non_null(strstr(f->bad_reason, "object"));
        fold_free(f);
        b.len = end;
        kbuf_puts(&b, "[1,");
        f = fold_kbuf(&b, b.len);
        assert_int_equal(f->status, FOLD_CORRUPT); /* records start with '{' */
        fold_free(f);

        /* garbage as the last line */
        b.len = end;
        kbuf_puts(&b, "{\"op\":}");
        f = fold_kbuf(&b, b.len);
        assert_int_equal(f->status, FOLD_CORRUPT);
        assert_int_equal(f->good_end, end);
        fold_free(f);

        kbuf_free(&b);
        kbuf_free(&two);
}

/* FIX (corruption): mid-file garbage is reported with its line and byte
 * offset and nothing after it is folded (the original skipped it). */
static void test_mid_file_garbage(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        rec(&b, PLAN("plan_a", 1, STEP("s1")));
        kbuf_puts(&b, "\n");
        rec(&b, EXECUTING("s1"));
        size_t off = b.len;
        kbuf_puts(&b, "{\"op\":\"transition\",\"step_id\":\"s1\",\"sta\n"); /* torn, then appended after */
        kbuf_puts(&b, "\n");
        rec(&b, COMPLETED("s1"));
        rec(&b, FINALIZE("plan_a", "succeeded"));
        struct fold *f = fold_kbuf(&b, b.len);

        assert_int_equal(f->status, FOLD_CORRUPT);
        assert_int_equal(f->bad_line, 4);
        assert_int_equal(f->bad_offset, off);
        assert_int_equal(f->good_end, off);
        assert_int_equal(f->records, 2);
        assert_int_equal(f->lines, 7);
        const struct fold_step *s = fold_find_step(f, "s1");
        assert_string_equal(s->status, "executing"); /* the completed after it is not applied */
        assert_null(s->post_hash);
        assert_false(f->plans[0].finalized);
        fold_free(f);
        kbuf_free(&b);
}

/* --------------------------------------------- every cut, every bit flip */

static size_t last_boundary(const char *d, size_t cut)
{
        while (cut > 0 && d[cut - 1] != '\n')
                cut--;
        return cut;
}

static size_t newlines_before(const char *d, size_t cut)
{
        size_t n = 0;
        for (size_t i = 0; i < cut; i++)
                n += d[i] == '\n';
        return n;
}

static void test_truncate_every_offset(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        realistic_wal(&b);
        char **digests = calloc(b.len + 1, sizeof(char *));
        assert_non_null(digests);

        for (size_t cut = 0; cut <= b.len; cut++) {
                struct fold *f = fold_kbuf(&b, cut);
                size_t boundary = last_boundary(b.data, cut);

                assert_int_equal(f->records, newlines_before(b.data, cut));
                assert_int_equal(f->good_end, boundary);
                if (boundary == cut) {
                        assert_int_equal(f->status, FOLD_CLEAN);
                        digests[cut] = digest(f);
                } else {
                        if (f->status != FOLD_TORN)
                                fail_msg("cut %zu: %s (%s)", cut, fold_status_name(f->status),
                                         f->bad_reason);
                        assert_int_equal(f->bad_offset, boundary);
                        /* exactly the records fully written before the cut */
                        char *d = digest(f);
                        assert_string_equal(d, digests[boundary]);
                        free(d);
                }
                fold_free(f);
        }
        for (size_t i = 0; i <= b.len; i++)
                free(digests[i]);
        free(digests);
        kbuf_free(&b);
}

static void test_flip_every_bit(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        realistic_wal(&b);
        char *copy = malloc(b.len);
        assert_non_null(copy);
        size_t torn = 0, corrupt = 0;
        /* the fold of every clean prefix, by its length */
        size_t nb = newlines_before(b.data, b.len) + 1, k = 0;
        size_t *bound = calloc(nb, sizeof(*bound));
        char **dig = calloc(nb, sizeof(*dig));
        assert_true(bound && dig);
        for (size_t i = 0; i <= b.len; i++) {
                if (i == 0 || b.data[i - 1] == '\n') {
                        struct fold *g = fold_kbuf(&b, i);
                        assert_int_equal(g->status, FOLD_CLEAN);
                        bound[k] = i;
                        dig[k++] = digest(g);
                        fold_free(g);
                }
        }
        assert_int_equal(k, nb);

        for (size_t i = 0; i < b.len; i++) {
                for (int bit = 0; bit < 8; bit++) {
                        memcpy(copy, b.data, b.len);
                        copy[i] ^= (char)(1u << bit);
                        struct fold *f = NULL;
                        assert_int_equal(fold_buffer(copy, b.len, &f), 0);
                        if (f->status == FOLD_CLEAN)
                                fail_msg("flip byte %zu bit %d not detected", i, bit);
                        torn += f->status == FOLD_TORN;
                        corrupt += f->status == FOLD_CORRUPT;
                        /* the state is exactly the records before the bad line */
                        assert_true(f->bad_offset <= i);
                        assert_int_equal(f->good_end, f->bad_offset);
                        size_t j = 0;
                        while (j < nb && bound[j] != f->bad_offset)
                                j++;
                        assert_true(j < nb);
                        char *d = digest(f);
                        assert_string_equal(d, dig[j]);
                        free(d);
                        fold_free(f);
                }
        }
        print_message("bit flips: %zu torn, %zu corrupt\n", torn, corrupt);
        assert_int_equal(torn + corrupt, b.len * 8);
        for (size_t i = 0; i < nb; i++)
                free(dig[i]);
        free(dig);
        free(bound);
        free(copy);
        kbuf_free(&b);
}

/* ------------------------------------------------------------ writer, file */

static void test_wal_encode_round_trip(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        struct wal_step steps[] = {
                { "s1", "ooda.observe", "ph1", "pre1", "post1" },
                { "s2", "ooda.act", "ph2", "pre2", "post2" },
        };
        struct wal_record recs[] = {
                { .op = WAL_OP_PLAN_COMMIT, .plan_id = "plan_e", .mandate_id = "mnd_e", .cycle = 7,
                  .steps = steps, .nsteps = 2 },
                { .op = WAL_OP_APPEND, .step_id = "s1", .plan_id = "plan_e", .idem_key = "mnd_e/s1" },
                { .op = WAL_OP_EXECUTING, .step_id = "s1", .pre_hash = "obs1" },
                { .op = WAL_OP_COMPLETED, .step_id = "s1", .post_hash = "p1", .result_hash = "r1",
                  .result_json = "{\"a\": [1, 2.50]}" },
                { .op = WAL_OP_EXECUTING, .step_id = "s2", .pre_hash = "obs2" },
                { .op = WAL_OP_FAILED, .step_id = "s2", .error_class = "E", .error_msg = "boom",
                  .has_exit_status = true, .exit_status = 3, .stderr_tail = "line 1\nline \xc3\xa9" },
                { .op = WAL_OP_FINALIZE, .plan_id = "plan_e", .status = PLAN_FAILED, .reason = "step_failed" },
        };
        for (size_t i = 0; i < sizeof(recs) / sizeof(recs[0]); i++)
                assert_int_equal(wal_encode(&recs[i], 1776686400123LL + (int64_t)i, &b), 0);
        struct fold *f = fold_kbuf(&b, b.len);

        assert_int_equal(f->status, FOLD_CLEAN);
        assert_int_equal(f->records, 7);
        assert_int_equal(f->legacy_records, 0);
        assert_int_equal(f->plans[0].cycle, 7);
        assert_true(f->plans[0].finalized);
        assert_string_equal(f->plans[0].final_reason, "step_failed");
        assert_string_equal(fold_find_step(f, "s1")->result_json, "{\"a\":[1,2.50]}");
        assert_string_equal(fold_find_step(f, "s1")->idem_key, "mnd_e/s1");
        assert_string_equal(fold_find_step(f, "s2")->error_msg, "boom");
        assert_string_equal(fold_find_step(f, "s2")->observed_pre_hash, "obs2");
        /* how the failed handler ended, for a page after a restart */
        const struct fold_step *s2 = fold_find_step(f, "s2");
        assert_true(s2->has_exit_status);
        assert_int_equal(s2->exit_status, 3);
        assert_int_equal(s2->exit_signal, 0);
        assert_string_equal(s2->stderr_tail, "line 1\nline \xc3\xa9");
        assert_int_equal(f->down_ms, 0);
        fold_free(f);
        kbuf_free(&b);

        /* a signal, and a stderr beyond the bound: its end, from a character */
        char big[WAL_STDERR_MAX_BYTES + 64];
        memset(big, 'x', sizeof big - 1);
        big[sizeof big - 1] = '\0';
        memcpy(big + sizeof big - 1 - WAL_STDERR_MAX_BYTES - 1, "\xc3\xa9", 2);
        struct wal_record sig[] = {
                recs[0], recs[1], recs[2],
                { .op = WAL_OP_FAILED, .step_id = "s1", .error_class = "signal",
                  .error_msg = "killed", .exit_signal = 9, .stderr_tail = big },
        };
        for (size_t i = 0; i < sizeof(sig) / sizeof(sig[0]); i++)
                assert_int_equal(wal_encode(&sig[i], 1776686400123LL + (int64_t)i, &b), 0);
        f = fold_kbuf(&b, b.len);
        const struct fold_step *s1 = fold_find_step(f, "s1");
        assert_false(s1->has_exit_status);
        assert_int_equal(s1->exit_signal, 9);
        assert_int_equal(strlen(s1->stderr_tail), WAL_STDERR_MAX_BYTES - 1);
        assert_string_equal(s1->stderr_tail, big + sizeof big - WAL_STDERR_MAX_BYTES);
        fold_free(f);
        kbuf_free(&b);
}

/* Lines this process wrote itself (fold_feed_own): every result is kept as
 * the text written, byte for byte what fold_feed's parse and write give,
 * quotes, backslashes and brackets inside strings included. */
static void test_feed_own_same_fold(void **state)
{
        (void)state;
        static const char *const results[] = {
                "{\"a\": [1, 2.50]}",
                "[{\"s\":\"a\\\"]}[{\\\\\",\"t\":[{\"u\":\"\\\\\"}]},{}]",
                "{\"q\":\"\\\\\",\"e\":\"\\u00e9\\n{\"}",
                "[]",
                "\"plain text\"",
                "null",
        };
        struct kbuf b = KBUF_INIT;
        struct wal_step steps[] = { { "s1", "ooda.observe", "ph1", "pre1", "post1" } };
        struct wal_record plan = { .op = WAL_OP_PLAN_COMMIT, .plan_id = "plan_e",
                                   .mandate_id = "mnd_e", .cycle = 1, .steps = steps,
                                   .nsteps = 1 };
        assert_int_equal(wal_encode(&plan, 1776686400123LL, &b), 0);
        for (size_t i = 0; i < sizeof(results) / sizeof(results[0]); i++) {
                struct wal_record rc = { .op = WAL_OP_COMPLETED, .step_id = "s1",
                                         .post_hash = "p1", .result_hash = "r1",
                                         .result_json = results[i] };
                assert_int_equal(wal_encode(&rc, 1776686400124LL + (int64_t)i, &b), 0);
                struct fold *parsed = fold_kbuf(&b, b.len);
                struct fold *own = NULL;
                size_t used = 0;
                assert_int_equal(fold_new(&own), 0);
                assert_int_equal(fold_feed_own(own, b.data, b.len, &used), 0);
                assert_int_equal(used, b.len);
                char *d1 = digest(parsed), *d2 = digest(own);
                assert_string_equal(d1, d2);
                assert_string_equal(fold_find_step(own, "s1")->result_json,
                                    fold_find_step(parsed, "s1")->result_json);
                /* its length known both ways (stepdoc copies by it) */
                assert_int_equal(fold_find_step(own, "s1")->result_len,
                                 strlen(fold_find_step(own, "s1")->result_json));
                assert_int_equal(fold_find_step(parsed, "s1")->result_len,
                                 strlen(fold_find_step(parsed, "s1")->result_json));
                free(d1);
                free(d2);
                fold_free(parsed);
                fold_free(own);
        }
        /* a torn own line is not folded: it waits for the rest */
        size_t cut = b.len - 10;
        struct fold *own = NULL;
        size_t used = 0;
        assert_int_equal(fold_new(&own), 0);
        assert_int_equal(fold_feed_own(own, b.data, cut, &used), 0);
        assert_true(used < cut);
        fold_free(own);
        kbuf_free(&b);
}

static void test_fold_file(void **state)
{
        (void)state;
        char dir[] = "/tmp/kairos-test-fold-XXXXXX";
        assert_non_null(mkdtemp(dir));
        char path[256];
        snprintf(path, sizeof(path), "%s/m.wal.jsonl", dir);

        struct fold *f = (struct fold *)1;
        assert_int_equal(fold_file(path, &f), -ENOENT);
        assert_null(f);

        struct kbuf b = KBUF_INIT;
        /* big enough to need several reads */
        for (int i = 0; i < 2000; i++)
                realistic_wal(&b);
        FILE *fp = fopen(path, "w");
        assert_non_null(fp);
        assert_int_equal(fwrite(b.data, 1, b.len, fp), b.len);
        assert_int_equal(fclose(fp), 0);

        assert_int_equal(fold_file(path, &f), 0);
        assert_int_equal(f->status, FOLD_CLEAN);
        assert_int_equal(f->records, 26 * 2000);
        assert_int_equal(f->nplans, 3);
        assert_int_equal(f->good_end, b.len);
        fold_free(f);

        assert_int_equal(fold_file(dir, &f), -EISDIR);
        assert_int_equal(unlink(path), 0);
        assert_int_equal(rmdir(dir), 0);
        kbuf_free(&b);
}

/* fold_file retries an open interrupted by a signal (found by the fault
 * injection of issue 8: an EINTR from open paused the mandate wal_io_error).
 * The WAL is a FIFO, so open blocks until a writer comes; a helper thread
 * waits until the test thread is inside openat (per /proc), interrupts it
 * with a signal whose handler has no SA_RESTART, and only then opens the
 * writing end and writes one record. */
struct eintr_ctx {
        const char *path;
        pid_t tid;
        const char *line;
        _Atomic bool done;
};

static volatile sig_atomic_t eintr_signals;

static void eintr_handler(int sig)
{
        (void)sig;
        eintr_signals++;
}

static bool in_syscall(pid_t tid, long nr)
{
        char p[64], buf[64];
        snprintf(p, sizeof p, "/proc/self/task/%d/syscall", (int)tid);
        FILE *f = fopen(p, "r");
        if (!f)
                return false;
        bool yes = fgets(buf, sizeof buf, f) && strtol(buf, NULL, 10) == nr;
        fclose(f);
        return yes;
}

static void *eintr_writer(void *arg)
{
        struct eintr_ctx *c = arg;
        while (!in_syscall(c->tid, SYS_openat))
                sched_yield();
        while (eintr_signals == 0) {
                syscall(SYS_tgkill, getpid(), c->tid, SIGUSR1);
                sched_yield();
        }
        /* non-blocking: fails (ENXIO) while no reader has the FIFO open,
         * so a fold_file that gave up on EINTR cannot hang the test */
        int fd;
        while ((fd = open(c->path, O_WRONLY | O_NONBLOCK | O_CLOEXEC)) < 0 && !c->done)
                sched_yield();
        if (fd >= 0) {
                ssize_t w = write(fd, c->line, strlen(c->line));
                (void)w;
                close(fd);
        }
        return NULL;
}

static void test_fold_file_eintr(void **state)
{
        (void)state;
        char dir[] = "/tmp/kairos-test-fold-XXXXXX";
        assert_non_null(mkdtemp(dir));
        char path[256];
        snprintf(path, sizeof(path), "%s/fifo.wal.jsonl", dir);
        assert_int_equal(mkfifo(path, 0600), 0);
        struct kbuf b = KBUF_INIT;
        rec(&b, "{\"op\":\"mandate\",\"mandate_id\":\"m\",\"schedule\":\"s\","
                "\"fired_at\":\"2026-04-20T12:00:00Z\",\"ts\":\"2026-04-20T12:00:00.000Z\"}");

        struct sigaction sa = { .sa_handler = eintr_handler }, old;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = 0; /* no SA_RESTART: the blocked open returns EINTR */
        assert_int_equal(sigaction(SIGUSR1, &sa, &old), 0);
        eintr_signals = 0;
        struct eintr_ctx c = { .path = path, .tid = (pid_t)syscall(SYS_gettid), .line = b.data,
                               .done = false };
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, eintr_writer, &c), 0);

        struct fold *f = NULL;
        int r = fold_file(path, &f);
        c.done = true;
        assert_int_equal(pthread_join(t, NULL), 0);
        assert_int_equal(sigaction(SIGUSR1, &old, NULL), 0);
        assert_true(eintr_signals > 0);
        assert_int_equal(r, 0);
        assert_non_null(f);
        assert_int_equal(f->records, 1);
        fold_free(f);
        kbuf_free(&b);
        assert_int_equal(unlink(path), 0);
        assert_int_equal(rmdir(dir), 0);
}

static void test_many_plans(void **state)
{
        (void)state;
        struct kbuf b = KBUF_INIT;
        char line[512];
        for (int i = 0; i < 5000; i++) {
                snprintf(line, sizeof(line),
                         "{\"op\":\"plan_commit\",\"plan_id\":\"p%d\",\"mandate_id\":\"m\",\"cycle\":%d,"
                         "\"plan_hash\":\"h\",\"steps\":[{\"step_id\":\"s%d\"}]," TS "}", i, i + 1, i);
                rec(&b, line);
                snprintf(line, sizeof(line),
                         "{\"op\":\"transition\",\"step_id\":\"s%d\",\"status\":\"executing\",\"pre_hash\":\"o%d\"," TS "}",
                         i, i);
                rec(&b, line);
        }
        struct fold *f = fold_kbuf(&b, b.len);
        assert_int_equal(f->nplans, 5000);
        assert_int_equal(f->nsteps, 5000);
        for (int i = 0; i < 5000; i += 499) {
                snprintf(line, sizeof(line), "s%d", i);
                const struct fold_step *s = fold_find_step(f, line);
                assert_non_null(s);
                snprintf(line, sizeof(line), "o%d", i);
                assert_string_equal(s->observed_pre_hash, line);
                snprintf(line, sizeof(line), "p%d", i);
                assert_ptr_equal(&f->plans[s->plan], fold_find_plan(f, line));
                assert_int_equal(f->plans[s->plan].cycle, i + 1);
        }
        fold_free(f);
        kbuf_free(&b);
}
/* ------------------------------------------------------------ fast path = tree */

/* fold_buffer (its fast path for plain lines) and fold_buffer_tree (every
 * line through the general parser) of data[0..len) hold the same state and
 * lead recovery to the same decisions.  Adds the fast path's records to
 * *fast, the records to *records. */
static void same_both_ways(const char *data, size_t len, size_t *fast, size_t *records)
{
        struct fold *a = NULL, *b = NULL;
        assert_int_equal(fold_buffer(data, len, &a), 0);
        assert_int_equal(fold_buffer_tree(data, len, &b), 0);
        assert_int_equal(b->fast_records, 0);
        assert_true(a->fast_records <= a->records);
        char *da = fold_digest_full(a), *db = fold_digest_full(b);
        if (strcmp(da, db) != 0)
                fail_msg("fast path and tree differ on:\n%.*s\n--- fast:\n%s--- tree:\n%s",
                         (int)(len < 4000 ? len : 4000), data, da, db);
        if (fast)
                *fast += a->fast_records;
        if (records)
                *records += a->records;
        free(da);
        free(db);
        fold_free(a);
        fold_free(b);
}

/* Every kind of record kairos writes, through its own encoder. */
static void encoded_wal(struct kbuf *b)
{
        struct wal_step steps[] = {
                { "observe_001", "ooda.observe", "ph1", "pre1", "post1" },
                { "act_001", "ooda.act", "ph2", "pre2", "post2" },
                { "reflect_001", "ooda.reflect", "ph3", "pre3", "post3" },
        };
        struct wal_record recs[] = {
                { .op = WAL_OP_MANDATE, .mandate_id = "mnd_e", .schedule = "nightly",
                  .fired_at = "2026-04-20T12:00:00Z", .goal = "keep \"it\"\ttidy/",
                  .retry_of = "mnd_d", .retry = 2 },
                { .op = WAL_OP_OWNER, .mandate_id = "mnd_e", .node = "n1", .epoch = 3,
                  .prev_owner = "n0" },
                { .op = WAL_OP_PLAN_COMMIT, .plan_id = "plan_e", .mandate_id = "mnd_e",
                  .cycle = 7, .steps = steps, .nsteps = 3 },
                { .op = WAL_OP_APPEND, .step_id = "observe_001", .plan_id = "plan_e",
                  .idem_key = "mnd_e/observe_001" },
                { .op = WAL_OP_EXECUTING, .step_id = "observe_001", .pre_hash = "obs1" },
                { .op = WAL_OP_COMPLETED, .step_id = "observe_001", .post_hash = "p1",
                  .result_hash = "r1", .result_json = "{\"a\":[1,2.50,-3e7,true,null,{}],\"b\":\"x\"}" },
                { .op = WAL_OP_APPEND, .step_id = "act_001", .plan_id = "plan_e",
                  .idem_key = "mnd_e/act_001" },
                { .op = WAL_OP_EXECUTING, .step_id = "act_001", .pre_hash = "obs2" },
                { .op = WAL_OP_FAILED, .step_id = "act_001", .error_class = "HandlerExit",
                  .error_msg = "boom", .has_exit_status = true, .exit_status = 3,
                  .exit_signal = 9, .stderr_tail = "line 1\nline 2" },
                { .op = WAL_OP_RETRY_WAIT, .step_id = "act_001", .attempt = 1,
                  .error_class = "HandlerExit", .due_ms = 1776686400999LL },
                { .op = WAL_OP_EXECUTING, .step_id = "act_001", .pre_hash = "obs2" },
                { .op = WAL_OP_NEEDS_REVIEW, .step_id = "act_001", .reason = "killed_at_shutdown",
                  .evidence_json = "{\"killed_at_shutdown\":true,\"n\":[]}" },
                { .op = WAL_OP_COMPLETED, .step_id = "act_001", .post_hash = "p2",
                  .result_hash = "r2", .recovered = true, .carried_from = "mnd_d/act_001",
                  .evidence_json = "{\"killed_at_shutdown\":true,\"reason\":\"probe\"}",
                  .result_json = "[]" },
                { .op = WAL_OP_APPEND, .step_id = "reflect_001", .plan_id = "plan_e",
                  .idem_key = "mnd_e/reflect_001" },
                { .op = WAL_OP_EXECUTING, .step_id = "reflect_001", .pre_hash = "obs3" },
                { .op = WAL_OP_RESET, .step_id = "reflect_001",
                  .evidence_json = "{\"reason\":\"safe_to_retry\"}" },
                { .op = WAL_OP_OPERATOR, .mandate_id = "mnd_e", .action = "retry",
                  .step_id = "reflect_001", .uid = 1000, .reason = "by hand" },
                { .op = WAL_OP_EXECUTING, .step_id = "reflect_001", .pre_hash = "obs3" },
                { .op = WAL_OP_FINALIZE, .plan_id = "plan_e", .status = PLAN_SUCCEEDED,
                  .reason = "all_completed" },
                { .op = WAL_OP_PLAN_COMMIT, .plan_id = "plan_f", .mandate_id = "mnd_e",
                  .cycle = 8, .steps = steps, .nsteps = 1 },
                { .op = WAL_OP_APPEND, .step_id = "observe_001", .plan_id = "plan_f",
                  .idem_key = "mnd_e/observe_001#2" },
                { .op = WAL_OP_EXECUTING, .step_id = "observe_001", .pre_hash = "obs4" },
        };
        for (size_t i = 0; i < sizeof(recs) / sizeof(recs[0]); i++)
                assert_int_equal(wal_encode(&recs[i], 1776686400123LL + 1000 * (int64_t)i, b), 0);
}

/* The WAL start-up recovery meets most: a mandate interrupted in its second
 * step (tests/bench/bench_startup.py writes these). */
static void bench_wal(struct kbuf *b)
{
        rec(b, "{\"op\":\"mandate\",\"mandate_id\":\"mnd_b\",\"schedule\":\"bench\",\"fired_at\":"
               "\"2026-04-20T12:00:00Z\"," TS "}");
        rec(b, "{\"op\":\"plan_commit\",\"plan_id\":\"plan_b\",\"mandate_id\":\"mnd_b\",\"cycle\":1,"
               "\"plan_hash\":\"sha256-0\",\"steps\":[" STEP("observe_001") "," STEP("orient_001") ","
               STEP("decide_001") "]," TS "}");
        rec(b, APPEND("observe_001", "plan_b"));
        rec(b, EXECUTING("observe_001"));
        rec(b, "{\"op\":\"transition\",\"step_id\":\"observe_001\",\"status\":\"completed\","
               "\"post_hash\":\"sha256-post\",\"result_hash\":\"sha256-result\"," TS "}");
        rec(b, APPEND("orient_001", "plan_b"));
        rec(b, EXECUTING("orient_001"));
}

/* What kairos writes is read by the fast path, every line of it, and to
 * the same state as the general parser's. */
static void test_fast_path_takes_kairos_lines(void **state)
{
        (void)state;
        void (*const wals[])(struct kbuf *) = { encoded_wal, bench_wal };
        for (size_t i = 0; i < sizeof(wals) / sizeof(wals[0]); i++) {
                struct kbuf b = KBUF_INIT;
                size_t fast = 0, records = 0;
                wals[i](&b);
                same_both_ways(b.data, b.len, &fast, &records);
                assert_true(records > 5);
                assert_int_equal(fast, records);
                kbuf_free(&b);
        }
        /* and the odd ones go the general way: \u escapes, non-ASCII */
        struct kbuf b = KBUF_INIT;
        size_t fast = 0, records = 0;
        realistic_wal(&b);
        same_both_ways(b.data, b.len, &fast, &records);
        assert_true(fast > 0 && fast < records);
        kbuf_free(&b);
}

/* Lines the fast path must leave to the parser, or take exactly as it. */
static void test_fast_path_odd_lines(void **state)
{
        (void)state;
        static const char *const odd[] = {
                /* escapes and non-ASCII in keys and values */
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"fail\\u0065d\"," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s\\u0031\",\"status\":\"failed\"," TS "}",
                "{\"op\":\"transition\",\"step\\u005fid\":\"s1\",\"status\":\"failed\"," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"failed\",\"error_msg\":\"a\\u0000b\"," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"failed\",\"error_msg\":\"caf\xc3\xa9\"," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"failed\",\"error_msg\":\"\xff\"," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"failed\",\"error_msg\":\"a\tb\"," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"failed\",\"error_msg\":\"\\\"\\\\\\/\"," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"failed\",\"error_msg\":\"\x7f\"," TS "}",
                /* numbers */
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"failed\",\"exit_status\":1.0," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"failed\",\"exit_status\":1e2," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"failed\",\"exit_status\":-0," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"failed\",\"exit_status\":01," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"failed\",\"exit_status\":-," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"failed\",\"exit_status\":99999999999999999999999," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"failed\",\"signal\":\"9\",\"exit_status\":null," TS "}",
                /* literals, good and bad */
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"completed\",\"recovered\":true," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"completed\",\"recovered\":tru," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"completed\",\"recovered\":truex," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"completed\",\"recovered\":nul," TS "}",
                /* whitespace, structure */
                "{ \"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"completed\"," TS "}",
                "{\"op\" :\"transition\",\"step_id\":\"s1\",\"status\":\"completed\"," TS "}",
                "{\"op\":\"transition\" ,\"step_id\":\"s1\",\"status\":\"completed\"," TS "}",
                "{\"op\":\"transition\",,\"step_id\":\"s1\"," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"result\":{\"a\":[1,2 ]}," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"result\":{\"a\":[1,2,]}," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"result\":{\"a\":[1,2}," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"result\":{\"a\"}," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"result\":{,}," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"result\":[[[[[[[[[[1]]]]]]]]]]," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"completed\",\"result\":{\"k\":{\"k\":{\"k\":{\"k\":{}}}}}," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"completed\",\"result\":{\"k\":{\"k\":{\"k\":{\"k\":{\"k\":{}}}}}}," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"completed\",\"result\":{}," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"completed\",\"result\":\"\"," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"completed\",\"result\":{\"a\":1,\"a\":2}," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"completed\",\"status\":\"failed\"," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"completed\",\"crc\":\"00000000\"," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"completed\",\"crc\":1," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":7," TS "}",
                "{\"op\":\"transition\",\"step_id\":[\"s1\"],\"status\":\"completed\"," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"completed\",\"\":\"\"," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"completed\"," TS "}x",
                "[\"op\",\"transition\"]",
                /* a whole record with a crc member, then more before the seal */
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"crc\":\"0\",\"status\":\"failed\"},\"x\":{\"a\":1}",
                "{}",
                "{\"op\":\"plan_commit\",\"plan_id\":\"p2\",\"steps\":[{\"step_id\":\"s9\"},7,null,{\"tool\":\"t\"}]," TS "}",
                "{\"op\":\"plan_commit\",\"plan_id\":\"p2\",\"steps\":{\"step_id\":\"s9\"}," TS "}",
                "{\"op\":\"plan_commit\",\"plan_id\":\"p1\",\"mandate_id\":\"m2\",\"cycle\":-2,\"steps\":[]," TS "}",
                "{\"op\":\"operator\",\"mandate_id\":\"m\",\"action\":\"retry\",\"uid\":-1,\"reason\":\"r\"," TS "}",
                "{\"op\":\"retry_wait\",\"step_id\":\"s1\",\"attempt\":2,\"error_class\":\"E\",\"due_ms\":1776686400000," TS "}",
                "{\"op\":\"append\",\"step_id\":\"s7\"," TS "}",
                "{\"op\":\"append\",\"step_id\":\"s8\",\"plan_id\":\"p9\"," TS "}",
                "{\"op\":\"mandate\",\"mandate_id\":\"m\",\"retry_of\":\"m0\",\"retry\":3," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"needs_review\",\"reason\":\"killed_at_shutdown\"," TS "}",
                "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"pending\",\"reset\":true,\"evidence\":{\"killed_at_shutdown\":true}," TS "}",
        };
        /* a wide value: more items than the fast path holds */
        struct kbuf wide = KBUF_INIT;
        kbuf_puts(&wide, "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"completed\",\"result\":[");
        for (int i = 0; i < 200; i++)
                kbuf_printf(&wide, "%s%d", i ? "," : "", i);
        kbuf_puts(&wide, "]," TS "}");
        /* and one deeper than the parser takes (KJSON_MAX_DEPTH) */
        struct kbuf deep = KBUF_INIT;
        kbuf_puts(&deep, "{\"op\":\"transition\",\"step_id\":\"s1\",\"result\":");
        for (int i = 0; i < 130; i++)
                kbuf_putc(&deep, '[');
        for (int i = 0; i < 130; i++)
                kbuf_putc(&deep, ']');
        kbuf_puts(&deep, "," TS "}");
        const size_t nodd = sizeof(odd) / sizeof(odd[0]);
        size_t fast = 0, records = 0;
        for (size_t i = 0; i < nodd + 2; i++) {
                const char *line = i < nodd ? odd[i] : i == nodd ? wide.data : deep.data;
                /* the line alone, after a plan, and followed by a good line */
                for (int where = 0; where < 3; where++) {
                        struct kbuf b = KBUF_INIT;
                        if (where > 0) {
                                rec(&b, PLAN("p1", 1, STEP("s1") "," STEP("s2")));
                                rec(&b, APPEND("s1", "p1"));
                                rec(&b, EXECUTING("s1"));
                        }
                        if (line[strlen(line) - 1] == '}') {
                                rec(&b, line);
                        } else {
                                kbuf_puts(&b, line);
                                kbuf_putc(&b, '\n');
                        }
                        if (where == 2)
                                rec(&b, COMPLETED("s2"));
                        same_both_ways(b.data, b.len, &fast, &records);
                        kbuf_free(&b);
                }
        }
        assert_true(fast > 0 && fast < records);
        kbuf_free(&wide);
        kbuf_free(&deep);
}

/* Every line of the WALs above changed at every byte (replaced by one of
 * the bytes that matter to a parser, removed or doubled: one change per
 * position, in turn), sealed again so that it reaches the parsers: the same
 * fold both ways.  KAIROS_FOLD_DIFF_FULL=1: every change, every byte value,
 * at every position (a minute). */
static void test_fast_path_mutations(void **state)
{
        (void)state;
        static const char subst[] = "\"\\{}[],: 0-1.etn\x01\x80\xff";
        bool full = getenv("KAIROS_FOLD_DIFF_FULL") != NULL;
        void (*const wals[])(struct kbuf *) = { encoded_wal, bench_wal };
        size_t fast = 0, records = 0, cases = 0;
        for (size_t w = 0; w < sizeof(wals) / sizeof(wals[0]); w++) {
                struct kbuf b = KBUF_INIT;
                wals[w](&b);
                size_t start = 0;
                while (start < b.len) {
                        const char *nl = memchr(b.data + start, '\n', b.len - start);
                        assert_non_null(nl);
                        size_t end = (size_t)(nl - b.data), n = end - start;
                        /* the line's body, without its crc field */
                        size_t body = n - 18;
                        size_t nvar = full ? 258 : sizeof(subst) - 1 + 2;
                        for (size_t pos = 0; pos < body; pos++) {
                                for (size_t v = full ? 0 : (pos + start) % nvar; v < nvar;
                                     v += full ? 1 : nvar) {
                                        struct kbuf line = KBUF_INIT, wal = KBUF_INIT;
                                        const char *l = b.data + start;
                                        kbuf_append(&line, l, pos);
                                        if (v + 2 == nvar) {
                                                /* removed */
                                        } else if (v + 1 == nvar) {
                                                kbuf_append(&line, l + pos, 1); /* doubled */
                                                kbuf_append(&line, l + pos, 1);
                                        } else {
                                                char c = full ? (char)v : subst[v];
                                                if (c == l[pos])
                                                        goto next;
                                                kbuf_putc(&line, c);
                                        }
                                        kbuf_append(&line, l + pos + 1, body - pos - 1);
                                        kbuf_putc(&line, '}');
                                        /* the records before, the changed one, the rest */
                                        kbuf_append(&wal, b.data, start);
                                        assert_int_equal(fold_reseal(line.data, line.len, &wal), 0);
                                        kbuf_putc(&wal, '\n');
                                        kbuf_append(&wal, b.data + end + 1, b.len - end - 1);
                                        same_both_ways(wal.data, wal.len, &fast, &records);
                                        cases++;
next:
                                        kbuf_free(&line);
                                        kbuf_free(&wal);
                                }
                        }
                        start = end + 1;
                }
                kbuf_free(&b);
        }
        print_message("fast path mutations: %zu cases, %zu of %zu records fast\n", cases, fast,
                      records);
        assert_true(fast > 0 && fast < records);
}

/* Random records: known and unknown keys, values of every kind (escapes,
 * non-ASCII and invalid bytes, floats, deep and wide containers,
 * whitespace), duplicates, sealed; WALs of them, sometimes torn.
 * KAIROS_FOLD_DIFF_N: how many WALs (default 400). */
static uint64_t rnd_state = 0x9e3779b97f4a7c15ULL;
static uint32_t rnd(uint32_t n)
{
        rnd_state ^= rnd_state << 13;
        rnd_state ^= rnd_state >> 7;
        rnd_state ^= rnd_state << 17;
        return n ? (uint32_t)(rnd_state % n) : 0;
}

static void rnd_ws(struct kbuf *b)
{
        if (rnd(20) == 0)
                kbuf_puts(b, rnd(2) ? " " : "\t");
}

static void rnd_string(struct kbuf *b)
{
        static const char *const pieces[] = {
                "s1", "s2", "p1", "m1", "pending", "executing", "completed", "failed",
                "needs_review", "abandoned", "succeeded", "killed_at_shutdown",
                "2026-04-20T12:00:00.123Z", "2026-04-20T12:00:05Z", "x", "", "\\\"",
                "\\\\", "\\n", "\\u00e9", "\\u0000", "\\ud83d\\ude00", "\xc3\xa9", "\xff",
                "\x7f", "\t", "{", "}", "[", "]", ",", ":", "crc",
        };
        kbuf_putc(b, '"');
        int k = (int)rnd(3);
        for (int i = 0; i < k || i == 0; i++) {
                const char *p = pieces[rnd(sizeof(pieces) / sizeof(pieces[0]))];
                /* mostly plain ones */
                if (rnd(4) != 0)
                        p = pieces[rnd(16)];
                kbuf_puts(b, p);
        }
        kbuf_putc(b, '"');
}

static void rnd_value(struct kbuf *b, int depth)
{
        static const char *const nums[] = { "0", "1", "-1", "7", "12345678901234567890", "-0",
                                            "1.5", "1e3", "-2E-2", "1776686400999" };
        static const char *const lits[] = { "true", "false", "null" };
        switch (rnd(depth > 7 ? 4 : 7)) {
        case 0:
        case 1:
                rnd_string(b);
                break;
        case 2:
                kbuf_puts(b, nums[rnd(sizeof(nums) / sizeof(nums[0]))]);
                break;
        case 3:
                kbuf_puts(b, lits[rnd(3)]);
                break;
        case 4:
        case 5: {
                bool obj = rnd(2);
                size_t n = rnd(10) == 0 ? 60 + rnd(10) : rnd(4);
                kbuf_putc(b, obj ? '{' : '[');
                for (size_t i = 0; i < n; i++) {
                        if (i)
                                kbuf_putc(b, ',');
                        rnd_ws(b);
                        if (obj) {
                                rnd_string(b);
                                rnd_ws(b);
                                kbuf_putc(b, ':');
                        }
                        rnd_value(b, depth + 1);
                        rnd_ws(b);
                }
                kbuf_putc(b, obj ? '}' : ']');
                break;
        }
        default:
                kbuf_puts(b, depth > 1 ? "[[[[[[1]]]]]]" : "{\"killed_at_shutdown\":true}");
                break;
        }
}

static void rnd_record(struct kbuf *b)
{
        static const char *const ops[] = { "plan_commit", "append", "transition",
                                           "plan_finalize", "operator", "mandate",
                                           "retry_wait", "owner", "future" };
        static const char *const keys[] = {
                "step_id", "plan_id", "mandate_id", "cycle", "plan_hash", "idem_key",
                "status", "pre_hash", "post_hash", "result_hash", "result", "evidence",
                "recovered", "error_class", "error_msg", "reason", "reset", "action", "uid",
                "ts", "schedule", "fired_at", "goal", "retry_of", "retry", "attempt", "due_ms",
                "carried_from", "exit_status", "signal", "stderr", "other", "op",
        };
        struct kbuf l = KBUF_INIT;
        kbuf_printf(&l, "{\"op\":\"%s\"", ops[rnd(sizeof(ops) / sizeof(ops[0]))]);
        if (rnd(2))
                kbuf_printf(&l, ",\"step_id\":\"s%u\"", rnd(3));
        if (rnd(3) == 0)
                kbuf_printf(&l, ",\"plan_id\":\"p%u\",\"steps\":[{\"step_id\":\"s%u\",\"tool\":\"t\"},"
                                "{\"step_id\":\"s%u\"}]", rnd(2), rnd(3), rnd(3));
        size_t n = rnd(6);
        for (size_t i = 0; i < n; i++) {
                kbuf_putc(&l, ',');
                rnd_ws(&l);
                kbuf_printf(&l, "\"%s\"", keys[rnd(sizeof(keys) / sizeof(keys[0]))]);
                rnd_ws(&l);
                kbuf_putc(&l, ':');
                rnd_ws(&l);
                if (rnd(3) == 0)
                        kbuf_printf(&l, "\"%s\"", rnd(2) ? "completed" : "executing");
                else
                        rnd_value(&l, 1);
        }
        if (rnd(2))
                kbuf_printf(&l, ",\"ts\":\"2026-04-20T12:00:0%u.000Z\"", rnd(10));
        kbuf_putc(&l, '}');
        assert_int_equal(fold_reseal(l.data, l.len, b), 0);
        kbuf_putc(b, '\n');
        kbuf_free(&l);
}

static void test_fast_path_random(void **state)
{
        (void)state;
        const char *env = getenv("KAIROS_FOLD_DIFF_N");
        size_t n = env ? strtoul(env, NULL, 10) : 400, fast = 0, records = 0;
        for (size_t w = 0; w < n; w++) {
                struct kbuf b = KBUF_INIT;
                rec(&b, PLAN("p0", 1, STEP("s0") "," STEP("s1") "," STEP("s2")));
                size_t k = 2 + rnd(20);
                for (size_t i = 0; i < k; i++)
                        rnd_record(&b);
                /* sometimes torn, or a bad line in the middle */
                size_t len = b.len;
                if (rnd(4) == 0)
                        len -= rnd((uint32_t)(len / 4));
                same_both_ways(b.data, len, &fast, &records);
                kbuf_free(&b);
        }
        print_message("fast path random: %zu WALs, %zu of %zu records fast\n", n, fast, records);
        assert_true(fast > 0 && fast < records);
}

/* The arena of a fold's strings is kept per thread when the fold is freed
 * and reused by the next fold: folds alive at the same time, freed in
 * another order than made, some too big to be kept, each keep what it
 * folded (its digest when made = its digest when freed = the tree's). */
static void test_keep_arena_reused(void **state)
{
        (void)state;
        enum { LIVE = 3 };
        struct fold *live[LIVE] = { NULL };
        char *digest[LIVE] = { NULL };
        const char *env = getenv("KAIROS_FOLD_DIFF_N");
        size_t n = env ? strtoul(env, NULL, 10) : 200;
        for (size_t w = 0; w < n + LIVE; w++) {
                size_t slot = (w * 2) % LIVE; /* not the order they were made in */
                if (live[slot]) {
                        char *d = fold_digest_full(live[slot]);
                        assert_string_equal(d, digest[slot]);
                        free(d);
                        free(digest[slot]);
                        fold_free(live[slot]);
                        live[slot] = NULL;
                }
                if (w >= n)
                        continue;
                struct kbuf b = KBUF_INIT;
                rec(&b, PLAN("p0", 1, STEP("s0") "," STEP("s1") "," STEP("s2")));
                /* every eighth big enough for its strings' arena not to be kept */
                size_t k = w % 8 == 0 ? 400 + rnd(200) : 2 + rnd(20);
                for (size_t i = 0; i < k; i++)
                        rnd_record(&b);
                struct fold *t = NULL;
                assert_int_equal(fold_buffer(b.data, b.len, &live[slot]), 0);
                assert_int_equal(fold_buffer_tree(b.data, b.len, &t), 0);
                digest[slot] = fold_digest_full(live[slot]);
                char *dt = fold_digest_full(t);
                assert_string_equal(digest[slot], dt);
                free(dt);
                fold_free(t);
                kbuf_free(&b);
        }
}

/* A fold keeps a small WAL's plans, steps and lookups in its own
 * allocation and moves them out as they grow: every count of plans and
 * steps around that room (plan 0 given more steps by a later plan_commit of
 * it too), folded at once and line by line, holds what the tree parser
 * holds, and finds every plan and step (ASan: nothing freed twice or kept). */
static void test_room_boundaries(void **state)
{
        (void)state;
        char line[4096], steps[3600], id[32];
        for (int np = 1; np <= 5; np++) {
                for (int ns = 0; ns <= 19; ns++) {
                        struct kbuf b = KBUF_INIT;
                        for (int p = 0; p <= np; p++) {
                                /* the last one: plan 0 again, with ns + 3 steps */
                                int pi = p == np ? 0 : p, n = p == np ? ns + 3 : ns;
                                size_t o = 0;
                                for (int k = 0; k < n; k++)
                                        o += (size_t)snprintf(steps + o, sizeof steps - o,
                                                              "%s{\"step_id\":\"s%d_%d\"}",
                                                              k ? "," : "", pi, k);
                                steps[o] = '\0';
                                snprintf(line, sizeof line,
                                         "{\"op\":\"plan_commit\",\"plan_id\":\"p%d\","
                                         "\"mandate_id\":\"m\",\"cycle\":%d,\"plan_hash\":\"h\","
                                         "\"steps\":[%s]," TS "}",
                                         pi, pi + 1, steps);
                                rec(&b, line);
                                for (int k = 0; k < n; k += 2) {
                                        snprintf(line, sizeof line,
                                                 "{\"op\":\"transition\",\"step_id\":\"s%d_%d\","
                                                 "\"status\":\"executing\",\"pre_hash\":\"o%d_%d\"," TS "}",
                                                 pi, k, pi, k);
                                        rec(&b, line);
                                }
                        }
                        same_both_ways(b.data, b.len, NULL, NULL);
                        struct fold *whole = fold_kbuf(&b, b.len), *fed = NULL;
                        assert_int_equal(fold_new(&fed), 0);
                        for (size_t at = 0; at < b.len;) {
                                const char *nl = memchr(b.data + at, '\n', b.len - at);
                                size_t used = 0, len = (size_t)(nl - (b.data + at)) + 1;
                                assert_int_equal(fold_feed(fed, b.data + at, len, &used), 0);
                                assert_int_equal(used, len);
                                at += len;
                        }
                        char *dw = digest(whole), *df = digest(fed);
                        assert_string_equal(dw, df);
                        free(dw);
                        free(df);
                        assert_int_equal(whole->nplans, np);
                        for (int p = 0; p < np; p++) {
                                snprintf(id, sizeof id, "p%d", p);
                                const struct fold_plan *fp = fold_find_plan(whole, id);
                                assert_non_null(fp);
                                assert_int_equal(fp->nsteps, p == 0 ? ns + 3 : ns);
                                for (size_t k = 0; k < fp->nsteps; k++) {
                                        snprintf(id, sizeof id, "s%d_%zu", p, k);
                                        const struct fold_step *st = fold_find_step(whole, id);
                                        assert_non_null(st);
                                        assert_ptr_equal(st, &whole->steps[fp->steps[k]]);
                                        assert_ptr_equal(&whole->plans[st->plan], fp);
                                }
                        }
                        fold_free(whole);
                        fold_free(fed);
                        kbuf_free(&b);
                }
        }
}

static void test_names(void **state)
{
        (void)state;
        assert_string_equal(fold_status_name(FOLD_CLEAN), "clean");
        assert_string_equal(fold_status_name(FOLD_TORN), "torn");
        assert_string_equal(fold_status_name(FOLD_CORRUPT), "corrupt");
        assert_false(fold_step_finalized(NULL));
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_empty),
                cmocka_unit_test(test_realistic_state),
                cmocka_unit_test(test_orphan_append),
                cmocka_unit_test(test_duplicate_plan_commit),
                cmocka_unit_test(test_step_takeover),
                cmocka_unit_test(test_unknown_step_and_plan_ignored),
                cmocka_unit_test(test_multi_cycle),
                cmocka_unit_test(test_fields_applied_only_when_present),
                cmocka_unit_test(test_crlf_and_blank_lines),
                cmocka_unit_test(test_legacy_lines),
                cmocka_unit_test(test_mandate_record),
                cmocka_unit_test(test_bad_lines),
                cmocka_unit_test(test_crc_line_with_two_crc_fields),
                cmocka_unit_test(test_reset_clears_hashes),
                cmocka_unit_test(test_interrupted_execution),
                cmocka_unit_test(test_torn_tail),
                cmocka_unit_test(test_bad_last_line_is_corrupt),
                cmocka_unit_test(test_mid_file_garbage),
                cmocka_unit_test(test_truncate_every_offset),
                cmocka_unit_test(test_flip_every_bit),
                cmocka_unit_test(test_wal_encode_round_trip),
                cmocka_unit_test(test_fold_file),
                cmocka_unit_test(test_fold_file_eintr),
                cmocka_unit_test(test_many_plans),
                cmocka_unit_test(test_feed_own_same_fold),
                cmocka_unit_test(test_fast_path_takes_kairos_lines),
                cmocka_unit_test(test_fast_path_odd_lines),
                cmocka_unit_test(test_fast_path_mutations),
                cmocka_unit_test(test_fast_path_random),
                cmocka_unit_test(test_keep_arena_reused),
                cmocka_unit_test(test_room_boundaries),
                cmocka_unit_test(test_names),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
