#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""WAL spares (docs/design.md §6): WAL files created ahead in wal/ as
.spare-N, made durable by the syncfs of a mandate that ends alone, taken by
the next mandate with a rename and no fsync of wal/.

- A mandate that ends alone leaves spares (at most 8), which no `list`
  counts; the next mandate's WAL is one of them.
- kill -9 right after a fire's reply (its handler running), then the WAL put
  back under a spare's name by hand: the state a crash leaves when the
  rename was lost.  kairosctl list/show --state-dir see the mandate there,
  recover --dry-run counts that spare as the WAL it is and no other; the
  next kairosd adopts the spare (its WAL under its own name again, the
  spare gone) and lists the mandate once.
- A spare with a torn first line (never acknowledged) is removed, an empty
  one kept, and a spare holding the records of a mandate whose WAL exists
  too is left with an error, never merged: the mandate listed once.
- Whatever else has a spare's name: a FIFO, a directory, a symbolic link
  (to a file outside, to /dev/zero, dangling), a 1 GiB file, more empty
  ones than the pool holds, a name past any counter: kairosd starts, never
  blocks, never reads a huge one whole, never writes through a link, keeps
  at most 8; kairosctl list --state-dir answers.
- Spares only where a rename never synced survives a crash whole (ext4
  with a journal, xfs, btrfs, tmpfs, ...): these tests keep their state on
  such a file system (tmpfs, /dev/shm); on the test machine's temporary
  directory kairosd uses them or says why not, as its file system says."""
import datetime
import glob
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kairos_harness import Client, Daemon, NotifySocket, write_config  # noqa: E402

KAIROSCTL = os.environ.get("KAIROSCTL", "build/src/ctl/kairosctl")
CRON = {"Cron": "0 0 1 1 *"}
ONE = {"MaxCycles": "1"}


def renames_atomic(path):
    """What kairosd must decide for path (statedir_renames_atomic): by
    statfs type, and for ext4 whether its device has a jbd2 journal."""
    ftype = int(subprocess.run(["stat", "-f", "-c", "%t", path], capture_output=True,
                               text=True, check=True).stdout, 16)
    if ftype in (0x58465342, 0x9123683E, 0x2FC12FC1, 0xCA451A4E, 0x3153464A, 0x01021994,
                 0x858458F6):
        return True
    if ftype != 0xEF53:
        return False
    dev = os.stat(path).st_dev
    try:
        name = os.path.basename(os.readlink("/sys/dev/block/%d:%d"
                                            % (os.major(dev), os.minor(dev))))
    except FileNotFoundError:
        return False
    return os.path.isdir("/proc/fs/jbd2/%s-8" % name)


# tmpfs keeps a rename whole (nothing survives a reboot anyway)
ATOMIC_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and renames_atomic("/dev/shm") else None


def at(i):
    t = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc) + \
        datetime.timedelta(minutes=i)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


class TestSpares(unittest.TestCase):
    base = ATOMIC_DIR

    def setUp(self):
        if self.base is None and type(self) is TestSpares:
            self.skipTest("no tmpfs at /dev/shm")
        self.dir = tempfile.mkdtemp(prefix="kairos-spares-", dir=self.base)
        self.state = os.path.join(self.dir, "state")
        self.wal = os.path.join(self.state, "wal")
        self.pids = os.path.join(self.dir, "pids")
        block = os.path.join(self.dir, "block.sh")
        with open(block, "w") as f:
            f.write('#!/bin/sh\ncat > /dev/null\necho "$$" >> "%s"\nexec sleep 600\n'
                    % self.pids)
        os.chmod(block, 0o755)
        self.conf = write_config(self.dir, self.state, {
            # no command: each phase completes without a process (fast)
            "quick": {"Schedule": CRON, "Mandate": ONE},
            "slow": {"Schedule": CRON, "Mandate": ONE, "Exec": {"Observe": block}},
        })
        self.notify = NotifySocket(self.dir)
        self.d = None

    def tearDown(self):
        self.stop(kill=True)
        self.kill_handlers()
        self.notify.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self):
        self.notify.clear()
        self.d = Daemon(self.state, config=self.conf, notify=self.notify)
        try:
            self.notify.wait_ready(timeout=60)
        except TimeoutError:
            print(self.d.log()[-3000:], file=sys.stderr)
            raise
        return Client(self.d.socket_path, timeout=60)

    def stop(self, kill=False):
        if self.d:
            if kill:
                self.d.kill()
            else:
                self.d.stop()
            self.d.proc.stderr.close()
            self.d = None

    def kill_handlers(self):
        if os.path.exists(self.pids):
            with open(self.pids) as f:
                for line in f:
                    try:
                        os.kill(int(line), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass

    def spares(self):
        return sorted(os.path.basename(p) for p in glob.glob(os.path.join(self.wal, ".spare-*")))

    def fire(self, c, schedule, i):
        r = c.call("fire", schedule=schedule, at=at(i))
        self.assertTrue(r.get("ok") and r["result"]["fired"], r)
        return r["result"]["mandate"]

    def ids(self, c):
        r = c.call("list", limit=0)
        self.assertTrue(r.get("ok"), r)
        return [m["id"] for m in r["result"]["mandates"]]

    def ctl(self, *args):
        return subprocess.run([KAIROSCTL, "--socket", "/nonexistent", *args],
                              capture_output=True, text=True, timeout=60)

    def offline_ids(self):
        p = self.ctl("--json", "list", "--limit", "0", "--state-dir", self.state)
        self.assertEqual(p.returncode, 0, p.stderr)
        return [m["id"] for m in json.loads(p.stdout)["mandates"]]

    def wait_handler(self):
        """The slow mandate's observe runs (its pid written): its fire was
        answered and its records are durable."""
        deadline = time.monotonic() + 30
        while not (os.path.exists(self.pids) and os.path.getsize(self.pids) > 0):
            self.assertLess(time.monotonic(), deadline, "the handler never started")
            time.sleep(0.01)  # polling a file with a deadline

    def killed_mid_observe(self):
        """A quick mandate alone (it leaves spares), then a slow one whose
        WAL is a spare; kairosd killed -9 once its handler runs."""
        c = self.start()
        first = self.fire(c, "quick", 0)
        self.d.wait_log("mandate %s done after 1 cycle" % first, timeout=60)
        self.d.wait_log("WAL archived", timeout=60)
        made = self.spares()
        self.assertTrue(1 <= len(made) <= 8, made)
        self.assertEqual(self.ids(c), [first])  # no spare listed
        m = self.fire(c, "slow", 1)
        self.assertEqual(len(self.spares()), len(made) - 1, "the WAL was not a spare")
        self.assertTrue(os.path.exists(os.path.join(self.wal, m + ".wal.jsonl")))
        self.wait_handler()
        c.close()
        self.stop(kill=True)
        self.kill_handlers()
        return first, m

    def test_a_lost_rename_is_adopted(self):
        first, m = self.killed_mid_observe()
        # the rename a crash undid: the records under a spare's name
        spare = os.path.join(self.wal, ".spare-900")
        os.rename(os.path.join(self.wal, m + ".wal.jsonl"), spare)

        # offline: seen where it is, nothing changed, no spare counted
        self.assertEqual(sorted(self.offline_ids()), sorted([first, m]))
        p = self.ctl("--json", "show", m, "--state-dir", self.state)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(json.loads(p.stdout)["id"], m)
        p = self.ctl("recover", "--dry-run", "--state-dir", self.state, "--config", self.conf)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        # the spare kairosd adopts is recovered as a WAL; no other spare counts
        self.assertIn("(1 WAL file in", p.stdout)
        self.assertEqual([ln.split(":")[0] for ln in p.stdout.splitlines() if ".spare" in ln],
                         [spare])
        self.assertTrue(os.path.exists(spare))

        c = self.start()
        self.d.wait_log("holds the records of mandate %s" % m, timeout=30)
        self.assertFalse(os.path.exists(spare))
        self.assertTrue(os.path.exists(os.path.join(self.wal, m + ".wal.jsonl")))
        ids = self.ids(c)
        self.assertEqual(sorted(ids), sorted([first, m]), ids)
        r = c.call("show", mandate=m)
        self.assertTrue(r.get("ok"), r)
        c.close()

    def test_torn_empty_and_conflicting_spares(self):
        first, m = self.killed_mid_observe()
        walf = os.path.join(self.wal, m + ".wal.jsonl")
        with open(walf, "rb") as f:
            data = f.read()
        # the same records twice: never merged
        with open(os.path.join(self.wal, ".spare-901"), "wb") as f:
            f.write(data)
        # a first record cut: never flushed, never acknowledged
        with open(os.path.join(self.wal, ".spare-902"), "wb") as f:
            f.write(data[:data.index(b"\n") // 2])
        before = self.spares()
        self.assertEqual(sorted(self.offline_ids()), sorted([first, m]))

        c = self.start()
        line = self.d.wait_log("never merged", timeout=30)
        self.assertIn(m, line)
        after = self.spares()
        self.assertIn(".spare-901", after)          # left for an operator
        self.assertNotIn(".spare-902", after)       # removed
        kept = [s for s in before if s not in (".spare-901", ".spare-902")]
        self.assertTrue(kept and all(s in after for s in kept), (before, after))
        with open(walf, "rb") as f:
            self.assertTrue(f.read().startswith(data))  # its own WAL untouched
        ids = self.ids(c)
        self.assertEqual(sorted(ids), sorted([first, m]), ids)
        c.close()


class TestHostileSpares(TestSpares):
    """What an operator (or anything else) may leave under a spare's name:
    kairosd and kairosctl never block on it, never read a huge one whole,
    never write through a link, and keep at most 8 spares."""

    def plant(self):
        outside = os.path.join(self.dir, "outside")
        open(outside, "w").close()
        w = self.wal
        os.mkfifo(os.path.join(w, ".spare-60"))
        os.mkdir(os.path.join(w, ".spare-61"))
        os.symlink(outside, os.path.join(w, ".spare-62"))
        os.symlink("/dev/zero", os.path.join(w, ".spare-63"))
        os.symlink("/nonexistent/x", os.path.join(w, ".spare-64"))
        with open(os.path.join(w, ".spare-66"), "wb") as f:
            f.truncate(1 << 30)  # 1 GiB, sparse, no newline
        for i in range(200, 212):  # more empty ones than the pool holds
            open(os.path.join(w, ".spare-%d" % i), "w").close()
        open(os.path.join(w, ".spare-99999999999999999999"), "w").close()
        return outside

    def empty_spares(self):
        return [s for s in self.spares() if not os.path.islink(os.path.join(self.wal, s)) and
                os.path.isfile(os.path.join(self.wal, s)) and
                os.path.getsize(os.path.join(self.wal, s)) == 0]

    def test_hostile_spares(self):
        c = self.start()
        first = self.fire(c, "quick", 0)
        self.d.wait_log("mandate %s done after 1 cycle" % first, timeout=60)
        c.close()
        self.stop()
        outside = self.plant()
        special = [".spare-6%d" % i for i in (0, 1, 2, 3, 4)]

        # offline readers: never blocked, never reading 1 GiB
        p = self.ctl("--json", "list", "--limit", "0", "--state-dir", self.state)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual([m["id"] for m in json.loads(p.stdout)["mandates"]], [first])

        c = self.start()
        for name in special:
            self.d.wait_log("%s: a spare WAL file's name on no regular file" % name, timeout=30)
        self.d.wait_log(".spare-66: a spare WAL file with bytes but no record", timeout=30)
        self.assertLessEqual(len(self.empty_spares()), 8, self.spares())
        # status counts no spare: one mandate, no WAL recovered
        r = c.call("status")
        self.assertTrue(r.get("ok"), r)
        self.assertEqual(r["result"]["mandates"], 1, r)
        self.assertEqual(r["result"]["recovery"]["files"], 0, r)
        for name in special + [".spare-66"]:
            self.assertTrue(os.path.lexists(os.path.join(self.wal, name)), name)
        # mandates run on the spares kept: none written through the link
        for i in range(1, 4):
            m = self.fire(c, "quick", i)
            self.d.wait_log("mandate %s done after 1 cycle" % m, timeout=60)
        self.assertEqual(os.path.getsize(outside), 0)
        self.assertTrue(os.path.islink(os.path.join(self.wal, ".spare-62")))
        self.assertEqual(len(self.ids(c)), 4)
        c.close()
        # an empty spare verifies as an empty WAL
        p = self.ctl("wal", "verify", os.path.join(self.wal, self.empty_spares()[0]))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("ok (0 records", p.stdout)

    def test_finished_mandate_and_twin_spares(self):
        """A spare holding a finished mandate's records whose archive exists
        (the state a crash leaves between the summary and the WAL's unlink):
        adopted, ended again, archived once more, listed once.  Two spares
        with one mandate's records: one adopted, the other left with an
        error, never merged."""
        first, m = self.killed_mid_observe()
        archive = os.path.join(self.state, "archive", first + ".wal.jsonl.gz")
        with gzip.open(archive) as f:
            data = f.read()
        with open(os.path.join(self.wal, ".spare-900"), "wb") as f:
            f.write(data)
        walf = os.path.join(self.wal, m + ".wal.jsonl")
        with open(walf, "rb") as f:
            mine = f.read()
        os.unlink(walf)
        for name in (".spare-901", ".spare-902"):
            with open(os.path.join(self.wal, name), "wb") as f:
                f.write(mine)

        c = self.start()
        self.d.wait_log("holds the records of mandate %s" % first, timeout=30)
        line = self.d.wait_log("never merged", timeout=30)
        self.assertIn(m, line)
        self.d.wait_log("mandate %s: WAL archived" % first, timeout=60)
        self.assertTrue(os.path.exists(archive))
        self.assertFalse(os.path.exists(os.path.join(self.wal, ".spare-900")))
        self.assertTrue(os.path.exists(walf))
        left = [n for n in (".spare-901", ".spare-902") if os.path.exists(os.path.join(self.wal, n))]
        self.assertEqual(len(left), 1, left)
        ids = self.ids(c)
        self.assertEqual(sorted(ids), sorted([first, m]), ids)
        r = c.call("show", mandate=first)
        self.assertTrue(r.get("ok"), r)
        c.close()

    test_a_lost_rename_is_adopted = None
    test_torn_empty_and_conflicting_spares = None


class TestWhereRenamesMayBeLost(TestSpares):
    """The machine's temporary directory, whatever it is: spares there only
    when its file system keeps a rename whole (this machine's root is ext4
    without a journal: none, and the notice says why)."""
    base = None

    def test_spares_only_where_a_rename_survives(self):
        atomic = renames_atomic(tempfile.gettempdir())
        c = self.start()
        first = self.fire(c, "quick", 0)
        self.d.wait_log("mandate %s done after 1 cycle" % first, timeout=60)
        self.d.wait_log("WAL archived", timeout=60)
        second = self.fire(c, "quick", 1)
        self.d.wait_log("mandate %s done after 1 cycle" % second, timeout=60)
        c.close()
        notice = "a rename not synced may not survive a crash whole" in self.d.log()
        if atomic:
            self.assertTrue(self.spares(), "no spares on a file system that keeps renames")
            self.assertFalse(notice)
        else:
            self.assertEqual(self.spares(), [], "spares where a rename may be lost")
            self.assertTrue(notice, "no notice why there are no spares")

    # the rest of TestSpares needs spares
    test_a_lost_rename_is_adopted = None
    test_torn_empty_and_conflicting_spares = None


if __name__ == "__main__":
    unittest.main(verbosity=2)
