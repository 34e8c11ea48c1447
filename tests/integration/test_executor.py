#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Black-box tests of the executor (docs/design.md §6, §10; issue 4): the real kairosd
runs real handler programs (small sh scripts written into the test's temporary
directory) for the five phases of each cycle.  Checked from the outside: the
environment and stdin document of every handler, results feeding later phases,
the WAL records and their order, fdatasync calls per cycle, MaxCycles, reflect
"done", approval, every way a step fails (exit status, signal, timeout, output
over 1 MiB, a missing program), phases without a command, two failed cycles,
firing twice, MaxConcurrentMandates, the archive, a graceful stop in the middle
of a step and a kill -9 of the daemon.

No sleeps as synchronization: the tests wait on log lines, replies, and
handlers that block on a FIFO the test opens when it wants them to go on."""
import gzip
import hashlib
import json
import os
import pwd
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kairos_harness import Client, Daemon, NotifySocket, read_records, write_config  # noqa: E402

KAIROSCTL = os.environ.get("KAIROSCTL", "kairosctl")
# the kairosctl that kairosd finds for its handlers: the one of this build
KAIROSCTL_PATH = os.path.realpath(shutil.which(KAIROSCTL) or KAIROSCTL)
PW = pwd.getpwuid(os.getuid())
AT = "2026-04-20T12:00:00Z"
PHASES = ("observe", "orient", "decide", "act", "reflect")
PHASE_KEYS = ("Observe", "Orient", "Decide", "Act", "Reflect")
CRON = {"Cron": "0 0 1 1 *"}


def plan_id(schedule, fired_at, cycle=1):
    """docs/design.md §3."""
    key = "%s|%s" % (schedule, fired_at) if cycle == 1 else "%s|%s|%d" % (schedule, fired_at, cycle)
    return "plan_" + hashlib.sha256(key.encode()).hexdigest()[:12]


def mandate_id(schedule, fired_at):
    return "mnd_" + plan_id(schedule, fired_at)


def canon_hash(text):
    """The canonical hash of a JSON text, as kairosctl computes it."""
    out = subprocess.run([KAIROSCTL, "canon", "--hash", "-"], input=text, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


# Records the environment, working directory and stdin document of the step
# in OUT/<step>.<attempt>.{env,cwd,stdin}, then prints a result: JSON for most
# phases, plain text (with trailing blanks) for orient, nothing for decide.
REC_SH = r"""#!/bin/sh
base="$1/$KAIROS_STEP_ID.$KAIROS_ATTEMPT"
env > "$base.env"
pwd > "$base.cwd"
cat > "$base.stdin"
case "$KAIROS_PHASE" in
orient) printf 'plain text, not JSON  \n\n' ;;
decide) ;;
*) printf '{"phase":"%s","cycle":%s}\n' "$KAIROS_PHASE" "$KAIROS_CYCLE" ;;
esac
"""


class ExecCase(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-exec-")
        self.state = os.path.join(self.dir, "state")
        self.out = os.path.join(self.dir, "out")
        os.makedirs(self.out)
        self.notify = NotifySocket(self.dir)
        self.daemons = []
        self.clients = []
        self.conf = None

    def tearDown(self):
        for c in self.clients:
            c.close()
        for d in self.daemons:
            if d.proc.poll() is None:
                # graceful: the sanitizer build's LeakSanitizer runs at exit
                self.assertEqual(d.stop(), 0, d.log()[-3000:])
            else:
                d.kill()
            d.proc.stderr.close()
        self.notify.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- set-up helpers ----

    def script(self, name, body):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write("#!/bin/sh\n" + body if not body.startswith("#!") else body)
        return path

    def configure(self, schedules, daemon_extra=""):
        self.conf = write_config(self.dir, self.state, schedules,
                                 daemon_extra="GracefulTimeoutSec=1\n" + daemon_extra)

    def start(self, env=None, pass_fds=()):
        self.notify.clear()
        d = Daemon(self.state, config=self.conf, notify=self.notify, env=env, pass_fds=pass_fds)
        self.daemons.append(d)
        self.notify.wait_ready()
        self.d = d
        self.c = Client(d.socket_path)
        self.clients.append(self.c)
        return d

    def restart(self):
        self.assertEqual(self.d.stop(), 0, self.d.log()[-3000:])
        return self.start()

    # ---- control helpers ----

    def call_ok(self, cmd, **args):
        r = self.c.call(cmd, **args)
        self.assertTrue(r["ok"], (cmd, args, r))
        return r["result"]

    def fire(self, schedule, at=AT):
        r = self.call_ok("fire", schedule=schedule, at=at)
        self.assertEqual(r["mandate"], mandate_id(schedule, at))
        return r["mandate"]

    def mandate(self, m):
        return {x["id"]: x for x in self.call_ok("list")["mandates"]}[m]

    def ctl(self, *args):
        return subprocess.run([KAIROSCTL, "--socket", self.d.socket_path, *args],
                              capture_output=True, text=True, timeout=60)

    # ---- files ----

    def wal_path(self, m):
        return os.path.join(self.state, "wal", m + ".wal.jsonl")

    def archive_path(self, m):
        return os.path.join(self.state, "archive", m + ".wal.jsonl.gz")

    def archived(self, m):
        with gzip.open(self.archive_path(m)) as gz:
            return [json.loads(line) for line in gz.read().splitlines() if line.strip()]

    def step_records(self, recs, step):
        return [r for r in recs if r.get("step_id") == step and r["op"] in ("append", "transition")]

    def last_status(self, recs, step):
        return [r for r in recs if r.get("step_id") == step and r["op"] == "transition"][-1]

    def read_out(self, step, what, attempt=1):
        with open(os.path.join(self.out, "%s.%d.%s" % (step, attempt, what))) as f:
            return f.read()

    def env_of(self, step, attempt=1):
        env = {}
        for line in self.read_out(step, "env", attempt).splitlines():
            k, _, v = line.partition("=")
            env[k] = v
        return env

    def wait_log_count(self, text, n, timeout=30.0):
        """Wait until n log lines contain text."""
        d = self.d
        deadline = time.monotonic() + timeout
        with d.cond:
            while sum(1 for line in d.lines if line is not None and text in line) < n:
                left = deadline - time.monotonic()
                if left <= 0 or (d.lines and d.lines[-1] is None):
                    self.fail("fewer than %d log lines with %r:\n%s" % (n, text, d.log()[-3000:]))
                d.cond.wait(left)

    def log_index(self, text):
        lines = self.d.log().splitlines()
        for i, line in enumerate(lines):
            if text in line:
                return i
        self.fail("no log line with %r" % text)

    def fifo(self, name):
        path = os.path.join(self.dir, name)
        os.mkfifo(path)
        return path

    def release(self, path):
        """Let a handler blocked reading the FIFO go on (open blocks until
        the handler has opened its end)."""
        with open(path, "w") as f:
            f.write("go\n")


class TestCycle(ExecCase):
    def test_full_cycles_environment_stdin_results_and_wal(self):
        rec = self.script("rec.sh", REC_SH)
        exec_keys = {k: "/bin/sh %s %s" % (rec, self.out) for k in PHASE_KEYS}
        exec_keys["Environment"] = ["GREETING=hello", "\"SECOND=two words\""]
        self.configure({"full": {"Schedule": CRON,
                                 "Mandate": {"Goal": "keep the lights on", "MaxCycles": "2"},
                                 "Exec": exec_keys}})
        self.start(env={"LANG": "C.UTF-8", "KAIROS_TEST_LEAK": "1"})
        m = self.fire("full")
        self.d.wait_log("mandate %s done after 2 cycles (MaxCycles reached)" % m)
        self.assertEqual(self.mandate(m)["status"], "done")
        self.assertEqual(self.mandate(m)["reason"], "MaxCycles reached")
        sock = os.path.join(self.state, "control.sock")

        # every KAIROS_* variable, the Environment= entries, nothing else of
        # the daemon's environment
        for cycle in (1, 2):
            for phase in PHASES:
                step = "%s_%03d" % (phase, cycle)
                env = self.env_of(step)
                want = {
                    "KAIROS_MANDATE_ID": m, "KAIROS_PLAN_ID": plan_id("full", AT, cycle),
                    "KAIROS_STEP_ID": step, "KAIROS_PHASE": phase, "KAIROS_CYCLE": str(cycle),
                    "KAIROS_IDEM_KEY": m + "/" + step, "KAIROS_SCHEDULE": "full",
                    "KAIROS_FIRED_AT": AT, "KAIROS_GOAL": "keep the lights on",
                    "KAIROS_ATTEMPT": "1", "KAIROS_CONTROL_SOCKET": sock,
                    "GREETING": "hello", "SECOND": "two words", "LANG": "C.UTF-8",
                    "HOME": PW.pw_dir, "USER": PW.pw_name, "LOGNAME": PW.pw_name,
                    "KAIROSCTL": KAIROSCTL_PATH,
                }
                for k, v in want.items():
                    self.assertEqual(env.get(k), v, (step, k))
                self.assertIn("PATH", env)
                extra = set(env) - set(want) - {"PATH", "PWD", "SHLVL", "_", "OLDPWD"}
                self.assertEqual(extra, set(), "only the documented environment (%s)" % step)
                self.assertEqual(self.read_out(step, "cwd").strip(), self.state,
                                 "cwd = the state directory")
                self.assertFalse(os.path.exists(os.path.join(self.out, step + ".2.env")),
                                 "each step ran once")

        # the stdin document of reflect: earlier results, previous reflect
        doc1 = json.loads(self.read_out("reflect_001", "stdin"))
        doc2 = json.loads(self.read_out("reflect_002", "stdin"))
        self.assertEqual(doc2, {
            "mandate": {"id": m, "schedule": "full", "fired_at": AT, "max_cycles": 2},
            "goal": "keep the lights on",
            "plan": {"plan_id": plan_id("full", AT, 2), "cycle": 2},
            "step": {"step_id": "reflect_002", "phase": "reflect", "attempt": 1,
                     "idem_key": m + "/reflect_002"},
            "results": {"observe": {"phase": "observe", "cycle": 2},
                        "orient": "plain text, not JSON",
                        "decide": None,
                        "act": {"phase": "act", "cycle": 2}},
            "previous_reflect": {"phase": "reflect", "cycle": 1},
        })
        self.assertIsNone(doc1["previous_reflect"])
        self.assertEqual(doc1["results"]["act"], {"phase": "act", "cycle": 1})
        self.assertEqual(json.loads(self.read_out("observe_001", "stdin"))["results"], {})
        self.assertEqual(json.loads(self.read_out("decide_002", "stdin"))["results"],
                         {"observe": {"phase": "observe", "cycle": 2},
                          "orient": "plain text, not JSON"})

        # the WAL, in order
        # finished mandates are archived in batches: the WAL goes after one syncfs
        self.d.wait_log("mandate %s: WAL archived" % m)
        self.assertFalse(os.path.exists(self.wal_path(m)), "archived")
        recs = self.archived(m)
        self.assertEqual(recs[0]["op"], "mandate")
        self.assertEqual((recs[0]["mandate_id"], recs[0]["schedule"], recs[0]["fired_at"],
                          recs[0]["goal"]), (m, "full", AT, "keep the lights on"))
        want = [("mandate", None, None)]
        for cycle in (1, 2):
            want.append(("plan_commit", plan_id("full", AT, cycle), None))
            for phase in PHASES:
                step = "%s_%03d" % (phase, cycle)
                want += [("append", step, "pending"), ("transition", step, "executing"),
                         ("transition", step, "completed")]
            want.append(("plan_finalize", plan_id("full", AT, cycle), "succeeded"))
        got = [(r["op"], r.get("step_id", r.get("plan_id")) if r["op"] != "mandate" else None,
                r.get("status")) for r in recs]
        self.assertEqual(got, want)
        for r in recs:
            self.assertRegex(r.get("crc", ""), r"^[0-9a-f]{8}$", r)
            if r["op"] == "append":
                self.assertEqual(r["idem_key"], m + "/" + r["step_id"])
        commit = recs[1]
        self.assertEqual([s["step_id"] for s in commit["steps"]],
                         ["%s_001" % p for p in PHASES])
        results = {r["step_id"]: r for r in recs if r.get("status") == "completed"}
        self.assertEqual(results["observe_001"]["result"], {"phase": "observe", "cycle": 1})
        self.assertEqual(results["orient_001"]["result"], "plain text, not JSON")
        self.assertIsNone(results["decide_001"]["result"])
        self.assertEqual(results["observe_001"]["result_hash"],
                         canon_hash('{"phase":"observe","cycle":1}'))
        self.assertEqual(results["orient_001"]["result_hash"], canon_hash('"plain text, not JSON"'))
        self.assertEqual(results["decide_001"]["result_hash"], canon_hash("null"))
        for s in commit["steps"]:
            self.assertEqual(results[s["step_id"]]["post_hash"], s["expected_post_hash"])

        # durability barrier: at most 6 fdatasync calls per cycle
        flushes = self.call_ok("status")["fdatasync_calls"]
        self.assertGreater(flushes, 0)
        self.assertLessEqual(flushes / 2, 6, "%d fdatasync calls for 2 cycles" % flushes)

        # the stderr lines and the step lines are in the log
        self.assertIn("%s observe_001: started /bin/sh %s %s (pid " % (m, rec, self.out),
                      self.d.log())
        self.assertIn("%s reflect_002: completed" % m, self.d.log())

    def test_reflect_done_ends_early(self):
        done = self.script("done.sh", "echo '{\"kairos\":{\"done\":true},\"note\":\"enough\"}'\n")
        self.configure({"early": {"Schedule": CRON, "Mandate": {"MaxCycles": "3"},
                                  "Exec": {"Reflect": "/bin/sh " + done}}})
        self.start()
        m = self.fire("early")
        self.d.wait_log("mandate %s done after 1 cycle (reflect said done)" % m)
        recs = self.archived(m)
        self.assertEqual([r["cycle"] for r in recs if r["op"] == "plan_commit"], [1])
        self.assertEqual((recs[-1]["op"], recs[-1]["status"]), ("plan_finalize", "succeeded"))
        self.assertEqual(self.mandate(m)["status"], "done")
        self.assertEqual(self.mandate(m)["cycle"], 1)

    def test_max_cycles_one(self):
        self.configure({"once": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"}}})
        self.start()
        m = self.fire("once")
        self.d.wait_log("mandate %s done after 1 cycle (MaxCycles reached)" % m)
        self.assertEqual([r["cycle"] for r in self.archived(m) if r["op"] == "plan_commit"], [1])

    def test_phase_without_command_has_null_result(self):
        rec = self.script("rec.sh", REC_SH)
        work = os.path.join(self.dir, "work")
        os.makedirs(work)
        self.configure({"sparse": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                   "Exec": {"Act": "/bin/sh %s %s" % (rec, self.out),
                                            "WorkingDirectory": work}}})
        self.start()
        m = self.fire("sparse")
        self.d.wait_log("mandate %s done" % m)
        log = self.d.log()
        for phase in ("observe", "orient", "decide", "reflect"):
            self.assertNotIn("%s %s_001: started" % (m, phase), log, "no process")
            self.assertFalse(os.path.exists(os.path.join(self.out, "%s_001.1.env" % phase)))
        self.assertIn("%s act_001: started" % m, log)
        recs = self.archived(m)
        null_hash = canon_hash("null")
        for phase in ("observe", "orient", "decide", "reflect"):
            done = self.last_status(recs, phase + "_001")
            self.assertEqual(done["status"], "completed")
            self.assertIn("result", done)
            self.assertIsNone(done["result"])
            self.assertEqual(done["result_hash"], null_hash)
        doc = json.loads(self.read_out("act_001", "stdin"))
        self.assertEqual(doc["results"], {"observe": None, "orient": None, "decide": None})
        self.assertEqual(doc["goal"], "sparse", "Goal= defaults to the schedule name")
        self.assertEqual(self.env_of("act_001")["KAIROS_GOAL"], "sparse")
        self.assertEqual(self.read_out("act_001", "cwd").strip(), work, "WorkingDirectory=")


class TestResults(ExecCase):
    # What a handler prints becomes the result: JSON as it is, anything
    # else as a JSON string.  Every one must leave a readable WAL and be
    # shown by `show`.
    OUTPUTS = {
        "deep127": ("[" * 127 + "]" * 127, json.loads("[" * 127 + "]" * 127)),
        # one level more would make the completed record too deep to read back
        "deep128": ("[" * 128 + "]" * 128, "[" * 128 + "]" * 128),
        # digit for digit, a number (show splices the WAL's text into its reply)
        "bigint": ("123456789012345678901234567890", 123456789012345678901234567890),
        "nul": ('"a\\u0000b"', "a\u0000b"),
        "spaced": (' \t {"a" : [ 1 , 2 ] } ', {"a": [1, 2]}),
        "text": ("\x01 not json", "\x01 not json"),
        # two values are not one: text, not the first of them
        "two": ('{"a":1},{"b":2}', '{"a":1},{"b":2}'),
        "two_scalars": ("1,2", "1,2"),
    }

    def test_result_kinds(self):
        schedules = {}
        for name, (out, _) in self.OUTPUTS.items():
            h = self.script(name + ".sh", "cat <<'EOF'\n%s\nEOF\n" % out)
            schedules[name] = {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                               "Exec": {"Observe": "/bin/sh " + h}}
        self.configure(schedules)
        self.start()
        for name, (_, want) in self.OUTPUTS.items():
            m = self.fire(name)
            self.d.wait_log("mandate %s done" % m)
            r = self.call_ok("show", mandate=m)
            self.assertEqual(r["wal_status"], "clean", name)
            step = r["plans"][0]["steps"][0]
            self.assertEqual(step["status"], "completed", name)
            self.assertEqual(step.get("result", "<missing>"), want, name)
            plain = os.path.join(self.dir, name + ".wal.jsonl")
            with gzip.open(self.archive_path(m)) as gz, open(plain, "wb") as f:
                f.write(gz.read())
            out = subprocess.run([KAIROSCTL, "wal", "verify", plain], capture_output=True,
                                 text=True, timeout=30)
            self.assertEqual(out.returncode, 0, (name, out.stdout, out.stderr))


class TestResultNumbers(ExecCase):
    # issue 11 item 5: handler output is read with the exact reader of
    # canonical JSON: integers of any size and numbers beyond double range are
    # JSON, kept digit for digit in the completed record.
    OUTPUTS = {
        "bigobj": '{"x":123456789012345678901234567890123456789}',
        "huge": '{"x":1e999}',
        "negbig": '[-98765432109876543210987654321, 1.5e-400]',
    }
    DIGITS = {"bigobj": "123456789012345678901234567890123456789", "huge": "1e999",
              "negbig": "-98765432109876543210987654321"}

    def test_exact_numbers_are_json(self):
        schedules = {}
        for name, out in self.OUTPUTS.items():
            h = self.script(name + ".sh", "cat <<'EOF'\n%s\nEOF\n" % out)
            schedules[name] = {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                               "Exec": {"Observe": "/bin/sh " + h}}
        t = self.script("text.sh", "echo '{\"x\": nope}'\n")
        schedules["text"] = {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                             "Exec": {"Observe": "/bin/sh " + t}}
        self.configure(schedules)
        self.start()
        for name, out in self.OUTPUTS.items():
            m = self.fire(name)
            self.d.wait_log("mandate %s done" % m)
            with gzip.open(self.archive_path(m)) as gz:
                data = gz.read().decode()
            compact = out.replace(" ", "")
            self.assertIn('"status":"completed","post_hash"', data)
            self.assertIn('"result":%s' % compact, data, name)
            self.assertNotIn("%s observe_001: the output is not JSON" % m, self.d.log())
            # the offline reader keeps the digits too
            plain = os.path.join(self.dir, name + ".wal.jsonl")
            with open(plain, "w") as f:
                f.write(data)
            js = subprocess.run([KAIROSCTL, "wal", "dump", plain], capture_output=True,
                                text=True, timeout=30)
            self.assertEqual(js.returncode, 0, js.stderr)
            self.assertIn(self.DIGITS[name], js.stdout, name)
        m = self.fire("text")
        self.d.wait_log("mandate %s done" % m)
        self.assertIn("%s observe_001: the output is not JSON (" % m, self.d.log())
        self.assertIn("): kept as text", self.d.log())
        rec = self.last_status(self.archived(m), "observe_001")
        self.assertEqual(rec["result"], '{"x": nope}')


class TestCompactResults(ExecCase):
    # A result printed compactly is the record's text as printed and is
    # hashed in one pass (no tree); any other JSON is written compactly.
    # Either way: the WAL's bytes, the result_hash (against kairosctl canon,
    # which parses) and every later step's stdin are what they were.
    @staticmethod
    def big_compact(size):
        """Compact JSON of exactly size bytes: every escape kbuf_json_string
        writes, UTF-8, numbers in every form, keys out of order, duplicate
        and volatile keys."""
        items, n = [], 0
        head = ('{"z":1,"ts":"now","a":[{"s":"q\\"b\\\\s\\b\\f\\n\\r\\t\\u0000\\u001f/\x7f",'
                '"u":"\u00e9\u20ac\U0001F600","n":[0,-0,1.50,-2.5e-05,1E+2,0.1,'
                '123456789012345678901234567890,1e22,100.0],"k":1,"k":2,"nonce":3}],'
                '"items":[')
        i = 0
        while n < size - 400:
            it = '{"id":%d,"name":"item-%06d","score":%s,"tags":["a","bb"],"ok":%s}' % (
                i, i, "%d.%d5" % (i, i % 10), "true" if i % 2 else "false")
            items.append(it)
            n += len(it) + 1
            i += 1
        text = head + ",".join(items) + '],"pad":"'
        text += "x" * (size - len(text.encode()) - 2) + '"}'
        assert len(text.encode()) == size
        return text

    def test_results_byte_and_hash_identical(self):
        cap = 1024 * 1024
        outputs = {
            "cap": self.big_compact(cap),
            "pretty": json.dumps({"b": [1, 2.5, "\u00e9/\n"], "a": {"y": None, "x": True}},
                                 indent=2, ensure_ascii=True).replace("/", "\\/"),
            "deep": "[" * 63 + '{"k":' * 64 + "1" + "}" * 64 + "]" * 63,
        }
        schedules = {}
        for name, out in outputs.items():
            path = os.path.join(self.dir, name + ".out")
            with open(path, "wb") as f:
                f.write(out.encode())
            obs = self.script(name + "-obs.sh", "exec cat %s\n" % path)
            # every later step keeps its stdin (their buffers are reused)
            keep = self.script(name + "-keep.sh",
                               'cat > %s.$KAIROS_PHASE.stdin\n[ "$KAIROS_PHASE" = reflect ] && '
                               'echo \'{"done":true}\'\nexit 0\n' % path)
            schedules[name] = {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                               "Exec": {"Observe": "/bin/sh " + obs, "Orient": "/bin/sh " + keep,
                                        "Decide": "/bin/sh " + keep, "Act": "/bin/sh " + keep,
                                        "Reflect": "/bin/sh " + keep}}
        self.configure(schedules)
        self.start()
        for name, out in outputs.items():
            m = self.fire(name)
            self.d.wait_log("mandate %s done" % m)
            self.assertNotIn("%s observe_001: the output is not JSON" % m, self.d.log())
            with gzip.open(self.archive_path(m)) as gz:
                data = gz.read()
            compact = out.encode() if name != "pretty" else json.dumps(
                json.loads(out), separators=(",", ":"), ensure_ascii=False).encode()
            rec = [line for line in data.splitlines() if b'"step_id":"observe_001"' in line
                   and b'"status":"completed"' in line][0]
            self.assertTrue(b',"result":' + compact + b',' in rec, name)
            self.assertEqual(json.loads(rec)["result_hash"], canon_hash(out), name)
            for phase in ("orient", "decide", "act", "reflect"):
                with open(os.path.join(self.dir, "%s.out.%s.stdin" % (name, phase)), "rb") as f:
                    doc = f.read()
                want = b'"results":{"observe":' + compact + (b'}' if phase == "orient" else b',')
                self.assertTrue(want in doc, (name, phase))
                self.assertEqual(json.loads(doc)["step"]["phase"], phase, name)
            # the archive is the WAL, whole (the records before the result
            # too) and sealed
            self.assertLess(data.find(b'"op":"plan_commit"'), data.find(b'"status":"completed"'))
            self.assertGreaterEqual(data.find(b'"op":"plan_commit"'), 0)
            plain = os.path.join(self.dir, name + ".wal.jsonl")
            with open(plain, "wb") as f:
                f.write(data)
            out = subprocess.run([KAIROSCTL, "wal", "verify", plain], capture_output=True,
                                 text=True, timeout=30)
            self.assertEqual(out.returncode, 0, (name, out.stdout, out.stderr))


class TestHandlerProcess(ExecCase):
    def test_no_stray_fds(self):
        # issue 11 item 7: fds kairosd inherited (10 and 251 here) do not
        # reach the handlers; only stdin, stdout and stderr do.
        stray = os.path.join(self.dir, "stray")
        fds = []
        for want in (10, 251):
            fd = os.open(stray + str(want), os.O_CREAT | os.O_RDWR, 0o600)
            os.dup2(fd, want, inheritable=True)
            os.close(fd)
            fds.append(want)
        lister = ("import os, json\n"
                  "fds = {}\n"
                  "for f in os.listdir('/proc/self/fd'):\n"
                  "    try: fds[f] = os.readlink('/proc/self/fd/' + f)\n"
                  "    except OSError: pass\n"
                  "print(json.dumps(fds))\n")
        h = self.script("fds.py", lister)
        self.configure({"fds": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                "Exec": {"Observe": "%s %s" % (sys.executable, h)}}})
        try:
            d = self.start(pass_fds=fds,
                           env={"KAIROS_TEST_RUNNER_DIRECT_FDS": getattr(self, "direct_fds", "")})
        finally:
            for fd in fds:
                os.close(fd)
        kfds = os.listdir("/proc/%d/fd" % d.proc.pid)
        self.assertIn("251", kfds, "kairosd itself got the stray fd")
        m = self.fire("fds")
        self.d.wait_log("mandate %s done" % m)
        got = self.last_status(self.archived(m), "observe_001")["result"]
        leaked = {fd: t for fd, t in got.items() if t.startswith(stray)}
        self.assertEqual(leaked, {}, got)
        self.assertTrue({"0", "1", "2"} <= set(got), got)
        # nothing but stdio and what python opened itself (the listing)
        self.assertLessEqual(len(got), 4, got)

    def test_no_stray_fds_through_the_slots(self):
        # pipes above KAIROS_TEST_RUNNER_DIRECT_FDS go through the runner's
        # slots (a daemon running many handlers): the same stdio, nothing else
        self.direct_fds = "0"
        self.test_no_stray_fds()

    def test_signals_of_a_handler(self):
        # The handler starts with no signal ignored or blocked: SIGPIPE,
        # which kairosd ignores, back to its default too (the clone resets
        # only the handled ones; the child the ignored ones).
        self.configure({"sig": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                "Exec": {"Observe": "grep -E '^Sig(Ign|Blk):' /proc/self/status"}}})
        self.start()
        m = self.fire("sig")
        self.d.wait_log("mandate %s done" % m)
        got = self.last_status(self.archived(m), "observe_001")["result"]
        self.assertEqual(got.split(), ["SigBlk:", "0000000000000000", "SigIgn:", "0000000000000000"])

    def test_open_file_limit_of_the_start(self):
        # kairosd may raise its own soft open-file limit; its handlers get the
        # one kairosd started with
        h = self.script("lim.sh", "ulimit -n\n")
        self.configure({"lim": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                "Exec": {"Observe": "/bin/sh " + h}}})
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = min(soft, 512)
        if hard <= want:
            self.skipTest("the hard open-file limit (%d) leaves nothing to raise" % hard)
        orig = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        try:
            d = self.start()
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, orig)
        resource.prlimit(d.proc.pid, resource.RLIMIT_NOFILE, (hard, hard))
        m = self.fire("lim")
        self.d.wait_log("mandate %s done" % m)
        got = self.last_status(self.archived(m), "observe_001")["result"]
        self.assertEqual(got, want)
        self.assertEqual(resource.prlimit(d.proc.pid, resource.RLIMIT_NOFILE), (hard, hard))

    def test_identity_and_kairosctl(self):
        # issue 11 item 11, issue 14 item 7: HOME, USER, LOGNAME of the
        # daemon's user; KAIROSCTL and its directory first on PATH, so a
        # handler can call kairosctl by name.
        rec = self.script("rec.sh", REC_SH)
        ctl = self.script("ctl.sh", 'kairosctl status > "$1/status.out" || exit 9\n'
                          'echo \'"asked"\'\n')
        self.configure({"who": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                "Exec": {"Observe": "/bin/sh %s %s" % (rec, self.out),
                                         "Orient": "/bin/sh %s %s" % (ctl, self.out)}}})
        self.start(env={"HOME": "/nonexistent-daemon-home", "USER": "someone-else",
                        "PATH": "/usr/bin:/bin"})
        m = self.fire("who")
        self.d.wait_log("mandate %s done" % m)
        env = self.env_of("observe_001")
        self.assertEqual((env["HOME"], env["USER"], env["LOGNAME"]),
                         (PW.pw_dir, PW.pw_name, PW.pw_name))
        self.assertEqual(env["KAIROSCTL"], KAIROSCTL_PATH)
        self.assertTrue(os.path.isabs(env["KAIROSCTL"]))
        self.assertEqual(env["PATH"], os.path.dirname(KAIROSCTL_PATH) + ":/usr/bin:/bin")
        rec = self.last_status(self.archived(m), "orient_001")
        self.assertEqual((rec["status"], rec.get("result")), ("completed", "asked"), rec)
        with open(os.path.join(self.out, "status.out")) as f:
            self.assertIn("running", f.read())

    def test_stderr_is_capped(self):
        # issue 11 item 8: 50 MiB of stderr without a newline: the first
        # 64 KiB are logged in lines of at most 4 KiB, then one line says how
        # much was dropped; the step still completes.
        h = self.script("loud.sh", "head -c 52428800 /dev/zero | tr '\\0' x >&2\n"
                        "echo 'last words' >&2\necho '\"ok\"'\n")
        self.configure({"loud": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                 "Exec": {"Observe": "/bin/sh " + h}}})
        self.start()
        m = self.fire("loud")
        self.d.wait_log("mandate %s done" % m, timeout=120)
        prefix = "%s observe_001: " % m
        lines = [message(line, prefix) for line in self.d.log().splitlines() if prefix in line]
        pieces = [line for line in lines if line.startswith("xxx")]
        text = "".join(line.rstrip("\u2026") for line in pieces)
        self.assertEqual(text, "x" * 65536, "exactly the first 64 KiB are logged")
        self.assertEqual(len(pieces), 16)
        for line in pieces:
            self.assertLessEqual(len(line.encode()), 4096 + 3)
        for line in pieces[:-1]:
            self.assertTrue(line.endswith("\u2026"), line[-20:])
        dropped = [line for line in lines if "bytes of stderr dropped" in line]
        self.assertEqual(len(dropped), 1, lines[-5:])
        # the rest of the x's and "last words\n"
        self.assertIn("\u2026 %d bytes of stderr dropped" % (52428800 - 65536 + 11), dropped[0])
        self.assertLess(len(lines), 16 + 8, "not hundreds of lines")
        rec = self.last_status(self.archived(m), "observe_001")
        self.assertEqual((rec["status"], rec["result"]), ("completed", "ok"))

    def test_long_lines_are_split(self):
        # a 10,000-byte line: three pieces of at most 4 KiB, never cut inside
        # a UTF-8 character
        h = self.script("long.py", "import sys\nsys.stderr.buffer.write(b'a' * 4095 + "
                        "'\\u00e9'.encode() * 2953 + b'\\nshort\\n')\n")
        self.configure({"long": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                 "Exec": {"Observe": "%s %s" % (sys.executable, h)}}})
        self.start()
        m = self.fire("long")
        self.d.wait_log("mandate %s done" % m)
        prefix = "%s observe_001: " % m
        lines = [message(line, prefix) for line in self.d.log().splitlines()
                 if prefix in line and "started" not in line and "completed" not in line]
        self.assertEqual(lines[-1], "short")
        pieces = lines[:-1]
        self.assertEqual(len(pieces), 3, [len(p) for p in pieces])
        self.assertEqual(pieces[0], "a" * 4095 + "\u2026", "4 KiB, not a half é")
        self.assertEqual("".join(p.rstrip("\u2026") for p in pieces),
                         "a" * 4095 + "\u00e9" * 2953)
        self.assertNotIn("\ufffd", "".join(pieces))


class TestSpawnRetry(ExecCase):
    def test_emfile_at_spawn_is_retried(self):
        # issue 11 item 3: no fd left when a step's handler is to start (the
        # daemon's fd limit lowered with prlimit and filled with idle control
        # connections): the step is started later, not failed; once fds are
        # back the mandate ends done, the step ran once, attempt 1.
        gate = self.script("gate.sh", 'cat "$1.$KAIROS_MANDATE_ID" > /dev/null\n')
        rec = self.script("rec.sh", REC_SH)
        self.configure({"fdless": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                   "Exec": {"Observe": "/bin/sh %s %s/gate" % (gate, self.dir),
                                            "Orient": "/bin/sh %s %s" % (rec, self.out)}}})
        m = mandate_id("fdless", AT)
        fifo = self.fifo("gate." + m)
        d = self.start()
        self.fire("fdless")
        self.d.wait_log("%s observe_001: started" % m)
        pid = d.proc.pid
        old = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        held = []
        try:
            top = max(int(fd) for fd in os.listdir("/proc/%d/fd" % pid))
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (top + 1, old[1]))
            # fill every free fd below the limit with idle connections
            for _ in range(top + 2):
                c = Client(d.socket_path, timeout=10)
                try:
                    c.call("status")
                except (EOFError, OSError):
                    c.close()
                    break
                held.append(c)
            self.release(fifo)
            self.d.wait_log("%s orient_001: cannot start" % m)
            line = self.d.wait_log("trying again in 100 ms (try 1; the handler did not run)")
            self.assertIn("too many open files", line.lower())
        finally:
            for c in held:
                c.close()
            resource.prlimit(pid, resource.RLIMIT_NOFILE, old)
        self.d.wait_log("mandate %s done" % m)
        self.assertRegex(self.d.log(), r"%s orient_001: started after \d+ tr" % m)
        self.assertEqual(self.d.log().count("%s orient_001: started /bin/sh" % m), 1)
        self.assertEqual(self.env_of("orient_001")["KAIROS_ATTEMPT"], "1")
        recs = self.archived(m)
        self.assertEqual([r["status"] for r in self.step_records(recs, "orient_001")],
                         ["pending", "executing", "completed"], "no record of the failed tries")
        self.assertEqual(self.mandate(m)["status"], "done")


class TestApproval(ExecCase):
    def test_pause_approve_goes_on(self):
        act = self.script("act.sh", "cat > /dev/null\n"
                          "echo '{\"kairos\":{\"pause\":\"awaiting_approval\",\"reason\":\"delete 3 files?\"}}'\n")
        rec = self.script("rec.sh", REC_SH)
        self.configure({"ask": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                "Exec": {"Act": "/bin/sh " + act,
                                         "Reflect": "/bin/sh %s %s" % (rec, self.out)}}})
        self.start()
        m = self.fire("ask")
        self.d.wait_log("mandate %s awaits approval (delete 3 files?): kairosctl approve %s" % (m, m))
        row = self.mandate(m)
        self.assertEqual((row["status"], row["reason"], row["review_step"]),
                         ("awaiting_approval", "delete 3 files?", "act_001"))
        recs = read_records(self.wal_path(m))
        self.assertEqual(self.last_status(recs, "act_001")["status"], "completed")
        self.assertEqual(self.step_records(recs, "reflect_001"), [], "reflect waits")
        self.assertFalse(os.path.exists(os.path.join(self.out, "reflect_001.1.env")))
        # approve on something that does not await approval: refused
        r = self.c.call("approve", mandate="mnd_nope")
        self.assertEqual(r["error"]["code"], "not_found")
        r = self.call_ok("approve", mandate=m, reason="checked the list")
        self.assertEqual(r, {"mandate": m, "status": "runnable"})
        r = self.c.call("approve", mandate=m)
        self.assertEqual(r["error"]["code"], "conflict", r)
        self.assertIn("not awaiting approval", r["error"]["message"])
        self.d.wait_log("mandate %s done after 1 cycle" % m)
        recs = self.archived(m)
        ops = [r for r in recs if r["op"] == "operator"]
        self.assertEqual([(o["action"], o["step_id"], o["reason"], o["uid"]) for o in ops],
                         [("approve", "act_001", "checked the list", os.getuid())])
        # the approval comes after completed(act), before reflect starts
        i_op = recs.index(ops[0])
        self.assertLess(recs.index(self.last_status(recs, "act_001")), i_op)
        self.assertLess(i_op, recs.index(self.step_records(recs, "reflect_001")[0]))
        doc = json.loads(self.read_out("reflect_001", "stdin"))
        self.assertEqual(doc["results"]["act"],
                         {"kairos": {"pause": "awaiting_approval", "reason": "delete 3 files?"}})
        r = self.c.call("approve", mandate=m)
        self.assertEqual(r["error"]["code"], "conflict", "done: nothing to approve")


class TestFailures(ExecCase):
    def run_failing(self, body, extra=None, max_cycles="1"):
        """Run a schedule whose observe handler is `body`; return (mandate, failed record)."""
        h = self.script("observe.sh", body)
        ex = {"Observe": "/bin/sh " + h}
        ex.update(extra or {})
        self.configure({"bad": {"Schedule": CRON, "Mandate": {"MaxCycles": max_cycles}, "Exec": ex}})
        self.start()
        m = self.fire("bad")
        self.d.wait_log("mandate %s " % m + ("failed after" if max_cycles == "1" else "terminated"))
        recs = self.archived(m)
        rec = self.last_status(recs, "observe_001")
        self.assertEqual(rec["status"], "failed", rec)
        self.assertEqual(self.step_records(recs, "orient_001"), [], "nothing after a failed step")
        self.assertEqual(self.mandate(m)["status"], "failed" if max_cycles == "1" else "terminated")
        return m, rec

    def test_exit_status_with_stderr_tail(self):
        m, rec = self.run_failing("echo 'first line' >&2\necho 'the reason it broke' >&2\nexit 3\n")
        self.assertEqual(rec["error_class"], "exit_status")
        self.assertEqual(rec["error_msg"], "exit status 3: first line\nthe reason it broke")
        self.assertIn("%s observe_001: first line" % m, self.d.log(), "stderr goes to the log")
        self.assertIn("%s observe_001: the reason it broke" % m, self.d.log())
        self.assertEqual(self.mandate(m)["reason"], "the last cycle failed")
        recs = self.archived(m)
        self.assertEqual((recs[-1]["op"], recs[-1]["status"], recs[-1]["reason"]),
                         ("plan_finalize", "failed", "step_failed"))

    def test_long_stderr_keeps_its_end(self):
        # error_msg holds at most 500 characters: the end of stderr (where the
        # reason is) must be in it, not cut off.
        # (multi-byte characters: counted as characters, never cut in two)
        m, rec = self.run_failing("head -c 3000 /dev/zero | tr '\\0' x >&2\n"
                                  "echo '%s' >&2\necho 'the reason it broke' >&2\n"
                                  "echo >&2\nexit 1\n" % ("\u00e9" * 700))
        msg = rec["error_msg"]
        self.assertEqual(rec["error_class"], "exit_status")
        self.assertEqual(len(msg), 500)
        self.assertEqual(msg, "exit status 1: " + ("\u00e9" * 700 + "\nthe reason it broke")[-485:])
        self.assertNotIn("\ufffd", msg)

    def test_signal(self):
        m, rec = self.run_failing("echo 'going down' >&2\nkill -KILL $$\n")
        self.assertEqual(rec["error_class"], "signal")
        self.assertEqual(rec["error_msg"], "killed by signal 9 (Killed): going down")

    def test_timeout(self):
        m, rec = self.run_failing("echo 'hanging' >&2\nexec sleep 600\n", {"TimeoutSec": "1"})
        self.assertEqual(rec["error_class"], "timeout")
        self.assertEqual(rec["error_msg"], "no exit within TimeoutSec=1: hanging")
        self.assertIn("%s observe_001: failed: no exit within TimeoutSec=1" % m, self.d.log())

    def test_timeout_with_output_held_by_an_escaped_child(self):
        # The handler exits at once, but a child that left its process group
        # (setsid) keeps its stdout and stderr open: the step ends at its
        # TimeoutSec= all the same (it used to wait for the child's end).
        # (With handler cgroups the cgroup kill ends the child at the
        # handler's exit: then the step simply completes.)
        # (the child tells through a FIFO that it has left the group: the
        # runner kills the group when the handler exits)
        fifo = self.fifo("escaped")
        pidfile = os.path.join(self.dir, "escaped.pid")
        try:
            m, rec = self.run_failing(
                "echo 'leaving' >&2\nsetsid /bin/sh -c 'echo $$ > %s; exec sleep 600' &\n"
                "read pid < %s\necho $pid > %s\nexit 0\n" % (fifo, fifo, pidfile),
                {"TimeoutSec": "1"})
            self.assertEqual(rec["error_class"], "timeout")
            self.assertEqual(rec["error_msg"], "no exit within TimeoutSec=1: leaving")
        finally:
            try:
                with open(pidfile) as f:
                    os.kill(int(f.read()), signal.SIGKILL)
            except (OSError, ValueError):
                pass

    def test_output_too_large(self):
        m, rec = self.run_failing("exec head -c 2000000 /dev/zero\n")
        self.assertEqual(rec["error_class"], "output_too_large")
        self.assertIn("1 MiB", rec["error_msg"])

    def test_output_just_under_the_limit_is_a_result(self):
        h = self.script("observe.sh", "head -c %d /dev/zero | tr '\\0' x\n" % (1024 * 1024 - 2))
        self.configure({"big": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                "Exec": {"Observe": "/bin/sh " + h}}})
        self.start()
        m = self.fire("big")
        self.d.wait_log("mandate %s done" % m)
        rec = self.last_status(self.archived(m), "observe_001")
        self.assertEqual(rec["status"], "completed")
        self.assertEqual(rec["result"], "x" * (1024 * 1024 - 2))

    def test_missing_program(self):
        h = os.path.join(self.dir, "no-such-program")
        self.configure({"bad": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                "Exec": {"Observe": h + " --flag"}}})
        self.start()
        m = self.fire("bad")
        self.d.wait_log("mandate %s failed" % m)
        rec = self.last_status(self.archived(m), "observe_001")
        self.assertEqual((rec["status"], rec["error_class"]), ("failed", "exit_status"))
        self.assertEqual(rec["error_msg"], "exit status 127: kairosd: cannot execute '%s': "
                                           "No such file or directory" % h)
        self.assertEqual(self.call_ok("status")["ready"], True, "not a daemon error")

    def test_not_executable(self):
        h = self.script("plain.sh", "echo hi\n")
        os.chmod(h, 0o644)
        m, rec = None, None
        self.configure({"bad": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                "Exec": {"Observe": h}}})
        self.start()
        m = self.fire("bad")
        self.d.wait_log("mandate %s failed" % m)
        rec = self.last_status(self.archived(m), "observe_001")
        if os.getuid() == 0:
            # root may execute nothing without an x bit either
            self.assertIn("cannot execute '%s': Permission denied" % h, rec["error_msg"])
        self.assertEqual(rec["error_class"], "exit_status")

    def test_variables_in_the_command_line(self):
        # $NAME alone splits at blanks, ${NAME} stays one argument, $$ is a $;
        # a command name that expands to nothing fails the step
        h = self.script("args.sh", 'cat > /dev/null\nprintf "%s|" "$@" > "$OUT/args"\n')
        self.configure({"vars": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                 "Exec": {"Act": "/bin/sh %s $OPTS ${OPTS} "
                                                 "--step=${KAIROS_STEP_ID} $$HOME" % h,
                                          "Environment": ['"OPTS=-a  -b"', "OUT=" + self.out]}},
                        "empty": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                  "Exec": {"Act": "$NOTHING", "Environment": "NOTHING="}}})
        self.start()
        m = self.fire("vars")
        self.d.wait_log("mandate %s done" % m)
        with open(os.path.join(self.out, "args")) as f:
            self.assertEqual(f.read(), "-a|-b|-a  -b|--step=act_001|$HOME|")
        m = self.fire("empty")
        self.d.wait_log("mandate %s failed" % m)
        rec = self.last_status(self.archived(m), "act_001")
        self.assertEqual(rec["status"], "failed")
        self.assertIn("cannot start Act=: the command name is empty once its variables are "
                      "expanded", rec["error_msg"])

    def test_two_failed_cycles_terminate(self):
        m, rec = self.run_failing("exit 1\n", max_cycles="3")
        self.assertEqual(self.mandate(m)["reason"], "two consecutive failed cycles")
        recs = self.archived(m)
        self.assertEqual([(r["plan_id"], r["status"]) for r in recs if r["op"] == "plan_finalize"],
                         [(plan_id("bad", AT, 1), "failed"), (plan_id("bad", AT, 2), "failed")])
        self.assertEqual([r["cycle"] for r in recs if r["op"] == "plan_commit"], [1, 2])
        self.d.wait_log("mandate %s terminated after 2 cycles (two consecutive failed cycles)" % m)


class TestMandates(ExecCase):
    def test_fire_twice_is_a_noop(self):
        self.configure({"twice": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"}}})
        self.start()
        r = self.call_ok("fire", schedule="twice", at=AT)
        m = r["mandate"]
        self.assertTrue(r["fired"])
        self.assertNotIn("message", r)
        self.d.wait_log("mandate %s done" % m)
        archive = read_bytes(self.archive_path(m))
        for _ in range(2):
            r = self.call_ok("fire", schedule="twice", at=AT)
            self.assertEqual(r, {"mandate": m, "schedule": "twice", "fired_at": AT, "fired": False,
                                 "status": "done", "message": "already fired: nothing to do"})
            self.restart()
        self.assertEqual(read_bytes(self.archive_path(m)), archive)
        self.assertFalse(os.path.exists(self.wal_path(m)), "no new WAL")
        self.assertEqual(self.d.log().count("fired twice"), 0)
        # another time is another mandate
        r = self.call_ok("fire", schedule="twice", at="2026-04-20T12:00:01Z")
        self.assertTrue(r["fired"])
        self.assertNotEqual(r["mandate"], m)

    def test_fire_twice_while_running(self):
        gate = self.script("gate.sh", 'cat "$1.$KAIROS_MANDATE_ID" > /dev/null\n')
        self.configure({"gated": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                  "Exec": {"Observe": "/bin/sh %s %s/gate" % (gate, self.dir)}}})
        m = mandate_id("gated", AT)
        fifo = self.fifo("gate." + m)
        self.start()
        self.fire("gated")
        self.d.wait_log("%s observe_001: started" % m)
        before = read_bytes(self.wal_path(m))
        r = self.call_ok("fire", schedule="gated", at=AT)
        self.assertEqual((r["fired"], r["status"]), (False, "running"))
        self.assertEqual(read_bytes(self.wal_path(m)), before)
        self.release(fifo)
        self.d.wait_log("mandate %s done" % m)
        self.assertEqual(self.d.log().count("%s observe_001: started" % m), 1)

    def test_max_concurrent_mandates(self):
        # two schedules (mandates of one schedule also wait for each other:
        # Concurrency=queue), one slot
        gate = self.script("gate.sh", 'cat "$1.$KAIROS_MANDATE_ID" > /dev/null\n')
        gated = {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                 "Exec": {"Observe": "/bin/sh %s %s/gate" % (gate, self.dir)}}
        self.configure({"gated1": gated, "gated2": gated},
                       daemon_extra="MaxConcurrentMandates=1\n")
        m1, m2 = mandate_id("gated1", AT), mandate_id("gated2", AT)
        f1, f2 = self.fifo("gate." + m1), self.fifo("gate." + m2)
        self.start()
        r1 = self.call_ok("fire", schedule="gated1", at=AT)
        self.assertEqual(r1["status"], "running")
        self.d.wait_log("%s observe_001: started" % m1)
        r2 = self.call_ok("fire", schedule="gated2", at=AT)
        self.assertEqual((r2["mandate"], r2["fired"], r2["status"]), (m2, True, "runnable"))
        # the second one's plan is durable, nothing of it runs
        self.assertEqual([r["op"] for r in read_records(self.wal_path(m2))], ["mandate", "plan_commit"])
        self.assertEqual((self.mandate(m1)["status"], self.mandate(m2)["status"]),
                         ("running", "runnable"))
        st = self.call_ok("status")["by_status"]
        self.assertEqual((st["running"], st["runnable"]), (1, 1))
        self.release(f1)
        self.d.wait_log("%s observe_001: started" % m2)
        self.assertLess(self.log_index("mandate %s done" % m1),
                        self.log_index("%s observe_001: started" % m2),
                        "the second starts only after the first finished")
        self.assertEqual(self.mandate(m2)["status"], "running")
        self.release(f2)
        self.d.wait_log("mandate %s done" % m2)

    def test_pause_while_a_step_runs(self):
        gate = self.script("gate.sh", 'cat "$1.$KAIROS_MANDATE_ID" > /dev/null\necho \'"out"\'\n')
        self.configure({"gated": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                  "Exec": {"Observe": "/bin/sh %s %s/gate" % (gate, self.dir)}}})
        m = mandate_id("gated", AT)
        fifo = self.fifo("gate." + m)
        self.start()
        self.fire("gated")
        self.d.wait_log("%s observe_001: started" % m)
        self.assertEqual(self.call_ok("pause", mandate=m, reason="hold on")["status"], "paused")
        self.release(fifo)
        self.d.wait_log("%s observe_001: completed" % m)
        # show runs on the mandate's queue after the records of the step
        r = self.call_ok("show", mandate=m)
        self.assertEqual((r["status"], r["reason"]), ("paused", "hold on"))
        steps = {s["step_id"]: s for s in r["plans"][0]["steps"]}
        self.assertEqual((steps["observe_001"]["status"], steps["observe_001"]["result"]),
                         ("completed", "out"), "the running step's result is recorded")
        self.assertIsNone(steps["orient_001"]["status"], "nothing new starts while paused")
        self.assertEqual(self.call_ok("resume", mandate=m)["status"], "runnable")
        self.d.wait_log("mandate %s done" % m)
        self.assertEqual(self.d.log().count("%s observe_001: started" % m), 1)

    def test_big_stdin_not_read(self):
        # observe's result (900 kB) goes into orient's stdin; orient exits
        # without reading it: the daemon does not mind (no SIGPIPE, no error).
        big = self.script("big.sh", "head -c 900000 /dev/zero | tr '\\0' x\n")
        quick = self.script("quick.sh", "echo '\"quick\"'\n")
        self.configure({"big": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                "Exec": {"Observe": "/bin/sh " + big, "Orient": "/bin/sh " + quick}}})
        self.start()
        m = self.fire("big")
        self.d.wait_log("mandate %s done" % m)
        rec = self.last_status(self.archived(m), "orient_001")
        self.assertEqual((rec["status"], rec["result"]), ("completed", "quick"))

    def test_archive_is_a_clean_wal_and_show_works(self):
        rec = self.script("rec.sh", REC_SH)
        self.configure({"arch": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                 "Exec": {"Observe": "/bin/sh %s %s" % (rec, self.out)}}})
        self.start()
        m = self.fire("arch")
        self.d.wait_log("mandate %s: WAL archived" % m)
        self.assertFalse(os.path.exists(self.wal_path(m)))
        plain = os.path.join(self.dir, "unpacked.wal.jsonl")
        with gzip.open(self.archive_path(m)) as gz, open(plain, "wb") as f:
            data = gz.read()
            f.write(data)
        self.assertTrue(data.endswith(b"}\n"))
        out = subprocess.run([KAIROSCTL, "wal", "verify", plain], capture_output=True, text=True,
                             timeout=30)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        nrec = len(data.splitlines())
        self.assertEqual(out.stdout, "%s: ok (%d records, 0 legacy unchecked)\n" % (plain, nrec))
        summary = json.loads(read_bytes(os.path.join(self.state, "mandates", m + ".json")))
        self.assertEqual((summary["mandate_id"], summary["status"], summary["schedule"],
                          summary["fired_at"], summary["archive"]),
                         (m, "done", "arch", AT, self.archive_path(m)))

        def check_show():
            r = self.call_ok("show", mandate=m)
            self.assertEqual((r["status"], r["records"], r["wal_status"]), ("done", nrec, "clean"))
            self.assertEqual(r["plans"][0]["steps"][0]["result"], {"phase": "observe", "cycle": 1})
            out = self.ctl("show", m)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("finalized succeeded", out.stdout)

        check_show()
        self.restart()
        check_show()
        self.assertEqual(self.mandate(m)["status"], "done")
        self.assertEqual(self.mandate(m)["reason"], "MaxCycles reached")


class TestCancel(ExecCase):
    # issue 14 item 3: kairosctl cancel MANDATE --reason T
    def test_cancel_during_act(self):
        # the act ignores SIGTERM (so does its child): SIGKILL 5 s later
        act = self.script("act.sh", "trap '' TERM\necho $$ > \"$1\"\nsleep 600 &\nwait\nwait\n")
        rec = self.script("rec.sh", REC_SH)
        pidfile = self.fifo("actpid")
        self.configure({"risky": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                  "Exec": {"Act": "/bin/sh %s %s" % (act, pidfile),
                                           "Reflect": "/bin/sh %s %s" % (rec, self.out)}}})
        self.start()
        m = self.fire("risky")
        with open(pidfile) as f:
            pid = int(f.read())
        self.assertTrue(alive(pid))
        t0 = time.monotonic()
        out = self.ctl("cancel", m, "--reason", "wrong target")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertGreater(time.monotonic() - t0, 4.5, "TERM was ignored: KILL after 5 s")
        self.assertEqual(out.stdout, "%s: cancelled (its handler of step act_001 was stopped)\n"
                         % m)
        self.assertFalse(alive(pid), "the handler is gone")
        row = self.mandate(m)
        self.assertEqual((row["status"], row["reason"]), ("cancelled", "cancelled: wrong target"))
        recs = self.archived(m)
        act_rec = self.last_status(recs, "act_001")
        self.assertEqual((act_rec["status"], act_rec["error_class"]), ("failed", "cancelled"))
        self.assertIn("wrong target", act_rec["error_msg"])
        self.assertIn("signal 9", act_rec["error_msg"])
        ops = [r for r in recs if r["op"] == "operator"]
        self.assertEqual([(o["action"], o["step_id"], o["reason"], o["uid"]) for o in ops],
                         [("cancel", "act_001", "wrong target", os.getuid())])
        self.assertEqual((recs[-1]["op"], recs[-1]["status"], recs[-1]["reason"]),
                         ("plan_finalize", "abandoned", "cancelled: wrong target"))
        self.assertEqual(self.step_records(recs, "reflect_001"), [], "nothing after the cancel")
        shown = json.loads(self.ctl("show", "--json", m).stdout)
        steps = {s["step_id"]: s for s in shown["plans"][0]["steps"]}
        self.assertEqual((steps["act_001"]["status"], steps["act_001"]["error_class"]),
                         ("failed", "cancelled"), "the interrupted act stays visible")
        again = self.ctl("cancel", m, "--reason", "twice")
        self.assertNotEqual(again.returncode, 0)
        self.assertIn("nothing to cancel", again.stderr)
        self.restart()
        self.assertEqual(self.mandate(m)["status"], "cancelled")

    def test_cancel_queued_and_missing_reason(self):
        gate = self.script("gate.sh", 'cat "$1.$KAIROS_MANDATE_ID" > /dev/null\n')
        gated = {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                 "Exec": {"Observe": "/bin/sh %s %s/gate" % (gate, self.dir)}}
        self.configure({"g1": gated, "g2": gated}, daemon_extra="MaxConcurrentMandates=1\n")
        m1, m2 = mandate_id("g1", AT), mandate_id("g2", AT)
        f1 = self.fifo("gate." + m1)
        self.start()
        self.fire("g1")
        self.d.wait_log("%s observe_001: started" % m1)
        self.fire("g2")
        self.assertEqual(self.mandate(m2)["status"], "runnable")
        out = self.ctl("cancel", m2)
        self.assertEqual(out.returncode, 64, out.stderr)
        self.assertIn("--reason", out.stderr)
        r = self.call_ok("cancel", mandate=m2, reason="not needed")
        self.assertEqual(r, {"mandate": m2, "status": "cancelled", "interrupted": None})
        recs = self.archived(m2)
        self.assertEqual([r["op"] for r in recs],
                         ["mandate", "plan_commit", "operator", "plan_finalize"])
        self.release(f1)
        self.d.wait_log("mandate %s done" % m1)
        self.assertNotIn("%s observe_001: started" % m2, self.d.log())
        self.assertEqual(self.mandate(m2)["status"], "cancelled")


class TestStopAndCrash(ExecCase):
    def test_graceful_stop_then_review_and_retry(self):
        # attempt 1 hangs (until killed at shutdown); attempt 2 finishes
        h = self.script("long.sh", 'echo "$KAIROS_ATTEMPT $KAIROS_IDEM_KEY" >> "$1"\n'
                        'cat > /dev/null\n'
                        '[ "$KAIROS_ATTEMPT" = 1 ] && exec sleep 600\n'
                        'echo \'"second time"\'\n')
        runs = os.path.join(self.out, "runs")
        # observe changes the world (Effects=) and nothing else tells whether
        # it did: the step a stop killed waits for a human
        self.configure({"long": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                 "Exec": {"Observe": "/bin/sh %s %s" % (h, runs),
                                          "Effects": "observe"}}})
        self.start()
        m = self.fire("long")
        self.d.wait_log("%s observe_001: started" % m)
        t0 = time.monotonic()
        self.assertEqual(self.d.stop(signal.SIGTERM), 0, self.d.log()[-3000:])
        self.assertLess(time.monotonic() - t0, 10, "GracefulTimeoutSec=1, then killed")
        self.notify.wait_for(lambda msg: "STOPPING=1" in msg)
        self.assertIn("still running after GracefulTimeoutSec=1: killed", self.d.log())
        recs = read_records(self.wal_path(m))
        last = recs[-1]
        self.assertEqual((last["op"], last["step_id"], last["status"], last["reason"]),
                         ("transition", "observe_001", "needs_review", "killed_at_shutdown"))
        self.assertEqual(self.step_records(recs, "orient_001"), [])

        self.start()
        row = self.mandate(m)
        self.assertEqual((row["status"], row["review_step"]), ("paused_review", "observe_001"))
        out = self.ctl("resolve", m, "observe_001", "--retry", "--reason", "the sleep did nothing")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.d.wait_log("mandate %s done" % m)
        with open(runs) as f:
            self.assertEqual(f.read().splitlines(),
                             ["1 %s/observe_001" % m, "2 %s/observe_001" % m])
        self.assertIn("%s observe_001: started /bin/sh %s %s (pid " % (m, h, runs), self.d.log())
        self.assertRegex(self.d.log(), r"%s observe_001: started .*attempt 2\)" % m)
        rec = self.last_status(self.archived(m), "observe_001")
        self.assertEqual((rec["status"], rec["result"]), ("completed", "second time"))

    def test_no_handler_outlives_kill_9(self):
        h = self.script("sleeper.sh", 'echo $$ > "$1"\nexec sleep 600\n')
        pidfile = self.fifo("handlerpid")
        self.configure({"sleepy": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                   "Exec": {"Observe": "/bin/sh %s %s" % (h, pidfile),
                                            # an effectful phase: the WAL alone decides
                                            "Effects": "observe"}}})
        self.start()
        m = self.fire("sleepy")
        line = self.d.wait_log("%s observe_001: started" % m)
        pid = int(re.search(r"\(pid (\d+), attempt 1\)", line).group(1))
        with open(pidfile) as f:  # blocks until the handler has written it
            handler = int(f.read().strip())
        self.assertTrue(alive(pid) and alive(handler), "the handler runs")
        self.d.kill()  # SIGKILL: no chance to clean up
        # There is no event to wait on for the death of an unrelated process
        # (it is not our child, so no waitpid, and pidfd_open would need
        # Python 3.9 + a kernel that has it): poll /proc with a bounded
        # deadline.  PDEATHSIG kills it at once, so this takes milliseconds.
        # The handler wrote its own pid into the FIFO (read before the kill):
        # the runner execs the handler itself, so it is the pid kairosd logged.
        deadline = time.monotonic() + 10
        while (alive(pid) or alive(handler)) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(pid, handler, "no process between kairosd and the handler")
        self.assertFalse(alive(pid), "handler %d outlived kairosd" % pid)
        self.assertFalse(alive(handler), "handler %d outlived kairosd" % handler)
        # after the restart, recovery sees an interrupted step
        self.start()
        row = self.mandate(m)
        self.assertEqual((row["status"], row["review_step"]), ("paused_review", "observe_001"))
        self.assertIn("interrupted_during_execution", row["reason"])

    def test_a_run_open_when_the_loop_ends_is_closed(self):
        # KAIROS_TEST_RUNNER_HOLD (-Dtest_hooks=true): the runner's thread
        # holds the handler's spawn until kairosd stops (a clone that never
        # returns).  The stop waits for its start report, then its backstop
        # (GracefulTimeoutSec= + 30 s) ends the loop with the run open: it
        # is closed with a warning and freed (under ASan it leaked: exit 1),
        # and the step is left for the next start
        held = os.path.join(self.out, "held")
        self.configure({"held": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                 "Exec": {"Observe": "true"}}})
        d = self.start(env={"KAIROS_TEST_RUNNER_HOLD": held})
        m = self.fire("held")
        # (the hook says so by a file: no event to wait on, poll with a deadline)
        deadline = time.monotonic() + 10
        while not os.path.exists(held) and time.monotonic() < deadline:
            time.sleep(0.005)
        self.assertTrue(os.path.exists(held), d.log()[-3000:])
        self.assertEqual(d.stop(signal.SIGTERM, timeout=90), 0, d.log()[-3000:])
        log = d.log()
        self.assertIn("stop timed out", log)
        self.assertIn("stopping: 1 handler not started", log)
        self.assertIn("%s observe_001: the handler's run was still open when the loop ended: "
                      "closed" % m, log)

    def test_a_stuck_keeper_is_killed_at_stop(self):
        # KAIROS_TEST_KEEPER_STALL (-Dtest_hooks=true): the keeper never exits
        # once kairosd closes its socket.  kairosd's stop waits for it a
        # bounded time (5 s), then kills it and says so: it neither hangs
        # nor leaves the keeper behind
        self.configure({"idle": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                 "Exec": {"Observe": "true"}}})
        d = self.start(env={"KAIROS_TEST_KEEPER_STALL": "1"})
        keepers = named_keepers(d.proc.pid)
        self.assertEqual(len(keepers), 1, [(p, comm(p)) for p in children(d.proc.pid)])
        t0 = time.monotonic()
        self.assertEqual(d.stop(signal.SIGTERM, timeout=30), 0, d.log()[-3000:])
        self.assertLess(time.monotonic() - t0, 15)
        self.assertIn("the handler keeper (pid %d) did not exit within 5000 ms of its socket's "
                      "close: killed" % keepers[0], d.log())
        self.assertFalse(alive(keepers[0]), "the keeper %d outlived kairosd" % keepers[0])

    def test_keeper_killed_is_replaced(self):
        # someone kills the keeper: handlers still start, a new keeper takes
        # over, and a kill -9 of kairosd still takes the handler's children
        fifo = self.fifo("childpid")
        h = self.script("parent.sh", 'sleep 600 &\necho $! > "$1"\nwait\n')
        self.configure({"sleepy": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                   "Exec": {"Observe": "/bin/sh %s %s" % (h, fifo)}}})
        d = self.start()
        keepers = named_keepers(d.proc.pid)
        self.assertEqual(len(keepers), 1, [(p, comm(p)) for p in children(d.proc.pid)])
        os.kill(keepers[0], signal.SIGKILL)
        self.d.wait_log("the handler keeper (pid %d) died (signal 9): starting another"
                        % keepers[0])
        self.fire("sleepy")
        with open(fifo) as f:
            pid = int(f.read())
        try:
            # the new keeper is forked before the handler's clone
            new = named_keepers(d.proc.pid)
            self.assertEqual(len(new), 1)
            self.assertNotEqual(new[0], keepers[0])
            self.d.kill()
            deadline = time.monotonic() + 5
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.01)
            self.assertFalse(alive(pid), "the handler's child %d outlived kairosd" % pid)
        finally:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)

    def test_keeper_started_again_holds_the_earlier_handlers(self):
        # The keeper is killed while a handler runs; the next spawn starts
        # another, which shares kairosd's table of handler groups: a kill -9
        # of kairosd then takes the children of the handler started before
        # it too, not only of the one started after.
        fifos = [self.fifo("childpid1"), self.fifo("childpid2")]
        h = self.script("parent.sh", 'sleep 600 &\necho $! > "$1"\nwait\n')
        self.configure({"sleepy%d" % i: {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                         "Exec": {"Observe": "/bin/sh %s %s" % (h, fifos[i])}}
                        for i in (0, 1)})
        d = self.start()
        pids = []
        try:
            self.fire("sleepy0")
            with open(fifos[0]) as f:
                pids.append(int(f.read()))
            keepers = named_keepers(d.proc.pid)
            self.assertEqual(len(keepers), 1, [(p, comm(p)) for p in children(d.proc.pid)])
            os.kill(keepers[0], signal.SIGKILL)
            self.d.wait_log("the handler keeper (pid %d) died (signal 9): starting another"
                            % keepers[0])
            self.fire("sleepy1")
            with open(fifos[1]) as f:
                pids.append(int(f.read()))
            self.d.kill()
            # polling /proc with a bounded deadline: see test_no_handler_outlives_kill_9
            deadline = time.monotonic() + 5
            while any(alive(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(0.01)
            self.assertEqual([p for p in pids if alive(p)], [],
                             "handlers' children outlived kairosd")
        finally:
            for p in pids:
                if alive(p):
                    os.kill(p, signal.SIGKILL)

    # The keeper (runner.h) holds the handlers' process groups: when kairosd
    # dies it kills them, so not even a child of the handler goes on after a
    # crash (the handler itself dies of PR_SET_PDEATHSIG).
    def test_no_handler_child_outlives_kill_9(self):
        fifo = self.fifo("childpid")
        h = self.script("parent.sh", 'sleep 600 &\necho $! > "$1"\nwait\n')
        self.configure({"sleepy": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                   "Exec": {"Observe": "/bin/sh %s %s" % (h, fifo)}}})
        self.start()
        self.fire("sleepy")
        with open(fifo) as f:  # blocks until the handler wrote its child's pid
            pid = int(f.read())
        try:
            self.assertTrue(alive(pid))
            self.d.kill()
            # polling /proc with a bounded deadline: see test_no_handler_outlives_kill_9
            deadline = time.monotonic() + 5
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.01)
            self.assertFalse(alive(pid), "the handler's child %d outlived kairosd" % pid)
        finally:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)  # the test's own leftover


def caught_signals(pid):
    """The signals pid has a handler for (SigCgt of /proc/PID/status)."""
    with open("/proc/%d/status" % pid) as f:
        mask = int([ln.split()[1] for ln in f if ln.startswith("SigCgt:")][0], 16)
    return {sig for sig in range(1, 65) if mask & (1 << (sig - 1))}


class TestChildExit(ExecCase):
    """A handler's exit is read from its pidfd (clone3's CLONE_PIDFD) on the
    loop, the keeper's from its own: kairosd leaves SIGCHLD at its default
    (no thread woken, no signal pipe), and catches it only once a child has
    no pidfd (clone without clone3)."""

    def run_two(self, env=None, sigchld_ignored=False):
        ok = self.script("ok.sh", "echo '{\"n\": 1}'\n")
        bad = self.script("bad.sh", "exit 3\n")
        self.configure({"ok": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                               "Exec": {p: "/bin/sh " + ok for p in
                                        ("Observe", "Orient", "Decide", "Act", "Reflect")}},
                        "bad": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                "Exec": {"Observe": "/bin/sh " + bad}}})
        old = signal.signal(signal.SIGCHLD, signal.SIG_IGN if sigchld_ignored else signal.SIG_DFL)
        try:
            d = self.start(env=env)
        finally:
            signal.signal(signal.SIGCHLD, old)
        m = self.fire("ok")
        self.d.wait_log("mandate %s done" % m)
        self.assertEqual(self.last_status(self.archived(m), "reflect_001")["result"], {"n": 1})
        b = self.fire("bad")
        self.d.wait_log("mandate %s failed after" % b)
        rec = self.last_status(self.archived(b), "observe_001")
        self.assertEqual((rec["error_class"], rec["error_msg"]), ("exit_status", "exit status 3"))
        return d

    def test_sigchld_not_caught(self):
        d = self.run_two()
        self.assertNotIn(signal.SIGCHLD, caught_signals(d.proc.pid))

    def test_sigchld_ignored_by_the_parent(self):
        # an ignored SIGCHLD (inherited) would have the kernel reap the
        # handlers: kairosd sets it back to its default
        d = self.run_two(sigchld_ignored=True)
        self.assertNotIn(signal.SIGCHLD, caught_signals(d.proc.pid))

    def test_without_clone3_by_sigchld(self):
        # KAIROS_TEST_NO_CLONE3 (-Dtest_hooks=true): spawned as on a kernel
        # without clone3
        d = self.run_two(env={"KAIROS_TEST_NO_CLONE3": "1"})
        self.assertIn(signal.SIGCHLD, caught_signals(d.proc.pid))


class TestSpawnFds(ExecCase):
    """A handler whose pipes have low numbers (below 64: a daemon running a
    few) takes them directly in its own descriptor table: the runner's
    thread makes no dup3 into its slots and back (six per spawn)."""

    def dup3_per_spawn(self, env):
        if not shutil.which("strace"):
            self.skipTest("strace not installed")
        self.configure({"s": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                              "Exec": {p: "/bin/true" for p in
                                       ("Observe", "Orient", "Decide", "Act", "Reflect")}}})
        d = self.start(env=env)
        tids = os.listdir("/proc/%d/task" % d.proc.pid)
        out = os.path.join(self.dir, "dup3.strace")
        # its threads only, not the handlers (their own dup2 before exec)
        st = subprocess.Popen(["strace", "-qq", "-e", "trace=dup3", "-o", out] +
                              sum((["-p", t] for t in tids), []),
                              stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 30
            while len(attached(d.proc.pid, st.pid)) < len(tids):
                self.assertLess(time.monotonic(), deadline, "strace did not attach")
                time.sleep(0.02)  # polling /proc for the tracer, with a deadline
            m = self.fire("s")
            self.d.wait_log("mandate %s done" % m)
        finally:
            st.send_signal(signal.SIGINT)
            st.communicate(timeout=30)
        self.assertEqual(self.mandate(m)["status"], "done")
        with open(out) as f:
            return sum(1 for line in f if "dup3(" in line) / 5

    def test_low_pipes_taken_directly(self):
        self.assertEqual(self.dup3_per_spawn(None), 0)

    def test_through_the_slots(self):
        # KAIROS_TEST_RUNNER_DIRECT_FDS=0: always the slots
        self.assertEqual(self.dup3_per_spawn({"KAIROS_TEST_RUNNER_DIRECT_FDS": "0"}), 6)


def attached(pid, tracer):
    """pid's threads that tracer (strace -p) has attached (TracerPid)."""
    out = []
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/status" % (pid, tid)) as f:
                if "TracerPid:\t%d\n" % tracer in f.read():
                    out.append(tid)
        except OSError:
            pass
    return out


