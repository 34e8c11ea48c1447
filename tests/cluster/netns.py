# SPDX-License-Identifier: MIT
"""A test bed of network namespaces for cluster mode: one PostgreSQL and N
nodes, each in a network namespace of its own, wired to a bridge, with
nemesis primitives to cut, slow, stop and skew them.

    with NetBed(nodes=3) as bed:
        bed.conninfo()                       # "host=10.77.0.1 port=5432 user=knode ..."
        bed.run(1, ["psql", "-d", bed.conninfo(), "-c", "SELECT 1"])
        bed.cut(1)            # node 1 cannot reach anything (link down)
        bed.cut(2, how="loss")  # tc netem loss 100% both ways
        bed.delay(3, ms=200)  # netem delay on node 3's traffic both ways
        bed.delay(3, ms=200, jitter_ms=50)   # each packet 150..250 ms late
        bed.cut(1, how="in")  # node 1 sends, receives nothing (IP only)
        bed.cut(1, how="out") # node 1 receives, its packets are dropped
        bed.kill_pg(); bed.start_pg()        # kill -9 every PostgreSQL process
        bed.heal(1); bed.heal()              # one node, or all
        bed.restart_pg()                     # pg_ctl restart -m immediate
        p = bed.popen(1, ["kairosd", ...])   # a process in node 1
        bed.stop(p.pid); bed.cont(p.pid)     # SIGSTOP / SIGCONT one process
        bed.stop_node(1); bed.cont_node(1)   # every process of node 1
        bed.kill_node(1)                     # SIGKILL every process of node 1
        bed.run(2, ["date"], clock_offset=5) # faketime: the wall clock 5 s ahead

Layout (nothing on the host's network: no address, route or firewall rule
is added there, and the bridge itself lives in a namespace of its own, so
the host's netfilter never sees the traffic):

    namespace <tag>-sw   bridge br0; ports pg, n1..nN (veth)
    namespace <tag>-pg   eth0 10.77.0.1/24, PostgreSQL listening there
    namespace <tag>-nK   eth0 10.77.0.(10+K)/24

<tag> is "kr" + the pid + random hex, so parallel runs and the leftovers of a
crashed run never collide.  PostgreSQL (initdb, as `nobody`) accepts TCP
only from that subnet and only for the test user (password, md5), besides
the superuser on its Unix socket.  Everything (processes of every namespace,
the server, the namespaces with their links and the bridge) is removed on
exit, also after an exception or SIGTERM (NetBed installs a SIGTERM handler
that raises SystemExit while it runs).

available() says whether the machine can run it (root, `ip`, `tc`, network
namespaces, the PostgreSQL server binaries); skip_reason() why not.
"""
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pg_fixture  # noqa: E402

SUBNET = "10.77.0"
PG_ADDR = SUBNET + ".1"
PG_PORT = 5432
USER = "knode"
PASSWORD = "knode-pw"


def node_addr(k):
    return f"{SUBNET}.{10 + k}"


def _sh(argv, check=True, timeout=30, **kw):
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.STDOUT)
    r = subprocess.run(argv, text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}: {r.stdout}"
                           f"{r.stderr or ''}")
    return r


