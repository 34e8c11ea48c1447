/* SPDX-License-Identifier: MIT */
/* pgstore against a real PostgreSQL: the database named by
 * KAIROS_PG_CONNINFO (test_pgstore.py starts a private server and runs
 * this program).  Without it every test is skipped. */
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <libpq-fe.h>

#include "kairos/crcline.h"
#include "kairos/evidence.h"
#include "kairos/idem.h"
#include "kairos/kbuf.h"
#include "kairos/wal.h"
#include "pgschema.h"
#include "pgstore.h"

static const char *conninfo(void)
{
        const char *c = getenv("KAIROS_PG_CONNINFO");
        if (!c || !*c)
                skip();
        return c;
}

static struct pgstore *store(void)
{
        struct pgstore *s = NULL;
        char err[512];
        int r = pgstore_connect(conninfo(), &s, err, sizeof err);
        if (r < 0)
                fail_msg("connect: %s", err);
        return s;
}

/* A second connection of the test's own, to look at the tables. */
static PGconn *raw(void)
{
        const char *keys[] = { "application_name", "dbname", NULL };
        const char *vals[] = { "kairos-test", conninfo(), NULL };
        PGconn *c = PQconnectdbParams(keys, vals, 1);
        assert_non_null(c);
        if (PQstatus(c) != CONNECTION_OK)
                fail_msg("raw connect: %s", PQerrorMessage(c));
        return c;
}

static long long count(PGconn *c, const char *sql, const char *arg)
{
        const char *vals[] = { arg };
        PGresult *res = PQexecParams(c, sql, arg ? 1 : 0, NULL, vals, NULL, NULL, 0);
        if (PQresultStatus(res) != PGRES_TUPLES_OK)
                fail_msg("%s: %s", sql, PQresultErrorMessage(res));
        assert_int_equal(PQntuples(res), 1);
        long long n = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
        PQclear(res);
        return n;
}

static int64_t now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t mono_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* One sealed record, as the file WAL would hold it. */
static void sealed(struct kbuf *b, const char *json)
{
        size_t start = b->len;
        assert_int_equal(kbuf_puts(b, json), 0);
        assert_int_equal(crcline_seal(b, start), 0);
}

/* pgstore_idem_claim into *ret, freeing what *ret held (zeroed at first). */
static int idem_claim(struct pgstore *s, const char *key, const char *tool, const char *fp,
                      const char *mandate_id, int64_t epoch, const char *node, const char *step,
                      uint32_t attempt, int64_t ttl_ms, struct pgstore_idem_claim *ret)
{
        pgstore_idem_claim_free(ret);
        return pgstore_idem_claim(s, key, tool, fp, mandate_id, epoch, node, step, attempt,
                                  ttl_ms, ret);
}

static int setup_schema(void **state)
{
        if (!getenv("KAIROS_PG_CONNINFO"))
                return 0;
        struct pgstore *s = store();
        int r = pgstore_migrate(s, NULL, NULL);
        if (r < 0)
                fprintf(stderr, "migrate: %s\n", pgstore_error(s));
        pgstore_close(s);
        return r < 0 ? -1 : 0;
}

/* ---- migrations ---- */

static void test_migrate_idempotent(void **state)
{
        struct pgstore *s = store();
        int from = -1, to = -1, v = -1;
        assert_int_equal(pgstore_migrate(s, &from, &to), 0);
        assert_int_equal(from, PGSCHEMA_VERSION);
        assert_int_equal(to, PGSCHEMA_VERSION);
        assert_int_equal(pgstore_schema_version(s, &v), 0);
        assert_int_equal(v, PGSCHEMA_VERSION);
        PGconn *c = raw();
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_schema_migrations", NULL),
                         PGSCHEMA_VERSION);
        PQfinish(c);
        pgstore_close(s);
}

/* ---- tick claims: exactly one winner ---- */

#define NCLAIMERS 8
#define NTICKS 25

struct claimer {
        int id;
        pthread_barrier_t *barrier;
        int64_t base_ms;
        struct pgstore_claim claims[NTICKS];
        int rc[NTICKS];
};

static void *claim_thread(void *arg)
{
        struct claimer *cl = arg;
        struct pgstore *s = NULL;
        char err[512];
        if (pgstore_connect(conninfo(), &s, err, sizeof err) < 0)
                return (void *)1;
        char node[32];
        snprintf(node, sizeof node, "node-%d", cl->id);
        for (int k = 0; k < NTICKS; k++) {
                char mid[64], rec[160];
                snprintf(mid, sizeof mid, "m-conc-%02d-%d", k, cl->id);
                snprintf(rec, sizeof rec,
                         "{\"op\":\"mandate\",\"mandate_id\":\"%s\",\"schedule\":\"conc\"}", mid);
                struct kbuf b = KBUF_INIT;
                size_t start = 0;
                kbuf_puts(&b, rec);
                crcline_seal(&b, start);
                pthread_barrier_wait(cl->barrier);
                cl->rc[k] = pgstore_claim_tick(s, "conc", cl->base_ms + k * 1000, mid, node,
                                               10000, b.data, b.len, &cl->claims[k]);
                kbuf_free(&b);
        }
        pgstore_close(s);
        return NULL;
}

static void test_concurrent_claims_one_winner(void **state)
{
        pthread_barrier_t barrier;
        pthread_barrier_init(&barrier, NULL, NCLAIMERS);
        struct claimer cl[NCLAIMERS];
        pthread_t th[NCLAIMERS];
        int64_t base = (now_ms() / 1000 - 3600) * 1000;  /* whole seconds, in the past */
        for (int i = 0; i < NCLAIMERS; i++) {
                memset(&cl[i], 0, sizeof cl[i]);
                cl[i].id = i;
                cl[i].barrier = &barrier;
                cl[i].base_ms = base;
                assert_int_equal(pthread_create(&th[i], NULL, claim_thread, &cl[i]), 0);
        }
        for (int i = 0; i < NCLAIMERS; i++) {
                void *ret;
                pthread_join(th[i], &ret);
                assert_null(ret);
        }
        pthread_barrier_destroy(&barrier);
        for (int k = 0; k < NTICKS; k++) {
                int winners = 0, winner = -1;
                for (int i = 0; i < NCLAIMERS; i++) {
                        assert_int_equal(cl[i].rc[k], 0);
                        if (cl[i].claims[k].won) {
                                winners++;
                                winner = i;
                                assert_int_equal(cl[i].claims[k].epoch, 1);
                        }
                }
                assert_int_equal(winners, 1);
                char node[32], mid[64];
                snprintf(node, sizeof node, "node-%d", winner);
                snprintf(mid, sizeof mid, "m-conc-%02d-%d", k, winner);
                for (int i = 0; i < NCLAIMERS; i++) {
                        /* every loser is told the winner */
                        assert_string_equal(cl[i].claims[k].mandate_id, mid);
                        assert_string_equal(cl[i].claims[k].claimed_by, node);
                        pgstore_claim_free(&cl[i].claims[k]);
                }
        }
        PGconn *c = raw();
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_tick WHERE schedule = $1", "conc"),
                         NTICKS);
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_mandate WHERE schedule = $1",
                               "conc"), NTICKS);
        /* each winner's first row, and no loser's */
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_wal w JOIN kairos_mandate m "
                                  "USING (mandate_id) WHERE m.schedule = $1", "conc"), NTICKS);
        PQfinish(c);
}

static void test_tick_in_future_refused(void **state)
{
        struct pgstore *s = store();
        struct pgstore_claim cl;
        assert_int_equal(pgstore_claim_tick(s, "future", now_ms() + 60000, "m-future", "a",
                                            10000, NULL, 0, &cl), -ETIME);
        assert_non_null(strstr(pgstore_error(s), "future"));
        /* 1 s ahead is within the 2 s allowance */
        assert_int_equal(pgstore_claim_tick(s, "future", now_ms() + 1000, "m-future-ok", "a",
                                            10000, NULL, 0, &cl), 0);
        assert_true(cl.won);
        pgstore_claim_free(&cl);
        /* another tick under an existing mandate id is an error, not a loss */
        assert_int_equal(pgstore_claim_tick(s, "future", now_ms() - 5000, "m-future-ok", "a",
                                            10000, NULL, 0, &cl), -EEXIST);
        PGconn *c = raw();
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_tick WHERE schedule = $1",
                               "future"), 1);
        PQfinish(c);
        pgstore_close(s);
}

/* ---- leases, takeover, fencing ---- */

static void test_takeover_fences_old_owner(void **state)
{
        struct pgstore *a = store(), *b = store();
        struct kbuf first = KBUF_INIT, more = KBUF_INIT;
        sealed(&first, "{\"op\":\"mandate\",\"mandate_id\":\"m-lease\"}");
        sealed(&more, "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"executing\"}");
        assert_int_equal(pgstore_mandate_create(a, "m-lease", NULL, "a", 400, first.data,
                                                first.len), 0);
        assert_int_equal(pgstore_mandate_create(b, "m-lease", NULL, "b", 400, NULL, 0), -EEXIST);
        /* a tool call of a's, in flight when a dies */
        struct pgstore_idem_claim ic = { 0 };
        assert_int_equal(idem_claim(a, "tool:k-a", "tool", "fp", "m-lease", 1, "a", "s1", 1,
                                            60000, &ic), 0);
        assert_int_equal(ic.outcome, PGSTORE_IDEM_CLAIMED);
        pgstore_idem_claim_free(&ic);

        /* alive by the database's clock: nothing to take */
        struct pgstore_takeover t;
        assert_int_equal(pgstore_lease_takeover(b, "m-lease", "b", 10000, 60000, &t), -EBUSY);
        /* the lease (400 ms) ends on the database's clock: poll, with a deadline */
        int r = -EBUSY;
        for (int64_t end = mono_ms() + 15000; r == -EBUSY && mono_ms() < end;) {
                r = pgstore_lease_takeover(b, "m-lease", "b", 10000, 0, &t);
                if (r == -EBUSY)
                        usleep(20000);
        }
        assert_int_equal(r, 0);
        assert_string_equal(t.mandate_id, "m-lease");
        assert_int_equal(t.epoch, 2);
        assert_string_equal(t.prev_owner, "a");
        assert_int_equal(t.interrupted, 1);
        pgstore_takeover_free(&t);

        PGconn *c = raw();
        int64_t last = 0, epoch = 0;
        assert_int_equal(pgstore_wal_last_seq(a, "m-lease", &last, &epoch), 0);
        assert_int_equal(last, 1);
        assert_int_equal(epoch, 2);
        /* the old owner is refused inside the database, and writes nothing */
        assert_int_equal(pgstore_wal_append(a, "m-lease", 1, 0, more.data, more.len, NULL),
                         -ESTALE);
        assert_non_null(strstr(pgstore_error(a), "epoch"));
        assert_int_equal(pgstore_wal_append(a, "m-lease", 1, 2, more.data, more.len, NULL),
                         -ESTALE);
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_wal WHERE mandate_id = $1",
                               "m-lease"), 1);
        assert_int_equal(count(c, "SELECT last_seq FROM kairos_mandate WHERE mandate_id = $1",
                               "m-lease"), 1);
        assert_int_equal(pgstore_lease_renew(a, "m-lease", "a", 1, 10000), -ESTALE);
        assert_int_equal(idem_claim(a, "tool:k-a2", "tool", "fp", "m-lease", 1, "a",
                                            "s1", 1, 60000, &ic), -ESTALE);
        assert_int_equal(pgstore_idem_finish(a, "tool:k-a", "m-lease", 1, false, "x", 1),
                         -ESTALE);
        assert_int_equal(pgstore_mandate_finish(a, "m-lease", 1, "succeeded"), -ESTALE);
        /* even a writer that bypasses kairos_wal_append is fenced by the trigger */
        PGresult *res = PQexec(c, "INSERT INTO kairos_wal (mandate_id, seq, epoch, line) "
                                  "VALUES ('m-lease', 2, 1, '\\x7b7d0a')");
        assert_int_equal(PQresultStatus(res), PGRES_FATAL_ERROR);
        assert_string_equal(PQresultErrorField(res, PG_DIAG_SQLSTATE), "KR001");
        PQclear(res);
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_wal WHERE mandate_id = $1",
                               "m-lease"), 1);
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_idem WHERE key = $1",
                               "tool:k-a2"), 0);

        /* the new owner writes at epoch 2 */
        int64_t after = 0;
        assert_int_equal(pgstore_lease_renew(b, "m-lease", "b", 2, 10000), 0);
        assert_int_equal(pgstore_wal_append(b, "m-lease", 2, 0, more.data, more.len, &after), 0);
        assert_int_equal(after, 2);
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_wal WHERE mandate_id = $1 "
                                  "AND epoch = 2", "m-lease"), 1);
        /* a's in-flight call is reported interrupted, never claimable again */
        assert_int_equal(idem_claim(b, "tool:k-a", "tool", "fp", "m-lease", 2, "b", "s1", 1,
                                            60000, &ic), 0);
        assert_int_equal(ic.outcome, PGSTORE_IDEM_INTERRUPTED);
        pgstore_idem_claim_free(&ic);
        /* a live lease cannot be taken */
        assert_int_equal(pgstore_lease_takeover(a, "m-lease", "a", 10000, 0, &t), -EBUSY);
        /* ended: fenced for everyone, nothing to take */
        assert_int_equal(pgstore_mandate_finish(b, "m-lease", 2, "succeeded"), 0);
        assert_int_equal(pgstore_lease_renew(b, "m-lease", "b", 2, 10000), -ESTALE);
        assert_int_equal(pgstore_lease_takeover(a, "m-lease", "a", 10000, 0, &t), -EBUSY);
        assert_int_equal(pgstore_lease_renew(b, "m-none", "b", 1, 10000), -ENOENT);
        PQfinish(c);
        kbuf_free(&first);
        kbuf_free(&more);
        pgstore_close(a);
        pgstore_close(b);
        pgstore_idem_claim_free(&ic);
}

