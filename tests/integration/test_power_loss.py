#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A randomized power-loss campaign on a FUSE state directory.

Each round mounts tests/fault/lossyfs (every byte not fsynced lives in its
memory only) over a backing directory, starts kairosd on it (the control
socket off the mount), fires a random number of mandates over several kinds
of schedules, and at a random moment kills kairosd and lossyfs together with
SIGKILL: a power loss.  Then it remounts, restarts kairosd, and sometimes
lets everything finish, resolving each review as an operator who can see
the world would (the effect is there: --done; it is not: --retry).

The moment: a random delay after the first fire; right after the k-th
fire's reply; right after a "WAL archived" line; inside an act (a random
delay after its start); during a graceful stop (SIGTERM); with the file
system dying first (kairosd meets ENOTCONN for a while); or during the
start itself (before READY=1).  Most mounts let lossyfs write unsynced
bytes back on its own (LOSSYFS_WRITEBACK: a power loss then leaves any
prefix of them, a torn record too).

The schedules: "quick" (every phase /bin/true, MaxCycles=2), "effect" (act
appends "MANDATE STEP" to a file on the real disk), "write" (act sleeps,
writes a file on the real disk through `kairosctl tool write --key
"$KAIROS_IDEM_KEY"`, EffectsVia=kairosctl, and sleeps again), "slow" (act
sleeps, then appends like "effect"; MaxCycles=2), "run" (act appends like
"effect" through `kairosctl tool run`, slow inside the call, EffectsVia=
kairosctl, and a Probe= that looks for the line), "runcheck" (the same with
the call's own `--check` and no Probe=; only when this kairosctl has `tool
run --check`).

Invariants, checked after every power loss and at the end:
  (a) every fire whose reply arrived is still listed (any status), and
      every resolve whose reply arrived is still in its mandate's record;
  (b) no act effect twice for one (mandate, step): one line each in the
      effects file; a tool-write file, once seen, never changes;
  (c) a mandate seen done before a power loss is done after it, and at the
      end (after a graceful stop and one more power loss) its summary and
      archive are on the backing disk;
  (d) re-firing every acknowledged tick at the end creates no mandate and
      runs no act (effects unchanged);
  (e) kairosd never crashes; recovery never quarantines a WAL and no
      mandate ends up quarantined or wal_io_error (a torn tail is fine).

Every done mandate of "effect", "slow", "run", "runcheck" and "write" has
its effect exactly once.  The report (stderr) gives the rounds, fires acknowledged, power
losses, mandates lost, duplicates and the reviews with their reasons.

Knobs: KAIROS_POWERLOSS_ROUNDS (default 8, 3 under sanitizers; the issue's
proof runs 60 or more),
KAIROS_POWERLOSS_SEED (default: a fixed seed), KAIROS_POWERLOSS_KEEP=1 keeps
the directory (it is kept on a failure too).  Exit 77 (skipped) without root,
/dev/fuse or the lossyfs binary (LOSSYFS=)."""
import collections
import gzip
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
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kairos_harness import (KAIROSCTL, Client, Daemon, LossyMount, NotifySocket,  # noqa: E402
                            lossyfs_usable, write_config)

SANITIZED = (os.environ.get("KAIROS_SANITIZED", "") not in ("", "0")
             or "asan" in os.environ.get("KAIROSD", "").lower())
ROUNDS = int(os.environ.get("KAIROS_POWERLOSS_ROUNDS", "3" if SANITIZED else "8"))
SEED = int(os.environ.get("KAIROS_POWERLOSS_SEED", "20261127"))
KEEP = os.environ.get("KAIROS_POWERLOSS_KEEP", "") not in ("", "0")
TIMEOUT = 120.0 if SANITIZED else 60.0

FINAL = {"done", "failed", "terminated", "abandoned", "cancelled"}
BUGGY = {"quarantined", "wal_io_error"}
KINDS = ("quick", "effect", "write", "slow", "run")
READY_RE = re.compile(r"ready: recovered (\d+) WAL files? in \d+ ms: (\d+) resumed, "
                      r"(\d+) paused for review, (\d+) quarantined")
VERDICT_RE = re.compile(r"recovery: mnd_\w+ (\w+?)_\d+: (already_done|safe_to_retry|manual_review) "
                        r"\(([^)]*)\)")
STARTED_RE = re.compile(r"(mnd_\w+) (act_\d+): started")
FIRED_AT_BASE = 1893456000  # 2030-01-01T00:00:00Z

HANDLER = r"""#!/bin/sh
# one handler for the acts of every kind: $1 is the kind
line="$KAIROS_MANDATE_ID $KAIROS_STEP_ID"
case "$1" in
effect) printf '%s\n' "$line" >>"$PL_EFFECTS" ;;
slow) sleep "$PL_SLOW" && printf '%s\n' "$line" >>"$PL_EFFECTS" ;;
write) # a power loss inside the act lands before, during or after the call
        sleep 0.2
        printf '%s %s\n' "$line" "$$" | "$PL_KAIROSCTL" tool write --key "$KAIROS_IDEM_KEY" \
                "$PL_WROOT/${KAIROS_MANDATE_ID}_$KAIROS_STEP_ID" >/dev/null || exit 1
        sleep 0.2 ;;
run) # the effect is slow inside the call: a power loss lands in it
        exec "$PL_KAIROSCTL" tool run --key "$KAIROS_IDEM_KEY" -- \
                sh -c 'sleep 0.3; printf "%s\n" "$0" >>"$1"' "$line" "$PL_EFFECTS" >/dev/null ;;
runcheck)
        exec "$PL_KAIROSCTL" tool run --key "$KAIROS_IDEM_KEY" --check "sh $PL_CHECK" -- \
                sh -c 'sleep 0.3; printf "%s\n" "$0" >>"$1"' "$line" "$PL_EFFECTS" >/dev/null ;;
esac
"""

# The check of "runcheck"'s call and the Probe= of "run": is the line there?
CHECK = r"""#!/bin/sh
cat >/dev/null
if [ -e "$PL_EFFECTS" ] && grep -qxF "$KAIROS_MANDATE_ID $KAIROS_STEP_ID" "$PL_EFFECTS"; then
        printf '{"state":"done","result":"landed"}\n'
else
        printf '{"state":"not_started"}\n'
fi
"""


def ctl_has_check():
    """Has this kairosctl `tool run --check`?  (A kairosctl without it calls
    the option unknown.)"""
    try:
        p = subprocess.run([KAIROSCTL, "--socket", "/nonexistent", "tool", "run", "--key", "k",
                            "--check", "", "--", "true"], capture_output=True, text=True,
                           timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return "--check: " in p.stderr


def find_key(tree, key):
    """The value of the first `key` in a JSON tree (depth first), or None."""
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        tree = list(tree.values())
    if isinstance(tree, list):
        for v in tree:
            found = find_key(v, key)
            if found is not None:
                return found
    return None


def tick(i):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(FIRED_AT_BASE + 60 * i))


class Campaign:
    def __init__(self, test, seed):
        self.t = test
        self.rng = random.Random(seed)
        self.seed = seed
        self.dir = tempfile.mkdtemp(prefix="kairos-powerloss-")
        self.backing = os.path.join(self.dir, "disk")
        self.mnt = os.path.join(self.dir, "mnt")
        self.state = os.path.join(self.mnt, "state")
        self.effects = os.path.join(self.dir, "effects")
        self.wroot = os.path.join(self.dir, "wroot")
        self.sock = os.path.join(self.dir, "control.sock")
        for p in (self.backing, self.mnt, self.wroot):
            os.mkdir(p)
        handler = os.path.join(self.dir, "act.sh")
        with open(handler, "w") as f:
            f.write(HANDLER)
        os.chmod(handler, 0o755)
        check = os.path.join(self.dir, "check.sh")
        with open(check, "w") as f:
            f.write(CHECK)
        self.kinds = KINDS + (("runcheck",) if ctl_has_check() else ())
        env = ["PL_EFFECTS=" + self.effects, "PL_WROOT=" + self.wroot, "PL_SLOW=0.6",
               "PL_CHECK=" + check,
               "PL_KAIROSCTL=" + os.path.abspath(KAIROSCTL) if os.sep in KAIROSCTL
               else "PL_KAIROSCTL=" + (shutil.which(KAIROSCTL) or KAIROSCTL)]

        def sched(kind, cycles, **exec_keys):
            keys = {"Act": "%s %s" % (handler, kind), "Environment": env}
            keys.update(exec_keys)
            return {"Schedule": {"Cron": "0 0 1 1 *", "Concurrency": "allow"},
                    "Mandate": {"MaxCycles": str(cycles)}, "Exec": keys}
        schedules = {
            "quick": sched("quick", 2, Observe="/bin/true", Orient="/bin/true",
                           Decide="/bin/true", Reflect="/bin/true", Effects=""),
            "effect": sched("effect", 1),
            "write": sched("write", 1, EffectsVia="kairosctl"),
            "slow": sched("slow", 2),
            "run": sched("run", 1, EffectsVia="kairosctl", Probe="/bin/sh " + check),
        }
        if "runcheck" in self.kinds:
            schedules["runcheck"] = sched("runcheck", 1, EffectsVia="kairosctl")
        self.conf = write_config(self.dir, self.state, schedules, control_socket=self.sock,
                                 daemon_extra="MaxConcurrentMandates=16\n"
                                              "[Idempotency]\nWriteRoots=%s\n" % self.wroot)
        self.notify = NotifySocket(self.dir)
        self.fs = None
        self.d = None
        self.nfire = 0
        self.acked = {}        # mandate id -> (schedule, fired_at)
        self.done_seen = set()
        self.resolves = set()  # (mandate, step) of every resolve whose reply arrived
        self.written = {}      # tool-write file -> its content when first seen
        self.stats = collections.Counter()
        self.reviews = collections.Counter()
        self.verdicts = collections.Counter()  # recovery's decisions, from the logs
        self.logs = []
        self.thread_error = None
        self.fs_dead = False

    # --- the machine -------------------------------------------------------
    def power_on(self, wait_ready=True):
        # mostly, the page cache writes unsynced bytes back on its own
        wb = self.rng.randrange(1, 1 << 32) if self.rng.random() < 0.7 else None
        self.stats["mounts with write-back"] += wb is not None
        self.fs = LossyMount(self.backing, self.mnt, writeback=wb)
        self.notify.clear()
        self.d = Daemon(self.state, config=self.conf, notify=self.notify, socket_path=self.sock)
        if wait_ready:
            return self.wait_ready()
        return None

    def wait_ready(self):
        try:
            self.notify.wait_ready(TIMEOUT)
        except TimeoutError:
            self.fail("kairosd not ready:\n%s" % self.d.log()[-4000:])
        m = READY_RE.search(self.d.wait_log("ready: recovered", TIMEOUT))
        self.stats["wal files recovered"] += int(m.group(1))
        if int(m.group(4)):
            self.fail("recovery quarantined %s WAL(s) after a power loss" % m.group(4))
        return Client(self.sock, timeout=TIMEOUT)

    def power_loss(self, stopping=False):
        """SIGKILL kairosd and lossyfs together; kairosd must have been alive
        (or, stopping, have exited 0)."""
        rc = self.d.proc.poll()
        alive = rc is None or (stopping and rc == 0)
        self.d.proc.kill()
        self.fs.proc.kill()
        self.d.kill()
        self.d.proc.stderr.close()
        log = self.d.log()
        self.logs.append(log)
        self.d = None
        self.fs.kill()
        self.fs = None
        self.stats["power losses"] += 1
        if not alive:
            self.fail("kairosd had exited by itself before the power loss:\n%s" % log[-4000:])
        self.check_log(log)

    def check_log(self, log):
        for bad in ("AddressSanitizer", "runtime error:", "LeakSanitizer", "wal_corrupt",
                    "corrupt and quarantined"):
            if bad in log:
                self.fail("%r in kairosd's log:\n%s" % (bad, log[-4000:]))
        self.stats["torn tails repaired"] += log.count("torn tail")
        for phase, verdict, reason in VERDICT_RE.findall(log):
            self.verdicts["%s %s (%s)" % (phase, verdict, reason)] += 1

    def fail(self, msg):
        global KEEP
        KEEP = True
        self.t.fail("seed %d, round %d (kept %s): %s" % (self.seed, self.stats["rounds"],
                                                          self.dir, msg))

    # --- what the world shows ------------------------------------------------
    def effect_counts(self):
        try:
            with open(self.effects) as f:
                return collections.Counter(f.read().splitlines())
        except FileNotFoundError:
            return collections.Counter()

    def check_effects(self):
        dup = {k: n for k, n in self.effect_counts().items() if n > 1}
        self.stats["duplicates"] = len(dup)
        if dup:
            self.fail("act effects ran twice: %s" % dup)
        for name in os.listdir(self.wroot):
            if name.startswith("."):
                continue  # a tool write's temporary file
            with open(os.path.join(self.wroot, name)) as f:
                text = f.read()
            first = self.written.setdefault(name, text)
            if first != text:
                self.stats["duplicates"] += 1
                self.fail("tool write %s written twice: %r then %r" % (name, first, text))

    def listed(self, c):
        r = c.call("list", limit=0)
        if not r["ok"]:
            self.fail("list: %s" % r)
        return {m["id"]: m for m in r["result"]["mandates"]}

    def check_after_power_loss(self, c):
        ms = self.listed(c)
        lost = [m for m in self.acked if m not in ms]
        self.stats["mandates lost"] += len(lost)
        if lost:
            self.fail("acknowledged fires lost by the power loss: %s" % lost)
        undone = [m for m in self.done_seen if ms[m]["status"] != "done"]
        if undone:
            self.fail("done before the power loss, not after: %s"
                      % [(m, ms[m]["status"], ms[m].get("reason")) for m in undone])
        for mid, step in sorted(self.resolves):
            r = c.call("show", mandate=mid)
            ops = find_key(r, "operators") or []
            if not any(o.get("step_id") == step for o in ops):
                self.fail("acknowledged resolve of %s %s lost by the power loss: %s"
                          % (mid, step, r))
            self.stats["resolves kept"] += 1
        bad = [(m["id"], m["status"], m.get("reason")) for m in ms.values()
               if m["status"] in BUGGY or m.get("reason") == "wal_corrupt"]
        if bad:
            self.fail("after a power loss: %s" % bad)
        self.check_effects()
        return ms

    # --- the operator ------------------------------------------------------
    def settle(self, c):
        """Resolve each review by what the world shows; wait until every
        mandate is final."""
        deadline = time.monotonic() + TIMEOUT
        resolved = set()
        while True:
            ms = self.listed(c)
            for m in ms.values():
                if m["status"] == "done":
                    self.done_seen.add(m["id"])
                if m["status"] in BUGGY:
                    self.fail("%s is %s" % (m["id"], m["status"]))
                step = m.get("review_step")
                if m["status"] != "paused_review" or not step or (m["id"], step) in resolved:
                    continue
                kind = m["schedule"]
                self.reviews["%s %s: %s" % (kind, step.split("_")[0], m.get("reason"))] += 1
                line = "%s %s" % (m["id"], step)
                if kind in ("effect", "slow", "run", "runcheck"):
                    landed = self.effect_counts()[line] > 0
                elif kind == "write":
                    landed = os.path.exists(os.path.join(self.wroot, "%s_%s" % (m["id"], step)))
                else:
                    landed = False
                r = c.call("resolve", mandate=m["id"], step=step,
                           action="done" if landed else "retry", reason="power-loss campaign")
                if not r["ok"]:
                    self.fail("resolve %s %s: %s" % (m["id"], step, r))
                resolved.add((m["id"], step))
                self.resolves.add((m["id"], step))
            if all(m["status"] in FINAL for m in ms.values()):
                break
            if time.monotonic() > deadline:
                self.fail("not settled: %s" % {m["id"]: m["status"] for m in ms.values()
                                                if m["status"] not in FINAL})
            time.sleep(0.05)  # polling the mandates' statuses: there is no event for "all final"
        self.check_effects()
        counts = self.effect_counts()
        for m in ms.values():
            if m["status"] != "done" or m["schedule"] == "quick":
                continue
            for cyc in range(1, m["cycle"] + 1):
                step = "act_%03d" % cyc
                if m["schedule"] == "write":
                    n = int(os.path.exists(os.path.join(self.wroot, "%s_%s" % (m["id"], step))))
                else:
                    n = counts["%s %s" % (m["id"], step)]
                if n != 1:
                    self.fail("done mandate %s (%s) has %d effects for %s"
                              % (m["id"], m["schedule"], n, step))
        return ms

    # --- one round -----------------------------------------------------------
    def firer(self, c, n, stop, broken, acked, rng):
        """Fire n mandates (rng: the thread's own, so that a seed replays)."""
        try:
            for i in range(n):
                if stop.is_set():
                    return
                kind = rng.choice(self.kinds)
                at = tick(self.nfire)
                self.nfire += 1
                r = c.call("fire", schedule=kind, at=at)
                if not r["ok"] and (r["error"]["code"] == "shutting_down" or self.fs_dead):
                    break  # a graceful stop began, or the file system died: refused
                if not r["ok"]:
                    self.fail("fire %s %s: %s" % (kind, at, r))
                self.acked[r["result"]["mandate"]] = (kind, at)
                self.stats["fires acknowledged"] += 1
                with acked:
                    acked.n = i + 1
                    acked.notify_all()
                if rng.random() < 0.5:
                    time.sleep(rng.uniform(0, 0.2))  # spreading the fires out in time
            while not stop.is_set():
                for m in self.listed(c).values():
                    if m["status"] == "done":
                        self.done_seen.add(m["id"])
                stop.wait(0.05)
        except (OSError, EOFError, ValueError):
            broken.set()  # the power went while a request was out: it was never acknowledged
        except AssertionError as e:
            self.thread_error = e
        finally:
            with acked:
                acked.over = True
                acked.notify_all()

    def wait_trigger(self, how, start_lines, acked, n):
        """Wait for the moment of the power loss (or a deadline: then now)."""
        if how == "afterfire":
            # right after the k-th fire's reply, while WALs are written
            k = self.rng.randint(1, n)
            with acked:
                if not acked.wait_for(lambda: acked.n >= k or acked.over, 6.0):
                    return "deadline"
            return "afterfire"
        deadline = time.monotonic() + (1.5 if how == "delay" else 6.0)
        target = time.monotonic() + self.rng.uniform(0.0, 1.5) if how == "delay" else None
        d = self.d
        with d.cond:
            while True:
                now = time.monotonic()
                if target is not None and now >= target:
                    return "delay"
                new = [x for x in d.lines[start_lines:] if x is not None]
                if how == "archived" and any("WAL archived" in x for x in new):
                    return "archived"
                if how == "midact" and any(STARTED_RE.search(x) for x in new):
                    break
                if d.lines and d.lines[-1] is None:
                    self.fail("kairosd exited:\n%s" % d.log()[-4000:])
                if now >= deadline:
                    return "deadline"
                d.cond.wait(min(deadline, target or deadline) - now)
        time.sleep(self.rng.uniform(0.0, 0.8))  # somewhere inside the act
        return "midact"

    def round(self):
        self.stats["rounds"] += 1
        if self.rng.random() < 0.15:
            # the power goes while kairosd starts and recovers
            self.power_on(wait_ready=False)
            time.sleep(self.rng.uniform(0.0, 0.15))  # a random moment of the start
            self.stats["trigger startup"] += 1
            self.power_loss()
        c = self.power_on()
        self.check_after_power_loss(c)
        if self.rng.random() < 0.3:
            self.settle(c)
        start_lines = len(self.d.lines)
        self.fs_dead = False
        stop, broken = threading.Event(), threading.Event()
        fc = Client(self.sock, timeout=TIMEOUT)
        n = self.rng.randint(1, 8)
        acked = threading.Condition()
        acked.n, acked.over = 0, False
        th = threading.Thread(target=self.firer, args=(fc, n, stop, broken, acked,
                                                        random.Random(self.rng.random())))
        th.start()
        how = self.rng.choice(("delay", "archived", "midact", "afterfire", "stop", "fsfirst"))
        stopping = how == "stop"
        if how == "fsfirst":
            # the file system goes first (its server dies, the host lives on):
            # kairosd gets ENOTCONN for a while and must not crash
            self.wait_trigger("afterfire", start_lines, acked, n)
            self.fs_dead = True
            self.fs.proc.kill()
            self.fs.proc.wait()
            time.sleep(self.rng.uniform(0.1, 0.6))  # kairosd meets the dead file system
            self.stats["trigger fsfirst"] += 1
        elif stopping:
            # the power goes while kairosd stops gracefully
            self.wait_trigger("delay", start_lines, acked, n)
            self.d.proc.terminate()
            time.sleep(self.rng.uniform(0.0, 0.5))  # a random moment of the stop
            self.stats["trigger stop"] += 1
        else:
            self.stats["trigger " + self.wait_trigger(how, start_lines, acked, n)] += 1
        self.power_loss(stopping)
        stop.set()
        th.join(TIMEOUT)
        fc.close()
        if self.thread_error:
            raise self.thread_error
        c.close()

    def finish(self):
        c = self.power_on()
        self.check_after_power_loss(c)
        ms = self.settle(c)
        before = self.effect_counts()
        # (d) a re-fire of every acknowledged tick is a no-op
        for mid, (kind, at) in sorted(self.acked.items()):
            r = c.call("fire", schedule=kind, at=at)
            if not r["ok"] or r["result"]["mandate"] != mid:
                self.fail("re-fire of %s %s (%s): %s" % (kind, at, mid, r))
        after = self.listed(c)
        if set(after) != set(ms):
            self.fail("re-fires created mandates: %s" % (set(after) - set(ms)))
        c.close()
        rc = self.d.stop(timeout=TIMEOUT)
        self.d.proc.stderr.close()
        log = self.d.log()
        self.d = None
        self.check_log(log)
        if rc != 0:
            self.fail("kairosd's graceful stop exited %d:\n%s" % (rc, log[-4000:]))
        if self.effect_counts() != before:
            self.fail("re-fires ran acts again")
        self.check_effects()
        # (c) one more power loss: what a graceful stop left must be on disk
        self.fs.kill()
        self.fs = None
        state = os.path.join(self.backing, "state")
        for m in sorted(self.done_seen):
            summary = os.path.join(state, "mandates", m + ".json")
            with open(summary) as f:
                if json.load(f).get("status") != "done":
                    self.fail("summary of %s is not done" % m)
            with gzip.open(os.path.join(state, "archive", m + ".wal.jsonl.gz")) as f:
                if b'"plan_finalize"' not in f.read():
                    self.fail("archive of %s has no plan_finalize" % m)

    def report(self):
        s = self.stats
        with open("/proc/loadavg") as f:
            load = " ".join(f.read().split()[:3])
        triggers = ", ".join("%s %d" % (k[8:], v) for k, v in sorted(s.items())
                             if k.startswith("trigger "))
        if "runcheck" not in self.kinds:
            print("power-loss campaign: no runcheck workload (this kairosctl has no tool run "
                  "--check)", file=sys.stderr)
        print("power-loss campaign, seed %d: %d rounds, %d fires acknowledged, "
              "%d power losses (triggers: %s; %d mounts with write-back), "
              "%d mandates lost, %d duplicates, %d done, %d WAL files recovered, "
              "%d torn tails, %d resolves kept across power losses; "
              "recovery decided: %s; reviews: %s; load %s"
              % (self.seed, s["rounds"], s["fires acknowledged"], s["power losses"], triggers,
                 s["mounts with write-back"], s["mandates lost"], s["duplicates"],
                 len(self.done_seen), s["wal files recovered"], s["torn tails repaired"],
                 s["resolves kept"], dict(self.verdicts) or "nothing",
                 dict(self.reviews) or "none", load), file=sys.stderr)

    def close(self):
        if self.d:
            self.d.kill()
            self.d.proc.stderr.close()
        if self.fs:
            self.fs.kill()
        self.notify.close()
        if not KEEP:
            shutil.rmtree(self.dir, ignore_errors=True)


@unittest.skipUnless(lossyfs_usable(), "needs root, /dev/fuse and lossyfs")
class TestLossyfsModel(unittest.TestCase):
    """What lossyfs keeps across a power loss, with and without write-back."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-lossyfs-")
        self.backing = os.path.join(self.dir, "disk")
        self.mnt = os.path.join(self.dir, "mnt")
        os.mkdir(self.backing)
        os.mkdir(self.mnt)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def power_cycle(self, writeback):
        """Synced records 0..39, 40..79 written after; what is on disk."""
        fs = LossyMount(self.backing, self.mnt, writeback=writeback)
        try:
            recs = [b"record %03d %s\n" % (i, b"x" * 50) for i in range(80)]
            fd = os.open(os.path.join(self.mnt, "f"), os.O_WRONLY | os.O_CREAT | os.O_APPEND
                         | os.O_TRUNC, 0o600)
            for r in recs[:40]:
                os.write(fd, r)
            os.fdatasync(fd)
            for r in recs[40:]:
                os.write(fd, r)
            os.close(fd)
            os.rename(os.path.join(self.mnt, "f"), os.path.join(self.mnt, "g"))
        finally:
            fs.kill()
        with open(os.path.join(self.backing, "g"), "rb") as f:
            return b"".join(recs), f.read()

    def test_unsynced_bytes_lost(self):
        recs, disk = self.power_cycle(None)
        self.assertEqual(disk, recs[:len(recs) // 2])

    def test_writeback_lands_a_prefix(self):
        # over some seeds, a power loss leaves every synced byte and then a
        # prefix of the unsynced ones: none, some (a torn record) or all
        landed = set()
        for seed in range(1, 9):
            recs, disk = self.power_cycle(seed)
            self.assertGreaterEqual(len(disk), len(recs) // 2, seed)
            self.assertEqual(disk, recs[:len(disk)], seed)
            landed.add(len(disk))
            os.unlink(os.path.join(self.backing, "g"))
        self.assertGreater(len(landed), 2, landed)


@unittest.skipUnless(lossyfs_usable(), "needs root, /dev/fuse and lossyfs")
class TestPowerLoss(unittest.TestCase):
    def test_campaign(self):
        c = Campaign(self, SEED)
        try:
            for _ in range(ROUNDS):
                c.round()
            c.finish()
        finally:
            c.report()
            c.close()


if __name__ == "__main__":
    prog = unittest.main(verbosity=2, exit=False)
    res = prog.result
    if res.testsRun and len(res.skipped) == res.testsRun:
        sys.exit(77)
    sys.exit(0 if res.wasSuccessful() else 1)
