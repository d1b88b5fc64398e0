package fence_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/warden-dev/warden/client/fence"
	"github.com/warden-dev/warden/placement"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/rpc"
	"github.com/warden-dev/warden/server"
)

func TestMain(m *testing.M) {
	if addr := os.Getenv("WARDEN_ZOMBIE_ADDR"); addr != "" {
		os.Exit(zombie(addr, os.Getenv("WARDEN_ZOMBIE_DSN")))
	}
	placement.RouteRaftLogs(slog.LevelError + 4)
	goleak.VerifyTestMain(m)
}

const protected = "orders/1"

// zombie is process A of TestZombieWriteRefused. It acquires the lock,
// connects to the database, reports its token and waits for "go" on stdin
// (the parent pauses it with SIGSTOP before sending that). Then it tries
// its write, renews and releases, reporting each outcome on stdout.
func zombie(addr, dsn string) int {
	ctx := context.Background()
	locks := wardenv1connect.NewLockServiceClient(http.DefaultClient, addr)
	resp, err := locks.Acquire(ctx, connect.NewRequest(&wardenv1.AcquireRequest{
		Resource: protected, RequestId: "A", LeaseTtl: durationpb.New(2 * time.Second), Holder: "A"}))
	if err != nil {
		fmt.Println("acquire", err)
		return 1
	}
	db, err := sql.Open("pgx", dsn)
	if err == nil {
		err = db.PingContext(ctx)
	}
	if err != nil {
		fmt.Println("connect", err)
		return 1
	}
	defer db.Close()
	g, _ := fence.NewSQL("warden_fences")
	token := resp.Msg.GetFencingToken()
	fmt.Println(token)
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return 1
	}
	// A believes it still holds the lock and writes.
	err = inTx(ctx, db, func(tx *sql.Tx) error {
		if err := g.Check(ctx, tx, protected, token); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `UPDATE orders SET owner = 'A', fence_token = $1 WHERE id = 1`, int64(token))
		return err
	})
	switch {
	case errors.Is(err, fence.ErrStaleToken):
		fmt.Println("write refused")
	case err != nil:
		fmt.Println("write error", err)
	default:
		fmt.Println("write accepted")
	}
	_, err = locks.Renew(ctx, connect.NewRequest(&wardenv1.RenewRequest{Resource: protected, LeaseId: resp.Msg.GetLeaseId()}))
	fmt.Println("renew", connect.CodeOf(err))
	rel, err := locks.Release(ctx, connect.NewRequest(&wardenv1.ReleaseRequest{Resource: protected, LeaseId: resp.Msg.GetLeaseId()}))
	if err != nil {
		fmt.Println("release", err)
		return 1
	}
	fmt.Println("released", rel.Msg.GetReleased())
	return 0
}

// Case L2, the system's most important assertion: process A holds the
// lock with token T and is paused (SIGSTOP) past its lease; B is granted
// the lock with a higher token and writes; A resumes and writes with T.
// The database refuses A's write and B's row is intact; A can neither
// renew nor release B's lock.
func TestZombieWriteRefused(t *testing.T) {
	dsn := startPostgres(t)
	ctx := context.Background()
	db := pgConnect(t, dsn)
	g, _ := fence.NewSQL("warden_fences")
	if err := g.CreateTable(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id int PRIMARY KEY, owner text, fence_token bigint);
		INSERT INTO orders VALUES (1, 'nobody', 0)`); err != nil {
		t.Fatal(err)
	}

	dev, err := server.StartDev(server.DevConfig{DataDir: t.TempDir(), Router: router.Config{ScanInterval: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	srv := httptest.NewServer(rpc.NewHandler(dev.Router))
	defer srv.Close()

	a := exec.Command(os.Args[0], "-test.run=^$")
	a.Env = append(os.Environ(), "WARDEN_ZOMBIE_ADDR="+srv.URL, "WARDEN_ZOMBIE_DSN="+dsn)
	stdin, _ := a.StdinPipe()
	stdout, _ := a.StdoutPipe()
	a.Stderr = os.Stderr
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Process.Kill(); _ = a.Wait() }()
	out := bufio.NewReader(stdout)
	tokA, err := strconv.ParseUint(readLine(t, out), 10, 64)
	if err != nil {
		t.Fatalf("A's token: %v", err)
	}

	if err := a.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// B queues for the lock; it is granted once A's lease is over.
	locks := wardenv1connect.NewLockServiceClient(srv.Client(), srv.URL)
	bctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	b, err := locks.Acquire(bctx, connect.NewRequest(&wardenv1.AcquireRequest{Resource: protected, RequestId: "B", Holder: "B",
		LeaseTtl: durationpb.New(30 * time.Second), WaitTimeout: durationpb.New(15 * time.Second)}))
	if err != nil {
		t.Fatalf("B: %v", err)
	}
	tokB := b.Msg.GetFencingToken()
	if tokB <= tokA {
		t.Fatalf("B's token %d is not above A's %d", tokB, tokA)
	}
	if err := inTx(ctx, db, func(tx *sql.Tx) error {
		if err := g.Check(ctx, tx, protected, tokB); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `UPDATE orders SET owner = 'B', fence_token = $1 WHERE id = 1`, int64(tokB))
		return err
	}); err != nil {
		t.Fatalf("B's write: %v", err)
	}

	// A wakes up and carries on as if nothing happened.
	if err := a.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(stdin, "go")
	for _, want := range []string{"write refused", "renew failed_precondition", "released false"} {
		if got := readLine(t, out); got != want {
			t.Fatalf("A: %q, want %q", got, want)
		}
	}
	var owner string
	var fenceTok int64
	if err := db.QueryRowContext(ctx, `SELECT owner, fence_token FROM orders WHERE id = 1`).Scan(&owner, &fenceTok); err != nil {
		t.Fatal(err)
	}
	if owner != "B" || uint64(fenceTok) != tokB {
		t.Fatalf("row after A's late write: owner %q token %d, want B's (%d)", owner, fenceTok, tokB)
	}
	d, err := locks.Describe(ctx, connect.NewRequest(&wardenv1.DescribeRequest{Resource: protected}))
	if err != nil || !d.Msg.GetHeld() || d.Msg.GetFencingToken() != tokB || !strings.EqualFold(d.Msg.GetHolder(), "B") {
		t.Fatalf("B's lock after A's attempts: %v %v", d, err)
	}
	if err := a.Wait(); err != nil {
		t.Fatalf("A exited: %v", err)
	}
}
