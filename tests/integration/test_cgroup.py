#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Handlers in their own cgroups, outside systemd: kairosd is started alone
in fresh cgroup directories (as systemd's Delegate=yes would give it), three
ways, each a class:

- V2: a cgroup v2 directory, seen at /sys/fs/cgroup in a private mount
  namespace (a unified host; on a hybrid host the v2 hierarchy there has no
  controllers, and the limit cases say so and skip);
- Hybrid: the v2 directory for the kill, and directories in the cgroup v1
  hierarchies of memory, pids and cpu for the limits (a hybrid host as it is);
- V1: the v1 directories alone (kairosd's v2 cgroup is not its own), so the
  kill works from the v1 cgroups' lists.

A handler's setsid grandchild must not outlive its step and the handler's
cgroups must be gone; kill -9 of kairosd during a `kairosctl tool run`
kills the handler's setsid grandchild but not the call, nor when the next
kairosd, which holds the step for it, is killed too; the third completes it; a hostile handler run as HandlerUser=nobody can
neither lift its limits nor leave its cgroup nor touch kairosd; where the controllers are there, MemoryMax= ends a
greedy handler with error_class oom, TasksMax= limits its forks and
CPUQuota= throttles a busy loop.

Needs root and unshare(1); a class without the hierarchies it needs skips
(saying which); exit 77 when no class can run.
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
V1_CONTROLLERS = ("memory", "pids", "cpu")


def cgroup2_mount():
    with open("/proc/self/mounts") as f:
        for line in f:
            dev, mnt, fstype = line.split()[:3]
            if fstype == "cgroup2":
                return mnt
    return None


def v1_mounts():
    """{controller: mount point} of the cgroup v1 hierarchies of V1_CONTROLLERS."""
    found = {}
    with open("/proc/self/mounts") as f:
        for line in f:
            dev, mnt, fstype, opts = line.split()[:4]
            if fstype == "cgroup":
                for c in V1_CONTROLLERS:
                    if c in opts.split(","):
                        found.setdefault(c, mnt)
    return found


def own_v1_path(controller):
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctls, path = line.rstrip("\n").split(":", 2)
            if controller in ctls.split(","):
                return path
    return None


def writable_dir(parent, name):
    """Can a cgroup be made below parent?  None, or why not."""
    probe = os.path.join(parent, name)
    try:
        os.mkdir(probe)
        os.rmdir(probe)
        return None
    except OSError as e:
        return "%s: %s" % (parent, e)


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


def remove_cgroup_tree(top):
    """What systemd does when a service stops: kill and remove the tree
    (cgroup.kill in v2; in v1, kill what cgroup.procs lists until empty)."""
    for sub in sorted(glob.glob(top + "/**/", recursive=True), reverse=True):
        if os.path.exists(sub + "cgroup.events"):
            try:
                with open(sub + "cgroup.kill", "w") as f:
                    f.write("1")
            except OSError:
                pass
            poll(lambda: "populated 0" in read(sub + "cgroup.events"), "empty " + sub)
        else:
            def empty():
                pids = read(sub + "cgroup.procs").split()
                for pid in pids:
                    try:
                        os.kill(int(pid), 9)
                    except OSError:
                        pass
                return not pids
            poll(empty, "empty " + sub)
        poll(lambda: not os.path.exists(sub) or try_rmdir(sub), "removed " + sub)


def try_rmdir(path):
    try:
        os.rmdir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


# The busy loop of the CPUQuota= case: two seconds of wall time, then its
# CPU time over wall time, and the throttling its cpu cgroup counted.
CPU_HOG = """import json, sys, time
mount, controller, out = sys.argv[1:4]
path = None
for line in open("/proc/self/cgroup").read().splitlines():
    _, ctls, p = line.split(":", 2)
    if (controller == "" and ctls == "") or (controller and controller in ctls.split(",")):
        path = p
t0, c0 = time.monotonic(), time.process_time()
while time.monotonic() - t0 < 2.0:
    pass
ratio = (time.process_time() - c0) / (time.monotonic() - t0)
cg = mount + path
stat = dict(l.split() for l in open(cg + "/cpu.stat").read().splitlines())
quota = open(cg + ("/cpu.max" if controller == "" else "/cpu.cfs_quota_us")).read().strip()
json.dump({"ratio": ratio, "nr_throttled": int(stat["nr_throttled"]), "quota": quota, "cgroup": cg},
          open(out, "w"))
print("{}")
"""


# A hostile handler, run as HandlerUser=nobody by a root kairosd: it tries
# to lift each limit of its own cgroups, to move a setsid grandchild into
# kairosd's cgroup (v2: <service>/daemon; v1: the service's), to SIGKILL
# kairosd and to write into the state directory, writes what happened to
# OUT/report.json, then takes 200 MiB.
HOSTILE = r"""import json, os, signal, subprocess, sys
out, state, marker = sys.argv[1:4]
res = {}
def attempt(what, fn):
    try:
        fn()
        res[what] = "done"
    except OSError as e:
        res[what] = e.strerror
def write(path, text):
    def fn():
        with open(path, "w") as f:
            f.write(text)
    return fn
gc = subprocess.Popen(["sleep", marker], start_new_session=True)
own = [l.rstrip("\n").split(":", 2) for l in open("/proc/self/cgroup")]
for line in open("/proc/self/mounts"):
    mnt, fstype, opts = line.split()[1:4]
    if fstype == "cgroup2":
        path = next((p for _, c, p in own if c == ""), None)
    elif fstype == "cgroup":
        ctl = [o for o in opts.split(",") if o in ("memory", "pids", "cpu")]
        path = next((p for _, c, p in own if ctl and ctl[0] in c.split(",")), None)
    else:
        continue
    d = mnt + (path or "")
    if not path or "/h-" not in path or not os.path.isdir(d):
        continue
    for f, v in (("memory.max", "max"), ("memory.limit_in_bytes", "-1"), ("pids.max", "max"),
                 ("cpu.max", "max"), ("cpu.cfs_quota_us", "-1")):
        if os.path.exists(os.path.join(d, f)):
            attempt(d + "/" + f, write(os.path.join(d, f), v))
    top = d.rsplit("/h-", 1)[0]
    top = top + "/daemon" if fstype == "cgroup2" else top
    attempt(top + "/cgroup.procs", write(top + "/cgroup.procs", str(gc.pid)))
attempt("kill kairosd", lambda: os.kill(os.getppid(), signal.SIGKILL))
attempt("state directory", write(os.path.join(state, "hostile"), "x"))
json.dump(res, open(os.path.join(out, "report.json"), "w"))
b = bytearray(200 << 20)
print("{}")
"""


class CgroupCase:
    """The cases; V2, Hybrid and V1Only below say which hierarchies kairosd gets."""
    USE_V2 = False     # a cgroup v2 directory of its own
    BIND_V2 = False    # ... seen at /sys/fs/cgroup (v1 hierarchies hidden)
    USE_V1 = False     # directories in the v1 hierarchies of memory, pids, cpu

    @classmethod
    def setUpClass(cls):
        why = cls.unavailable()
        if why:
            raise unittest.SkipTest(why)

    @classmethod
    def unavailable(cls):
        if cls.USE_V2:
            if not MOUNT:
                return "no cgroup2 mount"
            why = writable_dir(MOUNT, "kairos-it-probe-%d" % os.getpid())
            if why:
                return "no writable cgroup2 mount (%s)" % why
        if cls.USE_V1:
            if not V1:
                return "no cgroup v1 hierarchy of %s on this host" % " or ".join(V1_CONTROLLERS)
            for c, mnt in V1.items():
                why = writable_dir(mnt + own_v1_path(c), "kairos-it-probe-%d" % os.getpid())
                if why:
                    return "the cgroup v1 hierarchy of %s is not writable (%s)" % (c, why)
        return None

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-cg-")
        self.state = os.path.join(self.dir, "state")
        self.notify = NotifySocket(self.dir)
        name = "kairos-it-%d-%s" % (os.getpid(), self._testMethodName[-20:])
        # every cgroup kairosd starts in: (as it sees it, as we see it)
        self.cgs = []
        join = []
        if self.USE_V2:
            self.cg = os.path.join(MOUNT, name)
            os.mkdir(self.cg)
            seen = "/sys/fs/cgroup/" + name if self.BIND_V2 else self.cg
            self.cgs.append(self.cg)
            join.append(seen)
        if self.USE_V1:
            for c, mnt in sorted(V1.items()):
                d = mnt + own_v1_path(c).rstrip("/") + "/" + name
                if d in self.cgs:  # one hierarchy with several controllers
                    continue
                os.mkdir(d)
                self.cgs.append(d)
                join.append(d)
        if not self.USE_V2:
            self.cg = self.cgs[0]
        wrapper = os.path.join(self.dir, "kairosd-in-cgroup")
        bind = ("mount --bind %s /sys/fs/cgroup && " % MOUNT
                if self.BIND_V2 and MOUNT != "/sys/fs/cgroup" else "")
        joins = "".join("echo $$ > %s/cgroup.procs && " % d for d in join)
        with open(wrapper, "w") as f:
            f.write("#!/bin/sh\nexec unshare -m --propagation private /bin/sh -c "
                    "'%s%sexec \"$@\"' sh %s \"$@\"\n" % (bind, joins, kairos_harness.KAIROSD))
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
        for cg in self.cgs:
            remove_cgroup_tree(cg)
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, schedules, daemon_extra=""):
        conf = write_config(self.dir, self.state, schedules,
                            daemon_extra="LogLevel=debug\n" + daemon_extra)
        self.d = Daemon(self.state, config=conf, notify=self.notify)
        try:
            self.notify.wait_ready(timeout=15)
        except TimeoutError:
            raise AssertionError("kairosd not ready:\n" + self.d.log()[-3000:])
        self.c = Client(self.d.socket_path)
        line = self.d.wait_log("handler cgroups below")
        if self.USE_V2:
            self.assertIn(self.cg[len(MOUNT):], line)
        if self.USE_V1:
            for cg in self.cgs[1 if self.USE_V2 else 0:]:
                self.assertIn(cg, line)
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
        return [os.path.join(cg, p) for cg in self.cgs for p in os.listdir(cg)
                if p.startswith("h-")]

    def test_setsid_grandchild_does_not_outlive_its_step(self):
        marker = "98765%d" % os.getpid()
        fifo = os.path.join(self.dir, "detached")
        os.mkfifo(fifo)
        # the handler returns only once its grandchild has left its session
        # and process group (it writes to the fifo after setsid); it notes
        # the cgroups it runs in
        seen = os.path.join(self.dir, "seen")
        self.start({"esc": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"}, "Exec": {
            "Observe": "/bin/sh -c \"cat /proc/self/cgroup >%s; "
                       "setsid /bin/sh -c 'echo >%s; exec sleep %s' "
                       "</dev/null >/dev/null 2>&1 & read x <%s; echo '{}'\""
                       % (seen, fifo, marker, fifo)}}})
        if self.USE_V2:
            with open(self.cg + "/daemon/cgroup.procs") as f:
                self.assertIn(str(self.d.proc.pid), f.read().split(), "kairosd moved into daemon/")
        recs = self.run_mandate("esc")
        done = [r for r in recs if r.get("step_id") == "observe_001" and r.get("status") == "completed"]
        self.assertTrue(done, recs)
        # the handler ran in a cgroup of its own in every hierarchy given
        for cg in self.cgs:
            mnt = MOUNT if self.USE_V2 and cg == self.cgs[0] else \
                next(m for m in V1.values() if cg.startswith(m + "/"))
            self.assertIn(cg[len(mnt):] + "/h-observe_001-", read(seen), cg)
        poll(lambda: not procs_with(marker), "the setsid grandchild to be gone")
        poll(lambda: not self.handler_cgroups(), "the handler cgroups to be removed")

    def test_kill9_spares_the_tool_call_not_the_setsid_grandchild(self):
        """kill -9 of kairosd during an act whose `kairosctl tool run` is
        running: the keeper kills the handler and what it left in its cgroup
        (a setsid grandchild) but not the call, which runs on in the
        handler's cgroup; the next kairosd completes it (one effect).  On
        cgroup v2 the keeper disables the controllers in kairosd's cgroup
        (systemd puts the next kairosd there)."""
        marker = "98764%d" % os.getpid()
        out = os.path.join(self.dir, "out")
        os.makedirs(out)
        gate = os.path.join(out, "gate")
        os.mkfifo(gate)
        act = os.path.join(self.dir, "act.sh")
        with open(act, "w") as f:
            f.write("#!/bin/sh\ncat >/dev/null\n"
                    "setsid /bin/sh -c 'exec sleep %s' </dev/null >/dev/null 2>&1 &\n"
                    "%s tool run --key \"$KAIROS_IDEM_KEY\" -- /bin/sh -c "
                    "'echo $$ >%s/pid; read x <%s; echo \"$0\" >>%s/outbox' "
                    "\"$KAIROS_IDEM_KEY\" >/dev/null || exit $?\necho '{}'\n"
                    % (marker, os.path.abspath(kairos_harness.KAIROSCTL), out, gate, out))
        os.chmod(act, 0o755)
        ok = "/bin/sh -c \"cat >/dev/null; echo '{}'\""
        sched = {"Schedule": CRON, "Mandate": {"MaxCycles": "1"}, "Exec": {
            "Observe": ok, "Orient": ok, "Decide": ok, "Act": act, "Reflect": ok,
            "Effects": "act", "EffectsVia": "kairosctl"}}
        self.start({"call": sched})
        r = self.c.call("fire", schedule="call", at="2030-01-01T00:00:00Z")
        self.assertTrue(r["ok"], r)
        mid = r["result"]["mandate"]
        pidf = os.path.join(out, "pid")
        poll(lambda: os.path.exists(pidf) and read(pidf).strip(), "the call to start")
        poll(lambda: procs_with(marker), "the setsid grandchild to start")
        cmd = int(read(pidf))
        self.c.close()
        self.c = None
        self.d.proc.kill()
        self.d.proc.wait()
        self.d.proc.stderr.close()
        poll(lambda: not procs_with(marker), "the setsid grandchild to die with kairosd")
        self.assertTrue(os.path.exists("/proc/%d" % cmd), "the tool call died with kairosd")
        if self.USE_V2:
            self.assertEqual(read(self.cg + "/cgroup.subtree_control").split(), [])
        self.notify.clear()
        self.start({"call": sched})
        # the next kairosd holds the step for the call; killed too, its
        # keeper spares the held call as well
        self.d.wait_log("still runs (client pid")
        self.c.close()
        self.c = None
        self.d.proc.kill()
        self.d.proc.wait()
        self.d.proc.stderr.close()
        self.assertTrue(os.path.exists("/proc/%d" % cmd), "a held call died with kairosd")
        self.notify.clear()
        self.start({"call": sched})
        with open(gate, "w") as f:
            f.write("go\n")
        self.d.wait_log("mandate %s done" % mid)
        self.assertEqual(read(os.path.join(out, "outbox")).split(), ["%s/act_001" % mid])

    def need(self, line, controller):
        missing = line.partition("controllers not available:")[2].split()
        if self.USE_V1 and controller in V1:
            # the host has it on cgroup v1 and kairosd was given its cgroup there
            self.assertNotIn(controller, missing, line)
        elif controller in missing:
            self.skipTest("no %s controller in the cgroup v2 hierarchy here (%s)"
                          % (controller, "it is on cgroup v1: see the Hybrid and V1Only cases"
                             if controller in V1 else "nor on cgroup v1"))

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

    def test_hostile_handler_as_another_user(self):
        marker = "76543%d" % os.getpid()
        os.chmod(self.dir, 0o755)
        out = os.path.join(self.dir, "out")
        os.mkdir(out)
        os.chmod(out, 0o777)
        script = os.path.join(self.dir, "hostile.py")
        with open(script, "w") as f:
            f.write(HOSTILE)
        line = self.start({"hostile": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"}, "Exec": {
            "Observe": "python3 %s %s %s %s" % (script, out, self.state, marker),
            "WorkingDirectory": out, "MemoryMax": "50M", "TasksMax": "64"}}},
            daemon_extra="HandlerUser=nobody\n")
        recs = self.run_mandate("hostile")
        with open(os.path.join(out, "report.json")) as f:
            report = json.load(f)
        print("hostile handler as nobody: %s" % report, file=sys.stderr)
        self.assertIn("kill kairosd", report)
        self.assertTrue(any(k.endswith("/cgroup.procs") for k in report), report)
        missing = set(line.partition("controllers not available:")[2].split())
        if missing != {"memory", "pids", "cpu"}:  # (a limit file to try)
            self.assertTrue(any(k.endswith((".max", "limit_in_bytes", "quota_us"))
                                for k in report), report)
        self.assertEqual([k for k, v in report.items() if v == "done"], [], report)
        self.assertIsNone(self.d.proc.poll(), "kairosd lives")
        self.assertFalse(os.path.exists(os.path.join(self.state, "hostile")))
        last = [r for r in recs if r.get("step_id") == "observe_001" and
                r.get("status") in ("completed", "failed")][-1]
        if "memory" in missing:
            self.assertEqual(last["status"], "completed", last)
        else:
            # MemoryMax=50M still holds
            self.assertEqual((last["status"], last.get("error_class")), ("failed", "oom"), last)
        poll(lambda: not procs_with(marker), "the setsid grandchild to be gone")
        poll(lambda: not self.handler_cgroups(), "the handler cgroups to be removed")

    def test_tasks_max_limits_forks(self):
        line = self.start({"forky": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"}, "Exec": {
            "Observe": "python3 -c \"import subprocess; "
                       "ps = [subprocess.Popen(['sleep', '30.0417']) for _ in range(8)]; print('{}')\"",
            "TasksMax": "4"}}})
        self.need(line, "pids")
        recs = self.run_mandate("forky")
        failed = [r for r in recs if r.get("step_id") == "observe_001" and r.get("status") == "failed"]
        self.assertTrue(failed, recs)
        self.assertEqual(failed[-1]["error_class"], "exit_status", failed[-1])
        self.assertIn("Resource temporarily unavailable", failed[-1]["error_msg"])
        # (a duration no other test uses: tests run side by side)
        poll(lambda: not procs_with("sleep\0" + "30.0417"), "the handler's sleeps to be killed")
        poll(lambda: not self.handler_cgroups(), "the handler cgroups to be removed")

    def test_fork_bomb_is_bounded_and_cleaned_up(self):
        # a binary tree of shells, 2047 processes in all without a limit,
        # started in a session of its own; the handler returns once a fork
        # of the tree has failed (TasksMax=), while the rest of it goes on
        marker = "87654%d" % os.getpid()
        bomb = os.path.join(self.dir, "bomb.sh")
        errors = os.path.join(self.dir, "bomb.err")
        handler = os.path.join(self.dir, "handler.sh")
        with open(bomb, "w") as f:
            f.write('b() { if [ "$1" -gt 0 ]; then b $(($1 - 1)) & b $(($1 - 1)) & fi; '
                    'exec sleep %s; }\nb 10\n' % marker)
        # no fork while it waits (builtins only), bounded: a few seconds; it
        # waits for the whole word, as the shell writes its message in parts
        with open(handler, "w") as f:
            f.write("setsid /bin/sh %s </dev/null >/dev/null 2>%s &\n"
                    "i=0\nwhile [ $i -lt 3000000 ]; do\n"
                    "  l=; read -r l < %s || :\n"
                    "  case \"$l\" in *[Ff]ork*) break;; esac\n"
                    "  i=$((i + 1))\ndone\n"
                    "echo '{}'\n" % (bomb, errors, errors))
        line = self.start({"bomb": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"}, "Exec": {
            "Observe": "/bin/sh %s" % handler, "TasksMax": "16"}}})
        self.need(line, "pids")
        recs = self.run_mandate("bomb")
        done = [r for r in recs if r.get("step_id") == "observe_001" and r.get("status") == "completed"]
        self.assertTrue(done, recs)
        poll(lambda: not procs_with(marker), "the fork bomb to be gone")
        poll(lambda: not self.handler_cgroups(), "the handler cgroups to be removed")
        self.assertIn("fork", read(errors).lower(), "TasksMax=16 stopped the tree")
        r = self.c.call("status")
        self.assertTrue(r["ok"], r)

    def test_cpu_quota_throttles(self):
        hog = os.path.join(self.dir, "hog.py")
        out = os.path.join(self.dir, "hog.json")
        with open(hog, "w") as f:
            f.write(CPU_HOG)
        on_v1 = self.USE_V1
        mount = V1.get("cpu") if on_v1 else ("/sys/fs/cgroup" if self.BIND_V2 else MOUNT)
        line = self.start({"hog": {"Schedule": CRON, "Mandate": {"MaxCycles": "1"}, "Exec": {
            "Observe": "python3 %s %s %s %s" % (hog, mount, "cpu" if on_v1 else "''", out),
            "CPUQuota": "20%"}}})
        self.need(line, "cpu")
        recs = self.run_mandate("hog")
        done = [r for r in recs if r.get("step_id") == "observe_001" and r.get("status") == "completed"]
        self.assertTrue(done, recs)
        with open(out) as f:
            got = json.load(f)
        print("CPUQuota=20%%: CPU time / wall time %.3f, throttled %d times (load %s)"
              % (got["ratio"], got["nr_throttled"], " ".join(read("/proc/loadavg").split()[:3])),
              file=sys.stderr)
        self.assertEqual(got["quota"], "20000" if on_v1 else "20000 100000", got)
        self.assertGreater(got["nr_throttled"], 0, got)
        # 20% of one CPU, over two seconds of 100 ms periods
        self.assertLess(got["ratio"], 0.3, got)
        self.assertGreater(got["ratio"], 0.05, got)
        poll(lambda: not self.handler_cgroups(), "the handler cgroups to be removed")


class V2(CgroupCase, unittest.TestCase):
    USE_V2 = True
    BIND_V2 = True


class Hybrid(CgroupCase, unittest.TestCase):
    USE_V2 = True
    USE_V1 = True

    @classmethod
    def unavailable(cls):
        if MOUNT == "/sys/fs/cgroup":
            return "not a hybrid host: cgroup v2 at /sys/fs/cgroup"
        return super().unavailable()


class V1Only(CgroupCase, unittest.TestCase):
    USE_V1 = True


REAL_KAIROSD = kairos_harness.KAIROSD
MOUNT = None
V1 = {}

if __name__ == "__main__":
    if os.geteuid() != 0 or not shutil.which("unshare"):
        print("SKIP: needs root and unshare(1)", file=sys.stderr)
        sys.exit(SKIP)
    MOUNT = cgroup2_mount()
    V1 = v1_mounts()
    if all(c.unavailable() for c in (V2, Hybrid, V1Only)):
        print("SKIP: no writable cgroup hierarchy: %s"
              % "; ".join(c.unavailable() for c in (V2, Hybrid, V1Only)), file=sys.stderr)
        sys.exit(SKIP)
    unittest.main(verbosity=2)
