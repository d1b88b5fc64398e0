package rpc

import (
	"errors"
	"net/http"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/proto/warden/placement/v1/placementv1connect"
	"github.com/warden-dev/warden/router"
)

// NewStartingHandler serves a node's listener while its cluster starts,
// before the router exists: another node's ReadMeta (fromNode, as cfg's
// PeerTLS or ClusterSecret say) is answered Unavailable with
// StartingHeader set to status() at the time of the call (a node's
// status changes once it starts Raft); every other call Unavailable.
func NewStartingHandler(cfg router.Config, status func() string) http.Handler {
	readMeta := placementv1connect.NodeServiceReadMetaProcedure
	refuse := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if refuse.IsSupported(req) {
			e := connect.NewError(connect.CodeUnavailable, errors.New("the node is starting"))
			if req.URL.Path == readMeta && fromNode(&cfg, req) {
				e.Meta().Set(router.StartingHeader, status())
			}
			_ = refuse.Write(w, req, e)
			return
		}
		http.Error(w, "the node is starting", http.StatusServiceUnavailable)
	})
}
