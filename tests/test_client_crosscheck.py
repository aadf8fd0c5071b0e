"""Our client against SGLang's bench_serving: the workload as its dataset, our runs
in its result format, the verdict, and the config key that asks for it.

The result keys and the dataset's pass-through are read from the pinned release's
own source (``sglang_0_5_23``), not restated; a real cross-check runs in
tests/test_workflow_run.py."""

import ast
import copy
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from test_client import write_workload

from serving_study.analysis.crosscheck_table import summary_table, verdict
from serving_study.config.crosscheck_settings import ClientCrosscheck
from serving_study.config.validation import ConfigError, check_config
from serving_study.measure.chat_requests import load_requests
from serving_study.measure.request_log import read_request_log
from serving_study.studies.bench_serving_dataset import STREAM_OPTIONS, write_dataset
from serving_study.studies.bench_serving_result import (
    DETAIL_KEYS,
    FIGURE_KEYS,
    RESULT_KEYS,
    read_result,
    run_result,
    write_result,
)

ROOT = Path(__file__).resolve().parents[1]
RECORDED_RUN = ROOT / "docs" / "results" / "embedded-b1" / "runs" / "C" / "run1"


def bench_serving_body(line: dict, model: str) -> dict:
    """The body bench_serving 0.5.23 sends for one `openai` dataset line: the
    line's messages, max_tokens as max_completion_tokens, stream, temperature 0
    and ignore_eos (async_request_openai_chat_completions), then every key of the
    line but the ones its loader keeps out (sample_openai_requests)."""
    kept_out = {"messages", "max_tokens", "max_completion_tokens", "model"}
    body = {
        "model": model,
        "messages": line["messages"],
        "max_completion_tokens": line["max_tokens"],
        "stream": True,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    return body | {key: value for key, value in line.items() if key not in kept_out}


def test_the_dataset_makes_our_clients_measured_bodies_in_its_order(tmp_path):
    manifest = write_workload(tmp_path, images=4)
    dataset = tmp_path / "dataset.jsonl"
    record = write_dataset(
        manifest, dataset, warmup_requests=3, measured_requests=6, output_tokens=5
    )
    lines = [json.loads(line) for line in dataset.read_text().splitlines()]
    requests = load_requests(manifest)
    assert len(lines) == record["lines"] == 6
    # Our client sends request i with image i mod 4, the first three as warm-up.
    for index, line in enumerate(lines):
        ours = requests[(3 + index) % 4].body(model="served", output_tokens=5)
        assert bench_serving_body(line, "served") == json.loads(ours)
    assert record["warmup_image"] == requests[3].image_file
    assert record["distinct_images"] == 4


def test_a_recorded_run_in_bench_servings_format_keeps_our_figures(tmp_path):
    records = read_request_log(RECORDED_RUN / "requests.jsonl")
    metrics = json.loads((RECORDED_RUN / "metrics.json").read_text())
    result = run_result(records, metrics, details=True)
    assert list(result) == [*RESULT_KEYS, *DETAIL_KEYS]
    for name, key in FIGURE_KEYS.items():
        if metrics.get(name) is None:  # recorded before ITL was measured
            continue
        assert result[key] == pytest.approx(metrics[name]), name
    done = [r for r in records if r["phase"] == "measured" and r["error"] is None]
    e2e = np.array([r["e2e_ms"] for r in done])
    assert result["mean_e2e_latency_ms"] == pytest.approx(e2e.mean())
    assert result["std_e2e_latency_ms"] == pytest.approx(e2e.std())
    assert result["concurrency"] == pytest.approx(
        e2e.sum() / 1000 / metrics["measured_seconds"]
    )
    # bench_serving counts a request in every second it spans: a closed loop's
    # seconds hold its concurrency and the requests that replaced those ending.
    peak = result["max_concurrent_requests"]
    started_in_a_second = math.ceil(metrics["throughput_rps"])
    assert (
        metrics["concurrency"]
        < peak
        <= metrics["concurrency"] + 2 * started_in_a_second
    )
    assert result["total_output_tokens"] == 32 * len(done)
    assert len(result["ttfts"]) == len(done) and max(result["ttfts"]) < 10
    path = tmp_path / "bench_serving.json"
    write_result(path, result)
    assert "Infinity" in path.read_text()  # the unbounded rate, as it writes it
    assert read_result(path)["request_rate"] == math.inf


def literal_keys(function: ast.AST, name: str) -> list[str]:
    """The keys of the dict literal assigned to ``name`` in ``function``."""
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            if any(getattr(target, "id", None) == name for target in node.targets):
                return [key.value for key in node.value.keys]
    raise AssertionError(f"no dict literal {name}")


def function_named(tree: ast.AST, name: str) -> ast.AST:
    return next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef)
        and node.name == name
    )


