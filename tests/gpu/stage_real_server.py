"""Make what config/gpu-host-real.yaml needs on our GPU host, in parts that each
fit one call to it.

    python tests/gpu/stage_real_server.py [--budget-mib N]

Run from the project root, where PyPI is reachable. The GPU host has no network,
and each call to it carries at most 64 MiB, the working tree (tracked and
untracked files that git does not ignore) included. This writes
``.device/real/`` (git-ignored):

- ``sources.tar.xz``: the config's SGLang source as rule ``fetch_source`` lays it
  out under ``resources/sources/<name>-<hash>/`` (its ``identity.json`` and
  ``tree/``), fetched here for the host's CPython 3.12 from the pinned wheel
  (its sha256 checked against the config's), less the paths its ``leave_out``
  names, and less the kept wheel itself (``tree/archive/``, 39 MB);
- the wheels of ``envs/sglang-gpu-host/requirements.lock`` (what the server lacks
  there) and ``workflow.lock`` (Snakemake), for CPython 3.12 on Linux x86-64,
  each checked against its lock's sha256 as pip downloads it;
- ``part-1/``, ``part-2/``, ...: those files, each part no larger than the
  budget (64 MiB less the working tree and a margin, unless given; a file larger
  than that travels in pieces, ``NAME.piece-I-of-N``), each with
  ``manifest.json``: every file's size and sha256, and its pieces' parts.

``tests/gpu/real_server_on_gpu_host.py`` on the host takes the parts as they
come, one call each, and starts once all are there (docs/gpu-hosts.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
from serving_study.config.content_keys import content_key  # noqa: E402
from serving_study.config.validation import check_config  # noqa: E402
from serving_study.sources.fetch import fetch_source  # noqa: E402

CONFIG = ROOT / "config" / "gpu-host-real.yaml"
STAGE = ROOT / ".device" / "real"
LOCKS = (
    ROOT / "envs" / "sglang-gpu-host" / "requirements.lock",
    ROOT / "envs" / "sglang-gpu-host" / "workflow.lock",
)
PYTHON_VERSION = "3.12"
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(39, 4, -1)]
PLATFORMS += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
MIB = 1 << 20
CALL_LIMIT = 64 * MIB
# Room for what changes in the tree between staging and the call.
MARGIN = 2 * MIB


def checked_config() -> dict:
    schema = ROOT / "config" / "schema" / "config.schema.yaml"
    raw = yaml.safe_load(CONFIG.read_text())
    return check_config(raw, schema, [str(CONFIG)], ROOT)


def working_tree_bytes() -> int:
    """What every call carries besides its carried paths."""
    listed = []
    for extra in ([], ["--others", "--exclude-standard"]):
        found = subprocess.run(
            ["git", "ls-files", "-z", *extra],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.split(b"\0")
        listed += [name.decode() for name in found if name]
    return sum(
        (ROOT / name).stat().st_size for name in listed if (ROOT / name).is_file()
    )


def stage_source(record: dict, into: Path) -> Path:
    """The source laid out as fetch_source lays it out, packed without its wheel."""
    key = content_key(record["name"], record)
    folder = ROOT / "resources" / "stage-sources" / key
    identity = fetch_source(
        record,
        folder / "tree",
        download_dir=ROOT / "resources" / "downloads",
        python_version=PYTHON_VERSION,
    )
    (folder / "identity.json").write_text(json.dumps(identity, indent=2) + "\n")
    packed = into / "sources.tar.xz"
    with tarfile.open(packed, "w:xz", preset=6) as bundle:
        bundle.add(
            folder,
            arcname=key,
            filter=lambda member: (
                None if f"{key}/tree/archive" in member.name else member
            ),
        )
    print(f"{packed.name}: {identity['file']} less {identity.get('files_left_out')}")
    return packed


def stage_wheels(into: Path) -> list[Path]:
    """Every wheel of the two locks, downloaded for CPython 3.12 and checked."""
    wheels = into / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for lock in LOCKS:
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet"]
        argv += ["--require-hashes", "--only-binary=:all:"]
        argv += ["--python-version", PYTHON_VERSION, "--implementation", "cp"]
        argv += [f"--platform={tag}" for tag in PLATFORMS]
        argv += ["--dest", str(wheels), "--requirement", str(lock)]
        subprocess.run(argv, check=True)
    return sorted(wheels.glob("*.whl"))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pieces_of(path: Path, budget: int) -> list[Path]:
    """``path`` itself, or its bytes in pieces of at most ``budget`` (it is gone)."""
    size = path.stat().st_size
    if size <= budget:
        return [path]
    count = -(-size // budget)
    pieces = []
    with path.open("rb") as whole:
        for number in range(1, count + 1):
            piece = path.with_name(f"{path.name}.piece-{number}-of-{count}")
            piece.write_bytes(whole.read(-(-size // count)))
            pieces.append(piece)
    path.unlink()
    return pieces


def parts_of(files: list[Path], budget: int) -> list[list[Path]]:
    """Files into parts of at most ``budget`` bytes, largest first (first fit)."""
    parts: list[list[Path]] = []
    sizes: list[int] = []
    for path in sorted(files, key=lambda file: file.stat().st_size, reverse=True):
        size = path.stat().st_size
        for index, used in enumerate(sizes):
            if used + size <= budget:
                parts[index].append(path)
                sizes[index] += size
                break
        else:
            parts.append([path])
            sizes.append(size)
    return parts


def write_parts(files: list[Path], budget: int, stage: Path) -> list[Path]:
    """``files`` (moved) into ``stage/part-<n>/`` folders of at most ``budget``
    bytes, each with the manifest of them all; returns the folders."""
    wholes = {path.name: (path.stat().st_size, sha256(path)) for path in files}
    pieces = {path.name: pieces_of(path, budget) for path in files}
    parts = parts_of([piece for found in pieces.values() for piece in found], budget)
    part_of = {
        path.name: number for number, part in enumerate(parts, 1) for path in part
    }
    manifest = {
        "config": str(CONFIG.relative_to(ROOT)),
        "parts": len(parts),
        "files": {
            name: {
                "size": size,
                "sha256": digest,
                "pieces": [[piece.name, part_of[piece.name]] for piece in pieces[name]],
            }
            for name, (size, digest) in wholes.items()
        },
    }
    folders = []
    for number, part in enumerate(parts, 1):
        folder = stage / f"part-{number}"
        folder.mkdir(parents=True)
        for path in part:
            shutil.move(path, folder / path.name)
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        folders.append(folder)
    return folders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-mib", type=float, help="the most one part holds")
    arguments = parser.parse_args()
    tree = working_tree_bytes()
    budget = int(
        arguments.budget_mib * MIB
        if arguments.budget_mib
        else CALL_LIMIT - tree - MARGIN
    )
    print(
        f"working tree {tree / MIB:.1f} MiB: each part at most {budget / MIB:.1f} MiB"
    )
    shutil.rmtree(STAGE, ignore_errors=True)
    build = STAGE / "build"
    build.mkdir(parents=True)
    config = checked_config()
    files = [stage_source(record, build) for record in config["sources"]]
    files += stage_wheels(build)
    for folder in write_parts(files, budget, STAGE):
        size = sum(path.stat().st_size for path in folder.iterdir())
        count = len(list(folder.iterdir())) - 1
        print(f"{folder.relative_to(ROOT)}: {count} files, {size / MIB:.1f} MiB")
    shutil.rmtree(build)


if __name__ == "__main__":
    main()
