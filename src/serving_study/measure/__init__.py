"""Measuring one arm.

The load client, the monitors, the run's figures, the checks that decide whether a
run counts, the host lock, and the arm runner that ties them together.
"""
