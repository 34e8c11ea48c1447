#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The daemon's modules keep the shape docs/design.md §2 describes: only
`commands` speaks the control protocol (no other module replies to a
request or sees one), nothing calls up into `main`, the executor's private
header stays inside the executor's files, cluster mode stays inside its
driver (docs/design.md §14, "Drivers"): src/daemon holds no PostgreSQL
code, the postgres driver's files are in src/cluster; and the core library
has no event loop and no logging.  Read from the sources (KAIROS_SRCDIR).
"""
import os
import re
import unittest

SRC = os.environ.get("KAIROS_SRCDIR", os.path.join(os.path.dirname(__file__), "..", ".."))
DAEMON = os.path.join(SRC, "src", "daemon")
CLUSTER = os.path.join(SRC, "src", "cluster")
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


# The postgres driver (driver.h), in src/cluster beside the PostgreSQL store
# it calls: with it, the only files that may name PostgreSQL, the cluster's
# functions or its state.  Its modules are part of the daemon's graph.
POSTGRES_DRIVER = {"cluster.c", "cluster.h", "cluster_ticks.c", "cluster_executor.c",
                   "driver_postgres.c", "driver_postgres.h", "initdb.c",
                   "cluster_commands.c", "cluster_idem.c"}
# The drivers' registration: Backend= to a driver, built in or not.
REGISTRATION = {"main.c"}
# What only the postgres driver may say: the build's PostgreSQL switch, a
# call to the cluster's or the database's functions, the cluster's state in
# the daemon or a mandate, the backend tested by name.
CLUSTER_ONLY = re.compile(r"KAIROS_HAVE_PGSTORE|(?<![\w>.])(?:cluster|pgstore)_\w+\s*\(|"
                          r"->(?:cluster|deadman)\b|->cluster_\w+|CONFIG_BACKEND_POSTGRES")
CLUSTER_HEADER = re.compile(r'^#include\s*"((?:cluster|pgstore|driver_postgres)\.h)"', re.M)


def module_of(name):
    """A daemon file's module: the executor's files are one module."""
    base = name.rsplit(".", 1)[0]
    return "executor" if base.startswith("executor") else base


def external_names(text):
    """Functions and globals a .c file defines with external linkage."""
    funcs = set(re.findall(r"^(?!static\b|extern\b|typedef\b)[A-Za-z_][\w \*]*?\b(\w+)\s*\([^;]*?\)\s*\{",
                           text, flags=re.M))
    data = set(re.findall(r"^(?!static\b|extern\b|typedef\b|return\b|(?:struct|union|enum)\s+\w+\s*;)"
                          r"[A-Za-z_][\w \*]*?\b(\w+)\s*(?:\[[^\]]*\])?\s*(?:=[^;]*)?;",
                          text, flags=re.M))
    return funcs, data


def module_graph(daemon):
    """{(A, B): {names}} for every use in module A of a function or global
    with external linkage defined in module B != A.  A header without a .c
    of its own (daemon.h: the shared declarations) is no module."""
    modules = {module_of(n) for n in daemon if n.endswith(".c")}
    daemon = {n: t for n, t in daemon.items() if module_of(n) in modules}
    owner = {}
    for name, text in daemon.items():
        if name.endswith(".c"):
            funcs, data = external_names(text)
            for f in funcs | data:
                owner[f] = module_of(name)
    local = {}
    for name, text in daemon.items():
        own = local.setdefault(module_of(name), set())
        own.update(re.findall(r"^static\b[^;{(=]*?\b(\w+)\s*[(\[=;]", text, flags=re.M))
    edges = {}
    for name, text in daemon.items():
        a = module_of(name)
        for ident in set(re.findall(r"(?<![\w.>])([A-Za-z_]\w*)\b", text)):
            b = owner.get(ident)
            if b is None or b == a or ident in local[a]:
                continue
            edges.setdefault((a, b), set()).add(ident)
    return edges


def cycles(edges):
    """The strongly connected components of more than one module (Tarjan)."""
    succ = {}
    for a, b in edges:
        succ.setdefault(a, set()).add(b)
        succ.setdefault(b, set())
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(succ[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(succ):
        if v not in index:
            visit(v)
    return out


class Layering(unittest.TestCase):
    def setUp(self):
        self.in_daemon = sources(DAEMON)
        self.in_cluster = sources(CLUSTER)
        self.assertFalse(set(self.in_daemon) & set(self.in_cluster), "one name, one file")
        self.raw = dict(self.in_daemon, **self.in_cluster)
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
        self.assertTrue(all(n.startswith("executor") and n in self.in_daemon for n in inc), inc)

    def test_no_module_cycle(self):
        """Data flows one way (docs/design.md §2): a lower module reports up
        through a callback it was given, never by calling up.  A module is a
        .c file with its .h; the executor's files are one module."""
        edges = module_graph(self.daemon)
        found = cycles(edges)
        lines = []
        for comp in found:
            lines.append("cycle of %d modules: %s" % (len(comp), " ".join(comp)))
            for (a, b), names in sorted(edges.items()):
                if a in comp and b in comp:
                    lines.append("  %s -> %s: %s" % (a, b, ", ".join(sorted(names))))
        self.assertEqual(found, [], "\n" + "\n".join(lines))

    def test_module_graph_sees_calls(self):
        """The graph is read right: known edges down are there."""
        edges = module_graph(self.daemon)
        self.assertIn("executor_fire", edges.get(("commands", "executor"), set()))
        self.assertIn("serialq_submit", edges.get(("executor", "serialq"), set()))
        self.assertIn(("main", "lifecycle"), edges)
        # (the postgres driver's files in src/cluster are modules of the graph)
        self.assertIn("executor_kick", edges.get(("cluster_executor", "executor"), set()))
        self.assertEqual(cycles({("a", "b"): {"f"}, ("b", "c"): {"g"}, ("c", "a"): {"h"},
                                 ("c", "d"): {"i"}}), [["a", "b", "c"]])
        self.assertEqual(module_of("executor_advance.c"), "executor")

    def test_cluster_stays_in_its_driver(self):
        """No `#ifdef KAIROS_HAVE_PGSTORE`, no `if (d->cluster)`, no call of
        a cluster_ or pgstore_ function in a shared module: the loop calls
        through its driver (driver.h), whichever runs.  Every file of
        src/daemon is checked; the driver's are in src/cluster."""
        found = []
        for name in sorted(POSTGRES_DRIVER & set(self.in_daemon)):
            found.append("%s: a file of the postgres driver in src/daemon" % name)
        for name, text in sorted(self.in_daemon.items()):
            for m in CLUSTER_HEADER.finditer(text):
                if name not in REGISTRATION:
                    found.append("%s: #include \"%s\"" % (name, m.group(1)))
            # (comments and strings may name it; their newlines are kept for
            # the line numbers)
            body = re.sub(r"/\*.*?\*/", lambda c: "\n" * c.group(0).count("\n"), text,
                          flags=re.S)
            body = code(body)
            for m in CLUSTER_ONLY.finditer(body):
                what = m.group(0)
                if name in REGISTRATION and what in ("KAIROS_HAVE_PGSTORE",
                                                     "CONFIG_BACKEND_POSTGRES"):
                    continue
                line = body.count("\n", 0, m.start()) + 1
                found.append("%s:%d: %s" % (name, line, what.strip()))
        self.assertEqual(found, [], "\n" + "\n".join(found))

    def test_cluster_check_sees_it(self):
        """The check above reads what it must."""
        for bad in ("#ifdef KAIROS_HAVE_PGSTORE", "if (d->cluster) x();", "cluster_hold(m);",
                    "(void)pgstore_reset(s);", "m->cluster_held = true;",
                    "d->cfg->backend == CONFIG_BACKEND_POSTGRES"):
            self.assertIsNotNone(CLUSTER_ONLY.search(code(bad)), bad)
        for fine in ("own_hold(m);", "config_keep_cluster(a, b);", '"cluster_unavailable"',
                     "/* cluster_hold(m) */", "d->drv->wal.options(m, o);"):
            self.assertIsNone(CLUSTER_ONLY.search(code(fine)), fine)
        self.assertIsNotNone(CLUSTER_HEADER.search('#include "cluster.h"\n'))
        self.assertTrue(POSTGRES_DRIVER <= set(self.in_cluster))

    def test_core_library_is_pure(self):
        for name, text in sources(LIB).items():
            self.assertIsNone(re.search(r'#include\s*[<"](uv\.h|log\.h|systemd/)', text), name)
            self.assertIsNone(re.search(r"\b(exit|abort|syslog|sd_journal_\w+)\s*\(", code(text)),
                              name)


if __name__ == "__main__":
    unittest.main(verbosity=1)