/* An owner appending as fast as it can while another node takes over: its
 * appends stop at the takeover, and along seq the epochs never go back (no
 * row at an old epoch after a row at a newer one). */
struct racer {
        struct pgstore *s;
        atomic_int appended;     /* successful appends */
        atomic_int stale;        /* -ESTALE answers */
        atomic_int other;        /* any other error */
        atomic_int stop;
};

static void *append_loop(void *arg)
{
        struct racer *ra = arg;
        struct kbuf b = KBUF_INIT;
        sealed(&b, "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"executing\"}");
        while (!ra->stop) {
                int r = pgstore_wal_append(ra->s, "m-race", 1, 0, b.data, b.len, NULL);
                if (r == 0)
                        ra->appended++;
                else if (r == -ESTALE)
                        ra->stale++;
                else
                        ra->other++;
                if (r == -ESTALE)
                        break;  /* fenced: a node stops appending for that mandate */
        }
        kbuf_free(&b);
        return NULL;
}

static void test_takeover_during_appends(void **state)
{
        struct racer ra = { .s = store() };
        struct pgstore *b = store();
        assert_int_equal(pgstore_mandate_create(ra.s, "m-race", NULL, "a", 300, NULL, 0), 0);
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, append_loop, &ra), 0);
        struct pgstore_takeover t;
        int r = -EBUSY;
        for (int64_t end = mono_ms() + 15000; r == -EBUSY && mono_ms() < end;) {
                r = pgstore_lease_takeover(b, "m-race", "b", 10000, 0, &t);
                if (r == -EBUSY)
                        usleep(5000);
        }
        assert_int_equal(r, 0);
        assert_int_equal(t.epoch, 2);
        pgstore_takeover_free(&t);
        struct kbuf nb = KBUF_INIT;
        sealed(&nb, "{\"op\":\"owner\",\"node\":\"b\",\"epoch\":2}");
        assert_int_equal(pgstore_wal_append(b, "m-race", 2, 0, nb.data, nb.len, NULL), 0);
        void *ret;
        for (int64_t end = mono_ms() + 15000; !ra.stale && mono_ms() < end;)
                usleep(1000);
        ra.stop = 1;
        pthread_join(th, &ret);
        assert_int_equal(ra.other, 0);
        assert_int_equal(ra.stale, 1);
        assert_true(ra.appended > 0);
        PGconn *c = raw();
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_wal WHERE mandate_id = $1 "
                                  "AND epoch = 1", "m-race"), ra.appended);
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_wal WHERE mandate_id = $1 "
                                  "AND epoch = 2", "m-race"), 1);
        /* no row at an older epoch than a row before it */
        assert_int_equal(count(c, "SELECT count(*) FROM (SELECT epoch, max(epoch) OVER "
                                  "(ORDER BY seq ROWS BETWEEN UNBOUNDED PRECEDING AND 1 "
                                  "PRECEDING) AS before FROM kairos_wal WHERE mandate_id = $1) "
                                  "x WHERE epoch < before", "m-race"), 0);
        assert_int_equal(count(c, "SELECT last_seq FROM kairos_mandate WHERE mandate_id = $1",
                               "m-race"), ra.appended + 1);
        PQfinish(c);
        kbuf_free(&nb);
        pgstore_close(ra.s);
        pgstore_close(b);
}

/* Many nodes sweeping for expired mandates at once: each is taken exactly
 * once (SKIP LOCKED and the epoch), none twice, none left. */
#define NEXPIRED 20

struct sweeper {
        pthread_barrier_t *barrier;
        int id;
        char *taken[NEXPIRED * 2];
        int ntaken;
        int rc;
};

static void *sweep_thread(void *arg)
{
        struct sweeper *sw = arg;
        struct pgstore *s = NULL;
        char err[512], node[32];
        snprintf(node, sizeof node, "sweeper-%d", sw->id);
        sw->rc = pgstore_connect(conninfo(), &s, err, sizeof err);
        pthread_barrier_wait(sw->barrier);
        if (sw->rc < 0)
                return NULL;
        for (;;) {
                struct pgstore_takeover t;
                int r = pgstore_lease_takeover(s, NULL, node, 600000, 0, &t);
                if (r == -EBUSY)
                        break;
                if (r < 0) {
                        sw->rc = r;
                        break;
                }
                if (strncmp(t.mandate_id, "m-exp-", 6) == 0 && t.epoch == 2 &&
                    sw->ntaken < NEXPIRED * 2)
                        sw->taken[sw->ntaken++] = strdup(t.mandate_id);
                else if (strncmp(t.mandate_id, "m-exp-", 6) == 0)
                        sw->rc = -EPROTO;  /* an m-exp- mandate taken at another epoch */
                pgstore_takeover_free(&t);
        }
        pgstore_close(s);
        return NULL;
}

static void test_concurrent_takeovers_once_each(void **state)
{
        struct pgstore *s = store();
        for (int i = 0; i < NEXPIRED; i++) {
                char mid[32];
                snprintf(mid, sizeof mid, "m-exp-%02d", i);
                assert_int_equal(pgstore_mandate_create(s, mid, NULL, "dead", 1, NULL, 0), 0);
        }
        /* wait until all have expired on the database's clock */
        PGconn *c = raw();
        int64_t end = mono_ms() + 15000;
        while (count(c, "SELECT count(*) FROM kairos_mandate WHERE mandate_id LIKE $1 "
                        "AND lease_expires_at < now()", "m-exp-%") < NEXPIRED &&
               mono_ms() < end)
                usleep(5000);
        pthread_barrier_t barrier;
        pthread_barrier_init(&barrier, NULL, NCLAIMERS);
        struct sweeper sw[NCLAIMERS];
        pthread_t th[NCLAIMERS];
        for (int i = 0; i < NCLAIMERS; i++) {
                memset(&sw[i], 0, sizeof sw[i]);
                sw[i].barrier = &barrier;
                sw[i].id = i;
                assert_int_equal(pthread_create(&th[i], NULL, sweep_thread, &sw[i]), 0);
        }
        int total = 0;
        bool seen[NEXPIRED] = { false };
        for (int i = 0; i < NCLAIMERS; i++) {
                pthread_join(th[i], NULL);
                assert_int_equal(sw[i].rc, 0);
                for (int k = 0; k < sw[i].ntaken; k++) {
                        int idx = atoi(sw[i].taken[k] + 6);
                        assert_true(idx >= 0 && idx < NEXPIRED);
                        assert_false(seen[idx]);
                        seen[idx] = true;
                        total++;
                        free(sw[i].taken[k]);
                }
        }
        pthread_barrier_destroy(&barrier);
        assert_int_equal(total, NEXPIRED);
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_mandate WHERE mandate_id LIKE $1 "
                                  "AND epoch = 2 AND owner LIKE 'sweeper-%'", "m-exp-%"),
                         NEXPIRED);
        PQfinish(c);
        pgstore_close(s);
}

static void test_node_incarnation(void **state)
{
        struct pgstore *s = store();
        assert_int_equal(pgstore_node_heartbeat(s, "n1", 2, 10000), 0);
        assert_int_equal(pgstore_node_heartbeat(s, "n1", 2, 10000), 0);
        assert_int_equal(pgstore_node_heartbeat(s, "n1", 1, 10000), -ESTALE);
        assert_int_equal(pgstore_node_heartbeat(s, "n1", 3, 10000), 0);
        pgstore_close(s);
}

/* ---- schedule state ---- */

struct advancer {
        pthread_barrier_t *barrier;
        int64_t version, last_ms;
        int rc;
};

static void *advance_thread(void *arg)
{
        struct advancer *ad = arg;
        struct pgstore *s = NULL;
        char err[512];
        if (pgstore_connect(conninfo(), &s, err, sizeof err) < 0) {
                ad->rc = -ECONNREFUSED;
                pthread_barrier_wait(ad->barrier);
                return NULL;
        }
        pthread_barrier_wait(ad->barrier);
        ad->rc = pgstore_schedule_advance(s, "cas", "h1", ad->version, ad->last_ms,
                                          ad->last_ms + 60000, NULL);
        pgstore_close(s);
        return NULL;
}

/* Every node read version v; exactly one may advance it. */
static int advance_race(int64_t version, int64_t last_ms)
{
        pthread_barrier_t barrier;
        pthread_barrier_init(&barrier, NULL, NCLAIMERS);
        struct advancer ad[NCLAIMERS];
        pthread_t th[NCLAIMERS];
        for (int i = 0; i < NCLAIMERS; i++) {
                ad[i] = (struct advancer){ &barrier, version, last_ms + i, 0 };
                assert_int_equal(pthread_create(&th[i], NULL, advance_thread, &ad[i]), 0);
        }
        int won = 0;
        for (int i = 0; i < NCLAIMERS; i++) {
                pthread_join(th[i], NULL);
                if (ad[i].rc == 0)
                        won++;
                else
                        assert_int_equal(ad[i].rc, -EAGAIN);
        }
        pthread_barrier_destroy(&barrier);
        return won;
}

