"""``sgl_kernel.utils`` of the stand-in: one real answer, placeholders for the rest."""

import serving_study_stand_in as _stand_in

STAND_IN = "sgl-kernel"


def is_arch_support_pdl() -> bool:
    """No programmatic dependent launch: the stand-in launches no kernel."""
    _stand_in.announce_once(f"{__name__}.is_arch_support_pdl")
    return False


def __getattr__(name: str) -> object:
    if name.startswith("__"):
        raise AttributeError(name)
    value = _stand_in.placeholder_function(f"{__name__}.{name}", STAND_IN)
    globals()[name] = value
    return value
