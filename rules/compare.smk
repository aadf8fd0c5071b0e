# Two results folders side by side (analysis/comparison.py): two hosts, or two
# sessions of one config, each a folder with host.json and tables/ (the aggregate's
# results/<experiment>/, a page under docs/results/ or one of its sessions/). Never
# part of `all`; the folders are config key `compare`, given on the command line:
#   snakemake --cores 1 compare --config 'compare=[docs/results/gpu-host, docs/results/gpu-host/sessions/2026-12-03-2x2]'
# A folder the workflow makes (results/<experiment>/ of the config in use) is made
# first; a published one is read as it is.
from dataclasses import asdict

from serving_study.analysis.comparison import ComparedFolders, compared_files
from serving_study.analysis.release_change import ChangeCriterion

COMPARED = ComparedFolders.from_config(config.get("compare"))


rule compare:
    input:
        first=lambda wildcards: compared_files(COMPARED, "first"),
        second=lambda wildcards: compared_files(COMPARED, "second"),
    output:
        html=report(
            "results/compare/compare.html",
            caption="../report/compare.rst",
            category="Comparison",
            labels={"item": "two results folders side by side"},
        ),
        arms="results/compare/arms.csv",
        claims="results/compare/claims.csv",
        hosts="results/compare/hosts.csv",
    log:
        "results/logs/compare.log",
    localrule: True
    conda:
        "../envs/workflow.yaml"
    params:
        folders=COMPARED.as_config() if COMPARED else [],
        criterion=asdict(ChangeCriterion.from_config(config.get("change_criterion"))),
    script:
        "../scripts/compare.py"
