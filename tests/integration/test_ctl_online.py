#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Black-box tests of the online kairosctl commands (docs/design.md §12): status,
list, show, fire, pause, resume, approve, resolve, reload against the real
kairosd on a temporary state directory (prepared with one WAL per recovery
verdict by test_daemon.prepare_state), plus the client's failure modes against
fake servers: nothing listening, not a socket, a server that hangs up, sends
garbage, a wrong id, a reply over 16 MiB or no reply at all.

The prepared WALs have no mandate record (the original wrote none), so once
the daemon is ready the executor settles them (test_daemon.settle): mnd_s,
mnd_a and mnd_t are paused "schedule_unknown: ...", mnd_f (its only cycle
failed) ends "failed" and is archived.  A mandate that really runs comes from
firing the "slow" schedule (its observe step sleeps until it is killed)."""
import gzip
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kairos_harness import (SLOW_SCHEDULE, Client, Daemon, NotifySocket, read_records,  # noqa: E402
                            write_config)
from test_daemon import EXTRA_REVIEW, prepare_state, settle  # noqa: E402

KAIROSCTL = os.environ.get("KAIROSCTL", "")
ALL_MANDATES = 6 + EXTRA_REVIEW
LIST_HEADER = ["ID", "SCHEDULE", "FIRED", "AT", "STATUS", "CYCLE", "STARTED", "ENDED", "DURATION",
               "REASON"]
SCHEDULE_UNKNOWN = "schedule_unknown: the WAL has no mandate record"
AT = "2026-04-20T12:00:00Z"


def mandate_id(schedule, fired_at):
    """docs/design.md §3: mnd_ + plan_ + 12 hex of SHA-256 of NAME|FIRED_AT."""
    return "mnd_plan_" + hashlib.sha256(("%s|%s" % (schedule, fired_at)).encode()).hexdigest()[:12]


def ctl_env(extra=None):
    env = dict(os.environ)
    env.pop("KAIROS_CONTROL_SOCKET", None)
    env.pop("KAIROSCTL_TIMEOUT", None)
    if extra:
        env.update(extra)
    return env


def run_ctl(*args, env=None, timeout=60, **kw):
    return subprocess.run([KAIROSCTL, *args], capture_output=True, text=True,
                          env=ctl_env(env), timeout=timeout, **kw)


class OnlineCase(unittest.TestCase):
    """A real kairosd on a prepared state directory."""

    config = False  # True: self.write_config() (schedules "slow" and "approval"); else --state-dir
    daemon_env = None  # extra environment of kairosd

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-ctl-online-")
        self.state = os.path.join(self.dir, "state")
        self.wal = os.path.join(self.state, "wal")
        prepare_state(self.state)
        self.notify = NotifySocket(self.dir)
        conf = self.write_config() if self.config else None
        self.daemon = Daemon(self.state, config=conf, notify=self.notify, env=self.daemon_env)
        self.notify.wait_ready()
        settle(self.daemon)
        self.sock = self.daemon.socket_path

    def tearDown(self):
        # A graceful stop, so the sanitizer build's LeakSanitizer runs at exit.
        rc = self.daemon.stop()
        self.daemon.proc.stderr.close()
        self.notify.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.assertEqual(rc, 0, self.daemon.log()[-3000:])

    def write_config(self):
        """Schedules: "slow" (observe sleeps until killed) and "approval"
        (act asks for approval; one cycle)."""
        act = os.path.join(self.dir, "act.sh")
        with open(act, "w") as f:
            f.write("#!/bin/sh\necho '{\"kairos\":{\"pause\":\"awaiting_approval\","
                    "\"reason\":\"needs a human\"}}'\n")
        self.conf = write_config(self.dir, self.state, {
            "slow": SLOW_SCHEDULE,
            "approval": {"Schedule": {"Cron": "0 0 1 1 *"}, "Mandate": {"MaxCycles": "1"},
                         "Exec": {"Act": "/bin/sh " + act}},
        }, daemon_extra="GracefulTimeoutSec=1\n")
        return self.conf

    def fire_slow(self):
        """A mandate whose observe handler runs (status running)."""
        r = self.raw("fire", schedule="slow", at=AT)
        self.assertTrue(r["ok"], r)
        m = r["result"]["mandate"]
        self.daemon.wait_log("%s observe_001: started sleep 600" % m)
        return m

    def wait_log_count(self, text, n, timeout=30.0):
        """Wait until n log lines contain text."""
        d = self.daemon
        deadline = time.monotonic() + timeout
        with d.cond:
            while sum(1 for line in d.lines if line is not None and text in line) < n:
                left = deadline - time.monotonic()
                if left <= 0 or (d.lines and d.lines[-1] is None):
                    self.fail("fewer than %d log lines with %r:\n%s" % (n, text, d.log()[-3000:]))
                d.cond.wait(left)

    def ctl(self, *args, env=None):
        return run_ctl("--socket", self.sock, *args, env=env)

    def ok(self, *args, env=None):
        r = self.ctl(*args, env=env)
        self.assertEqual(r.returncode, 0, (args, r.stdout, r.stderr))
        self.assertEqual(r.stderr, "")
        return r.stdout

    def json_ok(self, *args):
        return json.loads(self.ok("--json", *args))

    def refused(self, *args):
        r = self.ctl(*args)
        self.assertEqual(r.returncode, 1, (args, r.stdout, r.stderr))
        return r

    def raw(self, cmd, **args):
        c = Client(self.sock)
        try:
            return c.call(cmd, **args)
        finally:
            c.close()

    def wal_bytes(self, mandate):
        with open(os.path.join(self.wal, mandate + ".wal.jsonl"), "rb") as f:
            return f.read()

    def records(self, mandate):
        return read_records(os.path.join(self.wal, mandate + ".wal.jsonl"))

    def archived_records(self, mandate):
        """The records of a finished mandate, from its gzipped archive."""
        with gzip.open(os.path.join(self.state, "archive", mandate + ".wal.jsonl.gz")) as gz:
            return [json.loads(line) for line in gz.read().splitlines() if line.strip()]

    def list_table(self, *args):
        """`kairosctl list` parsed by its header's columns: [{column: value}] in order."""
        lines = self.ok("list", *args).splitlines()
        self.assertEqual(lines[0].split(), LIST_HEADER)
        cols = ["ID", "SCHEDULE", "FIRED AT", "STATUS", "CYCLE", "STARTED", "ENDED",
                "DURATION", "REASON"]
        starts = [lines[0].index(c) for c in cols]
        out = []
        for line in lines[1:]:
            if line.startswith("("):
                continue  # the "more" footer
            row = {}
            for k, c in enumerate(cols):
                end = starts[k + 1] if k + 1 < len(cols) else None
                row[c] = line[starts[k]:end].strip()
            out.append(row)
        return out

    def list_rows(self):
        """`kairosctl list` parsed: {id: (status, cycle, reason)}."""
        return {r["ID"]: (r["STATUS"], r["CYCLE"], r["REASON"]) for r in self.list_table()}


class TestStatus(OnlineCase):
    def test_status_text(self):
        out = self.ok("status")
        lines = out.splitlines()
        self.assertRegex(lines[0], r"^kairosd \S+ \(pid %d\), up \d+s, ready$" % self.daemon.proc.pid)
        self.assertIn("State directory: " + self.state, lines)
        self.assertIn("Configuration:   (built-in defaults)", lines)
        mandates = [l for l in lines if l.startswith("Mandates:")]
        self.assertEqual(len(mandates), 1, out)
        self.assertIn(" %d (" % ALL_MANDATES, mandates[0])
        self.assertIn("%d paused_review" % (1 + EXTRA_REVIEW), mandates[0])
        self.assertIn("1 quarantined", mandates[0])
        self.assertNotIn(" 0 ", mandates[0], "zero counts are left out")
        rec = [l for l in lines if l.startswith("Recovery:")][0]
        self.assertIn("paused for review", rec)
        self.assertIn("1 torn tail repaired", rec)
        self.assertIn("%d files" % ALL_MANDATES, rec)
        st = self.raw("status")["result"]
        self.assertIn("fdatasync calls: %d" % st["fdatasync_calls"], lines)

    def test_status_json(self):
        got = self.json_ok("status")
        want = self.raw("status")["result"]
        for k in ("uptime_sec", "fdatasync_calls"):
            got.pop(k)
            want.pop(k)
        self.assertEqual(got, want)
        self.assertTrue(got["ready"])
        self.assertEqual(got["mandates"], ALL_MANDATES)
        self.assertEqual(got["recovery"]["quarantined"], 1)


