# Container images (runtime docker or podman): one image per variant, built from a
# Dockerfile under envs/ that checks the variant's mm_utils.py inside the image. Three
# kinds: the embedded engine's, real SGLang's on a GPU host (the official image) and
# real SGLang's on a CPU host (Debian with the CPU runtime's lock). The two built on
# Debian install a wheelhouse made here with pip download, so their builds need no
# package index (and no CUDA torch creeps into the embedded engine's).
from serving_study.launch.sglang import image_engine
from serving_study.config.platform import CPU_RUNTIME_LOCK

# The platform a wheelhouse's wheels are chosen for (the images' Debian and Python).
WHEEL_PLATFORM = {
    "python_version": config["container"]["embedded_python_version"],
    "glibc_version": config["container"]["embedded_glibc_version"],
}
# Shared by the experiments that build for the same platform (content_keys.py).
WHEELHOUSES = {
    "embedded": f"resources/{content_key('wheelhouse', WHEEL_PLATFORM)}",
    "sglang-cpu": f"resources/{content_key('wheelhouse-sglang-cpu', WHEEL_PLATFORM)}",
}
# What a variant's image is: embedded, sglang (GPU host) or sglang-cpu; the suffix of
# its Dockerfile and the engine part of its tag. None with the host's torch, whose
# servers run on the host alone.
IMAGE_KIND = "embedded" if SGLANG_PLATFORM is None else image_engine(SGLANG_PLATFORM)
IMAGE_DOCKERFILE = project_file(f"envs/Dockerfile.{IMAGE_KIND}") if IMAGE_KIND else []
# The wheelhouse it installs (the official SGLang image has everything).
IMAGE_WHEELHOUSE = WHEELHOUSES.get(IMAGE_KIND, [])
# What an SGLang image puts on the server's PYTHONPATH after the variant's tree (the
# load probe; on CPU the sgl-kernel stand-in), and their files: a change rebuilds.
IMAGE_PYTHON_PATH = (
    [project_file(name) for name in SGLANG_PLATFORM.python_path_directories]
    if SGLANG_PLATFORM
    else []
)
IMAGE_PYTHON_PATH_FILES = sorted(
    str(path)
    for directory in IMAGE_PYTHON_PATH
    for path in Path(directory).rglob("*")
    if path.is_file() and "__pycache__" not in path.parts
)
# What the Dockerfile's build arguments read of the config: sglang's base_image (the
# official SGLang image), or the container section's Debian base and its Python
# (the embedded and sglang-cpu images).
IMAGE_SETTINGS = (
    {"base_image": config["sglang"].get("base_image")}
    if IMAGE_KIND == "sglang"
    else {
        key: config["container"][key]
        for key in ("embedded_base_image", "embedded_python_version")
    }
)


rule wheelhouse:
    input:
        requirements=project_file("envs/embedded-requirements.txt"),
    output:
        wheelhouse=directory(WHEELHOUSES["embedded"]),
    log:
        messages="results/logs/wheelhouse/messages.log",
        pip="results/logs/wheelhouse/pip.log",
    benchmark:
        "results/benchmarks/jobs/wheelhouse/embedded.tsv"
    priority: PREPARATION_PRIORITY
    retries: 1
    localrule: True
    conda:
        "../envs/workflow.yaml"
    params:
        **WHEEL_PLATFORM,
        closed=False,
    script:
        "../scripts/make_wheelhouse.py"


# The CPU runtime's lock is closed: one wheel per line, nothing resolved.
rule wheelhouse_sglang_cpu:
    input:
        requirements=project_file(CPU_RUNTIME_LOCK),
    output:
        wheelhouse=directory(WHEELHOUSES["sglang-cpu"]),
    log:
        messages="results/logs/wheelhouse-sglang-cpu/messages.log",
        pip="results/logs/wheelhouse-sglang-cpu/pip.log",
    benchmark:
        "results/benchmarks/jobs/wheelhouse_sglang_cpu/sglang-cpu.tsv"
    priority: PREPARATION_PRIORITY
    retries: 1
    localrule: True
    conda:
        "../envs/workflow.yaml"
    params:
        **WHEEL_PLATFORM,
        closed=True,
    script:
        "../scripts/make_wheelhouse.py"


rule build_image:
    input:
        variant="results/{experiment}/variants/{variant}.json",
        dockerfile=IMAGE_DOCKERFILE,
        check=project_file("envs/verify_mm_utils.py"),
        wheelhouse=IMAGE_WHEELHOUSE,
        package=package_files_of_engine(),
        python_path=IMAGE_PYTHON_PATH_FILES,
    output:
        image_id="results/{experiment}/images/{variant}.iid",
        inspect="results/{experiment}/images/{variant}.inspect.json",
    log:
        messages="results/logs/build_image/{experiment}/{variant}.log",
        build="results/logs/build_image/{experiment}/{variant}.build.log",
    benchmark:
        "results/benchmarks/jobs/build_image/{experiment}/{variant}.tsv"
    priority: PREPARATION_PRIORITY
    conda:
        "../envs/workflow.yaml"
    # One build at a time: the second variant's build then reuses every layer of the
    # first but the variant's own, and no build slows another job down.
    threads: WHOLE_HOST
    params:
        runtime=config["runtime"],
        image_kind=IMAGE_KIND,
        settings=IMAGE_SETTINGS,
        python_path_directories=IMAGE_PYTHON_PATH,
    script:
        "../scripts/build_image.py"
