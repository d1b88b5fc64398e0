package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/warden-dev/warden/client"
)

type watchCmd struct {
	Resource string `arg:"" help:"Lock to watch."`
	Cursor   string `help:"Resume just after the event that printed this cursor (default: begin with the current holder)."`
}

// Run follows the lock's events through the Go SDK's Watch, which
// resumes after a broken stream on the next endpoint, and prints one
// line per event (a JSON object with --json) until SIGINT or SIGTERM,
// which end it with status 0. A cursor the cluster can no longer resume
// from fails (client.ErrWatchGap): watch again without one.
func (w *watchCmd) Run(g *globals) error {
	c, err := g.sdk()
	if err != nil {
		return err
	}
	for ev, err := range c.Watch(g.root, w.Resource, w.Cursor) {
		if err != nil {
			if g.root.Err() != nil {
				return nil // interrupted: the normal end of a watch
			}
			return fmt.Errorf("watch %s: %w", w.Resource, err)
		}
		if err := printEvent(g, ev); err != nil {
			return err
		}
	}
	return nil
}

// sdk is a Go SDK client of --endpoints with the global flags' TLS and
// credentials: it fails over between the endpoints by itself (lock run,
// watch).
func (g *globals) sdk() (*client.Client, error) {
	var endpoints []string
	for _, u := range g.endpoints {
		endpoints = append(endpoints, u.String())
	}
	return client.NewWithConfig(client.Config{Endpoints: endpoints, HTTPClient: &http.Client{Transport: g.transport}})
}

// printEvent prints one event: its type, resource and fencing token
// first, as a line of text or a JSON object.
func printEvent(g *globals, ev client.Event) error {
	if g.JSON {
		out := map[string]any{"type": ev.Type, "resource": ev.Resource, "holder": ev.Holder, "fencing_token": ev.Token,
			"initial": ev.Initial, "cursor": ev.Cursor}
		if !ev.ExpiresAt.IsZero() {
			out["expires_at"] = ev.ExpiresAt.Format(time.RFC3339Nano)
		}
		b, err := json.Marshal(out)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(g.out, string(b))
		return err
	}
	initial := ""
	if ev.Initial {
		initial = " (holder when the watch began)"
	}
	_, err := fmt.Fprintf(g.out, "%-8s %s token=%d holder=%q expires_at=%s cursor=%s%s\n", ev.Type, ev.Resource, ev.Token, ev.Holder,
		ev.ExpiresAt.Format(time.RFC3339Nano), ev.Cursor, initial)
	return err
}
