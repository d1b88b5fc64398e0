#!/usr/bin/env bash
# zk.sh runs a local three-server ZooKeeper ensemble on 127.0.0.1 for the
# load harness's ZooKeeper target (loadtest/targets/zk). The servers run from
# the Debian package's jars (java -cp ... QuorumPeerMain), not as a system
# service.
#
# Usage: zk.sh start|stop|status|kill N|killleader|killfollower|leader|endpoints|pids|install|clean
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
#   pids          prints the pid of each running member, one a line.
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

PEER_NAME=zk
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CLIENT_BASE=${ZK_CLIENT_BASE:-12181}
QUORUM_BASE=${ZK_QUORUM_BASE:-$((CLIENT_BASE + 1))}
ELECTION_BASE=${ZK_ELECTION_BASE:-$((CLIENT_BASE + 2))}
TICK_MS=${ZK_TICK_MS:-2000}
MIN_SESSION_MS=${ZK_MIN_SESSION_MS:-$((2 * TICK_MS))}
MAX_SESSION_MS=${ZK_MAX_SESSION_MS:-60000}
HEAP=${ZK_HEAP:-512m}
LEADER_WAIT=15 # seconds find_leader waits (one may be mid-election)
ZK_JAR=/usr/share/java/zookeeper.jar
# zookeeper.jar's manifest Class-Path names its dependencies in
# /usr/share/java; slf4j-simple (from libslf4j-java, a dependency of
# libzookeeper-java) is the logging backend, writing to the server's log.
LOG_JAR=/usr/share/java/slf4j-simple.jar

client_port() { echo $((CLIENT_BASE + 10 * ($1 - 1))); }
quorum_port() { echo $((QUORUM_BASE + 10 * ($1 - 1))); }
election_port() { echo $((ELECTION_BASE + 10 * ($1 - 1))); }
cfg_file() { echo "$(member_dir "$1")/zoo.cfg"; }
endpoint() { echo "$HOST:$(client_port "$1")"; }
# A running server's command line names its config.
member_marker() { cfg_file "$1"; }

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

is_leader() { [[ $(mode "$1") == leader ]]; }

installed() { [[ -f $ZK_JAR ]] && command -v java >/dev/null 2>&1; }

install() {
	installed && return 0
	echo "zk.sh: ZooKeeper not found; installing zookeeper with apt-get" >&2
	apt_install zookeeper
	# The zookeeper package ships no service (zookeeperd does); if one is
	# there and running on the default ports, keep it stopped and disabled.
	stop_system_service zookeeper
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
	check_ports "ZK_CLIENT_BASE/ZK_QUORUM_BASE/ZK_ELECTION_BASE" client_port quorum_port election_port
	install
	start_missing 0.5
	wait_serving || exit 1
	endpoints
}

stop() {
	local n
	for n in "${MEMBERS[@]}"; do
		stop_member "$n" TERM &
	done
	wait
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
		echo "zk$n pid=$pid addr=$(endpoint "$n") mode=$m"
	done
	return $rc
}

dispatch "$@"
