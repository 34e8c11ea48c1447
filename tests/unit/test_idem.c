/* SPDX-License-Identifier: MIT */
/* Tests of the idempotency store (docs/design.md §11): the original's right
 * behaviours and each fixed bug of §13 item 6 with a test that fails on the
 * original behaviour.  Its log: test_idem_log.c. */
#include "idem_fixture.h"

/* ==== the original's right behaviours ===================================== */

static void test_content_key_stable_across_key_order(void **state)
{
        struct fx *f = *state;
        char k1[IDEM_FULL_KEY_SIZE], k2[IDEM_FULL_KEY_SIZE];
        char fp1[CANON_HASH_STRLEN], fp2[CANON_HASH_STRLEN], want[CANON_HASH_STRLEN];
        struct idem_request a = rq("fs_write", NULL, "{\"path\":\"/x\",\"content\":\"hi\"}");
        struct idem_request b = rq("fs_write", NULL, "{ \"content\" : \"hi\", \"path\":\"/x\" }");

        assert_int_equal(idem_make_key(&a, k1, fp1), 0);
        assert_int_equal(idem_make_key(&b, k2, fp2), 0);
        assert_string_equal(k1, k2);
        assert_string_equal(fp1, fp2);
        /* the key is tool:content:<sha256 hex of the canonical JSON> */
        const char *canon = "{\"content\":\"hi\",\"path\":\"/x\"}";
        canon_hash_bytes(canon, strlen(canon), want);
        assert_string_equal(fp1, want);
        char key[IDEM_FULL_KEY_SIZE];
        snprintf(key, sizeof(key), "fs_write:content:%s", want + 7);
        assert_string_equal(k1, key);

        /* and the store treats the reordered input as the same call */
        mem_store(f);
        run_ok(f, "fs_write", NULL, a.input_json, "R", 1);
        struct idem_view v;
        assert_int_equal(idem_begin(f->s, &b, &v, NULL), IDEM_HIT_COMPLETED);
        assert_memory_equal(v.result, "R", 1);
}

static void test_different_input_different_key(void **state)
{
        struct fx *f = *state;
        char k1[IDEM_FULL_KEY_SIZE], k2[IDEM_FULL_KEY_SIZE];
        char fp1[CANON_HASH_STRLEN], fp2[CANON_HASH_STRLEN];
        struct idem_request a = rq("fs_write", NULL, "{\"path\":\"/x\",\"content\":\"hi\"}");
        struct idem_request b = rq("fs_write", NULL, "{\"path\":\"/x\",\"content\":\"ho\"}");
        assert_int_equal(idem_make_key(&a, k1, fp1), 0);
        assert_int_equal(idem_make_key(&b, k2, fp2), 0);
        assert_string_not_equal(k1, k2);
        assert_string_not_equal(fp1, fp2);

        mem_store(f);
        run_ok(f, "fs_write", NULL, a.input_json, "1", 1);
        uint64_t lsn;
        assert_int_equal(idem_begin(f->s, &b, NULL, &lsn), IDEM_PROCEED);
        assert_true(lsn > 0);
}

static void test_completed_duplicate_returns_cached_result(void **state)
{
        struct fx *f = *state;
        const char payload[] = "exit=0\0stdout\nline\0\xff\x01stderr";
        struct idem_request r = rq("cmd_run", "deploy-42", "[\"deploy\",\"v2\"]");
        struct idem_view v;
        uint64_t lsn;
        int runs = 0;

        mem_store(f);
        for (int i = 0; i < 3; i++) {
                int o = idem_begin(f->s, &r, &v, &lsn);
                if (o == IDEM_PROCEED) {
                        runs++;
                        assert_int_equal(idem_complete(f->s, "cmd_run:deploy-42", payload,
                                                       sizeof(payload), &lsn), 0);
                        ack(f);
                        continue;
                }
                assert_int_equal(o, IDEM_HIT_COMPLETED);
                assert_true(v.cached);
                assert_int_equal(v.state, IDEM_ST_COMPLETED);
                assert_int_equal(v.result_len, sizeof(payload));
                assert_memory_equal(v.result, payload, sizeof(payload));
                assert_int_equal(lsn, 0);
        }
        assert_int_equal(runs, 1);
        struct idem_stats st;
        idem_stats(f->s, &st);
        assert_int_equal(st.hits, 2);
        assert_int_equal(st.misses, 1);
}

