#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Build (once) the Debian 12 root the systemd test boots with systemd-nspawn:
# debootstrap minbase with systemd, dbus and kairosd's runtime libraries.
# The root is cached outside the source tree and reused; it is never
# modified afterwards (the test boots an overlay of it).
#
#   tests/systemd/build-root.sh [CACHE_DIR]     (default /var/cache/kairos-test-root)
#
# Prints the root's path.  Exits 0, or 1 if debootstrap failed (its log is
# shown).  Environment: KAIROS_TEST_MIRROR (default http://deb.debian.org/debian).
set -euo pipefail

cache=${1:-${KAIROS_TEST_ROOT_CACHE:-/var/cache/kairos-test-root}}
mirror=${KAIROS_TEST_MIRROR:-http://deb.debian.org/debian}
# Bump when the package list changes: a new root is built next to the old one.
version=1
root=$cache/root-v$version
pkgs=systemd,systemd-sysv,dbus,libuv1,libsodium23,libjansson4,zlib1g

mkdir -p "$cache"
exec 9>"$cache/lock"
flock 9
if [ -f "$root/.kairos-root-complete" ]; then
        echo "$root"
        exit 0
fi
tmp=$root.tmp
rm -rf "$tmp"
echo "build-root: debootstrap bookworm into $tmp (once; cached afterwards)" >&2
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
