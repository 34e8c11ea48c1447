#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Durability cost per mandate, counted with strace over kairosd's whole life.

    tests/bench/bench_fsyncs.py --kairosd build/src/daemon/kairosd [--dir DIR]
        [--mandates 100] [--base-kairosd OTHER/kairosd] [--loop]

1. fsync-family calls (fsync, fdatasync, syncfs, sync, sync_file_range) per
   one-cycle mandate: N mandates of a schedule with five /bin/true phases,
   MaxCycles=1, fired at once by 16 clients (distinct --at times, as many
   schedules due in the same minute), all waited for, then
   SIGTERM; every call of the daemon's life (start, recovery, the mandates,
   the stop) divided by N.  The floor is the WAL's own barriers: 6 fdatasyncs
   per one-cycle mandate (5 spawns + the end); the ratio to it is printed.
   Then the same with the N mandates run alone, one after the other (as cron
   jobs are: each fired once the one before is done; target <= 7).  Each
   count is followed by its split by call and file (a WAL: <wal>).
2. WAL bytes read per WAL byte written: one mandate of 3 cycles (five /bin/true
   phases, MaxCycles=3), read(2)/pread64(2) of its WAL by the daemon (strace
   -y names the file) against the bytes it wrote there.  Target 0: what
   kairosd appended it knows without reading it back.

With --loop, the same runs are made again on a 512 MB journaled ext4
loop-mounted in a temporary directory (root only) and printed after.  The
same counts for mandates run one at a time (as cron jobs are) are printed by
tests/bench/bench_cycle.py.