static void test_failed_duplicate_returns_cached_error_with_class(void **state)
{
        struct fx *f = *state;
        struct idem_request r = rq("fs_write", NULL, "{\"path\":\"/ro/x\"}");
        struct idem_view v;
        uint64_t lsn;

        mem_store(f);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        char key[IDEM_FULL_KEY_SIZE];
        snprintf(key, sizeof(key), "%s", v.key);
        assert_int_equal(idem_fail(f->s, key, "permission_denied", "open /ro/x: EACCES",
                                   "exit=1", 6, &lsn), 0);
        ack(f);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_HIT_FAILED);
        assert_true(v.cached);
        assert_int_equal(v.state, IDEM_ST_FAILED);
        /* the class survives (the original wrapped it into a generic cached error) */
        assert_string_equal(v.error_class, "permission_denied");
        assert_string_equal(v.error_msg, "open /ro/x: EACCES");
        assert_int_equal(v.result_len, 6);
        assert_memory_equal(v.result, "exit=1", 6);
        assert_string_equal(idem_outcome_name(IDEM_HIT_FAILED), "cached_error");
}

static void test_explicit_keys(void **state)
{
        struct fx *f = *state;
        struct idem_view v;
        uint64_t lsn;
        mem_store(f);
        run_ok(f, "fs_write", "user-123-write", "{\"c\":1}", "A", 1);
        struct idem_request same = rq("fs_write", "user-123-write", "{\"c\":1}");
        assert_int_equal(idem_begin(f->s, &same, &v, &lsn), IDEM_HIT_COMPLETED);
        assert_string_equal(v.key, "fs_write:user-123-write");
        assert_memory_equal(v.result, "A", 1);
        /* another explicit key with the same input is another call */
        struct idem_request other = rq("fs_write", "user-124-write", "{\"c\":1}");
        assert_int_equal(idem_begin(f->s, &other, &v, &lsn), IDEM_PROCEED);
        /* and the content key of that input is yet another one */
        struct idem_request content = rq("fs_write", NULL, "{\"c\":1}");
        assert_int_equal(idem_lookup(f->s, &content, &v), IDEM_MISS);
        assert_int_equal(idem_get(f->s, "fs_write:user-123-write", &v), 0);
        assert_int_equal(idem_get(f->s, "fs_write:user-125-write", &v), -ENOENT);
}