static void test_schedule_compare_and_set(void **state)
{
        struct pgstore *s = store();
        struct pgstore_schedule st;
        assert_int_equal(pgstore_schedule_get(s, "cas", &st), 0);
        assert_null(st.config_hash);
        assert_int_equal(st.version, 0);
        assert_int_equal(st.last_evaluated_ms, -1);
        int64_t t0 = 1776686400123;  /* 2026-04-20T12:00:00.123Z */
        assert_int_equal(advance_race(0, t0), 1);
        assert_int_equal(pgstore_schedule_get(s, "cas", &st), 0);
        assert_string_equal(st.config_hash, "h1");
        assert_int_equal(st.version, 1);
        assert_true(st.last_evaluated_ms >= t0 && st.last_evaluated_ms < t0 + NCLAIMERS);
        assert_int_equal(st.next_fire_ms, st.last_evaluated_ms + 60000);
        int64_t last = st.last_evaluated_ms;
        pgstore_schedule_free(&st);
        assert_int_equal(advance_race(1, t0 + 1000), 1);
        /* a stale version, and going backwards, are refused */
        int64_t v = 0;
        assert_int_equal(pgstore_schedule_advance(s, "cas", "h1", 1, t0 + 5000, -1, &v), -EAGAIN);
        assert_int_equal(pgstore_schedule_advance(s, "cas", "h1", 2, last, -1, &v), -EAGAIN);
        assert_int_equal(pgstore_schedule_advance(s, "cas", "h2", 2, t0 + 5000, -1, &v), 0);
        assert_int_equal(v, 3);
        assert_int_equal(pgstore_schedule_get(s, "cas", &st), 0);
        assert_string_equal(st.config_hash, "h2");
        assert_int_equal(st.last_evaluated_ms, t0 + 5000);
        assert_int_equal(st.next_fire_ms, -1);
        pgstore_schedule_free(&st);
        pgstore_close(s);
}

/* ---- tool calls ---- */

static void test_idem_claim_outcomes(void **state)
{
        struct pgstore *s = store();
        assert_int_equal(pgstore_mandate_create(s, "m-idem", "sched", "a", 60000, NULL, 0), 0);
        struct pgstore_idem_claim ic = { 0 };
        assert_int_equal(idem_claim(s, "t:k", "t", "fp1", "m-idem", 1, "a", "s1", 1, 60000,
                                            &ic), 0);
        assert_int_equal(ic.outcome, PGSTORE_IDEM_CLAIMED);
        assert_int_equal(idem_claim(s, "t:k", "t", "fp1", "m-idem", 1, "a", "s1", 1, 60000,
                                            &ic), 0);
        assert_int_equal(ic.outcome, PGSTORE_IDEM_IN_PROGRESS);
        assert_int_equal(idem_claim(s, "t:k", "t", "fp2", "m-idem", 1, "a", "s1", 1, 60000,
                                            &ic), 0);
        assert_int_equal(ic.outcome, PGSTORE_IDEM_MISMATCH);
        assert_string_equal(ic.fingerprint, "fp1");    /* the stored one */
        pgstore_idem_claim_free(&ic);
        static const char result[] = "out\0put\n\xff";
        assert_int_equal(pgstore_idem_finish(s, "t:k", "m-idem", 1, false, result,
                                             sizeof result - 1), 0);
        assert_int_equal(idem_claim(s, "t:k", "t", "fp1", "m-idem", 1, "a", "s1", 1, 60000,
                                            &ic), 0);
        assert_int_equal(ic.outcome, PGSTORE_IDEM_CACHED);
        assert_false(ic.failed);
        assert_true(ic.created_ms > now_ms() - 60000);
        assert_true(ic.updated_ms >= ic.created_ms);
        assert_int_equal(ic.result_len, sizeof result - 1);
        assert_memory_equal(ic.result, result, sizeof result - 1);
        pgstore_idem_claim_free(&ic);
        /* finishing twice is refused */
        assert_int_equal(pgstore_idem_finish(s, "t:k", "m-idem", 1, true, NULL, 0), -ESTALE);
        /* a caller gone before its result: interrupted, or forgotten (a retry claims it) */
        assert_int_equal(idem_claim(s, "t:gone", "t", "fp", "m-idem", 1, "a", "s1", 1,
                                            60000, &ic), 0);
        assert_int_equal(pgstore_idem_release(s, "t:gone", "m-idem", 1, false), 0);
        assert_int_equal(idem_claim(s, "t:gone", "t", "fp", "m-idem", 1, "a", "s1", 1,
                                            60000, &ic), 0);
        assert_int_equal(ic.outcome, PGSTORE_IDEM_INTERRUPTED);
        assert_int_equal(pgstore_idem_release(s, "t:gone", "m-idem", 1, false), -ESTALE);
        assert_int_equal(pgstore_idem_release(s, "t:gone", "m-idem", 1, true), -ESTALE);
        assert_int_equal(idem_claim(s, "t:undo", "t", "fp", "m-idem", 1, "a", "s1", 1,
                                            60000, &ic), 0);
        assert_int_equal(pgstore_idem_release(s, "t:undo", "m-idem", 2, true), -ESTALE);
        assert_int_equal(pgstore_idem_release(s, "t:undo", "m-idem", 1, true), 0);
        assert_int_equal(idem_claim(s, "t:undo", "t", "fp", "m-idem", 1, "a", "s1", 1,
                                            60000, &ic), 0);
        assert_int_equal(ic.outcome, PGSTORE_IDEM_CLAIMED);
        assert_int_equal(pgstore_idem_release(s, "t:undo", "m-none", 1, true), -ENOENT);
        assert_int_equal(idem_claim(s, "t:k", "t", "fp1", "m-none", 1, "a", "s1", 1, 60000,
                                            &ic), -ENOENT);
        pgstore_close(s);
        pgstore_idem_claim_free(&ic);
}

/* An operator's resolve: the step's interrupted calls dropped or completed,
 * fenced by the mandate's owner and epoch. */
static void test_idem_settle_step(void **state)
{
        struct pgstore *s = store();
        struct pgstore_idem_claim ic = { 0 };
        char *keys = NULL;
        assert_int_equal(pgstore_mandate_create(s, "m-settle", "sched", "a", 60000, NULL, 0), 0);
        static const char *const mine[] = { "t:s1", "t:s2", "t:done" };
        for (size_t i = 0; i < 3; i++) {
                assert_int_equal(idem_claim(s, mine[i], "t", "fp", "m-settle", 1, "a",
                                            i < 2 ? "act_001" : "act_002", 1, 60000, &ic), 0);
                assert_int_equal(pgstore_idem_release(s, mine[i], "m-settle", 1, false), 0);
        }
        assert_int_equal(idem_claim(s, "t:run", "t", "fp", "m-settle", 1, "a", "act_001", 1,
                                    60000, &ic), 0);
        /* not the holder at that epoch: nothing changes */
        assert_int_equal(pgstore_idem_settle_step(s, "m-settle", "act_001", "a", 2, NULL, 0,
                                                  60000, &keys), -ESTALE);
        assert_int_equal(pgstore_idem_settle_step(s, "m-settle", "act_001", "b", 1, NULL, 0,
                                                  60000, &keys), -ESTALE);
        assert_null(keys);
        assert_int_equal(idem_claim(s, "t:s1", "t", "fp", "m-settle", 1, "a", "act_001", 1,
                                    60000, &ic), 0);
        assert_int_equal(ic.outcome, PGSTORE_IDEM_INTERRUPTED);
        /* --retry: the step's interrupted calls go (not its running one, not
         * another step's) */
        assert_int_equal(pgstore_idem_settle_step(s, "m-settle", "act_001", "a", 1, NULL, 0,
                                                  60000, &keys), 0);
        assert_string_equal(keys, "t:s1\nt:s2");
        free(keys);
        assert_int_equal(idem_claim(s, "t:s1", "t", "fp", "m-settle", 1, "a", "act_001", 2,
                                    60000, &ic), 0);
        assert_int_equal(ic.outcome, PGSTORE_IDEM_CLAIMED);
        assert_int_equal(idem_claim(s, "t:run", "t", "fp", "m-settle", 1, "a", "act_001", 1,
                                    60000, &ic), 0);
        assert_int_equal(ic.outcome, PGSTORE_IDEM_IN_PROGRESS);
        assert_int_equal(pgstore_idem_settle_step(s, "m-settle", "act_001", "a", 1, NULL, 0,
                                                  60000, &keys), 0);
        assert_string_equal(keys, "");
        free(keys);
        /* --done: completed with the result */
        assert_int_equal(pgstore_idem_settle_step(s, "m-settle", "act_002", "a", 1, "{}", 2,
                                                  60000, &keys), 0);
        assert_string_equal(keys, "t:done");
        free(keys);
        assert_int_equal(idem_claim(s, "t:done", "t", "fp", "m-settle", 1, "a", "act_002", 2,
                                    60000, &ic), 0);
        assert_int_equal(ic.outcome, PGSTORE_IDEM_CACHED);
        assert_int_equal(ic.result_len, 2);
        assert_memory_equal(ic.result, "{}", 2);
        pgstore_idem_claim_free(&ic);
        pgstore_close(s);
}

/* ---- WAL rows ---- */

