package auth

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
)

// The bootstrap file (wardend --auth-bootstrap) is JSON:
//
//	{
//	  "enabled": true,
//	  "roles": [{"name": "operator", "grants": [{"permission": "admin"}, {"permission": "lock"}]},
//	            {"name": "orders", "grants": [{"permission": "lock", "prefix": "orders/"}]}],
//	  "bindings": [{"principal": "admin", "role": "operator"},
//	               {"principal": "orders", "role": "orders"}],
//	  "tokens": [{"principal": "admin", "file": "admin.token"},
//	             {"principal": "orders", "file": "orders.token"}]
//	}
//
// "enabled" defaults to true. Each token's file (relative to the
// bootstrap file's folder) holds one token (warden auth token generate);
// only its id and hash reach the cluster. Unknown fields are refused.
type bootstrapFile struct {
	Enabled  *bool            `json:"enabled"`
	Roles    []bootstrapRole  `json:"roles"`
	Bindings []bootstrapBind  `json:"bindings"`
	Tokens   []bootstrapToken `json:"tokens"`
}

type bootstrapRole struct {
	Name   string `json:"name"`
	Grants []struct {
		Permission string `json:"permission"`
		Prefix     string `json:"prefix"`
	} `json:"grants"`
}

type bootstrapBind struct {
	Principal string `json:"principal"`
	Role      string `json:"role"`
}

type bootstrapToken struct {
	Principal   string `json:"principal"`
	File        string `json:"file"`
	Description string `json:"description"`
}

// maxBootstrapBytes bounds the bootstrap file.
const maxBootstrapBytes = 4 << 20

// LoadBootstrap reads the bootstrap file at path and the token files it
// names, and returns the auth state it describes (tokens created at
// nowUnixMs), to propose as an AuthCmd bootstrap. Errors name the file and the field.
func LoadBootstrap(path string, nowUnixMs int64) (*placementv1.AuthState, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	st, err := ParseBootstrap(data, nowUnixMs, func(name string) (string, error) {
		if !filepath.IsAbs(name) {
			name = filepath.Join(dir, name)
		}
		b, err := os.ReadFile(name)
		return strings.TrimSpace(string(b)), err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return st, nil
}

// ParseBootstrap decodes a bootstrap file's content; readToken returns
// the token in a token file. Errors name the field.
func ParseBootstrap(data []byte, nowUnixMs int64, readToken func(file string) (string, error)) (*placementv1.AuthState, error) {
	if len(data) > maxBootstrapBytes {
		return nil, fmt.Errorf("is %d bytes, more than %d", len(data), maxBootstrapBytes)
	}
	var f bootstrapFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("holds more than one JSON value")
	}
	st := &placementv1.AuthState{Enabled: f.Enabled == nil || *f.Enabled}
	for i, r := range f.Roles {
		role := &placementv1.Role{Name: r.Name}
		for _, g := range r.Grants {
			role.Grants = append(role.Grants, &placementv1.Grant{Permission: g.Permission, Prefix: g.Prefix})
		}
		if err := CheckRole(role); err != nil {
			return nil, fmt.Errorf("roles[%d]: %w", i, err)
		}
		st.Roles = append(st.Roles, role)
	}
	for _, b := range f.Bindings {
		st.Bindings = append(st.Bindings, &placementv1.Binding{Principal: b.Principal, Role: b.Role})
	}
	for i, t := range f.Tokens {
		if t.File == "" {
			return nil, fmt.Errorf("tokens[%d].file: is required", i)
		}
		token, err := readToken(t.File)
		if err != nil {
			return nil, fmt.Errorf("tokens[%d].file: %w", i, err)
		}
		rec, err := TokenRecord(token, t.Principal, t.Description, nowUnixMs)
		if err != nil {
			return nil, fmt.Errorf("tokens[%d] (%s): %w", i, t.File, err)
		}
		st.Tokens = append(st.Tokens, rec)
	}
	if err := CheckState(st); err != nil {
		return nil, err
	}
	return st, nil
}

// CheckState checks a whole auth state, as a bootstrap sets it: each
// role, binding and token, the bounds, that names are unique and that
// every binding names a role; with authentication on, that a binding
// grants admin.
func CheckState(st *placementv1.AuthState) error {
	if len(st.GetRoles()) > MaxRoles || len(st.GetBindings()) > MaxBindings || len(st.GetTokens()) > MaxTokens {
		return fmt.Errorf("at most %d roles, %d bindings and %d tokens", MaxRoles, MaxBindings, MaxTokens)
	}
	roles := map[string]bool{}
	for i, r := range st.GetRoles() {
		if err := CheckRole(r); err != nil {
			return fmt.Errorf("roles[%d]: %w", i, err)
		}
		if roles[r.GetName()] {
			return fmt.Errorf("roles[%d].name: %q is there twice", i, r.GetName())
		}
		roles[r.GetName()] = true
	}
	for i, b := range st.GetBindings() {
		if err := CheckBinding(b); err != nil {
			return fmt.Errorf("bindings[%d]: %w", i, err)
		}
		if !roles[b.GetRole()] {
			return fmt.Errorf("bindings[%d].role: no role %q", i, b.GetRole())
		}
	}
	ids := map[string]bool{}
	for i, t := range st.GetTokens() {
		if err := CheckToken(t); err != nil {
			return fmt.Errorf("tokens[%d]: %w", i, err)
		}
		if ids[t.GetId()] {
			return fmt.Errorf("tokens[%d]: the same token is there twice", i)
		}
		ids[t.GetId()] = true
	}
	if st.GetEnabled() && !GrantsAdmin(st) {
		return errors.New("enabled: no binding grants admin, so no one could manage the cluster")
	}
	return nil
}
