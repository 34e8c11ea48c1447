# SPDX-License-Identifier: MIT
"""Syscall-order check (issue 8, part 3): one mandate's whole life (fire, the
five phases with real handler programs, two cycles, the archive) under

  strace -f -tt -v -e trace=%file,write,...,fdatasync,fsync,rename*,execve,clone*,...

and, from the trace, in the daemon's threads:

  1. every handler spawn (the clone, by the runner's thread, of the process
     that execs the handler) comes after the write of its step's `executing` record to the WAL and a
     successful fdatasync of the WAL fd after that write;
  2. every new file's directory is fsynced before the file is relied on: the
     WAL's creation -> fsync of wal/ before the fire is acknowledged and before
     the first spawn; every O_EXCL creation -> fsync of its directory before
     the file's first fdatasync; every directory the daemon creates -> fsync
     of its parent before anything is created inside it; every rename -> fsync
     of the target's directory after it, or a syncfs of the state directory
     after it (the archive .gz and the summary: before the WAL is unlinked);
     the WAL's unlink -> fsync of wal/ or a syncfs after it;
  3. every rename is preceded by a successful fdatasync/fsync of the renamed
     file after its last write -- except the mandate's archive and summary,
     which finished mandates write unsynced in batches: a successful syncfs
     must follow their rename before the WAL is unlinked (until then the WAL
     is the truth, and a crash makes the next start archive it again);
  4. the daemon never reads a WAL back while it runs (no WAL is left when it
     starts, so its whole life counts): what it appended it folds from
     memory; read(2)/pread64(2)/readv/preadv on a WAL's fd return 0 bytes;
  5. every write to the WAL is made durable before the WAL is unlinked: an
     fdatasync of the WAL after it, or a syncfs (a mandate that ends alone
     has its last records, summary and archive synced by one syncfs);
  6. spares (wal/.spare-N, docs/design.md §6): a spare is created empty
     (O_EXCL) and never written under its own name; before it is renamed to
     a WAL's name, a successful fsync of wal/ or syncfs that began after its
     creation has returned (then the rename needs no fsync of wal/: rule 2
     and 3 leave it out).  A second mandate is fired once the first is done:
     its WAL must be such a spare, and no fsync of wal/ runs while it lives.

fds are mapped to paths through the trace (open/openat/creat results, dup,
dup2, dup3, fcntl F_DUPFD, close), per process.  A self-test first removes
single syscalls from the real trace and checks that each rule notices.
Skipped (77) without strace.  Standard library only."""
import os
import re
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kairos_harness  # noqa: E402
from kairos_harness import Client, Daemon, NotifySocket, write_config  # noqa: E402

REAL_KAIROSD = os.environ.get("KAIROSD", "kairosd")
AT = "2026-04-20T12:00:00Z"
AT2 = "2026-04-20T12:01:00Z"
TRACED = ("%file,write,writev,sendmsg,sendto,fdatasync,fsync,syncfs,rename,renameat,renameat2,"
          "execve,clone,clone3,fork,vfork,close,dup,dup2,dup3,fcntl,read,pread64,readv,preadv")

HANDLER = r"""#!/bin/sh
cat > /dev/null
printf '{"phase":"%s","cycle":%s}\n' "$KAIROS_PHASE" "$KAIROS_CYCLE"
"""

LINE_RE = re.compile(r"^(\d+)\s+\d\d:\d\d:\d\d\.\d+\s+(.*)$")
UNFINISHED = " <unfinished ...>"
RESUMED_RE = re.compile(r"^<\.\.\. (\w+) resumed>(.*)$")
STR_RE = re.compile(r'"((?:[^"\\]|\\.)*)"')
# name(args) = ret ...; strace pads before "=", and the last ") =" is the one
CALL_RE = re.compile(r"^(\w+)\((.*)\)\s+=\s+(\S+)", re.S)


