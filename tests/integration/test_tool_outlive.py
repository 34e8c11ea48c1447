#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A `kairosctl tool run` outlives a crash of kairosd (docs/design.md §10,
§11): the call's kairosctl and its command run in a process group of their
own that the keeper leaves alone when kairosd dies; the command finishes, its
kairosctl keeps the outcome until a kairosd answers on the socket again and
completes the claim there; recovery holds the step's decision (status
`probing`) while the call's client lives, up to ToolGraceSec=.

- kill -9 of kairosd inside a tool run: the command finishes, the restarted
  kairosd completes the claim, the mandate ends done with one effect;
- the client killed while the decision is held: decided as before
  (tool_call_interrupted);
- ToolGraceSec= expired: the call is killed, decided as before, a log line;
- a recorded client whose pid now belongs to another process (its start time
  differs): not trusted, decided as before;
- cancel, the step's timeout and a graceful stop still kill the command (a
  stop also a call it holds);
- the kill loop: KAIROS_TOOL_KILLS (default 3) kills of kairosd inside a 2 s
  tool run, each decided alone, no duplicate.

The command waits on a FIFO the test opens (no sleeps as synchronisation);
markers written by the command are polled with deadlines."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kairos_harness import KAIROSCTL, KAIROSD, Client, Daemon, NotifySocket, write_config  # noqa: E402

HANDLER = r"""#!/bin/sh
cat >/dev/null
if [ "$1" = act ]; then
        "$KAIROSCTL" tool run --key "$KAIROS_IDEM_KEY" -- sh "$OUT/effect.sh" \
                "$KAIROS_IDEM_KEY" >/dev/null || exit $?
fi
echo '{"ok":true}'
"""

# The effect: notes its pid and process group, then waits for the gate (a
# FIFO the test opens) or, without one, SLEEP seconds; then appends its key
# to the outbox.
EFFECT = r"""id=$(echo "$1" | tr / _)
echo $$ > "$OUT/pid.$id"
ps -o pgid= $$ | tr -d ' ' > "$OUT/pgid.$id"
touch "$OUT/started.$id"
if [ -p "$OUT/gate" ]; then read x < "$OUT/gate"; else sleep "${SLEEP:-2}"; fi
echo "$1" >> "$OUT/outbox"
"""

WAIT = 30.0


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not alive
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(cond, what, timeout=WAIT, log=lambda: ""):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("%s:\n%s" % (what() if callable(what) else what, log()[-4000:]))
        time.sleep(0.02)  # polling a condition with a deadline


