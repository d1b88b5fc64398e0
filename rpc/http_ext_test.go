package rpc_test

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/warden-dev/warden/server"
)

// post sends a raw Connect JSON request, as curl would, and returns the
// HTTP status, and the error code ("" on success) and message of the body.
func post(t *testing.T, url string, body io.Reader, header map[string]string) (status int, code, message string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct{ Code, Message string }
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out.Code, out.Message
}

func TestHostileHTTPRequests(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	acquire := c.srv.URL + "/warden.v1.LockService/Acquire"

	big := `{"resource":"r","request_id":"q","holder":"` + strings.Repeat("x", 1<<20) + `"}`
	if status, code, msg := post(t, acquire, strings.NewReader(big), nil); code != "resource_exhausted" {
		t.Fatalf("1 MiB body: %d %q (%s), want resource_exhausted", status, code, msg)
	}

	// A gzip bomb: 64 MiB of JSON in about 64 KiB. The bound applies to
	// the decompressed size.
	var bomb bytes.Buffer
	zw := gzip.NewWriter(&bomb)
	zw.Write([]byte(`{"resource":"r","request_id":"q","x":"`))
	chunk := bytes.Repeat([]byte("q"), 1<<20)
	for range 64 {
		zw.Write(chunk)
	}
	zw.Write([]byte(`"}`))
	zw.Close()
	if status, code, msg := post(t, acquire, &bomb, map[string]string{"Content-Encoding": "gzip"}); code != "resource_exhausted" {
		t.Fatalf("gzip bomb: %d %q (%s), want resource_exhausted", status, code, msg)
	}

	// A deadline too short to propose anything is deadline_exceeded, not
	// an unknown outcome.
	if _, code, msg := post(t, acquire, strings.NewReader(`{"resource":"r","request_id":"q"}`), map[string]string{"Connect-Timeout-Ms": "1"}); code != "deadline_exceeded" {
		t.Fatalf("1 ms deadline: %q (%s), want deadline_exceeded", code, msg)
	}
	// The service is unharmed.
	if status, code, msg := post(t, acquire, strings.NewReader(`{"resource":"r","request_id":"q2"}`), nil); status != http.StatusOK {
		t.Fatalf("acquire after the attacks: %d %q (%s)", status, code, msg)
	}
}
