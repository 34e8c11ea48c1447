# SPDX-License-Identifier: MIT
"""Invariants of cluster mode's tables, checked by SQL over everything in a
database: what any run (the store's tests today, the many-node nemesis test
later) must leave behind.  check(pg, db) returns a list of violations, each
a sentence with the offending rows; empty means all hold.
"""

# (what must hold, a query returning the rows that break it)
INVARIANTS = [
    ("every tick has its mandate, of the same schedule and time",
     "SELECT t.schedule, t.fired_at, t.mandate_id FROM kairos_tick t "
     "LEFT JOIN kairos_mandate m USING (mandate_id) "
     "WHERE m.mandate_id IS NULL OR m.schedule IS DISTINCT FROM t.schedule "
     "OR m.fired_at IS DISTINCT FROM t.fired_at"),
    ("no tick has two mandates (no double fire; its retries aside)",
     "SELECT schedule, fired_at, count(*) FROM kairos_mandate "
     "WHERE fired_at IS NOT NULL AND retry IS NULL GROUP BY schedule, fired_at "
     "HAVING count(*) > 1"),
    ("no tick has two unfinished retries (kairosctl retry is compare-and-set)",
     "SELECT schedule, fired_at, count(*) FROM kairos_mandate "
     "WHERE retry IS NOT NULL AND status IN ('running', 'paused') "
     "GROUP BY schedule, fired_at HAVING count(*) > 1"),
    ("a mandate's rows are numbered 1..last_seq without a gap",
     "SELECT m.mandate_id, m.last_seq, count(w.seq), coalesce(max(w.seq), 0) "
     "FROM kairos_mandate m LEFT JOIN kairos_wal w USING (mandate_id) "
     "GROUP BY m.mandate_id, m.last_seq "
     "HAVING count(w.seq) <> m.last_seq OR coalesce(max(w.seq), 0) <> m.last_seq"),
    ("no row is at an epoch the mandate has not reached",
     "SELECT w.mandate_id, w.seq, w.epoch, m.epoch FROM kairos_wal w "
     "JOIN kairos_mandate m USING (mandate_id) WHERE w.epoch > m.epoch"),
    ("along seq, epochs never go back (no append under an old epoch)",
     "SELECT mandate_id, seq, epoch, before FROM (SELECT mandate_id, seq, epoch, "
     "max(epoch) OVER (PARTITION BY mandate_id ORDER BY seq ROWS BETWEEN UNBOUNDED "
     "PRECEDING AND 1 PRECEDING) AS before FROM kairos_wal) x WHERE epoch < before"),
    ("every row ends in a newline and carries its line's crc",
     "SELECT mandate_id, seq FROM kairos_wal WHERE get_byte(line, length(line) - 1) <> 10 "
     "OR crc IS DISTINCT FROM ('x' || convert_from(substring(line FROM length(line) - 10 "
     "FOR 8), 'UTF8'))::bit(32)::bigint"),
    ("a tool call in progress belongs to its mandate's current epoch",
     "SELECT i.key, i.epoch, m.epoch FROM kairos_idem i JOIN kairos_mandate m "
     "USING (mandate_id) WHERE i.state = 'processing' AND i.epoch <> m.epoch"),
    ("no tool call is at an epoch its mandate has not reached",
     "SELECT i.key, i.epoch, m.epoch FROM kairos_idem i JOIN kairos_mandate m "
     "USING (mandate_id) WHERE i.epoch > m.epoch"),
]

# What rows written by real kairosd nodes must hold besides (the store's
# own tests bump epochs without the daemon's owner records).
DAEMON_INVARIANTS = [
    ("every row is at the epoch of the last owner record at or before it (1 before any): "
     "no node appends under an old epoch",
     "SELECT w.mandate_id, w.seq, w.epoch, x.cur FROM kairos_wal w CROSS JOIN LATERAL "
     "(SELECT coalesce(max(o.epoch), 1) AS cur FROM kairos_wal o WHERE o.mandate_id = "
     "w.mandate_id AND o.seq <= w.seq AND position('{\"op\":\"owner\"' IN "
     "convert_from(o.line, 'UTF8')) = 1) x WHERE w.epoch <> x.cur"),
]


def check(pg, db, daemon=False):
    """daemon: also DAEMON_INVARIANTS (rows written by kairosd nodes)."""
    bad = []
    for what, sql in INVARIANTS + (DAEMON_INVARIANTS if daemon else []):
        rows = pg.psql(db, sql)
        if rows:
            shown = "; ".join(" ".join(r) for r in rows[:5])
            bad.append(f"{what}: {len(rows)} violation(s): {shown}")
    return bad
