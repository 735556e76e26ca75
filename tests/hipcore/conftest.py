"""Fixtures for hipcore tests: a spawn context for real child processes, loopback-only RDMA."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from regent import hipcore

# The owner's RDMA server binds and advertises loopback only during tests.
os.environ.setdefault("REGENT_HIPCORE_RDMA_ADDR", "127.0.0.1")
# Pin the backend this process detected so child processes agree with it (and, on the
# CPU backend, skip importing torch just to rediscover that there is no GPU).
os.environ.setdefault("REGENT_HIPCORE_BACKEND", hipcore.backend().name)


@pytest.fixture(scope="session")
def spawn() -> multiprocessing.context.SpawnContext:
    return multiprocessing.get_context("spawn")


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


@pytest.fixture
def reset_backend_cache():
    from regent import hipcore

    hipcore.reset_backend()
    yield
    hipcore.reset_backend()
