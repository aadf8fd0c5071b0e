# Container images (runtime docker or podman): one image per variant, built from a
# Dockerfile under envs/ that checks the variant's mm_utils.py inside the image. The
# embedded engine's image installs a wheelhouse made here with pip download, so the
# build needs no package index (and no CUDA torch creeps in).


rule wheelhouse:
    input:
        requirements=project_file("envs/embedded-requirements.txt"),
    output:
        wheelhouse=directory("resources/wheelhouse"),
    log:
        messages="results/logs/wheelhouse/messages.log",
        pip="results/logs/wheelhouse/pip.log",
    retries: 1
    localrule: True
    conda:
        "../envs/workflow.yaml"
    params:
        python_version=config["container"]["embedded_python_version"],
        glibc_version=config["container"]["embedded_glibc_version"],
    script:
        "../scripts/make_wheelhouse.py"


rule build_image:
    input:
        variant="results/variants/{variant}.json",
        dockerfile=project_file(f"envs/Dockerfile.{config['engine']}"),
        check=project_file("envs/verify_mm_utils.py"),
        wheelhouse=wheelhouse_of_engine(),
        package=package_files_of_engine(),
    output:
        image_id="results/images/{variant}.iid",
        inspect="results/images/{variant}.inspect.json",
    log:
        messages="results/logs/build_image/{variant}.log",
        build="results/logs/build_image/{variant}.build.log",
    conda:
        "../envs/workflow.yaml"
    # One build at a time: the second variant's build then reuses every layer of the
    # first but the variant's own, and no build slows another job down.
    threads: WHOLE_HOST
    params:
        runtime=config["runtime"],
        engine=config["engine"],
        settings=image_settings(),
    script:
        "../scripts/build_image.py"
