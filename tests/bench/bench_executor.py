#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Executor benchmark: cycles per second, fdatasync calls per cycle, RSS.

    tests/bench/bench_executor.py --kairosd build/src/daemon/kairosd [--dir DIR]
        [--single N] [--concurrent N] [--finished 1000] [--running 100]
        [--burst 256] [--floor build/tests/bench/floor_cycle]

1. Throughput, every phase /bin/true, MaxCycles=10 (no reflect says done, so
   every mandate runs 10 cycles), MaxConcurrentMandates=16:
   - one mandate: N mandates fired one after the other, each waited for;
   - 16 concurrent: N mandates fired at once with distinct --at times, the
     daemon runs 16 of them at a time.
   Cycles per second = cycles run / time from the first fire's request to the
   last "mandate M done" log line.  fdatasync calls per cycle =
   status.fdatasync_calls over the run / cycles run (target <= 6).
2. Memory (VmRSS of /proc/PID/status), MaxConcurrentMandates=100: idle after
   READY=1; after 1,000 finished mandates (one /bin/true cycle each); with
   100 more running (observe is `sleep 600`).
3. Bursts: --burst mandates fired together (pipelined) with
   MaxConcurrentMandates 1, 4, 16, 64, 256: cycles/s against the floor of
   the machine (min(concurrency, CPUs) x the rate of the C floor of a
   one-cycle /bin/sh mandate, tests/bench/floor_cycle.c, measured in this
   run), the longest gap between WATCHDOG=1 pings against the ping interval (WATCHDOG_USEC=1 s: a
   ping every 0.5 s; target gap <= 1 s), `status` latency on another
   connection against the same daemon's idle p99 just before the burst
   (p99 target 100 ms).
Run by hand on a disk directory (default /var/tmp), not tmpfs; prints the figures.

The cost of one cycle against its floor (the spawn ratio this script used to
time against a Python `sh -c :` measured apart from the fdatasyncs) is
tests/bench/bench_cycle.py: a C floor interleaved with kairosd, repeated,
judged on the median.  No floor here is Python."""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import kairos_harness  # noqa: E402
from kairos_harness import Client, Daemon, NotifySocket, write_config  # noqa: E402

TRUE = "/bin/true"
PHASES = ("Observe", "Orient", "Decide", "Act", "Reflect")


def at(i):
    """Distinct fire times: 2025-01-01T00:00:00Z + i seconds."""
    t = time.gmtime(1735689600 + i)
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", t)


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS for pid %d" % pid)


def fstype(path):
    """The file system type of the longest mount point above path."""
    best, kind = "", "?"
    with open("/proc/mounts") as f:
        for line in f:
            fields = line.split()
            mnt = fields[1].replace("\\040", " ")
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, kind = mnt, fields[2]
    return kind


def fdatasync_ms(directory, n=50):
    """Median latency of a 200-byte append + fdatasync on this disk."""
    path = os.path.join(directory, "probe")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    lat = []
    try:
        for _ in range(n):
            os.write(fd, b"x" * 199 + b"\n")
            t0 = time.monotonic()
            os.fdatasync(fd)
            lat.append((time.monotonic() - t0) * 1000)
    finally:
        os.close(fd)
        os.unlink(path)
    return statistics.median(lat)


class LogCounter:
    """Counts log lines containing a text, reading the daemon's lines once."""

    def __init__(self, d, text):
        self.d, self.text, self.pos, self.n = d, text, 0, 0

    def wait(self, n, timeout):
        deadline = time.monotonic() + timeout
        with self.d.cond:
            while True:
                lines = self.d.lines
                while self.pos < len(lines):
                    line = lines[self.pos]
                    self.pos += 1
                    if line is None:
                        raise RuntimeError("kairosd exited:\n" + self.d.log()[-3000:])
                    if self.text in line:
                        self.n += 1
                if self.n >= n:
                    return time.monotonic()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("%d of %d lines with %r" % (self.n, n, self.text))
                self.d.cond.wait(left)


