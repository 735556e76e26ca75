"""A controller's Prometheus metrics (docs/observability.md): its calls, its journal, its
leadership and takeovers, and the supervision events it journals.

A `ControllerMetrics` is made by a Session given an address (`Session(metrics=...)` or
$REGENT_METRICS_ADDR) before it campaigns, so a standby serves its metrics while it waits.
The session's parts report to it through small typed calls (a call issued, a call done, a
commit, a supervision event, a takeover); gauges are read at scrape time. It reads and
counts only: it never writes the journal, takes a lease or messages a worker (invariant 16).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterator
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from regent.worker.metrics import MetricsServer, serve_metrics

log = structlog.get_logger("regent.metrics")

# A call's latency: from a few hundred microseconds (a no-op on one host) to minutes (a step).
CALL_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                30, 60, 300)
COMMIT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TAKEOVER_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)

# Calls whose seq is a multiple of this are timed (the latency histogram is a sample of the calls,
# taken by seq, so whatever their order): timing every call cost a pipelined burst a few percent.
LATENCY_SAMPLE = 8
# How a failure's reason text maps to a bounded label (the text itself names pids and hosts).
FAILURE_CAUSES = ("host_lost", "proc_died", "actor_failed", "actor_exited", "missing")


class ControllerMetrics:
    """The metrics of one controller process; `serve(address)` exposes them."""

    def __init__(self, session: str) -> None:
        self.session = session
        self.registry = reg = CollectorRegistry()
        ProcessCollector(registry=reg)
        self._calls = _CallStats()  # on every call's path: plain counts, made metrics at scrape time
        reg.register(self._calls)
        self.appends = Counter("regent_journal_appends", "Fenced appends to the journal (each a batch of "
                               "records)", registry=reg)
        self.records = Counter("regent_journal_records", "Records appended to the journal", registry=reg)
        self.commit_seconds = Histogram("regent_journal_commit_duration_seconds", "Time one fenced append "
                                        "takes to be durable", buckets=COMMIT_BUCKETS, registry=reg)
        self.batch_records = Histogram("regent_journal_batch_records", "Records per fenced append",
                                       buckets=BATCH_BUCKETS, registry=reg)
        self.durable_lag = Gauge("regent_journal_durable_lag_records", "Records appended but not yet "
                                 "durable in the journal", registry=reg)
        self.leader = Gauge("regent_leader", "1 while this controller leads its session, 0 while it "
                            "stands by", registry=reg)
        self.epoch = Gauge("regent_leader_epoch", "The epoch of the session's leader as this controller "
                           "knows it (its own once it leads)", registry=reg)
        self.standby_lag = Gauge("regent_standby_lag_records", "Journal records a standby would replay if it "
                                 "took over now (0 once it leads)", registry=reg)
        self.replay_remaining = Gauge("regent_replay_remaining_calls", "Journaled calls this controller has "
                                      "still to replay after taking over (0 once live)", registry=reg)
        self.takeovers = Counter("regent_takeovers", "Sessions this controller took over from a primary "
                                 "(counted once, by the new leader)", registry=reg)
        self.takeover_seconds = Histogram("regent_takeover_duration_seconds", "From winning leadership to "
                                          "running live (reading, fencing and replaying)",
                                          buckets=TAKEOVER_BUCKETS, registry=reg)
        self.failures = Counter("regent_actor_failures", "Failures of supervised actors, by mesh and cause",
                                ["mesh", "cause"], registry=reg)
        self.restarts = Counter("regent_restarts", "Actors restarted by their mesh's policy, by mesh and "
                                "the cause of the failure restarted", ["mesh", "reason"], registry=reg)
        self.escalations = Counter("regent_escalations", "Supervision escalated to the program, by mesh",
                                   ["mesh"], registry=reg)
        self.host_events = Counter("regent_host_events", "Cluster hosts lost, back, restarted or replaced "
                                   "by a spare, by cluster", ["cluster", "event"], registry=reg)
        self.hosts = Gauge("regent_hosts", "Hosts this controller's session uses, by state", ["state"],
                           registry=reg)
        self._causes: dict[str, str] = {}  # mesh -> the cause of its latest failure
        self._server: MetricsServer | None = None
        self._resends: _Resends | None = None
        self.leader.set(0)
        for state in ("up", "lost"):
            self.hosts.labels(state).set(0)

    # --- serving -------------------------------------------------------------------------

    def serve(self, address: str | None) -> bool:
        """Serve /metrics at `address` (None: $REGENT_METRICS_ADDR). False when off."""
        self._server = serve_metrics(self.registry, address, f"controller of session {self.session!r}")
        return self._server is not None

    @property
    def url(self) -> str | None:
        return None if self._server is None else self._server.url

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    # --- what the session's parts report -------------------------------------------------

    def standing_by(self, journal: Any) -> None:
        """This controller waits for the session's leader: its lag is what it would replay, and
        the epoch the leader's, both read from the store (once per scrape)."""
        session = self.session
        seen: list[Any] = [None, 0.0]  # the store's summary of the session, and when it was read

        def info() -> Any:
            if time.monotonic() - seen[1] > 0.5:
                try:
                    seen[0] = journal.session_info(session)
                except Exception:  # noqa: BLE001 - the store is down or closing: no figure this scrape
                    seen[0] = None
                seen[1] = time.monotonic()
            return seen[0]

        def lag() -> float:
            i = info()
            return float("nan") if i is None else 0 if i.last_lsn is None else i.last_lsn + 1

        def epoch() -> float:
            i = info()
            return float("nan") if i is None or i.epoch is None else i.epoch

        self.epoch.set_function(epoch)
        self.standby_lag.set_function(lag)

    def leading(self, epoch: int, writer: Any, replay_remaining: Callable[[], int]) -> None:
        """This controller won leadership at `epoch`; `writer` is its journal writer."""
        self.leader.set(1)
        self.epoch.set_function(lambda: epoch)
        self.standby_lag.set_function(lambda: 0)
        self.durable_lag.set_function(lambda: max(0, writer.next_lsn - 1 - writer.durable_lsn))
        self.replay_remaining.set_function(replay_remaining)

    def resigned(self) -> None:
        self.leader.set(0)

    def took_over(self, seconds: float) -> None:
        self.takeovers.inc()
        self.takeover_seconds.observe(seconds)

    def call_issued(self, seq: int, kind: str, mesh: str, endpoint: str) -> None:
        """Live call `seq` is about to leave (the session's driver calls this, one thread at a time).
        Every call is counted; one in LATENCY_SAMPLE is timed."""
        stats, key = self._calls, (kind, mesh, endpoint)
        stats.issued[key] = stats.issued.get(key, 0) + 1
        if not seq % LATENCY_SAMPLE:
            stats.pending[seq] = (kind, time.monotonic())

    def call_done(self, seq: int) -> None:
        """Call `seq` has every outcome (the driver, as above); a replayed call was never issued here."""
        if seq % LATENCY_SAMPLE:
            return
        began = self._calls.pending.pop(seq, None)
        if began is None:
            return
        kind, t0 = began
        h = self._calls.durations.get(kind)
        if h is None:
            h = self._calls.durations[kind] = [0] * (len(CALL_BUCKETS) + 1) + [0.0]
        seconds = time.monotonic() - t0
        h[bisect.bisect_left(CALL_BUCKETS, seconds)] += 1
        h[-1] += seconds

    def committed(self, records: int, seconds: float) -> None:
        """One fenced append of `records` records took `seconds` (the journal writer's thread)."""
        self.appends.inc()
        self.records.inc(records)
        self.batch_records.observe(records)
        self.commit_seconds.observe(seconds)

    def supervision(self, entry: dict) -> None:
        """A supervision event this controller journaled (controller/supervisor.py's entries)."""
        ev = entry.get("ev")
        mesh = str(entry.get("mesh", ""))
        if ev == "failure":
            cause = entry.get("cause") if entry.get("cause") in FAILURE_CAUSES else "actor_failed"
            self._causes[mesh] = cause
            self.failures.labels(mesh, cause).inc()
        elif ev == "restart":
            self.restarts.labels(mesh, self._causes.get(mesh, "reshaped")).inc(len(entry.get("ranks") or [1]))
        elif ev == "escalation":
            self.escalations.labels(mesh).inc()
        elif ev in ("host_lost", "host_back", "host_restarted", "host_replaced"):
            self.host_events.labels(str(entry.get("cluster", "")), ev.removeprefix("host_")).inc()

    def host_counts(self, up: Callable[[], int], lost: Callable[[], int]) -> None:
        self.hosts.labels("up").set_function(up)
        self.hosts.labels("lost").set_function(lost)

    def resends(self, counts: dict[str, int]) -> None:
        """The runtime's resend counts (controller/_links.py), read at each scrape."""
        if self._resends is None:
            self._resends = _Resends(counts)
            self.registry.register(self._resends)
        self._resends.counts = counts


