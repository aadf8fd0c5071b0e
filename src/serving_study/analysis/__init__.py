"""Judging what the runs show.

Per-arm summaries, ratios and claim verdicts, changes between releases, which fix
to deploy, and what a real server's arm costs.
"""
