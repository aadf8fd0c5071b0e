"""Container images of the variants: the build context, the build command, the record.

Each variant becomes one image, built with ``docker build`` or ``podman build``
from a context assembled here (hard links, so a 4,700-file SGLang tree costs
nothing to lay out):

* engine ``embedded`` (``envs/Dockerfile.embedded``): a local Debian base with
  Python 3, the wheelhouse (installed offline), the ``serving_study`` package and
  the variant's ``python/`` tree at ``/opt/variant/python``;
* engine ``sglang`` on a GPU host (``envs/Dockerfile.sglang``): the official SGLang
  image pinned by digest, with the variant's ``python/sglang`` copied over its
  editable install;
* engine ``sglang`` on a CPU host (``envs/Dockerfile.sglang-cpu``, image kind
  ``sglang-cpu``): the same local Debian base, the CPU runtime's lock installed
  offline from its wheelhouse, the load probe and the sgl-kernel stand-in (the
  platform's python-path directories), then the variant's complete
  ``python/sglang`` tree as the last layer, so two variants share every other one.

Every Dockerfile ends with ``envs/verify_mm_utils.py``, which fails the build unless
the image runs the variant's ``mm_utils.py`` (its sha256 is a build argument). The
image id comes from ``--iidfile``; the ``inspect`` JSON of the image is kept next to
it. Commands are argument lists; nothing from config reaches a shell.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from serving_study.sources.source_errors import last_line
from serving_study.sources.variants import link_or_copy
from serving_study.sources.wheelhouse import require_wheelhouse_unchanged

# The image kinds, each the suffix of its Dockerfile (envs/Dockerfile.<kind>) and
# the engine part of its tag; sglang-cpu is engine sglang on a CPU host.
ENGINES = ("embedded", "sglang", "sglang-cpu")
# Inside the embedded image: the variant's tree and the interpreter of the venv.
EMBEDDED_VARIANT_ROOT = "/opt/variant/python"
EMBEDDED_PYTHON = "/opt/venv/bin/python"
# In every context: what the study itself adds besides the variant.
SERVING_STUDY_DIRECTORY = "serving-study"
# The rule that makes each image's wheelhouse (rules/images.smk).
WHEELHOUSE_RULES = {"embedded": "wheelhouse", "sglang-cpu": "wheelhouse_sglang_cpu"}
PINNED_BY_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}\Z")
LABEL_PREFIX = "serving-study"
BUILD_TIMEOUT_S = 3600


# An image id as docker writes it; podman may leave out the "sha256:".
IMAGE_ID = re.compile(r"(?:sha256:)?([0-9a-f]{64})")


class ImageBuildFailed(RuntimeError):
    """An image could not be built; the message names the step and the fix."""


def image_tag(engine: str, variant_name: str) -> str:
    """``localhost/serving-study-<engine>:<variant>`` in the characters tags allow."""
    tag = re.sub(r"[^a-z0-9_.-]+", "-", variant_name.lower()).strip(".-") or "variant"
    return f"localhost/serving-study-{engine}:{tag[:128]}"


def image_labels(engine: str, variant: dict) -> dict[str, str]:
    """What the image holds, readable with ``docker inspect`` long after the build."""
    source = variant["source"]
    patch = variant.get("patch") or {}
    pull_request = variant.get("pull_request") or {}
    labels = {
        "engine": engine,
        "variant": variant["name"],
        "mm-utils-sha256": variant["mm_utils_sha256"],
        "source": source["name"],
        "source-pin": source.get("commit") or source.get("sha256") or "",
        "patch-sha256": patch.get("sha256", ""),
        "pull-request": str(pull_request.get("number", "")),
    }
    return {f"{LABEL_PREFIX}.{key}": value for key, value in labels.items()}


def build_arguments(engine: str, variant: dict, settings: dict) -> dict[str, str]:
    """The Dockerfile's build arguments for one variant.

    ``settings``: for ``embedded`` and ``sglang-cpu`` the config's ``container``
    section (``embedded_base_image``, ``embedded_python_version``: both images
    start from the same Debian base); for ``sglang`` the config's ``sglang``
    section, whose ``base_image`` must be pinned by digest.
    """
    arguments = {"MM_UTILS_SHA256": variant["mm_utils_sha256"]}
    if engine in ("embedded", "sglang-cpu"):
        arguments["BASE"] = settings["embedded_base_image"]
        arguments["PYTHON_VERSION"] = settings["embedded_python_version"]
    elif engine == "sglang":
        base_image = settings.get("base_image")
        if not base_image or not PINNED_BY_DIGEST.search(base_image):
            raise ImageBuildFailed(
                f"sglang.base_image is {base_image!r}; the SGLang image must be "
                "pinned by digest, e.g. lmsysorg/sglang:v0.5.23@sha256:<64 hex> "
                "(`docker pull lmsysorg/sglang:v0.5.23` then `docker image inspect "
                "--format '{{index .RepoDigests 0}}' lmsysorg/sglang:v0.5.23`)"
            )
        arguments["BASE_IMAGE"] = base_image
    else:
        raise ValueError(f"no image for engine {engine!r}")
    return arguments


def _copy_tree(source: Path, target: Path) -> None:
    shutil.copytree(
        source,
        target,
        copy_function=link_or_copy,
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"),
    )


def assemble_context(
    engine: str,
    variant: dict,
    context: Path,
    *,
    dockerfile: Path,
    verify_script: Path,
    package_directory: Path | None = None,
    wheelhouse: Path | None = None,
    python_path_directories: Sequence[Path] = (),
) -> Path:
    """Lay out the build context of one variant's image in ``context`` (created).

    ``variant`` is the variant's identity (results/<experiment>/variants/<name>.json),
    whose ``sglang_python_root`` is the variant's ``python/`` tree. The embedded
    image also takes ``package_directory`` (src/serving_study), both Debian images a
    ``wheelhouse`` and the SGLang images the platform's ``python_path_directories``,
    each laid out as ``serving-study/<its name>``. A wheelhouse's manifest stays
    out: its timestamp would defeat the build cache.
    """
    if engine not in ENGINES:
        raise ValueError(f"no image for engine {engine!r}")
    variant_python = Path(variant["sglang_python_root"])
    if not (variant_python / "sglang").is_dir():
        raise ImageBuildFailed(
            f"variant {variant['name']!r} has no tree at {variant_python}/sglang: "
            "run its prepare_variant job again"
        )
    context = Path(context)
    context.mkdir(parents=True)
    shutil.copyfile(dockerfile, context / "Dockerfile")
    shutil.copyfile(verify_script, context / Path(verify_script).name)
    if engine in WHEELHOUSE_RULES:
        _link_wheelhouse(engine, wheelhouse, context / "wheelhouse")
    if engine == "embedded":
        if package_directory is None:
            raise ValueError("the embedded image needs package_directory")
        _copy_tree(
            package_directory, context / SERVING_STUDY_DIRECTORY / "src/serving_study"
        )
        _copy_tree(variant_python, context / "variant/python")
    else:
        _copy_python_path_directories(
            python_path_directories, context / SERVING_STUDY_DIRECTORY
        )
        _copy_tree(variant_python / "sglang", context / "variant/python/sglang")
    return context


def _link_wheelhouse(engine: str, wheelhouse: Path | None, target: Path) -> None:
    """The wheels and the requirements (and constraints) files, without the
    manifest, once each is found as the manifest recorded it."""
    if wheelhouse is None or not (Path(wheelhouse) / "requirements.txt").is_file():
        raise ImageBuildFailed(
            f"the {engine} image needs a wheelhouse with requirements.txt; "
            f"{wheelhouse} has none (rule {WHEELHOUSE_RULES[engine]} makes it)"
        )
    require_wheelhouse_unchanged(Path(wheelhouse))
    target.mkdir()
    for path in Path(wheelhouse).iterdir():
        if path.suffix in (".whl", ".txt"):
            link_or_copy(path, target / path.name)


def _copy_python_path_directories(directories: Sequence[Path], target: Path) -> None:
    """Each directory the server's PYTHONPATH holds after the variant's tree, under
    its own name (the Dockerfile copies them by these names)."""
    names = [Path(directory).name for directory in directories]
    if not directories or len(set(names)) != len(names):
        raise ValueError(
            f"an SGLang image needs python-path directories of distinct names, "
            f"got {[str(directory) for directory in directories]}"
        )
    for directory in directories:
        if not Path(directory).is_dir():
            raise ImageBuildFailed(
                f"{directory} does not exist; the SGLang image puts it on the "
                "server's PYTHONPATH (sglang_platform.py names it)"
            )
        _copy_tree(Path(directory), target / Path(directory).name)


def build_command(
    runtime: str,
    context: Path,
    *,
    tag: str,
    arguments: dict[str, str],
    labels: dict[str, str],
    image_id_file: Path,
) -> list[str]:
    """``docker build`` / ``podman build`` of ``context`` writing the image id."""
    command = [runtime, "build", "--file", str(Path(context) / "Dockerfile")]
    command += ["--tag", tag, "--iidfile", str(image_id_file)]
    # A failed RUN's container would otherwise stay behind (Docker's legacy builder);
    # a RUN that fetches (apt-get, when the base lacks Python) needs the host's
    # network, since the engine may run without a bridge.
    command += ["--force-rm", "--network=host"]
    for name, value in sorted(arguments.items()):
        command += ["--build-arg", f"{name}={value}"]
    for name, value in sorted(labels.items()):
        command += ["--label", f"{name}={value}"]
    return command + ["--", str(context)]


def engine_answers(runtime: str) -> str | None:
    """None when the runtime's engine answers, else why not (one line)."""
    if shutil.which(runtime) is None:
        return f"{runtime} is not installed"
    version = "{{.ServerVersion}}" if runtime == "docker" else "{{.Version.Version}}"
    try:
        finished = subprocess.run(
            [runtime, "info", "--format", version],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        return f"`{runtime} info` did not answer within 60 s"
    if finished.returncode != 0:
        output = finished.stderr or finished.stdout
        return f"`{runtime} info` failed: {last_line(output)}"
    return None


def inspect_image(runtime: str, image_id: str) -> dict:
    """The runtime's ``image inspect`` record of one image."""
    finished = subprocess.run(
        [runtime, "image", "inspect", "--", image_id],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if finished.returncode != 0:
        raise ImageBuildFailed(
            f"`{runtime} image inspect {image_id}` failed: {finished.stderr.strip()}"
        )
    return json.loads(finished.stdout)[0]


def run_build(command: list[str], log_path: Path) -> None:
    """Run the build with its output in ``log_path``; raise with the log's tail."""
    with open(log_path, "a") as log:
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        finished = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=BUILD_TIMEOUT_S,
        )
    if finished.returncode != 0:
        tail = "\n".join(Path(log_path).read_text(errors="replace").splitlines()[-25:])
        raise ImageBuildFailed(
            f"`{command[0]} build` exited with code {finished.returncode}; the "
            f"build log ({log_path}) ends with:\n{tail}"
        )


def build_variant_image(
    *,
    runtime: str,
    engine: str,
    variant: dict,
    settings: dict,
    dockerfile: Path,
    verify_script: Path,
    image_id_file: Path,
    inspect_file: Path,
    log_path: Path,
    package_directory: Path | None = None,
    wheelhouse: Path | None = None,
    python_path_directories: Sequence[Path] = (),
) -> dict:
    """Build one variant's image; write its id and inspect record; return the record.

    ``engine`` is the image kind (see ``ENGINES``); the context is assembled
    beside ``image_id_file`` (see ``assemble_context``) and removed afterwards.
    """
    problem = engine_answers(runtime)
    if problem:
        raise ImageBuildFailed(
            f"cannot build images with {runtime}: {problem}. Start the engine (for "
            "Docker on a host without systemd: `.ci/container-engine.sh start`) or "
            "set runtime: local"
        )
    arguments = build_arguments(engine, variant, settings)
    image_id_file = Path(image_id_file)
    image_id_file.parent.mkdir(parents=True, exist_ok=True)
    image_id_file.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(
        dir=image_id_file.parent,
        prefix=f".{variant['name']}.",
        ignore_cleanup_errors=True,
    ) as scratch:
        context = assemble_context(
            engine,
            variant,
            Path(scratch) / "context",
            dockerfile=dockerfile,
            verify_script=verify_script,
            package_directory=package_directory,
            wheelhouse=wheelhouse,
            python_path_directories=python_path_directories,
        )
        command = build_command(
            runtime,
            context,
            tag=image_tag(engine, variant["name"]),
            arguments=arguments,
            labels=image_labels(engine, variant),
            image_id_file=image_id_file,
        )
        run_build(command, log_path)
    record = inspect_image(runtime, image_id_file.read_text().strip())
    Path(inspect_file).write_text(json.dumps(record, indent=2) + "\n")
    return record


def read_image_id(image_id_file: str | Path) -> str:
    """The image id a build wrote with --iidfile (``sha256:...``)."""
    text = Path(image_id_file).read_text().strip()
    image_id = normal_image_id(text)
    if image_id is None:
        raise ImageBuildFailed(
            f"{image_id_file} holds {text[:80]!r}, not an image id (sha256:...); "
            "build the image again"
        )
    return image_id


def normal_image_id(text: str) -> str | None:
    """``sha256:<64 hex>`` from an image id in either runtime's spelling, or None
    (a tag is not an id)."""
    matched = IMAGE_ID.fullmatch(text.strip())
    return f"sha256:{matched.group(1)}" if matched else None
