#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Tool calls in cluster mode, one kairosd node on a private PostgreSQL
(pg_fixture.py): a step's `kairosctl tool run` and `tool write` are claimed
and finished in kairos_idem, fenced by (mandate, epoch), not in the node's
local store; a repeated key replays the cached result without running the
tool again; KAIROS_EPOCH (given to handlers, passed on by kairosctl) must be
the epoch the node holds the mandate at, else the call is refused "fenced"
and the tool does not run; a call with an epoch from no running step is
fenced too; a mandate whose epoch moved on in the database (as a takeover
does) has its next tool call refused inside the database, and the node gives
the mandate up.  Calls from no step keep the local store.  A finish whose
answer was lost after its commit is made again and succeeds.

Environment: KAIROSD, KAIROSCTL, KAIROS_PGSTORE_TEST (empty when built
without -Dpostgres=enabled).  Exit 77 (skipped, with the reason) without
PostgreSQL support or without the PostgreSQL server binaries.  No sleeps as
synchronization: the handler waits for a file the test writes, the test
polls the database or the log with a deadline."""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import pg_fixture  # noqa: E402
import pg_node  # noqa: E402
import pg_proxy  # noqa: E402
from kairos_harness import KAIROSCTL, KAIROSD, Client, Daemon, NotifySocket, write_config  # noqa: E402,E501

PG = None

# The act step: two runs of the same key (the second replays), a write, a
# call at a wrong epoch (refused), then it waits for the test's go and makes
# one more call (the test moved the mandate's epoch on in the meantime).
ACT = r"""#!/bin/sh
"$KAIROSCTL" tool run --key "run-$KAIROS_IDEM_KEY" -- sh -c 'echo ran >> "$0"' "$OUT/ran" \
  > "$OUT/run1.out" || exit 3
"$KAIROSCTL" tool run --key "run-$KAIROS_IDEM_KEY" -- sh -c 'echo ran >> "$0"' "$OUT/ran" \
  > "$OUT/run2.out" || exit 4
printf 'report\n' | "$KAIROSCTL" tool write --key "write-$KAIROS_IDEM_KEY" "$ROOT/report" || exit 5
printf 'other\n' | "$KAIROSCTL" tool write --key "write-$KAIROS_IDEM_KEY" "$ROOT/report" \
  2> "$OUT/write2.out" || exit 6
# a tool that cannot be executed is stored as failed, and replayed as such
"$KAIROSCTL" tool run --key "fail-$KAIROS_IDEM_KEY" -- "$OUT/no-such-tool" 2> /dev/null
echo $? > "$OUT/fail1.rc"
"$KAIROSCTL" tool run --key "fail-$KAIROS_IDEM_KEY" -- "$OUT/no-such-tool" 2> "$OUT/fail2.err"
echo $? > "$OUT/fail2.rc"
echo "$KAIROS_EPOCH" > "$OUT/epoch"
# the same key with another command: a mismatch (65)
"$KAIROSCTL" tool run --key "run-$KAIROS_IDEM_KEY" -- true 2> /dev/null
echo $? > "$OUT/mismatch.rc"
# kairosctl dies while its tool runs: the claim becomes interrupted (75 after)
"$KAIROSCTL" tool run --key "cut-$KAIROS_IDEM_KEY" -- sh -c 'kill -9 $PPID'
# (the daemon marks it on the connection's close: in progress until then)
for i in $(seq 200); do
  "$KAIROSCTL" tool run --key "cut-$KAIROS_IDEM_KEY" -- sh -c 'kill -9 $PPID' 2> "$OUT/cut.err"
  echo $? > "$OUT/cut.rc"
  grep -q interrupted "$OUT/cut.err" && break
  sleep 0.05
done
KAIROS_EPOCH=$((KAIROS_EPOCH + 7)) "$KAIROSCTL" tool run --key "wrong-$KAIROS_IDEM_KEY" -- \
  sh -c 'echo ran >> "$0"' "$OUT/wrong" 2> "$OUT/wrong.err"
echo $? > "$OUT/wrong.rc"
KAIROS_EPOCH=x "$KAIROSCTL" tool run --key "bad-$KAIROS_IDEM_KEY" -- true 2> /dev/null
echo $? > "$OUT/bad.rc"
# the database keeps no check: --check is refused, the tool does not run
"$KAIROSCTL" tool run --key "chk-$KAIROS_IDEM_KEY" --check true -- \
  sh -c 'echo ran >> "$0"' "$OUT/chk" 2> "$OUT/chk.err"
echo $? > "$OUT/chk.rc"
touch "$OUT/waiting"
while [ ! -e "$OUT/go" ]; do sleep 0.05; done
"$KAIROSCTL" tool run --key "late-$KAIROS_IDEM_KEY" -- sh -c 'echo ran >> "$0"' "$OUT/late" \
  2> "$OUT/late.err"
