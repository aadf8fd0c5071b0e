"""Settings: an experiment's config, checked before any job runs.

Validation against the schema, secrets kept out of files, the order arms run in,
where a real server runs (and all that follows from it), and what the preflight
doctor prescribes. Nothing here starts a process or measures anything.
"""
