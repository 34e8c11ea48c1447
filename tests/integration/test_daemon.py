# SPDX-License-Identifier: MIT
"""Black-box tests of kairosd (issue: runtime): startup recovery before
READY=1, sd_notify, watchdog, reload, stop, the state lock and the control
socket.  Runs the real binary against a temporary state directory."""
import gzip
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kairos_harness import (SLOW_SCHEDULE, Client, Daemon, NotifySocket, append,  # noqa: E402
                            completed, executing, failed, plan_commit, read_records, wal_line,
                            write_config)

EXTRA_REVIEW = 100  # extra WALs that need a record, so READY ordering is observable


def write_wal(path, records, tail=b""):
    with open(path, "wb") as f:
        for r in records:
            f.write(wal_line(r).encode())
        f.write(tail)


def prepare_state(state):
    wal = os.path.join(state, "wal")
    os.makedirs(wal)
    # already_done: observe completed, then marked needs_review -> row 1
    pa = plan_commit("plan_a", "mnd_a")
    write_wal(os.path.join(wal, "mnd_a.wal.jsonl"), [
        pa, append("observe_001", "plan_a", "mnd_a"), executing("observe_001"),
        completed("observe_001"),
        {"op": "transition", "step_id": "observe_001", "status": "needs_review",
         "reason": "operator_flag", "ts": "2026-04-20T12:00:00.000Z"}])
    # manual_review: observe executing, never completed
    write_wal(os.path.join(wal, "mnd_r.wal.jsonl"), [
        plan_commit("plan_r", "mnd_r"), append("observe_001", "plan_r", "mnd_r"),
        executing("observe_001")])
    # safe_to_retry: never reached executing
    write_wal(os.path.join(wal, "mnd_s.wal.jsonl"), [
        plan_commit("plan_s", "mnd_s"), append("observe_001", "plan_s", "mnd_s")])
    # failed step, plan not finalized
    write_wal(os.path.join(wal, "mnd_f.wal.jsonl"), [
        plan_commit("plan_f", "mnd_f"), append("observe_001", "plan_f", "mnd_f"),
        executing("observe_001"), failed("observe_001")])
    # torn tail
    write_wal(os.path.join(wal, "mnd_t.wal.jsonl"), [
        plan_commit("plan_t", "mnd_t"), append("observe_001", "plan_t", "mnd_t")],
        tail=b'{"op":"transition","step_id":"obs')
    # corrupt: garbage between good lines
    with open(os.path.join(wal, "mnd_c.wal.jsonl"), "wb") as f:
        f.write(wal_line(plan_commit("plan_c", "mnd_c")).encode())
        f.write(b"this is not json\n")
        f.write(wal_line(append("observe_001", "plan_c", "mnd_c")).encode())
    for i in range(EXTRA_REVIEW):
        m = "mnd_x%03d" % i
        write_wal(os.path.join(wal, m + ".wal.jsonl"), [
            plan_commit("plan_x%03d" % i, m), append("observe_001", "plan_x%03d" % i, m),
            executing("observe_001")])


class DaemonCase(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-it-")
        self.state = os.path.join(self.dir, "state")
        self.notify = NotifySocket(self.dir)
        self.daemons = []

    def tearDown(self):
        for d in self.daemons:
            if d.proc.poll() is None:
                self.assertEqual(d.stop(), 0, d.log()[-3000:])
            else:
                d.kill()
        self.notify.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, **kw):
        kw.setdefault("notify", self.notify)
        d = Daemon(self.state, **kw)
        self.daemons.append(d)
        return d

    def client(self):
        return Client(os.path.join(self.state, "control.sock"))


