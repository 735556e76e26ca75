"""What a test's launch left running: processes anywhere on the machine (namespace hosts
included: they share its pid namespace) whose command line or environment names one of the
test's own marks (a session name, a cluster name, a value put in the launcher's environment),
so that processes of other tests running at the same time are not counted."""

from __future__ import annotations

from collections.abc import Iterable

import psutil


def left_running(marks: Iterable[str]) -> list[str]:
    marks = [m for m in marks if m]
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            text = " ".join(p.info["cmdline"] or [])
            if not any(m in text for m in marks):
                env = p.environ()
                text = " ".join(env.values())
            if any(m in text for m in marks):
                found.append(f"{p.info['pid']}: {' '.join(p.info['cmdline'] or [])[:200]}")
        except psutil.Error:
            continue
    return found
