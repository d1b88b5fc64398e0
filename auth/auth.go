// Package auth is Warden's authentication and authorization model: the
// permissions, bearer tokens (their format and hashes), the checks every
// replica applies to an auth change, and Policy, the compiled view of
// the replicated auth state that each node decides calls by.
//
// It is pure: no clock, no I/O (LoadBootstrap aside, which reads the
// operator's files before anything is proposed), so the placement state
// machine applies its checks as every replica would.
package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	"github.com/warden-dev/warden/shard"
)

// Permission is what a grant allows.
type Permission string

// The permissions (docs/security.md, "Authorization").
const (
	// Lock: Acquire, Renew, Release, Describe and Batch ops on resources
	// under the grant's prefix. A lease id is a bearer capability for its
	// own renew and release, but only for a principal allowed lock on its
	// resource.
	Lock Permission = "lock"
	// QuotaUse: Reserve, Commit, Release and Query on quota keys under
	// the prefix.
	QuotaUse Permission = "quota.use"
	// QuotaAdmin: SetLimit and ReportUsage on keys under the prefix.
	QuotaAdmin Permission = "quota.admin"
	// Admin: every change through AdminService and AuthService (split,
	// move, transfer, rebalance, snapshot, shard config, auth). It takes
	// no prefix.
	Admin Permission = "admin"
	// Read: Describe, Query and the listings, under the prefix.
	Read Permission = "read"
)

// Permissions lists every permission, in the order docs name them.
var Permissions = []Permission{Lock, QuotaUse, QuotaAdmin, Admin, Read}

func known(p Permission) bool {
	for _, q := range Permissions {
		if p == q {
			return true
		}
	}
	return false
}

// The bounds of the auth state, so that no change can fill the placement
// group's memory or make every call's check slow.
const (
	MaxRoles          = 1_000
	MaxGrantsPerRole  = 64
	MaxBindings       = 10_000
	MaxTokens         = 10_000
	MaxPrefixBytes    = 1024
	MaxPrincipalBytes = 512
	MaxDescription    = 256
	maxRoleName       = 64
)

// Tokens read "wdn1.<id>.<secret>": id is 8 random bytes in hex (public:
// listings and revocations name it), secret 32 random bytes in unpadded
// base64url. The cluster stores the id and the SHA-256 of the whole
// token. A token of 256 random bits needs no slow hash: no guessing
// attack on its SHA-256 is feasible.
const (
	tokenScheme  = "wdn1"
	tokenIDBytes = 8
	secretBytes  = 32
)

// ErrBadToken is every token that does not authenticate: malformed,
// unknown or revoked alike, so a caller learns nothing about which.
var ErrBadToken = errors.New("the bearer token is not valid")

// NewToken returns a new random token and its public id.
func NewToken() (token, id string) {
	b := make([]byte, tokenIDBytes+secretBytes)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	id = hex.EncodeToString(b[:tokenIDBytes])
	return tokenScheme + "." + id + "." + base64.RawURLEncoding.EncodeToString(b[tokenIDBytes:]), id
}

// ParseToken returns token's id if token has the token format; the error
// is ErrBadToken otherwise.
func ParseToken(token string) (id string, err error) {
	scheme, rest, ok := strings.Cut(token, ".")
	if !ok || scheme != tokenScheme {
		return "", ErrBadToken
	}
	id, secret, ok := strings.Cut(rest, ".")
	if !ok || !validTokenID(id) {
		return "", ErrBadToken
	}
	if b, err := base64.RawURLEncoding.DecodeString(secret); err != nil || len(b) != secretBytes {
		return "", ErrBadToken
	}
	return id, nil
}

func validTokenID(id string) bool {
	b, err := hex.DecodeString(id)
	return err == nil && len(b) == tokenIDBytes && id == strings.ToLower(id)
}

// Sum is the hash the cluster stores for token.
func Sum(token string) []byte {
	s := sha256.Sum256([]byte(token))
	return s[:]
}

// TokenRecord returns the record of token (which must parse) for
// principal, to store in the auth state.
func TokenRecord(token, principal, description string, createdUnixMs int64) (*placementv1.Token, error) {
	id, err := ParseToken(token)
	if err != nil {
		return nil, err
	}
	t := &placementv1.Token{Id: id, Sha256: Sum(token), Principal: principal, CreatedUnixMs: createdUnixMs, Description: description}
	return t, CheckToken(t)
}

// PrincipalOf is the principal a verified client certificate names: its
// first URI SAN (a SPIFFE id, say) if it has one, else its subject
// common name ("" if it has neither).
func PrincipalOf(cert *x509.Certificate) string {
	if len(cert.URIs) > 0 {
		return cert.URIs[0].String()
	}
	return cert.Subject.CommonName
}

// CheckPrincipal checks a principal name; it returns a *shard.FieldError
// naming field, or nil.
func CheckPrincipal(field, principal string) error {
	return shard.CheckName(field, principal, MaxPrincipalBytes)
}

