#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The daemon's modules keep the shape docs/design.md §2 describes: only
`commands` speaks the control protocol (no other module replies to a
request or sees one), nothing calls up into `main`, the executor's private
header stays inside the executor's files, and the core library has no event
loop and no logging.  Read from the sources (KAIROS_SRCDIR).
"""
import os
import re
import unittest

SRC = os.environ.get("KAIROS_SRCDIR", os.path.join(os.path.dirname(__file__), "..", ".."))
DAEMON = os.path.join(SRC, "src", "daemon")
LIB = os.path.join(SRC, "src", "lib")


def sources(d, exts=(".c", ".h")):
    out = {}
    for name in sorted(os.listdir(d)):
        if name.endswith(exts):
            with open(os.path.join(d, name), encoding="utf-8") as f:
                out[name] = f.read()
    return out


def code(text):
    """text without comments and string literals."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)


class Layering(unittest.TestCase):
    def setUp(self):
        self.raw = sources(DAEMON)
        self.daemon = {n: code(t) for n, t in self.raw.items()}

    def users(self, pattern):
        rx = re.compile(pattern)
        return {n for n, t in self.daemon.items() if rx.search(t)}

    def includers(self, header):
        rx = re.compile(r'^#include\s*"%s"' % re.escape(header), re.M)
        return {n for n, t in self.raw.items() if rx.search(t)}

    def test_only_commands_replies(self):
        self.assertEqual(self.users(r"\bcontrol_reply\w*\s*\("),
                         {"commands.c", "control.c", "control.h"})

    def test_only_commands_sees_requests(self):
        self.assertEqual(self.users(r"\bstruct\s+control_request\b"),
                         {"commands.c", "commands.h", "control.c", "control.h"})
        self.assertEqual(self.includers("control.h"),
                         {"commands.c", "control.c", "main.c"})

    def test_nothing_calls_up_into_main(self):
        main = self.daemon["main.c"]
        defined = set(re.findall(r"^(?!static\b)[A-Za-z_][\w \*]*?\b(\w+)\s*\([^;]*?\)\s*\{",
                                 main, flags=re.M))
        self.assertEqual(defined, {"main"}, "main.c defines only main() with external linkage")
        statics = set(re.findall(r"^static\b[^;{(]*?\b(\w+)\s*\(", main, flags=re.M))
        for name, text in self.daemon.items():
            if name == "main.c":
                continue
            for f in statics:
                if re.search(r"^static\b[^;{(]*?\b%s\s*\(" % re.escape(f), text, flags=re.M):
                    continue  # a function of its own with the same name
                self.assertIsNone(re.search(r"\b%s\s*\(" % re.escape(f), text),
                                  "%s calls %s of main.c" % (name, f))

    def test_executor_internals_stay_inside(self):
        inc = self.includers("executor_internal.h")
        self.assertTrue(inc)
        self.assertTrue(all(n.startswith("executor") for n in inc), inc)

    def test_core_library_is_pure(self):
        for name, text in sources(LIB).items():
            self.assertIsNone(re.search(r'#include\s*[<"](uv\.h|log\.h|systemd/)', text), name)
            self.assertIsNone(re.search(r"\b(exit|abort|syslog|sd_journal_\w+)\s*\(", code(text)),
                              name)


if __name__ == "__main__":
    unittest.main(verbosity=1)
