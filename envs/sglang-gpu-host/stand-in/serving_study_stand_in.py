"""What the stand-ins for sgl-kernel and cutlass on a GPU host share.

SGLang 0.5.23 imports both packages on its CUDA path in every server process, but
on our path (``config/platform.py``'s host-torch platform: SGLang's Triton and
torch fallbacks, ``SGLANG_FORCE_FUSED_OP_BACKEND=torch``) it calls nothing of
either. So each name they are asked for is a placeholder that raises when called,
and says so first, on one stderr line the server log keeps and the runner reads
(``measure/server_log_facts.py``; a run in which one ran is invalid)::

    serving-study stand-in: placeholder <name> called in pid <pid> (<title>)

The one real function, sgl-kernel's ``is_arch_support_pdl``, prints the same line
without ``placeholder`` the first time a process calls it.
"""

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Collection
from types import ModuleType
from typing import NoReturn

_announced: set[tuple[int, str]] = set()


def _process_title() -> str:
    """This process's title (``sglang::scheduler`` once SGLang set it), else argv."""
    setproctitle = sys.modules.get("setproctitle")
    if setproctitle is not None:
        title = setproctitle.getproctitle()
    else:
        with open("/proc/self/cmdline", "rb") as cmdline:
            title = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    return " ".join(title.split())  # one line, even for ``python -c`` scripts


def announce(name: str, placeholder: bool) -> None:
    """Say on stderr that ``name`` was called in this process."""
    kind = "placeholder " if placeholder else ""
    print(
        f"serving-study stand-in: {kind}{name} called in pid {os.getpid()}"
        f" ({_process_title()})",
        file=sys.stderr,
        flush=True,
    )


def announce_once(name: str) -> None:
    """``announce`` a real function's first call in this process."""
    if (os.getpid(), name) not in _announced:
        _announced.add((os.getpid(), name))
        announce(name, placeholder=False)


def refuse(name: str, stand_in: str) -> NoReturn:
    announce(name, placeholder=True)
    raise NotImplementedError(
        f"{name} is a placeholder of serving-study's {stand_in} stand-in"
        " (envs/sglang-gpu-host/stand-in); SGLang was not expected to call it"
    )


def placeholder_function(name: str, stand_in: str) -> Callable[..., NoReturn]:
    """A function that refuses to run; SGLang calls some ops as ``op.default``."""

    def placeholder(*args: object, **kwargs: object) -> NoReturn:
        refuse(name, stand_in)

    placeholder.__module__, placeholder.__name__ = name.rsplit(".", 1)
    placeholder.__qualname__ = placeholder.__name__
    placeholder.default = placeholder
    return placeholder


class PlaceholderModule(ModuleType):
    """A module whose every public name is made by ``make(qualified name)``."""

    def __init__(self, name: str, make: Callable[[str], object]) -> None:
        super().__init__(name)
        self._make = make

    def __getattr__(self, attribute: str) -> object:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        value = self._make(f"{self.__name__}.{attribute}")
        setattr(self, attribute, value)
        return value


class PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds every submodule of ``package`` that no file provides as a
    ``PlaceholderModule``, except those named in ``absent`` (their import fails,
    so SGLang's own fallback for a missing module applies). It goes last on
    ``sys.meta_path``, so a submodule with a file of its own is found first."""

    def __init__(
        self, package: str, make: Callable[[str], object], absent: Collection[str]
    ) -> None:
        self.package = package
        self.make = make
        self.absent = frozenset(absent)

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(f"{self.package}.") or fullname in self.absent:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = PlaceholderModule(spec.name, self.make)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def install_finder(finder: PlaceholderFinder) -> None:
    """Put ``finder`` on ``sys.meta_path`` once per process."""
    if not any(
        isinstance(found, PlaceholderFinder) and found.package == finder.package
        for found in sys.meta_path
    ):
        sys.meta_path.append(finder)
