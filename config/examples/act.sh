#!/bin/sh
# SPDX-License-Identifier: MIT
# Demo act phase: the side effect.  Writes one report into the outbox, named
# after this step's idem key (KAIROS_IDEM_KEY, "/" replaced by "_"), once.
# When kairosd can be reached (KAIROS_CONTROL_SOCKET, and kairosctl as
# $KAIROSCTL or on PATH) the write goes through it: `kairosctl tool write
# --key "$KAIROS_IDEM_KEY"` writes atomically (temporary file, fsync, rename,
# fsync of the directory) within the configured WriteRoots= and at most once
# per key, even if this step runs again after a crash.  Without it (e.g. run
# by hand) the script writes the file itself the same way.  Either way: if the
# report already exists -- this step ran before and is being retried -- it
# does nothing and says so.  KAIROSCTL set but empty: always write directly.
set -eu
doc=$(cat)
action=$(printf '%s' "$doc" | sed -n 's/.*"decide": *{[^}]*"action": *"\([a-z_]*\)".*/\1/p')
if [ "$action" != write_report ]; then
        printf '{"action":"none"}\n'
        exit 0
fi
outbox=${DEMO_OUTBOX:-outbox}
mkdir -p "$outbox"
name=$(printf '%s' "$KAIROS_IDEM_KEY" | tr / _)
file=$outbox/$name
if [ -e "$file" ]; then
        printf '{"already_written":"%s"}\n' "$name"
        exit 0
fi
report=$(printf '{"idem_key":"%s","mandate":"%s","cycle":%s,"fired_at":"%s","written_at":"%s"}' \
        "$KAIROS_IDEM_KEY" "$KAIROS_MANDATE_ID" "$KAIROS_CYCLE" "$KAIROS_FIRED_AT" \
        "$(date -u +%Y-%m-%dT%H:%M:%SZ)")
ctl=${KAIROSCTL-kairosctl}
if [ -n "$ctl" ] && [ -n "${KAIROS_CONTROL_SOCKET:-}" ] && command -v "$ctl" >/dev/null 2>&1; then
        dir=$(cd "$outbox" && pwd)
        out=$(printf '%s\n' "$report" |
                "$ctl" --json tool write --key "$KAIROS_IDEM_KEY" "$dir/$name")
        case $out in
        *'"cached": true'*) printf '{"already_written":"%s"}\n' "$name" ;;
        *) printf '{"wrote":"%s"}\n' "$name" ;;
        esac
        exit 0
fi
tmp=$outbox/.$name.tmp.$$
trap 'rm -f "$tmp"' EXIT
printf '%s\n' "$report" >"$tmp"
sync "$tmp"
mv -f "$tmp" "$file"
sync "$outbox"
printf '{"wrote":"%s"}\n' "$name"
