"""The live demo event generator behind `rulectl demo`.

A streaming platform is hard to judge when nothing flows through it, and a uniform
random stream never triggers a rule. So the generator produces a *realistic background*
(clicks, views, purchases, API calls, hashtag posts, FX transactions against `fx_rate`
context, sensor readings against `sensor_baseline` context) that the shipped rules in
`rules/` stay quiet on (except `purchase_threshold`, which by design fires on any
purchase of 20 or more), and now and then injects one of the seed-article patterns
that a rule is known to catch:

| pattern          | what it produces                                    | rule that fires        |
|------------------|-----------------------------------------------------|------------------------|
| click_burst      | 12 clicks of a fresh user in 9 s                    | rapid_clicks           |
| purchase_spree   | purchases of 400, 350, 300 by one user in 16 s      | purchase_sum_per_user  |
| fx_off_market    | a transaction 3-6 % away from its pair's rate       | fx_rate_deviation      |
| hot_hashtag      | 8 posts on a fresh hashtag, one by a low-rep bot    | low_reputation_user    |
| api_burst        | 120 API calls in 6 s                                | global_api_burst       |
| sensor_spike     | a reading 8 standard deviations off its baseline    | sensor_zscore          |

Pattern events carry a `scenario` field, so a detection on `events.processed` shows
which injected scenario it came from. Rarely, a line that is not JSON is sent to the
events topic so the dead-letter path has something to show too.

Design choices, and why:
* The stream is a pure function of (seed, rate, settings, start time): `LiveMix` yields
  records on a *logical* clock (offset in seconds from the start), and the pacing loop
  (`produce_records`) only decides *when* to send them. `--seed` therefore gives the
  same records in the same order on every run, and tests can check the patterns against
  the reference evaluator without a broker or a wall clock.
* Timestamps are the logical time (start + offset), which equals "now" whenever the
  producer keeps up; a producer that falls behind keeps the patterns' shape (12 clicks
  in 9 s stay 9 s apart in event time) and reports its lag instead of compressing them.
* Populations scale with the rate (users, hashtags) and the global API call rate is
  capped, so the background never crosses a velocity threshold by itself, whatever
  `--rate` is. Sensor baselines follow a fixed spread and normal readings stay within
  one sigma, so z-scores above 3 only ever come from the injected spike.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TextIO

from spark_jobs.demo.scenarios import demo_history

EVENTS_TOPIC = "events.raw"
CONTEXT_TOPIC = "context.raw"

# Record keys, in priority order: Kafka partitions by key, so all records of one user /
# currency pair / sensor stay in order on one partition (what the keyed rules need).
KEY_FIELDS: tuple[str, ...] = ("user_id", "currency_pair", "sensor_id")

PATTERNS: tuple[str, ...] = (
    "click_burst",
    "purchase_spree",
    "fx_off_market",
    "hot_hashtag",
    "api_burst",
    "sensor_spike",
)
# The rule each pattern is built to trigger (printed when the pattern is injected).
PATTERN_RULES: dict[str, str] = {
    "click_burst": "rapid_clicks",
    "purchase_spree": "purchase_sum_per_user",
    "fx_off_market": "fx_rate_deviation",
    "hot_hashtag": "low_reputation_user",
    "api_burst": "global_api_burst",
    "sensor_spike": "sensor_zscore",
}

FX_PAIRS: dict[str, float] = {
    "EURUSD": 1.085,
    "GBPUSD": 1.268,
    "USDJPY": 151.20,
    "AUDUSD": 0.662,
    "USDCHF": 0.884,
}
PAGES: tuple[str, ...] = ("/home", "/search", "/cart", "/checkout", "/account", "/deals")
ENDPOINTS: tuple[str, ...] = ("/v1/quote", "/v1/orders", "/v1/users/me", "/v1/search", "/v1/rates")
HASHTAG_WORDS: tuple[str, ...] = (
    "music", "news", "travel", "food", "sports", "tech", "movies", "art", "science", "gaming",
    "fashion", "fitness", "books", "pets", "photo", "nature", "finance", "health", "cars", "diy",
)  # fmt: skip
# Sensor baselines follow this fixed pattern (times sigma, plus a little noise): its
# population std is ~0.8 sigma from the 5th point on, so the z-score of a normal reading
# (within one sigma of the mean) never reaches 3, even before the window fills up.
BASELINE_CYCLE: tuple[float, ...] = (-1.2, 0.8, 0.3, -0.6, 1.1, -0.2, 0.5, -0.9)
MALFORMED_LINES: tuple[str, ...] = (
    "this is not json",
    '{"type": "click", "user_id": "u_broken", "page": "/home"',
    "<html><body>502 Bad Gateway</body></html>",
    "type=click user_id=u_legacy page=/home",
)

# Background caps: the global API window of `global_api_burst` is 100 calls in 10 s,
# so background API calls stay at or below 5/s (50 per window) at any --rate.
MAX_BACKGROUND_API_PER_S = 5.0
EVENT_WEIGHTS: dict[str, float] = {
    "click": 0.30,
    "view": 0.20,
    "purchase": 0.10,
    "api_call": 0.12,
    "post": 0.10,
    "transaction": 0.12,
    "sensor_reading": 0.06,
}
FX_TICK_S = 2.0  # each pair's market rate is published every 2 s
SENSOR_TICK_S = 2.0  # each sensor's baseline reading every 2 s
REPUTATION_REFRESH_S = 3600.0  # low_reputation_user looks back one day: hourly is plenty
SENSOR_WARMUP_S = 12.0  # sensor_zscore needs 5 baseline points (min_context_points)


def iso(t: datetime) -> str:
    """ISO-8601 UTC with milliseconds and a `Z`, the format of demo_history()."""
    return t.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def whole_ms(t: datetime) -> datetime:
    """`t` in UTC truncated to the millisecond, the timestamps' resolution.

    Starting the clock on a whole millisecond keeps every offset exact in the ISO
    strings (offsets are multiples of a millisecond), so relative timings survive.
    """
    t = t.astimezone(UTC)
    return t.replace(microsecond=t.microsecond // 1000 * 1000)


def record_key(record: dict[str, Any]) -> str | None:
    """The Kafka key of a record: its user_id, currency_pair or sensor_id, if any."""
    for name in KEY_FIELDS:
        value = record.get(name)
        if value is not None:
            return str(value)
    return None


@dataclass(frozen=True)
class DemoRecord:
    """One record to produce: when (seconds after the start), where, and what.

    `value` is the exact bytes to send (JSON, or a malformed line). `note` is set on the
    first record of an injected pattern, for the console.
    """

    offset: float
    topic: str
    key: str | None
    value: bytes
    kind: str  # "event" | "context" | "malformed"
    note: str | None = None


def _encode(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode("utf-8")


# --------------------------------------------------------------------------- replay


def replay_records(
    start: datetime,
    events_topic: str = EVENTS_TOPIC,
    context_topic: str = CONTEXT_TOPIC,
) -> list[DemoRecord]:
    """demo_history() moved to `start`, as records due at their event-time offsets.

    Each recording keeps its own order: a record is due at its event-time offset, or
    right after the previous record of the same recording when that one is due later.
    That preserves the deliberate arrival-order twist of the history (the GBPUSD rate
    is recorded after the transaction it judges) instead of re-sorting it away.
    """
    start = whole_ms(start)
    events, context = demo_history(start)
    out: list[tuple[float, int, DemoRecord]] = []
    seq = itertools.count()
    for records, topic, kind in ((events, events_topic, "event"), (context, context_topic, "context")):
        due = 0.0
        for rec in records:
            t = datetime.fromisoformat(rec["timestamp"].replace("Z", "+00:00"))
            due = max(due, (t - start).total_seconds())
            out.append((due, next(seq), DemoRecord(due, topic, record_key(rec), _encode(rec), kind)))
    out.sort(key=lambda x: (x[0], x[1]))
    return [r for _, _, r in out]


# --------------------------------------------------------------------------- live mix


@dataclass(order=True)
class _Item:
    offset: float
    seq: int
    payload: Any = field(compare=False)  # DemoRecord, or a zero-arg callable (a timer)


class LiveMix:
    """An endless, deterministic stream of demo records in offset order.

    :param rate: background events per second on the events topic (context records
        and injected patterns come on top).
    :param seed: the random seed; same seed and settings, same records.
    :param start: wall-clock time of offset 0 (timestamps are start + offset).
    :param pattern_every: seconds between injected patterns (0: none).
    :param malformed_every: mean seconds between malformed lines (0: none).
    """

    def __init__(
        self,
        rate: float,
        seed: int | None = None,
        start: datetime | None = None,
        *,
        pattern_every: float = 10.0,
        malformed_every: float = 20.0,
        events_topic: str = EVENTS_TOPIC,
        context_topic: str = CONTEXT_TOPIC,
    ) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = float(rate)
        self.rng = random.Random(seed)
        self.start = whole_ms(start or datetime.now(UTC))
        self.pattern_every = float(pattern_every)
        self.malformed_every = float(malformed_every)
        self.events_topic = events_topic
        self.context_topic = context_topic

        self.users = [f"u_{i:05d}" for i in range(max(100, int(self.rate * 5)))]
        self.hashtags = [
            f"#{HASHTAG_WORDS[i % len(HASHTAG_WORDS)]}{'' if i < len(HASHTAG_WORDS) else i // len(HASHTAG_WORDS)}"
            for i in range(max(30, int(self.rate * 2)))
        ]
        self.fx_rates = dict(FX_PAIRS)
        self.sensors = {
            f"sensor-{i:02d}": (round(self.rng.uniform(15.0, 30.0), 1), round(self.rng.uniform(0.5, 2.0), 2))
            for i in range(1, 9)
        }
        self._sensor_ticks = dict.fromkeys(self.sensors, 0)
        weights = dict(EVENT_WEIGHTS)
        api_share = min(weights["api_call"], MAX_BACKGROUND_API_PER_S / self.rate)
        weights["view"] += weights["api_call"] - api_share
        weights["api_call"] = api_share
        self._kinds = list(weights)
        self._cum_weights = list(itertools.accumulate(weights[k] for k in self._kinds))
        self._counter = itertools.count(1)  # ids for orders, posts, transactions, ...
        self._pattern_no = itertools.count(1)
        self._pattern_round = 0
        self._pattern_cycle: list[str] = []
        self._heap: list[_Item] = []
        self._seq = itertools.count()

    # -- scheduling ------------------------------------------------------------------
    def _push(self, offset: float, payload: Any) -> None:
        heapq.heappush(self._heap, _Item(offset, next(self._seq), payload))

    def _emit(
        self, offset: float, topic: str, record: dict[str, Any], kind: str, note: str | None = None
    ) -> None:
        stamped = {**record, "timestamp": iso(self.start + timedelta(seconds=offset))}
        self._push(offset, DemoRecord(offset, topic, record_key(stamped), _encode(stamped), kind, note))

    def _event(self, offset: float, record: dict[str, Any], note: str | None = None) -> None:
        self._emit(offset, self.events_topic, record, "event", note)

    def _context(self, offset: float, record: dict[str, Any]) -> None:
        self._emit(offset, self.context_topic, record, "context")

    def _timer(self, offset: float, fn: Callable[[float], None]) -> None:
        self._push(offset, lambda: fn(offset))

    def __iter__(self) -> Iterator[DemoRecord]:
        self._timer(0.0, self._tick_reputations)
        # Every pair has a rate from the first instant: a transaction that finds no rate
        # would be held by fx_rate_deviation for the whole lookback.
        for pair in self.fx_rates:
            self._timer(0.0, self._make_fx_tick(pair))
        for i, sensor in enumerate(self.sensors):
            self._timer(i * SENSOR_TICK_S / len(self.sensors), self._make_sensor_tick(sensor))
        self._timer(0.0, self._background(0))
        if self.pattern_every > 0:
            self._timer(min(5.0, self.pattern_every), self._tick_pattern)
        if self.malformed_every > 0:
            self._timer(self.rng.expovariate(1.0 / self.malformed_every), self._tick_malformed)
        while self._heap:
            item = heapq.heappop(self._heap)
            if isinstance(item.payload, DemoRecord):
                yield item.payload
            else:
                item.payload()

    # -- background --------------------------------------------------------------------
    def _background(self, index: int) -> Callable[[float], None]:
        def tick(offset: float) -> None:
            kind = self._kinds[self._pick()]
            self._event(offset, self._background_event(kind))
            # The next event's offset is computed from its index, so rounding never drifts.
            self._timer((index + 1) / self.rate, self._background(index + 1))

        return tick

    def _pick(self) -> int:
        x = self.rng.random() * self._cum_weights[-1]
        for i, bound in enumerate(self._cum_weights):
            if x < bound:
                return i
        return len(self._cum_weights) - 1

    def _background_event(self, kind: str) -> dict[str, Any]:
        rng = self.rng
        user = rng.choice(self.users)
        n = next(self._counter)
        if kind == "click":
            return {"type": "click", "user_id": user, "page": rng.choice(PAGES)}
        if kind == "view":
            return {
                "type": "view",
                "user_id": user,
                "page": f"/p/{rng.randint(1, 500)}",
                "duration_ms": rng.randint(200, 60_000),
            }
        if kind == "purchase":
            # Median ~7, about one in ten at 20 or more (purchase_threshold fires on those).
            value = min(500.0, round(math.exp(rng.gauss(2.0, 0.8)), 2))
            return {"type": "purchase", "user_id": user, "value": value, "order_id": f"o-{n}"}
        if kind == "api_call":
            return {
                "type": "api_call",
                "user_id": user,
                "endpoint": rng.choice(ENDPOINTS),
                "status": rng.choices((200, 201, 404, 500), weights=(90, 5, 4, 1))[0],
                "latency_ms": rng.randint(5, 400),
            }
        if kind == "post":
            return {
                "type": "post",
                "user_id": user,
                "hashtag": rng.choice(self.hashtags),
                "post_id": f"p-{n}",
            }
        if kind == "transaction":
            pair = rng.choice(list(self.fx_rates))
            implied = self.fx_rates[pair] * (1 + rng.uniform(-0.008, 0.008))
            return {
                "type": "transaction",
                "currency_pair": pair,
                "implied_rate": round(implied, 5),
                "amount": rng.randint(50, 20_000),
                "tx_id": f"fx-{n}",
            }
        sensor = rng.choice(list(self.sensors))
        mean, sigma = self.sensors[sensor]
        return {
            "type": "sensor_reading",
            "sensor_id": sensor,
            "reading": round(mean + sigma * rng.uniform(-1.0, 1.0), 3),
            "reading_id": f"r-{n}",
        }

    # -- context -------------------------------------------------------------------------
    def _tick_reputations(self, offset: float) -> None:
        """Every user gets a (good) reputation, so hot hashtags find their posters' context."""
        for user in self.users:
            self._context(
                offset,
                {
                    "type": "user_reputation",
                    "user_id": user,
                    "reputation": round(self.rng.uniform(0.5, 1.0), 2),
                },
            )
        self._timer(offset + REPUTATION_REFRESH_S, self._tick_reputations)

    def _make_fx_tick(self, pair: str) -> Callable[[float], None]:
        base = FX_PAIRS[pair]

        def tick(offset: float) -> None:
            # A small mean-reverting walk: the rate moves, but never far from its base.
            rate = self.fx_rates[pair]
            rate += 0.1 * (base - rate) + base * self.rng.gauss(0.0, 0.0003)
            self.fx_rates[pair] = rate
            self._context(offset, {"type": "fx_rate", "currency_pair": pair, "rate": round(rate, 5)})
            self._timer(offset + FX_TICK_S, tick)

        return tick

    def _make_sensor_tick(self, sensor: str) -> Callable[[float], None]:
        mean, sigma = self.sensors[sensor]

        def tick(offset: float) -> None:
            k = self._sensor_ticks[sensor]
            self._sensor_ticks[sensor] = k + 1
            deviation = BASELINE_CYCLE[k % len(BASELINE_CYCLE)] + self.rng.gauss(0.0, 0.1)
            reading = round(mean + sigma * deviation, 3)
            self._context(offset, {"type": "sensor_baseline", "sensor_id": sensor, "reading": reading})
            self._timer(offset + SENSOR_TICK_S, tick)

        return tick

    # -- malformed -------------------------------------------------------------------------
    def _tick_malformed(self, offset: float) -> None:
        line = self.rng.choice(MALFORMED_LINES)
        self._push(offset, DemoRecord(offset, self.events_topic, None, line.encode("utf-8"), "malformed"))
        self._timer(offset + self.rng.expovariate(1.0 / self.malformed_every), self._tick_malformed)

    # -- patterns --------------------------------------------------------------------------
    def _tick_pattern(self, offset: float) -> None:
        if not self._pattern_cycle:
            # The first round shows every pattern in a fixed order (the sensor spike last,
            # once baselines exist); later rounds are shuffled.
            self._pattern_cycle = list(PATTERNS)
            if self._pattern_round > 0:
                self.rng.shuffle(self._pattern_cycle)
            self._pattern_round += 1
        name = self._pattern_cycle.pop(0)
        getattr(self, f"_pattern_{name}")(offset, next(self._pattern_no))
        self._timer(offset + self.pattern_every, self._tick_pattern)

    def _note(self, name: str, detail: str) -> str:
        return f"pattern {name}: {detail} (expect {PATTERN_RULES[name]})"

    def _pattern_click_burst(self, t: float, k: int) -> None:
        user = f"u_burst_{k}"
        for i in range(12):
            note = self._note("click_burst", f"{user} clicks 12 times in 9 s") if i == 0 else None
            self._event(
                t + i * 0.75,
                {"type": "click", "user_id": user, "page": f"/p/{i}", "scenario": "click_burst"},
                note,
            )

    def _pattern_purchase_spree(self, t: float, k: int) -> None:
        user = f"u_spree_{k}"
        for i, value in enumerate((400, 350, 300)):
            note = self._note("purchase_spree", f"{user} spends 1050 in 16 s") if i == 0 else None
            record = {
                "type": "purchase",
                "user_id": user,
                "value": value,
                "order_id": f"spree-{k}-{i}",
                "scenario": "purchase_spree",
            }
            self._event(t + i * 8.0, record, note)

    def _pattern_fx_off_market(self, t: float, k: int) -> None:
        pair = self.rng.choice(list(self.fx_rates))
        off = self.rng.uniform(0.03, 0.06) * self.rng.choice((-1, 1))
        record = {
            "type": "transaction",
            "currency_pair": pair,
            "implied_rate": round(self.fx_rates[pair] * (1 + off), 5),
            "amount": self.rng.randint(5_000, 50_000),
            "tx_id": f"fx-off-{k}",
            "scenario": "fx_off_market",
        }
        self._event(t, record, self._note("fx_off_market", f"{pair} transaction {off:+.1%} off market"))

    def _pattern_hot_hashtag(self, t: float, k: int) -> None:
        tag = f"#trend_{k}"
        bot = f"u_bot_{k}"
        self._context(
            t,
            {"type": "user_reputation", "user_id": bot, "reputation": round(self.rng.uniform(0.05, 0.35), 2)},
        )
        posters = self.rng.sample(self.users, 7)
        posters.insert(5, bot)  # the 6th post: the hashtag is hot (5+ posts in 30 s) by then
        for i, user in enumerate(posters):
            note = (
                self._note("hot_hashtag", f"{bot} (low reputation) joins 7 posts on {tag}")
                if i == 0
                else None
            )
            record = {
                "type": "post",
                "user_id": user,
                "hashtag": tag,
                "post_id": f"trend-{k}-{i}",
                "scenario": "hot_hashtag",
            }
            self._event(t + 0.1 + i * 2.5, record, note)

    def _pattern_api_burst(self, t: float, k: int) -> None:
        for i in range(120):
            note = self._note("api_burst", "120 API calls in 6 s") if i == 0 else None
            record = {
                "type": "api_call",
                "user_id": f"u_api_{k}_{i % 7}",
                "endpoint": "/v1/quote",
                "status": 200,
                "latency_ms": self.rng.randint(5, 50),
                "scenario": "api_burst",
            }
            self._event(t + i * 0.05, record, note)

    def _pattern_sensor_spike(self, t: float, k: int) -> None:
        sensor = self.rng.choice(list(self.sensors))
        mean, sigma = self.sensors[sensor]
        at = max(t, SENSOR_WARMUP_S)
        record = {
            "type": "sensor_reading",
            "sensor_id": sensor,
            "reading": round(mean + 8 * sigma, 3),
            "reading_id": f"spike-{k}",
            "scenario": "sensor_spike",
        }
        self._event(at, record, self._note("sensor_spike", f"{sensor} reads 8 sigma above its baseline"))


