#!/usr/bin/env bash
# Install the Debian 12 packages kairos needs to build, test and run.
# Idempotent: installs only what is missing.  Needs root (uses sudo if not root).
set -euo pipefail

pkgs=(
        meson ninja-build pkg-config gcc python3
        libuv1-dev libsodium-dev zlib1g-dev libsystemd-dev libjansson-dev
        libcmocka-dev libsqlite3-dev clang scdoc tzdata
        debootstrap systemd-container strace
)

missing=()
for p in "${pkgs[@]}"; do
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
