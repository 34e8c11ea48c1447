#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""kairosctl retry MANDATE --from STEP (docs/design.md §6, "Carried steps"):
the new mandate takes the steps of STEP's cycle before STEP as completed,
with their recorded results, durably (a kill -9 right after the retry's
reply keeps them), never runs them, and gives them to STEP on stdin exactly
as if they had run; show marks them carried.  A STEP that is not in the
mandate, after a step that did not complete, a mandate still running and a
second unfinished retry of the tick are refused with a clear error.

Every handler appends its KAIROS_IDEM_KEY (MANDATE/STEP) to a calls file
and prints a result naming its phase; act keeps its stdin, waits for a gate
file and fails unless an "ok" file exists."""
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

AT = "2026-04-20T12:00:00Z"
EARLY = ("observe", "orient", "decide")


def ctl_env():
    env = dict(os.environ)
    env.pop("KAIROS_CONTROL_SOCKET", None)
    env.pop("KAIROSCTL_TIMEOUT", None)
    return env


class RetryFrom(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-retry-from-")
        self.state = os.path.join(self.dir, "state")
        self.calls = os.path.join(self.dir, "calls")
        self.gate = os.path.join(self.dir, "gate")
        self.okfile = os.path.join(self.dir, "ok")
        self.stdin_dir = os.path.join(self.dir, "stdin")
        os.mkdir(self.stdin_dir)
        h = os.path.join(self.dir, "h.sh")
        with open(h, "w") as f:
            f.write("#!/bin/sh\n"
                    "echo \"$KAIROS_IDEM_KEY\" >> %s\n"
                    "echo '{\"phase\":\"'$1'\",\"n\":[1,2.50,\"x\"]}'\n" % self.calls)
        act = os.path.join(self.dir, "act.sh")
        with open(act, "w") as f:
            f.write("#!/bin/sh\n"
                    "cat > %s/\"${KAIROS_IDEM_KEY%%%%/*}\"\n"
                    "echo \"$KAIROS_IDEM_KEY\" >> %s\n"
                    "while [ ! -e %s ]; do sleep 0.05; done\n"
                    "[ -e %s ] && echo '\"acted\"'\n"
                    % (self.stdin_dir, self.calls, self.gate, self.okfile))
        exe = {p.capitalize(): "/bin/sh %s %s" % (h, p) for p in EARLY}
        exe["Act"] = "/bin/sh " + act
        # two cycles: act_001 succeeds, act_002 fails until "ok" exists; the
        # reflect of cycle 2 says done
        act2 = os.path.join(self.dir, "act2.sh")
        with open(act2, "w") as f:
            f.write("#!/bin/sh\n"
                    "cat > %s/\"${KAIROS_IDEM_KEY%%%%/*}\"_${KAIROS_IDEM_KEY##*/}\n"
                    "echo \"$KAIROS_IDEM_KEY\" >> %s\n"
                    "case $KAIROS_IDEM_KEY in */act_001) echo '\"a1\"'; exit 0;; esac\n"
                    "[ -e %s ] && echo '\"acted\"'\n" % (self.stdin_dir, self.calls, self.okfile))
        reflect = os.path.join(self.dir, "reflect.sh")
        with open(reflect, "w") as f:
            f.write("#!/bin/sh\n"
                    "echo \"$KAIROS_IDEM_KEY\" >> %s\n"
                    "case $KAIROS_IDEM_KEY in */reflect_001) echo '{\"again\":1}';;\n"
                    "*) echo '{\"kairos\":{\"done\":true}}';; esac\n" % self.calls)
        exe2 = dict(exe, Act="/bin/sh " + act2, Reflect="/bin/sh " + reflect)
        self.conf = write_config(self.dir, self.state, {
            "eff": {"Schedule": {"Cron": "0 0 1 1 *"}, "Mandate": {"MaxCycles": "1"},
                    "Exec": exe},
            "two": {"Schedule": {"Cron": "0 0 1 1 *"}, "Mandate": {"MaxCycles": "2"},
                    "Exec": exe2},
        }, daemon_extra="GracefulTimeoutSec=1\n")
        self.notify = NotifySocket(self.dir)
        self.start()

    def start(self):
        self.notify.clear()
        self.daemon = Daemon(self.state, config=self.conf, notify=self.notify)
        self.notify.wait_ready()
        self.sock = self.daemon.socket_path

    def tearDown(self):
        open(self.gate, "w").close()
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

    def called(self, m):
        """The steps of mandate m whose handler ran, in order."""
        try:
            with open(self.calls) as f:
                keys = f.read().splitlines()
        except FileNotFoundError:
            return []
        return [k.split("/")[1] for k in keys if k.split("/")[0] == m]

    def wait_called(self, m, step, timeout=60.0):
        deadline = time.monotonic() + timeout
        while step not in self.called(m):
            self.assertLess(time.monotonic(), deadline,
                            "%s did not run in %s\n%s" % (step, m, self.daemon.log()[-3000:]))
            time.sleep(0.02)

    def wait_status(self, m):
        r = self.ctl("wait", m, "--timeout", "60")
        self.assertIn(r.returncode, (0, 1, 4), r)
        return r.returncode, r.stdout.split(": ")[1].split(" ")[0]

    def fire_failed(self):
        """The tick's first mandate: every phase ran, act failed."""
        open(self.gate, "w").close()
        m = json.loads(self.ok("--json", "fire", "eff", "--at", AT))["mandate"]
        self.assertEqual(self.wait_status(m), (1, "failed"))
        self.assertEqual(self.called(m), ["observe_001", "orient_001", "decide_001", "act_001"])
        open(self.okfile, "w").close()
        return m

    def retry_from(self, m, step):
        out = self.ok("retry", m, "--from", step)
        self.assertRegex(out, r"^%s retried as \S+ \(retry 1, (running|runnable)\) from %s\n$"
                         % (m, step))
        return out.split(" retried as ")[1].split(" ")[0]

    def stdin_of(self, m):
        with open(os.path.join(self.stdin_dir, m)) as f:
            return json.loads(f.read())

    def check_carried(self, m, w):
        """w's early steps are carried from m's, with m's results."""
        orig = json.loads(self.ok("--json", "show", m))["plans"][0]["steps"]
        steps = json.loads(self.ok("--json", "show", w))["plans"][0]["steps"]
        for i, p in enumerate(EARLY):
            s = steps[i]
            self.assertEqual(s["status"], "completed", s)
            self.assertEqual(s["carried_from"], "%s/%s_001" % (m, p), s)
            self.assertEqual(s["executions"], 0, s)
            self.assertEqual(s["result"], orig[i]["result"])
            self.assertEqual(s["result_hash"], orig[i]["result_hash"])
        self.assertNotIn("carried_from", steps[3])
        self.assertNotIn("carried_from", steps[4])
        text = self.ok("show", w)
        for p in EARLY:
            self.assertRegex(text, r"\n +%s_001 +completed +0 .*carried from %s/%s_001\n"
                             % (p, m, p))
        self.assertNotRegex(text, r"act_001 .*carried from")

    def test_from_act_runs_act_only(self):
        m = self.fire_failed()
        w = self.retry_from(m, "act")
        self.assertEqual(self.wait_status(w), (0, "done"), self.daemon.log()[-3000:])
        self.assertEqual(self.called(w), ["act_001"])
        # act's stdin: the earlier results exactly as the first mandate's act got them
        first, doc = self.stdin_of(m), self.stdin_of(w)
        self.assertEqual(doc["results"], {p: {"phase": p, "n": [1, 2.50, "x"]} for p in EARLY})
        self.assertEqual(doc["results"], first["results"])
        self.assertEqual(doc["step"]["step_id"], "act_001")
        self.assertEqual(doc["step"]["idem_key"], w + "/act_001")
        self.assertEqual(doc["mandate"]["id"], w)
        self.check_carried(m, w)
        # the history without kairosd says the same
        off = json.loads(self.ok("--json", "show", "--state-dir", self.state, w))
        self.assertEqual([s.get("carried_from") for s in off["plans"][0]["steps"]],
                         [m + "/observe_001", m + "/orient_001", m + "/decide_001", None, None])
        listed = json.loads(self.ok("--json", "show", w))
        self.assertEqual(listed["retry_of"], m)
        self.assertEqual(json.loads(self.ok("--json", "show", m))["retried_by"], [w])

    def test_from_a_step_id(self):
        m = self.fire_failed()
        w = self.retry_from(m, "decide_001")
        self.assertEqual(self.wait_status(w), (0, "done"))
        self.assertEqual(self.called(w), ["decide_001", "act_001"])
        steps = json.loads(self.ok("--json", "show", w))["plans"][0]["steps"]
        self.assertEqual([s.get("carried_from") for s in steps],
                         [m + "/observe_001", m + "/orient_001", None, None, None])

    def test_from_the_second_cycle(self):
        """retry --from act of a mandate whose act_002 failed: cycle 1 is
        carried as it ended, cycle 2's steps before act too; act_002 reads
        the same results and previous_reflect as the first time."""
        m = json.loads(self.ok("--json", "fire", "two", "--at", AT))["mandate"]
        self.assertEqual(self.wait_status(m), (1, "failed"))
        ran = ["%s_00%d" % (p, c) for c in (1, 2) for p in EARLY + ("act", "reflect")]
        self.assertEqual(self.called(m), ran[:9])
        open(self.okfile, "w").close()
        w = self.retry_from(m, "act")
        self.assertEqual(self.wait_status(w), (0, "done"), self.daemon.log()[-3000:])
        self.assertEqual(self.called(w), ["act_002", "reflect_002"])
        first, doc = self.stdin_of(m + "_act_002"), self.stdin_of(w + "_act_002")
        self.assertEqual(doc["previous_reflect"], {"again": 1})
        self.assertEqual(doc["previous_reflect"], first["previous_reflect"])
        self.assertEqual(doc["results"], first["results"])
        self.assertEqual(doc["plan"]["cycle"], 2)
        plans = json.loads(self.ok("--json", "show", w))["plans"]
        self.assertEqual([(p["cycle"], p["status"]) for p in plans],
                         [(1, "succeeded"), (2, "succeeded")])
        self.assertEqual([s.get("carried_from") for p in plans for s in p["steps"]],
                         ["%s/%s" % (m, s) for s in ran[:8]] + [None, None])
        # a crash now: recovery folds the same
        self.daemon.kill()
        self.daemon.proc.stderr.close()
        self.start()
        self.assertEqual(json.loads(self.ok("--json", "show", w))["plans"], plans)

    def test_kill_9_after_the_retry_keeps_carried_steps(self):
        m = self.fire_failed()
        os.unlink(self.gate)
        w = self.retry_from(m, "act")
        self.daemon.kill()           # right after the reply: the records are durable
        self.daemon.proc.stderr.close()
        self.start()
        open(self.gate, "w").close()
        rc, st = self.wait_status(w)
        if st == "paused_review":    # killed once its act was executing
            self.ok("resolve", w, "act_001", "--retry", "--reason", "it did nothing")
            rc, st = self.wait_status(w)
        self.assertEqual((rc, st), (0, "done"), self.daemon.log()[-3000:])
        self.assertEqual(self.called(w)[-1], "act_001")
        self.assertEqual(set(self.called(w)), {"act_001"})
        self.check_carried(m, w)

    def test_refusals(self):
        m = self.fire_failed()
        err = self.refused("retry", m, "--from", "act_007")
        self.assertEqual(err, "kairosctl: args.from: %s has no step 'act_007' (a step id such as "
                              "act_001, or a phase: observe, orient, decide, act, reflect)\n" % m)
        # reflect never ran: act before it did not complete
        self.assertEqual(self.refused("retry", m, "--from", "reflect"),
                         "kairosctl: args.from: step act_001 of %s before reflect_001 did not "
                         "complete (failed): it has no result to carry\n" % m)
        r = self.ctl("retry", m, "--from", "")
        self.assertEqual(r.returncode, 64, r)
        self.assertIn("--from must not be empty", r.stderr)
        self.assertEqual(self.called(m), ["observe_001", "orient_001", "decide_001", "act_001"])
        # an unfinished retry of the tick: a second one is refused, and a
        # retry of the running retry too
        os.unlink(self.gate)
        w = self.retry_from(m, "act")
        self.wait_called(w, "act_001")
        self.assertRegex(self.refused("retry", m, "--from", "act"),
                         r"^kairosctl: the tick of %s \(eff at %s\) has an unfinished retry: "
                         r"mandate %s is running; one retry of a tick at a time\n$" % (m, AT, w))
        self.assertEqual(self.refused("retry", w, "--from", "act"),
                         "kairosctl: mandate %s is running: only a mandate that has ended can "
                         "be retried\n" % w)
        open(self.gate, "w").close()
        self.assertEqual(self.wait_status(w), (0, "done"))
        self.assertEqual(self.called(w), ["act_001"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
