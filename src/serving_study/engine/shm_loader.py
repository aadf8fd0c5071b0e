"""Load a variant's own `ShmPointerMMData` class without importing SGLang.

Importing `sglang.srt.managers.mm_utils` pulls in most of SGLang and its GPU
kernels, which do not import on a CPU-only host. The transport class itself is
small, so we parse the variant's `mm_utils.py` (patched or not), take the class
definition, and compile it into a namespace that provides exactly the names it
uses. The class is then the variant's real code: its `__init__` is the very
line the study is about.

The names come from a fixed table (`KNOWN_NAMES`), from literal constants in
the same file, or, for `make_shm_name`, from the variant's
`sglang/srt/utils/stale_shm_cleanup.py`. A variant that needs anything else is
refused with an error naming the file and the missing names.

The compiled class lives in a synthetic module registered in `sys.modules`
under a name derived from the files' sha256, so instances pickle in one
process and unpickle in another process that loaded the same files.
"""

from __future__ import annotations
import __future__

import ast
import builtins
import dataclasses
import hashlib
import importlib
import logging
import symtable
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MM_UTILS_RELATIVE_PATH = Path("sglang/srt/managers/mm_utils.py")
STALE_SHM_CLEANUP_RELATIVE_PATH = Path("sglang/srt/utils/stale_shm_cleanup.py")
CLASS_NAME = "ShmPointerMMData"
SHM_NAME_FUNCTION = "make_shm_name"


def _module(name: str) -> Callable[[], object]:
    return lambda: importlib.import_module(name)


def _attribute(module_name: str, attribute: str) -> Callable[[], object]:
    return lambda: getattr(importlib.import_module(module_name), attribute)


# Every name a known release's ShmPointerMMData or make_shm_name reads from
# its module, and what SGLang binds it to there.
KNOWN_NAMES: dict[str, Callable[[], object]] = {
    "torch": _module("torch"),
    "np": _module("numpy"),
    "numpy": _module("numpy"),
    "os": _module("os"),
    "sys": _module("sys"),
    "mmap": _module("mmap"),
    "uuid": _module("uuid"),
    "shared_memory": _module("multiprocessing.shared_memory"),
    "logger": lambda: logging.getLogger("sglang.srt.managers.mm_utils"),
    "logging": _module("logging"),
    "Optional": _attribute("typing", "Optional"),
    "List": _attribute("typing", "List"),
    "Tuple": _attribute("typing", "Tuple"),
    "Dict": _attribute("typing", "Dict"),
    "Any": _attribute("typing", "Any"),
    "Union": _attribute("typing", "Union"),
}


class VariantSourceError(RuntimeError):
    """The variant's source cannot be turned into a working transport class."""


@dataclass(frozen=True)
class VariantTransport:
    """The transport class of one SGLang variant and where it came from."""

    shm_pointer_class: type
    mm_utils_path: Path
    mm_utils_sha256: str
    stale_shm_cleanup_path: Path | None
    free_names: tuple[str, ...]

    @property
    def materializes(self) -> bool:
        """True for releases (0.5.10+) whose receiver calls `materialize()`."""
        return hasattr(self.shm_pointer_class, "materialize")


def load_shm_pointer_class(sglang_python_root: Path) -> type:
    """Return the variant's `ShmPointerMMData` class, compiled from its source."""
    return load_variant_transport(sglang_python_root).shm_pointer_class


def load_variant_transport(sglang_python_root: Path) -> VariantTransport:
    """Compile the variant's transport class from the files under
    `sglang_python_root`, the directory holding the `sglang/` package (e.g.
    `site-packages`, or `python/` in a checkout)."""
    root = Path(sglang_python_root)
    mm_utils_path = (root / MM_UTILS_RELATIVE_PATH).resolve()
    if not mm_utils_path.is_file():
        raise VariantSourceError(
            f"{mm_utils_path} does not exist: --sglang-source must be the "
            "directory that contains sglang/srt/managers/mm_utils.py"
        )
    mm_utils_text = mm_utils_path.read_text()
    mm_utils_sha256 = hashlib.sha256(mm_utils_text.encode()).hexdigest()
    module_name = f"_sglang_variant_transport_{mm_utils_sha256[:16]}"

    class_node, mm_utils_tree = _find_definition(
        mm_utils_text, mm_utils_path, ast.ClassDef, CLASS_NAME
    )
    class_free_names = _free_names(mm_utils_text, class_node, mm_utils_path)

    stale_shm_cleanup_path = None
    if SHM_NAME_FUNCTION in class_free_names:
        stale_shm_cleanup_path = (root / STALE_SHM_CLEANUP_RELATIVE_PATH).resolve()
        if not stale_shm_cleanup_path.is_file():
            raise VariantSourceError(
                f"{mm_utils_path}: {CLASS_NAME} calls {SHM_NAME_FUNCTION}, but "
                f"{stale_shm_cleanup_path} does not exist; copy that file from "
                "the same SGLang release next to mm_utils.py"
            )
        cleanup_sha256 = hashlib.sha256(stale_shm_cleanup_path.read_bytes()).hexdigest()
        module_name += f"_{cleanup_sha256[:8]}"

    cached = sys.modules.get(module_name)
    if cached is not None:
        # Same file contents, same class (it must pickle under one module name);
        # report the files this caller asked for.
        return dataclasses.replace(
            cached.__variant_transport__,
            mm_utils_path=mm_utils_path,
            stale_shm_cleanup_path=stale_shm_cleanup_path,
        )

    namespace: dict[str, object] = {"__name__": module_name}
    if stale_shm_cleanup_path is not None:
        namespace[SHM_NAME_FUNCTION] = _compile_shm_name_function(
            stale_shm_cleanup_path
        )
    _provide_names(
        namespace,
        class_free_names - {SHM_NAME_FUNCTION},
        mm_utils_tree,
        mm_utils_path,
        CLASS_NAME,
    )
    _execute_definition(class_node, mm_utils_tree, mm_utils_path, namespace)

    module = types.ModuleType(module_name)
    module.__dict__.update(namespace)
    module.__file__ = str(mm_utils_path)
    transport = VariantTransport(
        shm_pointer_class=namespace[CLASS_NAME],
        mm_utils_path=mm_utils_path,
        mm_utils_sha256=mm_utils_sha256,
        stale_shm_cleanup_path=stale_shm_cleanup_path,
        free_names=tuple(sorted(class_free_names)),
    )
    module.__variant_transport__ = transport
    sys.modules[module_name] = module
    return transport


