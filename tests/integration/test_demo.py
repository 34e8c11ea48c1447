# SPDX-License-Identifier: MIT
"""The built-in demo (config/demo.sh and the handlers in config/examples/):
start it with a built kairosd (KAIROSD= skips installing and building), fire
the demo schedule, wait for the mandate to finish, check list/show and the
outbox (one report per act step, written once), fire the same time again (a
no-op); the handler scripts on their own; the example configuration files."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kairos_harness  # noqa: E402
from kairos_harness import KAIROSCTL, KAIROSD, Daemon, NotifySocket  # noqa: E402

SRC = os.path.abspath(os.path.join(HERE, "..", ".."))
DEMO_SH = os.path.join(SRC, "config", "demo.sh")
EXAMPLES = os.path.join(SRC, "config", "examples")
PHASES = ("observe", "orient", "decide", "act", "reflect")


class DemoDaemon(Daemon):
    """kairosd started through config/demo.sh (which execs it): the same
    log reader and stop() as the harness's Daemon."""

    def __init__(self, cwd, notify, demo_dir=None):
        e = dict(os.environ)
        for k in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "JOURNAL_STREAM", "KAIROS_DEMO_DIR"):
            e.pop(k, None)
        e["KAIROSD"] = os.path.abspath(KAIROSD)
        e["NOTIFY_SOCKET"] = notify.path
        if demo_dir is not None:
            e["KAIROS_DEMO_DIR"] = demo_dir
        self.state_dir = os.path.join(cwd, demo_dir or "demo-state")
        self.proc = subprocess.Popen(["bash", DEMO_SH], cwd=cwd, env=e,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.lines = []
        self.cond = threading.Condition()
        self.reader = threading.Thread(target=self._read_stderr, daemon=True)
        self.reader.start()


def ctl(sock, *args, check=True):
    p = subprocess.run([KAIROSCTL, "--socket", sock] + list(args), capture_output=True,
                       text=True, timeout=60)
    if check and p.returncode != 0:
        raise AssertionError("kairosctl %s: exit %d\n%s%s" % (args, p.returncode, p.stdout, p.stderr))
    return p


def ctl_json(sock, *args):
    return json.loads(ctl(sock, "--json", *args).stdout)


def outbox_state(outbox):
    """{name: (content, mtime_ns)} of every entry, dot files included."""
    out = {}
    for name in sorted(os.listdir(outbox)):
        p = os.path.join(outbox, name)
        with open(p) as f:
            out[name] = (f.read(), os.stat(p).st_mtime_ns)
    return out


class TestDemo(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-demo-")
        self.notify = NotifySocket(self.dir)
        self.d = None

    def tearDown(self):
        if self.d is not None:
            if self.d.proc.poll() is None:
                self.assertEqual(self.d.stop(), 0, self.d.log()[-3000:])
            else:
                self.d.kill()
            self.d.proc.stderr.close()
        self.notify.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_fire_list_show_outbox_and_refire(self):
        # Default demo directory: ./demo-state under the current directory.
        self.d = DemoDaemon(self.dir, self.notify)
        self.notify.wait_ready()
        demo = os.path.join(self.dir, "demo-state")
        sock = os.path.join(demo, "control.sock")
        self.d.wait_log("kairos demo: configuration in %s" % demo)
        with open(os.path.join(demo, "kairosd.conf")) as f:
            conf = f.read()
        self.assertIn("StateDirectory=%s/state\n" % demo, conf)
        self.assertIn("ControlSocket=%s\n" % sock, conf)
        self.assertTrue(os.path.isdir(os.path.join(demo, "state", "wal")))

        fired = ctl_json(sock, "fire", "demo")
        self.assertTrue(fired["fired"], fired)
        m = fired["mandate"]
        self.assertRegex(m, r"^mnd_plan_[0-9a-f]{12}$")
        self.assertEqual(fired["schedule"], "demo")
        done = self.d.wait_log("mandate %s done" % m, timeout=120)
        self.assertIn("after 2 cycles (reflect said done)", done)

        lst = ctl(sock, "list").stdout
        self.assertRegex(lst.splitlines()[0], r"^ID +SCHEDULE +FIRED AT +STATUS +CYCLE ")
        row = [line for line in lst.splitlines() if line.startswith(m)]
        self.assertEqual(len(row), 1, lst)
        self.assertEqual(row[0].split()[1:5], ["demo", fired["fired_at"], "done", "2"], lst)

        show = ctl_json(sock, "show", m)
        self.assertEqual(show["status"], "done", show)
        self.assertEqual([p["cycle"] for p in show["plans"]], [1, 2], show)
        acts = []
        for p in show["plans"]:
            self.assertEqual((p["finalized"], p["status"]), (True, "succeeded"), p)
            steps = {s["step_id"]: s for s in p["steps"]}
            for ph in PHASES:
                s = steps["%s_%03d" % (ph, p["cycle"])]
                self.assertEqual((s["status"], s["executions"]), ("completed", 1), s)
            act = steps["act_%03d" % p["cycle"]]
            acts.append(act)
            # the later phases saw the earlier results
            self.assertEqual(steps["orient_%03d" % p["cycle"]]["result"]["reports"], p["cycle"] - 1)
            self.assertEqual(steps["decide_%03d" % p["cycle"]]["result"]["action"], "write_report")
        self.assertEqual(show["plans"][0]["steps"][4]["result"], {"missing": 1})
        self.assertEqual(show["plans"][1]["steps"][4]["result"]["kairos"], {"done": True})
        text = ctl(sock, "show", m).stdout
        self.assertIn("status:    done", text)
        self.assertRegex(text, r"act_002 +completed +1 ")

        # One report per act step, named after its idem key, no leftovers.
        outbox = os.path.join(demo, "outbox")
        before = outbox_state(outbox)
        names = [a["idem_key"].replace("/", "_") for a in acts]
        self.assertEqual(sorted(before), sorted(names))
        for a, name in zip(acts, names):
            self.assertEqual(a["result"], {"wrote": name})
            rep = json.loads(before[name][0])
            self.assertEqual((rep["idem_key"], rep["mandate"], rep["fired_at"]),
                             (a["idem_key"], m, fired["fired_at"]))
            # written by kairosd (kairosctl tool write), once per idem key
            entry = ctl_json(sock, "idem", "get", "kairos.write:" + a["idem_key"])
            self.assertEqual(entry["state"], "completed", entry)
            self.assertEqual(entry["result"]["path"], os.path.join(os.path.realpath(outbox), name))

        # The same time again: nothing to do, nothing runs, the outbox is as it was.
        starts = self.d.log().count(": started ")
        again = ctl_json(sock, "fire", "demo", "--at", fired["fired_at"])
        self.assertEqual((again["fired"], again["mandate"]), (False, m), again)
        self.assertIn("already fired", again.get("message", ""))
        self.assertEqual(ctl_json(sock, "show", m)["status"], "done")
        self.assertEqual(outbox_state(outbox), before)
        self.assertEqual(self.d.log().count(": started "), starts)

    def test_crash_in_act_recovers_by_itself(self):
        """The demo's act writes only through kairosctl tool write and the
        demo declares EffectsVia=kairosctl: kairosd killed (SIGKILL) in act,
        after its write, runs act again by itself at the next start and the
        report is not written twice.  A kairosctl wrapper holds act there."""
        mark = os.path.join(self.dir, "act-held")
        wrapper = os.path.join(self.dir, "kairosctl-wrapper")
        with open(wrapper, "w") as f:
            f.write('#!/bin/sh\n"%s" "$@"; rc=$?\n'
                    'if [ "$KAIROS_PHASE" = act ] && [ "$KAIROS_ATTEMPT" = 1 ] && '
                    '[ "$KAIROS_CYCLE" = 1 ]; then\n'
                    '  ps -o pgid= $$ | tr -d " " > "%s.pgid"; touch "%s"; exec sleep 600\n'
                    'fi\nexit $rc\n' % (os.path.abspath(KAIROSCTL), mark, mark))
        os.chmod(wrapper, 0o755)
        saved = os.environ.get("KAIROSCTL")
        os.environ["KAIROSCTL"] = wrapper
        try:
            self.d = DemoDaemon(self.dir, self.notify)
        finally:
            if saved is None:
                os.environ.pop("KAIROSCTL")
            else:
                os.environ["KAIROSCTL"] = saved
        self.notify.wait_ready()
        demo = os.path.join(self.dir, "demo-state")
        sock = os.path.join(demo, "control.sock")
        with open(os.path.join(demo, "schedules.d", "demo.conf")) as f:
            self.assertIn("\nEffectsVia=kairosctl\n", f.read())
        m = ctl_json(sock, "fire", "demo")["mandate"]
        deadline = time.monotonic() + 120
        while not os.path.exists(mark):  # polling a condition with a deadline
            self.assertLess(time.monotonic(), deadline, self.d.log()[-3000:])
            self.assertIsNone(self.d.proc.poll(), self.d.log()[-3000:])
            time.sleep(0.02)
        self.d.kill()
        self.d.proc.stderr.close()
        with open(mark + ".pgid") as f:
            try:
                os.killpg(int(f.read().strip()), signal.SIGKILL)
            except ProcessLookupError:
                pass
        outbox = os.path.join(demo, "outbox")
        written = outbox_state(outbox)
        self.assertEqual(len(written), 1, written)

        self.notify.clear()
        self.d = DemoDaemon(self.dir, self.notify)
        self.notify.wait_ready()
        line = self.d.wait_log("recovery: %s act_001:" % m)
        self.assertIn("safe_to_retry (effects_journaled)", line)
        self.d.wait_log("mandate %s done" % m, timeout=120)
        show = ctl_json(sock, "show", m)
        act = [s for p in show["plans"] for s in p["steps"] if s["step_id"] == "act_001"][0]
        self.assertEqual((act["status"], act["executions"]), ("completed", 2), act)
        self.assertEqual([(c["tool"], c["state"], c["attempt"]) for c in act["tool_calls"]],
                         [("kairos.write", "completed", 1)], act)
        after = outbox_state(outbox)
        # the first report untouched, the second cycle's added
        name = list(written)[0]
        self.assertEqual(after[name], written[name])
        self.assertEqual(len(after), 2, after)

    def test_demo_dir_from_environment(self):
        # A relative KAIROS_DEMO_DIR is made absolute; nothing is written elsewhere.
        self.d = DemoDaemon(self.dir, self.notify, demo_dir="x/my demo")
        self.notify.wait_ready()
        demo = os.path.join(self.dir, "x", "my demo")
        with open(os.path.join(demo, "kairosd.conf")) as f:
            conf = f.read()
        self.assertIn("StateDirectory=%s/state\n" % demo, conf)
        self.assertIn("ControlSocket=%s/control.sock\n" % demo, conf)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "demo-state")))
        st = ctl_json(os.path.join(demo, "control.sock"), "status")
        self.assertIsInstance(st, dict)
        fired = ctl_json(os.path.join(demo, "control.sock"), "fire", "demo")
        self.d.wait_log("mandate %s done" % fired["mandate"], timeout=120)
        self.assertEqual(len(os.listdir(os.path.join(demo, "outbox"))), 2)
        # WriteRoots= cannot name a directory with a blank: the act handler
        # wrote directly, not through kairosd
        self.assertNotIn("WriteRoots=", conf)
        st = ctl_json(os.path.join(demo, "control.sock"), "idem", "stats")
        self.assertEqual(st["size"], 0, st)


