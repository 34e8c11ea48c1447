#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A step killed by a graceful stop is decided like one cut off by a crash
(docs/design.md §8): kairosd gets SIGTERM while a step's handler runs, the
handler outlasts GracefulTimeoutSec=1 and is killed (the WAL says
needs_review, killed_at_shutdown), and at the next start the same evidence
function decides it:

- a phase that is not in Effects= → run again (declared_rerunnable);
- act with EffectsVia=kairosctl whose calls finished → run again
  (effects_journaled), the calls replayed: the effect once;
- act with Probe= saying done → completed with the probe's result; saying
  not_started → run again;
- act with a tool call cut off mid `tool run` → what a crash decides for it
  (the call in the evidence);
- act with no evidence → still paused for review, reason killed_at_shutdown.

The records keep the stop: the needs_review killed_at_shutdown stays in the
WAL and the record recovery writes says "killed_at_shutdown":true.  The
handlers write a marker once they run; the test waits for it (no sleeps)."""
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kairos_harness import KAIROSCTL, Daemon, NotifySocket, write_config  # noqa: E402

HANDLER = r"""#!/bin/sh
# $1: this handler's phase.  BLOCK: the phase whose first attempt stops
# until it is killed; MODE (act): journaled (a tool run and a tool write
# first) or incall (attempt 1 hangs inside its tool run).
cat >/dev/null
if [ "$1" = "$BLOCK" ]; then
        case "${MODE:-}" in
        journaled)
                "$KAIROSCTL" tool run --key "out-$KAIROS_IDEM_KEY" -- \
                        sh -c 'echo "$0" >> "$1"' "$KAIROS_IDEM_KEY" "$OUT/outbox" >/dev/null
                echo report | "$KAIROSCTL" tool write --key "rep-$KAIROS_IDEM_KEY" \
                        "$ROOT/report" >/dev/null
                ;;
        incall)
                exec "$KAIROSCTL" tool run --key "out-$KAIROS_IDEM_KEY" ${CHECK:+--check "$CHECK"} -- sh -c \
                        'if [ "$2" = 1 ]; then touch "$1/started"; exec sleep 600; fi; echo "$0" >> "$1/outbox"' \
                        "$KAIROS_IDEM_KEY" "$OUT" "$KAIROS_ATTEMPT" >/dev/null
                ;;
        esac
        if [ "$KAIROS_ATTEMPT" = 1 ]; then
                touch "$OUT/started"
                exec sleep 600
        fi
