"""hipcore through the actor runtime: real host agent, real procs, real Sessions.

The procs inherit this environment through the host agent, which the first Session
of the run starts (conftests load before any test runs).
"""

from __future__ import annotations

import os

# Owners' RDMA servers bind and advertise loopback only during tests.
os.environ.setdefault("REGENT_HIPCORE_RDMA_ADDR", "127.0.0.1")