class TestRecovery(DaemonCase):
    def test_ready_only_after_recovery_and_records_appended(self):
        prepare_state(self.state)
        wal = os.path.join(self.state, "wal")
        corrupt_before = open(os.path.join(wal, "mnd_c.wal.jsonl"), "rb").read()
        d = self.start()
        ready = self.notify.wait_ready()
        # Recovery announced itself (and asked for more start time) before READY=1.
        msgs = self.notify.messages
        first_ready = msgs.index(ready)
        self.assertTrue(any("EXTEND_TIMEOUT_USEC=" in m for m in msgs[:first_ready]), msgs[:first_ready])
        self.assertTrue(any(m.startswith("STATUS=recovering") for m in msgs[:first_ready]), msgs[:first_ready])
        self.notify.wait_for(lambda m: m.startswith("STATUS=") and "101 paused for review" in m)
        # At READY=1 every WAL already holds its recovery records.
        for i in range(EXTRA_REVIEW):
            recs = read_records(os.path.join(wal, "mnd_x%03d.wal.jsonl" % i))
            self.assertEqual(recs[-1]["status"], "needs_review", "mnd_x%03d not recovered before READY" % i)

        a = read_records(os.path.join(wal, "mnd_a.wal.jsonl"))
        self.assertEqual(len(a), 6)
        self.assertEqual(a[-1]["status"], "completed")
        self.assertTrue(a[-1]["recovered"])
        self.assertEqual(a[-1]["post_hash"], "sha256-post")
        self.assertEqual(a[-1]["evidence"]["reason"], "wal_recorded_completion")

        r = read_records(os.path.join(wal, "mnd_r.wal.jsonl"))
        self.assertEqual(len(r), 4)
        self.assertEqual(r[-1]["status"], "needs_review")
        self.assertEqual(r[-1]["evidence"]["reason"], "interrupted_during_execution")

        s = read_records(os.path.join(wal, "mnd_s.wal.jsonl"))
        self.assertEqual(len(s), 2, "a step that never started needs no record")

        # (the executor may have archived it already: it was its only cycle)
        d.wait_log("mandate mnd_f failed")
        with gzip.open(os.path.join(self.state, "archive", "mnd_f.wal.jsonl.gz")) as gz:
            f = [json.loads(line) for line in gz.read().splitlines() if line.strip()]
        self.assertEqual(f[-1]["op"], "plan_finalize")
        self.assertEqual(f[-1]["status"], "failed")

        t = open(os.path.join(wal, "mnd_t.wal.jsonl"), "rb").read()
        self.assertTrue(t.endswith(b"}\n"), "torn fragment cut off")
        self.assertEqual(len(read_records(os.path.join(wal, "mnd_t.wal.jsonl"))), 2)
        torn = [n for n in os.listdir(wal) if n.startswith("mnd_t.wal.jsonl.torn.")]
        self.assertEqual(len(torn), 1)
        self.assertEqual(open(os.path.join(wal, torn[0]), "rb").read(), b'{"op":"transition","step_id":"obs')

        self.assertEqual(open(os.path.join(wal, "mnd_c.wal.jsonl"), "rb").read(), corrupt_before,
                         "a quarantined WAL is never written")

        c = self.client()
        st = c.call("status")
        self.assertTrue(st["ok"], st)
        rec = st["result"]["recovery"]
        self.assertEqual(rec["quarantined"], 1)
        self.assertEqual(rec["paused_review"], 1 + EXTRA_REVIEW)
        self.assertEqual(rec["torn_repaired"], 1)
        self.assertIn("paused for review", rec["summary"])
        # These WALs have no mandate record (as the original wrote them): the
        # executor cannot know their schedule and pauses them, saying why.
        settle(d)
        lst = {m["id"]: m for m in c.call("list")["result"]["mandates"]}
        self.assertEqual(lst["mnd_r"]["status"], "paused_review")
        self.assertEqual(lst["mnd_r"]["review_step"], "observe_001")
        self.assertEqual(lst["mnd_c"]["status"], "quarantined")
        self.assertEqual(lst["mnd_c"]["reason"], "wal_corrupt")
        self.assertEqual(lst["mnd_c"]["plan_id"], "plan_c")
        for m in ("mnd_s", "mnd_a", "mnd_t"):
            self.assertEqual(lst[m]["status"], "paused")
            self.assertTrue(lst[m]["reason"].startswith("schedule_unknown"), lst[m])
        # The failed plan was its only cycle: the mandate failed, its WAL is archived.
        self.assertEqual(lst["mnd_f"]["status"], "failed")
        d.wait_log("mandate mnd_f: WAL archived")
        self.assertFalse(os.path.exists(os.path.join(wal, "mnd_f.wal.jsonl")))
        self.assertTrue(os.path.exists(os.path.join(self.state, "archive", "mnd_f.wal.jsonl.gz")))
        log = d.log()
        self.assertIn("mnd_r observe_001: manual_review (interrupted_during_execution)", log)
        self.assertIn("corrupt at line 2", log)
        c.close()

        # Recovery is idempotent: a restart appends nothing new.
        self.assertEqual(d.stop(), 0)
        sizes = {n: os.path.getsize(os.path.join(wal, n)) for n in os.listdir(wal)}
        self.notify.clear()
        d = self.start()
        self.notify.wait_ready()
        settle(d, failed=False)
        self.assertEqual({n: os.path.getsize(os.path.join(wal, n)) for n in os.listdir(wal)}, sizes)
        c = self.client()
        lst = {m["id"]: m for m in c.call("list")["result"]["mandates"]}
        self.assertEqual(lst["mnd_f"]["status"], "failed", "known from its summary")
        c.close()

    def test_one_syncfs_for_all_recovery_records_then_ready(self):
        """Recovery appends its records with no fdatasync per WAL; one syncfs
        of the WALs' file system makes them durable before READY=1 (nothing
        runs before READY).  A WAL that needs no record gets no sync.  A
        kill -9 right after READY=1 loses nothing: the next start finds every
        record and appends none.  (Power loss between the appends and the
        syncfs: tests/crash/crash_states.c, workload beta and gamma.)"""
        import kairos_harness
        strace = shutil.which("strace")
        if not strace:
            self.skipTest("strace not installed")
        prepare_state(self.state)
        wal = os.path.join(self.state, "wal")
        trace = os.path.join(self.dir, "trace.txt")
        wrapper = os.path.join(self.dir, "kairosd-straced")
        with open(wrapper, "w") as f:
            f.write('#!/bin/sh\nexec %s -f -y -qq -e signal=none '
                    '-e trace=fdatasync,fsync,syncfs,sendmsg,sendto -o %s %s "$@"\n'
                    % (strace, trace, os.path.abspath(kairos_harness.KAIROSD)))
        os.chmod(wrapper, 0o755)
        real, kairos_harness.KAIROSD = kairos_harness.KAIROSD, wrapper
        try:
            d = self.start()
        finally:
            kairos_harness.KAIROSD = real
        self.notify.wait_ready(timeout=60)
        with open(os.path.join(self.state, "kairosd.pid")) as f:
            os.kill(int(f.read().split()[0]), signal.SIGKILL)
        d.proc.wait(60)
        d.reader.join(30)
        with open(trace, errors="replace") as f:
            lines = f.read().splitlines()
        ready = [i for i, line in enumerate(lines) if "READY=1" in line]
        self.assertTrue(ready, "READY=1 was sent")
        before = lines[:ready[0]]
        syncfs_ok = [line for line in before if "syncfs" in line and line.endswith("= 0")]
        self.assertEqual(len(syncfs_ok), 1, "one syncfs before READY=1:\n" + "\n".join(before))
        self.assertIn("/wal>", [line for line in before if "syncfs(" in line][0])
        wal_syncs = [line for line in before
                     if ("fdatasync(" in line or "fsync(" in line) and ".wal.jsonl" in line and
                     "mnd_t.wal.jsonl" not in line]   # (the torn tail's repair syncs itself)
        self.assertEqual(wal_syncs, [], "no WAL synced on its own before READY=1")
        after_kill = {n: open(os.path.join(wal, n), "rb").read() for n in os.listdir(wal)}
        for i in range(EXTRA_REVIEW):
            recs = read_records(os.path.join(wal, "mnd_x%03d.wal.jsonl" % i))
            self.assertEqual(recs[-1]["status"], "needs_review")
        self.assertEqual(len(read_records(os.path.join(wal, "mnd_s.wal.jsonl"))), 2)

        # the next start: every record is there, recovery appends none
        self.notify.clear()
        d = self.start()
        self.notify.wait_ready(timeout=60)
        c = self.client()
        rec = c.call("status")["result"]["recovery"]
        c.close()
        self.assertEqual(rec["paused_review"], 1 + EXTRA_REVIEW)
        for i in range(EXTRA_REVIEW):
            n = "mnd_x%03d.wal.jsonl" % i
            self.assertEqual(open(os.path.join(wal, n), "rb").read(), after_kill[n], n)

    def test_early_syncfs_starts_writeback_closing_one_before_ready(self):
        """With many WALs to write to, recovery starts the write-back early:
        a syncfs each time KAIROS_TEST_EARLY_SYNC_MIN more WALs were written
        to (1,024 without test hooks), queued while the scan goes on; the closing
        syncfs still comes last, after every recovery record, and READY=1
        after it.  A kill -9 right after READY=1 loses nothing."""
        import kairos_harness
        strace = shutil.which("strace")
        if not strace:
            self.skipTest("strace not installed")
        prepare_state(self.state)
        wal = os.path.join(self.state, "wal")
        trace = os.path.join(self.dir, "trace.txt")
        wrapper = os.path.join(self.dir, "kairosd-straced")
        with open(wrapper, "w") as f:
            f.write('#!/bin/sh\nexec %s -f -y -qq -e signal=none '
                    '-e trace=syncfs,write,sendmsg,sendto -o %s %s "$@"\n'
                    % (strace, trace, os.path.abspath(kairos_harness.KAIROSD)))
        os.chmod(wrapper, 0o755)
        real, kairos_harness.KAIROSD = kairos_harness.KAIROSD, wrapper
        try:
            d = self.start(env={"KAIROS_TEST_EARLY_SYNC_MIN": "16"})
        finally:
            kairos_harness.KAIROSD = real
        self.notify.wait_ready(timeout=60)
        with open(os.path.join(self.state, "kairosd.pid")) as f:
            os.kill(int(f.read().split()[0]), signal.SIGKILL)
        d.proc.wait(60)
        d.reader.join(30)
        with open(trace, errors="replace") as f:
            lines = f.read().splitlines()
        ready = [i for i, line in enumerate(lines) if "READY=1" in line]
        self.assertTrue(ready, "READY=1 was sent")
        before = lines[:ready[0]]
        syncfs = [i for i, line in enumerate(before) if "syncfs(" in line]
        # (returned 0, on its line or on its "<... syncfs resumed>" one)
        ok = [i for i, line in enumerate(before) if "syncfs" in line and line.endswith("= 0")]
        self.assertGreaterEqual(len(ok), 2, "early syncfs before the closing one:\n" +
                                "\n".join(before[i] for i in syncfs))
        for i in syncfs:
            self.assertIn("/wal>", before[i])
        wal_writes = [i for i, line in enumerate(before)
                      if line.split()[1].startswith("write(") and ".wal.jsonl>" in line]
        self.assertTrue(wal_writes)
        # (queued when a pool job is settled while another is pending; whether
        # that one's writes come before it or after is up to the threads)
        self.assertGreater(syncfs[0], wal_writes[0], "an early syncfs after records")
        self.assertGreater(ok[-1], wal_writes[-1], "the closing syncfs after every record")
        for i in range(EXTRA_REVIEW):
            recs = read_records(os.path.join(wal, "mnd_x%03d.wal.jsonl" % i))
            self.assertEqual(recs[-1]["status"], "needs_review")


