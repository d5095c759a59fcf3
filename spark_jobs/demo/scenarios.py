"""The demo event history: one scenario per seed-article example, with known outcomes.

Used three ways: checked in as tests/data/demo/*.jsonl (the backtest's demo input and
the acceptance tests' fixture), replayed by the live demo generator, and as the
expected outcomes the tests assert (EXPECTED).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

DEMO_START = datetime(2026, 1, 5, 12, 0, 0, tzinfo=UTC)


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def demo_history(start: datetime = DEMO_START) -> tuple[list[dict], list[dict]]:
    """(events.raw records, context.raw records), each in event-time order per key."""
    ev: list[tuple[datetime, dict]] = []
    ctx: list[tuple[datetime, dict]] = []

    def at(seconds: float) -> datetime:
        return start + timedelta(seconds=seconds)

    # Threshold (seed part 1): only the first of these matches purchase_threshold.
    ev.append((at(1), {"type": "purchase", "value": 25, "user_id": "u_buyer", "order_id": "o-1"}))
    ev.append((at(2), {"type": "purchase", "value": 10, "user_id": "u_buyer", "order_id": "o-2"}))
    ev.append((at(3), {"type": "view", "value": 100, "user_id": "u_buyer"}))

    # Velocity (seed part 2): 12 clicks in 10 s from one user -> one detection, the 10th.
    for i in range(12):
        ev.append((at(10 + i * 0.8), {"type": "click", "user_id": "u_clicker", "page": f"/p/{i}", "n": i + 1}))
    # ...and a calm user: 5 clicks, no detection.
    for i in range(5):
        ev.append((at(10 + i * 2), {"type": "click", "user_id": "u_calm", "page": "/home", "n": i + 1}))

    # Global burst: 120 API calls in 6 s across users -> one detection at the 100th.
    for i in range(120):
        ev.append((at(30 + i * 0.05), {"type": "api_call", "user_id": f"u_api_{i % 7}", "endpoint": "/v1/quote", "n": i + 1}))

    # Purchase sum per user: 400 + 350 + 300 within a minute crosses 1000 at the third.
    for i, value in enumerate((400, 350, 300)):
        ev.append((at(40 + i * 10), {"type": "purchase", "value": value, "user_id": "u_spender", "order_id": f"s-{i}"}))

    # FX (seed part 3): market rate 1.10; 4% off is flagged, 1% is not.
    ctx.append((at(50), {"type": "fx_rate", "currency_pair": "EURUSD", "rate": 1.10}))
    ev.append((at(55), {"type": "transaction", "currency_pair": "EURUSD", "implied_rate": 1.144, "amount": 5000, "tx_id": "fx-4pct"}))
    ev.append((at(56), {"type": "transaction", "currency_pair": "EURUSD", "implied_rate": 1.111, "amount": 700, "tx_id": "fx-1pct"}))
    # A transaction that arrives before its pair's rate: held, then judged (flagged, 5%).
    ev.append((at(58), {"type": "transaction", "currency_pair": "GBPUSD", "implied_rate": 1.323, "amount": 900, "tx_id": "fx-early"}))
    ctx.append((at(57), {"type": "fx_rate", "currency_pair": "GBPUSD", "rate": 1.26}))

    # AstroTurf: reputations first, then 8 posts on one hashtag in 20 s.
    ctx.append((at(60), {"type": "user_reputation", "user_id": "user_003", "reputation": 0.28}))
    ctx.append((at(60), {"type": "user_reputation", "user_id": "user_007", "reputation": 0.9}))
    ctx.append((at(60), {"type": "user_reputation", "user_id": "user_011", "reputation": 0.75}))
    posters = ["user_011", "user_007", "user_011", "user_007", "user_011", "user_003", "user_007", "user_011"]
    for i, user in enumerate(posters):
        ev.append((at(70 + i * 2.5), {"type": "post", "hashtag": "#crypto_viral", "user_id": user, "post_id": f"p-{i}"}))

    # Sensor z-score: ten baseline readings around 20, then 30.0 (flagged) and 20.5 (not).
    for i, reading in enumerate((19.0, 21.0, 20.0, 19.5, 20.5, 20.0, 19.0, 21.0, 20.5, 19.5)):
        ctx.append((at(100 + i * 10), {"type": "sensor_baseline", "sensor_id": "s-1", "reading": reading}))
    ev.append((at(205), {"type": "sensor_reading", "sensor_id": "s-1", "reading": 30.0, "reading_id": "r-hot"}))
    ev.append((at(206), {"type": "sensor_reading", "sensor_id": "s-1", "reading": 20.5, "reading_id": "r-ok"}))

    def finish(items: list[tuple[datetime, dict]]) -> list[dict]:
        items = sorted(items, key=lambda x: x[0])
        return [{**rec, "timestamp": _iso(t)} for t, rec in items]

    events = finish(ev)
    context = finish(ctx)
    # The early GBPUSD transaction is *produced* before its rate on purpose: move the
    # rate record to the end of the context recording (arrival order != event time).
    gbp = next(c for c in context if c.get("currency_pair") == "GBPUSD")
    context.remove(gbp)
    context.append(gbp)
    return events, context


# What the demo history must produce (the acceptance tests hold the engine to this).
EXPECTED = {
    "purchase_threshold": ["o-1", "s-0", "s-1", "s-2"],  # order_id of matching purchases
    "rapid_clicks": [10],  # the n of the emitting click
    "global_api_burst": [100],
    "purchase_sum_per_user": ["s-2"],
    "fx_rate_deviation": ["fx-4pct", "fx-early"],
    "low_reputation_user": ["p-5"],  # user_003's post once the hashtag is hot
    "sensor_zscore": ["r-hot"],
}

MALFORMED_LINES = ["this is not json", '{"type": "click", "user_id": "u_broken"']


def write_demo(directory: Path, start: datetime = DEMO_START, malformed: bool = True) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    events, context = demo_history(start)
    lines = [json.dumps(e, separators=(",", ":")) for e in events]
    if malformed:
        lines[5:5] = MALFORMED_LINES[:1]
        lines.append(MALFORMED_LINES[1])
    paths = {"events.raw": directory / "events.raw.jsonl", "context.raw": directory / "context.raw.jsonl"}
    paths["events.raw"].write_text("\n".join(lines) + "\n")
    paths["context.raw"].write_text("\n".join(json.dumps(c, separators=(",", ":")) for c in context) + "\n")
    return paths


if __name__ == "__main__":
    write_demo(Path("tests/data/demo"))
