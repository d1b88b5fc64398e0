package rpc_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/HdrHistogram/hdrhistogram-go"
	"google.golang.org/protobuf/types/known/durationpb"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/server"
)

// BenchmarkAcquireRelease measures one uncontended Acquire followed by its
// Release over Connect (HTTP/1.1, protobuf) against a dev cluster, with 1
// and 64 concurrent clients. Each op is two Raft commits. It reports
// pairs/s and the p50/p99 of the pair's latency in milliseconds.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, clients := range []int{1, 64} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			c := startCluster(b, server.DevConfig{})
			hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * clients}}
			locks := wardenv1connect.NewLockServiceClient(hc, c.srv.URL)
			hist := hdrhistogram.New(1, int64(10*time.Second/time.Microsecond), 3)
			var mu sync.Mutex
			var next atomic.Int64
			bctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for w := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					local := hdrhistogram.New(1, int64(10*time.Second/time.Microsecond), 3)
					for {
						i := next.Add(1)
						if i > int64(b.N) {
							break
						}
						t0 := time.Now()
						res := fmt.Sprintf("bench/%d/%d", w, i)
						a, err := locks.Acquire(bctx, connect.NewRequest(&wardenv1.AcquireRequest{Resource: res, RequestId: res}))
						if err != nil {
							b.Error(err)
							return
						}
						if _, err := locks.Release(bctx, connect.NewRequest(&wardenv1.ReleaseRequest{Resource: res, LeaseId: a.Msg.GetLeaseId()})); err != nil {
							b.Error(err)
							return
						}
						local.RecordValue(time.Since(t0).Microseconds())
					}
					mu.Lock()
					hist.Merge(local)
					mu.Unlock()
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "pairs/s")
			b.ReportMetric(float64(hist.ValueAtQuantile(50))/1000, "p50-ms")
			b.ReportMetric(float64(hist.ValueAtQuantile(99))/1000, "p99-ms")
		})
	}
}

// BenchmarkHandOff measures the waiter hand-off: the time from a holder's
// Release until the waiting Acquire at the head of the queue returns its
// grant (the grant is applied in the release's own log entry). It reports
// p50 and p99 in milliseconds.
func BenchmarkHandOff(b *testing.B) {
	c := startCluster(b, server.DevConfig{})
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	locks := wardenv1connect.NewLockServiceClient(hc, c.srv.URL)
	bctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cur, err := locks.Acquire(bctx, connect.NewRequest(&wardenv1.AcquireRequest{Resource: "h", RequestId: "h0"}))
	if err != nil {
		b.Fatal(err)
	}
	leaseID := cur.Msg.GetLeaseId()
	hist := hdrhistogram.New(1, int64(10*time.Second/time.Microsecond), 3)
	b.ResetTimer()
	for i := range b.N {
		granted := make(chan *wardenv1.AcquireResponse, 1)
		go func() {
			r, err := locks.Acquire(bctx, connect.NewRequest(&wardenv1.AcquireRequest{Resource: "h", RequestId: fmt.Sprintf("h%d", i+1),
				WaitTimeout: durationpb.New(time.Minute)}))
			if err != nil {
				b.Error(err)
				granted <- nil
				return
			}
			granted <- r.Msg
		}()
		b.StopTimer()
		for {
			d, err := locks.Describe(bctx, connect.NewRequest(&wardenv1.DescribeRequest{Resource: "h"}))
			if err != nil {
				b.Fatal(err)
			}
			if d.Msg.GetWaiters() == 1 {
				break
			}
		}
		b.StartTimer()
		t0 := time.Now()
		if _, err := locks.Release(bctx, connect.NewRequest(&wardenv1.ReleaseRequest{Resource: "h", LeaseId: leaseID})); err != nil {
			b.Fatal(err)
		}
		g := <-granted
		if g == nil {
			b.FailNow()
		}
		hist.RecordValue(time.Since(t0).Microseconds())
		leaseID = g.GetLeaseId()
	}
	b.StopTimer()
	b.ReportMetric(float64(hist.ValueAtQuantile(50))/1000, "p50-ms")
	b.ReportMetric(float64(hist.ValueAtQuantile(99))/1000, "p99-ms")
}
