#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Cycle benchmark: a one-cycle, five-step mandate against its C floor.

    tests/bench/bench_cycle.py --kairosd build/src/daemon/kairosd
        [--floor build/tests/bench/floor_cycle] [--dir /var/tmp] [--loop]
        [--reps 16] [--mandates 20] [--chrt both|on|off] [--strace-mandates 100]
        [--syscalls-mandates 20]

The floor (tests/bench/floor_cycle.c) does, in C, what kairosd must for such
a mandate and nothing more: five posix_spawns of the handler with
stdin/stdout/stderr pipes (a JSON document written, the output read to EOF,
waitpid), the WAL created and its directory fsynced, records of kairosd's
sizes appended with kairosd's 5 fdatasyncs, the summary and the gzip archive
written, one syncfs, the WAL unlinked.

For each file system (--dir, and with --loop a 512 MB journaled ext4
loop-mounted in a temporary directory: root only), each handler
(`/bin/sh -c :` and `/bin/true`) and each priority (normal, and both sides
under `chrt -f 10`, if permitted: the floor, kairosd and this script's client
that fires and waits), one kairosd runs the schedule with
MaxCycles=1, MaxConcurrentMandates=1 and LogLevel=info; then --reps
repetitions, each a round of kairosd and a round of the floor in the same
directory (the order alternates), --mandates mandates per round:

  kairosd round: each mandate fired over the control socket and waited for
    by its "WAL archived" log line (its last act: after the syncfs and the
    unlink), one at a time; wall time / mandates.  kairosd's own CPU over
    the round / (mandates x 5 steps), read in nanoseconds from the process's
    CPU-time clock (clock_gettime on clock_getcpuclockid(PID)'s clock: the
    sum of every thread's runtime, threads that exited included; not its
    handlers).  /proc/PID/stat counts in 10 ms clock ticks (0.1 ms per step
    at 20 mandates) and /proc/PID/schedstat is the main thread's alone.
  floor round: floor_cycle -n MANDATES in a fresh directory; its own wall
    time / mandates, and its own CPU (clock_gettime CLOCK_PROCESS_CPUTIME_ID
    around its mandates, ns; not its handlers) / (mandates x 5 steps).
    A posix_spawn'd child's work before its exec counts to the child on
    both sides.

Printed per repetition: both times per cycle and the ratio, both sides' CPU
per step and their difference; then the MEDIANs over the repetitions (never
the best) of the ratio, of kairosd's CPU per step, of the floor's and of the
difference, with the load average.  Targets: cycle <= 1.10x the floor with /bin/sh, <= 1.15x with
/bin/true; kairosd's CPU <= 0.25 ms per step.

