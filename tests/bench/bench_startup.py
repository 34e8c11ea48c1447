#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Startup benchmark: exec to READY=1 with N unfinished mandate WALs, against
a one-thread C floor.

    tests/bench/bench_startup.py --kairosd build/src/daemon/kairosd
        [--floor build/tests/bench/floor_startup] [--dir /var/tmp] [--loop]
        [--counts 10000,100000] [--reps 5] [--big-reps 3] [--store]
        [--baseline OTHER_KAIROSD]

The WALs are generated once per count (each with the mandate record of
schedule "bench", Effects=observe, and its plan): half were interrupted in
the middle of a step (observe completed, orient left executing: recovery
records its verdict there), half never started a step.  Each repetition
copies the set afresh for each side, syncs, and times, in alternating order:

  kairosd: from its exec to READY=1 on NOTIFY_SOCKET; its peak RSS (VmHWM)
    and its CPU time (user + system, all threads) at READY; its journal
    lines go to a file (not through a reader in this script, which took a
    share of the same cores);
  floor (tests/bench/floor_startup.c, one thread): read every WAL fully,
    append ~200 bytes to each interrupted one, one syncfs.

Printed per repetition: both times, the ratio and the RSS; then the MEDIAN
ratio (never the best) per count, with the load average.  With --baseline
another kairosd (say main's build) runs in the same repetitions, in turn
with the other two (the order rotates), and its median ratio to the same
floors is printed beside: an A/B on a shared machine.  Targets: READY
<= 1.5x the floor at 10,000 and at 100,000 WALs; RSS <= 100 MB at 100,000.
--reps repetitions for counts up to 10,000, --big-reps above (at least 5 at
10,000 for the judgement).  With --loop the same is run on a 2 GB journaled
ext4 loop-mounted in a temporary directory (root only) and both are printed.

With --store, each repetition also starts kairosd with EffectsVia=kairosctl
and an idempotency log holding one call owned by each interrupted step (half
finished, half interrupted), loaded before recovery and consulted by it; the
median of READY(store) / READY(wal) is printed (target <= 1.2).

Run by hand on a quiet machine, not tmpfs."""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, HERE)
import kairos_harness  # noqa: E402
from kairos_harness import (Client, Daemon, NotifySocket, append, completed, executing,  # noqa: E402
                            plan_commit, wal_line)
from bench_cycle import LoopExt4, fs_kind, load  # noqa: E402


def peak_rss_mb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def cpu_s(pid):
    """The process's CPU time so far (user + system, every thread), s."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def generate(wal, n):
    """n unfinished WALs: even ones interrupted in orient_001, odd ones
    planned but never started."""
    os.makedirs(wal)
    for i in range(n):
        m = "mnd_b%06d" % i
        p = "plan_b%06d" % i
        recs = [{"op": "mandate", "mandate_id": m, "schedule": "bench",
                 "fired_at": "2026-04-20T12:00:00Z", "ts": "2026-04-20T12:00:00.000Z"},
                plan_commit(p, m), append("observe_001", p, m)]
        if i % 2 == 0:
            recs += [executing("observe_001"), completed("observe_001"),
                     append("orient_001", p, m), executing("orient_001")]
        with open(os.path.join(wal, m + ".wal.jsonl"), "w") as f:
            f.write("".join(wal_line(r) for r in recs))


def idem_line(rec):
    body = json.dumps(rec, separators=(",", ":"))
    return body[:-1] + ',"crc":"%08x"}\n' % (zlib.crc32(body.encode()) & 0xFFFFFFFF)


def write_idem_log(state, n):
    """One call owned by orient_001 of every interrupted mandate (even i):
    completed for i % 4 == 0, left processing (comes back interrupted)
    otherwise."""
    d = os.path.join(state, "idem")
    os.makedirs(d, mode=0o700)
    fp = "sha256-" + "0" * 64
    with open(os.path.join(d, "idem.jsonl"), "w") as f:
        for i in range(0, n, 2):
            m = "mnd_b%06d" % i
            rec = {"op": "begin", "key": "cmd:k%06d" % i, "tool": "cmd", "fp": fp,
                   "created": 1776686400000,
                   "owner": {"mandate": m, "step": "orient_001", "attempt": 1},
                   "ts": "2026-04-20T12:00:00.000Z"}
            f.write(idem_line(rec))
            if i % 4 == 0:
                rec = dict(rec)
                rec["op"] = "complete"
                del rec["ts"]
                rec.update({"finished": 1776686400001, "result": "",
                            "ts": "2026-04-20T12:00:00.001Z"})
                f.write(idem_line(rec))


def write_config(top, state, store):
    sdir = os.path.join(top, "schedules.d")
    os.makedirs(sdir)
    conf = os.path.join(top, "kairosd.conf")
    with open(conf, "w") as f:
        f.write("[Daemon]\nStateDirectory=%s\nControlSocket=%s/control.sock\n"
                "MaxConcurrentMandates=1\n" % (state, state))
    with open(os.path.join(sdir, "bench.conf"), "w") as f:
        f.write("[Schedule]\nCron=0 0 1 1 *\n[Exec]\n%s\nEffects=observe\n%s"
                % ("\n".join("%s=/bin/true" % p for p in
                             ("Observe", "Orient", "Decide", "Act", "Reflect")),
                   "EffectsVia=kairosctl\n" if store else ""))
    return conf


class FileLogDaemon:
    """kairosd with its journal lines going to a file (as with systemd's
    StandardError=file:), not read line by line by this script: kairosd
    still formats and writes every line, but a Python reader of 100,000
    lines no longer takes a share of the cores kairosd is timed on."""

    def __init__(self, kairosd, state, conf, notify, logpath):
        env = dict(os.environ)
        for k in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "JOURNAL_STREAM"):
            env.pop(k, None)
        env["NOTIFY_SOCKET"] = notify.path
        self.logpath = logpath
        self.log_f = open(logpath, "wb")
        self.proc = subprocess.Popen([kairosd, "-c", conf, "--state-dir", state], env=env,
                                     stdout=subprocess.DEVNULL, stderr=self.log_f)

    def stop(self, timeout):
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout)
        finally:
            self.log_f.close()

    def log(self):
        with open(self.logpath, errors="replace") as f:
            return f.read()


