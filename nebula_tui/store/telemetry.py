"""The store's telemetry: one sample per GPU and probe (R18), kept raw for a day, then as
10-minute averages for a month. What accounting makes of it is ``accounting.py``'s.
"""

from __future__ import annotations

from ..wire import TelemetrySample
from .base import StoreBase

#: The seconds a telemetry row stands for when it does not say (rows from before ``span_s``).
DEFAULT_SPAN_S = 30.0
#: What one telemetry row (as ``t``) weighs, in seconds: the span it stands for; an older
#: row without one, its bucket (an average) or the default above.
SAMPLE_WEIGHT_SQL = f"COALESCE(t.span_s, NULLIF(t.bucket_s, 0), {DEFAULT_SPAN_S})"


class Telemetry(StoreBase):
    """The ``telemetry`` table."""

    TELEMETRY_FIELDS = ("temperature_c", "utilization_pct", "memory_used_mb", "power_w",
                        "fan_pct", "sm_clock_mhz", "mem_clock_mhz")

    def record_telemetry(self, rows: list[dict]) -> None:
        """R18: one sample per GPU (``gpu``, ``t``, the TELEMETRY_FIELDS and ``span_s``, the
        seconds the sample stands for: what accounting weighs it by)."""
        if not rows:
            return
        columns = ("gpu", "t", *self.TELEMETRY_FIELDS, "span_s")
        with self.transaction():
            self.db.conn.executemany(
                f"INSERT INTO telemetry ({', '.join(columns)}, bucket_s) "
                f"VALUES ({', '.join('?' * len(columns))}, 0)",
                [tuple(row.get(c) for c in columns) for row in rows])

    def telemetry(self, gpu: str, since: float) -> list[TelemetrySample]:
        columns = ("t", *self.TELEMETRY_FIELDS)
        rows = self.db.execute(
            f"SELECT {', '.join(columns)} FROM telemetry WHERE gpu = ? AND t >= ? ORDER BY t",
            [gpu, since]).fetchall()
        return [dict(zip(columns, r)) for r in rows]

    def compact_telemetry(self, now: float, raw_for_s: float = 86400, keep_for_s: float = 31 * 86400,
                          bucket_s: float = 600) -> None:
        """Retention: raw samples for a day, then 10-minute averages for a month."""
        cutoff = now - raw_for_s
        averages = ", ".join(f"AVG({f})" for f in self.TELEMETRY_FIELDS)
        with self.transaction():
            self.db.execute(
                f"INSERT INTO telemetry (gpu, t, {', '.join(self.TELEMETRY_FIELDS)}, bucket_s, span_s) "
                f"SELECT gpu, CAST(t / ? AS INTEGER) * ? + ? / 2, {averages}, ?, "
                "SUM(COALESCE(span_s, ?)) "
                "FROM telemetry WHERE t < ? AND bucket_s = 0 GROUP BY gpu, CAST(t / ? AS INTEGER)",
                [bucket_s, bucket_s, bucket_s, bucket_s, DEFAULT_SPAN_S, cutoff, bucket_s])
            self.db.execute("DELETE FROM telemetry WHERE t < ? AND bucket_s = 0", [cutoff])
            self.db.execute("DELETE FROM telemetry WHERE t < ?", [now - keep_for_s])
