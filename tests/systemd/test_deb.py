#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The Debian package in a booted Debian 12: build kairos_<version>_amd64.deb
with `dpkg-buildpackage -us -uc -b` from a clean copy of the source (once per
source state: cached in WORK_DIR by a hash of the source files), check it
with lintian (no errors), then in a systemd-nspawn container: `apt install
./kairos_*.deb` (user, directories, unit enabled and started with its
Status= line, conffile, journal catalog), run the demo schedule from
/usr/share/kairos/examples, upgrade to a copy with a higher version (state,
mandates and the admin's conffile edit survive; the service is restarted),
cluster mode (below), remove (state kept), purge (state and configuration
gone).

Cluster mode: the package is built with it (libpq5 through shlibs), so the
installed kairosd runs as a node with `[Cluster] Backend=postgres`.  The
PostgreSQL server is not installed in the container (that would make the
cached root larger and its build slower for one test): the test starts a
private one on the host (tests/cluster/pg_fixture.py, Unix socket only, no
TCP port) before the container boots, and bind-mounts its socket directory
at PG_DIR in the container's root, where the packaged kairosd connects to
it like to any local server.  `kairosd --init-db` from the package creates
the schema; the node restarts into cluster mode, reaches READY, `kairosctl
status` shows its node and lease, and the demo fired on it ends done, with
its mandate and its tool call in the database at epoch 1.

    test_deb.py SOURCE_DIR WORK_DIR

The container is the one of test_systemd.py (Debian root built once by
build-root.sh, booted as an overlay).  Exit 0 pass, 1 fail, 77 skipped (not
root, packaging tools missing, or systemd-nspawn cannot boot a container).
"""
import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_systemd as ts  # noqa: E402  (the container harness)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cluster"))
import pg_fixture  # noqa: E402  (a private PostgreSQL server)
from test_systemd import Container, Failed, Skip, check, log, run  # noqa: E402

SKIP = 77
UNIT = "kairosd.service"
PG_DIR = "/srv/kairos-pg"  # the host's PostgreSQL socket directory, in the container
NODE = "deb-node"


def check_no_mode_warning(c, when):
    """The packaged directories have the mode kairosd wants (the setgid bit
    it may not set itself under the unit's RestrictSUIDSGID=): no start of
    kairosd warned "cannot set the mode"."""
    r = c.sh(["journalctl", "-u", "kairosd", "-o", "cat", "-q"])
    bad = [l for l in r.stdout.splitlines() if "cannot set the mode" in l]
    check(not bad, f"{when}: kairosd started without a warning about the state "
          f"directory's mode ({bad[:4]})")


def source_files(src):
    """The files of a clean checkout: tracked plus untracked-not-ignored (so a
    test of uncommitted work packages that work), never build directories."""
    r = run(["git", "-C", src, "ls-files", "-z", "--cached", "--others",
             "--exclude-standard"], check=False)
    if r.returncode != 0:
        raise Skip(f"{src} is not a git checkout: cannot tell source from build files")
    return sorted(p for p in r.stdout.split("\0")
                  if p and os.path.isfile(os.path.join(src, p)))


def source_hash(src, files):
    h = hashlib.sha256()
    for p in files:
        full = os.path.join(src, p)
        h.update(p.encode() + b"\0" + (b"x" if os.access(full, os.X_OK) else b"-"))
        with open(full, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()[:16]


def debian_version(src):
    with open(os.path.join(src, "debian/changelog")) as f:
        m = re.match(r"kairos \(([^)]+)\)", f.readline())
    if not m:
        raise Failed("debian/changelog: no version on its first line")
    return m.group(1)


def build_package(src, work):
    """Return (deb, upgrade_deb): the package built from src, and a copy of
    it with a higher version for the upgrade.  Built once per source hash."""
    files = source_files(src)
    digest = source_hash(src, files)
    version = debian_version(src)
    pkgdir = os.path.join(work, f"pkg-{digest}")
    deb = os.path.join(pkgdir, f"kairos_{version}_amd64.deb")
    newer = os.path.join(pkgdir, f"kairos_{version}+upgrade1_amd64.deb")
    done = os.path.join(pkgdir, ".complete")
    if os.path.exists(done):
        log(f"package of source {digest} already built: {deb}")
        return deb, newer
    for d in os.listdir(work):  # packages of older source states
        if d.startswith("pkg-"):
            shutil.rmtree(os.path.join(work, d), ignore_errors=True)
    tree = os.path.join(pkgdir, f"kairos-{version}")
    os.makedirs(tree)
    for p in files:
        os.makedirs(os.path.dirname(os.path.join(tree, p)), exist_ok=True)
        shutil.copy2(os.path.join(src, p), os.path.join(tree, p))
    t = time.monotonic()
    blog = os.path.join(pkgdir, "dpkg-buildpackage.log")
    with open(blog, "w") as out:
        # parallel=: dh builds with one job unless told
        env = dict(os.environ, DEB_BUILD_OPTIONS=f"parallel={os.cpu_count() or 1}")
        r = subprocess.run(["dpkg-buildpackage", "-us", "-uc", "-b"], cwd=tree, env=env,
                           stdout=out, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        with open(blog) as f:
            tail = "".join(f.readlines()[-40:])
        raise Failed(f"dpkg-buildpackage -us -uc -b: exit {r.returncode}\n{tail}")
    log(f"dpkg-buildpackage -us -uc -b ({time.monotonic() - t:.1f} s)")
    dbgsym = os.path.join(pkgdir, f"kairos-dbgsym_{version}_amd64.deb")
    check(os.path.exists(deb) and os.path.exists(dbgsym),
          f"built {os.path.basename(deb)} and {os.path.basename(dbgsym)}")
    # The upgrade: the same files with a higher version (a rebuild would
    # only cost time and prove nothing more to dpkg).
    unpacked = os.path.join(pkgdir, "upgrade")
    run(["dpkg-deb", "-R", deb, unpacked])
    ctl = os.path.join(unpacked, "DEBIAN/control")
    with open(ctl) as f:
        text = f.read()
    with open(ctl, "w") as f:
        f.write(re.sub(r"(?m)^Version: .*$", f"Version: {version}+upgrade1", text))
    run(["dpkg-deb", "--root-owner-group", "-b", unpacked, newer])
    shutil.rmtree(unpacked)
    shutil.rmtree(tree)
    open(done, "w").close()
    return deb, newer


def lint(deb):
    """lintian on the .changes of the build (the package and its dbgsym)."""
    t = time.monotonic()
    changes = re.sub(r"\.deb$", ".changes", deb)
    r = run(["lintian", "--fail-on", "error", changes], check=False)
    out = [line for line in r.stdout.splitlines() if "root privileges" not in line]
    errors = [line for line in out if line.startswith("E:")]
    check(r.returncode == 0 and not errors,
          f"lintian: no errors ({time.monotonic() - t:.1f} s)"
          + "".join("\n" + line for line in out))


def status_text(c):
    return c.sh(["systemctl", "status", "--no-pager", "-n", "0", UNIT], check=False).stdout


def check_running(c, what):
    out = status_text(c)
    m = re.search(r'^\s*Status: "(.*)"$', out, re.M)
    check("Active: active (running)" in out and m is not None and
          re.match(r"\d+ mandates running, \d+ runnable, \d+ paused for review", m.group(1)),
          f"{what}: systemctl status kairosd: active (running), Status: "
          f"{m.group(1) if m else None!r}" + ("" if m else "\n" + out))


def state_files(c):
    r = c.sh(["find", "/var/lib/kairos", "-type", "f"])
    return set(r.stdout.split())


def test_cluster(c, pg):
    """The installed kairosd as a cluster node on the PostgreSQL at PG_DIR."""
    pg.createdb("kairos")
    conninfo = f"host={PG_DIR} port={pg_fixture.PORT} user={pg_fixture.SUPERUSER} dbname=kairos"
    # --init-db from the package, as the daemon's user, before any node.
    r = c.sh(["runuser", "-u", "kairos", "--", "kairosd", "--init-db", conninfo], check=False)
    check(r.returncode == 0 and re.search(r"created at version \d+", r.stdout + r.stderr),
          f"kairosd --init-db from the package: {(r.stdout + r.stderr).strip()!r}")
    c.write("/etc/kairos/kairosd.conf.d/50-cluster.conf",
            f"[Cluster]\nBackend=postgres\nConnectionString={conninfo}\nNodeName={NODE}\n"
            "LeaseSec=10\n")
    c.sh(["kairosd", "--check-config"])
    # Type=notify: restart returns once the node sent READY=1.
    t = time.monotonic()
    r = c.sh(["systemctl", "restart", UNIT], check=False)
    check(r.returncode == 0, f"kairosd restarted as node {NODE} and reached READY "
          f"({time.monotonic() - t:.1f} s)" + ("" if r.returncode == 0 else
                                              f"\n{r.stdout}{r.stderr}\n{status_text(c)}"))
    check_running(c, "in cluster mode")
    _, st = c.ctl("status")
    cl = (st or {}).get("cluster") or {}
    check(cl.get("backend") == "postgres" and cl.get("node") == NODE and
          cl.get("lease_sec") == 10 and cl.get("lease_left_ms", 0) > 0 and
          cl.get("may_act") is True and
          [n.get("node") for n in cl.get("nodes", [])] == [NODE],
          f"kairosctl status: cluster node {NODE}, lease 10 s, acting ({cl})")
    text = c.sh(["kairosctl", "status"]).stdout
    check(re.search(rf"^Cluster node: +{NODE} \(PostgreSQL\), lease 10 s, \d+\.\d s left, ",
                    text, re.M), "kairosctl status (text) shows the node and its lease")
    cur = c.cursor()
    _, fired = c.ctl("fire", "demo")
    mid = fired["mandate"]
    rec = c.wait_journal(ts.mandate_done(mid), f"the demo mandate {mid} on node {NODE}",
                         matches=[f"MANDATE_ID={mid}"], after=cur, timeout=120)
    check(f"mandate {mid} done" in rec["MESSAGE"] and rec.get("NODE") == NODE,
          f"the demo fired on node {NODE} is done ({rec['MESSAGE']!r})")
    rows = pg.psql("kairos", "SELECT status, owner, epoch FROM kairos_mandate "
                   f"WHERE mandate_id = '{mid}'")
    check(rows == [["succeeded", NODE, "1"]],
          f"the database holds mandate {mid}: succeeded by {NODE} at epoch 1 ({rows})")
    rows = pg.psql("kairos", "SELECT tool, state, owner, epoch FROM kairos_idem "
                   f"WHERE mandate_id = '{mid}'")
    check(rows and all(r[1:] == ["completed", NODE, "1"] for r in rows),
          f"its tool calls were claimed in the database at epoch 1 ({rows})")


def test(c, src, deb, newer, version, pg):
    for p in (deb, newer):
        shutil.copy(p, c.path("/root/"))
    name, newname = os.path.basename(deb), os.path.basename(newer)
    apt = ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-y", "-q"]

    # --- install ---------------------------------------------------------
    t = time.monotonic()
    r = c.sh(apt + ["install", f"/root/{name}"], check=False, timeout=300)
    check(r.returncode == 0, f"apt install ./{name} ({time.monotonic() - t:.1f} s)"
          + ("" if r.returncode == 0 else f"\n{r.stdout}{r.stderr}"))
    check(c.sh(["dpkg-query", "-W", "-f=${Status} ${Version}", "kairos"]).stdout ==
          f"install ok installed {version}", "dpkg: kairos installed")
    check(c.sh(["id", "-un", "kairos"], check=False).stdout.strip() == "kairos",
          "the system user kairos exists (sysusers.d, postinst)")
    check(c.sh(["id", "-Gn", "kairos-handler"], check=False).stdout.split() ==
          ["kairos-handler", "kairos"],
          "the handlers' user kairos-handler exists, a member of group kairos (sysusers.d)")
    dirs = ["/var/lib/kairos", "/var/lib/kairos/wal", "/var/lib/kairos/handlers",
            "/etc/kairos/schedules.d", "/etc/kairos/kairosd.conf.d"]
    st = c.sh(["stat", "-c", "%U:%G %a"] + dirs).stdout.split("\n")
    check(st[:5] == ["kairos:kairos 2750", "kairos:kairos 2750", "kairos-handler:kairos 750",
                     "root:root 755", "root:root 755"],
          f"tmpfiles.d created the directories ({dict(zip(dirs, st))})")
    conffiles = c.sh(["dpkg-query", "-W", "-f=${Conffiles}", "kairos"]).stdout
    check("/etc/kairos/kairosd.conf " in conffiles, "/etc/kairos/kairosd.conf is a conffile")
    check(c.sh(["systemctl", "is-enabled", UNIT], check=False).stdout.strip() == "enabled",
          "kairosd.service is enabled (dh_installsystemd)")
    check_running(c, "after install")
    check_no_mode_warning(c, "after install")
    for p in ("/usr/share/man/man8/kairosd.8.gz", "/usr/share/man/man1/kairosctl.1.gz",
              "/usr/share/bash-completion/completions/kairosctl",
              "/usr/share/kairos/examples/demo.conf", "/usr/lib/systemd/catalog/kairos.catalog"):
        check(os.path.exists(c.path(p)), f"installed {p}")
    # The catalog was compiled by systemd's dpkg trigger (journalctl
    # --update-catalog); the record names its call site.
    ts.check_journal_record(c, src)

    # --- the demo schedule (as README.md sets it up) ----------------------
    c.sh(["install", "-d", "-o", "kairos", "-g", "kairos", "/var/lib/kairos/demo-outbox"])
    c.sh(["cp", "/usr/share/kairos/examples/demo.conf", "/etc/kairos/schedules.d/"])
    c.write("/etc/kairos/kairosd.conf.d/demo.conf",
            "[Idempotency]\nWriteRoots=/var/lib/kairos/demo-outbox\n")
    c.sh(["systemctl", "reload", UNIT])
    cur = c.cursor()
    _, fired = c.ctl("fire", "demo")
    mid = fired["mandate"]
    rec = c.wait_journal(ts.mandate_done(mid), f"the demo mandate {mid}",
                         matches=[f"MANDATE_ID={mid}"], after=cur, timeout=120)
    outbox = sorted(c.sh(["ls", "/var/lib/kairos/demo-outbox"]).stdout.split())
    check(f"mandate {mid} done" in rec["MESSAGE"] and f"{mid}_act_001" in outbox,
          f"the demo from /usr/share/kairos/examples is done: {outbox}")

    # --- upgrade over itself -----------------------------------------------
    with open(c.path("/etc/kairos/kairosd.conf"), "a") as f:
        f.write("# edited by the admin\n")
    before = state_files(c)
    pid = c.show("MainPID")["MainPID"]
    t = time.monotonic()
    r = c.sh(apt + ["install", f"/root/{newname}"], check=False, timeout=300)
    check(r.returncode == 0, f"apt install ./{newname} upgrades "
          f"({time.monotonic() - t:.1f} s)" + ("" if r.returncode == 0 else
                                               f"\n{r.stdout}{r.stderr}"))
    check(c.sh(["dpkg-query", "-W", "-f=${Version}", "kairos"]).stdout ==
          f"{version}+upgrade1", f"dpkg: kairos {version}+upgrade1 installed")
    st = c.wait_active("after the upgrade")
    check(c.show("MainPID")["MainPID"] != pid, "the upgrade restarted kairosd")
    check_running(c, "after the upgrade")
    check_no_mode_warning(c, "after the upgrade")
    after = state_files(c)
    check(before <= after, f"the upgrade kept the state: {len(before)} files in "
          f"/var/lib/kairos before, all there after ({len(after)})")
    _, shown = c.ctl("show", mid)
    check(shown["status"] == "done", f"kairosctl show {mid}: still done after the upgrade")
    with open(c.path("/etc/kairos/kairosd.conf")) as f:
        check(f.read().endswith("# edited by the admin\n"),
              "the upgrade kept the admin's edit of the conffile")

    test_cluster(c, pg)

    # --- remove, then purge -------------------------------------------------
    before = state_files(c)
    c.sh(apt + ["remove", "kairos"], timeout=300)
    check(c.show("ActiveState")["ActiveState"] in ("inactive", ""), "remove stopped kairosd")
    check(state_files(c) >= before and os.path.exists(c.path("/etc/kairos/kairosd.conf")),
          "remove (no purge) keeps /var/lib/kairos and /etc/kairos/kairosd.conf")
    c.sh(apt + ["purge", "kairos"], timeout=300)
    check(c.sh(["dpkg-query", "-W", "-f=${Status}", "kairos"], check=False).stdout.strip()
          in ("", "unknown ok not-installed"), "dpkg: kairos purged")
    gone = [p for p in ("/var/lib/kairos", "/etc/kairos", "/lib/systemd/system/kairosd.service",
                        "/etc/systemd/system/multi-user.target.wants/kairosd.service")
            if os.path.lexists(c.path(p))]
    check(not gone, f"purge removed the state, the configuration and the unit (left: {gone})")
    check(not c.processes(["/usr/sbin/kairosd"]), "no kairosd left running")


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 64
    src, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    if os.geteuid() != 0:
        print("SKIP: booting a container with systemd-nspawn needs root", file=sys.stderr)
        return SKIP
    for tool in ("systemd-nspawn", "debootstrap", "nsenter", "dpkg-buildpackage", "dh",
                 "lintian", "git"):
        if not shutil.which(tool):
            print(f"SKIP: {tool} is not installed (tests/install-deps.sh --test installs it)",
                  file=sys.stderr)
            return SKIP
    if not pg_fixture.find_bindir():
        print(f"SKIP: {pg_fixture.skip_reason()}", file=sys.stderr)
        return SKIP
    os.makedirs(work, exist_ok=True)
    t0 = time.monotonic()
    try:
        deb, newer = build_package(src, work)
        lint(deb)
    except Skip as e:
        print(f"SKIP: {e}", file=sys.stderr)
        return SKIP
    except Failed as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    version = debian_version(src)

    cache = os.environ.get("KAIROS_TEST_ROOT_CACHE", "/var/cache/kairos-test-root")
    t = time.monotonic()
    r = run(["bash", os.path.join(src, "tests/systemd/build-root.sh"), cache], check=False)
    if r.returncode != 0:
        print(f"FAIL: cannot build the Debian root:\n{r.stdout}", file=sys.stderr)
        return 1
    root = r.stdout.strip().splitlines()[-1]
    log(f"Debian root {root} ({time.monotonic() - t:.1f} s)")
    lock = open(os.path.join(cache, "test.lock"), "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    ts.cleanup_stale()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("FAIL: terminated (timeout?)"))
    c = Container(root, tempfile.mkdtemp(prefix="kairos-nspawn-", dir="/var/tmp"))
    pg = pg_fixture.PgServer()
    pgmount = None
    try:
        c.prepare()
        t = time.monotonic()
        pg.start()
        # Before the boot: the container gets the bind mount with its root.
        pgmount = c.path(PG_DIR)
        os.makedirs(pgmount)
        run(["mount", "--bind", pg.dir, pgmount])
        log(f"PostgreSQL on the host, its socket at {PG_DIR} in the container "
            f"({time.monotonic() - t:.1f} s)")
        c.boot()
        test(c, src, deb, newer, version, pg)
    except Skip as e:
        print(f"SKIP: systemd-nspawn cannot boot a container here: {e}", file=sys.stderr)
        return SKIP
    except Failed as e:
        print(f"FAIL: {e}", file=sys.stderr)
        if c.pid:
            r = c.sh(["journalctl", "-n", "80", "--no-pager"], check=False)
            print("--- journalctl (last 80) ---\n" + r.stdout, file=sys.stderr)
        return 1
    except RuntimeError as e:  # the private PostgreSQL (pg_fixture)
        print(f"FAIL: {e}\n--- PostgreSQL's log ---\n{pg.server_log()[-3000:]}",
              file=sys.stderr)
        return 1
    finally:
        if pgmount and run(["umount", pgmount], check=False).returncode != 0:
            run(["umount", "-l", pgmount], check=False)
        c.teardown()
        pg.stop()
        log("container torn down")
    log(f"all package checks passed ({time.monotonic() - t0:.1f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
