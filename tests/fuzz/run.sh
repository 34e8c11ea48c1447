#!/bin/sh
# Build a real libFuzzer binary with clang and run it.
#   tests/fuzz/run.sh TARGET [SECONDS] [libFuzzer options...]
#   e.g. tests/fuzz/run.sh canon 600
# TARGET is canon or fold (tests/fuzz/fuzz_TARGET.c).  The build goes to
# $FUZZ_BUILD_DIR (default: build-fuzz/ in the source tree).  New inputs are
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

mkdir -p "$build/corpus-$target" "$build/artifacts-$target"
bin=$build/fuzz_$target
# shellcheck disable=SC2046
"$cc" -std=c17 -g -O1 -D_GNU_SOURCE -fno-omit-frame-pointer \
        -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
        -I"$root/include" \
        "$root"/src/lib/*.c "$src" \
        $(pkg-config --cflags --libs libsodium zlib) -lm -pthread \
        -o "$bin"

echo "$0: running $bin for ${secs}s" >&2
exec "$bin" "$build/corpus-$target" "$root/tests/fuzz/corpus/$target" \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$build/artifacts-$target/" -print_final_stats=1 "$@"
