# SPDX-License-Identifier: MIT
"""Shared helpers for black-box tests of the real kairosd/kairosctl binaries:
crc'd WAL records, a fake NOTIFY_SOCKET, a daemon runner and a control client.
Standard library only."""
import fcntl
import json
import os
import socket
import struct
import subprocess
import tempfile
import termios
import threading
import time
import zlib

KAIROSD = os.environ.get("KAIROSD", "kairosd")
KAIROSCTL = os.environ.get("KAIROSCTL", "kairosctl")


def wal_line(rec):
    """Encode one record the way kairos writes it: compact JSON in the given
    key order, then ,"crc":"xxxxxxxx"} over the line without the crc field."""
    body = json.dumps(rec, separators=(",", ":"), ensure_ascii=False)
    crc = zlib.crc32(body.encode()) & 0xFFFFFFFF
    return body[:-1] + ',"crc":"%08x"}\n' % crc


def ts(i=0):
    return "2026-04-20T12:00:%02d.000Z" % (i % 60)


def plan_commit(plan_id, mandate_id, cycle=1, phases=("observe", "orient", "decide", "act", "reflect")):
    steps = [{"step_id": "%s_%03d" % (p, cycle), "tool": "ooda." + p,
              "params_hash": "sha256-params-" + p, "pre_hash": "sha256-pre-" + p,
              "expected_post_hash": "sha256-post-" + p} for p in phases]
    return {"op": "plan_commit", "plan_id": plan_id, "mandate_id": mandate_id, "cycle": cycle,
            "plan_hash": "sha256-" + "0" * 64, "steps": steps, "ts": ts()}


def append(step, plan_id, mandate_id):
    return {"op": "append", "step_id": step, "plan_id": plan_id,
            "idem_key": mandate_id + "/" + step, "status": "pending", "ts": ts()}


def executing(step, pre="sha256-pre"):
    return {"op": "transition", "step_id": step, "status": "executing", "pre_hash": pre, "ts": ts()}


def completed(step, post="sha256-post", result_hash="sha256-result"):
    return {"op": "transition", "step_id": step, "status": "completed", "post_hash": post,
            "result_hash": result_hash, "ts": ts()}


def failed(step):
    return {"op": "transition", "step_id": step, "status": "failed", "error_class": "exit_status",
            "error_msg": "exit 1", "ts": ts()}


def read_records(path):
    out = []
    with open(path, "rb") as f:
        for line in f.read().split(b"\n"):
            if line.strip():
                out.append(json.loads(line))
    return out


