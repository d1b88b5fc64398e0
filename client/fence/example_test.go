package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/warden-dev/warden/client"
	"github.com/warden-dev/warden/client/fence"
)

// A write under a lease checks the lease's fencing token in the same
// transaction, before it changes anything: a writer whose lease has
// passed to another holder (it was paused past its TTL, say) is refused
// and rolls back. The caller brings the PostgreSQL driver; with pgx,
// import _ "github.com/jackc/pgx/v5/stdlib" and open "pgx".
func ExampleSQL_Check() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	guard, err := fence.NewSQL("warden_fences")
	if err != nil {
		log.Fatal(err)
	}
	if err := guard.CreateTable(ctx, db); err != nil { // once, or in a migration
		log.Fatal(err)
	}

	c, err := client.New("http://127.0.0.1:7070")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(context.Background())
	lease, err := c.Lock(ctx, "orders/42", client.LockOptions{TTL: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Unlock(context.Background())

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback() // a no-op after Commit
	// Check locks the resource's row in warden_fences until the
	// transaction ends, so writers of orders/42 take turns.
	err = guard.Check(ctx, tx, "orders/42", lease.Token())
	if errors.Is(err, fence.ErrStaleToken) {
		log.Print(err) // the lease has passed on: stop, write nothing
		return
	}
	if err != nil {
		log.Fatal(err) // the database's error, not a stale token
	}
	if _, err := tx.ExecContext(ctx, `UPDATE orders SET status = 'shipped' WHERE id = $1`, 42); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
}

// A guard accepts the token it last accepted or a higher one, and
// refuses a lower one: the write of a holder that woke up after its
// lease passed to another.
func ExampleMemory_Do() {
	var orders fence.Memory
	write := func(token uint64) error {
		return orders.Do("orders/42", token, func() error {
			fmt.Println("written under token", token)
			return nil
		})
	}
	_ = write(5) // the holder
	_ = write(5) // the same holder, again
	_ = write(7) // the next holder, after the lease passed on

	err := write(5) // the first holder, back from a pause
	fmt.Println(errors.Is(err, fence.ErrStaleToken), err)
	// Output:
	// written under token 5
	// written under token 5
	// written under token 7
	// true fence: orders/42 refused token 5: token 7 was accepted
}
