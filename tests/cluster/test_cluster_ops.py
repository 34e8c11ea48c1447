#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Operators' commands from any node in cluster mode: two kairosd nodes on
one host sharing a private PostgreSQL (pg_fixture.py).

- `list` on either node shows every mandate of the cluster, read from the
  database, with its node and epoch; `show` on a node that does not hold a
  mandate folds its rows and answers what the owner answers.
- A mandate paused (awaiting approval, paused for review) is released by
  its node: the database says paused, and `approve` / `resolve` on the other
  node takes it (epoch + 1) and acts there.
- A mandate running under a live lease elsewhere: `resolve` and `cancel`
  answer "busy", naming the node; a paused one is cancelled from any node
  (taken, then cancelled there).
- A node killed during an act: the other node takes it over (paused for
  review), releases it, and the restarted node resolves it.

Environment: KAIROSD, KAIROSCTL, KAIROS_PGSTORE_TEST (empty when built
without -Dpostgres=enabled).  Exit 77 (skipped, with the reason) without
PostgreSQL support or the PostgreSQL server binaries.  No sleeps as
synchronization: polls with a deadline."""
import calendar
import json
import os
import re
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import pg_node  # noqa: E402

PG = None
LEASE = 3

QUICK = "#!/bin/sh\necho '{\"ok\":true}'\n"
APPROVE = ("#!/bin/sh\necho '{\"kairos\":{\"pause\":\"awaiting_approval\","
           "\"reason\":\"3 invoices over the limit\"}}'\n")
# the act runs until its node dies
HANG = "#!/bin/sh\ntouch \"$OUT/act-$KAIROS_MANDATE_ID\"\nexec sleep 600\n"
# the act's effect is a tool call: the first one runs until its node dies,
# a later one (the same call) appends to the outbox
TOOLHANG = ("#!/bin/sh\nexec \"$KAIROSCTL\" tool run --key \"out-$KAIROS_IDEM_KEY\" -- sh -c "
            "'if [ ! -e \"$0.first\" ]; then touch \"$0.first\" \"$0\"; exec sleep 600; fi; "
            "echo \"$0\" >> \"$1\"' \"$OUT/act-$KAIROS_MANDATE_ID\" \"$OUT/outbox\"\n")
# the observe step waits for the test's go
GATE = ("#!/bin/sh\ntouch \"$OUT/obs-$KAIROS_MANDATE_ID\"\n"
        "while [ ! -e \"$OUT/go-$KAIROS_MANDATE_ID\" ]; do sleep 0.05; done\necho '{}'\n")


wait_for = pg_node.wait_for


def node(test, name):
    """A node of the test's database with the four schedules."""
    scheds = {}
    for sched, text in (("quick", QUICK), ("appr", APPROVE), ("hang", HANG), ("gate", GATE),
                        ("toolhang", TOOLHANG)):
        path = os.path.join(test.dir, sched + ".sh")
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, 0o755)
        scheds[sched] = {"Schedule": {"Cron": "0 0 1 1 *"},
                         "Exec": {"Act": path, "Environment": "OUT=%s" % test.out}}
        if sched == "toolhang":
            scheds[sched]["Exec"]["EffectsVia"] = "kairosctl"
            scheds[sched]["Exec"]["Environment"] += " KAIROSCTL=%s" % os.path.abspath(
                pg_node.KAIROSCTL)
        if sched == "gate":
            scheds[sched]["Exec"] = {"Observe": path,
                                     "Act": os.path.join(test.dir, "quick.sh"),
                                     "Environment": "OUT=%s" % test.out}
    return pg_node.Node(test.dir, name, test.ci, scheds, LEASE)


