package router

import (
	"context"
	"errors"
	"net/http"

	"connectrpc.com/connect"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	"github.com/warden-dev/warden/proto/warden/placement/v1/placementv1connect"
)

// StartingHeader is the header with which a node whose cluster has not
// started yet (NewStartingHandler) answers another node's ReadMeta: how
// it starts (server.StartMode's name, and a restore's id after a space),
// for the identity check of a node that may not start Raft before the
// cluster confirms it.
const StartingHeader = "Warden-Starting"

// NewStartingHandler serves a node's listener while its cluster starts,
// before the router exists: another node's ReadMeta (fromNode, as cfg's
// PeerTLS or ClusterSecret say) is answered Unavailable with
// StartingHeader set to status() at the time of the call (a node's
// status changes once it starts Raft); every other call Unavailable.
func NewStartingHandler(cfg Config, status func() string) http.Handler {
	readMeta := placementv1connect.NodeServiceReadMetaProcedure
	refuse := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if refuse.IsSupported(req) {
			e := connect.NewError(connect.CodeUnavailable, errors.New("the node is starting"))
			if req.URL.Path == readMeta && fromNode(&cfg, req) {
				e.Meta().Set(StartingHeader, status())
			}
			_ = refuse.Write(w, req, e)
			return
		}
		http.Error(w, "the node is starting", http.StatusServiceUnavailable)
	})
}

// ProbeStart asks the node at addr for the placement state: it returns
// the state of a node that serves, or the StartingHeader of one still
// starting (NewStartingHandler), or the error of one that answers
// neither (unreachable, or a binary without the header).
func (p *Peers) ProbeStart(ctx context.Context, addr string) (*placementv1.State, string, error) {
	resp, err := p.get(addr).node.ReadMeta(ctx, connect.NewRequest(&placementv1.ReadMetaRequest{}))
	if err == nil {
		return resp.Msg.GetState(), "", nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		if s := ce.Meta().Get(StartingHeader); s != "" {
			return nil, s, nil
		}
	}
	return nil, "", err
}
