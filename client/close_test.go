package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/warden-dev/warden/client"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

// fakeLocks is an in-memory LockService: one lease per free resource,
// renewals of current leases, and a count of releases per lease.
type fakeLocks struct {
	wardenv1connect.UnimplementedLockServiceHandler
	mu       sync.Mutex
	held     map[string]string // resource -> lease id
	released map[string]int    // lease id -> releases that released it
	next     int
}

func newFakeLocks(t *testing.T) (*fakeLocks, string) {
	f := &fakeLocks{held: map[string]string{}, released: map[string]int{}}
	_, h := wardenv1connect.NewLockServiceHandler(f)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return f, srv.URL
}

func (f *fakeLocks) Acquire(_ context.Context, req *connect.Request[wardenv1.AcquireRequest]) (*connect.Response[wardenv1.AcquireResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.held[req.Msg.GetResource()]; ok {
		return nil, connect.NewError(connect.CodeAborted, errors.New("the lock is held"))
	}
	f.next++
	id := fmt.Sprintf("lease-%d", f.next)
	f.held[req.Msg.GetResource()] = id
	ttl := req.Msg.GetLeaseTtl().AsDuration()
	return connect.NewResponse(&wardenv1.AcquireResponse{LeaseId: id, FencingToken: uint64(f.next),
		ExpiresAt: timestamppb.New(time.Now().Add(ttl)), LeaseTtl: durationpb.New(ttl)}), nil
}

func (f *fakeLocks) Release(_ context.Context, req *connect.Request[wardenv1.ReleaseRequest]) (*connect.Response[wardenv1.ReleaseResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ok := f.held[req.Msg.GetResource()] == req.Msg.GetLeaseId()
	if ok {
		delete(f.held, req.Msg.GetResource())
		f.released[req.Msg.GetLeaseId()]++
	}
	return connect.NewResponse(&wardenv1.ReleaseResponse{Released: ok}), nil
}

func (f *fakeLocks) holds(resource string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.held[resource]
	return ok
}

// Close releases the leases still held (each Done closes with
// ErrUnlocked), leaves alone those unlocked before, and makes Lock
// answer ErrClosed.
func TestCloseReleasesHeldLeases(t *testing.T) {
	f, url := newFakeLocks(t)
	c, err := client.New(url)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var leases []*client.Lease
	for _, r := range []string{"a", "b", "c"} {
		l, err := c.Lock(ctx, r, client.LockOptions{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	if err := leases[2].Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if !f.holds("a") || !f.holds("b") || f.holds("c") {
		t.Fatalf("premise: a and b held, c released; got %v", f.held)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, l := range leases {
		select {
		case <-l.Done():
		default:
			t.Fatalf("%s: Done open after Close", l.Resource())
		}
		if !errors.Is(l.Err(), client.ErrUnlocked) {
			t.Fatalf("%s: Err %v, want ErrUnlocked", l.Resource(), l.Err())
		}
	}
	if f.holds("a") || f.holds("b") {
		t.Fatalf("held after Close: %v", f.held)
	}
	for id, n := range f.released {
		if n != 1 {
			t.Fatalf("%s released %d times", id, n)
		}
	}
	if _, err := c.Lock(ctx, "d", client.LockOptions{TTL: time.Minute}); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Lock after Close: %v, want ErrClosed", err)
	}
	if f.holds("d") {
		t.Fatal("Lock after Close acquired")
	}
}

// A lease whose renewals became uncertain may still be held on the
// server: Close releases it too.
func TestCloseReleasesAnUncertainLease(t *testing.T) {
	f, url := newFakeLocks(t) // it renews nothing: renewals fail at once
	c, err := client.New(url)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l, err := c.Lock(ctx, "u", client.LockOptions{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	<-l.Done()
	if !errors.Is(l.Err(), client.ErrLeaseUncertain) || !f.holds("u") {
		t.Fatalf("premise: an uncertain lease the server still holds; got %v, held %v", l.Err(), f.holds("u"))
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if f.holds("u") {
		t.Fatal("Close left the uncertain lease held on the server")
	}
}

// An Unlock whose release could not be sent (its ctx had ended) leaves
// the lease to a later Unlock, which releases it; after that, Unlock and
// Close release nothing twice.
func TestUnlockRetriesAFailedRelease(t *testing.T) {
	f, url := newFakeLocks(t)
	c, err := client.New(url)
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Lock(context.Background(), "x", client.LockOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Unlock(done); err == nil || !f.holds("x") {
		t.Fatalf("premise: an Unlock with an ended ctx fails and the lease stays held; got %v, held %v", err, f.holds("x"))
	}
	if err := l.Unlock(context.Background()); err != nil || f.holds("x") {
		t.Fatalf("the second Unlock: %v, held %v; want released", err, f.holds("x"))
	}
	if err := l.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for id, n := range f.released {
		if n != 1 {
			t.Fatalf("%s released %d times", id, n)
		}
	}
}

// Lock calls racing Close: each either returns a lease that Close then
// releases, or ErrClosed (releasing what it was granted); nothing stays
// held, and the race detector sees no unsynchronised access.
func TestLockRacingClose(t *testing.T) {
	for round := range 10 {
		f, url := newFakeLocks(t)
		c, err := client.New(url)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Go(func() {
				_, err := c.Lock(context.Background(), fmt.Sprintf("r%d", i), client.LockOptions{TTL: time.Minute})
				if err != nil && !errors.Is(err, client.ErrClosed) {
					t.Errorf("Lock: %v", err)
				}
			})
		}
		time.Sleep(time.Duration(round) * 200 * time.Microsecond) // real time: let some Locks through first
		if err := c.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		f.mu.Lock()
		held := len(f.held)
		f.mu.Unlock()
		if held != 0 {
			t.Fatalf("round %d: %d leases held after Close and every Lock returned", round, held)
		}
	}
}
