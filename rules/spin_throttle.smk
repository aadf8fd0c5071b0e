# Why a pool larger than the visible CPUs hides the trap: the CPU torch's OpenMP
# workers burn in the idle gap after a parallel op, for pools that fit the CPUs a
# case may use and pools that outnumber them, each with libgomp's default spin,
# GOMP_SPINCOUNT=0 and GOMP_SPINCOUNT=infinite (config: spin_throttle). Never part
# of `all`: `snakemake --cores 2 spin_throttle` (about a minute on two CPUs).

from serving_study.studies.spin_throttle import SpinThrottleSettings

SPIN_THROTTLE = SpinThrottleSettings.from_config(config["spin_throttle"])


rule spin_throttle:
    output:
        figures=report(
            "results/benchmarks/spin_throttle.json",
            caption="../report/spin_throttle.rst",
            category="Benchmarks",
            labels={"item": "OpenMP spin by pool size"},
        ),
    log:
        "results/logs/benchmarks/spin_throttle.log",
    conda:
        "../envs/workflow.yaml"
    threads: WHOLE_HOST
    params:
        settings=SPIN_THROTTLE.as_config(),
    script:
        "../scripts/spin_throttle.py"
