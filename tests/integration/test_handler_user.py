#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""HandlerUser=: handlers run as a user that owns nothing of kairosd's.

- kairosd (root here) runs a handler as nobody: uid, gid, groups, no
  capability, HOME/USER of nobody; the handler can neither signal kairosd
  nor write its state directory;
- start errors, each a clear line and exit 1: no such user, root, kairosd's
  own user, and kairosd without CAP_SETUID/CAP_SETGID/CAP_KILL (started as
  nobody);
- a reload keeps the user resolved at start, and says so;
- without HandlerUser= kairosd says at start that handlers run as its own
  user.

The hostile handler in its cgroup (its limits, kairosd's cgroup) is in
test_cgroup.py.  Needs root and setpriv(1); exit 77 otherwise."""
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kairos_harness import KAIROSD, Client, Daemon, NotifySocket, write_config  # noqa: E402

SKIP = 77
CRON = {"Cron": "0 0 1 1 *"}

# What the handler is and may do: its ids and capabilities, and the outcome
# of a signal (argv[2]) to kairosd (its parent) and of a write into the state
# directory (argv[1]).
PROBE = r"""import json, os, signal, sys
st = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
res = {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(),
       "cap_eff": st["CapEff"].strip(), "cap_prm": st["CapPrm"].strip(),
       "cap_inh": st["CapInh"].strip(), "cap_amb": st["CapAmb"].strip(),
       "home": os.environ.get("HOME"), "user": os.environ.get("USER"), "cwd": os.getcwd()}
for what, fn in (("kill", lambda: os.kill(os.getppid(), int(sys.argv[2]))),
                 ("write", lambda: open(os.path.join(sys.argv[1], "hostile"), "w").close())):
    try:
        fn()
        res[what] = "done"
    except OSError as e:
        res[what] = e.strerror
print(json.dumps(res))
"""


class HandlerUser(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-hu-")
        os.chmod(self.dir, 0o755)
        self.state = os.path.join(self.dir, "state")
        self.probe = os.path.join(self.dir, "probe.py")
        with open(self.probe, "w") as f:
            f.write(PROBE)
        self.d = None
        self.c = None
        self.notify = NotifySocket(self.dir)

    def tearDown(self):
        if self.c:
            self.c.close()
        if self.d and self.d.proc.poll() is None:
            self.assertEqual(self.d.stop(), 0, self.d.log()[-3000:])
        self.notify.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def config(self, extra, schedules=None):
        return write_config(self.dir, self.state, schedules, daemon_extra=extra)

    def start_fails(self, extra, want, user=None):
        conf = self.config(extra)
        cmd = [KAIROSD, "-c", conf]
        if user:
            os.makedirs(self.state, exist_ok=True)
            pw = pwd.getpwnam(user)
            os.chown(self.state, pw.pw_uid, pw.pw_gid)
            cmd = ["setpriv", "--reuid=%d" % pw.pw_uid, "--regid=%d" % pw.pw_gid, "--clear-groups",
                   "--inh-caps=-all"] + cmd
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "JOURNAL_STREAM")}
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30, env=env)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn(want, p.stderr)
        self.assertNotIn("ready", p.stderr)

    def test_no_such_user(self):
        self.start_fails("HandlerUser=kairos-no-such-user\n",
                         "HandlerUser=kairos-no-such-user: no such user")

    def test_root_and_own_user_refused(self):
        self.start_fails("HandlerUser=root\n", "HandlerUser=root is root")

    def test_without_the_capabilities_kairosd_does_not_start(self):
        self.start_fails("HandlerUser=daemon\nSocketGroup=nogroup\n",
                         "HandlerUser=daemon needs the capabilities CAP_SETUID CAP_SETGID "
                         "CAP_KILL, which kairosd lacks", user="nobody")

    def probe_config(self, extra, sig):
        return self.config(extra, {"probe": {
            "Schedule": CRON, "Mandate": {"MaxCycles": "1"},
            "Exec": {"Observe": "python3 %s %s %d" % (self.probe, self.state, sig),
                     "WorkingDirectory": "/"}}})

    def run_probe(self, extra, sig, at="2030-01-01T00:00:00Z"):
        if not self.d:
            conf = self.probe_config(extra, sig)
            self.d = Daemon(self.state, config=conf, notify=self.notify)
            self.notify.wait_ready(timeout=15)
            self.c = Client(self.d.socket_path)
        r = self.c.call("fire", schedule="probe", at=at)
        self.assertTrue(r["ok"], r)
        m = r["result"]["mandate"]
        self.d.wait_log("mandate %s done" % m)
        r = self.c.call("show", mandate=m)
        self.assertTrue(r["ok"], r)
        step = next(s for p in r["result"]["plans"] for s in p["steps"]
                    if s["step_id"] == "observe_001")
        return step["result"]

    def test_handler_runs_as_handler_user(self):
        nobody = pwd.getpwnam("nobody")
        got = self.run_probe("HandlerUser=nobody\n", 9)
        self.d.wait_log("handlers run as user nobody (uid %d)" % nobody.pw_uid)
        self.assertEqual((got["uid"], got["euid"], got["gid"]),
                         (nobody.pw_uid, nobody.pw_uid, nobody.pw_gid), got)
        self.assertNotIn(0, got["groups"], got)
        for k in ("cap_eff", "cap_prm", "cap_inh", "cap_amb"):
            self.assertEqual(int(got[k], 16), 0, (k, got))
        self.assertEqual((got["home"], got["user"]), (nobody.pw_dir, "nobody"), got)
        self.assertEqual(got["kill"], "Operation not permitted", got)
        self.assertEqual(got["write"], "Permission denied", got)
        self.assertIsNone(self.d.proc.poll(), "kairosd lives")
        self.assertFalse(os.path.exists(os.path.join(self.state, "hostile")))

    def test_a_reload_keeps_the_running_handler_user(self):
        nobody = pwd.getpwnam("nobody")
        self.assertEqual(self.run_probe("HandlerUser=nobody\n", 0)["uid"], nobody.pw_uid)
        self.probe_config("HandlerUser=daemon\n", 0)
        r = self.c.call("reload")
        self.assertTrue(r["ok"], r)
        self.d.wait_log("reload: HandlerUser= changes take effect at the next restart")
        got = self.run_probe("", 0, at="2030-01-02T00:00:00Z")
        self.assertEqual(got["uid"], nobody.pw_uid, got)

    def test_without_handler_user_kairosd_says_so(self):
        # (signal 0: the permission check of a kill, which kairosd's own
        # user passes)
        got = self.run_probe("", 0)
        self.d.wait_log("handlers run as kairosd's own user (HandlerUser= is not set)")
        self.assertEqual((got["uid"], got["kill"]), (os.getuid(), "done"), got)


if __name__ == "__main__":
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        print("SKIP: needs root and setpriv(1)", file=sys.stderr)
        sys.exit(SKIP)
    unittest.main(verbosity=2)
