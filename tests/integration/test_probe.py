#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Black-box tests of [Exec] Probe= (docs/design.md §8.1, source 4): the real
kairosd, an act that writes an outbox and is cut short by a kill -9 of
kairosd, and a probe that reads the outbox.  After the restart the mandate
is `probing` (READY=1 came first: the probe waits on a FIFO the test opens
only after it has seen READY and the status), then done with the probe's
result (act not run twice) or act retried; a probe that hangs, fails, prints
garbage or lies; its children do not outlive it; a kill -9 while the probe
runs loses nothing and the probe runs again.

No sleeps as synchronization: the tests wait on READY=1, log lines, replies,
and FIFOs; the death of an unrelated process is polled with a deadline."""
import json
import os
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kairos_harness import read_records  # noqa: E402
from test_executor import CRON, KAIROSCTL, ExecCase  # noqa: E402

# act: records its attempt, writes the outbox (unless told to stop before
# it), then waits to be killed on its first attempt.
ACT_SH = r"""
echo "$KAIROS_ATTEMPT" >> "$OUT/act.runs"
if [ "$KAIROS_ATTEMPT" = 1 ] && [ -e "$OUT/crash-before-outbox" ]; then
    : > "$OUT/act.started"; exec sleep 600
fi
printf '%s\n' "$KAIROS_IDEM_KEY" >> "$OUT/outbox"
if [ "$KAIROS_ATTEMPT" = 1 ]; then : > "$OUT/act.started"; exec sleep 600; fi
printf '{"sent":"%s"}\n' "$KAIROS_IDEM_KEY"
"""

# probe: records its run, waits for the test (FIFO), then reads the outbox.
PROBE_SH = r"""
echo run >> "$OUT/probe.runs"
env > "$OUT/probe.env"
cat > "$OUT/probe.stdin"
read go < "$OUT/go"
if grep -qx "$KAIROS_IDEM_KEY" "$OUT/outbox" 2>/dev/null; then
    printf '{"state":"done","result":{"sent":"%s","by":"probe"}}\n' "$KAIROS_IDEM_KEY"
else
    printf '{"state":"not_started"}\n'