class TestListShow(OnlineCase):
    config = True

    def test_list_text_is_an_aligned_table(self):
        out = self.ok("list")
        lines = out.splitlines()
        self.assertEqual(len(lines), 1 + ALL_MANDATES)
        for col in ("STATUS", "CYCLE", "REASON"):
            start = lines[0].index(col)
            for line in lines[1:]:
                if len(line) <= start:
                    self.assertEqual(col, "REASON", line)  # an empty last column
                    continue
                self.assertEqual(line[start - 2:start], "  ", (col, line))
                self.assertNotEqual(line[start], " ", (col, line))
        self.assertFalse(any(l.endswith(" ") for l in lines), "no trailing blanks")
        rows = self.list_rows()
        # newest first: these WALs have no fired_at, so by id, descending
        self.assertEqual(list(rows), sorted(rows, reverse=True))
        self.assertEqual(rows["mnd_r"], ("paused_review", "1",
                                         "step observe_001: interrupted_during_execution"))
        # (the plan before the bad line is plan_c, cycle 1)
        self.assertEqual(rows["mnd_c"], ("quarantined", "1", "wal_corrupt"))
        self.assertEqual(rows["mnd_s"], ("paused", "1", SCHEDULE_UNKNOWN))
        self.assertEqual(rows["mnd_f"], ("failed", "1", "the last cycle failed"))

    def test_list_json(self):
        got = self.json_ok("list")
        self.assertEqual(got, self.raw("list")["result"])
        self.assertEqual(len(got["mandates"]), ALL_MANDATES)

    def test_show_text(self):
        # mnd_f ended (failed) and its WAL is archived: shown from the gzip
        self.daemon.wait_log("mandate mnd_f: WAL archived")
        self.assertFalse(os.path.exists(os.path.join(self.wal, "mnd_f.wal.jsonl")))
        out = self.ok("show", "mnd_f")
        self.assertTrue(out.startswith("Mandate mnd_f\n"), out)
        self.assertRegex(out, r"\n  status: +failed\n  reason: +the last cycle failed\n")
        self.assertRegex(out, r"\n  WAL: +clean, 5 records\n")
        self.assertIn("\nPlan plan_f (cycle 1): finalized failed: step_failed\n", out)
        self.assertRegex(out, r"\n +STEP +STATUS +EXECUTIONS +RECOVERED +STARTED +ENDED +DURATION +REASON/ERROR\n")
        # started, ended (date and time each) and the duration, from the record times
        self.assertRegex(out, r"\n +observe_001 +failed +1 +no +2026-04-20 12:00:00 +2026-04-20 "
                              r"12:00:00 +0ms +error: exit_status: exit 1\n")
        self.assertRegex(out, r"\n +orient_001 +planned +0 +no +- +- +-\n")
        out = self.ok("show", "mnd_a")
        self.assertRegex(out, r"\n  status: +paused\n  reason: +%s\n" % SCHEDULE_UNKNOWN)
        self.assertRegex(out, r"\n +observe_001 +completed +1 +yes +\S+ \S+ +\S+ \S+ +\S+ +operator_flag\n")
        self.assertRegex(out, r"\n +orient_001 +planned +0 +no +- +- +-\n", "nothing ran")
        self.assertIn("(cycle 1): open\n", out)
        out = self.ok("show", "mnd_c")
        self.assertRegex(out, r"\n  status: +quarantined\n  reason: +wal_corrupt\n")
        self.assertRegex(out, r"\n  WAL: +corrupt, 1 record\n")

    def test_show_json(self):
        got = self.json_ok("show", "mnd_r")
        self.assertEqual(got, self.raw("show", mandate="mnd_r")["result"])
        self.assertEqual(got["plans"][0]["steps"][0]["status"], "needs_review")

    def test_show_unknown_mandate(self):
        r = self.refused("show", "mnd_nope")
        self.assertEqual(r.stderr, "kairosctl: no mandate mnd_nope\n")
        self.assertEqual(r.stdout, "")
        r = self.refused("show", "mnd_nope", "--json")
        self.assertEqual(json.loads(r.stdout), {"code": "not_found", "message": "no mandate mnd_nope"})

    def test_usage_errors_do_not_connect(self):
        cases = [("show",), ("show", "a", "b"), ("status", "x"), ("list", "x"), ("reload", "x"),
                 ("pause",), ("resume",), ("resume", "a", "b"), ("pause", "a", "--reason", ""),
                 ("pause", "a", "--frob"), ("show", "-x"),
                 ("fire",), ("fire", "a", "b"), ("fire", "a", "--frob"), ("fire", "../etc"),
                 ("fire", "x" * 65), ("fire", ""), ("fire", "a b"), ("fire", "a", "--at"),
                 ("fire", "a", "--at", ""), ("fire", "a", "--at", "now"),
                 ("fire", "a", "--at", "2026-02-30T00:00:00Z"), ("fire", "a", "--at", "2026-04-20 12:00:00"),
                 ("fire", "a", "--at", "2026-04-20T12:00:00.000Z"),
                 ("approve",), ("approve", "a", "b"), ("approve", "a", "--reason", ""),
                 ("approve", "a", "--frob")]
        for args in cases:
            r = run_ctl("--socket", os.path.join(self.dir, "nothing-here"), *args)
            self.assertEqual(r.returncode, 64, (args, r.stderr))
            self.assertTrue(r.stderr.startswith("kairosctl: "), r.stderr)
            self.assertNotIn("cannot connect", r.stderr)
        r = run_ctl("--socket", os.path.join(self.dir, "nothing-here"), "fire", "a/b")
        self.assertEqual(r.stderr.splitlines()[0],
                         "kairosctl: fire: 'a/b' is not a schedule name ([A-Za-z0-9_-]{1,64}) "
                         "(see kairosctl --help)")
        r = run_ctl("--socket", os.path.join(self.dir, "nothing-here"), "fire", "a", "--at", "x\x1b")
        self.assertEqual(r.stderr.splitlines()[0],
                         "kairosctl: fire: --at 'x\\x1b' is not a UTC time YYYY-MM-DDTHH:MM:SSZ "
                         "(see kairosctl --help)")

    def test_daemon_strings_are_escaped(self):
        m = self.fire_slow()
        evil = "maint\x1b[31mRED\x07 window"
        self.ok("pause", m, "--reason", evil)
        self.assertEqual(self.records(m)[-1]["reason"], evil, "stored as given")
        for args in (("list",), ("show", m)):
            out = self.ok(*args)
            self.assertNotIn("\x1b", out)
            self.assertNotIn("\x07", out)
            self.assertIn("maint\\x1b[31mRED\\x07 window", out)
        self.assertEqual(self.json_ok("show", m)["reason"], evil)


