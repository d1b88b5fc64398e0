package rpc_test

import (
	"testing"

	"connectrpc.com/connect"
)

// detail returns the first error detail of type T, failing the test if
// there is none.
func detail[T any](t *testing.T, ce *connect.Error) T {
	t.Helper()
	for _, d := range ce.Details() {
		v, err := d.Value()
		if err != nil {
			continue
		}
		if m, ok := v.(T); ok {
			return m
		}
	}
	var zero T
	t.Fatalf("no %T detail in %v", zero, ce)
	return zero
}