class ClusterOps(pg_node.TwoNodes):
    prefix = "clops"
    DEBUG = "CLOPS_DEBUG"

    def make_node(self, name):
        return node(self, name)

    def fire(self, node, sched, at):
        rc, out, err = node.ctl("fire", sched, "--at", at)
        self.assertEqual(rc, 0, err)
        self.assertTrue(out.get("fired", True), out)
        return out["mandate"]

    def assert_same_show(self, mid, owner, other):
        rc1, s1, e1 = owner.ctl("show", mid)
        rc2, s2, e2 = other.ctl("show", mid)
        self.assertEqual(rc1, 0, e1)
        self.assertEqual(rc2, 0, e2)
        for k in ("plans", "operators", "wal_status", "records", "id", "status", "schedule",
                  "fired_at", "plan_id", "cycle", "node", "epoch"):
            self.assertEqual(s1.get(k), s2.get(k), "show %s: %s differs: %r vs %r"
                             % (mid, k, s1.get(k), s2.get(k)))
        return s1, s2

    def test_list_show_approve_anywhere(self):
        n1, n2 = self.n1, self.n2
        quick = self.fire(n1, "quick", "2026-01-01T00:00:00Z")
        appr = self.fire(n2, "appr", "2026-01-02T00:00:00Z")
        wait_for(lambda: self.db_row(quick) == ("succeeded", "n1", "1"), "quick to end on n1")
        # awaiting approval on n2, released: paused in the database
        wait_for(lambda: self.db_row(appr) == ("paused", "n2", "1"), "appr released paused")
        for n in (n1, n2):
            rows = n.rows()
            self.assertEqual(list(rows), [appr, quick], rows)   # newest first
            self.assertEqual((rows[quick]["status"], rows[quick]["node"], rows[quick]["epoch"]),
                             ("done", "n1", 1), rows)
            # as its node said it (released: the database's paused_as), with why
            self.assertEqual((rows[appr]["status"], rows[appr]["node"], rows[appr]["epoch"],
                              rows[appr]["reason"]),
                             ("awaiting_approval", "n2", 1, "3 invoices over the limit"), rows)
            # the filters
            rc, out, err = n.ctl("list", "--status", "done")
            self.assertEqual([r["id"] for r in out["mandates"]], [quick], out)
            rc, out, err = n.ctl("list", "--status", "awaiting_approval", "--schedule", "appr")
            self.assertEqual([r["id"] for r in out["mandates"]], [appr], out)
            rc, out, err = n.ctl("list", "--status", "paused", "--schedule", "appr")
            self.assertEqual([r["id"] for r in out["mandates"]], [], out)
            rc, out, err = n.ctl("list", "--limit", "1")
            self.assertEqual(([r["id"] for r in out["mandates"]], out["more"], out.get("next")),
                             ([appr], True, appr), out)
            rc, out, err = n.ctl("list", "--after", appr)
            self.assertEqual([r["id"] for r in out["mandates"]], [quick], out)
            rc, out, err = n.ctl("list", "--since", "2026-01-01T12:00:00Z")
            self.assertEqual([r["id"] for r in out["mandates"]], [appr], out)
            # the table keeps its columns; the owner goes in REASON
            t = n.text("list")
            self.assertEqual(t.returncode, 0, t.stderr)
            self.assertEqual(t.stdout.splitlines()[0].split(),
                             ["ID", "SCHEDULE", "FIRED", "AT", "STATUS", "CYCLE", "STARTED",
                              "ENDED", "DURATION", "REASON"])
            self.assertIn("on node n1 (epoch 1)", t.stdout)
        # show on the node that does not hold it: the same plans and steps
        s1, s2 = self.assert_same_show(quick, n1, n2)
        self.assertEqual(s1["status"], "done")
        self.assertTrue(s1["plans"] and s1["plans"][0]["steps"], s1)
        t = n2.text("show", quick)
        self.assertEqual(t.returncode, 0, t.stderr)
        self.assertIn("node:      n1 (epoch 1)", t.stdout)
        # a mandate nobody holds: both read it from the database
        rc, s, err = n1.ctl("show", appr)
        self.assertEqual(rc, 0, err)
        self.assertEqual((s["status"], s["node"], s["epoch"]), ("awaiting_approval", "n2", 1), s)
        rc, out, err = n1.ctl("show", "mnd_no_such_mandate")
        self.assertEqual(rc, 1)
        self.assertIn("no mandate", err)
        # wait on a node that does not hold the mandate: it asks show (the
        # database's word), as kairosd answers "poll"
        rc, out, err = n2.ctl("wait", quick)
        self.assertEqual((rc, out["status"], out["exit"]), (0, "done", 0), err)
        rc, out, err = n1.ctl("wait", appr, "--timeout", "30")
        self.assertEqual((rc, out["status"], out["timed_out"]), (4, "awaiting_approval", False),
                         err)
        # approved on n1: taken (epoch 2), approved, and it ends there
        rc, out, err = n1.ctl("approve", appr, "--reason", "fine")
        self.assertEqual(rc, 0, err)
        wait_for(lambda: self.db_row(appr) == ("succeeded", "n1", "2"), "appr to end on n1")
        for n in (n1, n2):
            r = n.rows()[appr]
            self.assertEqual((r["status"], r["node"], r["epoch"]), ("done", "n1", 2), r)
        s1, s2 = self.assert_same_show(appr, n1, n2)
        self.assertIn("approve", [o["action"] for o in s2["operators"]], s2)
        # an ended mandate that the node does not know cannot be taken
        rc, out, err = n2.ctl("approve", appr)
        self.assertEqual(rc, 1)
        self.assertIn("has ended (done)", err)
        self.assertEqual(self.db_row(appr), ("succeeded", "n1", "2"))

    def reviews_waiting(self, n):
        """(cluster.reviews_waiting, {node: reviews}) of n's status."""
        rc, st, err = n.ctl("status")
        cl = st["cluster"]
        return cl.get("reviews_waiting"), {x["node"]: x.get("reviews") for x in cl["nodes"]}

    def test_review_resolved_on_another_node(self):
        n1, n2 = self.n1, self.n2
        mid = self.fire(n1, "hang", "2026-02-01T00:00:00Z")
        wait_for(lambda: os.path.exists(os.path.join(self.out, "act-" + mid)), "the act")
        # running on n1 under a live lease: n2 may not take it
        rc, out, err = n2.ctl("resolve", mid, "act_001", "--done", "--reason", "x")
        self.assertEqual(rc, 1)
        self.assertIn("busy", err + json.dumps(out))
        self.assertIn("held by node n1", err + json.dumps(out))
        self.assertEqual(self.db_row(mid), ("running", "n1", "1"))
        # n1 dies during the act: n2 takes it over, finds the act cut off
        # (paused for review), and releases it
        n1.daemon.proc.send_signal(signal.SIGKILL)
        n1.close()
        wait_for(lambda: self.db_row(mid) == ("paused", "n2", "2"), "n2 to take and release it",
                 timeout=90)
        rc, s, err = n2.ctl("show", mid)
        self.assertEqual(rc, 0, err)
        self.assertEqual((s["status"], s["review_step"], s["node"], s["epoch"]),
                         ("paused_review", "act_001", "n2", 2), s)
        # released, the review is counted and listed on every node (n1
        # restarted too): the database says how n2 released it
        self.assertEqual(self.sql("SELECT paused_as FROM kairos_mandate WHERE mandate_id = "
                                  "'%s'" % mid), [["paused_review"]])
        n1.start()
        for n in (n1, n2):
            r = n.rows()[mid]
            self.assertEqual((r["status"], r["node"], r["epoch"]), ("paused_review", "n2", 2), r)
            self.assertTrue(r["reason"], r)
            self.assertIn("paused_review", n.text("list", "--status", "paused_review").stdout)
            wait_for(lambda: self.reviews_waiting(n) == (1, {"n1": 0, "n2": 1}),
                     "the review counted on %s" % n.name)
            self.assertIn("n2 alive, 0 mandates, 1 review released", n.text("status").stdout)
            self.assertIn("kairos_cluster_reviews_waiting 1", n.text("metrics").stdout)
        # the restarted n1 resolves it: taken at epoch 3, done there
        rc, out, err = n1.ctl("resolve", mid, "act_001", "--done", "--reason", "checked by hand")
        self.assertEqual(rc, 0, err)
        wait_for(lambda: self.db_row(mid) == ("succeeded", "n1", "3"), "it to end on n1")
        s1, s2 = self.assert_same_show(mid, n1, n2)
        self.assertIn("resolve_done", [o["action"] for o in s2["operators"]], s2)
        self.assertEqual(self.sql("SELECT paused_as, paused_reason FROM kairos_mandate WHERE "
                                  "mandate_id = '%s'" % mid), [["", ""]])
        for n in (n1, n2):
            wait_for(lambda: self.reviews_waiting(n)[0] == 0, "no review on %s" % n.name)
        for n in (n1, n2):
            r = n.rows()[mid]
            self.assertEqual((r["status"], r["node"], r["epoch"]), ("done", "n1", 3), r)

    def resolve_interrupted_call(self, action):
        """n1 is killed inside the act's tool call; n2 takes the mandate over
        (paused for review, the call interrupted in the database) and the
        operator resolves it there with action."""
        n1, n2 = self.n1, self.n2
        mid = self.fire(n1, "toolhang", "2026-03-01T00:00:00Z")
        wait_for(lambda: os.path.exists(os.path.join(self.out, "act-" + mid)), "the tool call")
        n1.daemon.proc.send_signal(signal.SIGKILL)
        n1.close()
        wait_for(lambda: self.db_row(mid) == ("paused", "n2", "2"), "n2 to take and release it",
                 timeout=90)
        rc, s, err = n2.ctl("show", mid)
        self.assertEqual((s["status"], s["review_step"]), ("paused_review", "act_001"), s)
        key = "cmd:out-%s/act_001" % mid
        self.assertEqual(self.sql("SELECT state FROM kairos_idem WHERE key = '%s'" % key),
                         [["interrupted"]])
        rc, out, err = n2.ctl("resolve", mid, "act_001", "--" + action, "--reason", "checked")
        self.assertEqual(rc, 0, err)
        word = "released" if action == "retry" else "completed"
        self.assertEqual(out["tool_calls_" + word], [key], out)
        try:
            wait_for(lambda: self.db_row(mid) == ("succeeded", "n2", "3"), "it to end on n2")
        except AssertionError as e:
            raise AssertionError("%s; the row: %r\n--- n2 ---\n%s" % (
                e, self.db_row(mid), n2.daemon.log()[-6000:])) from None
        rc, s, err = n2.ctl("show", mid)
        self.assertIn(("tool_calls_" + word, key),
                      [(o["action"], o["reason"]) for o in s["operators"]], s)
        return mid, key

    def test_resolve_retry_releases_a_call_in_the_database(self):
        mid, key = self.resolve_interrupted_call("retry")
        # the re-run ran the effect, once
        with open(os.path.join(self.out, "outbox")) as f:
            self.assertEqual(f.read().splitlines(), [os.path.join(self.out, "act-" + mid)])
        self.assertEqual(self.sql("SELECT state, epoch FROM kairos_idem WHERE key = '%s'" % key),
                         [["completed", "3"]])

    def test_resolve_done_completes_a_call_in_the_database(self):
        mid, key = self.resolve_interrupted_call("done")
        self.assertFalse(os.path.exists(os.path.join(self.out, "outbox")))
        rows = self.sql("SELECT state, convert_from(result, 'UTF8') FROM kairos_idem "
                        "WHERE key = '%s'" % key)
        self.assertEqual(rows[0][0], "completed", rows)
        self.assertEqual(json.loads(rows[0][1])["completed_by"]["reason"], "checked", rows)

    def test_paused_by_operator_taken_back_by_its_node(self):
        n1, n2 = self.n1, self.n2
        mid = self.fire(n1, "gate", "2026-03-01T00:00:00Z")
        wait_for(lambda: os.path.exists(os.path.join(self.out, "obs-" + mid)), "observe")
        rc, out, err = n1.ctl("pause", mid, "--reason", "hold on")
        self.assertEqual(rc, 0, err)
        # held while its handler runs
        self.assertEqual(self.db_row(mid), ("running", "n1", "1"))
        with open(os.path.join(self.out, "go-" + mid), "w"):
            pass
        wait_for(lambda: self.db_row(mid) == ("paused", "n1", "1"), "n1 to let it go")
        self.assertEqual(n2.rows()[mid]["status"], "paused")
        self.assertEqual(n1.rows()[mid]["status"], "paused")
        # its own node takes it back (epoch 2): taken over, it runs again
        rc, out, err = n1.ctl("resume", mid)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out["mandate"], mid, out)
        wait_for(lambda: self.db_row(mid) == ("succeeded", "n1", "2"), "it to end on n1")
        r = n2.rows()[mid]
        self.assertEqual((r["status"], r["node"], r["epoch"]), ("done", "n1", 2), r)

    def test_cancel_anywhere(self):
        n1, n2 = self.n1, self.n2
        appr = self.fire(n2, "appr", "2026-04-01T00:00:00Z")
        wait_for(lambda: self.db_row(appr) == ("paused", "n2", "1"), "appr released paused")
        # no node holds it: n1 takes it (epoch 2) and cancels it there
        rc, out, err = n1.ctl("cancel", appr, "--reason", "not this month")
        self.assertEqual(rc, 0, err)
        self.assertEqual(self.db_row(appr)[1:], ("n1", "2"))
        self.assertNotIn(self.db_row(appr)[0], ("running", "paused"))
        for n in (n1, n2):
            r = n.rows()[appr]
            self.assertEqual((r["status"], r["node"], r["epoch"]), ("cancelled", "n1", 2), r)
        s1, s2 = self.assert_same_show(appr, n1, n2)
        self.assertIn("cancel", [o["action"] for o in s2["operators"]], s2)
        # running on n1 under a live lease: n2 may not cancel it, n1 may
        hang = self.fire(n1, "hang", "2026-04-02T00:00:00Z")
        wait_for(lambda: os.path.exists(os.path.join(self.out, "act-" + hang)), "the act")
        rc, out, err = n2.ctl("cancel", hang, "--reason", "x")
        self.assertEqual(rc, 1)
        self.assertIn("held by node n1", err + json.dumps(out))
        self.assertEqual(self.db_row(hang), ("running", "n1", "1"))
        rc, out, err = n1.ctl("cancel", hang, "--reason", "stop it")
        self.assertEqual(rc, 0, err)
        self.assertEqual(n2.rows()[hang]["status"], "cancelled")
        # a mandate no node ever had
        rc, out, err = n2.ctl("cancel", "mnd_no_such_mandate", "--reason", "x")
        self.assertEqual(rc, 1)
        self.assertIn("no mandate", err)

    def test_reads_recover_after_postmaster_crash(self):
        """kill -9 of the postmaster: once it is back, list and show of the
        other node's mandate work again on both nodes within one lease
        (every pool connection broken by the crash is made again, not lent
        broken to the next read)."""
        n1, n2 = self.n1, self.n2
        a = self.fire(n1, "quick", "2026-05-01T00:00:00Z")
        b = self.fire(n2, "quick", "2026-05-02T00:00:00Z")
        for mid in (a, b):
            wait_for(lambda: (self.db_row(mid) or ("",))[0] == "succeeded", "%s done" % mid)
        # every connection of both pools in use before the crash
        for _ in range(4):
            for n, mid in ((n1, b), (n2, a)):
                self.assertEqual(n.ctl("show", mid)[0], 0)
                self.assertEqual(n.ctl("list")[0], 0)
        pg_node.SERVER.crash()
        pg_node.SERVER.restart_after_crash()
        back = time.monotonic()
        last = {}

        def reads_work():
            ok = True
            for n, mid in ((n1, b), (n2, a)):
                for args in (("show", mid), ("list",)):
                    rc, out, err = n.ctl(*args)
                    last[(n.name,) + args] = (rc, err)
                    ok = ok and rc == 0
            return ok
        try:
            wait_for(reads_work, "show and list on both nodes", timeout=LEASE)
        except AssertionError as e:
            raise AssertionError("%s: %r" % (e, last))
        took = time.monotonic() - back
        # and they keep working (not one lucky connection of four)
        for _ in range(4):
            self.assertTrue(reads_work(), last)
        self.assertLess(took, LEASE, last)

    def test_database_error_in_its_own_words(self):
        """The database refuses a write (a full disk): kairosctl fire says
        what PostgreSQL said, with its SQLSTATE, not "Input/output
        error"."""
        n1 = self.n1
        self.sql("CREATE FUNCTION full_disk() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                 "RAISE EXCEPTION 'could not extend file: No space left on device' "
                 "USING ERRCODE = '53100'; END $$; "
                 "CREATE TRIGGER full_disk BEFORE INSERT ON kairos_wal "
                 "FOR EACH ROW EXECUTE FUNCTION full_disk()")
        rc, out, err = n1.ctl("fire", "quick", "--at", "2026-06-01T00:00:00Z")
        self.assertNotEqual(rc, 0, out)
        self.assertIn("No space left on device (SQLSTATE 53100)", err)
        self.assertNotIn("Input/output error", err)
        self.sql("DROP TRIGGER full_disk ON kairos_wal")
        self.fire(n1, "quick", "2026-06-02T00:00:00Z")

    def test_retries_known_on_every_node(self):
        """The retries of a mandate are the database's: show on either
        node, the one that ran it or not, and across a restart, names every
        retry whichever node made it; a retry asked for on either node
        counts them all."""
        n1, n2 = self.n1, self.n2
        m = self.fire(n1, "quick", "2026-09-01T00:00:00Z")
        wait_for(lambda: self.db_row(m) == ("succeeded", "n1", "1"), "m to end")
        made = []
        for n in (n2, n1):
            rc, out, err = n.ctl("retry", m, "--reason", "again")
            self.assertEqual(rc, 0, err)
            made.append(out["mandate"])
            wait_for(lambda: (self.db_row(made[-1]) or ("",))[0] == "succeeded",
                     "the retry made on %s to end" % n.name)
        self.assertEqual(self.sql("SELECT mandate_id, retry FROM kairos_mandate WHERE "
                                  "retry_of = '%s' ORDER BY retry" % m),
                         [[made[0], "1"], [made[1], "2"]])
        for n in (n1, n2):
            rc, s, err = n.ctl("show", m)
            self.assertEqual((rc, s["retried_by"]), (0, made), "%s: %s" % (n.name, err))
            t = n.text("show", m)
            self.assertIn("retried by: %s, %s" % tuple(made), t.stdout)
        self.n2.close(graceful=True)
        self.n2.start()
        rc, s, err = n2.ctl("show", m)
        self.assertEqual((rc, s["retried_by"]), (0, made), err)
        rc, out, err = n2.ctl("retry", m)
        self.assertEqual(rc, 1, out)
        self.assertIn("ended done", err)

    def test_failed_claim_is_not_called_fenced(self):
        """A tick claim that fails for the database (a full disk): the
        fire says the database's words; firing the tick again while the
        failed attempt is being forgotten says that, never "fenced:
        another node holds it now" (no node holds it) and answers
        cluster_unavailable (a cron tick is fired again); once the database
        takes writes the tick fires."""
        n1 = self.n1
        self.sql("CREATE FUNCTION full_disk() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                 "RAISE EXCEPTION 'could not extend file: No space left on device' "
                 "USING ERRCODE = '53100'; END $$; "
                 "CREATE TRIGGER full_disk BEFORE INSERT ON kairos_wal "
                 "FOR EACH ROW EXECUTE FUNCTION full_disk()")
        at = "2026-06-03T00:00:00Z"
        first = ("the claim of its tick failed: could not extend file: No space left on "
                 "device (SQLSTATE 53100)")
        for wants in ((first,), (first, "an earlier attempt at its tick on this node was not "
                                 "claimed and is still being forgotten: try again")):
            rc, out, err = n1.ctl("fire", "quick", "--at", at)
            self.assertEqual((rc, out["code"]), (1, "cluster_unavailable"), err)
            self.assertNotIn("fenced", err)
            self.assertTrue(any(w in err for w in wants), err)
        self.assertEqual(self.sql("SELECT count(*) FROM kairos_mandate"), [["0"]])
        self.sql("DROP TRIGGER full_disk ON kairos_wal")
        wait_for(lambda: n1.ctl("fire", "quick", "--at", at)[0] == 0, "the fire", timeout=30)
        wait_for(lambda: (self.sql("SELECT status FROM kairos_mandate") or [[""]])[0][0]
                 == "succeeded", "the mandate to end")
        self.assertNotIn("fenced", n1.daemon.log())

    def test_duplicate_node_name_older_exits(self):
        """A second kairosd started with n1's NodeName= (another state
        directory): the first one can no longer renew and exits 1 with a
        line that says why, within a lease or two; the new one serves."""
        old = self.n1
        root = os.path.join(self.dir, "dup")
        os.makedirs(root)
        dup = node(type("T", (), {"dir": root, "out": self.out, "ci": self.ci})(), "n1")
        dup.start()
        self.n1 = dup   # (stopped by tearDown)
        rc = old.daemon.proc.wait(timeout=4 * LEASE + 10)
        self.assertEqual(rc, 1, old.daemon.log()[-3000:])
        log = old.daemon.log()
        self.assertIn("a newer kairosd registered NodeName=n1", log)
        old.close()
        self.fire(dup, "quick", "2026-07-01T00:00:00Z")

    def test_hold_of_a_dead_node_says_when_it_ends(self):
        """cancel on n2 of a mandate a killed n1 still holds: busy, naming
        n1 and the time its hold ends (its lease and the grace); after that
        time the cancel works from n2."""
        n1, n2 = self.n1, self.n2
        hang = self.fire(n1, "hang", "2026-08-01T00:00:00Z")
        wait_for(lambda: os.path.exists(os.path.join(self.out, "act-" + hang)), "the act")
        n1.close()   # kill -9
        rc, out, err = n2.ctl("cancel", hang, "--reason", "x")
        self.assertEqual(rc, 1, err)
        m = re.search(r"held by node n1 until (\d\d:\d\d:\d\d) \(its lease, if n1 does "
                      r"not renew it\), then any node may take it", err)
        self.assertTrue(m, err)
        now = time.time()
        until = time.strftime("%Y-%m-%dT", time.gmtime(now)) + m.group(1) + "Z"
        left = calendar.timegm(time.strptime(until, "%Y-%m-%dT%H:%M:%SZ")) - now
        self.assertLessEqual(left, 2 * LEASE + 1, err)
        wait_for(lambda: n2.ctl("cancel", hang, "--reason", "x")[0] == 0, "the cancel on n2",
                 timeout=max(left, 0) + 2 * LEASE + 5)
        self.assertEqual(self.db_row(hang)[0], "cancelled")

    def test_pause_anywhere(self):
        """pause on n2 of a mandate n1 runs: busy under n1's live lease
        (not "no mandate"); once n1 is dead and its hold ended, n2 takes it
        and pauses it there."""
        n1, n2 = self.n1, self.n2
        hang = self.fire(n1, "hang", "2026-08-02T00:00:00Z")
        wait_for(lambda: os.path.exists(os.path.join(self.out, "act-" + hang)), "the act")
        rc, out, err = n2.ctl("pause", hang, "--reason", "look first")
        self.assertEqual(rc, 1, err)
        self.assertIn("is held by node n1", err)
        n1.close()   # kill -9
        last = []

        def paused():
            rc, out, err = n2.ctl("pause", hang, "--reason", "look first")
            last[:] = [rc, err]
            # paused by this command, or already paused for review by the
            # takeover of its interrupted act: either way answered on n2
            return rc == 0 or "is paused_review: cannot pause it" in err
        try:
            wait_for(paused, "the pause on n2", timeout=4 * LEASE + 5)
        except AssertionError as e:
            raise AssertionError("%s: %r" % (e, last))
        self.assertIn(n2.rows()[hang]["status"], ("paused", "paused_review"))
        self.assertEqual(self.db_row(hang)[1], "n2")


def main():
    return pg_node.run_tests(lambda pg: globals().__setitem__("PG", pg))


if __name__ == "__main__":
    sys.exit(main())
