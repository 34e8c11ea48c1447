#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""build-root.sh takes its mirror from the machine's apt sources
(`build-root.sh --print-mirror` on made-up source directories): the first
enabled "deb" source of suite bookworm, in sources.list, then
sources.list.d/*.list and *.sources in name order, one-line and deb822;
deb-src, other suites, "Enabled: no" and commented lines are skipped;
KAIROS_TEST_MIRROR wins; none is a clear error.  Fast: no container."""
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build-root.sh")


class Mirror(unittest.TestCase):
    def mirror(self, files, env=None):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "sources.list.d"))
            for name, text in files.items():
                with open(os.path.join(d, name), "w") as f:
                    f.write(text)
            e = {k: v for k, v in os.environ.items() if k != "KAIROS_TEST_MIRROR"}
            e["APT_SOURCES_DIR"] = d
            e.update(env or {})
            return subprocess.run(["bash", SCRIPT, "--print-mirror"], capture_output=True,
                                  text=True, env=e, timeout=30)

    def test_one_line_format(self):
        r = self.mirror({"sources.list": "# deb http://commented.invalid/debian bookworm main\n"
                         "deb-src http://src.invalid/debian bookworm main\n"
                         "deb http://other.invalid/debian trixie main\n"
                         "deb [arch=amd64 signed-by=/k.gpg] http://one.invalid/debian "
                         "bookworm main # note\n"})
        self.assertEqual((r.returncode, r.stdout), (0, "http://one.invalid/debian\n"), r.stderr)

    def test_deb822_format(self):
        r = self.mirror({"sources.list.d/debian.sources":
                         "Types: deb\nURIs: http://off.invalid/debian\nSuites: bookworm\n"
                         "Enabled: no\n\n"
                         "Types: deb deb-src\n# http://commented.invalid/debian\n"
                         "URIs: http://sec.invalid/debian-security\nSuites: bookworm-security\n\n"
                         "Types: deb\nURIs: http://822.invalid/debian\n"
                         "Suites: bookworm bookworm-updates\nComponents: main\n"})
        self.assertEqual((r.returncode, r.stdout), (0, "http://822.invalid/debian\n"), r.stderr)

    def test_sources_list_first_then_the_directory_in_name_order(self):
        files = {"sources.list.d/b.list": "deb http://b.invalid/debian bookworm main\n",
                 "sources.list.d/a.sources": "Types: deb\nURIs: http://a.invalid/debian\n"
                                             "Suites: bookworm\n"}
        self.assertEqual(self.mirror(files).stdout, "http://a.invalid/debian\n")
        files["sources.list"] = "deb http://main.invalid/debian bookworm main\n"
        self.assertEqual(self.mirror(files).stdout, "http://main.invalid/debian\n")

    def test_environment_wins(self):
        r = self.mirror({"sources.list": "deb http://one.invalid/debian bookworm main\n"},
                        env={"KAIROS_TEST_MIRROR": "http://env.invalid/debian"})
        self.assertEqual(r.stdout, "http://env.invalid/debian\n")

    def test_none_is_a_clear_error(self):
        r = self.mirror({"sources.list": "deb http://other.invalid/debian trixie main\n"})
        self.assertEqual(r.returncode, 1)
        self.assertIn("no apt source for bookworm", r.stderr)
        self.assertIn("KAIROS_TEST_MIRROR", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
