package router

import (
	"testing"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	"github.com/warden-dev/warden/shard"
)

// A command of version 2 is proposed only once every replica's node has
// said, in a clock reading, that its binary applies version 2.
func TestAppliesNeedsEveryReplicasVersion(t *testing.T) {
	r := &Router{}
	r.maps.Store(placement.NewMap(&placementv1.State{Shards: []*placementv1.Shard{{Id: 5, Replicas: []*placementv1.Replica{
		{ReplicaId: 1, NodeId: 1}, {ReplicaId: 2, NodeId: 2}, {ReplicaId: 3, NodeId: 3}}}}}))
	for _, c := range []struct {
		versions map[uint64]uint32
		v        uint32
		want     bool
	}{
		{nil, 1, true},
		{nil, 2, false}, // no reading yet
		{map[uint64]uint32{1: 2, 2: 2}, 2, false}, // node 3 not heard from
		{map[uint64]uint32{1: 2, 2: 2, 3: 1}, 2, false},
		{map[uint64]uint32{1: 2, 2: 2, 3: 2}, 2, true},
		{map[uint64]uint32{1: 2, 2: 2, 3: 2}, 3, false},
	} {
		r.clock.versions = c.versions
		if got := r.Applies(5, c.v); got != c.want {
			t.Errorf("versions %v, command version %d: applies %v, want %v", c.versions, c.v, got, c.want)
		}
	}
	if r.Applies(6, 2) {
		t.Error("applies to a shard the map does not know")
	}
}

// A peer not read since this router started (down, or not yet up) counts
// with the version it registered in the placement map at its last start;
// a reading, when there is one, wins.
func TestPeerVersionFallsBackToRegistered(t *testing.T) {
	r := &Router{}
	r.maps.Store(placement.NewMap(&placementv1.State{
		Nodes: []*placementv1.Node{{Id: 1, CommandVersion: 5}, {Id: 2, CommandVersion: 5}, {Id: 3, CommandVersion: 4}},
		Shards: []*placementv1.Shard{{Id: 5, Replicas: []*placementv1.Replica{
			{ReplicaId: 1, NodeId: 1}, {ReplicaId: 2, NodeId: 2}, {ReplicaId: 3, NodeId: 3}}}}}))
	for _, c := range []struct {
		versions map[uint64]uint32
		want     uint32
	}{
		{nil, 4},                           // all from the map: node 3 registered 4
		{map[uint64]uint32{1: 5, 2: 5}, 4}, // node 3 down since before this router started
		{map[uint64]uint32{3: 5}, 5},       // node 3's reading says it was upgraded since
		{map[uint64]uint32{1: 5, 3: 3}, 3}, // a reading wins over the registration
	} {
		r.clock.versions = c.versions
		if got := r.sharedVersion(5); got != min(c.want, shard.CommandVersion) {
			t.Errorf("versions %v: shared version %d, want %d", c.versions, got, c.want)
		}
	}
}

// Commands travel in the newest version every replica applies: this
// binary's while every replica is local or reported it, older while one
// replica's node reported an older binary or none.
func TestSharedVersion(t *testing.T) {
	r := &Router{}
	r.maps.Store(placement.NewMap(&placementv1.State{Shards: []*placementv1.Shard{{Id: 5, Replicas: []*placementv1.Replica{
		{ReplicaId: 1, NodeId: 1}, {ReplicaId: 2, NodeId: 2}, {ReplicaId: 3, NodeId: 3}}}}}))
	for _, c := range []struct {
		versions map[uint64]uint32
		want     uint32
	}{
		{nil, 1},
		{map[uint64]uint32{1: shard.CommandVersion, 2: shard.CommandVersion}, 1},
		{map[uint64]uint32{1: shard.CommandVersion, 2: shard.CommandVersion, 3: 3}, 3},
		{map[uint64]uint32{1: shard.CommandVersion, 2: shard.CommandVersion, 3: shard.CommandVersion}, shard.CommandVersion},
	} {
		r.clock.versions = c.versions
		if got := r.sharedVersion(5); got != c.want {
			t.Errorf("versions %v: shared version %d, want %d", c.versions, got, c.want)
		}
	}
}
