"""Test doubles shared by the tests and the benchmarks; never part of the product (the wheel has none).

- ``faults_synth``: seeded synthetic send-result streams, as large or disordered as a test needs.
- ``lag_synth``: small builders of lag events and a vectorised synthetic fleet.
- ``faults_reference``: what the fault tables must say, computed the slow and obvious way.

Imported as ``tests.doubles``: pytest puts the repository root on ``sys.path`` (``pythonpath`` in
pyproject.toml), and the benchmarks add it themselves.
"""