# --------------------------------------------------------------------------- producing


class RecordSink(Protocol):
    """Where records go: a confluent_kafka Producer wrapper, or a list in tests."""

    def send(self, record: DemoRecord) -> None: ...
    def poll(self) -> None: ...
    def flush(self, timeout: float) -> int: ...


class KafkaSink:
    """Sends DemoRecords with a confluent_kafka Producer and counts delivery errors.

    The producer is idempotent, so a retried send can neither duplicate nor reorder a
    key's records (the keyed velocity rules depend on per-key order).
    """

    def __init__(self, bootstrap: str, extra: dict[str, Any] | None = None, role: str | None = None) -> None:
        from confluent_kafka import Producer

        from spark_jobs.kafka.client_config import with_bootstrap

        conf: dict[str, Any] = {
            **with_bootstrap(bootstrap, role),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 20,
            "client.id": "rulectl-demo",
        }
        conf.update(extra or {})
        self._producer = Producer(conf)
        self.errors = 0
        self.last_error: str | None = None

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors += 1
            self.last_error = str(err)

    def send(self, record: DemoRecord) -> None:
        key = record.key.encode("utf-8") if record.key is not None else None
        while True:
            try:
                self._producer.produce(
                    record.topic, key=key, value=record.value, on_delivery=self._on_delivery
                )
                return
            except BufferError:  # local queue full: let deliveries drain, then retry
                self._producer.poll(0.1)

    def poll(self) -> None:
        self._producer.poll(0)

    def flush(self, timeout: float) -> int:
        return int(self._producer.flush(timeout))


