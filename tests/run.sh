#!/usr/bin/env bash
# The whole test suite, as CI runs it: install what is missing, build twice
# (plain, and AddressSanitizer + UndefinedBehaviorSanitizer with
# -fno-sanitize-recover=all), run every test in both, and print one line
# "N passed, N failed, N skipped".  Exits non-zero if anything failed.
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
cd "$src"

bash tests/install-deps.sh || { echo "dependency installation failed" >&2; exit 1; }

builddir=${KAIROS_BUILD_DIR:-$src/build-test}
mkdir -p "$builddir"
rc=0
logs=()
broken=0   # builds that did not get as far as running their tests

run_suite() {
        local dir=$1; shift
        if [ ! -f "$dir/build.ninja" ]; then
                if ! meson setup "$dir" "$src" "$@" >"$dir.setup.log" 2>&1; then
                        cat "$dir.setup.log" >&2
                        rc=1; broken=$((broken + 1)); return
                fi
        fi
        if ! ninja -C "$dir"; then
                rc=1; broken=$((broken + 1)); return
        fi
        meson test -C "$dir" --print-errorlogs --num-processes 2 || rc=1
        logs+=("$dir/meson-logs/testlog.json")
}

# -Dpostgres=enabled (the default, said so that a missing libpq-dev fails
# here rather than skip cluster mode): the cluster tests (tests/cluster) run
# against a private PostgreSQL.
run_suite "$builddir/plain" -Dtest_hooks=true -Dpostgres=enabled
san='-fno-sanitize-recover=all'
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ASAN_OPTIONS=abort_on_error=1 \
        run_suite "$builddir/asan" -Dtest_hooks=true -Dpostgres=enabled -Db_sanitize=address,undefined -Dc_args="$san" -Dc_link_args="$san"

python3 - "$broken" "${logs[@]}" <<'PY' || rc=1
import json, sys
passed = skipped = 0
failed = int(sys.argv[1])  # a build that failed counts as one failure
for path in sys.argv[2:]:
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        print(f"cannot read {path}: {e}", file=sys.stderr)
        failed += 1
        continue
    for line in lines:
        if not line.strip():
            continue
        r = json.loads(line).get("result")
        if r in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif r == "SKIP":
            skipped += 1
        else:
            failed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
PY
exit $rc
