#!/usr/bin/env bash
# Stops the test cluster of start_local_slurm.sh: slurmd, slurmctld and munged, each
# by the pid in its own pid file under the state directory, then removes the empty
# cgroups SLURM made and the /etc/slurm/slurm.conf symlink to its config. Safe to run
# when nothing is running. With `--purge` it also deletes the state directory
# (config, logs, job records).
set -euo pipefail

STATE=${SLURM_STATE_DIR:-/var/tmp/serving-study-slurm}

say() { echo "local-slurm: $*" >&2; }

# The pid in a pid file, when that process is alive (a zombie does not count).
live_pid() {
	local pid
	# The daemon may remove its pid file as it exits, between any two reads.
	pid=$(cat "$1" 2>/dev/null) && [ -n "$pid" ] || return 1
	[ -r "/proc/$pid/stat" ] && [ "$(awk '{print $3}' "/proc/$pid/stat")" != Z ] || return 1
	echo "$pid"
}

stop_daemon() {
	local name=$1 pid_file=$2 pid
	pid=$(live_pid "$pid_file") || {
		rm -f "$pid_file"
		return 0
	}
	kill -TERM "$pid" 2>/dev/null || true
	for _ in $(seq 1 100); do
		live_pid "$pid_file" >/dev/null || break
		sleep 0.1
	done
	if pid=$(live_pid "$pid_file"); then
		say "$name ($pid) did not stop in 10 s; killing it"
		kill -KILL "$pid" 2>/dev/null || true
		sleep 0.5
	fi
	rm -f "$pid_file"
	say "stopped $name"
}

stop_daemon slurmd "$STATE/slurmd.pid"
stop_daemon slurmctld "$STATE/slurmctld.pid"
stop_daemon munged "$STATE/munge/munged.pid"
# slurmd leaves its (empty) groups, slurm_<node>/ in each hierarchy it used; rmdir
# removes only empty ones.
for group in /sys/fs/cgroup/*/slurm_"$(hostname -s)"; do
	[ -d "$group" ] || continue
	find "$group" -depth -type d -exec rmdir {} + 2>/dev/null || true
done
if [ "$(readlink /etc/slurm/slurm.conf 2>/dev/null)" = "$STATE/etc/slurm.conf" ]; then
	rm -f /etc/slurm/slurm.conf
fi
if [ "${1:-}" = --purge ]; then
	rm -rf "$STATE"
	say "removed $STATE"
fi
