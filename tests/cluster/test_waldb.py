#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""kairosctl wal dump --db / wal verify --db against a real, private
PostgreSQL (pg_fixture.py):

- a WAL written by a real kairosd (a mandate fired and run to its end),
  written as rows through pgstore (pg_load_wal, barriers of a few lines as
  the executor makes them), comes out of `wal dump --db` byte-identical, on
  standard output and with --output; `wal verify --db` finds it clean and
  `wal verify` reads the dump unchanged;
- rows damaged behind the store's back (raw SQL, the fence trigger
  disabled): a flipped byte, a crc column that is not the line's, a gap, an
  epoch going back along seq, a last_seq past the rows: each reported with
  the row's seq, exit 2; dump refuses rows with a gap (65);
- no such mandate, an unreachable database: 66; --json output.

Environment: KAIROSD, KAIROSCTL, KAIROS_PG_LOAD_WAL (empty when built
without -Dpostgres=enabled: then --db must say it is not built in, exit 64,
and the test is skipped).
"""
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import pg_fixture  # noqa: E402
from kairos_harness import Daemon, write_config  # noqa: E402

KAIROSD = os.environ.get("KAIROSD", "kairosd")
KAIROSCTL = os.environ.get("KAIROSCTL", "kairosctl")
LOAD_WAL = os.environ.get("KAIROS_PG_LOAD_WAL", "")
SKIP = 77
DB = "waldb"

PG = None
WAL = None      # the real kairosd's WAL of one mandate (bytes)
BARRIERS = 0    # ... written as m-real's rows in that many barriers


def ctl(*args, binary=False):
    return subprocess.run([KAIROSCTL, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=not binary, timeout=60)


def real_wal(workdir):
    """Run kairosd with a schedule of two cycles, fire it, wait for the end;
    the mandate's WAL as the daemon wrote it."""
    state = os.path.join(workdir, "state")
    os.makedirs(state)
    conf = write_config(workdir, state, {
        "two": {"Schedule": {"Cron": "0 0 1 1 *"}, "Mandate": {"MaxCycles": "2"},
                "Exec": {"Act": "/bin/true"}}})
    d = Daemon(state, config=conf)
    try:
        d.wait_log("ready", timeout=30)
        sock = os.path.join(state, "control.sock")
        r = ctl("--socket", sock, "--json", "fire", "two", "--at", "2026-04-20T12:00:00Z")
        assert r.returncode == 0, r.stderr
        mandate = json.loads(r.stdout)["mandate"]
        r = ctl("--socket", sock, "wait", mandate, "--timeout", "60")
        assert r.returncode == 0, (r.stdout, r.stderr)
        d.wait_log(f"mandate {mandate}: WAL archived", timeout=30)
    finally:
        d.stop()
    with gzip.open(os.path.join(state, "archive", mandate + ".wal.jsonl.gz")) as gz:
        return gz.read()


