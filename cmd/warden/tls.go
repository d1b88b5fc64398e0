package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/warden-dev/warden/tlsconfig"
)

type tlsCmd struct {
	Local tlsLocalCmd `cmd:"" help:"Write throwaway TLS material for a test or local cluster: a client CA, a distinct peer CA, and each node's certificates."`
}

// tlsLocalCmd writes the TLS material of a cluster of --nodes nodes on
// --host, for tests and deploy/local's secure start. Its CAs' keys are
// not kept: nothing can be issued later, and production certificates
// come from the operator's own CAs.
type tlsLocalCmd struct {
	Dir      string        `required:"" placeholder:"DIR" help:"Directory to write into (created; files there are replaced)."`
	Nodes    int           `default:"3" help:"Node ids 1..N get certificates."`
	Host     []string      `default:"127.0.0.1" help:"Hosts (IP addresses or DNS names) the nodes' certificates name: where clients and the Raft transport reach them."`
	ValidFor time.Duration `name:"valid-for" default:"720h" help:"How long the certificates are valid."`
	Client   string        `default:"client" help:"Common name (the principal) of the client certificate."`
}

// Run writes, in --dir: ca.pem (the client CA: it signed the nodes'
// client-API certificates and the client's), peer-ca.pem, for each node
// N node-N.pem/node-N-key.pem (client API) and node-N-peer.pem/
// node-N-peer-key.pem, and client.pem/client-key.pem.
func (c *tlsLocalCmd) Run(g *globals) error {
	if c.Nodes < 1 {
		return errors.New("--nodes: at least 1")
	}
	for _, h := range c.Host {
		if h == "" {
			return errors.New("--host: an empty host")
		}
	}
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return fmt.Errorf("--dir: %w", err)
	}
	clientCA, err := tlsconfig.NewCA("warden local client CA", c.ValidFor)
	if err != nil {
		return err
	}
	peerCA, err := tlsconfig.NewCA("warden local peer CA", c.ValidFor)
	if err != nil {
		return err
	}
	notAfter := time.Now().Add(c.ValidFor)
	files := map[string][]byte{"ca.pem": clientCA.PEM, "peer-ca.pem": peerCA.PEM}
	issue := func(ca *tlsconfig.CA, name string, spec tlsconfig.CertSpec) error {
		spec.NotAfter = notAfter
		cert, key, err := ca.Issue(spec)
		if err != nil {
			return err
		}
		files[name+".pem"], files[name+"-key.pem"] = cert, key
		return nil
	}
	for id := uint64(1); id <= uint64(c.Nodes); id++ {
		name := fmt.Sprintf("node-%d", id)
		if err := issue(clientCA, name, tlsconfig.CertSpec{CommonName: name, Names: c.Host, Server: true}); err != nil {
			return err
		}
		peerNames := append([]string{tlsconfig.NodeName(id)}, c.Host...)
		if err := issue(peerCA, name+"-peer", tlsconfig.CertSpec{CommonName: name, Names: peerNames, Server: true, Client: true}); err != nil {
			return err
		}
	}
	if err := issue(clientCA, "client", tlsconfig.CertSpec{CommonName: c.Client, Client: true}); err != nil {
		return err
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(c.Dir, name), b, 0o600); err != nil {
			return err
		}
	}
	fmt.Fprintf(g.out, "wrote %d files to %s (client CA ca.pem, peer CA peer-ca.pem, %d nodes, client %q)\n", len(files), c.Dir, c.Nodes, c.Client)
	return nil
}
