"""Journal throughput and latency on both backends; prints one JSON document.

Append throughput goes through GroupCommitWriter (the controller's path); durable latency is
one single-record `Leadership.append` at a time; read throughput is `Journal.read`, decode and
checksum included (the replay path, target >= 100,000 records/s).

    .venv/bin/python bench/bench_journal.py [--records N] [--latency-samples N]
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import structlog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from regent.journal import GroupCommitWriter, Journal, open_journal  # noqa: E402
from tests.support.etcd import EtcdServer, etcd_available  # noqa: E402


def append_throughput(journal: Journal, session: str, payload: int, records: int) -> dict:
    lead = journal.campaign(session, "bench")
    data = {"b": b"x" * payload}
    with GroupCommitWriter(lead) as writer:
        started = time.perf_counter()
        for _ in range(records):
            writer.submit("call", data)
        submitted = time.perf_counter()
        writer.flush()
        done = time.perf_counter()
    lead.close()
    return {
        "payload_bytes": payload,
        "records": records,
        "records_per_s": round(records / (done - started)),
        "submit_only_records_per_s": round(records / (submitted - started)),
    }


def durable_latency(journal: Journal, session: str, samples: int) -> dict:
    lead = journal.campaign(session, "bench")
    lead.append([("warmup", {})])
    single = []
    for i in range(samples):
        t = time.perf_counter()
        lead.append([("observation", {"now": float(i)})])
        single.append(time.perf_counter() - t)
    through_writer = []
    with GroupCommitWriter(lead) as writer:
        for i in range(samples):
            t = time.perf_counter()
            writer.wait_durable(writer.submit("observation", {"now": float(i)}))
            through_writer.append(time.perf_counter() - t)
    lead.close()

    def pct(values: list[float]) -> dict:
        values = sorted(values)
        return {
            "p50_ms": round(statistics.median(values) * 1e3, 3),
            "p99_ms": round(values[int(len(values) * 0.99) - 1] * 1e3, 3),
        }

    return {
        "samples": samples,
        "append_one_record": pct(single),
        "writer_submit_then_wait_durable": pct(through_writer),
    }


def read_throughput(journal: Journal, session: str) -> dict:
    best = 0.0
    count = 0
    for _ in range(3):
        started = time.perf_counter()
        count = 0
        for _record in journal.read(session):
            count += 1
        best = max(best, count / (time.perf_counter() - started))
    return {"records": count, "records_per_s": round(best)}


def bench_backend(url: str, records: int, samples: int) -> dict:
    with open_journal(url) as journal:
        out = {
            "append_16B": append_throughput(journal, "bench-16", 16, records),
            "append_200B": append_throughput(journal, "bench-200", 200, records),
            "durable_latency": durable_latency(journal, "bench-latency", samples),
            "read_200B": read_throughput(journal, "bench-200"),
            "read_16B": read_throughput(journal, "bench-16"),
        }
        for session in ("bench-16", "bench-200", "bench-latency"):
            journal.delete_session(session)
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--latency-samples", type=int, default=500)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    result: dict = {
        "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
    }
    with tempfile.TemporaryDirectory(prefix="regent-bench-") as tmp:
        result["sqlite"] = bench_backend(
            f"sqlite://{tmp}/journal.db", args.records, args.latency_samples
        )
    if etcd_available():
        with EtcdServer() as server:
            result["etcd"] = bench_backend(server.url, args.records, args.latency_samples)
    else:
        result["etcd"] = {"skipped": "etcd binary not found; run scripts/install_etcd.sh"}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