static void test_rows_are_the_file_bytes(void **state)
{
        char dir[] = "/tmp/kairos-pgstore-XXXXXX";
        assert_non_null(mkdtemp(dir));
        char path[256];
        snprintf(path, sizeof path, "%s/m-bytes.wal.jsonl", dir);
        struct wal_options opt = { 0 };
        struct wal *w = NULL;
        assert_int_equal(wal_open(path, &opt, &w, NULL), 0);
        /* three barriers, as the executor makes them */
        size_t ends[3];
        struct stat st;
        assert_int_equal(wal_mandate(w, "m-bytes", "sched", "2026-04-20T12:00:00Z",
                                     "goal \"quoted\" \xc3\xa9\xe2\x80\xa8"), 0);
        struct wal_step step = { "observe_001", "observe", "ph", "pre", "post" };
        assert_int_equal(wal_commit_plan(w, "plan_1", "m-bytes", 1, &step, 1), 0);
        assert_int_equal(wal_append_pending(w, "observe_001", "plan_1", "observe:key"), 0);
        assert_int_equal(wal_mark_executing(w, "observe_001", "pre"), 0);
        assert_int_equal(wal_flush(w), 0);
        assert_int_equal(stat(path, &st), 0);
        ends[0] = (size_t)st.st_size;
        assert_int_equal(wal_mark_completed(w, "observe_001", "post", "rh", false, NULL,
                                            "{\"text\":\"tab\\there \\u00e9 \\ud83d\\ude00\","
                                            "\"n\":[1,2.5,-3e2,null,true]}"), 0);
        assert_int_equal(wal_flush(w), 0);
        assert_int_equal(stat(path, &st), 0);
        ends[1] = (size_t)st.st_size;
        assert_int_equal(wal_mark_failed(w, "observe_001", "handler_error",
                                         "exit 3: \x01 control and \xe2\x82\xac"), 0);
        assert_int_equal(wal_finalize_plan(w, "plan_1", PLAN_FAILED, "step failed"), 0);
        assert_int_equal(wal_flush(w), 0);
        assert_int_equal(stat(path, &st), 0);
        ends[2] = (size_t)st.st_size;
        assert_int_equal(wal_close(w), 0);

        struct kbuf file = KBUF_INIT;
        int fd = open(path, O_RDONLY);
        assert_true(fd >= 0);
        assert_int_equal(kbuf_reserve(&file, ends[2] + 1), 0);
        assert_int_equal(read(fd, file.data, ends[2] + 1), (ssize_t)ends[2]);
        file.len = ends[2];
        close(fd);

        struct pgstore *s = store();
        assert_int_equal(pgstore_mandate_create(s, "m-bytes", "sched", "a", 60000, file.data,
                                                ends[0]), 0);
        int64_t last = 0;
        assert_int_equal(pgstore_wal_append(s, "m-bytes", 1, 0, file.data + ends[0],
                                            ends[1] - ends[0], &last), 0);
        assert_int_equal(last, 5);
        assert_int_equal(pgstore_wal_append(s, "m-bytes", 1, 0, file.data + ends[1],
                                            ends[2] - ends[1], &last), 0);
        assert_int_equal(last, 7);
        struct kbuf back = KBUF_INIT;
        int64_t n = 0;
        assert_int_equal(pgstore_wal_read(s, "m-bytes", &back, &n), 0);
        assert_int_equal(n, 7);
        assert_int_equal(back.len, file.len);
        assert_memory_equal(back.data, file.data, file.len);
        /* each row's crc column is the line's crc field */
        PGconn *c = raw();
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_wal WHERE mandate_id = $1 AND "
                                  "crc = ('x' || convert_from(substring(line from "
                                  "length(line) - 10 for 8), 'UTF8'))::bit(32)::bigint", "m-bytes"), 7);
        PQfinish(c);
        kbuf_free(&back);
        kbuf_free(&file);
        pgstore_close(s);
        unlink(path);
        rmdir(dir);
}

static void test_append_repeat_is_idempotent(void **state)
{
        struct pgstore *s = store();
        struct kbuf b1 = KBUF_INIT, b2 = KBUF_INIT;
        sealed(&b1, "{\"op\":\"mandate\",\"mandate_id\":\"m-rep\"}");
        sealed(&b1, "{\"op\":\"append\",\"step_id\":\"s1\"}");
        sealed(&b2, "{\"op\":\"append\",\"step_id\":\"s2\"}");
        assert_int_equal(pgstore_mandate_create(s, "m-rep", NULL, "a", 60000, NULL, 0), 0);
        int64_t last = 0;
        assert_int_equal(pgstore_wal_append(s, "m-rep", 1, 1, b1.data, b1.len, &last), 0);
        assert_int_equal(last, 2);
        /* the commit's outcome was unknown: the same barrier again is a no-op */
        assert_int_equal(pgstore_wal_append(s, "m-rep", 1, 1, b1.data, b1.len, &last), 0);
        assert_int_equal(last, 2);
        /* other bytes at stored seqs, a gap, a partial overlap: refused */
        assert_int_equal(pgstore_wal_append(s, "m-rep", 1, 2, b2.data, b2.len, &last), -EILSEQ);
        assert_int_equal(pgstore_wal_append(s, "m-rep", 1, 5, b2.data, b2.len, &last), -EILSEQ);
        assert_int_equal(pgstore_wal_append(s, "m-rep", 1, 2, b1.data, b1.len, &last), -EILSEQ);
        assert_int_equal(pgstore_wal_append(s, "m-rep", 1, 3, b2.data, b2.len, &last), 0);
        assert_int_equal(last, 3);
        struct kbuf back = KBUF_INIT;
        assert_int_equal(pgstore_wal_read(s, "m-rep", &back, NULL), 0);
        assert_int_equal(back.len, b1.len + b2.len);
        assert_memory_equal(back.data, b1.data, b1.len);
        assert_memory_equal(back.data + b1.len, b2.data, b2.len);
        kbuf_free(&back);
        kbuf_free(&b1);
        kbuf_free(&b2);
        pgstore_close(s);
}

static void test_bad_lines_never_sent(void **state)
{
        struct pgstore *s = store();
        assert_int_equal(pgstore_mandate_create(s, "m-bad", NULL, "a", 60000, NULL, 0), 0);
        struct kbuf b = KBUF_INIT;
        sealed(&b, "{\"op\":\"append\",\"step_id\":\"s1\"}");
        /* a flipped bit: the crc no longer matches */
        b.data[10] ^= 1;
        assert_int_equal(pgstore_wal_append(s, "m-bad", 1, 0, b.data, b.len, NULL), -EBADMSG);
        b.data[10] ^= 1;
        /* no final newline */
        assert_int_equal(pgstore_wal_append(s, "m-bad", 1, 0, b.data, b.len - 1, NULL),
                         -EBADMSG);
        /* a legacy line (no crc field) */
        assert_int_equal(pgstore_wal_append(s, "m-bad", 1, 0, "{\"op\":\"append\"}\n", 16, NULL),
                         -EBADMSG);
        /* an empty line */
        assert_int_equal(pgstore_wal_append(s, "m-bad", 1, 0, "\n", 1, NULL), -EBADMSG);
        PGconn *c = raw();
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_wal WHERE mandate_id = $1",
                               "m-bad"), 0);
        PQfinish(c);
        assert_int_equal(pgstore_wal_append(s, "m-bad", 1, 0, b.data, b.len, NULL), 0);
        kbuf_free(&b);
        pgstore_close(s);
}

/* A row lock held by another session (a stalled node's open transaction)
 * makes a call fail after lock_timeout instead of blocking its thread. */
static void test_lock_wait_bounded(void **state)
{
        char ci[1024], err[512];
        snprintf(ci, sizeof ci, "%s options='-c lock_timeout=300'", conninfo());
        struct pgstore *s = NULL;
        if (pgstore_connect(ci, &s, err, sizeof err) < 0)
                fail_msg("connect: %s", err);
        assert_int_equal(pgstore_mandate_create(s, "m-locked", NULL, "a", 60000, NULL, 0), 0);
        PGconn *c = raw();
        PGresult *res = PQexec(c, "BEGIN; SELECT * FROM kairos_mandate "
                                  "WHERE mandate_id = 'm-locked' FOR UPDATE");
        assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
        PQclear(res);
        struct kbuf b = KBUF_INIT;
        sealed(&b, "{\"op\":\"append\",\"step_id\":\"s1\"}");
        int64_t t0 = mono_ms();
        assert_int_equal(pgstore_wal_append(s, "m-locked", 1, 0, b.data, b.len, NULL),
                         -ETIMEDOUT);
        assert_true(mono_ms() - t0 < 10000);
        PQclear(PQexec(c, "ROLLBACK"));
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_wal WHERE mandate_id = $1",
                               "m-locked"), 0);
        /* the same store goes on once the lock is gone */
        assert_int_equal(pgstore_wal_append(s, "m-locked", 1, 0, b.data, b.len, NULL), 0);
        PQfinish(c);
        kbuf_free(&b);
        pgstore_close(s);
}

/* A broken connection says "outcome unknown"; after a reset, the same
 * append with its explicit first seq is safe to repeat. */
static void test_lost_connection(void **state)
{
        /* the connection string's own settings win over pgstore's defaults */
        char ci[1024], err[512];
        snprintf(ci, sizeof ci, "%s application_name=kairos-lost", conninfo());
        struct pgstore *s = NULL;
        if (pgstore_connect(ci, &s, err, sizeof err) < 0)
                fail_msg("connect: %s", err);
        assert_int_equal(pgstore_mandate_create(s, "m-conn", NULL, "a", 60000, NULL, 0), 0);
        PGconn *c = raw();
        PGresult *res = PQexec(c, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                  "WHERE application_name = 'kairos-lost' AND datname = "
                                  "current_database()");
        assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
        assert_int_equal(PQntuples(res), 1);
        PQclear(res);
        struct kbuf b = KBUF_INIT;
        sealed(&b, "{\"op\":\"append\",\"step_id\":\"s1\"}");
        int r = -ENOTCONN;
        /* the backend's exit is asynchronous: the call fails once it is gone */
        for (int64_t end = mono_ms() + 10000; mono_ms() < end;) {
                int64_t last;
                r = pgstore_wal_last_seq(s, "m-conn", &last, NULL);
                if (r < 0)
                        break;
                usleep(10000);
        }
        assert_int_equal(r, -ENOTCONN);
        assert_int_equal(pgstore_reset(s), 0);
        int64_t last = 0;
        assert_int_equal(pgstore_wal_append(s, "m-conn", 1, 1, b.data, b.len, &last), 0);
        assert_int_equal(pgstore_wal_append(s, "m-conn", 1, 1, b.data, b.len, &last), 0);
        assert_int_equal(last, 1);
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_wal WHERE mandate_id = $1",
                               "m-conn"), 1);
        PQfinish(c);
        kbuf_free(&b);
        pgstore_close(s);
}

/* The commit happened but its answer was lost (pg_proxy.py swallows it):
 * the caller gets -ENOTCONN, reconnects, reads last_seq, and repeating the
 * append with its explicit first seq is a no-op.  Needs
 * KAIROS_PG_PROXY_CONNINFO, a proxy that drops the first reply to
 * kairos_wal_append. */
static void test_unknown_commit_outcome(void **state)
{
        const char *px = getenv("KAIROS_PG_PROXY_CONNINFO");
        if (!px || !*px)
                skip();
        struct pgstore *s = NULL;
        char err[512];
        if (pgstore_connect(px, &s, err, sizeof err) < 0)
                fail_msg("connect through the proxy: %s", err);
        assert_int_equal(pgstore_mandate_create(s, "m-unknown", NULL, "a", 60000, NULL, 0), 0);
        struct kbuf b = KBUF_INIT;
        sealed(&b, "{\"op\":\"append\",\"step_id\":\"s1\"}");
        sealed(&b, "{\"op\":\"transition\",\"step_id\":\"s1\",\"status\":\"executing\"}");
        int64_t last = -1, epoch = 0;
        assert_int_equal(pgstore_wal_append(s, "m-unknown", 1, 1, b.data, b.len, &last),
                         -ENOTCONN);
        assert_non_null(strstr(pgstore_error(s), "outcome unknown"));
        assert_int_equal(pgstore_reset(s), 0);
        /* it did commit */
        assert_int_equal(pgstore_wal_last_seq(s, "m-unknown", &last, &epoch), 0);
        assert_int_equal(last, 2);
        /* so the repeat is a no-op, not two more rows */
        assert_int_equal(pgstore_wal_append(s, "m-unknown", 1, 1, b.data, b.len, &last), 0);
        assert_int_equal(last, 2);
        struct kbuf back = KBUF_INIT;
        int64_t n = 0;
        assert_int_equal(pgstore_wal_read(s, "m-unknown", &back, &n), 0);
        assert_int_equal(n, 2);
        assert_int_equal(back.len, b.len);
        assert_memory_equal(back.data, b.data, b.len);
        kbuf_free(&back);
        kbuf_free(&b);
        pgstore_close(s);
}