def skip_reason():
    """None if the bed can run here, else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth, tc)"
    for tool in ("ip", "tc", "nsenter"):
        if not shutil.which(tool):
            return f"`{tool}` not found (tests/install-deps.sh --test installs iproute2)"
    if not pg_fixture.find_bindir():
        return pg_fixture.skip_reason()
    probe = f"krprobe{os.getpid()}"
    r = _sh(["ip", "netns", "add", probe], check=False)
    if r.returncode != 0:
        return f"cannot create a network namespace: {r.stdout.strip()}"
    try:
        r = _sh(["ip", "-n", probe, "link", "add", "v0", "type", "veth", "peer", "name", "v1"],
                check=False)
        if r.returncode != 0:
            return f"cannot create a veth pair: {r.stdout.strip()}"
    finally:
        _sh(["ip", "netns", "del", probe], check=False)
    return None


def available():
    return skip_reason() is None


def have_netem():
    """Whether the kernel has tc's netem qdisc (sch_netem).  Without it
    delay() and cut(how="loss") use a relay instead (see relay())."""
    probe = f"krnetem{os.getpid()}"
    if _sh(["ip", "netns", "add", probe], check=False).returncode != 0:
        return False
    try:
        _sh(["ip", "-n", probe, "link", "add", "v0", "type", "veth", "peer", "name", "v1"],
            check=False)
        return _sh(["tc", "-n", probe, "qdisc", "add", "dev", "v0", "root", "netem", "delay",
                    "1ms"], check=False).returncode == 0
    finally:
        _sh(["ip", "netns", "del", probe], check=False)


# Checksums computed in software on the bed's links (ethtool -K DEV tx off,
# through the ioctl: ethtool may be missing): a frame a relay reads from one
# veth and writes to another must carry a complete checksum.
TX_CSUM_OFF = r"""
import ctypes, fcntl, os, socket, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
for arg in sys.argv[1:]:       # NAMESPACE:DEV,DEV...
    ns, devs = arg.split(":")
    fd = os.open("/run/netns/" + ns, os.O_RDONLY)
    if libc.setns(fd, 0x40000000) != 0:                            # CLONE_NEWNET
        raise OSError(ctypes.get_errno(), "setns " + ns)
    os.close(fd)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for dev in devs.split(","):
        ev = ctypes.create_string_buffer(struct.pack("II", 0x17, 0))  # ETHTOOL_STXCSUM
        ifr = struct.pack("16sP", dev.encode(), ctypes.addressof(ev))
        fcntl.ioctl(s.fileno(), 0x8946, ifr)                       # SIOCETHTOOL
    s.close()
