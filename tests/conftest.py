"""Fixtures shared across test files: the real SGLang 0.5.23 source, fetched once."""

from pathlib import Path

import pytest

from serving_study.sources import fetch_source, tree_sha256

SGLANG_0_5_23 = {
    "name": "sglang-0.5.23",
    "pypi": {"package": "sglang", "version": "0.5.23"},
}


@pytest.fixture(scope="session")
def sglang_0_5_23(pytestconfig) -> tuple[Path, dict]:
    """The real sglang 0.5.23 source tree and its identity (kept between runs)."""
    tree = pytestconfig.cache.mkdir("sglang-sources") / "sglang-0.5.23"
    wheels = pytestconfig.cache.mkdir("sglang-wheels")
    identity = fetch_source(SGLANG_0_5_23, tree, download_dir=wheels)
    assert tree_sha256(tree / "python") == identity["tree_sha256"], "cache altered"
    return tree, identity
