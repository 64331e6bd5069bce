package actors

import "errors"

// HeaderReplayGroup is the consumer group a record re-produced by `ratchet
// dlq replay` is for. An engine of another group skips such a record: the
// replay is not its business, and applying it would apply the record a
// second time for that group.
const HeaderReplayGroup = "ratchet.replay_group"

// ErrSkip, returned (wrapped or not) by a ValueDecoder, means the record is
// not for this engine (a replay for another group): it is neither applied
// nor dead-lettered, and the partition's watermark passes it like any
// applied record.
var ErrSkip = errors.New("record not for this consumer group")