fi
echo '{"ok":true}'
"""

PHASES = ("observe", "orient", "decide", "act", "reflect")
WAIT = 60.0


def ctl_has_check():
    """Has this kairosctl `tool run --check` (and kairosd the decision of a
    cut-off call by its check, else by Probe=, that comes with it)?"""
    p = subprocess.run([KAIROSCTL, "--socket", "/nonexistent", "tool", "run", "--key", "k",
                        "--check", "", "--", "true"], capture_output=True, text=True, timeout=30)
    return "--check: " in p.stderr


def wait_file(path, daemon, timeout=WAIT):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if daemon.proc.poll() is not None:
            raise AssertionError("kairosd exited before %s:\n%s" % (path, daemon.log()))
        if time.monotonic() > deadline:
            raise TimeoutError("no %s:\n%s" % (path, daemon.log()[-3000:]))
        time.sleep(0.02)  # polling a condition with a deadline


class StopEvidence(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-stop-")
        self.state = os.path.join(self.dir, "state")
        self.out = os.path.join(self.dir, "out")
        self.root = os.path.join(self.dir, "root")
        os.makedirs(self.out)
        os.makedirs(self.root)
        self.handler = os.path.join(self.dir, "h.sh")
        with open(self.handler, "w") as f:
            f.write(HANDLER)
        os.chmod(self.handler, 0o755)
        self.notify = NotifySocket(self.dir)
        self.daemon = None

    def tearDown(self):
        if self.daemon and self.daemon.proc.poll() is None:
            rc = self.daemon.stop()
            self.assertEqual(rc, 0, self.daemon.log()[-3000:])
        if self.daemon:
            self.daemon.proc.stderr.close()
        self.notify.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def configure(self, env, **extra):
        keys = {p.capitalize(): "%s %s" % (self.handler, p) for p in PHASES}
        keys["Environment"] = " ".join(
            ["OUT=%s" % self.out, "ROOT=%s" % self.root,
             "KAIROSCTL=%s" % os.path.abspath(KAIROSCTL)] + env)
        keys.update(extra)
        sched = {"Schedule": {"Cron": "0 0 1 1 *"}, "Exec": keys}
        self.conf = write_config(self.dir, self.state, {"job": sched},
                                 daemon_extra="GracefulTimeoutSec=1\n"
                                 "[Idempotency]\nWriteRoots=%s\n" % self.root)

    def start(self):
        self.notify.clear()
        self.daemon = Daemon(self.state, config=self.conf, notify=self.notify)
        self.notify.wait_ready()

    def ctl(self, *args):
        p = subprocess.run([KAIROSCTL, "--socket", self.daemon.socket_path] + list(args),
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, "kairosctl %s: %s%s" % (args, p.stdout, p.stderr))
        return p

    def stop_during(self, step):
        """Fire, wait until the blocking handler runs, SIGTERM kairosd: the
        handler outlasts GracefulTimeoutSec=1 and is killed."""
        self.start()
        r = json.loads(self.ctl("--json", "fire", "job", "--at", "2030-01-01T00:00:00Z").stdout)
        self.mid = r["mandate"]
        wait_file(os.path.join(self.out, "started"), self.daemon)
        self.assertEqual(self.daemon.stop(signal.SIGTERM), 0, self.daemon.log()[-3000:])
        self.assertIn("%s %s: still running after GracefulTimeoutSec=1: killed"
                      % (self.mid, step), self.daemon.log())
        self.daemon.proc.stderr.close()
        last = self.wal_records()[-1]
        self.assertEqual((last["step_id"], last["status"], last["reason"]),
                         (step, "needs_review", "killed_at_shutdown"), last)

    def dry_run(self, step, probe=False):
        p = subprocess.run([KAIROSCTL, "--json", "recover", "--dry-run", "--state-dir",
                            self.state, "--config", self.conf] + (["--probe"] if probe else []),
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        out = json.loads(p.stdout)
        return [d for f in out["files"] for pl in f["plans"] for d in pl["decisions"]
                if d["step_id"] == step]

    def restart_and_check(self, step, verdict, reason, probe=False):
        """The dry run and kairosd decide step alike, by reason; the record
        recovery writes says the stop killed it."""
        dr = self.dry_run(step, probe)
        self.assertEqual([(d["verdict"], d["reason"]) for d in dr], [(verdict, reason)], dr)
        self.assertIs(dr[0]["evidence"].get("killed_at_shutdown"), True, dr)
        self.start()
        line = self.daemon.wait_log("recovery: %s %s: %s (%s)" % (self.mid, step, verdict, reason))
        self.assertIn('"killed_at_shutdown":true', line)
        return dr[0]

    def wal_records(self):
        live = os.path.join(self.state, "wal", self.mid + ".wal.jsonl")
        if os.path.exists(live):
            with open(live, "rb") as f:
                data = f.read()
        else:
            with gzip.open(os.path.join(self.state, "archive", self.mid + ".wal.jsonl.gz")) as f:
                data = f.read()
        return [json.loads(x) for x in data.decode().splitlines() if x.strip()]

    def show(self):
        return json.loads(self.ctl("--json", "show", self.mid).stdout)

    def step_of(self, shown, step):
        for p in shown["plans"]:
            for s in p["steps"]:
                if s["step_id"] == step:
                    return s
        self.fail("no step %s in %s" % (step, shown))

    def stopped_then(self, step):
        """The WAL keeps the stop: killed_at_shutdown, then what recovery did."""
        recs = [r for r in self.wal_records() if r.get("step_id") == step]
        kills = [i for i, r in enumerate(recs) if r.get("reason") == "killed_at_shutdown"]
        self.assertEqual(len(kills), 1, recs)
        return recs[kills[0] + 1:]

    def assert_done(self):
        self.daemon.wait_log("mandate %s done after" % self.mid)
        self.assertEqual(self.show()["status"], "done")

    # ---- the cases ----

    def test_non_effect_phase_is_rerun(self):
        self.configure(["BLOCK=observe"])
        self.stop_during("observe_001")
        self.restart_and_check("observe_001", "safe_to_retry", "declared_rerunnable")
        self.assert_done()
        after = self.stopped_then("observe_001")
        self.assertTrue(after[0].get("reset"), after)
        self.assertEqual(after[0]["evidence"]["reason"], "declared_rerunnable")
        self.assertIs(after[0]["evidence"]["killed_at_shutdown"], True)
        s = self.step_of(self.show(), "observe_001")
        self.assertEqual((s["status"], s["executions"]), ("completed", 2), s)
        # show says so too
        self.assertEqual((s["evidence"]["reason"], s["evidence"]["killed_at_shutdown"]),
                         ("declared_rerunnable", True), s)

    def test_journaled_effects_replay(self):
        self.configure(["BLOCK=act", "MODE=journaled"], EffectsVia="kairosctl")
        self.stop_during("act_001")
        dr = self.restart_and_check("act_001", "safe_to_retry", "effects_journaled")
        self.assertEqual({c["state"] for c in dr["evidence"]["tool_calls"]}, {"completed"}, dr)
        self.assert_done()
        with open(os.path.join(self.out, "outbox")) as f:
            self.assertEqual(f.read().splitlines(), ["%s/act_001" % self.mid])
        s = self.step_of(self.show(), "act_001")
        self.assertEqual((s["status"], s["executions"]), ("completed", 2), s)
        # the text view says why it ran twice; the stop's wait is not its time
        self.assertEqual((s["interrupted"]["decision"],
                          s["interrupted"]["evidence"]["reason"]), ("pending", "effects_journaled"))
        self.assertRegex(self.ctl("show", self.mid).stdout,
                         r"\n      act_001 execution 1: ran \d+(?:ms|\.\ds) until killed at shutdown "
                         r"\(\S+\); re-run as execution 2, decided by recovery: effects_journaled "
                         r"at \S+\n")

    def write_probe(self, said):
        probe = os.path.join(self.out, "probe.sh")
        with open(probe, "w") as f:
            f.write("cat >/dev/null\necho '%s'\n" % said)
        return "/bin/sh " + probe

    def test_probe_done_completes(self):
        self.configure(["BLOCK=act"],
                       Probe=self.write_probe('{"state":"done","result":"probed"}'))
        self.stop_during("act_001")
        self.restart_and_check("act_001", "already_done", "current_state_matches_expected_post",
                               probe=True)
        self.assert_done()
        s = self.step_of(self.show(), "act_001")
        self.assertEqual((s["status"], s["executions"], s["result"]),
                         ("completed", 1, "probed"), s)
        after = self.stopped_then("act_001")
        self.assertEqual(after[0]["status"], "completed", after)
        self.assertIs(after[0]["evidence"]["killed_at_shutdown"], True)

    def test_probe_not_started_reruns(self):
        self.configure(["BLOCK=act"], Probe=self.write_probe('{"state":"not_started"}'))
        self.stop_during("act_001")
        self.restart_and_check("act_001", "safe_to_retry", "current_pre_matches_expected",
                               probe=True)
        self.assert_done()
        s = self.step_of(self.show(), "act_001")
        self.assertEqual((s["status"], s["executions"]), ("completed", 2), s)

    def test_interrupted_call_decided_as_after_a_crash(self):
        self.configure(["BLOCK=act", "MODE=incall"], EffectsVia="kairosctl")
        self.stop_during("act_001")
        dr = self.dry_run("act_001")
        self.assertEqual(len(dr), 1, dr)
        # what a crash decides for a call cut off (with neither check nor
        # probe: an operator), with the call as evidence
        self.assertEqual(dr[0]["reason"], "tool_call_interrupted", dr)
        self.assertIs(dr[0]["evidence"]["killed_at_shutdown"], True, dr)
        key = "cmd:out-%s/act_001" % self.mid
        self.assertEqual([c["key"] for c in dr[0]["evidence"]["tool_calls"]], [key], dr)
        self.start()
        self.daemon.wait_log("mandate %s paused for review at step act_001 "
                             "(tool_call_interrupted)" % self.mid)
        s = self.step_of(self.show(), "act_001")
        self.assertEqual((s["status"], s["evidence"]["reason"]),
                         ("needs_review", "tool_call_interrupted"), s)
        self.assertFalse(os.path.exists(os.path.join(self.out, "outbox")))

    def outbox_check(self):
        """A check (and probe) that asks the outbox."""
        path = os.path.join(self.out, "check.sh")
        with open(path, "w") as f:
            f.write('cat >/dev/null\n'
                    'if grep -qxF "$KAIROS_IDEM_KEY" "$OUT/outbox" 2>/dev/null; then\n'
                    '  echo \'{"state":"done","result":"sent"}\'\n'
                    'else echo \'{"state":"not_started"}\'; fi\n')
        return "/bin/sh " + path

    @unittest.skipUnless(ctl_has_check(), "kairosctl without tool run --check")
    def test_interrupted_call_decided_by_its_check(self):
        self.configure(["BLOCK=act", "MODE=incall", "\"CHECK=%s\"" % self.outbox_check()],
                       EffectsVia="kairosctl")
        self.stop_during("act_001")
        self.start()
        key = "cmd:out-%s/act_001" % self.mid
        self.daemon.wait_log("tool call %s released by its check" % key)
        self.assert_done()
        with open(os.path.join(self.out, "outbox")) as f:
            self.assertEqual(f.read().splitlines(), ["%s/act_001" % self.mid])  # once
        self.assertIn('"killed_at_shutdown":true', self.daemon.wait_log(
            "recovery: %s act_001: safe_to_retry" % self.mid))

    @unittest.skipUnless(ctl_has_check(), "kairosctl without tool run --check")
    def test_interrupted_call_decided_by_probe(self):
        self.configure(["BLOCK=act", "MODE=incall"], EffectsVia="kairosctl",
                       Probe=self.outbox_check())
        self.stop_during("act_001")
        self.start()
        self.assert_done()
        with open(os.path.join(self.out, "outbox")) as f:
            self.assertEqual(f.read().splitlines(), ["%s/act_001" % self.mid])  # once
        self.assertIn('"killed_at_shutdown":true', self.daemon.wait_log(
            "recovery: %s act_001: safe_to_retry" % self.mid))

    def test_no_evidence_still_pauses(self):
        self.configure(["BLOCK=act"])
        self.stop_during("act_001")
        dr = self.dry_run("act_001")
        self.assertEqual([(d["verdict"], d["reason"]) for d in dr],
                         [("manual_review", "interrupted_during_execution")], dr)
        self.assertIs(dr[0]["evidence"]["killed_at_shutdown"], True, dr)
        self.start()
        self.daemon.wait_log("mandate %s paused for review at step act_001 "
                             "(killed_at_shutdown)" % self.mid)
        shown = self.show()
        self.assertEqual((shown["status"], shown["reason"]),
                         ("paused_review", "killed_at_shutdown"), shown)
        # nothing written over the stop's record
        self.assertEqual(self.stopped_then("act_001"), [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
