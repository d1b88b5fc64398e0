package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/router"
)

func TestParseCORSOrigins(t *testing.T) {
	good := map[string]string{
		"https://app.example.com":       "https://app.example.com",
		" http://localhost:* ":          "http://localhost:*",
		"http://127.0.0.1:5173/":        "http://127.0.0.1:5173",
		"*":                             "*",
		"https://[::1]:8443":            "https://[::1]:8443",
		"https://dash.example.com:8443": "https://dash.example.com:8443",
		"https://xn--bcher-kva.example": "https://xn--bcher-kva.example",
	}
	for in, want := range good {
		got, err := ParseCORSOrigins([]string{in})
		if err != nil || len(got) != 1 || got[0] != want {
			t.Errorf("ParseCORSOrigins(%q) = %q, %v; want [%q]", in, got, err, want)
		}
	}
	for _, in := range []string{
		"app.example.com",           // no scheme
		"ftp://app.example.com",     // not http(s)
		"https://app.example.com/x", // a path
		"https://*.example.com",     // a wildcard host
		"https://App.example.com",   // browsers send lower case
		"https://u@app.example.com",
		"https://app.example.com?q=1",
		"https://",
		"http://localhost:port",
		"HTTP://app.example.com",    // browsers send the scheme in lower case
		"http://app.example.com:80", // and leave default ports out
		"https://app.example.com:443",
		"http://app.example.com:",
		"http://app.example.com?",
		"http://app.example.com#",
		"http://app.example.com:0080",
		"http://app.example.com:99999",
		"http://bücher.example", // browsers send punycode
	} {
		_, err := ParseCORSOrigins([]string{in})
		if err == nil || !strings.Contains(err.Error(), "--cors-allowed-origins") || !strings.Contains(err.Error(), in) {
			t.Errorf("ParseCORSOrigins(%q): error %v, want one naming the flag and the value", in, err)
		}
	}
}

func TestOriginMatches(t *testing.T) {
	for _, c := range []struct {
		pattern, origin string
		want            bool
	}{
		{"http://localhost:*", "http://localhost:5173", true},
		{"http://localhost:*", "http://localhost", true}, // port 80, left out
		{"http://localhost:*", "http://localhostx", false},
		{"http://localhost:*", "http://localhost:5173.evil.example", false},
		{"http://localhost:*", "https://localhost:5173", false},
		{"https://app.example", "https://app.example", true},
		{"https://app.example", "https://app.example:443", false},
		{"*", "https://anything.example", true},
	} {
		if got := originMatches(c.pattern, c.origin); got != c.want {
			t.Errorf("originMatches(%q, %q) = %v, want %v", c.pattern, c.origin, got, c.want)
		}
	}
}

