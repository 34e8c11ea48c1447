#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Black-box tests of kairosd's idempotency service and its kairosctl
commands (docs/design.md §11, issue 6): tool run (claim, run locally, replay byte
for byte), tool write (atomic, within WriteRoots=, once per key), idem
stats/get/forget, and the fixed bugs of the original: concurrent duplicates
run once, expiry on lookup, in-flight entries never evicted, explicit keys of
two tools do not collide, mismatch, state across kill -9 (between begin and
finish → interrupted; after finish → cached result), a caller's connection
dropped mid-claim → interrupted.

Side effects are counted in files the commands append to.  No sleeps as
synchronization: tests wait on files, log lines and replies."""
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kairos_harness import KAIROSCTL, Client, Daemon, NotifySocket, write_config  # noqa: E402

HOOKS = None


def ctl_env(extra=None):
    env = dict(os.environ)
    for k in ("KAIROS_CONTROL_SOCKET", "KAIROSCTL_TIMEOUT", "KAIROS_IDEM_KEY"):
        env.pop(k, None)
    if extra:
        env.update(extra)
    return env


def wait_for(pred, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.01)  # polling a file the test itself cannot be told about


class IdemCase(unittest.TestCase):
    idem_conf = None  # extra [Idempotency] lines; None: WriteRoots= the root
    daemon_env = None  # extra environment of kairosd

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-idem-")
        self.state = os.path.join(self.dir, "state")
        self.root = os.path.join(self.dir, "root")
        self.outside = os.path.join(self.dir, "outside")
        os.makedirs(self.root)
        os.makedirs(self.outside)
        self.counter = os.path.join(self.dir, "counter")
        self.notify = NotifySocket(self.dir)
        self.daemon = None
        self.conf = write_config(self.dir, self.state, {}, daemon_extra=self.daemon_extra())
        self.start()

    def daemon_extra(self):
        conf = self.idem_conf if self.idem_conf is not None else "WriteRoots=%s\n" % self.root
        return "GracefulTimeoutSec=1\n\n[Idempotency]\n" + conf.replace("ROOT", self.root) \
            .replace("OUTSIDE", self.outside).replace("DIR", self.dir)

    def start(self):
        self.notify.clear()
        self.daemon = Daemon(self.state, config=self.conf, notify=self.notify,
                             env=self.daemon_env)
        self.notify.wait_ready()
        self.sock = self.daemon.socket_path

    def kill9(self):
        self.daemon.kill()
        self.daemon.proc.stderr.close()
        self.daemon = None

    def restart(self):
        if self.daemon:
            self.assertEqual(self.daemon.stop(), 0, self.daemon.log()[-3000:])
            self.daemon.proc.stderr.close()
        self.start()

    def tearDown(self):
        if self.daemon:
            rc = self.daemon.stop()
            self.daemon.proc.stderr.close()
            self.assertEqual(rc, 0, self.daemon.log()[-3000:])
        self.notify.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- helpers ----

    def ctl(self, *args, stdin=None, env=None, timeout=60):
        p = subprocess.run([KAIROSCTL, "--socket", self.sock, *args], input=stdin,
                           capture_output=True, env=ctl_env(env), timeout=timeout)
        err = p.stderr.decode(errors="replace")
        for marker in ("Sanitizer", "runtime error:"):
            self.assertNotIn(marker, err)
        return p

    def run_counted(self, key, *extra, body="", tool=None, env=None):
        """tool run of a command that appends one line to the counter file."""
        args = ["tool", "run"]
        if key is not None:
            args += ["--key", key]
        if tool:
            args += ["--tool", tool]
        args += ["--", "sh", "-c", 'echo run >> "$0"; ' + body, self.counter, *extra]
        return self.ctl(*args, env=env)

    def runs(self):
        try:
            with open(self.counter) as f:
                return len(f.read().splitlines())
        except FileNotFoundError:
            return 0

    def raw(self, cmd, **args):
        c = Client(self.sock)
        try:
            return c.call(cmd, **args)
        finally:
            c.close()

    def ok(self, cmd, **args):
        r = self.raw(cmd, **args)
        self.assertTrue(r["ok"], r)
        return r["result"]

    def get(self, key):
        return self.ok("idem-get", key=key)

    def log_records(self):
        with open(os.path.join(self.state, "idem", "idem.jsonl"), "rb") as f:
            return [json.loads(line) for line in f.read().splitlines() if line.strip()]

    def hooks(self):
        global HOOKS
        if HOOKS is None:
            r = self.raw("test-idem-clock", advance_sec=0)
            HOOKS = r["ok"]
        return HOOKS


# Bytes no text layer survives: NULs, invalid UTF-8, CR, no final newline.
OUT = b"line one\n\x00\x01\xff\xfe binary \x00\r\nno newline at the end"
ERR = b"warning: \x00 on stderr\n\xc3\x28"


class TestToolRun(IdemCase):
    def write_script(self):
        path = os.path.join(self.dir, "emit.py")
        with open(path, "w") as f:
            f.write("import sys\n"
                    "open(sys.argv[1], 'a').write('run\\n')\n"
                    "sys.stdout.buffer.write(%r)\n"
                    "sys.stderr.buffer.write(%r)\n"
                    "sys.exit(3)\n" % (OUT, ERR))
        return path

    def test_completed_duplicate_replays_byte_for_byte(self):
        script = self.write_script()
        first = self.ctl("tool", "run", "--key", "k1", "--", sys.executable, script, self.counter)
        self.assertEqual((first.returncode, first.stdout, first.stderr), (3, OUT, ERR))
        self.assertEqual(self.runs(), 1)
        for _ in range(2):
            again = self.ctl("tool", "run", "--key", "k1", "--", sys.executable, script,
                             self.counter)
            self.assertEqual((again.returncode, again.stdout, again.stderr), (3, OUT, ERR))
        self.assertEqual(self.runs(), 1, "a duplicate never runs the command")
        e = self.get("cmd:k1")
        self.assertEqual((e["state"], e["tool"], e["durable"]), ("completed", "cmd", True))
        self.assertEqual(e["result"]["exit_status"], 3)
        self.assertEqual(base64.b64decode(e["result"]["stdout"]), OUT)
        self.assertEqual(base64.b64decode(e["result"]["stderr"]), ERR)
        # the key alone finds a tool run's entry
        self.assertEqual(self.get("k1")["key"], "cmd:k1")
        st = self.ok("idem-stats")
        self.assertEqual((st["completed"], st["hits"]), (1, 2))
        # text of idem get
        out = self.ctl("idem", "get", "k1").stdout.decode()
        self.assertIn("Key cmd:k1\n", out)
        self.assertRegex(out, r"\n  state: +completed\n")
        self.assertRegex(out, r"\n  exit status: +3\n")
        self.assertRegex(out, r"\n  stdout: +%d bytes\n" % len(OUT))

    def test_after_finish_survives_kill9(self):
        script = self.write_script()
        first = self.ctl("tool", "run", "--key", "k1", "--", sys.executable, script, self.counter)
        self.assertEqual(first.returncode, 3)
        self.kill9()
        self.start()
        again = self.ctl("tool", "run", "--key", "k1", "--", sys.executable, script, self.counter)
        self.assertEqual((again.returncode, again.stdout, again.stderr), (3, OUT, ERR))
        self.assertEqual(self.runs(), 1)

    def test_key_from_environment_and_zero_exit(self):
        p = self.run_counted(None, body="printf hi", env={"KAIROS_IDEM_KEY": "mnd_x/act_001"})
        self.assertEqual((p.returncode, p.stdout), (0, b"hi"))
        p = self.run_counted(None, body="printf hi", env={"KAIROS_IDEM_KEY": "mnd_x/act_001"})
        self.assertEqual((p.returncode, p.stdout), (0, b"hi"))
        self.assertEqual(self.runs(), 1)
        self.assertEqual(self.get("cmd:mnd_x/act_001")["state"], "completed")
        # no key at all: usage error, nothing claimed
        p = self.run_counted(None)
        self.assertEqual(p.returncode, 64)
        self.assertIn("needs --key", p.stderr.decode())

    def test_usage(self):
        for args in (["tool", "run", "--key", "k"], ["tool", "run", "--key", "k", "--bogus", "x"],
                     ["tool", "run", "--key"], ["tool", "run", "--key", "", "--", "true"]):
            p = self.ctl(*args)
            self.assertEqual(p.returncode, 64, (args, p.stderr))
        self.assertEqual(self.runs(), 0)
        self.assertEqual(self.ok("idem-stats")["size"], 0)
        # a bad key is refused by the daemon
        p = self.ctl("tool", "run", "--key", "content:x", "--", "true")
        self.assertEqual(p.returncode, 1)
        self.assertIn("bad identity", p.stderr.decode())
        p = self.ctl("tool", "run", "--key", "k", "--tool", "kairos.write", "--", "true")
        self.assertEqual(p.returncode, 1)
        self.assertIn("reserved", p.stderr.decode())

    def test_unexpanded_key_refused(self):
        # a key that is a variable nothing expanded would be shared by every run
        for key, env in (("$KAIROS_IDEM_KEY", None), ("${KAIROS_IDEM_KEY}", None),
                         ("x-${KAIROS_STEP_ID}", None), ("$", None),
                         (None, {"KAIROS_IDEM_KEY": "$KAIROS_IDEM_KEY"})):
            for cmd in (["tool", "run"], ["tool", "write"]):
                args = cmd + (["--key", key] if key else [])
                args += ["--", "sh", "-c", 'echo run >> "$0"', self.counter] \
                    if cmd[1] == "run" else [os.path.join(self.root, "f")]
                p = self.ctl(*args, stdin=b"data", env=env)
                self.assertEqual(p.returncode, 64, (args, p.stderr))
                shown = key or "$KAIROS_IDEM_KEY"
                self.assertEqual(p.stderr.decode(), "kairosctl: %s: the key \"%s\" holds a "
                                 "variable that nothing expanded: every run would share it (in "
                                 "an Exec line write $KAIROS_IDEM_KEY as a word of its own or "
                                 "${KAIROS_IDEM_KEY}, which kairosd expands; in a shell script "
                                 "\"$KAIROS_IDEM_KEY\"; or leave --key out) (see kairosctl "
                                 "--help)\n" % (" ".join(cmd), shown))
        self.assertEqual((self.runs(), os.listdir(self.root)), (0, []))
        self.assertEqual(self.ok("idem-stats")["size"], 0)
        # a $ inside a key is fine
        self.assertEqual(self.run_counted("price-$5").returncode, 0)
        self.assertEqual(self.runs(), 1)

    def test_failed_runs_are_cached_errors(self):
        p = self.ctl("tool", "run", "--key", "nx", "--", "/nonexistent/prog")
        self.assertEqual(p.returncode, 127)
        self.assertEqual(p.stderr, b"kairosctl: cannot execute '/nonexistent/prog': "
                                   b"No such file or directory\n")
        p = self.ctl("tool", "run", "--key", "nx", "--", "/nonexistent/prog")
        self.assertEqual(p.returncode, 127)
        self.assertIn(b"cached error from the first run (exec_failed)", p.stderr)
        self.assertEqual(self.get("cmd:nx")["state"], "failed")
        # killed by a signal: failed "signal", replayed with 128+N and its output
        p = self.run_counted("sig", body="printf before; kill -TERM $$")
        self.assertEqual((p.returncode, p.stdout), (128 + 15, b"before"))
        p = self.run_counted("sig", body="printf before; kill -TERM $$")
        self.assertEqual((p.returncode, p.stdout), (128 + 15, b"before"))
        self.assertIn(b"cached error from the first run (signal): killed by signal 15 (SIGTERM)",
                      p.stderr)
        self.assertEqual(self.runs(), 1)
        e = self.get("cmd:sig")
        self.assertEqual((e["state"], e["error_class"]), ("failed", "signal"))

    def test_output_too_large_keeps_the_exit_status(self):
        big = 800 * 1024
        p = self.run_counted("big", body="head -c %d /dev/zero; exit 4" % big)
        self.assertEqual(p.returncode, 4)
        self.assertEqual(len(p.stdout), big, "passed through in full")
        self.assertIn(b"too large to keep", p.stderr)
        p = self.run_counted("big", body="head -c %d /dev/zero; exit 4" % big)
        self.assertEqual((p.returncode, p.stdout), (4, b""))
        self.assertIn(b"(output_too_large)", p.stderr)
        self.assertEqual(self.runs(), 1)

    def test_json_output(self):
        p = self.ctl("--json", "tool", "run", "--key", "j", "--", "sh", "-c", "printf 'a\\0b'; exit 2")
        self.assertEqual(p.returncode, 2)
        r = json.loads(p.stdout)
        self.assertEqual((r["key"], r["exit_status"], r["cached"]), ("cmd:j", 2, False))
        self.assertEqual(base64.b64decode(r["stdout"]), b"a\0b")
        p = self.ctl("--json", "tool", "run", "--key", "j", "--", "sh", "-c", "printf 'a\\0b'; exit 2")
        self.assertEqual(p.returncode, 2)
        r = json.loads(p.stdout)
        self.assertEqual((r["outcome"], r["cached"], r["exit_status"]), ("completed", True, 2))
        self.assertEqual(base64.b64decode(r["stdout"]), b"a\0b")

    def test_explicit_key_on_two_tools_does_not_collide(self):
        a = self.run_counted("same", tool="mail", body="printf A")
        b = self.run_counted("same", tool="sms", body="printf A")
        self.assertEqual((a.returncode, b.returncode), (0, 0))
        self.assertEqual(self.runs(), 2)
        self.assertEqual(self.get("mail:same")["tool"], "mail")
        self.assertEqual(self.get("sms:same")["tool"], "sms")

    def test_mismatch(self):
        self.assertEqual(self.run_counted("m", "one").returncode, 0)
        p = self.run_counted("m", "two")
        self.assertEqual(p.returncode, 65)
        err = p.stderr.decode()
        self.assertTrue(err.startswith("kairosctl: mismatch: key cmd:m was used with another input"),
                        err)
        self.assertEqual(self.runs(), 1)
        self.assertEqual(self.ok("idem-stats")["mismatches"], 1)
        r = self.raw("tool-begin", tool="cmd", key="m", input={"argv": ["other"]})
        self.assertEqual(r["error"]["code"], "mismatch")
        self.assertEqual(r["error"]["detail"]["key"], "cmd:m")

    def test_content_keys(self):
        # No key: the content key; stable across key order, different input → different key.
        a = self.ok("tool-begin", tool="t", input={"x": 1, "y": [1, 2]})
        self.assertEqual(a["outcome"], "proceed")
        self.assertRegex(a["key"], r"^t:content:[0-9a-f]{64}$")
        r = self.raw("tool-begin", tool="t", input={"y": [1, 2], "x": 1})
        self.assertEqual((r["ok"], r["error"]["code"]), (False, "interrupted"),
                         "the first claim's connection closed: interrupted, same key")
        b = self.ok("tool-begin", tool="t", input={"x": 2})
        self.assertNotEqual(a["key"], b["key"])


class TestConcurrency(IdemCase):
    def test_two_clients_racing_exactly_one_runs(self):
        fifo = os.path.join(self.dir, "gate")
        os.mkfifo(fifo)
        started = os.path.join(self.dir, "started")
        cmd = ["tool", "run", "--key", "race", "--", "sh", "-c",
               'echo run >> "$0"; : > "$1"; read x < "$2"; echo done', self.counter, started, fifo]
        a = subprocess.Popen([KAIROSCTL, "--socket", self.sock, *cmd], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=ctl_env())
        wait_for(lambda: os.path.exists(started), "the first client's command to start")
        b = self.ctl(*cmd)
        self.assertEqual(b.returncode, 75, b.stderr)
        self.assertIn(b"in_progress", b.stderr)
        with open(fifo, "w") as f:
            f.write("go\n")
        out, err = a.communicate(timeout=60)
        self.assertEqual((a.returncode, out), (0, b"done\n"), err)
        c = self.ctl(*cmd)
        self.assertEqual((c.returncode, c.stdout), (0, b"done\n"))
        self.assertEqual(self.runs(), 1)
        self.assertGreaterEqual(self.ok("idem-stats")["conflicts"], 1)

    def test_many_clients_at_once(self):
        procs = [subprocess.Popen([KAIROSCTL, "--socket", self.sock, "tool", "run", "--key", "herd",
                                   "--", "sh", "-c", 'echo run >> "$0"; sleep 0.2; echo ok',
                                   self.counter],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ctl_env())
                 for _ in range(12)]
        codes = []
        for p in procs:
            out, err = p.communicate(timeout=60)
            codes.append(p.returncode)
            self.assertIn(p.returncode, (0, 75), err)
            if p.returncode == 0:
                self.assertEqual(out, b"ok\n")
            else:
                self.assertIn(b"in_progress", err)
        self.assertEqual(self.runs(), 1, codes)


class TestInterrupted(IdemCase):
    def begin_raw(self, key):
        c = Client(self.sock)
        r = c.call("tool-begin", tool="cmd", key=key, input={"argv": ["true"]})
        self.assertTrue(r["ok"], r)
        self.assertEqual(r["result"]["outcome"], "proceed")
        return c

    def check_interrupted(self, key):
        p = self.ctl("tool", "run", "--key", key, "--", "true")
        self.assertEqual(p.returncode, 75)
        err = p.stderr.decode()
        self.assertIn("kairosctl: interrupted: key cmd:%s is interrupted" % key, err)
        self.assertIn("kairosctl idem forget cmd:%s --reason TEXT" % key, err)
        self.assertEqual(self.runs(), 0)
        e = self.get("cmd:" + key)
        self.assertEqual(e["state"], "interrupted")
        return e

    def test_kill9_between_begin_and_finish(self):
        c = self.begin_raw("k")  # the begin record is durable once proceed came
        self.kill9()
        c.close()
        self.start()
        self.daemon.wait_log("1 idempotency key came back interrupted")
        self.check_interrupted("k")
        out = self.ctl("idem", "get", "cmd:k").stdout.decode()
        self.assertIn("kairosctl idem forget cmd:k --reason TEXT", out)
        # the operator forgets it; the next run goes ahead
        p = self.ctl("idem", "forget", "cmd:k", "--reason", "checked: nothing happened")
        self.assertEqual((p.returncode, p.stdout), (0, b"forgot cmd:k (was interrupted)\n"))
        forget = [r for r in self.log_records() if r["op"] == "forget"]
        self.assertEqual((forget[0]["key"], forget[0]["uid"], forget[0]["reason"]),
                         ("cmd:k", os.getuid(), "checked: nothing happened"))
        self.assertEqual(self.run_counted("k").returncode, 0)
        self.assertEqual(self.runs(), 1)

    def test_kill9_while_kairosctl_runs_the_command(self):
        fifo = os.path.join(self.dir, "gate")
        os.mkfifo(fifo)
        started = os.path.join(self.dir, "started")
        a = subprocess.Popen([KAIROSCTL, "--socket", self.sock, "tool", "run", "--key", "k", "--",
                              "sh", "-c", ': > "$0"; read x < "$1"', started, fifo],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ctl_env())
        wait_for(lambda: os.path.exists(started), "the command to start")
        self.kill9()
        with open(fifo, "w") as f:
            f.write("go\n")
        _, err = a.communicate(timeout=60)
        self.assertEqual(a.returncode, 2, err)  # the result could not be reported
        self.start()
        e = self.get("cmd:k")
        self.assertEqual(e["state"], "interrupted")

    def test_connection_dropped_mid_claim(self):
        c = self.begin_raw("k")
        c.close()
        self.daemon.wait_log("idempotency key cmd:k interrupted")
        e = self.check_interrupted("k")
        self.assertIn("connection closed", e["reason"])
        # the same when kairosctl itself dies while its command runs
        started = os.path.join(self.dir, "started")
        a = subprocess.Popen([KAIROSCTL, "--socket", self.sock, "tool", "run", "--key", "k2", "--",
                              "sh", "-c", 'echo $$ > "$0.tmp"; mv "$0.tmp" "$0"; exec sleep 600',
                              started],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ctl_env())
        wait_for(lambda: os.path.exists(started), "the command to start")
        a.kill()
        a.wait()
        with open(started) as f:
            os.kill(int(f.read()), signal.SIGKILL)  # the orphaned command
        self.daemon.wait_log("idempotency key cmd:k2 interrupted")
        self.assertEqual(self.get("cmd:k2")["state"], "interrupted")

    def test_graceful_stop_interrupts_open_claims(self):
        c = self.begin_raw("k")
        self.restart()
        c.close()
        e = self.get("cmd:k")
        self.assertEqual(e["state"], "interrupted")
        self.assertIn("kairosd stopped", e["reason"])

    def test_finish_only_on_the_claiming_connection(self):
        c = self.begin_raw("k")
        r = self.raw("tool-finish", key="cmd:k", exit_status=0, stdout="", stderr="")
        self.assertEqual(r["error"]["code"], "conflict")
        self.assertIn("not claimed on this connection", r["error"]["message"])
        # forget refuses a processing entry
        p = self.ctl("idem", "forget", "cmd:k", "--reason", "x")
        self.assertEqual(p.returncode, 1)
        self.assertIn(b"is processing", p.stderr)
        r = c.call("tool-finish", key="cmd:k", exit_status=0, stdout="aGk=", stderr="")
        self.assertEqual(r["result"], {"key": "cmd:k", "outcome": "completed", "durable": True})
        r = c.call("tool-finish", key="cmd:k", exit_status=0, stdout="", stderr="")
        self.assertEqual(r["error"]["code"], "conflict")
        r = c.call("tool-begin", tool="cmd", key="k2", input=1)
        r = c.call("tool-finish", key="cmd:k2", exit_status=256, stdout="", stderr="")
        self.assertEqual(r["error"]["code"], "bad_argument")
        r = c.call("tool-finish", key="cmd:k2", exit_status=0, stdout="***", stderr="")
        self.assertEqual(r["error"]["code"], "bad_argument")
        c.close()
        self.assertEqual(self.get("cmd:k")["result"]["stdout"], "aGk=")


class TestCapacity(IdemCase):
    idem_conf = "MaxEntries=2\nWriteRoots=ROOT\n"

    def test_in_flight_entries_are_never_evicted(self):
        c1 = Client(self.sock)
        c2 = Client(self.sock)
        for c, k in ((c1, "a"), (c2, "b")):
            self.assertEqual(c.call("tool-begin", tool="cmd", key=k, input=1)["result"]["outcome"],
                             "proceed")
        p = self.run_counted("c")
        self.assertEqual(p.returncode, 75)
        self.assertIn(b"store_full", p.stderr)
        self.assertEqual(self.runs(), 0)
        st = self.ok("idem-stats")
        self.assertEqual((st["size"], st["processing"], st["store_full"]), (2, 2, 1))
        # one finishes: it may now be evicted for a new key, the other may not
        r = c1.call("tool-finish", key="cmd:a", exit_status=0, stdout="", stderr="")
        self.assertTrue(r["ok"], r)
        self.assertEqual(self.run_counted("c").returncode, 0)
        self.assertEqual(self.get("cmd:b")["state"], "processing")
        self.assertEqual(self.raw("idem-get", key="cmd:a")["error"]["code"], "not_found")
        self.assertEqual(self.ok("idem-stats")["evictions"], 1)
        c2.close()
        c1.close()


class TestTTL(IdemCase):
    idem_conf = "TTLSec=60\nWriteRoots=ROOT\n"

    def test_expiry_is_checked_on_lookup(self):
        if not self.hooks():
            self.skipTest("kairosd was built without -Dtest_hooks=true (no test-idem-clock)")
        self.assertEqual(self.run_counted("t").returncode, 0)
        self.ok("test-idem-clock", advance_sec=59)
        self.assertEqual(self.run_counted("t").returncode, 0)
        self.assertEqual(self.runs(), 1, "not expired yet")
        self.ok("test-idem-clock", advance_sec=2)
        # no sweeper ran: the lookup itself finds it expired
        self.assertEqual(self.run_counted("t").returncode, 0)
        self.assertEqual(self.runs(), 2)
        self.assertEqual(self.ok("idem-stats")["expirations"], 1)


class TestToolWrite(IdemCase):
    idem_conf = "WriteRoots=ROOT DIR/linkroot DIR/gone\n"

    def setUp(self):
        super().setUp()
        os.symlink(self.outside, os.path.join(self.root, "escape"))
        os.makedirs(os.path.join(self.dir, "real"))
        os.symlink(os.path.join(self.dir, "real"), os.path.join(self.dir, "linkroot"))

    def write(self, path, data=b"content\n", key="w", json_out=False):
        args = ["--json"] if json_out else []
        return self.ctl(*args, "tool", "write", "--key", key, path, stdin=data)

    def assert_nothing_written(self):
        for d in (self.outside, self.root):
            names = [n for n in os.listdir(d) if n not in ("escape", "filelink")]
            self.assertEqual(names, [], d)

    def test_write_once_per_key(self):
        target = os.path.join(self.root, "sub", "report.txt")
        os.makedirs(os.path.dirname(target))
        data = b"first \x00 version\n"
        p = self.write(target, data)
        # stdout stays clean (a handler's stdout is its step's result)
        self.assertEqual((p.returncode, p.stdout, p.stderr.decode()),
                         (0, b"", "kairosctl: wrote %d bytes to %s\n" % (len(data), target)))
        with open(target, "rb") as f:
            self.assertEqual(f.read(), data)
        self.assertEqual(os.stat(target).st_mode & 0o777, 0o644)
        mtime = os.stat(target).st_mtime_ns
        # a retry (even with other content, e.g. a new timestamp) does not write again
        p = self.write(target, b"second version\n")
        self.assertEqual((p.returncode, p.stdout, p.stderr.decode()),
                         (0, b"", "kairosctl: wrote %d bytes to %s (key kairos.write:w was done "
                          "before: not written again)\n" % (len(data), target)))
        p = self.write(target, b"second version\n", json_out=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        r = json.loads(p.stdout)
        self.assertEqual((r["cached"], r["path"], r["bytes"], r["key"]),
                         (True, target, len(data), "kairos.write:w"))
        with open(target, "rb") as f:
            self.assertEqual(f.read(), data)
        self.assertEqual(os.stat(target).st_mtime_ns, mtime)
        self.assertEqual(os.listdir(os.path.dirname(target)), ["report.txt"], "no temporary left")
        # the same key for another path: mismatch
        p = self.write(os.path.join(self.root, "other"))
        self.assertEqual(p.returncode, 65)
        self.assertIn(b"mismatch", p.stderr)
        # a new key replaces the file atomically; through a root that is a symlink too
        p = self.write(target, b"v2", key="w2")
        self.assertEqual(p.returncode, 0)
        with open(target, "rb") as f:
            self.assertEqual(f.read(), b"v2")
        p = self.write(os.path.join(self.dir, "linkroot", "x"), key="w3")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(os.path.exists(os.path.join(self.dir, "real", "x")))
        # survives a kill -9
        self.kill9()
        self.start()
        p = self.write(target, b"v3", key="w2", json_out=True)
        self.assertEqual(json.loads(p.stdout)["cached"], True)
        with open(target, "rb") as f:
            self.assertEqual(f.read(), b"v2")

    def tree(self):
        names = []
        for d in (self.outside, self.root):
            for top, dirs, files in os.walk(d):
                names += [os.path.join(top, n) for n in dirs + files]
        return sorted(names)

    def refused(self, path, *expect):
        before = self.tree()
        p = self.write(path, key="r-" + str(abs(hash(path))))
        self.assertEqual(p.returncode, 1, (path, p.stdout, p.stderr))
        err = p.stderr.decode()
        self.assertTrue(err.startswith("kairosctl: " + path + ": "), err)
        for e in expect:
            self.assertIn(e, err)
        self.assertEqual(self.tree(), before, "nothing written")
        return err

    def test_path_checks(self):
        roots = "(%s %s/linkroot %s/gone)" % (self.root, self.dir, self.dir)
        sub = os.path.join(self.root, "sub")
        os.makedirs(sub)
        self.refused(os.path.join(self.root, "..", "outside", "x"), "'..' is not allowed", roots)
        self.refused(os.path.join(sub, "..", "x"), "'..' is not allowed", roots)
        self.refused("relative/x", "not an absolute path", roots)
        self.refused(os.path.join(self.outside, "x"), "not within WriteRoots= %s" % roots,
                     "WriteRoots= %s/gone: No such file or directory" % self.dir)
        self.refused("/", "not within WriteRoots=")
        # a root itself, with or without a final slash, and a directory below it
        for p in (self.root, self.root + "/", self.root + "/.", self.root + "//"):
            self.refused(p, "names a directory (the WriteRoots= directory %s itself), "
                         "not a file" % self.root)
        self.refused(sub + "/", "names a directory, not a file")
        # no symbolic link below a root: out of it, or within it, anywhere on the path
        self.refused(os.path.join(self.root, "escape", "x"),
                     "%s is a symbolic link; tool write follows no symbolic link below a "
                     "WriteRoots= directory (name the real path)"
                     % os.path.join(self.root, "escape"))
        os.symlink(sub, os.path.join(self.root, "inlink"))
        os.symlink("sub", os.path.join(self.root, "rellink"))
        os.makedirs(os.path.join(sub, "deeper"))
        for link in ("inlink", "rellink"):
            self.refused(os.path.join(self.root, link, "deeper", "x"),
                         "%s is a symbolic link" % os.path.join(self.root, link))
        os.symlink(os.path.join(self.outside, "t"), os.path.join(self.root, "filelink"))
        os.symlink("sub/t", os.path.join(sub, "filelink"))
        self.refused(os.path.join(self.root, "filelink"), "is a symbolic link (tool write "
                     "replaces no symbolic link; name its target)")
        self.refused(os.path.join(sub, "filelink"), "is a symbolic link")
        for n in ("filelink", "inlink", "rellink"):
            os.unlink(os.path.join(self.root, n))
        os.unlink(os.path.join(sub, "filelink"))
        # not a directory, missing, not a regular file
        with open(os.path.join(sub, "plain"), "w"):
            pass
        self.refused(os.path.join(sub, "plain", "x"), "%s is not a directory"
                     % os.path.join(sub, "plain"))
        self.refused(os.path.join(self.root, "missing", "more", "x"),
                     "its directory cannot be resolved: %s does not exist"
                     % os.path.join(self.root, "missing"))
        self.refused(os.path.join(sub, "deeper"), "exists and is not a regular file")
        os.unlink(os.path.join(sub, "plain"))
        os.rmdir(os.path.join(sub, "deeper"))
        os.rmdir(sub)
        # nothing was claimed for a refused path
        self.assertEqual(self.ok("idem-stats")["size"], 0)
        # the resolved path of a root that is a symlink is within it too; "." and
        # "//" are fine
        p = self.write(os.path.join(self.dir, "real", ".", "y"), key="real")
        self.assertEqual(p.returncode, 0, p.stderr)
        p = self.write(self.root + "//./z", key="dots", json_out=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(json.loads(p.stdout)["path"], os.path.join(self.root, "z"))
        os.unlink(os.path.join(self.root, "z"))
        self.assertTrue(os.path.exists(os.path.join(self.dir, "real", "y")))
        # more than one request holds: streamed in parts
        big = bytes(range(256)) * (3 * 1024 * 4 + 7)
        p = self.write(os.path.join(self.root, "big"), big, key="big")
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(os.path.join(self.root, "big"), "rb") as f:
            self.assertEqual(f.read(), big)

    def test_a_failed_write_is_not_kept(self):
        """Nothing written: a retry with the key writes (issue 14 item 7)."""
        if os.geteuid() == 0:
            self.skipTest("root writes into a mode 0555 directory")
        ro = os.path.join(self.root, "ro")
        os.makedirs(ro, mode=0o555)
        target = os.path.join(ro, "f")
        p = self.write(target, b"one", key="perm")
        self.assertEqual(p.returncode, 1)
        self.assertIn("cannot create a temporary file in its directory: Permission denied",
                      p.stderr.decode())
        self.assertEqual(self.ok("idem-stats")["size"], 0)
        os.chmod(ro, 0o755)
        p = self.write(target, b"two", key="perm")
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(target, "rb") as f:
            self.assertEqual(f.read(), b"two")


    def test_roots_are_opened_again_at_reload(self):
        """A root is opened once: one replaced under it keeps its old
        directory until a reload opens the roots again."""
        p = self.write(os.path.join(self.root, "a"), key="a")
        self.assertEqual(p.returncode, 0, p.stderr)
        old = self.root + ".old"
        os.rename(self.root, old)
        os.makedirs(self.root)
        p = self.write(os.path.join(self.root, "b"), key="b")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(sorted(os.listdir(old)), ["a", "b", "escape"])
        self.assertEqual(os.listdir(self.root), [])
        self.assertTrue(self.raw("reload")["ok"])
        p = self.write(os.path.join(self.root, "c"), key="c")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(os.listdir(self.root), ["c"])
        # a root that did not exist is tried again at every write
        gone = os.path.join(self.dir, "gone")
        p = self.write(os.path.join(gone, "d"), key="d")
        self.assertIn("not within WriteRoots=", p.stderr.decode())
        os.makedirs(gone)
        p = self.write(os.path.join(gone, "d"), key="d")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(os.listdir(gone), ["d"])


class TestToolWriteWalk(TestToolWrite):
    """The same, walking component by component as where openat2 is missing."""
    daemon_env = {"KAIROS_TEST_NO_OPENAT2": "1"}

    def setUp(self):
        super().setUp()
        if not self.hooks():
            self.skipTest("needs -Dtest_hooks=true")


class TestToolWriteFaults(IdemCase):
    """A write that failed before its rename is not kept: the retry writes.
    Disk errors come from tests/fault/fault_inject.so on the temporary file."""
    SHIM = os.environ.get("KAIROS_FAULT_SHIM", "")

    def setUp(self):
        if not self.SHIM:
            self.skipTest("KAIROS_FAULT_SHIM not set")
        self.daemon_env = {
            "LD_PRELOAD": self.SHIM, "KAIROS_FAULT_PATH": ".kairos-tmp.",
            "KAIROS_FAULT": "open:1:eio,write:1:enospc,fdatasync:1:eio,rename:1:eio",
            "ASAN_OPTIONS": (os.environ.get("ASAN_OPTIONS", "") +
                             ":verify_asan_link_order=0").lstrip(":")}
        super().setUp()

    def test_retry_after_an_error_writes(self):
        target = os.path.join(self.root, "out.txt")
        errors = ["cannot create a temporary file in its directory: Input/output error",
                  "writing failed: No space left on device",
                  "writing failed: Input/output error",
                  "writing failed: Input/output error"]
        for i, want in enumerate(errors):
            p = self.ctl("--json", "tool", "write", "--key", "k", target,
                         stdin=b"attempt %d" % i)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn("%s: %s" % (target, want), p.stderr.decode())
            self.assertEqual(os.listdir(self.root), [], "nothing written, no temporary left")
            self.assertEqual(self.ok("idem-stats")["size"], 0)
            if i < 3:
                continue  # the content streams in before the key is claimed
            self.daemon.wait_log("tool write %s (kairos.write:k) failed, nothing written, "
                                 "not kept: %s: %s" % (target, target, want))
        p = self.ctl("tool", "write", "--key", "k", target, stdin=b"last")
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(target, "rb") as f:
            self.assertEqual(f.read(), b"last")
        # the dropped claim (of the failed rename) is in the log as a forget by
        # uid -1, and stays dropped
        forgets = [r for r in self.log_records() if r["op"] == "forget"]
        self.assertEqual(len(forgets), 1)
        self.assertTrue(all(r["uid"] == -1 for r in forgets), forgets)
        self.kill9()
        self.start()
        st = self.ok("idem-stats")
        self.assertEqual((st["size"], st["completed"], st["interrupted"]), (1, 1, 0))


class TestWriteLimit(IdemCase):
    """MaxWriteBytes=: a write streams in parts up to it; one over it is
    refused with nothing left behind (no file, no temporary, no entry)."""
    idem_conf = "WriteRoots=ROOT\nMaxWriteBytes=600K\n"

    def test_limit(self):
        target = os.path.join(self.root, "f")
        p = self.ctl("tool", "write", "--key", "at", target, stdin=b"a" * (600 << 10))
        self.assertEqual(p.returncode, 0, p.stderr)
        os.unlink(target)
        p = self.ctl("tool", "write", "--key", "over", target, stdin=b"b" * ((600 << 10) + 1))
        self.assertEqual((p.returncode, p.stdout, p.stderr.decode()),
                         (65, b"", "kairosctl: tool write: the content is larger than "
                          "MaxWriteBytes= (614400 bytes, the [Idempotency] section of "
                          "kairosd.conf): nothing was written\n"))
        self.assertEqual(os.listdir(self.root), [], "no file, no temporary")
        self.assertEqual(self.ok("idem-stats")["size"], 1)
        self.assertEqual(self.raw("idem-get", key="kairos.write:over")["error"]["code"],
                         "not_found")
        # the one-request form is held to it too
        r = self.raw("tool-write", key="one", path=target,
                     content=base64.b64encode(b"c" * (700 << 10)).decode())
        self.assertEqual(r["error"]["code"], "too_large", r)
        self.assertEqual(os.listdir(self.root), [])

    def test_stream_protocol(self):
        target = os.path.join(self.root, "g")
        r = self.raw("tool-write-data", data="eA==")
        self.assertEqual(r["error"]["code"], "bad_argument", r)
        self.assertIn("no tool write is open on this connection", r["error"]["message"])
        r = self.raw("tool-write", key="k", path=target, stream=True, content="eA==")
        self.assertEqual(r["error"]["code"], "bad_argument", r)
        r = self.raw("tool-write", key="k", path=target, stream="yes")
        self.assertIn("args.stream", r["error"]["message"])
        # a caller that goes before the end leaves nothing behind
        c = Client(self.sock)
        r = c.call("tool-write", key="k", path=target, stream=True)
        self.assertEqual((r["result"]["outcome"], r["result"]["max_bytes"]), ("send", 600 << 10))
        self.assertEqual(len([n for n in os.listdir(self.root) if ".kairos-tmp." in n]), 1)
        r = c.call("tool-write-data", data=base64.b64encode(b"part").decode())
        self.assertEqual(r["result"]["bytes"], 4, r)
        self.assertEqual(self.ok("idem-stats")["claims"], 0, "nothing claimed yet")
        c.close()
        wait_for(lambda: os.listdir(self.root) == [], "the temporary file is removed")
        self.assertEqual(self.ok("idem-stats")["size"], 0)
        # the whole exchange
        c = Client(self.sock)
        r = c.call("tool-write", key="k", path=target, stream=True)
        for part in (b"one ", b"two"):
            self.assertTrue(c.call("tool-write-data", data=base64.b64encode(part).decode())["ok"])
        r = c.call("tool-write-end")
        c.close()
        self.assertEqual((r["result"]["outcome"], r["result"]["bytes"]), ("written", 7), r)
        with open(target, "rb") as f:
            self.assertEqual(f.read(), b"one two")
        e = self.ok("idem-get", key="kairos.write:k")
        self.assertEqual(e["state"], "completed", e)


class TestWriteNoLimit(IdemCase):
    """MaxWriteBytes=infinity: no limit but the file system's."""
    idem_conf = "WriteRoots=ROOT\nMaxWriteBytes=infinity\n"

    def test_infinity(self):
        target = os.path.join(self.root, "f")
        data = b"z" * ((1 << 20) + 3)
        p = self.ctl("tool", "write", "--key", "big", target, stdin=data)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(target, "rb") as f:
            self.assertEqual(f.read(), data)
        c = Client(self.sock)
        r = c.call("tool-write", key="k", path=target + "2", stream=True)
        c.close()
        self.assertEqual((r["result"]["outcome"], r["result"]["max_bytes"]), ("send", None), r)


