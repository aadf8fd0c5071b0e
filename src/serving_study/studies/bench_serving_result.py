"""SGLang bench_serving's result format: one of our runs written in it, and our
figures read back out of it.

bench_serving 0.5.23 (``sglang.benchmark.serving.benchmark``) appends one JSON
object per benchmark to its ``--output-file``: the run's arguments, the server's
``/server_info``, and its figures (``RESULT_KEYS``, in its order), then with
``--output-details`` the per-request lists (``DETAIL_KEYS``). ``run_result``
writes one of our runs (its ``requests.jsonl`` and ``metrics.json``) with the
same keys and definitions:

- ``duration`` is our measured window (first measured send to last measured
  end; bench_serving's runs from its first send to after its last answer);
- TTFT, end-to-end, TPOT and ITL are mean, median, std (numpy's, of the
  population), p90, p95 and p99 over the completed requests, as it computes them
  (TPOT per request with more than one output token, ITL every gap between token
  chunks); a list with nothing in it gives 0, as its ``np.mean(x or 0)`` does;
- ``concurrency`` is the sum of end-to-end latencies over the duration, and the
  peak output tokens per second and concurrent requests come from one-second
  buckets from the first send, as it counts them.

What our client does not know stays null: the input tokens (bench_serving counts
them with its tokenizer from the dataset, the image as its placeholder tokens),
the retokenized output and the generated text (our client keeps neither).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from serving_study.measure.request_log import completed, measured, values_of

BACKEND = "sglang-oai-chat"  # bench_serving's name for OpenAI chat completions
RESULT_KEYS = (
    "tag",
    "backend",
    "dataset_name",
    "request_rate",
    "max_concurrency",
    "sharegpt_output_len",
    "random_input_len",
    "random_output_len",
    "random_range_ratio",
    "server_info",
    "duration",
    "completed",
    "total_input_tokens",
    "total_input_text_tokens",
    "total_input_vision_tokens",
    "total_output_tokens",
    "total_output_tokens_retokenized",
    "request_throughput",
    "input_throughput",
    "output_throughput",
    "total_throughput",
    *(
        f"{statistic}_{latency}_ms"
        for latency in ("e2e_latency", "ttft", "tpot", "itl")
        for statistic in ("mean", "median", "std", "p90", "p95", "p99")
    ),
    "concurrency",
    "accept_length",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
)
DETAIL_KEYS = (
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "generated_texts",
    "errors",
)
# Our run figures (metrics.json) and the result keys that hold the same figure.
FIGURE_KEYS = {
    "requests_completed": "completed",
    "measured_seconds": "duration",
    "throughput_rps": "request_throughput",
    "output_tokens_per_s": "output_throughput",
    "ttft_p50_ms": "median_ttft_ms",
    "ttft_p90_ms": "p90_ttft_ms",
    "ttft_p99_ms": "p99_ttft_ms",
    "e2e_p50_ms": "median_e2e_latency_ms",
    "tpot_p50_ms": "median_tpot_ms",
    "tpot_p90_ms": "p90_tpot_ms",
    "tpot_p99_ms": "p99_tpot_ms",
    "itl_p50_ms": "median_itl_ms",
    "itl_p90_ms": "p90_itl_ms",
    "itl_p99_ms": "p99_itl_ms",
}


def run_result(
    records: list[dict],
    metrics: dict,
    *,
    server_info: dict | None = None,
    request_rate: float = math.inf,
    details: bool = False,
) -> dict:
    """One of our runs (its request log and metrics) in bench_serving's result
    format; ``details`` adds the per-request lists of ``--output-details``."""
    runs = measured(records)
    done = [record for record in runs if completed(record)]
    duration = metrics["measured_seconds"]
    e2e = [record["e2e_ms"] for record in done]
    output_tokens = sum(record.get("output_tokens") or 0 for record in done)
    tpots = [
        (record["e2e_ms"] - record["ttft_ms"]) / (record["output_tokens"] - 1)
        for record in done
        if (record.get("output_tokens") or 0) > 1 and record.get("ttft_ms") is not None
    ]
    peak_tokens, peak_requests = _peaks(done)
    result = {
        "tag": f"serving_study {metrics['arm']} run{metrics['run']}",
        "backend": BACKEND,
        "dataset_name": metrics["workload"],
        "request_rate": request_rate,
        "max_concurrency": metrics["concurrency"],
        "sharegpt_output_len": None,
        "random_input_len": None,
        "random_output_len": None,
        "random_range_ratio": None,
        "server_info": server_info,
        "duration": duration,
        "completed": len(done),
        "total_input_tokens": None,
        "total_input_text_tokens": None,
        "total_input_vision_tokens": None,
        "total_output_tokens": output_tokens,
        "total_output_tokens_retokenized": None,
        "request_throughput": len(done) / duration if duration else None,
        "input_throughput": None,
        "output_throughput": output_tokens / duration if duration else None,
        "total_throughput": None,
        **_statistics("e2e_latency", e2e, empty=math.nan),
        **_statistics("ttft", values_of(done, "ttft_ms")),
        **_statistics("tpot", tpots),
        **_statistics("itl", [gap for r in done for gap in r.get("itl_ms") or ()]),
        "concurrency": sum(e2e) / 1000 / duration if duration else None,
        "accept_length": None,
        "max_output_tokens_per_s": peak_tokens,
        "max_concurrent_requests": peak_requests,
    }
    if details:
        result |= _details(runs)
    return result


def figures(result: dict) -> dict:
    """A bench_serving result's figures under our metric names."""
    return {name: result.get(key) for name, key in FIGURE_KEYS.items()}