def test_the_result_keys_and_the_dataset_are_the_pinned_releases(sglang_0_5_23):
    tree, _ = sglang_0_5_23
    benchmark = tree / "python" / "sglang" / "benchmark"
    serving = ast.parse((benchmark / "serving.py").read_text())
    run = function_named(serving, "benchmark")
    assert literal_keys(run, "result") == list(RESULT_KEYS)
    assert literal_keys(run, "result_details") == list(DETAIL_KEYS)
    request = function_named(serving, "async_request_openai_chat_completions")
    assert literal_keys(request, "payload") == [
        "model",
        "messages",
        "max_completion_tokens",
        "stream",
    ]
    loader = ast.parse((benchmark / "datasets" / "openai_dataset.py").read_text())
    kept_out = next(
        node.value
        for node in ast.walk(loader)
        if isinstance(node, ast.Assign)
        and getattr(node.targets[0], "id", None) == "EXCLUDED_FIELDS"
    )
    # What our lines carry besides messages and max_tokens passes through.
    assert not set(STREAM_OPTIONS) & set(ast.literal_eval(kept_out))
    assert {"messages", "max_tokens"} <= set(ast.literal_eval(kept_out))


def pair_rows(pair: int, ours: float, theirs: float, *, valid=True) -> list[dict]:
    common = {"ttft_p50_ms": 100.0, "ttft_p99_ms": 200.0, "e2e_p50_ms": 800.0}
    common |= {"client_cpu_ms_per_request": 1.0, "main_cpu_ms_per_request": 10.0}
    return [
        {"pair": pair, "client": "ours", "valid": True, "throughput_rps": ours}
        | common,
        {"pair": pair, "client": "bench_serving", "valid": valid}
        | {"throughput_rps": theirs}
        | common,
    ]


def test_the_verdict_stands_on_pairs_where_both_runs_count():
    crosscheck = ClientCrosscheck.from_config({"arm": "C"})
    runs = pd.DataFrame(
        [
            *pair_rows(1, 19.0, 18.5),
            *pair_rows(2, 19.4, 18.7),
            # A pair with an invalid run is left out, however far apart.
            *pair_rows(3, 30.0, 10.0, valid=False),
        ]
    )
    summary = summary_table(runs, crosscheck).iloc[0]
    assert summary["valid_pairs"] == 2 and summary["pairs"] == 3
    assert summary["ratio"] == pytest.approx((19.0 / 18.5 + 19.4 / 18.7) / 2)
    assert summary["verdict"] == "within 5%"
    assert summary["ours_throughput_rps"] == pytest.approx(19.2)
    assert verdict(1.05, 0.05) == "within 5%"
    assert verdict(0.94, 0.05) == "not within 5%"
    assert verdict(None, 0.05) == "no pair where both runs count"


def check(config: dict) -> dict:
    schema = ROOT / "config" / "schema" / "config.schema.yaml"
    return check_config(config, schema, ["bad.yaml"], ROOT)


def test_the_cross_check_names_a_closed_loop_arm_and_the_default_asks_none():
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    assert "client_crosscheck" not in check(copy.deepcopy(config))
    asked = check(copy.deepcopy(config) | {"client_crosscheck": {"arm": "C"}})
    assert ClientCrosscheck.from_config(asked["client_crosscheck"]) == (
        ClientCrosscheck(arm="C", pairs=3, requests=None, tolerance=0.05)
    )
    with pytest.raises(ConfigError, match="client_crosscheck.arm: 'E' names no arm"):
        check(copy.deepcopy(config) | {"client_crosscheck": {"arm": "E"}})
    open_loop = copy.deepcopy(config) | {"client_crosscheck": {"arm": "C"}}
    open_loop["arms"][2]["request_rate"] = 5.0
    with pytest.raises(ConfigError, match="compares closed loops"):
        check(open_loop)