class TestWriteRootSlash(IdemCase):
    """WriteRoots=/: every absolute path is below it, still no symbolic link."""
    idem_conf = "WriteRoots=/\n"

    def test_root_slash(self):
        base = os.path.realpath(self.root)
        p = self.ctl("tool", "write", "--key", "a", os.path.join(base, "x"), stdin=b"x")
        self.assertEqual(p.returncode, 0, p.stderr)
        os.symlink(self.outside, os.path.join(base, "escape"))
        target = os.path.join(base, "escape", "y")
        p = self.ctl("tool", "write", "--key", "b", target, stdin=b"y")
        self.assertEqual(p.returncode, 1)
        self.assertEqual(p.stderr.decode(), "kairosctl: %s: %s is a symbolic link; tool write "
                         "follows no symbolic link below a WriteRoots= directory (name the "
                         "real path)\n" % (target, os.path.join(base, "escape")))
        p = self.ctl("tool", "write", "--key", "c", "/", stdin=b"y")
        self.assertIn("names a directory (the WriteRoots= directory / itself)", p.stderr.decode())
        self.assertEqual(os.listdir(self.outside), [])


class TestWriteRootsMissing(IdemCase):
    idem_conf = "WriteRoots=DIR/gone\n"

    def test_non_existent_root(self):
        p = self.ctl("tool", "write", "--key", "k", os.path.join(self.outside, "x"), stdin=b"x")
        self.assertEqual(p.returncode, 1)
        self.assertEqual(p.stderr.decode(),
                         "kairosctl: %s/x: no WriteRoots= directory exists (%s/gone); "
                         "WriteRoots= %s/gone: No such file or directory\n"
                         % (self.outside, self.dir, self.dir))
        self.assertEqual(os.listdir(self.outside), [])


