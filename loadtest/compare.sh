#!/usr/bin/env bash
# make loadtest-compare: Warden, etcd (lease + put-if-absent, and etcd's
# concurrency.Mutex) and ZooKeeper (the ephemeral-sequential lock recipe),
# each a three-member cluster on loopback with fsync on, one after the
# other on this machine, each driven by the same find-max run of the
# reference profile: the scale steps up from LOADTEST_FROM (0.125) by √2
# every LOADTEST_STEP (20s) until p99 acquire passes 200 ms or errors pass
# 0.1 %, then bisects between the last scale that passed and the first
# that failed until they are within LOADTEST_PRECISION (0.05: 5 %) of each
# other; a failing scale is tried twice. All of that is one compare run;
# it makes LOADTEST_RUNS (3) of them, one after the other, each writing
# <target>-report.{json,md} and -chart.png per target to
# $LOADTEST_OUT/run-<n> (LOADTEST_OUT: loadtest/out), and then compare.md
# to $LOADTEST_OUT: each target's median run, every run's max, the ratios
# against Warden, and what a commit costs each (CPU, allocations, Raft
# entries, memory).
# Installs etcd-server and zookeeper with apt when they are missing, and
# stops every cluster it started.
#
# Environment: LOADTEST_TARGETS ("warden etcd etcd-mutex zk"), LOADTEST_FROM,
# LOADTEST_STEP, LOADTEST_STEPS (10), LOADTEST_PRECISION, LOADTEST_RUNS,
# LOADTEST_OUT.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${LOADTEST_OUT:-$root/loadtest/out}
targets=${LOADTEST_TARGETS:-warden etcd etcd-mutex zk}
export WARDEN_LISTEN_BASE=${WARDEN_LISTEN_BASE:-27070} WARDEN_RAFT_BASE=${WARDEN_RAFT_BASE:-27100}
export WARDEN_CLUSTER_DIR=$out/cluster
export ETCD_CLIENT_BASE=${ETCD_CLIENT_BASE:-22379} ZK_CLIENT_BASE=${ZK_CLIENT_BASE:-22181}


mkdir -p "$out" "$root/bin"
go build -o "$root/bin/" ./cmd/...
(cd loadtest && go build -o "$root/bin/" ./cmd/warden-load)

cleanup() {
	deploy/local/cluster.sh stop >/dev/null 2>&1 || true
	LOADTEST_PEER_DIR=$out/peers/etcd loadtest/peers/etcd.sh stop >/dev/null 2>&1 || true
	LOADTEST_PEER_DIR=$out/peers/zk loadtest/peers/zk.sh stop >/dev/null 2>&1 || true
}
trap cleanup EXIT

run() { # target script endpoints
	local target=$1 script=$2 endpoints=$3
	timeout 30m ./bin/warden-load run --target "$target" --endpoints "$endpoints" --profile reference \
		--find-max --scale "${LOADTEST_FROM:-0.125}" --step-factor 1.41421356 --max-steps "${LOADTEST_STEPS:-10}" --precision "${LOADTEST_PRECISION:-0.05}" \
		--duration "${LOADTEST_STEP:-20s}" --cluster-script "$script" --out "$runout" --prefix "$target-"
}

reports=()
for r in $(seq 1 "${LOADTEST_RUNS:-3}"); do
	runout=$out/run-$r
	for t in $targets; do
		echo "== run $r: $t"
		case $t in
		warden)
			rm -rf "$WARDEN_CLUSTER_DIR"
			deploy/local/cluster.sh start
			eps=""
			for n in 1 2 3; do eps+="${eps:+,}http://127.0.0.1:$((WARDEN_LISTEN_BASE + n))"; done
			run warden "$root/deploy/local/cluster.sh" "$eps"
			deploy/local/cluster.sh stop
			;;
		etcd | etcd-mutex)
			export LOADTEST_PEER_DIR=$out/peers/etcd
			loadtest/peers/etcd.sh clean >/dev/null 2>&1 || true
			loadtest/peers/etcd.sh start
			run "$t" "$root/loadtest/peers/etcd.sh" "$(loadtest/peers/etcd.sh endpoints)"
			loadtest/peers/etcd.sh stop
			;;
		zk)
			export LOADTEST_PEER_DIR=$out/peers/zk
			loadtest/peers/zk.sh clean >/dev/null 2>&1 || true
			loadtest/peers/zk.sh start
			run zk "$root/loadtest/peers/zk.sh" "$(loadtest/peers/zk.sh endpoints)"
			loadtest/peers/zk.sh stop
			;;
		*)
			echo "unknown target $t" >&2
			exit 2
			;;
		esac
		reports+=("$runout/$t-report.json")
	done
done
./bin/warden-load compare --out "$out" --runs "${LOADTEST_RUNS:-3}" "${reports[@]}"
echo "side by side: $out/compare.md"
