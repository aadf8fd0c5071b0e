"""Reproduce multimodal-serving performance studies: variants, workloads, arms, report."""