class TestOperatorCommands(OnlineCase):
    config = True

    def test_pause_and_resume(self):
        m = self.fire_slow()
        before = len(self.records(m))
        self.assertEqual(self.ok("pause", m, "--reason", "maintenance window"), m + ": paused\n")
        recs = self.records(m)
        self.assertEqual(len(recs), before + 1)
        self.assertEqual((recs[-1]["op"], recs[-1]["action"], recs[-1]["reason"], recs[-1]["uid"]),
                         ("operator", "pause", "maintenance window", os.getuid()))
        self.assertEqual(self.list_rows()[m], ("paused", "1", "maintenance window"))
        r = self.refused("pause", m)
        self.assertEqual(r.stderr, "kairosctl: mandate %s is paused: cannot pause it\n" % m)
        # its handler never stopped: resumed, it is running again
        self.assertEqual(self.json_ok("resume", m), {"mandate": m, "status": "running"})
        self.assertEqual(self.records(m)[-1]["action"], "resume")
        self.assertEqual(self.list_rows()[m], ("running", "1", ""))
        r = self.refused("resume", m)
        self.assertEqual(r.stderr, "kairosctl: mandate %s is running, not paused\n" % m)
        self.assertEqual(self.json_ok("pause", m), {"mandate": m, "status": "paused"})
        self.assertEqual(self.records(m)[-1]["reason"], "paused by operator")
        self.assertEqual(self.ok("show", m).count(" uid %d " % os.getuid()), 3,
                         "show lists the operator actions")

    def test_fire(self):
        m = mandate_id("slow", AT)
        self.assertEqual(self.ok("fire", "slow", "--at", AT),
                         "fired slow at %s: mandate %s (running)\n" % (AT, m))
        self.daemon.wait_log("%s observe_001: started sleep 600" % m)
        self.assertEqual(self.records(m)[0], {**self.records(m)[0], "op": "mandate", "mandate_id": m,
                                              "schedule": "slow", "fired_at": AT})
        # the same (schedule, fired_at) again: a no-op that says so
        before = self.wal_bytes(m)
        self.assertEqual(self.ok("fire", "slow", "--at=" + AT),
                         "slow at %s: already fired (mandate %s, running)\n" % (AT, m))
        self.assertEqual(self.json_ok("fire", "slow", "--at", AT),
                         {"mandate": m, "schedule": "slow", "fired_at": AT, "fired": False,
                          "status": "running", "message": "already fired: nothing to do"})
        self.assertEqual(self.wal_bytes(m), before)
        # without --at: the current second
        t0 = time.time()
        got = self.json_ok("fire", "slow")
        t1 = time.time()
        self.assertTrue(got["fired"], got)
        self.assertRegex(got["fired_at"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        t = time.mktime(time.strptime(got["fired_at"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
        self.assertTrue(int(t0) <= t <= t1, (t0, got["fired_at"], t1))
        self.assertEqual(got["mandate"], mandate_id("slow", got["fired_at"]))
        # (Concurrency=queue, the default: it waits for the running "slow" one)
        self.assertEqual((got["schedule"], got["status"]), ("slow", "runnable"))
        self.assertNotIn("message", got)

    def test_fire_refused(self):
        r = self.refused("fire", "nope", "--at", AT)
        self.assertEqual((r.stdout, r.stderr), ("", "kairosctl: no schedule named 'nope'\n"))
        r = self.refused("--json", "fire", "nope")
        self.assertEqual(json.loads(r.stdout), {"code": "not_found",
                                                "message": "no schedule named 'nope'"})
        self.assertFalse(os.path.exists(os.path.join(self.wal, mandate_id("nope", AT) + ".wal.jsonl")))

    def test_approve(self):
        m = mandate_id("approval", AT)
        self.ok("fire", "approval", "--at", AT)
        self.daemon.wait_log("mandate %s awaits approval (needs a human): kairosctl approve %s" % (m, m))
        self.assertEqual(self.list_rows()[m], ("awaiting_approval", "1", "step act_001: needs a human"))
        # refused while not awaiting approval, and for a bad request
        r = self.refused("approve", "mnd_s")
        self.assertEqual(r.stderr, "kairosctl: mandate mnd_s is paused, not awaiting approval\n")
        r = self.refused("--json", "approve", "mnd_nope")
        self.assertEqual(json.loads(r.stdout)["code"], "not_found")
        self.assertEqual(self.ok("approve", m, "--reason", "looks right"),
                         "%s: approved (runnable)\n" % m)
        # it goes on: reflect (no command), then MaxCycles=1 ends it
        self.daemon.wait_log("mandate %s done" % m)
        self.assertEqual(self.list_rows()[m], ("done", "1", "MaxCycles reached"))
        ops = [r for r in self.archived_records(m) if r["op"] == "operator"]
        self.assertEqual([(o["action"], o["step_id"], o["reason"], o["uid"]) for o in ops],
                         [("approve", "act_001", "looks right", os.getuid())])
        r = self.refused("approve", m)
        self.assertEqual(r.stderr, "kairosctl: mandate %s is done, not awaiting approval\n" % m)
        # --json, and the default reason
        at2 = "2026-04-20T13:00:00Z"
        m2 = mandate_id("approval", at2)
        self.ok("fire", "approval", "--at", at2)
        self.daemon.wait_log("mandate %s awaits approval" % m2)
        self.assertEqual(self.json_ok("approve", m2), {"mandate": m2, "status": "runnable"})
        self.daemon.wait_log("mandate %s done" % m2)
        ops = [r for r in self.archived_records(m2) if r["op"] == "operator"]
        self.assertEqual([o["reason"] for o in ops], ["approved by operator"])

    def test_resume_without_schedule_pauses_again(self):
        # mnd_s has no mandate record: resumed, it is queued, and the executor
        # pauses it again because it cannot know what to run.
        before = len(self.records("mnd_s"))
        self.assertEqual(self.ok("resume", "mnd_s"), "mnd_s: runnable\n")
        self.assertEqual(self.records("mnd_s")[-1]["action"], "resume")
        self.wait_log_count("mandate mnd_s paused: schedule_unknown", 2)
        self.assertEqual(self.list_rows()["mnd_s"], ("paused", "1", SCHEDULE_UNKNOWN))
        self.assertEqual(len(self.records("mnd_s")), before + 1, "nothing ran")

    def test_resume_review_paused_points_to_resolve(self):
        r = self.refused("resume", "mnd_r")
        self.assertIn("kairosctl resolve mnd_r observe_001", r.stderr)

    def test_pause_quarantined(self):
        before = self.wal_bytes("mnd_c")
        r = self.refused("pause", "mnd_c", "--reason", "x")
        self.assertEqual(r.stderr, "kairosctl: mandate mnd_c is quarantined (its WAL is corrupt); "
                         "inspect it with kairosctl wal verify %s\n"
                         % os.path.join(self.wal, "mnd_c.wal.jsonl"))
        self.assertEqual(r.stdout, "")
        r = self.refused("--json", "pause", "mnd_c")
        self.assertEqual(json.loads(r.stdout)["code"], "quarantined")
        self.assertEqual(self.wal_bytes("mnd_c"), before)

    def test_resolve_retry(self):
        self.assertEqual(self.ok("resolve", "mnd_r", "observe_001", "--retry", "--reason",
                                 "checked: the handler did nothing"),
                         "mnd_r: step observe_001 resolve_retry: runnable\n")
        recs = self.records("mnd_r")
        self.assertEqual((recs[-2]["op"], recs[-2]["action"], recs[-2]["step_id"], recs[-2]["uid"],
                          recs[-2]["reason"]),
                         ("operator", "resolve_retry", "observe_001", os.getuid(),
                          "checked: the handler did nothing"))
        self.assertEqual((recs[-1]["step_id"], recs[-1]["status"], recs[-1]["reset"]),
                         ("observe_001", "pending", True))
        # queued; with no mandate record the executor cannot run it: paused
        self.daemon.wait_log("mandate mnd_r paused: schedule_unknown")
        self.assertEqual(self.list_rows()["mnd_r"], ("paused", "1", SCHEDULE_UNKNOWN))
        self.assertEqual(self.records("mnd_r"), recs, "nothing ran")
        out = self.ok("show", "mnd_r")
        self.assertRegex(out, r"\n +observe_001 +pending +1 +operator +(?:\S+ \S+|-) +(?:\S+ \S+|-) +\S+ +interrupted_during_execution\n", "resolved by an operator")
        self.assertRegex(out, r"\nOperator actions:\n  \S+Z  uid %d  resolve_retry observe_001: "
                              r"checked: the handler did nothing\n" % os.getuid())
        # resolved once: a second resolve is refused and writes nothing
        before = self.wal_bytes("mnd_r")
        r = self.refused("resolve", "mnd_r", "observe_001", "--done", "--reason", "x")
        self.assertEqual(r.stderr, "kairosctl: step observe_001 is pending, not needs_review: "
                                   "nothing to resolve\n")
        self.assertEqual(self.wal_bytes("mnd_r"), before)

    def test_resolve_done(self):
        got = self.json_ok("resolve", "mnd_x000", "observe_001", "--done", "--reason", "verified by hand")
        # the step had no interrupted tool call: none completed
        self.assertEqual(got, {"mandate": "mnd_x000", "step": "observe_001", "action": "resolve_done",
                               "tool_calls_completed": [], "status": "runnable"})
        recs = self.records("mnd_x000")
        self.assertEqual(recs[-2]["action"], "resolve_done")
        self.assertEqual((recs[-1]["status"], recs[-1]["post_hash"]), ("completed", "sha256-post-observe"))
        self.daemon.wait_log("mandate mnd_x000 paused: schedule_unknown")
        self.assertEqual(self.list_rows()["mnd_x000"], ("paused", "1", SCHEDULE_UNKNOWN))
        self.assertEqual(self.records("mnd_x000"), recs, "nothing ran")
        out = self.ok("show", "mnd_x000")
        self.assertRegex(out, r"\n +observe_001 +completed +1 +operator +(?:\S+ \S+|-) +(?:\S+ \S+|-) +\S+ +interrupted_during_execution\n")
        self.assertRegex(out, r"\n +orient_001 +planned +0 +no +- +- +-\n")

    def test_resolve_abandon(self):
        out = self.ok("resolve", "mnd_x001", "observe_001", "--abandon", "--reason=obsolete")
        # queued: the executor reads the abandoned plan and ends the mandate
        self.assertEqual(out, "mnd_x001: step observe_001 resolve_abandon: abandoned\n")
        self.daemon.wait_log("mandate mnd_x001 abandoned")
        self.daemon.wait_log("mandate mnd_x001: WAL archived")
        self.assertFalse(os.path.exists(os.path.join(self.wal, "mnd_x001.wal.jsonl")), "archived")
        recs = self.archived_records("mnd_x001")
        self.assertEqual(recs[-2]["action"], "resolve_abandon")
        self.assertEqual((recs[-1]["op"], recs[-1]["status"], recs[-1]["reason"]),
                         ("plan_finalize", "abandoned", "obsolete"))
        self.assertEqual(self.list_rows()["mnd_x001"], ("abandoned", "1", "obsolete"))
        self.assertIn("finalized abandoned: obsolete", self.ok("show", "mnd_x001"))

    def test_resolve_usage(self):
        before = self.wal_bytes("mnd_r")
        cases = [
            ("resolve", "mnd_r", "observe_001", "--reason", "x"),
            ("resolve", "mnd_r", "observe_001", "--retry", "--done", "--reason", "x"),
            ("resolve", "mnd_r", "observe_001", "--retry", "--abandon", "--done", "--reason", "x"),
            ("resolve", "mnd_r", "observe_001", "--retry"),
            ("resolve", "mnd_r", "observe_001", "--retry", "--reason", ""),
            ("resolve", "mnd_r", "observe_001", "--retry", "--reason"),
            ("resolve", "mnd_r", "--retry", "--reason", "x"),
            ("resolve", "mnd_r", "observe_001", "extra", "--retry", "--reason", "x"),
            ("resolve", "mnd_r", "observe_001", "--retry=yes", "--reason", "x"),
        ]
        for args in cases:
            r = self.ctl(*args)
            self.assertEqual(r.returncode, 64, (args, r.stderr))
            self.assertTrue(r.stderr.startswith("kairosctl: resolve: "), r.stderr)
        r = self.ctl("resolve", "mnd_r", "observe_001", "--reason", "x")
        self.assertIn("exactly one of --done, --retry, --abandon", r.stderr)
        r = self.ctl("resolve", "mnd_r", "observe_001", "--retry")
        self.assertIn("--reason", r.stderr)
        self.assertEqual(self.wal_bytes("mnd_r"), before)
        self.assertEqual(self.list_rows()["mnd_r"][0], "paused_review")

    def test_resolve_refused(self):
        r = self.refused("resolve", "mnd_r", "nope_001", "--retry", "--reason", "x")
        self.assertEqual(r.stderr, "kairosctl: mandate mnd_r has no step nope_001\n")
        r = self.refused("resolve", "mnd_c", "observe_001", "--retry", "--reason", "x")
        self.assertIn("quarantined", r.stderr)

    def test_permission_denied(self):
        if os.getuid() != 0:
            self.skipTest("needs root to run kairosctl as nobody")
        for p in (self.dir, self.state):
            os.chmod(p, 0o755)
        os.chmod(self.sock, 0o666)

        def as_nobody():
            os.setgid(65534)
            os.setgroups([])
            os.setuid(65534)

        r = run_ctl("--socket", self.sock, "status", preexec_fn=as_nobody)
        if r.returncode == 126 or "Permission denied" in r.stderr and "uid" not in r.stderr:
            self.skipTest("kairosctl not executable by nobody: %s" % r.stderr)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("uid 65534 is not allowed", r.stderr)
        self.assertEqual(r.stdout, "")
        # the socket as kairosd makes it (0660): the kernel refuses the
        # connection; refused all the same (exit 1), not "unreachable" (2)
        os.chmod(self.sock, 0o660)
        r = run_ctl("--socket", self.sock, "status", preexec_fn=as_nobody)
        self.assertEqual((r.returncode, r.stdout), (1, ""), r.stderr)
        self.assertEqual(r.stderr, "kairosctl: cannot connect to %s: Permission denied (root, "
                         "kairosd's user or the socket's group may connect)\n" % self.sock)


def plan_hex(text):
    return hashlib.sha256(text.encode()).hexdigest()[:12]


BIG_RESULT = ('{"n":123456789012345678901234567890123456789,"neg":-98765432109876543210,'
              '"f":0.1,"e":1e400,"l":[18446744073709551616]}')


class TestRetryWait(OnlineCase):
    """retry, wait, results with NUL, multi-line texts, archives read by the
    offline commands: with real handlers."""
    config = True

    def write_config(self):
        nul = os.path.join(self.dir, "nul.sh")
        with open(nul, "w") as f:
            f.write("#!/bin/sh\nprintf '\"a\\\\u0000b\"\\n'\n")
        act = os.path.join(self.dir, "act.sh")
        with open(act, "w") as f:
            f.write("#!/bin/sh\necho '{\"kairos\":{\"pause\":\"awaiting_approval\","
                    "\"reason\":\"needs a human\"}}'\n")
        big = os.path.join(self.dir, "big.sh")
        with open(big, "w") as f:
            f.write("#!/bin/sh\necho '%s'\n" % BIG_RESULT)
        one = {"Schedule": {"Cron": "0 0 1 1 *"}, "Mandate": {"MaxCycles": "1"}}
        self.conf = write_config(self.dir, self.state, {
            "slow": SLOW_SCHEDULE,
            "approval": dict(one, Exec={"Act": "/bin/sh " + act}),
            "nul": dict(one, Exec={"Act": "/bin/sh " + nul}),
            "big": dict(one, Exec={"Act": "/bin/sh " + big}),
            "fail": dict(one, Exec={"Act": "/bin/false"}),
            "ok": dict(one, Exec={"Act": "/bin/true"}),
            "fail2": {"Schedule": {"Cron": "0 0 1 1 *"}, "Mandate": {"MaxCycles": "2"},
                      "Exec": {"Act": "/bin/false"}},
            # observe fails the first time, then runs until killed
            "once": dict(one, Exec={"Observe": "/bin/sh -c 'if [ -e %s ]; then exec sleep 600; "
                                               "fi; touch %s; exit 1'"
                                               % ((os.path.join(self.dir, "once.mark"),) * 2)}),
        }, daemon_extra="GracefulTimeoutSec=1\n")
        return self.conf

    def fire(self, schedule, at=AT):
        r = self.raw("fire", schedule=schedule, at=at)
        self.assertTrue(r["ok"], r)
        return r["result"]["mandate"]

    def wait(self, m, *extra):
        return self.ctl("wait", m, *extra)

    def test_nul_in_a_result(self):
        m = self.fire("nul")
        r = self.wait(m, "--timeout", "60")
        self.assertEqual((r.returncode, r.stderr), (0, ""), r.stdout)
        self.assertEqual(r.stdout, "%s: done: MaxCycles reached\n" % m)
        out = self.ok("show", m)
        self.assertRegex(out, r"\n +act_001 +completed +1 +no +(?:\S+ \S+|-) +(?:\S+ \S+|-) +\S+\n")
        got = self.json_ok("show", m)
        act = [s for s in got["plans"][0]["steps"] if s["step_id"] == "act_001"][0]
        self.assertEqual(act["result"], "a\x00b")
        raw = self.ok("--json", "show", m)
        self.assertIn('"a\\u0000b"', raw, "printed escaped")

    def test_big_numbers_in_a_result(self):
        # kjson keeps a result's digits; show --json printed them as a
        # string, and 0.1 as 0.10000000000000001 (jansson on both ends)
        m = self.fire("big")
        r = self.wait(m, "--timeout", "60")
        self.assertEqual((r.returncode, r.stdout, r.stderr),
                         (0, "%s: done: MaxCycles reached\n" % m, ""))
        raw = self.ok("--json", "show", m)
        self.assertIn('"result": {\n'
                      '            "n": 123456789012345678901234567890123456789,\n'
                      '            "neg": -98765432109876543210,\n'
                      '            "f": 0.1,\n'
                      '            "e": 1e400,\n'
                      '            "l": [\n'
                      '              18446744073709551616\n'
                      '            ]\n'
                      '          },', raw)
        got = json.loads(raw)
        act = [s for s in got["plans"][0]["steps"] if s["step_id"] == "act_001"][0]
        self.assertEqual(act["result"]["n"], 123456789012345678901234567890123456789)
        self.assertEqual(act["result"]["l"], [2 ** 64])
        self.assertEqual(got, self.raw("show", mandate=m)["result"], "the protocol's reply")
        out = self.ok("show", m)
        self.assertRegex(out, r"\n +act_001 +completed +1 +no ")

    def test_wait_exit_codes(self):
        ok = self.fire("ok")
        r = self.wait(ok)
        self.assertEqual(r.returncode, 0, r)
        self.assertEqual(r.stdout, "%s: done: MaxCycles reached\n" % ok)
        got = json.loads(self.ok("--json", "wait", ok))
        self.assertEqual((got["mandate"], got["status"], got["exit"], got["timed_out"]),
                         (ok, "done", 0, False))
        failed = self.fire("fail")
        r = self.wait(failed)
        self.assertEqual(r.returncode, 1, r)
        self.assertEqual(r.stdout, "%s: failed: the last cycle failed\n" % failed)
        appr = self.fire("approval")
        r = self.wait(appr)
        self.assertEqual(r.returncode, 4, r)
        self.assertTrue(r.stdout.startswith("%s: awaiting_approval" % appr), r.stdout)
        r = self.wait("mnd_r")                    # paused for review by recovery
        self.assertEqual(r.returncode, 4, r)
        self.assertEqual(r.stdout, "mnd_r: paused_review (step observe_001): "
                                   "interrupted_during_execution\n")
        slow = self.fire_slow()
        t0 = time.monotonic()
        r = self.wait(slow, "--timeout", "0.5")
        took = time.monotonic() - t0
        self.assertEqual(r.returncode, 124, r)
        self.assertEqual(r.stdout, "")
        self.assertEqual(r.stderr, "kairosctl: wait: timed out: %s: running\n" % slow)
        self.assertGreaterEqual(took, 0.5)
        self.assertLess(took, 10)
        r = self.ctl("--json", "wait", slow, "--timeout=0")
        self.assertEqual(r.returncode, 124, r)
        self.assertEqual(json.loads(r.stdout)["timed_out"], True)
        # a mandate that ends while wait waits: wait sees it
        proc = subprocess.Popen([KAIROSCTL, "--socket", self.sock, "wait", slow, "--timeout", "60"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=ctl_env())
        self.ok("pause", slow, "--reason", "look")
        out, err = proc.communicate(timeout=60)
        self.assertEqual((proc.returncode, err), (4, ""))
        self.assertEqual(out, "%s: paused: look\n" % slow)
        r = self.refused("wait", "mnd_nope")
        self.assertEqual(r.stderr, "kairosctl: no mandate mnd_nope\n")
        for bad in ("x", "-1", "nan", "1e99", ""):
            r = self.ctl("wait", ok, "--timeout", bad)
            self.assertEqual(r.returncode, 64, (bad, r))

    def wait_requests(self, n):
        """Poll status (with a deadline) until kairosd holds n wait requests."""
        deadline = time.monotonic() + 30
        while self.raw("status")["result"]["wait_requests"] != n:
            self.assertLess(time.monotonic(), deadline, "wait_requests never became %d" % n)
            time.sleep(0.005)

    def show_requests(self):
        found = re.search(r'kairos_control_requests\{command="show",code="ok"\} (\d+)',
                          self.ok("metrics"))
        return int(found.group(1)) if found else 0

    def test_wait_is_answered_by_kairosd_when_the_mandate_settles(self):
        slow = self.fire_slow()
        # the protocol: the reply comes when the mandate settles, <= 50 ms
        c = Client(self.sock)
        c.send_raw(json.dumps({"v": 1, "id": 7, "cmd": "wait",
                               "args": {"mandate": slow}}).encode() + b"\n")
        self.wait_requests(1)
        self.ok("pause", slow, "--reason", "look")
        paused = time.monotonic()  # (the pause is answered once it is durable)
        reply = c.recv_reply()
        late = time.monotonic() - paused
        c.close()
        self.assertEqual((reply["id"], reply["ok"]), (7, True), reply)
        self.assertEqual((reply["result"]["id"], reply["result"]["status"],
                          reply["result"]["reason"]), (slow, "paused", "look"))
        self.assertLess(late, 0.05)
        self.wait_requests(0)
        # kairosctl wait: one request, no show polled
        self.ok("resume", slow)
        shows = self.show_requests()
        proc = subprocess.Popen([KAIROSCTL, "--socket", self.sock, "wait", slow, "--timeout", "60"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=ctl_env())
        self.wait_requests(1)
        self.ok("cancel", slow, "--reason", "enough")
        out, err = proc.communicate(timeout=60)
        self.assertEqual((proc.returncode, err), (1, ""))
        self.assertRegex(out, r"^%s: cancelled" % slow)
        self.assertEqual(self.show_requests(), shows, "wait polled show")
        # settled already: answered at once
        t0 = time.monotonic()
        r = self.wait(slow)
        self.assertEqual(r.returncode, 1, r)
        self.assertLess(time.monotonic() - t0, 5)
        self.assertEqual(self.show_requests(), shows)

    def test_wait_requests_are_bounded_and_dropped_with_their_connection(self):
        slow = self.fire_slow()
        c = Client(self.sock)
        for i in range(17):
            c.send_raw(json.dumps({"v": 1, "id": i + 1, "cmd": "wait",
                                   "args": {"mandate": slow}}).encode() + b"\n")
        reply = c.recv_reply()  # the 17th: refused at once
        self.assertEqual((reply["id"], reply["ok"], reply["error"]["code"]),
                         (17, False, "too_many_waiters"), reply)
        self.assertIn("too many wait requests on this connection (at most 16 per connection and "
                      "1024 in all)", reply["error"]["message"])
        self.wait_requests(16)
        # another connection may still wait
        r = self.raw("wait", mandate="mnd_nope")
        self.assertEqual(r["error"]["code"], "not_found", r)
        c.close()
        self.wait_requests(0)
        r = self.raw("wait", mandate="")
        self.assertFalse(r["ok"], r)

    def test_wait_requests_are_bounded_in_all(self):
        slow = self.fire_slow()
        conns = []
        try:
            for k in range(64):  # 64 x 16 = 1024, the bound in all
                c = Client(self.sock)
                conns.append(c)
                c.send_raw(b"".join(json.dumps({"v": 1, "id": i + 1, "cmd": "wait",
                                                "args": {"mandate": slow}}).encode() + b"\n"
                                    for i in range(16)))
            # (64 connections: this user's bound; the first one asks)
            c0 = conns[0]
            deadline = time.monotonic() + 30
            while c0.call("status")["result"]["wait_requests"] != 1024:
                self.assertLess(time.monotonic(), deadline)
                time.sleep(0.005)
            r = c0.call("wait", mandate=slow)
            self.assertEqual(r["error"]["code"], "too_many_waiters", r)
            self.assertIn("too many wait requests in all", r["error"]["message"])
            # a settled mandate is answered at once, bound or not
            r = c0.call("wait", mandate="mnd_r")
            self.assertTrue(r["ok"], r)
            r = c0.call("pause", mandate=slow, reason="enough")
            self.assertTrue(r["ok"], r)
            for c in conns:  # every waiter answered, in order
                self.assertEqual([c.recv_reply()["result"]["status"] for _ in range(16)],
                                 ["paused"] * 16)
            self.assertEqual(c0.call("status")["result"]["wait_requests"], 0)
        finally:
            for c in conns:
                c.close()

    def test_a_stop_answers_the_waiters(self):
        slow = self.fire_slow()
        proc = subprocess.Popen([KAIROSCTL, "--socket", self.sock, "wait", slow],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=ctl_env())
        self.wait_requests(1)
        self.assertEqual(self.daemon.stop(), 0, self.daemon.log()[-3000:])
        out, err = proc.communicate(timeout=60)
        self.assertEqual((proc.returncode, out), (2, ""))
        self.assertEqual(err, "kairosctl: kairosd is stopping before mandate %s settled "
                              "(it is running)\n" % slow)

    def test_retry_a_failed_mandate(self):
        old = self.fire("fail")
        self.assertEqual(self.wait(old).returncode, 1)
        out = self.ok("retry", old, "--reason", "the disk is back")
        new = "mnd_plan_" + plan_hex("fail|%s|retry:1" % AT)
        self.assertRegex(out, r"^%s retried as %s \(retry 1, (running|runnable)\)\n$" % (old, new))
        self.assertEqual(self.wait(new).returncode, 1)
        # the new mandate's first records: who and why
        recs = self.archived_records(new)
        self.assertEqual({k: recs[0][k] for k in ("op", "mandate_id", "schedule", "fired_at",
                                                  "retry_of", "retry")},
                         {"op": "mandate", "mandate_id": new, "schedule": "fail",
                          "fired_at": AT, "retry_of": old, "retry": 1})
        self.assertEqual((recs[1]["op"], recs[1]["action"], recs[1]["uid"], recs[1]["reason"]),
                         ("operator", "retry", os.getuid(), "the disk is back"))
        self.assertEqual(recs[2]["plan_id"], "plan_" + plan_hex("fail|%s|retry:1" % AT))
        # linked both ways
        out = self.ok("show", new)
        self.assertIn("\n  retry of:  %s (retry 1)\n" % old, out)
        self.assertIn("\n  fired at:  %s\n" % AT, out)
        out = self.ok("show", old)
        self.assertIn("\n  retried by: %s\n" % new, out)
        self.assertEqual(self.json_ok("show", new)["retry_of"], old)
        self.assertEqual(self.json_ok("show", old)["retried_by"], [new])
        # a second retry (of the first retry) is retry 2 of the same tick
        got = self.json_ok("retry", new)
        new2 = "mnd_plan_" + plan_hex("fail|%s|retry:2" % AT)
        self.assertEqual((got["mandate"], got["retry_of"], got["retry"], got["fired_at"]),
                         (new2, new, 2, AT))
        self.assertEqual(self.wait(new2).returncode, 1)
        self.assertEqual(self.json_ok("show", new)["retried_by"], [new2])
        # the links survive a restart (from the summaries of finished mandates)
        self.assertEqual(self.daemon.stop(), 0)
        self.daemon.proc.stderr.close()
        self.notify.clear()
        self.daemon = Daemon(self.state, config=self.conf, notify=self.notify)
        self.notify.wait_ready()
        self.sock = self.daemon.socket_path
        self.assertEqual(self.json_ok("show", old)["retried_by"], [new])
        self.assertEqual(self.json_ok("show", new2)["retry_of"], new)

    def test_retry_plans_its_own_cycles(self):
        old = self.fire("fail2")
        self.assertEqual(self.wait(old).returncode, 1)
        new = self.json_ok("retry", old)["mandate"]
        self.assertEqual(self.wait(new).returncode, 1)
        base = "fail2|%s|retry:1" % AT
        plans = [p["plan_id"] for p in self.json_ok("show", new)["plans"]]
        self.assertEqual(plans, ["plan_" + plan_hex(base), "plan_" + plan_hex(base + "|2")])
        self.assertEqual(self.json_ok("show", new)["status"], "terminated")

    def test_a_retry_survives_kill_9(self):
        old = self.fire("once")
        self.assertEqual(self.wait(old).returncode, 1)
        new = self.json_ok("retry", old, "--reason", "again")["mandate"]
        self.daemon.wait_log("%s observe_001: started" % new)
        self.daemon.kill()
        self.daemon.proc.stderr.close()
        self.notify.clear()
        self.daemon = Daemon(self.state, config=self.conf, notify=self.notify)
        self.notify.wait_ready()
        self.sock = self.daemon.socket_path
        got = self.json_ok("show", new)
        self.assertEqual((got["retry_of"], got["retry"]), (old, 1))
        self.assertEqual(self.json_ok("show", old)["retried_by"], [new])

    def test_retry_refused(self):
        slow = self.fire_slow()
        before = self.wal_bytes(slow)
        r = self.refused("retry", slow)
        self.assertEqual(r.stderr, "kairosctl: mandate %s is running: only a mandate that has "
                                   "ended can be retried\n" % slow)
        self.assertEqual(self.wal_bytes(slow), before)
        r = self.refused("retry", "mnd_r")
        self.assertIn("is paused_review", r.stderr)
        ok = self.fire("ok")
        self.assertEqual(self.wait(ok).returncode, 0)
        r = self.refused("retry", ok)
        self.assertEqual(r.stderr, "kairosctl: mandate %s ended done: retrying it repeats its "
                                   "work; give --reason to do it anyway\n" % ok)
        out = self.ok("retry", ok, "--reason", "run it once more")
        self.assertIn(" retried as mnd_plan_" + plan_hex("ok|%s|retry:1" % AT), out)
        r = self.refused("retry", "mnd_nope")
        self.assertEqual(r.stderr, "kairosctl: no mandate mnd_nope\n")
        for args in (("retry",), ("retry", "a", "b"), ("retry", "a", "--reason", ""),
                     ("retry", "a", "--frob")):
            r = self.ctl(*args)
            self.assertEqual(r.returncode, 64, args)

    def test_multi_line_texts_are_lines(self):
        m = self.fire_slow()
        self.ok("pause", m, "--reason", "first line\nsecond line\x1b")
        out = self.ok("show", m)
        self.assertIn("\n  reason:    first line\n             second line\\x1b\n", out)
        self.assertIn("  pause: first line\n    second line\\x1b\n", out)
        self.assertNotIn("\\x0a", out)
        out = self.ok("list")
        row = [l for l in out.splitlines() if l.startswith(m)]
        self.assertTrue(row[0].endswith("first line"), out)
        start = row[0].index("first line")
        nxt = out.splitlines()[out.splitlines().index(row[0]) + 1]
        self.assertEqual(nxt, " " * start + "second line\\x1b")

    def test_archives_are_read_by_the_offline_commands(self):
        # mnd_f ended failed at startup: the daemon archived its WAL
        arch = os.path.join(self.state, "archive", "mnd_f.wal.jsonl.gz")
        self.assertTrue(os.path.exists(arch))
        r = run_ctl("wal", "verify", arch)
        self.assertEqual((r.returncode, r.stderr), (0, ""), r.stdout)
        self.assertRegex(r.stdout, r"^%s: ok \(\d+ records, " % arch)
        r = run_ctl("wal", "dump", arch)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("status: clean", r.stdout)
        ok = self.fire("ok")
        self.assertEqual(self.wait(ok).returncode, 0)
        arch = os.path.join(self.state, "archive", ok + ".wal.jsonl.gz")
        r = run_ctl("--json", "wal", "dump", arch)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["records"], len(self.archived_records(ok)))
        with open(arch, "rb") as f:
            data = f.read()
        cut = os.path.join(self.dir, "cut.wal.jsonl.gz")
        with open(cut, "wb") as f:
            f.write(data[:len(data) - 12])
        r = run_ctl("wal", "verify", cut)
        self.assertEqual(r.returncode, 2, r)
        self.assertEqual(r.stdout, "%s: corrupt: damaged gzip file\n" % cut)
        self.assertIn("damaged gzip file: truncated", r.stderr)


class TestListFilters(OnlineCase):
    """list --status and --schedule name what is wrong; a broken schedule's
    lines do not repeat "broken"."""
    config = True

    def test_bad_status_lists_the_valid_ones(self):
        r = self.refused("list", "--status", "bogus")
        self.assertEqual(r.stderr, "kairosctl: args.status: no status 'bogus' (one of: runnable, "
                         "running, idle, paused, paused_review, probing, awaiting_approval, "
                         "quarantined, wal_io_error, done, failed, terminated, abandoned, "
                         "cancelled)\n")
        self.assertEqual(r.stdout, "")

    def test_unknown_schedule_is_an_error(self):
        r = self.refused("list", "--schedule", "nosuch")
        self.assertEqual(r.stderr, "kairosctl: args.schedule: no schedule 'nosuch' (none in the "
                         "configuration, and no mandate of it is kept)\n")
        r = self.refused("--json", "list", "--schedule", "nosuch")
        self.assertEqual(json.loads(r.stdout)["code"], "not_found")
        # configured, no mandate yet: an empty list
        self.assertEqual(self.ok("list", "--schedule", "approval"), "no mandates\n")
        self.assertEqual(self.ok("list", "--schedule", "slow", "--status", "done"),
                         "no mandates\n")
        # removed from the configuration: its history still lists
        m = self.fire_slow()
        os.unlink(os.path.join(self.dir, "schedules.d", "slow.conf"))
        self.ok("reload")
        self.assertEqual([r["ID"] for r in self.list_table("--schedule", "slow")], [m])
        self.refused("list", "--schedule", "nosuch")

    def test_broken_schedule_lines(self):
        # a broken file named broken: listed (no mandates), its lines name it once
        with open(os.path.join(self.dir, "schedules.d", "broken.conf"), "w") as f:
            f.write("[Schedule]\nCron=61 * * * *\n")
        self.ok("reload")
        self.assertEqual(self.ok("list", "--schedule", "broken"), "no mandates\n")
        out = self.ok("schedules")
        self.assertNotIn("broken: broken", out)
        self.assertIn("\nschedule broken is broken: %s/schedules.d/broken.conf:2: Cron=: "
                      "invalid expression" % self.dir, out)
        out = self.ok("status")
        self.assertNotIn("broken: broken", out)
        self.assertIn("\nSchedules:       3, 1 of them broken (skipped): broken\n", out)


class TestSocketSelection(OnlineCase):
    def test_environment_variable(self):
        r = run_ctl("list", env={"KAIROS_CONTROL_SOCKET": self.sock})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("mnd_r", r.stdout)
        # --socket wins over the environment, either way round
        bad = os.path.join(self.dir, "absent.sock")
        r = run_ctl("--socket", self.sock, "list", env={"KAIROS_CONTROL_SOCKET": bad})
        self.assertEqual(r.returncode, 0, r.stderr)
        r = run_ctl("--socket", bad, "list", env={"KAIROS_CONTROL_SOCKET": self.sock})
        self.assertEqual(r.returncode, 2)
        self.assertIn("cannot connect to " + bad + ": ", r.stderr)
        # an empty variable means the default
        r = run_ctl("status", env={"KAIROS_CONTROL_SOCKET": ""})
        if not os.path.exists("/run/kairos/control.sock"):
            self.assertEqual(r.returncode, 2)
            self.assertIn("/run/kairos/control.sock", r.stderr)

    def test_global_options_after_the_command(self):
        for args in (("list", "--json", "--socket", self.sock),
                     ("list", "--socket=" + self.sock, "--json"),
                     ("--json", "show", "--socket", self.sock, "mnd_r")):
            r = run_ctl(*args)
            self.assertEqual(r.returncode, 0, (args, r.stderr))
            json.loads(r.stdout)


class TestReload(OnlineCase):
    config = True

    def write_config(self, extra="", schedule=None):
        path = os.path.join(self.dir, "kairosd.conf")
        with open(path, "w") as f:
            f.write("[Daemon]\nStateDirectory=%s\nControlSocket=%s/control.sock\nLogLevel=info\n%s"
                    % (self.state, self.state, extra))
        if schedule is not None:
            sd = os.path.join(self.dir, "schedules.d")
            os.makedirs(sd, exist_ok=True)
            with open(os.path.join(sd, "nightly.conf"), "w") as f:
                f.write(schedule)
        self.conf = path
        return path

    def test_reload(self):
        self.assertIn("Configuration:   " + self.conf + "\n", self.ok("status"))
        self.assertEqual(self.ok("reload"), "configuration reloaded: 0 schedules\n")
        self.write_config("Bogus=1\nMaxConcurrentMandates=zero\n")
        r = self.refused("reload")
        lines = r.stderr.splitlines()
        self.assertEqual(lines[0], "kairosctl: configuration invalid (2 errors), kept the running one",
                         r.stderr)
        errs = self.raw("reload")["error"]["detail"]["errors"]
        self.assertEqual(len(errs), 2, errs)
        self.assertEqual(lines[1:], ["  " + e for e in errs])
        self.assertTrue(errs[0].startswith(self.conf + ":5: Bogus="), errs)
        self.assertTrue(errs[1].startswith(self.conf + ":6: MaxConcurrentMandates="), errs)
        r = self.refused("--json", "reload")
        err = json.loads(r.stdout)
        self.assertEqual(err["code"], "config_invalid")
        self.assertEqual(err["detail"]["errors"], errs)
        # still serving, on the old config
        self.assertIn("ready", self.ok("status"))
        # fixed: applied
        self.write_config(schedule="[Schedule]\nCron=0 3 * * *\n")
        self.assertEqual(self.ok("reload"), "configuration reloaded: 1 schedule\n")
        self.assertEqual(self.json_ok("reload"), {"reloaded": True, "schedules": 1, "broken": 0})


class TestSchedules(OnlineCase):
    """schedules, schedules next, pause/resume --schedule on chronos's fake
    clock (KAIROS_TEST_CLOCK; kairosd built with -Dtest_hooks=true, else
    skipped): Friday 2026-04-17 10:00 UTC."""
    config = True
    daemon_env = {"KAIROS_TEST_CLOCK": "1776420000"}  # 2026-04-17T10:00:00Z

    def setUp(self):
        super().setUp()
        r = self.raw("test-clock", now=1776420000)
        if not r["ok"]:
            self.assertEqual(r["error"]["code"], "unknown_command", r)
            self.skipTest("kairosd was built without -Dtest_hooks=true (no fake clock)")

    def write_config(self):
        self.conf = write_config(self.dir, self.state, {
            "daily": {"Schedule": {"Cron": "0 9 * * 1-5", "TimeZone": "Europe/Berlin",
                                   "MissedPolicy": "catch_up_once", "Concurrency": "reject"}},
            "hourly": {"Schedule": {"Cron": "0 * * * *"}},
            "off": {"Schedule": {"Cron": "@yearly", "Enabled": "no"}},
        }, daemon_extra="GracefulTimeoutSec=1\n")
        return self.conf

    def rows(self):
        lines = self.ok("schedules").splitlines()
        head = lines[0]
        self.assertEqual(head.split(), ["NAME", "CRON", "ZONE", "NEXT", "LAST", "POLICY",
                                        "CONCURRENCY", "STATE"])
        cols = [head.index(c) for c in ("NAME", "CRON", "ZONE", "NEXT", "LAST", "POLICY",
                                         "CONCURRENCY", "STATE")]
        rows = {}
        for line in lines[1:]:
            cells = [line[a:b].strip() for a, b in zip(cols, cols[1:] + [None])]
            rows[cells[0]] = cells[1:]
        self.assertFalse(any(l.endswith(" ") for l in lines), "no trailing blanks")
        return rows

    def test_schedules_table_and_json(self):
        rows = self.rows()
        self.assertEqual(list(rows), ["daily", "hourly", "off"])
        self.assertEqual(rows["daily"], ["0 9 * * 1-5", "Europe/Berlin", "2026-04-20T07:00:00Z", "-",
                                         "catch_up_once", "reject", "enabled"])
        self.assertEqual(rows["hourly"], ["0 * * * *", "UTC", "2026-04-17T11:00:00Z", "-", "skip",
                                          "queue", "enabled"])
        self.assertEqual(rows["off"], ["@yearly", "UTC", "-", "-", "skip", "queue", "disabled"])
        got = self.json_ok("schedules")
        self.assertEqual(got, self.raw("schedules")["result"])
        self.assertEqual([s["name"] for s in got["schedules"]], ["daily", "hourly", "off"])

    def test_schedules_next(self):
        self.assertEqual(self.ok("schedules", "next", "daily", "-n", "3"),
                         "2026-04-20T07:00:00Z  2026-04-20T09:00:00+02:00\n"
                         "2026-04-21T07:00:00Z  2026-04-21T09:00:00+02:00\n"
                         "2026-04-22T07:00:00Z  2026-04-22T09:00:00+02:00\n")
        out = self.ok("schedules", "next", "hourly")
        self.assertEqual(out.splitlines(), ["2026-04-17T%02d:00:00Z" % h for h in range(11, 16)])
        got = self.json_ok("schedules", "next", "hourly", "-n2")
        self.assertEqual(got, {"name": "hourly", "cron": "0 * * * *", "time_zone": "UTC",
                               "next": ["2026-04-17T11:00:00Z", "2026-04-17T12:00:00Z"]})
        r = self.refused("schedules", "next", "nosuch")
        self.assertEqual(r.stderr, "kairosctl: no schedule named 'nosuch'\n")
        for args in (["schedules", "next"], ["schedules", "next", "daily", "-n", "0"],
                     ["schedules", "next", "daily", "-n", "x"], ["schedules", "next", "a b"],
                     ["schedules", "next", "daily", "extra"], ["schedules", "extra"]):
            r = self.ctl(*args)
            self.assertEqual(r.returncode, 64, (args, r.stderr))

    def test_pause_and_resume_schedule(self):
        self.assertEqual(self.ok("pause", "--schedule", "hourly", "--reason", "maintenance"),
                         "schedule hourly paused\n")
        self.assertEqual(self.rows()["hourly"][2:], ["-", "-", "skip", "queue", "paused"])
        listed = {s["name"]: s for s in self.raw("schedules")["result"]["schedules"]}
        self.assertEqual(listed["hourly"]["pause_reason"], "maintenance")
        r = self.refused("pause", "--schedule", "hourly")
        self.assertEqual(r.stderr, "kairosctl: schedule hourly is already paused\n")
        self.assertEqual(self.json_ok("resume", "--schedule", "hourly"),
                         {"schedule": "hourly", "paused": False})
        self.assertEqual(self.rows()["hourly"][2], "2026-04-17T11:00:00Z")
        self.assertEqual(self.refused("resume", "--schedule", "hourly").stderr,
                         "kairosctl: schedule hourly is already running\n")
        self.assertEqual(self.refused("pause", "--schedule", "nosuch").stderr,
                         "kairosctl: no schedule named 'nosuch'\n")
        for args in (["pause", "--schedule", "bad name"], ["pause", "--schedule", "hourly", "mnd_x"],
                     ["resume", "--schedule"], ["pause", "--schedule", "hourly", "--reason", ""]):
            r = self.ctl(*args)
            self.assertEqual(r.returncode, 64, (args, r.stderr))
        # persisted in chronos.json
        with open(os.path.join(self.state, "chronos.json")) as f:
            self.assertFalse(json.load(f)["schedules"]["hourly"]["paused"])


# ---- the client against fake servers ------------------------------------

class FakeServer:
    """Listens on a socket; for each connection reads the request line and
    calls respond(conn, request_bytes).  The request lines are kept."""

    def __init__(self, path, respond):
        self.path = path
        self.respond = respond
        self.requests = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                buf = b""
                while b"\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
                line = buf.split(b"\n", 1)[0]
                self.requests.append(line)
                try:
                    self.respond(conn, line)
                except OSError:
                    pass

    def close(self):
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(10)


def reply(conn, obj):
    conn.sendall(json.dumps(obj).encode() + b"\n")


def wait_for_eof(conn):
    """Hold the connection open until the client goes away."""
    while conn.recv(65536):
        pass


class TestClient(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-ctl-client-")
        self.path = os.path.join(self.dir, "fake.sock")
        self.servers = []

    def tearDown(self):
        for s in self.servers:
            s.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def serve(self, respond):
        s = FakeServer(self.path, respond)
        self.servers.append(s)
        return s

    def ctl(self, *args, env=None):
        return run_ctl("--socket", self.path, *args, env=env)

    def unreachable(self, *args, env=None):
        r = self.ctl(*args, env=env)
        self.assertEqual(r.returncode, 2, (args, r.stdout, r.stderr))
        self.assertEqual(r.stdout, "")
        self.assertIn(self.path, r.stderr, "names the socket")
        return r.stderr

    def test_daemon_not_running(self):
        err = self.unreachable("status")
        self.assertEqual(err, "kairosctl: cannot connect to %s: No such file or directory "
                              "(is kairosd running?)\n" % self.path)
        for cmd in (("list",), ("show", "m"), ("pause", "m"), ("resume", "m"), ("reload",),
                    ("resolve", "m", "s", "--done", "--reason", "r"), ("fire", "s"),
                    ("fire", "s", "--at", AT), ("approve", "m")):
            self.unreachable(*cmd)

    def test_default_socket(self):
        if os.path.exists("/run/kairos/control.sock"):
            self.skipTest("a kairosd runs on this machine")
        r = run_ctl("status")
        self.assertEqual(r.returncode, 2)
        self.assertEqual(r.stderr, "kairosctl: cannot connect to /run/kairos/control.sock: "
                                   "No such file or directory (is kairosd running?)\n")

    def test_regular_file(self):
        with open(self.path, "w") as f:
            f.write("not a socket\n")
        err = self.unreachable("status")
        self.assertIn("cannot connect to %s: Connection refused (not a socket)" % self.path, err)

    def test_stale_socket(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(self.path)  # bound, never listening: what a crashed daemon leaves
        try:
            err = self.unreachable("list")
        finally:
            s.close()
        self.assertIn("Connection refused (is kairosd running?)", err)

    def test_path_too_long(self):
        long_path = "/tmp/" + "x" * 120
        r = run_ctl("--socket", long_path, "status")
        self.assertEqual(r.returncode, 2)
        self.assertIn("cannot connect to %s: File name too long" % long_path, r.stderr)

    def test_request_format(self):
        srv = self.serve(lambda c, line: reply(c, {"v": 1, "id": json.loads(line)["id"], "ok": True,
                                                   "result": {"mandate": "m1", "status": "paused"}}))
        self.assertEqual(self.ctl("pause", "m1").returncode, 0)
        self.assertEqual(self.ctl("pause", "m1", "--reason", "r é").returncode, 0)
        self.assertEqual(self.ctl("resolve", "m1", "s1", "--abandon", "--reason", "why").returncode, 0)
        self.assertEqual(self.ctl("status", "--json").returncode, 0)
        self.assertEqual(self.ctl("fire", "daily").returncode, 0)
        self.assertEqual(self.ctl("fire", "daily", "--at", AT).returncode, 0)
        self.assertEqual(self.ctl("approve", "m1").returncode, 0)
        self.assertEqual(self.ctl("approve", "m1", "--reason", "ok").returncode, 0)
        reqs = [json.loads(r) for r in srv.requests]
        for r in reqs:
            self.assertEqual((r["v"], type(r["id"])), (1, int))
        self.assertEqual([(r["cmd"], r["args"]) for r in reqs], [
            ("pause", {"mandate": "m1"}),
            ("pause", {"mandate": "m1", "reason": "r é"}),
            ("resolve", {"mandate": "m1", "step": "s1", "action": "abandon", "reason": "why"}),
            ("status", {}),
            ("fire", {"schedule": "daily"}),
            ("fire", {"schedule": "daily", "at": AT}),
            ("approve", {"mandate": "m1"}),
            ("approve", {"mandate": "m1", "reason": "ok"}),
        ])
        for line in srv.requests:
            self.assertNotIn(b"\n", line)

    def test_closed_without_reply(self):
        self.serve(lambda c, line: None)
        err = self.unreachable("status")
        self.assertEqual(err, "kairosctl: %s closed the connection without a reply\n" % self.path)

    def test_closed_mid_reply(self):
        self.serve(lambda c, line: c.sendall(b'{"v":1,"id":1,"ok":tr'))
        self.assertIn("in the middle of a reply", self.unreachable("status"))

    def test_malformed_replies(self):
        replies = [b"this is not json\n", b"[1,2]\n", b'{"v":2,"id":1,"ok":true,"result":{}}\n',
                   b'{"v":1,"id":99,"ok":true,"result":{}}\n', b'{"v":1,"id":1,"ok":true}\n',
                   b'{"v":1,"id":1,"ok":"yes","result":{}}\n', b'{"v":1,"id":1,"ok":false}\n',
                   b'{"v":1,"id":1,"ok":false,"error":{"code":"x"}}\n']
        it = iter(replies)
        self.serve(lambda c, line: c.sendall(next(it)))
        for data in replies:
            err = self.unreachable("list")
            self.assertIn("malformed reply from " + self.path, err, data)

    def test_schedules_reply(self):
        """`schedules` reads its (up to megabytes) reply with its own parser:
        replies are judged, refusals and --json printed as for every command."""
        replies = [b"this is not json\n", b"[1,2]\n", b'{"v":2,"id":1,"ok":true,"result":{}}\n',
                   b'{"v":1,"id":99,"ok":true,"result":{}}\n', b'{"v":1,"id":1,"ok":true}\n',
                   b'{"v":1,"id":1,"ok":"yes","result":{}}\n', b'{"v":1,"id":1,"ok":false}\n',
                   b'{"v":1,"id":1.0,"ok":true,"result":{}}\n']
        it = iter(replies)
        server = self.serve(lambda c, line: c.sendall(next(it)))
        for data in replies:
            err = self.unreachable("schedules")
            self.assertIn("malformed reply from " + self.path, err, data)
        self.assertEqual(json.loads(server.requests[0]),
                         {"v": 1, "id": 1, "cmd": "schedules", "args": {}})
        server.close()
        self.servers.remove(server)
        os.unlink(self.path)
        row = {"name": "b\x1bad", "cron": "x", "time_zone": "UTC", "next_fire_at": None,
               "last_fire_at": "2026-04-17T10:00:00Z", "missed_policy": "skip",
               "concurrency": "queue", "enabled": False, "paused": False, "state": "broken",
               "error": "line 1: \u00e9 \"quoted\" \\ /\t\x01\x7f"}
        result = {"schedules": [row, {"name": "ok", "nested": {"a": [], "b": {}, "c": [1, -2]},
                                      "big": 18446744073709551616, "f": 1.5, "t": True}],
                  "broken": 1}
        self.serve(lambda c, line: reply(c, {"v": 1, "id": 1, "ok": True, "result": result}))
        out = run_ctl("--socket", self.path, "--json", "schedules")
        self.assertEqual((out.returncode, out.stderr), (0, ""))
        # jansson's layout (indent 2, UTF-8 as it is, \u escapes in capitals)
        want = re.sub(r"\\u([0-9a-f]{4})", lambda m: "\\u" + m.group(1).upper(),
                      json.dumps(result, indent=2, ensure_ascii=False)) + "\n"
        self.assertEqual(out.stdout, want)
        text = run_ctl("--socket", self.path, "schedules")
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertEqual(text.stdout.splitlines()[1].split()[0], "b\\x1bad")
        self.assertEqual(text.stdout.splitlines()[-1],
                         "schedule b\\x1bad is broken: line 1: \u00e9 \"quoted\" \\\\ "
                         "/\\x09\\x01\\x7f")

    def test_schedules_refusal(self):
        self.serve(lambda c, line: reply(c, {"v": 1, "id": None, "ok": False,
                                             "error": {"code": "bad_request", "message": "no\x1b"}}))
        r = self.ctl("schedules")
        self.assertEqual((r.returncode, r.stdout, r.stderr), (1, "", "kairosctl: no\\x1b\n"))

    def test_error_reply_with_null_id(self):
        self.serve(lambda c, line: reply(c, {"v": 1, "id": None, "ok": False,
                                             "error": {"code": "bad_request", "message": "nope"}}))
        r = self.ctl("status")
        self.assertEqual((r.returncode, r.stderr), (1, "kairosctl: nope\n"))

    def test_refusal_message_is_escaped(self):
        self.serve(lambda c, line: reply(c, {"v": 1, "id": 1, "ok": False, "error": {
            "code": "config_invalid", "message": "bad\x1b[2J",
            "detail": {"errors": ["a.conf:1: X=\x1b]0;t\x07", 7, "b.conf:2: Y="]}}}))
        r = self.ctl("reload")
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stderr, "kairosctl: bad\\x1b[2J\n  a.conf:1: X=\\x1b]0;t\\x07\n"
                                   "  b.conf:2: Y=\n")

    def test_multi_line_refusal_is_printed_as_lines(self):
        self.serve(lambda c, line: reply(c, {"v": 1, "id": 1, "ok": False, "error": {
            "code": "conflict", "message": "first line\nsecond\x1b line\r\n"}}))
        r = self.ctl("status")
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stderr, "kairosctl: first line\n  second\\x1b line\n")

    def test_no_reply_times_out(self):
        self.serve(lambda c, line: wait_for_eof(c))
        err = self.unreachable("status", env={"KAIROSCTL_TIMEOUT": "0.3"})
        self.assertEqual(err, "kairosctl: no reply from %s within 0.300 s\n" % self.path)

    def test_no_reply_to_an_act_says_outcome_unknown(self):
        """A request that acts timed out: kairosd may have done it (a fire
        whose reply came late had run); kairosctl says so and how to
        look, still exit 2."""
        self.serve(lambda c, line: wait_for_eof(c))
        env = {"KAIROSCTL_TIMEOUT": "0.3"}
        for args, check in ((("fire", "s", "--at", AT), "kairosctl list --schedule s"),
                            (("retry", "m1", "--reason", "r"), "kairosctl show m1 (retried_by)"),
                            (("cancel", "m1", "--reason", "r"), "kairosctl show m1")):
            err = self.unreachable(*args, env=env)
            self.assertEqual(err, "kairosctl: no reply from %s within 0.300 s\n"
                                  "kairosctl: outcome unknown: the request reached kairosd, "
                                  "which may have done it; check with %s before doing it "
                                  "again\n" % (self.path, check), args)

    def test_bad_timeout(self):
        for bad in ("0", "-1", "abc", "1e9", "nan", "inf", "5s"):
            r = self.ctl("status", env={"KAIROSCTL_TIMEOUT": bad})
            self.assertEqual(r.returncode, 64, bad)
            self.assertIn("KAIROSCTL_TIMEOUT", r.stderr)

    def test_reply_size_bound(self):
        limit = 16 * 1024 * 1024
        head = b'{"v":1,"id":1,"ok":true,"result":{"pad":"'
        tail = b'"}}'
        sizes = iter([limit - len(head) - len(tail), limit + 1 - len(head) - len(tail)])

        def respond(c, line):
            n = next(sizes)
            c.sendall(head + b"x" * n + tail + b"\n")

        self.serve(respond)
        r = self.ctl("--json", "status")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(json.loads(r.stdout)["pad"]), limit - len(head) - len(tail))
        err = self.unreachable("status")
        self.assertEqual(err, "kairosctl: the reply from %s is larger than 16 MiB\n" % self.path)

    def test_endless_reply_is_cut_off(self):
        def respond(c, line):
            chunk = b"x" * 65536
            try:
                while True:
                    c.sendall(chunk)
            except OSError:
                pass

        self.serve(respond)
        self.assertIn("larger than 16 MiB", self.unreachable("status"))


if __name__ == "__main__":
    if not KAIROSCTL:
        sys.exit("KAIROSCTL is not set")
    unittest.main(verbosity=2)