class Event:
    """One syscall: start = the trace line where it began, seq = the line
    where it returned (the order used for "happened before")."""
    __slots__ = ("start", "seq", "tid", "name", "args", "ret")

    def __init__(self, start, seq, tid, name, args, ret):
        self.start, self.seq = start, seq
        self.tid, self.name, self.args, self.ret = tid, name, args, ret

    def strings(self):
        return [unescape(s) for s in STR_RE.findall(self.args)]

    def ints(self):
        """The leading integer arguments (fds)."""
        out = []
        for part in self.args.split(","):
            part = part.strip()
            if re.fullmatch(r"-?\d+", part):
                out.append(int(part))
            else:
                break
        return out

    def __repr__(self):
        return "#%d [%d] %s(%s) = %s" % (self.seq, self.tid, self.name, self.args[:160], self.ret)


def unescape(s):
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t", "\\": "\\", '"': '"'}.get(
        m.group(1), m.group(1)), s)


def parse_trace(text):
    """strace -f output -> [Event] in completion order (unfinished calls are
    joined with their resumption)."""
    events = []
    pending = {}
    for lineno, raw in enumerate(text.splitlines()):
        m = LINE_RE.match(raw)
        if not m:
            continue
        tid, rest = int(m.group(1)), m.group(2)
        if rest.startswith("+++") or rest.startswith("---"):
            continue
        r = RESUMED_RE.match(rest)
        if r:
            head = pending.pop(tid, None)
            if head is None:
                continue
            start, rest = head[0], head[1] + r.group(2)
        elif rest.endswith(UNFINISHED):
            pending[tid] = (lineno, rest[:-len(UNFINISHED)])
            continue
        else:
            start = lineno
        m = CALL_RE.match(rest)
        if not m:
            continue
        name, args, ret = m.group(1), m.group(2), m.group(3)
        try:
            ret = int(ret, 0)
        except ValueError:
            ret = -1 if ret.startswith("-") or ret == "?" else ret
        events.append(Event(start, lineno, tid, name, args, ret))
    return events


class Trace:
    """The daemon's threads, its children, and its fd table over time."""

    def __init__(self, events, state):
        self.events = events
        self.state = state.rstrip("/")
        self.root = min(events, key=lambda e: e.start).tid
        self.threads = {self.root}
        self.child_clone = {}          # child pid -> the clone that made it
        self.fdpath = {}               # seq -> path of the fd argument (daemon calls)
        self.shim_execs = []           # (event, env dict)
        # who is a thread of the daemon, who a child process (in start order:
        # a child may exec before its parent's clone returns)
        for e in sorted(events, key=lambda x: x.start):
            if e.name in ("clone", "clone3", "fork", "vfork") and e.tid in self.threads \
                    and isinstance(e.ret, int) and e.ret > 0:
                if "CLONE_THREAD" in e.args:
                    self.threads.add(e.ret)
                else:
                    self.child_clone[e.ret] = e
        fds = {}
        fd_set = {}    # fd -> seq of the call that gave it its current meaning
        for e in events:
            if e.name in ("clone", "clone3", "fork", "vfork"):
                continue
            if e.name == "execve" and e.tid in self.child_clone and e.ret == 0 and \
                    '"KAIROS_STEP_ID=' in e.args:
                env = dict(s.split("=", 1) for s in e.strings() if "=" in s and
                           s.startswith("KAIROS_"))
                self.shim_execs.append((e, env))
                continue
            if e.tid not in self.threads:
                continue
            if e.name in ("open", "openat", "creat") and isinstance(e.ret, int) and e.ret >= 0:
                fds[e.ret] = self.resolve(e, fds)
                fd_set[e.ret] = e.seq
            elif e.name in ("dup", "dup2", "dup3") and isinstance(e.ret, int) and e.ret >= 0:
                fds[e.ret] = fds.get(e.ints()[0]) if e.ints() else None
                fd_set[e.ret] = e.seq
            elif e.name == "fcntl" and "F_DUPFD" in e.args and isinstance(e.ret, int) \
                    and e.ret >= 0:
                fds[e.ret] = fds.get(e.ints()[0]) if e.ints() else None
                fd_set[e.ret] = e.seq
            elif e.name in ("write", "writev", "fdatasync", "fsync", "syncfs", "close", "read",
                            "pread64", "readv", "preadv") and e.ints():
                self.fdpath[e.seq] = fds.get(e.ints()[0])
                # A close frees its number when it starts: an open on another
                # thread that returned the same number while the close was
                # still "unfinished" in the trace made a new fd, not this one.
                if e.name == "close" and fd_set.get(e.ints()[0], -1) < e.start:
                    fds.pop(e.ints()[0], None)

    def resolve(self, e, fds):
        """The path an open/rename/unlink names (absolute; *at with a dir fd)."""
        s = e.strings()
        if not s:
            return None
        path = s[0]
        if e.name.endswith("at") and not e.args.startswith("AT_FDCWD") and e.ints():
            base = fds.get(e.ints()[0])
            if base and not path.startswith("/"):
                path = base + "/" + path
        return os.path.normpath(path)

    def daemon(self, names=None):
        for e in self.events:
            if e.tid in self.threads and (names is None or e.name in names):
                yield e

    def in_state(self, path):
        return path is not None and (path == self.state or path.startswith(self.state + "/"))


