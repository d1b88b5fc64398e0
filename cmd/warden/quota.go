package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

type quotaCmd struct {
	SetLimit     setLimitCmd     `cmd:"" name:"set-limit" help:"Set a level's limit (and fairness weight)."`
	Reserve      reserveCmd      `cmd:"" help:"Reserve capacity on every level of a key's path."`
	Commit       commitCmd       `cmd:"" help:"Turn a reservation into usage (all of it, or --amount)."`
	Release      unreserveCmd    `cmd:"" help:"Return a reservation's capacity."`
	Query        queryCmd        `cmd:"" help:"Show every level of a key's path."`
	Reservations reservationsCmd `cmd:"" help:"List the open reservations under a key."`
	Ledger       ledgerCmd       `cmd:"" help:"List the ledger events of a key's subtree."`
	ReportUsage  reportCmd       `cmd:"" name:"report-usage" help:"Compare observed usage with committed usage (--correct records a correction)."`
	Unfreeze     unfreezeCmd     `cmd:"" help:"Let a pool that a restore froze reserve again, its counters taken as they are."`
}

func (g *globals) quota() wardenv1connect.QuotaServiceClient {
	return wardenv1connect.NewQuotaServiceClient(g.http, g.base)
}

func printLevel(w io.Writer, l *wardenv1.QuotaLevel) {
	limit := "-"
	if l.GetHasLimit() {
		limit = fmt.Sprint(l.GetLimit())
	}
	fmt.Fprintf(w, "  %-32s limit %-8s committed %-8d reserved %-8d", l.GetKey(), limit, l.GetCommitted(), l.GetReserved())
	if l.GetHasLimit() {
		fmt.Fprintf(w, " remaining %-8d", l.GetRemaining())
	}
	if l.GetExpiredPending() > 0 {
		fmt.Fprintf(w, " expired_pending %d", l.GetExpiredPending())
	}
	fmt.Fprintln(w)
}

type setLimitCmd struct {
	Key    string `arg:""`
	Limit  int64  `arg:""`
	Weight uint32 `help:"Share among siblings under fairness (default 1)."`
}

// Run sends QuotaService.SetLimit.
func (c *setLimitCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.quota().SetLimit(ctx, connect.NewRequest(&wardenv1.SetLimitRequest{Key: c.Key, Limit: c.Limit, Weight: c.Weight}))
	if err != nil {
		return fmt.Errorf("set-limit %s: %w", c.Key, err)
	}
	return g.print(resp.Msg, func(w io.Writer) { printLevel(w, resp.Msg.GetLevel()) })
}

type reserveCmd struct {
	Key           string        `arg:""`
	Amount        int64         `arg:""`
	ReservationID string        `name:"reservation-id" env:"-" help:"Idempotency key; reuse it to retry. Default: a random one, printed."`
	TTL           time.Duration `name:"ttl" help:"How long the reservation holds (default: the shard's, 5m)."`
}

// Run sends QuotaService.Reserve.
func (c *reserveCmd) Run(g *globals) error {
	id := c.ReservationID
	if id == "" {
		b := make([]byte, 12)
		_, _ = rand.Read(b)
		id = hex.EncodeToString(b)
	}
	req := &wardenv1.ReserveRequest{Key: c.Key, Amount: c.Amount, ReservationId: id}
	if c.TTL != 0 {
		req.Ttl = durationpb.New(c.TTL)
	}
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.quota().Reserve(ctx, connect.NewRequest(req))
	if err != nil {
		return fmt.Errorf("reserve %s (reservation id %s): %w", c.Key, id, err)
	}
	return g.print(resp.Msg, func(w io.Writer) {
		fmt.Fprintf(w, "reserved %d on %s\n  reservation_id %s\n  remaining      %d\n  expires_at     %s\n", c.Amount, c.Key, id, resp.Msg.GetRemaining(), when(resp.Msg.GetExpiresAt()))
	})
}

type commitCmd struct {
	Key           string `arg:""`
	ReservationID string `arg:"" name:"reservation-id"`
	Amount        int64  `help:"Commit this much (the rest returns); default all."`
}

// Run sends QuotaService.Commit.
func (c *commitCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.quota().Commit(ctx, connect.NewRequest(&wardenv1.CommitRequest{Key: c.Key, ReservationId: c.ReservationID, Amount: c.Amount}))
	if err != nil {
		return fmt.Errorf("commit %s %s: %w", c.Key, c.ReservationID, err)
	}
	return g.print(resp.Msg, func(w io.Writer) { fmt.Fprintf(w, "committed %d on %s\n", resp.Msg.GetCommitted(), c.Key) })
}

type unreserveCmd struct {
	Key           string `arg:""`
	ReservationID string `arg:"" name:"reservation-id"`
}

// Run sends QuotaService.Release.
func (c *unreserveCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.quota().Release(ctx, connect.NewRequest(&wardenv1.QuotaServiceReleaseRequest{Key: c.Key, ReservationId: c.ReservationID}))
	if err != nil {
		return fmt.Errorf("release %s %s: %w", c.Key, c.ReservationID, err)
	}
	return g.print(resp.Msg, func(w io.Writer) {
		if resp.Msg.GetReleased() {
			fmt.Fprintf(w, "released %s\n", c.ReservationID)
		} else {
			fmt.Fprintf(w, "not released: %s is unknown, expired or released already\n", c.ReservationID)
		}
	})
}

type queryCmd struct {
	Key   string `arg:""`
	Stale bool   `help:"Read this node's replica (possibly behind) instead of through the leader."`
}

