package server

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"github.com/warden-dev/warden/shard"
)

// peersFile, in a node's data directory, lists the Connect addresses of
// the nodes of the last placement map the process routed by: a node that
// restarts asks them whether the cluster removed it while it was away
// (probeIdentity), when the initial members it was started with are gone.
const peersFile = "peers.json"

// rememberPeers writes the nodes of the router's map to each local node's
// peersFile when they changed since the last write (atomically: a
// rename). A failure is logged; the file is a hint.
func (c *Cluster) rememberPeers() {
	var addrs []string
	for _, n := range c.Router.Map().State().GetNodes() {
		addrs = append(addrs, n.GetListenAddr())
	}
	slices.Sort(addrs)
	if len(addrs) == 0 || slices.Equal(addrs, c.peers) {
		return
	}
	b, err := json.Marshal(addrs)
	if err != nil {
		return
	}
	for _, spec := range c.cfg.Nodes {
		if err := shard.WriteFileDurably(spec.DataDir, peersFile, b); err != nil {
			slog.Warn("remembering the cluster's nodes", "err", err)
			return
		}
	}
	c.peers = addrs
}

// loadPeers returns the addresses dir's peersFile lists (none when it is
// missing or unreadable: it is a hint).
func loadPeers(dir string) []string {
	b, err := os.ReadFile(filepath.Join(dir, peersFile))
	if err != nil {
		return nil
	}
	var addrs []string
	if json.Unmarshal(b, &addrs) != nil {
		return nil
	}
	return addrs
}
