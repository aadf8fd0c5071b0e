"""The thread x quota map: its config checks, its seeded shuffled blocks, its tables
and heatmaps, and a real two-block map through the whole workflow (forced threads
beyond the CPUs, both variants side by side, quota changed live)."""

import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml
from study_helpers import TEST_CONFIG, leaked_segments, snakemake_command

from serving_study.analysis.map_contrast import (
    contrast_by_quota,
    map_contrast,
    quota_order,
)
from serving_study.config.validation import ConfigError, check_config
from serving_study.report.map_chart import thread_quota_map
from serving_study.studies.thread_quota_map import block_plan, map_table, quota_label

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


def test_labels_and_quota_order():
    labels = [quota_label(quota) for quota in ("none", 2, 0.5, 16.0)]
    assert labels == ["none", "2", "0.5", "16"]
    assert quota_order(["none", "16", "2", "0.5"]) == ["0.5", "2", "16", "none"]


GRID = {
    "variants": ["original", "patched"],
    "intra_op_threads": [1, 2, 4, 8, 16],
    "cpu_quotas": ["none", 4, 2, 1],
}


def flat(plan) -> list[tuple]:
    return [(v, r.threads, q) for r in plan for v, q in r.cells]


def test_each_block_measures_every_cell_once_in_its_own_seeded_order():
    every_cell = sorted(
        (v, t, str(q))
        for v in GRID["variants"]
        for t in GRID["intra_op_threads"]
        for q in GRID["cpu_quotas"]
    )
    orders = [flat(block_plan(GRID, seed=7, block=block)) for block in (1, 2, 3)]
    for order in orders:
        assert sorted((v, t, str(q)) for v, t, q in order) == every_cell
    # Each block has an order of its own, and the same seed gives the same order.
    assert len({tuple(order) for order in orders}) == 3
    assert flat(block_plan(GRID, seed=7, block=2)) == orders[1]
    assert flat(block_plan(GRID, seed=8, block=2)) != orders[1]


def test_a_block_interleaves_the_variants_instead_of_running_one_after_the_other():
    for block in (1, 2, 3):
        for server_round in block_plan(GRID, seed=20261130, block=block):
            variants = [v for v, _ in server_round.cells]
            # A run of one variant's cells in config order would switch once.
            switches = sum(a != b for a, b in zip(variants, variants[1:], strict=False))
            assert switches >= 2, variants
        thread_order = [r.threads for r in block_plan(GRID, seed=20261130, block=block)]
        assert sorted(thread_order) == GRID["intra_op_threads"]


