# SPDX-License-Identifier: MIT
"""A private PostgreSQL primary with a synchronous standby (pg_fixture.py's
servers: initdb, pg_ctl, Unix sockets in temporary directories, as
`nobody` under root), for the failover tests.

    with PgPair() as pair:
        pair.createdb("t1")
        pair.conninfo("t1")  # "host=/tmp/kpgA,/tmp/kpgB port=5432,5432 ...
                             #  target_session_attrs=read-write"
        pair.kill_primary()  # kill -9 of the primary's postmaster, or
        pair.fence_primary() # the primary made read-only (sessions stay)
        pair.promote()       # pg_ctl promote of the standby: the new primary
        pair.rebuild_standby()  # the old primary's place: a synchronous
                                # standby of the new one (pg_basebackup -R)

The two servers keep their places (socket directories): the connection
string names both, in order, and libpq finds the one that accepts writes.
synchronous_standby_names is set with ALTER SYSTEM on the primary once its
standby streams (then synchronous_commit=on waits for the standby's flush);
a new standby's copy of that setting is dropped (a promoted standby without
one of its own would wait for ever).
"""
import os
import re
import shutil
import signal
import tempfile
import time

import pg_fixture

PORT = pg_fixture.PORT


class _Server(pg_fixture.PgServer):
    """A PgServer in a place (socket directory) made empty, started from
    initdb (primary) or from pg_basebackup of another server (standby)."""

    def make_dir(self):
        self.dir = tempfile.mkdtemp(prefix="kpg", dir="/tmp")
        if self.user:
            os.chown(self.dir, *self.user)
        os.chmod(self.dir, 0o755)
        self.data = os.path.join(self.dir, "data")
        self.log = os.path.join(self.dir, "server.log")

    def start(self):
        self.make_dir()
        self._run([os.path.join(self.bindir, "initdb"), "-D", self.data, "-U",
                   pg_fixture.SUPERUSER, "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync",
                   "--no-instructions"])
        self._pg_start()
        return self

    def start_standby_of(self, primary):
        """Empty this place's data, copy primary's (pg_basebackup -R: the
        standby's primary_conninfo and standby.signal) and start it."""
        if self.dir is None:
            self.make_dir()
        shutil.rmtree(self.data, ignore_errors=True)
        self._run([os.path.join(self.bindir, "pg_basebackup"), "-h", primary.dir, "-p",
                   str(PORT), "-U", pg_fixture.SUPERUSER, "-D", self.data, "-R", "-X", "stream",
                   "--no-sync", "-c", "fast"])
        auto = os.path.join(self.data, "postgresql.auto.conf")
        with open(auto) as f:
            kept = [line for line in f if not line.startswith("synchronous_standby_names")]
        # (a standby whose primary died waits wal_retrieve_retry_interval,
        # 5 s by default, before it looks at a promotion request)
        kept.append("wal_retrieve_retry_interval = '100ms'\n")
        with open(auto, "w") as f:
            f.writelines(kept)
        for lock in (os.path.join(self.data, "postmaster.pid"),
                     os.path.join(self.dir, ".s.PGSQL.%d.lock" % PORT)):
            try:
                os.unlink(lock)
            except FileNotFoundError:
                pass
        self._pg_start()

    def postmaster_pid(self):
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            return int(f.readline())


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class PgPair:
    def __init__(self, bindir=None):
        self.bindir = bindir or pg_fixture.find_bindir()
        if not self.bindir:
            raise RuntimeError(pg_fixture.skip_reason())
        self.primary = _Server(self.bindir)
        self.standby = _Server(self.bindir)

    def start(self):
        self.primary.start()
        self.standby.start_standby_of(self.primary)
        self.make_synchronous()
        return self

    def make_synchronous(self, timeout=60):
        """synchronous_standby_names='*' on the primary, once its standby
        streams; returns when pg_stat_replication says sync."""
        self.primary.psql("postgres", "ALTER SYSTEM SET synchronous_standby_names = '*'")
        self.primary.psql("postgres", "SELECT pg_reload_conf()")
        deadline = time.monotonic() + timeout
        while True:
            rows = self.primary.psql("postgres", "SELECT sync_state FROM pg_stat_replication")
            if ["sync"] in rows:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the standby is not synchronous: %r\n%s" % (
                    rows, self.standby.server_log()[-2000:]))
            time.sleep(0.05)

    def synchronous(self):
        """Whether the primary has a synchronous standby streaming."""
        try:
            return ["sync"] in self.primary.psql("postgres",
                                                 "SELECT sync_state FROM pg_stat_replication")
        except RuntimeError:
            return False

    def stop(self):
        for s in (self.standby, self.primary):
            try:
                s.stop()
            except RuntimeError:
                pass

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()

    def conninfo(self, db="postgres"):
        # (the places in a fixed order: libpq tries both, the one that
        # takes writes wins, whichever it is)
        a, b = sorted((self.primary.dir, self.standby.dir))
        return ("host=%s,%s port=%d,%d user=%s dbname=%s target_session_attrs=read-write"
                % (a, b, PORT, PORT, pg_fixture.SUPERUSER, db))

    def psql(self, db, sql, check=True):
        return self.primary.psql(db, sql, check)

    def createdb(self, name):
        self.primary.psql("postgres", 'CREATE DATABASE "%s"' % name)
        # (libpq tries no further host after a server's "database does
        # not exist": the standby must have replayed it)
        deadline = time.monotonic() + 60
        while not self.standby.psql("postgres", "SELECT 1 FROM pg_database WHERE datname = "
                                    "'%s'" % name):
            if time.monotonic() > deadline:
                raise RuntimeError("the standby does not replay CREATE DATABASE")
            time.sleep(0.02)
        return self.conninfo(name)

    def kill_primary(self):
        """kill -9 of the primary's postmaster (its backends end by
        themselves, as PostgreSQL's do on a postmaster's death); returns
        once the postmaster is gone."""
        pid = self.primary.postmaster_pid()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while _alive(pid):
            if time.monotonic() > deadline:
                raise RuntimeError("the postmaster outlives SIGKILL")
            time.sleep(0.01)
        self.primary.running = False

    def fence_primary(self):
        """The primary turned read-only while it runs (ALTER SYSTEM SET
        default_transaction_read_only, reloaded), as a switchover fences
        the old primary: its sessions stay connected, their writes fail
        with SQLSTATE 25006."""
        self.primary.psql("postgres", "ALTER SYSTEM SET default_transaction_read_only = on")
        self.primary.psql("postgres", "SELECT pg_reload_conf()")
        # a new session forked with it: the postmaster has reloaded and
        # signalled every session (each reloads before its next command)
        deadline = time.monotonic() + 30
        while self.primary.psql("postgres", "SHOW default_transaction_read_only") != [["on"]]:
            if time.monotonic() > deadline:
                raise RuntimeError("the primary does not turn read-only")
            time.sleep(0.01)

    def promote(self):
        """pg_ctl promote -w of the standby; it is the primary from then
        on (and the dead one the standby to rebuild)."""
        self.standby._run([os.path.join(self.bindir, "pg_ctl"), "-D", self.standby.data, "-w",
                           "-t", "60", "promote"])
        self.primary, self.standby = self.standby, self.primary

    def rebuild_standby(self):
        """The dead server's place becomes a synchronous standby of the
        primary: stopped if it runs (fenced), its orphaned backends gone,
        its data copied anew."""
        if self.standby.running:
            self.standby._run([os.path.join(self.bindir, "pg_ctl"), "-D", self.standby.data,
                               "-m", "immediate", "-w", "-t", "60", "stop"])
            self.standby.running = False
        deadline = time.monotonic() + 30
        while self._orphans():
            if time.monotonic() > deadline:
                raise RuntimeError("the killed server's backends do not end")
            time.sleep(0.05)
        self.standby.start_standby_of(self.primary)
        self.make_synchronous()

    def _orphans(self):
        """pids of processes still using the dead server's data directory."""
        pids = []
        for p in os.listdir("/proc"):
            if not p.isdigit():
                continue
            try:
                with open("/proc/%s/cmdline" % p, "rb") as f:
                    cmd = f.read().decode(errors="replace")
                if re.search(re.escape(self.standby.dir) + "(/|\\x00|$)", cmd) or \
                        os.readlink("/proc/%s/cwd" % p).startswith(self.standby.dir):
                    if _alive(int(p)):
                        pids.append(int(p))
            except OSError:
                pass
        return pids
