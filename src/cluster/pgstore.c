/* SPDX-License-Identifier: MIT */
/* pgstore: cluster mode's PostgreSQL store (see pgstore.h, docs/design.md
 * §14).  The rules that make two nodes safe (one winner per tick, fencing by
 * epoch, lease expiry by the database's clock) live in the schema's
 * functions (pgschema.c) so that they hold inside the database; this file
 * only validates what it sends, calls them and maps their errors. */
#include "pgstore.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "kairos/crcline.h"
#include "kairos/evidence.h"
#include "kairos/idem.h"
#include "kairos/kbuf.h"
#include "kairos/kmem.h"
#include "kairos/wal.h"
#include "pgschema.h"

/* Any constant: serializes concurrent migrations ("kairos" in ASCII). */
#define MIGRATE_LOCK_KEY "118066125107059"

/* The calls of the write path, prepared once per connection (parsed,
 * analysed and planned once, not at every barrier), their arrays sent in
 * binary (no hex text for the server to decode). */
enum prepared {
        PREP_WAL_APPEND, PREP_CLAIM_TICK, PREP_CLAIM_TICK_REJECT, PREP_MANDATE_CREATE,
        PREP_RETRY_CREATE, PREP_COUNT
};

static const char *const prepared_sql[PREP_COUNT] = {
        [PREP_WAL_APPEND] = "SELECT kairos_wal_append($1, $2, $3, $4::bytea[], $5::bigint[])",
        [PREP_CLAIM_TICK] = "SELECT r_won, r_mandate_id, r_claimed_by, r_epoch, NULL, NULL "
                            "FROM kairos_claim_tick($1, 'epoch'::timestamptz + $2::bigint * "
                            "interval '1 millisecond', $3, $4, $5, $6::bytea[], $7::bigint[])",
        [PREP_CLAIM_TICK_REJECT] = "SELECT r_won, r_mandate_id, r_claimed_by, r_epoch, r_busy, "
                                   "r_busy_status FROM kairos_claim_tick_reject($1, "
                                   "'epoch'::timestamptz + $2::bigint * interval '1 millisecond', "
                                   "$3, $4, $5, $6::bytea[], $7::bigint[])",
        [PREP_MANDATE_CREATE] = "SELECT kairos_mandate_create($1, $2, NULL, $3, $4, "
                                "$5::bytea[], $6::bigint[])",
        [PREP_RETRY_CREATE] = "SELECT r_created, r_mandate_id, r_status, r_owner FROM "
                              "kairos_retry_create($1, $2, 'epoch'::timestamptz + $3::bigint * "
                              "interval '1 millisecond', $4, $5, $6, $7, $8, $9::bytea[], "
                              "$10::bigint[])",
};

struct pgstore {
        PGconn *conn;
        unsigned prepared;      /* bit i: prepared_sql[i] exists in this session */
        bool read_only;         /* the last call was refused as read-only (25006) */
        char err[512];
};

static void set_err(struct pgstore *s, const char *fmt, ...)
        __attribute__((format(printf, 2, 3)));
static void set_err(struct pgstore *s, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(s->err, sizeof s->err, fmt, ap);
        va_end(ap);
        size_t n = strlen(s->err);
        while (n && (s->err[n - 1] == '\n' || s->err[n - 1] == ' '))
                s->err[--n] = '\0';
}

const char *pgstore_error(const struct pgstore *s)
{
        return s ? s->err : "no store";
}

/* Notices (e.g. "relation already exists, skipping") are not errors. */
static void quiet_notice(void *arg, const char *message)
{
}

static int open_conn(const char *conninfo, PGconn **ret, char *err, size_t errlen)
{
        /* Defaults first: with expand_dbname the connection string's own
         * settings override the ones before it. */
        /* A worker thread must not wait for ever: on a dead peer
         * (keepalives, tcp_user_timeout), on a row lock another session
         * holds (lock_timeout), on a slow statement (statement_timeout). */
        /* A default set here would hide the environment variable of the
         * same setting (libpq reads PG* only for what is not set): those
         * that have one go only when it is unset; PGOPTIONS comes after
         * kairosd's own options (the later -c wins). */
        static const char kairos_options[] = "-c statement_timeout=30s -c lock_timeout=10s "
                                             "-c idle_in_transaction_session_timeout=60s";
        const char *env_options = getenv("PGOPTIONS");
        char *options = NULL;
        if (env_options && *env_options &&
            asprintf(&options, "%s %s", kairos_options, env_options) < 0)
                return -ENOMEM;
        const struct {
                const char *key, *val, *env;
        } defaults[] = {
                { "connect_timeout", "10", "PGCONNECT_TIMEOUT" },
                { "keepalives", "1", NULL },
                { "keepalives_idle", "5", NULL },
                { "keepalives_interval", "2", NULL },
                { "keepalives_count", "3", NULL },
                { "tcp_user_timeout", "15000", NULL },
                { "options", options ? options : kairos_options, NULL },
                { "application_name", "kairosd", "PGAPPNAME" },
        };
        enum { NDEFAULTS = sizeof defaults / sizeof defaults[0] };
        const char *keys[NDEFAULTS + 2], *vals[NDEFAULTS + 2];
        size_t n = 0;
        for (size_t i = 0; i < NDEFAULTS; i++) {
                const char *env = defaults[i].env ? getenv(defaults[i].env) : NULL;
                if (env && *env)
                        continue;
                keys[n] = defaults[i].key;
                vals[n++] = defaults[i].val;
        }
        keys[n] = "dbname";
        vals[n++] = conninfo;
        keys[n] = vals[n] = NULL;
        PGconn *c = PQconnectdbParams(keys, vals, 1);
        free(options);
        if (!c)
                return -ENOMEM;
        if (PQstatus(c) != CONNECTION_OK) {
                snprintf(err, errlen, "%s", PQerrorMessage(c));
                PQfinish(c);
                return -ECONNREFUSED;
        }
        PQsetNoticeProcessor(c, quiet_notice, NULL);
        *ret = c;
        return 0;
}

int pgstore_connect(const char *conninfo, struct pgstore **ret, char *err, size_t errlen)
{
        if (!conninfo || !ret || !err || !errlen)
                return -EINVAL;
        err[0] = '\0';
        struct pgstore *s = calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        int r = open_conn(conninfo, &s->conn, err, errlen);
        if (r < 0) {
                size_t n = strlen(err);
                while (n && (err[n - 1] == '\n' || err[n - 1] == ' '))
                        err[--n] = '\0';
                free(s);
                return r;
        }
        *ret = s;
        return 0;
}

void pgstore_close(struct pgstore *s)
{
        if (!s)
                return;
        if (s->conn)
                PQfinish(s->conn);
        free(s);
}

int pgstore_reset(struct pgstore *s)
{
        if (!s || !s->conn)
                return -EINVAL;
        PQreset(s->conn);
        s->prepared = 0;        /* a new session */
        if (PQstatus(s->conn) != CONNECTION_OK) {
                set_err(s, "%s", PQerrorMessage(s->conn));
                return -ENOTCONN;
        }
        return 0;
}

bool pgstore_refused_read_only(const struct pgstore *s)
{
        return s && s->read_only;
}

bool pgstore_connected(const struct pgstore *s)
{
        return s && s->conn && PQstatus(s->conn) == CONNECTION_OK;
}

/* The kairos_* functions raise these SQLSTATEs (pgschema.c). */
static int sqlstate_errno(const char *st)
{
        static const struct { const char *st; int err; } map[] = {
                { "KR001", ESTALE }, { "KR002", ENOENT }, { "KR003", EILSEQ },
                { "KR004", ETIME }, { "KR005", EPERM }, { "KR006", ESTALE }, { "KR007", EAGAIN },
                { "KR008", EBUSY }, { "KR009", EALREADY },
                { "23505", EEXIST },
                { "55P03", ETIMEDOUT },  /* lock_timeout */
                { "57014", ETIMEDOUT },  /* statement_timeout */
        };
        if (!st)
                return EIO;
        for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
                if (strcmp(st, map[i].st) == 0)
                        return map[i].err;
        return EIO;
}

/* 0 if res has the wanted status (the caller still owns res), else a
 * negative errno and res is freed. */
