#!/usr/bin/env bash
# config/gpu-host.yaml on our GPU host (one H200, 16 CPUs, cgroup v2, no network).
#
#   tests/gpu/run_on_gpu_host.sh OUT check
#       host description, then the GPU and cgroup tests (preprocessing on the GPU,
#       both transports, real quota groups); stops at the first failure
#   tests/gpu/run_on_gpu_host.sh OUT stage
#       install or stage what .device/ holds, and nothing else
#   tests/gpu/run_on_gpu_host.sh OUT study SECONDS TARGET...
#       snakemake on config/gpu-host.yaml for at most SECONDS (then interrupted,
#       so that every server is torn down), and the results packed into OUT;
#       CONFIG=config/gpu-host-2x2.yaml runs that experiment instead
#
# The host has no network: what it lacks travels in .device/ (git-ignored), made here
# as docs/results/gpu-host/README.md says: .device/wheels (snakemake and its needs for
# the host's Python 3.12), .device/report-wheels (vl-convert, for the report page) and
# .device/downloads (the SGLang 0.5.23 wheel for it). Together they exceed what one
# call to the host may carry, so each may come in a call of its own (the SGLang
# wheel itself in parts, one a call): whatever is there is installed or staged once,
# and kept while the host stays up.
set -uo pipefail
out=$1
mode=$2
shift 2

export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}:/tmp/site"
install_wheels() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site "$1"/*.whl
}
if [ -d .device/wheels ] && [ ! -d /tmp/site/snakemake ]; then
    install_wheels .device/wheels || exit 1
fi
if [ -d .device/report-wheels ] && [ ! -d /tmp/site/vl_convert ]; then
    install_wheels .device/report-wheels || exit 1
fi
# A wheel too large for one call travels in parts, NAME.part-I-of-N (split -n N),
# each in a folder .device/downloads-I of its own, kept under
# resources/download-parts/ and joined once all N have come.
mkdir -p resources/downloads resources/download-parts .pytest_cache/d/sglang-wheels
for carried in .device/downloads*/; do
    [ -d "$carried" ] || continue
    cp -n "$carried"*.whl resources/downloads/ 2>/dev/null
    cp -n "$carried"*.part-* resources/download-parts/ 2>/dev/null
done
for first in resources/download-parts/*.part-1-of-*; do
    [ -e "$first" ] || break
    name=${first%.part-1-of-*}
    total=${first##*-of-}
    wheel=resources/downloads/$(basename "$name")
    [ -e "$wheel" ] && continue
    parts=("$name".part-*-of-"$total")
    [ "${#parts[@]}" = "$total" ] || continue
    for part in $(seq 1 "$total"); do
        cat "$name.part-$part-of-$total"
    done >"$wheel.partial" && mv "$wheel.partial" "$wheel"
done
cp -n resources/downloads/*.whl .pytest_cache/d/sglang-wheels/ 2>/dev/null

case "$mode" in
stage)
    ls resources/downloads /tmp/site 2>/dev/null | head -n 5
    ;;
check)
    {
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
        echo "cpus: $(nproc)"
        lscpu | grep -E "Model name|Thread|Core|Socket"
        echo "cgroup: $(cat /proc/self/cgroup)"
        echo "root controllers: $(cat /sys/fs/cgroup/cgroup.controllers 2>/dev/null)"
        python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__,
torch.version.cuda, torch.cuda.get_device_name(0), torch.get_num_threads())"
    } 2>&1 | tee "$out/host.txt"
    python3 -m pytest -q -x -p no:randomly \
        tests/test_engine_preprocess.py tests/test_cgroups.py \
        "tests/test_engine_server.py::test_on_a_gpu_images_are_preprocessed_there_and_both_transports_serve" \
        2>&1 | tee "$out/check.log"
    ;;
study)
    seconds=$1
    shift
    config=${CONFIG:-config/gpu-host.yaml}
    experiment=$(sed -n 's/^experiment: *//p' "$config")
    timeout --signal=INT --kill-after=60 "$seconds" \
        python3 -m snakemake --cores "$(nproc)" --scheduler greedy \
        --configfile "$config" --rerun-incomplete "$@" \
        2>&1 | tee "$out/snakemake.log"
    status=$?
    tar -czf "$out/results.tgz" --exclude="results/$experiment/variants/*/source" \
        "results/$experiment" results/logs 2>/dev/null
    exit "$status"
    ;;
*)
    echo "unknown mode $mode (stage, check or study)" >&2
    exit 2
    ;;
esac
