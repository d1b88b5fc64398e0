package rpc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/auth"
	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/router"
)

// AuthServer implements AuthService over the placement group, where the
// auth state lives. The authorizer interceptor has checked admin before
// any method runs.
type AuthServer struct{ r *node }

var _ wardenv1connect.AuthServiceHandler = (*AuthServer)(nil)

// GetAuth implements AuthService.GetAuth.
func (s *AuthServer) GetAuth(ctx context.Context, _ *connect.Request[wardenv1.GetAuthRequest]) (*connect.Response[wardenv1.GetAuthResponse], error) {
	st, err := s.r.ops.Meta().Read(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", router.ErrNoLeader, err)
	}
	a := st.GetAuth()
	out := &wardenv1.GetAuthResponse{Enabled: a.GetEnabled(), Revision: a.GetRevision()}
	for _, r := range a.GetRoles() {
		out.Roles = append(out.Roles, publicRole(r))
	}
	for _, b := range a.GetBindings() {
		out.Bindings = append(out.Bindings, &wardenv1.AuthBinding{Principal: b.GetPrincipal(), Role: b.GetRole()})
	}
	for _, t := range a.GetTokens() {
		out.Tokens = append(out.Tokens, &wardenv1.AuthToken{Id: t.GetId(), Principal: t.GetPrincipal(), CreatedUnixMs: t.GetCreatedUnixMs(), Description: t.GetDescription()})
	}
	return connect.NewResponse(out), nil
}

// SetEnabled implements AuthService.SetEnabled.
func (s *AuthServer) SetEnabled(ctx context.Context, req *connect.Request[wardenv1.SetEnabledRequest]) (*connect.Response[wardenv1.SetEnabledResponse], error) {
	if req.Msg.GetEnabled() && !s.r.Config().ClientTLS {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("enabled: authentication needs TLS on the client API (wardend --tls-cert), or tokens would travel in clear"))
	}
	return change(ctx, s.r, &placementv1.AuthCmd{Op: &placementv1.AuthCmd_SetEnabled{SetEnabled: req.Msg.GetEnabled()}}, &wardenv1.SetEnabledResponse{})
}

// PutRole implements AuthService.PutRole.
func (s *AuthServer) PutRole(ctx context.Context, req *connect.Request[wardenv1.PutRoleRequest]) (*connect.Response[wardenv1.PutRoleResponse], error) {
	role := &placementv1.Role{Name: req.Msg.GetRole().GetName()}
	for _, g := range req.Msg.GetRole().GetGrants() {
		role.Grants = append(role.Grants, &placementv1.Grant{Permission: g.GetPermission(), Prefix: g.GetPrefix()})
	}
	if err := auth.CheckRole(role); err != nil {
		return nil, err
	}
	return change(ctx, s.r, &placementv1.AuthCmd{Op: &placementv1.AuthCmd_PutRole{PutRole: role}}, &wardenv1.PutRoleResponse{})
}

// DeleteRole implements AuthService.DeleteRole.
func (s *AuthServer) DeleteRole(ctx context.Context, req *connect.Request[wardenv1.DeleteRoleRequest]) (*connect.Response[wardenv1.DeleteRoleResponse], error) {
	return change(ctx, s.r, &placementv1.AuthCmd{Op: &placementv1.AuthCmd_DeleteRole{DeleteRole: req.Msg.GetName()}}, &wardenv1.DeleteRoleResponse{})
}

// Bind implements AuthService.Bind.
func (s *AuthServer) Bind(ctx context.Context, req *connect.Request[wardenv1.BindRequest]) (*connect.Response[wardenv1.BindResponse], error) {
	b := privateBinding(req.Msg.GetBinding())
	if err := auth.CheckBinding(b); err != nil {
		return nil, err
	}
	return change(ctx, s.r, &placementv1.AuthCmd{Op: &placementv1.AuthCmd_Bind{Bind: b}}, &wardenv1.BindResponse{})
}

// Unbind implements AuthService.Unbind.
func (s *AuthServer) Unbind(ctx context.Context, req *connect.Request[wardenv1.UnbindRequest]) (*connect.Response[wardenv1.UnbindResponse], error) {
	return change(ctx, s.r, &placementv1.AuthCmd{Op: &placementv1.AuthCmd_Unbind{Unbind: privateBinding(req.Msg.GetBinding())}}, &wardenv1.UnbindResponse{})
}

// CreateToken implements AuthService.CreateToken. The token is made
// here (Apply has no randomness) and only its hash is proposed.
func (s *AuthServer) CreateToken(ctx context.Context, req *connect.Request[wardenv1.CreateTokenRequest]) (*connect.Response[wardenv1.CreateTokenResponse], error) {
	token, id := auth.NewToken()
	rec, err := auth.TokenRecord(token, req.Msg.GetPrincipal(), req.Msg.GetDescription(), time.Now().UnixMilli())
	if err != nil {
		return nil, err
	}
	return change(ctx, s.r, &placementv1.AuthCmd{Op: &placementv1.AuthCmd_CreateToken{CreateToken: rec}}, &wardenv1.CreateTokenResponse{Token: token, Id: id})
}

// RevokeToken implements AuthService.RevokeToken.
func (s *AuthServer) RevokeToken(ctx context.Context, req *connect.Request[wardenv1.RevokeTokenRequest]) (*connect.Response[wardenv1.RevokeTokenResponse], error) {
	return change(ctx, s.r, &placementv1.AuthCmd{Op: &placementv1.AuthCmd_RevokeToken{RevokeToken: req.Msg.GetId()}}, &wardenv1.RevokeTokenResponse{})
}

// change commits an auth change and answers out; this node decides by
// the new state at once, the others within their next map read.
func change[Resp any](ctx context.Context, r *node, op *placementv1.AuthCmd, out *Resp) (*connect.Response[Resp], error) {
	_, err := r.ops.Meta().Propose(ctx, &placementv1.Command{Command: &placementv1.Command_Auth{Auth: op}})
	var refused *placement.RefusedError
	switch {
	case errors.As(err, &refused):
		// The reason without the "placement:" prefix: the caller changed
		// auth, not placement.
		return nil, refusedToConnect(refused, errors.New(refused.Reason))
	case errors.Is(err, placement.ErrMetaVersion):
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("%w: every node must run a binary that knows auth first", err))
	case err != nil:
		return nil, fmt.Errorf("%w: %v", router.ErrOutcomeUnknown, err)
	}
	if err := r.ops.RefreshMap(ctx); err != nil {
		r.Config().Logger.Debug("placement map refresh", "err", err)
	}
	return connect.NewResponse(out), nil
}

func publicRole(r *placementv1.Role) *wardenv1.AuthRole {
	out := &wardenv1.AuthRole{Name: r.GetName()}
	for _, g := range r.GetGrants() {
		out.Grants = append(out.Grants, &wardenv1.AuthGrant{Permission: g.GetPermission(), Prefix: g.GetPrefix()})
	}
	return out
}

func privateBinding(b *wardenv1.AuthBinding) *placementv1.Binding {
	return &placementv1.Binding{Principal: b.GetPrincipal(), Role: b.GetRole()}
}
