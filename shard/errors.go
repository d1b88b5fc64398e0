package shard

import "errors"

// Errors returned by the state machine. A refused command is never one of
// these: refusals are Results. These stop the replica, because applying on
// would risk diverging from the others.
var (
	// ErrUnsupportedVersion: a command's envelope version is newer than
	// this binary understands. Upgrade every replica before proposing it.
	ErrUnsupportedVersion = errors.New("shard: unsupported command version")
	// ErrCorruptRecord: a stored record failed to decode.
	ErrCorruptRecord = errors.New("shard: corrupt stored record")
	// ErrCorruptSnapshot: a snapshot stream is malformed or truncated.
	ErrCorruptSnapshot = errors.New("shard: corrupt snapshot")
)
