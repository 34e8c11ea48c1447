#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The handoffs of a step between kairosd's threads, beside the C floor.

    tests/bench/bench_handoffs.py --kairosd build/src/daemon/kairosd
        [--floor build/tests/bench/floor_cycle] [--dir /var/tmp]
        [--handler /bin/true] [--mandates 20] [--reps 3]

A step of kairosd passes through three threads; the floor
(tests/bench/floor_cycle.c) does it all on one.  Each repetition records the
scheduler's wake-ups of the whole machine (`perf sched record -a`, root)
over a round of one-cycle, five-step mandates on a kairosd (bench_cycle.py's
set-up: MaxConcurrentMandates=1, fired one at a time), then over a round of
the floor, and reads `perf sched timehist -w`.  For each step of kairosd,
from the wake-ups (kairosd's threads by name: the loop `kairosd`, the jobs'
threads `kairosd-jobs`, the runner's `kairosd-runner`, or the other
`kairosd` of a kairosd that did not name it):

  exit   the handler's exit wakes the loop (its pidfd);
  sub    the loop wakes a jobs thread (the advance job: the completed
         record, fold, decide, the next executing record, fdatasync);
  done   that jobs thread wakes the loop (the job is done);
  post   the loop wakes the runner's thread (the next handler's spawn);
  clone  the runner's thread wakes the new child (its clone).

and for the floor: the handler's exit wakes the floor, the floor wakes its
next child.  Printed: the median (p25, p75) in microseconds of each interval
over the steps of all the repetitions, kairosd's exit -> clone beside the
floor's, and the load average.  A handler's own run (clone -> exit) is the
same program on both sides and is not counted.

Run by hand, on a quiet machine (the intervals are wake-up latencies: a
busy second core lengthens them), not tmpfs; needs perf and root."""
import argparse
import os
import re
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
from bench_cycle import Kairos, fs_kind, load, resolve_paths  # noqa: E402

WAKE = re.compile(r"^\s*([\d.]+)\s+\[\d+\]\s+(\S+)\s+awakened: (\S+)")
KAIROS_STEPS = ("exit", "sub", "done", "post", "clone")


def record(path, run):
    """run() under perf sched record -a into path; the wake-ups read back as
    (time in us, waker, woken), each task as timehist names it: comm[tid]
    or comm[tid/pid]."""
    p = subprocess.Popen(["perf", "sched", "record", "-a", "-o", path],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # perf has its events open once it wrote the file's header
        deadline = time.monotonic() + 30
        while not os.path.exists(path) or os.path.getsize(path) == 0:
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("perf sched record did not start")
            time.sleep(0.01)
        run()
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(60)
    out = subprocess.run(["perf", "sched", "timehist", "-w", "-i", path],
                         capture_output=True, text=True, check=True).stdout
    return [(float(m.group(1)) * 1e6, m.group(2), m.group(3))
            for m in map(WAKE.match, out.splitlines()) if m]


def threads(pid):
    """kairosd's tasks by name, as timehist writes them."""
    names = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
            name = f.read().strip()
        task = "%s[%s]" % (name, tid) if int(tid) == pid else "%s[%s/%d]" % (name, tid, pid)
        names.setdefault(name, set()).add(task)
    return names


def pid_of(task):
    """The first number of comm[tid] or comm[tid/pid] (None: <idle>)."""
    if "[" not in task:
        return None
    return task[task.rindex("[") + 1:].split("/")[0].rstrip("]")


def kairos_steps(wakes, names):
    loop = next(t for t in names["kairosd"] if "/" not in t)
    jobs = names.get("kairosd-jobs", set())
    # (a kairosd whose runner's thread had no name of its own: the loop's)
    runner = names.get("kairosd-runner") or names["kairosd"] - {loop}
    own = set().union(*names.values())
    steps, cur, children = [], None, set()
    for t, who, whom in wakes:
        if who in runner and whom not in own:
            children.add(pid_of(whom))
        if whom == loop and pid_of(who) in children:
            cur = {"exit": t}
        elif cur is None:
            continue
        elif "sub" not in cur and who == loop and whom in jobs:
            cur["sub"] = t
        elif "sub" in cur and "done" not in cur and who in jobs and whom == loop:
            cur["done"] = t
        elif "done" in cur and "post" not in cur and who == loop and whom in jobs:
            cur = None  # another job (the mandate ended: its next fire)
        elif "done" in cur and "post" not in cur and who == loop and whom in runner:
            cur["post"] = t
        elif "post" in cur and who in runner and whom not in own:
            cur["clone"] = t
            steps.append(cur)
            cur = None
    return steps


