# SPDX-License-Identifier: MIT
"""Injected disk errors against the real kairosd (issue 8, part 2).

tests/fault/fault_inject.so (an LD_PRELOAD shim, see its header) fails the
N-th open / write / fdatasync / fsync / rename / unlink of the files of ONE
mandate (its WAL, summary and archive, and the directory fsyncs that follow
them) with EIO, ENOSPC, EINTR, a short write followed by ENOSPC ("short") or
a legal short write that the caller must finish ("partial").

A clean run first counts the calls of each kind over the life of mandate A
(schedule alpha: 2 cycles, real handler programs for observe and act).  Then
for every (call, N, kind) -- within a time budget, see below -- one run:

  run 1 (with the shim): fire A, then B (schedule beta, 5 handlers); wait for
    both to settle; check
    - EINTR and partial writes: A finishes (done), nothing reported;
    - EIO / ENOSPC / short: A is paused wal_io_error, with the journal line
      "mandate A paused (wal_io_error): <what failed>: <strerror>", `list`
      says so, and no handler of A starts after the failed call;
    - the fire reply: an error (wal_io_error) iff the fault came before the
      first fdatasync of A's WAL succeeded, else ok with fired:true;
    - B finishes (done), untouched;
    - the WAL left behind verifies (`kairosctl wal verify` 0, or 1; always 0
      after a short write: never half-written);
    - the daemon exits 0 on SIGTERM, no sanitizer report;
  run 2 (the fault cleared, no shim): recovery quarantines nothing; A goes on
    to done (a step whose completion was lost is paused_review, resolved with
    --retry; a WAL holding nothing acknowledged may be dropped, and A is fired
    again); B stays done; then in A's and B's archives every line has a valid
    crc, every handler run (the handlers append to a side log) has its durable
    executing record (attempt K => at least K executing records), no attempt
    number repeats, every step completed exactly once.

By default every case runs (248 today -- phases without a command complete
without a flush of their own, finished mandates are synced in batches: ~40 s
on 2 CPUs, ~65 s under ASan+UBSan) in a seeded random order until the time budget is spent; the
first and last N of every (call, kind) always run.  Environment:
KAIROS_FAULT_EXHAUSTIVE=1 (every case, no budget), KAIROS_FAULT_RUNS=N (a
seeded sample of N cases; default all), KAIROS_FAULT_SEED=S,
KAIROS_FAULT_JOBS=J (parallel runs, default: CPUs, at most 4),
KAIROS_FAULT_BUDGET=SECONDS (default 90; 100 under sanitizers),
KAIROS_FAULT_ONLY=OP:N:KIND (one case, keeps its directory),
KAIROS_FAULT_KEEP=1 (keep temporary directories; always kept on a failure).
Standard library only."""
import concurrent.futures
import gzip
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kairos_harness import Client, Daemon, NotifySocket, write_config  # noqa: E402

KAIROSCTL = os.environ.get("KAIROSCTL", "kairosctl")
SHIM = os.environ.get("KAIROS_FAULT_SHIM", "")
SANITIZED = (os.environ.get("KAIROS_SANITIZED", "") not in ("", "0")
             or "asan" in os.environ.get("KAIROSD", "").lower())
WAIT = 120.0 if SANITIZED else 30.0

AT = "2026-04-20T12:00:00Z"
KINDS = {
    "open": ("eio", "enospc", "eintr"),
    "write": ("eio", "enospc", "eintr", "short", "partial"),
    "fdatasync": ("eio", "enospc", "eintr"),
    "fsync": ("eio", "enospc", "eintr"),
    "rename": ("eio", "enospc", "eintr"),
    "unlink": ("eio", "enospc", "eintr"),
}
HARMLESS = ("eintr", "partial")          # retried: the mandate must not notice
STRERROR = {"eio": "Input/output error", "enospc": "No space left on device",
            "short": "No space left on device"}
SANITIZER_MARKS = ("AddressSanitizer", "LeakSanitizer", "UndefinedBehaviorSanitizer",
                   "runtime error:")

