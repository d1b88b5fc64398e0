package placement

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/warden-dev/warden/auth"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
)

func authCmd(op *placementv1.AuthCmd) *placementv1.Command {
	return &placementv1.Command{Version: 3, Command: &placementv1.Command_Auth{Auth: op}}
}

// authedState is a bootstrapped placement state whose nodes all applied
// placement version 3.
func authedState(t *testing.T) *placementv1.State {
	t.Helper()
	st := &placementv1.State{Generation: 1, Nodes: []*placementv1.Node{{Id: 1, MetaCommandVersion: 3}, {Id: 2, MetaCommandVersion: 3}}}
	return st
}

// mustApply applies cmd and fails the test unless it was accepted.
func mustApply(t *testing.T, st *placementv1.State, cmd *placementv1.Command) *placementv1.State {
	t.Helper()
	next, res := ApplyMeta(st, cmd)
	if res.GetError() != "" {
		t.Fatalf("%v refused: %s", cmd, res.GetError())
	}
	return next
}

func refusal(st *placementv1.State, cmd *placementv1.Command) string {
	_, res := ApplyMeta(st, cmd)
	return res.GetError()
}

func TestAuthChanges(t *testing.T) {
	token, _ := auth.NewToken()
	rec, err := auth.TokenRecord(token, "admin", "first", 5)
	if err != nil {
		t.Fatal(err)
	}
	boot := &placementv1.AuthState{Enabled: true, Revision: 9, // the proposer's revision is not the state's
		Roles:    []*placementv1.Role{{Name: "op", Grants: []*placementv1.Grant{{Permission: "admin"}}}},
		Bindings: []*placementv1.Binding{{Principal: "admin", Role: "op"}},
		Tokens:   []*placementv1.Token{rec}}
	st := mustApply(t, authedState(t), authCmd(&placementv1.AuthCmd{Op: &placementv1.AuthCmd_Bootstrap{Bootstrap: boot}}))
	want := proto.CloneOf(boot)
	want.Revision = 1
	if !proto.Equal(st.GetAuth(), want) {
		t.Fatalf("bootstrapped %v, want %v", st.GetAuth(), boot)
	}
	// A second bootstrap (another initial member's) changes nothing.
	if got := refusal(st, authCmd(&placementv1.AuthCmd{Op: &placementv1.AuthCmd_Bootstrap{Bootstrap: boot}})); got != ErrAuthBootstrapped.Error() {
		t.Errorf("a second bootstrap: %q", got)
	}
	rev := st.GetAuth().GetRevision()
	orders := &placementv1.Role{Name: "orders", Grants: []*placementv1.Grant{{Permission: "lock", Prefix: "orders/"}}}
	st = mustApply(t, st, authCmd(&placementv1.AuthCmd{Op: &placementv1.AuthCmd_PutRole{PutRole: orders}}))
	st = mustApply(t, st, authCmd(&placementv1.AuthCmd{Op: &placementv1.AuthCmd_Bind{Bind: &placementv1.Binding{Principal: "svc", Role: "orders"}}}))
	st = mustApply(t, st, authCmd(&placementv1.AuthCmd{Op: &placementv1.AuthCmd_Bind{Bind: &placementv1.Binding{Principal: "svc", Role: "orders"}}})) // twice is once
	if n := len(st.GetAuth().GetBindings()); n != 2 {
		t.Errorf("%d bindings, want 2", n)
	}
	if got := st.GetAuth().GetRevision(); got != rev+3 {
		t.Errorf("revision %d after three changes from %d", got, rev)
	}
	for _, tc := range []struct {
		name string
		op   *placementv1.AuthCmd
		want string
	}{
		{"delete a bound role", &placementv1.AuthCmd{Op: &placementv1.AuthCmd_DeleteRole{DeleteRole: "orders"}}, "is bound"},
		{"delete a role that is not there", &placementv1.AuthCmd{Op: &placementv1.AuthCmd_DeleteRole{DeleteRole: "nope"}}, "does not exist"},
		{"bind to a role that is not there", &placementv1.AuthCmd{Op: &placementv1.AuthCmd_Bind{Bind: &placementv1.Binding{Principal: "x", Role: "nope"}}}, "does not exist"},
		{"unbind the last admin", &placementv1.AuthCmd{Op: &placementv1.AuthCmd_Unbind{Unbind: &placementv1.Binding{Principal: "admin", Role: "op"}}}, "no one could manage"},
		{"take admin from its role", &placementv1.AuthCmd{Op: &placementv1.AuthCmd_PutRole{PutRole: &placementv1.Role{Name: "op", Grants: []*placementv1.Grant{{Permission: "read"}}}}}, "no one could manage"},
		{"a bad permission", &placementv1.AuthCmd{Op: &placementv1.AuthCmd_PutRole{PutRole: &placementv1.Role{Name: "r", Grants: []*placementv1.Grant{{Permission: "root"}}}}}, "role.grants[0].permission"},
		{"a token twice", &placementv1.AuthCmd{Op: &placementv1.AuthCmd_CreateToken{CreateToken: rec}}, "token.id"},
		{"revoke a token that is not there", &placementv1.AuthCmd{Op: &placementv1.AuthCmd_RevokeToken{RevokeToken: "0123456789abcdef"}}, "does not exist"},
		{"no change", &placementv1.AuthCmd{}, "missing"},
	} {
		if got := refusal(st, authCmd(tc.op)); !strings.Contains(got, tc.want) {
			t.Errorf("%s: refused %q, want it to say %q", tc.name, got, tc.want)
		}
	}
	st = mustApply(t, st, authCmd(&placementv1.AuthCmd{Op: &placementv1.AuthCmd_RevokeToken{RevokeToken: rec.GetId()}}))
	if _, err := auth.Compile(st.GetAuth()).Authenticate(token); !errors.Is(err, auth.ErrBadToken) {
		t.Errorf("a revoked token authenticates: %v", err)
	}
	// Off, the admin binding may go; on again, it must be back.
	st = mustApply(t, st, authCmd(&placementv1.AuthCmd{Op: &placementv1.AuthCmd_SetEnabled{SetEnabled: false}}))
	st = mustApply(t, st, authCmd(&placementv1.AuthCmd{Op: &placementv1.AuthCmd_Unbind{Unbind: &placementv1.Binding{Principal: "admin", Role: "op"}}}))
	if got := refusal(st, authCmd(&placementv1.AuthCmd{Op: &placementv1.AuthCmd_SetEnabled{SetEnabled: true}})); !strings.Contains(got, "no one could manage") {
		t.Errorf("enabling without an admin binding: %q", got)
	}
}

// An auth change is placement version 3: not proposed, nor applied,
// while a node runs a binary that applies only version 2.
func TestAuthNeedsVersion3(t *testing.T) {
	cmd := authCmd(&placementv1.AuthCmd{Op: &placementv1.AuthCmd_SetEnabled{SetEnabled: false}})
	cmd.Version = 0
	if v := MetaVersionOf(cmd); v != 3 {
		t.Fatalf("MetaVersionOf(auth) = %d, want 3", v)
	}
	if _, err := stampVersion(cmd, 2); !errors.Is(err, ErrMetaVersion) {
		t.Errorf("stamped for a version-2 cluster: %v", err)
	}
	st := authedState(t)
	st.Nodes[1].MetaCommandVersion = 2
	cmd.Version = 3
	if got := refusal(st, cmd); !strings.Contains(got, "version") {
		t.Errorf("applied where a node runs version 2: %q", got)
	}
}
