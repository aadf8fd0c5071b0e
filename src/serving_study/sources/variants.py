"""Build one code variant: a fetched SGLang source, copied, with one change applied.

A variant record names its source and at most one change, either a patch file of ours
or (for a git source) an upstream pull request pinned to its head commit:
``{"name": "patched", "source": "sglang-0.5.23", "patch": "envs/patches/x.patch"}``,
``{"name": "pr", "source": "upstream", "pull_request": 7, "pull_request_head":
"<40 hex>"}``. A pull request without a pinned head is applied as it stands, with a
warning that names the head to pin.
The variant tree keeps the source's layout, ``dest/python/sglang/...``; its files are
hard links into the source tree, except those the change touches, which get their own
copies first. Its identity records exactly what went into it, down to the sha256 of
``mm_utils.py``, the file that holds the shared-memory copy under study.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from serving_study.files import file_sha256, staged_directory
from serving_study.sources.git_commands import git_environment
from serving_study.sources.pull_request import fetch_pull_request_diff

logger = logging.getLogger(__name__)

TRANSPORT_MODULE = Path("python/sglang/srt/managers/mm_utils.py")
# A changed Python file in a unified diff of the repository's layout.
CHANGED_FILE = re.compile(r"^\+\+\+ b/python/(?P<path>sglang/\S+\.py)\s*$")


class PatchDoesNotApply(Exception):
    """A patch does not apply to a variant's source tree."""

    def __init__(self, patch_file: str, failures: list[str]):
        self.patch_file = patch_file
        self.failures = failures
        super().__init__(
            f"patch {patch_file} does not apply:\n  "
            + "\n  ".join(failures)
            + "\nThe source's file differs from the one the patch was written "
            "against: check the variant's source, or rewrite the patch for it."
        )