fi
"""


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


class ProbeCase(ExecCase):
    def setUp(self):
        super().setUp()
        self.env = {"OUT": self.out}

    def configure_probe(self, probe_body, timeout=None, act_body=ACT_SH, probe_args=""):
        act = self.script("act.sh", act_body)
        probe = self.script("probe.sh", probe_body)
        ex = {"Act": "/bin/sh " + act, "Probe": "/bin/sh " + probe + probe_args,
              "Environment": "OUT=" + self.out}
        if timeout:
            ex["ProbeTimeoutSec"] = str(timeout)
        self.configure({"outbox": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                   "Exec": ex}})

    def out_file(self, name):
        return os.path.join(self.out, name)

    def lines(self, name):
        try:
            with open(self.out_file(name)) as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return []

    def wait_lines(self, name, n, timeout=30):
        """Poll (with a deadline) until the file has n lines: a probe's own
        record of its run, written after kairosd logged its start."""
        deadline = time.monotonic() + timeout
        while len(self.lines(name)) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.lines(name)

    def crash_in_act(self):
        """Fire, let act start (and write the outbox unless told not to), kill -9."""
        self.start()
        m = self.fire("outbox")
        self.d.wait_log("act_001: started")
        deadline = time.monotonic() + 30
        while not os.path.exists(self.out_file("act.started")) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertTrue(os.path.exists(self.out_file("act.started")))
        self.d.kill()
        return m

    def wait_status(self, m, statuses, timeout=30):
        deadline = time.monotonic() + timeout
        while True:
            row = self.mandate(m)
            if row["status"] in statuses:
                return row
            if time.monotonic() > deadline:
                self.fail("mandate %s is %s, not %s:\n%s" % (m, row["status"], statuses,
                                                              self.d.log()[-3000:]))
            time.sleep(0.02)

    def act_records(self, m):
        path = self.wal_path(m)
        recs = read_records(path) if os.path.exists(path) else self.archived(m)
        return [r for r in recs if r.get("step_id") == "act_001" and r["op"] == "transition"]


class TestProbeWord(ProbeCase):
    def test_done_after_ready_keeps_result_act_not_run_twice(self):
        self.configure_probe(PROBE_SH)
        os.mkfifo(self.out_file("go"))
        m = self.crash_in_act()
        self.assertEqual(self.lines("outbox"), [m + "/act_001"])
        self.start()  # returns at READY=1: the probe is blocked on the FIFO
        row = self.mandate(m)
        self.assertEqual(row["status"], "probing", row)
        self.assertIn("act_001", row["reason"])
        self.d.wait_log("act_001: probe started")
        self.assertEqual(self.wait_lines("probe.runs", 1), ["run"])
        # the status counts it; a probing mandate cannot be paused
        st = self.call_ok("status")
        self.assertEqual(st["by_status"].get("probing"), 1, st)
        self.assertEqual([x["id"] for x in self.call_ok("list", status="probing")["mandates"]],
                         [m])
        self.notify.wait_for(lambda msg: "STATUS=" in msg and "1 probing" in msg)
        out = self.ctl("metrics")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn('kairos_mandates{status="probing"} 1', out.stdout)
        r = self.c.call("pause", mandate=m)
        self.assertFalse(r["ok"], r)
        self.assertIn("probing", r["error"]["message"])
        self.release(self.out_file("go"))  # (it wrote env and stdin before it read)
        # the probe's environment and stdin are the step's
        env = dict(line.split("=", 1) for line in self.lines("probe.env") if "=" in line)
        self.assertEqual(env["KAIROS_PROBE"], "1")
        self.assertEqual(env["KAIROS_STEP_ID"], "act_001")
        self.assertEqual(env["KAIROS_IDEM_KEY"], m + "/act_001")
        self.assertEqual(env["KAIROS_ATTEMPT"], "1")
        self.assertEqual(env["KAIROS_MANDATE_ID"], m)
        with open(self.out_file("probe.stdin")) as f:
            doc = json.loads(f.read())
        self.assertEqual(doc["step"], {"step_id": "act_001", "phase": "act", "attempt": 1,
                                       "idem_key": m + "/act_001"})
        self.assertEqual(doc["mandate"]["id"], m)
        row = self.wait_status(m, ("done",))
        self.assertEqual(self.lines("act.runs"), ["1"])  # never run again
        self.assertEqual(self.lines("outbox"), [m + "/act_001"])
        done = self.act_records(m)[-1]
        self.assertEqual(done["status"], "completed")
        self.assertTrue(done["recovered"])
        self.assertEqual(done["result"], {"sent": m + "/act_001", "by": "probe"})
        self.assertEqual(done["evidence"]["reason"], "current_state_matches_expected_post")
        self.assertEqual(done["evidence"]["source"], "probe")
        line = self.d.wait_log("VERDICT=already_done")
        self.assertIn("act_001", line)
        # show says so
        out = self.ctl("--json", "show", m)
        self.assertEqual(out.returncode, 0, out.stderr)
        shown = json.loads(out.stdout)
        step = [s for p in shown["plans"] for s in p["steps"]
                if s["step_id"] == "act_001"][0]
        self.assertEqual(step["evidence"]["source"], "probe")
        self.assertTrue(step["recovered"])
        out = self.ctl("show", m)
        self.assertEqual(out.returncode, 0, out.stderr)
        row = [line.split() for line in out.stdout.splitlines() if line.split()[:1] == ["act_001"]]
        self.assertEqual(row[0][1:4], ["completed", "1", "probe"], out.stdout)

    def test_variables_expand_from_the_probes_environment(self):
        # its arguments: the step's key, KAIROS_PROBE (a probe's own), an
        # Environment= name, a literal $
        self.configure_probe('printf "%s\\n" "$@" > "$OUT/probe.args"\n'
                             'echo \'{"state":"not_started"}\'\n',
                             probe_args=" key=${KAIROS_IDEM_KEY} $KAIROS_PROBE $OUT $$")
        open(self.out_file("crash-before-outbox"), "w").close()
        m = self.crash_in_act()
        self.start()
        self.wait_status(m, ("done",))
        self.assertEqual(self.lines("probe.args"), ["key=%s/act_001" % m, "1", self.out, "$"])
        self.assertEqual(self.lines("act.runs"), ["1", "2"])

    def test_not_started_retries_act(self):
        self.configure_probe(PROBE_SH)
        os.mkfifo(self.out_file("go"))
        open(self.out_file("crash-before-outbox"), "w").close()
        m = self.crash_in_act()
        self.assertEqual(self.lines("outbox"), [])
        self.start()
        self.assertEqual(self.mandate(m)["status"], "probing")
        self.release(self.out_file("go"))
        self.wait_status(m, ("done",))
        self.assertEqual(self.lines("act.runs"), ["1", "2"])
        self.assertEqual(self.lines("outbox"), [m + "/act_001"])  # once
        recs = self.act_records(m)
        self.assertEqual([r["status"] for r in recs if r["status"] not in ("reset", "pending")],
                         ["executing", "executing", "completed"])
        reset = [r for r in recs if r.get("reset")]
        self.assertEqual(len(reset), 1)
        self.assertEqual((reset[0]["evidence"]["reason"], reset[0]["evidence"]["source"]),
                         ("current_pre_matches_expected", "probe"))
        self.assertIn("VERDICT=safe_to_retry", self.d.wait_log("VERDICT=safe_to_retry"))

    def test_cancel_while_probing_wins(self):
        self.configure_probe(PROBE_SH)
        os.mkfifo(self.out_file("go"))
        m = self.crash_in_act()
        self.start()
        self.d.wait_log("act_001: probe started")
        r = self.call_ok("cancel", mandate=m, reason="not needed any more")
        self.assertEqual(r["status"], "cancelled")
        self.release(self.out_file("go"))
        self.d.wait_log("the probe's word is not used (no longer probing)")
        self.assertEqual(self.mandate(m)["status"], "cancelled")
        recs = self.act_records(m)
        self.assertEqual(recs[-1]["status"], "failed")
        self.assertEqual(recs[-1]["error_class"], "cancelled")
        self.assertEqual(self.lines("act.runs"), ["1"])

    def test_lie_is_recorded_as_the_probe_word(self):
        # act never wrote the outbox, but the probe says done
        self.configure_probe('echo run >> "$OUT/probe.runs"\n'
                             'printf \'{"state":"done","result":"trust me"}\'\n')
        open(self.out_file("crash-before-outbox"), "w").close()
        m = self.crash_in_act()
        self.start()
        self.wait_status(m, ("done",))
        self.assertEqual(self.lines("act.runs"), ["1"])
        self.assertEqual(self.lines("outbox"), [])
        done = self.act_records(m)[-1]
        self.assertEqual((done["status"], done["result"], done["evidence"]["source"],
                          done["evidence"]["reason"]),
                         ("completed", "trust me", "probe", "current_state_matches_expected_post"))


class TestProbeFails(ProbeCase):
    def expect_review(self, probe_body, expect, timeout=None):
        self.configure_probe(probe_body, timeout=timeout)
        m = self.crash_in_act()
        self.start()
        row = self.wait_status(m, ("paused_review",))
        self.assertEqual((row["review_step"], row["reason"]), ("act_001", "probe_inconclusive"))
        rec = self.act_records(m)[-1]
        self.assertEqual(rec["status"], "needs_review")
        out = rec["evidence"]["probe_output"]
        self.assertIn(expect, out)
        self.assertEqual(self.lines("act.runs"), ["1"])
        return m, out

    def test_garbage_and_its_children_die_with_it(self):
        # a child left behind (holding stdout open) dies when the probe exits
        _, out = self.expect_review('sleep 600 &\necho $! > "$OUT/child.pid"\n'
                                    "echo 'all good, trust me'\n", "not a probe answer")
        self.assertIn("stdout: all good, trust me", out)
        self.wait_lines("child.pid", 1)
        with open(self.out_file("child.pid")) as f:
            child = int(f.read())
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertFalse(alive(child), "the probe's child %d outlived it" % child)

    def test_non_zero_exit(self):
        _, out = self.expect_review(
            'printf \'{"state":"done","result":1}\'\necho "db down" >&2\nexit 3\n',
            "exit status 3")
        self.assertIn("stderr: db down", out)

    def test_hang_times_out_and_its_children_die(self):
        body = 'sleep 600 &\necho $! > "$OUT/child.pid"\nwait\n'
        _, out = self.expect_review(body, "no answer within ProbeTimeoutSec=1", timeout=1)
        self.wait_lines("child.pid", 1)
        with open(self.out_file("child.pid")) as f:
            child = int(f.read())
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertFalse(alive(child), "the probe's child %d outlived it" % child)

    def test_probe_does_not_delay_ready(self):
        # a probe far longer than the startup: READY=1 (start() waits for it)
        # comes while the probe still runs
        self.configure_probe('echo $$ > "$OUT/probe.pid"\nexec sleep 600\n', timeout=600)
        m = self.crash_in_act()
        self.start()
        self.d.wait_log("act_001: probe started")
        self.assertEqual(self.mandate(m)["status"], "probing")
        self.wait_lines("probe.pid", 1)
        with open(self.out_file("probe.pid")) as f:
            pid = int(f.read())
        self.assertTrue(alive(pid))
        # a graceful stop kills it and records nothing: probing again next time
        self.assertEqual(self.d.stop(), 0)
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertFalse(alive(pid))
        self.assertEqual(self.act_records(m)[-1]["status"], "executing")


READ_OUTBOX_SH = r"""
echo run >> "$OUT/probe.runs"
cat > "$OUT/probe.stdin"
if grep -qx "$KAIROS_IDEM_KEY" "$OUT/outbox" 2>/dev/null; then
    printf '{"state":"done","result":{"sent":"%s"}}\n' "$KAIROS_IDEM_KEY"