class Run:
    def __init__(self, base, name, schedules, daemon_extra):
        self.dir = os.path.join(base, name)
        self.state = os.path.join(self.dir, "state")
        os.makedirs(self.state)
        conf = write_config(self.dir, self.state, schedules, daemon_extra)
        self.notify = NotifySocket(self.dir)
        self.d = Daemon(self.state, config=conf, notify=self.notify)
        self.notify.wait_ready(timeout=120)
        self.c = Client(self.d.socket_path, timeout=600)

    def call(self, cmd, **args):
        r = self.c.call(cmd, **args)
        if not r.get("ok"):
            raise RuntimeError("%s %s: %s" % (cmd, args, r))
        return r["result"]

    def fire(self, schedule, i):
        r = self.call("fire", schedule=schedule, at=at(i))
        if not r.get("fired"):
            raise RuntimeError("not fired: %s" % r)
        return r["mandate"]

    def flushes(self):
        return self.call("status")["fdatasync_calls"]

    def close(self):
        self.c.close()
        rc = self.d.stop(timeout=120)
        self.notify.close()
        if rc != 0:
            raise RuntimeError("kairosd exit %d:\n%s" % (rc, self.d.log()[-3000:]))


def throughput(base, args):
    cycles = 10
    sched = {"Mandate": {"MaxCycles": str(cycles)}, "Exec": {p: TRUE for p in PHASES}}
    sched["Schedule"] = {"Cron": "0 0 1 1 *", "Concurrency": "allow"}
    r = Run(base, "throughput", {"bench": sched},
            "MaxConcurrentMandates=16\nLogLevel=%s\n" % args.log_level)
    try:
        print("idle RSS (MaxConcurrentMandates=16): %d KiB" % rss_kib(r.d.proc.pid))
        done = LogCounter(r.d, "done after %d cycles" % cycles)
        seq = 0

        # one mandate at a time
        rates = []
        f0 = r.flushes()
        for _ in range(args.single):
            t0 = time.monotonic()
            r.fire("bench", seq)
            seq += 1
            t1 = done.wait(done.n + 1, timeout=600)
            rates.append(cycles / (t1 - t0))
        f1 = r.flushes()
        n_single = args.single * cycles
        print("one mandate:     %6.1f cycles/s (median of %d mandates of %d cycles; min %.1f, "
              "max %.1f); %.2f fdatasync calls per cycle"
              % (statistics.median(rates), args.single, cycles, min(rates), max(rates),
                 (f1 - f0) / n_single))

        # 16 at once
        n = args.concurrent
        base_done = done.n
        t0 = time.monotonic()
        for _ in range(n):
            r.fire("bench", seq)
            seq += 1
        t_fired = time.monotonic()
        at_once = r.call("status")["by_status"].get("running", 0)
        t1 = done.wait(base_done + n, timeout=1800)
        f2 = r.flushes()
        total = n * cycles
        print("16 concurrent:   %6.1f cycles/s (%d mandates x %d cycles in %.2f s; the %d "
              "fires took %.2f s; %d running after them); %.2f fdatasync calls per cycle"
              % (total / (t1 - t0), n, cycles, t1 - t0, n, t_fired - t0, at_once,
                 (f2 - f1) / total))
        st = r.call("status")
        print("fdatasync calls per cycle over the run: %.2f (%d calls / %d cycles; target <= 6): %s"
              % (st["fdatasync_calls"] / (n_single + total), st["fdatasync_calls"],
                 n_single + total, "OK" if st["fdatasync_calls"] <= 6 * (n_single + total)
                 else "MISSED"))
        print("RSS after %d finished mandates: %d KiB" % (st["mandates"], rss_kib(r.d.proc.pid)))
    finally:
        r.close()


