#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Handlers in their own cgroups, outside systemd: kairosd is started alone
in a fresh cgroup v2 directory (as systemd's Delegate=yes would give it),
seen at /sys/fs/cgroup in a private mount namespace.  A handler's setsid
grandchild must not outlive its step and the handler's cgroup must be gone;
where the hierarchy has the memory and pids controllers, MemoryMax= ends a
greedy handler with error_class oom and TasksMax= limits its forks.

Needs root, unshare(1) and a writable cgroup2 mount; exit 77 otherwise.
(tests/systemd/test_systemd.py checks the same under a real systemd.)"""
import glob
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kairos_harness  # noqa: E402
from kairos_harness import Client, Daemon, NotifySocket, write_config  # noqa: E402

SKIP = 77
CRON = {"Cron": "0 0 1 1 *"}


def cgroup2_mount():
    with open("/proc/self/mounts") as f:
        for line in f:
            dev, mnt, fstype = line.split()[:3]
            if fstype == "cgroup2":
                return mnt
    return None


def poll(cond, what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.05)


def read(path):
    with open(path) as f:
        return f.read()


def procs_with(marker):
    found = []
    for p in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(p, "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(p.split("/")[2]))
        except OSError:
            pass
    return found


class CgroupCase(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-cg-")
        self.state = os.path.join(self.dir, "state")
        self.notify = NotifySocket(self.dir)
        self.cg = os.path.join(MOUNT, "kairos-it-%d-%s" % (os.getpid(), self._testMethodName[-20:]))
        os.mkdir(self.cg)
        wrapper = os.path.join(self.dir, "kairosd-in-cgroup")
        bind = "" if MOUNT == "/sys/fs/cgroup" else "mount --bind %s /sys/fs/cgroup && " % MOUNT
        with open(wrapper, "w") as f:
            f.write("#!/bin/sh\nexec unshare -m --propagation private /bin/sh -c "
                    "'%secho $$ > %s/cgroup.procs && exec \"$@\"' sh %s \"$@\"\n"
                    % (bind, "/sys/fs/cgroup/" + os.path.basename(self.cg),
                       kairos_harness.KAIROSD))
        os.chmod(wrapper, 0o755)
        kairos_harness.KAIROSD = wrapper
        self.d = None
        self.c = None

    def tearDown(self):
        kairos_harness.KAIROSD = REAL_KAIROSD
        if self.c:
            self.c.close()
        if self.d and self.d.proc.poll() is None:
            self.assertEqual(self.d.stop(), 0, self.d.log()[-3000:])
        self.notify.close()
        # what systemd does when the service stops: kill and remove the tree
        for sub in sorted(glob.glob(self.cg + "/*/"), reverse=True):
            try:
                with open(sub + "cgroup.kill", "w") as f:
                    f.write("1")
            except OSError:
                pass
            poll(lambda: "populated 0" in read(sub + "cgroup.events"), "empty " + sub)
            os.rmdir(sub)
        os.rmdir(self.cg)
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, schedules):
        conf = write_config(self.dir, self.state, schedules, daemon_extra="LogLevel=debug\n")
        self.d = Daemon(self.state, config=conf, notify=self.notify)
        try:
            self.notify.wait_ready(timeout=15)
        except TimeoutError:
            raise AssertionError("kairosd not ready:\n" + self.d.log()[-3000:])
        self.c = Client(self.d.socket_path)
        line = self.d.wait_log("handler cgroups below")
        self.assertIn(self.cg[len(MOUNT):], line)
        return line

    def run_mandate(self, schedule):
        r = self.c.call("fire", schedule=schedule, at="2030-01-01T00:00:00Z")
        self.assertTrue(r["ok"], r)
        m = r["result"]["mandate"]
        self.d.wait_log("mandate %s " % m)
        path = os.path.join(self.state, "archive", m + ".wal.jsonl.gz")
        poll(lambda: os.path.exists(path), "the archive of " + m)
        with gzip.open(path) as gz:
            return [json.loads(l) for l in gz.read().splitlines() if l.strip()]

    def handler_cgroups(self):
        return [p for p in os.listdir(self.cg) if p.startswith("h-")]

    def test_setsid_grandchild_does_not_outlive_its_step(self):
        marker = "98765%d" % os.getpid()
        fifo = os.path.join(self.dir, "detached")
        os.mkfifo(fifo)
        # the handler returns only once its grandchild has left its session
        # and process group (it writes to the fifo after setsid)
        self.start({"esc": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"}, "Exec": {
            "Observe": "/bin/sh -c \"setsid /bin/sh -c 'echo >%s; exec sleep %s' "
                       "</dev/null >/dev/null 2>&1 & read x <%s; echo '{}'\""
                       % (fifo, marker, fifo)}}})
        self.assertEqual(os.listdir(self.cg + "/daemon") != [], True)
        with open(self.cg + "/daemon/cgroup.procs") as f:
            self.assertIn(str(self.d.proc.pid), f.read().split(), "kairosd moved into daemon/")
        recs = self.run_mandate("esc")
        done = [r for r in recs if r.get("step_id") == "observe_001" and r.get("status") == "completed"]
        self.assertTrue(done, recs)
        poll(lambda: not procs_with(marker), "the setsid grandchild to be gone")
        poll(lambda: not self.handler_cgroups(), "the handler cgroups to be removed")

    def need(self, line, controller):
        if controller in line.partition("controllers not available:")[2]:
            self.skipTest("no %s controller in this cgroup hierarchy" % controller)

    def test_memory_max_fails_with_oom(self):
        line = self.start({"greedy": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"}, "Exec": {
            "Observe": "python3 -c \"b = bytearray(200 << 20); print('{}')\"",
            "MemoryMax": "20M"}}})
        self.need(line, "memory")
        recs = self.run_mandate("greedy")
        failed = [r for r in recs if r.get("step_id") == "observe_001" and r.get("status") == "failed"]
        self.assertTrue(failed, recs)
        self.assertEqual(failed[-1]["error_class"], "oom", failed[-1])
        poll(lambda: not self.handler_cgroups(), "the handler cgroups to be removed")

    def test_tasks_max_limits_forks(self):
        line = self.start({"forky": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"}, "Exec": {
            "Observe": "python3 -c \"import subprocess; "
                       "ps = [subprocess.Popen(['sleep', '30']) for _ in range(8)]; print('{}')\"",
            "TasksMax": "4"}}})
        self.need(line, "pids")
        recs = self.run_mandate("forky")
        failed = [r for r in recs if r.get("step_id") == "observe_001" and r.get("status") == "failed"]
        self.assertTrue(failed, recs)
        self.assertEqual(failed[-1]["error_class"], "exit_status", failed[-1])
        self.assertIn("Resource temporarily unavailable", failed[-1]["error_msg"])
        poll(lambda: not self.handler_cgroups(), "the handler cgroups to be removed")


REAL_KAIROSD = kairos_harness.KAIROSD
MOUNT = None

if __name__ == "__main__":
    if os.geteuid() != 0 or not shutil.which("unshare"):
        print("SKIP: needs root and unshare(1)", file=sys.stderr)
        sys.exit(SKIP)
    MOUNT = cgroup2_mount()
    probe = MOUNT and os.path.join(MOUNT, "kairos-it-probe-%d" % os.getpid())
    try:
        os.mkdir(probe)
        os.rmdir(probe)
    except (OSError, TypeError) as e:
        print("SKIP: no writable cgroup2 mount (%s)" % e, file=sys.stderr)
        sys.exit(SKIP)
    unittest.main(verbosity=2)
