"""The thread x quota map: its config checks, its table and heatmaps, and one real
row through the whole workflow (forced threads beyond the CPUs, quota changed live)."""

import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml
from study_helpers import TEST_CONFIG, leaked_segments, snakemake_command

from serving_study.config.validation import ConfigError, check_config
from serving_study.report.map_chart import quota_order, thread_quota_map
from serving_study.studies.thread_quota_map import map_rows, map_table, quota_label

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "config" / "schema" / "config.schema.yaml"
MAP = {
    "variants": ["original", "patched"],
    "workload": "tiny",
    "intra_op_threads": [3],
    "cpu_quotas": ["none", 0.5],
    "concurrency": 4,
    "requests": 8,
    "warmup_requests": 2,
    "output_tokens": 4,
}


def config_with_map(**changes) -> dict:
    config = yaml.safe_load(TEST_CONFIG.read_text())
    config["experiment"] = "test-map"
    config["thread_quota_map"] = {**MAP, **changes}
    return config


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            config_with_map(variants=["original", "nope"]),
            "thread_quota_map.variants[1]: 'nope' names no variant",
        ),
        (
            config_with_map(workload="huge"),
            "thread_quota_map.workload: 'huge' names no workload",
        ),
        (
            config_with_map(cpu_quotas=[1, "1"]),
            "thread_quota_map.cpu_quotas[1]: '1' is not a CPU quota",
        ),
        (
            config_with_map(cpu_quotas=[2, 2.0]),
            "thread_quota_map.cpu_quotas: a quota is listed twice",
        ),
        (
            config_with_map(intra_op_threads=[0]),
            "thread_quota_map.intra_op_threads[0]: 0 is less than the minimum of 1",
        ),
        (
            {**config_with_map(), "runtime": "docker"},
            "thread_quota_map: the map needs engine 'embedded' and runtime 'local'",
        ),
    ],
)
def test_bad_map_settings_are_refused_naming_the_key(config, message):
    with pytest.raises(ConfigError) as error:
        check_config(config, SCHEMA, ["map.yaml"], ROOT)
    assert message in str(error.value)


def test_forcing_threads_is_refused_for_real_sglang():
    config = yaml.safe_load((ROOT / "config" / "b1.yaml").read_text())
    config["arms"][0]["intra_op_threads"] = 128
    with pytest.raises(ConfigError) as error:
        check_config(config, SCHEMA, ["b1.yaml"], ROOT)
    assert "arms[0].intra_op_threads: only the embedded engine" in str(error.value)


def test_rows_and_labels():
    assert map_rows(MAP) == [("original", 3), ("patched", 3)]
    labels = [quota_label(quota) for quota in ("none", 2, 0.5, 16.0)]
    assert labels == ["none", "2", "0.5", "16"]
    assert quota_order(["none", "16", "2", "0.5"]) == ["0.5", "2", "16", "none"]


def cell(variant, threads, quota, throughput, valid=True, reason=None):
    return {
        "variant": variant,
        "intra_op_threads": threads,
        "cpu_quota": quota,
        "valid": valid,
        "invalid_reasons": [reason] if reason else [],
        "throughput_rps": throughput,
        "ttft_p50_ms": 100.0,
        "main_cpu_percent": 50.0,
        "cores_used": 0.5,
        "throttled_share": 0.1,
        "torch_threads": threads,
        "gpu_util_percent": None,
    }


def test_table_keeps_every_cell_and_drops_figures_of_invalid_ones():
    rows = [
        [cell("original", 1, "none", 10.0), cell("original", 1, "2", 4.0)],
        [
            cell("patched", 1, "none", 12.0),
            cell("patched", 1, "2", 8.0, valid=False, reason="server died"),
        ],
    ]
    table = map_table(rows)
    assert len(table) == 4
    invalid = table[~table["valid"]].iloc[0]
    assert invalid["invalid_reason"] == "server died"
    assert pd.isna(invalid["throughput_rps"])
    assert table["throughput_rps"].tolist()[:3] == [10.0, 4.0, 12.0]


def test_heatmaps_show_each_variant_and_the_ratio_of_valid_cells():
    table = map_table(
        [
            [cell("original", 1, "none", 10.0), cell("original", 8, "none", 4.0)],
            [cell("patched", 1, "none", 12.0), cell("patched", 8, "none", 8.0)],
        ]
    )
    spec = thread_quota_map(table)
    assert len(spec["hconcat"]) == 3
    datasets = list(spec["datasets"].values())
    ratios = sorted(row["ratio"] for data in datasets for row in data if "ratio" in row)
    assert ratios == pytest.approx([1.2, 2.0])


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the quota needs root")
def test_a_real_map_row_forces_threads_and_changes_the_quota_live(tmp_path):
    config = config_with_map(variants=["patched"])
    config_file = tmp_path / "map.yaml"
    config_file.write_text(yaml.safe_dump(config))
    workdir = tmp_path / "work"
    workdir.mkdir()
    finished = subprocess.run(
        snakemake_command(workdir, "--cores", "1", "all", config=config_file),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]

    results = workdir / "results" / "test-map"
    cells = json.loads((results / "thread-quota-map/patched/threads3.json").read_text())
    assert [c["cpu_quota"] for c in cells] == ["none", "0.5"]
    for measured in cells:
        assert measured["valid"], measured["invalid_reasons"]
        # Three threads on a host of two CPUs: only set_num_threads can do that.
        assert measured["torch_threads"] == 3
    quotas = [c["checks"]["quota_in_force_cores"] for c in cells]
    assert quotas == [None, pytest.approx(0.5)]
    # The kernel counts quota periods only while a quota is set (a share of
    # throttled periods then exists, whether or not this light load hit it): the
    # live change reached the kernel.
    throttled = [c["throttled_share"] for c in cells]
    assert throttled[0] is None and throttled[1] is not None

    # The row held the host's measurement lock, as an arm's run does.
    row_server = json.loads(
        (results / "thread-quota-map/patched/threads3/server.json").read_text()
    )
    assert row_server["host_lock"]["lock_file"].endswith(".lock")
    table = pd.read_csv(results / "tables" / "thread_quota_map.csv")
    assert len(table) == 2 and table["valid"].all()
    page = (results / "report.html").read_text()
    assert "Throughput over intra-op threads and CPU quota" in page
    assert "Thread x quota map: every cell" in page
    assert (results / "figures" / "thread_quota_map.html").is_file()
    assert not leaked_segments()