def memory(base, args):
    quick = {"Schedule": {"Cron": "0 0 1 1 *", "Concurrency": "allow"}, "Mandate": {"MaxCycles": "1"},
             "Exec": {p: TRUE for p in PHASES}}
    slow = {"Schedule": {"Cron": "0 0 1 1 *", "Concurrency": "allow"},
            "Exec": {"Observe": "sleep 600"}}
    r = Run(base, "memory", {"quick": quick, "slow": slow},
            "MaxConcurrentMandates=100\nGracefulTimeoutSec=1\nLogLevel=%s\n" % args.log_level)
    try:
        pid = r.d.proc.pid
        idle = rss_kib(pid)
        print("idle RSS (MaxConcurrentMandates=100): %d KiB" % idle)
        done = LogCounter(r.d, "done after 1 cycle (")
        t0 = time.monotonic()
        for i in range(args.finished):
            r.fire("quick", i)
        done.wait(args.finished, timeout=1800)
        t1 = time.monotonic()
        fin = rss_kib(pid)
        print("RSS with %d finished mandates: %d KiB (+%d KiB; they ran in %.1f s)"
              % (args.finished, fin, fin - idle, t1 - t0))
        started = LogCounter(r.d, "observe_001: started sleep 600")
        for i in range(args.running):
            r.fire("slow", 100000 + i)
        started.wait(args.running, timeout=600)
        st = r.call("status")
        running = st["by_status"].get("running", 0)
        both = rss_kib(pid)
        print("RSS with %d finished + %d running mandates: %d KiB (+%d KiB over idle; "
              "status: %d mandates, %d running)"
              % (args.finished, args.running, both, both - idle, st["mandates"], running))
        if running != args.running:
            print("WARNING: %d running, expected %d" % (running, args.running))
    finally:
        r.close()

SH = "/bin/sh -c :"


def c_floor(args, base, n=20):
    """Seconds per one-cycle, five-step /bin/sh mandate of the C floor
    (tests/bench/floor_cycle.c: spawns with pipes, waits, kairosd's syncs),
    median of 3 runs of n mandates in this run, in base."""
    from bench_cycle import floor_round
    return statistics.median(floor_round(args.floor, base, SH, n, [])[0] for _ in range(3))


class TimedNotify(NotifySocket):
    """A notify socket that keeps when each WATCHDOG=1 arrived."""

    def __init__(self, directory):
        self.pings = []
        super().__init__(directory)

    def _reader(self):
        while True:
            try:
                data = self.sock.recv(65536).decode()
            except OSError:
                return
            if "WATCHDOG=1" in data.split("\n"):
                self.pings.append(time.monotonic())
            with self.cond:
                self.messages.append(data)
                self.cond.notify_all()