else
    printf '{"state":"not_started"}\n'
fi
"""


class TestDryRunProbe(ProbeCase):
    """kairosctl recover --dry-run --probe runs the probes offline (the same
    judge and decision as kairosd) and changes nothing."""

    def dry(self, *extra):
        return subprocess.run([KAIROSCTL, "recover", "--dry-run", "--probe", "--config",
                               self.conf, *extra], capture_output=True, text=True, timeout=60)

    def test_done_and_not_started(self):
        self.configure_probe(READ_OUTBOX_SH)
        m = self.crash_in_act()
        wal = read_records(self.wal_path(m))
        # without --probe nothing runs
        out = subprocess.run([KAIROSCTL, "recover", "--dry-run", "--state-dir", self.state],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(self.lines("probe.runs"), [])
        out = self.dry()
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("probe of act_001 said done: {\"sent\":\"%s/act_001\"}" % m, out.stdout)
        self.assertIn("act_001 (status executing): already_done, row 2, "
                      "current_state_matches_expected_post", out.stdout)
        self.assertEqual(self.lines("probe.runs"), ["run"])
        with open(self.out_file("probe.stdin")) as f:
            self.assertEqual(json.load(f)["step"]["idem_key"], m + "/act_001")
        # the outbox emptied: not_started, in JSON
        os.unlink(self.out_file("outbox"))
        out = self.dry()
        self.assertEqual(out.returncode, 0, out.stderr)
        out = self.dry("--json")
        self.assertEqual(out.returncode, 0, out.stderr)
        f = json.loads(out.stdout)["files"][0]
        self.assertEqual((f["probe"]["step"], f["probe"]["said"]), ("act_001", "not_started"))
        self.assertEqual(f["plans"][0]["decisions"][0]["verdict"], "safe_to_retry")
        self.assertEqual(f["plans"][0]["decisions"][0]["reason"], "current_pre_matches_expected")
        self.assertEqual(read_records(self.wal_path(m)), wal)  # nothing changed

    def test_hang_is_killed_with_its_children(self):
        self.configure_probe('sleep 600 &\necho $! > "$OUT/child.pid"\n'
                             'exec >/dev/null 2>&1\nwait\n', timeout=1)
        self.crash_in_act()
        out = self.dry()
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("probe of act_001 said failed: no answer within ProbeTimeoutSec=1",
                      out.stdout)
        with open(self.out_file("child.pid")) as f:
            child = int(f.read())
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertFalse(alive(child), "the probe's child %d outlived it" % child)

    def test_garbage_and_config_errors(self):
        self.configure_probe('echo nonsense\nexit 0\n')
        self.crash_in_act()
        out = self.dry()
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("probe of act_001 said failed: not a probe answer", out.stdout)
        self.assertIn("manual_review", out.stdout)
        self.assertIn("probe_inconclusive", out.stdout)
        # without --probe the step is only said to await its probe
        out = subprocess.run([KAIROSCTL, "recover", "--dry-run", "--config", self.conf],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("would run the probe for act_001", out.stdout)
        self.assertNotIn("probe of act_001 said", out.stdout)
        out = subprocess.run([KAIROSCTL, "recover", "--dry-run", "--probe", "--config",
                              os.path.join(self.dir, "nope.conf")],
                             capture_output=True, text=True, timeout=60)
        # a --config that cannot be read: 66, as without --probe
        self.assertEqual(out.returncode, 66, out.stderr)
        self.assertIn("nope.conf", out.stderr)


EXAMPLES = os.path.join(os.environ.get("KAIROS_SRCDIR", os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..")), "config", "examples")


class TestShippedExample(ProbeCase):
    """config/examples/outbox.conf with its act and probe: valid as shipped,
    and after a kill -9 right after act sent its message, the shipped probe
    finds it: act completed on the probe's word, the message sent once."""

    def example(self, outbox):
        with open(os.path.join(EXAMPLES, "outbox.conf")) as f:
            text = f.read()
        text = text.replace("/usr/share/kairos/examples", EXAMPLES)
        return text.replace("OUTBOX=/var/lib/kairos/outbox", "OUTBOX=" + outbox)

    def test_valid_as_shipped(self):
        self.configure({})
        with open(os.path.join(self.dir, "schedules.d", "outbox.conf"), "w") as f:
            with open(os.path.join(EXAMPLES, "outbox.conf")) as src:
                f.write(src.read())
        p = subprocess.run([os.environ.get("KAIROSD", "kairosd"), "--check-config", "-c",
                            self.conf], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("outbox: 30 6 * * * (UTC)", p.stdout)

    def test_crash_after_send_is_completed_by_the_probe(self):
        outbox = os.path.join(self.dir, "outbox")
        self.configure({})
        text = self.example(outbox).replace(
            "Act=%s/outbox-act.sh" % EXAMPLES,
            "Act=/bin/sh -c '%s/outbox-act.sh && : > %s/act.started && exec sleep 600'"
            % (EXAMPLES, self.out))
        with open(os.path.join(self.dir, "schedules.d", "outbox.conf"), "w") as f:
            f.write(text)
        self.start()
        m = self.fire("outbox")
        deadline = time.monotonic() + 30
        while not os.path.exists(self.out_file("act.started")) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertTrue(os.path.exists(self.out_file("act.started")))
        self.d.kill()
        self.start()
        self.wait_status(m, ("done",))
        with open(os.path.join(outbox, "messages")) as f:
            sent = f.read().splitlines()
        self.assertEqual(len(sent), 1)
        self.assertTrue(sent[0].startswith(m + "/act_001 "))
        done = self.act_records(m)[-1]
        self.assertEqual(done["result"], {"sent": m + "/act_001", "found_by": "probe"})
        self.assertEqual(done["evidence"]["source"], "probe")


class TestProbeCrash(ProbeCase):
    def test_kill_during_probe_runs_it_again(self):
        self.configure_probe(PROBE_SH)
        os.mkfifo(self.out_file("go"))
        m = self.crash_in_act()
        wal_before = read_records(self.wal_path(m))
        self.start()
        self.d.wait_log("act_001: probe started")
        self.assertEqual(self.wait_lines("probe.runs", 1), ["run"])
        self.d.kill()  # the probe is blocked on the FIFO
        self.assertEqual(read_records(self.wal_path(m)), wal_before)  # nothing recorded
        self.start()
        self.assertEqual(self.mandate(m)["status"], "probing")
        self.d.wait_log("act_001: probe started")
        self.assertEqual(self.wait_lines("probe.runs", 2), ["run", "run"])
        self.release(self.out_file("go"))
        self.wait_status(m, ("done",))
        self.assertEqual(self.lines("act.runs"), ["1"])
        self.assertEqual(self.lines("outbox"), [m + "/act_001"])
        self.assertEqual([r["status"] for r in self.act_records(m)], ["executing", "completed"])


def ts_ms(ts):
    """A WAL timestamp (2026-04-20T12:00:00.123Z) in ms since the epoch."""
    import calendar
    base, frac = ts.rstrip("Z").split(".")
    return calendar.timegm(time.strptime(base, "%Y-%m-%dT%H:%M:%S")) * 1000 + int(frac)


class TestShowInterrupted(ProbeCase):
    """show: an interrupted act's duration ends at the last record before
    kairosd went down (the downtime is not the step's), and the text view
    says what decided it, on what evidence (only --json did)."""

    DOWNTIME = 0.5  # how long kairosd stays down (not a synchronization)

    def interrupted(self, probe_body):
        self.configure_probe(probe_body)
        m = self.crash_in_act()
        time.sleep(self.DOWNTIME)
        self.start()
        self.wait_status(m, ("done",))
        out = self.ctl("--json", "show", m)
        self.assertEqual(out.returncode, 0, out.stderr)
        got = json.loads(out.stdout)
        act = [s for p in got["plans"] for s in p["steps"] if s["step_id"] == "act_001"][0]
        text = self.ctl("show", m)
        self.assertEqual(text.returncode, 0, text.stderr)
        return m, act, text.stdout

    def test_completed_by_the_probe(self):
        m, act, text = self.interrupted(READ_OUTBOX_SH)
        executing = [r for r in self.act_records(m) if r["status"] == "executing"][0]
        it = act["interrupted"]
        self.assertEqual((it["execution"], it["started_at"], it["decision"]),
                         (1, executing["ts"], "completed"))
        # it ran until the last record before the crash: its executing record
        self.assertEqual(it["ended_at"], executing["ts"])
        self.assertEqual(act["duration_ms"], ts_ms(it["ended_at"]) - ts_ms(it["started_at"]))
        self.assertLess(act["duration_ms"], self.DOWNTIME * 1000)
        self.assertGreaterEqual(ts_ms(it["decided_at"]) - ts_ms(it["started_at"]),
                                self.DOWNTIME * 1000)
        self.assertEqual(it["evidence"]["source"], "probe")
        self.assertIn("\n    Interrupted executions:\n      act_001 execution 1: ran %dms up to "
                      "the last record before kairosd went down (%s); completed, decided by its "
                      "probe: current_state_matches_expected_post at %s\n"
                      % (act["duration_ms"], it["ended_at"], it["decided_at"]), text)

    def test_run_again_after_the_probe_said_not_started(self):
        m, act, text = self.interrupted('cat >/dev/null\nprintf \'{"state":"not_started"}\\n\'\n')
        self.assertEqual(act["executions"], 2)
        it = act["interrupted"]
        self.assertEqual((it["execution"], it["decision"]), (1, "pending"))
        # the step's duration is its second execution's, shown separately
        self.assertEqual(act["duration_ms"], ts_ms(act["ended_at"]) - ts_ms(act["started_at"]))
        self.assertGreater(ts_ms(act["started_at"]), ts_ms(it["ended_at"]))
        self.assertRegex(text, r"\n      act_001 execution 1: ran \d+ms up to the last record "
                               r"before kairosd went down \(\S+\); re-run as execution 2, "
                               r"decided by its probe: current_pre_matches_expected at \S+\n")


class TestStopWithProbeQueued(ProbeCase):
    """A SIGTERM right after READY=1 while the runner's thread still holds a
    probe it has not started (KAIROS_TEST_RUNNER_HOLD, -Dtest_hooks=true:
    the thread holds the spawn until kairosd stops, as a slow clone would):
    kairosd stops cleanly (it aborted in libuv: the thread spawned the probe
    after the loop had closed its handles and woke the closed loop), the
    probe never runs, nothing is recorded."""

    def test_sigterm_before_the_probe_is_spawned(self):
        self.configure_probe(PROBE_SH)
        m = self.crash_in_act()
        wal_before = read_records(self.wal_path(m))
        held = self.out_file("held")
        self.start(env={"KAIROS_TEST_RUNNER_HOLD": held})
        deadline = time.monotonic() + 10
        while not os.path.exists(held) and time.monotonic() < deadline:
            time.sleep(0.005)
        if not os.path.exists(held):
            self.skipTest("kairosd was built without -Dtest_hooks=true")
        rc = self.d.stop()
        self.assertEqual(rc, 0, self.d.log()[-3000:])
        self.assertIn("stopping: 1 handler not started", self.d.log())
        self.assertEqual(self.lines("probe.runs"), [])  # never started
        self.assertEqual(read_records(self.wal_path(m)), wal_before)
        # the next start probes it
        os.mkfifo(self.out_file("go"))
        self.start()
        self.d.wait_log("act_001: probe started")
        self.assertEqual(self.wait_lines("probe.runs", 1), ["run"])
        self.release(self.out_file("go"))
        self.wait_status(m, ("done",))
        self.assertEqual(self.lines("act.runs"), ["1"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