def load(mandate, data, *sizes):
    with tempfile.NamedTemporaryFile(suffix=".wal.jsonl") as f:
        f.write(data)
        f.flush()
        r = subprocess.run([LOAD_WAL, PG.conninfo(DB), mandate, f.name, *map(str, sizes)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"pg_load_wal {mandate}: {r.stdout}")
    return r.stdout


def raw_sql(sql):
    """SQL past the fence trigger (only the database's owner can)."""
    PG.psql(DB, "BEGIN; ALTER TABLE kairos_wal DISABLE TRIGGER kairos_wal_fence; " + sql +
            "; ALTER TABLE kairos_wal ENABLE TRIGGER kairos_wal_fence; COMMIT")


class Dump(unittest.TestCase):
    def test_rows_come_out_byte_identical(self):
        self.assertGreater(BARRIERS, 3)
        self.assertGreater(WAL.count(b"\n"), 10)
        rows = PG.psql(DB, "SELECT count(*), max(seq) FROM kairos_wal WHERE mandate_id = 'm-real'")
        self.assertEqual(rows, [[str(WAL.count(b"\n"))] * 2])
        r = ctl("wal", "dump", "--db", PG.conninfo(DB), "m-real", binary=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, b"")
        self.assertEqual(r.stdout, WAL)

    def test_output_file_and_file_tools(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m-real.wal.jsonl")
            r = ctl("wal", "dump", "--db", PG.conninfo(DB), "--output", path, "m-real")
            self.assertEqual((r.returncode, r.stdout, r.stderr), (0, "", ""))
            with open(path, "rb") as f:
                self.assertEqual(f.read(), WAL)
            self.assertEqual(os.stat(path).st_mode & 0o777, 0o640)
            self.assertEqual(sorted(os.listdir(d)), ["m-real.wal.jsonl"], "no temporary left")
            r = ctl("wal", "verify", path)
            self.assertEqual(r.returncode, 0, r.stdout)
            self.assertRegex(r.stdout, r": ok \(\d+ records, 0 legacy unchecked\)\n$")
            # an unwritable --output: 74, nothing left behind
            r = ctl("wal", "dump", "--db", PG.conninfo(DB), "--output",
                    os.path.join(d, "no", "such"), "m-real")
            self.assertEqual(r.returncode, 74, r.stderr)

    def test_verify_clean(self):
        n = WAL.count(b"\n")
        r = ctl("wal", "verify", "--db", PG.conninfo(DB), "m-real")
        self.assertEqual((r.returncode, r.stderr), (0, ""), r.stdout)
        self.assertEqual(r.stdout, f"m-real: ok ({n} rows, epoch 1)\n")
        r = ctl("--json", "wal", "verify", "--db", PG.conninfo(DB), "m-real")
        self.assertEqual(r.returncode, 0, r.stderr)
        j = json.loads(r.stdout)
        self.assertEqual(j["exit"], 0)
        self.assertEqual(j["mandates"], [{"mandate": "m-real", "status": "clean", "rows": n,
                                          "last_seq": n, "epoch": 1, "problem_count": 0,
                                          "problems": []}])

    def test_no_such_mandate_and_no_database(self):
        for sub in ("dump", "verify"):
            with self.subTest(sub=sub):
                r = ctl("wal", sub, "--db", PG.conninfo(DB), "m-none")
                self.assertEqual(r.returncode, 66, r.stderr)
                self.assertIn("m-none: no such mandate in the database", r.stderr)
                r = ctl("wal", sub, "--db",
                        f"host={PG.dir} port=1 user=kairos dbname={DB} connect_timeout=5",
                        "m-real")
                self.assertEqual(r.returncode, 66, r.stderr)
                self.assertIn("cannot connect to the database", r.stderr)

    def test_usage(self):
        for args in (["wal", "dump", "--db", "x"], ["wal", "dump", "--db", "x", "a", "b"],
                     ["wal", "verify", "--db", "x"], ["wal", "dump", "--output", "f", "FILE"],
                     ["--json", "wal", "dump", "--db", PG.conninfo(DB), "m-real"]):
            with self.subTest(args=args):
                self.assertEqual(ctl(*args).returncode, 64)


class Corrupt(unittest.TestCase):
    """Each case: a copy of the real rows under a new mandate, damaged with
    raw SQL; verify names the row's seq."""

    def copy(self, mandate):
        load(mandate, WAL, 3)
        return WAL.count(b"\n")

    def verify(self, mandate):
        r = ctl("wal", "verify", "--db", PG.conninfo(DB), mandate)
        self.assertEqual(r.returncode, 2, (r.stdout, r.stderr))
        return r.stdout

    def test_flipped_byte(self):
        self.copy("m-flip")
        line = bytes.fromhex(PG.psql(DB, "SELECT encode(line, 'hex') FROM kairos_wal "
                                     "WHERE mandate_id = 'm-flip' AND seq = 5")[0][0])
        bad = bytearray(line)
        bad[len(bad) // 2] ^= 1
        raw_sql(f"DELETE FROM kairos_wal WHERE mandate_id = 'm-flip' AND seq = 5; "
                f"INSERT INTO kairos_wal (mandate_id, seq, epoch, line, crc) SELECT 'm-flip', 5, "
                f"1, '\\x{bad.hex()}', crc FROM kairos_wal WHERE mandate_id = 'm-real' "
                f"AND seq = 5")
        out = self.verify("m-flip")
        self.assertRegex(out, r"(?m)^m-flip: seq 5: bad_record: ")
        self.assertIn("m-flip: corrupt (1 problem)\n", out)
        self.assertEqual(out.count("seq "), 1, out)
        # the dump still exports the rows as they are: the file tool sees the same
        r = ctl("wal", "dump", "--db", PG.conninfo(DB), "m-flip", binary=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotEqual(r.stdout, WAL)
        self.assertEqual(len(r.stdout), len(WAL))

    def test_crc_column(self):
        self.copy("m-crccol")
        raw_sql("UPDATE kairos_wal SET crc = (crc + 1) % 4294967296 "
                "WHERE mandate_id = 'm-crccol' AND seq = 2")
        out = self.verify("m-crccol")
        self.assertRegex(out, r"(?m)^m-crccol: seq 2: crc_column: the crc column \(\d+\) is "
                              r"not the line's crc \(\d+\)$")

    def test_gap(self):
        n = self.copy("m-gap")
        raw_sql("DELETE FROM kairos_wal WHERE mandate_id = 'm-gap' AND seq IN (4, 7, 8)")
        out = self.verify("m-gap")
        self.assertIn("m-gap: seq 5: gap: row 4 is missing\n", out)
        self.assertIn("m-gap: seq 9: gap: rows 7..8 are missing\n", out)
        self.assertIn("m-gap: corrupt (2 problems)\n", out)
        r = ctl("wal", "dump", "--db", PG.conninfo(DB), "m-gap", binary=True)
        self.assertEqual(r.returncode, 65, r.stderr)
        self.assertEqual(r.stdout, b"")
        self.assertIn(b"not a complete WAL", r.stderr)
        # rows missing at the end: the mandate's last_seq says so
        raw_sql(f"DELETE FROM kairos_wal WHERE mandate_id = 'm-gap' AND seq = {n}")
        out = self.verify("m-gap")
        self.assertIn(f"m-gap: last_seq: the rows end at seq {n - 1}, the mandate's last_seq "
                      f"is {n}\n", out)

    def test_epoch_going_back(self):
        n = self.copy("m-epoch")
        # taken over (epoch 2) at row 6, then a row under the old epoch 1
        raw_sql("UPDATE kairos_mandate SET epoch = 2 WHERE mandate_id = 'm-epoch'; "
                "DELETE FROM kairos_wal WHERE mandate_id = 'm-epoch' AND seq >= 6; "
                "INSERT INTO kairos_wal (mandate_id, seq, epoch, line, crc) "
                "SELECT 'm-epoch', seq, CASE WHEN seq = 8 THEN 1 ELSE 2 END, line, crc "
                "FROM kairos_wal WHERE mandate_id = 'm-real' AND seq >= 6")
        out = self.verify("m-epoch")
        self.assertIn("m-epoch: seq 8: epoch_back: epoch 1 after epoch 2 (an append under an "
                      "old epoch)\n", out)
        self.assertIn("m-epoch: corrupt (1 problem)\n", out)
        # rows from an epoch the mandate never reached
        raw_sql(f"UPDATE kairos_mandate SET epoch = 1 WHERE mandate_id = 'm-epoch'")
        out = self.verify("m-epoch")
        self.assertIn("m-epoch: seq 6: epoch_ahead: epoch 2 beyond the mandate's epoch 1\n", out)
        r = ctl("--json", "wal", "verify", "--db", PG.conninfo(DB), "m-epoch", "m-real")
        self.assertEqual(r.returncode, 2, r.stderr)
        j = json.loads(r.stdout)
        self.assertEqual(j["exit"], 2)
        self.assertEqual([m["status"] for m in j["mandates"]], ["corrupt", "clean"])
        probs = {(p["seq"], p["reason"]) for p in j["mandates"][0]["problems"]}
        self.assertIn((8, "epoch_back"), probs)
        self.assertIn((6, "epoch_ahead"), probs)
        self.assertEqual(j["mandates"][0]["rows"], n)


class Conninfo(unittest.TestCase):
    """No password on a command line (every user reads /proc/PID/cmdline):
    one there is refused (64) and nothing connects; "@FILE" reads the
    connection string from a file; libpq's PG* environment fills what the
    string leaves out (PGPASSWORD, PGPASSFILE, PGHOST, ...), kairos sets
    none of them itself.  The role pwuser needs its password (scram)."""

    @classmethod
    def setUpClass(cls):
        PG.psql(DB, "DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pwuser') "
                    "THEN CREATE ROLE pwuser LOGIN SUPERUSER PASSWORD 'sekrit'; END IF; END$$")
        hba = os.path.join(PG.data, "pg_hba.conf")
        with open(hba) as f:
            text = f.read()
        if "pwuser" not in text:
            with open(hba, "w") as f:
                f.write("local all pwuser scram-sha-256\n" + text)
            PG.psql(DB, "SELECT pg_reload_conf()")
        cls.tmp = tempfile.mkdtemp(prefix="kconninfo")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def base(self, user="pwuser"):
        return f"host={PG.dir} port={pg_fixture.PORT} user={user} dbname={DB}"

    def file(self, name, text):
        path = os.path.join(self.tmp, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return path

    def verify(self, db, env=None, prog=None):
        e = dict(os.environ)
        for k in list(e):
            if k.startswith("PG"):
                del e[k]
        e.update(env or {})
        argv = prog or [KAIROSCTL, "wal", "verify", "--db", db, "m-real"]
        return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=60, env=e)

    def test_password_on_the_command_line_is_refused(self):
        why = ("the connection string holds a password, which every user of this host can "
               "read in /proc/PID/cmdline: write it in a file given as @FILE (mode 0600), or "
               "leave it to ~/.pgpass, PGPASSFILE or PGPASSWORD")
        for db in (self.base() + " password=sekrit",
                   f"postgresql://pwuser:sekrit@/{DB}?host={PG.dir}&port={pg_fixture.PORT}",
                   f"postgresql:///{DB}?host={PG.dir}&password=sekrit"):
            for sub in ("verify", "dump"):
                with self.subTest(db=db, sub=sub):
                    r = self.verify(db, prog=[KAIROSCTL, "wal", sub, "--db", db, "m-real"])
                    self.assertEqual((r.returncode, r.stdout), (64, ""), r.stderr)
                    self.assertEqual(r.stderr, f"kairosctl: wal {sub} --db: {why} (see "
                                               "kairosctl --help)\n")
            with self.subTest(db=db, prog="kairosd"):
                r = self.verify(db, prog=[KAIROSD, "--init-db", db])
                self.assertEqual((r.returncode, r.stdout), (64, ""), r.stderr)
                self.assertEqual(r.stderr, "kairosd: --init-db: " + why + "\n")
        # a string libpq cannot read is a usage error too, its text not shown
        r = self.verify("host=x password='sekrit")
        self.assertEqual(r.returncode, 64, r.stderr)
        self.assertNotIn("sekrit", r.stderr)

    def test_password_from_a_file_or_the_environment(self):
        # without it: refused by the server
        r = self.verify(self.base())
        self.assertEqual(r.returncode, 66, r.stderr)
        self.assertIn("cannot connect to the database", r.stderr)
        # from @FILE (the whole string, password included)
        path = self.file("db.conninfo", self.base() + " password=sekrit\n")
        r = self.verify("@" + path)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("m-real: ok", r.stdout)
        r = self.verify("@" + path, prog=[KAIROSD, "--init-db", "@" + path])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "kairos schema: up to date at version %s\n"
                         % r.stdout.split()[-1])
        # libpq's environment: PGPASSWORD, PGPASSFILE
        r = self.verify(self.base(), env={"PGPASSWORD": "sekrit"})
        self.assertEqual(r.returncode, 0, r.stderr)
        passfile = self.file("pgpass", f"*:*:*:pwuser:sekrit\n")
        r = self.verify(self.base(), env={"PGPASSFILE": passfile})
        self.assertEqual(r.returncode, 0, r.stderr)
        # nothing on the command line at all: PGHOST, PGPORT, PGUSER, PGDATABASE
        env = {"PGHOST": PG.dir, "PGPORT": str(pg_fixture.PORT), "PGUSER": "pwuser",
               "PGDATABASE": DB, "PGPASSWORD": "sekrit"}
        r = self.verify("", env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.verify("", env=env, prog=[KAIROSD, "--init-db", ""])
        self.assertEqual(r.returncode, 0, r.stderr)
        # PGAPPNAME and PGCONNECT_TIMEOUT are libpq's to read, not kairos's to set
        r = self.verify("", env=dict(env, PGCONNECT_TIMEOUT="x"))
        self.assertEqual(r.returncode, 66, r.stderr)
        self.assertIn("connect_timeout", r.stderr)

    def test_bad_files(self):
        for arg, code, what in (("@" + os.path.join(self.tmp, "none"), 66,
                                 "cannot read %s: No such file or directory"
                                 % os.path.join(self.tmp, "none")),
                                ("@" + self.tmp, 66, "%s: not a regular file" % self.tmp),
                                ("@" + self.file("empty", "\n"), 66,
                                 "%s: is empty (no connection string)"
                                 % os.path.join(self.tmp, "empty"))):
            with self.subTest(arg=arg):
                r = self.verify(arg)
                self.assertEqual((r.returncode, r.stdout), (code, ""), r.stderr)
                self.assertEqual(r.stderr, "kairosctl: wal verify --db: %s\n" % what)
                r = self.verify(arg, prog=[KAIROSD, "--init-db", arg])
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assertEqual(r.stderr, "kairosd: --init-db: %s\n" % what)


def main():
    global PG, WAL, BARRIERS
    if not LOAD_WAL:
        r = ctl("wal", "dump", "--db", "host=/nonexistent", "m1")
        if r.returncode != 64 or "not built in" not in r.stderr:
            print(f"FAIL: wal dump --db without PostgreSQL support: {r.returncode} "
                  f"{r.stderr!r}", file=sys.stderr)
            return 1
        print("SKIP: built without -Dpostgres=enabled (tests/run.sh enables it); "
              "kairosctl wal dump --db says it is not built in", file=sys.stderr)
        return SKIP
    bindir = pg_fixture.find_bindir()
    if not bindir:
        print("SKIP: " + pg_fixture.skip_reason(), file=sys.stderr)
        return SKIP
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("SIGTERM"))
    work = tempfile.mkdtemp(prefix="kwaldb")
    try:
        WAL = real_wal(work)
        with pg_fixture.PgServer(bindir) as pg:
            PG = pg
            ci = pg.createdb(DB)
            r = subprocess.run([KAIROSD, "--init-db", ci], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=60)
            if r.returncode != 0:
                print(f"FAIL: kairosd --init-db: {r.stdout}", file=sys.stderr)
                return 1
            BARRIERS = int(load("m-real", WAL, 4, 1, 2, 3).split()[0])
            prog = unittest.main(argv=[sys.argv[0], "-v"], exit=False)
            ok = prog.result.wasSuccessful()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