HANDLER = r"""#!/bin/sh
cat > /dev/null
echo "$KAIROS_MANDATE_ID $KAIROS_STEP_ID $KAIROS_ATTEMPT" >> "$1"
printf '{"phase":"%s","cycle":%s}\n' "$KAIROS_PHASE" "$KAIROS_CYCLE"
"""


def plan_id(schedule, fired_at, cycle=1):
    key = "%s|%s" % (schedule, fired_at) if cycle == 1 else "%s|%s|%d" % (schedule, fired_at, cycle)
    return "plan_" + hashlib.sha256(key.encode()).hexdigest()[:12]


def mandate_id(schedule, fired_at):
    return "mnd_" + plan_id(schedule, fired_at)


A = mandate_id("alpha", AT)
B = mandate_id("beta", AT)
A_STEPS = ["%s_%03d" % (p, c) for c in (1, 2)
           for p in ("observe", "orient", "decide", "act", "reflect")]
B_STEPS = ["%s_001" % p for p in ("observe", "orient", "decide", "act", "reflect")]

CRC_RE = re.compile(rb',"crc":"([0-9a-f]{8})"\}$')


class Violation(AssertionError):
    pass


def parse_records(data, what):
    """Every line of a finished WAL: a JSON object with a valid crc."""
    out = []
    if data and not data.endswith(b"\n"):
        raise Violation("%s: does not end with a newline (half-written record)" % what)
    for i, line in enumerate(data.split(b"\n")):
        if not line.strip():
            continue
        m = CRC_RE.search(line)
        if not m:
            raise Violation("%s line %d: no crc: %r" % (what, i + 1, line[:200]))
        body = line[:m.start()] + b"}"
        if "%08x" % (zlib.crc32(body) & 0xFFFFFFFF) != m.group(1).decode():
            raise Violation("%s line %d: bad crc: %r" % (what, i + 1, line[:200]))
        out.append(json.loads(line))
    return out


def wait_any(d, texts, timeout=WAIT):
    """Wait until a log line contains one of texts; return (text, line)."""
    deadline = time.monotonic() + timeout
    with d.cond:
        while True:
            for line in d.lines:
                if line is None:
                    continue
                for t in texts:
                    if t in line:
                        return t, line
            if d.lines and d.lines[-1] is None:
                raise Violation("kairosd exited; no log line with any of %r" % (texts,))
            left = deadline - time.monotonic()
            if left <= 0:
                raise Violation("no log line with any of %r within %.0f s" % (texts, timeout))
            d.cond.wait(left)


def log_lines(d):
    with d.cond:
        return [line for line in d.lines if line is not None]


