#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""kairosctl retry is compare-and-set per tick (docs/design.md §3): of the
mandates of one tick (schedule, fired_at) at most one is unfinished, and
once one of them ended done a repeat needs --reason, whichever of them the
operator names.  Concurrent retries get exactly one winner (the act's
effect file shows one more line, not eight), and the rule holds after a
kill -9 and a restart (from the WALs and the archive).

The schedule's act appends its idempotency key to an effect file, then
waits for a gate file (so that a retry stays running as long as the test
needs) and fails unless an "ok" file exists."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kairos_harness import KAIROSCTL, Daemon, NotifySocket, write_config  # noqa: E402

AT = "2026-04-20T12:00:00Z"
CLIENTS = 8


def ctl_env():
    env = dict(os.environ)
    env.pop("KAIROS_CONTROL_SOCKET", None)
    env.pop("KAIROSCTL_TIMEOUT", None)
    return env


class RetryTick(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-retry-tick-")
        self.state = os.path.join(self.dir, "state")
        self.effects = os.path.join(self.dir, "effects")
        self.gate = os.path.join(self.dir, "gate")
        self.okfile = os.path.join(self.dir, "ok")
        act = os.path.join(self.dir, "act.sh")
        with open(act, "w") as f:
            f.write("#!/bin/sh\n"
                    "echo \"$KAIROS_IDEM_KEY\" >> %s\n"
                    "while [ ! -e %s ]; do sleep 0.05; done\n"
                    "[ -e %s ]\n" % (self.effects, self.gate, self.okfile))
        self.conf = write_config(self.dir, self.state, {
            "eff": {"Schedule": {"Cron": "0 0 1 1 *"}, "Mandate": {"MaxCycles": "1"},
                    "Exec": {"Act": "/bin/sh " + act}},
        }, daemon_extra="GracefulTimeoutSec=1\n")
        self.notify = NotifySocket(self.dir)
        self.start()

    def start(self):
        self.notify.clear()
        self.daemon = Daemon(self.state, config=self.conf, notify=self.notify)
        self.notify.wait_ready()
        self.sock = self.daemon.socket_path

    def tearDown(self):
        open(self.gate, "w").close()     # handlers orphaned by a kill -9 end
        rc = self.daemon.stop()
        self.daemon.proc.stderr.close()
        self.notify.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.assertEqual(rc, 0, self.daemon.log()[-3000:])

    def ctl(self, *args):
        return subprocess.run([KAIROSCTL, "--socket", self.sock, *args], capture_output=True,
                              text=True, env=ctl_env(), timeout=120)

    def ok(self, *args):
        r = self.ctl(*args)
        self.assertEqual((r.returncode, r.stderr), (0, ""), (args, r.stdout))
        return r.stdout

    def refused(self, *args):
        r = self.ctl(*args)
        self.assertEqual((r.returncode, r.stdout), (1, ""), (args, r.stderr))
        return r.stderr

    def lines(self):
        try:
            with open(self.effects) as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return []

    def wait_lines(self, n, timeout=60.0):
        deadline = time.monotonic() + timeout
        while len(self.lines()) < n:
            self.assertLess(time.monotonic(), deadline,
                            "fewer than %d effects: %r\n%s" % (n, self.lines(),
                                                               self.daemon.log()[-3000:]))
            time.sleep(0.02)
        return self.lines()

    def wait_status(self, m):
        """kairosctl wait: its exit status and the status it printed."""
        r = self.ctl("wait", m, "--timeout", "60")
        self.assertIn(r.returncode, (0, 1, 4), r)
        return r.returncode, r.stdout.split(": ")[1].split(" ")[0]

    def concurrent_retries(self, mandate, n, *extra):
        """n kairosctl retry clients let go at once: their results."""
        barrier = threading.Barrier(n)
        results = [None] * n

        def one(i):
            barrier.wait()
            results[i] = self.ctl("retry", mandate, *extra)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(150)
        return results

    def fire_failed(self):
        """The tick's first mandate: one effect, failed (no "ok" file)."""
        open(self.gate, "w").close()
        m = json.loads(self.ok("--json", "fire", "eff", "--at", AT))["mandate"]
        self.assertEqual(self.wait_status(m), (1, "failed"))
        self.assertEqual(len(self.lines()), 1)
        open(self.okfile, "w").close()
        return m

    def retry_running(self, m):
        """A retry of m whose act runs (waits for the gate)."""
        os.unlink(self.gate)
        out = self.ok("retry", m)
        winner = out.split(" retried as ")[1].split(" ")[0]
        self.assertEqual(self.wait_lines(2)[1], winner + "/act_001")
        return winner

    def end_done(self, w):
        """Let w's act end; w ends done (its interrupted act settled by hand
        if the recovery asked for a review)."""
        open(self.gate, "w").close()
        rc, st = self.wait_status(w)
        if st == "paused_review":
            self.ok("resolve", w, "act_001", "--done", "--reason", "it ran")
            rc, st = self.wait_status(w)
        self.assertEqual((rc, st), (0, "done"), self.daemon.log()[-3000:])

    def test_concurrent_retries_one_winner(self):
        m = self.fire_failed()
        os.unlink(self.gate)
        results = self.concurrent_retries(m, CLIENTS, "--reason", "the disk is back")
        won = [r for r in results if r.returncode == 0]
        lost = [r for r in results if r.returncode != 0]
        self.assertEqual(len(won), 1, [(r.returncode, r.stdout, r.stderr) for r in results])
        winner = won[0].stdout.split(" retried as ")[1].split(" ")[0]
        self.assertIn("(retry 1, ", won[0].stdout)
        for r in lost:
            self.assertEqual((r.returncode, r.stdout), (1, ""), r.stderr)
            self.assertRegex(r.stderr, r"^kairosctl: the tick of %s \(eff at %s\) has an "
                                       r"unfinished retry: mandate %s is (running|runnable); "
                                       r"one retry of a tick at a time\n$" % (m, AT, winner))
        self.assertEqual(self.wait_lines(2), [m + "/act_001", winner + "/act_001"])
        # a retry of the retry is refused too (it has not ended)
        self.assertIn("mandate %s is running: only a mandate that has ended" % winner,
                      self.refused("retry", winner, "--reason", "x"))
        self.assertEqual(json.loads(self.ok("--json", "show", m))["retried_by"], [winner])
        self.end_done(winner)
        self.assertEqual(len(self.lines()), 2)

    def test_a_done_tick_needs_a_reason(self):
        m = self.fire_failed()
        w = self.retry_running(m)
        self.end_done(w)
        # the tick ended done (as the retry): retrying the failed first
        # mandate repeats its work, so it needs --reason too
        err = self.refused("retry", m)
        self.assertEqual(err, "kairosctl: the tick of %s (eff at %s) ended done as mandate %s: "
                              "retrying it repeats its work; give --reason to do it anyway\n"
                         % (m, AT, w))
        # ... also after a restart (from the archive)
        self.assertEqual(self.daemon.stop(), 0)
        self.daemon.proc.stderr.close()
        self.start()
        self.assertIn("ended done as mandate %s" % w, self.refused("retry", m))
        self.assertEqual(len(self.lines()), 2)
        # with a reason: one more run, one more effect
        out = self.ok("retry", m, "--reason", "once more on purpose")
        second = out.split(" retried as ")[1].split(" ")[0]
        self.assertIn("(retry 2, ", out)
        self.assertEqual(self.wait_status(second), (0, "done"))
        self.assertEqual(self.lines(), [m + "/act_001", w + "/act_001", second + "/act_001"])

    def test_an_unfinished_retry_survives_kill_9(self):
        m = self.fire_failed()
        w = self.retry_running(m)
        # kill -9 while the retry's act runs: after the restart the retry
        # (from its WAL) still blocks the tick
        self.daemon.kill()
        self.daemon.proc.stderr.close()
        self.start()
        err = self.refused("retry", m, "--reason", "after the crash")
        self.assertRegex(err, r"has an unfinished retry: mandate %s is (running|paused_review)"
                         % w)
        self.assertEqual(len(self.lines()), 2)
        self.end_done(w)
        self.assertEqual(len(self.lines()), 2)


if __name__ == "__main__":
    unittest.main(verbosity=2)
