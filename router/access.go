package router

import "github.com/warden-dev/warden/placement"

// The router's parts the API layer (package rpc) reads while the seam
// between them narrows (issue 42): each is shared, never replaced after
// New, and safe for concurrent use as its own type documents.

// Config returns the router's configuration, defaults applied.
func (r *Router) Config() *Config { return &r.cfg }

// Nodes returns the local nodes.
func (r *Router) Nodes() []LocalNode { return r.nodes }

// Meta returns the client of the placement group.
func (r *Router) Meta() placement.MetaClient { return r.meta }

// Peers returns the clients of the other nodes.
func (r *Router) Peers() *Peers { return r.peers }

// Operators returns the driver of splits, moves and jobs.
func (r *Router) Operators() *placement.Operators { return r.ops }

// Waits returns the registry of waiting Acquires.
func (r *Router) Waits() *WaitRegistry { return r.waits }

// Acquires returns the estimate of the busiest resources' Acquire rates.
func (r *Router) Acquires() *RateTracker { return r.acquires }
