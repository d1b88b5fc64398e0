package fence_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/warden-dev/warden/client/fence"
)

// fakeDB is a database/sql driver whose upsert affects a set number of
// rows and whose SELECT answers a token, no row, or an error: the cases
// of SQL.Check that a real PostgreSQL does not give on demand.
type fakeDB struct {
	affected  int64
	selectErr error // nil: answer highest; sql.ErrNoRows: no row
	highest   int64
}

func (f *fakeDB) Open(string) (driver.Conn, error) { return fakeConn{f}, nil }

type fakeConn struct{ f *fakeDB }

func (c fakeConn) Prepare(query string) (driver.Stmt, error) { return fakeStmt{c.f, query}, nil }
func (fakeConn) Close() error                                { return nil }
func (fakeConn) Begin() (driver.Tx, error)                   { return fakeTx{}, nil }

type fakeTx struct{}

func (fakeTx) Commit() error   { return nil }
func (fakeTx) Rollback() error { return nil }

type fakeStmt struct {
	f     *fakeDB
	query string
}

func (fakeStmt) Close() error  { return nil }
func (fakeStmt) NumInput() int { return -1 }
func (s fakeStmt) Exec([]driver.Value) (driver.Result, error) {
	return driver.RowsAffected(s.f.affected), nil
}
func (s fakeStmt) Query([]driver.Value) (driver.Rows, error) {
	if s.f.selectErr != nil && !errors.Is(s.f.selectErr, sql.ErrNoRows) {
		return nil, s.f.selectErr
	}
	return &fakeRows{f: s.f, empty: errors.Is(s.f.selectErr, sql.ErrNoRows)}, nil
}

type fakeRows struct {
	f           *fakeDB
	empty, done bool
}

func (*fakeRows) Columns() []string { return []string{"fence_token"} }
func (*fakeRows) Close() error      { return nil }
func (r *fakeRows) Next(dest []driver.Value) error {
	if r.empty || r.done {
		return io.EOF
	}
	r.done = true
	dest[0] = r.f.highest
	return nil
}

// Only a refusal is a StaleTokenError. A failed read of the highest
// token, or an upsert that changed more than one row, is the database's
// error: a holder of a valid lease must never be told its lease ended
// because the connection broke.
func TestSQLCheckTellsRefusalsFromErrors(t *testing.T) {
	g, err := fence.NewSQL("warden_fences")
	if err != nil {
		t.Fatal(err)
	}
	broken := errors.New("driver: bad connection")
	for _, c := range []struct {
		name  string
		db    fakeDB
		stale bool
		want  string // in the error, "" for nil
	}{
		{"accepted", fakeDB{affected: 1}, false, ""},
		{"refused", fakeDB{affected: 0, highest: 9}, true, "refused token 5"},
		{"refused, the row gone meanwhile", fakeDB{affected: 0, selectErr: sql.ErrNoRows}, true, "refused token 5"},
		{"the read failed", fakeDB{affected: 0, selectErr: broken}, false, "bad connection"},
		{"two rows changed", fakeDB{affected: 2}, false, "changed 2 rows"},
	} {
		sql.Register("fence-fake-"+strings.ReplaceAll(c.name, " ", "-"), &c.db)
		db, err := sql.Open("fence-fake-"+strings.ReplaceAll(c.name, " ", "-"), "")
		if err != nil {
			t.Fatal(err)
		}
		err = g.Check(context.Background(), db, "r", 5)
		db.Close()
		switch {
		case c.want == "" && err != nil, c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		case errors.Is(err, fence.ErrStaleToken) != c.stale:
			t.Errorf("%s: %v: stale %v, want %v", c.name, err, errors.Is(err, fence.ErrStaleToken), c.stale)
		}
	}
}
