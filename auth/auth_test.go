package auth

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
)

func TestTokenFormat(t *testing.T) {
	token, id := NewToken()
	got, err := ParseToken(token)
	if err != nil || got != id {
		t.Fatalf("ParseToken(%q) = %q, %v; want %q", token, got, err, id)
	}
	other, _ := NewToken()
	if other == token {
		t.Fatal("two tokens are the same")
	}
	for _, bad := range []string{"", "wdn1", "wdn1.", "wdn2." + token[5:], token + "x", token[:len(token)-1],
		strings.Replace(token, id, strings.ToUpper(id), 1), "wdn1." + id + ".", "wdn1.." + token[22:]} {
		if _, err := ParseToken(bad); !errors.Is(err, ErrBadToken) {
			t.Errorf("ParseToken(%q) = %v, want ErrBadToken", bad, err)
		}
	}
}

// state is an auth state with an operator (admin everywhere), a role
// that locks orders/ and reads everything, and a token for each.
func state(t *testing.T) (st *placementv1.AuthState, adminToken, ordersToken string) {
	t.Helper()
	adminToken, _ = NewToken()
	ordersToken, _ = NewToken()
	admin, err := TokenRecord(adminToken, "admin", "", 1)
	if err != nil {
		t.Fatal(err)
	}
	orders, err := TokenRecord(ordersToken, "orders", "", 1)
	if err != nil {
		t.Fatal(err)
	}
	st = &placementv1.AuthState{Enabled: true, Revision: 1,
		Roles: []*placementv1.Role{
			{Name: "operator", Grants: []*placementv1.Grant{{Permission: "admin"}, {Permission: "lock"}}},
			{Name: "orders", Grants: []*placementv1.Grant{{Permission: "lock", Prefix: "orders/"}, {Permission: "read"}}},
		},
		Bindings: []*placementv1.Binding{{Principal: "admin", Role: "operator"}, {Principal: "orders", Role: "orders"}, {Principal: "spiffe://warden/orders", Role: "orders"}},
		Tokens:   []*placementv1.Token{admin, orders}}
	if err := CheckState(st); err != nil {
		t.Fatal(err)
	}
	return st, adminToken, ordersToken
}

func TestPolicy(t *testing.T) {
	st, adminToken, ordersToken := state(t)
	p := Compile(st)
	for token, want := range map[string]string{adminToken: "admin", ordersToken: "orders"} {
		if got, err := p.Authenticate(token); err != nil || got != want {
			t.Errorf("Authenticate = %q, %v; want %q", got, err, want)
		}
	}
	// A token of the right format and a known id but another secret.
	id, _ := ParseToken(adminToken)
	forged, _ := NewToken()
	forged = "wdn1." + id + forged[len("wdn1.")+16:]
	for _, bad := range []string{forged, "wdn1.0123456789abcdef." + strings.Repeat("A", 43), "nonsense"} {
		if _, err := p.Authenticate(bad); !errors.Is(err, ErrBadToken) {
			t.Errorf("Authenticate(%q) = %v, want ErrBadToken", bad, err)
		}
	}
	for _, tc := range []struct {
		principal string
		perm      Permission
		resource  string
		want      bool
	}{
		{"admin", Admin, "", true},
		{"admin", Lock, "anything", true},
		{"admin", QuotaUse, "k", false}, // permissions are independent
		{"orders", Lock, "orders/42", true},
		{"orders", Lock, "orders", false}, // the prefix is a string prefix
		{"orders", Lock, "payments/1", false},
		{"orders", Read, "payments/1", true},
		{"orders", Admin, "", false},
		{"spiffe://warden/orders", Lock, "orders/1", true},
		{"nobody", Read, "x", false},
		{"", Lock, "orders/1", false},
	} {
		if got := p.Allows(tc.principal, tc.perm, tc.resource); got != tc.want {
			t.Errorf("Allows(%q, %s, %q) = %v, want %v", tc.principal, tc.perm, tc.resource, got, tc.want)
		}
	}
	off := proto.CloneOf(st)
	off.Enabled = false
	if !Compile(off).Allows("", Admin, "") || !(*Policy)(nil).Allows("", Admin, "") {
		t.Error("with authentication off something is refused")
	}
}

func TestPrincipalOf(t *testing.T) {
	u, _ := url.Parse("spiffe://warden/orders")
	if got := PrincipalOf(&x509.Certificate{URIs: []*url.URL{u}, Subject: pkix.Name{CommonName: "cn"}}); got != "spiffe://warden/orders" {
		t.Errorf("with a URI SAN: %q", got)
	}
	if got := PrincipalOf(&x509.Certificate{Subject: pkix.Name{CommonName: "cn"}}); got != "cn" {
		t.Errorf("with a CN only: %q", got)
	}
}