static void test_stats(void **state)
{
        struct fx *f = *state;
        struct idem_stats st;
        struct idem_view v;
        uint64_t lsn;

        f->opt.capacity = 5;
        f->opt.ttl_sec = 100;
        mem_store(f);
        run_ok(f, "t", "a", "1", "x", 1);
        run_ok(f, "t", "b", "1", "x", 1);
        struct idem_request c = rq("t", "c", "1");
        assert_int_equal(idem_begin(f->s, &c, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_fail(f->s, "t:c", "boom", "m", NULL, 0, &lsn), 0);
        struct idem_request d = rq("t", "d", "1");
        assert_int_equal(idem_begin(f->s, &d, &v, &lsn), IDEM_PROCEED);
        struct idem_request e = rq("t", "e", "1");
        assert_int_equal(idem_begin(f->s, &e, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_interrupt(f->s, "t:e", "client_closed", &lsn), 0);
        ack(f);

        struct idem_request a = rq("t", "a", "1");
        assert_int_equal(idem_lookup(f->s, &a, &v), IDEM_HIT_COMPLETED);       /* hit */
        assert_int_equal(idem_begin(f->s, &c, &v, &lsn), IDEM_HIT_FAILED);     /* hit */
        assert_int_equal(idem_begin(f->s, &d, &v, &lsn), IDEM_IN_PROGRESS);    /* conflict */
        assert_int_equal(idem_begin(f->s, &e, &v, &lsn), IDEM_INTERRUPTED);    /* conflict */
        struct idem_request a2 = rq("t", "a", "2");
        assert_int_equal(idem_begin(f->s, &a2, &v, &lsn), IDEM_MISMATCH);      /* mismatch */
        struct idem_request g = rq("t", "g", "1");
        assert_int_equal(idem_begin(f->s, &g, &v, &lsn), IDEM_PROCEED);        /* miss, evicts b */
        struct idem_request h = rq("t", "h", "1");
        assert_int_equal(idem_lookup(f->s, &h, &v), IDEM_MISS);                /* miss */

        idem_stats(f->s, &st);
        assert_int_equal(st.size, 5);
        assert_int_equal(st.capacity, 5);
        assert_int_equal(st.ttl_sec, 100);
        assert_int_equal(st.processing, 2);
        assert_int_equal(st.completed, 1);
        assert_int_equal(st.failed, 1);
        assert_int_equal(st.interrupted, 1);
        assert_int_equal(st.hits, 2);
        assert_int_equal(st.misses, 7); /* a b c d e g h */
        assert_int_equal(st.conflicts, 2);
        assert_int_equal(st.mismatches, 1);
        assert_int_equal(st.evictions, 1);
        assert_int_equal(st.expirations, 0);
        assert_int_equal(idem_get(f->s, "t:b", &v), -ENOENT);

        f->now += 100 * 1000;
        assert_int_equal(idem_sweep(f->s), 2); /* a and c */
        idem_stats(f->s, &st);
        assert_int_equal(st.expirations, 2);
        assert_int_equal(st.size, 3);
}

/* ==== the fixed bugs ====================================================== */

/* Original: a duplicate arriving while the first call was processing ran the
 * handler again. */
static void test_duplicate_while_processing_is_in_progress(void **state)
{
        struct fx *f = *state;
        struct idem_request r = rq("cmd_run", "k", "{\"a\":1}");
        struct idem_view v;
        uint64_t lsn1, lsn2;
        int runs = 0;

        mem_store(f);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn1), IDEM_PROCEED);
        runs++;
        assert_false(v.durable);
        /* before and after the begin is durable: never a second execution */
        for (int i = 0; i < 2; i++) {
                int o = idem_begin(f->s, &r, &v, &lsn2);
                if (o == IDEM_PROCEED)
                        runs++;
                assert_int_equal(o, IDEM_IN_PROGRESS);
                assert_int_equal(v.state, IDEM_ST_PROCESSING);
                ack(f);
        }
        /* finished but not yet durable: still in progress, no result served */
        assert_int_equal(idem_complete(f->s, "cmd_run:k", "out", 3, &lsn2), 0);
        assert_true(lsn2 > lsn1);
        assert_int_equal(idem_begin(f->s, &r, &v, NULL), IDEM_IN_PROGRESS);
        idem_durable(f->s, lsn2);
        assert_int_equal(idem_begin(f->s, &r, &v, NULL), IDEM_HIT_COMPLETED);
        assert_int_equal(runs, 1);
        struct idem_stats st;
        idem_stats(f->s, &st);
        assert_int_equal(st.conflicts, 3);
        assert_string_equal(idem_outcome_name(IDEM_IN_PROGRESS), "in_progress");
}

/* Original: expiry only by a periodic sweeper, so lookups served expired entries. */
static void test_expiry_checked_on_lookup(void **state)
{
        struct fx *f = *state;
        struct idem_request r = rq("t", "k", "1");
        struct idem_view v;
        uint64_t lsn;

        f->opt.ttl_sec = 10;
        mem_store(f);
        run_ok(f, "t", "k", "1", "old", 3);
        f->now += 9999;
        assert_int_equal(idem_lookup(f->s, &r, &v), IDEM_HIT_COMPLETED);
        assert_int_equal(v.expires_ms, T0 + 10000);
        f->now = T0 + 10000;
        /* no sweeper call: the lookup itself sees the expiry */
        assert_int_equal(idem_lookup(f->s, &r, &v), IDEM_MISS);
        struct idem_stats st;
        idem_stats(f->s, &st);
        assert_int_equal(st.expirations, 1);
        assert_int_equal(st.size, 0);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        /* idem_get too checks the TTL */
        assert_int_equal(idem_complete(f->s, "t:k", "new", 3, &lsn), 0);
        ack(f);
        assert_int_equal(idem_get(f->s, "t:k", &v), 0);
        f->now += 10000;
        assert_int_equal(idem_get(f->s, "t:k", &v), -ENOENT);
        /* in-flight entries never expire */
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        f->now += 1000LL * 1000 * 1000;
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_IN_PROGRESS);
}

/* Original: capacity evicted the oldest entries whatever their state, so an
 * in-flight call's result was silently dropped. */
