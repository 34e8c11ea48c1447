#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Cluster mode through clock skew: kairosd nodes on a private PostgreSQL
(pg_fixture.py) whose clocks run ahead of or behind the database's.

A node's clock is the fake clock of the test hooks (KAIROS_TEST_CLOCK, then
`test-clock`), set to a tick plus one second while the database's clock is a
few seconds before (a node ahead) or after (a node behind) that tick.  So
that a tick can be any second of the database's clock, the schedules are
read in a time zone of their own whose offset is a number of seconds (made
with zic in a private TZDIR): its minutes start at the second the test
chose.  Five schedules with the same timing are five ticks at once.

  1. a node 6 s ahead of the database, alone, claims every tick, once, and
     not before the tick is due by the database's clock;
  2. a node 5 s behind fires every tick once;
  3. two nodes, one 6 s ahead: one mandate per tick, and the node ahead
     is told the truth (it won, or "claimed by node n2"), never "fenced"
     nor "exists already";
  4. a node whose clock is off by more than the bound (2 s; the test hook
     KAIROS_TEST_CLOCK_SKEW_MS) says so in `kairosctl status` (text and
     --json), in the metrics and, once, in the journal.

Environment: KAIROSD, KAIROSCTL, KAIROS_PGSTORE_TEST (empty when built without
-Dpostgres=enabled).  Exit 77 (skipped, with the reason) without PostgreSQL
support, the server binaries, zic or the test hooks.  The test waits for the
database's clock to reach the moments it needs (polled, with a deadline)."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import pg_node  # noqa: E402
from kairos_harness import KAIROSCTL, Client, Daemon, NotifySocket, write_config  # noqa: E402

PG = None
LEASE = 6
NSCHED = 5
LEAD = 10  # s from the test's start to its tick: the nodes start meanwhile


