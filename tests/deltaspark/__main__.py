"""Prepare the delta-spark environment and Delta's jars (the set-up runs this once; then cached)."""

from tests.deltaspark import delta_jars, interpreter

print(f"delta-spark environment: {interpreter()}; jars: {', '.join(j.name for j in delta_jars())}")