def read_result(path: Path) -> dict:
    """The last result in a bench_serving output file (it appends one per run)."""
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"{path} holds no bench_serving result")
    return json.loads(lines[-1])


def write_result(path: Path, result: dict) -> None:
    """One result as bench_serving writes it: a JSON line (Infinity for an
    unbounded request rate)."""
    Path(path).write_text(json.dumps(result) + "\n")


def _statistics(name: str, values_ms: list[float], empty: float = 0.0) -> dict:
    values = np.asarray(values_ms, dtype=float)
    if not len(values):
        values = np.asarray([empty])
    return {
        f"mean_{name}_ms": float(np.mean(values)),
        f"median_{name}_ms": float(np.median(values)),
        f"std_{name}_ms": float(np.std(values)),
        f"p90_{name}_ms": float(np.percentile(values, 90)),
        f"p95_{name}_ms": float(np.percentile(values, 95)),
        f"p99_{name}_ms": float(np.percentile(values, 99)),
    }


def _peaks(done: list[dict]) -> tuple[float, int]:
    """The most output tokens in one second and the most requests in flight in
    one second, in one-second buckets from the first send, as bench_serving
    counts them (a token at its chunk's time, a request in every second it
    spans)."""
    if not done:
        return 0.0, 0
    first = min(record["sent_s"] for record in done)
    last = max(record["sent_s"] + record["e2e_ms"] / 1000 for record in done)
    seconds = int(np.ceil(last - first)) + 1
    tokens, in_flight = np.zeros(seconds), np.zeros(seconds)
    for record in done:
        start = record["sent_s"]
        times = []
        if record.get("ttft_ms") is not None:
            moment = start + record["ttft_ms"] / 1000
            times.append(moment)
            for gap in record.get("itl_ms") or ():
                moment += gap / 1000
                times.append(moment)
        for at in times:
            bucket = int(at - first)
            if 0 <= bucket < seconds:
                tokens[bucket] += 1
        end = int(start + record["e2e_ms"] / 1000 - first)
        for second in range(int(start - first), min(end + 1, seconds)):
            in_flight[second] += 1
    return float(np.max(tokens)), int(np.max(in_flight))


def _details(runs: list[dict]) -> dict:
    """The per-request lists of --output-details, in send order; a failed
    request has 0 output tokens, TTFT 0 and its error."""
    ordered = sorted(runs, key=lambda record: record["index"])
    ok = [completed(record) for record in ordered]
    return {
        "input_lens": [None] * len(ordered),
        "output_lens": [
            (record.get("output_tokens") or 0) if good else 0
            for record, good in zip(ordered, ok, strict=True)
        ],
        "ttfts": [
            record["ttft_ms"] / 1000 if good and record.get("ttft_ms") else 0.0
            for record, good in zip(ordered, ok, strict=True)
        ],
        "itls": [
            [gap / 1000 for gap in record.get("itl_ms") or ()] for record in ordered
        ],
        "generated_texts": [""] * len(ordered),
        "errors": [record.get("error") or "" for record in ordered],
    }
