#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Install the Debian 12 packages kairos needs, by purpose:
#
#   tests/install-deps.sh [--runtime] [--build] [--test]
#
#   --runtime  the shared libraries kairosd and kairosctl run with (and the
#              time zone data of TimeZone=); what a machine that only runs a
#              build made elsewhere needs (libpq5: cluster mode, in every
#              build but one with -Dpostgres=disabled)
#   --build    everything to build and install a release from source
#              (meson setup -Dtests=false): compiler, meson, the -dev
#              packages, scdoc for the man pages, bash-completion so that meson
#              finds the completion directory, libpq-dev for cluster
#              mode (-Dpostgres, enabled by default); includes --runtime
#   --test     everything the test suite needs on top of --build: cmocka, clang
#              (fuzz targets), debootstrap and systemd-container (the systemd
#              and Debian package tests), strace, gzip, the Debian packaging
#              tools (dpkg-buildpackage, debhelper, lintian), git, the
#              PostgreSQL server (tests/cluster starts a private one), iproute2
#              and faketime (tests/cluster/netns.py: network namespaces, tc
#              netem, a shifted clock)
#
# Several may be given; none means all three (what CI and tests/run.sh need).
# Idempotent: installs only what is missing.  Needs root (uses sudo if not
# root).  --list prints the packages instead of installing them.
set -euo pipefail

runtime=(libuv1 libsodium23 libjansson4 zlib1g libsystemd0 tzdata libpq5)
build=(meson ninja-build pkgconf gcc libc6-dev libuv1-dev libsodium-dev zlib1g-dev
       libsystemd-dev libjansson-dev scdoc bash-completion libpq-dev)
test=(python3 libcmocka-dev libsqlite3-dev clang debootstrap systemd-container strace
      util-linux gzip git dpkg-dev debhelper lintian
      prometheus-node-exporter prometheus postgresql iproute2 faketime
      libfuse3-dev fuse3)

usage() {
        sed -n '3,26p' "$0" | sed 's/^# \{0,1\}//' >&2
        exit 64
}

want=() list=0
for a in "$@"; do
        case $a in
        --runtime) want+=("${runtime[@]}") ;;
        --build) want+=("${runtime[@]}" "${build[@]}") ;;
        --test) want+=("${runtime[@]}" "${build[@]}" "${test[@]}") ;;
        --list) list=1 ;;
        -h | --help) usage ;;
        *) echo "install-deps.sh: unknown option $a" >&2; usage ;;
        esac
done
[ ${#want[@]} -eq 0 ] && want=("${runtime[@]}" "${build[@]}" "${test[@]}")
mapfile -t want < <(printf '%s\n' "${want[@]}" | awk '!seen[$0]++')

if [ $list -eq 1 ]; then
        printf '%s\n' "${want[@]}"
        exit 0
fi

missing=()
for p in "${want[@]}"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
                missing+=("$p")
        fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
echo "installing: ${missing[*]}" >&2
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
