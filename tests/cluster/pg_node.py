# SPDX-License-Identifier: MIT
"""What the one-host cluster tests share (test_pgtools, test_cluster_ops,
test_cluster_concurrency, test_cluster_chronos): a kairosd node of a
private PostgreSQL (pg_fixture.py) on this host, and the main() that runs a
unittest module against such a server.

    node = Node(root, "n1", conninfo, {"job": {...}}, lease_sec=3)
    node.start(); node.ctl("list"); node.close(graceful=True)

    sys.exit(run_tests(lambda pg: globals().__setitem__("PG", pg)))
"""
import json
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
from kairos_harness import KAIROSCTL, Daemon, NotifySocket, write_config  # noqa: E402

SKIP = 77
SERVER = None   # the pg_fixture.PgServer of run_tests


def wait_for(cond, what, timeout=60.0):
    """Poll cond until it returns something true (returned), or fail."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError("timed out waiting for %s (last: %r)" % (what, last))


class Node:
    """A kairosd node named name in root/name, on the database conninfo,
    with the schedules {name: {"Section": {key: value}}}."""

    def __init__(self, root, name, conninfo, schedules, lease_sec):
        self.name = name
        self.dir = os.path.join(root, name)
        os.makedirs(self.dir)
        self.state = os.path.join(self.dir, "state")
        extra = ("[Cluster]\nBackend=postgres\nConnectionString=%s\nNodeName=%s\n"
                 "LeaseSec=%d\n" % (conninfo, name, lease_sec))
        self.conf = write_config(self.dir, self.state, schedules, daemon_extra=extra)
        self.daemon = None
        self.notify = None
        self.starts = 0

    def start(self):
        self.starts += 1
        ndir = os.path.join(self.dir, "notify%d" % self.starts)
        os.makedirs(ndir)
        self.notify = NotifySocket(ndir)
        self.daemon = Daemon(self.state, config=self.conf, notify=self.notify)
        try:
            self.notify.wait_ready(timeout=60)
        except TimeoutError:
            self.daemon.kill()
            raise AssertionError("%s is not ready:\n%s" % (self.name, self.daemon.log()[-4000:]))

    def close(self, graceful=False):
        """Stop it (SIGTERM and wait, or SIGKILL); the exit status of a
        graceful stop, else None."""
        rc = None
        if self.daemon:
            if graceful:
                rc = self.daemon.stop()
            else:
                self.daemon.kill()
            self.daemon.proc.stderr.close()
        if self.notify:
            self.notify.close()
        self.daemon = self.notify = None
        return rc

    def ctl(self, *args):
        """kairosctl --json ARGS: (exit status, the parsed reply, stderr)."""
        p = subprocess.run([KAIROSCTL, "--socket", self.daemon.socket_path, "--json", *args],
                           capture_output=True, text=True, timeout=90)
        try:
            out = json.loads(p.stdout) if p.stdout.strip() else None
        except ValueError:
            out = p.stdout
        return p.returncode, out, p.stderr

    def text(self, *args):
        return subprocess.run([KAIROSCTL, "--socket", self.daemon.socket_path, *args],
                              capture_output=True, text=True, timeout=90)

    def rows(self):
        """{id: row} of kairosctl list."""
        rc, out, err = self.ctl("list")
        if rc != 0:
            raise AssertionError("kairosctl list on %s: %s" % (self.name, err))
        return {r["id"]: r for r in out["mandates"]}


def run_tests(set_server):
    """main() of a test module: skipped (77, with the reason) without
    PostgreSQL support in the build (KAIROS_PGSTORE_TEST empty) or without
    the server binaries, or when every test skipped itself; else the
    module's tests against one private server, handed to set_server first;
    the server log's end after a failure."""
    if not os.environ.get("KAIROS_PGSTORE_TEST", ""):
        print("SKIP: built without -Dpostgres=enabled", file=sys.stderr)
        return SKIP
    bindir = pg_fixture.find_bindir()
    if not bindir:
        print("SKIP: " + pg_fixture.skip_reason(), file=sys.stderr)
        return SKIP
    global SERVER
    with pg_fixture.PgServer(bindir) as pg:
        SERVER = pg
        set_server(pg)
        prog = unittest.main(argv=[sys.argv[0], "-v"] + sys.argv[1:], exit=False)
        ok = prog.result.wasSuccessful()
        if ok and prog.result.skipped and not prog.result.testsRun - len(prog.result.skipped):
            return SKIP
        if not ok:
            sys.stderr.write("--- the server log's end ---\n" +
                             "\n".join(pg.server_log().splitlines()[-40:]) + "\n")
    return 0 if ok else 1


class TwoNodes(unittest.TestCase):
    """Two nodes, n1 and n2 (make_node), started on a database of their
    own (prefix: its name's) in a temporary directory with an "out"
    directory anyone may write to; both stopped gracefully afterwards, and
    each must exit 0 (under ASan: no leak).  DEBUG: an environment variable
    that prints the nodes' logs."""
    prefix = "two"
    DEBUG = "TWO_NODES_DEBUG"

    def make_node(self, name):
        raise NotImplementedError

    def setUp(self):
        self.db = "%s_%d_%d" % (self.prefix, os.getpid(), int(time.monotonic() * 1000) % 100000)
        self.ci = SERVER.createdb(self.db)
        r = subprocess.run([os.environ["KAIROSD"], "--init-db", self.ci], capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.dir = tempfile.mkdtemp(prefix="kairos-%s-" % self.prefix)
        os.chmod(self.dir, 0o755)
        self.out = os.path.join(self.dir, "out")
        os.makedirs(self.out)
        os.chmod(self.out, 0o777)
        self.n1 = self.make_node("n1")
        self.n2 = self.make_node("n2")
        self.n1.start()
        self.n2.start()

    def tearDown(self):
        logs = ""
        rcs = {}
        for n in (self.n1, self.n2):
            if n.daemon:
                d = n.daemon
                rcs[n.name] = n.close(graceful=True)
                logs += "--- %s ---\n%s" % (n.name, d.log()[-3000:])
        if os.environ.get(self.DEBUG):
            print(logs, file=sys.stderr)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.assertEqual(set(rcs.values()) - {0}, set(), "%r\n%s" % (rcs, logs))

    def sql(self, q):
        return SERVER.psql(self.db, q)

    def db_row(self, mid):
        """(status, owner, epoch) of the mandate's row, or None."""
        rows = self.sql("SELECT status, owner, epoch FROM kairos_mandate WHERE mandate_id = "
                        "'%s'" % mid)
        return tuple(rows[0]) if rows else None