"""


def faketime_path():
    return shutil.which("faketime")


class NetBed:
    def __init__(self, nodes=3, pg_bindir=None, pg=True):
        if nodes < 1 or nodes > 200:
            raise ValueError("1..200 nodes")
        self.n = nodes
        self.want_pg = pg     # False: the network alone, no server
        self.bindir = pg_bindir or pg_fixture.find_bindir()
        self.tag = f"kr{os.getpid()}{secrets.token_hex(3)}"
        self.sw = f"{self.tag}-sw"
        self.pgns = f"{self.tag}-pg"
        self.namespaces = []
        self.dir = None
        self.pg_running = False
        self.children = []
        self.relays = {}      # port -> the relay process standing in for netem
        self.netem = have_netem()
        self._old_sigterm = None
        pw = pwd.getpwnam("nobody")
        self.pg_uid, self.pg_gid = pw.pw_uid, pw.pw_gid

    def ns(self, k):
        """The namespace of node k (1..N), or "pg"/0 for PostgreSQL's."""
        if k in (0, "pg"):
            return self.pgns
        if not 1 <= k <= self.n:
            raise ValueError(f"no node {k}")
        return f"{self.tag}-n{k}"

    # --- setup and teardown ----------------------------------------------
    def __enter__(self):
        self._old_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            self._setup_net()
            if self.want_pg:
                self._start_pg()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    @staticmethod
    def _on_sigterm(signum, frame):
        raise SystemExit(f"signal {signum}")

    def _batch(self, ns, lines):
        """ip commands, one a line, in namespace ns (None: the host's)."""
        _sh(["ip"] + (["-n", ns] if ns else []) + ["-batch", "-"],
            input="\n".join(lines) + "\n")

    def _setup_net(self):
        ports = [("pg", self.pgns, PG_ADDR)]
        ports += [(f"n{k}", self.ns(k), node_addr(k)) for k in range(1, self.n + 1)]
        for name in [self.sw] + [p[1] for p in ports]:
            # one at a time, so that close() knows exactly which exist
            _sh(["ip", "netns", "add", name])
            self.namespaces.append(name)
        sw = ["link set lo up", "link add br0 type bridge", "link set br0 up"]
        for port, name, _ in ports:
            sw += [f"link add {port} type veth peer name eth0 netns {name}",
                   f"link set {port} master br0", f"link set {port} up"]
        self._batch(self.sw, sw)
        for _, name, addr in ports:
            self._batch(name, ["link set lo up", f"addr add {addr}/24 dev eth0",
                               "link set eth0 up"])
        _sh([sys.executable, "-c", TX_CSUM_OFF] + [f"{p[1]}:eth0" for p in ports])

    def _pg(self, argv, check=True):
        """A server program in PostgreSQL's namespace, as nobody."""
        return _sh(["nsenter", f"--net=/run/netns/{self.pgns}", f"--setuid={self.pg_uid}",
                    f"--setgid={self.pg_gid}", "--", *argv], check=check, timeout=120,
                   cwd=self.dir, env=dict(os.environ, LC_ALL="C", TZ="UTC"))

    def _start_pg(self):
        self.dir = tempfile.mkdtemp(prefix="knet", dir="/tmp")
        os.chown(self.dir, self.pg_uid, self.pg_gid)
        os.chmod(self.dir, 0o755)
        self.data = os.path.join(self.dir, "data")
        self.log = os.path.join(self.dir, "server.log")
        self._pg([os.path.join(self.bindir, "initdb"), "-D", self.data, "-U",
                  pg_fixture.SUPERUSER, "--auth-local=trust", "--auth-host=reject", "-E", "UTF8",
                  "--locale=C", "--no-sync", "--no-instructions"])
        # TCP only from the bed's subnet and only for the test user
        with open(os.path.join(self.data, "pg_hba.conf"), "w") as f:
            f.write("local all all trust\n"
                    f"host all {USER} {SUBNET}.0/24 md5\n")
        self._pg_ctl("start")
        self.psql("postgres", f"CREATE ROLE {USER} LOGIN PASSWORD '{PASSWORD}'")
        self.psql("postgres", f"CREATE DATABASE kairos OWNER {USER}")

    def _pg_ctl(self, what, mode=None):
        opts = (f"-k {self.dir} -p {PG_PORT} -c listen_addresses='{PG_ADDR}' -c fsync=off "
                "-c full_page_writes=off -c max_connections=150 -c shared_buffers=16MB "
                "-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 "
                "-c tcp_keepalives_count=3 "
                "-c log_min_messages=warning -c password_encryption=md5")
        argv = [os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-l", self.log, "-o",
                opts, "-w", "-t", "60"]
        if mode:
            argv += ["-m", mode]
        self._pg(argv + [what])
        self.pg_running = what != "stop"

    def close(self):
        """Remove everything; safe to call twice and after a partial setup."""
        try:
            for name in list(self.namespaces):
                if name != self.pgns:
                    self._kill_ns(name)
            if self.pg_running:
                self._pg([os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-m",
                          "immediate", "-w", "-t", "60", "stop"], check=False)
                self.pg_running = False
            if self.pgns in self.namespaces:
                self._kill_ns(self.pgns)
            for p in self.children + list(self.relays.values()):
                if p.poll() is None:
                    p.kill()
                p.wait()
                if p in self.relays.values():
                    p.stdout.close()
            self.children = []
            self.relays = {}
        finally:
            for name in reversed(self.namespaces):
                _sh(["ip", "netns", "del", name], check=False)
            self.namespaces = []
            if self.dir:
                shutil.rmtree(self.dir, ignore_errors=True)
                self.dir = None
            if self._old_sigterm is not None:
                signal.signal(signal.SIGTERM, self._old_sigterm)
                self._old_sigterm = None

    # --- clients ---------------------------------------------------------
    def conninfo(self, db="kairos", **extra):
        parts = {"host": PG_ADDR, "port": PG_PORT, "user": USER, "password": PASSWORD,
                 "dbname": db, "connect_timeout": 5}
        parts.update(extra)
        return " ".join(f"{k}={v}" for k, v in parts.items())

    def psql(self, db, sql, check=True):
        """SQL as the superuser over PostgreSQL's Unix socket (never cut)."""
        psql = shutil.which("psql") or os.path.join(self.bindir, "psql")
        r = _sh([psql, "-X", "-q", "-A", "-t", "-F", "\t", "-v", "ON_ERROR_STOP=1", "-h",
                 self.dir, "-p", str(PG_PORT), "-U", pg_fixture.SUPERUSER, "-d", db, "-c", sql],
                check=check, stderr=subprocess.PIPE, timeout=60)
        return [line.split("\t") for line in r.stdout.splitlines() if line != ""]

    def _wrap(self, k, argv, clock_offset=None):
        pre = ["ip", "netns", "exec", self.ns(k)]
        if clock_offset is not None:
            ft = faketime_path()
            if not ft:
                raise RuntimeError("faketime not found (tests/install-deps.sh --test)")
            # the wall clock shifted, still running; CLOCK_MONOTONIC left alone
            pre += ["env", "FAKETIME_DONT_FAKE_MONOTONIC=1", ft, "-f", f"{clock_offset:+g}s"]
        return pre + list(argv)

    def run(self, k, argv, clock_offset=None, timeout=60, **kw):
        """Run argv in node k's namespace (k=0: PostgreSQL's) and wait."""
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("text", True)
        return subprocess.run(self._wrap(k, argv, clock_offset), timeout=timeout, **kw)

    def popen(self, k, argv, clock_offset=None, **kw):
        """Start argv in node k's namespace; killed at close() at the latest.
        With `ip netns exec` in between, the returned process is argv itself
        (ip execs it)."""
        p = subprocess.Popen(self._wrap(k, argv, clock_offset), **kw)
        self.children.append(p)
        return p

    # --- nemesis -------------------------------------------------------------
    # With netem: qdiscs on both ends of a link.  Without (kernels built
    # without sch_netem): the switch port is taken off the bridge and a relay
    # process in the switch's namespace carries its frames to the bridge
    # through another veth pair, late or not at all.
    def _qdisc(self, ns, dev, *netem):
        _sh(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "netem", *netem])

    def _qdisc_del(self, ns, dev):
        _sh(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)

    def _impair(self, port, ns, delay_ms=0, loss=False, jitter_ms=0, drop=None):
        """drop (one direction only, always through the relay: netem on one
        end would drop ARP too): "out" drops the IP packets node's port
        sends, "in" those it would receive."""
        if self.netem and not drop:
            args = ["loss", "100%"] if loss else ["delay", f"{delay_ms}ms"] + (
                [f"{jitter_ms}ms"] if jitter_ms else [])
            if ns:
                self._qdisc(ns, "eth0", *args)
            self._qdisc(self.sw, port, *args)
            return
        self._unrelay(port)
        x, y = f"x{port}", f"y{port}"
        _sh(["ip", "-n", self.sw, "link", "add", x, "type", "veth", "peer", "name", y])
        _sh([sys.executable, "-c", TX_CSUM_OFF, f"{self.sw}:{x},{y}"])
        _sh(["ip", "-n", self.sw, "link", "set", port, "nomaster"])
        _sh(["ip", "-n", self.sw, "link", "set", y, "master", "br0"])
        for dev in (x, y):
            _sh(["ip", "-n", self.sw, "link", "set", dev, "up"])
        p = subprocess.Popen(["ip", "netns", "exec", self.sw, sys.executable,
                              os.path.abspath(__file__), "relay", port, x, str(delay_ms),
                              "1" if loss else (drop or "0"), str(jitter_ms)],
                             stdout=subprocess.PIPE, text=True)
        self.relays[port] = p
        if p.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the relay for {port} did not start")

    def _unrelay(self, port):
        p = self.relays.pop(port, None)
        if not p:
            return
        p.kill()
        p.wait()
        p.stdout.close()
        _sh(["ip", "-n", self.sw, "link", "del", f"x{port}"], check=False)
        _sh(["ip", "-n", self.sw, "link", "set", port, "master", "br0"])

    def _clear(self, port, ns):
        if self.netem:
            if ns:
                self._qdisc_del(ns, "eth0")
            self._qdisc_del(self.sw, port)
        # (a one-way cut takes the relay even with netem)
        self._unrelay(port)
        _sh(["ip", "-n", self.sw, "link", "set", port, "up"])
        # neighbours that failed to answer during the cut are marked
        # unreachable: forget them, or the first connections after the heal
        # fail at once
        for name in self.namespaces:
            if name != self.sw:
                _sh(["ip", "-n", name, "neigh", "flush", "dev", "eth0"], check=False)

    def cut(self, k, how="down"):
        """Cut node k off (from PostgreSQL and every other node): "down" sets
        its switch port down (`ip link set … down`), "loss" drops all its
        packets both ways (`tc … netem loss 100%`, or the relay).  One way
        only (the relay, dropping IPv4 and IPv6 frames of one direction,
        ARP passing both ways as on a route broken one way): "in" the node
        sends (PostgreSQL receives its packets) and receives nothing, "out"
        the node receives and nothing it sends arrives."""
        if how == "down":
            _sh(["ip", "-n", self.sw, "link", "set", f"n{k}", "down"])
        elif how == "loss":
            self._impair(f"n{k}", self.ns(k), loss=True)
        elif how in ("in", "out"):
            self._impair(f"n{k}", self.ns(k), drop=how)
        else:
            raise ValueError(how)

    def delay(self, k, ms=200, jitter_ms=0):
        """Delay node k's packets by ms each way (a round trip costs 2*ms
        more), each by ms +- jitter_ms at random: netem delay on both ends
        of its link, or the relay (which keeps each direction in order)."""
        self._impair(f"n{k}", self.ns(k), delay_ms=ms, jitter_ms=jitter_ms)

    def heal(self, k=None):
        """Undo cut() and delay() on node k, or on every node."""
        for j in ([k] if k else range(1, self.n + 1)):
            self._clear(f"n{j}", self.ns(j))

    def cut_pg(self, how="down"):
        """Cut PostgreSQL off from every node."""
        if how == "down":
            _sh(["ip", "-n", self.sw, "link", "set", "pg", "down"])
        else:
            self._impair("pg", None, loss=True)

    def heal_pg(self):
        self._clear("pg", None)

    def restart_pg(self):
        """Restart PostgreSQL at once (crash-like: `-m immediate`), waiting
        until it accepts connections again."""
        self._pg_ctl("restart", mode="immediate")

    def kill_pg(self):
        """kill -9 the postmaster and every PostgreSQL process (a crash of
        the database's host), until none is left; start_pg() starts it
        again on the same data directory."""
        self._signal_ns(self.pgns, signal.SIGKILL)
        # the dead server's lock files would make the next one believe a
        # live one holds the data directory
        for lock in (os.path.join(self.data, "postmaster.pid"),
                     os.path.join(self.dir, f".s.PGSQL.{PG_PORT}.lock")):
            try:
                os.unlink(lock)
            except FileNotFoundError:
                pass
        self.pg_running = False

    def start_pg(self):
        self._pg_ctl("start")

    def pg_pid(self):
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            return int(f.readline())

    def pids(self, k):
        """Every process in node k's namespace (k=0: PostgreSQL's)."""
        r = _sh(["ip", "netns", "pids", self.ns(k)], check=False)
        return [int(x) for x in r.stdout.split() if x.isdigit()]

    @staticmethod
    def stop(pid):
        os.kill(pid, signal.SIGSTOP)

    @staticmethod
    def cont(pid):
        os.kill(pid, signal.SIGCONT)

    def _signal_ns(self, name, sig, rounds=20):
        """sig to every process of a namespace, again until no new one shows
        up (a process may fork while we go)."""
        seen = set()
        for _ in range(rounds):
            r = _sh(["ip", "netns", "pids", name], check=False)
            pids = {int(x) for x in r.stdout.split() if x.isdigit()}
            new = pids - seen if sig != signal.SIGKILL else pids
            if not new:
                return seen
            for pid in new:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            seen |= new
            if sig == signal.SIGKILL:
                time.sleep(0.01)  # let the kernel reap before listing again
        return seen

    def stop_node(self, k):
        """SIGSTOP every process of node k (the daemon and its handlers)."""
        return self._signal_ns(self.ns(k), signal.SIGSTOP)

    def cont_node(self, k):
        return self._signal_ns(self.ns(k), signal.SIGCONT)

    def kill_node(self, k):
        """SIGKILL every process of node k, as a host dying would."""
        self._kill_ns(self.ns(k))

    def _kill_ns(self, name):
        self._signal_ns(name, signal.SIGKILL)
        # stopped processes die on SIGKILL too; reap the ones we started
        for p in self.children:
            if p.poll() is None:
                try:
                    p.wait(timeout=0)
                except subprocess.TimeoutExpired:
                    pass


