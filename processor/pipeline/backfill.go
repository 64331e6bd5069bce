package pipeline

import (
	"errors"
	"fmt"

	"ratchet/processor"
)

// HeaderBackfill marks a dead letter written by `ratchet pipelines
// backfill NAME`: its value is NAME. `ratchet dlq replay` keeps the
// header on the record it re-produces, and the processor applies a record
// carrying it in pipeline NAME only: the other pipelines of the topic
// applied the original record live, or were never meant to (it lies
// before where they began), and would count it a second time.
const HeaderBackfill = "ratchet.backfill"

// ErrNotBackfillable is what Backfillable wraps for a pipeline whose
// backfill would not give the table it would have had from the start.
var ErrNotBackfillable = errors.New("cannot be backfilled")

// Only returns the set of the one pipeline named name (false when none
// is): what a backfill applies, the other pipelines of its topic left
// alone.
func (s *Set) Only(name string) (*Set, bool) {
	for _, p := range s.pipelines {
		if p.name != name {
			continue
		}
		return &Set{pipelines: []*pipeline{p}, byTopic: map[string][]*pipeline{p.topic: {p}},
			formats: map[string]string{p.topic: p.format}, adapter: s.adapter}, true
	}
	return nil, false
}

// Topic returns the topic pipeline name reads (false: no such pipeline).
func (s *Set) Topic(name string) (string, bool) {
	for _, p := range s.pipelines {
		if p.name == name {
			return p.topic, true
		}
	}
	return "", false
}

// Backfillable says whether pipeline name can be backfilled: applied to
// records older than those the live pipeline applied, after them, with
// the table as if the pipeline had been there from the start. Rollups
// and appends can (their writes commute: counts and sums add, min and max
// combine, appended rows are a set). An upsert with upsert.version can:
// the version, not the order of application, decides which record a row
// holds, so an older record never replaces a newer row. An upsert without
// a version can too, ordered by position (see BackfillDescending): every
// record the live pipeline applied is newer than every backfilled record
// of its partition, so a backfilled record writes a row only where the
// table has none for its key, and the backfill reads from the newest
// record down. That orders the records of a key only if they all are in
// one partition. A tombstone deletes whatever the row holds: with
// on_tombstone delete, an old backfilled delete would remove a row the
// live pipeline wrote from a later record (and an old record would bring
// back a row a later one deleted), so such an upsert is refused.
func (s *Set) Backfillable(name string) error {
	for _, p := range s.pipelines {
		if p.name != name {
			continue
		}
		if u := p.upsert; u != nil && u.deleteOnNil {
			return fmt.Errorf("pipeline %s %w: an upsert with on_tombstone delete (a backfilled tombstone would delete a row the live pipeline wrote from a later record, and a backfilled record would bring back a row the live pipeline deleted)", name, ErrNotBackfillable)
		}
		return nil
	}
	return fmt.Errorf("no pipeline named %s", name)
}

// BackfillDescending says whether pipeline name's backfill reads its range
// from the end down: an upsert without upsert.version, whose backfilled
// records write a row only where the table has none (the records are
// marked with HeaderBackfill), so the newest record of a key before the
// origin must come first.
func (s *Set) BackfillDescending(name string) bool {
	for _, p := range s.pipelines {
		if p.name == name {
			return p.upsert != nil && p.upsert.version == nil
		}
	}
	return false
}

// backfillOf returns the pipeline a record marked by HeaderBackfill is
// for, and whether it is marked.
func backfillOf(headers []processor.Header) (string, bool) {
	for _, h := range headers {
		if h.Key == HeaderBackfill {
			return string(h.Value), true
		}
	}
	return "", false
}
