"""Every wire and journal decoder, fuzzed with Hypothesis, a bounded number of examples each
(bench/bench_fuzz.py runs 100,000 a target): inputs mutated from valid encodings, inputs whose
fields Hypothesis generates inside valid framing, and raw bytes (tests/fuzz/strategies.py).
Each must decode to a value its contract allows or raise the documented error
(wire.ProtocolError, journal.CorruptRecord); tests/fuzz/targets.py holds the oracles.
Derandomized, with no example database: CI runs the same examples every time."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.strategies import inputs
from tests.fuzz.targets import TARGETS

# `make check` (the fast tier) sets fewer through REGENT_FUZZ_EXAMPLES; the full suite runs 400.
EXAMPLES = int(os.environ.get("REGENT_FUZZ_EXAMPLES", "400"))


@pytest.mark.parametrize("name", list(TARGETS))
@settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_every_decoder_decodes_or_refuses_with_its_documented_error(name, data):
    target = TARGETS[name]
    target.run(data.draw(inputs(target), label=name))
