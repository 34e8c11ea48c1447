#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""`kairosctl list` and `kairosctl schedules` at scale (run by hand).

    tests/bench/bench_list.py --kairosd build/src/daemon/kairosd \
        --kairosctl build/src/ctl/kairosctl [-n 100000] [--schedules 10000] [--dir DIR]

Generates N finished mandates (their summaries in <state>/mandates/; the
archives are not read by list) and S schedules, starts kairosd (retention
off), and times, as seen by a client, over --rounds calls each:
  floor      `kairosctl status` (one round trip of the same client)
  list       `kairosctl list --limit 50` (the newest 50 of N)
  list page  `kairosctl list --limit 50 --after ID` (the second page)
  filtered   `kairosctl list --limit 50 --status failed`
  schedules  `kairosctl schedules` (all S)
and the daemon's RSS.  The rounds interleave the commands (status, list, ...,
status, list, ...) so that each figure and its floor see the same load.
Prints medians, their ratio to the floor and the load average.  Targets: list --limit 50 <= 50 ms with 100,000; schedules <= 100 ms
with 10,000."""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import kairos_harness  # noqa: E402
from kairos_harness import Daemon, NotifySocket  # noqa: E402


def rss_mb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def summaries(state, n, schedule):
    """n finished mandates' summaries in <state>/mandates/ (every 50th
    failed, the others done), one a minute from 2025-01-01; schedule(i)
    names the i-th one's schedule."""
    mdir = os.path.join(state, "mandates")
    os.makedirs(mdir)
    os.makedirs(os.path.join(state, "wal"))
    os.makedirs(os.path.join(state, "archive"))
    base = 1735689600  # 2025-01-01
    for i in range(n):
        t = base + i * 60
        fired = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
        mid = "mnd_%032x" % random.getrandbits(128)
        status = "failed" if i % 50 == 0 else "done"
        with open(os.path.join(mdir, mid + ".json"), "w") as f:
            json.dump({"mandate_id": mid, "schedule": schedule(i),
                       "fired_at": fired, "status": status, "reason": None, "cycles": 1,
                       "ended_at": t + 2, "started_ms": t * 1000, "ended_ms": t * 1000 + 1500,
                       "archive": os.path.join(state, "archive", mid + ".wal.jsonl.gz")}, f)


def gen(state, confdir, n, nsched):
    summaries(state, n, lambda i: "s%05d" % (i % max(nsched, 1)))
    sdir = os.path.join(confdir, "schedules.d")
    os.makedirs(sdir)
    for i in range(nsched):
        with open(os.path.join(sdir, "s%05d.conf" % i), "w") as f:
            f.write("[Schedule]\nCron=%d %d 1 1 *\n[Exec]\nObserve=/bin/true\n"
                    % (i % 60, (i // 60) % 24))
    conf = os.path.join(confdir, "kairosd.conf")
    with open(conf, "w") as f:
        f.write("[Daemon]\nStateDirectory=%s\nControlSocket=%s/control.sock\n"
                "KeepFinished=0\nKeepFinishedSec=0\n" % (state, state))
    return conf


def once(ctl, sock, args):
    t0 = time.monotonic()
    r = subprocess.run([ctl, "--socket", sock, *args], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    took = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit("kairosctl %s: %s" % (" ".join(args), r.stderr))
    return took, r.stdout


def timed_rounds(ctl, sock, commands, rounds):
    """Median time of each command, the commands interleaved round by round."""
    times = [[] for _ in commands]
    for _ in range(rounds):
        for i, args in enumerate(commands):
            times[i].append(once(ctl, sock, args)[0])
    return [statistics.median(t) for t in times]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kairosd", required=True)
    ap.add_argument("--kairosctl", required=True)
    ap.add_argument("-n", type=int, default=100000)
    ap.add_argument("--schedules", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    kairos_harness.KAIROSD = os.path.abspath(args.kairosd)
    ctl = os.path.abspath(args.kairosctl)
    base = tempfile.mkdtemp(prefix="kairos-bench-list-", dir=args.dir or "/var/tmp")
    d = None
    try:
        state = os.path.join(base, "state")
        t0 = time.monotonic()
        conf = gen(state, base, args.n, args.schedules)
        print("kairos list/schedules benchmark: %d finished mandates, %d schedules "
              "(generated in %.1f s)" % (args.n, args.schedules, time.monotonic() - t0))
        notify = NotifySocket(base)
        t0 = time.monotonic()
        d = Daemon(state, config=conf, notify=notify)
        notify.wait_ready(timeout=600)
        print("READY=1 after %.2f s, RSS %.0f MB" % (time.monotonic() - t0, rss_mb(d.proc.pid)))
        sock = os.path.join(state, "control.sock")
        nxt = json.loads(once(ctl, sock, ["--json", "list", "--limit", "50"])[1])["next"]
        floor, lst, page, filt, sch, schj = timed_rounds(ctl, sock, [
            ["status"], ["list", "--limit", "50"], ["list", "--limit", "50", "--after", nxt],
            ["list", "--limit", "50", "--status", "failed"], ["schedules"],
            ["--json", "schedules"]], args.rounds)
        rss = rss_mb(d.proc.pid)
        load = os.getloadavg()
        print("floor (status)              %7.1f ms" % (floor * 1000))
        for name, v, target in (("list --limit 50", lst, 0.050), ("list page 2", page, 0.050),
                                ("list --status failed", filt, 0.050),
                                ("schedules (text)", sch, 0.100),
                                ("schedules (--json)", schj, 0.100)):
            print("%-27s %7.1f ms  %5.1fx floor  target %3.0f ms: %s"
                  % (name, v * 1000, v / floor, target * 1000, "OK" if v <= target else "MISSED"))
        print("daemon RSS after the calls   %6.0f MB" % rss)
        print("load average %.2f %.2f %.2f" % load)
    finally:
        if d:
            d.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
