#!/bin/sh
# SPDX-License-Identifier: MIT
# Demo act phase: the side effect.  Writes one report into the outbox, named
# after this step's idem key (KAIROS_IDEM_KEY, "/" replaced by "_"), atomically
# (temporary file, fsync, rename).  Idempotent by key: if the report already
# exists -- this step ran before the daemon crashed and is being retried --
# it does nothing and says so.
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
tmp=$outbox/.$name.tmp.$$
trap 'rm -f "$tmp"' EXIT
printf '{"idem_key":"%s","mandate":"%s","cycle":%s,"fired_at":"%s","written_at":"%s"}\n' \
        "$KAIROS_IDEM_KEY" "$KAIROS_MANDATE_ID" "$KAIROS_CYCLE" "$KAIROS_FIRED_AT" \
        "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$tmp"
sync "$tmp"
mv -f "$tmp" "$file"
sync "$outbox"
printf '{"wrote":"%s"}\n' "$name"
