package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/auth"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

func (g *globals) auth() wardenv1connect.AuthServiceClient {
	return wardenv1connect.NewAuthServiceClient(g.http, g.base)
}

type authCmd struct {
	Status  authStatusCmd  `cmd:"" help:"Show whether authentication is on, the roles, bindings and tokens (ids only)."`
	Enable  authEnableCmd  `cmd:"" help:"Turn authentication on (needs TLS and a binding that grants admin)."`
	Disable authDisableCmd `cmd:"" help:"Turn authentication off: every caller may do everything."`
	Role    authRoleCmd    `cmd:"" help:"Create, replace or delete a role."`
	Bind    authBindCmd    `cmd:"" help:"Give a principal a role."`
	Unbind  authUnbindCmd  `cmd:"" help:"Take a role from a principal."`
	Token   authTokenCmd   `cmd:"" help:"Create, list and revoke bearer tokens."`
}

type authStatusCmd struct{}

// Run sends AuthService.GetAuth.
func (*authStatusCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.auth().GetAuth(ctx, connect.NewRequest(&wardenv1.GetAuthRequest{}))
	if err != nil {
		return fmt.Errorf("auth status: %w", err)
	}
	m := resp.Msg
	return g.print(m, func(w io.Writer) {
		state := "off"
		if m.GetEnabled() {
			state = "on"
		}
		fmt.Fprintf(w, "authentication %s (revision %d)\n", state, m.GetRevision())
		fmt.Fprintln(w, "roles:")
		for _, r := range m.GetRoles() {
			var grants []string
			for _, gr := range r.GetGrants() {
				grants = append(grants, grantText(gr))
			}
			fmt.Fprintf(w, "  %-16s %s\n", r.GetName(), strings.Join(grants, " "))
		}
		fmt.Fprintln(w, "bindings:")
		for _, b := range m.GetBindings() {
			fmt.Fprintf(w, "  %-32s %s\n", b.GetPrincipal(), b.GetRole())
		}
		printTokens(w, m.GetTokens())
	})
}

func printTokens(w io.Writer, tokens []*wardenv1.AuthToken) {
	fmt.Fprintln(w, "tokens:")
	for _, t := range tokens {
		fmt.Fprintf(w, "  %s  %-24s %s  %s\n", t.GetId(), t.GetPrincipal(), time.UnixMilli(t.GetCreatedUnixMs()).UTC().Format(time.RFC3339), t.GetDescription())
	}
}

// grantText is a grant as role put takes it: permission[:prefix].
func grantText(g *wardenv1.AuthGrant) string {
	if g.GetPrefix() == "" {
		return g.GetPermission()
	}
	return g.GetPermission() + ":" + g.GetPrefix()
}

type authEnableCmd struct{}

// Run sends AuthService.SetEnabled(true).
func (*authEnableCmd) Run(g *globals) error { return setEnabled(g, true) }

type authDisableCmd struct{}

// Run sends AuthService.SetEnabled(false).
func (*authDisableCmd) Run(g *globals) error { return setEnabled(g, false) }

func setEnabled(g *globals, on bool) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.auth().SetEnabled(ctx, connect.NewRequest(&wardenv1.SetEnabledRequest{Enabled: on}))
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	return g.print(resp.Msg, func(w io.Writer) { fmt.Fprintln(w, "ok") })
}

type authRoleCmd struct {
	Put    authRolePutCmd    `cmd:"" help:"Create or replace a role: warden auth role put orders lock:orders/ read:orders/"`
	Delete authRoleDeleteCmd `cmd:"" help:"Delete a role no binding names."`
}

type authRolePutCmd struct {
	Name   string   `arg:"" help:"Role name (a-z, 0-9, '.', '_', '-')."`
	Grants []string `arg:"" optional:"" help:"Grants, each permission[:prefix]; permissions: lock, quota.use, quota.admin, admin, read."`
}

// Run sends AuthService.PutRole.
func (c *authRolePutCmd) Run(g *globals) error {
	role := &wardenv1.AuthRole{Name: c.Name}
	for _, s := range c.Grants {
		perm, prefix, _ := strings.Cut(s, ":")
		role.Grants = append(role.Grants, &wardenv1.AuthGrant{Permission: perm, Prefix: prefix})
	}
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.auth().PutRole(ctx, connect.NewRequest(&wardenv1.PutRoleRequest{Role: role}))
	if err != nil {
		return fmt.Errorf("auth role put: %w", err)
	}
	return g.print(resp.Msg, func(w io.Writer) { fmt.Fprintln(w, "ok") })
}

type authRoleDeleteCmd struct {
	Name string `arg:""`
}

