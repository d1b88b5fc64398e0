package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/warden-dev/warden/client"
	"github.com/warden-dev/warden/client/fence"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

// Lock a resource, do the work while the lease lasts, and pass the
// fencing token to what the work changes, so that a write from a holder
// that was paused past its lease is refused there. The lease renews
// itself in the background until Unlock; if it cannot, Done closes
// before the server could grant the lock to anyone else.
func ExampleClient_Lock() {
	// Give every node's URL ("http://10.0.1.5:7070", …); this example
	// calls an in-memory stand-in.
	c, err := client.New(exampleNode())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(context.Background()) // releases what is still held

	ctx := context.Background()
	lease, err := c.Lock(ctx, "orders/42", client.LockOptions{TTL: 30 * time.Second, Wait: time.Minute})
	if errors.Is(err, client.ErrWaitTimeout) {
		return // someone else held it for the whole minute
	}
	if err != nil {
		log.Fatal(err) // the cluster could not be reached within ctx, say
	}
	defer lease.Unlock(context.Background())

	var orders fence.Memory // in real use, fence.SQL on the orders' database
	done := make(chan error, 1)
	go func() {
		done <- orders.Do("orders/42", lease.Token(), func() error {
			fmt.Println("order 42 shipped under fencing token", lease.Token())
			return nil
		})
	}()
	select {
	case <-lease.Done():
		// The lease is lost, or its renewal became uncertain: stop the work.
		log.Print(lease.Err())
	case err := <-done:
		if err != nil {
			log.Print(err) // a higher token was accepted: this holder is stale
		}
	}
	// Output: order 42 shipped under fencing token 1
}

// Work under a lease stops when Done closes. Here an operator revokes
// the lease (warden lock revoke), as for a holder stuck but still
// renewing: the next renewal is refused, and Err says the lease is lost.
func ExampleLease_Done() {
	node := exampleNode()
	c, err := client.New(node)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(context.Background())
	ctx := context.Background()
	// A short TTL, so that the renewal that finds out comes soon: every
	// TTL/3.
	lease, err := c.Lock(ctx, "orders/42", client.LockOptions{TTL: time.Second})
	if err != nil {
		log.Fatal(err)
	}

	admin := wardenv1connect.NewAdminServiceClient(http.DefaultClient, node)
	_, err = admin.RevokeLease(ctx, connect.NewRequest(&wardenv1.RevokeLeaseRequest{Resource: "orders/42", FencingToken: lease.Token()}))
	if err != nil {
		log.Fatal(err)
	}

	for {
		select {
		case <-lease.Done():
			fmt.Println("stopped:", errors.Is(lease.Err(), client.ErrLeaseLost))
			return
		case <-time.After(10 * time.Millisecond):
			// A step of the work.
		}
	}
	// Output: stopped: true
}

// Reserve capacity before spending it; commit what was spent once the
// work succeeded (the rest returns), or release the reservation when it
// failed. A reservation not committed returns by itself at its TTL.
func ExampleClient_Reserve() {
	c, err := client.New(exampleNode())
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	// The limits, set once by the platform team (warden quota set-limit):
	// a reserve must fit under every level of its key's path.
	for _, l := range []struct {
		key   string
		limit int64
	}{{"gpu", 100}, {"gpu/team-a", 60}, {"gpu/team-a/train", 40}} {
		if err := c.SetLimit(ctx, l.key, l.limit, 0); err != nil {
			log.Fatal(err)
		}
	}

	r, err := c.Reserve(ctx, "gpu/team-a/train", 30, client.ReserveOptions{TTL: time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("reserved 30,", r.Remaining, "left")

	_, err = c.Reserve(ctx, "gpu/team-a/train", 20, client.ReserveOptions{TTL: time.Hour})
	var ex *client.ExhaustedError
	if errors.As(err, &ex) {
		fmt.Printf("refused at %s (%s): %d left\n", ex.Level, ex.Reason, ex.Remaining)
	}

	// The job used 25 of its 30.
	n, err := c.Commit(ctx, r, 25)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("committed", n)

	// Another job failed before using any of its reservation.
	r, err = c.Reserve(ctx, "gpu/team-a/train", 10, client.ReserveOptions{TTL: time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	released, err := c.ReleaseReservation(ctx, r)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("released", released)
	// Output:
	// reserved 30, 10 left
	// refused at gpu/team-a/train (LIMIT): 10 left
	// committed 25
	// released true
}

// A Batcher sends the acquires and releases that many goroutines make
// at about the same time through your own LockService client in shared
// Batch calls. (A Client does this for its Lock and Unlock calls by
// itself.)
func ExampleBatcher() {
	// The LockService client of a node ("http://10.0.1.5:7070"); this
	// example calls an in-memory stand-in.
	locks := wardenv1connect.NewLockServiceClient(http.DefaultClient, exampleNode())
	b := client.NewBatcher(locks, client.DefaultBatchCalls)

	ctx := context.Background()
	var wg sync.WaitGroup
	var run atomic.Int64
	for i := range 100 {
		wg.Go(func() {
			resource := fmt.Sprintf("jobs/%d", i)
			lease, err := b.Acquire(ctx, &wardenv1.AcquireRequest{
				Resource: resource, RequestId: fmt.Sprintf("run-1-%d", i), LeaseTtl: durationpb.New(30 * time.Second),
			})
			if err != nil {
				log.Print(err) // each call gets its own answer: aborted when held
				return
			}
			run.Add(1) // the job's work, under lease.GetFencingToken()
			_, err = b.Release(ctx, &wardenv1.ReleaseRequest{Resource: resource, LeaseId: lease.GetLeaseId()})
			if err != nil {
				log.Print(err) // the lease ends at its TTL
			}
		})
	}
	wg.Wait()
	fmt.Println(run.Load(), "jobs run")
	// Output: 100 jobs run
}
