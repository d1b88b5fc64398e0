#!/usr/bin/env bash
# The lock round trip (lock, then unlock, one after the other on one
# resource) of the Go SDK and of the TypeScript SDK from Node.js, against
# one wardend --dev, one after the other in the same run: make bench-sdk.
# N pairs each (default 2000, after a warm-up); prints each SDK's median,
# p90 and p99 in milliseconds.
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
n=${N:-2000}
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$root/bin/wardend" --dev --data-dir "$dir/data" --listen "127.0.0.1:$port" >"$dir/wardend.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
	curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break
	sleep 0.2
done
curl -sf "http://127.0.0.1:$port/readyz" >/dev/null || { echo "wardend --dev did not become ready:"; cat "$dir/wardend.log"; exit 1; }
endpoint="http://127.0.0.1:$port"
echo "== Go SDK ($n pairs, one resource)"
(cd "$root" && WARDEN_BENCH_ENDPOINT=$endpoint go test ./e2e/sdk -run '^$' -bench '^BenchmarkLockRoundTrip$' -benchtime "${n}x" -count 1 | grep -E '^Benchmark')
echo "== TypeScript SDK, Node.js $(node --version) ($n pairs, one resource)"
cd "$root/clients/typescript"
npx tsc -p bench >/dev/null
node dist/bench/roundtrip.js "$endpoint" --n "$n" --same
