"""Resume config/gpu-host-real.yaml on a fresh GPU host from the results a call
carried back.

    PYTHONPATH=src:SITE python3 tests/gpu/restore_real_server.py RESULTS_TAR [CONFIG]

``real_server_on_gpu_host.py`` runs this when the host has no results yet but a
call carried ``results.tar.gz`` of an earlier one back in. That archive holds
every result, record and Snakemake's own records of its jobs, their mtimes kept,
but not the variants' trees, the workload's images nor the runtime's installed
packages, which are large and made again here from the records that travel:

- each variant by ``prepare_variant`` from the staged source, into the folder its
  record names, whose identity must then equal the record (its time apart);
- the workload by ``generate_workload`` from its seed, whose manifest (every
  image's sha256) must equal the record;
- the runtime's packages by ``install_site`` from the staged wheels, whose files
  must be those ``files.json`` recorded.

The records are not written again and each folder keeps the timestamp Snakemake
gave it, so Snakemake finds every job it ran before done. The launch plans name
absolute paths: a host whose checkout lies elsewhere is refused.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
from serving_study.config.content_keys import content_key  # noqa: E402
from serving_study.config.records import Workload  # noqa: E402
from serving_study.config.validation import check_config  # noqa: E402
from serving_study.sources.host_torch_runtime import install_site  # noqa: E402
from serving_study.sources.recorded_files import file_digests  # noqa: E402
from serving_study.sources.variants import prepare_variant  # noqa: E402
from serving_study.workloads import generate_workload  # noqa: E402

CONFIG = ROOT / "config" / "gpu-host-real.yaml"
TIMESTAMP = ".snakemake_timestamp"


def timeless(record: dict) -> dict:
    """A record without the moments it was made at."""
    return {key: value for key, value in record.items() if not key.endswith("_at")}


def keeping_timestamp(folder: Path):
    """The mtime of the folder's Snakemake timestamp, and a way to put it back."""
    stamp = folder / TIMESTAMP
    times = (stamp.stat().st_atime, stamp.stat().st_mtime)

    def put_back() -> None:
        stamp.touch()
        os.utime(stamp, times)

    return put_back


def restore_variants(config: dict, results: Path) -> None:
    sources = {source["name"]: source for source in config["sources"]}
    for variant in config["variants"]:
        recorded = json.loads(
            (results / "variants" / f"{variant['name']}.json").read_text()
        )
        source = sources[variant["source"]]
        folder = ROOT / "resources" / "sources" / content_key(source["name"], source)
        tree = results / "variants" / variant["name"] / "source"
        put_back = keeping_timestamp(tree)
        identity = prepare_variant(
            {key: value for key, value in variant.items() if key != "description"},
            source_tree=folder / "tree",
            source_identity=json.loads((folder / "identity.json").read_text()),
            patch_path=ROOT / variant["patch"] if "patch" in variant else None,
            dest=tree,
            compile_bytecode=True,
        )
        put_back()
        if timeless(identity) != timeless(recorded):
            raise SystemExit(
                f"variant {variant['name']}: made again, it is not as recorded"
            )
        print(f"variant {variant['name']}: made again as recorded")


def restore_workloads(config: dict, results: Path) -> None:
    for workload in config["workloads"]:
        folder = results / "workloads" / workload["name"]
        recorded = json.loads((folder / "manifest.json").read_text())
        put_back = keeping_timestamp(folder / "images")
        with tempfile.TemporaryDirectory(dir=folder) as scratch:
            made = Path(scratch) / "workload"
            manifest = generate_workload(
                Workload.from_config(workload).as_config(), made
            )
            if timeless(manifest) != timeless(recorded):
                raise SystemExit(f"workload {workload['name']}: not as recorded")
            for image in (made / "images").iterdir():
                shutil.move(image, folder / "images" / image.name)
        put_back()
        print(
            f"workload {workload['name']}: {len(recorded['images'])} images as recorded"
        )


def restore_runtime() -> None:
    folder = ROOT / "resources" / "sglang-host-torch-runtime"
    record = json.loads((folder / "runtime.json").read_text())
    if record["python"] != sys.executable or record["site"] != str(folder / "site"):
        raise SystemExit(
            f"the runtime was built for {record['python']} at {record['site']}"
        )
    install_site(
        Path(record["python"]),
        Path(record["lock_file"]),
        folder / "wheels",
        folder / "site",
        print,
    )
    recorded = json.loads((folder / "files.json").read_text())
    if file_digests(folder / "site") != recorded:
        raise SystemExit("the runtime's packages, installed again, are not as recorded")
    print(f"runtime: {len(recorded)} files as recorded")


def main() -> None:
    schema = ROOT / "config" / "schema" / "config.schema.yaml"
    path = ROOT / sys.argv[2] if len(sys.argv) > 2 else CONFIG
    config = check_config(yaml.safe_load(path.read_text()), schema, [str(path)], ROOT)
    results = ROOT / "results" / config["experiment"]
    with tarfile.open(sys.argv[1]) as bundle:
        bundle.extractall(ROOT, filter="data")
    plans = sorted((results / "commands").glob("*.json"))
    for plan in plans:
        where = json.loads(plan.read_text())["launch"]["working_directory"]
        if where != str(ROOT):
            raise SystemExit(
                f"{plan.name} was planned for a checkout at {where}, not {ROOT}"
            )
    if (results / "variants").is_dir():
        restore_variants(config, results)
    if (results / "workloads").is_dir():
        restore_workloads(config, results)
    if (ROOT / "resources" / "sglang-host-torch-runtime" / "files.json").is_file():
        restore_runtime()


if __name__ == "__main__":
    main()