Then, with --syscalls-mandates M (default 20; 0: skip) and strace, the
system calls per step of each side, /bin/true handlers: strace -c attached
to every thread of a running kairosd (not following its children: their
calls before exec are theirs, as on the floor's side) over M mandates fired
one at a time, and strace -c of floor_cycle -n M (no -f); printed per call
where the two differ by 0.5 per step or more.

Then, on each file system, one kairosd under strace -f -y over its whole life
(start, --strace-mandates one-cycle /bin/true mandates fired one at a time,
SIGTERM):
  - fsync-family calls (fsync, fdatasync, syncfs, sync, sync_file_range) per
    mandate (target <= 7; the floor makes 6, its first mandate 7);
  - WAL bytes read per WAL byte appended: the bytes returned by read/pread64
    on a file descriptor that strace -y names as a *.wal.jsonl file under the
    state's wal/ directory, over the bytes written through such descriptors
    (exact per file, unlike /proc/PID/io, which counts every file, pipe and
    socket).  Target 0 while running (startup recovery is not part of it: no
    WAL is left when the daemon starts).

Run by hand on a quiet machine, not tmpfs; the figures are ratios measured
in the same run."""
import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, HERE)
import kairos_harness  # noqa: E402
from kairos_harness import Client, Daemon, NotifySocket, write_config  # noqa: E402
from bench_executor import LogCounter, at  # noqa: E402
from bench_fsyncs import SYNCS, count_syncs, wal_bytes  # noqa: E402

PHASES = ("Observe", "Orient", "Decide", "Act", "Reflect")
HANDLERS = (("/bin/sh", "/bin/sh -c :", 1.10), ("/bin/true", "/bin/true", 1.15))
CHRT = ["chrt", "-f", "10"]
ARCHIVED = ": WAL archived ("


def load():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def fs_kind(path):
    """The file system type of path, and for ext4 whether it has a journal
    (a jbd2 entry in /proc/fs/jbd2 for its device)."""
    best, dev, kind = "", "", "?"
    with open("/proc/mounts") as f:
        for line in f:
            fields = line.split()
            mnt = fields[1].replace("\\040", " ")
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, dev, kind = mnt, fields[0], fields[2]
    if kind == "ext4":
        name = os.path.basename(os.path.realpath(dev))
        jbd = os.path.isdir("/proc/fs/jbd2") and any(
            e.startswith(name + "-") for e in os.listdir("/proc/fs/jbd2"))
        kind += " with a journal" if jbd else " without a journal"
    return kind


def own_cpu(pid):
    """The CPU time of a process (all its threads, those that exited
    included, not its children), s, exact: its CPU-time clock, the clockid
    clock_getcpuclockid(pid) gives (CPUCLOCK_SCHED of the thread group:
    (~pid << 3) | 2, as glibc makes it)."""
    return time.clock_gettime_ns(((~pid) << 3) | 2) / 1e9


def chrt_permitted():
    try:
        return subprocess.run(CHRT + ["true"], stderr=subprocess.DEVNULL).returncode == 0
    except OSError:
        return False


def schedule(cmd):
    return {"Schedule": {"Cron": "0 0 1 1 *", "Concurrency": "allow"},
            "Mandate": {"MaxCycles": "1"}, "Exec": {p: cmd for p in PHASES}}


def wrapper(path, prefix, kairosd):
    """A script that execs kairosd behind prefix (chrt, strace)."""
    with open(path, "w") as f:
        f.write('#!/bin/sh\nexec %s %s "$@"\n' % (" ".join(prefix), kairosd))
    os.chmod(path, 0o755)
    return path


class Kairos:
    def __init__(self, base, name, cmd, kairosd, prefix=(), extra=""):
        self.dir = os.path.join(base, name)
        self.state = os.path.join(self.dir, "state")
        os.makedirs(self.state)
        conf = write_config(self.dir, self.state, {"bench": schedule(cmd)},
                            "MaxConcurrentMandates=1\nLogLevel=info\n" + extra)
        self.notify = NotifySocket(self.dir)
        kairos_harness.KAIROSD = wrapper(os.path.join(self.dir, "kairosd.sh"), prefix, kairosd)
        self.d = Daemon(self.state, config=conf, notify=self.notify)
        self.notify.wait_ready(timeout=120)
        with open(os.path.join(self.state, "kairosd.pid")) as f:
            self.pid = int(f.read().split()[0])
        self.c = Client(self.d.socket_path, timeout=600)
        self.archived = LogCounter(self.d, ARCHIVED)
        self.seq = 0

    def one(self):
        r = self.c.call("fire", schedule="bench", at=at(self.seq))
        self.seq += 1
        if not r.get("ok") or not r["result"].get("fired"):
            raise RuntimeError("fire: %s" % r)
        self.archived.wait(self.archived.n + 1, timeout=120)

    def round(self, n):
        cpu0 = own_cpu(self.pid)
        t0 = time.monotonic()
        for _ in range(n):
            self.one()
        wall = time.monotonic() - t0
        return wall / n, (own_cpu(self.pid) - cpu0) / (n * len(PHASES))

    def stop(self):
        self.c.close()
        os.kill(self.pid, signal.SIGTERM)
        rc = self.d.proc.wait(300)
        self.notify.close()
        if rc != 0:
            raise RuntimeError("kairosd exit %d:\n%s" % (rc, self.d.log()[-3000:]))


def floor_round(floor, base, cmd, n, prefix):
    d = tempfile.mkdtemp(prefix="floor-", dir=base)
    try:
        out = subprocess.run(list(prefix) + [floor, "--dir", d, "--handler", cmd, "-n", str(n)],
                             check=True, capture_output=True, text=True).stdout.split()
        f = dict(zip(out[1::2], out[2::2]))
        return float(f["wall_s"]) / n, int(f["syncs"]) / n, float(f["cpu_s"]) / (n * len(PHASES))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def cycles(args, base, label):
    prios = {"both": [False, True], "on": [True], "off": [False]}[args.chrt]
    if True in prios and not chrt_permitted():
        print("%s: chrt -f 10 not permitted here: normal priority only" % label)
        prios = [p for p in prios if not p] or [False]
    for short, cmd, target in HANDLERS:
        for rt in prios:
            prefix = CHRT if rt else []
            name = "%s-%s" % (os.path.basename(short), "fifo" if rt else "normal")
            # the client that fires and waits is on kairosd's side of the
            # round: under chrt it runs (with the threads it starts) at the
            # same priority
            os.sched_setscheduler(0, os.SCHED_FIFO if rt else os.SCHED_OTHER,
                                  os.sched_param(10 if rt else 0))
            k = Kairos(base, name, cmd, args.kairosd, prefix)
            try:
                for _ in range(2):  # warm up both sides
                    k.one()
                floor_round(args.floor, base, cmd, 2, prefix)
                ratios, cpus, fcpus, diffs = [], [], [], []
                for rep in range(args.reps):
                    if rep % 2 == 0:
                        kc, cpu = k.round(args.mandates)
                        fc, fsyncs, fcpu = floor_round(args.floor, base, cmd, args.mandates, prefix)
                    else:
                        fc, fsyncs, fcpu = floor_round(args.floor, base, cmd, args.mandates, prefix)
                        kc, cpu = k.round(args.mandates)
                    ratios.append(kc / fc)
                    cpus.append(cpu)
                    fcpus.append(fcpu)
                    diffs.append(cpu - fcpu)
                    print("  %s %-12s %-6s rep %2d: kairosd %6.2f ms/cycle, floor %6.2f ms/cycle "
                          "(%.0f syncs/mandate): %.2fx; CPU ms/step: kairosd %.3f, floor %.3f, "
                          "difference %.3f; load %s"
                          % (label, cmd, "fifo" if rt else "normal", rep + 1, kc * 1000, fc * 1000,
                             fsyncs, kc / fc, cpu * 1000, fcpu * 1000, (cpu - fcpu) * 1000, load()))
                med = statistics.median(ratios)
                cpu = statistics.median(cpus)
                print("%s: %s handlers, %s priority: MEDIAN cycle / C floor = %.2f "
                      "(target <= %.2f: %s; range %.2f-%.2f over %d reps of %d mandates); "
                      "MEDIAN CPU ms/step: kairosd %.3f (target <= 0.25: %s; range %.3f-%.3f), "
                      "the C floor %.3f, difference %.3f; load %s"
                      % (label, cmd, "SCHED_FIFO 10" if rt else "normal", med, target,
                         "OK" if med <= target else "MISSED", min(ratios), max(ratios),
                         args.reps, args.mandates, cpu * 1000,
                         "OK" if cpu <= 0.00025 else "MISSED", min(cpus) * 1000, max(cpus) * 1000,
                         statistics.median(fcpus) * 1000, statistics.median(diffs) * 1000, load()))
            finally:
                k.stop()
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def traced(args, base, label):
    """fsync-family calls per mandate and WAL bytes read per byte appended
    over the whole life of a kairosd under strace, mandates one at a time."""
    d = os.path.join(base, "strace")
    os.makedirs(d)
    out = os.path.join(d, "trace.txt")
    strace = shutil.which("strace")
    prefix = [strace, "-f", "-y", "-e", "signal=none", "-e",
              "trace=read,pread64,readv,preadv,write,pwrite64,writev,pwritev," + ",".join(SYNCS),
              "-o", out]
    k = Kairos(d, "k", "/bin/true", args.kairosd, prefix)
    try:
        for _ in range(args.strace_mandates):
            k.one()
    finally:
        k.stop()
    syncs = count_syncs(out)
    rd, wr = wal_bytes(out, os.path.realpath(k.state))
    n = args.strace_mandates
    print("%s: fsync-family calls over kairosd's whole life, %d one-cycle /bin/true mandates "
          "one at a time: %d = %.2f per mandate (target <= 7: %s; the C floor makes 6, its first mandate 7); "
          "load %s" % (label, n, syncs, syncs / n, "OK" if syncs <= 7 * n else "MISSED", load()))
    print("%s: WAL bytes read per byte appended while running: %d read / %d written = %.3f "
          "(target 0: %s)" % (label, rd, wr, rd / wr if wr else 0.0, "OK" if rd == 0 else "MISSED"))
    if not args.keep:
        shutil.rmtree(d, ignore_errors=True)


def strace_counts(path):
    """{syscall: calls} from strace -c's table."""
    out = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
                out[parts[-1]] = int(parts[3])
    return out


def syscalls(args, base, label):
    """System calls per step: kairosd's threads (strace -c attached, no
    children) and the floor's process (strace -c, no -f)."""
    d = os.path.join(base, "syscalls")
    os.makedirs(d)
    k = Kairos(d, "k", "/bin/true", args.kairosd)
    kout = os.path.join(d, "kairosd.strace")
    try:
        for _ in range(2):
            k.one()
        tids = sorted(os.listdir("/proc/%d/task" % k.pid))
        st = subprocess.Popen(["strace", "-c", "-o", kout] + sum((["-p", t] for t in tids), []),
                              stderr=subprocess.PIPE, text=True)
        # attached to each thread (strace says so) before the round
        seen = 0
        while seen < len(tids):
            line = st.stderr.readline()
            if not line:
                raise RuntimeError("strace ended before attaching")
            seen += "attached" in line
        n = args.syscalls_mandates
        for _ in range(n):
            k.one()
        st.send_signal(signal.SIGINT)
        st.communicate(timeout=60)
    finally:
        k.stop()
    fdir = tempfile.mkdtemp(prefix="floor-", dir=d)
    fout = os.path.join(d, "floor.strace")
    subprocess.run(["strace", "-c", "-o", fout, args.floor, "--dir", fdir, "--handler",
                    "/bin/true", "-n", str(n)], check=True, capture_output=True)
    kc, fc = strace_counts(kout), strace_counts(fout)
    steps = n * len(PHASES)
    print("%s: system calls per step, /bin/true handlers, %d mandates: kairosd %.1f (its threads, "
          "not its handlers), the C floor %.1f; load %s"
          % (label, n, sum(kc.values()) / steps, sum(fc.values()) / steps, load()))
    for name in sorted(set(kc) | set(fc), key=lambda c: -(kc.get(c, 0) - fc.get(c, 0))):
        a, b = kc.get(name, 0) / steps, fc.get(name, 0) / steps
        if abs(a - b) >= 0.5:
            print("  %-16s kairosd %5.1f  floor %5.1f" % (name, a, b))
    if not args.keep:
        shutil.rmtree(d, ignore_errors=True)


def run_on(args, parent, label):
    base = tempfile.mkdtemp(prefix="kairos-bench-cycle-", dir=parent)
    try:
        print("%s: %s (%s); %d CPUs; load %s"
              % (label, base, fs_kind(base), os.cpu_count(), load()))
        cycles(args, base, label)
        if args.syscalls_mandates and shutil.which("strace"):
            syscalls(args, base, label)
        if args.strace_mandates and shutil.which("strace"):
            traced(args, base, label)
        elif args.strace_mandates:
            print("%s: strace not installed: fsync and WAL-read counts skipped" % label)
    finally:
        if args.keep:
            print("kept %s" % base)
        else:
            shutil.rmtree(base, ignore_errors=True)


class LoopExt4:
    """A journaled ext4 (512 MB by default) loop-mounted in a temporary
    directory; inodes: how many it needs at least (mkfs's default else)."""

    def __init__(self, parent, size_mb=512, inodes=None):
        self.top = tempfile.mkdtemp(prefix="kairos-bench-loop-", dir=parent)
        self.img = os.path.join(self.top, "ext4.img")
        self.mnt = os.path.join(self.top, "mnt")
        os.makedirs(self.mnt)
        with open(self.img, "wb") as f:
            f.truncate(size_mb << 20)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-O", "has_journal"] +
                       (["-N", str(inodes)] if inodes else []) + [self.img], check=True)
        subprocess.run(["mount", "-o", "loop", self.img, self.mnt], check=True)

    def close(self):
        # a process just reaped may still hold the mount for a moment
        deadline = time.monotonic() + 30
        while subprocess.run(["umount", self.mnt], stderr=subprocess.DEVNULL).returncode != 0:
            if time.monotonic() > deadline:
                subprocess.run(["umount", "-l", self.mnt], check=False)
                break
            time.sleep(0.2)  # polling the umount, with a deadline
        shutil.rmtree(self.top, ignore_errors=True)


