package client_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/warden-dev/warden/client"
	"github.com/warden-dev/warden/client/fence"
)

// Lock a resource, do the work while the lease lasts, and pass the
// fencing token to what the work changes, so that a write from a holder
// that was paused past its lease is refused there.
func ExampleClient_Lock() {
	c, err := client.New("http://127.0.0.1:7070", "http://127.0.0.1:7071", "http://127.0.0.1:7072")
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	lease, err := c.Lock(ctx, "orders/42", client.LockOptions{TTL: 30 * time.Second, Wait: time.Minute})
	if errors.Is(err, client.ErrHeld) {
		return // someone else holds it and the minute passed
	}
	if err != nil {
		log.Fatal(err) // the cluster could not be reached within ctx
	}
	defer lease.Unlock(context.Background())

	var orders fence.Memory // in real use, fence.SQL on the orders table
	done := make(chan error, 1)
	go func() {
		done <- orders.Do("orders/42", lease.Token(), func() error {
			return nil // change order 42
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
}
