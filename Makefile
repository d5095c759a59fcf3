# The README's two commands. Each first does whatever set-up is still missing
# (.ci/setup: Debian packages, PostgreSQL, the virtualenv, the JVM jars).
.PHONY: setup up test

setup:
	bash .ci/setup

up: setup
	.venv/bin/rulectl up $(ARGS)

# Two pytest-xdist workers, a test file each at a time, one per core: the suite keeps
# both cores busy (tests/benchmarks/bench_suite_cpu.py), so more workers would only wait.
test:
	bash .ci/setup test
	.venv/bin/python -m pytest -n 2 --dist loadfile $(ARGS)
