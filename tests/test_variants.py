"""Building code variants, with the PR #48881 patch on the real sglang 0.5.23 file.

The real source comes from PyPI once and is then kept, with its unpacked tree, in
pytest's cache directory (``.pytest_cache/d/``), so later runs need no network.
"""

from __future__ import annotations

import ast
import difflib
import logging
import os
import subprocess
import sys
import uuid
from multiprocessing import shared_memory
from pathlib import Path
from typing import Optional

import pytest
import torch
from study_helpers import git

from serving_study.files import file_sha256, tree_sha256
from serving_study.sources.fetch import fetch_source
from serving_study.sources.source_errors import SourceMismatch
from serving_study.sources.variants import (
    PatchDoesNotApply,
    apply_patch,
    changed_modules,
    prepare_variant,
)

REPOSITORY = Path(__file__).resolve().parents[1]
PATCH = "envs/patches/pr48881-shm-copy-without-thread-fanout.patch"
MM_UTILS = "python/sglang/srt/managers/mm_utils.py"
PATCHED_LINE = "shm.buf[:] = tensor.detach().view(torch.uint8).reshape(-1).numpy()"


def patched_variant(tree: Path, identity: dict, dest: Path) -> dict:
    variant = {"name": "patched", "source": "sglang-0.5.23", "patch": PATCH}
    return prepare_variant(variant, tree, identity, REPOSITORY / PATCH, dest)


@pytest.fixture(scope="module")
def patched_0_5_23(sglang_0_5_23, tmp_path_factory) -> tuple[Path, dict]:
    """The PR #48881 variant of sglang 0.5.23 and its identity."""
    tree, source = sglang_0_5_23
    variants = tmp_path_factory.mktemp("variants")
    return variants, patched_variant(tree, source, variants / "patched")


def changed_lines(before: str, after: str) -> tuple[list[str], list[str]]:
    """The lines that went from ``before`` to ``after``: removed, added, in order."""
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), n=0)
    removed, added = [], []
    for line in list(diff)[2:]:  # past the ---/+++ header
        if not line.startswith("@@"):
            (removed if line.startswith("-") else added).append(line[1:])
    return removed, added


def patch_lines(patch: Path) -> tuple[list[str], list[str]]:
    """The lines a one-file patch removes and adds, in order."""
    hunks = patch.read_text().split("\n@@", 1)[1].splitlines()[1:]
    removed = [line[1:] for line in hunks if line.startswith("-")]
    added = [line[1:] for line in hunks if line.startswith("+")]
    return removed, added


def files_under(root: Path, folder: str) -> list[Path]:
    """Every file in ``root``'s ``folder``, relative to ``root``."""
    return sorted(
        p.relative_to(root) for p in (root / folder).rglob("*") if p.is_file()
    )


def test_the_pr48881_patch_changes_only_the_copy(sglang_0_5_23, patched_0_5_23):
    tree, source = sglang_0_5_23
    variants, identity = patched_0_5_23
    variant = variants / "patched"

    # The source is still as fetched: its files' digest is the one recorded then.
    assert tree_sha256(tree / "python") == source["tree_sha256"]
    # The variant holds every file of the source, all alike but mm_utils.py ...
    files = files_under(tree, "python")
    assert files_under(variant, "python") == files
    unlike = [
        path
        for path in files
        if not os.path.samefile(tree / path, variant / path)
        and file_sha256(tree / path) != file_sha256(variant / path)
    ]
    assert unlike == [Path(MM_UTILS)]
    # ... and in that file only the lines of the patch's hunk: the copy itself.
    text = (variant / MM_UTILS).read_text()
    assert changed_lines((tree / MM_UTILS).read_text(), text) == patch_lines(
        REPOSITORY / PATCH
    )
    assert PATCHED_LINE in text and "dst.copy_(" not in text
    assert identity["mm_utils_sha256"] == file_sha256(variant / MM_UTILS)
    assert identity["patch"] == {
        "file": PATCH,
        "sha256": file_sha256(REPOSITORY / PATCH),
    }
    assert identity["source"] == source
    assert identity["sglang_python_root"] == str(variants / "patched/python")
    assert [p.name for p in variants.iterdir()] == ["patched"]


def test_a_variant_without_a_patch_is_the_source(sglang_0_5_23, tmp_path):
    tree, source = sglang_0_5_23
    variant = {"name": "base", "source": "sglang-0.5.23"}

    identity = prepare_variant(variant, tree, source, None, tmp_path / "base")

    assert identity["patch"] is None
    assert identity["mm_utils_sha256"] == file_sha256(tree / MM_UTILS)
    assert (tmp_path / "base" / MM_UTILS).read_bytes() == (tree / MM_UTILS).read_bytes()


