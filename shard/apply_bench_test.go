package shard

import (
	"fmt"
	"testing"

	sm "github.com/lni/dragonboat/v4/statemachine"
)

// BenchmarkApplyReference applies the reference load's mix to one
// replica, as Dragonboat would hand it over: 20,000 held locks over
// 100,000 resources, and in each Update (one op) ten acquires of free
// resources, ten renewals and ten releases of held ones, each its own
// entry. It reports the replica's cost per commit: wall time
// (ns/commit), CPU time on all threads, Pebble's included
// (cpu-ns/commit), and allocs/op ÷ 30, with the database's memtable,
// value cache and flushes as in production: the apply side of a node's
// CPU per commit. Sub-benchmark events=on derives the lock events too,
// as a node's replicas do for its History (events=off: Hooks.Events nil).
func BenchmarkApplyReference(b *testing.B) {
	b.Run("events=off", func(b *testing.B) { benchmarkApply(b, false) })
	b.Run("events=on", func(b *testing.B) { benchmarkApply(b, true) })
}

func benchmarkApply(b *testing.B, events bool) {
	const held, resources, each = 20_000, 100_000, 10
	r := newReplica(b)
	r.sm.events = nil // the harness's checks keep every event
	if events {
		heard := 0
		r.sm.events = func(_, _ uint64, evs []LockEvent) { heard += len(evs) }
	}
	now := int64(1_700_000_000) * second
	type lease struct {
		res string
		id  []byte
	}
	var ring []lease // held leases, oldest first
	next, reqs := 0, 0
	acquire := func() []byte {
		res := fmt.Sprintf("loadtest/resource-%06d", next%resources)
		next++
		reqs++
		id := leaseID(fmt.Sprintf("l%d", reqs))
		ring = append(ring, lease{res, id})
		return r.encode(now, acquireCmd(res, fmt.Sprintf("req-%032d", reqs), 30*second, "worker-0001", id))
	}
	for range held / 100 {
		cmds := make([][]byte, 100)
		for i := range cmds {
			cmds[i] = acquire()
		}
		r.proposeRaw(cmds...)
	}
	entries := make([]sm.Entry, 3*each)
	b.ResetTimer()
	start := processCPU(b)
	for b.Loop() {
		now += 5 * 1_000_000 // 5 ms: 30 ops at the reference's 6,000 a second
		cmds := entries[:0]
		for i := range each {
			old := ring[i]
			r.index++
			cmds = append(cmds, sm.Entry{Index: r.index, Cmd: r.encode(now, releaseCmd(old.res, old.id))})
			r.index++
			renew := ring[len(ring)/2+i]
			cmds = append(cmds, sm.Entry{Index: r.index, Cmd: r.encode(now, renewCmd(renew.res, renew.id))})
		}
		ring = ring[each:]
		for range each {
			r.index++
			cmds = append(cmds, sm.Entry{Index: r.index, Cmd: acquire()})
		}
		if _, err := r.sm.Update(cmds); err != nil {
			b.Fatal(err)
		}
	}
	commits := float64(b.N * 3 * each)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/commits, "ns/commit")
	b.ReportMetric(float64(processCPU(b)-start)/commits, "cpu-ns/commit")
}
