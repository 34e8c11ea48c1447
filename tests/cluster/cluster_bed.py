# SPDX-License-Identifier: MIT
"""Real kairosd nodes in the network-namespace test bed (netns.py): one
PostgreSQL and N kairosd, each in its own namespace, each with its own
state directory and configuration; handlers that record every execution of
their effect in one shared log (no dedup); the checker of the cluster's
promises over the database's rows and that log.

    with Cluster(nodes=3, schedules={"s1": CRON_EVERY_MINUTE}) as c:
        c.start_all()
        c.ctl(1, "fire", "s1", "--at", T)      # kairosctl in node 1
        c.kill9(2); c.start(2)
        c.settle(...)
        problems = c.check(window)

The effects log (c.effects) holds one line per event, tab-separated:
    KIND MANDATE STEP NODE EPOCH ATTEMPT PID TIME
KIND is start (a handler began), effect (the act's tool ran: the effect
happened, appended before the tool's own pause so a kill lands after it),
beat (the tool still runs, every 0.2 s with BEAT=1), tooldone (kairosctl
tool run returned; act then pauses once more) and end (the handler
returns).  Every execution leaves its line; nothing is deduplicated.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import netns  # noqa: E402
import pg_checks  # noqa: E402
from kairos_harness import NotifySocket  # noqa: E402

KAIROSD = os.path.abspath(os.environ.get("KAIROSD", "kairosd"))
KAIROSCTL = os.path.abspath(os.environ.get("KAIROSCTL", "kairosctl"))

# One script for every phase; $1 is the phase.  A random pause of
# MIN_MS..MAX_MS (from the schedule's Environment=) so that kills land in
# the middle of steps.  act makes its effect through `kairosctl tool run`
# keyed by the step's idempotency key: the tool appends the effect line
# first, then pauses (BEAT=1: appending a beat line every 0.2 s); after the
# tool, act pauses again, so a kill lands inside the call or after it.
HANDLER = r"""#!/bin/sh
cat >/dev/null
log() {
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$KAIROS_MANDATE_ID" "$KAIROS_STEP_ID" \
                "${KAIROS_NODE:-}" "${KAIROS_EPOCH:-}" "$KAIROS_ATTEMPT" "$$" \
                "$(date +%s.%N)" >> "$EFFECTS"
}
pause() {
        r=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
        ms=$(( ${MIN_MS:-500} + r % (${MAX_MS:-5000} - ${MIN_MS:-500} + 1) ))
        echo "$((ms / 1000)).$(printf %03d $((ms % 1000)))"
}
log start
if [ "$1" = act ]; then
        # the same call on every run of the step (command and arguments make
        # the call's fingerprint): what differs goes through the environment
        EFF_NODE="${KAIROS_NODE:-}" EFF_EPOCH="${KAIROS_EPOCH:-}" EFF_ATTEMPT="$KAIROS_ATTEMPT" \
        EFF_SECS=$(pause) "$KAIROSCTL" tool run --key "eff-$KAIROS_IDEM_KEY" -- sh -c '
                line() {
                        printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$1" "$2" "$3" "$EFF_NODE" \
                                "$EFF_EPOCH" "$EFF_ATTEMPT" $$ "$(date +%s.%N)" >> "$EFFECTS"
                }
                line effect "$1" "$2"
                if [ "${BEAT:-0}" = 1 ]; then
                        end=$(( $(date +%s) + ${EFF_SECS%.*} + 1 ))
                        while [ "$(date +%s)" -lt "$end" ]; do
                                line beat "$1" "$2"
                                sleep 0.2
                        done
                else
                        sleep "$EFF_SECS"
                fi' sh "$KAIROS_MANDATE_ID" "$KAIROS_STEP_ID" >/dev/null
        rc=$?
        log tooldone
        [ $rc = 0 ] || { log end; exit $rc; }
        sleep "$(pause)"
        log end
        echo '{"ok":true}'
        exit 0