static int check(struct pgstore *s, PGresult *res, ExecStatusType want)
{
        s->read_only = false;
        if (res && PQresultStatus(res) == want)
                return 0;
        int err;
        /* (an error libpq made itself, without the server's SQLSTATE, is
         * the connection's: "server closed the connection unexpectedly"
         * from a server stopped while this session idled on it) */
        if (PQstatus(s->conn) != CONNECTION_OK ||
            (res && PQresultStatus(res) == PGRES_FATAL_ERROR &&
             !PQresultErrorField(res, PG_DIAG_SQLSTATE))) {
                set_err(s, "connection lost, outcome unknown: %s",
                        PQstatus(s->conn) != CONNECTION_OK ? PQerrorMessage(s->conn)
                                                           : PQresultErrorMessage(res));
                err = ENOTCONN;
        } else if (!res) {
                set_err(s, "%s", PQerrorMessage(s->conn));
                err = EIO;
        } else {
                const char *st = PQresultErrorField(res, PG_DIAG_SQLSTATE);
                const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
                err = sqlstate_errno(st);
                /* the server's own cause: its SQLSTATE with its words,
                 * except the kairos_* functions' own (their errno says) */
                bool own = st && st[0] == 'K' && st[1] == 'R';
                if (st && strcmp(st, "25006") == 0) {
                        /* read_only_sql_transaction: a standby, or a
                         * primary fenced by a switchover, whose sessions
                         * stay.  Nothing was written: the caller connects
                         * again (target_session_attrs=read-write finds the
                         * new primary) and asks again, as after a broken
                         * connection (docs/design.md §14) */
                        err = ENOTCONN;
                        s->read_only = true;
                        set_err(s, "the server takes no writes (a standby or a demoted "
                                   "primary), connecting again: %s (SQLSTATE %s)",
                                msg ? msg : "read-only", st);
                } else if (msg && st && !own)
                        set_err(s, "%s (SQLSTATE %s)", msg, st);
                else if (msg)
                        set_err(s, "%s", msg);
                else
                        set_err(s, "unexpected result %s: %s", PQresStatus(PQresultStatus(res)),
                                PQresultErrorMessage(res));
        }
        PQclear(res);
        return -err;
}

/* check(), then res to *ret (or freed if ret is NULL). */
static int take_result(struct pgstore *s, PGresult *res, ExecStatusType want, PGresult **ret)
{
        int r = check(s, res, want);
        if (r < 0)
                return r;
        if (ret)
                *ret = res;
        else
                PQclear(res);
        return 0;
}

static int exec_params(struct pgstore *s, const char *sql, int n, const char *const *vals,
                       int result_format, ExecStatusType want, PGresult **ret)
{
        if (!s || !s->conn)
                return -EINVAL;
        return take_result(s, PQexecParams(s->conn, sql, n, NULL, vals, NULL, NULL,
                                           result_format),
                           want, ret);
}

/* prepared_sql[which] with n parameters: text, except the last two (the
 * binary arrays of build_lines, lens[n - 2] and lens[n - 1] bytes). */
static int exec_prepared(struct pgstore *s, enum prepared which, int n, const char *const *vals,
                         const int *lens, ExecStatusType want, PGresult **ret)
{
        if (!s || !s->conn)
                return -EINVAL;
        char name[16];
        snprintf(name, sizeof name, "kairos_p%d", (int)which);
        if (!(s->prepared & 1u << which)) {
                PGresult *res = PQprepare(s->conn, name, prepared_sql[which], n, NULL);
                int r = check(s, res, PGRES_COMMAND_OK);
                if (r < 0)
                        return r;
                PQclear(res);
                s->prepared |= 1u << which;
        }
        int formats[12] = { 0 };
        formats[n - 2] = formats[n - 1] = 1;
        return take_result(s, PQexecPrepared(s->conn, name, n, vals, lens, formats, 0), want,
                           ret);
}

static int exec_simple(struct pgstore *s, const char *sql)
{
        if (!s || !s->conn)
                return -EINVAL;
        PGresult *res = PQexec(s->conn, sql);
        int r = check(s, res, PGRES_COMMAND_OK);
        if (r == 0)
                PQclear(res);
        return r;
}

/* After a failure inside a transaction: roll back if the connection can. */
static void rollback(struct pgstore *s)
{
        if (PQstatus(s->conn) == CONNECTION_OK)
                PQclear(PQexec(s->conn, "ROLLBACK"));
}

/* ---- schema ---- */

static int read_version(struct pgstore *s, int *ret)
{
        PGresult *res;
        int r = exec_params(s, "SELECT to_regclass('kairos_schema_migrations') IS NOT NULL", 0,
                            NULL, 0, PGRES_TUPLES_OK, &res);
        if (r < 0)
                return r;
        bool exists = PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
        PQclear(res);
        if (!exists) {
                *ret = 0;
                return 0;
        }
        r = exec_params(s, "SELECT coalesce(max(version), 0) FROM kairos_schema_migrations", 0,
                        NULL, 0, PGRES_TUPLES_OK, &res);
        if (r < 0)
                return r;
        *ret = PQntuples(res) == 1 ? atoi(PQgetvalue(res, 0, 0)) : 0;
        PQclear(res);
        return 0;
}

int pgstore_schema_version(struct pgstore *s, int *ret_version)
{
        if (!s || !ret_version)
                return -EINVAL;
        return read_version(s, ret_version);
}

int pgstore_migrate(struct pgstore *s, int *ret_from, int *ret_to)
{
        if (!s || !s->conn)
                return -EINVAL;
        int r = exec_simple(s, "BEGIN");
        if (r < 0)
                return r;
        int cur = 0;
        r = exec_params(s, "SELECT pg_advisory_xact_lock(" MIGRATE_LOCK_KEY ")", 0, NULL, 0,
                        PGRES_TUPLES_OK, NULL);
        if (r < 0)
                goto fail;
        r = exec_simple(s, "CREATE TABLE IF NOT EXISTS kairos_schema_migrations (\n"
                           "  version integer PRIMARY KEY CHECK (version >= 1),\n"
                           "  description text NOT NULL,\n"
                           "  applied_at timestamptz NOT NULL DEFAULT now())");
        if (r < 0)
                goto fail;
        r = read_version(s, &cur);
        if (r < 0)
                goto fail;
        if (cur > PGSCHEMA_VERSION) {
                set_err(s, "the database's kairos schema is at version %d, newer than this "
                        "build's %d: upgrade kairos", cur, PGSCHEMA_VERSION);
                r = -EPROTONOSUPPORT;
                goto fail;
        }
        for (size_t i = 0; i < pgschema_nmigrations; i++) {
                const struct pgschema_migration *m = &pgschema_migrations[i];
                if (m->version <= cur)
                        continue;
                r = exec_simple(s, m->sql);
                if (r < 0) {
                        char msg[sizeof s->err];
                        snprintf(msg, sizeof msg, "%s", s->err);
                        set_err(s, "migration to version %d: %s", m->version, msg);
                        goto fail;
                }
                char v[16];
                snprintf(v, sizeof v, "%d", m->version);
                const char *vals[] = { v, m->description };
                r = exec_params(s, "INSERT INTO kairos_schema_migrations (version, description) "
                                   "VALUES ($1, $2)", 2, vals, 0, PGRES_COMMAND_OK, NULL);
                if (r < 0)
                        goto fail;
        }
        r = exec_simple(s, "COMMIT");
        if (r < 0)
                return r;
        if (ret_from)
                *ret_from = cur;
        if (ret_to)
                *ret_to = cur > PGSCHEMA_VERSION ? cur : PGSCHEMA_VERSION;
        return 0;
fail:
        rollback(s);
        return r;
}

/* ---- lines ---- */

static int put_be32(struct kbuf *b, uint32_t v)
{
        unsigned char p[4] = { (unsigned char)(v >> 24), (unsigned char)(v >> 16),
                               (unsigned char)(v >> 8), (unsigned char)v };
        return kbuf_append(b, p, sizeof p);
}

/* The header of a one-dimensional array without nulls in PostgreSQL's
 * binary format (array_recv): dimensions, flags, element type, then the
 * length and lower bound of the dimension; an empty array has none. */
static int array_header(struct kbuf *b, uint32_t elemtype, size_t n)
{
        int r;
        if ((r = put_be32(b, n ? 1 : 0)) < 0 || (r = put_be32(b, 0)) < 0 ||
            (r = put_be32(b, elemtype)) < 0)
                return r;
        if (n && ((r = put_be32(b, (uint32_t)n)) < 0 || (r = put_be32(b, 1)) < 0))
                return r;
        return 0;
}

#define BYTEA_OID 17
#define INT8_OID 20

/* Check the barrier's bytes (complete sealed records, each ending in '\n')
 * and build the two array parameters, in binary: bytea[] of the lines,
 * bigint[] of their crcs. */
