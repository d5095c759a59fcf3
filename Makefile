# The README's two commands. Each first does whatever set-up is still missing
# (.ci/setup: Debian packages, PostgreSQL, the virtualenv, the JVM jars).
.PHONY: setup up test

setup:
	bash .ci/setup

up: setup
	.venv/bin/rulectl up $(ARGS)

test:
	bash .ci/setup test
	.venv/bin/python -m pytest $(ARGS)