fi
sleep "$(pause)"
log end
echo '{"ok":true}'
"""


def faketime_lib():
    """libfaketime for threaded programs, or an error naming the package."""
    import glob
    for p in glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1") + \
            glob.glob("/usr/lib/faketime/libfaketimeMT.so.1"):
        return p
    raise RuntimeError("libfaketimeMT.so.1 not found (the faketime package)")


def log_lines(path):
    """The effects log as dicts (kind, mandate, step, node, epoch, attempt,
    pid, t); a torn last line is skipped."""
    out = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.endswith("\n"):
                    continue
                p = line.rstrip("\n").split("\t")
                if len(p) != 8:
                    continue
                out.append({"kind": p[0], "mandate": p[1], "step": p[2], "node": p[3],
                            "epoch": p[4], "attempt": p[5], "pid": p[6], "t": float(p[7] or 0)})
    except FileNotFoundError:
        pass
    return out


def schedule(cron="* * * * *", min_ms=500, max_ms=5000, beat=False, observe=True,
             effects_via="kairosctl", timeout="2min", concurrency=None):
    """A schedule's sections for Cluster(schedules=...): observe and act
    pause at random, act makes its effect through kairosctl tool run."""
    exec_keys = {"Act": "{handler} act", "Effects": "act", "EffectsVia": effects_via,
                 "TimeoutSec": timeout,
                 "Environment": f"MIN_MS={min_ms} MAX_MS={max_ms} BEAT={1 if beat else 0} "
                                "EFFECTS={effects}"}
    if observe:
        exec_keys["Observe"] = "{handler} observe"
    sched = {"Cron": cron, "MissedPolicy": "skip"}
    if concurrency:
        sched["Concurrency"] = concurrency
    return {"Schedule": sched, "Exec": exec_keys}


def utc(t):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def parse_utc(s):
    import calendar
    s = s.strip().replace(" ", "T")
    s = re.sub(r"(\.\d+)?(\+00(:00)?|Z)$", "", s)
    return calendar.timegm(time.strptime(s[:19], "%Y-%m-%dT%H:%M:%S"))


class Node:
    def __init__(self, k, root):
        self.k = k
        self.name = f"node{k}"
        self.dir = os.path.join(root, self.name)
        self.state = os.path.join(self.dir, "state")
        self.conf = os.path.join(self.dir, "kairosd.conf")
        self.socket = os.path.join(self.state, "control.sock")
        self.logpath = os.path.join(root, f"{self.name}.log")
        self.proc = None
        self.notify = None
        self.clock_offset = None
        self.starts = 0


class Cluster:
    def __init__(self, nodes=3, schedules=None, lease_sec=4, pg=True):
        self.n = nodes
        self.lease_sec = lease_sec
        self.sched_defs = schedules or {}
        self.bed = netns.NetBed(nodes=nodes, pg=pg)
        self.root = None
        self.nodes = {}
        self.events = []        # (wall time, what, node or None)

    # --- setup ---------------------------------------------------------
    def __enter__(self):
        self.bed.__enter__()
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _setup(self):
        self.root = tempfile.mkdtemp(prefix="kclu", dir="/tmp")
        os.chmod(self.root, 0o755)
        self.effects = os.path.join(self.root, "effects.log")
        open(self.effects, "w").close()
        self.handler = os.path.join(self.root, "handler.sh")
        with open(self.handler, "w") as f:
            f.write(HANDLER)
        os.chmod(self.handler, 0o755)
        for k in range(1, self.n + 1):
            node = Node(k, self.root)
            os.makedirs(node.state)
            self._write_config(node)
            self.nodes[k] = node
        # the password never on a command line: kairosd --init-db @FILE
        conninfo = os.path.join(self.root, "conninfo")
        with open(os.open(conninfo, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(self.bed.conninfo() + "\n")
        r = self.bed.run(1, [KAIROSD, "--init-db", "@" + conninfo], timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"kairosd --init-db: {r.returncode} {r.stdout}{r.stderr}")

    def _write_config(self, node):
        with open(node.conf, "w") as f:
            f.write("[Daemon]\n"
                    f"StateDirectory={node.state}\n"
                    f"ControlSocket={node.socket}\n"
                    "MaxConcurrentMandates=16\n"
                    "[Cluster]\n"
                    "Backend=postgres\n"
                    f"ConnectionString={self.bed.conninfo()}\n"
                    f"NodeName={node.name}\n"
                    f"LeaseSec={self.lease_sec}\n")
        sdir = os.path.join(node.dir, "schedules.d")
        os.makedirs(sdir, exist_ok=True)
        for name, sections in self.sched_defs.items():
            with open(os.path.join(sdir, name + ".conf"), "w") as f:
                for section, keys in sections.items():
                    f.write(f"[{section}]\n")
                    for key, v in keys.items():
                        v = v.format(handler=self.handler, effects=self.effects)
                        f.write(f"{key}={v}\n")

    def close(self):
        try:
            for node in self.nodes.values():
                if node.proc and node.proc.poll() is None:
                    node.proc.kill()
                    node.proc.wait()
                if node.notify:
                    node.notify.close()
                    node.notify = None
        finally:
            self.bed.close()
            if self.root and not os.environ.get("KAIROS_KEEP"):
                shutil.rmtree(self.root, ignore_errors=True)

    def event(self, what, k=None):
        self.events.append((time.time(), what, k))

    # --- nodes ---------------------------------------------------------
    def start(self, k, clock_offset=None, wait=True, timeout=60):
        node = self.nodes[k]
        if node.proc and node.proc.poll() is None:
            raise RuntimeError(f"{node.name} still runs")
        if node.notify:
            node.notify.close()
        node.notify = NotifySocket(node.dir) if not os.path.exists(
            os.path.join(node.dir, "notify.sock")) else None
        if node.notify is None:
            os.unlink(os.path.join(node.dir, "notify.sock"))
            node.notify = NotifySocket(node.dir)
        env = dict(os.environ, NOTIFY_SOCKET=node.notify.path, TZ="UTC")
        for var in ("WATCHDOG_USEC", "JOURNAL_STREAM", "INVOCATION_ID"):
            env.pop(var, None)
        logf = open(node.logpath, "a")
        logf.write(f"==== start {node.starts + 1} at {utc(time.time())} "
                   f"clock_offset={clock_offset}\n")
        logf.flush()
        argv = [KAIROSD, "-c", node.conf]
        if clock_offset:
            # libfaketime preloaded into kairosd itself (the faketime program
            # would stand between us and kairosd as its parent, and signals
            # meant for kairosd would hit it): the wall clock shifted, the
            # monotonic clock left alone; its handlers inherit it
            # (a sanitized build: ASan accepts a library preloaded before it)
            asan = "verify_asan_link_order=0:" + os.environ.get("ASAN_OPTIONS", "")
            argv = ["env", "LD_PRELOAD=" + faketime_lib(), f"FAKETIME={clock_offset:+d}",
                    "FAKETIME_DONT_FAKE_MONOTONIC=1", "DONT_FAKE_MONOTONIC=1",
                    "ASAN_OPTIONS=" + asan] + argv
        node.proc = self.bed.popen(k, argv, env=env, stdout=logf, stderr=logf,
                                   stdin=subprocess.DEVNULL)
        logf.close()
        node.clock_offset = clock_offset
        node.starts += 1
        self.event("start" + (f" clock{clock_offset:+g}s" if clock_offset else ""), k)
        if wait:
            self.wait_ready(k, timeout)
        return node.proc

    def wait_ready(self, k, timeout=60):
        node = self.nodes[k]
        end = time.monotonic() + timeout
        while True:
            try:
                node.notify.wait_ready(timeout=0.2)
                return
            except TimeoutError:
                pass
            if node.proc.poll() is not None:
                raise RuntimeError(f"{node.name} exited {node.proc.returncode}:\n"
                                   + self.log(k)[-3000:])
            if time.monotonic() > end:
                raise TimeoutError(f"{node.name} not ready:\n" + self.log(k)[-3000:])

    def start_all(self, timeout=60):
        for k in self.nodes:
            self.start(k, wait=False)
        for k in self.nodes:
            self.wait_ready(k, timeout)

    def alive(self, k):
        p = self.nodes[k].proc
        return p is not None and p.poll() is None

    def pid(self, k):
        return self.nodes[k].proc.pid

    def log(self, k):
        try:
            with open(self.nodes[k].logpath, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def sanitizer_reports(self):
        """Lines of ASan/UBSan reports in the nodes' logs (a sanitized build)."""
        out = []
        for k in self.nodes:
            out += [f"node{k}: {line}" for line in self.log(k).splitlines()
                    if "ERROR: AddressSanitizer" in line or "runtime error:" in line
                    or "ERROR: LeakSanitizer" in line]
        return out

    def kill9(self, k):
        """SIGKILL kairosd alone (its deadman and handlers stay)."""
        self.event("kill -9 kairosd", k)
        os.kill(self.pid(k), signal.SIGKILL)
        self.nodes[k].proc.wait()

    def kill_node(self, k):
        """SIGKILL every process of node k, handlers included."""
        self.event("kill node", k)
        self.bed.kill_node(k)
        if self.nodes[k].proc:
            self.nodes[k].proc.wait()

    def stop(self, k):
        self.event("SIGSTOP kairosd", k)
        self.bed.stop(self.pid(k))

    def cont(self, k):
        self.event("SIGCONT kairosd", k)
        self.bed.cont(self.pid(k))

    def stop_node(self, k):
        self.event("SIGSTOP node", k)
        self.bed.stop_node(k)

    def cont_node(self, k):
        self.event("SIGCONT node", k)
        self.bed.cont_node(k)

    def term(self, k, timeout=60):
        """A graceful stop (SIGTERM): the node hands its mandates over."""
        node = self.nodes[k]
        if node.proc and node.proc.poll() is None:
            self.event("SIGTERM", k)
            node.proc.send_signal(signal.SIGTERM)
            node.proc.wait(timeout)

    def terminate_all(self):
        for k in self.nodes:
            if self.alive(k):
                self.nodes[k].proc.send_signal(signal.SIGTERM)
        for k in self.nodes:
            if self.nodes[k].proc:
                try:
                    self.nodes[k].proc.wait(90)
                except subprocess.TimeoutExpired:
                    self.nodes[k].proc.kill()
                    self.nodes[k].proc.wait()

    # --- kairosctl -----------------------------------------------------
    def ctl(self, k, *args, timeout=60):
        """kairosctl in node k's namespace against node k's kairosd."""
        return self.bed.run(k, [KAIROSCTL, "--socket", self.nodes[k].socket] + list(args),
                            timeout=timeout)

    def ctl_json(self, k, *args, timeout=60):
        r = self.ctl(k, "--json", *args, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"kairosctl {' '.join(args)} on node{k}: {r.returncode} "
                               f"{r.stdout}{r.stderr}")
        return json.loads(r.stdout)

    def fire_async(self, k, schedule, at):
        """Start `kairosctl --json fire SCHEDULE --at AT` in node k."""
        return self.bed.popen(k, [KAIROSCTL, "--socket", self.nodes[k].socket, "--json",
                                  "fire", schedule, "--at", at],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    # --- the database ----------------------------------------------------
    def sql(self, q):
        return self.bed.psql("kairos", q)

    def mandates(self):
        """{mandate_id: {schedule, fired_at (epoch s or None), status, owner,
        epoch, last_seq}} from kairos_mandate."""
        rows = self.sql("SELECT mandate_id, coalesce(schedule, ''), "
                        "coalesce(extract(epoch FROM fired_at)::bigint::text, ''), status, "
                        "coalesce(owner, ''), epoch, last_seq FROM kairos_mandate")
        return {r[0]: {"schedule": r[1], "fired_at": int(r[2]) if r[2] else None,
                       "status": r[3], "owner": r[4], "epoch": int(r[5]),
                       "last_seq": int(r[6])} for r in rows}

    def wal_rows(self, mandate=None):
        """[(mandate, seq, epoch, written_at (epoch s), record dict)] in
        seq order."""
        where = f"WHERE mandate_id = '{mandate}'" if mandate else ""
        rows = self.sql("SELECT mandate_id, seq, epoch, extract(epoch FROM written_at), "
                        f"rtrim(convert_from(line, 'UTF8'), E'\\n') FROM kairos_wal {where} "
                        "ORDER BY mandate_id, seq")
        out = []
        for r in rows:
            try:
                rec = json.loads(r[4])
            except ValueError:
                rec = {"op": "?unparsable", "line": r[4]}
            out.append((r[0], int(r[1]), int(r[2]), float(r[3]), rec))
        return out

    def ticks(self):
        return self.sql("SELECT schedule, extract(epoch FROM fired_at)::bigint, mandate_id, "
                        "claimed_by FROM kairos_tick")
