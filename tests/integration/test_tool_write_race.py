#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tool write stays within WriteRoots= while the tree under a root changes
underneath it (issue 11, item 1).

A member of the socket's group who can create entries inside a root swaps a
real directory root/sub and a symbolic link root/swp -> OUTSIDE in a tight
loop (renameat2(RENAME_EXCHANGE), from a separate process) while clients
send thousands of tool-write requests for root/sub/fileN.  Every write must
either land in the real directory (whatever its name at the moment) or be
refused with an error about the symbolic link; OUTSIDE must stay empty.  Both
ways of walking below a root are raced: openat2 and, through a test hook,
the component-by-component walk used where openat2 is missing.

KAIROS_RACE_WRITES=N sets the number of writes (default 2000, 300 under
sanitizers)."""
import base64
import os
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kairos_harness import Client  # noqa: E402
from test_idem_service import IdemCase  # noqa: E402

SANITIZED = os.environ.get("KAIROS_SANITIZED", "") not in ("", "0")
WRITES = int(os.environ.get("KAIROS_RACE_WRITES", "300" if SANITIZED else "2000"))
CLIENTS = 4

# Swaps argv[1] and argv[2] until the file argv[3] exists; prints the count.
RACER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
a, b, stop = sys.argv[1].encode(), sys.argv[2].encode(), sys.argv[3]
swap = libc.renameat2
n = 0
print("ready", flush=True)
while not os.path.exists(stop):
    for _ in range(256):
        if swap(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0:
            sys.exit("renameat2: " + os.strerror(ctypes.get_errno()))
        n += 1
print(n, flush=True)
"""


class TestSwapRace(IdemCase):
    def test_symlink_swap_never_escapes(self):
        sub = os.path.join(self.root, "sub")
        swp = os.path.join(self.root, "swp")
        os.makedirs(sub)
        os.symlink(self.outside, swp)
        stop = os.path.join(self.dir, "stop")
        racer = subprocess.Popen([sys.executable, "-c", RACER, sub, swp, stop],
                                 stdout=subprocess.PIPE, text=True)
        self.assertEqual(racer.stdout.readline(), "ready\n")
        results = [None] * WRITES
        content = base64.b64encode(b"data\n").decode()

        def client(first):
            c = Client(self.sock, timeout=120)
            try:
                for i in range(first, WRITES, CLIENTS):
                    path = os.path.join(sub, "file%d" % i)
                    results[i] = c.call("tool-write", key="race-%d" % i, path=path,
                                        content=content)
            finally:
                c.close()

        threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
        t0 = time.monotonic()
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            open(stop, "w").close()
            out, _ = racer.communicate(timeout=60)
        elapsed = time.monotonic() - t0
        self.assertEqual(racer.returncode, 0)
        swaps = int(out.split()[-1])

        escaped = sorted(os.listdir(self.outside))
        real = swp if os.path.islink(sub) else sub
        inside = set(os.listdir(real))
        ok = sum(1 for r in results if r and r["ok"])
        print("%d writes in %.1f s against %d swaps: %d written, %d refused, %d outside"
              % (WRITES, elapsed, swaps, ok, WRITES - ok, len(escaped)), flush=True)
        self.assertEqual(len(escaped), 0, "files written outside WriteRoots=: %s ..." % escaped[:5])
        written = refused = 0
        for i, r in enumerate(results):
            self.assertIsNotNone(r, i)
            name = "file%d" % i
            if r["ok"]:
                written += 1
                self.assertEqual(r["result"]["path"], os.path.join(sub, name), r)
                self.assertIn(name, inside, r)
            else:
                refused += 1
                err = r["error"]
                self.assertEqual(err["code"], "path_refused", r)
                # the link is named when it is still there when looked for
                msg = err["message"]
                self.assertTrue(msg.startswith(os.path.join(sub, name) + ": "), msg)
                self.assertTrue(msg.startswith("%s: %s is a symbolic link; " % (
                    os.path.join(sub, name), sub)) or "a directory on the path is a symbolic "
                    "link; " in msg, msg)
                self.assertNotIn(name, inside, r)
        self.assertEqual(len(inside), written)
        # the race ran: both states of root/sub were seen
        self.assertGreater(written, 0)
        self.assertGreater(refused, 0)
        # refused writes were not cached: the stored entries are the written ones
        self.assertEqual(self.ok("idem-stats")["size"], written)


class TestSwapRaceWalk(TestSwapRace):
    """The same, walking component by component as where openat2 is missing."""
    daemon_env = {"KAIROS_TEST_NO_OPENAT2": "1"}

    def setUp(self):
        super().setUp()
        if not self.hooks():
            self.skipTest("needs -Dtest_hooks=true")


if __name__ == "__main__":
    unittest.main(verbosity=2)
