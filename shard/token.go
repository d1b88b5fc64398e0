package shard

// Fencing token layout (DESIGN.md §2 "Fencing token").
//
// A token is one uint64 that protected resources compare as a number. It
// stays below 2^63 so that it fits a signed BIGINT column:
//
//	bit 63      always 0
//	bits 62..40 epoch    (23 bits) — from placement's global allocator
//	bits 39..0  revision (40 bits) — the shard's grant counter
//
// Every grant increases the shard's revision by one, so within an epoch
// tokens strictly increase across all resources of the shard. A shard takes
// a fresh, larger epoch whenever it is created or receives a hash range, so
// tokens keep increasing across splits and moves. When the revision comes
// within RevisionHeadroom of 2^40-1, the shard's leader gives it a new
// epoch (NewEpochCmd); should the revision still reach 2^40-1, the shard
// refuses grants with CODE_UNAVAILABLE until it has one, never wrapping.
const (
	// RevisionBits is the width of the revision part of a token.
	RevisionBits = 40
	// EpochBits is the width of the epoch part of a token.
	EpochBits = 23
	// MaxRevision is the largest revision a shard issues in one epoch.
	MaxRevision = 1<<RevisionBits - 1
	// MaxEpoch is the largest epoch a token can carry.
	MaxEpoch = 1<<EpochBits - 1
	// RevisionHeadroom is how close to MaxRevision a shard's revision may
	// come before its leader gives it a new epoch: 2^32 grants, days at
	// any rate this machine sustains, so an unreachable placement group
	// has long to come back.
	RevisionHeadroom = 1 << 32
)

// Token composes a fencing token from an epoch and a revision. The caller
// keeps epoch ≤ MaxEpoch and revision ≤ MaxRevision.
func Token(epoch, revision uint64) uint64 {
	return epoch<<RevisionBits | revision
}

// SplitToken returns the epoch and revision a token was made of.
func SplitToken(token uint64) (epoch, revision uint64) {
	return token >> RevisionBits, token & MaxRevision
}
