/* SPDX-License-Identifier: MIT */
/* Tests of the idempotency store's log (docs/design.md §11): reload, torn
 * tails at every byte, bit flips, compaction, I/O errors through a failing
 * kio.  The store itself: test_idem.c. */
#include "idem_fixture.h"

/* ==== persistence ========================================================= */

static void open_fresh(struct fx *f)
{
        assert_int_equal(idem_store_new(&f->opt, &f->s), 0);
        assert_int_equal(idem_log_open(f->sub, &f->io, f->s, &f->l, &f->info), 0);
}

/* Original: state lost on restart. */
static void test_reload_after_begin_only_is_interrupted(void **state)
{
        struct fx *f = *state;
        struct idem_request r = rq("cmd_run", "k", "[\"x\"]");
        struct idem_view v;
        uint64_t lsn;

        open_fresh(f);
        assert_true(f->info.created);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        int syncs = f->fio.calls[OP_FDATASYNC];
        assert_int_equal(idem_sync(f->s, f->l), 0);
        assert_int_equal(f->fio.calls[OP_FDATASYNC], syncs + 1);
        assert_int_equal(idem_get(f->s, "cmd_run:k", &v), 0);
        assert_true(v.durable);
        /* the daemon dies here (nothing else written) */
        assert_int_equal(reopen(f), 0);
        assert_false(f->info.created);
        assert_int_equal(f->info.records, 1);
        assert_int_equal(f->info.interrupted, 1);
        assert_false(f->info.corrupt);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_INTERRUPTED);
        assert_string_equal(v.reason, "daemon_restart");
        assert_string_equal(idem_outcome_name(IDEM_INTERRUPTED), "interrupted");
        /* an operator clears it; the forget is durable and survives too */
        assert_int_equal(idem_forget(f->s, "cmd_run:k", 0, "ran by hand", &lsn), 0);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        assert_int_equal(reopen(f), 0);
        assert_int_equal(idem_get(f->s, "cmd_run:k", &v), -ENOENT);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
}

/* A call that did nothing is dropped by its caller: a retry proceeds, the
 * drop is logged as a forget (uid -1) and survives a reload. */
static void test_abandon(void **state)
{
        struct fx *f = *state;
        struct idem_request r = rq("kairos.write", "k", "{}");
        struct idem_view v;
        uint64_t lsn;
        open_fresh(f);
        assert_int_equal(idem_abandon(f->s, "kairos.write:k", "x", &lsn), -ENOENT);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_abandon(f->s, "kairos.write:k", "nothing written: EACCES", &lsn),
                         0);
        assert_true(lsn > 0);
        assert_int_equal(idem_get(f->s, "kairos.write:k", &v), -ENOENT);
        struct idem_stats st;
        idem_stats(f->s, &st);
        assert_int_equal(st.forgets, 0);
        assert_int_equal(st.processing, 0);
        assert_int_equal(st.size, 0);
        /* only processing entries: a finished one is the caller's answer */
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_complete(f->s, "kairos.write:k", "{}", 2, &lsn), 0);
        assert_int_equal(idem_abandon(f->s, "kairos.write:k", "x", &lsn), -ESTALE);
        assert_int_equal(idem_get(f->s, "kairos.write:k", &v), 0);
        struct idem_request r2 = rq("kairos.write", "k2", "{}");
        assert_int_equal(idem_begin(f->s, &r2, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_abandon(f->s, "kairos.write:k2", "refused", &lsn), 0);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        assert_int_equal(reopen(f), 0);
        assert_int_equal(f->info.interrupted, 0);
        assert_int_equal(idem_get(f->s, "kairos.write:k2", &v), -ENOENT);
        assert_int_equal(idem_get(f->s, "kairos.write:k", &v), 0);
        assert_int_equal(idem_begin(f->s, &r2, &v, &lsn), IDEM_PROCEED);
}

static void test_reload_after_finish_replays_bytes(void **state)
{
        struct fx *f = *state;
        unsigned char payload[1000];
        for (size_t i = 0; i < sizeof(payload); i++)
                payload[i] = (unsigned char)(i * 7);
        struct idem_request r = rq("cmd_run", "k", "[\"x\"]");
        struct idem_request e = rq("fs_write", NULL, "{\"p\":\"/ro\"}");
        struct idem_request z = rq("cmd_run", "empty", "[]");
        struct idem_view v;
        uint64_t lsn;

        open_fresh(f);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_begin(f->s, &e, &v, &lsn), IDEM_PROCEED);
        char ekey[IDEM_FULL_KEY_SIZE];
        snprintf(ekey, sizeof(ekey), "%s", v.key);
        assert_int_equal(idem_begin(f->s, &z, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        assert_int_equal(idem_complete(f->s, "cmd_run:k", payload, sizeof(payload), &lsn), 0);
        assert_int_equal(idem_fail(f->s, ekey, "permission_denied", "line1\nline2 \"q\"",
                                   "\0err", 4, &lsn), 0);
        assert_int_equal(idem_complete(f->s, "cmd_run:empty", NULL, 0, &lsn), 0);
        assert_int_equal(idem_sync(f->s, f->l), 0);

        f->now += 3600 * 1000;
        assert_int_equal(reopen(f), 0);
        assert_int_equal(f->info.records, 6);
        assert_int_equal(f->info.entries, 3);
        assert_int_equal(f->info.interrupted, 0);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_HIT_COMPLETED);
        assert_int_equal(v.result_len, sizeof(payload));
        assert_memory_equal(v.result, payload, sizeof(payload));
        assert_int_equal(v.created_ms, T0);
        assert_int_equal(v.finished_ms, T0);
        assert_int_equal(idem_begin(f->s, &e, &v, &lsn), IDEM_HIT_FAILED);
        assert_string_equal(v.error_class, "permission_denied");
        assert_string_equal(v.error_msg, "line1\nline2 \"q\"");
        assert_int_equal(v.result_len, 4);
        assert_memory_equal(v.result, "\0err", 4);
        assert_int_equal(idem_begin(f->s, &z, &v, &lsn), IDEM_HIT_COMPLETED);
        assert_int_equal(v.result_len, 0);
        assert_non_null(v.result);

        /* the TTL counts across restarts */
        f->now = T0 + 86400LL * 1000;
        assert_int_equal(reopen(f), 0);
        assert_int_equal(f->info.expired, 3);
        assert_int_equal(f->info.entries, 0);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
}

/* ---- a realistic log and an independent model of it ---- */

struct mrec {
        const char *key;
        const char *op;         /* begin complete fail interrupt forget */
        const char *payload;
        size_t len;
};

static const char big_payload[] =
        "exit_status=0\0stdout:\n"
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor\n"
        "incididunt ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud\n"
        "\x01\x02\x03\xff\xfe stderr: warning: something \"quoted\" \\ back\n";

