#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Black-box tests of an interrupted tool call decided without a human
(docs/design.md §8): kairosd is killed with kill -9 while the act's
`kairosctl tool run` runs its command (the effect), the handler dies with
it, and at the restart:

- the call's own check (`tool run --check CHECK`) says done → the call is
  completed in the store ("settled": "by its check"), the act re-runs, its
  tool run is answered from the store: the effect is made once, the mandate
  done; not_started → the key is released (a forget with uid -2 naming the
  check), the re-run makes the effect once; anything else (garbage, a
  timeout, a non-zero exit) → paused, tool_check_inconclusive, with what
  the check said;
- without a check, the schedule's Probe= is asked before a human, and the
  step's interrupted calls are settled with its word; with neither, the step
  is paused (tool_call_interrupted) as before;
- `kairosctl recover --dry-run --probe` shows the same decision, the store
  untouched;
- a bad --check is a usage error (64) naming the option.

The 20-kill figure of the long run: KAIROS_TOOL_KILLS=20 (default 3).

No sleeps as synchronization: READY=1, log lines, files with a deadline."""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_evidence_recovery as ter  # noqa: E402
from kairos_harness import KAIROSCTL, Client  # noqa: E402

# the act: one tool run of $OUT/effect.sh, with the check when $OUT/use-check
ACT_SH = r"""#!/bin/sh
cat >/dev/null
ps -o pgid= $$ | tr -d ' ' > "$OUT/pgid.handler"
if [ -e "$OUT/use-check" ]; then
        exec "$KAIROSCTL" tool run --key "out-$KAIROS_IDEM_KEY" --check "sh '$OUT/check.sh' x" \
                -- sh "$OUT/effect.sh" "an arg"
fi
exec "$KAIROSCTL" tool run --key "out-$KAIROS_IDEM_KEY" -- sh "$OUT/effect.sh" "an arg"
"""

# the effect: one line in the outbox per run; the first attempt then waits
# to be killed ($OUT/before: before the outbox line); its process group is
# recorded so that the test can kill the call with kairosd, as a host crash
# would (a kairosd crash alone lets the call finish: test_tool_outlive.py)
EFFECT_SH = r"""
ps -o pgid= $$ | tr -d ' ' > "$OUT/pgid.tool"
if [ -e "$OUT/before" ] && [ "$KAIROS_ATTEMPT" = 1 ]; then
        touch "$OUT/started"; exec sleep 600
fi
echo "$KAIROS_IDEM_KEY" >> "$OUT/outbox"
if [ "$KAIROS_ATTEMPT" = 1 ]; then touch "$OUT/started"; exec sleep 600; fi
"""

# the check (and the probe): asks the outbox, or misbehaves ($OUT/mode)
CHECK_SH = r"""
echo "$@" >> "$OUT/check.runs"
env > "$OUT/check.env"
cat > "$OUT/check.stdin"
case "$(cat "$OUT/mode" 2>/dev/null)" in
garbage) echo "no idea what happened"; exit 0 ;;
fail) echo "cannot reach the outbox" >&2; exit 3 ;;
hang) exec sleep 600 ;;
esac
if grep -qx "$KAIROS_IDEM_KEY" "$OUT/outbox" 2>/dev/null; then
        printf '{"state":"done","result":{"by":"%s"}}\n' "${KAIROS_CHECK:+check}${KAIROS_PROBE:+probe}"
else
        printf '{"state":"not_started"}\n'
