#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Black-box tests of the offline kairosctl commands (docs/design.md §4-§8, §12).

Runs the real built kairosctl (path in $KAIROSCTL) on WAL files this test
writes itself: records are built here with the layout of docs/design.md §6 and their
crc computed with zlib.crc32, independently of the C encoder.  Hashes and
plan ids are recomputed here from the spec, independently of the C planner.
"""

import calendar
import gzip
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import zlib

KAIROSCTL = os.environ.get("KAIROSCTL", "")
SRCDIR = os.environ.get("KAIROS_SRCDIR", "")

PHASES = ["observe", "orient", "decide", "act", "reflect"]

GOLDEN = [
    ('{"x":1,"a":2}', '{"a":2,"x":1}',
     "sha256-8d4245d4258fe0902fa060395639a0c8c76cd53bae33b899c45a439005129809"),
    ('{"b":1,"a":"sym"}', '{"a":"sym","b":1}',
     "sha256-7795d5dbc639d23e29255cf3c4fadde4faba880efb9279b74eefc5c1b1c4aff0"),
    ('{"a":{"ts":"x","keep":2},"b":[{"nonce":"n","k":3}],"request_id":"r"}',
     '{"a":{"keep":2},"b":[{"k":3}]}',
     "sha256-a2888d12ba4dd2563ea3ca1200debabf5031cb831144ac38f06b01e96e1ad5d2"),
    ('{"n":null,"t":true,"f":false}', '{"f":false,"n":null,"t":true}',
     "sha256-22e00dc2f7b01420f940fbdbfbdf34fa0667cc6500186495023ba37722cbd05e"),
    ('[3,{"z":1,"ts":9}]', '[3,{"z":1}]',
     "sha256-b8c8b625ea3175e25abc24b2f4a595948a855ff6b0aee6a64d28d002e708a378"),
    ('"str"', '"str"',
     "sha256-72495b0e1f3c6c961f46d3f249ce968ac758c43b88e50d32aa138681f8a38804"),
    ('{"phase":"observe","cycle":1,"state":"pre"}',
     '{"cycle":1,"phase":"observe","state":"pre"}',
     "sha256-3e02fda9bdfd78947f64676ba85058fde6c1b94ba361087a722618d887087926"),
    ('{"b":1,"B":2,"_":3,"aa":4,"a":5,"é":6}',
     '{"B":2,"_":3,"a":5,"aa":4,"b":1,"é":6}',
     "sha256-71cac729f38b67307d6340548934afb670044a7a3d343e9565345f172742b9e3"),
    ('{"f":1.0,"g":1e20,"h":0.1,"i":-0.0,"j":2.5e-5,"big":12345678901234567890}',
     '{"big":12345678901234567890,"f":1.0,"g":1.0e+20,"h":0.1,"i":-0.0,"j":2.5e-05}',
     "sha256-e2328e0e4f3a07dd5f03a6e64a5620488d7357b6e5894685a79474d73d9677b8"),
]


# ---- independent model of the formats ------------------------------------

def canon(obj):
    """Canonical JSON for the simple values used here (no floats)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def chash(obj):
    return "sha256-" + hashlib.sha256(canon(obj).encode()).hexdigest()


def plan_id(name, fired_at, cycle=1):
    text = f"{name}|{fired_at}" if cycle == 1 else f"{name}|{fired_at}|{cycle}"
    return "plan_" + hashlib.sha256(text.encode()).hexdigest()[:12]


def make_plan(name, fired_at, cycle=1):
    pid = plan_id(name, fired_at, cycle)
    steps = []
    for order, phase in enumerate(PHASES):
        steps.append({
            "step_id": f"{phase}_{cycle:03d}",
            "tool": f"ooda.{phase}",
            "params_hash": chash({"phase": phase, "order": order, "cycle": cycle,
                                  "plan_id": pid, "mandate_name": name}),
            "pre_hash": chash({"phase": phase, "cycle": cycle, "state": "pre"}),
            "expected_post_hash": chash({"phase": phase, "cycle": cycle, "state": "post"}),
        })
    return {"plan_id": pid, "mandate_id": "mnd_" + plan_id(name, fired_at), "cycle": cycle,
            "plan_hash": chash(steps), "steps": steps}


