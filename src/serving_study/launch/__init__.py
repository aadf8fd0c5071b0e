"""How a server starts: one launch plan per arm.

``plan.py`` is the value (argv, environment, quota and its timing, container
options, what the server must report back); ``engines.py`` builds it from the arm,
the variant and the engine named in the config, through each engine's adapter
(``embedded.py``, ``sglang.py``). The runtimes in ``servers/`` run it as it is.
"""
