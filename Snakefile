# Reproduce a multimodal-serving performance study: pinned engine variants, seeded
# workloads, one fresh server per (arm, run) under a CPU quota, monitors, medians,
# and an HTML report. `snakemake --cores 1 all` runs config/config.yaml (the embedded
# engine); `--configfile config/<experiment>.yaml` runs another experiment instead.
from snakemake.utils import min_version

min_version("9.27")


if not workflow.overwrite_configfiles:

    configfile: f"{workflow.basedir}/config/config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/variants.smk"
include: "rules/workloads.smk"
include: "rules/preflight.smk"
include: "rules/images.smk"
include: "rules/arms.smk"
include: "rules/crosscheck.smk"
include: "rules/aggregate.smk"
include: "rules/bisect.smk"
include: "rules/thread_quota_map.smk"
include: "rules/spin_throttle.smk"
include: "rules/model.smk"
include: "rules/runtime.smk"
include: "rules/commands.smk"
include: "rules/benchmarks.smk"
include: "rules/repeatability.smk"
include: "rules/compare.smk"


rule all:
    default_target: True
    input:
        final_outputs(),
