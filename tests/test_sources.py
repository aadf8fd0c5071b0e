"""Fetching pinned SGLang sources: git commits, local copies, PyPI wheels."""

from __future__ import annotations

import io
import shutil
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from study_helpers import git

from serving_study.files import file_sha256
from serving_study.sources import package_extraction, pypi_source, wheelhouse
from serving_study.sources.fetch import fetch_source, read_identity
from serving_study.sources.git_commands import git_environment
from serving_study.sources.images import assemble_context
from serving_study.sources.pull_request import fetch_pull_request_diff
from serving_study.sources.recorded_files import RecordedFileChanged
from serving_study.sources.source_errors import SourceMismatch, SourceUnavailable

ROOT = Path(__file__).resolve().parents[1]
MM_UTILS = "python/sglang/srt/managers/mm_utils.py"
SGLANG_0_5_23_CP311_SHA256 = (
    "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937"
)


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


# --- pins: a release by the sha256 of its wheels, a pull request by its head ---------


@pytest.fixture
def offline_wheel(tmp_path, monkeypatch) -> Path:
    """A fake sglang 9.9.9 wheel that stands in for PyPI's answer to pip download."""
    wheel = tmp_path / "pypi" / "sglang-9.9.9-cp311-cp311-manylinux_2_34_x86_64.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as bundle:
        bundle.writestr("sglang/__init__.py", "")
        bundle.writestr("sglang/srt/managers/mm_utils.py", "copy = 'pypi'\n")
        bundle.writestr("sglang/multimodal_gen/a.py", "")
        bundle.writestr("sglang/multimodal_gen/b/c.py", "")
        bundle.writestr("sglang/srt/rust_extensions/_server.cpython-311.so", "x")
        bundle.writestr("sglang/srt/rust_extensions/keep.py", "")

    def download(name, package, version, into, download_dir, python_version=None):
        assert (package, version) == ("sglang", "9.9.9")
        return Path(shutil.copy2(wheel, into))

    monkeypatch.setattr(pypi_source, "_download_wheel", download)
    return wheel


def pypi_record(sha256) -> dict:
    pin = {"package": "sglang", "version": "9.9.9", "sha256": sha256}
    return {"name": "sglang-9.9.9", "pypi": pin}


@pytest.mark.parametrize("pinned_as", ["one digest", "a list holding it"])
def test_a_wheel_among_the_pinned_digests_is_accepted(
    offline_wheel, tmp_path, pinned_as
):
    digest = file_sha256(offline_wheel)
    pin = digest if pinned_as == "one digest" else ["0" * 64, digest, "f" * 64]

    identity = fetch_source(pypi_record(pin), tmp_path / "sglang")

    assert identity["sha256"] == digest
    assert identity["file"] == offline_wheel.name
    assert (tmp_path / "sglang" / MM_UTILS).read_text() == "copy = 'pypi'\n"


def test_a_pin_may_leave_package_paths_out_and_the_identity_counts_them(
    offline_wheel, tmp_path
):
    record = pypi_record(file_sha256(offline_wheel))
    record["pypi"]["leave_out"] = ["multimodal_gen", "srt/rust_extensions/_server.*.so"]

    identity = fetch_source(record, tmp_path / "sglang")

    package = tmp_path / "sglang" / "python" / "sglang"
    assert identity["files_left_out"] == {
        "multimodal_gen": 2,
        "srt/rust_extensions/_server.*.so": 1,
    }
    assert not (package / "multimodal_gen").exists()
    assert sorted(p.name for p in (package / "srt" / "rust_extensions").iterdir()) == [
        "keep.py"
    ]
    assert (tmp_path / "sglang" / MM_UTILS).read_text() == "copy = 'pypi'\n"
    # The record is the identity's: a tree laid out otherwise is another source.
    assert identity["record"]["pypi"]["leave_out"] == record["pypi"]["leave_out"]


def test_a_wheel_outside_the_pinned_digests_is_refused_by_name(offline_wheel, tmp_path):
    pinned = ["0" * 64, "f" * 64]

    with pytest.raises(SourceMismatch) as raised:
        fetch_source(pypi_record(pinned), tmp_path / "sglang")

    message = str(raised.value)
    assert message.startswith(
        f"source 'sglang-9.9.9': {offline_wheel.name} has sha256 "
        f"{file_sha256(offline_wheel)}, which is not among the sha256 the config "
        f"pins for sglang 9.9.9: {pinned[0]}, {pinned[1]}."
    )
    assert not (tmp_path / "sglang").exists()


def test_a_pull_request_pinned_to_its_head_is_diffed(upstream):
    repository, (first, second) = upstream
    git(repository, "checkout", "--quiet", "-b", "feature", first)
    head = commit_file(repository, MM_UTILS, "copy = 'pull request'\n", "change")
    git(repository, "update-ref", "refs/pull/7/head", head)
    git(repository, "checkout", "--quiet", "main")

    diff = fetch_pull_request_diff(str(repository), 7, second, pinned_head=head)

    assert diff.head_commit == head
    assert "+copy = 'pull request'" in diff.text


def test_a_pull_request_whose_head_moved_is_refused(upstream):
    repository, (first, second) = upstream
    git(repository, "checkout", "--quiet", "-b", "feature", first)
    pinned = commit_file(repository, MM_UTILS, "copy = 'reviewed'\n", "change")
    moved = commit_file(repository, MM_UTILS, "copy = 'pushed later'\n", "more")
    git(repository, "update-ref", "refs/pull/7/head", moved)
    git(repository, "checkout", "--quiet", "main")

    with pytest.raises(SourceMismatch) as raised:
        fetch_pull_request_diff(str(repository), 7, second, pinned_head=pinned)

    assert str(raised.value).startswith(
        f"pull request #7 of {repository}: its head is commit {moved}, but the "
        f"config pins {pinned} (pull_request_head)."
    )