func TestCheckRole(t *testing.T) {
	for _, tc := range []struct {
		role  *placementv1.Role
		field string // "" for valid
	}{
		{&placementv1.Role{Name: "ok.role_1-x", Grants: []*placementv1.Grant{{Permission: "quota.use", Prefix: "a/"}}}, ""},
		{&placementv1.Role{Name: ""}, "role.name"},
		{&placementv1.Role{Name: "Upper"}, "role.name"},
		{&placementv1.Role{Name: strings.Repeat("a", 65)}, "role.name"},
		{&placementv1.Role{Name: "r", Grants: []*placementv1.Grant{{Permission: "write"}}}, "role.grants[0].permission"},
		{&placementv1.Role{Name: "r", Grants: []*placementv1.Grant{{Permission: "lock"}, {Permission: "admin", Prefix: "x"}}}, "role.grants[1].prefix"},
		{&placementv1.Role{Name: "r", Grants: []*placementv1.Grant{{Permission: "lock", Prefix: "a\x00"}}}, "role.grants[0].prefix"},
	} {
		err := CheckRole(tc.role)
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%v: %v", tc.role, err)
		case tc.field != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.field+":")):
			t.Errorf("%v: %v, want an error naming %s", tc.role, err, tc.field)
		}
	}
}

func TestCheckStateLockout(t *testing.T) {
	st, _, _ := state(t)
	st.Bindings = st.Bindings[1:] // the operator's binding
	if err := CheckState(st); err == nil || !strings.Contains(err.Error(), "admin") {
		t.Errorf("enabled without an admin binding: %v", err)
	}
	st.Enabled = false
	if err := CheckState(st); err != nil {
		t.Errorf("disabled without an admin binding: %v", err)
	}
}

func TestLoadBootstrap(t *testing.T) {
	dir := t.TempDir()
	token, id := NewToken()
	if err := os.WriteFile(filepath.Join(dir, "admin.token"), []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	write := func(s string) string {
		p := filepath.Join(dir, "auth.json")
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	st, err := LoadBootstrap(write(`{"roles":[{"name":"op","grants":[{"permission":"admin"}]}],
		"bindings":[{"principal":"admin","role":"op"}],"tokens":[{"principal":"admin","file":"admin.token"}]}`), 7)
	if err != nil {
		t.Fatal(err)
	}
	if !st.GetEnabled() || st.GetTokens()[0].GetId() != id || st.GetTokens()[0].GetCreatedUnixMs() != 7 {
		t.Errorf("loaded %v", st)
	}
	if p, err := Compile(st).Authenticate(token); err != nil || p != "admin" {
		t.Errorf("the bootstrap token authenticates as %q, %v", p, err)
	}
	if strings.Contains(st.String(), token) {
		t.Error("the state holds the token itself")
	}
	for _, tc := range []struct{ body, want string }{
		{`{"rols":[]}`, `unknown field "rols"`},
		{`{"roles":[{"name":"op","grants":[{"permission":"root"}]}]}`, "roles[0]: role.grants[0].permission"},
		{`{"enabled":false,"bindings":[{"principal":"a","role":"missing"}]}`, `bindings[0].role: no role "missing"`},
		{`{"enabled":false,"tokens":[{"principal":"a"}]}`, "tokens[0].file: is required"},
		{`{"enabled":false,"tokens":[{"principal":"a","file":"nope"}]}`, "tokens[0].file:"},
		{`{"roles":[]}`, "no binding grants admin"},
		{`{} {}`, "more than one JSON value"},
	} {
		_, err := LoadBootstrap(write(tc.body), 0)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "auth.json") {
			t.Errorf("%s: %v, want an error naming the file and %q", tc.body, err, tc.want)
		}
	}
}

func FuzzParseToken(f *testing.F) {
	token, _ := NewToken()
	f.Add(token)
	f.Add("wdn1.0123456789abcdef.x")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseToken(s)
		if err != nil {
			return
		}
		if !strings.HasPrefix(s, "wdn1."+id+".") || !validTokenID(id) {
			t.Fatalf("ParseToken(%q) accepted id %q", s, id)
		}
	})
}

func FuzzParseBootstrap(f *testing.F) {
	f.Add([]byte(`{"roles":[{"name":"op","grants":[{"permission":"admin"}]}],"bindings":[{"principal":"admin","role":"op"}],"tokens":[{"principal":"admin","file":"t"}]}`))
	f.Add([]byte(`{"enabled":false}`))
	token, _ := NewToken()
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := ParseBootstrap(data, 0, func(string) (string, error) { return token, nil })
		if err != nil {
			return
		}
		// Whatever parses is a state every replica accepts.
		if err := CheckState(st); err != nil {
			t.Fatalf("ParseBootstrap accepted a state CheckState refuses: %v", err)
		}
	})
}