static int build_lines(struct pgstore *s, const char *lines, size_t len, struct kbuf *ret_lines,
                       struct kbuf *ret_crcs, size_t *ret_n)
{
        size_t n = 0;
        int r;
        if (len && lines[len - 1] != '\n') {
                set_err(s, "the last line does not end in a newline");
                return -EBADMSG;
        }
        for (size_t off = 0; off < len; n++)
                off += (size_t)((const char *)memchr(lines + off, '\n', len - off) - (lines + off)) + 1;
        if (n > INT32_MAX || len > INT32_MAX) {
                set_err(s, "a barrier of %zu bytes is too large", len);
                return -EMSGSIZE;
        }
        if ((r = array_header(ret_lines, BYTEA_OID, n)) < 0 ||
            (r = array_header(ret_crcs, INT8_OID, n)) < 0)
                return r;
        size_t i = 0;
        for (size_t off = 0; off < len; i++) {
                const char *l = lines + off;
                const char *nl = memchr(l, '\n', len - off);
                size_t ln = (size_t)(nl - l);
                uint32_t crc;
                if (!crcline_has_suffix(l, ln, &crc) || crcline_body_crc(l, ln) != crc) {
                        set_err(s, "line %zu is not a sealed WAL record (no crc field, or a "
                                "wrong one)", i + 1);
                        return -EBADMSG;
                }
                if ((r = put_be32(ret_lines, (uint32_t)(ln + 1))) < 0 ||
                    (r = kbuf_append(ret_lines, l, ln + 1)) < 0 ||
                    (r = put_be32(ret_crcs, 8)) < 0 || (r = put_be32(ret_crcs, 0)) < 0 ||
                    (r = put_be32(ret_crcs, crc)) < 0)
                        return r;
                off += ln + 1;
        }
        *ret_n = n;
        return 0;
}

/* v as the decimal text of a query parameter, in buf */
static const char *i64(char buf[24], int64_t v)
{
        snprintf(buf, 24, "%" PRId64, v);
        return buf;
}

static char *dup_value(PGresult *res, int row, int col)
{
        if (PQgetisnull(res, row, col))
                return NULL;
        return strdup(PQgetvalue(res, row, col));
}

/* ---- nodes, ticks, mandates, leases ---- */

int pgstore_node_heartbeat(struct pgstore *s, const char *node, int64_t incarnation,
                           int64_t lease_ms)
{
        if (!node || !*node || lease_ms <= 0)
                return -EINVAL;
        char inc[24], lease[24];
        const char *vals[] = { node, i64(inc, incarnation), i64(lease, lease_ms) };
        return exec_params(s, "SELECT kairos_node_heartbeat($1, $2, $3)", 3, vals, 0,
                           PGRES_TUPLES_OK, NULL);
}

int pgstore_node_register(struct pgstore *s, const char *node, int64_t lease_ms,
                          int64_t *ret_incarnation)
{
        if (!node || !*node || lease_ms <= 0 || !ret_incarnation)
                return -EINVAL;
        char lease[24];
        const char *vals[] = { node, i64(lease, lease_ms) };
        PGresult *res;
        int r = exec_params(s, "SELECT kairos_node_register($1, $2)", 2, vals, 0,
                            PGRES_TUPLES_OK, &res);
        if (r < 0)
                return r;
        *ret_incarnation = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
        PQclear(res);
        return 0;
}

static int array_literal(struct kbuf *b, const char *const *items, size_t n);

int pgstore_renew_held(struct pgstore *s, const char *node, int64_t incarnation,
                       const char *const *ids, const int64_t *epochs, size_t n,
                       int64_t lease_ms, bool **ret_renewed)
{
        if (!s || !node || !*node || lease_ms <= 0 || !ret_renewed || (n && (!ids || !epochs)) ||
            n > INT32_MAX)
                return -EINVAL;
        *ret_renewed = NULL;
        for (size_t i = 0; i < n; i++)
                if (!ids[i])
                        return -EINVAL;
        struct kbuf ia = KBUF_INIT, ea = KBUF_INIT;
        bool *renewed = n ? calloc(n, sizeof *renewed) : NULL;
        int r = n && !renewed ? -ENOMEM : array_literal(&ia, ids, n);
        if (r == 0)
                r = kbuf_putc(&ea, '{');
        for (size_t i = 0; r == 0 && i < n; i++)
                r = kbuf_printf(&ea, "%s%" PRId64, i ? "," : "", epochs[i]);
        if (r == 0)
                r = kbuf_putc(&ea, '}');
        if (r < 0)
                goto out;
        char inc[24], lease[24];
        const char *vals[] = { node, i64(inc, incarnation), i64(lease, lease_ms), ia.data,
                               ea.data };
        PGresult *res;
        r = exec_params(s, "SELECT * FROM kairos_renew_held($1, $2, $3, $4::text[], "
                           "$5::bigint[])",
                        5, vals, 0, PGRES_TUPLES_OK, &res);
        if (r < 0)
                goto out;
        for (int row = 0; row < PQntuples(res); row++) {
                long long o = strtoll(PQgetvalue(res, row, 0), NULL, 10);
                if (o >= 1 && (size_t)o <= n)
                        renewed[o - 1] = true;
        }
        PQclear(res);
        *ret_renewed = renewed;
        renewed = NULL;
out:
        free(renewed);
        kbuf_free(&ia);
        kbuf_free(&ea);
        return r;
}

/* A timestamptz column as ms since the epoch, -1 when NULL. */
static int64_t ms_at(PGresult *res, int row, int col)
{
        return PQgetisnull(res, row, col) ? -1 : strtoll(PQgetvalue(res, row, col), NULL, 10);
}

#define MS(col) "(extract(epoch FROM " col ") * 1000)::bigint"

void pgstore_claim_free(struct pgstore_claim *c)
{
        if (!c)
                return;
        FREE_ALL(c->mandate_id, c->claimed_by, c->busy, c->busy_status);
        memset(c, 0, sizeof *c);
}

static int claim_tick(struct pgstore *s, const char *schedule, int64_t fired_at_ms,
                      const char *mandate_id, const char *node, int64_t lease_ms,
                      const char *lines, size_t len, bool reject, struct pgstore_claim *ret)
{
        if (!s || !schedule || !mandate_id || !*mandate_id || !node || !*node ||
            lease_ms <= 0 || (len && !lines) || !ret)
                return -EINVAL;
        memset(ret, 0, sizeof *ret);
        struct kbuf la = KBUF_INIT, ca = KBUF_INIT;
        size_t n;
        int r = build_lines(s, lines, len, &la, &ca, &n);
        if (r < 0)
                goto out;
        char at[24], lease[24];
        const char *vals[] = { schedule, i64(at, fired_at_ms), mandate_id, node,
                               i64(lease, lease_ms), la.data, ca.data };
        const int lens[] = { 0, 0, 0, 0, 0, (int)la.len, (int)ca.len };
        PGresult *res;
        r = exec_prepared(s, reject ? PREP_CLAIM_TICK_REJECT : PREP_CLAIM_TICK, 7, vals, lens,
                          PGRES_TUPLES_OK, &res);
        if (r < 0)
                goto out;
        if (PQntuples(res) != 1) {
                set_err(s, "kairos_claim_tick returned %d rows", PQntuples(res));
                PQclear(res);
                r = -EIO;
                goto out;
        }
        ret->won = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
        ret->rejected = !PQgetisnull(res, 0, 4);
        ret->mandate_id = dup_value(res, 0, 1);
        ret->claimed_by = dup_value(res, 0, 2);
        ret->epoch = PQgetisnull(res, 0, 3) ? 0 : strtoll(PQgetvalue(res, 0, 3), NULL, 10);
        ret->busy = dup_value(res, 0, 4);
        ret->busy_status = dup_value(res, 0, 5);
        PQclear(res);
        if (ret->rejected ? !ret->busy || !ret->busy_status
                          : !ret->mandate_id || !ret->claimed_by) {
                pgstore_claim_free(ret);
                r = -ENOMEM;
        }
out:
        kbuf_free(&la);
        kbuf_free(&ca);
        return r;
}

int pgstore_claim_tick(struct pgstore *s, const char *schedule, int64_t fired_at_ms,
                       const char *mandate_id, const char *node, int64_t lease_ms,
                       const char *lines, size_t len, struct pgstore_claim *ret)
{
        return claim_tick(s, schedule, fired_at_ms, mandate_id, node, lease_ms, lines, len, false,
                          ret);
}

int pgstore_claim_tick_reject(struct pgstore *s, const char *schedule, int64_t fired_at_ms,
                              const char *mandate_id, const char *node, int64_t lease_ms,
                              const char *lines, size_t len, struct pgstore_claim *ret)
{
        return claim_tick(s, schedule, fired_at_ms, mandate_id, node, lease_ms, lines, len, true,
                          ret);
}

