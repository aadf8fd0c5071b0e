# The thread x quota map (config: thread_quota_map): per variant and forced intra-op
# thread count, one server measured under each CPU quota in turn, then one table of
# every cell. The report draws it as heatmaps. It exists only when configured.

if config.get("thread_quota_map"):
    MAP = config["thread_quota_map"]
    # What one row reads of the map's settings (the variants and thread counts
    # are its wildcards).
    MAP_ROW = {
        key: MAP[key]
        for key in (
            "workload",
            "transport",
            "cpu_quotas",
            "concurrency",
            "requests",
            "warmup_requests",
            "output_tokens",
        )
    }

    rule map_row:
        input:
            variant="results/variants/{variant}.json",
            workload=f"results/workloads/{MAP['workload']}/manifest.json",
            host="results/{experiment}/host.json",
        output:
            row="results/{experiment}/thread-quota-map/{variant}/threads{threads}.json",
            cells=directory(
                "results/{experiment}/thread-quota-map/{variant}/threads{threads}"
            ),
        log:
            "results/logs/map_row/{experiment}/{variant}/threads{threads}.log",
        conda:
            "../envs/workflow.yaml"
        threads: WHOLE_HOST
        params:
            settings=MAP_ROW,
            server=SERVER.as_config(),
            client=CLIENT.as_config(),
            monitors=MONITORS.as_config(),
            sharing=HOST_SHARING.as_config(),
        script:
            "../scripts/map_row.py"

    rule map_table:
        input:
            rows=map_row_files(),
        output:
            table="results/{experiment}/tables/thread_quota_map.csv",
        log:
            "results/logs/map_table/{experiment}.log",
        localrule: True
        conda:
            "../envs/workflow.yaml"
        script:
            "../scripts/map_table.py"