// Run sends QuotaService.Query.
func (c *queryCmd) Run(g *globals) error {
	req := &wardenv1.QueryRequest{Key: c.Key}
	if c.Stale {
		req.Consistency = wardenv1.Consistency_CONSISTENCY_STALE
	}
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.quota().Query(ctx, connect.NewRequest(req))
	if err != nil {
		return fmt.Errorf("query %s: %w", c.Key, err)
	}
	return g.print(resp.Msg, func(w io.Writer) {
		fmt.Fprintf(w, "%s as of %s, ledger_seq %d\n", c.Key, resp.Msg.GetAsOf().AsTime().Format(time.RFC3339Nano), resp.Msg.GetLedgerSeq())
		if resp.Msg.GetFrozen() {
			fmt.Fprintln(w, "  frozen since a restore: Reserve is refused until 'report-usage --correct' of the pool or 'unfreeze'")
		}
		for _, l := range resp.Msg.GetLevels() {
			printLevel(w, l)
		}
	})
}

type reservationsCmd struct {
	Key       string `arg:""`
	PageSize  uint32 `name:"page-size" help:"At most this many (default 100)."`
	PageToken string `name:"page-token" help:"Continue after the page that printed this token."`
}

// Run sends QuotaService.ListReservations.
func (c *reservationsCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.quota().ListReservations(ctx, connect.NewRequest(&wardenv1.ListReservationsRequest{Key: c.Key, PageSize: c.PageSize, PageToken: c.PageToken}))
	if err != nil {
		return fmt.Errorf("reservations %s: %w", c.Key, err)
	}
	return g.print(resp.Msg, func(w io.Writer) {
		for _, r := range resp.Msg.GetReservations() {
			fmt.Fprintf(w, "%-32s %-26s %8d  until %s\n", r.GetKey(), r.GetReservationId(), r.GetAmount(), when(r.GetExpiresAt()))
		}
		if t := resp.Msg.GetNextPageToken(); t != "" {
			fmt.Fprintf(w, "more: --page-token %s\n", t)
		}
	})
}

type ledgerCmd struct {
	Key      string `arg:""`
	AfterSeq uint64 `name:"after-seq" help:"Only events after this sequence number."`
	Limit    uint32 `help:"At most this many (default 100)."`
}

// Run sends QuotaService.ListLedger.
func (c *ledgerCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.quota().ListLedger(ctx, connect.NewRequest(&wardenv1.ListLedgerRequest{Key: c.Key, AfterSeq: c.AfterSeq, Limit: c.Limit}))
	if err != nil {
		return fmt.Errorf("ledger %s: %w", c.Key, err)
	}
	return g.print(resp.Msg, func(w io.Writer) {
		for _, k := range resp.Msg.GetCheckpoints() {
			fmt.Fprintf(w, "checkpoint through %d: %s limit %d committed %d\n", k.GetThroughSeq(), k.GetKey(), k.GetLimit(), k.GetCommitted())
		}
		for _, e := range resp.Msg.GetEvents() {
			detail := fmt.Sprintf("amount %d", e.GetAmount())
			switch e.GetKind() {
			case "SET_LIMIT":
				detail = fmt.Sprintf("limit %d", e.GetLimit())
			case "COMMIT":
				detail += fmt.Sprintf(", returned %d", e.GetReturned())
			}
			fmt.Fprintf(w, "%6d  %s  %-10s %-32s %-20s %s\n", e.GetSeq(), e.GetAt().AsTime().Format(time.RFC3339), e.GetKind(), e.GetKey(), e.GetReservationId()+e.GetReportId(), detail)
		}
	})
}

type reportCmd struct {
	Key      string `arg:""`
	Observed int64  `arg:""`
	ReportID string `name:"report-id" help:"Idempotency key of a correction (required with --correct)."`
	Correct  bool   `help:"Record a correction of committed usage to the observed value, as of --observed-seq (once per report id)."`
	// ObservedSeq is a pointer: absent means now (a measurement only).
	ObservedSeq *uint64 `name:"observed-seq" placeholder:"SEQ" help:"The ledger_seq that 'quota query' printed for the totals the observation corresponds to (required with --correct): commits recorded after it are kept."`
}

// Run sends QuotaService.ReportUsage.
func (c *reportCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.quota().ReportUsage(ctx, connect.NewRequest(&wardenv1.ReportUsageRequest{Key: c.Key, Observed: c.Observed, ReportId: c.ReportID, Correct: c.Correct, ObservedSeq: c.ObservedSeq}))
	if err != nil {
		return fmt.Errorf("report-usage %s: %w", c.Key, err)
	}
	return g.print(resp.Msg, func(w io.Writer) {
		fmt.Fprintf(w, "drift %d (observed − committed)\n", resp.Msg.GetDrift())
		printLevel(w, resp.Msg.GetLevel())
	})
}

type unfreezeCmd struct {
	Pool string `arg:""`
}

// Run sends QuotaService.Unfreeze.
func (c *unfreezeCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.quota().Unfreeze(ctx, connect.NewRequest(&wardenv1.UnfreezeRequest{Pool: c.Pool}))
	if err != nil {
		return fmt.Errorf("unfreeze %s: %w", c.Pool, err)
	}
	return g.print(resp.Msg, func(w io.Writer) {
		if resp.Msg.GetUnfrozen() {
			fmt.Fprintf(w, "%s unfrozen\n", c.Pool)
		} else {
			fmt.Fprintf(w, "%s was not frozen\n", c.Pool)
		}
	})
}