static void test_inflight_never_evicted(void **state)
{
        struct fx *f = *state;
        struct idem_view v;
        uint64_t lsn;
        char key[16];

        f->opt.capacity = 3;
        mem_store(f);
        for (int i = 0; i < 3; i++) {
                snprintf(key, sizeof(key), "p%d", i);
                struct idem_request r = rq("t", key, "1");
                assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        }
        assert_int_equal(idem_interrupt(f->s, "t:p0", NULL, &lsn), 0);
        struct idem_request x = rq("t", "x", "1");
        assert_int_equal(idem_begin(f->s, &x, &v, &lsn), IDEM_STORE_FULL);
        assert_int_equal(lsn, 0);
        assert_string_equal(idem_outcome_name(IDEM_STORE_FULL), "store_full");
        struct idem_stats st;
        idem_stats(f->s, &st);
        assert_int_equal(st.size, 3);
        assert_int_equal(st.store_full, 1);
        assert_int_equal(st.evictions, 0);
        for (int i = 0; i < 3; i++) {
                snprintf(key, sizeof(key), "t:p%d", i);
                assert_int_equal(idem_get(f->s, key, &v), 0);
        }
        /* once one finishes, it (and only it) can make room */
        assert_int_equal(idem_complete(f->s, "t:p1", "r", 1, &lsn), 0);
        ack(f);
        assert_int_equal(idem_begin(f->s, &x, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_get(f->s, "t:p1", &v), -ENOENT);
        assert_int_equal(idem_get(f->s, "t:p0", &v), 0);
        assert_int_equal(idem_get(f->s, "t:p2", &v), 0);
}

static void test_eviction_lru_order_mixed(void **state)
{
        struct fx *f = *state;
        struct idem_view v;
        uint64_t lsn;

        f->opt.capacity = 4;
        mem_store(f);
        run_ok(f, "t", "A", "1", "a", 1);
        run_ok(f, "t", "B", "1", "b", 1);
        struct idem_request c = rq("t", "C", "1");
        assert_int_equal(idem_begin(f->s, &c, &v, &lsn), IDEM_PROCEED);
        run_ok(f, "t", "D", "1", "d", 1);
        /* touch A: the LRU order of finished entries is now B, D, A */
        struct idem_request a = rq("t", "A", "1");
        assert_int_equal(idem_lookup(f->s, &a, &v), IDEM_HIT_COMPLETED);

        struct idem_request e = rq("t", "E", "1");
        assert_int_equal(idem_begin(f->s, &e, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_get(f->s, "t:B", &v), -ENOENT);
        assert_int_equal(idem_get(f->s, "t:D", &v), 0);
        struct idem_request g = rq("t", "F", "1");
        assert_int_equal(idem_begin(f->s, &g, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_get(f->s, "t:D", &v), -ENOENT);
        assert_int_equal(idem_get(f->s, "t:A", &v), 0);
        struct idem_request h = rq("t", "G", "1");
        assert_int_equal(idem_begin(f->s, &h, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_get(f->s, "t:A", &v), -ENOENT);
        /* C, E, F, G are all in flight */
        struct idem_request i = rq("t", "H", "1");
        assert_int_equal(idem_begin(f->s, &i, &v, &lsn), IDEM_STORE_FULL);
        assert_int_equal(idem_get(f->s, "t:C", &v), 0);
        assert_int_equal(v.state, IDEM_ST_PROCESSING);
        struct idem_stats st;
        idem_stats(f->s, &st);
        assert_int_equal(st.evictions, 3);
        assert_int_equal(st.processing, 4);
}

/* Original: explicit keys were not scoped by tool. */
static void test_explicit_key_two_tools_no_collision(void **state)
{
        struct fx *f = *state;
        struct idem_view v;
        mem_store(f);
        run_ok(f, "fs_write", "req-1", "{}", "write-result", 12);
        /* same explicit key and input on another tool: its own call */
        struct idem_request r = rq("cmd_run", "req-1", "{}");
        uint64_t lsn;
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_complete(f->s, "cmd_run:req-1", "run-result", 10, &lsn), 0);
        ack(f);
        assert_int_equal(idem_lookup(f->s, &r, &v), IDEM_HIT_COMPLETED);
        assert_memory_equal(v.result, "run-result", 10);
        struct idem_request w = rq("fs_write", "req-1", "{}");
        assert_int_equal(idem_lookup(f->s, &w, &v), IDEM_HIT_COMPLETED);
        assert_memory_equal(v.result, "write-result", 12);
        /* a tool name cannot smuggle a colon, an explicit key cannot pose as a content key */
        char k[IDEM_FULL_KEY_SIZE], fp[CANON_HASH_STRLEN];
        struct idem_request bad = rq("fs:write", "x", "{}");
        assert_int_equal(idem_make_key(&bad, k, fp), -EINVAL);
        bad = rq("fs_write", "content:abc", "{}");
        assert_int_equal(idem_make_key(&bad, k, fp), -EINVAL);
}

/* Original: no fingerprint, a reused explicit key returned another call's result. */
static void test_mismatch_detected(void **state)
{
        struct fx *f = *state;
        struct idem_view v;
        uint64_t lsn;
        int runs = 0;
        mem_store(f);
        run_ok(f, "fs_write", "k", "{\"content\":\"A\"}", "ok-A", 4);
        struct idem_request b = rq("fs_write", "k", "{\"content\":\"B\"}");
        int o = idem_begin(f->s, &b, &v, &lsn);
        runs += o == IDEM_PROCEED;
        assert_int_equal(o, IDEM_MISMATCH);
        assert_int_equal(lsn, 0);
        assert_false(v.cached);
        char fpa[CANON_HASH_STRLEN];
        assert_int_equal(canon_hash_json("{\"content\":\"A\"}", 15, fpa, NULL), 0);
        assert_string_equal(v.fingerprint, fpa);
        /* also while processing */
        struct idem_request p = rq("fs_write", "p", "{\"content\":\"A\"}");
        assert_int_equal(idem_begin(f->s, &p, &v, &lsn), IDEM_PROCEED);
        struct idem_request p2 = rq("fs_write", "p", "{\"content\":\"C\"}");
        assert_int_equal(idem_begin(f->s, &p2, &v, &lsn), IDEM_MISMATCH);
        /* a precomputed fingerprint is compared the same way */
        struct idem_request pre = { .tool = "fs_write", .key = "k", .fingerprint = fpa };
        assert_int_equal(idem_lookup(f->s, &pre, &v), IDEM_HIT_COMPLETED);
        struct idem_stats st;
        idem_stats(f->s, &st);
        assert_int_equal(st.mismatches, 2);
        assert_int_equal(runs, 0);
}

static void test_interrupted_and_forget(void **state)
{
        struct fx *f = *state;
        struct idem_request r = rq("cmd_run", "k", "[]");
        struct idem_view v;
        uint64_t lsn;
        mem_store(f);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        /* the caller may still be running it: an operator cannot forget it */
        assert_int_equal(idem_forget(f->s, "cmd_run:k", 0, "oops", &lsn), -EBUSY);
        assert_int_equal(idem_interrupt(f->s, "cmd_run:k", "client_closed", &lsn), 0);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_INTERRUPTED);
        assert_string_equal(v.reason, "client_closed");
        assert_int_equal(idem_complete(f->s, "cmd_run:k", "x", 1, &lsn), -ESTALE);
        assert_int_equal(idem_forget(f->s, "cmd_run:k", 1000, "checked by hand", &lsn), 0);
        assert_true(lsn > 0);
        assert_int_equal(idem_forget(f->s, "cmd_run:k", 1000, "again", &lsn), -ENOENT);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        struct kbuf b = KBUF_INIT;
        uint64_t upto;
        assert_int_equal(idem_take_pending(f->s, &b, &upto), 0);
        assert_int_equal(count_lines(b.data, b.len), 4);
        assert_non_null(strstr(b.data, "{\"op\":\"forget\",\"key\":\"cmd_run:k\",\"uid\":1000,"
                                       "\"reason\":\"checked by hand\","));
        kbuf_free(&b);
}

static void test_bad_arguments(void **state)
{
        struct fx *f = *state;
        struct idem_view v;
        uint64_t lsn;
        char k[IDEM_FULL_KEY_SIZE], fp[CANON_HASH_STRLEN];
        char longkey[IDEM_KEY_MAX + 2];
        memset(longkey, 'k', sizeof(longkey) - 1);
        longkey[sizeof(longkey) - 1] = '\0';
        struct idem_request bad[] = {
                rq("", "k", "1"), rq("a b", "k", "1"), rq("t", "", "1"), rq("t", "a\nb", "1"),
                rq("t", longkey, "1"), rq("t", "k", "{bad"), rq("t", "\xff", "1"),
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
                assert_int_equal(idem_make_key(&bad[i], k, fp), -EINVAL);
        struct idem_request badfp = { .tool = "t", .key = "k", .fingerprint = "sha256-xyz" };
        assert_int_equal(idem_make_key(&badfp, k, fp), -EINVAL);
        longkey[IDEM_KEY_MAX] = '\0';
        struct idem_request ok = rq("t", longkey, "1");
        assert_int_equal(idem_make_key(&ok, k, fp), 0);

        mem_store(f);
        assert_int_equal(idem_begin(f->s, &bad[0], &v, &lsn), -EINVAL);
        assert_int_equal(idem_complete(f->s, "t:nope", "x", 1, &lsn), -ENOENT);
        struct idem_request r = rq("t", "k", "1");
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_complete(f->s, "t:k", "x", (size_t)IDEM_RESULT_MAX + 1, &lsn),
                         -EFBIG);
        assert_int_equal(idem_fail(f->s, "t:k", "bad class", "m", NULL, 0, &lsn), -EINVAL);
        assert_int_equal(idem_fail(f->s, "t:k", "exit_status", "bad \xff utf8", NULL, 0, &lsn),
                         0);
        assert_int_equal(idem_get(f->s, "t:k", &v), 0);
        assert_string_equal(v.error_msg, "bad \xEF\xBF\xBD utf8");
        assert_int_equal(idem_complete(f->s, "t:k", "x", 1, &lsn), -ESTALE);
        struct idem_options neg = { .ttl_sec = -1 };
        struct idem_store *s2 = NULL;
        assert_int_equal(idem_store_new(&neg, &s2), -EINVAL);
        assert_null(s2);
}


static int stop_at_first(const struct idem_view *v, void *ctx)
{
        (*(int *)ctx)++;
        return 7;
}

static void test_owner_bad_refused(void **state)
{
        struct fx *f = *state;
        struct idem_view v;
        uint64_t lsn;
        mem_store(f);
        struct idem_step_owner bad[] = {
                { .mandate = "", .step = "act_001", .attempt = 1 },
                { .mandate = "m", .step = "", .attempt = 1 },
                { .mandate = "m", .step = "act_001", .attempt = 0 },
                { .mandate = "m/..", .step = "act_001", .attempt = 1 },
                { .mandate = "m", .step = "a\"b", .attempt = 1 },
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                struct idem_request r = rq("t", "k", "{}");
                r.owner = &bad[i];
                assert_int_equal(idem_owner_check(&bad[i]), -EINVAL);
                assert_int_equal(idem_begin(f->s, &r, &v, &lsn), -EINVAL);
        }
        struct idem_stats st;
        idem_stats(f->s, &st);
        assert_int_equal(st.size, 0);
        assert_int_equal(idem_foreach(f->s, NULL, NULL), -EINVAL);
        run_ok(f, "t", "a", "{}", "x", 1);
        run_ok(f, "t", "b", "{}", "x", 1);
        int calls = 0;
        assert_int_equal(idem_foreach(f->s, stop_at_first, &calls), 7);
        assert_int_equal(calls, 1);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_content_key_stable_across_key_order, setup, teardown),
                cmocka_unit_test_setup_teardown(test_owner_bad_refused, setup, teardown),
                cmocka_unit_test_setup_teardown(test_different_input_different_key, setup, teardown),
                cmocka_unit_test_setup_teardown(test_completed_duplicate_returns_cached_result, setup, teardown),
                cmocka_unit_test_setup_teardown(test_failed_duplicate_returns_cached_error_with_class, setup, teardown),
                cmocka_unit_test_setup_teardown(test_explicit_keys, setup, teardown),
                cmocka_unit_test_setup_teardown(test_stats, setup, teardown),
                cmocka_unit_test_setup_teardown(test_duplicate_while_processing_is_in_progress, setup, teardown),
                cmocka_unit_test_setup_teardown(test_expiry_checked_on_lookup, setup, teardown),
                cmocka_unit_test_setup_teardown(test_inflight_never_evicted, setup, teardown),
                cmocka_unit_test_setup_teardown(test_eviction_lru_order_mixed, setup, teardown),
                cmocka_unit_test_setup_teardown(test_explicit_key_two_tools_no_collision, setup, teardown),
                cmocka_unit_test_setup_teardown(test_mismatch_detected, setup, teardown),
                cmocka_unit_test_setup_teardown(test_interrupted_and_forget, setup, teardown),
                cmocka_unit_test_setup_teardown(test_bad_arguments, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
