"""Fail an image build unless Python runs the variant's own ``mm_utils.py``.

Every Dockerfile here (``Dockerfile.embedded``, ``Dockerfile.sglang``,
``Dockerfile.sglang-cpu``) runs this as a build step, with the image's own Python
and the standard library only::

    python3 verify_mm_utils.py EXPECTED_SHA256 [SEARCH_PATH]

It finds the ``sglang`` package that ``import sglang`` would load, without
importing it (SGLang's import needs its whole runtime), hashes its
``srt/managers/mm_utils.py`` and exits non-zero unless the sha256 is the
variant's. ``SEARCH_PATH`` is put first on ``sys.path``, as the embedded engine's
``--sglang-source`` does; without it the installed SGLang is checked (the SGLang
image installs it editable under ``/sgl-workspace/sglang``).
"""

import hashlib
import importlib.util
import sys
from pathlib import Path

TRANSPORT_MODULE = Path("srt/managers/mm_utils.py")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sglang_package_directory() -> Path | None:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def main(arguments: list[str]) -> int:
    if not arguments or len(arguments) > 2 or len(arguments[0]) != 64:
        print(
            "verify_mm_utils: give the variant's mm_utils.py sha256 (64 hex digits; "
            "build argument MM_UTILS_SHA256) and optionally a directory to search "
            f"first; got {arguments}",
            file=sys.stderr,
        )
        return 2
    expected, search_path = arguments[0], arguments[1:]
    sys.path[:0] = search_path
    package = sglang_package_directory()
    if package is None:
        print(
            f"verify_mm_utils: no sglang package is importable (searched "
            f"{search_path or 'the installed packages'}); the image lacks the variant",
            file=sys.stderr,
        )
        return 1
    transport_module = package / TRANSPORT_MODULE
    if not transport_module.is_file():
        print(f"verify_mm_utils: {transport_module} does not exist", file=sys.stderr)
        return 1
    found = file_sha256(transport_module)
    if found != expected:
        print(
            f"verify_mm_utils: {transport_module} has sha256 {found}, but the "
            f"variant's mm_utils.py has {expected}: this image would not run the "
            "variant (wrong source copied, or the base image's SGLang shadows it)",
            file=sys.stderr,
        )
        return 1
    print(f"verify_mm_utils: {transport_module} is the variant's ({found})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
