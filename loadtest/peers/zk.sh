#!/usr/bin/env bash
# zk.sh runs a local three-server ZooKeeper ensemble on 127.0.0.1 for the
# load harness's ZooKeeper target (loadtest/targets/zk). The servers run from
# the Debian package's jars (java -cp ... QuorumPeerMain), not as a system
# service.
#
# Usage: zk.sh start|stop|status|kill N|killleader|killfollower|leader|endpoints|install|clean
#
#   start         install zookeeper if missing, start every server that is not
#                 running, and wait until every running server serves (reports
#                 Mode leader/follower) with one leader, bounded by
#                 PEER_START_TIMEOUT seconds (default 60). On timeout it prints
#                 each server's log tail and exits 1. Also restarts servers
#                 that "kill" stopped.
#   stop          SIGTERM every server this script started (pid files), then
#                 SIGKILL whatever is left after 10 s.
#   status        one line per server: number, pid, client address, mode;
#                 exits 0 only when all three serve.
#   kill N        SIGKILL server N (1..3).
#   killleader    SIGKILL the current leader; prints its server number.
#   killfollower  SIGKILL one running follower; prints its server number.
#   leader        prints the leader's server number.
#   endpoints     prints the client addresses (host:port), comma separated.
#   install       apt-get install zookeeper if its jar or java is missing.
#   clean         stop, then remove the data directory.
#
# Environment:
#   LOADTEST_PEER_DIR   data/log/pid directory (default <repo>/data/peers/zk);
#                       server n uses LOADTEST_PEER_DIR/zk<n>/.
#   ZK_CLIENT_BASE      client port of server 1 (default 12181); server n
#                       listens on ZK_CLIENT_BASE + 10*(n-1).
#   ZK_QUORUM_BASE      quorum port of server 1 (default ZK_CLIENT_BASE+1).
#   ZK_ELECTION_BASE    election port of server 1 (default ZK_CLIENT_BASE+2).
#   ZK_TICK_MS          tickTime in ms (default 2000, ZooKeeper's usual value).
#   ZK_MIN_SESSION_MS   minSessionTimeout (default 2*ZK_TICK_MS, ZooKeeper's own).
#   ZK_MAX_SESSION_MS   maxSessionTimeout (default 60000; ZooKeeper's own
#                       default, 20*tickTime = 40 s, would also allow 30 s).
#   ZK_HEAP             JVM -Xmx (default 512m).
#   PEER_START_TIMEOUT  seconds start waits (default 60).
#
# Durability stays at ZooKeeper's defaults (forceSync=yes: the transaction
# log is fsynced before a write is acknowledged), the same as Warden.
# Snapshots are taken by ZooKeeper itself every ~snapCount (100000) txns.
# The "srvr", "ruok", "mntr", "stat" and "conf" four-letter words are
# enabled (status and leader detection use srvr); the Jetty admin server is
# disabled.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DIR=${LOADTEST_PEER_DIR:-$ROOT/data/peers/zk}
CLIENT_BASE=${ZK_CLIENT_BASE:-12181}
QUORUM_BASE=${ZK_QUORUM_BASE:-$((CLIENT_BASE + 1))}
ELECTION_BASE=${ZK_ELECTION_BASE:-$((CLIENT_BASE + 2))}
TICK_MS=${ZK_TICK_MS:-2000}
MIN_SESSION_MS=${ZK_MIN_SESSION_MS:-$((2 * TICK_MS))}
MAX_SESSION_MS=${ZK_MAX_SESSION_MS:-60000}
HEAP=${ZK_HEAP:-512m}
START_TIMEOUT=${PEER_START_TIMEOUT:-60}
HOST=127.0.0.1
MEMBERS=(1 2 3)
ZK_JAR=/usr/share/java/zookeeper.jar
# zookeeper.jar's manifest Class-Path names its dependencies in
# /usr/share/java; slf4j-simple (from libslf4j-java, a dependency of
# libzookeeper-java) is the logging backend, writing to the server's log.
LOG_JAR=/usr/share/java/slf4j-simple.jar

die() { echo "zk.sh: $*" >&2; exit 1; }

client_port() { echo $((CLIENT_BASE + 10 * ($1 - 1))); }
quorum_port() { echo $((QUORUM_BASE + 10 * ($1 - 1))); }
election_port() { echo $((ELECTION_BASE + 10 * ($1 - 1))); }
member_dir() { echo "$DIR/zk$1"; }
pid_file() { echo "$(member_dir "$1")/zk.pid"; }
log_file() { echo "$(member_dir "$1")/zk.log"; }
cfg_file() { echo "$(member_dir "$1")/zoo.cfg"; }

check_ports() {
	local seen=" " p n
	for n in "${MEMBERS[@]}"; do
		for p in "$(client_port "$n")" "$(quorum_port "$n")" "$(election_port "$n")"; do
			[[ $seen == *" $p "* ]] && die "port $p is used twice: choose ZK_CLIENT_BASE/ZK_QUORUM_BASE/ZK_ELECTION_BASE so that base+0/10/20 do not overlap"
			seen+="$p "
		done
	done
}

# member_pid N prints the pid of server N when it is running (a live process
# whose command line names this server's config), else nothing.
member_pid() {
	local f pid
	f=$(pid_file "$1")
	[[ -f $f ]] || return 0
	pid=$(<"$f")
	[[ $pid =~ ^[0-9]+$ ]] || return 0
	if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$(cfg_file "$1")"; then
		echo "$pid"
	fi
}

# fourletter N CMD sends a four-letter word to server N and prints the reply.
fourletter() {
	timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1" && printf "%s" "$2" >&3 && cat <&3' "$HOST" "$(client_port "$1")" "$2" 2>/dev/null
}

