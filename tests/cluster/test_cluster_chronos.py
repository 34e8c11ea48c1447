#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Chronos in cluster mode: two kairosd on one host share a private
PostgreSQL (pg_fixture.py) and the same every-minute schedule, on the fake
clock of the test hooks (KAIROS_TEST_CLOCK, then `test-clock`), set in the
past so that the database's clock never finds a tick ahead of it.

  1. both nodes fire every on-time tick; each tick has exactly one mandate
     and one node answers the other's claim "claimed by node ...";
  2. every node down over 5 missed ticks (MissedPolicy=catch_up_bounded,
     MaxCatchUpRuns=1; catch_up_once would let the on-time tick be the one
     run of the period): after
     both restart at once, exactly one catch-up mandate in the cluster, fired
     by one node (the one whose compare-and-set on the schedule's row won);
  3. a node restarted after the other kept running catches nothing up: the
     row says the window was evaluated already;
  4. the database down during on-time ticks: their claims fail (logged);
     once it is back the failed on-time tick fires again and the ticks that
     went past the on-time window meanwhile go through the missed-run policy
     (catch_up_bounded), once for the cluster;
  5. a node whose schedule has another timing is named in a warning;
  6. a schedule without a row yet is caught up from the first node's own
     state (a new database, a node that ran alone before);
  7. MissedPolicy=skip, the database down during on-time ticks: the ticks
     gone past the on-time window get one journal line for the cluster
     (schedule, window, first and last tick) and a line on each node that
     could not claim them; the on-time one fires again.

Environment: KAIROSD, KAIROSCTL, KAIROS_PGSTORE_TEST (empty when built without
-Dpostgres=enabled).  Exit 77 (skipped, with the reason) without PostgreSQL
support, the server binaries or the test hooks.  No sleeps as
synchronization: the test polls the database or the logs with a deadline."""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import pg_fixture  # noqa: E402
import pg_node  # noqa: E402
from kairos_harness import KAIROSD, Client, Daemon, NotifySocket, write_config  # noqa: E402

PG = None
LEASE = 6
# an hour ago, on a minute: every tick of the tests is in the database's past
BASE = (int(time.time()) // 60) * 60 - 3600


def iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def tick(k):
    return BASE + 60 * k


def wait_for(cond, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def pg_down():
    PG._run([os.path.join(PG.bindir, "pg_ctl"), "-D", PG.data, "-m", "fast", "-w", "-t", "60",
             "stop"])
    PG.running = False


def pg_up():
    opts = (f"-k {PG.dir} -p {pg_fixture.PORT} -c listen_addresses='' -c fsync=off "
            "-c full_page_writes=off -c max_connections=60 -c shared_buffers=16MB "
            "-c log_min_messages=warning")
    PG._run([os.path.join(PG.bindir, "pg_ctl"), "-D", PG.data, "-l", PG.log, "-o", opts, "-w",
             "-t", "60", "start"])
    PG.running = True


class Node:
    def __init__(self, case, name, schedule):
        self.case = case
        self.name = name
        self.dir = os.path.join(case.dir, name)
        os.makedirs(self.dir)
        os.chmod(self.dir, 0o755)
        self.state = os.path.join(self.dir, "state")
        extra = ("LogLevel=debug\n[Cluster]\nBackend=postgres\nConnectionString=%s\n"
                 "NodeName=%s\nLeaseSec=%d\n" % (case.ci, name, LEASE))
        self.conf = write_config(self.dir, self.state, {"every": schedule}, daemon_extra=extra)
        self.daemon = None
        self.notify = None
        self.logs = ""  # of the runs before the current one

    def start(self, clock):
        try:
            os.unlink(os.path.join(self.dir, "notify.sock"))  # of the last run
        except FileNotFoundError:
            pass
        self.notify = NotifySocket(self.dir)
        self.daemon = Daemon(self.state, config=self.conf, notify=self.notify,
                             env={"KAIROS_TEST_CLOCK": str(clock)})

    def wait_ready(self):
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
        self.logs += self.daemon.log()
        self.daemon.proc.stderr.close()
        self.notify.close()
        self.daemon = None
        return rc

    def log(self):
        return self.logs + (self.daemon.log() if self.daemon else "")

    def clock(self, t):
        c = Client(self.daemon.socket_path)
        r = c.call("test-clock", now=t)
        c.close()
        if not r["ok"] and r["error"]["code"] == "unknown_command":
            raise unittest.SkipTest("kairosd was built without -Dtest_hooks=true")
        self.case.assertTrue(r["ok"], r)

    def count(self, text):
        return self.log().count(text)


def schedule(policy="catch_up_once", runs=None, cron="* * * * *"):
    s = {"Cron": cron, "MissedPolicy": policy, "MissedGraceSec": "0"}
    if runs:
        s["MaxCatchUpRuns"] = str(runs)
    return {"Schedule": s, "Mandate": {"MaxCycles": "1"}, "Exec": {"Act": "true"}}


class ClusterChronos(unittest.TestCase):
    def setUp(self):
        self.db = "chronos_%d_%s" % (os.getpid(), self._testMethodName[5:20])
        self.ci = PG.createdb(self.db)
        r = subprocess.run([KAIROSD, "--init-db", self.ci], capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.dir = tempfile.mkdtemp(prefix="kairos-cchronos-")
        os.chmod(self.dir, 0o755)
        self.nodes = []

    def tearDown(self):
        if not PG.running:
            pg_up()
        failed = []
        for n in self.nodes:
            rc = n.stop()
            if rc != 0:
                failed.append((n.name, rc, n.log()[-3000:]))
        if os.environ.get("CCHRONOS_DEBUG"):
            for n in self.nodes:
                sys.stderr.write("==== %s\n%s\n" % (n.name, n.log()[-6000:]))
        shutil.rmtree(self.dir, ignore_errors=True)
        self.assertEqual(failed, [])

    def sql(self, q):
        return PG.psql(self.db, q)

    def node(self, name, sched=None):
        n = Node(self, name, sched or schedule())
        self.nodes.append(n)
        return n

    def start(self, nodes, clock):
        for n in nodes:
            n.start(clock)
        for n in nodes:
            n.wait_ready()

    def ticks(self):
        """{fired_at iso: number of mandates} of schedule every."""
        rows = self.sql("SELECT to_char(fired_at AT TIME ZONE 'UTC', "
                        "'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), count(*) FROM kairos_mandate "
                        "WHERE schedule = 'every' GROUP BY 1 ORDER BY 1")
        return {r[0]: int(r[1]) for r in rows}

    def claims(self):
        rows = self.sql("SELECT count(*) FROM kairos_tick WHERE schedule = 'every'")
        return int(rows[0][0])

    def wait_ticks(self, ks, what):
        want = {iso(tick(k)) for k in ks}
        return wait_for(lambda: want <= set(self.ticks()), what)

    def wait_row(self, at_least):
        """kairos_schedule's row of every has been evaluated up to at_least."""
        def ok():
            r = self.sql("SELECT extract(epoch FROM last_evaluated_at)::bigint FROM "
                         "kairos_schedule WHERE name = 'every'")
            return r and int(r[0][0]) >= at_least
        wait_for(ok, "the schedule's row at %s" % iso(at_least))

    def both_at(self, nodes, t):
        for n in nodes:
            n.clock(t)

    def test_1_each_on_time_tick_one_mandate(self):
        a, b = self.node("n1"), self.node("n2")
        self.start([a, b], tick(0) + 5)
        for k in (1, 2, 3):
            self.both_at([a, b], tick(k) + 1)
            self.wait_ticks([k], "tick %d" % k)
            at = iso(tick(k))
            # both fired it; the one that lost the claim says so
            for n in (a, b):
                n.daemon.wait_log("schedule every: tick %s fires" % at)
            lost = "schedule every at %s: claimed by node" % at
            wait_for(lambda: a.count(lost) or b.count(lost), "the losing node's answer for " + at)
            # one node lost the claim (kairosd may log the loss more than once),
            # at debug level; only the winner says it fired the tick
            self.assertEqual(sum(1 for n in (a, b) if n.count(lost)), 1)
            loser = a if a.count(lost) else b
            self.assertEqual([ln[:3] for ln in loser.log().splitlines() if lost in ln],
                             ["<7>"] * loser.count(lost))
            fired = "fired every at %s: mandate" % at
            wait_for(lambda: a.count(fired) + b.count(fired), "the winner's fired line")
            self.assertEqual(loser.count(fired), 0, loser.log()[-3000:])
        self.assertEqual(self.ticks(), {iso(tick(k)): 1 for k in (1, 2, 3)})
        self.assertEqual(self.claims(), 3)
        self.wait_row(tick(3) + 1)

    def test_2_all_down_one_catch_up(self):
        sched = schedule("catch_up_bounded", runs=1)
        a, b = self.node("n1", sched), self.node("n2", sched)
        self.start([a, b], tick(0) + 5)
        self.both_at([a, b], tick(1) + 1)
        self.wait_ticks([1], "tick 1")
        self.wait_row(tick(1) + 1)
        for n in (a, b):
            self.assertEqual(n.stop(), 0)
        # ticks 2..6 missed while every node was down, 7 on time
        now = tick(7) + 30
        self.start([a, b], now)
        self.wait_ticks([6, 7], "the catch-up tick and the on-time one")
        self.wait_row(now)
        # both rounds are over: the winner's catch-up is answered, the other
        # node found the row moved on (lost, or behind it)
        wait_for(lambda: a.count("(catch-up)") + b.count("(catch-up)") >= 1, "the catch-up")
        self.assertEqual(a.count("(catch-up)") + b.count("(catch-up)"), 1,
                         a.log()[-3000:] + b.log()[-3000:])
        self.assertEqual(a.count("evaluates the missed ticks") +
                         b.count("evaluates the missed ticks"), 1)
        self.assertEqual(self.ticks(), {iso(tick(k)): 1 for k in (1, 6, 7)})

    def test_3_restart_after_the_others_kept_running(self):
        sched = schedule("catch_up_bounded", runs=5)
        a, b = self.node("n1", sched), self.node("n2", sched)
        self.start([a, b], tick(0) + 5)
        self.both_at([a, b], tick(1) + 1)
        self.wait_ticks([1], "tick 1")
        self.assertEqual(b.stop(), 0)
        for k in (2, 3, 4, 5, 6):
            a.clock(tick(k) + 1)
            self.wait_ticks([k], "tick %d on n1" % k)
        now = tick(6) + 30
        a.clock(now)
        self.wait_row(now)
        b.start(now)
        b.wait_ready()
        # n2's own state says ticks 2..5 were missed: the row says n1
        # evaluated them; its round ends with the row as it found it
        b.daemon.wait_log("schedule every: tick %s fires" % iso(tick(6)))
        b.daemon.wait_log("schedule every at %s: claimed by node n1" % iso(tick(6)))
        b.clock(now + 1)  # one more round, after the first one: then n2 is done
        self.wait_row(now + 1)
        self.assertEqual(b.count("(catch-up)"), 0, b.log()[-3000:])
        self.assertEqual(b.count("evaluates the missed ticks"), 0)
        self.assertEqual(self.ticks(), {iso(tick(k)): 1 for k in range(1, 7)})

    def test_4_database_down_during_on_time_ticks(self):
        sched = schedule("catch_up_bounded", runs=5)
        a, b = self.node("n1", sched), self.node("n2", sched)
        self.start([a, b], tick(0) + 5)
        self.both_at([a, b], tick(1) + 1)
        self.wait_ticks([1], "tick 1")
        self.wait_row(tick(1) + 1)
        pg_down()
        # tick 2 on time: its claims fail on both nodes (logged)
        self.both_at([a, b], tick(2) + 1)
        for n in (a, b):
            n.daemon.wait_log("tick not fired", timeout=60)
        # the database stays down: tick 3 goes past the on-time window,
        # tick 4 is on time and fails too
        self.both_at([a, b], tick(4) + 1)
        for n in (a, b):
            wait_for(lambda: n.count("tick not fired") >= 2, "tick 4's failure on " + n.name)
        for n in (a, b):  # (more if a fire found the node unable to act)
            self.assertGreaterEqual(n.count("fired again once the database answers"), 2)
        pg_up()
        # ticks 2 and 3 by the missed-run policy (once, on the node whose
        # compare-and-set won), tick 4 again while on time
        self.wait_ticks([2, 3, 4], "the ticks the database missed")
        self.wait_row(tick(4) + 1)
        wait_for(lambda: a.count("(catch-up)") + b.count("(catch-up)") >= 2, "the catch-ups")
        self.assertEqual(self.ticks(), {iso(tick(k)): 1 for k in (1, 2, 3, 4)})
        self.assertEqual(a.count("(catch-up)") + b.count("(catch-up)"), 2,
                         a.log()[-3000:] + b.log()[-3000:])
        self.assertTrue(a.count("(again: the database answers)") +
                        b.count("(again: the database answers)") >= 1)

    def test_7_skipped_ticks_have_a_line(self):
        # MissedPolicy=skip: ticks whose claims failed while the database
        # was down, gone past the on-time window, are dropped by the policy
        # with one line for the cluster (the schedule, the window, the
        # first and last tick), and each node that could not claim them
        # says so with the schedule and the first one's time; the on-time
        # tick fires again
        sched = schedule("skip")
        a, b = self.node("n1", sched), self.node("n2", sched)
        self.start([a, b], tick(0) + 5)
        self.both_at([a, b], tick(1) + 1)
        self.wait_ticks([1], "tick 1")
        self.wait_row(tick(1) + 1)
        pg_down()
        self.both_at([a, b], tick(2) + 1)
        for n in (a, b):
            n.daemon.wait_log("tick not fired", timeout=60)
        self.both_at([a, b], tick(4) + 1)
        for n in (a, b):
            wait_for(lambda: n.count("tick not fired") >= 2, "tick 4's failure on " + n.name)
        pg_up()
        self.wait_ticks([4], "the on-time tick again")
        self.wait_row(tick(4) + 1)
        line = ("schedule every: 2 missed ticks since %s dropped (MissedPolicy=skip): "
                "first %s, last %s" % (iso(tick(1) + 1), iso(tick(2)), iso(tick(3))))
        wait_for(lambda: a.count(line) + b.count(line) >= 1, "the skipped ticks' line")
        self.assertEqual(a.count(line) + b.count(line), 1, a.log()[-3000:] + b.log()[-3000:])
        # (each node's unclaimed ticks run from tick 2 to tick 4: 2 and 3
        # are no longer on time)
        hole = ("schedule every: its ticks since %s that could not be claimed are no longer "
                "on time: the missed-run policy decides them (2, first %s, last %s)"
                % (iso(tick(2)), iso(tick(2)), iso(tick(3))))
        for n in (a, b):
            wait_for(lambda: n.count(hole) >= 1, "the unclaimed ticks' line on " + n.name)
        self.assertEqual(self.ticks(), {iso(tick(k)): 1 for k in (1, 4)})

    def test_6_first_row_from_the_node_own_state(self):
        # a schedule without a row (a new database, a node that ran on its
        # own before): its first row's window starts at the node's own last
        # evaluation, so its downtime is caught up all the same
        a = self.node("n1", schedule("catch_up_bounded", runs=1))
        self.start([a], tick(0) + 5)
        a.clock(tick(1) + 1)
        self.wait_ticks([1], "tick 1")
        self.wait_row(tick(1) + 1)
        self.assertEqual(a.stop(), 0)
        self.sql("DELETE FROM kairos_schedule")
        now = tick(7) + 30
        self.start([a], now)
        self.wait_ticks([6, 7], "the catch-up tick and the on-time one")
        a.daemon.wait_log("this node evaluates the missed ticks of (%s, %s]"
                          % (iso(tick(1) + 1), iso(now)))
        self.wait_row(now)
        self.assertEqual(self.ticks(), {iso(tick(k)): 1 for k in (1, 6, 7)})

    def test_5_other_timing_is_named(self):
        a = self.node("n1", schedule("catch_up_once"))
        b = self.node("n2", schedule("skip"))
        self.start([a], tick(0) + 5)
        self.wait_row(tick(0) + 5)
        self.start([b], tick(0) + 6)
        b.daemon.wait_log("schedule every: another node evaluates it with other timing")


def main():
    return pg_node.run_tests(lambda pg: globals().__setitem__("PG", pg))


if __name__ == "__main__":
    sys.exit(main())
