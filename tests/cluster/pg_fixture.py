# SPDX-License-Identifier: MIT
"""A private PostgreSQL server for tests: initdb and pg_ctl in a temporary
directory, listening only on a Unix socket in that directory (no TCP port,
so parallel tests never collide), run as an unprivileged user (PostgreSQL
refuses root: as root the server runs as `nobody`), stopped and removed on
exit.

    with PgServer() as pg:
        pg.createdb("t1")
        pg.conninfo("t1")   # "host=/tmp/kpg... port=5432 user=kairos dbname=t1"
        pg.psql("t1", "SELECT 1")

find_bindir() returns None if the server binaries are missing; tests then
skip (exit 77) with skip_reason() (tests/install-deps.sh --test installs
them).
"""
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import signal

PORT = 5432


def _ppid(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _alive(pid):
    """pid exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
SUPERUSER = "kairos"


def find_bindir():
    """Directory holding initdb, pg_ctl and postgres, or None."""
    env = os.environ.get("KAIROS_PG_BINDIR")
    cands = [env] if env else []
    # Debian keeps the server binaries out of PATH, one directory per version.
    cands += sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                    key=lambda p: int(p.split("/")[-2]) if p.split("/")[-2].isdigit() else 0,
                    reverse=True)
    which = shutil.which("initdb")
    if which:
        cands.append(os.path.dirname(os.path.realpath(which)))
    for d in cands:
        if all(os.access(os.path.join(d, b), os.X_OK) for b in ("initdb", "pg_ctl", "postgres")):
            return d
    return None


def skip_reason():
    return ("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found under "
            "/usr/lib/postgresql/*/bin or PATH; tests/install-deps.sh --test installs "
            "the postgresql package")


class PgServer:
    def __init__(self, bindir=None):
        self.bindir = bindir or find_bindir()
        if not self.bindir:
            raise RuntimeError(skip_reason())
        self.dir = None
        self.running = False
        self.user = None
        if os.geteuid() == 0:
            pw = pwd.getpwnam("nobody")
            self.user = (pw.pw_uid, pw.pw_gid)

    # --- running the server's programs as the unprivileged user ----------
    def _run(self, argv, **kw):
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.STDOUT)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 120)
        if self.user:
            kw["user"], kw["group"] = self.user
            kw["extra_groups"] = []
        env = dict(os.environ, LC_ALL="C", TZ="UTC")
        env.pop("PGDATA", None)
        r = subprocess.run(argv, env=env, cwd=self.dir, **kw)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}:\n{r.stdout}")
        return r

    def start(self):
        # Short path: the socket path must fit in sun_path (107 bytes).
        self.dir = tempfile.mkdtemp(prefix="kpg", dir="/tmp")
        if self.user:
            os.chown(self.dir, *self.user)
        os.chmod(self.dir, 0o755)
        self.data = os.path.join(self.dir, "data")
        self.log = os.path.join(self.dir, "server.log")
        self._run([os.path.join(self.bindir, "initdb"), "-D", self.data, "-U", SUPERUSER,
                   "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"])
        self._pg_start()
        return self

    def _pg_start(self):
        opts = (f"-k {self.dir} -p {PORT} -c listen_addresses='' -c fsync=off "
                "-c full_page_writes=off -c max_connections=60 -c shared_buffers=16MB "
                "-c log_min_messages=warning")
        self._run([os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-l", self.log,
                   "-o", opts, "-w", "-t", "60", "start"])
        self.running = True

    def crash(self):
        """kill -9 the postmaster (and its children, as a host crash would
        leave none), waiting until every one is gone; start() again on the
        same data directory."""
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            pm = int(f.readline())
        kids = [int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == pm]
        for pid in [pm] + kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in [pm] + kids):
            if time.monotonic() > deadline:
                raise RuntimeError("the postmaster's processes outlive SIGKILL")
            time.sleep(0.02)
        # (a zombie not yet reaped still answers kill(pid, 0): the new
        # postmaster would take the dead one's lock files for a live one's)
        for lock in (os.path.join(self.data, "postmaster.pid"),
                     os.path.join(self.dir, ".s.PGSQL.%d.lock" % PORT)):
            try:
                os.unlink(lock)
            except FileNotFoundError:
                pass
        self.running = False

    def restart_after_crash(self):
        self._pg_start()

    def stop(self):
        if self.dir is None:
            return
        try:
            if self.running:
                self._run([os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-m",
                           "immediate", "-w", "-t", "60", "stop"])
                self.running = False
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()

    def server_log(self):
        try:
            with open(self.log, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    # --- clients (as the calling user; trust authentication) ------------
    def conninfo(self, db="postgres"):
        return f"host={self.dir} port={PORT} user={SUPERUSER} dbname={db}"

    def psql(self, db, sql, check=True):
        """Run sql; returns the rows as lists of strings (unaligned output)."""
        psql = shutil.which("psql") or os.path.join(self.bindir, "psql")
        r = subprocess.run([psql, "-X", "-q", "-A", "-t", "-F", "\t", "-v", "ON_ERROR_STOP=1",
                            "-d", self.conninfo(db), "-c", sql],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=120)
        if check and r.returncode != 0:
            raise RuntimeError(f"psql {sql!r}: {r.stderr}")
        return [line.split("\t") for line in r.stdout.splitlines() if line != ""]

    def createdb(self, name):
        self.psql("postgres", f'CREATE DATABASE "{name}"')
        return self.conninfo(name)
