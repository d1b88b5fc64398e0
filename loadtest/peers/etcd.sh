#!/usr/bin/env bash
# etcd.sh runs a local three-member etcd cluster on 127.0.0.1 for the load
# harness's etcd target (loadtest/targets/etcd).
#
# Usage: etcd.sh start|stop|status|kill N|killleader|killfollower|leader|endpoints|pids|install|clean
#
#   start         install etcd-server if missing, start every member that is not
#                 running, and wait until all running members are healthy
#                 (bounded by PEER_START_TIMEOUT seconds, default 60). On
#                 timeout it prints each member's log tail and exits 1.
#                 Also restarts members that "kill" stopped.
#   stop          SIGTERM every member this script started (pid files), then
#                 SIGKILL whatever is left after 10 s.
#   status        one line per member: number, pid, client URL, state, role;
#                 exits 0 only when all three are running and healthy.
#   kill N        SIGKILL member N (1..3).
#   killleader    SIGKILL the current leader; prints its member number.
#   killfollower  SIGKILL one running member that is not the leader; prints
#                 its member number.
#   leader        prints the leader's member number.
#   endpoints     prints the client URLs, comma separated.
#   pids          prints the pid of each running member, one a line.
#   install       apt-get install etcd-server if the etcd binary is missing.
#   clean         stop, then remove the data directory.
#
# Environment:
#   LOADTEST_PEER_DIR   data/log/pid directory (default <repo>/data/peers/etcd);
#                       member n uses LOADTEST_PEER_DIR/etcd<n>/.
#   ETCD_CLIENT_BASE    client port of member 1 (default 12379); member n
#                       listens on ETCD_CLIENT_BASE + 10*(n-1).
#   ETCD_PEER_BASE      peer port of member 1 (default ETCD_CLIENT_BASE+1);
#                       member n uses ETCD_PEER_BASE + 10*(n-1).
#   ETCD_EXTRA_ARGS     extra etcd flags, word-split (default empty).
#   PEER_START_TIMEOUT  seconds start waits for health (default 60).
#
# fsync stays on (etcd's defaults: WAL and backend are fsynced), the same as
# Warden. The only non-default flag is periodic MVCC history compaction every
# 5 minutes (--auto-compaction-retention=5m), which is how production etcd
# is run and keeps a long load test under the 2 GiB backend quota.
set -euo pipefail

PEER_NAME=etcd
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CLIENT_BASE=${ETCD_CLIENT_BASE:-12379}
PEER_BASE=${ETCD_PEER_BASE:-$((CLIENT_BASE + 1))}
LEADER_WAIT=10 # seconds find_leader waits (one may be mid-election)

client_port() { echo $((CLIENT_BASE + 10 * ($1 - 1))); }
peer_port() { echo $((PEER_BASE + 10 * ($1 - 1))); }
client_url() { echo "http://$HOST:$(client_port "$1")"; }
endpoint() { client_url "$1"; }
# A running member's command line names its data dir.
member_marker() { echo "$(member_dir "$1")/data"; }

# (curl's output is captured first: with pipefail, grep -q closing the pipe
# early would fail the pipeline.)
healthy() {
	local out
	out=$(curl -fsS --max-time 2 "$(client_url "$1")/health" 2>/dev/null) || return 1
	[[ $out == *'"health":"true"'* ]]
}
is_leader() {
	local out
	out=$(curl -fsS --max-time 2 "$(client_url "$1")/metrics" 2>/dev/null) || return 1
	grep -qE '^etcd_server_is_leader 1' <<<"$out"
}

install() {
	command -v etcd >/dev/null 2>&1 && return 0
	echo "etcd.sh: etcd not found; installing etcd-server with apt-get" >&2
	apt_install etcd-server
	# The Debian package may start its own etcd on the default ports; this
	# harness runs its own members, so keep the system one stopped and disabled.
	stop_system_service etcd
	command -v etcd >/dev/null 2>&1 || die "etcd still missing after apt-get install etcd-server"
}

initial_cluster() {
	local n out=""
	for n in "${MEMBERS[@]}"; do
		out+="${out:+,}etcd$n=http://$HOST:$(peer_port "$n")"
	done
	echo "$out"
}

start_member() {
	local n=$1 d
	d=$(member_dir "$n")
	mkdir -p "$d"
	# shellcheck disable=SC2086 # ETCD_EXTRA_ARGS is meant to be word-split.
	etcd --name "etcd$n" \
		--data-dir "$d/data" \
		--listen-client-urls "$(client_url "$n")" \
		--advertise-client-urls "$(client_url "$n")" \
		--listen-peer-urls "http://$HOST:$(peer_port "$n")" \
		--initial-advertise-peer-urls "http://$HOST:$(peer_port "$n")" \
		--initial-cluster "$(initial_cluster)" \
		--initial-cluster-token "warden-load-$CLIENT_BASE" \
		--initial-cluster-state new \
		--auto-compaction-mode periodic --auto-compaction-retention 5m \
		--logger zap --log-outputs stderr \
		${ETCD_EXTRA_ARGS:-} \
		</dev/null >>"$(log_file "$n")" 2>&1 &
	echo $! >"$(pid_file "$n")"
}

wait_healthy() {
	local deadline=$((SECONDS + START_TIMEOUT)) n ok
	while ((SECONDS < deadline)); do
		ok=1
		for n in "${MEMBERS[@]}"; do
			[[ -n $(member_pid "$n") ]] || continue
			healthy "$n" || { ok=0; break; }
		done
		((ok)) && return 0
		sleep 0.2
	done
	echo "etcd.sh: cluster not healthy after ${START_TIMEOUT}s" >&2
	log_tails
	return 1
}

start() {
	check_ports "ETCD_CLIENT_BASE and ETCD_PEER_BASE" client_port peer_port
	install
	start_missing 0.3
	wait_healthy || exit 1
	((STARTED)) || echo "etcd.sh: all members were already running" >&2
	endpoints
}

# stop terminates the followers first, then the leader: a leader that gets
# SIGTERM while its peers are still up tries to hand leadership over and,
# when they are going down at the same moment, waits ~7 s for that to time
# out; with no active peer left it skips the handover and exits at once.
stop() {
	local n l
	l=$(leader) || l=0
	for n in "${MEMBERS[@]}"; do
		[[ $n == "$l" ]] || stop_member "$n" TERM &
	done
	wait
	[[ $l == 0 ]] || stop_member "$l" TERM
}

status() {
	local n pid state role rc=0
	for n in "${MEMBERS[@]}"; do
		pid=$(member_pid "$n")
		role=-
		if [[ -z $pid ]]; then
			state=stopped
			pid=-
			rc=3
		elif healthy "$n"; then
			state=healthy
			if is_leader "$n"; then role=leader; else role=follower; fi
		else
			state=unhealthy
			rc=3
		fi
		echo "etcd$n pid=$pid url=$(client_url "$n") state=$state role=$role"
	done
	return $rc
}

dispatch "$@"
