#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Tool calls are attributed to the step whose handler made them
(docs/design.md §8, evidence beyond the WAL): kairosd maps the caller's
SO_PEERCRED pid to its process group and the group to the running step, and
records that owner (mandate, step, attempt) in the idempotency entry and its
log record.  The caller's environment is not trusted: a kairosctl started
outside any handler, even with a step's KAIROS_* variables, owns nothing; a
process that left the handler's process group owns nothing either.
`kairosctl idem get` shows the owner.  No sleeps as synchronization."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kairos_harness import KAIROSCTL, Client, Daemon, NotifySocket, write_config  # noqa: E402

ACT = r"""#!/bin/sh
set -e
"$KAIROSCTL" tool run --key "run-$KAIROS_IDEM_KEY" -- sh -c 'echo ran >> "$0"' "$OUT/ran"
printf 'report\n' | "$KAIROSCTL" tool write --key "write-$KAIROS_IDEM_KEY" "$ROOT/report"
# a process that leaves the handler's process group is not the step
setsid "$KAIROSCTL" tool run --key "escaped-$KAIROS_IDEM_KEY" -- true
echo '{"ok":true}'
"""


class ToolOwner(unittest.TestCase):
    ENV = None
    act = ACT

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-owner-")
        self.state = os.path.join(self.dir, "state")
        self.root = os.path.join(self.dir, "root")
        self.out = os.path.join(self.dir, "out")
        os.makedirs(self.root)
        os.makedirs(self.out)
        act = os.path.join(self.dir, "act.sh")
        with open(act, "w") as f:
            f.write(self.act)
        os.chmod(act, 0o755)
        sched = {"Schedule": {"Cron": "0 0 1 1 *"},
                 "Exec": {"Act": act,
                          "Environment": "OUT=%s ROOT=%s" % (self.out, self.root)}}
        conf = write_config(self.dir, self.state, {"job": sched},
                            daemon_extra="[Idempotency]\nWriteRoots=%s\n" % self.root)
        self.notify = NotifySocket(self.dir)
        self.daemon = Daemon(self.state, config=conf, notify=self.notify, env=self.ENV)
        self.notify.wait_ready()

    def tearDown(self):
        rc = self.daemon.stop()
        self.daemon.proc.stderr.close()
        self.notify.close()
        self.assertEqual(rc, 0, self.daemon.log()[-3000:])
        shutil.rmtree(self.dir, ignore_errors=True)

    def idem_get(self, key):
        c = Client(self.daemon.socket_path)
        try:
            return c.call("idem-get", key=key)
        finally:
            c.close()

    def test_calls_owned_by_the_step(self):
        c = Client(self.daemon.socket_path)
        r = c.call("fire", schedule="job", fired_at="2030-01-01T00:00:00Z")
        c.close()
        self.assertTrue(r["ok"], r)
        mid = r["result"]["mandate"]
        self.daemon.wait_log("mandate %s done after" % mid, timeout=60)
        step = "act_001"
        key = "%s/%s" % (mid, step)
        owner = {"mandate": mid, "step": step, "attempt": 1}
        for k in ("cmd:run-" + key, "kairos.write:write-" + key):
            g = self.idem_get(k)
            self.assertTrue(g["ok"], g)
            self.assertEqual(g["result"]["state"], "completed", g)
            self.assertEqual(g["result"]["owner"], owner, g)
        p = subprocess.run([KAIROSCTL, "--socket", self.daemon.socket_path, "idem", "get",
                            "cmd:run-" + key], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("owner:       %s act_001 (attempt 1)" % mid, p.stdout)
        g = self.idem_get("cmd:escaped-" + key)
        self.assertTrue(g["ok"], g)
        self.assertIsNone(g["result"]["owner"], g)
        # the log record carries the owner too
        with open(os.path.join(self.state, "idem", "idem.jsonl")) as f:
            recs = [json.loads(line) for line in f if line.strip()]
        owned = [r for r in recs if r.get("owner") == owner]
        self.assertGreaterEqual(len(owned), 4, recs)  # begin + complete of each

    def test_environment_is_not_trusted(self):
        env = dict(os.environ)
        env.update({"KAIROS_MANDATE_ID": "mnd_plan_000000000000", "KAIROS_STEP_ID": "act_001",
                    "KAIROS_ATTEMPT": "1", "KAIROS_IDEM_KEY": "mnd_plan_000000000000/act_001"})
        p = subprocess.run([KAIROSCTL, "--socket", self.daemon.socket_path, "tool", "run",
                            "--key", "outsider", "--", "true"], env=env, capture_output=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        g = self.idem_get("cmd:outsider")
        self.assertTrue(g["ok"], g)
        self.assertIsNone(g["result"]["owner"], g)
        # a caller claiming an epoch (KAIROS_EPOCH: cluster mode's handlers)
        # from no running step is fenced: nothing is claimed, nothing runs
        env["KAIROS_EPOCH"] = "1"
        p = subprocess.run([KAIROSCTL, "--socket", self.daemon.socket_path, "tool", "run",
                            "--key", "epoch-outsider", "--", "sh", "-c", "exit 9"], env=env,
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("fenced", p.stderr)
        g = self.idem_get("cmd:epoch-outsider")
        self.assertFalse(g["ok"], g)


# the handler is the call: it asks kairosd at once (exec), before the
# runner's report of its start can reach the loop
EXEC_ACT = r"""#!/bin/sh
exec "$KAIROSCTL" tool run --key "run-$KAIROS_IDEM_KEY" -- sh -c 'echo ran >> "$0"' "$OUT/ran"
"""


class LateStartReport(ToolOwner):
    """The runner's report of the handler's start reaches the loop 300 ms
    after the handler runs (KAIROS_TEST_START_REPORT_DELAY_MS,
    -Dtest_hooks=true): the call it makes meanwhile waits for the report
    and is still the step's (it was taken for a call from no step; in
    cluster mode refused as fenced)."""
    ENV = {"KAIROS_TEST_START_REPORT_DELAY_MS": "300"}
    act = EXEC_ACT

    def test_calls_owned_by_the_step(self):
        c = Client(self.daemon.socket_path)
        r = c.call("fire", schedule="job", fired_at="2030-01-01T00:00:00Z")
        c.close()
        self.assertTrue(r["ok"], r)
        mid = r["result"]["mandate"]
        self.daemon.wait_log("mandate %s done after" % mid, timeout=60)
        g = self.idem_get("cmd:run-%s/act_001" % mid)
        self.assertTrue(g["ok"], g)
        self.assertEqual(g["result"]["state"], "completed", g)
        self.assertEqual(g["result"]["owner"], {"mandate": mid, "step": "act_001",
                                                "attempt": 1}, g)

    def test_environment_is_not_trusted(self):
        self.skipTest("ToolOwner's")


if __name__ == "__main__":
    unittest.main(verbosity=2)