# --- a fetched tree is checked file by file when it is reused -----------------------


@pytest.fixture
def fetched(upstream, tmp_path) -> tuple[dict, Path]:
    repository, (first, _) = upstream
    record = {"name": "fake", "git": {"url": str(repository), "commit": first}}
    fetch_source(record, tmp_path / "fake")
    return record, tmp_path / "fake"


def test_a_changed_file_of_a_fetched_tree_is_named_on_reuse(fetched):
    record, tree = fetched
    changed = tree / MM_UTILS
    recorded = file_sha256(changed)
    changed.write_text("copy = 'edited in place'\n")

    with pytest.raises(RecordedFileChanged) as raised:
        fetch_source(record, tree)

    assert str(raised.value) == (
        f"{changed} changed since it was recorded (sha256 {recorded} -> "
        f"{file_sha256(changed)}); remove {tree} to fetch it again"
    )


def test_an_added_or_removed_file_of_a_fetched_tree_is_named_on_reuse(fetched):
    record, tree = fetched
    added = tree / "python/sglang/sitecustomize.py"
    added.write_text("import os\n")
    removed = tree / "python/sglang/__init__.py"
    removed.unlink()

    with pytest.raises(RecordedFileChanged) as raised:
        fetch_source(record, tree)

    message = str(raised.value)
    assert message.startswith(f"{removed} was removed since it was recorded (sha256 ")
    assert message.endswith(
        f"(1 more file differ too); remove {tree} to fetch it again"
    )


def test_bytecode_in_a_fetched_tree_is_not_a_change(fetched):
    record, tree = fetched
    identity = read_identity(tree)
    bytecode = tree / "python/sglang/__pycache__/__init__.cpython-311.pyc"
    bytecode.parent.mkdir()
    bytecode.write_bytes(b"written by an import")

    assert fetch_source(record, tree) == identity


def fake_pip_download(command, **_):
    """Write one wheel per line of the lock where ``pip download --dest`` would."""
    dest = Path(command[command.index("--dest") + 1])
    lock = Path(command[command.index("--requirement") + 1])
    pins = [line.split()[0] for line in lock.read_text().splitlines()]
    for name, version in (pin.split("==") for pin in pins):
        (dest / f"{name}-{version}-py3-none-any.whl").write_bytes(
            b"wheel of " + name.encode()
        )
    return subprocess.CompletedProcess(command, 0, "", "")


def test_a_changed_wheel_of_a_wheelhouse_is_named_when_an_image_takes_it(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(wheelhouse.subprocess, "run", fake_pip_download)
    lock = tmp_path / "requirements.lock"
    digest = " --hash=sha256:" + "0" * 64
    lock.write_text(f"six==1.17.0{digest}\nidna==3.10{digest}\n")
    made = tmp_path / "wheelhouse"
    manifest = wheelhouse.make_wheelhouse(
        lock, made, python_version="3.11", glibc_version="2.36", closed=True
    )
    assert sorted(manifest["files"]) == [
        "idna-3.10-py3-none-any.whl",
        "requirements.txt",
        "six-1.17.0-py3-none-any.whl",
    ]
    variant = {"name": "v", "sglang_python_root": str(tmp_path / "variant/python")}
    (tmp_path / "variant/python/sglang").mkdir(parents=True)
    # Snakemake marks a directory output with a file of its own: not a change.
    (made / ".snakemake_timestamp").write_text("")
    wheelhouse.require_wheelhouse_unchanged(made)
    changed = made / "six-1.17.0-py3-none-any.whl"
    changed.write_bytes(b"another wheel")

    with pytest.raises(RecordedFileChanged) as raised:
        assemble_context(
            "sglang-cpu",
            variant,
            tmp_path / "context",
            dockerfile=ROOT / "envs/Dockerfile.sglang-cpu",
            verify_script=ROOT / "envs/verify_mm_utils.py",
            wheelhouse=made,
        )

    recorded = manifest["files"][changed.name]
    assert str(raised.value) == (
        f"{changed} changed since it was recorded (sha256 {recorded} -> "
        f"{file_sha256(changed)}); remove {made} to download it again"
    )


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


def test_an_archive_larger_than_any_release_is_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(package_extraction, "MAX_MEMBERS", 3)
    monkeypatch.setattr(package_extraction, "MAX_BYTES", 1 << 20)
    many = tmp_path / "sglang-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(many, "w") as bundle:
        for index in range(4):
            bundle.writestr(f"sglang/m{index}.py", "")
    big = tmp_path / "sglang-9.9.9.tar.gz"
    with tarfile.open(big, "w:gz") as bundle:
        member = tarfile.TarInfo("sglang-9.9.9/sglang/__init__.py")
        member.size = 2 << 20  # compresses to almost nothing
        bundle.addfile(member, io.BytesIO(b"\0" * member.size))
    for archive in (many, big):
        with pytest.raises(SourceMismatch, match="more than any SGLang release"):
            fetch_source({"name": "bomb", "path": str(archive)}, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_git_is_held_to_the_usual_transports(monkeypatch):
    monkeypatch.setenv("GIT_ALLOW_PROTOCOL", "ext:https")  # a user's lifted limit
    assert git_environment()["GIT_ALLOW_PROTOCOL"] == "https:http:ssh:git:file"
