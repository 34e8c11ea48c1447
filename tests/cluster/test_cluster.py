#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Cluster mode end to end, short: three real kairosd, each in its own
network namespace, on one PostgreSQL in another (cluster_bed.py, netns.py),
LeaseSec=4.

(a) the same tick fired on every node at once: one mandate in the
    database; one node answers fired:true, the others fired:false naming
    the winner; the act's effect happened once;
(b) kill -9 of the owner's kairosd after the act's tool call finished:
    another node takes the mandate over (an owner record at epoch 2) within
    1.5 LeaseSec + LeaseSec/3 + slack, runs the act again, the call is
    replayed (no second effect), the mandate ends done;
    kill -9 inside the tool call: taken over the same way, the step waits
    for review (tool_call_interrupted) with the call as evidence, no second
    effect;
(c) SIGSTOP of the owner's kairosd alone while its act's tool runs: the
    deadman kills the handler at the lease deadline (the tool's beats in
    the effects log stop), another node takes over; after SIGCONT the old
    node appends nothing (no row at epoch 1 after the takeover) and the
    rows keep every invariant (pg_checks.py);
(d) list and show of a mandate from a node that does not hold it;
(e) tool calls of mandates fired after a restart of PostgreSQL (-m
    immediate) go through: their mandates end done, one effect each;
(f) a whole node stopped a little longer than LeaseSec: the takeover comes
    within the same bound as after a death;