// CheckRole checks a role's name and grants; it returns a
// *shard.FieldError naming the field (role.grants[2].permission), or nil.
func CheckRole(r *placementv1.Role) error {
	if err := checkRoleName("role.name", r.GetName()); err != nil {
		return err
	}
	if len(r.GetGrants()) > MaxGrantsPerRole {
		return &shard.FieldError{Field: "role.grants", Reason: fmt.Sprintf("has %d grants, more than %d", len(r.GetGrants()), MaxGrantsPerRole)}
	}
	for i, g := range r.GetGrants() {
		field := fmt.Sprintf("role.grants[%d]", i)
		p := Permission(g.GetPermission())
		if !known(p) {
			return &shard.FieldError{Field: field + ".permission", Reason: fmt.Sprintf("%q is not one of %v", g.GetPermission(), Permissions)}
		}
		if p == Admin && g.GetPrefix() != "" {
			return &shard.FieldError{Field: field + ".prefix", Reason: "admin takes no prefix"}
		}
		if err := shard.CheckText(field+".prefix", g.GetPrefix(), MaxPrefixBytes); err != nil {
			return err
		}
	}
	return nil
}

func checkRoleName(field, name string) error {
	if name == "" || len(name) > maxRoleName {
		return &shard.FieldError{Field: field, Reason: fmt.Sprintf("must be 1 to %d characters", maxRoleName)}
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return &shard.FieldError{Field: field, Reason: fmt.Sprintf("%q has %q; use a-z, 0-9, '.', '_', '-'", name, c)}
		}
	}
	return nil
}

// CheckBinding checks a binding's principal and role name (not that the
// role exists: the state decides that).
func CheckBinding(b *placementv1.Binding) error {
	if err := CheckPrincipal("binding.principal", b.GetPrincipal()); err != nil {
		return err
	}
	return checkRoleName("binding.role", b.GetRole())
}

// CheckToken checks a token record.
func CheckToken(t *placementv1.Token) error {
	switch {
	case !validTokenID(t.GetId()):
		return &shard.FieldError{Field: "token.id", Reason: "must be 16 lowercase hex characters"}
	case len(t.GetSha256()) != sha256.Size:
		return &shard.FieldError{Field: "token.sha256", Reason: "must be 32 bytes"}
	}
	if err := CheckPrincipal("token.principal", t.GetPrincipal()); err != nil {
		return err
	}
	return shard.CheckText("token.description", t.GetDescription(), MaxDescription)
}

// Policy is the compiled auth state a node decides calls by. The zero
// Policy (and a nil one) has authentication off. Its methods are safe for
// concurrent use; a Policy never changes.
type Policy struct {
	enabled  bool
	revision uint64
	tokens   map[string]*placementv1.Token
	// grants are each principal's grants, through its bindings.
	grants map[string][]*placementv1.Grant
}

// Compile returns the Policy of st (nil: authentication off).
func Compile(st *placementv1.AuthState) *Policy {
	p := &Policy{enabled: st.GetEnabled(), revision: st.GetRevision(),
		tokens: map[string]*placementv1.Token{}, grants: map[string][]*placementv1.Grant{}}
	for _, t := range st.GetTokens() {
		p.tokens[t.GetId()] = t
	}
	roles := map[string]*placementv1.Role{}
	for _, r := range st.GetRoles() {
		roles[r.GetName()] = r
	}
	for _, b := range st.GetBindings() {
		p.grants[b.GetPrincipal()] = append(p.grants[b.GetPrincipal()], roles[b.GetRole()].GetGrants()...)
	}
	return p
}

// Enabled reports whether calls need credentials and a role.
func (p *Policy) Enabled() bool { return p != nil && p.enabled }

// Revision is the auth state's revision p was compiled from.
func (p *Policy) Revision() uint64 {
	if p == nil {
		return 0
	}
	return p.revision
}

// Authenticate returns the principal token names, or ErrBadToken.
func (p *Policy) Authenticate(token string) (string, error) {
	id, err := ParseToken(token)
	if err != nil || p == nil {
		return "", ErrBadToken
	}
	t := p.tokens[id]
	if t == nil || subtle.ConstantTimeCompare(t.GetSha256(), Sum(token)) != 1 {
		return "", ErrBadToken
	}
	return t.GetPrincipal(), nil
}

// Allows reports whether principal may use perm on resource (a lock's
// resource or a quota key; ignored for Admin). With authentication off
// everything is allowed.
func (p *Policy) Allows(principal string, perm Permission, resource string) bool {
	if !p.Enabled() {
		return true
	}
	for _, g := range p.grants[principal] {
		if Permission(g.GetPermission()) == perm && strings.HasPrefix(resource, g.GetPrefix()) {
			return true
		}
	}
	return false
}

// GrantsAdmin reports whether some binding of st gives a principal the
// admin permission: turning authentication on without one would lock
// every operator out.
func GrantsAdmin(st *placementv1.AuthState) bool {
	p := Compile(st)
	p.enabled = true
	for principal := range p.grants {
		if p.Allows(principal, Admin, "") {
			return true
		}
	}
	return false
}
