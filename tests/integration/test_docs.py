#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The man pages agree with the programs: every kairosctl command, global
option, exit status and environment variable of `kairosctl --help` is in
kairosctl(1); every option of `kairosd --help`, every signal kairosd handles
and every journal MESSAGE_ID it logs is in kairosd(8); every configuration
key of the parser's tables (src/lib/config.c) is documented in the section
of the right page (kairosd.conf(5) or kairos.schedule(5)), and no page
documents a key the parser does not know.  The man page sources (scdoc) are
read directly, so this runs without scdoc; with scdoc, each page must also
build without errors.

Environment: KAIROSD, KAIROSCTL (the binaries), KAIROS_SRCDIR (the source
tree).
"""
import os
import re
import shutil
import subprocess
import sys
import unittest

SRC = os.environ.get("KAIROS_SRCDIR", os.path.join(os.path.dirname(__file__), "..", ".."))
KAIROSD = os.environ.get("KAIROSD", "kairosd")
KAIROSCTL = os.environ.get("KAIROSCTL", "kairosctl")
MAN = os.path.join(SRC, "man")


def page(name):
    with open(os.path.join(MAN, name + ".scd"), encoding="utf-8") as f:
        return f.read()


def sections(text):
    """{heading: body} for the '# HEADING' sections of an scdoc page."""
    out, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"^# (.+)$", line)
        if m:
            cur = m.group(1).strip()
            out[cur] = ""
        elif cur is not None:
            out[cur] += line + "\n"
    return out


def defined_terms(body):
    """The bold terms that start a definition line ('*--json*', '*wal dump* _FILE_')."""
    terms = []
    for line in body.splitlines():
        m = re.match(r"^\*([^*]+)\*", line)
        if m:
            terms.append(m.group(1))
    return terms


def unescape(s):
    return s.replace("\\", "")


def run(argv):
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=30)
    return r


class KairosctlPage(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        r = run([KAIROSCTL, "--help"])
        assert r.returncode == 0, r.stderr
        cls.help = r.stdout
        cls.page = page("kairosctl.1")
        cls.sec = sections(cls.page)

    def help_commands(self):
        cmds, in_list = [], False
        for line in self.help.splitlines():
            if re.match(r"^(Commands|Offline commands)\b.*:$", line):
                in_list = True
                continue
            if in_list and not line.strip():
                in_list = False
                continue
            if in_list:
                m = re.match(r"^  (\S.*)$", line)
                self.assertIsNotNone(m, f"unexpected help line {line!r}")
                words = []
                for w in m.group(1).split():
                    if not re.match(r"^[a-z][a-z-]*$", w):
                        break
                    words.append(w)
                cmds.append(" ".join(words))
        return cmds

    def test_help_lists_commands(self):
        # The parser itself must see the commands, or the checks below are empty.
        cmds = self.help_commands()
        self.assertIn("status", cmds)
        self.assertIn("wal verify", cmds)
        self.assertGreaterEqual(len(cmds), 15)

    def test_every_command_has_an_entry(self):
        terms = [unescape(t) for t in defined_terms(self.sec["COMMANDS"])]
        for cmd in self.help_commands():
            with self.subTest(command=cmd):
                self.assertIn(cmd, terms,
                              f"kairosctl(1) COMMANDS has no entry '*{cmd}*' "
                              f"(entries: {terms})")

    def test_every_entry_is_a_command(self):
        cmds = set(self.help_commands())
        for t in defined_terms(self.sec["COMMANDS"]):
            with self.subTest(entry=t):
                self.assertIn(unescape(t), cmds, "kairosctl(1) documents a command "
                              "that kairosctl --help does not list")

    def test_usage_of_every_command(self):
        # The options of each command in --help appear in its entry.
        lines = self.sec["COMMANDS"].splitlines()
        for cmd in self.help_commands():
            hl = next(ln for ln in self.help.splitlines()
                      if ln == f"  {cmd}" or ln.startswith(f"  {cmd} "))
            args = hl[len(cmd) + 2:]
            entry = next((ln for ln in lines if unescape(ln).startswith(f"*{cmd}*")), None)
            self.assertIsNotNone(entry, cmd)
            for opt in re.findall(r"--[a-z][a-z-]*|-n\b", args):
                with self.subTest(command=cmd, option=opt):
                    self.assertIn(opt, unescape(entry),
                                  f"option {opt} of '{cmd}' missing in its entry")

    def test_global_options(self):
        opts = set(re.findall(r"^\s+(--[a-z-]+)", self.help, re.M))
        self.assertTrue({"--socket", "--json", "--help", "--version"} <= opts, opts)
        body = self.sec["GLOBAL OPTIONS"]
        for o in opts:
            with self.subTest(option=o):
                self.assertRegex(body, rf"(?m)^\*.*{re.escape(o)}\b",
                                 f"{o} not in GLOBAL OPTIONS")

    def test_exit_statuses(self):
        tail = self.help[self.help.index("Exit status"):]
        tail = tail[:tail.index("Environment")]
        codes = set(re.findall(r"\b(\d+)\b", tail))
        self.assertTrue({"0", "1", "2", "64", "65", "66"} <= codes, codes)
        documented = {t for t in defined_terms(self.sec["EXIT STATUS"])}
        for c in codes:
            with self.subTest(code=c):
                self.assertIn(c, documented, f"exit status {c} not in EXIT STATUS")

    def test_exit_statuses_of_the_code(self):
        with open(os.path.join(SRC, "src/ctl/ctl.h")) as f:
            codes = re.findall(r"CTL_EXIT_\w+ = (\d+)", f.read())
        self.assertGreaterEqual(len(codes), 5)
        documented = set(defined_terms(self.sec["EXIT STATUS"]))
        for c in codes:
            with self.subTest(code=c):
                self.assertIn(c, documented)

    def test_environment(self):
        env = set(re.findall(r"\b(KAIROS[A-Z_]+)\b", self.help))
        self.assertIn("KAIROSCTL_TIMEOUT", env)
        documented = set(defined_terms(self.sec["ENVIRONMENT"]))
        for e in env:
            with self.subTest(variable=e):
                self.assertIn(e, documented)


class KairosdPage(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        r = run([KAIROSD, "--help"])
        assert r.returncode == 0, r.stderr
        cls.help = r.stdout
        cls.page = page("kairosd.8")
        cls.sec = sections(cls.page)

    def test_every_option(self):
        opts = re.findall(r"^\s+(?:(-[a-z]), )?(--[a-z-]+)", self.help, re.M)
        self.assertGreaterEqual(len(opts), 5)
        terms = [unescape(t) for t in defined_terms(self.sec["OPTIONS"])]
        for short, long in opts:
            want = f"{short}, {long}" if short else long
            with self.subTest(option=want):
                self.assertIn(want, terms, f"kairosd(8) OPTIONS has no '*{want}*' "
                              f"(entries: {terms})")
        self.assertEqual(len(terms), len(opts), "kairosd(8) documents options "
                         "kairosd --help does not list")

    def test_signals(self):
        with open(os.path.join(SRC, "src/daemon/main.c")) as f:
            code = f.read()
        m = re.search(r"int signums\[\] = \{([^}]*)\}", code)
        self.assertIsNotNone(m, "signal table of main.c not found")
        sigs = re.findall(r"SIG[A-Z0-9]+", m.group(1))
        sigs += re.findall(r"signal\((SIG[A-Z0-9]+), SIG_IGN\)", code)
        self.assertIn("SIGHUP", sigs)
        body = self.sec["SIGNALS"]
        for s in sigs:
            with self.subTest(signal=s):
                self.assertRegex(body, rf"(?m)^\*.*\b{s}\b", f"{s} not in SIGNALS")

    def test_exit_statuses(self):
        with open(os.path.join(SRC, "src/daemon/main.c")) as f:
            code = f.read()
        codes = set(re.findall(r"\breturn (\d+);", code)) | {"0", "1"}
        documented = set(defined_terms(self.sec["EXIT STATUS"]))
        for c in codes:
            with self.subTest(code=c):
                self.assertIn(c, documented)

    def test_message_ids(self):
        with open(os.path.join(SRC, "src/daemon/log.h")) as f:
            ids = re.findall(r'#define MSGID_\w+\s+"([0-9a-f]{32})"', f.read())
        self.assertGreaterEqual(len(ids), 5)
        self.assertEqual(len(set(ids)), len(ids), "a MESSAGE_ID used twice in log.h")
        for i in ids:
            with self.subTest(message_id=i):
                self.assertIn(i, self.sec["LOGGING"])
                # random 128-bit ids (systemd-id128 new): version 4, variant 1
                self.assertRegex(i, r"^[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}$")
        # The journal catalog explains each id, and only those.
        with open(os.path.join(SRC, "systemd/kairos.catalog")) as f:
            catalog = f.read()
        entries = re.findall(r"(?m)^-- ([0-9a-f]{32})\n((?:.+\n)+)\n(.+)", catalog)
        self.assertEqual(sorted(e[0] for e in entries), sorted(ids),
                         "systemd/kairos.catalog has one entry per MESSAGE_ID of log.h")
        for mid, header, body in entries:
            with self.subTest(catalog_entry=mid):
                self.assertRegex(header, r"(?m)^Subject: \S")
                self.assertRegex(header, r"(?m)^Defined-By: kairos$")
                self.assertTrue(body.strip(), "an entry without text")

    def test_unit_settings_documented(self):
        with open(os.path.join(SRC, "systemd/kairosd.service.in")) as f:
            unit = f.read()
        for key in ("Type=notify", "WatchdogSec=30s", "KillMode=process",
                    "ProtectSystem=strict", "OOMPolicy=continue", "LimitNOFILE=65536"):
            with self.subTest(setting=key):
                self.assertIn(key, unit)
                k, v = key.split("=")
                self.assertRegex(self.page, rf"{k}=\*?{v}|{k}={v}")


class ConfigPages(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(os.path.join(SRC, "src/lib/config.c")) as f:
            code = f.read()
        tables = {}
        for m in re.finditer(r"static const struct key_def (\w+)\[\] = \{(.*?)\n\};", code,
                             re.S):
            tables[m.group(1)] = re.findall(r'\.name = "(\w+)"', m.group(2))
        cls.files = {}
        for kind, pagename in (("main_sections", "kairosd.conf.5"),
                               ("schedule_sections", "kairos.schedule.5")):
            m = re.search(rf"static const struct section_def {kind}\[\] = \{{(.*?)\n\}};",
                          code, re.S)
            assert m, kind
            secs = re.findall(r'\{ "(\w+)", (\w+)(?:, \w+)* \}', m.group(1))
            cls.files[pagename] = {s: tables[t] for s, t in secs}

    def test_tables_found(self):
        self.assertEqual(set(self.files["kairosd.conf.5"]), {"Daemon", "Idempotency", "Notify",
                                                               "Cluster"})
        self.assertEqual(set(self.files["kairos.schedule.5"]), {"Schedule", "Mandate", "Exec", "Notify"})
        self.assertIn("StateDirectory", self.files["kairosd.conf.5"]["Daemon"])
        self.assertIn("Cron", self.files["kairos.schedule.5"]["Schedule"])

    def test_every_key_in_its_section(self):
        for pagename, secs in self.files.items():
            sec = sections(page(pagename))
            for s, keys in secs.items():
                heading = f"[{s}] SECTION"
                self.assertIn(heading, sec, f"{pagename}: no section '# {heading}'")
                body = sec[heading]
                documented = set()
                for line in body.splitlines():
                    if line.startswith("*"):  # a definition: *Key=*, or *A=*, *B=*
                        documented |= set(re.findall(r"\*(\w+)=\*", line))
                for k in keys:
                    with self.subTest(page=pagename, section=s, key=k):
                        self.assertIn(k, documented, f"{pagename}: {k}= not documented "
                                      f"in [{s}]")
                for k in documented:
                    with self.subTest(page=pagename, section=s, documented=k):
                        self.assertIn(k, keys, f"{pagename}: documents {k}= in [{s}], "
                                      "which the parser does not know")

    def test_defaults_of_the_design_table(self):
        # Spot checks of documented defaults against the code's built-ins.
        text = page("kairosd.conf.5")
        for default in ("/var/lib/kairos", "/run/kairos/control.sock", "kairos", "4",
                        "120", "info", "86400", "10000"):
            with self.subTest(default=default):
                self.assertTrue(f"Default: *{default}*" in text, default)


class ClusterPage(unittest.TestCase):
    """kairosd(8), CLUSTER MODE, against src/cluster/cluster.c: the takeover
    grace it states is the code's, and it says what fencing covers."""

    FRACTIONS = {2: "half", 3: "a third", 5: "a fifth", 10: "a tenth"}

    def cluster_mode(self):
        return re.sub(r"\s+", " ", sections(page("kairosd.8"))["CLUSTER MODE"])

    def test_takeover_grace(self):
        with open(os.path.join(SRC, "src/cluster/cluster.c"), encoding="utf-8") as f:
            m = re.search(r"c->grace_ms = c->lease_ms / (\d+) > 1000", f.read())
        self.assertIsNotNone(m, "cluster.c: no grace_ms = lease_ms / N")
        word = self.FRACTIONS[int(m.group(1))]
        text = self.cluster_mode()
        stated = re.findall(r"a grace(?: ago)? \(([\w ]+?) of (?:\*LeaseSec=\*|it), "
                            r"at least 1 s\)", text)
        self.assertGreaterEqual(len(stated), 2, "kairosd.8, Takeover: the grace is not "
                                f"stated where a lease is taken and in the failover time ({stated})")
        for w in stated:
            self.assertEqual(w, word, f"kairosd.8: the takeover grace is {w} of LeaseSec=, "
                             f"the code's is {word}")
        for later in re.findall(r"lease ended more than (.{0,40}?) ago", text):
            self.assertTrue(later.startswith("a grace"),
                            f"kairosd.8: takeover after a lease ended more than {later!r} ago; "
                            f"the code's grace is {word} of LeaseSec=")

    def test_what_fencing_covers(self):
        text = self.cluster_mode()
        m = re.search(r"\*What fencing covers\.\*(.*?)(?: \*[A-Z][a-z]+\.\* |$)", text)
        self.assertIsNotNone(m, "kairosd.8: no paragraph *What fencing covers.*")
        for words in ("*kairosctl tool run*", "*tool write*", "not fenced", "frozen",
                      "*KAIROS_EPOCH*", "*LeaseSec=*"):
            with self.subTest(words=words):
                self.assertIn(words, m.group(1))


class ManBuild(unittest.TestCase):
    def test_scdoc(self):
        scdoc = shutil.which("scdoc")
        if not scdoc:
            self.skipTest("scdoc is not installed")
        for name in ("kairosd.8", "kairosctl.1", "kairosd.conf.5", "kairos.schedule.5"):
            with self.subTest(page=name):
                with open(os.path.join(MAN, name + ".scd"), "rb") as f:
                    r = subprocess.run([scdoc], stdin=f, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE)
                self.assertEqual(r.returncode, 0, r.stderr.decode())
                self.assertIn(b".TH", r.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=1)
