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
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import pg_fixture  # noqa: E402
from kairos_harness import KAIROSCTL, Daemon, NotifySocket, write_config  # noqa: E402

SKIP = 77


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
    with pg_fixture.PgServer(bindir) as pg:
        set_server(pg)
        prog = unittest.main(argv=[sys.argv[0], "-v"] + sys.argv[1:], exit=False)
        ok = prog.result.wasSuccessful()
        if ok and prog.result.skipped and not prog.result.testsRun - len(prog.result.skipped):
            return SKIP
        if not ok:
            sys.stderr.write("--- the server log's end ---\n" +
                             "\n".join(pg.server_log().splitlines()[-40:]) + "\n")
    return 0 if ok else 1
