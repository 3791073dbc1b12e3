# The two commands of README.md. Each does its own set-up on a fresh machine.
.PHONY: demo test bench lint clean

demo:
	@scripts/bootstrap.sh demo
	.venv/bin/faultwatch demo

# ruff and mypy first: a lint or type error fails the suite before any test runs
test: lint
	.venv/bin/python -m pytest

lint:
	@scripts/bootstrap.sh test
	.venv/bin/ruff check faultwatch pipeline streaming schemas tests bench airflow
	.venv/bin/mypy

bench:
	@scripts/bootstrap.sh test
	for b in bench/*.py; do .venv/bin/python $$b || exit 1; done

clean:
	rm -rf data .pytest_cache .hypothesis .mypy_cache spark-warehouse