class TestQuietStart(ExecCase):
    """A handler's start is reported to the loop with its exit when that
    comes soon (the runner's thread writes its stdin and puts its pidfd in
    the loop's epoll set): one wake of the loop, not one for the start and
    one for the end.  KAIROS_TEST_QUIET_MS stretches "soon" (5 ms)."""

    def one(self, body, env=None):
        end = os.path.join(self.dir, "end")
        h = self.script("h.sh", body.replace("END", end))
        self.configure({"q": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                              "Exec": {"Observe": "/bin/sh " + h}}})
        self.start(env=env)
        m = self.fire("q")
        self.d.wait_log("%s observe_001: started" % m)
        ended = os.path.exists(end)
        self.d.wait_log("mandate %s done" % m)
        self.assertEqual(self.last_status(self.archived(m), "observe_001")["result"], {"in": "ok"})
        return ended

    # its stdin (written by the runner's thread), its output and its exit
    BODY = ("read -r line; sleep %s; touch END\n"
            "case $line in *observe_001*) echo '{\"in\": \"ok\"}';; esac\n")

    def test_reported_with_its_exit(self):
        self.assertTrue(self.one(self.BODY % "0.3", env={"KAIROS_TEST_QUIET_MS": "60000"}),
                        "the start was reported before the handler ended")

    def test_a_slow_one_reported_before_it_ends(self):
        self.assertFalse(self.one(self.BODY % "2"), "reported only when the handler ended")

    def test_a_tool_call_has_it_reported(self):
        # the tool call waits for the start's report: it is asked for, not
        # left until the handler ends (which waits for the call)
        body = ('"$KAIROSCTL" tool run --key "k-$KAIROS_IDEM_KEY" -- true || exit 9\n' +
                self.BODY % "0")
        self.assertFalse(self.one(body, env={"KAIROS_TEST_QUIET_MS": "60000"}))


