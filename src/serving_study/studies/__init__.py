"""Studies beyond one arm.

Harness benchmarks, the thread x quota map, commit bisects and the soak test.
"""
