#!/usr/bin/env bash
# etcd.sh runs a local three-member etcd cluster on 127.0.0.1 for the load
# harness's etcd target (loadtest/targets/etcd).
#
# Usage: etcd.sh start|stop|status|kill N|killleader|killfollower|leader|endpoints|install|clean
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

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DIR=${LOADTEST_PEER_DIR:-$ROOT/data/peers/etcd}
CLIENT_BASE=${ETCD_CLIENT_BASE:-12379}
PEER_BASE=${ETCD_PEER_BASE:-$((CLIENT_BASE + 1))}
START_TIMEOUT=${PEER_START_TIMEOUT:-60}
HOST=127.0.0.1
MEMBERS=(1 2 3)

die() { echo "etcd.sh: $*" >&2; exit 1; }

client_port() { echo $((CLIENT_BASE + 10 * ($1 - 1))); }
peer_port() { echo $((PEER_BASE + 10 * ($1 - 1))); }
client_url() { echo "http://$HOST:$(client_port "$1")"; }
member_dir() { echo "$DIR/etcd$1"; }
pid_file() { echo "$(member_dir "$1")/etcd.pid"; }
log_file() { echo "$(member_dir "$1")/etcd.log"; }

check_ports() {
	local seen=" " p n
	for n in "${MEMBERS[@]}"; do
		for p in "$(client_port "$n")" "$(peer_port "$n")"; do
			[[ $seen == *" $p "* ]] && die "port $p is used twice: choose ETCD_CLIENT_BASE and ETCD_PEER_BASE so that base+0/10/20 do not overlap"
			seen+="$p "
		done
	done
}

# member_pid N prints the pid of member N when it is running (a live process
# whose command line names this member's data dir), else nothing.
member_pid() {
	local f pid
	f=$(pid_file "$1")
	[[ -f $f ]] || return 0
	pid=$(<"$f")
	[[ $pid =~ ^[0-9]+$ ]] || return 0
	if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$(member_dir "$1")/data"; then
		echo "$pid"
	fi
}

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

stop_system_service() {
	# The Debian package may start its own etcd on the default ports; this
	# harness runs its own members, so keep the system one stopped and disabled.
	if command -v systemctl >/dev/null 2>&1 && systemctl is-system-running >/dev/null 2>&1; then
		systemctl disable --now etcd >/dev/null 2>&1 || true
	fi
	if [[ -x /etc/init.d/etcd ]]; then
		/etc/init.d/etcd stop >/dev/null 2>&1 || true
		command -v update-rc.d >/dev/null 2>&1 && update-rc.d etcd disable >/dev/null 2>&1 || true
	fi
}

install() {
	command -v etcd >/dev/null 2>&1 && return 0
	echo "etcd.sh: etcd not found; installing etcd-server with apt-get" >&2
	export DEBIAN_FRONTEND=noninteractive
	if ! apt-get install -y etcd-server >&2; then
		apt-get update >&2
		apt-get install -y etcd-server >&2
	fi
	stop_system_service
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

log_tails() {
	local n
	for n in "${MEMBERS[@]}"; do
		echo "---- etcd$n log tail ($(log_file "$n")) ----" >&2
		tail -n 20 "$(log_file "$n")" >&2 2>/dev/null || true
	done
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
	check_ports
	install
	mkdir -p "$DIR"
	local n started=0
	for n in "${MEMBERS[@]}"; do
		if [[ -z $(member_pid "$n") ]]; then
			start_member "$n"
			started=1
		fi
	done
	# A member that dies at once (port in use, bad flag) shows up here.
	sleep 0.3
	for n in "${MEMBERS[@]}"; do
		if [[ -z $(member_pid "$n") ]]; then
			echo "etcd.sh: etcd$n exited right after start" >&2
			log_tails
			exit 1
		fi
	done
	wait_healthy || exit 1
	((started)) || echo "etcd.sh: all members were already running" >&2
	endpoints
}

stop_member() {
	local n=$1 sig=${2:-TERM} pid i
	pid=$(member_pid "$n")
	if [[ -n $pid ]]; then
		kill "-$sig" "$pid" 2>/dev/null || true
		for ((i = 0; i < 100; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then
			kill -KILL "$pid" 2>/dev/null || true
			for ((i = 0; i < 50; i++)); do
				kill -0 "$pid" 2>/dev/null || break
				sleep 0.1
			done
		fi
	fi
	rm -f "$(pid_file "$n")"
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

leader() {
	local n
	for n in "${MEMBERS[@]}"; do
		[[ -n $(member_pid "$n") ]] || continue
		if is_leader "$n"; then
			echo "$n"
			return 0
		fi
	done
	return 1
}

# find_leader waits up to 10 s for a leader (one may be mid-election).
find_leader() {
	local deadline=$((SECONDS + 10)) l
	while ((SECONDS < deadline)); do
		if l=$(leader); then
			echo "$l"
			return 0
		fi
		sleep 0.2
	done
	die "no leader found"
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

endpoints() {
	local n out=""
	for n in "${MEMBERS[@]}"; do
		out+="${out:+,}$(client_url "$n")"
	done
	echo "$out"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) status ;;
kill)
	[[ ${2:-} =~ ^[1-3]$ ]] || die "usage: etcd.sh kill N (N in 1..3)"
	[[ -n $(member_pid "$2") ]] || die "etcd$2 is not running"
	stop_member "$2" KILL
	echo "$2"
	;;
killleader)
	l=$(find_leader)
	stop_member "$l" KILL
	echo "$l"
	;;
killfollower)
	l=$(find_leader)
	for n in "${MEMBERS[@]}"; do
		if [[ $n != "$l" && -n $(member_pid "$n") ]]; then
			stop_member "$n" KILL
			echo "$n"
			exit 0
		fi
	done
	die "no running follower"
	;;
leader) leader || die "no leader" ;;
endpoints) endpoints ;;
install) install ;;
clean)
	stop
	rm -rf "$DIR"
	;;
*)
	echo "usage: $0 start|stop|status|kill N|killleader|killfollower|leader|endpoints|install|clean" >&2
	exit 2
	;;
esac
