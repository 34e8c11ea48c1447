#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A short database outage changes nothing: one kairosd node (LeaseSec=3)
on a private PostgreSQL (pg_fixture.py), an act whose effect is a tool
call (kairosctl tool run, appending to an outbox) followed by a long run.

- The postmaster is killed (kill -9) during the act and started again at
  once (an outage shorter than the lease): the mandate ends done, the
  effect happened once, no record `failed` anywhere.
- The heartbeat gets no answer while the database is up for everything
  else (KAIROS_TEST_RENEW_HOLD, -Dtest_hooks=true): the deadline passes
  and the deadman kills the handler.  The node records nothing at that
  epoch (before, the handler's death was a step failure that committed at
  once: `failed` at epoch 1); the mandate is taken again at epoch 2 once
  its lease ran out, by the same node or by another one, and decided by
  evidence (the tool call's): done, the effect once.

Environment: KAIROSD, KAIROSCTL, KAIROS_PGSTORE_TEST (empty when built
without -Dpostgres=enabled); KAIROS_OUTAGE_ROUNDS: postmaster kills of the
first case (1); KAIROS_OUTAGE_LEASE_SEC: LeaseSec= (3);
KAIROS_OUTAGE_DOWN_SEC: how long the postmaster stays dead before its
restart (0).  Exit 77 (skipped, with the reason) without PostgreSQL
support or the server binaries.  No sleeps as synchronization: polls with a
deadline."""
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import pg_fixture  # noqa: E402
import pg_node  # noqa: E402

PG = None
LEASE = int(os.environ.get("KAIROS_OUTAGE_LEASE_SEC", "3"))
# how long the postmaster stays dead in the first case (beyond its restart)
DOWN = float(os.environ.get("KAIROS_OUTAGE_DOWN_SEC", "0"))

# the effect (once, through the database), then a long run the first time
ACT = ("#!/bin/sh\n"
       "\"$KAIROSCTL\" tool run --key \"out-$KAIROS_IDEM_KEY\" -- sh -c "
       "'echo \"$0\" >> \"$1\"' \"$KAIROS_MANDATE_ID\" \"$OUT/outbox\" >/dev/null || exit 1\n"
       "if [ ! -e \"$OUT/ran-$KAIROS_MANDATE_ID\" ]; then\n"
       "  touch \"$OUT/ran-$KAIROS_MANDATE_ID\"\n"
       "  echo $$ > \"$OUT/pid-$KAIROS_MANDATE_ID\"\n"
       "  sleep 7\n"
       "fi\n"
       "echo '{\"ok\":true}'\n")

wait_for = pg_node.wait_for


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is dead for us
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def postmaster_pid(pg):
    with open(os.path.join(pg.data, "postmaster.pid")) as f:
        return int(f.readline())


def pg_start(pg):
    """pg_ctl start as pg_fixture does (the same options); retried while
    the killed server's backends are still going."""
    opts = (f"-k {pg.dir} -p {pg_fixture.PORT} -c listen_addresses='' -c fsync=off "
            "-c full_page_writes=off -c max_connections=60 -c shared_buffers=16MB "
            "-c log_min_messages=warning")
    deadline = time.monotonic() + 60
    while True:
        try:
            pg._run([os.path.join(pg.bindir, "pg_ctl"), "-D", pg.data, "-l", pg.log,
                     "-o", opts, "-w", "-t", "60", "start"])
            return
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def kill_postmaster(pg):
    pid = postmaster_pid(pg)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid), "the postmaster to die", timeout=10)