static const struct mrec model[] = {
        { "run:content:", "begin", NULL, 0 },           /* key filled in at run time */
        { "run:content:", "complete", "A\0B", 3 },
        { "write:k1", "begin", NULL, 0 },
        { "write:k1", "fail", "E", 1 },
        { "run:k2", "begin", NULL, 0 },
        { "run:k2", "interrupt", NULL, 0 },
        { "run:k2", "forget", NULL, 0 },
        { "run:k3", "begin", NULL, 0 },
        { "run:k3", "complete", "", 0 },
        { "run:k4", "begin", NULL, 0 },
        { "run:k5", "begin", NULL, 0 },
        { "run:k5", "complete", big_payload, sizeof(big_payload) },
        { "run:k6", "begin", NULL, 0 },
        { "run:k6", "interrupt", NULL, 0 },
};
#define NMODEL (sizeof(model) / sizeof(model[0]))

static char content_key[IDEM_FULL_KEY_SIZE];

static const char *mkey(size_t i)
{
        return strcmp(model[i].key, "run:content:") == 0 ? content_key : model[i].key;
}

/* Calls a step made (owned): their owner is in every record of them. */
static bool model_owned(const char *key)
{
        return !strcmp(key, "write:k1") || !strcmp(key, "run:k4") || !strcmp(key, "run:k6");
}

static const struct idem_step_owner model_owner = { .mandate = "mnd_plan_0123456789ab",
                                                    .step = "act_001", .attempt = 3 };

/* Write the model's records through the store, one sync each. */
static void write_model(struct fx *f)
{
        struct idem_view v;
        uint64_t lsn;
        open_fresh(f);
        for (size_t i = 0; i < NMODEL; i++) {
                const char *op = model[i].op;
                if (!strcmp(op, "begin")) {
                        char tool[16];
                        const char *colon = strchr(model[i].key, ':');
                        snprintf(tool, sizeof(tool), "%.*s", (int)(colon - model[i].key),
                                 model[i].key);
                        bool content = strcmp(colon + 1, "content:") == 0;
                        struct idem_request r = rq(tool, content ? NULL : colon + 1,
                                                   "{\"cmd\":[\"echo\",\"a\"]}");
                        if (model_owned(model[i].key))
                                r.owner = &model_owner;
                        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
                        if (i == 0)
                                snprintf(content_key, sizeof(content_key), "%s", v.key);
                } else if (!strcmp(op, "complete")) {
                        assert_int_equal(idem_complete(f->s, mkey(i), model[i].payload,
                                                       model[i].len, &lsn), 0);
                } else if (!strcmp(op, "fail")) {
                        assert_int_equal(idem_fail(f->s, mkey(i), "exit_status", "exit 3",
                                                   model[i].payload, model[i].len, &lsn), 0);
                } else if (!strcmp(op, "interrupt")) {
                        assert_int_equal(idem_interrupt(f->s, mkey(i), "client_closed", &lsn), 0);
                } else {
                        assert_int_equal(idem_forget(f->s, mkey(i), 1000, "operator", &lsn), 0);
                }
                assert_int_equal(idem_sync(f->s, f->l), 0);
        }
        idem_log_close(f->l);
        idem_store_free(f->s);
        f->l = NULL;
        f->s = NULL;
}

/* Check the store against the model replayed up to record n (exclusive). */
static void check_model(struct idem_store *s, size_t n)
{
        for (size_t i = 0; i < NMODEL; i++) {
                const char *key = mkey(i);
                int st = -1; /* -1: absent */
                const struct mrec *last = NULL;
                for (size_t j = 0; j < n; j++) {
                        if (strcmp(mkey(j), key) != 0)
                                continue;
                        const char *op = model[j].op;
                        st = !strcmp(op, "begin") ? IDEM_ST_PROCESSING
                           : !strcmp(op, "complete") ? IDEM_ST_COMPLETED
                           : !strcmp(op, "fail") ? IDEM_ST_FAILED
                           : !strcmp(op, "interrupt") ? IDEM_ST_INTERRUPTED : -1;
                        last = &model[j];
                }
                if (st == IDEM_ST_PROCESSING)
                        st = IDEM_ST_INTERRUPTED;
                struct idem_view v;
                int r = idem_get(s, key, &v);
                if (st < 0) {
                        assert_int_equal(r, -ENOENT);
                        continue;
                }
                assert_int_equal(r, 0);
                assert_int_equal(v.state, st);
                if (model_owned(key)) {
                        assert_non_null(v.owner);
                        assert_string_equal(v.owner->mandate, model_owner.mandate);
                        assert_string_equal(v.owner->step, model_owner.step);
                        assert_int_equal(v.owner->attempt, model_owner.attempt);
                } else {
                        assert_null(v.owner);
                }
                if (st == IDEM_ST_COMPLETED || st == IDEM_ST_FAILED) {
                        assert_int_equal(v.result_len, last->len);
                        if (last->len)
                                assert_memory_equal(v.result, last->payload, last->len);
                }
        }
}

static void nosync(struct fx *f)
{
        f->fio.nosync = true;
}

static void test_model_reload(void **state)
{
        struct fx *f = *state;
        nosync(f);
        write_model(f);
        assert_int_equal(reopen(f), 0);
        assert_int_equal(f->info.records, NMODEL);
        assert_false(f->info.corrupt);
        assert_false(f->info.torn_repaired);
        check_model(f->s, NMODEL);
}

/* Torn tail at every byte offset: load never fails, keeps exactly the complete
 * records, keeps the torn bytes aside, cuts them off, and the next record
 * lands cleanly after them (the original glued it to the fragment). */
