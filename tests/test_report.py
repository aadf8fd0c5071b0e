"""The HTML report: one offline page, escaped strings, every chart's spec, and
captions that Snakemake can render; built from the fixture in
tests/fixtures/report."""

import json
import platform
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import docutils.core
import docutils.utils
import jinja2
import markupsafe
import pytest
import vl_convert
import yaml

from serving_study.analysis.aggregate import aggregate, read_tables, write_tables
from serving_study.config.records import Arm
from serving_study.measure.run_metrics import summarize_run
from serving_study.measure.run_node import describe_node, node_record
from serving_study.report import markup
from serving_study.report.charts import chart_specs
from serving_study.report.page import build_report
from serving_study.report.settings import ReportSettings
from serving_study.report.study_setup import platform_html

ROOT = Path(__file__).parent.parent
FIXTURE = Path(__file__).parent / "fixtures" / "report"
HOSTILE = '<script>alert("config")</script>'


class PageParts(HTMLParser):
    """Collects what the tests look at: script tags, links and visible text."""

    def __init__(self):
        super().__init__()
        self.scripts: list[dict] = []
        self.links: list[dict] = []
        self.text: list[str] = []
        self._script: dict | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "script":
            self._script = {"attrs": dict(attrs), "body": ""}
        if tag in ("link", "img", "iframe"):
            self.links.append(dict(attrs))

    def handle_endtag(self, tag):
        if tag == "script" and self._script is not None:
            self.scripts.append(self._script)
            self._script = None

    def handle_data(self, data):
        if self._script is not None:
            self._script["body"] += data
        else:
            self.text.append(data)

    def chart_specs(self) -> dict[str, dict]:
        return {
            script["attrs"]["data-chart"]: json.loads(
                script["body"], parse_constant=refuse_constant
            )
            for script in self.scripts
            if "data-chart" in script["attrs"]
        }


def refuse_constant(name):
    raise ValueError(f"{name} is not JSON that a browser can parse")


def parse(path: Path) -> PageParts:
    parts = PageParts()
    parts.feed(path.read_text(encoding="utf-8"))
    parts.close()
    return parts


# What the aggregation reads of a run besides its metrics, where the run has it.
RUN_FILES_READ = ("attempts.json", "provenance.json")


def write_fixture_metrics(
    config: dict, out_dir: Path, runs: Path = FIXTURE / "runs"
) -> list[Path]:
    """Summarize every run under runs/<arm>/run<k> into
    out_dir/<arm>/run<k>/metrics.json, beside the run's RUN_FILES_READ."""
    arms = {arm["name"]: Arm.from_config(arm) for arm in config["arms"]}
    paths = []
    for directory in sorted(runs.glob("*/run*")):
        metrics = summarize_run(
            directory / "requests.jsonl",
            directory / "monitors.json",
            arms[directory.parent.name],
            json.loads((directory / "checks.json").read_text()),
        )
        path = out_dir / directory.parent.name / directory.name / "metrics.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(metrics))
        for name in RUN_FILES_READ:
            if (directory / name).exists():
                shutil.copyfile(directory / name, path.with_name(name))
        paths.append(path)
    return paths


def files_beside(metrics_paths: list[Path], name: str) -> list[Path]:
    """Each run's file ``name`` beside its metrics, or none when a run lacks it."""
    paths = [path.with_name(name) for path in metrics_paths]
    return paths if all(path.exists() for path in paths) else []


def report_settings(config: dict) -> ReportSettings:
    """The record the report job builds from its part of the config, which always
    names the engine (the fixture's config leaves it out)."""
    return ReportSettings.from_config({"engine": "embedded", **config})


