#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""kairosctl list|show --state-dir: the history without kairosd.

A kairosd runs N mandates (done, failed, a retry), one more whose act
blocks, then dies by kill -9 mid-act.  `list --json` and `show --json` read
offline from the state directory equal what kairosd answered before, field
by field; the mandate cut off mid-act differs only in what only a live
kairosd knows (its status: "interrupted" offline, and its reason).  Nothing
in the state directory changes (size and mtime of every file).  Bad input
gets the errors kairosd gives.

N: KAIROS_OFFLINE_MANDATES (default 200; the proof runs 1000).  The show
of every 10th mandate and of the special ones is compared
(KAIROS_OFFLINE_SHOW_ALL=1: every mandate's)."""
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kairos_harness import Client, Daemon, NotifySocket, write_config  # noqa: E402

KAIROSCTL = os.environ.get("KAIROSCTL", "build/src/ctl/kairosctl")
CRON = {"Cron": "0 0 1 1 *"}
ONE = {"MaxCycles": "1"}
N = int(os.environ.get("KAIROS_OFFLINE_MANDATES", "200"))
LIVE_ONLY = ("status", "reason")  # what only a live kairosd knows of an unfinished one


def at(i):
    t = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc) + \
        datetime.timedelta(minutes=i)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def snapshot(root):
    out = {}
    for d, _, files in os.walk(root):
        for name in files + [""]:
            p = os.path.join(d, name)
            st = os.lstat(p)
            out[p] = (st.st_size, st.st_mtime_ns)
    return out


