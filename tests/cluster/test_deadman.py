#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The deadman of cluster mode (docs/design.md §14), end to end: one kairosd
on a private PostgreSQL (pg_fixture.py), LeaseSec=3, running a handler that
sleeps (with a child in its process group).

- while kairosd renews its lease, the handler lives on well past LeaseSec;
- once kairosd is SIGSTOPped, nothing in kairosd can act: the handler's
  whole process group is killed by the deadman (kairosd-deadman, its child)
  within the lease, and the deadman itself lives on;
- continued, kairosd stops cleanly, and its deadman with it;
- with handler cgroups (kairosd started alone in a fresh cgroup v2
  directory, as Delegate=yes would give it; root only), a grandchild that
  left the handler's process group (setsid) dies with it: the deadman kills
  the handler's cgroup too.

Environment: KAIROSD, KAIROSCTL.  Skipped (77) in a build without
-Dpostgres=enabled or without the PostgreSQL server binaries.
"""
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import pg_fixture  # noqa: E402
from kairos_harness import Daemon, write_config  # noqa: E402

KAIROSD = os.environ.get("KAIROSD", "kairosd")
KAIROSCTL = os.environ.get("KAIROSCTL", "kairosctl")
SKIP = 77
LEASE = 3


def running(pid):
    """pid exists and has not exited (a zombie has)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def wait_for(cond, timeout):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)  # polling a condition with a deadline
    return True


def read_pid(path):
    try:
        with open(path) as f:
            text = f.read().strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


