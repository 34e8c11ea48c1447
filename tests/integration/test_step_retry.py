#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Step retries (RetryAttempts=, RetryBackoffSec=, RetryOn=; kairosd(8)): a
failed step runs again under the same KAIROS_IDEM_KEY after a backoff kept
in the WAL (retry_wait), a kill -9 during the backoff resumes it at its due
time, cancel ends it, timeouts are not retried by default, and exhausted
attempts fail the cycle as before, with the attempts in show.

KAIROS_TEST_RETRY_KILLS: how many kill -9 during a backoff (default 3)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kairos_harness import KAIROSCTL, Daemon, NotifySocket, write_config  # noqa: E402

KILLS = int(os.environ.get("KAIROS_TEST_RETRY_KILLS", "3"))


def ctl_env():
    env = dict(os.environ)
    env.pop("KAIROS_CONTROL_SOCKET", None)
    env.pop("KAIROSCTL_TIMEOUT", None)
    return env


class StepRetry(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-step-retry-")
        self.state = os.path.join(self.dir, "state")
        self.attempts = os.path.join(self.dir, "attempts")
        self.effects = os.path.join(self.dir, "effects")
        self.daemon = None
        self.notify = NotifySocket(self.dir)

    def configure(self, exec_keys, act_body):
        act = os.path.join(self.dir, "act.sh")
        with open(act, "w") as f:
            f.write("#!/bin/sh\n"
                    "echo \"$KAIROS_IDEM_KEY $KAIROS_ATTEMPT $(date +%%s.%%N)\" >> %s\n"
                    "n=$(grep -c \"^$KAIROS_IDEM_KEY \" %s)\n%s\n"
                    % (self.attempts, self.attempts, act_body))
        keys = {"Act": "/bin/sh " + act}
        keys.update(exec_keys)
        self.conf = write_config(self.dir, self.state, {
            "flaky": {"Schedule": {"Cron": "0 0 1 1 *"}, "Exec": keys},
        }, daemon_extra="GracefulTimeoutSec=1\n")

    def start(self):
        self.notify.clear()
        self.daemon = Daemon(self.state, config=self.conf, notify=self.notify)
        self.notify.wait_ready()

    def tearDown(self):
        if self.daemon:
            rc = self.daemon.stop()
            self.daemon.proc.stderr.close()
            self.assertEqual(rc, 0, self.daemon.log()[-3000:])
        self.notify.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def ctl(self, *args):
        return subprocess.run([KAIROSCTL, "--socket", self.daemon.socket_path, *args],
                              capture_output=True, text=True, env=ctl_env(), timeout=120)

    def ok(self, *args):
        r = self.ctl(*args)
        self.assertEqual((r.returncode, r.stderr), (0, ""), (args, r.stdout))
        return r.stdout

    def fire(self, at="2026-04-20T12:00:00Z"):
        return json.loads(self.ok("--json", "fire", "flaky", "--at", at))["mandate"]

    def wait(self, m):
        r = self.ctl("wait", m, "--timeout", "30")
        self.assertIn(": ", r.stdout, (r, self.ctl("show", m).stdout,
                                       self.daemon.log()[-3000:]))
        return r.stdout.split(": ")[1].split(" ")[0]

    def rows(self, key=None):
        try:
            with open(self.attempts) as f:
                rows = [line.split() for line in f.read().splitlines()]
        except FileNotFoundError:
            return []
        return [r for r in rows if key is None or r[0] == key]

    def lines(self, path):
        try:
            with open(path) as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return []

    def wal_retry_waits(self, m):
        path = os.path.join(self.state, "wal", m + ".wal.jsonl")
        try:
            with open(path) as f:
                return [json.loads(line) for line in f
                        if line.startswith("{\"op\":\"retry_wait\"")]
        except FileNotFoundError:
            return []

    def wait_for(self, pred, what, timeout=30.0):
        deadline = time.monotonic() + timeout
        while True:
            v = pred()
            if v:
                return v
            self.assertLess(time.monotonic(), deadline,
                            "%s\n%s" % (what, self.daemon.log()[-3000:]))
            time.sleep(0.01)

    def test_flaky_act_retried_with_backoff(self):
        # fails twice, then succeeds (and makes its effect)
        self.configure({"RetryAttempts": "3", "RetryBackoffSec": "0.3 factor=2"},
                       "[ \"$n\" -ge 3 ] || exit 1\necho \"$KAIROS_IDEM_KEY\" >> %s"
                       % self.effects)
        self.start()
        m = self.fire()
        self.assertEqual(self.wait(m), "done", self.daemon.log()[-3000:])
        rows = self.rows()
        self.assertEqual([r[1] for r in rows], ["1", "2", "3"])
        self.assertEqual({r[0] for r in rows}, {m + "/act_001"})
        self.assertEqual(self.lines(self.effects), [m + "/act_001"])
        t = [float(r[2]) for r in rows]
        for got, want in ((t[1] - t[0], 0.3), (t[2] - t[1], 0.6)):
            print("backoff: %.3f s for %.3f s" % (got, want), file=sys.stderr)
            self.assertLess(abs(got - want), want * 0.1, (got, want))
        show = json.loads(self.ok("--json", "show", m))
        act = [s for s in show["plans"][0]["steps"] if s["step_id"] == "act_001"][0]
        self.assertEqual([(r["attempt"], r["error_class"]) for r in act["retries"]],
                         [(1, "exit_status"), (2, "exit_status")])
        self.assertIn("Retried attempts:", self.ok("show", m))
        metrics = self.ok("metrics")
        self.assertIn('kairos_step_retries_total{phase="act"} 2', metrics)

    def test_kill_9_during_backoff_resumes_it(self):
        self.configure({"RetryAttempts": "1", "RetryBackoffSec": "1.5"},
                       "[ \"$n\" -ge 2 ] || exit 1\necho \"$KAIROS_IDEM_KEY\" >> %s"
                       % self.effects)
        self.start()
        for i in range(KILLS):
            m = self.fire("2026-04-20T12:%02d:00Z" % i)
            rec = self.wait_for(lambda: self.wal_retry_waits(m), "no retry_wait")[0]
            due = rec["due_ms"] / 1000.0
            # part of the backoff passes, then kairosd dies
            self.wait_for(lambda: time.time() >= due - 0.8, "clock")
            self.daemon.kill()
            self.daemon.proc.stderr.close()
            self.start()
            self.assertEqual(self.wait(m), "done", self.daemon.log()[-3000:])
            rows = self.rows(m + "/act_001")
            self.assertEqual([r[1] for r in rows], ["1", "2"])
            # resumed at its due time: not a backoff started again
            late = float(rows[1][2]) - due
            print("kill %d: attempt 2 ran %+.3f s from its due time" % (i + 1, late),
                  file=sys.stderr)
            self.assertLess(abs(late), 0.3, (rows, due))
        effects = self.lines(self.effects)
        self.assertEqual(len(effects), KILLS)
        self.assertEqual(len(set(effects)), KILLS)

    def test_cancel_during_backoff(self):
        self.configure({"RetryAttempts": "3", "RetryBackoffSec": "30"}, "exit 1")
        self.start()
        m = self.fire()
        self.wait_for(lambda: self.wal_retry_waits(m), "no retry_wait")
        t0 = time.monotonic()
        self.ok("cancel", m, "--reason", "enough")
        self.assertEqual(self.wait(m), "cancelled")
        self.assertLess(time.monotonic() - t0, 5)
        self.assertEqual(len(self.rows()), 1)

    def test_stop_during_backoff_leaves_it_to_the_next_start(self):
        self.configure({"RetryAttempts": "1", "RetryBackoffSec": "30"}, "exit 1")
        self.start()
        m = self.fire()
        rec = self.wait_for(lambda: self.wal_retry_waits(m), "no retry_wait")[0]
        t0 = time.monotonic()
        self.assertEqual(self.daemon.stop(), 0)   # not held up by the wait
        self.assertLess(time.monotonic() - t0, 5)
        self.daemon.proc.stderr.close()
        self.start()
        show = json.loads(self.ok("--json", "show", m))
        self.assertEqual(show["status"], "running")
        self.assertIn("retry_wait: act_001 runs again in", show["reason"])
        self.assertEqual(self.wal_retry_waits(m), [rec])
        self.assertEqual(len(self.rows()), 1)

    def test_timeout_not_retried_by_default(self):
        self.configure({"RetryAttempts": "3", "RetryBackoffSec": "0.1", "TimeoutSec": "1"},
                       "exec sleep 30")
        self.start()
        m = self.fire()
        self.assertEqual(self.wait(m), "failed")
        self.assertEqual(len(self.rows()), 1)
        self.assertEqual(self.wal_retry_waits(m), [])

    def test_exhausted_attempts_fail_the_cycle(self):
        self.configure({"RetryAttempts": "2", "RetryBackoffSec": "0.1"}, "exit 3")
        self.start()
        m = self.fire()
        self.assertEqual(self.wait(m), "failed")
        self.assertEqual([r[1] for r in self.rows()], ["1", "2", "3"])
        text = self.ok("show", m)
        self.assertIn("act_001 attempt 1: started ", text)
        self.assertIn("act_001 attempt 2: started ", text)
        self.assertIn("(exit_status: exit status 3", text)
        # the same without kairosd (read from the state directory)
        self.assertEqual(self.daemon.stop(), 0)
        self.daemon.proc.stderr.close()
        self.daemon = None
        r = subprocess.run([KAIROSCTL, "show", "--state-dir", self.state, m],
                           capture_output=True, text=True, env=ctl_env(), timeout=60)
        self.assertEqual((r.returncode, r.stderr), (0, ""))
        self.assertIn("act_001 attempt 2: started ", r.stdout)

    def wal_records(self, m, op):
        for d in ("wal", "archive"):
            path = os.path.join(self.state, d, m + ".wal.jsonl")
            if os.path.exists(path):
                with open(path) as f:
                    return [json.loads(x) for x in f if json.loads(x)["op"] == op]
        import gzip
        with gzip.open(os.path.join(self.state, "archive", m + ".wal.jsonl.gz"), "rt") as f:
            return [json.loads(x) for x in f if json.loads(x)["op"] == op]

    def test_journaled_act_decided_by_its_evidence(self):
        # the act's effect goes through kairosctl tool run, then the act
        # fails: the retry is decided by the evidence (effects_journaled)
        # and its tool run is answered from the store: one effect
        self.configure({"RetryAttempts": "2", "RetryBackoffSec": "0.1",
                        "EffectsVia": "kairosctl"},
                       "\"$KAIROSCTL\" tool run --key \"$KAIROS_IDEM_KEY\" -- "
                       "sh -c 'echo \"$KAIROS_IDEM_KEY\" >> %s' || exit 9\n"
                       "[ \"$n\" -ge 2 ] || exit 1" % self.effects)
        self.start()
        m = self.fire()
        self.assertEqual(self.wait(m), "done", self.daemon.log()[-3000:])
        self.assertEqual([r[1] for r in self.rows()], ["1", "2"])
        self.assertEqual(self.lines(self.effects), [m + "/act_001"])
        resets = [r for r in self.wal_records(m, "transition") if r.get("reset")]
        self.assertEqual(len(resets), 1, resets)
        self.assertEqual(resets[0]["evidence"]["reason"], "effects_journaled")

    def test_interrupted_call_goes_to_review(self):
        # the act's tool call is cut off (its kairosctl killed), then the
        # act fails: no blind re-run, a human decides (tool_call_interrupted)
        self.configure({"RetryAttempts": "2", "RetryBackoffSec": "0.1",
                        "EffectsVia": "kairosctl"},
                       "\"$KAIROSCTL\" tool run --key \"$KAIROS_IDEM_KEY\" -- "
                       "sh -c 'echo x >> %s; kill -9 $PPID; sleep 5'\nexit 1" % self.effects)
        self.start()
        m = self.fire()
        self.assertEqual(self.wait(m), "paused_review", self.daemon.log()[-3000:])
        self.assertEqual(len(self.rows()), 1, self.daemon.log()[-4000:])
        show = json.loads(self.ok("--json", "show", m))
        self.assertEqual(show["reason"], "tool_call_interrupted", show)

    def test_bad_values_name_file_and_line(self):
        self.configure({"RetryAttempts": "many", "ActRetryBackoffSec": "2 factor=0",
                        "RetryOn": "cancelled"}, "exit 0")
        r = subprocess.run([os.environ.get("KAIROSD", "kairosd"), "--config", self.conf,
                            "--check-config"], capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertRegex(r.stderr, r"flaky\.conf:\d+: RetryAttempts=")
        self.assertRegex(r.stderr, r"flaky\.conf:\d+: ActRetryBackoffSec=.*factor=")
        self.assertRegex(r.stderr, r"flaky\.conf:\d+: RetryOn=.*\"cancelled\"")


if __name__ == "__main__":
    unittest.main()