class TestNoWriteRoots(IdemCase):
    idem_conf = ""

    def test_tool_write_not_enabled(self):
        p = self.ctl("tool", "write", "--key", "k", os.path.join(self.root, "x"), stdin=b"x")
        self.assertEqual(p.returncode, 1)
        self.assertIn("tool write is not enabled: no WriteRoots=", p.stderr.decode())
        self.assertEqual(os.listdir(self.root), [])
        out = self.ctl("idem", "stats").stdout.decode()
        self.assertIn("WriteRoots:  (none: tool write is refused)\n", out)


class TestOperator(IdemCase):
    def test_stats_get_forget(self):
        out = self.ctl("idem", "stats").stdout.decode()
        self.assertIn("Entries:     0 of 10000 (0 processing, 0 completed, 0 failed, 0 interrupted)\n",
                      out)
        self.assertIn("TTL:         86400 s\n", out)
        self.assertIn("State:       ok\n", out)
        self.assertIn("WriteRoots:  %s\n" % self.root, out)
        self.run_counted("a")
        self.run_counted("a")
        st = json.loads(self.ctl("--json", "idem", "stats").stdout)
        want = dict(self.ok("idem-stats"))
        for k in ("size", "capacity", "completed", "hits", "misses", "log_records"):
            self.assertEqual(st[k], want[k], k)
        self.assertEqual((st["size"], st["completed"], st["hits"], st["misses"]), (1, 1, 1, 1))
        self.assertEqual(st["log_path"], os.path.join(self.state, "idem", "idem.jsonl"))
        # get: not found / found
        p = self.ctl("idem", "get", "nope")
        self.assertEqual(p.returncode, 1)
        self.assertIn(b"no idempotency entry nope", p.stderr)
        self.assertEqual(json.loads(self.ctl("--json", "idem", "get", "cmd:a").stdout)["state"],
                         "completed")
        # forget: needs a reason; recorded with the caller's uid
        self.assertEqual(self.ctl("idem", "forget", "cmd:a").returncode, 64)
        p = self.ctl("--json", "idem", "forget", "cmd:a", "--reason", "redo it")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(json.loads(p.stdout), {"key": "cmd:a", "state": "completed",
                                                "forgotten": True, "uid": os.getuid()})
        self.daemon.wait_log("idempotency key cmd:a (completed) forgotten by uid %d: redo it"
                             % os.getuid())
        self.assertEqual(self.ctl("idem", "forget", "cmd:a", "--reason", "x").returncode, 1)
        self.run_counted("a")
        self.assertEqual(self.runs(), 2)

    def test_compaction(self):
        # > 2x live entries in the log: rewritten (new file, rename) with the live ones only
        for i in range(40):
            self.run_counted("k%d" % i)
            self.ctl("idem", "forget", "cmd:k%d" % i, "--reason", "churn")
        self.run_counted("keep")
        st = self.ok("idem-stats")
        self.assertGreaterEqual(st["compactions"], 1, st)
        self.assertLess(len(self.log_records()), 40)
        self.restart()
        self.assertEqual(self.get("cmd:keep")["state"], "completed")
        self.assertEqual(self.ok("idem-stats")["size"], 1)


