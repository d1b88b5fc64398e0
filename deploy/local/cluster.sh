#!/usr/bin/env bash
# A three-node Warden cluster on loopback: three real wardend processes in
# zones az1..az3, each with its own data directory, log and pid file.
#
#   deploy/local/cluster.sh start        start the nodes that are not running
#   deploy/local/cluster.sh start --secure   the same, serving TLS (see below)
#   deploy/local/cluster.sh stop         stop every node (SIGTERM, then SIGKILL)
#   deploy/local/cluster.sh status       which nodes run, and the shards
#   deploy/local/cluster.sh kill N       SIGKILL node N (a crash); start brings it back
#   deploy/local/cluster.sh pids         the pid of each running node, one a line
#
# Node N serves Connect on 127.0.0.1:$((LISTEN_BASE+N)) and Raft on
# 127.0.0.1:$((RAFT_BASE+N)). Environment: WARDEN_CLUSTER_DIR (default
# ./data/cluster), WARDEN_LISTEN_BASE (7070), WARDEN_RAFT_BASE (7100),
# WARDEND and WARDEN (the binaries, default ./bin/wardend and ./bin/warden),
# WARDEN_PPROF_BASE (unset: no profiler; else node N serves /debug/pprof/
# on 127.0.0.1:$((WARDEN_PPROF_BASE+N))).
#
# A plain start serves cleartext (wardend --insecure, the nodes sharing a
# cluster secret). start --secure writes throwaway TLS material to
# $WARDEN_CLUSTER_DIR/secure (warden tls local: ca.pem, the client CA that
# signed the nodes' client-API certificates and client.pem/client-key.pem;
# peer-ca.pem and the nodes' peer certificates), turns authentication on
# (wardend --auth-bootstrap auth.json) with two bearer tokens, each alone
# on one line: admin.token (role operator: everything) and orders.token
# (role orders: lock under orders/, to which client.pem's principal
# "client" is bound too), and serves TLS on the same ports,
# https://127.0.0.1:$((WARDEN_LISTEN_BASE+N)); the secure folder
# remembers the mode for later start, kill and status calls, which
# authenticate with admin.token.
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
secure=$dir/secure
secured() { [[ -f $secure/ca.pem ]]; }
# url N is node N's base URL; cli runs the warden CLI with the mode's
# TLS flags.
url() { if secured; then echo "https://$(listen "$1")"; else echo "http://$(listen "$1")"; fi; }
cli() {
	if secured; then
		"$warden" --cacert "$secure/ca.pem" --token-file "$secure/admin.token" "$@"
	else
		"$warden" "$@"
	fi
}

members=""
for n in "${nodes[@]}"; do
	members+="${members:+,}$n=$(raft "$n")=$(listen "$n")"
done

start() {
	mkdir -p "$dir"
	if [[ ${1:-} == --secure ]] && ! secured; then
		if [[ -n $(ls "$dir"/node-*.created 2>/dev/null) ]]; then
			echo "$dir holds a cluster started without --secure; stop it and remove $dir first" >&2
			exit 1
		fi
		"$warden" tls local --dir "$secure.tmp" --nodes "${#nodes[@]}" --host 127.0.0.1 >/dev/null
		"$warden" auth token generate --out "$secure.tmp/admin.token"
		"$warden" auth token generate --out "$secure.tmp/orders.token"
		cat >"$secure.tmp/auth.json" <<-'EOF'
			{
			  "roles": [
			    {"name": "operator", "grants": [{"permission": "admin"}, {"permission": "read"}, {"permission": "lock"},
			                                    {"permission": "quota.use"}, {"permission": "quota.admin"}]},
			    {"name": "orders", "grants": [{"permission": "lock", "prefix": "orders/"}]}
			  ],
			  "bindings": [
			    {"principal": "admin", "role": "operator"},
			    {"principal": "orders", "role": "orders"},
			    {"principal": "client", "role": "orders"}
			  ],
			  "tokens": [
			    {"principal": "admin", "file": "admin.token", "description": "cluster.sh operator"},
			    {"principal": "orders", "file": "orders.token", "description": "cluster.sh orders/ locks"}
			  ]
			}
		EOF
		mv "$secure.tmp" "$secure" # complete, or not there at all
	fi
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
		if secured; then
			extra+=(--tls-cert "$secure/node-$n.pem" --tls-key "$secure/node-$n-key.pem" --tls-client-ca "$secure/ca.pem"
				--peer-ca "$secure/peer-ca.pem" --peer-cert "$secure/node-$n-peer.pem" --peer-key "$secure/node-$n-peer-key.pem"
				--auth-bootstrap "$secure/auth.json")
		else
			extra+=(--cluster-secret-file "$dir/cluster-secret" --insecure)
		fi
		"$wardend" --node-id "$n" --zone "az$n" --raft-addr "$(raft "$n")" --listen "$(listen "$n")" \
			--data-dir "$dir/node-$n" --initial-members "$members" \
			"${extra[@]}" >>"$dir/node-$n.log" 2>&1 &
		echo $! >"$(pidfile "$n")"
		echo "node $n: pid $!, Connect on $(url "$n"), log $dir/node-$n.log"
	done
	# The nodes bootstrap the placement group together; wait until each serves.
	for n in "${nodes[@]}"; do
		for _ in $(seq 1 300); do
			if cli --addr "$(url "$n")" --timeout 1s admin nodes >/dev/null 2>&1; then
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
	if secured; then
		echo "cluster up: ./bin/warden --addr $(url 1) --cacert $secure/ca.pem --token-file $secure/admin.token admin shards"
	else
		echo "cluster up: ./bin/warden --addr $(url 1) admin shards"
	fi
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
			echo "node $n: running (pid $(cat "$(pidfile "$n")")), Connect on $(url "$n")"
		else
			echo "node $n: stopped"
		fi
	done
	for n in "${nodes[@]}"; do
		if running "$n"; then
			cli --addr "$(url "$n")" admin shards
			return
		fi
	done
}

case "${1:-}" in
start) start "${2:-}" ;;
stop) stop ;;
status) status ;;
pids)
	for n in "${nodes[@]}"; do
		if running "$n"; then
			cat "$(pidfile "$n")"
		fi
	done
	;;
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
	sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'
	exit 2
	;;
esac
