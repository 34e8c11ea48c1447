#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Idempotency store over the control socket (issue 6; run by hand).

    tests/bench/bench_idem_socket.py --kairosd build/src/daemon/kairosd \\
        --kairosctl build/src/ctl/kairosctl [--seconds 5] [--dir DIR]

Starts kairosd on a temporary state directory, runs one `kairosctl tool run`
so its key is cached, then measures for --seconds each:

  1. `kairosctl tool run` round-trips/s for the cached key (a new kairosctl
     process, connection and replay per call: what a handler pays);
  2. tool-begin requests/s for the cached key on one open connection (the
     daemon's side alone: lookup + reply, no process start);
  3. tool-begin requests/s for the cached key, one connection per request;
  4. durable claims/s: tool-begin + tool-finish of new keys on one connection
     (two fdatasync'ed records per key, one client at a time, so no group
     commit helps);
  5. the same with 8 clients in parallel (group commit: records produced
     while a flush runs go out in the next one);
  6. tool-write of new keys to ROOT/a/b/fN on one connection (the walk below
     the root, temporary file, fdatasync, rename, directory fsync, and the
     two log records), against a floor measured in the same run: the same
     file work done here by hand (ratio printed);
  7. tool-write refused for a missing directory below the root (the path
     check only, nothing claimed).

The in-process store benchmark (lookups/s, durable pairs/s vs raw
fdatasync) is build/tests/bench/bench_idem."""
import argparse
import base64
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import kairos_harness  # noqa: E402
from kairos_harness import Client, Daemon, NotifySocket, write_config  # noqa: E402


def rate(n, dt):
    return n / dt if dt > 0 else float("inf")


def timed(seconds, step):
    n, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        step(n)
        n += 1
    return n, time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kairosd", default=os.environ.get("KAIROSD", "build/src/daemon/kairosd"))
    ap.add_argument("--kairosctl", default=os.environ.get("KAIROSCTL", "build/src/ctl/kairosctl"))
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--dir", default=None, help="where the temporary state goes (a real disk "
                    "for fdatasync figures)")
    a = ap.parse_args()
    kairos_harness.KAIROSD = os.path.abspath(a.kairosd)
    ctl = os.path.abspath(a.kairosctl)
    d = tempfile.mkdtemp(prefix="kairos-bench-idem-", dir=a.dir)
    notify = NotifySocket(d)
    state = os.path.join(d, "state")
    root = os.path.join(d, "root")
    os.makedirs(os.path.join(root, "a", "b"))
    daemon = Daemon(state, write_config(d, state, daemon_extra="\n[Idempotency]\nWriteRoots=%s\n"
                                        % root), notify=notify)
    try:
        notify.wait_ready()
        sock = daemon.socket_path
        argv = [ctl, "--socket", sock, "tool", "run", "--key", "bench", "--", "printf", "cached"]
        first = subprocess.run(argv, capture_output=True)
        assert first.returncode == 0 and first.stdout == b"cached", first
        print("kairosd %s, state on %s, %.0f s per measurement" % (a.kairosd, d, a.seconds))

        def ctl_once(_):
            p = subprocess.run(argv, capture_output=True)
            assert p.returncode == 0 and p.stdout == b"cached", p

        n, dt = timed(a.seconds, ctl_once)
        print("1. kairosctl tool run, cached key:         %9.0f round-trips/s  (%.2f ms each)"
              % (rate(n, dt), 1000 * dt / n))

        args = {"tool": "cmd", "key": "bench", "input": {"argv": ["printf", "cached"]}}
        c = Client(sock)

        def begin_same_conn(_):
            r = c.call("tool-begin", **args)
            assert r["ok"] and r["result"]["outcome"] == "completed", r

        n, dt = timed(a.seconds, begin_same_conn)
        print("2. tool-begin (cached), one connection:    %9.0f requests/s    (%.3f ms each)"
              % (rate(n, dt), 1000 * dt / n))

        def begin_new_conn(_):
            cc = Client(sock)
            r = cc.call("tool-begin", **args)
            cc.close()
            assert r["ok"] and r["result"]["outcome"] == "completed", r

        n, dt = timed(a.seconds, begin_new_conn)
        print("3. tool-begin (cached), new connection:    %9.0f requests/s    (%.3f ms each)"
              % (rate(n, dt), 1000 * dt / n))

        def pair(conn, key):
            r = conn.call("tool-begin", tool="bench", key=key, input=1)
            assert r["ok"] and r["result"]["outcome"] == "proceed", r
            r = conn.call("tool-finish", key="bench:" + key, exit_status=0, stdout="", stderr="")
            assert r["ok"], r

        n, dt = timed(a.seconds, lambda i: pair(c, "p%d" % i))
        print("4. durable begin+finish, 1 client:        %9.0f pairs/s       (%.3f ms each)"
              % (rate(n, dt), 1000 * dt / n))
        c.close()

        counts = [0] * 8
        stop = time.monotonic() + a.seconds

        def worker(w):
            cw = Client(sock)
            while time.monotonic() < stop:
                pair(cw, "w%d-%d" % (w, counts[w]))
                counts[w] += 1
            cw.close()

        t0 = time.monotonic()
        ts = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        dt = time.monotonic() - t0
        st = Client(sock)
        stats = st.call("idem-stats")["result"]
        st.close()
        print("5. durable begin+finish, 8 clients:       %9.0f pairs/s" % rate(sum(counts), dt))
        print("   store: %d entries, %d log records, %d fdatasync calls, %d compactions"
              % (stats["size"], stats["log_records"], stats["log_flushes"], stats["compactions"]))

        c = Client(sock)
        content = base64.b64encode(b"x" * 200).decode()

        def write_new(i):
            r = c.call("tool-write", key="tw%d" % i, path=os.path.join(root, "a", "b", "f%d" % i),
                       content=content)
            assert r["ok"], r

        def write_floor(i):
            dd = os.path.join(root, "a", "b")
            tmp = os.path.join(dd, ".g%d.tmp" % i)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, b"x" * 200)
            os.fdatasync(fd)
            os.close(fd)
            os.rename(tmp, os.path.join(dd, "g%d" % i))
            dfd = os.open(dd, os.O_RDONLY | os.O_DIRECTORY)
            os.fsync(dfd)
            os.close(dfd)

        fn, fdt = timed(a.seconds, write_floor)
        n, dt = timed(a.seconds, write_new)
        print("6. tool-write, new key, one connection:   %9.0f writes/s      (%.3f ms each; floor "
              "%.3f ms = file work by hand: ratio %.2f)"
              % (rate(n, dt), 1000 * dt / n, 1000 * fdt / fn, (dt / n) / (fdt / fn)))

        def write_refused(i):
            r = c.call("tool-write", key="tr%d" % i, path=os.path.join(root, "a", "nope", "f"),
                       content=content)
            assert not r["ok"] and r["error"]["code"] == "path_refused", r

        n, dt = timed(a.seconds, write_refused)
        print("7. tool-write refused (missing directory): %8.0f requests/s    (%.3f ms each)"
              % (rate(n, dt), 1000 * dt / n))
        c.close()
    finally:
        daemon.stop()
        daemon.proc.stderr.close()
        notify.close()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
