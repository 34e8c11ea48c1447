#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Concurrency benchmark: K five-step mandates of `sleep 0.2` handlers at once.

    tests/bench/bench_concurrency.py --kairosd build/src/daemon/kairosd
        [--dir /var/tmp] [--k 1,16,64,256] [--waves 3] [--reps 3]

The floor here is arithmetic, not a program: a five-step mandate whose every
handler sleeps 0.2 s cannot take less than 1.0 s, so K mandates running side
by side can at best finish K cycles per second.  For each K one kairosd runs
the schedule with MaxConcurrentMandates=K, MaxCycles=1 and LogLevel=info;
a repetition fires K x --waves mandates together (pipelined on one control
connection, distinct --at times) and times from the first request to the
last "done after 1 cycle" log line.  Cycles per second = mandates / time; the
printed ratio is that over the ideal K/s (the waves add no ideal time beyond
waves x 1.0 s).  Judged on the median of --reps repetitions, with the load
average beside it.  Targets: >= 0.9x the ideal up to K = 64, >= 0.7x at
K = 256.

Run by hand on a quiet machine, not tmpfs."""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, HERE)
import kairos_harness  # noqa: E402
from kairos_harness import Client, Daemon, NotifySocket, write_config  # noqa: E402
from bench_executor import LogCounter, at  # noqa: E402

PHASES = ("Observe", "Orient", "Decide", "Act", "Reflect")
STEP_S = 0.2


def load():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def run_k(base, k, waves, reps):
    d = os.path.join(base, "k%d" % k)
    state = os.path.join(d, "state")
    os.makedirs(state)
    sched = {"Schedule": {"Cron": "0 0 1 1 *", "Concurrency": "allow"},
             "Mandate": {"MaxCycles": "1"},
             "Exec": {p: "sleep %.1f" % STEP_S for p in PHASES}}
    conf = write_config(d, state, {"s": sched},
                        "MaxConcurrentMandates=%d\nLogLevel=info\n" % k)
    notify = NotifySocket(d)
    daemon = Daemon(state, config=conf, notify=notify)
    ratios = []
    try:
        notify.wait_ready(timeout=120)
        c = Client(daemon.socket_path, timeout=600)
        done = LogCounter(daemon, "done after 1 cycle")
        n = k * waves
        fired = 0
        for rep in range(reps):
            t0 = time.monotonic()
            for i in range(n):
                c.send_raw(('{"v":1,"id":%d,"cmd":"fire","args":{"schedule":"s","at":"%s"}}\n'
                            % (fired + i + 1, at(fired + i))).encode())
            for i in range(n):
                r = c.recv_reply()
                if not r.get("ok") or not r["result"].get("fired"):
                    raise RuntimeError("fire refused: %s" % r)
            fired += n
            t1 = done.wait(fired, timeout=600)
            rate = n / (t1 - t0)
            ideal = k / (len(PHASES) * STEP_S)
            ratios.append(rate / ideal)
            print("  K=%-4d rep %d: %d mandates in %.2f s: %.1f cycles/s = %.3fx the ideal %.0f/s"
                  " (load %s)" % (k, rep + 1, n, t1 - t0, rate, rate / ideal, ideal, load()),
                  flush=True)
        c.close()
    finally:
        rc = daemon.stop(timeout=300)
        notify.close()
        if rc != 0:
            raise RuntimeError("kairosd exit %d:\n%s" % (rc, daemon.log()[-3000:]))
    return statistics.median(ratios)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kairosd", required=True)
    ap.add_argument("--dir", default="/var/tmp", help="parent directory; not tmpfs")
    ap.add_argument("--k", default="1,16,64,256", help="concurrencies, comma-separated")
    ap.add_argument("--waves", type=int, default=3, help="mandates fired = K x waves")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    kairos_harness.KAIROSD = os.path.abspath(args.kairosd)
    base = tempfile.mkdtemp(prefix="kairos-bench-conc-", dir=args.dir)
    rows = []
    try:
        for k in (int(x) for x in args.k.split(",")):
            med = run_k(base, k, args.waves, args.reps)
            target = 0.9 if k <= 64 else 0.7
            rows.append((k, med, target))
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print("\nsleep %.1f handlers, 5 steps, median of %d repetitions (load %s):"
          % (STEP_S, args.reps, load()))
    for k, med, target in rows:
        print("  K=%-4d %.3fx the ideal (target >= %.1fx): %s"
              % (k, med, target, "met" if med >= target else "NOT met"))


if __name__ == "__main__":
    main()