class ToolOutlive(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-outlive-")
        self.state = os.path.join(self.dir, "state")
        self.out = os.path.join(self.dir, "out")
        os.makedirs(self.out)
        self.handler = os.path.join(self.dir, "h.sh")
        with open(self.handler, "w") as f:
            f.write(HANDLER)
        os.chmod(self.handler, 0o755)
        with open(os.path.join(self.out, "effect.sh"), "w") as f:
            f.write(EFFECT)
        self.notify = NotifySocket(self.dir)
        self.daemon = None
        self.gate_fd = None

    def tearDown(self):
        for name in os.listdir(self.out):
            if name.startswith("pgid."):
                with open(os.path.join(self.out, name)) as f:
                    pgid = f.read().strip()
                if pgid.isdigit():
                    try:
                        os.killpg(int(pgid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        rc = 0
        if self.daemon and self.daemon.proc.poll() is None:
            rc = self.daemon.stop()
        if self.daemon:
            self.daemon.proc.stderr.close()
        self.notify.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.assertEqual(rc, 0, "kairosd's exit status")

    def configure(self, idem_extra="", exec_extra=None, daemon_extra=""):
        keys = {p: "%s %s" % (self.handler, p.lower())
                for p in ("Observe", "Orient", "Decide", "Act", "Reflect")}
        keys["Environment"] = "OUT=%s KAIROSCTL=%s" % (self.out, os.path.abspath(KAIROSCTL))
        keys["Effects"] = "act"
        keys["EffectsVia"] = "kairosctl"
        keys.update(exec_extra or {})
        sched = {"Schedule": {"Cron": "0 0 1 1 *"}, "Exec": keys}
        self.conf = write_config(self.dir, self.state, {"job": sched},
                                 daemon_extra=daemon_extra + "[Idempotency]\n" + idem_extra)

    def gate(self):
        os.mkfifo(os.path.join(self.out, "gate"))

    def open_gate(self):
        # the command is blocked opening the FIFO for reading: this open
        # meets it, the write ends its read
        with open(os.path.join(self.out, "gate"), "w") as f:
            f.write("go\n")

    def start(self):
        self.notify.clear()
        if self.daemon:
            self.daemon.proc.stderr.close()
        self.daemon = Daemon(self.state, config=self.conf, notify=self.notify)
        self.notify.wait_ready()

    def ctl(self, *args, check=True):
        p = subprocess.run([KAIROSCTL, "--socket", self.daemon.socket_path] + list(args),
                           capture_output=True, text=True, timeout=60)
        if check:
            self.assertEqual(p.returncode, 0, "kairosctl %s: %s%s" % (args, p.stdout, p.stderr))
        return p

    def fire(self, n=0):
        at = "2030-01-%02dT%02d:%02d:00Z" % (1 + n // 1440, n // 60 % 24, n % 60)
        r = json.loads(self.ctl("--json", "fire", "job", "--at", at).stdout)
        return r["mandate"]

    def ident(self, mid):
        return "%s_act_001" % mid

    def marker(self, kind, mid):
        return os.path.join(self.out, "%s.%s" % (kind, self.ident(mid)))

    def read_int(self, kind, mid):
        with open(self.marker(kind, mid)) as f:
            return int(f.read().strip())

    def read_text(self, kind, mid):
        with open(self.marker(kind, mid)) as f:
            return f.read().strip()

    def wait_started(self, mid):
        wait_until(lambda: os.path.exists(self.marker("started", mid))
                   and os.path.exists(self.marker("pgid", mid)),
                   "the command of %s never started" % mid, log=self.daemon.log)
        # pgid is written before started: complete
        wait_until(lambda: self.read_text("pgid", mid).isdigit(),
                   "no pgid", log=self.daemon.log)

    def crash_in_call(self, n=0):
        self.start()
        mid = self.fire(n)
        self.wait_started(mid)
        self.daemon.kill()
        return mid

    def show(self, mid):
        return json.loads(self.ctl("--json", "show", mid).stdout)

    def wait_status(self, mid, statuses, timeout=WAIT):
        seen = {}

        def ok():
            seen["s"] = self.show(mid)
            return seen["s"]["status"] in statuses
        wait_until(ok, lambda: "mandate %s never %s (last %s)" % (mid, statuses, seen.get("s")),
                   timeout=timeout, log=self.daemon.log)
        return seen["s"]

    def outbox(self):
        p = os.path.join(self.out, "outbox")
        if not os.path.exists(p):
            return []
        with open(p) as f:
            return f.read().splitlines()

    def act_step(self, shown):
        for pl in shown["plans"]:
            for s in pl["steps"]:
                if s["step_id"] == "act_001":
                    return s
        self.fail("no act_001 in %s" % shown)

    # ---- the cases ----

    def test_call_outlives_kairosd_and_completes_the_claim(self):
        self.gate()
        self.configure()
        mid = self.crash_in_call()
        cmd = self.read_int("pid", mid)
        # the keeper killed the handler, not the call
        self.assertTrue(alive(cmd), "the command died with kairosd")
        self.start()
        # held while the call's client lives
        row = self.wait_status(mid, ("probing",))
        self.assertIn("tool call", row.get("reason", ""), row)
        self.assertEqual(self.outbox(), [])
        self.open_gate()
        shown = self.wait_status(mid, ("done", "paused_review", "failed"))
        self.assertEqual(shown["status"], "done", self.daemon.log()[-4000:])
        self.assertEqual(self.outbox(), ["%s/act_001" % mid])
        self.daemon.wait_log("finished after kairosd restarted")
        key = "cmd:%s/act_001" % mid
        got = json.loads(self.ctl("--json", "idem", "get", key).stdout)
        self.assertEqual(got["state"], "completed", got)
        self.assertTrue(got["result"].get("finished_after_restart"), got)
        s = self.act_step(shown)
        self.assertEqual(s["evidence"]["reason"], "effects_journaled", s)

    def test_held_before_the_probe(self):
        """With a Probe= that would say not_started (a re-run: the effect
        twice while the call still runs), the call is waited for first."""
        probe = os.path.join(self.dir, "probe.sh")
        with open(probe, "w") as f:
            f.write('#!/bin/sh\ncat >/dev/null\necho \'{"state":"not_started"}\'\n')
        os.chmod(probe, 0o755)
        self.gate()
        self.configure(exec_extra={"Probe": probe})
        mid = self.crash_in_call()
        self.start()
        row = self.wait_status(mid, ("probing",))
        self.assertIn("waiting for tool call", row.get("reason", ""), row)
        self.open_gate()
        shown = self.wait_status(mid, ("done", "paused_review", "failed"))
        self.assertEqual(shown["status"], "done", self.daemon.log()[-4000:])
        self.assertEqual(self.outbox(), ["%s/act_001" % mid])
        self.assertNotIn("the probe said", self.daemon.log())

    def test_stop_while_held_kills_the_call(self):
        """kairosd stopped (gracefully) while it waits: a stop leaves no
        process of kairosd's behind (the shipped unit's KillMode=process
        leaves that to kairosd), so the held call is killed; the next start
        decides the step without it, as before."""
        self.gate()
        self.configure()
        mid = self.crash_in_call()
        cmd = self.read_int("pid", mid)
        self.start()
        self.wait_status(mid, ("probing",))
        self.assertEqual(self.daemon.stop(), 0)
        wait_until(lambda: not alive(cmd), "the held call outlived the stop",
                   log=self.daemon.log)
        self.assertIn("kairosd stops: the tool call's client (pid", self.daemon.log())
        self.start()
        shown = self.wait_status(mid, ("paused_review", "done", "failed"))
        self.assertEqual(shown["status"], "paused_review", shown)
        self.assertEqual(self.act_step(shown)["evidence"]["reason"], "tool_call_interrupted")
        self.assertEqual(self.outbox(), [])

    def test_client_killed_while_held_is_decided_as_before(self):
        self.gate()
        self.configure()
        mid = self.crash_in_call()
        self.start()
        self.wait_status(mid, ("probing",))
        os.killpg(self.read_int("pgid", mid), signal.SIGKILL)
        shown = self.wait_status(mid, ("paused_review", "done", "failed"))
        self.assertEqual(shown["status"], "paused_review", shown)
        self.assertEqual(self.act_step(shown)["evidence"]["reason"], "tool_call_interrupted")
        self.daemon.wait_log("exited without finishing the call")
        self.assertEqual(self.outbox(), [])

    def test_cancel_while_held_kills_the_call(self):
        self.gate()
        self.configure()
        mid = self.crash_in_call()
        cmd = self.read_int("pid", mid)
        self.start()
        self.wait_status(mid, ("probing",))
        self.ctl("cancel", mid, "--reason", "test")
        wait_until(lambda: not alive(cmd), "the held call outlived the cancel",
                   log=self.daemon.log)
        self.wait_status(mid, ("cancelled",))
        self.assertEqual(self.outbox(), [])

    def test_grace_expiry_is_decided_as_before(self):
        self.gate()
        self.configure(idem_extra="ToolGraceSec=1\n")
        mid = self.crash_in_call()
        cmd = self.read_int("pid", mid)
        self.start()
        shown = self.wait_status(mid, ("paused_review", "done", "failed"))
        self.assertEqual(shown["status"], "paused_review", shown)
        self.assertEqual(self.act_step(shown)["evidence"]["reason"], "tool_call_interrupted")
        self.daemon.wait_log("ToolGraceSec=1 passed")
        wait_until(lambda: not alive(cmd), "the call outlived its grace", log=self.daemon.log)
        self.assertEqual(self.outbox(), [])

    def test_grace_zero_does_not_hold(self):
        self.gate()
        self.configure(idem_extra="ToolGraceSec=0\n")
        mid = self.crash_in_call()
        self.start()
        shown = self.wait_status(mid, ("paused_review", "done", "failed"))
        self.assertEqual(shown["status"], "paused_review", shown)

    def test_reused_pid_is_not_trusted(self):
        """The recorded client's pid now belongs to a process that started at
        another time: not the client, decided as before."""
        self.gate()
        self.configure()
        mid = self.crash_in_call()
        pgid = self.read_int("pgid", mid)
        os.killpg(pgid, signal.SIGKILL)
        wait_until(lambda: not alive(pgid), "the client did not die")
        # rewrite the client's pid in the log to a live process of another
        # start time: this test's own
        log = os.path.join(self.state, "idem", "idem.jsonl")
        with open(log) as f:
            text = f.read()
        self.assertIn('"client":{"pid":%d,' % pgid, text)
        lines = []
        for line in text.splitlines():
            rec = json.loads(line)
            if "client" in rec:
                rec["client"]["pid"] = os.getpid()
                del rec["crc"]
                body = json.dumps(rec, separators=(",", ":"))
                line = body[:-1] + ',"crc":"%08x"}' % (zlib.crc32(body.encode()) & 0xFFFFFFFF)
            lines.append(line)
        with open(log, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.start()
        shown = self.wait_status(mid, ("paused_review", "done", "failed", "probing"))
        self.assertEqual(shown["status"], "paused_review", shown)

    def test_late_finish_only_from_the_client(self):
        """A tool-finish {"late":true} for an interrupted call from any other
        process than the one that claimed it is refused."""
        self.gate()
        self.configure(idem_extra="ToolGraceSec=0\n")
        mid = self.crash_in_call()
        os.killpg(self.read_int("pgid", mid), signal.SIGKILL)
        self.start()
        self.wait_status(mid, ("paused_review",))
        key = "cmd:%s/act_001" % mid
        got = json.loads(self.ctl("--json", "idem", "get", key).stdout)
        self.assertEqual(got["state"], "interrupted", got)
        c = Client(self.daemon.socket_path)
        try:
            r = c.call("tool-finish", key=key, late=True, fingerprint=got["fingerprint"],
                       exit_status=0, stdout="", stderr="")
            self.assertEqual(r["error"]["code"], "conflict", r)
            self.assertIn("claimed by another process", r["error"]["message"])
            r = c.call("tool-finish", key=key, late=True, exit_status=0, stdout="", stderr="")
            self.assertEqual(r["error"]["code"], "bad_argument", r)
            self.assertIn("fingerprint", r["error"]["message"])
        finally:
            c.close()
        got = json.loads(self.ctl("--json", "idem", "get", key).stdout)
        self.assertEqual(got["state"], "interrupted", got)

    def test_tool_grace_sec_config_errors(self):
        for value, why in (("abc", '"abc" is not a valid duration'),
                           ("infinity", '"infinity" is not a valid duration'),
                           ("-1", "")):
            self.configure(idem_extra="ToolGraceSec=%s\n" % value)
            out = subprocess.run([KAIROSD, "-c", self.conf, "--check-config"],
                                 capture_output=True, text=True, timeout=30)
            self.assertEqual(out.returncode, 1, out.stdout)
            self.assertIn("%s:5: ToolGraceSec=: %s" % (self.conf, why), out.stderr)
        self.configure(idem_extra="ToolGraceSec=5min\n")
        out = subprocess.run([KAIROSD, "-c", self.conf, "--check-config"],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)

    def run_and_kill(self, how):
        self.gate()
        mid = self.fire()
        self.wait_started(mid)
        cmd = self.read_int("pid", mid)
        self.assertTrue(alive(cmd))
        how(mid)
        wait_until(lambda: not alive(cmd), "the command outlived its step", log=self.daemon.log)
        self.assertEqual(self.outbox(), [])
        return mid

    def test_cancel_kills_the_call(self):
        self.configure()
        self.start()
        mid = self.run_and_kill(lambda mid: self.ctl("cancel", mid, "--reason", "test"))
        self.wait_status(mid, ("cancelled",))

    def test_step_timeout_kills_the_call(self):
        self.configure(exec_extra={"TimeoutSec": "1"})
        self.start()
        self.run_and_kill(lambda mid: None)

    def test_graceful_stop_kills_the_call(self):
        self.configure(daemon_extra="GracefulTimeoutSec=1\n")
        self.start()
        self.run_and_kill(lambda mid: self.daemon.stop())

    def test_kill_loop(self):
        """kairosd killed inside a 2 s tool run, KAIROS_TOOL_KILLS times; the
        act is kairosctl itself (Act=kairosctl tool run ... -- CMD)."""
        kills = int(os.environ.get("KAIROS_TOOL_KILLS", "3"))
        self.configure(exec_extra={"Act": "%s tool run --key ${KAIROS_IDEM_KEY} -- sh %s "
                                          "${KAIROS_IDEM_KEY}"
                                   % (os.path.abspath(KAIROSCTL),
                                      os.path.join(self.out, "effect.sh"))})
        alone = paused = dup = lost = 0
        t0 = time.monotonic()
        for i in range(kills):
            mid = self.crash_in_call(i)
            self.start()
            shown = self.wait_status(mid, ("done", "paused_review", "failed"))
            n = self.outbox().count("%s/act_001" % mid)
            alone += shown["status"] == "done"
            paused += shown["status"] == "paused_review"
            dup += n > 1
            lost += n == 0
            self.daemon.stop()
        print("tool-outlive kill loop: %d kills, %d decided alone (done), %d paused, "
              "%d duplicates, %d without the effect, %.1f s"
              % (kills, alone, paused, dup, lost, time.monotonic() - t0), file=sys.stderr)
        self.assertEqual((alone, dup, lost), (kills, 0, 0))


if __name__ == "__main__":
    unittest.main()
