#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Self-test of the network-namespace test bed (netns.py), each primitive
checked from the outside:

- a libpq connection (psql over TCP, password) from every node namespace
  reaches PostgreSQL in its namespace, a wrong password is refused; the
  host has no address of the bed's subnet and no link of its own;
- cut (link down, and netem loss 100%): that node's connection fails while
  the others still connect; after heal it connects again;
- delay 200 ms: a TCP connect from the node takes >= 400 ms (both ends
  delayed), the others stay fast; heal makes it fast again (delay and loss
  both by netem when the kernel has it and by the relay standing in for it);
- one-way cuts (the relay): "in" lets a UDP datagram from node 1 reach
  PostgreSQL's namespace and none back, "out" the reverse; heal restores
  both ways;
- delay with jitter: a connect takes at least the delay less the jitter
  each way, still bounded;
- restart_pg: the server's pid changes, connections work afterwards;
  kill_pg leaves no process in PostgreSQL's namespace, start_pg serves
  again;
- stop/cont of a process and of a whole node: every process of the node in
  state T (stopped) in /proc, then running again; kill_node leaves none;
- a shifted clock: `date +%s` under faketime in a node is 5 s ahead (or
  behind), its monotonic clock is the real one;
- teardown: after the bed's end, also on an exception or SIGTERM in the
  middle, none of its namespaces (so neither its bridge nor its links) and
  none of its processes are left.

