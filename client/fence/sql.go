package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"regexp"
)

// Execer is what SQL needs of a database/sql connection: *sql.Tx, *sql.DB
// and *sql.Conn all qualify. Pass the transaction of the protected write.
// With pgx, open the *sql.DB from the driver's stdlib package
// (github.com/jackc/pgx/v5/stdlib: stdlib.OpenDBFromPool(pool)); any
// other PostgreSQL driver for database/sql works too.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// SQL is a Guard that keeps the highest accepted token of each resource in
// a PostgreSQL table (resource text primary key, fence_token bigint). It
// speaks database/sql, so the fence package pulls no database driver: the
// caller brings its own.
type SQL struct {
	table string
}

var tableName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$`)

// NewSQL returns a guard on table (an unquoted identifier, optionally
// schema-qualified, for example "warden_fences").
func NewSQL(table string) (*SQL, error) {
	if !tableName.MatchString(table) {
		return nil, fmt.Errorf("fence: table name %q is not a plain SQL identifier", table)
	}
	return &SQL{table: table}, nil
}

// CreateTable creates the guard's table if it does not exist.
func (s *SQL) CreateTable(ctx context.Context, db Execer) error {
	_, err := db.ExecContext(ctx, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
		resource    text PRIMARY KEY,
		fence_token bigint NOT NULL CHECK (fence_token >= 0)
	)`, s.table))
	return err
}

// Check accepts token for resource if it is at least the highest accepted,
// and records it, in one conditional upsert. Run it in the transaction of
// the write it protects, before the write: the upsert locks the
// resource's row, so writers of the same resource serialise and one with a
// lower token gets a *StaleTokenError (roll back then). Tokens are stored
// as BIGINT; Warden's stay below 2^63.
func (s *SQL) Check(ctx context.Context, tx Execer, resource string, token uint64) error {
	if token > math.MaxInt64 {
		return ErrTokenRange
	}
	res, err := tx.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s AS f (resource, fence_token) VALUES ($1, $2)
		ON CONFLICT (resource) DO UPDATE SET fence_token = EXCLUDED.fence_token
		WHERE f.fence_token <= EXCLUDED.fence_token`, s.table), resource, int64(token))
	if err != nil {
		return fmt.Errorf("fence: checking %s: %w", resource, err)
	}
	switch n, err := res.RowsAffected(); {
	case err != nil:
		return fmt.Errorf("fence: checking %s: %w", resource, err)
	case n == 1:
		return nil
	case n != 0:
		return fmt.Errorf("fence: checking %s: the upsert changed %d rows (is %s's resource its primary key?)", resource, n, s.table)
	}
	// Refused: read the highest token for the error. Only a refusal is a
	// StaleTokenError; a failed read is the database's error, never "your
	// lease has ended".
	var highest int64
	err = tx.QueryRowContext(ctx, fmt.Sprintf(`SELECT fence_token FROM %s WHERE resource = $1`, s.table), resource).Scan(&highest)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return reject("sql", resource, token, 0)
	case err != nil:
		return fmt.Errorf("fence: checking %s: %w", resource, err)
	}
	return reject("sql", resource, token, uint64(highest))
}