def rename_paths(e):
    s = e.strings()
    return (os.path.normpath(s[0]), os.path.normpath(s[1])) if len(s) >= 2 else (None, None)


SPARE_RE = re.compile(r"/wal/\.spare-\d+$")


def is_spare(path):
    return bool(path and SPARE_RE.search(path))


def check(trace, mandate):
    """All rules; returns (counts of what was checked, [violations])."""
    T = trace
    bad = []
    wal = os.path.join(T.state, "wal", mandate + ".wal.jsonl")
    n = {"spawns": 0, "wal fdatasyncs": sum(1 for e in T.daemon(("fdatasync",))
                                            if T.fdpath.get(e.seq) == wal),
         "wal creations": 0, "excl creations": 0, "mkdirs": 0,
         "renames synced": 0, "renames synced by syncfs": 0, "renames dir-fsynced": 0,
         "unlinks dir-fsynced": 0,
         "syncfs": sum(1 for e in T.daemon(("syncfs",)) if e.ret == 0)}

    def syncfs_between(after, before=None):
        for e in T.daemon(("syncfs",)):
            if e.seq > after and (before is None or e.seq < before) and e.ret == 0 and \
                    T.in_state(T.fdpath.get(e.seq)):
                return e
        return None

    def fsync_of_dir(d, after, before=None):
        for e in T.daemon(("fsync", "fdatasync")):
            if e.seq > after and (before is None or e.seq < before) and \
                    T.fdpath.get(e.seq) == d and e.ret == 0:
                return e
        return None

    # --- 1. every spawn follows its durable executing record
    for ex, env in T.shim_execs:
        n["spawns"] += 1
        ce = T.child_clone[ex.tid]
        clone = ce.start               # the spawn: where the clone began
        m, step = env.get("KAIROS_MANDATE_ID"), env.get("KAIROS_STEP_ID")
        wpath = os.path.join(T.state, "wal", "%s.wal.jsonl" % m)
        needle = '"step_id":"%s","status":"executing"' % step
        writes = [e for e in T.daemon(("write",)) if e.seq < clone and
                  T.fdpath.get(e.seq) == wpath and any(needle in s for s in e.strings())]
        if not writes:
            bad.append("spawn of %s %s (%r): no write of its executing record before it"
                       % (m, step, ce))
            continue
        w = writes[-1]
        if not isinstance(w.ret, int) or w.ret <= 0:
            bad.append("spawn of %s %s: the executing record's write failed: %r" % (m, step, w))
        sync = [e for e in T.daemon(("fdatasync", "fsync")) if w.seq < e.seq < clone and
                T.fdpath.get(e.seq) == wpath and e.ret == 0]
        if not sync:
            bad.append("spawn of %s %s (%r): no fdatasync of %s between the executing record "
                       "(%r) and the spawn" % (m, step, ce, wpath, w))

    # --- 2. new files and directories
    first_ack = None
    for e in T.daemon(("write", "writev", "sendmsg", "sendto")):
        if any('"fired":true' in s and '"mandate":"%s"' % mandate in s for s in e.strings()):
            first_ack = e.seq
            break
    if first_ack is None:
        bad.append("no acknowledgement of the fire of %s in the trace" % mandate)
    for e in T.daemon(("open", "openat", "creat")):
        if not (isinstance(e.ret, int) and e.ret >= 0 and "O_CREAT" in e.args):
            continue
        path = T.resolve(e, {})
        if not T.in_state(path):
            continue
        d = os.path.dirname(path)
        if path.endswith(".wal.jsonl") and "O_EXCL" in e.args:
            n["wal creations"] += 1
            m = os.path.basename(path)[:-len(".wal.jsonl")]
            spawns = [T.child_clone[x.tid].start for x, env in T.shim_execs
                      if env.get("KAIROS_MANDATE_ID") == m]
            limits = [s for s in spawns + ([first_ack] if m == mandate and first_ack else [])]
            before = min(limits) if limits else None
            if not fsync_of_dir(d, e.seq, before):
                bad.append("WAL %s created (%r) but %s not fsynced before it was relied on "
                           "(#%s)" % (path, e, d, before))
        if "O_EXCL" in e.args and is_spare(path):
            continue  # rule 6
        if "O_EXCL" in e.args:
            n["excl creations"] += 1
            first_sync = next((x.seq for x in T.daemon(("fdatasync", "fsync"))
                               if x.seq > e.seq and T.fdpath.get(x.seq) == path), None)
            if not fsync_of_dir(d, e.seq, first_sync):
                bad.append("%s created with O_EXCL (%r); %s not fsynced before its first "
                           "fdatasync (#%s)" % (path, e, d, first_sync))
    for e in T.daemon(("mkdir", "mkdirat")):
        path = T.resolve(e, {})
        if e.ret != 0 or not T.in_state(path):
            continue
        n["mkdirs"] += 1
        inside = next((x.seq for x in T.daemon(("open", "openat", "creat", "mkdir", "mkdirat"))
                       if x.seq > e.seq and
                       (x.name.startswith("mkdir") or "O_CREAT" in x.args) and
                       (T.resolve(x, {}) or "").startswith(path + "/")), None)
        if not fsync_of_dir(os.path.dirname(path), e.seq, inside):
            bad.append("directory %s created (%r); its parent not fsynced before something "
                       "was created inside (#%s)" % (path, e, inside))
    unlink_wal = next((e for e in T.daemon(("unlink", "unlinkat"))
                       if T.resolve(e, {}) == wal and e.ret == 0), None)
    if unlink_wal is None:
        bad.append("the WAL %s was never unlinked (not archived?)" % wal)
    for e in T.daemon(("rename", "renameat", "renameat2")):
        src, dst = rename_paths(e)
        if e.ret != 0 or not T.in_state(dst) or is_spare(src):
            continue  # a spare's: rule 6
        n["renames dir-fsynced"] += 1
        before = None
        if unlink_wal and (dst.endswith("/archive/%s.wal.jsonl.gz" % mandate) or
                           dst.endswith("/mandates/%s.json" % mandate)):
            before = unlink_wal.seq
            if e.seq > before:
                bad.append("%s renamed into place after the WAL was unlinked: %r" % (dst, e))
        if not fsync_of_dir(os.path.dirname(dst), e.seq, before) and \
                not syncfs_between(e.seq, before):
            bad.append("rename to %s (%r): %s not fsynced after it%s" % (
                dst, e, os.path.dirname(dst),
                " before the WAL was unlinked (#%d)" % before if before else ""))
    for e in T.daemon(("unlink", "unlinkat")):
        path = T.resolve(e, {})
        if e.ret == 0 and path and path.endswith(".wal.jsonl") and T.in_state(path):
            n["unlinks dir-fsynced"] += 1
            if not fsync_of_dir(os.path.dirname(path), e.seq) and not syncfs_between(e.seq):
                bad.append("WAL %s unlinked (%r); wal/ never fsynced after it" % (path, e))

    # --- 3. every rename follows an fdatasync/fsync of the renamed file
    state = {}          # path -> "dirty" | "synced"
    for e in T.daemon():
        if e.name in ("open", "openat", "creat") and isinstance(e.ret, int) and e.ret >= 0 \
                and ("O_TRUNC" in e.args or "O_CREAT" in e.args or e.name == "creat"):
            p = T.resolve(e, {})
            if "O_TRUNC" in e.args or p not in state:
                state[p] = "dirty"
        elif e.name in ("write", "writev") and T.fdpath.get(e.seq):
            state[T.fdpath[e.seq]] = "dirty"
        elif e.name in ("fdatasync", "fsync") and T.fdpath.get(e.seq) and e.ret == 0:
            state[T.fdpath[e.seq]] = "synced"
        elif e.name in ("rename", "renameat", "renameat2") and e.ret == 0:
            src, dst = rename_paths(e)
            if not T.in_state(dst) or is_spare(src):
                state[dst] = state.pop(src, None)
                continue  # a spare's: rule 6
            # a summary or archive (of any mandate) whose WAL goes later
            bm = re.search(r"/(?:archive/(.+)\.wal\.jsonl\.gz|mandates/(.+)\.json)$", dst)
            bwal = os.path.join(T.state, "wal", (bm.group(1) or bm.group(2)) + ".wal.jsonl") \
                if bm else None
            bunlink = next((x for x in T.daemon(("unlink", "unlinkat"))
                            if x.seq > e.seq and x.ret == 0 and T.resolve(x, {}) == bwal),
                           None) if bwal else None
            batched = bunlink is not None
            if state.get(src) != "synced" and batched:
                n["renames synced by syncfs"] += 1
                if not syncfs_between(e.seq, bunlink.seq):
                    bad.append("rename %s -> %s (%r) of an unsynced file, and no syncfs after "
                               "it before the WAL was unlinked (%r)" % (src, dst, e, bunlink))
            elif state.get(src) != "synced":
                bad.append("rename %s -> %s (%r) without an fdatasync of the file after its "
                           "last write (%s)" % (src, dst, e, state.get(src, "never opened")))
            else:
                n["renames synced"] += 1
            state[dst] = state.pop(src, None)

    # --- 5. the WAL's last records durable before it goes
    if unlink_wal is not None:
        last = max((e for e in T.daemon(("write",)) if T.fdpath.get(e.seq) == wal and
                    e.seq < unlink_wal.seq), key=lambda e: e.seq, default=None)
        n["last wal write synced"] = 0
        if last is not None:
            if fsync_of_dir(wal, last.seq, unlink_wal.seq) or \
                    syncfs_between(last.seq, unlink_wal.seq):
                n["last wal write synced"] = 1
            else:
                bad.append("the WAL's last write (%r) not made durable (fdatasync or syncfs) "
                           "before the WAL was unlinked (%r)" % (last, unlink_wal))

    # --- 6. spares: created empty, covered by a sync before the rename
    n["spares created"] = n["spares taken"] = 0
    created = {}
    for e in T.daemon(("open", "openat", "creat")):
        path = T.resolve(e, {})
        if is_spare(path) and T.in_state(path) and isinstance(e.ret, int) and e.ret >= 0:
            if "O_EXCL" not in e.args:
                bad.append("spare %s opened for writing under its own name: %r" % (path, e))
                continue
            n["spares created"] += 1
            created[path] = e
    for e in T.daemon(("write", "writev", "ftruncate")):
        if is_spare(T.fdpath.get(e.seq)):
            bad.append("spare %s written under its own name: %r" % (T.fdpath[e.seq], e))
    for e in T.daemon(("rename", "renameat", "renameat2")):
        src, dst = rename_paths(e)
        if e.ret != 0 or not is_spare(src) or not T.in_state(src):
            continue
        n["spares taken"] += 1
        if not dst.endswith(".wal.jsonl") or os.path.dirname(dst) != os.path.dirname(src):
            bad.append("spare %s renamed to %s, not to a WAL in its directory: %r"
                       % (src, dst, e))
        c = created.get(src)
        if c is None:
            bad.append("spare %s renamed (%r) but never created in this life" % (src, e))
            continue
        cover = [x for x in T.daemon(("fsync", "syncfs")) if x.ret == 0 and
                 x.start > c.seq and x.seq < e.start and
                 (T.fdpath.get(x.seq) == os.path.dirname(src) if x.name == "fsync"
                  else T.in_state(T.fdpath.get(x.seq)))]
        if not cover:
            bad.append("spare %s (created %r) renamed to %s (%r) with no fsync of %s or syncfs "
                       "begun after its creation and returned before the rename"
                       % (src, c, dst, e, os.path.dirname(src)))

    # --- 4. no WAL read back
    n["wal bytes read"] = 0
    for e in T.daemon(("read", "pread64", "readv", "preadv")):
        p = T.fdpath.get(e.seq) or ""
        if p.endswith(".wal.jsonl") and T.in_state(p) and isinstance(e.ret, int) and e.ret > 0:
            n["wal bytes read"] += e.ret
            if n["wal bytes read"] == e.ret:
                bad.append("the WAL %s read back while running (%r): what the daemon "
                           "appended it must fold from memory" % (p, e))
    return n, bad