int pgstore_slot_take(struct pgstore *s, const char *mandate_id, int64_t epoch,
                      bool *ret_taken, char **ret_holder)
{
        if (!s || !mandate_id || !*mandate_id || epoch < 1 || !ret_taken)
                return -EINVAL;
        *ret_taken = false;
        if (ret_holder)
                *ret_holder = NULL;
        char ep[24];
        const char *vals[] = { mandate_id, i64(ep, epoch) };
        PGresult *res;
        int r = exec_params(s, "SELECT r_taken, r_holder FROM kairos_slot_take($1, $2)", 2, vals,
                            0, PGRES_TUPLES_OK, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) != 1) {
                set_err(s, "kairos_slot_take returned %d rows", PQntuples(res));
                PQclear(res);
                return -EIO;
        }
        *ret_taken = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
        if (ret_holder && !(*ret_holder = dup_value(res, 0, 1)) && !PQgetisnull(res, 0, 1))
                r = -ENOMEM;
        PQclear(res);
        return r;
}

int pgstore_slot_release(struct pgstore *s, const char *mandate_id, int64_t epoch)
{
        if (!s || !mandate_id || !*mandate_id || epoch < 1)
                return -EINVAL;
        char ep[24];
        const char *vals[] = { mandate_id, i64(ep, epoch) };
        return exec_params(s, "SELECT kairos_slot_release($1, $2)", 2, vals, 0, PGRES_TUPLES_OK,
                           NULL);
}

int pgstore_mandate_create(struct pgstore *s, const char *mandate_id, const char *schedule,
                           const char *node, int64_t lease_ms, const char *lines, size_t len)
{
        if (!s || !mandate_id || !*mandate_id || !node || !*node || lease_ms <= 0 ||
            (len && !lines))
                return -EINVAL;
        struct kbuf la = KBUF_INIT, ca = KBUF_INIT;
        size_t n;
        int r = build_lines(s, lines, len, &la, &ca, &n);
        if (r == 0) {
                char lease[24];
                const char *vals[] = { mandate_id, schedule, node, i64(lease, lease_ms), la.data,
                                       ca.data };
                const int lens[] = { 0, 0, 0, 0, (int)la.len, (int)ca.len };
                r = exec_prepared(s, PREP_MANDATE_CREATE, 6, vals, lens, PGRES_TUPLES_OK, NULL);
        }
        kbuf_free(&la);
        kbuf_free(&ca);
        return r;
}

int pgstore_retry_create(struct pgstore *s, const struct pgstore_retry *rt, const char *node,
                         int64_t lease_ms, const char *lines, size_t len, bool *ret_created,
                         char **ret_busy, char **ret_busy_status, char **ret_busy_owner)
{
        if (!s || !rt || !rt->mandate_id || !*rt->mandate_id || !rt->schedule ||
            !rt->retry_of || rt->retry < 1 || !node || !*node || lease_ms <= 0 ||
            (len && !lines) || !ret_created || !ret_busy || !ret_busy_status || !ret_busy_owner)
                return -EINVAL;
        *ret_created = false;
        *ret_busy = *ret_busy_status = *ret_busy_owner = NULL;
        struct kbuf la = KBUF_INIT, ca = KBUF_INIT;
        size_t n;
        PGresult *res = NULL;
        int r = build_lines(s, lines, len, &la, &ca, &n);
        if (r < 0)
                goto out;
        char at[24], num[16], lease[24];
        snprintf(num, sizeof num, "%d", rt->retry);
        const char *vals[] = { rt->mandate_id, rt->schedule, i64(at, rt->fired_at_ms),
                               rt->retry_of, num, rt->forced ? "t" : "f", node,
                               i64(lease, lease_ms), la.data, ca.data };
        const int lens[] = { 0, 0, 0, 0, 0, 0, 0, 0, (int)la.len, (int)ca.len };
        r = exec_prepared(s, PREP_RETRY_CREATE, 10, vals, lens, PGRES_TUPLES_OK, &res);
        if (r < 0)
                goto out;
        if (PQntuples(res) != 1 || PQnfields(res) != 4 || PQgetisnull(res, 0, 1) ||
            PQgetisnull(res, 0, 2)) {
                set_err(s, "kairos_retry_create returned %d rows", PQntuples(res));
                r = -EIO;
                goto out;
        }
        *ret_created = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
        if (!*ret_created) {
                *ret_busy = dup_value(res, 0, 1);
                *ret_busy_status = dup_value(res, 0, 2);
                *ret_busy_owner = PQgetisnull(res, 0, 3) ? strdup("") : dup_value(res, 0, 3);
                if (!*ret_busy || !*ret_busy_status || !*ret_busy_owner) {
                        FREE_ALL(*ret_busy, *ret_busy_status, *ret_busy_owner);
                        *ret_busy = *ret_busy_status = *ret_busy_owner = NULL;
                        r = -ENOMEM;
                }
        }
out:
        PQclear(res);
        kbuf_free(&la);
        kbuf_free(&ca);
        return r;
}

int pgstore_tick_last_retry(struct pgstore *s, const char *schedule, int64_t fired_at_ms,
                            int *ret_retry)
{
        if (!s || !schedule || !ret_retry)
                return -EINVAL;
        *ret_retry = 0;
        char at[24];
        const char *vals[] = { schedule, i64(at, fired_at_ms) };
        PGresult *res;
        int r = exec_params(s, "SELECT coalesce(max(retry), 0) FROM kairos_mandate "
                               "WHERE schedule = $1 AND fired_at = 'epoch'::timestamptz + "
                               "$2::bigint * interval '1 millisecond'",
                            2, vals, 0, PGRES_TUPLES_OK, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) == 1)
                *ret_retry = (int)strtol(PQgetvalue(res, 0, 0), NULL, 10);
        PQclear(res);
        return 0;
}

int pgstore_tick_retries_of(struct pgstore *s, const char *schedule, int64_t fired_at_ms,
                            const char *retry_of, char ***ret_ids, size_t *ret_n)
{
        if (!s || !schedule || !retry_of || !ret_ids || !ret_n)
                return -EINVAL;
        *ret_ids = NULL;
        *ret_n = 0;
        char at[24];
        const char *vals[] = { schedule, i64(at, fired_at_ms), retry_of };
        PGresult *res;
        int r = exec_params(s, "SELECT mandate_id FROM kairos_mandate "
                               "WHERE schedule = $1 AND fired_at = 'epoch'::timestamptz + "
                               "$2::bigint * interval '1 millisecond' AND retry_of = $3 "
                               "ORDER BY retry, mandate_id",
                            3, vals, 0, PGRES_TUPLES_OK, &res);
        if (r < 0)
                return r;
        int n = PQntuples(res);
        char **ids = n ? calloc((size_t)n, sizeof(*ids)) : NULL;
        if (n && !ids) {
                PQclear(res);
                return -ENOMEM;
        }
        for (int i = 0; i < n; i++)
                if (!(ids[i] = strdup(PQgetvalue(res, i, 0)))) {
                        pgstore_strings_free(ids, (size_t)i);
                        PQclear(res);
                        return -ENOMEM;
                }
        PQclear(res);
        *ret_ids = ids;
        *ret_n = (size_t)n;
        return 0;
}

void pgstore_strings_free(char **v, size_t n)
{
        kmem_free_strv(v, n);
}

int pgstore_lease_renew(struct pgstore *s, const char *mandate_id, const char *node,
                        int64_t epoch, int64_t lease_ms)
{
        if (!mandate_id || !node || lease_ms <= 0)
                return -EINVAL;
        char ep[24], lease[24];
        const char *vals[] = { mandate_id, node, i64(ep, epoch), i64(lease, lease_ms) };
        return exec_params(s, "SELECT kairos_lease_renew($1, $2, $3, $4)", 4, vals, 0,
                           PGRES_TUPLES_OK, NULL);
}

void pgstore_takeover_free(struct pgstore_takeover *t)
{
        if (!t)
                return;
        free(t->mandate_id);
        free(t->prev_owner);
        memset(t, 0, sizeof *t);
}

int pgstore_lease_takeover(struct pgstore *s, const char *mandate_id, const char *node,
                           int64_t lease_ms, int64_t grace_ms, struct pgstore_takeover *ret)
{
        if (!node || !*node || lease_ms <= 0 || grace_ms < 0 || !ret)
                return -EINVAL;
        memset(ret, 0, sizeof *ret);
        char lease[24], grace[24];
        const char *vals[] = { mandate_id, node, i64(lease, lease_ms), i64(grace, grace_ms) };
        PGresult *res;
        int r = exec_params(s, "SELECT r_mandate_id, r_epoch, r_prev_owner, r_interrupted FROM "
                               "kairos_lease_takeover($1, $2, $3, $4)",
                            4, vals, 0, PGRES_TUPLES_OK, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) == 0) {
                PQclear(res);
                set_err(s, "no mandate to take over");
                return -EBUSY;
        }
        ret->mandate_id = dup_value(res, 0, 0);
        ret->epoch = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
        ret->prev_owner = dup_value(res, 0, 2);
        ret->interrupted = strtoll(PQgetvalue(res, 0, 3), NULL, 10);
        bool oom = !ret->mandate_id || (!PQgetisnull(res, 0, 2) && !ret->prev_owner);
        PQclear(res);
        if (oom) {
                pgstore_takeover_free(ret);
                return -ENOMEM;
        }
        return 0;
}