/* ---- schema versions 2 and 3 ---- */

/* A database at version 1 with rows in it is migrated to the current
 * version in place: its rows stay and work (a tool call of version 1 has no
 * attempt), only the new kairos_idem_claim is left, and a mandate can end
 * cancelled. */
static void test_migrate_from_v1(void **state)
{
        PGconn *c = raw();
        PGresult *res = PQexec(c, "CREATE SCHEMA v1up; SET search_path = v1up; "
                                  "CREATE TABLE kairos_schema_migrations (version integer "
                                  "PRIMARY KEY, description text NOT NULL, applied_at "
                                  "timestamptz NOT NULL DEFAULT now())");
        if (PQresultStatus(res) != PGRES_COMMAND_OK)
                fail_msg("%s", PQresultErrorMessage(res));
        PQclear(res);
        assert_int_equal(pgschema_migrations[0].version, 1);
        res = PQexec(c, pgschema_migrations[0].sql);
        if (PQresultStatus(res) != PGRES_COMMAND_OK)
                fail_msg("v1: %s", PQresultErrorMessage(res));
        PQclear(res);
        res = PQexec(c, "INSERT INTO kairos_schema_migrations VALUES (1, 'v1'); "
                        "SELECT kairos_mandate_create('m-v1', NULL, NULL, 'a', 60000, NULL, "
                        "NULL); SELECT * FROM kairos_idem_claim('t:v1', 't', 'fp', 'm-v1', 1, "
                        "'a', 's1', 60000)");
        if (PQresultStatus(res) != PGRES_TUPLES_OK)
                fail_msg("v1 rows: %s", PQresultErrorMessage(res));
        PQclear(res);

        char ci[1024], err[512];
        snprintf(ci, sizeof ci, "%s options='-c search_path=v1up'", conninfo());
        struct pgstore *s = NULL;
        if (pgstore_connect(ci, &s, err, sizeof err) < 0)
                fail_msg("connect: %s", err);
        int from = -1, to = -1;
        assert_int_equal(pgstore_migrate(s, &from, &to), 0);
        assert_int_equal(from, 1);
        assert_int_equal(to, PGSCHEMA_VERSION);
        assert_int_equal(count(c, "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON "
                                  "n.oid = p.pronamespace WHERE n.nspname = 'v1up' AND "
                                  "p.proname = $1", "kairos_idem_claim"), 1);
        struct pgstore_idem_row *rows;
        size_t n;
        assert_int_equal(pgstore_idem_of_mandate(s, "m-v1", &rows, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(rows[0].key, "t:v1");
        assert_int_equal(rows[0].attempt, 0);
        assert_string_equal(rows[0].state, "processing");
        pgstore_idem_rows_free(rows, n);
        assert_int_equal(pgstore_idem_finish(s, "t:v1", "m-v1", 1, false, "r", 1), 0);
        struct pgstore_idem_claim ic = { 0 };
        assert_int_equal(idem_claim(s, "t:v2", "t", "fp", "m-v1", 1, "a", "s1", 4, 60000,
                                            &ic), 0);
        assert_int_equal(ic.outcome, PGSTORE_IDEM_CLAIMED);
        assert_int_equal(count(c, "SELECT attempt FROM kairos_idem WHERE key = $1", "t:v2"), 4);
        assert_int_equal(pgstore_mandate_finish(s, "m-v1", 1, "paused"), 0);
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_mandate WHERE mandate_id = $1 "
                                  "AND ended_at IS NOT NULL AND lease_expires_at IS NULL",
                               "m-v1"), 1);
        /* version 3: a mandate ends cancelled */
        assert_int_equal(pgstore_mandate_create(s, "m-v1-c", NULL, "a", 60000, NULL, 0), 0);
        assert_int_equal(pgstore_mandate_finish(s, "m-v1-c", 1, "cancelled"), 0);
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_mandate WHERE mandate_id = $1 "
                                  "AND status = 'cancelled'", "m-v1-c"), 1);
        /* and again: nothing to do */
        assert_int_equal(pgstore_migrate(s, &from, &to), 0);
        assert_int_equal(from, PGSCHEMA_VERSION);
        pgstore_close(s);
        PQclear(PQexec(c, "DROP SCHEMA v1up CASCADE"));
        PQfinish(c);
        pgstore_idem_claim_free(&ic);
}

/* ---- nodes: registration, one-transaction renewal ---- */

static int64_t lease_left(PGconn *c, const char *mandate)
{
        return count(c, "SELECT coalesce((extract(epoch FROM lease_expires_at - now()) * 1000)"
                        "::bigint, -999999) FROM kairos_mandate WHERE mandate_id = $1", mandate);
}

static void test_register_and_renew_held(void **state)
{
        struct pgstore *s = store();
        PGconn *c = raw();
        int64_t inc1 = 0, inc2 = 0;
        assert_int_equal(pgstore_node_register(s, "rn", 10000, &inc1), 0);
        assert_int_equal(inc1, 1);
        assert_int_equal(pgstore_node_register(s, "rn", 10000, &inc2), 0);
        assert_int_equal(inc2, 2);
        assert_int_equal(pgstore_node_register(s, "", 10000, &inc2), -EINVAL);
        assert_int_equal(pgstore_node_register(s, "rn", 0, &inc2), -EINVAL);

        static const char odd[] = "m-rh-\"q\\,{} x";   /* array syntax in an id */
        assert_int_equal(pgstore_mandate_create(s, "m-rh-1", NULL, "rn", 1000, NULL, 0), 0);
        assert_int_equal(pgstore_mandate_create(s, "m-rh-2", NULL, "rn", 1000, NULL, 0), 0);
        assert_int_equal(pgstore_mandate_create(s, "m-rh-3", NULL, "other", 1000, NULL, 0), 0);
        assert_int_equal(pgstore_mandate_create(s, "m-rh-4", NULL, "rn", 1000, NULL, 0), 0);
        assert_int_equal(pgstore_mandate_create(s, odd, NULL, "rn", 1000, NULL, 0), 0);
        assert_int_equal(pgstore_mandate_finish(s, "m-rh-4", 1, "succeeded"), 0);
        const char *ids[] = { "m-rh-1", "m-rh-2", "m-rh-3", "m-rh-none", "m-rh-4", odd,
                              "m-rh-1" };
        const int64_t epochs[] = { 1, 2, 1, 1, 1, 1, 1 };
        const bool want[] = { true, false, false, false, false, true, true };
        bool *ren = NULL;
        assert_int_equal(pgstore_renew_held(s, "rn", inc2, ids, epochs, 7, 60000, &ren), 0);
        assert_non_null(ren);
        for (size_t i = 0; i < 7; i++)
                if (ren[i] != want[i])
                        fail_msg("renewed[%zu] (%s at %" PRId64 ") is %d", i, ids[i], epochs[i],
                                 ren[i]);
        free(ren);
        assert_true(lease_left(c, "m-rh-1") > 50000);
        assert_true(lease_left(c, odd) > 50000);
        assert_true(lease_left(c, "m-rh-2") < 2000);      /* wrong epoch: not renewed */
        assert_true(lease_left(c, "m-rh-3") < 2000);      /* another node's */
        assert_int_equal(lease_left(c, "m-rh-4"), -999999);  /* ended: no lease */

        /* the older incarnation renews nothing, not even itself */
        ren = (bool *)1;
        assert_int_equal(pgstore_renew_held(s, "rn", inc1, ids, epochs, 1, 600000, &ren),
                         -ESTALE);
        assert_null(ren);
        assert_non_null(strstr(pgstore_error(s), "incarnation"));
        assert_true(lease_left(c, "m-rh-1") < 61000);
        assert_true(count(c, "SELECT (extract(epoch FROM expires_at - now()) * 1000)::bigint "
                             "FROM kairos_node WHERE node = $1", "rn") < 61000);
        /* nor does a newer one than registered */
        assert_int_equal(pgstore_renew_held(s, "rn", inc2 + 1, NULL, NULL, 0, 60000, &ren),
                         -ESTALE);

        /* n = 0: a plain heartbeat */
        assert_int_equal(pgstore_renew_held(s, "rn", inc2, NULL, NULL, 0, 5000, &ren), 0);
        assert_null(ren);
        int64_t left = count(c, "SELECT (extract(epoch FROM expires_at - now()) * 1000)::bigint "
                                "FROM kairos_node WHERE node = $1", "rn");
        assert_true(left > 3000 && left <= 5000);
        /* a node never registered is registered by its first renewal */
        assert_int_equal(pgstore_renew_held(s, "rn-new", 7, NULL, NULL, 0, 5000, &ren), 0);
        assert_int_equal(count(c, "SELECT incarnation FROM kairos_node WHERE node = $1",
                               "rn-new"), 7);

        /* bad input is refused before anything is sent */
        const char *nul[] = { NULL };
        assert_int_equal(pgstore_renew_held(s, "rn", inc2, ids, epochs, 1, 0, &ren), -EINVAL);
        assert_int_equal(pgstore_renew_held(s, "rn", inc2, NULL, epochs, 1, 5000, &ren), -EINVAL);
        assert_int_equal(pgstore_renew_held(s, "rn", inc2, ids, NULL, 1, 5000, &ren), -EINVAL);
        assert_int_equal(pgstore_renew_held(s, "rn", inc2, nul, epochs, 1, 5000, &ren), -EINVAL);
        assert_int_equal(pgstore_renew_held(s, "", inc2, NULL, NULL, 0, 5000, &ren), -EINVAL);
        assert_int_equal(pgstore_renew_held(s, "rn", inc2, NULL, NULL, 0, 5000, NULL), -EINVAL);

        /* the list of nodes: rn holds m-rh-1, m-rh-2 and odd (running, its own) */
        assert_int_equal(pgstore_node_heartbeat(s, "rn-dead", 1, 1), 0);
        struct pgstore_node_row *nodes = NULL;
        size_t nn = 0;
        bool dead_seen = false;
        for (int64_t end = mono_ms() + 10000; !dead_seen && mono_ms() < end;) {
                pgstore_node_rows_free(nodes, nn);
                assert_int_equal(pgstore_node_rows(s, &nodes, &nn), 0);
                for (size_t i = 0; i < nn; i++)
                        if (strcmp(nodes[i].node, "rn-dead") == 0 && nodes[i].expires_in_ms < 0)
                                dead_seen = true;
        }
        assert_true(dead_seen);
        const struct pgstore_node_row *rn = NULL;
        for (size_t i = 0; i < nn; i++) {
                if (i)
                        assert_true(strcmp(nodes[i - 1].node, nodes[i].node) < 0);
                if (strcmp(nodes[i].node, "rn") == 0)
                        rn = &nodes[i];
        }
        assert_non_null(rn);
        assert_int_equal(rn->incarnation, inc2);
        assert_true(rn->expires_in_ms > 0 && rn->expires_in_ms <= 5000);
        assert_int_equal(rn->held, 3);
        pgstore_node_rows_free(nodes, nn);
        PQfinish(c);
        pgstore_close(s);
}

/* ---- an operator's take ---- */