def kairos_round(args, base, golden, n, store, kairosd=None):
    """Copy the WALs, start kairosd, time exec -> READY=1."""
    top = tempfile.mkdtemp(prefix="kairos-", dir=base)
    try:
        state = os.path.join(top, "state")
        os.makedirs(state)
        shutil.copytree(golden, os.path.join(state, "wal"))
        conf = write_config(top, state, store)
        if store:
            write_idem_log(state, n)
        os.sync()
        notify = NotifySocket(top)
        t0 = time.monotonic()
        d = FileLogDaemon(kairosd or args.kairosd, state, conf, notify,
                          os.path.join(top, "kairosd.log"))
        try:
            notify.wait_ready(timeout=1800)
            ready = time.monotonic() - t0
            hwm = peak_rss_mb(d.proc.pid)
            cpu = cpu_s(d.proc.pid)
            c = Client(os.path.join(state, "control.sock"), timeout=600)
            rec = c.call("status")["result"]["recovery"]
            c.close()
        finally:
            rc = d.stop(timeout=600)
            notify.close()
        if rc != 0:
            raise RuntimeError("kairosd exit %d:\n%s" % (rc, d.log()[-3000:]))
        return ready, hwm, rec, cpu
    finally:
        shutil.rmtree(top, ignore_errors=True)


def floor_round(args, base, golden):
    top = tempfile.mkdtemp(prefix="floor-", dir=base)
    try:
        wal = os.path.join(top, "wal")
        shutil.copytree(golden, wal)
        os.sync()
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run([args.floor, wal], check=True, capture_output=True,
                             text=True).stdout.split()
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        f = dict(zip(out[1::2], out[2::2]))
        cpu = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
        return float(f["wall_s"]), int(f["appended"]), cpu
    finally:
        shutil.rmtree(top, ignore_errors=True)


def idle_rss(base):
    """The RSS floor: the same daemon at READY with no WAL at all."""
    top = tempfile.mkdtemp(prefix="idle-", dir=base)
    try:
        state = os.path.join(top, "state")
        os.makedirs(os.path.join(state, "wal"))
        conf = write_config(top, state, False)
        notify = NotifySocket(top)
        d = Daemon(state, config=conf, notify=notify)
        try:
            notify.wait_ready(timeout=120)
            return peak_rss_mb(d.proc.pid)
        finally:
            d.stop()
            notify.close()
    finally:
        shutil.rmtree(top, ignore_errors=True)


