#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Metrics for real: kairosd with MetricsFile= in a textfile directory, mandates
fired with handlers, the values moving in `kairosctl metrics` and in the file;
Debian's prometheus-node-exporter reading that directory
(--collector.textfile.directory) and scraped over loopback HTTP; `promtool
check metrics` on kairosctl's output, the file and the scraped text; the
OpenMetrics variant (--openmetrics) with # UNIT and # EOF; bounded labels of
control requests (unknown commands as "unknown"); a write error logged once
per change, never fatal; MetricsFile= taken again at reload.

Needs the packages prometheus-node-exporter and prometheus (promtool):
tests/install-deps.sh installs them.  Without them, the parts that need them
are skipped and the whole test exits 77 after the others passed."""
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kairos_harness import (KAIROSCTL, Client, Daemon, NotifySocket, append,  # noqa: E402
                            executing, plan_commit, wal_line, write_config)

NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
PROMTOOL = shutil.which("promtool")
MISSING = [n for n, p in (("prometheus-node-exporter", NODE_EXPORTER), ("promtool", PROMTOOL))
           if not p]

SCHEDULES = {
    "demo": {"Schedule": {"Cron": "0 0 1 1 *"}, "Mandate": {"MaxCycles": "1"},
             "Exec": {"Act": "/bin/sh -c 'echo {}'"}},
    "broken": {"Schedule": {"Cron": "0 0 1 1 *"}, "Mandate": {"MaxCycles": "1"},
               "Exec": {"Act": "/bin/sh -c 'exit 3'"}},
}


def wait_for(pred, what, timeout=30.0):
    """Poll a condition the test cannot be told about, with a deadline."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)