def cell(variant, threads, quota, throughput, valid=True, reason=None, block=1):
    return {
        "block": block,
        "position": 0,
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
    blocks = [
        [cell("original", 1, "none", 10.0), cell("original", 1, "2", 4.0)],
        [
            cell("patched", 1, "none", 12.0, block=2),
            cell("patched", 1, "2", 8.0, valid=False, reason="server died", block=2),
        ],
    ]
    table = map_table(blocks)
    assert len(table) == 4
    assert table["block"].tolist() == [1, 1, 2, 2]
    invalid = table[~table["valid"]].iloc[0]
    assert invalid["invalid_reason"] == "server died"
    assert pd.isna(invalid["throughput_rps"])
    assert table["throughput_rps"].tolist()[:3] == [10.0, 4.0, 12.0]


def test_the_contrast_pairs_cells_within_blocks_not_across_them():
    # A host that slows down from block 1 to block 3: pairing within blocks sees
    # the patched copy 10% ahead in every block; a ratio of medians across blocks
    # would mix the drift into it.
    blocks = [
        [
            cell("original", 4, "1", 10.0 * speed, block=block),
            cell("patched", 4, "1", 11.0 * speed, block=block),
        ]
        for block, speed in ((1, 1.0), (2, 0.8), (3, 0.6))
    ]
    blocks[2][0] = cell("original", 4, "1", 99.0, valid=False, reason="x", block=3)
    contrast = map_contrast(map_table(blocks), ["original", "patched"])
    line = contrast.iloc[0]
    assert (line["baseline"], line["compared"]) == ("original", "patched")
    assert line["paired_blocks"] == 2
    assert line["ratio"] == pytest.approx(1.1)
    assert line["blocks_above_1"] == 2 and line["blocks_below_1"] == 0
    assert line["block_ratios"] == "1.100;1.100"
    # Each variant's median over its own valid blocks.
    assert line["baseline_rps"] == pytest.approx(9.0)
    assert line["compared_rps"] == pytest.approx(8.8)


def test_per_quota_the_contrast_gives_its_range_where_it_peaks_and_every_blocks_side():
    # Two blocks; under 1 core the patched copy gains most at 16 threads; without
    # a quota it is behind in three of the four paired blocks.
    throughputs = {
        (4, "1"): ((10.0, 12.0), (10.0, 13.0)),
        (16, "1"): ((5.0, 15.0), (6.0, 15.0)),
        (4, "none"): ((16.0, 15.8), (16.0, 15.6)),
        (16, "none"): ((16.0, 15.9), (16.0, 16.2)),
    }
    blocks = [
        [
            cell(variant, threads, quota, pair[block - 1][index], block=block)
            for (threads, quota), pair in throughputs.items()
            for index, variant in enumerate(("original", "patched"))
        ]
        for block in (1, 2)
    ]
    blocks[1][0] = cell("original", 4, "1", 99.0, valid=False, reason="x", block=2)
    by_quota = contrast_by_quota(
        map_contrast(map_table(blocks), ["original", "patched"])
    ).set_index("cpu_quota")
    assert by_quota.index.tolist() == ["1", "none"]
    one_core = by_quota.loc["1"]
    assert one_core["thread_counts"] == 2
    assert one_core["ratio_min"] == pytest.approx(1.2)
    assert one_core["ratio_max"] == pytest.approx((3.0 + 2.5) / 2)
    assert one_core["threads_at_max"] == 16
    # The invalid original cell leaves its block unpaired.
    assert one_core["paired_blocks"] == 3 and one_core["blocks_above_1"] == 3
    free = by_quota.loc["none"]
    assert free["ratio_min"] == pytest.approx((15.8 / 16 + 15.6 / 16) / 2)
    assert free["ratio_max"] == pytest.approx((15.9 / 16 + 16.2 / 16) / 2)
    assert free["threads_at_max"] == 16
    assert (free["paired_blocks"], free["blocks_below_1"], free["blocks_above_1"]) == (
        4,
        3,
        1,
    )


def test_heatmaps_show_each_variant_and_the_paired_ratio_of_valid_cells():
    cells = map_table(
        [
            [
                cell("patched", 1, "none", 12.0, block=block),
                cell("original", 1, "none", 10.0, block=block),
                cell("original", 8, "none", 4.0 * block, block=block),
                cell("patched", 8, "none", 8.0 * block, block=block),
            ]
            for block in (1, 2)
        ]
    )
    spec = thread_quota_map(cells, map_contrast(cells, ["original", "patched"]))
    assert len(spec["hconcat"]) == 3
    assert spec["hconcat"][0]["title"] == "original: throughput (req/s)"
    datasets = list(spec["datasets"].values())
    ratios = sorted(row["ratio"] for data in datasets for row in data if "ratio" in row)
    assert ratios == pytest.approx([1.2, 2.0])
    medians = sorted(
        row["throughput_rps"]
        for data in datasets
        for row in data
        if "throughput_rps" in row
    )
    assert medians == pytest.approx([6.0, 10.0, 12.0, 12.0])


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the quota needs root")
def test_a_real_map_runs_in_blocks_with_both_variants_side_by_side(tmp_path):
    config = config_with_map(blocks=2)
    config_file = tmp_path / "map.yaml"
    config_file.write_text(yaml.safe_dump(config))
    workdir = tmp_path / "work"
    workdir.mkdir()
    finished = subprocess.run(
        snakemake_command(workdir, "--cores", "2", "all", config=config_file),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]

    results = workdir / "results" / "test-map"
    for block in (1, 2):
        cells = json.loads(
            (results / f"thread-quota-map/block{block}.json").read_text()
        )
        # The block ran its seeded plan: every cell once, in that order.
        plan = block_plan(config["thread_quota_map"], config["seed"], block)
        assert [(c["variant"], c["cpu_quota"]) for c in cells] == [
            (v, quota_label(q)) for r in plan for v, q in r.cells
        ]
        assert [c["position"] for c in cells] == [0, 1, 2, 3]
        for measured in cells:
            assert measured["valid"], measured["invalid_reasons"]
            # Three threads on a host of two CPUs: only set_num_threads can do that.
            assert measured["torch_threads"] == 3
            # The quota in force, read back from the cgroup's own files right after
            # the cell's window: the live change reached the kernel, both ways.
            quota = measured["checks"]["quota_in_force_cores"]
            if measured["cpu_quota"] == "none":
                assert quota is None
            else:
                assert quota == pytest.approx(0.5)
        # Both variants' servers ran side by side: each served its own cells, and
        # each was up before the block's first cell and until its last.
        servers = {
            variant: json.loads(
                (
                    results
                    / f"thread-quota-map/block{block}/{variant}-threads3/server.json"
                ).read_text()
            )
            for variant in ("original", "patched")
        }
        original, patched = (servers[v]["launch"] for v in ("original", "patched"))
        assert original["argv"] != patched["argv"]
        assert original["quota"]["timing"] == "healthy"
        assert max(s["started_at"] for s in servers.values()) <= cells[0]["started_at"]
        # The block held the host's measurement lock, as an arm's run does.
        assert servers["patched"]["host_lock"]["lock_file"].endswith(".lock")
        # Each server's record traces it to this project's commit and its variant.
        for variant, server in servers.items():
            provenance = server["provenance"]
            assert len(provenance["project"]["commit"]) == 40
            patch = provenance["versions"]["engine"]["patch"]
            assert (patch is None) == (variant == "original"), (variant, patch)

    table = pd.read_csv(results / "tables" / "thread_quota_map.csv")
    assert len(table) == 8 and table["valid"].all()
    contrast = pd.read_csv(results / "tables" / "thread_quota_map_contrast.csv")
    assert contrast["paired_blocks"].tolist() == [2, 2]
    by_quota = pd.read_csv(results / "tables" / "thread_quota_map_by_quota.csv")
    assert by_quota["paired_blocks"].tolist() == [2, 2]
    page = (results / "report.html").read_text()
    assert "Throughput over intra-op threads and CPU quota" in page
    assert "Thread x quota map: the variants compared, paired in blocks" in page
    assert (results / "figures" / "thread_quota_map.html").is_file()
    assert (results / "figures" / "table_thread_quota_map_contrast.html").is_file()
    assert "Thread x quota map: the variants compared per quota" in page
    assert not leaked_segments()