// A browser page from an allowed origin can call the API in the Connect,
// gRPC-Web and gRPC-Web-text protocols: its preflight is answered with
// the methods and headers those need, and the answers expose the headers
// they read. A page from any other origin gets no CORS header at all.
func TestCORSAndGRPCWeb(t *testing.T) {
	s, err := Start(Config{Listen: "127.0.0.1:0", CORSOrigins: []string{"https://app.example", "http://localhost:*"},
		Dev: &DevConfig{DataDir: t.TempDir(), Router: router.Config{ScanInterval: 50 * time.Millisecond}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	defer s.Shutdown(ctx)
	base := "http://" + s.Addr()
	acquire := base + "/warden.v1.LockService/Acquire"

	preflight := func(origin, headers string) *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodOptions, acquire, nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "POST")
		req.Header.Set("Access-Control-Request-Headers", headers)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	// Browsers send the requested headers sorted and in lower case
	// (rs/cors refuses other lists).
	for _, c := range []struct{ origin, headers string }{
		{"https://app.example", "authorization,connect-protocol-version,connect-timeout-ms,content-type"},
		{"http://localhost:5173", "authorization,content-type,grpc-timeout,x-grpc-web,x-user-agent"},
	} {
		resp := preflight(c.origin, c.headers)
		if resp.StatusCode/100 != 2 || resp.Header.Get("Access-Control-Allow-Origin") != c.origin {
			t.Fatalf("preflight from %s: %s, Allow-Origin %q", c.origin, resp.Status, resp.Header.Get("Access-Control-Allow-Origin"))
		}
		allowed := strings.ToLower(resp.Header.Get("Access-Control-Allow-Headers"))
		for _, h := range strings.Split(c.headers, ",") {
			if !strings.Contains(allowed, h) {
				t.Errorf("preflight from %s: header %s not allowed (%q)", c.origin, h, allowed)
			}
		}
		if resp.Header.Get("Access-Control-Allow-Credentials") != "" {
			t.Errorf("preflight from %s allows ambient credentials", c.origin)
		}
	}
	for _, origin := range []string{"https://evil.example", "https://app.example.evil", "http://localhost.evil:80"} {
		resp := preflight(origin, "content-type")
		for k := range resp.Header {
			if strings.HasPrefix(k, "Access-Control-") {
				t.Errorf("preflight from disallowed %s answered %s: %q", origin, k, resp.Header.Get(k))
			}
		}
	}

	// call sends an Acquire in one protocol from origin and returns the
	// answer's headers and body.
	call := func(contentType string, body []byte, origin string) (http.Header, []byte) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, acquire, bytes.NewReader(body))
		req.Header.Set("Content-Type", contentType)
		req.Header.Set("Origin", origin)
		if strings.HasPrefix(contentType, "application/grpc-web") {
			req.Header.Set("X-Grpc-Web", "1")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s: %s", contentType, resp.Status, b)
		}
		return resp.Header, b
	}
	exposes := func(h http.Header, origin string, names ...string) {
		t.Helper()
		if h.Get("Access-Control-Allow-Origin") != origin {
			t.Errorf("answer to %s: Allow-Origin %q", origin, h.Get("Access-Control-Allow-Origin"))
		}
		exposed := strings.ToLower(h.Get("Access-Control-Expose-Headers"))
		for _, n := range names {
			if !strings.Contains(exposed, strings.ToLower(n)) {
				t.Errorf("answer to %s does not expose %s (%q)", origin, n, exposed)
			}
		}
	}
	msg := func(resource string) []byte {
		b, _ := proto.Marshal(&wardenv1.AcquireRequest{Resource: resource, RequestId: "req-" + resource, LeaseTtl: durationpb.New(time.Minute)})
		return b
	}

	// Connect, JSON.
	h, b := call("application/json", []byte(`{"resource":"cors/connect","requestId":"c1","leaseTtl":"60s"}`), "https://app.example")
	exposes(h, "https://app.example")
	if !strings.Contains(string(b), `"fencing_token"`) {
		t.Fatalf("Connect answer %s has no fencing token", b)
	}

	// gRPC-Web, binary: one message frame and the trailer frame.
	h, b = call("application/grpc-web+proto", frame(0, msg("cors/web")), "http://localhost:5173")
	exposes(h, "http://localhost:5173", "Grpc-Status", "Grpc-Message")
	checkGRPCWebAnswer(t, "binary", h.Get("Content-Type"), "application/grpc-web+proto", b)

	// gRPC-Web-text: the same, base64; the request in two padded chunks.
	f := frame(0, msg("cors/text"))
	text := base64.StdEncoding.EncodeToString(f[:4]) + base64.StdEncoding.EncodeToString(f[4:])
	h, b = call("application/grpc-web-text", []byte(text), "https://app.example")
	exposes(h, "https://app.example", "Grpc-Status")
	raw, err := decodeChunks(b)
	if err != nil {
		t.Fatalf("gRPC-Web-text answer %q is not base64: %v", b, err)
	}
	checkGRPCWebAnswer(t, "text", h.Get("Content-Type"), "application/grpc-web-text+proto", raw)

	// Only the RPC paths take part: a page of an allowed origin reads no
	// metrics, probe or dashboard file of another origin.
	for _, path := range []string{"/metrics", "/readyz", "/ui/"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		req.Header.Set("Origin", "https://app.example")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if v := resp.Header.Get("Access-Control-Allow-Origin"); v != "" {
			t.Errorf("GET %s from an allowed origin: Allow-Origin %q, want none", path, v)
		}
	}

	// A disallowed origin's call is served (CORS binds browsers, not
	// servers) but carries no CORS header, so a browser hides it.
	h, _ = call("application/json", []byte(`{"resource":"cors/evil","requestId":"e1","leaseTtl":"60s"}`), "https://evil.example")
	if v := h.Get("Access-Control-Allow-Origin"); v != "" {
		t.Errorf("answer to a disallowed origin has Allow-Origin %q", v)
	}
}