def prepare_variant(
    variant: dict,
    source_tree: Path,
    source_identity: dict,
    patch_path: Path | None,
    dest: Path,
    compile_bytecode: bool = False,
) -> dict:
    """Copy ``source_tree``'s ``python/`` to ``dest``, apply the variant's change,
    and return the variant's identity.

    With ``compile_bytecode`` the tree's bytecode is written once here: a real
    SGLang server imports thousands of its modules in each of its three processes
    at every start, and a host that sets PYTHONDONTWRITEBYTECODE would otherwise
    compile them all again each time. It is compiled in ``source_tree`` first and
    linked, so a second variant of one source costs only its changed modules.
    Without it the variant carries no bytecode.

    ``patch_path`` is the variant's ``patch`` resolved by the caller (None without
    one); a pull request's diff against the source's commit is kept as
    ``dest/pull-request-<N>.patch``. The caller writes the identity
    (``results/<experiment>/variants/<name>.json``).
    """
    name = variant["name"]
    if variant.get("source") != source_identity["name"]:
        raise ValueError(
            f"variant {name!r} names source {variant.get('source')!r}, but was given "
            f"source {source_identity['name']!r}"
        )
    if "patch" in variant and patch_path is None:
        raise ValueError(
            f"variant {name!r} names patch {variant['patch']!r}: pass its path"
        )
    pull_request = variant.get("pull_request")
    if pull_request is not None and patch_path is not None:
        raise ValueError(
            f"variant {name!r} has both a patch and a pull request: give one, or "
            "make a second variant for the other"
        )
    if pull_request is not None and source_identity.get("kind") != "git":
        raise ValueError(
            f"variant {name!r} asks for pull request #{pull_request}, which needs a "
            f"git source; {source_identity['name']!r} is a "
            f"{source_identity.get('kind')} source"
        )

    dest = Path(dest)
    patch_record = None
    pull_request_record = None
    source_python = Path(source_tree) / "python"
    if compile_bytecode:
        # Into the source tree once (bytecode is never among its recorded files):
        # each variant's linked copy then recompiles only what its change touched.
        compile_tree(source_python)
    with staged_directory(dest) as staging:
        shutil.copytree(
            source_python,
            staging / "python",
            copy_function=link_or_copy,
            ignore=None if compile_bytecode else shutil.ignore_patterns("__pycache__"),
        )
        if patch_path is not None:
            apply_patch(patch_path, staging, shown_as=variant.get("patch"))
            patch_record = {
                "file": variant.get("patch", str(patch_path)),
                "sha256": file_sha256(patch_path),
            }
        if pull_request is not None:
            pinned_head = variant.get("pull_request_head")
            diff = fetch_pull_request_diff(
                source_identity["url"],
                pull_request,
                source_identity["commit"],
                pinned_head=pinned_head,
            )
            if pinned_head is None:
                logger.warning(
                    "variant %r: pull request #%d is not pinned to a head commit, "
                    "so its head as it stands now, %s, was applied; pin it with "
                    "pull_request_head: %s",
                    name,
                    pull_request,
                    diff.head_commit,
                    diff.head_commit,
                )
            diff_path = staging / f"pull-request-{pull_request}.patch"
            diff_path.write_text(diff.text)
            apply_patch(diff_path, staging, shown_as=f"pull request #{pull_request}")
            pull_request_record = {
                "number": pull_request,
                "url": diff.url,
                "head_commit": diff.head_commit,
                "pinned_head": pinned_head,
                "merge_base": diff.merge_base,
                "file": diff_path.name,
                "sha256": file_sha256(diff_path),
            }
        if compile_bytecode:
            _drop_bytecode_of_changed_modules(staging / "python", source_python)
            compile_tree(staging / "python")
        transport_module = staging / TRANSPORT_MODULE
        if not transport_module.is_file():
            raise ValueError(
                f"variant {name!r}: source {source_identity['name']!r} has no "
                f"{TRANSPORT_MODULE}; this study needs an SGLang with that module"
            )
        identity = {
            "name": name,
            "source": source_identity,
            "patch": patch_record,
            "pull_request": pull_request_record,
            "mm_utils_sha256": file_sha256(transport_module),
            "sglang_python_root": str(dest.resolve() / "python"),
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
    return identity


def compile_tree(tree: Path) -> None:
    """Write the bytecode of every module under ``tree``, on every CPU.

    In a process of its own: compileall's workers start from a forkserver, which
    from Python 3.12 on runs the parent's main script again in each of them, and a
    Snakemake job's script does not run outside its job. A module that does not
    compile is left to the server to report."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "-j", "0", str(tree)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        check=False,
    )


def apply_patch(patch_path: Path, tree: Path, shown_as: str | None = None) -> str:
    """Apply a unified diff (paths ``a/python/...``) to ``tree``; return git's report.

    Nothing is changed when any hunk fails: git apply is all or nothing, and then
    PatchDoesNotApply names the patch and the files and hunks that failed.
    """
    patch_path = Path(patch_path).resolve()
    tree = Path(tree).resolve()
    shown_as = shown_as or patch_path.name
    # Outside a repository git apply patches files relative to the current directory.
    # Inside one it would take paths relative to the repository's root: stop it from
    # finding one above the tree.
    environment = git_environment() | {"GIT_CEILING_DIRECTORIES": str(tree.parent)}

    def git_apply(*options: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["git", "apply", *options, "--", str(patch_path)],
            cwd=tree,
            capture_output=True,
            text=True,
            env=environment,
        )

    listed = git_apply("--numstat", "-z")
    if listed.returncode == 0:
        for relative in _named_paths(listed.stdout):
            _make_private(tree / relative)
    result = git_apply("--verbose")
    report = result.stdout + result.stderr
    if result.returncode != 0:
        raise PatchDoesNotApply(shown_as, _failures(report, patch_path))
    return report


def _drop_bytecode_of_changed_modules(tree: Path, source_python: Path) -> None:
    """Unlink the bytecode linked from the source for every module of ``tree``
    that is no longer the source's own file (patched, or new). Python's check of
    bytecode (the source's mtime in seconds and its size) could take a patch of
    the same size made within the same second for the original."""
    for module in tree.rglob("*.py"):
        original = source_python / module.relative_to(tree)
        if original.is_file() and module.samefile(original):
            continue
        for bytecode in (module.parent / "__pycache__").glob(f"{module.stem}.*.pyc"):
            bytecode.unlink()


def link_or_copy(source: str, target: str) -> None:
    """Hard-link a file (cheap for a 4,700-file tree); copy across file systems."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _make_private(path: Path) -> None:
    """Give a hard-linked file its own copy, so patching it leaves the source alone."""
    if path.is_file() and path.stat().st_nlink > 1:
        private = path.with_name(f".{path.name}.private")
        shutil.copy2(path, private)
        os.replace(private, path)


def _named_paths(numstat: str) -> list[str]:
    """The paths in ``git apply --numstat -z`` output (both sides of a rename)."""
    paths = []
    fields = iter(numstat.split("\0"))
    for entry in fields:
        if not entry:
            continue
        path = entry.split("\t")[-1]
        if path:
            paths.append(path)
        else:
            paths += [next(fields, ""), next(fields, "")]
    return [path for path in paths if path]


def _failures(report: str, patch_path: Path) -> list[str]:
    """The error lines of git's report, each failed hunk shown with its header."""
    hunk_headers = {}
    current_file = None
    for line in patch_path.read_text(errors="replace").splitlines():
        if line.startswith("+++ "):
            current_file = line[4:].split("\t")[0].removeprefix("b/")
        header = re.match(r"@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@", line)
        if header and current_file:
            hunk_headers[(current_file, header.group(1))] = line
    failures = []
    for line in report.splitlines():
        if (
            not line.startswith("error:")
            or line.strip() == "error: while searching for:"
        ):
            continue
        failed = re.match(r"error: patch failed: (.+):(\d+)$", line)
        if failed and failed.groups() in hunk_headers:
            line += f" (hunk {hunk_headers[failed.groups()]})"
        failures.append(line)
    return failures or [report.strip() or "git apply failed without a message"]


def changed_modules(identity: dict, project_root: Path) -> list[str]:
    """The Python modules a variant's change touches (``sglang.srt.managers.
    mm_utils``), read from its patch or pull-request diff (none without one)."""
    diffs = []
    if identity.get("patch"):
        diffs.append(Path(project_root) / identity["patch"]["file"])
    if identity.get("pull_request"):
        tree = Path(identity["sglang_python_root"]).parent
        diffs.append(tree / identity["pull_request"]["file"])
    modules = []
    for diff in diffs:
        for line in diff.read_text().splitlines():
            match = CHANGED_FILE.match(line)
            if match:
                module = match["path"].removesuffix(".py").replace("/", ".")
                modules.append(module.removesuffix(".__init__"))
    return sorted(set(modules))
