#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Recovery decides from evidence beyond the WAL (docs/design.md §8): kairosd
is killed with SIGKILL while a step's handler runs, and started again.

- a phase that is not in Effects= → run again by itself (declared_rerunnable);
- a phase whose command was removed meanwhile → run again (no_command);
- act with EffectsVia=kairosctl whose tool call finished → run again
  (effects_journaled): the re-run replays the call from the idempotency store,
  the side effect happens once (the outbox has one line);
- act with a tool call cut off mid `tool run` → paused_review,
  tool_call_interrupted, with the call (key) as evidence; `show` lists it;
- act without EffectsVia= → paused_review, interrupted_during_execution.

Before each restart `kairosctl recover --dry-run` (offline, reading the WALs
and the idempotency log without changing them) must say the same.  The
handlers write a marker once they run; the test waits for it (no sleeps)."""
import glob
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
# $1: this handler's phase.  ACT_MODE: run (a tool run appends a line to the
# outbox) or hang (a tool run that never ends); BLOCK: the phase whose first
# attempt stops until it is killed.
cat >/dev/null
if [ "$1" = act ]; then
        case "${ACT_MODE:-}" in
        run)
                "$KAIROSCTL" tool run --key "out-$KAIROS_IDEM_KEY" -- \
                        sh -c 'echo "$0" >> "$1"' "$KAIROS_IDEM_KEY" "$OUT/outbox" >/dev/null
                echo "report $KAIROS_ATTEMPT" | "$KAIROSCTL" --json tool write \
                        --key "rep-$KAIROS_IDEM_KEY" "$ROOT/report" > "$OUT/write.$KAIROS_ATTEMPT"
                ;;
        hang-then-run)
                # the same call each attempt; the first one hangs
                ps -o pgid= $$ | tr -d ' ' > "$OUT/pgid.handler"
                exec "$KAIROSCTL" tool run --key "out-$KAIROS_IDEM_KEY" -- sh "$OUT/slow.sh" \
                        "$KAIROS_IDEM_KEY" "$OUT" >/dev/null
                ;;
        hang)
                if [ "$KAIROS_ATTEMPT" = 1 ]; then
                        ps -o pgid= $$ | tr -d ' ' > "$OUT/pgid.handler"
                        exec "$KAIROSCTL" tool run --key "out-$KAIROS_IDEM_KEY" -- sh -c \
                                'ps -o pgid= $$ | tr -d " " > "$0/pgid.tool"; touch "$0/started"; exec sleep 600' \
                                "$OUT"
                fi
                ;;
        esac
fi
if [ "${BLOCK:-}" = "$1" ] && [ "$KAIROS_ATTEMPT" = 1 ]; then
        ps -o pgid= $$ | tr -d ' ' > "$OUT/pgid.handler"
        touch "$OUT/started"
        exec sleep 600
fi
echo '{"ok":true}'
"""

PHASES = ("observe", "orient", "decide", "act", "reflect")
# $OUT/slow.sh, the effect of ACT_MODE=hang-then-run: slow (killed with
# kairosd) at attempt 1
SLOW_CALL = ('if [ "$KAIROS_ATTEMPT" = 1 ]; then ps -o pgid= $$ | tr -d " " > "$2/pgid.tool"; '
             'touch "$2/started"; exec sleep 600; fi; echo "$1" >> "$2/outbox"\n')
WAIT = 60.0


def wait_file(path, daemon, timeout=WAIT):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if daemon.proc.poll() is not None:
            raise AssertionError("kairosd exited before %s:\n%s" % (path, daemon.log()))
        if time.monotonic() > deadline:
            raise TimeoutError("no %s:\n%s" % (path, daemon.log()[-3000:]))
        time.sleep(0.02)  # polling a condition with a deadline


def read_bytes(path):
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return f.read()


