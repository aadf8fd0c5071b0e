"""Carrying config/gpu-host-real.yaml to our GPU host and back, on CPU.

The host has no network and takes 64 MiB a call: ``tests/gpu/stage_real_server.py``
splits what it needs into parts (a file larger than a part in pieces), and
``tests/gpu/real_server_on_gpu_host.py`` there joins them once all have come,
chooses the runs that fit a call in their block order, and packs the results so
that ``tests/gpu/restore_real_server.py`` can resume on a fresh host: the large
folders made again from their records, every timestamp Snakemake reads kept.
"""

import importlib.util
import json
import os
import tarfile
from pathlib import Path

import pytest

from serving_study.config.arm_order import execution_order
from serving_study.config.records import Workload
from serving_study.workloads import generate_workload

ROOT = Path(__file__).resolve().parents[1]


def tool(name: str):
    spec = importlib.util.spec_from_file_location(
        name, ROOT / "tests" / "gpu" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


stage = tool("stage_real_server")
driver = tool("real_server_on_gpu_host")
restore = tool("restore_real_server")


def test_parts_fit_the_budget_and_the_host_joins_them_once_all_have_come(
    tmp_path, monkeypatch
):
    build = tmp_path / "build"
    build.mkdir()
    contents = {
        "big.whl": os.urandom(2500),
        "a.whl": b"a" * 700,
        "b.tar.xz": b"b" * 900,
    }
    for name, data in contents.items():
        (build / name).write_bytes(data)
    folders = stage.write_parts(sorted(build.iterdir()), 1000, tmp_path / "real")

    for folder in folders:
        carried = [path for path in folder.iterdir() if path.name != "manifest.json"]
        assert sum(path.stat().st_size for path in carried) <= 1000
    manifest = json.loads((folders[0] / "manifest.json").read_text())
    assert [piece for piece, _ in manifest["files"]["big.whl"]["pieces"]] == [
        f"big.whl.piece-{number}-of-3" for number in (1, 2, 3)
    ]

    monkeypatch.setattr(driver, "STAGE", tmp_path / "real")
    last = folders[-1]
    held_back = tmp_path / "held-back"
    last.rename(held_back)
    _, missing = driver.staged_files()
    assert missing == [len(folders)]
    held_back.rename(last)
    files, missing = driver.staged_files()
    assert missing == []
    assert {name: path.read_bytes() for name, path in files.items()} == contents


def results_of(root: Path, config: dict, done: dict) -> None:
    for (arm, run), wall in done.items():
        folder = root / "results" / config["experiment"] / arm / f"run{run}"
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text("{}")
        (folder / "provenance.json").write_text(json.dumps({"wall_s": wall}))


CONFIG = {
    "experiment": "real",
    "seed": 7,
    "arms": [{"name": name, "runs": 2} for name in ("A", "B", "C")],
}


def test_a_call_takes_the_next_runs_in_block_order_that_fit_its_time(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(driver, "ROOT", tmp_path)
    order = execution_order({"A": 2, "B": 2, "C": 2}, 7)

    chosen, plan = driver.targets(CONFIG, 600)
    # Nothing prepared yet: the preparation and the first cold runs' pace.
    fits = int((600 - driver.SNAKEMAKE_START_S - driver.PREPARATION_S) // 130)
    assert plan["chosen"] == [f"{arm}/run{run}" for arm, run in order[:fits]]
    assert chosen[0] == f"results/real/{order[0][0]}/run{order[0][1]}/metrics.json"

    results_of(tmp_path, CONFIG, {order[0]: 90.0, order[1]: 100.0, order[2]: 80.0})
    (tmp_path / "results" / "real" / "commands").mkdir()
    chosen, plan = driver.targets(CONFIG, 320)
    assert plan["pace_s"] == 90.0 and plan["done"] == 3
    assert plan["chosen"] == [f"{arm}/run{run}" for arm, run in order[3:6]]

    chosen, plan = driver.targets(CONFIG, 600)
    # The last runs fit: the tables come after them in the same call.
    assert plan["chosen"] == [f"{arm}/run{run}" for arm, run in order[3:]]
    assert chosen[-1] == "results/real/tables/arms.csv" and len(chosen) == 4

    results_of(tmp_path, CONFIG, dict.fromkeys(order[3:], 60.0))
    chosen, plan = driver.targets(CONFIG, 320)
    assert chosen == ["results/real/tables/arms.csv"] and plan["done"] == 6


def test_the_results_travel_without_what_is_made_again_and_keep_their_mtimes(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(driver, "ROOT", tmp_path)
    results = tmp_path / "results" / "real"
    kept = [
        results / "A" / "run1" / "metrics.json",
        results / "variants" / "original.json",
        results / "variants" / "original" / "source" / ".snakemake_timestamp",
        results / "workloads" / "w" / "images" / ".snakemake_timestamp",
        tmp_path / "resources" / "tiny-models" / "m" / "snapshot.json",
        tmp_path / ".snakemake" / "metadata" / "cmVzdWx0cw==",
    ]
    remade = [
        results / "variants" / "original" / "source" / "python" / "sglang" / "x.py",
        results / "workloads" / "w" / "images" / "000000.jpg",
    ]
    for number, path in enumerate(kept + remade):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
        os.utime(path, (1_700_000_000.25 + number, 1_700_000_000.75 + number))

    driver.pack_results("real", tmp_path)

    with tarfile.open(tmp_path / "results.tar.gz") as bundle:
        members = {member.name: member for member in bundle.getmembers()}
    assert sorted(members) == sorted(str(path.relative_to(tmp_path)) for path in kept)
    for path in kept:
        assert members[str(path.relative_to(tmp_path))].mtime == path.stat().st_mtime


def test_a_fresh_host_makes_the_workload_again_as_recorded_keeping_its_timestamp(
    tmp_path, monkeypatch
):
    workload = {
        "name": "w",
        "seed": 3,
        "images": 3,
        "width": 64,
        "height": 64,
        "format": "jpeg",
        "content": "noise",
        "input_tokens": 8,
    }
    results = tmp_path / "results" / "real"
    folder = results / "workloads" / "w"
    manifest = generate_workload(Workload.from_config(workload).as_config(), folder)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    stamp = folder / "images" / ".snakemake_timestamp"
    stamp.touch()
    for image in (folder / "images").glob("*.jpg"):
        image.unlink()  # as a fresh host has it: the folder and its timestamp
    os.utime(stamp, (1_700_000_000.5, 1_700_000_000.5))

    restore.restore_workloads({"workloads": [workload]}, results)

    for image in manifest["images"]:
        assert (folder / image["file"]).is_file(), image["file"]
    assert stamp.stat().st_mtime == 1_700_000_000.5

    manifest["images"][0]["sha256"] = "0" * 64
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SystemExit, match="workload w: not as recorded"):
        restore.restore_workloads({"workloads": [workload]}, results)


def test_a_fresh_host_makes_each_variant_again_as_recorded_keeping_its_timestamp(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(restore, "ROOT", tmp_path)
    source = {"name": "s", "path": "/elsewhere"}
    folder = tmp_path / "resources" / "sources" / restore.content_key("s", source)
    module = folder / "tree" / "python" / "sglang" / "srt" / "managers" / "mm_utils.py"
    module.parent.mkdir(parents=True)
    module.write_text("copy = 'original'\n")
    (folder / "identity.json").write_text(json.dumps({"name": "s", "kind": "path"}))
    config = {"sources": [source], "variants": [{"name": "original", "source": "s"}]}
    results = tmp_path / "results" / "real"
    tree = results / "variants" / "original" / "source"
    recorded = restore.prepare_variant(
        {"name": "original", "source": "s"},
        source_tree=folder / "tree",
        source_identity={"name": "s", "kind": "path"},
        patch_path=None,
        dest=tree,
        compile_bytecode=True,
    )
    (results / "variants" / "original.json").write_text(json.dumps(recorded))
    for path in sorted(tree.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    stamp = tree / ".snakemake_timestamp"
    stamp.touch()
    os.utime(stamp, (1_700_000_000.5, 1_700_000_000.5))

    restore.restore_variants(config, results)

    assert (tree / "python" / "sglang" / "srt" / "managers" / "mm_utils.py").is_file()
    assert stamp.stat().st_mtime == 1_700_000_000.5
    module.write_text("copy = 'changed'\n")
    with pytest.raises(SystemExit, match="variant original: made again, it is not"):
        restore.restore_variants(config, results)
