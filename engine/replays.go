package engine

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"ratchet/actors"
	"ratchet/processor"
)

// skipReplaysOfOtherGroups wraps a partition's decoder: a record that
// `ratchet dlq replay` re-produced for another consumer group (header
// ratchet.replay_group names a group other than group) is skipped with
// actors.ErrSkip before it is decoded: not applied, not dead-lettered,
// and its offset passes with the batch it is in. Records without the
// header (every ordinary record, and replays written before the header
// existed) are decoded as before. The wrapper keeps a Resolver one.
func skipReplaysOfOtherGroups(dec actors.ValueDecoder, group string, skipped prometheus.Counter) actors.ValueDecoder {
	s := skipper{dec: dec, group: group, skipped: skipped}
	if r, ok := dec.(actors.Resolver); ok {
		return &skipResolver{skipper: s, Resolver: r}
	}
	return &s
}

type skipper struct {
	dec     actors.ValueDecoder
	group   string
	skipped prometheus.Counter
}

func (s *skipper) DecodeRecord(rec *processor.Record) error {
	if g, ok := rec.Header(actors.HeaderReplayGroup); ok && string(g) != s.group {
		s.skipped.Inc()
		return fmt.Errorf("replay for group %q: %w", g, actors.ErrSkip)
	}
	return s.dec.DecodeRecord(rec)
}

type skipResolver struct {
	skipper
	actors.Resolver
}

func (s *skipResolver) DecodeRecord(rec *processor.Record) error { return s.skipper.DecodeRecord(rec) }
