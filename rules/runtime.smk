# The Python environment SGLang's real server runs in on a CPU-only host: a venv from
# the closed lock envs/sglang-cpu/requirements.lock (sglang itself not in it: each
# variant's tree goes on PYTHONPATH, followed by the sgl-kernel stand-in beside the
# lock). Built once (~6.6 GB); a run with the same lock reuses it.


rule sglang_runtime:
    input:
        lock=project_file("envs/sglang-cpu/requirements.lock"),
        stand_in=project_file("envs/sglang-cpu/stand-in/sgl_kernel/__init__.py"),
    output:
        runtime="resources/sglang-runtime/runtime.json",
    log:
        "results/logs/sglang_runtime.log",
    benchmark:
        "results/benchmarks/jobs/sglang_runtime/runtime.tsv"
    priority: PREPARATION_PRIORITY
    localrule: True
    conda:
        "../envs/workflow.yaml"
    script:
        "../scripts/build_sglang_runtime.py"