class NotifySocket:
    """A fake systemd notify socket.  A thread drains it all the time (as the
    real manager does), so the daemon never blocks on a full socket."""

    def __init__(self, directory):
        self.path = os.path.join(directory, "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.messages = []
        self.cond = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self._reader, daemon=True)
        self.thread.start()

    def _reader(self):
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                return
            if not data and self.closed:
                return  # close(): shut down, nothing more to read
            with self.cond:
                self.messages.append(data.decode(errors="replace"))
                self.cond.notify_all()

    def _queued(self):
        """Bytes waiting in the socket, unread (SIOCINQ), or an error."""
        try:
            return struct.unpack("i", fcntl.ioctl(self.sock.fileno(), termios.FIONREAD,
                                                  b"\0\0\0\0"))[0]
        except OSError as e:
            return str(e)

    def clear(self):
        with self.cond:
            self.messages.clear()

    def count(self, predicate):
        with self.cond:
            return sum(1 for m in self.messages if predicate(m))

    def wait_for(self, predicate, timeout=30.0):
        """Wait until a message satisfies predicate; return it."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for m in self.messages:
                    if predicate(m):
                        return m
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("notify: no matching message; got %r (reader %s, %s "
                                       "bytes unread)" % (self.messages[-10:],
                                                          "alive" if self.thread.is_alive()
                                                          else "gone", self._queued()))
                self.cond.wait(left)

    def wait_ready(self, timeout=30.0):
        return self.wait_for(lambda m: "READY=1" in m.split("\n"), timeout)

    def close(self):
        # The reader leaves its recv before the socket is closed: closed
        # under it, the descriptor's number could name the next test's
        # socket by the time it called recv again (and take its messages).
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.thread.join(10)
        self.sock.close()


class Daemon:
    def __init__(self, state_dir, config=None, env=None, notify=None, extra_args=(),
                 preexec_fn=None, socket_path=None, pass_fds=()):
        self.state_dir = state_dir
        self._socket_path = socket_path
        args = [KAIROSD]
        if config:
            args += ["-c", config]
        if state_dir and not config:
            args += ["--state-dir", state_dir]
        elif state_dir:
            args += ["--state-dir", state_dir]
        args += list(extra_args)
        e = dict(os.environ)
        e.pop("NOTIFY_SOCKET", None)
        e.pop("WATCHDOG_USEC", None)
        e.pop("JOURNAL_STREAM", None)
        if notify:
            e["NOTIFY_SOCKET"] = notify.path
        if env:
            e.update(env)
        self.proc = subprocess.Popen(args, env=e, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, preexec_fn=preexec_fn,
                                     pass_fds=pass_fds)
        self.lines = []
        self.cond = threading.Condition()
        self.reader = threading.Thread(target=self._read_stderr, daemon=True)
        self.reader.start()

    def _read_stderr(self):
        for raw in self.proc.stderr:
            with self.cond:
                self.lines.append(raw.decode(errors="replace"))
                self.cond.notify_all()
        with self.cond:
            self.lines.append(None)  # EOF
            self.cond.notify_all()

    def wait_log(self, text, timeout=30.0):
        """Wait until a log line contains text; return the line."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for line in self.lines:
                    if line is not None and text in line:
                        return line
                if self.lines and self.lines[-1] is None:
                    raise AssertionError("kairosd exited; no log line with %r:\n%s" % (text, self.log()))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("no log line with %r:\n%s" % (text, self.log()))
                self.cond.wait(left)

    @property
    def socket_path(self):
        return self._socket_path or os.path.join(self.state_dir, "control.sock")

    def log(self):
        with self.cond:
            return "".join(line for line in self.lines if line is not None)

    def stop(self, sig=15, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(timeout)
        self.reader.join(timeout)
        return rc

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.reader.join(30)


class Client:
    """Speaks the control protocol directly (newline-delimited JSON)."""

    def __init__(self, path, timeout=30.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""
        self.next_id = 1

    def send_raw(self, data):
        self.sock.sendall(data)

    def recv_reply(self):
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("connection closed; buffered %r" % self.buf)
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def call(self, cmd, **args):
        rid = self.next_id
        self.next_id += 1
        self.send_raw(json.dumps({"v": 1, "id": rid, "cmd": cmd, "args": args}).encode() + b"\n")
        reply = self.recv_reply()
        assert reply.get("id") == rid, reply
        return reply

    def close(self):
        self.sock.close()


def write_config(directory, state, schedules=None, daemon_extra="", control_socket=None):
    """kairosd.conf in `directory` with the state in `state`, plus one
    schedules.d/NAME.conf per entry of schedules: {name: {"Section": {key: value}}}.
    The control socket is control_socket, by default state/control.sock."""
    path = os.path.join(directory, "kairosd.conf")
    with open(path, "w") as f:
        f.write("[Daemon]\nStateDirectory=%s\nControlSocket=%s\n%s"
                % (state, control_socket or os.path.join(state, "control.sock"), daemon_extra))
    sdir = os.path.join(directory, "schedules.d")
    os.makedirs(sdir, exist_ok=True)
    for name, sections in (schedules or {}).items():
        with open(os.path.join(sdir, name + ".conf"), "w") as f:
            for section, keys in sections.items():
                f.write("[%s]\n" % section)
                for k, v in keys.items():
                    for item in (v if isinstance(v, list) else [v]):
                        f.write("%s=%s\n" % (k, item))
    return path


# A schedule whose observe step runs until it is killed: a mandate that stays
# "running" for as long as a test needs it.
SLOW_SCHEDULE = {"Schedule": {"Cron": "0 0 1 1 *"}, "Exec": {"Observe": "sleep 600"}}


# tests/fault/lossyfs: a FUSE file system that keeps every byte not fsynced
# in its own memory; killing it is a power loss (test_fuse_history.py,
# test_power_loss.py).
LOSSYFS = os.environ.get("LOSSYFS", "")


def lossyfs_usable():
    """Root, /dev/fuse and the lossyfs binary (else such tests are skipped)."""
    return (os.geteuid() == 0 and os.path.exists("/dev/fuse") and bool(LOSSYFS)
            and os.path.exists(LOSSYFS))


def mounted(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


class LossyMount:
    """lossyfs over backing, mounted at mnt; kill() is the power loss.
    writeback: a seed for LOSSYFS_WRITEBACK (unsynced bytes may land), or None."""

    def __init__(self, backing, mnt, writeback=None):
        self.mnt = mnt
        env = dict(os.environ)
        env.pop("LOSSYFS_WRITEBACK", None)
        if writeback is not None:
            env["LOSSYFS_WRITEBACK"] = str(writeback)
        self.proc = subprocess.Popen([LOSSYFS, backing, mnt], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=env)
        deadline = time.monotonic() + 30
        while not mounted(mnt):
            if self.proc.poll() is not None:
                raise AssertionError("lossyfs exited: %s" % self.proc.stderr.read().decode())
            if time.monotonic() > deadline:
                raise TimeoutError("lossyfs did not mount %s" % mnt)
            time.sleep(0.02)  # polling the mount table: there is no event to wait on

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stderr.close()
        if mounted(self.mnt):
            subprocess.run(["umount", "-l", self.mnt], check=True)
