#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Finished mandates stay finished across a power loss on a file system
whose syncfs(2) is no barrier (FUSE, here tests/fault/lossyfs: every byte
not fsynced is lost when it is killed).

Before kairosd checked its state directory's file system, the one syncfs of
an archive batch did nothing there: after a power loss every summary and
archive was empty, the mandates vanished from `list`, and re-firing one of
their ticks ran its act again.  Exit 77 (skipped) without root, /dev/fuse or
the lossyfs binary."""
import os
import shutil
import sys
import tempfile
import unittest
import gzip

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kairos_harness import (Client, Daemon, LossyMount, NotifySocket, lossyfs_usable,  # noqa: E402
                            write_config)

N = 12


def at(i):
    return "2026-04-%02dT12:00:00Z" % (1 + i)


@unittest.skipUnless(lossyfs_usable(), "needs root, /dev/fuse and lossyfs")
class TestPowerLossOnFuse(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-fuse-")
        self.backing = os.path.join(self.dir, "disk")
        self.mnt = os.path.join(self.dir, "mnt")
        os.mkdir(self.backing)
        os.mkdir(self.mnt)
        self.effects = os.path.join(self.dir, "effects")
        self.state = os.path.join(self.mnt, "state")
        self.notify = NotifySocket(self.dir)
        self.fs = None
        self.d = None

    def tearDown(self):
        if self.d:
            self.d.kill()
            self.d.proc.stderr.close()
        if self.fs:
            self.fs.kill()
        self.notify.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self):
        schedules = {"job": {"Schedule": {"Cron": "0 0 1 1 *"}, "Mandate": {"MaxCycles": "1"},
                             "Exec": {"Act": "sh -c 'echo \"$KAIROS_FIRED_AT\" >> %s'"
                                      % self.effects}}}
        # the control socket lives beside the config, off the FUSE mount
        conf = write_config(self.dir, self.state, schedules,
                            control_socket=os.path.join(self.dir, "control.sock"))
        self.notify.clear()
        self.d = Daemon(self.state, config=conf, notify=self.notify,
                        socket_path=os.path.join(self.dir, "control.sock"))
        self.notify.wait_ready()
        return Client(self.d.socket_path)

    def effect_lines(self):
        try:
            with open(self.effects) as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return []

    def test_finished_mandates_survive_power_loss(self):
        self.fs = LossyMount(self.backing, self.mnt)
        c = self.start()
        self.d.wait_log("syncfs(2) is no barrier")
        ids = []
        for i in range(N):
            r = c.call("fire", schedule="job", at=at(i))
            self.assertTrue(r["ok"], r)
            ids.append(r["result"]["mandate"])
        for m in ids:
            self.d.wait_log("mandate %s: WAL archived" % m)
        c.close()
        self.assertEqual(len(self.effect_lines()), N)
        # power loss: kairosd and the file system die at once
        self.d.kill()
        self.d.proc.stderr.close()
        self.d = None
        self.fs.kill()
        self.fs = LossyMount(self.backing, self.mnt)
        c = self.start()
        # every finished mandate is still there, done, with its summary and archive
        listed = {m["id"]: m for m in c.call("list", limit=100)["result"]["mandates"]}
        for m in ids:
            self.assertIn(m, listed, "mandate %s lost by the power loss:\n%s" % (m, self.d.log()))
            self.assertEqual(listed[m]["status"], "done", listed[m])
            summary = os.path.join(self.backing, "state", "mandates", m + ".json")
            self.assertGreater(os.path.getsize(summary), 0, summary)
            archive = os.path.join(self.backing, "state", "archive", m + ".wal.jsonl.gz")
            with gzip.open(archive) as f:
                self.assertIn(b'"plan_finalize"', f.read())
        # a re-fire of a finished tick is a no-op: its act does not run again
        for i in range(N):
            r = c.call("fire", schedule="job", at=at(i))
            self.assertTrue(r["ok"], r)
        r = c.call("status")
        self.assertTrue(r["ok"], r)
        c.close()
        self.assertEqual(self.d.stop(), 0, self.d.log()[-3000:])
        self.d.proc.stderr.close()
        self.d = None
        self.assertEqual(len(self.effect_lines()), N, self.effect_lines())


if __name__ == "__main__":
    unittest.main()
