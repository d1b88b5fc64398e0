package ui

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func get(t *testing.T, h http.Handler, method, target string, hdr map[string]string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func body(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func checkSecurityHeaders(t *testing.T, resp *http.Response) {
	t.Helper()
	for k, want := range map[string]string{
		"Content-Security-Policy": ContentSecurityPolicy,
		"X-Content-Type-Options":  "nosniff",
		"X-Frame-Options":         "DENY",
		"Referrer-Policy":         "no-referrer",
	} {
		if got := resp.Header.Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
}

func TestIndex(t *testing.T) {
	h := Handler()
	for _, target := range []string{"/ui/", "/ui/index.html"} {
		resp := get(t, h, http.MethodGet, target, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", target, resp.StatusCode)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
			t.Errorf("GET %s: Content-Type %q", target, ct)
		}
		if cc := resp.Header.Get("Cache-Control"); cc != "no-cache" {
			t.Errorf("GET %s: Cache-Control %q", target, cc)
		}
		checkSecurityHeaders(t, resp)
		b := body(t, resp)
		for _, want := range []string{`<script src="app.js"`, `href="app.css"`, "<title>Warden"} {
			if !strings.Contains(b, want) {
				t.Errorf("GET %s: the page lacks %q", target, want)
			}
		}
	}
}

func TestAssets(t *testing.T) {
	h := Handler()
	for target, ctype := range map[string]string{
		"/ui/app.js":  "text/javascript; charset=utf-8",
		"/ui/app.css": "text/css; charset=utf-8",
	} {
		resp := get(t, h, http.MethodGet, target, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", target, resp.StatusCode)
		}
		if got := resp.Header.Get("Content-Type"); got != ctype {
			t.Errorf("GET %s: Content-Type %q, want %q", target, got, ctype)
		}
		checkSecurityHeaders(t, resp)
		if len(body(t, resp)) == 0 {
			t.Errorf("GET %s: empty", target)
		}
		// A revalidation with the ETag is answered 304.
		etag := resp.Header.Get("ETag")
		if etag == "" {
			t.Fatalf("GET %s: no ETag", target)
		}
		if resp := get(t, h, http.MethodGet, target, map[string]string{"If-None-Match": etag}); resp.StatusCode != http.StatusNotModified {
			t.Errorf("GET %s If-None-Match: %d, want 304", target, resp.StatusCode)
		}
	}
}

func TestHead(t *testing.T) {
	resp := get(t, Handler(), http.MethodHead, "/ui/", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("HEAD /ui/: %d", resp.StatusCode)
	}
	if b := body(t, resp); b != "" {
		t.Errorf("HEAD /ui/ has a body of %d bytes", len(b))
	}
}

func TestRedirect(t *testing.T) {
	h := Handler()
	for target, want := range map[string]string{
		"/ui":                                "/ui/",
		"/ui?endpoint=http://127.0.0.1:7071": "/ui/?endpoint=http://127.0.0.1:7071",
	} {
		resp := get(t, h, http.MethodGet, target, nil)
		if resp.StatusCode != http.StatusMovedPermanently {
			t.Fatalf("GET %s: %d, want 301", target, resp.StatusCode)
		}
		if loc := resp.Header.Get("Location"); loc != want {
			t.Errorf("GET %s: Location %q, want %q", target, loc, want)
		}
	}
}

func TestNotFound(t *testing.T) {
	h := Handler()
	for _, target := range []string{"/ui/nope.js", "/ui/../embed.go", "/ui/dist/index.html", "/elsewhere", "/uix"} {
		resp := get(t, h, http.MethodGet, target, nil)
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", target, resp.StatusCode)
		}
		checkSecurityHeaders(t, resp)
	}
}

func TestMethods(t *testing.T) {
	h := Handler()
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodOptions} {
		resp := get(t, h, m, "/ui/", nil)
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("%s /ui/: %d, want 405", m, resp.StatusCode)
		}
		if allow := resp.Header.Get("Allow"); allow != "GET, HEAD" {
			t.Errorf("%s /ui/: Allow %q", m, allow)
		}
	}
}
