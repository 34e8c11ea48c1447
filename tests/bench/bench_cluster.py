#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Cluster throughput: three kairosd nodes on PostgreSQL (each in its own
network namespace, tests/cluster/cluster_bed.py) against one single-host
kairosd (files backend) on the same machine, in the same run.

    sudo tests/bench/bench_cluster.py --kairosd build/src/daemon/kairosd \\
        --kairosctl build/src/ctl/kairosctl [--mandates N] [--dir DIR]

Every phase /bin/true, MaxCycles=10, MaxConcurrentMandates=16 per daemon.
Single host: N mandates fired at once (pipelined, distinct --at) on one
kairosd in DIR (default /var/tmp: a disk, fdatasync as in production).
Cluster: N mandates, a third fired on each node (distinct ticks, each on
one node: no claim is contended), LeaseSec=10.  Cycles per second = the
cycles run / the time from the first fire to the last "done" log line.
Printed: both rates, the cluster's per node, and the ratio per node /
single host (the issue's goal: >= 0.5 on 2 cores), with `uptime`'s load.
Note: the test bed's PostgreSQL runs with fsync=off (netns.py), the single
host's WAL with fdatasync; the ratio is the CPU cost of the cluster's
transactions, not of their disk flushes.  Needs root (network namespaces).
"""
import argparse
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))

CYCLES = 10
BENCH = {"Schedule": {"Cron": "0 0 1 1 *", "Concurrency": "allow"},
         "Mandate": {"MaxCycles": str(CYCLES)},
         "Exec": {p: "/bin/true" for p in ("Observe", "Orient", "Decide", "Act", "Reflect")}}


def at(i):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1735689600 + 60 * i))


def fire_pipelined(sock_path, ticks):
    """Send every fire at once on one connection, then read the replies."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(300)
    s.connect(sock_path)
    s.sendall(b"".join(('{"v":1,"id":%d,"cmd":"fire","args":{"schedule":"bench","at":"%s"}}\n'
                        % (n + 1, at(i))).encode() for n, i in enumerate(ticks)))
    buf = b""
    while buf.count(b"\n") < len(ticks):
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed: %r" % buf[-300:])
        buf += chunk
    s.close()
    bad = [line for line in buf.split(b"\n") if line and b'"fired":true' not in line]
    if bad:
        raise RuntimeError("not fired: %r" % bad[:3])


def count_done(text):
    return len(re.findall(r"mandate \S+ done after", text))


def wait_done(read_logs, n, timeout=600):
    end = time.monotonic() + timeout
    while True:
        if sum(count_done(t) for t in read_logs()) >= n:
            return time.monotonic()
        if time.monotonic() > end:
            raise TimeoutError(f"not all {n} mandates done")
        time.sleep(0.05)


def single_host(args):
    import kairos_harness as kh
    d = tempfile.mkdtemp(prefix="kbench-single-", dir=args.dir)
    try:
        state = os.path.join(d, "state")
        conf = kh.write_config(d, state, {"bench": BENCH},
                               daemon_extra="MaxConcurrentMandates=16\n")
        notify = kh.NotifySocket(d)
        daemon = kh.Daemon(state, config=conf, notify=notify)
        notify.wait_ready()
        t0 = time.monotonic()
        fire_pipelined(daemon.socket_path, range(args.mandates))
        t1 = wait_done(lambda: [daemon.log()], args.mandates)
        daemon.stop()
        notify.close()
        return args.mandates * CYCLES / (t1 - t0)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def cluster(args):
    import cluster_bed as cb
    with cb.Cluster(nodes=3, schedules={"bench": BENCH}, lease_sec=10) as c:
        c.start_all()
        t0 = time.monotonic()
        ths = []
        errors = []
        for k in c.nodes:
            ticks = [i for i in range(args.mandates) if i % 3 == k - 1]

            def go(k=k, ticks=ticks):
                try:
                    fire_pipelined(c.nodes[k].socket, ticks)
                except Exception as e:  # noqa: BLE001 — reported below
                    errors.append(f"node{k}: {e}")
            ths.append(threading.Thread(target=go))
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        if errors:
            raise RuntimeError("; ".join(errors))
        t1 = wait_done(lambda: [c.log(k) for k in c.nodes], args.mandates)
        c.terminate_all()
        return args.mandates * CYCLES / (t1 - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kairosd", default=os.environ.get("KAIROSD", "kairosd"))
    ap.add_argument("--kairosctl", default=os.environ.get("KAIROSCTL", "kairosctl"))
    ap.add_argument("--mandates", type=int, default=60)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    os.environ["KAIROSD"] = os.path.abspath(args.kairosd)
    os.environ["KAIROSCTL"] = os.path.abspath(args.kairosctl)
    import kairos_harness as kh
    kh.KAIROSD, kh.KAIROSCTL = os.environ["KAIROSD"], os.environ["KAIROSCTL"]
    import netns
    why = netns.skip_reason()
    if why:
        print(f"SKIP: {why}")
        return 77
    for r in range(args.rounds):
        single = single_host(args)
        multi = cluster(args)
        load = os.getloadavg()
        print(f"round {r + 1}: {args.mandates} mandates x {CYCLES} cycles; single host "
              f"{single:.1f} cycles/s; 3 nodes {multi:.1f} cycles/s, {multi / 3:.1f} per node; "
              f"ratio per node / single host {multi / 3 / single:.2f}; 3 nodes / single host "
              f"{multi / single:.2f}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
              f"on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