int pgstore_mandate_finish(struct pgstore *s, const char *mandate_id, int64_t epoch,
                           const char *status)
{
        if (!mandate_id || !status)
                return -EINVAL;
        char ep[24];
        const char *vals[] = { mandate_id, i64(ep, epoch), status };
        return exec_params(s, "SELECT kairos_mandate_finish($1, $2, $3)", 3, vals, 0,
                           PGRES_TUPLES_OK, NULL);
}

int pgstore_mandate_park(struct pgstore *s, const char *mandate_id, int64_t epoch,
                         const char *paused_as, const char *reason)
{
        if (!mandate_id || !paused_as)
                return -EINVAL;
        char ep[24];
        const char *vals[] = { mandate_id, i64(ep, epoch), paused_as, reason };
        return exec_params(s, "SELECT kairos_mandate_park($1, $2, $3, $4)", 4, vals, 0,
                           PGRES_TUPLES_OK, NULL);
}

int pgstore_mandate_take(struct pgstore *s, const char *mandate_id, const char *node,
                         int64_t lease_ms, int64_t grace_ms, int64_t *ret_epoch,
                         char **ret_prev_owner)
{
        if (!mandate_id || !*mandate_id || !node || !*node || lease_ms <= 0 || grace_ms < 0 ||
            !ret_epoch)
                return -EINVAL;
        if (ret_prev_owner)
                *ret_prev_owner = NULL;
        char lease[24], grace[24];
        const char *vals[] = { mandate_id, node, i64(lease, lease_ms), i64(grace, grace_ms) };
        PGresult *res;
        int r = exec_params(s, "SELECT r_epoch, r_prev_owner FROM "
                               "kairos_mandate_take($1, $2, $3, $4)",
                            4, vals, 0, PGRES_TUPLES_OK, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) != 1) {
                set_err(s, "kairos_mandate_take returned %d rows", PQntuples(res));
                PQclear(res);
                return -EIO;
        }
        *ret_epoch = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
        if (ret_prev_owner && !PQgetisnull(res, 0, 1) &&
            !(*ret_prev_owner = strdup(PQgetvalue(res, 0, 1))))
                r = -ENOMEM;
        PQclear(res);
        return r;
}

void pgstore_mandate_rows_free(struct pgstore_mandate_row *rows, size_t n)
{
        for (size_t i = 0; rows && i < n; i++) {
                FREE_ALL(rows[i].mandate_id, rows[i].schedule, rows[i].fired_at, rows[i].status,
                         rows[i].owner, rows[i].paused_as, rows[i].paused_reason);
        }
        free(rows);
}

/* The WAL's way of writing a tick: whole seconds without a fraction. */
static char *fired_text(int64_t ms)
{
        char ts[32];
        wal_format_ts(ms, ts);
        size_t n = strlen(ts);
        if (ms % 1000 == 0 && n == 24 && strcmp(ts + 19, ".000Z") == 0)
                memcpy(ts + 19, "Z", 2);
        return strdup(ts);
}

int pgstore_mandates_list(struct pgstore *s, const struct pgstore_mandate_filter *f,
                          struct pgstore_mandate_row **ret_rows, size_t *ret_n,
                          size_t *ret_total)
{
        if (!s || !f || !ret_rows || !ret_n)
                return -EINVAL;
        *ret_rows = NULL;
        *ret_n = 0;
        if (ret_total)
                *ret_total = 0;
        char since[24], limit[24];
        snprintf(limit, sizeof limit, "%zu", f->limit);
        const char *vals[] = { f->status, f->schedule,
                               f->since_ms >= 0 ? i64(since, f->since_ms) : NULL, f->after,
                               f->limit ? limit : NULL, f->mandate_id };
        PGresult *res;
        int r = exec_params(
                s,
                "SELECT m.mandate_id, m.schedule, " MS("m.fired_at") ", m.status, m.owner, "
                "m.epoch, CASE WHEN m.status = 'running' AND m.lease_expires_at IS NOT NULL "
                "THEN " MS("(m.lease_expires_at - now())") " END, m.last_seq, "
                MS("m.created_at") ", " MS("m.ended_at") ", count(*) OVER (), "
                "m.status = 'running' AND m.slot_wait_since IS NOT NULL, "
                "m.paused_as, m.paused_reason "
                "FROM kairos_mandate m "
                "WHERE ($1::text IS NULL OR m.status = $1) "
                "AND ($2::text IS NULL OR m.schedule = $2) "
                "AND ($3::bigint IS NULL OR m.fired_at >= 'epoch'::timestamptz + "
                "$3::bigint * interval '1 millisecond') "
                "AND ($4::text IS NULL OR (coalesce(m.fired_at, m.created_at), m.mandate_id) < "
                "(SELECT coalesce(a.fired_at, a.created_at), a.mandate_id FROM kairos_mandate a "
                "WHERE a.mandate_id = $4)) "
                "AND ($6::text IS NULL OR m.mandate_id = $6) "
                "ORDER BY coalesce(m.fired_at, m.created_at) DESC, m.mandate_id DESC "
                "LIMIT $5::bigint",
                6, vals, 0, PGRES_TUPLES_OK, &res);
        if (r < 0)
                return r;
        size_t n = (size_t)PQntuples(res);
        if (n == 0 && f->after) {
                PQclear(res);
                const char *v1[] = { f->after };
                r = exec_params(s, "SELECT 1 FROM kairos_mandate WHERE mandate_id = $1", 1, v1, 0,
                                PGRES_TUPLES_OK, &res);
                if (r < 0)
                        return r;
                if (PQntuples(res) == 0) {
                        PQclear(res);
                        set_err(s, "no mandate %s", f->after);
                        return -ENOENT;
                }
                PQclear(res);
                return 0;
        }
        struct pgstore_mandate_row *rows = n ? calloc(n, sizeof *rows) : NULL;
        if (n && !rows)
                r = -ENOMEM;
        for (size_t i = 0; r == 0 && i < n; i++) {
                int row = (int)i;
                struct pgstore_mandate_row *m = &rows[i];
                m->mandate_id = dup_value(res, row, 0);
                m->schedule = dup_value(res, row, 1);
                m->fired_ms = ms_at(res, row, 2);
                m->status = dup_value(res, row, 3);
                m->owner = dup_value(res, row, 4);
                m->epoch = strtoll(PQgetvalue(res, row, 5), NULL, 10);
                m->leased = !PQgetisnull(res, row, 6);
                m->lease_left_ms = m->leased ? strtoll(PQgetvalue(res, row, 6), NULL, 10) : 0;
                m->last_seq = strtoll(PQgetvalue(res, row, 7), NULL, 10);
                m->created_ms = ms_at(res, row, 8);
                m->ended_ms = ms_at(res, row, 9);
                m->slot_waiting = strcmp(PQgetvalue(res, row, 11), "t") == 0;
                m->paused_as = dup_value(res, row, 12);
                m->paused_reason = dup_value(res, row, 13);
                if ((!m->paused_as && !PQgetisnull(res, row, 12)) ||
                    (!m->paused_reason && !PQgetisnull(res, row, 13)))
                        r = -ENOMEM;
                if (m->fired_ms >= 0 && !(m->fired_at = fired_text(m->fired_ms)))
                        r = -ENOMEM;
                if (!m->mandate_id || !m->status || (!m->schedule && !PQgetisnull(res, row, 1)) ||
                    (!m->owner && !PQgetisnull(res, row, 4)))
                        r = -ENOMEM;
                if (i == 0 && ret_total)
                        *ret_total = (size_t)strtoll(PQgetvalue(res, row, 10), NULL, 10);
        }
        PQclear(res);
        if (r < 0) {
                pgstore_mandate_rows_free(rows, n);
                if (ret_total)
                        *ret_total = 0;
                return r;
        }
        *ret_rows = rows;
        *ret_n = n;
        return 0;
}

/* ---- schedule state ---- */

void pgstore_schedule_free(struct pgstore_schedule *st)
{
        if (!st)
                return;
        free(st->config_hash);
        memset(st, 0, sizeof *st);
}

static int64_t ms_or_none(PGresult *res, int col)
{
        return PQgetisnull(res, 0, col) ? -1 : strtoll(PQgetvalue(res, 0, col), NULL, 10);
}