def run_on(args, goldens, parent, label):
    base = tempfile.mkdtemp(prefix="kairos-bench-startup-", dir=parent)
    try:
        print("%s: %s (%s); load %s" % (label, base, fs_kind(base), load()))
        kairos_harness.KAIROSD = args.kairosd
        print("%s: RSS floor %.1f MB (READY with no WAL)" % (label, idle_rss(base)))
        for n, golden in goldens:
            reps = args.reps if n <= 10000 else args.big_reps
            ratios, peaks, stores, bratios, bpeaks = [], [], [], [], []
            cpus, fcpus, bcpus = [], [], []
            for rep in range(reps):
                # the order rotates: each side goes first, second (and third)
                sides = ["kairosd", "floor"] + (["baseline"] if args.baseline else [])
                k = rep % len(sides)
                got = {}
                for side in sides[k:] + sides[:k]:
                    if side == "floor":
                        got[side] = floor_round(args, base, golden)
                    else:
                        got[side] = kairos_round(args, base, golden, n, False,
                                                 args.baseline if side == "baseline" else None)
                ready, hwm, rec, cpu = got["kairosd"]
                floor, appended, fcpu = got["floor"]
                ratios.append(ready / floor)
                peaks.append(hwm)
                cpus.append(cpu)
                fcpus.append(fcpu)
                line = ("  %s %6d WALs rep %d: READY %.3f s (recovery %d ms inside; %s), floor "
                        "%.3f s (%d appended, CPU %.2f s): %.2fx; peak RSS %.0f MB; CPU %.2f s"
                        % (label, n, rep + 1, ready, rec["duration_ms"], rec["summary"], floor,
                           appended, fcpu, ready / floor, hwm, cpu))
                if args.baseline:
                    bready, bhwm, _, bcpu = got["baseline"]
                    bratios.append(bready / floor)
                    bpeaks.append(bhwm)
                    bcpus.append(bcpu)
                    line += "; baseline READY %.3f s = %.2fx, RSS %.0f MB, CPU %.2f s" % (
                        bready, bready / floor, bhwm, bcpu)
                if args.store:
                    sready = kairos_round(args, base, golden, n, True)[0]
                    stores.append(sready / ready)
                    line += "; with the store %.3f s = %.2fx" % (sready, sready / ready)
                print(line + "; load %s" % load())
            med = statistics.median(ratios)
            rss_ok = "" if n < 100000 else "; RSS target <= 100 MB: %s" % (
                "OK" if max(peaks) <= 100 else "MISSED")
            print("%s: %d WALs: MEDIAN READY / one-thread C floor = %.2f (target <= 1.5: %s; "
                  "range %.2f-%.2f over %d reps); peak RSS max %.0f MB%s; median CPU %.2f s "
                  "(floor %.2f s); load %s"
                  % (label, n, med, "OK" if med <= 1.5 else "MISSED", min(ratios), max(ratios),
                     reps, max(peaks), rss_ok, statistics.median(cpus), statistics.median(fcpus),
                     load()))
            if args.baseline:
                print("%s: %d WALs: baseline (%s) MEDIAN READY / the same floors = %.2f (range "
                      "%.2f-%.2f); peak RSS max %.0f MB; median CPU %.2f s; this build / "
                      "baseline = %.2f; load %s"
                      % (label, n, args.baseline, statistics.median(bratios), min(bratios),
                         max(bratios), max(bpeaks), statistics.median(bcpus),
                         med / statistics.median(bratios), load()))
            if args.store:
                sm = statistics.median(stores)
                print("%s: %d WALs: MEDIAN READY with the store / from the WALs alone = %.2f "
                      "(target <= 1.2: %s)" % (label, n, sm, "OK" if sm <= 1.2 else "MISSED"))
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kairosd", required=True)
    ap.add_argument("--floor", default=None,
                    help="floor_startup (default: build/tests/bench/floor_startup next to kairosd)")
    ap.add_argument("--dir", default="/var/tmp", help="parent directory; not tmpfs")
    ap.add_argument("--loop", action="store_true",
                    help="also on a loop-mounted journaled ext4 (root only)")
    ap.add_argument("--counts", default="10000,100000",
                    help="numbers of unfinished WALs, comma-separated")
    ap.add_argument("--reps", type=int, default=5, help="repetitions up to 10,000 WALs")
    ap.add_argument("--big-reps", type=int, default=3, help="repetitions above 10,000 WALs")
    ap.add_argument("--store", action="store_true",
                    help="also time recovery with the idempotency store consulted")
    ap.add_argument("--baseline", default=None,
                    help="another kairosd (e.g. main's build) timed in the same repetitions, "
                         "interleaved, against the same floors")
    args = ap.parse_args()
    try:
        counts = [int(x) for x in args.counts.split(",")]
    except ValueError:
        ap.error("--counts %s: comma-separated numbers expected" % args.counts)
    if any(c < 1 for c in counts) or args.reps < 1 or args.big_reps < 1:
        ap.error("--counts, --reps and --big-reps must be >= 1")
    args.kairosd = os.path.abspath(args.kairosd)
    if args.baseline:
        args.baseline = os.path.abspath(args.baseline)
        if not os.access(args.baseline, os.X_OK):
            ap.error("--baseline %s: not an executable" % args.baseline)
    kairos_harness.KAIROSD = args.kairosd
    if args.floor is None:
        args.floor = os.path.join(os.path.dirname(args.kairosd), "..", "..", "tests", "bench",
                                  "floor_startup")
    args.floor = os.path.abspath(args.floor)
    if not os.access(args.floor, os.X_OK):
        ap.error("%s: no floor_startup (build it: ninja -C build)" % args.floor)
    if args.loop and os.geteuid() != 0:
        ap.error("--loop needs root (mkfs.ext4, mount -o loop)")

    gen = tempfile.mkdtemp(prefix="kairos-bench-startup-wals-", dir=args.dir)
    try:
        goldens = []
        for n in counts:
            t0 = time.monotonic()
            golden = os.path.join(gen, "w%d" % n)
            generate(golden, n)
            goldens.append((n, golden))
            print("generated %d WALs in %.1f s" % (n, time.monotonic() - t0))
        run_on(args, goldens, args.dir, "dir")
        if args.loop:
            loop = LoopExt4(args.dir, size_mb=2048, inodes=max(counts) * 3 + 10000)
            try:
                run_on(args, goldens, loop.mnt, "loop-ext4j")
            finally:
                loop.close()
    finally:
        shutil.rmtree(gen, ignore_errors=True)
    print("load: %s" % subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
