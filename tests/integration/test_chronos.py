# SPDX-License-Identifier: MIT
"""Black-box tests of chronos, the scheduler of kairosd.

Everything runs on the fake clock of the test hooks (kairosd built with
-Dtest_hooks=true): KAIROS_TEST_CLOCK=<unix seconds> at start, then the
control command `test-clock` {now} steps it and evaluates at once, as a wall
clock step would.  No test waits for real minutes: they wait on log lines and
replies.  Without the hooks every test is skipped (exit code 77)."""
import calendar
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kairos_harness import Client, Daemon, NotifySocket, write_config  # noqa: E402

MARKER = "zz_marker"  # a disabled schedule, paused and resumed to sync the log
HOOKS = None          # None: not probed yet; else True/False


def T(iso):
    """'2026-04-01T10:30:00Z' -> unix seconds."""
    return calendar.timegm(time.strptime(iso, "%Y-%m-%dT%H:%M:%SZ"))


def iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def hourly(policy="skip", **extra):
    sched = {"Cron": "0 * * * *", "MissedPolicy": policy}
    sched.update(extra)
    return {"Schedule": sched, "Mandate": {"MaxCycles": "1"}}


FIRED_RE = re.compile(r"fired (\S+) at (\S+): mandate (\S+)")


def probe_hooks():
    """Does this kairosd have the test hooks?  Asks a throwaway daemon."""
    global HOOKS
    if HOOKS is not None:
        return HOOKS
    d = tempfile.mkdtemp(prefix="kairos-chronos-probe-")
    try:
        state = os.path.join(d, "state")
        notify = NotifySocket(d)
        daemon = Daemon(state, write_config(d, state), notify=notify,
                        env={"KAIROS_TEST_CLOCK": str(T("2026-04-01T00:00:00Z"))})
        try:
            notify.wait_ready()
            c = Client(daemon.socket_path)
            r = c.call("test-clock", now=T("2026-04-01T00:00:00Z"))
            c.close()
            if r["ok"]:
                HOOKS = True
            elif r["error"]["code"] == "unknown_command":
                HOOKS = False
            else:
                raise AssertionError("test-clock: unexpected reply %r" % r)
        finally:
            daemon.stop()
            daemon.proc.stderr.close()
            notify.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return HOOKS


