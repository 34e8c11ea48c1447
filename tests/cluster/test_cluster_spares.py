#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""WAL spares and cluster mode (docs/design.md §6 rule 1, §14), on a private
PostgreSQL (pg_fixture.py) and a state directory on tmpfs (/dev/shm: a file
system where the file backend makes spares):

- a state directory that ran the file backend and holds a mandate's records
  under a spare's name (a crash undid its rename) is refused by a node as
  one holding unfinished WALs: the spare is not taken for an empty name;
- once it is gone, the node runs a mandate and makes no spare (its barrier
  is the database's).

Exit 77 (skipped, with the reason) without PostgreSQL support or the
server binaries.  No sleeps as synchronization."""
import gzip
import glob
import os
import shutil
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import pg_node  # noqa: E402
from kairos_harness import Client, Daemon, NotifySocket, write_config  # noqa: E402

PG = None
QUICK = {"quick": {"Schedule": {"Cron": "0 0 1 1 *"}, "Mandate": {"MaxCycles": "1"}}}
BASE = (int(time.time()) // 60) * 60 - 3600


def iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class ClusterSpares(unittest.TestCase):
    def setUp(self):
        if not os.path.isdir("/dev/shm"):
            self.skipTest("no tmpfs at /dev/shm")
        self.dir = tempfile.mkdtemp(prefix="kairos-clspares-", dir="/dev/shm")
        self.db = "clspares_%d" % os.getpid()
        self.ci = PG.createdb(self.db)
        r = pg_node.subprocess.run([os.environ["KAIROSD"], "--init-db", self.ci],
                                   capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.node = pg_node.Node(self.dir, "n1", self.ci, QUICK, lease_sec=6)
        self.wal = os.path.join(self.node.state, "wal")

    def tearDown(self):
        self.node.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def spares(self):
        return glob.glob(os.path.join(self.wal, ".spare-*"))

    def test_spares_and_cluster_mode(self):
        # the file backend on the node's state directory: a mandate alone
        # leaves spares
        fdir = os.path.join(self.dir, "files")
        os.makedirs(fdir)
        conf = write_config(fdir, self.node.state, QUICK)
        notify = NotifySocket(fdir)
        d = Daemon(self.node.state, config=conf, notify=notify)
        try:
            notify.wait_ready(timeout=60)
            c = Client(d.socket_path, timeout=60)
            r = c.call("fire", schedule="quick", at=iso(BASE))
            self.assertTrue(r.get("ok") and r["result"]["fired"], r)
            m = r["result"]["mandate"]
            d.wait_log("mandate %s: WAL archived" % m, timeout=60)
            c.close()
        finally:
            d.stop()
            d.proc.stderr.close()
            notify.close()
        self.assertTrue(self.spares(), "the file backend made no spare on tmpfs")
        # its records under a spare's name
        with gzip.open(os.path.join(self.node.state, "archive", m + ".wal.jsonl.gz")) as f:
            data = f.read()
        spare = os.path.join(self.wal, ".spare-900")
        with open(spare, "wb") as f:
            f.write(data)

        # refused: the spare holds a file-backend mandate
        ndir = os.path.join(self.dir, "refused")
        os.makedirs(ndir)
        notify = NotifySocket(ndir)
        d = Daemon(self.node.state, config=self.node.conf, notify=notify)
        try:
            try:
                rc = d.proc.wait(timeout=30)
            except pg_node.subprocess.TimeoutExpired:
                d.kill()
                rc = None
            self.assertIsNotNone(rc, "a node started on a file-backend mandate in a spare")
            self.assertNotEqual(rc, 0)
            self.assertIn("holds 1 unfinished mandate of the file backend", d.log())
        finally:
            d.proc.stderr.close()
            notify.close()
        self.assertTrue(os.path.exists(spare))

        # without it: the node runs a mandate and makes no spare
        for p in self.spares():
            os.unlink(p)
        self.node.start()
        rc, out, err = self.node.ctl("fire", "quick", "--at", iso(BASE + 60))
        self.assertEqual(rc, 0, err)
        m2 = out["mandate"]
        self.node.daemon.wait_log("mandate %s done" % m2, timeout=60)
        self.assertEqual(self.spares(), [])
        self.assertEqual(self.node.close(graceful=True), 0)


def main():
    return pg_node.run_tests(lambda pg: globals().__setitem__("PG", pg))


if __name__ == "__main__":
    sys.exit(main())