def load_inputs(tmp_path: Path, config: dict, runs: Path = FIXTURE / "runs"):
    metrics = write_fixture_metrics(config, tmp_path / "runs", runs)
    tables = aggregate(
        metrics,
        config,
        attempts_paths=files_beside(metrics, "attempts.json"),
        provenance_paths=files_beside(metrics, "provenance.json"),
    )
    write_tables(tables, tmp_path / "tables")
    host = json.loads((FIXTURE / "host.json").read_text())
    variants = [json.loads(p.read_text()) for p in sorted(FIXTURE.glob("variants/*"))]
    return read_tables(tmp_path / "tables"), host, variants


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The fixture's report, built once: (tables, config, page, figures dir)."""
    tmp_path = tmp_path_factory.mktemp("report")
    config = yaml.safe_load((FIXTURE / "config.yaml").read_text())
    tables, host, variants = load_inputs(tmp_path, config)
    page = tmp_path / "report.html"
    written = build_report(
        tables,
        report_settings(config),
        host,
        variants,
        page,
        figures_dir=tmp_path / "figures",
    )
    return {
        "tables": tables,
        "config": config,
        "page": page,
        "figures": tmp_path / "figures",
        "written": written,
    }


def test_page_parses_and_loads_nothing_from_the_network(built):
    parts = parse(built["page"])
    assert parts.scripts, "the page has no scripts: the charts cannot render"
    assert all("src" not in script["attrs"] for script in parts.scripts)
    assert all(
        not str(link.get("href") or link.get("src") or "").startswith(("http", "//"))
        for link in parts.links
    )
    # The inlined libraries define vegaEmbed, which the last script calls.
    assert "window.vegaEmbed=" in parts.scripts[0]["body"]
    assert "vegaEmbed(" in parts.scripts[-1]["body"]


def written_spec(built, name: str) -> dict:
    return json.loads((built["figures"] / f"{name}.vl.json").read_text())


def test_page_carries_every_shown_chart_spec(built):
    embedded = parse(built["page"]).chart_specs()
    # One concurrency in the fixture: Figure 1 stays off the page.
    assert embedded == {"chart-arm_comparison": written_spec(built, "arm_comparison")}


def test_page_states_verdicts_setup_and_tables(built):
    text = " ".join(parse(built["page"]).text)
    for sentence in built["tables"]["claims"]["sentence"]:
        assert sentence in text
    assert "1 of 6 runs was invalid" in text
    assert "fixture-host" in text
    assert "Example Xeon" in text
    assert "2026-01-01 10:00 to 2026-01-01 10:25 UTC" in text
    assert "envs/patches/pr48881.diff" in text
    assert "1.6 [1–2]" in text  # original throughput: median [min–max]
    assert "4.5 [4–5]" in text  # patched, run 3 left out
    assert "run1 2; run2 5" in text


def test_the_setup_names_what_served_the_requests(built, tmp_path):
    """The embedded engine's timed stand-in, with its timing, is named on the page;
    so is the tiny model of the real server on CPU."""
    text = " ".join(parse(built["page"]).text)
    assert (
        "a timed stand-in, not a model (the embedded engine): 20 ms of prefill per "
        "image, 10 ms per decode step" in text
    )
    config = yaml.safe_load((FIXTURE / "config.yaml").read_text())
    config |= {"engine": "sglang", "sglang": {"device": "cpu"}}
    tables, host, variants = load_inputs(tmp_path, config)
    page = tmp_path / "report.html"
    settings = ReportSettings.from_config(config)
    build_report(tables, settings, host, variants, page, figures_dir=tmp_path / "f")
    text = " ".join(parse(page).text)
    assert "a stand-in: a seeded tiny Qwen3-VL with random weights" in text


def test_strings_from_logs_are_escaped(built):
    html = built["page"].read_text(encoding="utf-8")
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_strings_from_config_are_escaped_in_text_and_in_chart_specs(tmp_path):
    config = yaml.safe_load((FIXTURE / "config.yaml").read_text())
    config["experiment"] = f"exp {HOSTILE}"
    config["description"] = f"about {HOSTILE}"
    config["arms"][0]["variant"] = HOSTILE
    tables, host, variants = load_inputs(tmp_path, config)
    host["cpu_model"] = HOSTILE
    page = tmp_path / "report.html"
    build_report(tables, report_settings(config), host, variants, page)

    html = page.read_text(encoding="utf-8")
    assert HOSTILE not in html
    assert html.count(markupsafe.escape(HOSTILE)) >= 4
    parts = parse(page)
    # Only our own scripts: bundle, one spec, embedder.
    assert len(parts.scripts) == 3
    spec = parts.chart_specs()["chart-arm_comparison"]
    assert HOSTILE in strings_in(spec)  # the data is intact once parsed