def self_test(trace, mandate, second=None):
    """Each rule must notice a missing syscall: drop one and re-check."""
    T = trace

    def without(pred):
        t = Trace([e for e in T.events if not pred(e)], T.state)
        return check(t, mandate)[1] + (check(t, second)[1] if second else [])

    wal = os.path.join(T.state, "wal", mandate + ".wal.jsonl")
    cases = {
        # a read of the WAL is noticed: one made up from its first write
        "a WAL read back": None,
        "fdatasync before a spawn": lambda e: e.name == "fdatasync" and
        T.fdpath.get(e.seq) == wal,
        "fsync of wal/": lambda e: e.name == "fsync" and
        T.fdpath.get(e.seq) == os.path.join(T.state, "wal"),
        "syncfs of a batch of finished mandates": lambda e: e.name == "syncfs",
        "fsync of the state directory": lambda e: e.name == "fsync" and
        T.fdpath.get(e.seq) == T.state,
        "fdatasync of a file renamed": lambda e: e.name == "fdatasync" and
        (T.fdpath.get(e.seq) or "").endswith(".tmp"),
    }
    # the sync that made the spares durable (the first mandate's end)
    first_spare = next((e.seq for e in T.daemon(("open", "openat")) if
                        is_spare(T.resolve(e, {}))), None)
    if first_spare is not None:
        cover = next((e for e in T.daemon(("syncfs", "fsync")) if e.start > first_spare), None)
        if cover is not None:
            cases["the sync covering the spares"] = lambda e: e is cover
    missed = []
    for what, pred in cases.items():
        if pred is None:
            w = next(e for e in T.daemon(("write",)) if T.fdpath.get(e.seq) == wal)
            fake = Event(w.start, w.seq, w.tid, "pread64", w.args, w.ret)
            t = Trace([fake if e is w else e for e in T.events], T.state)
            if not check(t, mandate)[1]:
                missed.append(what)
        elif not without(pred):
            missed.append(what)
    return len(cases), missed


