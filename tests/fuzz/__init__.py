"""Fuzzing of the wire and journal decoders: the targets (tests/fuzz/targets.py) are shared by
the bounded Hypothesis tests here and by bench/bench_fuzz.py, which runs 100,000 inputs each."""