def wait_for(cond, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


class Node:
    def __init__(self, case, name, env=None):
        self.case = case
        self.name = name
        self.dir = os.path.join(case.dir, name)
        os.makedirs(self.dir)
        os.chmod(self.dir, 0o755)
        self.state = os.path.join(self.dir, "state")
        # (debug: the loser's "claimed by node" line is at debug level)
        extra = ("LogLevel=debug\n[Cluster]\nBackend=postgres\nConnectionString=%s\n"
                 "NodeName=%s\nLeaseSec=%d\n" % (case.ci, name, LEASE))
        scheds = {"s%d" % i: {"Schedule": {"Cron": "* * * * *", "TimeZone": "SK",
                                           "MissedPolicy": "skip", "MissedGraceSec": "0"},
                              "Mandate": {"MaxCycles": "1"}, "Exec": {"Act": "true"}}
                  for i in range(NSCHED)}
        self.conf = write_config(self.dir, self.state, scheds, daemon_extra=extra)
        self.env = dict(env or {})
        self.daemon = None
        self.notify = None

    def start(self, clock):
        self.notify = NotifySocket(self.dir)
        env = {"KAIROS_TEST_CLOCK": str(clock), "TZDIR": self.case.tzdir}
        env.update(self.env)
        self.daemon = Daemon(self.state, config=self.conf, notify=self.notify, env=env)
        try:
            self.notify.wait_ready(timeout=60)
        except TimeoutError:
            self.daemon.kill()
            raise AssertionError("node %s is not ready:\n%s" % (self.name,
                                                               self.daemon.log()[-4000:]))

    def stop(self):
        if not self.daemon:
            return 0
        rc = self.daemon.stop()
        self.logs = self.daemon.log()
        self.daemon.proc.stderr.close()
        self.notify.close()
        self.daemon = None
        return rc

    def log(self):
        return self.daemon.log() if self.daemon else self.logs

    def clock(self, t):
        c = Client(self.daemon.socket_path)
        r = c.call("test-clock", now=t)
        c.close()
        if not r["ok"] and r["error"]["code"] == "unknown_command":
            raise unittest.SkipTest("kairosd was built without -Dtest_hooks=true")
        self.case.assertTrue(r["ok"], r)

    def ctl(self, *args):
        return subprocess.run([KAIROSCTL, "--socket", self.daemon.socket_path, *args],
                              capture_output=True, text=True, timeout=60)


class ClusterSkew(unittest.TestCase):
    def setUp(self):
        if self._testMethodName.startswith("test_2_"):
            self.lead = 0
        if not shutil.which("zic"):
            raise unittest.SkipTest("no zic (tzdata's compiler) to make the test's time zone")
        self.db = "skew_%d_%s" % (os.getpid(), self._testMethodName[5:20])
        self.ci = PG.createdb(self.db)
        r = subprocess.run([os.environ["KAIROSD"], "--init-db", self.ci], capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.dir = tempfile.mkdtemp(prefix="kairos-skew-")
        os.chmod(self.dir, 0o755)
        self.nodes = []
        # the tick: LEAD s from now by the database's clock; zone SK's
        # minutes start on it
        # (a node behind is set after its tick: no lead needed)
        self.tick = int(self.db_now()) + getattr(self, "lead", LEAD)
        off = (-self.tick) % 60
        self.tzdir = os.path.join(self.dir, "zoneinfo")
        src = os.path.join(self.dir, "sk.zi")
        with open(src, "w") as f:
            f.write("Zone SK 0:00:%02d - SKW\n" % off)
        subprocess.run(["zic", "-d", self.tzdir, src], check=True)

    def tearDown(self):
        failed = []
        for n in self.nodes:
            rc = n.stop()
            if rc != 0:
                failed.append((n.name, rc, n.log()[-3000:]))
        if os.environ.get("SKEW_DEBUG"):
            for n in self.nodes:
                sys.stderr.write("==== %s\n%s\n" % (n.name, n.log()[-6000:]))
        shutil.rmtree(self.dir, ignore_errors=True)
        self.assertEqual(failed, [])

    def sql(self, q):
        return PG.psql(self.db, q)

    def db_now(self):
        return float(self.sql("SELECT extract(epoch FROM clock_timestamp())")[0][0])

    def until_db(self, t):
        """Wait for the database's clock to reach t (its tick must not have
        gone by: a node too slow to start fails the test)."""
        self.assertLess(self.db_now(), t, "the nodes started too late for the tick")
        wait_for(lambda: self.db_now() >= t, "the database's clock at %s" % t)

    def node(self, name, env=None):
        n = Node(self, name, env)
        self.nodes.append(n)
        return n

    def claims(self):
        """{schedule: [(claimed by, claimed_at - fired_at in s)]} of the tick."""
        rows = self.sql("SELECT schedule, claimed_by, extract(epoch FROM claimed_at - fired_at) "
                        "FROM kairos_tick WHERE fired_at = to_timestamp(%d)" % self.tick)
        out = {}
        for s, by, late in rows:
            out.setdefault(s, []).append((by, float(late)))
        return out

    def wait_all_claimed(self):
        return wait_for(lambda: (lambda c: len(c) == NSCHED and c)(self.claims()),
                        "the %d ticks claimed" % NSCHED, timeout=30)

    def mandates(self):
        rows = self.sql("SELECT schedule, count(*) FROM kairos_mandate WHERE fired_at = "
                        "to_timestamp(%d) GROUP BY 1" % self.tick)
        return {s: int(k) for s, k in rows}

    def test_1_node_ahead_alone_claims_every_tick(self):
        a = self.node("n1")
        a.start(self.tick - 30)
        self.until_db(self.tick - 6)
        a.clock(self.tick + 1)  # 6-7 s ahead of the database
        claims = self.wait_all_claimed()
        for s, cl in claims.items():
            self.assertEqual(len(cl), 1, claims)
            by, late = cl[0]
            self.assertEqual(by, "n1")
            # claimed when due by the database's clock, not before
            self.assertGreaterEqual(late, 0, claims)
        wait_for(lambda: len(self.mandates()) == NSCHED, "the mandates")
        self.assertEqual(self.mandates(), {"s%d" % i: 1 for i in range(NSCHED)})
        log = a.log()
        self.assertNotIn("fenced", log)
        self.assertNotIn("exists already", log)

    def test_2_node_behind_fires_every_tick_once(self):
        a = self.node("n1")
        a.start(self.tick - 30)
        self.until_db(self.tick + 5)
        a.clock(self.tick + 1)  # 4-5 s behind the database
        claims = self.wait_all_claimed()
        self.assertEqual({s: len(cl) for s, cl in claims.items()},
                         {"s%d" % i: 1 for i in range(NSCHED)})
        wait_for(lambda: len(self.mandates()) == NSCHED, "the mandates")
        self.assertEqual(self.mandates(), {"s%d" % i: 1 for i in range(NSCHED)})

    def test_3_two_nodes_one_ahead_each_tick_once(self):
        a, b = self.node("n1"), self.node("n2")
        a.start(self.tick - 30)
        b.start(self.tick - 30)
        self.until_db(self.tick - 6)
        a.clock(self.tick + 1)  # n1 6-7 s ahead
        self.until_db(self.tick + 1)
        b.clock(self.tick + 1)  # n2 on time
        claims = self.wait_all_claimed()
        self.assertEqual({s: len(cl) for s, cl in claims.items()},
                         {"s%d" % i: 1 for i in range(NSCHED)})
        wait_for(lambda: len(self.mandates()) == NSCHED, "the mandates")
        self.assertEqual(self.mandates(), {"s%d" % i: 1 for i in range(NSCHED)})
        # the node ahead got the true answer for each tick it did not win
        lost = [s for s, cl in claims.items() if cl[0][0] == "n2"]
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.tick))
        for s in lost:
            a.daemon.wait_log("schedule %s at %s: claimed by node n2" % (s, at))
        log = a.log()
        self.assertNotIn("fenced", log)
        self.assertNotIn("exists already", log)

    def test_4_skew_beyond_the_bound_is_shown(self):
        a = self.node("n1", {"KAIROS_TEST_CLOCK_SKEW_MS": "5000"})
        a.start(self.tick - 30)
        a.daemon.wait_log("this node's clock is +5.0 s off the database's (more than 2 s)")

        def skew():
            p = a.ctl("--json", "status")
            self.assertEqual(p.returncode, 0, p.stderr)
            return json.loads(p.stdout)["cluster"].get("clock_skew")
        sk = wait_for(skew, "the skew in status")
        self.assertTrue(4.5 < sk["offset_sec"] < 5.5, sk)
        self.assertTrue(sk["over_bound"], sk)
        self.assertEqual(sk["bound_sec"], 2)
        p = a.ctl("status")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertRegex(p.stdout, r"Clock skew: +\+5\.\d s off the database's clock \(beyond")
        p = a.ctl("metrics")
        self.assertEqual(p.returncode, 0, p.stderr)
        m = re.search(r"(?m)^kairos_cluster_clock_offset_seconds (\S+)$", p.stdout)
        self.assertTrue(m, "no kairos_cluster_clock_offset_seconds in the metrics")
        self.assertTrue(4.5 < float(m.group(1)) < 5.5, m.group(0))
        # warned once, not at each beat
        self.assertEqual(a.log().count("off the database's (more than"), 1)


def main():
    return pg_node.run_tests(lambda pg: globals().__setitem__("PG", pg))


if __name__ == "__main__":
    sys.exit(main())