@dataclass
class ProduceStats:
    """What a run produced, per kind, and how far behind schedule it fell at worst."""

    events: int = 0
    context: int = 0
    malformed: int = 0
    patterns: int = 0
    max_lag_s: float = 0.0
    elapsed_s: float = 0.0

    @property
    def total(self) -> int:
        return self.events + self.context + self.malformed

    def add(self, record: DemoRecord) -> None:
        if record.kind == "event":
            self.events += 1
        elif record.kind == "context":
            self.context += 1
        else:
            self.malformed += 1
        if record.note:
            self.patterns += 1

    def summary(self) -> str:
        return (
            f"{self.events} events, {self.context} context, {self.malformed} malformed, "
            f"{self.patterns} patterns in {self.elapsed_s:.1f}s"
        )


def produce_records(
    records: Iterable[DemoRecord],
    sink: RecordSink,
    *,
    pace: bool = True,
    until: float | None = None,
    stop: threading.Event | None = None,
    out: TextIO | None = None,
    report_every: float = 30.0,
    clock: Callable[[], float] = time.monotonic,
) -> ProduceStats:
    """Send `records` to `sink`, each at its offset after now (or at once without `pace`).

    Stops at the first record due at or after `until` seconds, or when `stop` is set
    (Ctrl-C / SIGTERM), so a stopped demo still leaves whole patterns up to that point.
    Pattern notes and a periodic progress line go to `out` (None: silent).
    """
    stop = stop or threading.Event()
    stats = ProduceStats()
    t0 = clock()
    next_report = report_every
    warned_lag_at = -math.inf
    for record in records:
        if stop.is_set() or (until is not None and record.offset >= until):
            break
        if pace:
            delay = t0 + record.offset - clock()
            if delay > 0.002:
                sink.poll()
                if stop.wait(delay):
                    break
            elif -delay > stats.max_lag_s:
                stats.max_lag_s = -delay
        sink.send(record)
        stats.add(record)
        if out is not None:
            now = clock() - t0
            if record.note:
                print(f"[{now:7.1f}s] {record.note}", file=out, flush=True)
            if now >= next_report:
                print(f"[{now:7.1f}s] produced {stats.summary()}", file=out, flush=True)
                next_report = now + report_every
            if pace and stats.max_lag_s > 2.0 and now - warned_lag_at > report_every:
                print(
                    f"[{now:7.1f}s] WARNING: {stats.max_lag_s:.1f}s behind schedule (--rate too high?)",
                    file=out,
                    flush=True,
                )
                warned_lag_at = now
        if stats.total % 1000 == 0:
            sink.poll()
    stats.elapsed_s = clock() - t0
    return stats