// Run sends AuthService.DeleteRole.
func (c *authRoleDeleteCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.auth().DeleteRole(ctx, connect.NewRequest(&wardenv1.DeleteRoleRequest{Name: c.Name}))
	if err != nil {
		return fmt.Errorf("auth role delete: %w", err)
	}
	return g.print(resp.Msg, func(w io.Writer) { fmt.Fprintln(w, "ok") })
}

type authBindCmd struct {
	Principal string `arg:"" help:"A client certificate's URI SAN or common name, or a token's principal."`
	Role      string `arg:""`
}

// Run sends AuthService.Bind.
func (c *authBindCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.auth().Bind(ctx, connect.NewRequest(&wardenv1.BindRequest{Binding: &wardenv1.AuthBinding{Principal: c.Principal, Role: c.Role}}))
	if err != nil {
		return fmt.Errorf("auth bind: %w", err)
	}
	return g.print(resp.Msg, func(w io.Writer) { fmt.Fprintln(w, "ok") })
}

type authUnbindCmd struct {
	Principal string `arg:""`
	Role      string `arg:""`
}

// Run sends AuthService.Unbind.
func (c *authUnbindCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.auth().Unbind(ctx, connect.NewRequest(&wardenv1.UnbindRequest{Binding: &wardenv1.AuthBinding{Principal: c.Principal, Role: c.Role}}))
	if err != nil {
		return fmt.Errorf("auth unbind: %w", err)
	}
	return g.print(resp.Msg, func(w io.Writer) { fmt.Fprintln(w, "ok") })
}

type authTokenCmd struct {
	Create   authTokenCreateCmd   `cmd:"" help:"Create a token for a principal; it is shown only now."`
	List     authTokenListCmd     `cmd:"" help:"List the tokens (ids and principals, never the tokens)."`
	Revoke   authTokenRevokeCmd   `cmd:"" help:"Revoke a token by id; every node refuses it within 2 s."`
	Generate authTokenGenerateCmd `cmd:"" help:"Make a new token offline, for an --auth-bootstrap file (no cluster is called)."`
}

type authTokenCreateCmd struct {
	Principal   string `arg:""`
	Description string `help:"Free text shown in listings."`
	Out         string `placeholder:"FILE" help:"Write the token to FILE (mode 0600) instead of stdout."`
}

// Run sends AuthService.CreateToken.
func (c *authTokenCreateCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.auth().CreateToken(ctx, connect.NewRequest(&wardenv1.CreateTokenRequest{Principal: c.Principal, Description: c.Description}))
	if err != nil {
		return fmt.Errorf("auth token create: %w", err)
	}
	id := resp.Msg.GetId()
	if c.Out != "" {
		if err := writeToken(c.Out, resp.Msg.GetToken()); err != nil {
			return err
		}
		return g.print(resp.Msg, func(w io.Writer) {
			fmt.Fprintf(w, "token %s written to %s (revoke with: warden auth token revoke %s)\n", id, c.Out, id)
		})
	}
	// The token alone on stdout, for a script; its id for the operator.
	fmt.Fprintf(os.Stderr, "token id %s (revoke with: warden auth token revoke %s); the token is shown only now\n", id, id)
	return g.print(resp.Msg, func(w io.Writer) { fmt.Fprintln(w, resp.Msg.GetToken()) })
}

// writeToken writes token alone on one line to path, readable by its
// owner only.
func writeToken(path, token string) error {
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	return nil
}

type authTokenListCmd struct{}

// Run sends AuthService.GetAuth and prints its tokens.
func (*authTokenListCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.auth().GetAuth(ctx, connect.NewRequest(&wardenv1.GetAuthRequest{}))
	if err != nil {
		return fmt.Errorf("auth token list: %w", err)
	}
	return g.print(&wardenv1.GetAuthResponse{Tokens: resp.Msg.GetTokens()}, func(w io.Writer) { printTokens(w, resp.Msg.GetTokens()) })
}

type authTokenRevokeCmd struct {
	ID string `arg:"" name:"id" help:"The token's id (the part after wdn1.)."`
}

// Run sends AuthService.RevokeToken.
func (c *authTokenRevokeCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.auth().RevokeToken(ctx, connect.NewRequest(&wardenv1.RevokeTokenRequest{Id: c.ID}))
	if err != nil {
		return fmt.Errorf("auth token revoke: %w", err)
	}
	return g.print(resp.Msg, func(w io.Writer) { fmt.Fprintln(w, "ok") })
}

type authTokenGenerateCmd struct {
	Out string `placeholder:"FILE" help:"Write the token to FILE (mode 0600) instead of stdout."`
}

// Run prints (or writes) a new token; only its id and hash reach a
// cluster, through a bootstrap file that names FILE.
func (c *authTokenGenerateCmd) Run(g *globals) error {
	token, _ := auth.NewToken()
	if c.Out != "" {
		return writeToken(c.Out, token)
	}
	_, err := fmt.Fprintln(g.out, token)
	return err
}
