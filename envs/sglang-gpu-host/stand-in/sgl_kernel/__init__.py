"""Stand-in for sgl-kernel on a GPU host whose torch is not SGLang's.

PyPI's ``sglang-kernel`` 0.4.10 is built against torch 2.14.1's C++ API and does
not load under another torch (its ``common_ops`` misses
``c10::cuda::CUDAErrorLogCapture``), and SGLang 0.5.23 imports names from it in
every server process on its CUDA path. On our path SGLang runs none of them: its
fused ops take their ``forward_native`` torch code
(``SGLANG_FORCE_FUSED_OP_BACKEND=torch``), attention and sampling take the Triton
and torch backends the platform names (``config/platform.py``). So every name
here is a placeholder that raises, and says so in the server log, if called
(``serving_study_stand_in``); a run in which one ran is invalid. Every
``sgl_kernel.<module>`` imports as such a module too, except:

- ``sgl_kernel.scalar_type``, which is absent: SGLang then uses its own mock of
  the quantization scalar types (a placeholder there breaks its import);
- ``sgl_kernel.utils.is_arch_support_pdl``, which answers False (no programmatic
  dependent launch), as SGLang's Triton attention backend asks at import.
"""

import serving_study_stand_in as _stand_in

STAND_IN = "sgl-kernel"
# Submodules that must fail to import (see above).
ABSENT = ("sgl_kernel.scalar_type",)


def _make(name: str) -> object:
    return _stand_in.placeholder_function(name, STAND_IN)


def __getattr__(name: str) -> object:
    if name.startswith("__") or f"{__name__}.{name}" in ABSENT:
        raise AttributeError(name)
    value = _make(f"{__name__}.{name}")
    globals()[name] = value
    return value


_stand_in.install_finder(_stand_in.PlaceholderFinder(__name__, _make, ABSENT))