def run_handler(phase, doc, env, cwd):
    e = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    e.update(env)
    p = subprocess.run([os.path.join(EXAMPLES, phase + ".sh")], input=json.dumps(doc),
                       capture_output=True, text=True, cwd=cwd, env=e, timeout=30)
    if p.returncode != 0:
        raise AssertionError("%s.sh: exit %d: %s" % (phase, p.returncode, p.stderr))
    return json.loads(p.stdout)


class TestHandlers(unittest.TestCase):
    """The example handlers on their own, fed documents like kairosd's."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-demo-h-")
        self.outbox = os.path.join(self.dir, "outbox")
        self.env = {"DEMO_OUTBOX": self.outbox, "KAIROS_MANDATE_ID": "mnd_t",
                    "KAIROS_CYCLE": "1", "KAIROS_IDEM_KEY": "mnd_t/act_001",
                    "KAIROS_FIRED_AT": "2026-04-20T12:00:00Z"}

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def doc(self, results, cycle=1):
        return {"mandate": {"id": "mnd_t"}, "plan": {"cycle": cycle}, "results": results,
                "previous_reflect": None}

    def test_cycle_chain(self):
        obs = run_handler("observe", self.doc({}), self.env, self.dir)
        self.assertEqual((obs["cycle"], obs["reports"]), (1, 0))
        ori = run_handler("orient", self.doc({"observe": obs}), self.env, self.dir)
        self.assertEqual(ori["missing"], 2)
        dec = run_handler("decide", self.doc({"observe": obs, "orient": ori}), self.env, self.dir)
        self.assertEqual(dec["action"], "write_report")
        act = run_handler("act", self.doc({"orient": ori, "decide": dec}), self.env, self.dir)
        self.assertEqual(act, {"wrote": "mnd_t_act_001"})
        ref = run_handler("reflect", self.doc({"orient": ori, "decide": dec, "act": act}),
                          self.env, self.dir)
        self.assertEqual(ref, {"missing": 1})  # not done yet: one report missing
        # observe counts this mandate's reports only
        with open(os.path.join(self.outbox, "mnd_other_act_001"), "w") as f:
            f.write("{}")
        obs = run_handler("observe", self.doc({}), self.env, self.dir)
        self.assertEqual(obs["reports"], 1)
        ori = run_handler("orient", self.doc({"observe": obs}), self.env, self.dir)
        self.assertEqual(ori["missing"], 1)

    def test_act_is_idempotent_by_key(self):
        dec = {"action": "write_report", "missing": 2}
        first = run_handler("act", self.doc({"decide": dec}), self.env, self.dir)
        self.assertEqual(first, {"wrote": "mnd_t_act_001"})
        path = os.path.join(self.outbox, "mnd_t_act_001")
        with open(path) as f:
            content = f.read()
        self.assertEqual(json.loads(content)["idem_key"], "mnd_t/act_001")
        mtime = os.stat(path).st_mtime_ns
        # a retry with the same key (KAIROS_ATTEMPT 2) writes nothing
        again = run_handler("act", self.doc({"decide": dec}), dict(self.env, KAIROS_ATTEMPT="2"),
                            self.dir)
        self.assertEqual(again, {"already_written": "mnd_t_act_001"})
        with open(path) as f:
            self.assertEqual(f.read(), content)
        self.assertEqual(os.stat(path).st_mtime_ns, mtime)
        self.assertEqual(os.listdir(self.outbox), ["mnd_t_act_001"])  # no temporary left
        # nothing to do: no file
        none = run_handler("act", self.doc({"decide": {"action": "none", "missing": 0}}),
                           dict(self.env, KAIROS_IDEM_KEY="mnd_t/act_002"), self.dir)
        self.assertEqual(none, {"action": "none"})
        self.assertEqual(os.listdir(self.outbox), ["mnd_t_act_001"])

    def test_reflect_done(self):
        wrote = {"wrote": "x"}
        r = run_handler("reflect", self.doc({"orient": {"missing": 1}, "act": wrote}),
                        self.env, self.dir)
        self.assertEqual(r["kairos"], {"done": True})  # the work is done
        r = run_handler("reflect", self.doc({"orient": {"missing": 2}, "act": {"action": "none"}},
                                            cycle=2), dict(self.env, KAIROS_CYCLE="2"), self.dir)
        self.assertEqual(r["kairos"], {"done": True})  # after cycle 2
        r = run_handler("reflect", self.doc({"orient": {"missing": 2}, "act": wrote}),
                        self.env, self.dir)
        self.assertNotIn("kairos", r)


class TestExampleConfig(unittest.TestCase):
    """config/examples/kairosd.conf and demo.conf are valid as shipped and
    with every commented key uncommented, and name every key of the parser."""

    KEYS = {
        "kairosd.conf": ["StateDirectory", "ControlSocket", "SocketGroup",
                         "MaxConcurrentMandates", "GracefulTimeoutSec", "LogLevel", "TTLSec",
                         "MaxEntries", "WriteRoots", "OnReview", "OnFailure", "Backend"],
        "demo.conf": ["Cron", "TimeZone", "Enabled", "MissedPolicy", "MaxCatchUpRuns",
                      "StaleAfter", "MissedGraceSec", "Concurrency", "Goal", "MaxCycles",
                      "Observe", "Orient", "Decide", "Act", "Reflect",
                      "TimeoutSec", "Environment", "WorkingDirectory", "Probe", "OnReview",
                      "OnFailure"],
    }

    def check(self, transform):
        d = tempfile.mkdtemp(prefix="kairos-demo-conf-")
        try:
            os.makedirs(os.path.join(d, "schedules.d"))
            for name, dest in (("kairosd.conf", "kairosd.conf"),
                               ("demo.conf", os.path.join("schedules.d", "demo.conf"))):
                with open(os.path.join(EXAMPLES, name)) as f:
                    text = f.read()
                with open(os.path.join(d, dest), "w") as f:
                    f.write(transform(text))
            p = subprocess.run([KAIROSD, "--check-config", "-c", os.path.join(d, "kairosd.conf")],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            self.assertIn("demo: 0 6 * * * (UTC)", p.stdout)
        finally:
            shutil.rmtree(d)

    def test_valid_as_shipped(self):
        self.check(lambda t: t)

    def test_valid_with_every_key_uncommented(self):
        self.check(lambda t: re.sub(r"(?m)^#([A-Za-z]+=)", r"\1", t))

    def test_every_key_shown(self):
        for name, keys in self.KEYS.items():
            with open(os.path.join(EXAMPLES, name)) as f:
                text = f.read()
            for k in keys:
                self.assertRegex(text, r"(?m)^#?%s=" % k, "%s lacks %s=" % (name, k))
        # the [Cluster] keys that need Backend=postgres: in the example block
        # (not uncommentable one by one: with files they are errors)
        with open(os.path.join(EXAMPLES, "kairosd.conf")) as f:
            text = f.read()
        for k in ("Backend", "ConnectionString", "NodeName", "LeaseSec"):
            self.assertRegex(text, r"(?m)^#   %s=" % k, "kairosd.conf lacks #   %s=" % k)


if __name__ == "__main__":
    kairos_harness.KAIROSD = KAIROSD
    unittest.main(verbosity=2)