class Run:
    """One case: a directory, a config, up to two daemon runs."""

    def __init__(self, fault=None, root=None):
        self.fault = fault                      # (op, n, kind) or None
        self.dir = tempfile.mkdtemp(prefix="kairos-fault-", dir=root)
        self.state = os.path.join(self.dir, "state")
        self.side = os.path.join(self.dir, "side.log")
        self.flog = os.path.join(self.dir, "fault.log")
        handler = os.path.join(self.dir, "handler.sh")
        with open(handler, "w") as f:
            f.write(HANDLER)
        os.chmod(handler, 0o755)
        cmd = "%s %s" % (handler, self.side)
        self.conf = write_config(self.dir, self.state, {
            "alpha": {"Schedule": {"Cron": "0 0 1 1 *"}, "Mandate": {"MaxCycles": "2"},
                      "Exec": {"Observe": cmd, "Act": cmd, "TimeoutSec": "60"}},
            "beta": {"Schedule": {"Cron": "0 0 1 1 *"}, "Mandate": {"MaxCycles": "1"},
                     "Exec": {"Observe": cmd, "Orient": cmd, "Decide": cmd, "Act": cmd,
                              "Reflect": cmd, "TimeoutSec": "60"}},
        }, daemon_extra="MaxConcurrentMandates=4\nGracefulTimeoutSec=5\n")
        self.notify = NotifySocket(self.dir)
        self.daemons = []
        self.clients = []
        self.outcome = {}

    # ---- plumbing ----

    def start(self, shim):
        env = {"ASAN_OPTIONS": (os.environ.get("ASAN_OPTIONS", "") +
                                ":verify_asan_link_order=0").lstrip(":")}
        if shim:
            env.update({"LD_PRELOAD": SHIM, "KAIROS_FAULT_PATH": A,
                        "KAIROS_FAULT_LOG": self.flog,
                        "KAIROS_FAULT": "%s:%d:%s" % self.fault if self.fault else ""})
        self.notify.clear()
        d = Daemon(self.state, config=self.conf, notify=self.notify, env=env)
        self.daemons.append(d)
        try:
            self.notify.wait_ready(timeout=WAIT)
        except TimeoutError:
            raise Violation("no READY=1:\n" + d.log()[-3000:])
        c = Client(d.socket_path, timeout=WAIT)
        self.clients.append(c)
        return d, c

    def stop(self, d, c):
        c.close()
        rc = d.stop(timeout=WAIT)
        d.proc.stderr.close()
        if rc != 0:
            raise Violation("kairosd exited %d:\n%s" % (rc, d.log()[-3000:]))
        for mark in SANITIZER_MARKS:
            if mark in d.log():
                raise Violation("sanitizer report (%s):\n%s" % (mark, d.log()[-6000:]))

    def cleanup(self, keep):
        for c in self.clients:
            try:
                c.close()
            except OSError:
                pass
        for d in self.daemons:
            if d.proc.poll() is None:
                d.kill()
        self.notify.close()
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    def statuses(self, c):
        r = c.call("list")
        if not r.get("ok"):
            raise Violation("list failed: %r" % r)
        return {m["id"]: m for m in r["result"]["mandates"]}

    def fault_log(self):
        try:
            with open(self.flog) as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return []

    def side_runs(self):
        try:
            with open(self.side) as f:
                return [tuple(line.split()) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    # ---- the clean run: count the calls of A's life ----

    def count_calls(self):
        d, c = self.start(shim=True)
        for sched in ("alpha", "beta"):
            r = c.call("fire", schedule=sched, at=AT)
            if not r.get("ok") or not r["result"]["fired"]:
                raise Violation("clean run: fire %s: %r" % (sched, r))
        # the end of a life is its archive (finished mandates are archived in
        # batches, after "done"): the WAL's unlink is counted too
        wait_any(d, ["mandate %s: WAL archived" % A])
        wait_any(d, ["mandate %s: WAL archived" % B])
        counts = {}
        for line in self.fault_log():
            f = line.split()
            if f[0] == "call":
                counts[f[1]] = max(counts.get(f[1], 0), int(f[2]))
            elif f[0] == "inject":
                raise Violation("clean run injected a fault: " + line)
        self.stop(d, c)
        self.final_checks()
        return counts

    # ---- one fault ----

    def run_fault(self):
        op, n, kind = self.fault
        harmless = kind in HARMLESS
        d, c = self.start(shim=True)
        ra = c.call("fire", schedule="alpha", at=AT)
        rb = c.call("fire", schedule="beta", at=AT)
        if not rb.get("ok") or not rb["result"]["fired"]:
            raise Violation("fire beta: %r" % rb)
        # A's life ends archived, or paused (also after "done": a failed
        # unlink of its WAL once the archive is durable)
        a_end = ["mandate %s: WAL archived" % A, "mandate %s paused (" % A]
        what, line = wait_any(d, a_end)
        wait_any(d, ["mandate %s: WAL archived" % B])
        flog = self.fault_log()
        injected = [i for i, x in enumerate(flog) if x.startswith("inject %s %d " % (op, n))]
        if not injected:
            raise Violation("the fault was never injected (fewer %s calls than in the clean "
                            "run?)" % op)
        inj = injected[0]
        acked = any(x.startswith("call fdatasync ") and x.endswith(" ok") and
                    "/wal/" in x for x in flog[:inj])
        st = self.statuses(c)
        if st.get(B, {}).get("status") != "done":
            raise Violation("B is not done: %r" % st.get(B))
        logs = log_lines(d)
        if harmless:
            if what != a_end[0]:
                raise Violation("a retried %s (%s) stopped A: %s" % (op, kind, line.strip()))
            if not ra.get("ok") or not ra["result"]["fired"]:
                raise Violation("fire A after a harmless fault: %r" % ra)
            self.outcome["run1"] = "done"
        else:
            if what != a_end[1] or "(wal_io_error)" not in line:
                raise Violation("A not paused wal_io_error after %s:%d:%s: %s"
                                % (op, n, kind, line.strip()))
            if STRERROR[kind] not in line:
                raise Violation("the journal line does not say why (%s): %s"
                                % (STRERROR[kind], line.strip()))
            if "()" in line:
                raise Violation("an empty detail '()' in the journal line: %s" % line.strip())
            if st.get(A, {}).get("status") != "wal_io_error":
                raise Violation("list: A is %r, not wal_io_error" % st.get(A))
            # no acknowledgement after a failed sync
            if acked:
                if not ra.get("ok") or not ra["result"]["fired"]:
                    raise Violation("fire A failed although its flush succeeded: %r" % ra)
            else:
                if ra.get("ok") or ra.get("error", {}).get("code") != "wal_io_error":
                    raise Violation("fire A acknowledged although its flush never "
                                    "succeeded: %r" % ra)
            # a failed WAL gets no further append, and fdatasync is never
            # retried on it (docs/design.md §6: the kernel may have dropped the pages)
            later = [x for x in flog[inj + 1:] if x.split()[0] == "call" and
                     x.split()[1] in ("write", "fdatasync") and
                     x.split()[1:3] != [op, str(n)] and  # the short write itself
                     x.split()[3].endswith("/wal/%s.wal.jsonl" % A)]
            if later:
                raise Violation("the failed WAL was used again: %s" % later[0])
            mark = [i for i, x in enumerate(logs) if "kairos-fault: injected" in x]
            started = [x for x in logs[mark[0]:] if x.split(">", 1)[-1].startswith(A + " ")
                       and ": started " in x]
            if started:
                raise Violation("a handler of A started after the failed %s: %s"
                                % (op, started[0].strip()))
            self.outcome["run1"] = "wal_io_error"
        self.outcome["acked"] = acked
        # A's handler runs and its started lines agree
        a_started = sum(1 for x in logs if ": started " in x and
                        x.split(">", 1)[-1].startswith(A + " "))
        a_runs = sum(1 for r in self.side_runs() if r[0] == A)
        if a_started != a_runs:
            raise Violation("A: %d started lines, %d handler runs" % (a_started, a_runs))
        self.stop(d, c)

        # the WAL left behind: whole records only
        wal = os.path.join(self.state, "wal", A + ".wal.jsonl")
        if os.path.exists(wal):
            v = subprocess.run([KAIROSCTL, "wal", "verify", wal], capture_output=True,
                               text=True, timeout=60)
            self.outcome["verify"] = v.returncode
            if v.returncode not in (0, 1) or (kind == "short" and v.returncode != 0):
                raise Violation("wal verify %s: exit %d: %s%s"
                                % (wal, v.returncode, v.stdout, v.stderr))
            with open(wal, "rb") as f:
                data = f.read()
            if data and not data.endswith(b"\n"):
                raise Violation("the WAL ends with a half-written record: %r" % data[-200:])

        # run 2: the fault cleared
        d, c = self.start(shim=False)
        ready = wait_any(d, ["ready: recovered"])[1]
        if " 0 quarantined" not in ready:
            raise Violation("recovery quarantined: " + ready.strip())
        st = self.statuses(c)
        a = st.get(A)
        self.outcome["restart"] = a["status"] if a else "absent"
        if a is None:
            if ra.get("ok"):
                raise Violation("A was acknowledged by its fire and is gone after the restart")
            r = c.call("fire", schedule="alpha", at=AT)
            if not r.get("ok") or not r["result"]["fired"]:
                raise Violation("fire A again: %r" % r)
        elif a["status"] == "paused_review":
            self.check_review(a)
            r = c.call("resolve", mandate=A, step=a["review_step"], action="retry",
                       reason="fault test: the disk is fine again")
            if not r.get("ok"):
                raise Violation("resolve --retry: %r" % r)
        elif a["status"] not in ("done", "running", "runnable"):
            raise Violation("A after the restart: %r" % a)
        if not (a and a["status"] == "done"):
            wait_any(d, ["mandate %s done after" % A])
        st = self.statuses(c)
        for m in (A, B):
            if st.get(m, {}).get("status") != "done":
                raise Violation("%s not done after the restart: %r" % (m, st.get(m)))
        self.stop(d, c)
        self.final_checks()

    def check_review(self, a):
        """A review after the restart is justified only by an executing record
        without a completion: the WAL must show exactly that."""
        wal = os.path.join(self.state, "wal", A + ".wal.jsonl")
        with open(wal, "rb") as f:
            recs = [json.loads(x) for x in f.read().split(b"\n") if x.strip()]
        step = a.get("review_step")
        statuses = [r.get("status") for r in recs if r.get("step_id") == step]
        if "executing" not in statuses or "completed" in statuses:
            raise Violation("A paused for review at %s, but its records are %r"
                            % (step, statuses))

    # ---- after the end: the archives and the side log ----

    def final_checks(self):
        runs = self.side_runs()
        if len(set(runs)) != len(runs):
            raise Violation("an attempt number repeats in the side log: %r" % runs)
        for m, steps in ((A, A_STEPS), (B, B_STEPS)):
            arch = os.path.join(self.state, "archive", m + ".wal.jsonl.gz")
            summ = os.path.join(self.state, "mandates", m + ".json")
            if os.path.exists(os.path.join(self.state, "wal", m + ".wal.jsonl")):
                raise Violation("%s: the WAL is still there after the end" % m)
            if not os.path.exists(arch) or not os.path.exists(summ):
                raise Violation("%s: no archive or no summary" % m)
            with gzip.open(arch, "rb") as f:
                recs = parse_records(f.read(), arch)
            if not recs or recs[0].get("op") != "mandate" or recs[0].get("mandate_id") != m:
                raise Violation("%s: the archive does not start with its mandate record" % m)
            executing = {}
            completed = {}
            for r in recs:
                if r.get("op") == "transition" and r.get("status") == "executing":
                    executing[r["step_id"]] = executing.get(r["step_id"], 0) + 1
                if r.get("op") == "transition" and r.get("status") == "completed":
                    completed[r["step_id"]] = completed.get(r["step_id"], 0) + 1
            for s in steps:
                if completed.get(s) != 1:
                    raise Violation("%s %s: %d completed records" % (m, s, completed.get(s, 0)))
            for (rm, step, attempt) in runs:
                if rm == m and executing.get(step, 0) < int(attempt):
                    raise Violation("%s %s ran (attempt %s) without a durable executing "
                                    "record (%d in the WAL)" % (m, step, attempt,
                                                                executing.get(step, 0)))
        b_runs = [r for r in runs if r[0] == B]
        if sorted(b_runs) != sorted((B, s, "1") for s in B_STEPS):
            raise Violation("B's handlers did not run exactly once each: %r" % b_runs)


def one_case(fault, root, keep):
    run = Run(fault, root)
    t0 = time.monotonic()
    try:
        run.run_fault()
        return fault, None, run.outcome, time.monotonic() - t0, run.dir
    except Exception as e:  # noqa: BLE001 - a violation or a harness failure: report it
        keep = True
        logs = "\n".join("---- kairosd run %d:\n%s" % (i + 1, d.log()[-4000:])
                         for i, d in enumerate(run.daemons))
        return fault, "%s: %s\n%s\nfault log tail:\n%s" % (
            type(e).__name__, e, logs, "\n".join(run.fault_log()[-15:])), run.outcome, \
            time.monotonic() - t0, run.dir
    finally:
        run.cleanup(keep)


def choose(cases, counts, n_runs, seed):
    """The first and last N of every (op, kind) always; the rest sampled."""
    must = [c for c in cases if c[1] in (1, counts[c[0]])]
    rest = [c for c in cases if c not in must]
    random.Random(seed).shuffle(rest)
    return must, rest[:max(0, n_runs - len(must))]


def main():
    if not SHIM or not os.path.exists(SHIM):
        print("fault injection shim not built (KAIROS_FAULT_SHIM): skipped")
        return 77
    keep = os.environ.get("KAIROS_FAULT_KEEP", "") not in ("", "0")
    root = tempfile.mkdtemp(prefix="kairos-faults-")
    t_start = time.monotonic()

    clean = Run(None, root)
    try:
        counts = clean.count_calls()
    except Exception as e:  # noqa: BLE001
        print("the clean run failed: %s\n%s" % (e, "\n".join(d.log()[-4000:]
                                                             for d in clean.daemons)))
        clean.cleanup(True)
        return 1
    clean.cleanup(keep)
    print("clean run: calls on A's files over its life: %s (%.1f s)"
          % (", ".join("%s %d" % (k, counts.get(k, 0)) for k in KINDS),
             time.monotonic() - t_start), flush=True)

    only = os.environ.get("KAIROS_FAULT_ONLY")
    cases = [(op, n, kind) for op, kinds in KINDS.items()
             for n in range(1, counts.get(op, 0) + 1) for kind in kinds]
    seed = int(os.environ.get("KAIROS_FAULT_SEED", str(random.randrange(1 << 30))))
    if only:
        op, n, kind = only.split(":")
        must, rest = [(op, int(n), kind)], []
        keep = True
    elif os.environ.get("KAIROS_FAULT_EXHAUSTIVE", "") not in ("", "0"):
        must, rest = cases, []
    else:
        n_runs = int(os.environ.get("KAIROS_FAULT_RUNS", str(len(cases))))
        must, rest = choose(cases, counts, n_runs, seed)
    budget = float(os.environ.get("KAIROS_FAULT_BUDGET", "100" if SANITIZED else "90"))
    if only or os.environ.get("KAIROS_FAULT_EXHAUSTIVE", "") not in ("", "0"):
        budget = float("inf")
    jobs = int(os.environ.get("KAIROS_FAULT_JOBS", str(min(4, os.cpu_count() or 1))))
    print("%d cases (%d possible), seed %d, %d parallel, budget %.0f s%s"
          % (len(must) + len(rest), len(cases), seed, jobs, budget,
             ", sanitizer build" if SANITIZED else ""), flush=True)

    results = []
    lock = threading.Lock()
    deadline = t_start + budget

    def task(fault, required):
        if not required and time.monotonic() > deadline:
            return fault, "skipped", {}, 0.0, None
        r = one_case(fault, root, keep)
        with lock:
            status = "ok" if r[1] is None else "VIOLATION"
            print("  %-22s %-9s %5.2f s %s" % ("%s:%d:%s" % fault, status, r[3],
                                              json.dumps(r[2], sort_keys=True)), flush=True)
        return r

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futs = [pool.submit(task, f, True) for f in must] + \
               [pool.submit(task, f, False) for f in rest]
        for fut in futs:
            results.append(fut.result())

    ran = [r for r in results if r[1] != "skipped"]
    bad = [r for r in ran if r[1] is not None]
    by_kind = {}
    by_op = {}
    outcomes = {}
    for fault, _, outcome, _, _ in ran:
        by_kind[fault[2]] = by_kind.get(fault[2], 0) + 1
        by_op[fault[0]] = by_op.get(fault[0], 0) + 1
        key = "%s/%s" % (outcome.get("run1", "?"), outcome.get("restart", "?"))
        outcomes[key] = outcomes.get(key, 0) + 1
    for fault, err, _, _, where in bad:
        print("\nVIOLATION %s:%d:%s (seed %d, kept in %s):\n%s"
              % (fault + (seed, where, err)))
    print("\nfaults injected: %d (%s; by call: %s); skipped for the budget: %d"
          % (len(ran), ", ".join("%s %d" % kv for kv in sorted(by_kind.items())),
             ", ".join("%s %d" % kv for kv in sorted(by_op.items())),
             len(results) - len(ran)))
    print("outcomes (run 1 / A after the restart): %s"
          % ", ".join("%s %d" % kv for kv in sorted(outcomes.items())))
    print("violations: %d; seed %d; %.1f s" % (len(bad), seed, time.monotonic() - t_start))
    if not bad and not keep:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