def burst(base, args, concurrency, n, floor, watchdog_usec=1000000):
    """n mandates fired together, MaxConcurrentMandates=concurrency: cycles/s,
    the longest gap between watchdog pings, `status` latency meanwhile."""
    import threading
    name = "burst%d" % concurrency
    d = os.path.join(base, name)
    state = os.path.join(d, "state")
    os.makedirs(state)
    sched = {"Schedule": {"Cron": "0 0 1 1 *", "Concurrency": "allow"},
             "Mandate": {"MaxCycles": "1"}, "Exec": {p: SH for p in PHASES}}
    conf = write_config(d, state, {"sh": sched},
                        "MaxConcurrentMandates=%d\nLogLevel=%s\n" % (concurrency, args.log_level))
    notify = TimedNotify(d)
    daemon = Daemon(state, config=conf, notify=notify, env={"WATCHDOG_USEC": str(watchdog_usec)})
    try:
        notify.wait_ready(timeout=120)
        c = Client(daemon.socket_path, timeout=600)
        probe = Client(daemon.socket_path, timeout=600)
        done = LogCounter(daemon, "done after 1 cycle")
        lat = []
        stop = threading.Event()

        def prober():
            while not stop.is_set():
                t = time.monotonic()
                probe.call("status")
                lat.append(time.monotonic() - t)
                stop.wait(0.02)

        # the floor of status: the same daemon, idle, for a second
        t_idle = time.monotonic() + 1.0
        while time.monotonic() < t_idle:
            t = time.monotonic()
            probe.call("status")
            lat.append(time.monotonic() - t)
            time.sleep(0.02)
        lat.sort()
        idle_p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        lat = []
        th = threading.Thread(target=prober)
        t0 = time.monotonic()
        th.start()
        # all n requests pipelined, then the replies
        for i in range(n):
            c.send_raw(('{"v":1,"id":%d,"cmd":"fire","args":{"schedule":"sh","at":"%s"}}\n'
                        % (i + 1, at(i))).encode())
        for i in range(n):
            c.recv_reply()
        t1 = done.wait(n, timeout=1800)
        stop.set()
        th.join()
        pings = [p for p in notify.pings if t0 <= p <= t1 + 0.5]
        gaps = [b - a for a, b in zip(pings, pings[1:])]
        lat.sort()
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan")
        rate = n / (t1 - t0)
        machine = min(concurrency, os.cpu_count()) / floor
        gap = max(gaps) if gaps else float("nan")
        print("%4d mandates, MaxConcurrentMandates=%-4d %6.1f cycles/s = %.2fx the floor of "
              "%.1f/s (%d x the C floor); watchdog max gap %.3f s = %.2fx the interval of "
              "%.2f s (%d pings; target <= 1 s); status p99 %.1f ms = %.1fx idle p99 %.1f ms "
              "(max %.1f ms, %d calls; target <= 100 ms)"
              % (n, concurrency, rate, rate / machine, machine, min(concurrency, os.cpu_count()),
                 gap, gap / (watchdog_usec / 2e6), watchdog_usec / 2e6, len(pings),
                 p99 * 1000, p99 / idle_p99 if idle_p99 else float("nan"), idle_p99 * 1000,
                 (lat[-1] if lat else float("nan")) * 1000, len(lat)))
        c.close()
        probe.close()
    finally:
        rc = daemon.stop(timeout=120)
        notify.close()
        if rc != 0:
            raise RuntimeError("kairosd exit %d:\n%s" % (rc, daemon.log()[-3000:]))



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kairosd", required=True)
    ap.add_argument("--dir", default=None, help="parent directory (default: /var/tmp); not tmpfs")
    ap.add_argument("--single", type=int, default=10, help="mandates run one at a time")
    ap.add_argument("--concurrent", type=int, default=160,
                    help="mandates fired at once (16 run at a time)")
    ap.add_argument("--finished", type=int, default=1000)
    ap.add_argument("--running", type=int, default=100)
    ap.add_argument("--log-level", default="info")
    ap.add_argument("--floor", default=None,
                    help="floor_cycle (default: build/tests/bench/floor_cycle next to kairosd)")
    ap.add_argument("--burst", type=int, default=256, help="mandates due together")
    ap.add_argument("--only", choices=("burst", "throughput", "memory"), action="append",
                    help="run only these parts (repeatable)")
    args = ap.parse_args()
    kairos_harness.KAIROSD = os.path.abspath(args.kairosd)
    if args.floor is None:
        args.floor = os.path.join(os.path.dirname(os.path.abspath(args.kairosd)), "..", "..",
                                  "tests", "bench", "floor_cycle")
    args.floor = os.path.abspath(args.floor)
    if not os.access(args.floor, os.X_OK):
        ap.error("%s: no floor_cycle (build it: ninja -C build)" % args.floor)

    parent = args.dir or "/var/tmp"
    base = tempfile.mkdtemp(prefix="kairos-bench-exec-", dir=parent)
    try:
        print("kairos executor benchmark in %s (%s), /bin/true handlers, LogLevel=%s"
              % (base, fstype(base), args.log_level))
        print("machine: %d CPUs, load average %s; disk: append+fdatasync %.2f ms (median of 50)"
              % (os.cpu_count(), " ".join(open("/proc/loadavg").read().split()[:3]),
                 fdatasync_ms(base)))
        parts = args.only or ("burst", "throughput", "memory")
        if "burst" in parts:
            floor = c_floor(args, base)
            for conc in (1, 4, 16, 64, 256):
                burst(base, args, conc, args.burst, floor)
        if "throughput" in parts:
            throughput(base, args)
        if "memory" in parts:
            memory(base, args)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
