package server

import (
	"strings"
	"testing"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
)

// A node given --auth-bootstrap that finds the cluster's auth state set
// already, with authentication off, says so: the bootstrap does not apply,
// and the node serves unauthenticated calls (security review, finding 1).
func TestBootstrapIgnoredIsSaid(t *testing.T) {
	on := &placementv1.AuthState{Enabled: true}
	for _, c := range []struct {
		name      string
		st, boot  *placementv1.AuthState
		wantError bool
	}{
		{"no auth state yet: the bootstrap applies", &placementv1.AuthState{}, on, false},
		{"written while off, before any bootstrap", &placementv1.AuthState{Revision: 3, Roles: []*placementv1.Role{{Name: "admin"}}}, on, true},
		{"turned off after the bootstrap", &placementv1.AuthState{Revision: 7}, on, true},
		{"on", &placementv1.AuthState{Revision: 2, Enabled: true}, on, false},
		{"a bootstrap that leaves it off", &placementv1.AuthState{Revision: 2}, &placementv1.AuthState{}, false},
	} {
		msg := bootstrapIgnored(c.st, c.boot)
		if (msg != "") != c.wantError {
			t.Errorf("%s: %q", c.name, msg)
		}
		if c.wantError && !strings.Contains(msg, "authentication is OFF") {
			t.Errorf("%s: %q does not say authentication is off", c.name, msg)
		}
	}
}
