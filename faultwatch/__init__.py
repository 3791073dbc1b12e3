"""faultwatch's entry points: the ``faultwatch`` command line and the demo.

The top layer: it wires ``pipeline`` (everything that is not Spark) to ``streaming`` (the Spark job),
which never import it (tests/unit/test_purity.py).
"""
