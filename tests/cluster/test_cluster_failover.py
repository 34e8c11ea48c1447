#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Through the database's own failover: a PostgreSQL primary and a
synchronous standby (pg_standby.py: pg_basebackup -R,
synchronous_standby_names, synchronous_commit=on), two kairosd nodes whose
ConnectionString= names both servers (target_session_attrs=read-write).

- Under load (fires of a schedule on both nodes, each mandate's act making
  its effect through `kairosctl tool run`, logged to an outbox, then a
  little more work; an act held before its tool call until the attack),
  the primary's postmaster is killed (kill -9), or the primary made read-only
  while its sessions stay (a switchover's fence: their writes get SQLSTATE
  25006; the test waits until a tool call's claim was refused), and the
  standby promoted (pg_ctl promote), as a failover manager
  would.  Then: no tick fired twice, no effect twice, every fire that was
  acknowledged has a mandate that ends done (none failed), and from the
  promotion both nodes renew and a step ends within two leases.  The
  failover times are printed (promotion to the first step done, to both
  nodes renewing), with the load average.
- At its start kairosd warns (once, warning level) when the database
  acknowledges commits that a failover can lose: no synchronous standby
  (synchronous_standby_names empty), or synchronous_commit off or local;
  nothing on the synchronous pair.

Environment: KAIROSD, KAIROSCTL, KAIROS_PGSTORE_TEST (empty when built
without -Dpostgres=enabled); KAIROS_FAILOVER_LEASE_SEC: LeaseSec= (3; 10
as in production); KAIROS_FAILOVER_ROUNDS: failovers, each followed by a
new synchronous standby in the dead primary's place (1);
KAIROS_FAILOVER_DOWN_SEC: how long the primary stays dead or read-only
(0) before the standby is promoted (a failover manager's time;
near the lease, a step cut off inside its tool call may end paused for
review, by design).  Exit 77 (skipped, with the reason) without
PostgreSQL support or the server binaries.  No sleeps as synchronization: polls with a deadline."""
import collections
import os
import subprocess
import sys
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import pg_fixture  # noqa: E402
import pg_node  # noqa: E402
import pg_standby  # noqa: E402

PAIR = None
LEASE = int(os.environ.get("KAIROS_FAILOVER_LEASE_SEC", "3"))
ROUNDS = int(os.environ.get("KAIROS_FAILOVER_ROUNDS", "1"))
# how long the old primary is dead (kill) or read-only (fence) before the
# promotion: a failover manager's time
DOWN = os.environ.get("KAIROS_FAILOVER_DOWN_SEC")
WARNING = "a failover can lose"

# the effect (once, through the database), then a little more work; held
# before its tool call while $OUT/hold exists (the test's way to have tool
# calls made during the failover)
ACT = ("#!/bin/sh\n"
       "if [ -e \"$OUT/hold\" ]; then\n"
       "  touch \"$OUT/held-$(cat \"$OUT/hold\")-$KAIROS_MANDATE_ID\"\n"
       "  while [ -e \"$OUT/hold\" ]; do sleep 0.05; done\n"
       "fi\n"
       "\"$KAIROSCTL\" tool run --key \"out-$KAIROS_IDEM_KEY\" -- sh -c "
       "'echo \"$0\" >> \"$1\"' \"$KAIROS_MANDATE_ID\" \"$OUT/outbox\" >/dev/null || exit 1\n"
       "sleep 0.5\n"
       "echo '{\"ok\":true}'\n")

wait_for = pg_node.wait_for


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def with_env(node, env):
    """node.start() with env added to kairosd's environment."""
    orig = node.start

    def start():
        saved = pg_node.Daemon
        pg_node.Daemon = lambda *a, **kw: saved(*a, env=env, **kw)
        try:
            orig()
        finally:
            pg_node.Daemon = saved
    node.start = start
    return node


class Load:
    """Fires of job, each at a tick of its own, on n1 and n2 in turn, until
    stopped: (tick, node, exit status, mandate or None, stderr) each."""

    def __init__(self, nodes):
        self.nodes = nodes
        self.fires = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        i = 0
        while not self.stop.is_set():
            node = self.nodes[i % len(self.nodes)]
            tick = "2026-05-%02dT%02d:%02d:%02dZ" % (1 + i // 86400, i // 3600 % 24,
                                                      i // 60 % 60, i % 60)
            rc, out, err = node.ctl("fire", "job", "--at", tick)
            mid = out.get("mandate") if rc == 0 and isinstance(out, dict) else None
            with self.lock:
                self.fires.append((tick, node.name, rc, mid, err.strip()))
            i += 1
            time.sleep(0.1)   # the load's pace, not a synchronization

    def finish(self):
        self.stop.set()
        self.thread.join(120)


class Failover(pg_node.TwoNodes):
    prefix = "failover"
    DEBUG = "FAILOVER_DEBUG"

    def make_node(self, name):
        path = os.path.join(self.dir, "act.sh")
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write(ACT)
            os.chmod(path, 0o755)
        scheds = {"job": {"Schedule": {"Cron": "0 0 1 1 *", "Concurrency": "allow"},
                          "Exec": {"Act": path, "EffectsVia": "kairosctl",
                                   "Environment": "OUT=%s KAIROSCTL=%s" % (
                                       self.out, os.path.abspath(pg_node.KAIROSCTL))}}}
        return pg_node.Node(self.dir, name, self.ci, scheds, LEASE)

    def setUp(self):
        if not PAIR.synchronous():
            PAIR.rebuild_standby()   # (an earlier test's failover)
        super().setUp()

    def count(self, status):
        return int(self.sql("SELECT count(*) FROM kairos_mandate WHERE status = '%s'"
                            % status)[0][0])

    def effects(self):
        try:
            with open(os.path.join(self.out, "outbox")) as f:
                return f.read().split()
        except FileNotFoundError:
            return []

    def about(self, mids):
        """Each node's log lines naming one of mids."""
        return "".join("--- %s ---\n%s" % (n.name, "".join(
            line + "\n" for line in n.daemon.log().splitlines() if any(m in line for m in mids)))
            for n in (self.n1, self.n2))

    def logs(self):
        return "".join("--- %s ---\n%s" % (n.name, n.daemon.log()[-4000:])
                       for n in (self.n1, self.n2))

    def test_failover_under_load(self):
        """The primary's postmaster killed (kill -9), the standby promoted."""
        self.failover_under_load(PAIR.kill_primary, float(DOWN or 0))

    def test_switchover_under_load(self):
        """The primary made read-only while it runs, the standby promoted:
        the nodes' sessions on the old primary get SQLSTATE 25006 and must
        connect to the new one."""
        self.failover_under_load(PAIR.fence_primary, float(DOWN or 0))

    def failover_under_load(self, attack, down):
        for n in (self.n1, self.n2):
            self.assertNotIn(WARNING, n.daemon.log())
        load = Load([self.n1, self.n2])
        to_step, to_renew, outage = [], [], []
        met = 0   # rounds where a tool call met the read-only old primary
        try:
            for rnd in range(ROUNDS):
                done0 = self.count("succeeded")
                # mid-load: steps ending and others running
                wait_for(lambda: self.count("succeeded") >= done0 + 3
                         and self.count("running") >= 1, "the load to run", timeout=60)
                # an act held before its tool call, let go once the
                # primary is dead or read-only: its call meets the failover
                # (the round in the file: an act late to the last round's
                # hold is not held in this one)
                hold = os.path.join(self.out, "hold")
                with open(hold + ".new", "w") as f:
                    f.write("%d" % rnd)
                os.rename(hold + ".new", hold)
                wait_for(lambda: [f for f in os.listdir(self.out)
                                  if f.startswith("held-%d-" % rnd)],
                         "an act held before its tool call")
                t_attack = time.monotonic()
                attack()
                claims0 = PAIR.primary.server_log().count("kairos_idem_claim")
                os.unlink(hold)
                if attack == PAIR.fence_primary:
                    # the old primary refuses the tool call's claim (25006),
                    # unless its node's connection was made again since an
                    # earlier round (then it waits for a primary instead)
                    try:
                        wait_for(lambda: PAIR.primary.server_log().count("kairos_idem_claim")
                                 > claims0, "a tool call refused as read-only", timeout=1)
                        met += 1
                    except AssertionError:
                        pass
                if down:
                    time.sleep(down)   # the outage's length, not a synchronization
                PAIR.promote()
                t0 = time.monotonic()
                outage.append(t0 - t_attack)
                if os.environ.get(self.DEBUG):
                    print("".join(line + "\n" for line in PAIR.standby.server_log().splitlines()
                                  if "read-only" in line or "STATEMENT" in line)[-3000:],
                          file=sys.stderr)
                promoted = self.sql("SELECT clock_timestamp()")[0][0]
                base = self.count("succeeded")
                step = renew = None
                deadline = t0 + 2 * LEASE + 30
                while (step is None or renew is None) and time.monotonic() < deadline:
                    now = time.monotonic() - t0
                    if step is None and self.count("succeeded") > base:
                        step = now
                    if renew is None and int(self.sql(
                            "SELECT count(*) FROM kairos_node WHERE expires_at >= "
                            "'%s'::timestamptz + interval '%d seconds'" % (promoted, LEASE)
                    )[0][0]) == 2:
                        renew = now
                    time.sleep(0.05)
                print("round %d: %.2f s from the attack to the promotion; from the promotion "
                      "%s s to a step done, %s s to both nodes renewing" % (rnd, outage[-1], "%.2f" % step if step is not None else "no",
                                    "%.2f" % renew if renew is not None else "no"),
                      file=sys.stderr)
                self.assertIsNotNone(step, "no step ended after the promotion\n" + self.logs())
                self.assertIsNotNone(renew, "the nodes do not renew after the promotion\n"
                                     + self.logs())
                to_step.append(step)
                to_renew.append(renew)
                if rnd + 1 < ROUNDS:
                    PAIR.rebuild_standby()
            # the load goes on a little on the new primary
            base = self.count("succeeded")
            wait_for(lambda: self.count("succeeded") >= base + 3, "the load after the failover",
                     timeout=60)
        finally:
            load.finish()
        wait_for(lambda: self.count("running") == 0, "every mandate to end", timeout=60)
        fires = load.fires
        acked = [f for f in fires if f[2] == 0]
        refused = [f for f in fires if f[2] != 0]
        rows = {r[0]: r[1:] for r in self.sql(
            "SELECT mandate_id, status, owner, epoch, schedule, fired_at FROM kairos_mandate")}
        # no tick fired twice
        self.assertEqual(self.sql("SELECT schedule, fired_at, count(*) FROM kairos_mandate "
                                  "GROUP BY 1, 2 HAVING count(*) > 1"), [])
        # no effect twice; every done mandate's effect once
        effects = collections.Counter(self.effects())
        self.assertEqual([m for m, k in effects.items() if k > 1], [], effects)
        # no acknowledged fire lost: its mandate ends done
        lost = [(f, rows.get(f[3])) for f in acked if (rows.get(f[3]) or ("",))[0] != "succeeded"]
        self.assertEqual(lost, [], self.about([f[3] for f, r in lost]))
        not_done = {m: r for m, r in rows.items() if r[0] != "succeeded"}
        self.assertEqual(not_done, {}, self.about(not_done))
        self.assertEqual(sorted(m for m in rows), sorted(effects), "a done mandate without "
                         "its effect, or an effect without its mandate")
        with open("/proc/loadavg") as f:
            load_avg = " ".join(f.read().split()[:3])
        print("%s (LeaseSec=%d, %d rounds, down %.1f s; the attack to the promotion p99 "
              "%.2f s): promotion to a step done p50 %.2f "
              "/ p99 %.2f s, to both nodes renewing p50 %.2f / p99 %.2f s; %d fires (%d "
              "acknowledged, %d refused), %d mandates done, %d effects, 0 twice; load average %s"
              % (attack.__name__, LEASE, ROUNDS, down, pct(outage, 99), pct(to_step, 50), pct(to_step, 99), pct(to_renew, 50),
                 pct(to_renew, 99), len(fires), len(acked), len(refused), len(rows),
                 sum(effects.values()), load_avg), file=sys.stderr)
        for f in refused[:5]:
            print("  refused: %r" % (f,), file=sys.stderr)
        if attack == PAIR.fence_primary:
            print("  %d of %d rounds with a tool call refused as read-only" % (met, ROUNDS),
                  file=sys.stderr)
            self.assertGreater(met, 0, "no tool call met the read-only old primary")
        self.assertLessEqual(max(to_step), 2 * LEASE)
        self.assertLessEqual(max(to_renew), 2 * LEASE)

    def test_synchronous_commit_local_warns(self):
        """PGOPTIONS=-c synchronous_commit=local: the node's commits are
        acknowledged before the standby has them."""
        n3 = with_env(self.make_node("n3"), {"PGOPTIONS": "-c synchronous_commit=local"})
        n3.start()
        try:
            wait_for(lambda: WARNING in n3.daemon.log(), "the warning")
            log = n3.daemon.log()
        finally:
            self.assertEqual(n3.close(graceful=True), 0)
        lines = [line for line in log.splitlines() if WARNING in line]
        self.assertEqual(len(lines), 1, log)
        self.assertTrue(lines[0].startswith("<4>"), lines[0])   # warning
        self.assertIn("synchronous_commit=local", lines[0])
        self.assertNotIn("synchronous_standby_names is empty", lines[0])
        for n in (self.n1, self.n2):
            self.assertNotIn(WARNING, n.daemon.log())


class NoStandby(unittest.TestCase):
    """A node on a server without a standby warns once at start, naming
    synchronous_standby_names."""

    def test_no_standby_warns(self):
        with pg_fixture.PgServer(PAIR.bindir) as pg:
            ci = pg.createdb("lone")
            r = subprocess.run([os.environ["KAIROSD"], "--init-db", ci], capture_output=True,
                               text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            d = pg_node.tempfile.mkdtemp(prefix="kairos-lone-")
            try:
                n = pg_node.Node(d, "n1", ci, {}, LEASE)
                n.start()
                try:
                    wait_for(lambda: WARNING in n.daemon.log(), "the warning")
                    rc, out, err = n.ctl("status")
                    self.assertEqual(rc, 0, err)
                    log = n.daemon.log()
                finally:
                    self.assertEqual(n.close(graceful=True), 0)
            finally:
                pg_node.shutil.rmtree(d, ignore_errors=True)
        lines = [line for line in log.splitlines() if WARNING in line]
        self.assertEqual(len(lines), 1, log)
        self.assertTrue(lines[0].startswith("<4>"), lines[0])   # warning
        self.assertIn("synchronous_standby_names is empty", lines[0])
        self.assertNotIn("synchronous_commit", lines[0].split("lose (")[1].split(")")[0])


def main():
    if not os.environ.get("KAIROS_PGSTORE_TEST", ""):
        print("SKIP: built without -Dpostgres=enabled", file=sys.stderr)
        return pg_node.SKIP
    bindir = pg_fixture.find_bindir()
    if not bindir:
        print("SKIP: " + pg_fixture.skip_reason(), file=sys.stderr)
        return pg_node.SKIP
    if not os.access(os.path.join(bindir, "pg_basebackup"), os.X_OK) and \
            not os.access("/usr/bin/pg_basebackup", os.X_OK):
        print("SKIP: no pg_basebackup beside the server binaries", file=sys.stderr)
        return pg_node.SKIP
    global PAIR
    with pg_standby.PgPair(bindir) as pair:
        PAIR = pair
        pg_node.SERVER = pair
        prog = unittest.main(argv=[sys.argv[0], "-v"] + sys.argv[1:], exit=False)
        ok = prog.result.wasSuccessful()
        if not ok:
            for name, s in (("primary", pair.primary), ("standby", pair.standby)):
                sys.stderr.write("--- the %s's log's end ---\n%s\n" % (
                    name, "\n".join(s.server_log().splitlines()[-30:])))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
