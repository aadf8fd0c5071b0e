"""Fetching pinned SGLang sources: git commits, local copies, PyPI wheels."""

from __future__ import annotations

import io
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from serving_study.sources.fetch import fetch_source, read_identity
from serving_study.sources.files import file_sha256
from serving_study.sources.pull_request import fetch_pull_request_diff
from serving_study.sources.source_errors import SourceMismatch, SourceUnavailable

MM_UTILS = "python/sglang/srt/managers/mm_utils.py"
SGLANG_0_5_23_CP311_SHA256 = (
    "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937"
)


def git(repository: Path, *arguments: str) -> str:
    result = subprocess.run(
        [
            "git",
            "-c",
            "user.name=test",
            "-c",
            "user.email=test@example.org",
            *arguments,
        ],
        cwd=repository,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip()


def commit_file(repository: Path, relative: str, text: str, message: str) -> str:
    path = repository / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    git(repository, "add", "--all")
    git(repository, "commit", "--quiet", "-m", message)
    return git(repository, "rev-parse", "HEAD")


@pytest.fixture
def upstream(tmp_path: Path) -> tuple[Path, list[str]]:
    """A small repository laid out as SGLang's, with two commits of mm_utils.py."""
    repository = tmp_path / "upstream"
    repository.mkdir()
    git(repository, "init", "--quiet", "--initial-branch=main")
    commit_file(repository, "README.md", "not the package\n", "readme")
    commit_file(repository, "python/sglang/__init__.py", "", "package")
    first = commit_file(repository, MM_UTILS, "copy = 'first'\n", "first")
    second = commit_file(repository, MM_UTILS, "copy = 'second'\n", "second")
    return repository, [first, second]


def leftovers(directory: Path) -> list[str]:
    return sorted(
        path.name for path in directory.iterdir() if path.name.startswith(".")
    )


def test_git_source_is_laid_out_at_the_pinned_commit(upstream, tmp_path):
    repository, (first, _) = upstream
    record = {"name": "fake", "git": {"url": str(repository), "commit": first}}

    identity = fetch_source(record, tmp_path / "sources" / "fake")

    tree = tmp_path / "sources" / "fake"
    assert (tree / MM_UTILS).read_text() == "copy = 'first'\n"
    assert not (tree / "README.md").exists()  # only the python/ folder
    assert not (tree / ".git").exists()
    assert identity["kind"] == "git"
    assert identity["commit"] == first
    assert identity["url"] == str(repository)
    assert identity["python_files"] == 2
    assert read_identity(tree) == identity
    assert leftovers(tmp_path / "sources") == []


def test_git_source_accepts_a_relative_local_path(upstream, tmp_path, monkeypatch):
    repository, (_, second) = upstream
    monkeypatch.chdir(tmp_path)
    record = {"name": "fake", "git": {"url": "upstream", "commit": second}}

    fetch_source(record, tmp_path / "fake")

    assert (tmp_path / "fake" / MM_UTILS).read_text() == "copy = 'second'\n"


def test_a_fetched_source_is_reused_without_the_network(upstream, tmp_path):
    repository, (first, _) = upstream
    record = {"name": "fake", "git": {"url": str(repository), "commit": first}}
    identity = fetch_source(record, tmp_path / "fake")
    (repository / ".git").rename(repository / "moved-away")  # upstream now unreachable

    assert fetch_source(record, tmp_path / "fake") == identity
    other = {"name": "fake", "git": {"url": str(repository), "commit": "1" * 40}}
    with pytest.raises(SourceUnavailable):
        fetch_source(other, tmp_path / "fake")
    assert (tmp_path / "fake" / MM_UTILS).read_text() == "copy = 'first'\n"


def test_a_commit_missing_upstream_fails_and_leaves_nothing(upstream, tmp_path):
    repository, _ = upstream
    missing = "0123456789abcdef0123456789abcdef01234567"
    record = {"name": "fake", "git": {"url": str(repository), "commit": missing}}

    with pytest.raises(SourceMismatch, match=f"commit {missing} was not found"):
        fetch_source(record, tmp_path / "sources" / "fake")

    assert not (tmp_path / "sources" / "fake").exists()
    assert leftovers(tmp_path / "sources") == []


def test_an_abbreviated_commit_resolves_and_the_full_sha_is_recorded(
    upstream, tmp_path
):
    repository, (first, _) = upstream
    record = {"name": "fake", "git": {"url": str(repository), "commit": first[:8]}}

    identity = fetch_source(record, tmp_path / "fake")

    assert identity["commit"] == first


def test_a_commit_without_the_package_is_refused(upstream, tmp_path):
    repository, _ = upstream
    readme_only = git(repository, "rev-list", "--max-parents=0", "HEAD")
    record = {"name": "fake", "git": {"url": str(repository), "commit": readme_only}}

    with pytest.raises(SourceMismatch, match="has no python/sglang folder"):
        fetch_source(record, tmp_path / "fake")


@pytest.mark.parametrize(
    "url", ["/nonexistent/sglang.git", "https://127.0.0.1:9/sgl-project/sglang.git"]
)
def test_an_unreachable_repository_says_how_to_use_a_local_copy(url, tmp_path):
    record = {"name": "sglang-base", "git": {"url": url, "commit": "a" * 40}}

    with pytest.raises(SourceUnavailable) as raised:
        fetch_source(record, tmp_path / "sglang-base")

    message = str(raised.value)
    assert "sglang-base" in message and url in message and "path:" in message
    assert not (tmp_path / "sglang-base").exists()


def test_a_local_directory_keeps_the_package_without_bytecode(tmp_path):
    checkout = tmp_path / "checkout"
    for relative, content in {
        "sglang/__init__.py": b"",
        "sglang/srt/managers/mm_utils.py": b"copy = 'local'\n",
        "sglang/srt/kernels.so": b"\x7fELF",
        "sglang/srt/__pycache__/x.cpython-311.pyc": b"bytecode",
    }.items():
        (checkout / relative).parent.mkdir(parents=True, exist_ok=True)
        (checkout / relative).write_bytes(content)

    identity = fetch_source({"name": "mine", "path": str(checkout)}, tmp_path / "out")

    files = sorted(
        p.relative_to(tmp_path / "out").as_posix()
        for p in (tmp_path / "out" / "python").rglob("*")
        if p.is_file()
    )
    # A real server imports the compiled extensions; bytecode is rebuilt.
    assert files == [
        "python/sglang/__init__.py",
        "python/sglang/srt/kernels.so",
        MM_UTILS,
    ]
    assert identity["kind"] == "path" and identity["sha256"] is None


def test_a_local_wheel_is_unpacked_to_the_repository_layout(tmp_path):
    wheel = tmp_path / "sglang-9.9.9-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as bundle:
        bundle.writestr("sglang/__init__.py", "")
        bundle.writestr("sglang/srt/managers/mm_utils.py", "copy = 'wheel'\n")
        bundle.writestr("sglang/srt/native.cpython-311-x86_64-linux-gnu.so", "\x7fELF")
        bundle.writestr("sglang-9.9.9.dist-info/METADATA", "Name: sglang\n")

    identity = fetch_source({"name": "w", "path": str(wheel)}, tmp_path / "out")

    out = tmp_path / "out"
    assert (out / MM_UTILS).read_text() == "copy = 'wheel'\n"
    # The package whole (a real server imports its compiled extensions), and
    # nothing of the wheel beside it.
    assert [path.name for path in out.rglob("*.so")] == [
        "native.cpython-311-x86_64-linux-gnu.so"
    ]
    assert not (out / "python" / "sglang-9.9.9.dist-info").exists()
    assert (out / "archive" / wheel.name).read_bytes() == wheel.read_bytes()
    assert identity["sha256"] == file_sha256(wheel)


def test_a_missing_local_path_is_unavailable(tmp_path):
    with pytest.raises(SourceUnavailable, match="does not exist"):
        fetch_source({"name": "gone", "path": str(tmp_path / "gone")}, tmp_path / "o")


def test_pypi_unreachable_says_how_to_use_a_local_wheel(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    record = {
        "name": "sglang-0.5.23",
        "pypi": {"package": "sglang", "version": "0.5.23"},
    }

    with pytest.raises(SourceUnavailable) as raised:
        fetch_source(record, tmp_path / "sglang")

    message = str(raised.value)
    assert "sglang==0.5.23" in message and "path:" in message
    assert "the package index could not be reached" in message
    assert not (tmp_path / "sglang").exists()


def test_pull_request_diff_is_taken_against_its_merge_base(upstream):
    repository, (first, second) = upstream
    git(repository, "checkout", "--quiet", "-b", "feature", first)
    commit_file(repository, MM_UTILS, "copy = 'pull request'\n", "the change")
    commit_file(repository, "docs/notes.md", "outside python/\n", "docs")
    git(repository, "update-ref", "refs/pull/7/head", "HEAD")
    git(repository, "checkout", "--quiet", "main")

    diff = fetch_pull_request_diff(str(repository), 7, second)

    assert diff.merge_base == first
    assert diff.head_commit == git(repository, "rev-parse", "feature")
    assert "+copy = 'pull request'" in diff.text
    assert "-copy = 'first'" in diff.text  # against the merge base, not the base
    assert "docs/notes.md" not in diff.text


def test_a_missing_pull_request_is_named(upstream):
    repository, (_, second) = upstream
    with pytest.raises(SourceMismatch, match="pull request #404"):
        fetch_pull_request_diff(str(repository), 404, second)


@pytest.mark.slow
def test_sglang_0_5_23_from_pypi(tmp_path, pytestconfig):
    wheels = pytestconfig.cache.mkdir("sglang-wheels")
    for cached in wheels.glob("sglang-0.5.23-*.whl"):
        cached.unlink()  # this test is about the download itself
    record = {
        "name": "sglang-0.5.23",
        "pypi": {"package": "sglang", "version": "0.5.23"},
    }
    if sys.version_info[:2] == (3, 11):
        record["pypi"]["sha256"] = SGLANG_0_5_23_CP311_SHA256

    identity = fetch_source(record, tmp_path / "sglang", download_dir=wheels)

    tree = tmp_path / "sglang"
    assert identity["kind"] == "pypi" and identity["version"] == "0.5.23"
    assert (wheels / identity["file"]).is_file()
    assert file_sha256(wheels / identity["file"]) == identity["sha256"]
    assert "class ShmPointerMMData" in (tree / MM_UTILS).read_text()
    # The wheel whole: the real server imports its Rust extensions.
    assert (tree / "python/sglang/srt/rust_extensions").is_dir()
    assert list(tree.glob("python/sglang/srt/rust_extensions/*.so"))
    assert identity["python_files"] > 4000


def test_a_local_path_is_copied_afresh_each_time(tmp_path):
    checkout = tmp_path / "checkout" / "sglang"
    checkout.mkdir(parents=True)
    (checkout / "__init__.py").write_text("version = 1\n")
    record = {"name": "mine", "path": str(checkout.parent)}
    fetch_source(record, tmp_path / "out")
    (checkout / "__init__.py").write_text("version = 2\n")

    fetch_source(record, tmp_path / "out")

    assert (tmp_path / "out/python/sglang/__init__.py").read_text() == "version = 2\n"


def test_a_relative_destination_works_for_a_git_source(upstream, tmp_path, monkeypatch):
    repository, (first, _) = upstream
    record = {"name": "fake", "git": {"url": str(repository), "commit": first}}
    monkeypatch.chdir(tmp_path)

    identity = fetch_source(record, Path("sources") / "fake")

    assert identity["commit"] == first
    assert (tmp_path / "sources" / "fake" / "python" / "sglang").is_dir()


# --- hostile values: read as values, never as options; nothing leaves the tree -------


def test_a_git_url_that_looks_like_an_option_is_only_a_url(tmp_path):
    marker = tmp_path / "upload-pack-ran"
    url = f"--upload-pack=touch {marker}"
    record = {"name": "hostile", "git": {"url": url, "commit": "a" * 40}}

    with pytest.raises(SourceUnavailable) as raised:
        fetch_source(record, tmp_path / "sources" / "hostile")

    assert f"cannot reach {url}" in str(raised.value)
    assert not marker.exists()
    assert not (tmp_path / "sources" / "hostile").exists()


def test_a_git_commit_that_looks_like_an_option_is_refused(upstream, tmp_path):
    repository, _ = upstream
    record = {"name": "fake", "git": {"url": str(repository), "commit": "--all"}}

    with pytest.raises(SourceMismatch) as raised:
        fetch_source(record, tmp_path / "fake")

    assert str(raised.value) == (
        "source 'fake': git.commit '--all' is not a commit sha (7 to 40 hex digits)"
    )
    assert not (tmp_path / "fake").exists()


def test_a_pypi_package_that_looks_like_an_option_is_only_a_requirement(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    log = tmp_path / "pip-log"
    record = {"name": "hostile", "pypi": {"package": f"--log={log}", "version": "1"}}

    with pytest.raises(SourceUnavailable) as raised:
        fetch_source(record, tmp_path / "sources" / "hostile")

    assert f"could not download --log={log}==1" in str(raised.value)
    assert list(tmp_path.glob("pip-log*")) == []  # pip never read it as --log
    assert not (tmp_path / "sources" / "hostile").exists()


def tar_member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tuple:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info, b"" if kind != tarfile.REGTYPE else b"escaped = True\n"


def write_sdist(path: Path, hostile: tuple) -> Path:
    """An sdist (sglang-9.9.9/sglang/...) with one hostile member after the package."""
    with tarfile.open(path, "w:gz") as bundle:
        for info, content in (tar_member("sglang-9.9.9/sglang/__init__.py"), hostile):
            info.size = len(content)
            bundle.addfile(info, io.BytesIO(content))
    return path


def write_wheel(path: Path, name: str, symlink_to: str | None = None) -> Path:
    """A wheel with the package and one more member; ``symlink_to`` makes it a
    symlink (a zip keeps a link's target as its content, its type in the mode)."""
    with zipfile.ZipFile(path, "w") as bundle:
        bundle.writestr("sglang/__init__.py", "")
        info = zipfile.ZipInfo(name)
        if symlink_to is None:
            bundle.writestr(info, "escaped = True\n")
        else:
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            bundle.writestr(info, symlink_to)
    return path


# Each hostile archive, made in a directory whose "outside/" it tries to write to
# (the tree is built in work/.out.staging-*/python/).
HOSTILE_ARCHIVES = {
    "sdist member with '..' parts": lambda d: write_sdist(
        d / "sglang-9.9.9.tar.gz",
        tar_member("sglang-9.9.9/sglang/../../../../outside/escaped.py"),
    ),
    "sdist member with an absolute path": lambda d: write_sdist(
        d / "sglang-9.9.9.tar.gz", tar_member(f"{d}/outside/escaped.py")
    ),
    "sdist symlink to /etc": lambda d: write_sdist(
        d / "sglang-9.9.9.tar.gz",
        tar_member("sglang-9.9.9/sglang/etc", tarfile.SYMTYPE, "/etc"),
    ),
    "sdist symlink up out of the tree": lambda d: write_sdist(
        d / "sglang-9.9.9.tar.gz",
        tar_member("sglang-9.9.9/sglang/up", tarfile.SYMTYPE, "../../../outside"),
    ),
    "sdist hard link to a file outside": lambda d: write_sdist(
        d / "sglang-9.9.9.tar.gz",
        tar_member("sglang-9.9.9/sglang/passwd", tarfile.LNKTYPE, "../etc/passwd"),
    ),
    "wheel member with '..' parts": lambda d: write_wheel(
        d / "sglang-9.9.9-py3-none-any.whl", "sglang/../../../../outside/escaped.py"
    ),
    "wheel member with an absolute path": lambda d: write_wheel(
        d / "sglang-9.9.9-py3-none-any.whl", f"{d}/outside/escaped.py"
    ),
    "wheel symlink to /etc": lambda d: write_wheel(
        d / "sglang-9.9.9-py3-none-any.whl", "sglang/etc", symlink_to="/etc"
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_ARCHIVES))
def test_an_archive_member_leaving_the_tree_refuses_the_archive(case, tmp_path):
    (tmp_path / "outside").mkdir()
    archive = HOSTILE_ARCHIVES[case](tmp_path)
    if archive.suffix == ".gz":
        with tarfile.open(archive) as bundle:
            member = bundle.getnames()[-1]
    else:
        with zipfile.ZipFile(archive) as bundle:
            member = bundle.namelist()[-1]

    with pytest.raises(SourceMismatch) as raised:
        fetch_source({"name": "hostile", "path": str(archive)}, tmp_path / "work/out")

    message = str(raised.value)
    assert message.startswith(f"{archive.name} has an unsafe member {member!r} (")
    assert "\n" not in message
    assert list((tmp_path / "outside").iterdir()) == []
    assert list((tmp_path / "work").iterdir()) == []  # no tree, no staging left


def test_a_doubled_slash_in_a_wheel_member_stays_inside_the_tree(tmp_path):
    outside = tmp_path / "outside" / "escaped.py"
    # "sglang//<tmp>/outside/escaped.py": joined naively, an absolute path.
    wheel = write_wheel(tmp_path / "sglang-9.9.9-py3-none-any.whl", f"sglang/{outside}")

    fetch_source({"name": "w", "path": str(wheel)}, tmp_path / "out")

    assert not outside.exists()
    inside = tmp_path / "out/python/sglang" / outside.relative_to("/")
    assert inside.read_text() == "escaped = True\n"


def test_a_git_commit_linking_out_of_the_tree_is_refused(upstream, tmp_path):
    repository, _ = upstream
    (repository / "python/sglang/etc").symlink_to("/etc")
    git(repository, "add", "--all")
    git(repository, "commit", "--quiet", "-m", "a link out")
    commit = git(repository, "rev-parse", "HEAD")
    record = {"name": "fake", "git": {"url": str(repository), "commit": commit}}

    with pytest.raises(SourceMismatch) as raised:
        fetch_source(record, tmp_path / "sources" / "fake")

    message = str(raised.value)
    assert message.startswith(f"source 'fake': the git archive of {commit} in ")
    assert "'python/sglang/etc' is a link to an absolute path" in message
    assert "\n" not in message
    assert list((tmp_path / "sources").iterdir()) == []