# mode N prints leader, follower, or nothing when server N does not serve.
mode() {
	local out
	out=$(fourletter "$1" srvr) || return 0
	case "$out" in
	*"Mode: leader"*) echo leader ;;
	*"Mode: follower"*) echo follower ;;
	*"Mode: standalone"*) echo standalone ;;
	esac
}

installed() { [[ -f $ZK_JAR ]] && command -v java >/dev/null 2>&1; }

install() {
	installed && return 0
	echo "zk.sh: ZooKeeper not found; installing zookeeper with apt-get" >&2
	export DEBIAN_FRONTEND=noninteractive
	if ! apt-get install -y zookeeper >&2; then
		apt-get update >&2
		apt-get install -y zookeeper >&2
	fi
	# The zookeeper package ships no service (zookeeperd does); if one is
	# there and running on the default ports, keep it stopped and disabled.
	if command -v systemctl >/dev/null 2>&1 && systemctl is-system-running >/dev/null 2>&1; then
		systemctl disable --now zookeeper >/dev/null 2>&1 || true
	fi
	if [[ -x /etc/init.d/zookeeper ]]; then
		/etc/init.d/zookeeper stop >/dev/null 2>&1 || true
		command -v update-rc.d >/dev/null 2>&1 && update-rc.d zookeeper disable >/dev/null 2>&1 || true
	fi
	installed || die "ZooKeeper still missing after apt-get install zookeeper"
}

write_config() {
	local n=$1 d m
	d=$(member_dir "$n")
	mkdir -p "$d/data"
	echo "$n" >"$d/data/myid"
	{
		echo "tickTime=$TICK_MS"
		echo "initLimit=10"
		echo "syncLimit=5"
		echo "dataDir=$d/data"
		echo "clientPort=$(client_port "$n")"
		echo "clientPortAddress=$HOST"
		echo "maxClientCnxns=0"
		echo "minSessionTimeout=$MIN_SESSION_MS"
		echo "maxSessionTimeout=$MAX_SESSION_MS"
		echo "admin.enableServer=false"
		echo "4lw.commands.whitelist=srvr,ruok,mntr,stat,conf"
		for m in "${MEMBERS[@]}"; do
			echo "server.$m=$HOST:$(quorum_port "$m"):$(election_port "$m")"
		done
	} >"$(cfg_file "$n")"
}

start_member() {
	local n=$1
	write_config "$n"
	java -Xmx"$HEAP" -Xms64m \
		-Dorg.slf4j.simpleLogger.defaultLogLevel=info \
		-Dorg.slf4j.simpleLogger.showDateTime=true \
		-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd\'T\'HH:mm:ss.SSS \
		-Dzookeeper.admin.enableServer=false \
		-cp "$ZK_JAR:$LOG_JAR" \
		org.apache.zookeeper.server.quorum.QuorumPeerMain "$(cfg_file "$n")" \
		</dev/null >>"$(log_file "$n")" 2>&1 &
	echo $! >"$(pid_file "$n")"
}

log_tails() {
	local n
	for n in "${MEMBERS[@]}"; do
		echo "---- zk$n log tail ($(log_file "$n")) ----" >&2
		tail -n 20 "$(log_file "$n")" >&2 2>/dev/null || true
	done
}

wait_serving() {
	local deadline=$((SECONDS + START_TIMEOUT)) n ok leaders m
	while ((SECONDS < deadline)); do
		ok=1
		leaders=0
		for n in "${MEMBERS[@]}"; do
			[[ -n $(member_pid "$n") ]] || continue
			m=$(mode "$n")
			case "$m" in
			leader) leaders=$((leaders + 1)) ;;
			follower) ;;
			*) ok=0; break ;;
			esac
		done
		((ok && leaders == 1)) && return 0
		sleep 0.3
	done
	echo "zk.sh: ensemble not serving after ${START_TIMEOUT}s" >&2
	log_tails
	return 1
}

start() {
	check_ports
	install
	mkdir -p "$DIR"
	local n
	for n in "${MEMBERS[@]}"; do
		[[ -n $(member_pid "$n") ]] || start_member "$n"
	done
	sleep 0.5
	for n in "${MEMBERS[@]}"; do
		if [[ -z $(member_pid "$n") ]]; then
			echo "zk.sh: zk$n exited right after start" >&2
			log_tails
			exit 1
		fi
	done
	wait_serving || exit 1
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

stop() {
	local n
	for n in "${MEMBERS[@]}"; do
		stop_member "$n" TERM &
	done
	wait
}

leader() {
	local n
	for n in "${MEMBERS[@]}"; do
		[[ -n $(member_pid "$n") ]] || continue
		if [[ $(mode "$n") == leader ]]; then
			echo "$n"
			return 0
		fi
	done
	return 1
}

# find_leader waits up to 15 s for a leader (one may be mid-election).
find_leader() {
	local deadline=$((SECONDS + 15)) l
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
	local n pid m rc=0
	for n in "${MEMBERS[@]}"; do
		pid=$(member_pid "$n")
		if [[ -z $pid ]]; then
			m=stopped
			pid=-
			rc=3
		else
			m=$(mode "$n")
			if [[ -z $m ]]; then
				m=not-serving
				rc=3
			fi
		fi
		echo "zk$n pid=$pid addr=$HOST:$(client_port "$n") mode=$m"
	done
	return $rc
}

endpoints() {
	local n out=""
	for n in "${MEMBERS[@]}"; do
		out+="${out:+,}$HOST:$(client_port "$n")"
	done
	echo "$out"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) status ;;
kill)
	[[ ${2:-} =~ ^[1-3]$ ]] || die "usage: zk.sh kill N (N in 1..3)"
	[[ -n $(member_pid "$2") ]] || die "zk$2 is not running"
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
