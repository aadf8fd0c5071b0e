"""The model a real SGLang arm serves: a local snapshot is checked and recorded; a
missing, incomplete, unpinned or unreachable one fails with the key to set.

No test reaches the Hugging Face Hub: the hub cases run huggingface_hub offline or
against a closed local port.
"""

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from study_helpers import snakemake_command

from serving_study.launch.sglang import model_folder_name
from serving_study.sources import model_snapshot
from serving_study.sources.model_snapshot import (
    HUGGINGFACE_HUB_PIN,
    ModelUnavailable,
    ensure_model_snapshot,
)
from serving_study.sources.recorded_files import RecordedFileChanged

ROOT = Path(__file__).resolve().parents[1]
MODEL = "Qwen/Qwen3-VL-4B-Instruct"
COMMIT = "ebb281ec70b05090aa6165b016eac8ec08e71b17"
OTHER_COMMIT = "0" * 40
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def write_snapshot(directory: Path) -> dict[str, bytes]:
    """A small model directory laid out like the Hub's Qwen3-VL snapshot."""
    files = {
        "config.json": json.dumps({"model_type": "qwen3_vl"}).encode(),
        "tokenizer_config.json": b"{}",
        "preprocessor_config.json": json.dumps({"patch_size": 16}).encode(),
        "model.safetensors.index.json": json.dumps(
            {"weight_map": {"visual.w": SHARDS[0], "model.w": SHARDS[1]}}
        ).encode(),
        SHARDS[0]: os.urandom(4096),
        SHARDS[1]: os.urandom(2048),
    }
    directory.mkdir(parents=True)
    for name, content in files.items():
        (directory / name).write_bytes(content)
    # huggingface_hub's own bookkeeping in a downloaded local_dir: not the model.
    bookkeeping = directory / ".cache" / "huggingface" / "download"
    bookkeeping.mkdir(parents=True)
    (bookkeeping / "config.json.metadata").write_text(f"{COMMIT}\netag\n1\n")
    return files


def settings(**values) -> dict:
    return {"model": MODEL} | values


def test_a_local_snapshot_is_checked_and_recorded(tmp_path):
    files = write_snapshot(tmp_path / "qwen")

    record = ensure_model_snapshot(
        settings(model_path=str(tmp_path / "qwen")), tmp_path / "models"
    )

    assert record["origin"] == "local"
    assert record["path"] == str((tmp_path / "qwen").resolve())
    assert record["files"] == {
        name: hashlib.sha256(content).hexdigest() for name, content in files.items()
    }
    assert record["total_bytes"] == sum(len(content) for content in files.values())
    assert record["commit"] is None
    assert not (tmp_path / "models").exists()


def test_a_hugging_face_cache_snapshot_must_be_the_pinned_commit(tmp_path):
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen3-VL-4B-Instruct" / "snapshots"
    write_snapshot(snapshot / COMMIT)

    pinned = settings(model_path=str(snapshot / COMMIT), model_revision=COMMIT)
    assert ensure_model_snapshot(pinned, tmp_path)["commit"] == COMMIT

    other = settings(model_path=str(snapshot / COMMIT), model_revision=OTHER_COMMIT)
    with pytest.raises(ModelUnavailable) as refused:
        ensure_model_snapshot(other, tmp_path)
    message = str(refused.value)
    assert COMMIT in message and OTHER_COMMIT in message
    assert "sglang.model_revision" in message


def test_a_missing_local_path_names_the_key(tmp_path):
    with pytest.raises(ModelUnavailable, match="sglang.model_path") as refused:
        ensure_model_snapshot(settings(model_path=str(tmp_path / "nowhere")), tmp_path)
    assert "is not a directory" in str(refused.value)


def test_an_incomplete_snapshot_names_what_is_missing(tmp_path):
    write_snapshot(tmp_path / "qwen")
    (tmp_path / "qwen" / SHARDS[1]).unlink()
    (tmp_path / "qwen" / "preprocessor_config.json").unlink()

    with pytest.raises(ModelUnavailable) as refused:
        ensure_model_snapshot(settings(model_path=str(tmp_path / "qwen")), tmp_path)
    message = str(refused.value)
    assert f"weight shard {SHARDS[1]}" in message
    assert "preprocessor_config.json is missing" in message
    assert SHARDS[0] not in message


@pytest.mark.parametrize(
    "revision, named",
    [
        (None, ["sglang.model_revision is not set", "sglang.model_path"]),
        ("main", ["sglang.model_revision 'main' is not a commit", "40-hex"]),
    ],
)
def test_an_unpinned_model_is_not_downloaded(tmp_path, revision, named):
    unpinned = settings() if revision is None else settings(model_revision=revision)
    with pytest.raises(ModelUnavailable) as refused:
        ensure_model_snapshot(unpinned, tmp_path / "models")
    for fragment in named:
        assert fragment in str(refused.value)
    assert not (tmp_path / "models").exists()


def test_without_huggingface_hub_the_error_names_the_pin_and_model_path(
    tmp_path, monkeypatch
):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    with pytest.raises(ModelUnavailable) as refused:
        ensure_model_snapshot(settings(model_revision=COMMIT), tmp_path / "models")
    message = str(refused.value)
    assert f"pip install {HUGGINGFACE_HUB_PIN}" in message
    assert "sglang.model_path" in message