def floor_steps(wakes, per_mandate=5):
    """The floor's steps but each mandate's first (after the end of the
    mandate before: its archive, syncfs and unlink)."""
    out = []
    for floor in {w for _, w, _ in wakes if w.startswith("floor_cycle[")}:
        exit_t, spawned = None, []
        for t, who, whom in wakes:
            if whom == floor and spawned and pid_of(who) == spawned[-1] \
                    and not who.startswith("floor_cycle[") and exit_t is None:
                exit_t = t  # its exit (a wake by it before its exec: the spawn's)
            elif who == floor and whom.startswith("floor_cycle[") and whom != floor \
                    and pid_of(whom) not in spawned:
                spawned.append(pid_of(whom))  # a new child (its first wake-up: the spawn)
                if exit_t is not None and (len(spawned) - 1) % per_mandate:
                    out.append({"exit": exit_t, "clone": t})
                exit_t = None
    return out


def figure(steps, a, b):
    v = sorted(s[b] - s[a] for s in steps)
    if not v:
        return "%s -> %s: no step" % (a, b)
    return "%s -> %s: %4.0f us (p25 %.0f, p75 %.0f)" % (
        a, b, statistics.median(v), v[len(v) // 4], v[3 * len(v) // 4])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kairosd", required=True)
    ap.add_argument("--floor", default=None,
                    help="floor_cycle (default: build/tests/bench/floor_cycle next to kairosd)")
    ap.add_argument("--dir", default="/var/tmp", help="parent directory; not tmpfs")
    ap.add_argument("--handler", default="/bin/true", help="each phase's command")
    ap.add_argument("--mandates", type=int, default=20, help="mandates per round")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    if args.reps < 1 or args.mandates < 1:
        ap.error("--reps and --mandates must be >= 1")
    if os.geteuid() != 0 or not shutil.which("perf"):
        ap.error("needs root and perf (perf sched record -a)")
    resolve_paths(ap, args)
    base = tempfile.mkdtemp(prefix="kairos-bench-handoffs-", dir=args.dir)
    print("dir: %s (%s); handler %s; load %s" % (base, fs_kind(base), args.handler, load()))
    ks, fs = [], []
    try:
        for rep in range(args.reps):
            k = Kairos(base, "k%d" % rep, args.handler, args.kairosd)
            try:
                k.round(2)  # its threads started, the spare WALs made
                names = threads(k.pid)
                wakes = record(os.path.join(base, "k%d.data" % rep),
                               lambda: k.round(args.mandates))
            finally:
                k.stop()
            ks += kairos_steps(wakes, names)
            d = os.path.join(base, "f%d" % rep)
            os.makedirs(d)
            wakes = record(os.path.join(base, "f%d.data" % rep), lambda: subprocess.run(
                [args.floor, "--dir", d, "--handler", args.handler, "-n", str(args.mandates)],
                check=True, capture_output=True))
            fs += floor_steps(wakes)
            print("  rep %d: kairosd %d steps, floor %d steps; load %s" % (
                rep + 1, len(ks), len(fs), load()))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print("kairosd, a step's handoffs (median over %d steps):" % len(ks))
    for a, b in zip(KAIROS_STEPS, KAIROS_STEPS[1:]):
        print("  " + figure(ks, a, b))
    print("kairosd " + figure(ks, "exit", "clone"))
    print("floor   " + figure(fs, "exit", "clone"))
    print("load: %s" % load())
    return 0


if __name__ == "__main__":
    sys.exit(main())