def strings_in(value) -> set[str]:
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return set().union(*(strings_in(item) for item in value))
    return set()


@pytest.mark.slow
def test_several_concurrencies_put_figure_1_on_the_page(tmp_path):
    config = yaml.safe_load((FIXTURE / "config.yaml").read_text())
    config["arms"][1]["concurrency"] = 16
    tables, host, variants = load_inputs(tmp_path, config)
    page = tmp_path / "report.html"
    build_report(tables, report_settings(config), host, variants, page)

    embedded = parse(page).chart_specs()
    assert list(embedded) == [
        "chart-throughput_vs_concurrency",
        "chart-arm_comparison",
    ]
    figure_1 = embedded["chart-throughput_vs_concurrency"]
    specs = chart_specs(tables, report_settings(config))
    assert figure_1 == specs["throughput_vs_concurrency"]
    svg = vl_convert.vegalite_to_svg(figure_1)
    assert "concurrency" in svg and "study" in svg


def test_each_figure_and_table_has_its_own_offline_page(built):
    figures = built["figures"]
    names = sorted(path.name for path in figures.iterdir())
    assert names == [
        "arm_comparison.html",
        "arm_comparison.vl.json",
        "table_arms.html",
        "table_attempts.html",
        "table_claims.html",
        "table_invalid_runs.html",
        "table_ratios.html",
        "table_runs.html",
        "throughput_vs_concurrency.html",
        "throughput_vs_concurrency.vl.json",
    ]
    assert sorted(built["written"]) == sorted([built["page"], *figures.iterdir()])
    for name in ("arm_comparison", "throughput_vs_concurrency"):
        spec = written_spec(built, name)
        assert spec["title"].startswith("Figure")
        parts = parse(figures / f"{name}.html")
        assert parts.chart_specs() == {f"chart-{name}": spec}
        assert all("src" not in script["attrs"] for script in parts.scripts)
    claims_page = parse(figures / "table_claims.html")
    assert not claims_page.scripts
    assert "cannot tell" in " ".join(claims_page.text)


class TableCells(HTMLParser):
    """Each row of a page's tables as its cells' text, headers included."""

    def __init__(self):
        super().__init__()
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def test_the_claims_table_says_beside_each_verdict_what_it_is(built):
    """Beside each verdict: test or confirmation, and where its bound came from."""
    cells = TableCells()
    cells.feed((built["figures"] / "table_claims.html").read_text())
    header, *rows = cells.rows
    at = header.index("verdict")
    assert header[at : at + 3] == ["verdict", "test or confirmation", "bound from"]
    claims = built["tables"]["claims"]
    assert [row[at : at + 3] for row in rows] == [
        [claim.verdict, claim.judged_as, claim.bound_from]
        for claim in claims.itertuples()
    ]
    assert {row[at + 1] for row in rows} == {"test", "confirmation"}
    text = " ".join(parse(built["page"]).text)
    for claim in claims.itertuples():
        judged = f"{claim.verdict} here, a {claim.judged_as} of a bound from"
        assert judged in claim.sentence and claim.sentence in text


EARLIER_ATTEMPTS = "Earlier attempts (superseded or failed; never in a median)"


def with_earlier_attempts(runs: Path, reason: str) -> Path:
    """``runs``, with original run 2 measured thrice as its attempts.json lists it:
    a superseded attempt, its current one, and one that failed outside the arm."""
    listing = runs / "original" / "run2" / "attempts.json"
    (current,) = json.loads(listing.read_text())
    superseded = {
        "attempt": "20260101T095000.000000Z-4100",
        "outcome": "superseded",
        "valid": False,
        "throughput_rps": 0.5,
        "invalid_reasons": [reason],
    }
    failed = {
        "attempt": "20260101T103000.000000Z-4300",
        "outcome": "failed outside the arm",
        "valid": False,
        "throughput_rps": None,
        "invalid_reasons": ["the host's other load was 1.6 cores"],
    }
    listing.write_text(json.dumps([superseded, current, failed], indent=2) + "\n")
    return runs