# --- a download reused: every file as first recorded -------------------------------


@pytest.fixture
def fake_hub(monkeypatch) -> list[str]:
    """huggingface_hub's download, answered with a small snapshot the first time and
    left as it is after (a download that finds every file present); the revisions
    asked for are listed."""
    asked = []

    def download(model, revision, destination):
        asked.append(revision)
        if not destination.exists():
            write_snapshot(destination)
        return destination.resolve()

    monkeypatch.setattr(model_snapshot, "download_snapshot", download)
    return asked


def test_a_changed_file_of_a_reused_download_is_named(fake_hub, tmp_path):
    pinned = settings(model_revision=COMMIT)
    first = ensure_model_snapshot(pinned, tmp_path / "models")
    assert ensure_model_snapshot(pinned, tmp_path / "models")["files"] == first["files"]
    shard = tmp_path / "models" / SHARDS[1]
    shard.write_bytes(b"other weights")

    with pytest.raises(RecordedFileChanged) as raised:
        ensure_model_snapshot(pinned, tmp_path / "models")

    assert str(raised.value) == (
        f"{shard} changed since it was recorded (sha256 {first['files'][SHARDS[1]]} "
        f"-> {hashlib.sha256(b'other weights').hexdigest()}); remove "
        f"{tmp_path / 'models'} to download it again"
    )
    assert fake_hub == [COMMIT] * 3


def test_another_revision_in_the_same_folder_is_recorded_afresh(fake_hub, tmp_path):
    ensure_model_snapshot(settings(model_revision=COMMIT), tmp_path / "models")
    (tmp_path / "models" / "config.json").write_text('{"model_type": "newer"}')

    record = ensure_model_snapshot(
        settings(model_revision=OTHER_COMMIT), tmp_path / "models"
    )

    assert record["commit"] == OTHER_COMMIT
    (tmp_path / "models" / "config.json").write_text("{}")
    with pytest.raises(RecordedFileChanged, match="config.json changed"):
        ensure_model_snapshot(
            settings(model_revision=OTHER_COMMIT), tmp_path / "models"
        )


# --- huggingface_hub for real, without the Hub ------------------------------------

ENSURE_PROGRAM = """
import json, sys
from pathlib import Path
from serving_study.sources.model_snapshot import ModelUnavailable, ensure_model_snapshot
try:
    ensure_model_snapshot(json.loads(sys.argv[1]), Path(sys.argv[2]))
except ModelUnavailable as error:
    sys.exit(f"ModelUnavailable: {error}")
"""
SECRET = "hf_not-a-real-token-0123456789"


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ensure_in_fresh_process(tmp_path: Path, hub_environment: dict[str, str]):
    """Run ensure_model_snapshot where huggingface_hub reads this environment at
    import, with a token set that must never be printed."""
    environment = {
        name: value
        for name, value in os.environ.items()
        if "proxy" not in name.lower() and not name.startswith("HF_")
    }
    environment |= {"HF_HOME": str(tmp_path / "hf-home"), "HF_TOKEN": SECRET}
    environment |= hub_environment
    return subprocess.run(
        [
            sys.executable,
            "-c",
            ENSURE_PROGRAM,
            json.dumps(settings(model_revision=COMMIT)),
            str(tmp_path / "models"),
        ],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "hub_environment",
    [
        pytest.param({"HF_HUB_OFFLINE": "1"}, id="offline-mode"),
        pytest.param(
            {
                "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}",
                "HF_HUB_ETAG_TIMEOUT": "5",
            },
            id="hub-unreachable",
            # huggingface_hub retries a refused connection for about 25 s
            marks=pytest.mark.slow,
        ),
    ],
)
def test_a_host_without_the_hub_is_told_to_set_model_path(tmp_path, hub_environment):
    pytest.importorskip("huggingface_hub")
    finished = ensure_in_fresh_process(tmp_path, hub_environment)

    assert finished.returncode != 0
    message = finished.stderr.strip().splitlines()[-1]
    assert message.startswith("ModelUnavailable: could not download"), finished.stderr
    assert MODEL in message and COMMIT in message
    assert "set sglang.model_path to a local snapshot" in message
    assert SECRET not in finished.stdout + finished.stderr
    snapshot = tmp_path / "models"
    assert not snapshot.exists() or not any(
        path.is_file() and ".cache" not in path.parts for path in snapshot.rglob("*")
    )


# --- the model rule ----------------------------------------------------------------


def test_the_model_rule_records_a_local_snapshot(tmp_path):
    files = write_snapshot(tmp_path / "qwen")
    local = tmp_path / "local-model.yaml"
    local.write_text(json.dumps({"sglang": {"model_path": str(tmp_path / "qwen")}}))
    sglang = {
        **yaml.safe_load((ROOT / "config" / "p4.yaml").read_text())["sglang"],
        "model_path": str(tmp_path / "qwen"),
    }
    target = f"resources/models/{model_folder_name(sglang)}/snapshot.json"

    finished = subprocess.run(
        snakemake_command(
            tmp_path / "work",
            "--cores",
            "1",
            "pinned_model",
            config=(ROOT / "config" / "p4.yaml", local),
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    record = json.loads((tmp_path / "work" / target).read_text())
    assert record["origin"] == "local"
    assert (record["revision"], record["commit"]) == (COMMIT, None)
    assert set(record["files"]) == set(files)
