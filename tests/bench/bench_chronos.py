#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""kairosd idle with many schedules: CPU use and wake-ups (run by hand).

    tests/bench/bench_chronos.py --kairosd build/src/daemon/kairosd [-n 10000]
                                 [--seconds 60] [--watchdog-sec 20] [--dir DIR]

Generates N schedules.d files with mixed cron expressions and zones, none of
which fires during the measurement (their hours avoid the next few hours, so
what is measured is idleness, not mandates), starts kairosd on the real clock
(no test hooks needed), waits for READY=1 and samples /proc/<pid>/stat
(utime+stime) and the context switches of all its threads
(/proc/<pid>/task/*/status) over --seconds.  A second run sets WATCHDOG_USEC
so the expected wake-ups are exactly the watchdog's (one per half period).
Target: no periodic wake-ups besides the next fire and the watchdog.
The in-process next-fire benchmark is build/tests/bench/bench_chronos."""
import argparse
import os
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import kairos_harness  # noqa: E402
from kairos_harness import Client, Daemon, NotifySocket  # noqa: E402

ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo", "Australia/Sydney",
         "Asia/Kolkata"]
HZ = os.sysconf("SC_CLK_TCK")


def gen_schedules(sdir, n, now, rng):
    os.makedirs(sdir)
    # Zones have offsets from -5 to +10 (+5:30): pick local hours far from now
    # in UTC terms for each zone separately.
    zone_off = {"UTC": 0, "Europe/Berlin": 1, "America/New_York": -5, "Asia/Tokyo": 9,
                "Australia/Sydney": 10, "Asia/Kolkata": 5}
    hour_now = time.gmtime(now).tm_hour
    for i in range(n):
        zone = rng.choice(ZONES)
        off = zone_off[zone]
        # local hours at least 3 h away from "now" in that zone (DST +-1 h included)
        local_now = (hour_now + off) % 24
        allowed = [h for h in range(24) if min((h - local_now) % 24, (local_now - h) % 24) >= 4]
        h1, h2 = sorted(rng.sample(allowed, 2))
        m = rng.randrange(60)
        kind = rng.randrange(7)
        if kind == 0:
            cron = "%d %d * * *" % (m, h1)
        elif kind == 1:
            cron = "%d %d * * 1-5" % (m, h1)
        elif kind == 2:
            cron = "*/%d %d * * *" % (rng.choice([5, 10, 15, 20, 30]), h1)
        elif kind == 3:
            cron = "%d %d,%d * * *" % (m, h1, h2)
        elif kind == 4:
            cron = "%d %d 1,15 * MON" % (m, h1)
        elif kind == 5:
            cron = "%d %d %d * *" % (m, h1, rng.randrange(1, 29))
        else:
            cron = "%d %d 29 2 *" % (m, h1)
        with open(os.path.join(sdir, "s%05d.conf" % i), "w") as f:
            f.write("[Schedule]\nCron=%s\nTimeZone=%s\nMissedPolicy=%s\n"
                    % (cron, zone, rng.choice(["skip", "catch_up_once", "catch_up_bounded"])))


def cpu_ticks(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def switches(pid):
    vol = invol = 0
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/status" % (pid, tid)) as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        vol += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches:"):
                        invol += int(line.split()[1])
        except FileNotFoundError:
            pass
    return vol, invol


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def run(base, n, seconds, watchdog_usec, label):
    state = os.path.join(base, "state-" + label)
    conf = os.path.join(base, "kairosd.conf")
    with open(conf, "w") as f:
        f.write("[Daemon]\nStateDirectory=%s\nControlSocket=%s/control.sock\n" % (state, state))
    notify = NotifySocket(tempfile.mkdtemp(dir=base))
    env = {}
    if watchdog_usec:
        env["WATCHDOG_USEC"] = str(watchdog_usec)
    t0 = time.monotonic()
    d = Daemon(state, conf, notify=notify, env=env)
    notify.wait_ready(timeout=300)
    ready_s = time.monotonic() - t0
    c = Client(d.socket_path)
    t1 = time.monotonic()
    sch = c.call("schedules")["result"]["schedules"]
    list_ms = (time.monotonic() - t1) * 1e3
    nexts = sorted(s["next_fire_at"] for s in sch if s["next_fire_at"])
    c.close()
    pid = d.proc.pid
    startup_cpu = cpu_ticks(pid) / HZ
    c0, (v0, i0) = cpu_ticks(pid), switches(pid)
    wd0 = notify.count(lambda m: "WATCHDOG=1" in m.split("\n"))
    time.sleep(seconds)  # the measurement window
    c1, (v1, i1) = cpu_ticks(pid), switches(pid)
    wd1 = notify.count(lambda m: "WATCHDOG=1" in m.split("\n"))
    rss = rss_kib(pid)
    fired = [line for line in d.log().splitlines() if "fires" in line]
    rc = d.stop()
    d.proc.stderr.close()
    notify.close()
    print("[%s] %d schedules loaded: READY=1 after %.2f s (%.2f s CPU), RSS %.1f MiB, "
          "`schedules` reply %.0f ms, earliest next fire %s"
          % (label, len(sch), ready_s, startup_cpu, rss / 1024, list_ms, nexts[0] if nexts else "-"))
    print("[%s] idle %d s: CPU %.3f s (%.3f%%), voluntary context switches %d, "
          "involuntary %d, WATCHDOG=1 sent %d, ticks fired %d, exit %d"
          % (label, seconds, (c1 - c0) / HZ, 100.0 * (c1 - c0) / HZ / seconds, v1 - v0, i1 - i0,
             wd1 - wd0, len(fired), rc))
    return v1 - v0, wd1 - wd0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kairosd", required=True)
    ap.add_argument("-n", type=int, default=10000)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--watchdog-sec", type=int, default=20)
    ap.add_argument("--dir", default=None, help="parent directory (default: /var/tmp)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    kairos_harness.KAIROSD = os.path.abspath(args.kairosd)

    base = tempfile.mkdtemp(prefix="kairos-bench-chronos-", dir=args.dir or "/var/tmp")
    try:
        rng = random.Random(args.seed)
        now = int(time.time())
        gen_schedules(os.path.join(base, "schedules.d"), args.n, now, rng)
        print("kairos chronos idle benchmark: %d schedules in %s (none fires in the next 2 h)"
              % (args.n, base))
        run(base, args.n, args.seconds, 0, "no watchdog")
        if args.watchdog_sec:
            # Daemon() copies os.environ, then pops WATCHDOG_USEC; env= is
            # applied after the pop, so it reaches kairosd.
            vol_wd, wd = run(base, args.n, args.seconds, args.watchdog_sec * 1000000,
                             "WATCHDOG_USEC=%ds" % args.watchdog_sec)
            print("wake-ups per watchdog ping: %.1f (expected about %d pings in %d s)"
                  % (vol_wd / wd if wd else float("nan"),
                     args.seconds // (args.watchdog_sec // 2), args.seconds))
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
