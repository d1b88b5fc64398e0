package fence_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/prometheus/client_golang/prometheus"

	"github.com/warden-dev/warden/client/fence"
	"github.com/warden-dev/warden/server"
)

// startPostgres runs a throwaway PostgreSQL server on a free loopback port
// and returns its connection string. It uses the server binaries of the
// machine (Debian's postgresql package); initdb and postgres refuse to run
// as root, so as root they run as the postgres user. Without the binaries
// the test is skipped, except in CI, where .ci/run installs them.
func startPostgres(t *testing.T) string {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("PostgreSQL server binaries are missing; .ci/run installs the postgresql package")
		}
		t.Skip("no PostgreSQL server binaries (apt-get install postgresql)")
	}
	bin := filepath.Dir(bins[len(bins)-1])
	dir, err := os.MkdirTemp("", "warden-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	asUser := func(name string, args ...string) *exec.Cmd {
		if os.Geteuid() != 0 {
			return exec.Command(filepath.Join(bin, name), args...)
		}
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", filepath.Join(bin, name)}, args...)...)
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root needs the postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	data := filepath.Join(dir, "data")
	if out, err := asUser("initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	addr, err := server.FreeLoopbackAddr()
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(addr)
	srv := asUser("postgres", "-D", data, "-p", port, "-k", dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off")
	srv.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	logf, _ := os.Create(filepath.Join(dir, "postgres.log"))
	srv.Stdout, srv.Stderr = logf, logf
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-srv.Process.Pid, syscall.SIGTERM)
		_ = srv.Wait()
		logf.Close()
	})
	dsn := fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", addr)
	deadline := time.Now().Add(30 * time.Second)
	for {
		db, err := sql.Open("pgx", dsn)
		if err == nil {
			err = db.PingContext(context.Background())
			db.Close()
		}
		if err == nil {
			return dsn
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
			t.Fatalf("postgres did not start: %v\n%s", err, log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pgConnect opens dsn through database/sql and pgx's stdlib driver, as
// fence.SQL's users do.
func pgConnect(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// inTx runs fn in a transaction of db, committed when fn returns nil.
func inTx(ctx context.Context, db *sql.DB, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// sqlRejections is warden_fencing_rejections_total{guard="sql"} in reg.
func sqlRejections(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "warden_fencing_rejections_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "guard" && l.GetValue() == "sql" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func TestSQLGuard(t *testing.T) {
	dsn := startPostgres(t)
	ctx := context.Background()
	db := pgConnect(t, dsn)
	reg := prometheus.NewRegistry()
	if err := fence.RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	g, err := fence.NewSQL("warden_fences")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.CreateTable(ctx, db); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		token uint64
		ok    bool
	}{{5, true}, {5, true}, {4, false}, {1 << 62, true}, {1<<62 - 1, false}, {1 << 63, false}} {
		if err := g.Check(ctx, db, "orders/42", step.token); (err == nil) != step.ok {
			t.Fatalf("Check(%d) = %v", step.token, err)
		}
	}
	if n := sqlRejections(t, reg); n < 2 {
		t.Fatalf("warden_fencing_rejections_total{guard=sql} = %v after two refusals", n)
	}
	if _, err := fence.NewSQL("x; DROP TABLE y"); err == nil {
		t.Fatal("accepted a table name that is not an identifier")
	}

	// Concurrent writers, each checking in its own transaction before
	// logging its write: in commit order the logged tokens never go down.
	if _, err := db.ExecContext(ctx, `CREATE TABLE writes (seq bigserial PRIMARY KEY, token bigint)`); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 20)
	for i := range 20 {
		go func() {
			errs <- inTx(ctx, db, func(tx *sql.Tx) error {
				tok := uint64(1<<62 + i*7%20)
				if err := g.Check(ctx, tx, "orders/7", tok); err != nil {
					return nil // refused: nothing written
				}
				_, err := tx.ExecContext(ctx, `INSERT INTO writes (token) VALUES ($1)`, int64(tok))
				return err
			})
		}()
	}
	for range 20 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	rows, err := db.QueryContext(ctx, `SELECT token FROM writes ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	var toks []int64
	for rows.Next() {
		var tok int64
		if err := rows.Scan(&tok); err != nil {
			t.Fatal(err)
		}
		toks = append(toks, tok)
	}
	if err := rows.Err(); err != nil || len(toks) == 0 {
		t.Fatalf("writes: %v %v", toks, err)
	}
	for i := 1; i < len(toks); i++ {
		if toks[i] < toks[i-1] {
			t.Fatalf("write with token %d committed after %d", toks[i], toks[i-1])
		}
	}
}

// readLine reads one line from a child's output, failing after a timeout.
func readLine(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	type res struct {
		s   string
		err error
	}
	ch := make(chan res, 1)
	go func() {
		s, err := r.ReadString('\n')
		ch <- res{s, err}
	}()
	select {
	case got := <-ch:
		if got.err != nil {
			t.Fatalf("child: %v", got.err)
		}
		return got.s[:len(got.s)-1]
	case <-time.After(30 * time.Second):
		t.Fatal("child said nothing for 30 s")
		return ""
	}
}