With --base-kairosd the same runs are made with another build (e.g. the
previous commit) and both are printed side by side.  Run by hand on a disk
directory (default /var/tmp), not tmpfs.  Prints `uptime` beside the figures."""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import kairos_harness  # noqa: E402
from kairos_harness import Client, Daemon, NotifySocket, write_config  # noqa: E402

PHASES = ("Observe", "Orient", "Decide", "Act", "Reflect")
SYNCS = ("fsync", "fdatasync", "syncfs", "sync", "sync_file_range")
LINE_RE = re.compile(r"^(\d+)\s+(\w+)\((\d+)<([^>]*)>.*\)\s+=\s+(-?\d+)")
UNFINISHED_RE = re.compile(r"^(\d+)\s+(\w+)\((\d+)<([^>]*)>.*<unfinished \.\.\.>")
RESUMED_RE = re.compile(r"^(\d+)\s+<\.\.\. (\w+) resumed>.*\)\s+=\s+(-?\d+)")
SYNC_RE = re.compile(r"^(\d+)\s+(%s)\(" % "|".join(SYNCS))


def at(i):
    t = time.gmtime(1735689600 + i)
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", t)


def traced_run(kairosd, base, name, schedules, n_fires, done_text, trace, alone=False):
    """Start kairosd under strace, fire n_fires mandates of schedule "bench"
    at once (alone: one after the other, each once the one before is done),
    wait for n_fires done lines, stop.  Returns the trace file."""
    strace = shutil.which("strace")
    d_dir = os.path.join(base, name)
    state = os.path.join(d_dir, "state")
    os.makedirs(state)
    out = os.path.join(d_dir, "trace.txt")
    wrapper = os.path.join(d_dir, "kairosd-straced")
    with open(wrapper, "w") as f:
        f.write('#!/bin/sh\nexec %s -f -y -e signal=none -e trace=%s -o %s %s "$@"\n'
                % (strace, trace, out, kairosd))
    os.chmod(wrapper, 0o755)
    # every mandate runs at once (one queued for a slot would need one more
    # barrier: its plan is made durable when fired, its first step later)
    conf = write_config(d_dir, state, schedules, "MaxConcurrentMandates=%d\nLogLevel=notice\n"
                        % max(n_fires, 1))
    notify = NotifySocket(d_dir)
    kairos_harness.KAIROSD = wrapper
    d = Daemon(state, config=conf, notify=notify)
    try:
        notify.wait_ready(timeout=120)
        # all due at once, as many schedules due in the same minute are:
        # 16 clients fire concurrently
        errors = []

        def fire(k):
            c = Client(d.socket_path, timeout=600)
            try:
                for i in range(k, n_fires, 16):
                    r = c.call("fire", schedule="bench", at=at(i))
                    if not r.get("ok") or not r["result"]["fired"]:
                        errors.append(r)
            finally:
                c.close()
        if alone:
            c = Client(d.socket_path, timeout=600)
            try:
                for i in range(n_fires):
                    r = c.call("fire", schedule="bench", at=at(i))
                    if not r.get("ok") or not r["result"]["fired"]:
                        errors.append(r)
                        break
                    deadline = time.monotonic() + 120
                    with d.cond:  # woken by each log line
                        while sum(1 for ln in d.lines if ln and done_text in ln) <= i:
                            left = deadline - time.monotonic()
                            if left <= 0 or (d.lines and d.lines[-1] is None):
                                raise TimeoutError("mandate %d did not finish" % i)
                            d.cond.wait(left)
            finally:
                c.close()
        else:
            threads = [threading.Thread(target=fire, args=(k,)) for k in range(16)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        if errors:
            raise RuntimeError("fire: %s" % errors[:3])
        deadline = time.monotonic() + 600
        while sum(1 for line in d.log().splitlines() if done_text in line) < n_fires:
            if time.monotonic() > deadline:
                raise TimeoutError("mandates did not finish:\n" + d.log()[-2000:])
            time.sleep(0.05)  # polling a condition with a deadline
        with open(os.path.join(state, "kairosd.pid")) as f:
            os.kill(int(f.read().split()[0]), signal.SIGTERM)
        rc = d.proc.wait(120)
        d.reader.join(30)
        if rc != 0:
            raise RuntimeError("kairosd exited %d:\n%s" % (rc, d.log()[-3000:]))
    finally:
        notify.close()
        if d.proc.poll() is None:
            d.proc.kill()
    return out, os.path.realpath(state)


def count_syncs(trace):
    n = 0
    with open(trace, errors="replace") as f:
        for line in f:
            m = SYNC_RE.match(line)
            if m and "= -1" not in line:
                n += 1
    return n


SPLIT_RE = re.compile(r"^\d+\s+(%s)\((?:\d+<([^>]*)>)?" % "|".join(SYNCS))


def split_syncs(trace, state):
    """{(call, file relative to the state directory): count}; a WAL: <wal>."""
    out = {}
    root = os.path.realpath(state)
    with open(trace, errors="replace") as f:
        for line in f:
            m = SPLIT_RE.match(line)
            if not m or "= -1" in line:
                continue
            path = m.group(2) or "?"
            if path == root or path.startswith(root + "/"):
                path = "<state>" + path[len(root):]
            path = re.sub(r"/[^/]*\.wal\.jsonl$", "/<wal>", path)
            key = (m.group(1), path)
            out[key] = out.get(key, 0) + 1
    return out


def print_split(label, split, n):
    for (call, path), k in sorted(split.items(), key=lambda kv: (-kv[1], kv[0])):
        print("%-4s   %5d %-9s %s (%.2f per mandate)" % (label, k, call, path, k / n))


def wal_bytes(trace, state):
    """(bytes read, bytes written) on WAL files under state/wal."""
    rd = wr = 0
    prefix = os.path.join(state, "wal") + "/"
    pending = {}   # pid -> (call, path) of an unfinished call
    with open(trace, errors="replace") as f:
        for line in f:
            u = UNFINISHED_RE.match(line)
            if u:
                pending[u.group(1)] = (u.group(2), u.group(4))
                continue
            r = RESUMED_RE.match(line)
            if r and r.group(1) in pending:
                call, path = pending.pop(r.group(1))
                m = (None, r.group(1), call, None, path, r.group(3))
            else:
                m = LINE_RE.match(line)
                if not m:
                    continue
                m = (None,) + m.groups()
            if not m[4].startswith(prefix) or not m[4].endswith(".wal.jsonl"):
                continue
            ret = int(m[5])
            if ret <= 0:
                continue
            if m[2] in ("read", "pread64"):
                rd += ret
            elif m[2] in ("write", "pwrite64"):
                wr += ret
    return rd, wr


def measure(kairosd, base, label, n):
    one = {"Schedule": {"Cron": "0 0 1 1 *", "Concurrency": "allow"},
           "Mandate": {"MaxCycles": "1"}, "Exec": {p: "/bin/true" for p in PHASES}}
    trace, st = traced_run(kairosd, base, label + "-syncs", {"bench": one}, n,
                           "done after 1 cycle", ",".join(SYNCS))
    syncs = count_syncs(trace)
    split = split_syncs(trace, st)
    trace, st = traced_run(kairosd, base, label + "-alone", {"bench": one}, n,
                           "done after 1 cycle", ",".join(SYNCS), alone=True)
    alone = count_syncs(trace)
    split_alone = split_syncs(trace, st)
    three = dict(one, Mandate={"MaxCycles": "3"})
    trace, state = traced_run(kairosd, base, label + "-reads", {"bench": three}, 1,
                              "done after 3 cycles", "read,pread64,write,pwrite64")
    rd, wr = wal_bytes(trace, state)
    return syncs, split, alone, split_alone, rd, wr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kairosd", required=True)
    ap.add_argument("--base-kairosd")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--mandates", type=int, default=100)
    ap.add_argument("--keep", action="store_true", help="keep the traces")
    ap.add_argument("--loop", action="store_true",
                    help="also on a loop-mounted journaled ext4 (root only)")
    args = ap.parse_args()
    if args.loop and os.geteuid() != 0:
        ap.error("--loop needs root (mkfs.ext4, mount -o loop)")
    if not shutil.which("strace"):
        print("strace not installed: skipped")
        return 77
    rc = run_on(args, args.dir, "dir")
    if args.loop and rc == 0:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench_cycle import LoopExt4
        loop = LoopExt4(args.dir)
        try:
            rc = run_on(args, loop.mnt, "loop-ext4j")
        finally:
            loop.close()
    return rc


def run_on(args, parent, where):
    base = tempfile.mkdtemp(prefix="kairos-bench-fsyncs-", dir=parent)
    print("%s: %s" % (where, base))
    try:
        builds = [("this", args.kairosd)]
        if args.base_kairosd:
            builds.insert(0, ("base", args.base_kairosd))
        floor = 6  # WAL barriers of a one-cycle mandate: 5 spawns + its end
        for label, exe in builds:
            syncs, split, alone, split_alone, rd, wr = measure(os.path.abspath(exe), base,
                                                                label, args.mandates)
            per = syncs / args.mandates
            print("%-4s %s: %d fsync-family calls for %d one-cycle mandates fired at once = "
                  "%.2f per mandate (%.2fx the floor of %d WAL barriers)"
                  % (label, exe, syncs, args.mandates, per, per / floor, floor))
            print_split(label, split, args.mandates)
            per = alone / args.mandates
            print("%-4s %s: %d fsync-family calls for %d one-cycle mandates run alone = "
                  "%.2f per mandate (%.2fx the floor of %d WAL barriers; target <= 7: %s)"
                  % (label, exe, alone, args.mandates, per, per / floor, floor,
                     "OK" if per <= 7 else "MISSED"))
            print_split(label, split_alone, args.mandates)
            print("%-4s WAL of a 3-cycle mandate: %d bytes written, %d bytes read = %.2fx "
                  "(target 0: %s)" % (label, wr, rd, rd / wr if wr else 0.0,
                                       "OK" if rd == 0 else "MISSED"))
        print("load: %s" % subprocess.run(["uptime"], capture_output=True, text=True)
              .stdout.strip())
    finally:
        if args.keep:
            print("traces kept in %s" % base)
        else:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
