#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The nemesis campaign of cluster mode: three kairosd and one PostgreSQL,
each in its own network namespace (cluster_bed.py), under load and faults,
then a checker over the database's rows and the effects log.

Load: SCHEDULES schedules firing every minute on every node (observe and
act pause 0.5-5 s at random; act makes its effect through kairosctl tool
run, EffectsVia=kairosctl); just after each minute, `kairosctl fire S --at
MINUTE` of the same tick on every node at once; and every 3-8 s a new
tick of BURST (a schedule that never fires by itself, Concurrency=allow)
fired on every node at once, so that faults land in the middle of steps.

Nemesis, every 10-30 s at random (one fault at a time), the kinds dealt
from a shuffled deck (every kind once before any twice), each counted:
  kill9        kill -9 one kairosd (restarted 1-5 s later, same clock)
  kill_node    kill a whole node, handlers included (restarted 1-5 s later)
  stop         SIGSTOP a kairosd alone 1-60 s (its handlers keep running)
  stop_node    SIGSTOP a whole node 1-60 s
  cut          cut a node off both ways (link down or loss 100%) 5-60 s
  cut_in       a one-way cut 5-60 s: the node sends (PostgreSQL receives
               its packets) and receives nothing
  cut_out      the reverse: the node receives, what it sends is lost
  delay        100-300 ms delay with 20-50 % jitter each way, 5-30 s
  restart_pg   restart PostgreSQL (-m immediate)
  kill_pg      kill -9 every PostgreSQL process, started again 0.5 s to
               min(5 s, 0.45 lease) later: an outage shorter than the lease
  skew_ahead   restart a node with its wall clock 5 s ahead (faketime); it
  skew_behind  stays so (through kills) until a skew fault or the quiet
               period: 5 s behind
  skew_alone   restart a node with its clock 5 s off (ahead and behind in
               turn, first ahead with an even seed, behind with an odd
               one) and kill the other two whole until a minute boundary
               and 15 s more have passed: the skewed node alone must claim
               every schedule's tick (the minute's `fire` is not sent
               then), then they start again (only with >= 120 s of load
               left)

Then a quiet period: everything healed and running, until every mandate
fired in the run has ended or paused (with a deadline).  The checker:
every expected tick (schedule x minute of the run) has exactly one
mandate; no double fire; no (mandate, step) whose effect ran twice; no
effect of a mandate the database does not know; no lost mandate (each
ended done, or paused with a reason); the rows' invariants (pg_checks.py,
with the daemon's: no row under an old epoch); 0 ticks lost to skew (the
ticks of the minutes a node ran with its clock off: each exactly one
mandate; those of a skew_alone stretch claimed by the skewed node); 0
mandates failed by a database outage shorter than the lease (no record
`failed` written between the outage's start and a lease after its end:
kill_pg, restart_pg, a cut shorter than the lease), and none paused for
review by one (no record `needs_review` then); the failover after a
node's death (kill9, kill_node) p99 <= LeaseSec + 3 s.  Reported: the
failover time (owner's death → the owner record of another node, and →
the next step started there) p50/p99, after a node's death and after any
fault (a next step that waited for a sibling under Concurrency=queue
apart: that wait is the schedule's, not the failover's), counts per fault
and per outcome, `uptime`.