class _Resends(Collector):
    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Any]:
        family = CounterMetricFamily("regent_resends", "Calls sent again to a proc under the same id, by "
                                     "reason: link (its link broke and came back), overdue (unanswered for its "
                                     "wait by a proc that answered nothing since); deferred: overdue calls not "
                                     "sent again because their proc was answering others", labels=["reason"])
        for reason, n in sorted(dict(self.counts).items()):
            family.add_metric([reason], n)
        yield family


class _CallStats(Collector):
    """Calls issued and their latencies as plain counts: a prometheus-client Counter or
    Histogram takes a lock and walks its buckets in Python on each update, a few percent of a
    pipelined call (bench/bench_metrics.py); here an update is a dict or list increment by the
    driver that holds the session's drive, and the scrape builds the metrics from a copy."""

    def __init__(self) -> None:
        self.issued: dict[tuple[str, str, str], int] = {}
        self.pending: dict[int, tuple[str, float]] = {}  # seq -> (kind, when it left), until it is done
        # kind -> counts per bucket of CALL_BUCKETS (and one past the last), then the sum of seconds
        self.durations: dict[str, list] = {}

    def collect(self) -> Iterator[Any]:
        calls = CounterMetricFamily("regent_calls", "Calls this controller issued live (not replayed), by "
                                    "kind (call, call_one, choose, stream, broadcast...), mesh and endpoint",
                                    labels=["kind", "mesh", "endpoint"])
        for key, n in sorted(dict(self.issued).items()):
            calls.add_metric(list(key), n)
        yield calls
        latency = HistogramMetricFamily("regent_call_duration_seconds", "From a live call's send to its last "
                                        f"point's outcome, by kind: one call in {LATENCY_SAMPLE}, by seq",
                                        labels=["kind"])
        for kind, h in sorted(dict(self.durations).items()):
            h = list(h)
            cumulative, buckets = 0, []
            for bound, n in zip([*map(floatToGoString, CALL_BUCKETS), "+Inf"], h[:-1], strict=True):
                cumulative += n
                buckets.append((bound, cumulative))
            latency.add_metric([kind], buckets, sum_value=h[-1])
        yield latency
