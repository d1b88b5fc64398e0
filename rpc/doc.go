// Package rpc is Warden's API layer: the Connect handlers of the client
// services (LockService, QuotaService, AdminService, AuthService) and of
// the node-to-node NodeService, and the HTTP surface around them
// (NewHandler: authentication before a body is read (guard), the
// interceptor chain that authorizes, times, counts, audits and maps
// errors to Connect codes through one table (classify), JSON codecs,
// health and readiness, reflection, /metrics, the dashboard). Requests
// are validated here and handed to the routing core, package router;
// a call about a key another node leads is forwarded there (forward,
// over router.Router.Forward). Only the composition root, package
// server, imports it (.ci/check-imports).
package rpc