class EvidenceRecovery(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-evid-")
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
        self.kill_handlers()
        if self.daemon and self.daemon.proc.poll() is None:
            rc = self.daemon.stop()
            self.assertEqual(rc, 0, self.daemon.log()[-3000:])
        if self.daemon:
            self.daemon.proc.stderr.close()
        self.notify.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def kill_handlers(self):
        for p in glob.glob(os.path.join(self.out, "pgid.*")):
            with open(p) as f:
                pgid = f.read().strip()
            if pgid.isdigit():
                try:
                    os.killpg(int(pgid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            os.unlink(p)

    def configure(self, exec_keys):
        sched = {"Schedule": {"Cron": "0 0 1 1 *"}, "Exec": exec_keys}
        self.conf = write_config(self.dir, self.state, {"job": sched},
                                 daemon_extra="[Idempotency]\nWriteRoots=%s\n" % self.root)

    def exec_keys(self, env, phases=PHASES, **extra):
        keys = {p.capitalize(): "%s %s" % (self.handler, p) for p in phases}
        keys["Environment"] = " ".join(
            ["OUT=%s" % self.out, "ROOT=%s" % self.root,
             "KAIROSCTL=%s" % os.path.abspath(KAIROSCTL)] + env)
        keys.update(extra)
        return keys

    def start(self, env=None):
        self.notify.clear()
        self.daemon = Daemon(self.state, config=self.conf, notify=self.notify, env=env)
        self.notify.wait_ready()

    def ctl(self, *args, check=True):
        p = subprocess.run([KAIROSCTL, "--socket", self.daemon.socket_path] + list(args),
                           capture_output=True, text=True, timeout=60)
        if check:
            self.assertEqual(p.returncode, 0, "kairosctl %s: %s%s" % (args, p.stdout, p.stderr))
        return p

    def crash_during(self, marker="started"):
        """Fire, wait until the blocking handler runs, SIGKILL kairosd."""
        self.start()
        r = json.loads(self.ctl("--json", "fire", "job", "--at", "2030-01-01T00:00:00Z").stdout)
        self.mid = r["mandate"]
        wait_file(os.path.join(self.out, marker), self.daemon)
        self.daemon.kill()
        self.daemon.proc.stderr.close()
        self.kill_handlers()

    def dry_run(self, step):
        """kairosctl recover --dry-run's decision for step (offline)."""
        idem = os.path.join(self.state, "idem", "idem.jsonl")
        before = read_bytes(idem)
        p = subprocess.run([KAIROSCTL, "--json", "recover", "--dry-run", "--state-dir",
                            self.state, "--config", self.conf],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        after = read_bytes(idem)
        self.assertEqual(before, after, "recover --dry-run changed the idempotency log")
        out = json.loads(p.stdout)
        decisions = [d for f in out["files"] for pl in f["plans"] for d in pl["decisions"]
                     if d["step_id"] == step]
        self.assertEqual(len(decisions), 1, out)
        return decisions[0], p

    def restart_and_check(self, step, verdict, reason):
        dr, _ = self.dry_run(step)
        self.assertEqual((dr["verdict"], dr["reason"]), (verdict, reason), dr)
        self.start()
        line = self.daemon.wait_log("recovery: %s %s:" % (self.mid, step))
        self.assertIn("%s (%s)" % (verdict, reason), line)
        # the journal fields: VERDICT= and EVIDENCE= (the evidence object)
        self.assertIn(" VERDICT=%s" % verdict, line)
        self.assertIn(' EVIDENCE="{"reason":"%s"' % reason, line)
        for c in dr["evidence"].get("tool_calls", []):
            self.assertIn('"key":"%s"' % c["key"], line)
        # the record recovery wrote holds what the dry run showed
        self.assertEqual(self.step_of(self.show(), step).get("evidence"), dr["evidence"])
        return dr

    def show(self):
        return json.loads(self.ctl("--json", "show", self.mid).stdout)

    def step_of(self, shown, step):
        for p in shown["plans"]:
            for s in p["steps"]:
                if s["step_id"] == step:
                    return s
        self.fail("no step %s in %s" % (step, shown))

    def wal_records(self):
        live = os.path.join(self.state, "wal", self.mid + ".wal.jsonl")
        data = read_bytes(live)
        if data is None:
            with gzip.open(os.path.join(self.state, "archive", self.mid + ".wal.jsonl.gz")) as f:
                data = f.read()
        return [json.loads(x) for x in data.decode().splitlines() if x.strip()]

    # ---- the cases ----

    def test_non_effect_phase_is_rerun(self):
        self.configure(self.exec_keys(["BLOCK=observe"]))
        self.crash_during()
        self.restart_and_check("observe_001", "safe_to_retry", "declared_rerunnable")
        self.daemon.wait_log("mandate %s done after" % self.mid)
        s = self.step_of(self.show(), "observe_001")
        self.assertEqual((s["status"], s["executions"]), ("completed", 2), s)
        resets = [r for r in self.wal_records() if r.get("reset")]
        self.assertEqual(len(resets), 1)
        self.assertEqual(resets[0]["evidence"]["reason"], "declared_rerunnable")
        self.assertEqual(resets[0]["evidence"]["phase"], "observe")

    def test_phase_without_command_is_rerun(self):
        self.configure(self.exec_keys(["BLOCK=act"]))
        self.crash_during()
        # the act command is gone when kairosd comes back
        self.configure(self.exec_keys([], phases=("observe", "orient", "decide", "reflect")))
        self.restart_and_check("act_001", "safe_to_retry", "no_command")
        self.daemon.wait_log("mandate %s done after" % self.mid)

    def test_journaled_effects_replay(self):
        self.configure(self.exec_keys(["BLOCK=act", "ACT_MODE=run"], EffectsVia="kairosctl"))
        self.crash_during()
        dr = self.restart_and_check("act_001", "safe_to_retry", "effects_journaled")
        key = "cmd:out-%s/act_001" % self.mid
        wkey = "kairos.write:rep-%s/act_001" % self.mid
        self.assertEqual(sorted(c["key"] for c in dr["evidence"]["tool_calls"]),
                         sorted([key, wkey]), dr)
        self.assertEqual({c["state"] for c in dr["evidence"]["tool_calls"]}, {"completed"})
        self.daemon.wait_log("mandate %s done after" % self.mid)
        # ran twice, the side effect once: the second run replayed the call
        with open(os.path.join(self.out, "outbox")) as f:
            self.assertEqual(f.read().splitlines(), ["%s/act_001" % self.mid])
        # the write of attempt 2 was answered from the store: the file is attempt 1's
        with open(os.path.join(self.root, "report")) as f:
            self.assertEqual(f.read(), "report 1\n")
        with open(os.path.join(self.out, "write.1")) as f:
            self.assertFalse(json.load(f).get("cached"))
        with open(os.path.join(self.out, "write.2")) as f:
            self.assertTrue(json.load(f).get("cached"))
        s = self.step_of(self.show(), "act_001")
        self.assertEqual((s["status"], s["executions"]), ("completed", 2), s)
        self.assertEqual(s["evidence"]["reason"], "effects_journaled", s)
        calls = s["tool_calls"]
        self.assertEqual(sorted((c["key"], c["state"], c["attempt"]) for c in calls),
                         sorted([(key, "completed", 1), (wkey, "completed", 1)]), calls)
        text = self.ctl("show", self.mid).stdout
        self.assertIn("act_001 (attempt 1): completed  %s  started " % key, text)

    def test_interrupted_tool_call_needs_review(self):
        self.configure(self.exec_keys(["ACT_MODE=hang"], EffectsVia="kairosctl"))
        self.crash_during()
        dr = self.restart_and_check("act_001", "manual_review", "tool_call_interrupted")
        key = "cmd:out-%s/act_001" % self.mid
        self.assertEqual([(c["key"], c["state"]) for c in dr["evidence"]["tool_calls"]],
                         [(key, "interrupted")], dr)
        self.daemon.wait_log("mandate %s paused for review at step act_001 "
                             "(tool_call_interrupted)" % self.mid)
        shown = self.show()
        self.assertEqual(shown["status"], "paused_review")
        s = self.step_of(shown, "act_001")
        self.assertEqual(s["status"], "needs_review")
        self.assertEqual(s["evidence"]["reason"], "tool_call_interrupted")
        self.assertEqual(s["evidence"]["tool_calls"][0]["key"], key)
        self.assertEqual(s["tool_calls"][0]["state"], "interrupted")
        self.assertFalse(os.path.exists(os.path.join(self.out, "outbox")))

    def resolve_interrupted_call(self, action):
        """kairosd killed inside a slow tool run: the step is paused for
        review; the operator resolves it with action."""
        with open(os.path.join(self.out, "slow.sh"), "w") as f:
            f.write(SLOW_CALL)
        self.configure(self.exec_keys(["ACT_MODE=hang-then-run"], EffectsVia="kairosctl"))
        self.crash_during()
        self.restart_and_check("act_001", "manual_review", "tool_call_interrupted")
        self.daemon.wait_log("mandate %s paused for review at step act_001" % self.mid)
        self.key = "cmd:out-%s/act_001" % self.mid
        p = self.ctl("resolve", self.mid, "act_001", "--" + action, "--reason", "checked it")
        word = "released" if action == "retry" else "completed"
        self.assertIn("\n  %s tool call %s\n" % (word, self.key), p.stdout)
        self.daemon.wait_log("step act_001 of %s resolved --%s by uid %d: checked it; tool "
                             "calls %s: %s" % (self.mid, action, os.getuid(), word, self.key))
        self.daemon.wait_log("mandate %s done after" % self.mid)
        shown = self.show()
        self.assertEqual(shown["status"], "done", shown)
        ops = [(o["action"], o["step_id"], o["reason"]) for o in shown["operators"]]
        self.assertEqual(ops, [("resolve_" + action, "act_001", "checked it"),
                               ("tool_calls_" + word, "act_001", self.key)], ops)
        text = self.ctl("show", self.mid).stdout
        self.assertIn("tool_calls_%s act_001: %s\n" % (word, self.key), text)
        return shown

    def test_resolve_retry_releases_the_call(self):
        """resolve --retry releases the step's interrupted call in the same
        resolution: the re-run runs the effect, once, with no idem forget."""
        self.resolve_interrupted_call("retry")
        with open(os.path.join(self.out, "outbox")) as f:
            self.assertEqual(f.read().splitlines(), ["%s/act_001" % self.mid])
        recs = [json.loads(x) for x in open(os.path.join(self.state, "idem", "idem.jsonl"))]
        forgets = [r for r in recs if r["key"] == self.key and r["op"] == "forget"]
        self.assertEqual([r["uid"] for r in forgets], [os.getuid()], forgets)
        self.assertIn("resolve %s act_001 --retry: checked it" % self.mid, forgets[0]["reason"])

    def test_resolve_done_completes_the_call(self):
        """resolve --done completes the step's interrupted call: recorded as
        completed by the operator, a duplicate is answered from the store."""
        self.resolve_interrupted_call("done")
        self.assertFalse(os.path.exists(os.path.join(self.out, "outbox")))
        e = json.loads(self.ctl("--json", "idem", "get", self.key).stdout)
        self.assertEqual(e["state"], "completed", e)
        # the same call again: answered from the store, not run
        p = self.ctl("--json", "tool", "run", "--key", "out-%s/act_001" % self.mid, "--",
                     "sh", os.path.join(self.out, "slow.sh"), "%s/act_001" % self.mid, self.out)
        r = json.loads(p.stdout)
        self.assertEqual((r["cached"], r["exit_status"], r["completed_by"]["uid"],
                          r["completed_by"]["reason"]), (True, 0, os.getuid(), "checked it"), r)

    def test_crash_between_release_and_resolution(self):
        """kairosd dies after the released call is durable, before the
        resolution: the step is still in review; the same resolve again
        ends as one without the crash (the effect once)."""
        with open(os.path.join(self.out, "slow.sh"), "w") as f:
            f.write(SLOW_CALL)
        self.configure(self.exec_keys(["ACT_MODE=hang-then-run"], EffectsVia="kairosctl"))
        self.crash_during()
        self.start({"KAIROS_TEST_RESOLVE_CRASH": "1"})
        c = subprocess.run([KAIROSCTL, "--socket", self.daemon.socket_path, "resolve",
                            self.mid, "act_001", "--retry", "--reason", "checked it"],
                           capture_output=True, text=True, timeout=60)
        try:
            rc = self.daemon.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.skipTest("kairosd built without -Dtest_hooks=true")
        self.assertEqual(rc, -9, self.daemon.log()[-3000:])
        self.assertNotEqual(c.returncode, 0, c)
        self.daemon.proc.stderr.close()
        self.start()
        self.daemon.wait_log("mandate %s paused for review at step act_001" % self.mid)
        self.assertEqual(self.step_of(self.show(), "act_001")["status"], "needs_review")
        p = self.ctl("resolve", self.mid, "act_001", "--retry", "--reason", "checked it")
        self.assertNotIn("released tool call", p.stdout)   # released already
        self.daemon.wait_log("mandate %s done after" % self.mid)
        with open(os.path.join(self.out, "outbox")) as f:
            self.assertEqual(f.read().splitlines(), ["%s/act_001" % self.mid])

    def test_without_effects_via_needs_review(self):
        self.configure(self.exec_keys(["BLOCK=act", "ACT_MODE=run"]))
        self.crash_during()
        self.restart_and_check("act_001", "manual_review", "interrupted_during_execution")
        self.daemon.wait_log("mandate %s paused for review at step act_001 "
                             "(interrupted_during_execution)" % self.mid)

    def test_dry_run_says_would_probe(self):
        self.configure(self.exec_keys(["BLOCK=act"], Probe="/bin/false"))
        self.crash_during()
        p = subprocess.run([KAIROSCTL, "--json", "recover", "--dry-run", "--state-dir",
                            self.state, "--config", self.conf],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        out = json.loads(p.stdout)
        plan = out["files"][0]["plans"][0]
        # the step is left to its probe: no decision for it yet
        self.assertEqual((plan["outcome"], plan["probe_step"]), ("awaiting_probe", "act_001"))
        self.assertEqual([d for d in plan["decisions"] if d["step_id"] == "act_001"], [])
        self.assertEqual(out["summary"]["would_probe"], 1)
        text = subprocess.run([KAIROSCTL, "recover", "--dry-run", "--state-dir", self.state,
                               "--config", self.conf], capture_output=True, text=True,
                              timeout=60)
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertIn("would run the probe for act_001", text.stdout)


class DryRunConfig(unittest.TestCase):
    """recover --dry-run --config: a configuration that cannot be read or has
    errors is refused (66, 65); an empty state directory has nothing to do."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-evid-cfg-")
        self.state = os.path.join(self.dir, "state")
        os.makedirs(os.path.join(self.state, "wal"))

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def dry(self, conf):
        return subprocess.run([KAIROSCTL, "recover", "--dry-run", "--state-dir", self.state,
                               "--config", conf], capture_output=True, text=True, timeout=60)

    def test_config_errors(self):
        p = self.dry(os.path.join(self.dir, "missing.conf"))
        self.assertEqual(p.returncode, 66, p.stderr)
        bad = os.path.join(self.dir, "bad.conf")
        with open(bad, "w") as f:
            f.write("[Daemon]\nNoSuchKey=1\n")
        p = self.dry(bad)
        self.assertEqual(p.returncode, 65, p.stderr)
        self.assertIn("NoSuchKey", p.stderr)
        good = write_config(self.dir, self.state, {"job": {"Schedule": {"Cron": "@daily"}}})
        p = self.dry(good)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("configuration: %s\nidempotency log: missing" % good, p.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