static void test_mandate_take(void **state)
{
        struct pgstore *a = store(), *b = store();
        PGconn *c = raw();
        struct kbuf first = KBUF_INIT;
        sealed(&first, "{\"op\":\"mandate\",\"mandate_id\":\"m-take\"}");
        assert_int_equal(pgstore_mandate_create(a, "m-take", NULL, "a", 60000, first.data,
                                                first.len), 0);
        int64_t epoch = 0;
        char *prev = (char *)1;
        /* running under a live lease: its owner acts, nothing changes */
        assert_int_equal(pgstore_mandate_take(b, "m-take", "b", 300, 0, &epoch, &prev), -EBUSY);
        assert_null(prev);
        assert_non_null(strstr(pgstore_error(b), "live lease"));
        assert_int_equal(count(c, "SELECT epoch FROM kairos_mandate WHERE mandate_id = $1",
                               "m-take"), 1);
        /* paused: anyone may take it */
        assert_int_equal(pgstore_mandate_finish(a, "m-take", 1, "paused"), 0);
        assert_int_equal(pgstore_mandate_take(b, "m-take", "b", 300, 0, &epoch, &prev), 0);
        assert_int_equal(epoch, 2);
        assert_string_equal(prev, "a");
        free(prev);
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_mandate WHERE mandate_id = $1 AND "
                                  "status = 'running' AND owner = 'b' AND ended_at IS NULL "
                                  "AND lease_expires_at IS NOT NULL", "m-take"), 1);
        /* the old epoch is fenced */
        struct pgstore_idem_claim ic = { 0 };
        assert_int_equal(pgstore_wal_append(a, "m-take", 1, 0, first.data, first.len, NULL),
                         -ESTALE);
        assert_int_equal(idem_claim(a, "t:take-a", "t", "fp", "m-take", 1, "a", "s1", 1,
                                            60000, &ic), -ESTALE);
        /* b's call in flight when b's lease (300 ms) ends */
        assert_int_equal(idem_claim(b, "t:take-b", "t", "fp", "m-take", 2, "b", "s1", 1,
                                            60000, &ic), 0);
        assert_int_equal(ic.outcome, PGSTORE_IDEM_CLAIMED);
        /* expired, but within the grace: still b's */
        int r = -EBUSY;
        for (int64_t end = mono_ms() + 10000; mono_ms() < end;) {
                if (lease_left(c, "m-take") < -50)
                        break;
                usleep(20000);
        }
        assert_int_equal(pgstore_mandate_take(a, "m-take", "a", 60000, 600000, &epoch, NULL),
                         -EBUSY);
        r = pgstore_mandate_take(a, "m-take", "a", 60000, 0, &epoch, &prev);
        assert_int_equal(r, 0);
        assert_int_equal(epoch, 3);
        assert_string_equal(prev, "b");
        free(prev);
        /* b's call became interrupted, b is fenced */
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_idem WHERE key = $1 AND "
                                  "state = 'interrupted'", "t:take-b"), 1);
        assert_int_equal(pgstore_idem_finish(b, "t:take-b", "m-take", 2, false, "x", 1), -ESTALE);
        assert_int_equal(pgstore_mandate_finish(b, "m-take", 2, "paused"), -ESTALE);
        /* ended: nothing to take */
        assert_int_equal(pgstore_mandate_finish(a, "m-take", 3, "succeeded"), 0);
        assert_int_equal(pgstore_mandate_take(b, "m-take", "b", 300, 0, &epoch, &prev), -EALREADY);
        assert_int_equal(pgstore_mandate_take(b, "m-take-none", "b", 300, 0, &epoch, &prev),
                         -ENOENT);
        assert_int_equal(pgstore_mandate_take(b, "m-take", "", 300, 0, &epoch, &prev), -EINVAL);
        assert_int_equal(pgstore_mandate_take(b, "m-take", "b", 0, 0, &epoch, &prev), -EINVAL);
        assert_int_equal(pgstore_mandate_take(b, "m-take", "b", 300, -1, &epoch, &prev), -EINVAL);
        assert_int_equal(pgstore_mandate_take(b, "m-take", "b", 300, 0, NULL, &prev), -EINVAL);
        assert_int_equal(count(c, "SELECT epoch FROM kairos_mandate WHERE mandate_id = $1",
                               "m-take"), 3);
        kbuf_free(&first);
        PQfinish(c);
        pgstore_close(a);
        pgstore_close(b);
        pgstore_idem_claim_free(&ic);
}

/* ---- the list of mandates ---- */

static void test_mandates_list(void **state)
{
        struct pgstore *s = store();
        int64_t base = (now_ms() / 1000 - 7200) * 1000;   /* whole seconds, in the past */
        char mid[32];
        for (int i = 0; i < 5; i++) {
                struct pgstore_claim cl;
                snprintf(mid, sizeof mid, "m-lst-%d", i);
                assert_int_equal(pgstore_claim_tick(s, "lst", base + i * 60000, mid, "a", 60000,
                                                    NULL, 0, &cl), 0);
                assert_true(cl.won);
                pgstore_claim_free(&cl);
        }
        /* a tick with milliseconds, and a mandate without a tick */
        struct pgstore_claim cl;
        assert_int_equal(pgstore_claim_tick(s, "lst", base + 30123, "m-lst-ms", "a", 60000, NULL,
                                            0, &cl), 0);
        pgstore_claim_free(&cl);
        assert_int_equal(pgstore_mandate_finish(s, "m-lst-1", 1, "succeeded"), 0);
        assert_int_equal(pgstore_mandate_finish(s, "m-lst-3", 1, "paused"), 0);

        struct pgstore_mandate_filter f = { .schedule = "lst", .since_ms = -1 };
        struct pgstore_mandate_row *rows;
        size_t n, total;
        assert_int_equal(pgstore_mandates_list(s, &f, &rows, &n, &total), 0);
        assert_int_equal(n, 6);
        assert_int_equal(total, 6);
        static const char *const order[] = { "m-lst-4", "m-lst-3", "m-lst-2", "m-lst-1",
                                             "m-lst-ms", "m-lst-0" };
        for (size_t i = 0; i < n; i++)
                assert_string_equal(rows[i].mandate_id, order[i]);
        char ts[32];
        wal_format_ts(base + 4 * 60000, ts);
        memcpy(ts + 19, "Z", 2);     /* whole seconds: as the WAL writes a tick */
        assert_string_equal(rows[0].fired_at, ts);
        assert_int_equal(rows[0].fired_ms, base + 4 * 60000);
        wal_format_ts(base + 30123, ts);
        assert_string_equal(rows[4].fired_at, ts);
        assert_string_equal(rows[0].schedule, "lst");
        assert_string_equal(rows[0].status, "running");
        assert_string_equal(rows[0].owner, "a");
        assert_int_equal(rows[0].epoch, 1);
        assert_true(rows[0].leased);
        assert_true(rows[0].lease_left_ms > 30000 && rows[0].lease_left_ms <= 60000);
        assert_int_equal(rows[0].ended_ms, -1);
        assert_int_equal(rows[0].last_seq, 0);
        assert_true(rows[0].created_ms > now_ms() - 60000);
        assert_string_equal(rows[1].status, "paused");
        assert_false(rows[1].leased);
        assert_string_equal(rows[3].status, "succeeded");
        assert_true(rows[3].ended_ms >= rows[3].created_ms);
        pgstore_mandate_rows_free(rows, n);

        /* pages: limit, then after the last row shown */
        f.limit = 2;
        assert_int_equal(pgstore_mandates_list(s, &f, &rows, &n, &total), 0);
        assert_int_equal(n, 2);
        assert_int_equal(total, 6);
        pgstore_mandate_rows_free(rows, n);
        f.after = "m-lst-3";
        assert_int_equal(pgstore_mandates_list(s, &f, &rows, &n, &total), 0);
        assert_int_equal(n, 2);
        assert_int_equal(total, 4);
        assert_string_equal(rows[0].mandate_id, "m-lst-2");
        assert_string_equal(rows[1].mandate_id, "m-lst-1");
        pgstore_mandate_rows_free(rows, n);
        f.after = "m-lst-0";
        assert_int_equal(pgstore_mandates_list(s, &f, &rows, &n, &total), 0);
        assert_int_equal(n, 0);
        assert_null(rows);
        assert_int_equal(total, 0);
        f.after = "m-lst-none";
        assert_int_equal(pgstore_mandates_list(s, &f, &rows, &n, &total), -ENOENT);
        /* filters */
        f = (struct pgstore_mandate_filter){ .schedule = "lst", .status = "running",
                                             .since_ms = base + 60000 };
        assert_int_equal(pgstore_mandates_list(s, &f, &rows, &n, &total), 0);
        assert_int_equal(n, 2);   /* m-lst-4, m-lst-2 */
        assert_string_equal(rows[0].mandate_id, "m-lst-4");
        assert_string_equal(rows[1].mandate_id, "m-lst-2");
        pgstore_mandate_rows_free(rows, n);
        f = (struct pgstore_mandate_filter){ .schedule = "lst-none", .since_ms = -1 };
        assert_int_equal(pgstore_mandates_list(s, &f, &rows, &n, &total), 0);
        assert_int_equal(n, 0);
        /* a status that no mandate can have matches none (no error) */
        f = (struct pgstore_mandate_filter){ .status = "x'); DROP TABLE kairos_wal; --",
                                             .since_ms = -1 };
        assert_int_equal(pgstore_mandates_list(s, &f, &rows, &n, &total), 0);
        assert_int_equal(n, 0);
        /* one mandate by id */
        f = (struct pgstore_mandate_filter){ .mandate_id = "m-lst-3", .since_ms = -1 };
        assert_int_equal(pgstore_mandates_list(s, &f, &rows, &n, &total), 0);
        assert_int_equal(n, 1);
        assert_string_equal(rows[0].mandate_id, "m-lst-3");
        assert_string_equal(rows[0].status, "paused");
        assert_string_equal(rows[0].owner, "a");
        pgstore_mandate_rows_free(rows, n);
        f = (struct pgstore_mandate_filter){ .mandate_id = "m-lst-none", .since_ms = -1 };
        assert_int_equal(pgstore_mandates_list(s, &f, &rows, &n, &total), 0);
        assert_int_equal(n, 0);
        assert_int_equal(pgstore_mandates_list(s, NULL, &rows, &n, &total), -EINVAL);
        pgstore_close(s);
}

/* ---- a mandate's tool calls as recovery's evidence ---- */