class TestExecVariables(IdemCase):
    """An Act= line names the step's key as $KAIROS_IDEM_KEY: kairosd expands
    it (no shell runs the line), so every tick has its own key.  Left
    literal, every tick shared the key "$KAIROS_IDEM_KEY": the second was
    answered from the store, wrote nothing, and still ended done."""

    def test_each_tick_writes_with_its_own_key(self):
        with open(os.path.join(self.dir, "schedules.d", "lit.conf"), "w") as f:
            f.write("[Schedule]\nCron=0 0 1 1 *\n[Exec]\n"
                    "Act=%s tool write --key $KAIROS_IDEM_KEY %s/out-${KAIROS_MANDATE_ID}\n"
                    % (KAIROSCTL, self.root))
        self.restart()
        mandates = []
        for at in ("2026-01-01T00:00:00Z", "2027-01-01T00:00:00Z"):
            p = self.ctl("--json", "fire", "lit", "--at", at)
            self.assertEqual(p.returncode, 0, p.stderr)
            m = json.loads(p.stdout)["mandate"]
            p = self.ctl("wait", m, "--timeout", "30")
            self.assertEqual(p.returncode, 0, (p.stdout, p.stderr, self.daemon.log()[-2000:]))
            mandates.append(m)
        self.assertEqual(sorted(os.listdir(self.root)), sorted("out-" + m for m in mandates))
        for m in mandates:
            self.assertEqual(self.get("kairos.write:%s/act_001" % m)["state"], "completed")
            with open(os.path.join(self.root, "out-" + m)) as f:
                self.assertEqual(json.loads(f.read())["mandate"]["id"], m)
            # tool write printed nothing on stdout: the step's result is null
            show = json.loads(self.ctl("--json", "show", m).stdout)
            act = [s for p in show["plans"] for s in p["steps"] if s["step_id"] == "act_001"]
            self.assertEqual([s["result"] for s in act], [None], show)


if __name__ == "__main__":
    unittest.main(verbosity=2)