static void test_torn_tail_every_offset(void **state)
{
        struct fx *f = *state;
        size_t len;
        nosync(f);
        write_model(f);
        char *full = slurp(f->log, &len);
        assert_non_null(full);
        assert_int_equal(count_lines(full, len), NMODEL);

        for (size_t k = 0; k <= len; k++) {
                spit(f->log, full, k);
                /* the offline reader sees the same, and leaves the file as is */
                struct idem_store *ro;
                struct idem_load_info ri;
                struct stat rst;
                assert_int_equal(idem_store_new(&f->opt, &ro), 0);
                assert_int_equal(idem_log_read(f->sub, ro, &ri), 0);
                assert_false(ri.corrupt);
                assert_int_equal(ri.records, count_lines(full, k));
                check_model(ro, count_lines(full, k));
                idem_store_free(ro);
                assert_int_equal(stat(f->log, &rst), 0);
                assert_int_equal((size_t)rst.st_size, k);
                assert_int_equal(reopen(f), 0);
                size_t complete = count_lines(full, k);
                size_t boundary = 0;
                for (size_t i = 0; i < k; i++)
                        if (full[i] == '\n')
                                boundary = i + 1;
                assert_false(f->info.corrupt);
                assert_int_equal(f->info.records, complete);
                assert_int_equal(f->info.torn_repaired, boundary < k);
                check_model(f->s, complete);
                struct stat st;
                assert_int_equal(stat(f->log, &st), 0);
                assert_int_equal((size_t)st.st_size, boundary);
                if (boundary < k) {
                        assert_int_equal(f->info.torn_bytes, k - boundary);
                        size_t tl;
                        char *torn = slurp(f->info.torn_path, &tl);
                        assert_non_null(torn);
                        assert_int_equal(tl, k - boundary);
                        assert_memory_equal(torn, full + boundary, tl);
                        free(torn);
                        unlink(f->info.torn_path);
                }
                /* append after the repair, reload: clean, one more record */
                struct idem_request r = rq("after", "x", "1");
                uint64_t lsn;
                assert_int_equal(idem_begin(f->s, &r, NULL, &lsn), IDEM_PROCEED);
                assert_int_equal(idem_sync(f->s, f->l), 0);
                assert_int_equal(reopen(f), 0);
                assert_false(f->info.corrupt);
                assert_false(f->info.torn_repaired);
                assert_int_equal(f->info.records, complete + 1);
                struct idem_view v;
                assert_int_equal(idem_get(f->s, "after:x", &v), 0);
                assert_int_equal(v.state, IDEM_ST_INTERRUPTED);
        }
        /* NUL bytes after the last record (a crash that extended the file) */
        char *z = calloc(1, len + 64);
        assert_non_null(z);
        memcpy(z, full, len);
        spit(f->log, z, len + 64);
        assert_int_equal(reopen(f), 0);
        assert_false(f->info.corrupt);
        assert_true(f->info.torn_repaired);
        assert_int_equal(f->info.records, NMODEL);
        free(z);
        free(full);
}

/* Every single-bit flip is reported (line, offset), the store refuses to
 * write, keeps every good record, and an operator compaction repairs it. */
