package placement

import (
	"errors"
	"io"
	"testing"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"
)

// fakeSM is a state machine whose snapshot calls take a moment and may
// fail.
type fakeSM struct {
	sm.IOnDiskStateMachine
	fail error
}

func (f fakeSM) SaveSnapshot(any, io.Writer, <-chan struct{}) error {
	time.Sleep(time.Millisecond)
	return f.fail
}

func (f fakeSM) RecoverFromSnapshot(io.Reader, <-chan struct{}) error {
	time.Sleep(time.Millisecond)
	return f.fail
}

// Each snapshot save and recovery that succeeds is timed, by kind; a
// failed one is not; without an observer the factory is unchanged.
func TestTimedSnapshots(t *testing.T) {
	var seen []string
	observe := func(kind string, d time.Duration) {
		if d < time.Millisecond {
			t.Errorf("%s took %v, less than the call did", kind, d)
		}
		seen = append(seen, kind)
	}
	var fail error
	create := timedSnapshots(func(uint64, uint64) sm.IOnDiskStateMachine { return fakeSM{fail: fail} }, observe)
	s := create(1, 1)
	if err := s.SaveSnapshot(nil, io.Discard, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.RecoverFromSnapshot(nil, nil); err != nil {
		t.Fatal(err)
	}
	fail = errors.New("disk full")
	s = create(1, 1)
	_ = s.SaveSnapshot(nil, io.Discard, nil)
	if len(seen) != 2 || seen[0] != "save" || seen[1] != "recover" {
		t.Fatalf("observed %v, want [save recover]", seen)
	}
	if timedSnapshots(nil, nil) != nil {
		t.Fatal("without an observer the factory was wrapped")
	}
}