echo $? > "$OUT/late.rc"
echo '{"ok":true}'
"""


def wait_for(cond, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


class ToolCalls(unittest.TestCase):
    def setUp(self):
        self.db = "tools_%d" % os.getpid()
        self.ci = PG.createdb(self.db)
        r = subprocess.run([KAIROSD, "--init-db", self.ci], capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.dir = tempfile.mkdtemp(prefix="kairos-pgtools-")
        os.chmod(self.dir, 0o755)
        self.state = os.path.join(self.dir, "state")
        self.root = os.path.join(self.dir, "root")
        self.out = os.path.join(self.dir, "out")
        os.makedirs(self.root)
        os.makedirs(self.out)
        act = os.path.join(self.dir, "act.sh")
        with open(act, "w") as f:
            f.write(ACT)
        os.chmod(act, 0o755)
        sched = {"Schedule": {"Cron": "0 0 1 1 *"},
                 "Exec": {"Act": act,
                          "Environment": "OUT=%s ROOT=%s KAIROSCTL=%s"
                                         % (self.out, self.root, KAIROSCTL)}}
        extra = ("[Idempotency]\nWriteRoots=%s\n[Cluster]\nBackend=postgres\n"
                 "ConnectionString=%s\nNodeName=n1\nLeaseSec=10\n" % (self.root, self.ci))
        conf = write_config(self.dir, self.state, {"job": sched}, daemon_extra=extra)
        self.notify = NotifySocket(self.dir)
        self.daemon = Daemon(self.state, config=conf, notify=self.notify)
        try:
            self.notify.wait_ready(timeout=60)
        except TimeoutError:
            self.daemon.kill()
            raise AssertionError("kairosd is not ready:\n" + self.daemon.log()[-4000:])

    def tearDown(self):
        with open(os.path.join(self.out, "go"), "w"):
            pass
        rc = self.daemon.stop()
        self.daemon.proc.stderr.close()
        self.notify.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.assertEqual(rc, 0, self.daemon.log()[-3000:])

    def sql(self, q):
        return PG.psql(self.db, q)

    def read(self, name):
        with open(os.path.join(self.out, name)) as f:
            return f.read()

    def test_step_calls_in_the_database(self):
        c = Client(self.daemon.socket_path)
        r = c.call("fire", schedule="job", fired_at="2030-01-01T00:00:00Z")
        c.close()
        self.assertTrue(r["ok"], r)
        mid = r["result"]["mandate"]
        key = "%s/act_001" % mid
        wait_for(lambda: os.path.exists(os.path.join(self.out, "waiting")), "the handler",
                 timeout=90)
        epoch = int(self.read("epoch"))
        self.assertGreaterEqual(epoch, 1)
        # the tool ran once; the repeat was replayed from the database
        self.assertEqual(self.read("ran"), "ran\n")
        rows = self.sql("SELECT key, state, step_id, attempt, epoch, owner FROM kairos_idem "
                        "WHERE mandate_id = '%s' AND key NOT LIKE 'cmd:cut-%%' AND key NOT LIKE 'cmd:fail-%%' ORDER BY key" % mid)
        self.assertEqual(rows, [["cmd:run-" + key, "completed", "act_001", "1", str(epoch), "n1"],
                                ["kairos.write:write-" + key, "completed", "act_001", "1",
                                 str(epoch), "n1"]], rows)
        with open(os.path.join(self.root, "report")) as f:
            self.assertEqual(f.read(), "report\n")
        # not in the node's local store
        c = Client(self.daemon.socket_path)
        g = c.call("idem-get", key="cmd:run-" + key)
        c.close()
        self.assertFalse(g["ok"], g)
        # a wrong epoch is refused before anything is claimed; the tool did not run
        self.assertEqual(self.read("wrong.rc").strip(), "1")
        self.assertIn("fenced", self.read("wrong.err"))
        self.assertIn("epoch %d" % (epoch + 7), self.read("wrong.err"))
        self.assertFalse(os.path.exists(os.path.join(self.out, "wrong")))
        self.assertEqual(self.read("bad.rc").strip(), "64")
        self.assertEqual(self.read("chk.rc").strip(), "1", self.read("chk.err"))
        self.assertIn("--check is not supported in cluster mode", self.read("chk.err"))
        self.assertFalse(os.path.exists(os.path.join(self.out, "chk")))
        self.assertEqual(self.sql("SELECT count(*) FROM kairos_idem WHERE key = 'cmd:chk-%s'"
                                  % key), [["0"]])
        self.assertEqual(self.read("mismatch.rc").strip(), "65")
        self.assertIn("not written again", self.read("write2.out"))
        self.assertEqual(self.read("fail1.rc").strip(), "127")
        self.assertEqual(self.read("fail2.rc").strip(), "127")
        self.assertIn("cached error from the first run", self.read("fail2.err"))
        self.assertEqual(self.sql("SELECT state FROM kairos_idem WHERE key = 'cmd:fail-%s'"
                                  % key), [["failed"]])
        # the interrupted claim: in the database, refused to the retry
        self.assertEqual(self.read("cut.rc").strip(), "75", self.read("cut.err"))
        self.assertIn("interrupted", self.read("cut.err"))
        self.assertEqual(self.sql("SELECT state, epoch FROM kairos_idem WHERE key = "
                                  "'cmd:cut-%s'" % key), [["interrupted", str(epoch)]])
        # a call from no step that claims an epoch is fenced; one without is local
        env = dict(os.environ, KAIROS_EPOCH=str(epoch))
        p = subprocess.run([KAIROSCTL, "--socket", self.daemon.socket_path, "tool", "run",
                            "--key", "outsider", "--", "true"], env=env, capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("fenced", p.stderr)
        env.pop("KAIROS_EPOCH")
        p = subprocess.run([KAIROSCTL, "--socket", self.daemon.socket_path, "tool", "run",
                            "--key", "outsider", "--", "true"], env=env, capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.sql("SELECT count(*) FROM kairos_idem WHERE key LIKE "
                                  "'%outsider%'"), [["0"]])

        # another node's takeover, as the database sees it: the epoch moves on
        self.sql("UPDATE kairos_mandate SET epoch = epoch + 1, owner = 'n2' "
                 "WHERE mandate_id = '%s'" % mid)
        with open(os.path.join(self.out, "go"), "w"):
            pass
        # the node gives the mandate up (the refused call, or its heartbeat,
        # tells it first); the late tool never runs and claims nothing
        self.daemon.wait_log("mandate %s: no longer held by node n1" % mid, timeout=60)
        self.assertFalse(os.path.exists(os.path.join(self.out, "late")))
        self.assertEqual(self.sql("SELECT count(*) FROM kairos_idem WHERE key = "
                                  "'cmd:late-%s'" % key), [["0"]])
        if os.environ.get("PGTOOLS_DEBUG"):
            print(self.daemon.log()[-4000:], file=sys.stderr)
        if os.path.exists(os.path.join(self.out, "late.rc")):
            self.assertNotEqual(self.read("late.rc").strip(), "0")


# One call, then the step ends; its rc and output for the test.
ONE_CALL = r"""#!/bin/sh
"$KAIROSCTL" tool run --key "once-$KAIROS_IDEM_KEY" -- sh -c 'echo ran >> "$0"' "$OUT/ran" \
  > "$OUT/once.out" 2> "$OUT/once.err"