class Wal:
    """Builds WAL lines exactly as docs/design.md §6 lays them out."""

    def __init__(self, crc=True):
        self.lines = []
        self.crc = crc
        self.ms = 0

    def _ts(self):
        self.ms += 7
        return "2026-04-20T12:00:%02d.%03dZ" % (self.ms // 1000 % 60, self.ms % 1000)

    def add(self, pairs, crc=None):
        rec = dict(pairs)
        rec["ts"] = self._ts()
        body = json.dumps(rec, separators=(",", ":"), ensure_ascii=False)
        if self.crc if crc is None else crc:
            c = zlib.crc32(body.encode()) & 0xFFFFFFFF
            body = body[:-1] + ',"crc":"%08x"}' % c
        self.lines.append(body + "\n")
        return self

    def commit(self, plan, crc=None):
        return self.add([("op", "plan_commit"), ("plan_id", plan["plan_id"]),
                         ("mandate_id", plan["mandate_id"]), ("cycle", plan["cycle"]),
                         ("plan_hash", plan["plan_hash"]), ("steps", plan["steps"])], crc)

    def pending(self, plan, step):
        return self.add([("op", "append"), ("step_id", step), ("plan_id", plan["plan_id"]),
                         ("idem_key", plan["mandate_id"] + "/" + step), ("status", "pending")])

    def executing(self, plan, step, crc=None):
        pre = next(s["pre_hash"] for s in plan["steps"] if s["step_id"] == step)
        return self.add([("op", "transition"), ("step_id", step), ("status", "executing"),
                         ("pre_hash", pre)], crc)

    def completed(self, plan, step, result=None, crc=None):
        post = next(s["expected_post_hash"] for s in plan["steps"] if s["step_id"] == step)
        pairs = [("op", "transition"), ("step_id", step), ("status", "completed"),
                 ("post_hash", post), ("result_hash", chash(result))]
        if result is not None:
            pairs.append(("result", result))
        return self.add(pairs, crc)

    def failed(self, step, cls="exit_status", msg="exit status 3"):
        return self.add([("op", "transition"), ("step_id", step), ("status", "failed"),
                         ("error_class", cls), ("error_msg", msg)])

    def needs_review(self, step, reason):
        return self.add([("op", "transition"), ("step_id", step), ("status", "needs_review"),
                         ("reason", reason)])

    def finalize(self, plan, status="succeeded"):
        return self.add([("op", "plan_finalize"), ("plan_id", plan["plan_id"]),
                         ("status", status)])

    def run_steps(self, plan, upto):
        """Commit the plan and complete its first `upto` steps."""
        self.commit(plan)
        for s in plan["steps"]:
            self.pending(plan, s["step_id"])
        for s in plan["steps"][:upto]:
            self.executing(plan, s["step_id"])
            self.completed(plan, s["step_id"], {"phase": s["step_id"], "ok": True})
        return self

    def text(self):
        return "".join(self.lines)

    def data(self):
        return self.text().encode()


def run(*args, stdin=None):
    p = subprocess.run([KAIROSCTL, *args], input=stdin, capture_output=True, timeout=60)
    if p.returncode < 0:
        raise AssertionError(f"kairosctl {' '.join(args)} killed by signal {-p.returncode}:"
                             f"\n{p.stderr.decode(errors='replace')}")
    err = p.stderr.decode(errors="replace")
    for marker in ("Sanitizer", "runtime error:"):
        if marker in err:
            raise AssertionError(f"kairosctl {' '.join(args)}: sanitizer report:\n{err}")
    return p.returncode, p.stdout.decode(errors="replace"), err


class Case(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kairosctl-test.")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def write(self, name, data):
        path = os.path.join(self.tmp, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())
        return path

    def check(self, args, code, stdin=None):
        rc, out, err = run(*args, stdin=stdin)
        self.assertEqual(rc, code, f"kairosctl {' '.join(args)}: exit {rc}, expected {code}\n"
                                   f"stdout:\n{out}\nstderr:\n{err}")
        return out, err

    def usage(self, *args, contains=None):
        out, err = self.check(list(args), 64)
        lines = err.strip("\n").split("\n")
        self.assertEqual(len(lines), 1, f"usage error must be one line: {err!r}")
        self.assertTrue(lines[0].startswith("kairosctl: "), err)
        self.assertIn("--help", lines[0])
        if contains:
            self.assertIn(contains, lines[0])
        return lines[0]


# ---- global options, dispatch ------------------------------------------

class TestGlobal(Case):
    def test_version(self):
        out, _ = self.check(["--version"], 0)
        self.assertRegex(out, r"^kairosctl \d+\.\d+\.\d+\n$")
        if SRCDIR:
            with open(os.path.join(SRCDIR, "meson.build")) as f:
                version = re.search(r"version\s*:\s*'([^']+)'", f.read()).group(1)
            self.assertEqual(out, f"kairosctl {version}\n")

    def test_help_lists_commands(self):
        out, _ = self.check(["--help"], 0)
        for cmd in ["wal dump", "wal verify", "recover", "canon", "plan", "status", "fire"]:
            self.assertIn(cmd, out)
        out2, _ = self.check(["help"], 0)   # "help" alone: the same overview
        self.assertEqual(out, out2)
        out3, _ = self.check(["--json", "--help"], 0)
        self.assertEqual(out, out3)

    def commands(self):
        out, _ = self.check(["--help"], 0)
        cmds, on = [], False
        for line in out.splitlines():
            if line.endswith("commands (no daemon needed):") or line.startswith("Commands ("):
                on = True
                continue
            if on and not line.strip():
                on = False
            if on:
                words = []
                for w in line.split():
                    if not re.match(r"^[a-z][a-z-]*$", w):
                        break
                    words.append(w)
                cmds.append(" ".join(words))
        return cmds

    def test_help_of_every_command(self):
        # "help CMD" and "CMD --help" print that command's usage, exit 0
        cmds = self.commands()
        self.assertGreaterEqual(len(cmds), 20)
        for want in ("retry", "wait", "help", "wal verify", "schedules next"):
            self.assertIn(want, cmds)
        for cmd in cmds:
            with self.subTest(command=cmd):
                out, err = self.check(["help"] + cmd.split(), 0)
                self.assertEqual(err, "")
                self.assertRegex(out, r"^Usage: kairosctl \[--socket PATH\] \[--json\] "
                                      + re.escape(cmd) + r"( |\n)")
                self.assertIn("See kairosctl(1).", out)
                self.assertEqual(len(re.findall(r"(?m)^Usage:", out)), 1, out)
                out2, _ = self.check(cmd.split() + ["--help"], 0)
                self.assertEqual(out2, out)
        # with arguments, --help still names the command and runs nothing
        out, _ = self.check(["show", "mnd_x", "--help"], 0)
        self.assertTrue(out.startswith("Usage: kairosctl [--socket PATH] [--json] show MANDATE [--state-dir DIR]\n"))
        out, _ = self.check(["wait", "mnd_x", "--timeout", "1", "-h"], 0)
        self.assertIn("124 timed out", out)
        # a group: the usage of each of its commands
        out, _ = self.check(["help", "wal"], 0)
        self.assertIn("wal dump FILE", out)
        self.assertIn("wal verify FILE...", out)
        _, err = self.check(["help", "frobnicate"], 64)
        self.assertEqual(err, "kairosctl: help: unknown command 'frobnicate' (see kairosctl help)\n")

    def test_online_commands_need_daemon(self):
        # Every online command is implemented (test_ctl_online.py,
        # test_idem_service.py); without a daemon they exit 2.
        sock = os.path.join(self.tmp, "none.sock")
        for args in (["--json", "schedules"], ["idem", "stats"], ["schedules", "next", "daily"],
                     ["idem", "get", "k"], ["idem", "forget", "k", "--reason", "r"],
                     ["pause", "--schedule", "daily"], ["resume", "--schedule", "daily"],
                     ["tool", "run", "--key", "k", "--", "true"]):
            _, err = self.check(["--socket", sock] + args, 2)
            self.assertEqual(err, f"kairosctl: cannot connect to {sock}: No such file or "
                                  f"directory (is kairosd running?)\n")
        # tool write reads stdin first
        _, err = self.check(["--socket", sock, "tool", "write", "--key", "k", "/x"], 2, stdin=b"x")
        self.assertIn("cannot connect", err)

    def test_usage_errors(self):
        self.usage(contains="no command")
        self.usage("frobnicate", contains="frobnicate")
        self.usage("wal", contains="dump")
        self.usage("wal", "frob", contains="frob")
        self.usage("--socket")
        self.usage("--bogus", "canon")
        self.usage("canon", "--bogus")
        self.usage("wal", "dump")
        self.usage("wal", "dump", "a", "b")
        self.usage("wal", "verify")

    def test_global_options_before_or_after(self):
        a, _ = self.check(["--json", "canon"], 0, stdin=b'{"b":1}')
        b, _ = self.check(["canon", "--json"], 0, stdin=b'{"b":1}')
        c, _ = self.check(["canon", "--socket=/x", "--json", "-"], 0, stdin=b'{"b":1}')
        self.assertEqual(a, b)
        self.assertEqual(a, c)
        self.assertEqual(json.loads(a)["canonical"], '{"b":1}')


# ---- canon ----------------------------------------------------------------

class TestCanon(Case):
    def test_golden_vectors(self):
        for inp, can, h in GOLDEN:
            with self.subTest(input=inp):
                out, _ = self.check(["canon"], 0, stdin=inp.encode())
                self.assertEqual(out, can + "\n")
                out, _ = self.check(["canon", "--hash"], 0, stdin=inp.encode())
                self.assertEqual(out, h + "\n")
                out, _ = self.check(["--json", "canon", "-"], 0, stdin=inp.encode())
                self.assertEqual(json.loads(out), {"canonical": can, "hash": h})

    def test_file_argument(self):
        path = self.write("in.json", '  {"x":1,\n "a":2}\n')
        out, _ = self.check(["canon", path], 0)
        self.assertEqual(out, '{"a":2,"x":1}\n')
        out, _ = self.check(["canon", "--hash", path], 0)
        self.assertEqual(out, GOLDEN[0][2] + "\n")

    def test_bad_json(self):
        for inp, offset in ((b'{"a":1,}', 7), (b'[1,2', 4), (b'', 0), (b'{"a":1} x', 8),
                            (b'{"a":\xff}', 5)):
            with self.subTest(input=inp):
                _, err = self.check(["canon"], 65, stdin=inp)
                self.assertRegex(err, rf"^kairosctl: \(stdin\): invalid JSON at byte offset "
                                      rf"{offset}: .+\n$")
        path = self.write("bad.json", '{"a" 1}')
        _, err = self.check(["canon", path], 65)
        self.assertIn(f"{path}: invalid JSON at byte offset 5", err)

    def test_not_finite(self):
        _, err = self.check(["canon"], 65, stdin=b'{"a":1e400}')
        self.assertIn("out of range", err)

    def test_unreadable(self):
        missing = os.path.join(self.tmp, "missing.json")
        _, err = self.check(["canon", missing], 66)
        self.assertEqual(err, f"kairosctl: {missing}: No such file or directory\n")
        _, err = self.check(["canon", self.tmp], 66)
        self.assertEqual(err, f"kairosctl: {self.tmp}: Is a directory\n")

    def test_usage(self):
        self.usage("canon", "a", "b")
        self.usage("canon", "--hash=yes")


# ---- plan -----------------------------------------------------------------

class TestPlan(Case):
    def test_spec_vectors_of_this_model(self):
        # The helpers of this test reproduce docs/design.md §4's plan_hash example.
        steps = [{"step_id": "s1", "tool": "t", "params_hash": "ph", "pre_hash": "pre",
                  "expected_post_hash": "post"}]
        self.assertEqual(chash(steps), "sha256-9c580c3be4a149be946a9a9a647a294b99d817eeaa7f9fe5"
                                       "4168808e853ce77b")
        self.assertEqual(plan_id("daily", "2026-04-20T12:00:00Z"), "plan_ae607245ac43")

    def test_example_json(self):
        out, _ = self.check(["plan", "--name", "daily", "--fired-at", "2026-04-20T12:00:00Z",
                             "--json"], 0)
        got = json.loads(out)
        want = make_plan("daily", "2026-04-20T12:00:00Z")
        self.assertEqual(got["plan_id"], "plan_ae607245ac43")
        self.assertEqual(got["mandate_id"], "mnd_plan_ae607245ac43")
        for k in ("plan_id", "mandate_id", "cycle", "plan_hash", "steps"):
            self.assertEqual(got[k], want[k], k)
        self.assertEqual(list(got["steps"][0]),
                         ["step_id", "tool", "params_hash", "pre_hash", "expected_post_hash"])

    def test_example_text(self):
        out, _ = self.check(["plan", "--name=daily", "--fired-at=2026-04-20T12:00:00Z"], 0)
        want = make_plan("daily", "2026-04-20T12:00:00Z")
        self.assertIn("plan_ae607245ac43", out)
        self.assertIn("mnd_plan_ae607245ac43", out)
        self.assertIn(want["plan_hash"], out)
        for s in want["steps"]:
            line = next(l for l in out.splitlines() if s["step_id"] in l)
            for k in ("tool", "params_hash", "pre_hash", "expected_post_hash"):
                self.assertIn(s[k], line)

    def test_cycles(self):
        for cycle in (2, 3, 10, 999):
            out, _ = self.check(["--json", "plan", "--name", "report-1", "--fired-at",
                                 "2024-02-29T23:59:59Z", "--cycle", str(cycle)], 0)
            got = json.loads(out)
            want = make_plan("report-1", "2024-02-29T23:59:59Z", cycle)
            self.assertEqual(got["cycle"], cycle)
            self.assertEqual(got["steps"][4]["step_id"], "reflect_%03d" % cycle)
            for k in ("plan_id", "mandate_id", "plan_hash", "steps"):
                self.assertEqual(got[k], want[k], k)

    def test_retry(self):
        # retry N of a tick: ids over NAME|FIRED_AT|retry:N (and |c for cycle c >= 2)
        for retry, cycle in ((1, 1), (2, 1), (1, 3), (999, 2)):
            out, _ = self.check(["--json", "plan", "--name", "daily", "--fired-at",
                                 "2026-04-20T12:00:00Z", "--retry", str(retry), "--cycle",
                                 str(cycle)], 0)
            got = json.loads(out)
            base = f"daily|2026-04-20T12:00:00Z|retry:{retry}"
            pid = "plan_" + hashlib.sha256((base if cycle == 1 else f"{base}|{cycle}")
                                           .encode()).hexdigest()[:12]
            mid = "mnd_plan_" + hashlib.sha256(base.encode()).hexdigest()[:12]
            self.assertEqual((got["plan_id"], got["mandate_id"], got["retry"]), (pid, mid, retry))
        for r in ("0", "-1", "1000", "x", ""):
            self.usage("plan", "--name", "daily", "--fired-at", "2026-04-20T12:00:00Z",
                       "--retry", r, contains="retry")

    def test_invalid(self):
        base = ["plan", "--name", "daily", "--fired-at", "2026-04-20T12:00:00Z"]
        for name in ("", "a/b", "..", "x" * 65, "sp ace", "é"):
            self.usage("plan", "--name", name, "--fired-at", "2026-04-20T12:00:00Z",
                       contains="name")
        self.check(["plan", "--name", "x" * 64, "--fired-at", "2026-04-20T12:00:00Z"], 0)
        for t in ("2026-02-30T00:00:00Z", "2025-02-29T00:00:00Z", "2026-13-01T00:00:00Z",
                  "2026-04-20T24:00:00Z", "2026-04-20T12:60:00Z", "2026-04-20T12:00:60Z",
                  "2026-04-20T12:00:00", "2026-04-20 12:00:00Z", "2026-04-20T12:00:00.000Z",
                  "yesterday", "2026-4-20T12:00:00Z", ""):
            self.usage("plan", "--name", "daily", "--fired-at", t, contains="fired-at")
        for c in ("0", "-1", "abc", "1000", "1.5", ""):
            self.usage(*base, "--cycle", c, contains="cycle")
        self.usage("plan", "--fired-at", "2026-04-20T12:00:00Z", contains="--name")
        self.usage("plan", "--name", "daily", contains="--fired-at")
        self.usage(*base, "extra")
        self.usage(*base[:-1])


# ---- wal verify / dump ----------------------------------------------------

def clean_wal():
    p1 = make_plan("daily", "2026-04-20T12:00:00Z", 1)
    p2 = make_plan("daily", "2026-04-20T12:00:00Z", 2)
    w = Wal().run_steps(p1, 5).finalize(p1)
    w.run_steps(p2, 2).executing(p2, "decide_002")
    return w, p1, p2


class TestWalVerify(Case):
    def test_clean(self):
        w, _, _ = clean_wal()
        path = self.write("a.wal.jsonl", w.data())
        out, _ = self.check(["wal", "verify", path], 0)
        self.assertEqual(out, f"{path}: ok ({len(w.lines)} records, 0 legacy unchecked)\n")

    def test_legacy_lines_counted(self):
        p = make_plan("legacy", "2026-01-01T00:00:00Z")
        w = Wal()
        w.commit(p, crc=False).executing(p, "observe_001", crc=False)
        w.completed(p, "observe_001", crc=True)
        path = self.write("l.wal.jsonl", w.data())
        out, _ = self.check(["wal", "verify", path], 0)
        self.assertEqual(out, f"{path}: ok (3 records, 2 legacy unchecked)\n")

    def test_torn_tail(self):
        w, _, _ = clean_wal()
        data = w.data()
        last = w.lines[-1].encode()
        start = len(data) - len(last)
        for cut in (1, 10, len(last) // 2, len(last) - 12):
            with self.subTest(cut=cut):
                path = self.write("t.wal.jsonl", data[:start + cut])
                out, _ = self.check(["wal", "verify", path], 1)
                self.assertRegex(out, rf"^{re.escape(path)}: torn tail at line {len(w.lines)}, "
                                      rf"byte offset {start} \({cut} bytes\): .+\n$")

    def test_corrupt_bad_crc(self):
        w, _, _ = clean_wal()
        lines = list(w.lines)
        bad = 7
        self.assertIn('"executing"', lines[bad - 1])
        lines[bad - 1] = lines[bad - 1].replace("sha256-", "sha256-0", 1)
        offset = len("".join(lines[:bad - 1]).encode())
        path = self.write("c.wal.jsonl", "".join(lines))
        out, _ = self.check(["wal", "verify", path], 2)
        self.assertRegex(out, rf"^{re.escape(path)}: corrupt at line {bad}, byte offset "
                              rf"{offset}: .+\n$")

    def test_corrupt_non_object_and_garbage(self):
        w, _, _ = clean_wal()
        for junk in ("[1,2,3]\n", "garbage\n", '"str"\n'):
            with self.subTest(junk=junk):
                lines = list(w.lines)
                lines.insert(2, junk)
                offset = len("".join(lines[:2]).encode())
                path = self.write("g.wal.jsonl", "".join(lines))
                out, _ = self.check(["wal", "verify", path], 2)
                self.assertIn(f"corrupt at line 3, byte offset {offset}:", out)

    def test_crlf_and_blank_lines_are_clean(self):
        w, _, _ = clean_wal()
        text = "\n" + w.text().replace("\n", "\r\n", 3) + "\n"
        path = self.write("b.wal.jsonl", text)
        out, _ = self.check(["wal", "verify", path], 0)
        self.assertIn(f"ok ({len(w.lines)} records", out)

    def test_several_files_worst_wins(self):
        w, _, _ = clean_wal()
        ok = self.write("ok.wal.jsonl", w.data())
        torn = self.write("torn.wal.jsonl", w.data()[:-5])
        lines = list(w.lines)
        lines[1] = lines[1].replace('"append"', '"appenx"')
        corrupt = self.write("bad.wal.jsonl", "".join(lines))
        missing = os.path.join(self.tmp, "missing.wal.jsonl")
        self.check(["wal", "verify", ok, ok], 0)
        out, _ = self.check(["wal", "verify", ok, torn], 1)
        self.assertEqual(len(out.splitlines()), 2)
        out, _ = self.check(["wal", "verify", corrupt, ok, torn], 2)
        self.assertEqual([l.split(":")[0] for l in out.splitlines()], [corrupt, ok, torn])
        out, err = self.check(["wal", "verify", ok, missing, torn], 66)
        self.assertEqual(err, f"kairosctl: {missing}: No such file or directory\n")
        self.assertEqual(len(out.splitlines()), 2)

    def test_json(self):
        w, _, _ = clean_wal()
        ok = self.write("ok.wal.jsonl", w.data())
        torn = self.write("torn.wal.jsonl", w.data()[:-5])
        out, _ = self.check(["wal", "verify", "--json", ok, torn], 1)
        got = json.loads(out)
        files = {f["file"]: f for f in got["files"]}
        self.assertEqual(files[ok]["status"], "clean")
        self.assertEqual(files[ok]["records"], len(w.lines))
        self.assertIsNone(files[ok]["problem"])
        self.assertEqual(files[torn]["status"], "torn")
        self.assertEqual(files[torn]["problem"]["line"], len(w.lines))
        self.assertEqual(files[torn]["problem"]["offset"],
                         len(w.data()) - len(w.lines[-1].encode()))
        self.assertEqual(files[torn]["problem"]["bytes"], len(w.lines[-1].encode()) - 5)

    def test_unreadable(self):
        missing = os.path.join(self.tmp, "nope.wal.jsonl")
        _, err = self.check(["wal", "verify", missing], 66)
        self.assertEqual(err, f"kairosctl: {missing}: No such file or directory\n")
        _, err = self.check(["wal", "dump", missing], 66)
        self.assertEqual(err, f"kairosctl: {missing}: No such file or directory\n")
        if os.geteuid() != 0:
            locked = self.write("locked.wal.jsonl", "")
            os.chmod(locked, 0)
            _, err = self.check(["wal", "verify", locked], 66)
            self.assertIn("Permission denied", err)


class TestWalGzip(Case):
    """Archives (<state>/archive/ID.wal.jsonl.gz) are read like the WAL they
    hold; a damaged one is corruption with a clear message."""

    def test_archive_verifies_and_dumps_like_the_wal(self):
        w, _, _ = clean_wal()
        plain = self.write("a.wal.jsonl", w.data())
        gz = self.write("archive/a.wal.jsonl.gz", gzip.compress(w.data()))
        out, _ = self.check(["wal", "verify", gz], 0)
        self.assertEqual(out, f"{gz}: ok ({len(w.lines)} records, 0 legacy unchecked)\n")
        want, _ = self.check(["wal", "dump", plain], 0)
        got, _ = self.check(["wal", "dump", gz], 0)
        self.assertEqual(got, want.replace(plain, gz))
        want, _ = self.check(["--json", "wal", "dump", plain], 0)
        got, _ = self.check(["--json", "wal", "dump", gz], 0)
        self.assertEqual(json.loads(got)["records"], json.loads(want)["records"])
        # the content decides, not the name; two gzip members are one WAL
        half = len(w.lines) // 2
        two = (gzip.compress("".join(l + "\n" for l in w.lines[:half]).encode())
               + gzip.compress("".join(l + "\n" for l in w.lines[half:]).encode()))
        other = self.write("b.wal.jsonl", two)
        out, _ = self.check(["wal", "verify", other], 0)
        self.assertIn(f"ok ({len(w.lines)} records", out)

    def test_torn_wal_inside_an_archive_is_torn(self):
        w, _, _ = clean_wal()
        gz = self.write("t.wal.jsonl.gz", gzip.compress(w.data()[:-10]))
        out, _ = self.check(["wal", "verify", gz], 1)
        self.assertIn("torn tail", out)

    def test_damaged_gzip(self):
        w, _, _ = clean_wal()
        data = gzip.compress(w.data())
        trunc = self.write("trunc.wal.jsonl.gz", data[:len(data) // 2])
        out, err = self.check(["wal", "verify", trunc], 2)
        self.assertEqual(out, f"{trunc}: corrupt: damaged gzip file\n")
        self.assertEqual(err, f"kairosctl: {trunc}: damaged gzip file: truncated: the "
                              f"compressed data ends before the end of the gzip stream\n")
        out, _ = self.check(["--json", "wal", "verify", trunc], 2)
        self.assertEqual(json.loads(out)["files"][0]["status"], "corrupt")
        _, err = self.check(["wal", "dump", trunc], 65)
        self.assertIn("damaged gzip file: truncated", err)
        bad = bytearray(data)
        bad[len(bad) // 2] ^= 0xff
        flipped = self.write("flip.wal.jsonl.gz", bytes(bad))
        _, err = self.check(["wal", "verify", flipped], 2)
        self.assertIn(f"kairosctl: {flipped}: damaged gzip file: ", err)
        # the worst of several files wins; an unreadable one still exits 66
        w2, _, _ = clean_wal()
        good = self.write("g.wal.jsonl", w2.data())
        self.check(["wal", "verify", good, trunc], 2)
        self.check(["wal", "verify", trunc, os.path.join(self.tmp, "nope")], 66)


class TestWalDump(Case):
    def test_text(self):
        w, p1, p2 = clean_wal()
        path = self.write("d.wal.jsonl", w.data())
        out, _ = self.check(["wal", "dump", path], 0)
        rows = [l for l in out.splitlines() if re.match(r"^\s+\d+\s", l)]
        self.assertEqual(len(rows), len(w.lines), out)
        for i, row in enumerate(rows, 1):
            self.assertTrue(row.split()[0] == str(i), row)
        self.assertIn("plan_commit", rows[0])
        self.assertIn(p1["plan_id"], rows[0])
        self.assertRegex(rows[-1], r"transition\s+decide_002 executing")
        self.assertIn("status: clean", out)
        self.assertIn("plans: 2 (1 finalized, 1 not finalized)", out)
        self.assertIn(p2["plan_id"], out.split("plans: ")[1])

    def test_json(self):
        w, p1, p2 = clean_wal()
        path = self.write("d.wal.jsonl", w.data())
        out, _ = self.check(["--json", "wal", "dump", path], 0)
        got = json.loads(out)
        self.assertEqual(got["status"], "clean")
        self.assertEqual(got["records"], len(w.lines))
        self.assertEqual([p["plan_id"] for p in got["plans"]], [p1["plan_id"], p2["plan_id"]])
        self.assertEqual(got["plans_not_finalized"], [p2["plan_id"]])
        first, second = got["plans"]
        self.assertTrue(first["finalized"])
        self.assertEqual(first["final_status"], "succeeded")
        self.assertEqual([s["status"] for s in second["steps"]],
                         ["completed", "completed", "executing", "pending", "pending"])
        obs = second["steps"][0]
        self.assertEqual(obs["result"], {"phase": "observe_002", "ok": True})
        self.assertEqual(obs["post_hash"], p2["steps"][0]["expected_post_hash"])
        self.assertEqual(obs["idem_key"], p2["mandate_id"] + "/observe_002")
        self.assertEqual(second["steps"][2]["observed_pre_hash"], p2["steps"][2]["pre_hash"])

    def test_operator_and_unknown_ops(self):
        w, p1, _ = clean_wal()
        w.add([("op", "operator"), ("mandate_id", p1["mandate_id"]), ("action", "pause"),
               ("uid", 1000), ("reason", "maintenance")])
        w.add([("op", "future_op"), ("plan_id", p1["plan_id"]), ("x", 1)])
        path = self.write("o.wal.jsonl", w.data())
        out, _ = self.check(["wal", "dump", path], 0)
        rows = out.splitlines()
        self.assertRegex(rows[len(w.lines) - 2], rf"^\s+{len(w.lines) - 1}\s+\S+\s+operator\s+"
                         + p1["mandate_id"] + r" pause uid=1000 reason=maintenance$")
        self.assertRegex(rows[len(w.lines) - 1], r"future_op\s+" + p1["plan_id"] + " x=1$")
        self.assertIn("1 unknown ops ignored", out)
        got = json.loads(self.check(["wal", "dump", "--json", path], 0)[0])
        self.assertEqual(got["unknown_ops"], 1)
        self.assertEqual(len(got["operators"]), 1)
        op = got["operators"][0]
        self.assertEqual((op["action"], op["uid"], op["reason"], op["line"]),
                         ("pause", 1000, "maintenance", len(w.lines) - 1))

    def test_torn_and_corrupt(self):
        w, _, _ = clean_wal()
        torn = self.write("t.wal.jsonl", w.data()[:-9])
        out, _ = self.check(["wal", "dump", torn], 0)
        self.assertIn(f"{len(w.lines):6d}  torn tail at line {len(w.lines)}", out)
        self.assertIn("status: torn", out)
        lines = list(w.lines)
        lines[2] = "not json\n"
        bad = self.write("c.wal.jsonl", "".join(lines))
        out, _ = self.check(["wal", "dump", bad], 0)
        self.assertIn("     3  corrupt at line 3", out)
        self.assertIn(f"({len(lines) - 3} more lines after it, not folded)", out)
        out, _ = self.check(["wal", "dump", "--json", bad], 0)
        got = json.loads(out)
        self.assertEqual(got["status"], "corrupt")
        self.assertEqual(got["problem"]["line"], 3)
        self.assertEqual(got["records"], 2)

    def test_escapes_control_characters(self):
        p = make_plan("esc", "2026-01-01T00:00:00Z")
        w = Wal().commit(p).failed("observe_001", msg="bad\x1b[31m red\x07")
        path = self.write("e.wal.jsonl", w.data())
        out, _ = self.check(["wal", "dump", path], 0)
        self.assertNotIn("\x1b", out)
        self.assertNotIn("\x07", out)
        self.assertIn("\\x1b[31m", out)


# ---- recover --dry-run ----------------------------------------------------

def snapshot(root):
    snap = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            st = os.stat(p)
            with open(p, "rb") as fh:
                snap[p] = (fh.read(), st.st_mtime_ns, st.st_mode)
        snap[d] = (None, os.stat(d).st_mtime_ns, None)
    return snap


class TestRecover(Case):
    def build_state(self):
        wal = os.path.join(self.tmp, "state", "wal")
        os.makedirs(wal)
        plans = {}

        def put(name, w):
            self.write(os.path.join("state", "wal", name), w.data() if isinstance(w, Wal) else w)

        # interrupted while orient was executing: manual review (row 6)
        p = plans["interrupted"] = make_plan("interrupted", "2026-04-20T12:00:00Z")
        put(p["mandate_id"] + ".wal.jsonl",
            Wal().run_steps(p, 1).executing(p, "orient_001"))
        # committed, nothing ran: safe to retry (row 4), resumes at observe
        p = plans["fresh"] = make_plan("fresh", "2026-04-20T12:00:00Z")
        put(p["mandate_id"] + ".wal.jsonl", Wal().run_steps(p, 0))
        # every step completed, not finalized: finalize succeeded
        p = plans["done"] = make_plan("done", "2026-04-20T12:00:00Z")
        put(p["mandate_id"] + ".wal.jsonl", Wal().run_steps(p, 5))
        # a failed step: finalize failed
        p = plans["failed"] = make_plan("failed", "2026-04-20T12:00:00Z")
        put(p["mandate_id"] + ".wal.jsonl",
            Wal().run_steps(p, 1).executing(p, "orient_001").failed("orient_001"))
        # needs_review holding a post_hash: already done (row 1), recovered record
        p = plans["reviewed"] = make_plan("reviewed", "2026-04-20T12:00:00Z")
        put(p["mandate_id"] + ".wal.jsonl",
            Wal().run_steps(p, 1).needs_review("observe_001", "operator_check"))
        # torn tail after observe completed
        p = plans["torn"] = make_plan("torn", "2026-04-20T12:00:00Z")
        w = Wal().run_steps(p, 1).executing(p, "orient_001")
        put(p["mandate_id"] + ".wal.jsonl", w.data()[:-20])
        # corrupt in the middle
        p = plans["corrupt"] = make_plan("corrupt", "2026-04-20T12:00:00Z")
        w = Wal().run_steps(p, 2)
        w.lines[3] = w.lines[3].replace("pending", "pendinG")
        put(p["mandate_id"] + ".wal.jsonl", w.data())
        # finished: nothing to do
        p = plans["finished"] = make_plan("finished", "2026-04-20T12:00:00Z")
        put(p["mandate_id"] + ".wal.jsonl", Wal().run_steps(p, 5).finalize(p))
        # not WALs: ignored
        put("old.wal.jsonl.torn.1700000000", b"{\"op\":")
        put("notes.txt", b"hello")
        return os.path.join(self.tmp, "state"), plans

    def test_text(self):
        state, plans = self.build_state()
        before = snapshot(self.tmp)
        out, err = self.check(["recover", "--dry-run", "--state-dir", state], 0)
        self.assertEqual(snapshot(self.tmp), before, "recover --dry-run changed files")
        self.assertEqual(err, "")

        sections = {}
        cur = None
        for line in out.splitlines():
            m = re.match(r"^\S*/(mnd_plan_[0-9a-f]{12})\.wal\.jsonl: (\w+)", line)
            if m:
                cur = m.group(1)
                sections[cur] = [line]
            elif cur and line.startswith(" "):
                sections[cur].append(line)
            else:
                cur = None
        self.assertEqual(len(sections), 8, out)
        names = [re.search(r"/(mnd_plan_\w+)\.wal", l).group(1)
                 for l in out.splitlines() if ".wal.jsonl:" in l]
        self.assertEqual(names, sorted(names), "files must come in name order")

        def sec(key):
            return "\n".join(sections[plans[key]["mandate_id"]])

        s = sec("interrupted")
        self.assertRegex(s, r"orient_001 \(status executing\): manual_review, row 6, "
                            r"interrupted_during_execution")
        self.assertRegex(s, r'would append: \{"op":"transition","step_id":"orient_001",'
                            r'"status":"needs_review".*,"crc":"[0-9a-f]{8}"\}')
        self.assertIn("paused_review", s)
        s = sec("fresh")
        self.assertRegex(s, r"observe_001 \(status (pending|none)\): safe_to_retry, row 4, "
                            r"never_reached_executing")
        self.assertIn("resumes at observe_001", s)
        self.assertNotIn("would append", s)
        s = sec("done")
        self.assertRegex(s, r'would append: \{"op":"plan_finalize","plan_id":"'
                         + plans["done"]["plan_id"] + r'","status":"succeeded"')
        s = sec("failed")
        self.assertRegex(s, r'would append: \{"op":"plan_finalize","plan_id":"'
                         + plans["failed"]["plan_id"] + r'","status":"failed"')
        s = sec("reviewed")
        self.assertRegex(s, r"observe_001 \(status needs_review\): already_done, row 1, "
                            r"wal_recorded_completion")
        self.assertRegex(s, r'would append: \{"op":"transition","step_id":"observe_001",'
                            r'"status":"completed".*"recovered":true')
        self.assertIn("resumes at orient_001", s)
        s = sec("torn")
        self.assertRegex(s, r"torn, torn tail at line \d+, byte offset \d+ \(\d+ bytes\)")
        self.assertIn("would cut the torn tail", s)
        self.assertRegex(s, r"orient_001 \(status (pending|none)\): safe_to_retry, row 4")
        s = sec("corrupt")
        self.assertRegex(s, r"corrupt, corrupt at line 4, byte offset \d+")
        self.assertIn("would quarantine", s)
        self.assertNotIn("would append", s)
        s = sec("finished")
        self.assertIn("nothing to recover", s)
        self.assertIn("dry run: nothing was changed", out)

    def test_json(self):
        state, plans = self.build_state()
        before = snapshot(self.tmp)
        out, _ = self.check(["recover", "--json", "--state-dir", state, "--dry-run"], 0)
        self.assertEqual(snapshot(self.tmp), before, "recover --dry-run changed files")
        got = json.loads(out)
        self.assertTrue(got["dry_run"])
        files = {os.path.basename(f["file"]).split(".")[0]: f for f in got["files"]}
        self.assertEqual(len(files), 8)

        def plan_of(key):
            f = files[plans[key]["mandate_id"]]
            self.assertEqual(len(f["plans"]), 1, f)
            return f["plans"][0]

        p = plan_of("interrupted")
        self.assertEqual(p["outcome"], "paused_review")
        self.assertEqual(p["pause_step"], "orient_001")
        self.assertEqual(p["pause_reason"], "interrupted_during_execution")
        d = p["decisions"][0]
        self.assertEqual((d["step_id"], d["verdict"], d["row"]),
                         ("orient_001", "manual_review", 6))
        self.assertEqual(d["evidence"]["reason"], "interrupted_during_execution")
        rec = json.loads(d["record"])
        self.assertEqual(rec["status"], "needs_review")
        body = d["record"][:d["record"].rindex(',"crc"')] + "}"
        self.assertEqual(rec["crc"], "%08x" % (zlib.crc32(body.encode()) & 0xFFFFFFFF))

        p = plan_of("fresh")
        self.assertEqual(p["outcome"], "resume")
        self.assertEqual(p["resume_step"], "observe_001")
        self.assertEqual(p["decisions"][0]["verdict"], "safe_to_retry")
        self.assertIsNone(p["decisions"][0]["record"])

        p = plan_of("done")
        self.assertEqual(p["outcome"], "finalized_succeeded")
        self.assertEqual(json.loads(p["finalize"])["status"], "succeeded")
        p = plan_of("failed")
        self.assertEqual(p["outcome"], "finalized_failed")
        self.assertEqual(json.loads(p["finalize"])["status"], "failed")
        p = plan_of("reviewed")
        self.assertEqual(p["decisions"][0]["verdict"], "already_done")
        self.assertTrue(json.loads(p["decisions"][0]["record"])["recovered"])

        self.assertEqual(files[plans["torn"]["mandate_id"]]["action"], "repair_torn_tail")
        c = files[plans["corrupt"]["mandate_id"]]
        self.assertEqual((c["status"], c["action"], c["plans"]), ("corrupt", "quarantine", []))
        self.assertEqual(c["problem"]["line"], 4)
        self.assertEqual(files[plans["finished"]["mandate_id"]]["plans"], [])
        self.assertEqual(got["summary"]["files"], 8)
        self.assertEqual(got["summary"]["corrupt"], 1)
        self.assertEqual(got["summary"]["torn"], 1)

    def test_requires_dry_run(self):
        state, _ = self.build_state()
        before = snapshot(self.tmp)
        line = self.usage("recover", "--state-dir", state)
        self.assertIn("--dry-run", line)
        self.assertIn("kairosd", line)
        self.assertEqual(snapshot(self.tmp), before)
        self.usage("recover", "--dry-run", "extra")
        self.usage("recover", "--dry-run", "--state-dir")

    def test_unacknowledged_fire_is_removed_as_kairosd_does(self):
        # Only the mandate record: a fire killed before its first flush.
        # kairosd removes such a WAL at start; the dry run must say so too
        # (the same decision function), unless a summary says it ran.
        state = os.path.join(self.tmp, "unacked")
        os.makedirs(os.path.join(state, "wal"))
        only = Wal().add([("op", "mandate"), ("mandate_id", "mnd_u"), ("schedule", "u"),
                          ("fired_at", "2026-04-20T12:00:00Z")])
        self.write(os.path.join("unacked", "wal", "mnd_u.wal.jsonl"), only.data())
        self.write(os.path.join("unacked", "wal", "mnd_e.wal.jsonl"), b"")
        before = snapshot(self.tmp)
        out, _ = self.check(["recover", "--dry-run", "--state-dir", state], 0)
        self.assertEqual(snapshot(self.tmp), before, "recover --dry-run changed files")
        self.assertEqual(out.count("would remove the file: no plan, a fire that was never "
                                   "acknowledged"), 2, out)
        self.assertIn("2 never acknowledged to remove", out)
        out, _ = self.check(["recover", "--json", "--dry-run", "--state-dir", state], 0)
        j = json.loads(out)
        self.assertEqual([f["action"] for f in j["files"]], ["remove", "remove"])
        self.assertEqual(j["summary"]["removed"], 2)
        # a summary: the mandate ran and ended; its WAL is recovered, not removed
        self.write(os.path.join("unacked", "mandates", "mnd_u.json"), b"{}")
        j = json.loads(self.check(["recover", "--json", "--dry-run", "--state-dir", state], 0)[0])
        self.assertEqual([f["action"] for f in j["files"]], ["remove", None])
        self.assertEqual(j["summary"]["removed"], 1)

    def test_state_dirs(self):
        empty = os.path.join(self.tmp, "empty")
        os.makedirs(empty)
        out, _ = self.check(["recover", "--dry-run", "--state-dir", empty], 0)
        self.assertIn("0 WAL files", out)
        missing = os.path.join(self.tmp, "missing")
        _, err = self.check(["recover", "--dry-run", "--state-dir", missing], 66)
        self.assertEqual(err, f"kairosctl: {missing}: No such file or directory\n")


# ---- robustness -----------------------------------------------------------

class TestCronNext(Case):
    """cron next EXPR [--from T] [-n N] [--tz Z] (offline; docs/design.md §9, issue 5)."""

    def times(self, *args):
        out, err = self.check(["cron", "next", *args], 0)
        self.assertEqual(err, "")
        return out.splitlines()

    def test_issue_examples(self):
        self.assertEqual(self.times("* * * * *", "--from", "2026-04-20T08:00:30Z", "-n", "3"),
                         ["2026-04-20T08:01:00Z", "2026-04-20T08:02:00Z", "2026-04-20T08:03:00Z"])
        # Mon-Fri 09:00 from a Friday afternoon: the next Monday (and on)
        self.assertEqual(self.times("0 9 * * 1-5", "--from", "2026-04-17T10:00:00Z", "-n", "3"),
                         ["2026-04-20T09:00:00Z", "2026-04-21T09:00:00Z", "2026-04-22T09:00:00Z"])
        self.assertEqual(self.times("*/15 * * * *", "--from", "2026-04-20T07:59:00Z", "-n", "5"),
                         ["2026-04-20T08:%02d:00Z" % m for m in (0, 15, 30, 45)]
                         + ["2026-04-20T09:00:00Z"])
        self.assertEqual(self.times("0 0,12 * * *", "--from", "2026-04-20T00:00:00Z", "-n", "3"),
                         ["2026-04-20T12:00:00Z", "2026-04-21T00:00:00Z", "2026-04-21T12:00:00Z"])
        self.assertEqual(self.times("1-7/2 * * * *", "--from", "2026-04-20T08:00:00Z", "-n", "5"),
                         ["2026-04-20T08:0%d:00Z" % m for m in (1, 3, 5, 7)]
                         + ["2026-04-20T09:01:00Z"])
        # the OR rule: day 1 of the month or a Monday
        got = self.times("0 0 1 * 1", "--from", "2026-03-31T00:00:00Z", "-n", "4")
        self.assertEqual(got, ["2026-04-01T00:00:00Z", "2026-04-06T00:00:00Z",
                               "2026-04-13T00:00:00Z", "2026-04-20T00:00:00Z"])
        self.assertNotIn("2026-04-15T00:00:00Z", got)
        # same day and wrap to the next year
        self.assertEqual(self.times("30 23 31 12 *", "--from", "2026-12-31T23:29:59Z", "-n", "2"),
                         ["2026-12-31T23:30:00Z", "2027-12-31T23:30:00Z"])
        self.assertEqual(self.times("@yearly", "--from", "2026-06-01T00:00:00Z", "-n", "1"),
                         ["2027-01-01T00:00:00Z"])
        # the expression may come as separate words
        self.assertEqual(self.times("0", "9", "*", "*", "1-5", "--from", "2026-04-17T10:00:00Z",
                                    "-n1"), ["2026-04-20T09:00:00Z"])

    def test_default_count_and_from(self):
        got = self.times("*/5 * * * *")
        self.assertEqual(len(got), 5)
        now = time.time()
        stamps = [calendar.timegm(time.strptime(t, "%Y-%m-%dT%H:%M:%SZ")) for t in got]
        self.assertTrue(now - 1 <= stamps[0] <= now + 300, (got, now))
        self.assertEqual([b - a for a, b in zip(stamps, stamps[1:])], [300] * 4)

    def test_bad_expressions(self):
        for expr, msg in (("* * * *", "expected 5 fields, got 4"),
                          ("60 * * * *", "minute: 60 out of range 0-59"),
                          ("0 0 * * 1..5", "day-of-week: bad token '1..5'"),
                          ("@foo", "unknown macro '@foo'")):
            out, err = self.check(["cron", "next", expr], 65)
            self.assertEqual((out, err), ("", "kairosctl: %s\n" % msg), expr)
        _, err = self.check(["cron", "next", "0 0 31 2 *", "--from", "2026-01-01T00:00:00Z"], 65)
        self.assertIn("never matches", err)

    def test_usage(self):
        self.usage("cron", "next", contains="missing EXPR")
        self.usage("cron", "next", "* * * * *", "--from", "2026-04-20 08:00", contains="--from")
        self.usage("cron", "next", "* * * * *", "-n", "0", contains="-n")
        self.usage("cron", "next", "* * * * *", "-n", "1001")
        self.usage("cron", "next", "* * * * *", "-n")
        self.usage("cron", "next", "* * * * *", "--bogus")
        out, err = self.check(["cron", "next", "* * * * *", "--tz", "Mars/Olympus"], 65)
        self.assertEqual(err, "kairosctl: cron next: unknown time zone 'Mars/Olympus'\n")
        out, err = self.check(["cron", "next", "* * * * *", "--tz", "../etc/passwd"], 65)
        self.assertIn("not a time zone name", err)

    def test_tz_berlin_across_dst(self):
        if not os.path.exists("/usr/share/zoneinfo/Europe/Berlin"):
            self.skipTest("no tzdata")
        # spring forward 2026-03-29: 02:30 local does not exist that day
        got = self.times("30 2 * * *", "--tz", "Europe/Berlin", "--from", "2026-03-27T00:00:00Z",
                         "-n", "4")
        self.assertEqual(got, ["2026-03-27T01:30:00Z  2026-03-27T02:30:00+01:00",
                               "2026-03-28T01:30:00Z  2026-03-28T02:30:00+01:00",
                               "2026-03-30T00:30:00Z  2026-03-30T02:30:00+02:00",
                               "2026-03-31T00:30:00Z  2026-03-31T02:30:00+02:00"])
        # fall back 2026-10-25: 02:30 local happens twice, fires once (the first)
        got = self.times("30 2 * * *", "--tz", "Europe/Berlin", "--from", "2026-10-24T00:00:00Z",
                         "-n", "3")
        self.assertEqual(got, ["2026-10-24T00:30:00Z  2026-10-24T02:30:00+02:00",
                               "2026-10-25T00:30:00Z  2026-10-25T02:30:00+02:00",
                               "2026-10-26T01:30:00Z  2026-10-26T02:30:00+01:00"])
        # hourly across the gap: 01:00 then 03:00 local (one real hour apart)
        got = self.times("0 * * * *", "--tz", "Europe/Berlin", "--from", "2026-03-28T23:30:00Z",
                         "-n", "3")
        self.assertEqual(got, ["2026-03-29T00:00:00Z  2026-03-29T01:00:00+01:00",
                               "2026-03-29T01:00:00Z  2026-03-29T03:00:00+02:00",
                               "2026-03-29T02:00:00Z  2026-03-29T04:00:00+02:00"])

    def test_json(self):
        out, _ = self.check(["--json", "cron", "next", "0 9 * * *", "--tz", "Europe/Berlin",
                             "--from", "2026-03-28T12:00:00Z", "-n", "2"], 0)
        self.assertEqual(json.loads(out), {
            "expr": "0 9 * * *", "time_zone": "Europe/Berlin", "from": "2026-03-28T12:00:00Z",
            "next": [{"utc": "2026-03-29T07:00:00Z", "local": "2026-03-29T09:00:00+02:00",
                      "utc_offset": "+02:00"},
                     {"utc": "2026-03-30T07:00:00Z", "local": "2026-03-30T09:00:00+02:00",
                      "utc_offset": "+02:00"}]})
        out, _ = self.check(["cron", "next", "--json", "0 9 * * *", "--from",
                             "2026-03-28T12:00:00Z", "-n", "1"], 0)
        self.assertEqual(json.loads(out)["time_zone"], "UTC")
        self.assertEqual(json.loads(out)["next"][0]["utc_offset"], "+00:00")


class TestNeverCrash(Case):
    def test_garbage_inputs(self):
        rnd = random.Random(20260420)
        w, _, _ = clean_wal()
        good = w.data()
        samples = [b"", b"\n\n", b"\x00" * 100, b"{" * 5000, b"[" * 100000, b"\xff\xfe" * 50,
                   b'{"op":"transition"}\n' * 3, b'{"op":"plan_commit","steps":7}\n',
                   b'{"op":"plan_commit","plan_id":5,"steps":[1,{"step_id":[]}]}\n']
        for _ in range(40):
            data = bytearray(good)
            for _ in range(rnd.randint(1, 6)):
                i = rnd.randrange(len(data))
                data[i] = rnd.randrange(256)
            samples.append(bytes(data))
            samples.append(bytes(rnd.randrange(256) for _ in range(rnd.randint(0, 300))))
        state = os.path.join(self.tmp, "state")
        os.makedirs(os.path.join(state, "wal"))
        for i, s in enumerate(samples):
            path = self.write(f"state/wal/s{i:03d}.wal.jsonl", s)
            for args in (["wal", "verify", path], ["wal", "dump", path],
                         ["--json", "wal", "dump", path], ["canon", path]):
                rc, out, _ = run(*args)
                self.assertIn(rc, (0, 1, 2, 65), f"{args} on sample {i}: exit {rc}")
                if "--json" in args:
                    json.loads(out)
        for args in (["recover", "--dry-run", "--state-dir", state],
                     ["--json", "recover", "--dry-run", "--state-dir", state]):
            rc, out, _ = run(*args)
            self.assertEqual(rc, 0, args)
            if "--json" in args:
                json.loads(out)


if __name__ == "__main__":
    if not KAIROSCTL or not os.access(KAIROSCTL, os.X_OK):
        print(f"KAIROSCTL={KAIROSCTL!r} is not an executable kairosctl", file=sys.stderr)
        sys.exit(1)
    result = unittest.main(verbosity=2, exit=False).result
    if not result.wasSuccessful():
        print(f"\nFAILED: {len(result.failures)} failures, {len(result.errors)} errors",
              file=sys.stderr)
        for test, tb in result.failures + result.errors:
            print(f"--- {test.id()}", file=sys.stderr)
            print(tb.strip().splitlines()[-1], file=sys.stderr)
        sys.exit(1)