class ChronosCase(unittest.TestCase):
    def setUp(self):
        if not probe_hooks():
            self.skipTest("kairosd was built without -Dtest_hooks=true: test-clock answers "
                          "unknown_command, the fake clock is not available")
        self.dir = tempfile.mkdtemp(prefix="kairos-chronos-")
        self.state = os.path.join(self.dir, "state")
        self.notify = NotifySocket(self.dir)
        self.daemon = None
        self.client = None
        self.syncs = 0
        self.config = None

    def tearDown(self):
        if self.client:
            self.client.close()
        if self.daemon and self.daemon.proc.poll() is None:
            self.assertEqual(self.daemon.stop(), 0, self.daemon.log()[-3000:])
        if self.daemon:
            self.daemon.proc.stderr.close()
        self.notify.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- helpers ----

    def configure(self, schedules, daemon_extra=""):
        """(Re)write kairosd.conf and schedules.d/ (files of schedules that
        are gone are removed); the marker schedule is always there."""
        sdir = os.path.join(self.dir, "schedules.d")
        if os.path.isdir(sdir):
            shutil.rmtree(sdir)
        all_schedules = dict(schedules)
        all_schedules[MARKER] = {"Schedule": {"Cron": "0 0 1 1 *", "Enabled": "no"}}
        self.config = write_config(self.dir, self.state, all_schedules, daemon_extra)

    def start(self, clock, schedules=None, daemon_extra=""):
        if schedules is not None:
            self.configure(schedules, daemon_extra)
        if self.client:
            self.client.close()
            self.client = None
        self.notify.clear()
        self.daemon = Daemon(self.state, self.config, notify=self.notify,
                             env={"KAIROS_TEST_CLOCK": str(T(clock))})
        self.notify.wait_ready()
        self.client = Client(self.daemon.socket_path)
        return self.daemon

    def stop(self):
        self.client.close()
        self.client = None
        self.assertEqual(self.daemon.stop(), 0, self.daemon.log()[-3000:])
        self.daemon.proc.stderr.close()

    def call(self, cmd, **args):
        return self.client.call(cmd, **args)

    def ok(self, cmd, **args):
        r = self.call(cmd, **args)
        self.assertTrue(r["ok"], r)
        return r["result"]

    def clock(self, when):
        self.assertEqual(self.ok("test-clock", now=T(when)), {"now": T(when)})

    def sync(self):
        """Every log line written before this call is in self.daemon.lines
        afterwards (the pause line comes after them on the same stderr)."""
        self.syncs += 1
        tag = "sync-%d" % self.syncs
        self.ok("pause", schedule=MARKER, reason=tag)
        self.daemon.wait_log("schedule %s paused: %s" % (MARKER, tag))
        self.ok("resume", schedule=MARKER)

    def fires(self, name):
        """[(fired_at, mandate)] of the mandates created for schedule name."""
        out = []
        for line in self.daemon.log().splitlines():
            m = FIRED_RE.search(line)
            if m and m.group(1) == name:
                out.append((m.group(2), m.group(3)))
        return out

    def fired_at(self, name):
        return [f for f, _ in self.fires(name)]

    def log_lines(self, text):
        return [line for line in self.daemon.log().splitlines() if text in line]

    def wait_count(self, text, n, timeout=30.0):
        """Wait until n log lines contain text."""
        deadline = time.monotonic() + timeout
        d = self.daemon
        with d.cond:
            while sum(1 for line in d.lines if line is not None and text in line) < n:
                left = deadline - time.monotonic()
                if left <= 0 or (d.lines and d.lines[-1] is None):
                    raise AssertionError("fewer than %d log lines with %r:\n%s"
                                         % (n, text, d.log()[-3000:]))
                d.cond.wait(left)

    def wait_done(self, mandates):
        for m in mandates:
            self.daemon.wait_log("mandate %s done" % m)

    def schedules(self):
        return {s["name"]: s for s in self.ok("schedules")["schedules"]}

    def wait_last(self, name, when, timeout=30.0):
        """LAST (last_fire_at) is set once the tick's mandate is durable:
        wait for it, with a deadline."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.schedules()[name]["last_fire_at"]
            if got == when:
                return
            if time.monotonic() > deadline:
                self.assertEqual(got, when, name)
            time.sleep(0.02)

    def mandates(self, schedule):
        return {m["id"]: m for m in self.ok("list")["mandates"] if m.get("schedule") == schedule}

    def chronos_json(self):
        with open(os.path.join(self.state, "chronos.json")) as f:
            doc = json.load(f)
        self.assertEqual(doc["version"], 1)
        return doc["schedules"]

    def make_gate(self):
        """A FIFO: a handler `cat GATE` blocks until release() is called."""
        path = os.path.join(self.dir, "gate")
        os.mkfifo(path)
        return path

    def release(self, gate):
        fd = os.open(gate, os.O_WRONLY)  # blocks until the handler has it open
        os.write(fd, b'{"released":true}\n')
        os.close(fd)


class FirstStart(ChronosCase):
    def test_first_start_does_not_fire_retroactively(self):
        # 10:00 is 30 s before the start: on time if chronos had seen the
        # schedule before, but a first sight never fires.
        self.start("2026-04-01T10:00:30Z", {
            "h": hourly("catch_up_once"),
            "m": {"Schedule": {"Cron": "* * * * *", "MissedPolicy": "catch_up_bounded"}},
        })
        self.sync()
        self.assertEqual(self.fired_at("h"), [])
        self.assertEqual(self.fired_at("m"), [])
        self.assertEqual(self.log_lines("missed tick"), [])
        s = self.schedules()
        self.assertEqual(s["h"]["next_fire_at"], "2026-04-01T11:00:00Z")
        self.assertIsNone(s["h"]["last_fire_at"])
        self.assertEqual(s["m"]["next_fire_at"], "2026-04-01T10:01:00Z")
        self.stop()
        st = self.chronos_json()
        self.assertEqual(st["h"], {"last_evaluated_at": "2026-04-01T10:00:30Z",
                                   "last_fire_at": None,
                                   "next_fire_at": "2026-04-01T11:00:00Z", "paused": False})
        self.assertEqual(st["m"]["next_fire_at"], "2026-04-01T10:01:00Z")
        # Known from now on: the next start evaluates from 10:00:30.
        self.start("2026-04-01T10:01:20Z")
        self.daemon.wait_log("schedule m: tick 2026-04-01T10:01:00Z fires")
        self.sync()
        self.assertEqual(self.fired_at("m"), ["2026-04-01T10:01:00Z"])
        self.assertEqual(self.fired_at("h"), [])

    def test_fake_clock_in_the_past_does_not_spin(self):
        # Regression: with a fake clock, the real timerfd was armed at
        # fake now + 1 year; in the past, it expired again and again (busy loop).
        self.start("2020-01-01T00:00:00Z", {"h": hourly()})
        self.sync()
        pid = self.daemon.proc.pid

        def cpu_ticks():
            with open("/proc/%d/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return int(fields[11]) + int(fields[12])

        def switches():
            with open("/proc/%d/status" % pid) as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        return int(line.split()[1])
            return 0

        c0, s0 = cpu_ticks(), switches()
        time.sleep(1.0)  # a measurement window, not a synchronization
        c1, s1 = cpu_ticks(), switches()
        hz = os.sysconf("SC_CLK_TCK")
        self.assertLess(c1 - c0, hz // 5, "kairosd used %d ticks of CPU in 1 s idle" % (c1 - c0))
        self.assertLess(s1 - s0, 50, "kairosd woke up %d times in 1 s idle" % (s1 - s0))


class MissedPolicies(ChronosCase):
    SCHEDULES = {
        "p_skip": hourly("skip"),
        "p_once": hourly("catch_up_once"),
        "p_bounded": hourly("catch_up_bounded", MaxCatchUpRuns="3", StaleAfter="48h"),
        "p_stale": hourly("catch_up_bounded", MaxCatchUpRuns="3", StaleAfter="24h"),
        "p_all": hourly("catch_up_bounded", MaxCatchUpRuns="40", StaleAfter="2d",
                        Concurrency="allow"),
    }

    def test_each_policy_after_a_30h_outage(self):
        self.start("2026-03-01T10:30:00Z", self.SCHEDULES)
        self.clock("2026-03-01T11:00:10Z")  # on time: every schedule fires 11:00
        for name in self.SCHEDULES:
            self.daemon.wait_log("schedule %s: tick 2026-03-01T11:00:00Z fires" % name)
        self.sync()
        first = {name: self.fires(name) for name in self.SCHEDULES}
        for name, f in first.items():
            self.assertEqual([a for a, _ in f], ["2026-03-01T11:00:00Z"], name)
        self.wait_done([f[0][1] for f in first.values()])
        self.clock("2026-03-01T11:30:00Z")
        self.stop()
        st = self.chronos_json()
        for name in self.SCHEDULES:
            self.assertEqual(st[name]["last_evaluated_at"], "2026-03-01T11:30:00Z")
            self.assertEqual(st[name]["last_fire_at"], "2026-03-01T11:00:00Z")

        # 30 hours later: ticks 2026-03-01T12:00 .. 2026-03-02T17:00 (30) were
        # missed; 17:00 is 30 min late, so none is on time.
        self.start("2026-03-02T17:30:00Z")
        since = "since 2026-03-01T11:30:00Z dropped"
        self.daemon.wait_log("schedule p_skip: 30 missed ticks %s (MissedPolicy=skip)" % since)
        self.daemon.wait_log("schedule p_once: 29 missed ticks %s (MissedPolicy=catch_up_once)"
                             % since)
        self.daemon.wait_log("schedule p_bounded: 27 missed ticks %s (MissedPolicy=catch_up_bounded)"
                             % since)
        self.daemon.wait_log("schedule p_stale: 29 missed ticks %s "
                             "(MissedPolicy=catch_up_bounded, stale)" % since)
        self.daemon.wait_log("schedule p_all: tick 2026-03-02T17:00:00Z fires (catch-up)")
        self.sync()
        self.assertEqual(self.fired_at("p_skip"), [])
        self.assertEqual(self.fired_at("p_once"), ["2026-03-02T17:00:00Z"])
        self.assertEqual(self.fired_at("p_bounded"), ["2026-03-02T15:00:00Z",
                                                      "2026-03-02T16:00:00Z",
                                                      "2026-03-02T17:00:00Z"])
        self.assertEqual(self.fired_at("p_stale"), ["2026-03-02T17:00:00Z"])
        all_missed = [iso(T("2026-03-01T12:00:00Z") + 3600 * i) for i in range(30)]
        self.assertEqual(self.fired_at("p_all"), all_missed)
        self.assertEqual([x for x in self.log_lines("schedule p_all: ") if "missed" in x], [])
        # Catch-up lines say so.
        lines = self.log_lines("schedule p_bounded: tick")
        self.assertEqual(len(lines), 3)
        for line in lines:
            self.assertIn("fires (catch-up)", line)
        # Distinct mandates, one per fired_at (plus the 11:00 one).
        for name in self.SCHEDULES:
            ids = [m for _, m in self.fires(name)]
            self.assertEqual(len(set(ids)), len(ids), name)
            self.assertNotIn(first[name][0][1], ids, name)
            listed = self.mandates(name)
            self.assertEqual(set(listed), set(ids) | {first[name][0][1]}, name)
        for name in ("p_once", "p_bounded", "p_stale", "p_all"):
            self.wait_last(name, "2026-03-02T17:00:00Z")
        s = self.schedules()
        self.assertEqual(s["p_skip"]["last_fire_at"], "2026-03-01T11:00:00Z")
        for name in self.SCHEDULES:
            self.assertEqual(s[name]["next_fire_at"], "2026-03-02T18:00:00Z", name)
        self.stop()
        st = self.chronos_json()
        self.assertEqual(st["p_skip"], {"last_evaluated_at": "2026-03-02T17:30:00Z",
                                        "last_fire_at": "2026-03-01T11:00:00Z",
                                        "next_fire_at": "2026-03-02T18:00:00Z",
                                        "paused": False,
                                        "skipped": {"count": 30, "more": False,
                                                    "first": "2026-03-01T12:00:00Z",
                                                    "last": "2026-03-02T17:00:00Z",
                                                    "reason": "MissedPolicy=skip"}})
        self.assertEqual(st["p_bounded"]["last_fire_at"], "2026-03-02T17:00:00Z")


class ClockSteps(ChronosCase):
    def test_step_forward(self):
        scheds = {
            "f_skip": hourly("skip"),
            "f_once": hourly("catch_up_once"),
            "f_bounded": hourly("catch_up_bounded", MaxCatchUpRuns="2"),
        }
        self.start("2026-04-01T10:30:00Z", scheds)
        self.clock("2026-04-01T15:30:00Z")  # 11:00 .. 15:00 missed
        since = "since 2026-04-01T10:30:00Z dropped"
        self.daemon.wait_log("schedule f_skip: 5 missed ticks %s (MissedPolicy=skip)" % since)
        self.daemon.wait_log("schedule f_once: 4 missed ticks %s" % since)
        self.daemon.wait_log("schedule f_bounded: 3 missed ticks %s" % since)
        self.sync()
        self.assertEqual(self.fired_at("f_skip"), [])
        self.assertEqual(self.fired_at("f_once"), ["2026-04-01T15:00:00Z"])
        self.assertEqual(self.fired_at("f_bounded"), ["2026-04-01T14:00:00Z",
                                                      "2026-04-01T15:00:00Z"])
        # A step that lands within a minute of a tick: it is on time for all.
        self.clock("2026-04-01T16:00:30Z")
        for name in scheds:
            self.daemon.wait_log("schedule %s: tick 2026-04-01T16:00:00Z fires" % name)
        self.sync()
        for name in scheds:
            self.assertEqual(self.fired_at(name)[-1], "2026-04-01T16:00:00Z")
            line = self.log_lines("schedule %s: tick 2026-04-01T16:00:00Z" % name)
            self.assertEqual(len(line), 1)
            self.assertNotIn("catch-up", line[0])
        self.assertEqual(len(self.log_lines("missed tick")), 3, "no new drops")
        # 301 s late is beyond the default MissedGraceSec=300: skip drops it.
        self.clock("2026-04-01T17:05:01Z")
        self.daemon.wait_log("schedule f_skip: 1 missed tick since 2026-04-01T16:00:30Z dropped")
        self.sync()
        self.assertEqual(self.fired_at("f_skip"), ["2026-04-01T16:00:00Z"])
        self.assertEqual(self.fired_at("f_once")[-1], "2026-04-01T17:00:00Z")
        self.wait_last("f_once", "2026-04-01T17:00:00Z")
        s = self.schedules()
        for name in scheds:
            self.assertEqual(s[name]["next_fire_at"], "2026-04-01T18:00:00Z")
        self.assertEqual(s["f_skip"]["last_fire_at"], "2026-04-01T16:00:00Z")

    def test_step_backward_fires_nothing_again(self):
        self.start("2026-04-01T10:30:00Z", {"back": hourly("catch_up_once")})
        self.clock("2026-04-01T11:00:05Z")
        self.clock("2026-04-01T12:00:05Z")
        self.daemon.wait_log("schedule back: tick 2026-04-01T12:00:00Z fires")
        self.sync()
        self.assertEqual(self.fired_at("back"), ["2026-04-01T11:00:00Z", "2026-04-01T12:00:00Z"])
        self.clock("2026-04-01T10:30:00Z")
        self.daemon.wait_log("schedule back: the clock went back from 2026-04-01T12:00:05Z to "
                             "2026-04-01T10:30:00Z")
        self.sync()
        self.assertEqual(len(self.fires("back")), 2)
        self.wait_last("back", "2026-04-01T12:00:00Z")
        s = self.schedules()["back"]
        self.assertEqual(s["next_fire_at"], "2026-04-01T11:00:00Z")
        # Forward again over the ticks already fired: no second mandate.
        self.clock("2026-04-01T11:00:05Z")
        self.clock("2026-04-01T12:00:05Z")
        self.sync()
        self.assertEqual(len(self.fires("back")), 2, self.daemon.log()[-2000:])
        self.assertEqual(len(self.mandates("back")), 2)
        self.clock("2026-04-01T13:00:05Z")
        self.daemon.wait_log("fired back at 2026-04-01T13:00:00Z")
        self.sync()
        ids = [m for _, m in self.fires("back")]
        self.assertEqual(self.fired_at("back"), ["2026-04-01T11:00:00Z", "2026-04-01T12:00:00Z",
                                                 "2026-04-01T13:00:00Z"])
        self.assertEqual(len(set(ids)), 3)
        self.assertEqual(set(self.mandates("back")), set(ids))
        self.wait_last("back", "2026-04-01T13:00:00Z")


class EnabledAndPause(ChronosCase):
    def test_enabled_no(self):
        dis = {"Schedule": {"Cron": "* * * * *", "Enabled": "no",
                            "MissedPolicy": "catch_up_bounded"},
               "Mandate": {"MaxCycles": "1"}}
        self.start("2026-04-01T10:30:00Z", {"dis": dis})
        s = self.schedules()["dis"]
        self.assertFalse(s["enabled"])
        self.assertIsNone(s["next_fire_at"])
        self.clock("2026-04-01T10:35:10Z")  # 10:35 would be on time
        self.sync()
        self.assertEqual(self.fired_at("dis"), [])
        self.assertEqual(self.log_lines("schedule dis:"), [])
        # Enabled again: the ticks while disabled are not caught up.
        dis["Schedule"]["Enabled"] = "yes"
        self.configure({"dis": dis})
        self.assertTrue(self.ok("reload")["reloaded"])
        self.sync()
        self.assertEqual(self.fired_at("dis"), [])
        s = self.schedules()["dis"]
        self.assertTrue(s["enabled"])
        self.assertEqual(s["next_fire_at"], "2026-04-01T10:36:00Z")
        self.clock("2026-04-01T10:36:10Z")
        self.daemon.wait_log("fired dis at 2026-04-01T10:36:00Z")
        self.sync()
        self.assertEqual(self.fired_at("dis"), ["2026-04-01T10:36:00Z"])

    def test_pause_resume_schedule_persisted(self):
        self.start("2026-04-01T10:30:00Z", {"p": hourly("catch_up_once"), "q": hourly()})
        r = self.ok("pause", schedule="p", reason="maintenance window")
        self.assertEqual(r, {"schedule": "p", "paused": True})
        r = self.call("pause", schedule="p")
        self.assertEqual(r["error"]["code"], "conflict", r)
        r = self.call("pause", schedule="nope")
        self.assertEqual(r["error"]["code"], "not_found", r)
        s = self.schedules()["p"]
        self.assertTrue(s["paused"])
        self.assertEqual(s["pause_reason"], "maintenance window")
        self.assertIsNone(s["next_fire_at"])
        self.assertFalse(self.schedules()["q"]["paused"])
        self.clock("2026-04-01T11:00:05Z")
        self.daemon.wait_log("fired q at 2026-04-01T11:00:00Z")
        self.clock("2026-04-01T12:30:00Z")
        self.sync()
        self.assertEqual(self.fired_at("p"), [])
        self.assertEqual(self.log_lines("schedule p:"), [])
        self.stop()
        st = self.chronos_json()
        self.assertTrue(st["p"]["paused"])
        self.assertEqual(st["p"]["pause_reason"], "maintenance window")
        self.assertFalse(st["q"]["paused"])
        self.assertNotIn("pause_reason", st["q"])

        # Still paused after a restart; catch_up_once would fire 14:00 else.
        self.start("2026-04-01T14:30:00Z")
        s = self.schedules()["p"]
        self.assertTrue(s["paused"])
        self.assertEqual(s["pause_reason"], "maintenance window")
        self.assertEqual(self.ok("resume", schedule="p"), {"schedule": "p", "paused": False})
        r = self.call("resume", schedule="p")
        self.assertEqual(r["error"]["code"], "conflict", r)
        self.sync()
        self.assertEqual(self.fired_at("p"), [], "paused ticks never fire")
        s = self.schedules()["p"]
        self.assertFalse(s["paused"])
        self.assertNotIn("pause_reason", s)
        self.assertEqual(s["next_fire_at"], "2026-04-01T15:00:00Z")
        self.clock("2026-04-01T15:00:05Z")
        self.daemon.wait_log("fired p at 2026-04-01T15:00:00Z")
        self.sync()
        self.assertEqual(self.fired_at("p"), ["2026-04-01T15:00:00Z"])
        self.stop()
        st = self.chronos_json()
        self.assertFalse(st["p"]["paused"])
        self.assertNotIn("pause_reason", st["p"])
        self.assertEqual(st["p"]["last_fire_at"], "2026-04-01T15:00:00Z")

    def test_state_of_the_last_change_survives_a_quick_stop(self):
        # pause and resume in one burst, then SIGTERM at once: the resume
        # must reach chronos.json even if the pause's write was still running.
        self.start("2026-04-01T10:30:00Z", {"p": hourly()})
        for i in range(5):
            msgs = [{"v": 1, "id": 100 + 2 * i, "cmd": "pause",
                     "args": {"schedule": "p", "reason": "r%d" % i}},
                    {"v": 1, "id": 101 + 2 * i, "cmd": "resume", "args": {"schedule": "p"}}]
            self.client.send_raw(b"".join(json.dumps(m).encode() + b"\n" for m in msgs))
            self.assertTrue(self.client.recv_reply()["ok"])
            self.assertTrue(self.client.recv_reply()["ok"])
        self.ok("pause", schedule="p", reason="final")
        self.daemon.proc.send_signal(signal.SIGTERM)
        self.stop()
        st = self.chronos_json()
        self.assertTrue(st["p"]["paused"])
        self.assertEqual(st["p"]["pause_reason"], "final")


class Concurrency(ChronosCase):
    EXTRA = "GracefulTimeoutSec=1\n"

    def gated(self, concurrency, gate):
        return {"Schedule": {"Cron": "0 * * * *", "Concurrency": concurrency},
                "Mandate": {"MaxCycles": "1"}, "Exec": {"Observe": "cat " + gate}}

    def test_reject(self):
        gate = self.make_gate()
        self.start("2026-04-01T10:30:00Z", {"r": self.gated("reject", gate)}, self.EXTRA)
        self.clock("2026-04-01T11:00:05Z")
        line = self.daemon.wait_log("fired r at 2026-04-01T11:00:00Z")
        m1 = FIRED_RE.search(line).group(3)
        self.daemon.wait_log("%s observe_001: started" % m1)
        self.clock("2026-04-01T12:00:05Z")
        self.daemon.wait_log("fire of r at 2026-04-01T12:00:00Z rejected: mandate %s is still "
                             "running (Concurrency=reject)" % m1)
        self.sync()
        self.assertEqual(self.fired_at("r"), ["2026-04-01T11:00:00Z"])
        self.assertEqual(set(self.mandates("r")), {m1})
        self.assertEqual(self.schedules()["r"]["concurrency"], "reject")
        # Once the first mandate is finished, the next tick fires again.
        self.release(gate)
        self.wait_done([m1])
        self.clock("2026-04-01T13:00:05Z")
        line = self.daemon.wait_log("fired r at 2026-04-01T13:00:00Z")
        m3 = FIRED_RE.search(line).group(3)
        self.daemon.wait_log("%s observe_001: started" % m3)
        self.release(gate)
        self.wait_done([m3])
        self.assertEqual(len(self.mandates("r")), 2)

    def test_queue(self):
        gate = self.make_gate()
        self.start("2026-04-01T10:30:00Z", {"q": self.gated("queue", gate)}, self.EXTRA)
        self.clock("2026-04-01T11:00:05Z")
        m1 = FIRED_RE.search(self.daemon.wait_log("fired q at 2026-04-01T11:00:00Z")).group(3)
        self.daemon.wait_log("%s observe_001: started" % m1)
        self.clock("2026-04-01T12:00:05Z")
        m2 = FIRED_RE.search(self.daemon.wait_log("fired q at 2026-04-01T12:00:00Z")).group(3)
        self.sync()
        self.assertNotEqual(m1, m2)
        listed = self.mandates("q")
        self.assertEqual(listed[m1]["status"], "running")
        self.assertEqual(listed[m2]["status"], "runnable", "waits for its schedule's mandate")
        self.assertEqual(self.log_lines("%s observe_001: started" % m2), [])
        self.assertEqual(self.log_lines("rejected"), [])
        self.release(gate)
        started = self.daemon.wait_log("%s observe_001: started" % m2)
        log = self.daemon.log()
        self.assertLess(log.index("%s observe_001: completed" % m1), log.index(started))
        self.release(gate)
        self.wait_done([m1, m2])

    def test_allow(self):
        self.start("2026-04-01T10:30:00Z", {"a": {
            "Schedule": {"Cron": "0 * * * *", "Concurrency": "allow"},
            "Mandate": {"MaxCycles": "1"}, "Exec": {"Observe": "sleep 600"}}}, self.EXTRA)
        self.clock("2026-04-01T11:00:05Z")
        m1 = FIRED_RE.search(self.daemon.wait_log("fired a at 2026-04-01T11:00:00Z")).group(3)
        self.clock("2026-04-01T12:00:05Z")
        m2 = FIRED_RE.search(self.daemon.wait_log("fired a at 2026-04-01T12:00:00Z")).group(3)
        self.daemon.wait_log("%s observe_001: started" % m1)
        self.daemon.wait_log("%s observe_001: started" % m2)
        listed = self.mandates("a")
        self.assertEqual(listed[m1]["status"], "running")
        self.assertEqual(listed[m2]["status"], "running")


class Reload(ChronosCase):
    def test_reload_keeps_state_adds_and_removes(self):
        self.start("2026-04-01T10:30:00Z", {"a": hourly(), "b": hourly()})
        self.clock("2026-04-01T11:00:05Z")
        self.daemon.wait_log("fired a at 2026-04-01T11:00:00Z")
        self.daemon.wait_log("fired b at 2026-04-01T11:00:00Z")
        self.wait_done([m for _, m in self.fires("a") + self.fires("b")])
        # a stays (policy changed), b goes, c comes: its tick 11:00 is 5 s
        # old, which would be on time for a schedule chronos knew.
        self.configure({"a": hourly("catch_up_once"),
                        "c": {"Schedule": {"Cron": "0 11 * * *"}}})
        r = self.ok("reload")
        self.assertEqual(r["schedules"], 3)
        self.sync()
        s = self.schedules()
        self.assertEqual(set(s), {"a", "c", MARKER})
        self.assertEqual(s["a"]["last_fire_at"], "2026-04-01T11:00:00Z")
        self.assertEqual(s["a"]["missed_policy"], "catch_up_once")
        self.assertIsNone(s["c"]["last_fire_at"])
        self.assertEqual(s["c"]["next_fire_at"], "2026-04-02T11:00:00Z")
        self.assertEqual(self.fired_at("c"), [])
        self.assertEqual(self.fired_at("a"), ["2026-04-01T11:00:00Z"])
        r = self.call("schedules", next="b")
        self.assertEqual(r["error"]["code"], "not_found")
        # SIGHUP reloads the same way; the state still stays.
        self.daemon.proc.send_signal(signal.SIGHUP)
        self.wait_count("configuration reloaded: 3 schedules", 2)
        self.clock("2026-04-01T12:00:05Z")
        self.daemon.wait_log("fired a at 2026-04-01T12:00:00Z")
        self.sync()
        self.assertEqual(self.fired_at("a"), ["2026-04-01T11:00:00Z", "2026-04-01T12:00:00Z"])
        self.assertEqual(self.fired_at("c"), [])
        self.stop()
        st = self.chronos_json()
        self.assertEqual(set(st), {"a", "c", MARKER})
        self.assertEqual(st["a"]["last_fire_at"], "2026-04-01T12:00:00Z")
        self.assertEqual(st["c"]["last_evaluated_at"], "2026-04-01T12:00:05Z")
        self.assertIsNone(st["c"]["last_fire_at"])

    def test_reload_with_a_broken_file_skips_it_and_the_others_keep_running(self):
        self.start("2026-04-01T10:30:00Z", {"a": hourly()})
        bad = os.path.join(self.dir, "schedules.d", "bad.conf")
        with open(bad, "w") as f:
            f.write("[Schedule]\nCron=61 * * * *\n")
        r = self.ok("reload")
        self.assertEqual((r["schedules"], r["broken"]), (2, 1))
        self.daemon.wait_log("bad.conf:2: Cron=: invalid expression")
        self.daemon.wait_log("schedule bad is broken (1 error in %s): skipped" % bad)
        s = self.schedules()
        self.assertEqual(set(s), {"a", "bad", MARKER})
        self.assertEqual(s["bad"]["state"], "broken")
        self.assertIn("bad.conf:2: Cron=: invalid expression \"61 * * * *\"", s["bad"]["error"])
        self.assertIsNone(s["bad"]["next_fire_at"])
        self.assertEqual(s["a"]["state"], "enabled")
        st = self.ok("status")["schedules"]
        self.assertEqual((st["total"], st["broken"], st["broken_names"]), (3, 1, ["bad"]))
        # A broken schedule cannot be fired by hand either.
        r = self.call("fire", schedule="bad")
        self.assertEqual(r["error"]["code"], "schedule_broken", r)
        self.assertIn("bad.conf:2", r["error"]["message"])
        r = self.call("schedules", next="bad")
        self.assertEqual(r["error"]["code"], "schedule_broken", r)
        # SIGHUP reloads the same way; the good schedule fires.
        self.daemon.proc.send_signal(signal.SIGHUP)
        self.wait_count("configuration reloaded: 2 schedules, 1 broken", 2)
        self.clock("2026-04-01T11:00:05Z")
        self.daemon.wait_log("fired a at 2026-04-01T11:00:00Z")
        self.sync()
        self.assertEqual(self.fired_at("a"), ["2026-04-01T11:00:00Z"])
        self.assertEqual(self.fired_at("bad"), [])
        # kairosctl shows it (text): the state column and the first error.
        out = subprocess.run([os.environ["KAIROSCTL"], "--socket", self.daemon.socket_path,
                              "schedules"], capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertRegex(out.stdout, r"(?m)^bad .* broken$")
        self.assertIn("\nschedule bad is broken: %s:2: Cron=" % bad, out.stdout)
        out = subprocess.run([os.environ["KAIROSCTL"], "--socket", self.daemon.socket_path,
                              "status"], capture_output=True, text=True, timeout=30)
        self.assertIn("Schedules:       3, 1 of them broken (skipped): bad\n", out.stdout)
        # Fixed: it runs again, its state kept meanwhile.
        with open(bad, "w") as f:
            f.write("[Schedule]\nCron=30 * * * *\n[Mandate]\nMaxCycles=1\n")
        r = self.ok("reload")
        self.assertEqual((r["schedules"], r["broken"]), (3, 0))
        self.assertEqual(self.schedules()["bad"]["state"], "enabled")
        self.clock("2026-04-01T11:30:05Z")
        self.daemon.wait_log("fired bad at 2026-04-01T11:30:00Z")

    def test_a_running_mandate_keeps_the_configuration_of_its_broken_schedule(self):
        gate = self.make_gate()
        mark = os.path.join(self.dir, "act-ran")
        sched = {"Schedule": {"Cron": "0 * * * *"}, "Mandate": {"MaxCycles": "1"},
                 "Exec": {"Observe": "cat " + gate,
                          "Act": "/bin/sh -c 'echo old >> %s'" % mark}}
        self.start("2026-04-01T10:30:00Z", {"g": sched})
        self.clock("2026-04-01T11:00:05Z")
        self.daemon.wait_log("fired g at 2026-04-01T11:00:00Z")
        m = self.fires("g")[0][1]
        path = os.path.join(self.dir, "schedules.d", "g.conf")
        with open(path, "w") as f:
            f.write("[Schedule]\nCron=0 * * * *\n[Exec]\nAct=/bin/sh -c 'echo new >> %s\n"
                    % mark)
        r = self.ok("reload")
        self.assertEqual(r["broken"], 1)
        self.assertEqual(self.schedules()["g"]["state"], "broken")
        self.release(gate)
        self.daemon.wait_log("mandate %s done" % m)
        with open(mark) as f:
            self.assertEqual(f.read(), "old\n")
        # ... and the broken schedule does not fire.
        self.clock("2026-04-01T12:00:05Z")
        self.sync()
        self.assertEqual(self.fired_at("g"), ["2026-04-01T11:00:00Z"])


class BrokenAtStart(ChronosCase):
    def test_restart_with_a_broken_schedule_file_present(self):
        self.start("2026-04-01T10:30:00Z", {"a": hourly(), "b": hourly()})
        self.stop()
        bad = os.path.join(self.dir, "schedules.d", "b.conf")
        with open(bad, "w") as f:
            f.write("[Schedule]\nCron=0 * * * *\n[Mandate]\nRiskBudget=low\n")
        # The strict gate still fails; the main-only check (the unit's) passes.
        out = subprocess.run([os.environ["KAIROSD"], "-c", self.config, "--check-config"],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn("b.conf:4: RiskBudget=: not supported", out.stderr)
        out = subprocess.run([os.environ["KAIROSD"], "-c", self.config, "--check-config",
                              "--main-only"], capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        # The daemon starts, reports it, and runs the good one.
        self.start("2026-04-01T10:40:00Z")
        self.daemon.wait_log("b.conf:4: RiskBudget=: not supported")
        self.notify.wait_for(lambda m: "STATUS=" in m and "1 schedule broken" in m)
        s = self.schedules()
        self.assertEqual(s["b"]["state"], "broken")
        self.assertEqual(s["a"]["state"], "enabled")
        self.clock("2026-04-01T11:00:05Z")
        self.daemon.wait_log("fired a at 2026-04-01T11:00:00Z")
        self.sync()
        self.assertEqual(self.fired_at("b"), [])
        self.stop()
        # chronos.json keeps the broken schedule's state for when it is fixed
        st = self.chronos_json()
        self.assertEqual(st["b"]["last_evaluated_at"], "2026-04-01T10:30:00Z")


class Grace(ChronosCase):
    def test_a_tick_missed_by_a_restart_fires_within_missed_grace_sec(self):
        self.start("2026-04-01T10:58:00Z", {
            "g": hourly(),                                   # skip, MissedGraceSec=300
            "short": hourly(MissedGraceSec="60"),            # 60 s: the tick is dropped
            "once": hourly("catch_up_once", MissedGraceSec="0"),
        })
        self.stop()
        # down over 11:00; back at 11:03: 180 s late
        self.start("2026-04-01T11:03:00Z")
        self.daemon.wait_log("schedule g: tick 2026-04-01T11:00:00Z fires "
                             "(late, within MissedGraceSec=)")
        self.daemon.wait_log("schedule short: 1 missed tick since 2026-04-01T10:58:00Z dropped "
                             "(MissedPolicy=skip)")
        self.daemon.wait_log("schedule once: tick 2026-04-01T11:00:00Z fires (catch-up)")
        self.sync()
        self.assertEqual(self.fired_at("g"), ["2026-04-01T11:00:00Z"])
        self.assertEqual(self.fired_at("short"), [])
        # 301 s late is beyond the default grace: dropped under skip
        self.stop()
        self.start("2026-04-01T12:05:01Z")
        self.daemon.wait_log("schedule g: 1 missed tick since 2026-04-01T11:03:00Z dropped "
                             "(MissedPolicy=skip)")
        self.sync()
        self.assertEqual(self.fired_at("g"), [])


class ThreeMinuteOutage(ChronosCase):
    """A minutely schedule, kairosd down from 12:00:30 to 12:03:10: 12:01 and
    12:02 are missed, 12:03 is the current tick.  Each policy under
    Concurrency=reject and queue gives exactly the documented ticks, and the
    current tick always runs (kairos.schedule(5), MissedPolicy=)."""
    EXTRA = "GracefulTimeoutSec=1\n"
    SINCE = "2026-04-01T12:00:30Z"

    def sched(self, policy, concurrency, gate):
        return {"Schedule": {"Cron": "* * * * *", "MissedPolicy": policy,
                             "Concurrency": concurrency},
                "Mandate": {"MaxCycles": "1"}, "Exec": {"Observe": "cat " + gate}}

    def test_each_policy_under_reject_and_queue(self):
        gate = self.make_gate()  # never released: each mandate stays running
        scheds = {}
        for pol, short in (("skip", "s"), ("catch_up_once", "o"), ("catch_up_bounded", "b")):
            for cc in ("reject", "queue"):
                scheds["%s_%s" % (short, cc)] = self.sched(pol, cc, gate)
        self.start(self.SINCE, scheds, self.EXTRA)
        self.stop()
        self.start("2026-04-01T12:03:10Z")
        for name in scheds:
            line = self.daemon.wait_log("fired %s at 2026-04-01T12:03:00Z" % name)
            m = FIRED_RE.search(line).group(3)
            # the current tick runs: it is never the one waiting or rejected
            self.daemon.wait_log("%s observe_001: started" % m)
        self.daemon.wait_log("fire of b_reject at 2026-04-01T12:02:00Z rejected")
        self.daemon.wait_log("fired b_queue at 2026-04-01T12:02:00Z")
        self.sync()
        cur = ["2026-04-01T12:03:00Z"]
        self.assertEqual(self.fired_at("s_reject"), cur)
        self.assertEqual(self.fired_at("s_queue"), cur)
        self.assertEqual(self.fired_at("o_reject"), cur)
        self.assertEqual(self.fired_at("o_queue"), cur)
        # bounded: the current tick first, then each missed tick; under
        # reject those find the current one running
        self.assertEqual(self.fired_at("b_reject"), cur)
        self.assertEqual(self.fired_at("b_queue"), cur + ["2026-04-01T12:01:00Z",
                                                          "2026-04-01T12:02:00Z"])
        self.daemon.wait_log("fire of b_reject at 2026-04-01T12:01:00Z rejected")
        listed = self.mandates("b_queue")
        by_at = {m["fired_at"]: m["status"] for m in listed.values()}
        self.assertEqual(by_at, {"2026-04-01T12:03:00Z": "running",
                                 "2026-04-01T12:01:00Z": "runnable",
                                 "2026-04-01T12:02:00Z": "runnable"})
        # one journal line per skipped period: count, first, last, why
        for name, why in (("s_reject", "skip"), ("s_queue", "skip"),
                          ("o_reject", "catch_up_once, the current tick runs for them"),
                          ("o_queue", "catch_up_once, the current tick runs for them")):
            lines = self.log_lines("schedule %s: " % name)
            dropped = [x for x in lines if "missed tick" in x]
            self.assertEqual(len(dropped), 1, lines)
            self.assertIn("schedule %s: 2 missed ticks since %s dropped (MissedPolicy=%s): "
                          "first 2026-04-01T12:01:00Z, last 2026-04-01T12:02:00Z"
                          % (name, self.SINCE, why), dropped[0])
        self.assertEqual([x for x in self.log_lines("schedule b_") if "missed tick" in x], [])
        # schedules: LAST is a tick that ran; what was skipped and why
        for name in scheds:
            self.wait_last(name, "2026-04-01T12:03:00Z")
        s = self.schedules()
        self.assertEqual(s["s_queue"]["skipped"], {
            "count": 2, "more": False, "first": "2026-04-01T12:01:00Z",
            "last": "2026-04-01T12:02:00Z", "reason": "MissedPolicy=skip"})
        self.assertEqual(s["o_reject"]["skipped"]["reason"],
                         "the current tick runs for the missed period")
        self.assertNotIn("skipped", s["b_queue"])
        out = subprocess.run([os.environ["KAIROSCTL"], "--socket", self.daemon.socket_path,
                              "schedules"], capture_output=True, text=True, check=True).stdout
        self.assertIn("schedule s_reject skipped 2 missed ticks, 2026-04-01T12:01:00Z to "
                      "2026-04-01T12:02:00Z: MissedPolicy=skip\n", out)
        self.assertIn("schedule o_queue skipped 2 missed ticks, 2026-04-01T12:01:00Z to "
                      "2026-04-01T12:02:00Z: the current tick runs for the missed period\n", out)
        self.assertNotIn("schedule b_queue skipped", out)

    def test_skipped_ticks_survive_a_restart(self):
        # what schedules says was skipped is in chronos.json: a restart
        # (and a kill -9) shows it again
        self.start(self.SINCE, {"s": {"Schedule": {"Cron": "* * * * *", "MissedPolicy": "skip"},
                                      "Mandate": {"MaxCycles": "1"}}}, self.EXTRA)
        self.stop()
        self.start("2026-04-01T12:03:10Z")
        self.wait_last("s", "2026-04-01T12:03:00Z")
        want = {"count": 2, "more": False, "first": "2026-04-01T12:01:00Z",
                "last": "2026-04-01T12:02:00Z", "reason": "MissedPolicy=skip"}
        self.assertEqual(self.schedules()["s"]["skipped"], want)
        self.stop()
        self.assertEqual(self.chronos_json()["s"]["skipped"], want)
        self.start("2026-04-01T12:03:20Z")
        self.assertEqual(self.schedules()["s"]["skipped"], want)
        self.client.close()
        self.client = None
        self.daemon.kill()
        self.daemon.proc.stderr.close()
        self.start("2026-04-01T12:03:30Z")
        self.assertEqual(self.schedules()["s"]["skipped"], want)
        out = subprocess.run([os.environ["KAIROSCTL"], "--socket", self.daemon.socket_path,
                              "schedules"], capture_output=True, text=True, check=True).stdout
        self.assertIn("schedule s skipped 2 missed ticks, 2026-04-01T12:01:00Z to "
                      "2026-04-01T12:02:00Z: MissedPolicy=skip\n", out)

    def test_last_is_never_a_rejected_tick(self):
        # The old order fired the stalest catch-up first: it ran, the current
        # tick was rejected, and LAST said the current tick.
        gate = self.make_gate()
        self.start(self.SINCE, {"r": {
            "Schedule": {"Cron": "0 * * * *", "Concurrency": "reject"},
            "Mandate": {"MaxCycles": "1"}, "Exec": {"Observe": "cat " + gate}}}, self.EXTRA)
        self.clock("2026-04-01T13:00:05Z")
        m1 = FIRED_RE.search(self.daemon.wait_log("fired r at 2026-04-01T13:00:00Z")).group(3)
        self.daemon.wait_log("%s observe_001: started" % m1)
        self.wait_last("r", "2026-04-01T13:00:00Z")
        self.clock("2026-04-01T14:00:05Z")
        self.daemon.wait_log("fire of r at 2026-04-01T14:00:00Z rejected")
        self.daemon.wait_log("schedule r: tick not fired")
        self.sync()
        s = self.schedules()["r"]
        self.assertEqual(s["last_fire_at"], "2026-04-01T13:00:00Z")
        self.assertEqual(s["refused"]["count"], 1)
        self.assertEqual(s["refused"]["last"], "2026-04-01T14:00:00Z")
        self.assertIn("Concurrency=reject", s["refused"]["reason"])
        out = subprocess.run([os.environ["KAIROSCTL"], "--socket", self.daemon.socket_path,
                              "schedules"], capture_output=True, text=True, check=True).stdout
        self.assertIn("schedule r refused 1 tick since kairosd started, the last "
                      "2026-04-01T14:00:00Z: schedule r has Concurrency=reject", out)


class Backfill(ChronosCase):
    """kairosctl backfill NAME --from T --to T [--dry-run] [--max N]."""

    def ctl(self, *args):
        return subprocess.run([os.environ["KAIROSCTL"], "--socket", self.daemon.socket_path]
                              + list(args), capture_output=True, text=True)

    def test_dry_run_real_and_duplicates(self):
        self.start("2026-04-02T00:00:00Z", {"h": hourly()})
        r = self.ctl("backfill", "h", "--from", "2026-04-01T00:00:00Z",
                     "--to", "2026-04-01T03:00:00Z", "--dry-run")
        self.assertEqual(r.returncode, 0, r.stderr)
        ticks = ["2026-04-01T0%d:00:00Z" % i for i in range(4)]
        self.assertEqual(r.stdout, "".join("%s: would fire\n" % t for t in ticks)
                         + "schedule h: 4 ticks to fire (dry run)\n")
        self.assertEqual(self.mandates("h"), {})
        r = self.ctl("backfill", "h", "--from", "2026-04-01T00:00:00Z",
                     "--to", "2026-04-01T03:00:00Z")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("schedule h: 4 fired, 0 already fired, 0 not fired\n", r.stdout)
        got = sorted(m["fired_at"] for m in self.mandates("h").values())
        self.assertEqual(got, ticks)
        # an overlapping range: the ticks fired already are not fired twice
        res = self.ok("backfill", schedule="h", **{"from": "2026-04-01T02:00:00Z",
                                                   "to": "2026-04-01T05:30:00Z"})
        self.assertEqual((res["fired"], res["existing"], res["failed"]), (2, 2, 0))
        self.assertEqual([t["fired"] for t in res["ticks"]], [False, False, True, True])
        self.assertEqual(len(self.mandates("h")), 6)
        self.daemon.wait_log("schedule h: backfill of 4 ticks in [2026-04-01T02:00:00Z, "
                             "2026-04-01T05:30:00Z]")
        # backfilled ticks are durable: a restart keeps them all
        self.stop()
        self.start("2026-04-02T00:00:00Z")
        self.assertEqual(len(self.mandates("h")), 6)

    def test_bounded_and_bad_input(self):
        self.start("2026-04-02T00:00:00Z", {"h": hourly()})
        r = self.ctl("backfill", "h", "--from", "2026-03-01T00:00:00Z",
                     "--to", "2026-03-05T04:00:00Z")  # 101 ticks
        self.assertEqual(r.returncode, 1)
        self.assertIn("schedule h has more than 100 ticks in [2026-03-01T00:00:00Z, "
                      "2026-03-05T04:00:00Z]", r.stderr)
        self.assertEqual(self.mandates("h"), {})
        r = self.ctl("backfill", "h", "--from", "2026-03-01T00:00:00Z",
                     "--to", "2026-03-05T04:00:00Z", "--max", "101", "--dry-run")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("schedule h: 101 ticks to fire (dry run)", r.stdout)
        for args, want in (
                (["--from", "2026-04-01T03:00:00Z", "--to", "2026-04-01T00:00:00Z"],
                 "backfill: --from 2026-04-01T03:00:00Z is after --to 2026-04-01T00:00:00Z"),
                (["--from", "yesterday", "--to", "2026-04-01T00:00:00Z"],
                 "backfill: --from 'yesterday' is not a UTC time"),
                (["--from", "2026-04-01T00:00:00Z", "--to", "2026-04-31T00:00:00Z"],
                 "backfill: --to '2026-04-31T00:00:00Z' is not a UTC time"),
                (["--from", "2026-04-01T00:00:00Z"], "backfill: --to TIME is required"),
                (["--from", "2026-04-01T00:00:00Z", "--to", "2026-04-01T00:00:00Z",
                  "--max", "0"], "backfill: --max '0' is not an integer 1..10000")):
            r = self.ctl("backfill", "h", *args)
            self.assertEqual(r.returncode, 64, (args, r.stderr))
            self.assertIn(want, r.stderr)
        r = self.ctl("backfill", "nope", "--from", "2026-04-01T00:00:00Z",
                     "--to", "2026-04-01T01:00:00Z")
        self.assertEqual(r.returncode, 1)
        self.assertIn("no schedule named 'nope'", r.stderr)
        # the daemon checks on its own too, naming the field
        for args, want in (({"from": "2026-04-01T03:00:00Z", "to": "2026-04-01T00:00:00Z"},
                            "args.from: 2026-04-01T03:00:00Z is after args.to"),
                           ({"from": "x", "to": "2026-04-01T00:00:00Z"},
                            "args.from: 'x' is not a UTC time"),
                           ({"from": "2026-04-01T00:00:00Z", "to": "2026-04-01T00:00:00Z",
                             "max": 10001}, "args.max: must be an integer 1..10000"),
                           ({"schedule": "../h", "from": "2026-04-01T00:00:00Z",
                             "to": "2026-04-01T01:00:00Z"},
                            "args.schedule: '../h' is not a schedule name")):
            r = self.call("backfill", **dict({"schedule": "h"}, **args))
            self.assertFalse(r["ok"], r)
            self.assertEqual(r["error"]["code"], "bad_argument")
            self.assertIn(want, r["error"]["message"])
        self.assertEqual(self.mandates("h"), {})


class AbsurdClocks(ChronosCase):
    def responsive(self, when_unix):
        """Step the clock; the step and a status answer within a few seconds."""
        t0 = time.monotonic()
        r = self.call("test-clock", now=when_unix)
        self.assertTrue(r["ok"], r)
        self.ok("status")
        took = time.monotonic() - t0
        self.assertLess(took, 3.0, "the loop was blocked %.1f s" % took)

    def test_clock_beyond_year_9999_or_at_2_40_keeps_the_state(self):
        self.start("2026-04-01T10:30:00Z", {
            "h": hourly("catch_up_bounded", MaxCatchUpRuns="1000"),
            "d": {"Schedule": {"Cron": "0 0 * * *", "MissedPolicy": "catch_up_once"},
                  "Mandate": {"MaxCycles": "1"}}})
        self.clock("2026-04-01T10:31:00Z")
        # 2^40 s (year 36812): nothing can be represented; state kept.
        self.responsive(1 << 40)
        self.daemon.wait_log("outside what kairos can schedule (years 1970 to 9999): no "
                             "schedule is evaluated and chronos.json keeps its values")
        # the last hour of year 9999: no next fire can be represented
        self.responsive(T("9999-12-31T23:30:00Z"))
        self.daemon.wait_log("the wall clock is usable again")
        self.daemon.wait_log("schedule h: no fire can be represented after the clock's")
        self.daemon.wait_log("schedule d: no fire can be represented after the clock's")
        self.sync()
        self.assertEqual(self.fired_at("h"), [])
        self.assertEqual(self.fired_at("d"), [])
        s = self.schedules()
        self.assertEqual(s["h"]["last_fire_at"], None)
        self.stop()
        after = self.chronos_json()
        self.assertEqual(after["h"], {"last_evaluated_at": "2026-04-01T10:31:00Z",
                                      "last_fire_at": None,
                                      "next_fire_at": "2026-04-01T11:00:00Z", "paused": False})
        self.assertEqual(after["d"], {"last_evaluated_at": "2026-04-01T10:31:00Z",
                                      "last_fire_at": None,
                                      "next_fire_at": "2026-04-02T00:00:00Z", "paused": False})

    def test_a_jump_to_year_9999_is_evaluated_without_stalling(self):
        # A minutely schedule, 8000 years of missed ticks, at most 1000 catch-ups.
        self.start("2026-04-01T10:30:00Z", {
            "m": {"Schedule": {"Cron": "* * * * *", "MissedPolicy": "catch_up_bounded",
                               "MaxCatchUpRuns": "3", "MissedGraceSec": "0",
                               "StaleAfter": "36500d"},
                  "Mandate": {"MaxCycles": "1"}}})
        self.clock("2026-04-01T10:30:30Z")
        self.responsive(T("9999-06-01T00:00:30Z"))
        self.daemon.wait_log("schedule m: more than ")
        for t in ("9999-05-31T23:57:00Z", "9999-05-31T23:58:00Z", "9999-05-31T23:59:00Z",
                  "9999-06-01T00:00:00Z"):
            self.daemon.wait_log("fired m at %s" % t)
        self.assertEqual(self.schedules()["m"]["next_fire_at"], "9999-06-01T00:01:00Z")

    def test_a_large_catch_up_does_not_block_the_loop(self):
        # 100 catch-up fires are handed to the executor a few per loop turn:
        # the step and a status answer at once, the fires all happen.
        self.start("2026-04-01T10:30:00Z", {
            "m": {"Schedule": {"Cron": "* * * * *", "MissedPolicy": "catch_up_bounded",
                               "MaxCatchUpRuns": "100", "MissedGraceSec": "0"},
                  "Mandate": {"MaxCycles": "1"}}})
        self.clock("2026-04-01T10:30:30Z")
        self.responsive(T("2026-04-03T00:00:30Z"))
        # the current tick first, then the catch-up runs, oldest first
        self.daemon.wait_log("fired m at 2026-04-03T00:00:00Z", timeout=120)
        self.daemon.wait_log("fired m at 2026-04-02T22:20:00Z", timeout=120)
        self.daemon.wait_log("fired m at 2026-04-02T23:59:00Z", timeout=120)
        self.sync()
        self.assertEqual(len(self.fired_at("m")), 101)
        self.assertNotIn("2026-04-02T22:19:00Z", self.fired_at("m"))


    def test_chronos_json_counts_a_tick_only_once_its_mandate_is_durable(self):
        # A catch-up of 101 ticks; kill -9 the moment chronos.json says they
        # were evaluated: every one of them must have its mandate after the
        # restart (a tick saved as evaluated before its mandate was durable
        # would be lost for good: the restart does not evaluate it again).
        self.start("2026-04-01T10:30:00Z", {
            "m": {"Schedule": {"Cron": "* * * * *", "MissedPolicy": "catch_up_bounded",
                               "MaxCatchUpRuns": "100", "MissedGraceSec": "0"},
                  "Mandate": {"MaxCycles": "1"}}})
        self.clock("2026-04-01T10:30:30Z")
        self.ok("test-clock", now=T("2026-04-03T00:00:30Z"))
        deadline = time.monotonic() + 120
        while True:  # poll the file for the condition, then kill at once
            try:
                if self.chronos_json()["m"]["last_evaluated_at"] == "2026-04-03T00:00:30Z":
                    break
            except (OSError, ValueError, KeyError):
                pass
            self.assertLess(time.monotonic(), deadline, "chronos.json never saved the jump")
            time.sleep(0.001)
        self.daemon.kill()
        self.daemon.proc.stderr.close()
        self.start("2026-04-03T00:00:30Z")
        ticks = {m["fired_at"] for m in self.ok("list", limit=0)["mandates"]
                 if m.get("schedule") == "m"}
        missing = [iso(T("2026-04-02T22:20:00Z") + 60 * i) for i in range(101)]
        missing = [t for t in missing if t not in ticks]
        self.assertEqual(missing, [], "ticks counted as evaluated without a mandate")
        self.assertEqual(len(ticks), 101)


@unittest.skipUnless(os.path.exists("/usr/share/zoneinfo/Europe/Berlin")
                     or os.environ.get("TZDIR"), "no tzdata (Europe/Berlin)")
class TimeZones(ChronosCase):
    def test_berlin_spring_forward_and_fall_back(self):
        sched = {"Schedule": {"Cron": "30 2 * * *", "TimeZone": "Europe/Berlin",
                              "MissedPolicy": "catch_up_once"},
                 "Mandate": {"MaxCycles": "1"}}
        self.start("2026-03-28T12:00:00Z", {"berlin": sched})
        s = self.schedules()["berlin"]
        self.assertEqual(s["time_zone"], "Europe/Berlin")
        self.assertEqual(s["next_fire_at"], "2026-03-30T00:30:00Z", "02:30 does not exist on 03-29")
        # Walk over the night of 03-29 (02:00 CET -> 03:00 CEST) in steps.
        for t in ("2026-03-29T00:29:00Z", "2026-03-29T00:31:00Z", "2026-03-29T01:00:30Z",
                  "2026-03-29T01:30:30Z", "2026-03-29T12:00:00Z"):
            self.clock(t)
        self.sync()
        self.assertEqual(self.fired_at("berlin"), [])
        self.assertEqual(self.log_lines("missed tick"), [])
        self.clock("2026-03-30T00:30:30Z")  # 02:30:30 CEST
        self.daemon.wait_log("fired berlin at 2026-03-30T00:30:00Z")
        # Fall back on 10-25: 02:30 happens at 00:30Z (CEST) and 01:30Z (CET).
        self.clock("2026-10-24T12:00:00Z")
        self.daemon.wait_log("fired berlin at 2026-10-24T00:30:00Z")  # catch_up_once
        self.sync()
        before = len(self.fires("berlin"))
        self.assertEqual(self.schedules()["berlin"]["next_fire_at"], "2026-10-25T00:30:00Z")
        self.clock("2026-10-25T00:30:30Z")
        self.daemon.wait_log("fired berlin at 2026-10-25T00:30:00Z")
        for t in ("2026-10-25T01:00:30Z", "2026-10-25T01:30:30Z", "2026-10-25T02:30:00Z",
                  "2026-10-25T12:00:00Z"):
            self.clock(t)
        self.sync()
        on_the_25th = [f for f in self.fired_at("berlin") if f.startswith("2026-10-25")]
        self.assertEqual(on_the_25th, ["2026-10-25T00:30:00Z"])
        self.assertEqual(len(self.fires("berlin")), before + 1)
        self.assertEqual(self.schedules()["berlin"]["next_fire_at"], "2026-10-26T01:30:00Z")
        self.clock("2026-10-26T01:30:30Z")  # 02:30:30 CET
        self.daemon.wait_log("fired berlin at 2026-10-26T01:30:00Z")


class Previews(ChronosCase):
    def test_schedules_list_and_next(self):
        self.start("2026-03-06T10:30:00Z", {  # a Friday
            "w": {"Schedule": {"Cron": "*/20 9-10 * * 1-5"}},
            "ny": {"Schedule": {"Cron": "30 2 * * *", "TimeZone": "America/New_York",
                                "MissedPolicy": "catch_up_bounded", "Concurrency": "allow"}},
        })
        w = self.schedules()["w"]
        self.assertEqual(w, {"name": "w", "cron": "*/20 9-10 * * 1-5", "time_zone": "UTC",
                             "next_fire_at": "2026-03-06T10:40:00Z", "last_fire_at": None,
                             "missed_policy": "skip", "concurrency": "queue", "enabled": True,
                             "paused": False, "state": "enabled"})
        r = self.ok("schedules", next="w", n=5)
        self.assertEqual(r, {"name": "w", "cron": "*/20 9-10 * * 1-5", "time_zone": "UTC",
                             "next": ["2026-03-06T10:40:00Z", "2026-03-09T09:00:00Z",
                                      "2026-03-09T09:20:00Z", "2026-03-09T09:40:00Z",
                                      "2026-03-09T10:00:00Z"]})
        self.assertEqual(len(self.ok("schedules", next="w")["next"]), 5, "default n")
        self.assertEqual(len(self.ok("schedules", next="w", n=1000)["next"]), 1000)
        for n in (0, 1001, "3"):
            r = self.call("schedules", next="w", n=n)
            self.assertEqual(r["error"]["code"], "bad_argument", (n, r))
        self.assertEqual(self.call("schedules", next="nope")["error"]["code"], "not_found")
        ny = self.schedules()["ny"]
        self.assertEqual((ny["time_zone"], ny["missed_policy"], ny["concurrency"]),
                         ("America/New_York", "catch_up_bounded", "allow"))
        if os.path.exists("/usr/share/zoneinfo/America/New_York") or os.environ.get("TZDIR"):
            # 2026-03-08: 02:00 EST -> 03:00 EDT, 02:30 does not exist.
            r = self.ok("schedules", next="ny", n=3)
            self.assertEqual(r["next"], ["2026-03-07T07:30:00Z", "2026-03-09T06:30:00Z",
                                         "2026-03-10T06:30:00Z"])
        # The preview follows the (fake) clock.
        self.clock("2026-03-09T09:20:00Z")
        self.assertEqual(self.ok("schedules", next="w", n=2)["next"],
                         ["2026-03-09T09:40:00Z", "2026-03-09T10:00:00Z"])


if __name__ == "__main__":
    prog = unittest.main(verbosity=2, exit=False)
    res = prog.result
    if res.testsRun and len(res.skipped) == res.testsRun:
        sys.exit(77)
    sys.exit(0 if res.wasSuccessful() else 1)