def test_earlier_attempts_have_a_section_only_when_a_run_has_some(built, tmp_path):
    assert EARLIER_ATTEMPTS not in " ".join(parse(built["page"]).text)
    own_page = " ".join(parse(built["figures"] / "table_attempts.html").text)
    assert "None: every run was measured once." in own_page

    config = yaml.safe_load((FIXTURE / "config.yaml").read_text())
    runs = tmp_path / "logs"
    shutil.copytree(FIXTURE / "runs", runs)
    reason = "server restarted <b>twice</b>"
    tables, host, variants = load_inputs(
        tmp_path, config, with_earlier_attempts(runs, reason)
    )
    page = tmp_path / "report.html"
    build_report(tables, report_settings(config), host, variants, page)

    text = " ".join(parse(page).text)
    assert EARLIER_ATTEMPTS in text
    for shown in (
        "20260101T095000.000000Z-4100",
        "superseded",
        "20260101T103000.000000Z-4300",
        "failed outside the arm",
        "the host's other load was 1.6 cores",
        reason,
    ):
        assert shown in text
    assert reason not in page.read_text(encoding="utf-8")  # escaped
    assert "1.6 [1–2]" in text  # original's median, as without the attempts


def test_the_runs_table_flags_a_run_on_another_node(built, tmp_path):
    assert "node differs from host.json in" not in (
        built["figures"] / "table_runs.html"
    ).read_text(encoding="utf-8")

    config = yaml.safe_load((FIXTURE / "config.yaml").read_text())
    runs = tmp_path / "logs"
    shutil.copytree(FIXTURE / "runs", runs)
    elsewhere = {"hostname": f"not-{platform.node()}"}
    for directory in runs.glob("*/run*"):
        host = elsewhere if directory.name == "run1" else describe_node()
        provenance = node_record(host)
        (directory / "provenance.json").write_text(json.dumps(provenance))
    tables, host, variants = load_inputs(tmp_path, config, runs)
    figures = tmp_path / "figures"
    build_report(
        tables, report_settings(config), host, variants, tmp_path / "r.html", figures
    )

    parts = parse(figures / "table_runs.html")
    text = " ".join(parts.text)
    assert "node differs from host.json in" in text
    assert text.count("hostname") == 2  # original run 1 and patched run 1


def test_figure_4_renders_with_the_arms_and_the_study_numbers(built):
    svg = vl_convert.vegalite_to_svg(written_spec(built, "arm_comparison"))
    for expected in ("original", "patched", "study", "reproduction", "TTFT p50"):
        assert expected in svg


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node")
def test_inlined_bundle_runs_and_specs_parse_in_javascript(built, tmp_path):
    # Run the page's own scripts in node: the bundle must define vegaEmbed
    # without any import, and every spec block must be valid JSON for JS.
    checker = tmp_path / "check.js"
    checker.write_text(
        """
const html = require("fs").readFileSync(process.argv[2], "utf8");
const blocks = [...html.matchAll(/<script([^>]*)>([\\s\\S]*?)<\\/script>/g)];
globalThis.window = globalThis;
(0, eval)(blocks[0][2]);
if (typeof window.vegaEmbed !== "function") throw new Error("no vegaEmbed");
const specs = blocks.filter(b => b[1].includes("data-chart"))
  .map(b => JSON.parse(b[2]));
console.log(specs.length, specs.map(s => s.title.text || s.title).join("|"));
"""
    )
    result = subprocess.run(
        ["node", str(checker), str(built["page"])],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "1 Figure 4: arms side by side, with the study's numbers"
    )


class FakeSnakemake:
    """What a caption sees: config, and wildcards that may lack a name."""

    def __init__(self, config: dict):
        self.config = config
        self.wildcards = type("Wildcards", (), {"experiment": config["experiment"]})()