def _compile_shm_name_function(stale_shm_cleanup_path: Path) -> Callable:
    text = stale_shm_cleanup_path.read_text()
    function_node, tree = _find_definition(
        text, stale_shm_cleanup_path, ast.FunctionDef, SHM_NAME_FUNCTION
    )
    free_names = _free_names(text, function_node, stale_shm_cleanup_path)
    namespace: dict[str, object] = {"__name__": "sglang.srt.utils.stale_shm_cleanup"}
    _provide_names(
        namespace, free_names, tree, stale_shm_cleanup_path, SHM_NAME_FUNCTION
    )
    _execute_definition(function_node, tree, stale_shm_cleanup_path, namespace)
    return namespace[SHM_NAME_FUNCTION]


def _find_definition(
    text: str, path: Path, node_type: type, name: str
) -> tuple[ast.AST, ast.Module]:
    tree = ast.parse(text, filename=str(path))
    for node in tree.body:
        if isinstance(node, node_type) and node.name == name:
            return node, tree
    raise VariantSourceError(
        f"{path} has no top-level {name}; is this an SGLang release with the "
        "SHM feature transport (0.5.9 or later)?"
    )


def _free_names(text: str, node: ast.AST, path: Path) -> set[str]:
    """Names the definition reads from its module's globals (not builtins)."""
    segment = ast.get_source_segment(text, node)
    table = symtable.symtable(segment, str(path), "exec")
    free: set[str] = set()

    def collect(scope: symtable.SymbolTable) -> None:
        for symbol in scope.get_symbols():
            if symbol.is_referenced() and symbol.is_global():
                free.add(symbol.get_name())
        for child in scope.get_children():
            collect(child)

    for child in table.get_children():
        collect(child)
    return {name for name in free if not hasattr(builtins, name)} - {node.name}


def _provide_names(
    namespace: dict[str, object],
    names: set[str],
    tree: ast.Module,
    path: Path,
    definition_name: str,
) -> None:
    """Fill the namespace from the file's literal constants or KNOWN_NAMES."""
    constants = _literal_constants(tree)
    missing = []
    for name in sorted(names):
        if name in constants:
            namespace[name] = constants[name]
        elif name in KNOWN_NAMES:
            namespace[name] = KNOWN_NAMES[name]()
        else:
            missing.append(name)
    if missing:
        raise VariantSourceError(
            f"{path}: {definition_name} uses names the engine's loader does not "
            f"provide: {', '.join(missing)}. Add them to KNOWN_NAMES in "
            "serving_study/engine/shm_loader.py (bound as SGLang binds them in "
            "that file), or use a supported SGLang release (0.5.9 to 0.5.23)."
        )


def _literal_constants(tree: ast.Module) -> dict[str, object]:
    constants = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            try:
                constants[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return constants


def _execute_definition(
    node: ast.AST, tree: ast.Module, path: Path, namespace: dict[str, object]
) -> None:
    """Run one definition with the file's line numbers and __future__ flags.

    Compiling the node itself (not re-parsed text) keeps tracebacks and
    `inspect.getsource` pointing at the variant's file.
    """
    flags = 0
    for statement in tree.body:
        if isinstance(statement, ast.ImportFrom) and statement.module == "__future__":
            for alias in statement.names:
                flags |= getattr(__future__, alias.name).compiler_flag
    code = compile(
        ast.Module(body=[node], type_ignores=[]),
        filename=str(path),
        mode="exec",
        flags=flags,
        dont_inherit=True,
    )
    exec(code, namespace)
