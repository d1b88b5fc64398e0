#!/usr/bin/env bash
# A three-node Warden cluster on loopback: three real wardend processes in
# zones az1..az3, each with its own data directory, log and pid file.
#
#   deploy/local/cluster.sh start        start the nodes that are not running
#   deploy/local/cluster.sh stop         stop every node (SIGTERM, then SIGKILL)
#   deploy/local/cluster.sh status       which nodes run, and the shards
#   deploy/local/cluster.sh kill N       SIGKILL node N (a crash); start brings it back
#
# Node N serves Connect on 127.0.0.1:$((LISTEN_BASE+N)) and Raft on
# 127.0.0.1:$((RAFT_BASE+N)). Environment: WARDEN_CLUSTER_DIR (default
# ./data/cluster), WARDEN_LISTEN_BASE (7070), WARDEN_RAFT_BASE (7100),
# WARDEND and WARDEN (the binaries, default ./bin/wardend and ./bin/warden),
# WARDEN_PPROF_BASE (unset: no profiler; else node N serves /debug/pprof/
# on 127.0.0.1:$((WARDEN_PPROF_BASE+N))).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
dir=${WARDEN_CLUSTER_DIR:-$root/data/cluster}
listen_base=${WARDEN_LISTEN_BASE:-7070}
raft_base=${WARDEN_RAFT_BASE:-7100}
wardend=${WARDEND:-$root/bin/wardend}
warden=${WARDEN:-$root/bin/warden}
nodes=(1 2 3)

listen() { echo "127.0.0.1:$((listen_base + $1))"; }
raft() { echo "127.0.0.1:$((raft_base + $1))"; }
pidfile() { echo "$dir/node-$1.pid"; }
running() { [[ -f $(pidfile "$1") ]] && kill -0 "$(cat "$(pidfile "$1")")" 2>/dev/null; }

members=""
for n in "${nodes[@]}"; do
	members+="${members:+,}$n=$(raft "$n")=$(listen "$n")"
done

start() {
	mkdir -p "$dir"
	# The node-to-node API requires a secret shared by the nodes.
	if [[ ! -f $dir/cluster-secret ]]; then
		(umask 077 && od -An -tx1 -N24 /dev/urandom | tr -d ' \n' >"$dir/cluster-secret")
	fi
	for n in "${nodes[@]}"; do
		if running "$n"; then
			continue
		fi
		extra=()
		# Only a node's very first start may initialise its data directory
		# (--initial-cluster-state new). Once it has started, a node whose
		# directory is lost refuses to start rather than vote again under
		# its old id; node-N.created records that first start.
		if [[ ! -f $dir/node-$n.created ]]; then
			extra+=(--initial-cluster-state new)
			touch "$dir/node-$n.created"
		fi
		if [[ -n ${WARDEN_PPROF_BASE:-} ]]; then
			extra+=(--pprof-addr "127.0.0.1:$((WARDEN_PPROF_BASE + n))")
		fi
		"$wardend" --node-id "$n" --zone "az$n" --raft-addr "$(raft "$n")" --listen "$(listen "$n")" \
			--data-dir "$dir/node-$n" --initial-members "$members" --cluster-secret-file "$dir/cluster-secret" \
			"${extra[@]}" >>"$dir/node-$n.log" 2>&1 &
		echo $! >"$(pidfile "$n")"
		echo "node $n: pid $!, Connect on $(listen "$n"), log $dir/node-$n.log"
	done
	# The nodes bootstrap the placement group together; wait until each serves.
	for n in "${nodes[@]}"; do
		for _ in $(seq 1 300); do
			if "$warden" --addr "http://$(listen "$n")" --timeout 1s admin nodes >/dev/null 2>&1; then
				continue 2
			fi
			if ! running "$n"; then
				echo "node $n exited; see $dir/node-$n.log" >&2
				tail -n 20 "$dir/node-$n.log" >&2
				exit 1
			fi
			sleep 0.2
		done
		echo "node $n did not come up within 60 s; see $dir/node-$n.log" >&2
		exit 1
	done
	echo "cluster up: ./bin/warden --addr http://$(listen 1) admin shards"
}

stop() {
	for n in "${nodes[@]}"; do
		if running "$n"; then
			kill -TERM "$(cat "$(pidfile "$n")")"
		fi
	done
	for n in "${nodes[@]}"; do
		for _ in $(seq 1 100); do
			running "$n" || break
			sleep 0.1
		done
		if running "$n"; then
			kill -KILL "$(cat "$(pidfile "$n")")"
		fi
		rm -f "$(pidfile "$n")"
	done
	echo "cluster stopped"
}

status() {
	for n in "${nodes[@]}"; do
		if running "$n"; then
			echo "node $n: running (pid $(cat "$(pidfile "$n")")), Connect on $(listen "$n")"
		else
			echo "node $n: stopped"
		fi
	done
	for n in "${nodes[@]}"; do
		if running "$n"; then
			"$warden" --addr "http://$(listen "$n")" admin shards
			return
		fi
	done
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) status ;;
kill)
	n=${2:?usage: cluster.sh kill N}
	if ! running "$n"; then
		echo "node $n is not running" >&2
		exit 1
	fi
	kill -KILL "$(cat "$(pidfile "$n")")"
	while running "$n"; do sleep 0.05; done
	echo "node $n killed"
	;;
*)
	sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
	exit 2
	;;
esac