static void test_bit_flips_reported(void **state)
{
        struct fx *f = *state;
        size_t len;
        nosync(f);
        write_model(f);
        char *full = slurp(f->log, &len);
        assert_non_null(full);
        char *buf = malloc(len);
        assert_non_null(buf);

        size_t line = 1, line_start = 0;
        for (size_t i = 0; i < len; i++) {
                for (int bit = 0; bit < 8; bit++) {
                        if (bit != (int)(i % 8) && line != 5 && line != NMODEL)
                                continue; /* every bit of two lines, one bit elsewhere */
                        memcpy(buf, full, len);
                        buf[i] ^= (char)(1u << bit);
                        spit(f->log, buf, len);
                        assert_int_equal(reopen(f), 0);
                        assert_true(f->info.corrupt);
                        assert_int_equal(f->info.bad_line, line);
                        assert_int_equal(f->info.bad_offset, line_start);
                        assert_true(f->info.records >= NMODEL - 2);
                        assert_int_equal(idem_log_error(f->l), -EBADMSG);
                        struct idem_stats st;
                        idem_stats(f->s, &st);
                        assert_true(st.quarantined);
                        struct idem_request r = rq("new", "x", "1");
                        uint64_t lsn;
                        assert_int_equal(idem_begin(f->s, &r, NULL, &lsn), -EBADMSG);
                }
                if (full[i] == '\n') {
                        line++;
                        line_start = i + 1;
                }
        }
        /* the file was never touched by a quarantined load */
        size_t l2;
        char *after = slurp(f->log, &l2);
        assert_int_equal(l2, len);
        assert_memory_equal(after, buf, len);
        free(after);

        /* a flipped payload byte of run:k5's complete: the key is not served
         * and not forgotten, it needs an operator */
        memcpy(buf, full, len);
        char *k5 = strstr(buf, "{\"op\":\"complete\",\"key\":\"run:k5\"");
        assert_non_null(k5);
        char *res = strstr(k5, "\"result\":\"");
        res[12] ^= 0x01;
        spit(f->log, buf, len);
        assert_int_equal(reopen(f), 0);
        assert_true(f->info.corrupt);
        assert_int_equal(f->info.bad_line, 12);
        struct idem_view v;
        assert_int_equal(idem_get(f->s, "run:k5", &v), 0);
        assert_int_equal(v.state, IDEM_ST_INTERRUPTED);
        assert_string_equal(v.reason, "corrupt_record");
        /* records after the bad line were kept: run:k6 interrupted, run:k3 completed */
        assert_int_equal(idem_get(f->s, "run:k6", &v), 0);
        assert_int_equal(v.state, IDEM_ST_INTERRUPTED);
        struct idem_request k3 = rq("run", "k3", "{\"cmd\":[\"echo\",\"a\"]}");
        assert_int_equal(idem_lookup(f->s, &k3, &v), IDEM_HIT_COMPLETED);
        assert_false(idem_needs_compaction(f->s));

        /* operator repair: the corrupt file is kept, the log rewritten */
        assert_int_equal(idem_compact_sync(f->s, f->l), 0);
        assert_int_equal(idem_log_error(f->l), 0);
        char corrupt[512];
        snprintf(corrupt, sizeof(corrupt), "%s.corrupt.%lld", f->log, (long long)(T0 / 1000));
        char *kept = slurp(corrupt, &l2);
        assert_non_null(kept);
        assert_int_equal(l2, len);
        assert_memory_equal(kept, buf, len);
        free(kept);
        struct idem_request r = rq("new", "x", "1");
        uint64_t lsn;
        assert_int_equal(idem_begin(f->s, &r, NULL, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        assert_int_equal(reopen(f), 0);
        assert_false(f->info.corrupt);
        assert_int_equal(idem_get(f->s, "run:k5", &v), 0);
        assert_int_equal(v.state, IDEM_ST_INTERRUPTED);
        assert_int_equal(idem_lookup(f->s, &k3, &v), IDEM_HIT_COMPLETED);
        assert_int_equal(idem_get(f->s, "new:x", &v), 0);
        free(buf);
        free(full);
}

static void test_load_unknown_ops_and_bad_records(void **state)
{
        struct fx *f = *state;
        nosync(f);
        open_fresh(f);
        struct idem_request r = rq("t", "k", "1");
        uint64_t lsn;
        assert_int_equal(idem_begin(f->s, &r, NULL, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_complete(f->s, "t:k", "v", 1, &lsn), 0);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        idem_log_close(f->l);
        f->l = NULL;

        /* a crc-valid record of an op from the future: ignored */
        struct kbuf b = KBUF_INIT;
        const char *body = "{\"op\":\"future\",\"key\":\"t:k\",\"x\":1}";
        char line[256];
        /* the crc of the line without ,"crc":"...", as the writer computes it */
        uint32_t crc = wal_crc(body, strlen(body));
        snprintf(line, sizeof(line), "%.*s,\"crc\":\"%08x\"}\n", (int)strlen(body) - 1, body, crc);
        size_t len;
        char *old = slurp(f->log, &len);
        assert_int_equal(kbuf_append(&b, old, len), 0);
        assert_int_equal(kbuf_puts(&b, line), 0);
        spit(f->log, b.data, b.len);
        assert_int_equal(reopen(f), 0);
        assert_false(f->info.corrupt);
        assert_int_equal(f->info.unknown_ops, 1);
        assert_int_equal(f->info.records, 3);
        struct idem_view v;
        assert_int_equal(idem_lookup(f->s, &r, &v), IDEM_HIT_COMPLETED);

        /* a crc-valid begin without its fingerprint: corruption, not ignored */
        body = "{\"op\":\"begin\",\"key\":\"t:z\",\"tool\":\"t\",\"created\":1}";
        crc = wal_crc(body, strlen(body));
        snprintf(line, sizeof(line), "%.*s,\"crc\":\"%08x\"}\n", (int)strlen(body) - 1, body, crc);
        kbuf_reset(&b);
        assert_int_equal(kbuf_append(&b, old, len), 0);
        assert_int_equal(kbuf_puts(&b, line), 0);
        spit(f->log, b.data, b.len);
        assert_int_equal(reopen(f), 0);
        assert_true(f->info.corrupt);
        assert_int_equal(f->info.bad_line, 3);
        assert_int_equal(f->info.bad_offset, len);
        assert_string_equal(f->info.bad_reason, "record with missing or bad fields");
        /* its key is kept for review */
        assert_int_equal(idem_get(f->s, "t:z", &v), 0);
        assert_int_equal(v.state, IDEM_ST_INTERRUPTED);
        free(old);
        kbuf_free(&b);
}

/* Compaction keeps every live entry (state, payload, LRU order) and drops
 * forgotten, expired and evicted ones. */
/* The owner of a call (the step whose handler made it) is kept in the entry,
 * in every record of it, across a reload and a compaction; a bad owner is
 * refused; idem_foreach finds a step's calls. */
struct owned_count {
        const char *mandate, *step;
        int n, processing;
};

static int count_owned(const struct idem_view *v, void *ctx)
{
        struct owned_count *c = ctx;
        if (v->owner && strcmp(v->owner->mandate, c->mandate) == 0 &&
            strcmp(v->owner->step, c->step) == 0) {
                c->n++;
                c->processing += v->state == IDEM_ST_PROCESSING ||
                                 v->state == IDEM_ST_INTERRUPTED;
        }
        return 0;
}

static void test_owner_recorded_and_reloaded(void **state)
{
        struct fx *f = *state;
        struct idem_step_owner o = { .mandate = "mnd_plan_0123456789ab", .step = "act_001",
                                .attempt = 2 };
        struct idem_request r = rq("cmd_run", "k1", "[\"x\"]");
        struct idem_request r2 = rq("cmd_run", "k2", "[\"y\"]");
        struct idem_request r3 = rq("cmd_run", "k3", "[\"z\"]");
        struct idem_view v;
        uint64_t lsn;

        open_fresh(f);
        r.owner = &o;
        r2.owner = &o;
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        assert_non_null(v.owner);
        assert_string_equal(v.owner->step, "act_001");
        assert_int_equal(idem_complete(f->s, "cmd_run:k1", "ok", 2, &lsn), 0);
        assert_int_equal(idem_begin(f->s, &r2, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_begin(f->s, &r3, &v, &lsn), IDEM_PROCEED);
        assert_null(v.owner);
        assert_int_equal(idem_sync(f->s, f->l), 0);

        size_t len;
        char *log = slurp(f->log, &len);
        assert_non_null(strstr(log, ",\"owner\":{\"mandate\":\"mnd_plan_0123456789ab\","
                                    "\"step\":\"act_001\",\"attempt\":2},"));
        free(log);

        /* the daemon dies: k2 comes back interrupted, still owned */
        assert_int_equal(reopen(f), 0);
        assert_false(f->info.corrupt);
        assert_int_equal(idem_get(f->s, "cmd_run:k1", &v), 0);
        assert_non_null(v.owner);
        assert_string_equal(v.owner->mandate, "mnd_plan_0123456789ab");
        assert_int_equal(v.owner->attempt, 2);
        assert_int_equal(idem_get(f->s, "cmd_run:k2", &v), 0);
        assert_int_equal(v.state, IDEM_ST_INTERRUPTED);
        assert_non_null(v.owner);
        assert_int_equal(idem_get(f->s, "cmd_run:k3", &v), 0);
        assert_null(v.owner);

        struct owned_count c = { "mnd_plan_0123456789ab", "act_001", 0, 0 };
        assert_int_equal(idem_foreach(f->s, count_owned, &c), 0);
        assert_int_equal(c.n, 2);
        assert_int_equal(c.processing, 1);

        /* compaction keeps the owners */
        assert_int_equal(idem_compact_sync(f->s, f->l), 0);
        assert_int_equal(reopen(f), 0);
        c = (struct owned_count){ "mnd_plan_0123456789ab", "act_001", 0, 0 };
        assert_int_equal(idem_foreach(f->s, count_owned, &c), 0);
        assert_int_equal(c.n, 2);
        assert_int_equal(c.processing, 1);
}

/* A tool run's client (pid, start time) is recorded and reloaded (also after
 * a compaction); a call a crash left interrupted is finished late only with
 * its fingerprint, and only while interrupted. */
static void test_client_and_late_finish(void **state)
{
        struct fx *f = *state;
        struct idem_client cl = { .pid = 4242, .start = 987654321 };
        struct idem_request r = rq("cmd_run", "k1", "[\"x\"]");
        struct idem_request r2 = rq("cmd_run", "k2", "[\"y\"]");
        struct idem_view v;
        uint64_t lsn;
        char fp[CANON_HASH_STRLEN];

        open_fresh(f);
        r.client = &cl;
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(v.client.pid, 4242);
        snprintf(fp, sizeof fp, "%s", v.fingerprint);
        assert_int_equal(idem_begin(f->s, &r2, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(v.client.pid, 0);
        /* a processing entry is its connection's: not finished late */
        assert_int_equal(idem_finish_late(f->s, "cmd_run:k1", fp, NULL, NULL, "ok", 2, &lsn),
                         -ESTALE);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        size_t len;
        char *log = slurp(f->log, &len);
        assert_non_null(strstr(log, ",\"client\":{\"pid\":4242,\"start\":987654321},"));
        free(log);

        /* kairosd dies: k1 comes back interrupted with its client */
        assert_int_equal(reopen(f), 0);
        assert_int_equal(idem_get(f->s, "cmd_run:k1", &v), 0);
        assert_int_equal(v.state, IDEM_ST_INTERRUPTED);
        assert_int_equal(v.client.pid, 4242);
        assert_int_equal(v.client.start, 987654321);
        assert_int_equal(idem_finish_late(f->s, "cmd_run:k1", "sha256-0000", NULL, NULL, "ok", 2,
                                          &lsn),
                         -EPERM);
        assert_int_equal(idem_finish_late(f->s, "cmd_run:k1", fp, "bad class!", "x", "ok", 2,
                                          &lsn),
                         -EINVAL);
        assert_int_equal(idem_finish_late(f->s, "cmd_run:nope", fp, NULL, NULL, "ok", 2, &lsn),
                         -ENOENT);
        assert_int_equal(idem_finish_late(f->s, "cmd_run:k1", fp, NULL, NULL, "ok", 2, &lsn), 0);
        assert_int_equal(idem_get(f->s, "cmd_run:k1", &v), 0);
        assert_int_equal(v.state, IDEM_ST_COMPLETED);
        assert_null(v.reason);
        assert_int_equal(idem_finish_late(f->s, "cmd_run:k1", fp, NULL, NULL, "ok", 2, &lsn),
                         -ESTALE);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        assert_int_equal(idem_compact_sync(f->s, f->l), 0);
        assert_int_equal(reopen(f), 0);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_HIT_COMPLETED);
        assert_int_equal(v.result_len, 2);
        assert_int_equal(v.client.pid, 4242);
}

/* A tool write's claim (path, sha256, bytes) is kept in every record of its
 * entry, across a reload and a compaction; a log without it still loads;
 * settle decides an interrupted entry: completed (a duplicate replays it) or
 * dropped (recorded as a forget with uid -2: a retry proceeds). */
static void test_write_claim_and_settle(void **state)
{
        struct fx *f = *state;
        static const char sha[] =
                "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        struct idem_write_claim w = { .path = "/srv/out/a \"q\"", .sha256 = sha, .bytes = 12 };
        struct idem_request r1 = rq("kairos.write", "k1", "{}");
        struct idem_request r2 = rq("kairos.write", "k2", "{}");
        struct idem_request r3 = rq("kairos.write", "k3", "{}");
        struct idem_view v;
        uint64_t lsn;

        open_fresh(f);
        struct idem_write_claim bad = { .path = "/x", .sha256 = "0123", .bytes = 1 };
        r1.write = &bad;
        assert_int_equal(idem_begin(f->s, &r1, &v, &lsn), -EINVAL);
        r1.write = r2.write = &w;
        assert_int_equal(idem_begin(f->s, &r1, &v, &lsn), IDEM_PROCEED);
        assert_string_equal(v.write.path, w.path);
        assert_string_equal(v.write.sha256, sha);
        assert_int_equal(v.write.bytes, 12);
        assert_int_equal(idem_begin(f->s, &r2, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_begin(f->s, &r3, &v, &lsn), IDEM_PROCEED);
        assert_null(v.write.path);
        /* not finished: settle is for open entries only */
        assert_int_equal(idem_settle_complete(f->s, "kairos.write:nope", "x", 1, &lsn), -ENOENT);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        size_t len;
        char *log = slurp(f->log, &len);
        assert_non_null(strstr(log, ",\"write\":{\"sha256\":\"0123456789abcdef0123456789abcdef"
                                    "0123456789abcdef0123456789abcdef\",\"bytes\":12,"
                                    "\"path\":\"/srv/out/a \\\"q\\\"\"},"));
        free(log);

        /* the daemon dies: both come back interrupted, with their claims */
        assert_int_equal(reopen(f), 0);
        assert_int_equal(f->info.interrupted, 3);
        assert_int_equal(idem_get(f->s, "kairos.write:k1", &v), 0);
        assert_int_equal(v.state, IDEM_ST_INTERRUPTED);
        assert_string_equal(v.write.path, w.path);
        assert_string_equal(v.write.sha256, sha);
        assert_int_equal(v.write.bytes, 12);
        assert_int_equal(idem_get(f->s, "kairos.write:k3", &v), 0);
        assert_null(v.write.path);
        assert_int_equal(idem_settle_complete(f->s, "kairos.write:k1", "{\"path\":1}", 10, &lsn),
                         0);
        assert_int_equal(idem_settle_abandon(f->s, "kairos.write:k2", "no file", &lsn), 0);
        assert_int_equal(idem_settle_complete(f->s, "kairos.write:k1", "x", 1, &lsn), -ESTALE);
        assert_int_equal(idem_settle_abandon(f->s, "kairos.write:k1", "x", &lsn), -ESTALE);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        log = slurp(f->log, &len);
        assert_non_null(strstr(log, "{\"op\":\"forget\",\"key\":\"kairos.write:k2\","
                                    "\"uid\":-2,\"reason\":\"no file\""));
        free(log);
        assert_int_equal(reopen(f), 0);
        assert_int_equal(f->info.interrupted, 1);
        assert_int_equal(idem_begin(f->s, &r1, &v, &lsn), IDEM_HIT_COMPLETED);
        assert_memory_equal(v.result, "{\"path\":1}", 10);
        assert_string_equal(v.write.path, w.path);
        assert_int_equal(idem_begin(f->s, &r2, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        /* compaction keeps the claims */
        assert_int_equal(idem_compact_sync(f->s, f->l), 0);
        assert_int_equal(reopen(f), 0);
        assert_int_equal(idem_get(f->s, "kairos.write:k2", &v), 0);
        assert_int_equal(v.state, IDEM_ST_INTERRUPTED);
        assert_string_equal(v.write.sha256, sha);
        assert_int_equal(idem_get(f->s, "kairos.write:k1", &v), 0);
        assert_string_equal(v.write.path, w.path);
}

/* A tool run's check is kept with its claim: in the begin record, through
 * a reload, a settle and a compaction; a bad one is refused; an entry
 * without one has none. */
static void test_check_recorded_and_reloaded(void **state)
{
        struct fx *f = *state;
        static const char chk[] = "{\"cmd\":[\"sh\",\"/c \\\"q\\\"\"],\"argv\":[\"sh\",{\"b64\":\"/w==\"}]}";
        struct idem_request r1 = rq("cmd", "k1", "{}");
        struct idem_request r2 = rq("cmd", "k2", "{}");
        struct idem_view v;
        uint64_t lsn;
        char *norm = NULL;

        open_fresh(f);
        static const char *const bad[] = {
                "{}", "[]", "{\"cmd\":[],\"argv\":[]}", "{\"cmd\":[\"\"],\"argv\":[]}",
                "{\"cmd\":[\"x\"]}", "{\"cmd\":[1],\"argv\":[]}", "{\"cmd\":[\"x\"],\"argv\":{}}",
                "{\"cmd\":[\"x\"], \"argv\":[]}", /* not compact */
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                r1.check = bad[i];
                assert_int_equal(idem_begin(f->s, &r1, &v, &lsn), -EINVAL);
        }
        static const char loose[] = "{\"cmd\":[\"x\"], \"argv\":[ ]}";
        assert_int_equal(idem_check_normalize(loose, strlen(loose), &norm), 0);
        assert_string_equal(norm, "{\"cmd\":[\"x\"],\"argv\":[]}");
        free(norm);
        assert_int_equal(idem_check_normalize("{\"cmd\":[]}", 10, &norm), -EINVAL);
        assert_null(norm);
        r1.check = chk;
        assert_int_equal(idem_begin(f->s, &r1, &v, &lsn), IDEM_PROCEED);
        assert_string_equal(v.check, chk);
        assert_int_equal(idem_begin(f->s, &r2, &v, &lsn), IDEM_PROCEED);
        assert_null(v.check);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        size_t len;
        char *log = slurp(f->log, &len);
        assert_non_null(strstr(log, ",\"check\":{\"cmd\":[\"sh\",\"/c \\\"q\\\"\"],"));
        free(log);
        /* the daemon dies: the call comes back interrupted, with its check */
        assert_int_equal(reopen(f), 0);
        assert_int_equal(idem_get(f->s, "cmd:k1", &v), 0);
        assert_int_equal(v.state, IDEM_ST_INTERRUPTED);
        assert_string_equal(v.check, chk);
        assert_int_equal(idem_get(f->s, "cmd:k2", &v), 0);
        assert_null(v.check);
        /* settled by its check: completed, the check kept */
        assert_int_equal(idem_settle_complete(f->s, "cmd:k1", "{}", 2, &lsn), 0);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        assert_int_equal(idem_compact_sync(f->s, f->l), 0);
        assert_int_equal(reopen(f), 0);
        assert_int_equal(idem_get(f->s, "cmd:k1", &v), 0);
        assert_int_equal(v.state, IDEM_ST_COMPLETED);
        assert_string_equal(v.check, chk);
}

/* idem_log_read: an offline reader (kairosctl recover --dry-run) sees what a
 * daemon's start would (processing → interrupted, owners) and changes nothing
 * on disk: no directory made, a torn tail counted but not cut, no lock. */
static void test_log_read_only(void **state)
{
        struct fx *f = *state;
        struct idem_step_owner o = { .mandate = "mnd_plan_0123456789ab", .step = "act_001",
                                     .attempt = 1 };
        struct idem_request r = rq("cmd_run", "k1", "[\"x\"]");
        struct idem_request r2 = rq("cmd_run", "k2", "[\"y\"]");
        struct idem_view v;
        uint64_t lsn;
        struct idem_store *ro = NULL;
        struct idem_load_info info;
        struct stat st;

        /* no log, no directory: an empty store, nothing created */
        assert_int_equal(idem_store_new(&f->opt, &ro), 0);
        assert_int_equal(idem_log_read(f->sub, ro, &info), 0);
        assert_true(info.created);
        assert_int_equal(stat(f->sub, &st), -1);
        idem_store_free(ro);

        open_fresh(f);
        r.owner = &o;
        r2.owner = &o;
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_complete(f->s, "cmd_run:k1", "ok", 2, &lsn), 0);
        assert_int_equal(idem_begin(f->s, &r2, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        /* a torn tail after the good records */
        FILE *fp = fopen(f->log, "ab");
        assert_non_null(fp);
        fputs("{\"op\":\"begin\",\"key\":\"cmd_run:k3\"", fp);
        fclose(fp);
        size_t before_len, after_len;
        char *before = slurp(f->log, &before_len);

        assert_int_equal(idem_store_new(&f->opt, &ro), 0);
        assert_int_equal(idem_log_read(f->sub, ro, &info), 0);
        assert_false(info.created);
        assert_false(info.corrupt);
        assert_int_equal(info.entries, 2);
        assert_int_equal(info.interrupted, 1);
        assert_true(info.torn_bytes > 0);
        assert_false(info.torn_repaired);
        assert_int_equal(idem_get(ro, "cmd_run:k1", &v), 0);
        assert_int_equal(v.state, IDEM_ST_COMPLETED);
        assert_non_null(v.owner);
        assert_string_equal(v.owner->step, "act_001");
        assert_int_equal(idem_get(ro, "cmd_run:k2", &v), 0);
        assert_int_equal(v.state, IDEM_ST_INTERRUPTED);
        /* a second load into the same store is refused */
        assert_int_equal(idem_log_read(f->sub, ro, &info), -EINVAL);
        idem_store_free(ro);

        char *after = slurp(f->log, &after_len);
        assert_int_equal(before_len, after_len);
        assert_memory_equal(before, after, before_len);
        free(before);
        free(after);
        /* nothing kept aside either */
        DIR *d = opendir(f->sub);
        assert_non_null(d);
        struct dirent *de;
        int files = 0;
        while ((de = readdir(d)))
                files += de->d_name[0] != '.';
        closedir(d);
        assert_int_equal(files, 1);
}


static void test_owner_bad_in_log_is_corruption(void **state)
{
        struct fx *f = *state;
        struct idem_step_owner o = { .mandate = "mnd_x", .step = "act_001", .attempt = 1 };
        struct idem_request r = rq("t", "k", "{}");
        struct idem_view v;
        uint64_t lsn;
        r.owner = &o;
        open_fresh(f);
        assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_complete(f->s, "t:k", "ok", 2, &lsn), 0);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        /* rewrite the first record's owner with attempt 0 and a valid crc */
        size_t len;
        char *log = slurp(f->log, &len);
        char *nl = memchr(log, '\n', len);
        assert_non_null(nl);
        char *p = strstr(log, "\"attempt\":1}");
        assert_true(p && p < nl);
        p[10] = '0';
        char *crc = strstr(log, ",\"crc\":\"");
        assert_true(crc && crc < nl);
        char line[4096];
        size_t head = (size_t)(crc - log);
        memcpy(line, log, head);
        line[head] = '}';
        char hex[9];
        snprintf(hex, sizeof(hex), "%08x", wal_crc(line, head + 1));
        memcpy(crc + 8, hex, 8);
        spit(f->log, log, len);
        free(log);
        assert_int_equal(reopen(f), 0);
        assert_true(f->info.corrupt);
        assert_int_equal(f->info.bad_line, 1);
}

static void test_compaction(void **state)
{
        struct fx *f = *state;
        struct idem_view v;
        uint64_t lsn;
        char key[32], res[32];

        f->opt.ttl_sec = 1000;
        f->opt.capacity = 100;
        nosync(f);
        open_fresh(f);
        for (int i = 0; i < 40; i++) {
                snprintf(key, sizeof(key), "k%02d", i);
                snprintf(res, sizeof(res), "result-%02d", i);
                struct idem_request r = rq("t", key, "{}");
                assert_int_equal(idem_begin(f->s, &r, &v, &lsn), IDEM_PROCEED);
                snprintf(key, sizeof(key), "t:k%02d", i);
                assert_int_equal(idem_complete(f->s, key, res, strlen(res), &lsn), 0);
                assert_int_equal(idem_sync(f->s, f->l), 0);
                if (i == 9)
                        f->now += 500 * 1000; /* k00..k09 will expire first */
        }
        for (int i = 10; i < 20; i++) {
                snprintf(key, sizeof(key), "t:k%02d", i);
                assert_int_equal(idem_forget(f->s, key, 0, "test", &lsn), 0);
        }
        struct idem_request p = rq("t", "proc", "{}");
        assert_int_equal(idem_begin(f->s, &p, &v, &lsn), IDEM_PROCEED);
        struct idem_request q = rq("t", "intr", "{}");
        assert_int_equal(idem_begin(f->s, &q, &v, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_interrupt(f->s, "t:intr", "client_closed", &lsn), 0);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        f->now += 600 * 1000; /* k00..k09 expired, k10.. not */

        struct idem_stats st;
        idem_stats(f->s, &st);
        assert_int_equal(st.log_records, 80 + 10 + 3);
        assert_true(idem_needs_compaction(f->s));
        assert_int_equal(idem_compact_sync(f->s, f->l), 0);
        idem_stats(f->s, &st);
        assert_int_equal(st.size, 22);
        assert_int_equal(st.log_records, 22);
        assert_false(idem_needs_compaction(f->s));
        size_t len;
        char *data = slurp(f->log, &len);
        assert_int_equal(count_lines(data, len), 22);
        assert_null(strstr(data, "\"t:k00\""));
        assert_null(strstr(data, "\"t:k15\""));
        assert_null(strstr(data, "forget"));
        free(data);
        struct stat sb;
        char tmp[256];
        snprintf(tmp, sizeof(tmp), "%s.tmp", f->log);
        assert_int_equal(stat(tmp, &sb), -1);

        /* reload with a capacity of 21: the LRU one (k20) goes, in-flight stay */
        f->opt.capacity = 21;
        assert_int_equal(reopen(f), 0);
        assert_int_equal(f->info.records, 22);
        assert_int_equal(f->info.evicted, 1);
        assert_int_equal(idem_get(f->s, "t:k20", &v), -ENOENT);
        for (int i = 21; i < 40; i++) {
                snprintf(key, sizeof(key), "t:k%02d", i);
                snprintf(res, sizeof(res), "result-%02d", i);
                assert_int_equal(idem_get(f->s, key, &v), 0);
                assert_int_equal(v.state, IDEM_ST_COMPLETED);
                assert_int_equal(v.result_len, strlen(res));
                assert_memory_equal(v.result, res, strlen(res));
        }
        assert_int_equal(idem_get(f->s, "t:proc", &v), 0);
        assert_int_equal(v.state, IDEM_ST_INTERRUPTED);
        assert_int_equal(idem_get(f->s, "t:intr", &v), 0);
        assert_string_equal(v.reason, "client_closed");
        for (int i = 0; i < 20; i++) {
                snprintf(key, sizeof(key), "t:k%02d", i);
                assert_int_equal(idem_get(f->s, key, &v), -ENOENT);
        }
}

/* Records produced after a snapshot are appended after the compaction. */
static void test_snapshot_protocol(void **state)
{
        struct fx *f = *state;
        uint64_t lsn, upto;
        struct kbuf pend = KBUF_INIT, snapb = KBUF_INIT;
        struct idem_snapshot snap;
        nosync(f);
        open_fresh(f);
        struct idem_request a = rq("t", "a", "1");
        assert_int_equal(idem_begin(f->s, &a, NULL, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_snapshot(f->s, &snapb, &snap), -EBUSY);
        assert_int_equal(idem_take_pending(f->s, &pend, &upto), 0);
        assert_int_equal(upto, lsn);
        assert_int_equal(idem_snapshot(f->s, &snapb, &snap), 0);
        assert_int_equal(snap.records, 1);
        /* the loop goes on while the pool works */
        assert_int_equal(idem_complete(f->s, "t:a", "r", 1, &lsn), 0);
        /* pool: the queued append, then the compaction */
        assert_int_equal(idem_log_append(f->l, pend.data, pend.len), 0);
        idem_durable(f->s, upto);
        assert_int_equal(idem_log_compact(f->l, snapb.data, snapb.len), 0);
        idem_compacted(f->s, &snap);
        struct idem_view v;
        assert_int_equal(idem_lookup(f->s, &a, &v), IDEM_IN_PROGRESS); /* complete not durable */
        assert_int_equal(idem_sync(f->s, f->l), 0);
        assert_int_equal(idem_lookup(f->s, &a, &v), IDEM_HIT_COMPLETED);
        struct idem_stats st;
        idem_stats(f->s, &st);
        assert_int_equal(st.log_records, 2);
        assert_int_equal(reopen(f), 0);
        assert_int_equal(f->info.records, 2);
        assert_int_equal(idem_lookup(f->s, &a, &v), IDEM_HIT_COMPLETED);
        kbuf_free(&pend);
        kbuf_free(&snapb);
}

/* A failing rename: the old log stays in use, nothing is lost. */
static void test_compaction_failure_keeps_old_log(void **state)
{
        struct fx *f = *state;
        uint64_t lsn;
        nosync(f);
        open_fresh(f);
        run_ok(f, "t", "a", "1", "A", 1);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        f->fio.fail_op = OP_RENAME;
        f->fio.fail_nth = 1;
        f->fio.fail_err = -EIO;
        assert_int_equal(idem_compact_sync(f->s, f->l), -EIO);
        f->fio.fail_op = -1;
        assert_int_equal(idem_log_error(f->l), 0);
        struct idem_stats st;
        idem_stats(f->s, &st);
        assert_int_equal(st.error, 0);
        struct idem_request b = rq("t", "b", "1");
        assert_int_equal(idem_begin(f->s, &b, NULL, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        assert_int_equal(reopen(f), 0);
        assert_int_equal(f->info.records, 3);
        struct idem_view v;
        struct idem_request a = rq("t", "a", "1");
        assert_int_equal(idem_lookup(f->s, &a, &v), IDEM_HIT_COMPLETED);
        assert_int_equal(idem_get(f->s, "t:b", &v), 0);
}

/* fdatasync EIO: reported, nothing acknowledged, never fsynced again on that
 * descriptor, every later mutation refused (lookups still answered). */
static void test_fdatasync_eio(void **state)
{
        struct fx *f = *state;
        struct idem_view v;
        uint64_t lsn;
        open_fresh(f);
        run_ok(f, "t", "done", "1", "D", 1);
        assert_int_equal(idem_sync(f->s, f->l), 0);

        struct idem_request a = rq("t", "a", "1");
        assert_int_equal(idem_begin(f->s, &a, &v, &lsn), IDEM_PROCEED);
        f->fio.fail_op = OP_FDATASYNC;
        f->fio.fail_nth = 1;
        f->fio.fail_err = -EIO;
        f->fio.calls[OP_FDATASYNC] = 0;
        assert_int_equal(idem_sync(f->s, f->l), -EIO);
        assert_int_equal(f->fio.calls[OP_FDATASYNC], 1);
        /* the begin was not acknowledged: its caller must not run the tool */
        assert_int_equal(idem_get(f->s, "t:a", &v), 0);
        assert_false(v.durable);
        struct idem_stats st;
        idem_stats(f->s, &st);
        assert_int_equal(st.error, -EIO);
        assert_true(st.durable_lsn < lsn);
        assert_int_equal(idem_log_error(f->l), -EIO);

        /* everything later fails with the first error, without touching the fd */
        f->fio.fail_op = -1;
        int writes = f->fio.calls[OP_WRITE];
        struct idem_request b = rq("t", "b", "1");
        assert_int_equal(idem_begin(f->s, &b, &v, &lsn), -EIO);
        assert_int_equal(idem_complete(f->s, "t:a", "x", 1, &lsn), -EIO);
        assert_int_equal(idem_log_append(f->l, "x\n", 2), -EIO);
        assert_int_equal(idem_sync(f->s, f->l), 0); /* nothing pending */
        assert_int_equal(idem_compact_sync(f->s, f->l), -EIO);
        assert_int_equal(f->fio.calls[OP_FDATASYNC], 1);
        assert_int_equal(f->fio.calls[OP_WRITE], writes);
        /* a finished, durable entry is still served */
        struct idem_request d = rq("t", "done", "1");
        assert_int_equal(idem_lookup(f->s, &d, &v), IDEM_HIT_COMPLETED);
        /* after a restart the un-acknowledged begin is interrupted (it may have landed) */
        assert_int_equal(reopen(f), 0);
        assert_int_equal(idem_get(f->s, "t:a", &v), 0);
        assert_int_equal(v.state, IDEM_ST_INTERRUPTED);
}

/* A short write is truncated away before anything else; the log is failed. */
static void test_short_write_truncated(void **state)
{
        struct fx *f = *state;
        uint64_t lsn;
        nosync(f);
        open_fresh(f);
        run_ok(f, "t", "a", "1", "A", 1);
        assert_int_equal(idem_sync(f->s, f->l), 0);
        struct stat st;
        assert_int_equal(stat(f->log, &st), 0);
        off_t good = st.st_size;

        struct idem_request b = rq("t", "b", "1");
        assert_int_equal(idem_begin(f->s, &b, NULL, &lsn), IDEM_PROCEED);
        f->fio.short_nth = f->fio.calls[OP_WRITE] + 1;
        int syncs = f->fio.calls[OP_FDATASYNC];
        assert_int_equal(idem_sync(f->s, f->l), -ENOSPC);
        assert_int_equal(f->fio.calls[OP_FDATASYNC], syncs);
        assert_int_equal(stat(f->log, &st), 0);
        assert_int_equal(st.st_size, good);
        assert_int_equal(idem_log_error(f->l), -ENOSPC);
        f->fio.fail_op = -1;
        f->fio.short_nth = 0;
        assert_int_equal(reopen(f), 0);
        assert_false(f->info.corrupt);
        assert_false(f->info.torn_repaired);
        assert_int_equal(f->info.records, 2);
}

/* The begin record's fdatasync happens inside idem_sync, before the caller
 * is told to proceed, and open fsyncs the new log's directory. */
static void test_durability_calls(void **state)
{
        struct fx *f = *state;
        uint64_t lsn;
        open_fresh(f);
        assert_true(f->fio.calls[OP_FSYNC_DIR] >= 1);
        struct idem_request a = rq("t", "a", "1");
        struct idem_request b = rq("t", "b", "1");
        assert_int_equal(idem_begin(f->s, &a, NULL, &lsn), IDEM_PROCEED);
        assert_int_equal(idem_begin(f->s, &b, NULL, &lsn), IDEM_PROCEED);
        assert_true(idem_pending_bytes(f->s) > 0);
        int syncs = f->fio.calls[OP_FDATASYNC];
        assert_int_equal(idem_sync(f->s, f->l), 0);
        /* one barrier for both records */
        assert_int_equal(f->fio.calls[OP_FDATASYNC], syncs + 1);
        assert_int_equal(idem_log_flush_count(f->l), 1);
        assert_int_equal(idem_pending_bytes(f->s), 0);
        struct stat st;
        assert_int_equal(stat(f->log, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0600);
        assert_int_equal(stat(f->sub, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0750); /* STATEDIR_DIR_MODE, like every state dir */
        /* a store that already holds entries cannot be loaded into */
        struct idem_log *l2 = NULL;
        assert_int_equal(idem_log_open(f->sub, &f->io, f->s, &l2, NULL), -EINVAL);
        assert_null(l2);
}


int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_owner_recorded_and_reloaded, setup, teardown),
                cmocka_unit_test_setup_teardown(test_client_and_late_finish, setup, teardown),
                cmocka_unit_test_setup_teardown(test_write_claim_and_settle, setup, teardown),
                cmocka_unit_test_setup_teardown(test_check_recorded_and_reloaded, setup, teardown),
                cmocka_unit_test_setup_teardown(test_owner_bad_in_log_is_corruption, setup, teardown),
                cmocka_unit_test_setup_teardown(test_abandon, setup, teardown),
                cmocka_unit_test_setup_teardown(test_reload_after_begin_only_is_interrupted, setup, teardown),
                cmocka_unit_test_setup_teardown(test_reload_after_finish_replays_bytes, setup, teardown),
                cmocka_unit_test_setup_teardown(test_model_reload, setup, teardown),
                cmocka_unit_test_setup_teardown(test_torn_tail_every_offset, setup, teardown),
                cmocka_unit_test_setup_teardown(test_bit_flips_reported, setup, teardown),
                cmocka_unit_test_setup_teardown(test_load_unknown_ops_and_bad_records, setup, teardown),
                cmocka_unit_test_setup_teardown(test_compaction, setup, teardown),
                cmocka_unit_test_setup_teardown(test_snapshot_protocol, setup, teardown),
                cmocka_unit_test_setup_teardown(test_compaction_failure_keeps_old_log, setup, teardown),
                cmocka_unit_test_setup_teardown(test_fdatasync_eio, setup, teardown),
                cmocka_unit_test_setup_teardown(test_short_write_truncated, setup, teardown),
                cmocka_unit_test_setup_teardown(test_durability_calls, setup, teardown),
                cmocka_unit_test_setup_teardown(test_log_read_only, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
