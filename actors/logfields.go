package actors

// batchFields returns the fields every log line about a batch carries,
// followed by more: topic, partition and first_offset, the first offset of
// the batch as the partition cut it. The halves a failing batch is split
// into for isolation, and the dead letters isolated from it, keep the
// whole batch's first_offset (their own offset goes in offset), so that
// the lines of one batch, written by the partition, retry and DLQ actors,
// are found together by those three fields.
func batchFields(topic string, partition int32, first int64, more ...any) []any {
	return append([]any{"topic", topic, "partition", partition, "first_offset", first}, more...)
}
