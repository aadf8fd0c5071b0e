# The thread x quota map (config: thread_quota_map) in seeded shuffled blocks: each
# block measures every (variant, threads, quota) cell once, thread counts in a
# seeded order, both variants' servers side by side and their cells shuffled. Then
# one table of every cell, one of the variant contrast paired within blocks, and
# that contrast per quota. The report draws them as heatmaps and tables. It exists only when configured.

if config.get("thread_quota_map"):
    MAP = config["thread_quota_map"]
    # What a block reads of the map's settings (its number is its wildcard).
    MAP_BLOCK = {
        key: MAP[key]
        for key in (
            "variants",
            "workload",
            "transport",
            "intra_op_threads",
            "cpu_quotas",
            "concurrency",
            "requests",
            "warmup_requests",
            "output_tokens",
        )
    }

    rule map_block:
        input:
            variants=[variant_file(name) for name in MAP["variants"]],
            workload=workload_file(MAP["workload"]),
            host="results/{experiment}/host.json",
        output:
            block="results/{experiment}/thread-quota-map/block{block}.json",
            cells=directory("results/{experiment}/thread-quota-map/block{block}"),
        log:
            "results/logs/map_block/{experiment}/block{block}.log",
        conda:
            "../envs/workflow.yaml"
        threads: WHOLE_HOST
        params:
            settings=MAP_BLOCK,
            seed=config["seed"],
            server=SERVER.as_config(),
            client=CLIENT.as_config(),
            monitors=MONITORS.as_config(),
        script:
            "../scripts/map_block.py"

    rule map_table:
        input:
            blocks=map_block_files(),
        output:
            table="results/{experiment}/tables/thread_quota_map.csv",
            contrast="results/{experiment}/tables/thread_quota_map_contrast.csv",
            by_quota="results/{experiment}/tables/thread_quota_map_by_quota.csv",
        log:
            "results/logs/map_table/{experiment}.log",
        localrule: True
        conda:
            "../envs/workflow.yaml"
        params:
            variants=MAP["variants"],
        script:
            "../scripts/map_table.py"
