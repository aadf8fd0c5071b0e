"""What a real SGLang server's processes say about themselves, read from its log."""

import json

from serving_study.measure.server_log_facts import (
    gc_never_resumed,
    inline_fallback_reported,
    is_reported,
    loaded_modules,
    main_process_load,
    reported_values,
    stand_in_calls,
)

MM_UTILS = "sglang.srt.managers.mm_utils"


def load_line(pid: int, title: str, sha256: str, threads: int = 2) -> str:
    report = {
        "module": MM_UTILS,
        "file": f"/variants/{sha256[:4]}/mm_utils.py",
        "sha256": sha256,
        "pid": pid,
        "title": title,
        "torch_threads": threads,
        "environment": {"OMP_NUM_THREADS": "1"} if threads == 1 else {},
    }
    return "serving-study loaded: " + json.dumps(report)


LOG = "\n".join(
    [
        "[2026-12-01 08:03:30] server_args=ServerArgs(...)",
        load_line(100, "python -m sglang.launch_server --model-path m", "a" * 64),
        load_line(
            101,
            "python -c from multiprocessing.spawn import spawn_main",
            "a" * 64,
            threads=1,
        ),
        "serving-study loaded: {not json",
        "serving-study stand-in: assign_req_to_token_pool_cpu called in pid 101 "
        "(sglang::scheduler)",
        "serving-study stand-in: placeholder fused_sigmoid_mul_cpu called in pid 100 "
        "(python -m sglang.launch_server)",
    ]
)


def test_each_process_report_is_read_and_a_broken_one_skipped():
    reports = loaded_modules(LOG)
    assert [(report.pid, report.torch_threads) for report in reports] == [
        (100, 2),
        (101, 1),
    ]


def test_the_main_process_is_found_by_pid_or_else_by_its_command_line():
    assert main_process_load(LOG, 100).torch_threads == 2
    assert main_process_load(LOG, 101).torch_threads == 1
    # In a container the probe sees other pids: the launcher is the main process.
    assert main_process_load(LOG, 999).pid == 100
    children_only = load_line(7, "python -c from multiprocessing.spawn", "c" * 64)
    assert main_process_load(children_only, None) is None
    assert main_process_load("no probe here", 100) is None


def test_each_process_reports_its_own_thread_knobs():
    assert main_process_load(LOG, 101).environment == {"OMP_NUM_THREADS": "1"}
    assert main_process_load(LOG, 100).environment == {}
    assert is_reported("OMP_NUM_THREADS") and is_reported("GOMP_SPINCOUNT")
    assert not is_reported("HF_TOKEN")


def test_the_arms_variables_are_taken_from_the_probes_report():
    reported = {"OMP_NUM_THREADS": "1", "ARM_KNOB": "on", "ARM_UNSET": None}
    reported |= {"HF_TOKEN": "<set>", "OTHER_TOKEN": None}
    expected = {"ARM_KNOB": "on", "ARM_UNSET": "x", "HF_TOKEN": "runner's"}
    expected |= {"OTHER_TOKEN": "runner's", "GOMP_SPINCOUNT": "0", "NOT_ASKED": "y"}
    assert reported_values(reported, expected) == {
        "ARM_KNOB": "on",
        "ARM_UNSET": None,
        # Set in the server: it can only hold the value the runner passed.
        "HF_TOKEN": "runner's",
        "OTHER_TOKEN": None,
        # A thread knob the probe would have reported had it been set.
        "GOMP_SPINCOUNT": None,
    }


def test_placeholders_are_told_apart_from_the_real_op():
    calls = stand_in_calls(LOG)
    assert [(call.op, call.placeholder, call.title) for call in calls] == [
        ("assign_req_to_token_pool_cpu", False, "sglang::scheduler"),
        ("fused_sigmoid_mul_cpu", True, "python -m sglang.launch_server"),
    ]


def test_sglangs_own_inline_warning_is_recognised():
    warning = (
        "Failed to allocate shared memory for multimodal feature transport "
        "([Errno 28] No space left on device); falling back to inline transport. "
        "Consider increasing /dev/shm size."
    )
    assert inline_fallback_reported(LOG + "\n" + warning)
    assert not inline_fallback_reported(LOG)


def test_a_process_that_loaded_the_module_must_resume_its_collector():
    # 100 and 101 loaded mm_utils; 55 (say, multiprocessing's resource tracker)
    # never loads it and never freezes, so it is not asked to resume.
    loads = loaded_modules(LOG)
    assert gc_never_resumed(LOG, loads) == [100, 101]
    resumed = "serving-study gc resumed in pid 101\nserving-study gc resumed in pid 55"
    assert gc_never_resumed(LOG + "\n" + resumed, loads) == [100]
    both = resumed + "\nserving-study gc resumed in pid 100\n" + LOG
    assert gc_never_resumed(both, loads) == []