def test_a_variant_for_a_real_server_carries_its_patched_bytecode(tmp_path):
    source = tmp_path / "source"
    mm_utils = source / MM_UTILS
    mm_utils.parent.mkdir(parents=True)
    (source / "python/sglang/__init__.py").write_text("")
    mm_utils.write_text("COPY = 'torch'\n")
    (tmp_path / "fix.patch").write_text(
        "--- a/python/sglang/srt/managers/mm_utils.py\n"
        "+++ b/python/sglang/srt/managers/mm_utils.py\n"
        # The same size, applied within the same second as a rule: the bytecode
        # linked from the source would pass Python's check (mtime and size).
        "@@ -1 +1 @@\n-COPY = 'torch'\n+COPY = 'numpy'\n"
    )
    identity = {"name": "s", "kind": "path"}
    variant = {"name": "v", "source": "s", "patch": "envs/patches/fix.patch"}
    prepare_variant(
        variant,
        source,
        identity,
        tmp_path / "fix.patch",
        tmp_path / "v",
        compile_bytecode=True,
    )

    compiled = tmp_path / "v" / "python/sglang/srt/managers/__pycache__"
    (bytecode,) = compiled.glob("mm_utils.cpython-*.pyc")
    assert b"numpy" in bytecode.read_bytes()  # compiled after the patch
    # Compiled once in the source: an unchanged module's bytecode is the source's
    # own file, linked; the patched module's is the variant's alone.
    (source_bytecode,) = (source / "python/sglang/srt/managers/__pycache__").glob(
        "mm_utils.cpython-*.pyc"
    )
    assert b"torch" in source_bytecode.read_bytes()
    (package_bytecode,) = (tmp_path / "v" / "python/sglang/__pycache__").glob("*.pyc")
    assert package_bytecode.samefile(
        source / "python/sglang/__pycache__" / package_bytecode.name
    )
    assert not bytecode.samefile(source_bytecode)
    prepare_variant(variant, source, identity, tmp_path / "fix.patch", tmp_path / "w")
    assert not list((tmp_path / "w").rglob("*.pyc"))


def test_the_modules_a_change_touches_are_read_from_its_diff(tmp_path):
    (tmp_path / "source").mkdir()
    (tmp_path / "source" / "pull-request-7.patch").write_text(
        "--- a/python/sglang/srt/managers/mm_utils.py\n"
        "+++ b/python/sglang/srt/managers/mm_utils.py\n"
        "--- a/python/sglang/srt/layers/__init__.py\n"
        "+++ b/python/sglang/srt/layers/__init__.py\n"
        "+++ b/docs/readme.md\n"
    )
    identity = {
        "patch": {"file": PATCH},
        "pull_request": {"file": "pull-request-7.patch"},
        "sglang_python_root": str(tmp_path / "source" / "python"),
    }
    assert changed_modules(identity, REPOSITORY) == [
        "sglang.srt.layers",
        "sglang.srt.managers.mm_utils",
    ]
    assert changed_modules({"patch": None, "pull_request": None}, REPOSITORY) == []


def load_transport_class(python_root: Path) -> type:
    """Compile a tree's ShmPointerMMData alone, with the names it uses in 0.5.23."""
    module = ast.parse((python_root / "sglang/srt/managers/mm_utils.py").read_text())
    (definition,) = [
        node
        for node in module.body
        if isinstance(node, ast.ClassDef) and node.name == "ShmPointerMMData"
    ]
    namespace = {
        "torch": torch,
        "os": os,
        "sys": sys,
        "mmap": __import__("mmap"),
        "shared_memory": shared_memory,
        "logger": logging.getLogger(__name__),
        "Optional": Optional,
        "make_shm_name": lambda kind: f"serving_study_test_{kind}_{uuid.uuid4().hex}",
    }
    exec(compile(ast.Module([definition], []), "mm_utils.py", "exec"), namespace)
    return namespace["ShmPointerMMData"]


@pytest.mark.parametrize(
    "tensor",
    [
        torch.arange(64 * 1536, dtype=torch.float32).reshape(64, 1536) / 7,
        torch.arange(3 * 1536, dtype=torch.bfloat16).reshape(1536, 3).t(),
        torch.ones(32, 16, requires_grad=True),
    ],
    ids=["float32", "bfloat16-transposed", "requires-grad"],
)
def test_the_patched_copy_delivers_the_same_tensor(patched_0_5_23, tensor):
    _, identity = patched_0_5_23
    transport = load_transport_class(Path(identity["sglang_python_root"]))

    sent = transport(tensor)
    received = transport.__new__(transport)
    received.__setstate__(sent.__getstate__())  # what unpickling does
    delivered = received.materialize()

    assert torch.equal(delivered, tensor.detach())
    assert not Path("/dev/shm", sent.shm_name).exists()  # materialize() unlinked it