@pytest.mark.parametrize(
    "caption", sorted((ROOT / "report").glob("*.rst")), ids=lambda path: path.name
)
def test_captions_render_as_restructured_text(caption):
    config = yaml.safe_load((FIXTURE / "config.yaml").read_text())
    html = render_caption(caption, config)
    assert html.strip()
    if caption.name == "workflow.rst":
        assert "fixture-2x3" in html


def render_caption(caption: Path, config: dict) -> str:
    """A caption as Snakemake's report renders it: Jinja with its settings, then
    docutils (here failing on warnings too)."""
    environment = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    source = environment.from_string(caption.read_text()).render(
        snakemake=FakeSnakemake(config)
    )
    return docutils.core.publish_parts(
        source,
        writer="html",
        settings_overrides={"halt_level": docutils.utils.Reporter.WARNING_LEVEL},
    )["html_body"]


def test_the_config_description_is_text_in_snakemakes_report(tmp_path):
    # Docutils runs directives by default: raw HTML and file inclusion.
    secret = tmp_path / "secret.txt"
    secret.write_text("included-from-disk\n")
    config = yaml.safe_load((FIXTURE / "config.yaml").read_text())
    config["description"] = (
        "Plain words.\n\n"
        ".. raw:: html\n\n   <script>alert('description')</script>\n\n"
        f".. include:: {secret}\n"
    )
    html = render_caption(ROOT / "report" / "workflow.rst", config)
    assert "<script" not in html
    assert "&lt;script&gt;alert('description')&lt;/script&gt;" in html
    assert ".. include::" in html
    assert "included-from-disk" not in html


def test_a_real_server_on_cpu_says_what_differs_from_a_gpu_host():
    arm = {"variant": "v", "workload": "w", "cpu_quota": 1.0}
    arm |= {"concurrency": 1, "requests": 1}
    config = {
        "experiment": "cpu-host",
        "engine": "sglang",
        "sglang": {"device": "cpu"},
        "arms": [
            arm | {"name": "A"},
            arm | {"name": "A-main", "quota_scope": "main_process"},
        ],
    }
    text = platform_html(ReportSettings.from_config(config))
    assert "what differs from a GPU host" in text
    assert "tiny Qwen3-VL" in text and "stand-in" in text
    assert "in: A-main; the whole server elsewhere" in text
    on_gpu = config | {"sglang": {"device": "cuda"}}
    assert platform_html(ReportSettings.from_config(on_gpu)) == ""
    embedded = {key: value for key, value in config.items() if key != "sglang"}
    embedded["engine"] = "embedded"
    assert platform_html(ReportSettings.from_config(embedded)) == ""


def test_a_real_server_with_the_hosts_torch_names_every_deviation_and_its_model():
    config = yaml.safe_load((ROOT / "config" / "gpu-host-real.yaml").read_text())
    settings = ReportSettings.from_config(config)
    text = platform_html(settings)

    assert "with this host&#39;s torch: what differs from the study" in text
    for named in ("torch 2.14.1", "sgl-kernel is a stand-in", "cutlass", "Triton"):
        assert named in text.replace("&#39;", "'"), named
    assert "no CUDA graphs" in text and "muse_spark" in text
    assert "A, B, C, D, E, A-passive, A-spin0; the whole server" in text
    assert settings.model.startswith("a stand-in: a Qwen3-VL with every size of ")
    assert "random weights" in settings.model and "tiny tokenizer" in settings.model


# --- in a browser: no text from the inputs runs -------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="needs headless Chromium (Debian: apt-get install chromium; .ci/run "
    "installs it)",
)

# Free-text fields the page shows, each given payload(field) by hostile_inputs.
SHOWN_FIELDS = (
    "experiment",
    "description",
    "environment",
    "statement",
    "error",
    "reference_source",
    "hostname",
    "cpu_model",
    "torch_version",
    "gpu_reason",
    "variant_source",
    "attempt_reason",
)
PAYLOAD_KINDS = ("script", "img", "breakout", "attribute")


