.PHONY: demo test check bench

# The main job: a session with a standby, a controller failover, and the result.
demo:
	scripts/demo.sh

# The full test suite, what CI runs (installs the venv, etcd, Toxiproxy, Slurm... when missing).
test:
	scripts/test.sh

# The fast tier for everyday work: lint, import contracts, unit, engine and quick runtime tests.
check:
	scripts/check.sh

bench:
	scripts/bootstrap.sh
	.venv/bin/python bench/bench_core.py