class Outage(pg_node.TwoNodes):
    prefix = "outage"
    DEBUG = "OUTAGE_DEBUG"

    def make_node(self, name):
        path = os.path.join(self.dir, "act.sh")
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write(ACT)
            os.chmod(path, 0o755)
        self.hold = os.path.join(self.dir, "hold-renew-n1")
        scheds = {"job": {"Schedule": {"Cron": "0 0 1 1 *"},
                          "Exec": {"Act": path, "EffectsVia": "kairosctl",
                                   "Environment": "OUT=%s KAIROSCTL=%s" % (
                                       self.out, os.path.abspath(pg_node.KAIROSCTL))}}}
        n = pg_node.Node(self.dir, name, self.ci, scheds, LEASE)
        env = {"KAIROS_TEST_RENEW_HOLD": os.path.join(self.dir, "hold-renew-" + name)}
        orig = n.start

        def start():
            # the hook's file, given to this node only
            saved = pg_node.Daemon
            pg_node.Daemon = lambda *a, **kw: saved(*a, env=env, **kw)
            try:
                orig()
            finally:
                pg_node.Daemon = saved
        n.start = start
        return n

    def setUp(self):
        super().setUp()
        # one node but where a test wants n2 to take the mandate over
        if not self._testMethodName.endswith("_other_node"):
            self.n2.close(graceful=True)

    def fire(self, at):
        rc, out, err = self.n1.ctl("fire", "job", "--at", at)
        self.assertEqual(rc, 0, err)
        return out["mandate"]

    def running_act(self, mid):
        p = os.path.join(self.out, "pid-" + mid)
        wait_for(lambda: os.path.exists(p) and open(p).read().strip(), "the act to run")
        return int(open(p).read())

    def effects(self):
        try:
            with open(os.path.join(self.out, "outbox")) as f:
                return f.read().split()
        except FileNotFoundError:
            return []

    def failed_rows(self, mid):
        return self.sql("SELECT epoch, convert_from(line, 'UTF8') FROM kairos_wal WHERE "
                        "mandate_id = '%s' AND convert_from(line, 'UTF8') LIKE '%%failed%%'"
                        % mid)

    def lease_left(self):
        rc, out, err = self.n1.ctl("status")
        self.assertEqual(rc, 0, err)
        return out["cluster"]["lease_left_ms"]

    def just_before_a_renewal(self):
        """Wait until the next renewal is due in a quarter of a second: the
        outage starts when the node's deadline is nearest (the worst case)."""
        interval = LEASE * 1000 // 3
        last = [self.lease_left()]

        def renewed():
            cur = self.lease_left()
            jumped = cur > last[0] + 200
            last[0] = cur
            return cur if jumped else None
        top = wait_for(renewed, "a renewal", timeout=3 * LEASE)
        wait_for(lambda: self.lease_left() <= top - (interval - 250), "the next renewal's eve",
                 timeout=3 * LEASE)

    def test_postmaster_killed_shorter_than_the_lease(self):
        rounds = int(os.environ.get("KAIROS_OUTAGE_ROUNDS", "1"))
        for i in range(rounds):
            mid = self.fire("2026-03-%02dT00:00:00Z" % (i + 1))
            self.running_act(mid)
            self.just_before_a_renewal()
            t0 = time.monotonic()
            kill_postmaster(PG)
            if DOWN:
                time.sleep(DOWN)   # the outage's length, not a synchronization
            pg_start(PG)
            down = time.monotonic() - t0
            self.assertLess(down, LEASE, "the outage was not shorter than the lease")
            wait_for(lambda: (self.db_row(mid) or ("",))[0] in ("succeeded", "failed",
                                                                 "paused"),
                     "the mandate to end", timeout=60)
            self.assertEqual(self.db_row(mid)[0], "succeeded",
                             "round %d, down %.1f s: %r\n%s" % (i, down, self.failed_rows(mid),
                                                                 self.n1.daemon.log()[-3000:]))
            self.assertEqual(self.failed_rows(mid), [])
            self.assertEqual(self.effects().count(mid), 1, self.effects())
            print("round %d: down %.1f s, ended done at epoch %s (2: the deadman fired, decided "
                  "by evidence)" % (i, down, self.db_row(mid)[2]), file=sys.stderr)

    def test_deadman_fires_nothing_recorded_at_the_old_epoch(self):
        self.deadman_fires("n1")

    def test_deadman_fires_other_node(self):
        self.deadman_fires("n2")

    def deadman_fires(self, next_holder):
        if LEASE > 5:
            self.skipTest("the act's run (7 s) ends before the deadline of a longer lease")
        mid = self.fire("2026-04-01T00:00:00Z")
        pid = self.running_act(mid)
        self.assertEqual(self.effects(), [mid])
        open(self.hold, "w").close()
        try:
            # the deadline passes: the deadman kills the act
            wait_for(lambda: not alive(pid), "the deadman to kill the act", timeout=15)
        except AssertionError:
            if "KAIROS_TEST_RENEW_HOLD" not in self.n1.daemon.log():
                self.skipTest("kairosd was built without -Dtest_hooks=true")
            raise
        wait_for(lambda: "killed by this node's fence" in self.n1.daemon.log()
                 or self.failed_rows(mid), "the node to see the kill")
        if next_holder == "n2":
            # n1 stays cut from its heartbeat until n2 took the mandate
            wait_for(lambda: (self.db_row(mid) or ("", ""))[1] == "n2" or self.failed_rows(mid),
                     "n2 to take it over", timeout=30)
        os.unlink(self.hold)
        wait_for(lambda: (self.db_row(mid) or ("",))[0] in ("succeeded", "failed", "paused"),
                 "the mandate to end", timeout=60)
        log = self.n1.daemon.log()
        self.assertEqual(self.failed_rows(mid), [], log[-3000:])
        row = self.db_row(mid)
        self.assertEqual(row[0], "succeeded", log[-3000:])
        self.assertGreaterEqual(int(row[2]), 2, row)   # decided by its next holder
        self.assertEqual(row[1], next_holder, row)
        holder = self.n1 if next_holder == "n1" else self.n2
        self.assertIn("deciding its interrupted steps", holder.daemon.log())
        self.assertEqual(self.effects(), [mid])


if __name__ == "__main__":
    sys.exit(pg_node.run_tests(lambda pg: globals().__setitem__("PG", pg)))