def resolve_paths(ap, args):
    """args.kairosd made absolute; args.floor (default: the build's
    floor_cycle beside it) made absolute and checked."""
    args.kairosd = os.path.abspath(args.kairosd)
    if args.floor is None:
        args.floor = os.path.join(os.path.dirname(args.kairosd), "..", "..", "tests", "bench",
                                  "floor_cycle")
    args.floor = os.path.abspath(args.floor)
    if not os.access(args.floor, os.X_OK):
        ap.error("%s: no floor_cycle (build it: ninja -C build)" % args.floor)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kairosd", required=True)
    ap.add_argument("--floor", default=None,
                    help="floor_cycle (default: build/tests/bench/floor_cycle next to kairosd)")
    ap.add_argument("--dir", default="/var/tmp", help="parent directory; not tmpfs")
    ap.add_argument("--loop", action="store_true",
                    help="also on a loop-mounted journaled ext4 (root only)")
    ap.add_argument("--reps", type=int, default=16)
    ap.add_argument("--mandates", type=int, default=20, help="mandates per round")
    ap.add_argument("--chrt", choices=("both", "on", "off"), default="both",
                    help="run both sides under chrt -f 10, at normal priority, or both ways")
    ap.add_argument("--strace-mandates", type=int, default=100,
                    help="mandates of the strace run (0: skip it)")
    ap.add_argument("--syscalls-mandates", type=int, default=20,
                    help="mandates of the system-call count of each side (0: skip it)")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    if args.reps < 1 or args.mandates < 1 or args.strace_mandates < 0 or args.syscalls_mandates < 0:
        ap.error("--reps and --mandates must be >= 1, --strace-mandates and "
                 "--syscalls-mandates >= 0")
    resolve_paths(ap, args)
    if args.loop and os.geteuid() != 0:
        ap.error("--loop needs root (mkfs.ext4, mount -o loop)")
    run_on(args, args.dir, "dir")
    if args.loop:
        loop = LoopExt4(args.dir)
        try:
            run_on(args, loop.mnt, "loop-ext4j")
        finally:
            loop.close()
    print("load: %s" % subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
