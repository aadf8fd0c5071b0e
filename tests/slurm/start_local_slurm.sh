#!/usr/bin/env bash
# A real single-node SLURM cluster on this host, for testing the workflow's SLURM
# profile: installs Debian's slurm-wlm and munge when missing, writes a private
# slurm.conf (the host is the only node, in partition `local`), and starts munged,
# slurmctld and slurmd, all with their state, sockets, pid files and logs under one
# directory. No system service is started; the one thing outside that directory is
# the symlink /etc/slurm/slurm.conf to our config, because the executor plugin's job
# step drops SLURM_CONF before its `srun` (only SLURM's default path reaches it).
# stop_local_slurm.sh removes the symlink; an /etc/slurm/slurm.conf of a real SLURM
# installation is never replaced.
#
#   slurm_env=$(tests/slurm/start_local_slurm.sh) && eval "$slurm_env"   # SLURM_CONF
#   tests/slurm/stop_local_slurm.sh
#
# Prints only the `export SLURM_CONF=...` line on stdout (progress goes to stderr)
# once `sinfo` shows the node idle. Settings: SLURM_STATE_DIR (default
# /var/tmp/serving-study-slurm), SLURM_CONTROLLER_PORT and SLURM_NODE_PORT (16817 and
# 16818, away from a system SLURM's 6817/6818).
#
# The cluster is the lightest that still answers `sacct`: no slurmdbd and no database.
# Accounting storage is off and finished jobs are written by jobcomp/filetxt, which
# `sacct --completion` reads; slurmctld keeps finished jobs for MinJobAge, so `squeue`
# (the executor plugin's status query here) still sees them. Jobs run in cgroups
# (cgroup v1, proctrack/cgroup with the freezer and task/cgroup confining each job to
# its CPUs with cpuset); memory is not confined, so no process leaves the memory
# cgroup this host put it in.
set -euo pipefail

STATE=${SLURM_STATE_DIR:-/var/tmp/serving-study-slurm}
CONTROLLER_PORT=${SLURM_CONTROLLER_PORT:-16817}
NODE_PORT=${SLURM_NODE_PORT:-16818}
CONF=$STATE/etc/slurm.conf
DEFAULT_CONF=/etc/slurm/slurm.conf
MUNGE_SOCKET=$STATE/munge/munge.socket.2
HERE=$(cd "$(dirname "$0")" && pwd)

say() { echo "local-slurm: $*" >&2; }

timed() {
	local started=$SECONDS
	"$@"
	say "$(($SECONDS - started)) s: $1 ${2:-}"
}

install_packages() {
	local missing=()
	command -v slurmctld >/dev/null || missing+=(slurmctld)
	command -v slurmd >/dev/null || missing+=(slurmd)
	command -v sbatch >/dev/null || missing+=(slurm-client)
	command -v munged >/dev/null || missing+=(munge)
	[ ${#missing[@]} -eq 0 ] && return 0
	say "installing ${missing[*]} from Debian"
	export DEBIAN_FRONTEND=noninteractive
	timed apt-get update -qq >&2
	timed apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

# `slurmd -C` prints this host's NodeName, CPUs, sockets, cores, threads and memory
# as slurm.conf wants them; its second line is the uptime.
node_line() {
	slurmd -C | head -n 1
}

write_config() {
	local node name memory_mb
	node=$(node_line)
	name=$(sed -n 's/^NodeName=\([^ ]*\).*/\1/p' <<<"$node")
	# Leave 1 GiB to everything else on the host.
	memory_mb=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node")
	node=${node/RealMemory=$memory_mb/RealMemory=$((memory_mb - 1024))}
	mkdir -p "$STATE"/{etc,munge,ctld,spool,log}
	# slurmctld -c starts job ids from 1 again: so does the job completion log.
	rm -f "$STATE/log/jobcomp.txt"
	cat >"$CONF" <<EOF
# Written by tests/slurm/start_local_slurm.sh: a one-node test cluster.
ClusterName=serving-study-local
SlurmctldHost=$name(127.0.0.1)
SlurmctldPort=$CONTROLLER_PORT
SlurmdPort=$NODE_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
MpiDefault=none
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/log/jobcomp.txt
MinJobAge=3600
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
$node State=UNKNOWN
PartitionName=local Nodes=$name Default=YES MaxTime=INFINITE State=UP
EOF
	cat >"$STATE/etc/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
ConstrainCores=yes
ConstrainRAMSpace=no
ConstrainSwapSpace=no
ConstrainDevices=no
EOF
}

link_default_config() {
	if [ -e "$DEFAULT_CONF" ] && [ "$(readlink "$DEFAULT_CONF")" != "$CONF" ]; then
		say "$DEFAULT_CONF exists and is not this test cluster's; a real SLURM is"
		say "configured here, so this script leaves it alone: use that cluster instead"
		return 1
	fi
	mkdir -p "$(dirname "$DEFAULT_CONF")"
	ln -sfn "$CONF" "$DEFAULT_CONF"
}

start_munge() {
	if [ ! -s "$STATE/munge/munge.key" ]; then
		dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
	fi
	chmod 700 "$STATE/munge"
	chmod 400 "$STATE/munge/munge.key"
	munged --force --socket="$MUNGE_SOCKET" --key-file="$STATE/munge/munge.key" \
		--pid-file="$STATE/munge/munged.pid" --log-file="$STATE/log/munged.log" \
		--seed-file="$STATE/munge/munged.seed"
}

node_state() {
	sinfo --noheader --format=%T 2>/dev/null | head -n 1
}

wait_until_idle() {
	local state=
	for _ in $(seq 1 150); do
		state=$(node_state)
		[ "$state" = idle ] && return 0
		sleep 0.2
	done
	say "the node is not idle after 30 s (state: ${state:-none}); the logs end with:"
	tail -n 15 "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" >&2 || true
	return 1
}

if [ "$(id -u)" != 0 ]; then
	say "needs root (it installs packages and runs slurmd as root)"
	exit 1
fi
export SLURM_CONF=$CONF
if [ -s "$STATE/slurmctld.pid" ] && [ "$(node_state)" = idle ]; then
	say "already running ($CONF)"
	echo "export SLURM_CONF=$CONF"
	exit 0
fi
# Whatever fails from here stops what this call started.
trap '"$HERE/stop_local_slurm.sh" >&2' ERR
install_packages
"$HERE/stop_local_slurm.sh" >&2
write_config
link_default_config
timed start_munge
# Both daemons fork into the background and write their pid files; -c starts the
# controller without state from an earlier run.
slurmctld -c
slurmd
timed wait_until_idle
trap - ERR
say "$(sinfo --noheader --format='partition %P: node %N, %c CPUs, %m MB, %T')"
echo "export SLURM_CONF=$CONF"