def children(pid):
    """(pid, name) of the children of pid."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid:
            out.append((int(entry), name))
    return out


def built_with_postgres():
    with tempfile.TemporaryDirectory() as d:
        conf = os.path.join(d, "kairosd.conf")
        with open(conf, "w") as f:
            f.write("[Daemon]\nStateDirectory=%s\n[Cluster]\nBackend=postgres\n"
                    "ConnectionString=host=/nonexistent\nNodeName=n1\n" % d)
        out = subprocess.run([KAIROSD, "-c", conf, "--check-config"], capture_output=True,
                             text=True, timeout=30)
    return "without PostgreSQL support" not in out.stderr


class Deadman(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pg = pg_fixture.PgServer().start()

    @classmethod
    def tearDownClass(cls):
        cls.pg.stop()

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kdm")
        self.daemon = None
        self.cgroups = []

    def tearDown(self):
        if self.daemon:
            if self.daemon.proc.poll() is None:
                os.kill(self.daemon.proc.pid, signal.SIGCONT)
            self.daemon.kill()
        for name in ("handler.pid", "child.pid", "escaped.pid"):
            pid = read_pid(os.path.join(self.dir, name))
            if pid and running(pid):
                os.kill(pid, signal.SIGKILL)
        for cg in self.cgroups:
            remove_cgroup_tree(cg)
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, db, cgroup=None):
        conninfo = self.pg.createdb(db)
        state = os.path.join(self.dir, "state")
        os.makedirs(state)
        handler = os.path.join(self.dir, "handler.sh")
        with open(handler, "w") as f:
            # a child in the handler's process group, one that left it
            # (setsid), then the handler itself
            f.write("#!/bin/sh\nsleep 1000 &\necho $! > {d}/child.pid\n"
                    "setsid sleep 1000 </dev/null >/dev/null 2>&1 &\n"
                    "echo $! > {d}/escaped.pid\n"
                    "echo $$ > {d}/handler.pid\nexec sleep 1000\n".format(d=self.dir))
        os.chmod(handler, 0o755)
        conf = write_config(self.dir, state, {
            "slow": {"Schedule": {"Cron": "0 0 1 1 *"}, "Exec": {"Observe": handler}}},
            daemon_extra="[Cluster]\nBackend=postgres\nConnectionString=%s\nNodeName=n1\n"
                         "LeaseSec=%d\n" % (conninfo, LEASE))
        extra = {}
        if cgroup:
            # kairosd alone in its cgroup: it joins it before exec
            def join():
                with open(cgroup + "/cgroup.procs", "w") as f:
                    f.write("0")
            extra["preexec_fn"] = join
        self.daemon = Daemon(state, config=conf, **extra)
        self.daemon.wait_log("ready", timeout=60)
        if cgroup:
            self.daemon.wait_log("handler cgroups below", timeout=10)
        out = subprocess.run([KAIROSCTL, "--socket", self.daemon.socket_path, "fire", "slow"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr + self.daemon.log())
        paths = [os.path.join(self.dir, n) for n in ("handler.pid", "child.pid", "escaped.pid")]
        self.assertTrue(wait_for(lambda: all(read_pid(p) for p in paths), 60),
                        self.daemon.log())
        return [read_pid(p) for p in paths]

    def stop_and_watch(self, pids):
        """SIGSTOP kairosd after twice the lease of renewals: pids must die
        within the lease, by the deadman's hand alone."""
        kd = self.daemon.proc.pid
        deadmen = [p for p, name in children(kd) if name == "kairosd-deadman"]
        self.assertEqual(len(deadmen), 1, children(kd))
        # renewed: alive for twice the lease
        t = time.monotonic() + 2 * LEASE
        self.assertFalse(wait_for(lambda: not all(running(p) for p in pids),
                                  t - time.monotonic()), self.daemon.log())
        os.kill(kd, signal.SIGSTOP)
        stopped = time.monotonic()
        self.assertTrue(wait_for(lambda: not any(running(p) for p in pids), 5 * LEASE),
                        "outlived the lease: %s" % [p for p in pids if running(p)])
        died = time.monotonic() - stopped
        self.assertLess(died, LEASE + 1.5)  # within the lease (a loaded machine's slack)
        self.assertTrue(running(deadmen[0]))
        self.assertTrue(running(kd))  # stopped, not dead: nothing but the deadman acted
        os.kill(kd, signal.SIGCONT)
        self.assertEqual(self.daemon.stop(), 0, self.daemon.log())
        self.assertTrue(wait_for(lambda: not running(deadmen[0]), 30))

    def test_stopped_kairosd_handlers_die_at_the_lease(self):
        handler, child, escaped = self.start("stopped")
        self.stop_and_watch([handler, child])
        # without handler cgroups the setsid one is out of reach (design §14)

    def test_handler_cgroup_dies_too(self):
        mount = cgroup2_mount()
        if os.geteuid() != 0 or not mount:
            self.skipTest("needs root and a cgroup2 mount")
        cg = os.path.join(mount, "kairos-dm-%d" % os.getpid())
        try:
            os.mkdir(cg)
        except OSError as e:
            self.skipTest("cannot create a cgroup v2 directory: %s" % e)
        self.cgroups.append(cg)
        pids = self.start("cgroup", cgroup=cg)
        # it left the group (once setsid(1) has run)
        self.assertTrue(wait_for(lambda: os.getpgid(pids[2]) != pids[0], 30))
        self.stop_and_watch(pids)


def cgroup2_mount():
    with open("/proc/self/mounts") as f:
        for line in f:
            mnt, fstype = line.split()[1:3]
            if fstype == "cgroup2":
                return mnt
    return None


def read_file(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return "populated 0"  # gone


def remove_cgroup_tree(top):
    """Kill and remove a cgroup v2 directory and what is below it."""
    for sub in sorted(glob.glob(top + "/**/", recursive=True), reverse=True):
        try:
            with open(sub + "cgroup.kill", "w") as f:
                f.write("1")
        except OSError:
            pass
        wait_for(lambda: "populated 0" in read_file(sub + "cgroup.events"), 10)
        try:
            os.rmdir(sub)
        except OSError:
            pass


if __name__ == "__main__":
    if not pg_fixture.find_bindir():
        print("skipped: " + pg_fixture.skip_reason())
        sys.exit(SKIP)
    if not built_with_postgres():
        print("skipped: kairosd was built without PostgreSQL support (-Dpostgres=enabled)")
        sys.exit(SKIP)
    unittest.main(verbosity=2)
