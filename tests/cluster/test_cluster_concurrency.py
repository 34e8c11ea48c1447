#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A schedule's Concurrency= across the cluster: two kairosd nodes on one
host sharing a private PostgreSQL (pg_fixture.py).

- queue (the default): tick 1 fired on n1, tick 2 on n2 while tick 1 runs:
  tick 2 waits (shown as runnable by both nodes, and in the database) and
  its first step starts only after tick 1 ended, by the database's clock.
- queue, the holder's node killed (kill -9): the other node takes the
  mandate over and keeps its schedule's slot; the mandate waiting there
  starts only once the adopted one ended.
- reject: tick 2 fired on n2 while tick 1 runs on n1 is rejected, naming
  the busy mandate, on whichever node fires it; once tick 1 ended the next
  tick runs.
- allow: both run at once.
- kairosctl retry of one tick, four clients on each node at once: one retry
  is made (compare-and-set in the database), the others are refused naming
  it, its act runs once; the done tick then needs --reason on either node.
- kairosctl retry --from: made on either node (the steps of a mandate
  the node does not hold are read from the database; its carried steps
  are rows in the database too).

Environment: KAIROSD, KAIROSCTL, KAIROS_PGSTORE_TEST (empty when built
without -Dpostgres=enabled).  Exit 77 (skipped, with the reason) without
PostgreSQL support or the PostgreSQL server binaries.  No sleeps as
synchronization: polls with a deadline."""
import json
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import pg_node  # noqa: E402

PG = None
LEASE = 3

# Every step logs its start and end; it runs until the test creates
# $OUT/go-<mandate>.
STEP = r"""#!/bin/sh
cat >/dev/null
log() {
        printf '%s %s %s %s %s\n' "$1" "$KAIROS_MANDATE_ID" "$KAIROS_STEP_ID" \
                "${KAIROS_NODE:-}" "$(date +%s.%N)" >> "$OUT/log"
}
log start
while [ ! -e "$OUT/go-$KAIROS_MANDATE_ID" ]; do sleep 0.05; done
log end
echo '{"ok":true}'
"""
QUICK = "#!/bin/sh\ncat >/dev/null\necho '{\"ok\":true}'\n"


wait_for = pg_node.wait_for


class Node(pg_node.Node):
    def __init__(self, test, name):
        self.test = test
        step = os.path.join(test.dir, "step.sh")
        quick = os.path.join(test.dir, "quick.sh")
        env = "OUT=%s" % test.out
        scheds = {
            # queue by default; the act waits for the test
            "q": {"Schedule": {"Cron": "0 0 1 1 *"},
                  "Exec": {"Act": step, "Environment": env}},
            # queue; the observe step waits for the test
            "qg": {"Schedule": {"Cron": "0 0 1 1 *"},
                   "Exec": {"Observe": step, "Act": quick, "Environment": env}},
            "r": {"Schedule": {"Cron": "0 0 1 1 *", "Concurrency": "reject"},
                  "Exec": {"Observe": step, "Act": quick, "Environment": env}},
            "a": {"Schedule": {"Cron": "0 0 1 1 *", "Concurrency": "allow"},
                  "Exec": {"Observe": step, "Act": quick, "Environment": env}},
            # allow; the act waits for the test (kairosctl retry)
            "rt": {"Schedule": {"Cron": "0 0 1 1 *", "Concurrency": "allow"},
                   "Mandate": {"MaxCycles": "1"}, "Exec": {"Act": step, "Environment": env}},
        }
        super().__init__(test.dir, name, test.ci, scheds, LEASE)

    def status_of(self, mid):
        return {k: r["status"] for k, r in self.rows().items()}.get(mid)


class ClusterConcurrency(pg_node.TwoNodes):
    prefix = "clconc"
    DEBUG = "CLCONC_DEBUG"

    def make_node(self, name):
        for script, text in (("step.sh", STEP), ("quick.sh", QUICK)):
            path = os.path.join(self.dir, script)
            if not os.path.exists(path):
                with open(path, "w") as f:
                    f.write(text)
                os.chmod(path, 0o755)
        return Node(self, name)

    def db_status(self, mid):
        return self.db_row(mid)

    def first_executing(self, mid):
        """The database's time of the mandate's first executing record
        (seconds since the epoch), or None."""
        rows = self.sql("SELECT extract(epoch FROM min(written_at)) FROM kairos_wal WHERE "
                        "mandate_id = '%s' AND convert_from(line, 'UTF8') LIKE "
                        "'%%\"status\":\"executing\"%%'" % mid)
        return float(rows[0][0]) if rows and rows[0][0] else None

    def ended_at(self, mid):
        rows = self.sql("SELECT extract(epoch FROM ended_at) FROM kairos_mandate WHERE "
                        "mandate_id = '%s'" % mid)
        return float(rows[0][0]) if rows and rows[0][0] else None

    def log(self):
        try:
            with open(os.path.join(self.out, "log")) as f:
                return [line.split() for line in f]
        except FileNotFoundError:
            return []

    def started(self, mid, node=None):
        return [e for e in self.log() if e[0] == "start" and e[1] == mid and
                (node is None or e[3] == node)]

    def go(self, mid):
        open(os.path.join(self.out, "go-" + mid), "w").close()

    def fire(self, node, sched, at):
        rc, out, err = node.ctl("fire", sched, "--at", at)
        self.assertEqual(rc, 0, err)
        self.assertTrue(out.get("fired", True), out)
        return out["mandate"]

    def test_queue_waits_for_the_other_node(self):
        n1, n2 = self.n1, self.n2
        m1 = self.fire(n1, "q", "2026-03-01T00:00:00Z")
        wait_for(lambda: self.started(m1), "m1's act on n1")
        m2 = self.fire(n2, "q", "2026-03-01T00:01:00Z")
        # m2 waits for m1, which still runs on n1: queued on both nodes
        wait_for(lambda: self.sql("SELECT 1 FROM kairos_mandate WHERE mandate_id = '%s' AND "
                                  "slot_wait_since IS NOT NULL" % m2), "m2 waiting in line")
        self.assertEqual(self.db_status(m1), ("running", "n1", "1"))
        self.assertIsNone(self.first_executing(m2), "m2 started while m1 runs")
        self.assertEqual(n2.status_of(m2), "runnable")
        self.assertEqual(n1.status_of(m2), "runnable")
        rc, s, err = n1.ctl("show", m2)
        self.assertEqual(rc, 0, err)
        self.assertEqual(s["status"], "runnable", s)
        rc, st, err = n2.ctl("status")
        self.assertEqual(rc, 0, err)
        self.assertEqual(st["by_status"].get("runnable"), 1, st)
        self.assertEqual(st["by_status"].get("running", 0), 0, st)
        # still so a while later, n2 having asked again (every second): an
        # absence, so a time span, not a synchronization
        time.sleep(2.5)
        self.assertIsNone(self.first_executing(m2), "m2 started while m1 runs")
        self.assertEqual(self.started(m2), [])
        self.go(m2)
        self.go(m1)
        wait_for(lambda: self.db_status(m1) == ("succeeded", "n1", "1"), "m1 to end")
        wait_for(lambda: self.db_status(m2) == ("succeeded", "n2", "1"), "m2 to end", 90)
        # m2's first step began after m1 ended (the database's clock), and
        # its act after m1's act ended (the host's clock)
        self.assertGreaterEqual(self.first_executing(m2), self.ended_at(m1))
        end1 = [float(e[4]) for e in self.log() if e[0] == "end" and e[1] == m1]
        start2 = [float(e[4]) for e in self.log() if e[0] == "start" and e[1] == m2]
        self.assertEqual((len(end1), len(start2)), (1, 1), self.log())
        self.assertGreater(start2[0], end1[0], self.log())
        self.assertEqual(self.sql("SELECT count(*) FROM kairos_slot WHERE holder IS NOT NULL"),
                         [["0"]])

    def test_queue_slot_survives_a_takeover(self):
        n1, n2 = self.n1, self.n2
        m3 = self.fire(n1, "qg", "2026-03-02T00:00:00Z")
        wait_for(lambda: self.started(m3, "n1"), "m3's observe on n1")
        m4 = self.fire(n2, "qg", "2026-03-02T00:01:00Z")
        self.go(m4)   # (m4's own steps do not wait)
        wait_for(lambda: self.sql("SELECT 1 FROM kairos_mandate WHERE mandate_id = '%s' AND "
                                  "slot_wait_since IS NOT NULL" % m4), "m4 waiting in line")
        n1.close(graceful=False)   # kill -9 of the slot's holder
        # n2 takes m3 over (epoch 2) and runs its observe again, holding the slot
        wait_for(lambda: self.started(m3, "n2"), "m3's observe again on n2", 60)
        self.assertEqual(self.db_status(m3), ("running", "n2", "2"))
        self.assertEqual(self.sql("SELECT holder FROM kairos_slot WHERE schedule = 'qg'"),
                         [[m3]])
        self.assertIsNone(self.first_executing(m4), "m4 started while m3 runs")
        self.assertEqual(self.started(m4), [])
        self.assertEqual(n2.status_of(m4), "runnable")
        self.go(m3)
        wait_for(lambda: self.db_status(m3) == ("succeeded", "n2", "2"), "m3 to end on n2")
        wait_for(lambda: self.db_status(m4) == ("succeeded", "n2", "1"), "m4 to end", 90)
        self.assertGreaterEqual(self.first_executing(m4), self.ended_at(m3))

    def test_reject_on_any_node(self):
        n1, n2 = self.n1, self.n2
        m1 = self.fire(n1, "r", "2026-03-03T00:00:00Z")
        wait_for(lambda: self.started(m1), "m1's observe on n1")
        for n in (n2, n1):
            rc, out, err = n.ctl("fire", "r", "--at", "2026-03-03T00:01:00Z")
            self.assertNotEqual(rc, 0, out)
            self.assertIn("rejected", (err or "") + json.dumps(out), (rc, out, err))
            self.assertIn("mandate %s is still running" % m1, (err or "") + json.dumps(out))
        wait_for(lambda: "fire of r at 2026-03-03T00:01:00Z rejected: mandate %s is still "
                 "running" % m1 in n2.daemon.log(), "n2's log of the rejection")
        self.assertEqual(self.sql("SELECT count(*) FROM kairos_mandate WHERE schedule = 'r'"),
                         [["1"]])
        self.go(m1)
        wait_for(lambda: self.db_status(m1) == ("succeeded", "n1", "1"), "m1 to end")
        # the rejected tick stays rejected; the next one runs
        rc, out, err = n2.ctl("fire", "r", "--at", "2026-03-03T00:01:00Z")
        self.assertNotEqual(rc, 0, out)
        m3 = self.fire(n2, "r", "2026-03-03T00:02:00Z")
        self.go(m3)
        wait_for(lambda: self.db_status(m3) == ("succeeded", "n2", "1"), "m3 to end")

    def test_allow_runs_side_by_side(self):
        n1, n2 = self.n1, self.n2
        m1 = self.fire(n1, "a", "2026-03-04T00:00:00Z")
        m2 = self.fire(n2, "a", "2026-03-04T00:01:00Z")
        wait_for(lambda: self.started(m1, "n1") and self.started(m2, "n2"), "both observes")
        self.go(m1)
        self.go(m2)
        wait_for(lambda: self.db_status(m1) == ("succeeded", "n1", "1") and
                 self.db_status(m2) == ("succeeded", "n2", "1"), "both to end")


    def test_concurrent_retries_one_winner(self):
        """kairosctl retry of one tick on both nodes at once (of the tick's
        first mandate, a mandate n2 does not hold): one retry is made, the
        others are refused naming it, its act runs once."""
        n1, n2 = self.n1, self.n2
        at = "2026-03-05T00:00:00Z"
        m0 = self.fire(n1, "rt", at)
        self.go(m0)
        wait_for(lambda: self.db_status(m0) == ("succeeded", "n1", "1"), "m0 to end")
        barrier = threading.Barrier(8)
        results = []
        lock = threading.Lock()

        def one(node):
            barrier.wait()
            r = node.text("retry", m0, "--reason", "once more")
            with lock:
                results.append((node.name, r.returncode, r.stdout, r.stderr))

        threads = [threading.Thread(target=one, args=(n,)) for n in (n1, n2) * 4]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        if os.environ.get(self.DEBUG):
            print(results, file=sys.stderr)
        won = [r for r in results if r[1] == 0]
        self.assertEqual(len(won), 1, results)
        w = won[0][2].split(" retried as ")[1].split(" ")[0]
        for r in results:
            if r[1] != 0:
                self.assertEqual(r[1], 1, r)
                # the winner, or (on the node whose own attempt was still
                # in flight, and may have lost) that attempt, said as such
                self.assertTrue("has an unfinished retry: mandate %s is running" % w in r[3]
                                or "has a retry being made: mandate " in r[3], r)
        self.assertEqual(self.sql("SELECT mandate_id FROM kairos_mandate WHERE schedule = 'rt' "
                                  "AND retry IS NOT NULL"), [[w]])
        wait_for(lambda: self.started(w), "the retry's act")
        self.go(w)
        wait_for(lambda: self.db_status(w) is not None and self.db_status(w)[0] == "succeeded",
                 "the retry to end")
        # its act ran once, the first mandate's once: nothing else started
        self.assertEqual(sorted(e[1] for e in self.log() if e[0] == "start"), sorted([m0, w]))
        # a done tick needs --reason on any node
        for n in (n1, n2):
            r = n.text("retry", m0)
            self.assertEqual(r.returncode, 1, r)
            self.assertIn("ended done", r.stderr)

    def test_retry_from_a_step(self):
        """kairosctl retry --from on a node that does not hold the mandate:
        its steps are read from the database, the steps before act are
        carried (completed records with carried_from, in the database too)
        and the retry runs there; a step the mandate does not have is
        refused naming the field; another retry of the tick while that one
        is unfinished is refused on the holding node too."""
        n1, n2 = self.n1, self.n2
        m0 = self.fire(n1, "rt", "2026-03-06T00:00:00Z")
        self.go(m0)
        wait_for(lambda: self.db_status(m0) == ("succeeded", "n1", "1"), "m0 to end")
        r = n2.text("retry", m0, "--from", "nosuch", "--reason", "again")
        self.assertEqual(r.returncode, 1, r)
        self.assertIn("args.from", r.stderr)
        r = n2.text("retry", m0, "--from", "act", "--reason", "again")
        self.assertEqual(r.returncode, 0, r)
        w0 = r.stdout.split(" retried as ")[1].split(" ")[0]
        r = n1.text("retry", m0, "--from", "act", "--reason", "again")
        self.assertEqual(r.returncode, 1, r)
        self.assertIn("has an unfinished retry: mandate %s is running" % w0, r.stderr)
        self.go(w0)
        wait_for(lambda: self.db_status(w0) == ("succeeded", "n2", "1"), "the retry on n2")
        # (n1's refused attempt is forgotten first: "try again in a moment")
        last = []

        def retried():
            last[:] = [n1.text("retry", m0, "--from", "act", "--reason", "again")]
            return last[0].returncode == 0
        wait_for(retried, "the retry on n1", timeout=30)
        r = last[0]
        w = r.stdout.split(" retried as ")[1].split(" ")[0]
        self.assertTrue(r.stdout.endswith(" from act\n"), r.stdout)
        wait_for(lambda: self.started(w), "the retry's act")
        for x in (w0, w):
            carried = self.sql("SELECT count(*) FROM kairos_wal WHERE mandate_id = '%s' AND "
                               "convert_from(line, 'UTF8') LIKE '%%\"carried_from\":\"%s/%%'"
                               % (x, m0))
            self.assertEqual(carried, [["3"]], x)
        self.go(w)
        wait_for(lambda: self.db_status(w) is not None and self.db_status(w)[0] == "succeeded",
                 "the retry to end")
        self.assertEqual(sorted(e[1] for e in self.log() if e[0] == "start"),
                         sorted([m0, w0, w]))


def main():
    return pg_node.run_tests(lambda pg: globals().__setitem__("PG", pg))


if __name__ == "__main__":
    sys.exit(main())
