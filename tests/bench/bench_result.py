#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The CPU a 1 MB handler result adds to a cycle, against its C floor.

    tests/bench/bench_result.py --kairosd build/src/daemon/kairosd
        [--floor build/tests/bench/floor_result] [--dir /var/tmp] [--loop]
        [--reps 5] [--cycles 10] [--size 1000000]

A one-cycle, five-step mandate whose observe handler prints a JSON result of
--size bytes (an array of small objects: strings, integers, floats,
booleans), the other four reading their stdin (the result comes back in each
of their documents).  The same schedule with a result of `null`; kairosd's
own CPU (utime + stime of /proc/PID/stat: all its threads, not its
handlers) per cycle, the big one minus the small one, is what the result
adds.  The floor (tests/bench/floor_result.c) does in C, each byte once
where once is enough, what the data flow needs: read the result from a
pipe, parse it once, hash its canonical form once, one WAL record and one
fdatasync, four stdin documents copied by length and written to pipes, one
gzip; it prints the CPU the result adds the same way.

--reps repetitions, each a kairosd round (--cycles mandates of each kind,
one at a time) and a floor round in the same directory (the order
alternates); the MEDIAN ratio is judged (target <= 1.0).  With --loop the
same on a journaled ext4 loop-mounted in a temporary directory (root only).
Prints the load average beside the figures."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, HERE)
from bench_cycle import Kairos, LoopExt4, fs_kind, load, own_cpu  # noqa: E402

HANDLER = """#!/bin/sh
cat > /dev/null
[ "$KAIROS_PHASE" = observe ] && exec cat %s
exit 0
"""


def make_result(path, size):
    items, n, i = [], 2, 0
    while n < size - 200:
        it = {"id": i, "name": "item-%06d" % i, "score": i * 0.25 + 0.5,
              "tags": ["a", "bb", "ccc"], "ok": i % 2 == 0}
        items.append(it)
        n += len(json.dumps(it, separators=(",", ":"))) + 1
        i += 1
    text = json.dumps({"items": items}, separators=(",", ":"))
    with open(path, "w") as f:
        f.write(text + "\n")
    return len(text)


def handler(path, result):
    with open(path, "w") as f:
        f.write(HANDLER % result)
    os.chmod(path, 0o755)
    return path


def kairos_cpu(k, n):
    """kairosd's CPU per cycle over n mandates, ms."""
    cpu0 = own_cpu(k.pid)
    for _ in range(n):
        k.one()
    return (own_cpu(k.pid) - cpu0) / n * 1000


def floor_round(floor, base, result, n):
    d = tempfile.mkdtemp(prefix="floor-", dir=base)
    try:
        out = subprocess.run([floor, "--dir", d, "--result", result, "-n", str(n)],
                             check=True, capture_output=True, text=True).stdout.split()
        return float(dict(zip(out[1::2], out[2::2]))["added_ms"])
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run_on(args, parent, label):
    base = tempfile.mkdtemp(prefix="kairos-bench-result-", dir=parent)
    try:
        result = os.path.join(base, "result.json")
        size = make_result(result, args.size)
        null = os.path.join(base, "null.json")
        with open(null, "w") as f:
            f.write("null\n")
        print("%s: %s (%s); result %d bytes; load %s" % (label, base, fs_kind(base), size, load()))
        big = Kairos(base, "big", handler(os.path.join(base, "big.sh"), result), args.kairosd)
        small = Kairos(base, "small", handler(os.path.join(base, "small.sh"), null),
                       args.kairosd)
        try:
            big.one()
            small.one()
            ratios = []
            for rep in range(args.reps):
                def k_round():
                    return kairos_cpu(big, args.cycles) - kairos_cpu(small, args.cycles)
                if rep % 2:
                    f = floor_round(args.floor, base, result, args.cycles)
                    k = k_round()
                else:
                    k = k_round()
                    f = floor_round(args.floor, base, result, args.cycles)
                ratios.append(k / f if f > 0 else float("inf"))
                print("  %s rep %2d: kairosd adds %.1f ms of CPU per cycle, the floor %.1f ms: "
                      "%.2fx; load %s" % (label, rep + 1, k, f, ratios[-1], load()))
        finally:
            big.stop()
            small.stop()
        med = statistics.median(ratios)
        print("%s: a %d-byte result: MEDIAN kairosd / C floor of its data flow = %.2f "
              "(target <= 1.0: %s; range %.2f-%.2f over %d reps of %d cycles); load %s"
              % (label, size, med, "OK" if med <= 1.0 else "MISSED", min(ratios), max(ratios),
                 args.reps, args.cycles, load()))
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kairosd", required=True)
    ap.add_argument("--floor", default=None,
                    help="floor_result (default: next to kairosd's build)")
    ap.add_argument("--dir", default="/var/tmp", help="parent directory; not tmpfs")
    ap.add_argument("--loop", action="store_true",
                    help="also on a loop-mounted journaled ext4 (root only)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cycles", type=int, default=10, help="mandates of each kind per round")
    ap.add_argument("--size", type=int, default=1000000, help="bytes of the result")
    args = ap.parse_args()
    args.kairosd = os.path.abspath(args.kairosd)
    if not args.floor:
        args.floor = os.path.join(os.path.dirname(args.kairosd), "..", "..", "tests", "bench",
                                  "floor_result")
    if args.loop and os.geteuid() != 0:
        ap.error("--loop needs root (mkfs.ext4, mount -o loop)")
    run_on(args, args.dir, "dir")
    if args.loop:
        loop = LoopExt4(args.dir)
        try:
            run_on(args, loop.mnt, "loop-ext4j")
        finally:
            loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