fi
"""


class ToolCheck(unittest.TestCase):
    setUp_base = ter.EvidenceRecovery.setUp
    tearDown = ter.EvidenceRecovery.tearDown
    kill_handlers = ter.EvidenceRecovery.kill_handlers
    configure = ter.EvidenceRecovery.configure
    start = ter.EvidenceRecovery.start
    ctl = ter.EvidenceRecovery.ctl
    crash_during = ter.EvidenceRecovery.crash_during
    show = ter.EvidenceRecovery.show
    step_of = ter.EvidenceRecovery.step_of

    def setUp(self):
        self.setUp_base()
        for name, body in (("act.sh", ACT_SH), ("effect.sh", EFFECT_SH),
                           ("check.sh", CHECK_SH)):
            with open(os.path.join(self.out, name), "w") as f:
                f.write(body)

    def touch(self, name, text=""):
        with open(os.path.join(self.out, name), "w") as f:
            f.write(text)

    def lines(self, name):
        try:
            with open(os.path.join(self.out, name)) as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return []

    def setup_case(self, check=None, probe=False, before=False, mode="", timeout=None):
        if check:
            self.touch("use-check")
        if before:
            self.touch("before")
        self.touch("mode", mode)
        ex = {"Act": "/bin/sh %s/act.sh" % self.out, "EffectsVia": "kairosctl",
              "Environment": "OUT=%s KAIROSCTL=%s" % (self.out, os.path.abspath(KAIROSCTL))}
        if probe:
            ex["Probe"] = "/bin/sh %s/check.sh probe" % self.out
        if timeout:
            ex["ProbeTimeoutSec"] = str(timeout)
        self.configure(ex)

    def crash(self):
        self.crash_during()
        self.key = "cmd:out-%s/act_001" % self.mid
        self.assertEqual(self.idem_log_state(), "begin")

    def idem_records(self):
        with open(os.path.join(self.state, "idem", "idem.jsonl")) as f:
            return [json.loads(x) for x in f if x.strip()]

    def idem_log_state(self):
        recs = [r for r in self.idem_records() if r["key"] == self.key]
        return recs[-1]["op"] if recs else None

    def dry_probe(self):
        """recover --dry-run --probe (runs checks and probes, writes nothing)."""
        idem = os.path.join(self.state, "idem", "idem.jsonl")
        before = ter.read_bytes(idem)
        p = subprocess.run([KAIROSCTL, "--json", "recover", "--dry-run", "--probe",
                            "--state-dir", self.state, "--config", self.conf],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual(before, ter.read_bytes(idem), "the dry run changed the store")
        out = json.loads(p.stdout)
        return out["files"][0]["plans"][0], p

    def wait_end(self, what):
        return self.daemon.wait_log("mandate %s %s" % (self.mid, what))

    # ---- the call's own check ----

    def test_check_done_completes_the_call(self):
        self.setup_case(check=True)
        self.crash()
        plan, p = self.dry_probe()
        dec = [d for d in plan["decisions"] if d["step_id"] == "act_001"]
        self.assertEqual((dec[0]["verdict"], dec[0]["reason"]),
                         ("safe_to_retry", "effects_journaled"), plan)
        checks = json.loads(p.stdout)["files"][0]["checks"]
        self.assertEqual([(c["step"], c["key"], c["said"], c["result"]) for c in checks],
                         [("act_001", self.key, "done", {"by": "check"})], checks)
        # the text says it too, and the check ran (the dry run's own run)
        t = subprocess.run([KAIROSCTL, "recover", "--dry-run", "--probe", "--state-dir",
                            self.state, "--config", self.conf], capture_output=True, text=True,
                           timeout=60)
        self.assertIn("check of tool call %s said done" % self.key, t.stdout)
        self.assertIn("(would complete the call)", t.stdout)
        self.start()
        self.daemon.wait_log("tool call %s completed by its check" % self.key)
        self.wait_end("done after")
        self.assertEqual(self.lines("outbox"), ["%s/act_001" % self.mid])  # once
        e = json.loads(self.ctl("--json", "idem", "get", self.key).stdout)
        self.assertEqual(e["state"], "completed", e)
        self.assertEqual(e["result"]["settled"], "by its check", e)
        self.assertEqual(e["check"]["cmd"], ["sh", os.path.join(self.out, "check.sh"), "x"], e)
        self.assertIn("  check:       sh %s x\n" % os.path.join(self.out, "check.sh"),
                      self.ctl("idem", "get", self.key).stdout)
        self.assertEqual(e["result"]["check_result"], {"by": "check"}, e)
        # what the check was given: the call's key, tool, argv
        with open(os.path.join(self.out, "check.stdin")) as f:
            stdin = json.load(f)
        self.assertEqual(stdin,
                         {"tool": "cmd", "key": "out-%s/act_001" % self.mid,
                          "argv": ["sh", os.path.join(self.out, "effect.sh"), "an arg"]})
        env = dict(x.split("=", 1) for x in self.lines("check.env") if "=" in x)
        self.assertEqual((env["KAIROS_CHECK"], env["KAIROS_TOOL"], env["KAIROS_TOOL_KEY"],
                          env["KAIROS_IDEM_KEY"]),
                         ("1", "cmd", self.key, "%s/act_001" % self.mid), env)
        self.assertEqual(self.lines("check.runs")[-1], "x")
        self.assertEqual(self.show()["status"], "done")

    def test_check_not_started_releases_the_key(self):
        self.setup_case(check=True, before=True)
        self.crash()
        plan, _ = self.dry_probe()
        self.assertEqual(plan["outcome"], "resume", plan)
        self.start()
        self.daemon.wait_log("tool call %s released by its check" % self.key)
        self.wait_end("done after")
        self.assertEqual(self.lines("outbox"), ["%s/act_001" % self.mid])  # once
        forgets = [r for r in self.idem_records() if r["key"] == self.key and
                   r["op"] == "forget"]
        self.assertEqual([r["uid"] for r in forgets], [-2], forgets)
        self.assertIn("released by its check", forgets[0]["reason"])

    def inconclusive(self, mode, said, timeout=None):
        self.setup_case(check=True, mode=mode, timeout=timeout)
        self.crash()
        plan, _ = self.dry_probe()
        self.assertEqual((plan["outcome"], plan["pause_reason"]),
                         ("paused_review", "tool_check_inconclusive"), plan)
        self.start()
        self.wait_end("paused for review at step act_001 (tool_check_inconclusive)")
        ev = self.step_of(self.show(), "act_001")["evidence"]
        self.assertEqual(ev["reason"], "tool_check_inconclusive", ev)
        self.assertEqual(ev["check"]["key"], self.key, ev)
        self.assertIn(said, ev["check"]["output"], ev)
        self.assertEqual(self.lines("outbox"), ["%s/act_001" % self.mid])
        # the call stays interrupted for the operator
        e = json.loads(self.ctl("--json", "idem", "get", self.key).stdout)
        self.assertEqual(e["state"], "interrupted", e)

    def test_check_garbage_needs_review(self):
        self.inconclusive("garbage", "no idea what happened")

    def test_check_failure_needs_review(self):
        self.inconclusive("fail", "cannot reach the outbox")

    def test_check_timeout_needs_review(self):
        self.inconclusive("hang", "ProbeTimeoutSec=1", timeout=1)

    # ---- the schedule's Probe= for an interrupted call ----

    def test_probe_done_settles_the_call(self):
        self.setup_case(probe=True)
        self.crash()
        self.start()
        self.wait_end("done after")
        self.assertEqual(self.lines("outbox"), ["%s/act_001" % self.mid])
        e = json.loads(self.ctl("--json", "idem", "get", self.key).stdout)
        self.assertEqual(e["state"], "completed", e)
        self.assertEqual(e["result"]["completed_by"]["how"],
                         "the schedule's Probe= at recovery", e)
        dec = self.step_of(self.show(), "act_001")
        self.assertEqual(dec["result"], {"by": "probe"}, dec)

    def test_probe_not_started_releases_the_call(self):
        self.setup_case(probe=True, before=True)
        self.crash()
        plan, _ = self.dry_probe()
        self.assertEqual(plan["outcome"], "resume", plan)
        self.start()
        self.wait_end("done after")
        self.assertEqual(self.lines("outbox"), ["%s/act_001" % self.mid])  # once
        forgets = [r for r in self.idem_records() if r["key"] == self.key and
                   r["op"] == "forget"]
        self.assertEqual(len(forgets), 1, forgets)
        self.assertIn("Probe=", forgets[0]["reason"])

    def test_neither_needs_review(self):
        self.setup_case()
        self.crash()
        plan, _ = self.dry_probe()
        self.assertEqual(plan["pause_reason"], "tool_call_interrupted", plan)
        self.start()
        self.wait_end("paused for review at step act_001 (tool_call_interrupted)")

    # ---- bad input ----

    def test_bad_check_is_a_usage_error(self):
        for bad, why in (("", "empty"), ("   ", "empty"), ("sh 'x", "unbalanced quote"),
                         ('sh "x', "unbalanced quote")):
            p = subprocess.run([KAIROSCTL, "--socket", "/nonexistent", "tool", "run",
                                "--key", "k", "--check", bad, "--", "true"],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 64, (bad, p.stderr))
            self.assertIn("--check", p.stderr)
            self.assertIn(why, p.stderr)

    def test_bad_check_request_is_refused(self):
        """tool-begin with a bad args.check: bad_argument naming it, nothing
        claimed."""
        self.setup_case()
        self.start()
        c = Client(self.daemon.socket_path)
        try:
            for bad in ({"cmd": []}, {"cmd": [""]}, {"cmd": "sh"}, {"cmd": [1]}, "sh",
                        {"cmd": ["x" * 70000]}):
                r = c.call("tool-begin", tool="cmd", key="k", input={"argv": ["true"]},
                           check=bad)
                self.assertFalse(r["ok"], r)
                self.assertEqual(r["error"]["code"], "bad_argument", r)
                self.assertIn("args.check", r["error"]["message"], r)
            r = c.call("idem-get", key="cmd:k")
            self.assertFalse(r["ok"], r)
        finally:
            c.close()

    def test_check_is_kept_with_the_claim(self):
        """The check is in the begin record, durable before the command ran
        (logs without it load: tests/unit/test_idem_log.c)."""
        self.setup_case(check=True)
        self.crash()
        recs = self.idem_records()
        self.assertEqual(recs[-1]["op"], "begin")
        self.assertIn("check", recs[-1])
        self.assertEqual(recs[-1]["check"]["cmd"], ["sh", os.path.join(self.out, "check.sh"),
                                                    "x"])


# ---- the long run: N kills inside a 2-second tool run ----

# the effect made at the start of 2 s of work, or ($OUT/late) at its end;
# killed with kairosd, as by a host crash (pgid.tool)
LONG_EFFECT = r"""
ps -o pgid= $$ | tr -d ' ' > "$OUT/pgid.tool"
[ -e "$OUT/late" ] || echo "$KAIROS_IDEM_KEY" >> "$OUT/outbox"
touch "$OUT/started"
sleep 2
[ -e "$OUT/late" ] && echo "$KAIROS_IDEM_KEY" >> "$OUT/outbox"
exit 0
"""


class ToolKills(unittest.TestCase):
    """KAIROS_TOOL_KILLS kill -9s of kairosd inside a 2 s tool run (its
    effect made at its start in even rounds, at its end in odd ones; the
    kill at a random point of the first 1.5 s), for --check and for Probe=:
    how many decided alone, duplicates, final states."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-toolkills-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def run_case(self, with_check, with_probe=True, expect_alone=True):
        kills = int(os.environ.get("KAIROS_TOOL_KILLS", "3"))
        alone = dup = done = lost = 0
        ends = {}
        seed = int(os.environ.get("KAIROS_TOOL_SEED", random.randrange(1 << 30)))
        rng = random.Random(seed)
        for i in range(kills):
            t = ToolCheck("test_neither_needs_review")
            t.setUp()
            try:
                with open(os.path.join(t.out, "effect.sh"), "w") as f:
                    f.write(LONG_EFFECT)
                t.setup_case(check=with_check, probe=with_probe and not with_check)
                if i % 2:
                    t.touch("late")
                t.start()
                r = json.loads(t.ctl("--json", "fire", "job", "--at",
                                     "2030-01-01T00:00:00Z").stdout)
                t.mid = r["mandate"]
                ter.wait_file(os.path.join(t.out, "started"), t.daemon)
                time.sleep(rng.uniform(0, 1.5))  # the kill point (not a synchronization)
                t.daemon.kill()
                t.daemon.proc.stderr.close()
                t.kill_handlers()
                t.start()
                deadline = time.monotonic() + 60
                while True:
                    st = t.show()["status"]
                    if st in ("done", "paused_review", "failed") or time.monotonic() > deadline:
                        break
                    time.sleep(0.05)  # polling the mandate's state with a deadline
                dup += max(0, len(t.lines("outbox")) - 1)
                lost += st == "done" and not t.lines("outbox")
                ends[st] = ends.get(st, 0) + 1
                if st == "done":
                    alone += 1
                    done += 1
            finally:
                t.tearDown()
        what = "--check" if with_check else "Probe=" if with_probe else "neither"
        print("\n%s: %d kills inside a 2 s tool run (seed %d): %d decided alone, "
              "%d duplicates, %d done without their effect, final states %s; load %s"
              % (what, kills, seed, alone, dup, lost, ends, os.getloadavg()),
              file=sys.stderr)
        if expect_alone:
            self.assertEqual((alone, dup, lost, done), (kills, 0, 0, kills))
        else:
            self.assertEqual((dup, ends), (0, {"paused_review": kills}))

    def test_kills_with_check(self):
        self.run_case(True)

    def test_kills_with_probe(self):
        self.run_case(False)

    def test_kills_with_neither(self):
        """(the client died with the handler: a human decides, as before)"""
        self.run_case(False, with_probe=False, expect_alone=False)


if __name__ == "__main__":
    unittest.main()
