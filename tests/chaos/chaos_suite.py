"""What every chaos scenario asserts, and the figures a suite run leaves behind."""

from __future__ import annotations

import json
import os
from pathlib import Path

FIGURES = os.environ.get("REGENT_CHAOS_FIGURES")  # append each run's figures (JSON lines) here


def name(tag: str) -> str:
    """A session name unique to this test process."""
    return f"{tag}-{os.getpid()}"


def record_figures(name: str, run) -> None:
    """Keep a run's figures for docs/chaos.md (only when REGENT_CHAOS_FIGURES is set)."""
    if not FIGURES:
        return
    r = run.report
    line = {"scenario": name, "faults": r.injected, "points": r.points, "ran_once": r.ran_once,
            "lost": len(r.lost), "duplicated": len(r.duplicated), "rerun_after_crash": len(r.rerun_after_crash),
            "failed_points": r.failed_points,
            "timed_out": r.timed_out_points, "failovers_s": r.failovers_s, "duration_s": r.duration_s,
            "retries": r.retries, "ok": r.ok}
    if r.linearizability is not None:
        line["porcupine"] = {"result": r.linearizability.result, "operations": r.linearizability.operations}
    figures = getattr(run.cluster, "figures", None)  # what a cluster measures besides the checker
    if figures is not None:
        line.update(figures())
    with Path(FIGURES).open("a") as f:
        f.write(json.dumps(line) + "\n")


def assert_verdict(run, name: str) -> None:
    """The checker's verdict every scenario must reach: 0 lost, 0 duplicated, results equal."""
    record_figures(name, run)
    r = run.report
    print(r.text())  # shown with -rP or -s: the run's report
    detail = r.text() + "\n" + run.cluster.log_tail(15)
    assert not r.program_error, detail
    assert r.lost == [], detail
    assert r.duplicated == [], detail
    assert r.unjournaled == [], detail
    assert r.journal_ok, detail
    assert r.results_equal, detail
    # Porcupine, a checker regent did not write, on the register's history as the controllers saw it.
    lin = r.linearizability
    assert lin is not None and lin.result != "unchecked", f"register history not checked: {lin and lin.summary()}"
    assert lin.ok and lin.operations > 0, detail
    assert r.ok, detail
