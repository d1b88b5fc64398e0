package router

import (
	"testing"
	"time"
)

func TestRateTrackerKeepsTheBusiest(t *testing.T) {
	// Space-saving keeps every resource seen more than N/capacity times
	// and overestimates others by at most that: here 170/20.
	rt := newRateTracker(20, time.Minute)
	for range 50 {
		rt.Add("hot")
	}
	for range 20 {
		rt.Add("warm")
	}
	// A stream of rarer resources competes for the other slots; the
	// busiest two keep theirs.
	for i := range 100 {
		rt.Add(string(rune('a' + i%26)))
	}
	top := rt.Top(2)
	if len(top) != 2 || top[0].Resource != "hot" || top[1].Resource != "warm" {
		t.Fatalf("top = %+v", top)
	}
	if top[0].PerSec <= top[1].PerSec {
		t.Fatalf("rates not ordered: %+v", top)
	}
}

func TestRateTrackerForgetsOldWindows(t *testing.T) {
	rt := newRateTracker(10, 10*time.Millisecond)
	rt.Add("old")
	time.Sleep(25 * time.Millisecond)
	rt.Add("new")
	if top := rt.Top(10); len(top) != 1 || top[0].Resource != "new" {
		t.Fatalf("top after two windows = %+v", top)
	}
}