echo $? > "$OUT/once.rc"
echo '{"ok":true}'
"""


class FinishOutcomeUnknown(unittest.TestCase):
    """The answer to a tool call's finish is lost after its commit (a
    proxy swallows it and closes the connection): the node makes the finish
    again, finds its own commit, and the call succeeds; the tool ran once."""

    def test_finish_made_again(self):
        db = "tools_unknown_%d" % os.getpid()
        ci = PG.createdb(db)
        r = subprocess.run([KAIROSD, "--init-db", ci], capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        d = tempfile.mkdtemp(prefix="kairos-pgtools-")
        self.addCleanup(shutil.rmtree, d, True)
        os.chmod(d, 0o755)
        out = os.path.join(d, "out")
        os.makedirs(out)
        act = os.path.join(d, "act.sh")
        with open(act, "w") as f:
            f.write(ONE_CALL)
        os.chmod(act, 0o755)
        sched = {"Schedule": {"Cron": "0 0 1 1 *"},
                 "Exec": {"Act": act, "Environment": "OUT=%s KAIROSCTL=%s" % (out, KAIROSCTL)}}
        with pg_proxy.ReplyDropper(PG.dir, pg_fixture.PORT, b"kairos_idem_finish") as px:
            extra = ("[Cluster]\nBackend=postgres\nConnectionString=%s\nNodeName=n1\n"
                     "LeaseSec=10\n" % px.conninfo(db))
            conf = write_config(d, os.path.join(d, "state"), {"job": sched},
                                daemon_extra=extra)
            notify = NotifySocket(d)
            daemon = Daemon(os.path.join(d, "state"), config=conf, notify=notify)
            try:
                notify.wait_ready(timeout=60)
                c = Client(daemon.socket_path)
                r = c.call("fire", schedule="job", fired_at="2030-01-01T00:00:00Z")
                c.close()
                self.assertTrue(r["ok"], r)
                mid = r["result"]["mandate"]
                wait_for(lambda: PG.psql(db, "SELECT status FROM kairos_mandate WHERE "
                                             "mandate_id = '%s'" % mid) != [["running"]],
                         "the mandate to end", timeout=90)
                dropped = px.dropped
            finally:
                rc = daemon.stop()
                daemon.proc.stderr.close()
                notify.close()
            log = daemon.log()
        self.assertEqual(dropped, 1, "the proxy did not swallow the finish's answer")
        with open(os.path.join(out, "once.rc")) as f:
            self.assertEqual(f.read().strip(), "0", log[-3000:])
        with open(os.path.join(out, "ran")) as f:
            self.assertEqual(f.read(), "ran\n")
        self.assertEqual(PG.psql(db, "SELECT status FROM kairos_mandate WHERE mandate_id = "
                                     "'%s'" % mid), [["succeeded"]])
        self.assertEqual(PG.psql(db, "SELECT state FROM kairos_idem WHERE mandate_id = '%s'"
                                     % mid), [["completed"]])
        self.assertEqual(rc, 0, log[-3000:])


def main():
    return pg_node.run_tests(lambda pg: globals().__setitem__("PG", pg))


if __name__ == "__main__":
    sys.exit(main())
