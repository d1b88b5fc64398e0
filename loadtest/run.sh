#!/usr/bin/env bash
# make loadtest: the reference profile against a three-process Warden
# cluster from deploy/local on loopback, with one replica SIGKILLed halfway,
# a forced snapshot and log compaction on every live replica while it is down,
# and the replica restarted before the end. Writes report.json, report.md
# and chart.png to $LOADTEST_OUT (default loadtest/out) and stops everything
# it started, whatever happens. Exits non-zero on any safety violation.
#
# Environment: LOADTEST_SCALE (1), LOADTEST_DURATION (60s), LOADTEST_OUT,
# LOADTEST_FAULTS (default "kill@30s snapshot@35s restart@50s"; set and
# empty: none),
# LOADTEST_ARGS (more warden-load flags, for example --find-max),
# WARDEN_LISTEN_BASE (27070) and WARDEN_RAFT_BASE (27100) for the ports,
# LOADTEST_SECURE (set: the cluster serves TLS with authentication on,
# cluster.sh start --secure, and the harness calls over https with the
# admin token; make loadtest-secure).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${LOADTEST_OUT:-$root/loadtest/out}
scale=${LOADTEST_SCALE:-1}
duration=${LOADTEST_DURATION:-60s}
faults=${LOADTEST_FAULTS-kill@30s snapshot@35s restart@50s}
export WARDEN_LISTEN_BASE=${WARDEN_LISTEN_BASE:-27070}
export WARDEN_RAFT_BASE=${WARDEN_RAFT_BASE:-27100}
export WARDEN_CLUSTER_DIR=$out/cluster

mkdir -p "$out" "$root/bin"
go build -o "$root/bin/" ./cmd/...
(cd loadtest && go build -o "$root/bin/" ./cmd/warden-load)

rm -rf "$WARDEN_CLUSTER_DIR"
trap 'deploy/local/cluster.sh stop >/dev/null 2>&1 || true' EXIT
scheme=http
secure_args=()
if [[ -n ${LOADTEST_SECURE:-} ]]; then
	deploy/local/cluster.sh start --secure
	scheme=https
	secure_args=(--cacert "$WARDEN_CLUSTER_DIR/secure/ca.pem" --token-file "$WARDEN_CLUSTER_DIR/secure/admin.token")
else
	deploy/local/cluster.sh start
fi
endpoints=""
for n in 1 2 3; do endpoints+="${endpoints:+,}$scheme://127.0.0.1:$((WARDEN_LISTEN_BASE + n))"; done

fault_args=()
for f in $faults; do fault_args+=(--fault "$f"); done
# The whole run is bounded by a 30-minute timeout; it takes the ramp (at
# most 2 min), the measured phase and a few seconds for faults and
# shutdown. A missed target is not a failure (the report's target line
# says met or NOT met).
timeout 30m ./bin/warden-load run --target warden --endpoints "$endpoints" \
	--profile reference --scale "$scale" --duration "$duration" "${fault_args[@]}" \
	--cluster-script "$root/deploy/local/cluster.sh" --out "$out" "${secure_args[@]}" ${LOADTEST_ARGS:-}
