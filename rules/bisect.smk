# Commit bisect: a binary search between two commits of a git repository for the
# first commit whose measurement differs from the older end by the change criterion.
# It exists only when the config has a `bisect` section, and runs as one job because
# which commit to probe next depends on the last measurement:
#   snakemake --cores 1 results/<experiment>/bisect.json --configfile <config>

if config.get("bisect"):
    BISECT_ARM = ARMS[config["bisect"]["arm"]]

    rule bisect_commits:
        input:
            workload=workload_file(BISECT_ARM.workload),
            host="results/{experiment}/host.json",
        output:
            result=report(
                "results/{experiment}/bisect.json",
                caption="../report/bisect.rst",
                category="{experiment}",
                subcategory="Commit bisect",
                labels={"item": "every probe and the first changed commit"},
            ),
            probes=directory("results/{experiment}/bisect"),
        log:
            "results/logs/bisect_commits/{experiment}.log",
        conda:
            "../envs/workflow.yaml"
        threads: WHOLE_HOST
        params:
            repository=config["bisect"]["repository"],
            good=config["bisect"]["good"],
            bad=config["bisect"]["bad"],
            runs=config["bisect"]["runs"],
            repeats=config["bisect"]["repeats"],
            arm=BISECT_ARM.as_config(),
            server=SERVER.as_config(),
            client=CLIENT.as_config(),
            monitors=MONITORS.as_config(),
            criterion=config["change_criterion"],
            sources_dir="resources/commits",
            seed=config["seed"],
        script:
            "../scripts/commit_bisect.py"
