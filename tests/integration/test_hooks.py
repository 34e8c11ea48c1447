#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Black-box tests of [Notify] OnReview= and OnFailure= (kairosd.conf(5),
kairosd(8) NOTIFY): real kairosd, real hook scripts that write what they got
(environment and stdin) into files the test waits for.  A mandate whose act
fails, a review found after a kill -9 during act (sent after READY=1), an
approval, the schedule's override and its empty override, a failing hook and
a hanging one (killed after its timeout) that change nothing.

No sleeps as synchronization: the tests wait for the hooks' files and for log
lines."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kairos_harness import Client, Daemon, NotifySocket, write_config  # noqa: E402

KAIROSCTL = os.environ.get("KAIROSCTL", "kairosctl")
KAIROSCTL_PATH = os.path.realpath(shutil.which(KAIROSCTL) or KAIROSCTL)
AT = "2026-04-20T12:00:00Z"
CRON = {"Cron": "0 0 1 1 *"}

# OUT/<event>.<mandate>.{env,stdin,tag}: written under temporary names and
# renamed, stdin last, so a test that sees .stdin sees everything.
HOOK_SH = r"""#!/bin/sh
base="$1/$KAIROS_EVENT.$KAIROS_MANDATE_ID"
env -0 > "$base.env.tmp" && mv "$base.env.tmp" "$base.env"
echo "$2" > "$base.tag.tmp" && mv "$base.tag.tmp" "$base.tag"
cat > "$base.stdin.tmp" && mv "$base.stdin.tmp" "$base.stdin"
"""


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class HookCase(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-hooks-")
        self.state = os.path.join(self.dir, "state")
        self.out = os.path.join(self.dir, "out")
        os.makedirs(self.out)
        self.notify = NotifySocket(self.dir)
        self.daemons = []
        self.clients = []
        self.hook = self.script("hook.sh", HOOK_SH)

    def tearDown(self):
        for c in self.clients:
            c.close()
        for d in self.daemons:
            if d.proc.poll() is None:
                self.assertEqual(d.stop(), 0, d.log()[-3000:])
            else:
                d.kill()
            d.proc.stderr.close()
        self.notify.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def script(self, name, body):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(body if body.startswith("#!") else "#!/bin/sh\n" + body)
        return path

    def hook_cmd(self, tag):
        return "/bin/sh %s %s %s" % (self.hook, self.out, tag)

    def configure(self, schedules, notify=""):
        self.conf = write_config(self.dir, self.state, schedules,
                                 daemon_extra="GracefulTimeoutSec=1\n" +
                                 ("[Notify]\n" + notify if notify else ""))

    def start(self, env=None):
        self.notify.clear()
        d = Daemon(self.state, config=self.conf, notify=self.notify, env=env)
        self.daemons.append(d)
        self.notify.wait_ready()
        self.d = d
        self.c = Client(d.socket_path)
        self.clients.append(self.c)
        return d

    def call_ok(self, cmd, **args):
        r = self.c.call(cmd, **args)
        self.assertTrue(r["ok"], (cmd, args, r))
        return r["result"]

    def fire(self, schedule, at=AT):
        return self.call_ok("fire", schedule=schedule, at=at)["mandate"]

    def mandate(self, m):
        return {x["id"]: x for x in self.call_ok("list")["mandates"]}[m]

    def wait_hook(self, event, m, timeout=30.0):
        """The hook's (env, stdin document, tag) once it has written them."""
        base = os.path.join(self.out, "%s.%s" % (event, m))
        deadline = time.monotonic() + timeout
        while not os.path.exists(base + ".stdin"):
            if time.monotonic() > deadline:
                self.fail("no %s hook for %s:\n%s" % (event, m, self.d.log()[-3000:]))
            time.sleep(0.01)  # polling for a file with a deadline
        env = {}
        with open(base + ".env") as f:  # env -0: values may hold newlines
            for item in f.read().split("\0"):
                if item:
                    k, _, v = item.partition("=")
                    env[k] = v
        with open(base + ".stdin") as f:
            doc = json.loads(f.read())
        with open(base + ".tag") as f:
            tag = f.read().strip()
        return env, doc, tag

    def failing_schedule(self, notify=None):
        act = self.script("act_fail.sh", "cat > /dev/null\necho 'disk full' >&2\nexit 3\n")
        s = {"Schedule": CRON, "Mandate": {"MaxCycles": "1"}, "Exec": {"Act": "/bin/sh " + act}}
        if notify is not None:
            s["Notify"] = notify
        return s


class TestHooks(HookCase):
    def test_failure_runs_on_failure_with_env_and_event(self):
        self.configure({"nightly": self.failing_schedule()},
                       notify="OnFailure=%s\nOnReview=%s\n" % (self.hook_cmd("default"),
                                                               self.hook_cmd("review")))
        self.start(env={"LANG": "C.UTF-8"})
        m = self.fire("nightly")
        self.d.wait_log("mandate %s failed after 1 cycle" % m)
        env, doc, tag = self.wait_hook("failure", m)
        self.assertEqual(tag, "default")
        self.assertEqual(env["KAIROS_EVENT"], "failure")
        self.assertEqual(env["KAIROS_MANDATE_ID"], m)
        self.assertEqual(env["KAIROS_SCHEDULE"], "nightly")
        self.assertEqual(env["KAIROS_FIRED_AT"], AT)
        self.assertEqual(env["KAIROS_STATUS"], "failed")
        self.assertEqual(env["KAIROS_REASON"], "the last cycle failed")
        self.assertEqual(env["KAIROS_STEP_ID"], "act_001")
        self.assertEqual(env["KAIROS_CONTROL_SOCKET"], self.d.socket_path)
        self.assertEqual(env["KAIROSCTL"], KAIROSCTL_PATH)
        self.assertEqual(env["PATH"].split(":")[0], os.path.dirname(KAIROSCTL_PATH))
        self.assertEqual(env["LANG"], "C.UTF-8")
        self.assertNotIn("KAIROS_PHASE", env, "not a handler's variables")
        at = doc.pop("at")
        self.assertRegex(at, r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        show = "%s --socket %s show %s" % (KAIROSCTL_PATH, self.d.socket_path, m)
        self.assertEqual(doc, {"event": "failure", "mandate": m, "schedule": "nightly",
                               "fired_at": AT, "status": "failed",
                               "reason": "the last cycle failed", "step": "act_001",
                               "error_class": "exit_status",
                               "error": "exit status 3: disk full", "exit_status": 3,
                               "exit_signal": None, "attempt": 1, "stderr": "disk full",
                               "show": show})
        self.d.wait_log("hook OnFailure for %s (failure) succeeded" % m)
        self.assertFalse(os.path.exists(os.path.join(self.out, "review.%s.stdin" % m)))
        # the hook reported a durable state: the archive and summary exist
        self.assertTrue(os.path.exists(os.path.join(self.state, "archive", m + ".wal.jsonl.gz")))
        self.assertEqual(self.mandate(m)["status"], "failed")

    def test_review_after_kill_9_during_act_sent_after_ready(self):
        act = self.script("act_block.sh", 'echo $$ > "$1"\nexec sleep 600\n')
        pidfile = os.path.join(self.dir, "actpid")
        os.mkfifo(pidfile)
        self.configure({"deploy": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                   "Exec": {"Act": "/bin/sh %s %s" % (act, pidfile)}}},
                       notify="OnReview=%s\n" % self.hook_cmd("review"))
        self.start()
        m = self.fire("deploy")
        with open(pidfile) as f:  # blocks until act runs
            f.read()
        self.d.kill()
        self.assertFalse(os.path.exists(os.path.join(self.out, "review.%s.stdin" % m)))
        self.start()
        env, doc, tag = self.wait_hook("review", m)
        self.assertEqual(env["KAIROS_EVENT"], "review")
        self.assertEqual(env["KAIROS_STATUS"], "paused_review")
        self.assertEqual(env["KAIROS_STEP_ID"], "act_001")
        self.assertIn("interrupted_during_execution", env["KAIROS_REASON"])
        self.assertEqual((doc["event"], doc["mandate"], doc["status"], doc["step"]),
                         ("review", m, "paused_review", "act_001"))
        self.assertEqual(doc["reason"], env["KAIROS_REASON"])
        self.assertIsInstance(doc["evidence"], dict, "the recovery's evidence")
        self.assertEqual(json.loads(env["KAIROS_EVIDENCE"]), doc["evidence"])
        self.assertEqual(doc["evidence"]["reason"], "interrupted_during_execution")
        self.assertEqual(env["KAIROS_SHOW"], doc["show"])
        self.assertEqual(doc["show"], "%s --socket %s show %s"
                         % (KAIROSCTL_PATH, self.d.socket_path, m))
        for k in ("KAIROS_ERROR_CLASS", "KAIROS_EXIT_STATUS", "KAIROS_STDERR"):
            self.assertNotIn(k, env, "a review is not a failure")
        # sent after READY=1 (the ready log line comes right after it)
        self.d.wait_log("hook OnReview for %s (review) succeeded" % m)
        lines = self.d.log().splitlines()
        ready = next(i for i, line in enumerate(lines) if "ready: recovered" in line)
        started = next(i for i, line in enumerate(lines)
                       if "hook OnReview for %s (review) started" % m in line)
        self.assertLess(ready, started)
        self.assertEqual(self.mandate(m)["status"], "paused_review")

    def test_review_decided_while_running_carries_its_evidence(self):
        # the executor (not recovery, not a probe) pauses the mandate for a
        # human as the step ends: the page carries the evidence of the
        # step's needs_review record (the test hook KAIROS_TEST_REVIEW_EXIT
        # makes act's exit status 42 such a step)
        act = self.script("act_42.sh", "cat > /dev/null\nexit 42\n")
        self.configure({"deploy": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                   "Exec": {"Act": "/bin/sh " + act}}},
                       notify="OnReview=%s\n" % self.hook_cmd("review"))
        self.start(env={"KAIROS_TEST_REVIEW_EXIT": "42"})
        r = self.c.call("test-stall", seconds=0)
        if not r["ok"] and r["error"]["code"] == "unknown_command":
            self.skipTest("kairosd was built without -Dtest_hooks=true")
        m = self.fire("deploy")
        env, doc, _ = self.wait_hook("review", m)
        self.d.wait_log("mandate %s paused for review at step act_001 (test_review_exit)" % m)
        self.assertNotIn("recovery:", self.d.log(), "decided while running")
        self.assertEqual((env["KAIROS_STATUS"], env["KAIROS_STEP_ID"], env["KAIROS_REASON"]),
                         ("paused_review", "act_001", "test_review_exit"))
        want = {"reason": "test_review_exit", "exit_status": 42}
        self.assertEqual(json.loads(env["KAIROS_EVIDENCE"]), want)
        self.assertEqual(doc["evidence"], want)
        self.assertEqual(self.mandate(m)["status"], "paused_review")

    def test_approval_runs_on_review(self):
        act = self.script("act_ask.sh", "cat > /dev/null\n"
                          "echo '{\"kairos\":{\"pause\":\"awaiting_approval\",\"reason\":\"delete 3 files?\"}}'\n")
        self.configure({"ask": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                "Exec": {"Act": "/bin/sh " + act}}},
                       notify="OnReview=%s\n" % self.hook_cmd("review"))
        self.start()
        m = self.fire("ask")
        env, doc, _ = self.wait_hook("approval", m)
        self.assertEqual((env["KAIROS_EVENT"], env["KAIROS_STATUS"], env["KAIROS_REASON"],
                          env["KAIROS_STEP_ID"]),
                         ("approval", "awaiting_approval", "delete 3 files?", "act_001"))
        self.assertEqual((doc["event"], doc["status"], doc["reason"], doc["step"]),
                         ("approval", "awaiting_approval", "delete 3 files?", "act_001"))
        self.assertNotIn("evidence", doc)
        self.call_ok("approve", mandate=m)
        self.d.wait_log("mandate %s done after 1 cycle" % m)

    def test_control_bytes_of_a_reason_escaped_in_the_log(self):
        # ESC and BEL in the act's reason and in its stderr: the log shows
        # them escaped; the hook still gets the reason as it was.
        act = self.script("act_esc.sh", "cat > /dev/null\n"
                          "printf 'warn \\033[2J\\007 end\\n' >&2\n"
                          "printf '{\"kairos\":{\"pause\":\"awaiting_approval\","
                          "\"reason\":\"wipe\\\\u001b]0;x\\\\u0007 ok?\"}}\\n'\n")
        self.configure({"esc": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                "Exec": {"Act": "/bin/sh " + act}}},
                       notify="OnReview=%s\n" % self.hook_cmd("review"))
        self.start()
        m = self.fire("esc")
        env, doc, _ = self.wait_hook("approval", m)
        self.assertEqual(doc["reason"], "wipe\x1b]0;x\x07 ok?")
        self.d.wait_log("hook OnReview for %s (approval) succeeded" % m)
        log = self.d.log()
        self.assertIn("wipe\\x1b]0;x\\x07 ok?", log)
        self.assertIn("act_001: warn \\x1b[2J\\x07 end", log)
        for c in ["\x1b", "\x07"]:
            self.assertNotIn(c, log)
        self.assertEqual(len([x for x in log.splitlines() if "wipe" in x]),
                         log.count("wipe"), "one record, one line")

    def test_schedule_override_and_empty_override(self):
        self.configure({"own": self.failing_schedule({"OnFailure": self.hook_cmd("own")}),
                        "quiet": self.failing_schedule({"OnFailure": ""}),
                        "plain": self.failing_schedule()},
                       notify="OnFailure=%s\n" % self.hook_cmd("default"))
        self.start()
        m_own = self.fire("own")
        _, doc, tag = self.wait_hook("failure", m_own)
        self.assertEqual((tag, doc["schedule"]), ("own", "own"))
        m_quiet = self.fire("quiet")
        self.d.wait_log("mandate %s failed after 1 cycle" % m_quiet)
        # a later failure's hook runs: the quiet one would have been queued before it
        m_plain = self.fire("plain")
        _, doc, tag = self.wait_hook("failure", m_plain)
        self.assertEqual((tag, doc["schedule"]), ("default", "plain"))
        self.d.wait_log("hook OnFailure for %s (failure) succeeded" % m_plain)
        self.assertNotIn("for %s" % m_quiet, "\n".join(
            line for line in self.d.log().splitlines() if "hook " in line))
        self.assertFalse(os.path.exists(os.path.join(self.out, "failure.%s.stdin" % m_quiet)))

    def test_failing_and_hanging_hooks_change_nothing(self):
        bad = self.script("bad.sh", "cat > /dev/null\necho 'pager down' >&2\nexit 7\n")
        hang = self.script("hang.sh", "trap '' TERM\nwhile :; do sleep 1; done\n")
        self.configure({"bad": self.failing_schedule({"OnFailure": "/bin/sh " + bad}),
                        "hang": self.failing_schedule({"OnFailure": "/bin/sh " + hang})})
        self.start(env={"KAIROS_TEST_HOOK_TIMEOUT_MS": "500"})
        m_bad = self.fire("bad")
        line = self.d.wait_log("hook OnFailure for %s (failure) failed" % m_bad)
        self.assertIn("failed with exit status 7; the mandate is not affected; output: pager down",
                      line)
        self.assertEqual(self.mandate(m_bad)["status"], "failed")
        m_hang = self.fire("hang")
        line = self.d.wait_log("hook OnFailure for %s (failure) started" % m_hang)
        pid = int(re.search(r"\(pid (\d+)\)", line).group(1))
        # the daemon answers while the hook hangs
        self.assertEqual(self.mandate(m_hang)["status"], "failed")
        # 0.5 s with the test hooks' override (30 s without), SIGKILL 5 s later
        line = self.d.wait_log("hook OnFailure for %s (failure) timed out" % m_hang,
                               timeout=60)
        self.assertIn("(killed); the mandate is not affected", line)
        self.assertFalse(alive(pid), "the hook was killed and reaped")
        self.assertEqual(self.mandate(m_hang)["status"], "failed")
        self.assertEqual(self.mandate(m_bad)["status"], "failed")

    def test_storm_is_bounded_and_stop_kills_hooks(self):
        # hooks that wait until the test is done: 4 run, 64 wait, the rest
        # folded into one page
        gate = os.path.join(self.dir, "never")
        block = self.script("block.sh", 'cat > /dev/null\nwhile [ ! -e "%s" ]; do sleep 0.1; done\n'
                            % gate)
        self.configure({"storm": self.failing_schedule()},
                       notify="OnFailure=/bin/sh %s\n" % block)
        # no hook times out meanwhile (with the test hooks; 30 s without them,
        # enough for 72 mandates in a plain build)
        self.start(env={"KAIROS_TEST_HOOK_TIMEOUT_MS": "3600000"})
        total = 72
        ms = [self.fire("storm", at="2026-04-20T12:%02d:%02dZ" % (i // 60, i % 60))
              for i in range(total)]
        for m in ms:
            self.d.wait_log("mandate %s failed after 1 cycle" % m, timeout=120)
        line = self.d.wait_log("the next failures (from %s on) are folded" % ms[68])
        self.assertIn("hooks: 64 failure pages waiting", line)
        pids = [int(p) for p in re.findall(r"hook OnFailure for \S+ \(failure\) started \(pid (\d+)\)",
                                           self.d.log())]
        self.assertEqual(len(pids), 4, "at most 4 run at once")
        self.assertTrue(all(alive(p) for p in pids))
        self.assertEqual(self.call_ok("list")["mandates"][0]["status"], "failed")
        self.assertEqual(self.d.stop(), 0, self.d.log()[-3000:])
        log = self.d.log()
        self.assertIn("hooks: 65 waiting hooks not run (stopping); one of them the page of "
                      "folded failures", log)
        for p in pids:
            self.assertFalse(alive(p), "hook %d outlived kairosd" % p)

    def test_flood_of_failures_never_drops_an_approval(self):
        # 400 failures of two schedules while the failure hooks wait for a
        # gate: 4 run, 64 wait, the others are folded into one page; the
        # approval pages of mandates that came meanwhile all go out first.
        n = int(os.environ.get("KAIROS_HOOK_FLOOD", "400"))
        gate = os.path.join(self.dir, "gate")
        gated = self.script("gated.sh", 'while [ ! -e "%s" ]; do sleep 0.05; done\n'
                            'exec /bin/sh %s "$@"\n' % (gate, self.hook))
        act = self.script("act_ask.sh", "cat > /dev/null\n"
                          "echo '{\"kairos\":{\"pause\":\"awaiting_approval\",\"reason\":\"ok?\"}}'\n")
        ask = {"Schedule": CRON, "Mandate": {"MaxCycles": "1"}, "Exec": {"Act": "/bin/sh " + act}}
        self.configure({"fail_a": self.failing_schedule(), "fail_b": self.failing_schedule(),
                        "ask": ask},
                       notify="OnFailure=/bin/sh %s %s fail\nOnReview=%s\n"
                       % (gated, self.out, self.hook_cmd("review")))
        self.start(env={"KAIROS_TEST_HOOK_TIMEOUT_MS": "3600000"})
        c = Client(self.d.socket_path, timeout=120)
        self.clients.append(c)

        def at(i):
            return "2026-04-%02dT%02d:%02d:00Z" % (1 + i // 1440, i // 60 % 24, i % 60)

        # pipelined: the replies come once each fire is durable
        fails, asks = [], []
        for i in range(n):
            c.send_raw(json.dumps({"v": 1, "id": i, "cmd": "fire", "args": {
                "schedule": "fail_a" if i % 2 else "fail_b", "at": at(i)}}).encode() + b"\n")
        for _ in range(n):
            r = c.recv_reply()
            self.assertTrue(r["ok"], r)
            fails.append(r["result"]["mandate"])
        for m in fails:
            self.d.wait_log("mandate %s failed after 1 cycle" % m, timeout=120)
        for i in range(3):
            asks.append(self.fire("ask", at=at(n + i)))
        for m in asks:
            self.d.wait_log("mandate %s awaits approval" % m)
        with open(gate, "w"):
            pass
        for m in asks:
            env, doc, tag = self.wait_hook("approval", m)
            self.assertEqual((tag, env["KAIROS_MANDATE_ID"], doc["status"]),
                             ("review", m, "awaiting_approval"))
        env, doc, tag = self.wait_hook("failures", "", timeout=120)
        folded = n - 4 - 64
        self.assertEqual((tag, env["KAIROS_EVENT"], env["KAIROS_FOLDED"]),
                         ("fail", "failures", str(folded)))
        self.assertEqual(sorted(env["KAIROS_SCHEDULES"].split()), ["fail_a", "fail_b"])
        self.assertNotIn("KAIROS_MANDATE_ID", env)
        self.assertEqual(doc["event"], "failures")
        self.assertEqual(doc["count"], folded)
        self.assertEqual(sorted(doc["schedules"]), ["fail_a", "fail_b"])
        self.assertEqual(sum(doc["schedules"].values()), folded)
        self.assertEqual(doc["unnamed"], 0)
        self.assertEqual(doc["error_classes"], {"exit_status": folded})
        self.assertEqual(env["KAIROS_ERROR_CLASSES"], "exit_status=%d" % folded)
        # the first failure folded (the log names it) and the last one
        first = re.search(r"the next failures \(from (\S+) on\) are folded",
                          self.d.log()).group(1)
        ended = [re.search(r"mandate (\S+) failed after", x).group(1)
                 for x in self.d.log().splitlines() if re.search(r"mandate \S+ failed after", x)]
        self.assertEqual((doc["first_mandate"], doc["last_mandate"]), (first, ended[-1]))
        self.assertEqual((env["KAIROS_FIRST_MANDATE_ID"], env["KAIROS_LAST_MANDATE_ID"]),
                         (first, ended[-1]))
        self.assertEqual(doc["list"], "%s --socket %s list --status failed"
                         % (KAIROSCTL_PATH, self.d.socket_path))
        self.assertEqual(env["KAIROS_LIST"], doc["list"])
        # every failure page that waited went out too, the approvals first
        deadline = time.monotonic() + 60
        while len(re.findall(r"\(failure\) succeeded", self.d.log())) < 68:
            self.assertLess(time.monotonic(), deadline, self.d.log()[-3000:])
            time.sleep(0.05)  # polling the log for a count, with a deadline
        self.assertEqual(len([f for f in os.listdir(self.out) if f.startswith("failure.") and
                              f.endswith(".stdin")]), 68)
        lines = self.d.log().splitlines()
        started = [i for i, x in enumerate(lines) if re.search(r"hook \S+ for .* started", x)]
        first_asks = [i for i in started if "(approval) started" in lines[i]]
        self.assertEqual(len(first_asks), 3)
        self.assertEqual(started[4:7], first_asks, "the approvals run before the waiting failures")
        self.assertIn("hooks: %d failures folded into one page (schedules: " % folded, self.d.log())
        self.assertIn("hooks: 64 failure pages waiting; the next failures", self.d.log())
        self.assertNotIn("dropped", self.d.log())

    def test_variables_expand_from_the_hooks_environment(self):
        # ${NAME} in a word and $$: from the hook's own environment
        cmd = "/bin/sh %s %s ${KAIROS_EVENT}-${KAIROS_STATUS}-$$" % (self.hook, self.out)
        self.configure({"nightly": self.failing_schedule({"OnFailure": cmd})})
        self.start()
        m = self.fire("nightly")
        env, doc, tag = self.wait_hook("failure", m)
        self.assertEqual(tag, "failure-failed-$")
        # a name a hook does not get (a handler's, Environment='s): file:line
        self.configure({"sched": {"Schedule": CRON, "Exec": {"Environment": "MINE=1"},
                                  "Notify": {"OnFailure": "/bin/mail ${MINE}"}}},
                       notify="OnReview=/bin/page $KAIROS_IDEM_KEY\n")
        p = subprocess.run([os.environ.get("KAIROSD", "kairosd"), "--check-config", "-c",
                            self.conf], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("kairosd.conf:6: OnReview=: unknown variable $KAIROS_IDEM_KEY: a hook "
                      "gets only the variables of kairosd(8), NOTIFY (write $$ for a literal $)",
                      p.stderr)
        self.assertIn("sched.conf:6: OnFailure=: unknown variable ${MINE}: a hook gets only "
                      "the variables of kairosd(8), NOTIFY (write $$ for a literal $)", p.stderr)

    def test_check_config_validates_notify(self):
        self.configure({"sched": {"Schedule": CRON, "Notify": {"OnReview": "'unbalanced"}}},
                       notify="OnFailure=\"\"\nOnPage=x\n")
        p = subprocess.run([os.environ.get("KAIROSD", "kairosd"), "--check-config", "-c",
                            self.conf], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("kairosd.conf:6: OnFailure=: empty command name", p.stderr)
        self.assertIn("kairosd.conf:7: OnPage=: unknown key in [Notify]", p.stderr)
        self.assertIn("sched.conf:4: OnReview=: cannot split command line: unbalanced single "
                      "quote", p.stderr)


class TestFailurePages(HookCase):
    """What a failure page says of the failure: the step, its error class,
    exit status or signal, the end of its stderr (bounded), the attempt and
    the command that shows the mandate, in the environment and on stdin."""

    def page_for(self, act_body, exec_extra=None):
        act = self.script("act.sh", act_body)
        ex = {"Act": "/bin/sh " + act}
        ex.update(exec_extra or {})
        self.configure({"nightly": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                    "Exec": ex}},
                       notify="OnFailure=%s\n" % self.hook_cmd("page"))
        self.start()
        m = self.fire("nightly")
        env, doc, tag = self.wait_hook("failure", m)
        self.assertEqual((env["KAIROS_STEP_ID"], doc["step"]), ("act_001", "act_001"))
        self.assertEqual((env["KAIROS_ATTEMPT"], doc["attempt"]), ("1", 1))
        show = "%s --socket %s show %s" % (KAIROSCTL_PATH, self.d.socket_path, m)
        self.assertEqual((env["KAIROS_SHOW"], doc["show"]), (show, show))
        self.assertEqual(env["KAIROS_ERROR_CLASS"], doc["error_class"])
        self.assertEqual(env["KAIROS_ERROR"], doc["error"])
        self.assertEqual(env["KAIROS_STDERR"], doc["stderr"])
        # the page links back: the command it names shows the mandate
        p = subprocess.run(show, shell=True, capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(m, p.stdout)
        return m, env, doc

    def test_exit_status_and_the_last_lines_of_stderr(self):
        # 15 lines of stderr: the page carries the last 10
        m, env, doc = self.page_for(
            "cat > /dev/null\nfor i in $(seq 1 15); do echo \"line $i\" >&2; done\nexit 3\n")
        self.assertEqual(doc["error_class"], "exit_status")
        self.assertEqual((env["KAIROS_EXIT_STATUS"], doc["exit_status"]), ("3", 3))
        self.assertNotIn("KAIROS_EXIT_SIGNAL", env)
        self.assertIsNone(doc["exit_signal"])
        self.assertEqual(doc["stderr"], "\n".join("line %d" % i for i in range(6, 16)))
        self.assertTrue(doc["error"].startswith("exit status 3: "), doc["error"])

    def test_stderr_bounded_in_bytes(self):
        # one 1500-byte line: the page keeps its last 1024 bytes
        m, env, doc = self.page_for("cat > /dev/null\nprintf '%01500d' 7 >&2\nexit 1\n")
        self.assertEqual(doc["stderr"], "0" * 1023 + "7")

    def test_timeout(self):
        m, env, doc = self.page_for("cat > /dev/null\necho waiting >&2\nexec sleep 600\n",
                                    {"TimeoutSec": "1"})
        self.assertEqual(doc["error_class"], "timeout")
        self.assertEqual((env["KAIROS_EXIT_SIGNAL"], doc["exit_signal"]), ("15", 15))
        self.assertNotIn("KAIROS_EXIT_STATUS", env)
        self.assertIsNone(doc["exit_status"])
        self.assertEqual(doc["stderr"], "waiting")

    def test_signal(self):
        m, env, doc = self.page_for("cat > /dev/null\necho 'about to crash' >&2\nkill -SEGV $$\n")
        self.assertEqual(doc["error_class"], "signal")
        self.assertEqual((env["KAIROS_EXIT_SIGNAL"], doc["exit_signal"]), ("11", 11))
        self.assertNotIn("KAIROS_EXIT_STATUS", env)
        self.assertEqual(doc["stderr"], "about to crash")

    def test_details_kept_across_a_kill_9(self):
        # the act fails while its mandate is paused (recorded, nothing
        # decided), kairosd is killed -9: the kairosd after it ends the
        # mandate and pages with what the failed record says
        release = os.path.join(self.dir, "release")
        os.mkfifo(release)
        act = self.script("act_wait.sh", "cat > /dev/null\nread x < %s\n"
                          "for i in $(seq 1 12); do echo \"line $i\" >&2; done\nexit 3\n"
                          % release)
        self.configure({"nightly": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                    "Exec": {"Act": "/bin/sh " + act}}},
                       notify="OnFailure=%s\n" % self.hook_cmd("page"))
        self.start()
        m = self.fire("nightly")
        self.d.wait_log("%s act_001: started" % m)
        self.call_ok("pause", mandate=m, reason="look first")
        with open(release, "w") as f:  # blocks until the act opens it
            f.write("go\n")
        self.d.wait_log("%s act_001: failed" % m)
        # show reads the WAL after the failure's records are written (its
        # job follows theirs on the mandate's queue)
        steps = self.call_ok("show", mandate=m)["plans"][0]["steps"]
        self.assertEqual(steps[3]["status"], "failed", steps)
        self.d.kill()
        self.assertFalse(os.path.exists(os.path.join(self.out, "failure.%s.stdin" % m)))
        self.start()
        env, doc, _ = self.wait_hook("failure", m)
        stderr = "\n".join("line %d" % i for i in range(3, 13))
        self.assertEqual((env["KAIROS_STEP_ID"], env["KAIROS_ERROR_CLASS"],
                          env["KAIROS_EXIT_STATUS"], env["KAIROS_ATTEMPT"], env["KAIROS_STDERR"]),
                         ("act_001", "exit_status", "3", "1", stderr), doc)
        self.assertNotIn("KAIROS_EXIT_SIGNAL", env)
        self.assertEqual((doc["step"], doc["error_class"], doc["exit_status"], doc["exit_signal"],
                          doc["attempt"], doc["stderr"]),
                         ("act_001", "exit_status", 3, None, 1, stderr))
        self.assertTrue(doc["error"].startswith("exit status 3: "), doc["error"])
        self.assertEqual(env["KAIROS_ERROR"], doc["error"])

    def test_new_variables_expand_in_a_hook_command(self):
        cmd = ("/bin/sh %s %s ${KAIROS_STEP_ID}-${KAIROS_ERROR_CLASS}-${KAIROS_EXIT_STATUS}"
               % (self.hook, self.out))
        self.configure({"nightly": self.failing_schedule({"OnFailure": cmd})},
                       notify="OnFailure=notify --step ${KAIROS_STEP_ID} --why "
                       "${KAIROS_ERROR_CLASS} --show \"$KAIROS_SHOW\"\n")
        p = subprocess.run([os.environ.get("KAIROSD", "kairosd"), "--check-config", "-c",
                            self.conf], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.start()
        m = self.fire("nightly")
        env, doc, tag = self.wait_hook("failure", m)
        self.assertEqual(tag, "act_001-exit_status-3")


if __name__ == "__main__":
    unittest.main(verbosity=2)
