package fence

import (
	"errors"
	"math"
	"sync"
	"testing"
)

func TestMemory(t *testing.T) {
	var m Memory
	for _, step := range []struct {
		res   string
		token uint64
		ok    bool
	}{
		{"r", 5, true},
		{"r", 5, true}, // the same holder writes again
		{"r", 4, false},
		{"r", 7, true},
		{"r", 6, false},
		{"s", 1, true}, // resources are independent
		{"r", math.MaxInt64 + 1, false},
	} {
		err := m.Check(step.res, step.token)
		if (err == nil) != step.ok {
			t.Fatalf("Check(%s, %d) = %v", step.res, step.token, err)
		}
		if err != nil && step.token <= math.MaxInt64 {
			var se *StaleTokenError
			if !errors.Is(err, ErrStaleToken) || !errors.As(err, &se) || se.Highest != 7 && se.Highest != 5 {
				t.Fatalf("refusal %v is not a StaleTokenError with the highest token", err)
			}
		}
	}
}

// Concurrent writers with random tokens: the sequence of accepted writes
// never goes down.
func TestMemoryDoIsAtomic(t *testing.T) {
	var m Memory
	var wrote []uint64
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tok := uint64(i*7919%200 + 1)
			_ = m.Do("r", tok, func() error {
				wrote = append(wrote, tok) // guarded by Do
				return nil
			})
		}()
	}
	wg.Wait()
	for i := 1; i < len(wrote); i++ {
		if wrote[i] < wrote[i-1] {
			t.Fatalf("write with token %d after %d", wrote[i], wrote[i-1])
		}
	}
}
