package router

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"connectrpc.com/connect"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	"github.com/warden-dev/warden/proto/warden/placement/v1/placementv1connect"
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
			err := r.callLive(context.Background(), 3, func(ctx context.Context) error {
				<-ctx.Done()
				return connect.NewError(connect.CodeCanceled, ctx.Err())
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
		if err := r.callLive(context.Background(), 3, func(context.Context) error {
			t.Fatal("called a node that failed its readings")
			return nil
		}); connect.CodeOf(err) != connect.CodeUnavailable {
			t.Fatalf("new call: %v, want unavailable", err)
		}
	})
}

// A forwarded call whose answer did not come from a Warden node (here an
// HTTP 400 in plain text, as Go's server writes for a request it cannot
// parse, from whatever listens on the address now) is not the node's
// word: its outcome is unknown, as after a broken connection, and it is
// retried. The node's own errors, and the caller's deadline, are kept.
func TestNotAnsweredByAWardenNode(t *testing.T) {
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "400 Bad Request", http.StatusBadRequest) // something other than a Warden node on the address
	}))
	defer plain.Close()
	warden := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusPreconditionFailed)
		_, _ = w.Write([]byte(`{"code":"failed_precondition","message":"the node is not ready"}`))
	}))
	defer warden.Close()
	call := func(ctx context.Context, url string) error {
		_, err := placementv1connect.NewNodeServiceClient(http.DefaultClient, url).Clock(ctx, connect.NewRequest(&placementv1.ClockRequest{}))
		return err
	}
	ctx := context.Background()
	if err := call(ctx, plain.URL); connect.CodeOf(err) != connect.CodeInternal || !notAnswered(ctx, err) {
		t.Errorf("plain 400: %v, notAnswered %v; want a non-wire internal error that was not answered", err, notAnswered(ctx, err))
	}
	if err := call(ctx, warden.URL); connect.CodeOf(err) != connect.CodeFailedPrecondition || notAnswered(ctx, err) {
		t.Errorf("a node's failed_precondition: %v, notAnswered %v", err, notAnswered(ctx, err))
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := call(done, plain.URL); notAnswered(done, err) {
		t.Errorf("the caller's cancel (%v) counted as no answer", err)
	}
	if notAnswered(ctx, nil) || notAnswered(ctx, errors.New("not connect")) {
		t.Error("nil or a non-Connect error counted as no answer")
	}
}