def payload(field: str) -> str:
    """Text that, parsed as markup, marks the page with data-pwned-<kind>="<field>":
    as a script element, an image's onerror, by closing the script element it sits
    in, or by closing a quoted attribute."""

    def mark(kind: str) -> str:
        # Split so that the marker never stands in the page as mere text.
        return (
            f"document.documentElement.setAttribute('data-pw'+'ned-{kind}','{field}')"
        )

    return (
        f"{field}: <script>{mark('script')}</script>"
        f' <img src=x onerror="{mark("img")}">'
        f" </script><script>{mark('breakout')}</script>"
        f' "><img src=x onerror="{mark("attribute")}">'
    )


def hostile_inputs(tmp_path: Path):
    """The fixture with a payload in every free-text field of the config, the
    host, the variants, a failed request's error and an earlier attempt's reason:
    (tables, config, host, variants)."""
    runs = tmp_path / "logs"
    shutil.copytree(FIXTURE / "runs", runs)
    failed = runs / "patched" / "run3" / "requests.jsonl"
    records = [json.loads(line) for line in failed.read_text().splitlines()]
    for record in records:
        if record["error"]:
            record["error"] = payload("error")
    failed.write_text("".join(json.dumps(record) + "\n" for record in records))
    with_earlier_attempts(runs, payload("attempt_reason"))
    environment = {"PAYLOAD_NOTE": payload("environment")}
    # The server saw the arm's environment: the patched runs stay as valid as before.
    for path in runs.glob("patched/run*/checks.json"):
        checks = json.loads(path.read_text())
        path.write_text(json.dumps(checks | {"environment_seen": environment}))

    config = yaml.safe_load((FIXTURE / "config.yaml").read_text())
    config["experiment"] = payload("experiment")
    config["description"] = payload("description")
    config["arms"][0]["description"] = payload("arm_description")
    config["arms"][1]["environment"] = environment
    config["claims"][0]["statement"] = payload("statement")
    config["reference"]["source"] = payload("reference_source")
    tables, host, variants = load_inputs(tmp_path, config, runs)
    host["hostname"] = payload("hostname")
    host["cpu_model"] = payload("cpu_model")
    host["versions"]["torch"] = payload("torch_version")
    host["gpu"] = {"gpus": [], "reason": payload("gpu_reason")}
    variants[1]["source"] = {
        "kind": "git",
        "url": payload("variant_source"),
        "commit": "297e54f",
    }
    return tables, config, host, variants


def rendered_dom(page: Path, profile: Path) -> str:
    """The page's DOM once its scripts ran, from headless Chromium that can
    resolve no host name (so the page must load nothing from the network)."""
    result = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",  # Chromium's sandbox refuses to run as root
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=30000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@needs_chromium
def test_no_text_from_the_inputs_runs_in_a_browser(tmp_path, monkeypatch):
    tables, config, host, variants = hostile_inputs(tmp_path)
    page = tmp_path / "report.html"
    build_report(tables, report_settings(config), host, variants, page)
    dom = rendered_dom(page, tmp_path / "profile")

    assert "data-pwned" not in dom
    parts = PageParts()
    parts.feed(dom)
    text = " ".join(parts.text)
    for field in SHOWN_FIELDS:
        assert f"{field}: <script>" in text, f"{field} is not on the page as text"
    # The page's own scripts did run: the chart is drawn, with the export action
    # alone (no action writes or posts the spec elsewhere).
    assert 'class="marks"' in dom
    assert "Save as SVG" in text
    for action in ("View Source", "View Compiled Vega", "Open in Vega Editor"):
        assert action not in text

    # The same inputs without escaping do run, each kind of payload: what this
    # test looks for is what a payload that gets through leaves.
    # The report's templates, with autoescaping off and JSON written as it is.
    unescaped_templates = markup.TEMPLATES.overlay(autoescape=False)
    unescaped_templates.filters = markup.TEMPLATES.filters | {"tojson": json.dumps}
    monkeypatch.setattr(markup, "TEMPLATES", unescaped_templates)
    unescaped = tmp_path / "unescaped.html"
    build_report(tables, report_settings(config), host, variants, unescaped)
    dom = rendered_dom(unescaped, tmp_path / "profile-unescaped")
    for kind in PAYLOAD_KINDS:
        assert f"data-pwned-{kind}=" in dom, kind