class TestJobThreads(ExecCase):
    """serialq's jobs (WAL appends and flushes) run on threads of its own
    (kairosd-jobs), as many as libuv's pool would have: UV_THREADPOOL_SIZE,
    which kairosd sets to 16 unless it is set."""

    def names(self, pid):
        out = []
        for tid in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                out.append(f.read().strip())
        return out

    def run_one(self, env=None):
        self.configure({"one": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                "Exec": {"Observe": "/bin/true"}}})
        d = self.start(env=env)
        m = self.fire("one")
        self.d.wait_log("mandate %s done" % m)
        return self.names(d.proc.pid).count("kairosd-jobs")

    def test_sixteen_by_default(self):
        saved = os.environ.pop("UV_THREADPOOL_SIZE", None)
        try:
            self.assertEqual(self.run_one(), 16)
        finally:
            if saved is not None:
                os.environ["UV_THREADPOOL_SIZE"] = saved

    def test_as_libuv_is_told(self):
        self.assertEqual(self.run_one(env={"UV_THREADPOOL_SIZE": "2"}), 2)

    def test_runner_thread_named(self):
        # the thread that clones the handlers names itself: a step's
        # handoffs (loop, jobs, runner) told apart by perf and top -H
        # (the handler it started has run: the thread is past its start)
        self.configure({"one": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                "Exec": {"Observe": "/bin/true"}}})
        d = self.start()
        m = self.fire("one")
        self.d.wait_log("mandate %s done" % m)
        names = self.names(d.proc.pid)
        self.assertEqual(names.count("kairosd-runner"), 1, names)
        self.assertEqual(names.count("kairosd"), 1, names)  # the loop

    def switches(self, pid):
        """voluntary context switches of each kairosd-jobs thread"""
        out = {}
        for tid in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                    if f.read().strip() != "kairosd-jobs":
                        continue
                with open("/proc/%d/task/%s/status" % (pid, tid)) as f:
                    for line in f:
                        if line.startswith("voluntary_ctxt_switches:"):
                            out[tid] = int(line.split()[1])
            except OSError:
                pass
        return out

    def test_the_last_idle_runs_the_next(self):
        # one mandate at a time: each job waits for the one before it, so
        # the thread that went idle last (its stack and heap warm) takes
        # the next; a condition woke the 16 in turn
        self.configure({"five": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"},
                                 "Exec": {p: "/bin/true" for p in
                                          ("Observe", "Orient", "Decide", "Act", "Reflect")}}})
        d = self.start(env={"UV_THREADPOOL_SIZE": "16"})
        m = self.fire("five", at="2025-01-01T00:00:00Z")
        self.d.wait_log("mandate %s done" % m)
        before = self.switches(d.proc.pid)
        self.assertEqual(len(before), 16)
        for i in range(1, 5):
            m = self.fire("five", at="2025-01-0%dT00:00:00Z" % (i + 1))
            self.d.wait_log("mandate %s done" % m)
        after = self.switches(d.proc.pid)
        used = [t for t in before if after.get(t, 0) > before[t]]
        # one, or a few when a job is handed out while its queue's last is
        # still on its way back (never the sixteen)
        self.assertLessEqual(len(used), 6, (before, after))


def children(pid):
    """The pids whose parent is pid."""
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open("/proc/%s/stat" % p) as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(p))
            except (OSError, IndexError, ValueError):
                pass
    return out


def comm(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return None


def message(line, prefix):
    """The text of a log line after prefix, without the journal fields that
    are appended to it outside the journal."""
    text = line.split(prefix, 1)[1].rstrip("\n")
    return re.sub(r" MANDATE_ID=\S+ STEP_ID=\S+$", "", text)


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def named_keepers(pid):
    """kairosd's keepers: each names itself (PR_SET_NAME) on its own time,
    so there is no event to wait on: /proc polled, with a deadline."""
    deadline = time.monotonic() + 10
    while True:
        keepers = [p for p in children(pid) if comm(p) == "kairosd-keeper"]
        if keepers or time.monotonic() > deadline:
            return keepers
        time.sleep(0.01)


def alive(pid):
    """Running (a zombie no longer runs; a container's init may be slow to reap it)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


if __name__ == "__main__":
    unittest.main(verbosity=2)
