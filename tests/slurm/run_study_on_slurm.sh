#!/usr/bin/env bash
# The study's smallest config (config/test/config.yaml) through a real SLURM: starts
# a one-node cluster on this host (start_local_slurm.sh), installs the executor plugin
# when missing, runs the workflow with profiles/slurm (its resource requests adapted
# to this node by local_resources.py: partition `local`, no GPU, the node's CPUs),
# runs the same config locally, and checks with SLURM's own records that preflight and
# every arm ran as SLURM jobs and that both runs wrote the same results
# (check_slurm_run.py). Stops the cluster on exit, whatever happened.
#
#   tests/slurm/run_study_on_slurm.sh        # as root; about 3 minutes on 2 cores
#
# Settings: SLURM_STUDY_DIR (the two runs' working directories and logs, kept;
# default a new directory under /var/tmp, deleted after a passing check and kept
# after a failure), PYTHON (default python3), and those of start_local_slurm.sh.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/tests/slurm
PYTHON=${PYTHON:-python3}
PLUGIN=snakemake-executor-plugin-slurm
PLUGIN_PIN=$PLUGIN==2.8.0
CONFIG=$ROOT/config/test/config.yaml
EXPERIMENT=test-embedded
WORK=${SLURM_STUDY_DIR:-}

say() { echo "run-study-on-slurm: $*" >&2; }

timed() {
	local started=$SECONDS
	"$@"
	say "$(($SECONDS - started)) s: $*"
}

snakemake_in() {
	local workdir=$1
	shift
	"$PYTHON" -m snakemake all --snakefile "$ROOT/Snakefile" --directory "$workdir" \
		--configfile "$CONFIG" "$@"
}

run_on_slurm() {
	local resources
	mapfile -t resources < <("$PYTHON" "$HERE/local_resources.py" "$ROOT/profiles/slurm/profile.yaml")
	# squeue, not sacct, answers the plugin's status queries: without slurmdbd, plain
	# sacct has no records (MinJobAge keeps finished jobs visible to squeue).
	snakemake_in "$WORK/slurm" --workflow-profile "$ROOT/profiles/slurm" "${resources[@]}" \
		--slurm-status-command squeue --slurm-init-seconds-before-status-checks 2 \
		--slurm-keep-successful-logs >"$WORK/slurm.log" 2>&1 || {
		say "the SLURM run failed; its log ends with:"
		tail -n 40 "$WORK/slurm.log" >&2
		return 1
	}
}

run_locally() {
	snakemake_in "$WORK/local" --cores 1 >"$WORK/local.log" 2>&1 || {
		say "the local run failed; its log ends with:"
		tail -n 40 "$WORK/local.log" >&2
		return 1
	}
}

finish() {
	local status=$?
	"$HERE/stop_local_slurm.sh"
	if [ "$status" = 0 ] && [ -z "${SLURM_STUDY_DIR:-}" ]; then
		rm -rf "$WORK"
	elif [ "$status" != 0 ]; then
		say "failed; the runs and their logs are in $WORK"
	fi
}

if [ "$(id -u)" != 0 ]; then
	say "needs root (SLURM's daemons and the arms' CPU-quota cgroups)"
	exit 1
fi
if [ -n "$WORK" ]; then
	mkdir -p "$WORK"
else
	WORK=$(mktemp -d /var/tmp/serving-study-slurm-run.XXXXXX)
fi
say "working in $WORK"
trap finish EXIT
slurm_env=$(timed "$HERE/start_local_slurm.sh")
eval "$slurm_env" # exports SLURM_CONF
if ! "$PYTHON" -m pip show --quiet "$PLUGIN" >/dev/null 2>&1; then
	timed "$PYTHON" -m pip install --quiet "$PLUGIN_PIN" >&2
fi
timed run_on_slurm
timed run_locally
"$PYTHON" "$HERE/check_slurm_run.py" --slurm-run "$WORK/slurm" --local-run "$WORK/local" \
	--snakemake-log "$WORK/slurm.log" --experiment "$EXPERIMENT"
