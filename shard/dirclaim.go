package shard

import (
	"fmt"
	"sync"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"
)

// claimWait bounds how long Open waits for another instance of the same
// replica in this process to close.
const claimWait = 30 * time.Second

// openDirs holds the replica directories whose state machine is open in
// this process, each with a channel closed when that instance closes.
// Dragonboat can start a replica again (StopReplica, then StartReplica)
// before the previous instance's Close has run; the new Open must not
// touch the directory (remove stale databases, open the live one, whose
// lock the old instance still holds) until then.
var openDirs = struct {
	sync.Mutex
	closed map[string]chan struct{}
}{closed: map[string]chan struct{}{}}

// claimDir waits until no other state machine in this process has dir
// open, then claims it until release is called. It fails with
// sm.ErrOpenStopped when stopc closes first, and with an error naming
// dir after claimWait. Calling release more than once is harmless.
func claimDir(dir string, stopc <-chan struct{}) (release func(), err error) {
	timeout := time.NewTimer(claimWait)
	defer timeout.Stop()
	for {
		openDirs.Lock()
		held, ok := openDirs.closed[dir]
		if !ok {
			done := make(chan struct{})
			openDirs.closed[dir] = done
			openDirs.Unlock()
			return sync.OnceFunc(func() {
				openDirs.Lock()
				delete(openDirs.closed, dir)
				openDirs.Unlock()
				close(done)
			}), nil
		}
		openDirs.Unlock()
		select {
		case <-held:
		case <-stopc:
			return nil, sm.ErrOpenStopped
		case <-timeout.C:
			return nil, fmt.Errorf("shard: another instance of the replica in %s has not closed after %v", dir, claimWait)
		}
	}
}