def settle(d, failed=True):
    """Wait for the executor's decisions on the prepared mandates."""
    for m in ("mnd_s", "mnd_a", "mnd_t"):
        d.wait_log("mandate %s paused: schedule_unknown" % m)
    if failed:
        d.wait_log("mandate mnd_f failed")


def prepare_mixed(wal, n):
    """n WALs of mixed states, one in six of each: interrupted in a step
    (review), never started (resumed), a step failed (finalized failed),
    the mandate record alone (removed), corrupt (quarantined), a completed
    step (the next one decided); one in fifty with a torn tail.  The
    mandate record names a schedule no one configured: nothing runs."""
    os.makedirs(wal)
    for i in range(n):
        m, p = "mnd_p%05d" % i, "plan_p%05d" % i
        mrec = {"op": "mandate", "mandate_id": m, "schedule": "gone",
                "fired_at": "2026-04-20T12:00:00Z", "ts": "2026-04-20T12:00:00.000Z"}
        base = [mrec, plan_commit(p, m), append("observe_001", p, m)]
        kind = i % 6
        if kind == 0:
            recs = base + [executing("observe_001")]
        elif kind == 1:
            recs = base
        elif kind == 2:
            recs = base + [executing("observe_001"), failed("observe_001")]
        elif kind == 3:
            recs = [mrec]
        elif kind == 4:
            recs = base
        else:
            recs = base + [executing("observe_001"), completed("observe_001")]
        path = os.path.join(wal, m + ".wal.jsonl")
        with open(path, "wb") as f:
            for j, r in enumerate(recs):
                f.write(wal_line(r).encode())
                if kind == 4 and j == 0:
                    f.write(b"this is not json\n")
            if i % 50 == 7 and kind != 4:
                f.write(b'{"op":"transition","step_id":"obs')


