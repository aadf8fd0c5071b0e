"""The code and models a study runs.

Pinned SGLang releases fetched and recorded, variants built from them, wheelhouses,
the real server's CPU runtime, container image contexts, tiny and downloaded models.
"""
