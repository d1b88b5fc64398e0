package client_test

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warden-dev/warden/client"
	"github.com/warden-dev/warden/client/fence"
)

// Importing the SDK registers nothing in the process's default registry;
// RegisterMetrics puts its metrics (and the fence's) where the caller
// says, once.
func TestMetricsOnlyWhereRegistered(t *testing.T) {
	// Had importing the packages registered them (promauto), the default
	// registry would refuse them now as already registered.
	if err := client.RegisterMetrics(prometheus.DefaultRegisterer); err != nil {
		t.Fatalf("the SDK's metrics were registered at init: %v", err)
	}
	if err := fence.RegisterMetrics(prometheus.DefaultRegisterer); err != nil {
		t.Fatalf("the fence's metric was registered at init: %v", err)
	}
	reg := prometheus.NewRegistry()
	if err := client.RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	if err := fence.RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	var already prometheus.AlreadyRegisteredError
	if err := client.RegisterMetrics(reg); !errors.As(err, &already) {
		t.Fatalf("registering twice: %v, want AlreadyRegisteredError", err)
	}
	var m fence.Memory
	_ = m.Check("r", 2)
	if err := m.Check("r", 1); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("a lower token: %v", err)
	}
	got, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range got {
		names[mf.GetName()] = true
	}
	if !names["warden_fencing_rejections_total"] {
		t.Fatalf("the fence's rejection is not in the caller's registry: %v", names)
	}
}