// frame is a gRPC-Web frame: flags (0 a message, 0x80 the trailer), the
// length, the payload.
func frame(flags byte, payload []byte) []byte {
	f := make([]byte, 5, 5+len(payload))
	f[0] = flags
	binary.BigEndian.PutUint32(f[1:], uint32(len(payload)))
	return append(f, payload...)
}

// checkGRPCWebAnswer checks a gRPC-Web answer to an Acquire: the content
// type, one message frame holding a granted lease, and a trailer frame
// with grpc-status 0.
func checkGRPCWebAnswer(t *testing.T, name, contentType, wantType string, b []byte) {
	t.Helper()
	if contentType != wantType {
		t.Errorf("%s: content type %q, want %q", name, contentType, wantType)
	}
	var kinds []byte
	var got wardenv1.AcquireResponse
	var trailer string
	for len(b) >= 5 {
		n := int(binary.BigEndian.Uint32(b[1:5]))
		if len(b) < 5+n {
			t.Fatalf("%s: a frame of %d bytes in %d", name, n, len(b)-5)
		}
		payload := b[5 : 5+n]
		kinds = append(kinds, b[0])
		if b[0] == 0 {
			if err := proto.Unmarshal(payload, &got); err != nil {
				t.Fatalf("%s: message frame: %v", name, err)
			}
		} else {
			trailer = string(payload)
		}
		b = b[5+n:]
	}
	if !slices.Equal(kinds, []byte{0, 0x80}) || len(b) != 0 {
		t.Fatalf("%s: frames %v (and %d bytes left), want a message and a trailer", name, kinds, len(b))
	}
	if !strings.Contains(trailer, "grpc-status: 0") || got.GetFencingToken() == 0 {
		t.Fatalf("%s: trailer %q, token %d", name, trailer, got.GetFencingToken())
	}
}

// A gRPC-Web-text request to a path that answers no gRPC-Web (a 404)
// gets that answer as it is, not base64; bad base64 is a 400 naming it.
func TestGRPCWebTextPassesOtherAnswers(t *testing.T) {
	h := grpcWebText(http.NotFoundHandler(), 1<<10, func(*http.Request) error { return nil })
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/nope", strings.NewReader("AAAAAAA="))
	req.Header.Set("Content-Type", "application/grpc-web-text")
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), "404 page not found") {
		t.Fatalf("404 through the text layer: %d %q", rec.Code, rec.Body.String())
	}
	rec = httptest.NewRecorder()
	req = httptest.NewRequest(http.MethodPost, "/nope", strings.NewReader("not base64!"))
	req.Header.Set("Content-Type", "application/grpc-web-text")
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "not base64") {
		t.Fatalf("bad base64: %d %q", rec.Code, rec.Body.String())
	}
	rec = httptest.NewRecorder()
	req = httptest.NewRequest(http.MethodPost, "/nope", strings.NewReader(strings.Repeat("A", 2<<10)))
	req.Header.Set("Content-Type", "application/grpc-web-text")
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("a body over the bound: %d %q", rec.Code, rec.Body.String())
	}
}

// decodeChunks never panics, and decodes any run of padded chunks to
// their bytes joined.
func FuzzDecodeChunks(f *testing.F) {
	f.Add([]byte("ab"), []byte("cde"), []byte("AAAA=="))
	f.Fuzz(func(t *testing.T, a, b, raw []byte) {
		_, _ = decodeChunks(raw)
		text := base64.StdEncoding.EncodeToString(a) + base64.StdEncoding.EncodeToString(b)
		got, err := decodeChunks([]byte(text))
		if err != nil || !bytes.Equal(got, append(slices.Clone(a), b...)) {
			t.Fatalf("decodeChunks(%q) = %q, %v; want %q", text, got, err, append(slices.Clone(a), b...))
		}
	})
}

// ParseCORSOrigins never panics, and every origin it accepts as exact
// matches itself and nothing with a path appended.
func FuzzParseCORSOrigins(f *testing.F) {
	for _, s := range []string{"https://app.example", "http://localhost:*", "*", "http://[::1]:8080", "HTTP://x", "http://x:80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out, err := ParseCORSOrigins([]string{in})
		if err != nil {
			if !strings.Contains(err.Error(), "--cors-allowed-origins") {
				t.Fatalf("error %v does not name the flag", err)
			}
			return
		}
		for _, o := range out {
			if !strings.HasSuffix(o, ":*") && (!originMatches(o, o) || (o != "*" && originMatches(o, o+"/x"))) {
				t.Fatalf("accepted %q does not match exactly itself", o)
			}
		}
	})
}