(g) a burst of mandates running side by side on one node (Concurrency=allow,
    tool calls) uses at most 5 connections of that node (the pool's 4 and
    the heartbeat's), and every mandate ends done with one effect.

Skipped (77) without root, network namespaces, PostgreSQL's server
binaries, or a kairosd built without -Dpostgres=enabled.  Well under two
minutes.
"""
import os
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_bed as cb  # noqa: E402
import netns  # noqa: E402
import pg_checks  # noqa: E402

SKIP = 77
LEASE = 4
# a dead owner's mandate is taken 1.5 LeaseSec after its last renewal at the
# latest, plus up to LeaseSec/3 until a heartbeat comes round; slack for a
# loaded CI machine
TAKEOVER = 1.5 * LEASE + LEASE / 3 + 3
C = None


def skip_reason():
    why = netns.skip_reason()
    if why:
        return why
    r = subprocess.run([cb.KAIROSD, "--init-db", "host=/nonexistent dbname=x"],
                       capture_output=True, text=True, timeout=30)
    if "without PostgreSQL" in r.stderr + r.stdout or "-Dpostgres" in r.stderr + r.stdout:
        return "kairosd built without PostgreSQL support (-Dpostgres=enabled)"
    return None


def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out ({timeout:.0f} s) waiting for {what}")
        time.sleep(0.1)


def lines(mandate, kind=None):
    return [x for x in cb.log_lines(C.effects)
            if x["mandate"] == mandate and (kind is None or x["kind"] == kind)]


def owner_rows(mandate):
    return [(seq, epoch, t, rec) for (_, seq, epoch, t, rec) in C.wal_rows(mandate)
            if rec.get("op") == "owner"]


class Tick:
    base = (int(time.time()) // 60 - 10) * 60
    n = 0

    @classmethod
    def next(cls):
        """A distinct tick in the past for each fire (never fires by itself)."""
        cls.n += 1
        return cb.utc(cls.base - 60 * cls.n)


class ClusterTest(unittest.TestCase):
    def ensure_up(self):
        for k in C.nodes:
            if not C.alive(k):
                C.start(k)

    def fire(self, k, sched):
        at = Tick.next()
        r = C.ctl_json(k, "fire", sched, "--at", at)
        self.assertTrue(r.get("fired"), r)
        return r["mandate"], at

    def status(self, k, mandate):
        return C.ctl_json(k, "show", mandate)

    def test_a_same_tick_on_every_node(self):
        self.ensure_up()
        at = Tick.next()
        procs = {k: C.fire_async(k, "quick", at) for k in C.nodes}
        replies = {}
        for k, p in procs.items():
            out, err = p.communicate(timeout=60)
            self.assertEqual(p.returncode, 0, f"node{k}: {out}{err}")
            replies[k] = cb.json.loads(out)
        won = [k for k, r in replies.items() if r.get("fired")]
        self.assertEqual(len(won), 1, replies)
        mid = replies[won[0]]["mandate"]
        for k, r in replies.items():
            self.assertEqual(r["mandate"], mid, replies)
            if k != won[0]:
                self.assertIs(r.get("fired"), False, replies)
                self.assertEqual(r.get("node"), f"node{won[0]}", replies)
        rows = C.sql(f"SELECT mandate_id, claimed_by FROM kairos_tick WHERE schedule = 'quick' "
                     f"AND fired_at = '{at}'")
        self.assertEqual(rows, [[mid, f"node{won[0]}"]])
        wait_for(lambda: C.mandates()[mid]["status"] != "running", 60, "the mandate's end")
        self.assertEqual(C.mandates()[mid]["status"], "succeeded")
        self.assertEqual(len(lines(mid, "effect")), 1, lines(mid))
        self.assertEqual({x["node"] for x in lines(mid)}, {f"node{won[0]}"}, lines(mid))

    def takeover(self, mid, old, t_kill):
        """Wait for the owner record that took mid from old; (node, delay)."""
        # (the old node itself, once back, may be the one that takes it)
        rows = wait_for(lambda: [r for r in owner_rows(mid) if r[3].get("prev_owner") == old],
                        TAKEOVER + 5, f"a takeover of {mid}")
        seq, epoch, t, rec = rows[0]
        self.assertEqual(epoch, 2, rows)
        self.assertEqual(rec.get("epoch"), 2, rows)
        self.assertEqual(rec.get("prev_owner"), old, rows)
        delay = t - t_kill
        self.assertLess(delay, TAKEOVER, f"takeover {delay:.1f} s after the owner's death")
        return rec["node"], delay

    def test_b1_kill9_after_the_tool_call(self):
        self.ensure_up()
        mid, _ = self.fire(1, "slow")
        wait_for(lambda: lines(mid, "tooldone"), 30, "the act's tool call to finish")
        t_kill = time.time()
        C.kill9(1)
        node, delay = self.takeover(mid, "node1", t_kill)
        print(f"b1: taken over by {node} {delay:.1f} s after kill -9", file=sys.stderr)
        wait_for(lambda: C.mandates()[mid]["status"] != "running", 60, "the mandate's end")
        st = C.mandates()[mid]
        self.assertEqual(st["status"], "succeeded",
                         C.ctl(int(st["owner"][4:]), "--json", "show", mid).stdout)
        self.assertEqual(len(lines(mid, "effect")), 1, lines(mid))
        # the act ran again on the new owner (replayed its call)
        self.assertTrue([x for x in lines(mid, "start") if x["step"] == "act_001"
                         and x["node"] == node], lines(mid))
        self.assertEqual(pg_checks.check(C.bed, "kairos", daemon=True), [])

    def test_b2_kill9_inside_the_tool_call(self):
        self.ensure_up()
        mid, _ = self.fire(2, "slow")
        wait_for(lambda: lines(mid, "effect"), 30, "the act's tool call to start")
        t_kill = time.time()
        C.kill9(2)
        node, delay = self.takeover(mid, "node2", t_kill)
        print(f"b2: taken over by {node} {delay:.1f} s after kill -9", file=sys.stderr)
        k = int(node[4:])
        shown = wait_for(lambda: (lambda s: s if s.get("status") != "running" else None)(
            self.status(k, mid)), 30, "a decision")
        self.assertEqual(shown.get("status"), "paused_review", shown)
        self.assertIn("tool_call_interrupted", cb.json.dumps(shown), shown)
        self.assertEqual(len(lines(mid, "effect")), 1, lines(mid))
        self.assertEqual(pg_checks.check(C.bed, "kairos", daemon=True), [])

    def test_c_sigstop_owner_deadman_and_fence(self):
        self.ensure_up()
        mid, _ = self.fire(3, "beat")
        wait_for(lambda: lines(mid, "beat"), 30, "the act's tool to beat")
        t_stop = time.time()
        C.stop(3)
        try:
            node, delay = self.takeover(mid, "node3", t_stop)
            print(f"c: taken over by {node} {delay:.1f} s after SIGSTOP", file=sys.stderr)
            beats = [x["t"] for x in lines(mid, "beat") if x["epoch"] == "1"]
            # the deadman's deadline: at most LeaseSec after the last renewal
            self.assertLess(max(beats), t_stop + LEASE + 0.5,
                            f"the handler beat {max(beats) - t_stop:.1f} s after SIGSTOP")
            rows_before = C.wal_rows(mid)
        finally:
            C.cont(3)
        # the old node wakes up: its handler is dead, its barrier is fenced;
        # wait until it has dropped the mandate (its log says so)
        wait_for(lambda: mid in C.log(3) and ("fenced" in C.log(3) or "lost" in C.log(3)
                                             or "no longer" in C.log(3)),
                 3 * LEASE, "node3 to let go")
        rows = C.wal_rows(mid)
        first_new = min(seq for (_, seq, epoch, _, _) in rows if epoch >= 2)
        late = [(seq, epoch, rec) for (_, seq, epoch, _, rec) in rows
                if epoch == 1 and seq > first_new]
        self.assertEqual(late, [], "rows at the old epoch after the takeover")
        self.assertGreaterEqual(len(rows), len(rows_before))
        self.assertFalse([x for x in lines(mid) if x["node"] == "node3" and x["t"] > t_stop
                          + LEASE + 0.5 and x["kind"] in ("beat", "effect", "start")],
                         "node3's handler acted after its deadline")
        self.assertEqual(len(lines(mid, "effect")), 1, lines(mid))
        self.assertEqual(pg_checks.check(C.bed, "kairos", daemon=True), [])
        self.__class__.paused_elsewhere = (mid, node)

    def test_e_tool_calls_after_a_postgresql_restart(self):
        """A restart of PostgreSQL between mandates costs the nodes their
        connections, not their tool calls: the acts of mandates fired after
        it make their calls and end done."""
        self.ensure_up()
        before = [self.fire(1, "quick")[0] for _ in range(4)]
        for mid in before:
            wait_for(lambda: C.mandates()[mid]["status"] != "running", 60, f"{mid}'s end")
        C.bed.restart_pg()
        after = []
        for _ in range(4):
            at = Tick.next()

            def fired(at=at):
                # until the node renews its lease again it claims no tick
                r = C.ctl(1, "--json", "fire", "quick", "--at", at)
                if r.returncode != 0 and "cannot renew its lease" in r.stdout:
                    return None
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                return cb.json.loads(r.stdout)
            r = wait_for(fired, 3 * LEASE, "node1 to claim a tick again")
            self.assertTrue(r.get("fired"), r)
            after.append(r["mandate"])
        for mid in after:
            wait_for(lambda: C.mandates()[mid]["status"] != "running", 60, f"{mid}'s end")
        ms = C.mandates()
        bad = {mid: ms[mid]["status"] for mid in before + after
               if ms[mid]["status"] != "succeeded"}
        self.assertEqual(bad, {}, "\n".join(line for line in C.log(1).splitlines()
                                             if any(m in line for m in bad))[-3000:])
        for mid in before + after:
            self.assertEqual(len(lines(mid, "effect")), 1, lines(mid))

    def test_f_short_stop_of_a_whole_node(self):
        """A node stopped (all of it) a little longer than its lease, woken
        before another node took its mandate: it must not hold the mandate
        up (renew it, then let it go without releasing it): the takeover
        comes as after a longer stop."""
        self.ensure_up()
        mid, _ = self.fire(2, "hold")
        wait_for(lambda: lines(mid, "effect"), 30, "the act to run")
        t_stop = time.time()
        C.stop_node(2)
        try:
            time.sleep(LEASE + 1.5)   # the fault itself: stopped this long
        finally:
            C.cont_node(2)
        node, delay = self.takeover(mid, "node2", t_stop)
        print(f"f: taken over by {node} {delay:.1f} s after SIGSTOP of the node", file=sys.stderr)
        self.assertEqual(len(lines(mid, "effect")), 1, lines(mid))

    def test_d_list_show_from_a_non_owner(self):
        self.ensure_up()
        mid, _ = self.fire(1, "hold")
        wait_for(lambda: lines(mid, "effect"), 30, "the act to run")
        for k in (2, 3):
            r = C.ctl(k, "--json", "show", mid)
            self.assertEqual(r.returncode, 0, f"show on node{k}: {r.stdout}{r.stderr}")
            shown = cb.json.loads(r.stdout)
            self.assertEqual(shown.get("id", shown.get("mandate")), mid, shown)
            self.assertEqual(shown.get("status"), "running", shown)
            listed = C.ctl_json(k, "list")
            self.assertIn(mid, [x.get("id") for x in listed["mandates"]],
                          f"node{k}'s list: {listed}")

    def test_g_a_burst_shares_few_connections(self):
        self.ensure_up()
        q = ("SELECT count(*) FROM pg_stat_activity WHERE client_addr = "
             f"'{netns.node_addr(1)}'")
        mids = [self.fire(1, "burst")[0] for _ in range(12)]
        peak = 0

        def done():
            nonlocal peak
            peak = max(peak, int(C.sql(q)[0][0]))
            st = C.mandates()
            return all(st.get(m, {}).get("status") == "succeeded" for m in mids)
        wait_for(done, 90, "the burst to end")
        peak = max(peak, int(C.sql(q)[0][0]))
        self.assertLessEqual(peak, 5, "node1's connections to PostgreSQL")
        for m in mids:
            self.assertEqual(len(lines(m, "effect")), 1, f"{m}'s effects")


def main():
    global C
    why = skip_reason()
    if why:
        print(f"SKIP: {why}")
        return SKIP
    # Concurrency=allow: the tests' mandates of one schedule run side by side
    # on several nodes (queue holds across the cluster: test_cluster_concurrency)
    scheds = {
        "quick": cb.schedule(cron="0 0 1 1 *", min_ms=200, max_ms=600, concurrency="allow"),
        "slow": cb.schedule(cron="0 0 1 1 *", min_ms=3000, max_ms=3000, observe=False,
                            concurrency="allow"),
        "beat": cb.schedule(cron="0 0 1 1 *", min_ms=20000, max_ms=20000, beat=True,
                            observe=False, concurrency="allow"),
        "hold": cb.schedule(cron="0 0 1 1 *", min_ms=30000, max_ms=30000, observe=False,
                            concurrency="allow"),
        "burst": cb.schedule(cron="0 0 1 1 *", min_ms=1000, max_ms=1500, concurrency="allow"),
    }
    with cb.Cluster(nodes=3, schedules=scheds, lease_sec=LEASE) as c:
        C = c
        c.start_all()
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(ClusterTest)
        res = unittest.TextTestRunner(verbosity=2).run(suite)
        c.terminate_all()
        san = c.sanitizer_reports()
        if san:
            print("sanitizer reports:\n" + "\n".join(san[:20]))
            return 1
        if not res.wasSuccessful():
            for k in c.nodes:
                sys.stderr.write(f"---- node{k} log (tail)\n{c.log(k)[-4000:]}\n")
            sys.stderr.write("---- effects log\n" + open(c.effects).read()[-4000:])
        return 0 if res.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
