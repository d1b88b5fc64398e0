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
		rt.add("hot")
	}
	for range 20 {
		rt.add("warm")
	}
	// A stream of rarer resources competes for the other slots; the
	// busiest two keep theirs.
	for i := range 100 {
		rt.add(string(rune('a' + i%26)))
	}
	top := rt.top(2)
	if len(top) != 2 || top[0].resource != "hot" || top[1].resource != "warm" {
		t.Fatalf("top = %+v", top)
	}
	if top[0].perSec <= top[1].perSec {
		t.Fatalf("rates not ordered: %+v", top)
	}
}

func TestRateTrackerForgetsOldWindows(t *testing.T) {
	rt := newRateTracker(10, 10*time.Millisecond)
	rt.add("old")
	time.Sleep(25 * time.Millisecond)
	rt.add("new")
	if top := rt.top(10); len(top) != 1 || top[0].resource != "new" {
		t.Fatalf("top after two windows = %+v", top)
	}
}