int pgstore_schedule_get(struct pgstore *s, const char *name, struct pgstore_schedule *ret)
{
        if (!name || !ret)
                return -EINVAL;
        memset(ret, 0, sizeof *ret);
        const char *vals[] = { name };
        PGresult *res;
        int r = exec_params(s, "SELECT config_hash, "
                               "(extract(epoch FROM last_evaluated_at) * 1000)::bigint, "
                               "(extract(epoch FROM next_fire_at) * 1000)::bigint, version "
                               "FROM kairos_schedule WHERE name = $1",
                            1, vals, 0, PGRES_TUPLES_OK, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) == 1) {
                ret->config_hash = dup_value(res, 0, 0);
                ret->last_evaluated_ms = ms_or_none(res, 1);
                ret->next_fire_ms = ms_or_none(res, 2);
                ret->version = strtoll(PQgetvalue(res, 0, 3), NULL, 10);
                if (!ret->config_hash)
                        r = -ENOMEM;
        } else {
                ret->last_evaluated_ms = ret->next_fire_ms = -1;
        }
        PQclear(res);
        return r;
}

int pgstore_schedule_advance(struct pgstore *s, const char *name, const char *config_hash,
                             int64_t version, int64_t last_evaluated_ms, int64_t next_fire_ms,
                             int64_t *ret_version)
{
        if (!name || !config_hash || version < 0 || last_evaluated_ms < 0)
                return -EINVAL;
        char v[24], le[24], nf[24];
        const char *vals[] = { name, config_hash, i64(v, version), i64(le, last_evaluated_ms),
                               next_fire_ms < 0 ? NULL : i64(nf, next_fire_ms) };
        PGresult *res;
        int r = exec_params(s, "SELECT kairos_schedule_advance($1, $2, $3, "
                               "'epoch'::timestamptz + $4::bigint * interval '1 millisecond', "
                               "'epoch'::timestamptz + $5::bigint * interval '1 millisecond')",
                            5, vals, 0, PGRES_TUPLES_OK, &res);
        if (r < 0)
                return r;
        if (ret_version)
                *ret_version = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
        PQclear(res);
        return 0;
}

/* ---- WAL rows ---- */

int pgstore_wal_append(struct pgstore *s, const char *mandate_id, int64_t epoch,
                       int64_t first_seq, const char *lines, size_t len,
                       int64_t *ret_last_seq)
{
        if (!s || !mandate_id || !lines || len == 0 || first_seq < 0)
                return -EINVAL;
        struct kbuf la = KBUF_INIT, ca = KBUF_INIT;
        size_t n;
        int r = build_lines(s, lines, len, &la, &ca, &n);
        if (r < 0)
                goto out;
        char ep[24], first[24];
        const char *vals[] = { mandate_id, i64(ep, epoch),
                               first_seq ? i64(first, first_seq) : NULL, la.data, ca.data };
        const int lens[] = { 0, 0, 0, (int)la.len, (int)ca.len };
        PGresult *res;
        r = exec_prepared(s, PREP_WAL_APPEND, 5, vals, lens, PGRES_TUPLES_OK, &res);
        if (r < 0)
                goto out;
        if (ret_last_seq)
                *ret_last_seq = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
        PQclear(res);
out:
        kbuf_free(&la);
        kbuf_free(&ca);
        return r;
}

static int64_t be64(const char *p)
{
        uint64_t v = 0;
        for (int i = 0; i < 8; i++)
                v = (v << 8) | (unsigned char)p[i];
        return (int64_t)v;
}

int pgstore_wal_read(struct pgstore *s, const char *mandate_id, struct kbuf *out,
                     int64_t *ret_nrows)
{
        if (!mandate_id || !out)
                return -EINVAL;
        const char *vals[] = { mandate_id };
        PGresult *res;
        /* binary results: the line's bytes as they are, seq as 8 bytes */
        int r = exec_params(s, "SELECT seq, line FROM kairos_wal WHERE mandate_id = $1 "
                               "ORDER BY seq", 1, vals, 1, PGRES_TUPLES_OK, &res);
        if (r < 0)
                return r;
        int n = PQntuples(res);
        for (int i = 0; i < n; i++) {
                if (PQgetlength(res, i, 0) != 8 || be64(PQgetvalue(res, i, 0)) != i + 1) {
                        set_err(s, "mandate %s: row %d does not have seq %d", mandate_id,
                                i + 1, i + 1);
                        r = -EIO;
                        break;
                }
                r = kbuf_append(out, PQgetvalue(res, i, 1), (size_t)PQgetlength(res, i, 1));
                if (r < 0)
                        break;
        }
        PQclear(res);
        if (r == 0 && ret_nrows)
                *ret_nrows = n;
        return r;
}

void pgstore_wal_rows_free(struct pgstore_wal_row *rows, size_t n)
{
        for (size_t i = 0; rows && i < n; i++)
                free(rows[i].line);
        free(rows);
}

int pgstore_wal_rows(struct pgstore *s, const char *mandate_id, struct pgstore_wal_row **ret_rows,
                     size_t *ret_n)
{
        if (!mandate_id || !ret_rows || !ret_n)
                return -EINVAL;
        const char *vals[] = { mandate_id };
        PGresult *res;
        /* binary results: the integers as 8 bytes, the line's bytes as they are */
        int r = exec_params(s, "SELECT seq, epoch, coalesce(crc, -1), line FROM kairos_wal "
                               "WHERE mandate_id = $1 ORDER BY seq", 1, vals, 1,
                            PGRES_TUPLES_OK, &res);
        if (r < 0)
                return r;
        size_t n = (size_t)PQntuples(res);
        struct pgstore_wal_row *rows = n ? calloc(n, sizeof *rows) : NULL;
        if (n && !rows)
                r = -ENOMEM;
        for (size_t i = 0; r == 0 && i < n; i++) {
                int row = (int)i;
                if (PQgetlength(res, row, 0) != 8 || PQgetlength(res, row, 1) != 8 ||
                    PQgetlength(res, row, 2) != 8) {
                        set_err(s, "mandate %s: unexpected column sizes", mandate_id);
                        r = -EIO;
                        break;
                }
                rows[i].seq = be64(PQgetvalue(res, row, 0));
                rows[i].epoch = be64(PQgetvalue(res, row, 1));
                rows[i].crc = be64(PQgetvalue(res, row, 2));
                rows[i].len = (size_t)PQgetlength(res, row, 3);
                rows[i].line = malloc(rows[i].len + 1);
                if (!rows[i].line) {
                        r = -ENOMEM;
                        break;
                }
                memcpy(rows[i].line, PQgetvalue(res, row, 3), rows[i].len);
                rows[i].line[rows[i].len] = '\0';
        }
        PQclear(res);
        if (r < 0) {
                pgstore_wal_rows_free(rows, n);
                return r;
        }
        *ret_rows = rows;
        *ret_n = n;
        return 0;
}

int pgstore_wal_last_seq(struct pgstore *s, const char *mandate_id, int64_t *ret_last_seq,
                         int64_t *ret_epoch)
{
        if (!mandate_id)
                return -EINVAL;
        const char *vals[] = { mandate_id };
        PGresult *res;
        int r = exec_params(s, "SELECT last_seq, epoch FROM kairos_mandate WHERE mandate_id = $1",
                            1, vals, 0, PGRES_TUPLES_OK, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) != 1) {
                PQclear(res);
                set_err(s, "no mandate %s", mandate_id);
                return -ENOENT;
        }
        if (ret_last_seq)
                *ret_last_seq = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
        if (ret_epoch)
                *ret_epoch = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
        PQclear(res);
        return 0;
}

/* ---- tool calls ---- */

void pgstore_idem_claim_free(struct pgstore_idem_claim *c)
{
        if (!c)
                return;
        free(c->result);
        free(c->fingerprint);
        memset(c, 0, sizeof *c);
}

