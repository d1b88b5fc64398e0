package client_test

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/warden-dev/warden/client"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/server"
)

// BenchmarkLockRoundTrip measures the Go SDK's lock round trip: Lock,
// then Unlock, one after the other on one resource, as
// clients/typescript/bench/roundtrip.ts does for the TypeScript SDK (make
// bench-sdk runs both against one wardend). It reports the median, p90
// and p99 of the pairs in milliseconds. The endpoint is
// WARDEN_BENCH_ENDPOINT, else a dev cluster this process starts (which
// then shares its CPU with the client).
func BenchmarkLockRoundTrip(b *testing.B) {
	endpoint := os.Getenv("WARDEN_BENCH_ENDPOINT")
	if endpoint == "" {
		s, err := server.Start(server.Config{Listen: "127.0.0.1:0", Dev: &server.DevConfig{DataDir: b.TempDir(), Router: router.Config{}}})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Shutdown(context.Background())
		endpoint = "http://" + s.Addr()
	}
	c, err := client.New(endpoint)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	defer c.Close(ctx)
	pair := func() time.Duration {
		start := time.Now()
		l, err := c.Lock(ctx, "bench/roundtrip-go", client.LockOptions{TTL: 30 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	for range 100 { // warm-up: connections, leader lookups
		pair()
	}
	took := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		took = append(took, pair())
	}
	b.StopTimer()
	slices.Sort(took)
	at := func(q float64) float64 {
		return float64(took[int(q*float64(len(took)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(at(0.5), "p50-ms")
	b.ReportMetric(at(0.9), "p90-ms")
	b.ReportMetric(at(0.99), "p99-ms")
}
