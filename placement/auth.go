package placement

import (
	"errors"
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/warden-dev/warden/auth"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
)

// ErrAuthBootstrapped is the Error of an AuthCmd bootstrap on a cluster
// whose auth state was set before: every initial member proposes the
// bootstrap file it was given, and the first one to commit wins.
var ErrAuthBootstrapped = errors.New("auth is bootstrapped already")

// applyAuth applies an auth change to st's auth state and raises its
// revision. A change that would leave authentication on with no binding
// that grants admin is refused: no one could undo it.
func applyAuth(st *placementv1.State, c *placementv1.AuthCmd) error {
	a := st.GetAuth()
	if a == nil {
		a = &placementv1.AuthState{}
	}
	switch op := c.GetOp().(type) {
	case *placementv1.AuthCmd_Bootstrap:
		if a.GetRevision() != 0 {
			return ErrAuthBootstrapped
		}
		if err := auth.CheckState(op.Bootstrap); err != nil {
			return err
		}
		a = proto.CloneOf(op.Bootstrap)
		a.Revision = 0 // the state's, not the proposer's: raised to 1 below
	case *placementv1.AuthCmd_SetEnabled:
		a.Enabled = op.SetEnabled
	case *placementv1.AuthCmd_PutRole:
		if err := auth.CheckRole(op.PutRole); err != nil {
			return err
		}
		i := slices.IndexFunc(a.Roles, func(r *placementv1.Role) bool { return r.GetName() == op.PutRole.GetName() })
		switch {
		case i >= 0:
			a.Roles[i] = op.PutRole
		case len(a.Roles) >= auth.MaxRoles:
			return fmt.Errorf("roles: there are %d already, the most there may be", len(a.Roles))
		default:
			a.Roles = append(a.Roles, op.PutRole)
		}
	case *placementv1.AuthCmd_DeleteRole:
		i := slices.IndexFunc(a.Roles, func(r *placementv1.Role) bool { return r.GetName() == op.DeleteRole })
		if i < 0 {
			return fmt.Errorf("role: %q does not exist", op.DeleteRole)
		}
		if slices.ContainsFunc(a.Bindings, func(b *placementv1.Binding) bool { return b.GetRole() == op.DeleteRole }) {
			return fmt.Errorf("role: %q is bound to principals; unbind them first", op.DeleteRole)
		}
		a.Roles = slices.Delete(a.Roles, i, i+1)
	case *placementv1.AuthCmd_Bind:
		if err := auth.CheckBinding(op.Bind); err != nil {
			return err
		}
		if !slices.ContainsFunc(a.Roles, func(r *placementv1.Role) bool { return r.GetName() == op.Bind.GetRole() }) {
			return fmt.Errorf("binding.role: role %q does not exist", op.Bind.GetRole())
		}
		if !slices.ContainsFunc(a.Bindings, func(b *placementv1.Binding) bool { return proto.Equal(b, op.Bind) }) {
			if len(a.Bindings) >= auth.MaxBindings {
				return fmt.Errorf("bindings: there are %d already, the most there may be", len(a.Bindings))
			}
			a.Bindings = append(a.Bindings, op.Bind)
		}
	case *placementv1.AuthCmd_Unbind:
		a.Bindings = slices.DeleteFunc(a.Bindings, func(b *placementv1.Binding) bool { return proto.Equal(b, op.Unbind) })
	case *placementv1.AuthCmd_CreateToken:
		if err := auth.CheckToken(op.CreateToken); err != nil {
			return err
		}
		if slices.ContainsFunc(a.Tokens, func(t *placementv1.Token) bool { return t.GetId() == op.CreateToken.GetId() }) {
			return errors.New("token.id: a token has this id already")
		}
		if len(a.Tokens) >= auth.MaxTokens {
			return fmt.Errorf("tokens: there are %d already, the most there may be", len(a.Tokens))
		}
		a.Tokens = append(a.Tokens, op.CreateToken)
	case *placementv1.AuthCmd_RevokeToken:
		i := slices.IndexFunc(a.Tokens, func(t *placementv1.Token) bool { return t.GetId() == op.RevokeToken })
		if i < 0 {
			return fmt.Errorf("token: %q does not exist", op.RevokeToken)
		}
		a.Tokens = slices.Delete(a.Tokens, i, i+1)
	default:
		return errors.New("auth: missing or unknown change")
	}
	if a.GetEnabled() && !auth.GrantsAdmin(a) {
		return errors.New("auth: no binding would grant admin with authentication on, so no one could manage the cluster")
	}
	a.Revision++
	st.Auth = a
	return nil
}
