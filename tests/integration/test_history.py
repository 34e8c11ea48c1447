#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""History through the real binaries: `list` (newest first, filters, limit
and paging, times), `show` step times, MANDATE prefixes, the retention of
finished mandates (KeepFinished=, KeepFinishedSec= on the fake clock) and
the modes of WALs, archives and state directories."""
import grp
import gzip
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kairos_harness  # noqa: E402
from kairos_harness import Client, Daemon, NotifySocket, write_config  # noqa: E402

KAIROSCTL = os.environ.get("KAIROSCTL", "build/src/ctl/kairosctl")
CRON = {"Cron": "0 0 1 1 *"}
ONE = {"MaxCycles": "1"}


def at(i):
    return "2026-04-%02dT12:00:00Z" % (1 + i)


class HistoryCase(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-history-")
        self.state = os.path.join(self.dir, "state")
        self.notify = NotifySocket(self.dir)
        self.d = None
        self.c = None

    def tearDown(self):
        if self.c:
            self.c.close()
        if self.d:
            if self.d.proc.poll() is None:
                self.assertEqual(self.d.stop(), 0, self.d.log()[-3000:])
            self.d.proc.stderr.close()
        self.notify.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, daemon_extra=""):
        schedules = {
            "good": {"Schedule": CRON, "Mandate": ONE, "Exec": {"Observe": "/bin/true"}},
            "bad": {"Schedule": CRON, "Mandate": ONE, "Exec": {"Observe": "/bin/false"}},
            "slow": {"Schedule": CRON, "Mandate": ONE, "Exec": {"Observe": "sleep 600"}},
        }
        group = grp.getgrgid(os.getgid()).gr_name
        conf = write_config(self.dir, self.state, schedules,
                            daemon_extra="GracefulTimeoutSec=1\nSocketGroup=%s\n%s"
                            % (group, daemon_extra))
        self.notify.clear()
        self.d = Daemon(self.state, config=conf, notify=self.notify)
        self.notify.wait_ready()
        self.c = Client(self.d.socket_path)

    def call(self, cmd, **args):
        r = self.c.call(cmd, **args)
        self.assertTrue(r["ok"], (cmd, args, r))
        return r["result"]

    def fire_and_end(self, schedule, fired_at):
        m = self.call("fire", schedule=schedule, at=fired_at)["mandate"]
        self.d.wait_log("mandate %s %s after" % (m, "done" if schedule == "good" else "failed"))
        # finished mandates are archived in batches, a little later
        self.d.wait_log("mandate %s: WAL archived" % m)
        return m

    def ctl(self, *args):
        return subprocess.run([KAIROSCTL, "--socket", self.d.socket_path, *args],
                              capture_output=True, text=True, timeout=60)


class TestList(HistoryCase):
    def test_empty(self):
        # no mandate at all: an empty page (the sanitizer build checks the
        # empty registry is never sorted through a NULL array)
        self.start()
        self.assertEqual(self.call("list")["mandates"], [])
        # a WAL that holds no plan (a fire never acknowledged) is registered,
        # then removed by recovery: the registry is empty again
        self.assertEqual(self.d.stop(), 0)
        self.d.proc.stderr.close()
        self.c.close()
        with open(os.path.join(self.state, "wal", "mnd_plan_0123456789ab.wal.jsonl"), "w") as f:
            f.write('{"op":"mand')
        self.start()
        self.d.wait_log("holds no plan")
        self.assertEqual(self.call("list")["mandates"], [])
        self.assertEqual(self.call("list", limit=5)["mandates"], [])
        self.assertEqual(self.d.proc.poll(), None)

    def test_order_filters_limit_paging_and_times(self):
        self.start()
        ids = {}
        for i in range(6):
            sched = "bad" if i % 3 == 2 else "good"
            ids[i] = self.fire_and_end(sched, at(i))
        rows = self.call("list")["mandates"]
        # newest first
        self.assertEqual([r["id"] for r in rows], [ids[i] for i in reversed(range(6))])
        for r in rows:
            self.assertTrue(r["started_at"].endswith("Z"), r)
            self.assertTrue(r["ended_at"].endswith("Z"), r)
            self.assertGreaterEqual(r["duration_ms"], 0)
            self.assertEqual(r["cycle"], 1)
        self.assertEqual({r["fired_at"] for r in rows}, {at(i) for i in range(6)})
        # filters
        failed = self.call("list", status="failed")["mandates"]
        self.assertEqual([r["id"] for r in failed], [ids[5], ids[2]])
        good = self.call("list", schedule="good")["mandates"]
        self.assertEqual(len(good), 4)
        self.assertTrue(all(r["schedule"] == "good" for r in good))
        since = self.call("list", since=at(4))["mandates"]
        self.assertEqual([r["id"] for r in since], [ids[5], ids[4]])
        # limit and paging
        page = self.call("list", limit=2)
        self.assertEqual([r["id"] for r in page["mandates"]], [ids[5], ids[4]])
        self.assertTrue(page["more"])
        self.assertEqual(page["total"], 6)
        page2 = self.call("list", limit=2, after=page["next"])
        self.assertEqual([r["id"] for r in page2["mandates"]], [ids[3], ids[2]])
        last = self.call("list", limit=10, after=ids[1])
        self.assertEqual([r["id"] for r in last["mandates"]], [ids[0]])
        self.assertFalse(last["more"])
        bad = self.c.call("list", status="nonsense")
        self.assertFalse(bad["ok"])
        self.assertEqual(bad["error"]["code"], "bad_argument")
        # the command line: columns, filters, the footer
        r = self.ctl("list", "--status", "failed", "--limit", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0].split()[:4], ["ID", "SCHEDULE", "FIRED", "AT"])
        self.assertIn(ids[5], lines[1])
        self.assertIn("bad", lines[1])
        self.assertIn(at(5), lines[1])
        self.assertIn("--after %s" % ids[5], lines[-1])
        r = self.ctl("list", "--since", "bogus")
        self.assertEqual(r.returncode, 64, r.stderr)
        # the ordered index takes new mandates in wherever their fired_at
        # puts them (older, between two, newest), also after it was served
        older = self.fire_and_end("good", "2026-03-15T12:00:00Z")
        between = self.fire_and_end("bad", "2026-04-03T18:00:00Z")
        newest = self.fire_and_end("good", at(9))
        want = [newest, ids[5], ids[4], ids[3], between, ids[2], ids[1], ids[0], older]
        self.assertEqual([r["id"] for r in self.call("list")["mandates"]], want)
        got, after = [], None
        while True:
            page = self.call("list", limit=4, **({"after": after} if after else {}))
            got += [r["id"] for r in page["mandates"]]
            self.assertEqual(page["total"], len(want) - len(got) + len(page["mandates"]))
            if not page["more"]:
                break
            after = page["next"]
        self.assertEqual(got, want)
        self.assertEqual([r["id"] for r in self.call("list", status="failed", limit=2)["mandates"]],
                         [ids[5], between])

    def test_show_step_times(self):
        self.start()
        m = self.fire_and_end("good", at(0))
        res = self.call("show", mandate=m)
        self.assertTrue(res["started_at"].endswith("Z"))
        obs = res["plans"][0]["steps"][0]
        self.assertEqual(obs["status"], "completed")
        self.assertLessEqual(obs["started_at"], obs["ended_at"])
        self.assertGreaterEqual(obs["duration_ms"], 0)
        later = res["plans"][0]["steps"][1]
        r = self.ctl("show", m)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"STARTED +ENDED +DURATION")
        self.assertIsNotNone(later["started_at"])


class TestPrefix(HistoryCase):
    def test_unique_ambiguous_none(self):
        self.start()
        a = self.fire_and_end("good", at(0))
        b = self.fire_and_end("good", at(1))
        # the shortest prefix that tells them apart, and one that does not
        k = next(i for i in range(len(a)) if a[i] != b[i])
        res = self.call("show", mandate=a[:k + 1])
        self.assertEqual(res["id"], a)
        r = self.c.call("show", mandate=a[:k])
        self.assertFalse(r["ok"])
        self.assertEqual(r["error"]["code"], "ambiguous")
        self.assertIn(a, r["error"]["message"])
        self.assertIn(b, r["error"]["message"])
        r = self.c.call("show", mandate="mnd_nothing_like_it")
        self.assertEqual(r["error"]["code"], "not_found")
        out = self.ctl("show", a[:k])
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("ambiguous", out.stderr)
        out = self.ctl("show", b[:k + 1])
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn(b, out.stdout)


class TestRetention(HistoryCase):
    def files(self, m):
        return (os.path.exists(os.path.join(self.state, "archive", m + ".wal.jsonl.gz")),
                os.path.exists(os.path.join(self.state, "mandates", m + ".json")))

    def test_by_count(self):
        self.start("KeepFinished=3\n")
        ms = [self.fire_and_end("good", at(i)) for i in range(5)]
        self.d.wait_log("retention: pruned 1 finished mandates (1 beyond KeepFinished=3")
        # the oldest went first (they leave the registry at once, one prune
        # per archive batch); their files are removed on the thread pool:
        # poll with a deadline
        deadline = time.monotonic() + 30
        ids = None
        while time.monotonic() < deadline:
            ids = [r["id"] for r in self.call("list")["mandates"]]
            if len(ids) <= 3:
                break
            time.sleep(0.05)
        self.assertEqual(ids, list(reversed(ms[2:])))
        while any(self.files(m) != (False, False) for m in ms[:2]) and time.monotonic() < deadline:
            time.sleep(0.05)
        for m in ms[:2]:
            self.assertEqual(self.files(m), (False, False))
        for m in ms[2:]:
            self.assertEqual(self.files(m), (True, True))
        # and after a restart the pruned ones stay gone
        self.assertEqual(self.d.stop(), 0)
        self.d.proc.stderr.close()
        self.c.close()
        self.start("KeepFinished=3\n")
        self.assertEqual([r["id"] for r in self.call("list")["mandates"]], list(reversed(ms[2:])))

    def test_archives_go_before_summaries(self):
        # Under strace: a pruned mandate's archive is unlinked, and its
        # directory synced, before its summary is unlinked — so a crash in
        # between never leaves an archive that no summary registers.
        strace = shutil.which("strace")
        if not strace:
            self.skipTest("strace not installed")
        trace = os.path.join(self.dir, "trace.txt")
        wrapper = os.path.join(self.dir, "kairosd-straced")
        with open(wrapper, "w") as f:
            f.write('#!/bin/sh\nexec %s -f -e signal=none -e trace=unlink,unlinkat,fsync,'
                    'openat -o %s %s "$@"\n' % (strace, trace, kairos_harness.KAIROSD))
        os.chmod(wrapper, 0o755)
        real, kairos_harness.KAIROSD = kairos_harness.KAIROSD, wrapper
        # LeakSanitizer cannot run under ptrace (the sanitizer build)
        saved = os.environ.get("ASAN_OPTIONS")
        os.environ["ASAN_OPTIONS"] = ((saved or "") + ":detect_leaks=0").lstrip(":")
        try:
            self.start("KeepFinished=2\n")
        finally:
            kairos_harness.KAIROSD = real
            if saved is None:
                del os.environ["ASAN_OPTIONS"]
            else:
                os.environ["ASAN_OPTIONS"] = saved
        ms = [self.fire_and_end("good", at(i)) for i in range(3)]
        self.d.wait_log("retention: pruned 1 finished mandates")
        deadline = time.monotonic() + 30
        while self.files(ms[0]) != (False, False) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(self.files(ms[0]), (False, False))
        with open(os.path.join(self.state, "kairosd.pid")) as f:
            os.kill(int(f.read().split()[0]), 15)  # strace does not pass SIGTERM on
        self.assertEqual(self.d.proc.wait(60), 0)
        with open(trace) as f:
            lines = f.read().splitlines()

        def index(pattern):
            found = [i for i, line in enumerate(lines) if re.search(pattern, line)]
            self.assertEqual(len(found), 1, (pattern, found))
            return found[0]
        archive = index(r'unlink(at)?\(.*archive/%s\.wal\.jsonl\.gz"' % ms[0])
        summary = index(r'unlink(at)?\(.*mandates/%s\.json"' % ms[0])
        self.assertLess(archive, summary)
        # the archive directory is opened and synced between the two
        between = "\n".join(lines[archive:summary])
        self.assertRegex(between, r'openat\(.*/archive", O_RDONLY')
        self.assertRegex(between, r"fsync\(")

    def test_a_summary_left_without_its_archive_is_pruned(self):
        # the state a crash between the two unlinks leaves: the next start
        # registers the mandate from its summary and prunes it again
        self.start()
        ms = [self.fire_and_end("good", at(i)) for i in range(3)]
        self.assertEqual(self.d.stop(), 0)
        self.d.proc.stderr.close()
        self.c.close()
        os.unlink(os.path.join(self.state, "archive", ms[0] + ".wal.jsonl.gz"))
        self.start("KeepFinished=2\n")
        self.d.wait_log("retention: pruned 1 finished mandates")
        deadline = time.monotonic() + 30
        while self.files(ms[0]) != (False, False) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(self.files(ms[0]), (False, False))
        self.assertEqual([r["id"] for r in self.call("list")["mandates"]],
                         list(reversed(ms[1:])))

    def test_by_age_on_the_fake_clock(self):
        self.start("KeepFinishedSec=1d\n")
        ms = [self.fire_and_end("good", at(i)) for i in range(2)]
        self.assertEqual(len(self.call("list")["mandates"]), 2)
        r = self.c.call("test-clock", now=int(time.time()) + 2 * 86400)
        if not r["ok"]:
            self.skipTest("no test hooks")
        self.d.wait_log("retention: pruned 2 finished mandates (0 beyond KeepFinished=1000, "
                        "2 older than KeepFinishedSec=86400)")
        self.assertEqual(self.call("list")["mandates"], [])
        for m in ms:
            self.assertEqual(self.files(m), (False, False))


class TestModes(HistoryCase):
    def test_wal_archive_and_directories(self):
        self.start()
        m = self.fire_and_end("good", at(0))
        gid = os.getgid()
        for d in ("", "wal", "archive", "mandates"):
            st = os.stat(os.path.join(self.state, d))
            self.assertEqual(stat.S_IMODE(st.st_mode) & 0o777, 0o750, d)
            self.assertEqual(st.st_gid, gid, d)
            self.assertTrue(st.st_mode & stat.S_ISGID, d)
        st = os.stat(os.path.join(self.state, "archive", m + ".wal.jsonl.gz"))
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o640)
        self.assertEqual(st.st_gid, gid)
        with gzip.open(os.path.join(self.state, "archive", m + ".wal.jsonl.gz")) as f:
            self.assertIn(b'"op":"mandate"', f.read())
        self.assertEqual(stat.S_IMODE(os.stat(os.path.join(self.state, "mandates",
                                                           m + ".json")).st_mode), 0o640)
        # an open WAL, while its handler runs
        slow = self.call("fire", schedule="slow", at=at(1))["mandate"]
        st = os.stat(os.path.join(self.state, "wal", slow + ".wal.jsonl"))
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o640)
        self.assertEqual(st.st_gid, gid)

if __name__ == "__main__":
    unittest.main(verbosity=2)