class TestRecoveryWorkers(DaemonCase):
    N = 2000

    def recover(self, golden, lanes):
        """A fresh copy of golden recovered with this many pool lanes: the
        journal's decision and removal lines, and the status's summary."""
        if os.path.exists(self.state):
            shutil.rmtree(self.state)
        os.makedirs(self.state)
        shutil.copytree(golden, os.path.join(self.state, "wal"))
        self.notify.clear()
        env = {"KAIROS_TEST_RECOVER_LANES": str(lanes)} if lanes else None
        d = self.start(env=env)
        self.notify.wait_ready(timeout=120)
        c = self.client()
        rec = c.call("status")["result"]["recovery"]
        c.close()
        self.assertEqual(d.stop(), 0, d.log()[-3000:])
        self.daemons.remove(d)
        lines = [re.sub(r"\.torn\.[0-9]+", ".torn.SECS", ln.split("recovery: ", 1)[1].strip())
                 for ln in d.log().splitlines() if "recovery: " in ln and "mnd_p" in ln]
        rec.pop("duration_ms", None)
        return lines, rec

    def test_each_wal_decided_once_the_same_as_one_worker(self):
        """2,000 WALs of mixed states, recovered by one pool lane
        (KAIROS_TEST_RECOVER_LANES=1: one WAL at a time) and by all of them
        (16 jobs in flight over disjoint chunks): every WAL is handled
        exactly once (one decision line per interrupted or never-started
        step, one removal, one quarantine, one torn tail) and both runs
        decide the same."""
        golden = os.path.join(self.dir, "golden")
        prepare_mixed(golden, self.N)
        one, one_rec = self.recover(golden, 1)
        many, many_rec = self.recover(golden, None)
        per = {}
        for ln in many:
            m = ln.split()[0].split("/")[-1].split(".")[0].rstrip(":")
            per.setdefault(m, []).append(ln)
        for i in range(self.N):
            m = "mnd_p%05d" % i
            kind = i % 6
            got = per.get(m, [])
            # (a failed step is the executor's, after READY=1: no line here)
            want = {0: 1, 1: 1, 2: 0, 3: 1, 4: 1, 5: 1}[kind] + (1 if i % 50 == 7 and
                                                                  kind != 4 else 0)
            self.assertEqual(len(got), want, "%s (kind %d): %r" % (m, kind, got))
        self.assertEqual(sorted(one), sorted(many))
        self.assertEqual(one_rec, many_rec)
        self.assertEqual(many_rec["files"], self.N)
        self.assertEqual(many_rec["quarantined"], self.N // 6 + (1 if self.N % 6 > 4 else 0))


class TestRecoveryOrder(DaemonCase):
    """The WALs found at start are recovered in the byte order of their
    names (strcmp): with one pool lane (KAIROS_TEST_RECOVER_LANES=1) the
    journal's decisions come in that order.  The names are made for the
    sort that puts them in order (8 bytes at a time after the prefix all
    share, strcmp among those with the same 8): names ending inside those 8
    bytes, names alike in them and not after, prefixes of one another,
    bytes above 0x7f."""

    def recover_order(self, ids):
        wal = os.path.join(self.state, "wal")
        if os.path.exists(self.state):
            shutil.rmtree(self.state)
        os.makedirs(wal)
        for i, m in enumerate(ids):
            p = "plan_o%04d" % i
            recs = [{"op": "mandate", "mandate_id": m, "schedule": "gone",
                     "fired_at": "2026-04-20T12:00:00Z", "ts": "2026-04-20T12:00:00.000Z"},
                    plan_commit(p, m), append("observe_001", p, m)]
            with open(os.path.join(wal, m + ".wal.jsonl"), "w", encoding="utf-8") as f:
                f.write("".join(wal_line(r) for r in recs))
        self.notify.clear()
        d = self.start(env={"KAIROS_TEST_RECOVER_LANES": "1"})
        self.notify.wait_ready(timeout=60)
        self.assertEqual(d.stop(), 0, d.log()[-3000:])
        self.daemons.remove(d)
        got = [ln.split("recovery: ", 1)[1].split(" observe_001:")[0]
               for ln in d.log().splitlines() if "recovery: " in ln and " observe_001: " in ln]
        self.assertEqual(len(got), len(ids), d.log()[-3000:])
        self.assertEqual(got, sorted(ids, key=lambda x: x.encode()))

    def names(self, prefix, rng):
        fixed = ["", "a", "ab", "abcdefg", "abcdefgh", "abcdefgh0", "abcdefghZ",
                 "abcdefgi", "abcdefghijklmnop", "abcdefghijklmnoq", "abcdefghijklmno",
                 "ABCDEFGH", "b", "b" * 20, "b" * 21, "zzé", "zzéa", "zz~", "0", "-",
                 "_", "x_", "x-", "x0"]
        ids = set(prefix + f for f in fixed if prefix + f)
        while len(ids) < 300:
            n = rng.randint(1, 14)
            ids.add(prefix + "".join(rng.choice("ab0_-Zé") for _ in range(n)))
        ids = list(ids)
        rng.shuffle(ids)
        return ids

    def test_recovered_in_name_order(self):
        import random
        rng = random.Random(23)
        self.recover_order(self.names("mnd_", rng))
        # a prefix of 17 bytes all share, then names alike for 8 more
        self.recover_order(self.names("mnd_shared_prefix", rng))


class TestLifecycle(DaemonCase):
    def test_term_exits_zero_with_stopping(self):
        d = self.start()
        self.notify.wait_ready()
        self.assertEqual(d.stop(signal.SIGTERM), 0)
        self.notify.wait_for(lambda m: "STOPPING=1" in m, 5)
        self.assertFalse(os.path.exists(os.path.join(self.state, "control.sock")))

    def test_abstract_notify_socket(self):
        """NOTIFY_SOCKET naming an abstract socket (@name) is reached too,
        status changes and all (kairosd keeps one socket for its notices)."""
        name = "kairos-notify-%d-%s" % (os.getpid(), os.path.basename(self.dir))

        class Abstract(NotifySocket):
            def __init__(self):
                self.path = "@" + name
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self.sock.bind("\0" + name)
                self.messages = []
                self.cond = threading.Condition()
                self.closed = False
                self.thread = threading.Thread(target=self._reader, daemon=True)
                self.thread.start()

        notify = Abstract()
        try:
            d = self.start(notify=notify)
            notify.wait_ready()
            notify.wait_for(lambda m: m.startswith("STATUS=0 mandates running"), 10)
            self.assertEqual(d.stop(signal.SIGTERM), 0)
            notify.wait_for(lambda m: "STOPPING=1" in m, 5)
        finally:
            notify.close()

    def test_status_changes_are_rate_limited_and_the_last_is_sent(self):
        """STATUS= changes (two per mandate) are rate-limited: a burst of
        mandates sends at most a few, the newest status always follows
        within the interval, and one still waiting when kairosd stops goes
        out before STOPPING=1."""
        conf = write_config(self.dir, self.state, {
            "ok": {"Schedule": {"Cron": "0 0 1 1 *", "Concurrency": "allow"},
                   "Mandate": {"MaxCycles": "1"}, "Exec": {"Act": "/bin/true"}},
            "slow1": SLOW_SCHEDULE, "slow2": SLOW_SCHEDULE},
            daemon_extra="GracefulTimeoutSec=1\n")
        d = self.start(config=conf, env={"KAIROS_TEST_STATUS_INTERVAL_MS": "2000"})
        self.notify.wait_ready()
        self.notify.wait_for(lambda m: m.startswith("STATUS=0 mandates running"), 10)
        with self.notify.cond:
            n0 = len(self.notify.messages)

        def status_after(n):
            with self.notify.cond:
                return [x for x in self.notify.messages[n:] if x.startswith("STATUS=")]

        c = self.client()
        for i in range(5):
            m = c.call("fire", schedule="ok", at="2026-04-20T12:00:%02dZ" % i)["result"]["mandate"]
            d.wait_log("mandate %s done" % m)
        # the newest status arrives (from the timer) with nothing changing
        # after it
        c.call("fire", schedule="slow1", at="2026-04-20T12:01:00Z")
        self.notify.wait_for(
            lambda m: status_after(n0) and status_after(n0)[-1].startswith("STATUS=1 mandate running"),
            15)
        # eleven changes: without the rate limit eleven datagrams, with it one
        # or two (a slow machine may span one more interval)
        self.assertLessEqual(len(status_after(n0)), 3, status_after(n0))
        # a change still waiting when kairosd stops is sent before STOPPING=1
        with self.notify.cond:
            n1 = len(self.notify.messages)
        m = c.call("fire", schedule="slow2", at="2026-04-20T12:02:00Z")["result"]["mandate"]
        d.wait_log("%s observe_001: started" % m)
        c.close()
        self.assertEqual(d.stop(signal.SIGTERM), 0)
        self.notify.wait_for(lambda m: "STOPPING=1" in m, 10)
        with self.notify.cond:
            msgs = self.notify.messages[n1:]
        stopping = next(i for i, x in enumerate(msgs) if "STOPPING=1" in x)
        self.assertTrue(any(x.startswith("STATUS=2 mandates running") for x in msgs[:stopping]),
                        msgs)

    def test_status_after_ready_is_not_held(self):
        """The status that follows READY=1 is sent at once, whatever the
        rate limit (`systemctl start` returns at READY and the status is
        read right after)."""
        self.start(env={"KAIROS_TEST_STATUS_INTERVAL_MS": "600000"})
        self.notify.wait_ready()
        self.notify.wait_for(lambda m: m.startswith("STATUS=0 mandates running"), 10)

    def test_notify_socket_gone_is_a_warning_once(self):
        """A notice the manager cannot get (its socket is gone) is a warning
        the first time (a lost READY=1 times the start out), debug after."""
        gone = os.path.join(self.dir, "no-such-dir", "notify.sock")
        d = self.start(notify=None, env={"NOTIFY_SOCKET": gone})
        d.wait_log("ready: recovered")
        self.assertEqual(d.stop(signal.SIGTERM), 0)
        warned = [ln for ln in d.log().splitlines() if "cannot notify the service manager" in ln]
        self.assertTrue(warned, d.log())
        self.assertEqual(warned[0], "<4>cannot notify the service manager (STATUS=recovering): "
                         "No such file or directory", warned)
        self.assertFalse([ln for ln in warned[1:] if not ln.startswith("<7>")], warned)

    def test_second_daemon_on_same_state_dir_refused(self):
        self.start()
        self.notify.wait_ready()
        second = subprocess.run([os.environ["KAIROSD"], "--state-dir", self.state],
                                capture_output=True, text=True, timeout=30)
        self.assertEqual(second.returncode, 1)
        self.assertIn("already using state directory " + self.state, second.stderr)

    def test_watchdog_pings_at_half_the_interval(self):
        self.start(env={"WATCHDOG_USEC": "200000"})
        self.notify.wait_ready()
        self.notify.clear()
        t0 = time.monotonic()
        # Wait for the 15th ping: one per 100 ms, so about 1.5 s.
        self.notify.wait_for(lambda m: self.notify.count(lambda x: x == "WATCHDOG=1") >= 15, 10)
        elapsed = time.monotonic() - t0
        self.assertGreater(elapsed, 1.2, "pings come too fast")
        self.assertLess(elapsed, 3.0, "pings come too slowly")

    def test_watchdog_for_another_pid_is_ignored(self):
        self.start(env={"WATCHDOG_USEC": "100000", "WATCHDOG_PID": "1"})
        self.notify.wait_ready()
        c = self.client()
        c.call("status")  # a full round trip through the loop
        time.sleep(0.5)  # a window in which 5 pings would have come
        c.call("status")
        self.assertEqual(self.notify.count(lambda m: m == "WATCHDOG=1"), 0)

    def write_config(self, extra=""):
        path = os.path.join(self.dir, "kairosd.conf")
        with open(path, "w") as f:
            f.write("[Daemon]\nStateDirectory=%s\nControlSocket=%s/control.sock\nLogLevel=info\n%s"
                    % (self.state, self.state, extra))
        return path

    def test_reload_keeps_old_config_on_error(self):
        conf = self.write_config()
        d = self.start(config=conf)
        self.notify.wait_ready()
        self.notify.clear()
        self.write_config("Bogus=1\n")
        d.proc.send_signal(signal.SIGHUP)
        self.notify.wait_for(lambda m: "RELOADING=1" in m and "MONOTONIC_USEC=" in m)
        self.notify.wait_ready()
        d.wait_log("reload failed")
        self.assertIn("reload failed, keeping the running configuration", d.log())
        self.assertIn(conf + ":5: Bogus=", d.log())
        c = self.client()
        self.assertTrue(c.call("status")["ok"])
        # The control command reports the errors synchronously.
        r = c.call("reload")
        self.assertFalse(r["ok"])
        self.assertEqual(r["error"]["code"], "config_invalid")
        self.assertIn(conf + ":5: Bogus=", r["error"]["detail"]["errors"][0])
        # A good config applies.
        self.write_config("LogLevel=debug\n")
        r = c.call("reload")
        self.assertTrue(r["ok"], r)
        d.wait_log("configuration reloaded")
        c.close()

    def test_usr1_dumps_status(self):
        d = self.start()
        self.notify.wait_ready()
        d.proc.send_signal(signal.SIGUSR1)
        line = d.wait_log("status: ")
        self.assertIn("0 mandates", line)
        self.assertIn("config built-in", line)

    def test_runs_without_notify_socket(self):
        d = self.start(notify=None)
        d.wait_log("ready: ")
        c = self.client()
        self.assertTrue(c.call("status")["result"]["ready"])
        c.close()
        self.assertEqual(d.stop(), 0)

    def test_check_config(self):
        good = self.write_config()
        out = subprocess.run([os.environ["KAIROSD"], "-c", good, "--check-config"],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("configuration %s: ok" % good, out.stdout)
        self.assertIn("schedules: 0", out.stdout)
        bad = self.write_config("MaxConcurrentMandates=0\nFoo=bar\n")
        out = subprocess.run([os.environ["KAIROSD"], "-c", bad, "--check-config"],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 1)
        self.assertIn(bad + ":5: MaxConcurrentMandates=: 0 out of range 1..1024", out.stderr)
        self.assertIn(bad + ":6: Foo=: unknown key in [Daemon]", out.stderr)
        self.assertIn("configuration has 2 errors", out.stderr)
        # The daemon refuses to start on it, with the same messages.
        out = subprocess.run([os.environ["KAIROSD"], "-c", bad], capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 1)
        self.assertIn(bad + ":6: Foo=: unknown key in [Daemon]", out.stderr)
        self.assertFalse(os.path.exists(self.state), "nothing is created for a broken config")

    def test_check_config_cluster(self):
        """[Cluster]: the keys of Backend=postgres are errors with files, at
        their file:line, from --check-config, at start and from kairosctl
        recover; the connection string's password is never shown."""
        kd, ctl = os.environ["KAIROSD"], os.environ["KAIROSCTL"]
        secret = "pw-3f9a1c"
        bad = self.write_config("[Cluster]\nConnectionString=host=db password=%s\n"
                                "LeaseSec=20\n" % secret)
        want = [bad + ":6: ConnectionString=: only valid with Backend=postgres (the backend "
                "is files)",
                bad + ":7: LeaseSec=: only valid with Backend=postgres (the backend is files)"]
        out = subprocess.run([kd, "-c", bad, "--check-config"], capture_output=True,
                             text=True, timeout=30)
        self.assertEqual(out.returncode, 1)
        self.assertEqual(out.stderr.splitlines(),
                         want + ["kairosd: configuration has 2 errors"])
        out = subprocess.run([kd, "-c", bad], capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 1)
        self.assertIn(want[0], out.stderr)
        self.assertNotIn(secret, out.stdout + out.stderr)
        out = subprocess.run([ctl, "recover", "--dry-run", "--config", bad, "--state-dir",
                              self.dir], capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 65, out.stderr)
        self.assertIn("kairosctl: " + want[1], out.stderr)
        self.assertNotIn(secret, out.stdout + out.stderr)
        # A line without '=' in [Cluster] is not echoed.
        bad = self.write_config("[Cluster]\nConnectionString postgresql://k:%s@db/k\n" % secret)
        out = subprocess.run([kd, "-c", bad, "--check-config"], capture_output=True,
                             text=True, timeout=30)
        self.assertEqual(out.returncode, 1)
        self.assertIn(bad + ":6: missing '=' (expected Key=Value or [Section]; the line is not "
                      "shown: [Cluster] may hold a password)", out.stderr)
        self.assertNotIn(secret, out.stdout + out.stderr)
        # Backend=postgres: refused by a build without PostgreSQL, else valid;
        # either way the password is not shown.
        conf = self.write_config("[Cluster]\nBackend=postgres\nConnectionString=host=db "
                                 "password=%s\nNodeName=n1\n" % secret)
        out = subprocess.run([kd, "-c", conf, "--check-config"], capture_output=True,
                             text=True, timeout=30)
        if out.returncode == 1:
            self.assertEqual(out.stderr.splitlines(),
                             [conf + ":6: Backend=: kairosd was built without PostgreSQL "
                              "support (-Dpostgres=enabled)",
                              "kairosd: configuration has 1 error"])
        else:
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("cluster: postgres, node n1, lease 10 s\n", out.stdout)
        self.assertNotIn(secret, out.stdout + out.stderr)

    def test_check_config_warns_per_attempt_tool_run_args(self):
        """--check-config warns, with file:line, when an Effects= phase calls
        kairosctl tool run with a per-attempt value; a clean one gets none."""
        good = self.write_config()
        sdir = os.path.join(self.dir, "schedules.d")
        os.makedirs(sdir, exist_ok=True)
        with open(os.path.join(sdir, "send.conf"), "w") as f:
            f.write("[Schedule]\nCron=@daily\n[Exec]\nAct=kairosctl tool run --key "
                    "$KAIROS_IDEM_KEY -- /usr/bin/send $KAIROS_ATTEMPT\n")
        with open(os.path.join(sdir, "clean.conf"), "w") as f:
            f.write("[Schedule]\nCron=@daily\n[Exec]\nAct=kairosctl tool run --key "
                    "$KAIROS_IDEM_KEY -- /usr/bin/send $KAIROS_STEP_ID\n"
                    "Observe=/bin/echo $KAIROS_ATTEMPT\n")
        kd = os.environ["KAIROSD"]
        out = subprocess.run([kd, "-c", good, "--check-config"], capture_output=True, text=True,
                             timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)  # a warning does not fail
        warnings = [x for x in out.stderr.splitlines() if x.startswith("warning: ")]
        self.assertEqual(len(warnings), 1, out.stderr)
        self.assertTrue(warnings[0].startswith(
            "warning: %s/send.conf:4: Act=: 'kairosctl tool run' gets $KAIROS_ATTEMPT, which "
            "changes from one attempt of the step to the next" % sdir), warnings)
        self.assertIn("(exit 65)", warnings[0])

    def test_check_config_schedules_warnings_and_main_only(self):
        good = self.write_config()
        sdir = os.path.join(self.dir, "schedules.d")
        os.makedirs(sdir, exist_ok=True)
        with open(os.path.join(sdir, "echo.conf"), "w") as f:
            f.write('[Schedule]\nCron=@daily\n[Exec]\nReflect=/bin/echo {"kairos":{"done":true}}\n')
        kd = os.environ["KAIROSD"]
        out = subprocess.run([kd, "-c", good, "--check-config"], capture_output=True, text=True,
                             timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)  # a warning does not fail
        self.assertIn("warning: %s/echo.conf:4: Reflect=: argument 1 '{kairos:{done:true}}' "
                      "looks like JSON whose double quotes were removed" % sdir, out.stderr)
        with open(os.path.join(sdir, "bad.conf"), "w") as f:
            f.write("[Schedule]\nCron=@daily\n[Mandate]\nCheckpointEvery=1\n")
        out = subprocess.run([kd, "-c", good, "--check-config"], capture_output=True, text=True,
                             timeout=30)
        self.assertEqual(out.returncode, 1)
        self.assertIn("%s/bad.conf:4: CheckpointEvery=: not supported" % sdir, out.stderr)
        self.assertIn("1 schedule broken", out.stderr)
        out = subprocess.run([kd, "-c", good, "--check-config", "--main-only"],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("schedules: not checked (--main-only)", out.stdout)
        out = subprocess.run([kd, "-c", good, "--main-only"], capture_output=True, text=True,
                             timeout=30)
        self.assertEqual(out.returncode, 64)

    def test_limits_without_a_delegated_cgroup_are_warned(self):
        """MemoryMax=, TasksMax=, CPUQuota= work only in a delegated cgroup
        (under systemd, Delegate=yes); here there is none: kairosd says so for
        each schedule that sets them, at start and at reload, and
        --check-config notes it."""
        conf = self.write_config()
        sdir = os.path.join(self.dir, "schedules.d")
        os.makedirs(sdir)
        def schedule(name, exec_keys):
            with open(os.path.join(sdir, name + ".conf"), "w") as f:
                f.write("[Schedule]\nCron=0 0 1 1 *\n[Exec]\nObserve=true\n" + exec_keys)
        schedule("capped", "MemoryMax=20M\nTasksMax=16\n")
        schedule("plain", "")
        out = subprocess.run([os.environ["KAIROSD"], "-c", conf, "--check-config"],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = out.stdout.splitlines()
        i = next(k for k, l in enumerate(lines) if l.startswith("  capped:"))
        self.assertIn("enforced only with a delegated cgroup (under systemd, Delegate=yes)",
                      lines[i + 1])
        self.assertFalse(any("note:" in l for l in lines if "plain" in l))
        self.assertEqual(sum("note:" in l for l in lines), 1, out.stdout)
        d = self.start(config=conf)
        self.notify.wait_ready()
        line = d.wait_log("schedule capped:")
        self.assertIn("MemoryMax= TasksMax= not enforced: no delegated cgroup", line)
        self.assertNotIn("CPUQuota=", line)
        self.assertNotIn("schedule plain:", d.log())
        schedule("plain", "CPUQuota=50%\n")
        r = self.client().call("reload")
        self.assertTrue(r["ok"], r)
        line = d.wait_log("schedule plain:")
        self.assertIn("CPUQuota= not enforced: no delegated cgroup", line)

    def test_command_line(self):
        kd = os.environ["KAIROSD"]
        out = subprocess.run([kd, "--version"], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0)
        self.assertRegex(out.stdout, r"^kairosd \d+\.\d+\.\d+\n$")
        out = subprocess.run([kd, "--help"], capture_output=True, text=True)
        self.assertIn("--check-config", out.stdout)
        out = subprocess.run([kd, "--state-dir", "relative/dir"], capture_output=True, text=True)
        self.assertEqual(out.returncode, 64)
        self.assertIn("must be an absolute path", out.stderr)
        out = subprocess.run([kd, "--bogus"], capture_output=True, text=True)
        self.assertEqual(out.returncode, 64)
        out = subprocess.run([kd, "-c", os.path.join(self.dir, "missing.conf")], capture_output=True, text=True)
        self.assertEqual(out.returncode, 1)
        self.assertIn("missing.conf", out.stderr)


class TestLogOnATerminal(DaemonCase):
    """kairosd's stderr on a terminal (not the journal): plain lines, the
    time and the message; no <N> syslog prefix, no journal fields (on a
    pipe they stay: systemd reads the prefix, the other tests the fields)."""

    def test_plain_lines_on_a_tty(self):
        import pty
        conf = write_config(self.dir, self.state, {
            "ok": {"Schedule": {"Cron": "0 0 1 1 *"}, "Mandate": {"MaxCycles": "1"},
                   "Exec": {"Act": "/bin/true"}}})
        master, slave = pty.openpty()
        env = dict(os.environ, NOTIFY_SOCKET=self.notify.path)
        env.pop("JOURNAL_STREAM", None)
        proc = subprocess.Popen([os.environ["KAIROSD"], "-c", conf], stdout=subprocess.DEVNULL,
                                stderr=slave, env=env)
        os.close(slave)
        out = []

        def read():
            while True:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every writer is gone
                    return
                if not chunk:
                    return
                out.append(chunk)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            self.notify.wait_ready()
            c = self.client()
            m = c.call("fire", schedule="ok", at="2026-04-20T12:00:00Z")["result"]["mandate"]
            c.close()
            deadline = time.monotonic() + 30
            while ("mandate %s done" % m) not in b"".join(out).decode(errors="replace"):
                self.assertLess(time.monotonic(), deadline, b"".join(out))
                time.sleep(0.01)
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(30)
            reader.join(30)
            os.close(master)
        self.assertEqual(rc, 0)
        lines = b"".join(out).decode(errors="replace").replace("\r\n", "\n").splitlines()
        # (the sanitizer build's own warnings are not kairosd's records)
        lines = [line for line in lines if not line.startswith("==") and
                 not line.startswith(("False positive error reports", "For details see"))]
        self.assertTrue(lines)
        for line in lines:
            self.assertRegex(line, r"^\d\d:\d\d:\d\d (?:warning: |error: )?[^<\s]", line)
            self.assertNotIn("MANDATE_ID=", line)
            self.assertNotIn("STEP_ID=", line)
        self.assertTrue(any(" ready: " in line for line in lines), lines)
        self.assertTrue(any("mandate %s done" % m in line for line in lines), lines)


class TestControl(DaemonCase):
    def setUp(self):
        super().setUp()
        prepare_state(self.state)
        conf = write_config(self.dir, self.state, {"slow": SLOW_SCHEDULE},
                            daemon_extra="GracefulTimeoutSec=1\n")
        self.d = self.start(config=conf)
        self.notify.wait_ready()
        settle(self.d)
        self.c = self.client()

    def tearDown(self):
        self.c.close()
        super().tearDown()

    def test_status_and_list(self):
        st = self.c.call("status")["result"]
        self.assertTrue(st["ready"])
        self.assertEqual(st["mandates"], 6 + EXTRA_REVIEW)
        self.assertEqual(st["by_status"]["paused"], 3)
        self.assertEqual(st["by_status"]["failed"], 1)
        # recovery's records are made durable by one syncfs, not a
        # fdatasync per WAL (test_one_syncfs_for_all_recovery_records_then_ready)
        self.assertLess(st["fdatasync_calls"], EXTRA_REVIEW)
        ids = [m["id"] for m in self.c.call("list")["result"]["mandates"]]
        # newest first; without fired_at (these WALs have no mandate record) by id, descending
        self.assertEqual(ids, sorted(ids, reverse=True))

    def test_show(self):
        r = self.c.call("show", mandate="mnd_a")
        self.assertTrue(r["ok"], r)
        steps = r["result"]["plans"][0]["steps"]
        self.assertEqual(steps[0]["step_id"], "observe_001")
        self.assertEqual(steps[0]["status"], "completed")
        self.assertTrue(steps[0]["recovered"])
        self.assertEqual(r["result"]["status"], "paused")
        self.assertEqual(self.c.call("show", mandate="mnd_nope")["error"]["code"], "not_found")
        # An archived mandate is still shown (from its gzipped WAL).
        r = self.c.call("show", mandate="mnd_f")
        self.assertTrue(r["ok"], r)
        self.assertEqual(r["result"]["plans"][0]["status"], "failed")

    def test_pause_resume(self):
        r = self.c.call("fire", schedule="slow", at="2026-04-20T12:00:00Z")
        self.assertTrue(r["ok"], r)
        m = r["result"]["mandate"]
        self.d.wait_log("%s observe_001: started sleep 600" % m)
        r = self.c.call("pause", mandate=m, reason="maintenance window")
        self.assertTrue(r["ok"], r)
        self.assertEqual(r["result"]["status"], "paused")
        recs = read_records(os.path.join(self.state, "wal", m + ".wal.jsonl"))
        self.assertEqual(recs[-1]["op"], "operator")
        self.assertEqual(recs[-1]["action"], "pause")
        self.assertEqual(recs[-1]["uid"], os.getuid())
        self.assertEqual(recs[-1]["reason"], "maintenance window")
        self.assertEqual(self.c.call("pause", mandate=m)["error"]["code"], "conflict")
        self.assertEqual(self.c.call("pause", mandate=m, reason="")["error"]["code"], "bad_argument")
        r = self.c.call("resume", mandate=m)
        self.assertTrue(r["ok"], r)
        self.assertEqual(r["result"]["status"], "running", "its handler never stopped")
        r = self.c.call("resume", mandate="mnd_r")
        self.assertEqual(r["error"]["code"], "conflict")
        self.assertIn("kairosctl resolve mnd_r observe_001", r["error"]["message"])
        self.assertEqual(self.c.call("pause", mandate="mnd_c")["error"]["code"], "quarantined")

    def test_resolve(self):
        wal = os.path.join(self.state, "wal", "mnd_r.wal.jsonl")
        bad = [({"mandate": "mnd_r", "step": "observe_001", "action": "maybe", "reason": "x"}, "bad_argument"),
               ({"mandate": "mnd_r", "step": "observe_001", "action": "retry"}, "bad_argument"),
               ({"mandate": "mnd_r", "step": "observe_001", "action": "retry", "reason": ""}, "bad_argument"),
               ({"mandate": "mnd_r", "step": "act_001", "action": "retry", "reason": "x"}, "conflict"),
               ({"mandate": "mnd_r", "step": "nope_001", "action": "retry", "reason": "x"}, "not_found"),
               ({"mandate": "mnd_r", "step": 7, "action": "retry", "reason": "x"}, "bad_argument")]
        before = open(wal, "rb").read()
        for args, code in bad:
            r = self.c.call("resolve", **args)
            self.assertFalse(r["ok"], args)
            self.assertEqual(r["error"]["code"], code, (args, r))
        self.assertEqual(open(wal, "rb").read(), before, "rejected requests write nothing")
        r = self.c.call("resolve", mandate="mnd_r", step="observe_001", action="retry",
                        reason="checked: the handler did nothing")
        self.assertTrue(r["ok"], r)
        self.assertEqual(r["result"]["status"], "runnable")
        recs = read_records(wal)
        self.assertEqual(recs[-2]["op"], "operator")
        self.assertEqual(recs[-2]["action"], "resolve_retry")
        self.assertEqual(recs[-2]["uid"], os.getuid())
        self.assertEqual(recs[-1]["status"], "pending")
        self.assertTrue(recs[-1]["reset"])
        # --done and --abandon on other review-paused mandates
        r = self.c.call("resolve", mandate="mnd_x000", step="observe_001", action="done", reason="verified by hand")
        self.assertTrue(r["ok"], r)
        recs = read_records(os.path.join(self.state, "wal", "mnd_x000.wal.jsonl"))
        self.assertEqual(recs[-1]["status"], "completed")
        self.assertEqual(recs[-1]["post_hash"], "sha256-post-observe")
        recs_path = os.path.join(self.state, "wal", "mnd_x001.wal.jsonl")
        r = self.c.call("resolve", mandate="mnd_x001", step="observe_001", action="abandon", reason="obsolete")
        self.assertTrue(r["ok"], r)
        recs = read_records(recs_path)
        self.assertEqual(recs[-1]["op"], "plan_finalize")
        self.assertEqual(recs[-1]["status"], "abandoned")
        self.d.wait_log("mandate mnd_x001 abandoned")
        self.d.wait_log("mandate mnd_x001: WAL archived")
        self.assertFalse(os.path.exists(recs_path), "archived")
        lst = {m["id"]: m for m in self.c.call("list")["result"]["mandates"]}
        self.assertEqual(lst["mnd_x001"]["status"], "abandoned")
        self.assertEqual(lst["mnd_x001"]["reason"], "obsolete")

    def test_bad_requests(self):
        c = self.c
        c.send_raw(b"{not json\n")
        r = c.recv_reply()
        self.assertEqual(r["error"]["code"], "bad_request")
        self.assertIn("malformed JSON", r["error"]["message"])
        c.send_raw(b"[1,2]\n")
        self.assertEqual(c.recv_reply()["error"]["code"], "bad_request")
        c.send_raw(b'{"v":2,"id":1,"cmd":"status"}\n')
        self.assertIn("v: must be 1", c.recv_reply()["error"]["message"])
        c.send_raw(b'{"v":1,"id":"x","cmd":"status"}\n')
        self.assertIn("id: must be an integer", c.recv_reply()["error"]["message"])
        c.send_raw(b'{"v":1,"id":3,"cmd":"status","args":[]}\n')
        self.assertIn("args: must be an object", c.recv_reply()["error"]["message"])
        r = c.call("frobnicate")
        self.assertEqual(r["error"]["code"], "unknown_command")
        r = c.call("show", mandate=42)
        self.assertEqual(r["error"]["code"], "bad_argument")
        self.assertIn("args.mandate", r["error"]["message"])
        r = c.call("show")
        self.assertIn("args.mandate: required", r["error"]["message"])
        # the connection still works after all that
        self.assertTrue(c.call("status")["ok"])

    def test_oversized_request_closes_connection(self):
        big = Client(self.d.socket_path)
        big.send_raw(b'{"v":1,"id":1,"cmd":"status","args":{"pad":"' + b"x" * (1024 * 1024 + 10))
        r = big.recv_reply()
        self.assertEqual(r["error"]["code"], "too_large")
        with self.assertRaises((EOFError, ConnectionResetError, BrokenPipeError)):
            big.send_raw(b"\n")
            big.recv_reply()
        big.close()
        self.assertTrue(self.c.call("status")["ok"], "the daemon is unharmed")

    def test_peer_not_allowed(self):
        # Open the path to everyone so the peer check itself is what refuses.
        os.chmod(self.dir, 0o755)
        os.chmod(self.state, 0o755)
        os.chmod(self.d.socket_path, 0o666)
        code = ("import json,os,socket,sys\n"
                "os.setgid(65534); os.setgroups([]); os.setuid(65534)\n"
                "s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
                "s.sendall(b'{\"v\":1,\"id\":1,\"cmd\":\"status\"}\\n')\n"
                "print(s.makefile().readline())\n")
        if os.getuid() != 0:
            self.skipTest("needs root to run a client as nobody")
        out = subprocess.run([sys.executable, "-c", code, self.d.socket_path],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        reply = json.loads(out.stdout)
        self.assertFalse(reply["ok"])
        self.assertEqual(reply["error"]["code"], "permission_denied")
        self.assertIn("uid 65534 is not allowed", reply["error"]["message"])

    def test_fifty_concurrent_clients(self):
        errors = []

        def worker(i):
            try:
                c = Client(self.d.socket_path)
                for _ in range(5):
                    assert c.call("status")["ok"]
                    assert c.call("show", mandate="mnd_x%03d" % i)["ok"]
                c.close()
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