class TestHistoryOffline(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-offline-")
        self.state = os.path.join(self.dir, "state")
        self.notify = NotifySocket(self.dir)
        self.d = None
        self.c = None
        self.actpid = None

    def tearDown(self):
        if self.c:
            self.c.close()
        if self.d:
            if self.d.proc.poll() is None:
                self.d.kill()
            self.d.proc.stderr.close()
        self.kill_act()
        self.notify.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def kill_act(self):
        """The act kairosd left behind when it was killed."""
        if self.actpid:
            try:
                os.kill(self.actpid, 9)
            except ProcessLookupError:
                pass
            self.actpid = None

    def ctl(self, *args, socket=None):
        return subprocess.run([KAIROSCTL, "--socket", socket or self.d.socket_path, *args],
                              capture_output=True, text=True, timeout=60)

    def ctl_ok(self, *args):
        p = self.ctl(*args)
        self.assertEqual(p.returncode, 0, (args, p.stdout, p.stderr))
        return p.stdout

    def test_offline_list_and_show_equal_online(self):
        fifo = os.path.join(self.dir, "actpid")
        os.mkfifo(fifo)
        block = os.path.join(self.dir, "block.sh")
        with open(block, "w") as f:
            f.write('#!/bin/sh\ncat > /dev/null\necho "$$" > "%s"\nexec sleep 600\n' % fifo)
        schedules = {
            # no command: each phase completes without a process (fast)
            "quick": {"Schedule": CRON, "Mandate": ONE},
            "bad": {"Schedule": CRON, "Mandate": ONE,
                    "Exec": {"Act": "/bin/sh -c 'echo nope >&2; exit 3'"}},
            "slow": {"Schedule": CRON, "Mandate": ONE, "Exec": {"Act": "/bin/sh " + block}},
        }
        conf = write_config(self.dir, self.state, schedules,
                            daemon_extra="GracefulTimeoutSec=1\nMaxConcurrentMandates=64\n"
                            "KeepFinished=100000\n")
        self.d = Daemon(self.state, config=conf, notify=self.notify)
        self.notify.wait_ready()
        self.c = Client(self.d.socket_path, timeout=120)
        t0 = time.monotonic()
        # pipelined fires: each reply comes once the fire is durable
        for i in range(N):
            sched = "bad" if i % 7 == 3 else "quick"
            self.c.send_raw(json.dumps({"v": 1, "id": i, "cmd": "fire", "args": {
                "schedule": sched, "at": at(i)}}).encode() + b"\n")
        ids = [None] * N
        for _ in range(N):
            r = self.c.recv_reply()  # in the order they became durable
            self.assertTrue(r["ok"], r)
            ids[r["id"]] = r["result"]["mandate"]
        bad = {ids[i] for i in range(N) if i % 7 == 3}
        # every one ended and archived (summary and archive written)
        deadline = time.monotonic() + 120
        while self.d.log().count(": WAL archived") < N:
            self.assertLess(time.monotonic(), deadline, self.d.log()[-3000:])
            time.sleep(0.05)  # polling the log for a count, with a deadline
        retried = sorted(bad)[0]
        r = self.c.call("retry", mandate=retried)
        self.assertTrue(r["ok"], r)
        retry = r["result"]["mandate"]
        self.d.wait_log("mandate %s: WAL archived" % retry)
        slow = self.c.call("fire", schedule="slow", at=at(N))["result"]["mandate"]
        with open(fifo) as f:  # blocks until the act runs
            self.actpid = int(f.read().strip())
        elapsed = time.monotonic() - t0

        online_list = self.ctl_ok("--json", "list", "--limit", "0")
        rows = json.loads(online_list)["mandates"]
        self.assertEqual(len(rows), N + 2)
        by_id = {x["id"]: x for x in rows}
        self.assertEqual(by_id[slow]["status"], "running")
        self.assertEqual(by_id[retried]["status"], "failed")
        if os.environ.get("KAIROS_OFFLINE_SHOW_ALL"):
            sample = list(by_id)
        else:
            sample = [x["id"] for x in rows[::10]] + [slow, retried, retry]
        online_show = {m: self.ctl_ok("--json", "show", m) for m in sample}
        online_pages = [self.ctl_ok("--json", "list", "--limit", "7"),
                        self.ctl_ok("--json", "list", "--status", "failed", "--limit", "5",
                                    "--after", rows[3]["id"]),
                        self.ctl_ok("--json", "list", "--schedule", "bad", "--since", at(N // 2))]
        online_text = self.ctl_ok("list", "--limit", "20")
        online_show_text = self.ctl_ok("show", retried)

        # kairosd dies mid-act
        self.d.kill()
        dead = self.d.socket_path
        before = snapshot(self.state)

        def offline(*args):
            return self.ctl(*args, socket=dead)

        p = offline("--json", "list", "--limit", "0", "--state-dir", self.state)
        self.assertEqual(p.returncode, 0, p.stderr)
        off_rows = json.loads(p.stdout)["mandates"]
        self.assertEqual([x["id"] for x in off_rows], [x["id"] for x in rows])
        for on, off in zip(rows, off_rows):
            if on["id"] == slow:
                for k in LIVE_ONLY:
                    on.pop(k)
                    off.pop(k)
            self.assertEqual(off, on, on["id"])
        self.assertEqual(json.loads(p.stdout)["total"], N + 2)
        # the interrupted one says so
        off_slow = next(x for x in json.loads(p.stdout)["mandates"] if x["id"] == slow)
        self.assertEqual(off_slow["status"], "interrupted")
        self.assertIn("kairosd is not running", off_slow["reason"])

        for m in sample:
            p = offline("--json", "show", m, "--state-dir", self.state)
            self.assertEqual(p.returncode, 0, p.stderr)
            if m != slow:
                self.assertEqual(p.stdout, online_show[m], m)  # byte for byte
                continue
            on, off = json.loads(online_show[m]), json.loads(p.stdout)
            self.assertEqual((on.pop("status"), off.pop("status")), ("running", "interrupted"))
            on.pop("reason", None)
            off.pop("reason", None)
            self.assertEqual(off, on)
            self.assertEqual(off["plans"][0]["steps"][3]["status"], "executing")
        self.assertEqual(json.loads(online_show[retried])["retried_by"], [retry])
        # the pages, the filters, the text views

        def live_only_out(text):
            doc = json.loads(text)
            for x in doc["mandates"]:
                if x["id"] == slow:
                    for k in LIVE_ONLY:
                        x.pop(k)
            return doc

        pages = [offline("--json", "list", "--limit", "7", "--state-dir", self.state).stdout,
                 offline("--json", "list", "--status", "failed", "--limit", "5", "--after",
                         rows[3]["id"], "--state-dir", self.state).stdout,
                 offline("--json", "list", "--schedule", "bad", "--since", at(N // 2),
                         "--state-dir", self.state).stdout]
        self.assertEqual([live_only_out(x) for x in pages],
                         [live_only_out(x) for x in online_pages])
        text = offline("list", "--limit", "20", "--state-dir", self.state).stdout
        # (the columns widen for the interrupted row's status and reason)
        self.assertEqual([x.split() for x in text.splitlines() if slow not in x],
                         [x.split() for x in online_text.splitlines() if slow not in x])
        self.assertIn("interrupted", next(x for x in text.splitlines() if slow in x))
        self.assertEqual(offline("show", retried, "--state-dir", self.state).stdout,
                         online_show_text)
        # a unique prefix, as online
        self.assertEqual(offline("--json", "show", retried[:-1], "--state-dir",
                                 self.state).stdout, online_show[retried])
        # nothing written
        self.assertEqual(snapshot(self.state), before)
        print("%d mandates in %.1f s; offline list and show compared" % (N + 2, elapsed),
              file=sys.stderr)
        # and kairosd itself says the same after its restart (the registry
        # it rebuilds from the same files: plan, start and end included)
        self.kill_act()
        self.c.close()
        self.d.proc.stderr.close()
        self.notify.clear()
        self.d = Daemon(self.state, config=conf, notify=self.notify)
        self.notify.wait_ready()
        self.c = Client(self.d.socket_path, timeout=120)
        again = json.loads(self.ctl_ok("--json", "list", "--limit", "0"))["mandates"]
        self.assertEqual([x for x in again if x["id"] != slow],
                         [x for x in rows if x["id"] != slow])

    def test_duration_leaves_out_downtime(self):
        # kill -9 while observe runs, kairosd down for PAUSE s, observe runs
        # again after the restart: list's DURATION (online, offline and
        # after another restart) leaves the time kairosd was down out, as
        # show's step durations do
        self.downtime_case(kill=True)

    def test_duration_leaves_out_downtime_after_a_stop(self):
        # the same with a graceful stop: observe is killed at the stop
        # (GracefulTimeoutSec=1) and recovery runs it again after the restart
        self.downtime_case(kill=False)

    def downtime_case(self, kill):
        pause = float(os.environ.get("KAIROS_DOWNTIME_SEC", "2"))
        fifo = os.path.join(self.dir, "actpid")
        os.mkfifo(fifo)
        obs = os.path.join(self.dir, "obs.sh")
        with open(obs, "w") as f:
            f.write('#!/bin/sh\ncat > /dev/null\n[ "$KAIROS_ATTEMPT" = 1 ] || exit 0\n'
                    'echo "$$" > "%s"\nexec sleep 600\n' % fifo)
        conf = write_config(self.dir, self.state,
                            {"obs": {"Schedule": CRON, "Mandate": ONE,
                                     "Exec": {"Observe": "/bin/sh " + obs}}},
                            daemon_extra="GracefulTimeoutSec=1\n")

        def start():
            self.notify.clear()
            self.d = Daemon(self.state, config=conf, notify=self.notify)
            self.notify.wait_ready()
            self.c = Client(self.d.socket_path, timeout=60)

        def stop():
            self.c.close()
            self.c = None
            self.assertEqual(self.d.stop(), 0, self.d.log()[-3000:])
            self.d.proc.stderr.close()
            self.d = None

        start()
        m = self.c.call("fire", schedule="obs", at=at(0))["result"]["mandate"]
        with open(fifo) as f:  # blocks until observe runs
            self.actpid = int(f.read().strip())
        t_run = time.monotonic()
        if kill:
            self.d.kill()
            self.c.close()
            self.d.proc.stderr.close()
            self.kill_act()
        else:
            stop()  # observe killed after GracefulTimeoutSec=1
        down = time.monotonic()
        ran = down - t_run
        time.sleep(pause)  # the downtime measured (not a synchronization)
        start()
        downtime = time.monotonic() - down
        self.d.wait_log("mandate %s: WAL archived" % m)

        def duration(rows):
            return next(x for x in rows if x["id"] == m)["duration_ms"]

        online = duration(json.loads(self.ctl_ok("--json", "list"))["mandates"])
        stop()
        p = self.ctl("--json", "list", "--state-dir", self.state, socket="/nonexistent")
        self.assertEqual(p.returncode, 0, p.stderr)
        offline = duration(json.loads(p.stdout)["mandates"])
        start()
        again = duration(json.loads(self.ctl_ok("--json", "list"))["mandates"])
        print("%s: observe ran %.0f ms, kairosd down %.0f ms; DURATION online %s ms, "
              "offline %s ms, after a restart %s ms"
              % ("kill -9" if kill else "stop", ran * 1000, downtime * 1000, online, offline,
                 again), file=sys.stderr)
        self.assertGreaterEqual(downtime, pause)
        self.assertEqual((offline, again), (online, online))
        self.assertLess(online, (ran + pause / 2) * 1000, "the downtime counted")

    def test_bad_input(self):
        os.makedirs(os.path.join(self.state, "mandates"))
        sock = os.path.join(self.dir, "none.sock")
        p = self.ctl("list", "--state-dir", "", socket=sock)
        self.assertEqual(p.returncode, 64, p.stderr)
        self.assertIn("list: --state-dir needs a directory", p.stderr)
        p = self.ctl("show", "x", "--state-dir", os.path.join(self.dir, "nope"), socket=sock)
        self.assertEqual(p.returncode, 66, p.stderr)
        self.assertIn("nope: No such file or directory", p.stderr)
        p = self.ctl("list", "--status", "bogus", "--state-dir", self.state, socket=sock)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("args.status: no status 'bogus' (one of: runnable, running", p.stderr)
        p = self.ctl("show", "mnd_nope", "--state-dir", self.state, socket=sock)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertEqual(p.stderr, "kairosctl: no mandate mnd_nope\n")
        p = self.ctl("list", "--schedule", "nightly", "--state-dir", self.state, socket=sock)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("no mandate of schedule 'nightly' is kept in", p.stderr)
        with open(os.path.join(self.state, "mandates", "mnd_x.json"), "w") as f:
            f.write("{")
        p = self.ctl("--json", "list", "--state-dir", self.state, socket=sock)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("ignoring the mandate summary", p.stderr)
        self.assertEqual(json.loads(p.stdout)["mandates"], [])
        # without --state-dir and no kairosd: online, as before
        p = self.ctl("list", socket=sock)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("is kairosd running?", p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
