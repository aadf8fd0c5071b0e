"""config/gpu-host-real.yaml on our GPU host, one device call at a time.

    SERVING_STUDY_CGROUPS_AT_ROOT=1 python3 tests/gpu/real_server_on_gpu_host.py OUT \
        [--seconds 540] [--config FILE]

(the variable because our device's cgroup has no cpu controller delegated: the quota
groups are made at the hierarchy's root; without it the arms' preflight fails).

Run from the project root on the host (one H200, Python 3.12 with torch 2.11, no
network; a call runs 10 minutes at most and carries 64 MiB at most). Each call:

1. takes the parts of ``.device/real/`` that ``stage_real_server.py`` made here
   and that have come so far (one a call; the host keeps them while it stays up),
   and stops, saying which are missing, until every file of the manifest is there
   with its sha256;
2. installs Snakemake's wheels (``envs/sglang-gpu-host/workflow.lock``), puts the
   server's wheels where rule ``sglang_host_torch_runtime`` installs them from,
   and lays out the SGLang source where rule ``fetch_source`` would have;
3. when this host has no results yet and a call carried the last ones back in
   (``.device/real/resume/results.tar.gz``), restores them
   (``restore_real_server.py``);
4. runs the workflow on as many of the runs still to do, in their block order, as
   fit in ``--seconds`` at the pace of the runs so far, or, once every run is
   done, on the tables. A job is redone only when an output is missing or older
   than an input (``--rerun-triggers mtime``): the source and whatever a call
   carried in have no Snakemake records here, and the checkout's own files,
   copied afresh by every call, are dated to the epoch first, so that a copy is
   never taken for a change (a change to the config or the code between calls
   redoes nothing: make none);
5. writes to OUT: ``status.json`` (the parts, the runs done and to do, the pace),
   ``snakemake.log`` and ``results.tar.gz``, all a later call needs to resume:
   the results without the variants' trees and the workload's images (made again
   from their records), the runtime's and the model's records, and Snakemake's
   own records of its jobs.

It uses nothing beyond the host's Python until Snakemake's wheels are installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "config/gpu-host-real.yaml"
STAGE = ROOT / ".device" / "real"
RESUME = STAGE / "resume" / "results.tar.gz"
WORKFLOW_LOCK = ROOT / "envs" / "sglang-gpu-host" / "workflow.lock"
WORKFLOW_SITE = ROOT / "resources" / "gpu-host-workflow" / "site"
SERVER_WHEELS = ROOT / "resources" / "sglang-host-torch-runtime" / "wheels"
SOURCES = ROOT / "resources" / "sources"
# The pace before any run was seen (s): a cold server, its Triton compiles and the
# harness; and the preparation (workload, variants, runtime, model, preflights).
FIRST_RUN_S = 130.0
PREPARATION_S = 150.0
SNAKEMAKE_START_S = 20.0
# What the workflow makes, which keeps its own dates; every other file of the
# checkout is a source, dated to the epoch before Snakemake compares dates.
PRODUCTS = {"results", "resources", ".snakemake", ".device", ".git", ".pytest_cache"}
# What results.tar.gz leaves out, (folder, its child) of results/<experiment>/:
# made again from the records that travel; the folders' timestamps travel.
REMADE = {("variants", "source"), ("workloads", "images")}
KEPT_IN_REMADE = ".snakemake_timestamp"

sys.path.insert(0, str(ROOT / "src"))
from serving_study.config.arm_order import execution_order  # noqa: E402


def host_facts() -> dict:
    """What the call found: its GPU, CPUs and Python with torch."""
    facts = {"name": os.uname().nodename, "cpus": os.cpu_count()}
    for key, argv in (
        (
            "gpu",
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        ),
        (
            "python",
            [
                sys.executable,
                "-c",
                "import sys, torch; print(sys.version.split()[0], torch.__version__)",
            ],
        ),
    ):
        try:
            found = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            facts[key] = (found.stdout or found.stderr).strip()
        except (OSError, subprocess.TimeoutExpired) as error:
            facts[key] = str(error)
    return facts


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def staged_files() -> tuple[dict, list[int]]:
    """The manifest's files joined from their pieces into ``.device/real/all/``,
    and the parts still missing."""
    manifests = sorted(STAGE.glob("part-*/manifest.json"))
    if not manifests:
        return {}, [1]
    manifest = json.loads(manifests[0].read_text())
    joined = STAGE / "all"
    joined.mkdir(exist_ok=True)
    missing = set()
    files = {}
    for name, entry in manifest["files"].items():
        target = joined / name
        if not target.is_file() or sha256(target) != entry["sha256"]:
            pieces = [STAGE / f"part-{part}" / piece for piece, part in entry["pieces"]]
            absent = {
                part
                for (_, part), path in zip(entry["pieces"], pieces, strict=True)
                if not path.is_file()
            }
            if absent:
                missing |= absent
                continue
            with target.open("wb") as whole:
                for piece in pieces:
                    whole.write(piece.read_bytes())
            if sha256(target) != entry["sha256"]:
                target.unlink()
                raise SystemExit(f"{name}: its pieces do not give the staged sha256")
        files[name] = target
    return files, sorted(missing)


def pip_install(lock: Path, wheels: Path, target: Path) -> None:
    marker = target / ".lock-sha256"
    if marker.is_file() and marker.read_text() == sha256(lock):
        return
    shutil.rmtree(target, ignore_errors=True)
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index"]
    argv += ["--no-deps", "--require-hashes", "--only-binary=:all:", "--no-compile"]
    argv += ["--find-links", str(wheels), "--target", str(target), "-r", str(lock)]
    subprocess.run(argv, check=True)
    marker.write_text(sha256(lock))


def install(files: dict) -> None:
    """Snakemake's wheels, the server's wheels and the SGLang source, each once."""
    wheels = STAGE / "all"
    pip_install(WORKFLOW_LOCK, wheels, WORKFLOW_SITE)
    SERVER_WHEELS.mkdir(parents=True, exist_ok=True)
    for name, path in files.items():
        if name.endswith(".whl") and not (SERVER_WHEELS / name).is_file():
            shutil.copyfile(path, SERVER_WHEELS / name)
    SOURCES.mkdir(parents=True, exist_ok=True)
    with tarfile.open(files["sources.tar.xz"]) as bundle:
        keys = {member.name.split("/")[0] for member in bundle.getmembers()}
        if not all((SOURCES / key / "identity.json").is_file() for key in keys):
            bundle.extractall(SOURCES, filter="data")


def runs_of(config: dict) -> dict[str, int]:
    return {arm["name"]: arm.get("runs", 3) for arm in config["arms"]}


def run_directory(experiment: str, arm: str, run: int) -> Path:
    return ROOT / "results" / experiment / arm / f"run{run}"


def done_runs(config: dict) -> dict[tuple[str, int], float]:
    """Each run whose outputs are all there, with its wall time."""
    done = {}
    for arm, run in execution_order(runs_of(config), config["seed"]):
        folder = run_directory(config["experiment"], arm, run)
        if (folder / "metrics.json").is_file() and (
            folder / "provenance.json"
        ).is_file():
            provenance = json.loads((folder / "provenance.json").read_text())
            done[(arm, run)] = float(provenance.get("wall_s") or FIRST_RUN_S)
    return done


def targets(config: dict, seconds: float) -> tuple[list[str], dict]:
    """The runs still to do that fit, in block order (the launch plans when none
    fits beside the preparation; nothing when none fits at all), with the tables
    when they are the last, or the tables alone when none is left; and the plan's
    figures."""
    experiment = config["experiment"]
    done = done_runs(config)
    order = execution_order(runs_of(config), config["seed"])
    left = [item for item in order if item not in done]
    prepared = (ROOT / "results" / experiment / "commands").is_dir()
    pace = sorted(done.values())[len(done) // 2] if done else FIRST_RUN_S
    budget = seconds - SNAKEMAKE_START_S - (0 if prepared else PREPARATION_S)
    fitting = max(0, int(budget // pace))
    chosen = left[:fitting]
    plan = {
        "runs": len(order),
        "done": len(done),
        "pace_s": round(pace, 1),
        "chosen": [f"{arm}/run{run}" for arm, run in chosen],
    }
    tables = [f"results/{experiment}/tables/arms.csv"]
    if not left:
        return tables, plan
    if not chosen and not prepared:
        return [
            f"results/{experiment}/commands/{arm}.json" for arm in runs_of(config)
        ], plan
    runs = [
        str(run_directory(experiment, arm, run).relative_to(ROOT) / "metrics.json")
        for arm, run in chosen
    ]
    # The last runs, and the tables after them when they are done in time.
    return runs + tables if len(chosen) == len(left) else runs, plan


def date_sources_to_the_epoch() -> None:
    """Every file of the checkout that the workflow did not make, to 1970: a call
    copies them afresh, and a fresh copy must not look newer than the results."""
    for directory, folders, files in os.walk(ROOT):
        here = Path(directory)
        if here == ROOT:
            folders[:] = [name for name in folders if name not in PRODUCTS]
        folders[:] = [name for name in folders if name != "__pycache__"]
        for name in files:
            path = here / name
            if not path.is_symlink():
                os.utime(path, (0, 0))


def workflow_environment() -> dict[str, str]:
    """This project's package and Snakemake's wheels on the path."""
    path = [str(ROOT / "src"), str(WORKFLOW_SITE), os.getenv("PYTHONPATH")]
    path = os.pathsep.join(filter(None, path))
    return dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=path)


def run_workflow(chosen: list[str], seconds: float, out: Path, config: str) -> int:
    environment = workflow_environment()
    argv = ["timeout", "--signal=INT", "--kill-after=45", str(int(seconds))]
    # The targets first: --rerun-triggers and --configfile take every word after.
    argv += [sys.executable, "-m", "snakemake", *chosen, "--cores", str(os.cpu_count())]
    argv += ["--scheduler", "greedy", "--rerun-incomplete", "--keep-going"]
    argv += ["--rerun-triggers", "mtime", "--configfile", config]
    with (out / "snakemake.log").open("w") as log:
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        return subprocess.run(
            argv, cwd=ROOT, env=environment, stdout=log, stderr=log
        ).returncode


def pack_results(experiment: str, out: Path) -> None:
    """Everything a later call needs to resume, mtimes kept (Snakemake compares
    them), less what is made again from its records."""
    results = ROOT / "results" / experiment

    def remade(path: Path) -> bool:
        if not path.is_relative_to(results) or path.name == KEPT_IN_REMADE:
            return False
        parts = path.relative_to(results).parts
        return len(parts) > 3 and (parts[0], parts[2]) in REMADE

    paths = [
        results,
        ROOT / "results" / "logs",
        ROOT / "resources" / "sglang-host-torch-runtime" / "runtime.json",
        ROOT / "resources" / "sglang-host-torch-runtime" / "files.json",
        ROOT / "resources" / "tiny-models",
        ROOT / ".snakemake" / "metadata",
        ROOT / ".snakemake" / "incomplete",
    ]
    with tarfile.open(
        out / "results.tar.gz", "w:gz", format=tarfile.PAX_FORMAT
    ) as bundle:
        for path in paths:
            if not path.exists():
                continue
            for found in [path, *sorted(path.rglob("*"))] if path.is_dir() else [path]:
                if found.is_file() and not remade(found):
                    bundle.add(
                        found, arcname=str(found.relative_to(ROOT)), recursive=False
                    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=float, default=540.0)
    parser.add_argument("--config", default=CONFIG, help="an experiment of this host")
    arguments = parser.parse_args()
    started = time.monotonic()
    out = arguments.out
    out.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((ROOT / arguments.config).read_text())
    status = {"config": arguments.config, "host": host_facts()}
    files, missing = staged_files()
    status["parts_missing"] = missing
    if missing:
        (out / "status.json").write_text(json.dumps(status, indent=2) + "\n")
        print(f"parts still to carry: {missing}; nothing run")
        return 3
    install(files)
    results = ROOT / "results" / config["experiment"]
    if RESUME.is_file() and not results.exists():
        restore = ROOT / "tests" / "gpu" / "restore_real_server.py"
        argv = [sys.executable, str(restore), str(RESUME), arguments.config]
        subprocess.run(argv, env=workflow_environment(), check=True)
        status["restored_from"] = str(RESUME.relative_to(ROOT))
    date_sources_to_the_epoch()
    left = arguments.seconds - (time.monotonic() - started)
    chosen, status["plan"] = targets(config, left)
    status["targets"] = chosen
    print(json.dumps(status["plan"]))
    # No run fits the time left: Snakemake without targets would start them all.
    status["snakemake_exit"] = (
        run_workflow(chosen, left, out, arguments.config) if chosen else None
    )
    status["runs_done"] = len(done_runs(config))
    status["tables_made"] = (results / "tables" / "arms.csv").is_file()
    pack_results(config["experiment"], out)
    status["seconds"] = round(time.monotonic() - started, 1)
    (out / "status.json").write_text(json.dumps(status, indent=2) + "\n")
    shown = ("runs_done", "tables_made", "snakemake_exit", "seconds")
    print(json.dumps({key: status[key] for key in shown}))
    return 0 if status["snakemake_exit"] in (0, None) else 1


if __name__ == "__main__":
    sys.exit(main())