Environment: KAIROS_NEMESIS_SEED (default: random, printed),
KAIROS_NEMESIS_SECONDS (default 100; CI runs 60, 45 under the sanitizers),
KAIROS_NEMESIS_LEASE (LeaseSec,
default 4; the figures of the issue need 10), KAIROS_NEMESIS_KINDS (a
comma-separated list of fault kinds to deal from; default all),
KAIROS_KEEP=1 keeps the directory.  Skipped (77) as test_cluster.py is.
"""
import os
import random
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_bed as cb  # noqa: E402
import pg_checks  # noqa: E402
from test_cluster import skip_reason  # noqa: E402

SKIP = 77
SCHEDULES = ["s1", "s2", "s3"]
BURST = "burst"


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(p / 100.0 * len(xs) + 0.5)) - 1))]


# --- the checker: pure functions over what the run left --------------------
def expected_ticks(schedules, t_from, t_to):
    """(schedule, minute) for every minute boundary in (t_from, t_to]
    (the schedules here fire every minute)."""
    first = (int(t_from) // 60 + 1) * 60
    return {(s, m) for s in schedules for m in range(first, int(t_to) + 1, 60)}


def check_ticks(expected, mandates):
    """Missing and doubled ticks: [(what, schedule, minute, ids)]."""
    by_tick = {}
    for mid, m in mandates.items():
        if m["fired_at"] is not None:
            by_tick.setdefault((m["schedule"], m["fired_at"]), []).append(mid)
    bad = []
    for tick in sorted(expected):
        ids = by_tick.get(tick, [])
        if len(ids) != 1:
            bad.append(("missing" if not ids else "double", tick[0], cb.utc(tick[1]), ids))
    for tick, ids in by_tick.items():
        if len(ids) > 1 and tick not in expected:
            bad.append(("double", tick[0], cb.utc(tick[1]), ids))
    return bad


def check_effects(lines, mandates):
    """(mandate, step) whose effect ran more than once, and effects of
    mandates the database does not hold."""
    count = {}
    for x in lines:
        if x["kind"] == "effect":
            count.setdefault((x["mandate"], x["step"]), []).append(x)
    twice = {k: v for k, v in count.items() if len(v) > 1}
    unknown = sorted({k[0] for k in count if k[0] not in mandates})
    return twice, unknown


def ended_at(rs):
    """When a mandate stopped holding a slot: its last plan_finalize or
    needs_review/failed transition (None: still unfinished)."""
    end = None
    for (_, _, _, t, rec) in rs:
        if rec.get("op") == "plan_finalize" or (
                rec.get("op") == "transition" and rec.get("status") in ("needs_review", "failed")):
            end = t
    return end


def failover_times(events, wal, schedule_of=None, queued=()):
    """For each fault that took a node away (kill, SIGSTOP, cut) and each
    mandate that node held then, the time from the fault to the owner record
    of the node that took the mandate over, and to the first step started
    there.  A takeover after a graceful stop (SIGTERM: the node handed its
    mandates over) is not a failover.  wal: [(mandate, seq, epoch,
    written_at, record)] in seq order.  schedule_of: {mandate: schedule};
    queued: the schedules with Concurrency=queue, whose mandate waits, on the
    node that took it as on any other, while a sibling runs: a next step
    that started within a second of the end of a sibling that was still
    unfinished when the mandate was taken over waited for that sibling, not
    for the failover, and is counted apart.  Returns ([(delay, mandate,
    fault)], [(delay, mandate, fault)], [(delay, mandate, fault)]): to the
    owner record, to the next step, to the next step behind a sibling."""
    rows = {}
    for r in wal:
        rows.setdefault(r[0], []).append(r)
    schedule_of = schedule_of or {}
    ends = {mid: ended_at(rs) for mid, rs in rows.items()}
    marks = sorted((t, what, k) for (t, what, k) in events
                   if k and (what.split()[0] in ("kill", "SIGSTOP", "cut") or what == "SIGTERM"))
    to_owner, to_step, behind = [], [], []
    for mid, rs in rows.items():
        for i, (_, seq, epoch, t, rec) in enumerate(rs):
            if rec.get("op") != "owner":
                continue
            prev = rec.get("prev_owner") or ""
            if not prev.startswith("node"):
                continue
            k = int(prev[4:])
            before = [(tf, what) for (tf, what, kf) in marks if kf == k and tf <= t]
            if not before or before[-1][1] == "SIGTERM" or t - before[-1][0] > 300:
                continue
            tf, what = before[-1]
            # the mandate must have been written before the fault, and this
            # must be its first takeover since: a later one (the new owner
            # lost it in turn, to a restart of the database say) is not
            # this fault's
            if rs[0][3] > tf or any(r[4].get("op") == "owner" and r[3] > tf for r in rs[:i]):
                continue
            fault = f"{what} node{k} at {tf:.1f}"
            to_owner.append((t - tf, mid, fault))
            for (_, _, e2, t2, r2) in rs[i + 1:]:
                if e2 == epoch and r2.get("op") == "transition" and \
                        r2.get("status") == "executing":
                    sched = schedule_of.get(mid)
                    waited = sched in queued and any(
                        o != mid and schedule_of.get(o) == sched and
                        rows[o][0][3] <= rs[0][3] and end is not None and
                        t <= end and t2 - 1.0 <= end <= t2
                        for o, end in ends.items())
                    (behind if waited else to_step).append((t2 - tf, mid, fault))
                    break
    return to_owner, to_step, behind


def skew_intervals(events, t_end):
    """[(from, to, node, offset)]: when a node ran with its wall clock off,
    from the events "start clockXs" to the node's next start, kill or
    SIGTERM (or t_end)."""
    out, open_ = [], {}
    for (t, what, k) in sorted(events, key=lambda e: e[0]):
        if k is None:
            continue
        w = what.split()[0]
        if w in ("start", "kill", "SIGTERM") and k in open_:
            t0, off = open_.pop(k)
            out.append((t0, t, k, off))
        if w == "start" and "clock" in what:
            open_[k] = (t, float(what.split("clock")[1].rstrip("s")))
    out += [(t0, t_end, k, off) for k, (t0, off) in open_.items()]
    return sorted(out)


def ticks_lost_to_skew(expected, mandates, intervals, alone, claimed_by):
    """The expected ticks of the minutes a node ran skewed (a minute inside
    one of intervals), the ones among them that have not exactly one
    mandate, and those of a skew_alone stretch (alone: [(from, to, node)])
    not claimed by the alone node.  claimed_by: {(schedule, minute): node
    name} from kairos_tick.  Returns (skewed ticks, [(why, schedule,
    minute)])."""
    by_tick = {}
    for mid, m in mandates.items():
        if m["fired_at"] is not None:
            by_tick.setdefault((m["schedule"], m["fired_at"]), []).append(mid)
    skewed = sorted(t for t in expected if any(a <= t[1] < b for (a, b, _, _) in intervals))
    bad = []
    for t in skewed:
        n = len(by_tick.get(t, []))
        if n != 1:
            bad.append(("missing" if n == 0 else "double", t[0], t[1]))
            continue
        for (a, b, k) in alone:
            if a <= t[1] < b and claimed_by.get(t) != f"node{k}":
                bad.append((f"claimed by {claimed_by.get(t)!r}, not node{k} (alone)",
                            t[0], t[1]))
    return skewed, bad


def failed_in_outages(wal, outages, lease, status="failed"):
    """Mandates with a record of that status (`failed`, or `needs_review`:
    paused for review) written during an outage of the database shorter
    than the lease or within a lease after it (outages: [(down, up,
    what)]).  Returns ({mandate: what}, number of such records in all)."""
    out, total = {}, 0
    for (mid, _, _, t, rec) in wal:
        if rec.get("status") != status:
            continue
        total += 1
        for (down, up, what) in outages:
            if up - down < lease and down <= t <= up + lease:
                out.setdefault(mid, what)
    return out, total


def self_test():
    """The checker finds what it must (synthetic data, no root)."""
    exp = expected_ticks(["a"], 59, 181)
    assert exp == {("a", 60), ("a", 120), ("a", 180)}, exp
    ms = {"m1": {"schedule": "a", "fired_at": 60}, "m2": {"schedule": "a", "fired_at": 120},
          "m3": {"schedule": "a", "fired_at": 120}}
    bad = check_ticks(exp, ms)
    assert ("missing", "a", cb.utc(180), []) in bad, bad
    assert [b for b in bad if b[0] == "double" and b[2] == cb.utc(120)], bad
    eff = [{"kind": "effect", "mandate": "m1", "step": "act_001"},
           {"kind": "effect", "mandate": "m1", "step": "act_001"},
           {"kind": "effect", "mandate": "m2", "step": "act_001"},
           {"kind": "start", "mandate": "m2", "step": "act_001"},
           {"kind": "effect", "mandate": "zz", "step": "act_001"}]
    twice, unknown = check_effects(eff, ms)
    assert list(twice) == [("m1", "act_001")] and unknown == ["zz"], (twice, unknown)
    wal = [("m1", 1, 1, 100.0, {"op": "mandate"}),
           ("m1", 2, 1, 101.0, {"op": "transition", "status": "executing"}),
           ("m1", 3, 2, 110.0, {"op": "owner", "prev_owner": "node2", "epoch": 2}),
           ("m1", 4, 2, 111.0, {"op": "transition", "status": "executing"})]
    o, s, b = failover_times([(102.0, "kill -9 kairosd", 2)], wal)
    assert [x[0] for x in o] == [8.0] and [x[0] for x in s] == [9.0] and b == [], (o, s, b)
    o, s, b = failover_times([(102.0, "kill -9 kairosd", 3)], wal)
    assert o == [] and s == [] and b == [], (o, s, b)
    o, s, b = failover_times([(102.0, "kill -9 kairosd", 2), (105.0, "SIGTERM", 2)], wal)
    assert o == [] and s == [] and b == [], (o, s, b)
    # m2 (fired after m0, same Concurrency=queue schedule) waited for m0,
    # which ended at 129.5, and started at 130: behind a sibling
    wal2 = wal + [("m0", 1, 1, 99.0, {"op": "mandate"}),
                  ("m0", 2, 1, 129.5, {"op": "plan_finalize", "status": "succeeded"}),
                  ("m2", 1, 1, 100.5, {"op": "mandate"}),
                  ("m2", 2, 2, 110.0, {"op": "owner", "prev_owner": "node2", "epoch": 2}),
                  ("m2", 3, 2, 130.0, {"op": "transition", "status": "executing"})]
    wal2.sort(key=lambda r: (r[0], r[1]))
    sched = {"m0": "q", "m1": "x", "m2": "q"}
    o, s, b = failover_times([(102.0, "kill -9 kairosd", 2)], wal2, sched, {"q"})
    assert sorted(x[1] for x in o) == ["m1", "m2"], o
    assert [x[1] for x in s] == ["m1"] and [(x[0], x[1]) for x in b] == [(28.0, "m2")], (s, b)
    # a second takeover after the same fault (node2 took it, lost it to
    # something else, and it was taken from node2 again) is not a sample
    wal3 = wal + [("m1", 5, 3, 140.0, {"op": "owner", "prev_owner": "node2", "epoch": 3}),
                  ("m1", 6, 3, 141.0, {"op": "transition", "status": "executing"})]
    o, s, b = failover_times([(102.0, "kill -9 kairosd", 2)], wal3)
    assert [x[0] for x in o] == [8.0] and [x[0] for x in s] == [9.0], (o, s)
    # the same wait under Concurrency=allow is the failover's
    o, s, b = failover_times([(102.0, "kill -9 kairosd", 2)], wal2, sched, set())
    assert sorted(x[1] for x in s) == ["m1", "m2"] and b == [], (s, b)
    # skew: node1 +5 from 100 to its kill at 250, again from its restart at
    # 252 to the end; node2 -5 from 300 to 400 alone (node1 and 3 killed)
    ev = [(100.0, "start clock+5s", 1), (250.0, "kill -9 kairosd", 1),
          (252.0, "start clock+5s", 1), (300.0, "start clock-5s", 2),
          (301.0, "kill node", 3), (400.0, "SIGTERM", 2), (401.0, "start", 2)]
    iv = skew_intervals(ev, 500.0)
    assert iv == [(100.0, 250.0, 1, 5.0), (252.0, 500.0, 1, 5.0), (300.0, 400.0, 2, -5.0)], iv
    exp = expected_ticks(["a"], 59, 600)
    ms = {f"m{t}": {"schedule": "a", "fired_at": t} for t in (60, 120, 180, 240, 300, 420)}
    ms["mx"] = {"schedule": "a", "fired_at": 420}
    sk, bad = ticks_lost_to_skew(exp, ms, iv, [(300.0, 400.0, 2)],
                                 {("a", 300): "node3", ("a", 360): "node2"})
    assert [t[1] for t in sk] == [120, 180, 240, 300, 360, 420, 480], sk
    assert [(b[0][:7], b[2]) for b in bad] == [("claimed", 300), ("missing", 360),
                                               ("double", 420), ("missing", 480)], bad
    wal = [("m1", 1, 1, 100.0, {"op": "mandate"}),
           ("m1", 2, 1, 107.0, {"op": "transition", "status": "failed"}),
           ("m2", 2, 1, 130.0, {"op": "transition", "status": "failed"}),
           ("m3", 2, 1, 200.0, {"op": "transition", "status": "failed"})]
    bad, total = failed_in_outages(wal, [(100.0, 103.5, "kill pg"), (195.0, 215.0, "cut")], 4)
    assert bad == {"m1": "kill pg"} and total == 3, (bad, total)
    wal[1][4]["status"] = "needs_review"
    bad, total = failed_in_outages(wal, [(100.0, 103.5, "kill pg")], 4, "needs_review")
    assert bad == {"m1": "kill pg"} and total == 1, (bad, total)
    print("checker self-test: ok")


# --- the run ---------------------------------------------------------------
class Campaign:
    def __init__(self, c, rng, seconds, lease):
        self.c = c
        self.rng = rng
        self.seconds = seconds
        self.lease = lease
        self.stopped = set()       # nodes whose kairosd cannot answer now
        self.fires = {"true": 0, "false": 0, "error": 0}
        self.fire_errors = []
        self.quit = threading.Event()
        self.lock = threading.Lock()
        self.counts = {}
        self.deck = []
        self.acked = set()         # mandates named by a fire's answer
        self.kinds = list(self.KINDS)
        self.outages = []          # (down, up, what): the database unreachable
        self.alone = []            # (from, to, node): a skewed node alone
        self.alone_now = False     # the loader sends no fire then
        self.alone_sign = 5         # the seed's parity flips it (main())

    def log(self, msg):
        print(f"[{cb.utc(time.time())}] {msg}", flush=True)

    def fire_all(self, sched, at):
        """`kairosctl fire SCHED --at AT` on every node that can answer, at
        once; whether any node answered fired true or false (an error
        reply, e.g. a node that cannot renew its lease, claims nothing)."""
        with self.lock:
            nodes = [k for k in self.c.nodes if self.c.alive(k) and k not in self.stopped]
        procs = []
        for k in nodes:
            try:
                procs.append(self.c.fire_async(k, sched, at))
            except OSError as e:
                self.fire_errors.append(f"node{k}: {e}")
        answered = False
        for p in procs:
            try:
                out, err = p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            try:
                r = cb.json.loads(out)
            except ValueError:
                r = None
            with self.lock:
                if r is None:
                    self.fires["error"] += 1
                    self.fire_errors.append((out + err).strip()[:200])
                    continue
                if "fired" not in r:
                    self.fires["error"] += 1
                    self.fire_errors.append(str(r)[:200])
                else:
                    answered = True
                    self.fires["true" if r.get("fired") else "false"] += 1
                    if r.get("mandate"):
                        self.acked.add(r["mandate"])
        return answered

    # load: the tick of each minute fired on every node at once, just after
    # the nodes' schedulers fire it themselves
    def loader(self, rng):
        while not self.quit.is_set():
            now = time.time()
            nxt = (int(now) // 60 + 1) * 60 + rng.uniform(0, 1.5)
            if self.quit.wait(nxt - now):
                return
            if self.alone_now:
                continue
            self.fire_all(rng.choice(SCHEDULES), cb.utc(int(nxt) // 60 * 60))

    # more load between the minutes, so that faults land in steps: a new
    # tick (in the past) of a schedule that never fires by itself, fired on
    # every node at once every few seconds
    def burster(self, rng):
        base = (int(time.time()) // 60 - 60) * 60
        n = 0
        while not self.quit.wait(rng.uniform(3, 8)):
            n += 1
            at = base - 60 * n
            if self.fire_all(BURST, cb.utc(at)):
                with self.lock:
                    self.burst_ticks.add((BURST, at))

    def pick(self):
        """A running node; mostly one that holds a running mandate."""
        ks = [k for k in self.c.nodes if self.c.alive(k)]
        owners = {r[0] for r in self.c.sql("SELECT owner FROM kairos_mandate "
                                           "WHERE status = 'running'")}
        holders = [k for k in ks if f"node{k}" in owners]
        if holders and self.rng.random() < 0.7:
            return self.rng.choice(holders)
        return self.rng.choice(ks)

    def hold(self, secs):
        end = min(time.time() + secs, self.t_end)
        while time.time() < end:
            time.sleep(min(0.5, max(0.0, end - time.time())))

    def restart(self, k, clock_offset=None):
        try:
            self.c.start(k, clock_offset=clock_offset, timeout=90)
        except (RuntimeError, TimeoutError) as e:
            self.log(f"node{k} did not start: {e}")
            self.start_failures.append((k, str(e)[-500:]))

    KINDS = ["kill9", "kill_node", "stop", "stop_node", "cut", "cut_in", "cut_out", "delay",
             "restart_pg", "kill_pg", "skew_ahead", "skew_behind", "skew_alone"]

    def deal(self):
        """The next fault kind: from a shuffled deck of every kind, dealt to
        the end before a new one (skew_alone only with 120 s of load left)."""
        for _ in range(2 * len(self.kinds)):
            if not self.deck:
                self.deck = list(self.kinds)
                self.rng.shuffle(self.deck)
            kind = self.deck.pop()
            if kind != "skew_alone" or self.t_end - time.time() >= 120:
                return kind
        return self.kinds[0] if self.kinds != ["skew_alone"] else "skew_ahead"

    def fault(self):
        c, rng = self.c, self.rng
        kind = self.deal()
        self.counts[kind] = self.counts.get(kind, 0) + 1
        k = self.pick()
        if kind == "kill9":
            self.log(f"kill -9 kairosd of node{k}")
            c.kill9(k)
            self.hold(rng.uniform(1, 5))
            self.restart(k, c.nodes[k].clock_offset)
        elif kind == "kill_node":
            self.log(f"kill node{k}")
            c.kill_node(k)
            self.hold(rng.uniform(1, 5))
            self.restart(k, c.nodes[k].clock_offset)
        elif kind in ("stop", "stop_node"):
            secs = rng.uniform(1, 60)
            self.log(f"SIGSTOP {'node' if kind == 'stop_node' else 'kairosd of node'}{k} "
                     f"for {secs:.1f} s")
            with self.lock:
                self.stopped.add(k)
            (c.stop_node if kind == "stop_node" else c.stop)(k)
            self.hold(secs)
            (c.cont_node if kind == "stop_node" else c.cont)(k)
            with self.lock:
                self.stopped.discard(k)
        elif kind in ("cut", "cut_in", "cut_out"):
            secs = rng.uniform(5, 60)
            how = rng.choice(["down", "loss"]) if kind == "cut" else kind[4:]
            self.log(f"cut node{k} ({how}) for {secs:.1f} s")
            c.event(f"cut {how}", k)
            t0 = time.time()
            c.bed.cut(k, how=how)
            self.hold(secs)
            c.bed.heal(k)
            c.event("heal", k)
            self.outages.append((t0, time.time(), f"cut {how} node{k} at {t0:.1f}"))
        elif kind == "delay":
            secs = rng.uniform(5, 30)
            ms = int(rng.uniform(100, 300))
            jitter = int(ms * rng.uniform(0.2, 0.5))
            self.log(f"delay {ms}±{jitter} ms on node{k} for {secs:.1f} s")
            c.event(f"delay {ms}ms jitter {jitter}ms", k)
            c.bed.delay(k, ms=ms, jitter_ms=jitter)
            self.hold(secs)
            c.bed.heal(k)
            c.event("heal", k)
        elif kind == "restart_pg":
            self.log("restart PostgreSQL")
            c.event("restart pg")
            t0 = time.time()
            c.bed.restart_pg()
            self.outages.append((t0, time.time(), f"restart pg at {t0:.1f}"))
        elif kind == "kill_pg":
            down = rng.uniform(0.5, max(0.5, min(5.0, 0.45 * self.lease)))
            self.log(f"kill -9 PostgreSQL, started again {down:.1f} s later")
            c.event("kill pg")
            t0 = time.time()
            c.bed.kill_pg()
            time.sleep(max(0.0, t0 + down - time.time()))
            c.bed.start_pg()
            c.event("start pg")
            self.outages.append((t0, time.time(), f"kill pg at {t0:.1f}"))
        elif kind in ("skew_ahead", "skew_behind"):
            off = 5 if kind == "skew_ahead" else -5
            self.log(f"restart node{k} with its clock {off:+d} s")
            c.term(k)
            self.restart(k, clock_offset=off)
        elif kind == "skew_alone":
            off = self.alone_sign
            self.alone_sign = -off
            self.log(f"restart node{k} with its clock {off:+d} s, the others killed")
            c.term(k)
            self.restart(k, clock_offset=off)
            others = [j for j in c.nodes if j != k]
            self.alone_now = True
            t0 = time.time()
            for j in others:
                if c.alive(j):
                    c.kill_node(j)
            # a minute boundary with the skewed node alone, and its claim
            until = (int(time.time()) // 60 + 1) * 60 + 15
            self.log(f"node{k} alone until {cb.utc(until)}")
            while time.time() < until:
                time.sleep(0.5)
            self.alone.append((t0, time.time(), k))
            self.alone_now = False
            for j in others:
                self.restart(j, c.nodes[j].clock_offset)

    def run(self):
        c = self.c
        self.start_failures = []
        self.burst_ticks = set()
        c.start_all()
        self.t_start = time.time()
        c.event("load start")
        self.t_end = self.t_start + self.seconds
        ths = [threading.Thread(target=self.loader, args=(random.Random(self.rng.random()),),
                                daemon=True),
               threading.Thread(target=self.burster, args=(random.Random(self.rng.random()),),
                                daemon=True)]
        for th in ths:
            th.start()
        while True:
            gap = self.rng.uniform(10, 30)
            if time.time() + gap >= self.t_end:
                break
            time.sleep(gap)
            self.fault()
            # a node whose restart failed: try again now
            for k in c.nodes:
                if not c.alive(k):
                    self.restart(k, c.nodes[k].clock_offset)
        while time.time() < self.t_end:
            time.sleep(0.5)
        self.t_end = time.time()
        c.event("load end")
        self.quit.set()
        for th in ths:
            th.join(60)

    def settle(self, deadline):
        """Heal everything, every node up (clocks right), until every
        mandate of the run has ended or paused."""
        c = self.c
        c.bed.heal()
        for k in c.nodes:
            if c.alive(k):
                c.bed.cont_node(k)
        for k in c.nodes:
            if c.nodes[k].clock_offset:
                c.term(k)
            if not c.alive(k):
                self.restart(k)
        end = time.time() + deadline
        while True:
            pending = self.unsettled()
            if not pending or time.time() > end:
                return pending
            time.sleep(1)

    def outcome(self, mid, m):
        """(status, reason) of a mandate: the database for ended ones, the
        holder's kairosctl show for the others."""
        if m["status"] == "succeeded":
            return m["status"], None
        # running, or paused (released by its node): any node shows it
        ks = [int(m["owner"][4:])] if m["owner"].startswith("node") else []
        for k in ks + [k for k in self.c.nodes if k not in ks]:
            if not self.c.alive(k):
                continue
            r = self.c.ctl(k, "--json", "show", mid, timeout=30)
            if r.returncode == 0:
                s = cb.json.loads(r.stdout)
                why = s.get("reason")
                if s.get("status") in ("failed", "abandoned"):
                    # the failed step's error says more than "step_failed"
                    errs = [st.get("error") or st.get("reason") for p in s.get("plans", [])
                            for st in p.get("steps", []) if st.get("status") == "failed"]
                    why = f"{why}: {errs[-1]}" if errs and errs[-1] else why
                return s.get("status"), why
        return (m["status"] if m["status"] != "running" else "unknown"), None

    def unsettled(self):
        out = {}
        for mid, m in self.c.mandates().items():
            if m["schedule"] != BURST and (m["fired_at"] is None or m["fired_at"] > self.t_end):
                continue
            st, why = self.outcome(mid, m)
            if st not in ("succeeded", "failed", "abandoned") and not (
                    st or "").startswith("paused"):
                out[mid] = st
        return out


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        self_test()
        return 0
    self_test()
    kinds = [x for x in os.environ.get("KAIROS_NEMESIS_KINDS", "").split(",") if x] \
        or list(Campaign.KINDS)
    unknown = set(kinds) - set(Campaign.KINDS)
    if unknown:
        print(f"KAIROS_NEMESIS_KINDS: unknown fault kind(s) {sorted(unknown)}; "
              f"known: {','.join(Campaign.KINDS)}")
        return 2
    why = skip_reason()
    if why:
        print(f"SKIP: {why}")
        return SKIP
    seed = int(os.environ.get("KAIROS_NEMESIS_SEED") or random.SystemRandom().randrange(1 << 32))
    seconds = float(os.environ.get("KAIROS_NEMESIS_SECONDS") or 100)
    lease = int(os.environ.get("KAIROS_NEMESIS_LEASE") or 4)
    print(f"nemesis: seed {seed}, {seconds:.0f} s, LeaseSec={lease} "
          f"(KAIROS_NEMESIS_SEED={seed} repeats the faults)", flush=True)
    rng = random.Random(seed)
    scheds = {s: cb.schedule() for s in SCHEDULES}
    # the burst ticks run side by side (the per-minute schedules keep the
    # default Concurrency=queue: a late tick waits for its sibling)
    scheds[BURST] = cb.schedule(cron="0 0 1 1 *", concurrency="allow")
    with cb.Cluster(nodes=3, schedules=scheds, lease_sec=lease) as c:
        camp = Campaign(c, rng, seconds, lease)
        camp.kinds = kinds
        camp.alone_sign = 5 if seed % 2 == 0 else -5
        camp.run()
        load = os.getloadavg()
        camp.log("quiet period")
        pending = camp.settle(deadline=max(90, 8 * lease))
        mandates = c.mandates()
        outcomes = {mid: camp.outcome(mid, m) for mid, m in mandates.items()}
        wal = c.wal_rows()
        claimed_by = {(r[0], int(r[1])): r[3] for r in c.ticks()}
        effects = cb.log_lines(c.effects)
        c.terminate_all()

        problems = []
        if pending:
            problems.append(f"{len(pending)} mandate(s) neither ended nor paused after the "
                            f"quiet period: {sorted(pending.items())[:10]}")
        exp = expected_ticks(SCHEDULES, camp.t_start, camp.t_end) | camp.burst_ticks
        for b in check_ticks(exp, mandates):
            problems.append(f"tick {b[1]} at {b[2]}: {b[0]} {b[3]}")
        twice, unknown = check_effects(effects, mandates)
        for (mid, step), xs in sorted(twice.items()):
            problems.append(f"effect twice: {mid} {step}: " + "; ".join(
                f"{x['node']} epoch {x['epoch']} attempt {x['attempt']} at {x['t']:.1f}"
                for x in xs))
        if unknown:
            problems.append(f"effects of mandates the database does not hold: {unknown}")
        by_status = {}
        for mid, (st, why) in outcomes.items():
            label = str(st) + (f" ({str(why)[:60]})" if why and st != "succeeded" else "")
            by_status[label] = by_status.get(label, 0) + 1
            if mandates[mid]["schedule"] != BURST and mandates[mid]["fired_at"] is not None \
                    and mandates[mid]["fired_at"] > camp.t_end:
                continue
            if st in ("failed", "abandoned", "unknown") or (
                    st and st.startswith("paused") and not why):
                problems.append(f"lost mandate {mid}: {st} {str(why or '(no reason)')[:300]}")
        # lost acknowledged fires: a mandate a fire answered with, unknown
        # to the database or not ended well (done, or paused with a reason)
        lost_acked = sorted(mid for mid in camp.acked if mid not in outcomes or (
            outcomes[mid][0] in ("failed", "abandoned", "unknown")) or (
            (outcomes[mid][0] or "").startswith("paused") and not outcomes[mid][1]))
        for mid in lost_acked:
            problems.append(f"lost acknowledged fire: {mid} {outcomes.get(mid)}")
        problems += pg_checks.check(c.bed, "kairos", daemon=True)
        problems += [f"sanitizer: {line}" for line in c.sanitizer_reports()[:20]]
        to_owner, to_step, behind = failover_times(
            c.events, wal, {mid: m["schedule"] for mid, m in mandates.items()}, set(SCHEDULES))
        # ticks lost to skew
        intervals = skew_intervals(c.events, camp.t_end)
        skewed, skew_bad = ticks_lost_to_skew(
            expected_ticks(SCHEDULES, camp.t_start, camp.t_end), mandates, intervals,
            camp.alone, claimed_by)
        alone_ticks = [t for t in skewed if any(a <= t[1] < b for (a, b, _) in camp.alone)]
        for b in skew_bad:
            problems.append(f"tick lost to skew: {b[1]} at {cb.utc(b[2])}: {b[0]}")
        # mandates failed by a database outage shorter than the lease
        short = [o for o in camp.outages if o[1] - o[0] < lease]
        by_outage, failed_records = failed_in_outages(wal, camp.outages, lease)
        for mid, what in sorted(by_outage.items()):
            problems.append(f"mandate {mid} failed by a database outage shorter than the "
                            f"lease: {what}")
        rev_outage, review_records = failed_in_outages(wal, camp.outages, lease, "needs_review")
        for mid, what in sorted(rev_outage.items()):
            problems.append(f"mandate {mid} paused for review by a database outage shorter "
                            f"than the lease: {what}")
        # the failover after a node's death
        deaths = [x for x in to_owner if x[2].startswith("kill")]
        if deaths and pct([x[0] for x in deaths], 99) > lease + 3:
            problems.append(f"failover after a node's death: p99 "
                            f"{pct([x[0] for x in deaths], 99):.1f} s > LeaseSec + 3 s")

        print("---- nemesis report")
        print(f"seed {seed}; {camp.t_end - camp.t_start:.0f} s of load; LeaseSec={lease}; "
              f"load average at the end of the load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        print(f"faults: {dict(sorted(camp.counts.items()))}")
        print(f"node start failures: {len(camp.start_failures)}")
        print(f"fires on every node at once: {camp.fires} (errors: {camp.fire_errors[:5]})")
        print(f"mandates: {len(mandates)}; expected ticks: {len(exp)}; outcomes: "
              f"{dict(sorted(by_status.items()))}")
        print(f"effects: {sum(1 for x in effects if x['kind'] == 'effect')} lines, "
              f"{len(twice)} (mandate, step) twice")
        doubles = sum(1 for b in check_ticks(exp, mandates) if b[0] == "double")
        print(f"double fires: {doubles}; lost acknowledged fires: {len(lost_acked)} of "
              f"{len(camp.acked)} mandates acknowledged by a fire")
        takeovers = sum(1 for r in wal if r[4].get("op") == "owner")
        print(f"takeovers (owner records): {takeovers}")
        print(f"ticks lost to skew: {len(skew_bad)} of {len(skewed)} ticks of minutes a node "
              f"ran skewed ({len(intervals)} stretches, "
              f"{sum(1 for i in intervals if i[3] > 0)} ahead, "
              f"{sum(1 for i in intervals if i[3] < 0)} behind, "
              f"{sum(i[1] - i[0] for i in intervals):.0f} s); "
              f"{len(alone_ticks)} ticks with a skewed node alone "
              f"({len(camp.alone)} stretches, {sum(b - a for a, b, _ in camp.alone):.0f} s)")
        print(f"mandates failed by a database outage shorter than the lease: {len(by_outage)} "
              f"({len(short)} such outages: "
              f"{sum(1 for o in short if o[2].startswith('kill pg'))} kill_pg, "
              f"{sum(1 for o in short if o[2].startswith('restart pg'))} restart_pg, "
              f"{sum(1 for o in short if o[2].startswith('cut'))} cuts; "
              f"records `failed` in all: {failed_records}); paused for review by one: "
              f"{len(rev_outage)} (records `needs_review` in all: {review_records})")
        for name, samples in (("owner's death (kill9, kill_node) -> owner record elsewhere",
                               deaths),
                              ("any fault -> owner record elsewhere", to_owner),
                              ("owner's death -> next step started elsewhere", to_step),
                              ("owner's death -> next step started elsewhere, after waiting "
                               "for a sibling (Concurrency=queue)", behind)):
            xs = [x[0] for x in samples]
            if xs:
                print(f"failover, {name}: n={len(xs)} p50 {statistics.median(xs):.1f} s, "
                      f"p99 {pct(xs, 99):.1f} s, max {max(xs):.1f} s")
                for d, mid, fault in sorted(samples, reverse=True)[:3]:
                    print(f"    {d:.1f} s: {mid} after {fault}")
            else:
                print(f"failover, {name}: none measured")
        print(f"problems: {len(problems)}")
        for p in problems:
            print("  " + p)
        if problems:
            for k in c.nodes:
                tail = "\n".join(line for line in c.log(k).splitlines()
                                 if "<3>" in line or "<4>" in line or "====" in line)
                sys.stderr.write(f"---- node{k}: warnings and errors\n{tail[-6000:]}\n")
        return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
