.PHONY: demo test bench

# The main job: a session with a standby, a controller failover, and the result.
demo:
	scripts/demo.sh

# The full test suite (installs the venv, etcd and Toxiproxy when missing).
test:
	scripts/test.sh

bench:
	scripts/bootstrap.sh
	.venv/bin/python bench/bench_core.py
