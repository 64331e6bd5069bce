package actors

import "github.com/asynkron/protoactor-go/actor"

// OffsetMoved tells the committer that a partition's stored position was
// moved by something other than its own batches (`ratchet offsets reset`,
// in exactly-once mode) and that the partition resumes from Next. Sent by
// the partition actor when the offset guard refuses a batch and the row
// still carries the partition's own epoch. Unlike OffsetApplied it may go
// backwards: the committer commits Next even below what Kafka has, so that
// Kafka's committed offset follows a deliberate reset instead of staying
// ahead of it until the replay passes it.
type OffsetMoved struct {
	TP   TopicPartition
	Gen  uint64
	Next int64
}

// moved takes the partition's new position as it is, forward or back, and
// schedules its commit.
func (m *Committer) moved(c actor.Context, msg *OffsetMoved) {
	st, ok := m.parts[msg.TP]
	if !ok || st.gen != msg.Gen || msg.Next < 0 {
		return
	}
	st.next = msg.Next
	// What Kafka has is no longer comparable with the new position: mark
	// it unknown, so the next commit sends Next whatever its value.
	st.committed = -1
	m.arm(c)
}
