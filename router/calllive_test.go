package router

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"connectrpc.com/connect"
)

// callLive gives up a call in flight to a node only once the node has
// failed peerDownAfter clock readings in a row: one failed reading may be
// a pause of a busy node, and a waiting Acquire given up on it would
// leave its place in the queue (issue 41's review). Time is virtual.
func TestCallLiveGivesUpAfterMissedReadings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &Router{}
		r.clock.missed = map[uint64]int{}
		done := make(chan error, 1)
		go func() {
			_, err := callLive(context.Background(), r, 3, func(ctx context.Context) (*connect.Response[struct{}], error) {
				<-ctx.Done()
				return nil, connect.NewError(connect.CodeCanceled, ctx.Err())
			})
			done <- err
		}()
		setMissed := func(n int) {
			r.clock.mu.Lock()
			r.clock.missed[3] = n
			r.clock.mu.Unlock()
		}
		setMissed(1)
		time.Sleep(10 * peerDownPoll)
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("one failed clock reading ended the call in flight: %v", err)
		default:
		}
		setMissed(peerDownAfter)
		time.Sleep(2 * peerDownPoll)
		synctest.Wait()
		select {
		case err := <-done:
			if connect.CodeOf(err) != connect.CodeUnavailable || !errors.Is(err, errPeerDown) {
				t.Fatalf("call to a node that failed %d readings in a row: %v, want unavailable (%v)", peerDownAfter, err, errPeerDown)
			}
		default:
			t.Fatalf("the call to a node that failed %d readings in a row goes on", peerDownAfter)
		}
		// A new call to it is refused at once.
		if _, err := callLive(context.Background(), r, 3, func(context.Context) (*connect.Response[struct{}], error) {
			t.Fatal("called a node that failed its readings")
			return nil, nil
		}); connect.CodeOf(err) != connect.CodeUnavailable {
			t.Fatalf("new call: %v, want unavailable", err)
		}
	})
}
