"""Reproduce multimodal-serving studies: variants, workloads, arms, monitors, report."""
