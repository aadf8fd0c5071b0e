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


# On a GPU host whose torch is not SGLang's pin (sglang.torch: host): the CPU-side
# packages SGLang's server lacks, installed from the closed lock
# envs/sglang-gpu-host/requirements.lock into a folder beside the host's own Python
# (its wheels are downloaded into the runtime's wheels/ folder once, or put there
# beforehand on a host without an index). The stand-ins the server imports are
# inputs: a change to one is a change to every run's server.


rule sglang_host_torch_runtime:
    input:
        lock=project_file(HOST_TORCH_RUNTIME_LOCK),
        stand_ins=host_torch_stand_in_files(),
    output:
        runtime=HOST_TORCH_RUNTIME_RECORD,
    log:
        "results/logs/sglang_host_torch_runtime.log",
    benchmark:
        "results/benchmarks/jobs/sglang_host_torch_runtime/runtime.tsv"
    priority: PREPARATION_PRIORITY
    localrule: True
    conda:
        "../envs/workflow.yaml"
    script:
        "../scripts/build_host_torch_runtime.py"
