// Package server assembles a Warden node from its config: the
// composition root. It decides how each node starts (StartMode: a new
// cluster, a join, a restart from a data directory), opens the nodes'
// identities and NodeHosts, bootstraps or joins the placement group,
// makes the clients of the other nodes and the router over them, runs
// the map refresh, the node agents and the operator driver, and serves
// the HTTP surface (the Connect services, health, reflection, /metrics,
// and pprof when asked). cmd/wardend turns its flags into a Config and
// calls Start; the tests start dev clusters with StartDev.
//
// It may import every server package (router, placement, shard); none of
// them imports it.
package server