def main():
    strace = shutil.which("strace")
    if not strace:
        print("strace not installed: skipped")
        return 77
    t0 = time.monotonic()
    # on tmpfs: a file system that keeps a rename never synced whole, where
    # kairosd uses WAL spares (rule 6; statedir_renames_atomic)
    tmp = tempfile.mkdtemp(prefix="kairos-sysorder-",
                           dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    keep = os.environ.get("KAIROS_SYSORDER_KEEP", "") not in ("", "0")
    state = os.path.join(tmp, "state")
    trace_file = os.path.join(tmp, "trace.txt")
    wrapper = os.path.join(tmp, "kairosd-straced")
    with open(wrapper, "w") as f:
        f.write('#!/bin/sh\nexec %s -f -tt -v -s 4096 -e signal=none -e trace=%s -o %s %s "$@"\n'
                % (strace, TRACED, trace_file, REAL_KAIROSD))
    os.chmod(wrapper, 0o755)
    handler = os.path.join(tmp, "handler.sh")
    with open(handler, "w") as f:
        f.write(HANDLER)
    os.chmod(handler, 0o755)
    conf = write_config(tmp, state, {"life": {
        "Schedule": {"Cron": "0 0 1 1 *"}, "Mandate": {"MaxCycles": "2"},
        "Exec": {k: handler for k in ("Observe", "Orient", "Decide", "Act", "Reflect")}}})
    notify = NotifySocket(tmp)
    kairos_harness.KAIROSD = wrapper
    # LeakSanitizer cannot run under ptrace (the sanitizer build): leaks are
    # the other tests' business
    asan = (os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0").lstrip(":")
    d = Daemon(state, config=conf, notify=notify, env={"ASAN_OPTIONS": asan})
    ok = False
    try:
        notify.wait_ready(timeout=120)
        c = Client(d.socket_path, timeout=120)
        r = c.call("fire", schedule="life", at=AT)
        assert r.get("ok") and r["result"]["fired"], r
        mandate = r["result"]["mandate"]
        d.wait_log("mandate %s done after 2 cycles" % mandate, timeout=120)
        d.wait_log("WAL archived", timeout=120)
        # the second one alone: its WAL a spare the first one's end made
        r = c.call("fire", schedule="life", at=AT2)
        assert r.get("ok") and r["result"]["fired"], r
        second = r["result"]["mandate"]
        d.wait_log("mandate %s done after 2 cycles" % second, timeout=120)
        c.close()
        # strace does not pass SIGTERM on: signal the daemon itself
        with open(os.path.join(state, "kairosd.pid")) as f:
            os.kill(int(f.read().split()[0]), signal.SIGTERM)
        rc = d.proc.wait(120)
        d.reader.join(30)
        assert rc == 0, "kairosd (under strace) exited %d:\n%s" % (rc, d.log()[-3000:])
        t_run = time.monotonic() - t0
        with open(trace_file, errors="replace") as f:
            events = parse_trace(f.read())
        trace = Trace(events, os.path.realpath(state))
        counts, bad = check(trace, mandate)
        counts2, bad2 = check(trace, second)
        bad += [b for b in bad2 if b not in bad]
        wal2 = os.path.join(trace.state, "wal", second + ".wal.jsonl")
        waldir = os.path.join(trace.state, "wal")
        taken = [e for e in trace.daemon(("rename", "renameat", "renameat2"))
                 if e.ret == 0 and is_spare(rename_paths(e)[0]) and rename_paths(e)[1] == wal2]
        unlink2 = next((e for e in trace.daemon(("unlink", "unlinkat"))
                        if trace.resolve(e, {}) == wal2 and e.ret == 0), None)
        if not taken:
            bad.append("the second mandate's WAL %s is not a spare renamed" % wal2)
        elif unlink2:
            dir_syncs = [e for e in trace.daemon(("fsync",)) if e.ret == 0 and
                         trace.fdpath.get(e.seq) == waldir and
                         taken[0].seq < e.seq < unlink2.seq]
            counts["wal/ fsyncs of the second mandate"] = len(dir_syncs)
            if dir_syncs:
                bad.append("the second mandate's life fsynced wal/ (%r): a spare needs none"
                           % dir_syncs[0])
        if counts2["wal fdatasyncs"] != 10:
            bad.append("expected 10 fdatasyncs of the second WAL, saw %d"
                       % counts2["wal fdatasyncs"])
        print("traced one mandate life (%d syscalls of the daemon and its children, %d daemon "
              "threads, %.1f s)" % (len(events), len(trace.threads), t_run))
        print("checked: %s" % ", ".join("%s %d" % kv for kv in counts.items()))
        # alone, its end is made durable by the syncfs of its summary and
        # archive: 5 barriers per cycle (the last of cycle 1 shared with the
        # plan of cycle 2), none of its own at the end
        if counts["wal fdatasyncs"] != 10:
            bad.append("expected 10 fdatasyncs of the WAL (2 cycles, the end synced by the "
                       "syncfs of its archive), saw %d" % counts["wal fdatasyncs"])
        if counts["spawns"] != 20:
            bad.append("expected 20 handler spawns (2 mandates x 5 phases x 2 cycles), saw %d"
                       % counts["spawns"])
        n_self, missed = self_test(trace, mandate, second)
        print("self-test: %d syscall kinds dropped from the trace, %d noticed"
              % (n_self, n_self - len(missed)))
        for what in missed:
            bad.append("self-test: dropping every %s went unnoticed" % what)
        for b in bad:
            print("VIOLATION: " + b)
        print("violations: %d (%.1f s)" % (len(bad), time.monotonic() - t0))
        ok = not bad
        return 0 if ok else 1
    finally:
        if d.proc.poll() is None:
            d.kill()
        notify.close()
        if ok and not keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print("kept: %s" % tmp)


if __name__ == "__main__":
    sys.exit(main())
