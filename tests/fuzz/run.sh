#!/bin/sh
# Build a real libFuzzer binary with clang and run it.
#   tests/fuzz/run.sh TARGET [SECONDS] [libFuzzer options...]
#   e.g. tests/fuzz/run.sh canon 600
# TARGET is canon, fold, config, cron, control or conn (tests/fuzz/fuzz_TARGET.c;
# control also builds src/daemon/control_proto.c and links jansson, conn
# builds src/daemon/control.c and control_proto.c and links jansson and
# libuv; a dictionary tests/fuzz/TARGET.dict is used when there is one).  The build
# goes to $FUZZ_BUILD_DIR (default: build-fuzz/ in the source tree).  New inputs are
# collected in $FUZZ_BUILD_DIR/corpus-TARGET (the seed corpus in
# tests/fuzz/corpus/TARGET is read, never written); crashes are written to
# $FUZZ_BUILD_DIR/artifacts-TARGET/.  Exits non-zero if libFuzzer finds a
# crash, a leak or a violated invariant.
set -eu

usage() {
        echo "usage: $0 TARGET [SECONDS] [libFuzzer options...]" >&2
        exit 64
}

[ $# -ge 1 ] || usage
target=$1
shift
secs=60
if [ $# -ge 1 ]; then
        secs=$1
        shift
fi
case $secs in
''|*[!0-9]*) usage ;;
esac

root=$(cd "$(dirname "$0")/../.." && pwd)
src=$root/tests/fuzz/fuzz_$target.c
[ -f "$src" ] || { echo "$0: no fuzz target $src" >&2; exit 64; }
build=${FUZZ_BUILD_DIR:-$root/build-fuzz}
cc=${CC_FUZZ:-clang}
command -v "$cc" >/dev/null 2>&1 || { echo "$0: $cc not found" >&2; exit 77; }

# what a target needs besides src/lib
extra=
pkgs="libsodium zlib jansson"  # jansson: src/lib/showdoc.c
case $target in
control)
        extra="$root/src/daemon/control_proto.c"
        ;;
conn)
        extra="$root/src/daemon/control.c $root/src/daemon/control_proto.c"
        pkgs="$pkgs libuv"
        ;;
esac

mkdir -p "$build/corpus-$target" "$build/artifacts-$target"
bin=$build/fuzz_$target
# shellcheck disable=SC2046,SC2086
"$cc" -std=c17 -g -O1 -D_GNU_SOURCE -fno-omit-frame-pointer \
        -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
        -I"$root/include" -I"$root/src/daemon" \
        "$root"/src/lib/*.c $extra "$src" \
        $(pkg-config --cflags --libs $pkgs) -lm -pthread \
        -o "$bin"

dict=
[ -f "$root/tests/fuzz/$target.dict" ] && dict=-dict=$root/tests/fuzz/$target.dict

echo "$0: running $bin for ${secs}s" >&2
# shellcheck disable=SC2086
exec "$bin" "$build/corpus-$target" "$root/tests/fuzz/corpus/$target" $dict \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$build/artifacts-$target/" -print_final_stats=1 "$@"
