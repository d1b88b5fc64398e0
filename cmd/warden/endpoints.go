package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
)

// failover sends each request to the endpoint that answered last and,
// when that one cannot be reached (the connection was never made, so
// nothing was sent), to the next, in turn. It never resends a request
// that may have reached a node: a call whose outcome is unknown is the
// caller's to retry, with the same request id.
type failover struct {
	endpoints []*url.URL
	next      http.RoundTripper
	current   atomic.Int32
}

// parseEndpoints turns --endpoints into base URLs: "host:port" alone
// takes https when TLS flags are given, else http. Every endpoint must
// have the same path (none, usually): requests differ only in host.
func parseEndpoints(list []string, tls bool) ([]*url.URL, error) {
	var out []*url.URL
	for _, e := range list {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if !strings.Contains(e, "://") {
			scheme := "http://"
			if tls {
				scheme = "https://"
			}
			e = scheme + e
		}
		u, err := url.Parse(e)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return nil, usage(fmt.Errorf("--endpoints: %q is not a node's address (host:port, or http(s)://host:port)", e))
		}
		if len(out) > 0 && u.Path != out[0].Path {
			return nil, usage(fmt.Errorf("--endpoints: %q has another path than %q", e, out[0].String()))
		}
		out = append(out, u)
	}
	if len(out) == 0 {
		return nil, usage(errors.New("--endpoints: no address given"))
	}
	return out, nil
}

func (f *failover) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		// A unary call's body is one message, and a server-streaming
		// call's (Backup) one request: small enough to keep for a retry.
		var err error
		body, err = io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
	}
	start := int(f.current.Load())
	var lastErr error
	for k := range f.endpoints {
		i := (start + k) % len(f.endpoints)
		r := req.Clone(req.Context())
		r.URL.Scheme, r.URL.Host, r.Host = f.endpoints[i].Scheme, f.endpoints[i].Host, ""
		if req.Body != nil {
			r.Body = io.NopCloser(bytes.NewReader(body))
			r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		}
		resp, err := f.next.RoundTrip(r)
		if err == nil {
			f.current.Store(int32(i))
			return resp, nil
		}
		lastErr = err
		if !unreached(err) || req.Context().Err() != nil {
			return nil, err
		}
	}
	return nil, lastErr
}

// unreached reports whether err left the request unsent: the connection
// could not be made.
func unreached(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
