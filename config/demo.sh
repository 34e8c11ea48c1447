#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The built-in demo: install what building needs (tests/install-deps.sh
# --build), build, write a demo configuration under a local directory and
# run kairosd on it in the foreground (Ctrl-C stops it gracefully).
#
#   config/demo.sh
#
# Environment:
#   KAIROS_DEMO_DIR  the demo directory (default: ./demo-state under the
#                    current directory); holds kairosd.conf, schedules.d/,
#                    the state (state/), the control socket (control.sock)
#                    and the outbox the demo's act phase writes to
#   KAIROSD          a kairosd binary to use: skips installing and building
#   KAIROSCTL        the kairosctl to use with it (default: kairosctl on PATH)
#   KAIROS_BUILD_DIR the build directory (default: build in the source tree)
#
# Then, from another terminal (in the same directory):
#   build/src/ctl/kairosctl --socket demo-state/control.sock fire demo
#   build/src/ctl/kairosctl --socket demo-state/control.sock list
#   build/src/ctl/kairosctl --socket demo-state/control.sock show MANDATE
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
demo=${KAIROS_DEMO_DIR:-$PWD/demo-state}
mkdir -p "$demo"
demo=$(cd "$demo" && pwd)

if [ -z "${KAIROSD:-}" ]; then
        # What building needs, not the test tools (tests/run.sh installs those).
        bash "$src/tests/install-deps.sh" --build
        build=${KAIROS_BUILD_DIR:-$src/build}
        if [ ! -f "$build/build.ninja" ]; then
                meson setup "$build" "$src" -Dtests=false
        fi
        ninja -C "$build" src/daemon/kairosd src/ctl/kairosctl
        KAIROSD=$build/src/daemon/kairosd
        ctl=$build/src/ctl/kairosctl
else
        ctl=${KAIROSCTL:-kairosctl}
fi

# The control socket path must fit in sockaddr_un (108 bytes).
if [ ${#demo} -gt 90 ]; then
        echo "demo.sh: $demo is too long a path for the control socket; set KAIROS_DEMO_DIR" >&2
        exit 1
fi

# systemd-style quoting of one word of a command line or Environment= entry.
q() {
        local s=${1//\\/\\\\}
        printf '"%s"' "${s//\"/\\\"}"
}
# One word of a command line: kairosd expands $NAME there, $$ is a literal $.
qc() {
        q "${1//\$/\$\$}"
}

mkdir -p "$demo/schedules.d" "$demo/state" "$demo/outbox"

# The act handler writes its reports through `kairosctl tool write`, which
# kairosd allows within WriteRoots= only.  WriteRoots= is a space-separated
# list: a demo directory with blanks in its path writes directly instead.
ctl_abs=$(command -v "$ctl" || true)
case $ctl_abs in "" | /*) ;; *) ctl_abs=$PWD/$ctl_abs ;; esac
# Writing through kairosctl, the act handler keeps the promise of
# EffectsVia=kairosctl: after a crash in act, kairosd runs it again by itself
# (the write is replayed from the idempotency store, not made twice).
case $demo in
*[[:space:]]*) write_roots="" ctl_abs="" effects_via="" ;;
*) write_roots="WriteRoots=$demo/outbox" effects_via="EffectsVia=kairosctl" ;;
esac

# Rewritten on every start (the state is kept): they follow the checkout.
cat >"$demo/kairosd.conf" <<CONF
# kairos demo configuration, written by config/demo.sh (rewritten on every
# start).  See config/examples/kairosd.conf for every key.
[Daemon]
StateDirectory=$demo/state
ControlSocket=$demo/control.sock
SocketGroup=$(id -gn)
MaxConcurrentMandates=4
GracefulTimeoutSec=10
LogLevel=info

[Idempotency]
# kairosctl tool write may write here (the act handler's reports)
$write_roots
CONF

ex=$src/config/examples
cat >"$demo/schedules.d/demo.conf" <<CONF
# The demo schedule, written by config/demo.sh (rewritten on every start).
# Fire it by hand: kairosctl --socket $demo/control.sock fire demo
# See config/examples/demo.conf for every key.
[Schedule]
Cron=0 6 * * *
TimeZone=UTC

[Mandate]
Goal=write two reports to the outbox
MaxCycles=3

[Exec]
Observe=$(qc "$ex/observe.sh")
Orient=$(qc "$ex/orient.sh")
Decide=$(qc "$ex/decide.sh")
Act=$(qc "$ex/act.sh")
Reflect=$(qc "$ex/reflect.sh")
TimeoutSec=30
Environment=$(q "DEMO_OUTBOX=$demo/outbox") $(q "KAIROSCTL=$ctl_abs")
WorkingDirectory=$demo
# act writes its report only through kairosctl tool write (the default
# Effects=act is the phase that changes the world)
$effects_via
CONF

rel=$demo
case $demo in "$PWD"/*) rel=${demo#"$PWD"/} ;; esac
case $ctl in "$PWD"/*) ctl=${ctl#"$PWD"/} ;; esac
cat >&2 <<MSG
kairos demo: configuration in $demo, reports go to $rel/outbox/
From another terminal in $PWD:
    $ctl --socket $rel/control.sock fire demo
    $ctl --socket $rel/control.sock list
    $ctl --socket $rel/control.sock show MANDATE
Ctrl-C stops the daemon.
MSG

exec "$KAIROSD" -c "$demo/kairosd.conf"