static void test_idem_of_mandate_evidence(void **state)
{
        struct pgstore *s = store();
        assert_int_equal(pgstore_mandate_create(s, "m-ev", "sched", "a", 60000, NULL, 0), 0);
        struct pgstore_idem_claim ic = { 0 };
        static const struct { const char *key, *step; uint32_t attempt; } calls[] = {
                { "t:ev-a", "s1", 2 }, { "t:ev-b", "s1", 2 }, { "t:ev-c", "s2", 1 },
                { "t:ev-d", NULL, 0 },
        };
        for (size_t i = 0; i < 4; i++) {
                assert_int_equal(idem_claim(s, calls[i].key, "t", "fp", "m-ev", 1, "a",
                                                    calls[i].step, calls[i].attempt, 60000, &ic),
                                 0);
                assert_int_equal(ic.outcome, PGSTORE_IDEM_CLAIMED);
        }
        assert_int_equal(pgstore_idem_finish(s, "t:ev-a", "m-ev", 1, false, "ok", 2), 0);
        assert_int_equal(pgstore_idem_finish(s, "t:ev-c", "m-ev", 1, true, "no", 2), 0);

        struct pgstore_idem_row *rows;
        size_t n;
        assert_int_equal(pgstore_idem_of_mandate(s, "m-ev", &rows, &n), 0);
        assert_int_equal(n, 4);
        assert_string_equal(rows[0].key, "t:ev-a");
        assert_string_equal(rows[0].step_id, "s1");
        assert_int_equal(rows[0].attempt, 2);
        assert_string_equal(rows[0].state, "completed");
        assert_string_equal(rows[0].owner, "a");
        assert_string_equal(rows[0].tool, "t");
        assert_int_equal(rows[0].epoch, 1);
        assert_true(rows[0].created_ms > now_ms() - 60000);
        assert_true(rows[0].updated_ms >= rows[0].created_ms);
        assert_string_equal(rows[1].key, "t:ev-b");
        assert_string_equal(rows[1].state, "processing");
        assert_string_equal(rows[2].key, "t:ev-c");
        assert_string_equal(rows[2].state, "failed");
        assert_int_equal(rows[2].attempt, 1);
        assert_null(rows[3].step_id);

        struct evidence_index *ix;
        assert_int_equal(pgstore_idem_evidence("m-ev", rows, n, &ix), 0);
        assert_true(evidence_index_known(ix));
        assert_int_equal(evidence_index_size(ix), 3);   /* the call of no step left out */
        const struct evidence_call *ec;
        assert_int_equal(evidence_index_calls(ix, "m-ev", &ec), 3);
        assert_int_equal(ec[0].state, IDEM_ST_COMPLETED);
        assert_int_equal(ec[0].finished_ms, rows[0].updated_ms);
        assert_int_equal(ec[1].state, IDEM_ST_PROCESSING);
        assert_int_equal(ec[1].finished_ms, 0);
        assert_int_equal(ec[2].state, IDEM_ST_FAILED);
        struct evidence_schedule es = { .effects_via_kairosctl = true };
        struct evidence_mandate em;
        assert_int_equal(evidence_for_mandate(ix, "m-ev", &es, &em), 0);
        assert_int_equal(em.n, 2);
        assert_string_equal(em.steps[0].step_id, "s1");
        assert_int_equal(em.steps[0].idem_open, 1);
        assert_int_equal(em.steps[0].idem_finished, 1);
        assert_non_null(strstr(em.steps[0].idem_json, "\"attempt\":2"));
        assert_int_equal(em.steps[1].idem_open, 0);
        assert_int_equal(em.steps[1].idem_finished, 1);
        evidence_mandate_release(&em);
        evidence_index_free(ix);
        /* a state the schema does not know is refused */
        char *st = rows[1].state;
        rows[1].state = (char *)"done";
        assert_int_equal(pgstore_idem_evidence("m-ev", rows, n, &ix), -EBADMSG);
        assert_null(ix);
        rows[1].state = st;
        pgstore_idem_rows_free(rows, n);

        assert_int_equal(pgstore_idem_of_mandate(s, "m-ev-none", &rows, &n), 0);
        assert_int_equal(n, 0);
        assert_null(rows);
        assert_int_equal(pgstore_idem_evidence("m-ev-none", rows, n, &ix), 0);
        assert_true(evidence_index_known(ix));
        assert_int_equal(evidence_index_size(ix), 0);
        evidence_index_free(ix);
        pgstore_close(s);
        pgstore_idem_claim_free(&ic);
}

/* ---- Concurrency= across the cluster ---- */

static void claim_won(struct pgstore *s, const char *schedule, int64_t at, const char *mid,
                      const char *node, int64_t lease_ms)
{
        struct pgstore_claim cl;
        assert_int_equal(pgstore_claim_tick(s, schedule, at, mid, node, lease_ms, NULL, 0, &cl),
                         0);
        assert_true(cl.won);
        pgstore_claim_free(&cl);
}

static void slot_take(struct pgstore *s, const char *mid, int64_t epoch, bool want_taken,
                      const char *want_holder)
{
        bool taken = !want_taken;
        char *holder = NULL;
        int r = pgstore_slot_take(s, mid, epoch, &taken, &holder);
        if (r < 0)
                fail_msg("slot_take %s: %d %s", mid, r, pgstore_error(s));
        assert_int_equal(taken, want_taken);
        assert_non_null(holder);
        assert_string_equal(holder, want_holder);
        free(holder);
}

static void test_slot_queue(void **state)
{
        struct pgstore *a = store(), *b = store();
        PGconn *c = raw();
        int64_t base = (now_ms() / 1000 - 600) * 1000;
        claim_won(a, "slotq", base, "m-slot-1", "a", 60000);
        claim_won(b, "slotq", base + 1000, "m-slot-2", "b", 60000);
        claim_won(a, "slotq", base + 2000, "m-slot-3", "a", 60000);
        claim_won(a, "slotq-other", base, "m-slot-o", "a", 60000);
        /* the first takes it (and again: it holds it); the others wait */
        slot_take(a, "m-slot-1", 1, true, "m-slot-1");
        slot_take(a, "m-slot-1", 1, true, "m-slot-1");
        slot_take(b, "m-slot-2", 1, false, "m-slot-1");
        slot_take(a, "m-slot-3", 1, false, "m-slot-1");
        /* another schedule has a slot of its own */
        slot_take(a, "m-slot-o", 1, true, "m-slot-o");
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_mandate WHERE schedule = $1 AND "
                                  "slot_wait_since IS NOT NULL", "slotq"), 2);
        struct pgstore_mandate_filter f = { .schedule = "slotq", .since_ms = -1 };
        struct pgstore_mandate_row *rows;
        size_t n;
        assert_int_equal(pgstore_mandates_list(a, &f, &rows, &n, NULL), 0);
        assert_int_equal(n, 3);
        for (size_t i = 0; i < n; i++)
                assert_int_equal(rows[i].slot_waiting,
                                 strcmp(rows[i].mandate_id, "m-slot-1") != 0);
        pgstore_mandate_rows_free(rows, n);
        /* fenced */
        bool taken = true;
        char *holder = NULL;
        assert_int_equal(pgstore_slot_take(b, "m-slot-2", 2, &taken, &holder), -ESTALE);
        assert_false(taken);
        assert_int_equal(pgstore_slot_take(b, "m-slot-none", 1, &taken, &holder), -ENOENT);
        assert_int_equal(pgstore_slot_take(b, "m-slot-2", 0, &taken, &holder), -EINVAL);
        /* the holder ends: the earliest waiter goes first, not the first to ask */
        assert_int_equal(pgstore_mandate_finish(a, "m-slot-1", 1, "succeeded"), 0);
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_slot WHERE schedule = $1 AND "
                                  "holder IS NULL", "slotq"), 1);
        slot_take(a, "m-slot-3", 1, false, "m-slot-2");
        slot_take(b, "m-slot-2", 1, true, "m-slot-2");
        slot_take(a, "m-slot-3", 1, false, "m-slot-2");
        assert_int_equal(pgstore_slot_take(a, "m-slot-1", 1, &taken, &holder), -ESTALE);
        /* a takeover keeps it: the slot is the mandate's, not the node's */
        PQclear(PQexec(c, "UPDATE kairos_mandate SET lease_expires_at = now() - interval '1 "
                          "minute' WHERE mandate_id = 'm-slot-2'"));
        struct pgstore_takeover t;
        assert_int_equal(pgstore_lease_takeover(a, "m-slot-2", "a", 60000, 0, &t), 0);
        assert_int_equal(t.epoch, 2);
        pgstore_takeover_free(&t);
        slot_take(a, "m-slot-3", 1, false, "m-slot-2");
        assert_int_equal(pgstore_slot_take(b, "m-slot-2", 1, &taken, &holder), -ESTALE);
        assert_int_equal(pgstore_slot_release(b, "m-slot-2", 1), -ESTALE);
        slot_take(a, "m-slot-2", 2, true, "m-slot-2");
        /* given back while it stays running (an approval): the next takes it */
        assert_int_equal(pgstore_slot_release(a, "m-slot-2", 2), 0);
        assert_int_equal(pgstore_slot_release(a, "m-slot-2", 2), 0);
        slot_take(a, "m-slot-3", 1, true, "m-slot-3");
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_mandate WHERE schedule = $1 AND "
                                  "slot_wait_since IS NOT NULL", "slotq"), 0);
        slot_take(a, "m-slot-2", 2, false, "m-slot-3");
        /* paused (parked) frees it, and leaves the line */
        assert_int_equal(pgstore_mandate_finish(a, "m-slot-3", 1, "paused"), 0);
        assert_int_equal(pgstore_mandate_finish(a, "m-slot-2", 2, "abandoned"), 0);
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_slot WHERE schedule = $1 AND "
                                  "holder IS NULL", "slotq"), 1);
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_mandate WHERE schedule = $1 AND "
                                  "slot_wait_since IS NOT NULL", "slotq"), 0);
        PQfinish(c);
        pgstore_close(a);
        pgstore_close(b);
}

#define NSLOTTERS 6

struct slotter {
        int id;
        int64_t base_ms;
        pthread_barrier_t *barrier;
        int rc;
        bool taken;
};

static void *slot_thread(void *arg)
{
        struct slotter *sl = arg;
        struct pgstore *s = NULL;
        char err[512], mid[32], node[16];
        if (pgstore_connect(conninfo(), &s, err, sizeof err) < 0)
                return (void *)1;
        snprintf(mid, sizeof mid, "m-slotc-%d", sl->id);
        snprintf(node, sizeof node, "n%d", sl->id);
        struct pgstore_claim cl;
        sl->rc = pgstore_claim_tick(s, "slotc", sl->base_ms + sl->id * 1000, mid, node, 60000,
                                    NULL, 0, &cl);
        pgstore_claim_free(&cl);
        pthread_barrier_wait(sl->barrier);
        char *holder = NULL;
        if (sl->rc == 0)
                sl->rc = pgstore_slot_take(s, mid, 1, &sl->taken, &holder);
        free(holder);
        pgstore_close(s);
        return NULL;
}

static void test_slot_concurrent_takes_one_holder(void **state)
{
        pthread_barrier_t barrier;
        pthread_barrier_init(&barrier, NULL, NSLOTTERS);
        struct slotter sl[NSLOTTERS];
        pthread_t th[NSLOTTERS];
        int64_t base = (now_ms() / 1000 - 900) * 1000;
        for (int i = 0; i < NSLOTTERS; i++) {
                sl[i] = (struct slotter){ .id = i, .base_ms = base, .barrier = &barrier };
                assert_int_equal(pthread_create(&th[i], NULL, slot_thread, &sl[i]), 0);
        }
        int holders = 0;
        for (int i = 0; i < NSLOTTERS; i++) {
                void *ret;
                pthread_join(th[i], &ret);
                assert_null(ret);
                assert_int_equal(sl[i].rc, 0);
                holders += sl[i].taken;
        }
        pthread_barrier_destroy(&barrier);
        assert_int_equal(holders, 1);
        PGconn *c = raw();
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_mandate WHERE schedule = $1 AND "
                                  "slot_wait_since IS NOT NULL", "slotc"), NSLOTTERS - 1);
        PQfinish(c);
}

