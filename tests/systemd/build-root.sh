#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Build (once) the Debian 12 root the systemd test boots with systemd-nspawn:
# debootstrap minbase with systemd, dbus and kairosd's runtime libraries
# (libpq5 among them: the package is built with cluster mode).
# The root is cached outside the source tree and reused; it is never
# modified afterwards (the test boots an overlay of it).
#
#   tests/systemd/build-root.sh [CACHE_DIR]     (default /var/cache/kairos-test-root)
#   tests/systemd/build-root.sh --print-mirror  (the mirror it would use)
#
# Prints the root's path.  Exits 0, or 1 if debootstrap failed (its log is
# shown) or no mirror was found.  The mirror is the one this machine's apt
# uses for bookworm (the first enabled "deb" source of suite bookworm in
# /etc/apt/sources.list and /etc/apt/sources.list.d/*.list, one-line format,
# or *.sources, deb822), as its admin configured it; KAIROS_TEST_MIRROR
# overrides it.  APT_SOURCES_DIR (default /etc/apt) is where to look.
set -euo pipefail

# The URI of the first enabled "deb" source of suite bookworm.
apt_mirror() {
        python3 - "${APT_SOURCES_DIR:-/etc/apt}" <<'PY'
import glob, os, re, sys
etc = sys.argv[1]
files = [os.path.join(etc, "sources.list")] + sorted(
    glob.glob(os.path.join(etc, "sources.list.d", "*.list")) +
    glob.glob(os.path.join(etc, "sources.list.d", "*.sources")))
def one_line(text):
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        line = re.sub(r"\[[^]]*\]", " ", line)  # [arch=... signed-by=...]
        w = line.split()
        if len(w) >= 3 and w[0] == "deb":
            yield w[1], [w[2]]
def deb822(text):
    for stanza in re.split(r"\n\s*\n", text):
        fields, key = {}, None
        for line in stanza.splitlines():
            if line.startswith("#"):
                continue
            if line[:1] in (" ", "\t") and key:
                fields[key] += " " + line.strip()
            elif ":" in line:
                key, _, v = line.partition(":")
                key = key.strip().lower()
                fields[key] = v.strip()
        if "deb" not in fields.get("types", "").split() or \
                fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields.get("uris", "").split():
            yield uri, fields.get("suites", "").split()
for f in files:
    try:
        text = open(f).read()
    except OSError:
        continue
    for uri, suites in (deb822 if f.endswith(".sources") else one_line)(text):
        if "bookworm" in suites and re.match(r"(https?|file)://", uri):
            print(uri)
            sys.exit(0)
sys.exit(1)
PY
}

mirror=${KAIROS_TEST_MIRROR:-}
no_mirror() {
        echo "build-root: no apt source for bookworm in ${APT_SOURCES_DIR:-/etc/apt}/sources.list" \
             "or sources.list.d/ (set KAIROS_TEST_MIRROR=URI)" >&2
        exit 1
}
if [ "${1:-}" = --print-mirror ]; then
        if [ -z "$mirror" ] && ! mirror=$(apt_mirror); then
                no_mirror
        fi
        echo "$mirror"
        exit 0
fi
cache=${1:-${KAIROS_TEST_ROOT_CACHE:-/var/cache/kairos-test-root}}
# Bump when the package list changes: a new root is built next to the old one.
version=2
root=$cache/root-v$version
pkgs=systemd,systemd-sysv,dbus,libuv1,libsodium23,libjansson4,zlib1g,libpq5

mkdir -p "$cache"
exec 9>"$cache/lock"
flock 9
if [ -f "$root/.kairos-root-complete" ]; then
        echo "$root"
        exit 0
fi
tmp=$root.tmp
rm -rf "$tmp"
if [ -z "$mirror" ] && ! mirror=$(apt_mirror); then
        no_mirror
fi
echo "build-root: debootstrap bookworm from $mirror into $tmp (once; cached afterwards)" >&2
if ! debootstrap --variant=minbase --include="$pkgs" bookworm "$tmp" "$mirror" \
        >"$cache/debootstrap.log" 2>&1; then
        tail -n 30 "$cache/debootstrap.log" >&2
        rm -rf "$tmp"
        exit 1
fi
# A machine id and no getty on the console: the container only runs services.
: >"$tmp/etc/machine-id"
ln -sf /dev/null "$tmp/etc/systemd/system/console-getty.service"
ln -sf /dev/null "$tmp/etc/systemd/system/getty@.service"
echo kairos-test >"$tmp/etc/hostname"
apt_clean() { rm -rf "$tmp/var/cache/apt/archives/"*.deb "$tmp/var/lib/apt/lists/"*; }
apt_clean
touch "$tmp/.kairos-root-complete"
mv "$tmp" "$root"
echo "$root"
