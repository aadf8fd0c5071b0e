"""Make sure the model a real SGLang server loads is on this host, complete and pinned.

Config either names a local snapshot (``sglang.model_path``), which is checked, or
the Hub model (``sglang.model``) at a pinned commit (``sglang.model_revision``),
which is downloaded with huggingface_hub (in the workflow into
``resources/models/<name>/snapshot/``; an interrupted download resumes). Either way
the result is a record of where the snapshot is, which commit it is, and the sha256
of every file, so a run can name exactly the weights it served. A download keeps
that list of files beside huggingface_hub's bookkeeping, and a later run that
reuses the download finds every file as listed or stops, naming the one that is not.

A gated model needs ``HF_TOKEN`` in the environment; huggingface_hub reads it from
there. This module never reads, logs or writes it.
"""

import json
import re
from datetime import UTC, datetime
from pathlib import Path

from serving_study.files import file_sha256, write_json
from serving_study.sources.recorded_files import require_unchanged

REQUIRED_FILES = ("config.json", "tokenizer_config.json", "preprocessor_config.json")
WEIGHT_INDEX = "model.safetensors.index.json"
COMMIT = re.compile(r"[0-9a-f]{40}")
# huggingface_hub keeps its download bookkeeping here inside a local_dir.
HUB_BOOKKEEPING = ".cache"
# The files of a download as they were first recorded, kept with the bookkeeping.
RECORDED_FILES = f"{HUB_BOOKKEEPING}/serving-study-files.json"
HUGGINGFACE_HUB_PIN = "huggingface_hub==2.4.0"


class ModelUnavailable(RuntimeError):
    """The model snapshot is missing, incomplete or not the pinned one; the message
    names the config key to set."""


def ensure_model_snapshot(sglang_settings: dict, download_directory: Path) -> dict:
    """Check or download (into ``download_directory``) the configured model; return
    its snapshot record (``snapshot_record``).

    ``sglang_settings`` is the config's ``sglang`` section. A local snapshot's
    ``commit`` is None when its place does not say (``local_commit``).
    """
    model = sglang_settings["model"]
    if sglang_settings.get("model_path"):
        path = Path(sglang_settings["model_path"]).expanduser().resolve()
        require_complete(path, "sglang.model_path")
        revision = sglang_settings.get("model_revision")
        commit = local_commit(path, revision)
        files = snapshot_files(path)
        return snapshot_record(
            model, path, files, origin="local", revision=revision, commit=commit
        )
    revision = pinned_revision(sglang_settings)
    path = download_snapshot(model, revision, Path(download_directory).resolve())
    require_complete(path, "the downloaded snapshot")
    files = snapshot_files(path)
    _require_as_recorded(path, model, revision, files)
    return snapshot_record(
        model, path, files, origin="hub", revision=revision, commit=revision
    )


def snapshot_record(
    model: str,
    path: Path,
    files: dict[str, str],
    *,
    origin: str,
    revision: str | None = None,
    commit: str | None = None,
) -> dict:
    """Which model is served from where: the snapshot's absolute ``path``, the
    pinned ``revision``, the ``commit`` it is known to be, its ``origin`` (local,
    hub or tiny) and ``files``: relative path -> sha256."""
    return {
        "model": model,
        "revision": revision,
        "commit": commit,
        "origin": origin,
        "path": str(path),
        "files": files,
        "total_bytes": sum((path / name).stat().st_size for name in files),
        "checked_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def pinned_revision(sglang_settings: dict) -> str:
    revision = sglang_settings.get("model_revision")
    if not revision:
        raise ModelUnavailable(
            f"sglang.model_revision is not set, so {sglang_settings['model']} is not "
            "pinned: set it to the model's Hub commit (40 hex digits), or set "
            "sglang.model_path to a local snapshot of the model"
        )
    if not COMMIT.fullmatch(revision):
        raise ModelUnavailable(
            f"sglang.model_revision {revision!r} is not a commit: give the full "
            "40-hex-digit Hub commit, not a branch or tag"
        )
    return revision


def snapshot_problems(path: Path) -> list[str]:
    """What a model directory lacks for SGLang to serve it (empty when complete)."""
    if not path.is_dir():
        return [f"{path} is not a directory"]
    problems = [
        f"{name} is missing" for name in REQUIRED_FILES if not (path / name).is_file()
    ]
    index = path / WEIGHT_INDEX
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        problems += [
            f"weight shard {shard} (named in {WEIGHT_INDEX}) is missing"
            for shard in shards
            if not (path / shard).is_file()
        ]
    elif not any(path.glob("*.safetensors")):
        problems.append("no weights (*.safetensors) found")
    return problems


def require_complete(path: Path, what: str) -> None:
    problems = snapshot_problems(path)
    if problems:
        raise ModelUnavailable(
            f"{what} {path} is not a complete model snapshot: "
            + "; ".join(problems)
            + ". Point sglang.model_path at a directory holding the model's "
            "config, tokenizer, preprocessor and weights."
        )


def local_commit(path: Path, revision: str | None) -> str | None:
    """The commit of a local snapshot when its place in a Hugging Face cache says
    (``.../snapshots/<commit>``), else None; it must match a pinned ``revision``."""
    if path.parent.name != "snapshots" or not COMMIT.fullmatch(path.name):
        return None
    commit = path.name
    if revision and commit != revision:
        raise ModelUnavailable(
            f"sglang.model_path {path} is the snapshot of commit {commit}, but "
            f"sglang.model_revision pins {revision}: point model_path at the pinned "
            "snapshot, or change model_revision"
        )
    return commit


def download_snapshot(model: str, revision: str, destination: Path) -> Path:
    """Download (or resume) ``model`` at ``revision`` into ``destination``."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as error:
        raise ModelUnavailable(
            f"{model} must be downloaded, but huggingface_hub is not installed: "
            f"pip install {HUGGINGFACE_HUB_PIN}, or set sglang.model_path to a "
            "local snapshot of the model"
        ) from error
    destination.parent.mkdir(parents=True, exist_ok=True)
    try:
        return Path(
            snapshot_download(model, revision=revision, local_dir=destination)
        ).resolve()
    except Exception as error:
        reason = (str(error).strip().splitlines() or [""])[0]
        raise ModelUnavailable(
            f"could not download {model} at {revision} from the Hugging Face Hub "
            f"({type(error).__name__}: {reason}). On a host without Hub access set "
            "sglang.model_path to a local snapshot of the model; for a gated model "
            "export HF_TOKEN."
        ) from error


def _require_as_recorded(
    path: Path, model: str, revision: str, files: dict[str, str]
) -> None:
    """Compare a download's files with those recorded when this very model and
    revision were first downloaded there (RecordedFileChanged names a file that
    differs); record them when nothing was."""
    record = path / RECORDED_FILES
    pin = {"model": model, "revision": revision}
    if record.is_file():
        recorded = json.loads(record.read_text())
        if {key: recorded.get(key) for key in pin} == pin:
            require_unchanged(path, recorded["files"], files, again="download it again")
            return
    record.parent.mkdir(parents=True, exist_ok=True)
    write_json(record, pin | {"files": files})


def snapshot_files(path: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file of the snapshot, huggingface_hub's
    bookkeeping left out. Links (as in a Hugging Face cache) are followed."""
    return {
        file.relative_to(path).as_posix(): file_sha256(file)
        for file in sorted(path.rglob("*"))
        if file.is_file() and file.relative_to(path).parts[0] != HUB_BOOKKEEPING
    }