def parse(text):
    """{(name, frozenset(labels)): value} of the samples of an exposition."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$', line)
        assert m, "bad sample line %r" % line
        labels = frozenset(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"',
                                      m.group(3) or ""))
        out[(m.group(1), labels)] = float(m.group(4))
    return out


def val(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class MetricsCase(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kairos-metrics-")
        self.state = os.path.join(self.dir, "state")
        self.textfile_dir = os.path.join(self.dir, "textfile")
        os.makedirs(self.textfile_dir)
        self.prom = os.path.join(self.textfile_dir, "kairos.prom")
        self.daemon = None
        self.exporter = None

    def tearDown(self):
        if self.exporter and self.exporter.poll() is None:
            self.exporter.terminate()
            self.exporter.wait(30)
        if self.daemon:
            self.daemon.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, metrics_file=None, interval="1", schedules=SCHEDULES, env=None):
        extra = ""
        if metrics_file:
            extra = "MetricsFile=%s\nMetricsIntervalSec=%s\n" % (metrics_file, interval)
        self.conf = write_config(self.dir, self.state, schedules, daemon_extra=extra)
        self.notify = NotifySocket(self.dir)
        self.daemon = Daemon(self.state, config=self.conf, notify=self.notify, env=env)
        self.notify.wait_ready()

    def ctl(self, *args, check=True):
        env = dict(os.environ)
        env.pop("KAIROS_CONTROL_SOCKET", None)
        p = subprocess.run([KAIROSCTL, "--socket", self.daemon.socket_path] + list(args),
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=60)
        if check:
            self.assertEqual(p.returncode, 0, p.stderr)
        return p

    def metrics(self, *opts):
        return self.ctl("metrics", *opts).stdout

    def file_samples(self):
        try:
            with open(self.prom) as f:
                return parse(f.read())
        except FileNotFoundError:
            return None

    def fire_and_wait(self, schedule, status):
        out = json.loads(self.ctl("--json", "fire", schedule).stdout)
        mid = out["mandate"]
        wait_for(lambda: json.loads(self.ctl("--json", "show", mid).stdout)["status"] == status,
                 "mandate %s of %s is %s" % (mid, schedule, status))
        return mid

    def promtool_ok(self, text, what):
        p = subprocess.run([PROMTOOL, "check", "metrics"], input=text, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        self.assertEqual(p.returncode, 0, "promtool check metrics on %s:\n%s%s"
                         % (what, p.stdout, p.stderr))

    # ------------------------------------------------------------------

    def test_values_move(self):
        old = os.umask(0o027)  # the shipped unit's UMask=: the file must stay readable
        try:
            self.start(self.prom)
        finally:
            os.umask(old)
        before = parse(self.metrics())
        self.assertEqual(val(before, "kairos_build_info", version=self.version()), 1)
        self.assertGreater(val(before, "kairos_process_start_time_seconds"), 1.6e9)
        self.assertIsNone(val(before, "kairos_fires_total", schedule="demo", source="manual"))
        self.assertEqual(val(before, "kairos_mandates", status="done"), 0)
        syncs_before = val(before, "kairos_wal_fdatasync_duration_seconds_count")

        self.fire_and_wait("demo", "done")
        self.fire_and_wait("broken", "failed")
        after = parse(self.metrics())
        self.assertEqual(val(after, "kairos_fires_total", schedule="demo", source="manual"), 1)
        self.assertEqual(val(after, "kairos_fires_total", schedule="broken", source="manual"), 1)
        self.assertEqual(val(after, "kairos_mandates", status="done"), 1)
        self.assertEqual(val(after, "kairos_mandates", status="failed"), 1)
        self.assertEqual(val(after, "kairos_steps_total", phase="act", outcome="completed"), 1)
        self.assertGreaterEqual(
            val(after, "kairos_steps_total", phase="act", outcome="failed"), 1)
        self.assertEqual(val(after, "kairos_steps_total", phase="observe", outcome="completed"), 2)
        # Only act has a command: one handler run per act attempt, none for the others.
        acts = val(after, "kairos_handler_duration_seconds_count", phase="act")
        self.assertEqual(acts, 1 + val(after, "kairos_steps_total", phase="act",
                                       outcome="failed"))
        self.assertEqual(val(after, "kairos_handler_duration_seconds_bucket", phase="act",
                             le="+Inf"), acts)
        self.assertEqual(val(after, "kairos_handler_duration_seconds_count", phase="observe"), 0)
        self.assertGreater(val(after, "kairos_handler_duration_seconds_sum", phase="act"), 0)
        self.assertGreater(val(after, "kairos_wal_fdatasync_duration_seconds_count"),
                           syncs_before)
        self.assertGreater(val(after, "kairos_wal_fdatasync_duration_seconds_sum"), 0)
        self.assertEqual(val(after, "kairos_control_requests_total", command="fire", code="ok"), 2)
        self.assertGreaterEqual(val(after, "kairos_cycles_completed_total"), 1)
        self.assertEqual(val(after, "kairos_reviews_waiting"), 0)

        # The file follows (written every second).
        wait_for(lambda: (self.file_samples() or {}).get(
            ("kairos_fires_total", frozenset({("schedule", "broken"), ("source", "manual")}))),
            "the metrics file shows the fires")
        st = os.stat(self.prom)
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o644)
        self.assertEqual(sorted(os.listdir(self.textfile_dir)), ["kairos.prom"])  # no temporaries
        with open(self.prom) as f:
            text = f.read()
        self.assertNotIn("# EOF", text)
        self.assertNotIn("# UNIT", text)
        self.assertIn("# TYPE kairos_fires_total counter\n", text)

    def test_timer_fire_counted_as_timer(self):
        # The fake clock of the test hooks (-Dtest_hooks=true) fires the tick.
        hourly = {"Schedule": {"Cron": "0 * * * *"}, "Mandate": {"MaxCycles": "1"},
                  "Exec": {"Act": "/bin/sh -c 'echo {}'"}}
        t0 = 1775001600  # 2026-04-01T00:00:00Z
        self.start(schedules={"hourly": hourly}, env={"KAIROS_TEST_CLOCK": str(t0 + 1800)})
        c = Client(self.daemon.socket_path)
        try:
            r = c.call("test-clock", now=t0 + 3600)
        finally:
            c.close()
        if not r["ok"] and r["error"]["code"] == "unknown_command":
            self.skipTest("kairosd was built without -Dtest_hooks=true (no fake clock)")
        self.assertTrue(r["ok"], r)
        self.daemon.wait_log("fired hourly at 2026-04-01T01:00:00Z")
        s = parse(self.metrics())
        self.assertEqual(val(s, "kairos_fires_total", schedule="hourly", source="timer"), 1)
        self.assertIsNone(val(s, "kairos_fires_total", schedule="hourly", source="manual"))
        self.fire_and_wait("hourly", "done")
        s = parse(self.metrics())
        self.assertEqual(val(s, "kairos_fires_total", schedule="hourly", source="timer"), 1)
        self.assertEqual(val(s, "kairos_fires_total", schedule="hourly", source="manual"), 1)

    def test_stale_temporary_link_not_followed(self):
        victim = os.path.join(self.dir, "victim")
        with open(victim, "w") as f:
            f.write("keep me\n")
        os.symlink(victim, os.path.join(self.textfile_dir, ".kairos.prom.tmp"))
        self.start(self.prom)
        wait_for(self.file_samples, "the metrics file")
        with open(victim) as f:
            self.assertEqual(f.read(), "keep me\n")
        self.assertTrue(stat.S_ISREG(os.lstat(self.prom).st_mode))

    def test_recovery_verdicts(self):
        wal = os.path.join(self.state, "wal")
        os.makedirs(wal)
        # Interrupted during execution (manual_review) and never started (safe_to_retry).
        for mid, recs in (("mnd_r", [plan_commit("plan_r", "mnd_r"),
                                     append("observe_001", "plan_r", "mnd_r"),
                                     executing("observe_001")]),
                          ("mnd_s", [plan_commit("plan_s", "mnd_s"),
                                     append("observe_001", "plan_s", "mnd_s")])):
            with open(os.path.join(wal, mid + ".wal.jsonl"), "w") as f:
                f.write("".join(wal_line(r) for r in recs))
        self.start()
        s = parse(self.metrics())
        self.assertEqual(val(s, "kairos_recovery_verdicts_total", verdict="manual_review",
                             source="wal", reason="interrupted_during_execution"), 1, s)
        self.assertEqual(val(s, "kairos_reviews_waiting"), 1)
        self.assertEqual(val(s, "kairos_mandates", status="paused_review"), 1)
        verdicts = {dict(k[1])["verdict"] for k in s if k[0] == "kairos_recovery_verdicts_total"}
        self.assertIn("safe_to_retry", verdicts)

    def test_idempotency_counts(self):
        self.start()
        env = dict(os.environ, KAIROS_CONTROL_SOCKET=self.daemon.socket_path)
        for _ in range(2):
            p = subprocess.run([KAIROSCTL, "tool", "run", "--key", "k1", "--", "true"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
        s = parse(self.metrics())
        self.assertEqual(val(s, "kairos_idempotency_requests_total", result="miss"), 1)
        self.assertEqual(val(s, "kairos_idempotency_requests_total", result="hit"), 1)
        self.assertEqual(val(s, "kairos_idempotency_requests_total", result="conflict"), 0)
        self.assertEqual(val(s, "kairos_idempotency_entries"), 1)

    def test_control_labels_are_bounded(self):
        self.start()
        c = Client(self.daemon.socket_path)
        for i in range(50):  # 50 different unknown commands: one row
            r = c.call("no-such-command-%d" % i)
            self.assertEqual(r["error"]["code"], "unknown_command")
        self.assertEqual(c.call("fire")["error"]["code"], "bad_argument")
        c.send_raw(b"this is not json\n")
        self.assertEqual(c.recv_reply()["error"]["code"], "bad_request")
        self.assertEqual(c.call("metrics", format="xml")["error"]["code"], "bad_argument")
        c.close()
        s = parse(self.metrics())
        self.assertEqual(val(s, "kairos_control_requests_total", command="unknown",
                             code="unknown_command"), 50)
        self.assertEqual(val(s, "kairos_control_requests_total", command="unknown",
                             code="bad_request"), 1)
        self.assertEqual(val(s, "kairos_control_requests_total", command="fire",
                             code="bad_argument"), 1)
        self.assertEqual(val(s, "kairos_control_requests_total", command="metrics",
                             code="bad_argument"), 1)
        commands = {dict(k[1]).get("command") for k in s if k[0] == "kairos_control_requests_total"}
        self.assertFalse(any(c and c.startswith("no-such") for c in commands), commands)

    def test_openmetrics_variant(self):
        self.start()
        om = self.metrics("--openmetrics")
        self.assertTrue(om.endswith("# EOF\n"), om[-200:])
        self.assertEqual(om.count("# EOF"), 1)
        self.assertIn("# TYPE kairos_fires counter\n", om)
        self.assertIn("# UNIT kairos_handler_duration_seconds seconds\n", om)
        self.assertIn("# UNIT kairos_wal_fdatasync_duration_seconds seconds\n", om)
        prom = self.metrics()
        self.assertNotIn("# EOF", prom)
        self.assertNotIn("# UNIT", prom)
        self.assertIn("# TYPE kairos_fires_total counter\n", prom)
        wrapped = json.loads(self.ctl("--json", "metrics", "--openmetrics").stdout)
        self.assertEqual(wrapped["format"], "openmetrics")
        self.assertTrue(wrapped["content_type"].startswith("application/openmetrics-text"))
        self.assertTrue(wrapped["text"].endswith("# EOF\n"))
        # Every family is declared before its samples, in both formats.
        for text, fmt in ((om, "openmetrics"), (prom, "prometheus")):
            declared = set()
            for line in text.splitlines():
                m = re.match(r"^# TYPE (\S+) ", line)
                if m:
                    declared.add(m.group(1))
                elif line and not line.startswith("#"):
                    name = re.match(r"^[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
                    base = re.sub(r"_(total|bucket|sum|count)$", "", name)
                    self.assertTrue(name in declared or base in declared,
                                    "%s: %s before its # TYPE" % (fmt, name))

    def test_write_error_logged_once_and_not_fatal(self):
        missing = os.path.join(self.dir, "not-yet")
        self.start(os.path.join(missing, "kairos.prom"))
        self.daemon.wait_log("MetricsFile=")
        # Let a few more intervals (1 s) fail: each is a new attempt that
        # must not log again.  (Time passing is the point, not a sync.)
        time.sleep(2.5)
        self.assertEqual(self.daemon.log().count("MetricsFile="), 1, self.daemon.log())
        self.assertEqual(json.loads(self.ctl("--json", "status").stdout)["ready"], True)
        os.makedirs(missing)
        self.daemon.wait_log("written again")
        self.assertTrue(os.path.exists(os.path.join(missing, "kairos.prom")))

    def test_reload_takes_metrics_file(self):
        self.start()
        self.assertIsNone(self.file_samples())
        with open(self.conf, "a") as f:
            f.write("MetricsFile=%s\nMetricsIntervalSec=1\n" % self.prom)
        self.ctl("reload")
        wait_for(self.file_samples, "the metrics file after reload")
        other = os.path.join(self.textfile_dir, "other.prom")
        with open(self.conf, "a") as f:
            f.write("MetricsFile=%s\n" % other)
        self.ctl("reload")
        wait_for(lambda: os.path.exists(other), "the new metrics file after reload")

    def test_every_metric_documented(self):
        self.start()
        src = os.environ.get("KAIROS_SRCDIR",
                             os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
        with open(os.path.join(src, "man", "kairosd.8.scd"), encoding="utf-8") as f:
            man = f.read()
        section = man[man.index("# METRICS\n"):]
        section = section[:section.index("\n# ", 1)].replace("\\", "")
        families = re.findall(r"^# TYPE (\S+) (\S+)$", self.metrics(), re.M)
        self.assertGreaterEqual(len(families), 12)
        for name, kind in families:
            m = re.search(r"^\*%s\*(\{[^}]*\})? \((\w+)\)$" % re.escape(name), section, re.M)
            self.assertIsNotNone(m, "%s is not in kairosd(8), METRICS" % name)
            self.assertEqual(m.group(2), kind, name)

    def test_config_checked(self):
        for bad, why in (("MetricsIntervalSec=0", "MetricsIntervalSec"),
                         ("MetricsFile=relative.prom", "MetricsFile")):
            conf = write_config(self.dir, self.state, {}, daemon_extra=bad + "\n")
            p = subprocess.run([os.environ.get("KAIROSD", "kairosd"), "-c", conf,
                                "--check-config"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=60)
            self.assertNotEqual(p.returncode, 0, bad)
            self.assertIn(why, p.stdout)

    @unittest.skipIf(MISSING, "not installed: %s" % ", ".join(MISSING))
    def test_node_exporter_and_promtool(self):
        self.start(self.prom)
        self.fire_and_wait("demo", "done")
        wait_for(lambda: (self.file_samples() or {}).get(
            ("kairos_mandates", frozenset({("status", "done")}))), "the file shows the mandate")
        self.promtool_ok(self.metrics(), "kairosctl metrics")
        with open(self.prom) as f:
            self.promtool_ok(f.read(), "MetricsFile=")

        port = free_port()
        self.exporter = subprocess.Popen(
            [NODE_EXPORTER, "--collector.disable-defaults", "--collector.textfile",
             "--collector.textfile.directory=" + self.textfile_dir,
             "--web.listen-address=127.0.0.1:%d" % port],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

        def scrape():
            if self.exporter.poll() is not None:
                raise AssertionError("node_exporter exited: %s"
                                     % self.exporter.stderr.read().decode(errors="replace"))
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port,
                                            timeout=10) as r:
                    return r.read().decode()
            except OSError:
                return None

        text = wait_for(scrape, "node_exporter answers on 127.0.0.1:%d" % port)
        s = parse(text)
        self.assertEqual(val(s, "node_textfile_scrape_error"), 0, text)
        self.assertEqual(val(s, "kairos_mandates", status="done"), 1)
        self.assertEqual(val(s, "kairos_fires_total", schedule="demo", source="manual"), 1)
        self.assertEqual(val(s, "kairos_steps_total", phase="act", outcome="completed"), 1)
        self.assertIsNotNone(val(s, "kairos_wal_fdatasync_duration_seconds_bucket", le="+Inf"))
        self.assertIsNotNone(val(s, "kairos_build_info", version=self.version()))
        self.promtool_ok(text, "the node_exporter scrape")

    def version(self):
        out = subprocess.run([KAIROSCTL, "--version"], stdout=subprocess.PIPE, text=True).stdout
        return out.split()[-1]


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2).result
    if not result.wasSuccessful():
        sys.exit(1)
    if MISSING:
        print("skipped the node_exporter/promtool part: not installed: %s" % ", ".join(MISSING))
        sys.exit(77)
    sys.exit(0)
