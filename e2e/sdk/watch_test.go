package client_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/warden-dev/warden/client"
)

// The SDK's Watch follows a lock from its holder on, and when its stream
// breaks (the connection is cut while the lock changes hands three
// times, and calls cannot get through for a while) it resumes after the
// last event it gave: every change arrives once, in order, with no gap.
func TestWatchResumesAcrossBrokenStreams(t *testing.T) {
	c := startCluster(t)
	p := &partition{}
	watcher, other := c.client(p), c.client(nil)
	ctx := bg(t)
	const r = "sdk/watch"
	first, err := other.Lock(ctx, r, client.LockOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan client.Event, 32)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		for ev, err := range watcher.Watch(wctx, r, "") {
			if err != nil {
				done <- err
				return
			}
			events <- ev
		}
		done <- nil
	}()
	next := func() client.Event {
		t.Helper()
		select {
		case ev := <-events:
			return ev
		case err := <-done:
			t.Fatalf("the watch ended: %v", err)
		case <-ctx.Done():
			t.Fatal("no event within 30 s")
		}
		return client.Event{}
	}
	if ev := next(); !ev.Initial || ev.Type != client.Granted || ev.Token != first.Token() {
		t.Fatalf("first event %+v, want the holder with token %d", ev, first.Token())
	}

	// Cut the watcher off, break its stream, and hand the lock on three
	// times meanwhile.
	p.cut.Store(true)
	c.srv.CloseClientConnections()
	want := []string{fmt.Sprintf("RELEASED %d", first.Token())}
	prev := first
	for range 3 {
		if err := prev.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		l, err := other.Lock(ctx, r, client.LockOptions{TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, fmt.Sprintf("GRANTED %d", l.Token()), fmt.Sprintf("RELEASED %d", l.Token()))
		prev = l
	}
	want = want[:len(want)-1] // the last lease is still held
	select {
	case ev := <-events:
		t.Fatalf("an event through a cut connection: %+v", ev)
	default:
	}
	p.cut.Store(false)
	var got []string
	for range want {
		ev := next()
		got = append(got, fmt.Sprintf("%s %d", ev.Type, ev.Token))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("after the break: %v, want %v", got, want)
	}
	stop()
	if err := <-done; err == nil {
		t.Fatal("a cancelled watch ended without its context's error")
	}
	if err := prev.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// firstBytes is an HTTP transport that closes got once a response body
// of it has delivered bytes: a watch stream's first message reached the
// client.
type firstBytes struct {
	rt   http.RoundTripper
	once sync.Once
	got  chan struct{}
}

func (f *firstBytes) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := f.rt.RoundTrip(r)
	if err == nil {
		resp.Body = &signalBody{ReadCloser: resp.Body, f: f}
	}
	return resp, err
}

type signalBody struct {
	io.ReadCloser
	f *firstBytes
}

func (b *signalBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.f.once.Do(func() { close(b.f.got) })
	}
	return n, err
}

// A watch begun on a free lock gets its start as a progress message (no
// event), so when its stream breaks before the lock's first change it
// resumes from there: the grant and release made while it was cut come,
// then the next grant. (An attack found them lost: with nothing sent,
// the SDK resumed with a fresh read.)
func TestWatchOfAFreeLockResumesFromItsStart(t *testing.T) {
	c := startCluster(t)
	p := &partition{}
	fb := &firstBytes{got: make(chan struct{})}
	p.rt = fb
	fb.rt = c.srv.Client().Transport
	watcher, err := client.NewWithConfig(client.Config{Endpoints: []string{c.srv.URL}, HTTPClient: &http.Client{Transport: p}})
	if err != nil {
		t.Fatal(err)
	}
	other := c.client(nil)
	ctx := bg(t)
	const r = "sdk/watch-free"
	events := make(chan client.Event, 32)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for ev, err := range watcher.Watch(wctx, r, "") {
			if err != nil {
				return
			}
			events <- ev
		}
	}()
	select {
	case <-fb.got: // the progress message: the lock is free
	case <-ctx.Done():
		t.Fatal("a watch of a free lock sent nothing")
	}
	p.cut.Store(true)
	c.srv.CloseClientConnections()
	l, err := other.Lock(ctx, r, client.LockOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	p.cut.Store(false)
	l2, err := other.Lock(ctx, r, client.LockOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{fmt.Sprintf("GRANTED %d", l.Token()), fmt.Sprintf("RELEASED %d", l.Token()), fmt.Sprintf("GRANTED %d", l2.Token())}
	var got []string
	for len(got) < len(want) {
		select {
		case ev := <-events:
			got = append(got, fmt.Sprintf("%s %d", ev.Type, ev.Token))
		case <-ctx.Done():
			t.Fatalf("after the break: %v, want %v", got, want)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("after the break: %v, want %v", got, want)
	}
	if err := l2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
