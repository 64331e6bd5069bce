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
// combine, appended rows are a set). An upsert can when upsert.version is
// set: the version, not the order of application, decides which record a
// row holds, so an older record never replaces a newer row. Without a
// version the last write wins, and a backfilled record is always written
// after the live ones: it would replace newer rows with older values. A
// tombstone deletes whatever version the row has: with on_tombstone
// delete, an old backfilled delete would remove a row the live pipeline
// wrote from a later record, so such an upsert is refused too.
func (s *Set) Backfillable(name string) error {
	for _, p := range s.pipelines {
		if p.name != name {
			continue
		}
		u := p.upsert
		switch {
		case u == nil:
			return nil
		case u.version == nil:
			return fmt.Errorf("pipeline %s %w: an upsert without upsert.version (a backfilled record is older than the rows the live pipeline wrote, and without a version it would replace them; set upsert.version to a value that grows with each key's changes)", name, ErrNotBackfillable)
		case u.deleteOnNil:
			return fmt.Errorf("pipeline %s %w: an upsert with on_tombstone delete (a backfilled tombstone would delete a row the live pipeline wrote from a later record, whatever its version)", name, ErrNotBackfillable)
		}
		return nil
	}
	return fmt.Errorf("no pipeline named %s", name)
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
