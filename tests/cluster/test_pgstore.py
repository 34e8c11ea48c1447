#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Cluster mode's PostgreSQL store against a real, private PostgreSQL
(pg_fixture.py: initdb + pg_ctl in a temporary directory, Unix socket only).

- test_pgstore (the C program, cmocka): concurrent tick claims from 8
  connections have exactly one winner; a lease taken over after it ended
  (by the database's clock) bumps the epoch, and the old owner's appends,
  renewals and tool-call claims are refused inside the database with
  nothing written; 8 nodes sweeping for expired mandates take each exactly
  once; WAL rows read back byte-identical to the file WAL; a
  repeated append is idempotent; a lost connection reports an unknown
  outcome; a row lock held elsewhere fails a call after lock_timeout
  instead of blocking it; an append whose commit answer is lost (pg_proxy.py)
  is found committed and its repeat is a no-op; the schedule state's compare-and-set has one winner; and what
  these tests leave in the tables obeys pg_checks.py's invariants; a
  mandate's rows written out are a WAL file that `kairosctl wal verify` and
  `recover --dry-run` read unchanged.
- kairosd --init-db: creates the schema, is idempotent and versioned
  (kairos_schema_migrations), several at once apply it once, a newer schema
  or an unreachable database is an error.

Environment: KAIROSD, KAIROS_PGSTORE_TEST (the C program; empty when built
without -Dpostgres=enabled).  Exit 77 (skipped, with the reason) without the
PostgreSQL server binaries or without PostgreSQL support in the build.
"""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import sys
import unittest
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pg_checks  # noqa: E402
import pg_fixture  # noqa: E402
import pg_proxy  # noqa: E402

KAIROSD = os.environ.get("KAIROSD", "kairosd")
KAIROSCTL = os.environ.get("KAIROSCTL", "kairosctl")
PGSTORE_TEST = os.environ.get("KAIROS_PGSTORE_TEST", "")
# the schema version this build creates (src/cluster/pgschema.h)
VERSION = 7
SKIP = 77

PG = None


def init_db(conninfo, *extra):
    return subprocess.run([KAIROSD, "--init-db", conninfo, *extra], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=120)


class InitDb(unittest.TestCase):
    def test_create_then_up_to_date(self):
        ci = PG.createdb("initdb_once")
        r = init_db(ci)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, f"kairos schema: created at version {VERSION}\n")
        rows = PG.psql("initdb_once", "SELECT version FROM kairos_schema_migrations ORDER BY 1")
        self.assertEqual(rows, [[str(v)] for v in range(1, VERSION + 1)])
        tables = PG.psql("initdb_once", "SELECT tablename FROM pg_tables WHERE tablename "
                         "LIKE 'kairos\\_%' ORDER BY 1")
        self.assertEqual([t[0] for t in tables],
                         ["kairos_idem", "kairos_mandate", "kairos_node", "kairos_schedule",
                          "kairos_schema_migrations", "kairos_slot", "kairos_tick",
                          "kairos_tick_rejected", "kairos_wal"])
        for _ in range(2):
            r = init_db(ci)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout, f"kairos schema: up to date at version {VERSION}\n")
        rows = PG.psql("initdb_once", "SELECT version, applied_at FROM kairos_schema_migrations")
        self.assertEqual(len(rows), VERSION)

    def test_concurrent_runs_apply_once(self):
        ci = PG.createdb("initdb_race")
        with ThreadPoolExecutor(6) as ex:
            results = list(ex.map(lambda _: init_db(ci), range(6)))
        for r in results:
            self.assertEqual(r.returncode, 0, r.stderr)
        outs = sorted(r.stdout for r in results)
        self.assertEqual(outs.count(f"kairos schema: created at version {VERSION}\n"), 1, outs)
        self.assertEqual(outs.count(f"kairos schema: up to date at version {VERSION}\n"), 5, outs)
        self.assertEqual(PG.psql("initdb_race", "SELECT count(*) FROM kairos_schema_migrations"),
                         [[str(VERSION)]])

    def test_newer_schema_refused(self):
        ci = PG.createdb("initdb_newer")
        self.assertEqual(init_db(ci).returncode, 0)
        PG.psql("initdb_newer", "INSERT INTO kairos_schema_migrations (version, description) "
                "VALUES (99, 'from the future')")
        r = init_db(ci)
        self.assertEqual(r.returncode, 1)
        self.assertIn(f"version 99, newer than this build's {VERSION}", r.stderr)

    def test_unreachable(self):
        r = init_db(f"host={PG.dir} port=1 user=kairos dbname=postgres connect_timeout=5")
        self.assertEqual(r.returncode, 1)
        self.assertIn("cannot connect", r.stderr)

    def test_goes_alone(self):
        r = init_db(PG.conninfo(), "--check-config")
        self.assertEqual(r.returncode, 64)
        self.assertIn("--init-db goes alone", r.stderr)


class Claims(unittest.TestCase):
    def test_concurrent_claims_of_one_tick(self):
        """Three sessions claim the same 600 ticks at once (the mandate id
        is the tick's, as the daemon makes it): every tick has one winner,
        and no claim fails (a concurrent insert of the same mandate id once
        raised a unique violation instead of losing)."""
        ci = PG.createdb("claims")
        self.assertEqual(init_db(ci).returncode, 0)
        psql = shutil.which("psql") or os.path.join(PG.bindir, "psql")
        n = 600
        script = "".join(
            f"SELECT r_won FROM kairos_claim_tick('s', 'epoch'::timestamptz + {60 * i} * "
            f"interval '1 second', 'm{i}', '{{node}}', 10000, NULL, NULL);\n"
            for i in range(n))

        def claim(node):
            return subprocess.run([psql, "-X", "-q", "-A", "-t", "-d", ci],
                                  input=script.replace("{node}", node), capture_output=True,
                                  text=True, timeout=240)
        with ThreadPoolExecutor(3) as ex:
            results = list(ex.map(claim, ["n1", "n2", "n3"]))
        for r in results:
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertNotIn("ERROR", r.stderr)
        won = sum(r.stdout.split().count("t") for r in results)
        self.assertEqual(won, n)
        self.assertEqual(PG.psql("claims", "SELECT count(*), count(DISTINCT mandate_id) FROM "
                                 "kairos_tick"), [[str(n), str(n)]])


class Store(unittest.TestCase):
    def rows_are_a_wal_file(self):
        """The rows of a mandate, written out, are a WAL file the existing
        tools read unchanged: wal verify finds it clean, recover --dry-run
        folds it and decides."""
        data = rows_file("pgstore", "m-bytes")
        self.assertGreater(data.count(b"\n"), 5)
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "wal"))
            path = os.path.join(d, "wal", "m-bytes.wal.jsonl")
            with open(path, "wb") as f:
                f.write(data)
            r = subprocess.run([KAIROSCTL, "wal", "verify", path], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stdout)
            # one flipped byte in the rows' bytes is caught as corruption
            bad = bytearray(data)
            bad[data.index(b"observe_001")] ^= 1
            badpath = os.path.join(d, "bad.wal.jsonl")
            with open(badpath, "wb") as f:
                f.write(bad)
            r = subprocess.run([KAIROSCTL, "wal", "verify", badpath], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=60)
            self.assertEqual(r.returncode, 2, r.stdout)
            os.unlink(badpath)
            # the first barrier alone (mandate, plan_commit, append, executing):
            # recovery folds the rows and finds the interrupted step
            with open(path, "wb") as f:
                f.write(rows_file("pgstore", "m-bytes", upto=4))
            r = subprocess.run([KAIROSCTL, "--json", "recover", "--dry-run", "--state-dir", d],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            files = json.loads(r.stdout)["files"]
            self.assertEqual(len(files), 1, r.stdout)
            self.assertEqual(files[0]["status"], "clean", r.stdout)
            self.assertIn('"observe_001"', json.dumps(files[0]["plans"]), r.stdout)

    def test_pgstore_program(self):
        ci = PG.createdb("pgstore")
        # the append's own bytes (its parameters: the statement itself is
        # prepared in an earlier message, which must pass)
        with pg_proxy.ReplyDropper(PG.dir, pg_fixture.PORT,
                                   b'"status":"executing"') as px:
            env = dict(os.environ, KAIROS_PG_CONNINFO=ci,
                       KAIROS_PG_PROXY_CONNINFO=px.conninfo("pgstore"))
            r = subprocess.run([PGSTORE_TEST], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=240)
            dropped = px.dropped
        sys.stderr.write(r.stdout)
        self.assertEqual(r.returncode, 0, "test_pgstore failed (output above)")
        self.assertIn("[  PASSED  ] 25 test(s).", r.stdout)
        self.assertNotIn("SKIPPED", r.stdout)
        self.assertEqual(dropped, 1, "the proxy did not swallow the append's answer")
        # what the store's tests left behind obeys the invariants
        self.assertEqual(pg_checks.check(PG, "pgstore"), [])
        self.rows_are_a_wal_file()
        # and the checker sees a violation when there is one (written past
        # the fence trigger, which only the owner of the database can do)
        PG.psql("pgstore", "ALTER TABLE kairos_wal DISABLE TRIGGER kairos_wal_fence; "
                "INSERT INTO kairos_wal (mandate_id, seq, epoch, line, crc) "
                "SELECT mandate_id, last_seq + 1, epoch - 1, '\\x7b7d0a', NULL "
                "FROM kairos_mandate WHERE mandate_id = 'm-race'")
        bad = pg_checks.check(PG, "pgstore")
        self.assertTrue(any(b.startswith("along seq, epochs never go back") for b in bad), bad)
        self.assertTrue(any(b.startswith("a mandate's rows are numbered") for b in bad), bad)
        self.assertTrue(any(b.startswith("every row ends in a newline and carries") for b in bad),
                        bad)


def rows_file(db, mandate, upto=None):
    """A mandate's rows (up to seq upto), concatenated in seq order, as bytes."""
    limit = f" AND seq <= {int(upto)}" if upto else ""
    rows = PG.psql(db, "SELECT encode(line, 'hex') FROM kairos_wal "
                   f"WHERE mandate_id = '{mandate}'{limit} ORDER BY seq")
    return b"".join(bytes.fromhex(r[0]) for r in rows)


def main():
    global PG
    if not PGSTORE_TEST:
        r = init_db("")
        if r.returncode != 1 or "built without PostgreSQL support" not in r.stderr:
            print(f"FAIL: kairosd --init-db without PostgreSQL support: {r.returncode} "
                  f"{r.stderr!r}", file=sys.stderr)
            return 1
        print("SKIP: built without -Dpostgres=enabled (tests/run.sh enables it); "
              "kairosd --init-db says so", file=sys.stderr)
        return SKIP
    bindir = pg_fixture.find_bindir()
    if not bindir:
        print("SKIP: " + pg_fixture.skip_reason(), file=sys.stderr)
        return SKIP
    # meson's timeout sends SIGTERM: stop the server on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("SIGTERM"))
    with pg_fixture.PgServer(bindir) as pg:
        PG = pg
        prog = unittest.main(argv=[sys.argv[0], "-v"], exit=False)
        ok = prog.result.wasSuccessful()
        if not ok:
            tail = pg.server_log().splitlines()[-40:]
            sys.stderr.write("--- the server log's end ---\n" + "\n".join(tail) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