int pgstore_idem_claim(struct pgstore *s, const char *key, const char *tool,
                       const char *fingerprint, const char *mandate_id, int64_t epoch,
                       const char *node, const char *step_id, uint32_t attempt,
                       int64_t ttl_ms, struct pgstore_idem_claim *ret)
{
        if (!key || !tool || !fingerprint || !mandate_id || !node || ttl_ms <= 0 || !ret ||
            attempt > INT32_MAX)
                return -EINVAL;
        memset(ret, 0, sizeof *ret);
        char ep[24], ttl[24], att[16];
        snprintf(att, sizeof att, "%" PRIu32, attempt);
        const char *vals[] = { key, tool, fingerprint, mandate_id, i64(ep, epoch), node, step_id,
                               step_id ? att : NULL, i64(ttl, ttl_ms) };
        PGresult *res;
        /* binary results: the cached result's bytes as stored */
        int r = exec_params(s, "SELECT r_outcome, r_state, r_result, r_fingerprint, "
                               "r_created_ms, r_updated_ms FROM "
                               "kairos_idem_claim($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                            9, vals, 1, PGRES_TUPLES_OK, &res);
        if (r < 0)
                return r;
        static const struct { const char *name; enum pgstore_idem_outcome o; } outcomes[] = {
                { "claimed", PGSTORE_IDEM_CLAIMED }, { "in_progress", PGSTORE_IDEM_IN_PROGRESS },
                { "interrupted", PGSTORE_IDEM_INTERRUPTED }, { "mismatch", PGSTORE_IDEM_MISMATCH },
                { "cached", PGSTORE_IDEM_CACHED },
        };
        r = -EIO;
        set_err(s, "kairos_idem_claim: unexpected answer");
        if (PQntuples(res) == 1) {
                const char *o = PQgetvalue(res, 0, 0);
                for (size_t i = 0; i < sizeof outcomes / sizeof outcomes[0]; i++)
                        if (strcmp(o, outcomes[i].name) == 0) {
                                ret->outcome = outcomes[i].o;
                                r = 0;
                        }
        }
        /* binary: the times as 8 bytes */
        if (r == 0 && (PQgetlength(res, 0, 4) != 8 || PQgetlength(res, 0, 5) != 8))
                r = -EIO;
        if (r == 0) {
                ret->created_ms = be64(PQgetvalue(res, 0, 4));
                ret->updated_ms = be64(PQgetvalue(res, 0, 5));
                if (!(ret->fingerprint = dup_value(res, 0, 3)))
                        r = -ENOMEM;
        }
        if (r == 0 && ret->outcome == PGSTORE_IDEM_CACHED) {
                ret->failed = strcmp(PQgetvalue(res, 0, 1), "failed") == 0;
                if (!PQgetisnull(res, 0, 2)) {
                        size_t n = (size_t)PQgetlength(res, 0, 2);
                        ret->result = malloc(n + 1);
                        if (!ret->result) {
                                r = -ENOMEM;
                        } else {
                                memcpy(ret->result, PQgetvalue(res, 0, 2), n);
                                ret->result[n] = '\0';
                                ret->result_len = n;
                        }
                }
        }
        PQclear(res);
        if (r == 0)
                s->err[0] = '\0';
        else
                pgstore_idem_claim_free(ret);
        return r;
}

int pgstore_idem_finish(struct pgstore *s, const char *key, const char *mandate_id,
                        int64_t epoch, bool failed, const char *result, size_t result_len)
{
        if (!s || !key || !mandate_id || (result_len && !result) || result_len > INT32_MAX)
                return -EINVAL;
        char ep[24];
        const char *vals[] = { key, mandate_id, i64(ep, epoch), failed ? "failed" : "completed",
                               result };
        const int lens[] = { 0, 0, 0, 0, (int)result_len };
        const int formats[] = { 0, 0, 0, 0, 1 };   /* the result as raw bytes */
        PGresult *res = PQexecParams(s->conn, "SELECT kairos_idem_finish($1, $2, $3, $4, "
                                              "$5::bytea)",
                                     5, NULL, vals, lens, formats, 0);
        int r = check(s, res, PGRES_TUPLES_OK);
        if (r == 0)
                PQclear(res);
        return r;
}

int pgstore_idem_release(struct pgstore *s, const char *key, const char *mandate_id,
                         int64_t epoch, bool drop)
{
        if (!key || !mandate_id)
                return -EINVAL;
        char ep[24];
        const char *vals[] = { key, mandate_id, i64(ep, epoch), drop ? "t" : "f" };
        return exec_params(s, "SELECT kairos_idem_release($1, $2, $3, $4)", 4, vals, 0,
                           PGRES_TUPLES_OK, NULL);
}

/* ---- the leases of the mandates a node holds, renewed together ---- */

/* A text[] or bigint[] literal: {"a","b"} (elements quoted and escaped). */
static int array_literal(struct kbuf *b, const char *const *items, size_t n)
{
        if (kbuf_putc(b, '{') < 0)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                if ((i && kbuf_putc(b, ',') < 0) || kbuf_putc(b, '"') < 0)
                        return -ENOMEM;
                for (const char *p = items[i]; *p; p++) {
                        if ((*p == '"' || *p == '\\') && kbuf_putc(b, '\\') < 0)
                                return -ENOMEM;
                        if (kbuf_putc(b, *p) < 0)
                                return -ENOMEM;
                }
                if (kbuf_putc(b, '"') < 0)
                        return -ENOMEM;
        }
        return kbuf_putc(b, '}') < 0 ? -ENOMEM : 0;
}

int pgstore_lease_release_many(struct pgstore *s, const char *node, const char *const *ids,
                               const int64_t *epochs, size_t n, int64_t grace_ms)
{
        if (!s || !node || !*node || grace_ms < 0 || (n && (!ids || !epochs)))
                return -EINVAL;
        if (n == 0)
                return 0;
        struct kbuf idl = KBUF_INIT, epl = KBUF_INIT;
        int r = array_literal(&idl, ids, n);
        if (r == 0 && kbuf_putc(&epl, '{') < 0)
                r = -ENOMEM;
        for (size_t i = 0; r == 0 && i < n; i++)
                if (kbuf_printf(&epl, "%s%" PRId64, i ? "," : "", epochs[i]) < 0)
                        r = -ENOMEM;
        if (r == 0 && kbuf_putc(&epl, '}') < 0)
                r = -ENOMEM;
        char grace[24];
        if (r == 0) {
                const char *vals[] = { idl.data, epl.data, i64(grace, grace_ms + 1), node };
                r = exec_params(s,
                                "UPDATE kairos_mandate m SET lease_expires_at = now() - "
                                "$3::bigint * interval '1 millisecond' "
                                "FROM unnest($1::text[], $2::bigint[]) AS u(id, ep) "
                                "WHERE m.mandate_id = u.id AND m.epoch = u.ep AND m.owner = $4 "
                                "AND m.status = 'running'",
                                4, vals, 0, PGRES_COMMAND_OK, NULL);
        }
        kbuf_free(&idl);
        kbuf_free(&epl);
        return r;
}

void pgstore_node_rows_free(struct pgstore_node_row *rows, size_t n)
{
        for (size_t i = 0; rows && i < n; i++)
                free(rows[i].node);
        free(rows);
}

int pgstore_node_rows(struct pgstore *s, struct pgstore_node_row **ret_rows, size_t *ret_n)
{
        if (!ret_rows || !ret_n)
                return -EINVAL;
        *ret_rows = NULL;
        *ret_n = 0;
        PGresult *res;
        int r = exec_params(s,
                            "SELECT n.node, n.incarnation, "
                            "(extract(epoch FROM n.expires_at - now()) * 1000)::bigint, "
                            "(SELECT count(*) FROM kairos_mandate m WHERE m.owner = n.node "
                            "AND m.status = 'running'), "
                            "(SELECT count(*) FROM kairos_mandate m WHERE m.owner = n.node "
                            "AND m.status = 'paused' AND m.paused_as = 'paused_review') "
                            "FROM kairos_node n ORDER BY n.node",
                            0, NULL, 0, PGRES_TUPLES_OK, &res);
        if (r < 0)
                return r;
        int rows = PQntuples(res);
        struct pgstore_node_row *out = rows ? calloc((size_t)rows, sizeof(*out)) : NULL;
        if (rows && !out) {
                PQclear(res);
                return -ENOMEM;
        }
        for (int i = 0; i < rows; i++) {
                out[i].node = strdup(PQgetvalue(res, i, 0));
                out[i].incarnation = strtoll(PQgetvalue(res, i, 1), NULL, 10);
                out[i].expires_in_ms = strtoll(PQgetvalue(res, i, 2), NULL, 10);
                out[i].held = strtoll(PQgetvalue(res, i, 3), NULL, 10);
                out[i].reviews = strtoll(PQgetvalue(res, i, 4), NULL, 10);
                if (!out[i].node) {
                        pgstore_node_rows_free(out, (size_t)i);
                        PQclear(res);
                        return -ENOMEM;
                }
        }
        PQclear(res);
        *ret_rows = out;
        *ret_n = (size_t)rows;
        return 0;
}

void pgstore_idem_rows_free(struct pgstore_idem_row *rows, size_t n)
{
        for (size_t i = 0; rows && i < n; i++) {
                FREE_ALL(rows[i].key, rows[i].tool, rows[i].step_id, rows[i].state, rows[i].owner);
        }
        free(rows);
}

