#!/usr/bin/env bash
# The backup and restore figures of docs/perf: a three-process cluster
# from deploy/local under the reference profile (scale 1: 100,000
# resources, 20,000 held locks) for 20 s, then warden admin backup (signed) while
# the locks are still held, the cluster stopped, wardend restore of each
# node into a second cluster directory, and that cluster started; each
# step timed. Everything it starts is stopped when it ends. Environment:
# BACKUP_FIGURES_DIR (default /tmp/warden-backup-figures), and the ports
# of cluster.sh (WARDEN_LISTEN_BASE 28070, WARDEN_RAFT_BASE 28100 here).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export WARDEN_LISTEN_BASE=${WARDEN_LISTEN_BASE:-28070} WARDEN_RAFT_BASE=${WARDEN_RAFT_BASE:-28100}
work=${BACKUP_FIGURES_DIR:-/tmp/warden-backup-figures}
a=$work/old b=$work/restored bk=$work/backup
rm -rf "$work" && mkdir -p "$work" bin
go build -o bin/ ./cmd/...
(cd loadtest && go build -o "$root/bin/" ./cmd/warden-load)
trap 'WARDEN_CLUSTER_DIR=$a deploy/local/cluster.sh stop >/dev/null 2>&1 || true; WARDEN_CLUSTER_DIR=$b deploy/local/cluster.sh stop >/dev/null 2>&1 || true' EXIT
now() { date +%s.%N; }
WARDEN_CLUSTER_DIR=$a deploy/local/cluster.sh start >/dev/null
eps=""
for n in 1 2 3; do eps+="${eps:+,}http://127.0.0.1:$((WARDEN_LISTEN_BASE + n))"; done
timeout 10m ./bin/warden-load run --target warden --endpoints "$eps" --profile reference --scale 1 --duration 20s --out "$work/load" 2>&1 | tail -1
./bin/warden admin backup-key --out "$work/backup.key" >/dev/null
s=$(now)
./bin/warden --addr "http://127.0.0.1:$((WARDEN_LISTEN_BASE + 1))" admin backup --out "$bk" --signing-key "$work/backup.key" | head -2
echo "backup: $(echo "$(now) - $s" | bc) s, $(du -sb "$bk" | cut -f1) bytes"
WARDEN_CLUSTER_DIR=$a deploy/local/cluster.sh stop >/dev/null
mkdir -p "$b" && cp "$a/cluster-secret" "$b/"
s=$(now)
for n in 1 2 3; do
	./bin/wardend restore --from "$bk" --verify-key "$work/backup.key.pub" --node-id "$n" --zone "az$n" --data-dir "$b/node-$n" >/dev/null
	touch "$b/node-$n.created" # cluster.sh: not a first start
done
echo "restore of three nodes: $(echo "$(now) - $s" | bc) s"
s=$(now)
WARDEN_CLUSTER_DIR=$b deploy/local/cluster.sh start >/dev/null
echo "restored cluster serving after $(echo "$(now) - $s" | bc) s"
./bin/warden --addr "http://127.0.0.1:$((WARDEN_LISTEN_BASE + 1))" admin shards