Skipped (77) with the reason without root, `ip`/`tc`, network namespaces,
netem, faketime or the PostgreSQL server binaries.  Bounded: well under a
minute.
"""
import os
import shutil
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns  # noqa: E402

SKIP = 77
BED = None
HAVE_NETEM = False
PSQL = shutil.which("psql")

# a TCP connect to PostgreSQL from inside a namespace, timed
CONNECT_TIME = ("import socket,sys,time\n"
                "t=time.monotonic()\n"
                "s=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=5)\n"
                "print(time.monotonic()-t)\n")


def can_query(k, timeout=3):
    r = BED.run(k, [PSQL, "-X", "-A", "-t", "-d", BED.conninfo(connect_timeout=timeout),
                    "-c", "SELECT 41 + 1"], timeout=timeout + 30)
    return r.returncode == 0 and r.stdout.strip() == "42"


# the first UDP datagram on PORT within 3 s, printed ("" if none)
UDP_RECV = ("import socket,sys\n"
            "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
            "s.bind(('0.0.0.0',int(sys.argv[1])))\n"
            "print('bound',flush=True)\n"
            "s.settimeout(3)\n"
            "try:\n print(s.recv(100).decode(),flush=True)\n"
            "except socket.timeout:\n print('',flush=True)\n")
UDP_SEND = ("import socket,sys\n"
            "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
            "for _ in range(5): s.sendto(b'ping',(sys.argv[1],int(sys.argv[2])))\n")


def udp_reaches(src, dst):
    """Whether a datagram from namespace src reaches namespace dst (0:
    PostgreSQL's)."""
    p = BED.popen(dst, [sys.executable, "-c", UDP_RECV, "9999"], stdout=subprocess.PIPE,
                  text=True)
    try:
        assert p.stdout.readline().strip() == "bound"
        addr = netns.PG_ADDR if dst == 0 else netns.node_addr(dst)
        r = BED.run(src, [sys.executable, "-c", UDP_SEND, addr, "9999"])
        assert r.returncode == 0, r.stderr
        return p.stdout.readline().strip() == "ping"
    finally:
        p.kill()
        p.wait()
        p.stdout.close()


def connect_time(k):
    r = BED.run(k, [sys.executable, "-c", CONNECT_TIME, netns.PG_ADDR, str(netns.PG_PORT)])
    if r.returncode != 0:
        raise AssertionError(f"connect from node {k}: {r.stderr}")
    return float(r.stdout)


def proc_state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def wait_for(pred, timeout=10.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def netem_modes():
    """netem if the kernel has it, and the relay that stands in for it."""
    return [True, False] if HAVE_NETEM else [False]


class Bed(unittest.TestCase):
    def tearDown(self):
        BED.heal()
        BED.netem = HAVE_NETEM

    def test_connect_from_every_node(self):
        for k in range(1, BED.n + 1):
            with self.subTest(node=k):
                self.assertTrue(can_query(k))
        # nothing of the bed on the host's network: no address of its subnet,
        # no link of its own
        r = subprocess.run(["ip", "-o", "addr"], stdout=subprocess.PIPE, text=True, timeout=30)
        self.assertNotIn(netns.SUBNET + ".", r.stdout)
        r = subprocess.run(["ip", "-o", "link"], stdout=subprocess.PIPE, text=True, timeout=30)
        self.assertNotIn("br0", r.stdout)
        # the test user only over TCP from the subnet, with its password
        r = BED.run(1, [PSQL, "-X", "-d", BED.conninfo(password="wrong"), "-c", "SELECT 1"])
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("password authentication failed", r.stderr)

    def test_cut_link_down_and_heal(self):
        self.cut_and_heal("down")

    def test_cut_loss_and_heal(self):
        for netem in netem_modes():
            with self.subTest(netem=netem):
                BED.netem = netem
                self.cut_and_heal("loss")

    def cut_and_heal(self, how):
        self.assertTrue(can_query(1))
        BED.cut(1, how=how)
        t = time.monotonic()
        self.assertFalse(can_query(1, timeout=2), f"node 1 still connects after cut({how})")
        self.assertLess(time.monotonic() - t, 20)
        self.assertTrue(can_query(2), "cutting node 1 cut node 2 too")
        BED.heal(1)
        self.assertTrue(can_query(1), f"node 1 does not connect after heal ({how})")

    def test_delay(self):
        for netem in netem_modes():
            with self.subTest(netem=netem):
                BED.netem = netem
                self.delay_and_heal()

    def delay_and_heal(self):
        base = connect_time(1)
        self.assertLess(base, 0.1)
        BED.delay(1, ms=200)
        slow = min(connect_time(1) for _ in range(2))
        self.assertGreaterEqual(slow, 0.39)
        self.assertLess(slow, 2.0)
        self.assertLess(connect_time(2), 0.1, "delaying node 1 slowed node 2")
        self.assertTrue(can_query(1))
        BED.heal(1)
        self.assertLess(connect_time(1), 0.1)

    def test_cut_one_way(self):
        self.assertTrue(udp_reaches(1, 0) and udp_reaches(0, 1))
        BED.cut(1, how="in")
        self.assertTrue(udp_reaches(1, 0), "cut in: node 1's datagram did not arrive")
        self.assertFalse(udp_reaches(0, 1), "cut in: node 1 still receives")
        self.assertFalse(can_query(1, timeout=2))
        self.assertTrue(can_query(2), "cutting node 1 cut node 2 too")
        BED.heal(1)
        BED.cut(1, how="out")
        self.assertFalse(udp_reaches(1, 0), "cut out: node 1's datagram arrived")
        self.assertTrue(udp_reaches(0, 1), "cut out: node 1 receives nothing")
        BED.heal(1)
        self.assertTrue(udp_reaches(1, 0) and udp_reaches(0, 1) and can_query(1))

    def test_delay_jitter(self):
        for netem in netem_modes():
            with self.subTest(netem=netem):
                BED.netem = netem
                BED.delay(1, ms=200, jitter_ms=100)
                ts = [connect_time(1) for _ in range(3)]
                self.assertGreaterEqual(min(ts), 0.19, ts)
                self.assertLess(max(ts), 2.0, ts)
                BED.heal(1)
                self.assertLess(connect_time(1), 0.1)

    def test_kill_pg(self):
        before = BED.pg_pid()
        BED.kill_pg()
        self.assertEqual(BED.pids(0), [])
        self.assertFalse(can_query(2, timeout=2))
        BED.start_pg()
        self.assertNotEqual(BED.pg_pid(), before)
        self.assertTrue(can_query(2))

    def test_cut_pg(self):
        BED.cut_pg()
        self.assertFalse(can_query(2, timeout=2))
        BED.heal_pg()
        self.assertTrue(can_query(2))

    def test_restart_pg(self):
        before = BED.pg_pid()
        BED.restart_pg()
        self.assertNotEqual(BED.pg_pid(), before)
        self.assertTrue(can_query(3))

    def test_stop_and_cont(self):
        a = BED.popen(2, ["sleep", "300"])
        b = BED.popen(2, ["sh", "-c", "sleep 300 & wait"])
        wait_for(lambda: len(BED.pids(2)) >= 3, what="node 2's processes")
        BED.stop(a.pid)
        wait_for(lambda: proc_state(a.pid) == "T", what="SIGSTOP")
        self.assertNotEqual(proc_state(b.pid), "T")
        BED.cont(a.pid)
        wait_for(lambda: proc_state(a.pid) != "T", what="SIGCONT")
        # the whole node, children of its processes included
        stopped = BED.stop_node(2)
        self.assertEqual(set(BED.pids(2)), stopped)
        self.assertGreaterEqual(len(stopped), 3)
        for pid in stopped:
            wait_for(lambda: proc_state(pid) == "T", what=f"pid {pid} stopped")
        self.assertTrue(can_query(1), "stopping node 2 stopped node 1")
        BED.cont_node(2)
        for pid in stopped:
            wait_for(lambda: proc_state(pid) != "T", what=f"pid {pid} running")
        # a stopped node dies whole
        BED.stop_node(2)
        BED.kill_node(2)
        wait_for(lambda: BED.pids(2) == [], what="node 2 empty")
        self.assertIsNotNone(a.poll())
        self.assertIsNotNone(b.poll())

    def test_shifted_clock(self):
        if not netns.faketime_path():
            self.skipTest("faketime not found (tests/install-deps.sh --test)")
        for offset in (5, -5):
            with self.subTest(offset=offset):
                r = BED.run(3, ["date", "+%s"], clock_offset=offset)
                self.assertEqual(r.returncode, 0, r.stderr)
                skew = int(r.stdout) - time.time()
                self.assertLess(abs(skew - offset), 1.5, skew)
        # the wall clock only: the monotonic clock is the real one
        r = BED.run(3, [sys.executable, "-c", "import time; print(time.monotonic())"],
                    clock_offset=3600)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertLess(abs(float(r.stdout) - time.monotonic()), 2.0, r.stdout)
        # a process under faketime still reaches the database
        r = BED.run(3, [PSQL, "-X", "-A", "-t", "-d", BED.conninfo(), "-c", "SELECT 1"],
                    clock_offset=5)
        self.assertEqual((r.returncode, r.stdout), (0, "1\n"), r.stderr)


CHILD = r"""
import os, sys, time
sys.path.insert(0, sys.argv[1])
import netns
with netns.NetBed(nodes=1, pg=sys.argv[2] == "sigterm") as bed:
    p = bed.popen(1, ["sleep", "300"])
    q = bed.popen(0, ["sleep", "300"])
    print(bed.tag, bed.dir, p.pid, bed.pg_pid() if bed.want_pg else q.pid, flush=True)
    if sys.argv[2] == "raise":
        raise RuntimeError("a test failed")
    time.sleep(120)   # until SIGTERM
"""


class Teardown(unittest.TestCase):
    def test_after_exception_and_sigterm(self):
        """Two beds at once in two processes (their names must not collide):
        one raises inside the bed (without the server), the other is sent
        SIGTERM (with it)."""
        procs = {how: subprocess.Popen([sys.executable, "-c", CHILD,
                                        os.path.dirname(netns.__file__), how],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True)
                 for how in ("raise", "sigterm")}
        try:
            seen = {}
            for how, p in procs.items():
                line = p.stdout.readline().split()
                self.assertEqual(len(line), 4, p.stderr.read() if not line else line)
                tag, pgdir, pid, pgpid = line[0], line[1], int(line[2]), int(line[3])
                seen[how] = (tag, None if pgdir == "None" else pgdir, pid, pgpid)
            self.assertNotEqual(seen["raise"][0], seen["sigterm"][0])
            self.assertTrue(netns.leftovers(seen["sigterm"][0]))
            procs["sigterm"].send_signal(signal.SIGTERM)
            for how, p in procs.items():
                err = p.stderr.read()
                p.wait(timeout=60)
                with self.subTest(how=how):
                    tag, pgdir, pid, pgpid = seen[how]
                    self.assertNotEqual(p.returncode, 0, err)
                    self.assertEqual(netns.leftovers(tag), [])
                    if pgdir:
                        self.assertFalse(os.path.exists(pgdir))
                    for gone in (pid, pgpid):
                        self.assertFalse(os.path.exists(f"/proc/{gone}")
                                         and proc_state(gone) != "Z", f"pid {gone} left running")
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                p.wait()
                p.stdout.close()
                p.stderr.close()


def main():
    global BED, HAVE_NETEM
    why = netns.skip_reason()
    if why is None and not PSQL:
        why = "psql not found (postgresql-client)"
    if why:
        print("SKIP: " + why, file=sys.stderr)
        return SKIP
    t0 = time.monotonic()
    with netns.NetBed(nodes=3) as bed:
        BED = bed
        HAVE_NETEM = bed.netem
        tag = bed.tag
        how = ("netem and by the relay" if bed.netem
               else "the relay only (this kernel has no sch_netem)")
        print(f"bed {tag} up in {time.monotonic() - t0:.1f} s; delay and loss by {how}",
              file=sys.stderr)
        prog = unittest.main(argv=[sys.argv[0], "-v"], exit=False)
        ok = prog.result.wasSuccessful()
    left = netns.leftovers(tag)
    if left:
        print(f"FAIL: namespaces left after the bed: {left}", file=sys.stderr)
        ok = False
    print(f"total {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
