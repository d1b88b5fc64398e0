package rpc

import (
	"strings"
	"testing"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

// An integer field written with an exponent or a fraction ("1e3", 2.0)
// is refused naming the field, not read as 1000; digits are read, and a
// string field may hold "1e3".
func TestJSONIntegersInDigits(t *testing.T) {
	c := jsonCodec{"json"}
	for _, body := range []string{`{"key":"a/b","limit":1e3}`, `{"key":"a/b","limit":"1e3"}`, `{"key":"a/b","limit":1000.0}`, `{"key":"a/b","limit":"1E3"}`} {
		var m wardenv1.SetLimitRequest
		if err := c.Unmarshal([]byte(body), &m); err == nil || !strings.Contains(err.Error(), "limit") {
			t.Errorf("SetLimit %s: %v (limit %d), want an error naming limit", body, err, m.GetLimit())
		}
	}
	var r wardenv1.ReserveRequest
	if err := c.Unmarshal([]byte(`{"key":"1e3","amount":"2e1","reservation_id":"r"}`), &r); err == nil || !strings.Contains(err.Error(), "amount") {
		t.Errorf("Reserve with amount 2e1: %v, want an error naming amount", err)
	}
	for _, body := range []string{`{"key":"1e3","limit":1000}`, `{"key":"1e3","limit":"1000"}`} {
		var m wardenv1.SetLimitRequest
		if err := c.Unmarshal([]byte(body), &m); err != nil || m.GetLimit() != 1000 || m.GetKey() != "1e3" {
			t.Errorf("SetLimit %s: %v, %v; want limit 1000 of key 1e3", body, &m, err)
		}
	}
}