int pgstore_idem_of_mandate(struct pgstore *s, const char *mandate_id,
                            struct pgstore_idem_row **ret_rows, size_t *ret_n)
{
        if (!mandate_id || !ret_rows || !ret_n)
                return -EINVAL;
        *ret_rows = NULL;
        *ret_n = 0;
        const char *vals[] = { mandate_id };
        PGresult *res;
        int r = exec_params(s, "SELECT key, tool, step_id, coalesce(attempt, 0), state, owner, "
                               "epoch, " MS("created_at") ", " MS("updated_at") " "
                               "FROM kairos_idem WHERE mandate_id = $1 "
                               "ORDER BY step_id NULLS LAST, created_at, key",
                            1, vals, 0, PGRES_TUPLES_OK, &res);
        if (r < 0)
                return r;
        size_t n = (size_t)PQntuples(res);
        struct pgstore_idem_row *rows = n ? calloc(n, sizeof *rows) : NULL;
        if (n && !rows)
                r = -ENOMEM;
        for (size_t i = 0; r == 0 && i < n; i++) {
                int row = (int)i;
                struct pgstore_idem_row *e = &rows[i];
                e->key = dup_value(res, row, 0);
                e->tool = dup_value(res, row, 1);
                e->step_id = dup_value(res, row, 2);
                e->attempt = (uint32_t)strtoul(PQgetvalue(res, row, 3), NULL, 10);
                e->state = dup_value(res, row, 4);
                e->owner = dup_value(res, row, 5);
                e->epoch = strtoll(PQgetvalue(res, row, 6), NULL, 10);
                e->created_ms = ms_at(res, row, 7);
                e->updated_ms = ms_at(res, row, 8);
                if (!e->key || !e->tool || !e->state || !e->owner ||
                    (!e->step_id && !PQgetisnull(res, row, 2)))
                        r = -ENOMEM;
        }
        PQclear(res);
        if (r < 0) {
                pgstore_idem_rows_free(rows, n);
                return r;
        }
        *ret_rows = rows;
        *ret_n = n;
        return 0;
}

int pgstore_idem_settle_step(struct pgstore *s, const char *mandate_id, const char *step_id,
                             const char *node, int64_t epoch, const char *result,
                             size_t result_len, int64_t ttl_ms, char **ret_keys)
{
        if (!s || !s->conn || !mandate_id || !step_id || !node || !ret_keys ||
            result_len > INT32_MAX || ttl_ms < 0)
                return -EINVAL;
        *ret_keys = NULL;
        char ep[24], ttl[24];
        snprintf(ep, sizeof ep, "%" PRId64, epoch);
        snprintf(ttl, sizeof ttl, "%" PRId64, ttl_ms);
        const char *vals[] = { mandate_id, step_id, node, ep, result ? result : "", ttl };
        const int lens[] = { 0, 0, 0, 0, (int)result_len, 0 };
        const int formats[] = { 0, 0, 0, 0, 1, 0 };
        /* the mandate row locked and checked, then the calls changed: one
         * statement, so all of them or none */
        const char *sql =
                result ? "WITH m AS (SELECT 1 FROM kairos_mandate WHERE mandate_id = $1 "
                         "AND owner = $3 AND epoch = $4::bigint FOR UPDATE), "
                         "c AS (UPDATE kairos_idem SET state = 'completed', result = $5::bytea, "
                         "updated_at = now(), expires_at = now() + $6::bigint * "
                         "interval '1 millisecond' WHERE mandate_id = $1 AND step_id = $2 "
                         "AND state = 'interrupted' AND EXISTS (SELECT 1 FROM m) RETURNING key) "
                         "SELECT (SELECT count(*) FROM m), "
                         "coalesce((SELECT string_agg(key, E'\\n' ORDER BY key) FROM c), '')"
                       : "WITH m AS (SELECT 1 FROM kairos_mandate WHERE mandate_id = $1 "
                         "AND owner = $3 AND epoch = $4::bigint FOR UPDATE), "
                         "c AS (DELETE FROM kairos_idem WHERE mandate_id = $1 AND step_id = $2 "
                         "AND state = 'interrupted' AND EXISTS (SELECT 1 FROM m) "
                         "AND $5::bytea IS NOT NULL AND $6::bigint >= 0 RETURNING key) "
                         "SELECT (SELECT count(*) FROM m), "
                         "coalesce((SELECT string_agg(key, E'\\n' ORDER BY key) FROM c), '')";
        PGresult *res = PQexecParams(s->conn, sql, 6, NULL, vals, lens, formats, 0);
        int r = check(s, res, PGRES_TUPLES_OK);
        if (r < 0)
                return r;
        if (PQntuples(res) != 1 || strcmp(PQgetvalue(res, 0, 0), "1") != 0)
                r = -ESTALE;
        else if (!(*ret_keys = strdup(PQgetvalue(res, 0, 1))))
                r = -ENOMEM;
        PQclear(res);
        return r;
}

int pgstore_idem_evidence(const char *mandate_id, const struct pgstore_idem_row *rows, size_t n,
                          struct evidence_index **ret_ix)
{
        if (!ret_ix)
                return -EINVAL;
        *ret_ix = NULL;
        if (!mandate_id || (n && !rows))
                return -EINVAL;
        static const struct { const char *name; enum idem_state st; } states[] = {
                { "processing", IDEM_ST_PROCESSING }, { "completed", IDEM_ST_COMPLETED },
                { "failed", IDEM_ST_FAILED }, { "interrupted", IDEM_ST_INTERRUPTED },
        };
        struct evidence_call *calls = n ? calloc(n, sizeof *calls) : NULL;
        if (n && !calls)
                return -ENOMEM;
        size_t k = 0;
        int r = 0;
        for (size_t i = 0; i < n; i++) {
                const struct pgstore_idem_row *e = &rows[i];
                if (!e->key || !e->tool || !e->state) {
                        r = -EINVAL;
                        break;
                }
                if (!e->step_id)
                        continue;
                size_t j = 0;
                while (j < sizeof states / sizeof states[0] && strcmp(e->state, states[j].name))
                        j++;
                if (j == sizeof states / sizeof states[0]) {
                        r = -EBADMSG;
                        break;
                }
                bool done = states[j].st == IDEM_ST_COMPLETED || states[j].st == IDEM_ST_FAILED;
                calls[k++] = (struct evidence_call){
                        .key = e->key, .tool = e->tool, .step = e->step_id,
                        .attempt = e->attempt, .state = states[j].st,
                        .created_ms = e->created_ms,
                        .finished_ms = done && e->updated_ms > 0 ? e->updated_ms : 0,
                };
        }
        if (r == 0)
                r = evidence_index_from_calls(mandate_id, calls, k, ret_ix);
        free(calls);
        return r;
}

int pgstore_ping(struct pgstore *s)
{
        if (!s || !s->conn)
                return -EINVAL;
        int r = exec_params(s, "SELECT 1", 0, NULL, 0, PGRES_TUPLES_OK, NULL);
        if (r == -ENOTCONN)
                r = pgstore_reset(s);
        return r;
}

int pgstore_commit_settings(struct pgstore *s, char **ret_standby_names,
                            char **ret_synchronous_commit)
{
        if (!s || !s->conn || !ret_standby_names || !ret_synchronous_commit)
                return -EINVAL;
        PGresult *res;
        char *names = NULL, *commit = NULL;
        int r = exec_params(s, "SELECT current_setting('synchronous_standby_names'), "
                               "current_setting('synchronous_commit')",
                            0, NULL, 0, PGRES_TUPLES_OK, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) != 1 || PQnfields(res) != 2) {
                set_err(s, "SELECT current_setting(...) returned %d rows", PQntuples(res));
                r = -EIO;
                goto out;
        }
        names = strdup(PQgetvalue(res, 0, 0));
        commit = strdup(PQgetvalue(res, 0, 1));
        if (!names || !commit) {
                r = -ENOMEM;
                goto out;
        }
        *ret_standby_names = names;
        *ret_synchronous_commit = commit;
        names = commit = NULL;
out:
        free(names);
        free(commit);
        PQclear(res);
        return r;
}

int pgstore_db_now(struct pgstore *s, int64_t *ret_ms)
{
        if (!s || !s->conn || !ret_ms)
                return -EINVAL;
        PGresult *res;
        /* clock_timestamp(): the time of this statement, not of its
         * transaction; whole milliseconds rounded down (a cast rounds to
         * the nearest: a tick waited for until it is due by this clock was
         * claimed up to half a millisecond early) */
        int r = exec_params(s,
                            "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint",
                            0, NULL, 0, PGRES_TUPLES_OK, &res);
        if (r < 0)
                return r;
        if (PQntuples(res) != 1) {
                set_err(s, "SELECT clock_timestamp() returned %d rows", PQntuples(res));
                PQclear(res);
                return -EIO;
        }
        *ret_ms = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
        PQclear(res);
        return 0;
}
