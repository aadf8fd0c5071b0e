"""Stand-in for NVIDIA's CuTe DSL package ``cutlass`` (``nvidia-cutlass-dsl``).

SGLang 0.5.23 imports its CuTe-DSL dual GEMM, and so ``cutlass``, without a guard
while it builds a dense model's MLP on CUDA (``layers/dual_gemm.py``), but chooses
that kernel only on SM100 (``can_use_dual_gemm``): on a Hopper GPU nothing of
``cutlass`` runs. The package is not installed on our GPU host, so this one stands
in: every attribute and every ``cutlass.<module>`` is a placeholder. A placeholder
called with one function and nothing else returns that function, so the kernel
module's decorators (``@cute.jit``, ``@cute.kernel``) pass at import; any other
call raises, and says so in the server log first (``serving_study_stand_in``), which
makes the run invalid.

A side effect: SGLang's model registry imports every model module, and those of
``muse_spark`` fail on a placeholder's arithmetic, so SGLang skips them; they are
not the model served here.
"""

import serving_study_stand_in as _stand_in

STAND_IN = "cutlass"


class Placeholder:
    """Any name of ``cutlass``: its attributes and items are placeholders too."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> "Placeholder":
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return Placeholder(f"{self._name}.{attribute}")

    def __getitem__(self, item: object) -> "Placeholder":
        return Placeholder(f"{self._name}[...]")

    def __call__(self, *args: object, **kwargs: object) -> object:
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # used as a decorator: the function is kept as it is
        _stand_in.refuse(self._name, STAND_IN)

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)  # a class derived from a placeholder is a plain class

    def __repr__(self) -> str:
        return f"<serving-study stand-in {self._name}>"


def __getattr__(name: str) -> Placeholder:
    if name.startswith("__"):
        raise AttributeError(name)
    return Placeholder(f"{__name__}.{name}")


_stand_in.install_finder(_stand_in.PlaceholderFinder(__name__, Placeholder, ()))