def leftovers(tag):
    """Namespaces of a bed's tag still present (for tests of the teardown)."""
    r = _sh(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in r.stdout.splitlines()
            if line.split() and line.split()[0].startswith(tag + "-")]


def relay(a, b, delay_ms, loss, jitter_ms=0):
    """Carry every frame between interfaces a and b (AF_PACKET), each delay_ms
    late (+- jitter_ms at random, each direction kept in order), or drop
    them all (loss "1"), or drop the IP frames read from a ("out": what
    the node sends) or from b ("in": what it would receive), ARP passing.
    Runs until killed; prints "ready" once both sockets are bound."""
    import heapq
    import random
    import select
    import socket
    ETH_P_ALL = 0x0003
    PACKET_OUTGOING = 4
    socks = {}
    for dev in (a, b):
        sk = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        sk.bind((dev, ETH_P_ALL))
        sk.setblocking(False)
        socks[dev] = sk
    other = {socks[a].fileno(): socks[b], socks[b].fileno(): socks[a]}
    dropped = {"1": {socks[a].fileno(), socks[b].fileno()}, "out": {socks[a].fileno()},
               "in": {socks[b].fileno()}}.get(loss, set())
    ip_only = loss in ("in", "out")
    last = {}
    print("ready", flush=True)
    due, n = [], 0
    while True:
        now = time.monotonic()
        while due and due[0][0] <= now:
            _, _, out, frame = heapq.heappop(due)
            try:
                out.send(frame)
            except OSError:
                pass    # the link is down or gone: the frame is lost
        timeout = max(0.0, due[0][0] - now) if due else None
        ready, _, _ = select.select(list(socks.values()), [], [], timeout)
        for sk in ready:
            try:
                frame, addr = sk.recvfrom(65536)
            except BlockingIOError:
                continue
            if addr[2] == PACKET_OUTGOING:
                continue
            if sk.fileno() in dropped and (not ip_only or addr[1] in (0x0800, 0x86DD)):
                continue
            n += 1
            d = (delay_ms + (random.uniform(-jitter_ms, jitter_ms) if jitter_ms else 0)) / 1000.0
            at = max(time.monotonic() + max(0.0, d), last.get(sk.fileno(), 0.0))
            last[sk.fileno()] = at
            heapq.heappush(due, (at, n, other[sk.fileno()], frame))


if __name__ == "__main__" and len(sys.argv) == 7 and sys.argv[1] == "relay":
    relay(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6]))
