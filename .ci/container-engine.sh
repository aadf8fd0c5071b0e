#!/usr/bin/env bash
# A private Docker engine for CI and the docker-marked tests, on a Debian host whose
# PID 1 is not systemd: installs Debian's docker.io and debootstrap when missing,
# starts dockerd on its own socket (no bridge, no iptables rules, nothing left in the
# host's network), and makes the base image localhost/bookworm-minbase from a
# debootstrap'd rootfs, so no registry is ever needed.
#
#   engine_env=$(.ci/container-engine.sh start) && eval "$engine_env"  # DOCKER_HOST
#   .ci/container-engine.sh stop     # stop dockerd, unmount what it left mounted
#   .ci/container-engine.sh purge    # stop, then delete its images and state
#   .ci/container-engine.sh run -- COMMAND [ARG...]   # start, run, stop on EXIT
#
# `start` is idempotent and prints only the `export DOCKER_HOST=...` line on stdout
# (progress goes to stderr). Settings: CONTAINER_ENGINE_DIR (state, default
# /var/tmp/serving-study-docker), BASE_IMAGE (default localhost/bookworm-minbase:latest),
# DEBIAN_MIRROR (default: the first mirror in this host's apt sources).
set -euo pipefail

STATE=${CONTAINER_ENGINE_DIR:-/var/tmp/serving-study-docker}
BASE_IMAGE=${BASE_IMAGE:-localhost/bookworm-minbase:latest}
SOCKET=unix://$STATE/docker.sock
PIDFILE=$STATE/dockerd.pid

say() { echo "container-engine: $*" >&2; }

timed() {
	local started=$SECONDS
	"$@"
	say "$(($SECONDS - started)) s: $1 ${2:-}"
}

docker_here() { DOCKER_HOST=$SOCKET docker "$@"; }

engine_answers() { docker_here info >/dev/null 2>&1; }

dockerd_pid() {
	local pid
	[ -s "$PIDFILE" ] || return 1
	pid=$(cat "$PIDFILE")
	# A zombie still "exists" for kill -0: look at its state instead.
	[ -r "/proc/$pid/stat" ] && [ "$(awk '{print $3}' "/proc/$pid/stat")" != Z ] || return 1
	echo "$pid"
}

install_packages() {
	local missing=()
	command -v dockerd >/dev/null || missing+=(docker.io)
	command -v debootstrap >/dev/null || missing+=(debootstrap)
	[ ${#missing[@]} -eq 0 ] && return 0
	say "installing ${missing[*]} from Debian"
	export DEBIAN_FRONTEND=noninteractive
	timed apt-get update -qq >&2
	timed apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

debian_mirror() {
	if [ -n "${DEBIAN_MIRROR:-}" ]; then
		echo "$DEBIAN_MIRROR"
	elif [ -r /etc/apt/sources.list.d/debian.sources ]; then
		awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources
	elif [ -r /etc/apt/sources.list ]; then
		awk '/^deb /{print $2; exit}' /etc/apt/sources.list
	else
		echo http://deb.debian.org/debian
	fi
}

start_dockerd() {
	mkdir -p "$STATE"
	# setsid: dockerd outlives this script; its output goes to a log, never to our
	# stdout (a caller reading `$(... start)` would otherwise wait for it forever).
	setsid dockerd --host="$SOCKET" --iptables=false --ip-forward=false --bridge=none \
		--storage-driver=overlay2 --data-root="$STATE/docker" --exec-root="$STATE/exec" \
		--pidfile="$PIDFILE" </dev/null >"$STATE/dockerd.log" 2>&1 &
	for _ in $(seq 1 150); do
		engine_answers && return 0
		sleep 0.2
	done
	say "dockerd did not answer within 30 s; its log ends with:"
	tail -n 20 "$STATE/dockerd.log" >&2
	return 1
}

import_base_image() {
	docker_here image inspect "$BASE_IMAGE" >/dev/null 2>&1 && return 0
	local rootfs=$STATE/rootfs mirror
	mirror=$(debian_mirror)
	say "making $BASE_IMAGE with debootstrap from $mirror"
	rm -rf "$rootfs"
	timed debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$STATE/debootstrap.log"
	rm -f "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin
	tar -C "$rootfs" -c . | docker_here import - "$BASE_IMAGE" >/dev/null
	rm -rf "$rootfs"
}

start() {
	if [ "$(id -u)" != 0 ]; then
		say "needs root (it installs packages and runs dockerd)"
		exit 1
	fi
	# Whatever fails from here stops the engine this call started.
	trap 'stop_quietly' ERR
	if ! dockerd_pid >/dev/null || ! engine_answers; then
		install_packages
		stop_quietly
		timed start_dockerd
	fi
	docker_here info --format 'engine {{.ServerVersion}}, storage {{.Driver}}, cgroup {{.CgroupDriver}} v{{.CgroupVersion}}' >&2
	import_base_image
	trap - ERR
	echo "export DOCKER_HOST=$SOCKET"
}

stop_quietly() {
	local pid
	if pid=$(dockerd_pid); then
		kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 1 150); do
			dockerd_pid >/dev/null || break
			sleep 0.2
		done
		if pid=$(dockerd_pid); then
			say "dockerd $pid did not stop in 30 s; killing it"
			kill -KILL "$pid" 2>/dev/null || true
			sleep 1
		fi
	fi
	rm -f "$PIDFILE"
	# dockerd leaves its network namespace mounted, and its (empty) parent cgroups.
	umount "$STATE/exec/netns/default" 2>/dev/null || true
	for group in /sys/fs/cgroup/*/docker; do
		rmdir "$group" 2>/dev/null || true
	done
}

stop() {
	stop_quietly
	say "stopped"
}

purge() {
	stop_quietly
	if [ -d "$STATE/docker" ] && grep -q " $STATE/" /proc/self/mounts; then
		say "mounts below $STATE remain; not deleting it:"
		grep " $STATE/" /proc/self/mounts >&2
		exit 1
	fi
	rm -rf "$STATE"
	say "stopped and removed $STATE"
}

run() {
	[ "${1:-}" = "--" ] && shift
	trap stop EXIT
	local exports
	exports=$(start)
	eval "$exports"
	"$@"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
purge) purge ;;
run)
	shift
	run "$@"
	;;
*)
	echo "usage: $0 start|stop|purge|run -- COMMAND..." >&2
	exit 2
	;;
esac