static void claim_reject(struct pgstore *s, int64_t at, const char *mid, const char *node,
                         bool want_won, const char *want_busy, const char *want_status)
{
        struct pgstore_claim cl;
        int r = pgstore_claim_tick_reject(s, "rej", at, mid, node, 60000, NULL, 0, &cl);
        if (r < 0)
                fail_msg("claim %s: %d %s", mid, r, pgstore_error(s));
        assert_int_equal(cl.won, want_won);
        assert_int_equal(cl.rejected, want_busy != NULL);
        if (want_busy) {
                assert_string_equal(cl.busy, want_busy);
                assert_string_equal(cl.busy_status, want_status);
                assert_null(cl.mandate_id);
        } else {
                assert_string_equal(cl.mandate_id, mid);
        }
        pgstore_claim_free(&cl);
}

static void test_claim_reject(void **state)
{
        struct pgstore *a = store(), *b = store();
        PGconn *c = raw();
        int64_t base = (now_ms() / 1000 - 300) * 1000;
        claim_reject(a, base, "m-rej-1", "a", true, NULL, NULL);
        /* a second claim of the same tick loses as always */
        struct pgstore_claim cl;
        assert_int_equal(pgstore_claim_tick_reject(b, "rej", base, "m-rej-1", "b", 60000, NULL,
                                                   0, &cl), 0);
        assert_false(cl.won);
        assert_false(cl.rejected);
        assert_string_equal(cl.claimed_by, "a");
        pgstore_claim_free(&cl);
        /* while m-rej-1 runs, the next tick is refused, on every node */
        claim_reject(b, base + 1000, "m-rej-2", "b", false, "m-rej-1", "running");
        assert_int_equal(pgstore_mandate_finish(a, "m-rej-1", 1, "succeeded"), 0);
        claim_reject(a, base + 1000, "m-rej-2", "a", false, "m-rej-1", "running");
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_mandate WHERE mandate_id = $1",
                               "m-rej-2"), 0);
        /* ended: the next tick runs; paused counts as unfinished */
        claim_reject(b, base + 2000, "m-rej-3", "b", true, NULL, NULL);
        assert_int_equal(pgstore_mandate_finish(b, "m-rej-3", 1, "paused"), 0);
        claim_reject(a, base + 3000, "m-rej-4", "a", false, "m-rej-3", "paused");
        assert_int_equal(pgstore_claim_tick_reject(a, "rej", now_ms() + 60000, "m-rej-f", "a",
                                                   60000, NULL, 0, &cl), -ETIME);
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_tick_rejected WHERE schedule = $1",
                               "rej"), 2);
        PQfinish(c);
        pgstore_close(a);
        pgstore_close(b);
}

/* kairosctl retry across nodes: concurrent retries of one tick, each its
 * own session (its own node), get one winner; the others are told it; a
 * tick that ended succeeded needs forced; any writer meets the unique
 * index. */
#define NRETRIERS 8
struct retrier {
        pthread_barrier_t *barrier;
        int64_t at;
        int id;
        int rc;
        bool created;
        char *busy, *busy_status, *busy_owner;
};

static void *retry_thread(void *arg)
{
        struct retrier *t = arg;
        struct pgstore *s = store();
        char mid[32], node[32];
        snprintf(mid, sizeof mid, "m-rc-1-%d", t->id);
        snprintf(node, sizeof node, "node-%d", t->id);
        struct pgstore_retry rt = { .mandate_id = mid, .schedule = "rcas", .fired_at_ms = t->at,
                                    .retry_of = "m-rc-0", .retry = 1, .forced = true };
        pthread_barrier_wait(t->barrier);
        t->rc = pgstore_retry_create(s, &rt, node, 60000, NULL, 0, &t->created, &t->busy,
                                     &t->busy_status, &t->busy_owner);
        pgstore_close(s);
        return NULL;
}

static void retry_create_as(struct pgstore *s, const char *node, int64_t at, const char *mid,
                            int retry, bool forced, const char *want_busy,
                            const char *want_status, const char *want_owner)
{
        struct pgstore_retry rt = { .mandate_id = mid, .schedule = "rcas", .fired_at_ms = at,
                                    .retry_of = "m-rc-0", .retry = retry, .forced = forced };
        bool created;
        char *busy, *st, *owner;
        assert_int_equal(pgstore_retry_create(s, &rt, node, 60000, NULL, 0, &created, &busy, &st,
                                              &owner),
                         0);
        assert_int_equal(created, want_busy == NULL);
        if (want_busy) {
                assert_string_equal(busy, want_busy);
                assert_string_equal(st, want_status);
                assert_string_equal(owner, want_owner);
        }
        free(busy);
        free(st);
        free(owner);
}

static void retry_create(struct pgstore *s, int64_t at, const char *mid, int retry, bool forced,
                         const char *want_busy, const char *want_status, const char *want_owner)
{
        retry_create_as(s, "a", at, mid, retry, forced, want_busy, want_status, want_owner);
}

static void test_retry_compare_and_set(void **state)
{
        (void)state;
        struct pgstore *a = store();
        PGconn *c = raw();
        int64_t at = (now_ms() / 1000 - 200) * 1000;
        struct pgstore_claim cl;
        assert_int_equal(pgstore_claim_tick(a, "rcas", at, "m-rc-0", "a", 60000, NULL, 0, &cl),
                         0);
        assert_true(cl.won);
        pgstore_claim_free(&cl);
        /* the tick's first mandate is unfinished: no retry */
        retry_create(a, at, "m-rc-x", 1, true, "m-rc-0", "running", "a");
        assert_int_equal(pgstore_mandate_finish(a, "m-rc-0", 1, "failed"), 0);

        pthread_barrier_t barrier;
        pthread_barrier_init(&barrier, NULL, NRETRIERS);
        struct retrier t[NRETRIERS];
        pthread_t th[NRETRIERS];
        for (int i = 0; i < NRETRIERS; i++) {
                t[i] = (struct retrier){ .barrier = &barrier, .at = at, .id = i };
                assert_int_equal(pthread_create(&th[i], NULL, retry_thread, &t[i]), 0);
        }
        for (int i = 0; i < NRETRIERS; i++)
                pthread_join(th[i], NULL);
        pthread_barrier_destroy(&barrier);
        int winners = 0, winner = -1;
        for (int i = 0; i < NRETRIERS; i++) {
                assert_int_equal(t[i].rc, 0);
                if (t[i].created) {
                        winners++;
                        winner = i;
                }
        }
        assert_int_equal(winners, 1);
        char wid[32];
        snprintf(wid, sizeof wid, "m-rc-1-%d", winner);
        for (int i = 0; i < NRETRIERS; i++) {
                char wnode[32];
                snprintf(wnode, sizeof wnode, "node-%d", winner);
                if (i != winner) {
                        assert_string_equal(t[i].busy, wid);
                        assert_string_equal(t[i].busy_status, "running");
                        assert_string_equal(t[i].busy_owner, wnode);
                }
                free(t[i].busy);
                free(t[i].busy_status);
                free(t[i].busy_owner);
        }
        assert_int_equal(count(c, "SELECT count(*) FROM kairos_mandate WHERE schedule = $1 "
                                  "AND retry IS NOT NULL", "rcas"), 1);
        /* the same id again (an unknown commit outcome, or another node's
         * retry of the same number): the row tells, with its owner (only
         * the owner may take the id for its own) */
        char wnode[32];
        snprintf(wnode, sizeof wnode, "node-%d", winner);
        retry_create(a, at, wid, 1, true, wid, "running", wnode);
        retry_create_as(a, wnode, at, wid, 1, true, wid, "running", wnode);
        /* any writer: the unique index */
        PGresult *res = PQexec(c, "INSERT INTO kairos_mandate (mandate_id, schedule, fired_at, "
                                  "retry) SELECT 'm-rc-raw', schedule, fired_at, 2 FROM "
                                  "kairos_mandate WHERE mandate_id = 'm-rc-0'");
        assert_string_equal(PQresultErrorField(res, PG_DIAG_SQLSTATE), "23505");
        PQclear(res);
        /* paused is unfinished too */
        assert_int_equal(pgstore_mandate_finish(a, wid, 1, "paused"), 0);
        retry_create(a, at, "m-rc-2", 2, true, wid, "paused", wnode);
        /* ended succeeded: only forced */
        res = PQexecParams(c, "UPDATE kairos_mandate SET status = 'succeeded' "
                              "WHERE mandate_id = $1", 1, NULL, (const char *[]){ wid }, NULL,
                           NULL, 0);
        assert_int_equal(PQresultStatus(res), PGRES_COMMAND_OK);
        PQclear(res);
        retry_create(a, at, "m-rc-2", 2, false, wid, "succeeded", wnode);
        retry_create(a, at, "m-rc-2", 2, true, NULL, NULL, NULL);
        res = PQexec(c, "SELECT retry_of, retry, fired_at = (SELECT fired_at FROM kairos_mandate "
                        "WHERE mandate_id = 'm-rc-0') FROM kairos_mandate "
                        "WHERE mandate_id = 'm-rc-2'");
        assert_int_equal(PQntuples(res), 1);
        assert_string_equal(PQgetvalue(res, 0, 0), "m-rc-0");
        assert_string_equal(PQgetvalue(res, 0, 1), "2");
        assert_string_equal(PQgetvalue(res, 0, 2), "t");
        PQclear(res);
        int last = 0;
        assert_int_equal(pgstore_tick_last_retry(a, "rcas", at, &last), 0);
        assert_int_equal(last, 2);
        assert_int_equal(pgstore_tick_last_retry(a, "rcas", at + 1000, &last), 0);
        assert_int_equal(last, 0);
        PQfinish(c);
        pgstore_close(a);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_migrate_idempotent),
                cmocka_unit_test(test_concurrent_claims_one_winner),
                cmocka_unit_test(test_tick_in_future_refused),
                cmocka_unit_test(test_takeover_fences_old_owner),
                cmocka_unit_test(test_takeover_during_appends),
                cmocka_unit_test(test_concurrent_takeovers_once_each),
                cmocka_unit_test(test_node_incarnation),
                cmocka_unit_test(test_schedule_compare_and_set),
                cmocka_unit_test(test_idem_claim_outcomes),
                cmocka_unit_test(test_rows_are_the_file_bytes),
                cmocka_unit_test(test_append_repeat_is_idempotent),
                cmocka_unit_test(test_bad_lines_never_sent),
                cmocka_unit_test(test_lock_wait_bounded),
                cmocka_unit_test(test_lost_connection),
                cmocka_unit_test(test_unknown_commit_outcome),
                cmocka_unit_test(test_migrate_from_v1),
                cmocka_unit_test(test_register_and_renew_held),
                cmocka_unit_test(test_mandate_take),
                cmocka_unit_test(test_mandates_list),
                cmocka_unit_test(test_idem_of_mandate_evidence),
                cmocka_unit_test(test_idem_settle_step),
                cmocka_unit_test(test_slot_queue),
                cmocka_unit_test(test_slot_concurrent_takes_one_holder),
                cmocka_unit_test(test_claim_reject),
                cmocka_unit_test(test_retry_compare_and_set),
        };
        return cmocka_run_group_tests(tests, setup_schema, NULL);
}