def test_a_patch_against_a_changed_file_names_the_hunk(sglang_0_5_23, tmp_path):
    tree, source = sglang_0_5_23
    changed = tmp_path / "changed"
    file = changed / MM_UTILS
    file.parent.mkdir(parents=True)
    file.write_text(
        (tree / MM_UTILS).read_text().replace("dst.copy_(", "dst.copy_from(")
    )

    with pytest.raises(PatchDoesNotApply) as raised:
        patched_variant(changed, source, tmp_path / "variants" / "patched")

    message = str(raised.value)
    assert PATCH in message
    assert f"patch failed: {MM_UTILS}:1384 (hunk @@ -1384,8 +1384,11 @@)" in message
    assert not (tmp_path / "variants" / "patched").exists()
    assert list((tmp_path / "variants").iterdir()) == []


def test_a_patch_applies_inside_an_enclosing_git_repository(tmp_path):
    """Variants are built under results/, inside the project's git repository."""
    subprocess.run(["git", "init", "--quiet", str(tmp_path)], check=True)
    tree = tmp_path / "results" / "variants" / "v"
    (tree / "python").mkdir(parents=True)
    (tree / "python" / "a.py").write_text("one\n")
    patch = tmp_path / "change.patch"
    patch.write_text("--- a/python/a.py\n+++ b/python/a.py\n@@ -1 +1 @@\n-one\n+two\n")

    report = apply_patch(patch, tree)

    assert (tree / "python" / "a.py").read_text() == "two\n"
    assert "Applied patch python/a.py cleanly." in report


def test_a_pull_request_needs_a_git_source(sglang_0_5_23, tmp_path):
    tree, source = sglang_0_5_23
    variant = {"name": "pr", "source": "sglang-0.5.23", "pull_request": 48881}

    with pytest.raises(ValueError, match="needs a git source"):
        prepare_variant(variant, tree, source, None, tmp_path / "pr")


@pytest.fixture
def pull_request_5(tmp_path) -> tuple[dict, str]:
    """A fetched git source whose upstream has pull request #5; its head commit."""
    upstream = tmp_path / "upstream"
    (upstream / "python/sglang/srt/managers").mkdir(parents=True)
    git(upstream, "init", "--quiet", "--initial-branch=main")
    (upstream / MM_UTILS).write_text("a = 1\nb = 2\n")
    git(upstream, "add", "--all")
    git(upstream, "commit", "--quiet", "-m", "base")
    base = git(upstream, "rev-parse", "HEAD")
    git(upstream, "checkout", "--quiet", "-b", "feature")
    (upstream / MM_UTILS).write_text("a = 1\nb = 3\n")
    git(upstream, "commit", "--quiet", "-am", "change")
    git(upstream, "update-ref", "refs/pull/5/head", "HEAD")
    record = {"name": "src", "git": {"url": str(upstream), "commit": base}}
    source = fetch_source(record, tmp_path / "sources" / "src")
    return source, git(upstream, "rev-parse", "HEAD")


def test_a_pull_request_is_applied_to_a_git_source(pull_request_5, tmp_path, caplog):
    source, head = pull_request_5
    variant = {"name": "pr5", "source": "src", "pull_request": 5}

    identity = prepare_variant(
        variant, tmp_path / "sources" / "src", source, None, tmp_path / "pr5"
    )

    assert (tmp_path / "pr5" / MM_UTILS).read_text() == "a = 1\nb = 3\n"
    assert identity["pull_request"]["head_commit"] == head
    assert identity["pull_request"]["merge_base"] == source["commit"]
    kept = tmp_path / "pr5" / identity["pull_request"]["file"]
    assert file_sha256(kept) == identity["pull_request"]["sha256"]
    # Not pinned: applied as it stands, with the head to pin named.
    assert identity["pull_request"]["pinned_head"] is None
    assert f"pin it with pull_request_head: {head}" in caplog.text


def test_a_pull_request_pinned_to_its_head_is_applied(pull_request_5, tmp_path):
    source, head = pull_request_5
    variant = {
        "name": "pr5",
        "source": "src",
        "pull_request": 5,
        "pull_request_head": head,
    }

    identity = prepare_variant(
        variant, tmp_path / "sources" / "src", source, None, tmp_path / "pr5"
    )

    assert identity["pull_request"]["pinned_head"] == head
    assert (tmp_path / "pr5" / MM_UTILS).read_text() == "a = 1\nb = 3\n"


def test_a_pull_request_whose_head_moved_builds_nothing(pull_request_5, tmp_path):
    source, head = pull_request_5
    pinned = "1" * 40
    variant = {
        "name": "pr5",
        "source": "src",
        "pull_request": 5,
        "pull_request_head": pinned,
    }

    with pytest.raises(SourceMismatch) as raised:
        prepare_variant(
            variant, tmp_path / "sources" / "src", source, None, tmp_path / "pr5"
        )

    assert f"its head is commit {head}, but the config pins {pinned}" in str(
        raised.value
    )
    assert not (tmp_path / "pr5").exists()
