package placement

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// A node keeps a reserve of free space on its data directory's
// filesystem (DESIGN.md §5, §6). Dragonboat's LogDB and the replicas'
// Pebble stores stop the process with a panic when a write fails, and a
// panic in Dragonboat's goroutines cannot be recovered: so the node
// watches the free space (diskCheckInterval) and, below the reserve,
// refuses to propose (WritesRefused: the router answers unavailable) and
// reports itself not ready, while it still serves reads and, as a
// follower, appends what its leaders send. Once even a quarter of the
// reserve is gone, it exits with one line naming the directory before a
// write can fail (exitOutOfSpace).

// DiskReserve is how much of its data directory's filesystem a node
// keeps free: Bytes, or Percent of the filesystem's size when Percent
// is set. The zero value keeps none (the node never refuses writes for
// space).
type DiskReserve struct {
	Bytes   uint64
	Percent float64
}

// ParseDiskReserve parses a reserve: a size in bytes with an optional
// unit (KB, MB, GB, TB, or KiB, MiB, GiB, TiB), or a percentage of the
// filesystem's size ("5%"); "0" keeps none.
func ParseDiskReserve(s string) (DiskReserve, error) {
	s = strings.TrimSpace(s)
	if p, ok := strings.CutSuffix(s, "%"); ok {
		v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || v < 0 || v >= 100 {
			return DiskReserve{}, fmt.Errorf("disk reserve %q: want a percentage from 0 to below 100", s)
		}
		return DiskReserve{Percent: v}, nil
	}
	units := []struct {
		suffix string
		mult   uint64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1}}
	num, mult := s, uint64(1)
	for _, u := range units {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	v, err := strconv.ParseUint(num, 10, 64)
	if err != nil || v > ^uint64(0)/mult {
		return DiskReserve{}, fmt.Errorf("disk reserve %q: want bytes with an optional unit (512MiB, 2GiB, 10GB) or a percentage (5%%)", s)
	}
	return DiskReserve{Bytes: v * mult}, nil
}

// of is the reserve in bytes on a filesystem of size bytes.
func (r DiskReserve) of(size uint64) uint64 {
	if r.Percent > 0 {
		return uint64(float64(size) * r.Percent / 100)
	}
	return r.Bytes
}

// String is the reserve as ParseDiskReserve reads it.
func (r DiskReserve) String() string {
	if r.Percent > 0 {
		return strconv.FormatFloat(r.Percent, 'f', -1, 64) + "%"
	}
	return strconv.FormatUint(r.Bytes, 10) + "B"
}

// diskCheckInterval is how often a node with a reserve reads its data
// directory's free space.
const diskCheckInterval = time.Second

// ExitOutOfSpace is wardend's exit code when its data directory ran out
// of space (ENOSPC's errno).
const ExitOutOfSpace = 28

// DiskLowError is why a node refuses writes: the free space of its data
// directory's filesystem is below its reserve.
type DiskLowError struct {
	Node          uint64
	Dir           string
	Free, Reserve uint64 // bytes
}

func (e *DiskLowError) Error() string {
	return fmt.Sprintf("node %d's data directory %s has %d bytes free, less than its reserve of %d bytes (--disk-reserve): it refuses writes until space is freed", e.Node, e.Dir, e.Free, e.Reserve)
}

// WritesRefused returns a *DiskLowError while the node's data directory
// has less free space than its reserve (as last read, at most
// diskCheckInterval ago), else nil. The node then proposes nothing new.
func (n *Node) WritesRefused() error {
	if e := n.diskLow.Load(); e != nil {
		return e
	}
	return nil
}

// watchDisk reads the data directory's free space every
// diskCheckInterval until Close and updates WritesRefused, logging once
// on entering and once on leaving the reserve; it exits the process
// when less than a quarter of the reserve is left. A failed read keeps
// the last state.
func (n *Node) watchDisk() {
	tick := time.NewTicker(diskCheckInterval)
	defer tick.Stop()
	for {
		n.checkDisk()
		select {
		case <-n.stop:
			return
		case <-tick.C:
		}
	}
}

// checkDisk reads the free space once and acts on it (watchDisk).
func (n *Node) checkDisk() {
	size, free, err := n.DiskSpace()
	if err != nil {
		return
	}
	reserve := n.cfg.DiskReserve.of(size)
	if free < reserve/4 {
		exitOutOfSpace(n.cfg.DataDir, fmt.Errorf("%d bytes free, less than a quarter of the reserve of %d bytes (--disk-reserve); free space, then start it again", free, reserve))
	}
	if free < reserve {
		e := &DiskLowError{Node: n.cfg.ID, Dir: n.cfg.DataDir, Free: free, Reserve: reserve}
		if n.diskLow.Swap(e) == nil {
			slog.Error("data directory below its space reserve: refusing writes, not ready, until space is freed", "node", n.cfg.ID, "data_dir", n.cfg.DataDir, "free_bytes", free, "reserve_bytes", reserve)
		}
		return
	}
	if n.diskLow.Swap(nil) != nil {
		slog.Info("data directory above its space reserve again: accepting writes", "node", n.cfg.ID, "data_dir", n.cfg.DataDir, "free_bytes", free, "reserve_bytes", reserve)
	}
}

// exitOutOfSpace ends the process with one line naming dir and why, and
// ExitOutOfSpace: a write to the data directory failed, or is about to,
// and Dragonboat and Pebble would stop the process with a panic (a Go
// stack trace) on it.
var exitOutOfSpace = func(dir string, err error) {
	fmt.Fprintf(os.Stderr, "wardend: data directory %s is out of space: %v\n", dir, err)
	os.Exit(ExitOutOfSpace)
}

// dataDirs are the data directories of the nodes this process started,
// for exitIfOutOfSpace to name.
var dataDirs atomic.Pointer[[]string]

// addDataDir records a node's data directory (StartNode).
func addDataDir(dir string) {
	for {
		old := dataDirs.Load()
		var dirs []string
		if old != nil {
			dirs = append(dirs, *old...)
		}
		dirs = append(dirs, dir)
		if dataDirs.CompareAndSwap(old, &dirs) {
			return
		}
	}
}

// ExitIfOutOfSpace exits the process as exitOutOfSpace does when msg,
// the message of a fatal storage error about to become a panic, says a
// write found no space left: the data directory it names is the one
// among the process's nodes' whose path the message contains.
func ExitIfOutOfSpace(msg string) {
	if !strings.Contains(msg, syscall.ENOSPC.Error()) {
		return
	}
	dir := "(unknown)"
	if dirs := dataDirs.Load(); dirs != nil {
		dir = strings.Join(*dirs, ", ")
		for _, d := range *dirs {
			if strings.Contains(msg, d) {
				dir = d
				break
			}
		}
	}
	exitOutOfSpace(dir, errors.New(msg))
}
