# How each results page's claims repeat across the sessions that measured them
# (analysis/repeatability.py): its top level and docs/results/<page>/sessions/*/, as
# committed. Nothing is measured here, and `all` does not ask for it:
#   snakemake --cores 1 repeatability
# A page publishes the two tables in its repeatability/ folder and the section in its
# README. Adding a session is moving its runs/, tables/ and host.json under sessions/
# and running this again.
from serving_study.analysis.repeatability import session_files, session_folders

RESULTS_PAGES = sorted(
    page.name
    for page in (PROJECT_ROOT / "docs" / "results").iterdir()
    if page.is_dir() and session_folders(page)
)


rule repeatability:
    input:
        expand("results/repeatability/{page}/section.md", page=RESULTS_PAGES),


rule page_repeatability:
    input:
        sessions=lambda wildcards: session_files(Path("docs/results", wildcards.page)),
    output:
        claims=report(
            "results/repeatability/{page}/claims.csv",
            caption="../report/repeatability.rst",
            category="Repeatability",
            labels={"page": "{page}", "item": "claims per session"},
        ),
        arms="results/repeatability/{page}/arms.csv",
        section="results/repeatability/{page}/section.md",
    log:
        "results/logs/repeatability/{page}.log",
    wildcard_constraints:
        page=one_of(RESULTS_PAGES),
    localrule: True
    conda:
        "../envs/workflow.yaml"
    params:
        page="docs/results/{page}",
    script:
        "../scripts/repeatability.py"
