#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A mandate's cost does not grow with the history kept (run by hand).

    tests/bench/bench_registry.py --kairosd build/src/daemon/kairosd
        [-n 50000] [--mandates 100] [--reps 3] [--dir /var/tmp]

Two kairosd of the same build, each with a one-cycle, five-step /bin/true
schedule, MaxConcurrentMandates=1, KeepFinished=1000000, KeepFinishedSec=0:
one starts on an empty state directory, the other on N finished mandates
(their summaries in <state>/mandates/, bench_list.summaries).
Per repetition (the order alternates), --mandates mandates are fired one at a
time on each, each waited for by its "WAL archived" log line; kairosd's own
CPU (its process CPU-time clock: every thread, in ns; not its handlers) over
them / mandates.  Prints both, the ratio (with N / empty), the median of the
ratios (never the best) and the load average.  Target: 1.10 or less: what a
mandate costs the daemon must not depend on how many finished ones it keeps
(retention, `list`, the status line, metrics)."""
import argparse
import os
import shutil
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, HERE)
import kairos_harness  # noqa: E402
from kairos_harness import Client, Daemon, NotifySocket, write_config  # noqa: E402
from bench_cycle import ARCHIVED, own_cpu, schedule  # noqa: E402
from bench_executor import LogCounter, at  # noqa: E402
from bench_list import summaries  # noqa: E402


class Kairos:
    def __init__(self, base, name, n):
        self.dir = os.path.join(base, name)
        state = os.path.join(self.dir, "state")
        os.makedirs(state)
        summaries(state, n, lambda i: "bench")
        conf = write_config(self.dir, state, {"bench": schedule("/bin/true")},
                            "MaxConcurrentMandates=1\nLogLevel=info\n"
                            "KeepFinished=1000000\nKeepFinishedSec=0\n")
        self.notify = NotifySocket(self.dir)
        self.d = Daemon(state, config=conf, notify=self.notify)
        self.notify.wait_ready(timeout=600)
        with open(os.path.join(state, "kairosd.pid")) as f:
            self.pid = int(f.read().split()[0])
        self.c = Client(self.d.socket_path, timeout=600)
        self.archived = LogCounter(self.d, ARCHIVED)
        self.seq = 0

    def round(self, n):
        cpu0 = own_cpu(self.pid)
        for _ in range(n):
            r = self.c.call("fire", schedule="bench", at=at(self.seq))
            self.seq += 1
            if not r.get("ok") or not r["result"].get("fired"):
                raise RuntimeError("fire: %s" % r)
            self.archived.wait(self.archived.n + 1, timeout=120)
        return (own_cpu(self.pid) - cpu0) / n

    def stop(self):
        self.c.close()
        self.d.stop()
        self.notify.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kairosd", required=True)
    ap.add_argument("-n", type=int, default=50000)
    ap.add_argument("--mandates", type=int, default=100)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args()
    if args.n < 1 or args.mandates < 1 or args.reps < 1:
        ap.error("-n, --mandates and --reps must be >= 1")
    kairos_harness.KAIROSD = os.path.abspath(args.kairosd)
    base = tempfile.mkdtemp(prefix="kairos-bench-registry-", dir=args.dir)
    sides = []
    try:
        empty = Kairos(base, "empty", 0)
        sides.append(empty)
        full = Kairos(base, "full", args.n)
        sides.append(full)
        ratios = []
        for rep in range(args.reps):
            order = (empty, full) if rep % 2 == 0 else (full, empty)
            cpu = {k: k.round(args.mandates) for k in order}
            ratios.append(cpu[full] / cpu[empty])
            print("rep %2d: kairosd CPU per mandate %.3f ms with %d finished, %.3f ms with none: "
                  "%.2fx; load %.2f %.2f %.2f" % ((rep + 1, cpu[full] * 1000, args.n,
                                                   cpu[empty] * 1000, ratios[-1]) + os.getloadavg()),
                  flush=True)
        med = statistics.median(ratios)
        print("MEDIAN CPU per mandate with %d finished / with none = %.2f (target <= 1.10: %s; "
              "range %.2f-%.2f over %d reps of %d mandates); load %.2f %.2f %.2f"
              % ((args.n, med, "OK" if med <= 1.10 else "MISSED", min(ratios), max(ratios),
                  args.reps, args.mandates) + os.getloadavg()))
    finally:
        for k in sides:
            k.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
