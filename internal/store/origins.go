package store

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Where each pipeline began and what it was (migration 007; issue 34).
// ratchet run records each configured pipeline's definition at start
// (RecordDefinitions) and, per partition, the offset from which it applies
// the pipeline live, in the transaction of the first batch it applies
// there (InsertOrigins). `ratchet pipelines status|reset|forget` read and
// remove these records.

// PipelineDefinition is one configured pipeline as ratchet records it: its
// name, its topic, and the fingerprint and canonical form of what decides
// what it writes (pipeline.Fingerprint).
type PipelineDefinition struct {
	Pipeline    string
	Topic       string
	Fingerprint string
	Definition  []byte // canonical JSON
}

// DefinitionChange is a configured pipeline whose definition differs from
// the one recorded under its name.
type DefinitionChange struct {
	Pipeline string
	// Recorded and RecordedAt are the recorded definition; Configured is
	// the one in the configuration.
	Recorded   PipelineDefinition
	RecordedAt time.Time
	Configured PipelineDefinition
}

// definitionsLockKey is the second key of the pg_advisory_xact_lock every
// instance takes (with the group's hash as the first) while it compares and
// records the definitions of its group, so that two instances starting at
// once agree on what is new and on adoption.
const definitionsLockKey = 0x7069706f // "pipo"

func groupLockKey(group string) int32 {
	h := fnv.New32a()
	h.Write([]byte(group))
	return int32(h.Sum32())
}

// RecordDefinitions compares defs with the definitions recorded for group,
// in one transaction under a transaction-scoped advisory lock of the
// group. When one differs it records nothing and returns every change
// (the caller refuses to start). Otherwise it records the pipelines new
// to the group and returns no change.
//
// Adoption: when the group has no pipeline recorded at all but already
// has positions in ratchet_offsets (a deployment from before the origins
// were recorded, in exactly-once mode), each pipeline's origin on every
// partition of its topic with a stored position is recorded there, as
// adopted: what lies before it may already be applied. adopted counts
// those origins.
//
// A database error is returned as it is: it never reads as "nothing
// recorded".
func RecordDefinitions(ctx context.Context, pool *pgxpool.Pool, group string, defs []PipelineDefinition) (changes []DefinitionChange, adopted int, err error) {
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		changes, adopted = nil, 0
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, $2)", groupLockKey(group), int32(definitionsLockKey)); err != nil {
			return fmt.Errorf("take the pipeline definitions lock: %w", err)
		}
		recorded, err := readDefinitions(ctx, tx, group)
		if err != nil {
			return err
		}
		changes = compareDefinitions(recorded, defs)
		if len(changes) > 0 {
			return nil // rolled back below: nothing is recorded
		}
		var names, topics, fps []string
		var docs []string
		for _, d := range defs {
			if _, ok := recorded[d.Pipeline]; ok {
				continue
			}
			names, topics, fps, docs = append(names, d.Pipeline), append(topics, d.Topic), append(fps, d.Fingerprint), append(docs, string(d.Definition))
		}
		if len(names) == 0 {
			return nil
		}
		if _, err := tx.Exec(ctx, `INSERT INTO ratchet_pipeline_definitions (consumer_group, pipeline, fingerprint, definition)
SELECT $1, n, f, d::jsonb FROM unnest($2::text[], $3::text[], $4::text[]) AS t(n, f, d)`, group, names, fps, docs); err != nil {
			return fmt.Errorf("record pipeline definitions: %w", err)
		}
		if len(recorded) > 0 {
			return nil
		}
		tag, err := tx.Exec(ctx, `INSERT INTO ratchet_pipeline_origins (consumer_group, pipeline, topic, partition, live_from, fingerprint, adopted)
SELECT $1, p.n, o.topic, o.partition, o.next_offset, p.f, true
FROM unnest($2::text[], $3::text[], $4::text[]) AS p(n, t, f)
JOIN ratchet_offsets o ON o.consumer_group = $1 AND o.topic = p.t
ON CONFLICT DO NOTHING`, group, names, topics, fps)
		if err != nil {
			return fmt.Errorf("adopt pipeline origins: %w", err)
		}
		adopted = int(tag.RowsAffected())
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	if len(changes) > 0 {
		return changes, 0, nil
	}
	return nil, adopted, nil
}

// CompareDefinitions returns the pipelines of defs whose definition
// differs from the one recorded for group, recording nothing (ratchet
// pipelines check).
//
// A database that ratchet has not migrated yet (no
// ratchet_pipeline_definitions table: no ratchet run has recorded
// anything there) has no change.
func CompareDefinitions(ctx context.Context, q Querier, group string, defs []PipelineDefinition) ([]DefinitionChange, error) {
	rows, err := q.Query(ctx, "SELECT to_regclass('ratchet_pipeline_definitions') IS NOT NULL")
	if err != nil {
		return nil, fmt.Errorf("look for ratchet_pipeline_definitions: %w", err)
	}
	migrated, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
	if err != nil {
		return nil, fmt.Errorf("look for ratchet_pipeline_definitions: %w", err)
	}
	if !migrated {
		return nil, nil
	}
	recorded, err := readDefinitions(ctx, q, group)
	if err != nil {
		return nil, err
	}
	return compareDefinitions(recorded, defs), nil
}

// Querier runs a query: a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

type recordedDefinition struct {
	PipelineDefinition
	at time.Time
}

func readDefinitions(ctx context.Context, q Querier, group string) (map[string]recordedDefinition, error) {
	rows, err := q.Query(ctx, `SELECT pipeline, fingerprint, definition::text, recorded_at
FROM ratchet_pipeline_definitions WHERE consumer_group = $1`, group)
	if err != nil {
		return nil, fmt.Errorf("read pipeline definitions: %w", err)
	}
	out := map[string]recordedDefinition{}
	var r recordedDefinition
	var doc string
	_, err = pgx.ForEachRow(rows, []any{&r.Pipeline, &r.Fingerprint, &doc, &r.at}, func() error {
		r.Definition = []byte(doc)
		out[r.Pipeline] = r
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read pipeline definitions: %w", err)
	}
	return out, nil
}

func compareDefinitions(recorded map[string]recordedDefinition, defs []PipelineDefinition) []DefinitionChange {
	var changes []DefinitionChange
	for _, d := range defs {
		r, ok := recorded[d.Pipeline]
		if ok && r.Fingerprint != d.Fingerprint {
			changes = append(changes, DefinitionChange{Pipeline: d.Pipeline, Recorded: r.PipelineDefinition, RecordedAt: r.at, Configured: d})
		}
	}
	return changes
}

// InsertOrigins records, in tx (the transaction of a batch that applies
// the pipelines live on topic[partition]), that each of pipelines is
// applied live there from liveFrom, with the fingerprint at the same
// index; an origin already recorded is kept (ON CONFLICT DO NOTHING). It
// returns the pipelines whose origin was already there, committed: those
// need no insert again. The ones it inserted are known only once tx
// commits.
func InsertOrigins(ctx context.Context, tx pgx.Tx, group, topic string, partition int32, liveFrom int64, pipelines, fingerprints []string) (present []string, err error) {
	rows, err := tx.Query(ctx, `WITH want AS (SELECT n, f FROM unnest($5::text[], $6::text[]) AS t(n, f)),
ins AS (
	INSERT INTO ratchet_pipeline_origins (consumer_group, pipeline, topic, partition, live_from, fingerprint)
	SELECT $1, n, $2, $3, $4, f FROM want
	ON CONFLICT DO NOTHING
	RETURNING pipeline)
SELECT n FROM want WHERE n NOT IN (SELECT pipeline FROM ins)`, group, topic, partition, liveFrom, pipelines, fingerprints)
	if err != nil {
		return nil, fmt.Errorf("record pipeline origins of %s[%d]: %w", topic, partition, err)
	}
	present, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("record pipeline origins of %s[%d]: %w", topic, partition, err)
	}
	return present, nil
}

// Origin is where a pipeline began on one partition.
type Origin struct {
	Pipeline    string
	Topic       string
	Partition   int32
	LiveFrom    int64
	LiveSince   time.Time
	Fingerprint string
	Adopted     bool
}

// Backfill is a backfill's position on one partition
// (ratchet_pipeline_backfills).
type Backfill struct {
	Pipeline string
	BackfillPosition
	StartedAt time.Time
}

// RecordedDefinition is a definition as recorded, with when.
type RecordedDefinition struct {
	PipelineDefinition
	RecordedAt time.Time
}

// PipelineRecords is everything recorded of a group's pipelines.
type PipelineRecords struct {
	Definitions []RecordedDefinition // by pipeline
	Origins     []Origin             // by pipeline, topic, partition
	Backfills   []Backfill           // by pipeline, topic, partition
}

// ReadPipelineRecords reads what is recorded of group's pipelines, in one
// snapshot.
func ReadPipelineRecords(ctx context.Context, pool *pgxpool.Pool, group string) (PipelineRecords, error) {
	var out PipelineRecords
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		out = PipelineRecords{}
		defs, err := readDefinitions(ctx, tx, group)
		if err != nil {
			return err
		}
		for _, d := range defs {
			out.Definitions = append(out.Definitions, RecordedDefinition{PipelineDefinition: d.PipelineDefinition, RecordedAt: d.at})
		}
		sortDefinitions(out.Definitions)
		rows, err := tx.Query(ctx, `SELECT pipeline, topic, partition, live_from, live_since, fingerprint, adopted
FROM ratchet_pipeline_origins WHERE consumer_group = $1 ORDER BY pipeline, topic, partition`, group)
		if err != nil {
			return fmt.Errorf("read pipeline origins: %w", err)
		}
		var o Origin
		if _, err := pgx.ForEachRow(rows, []any{&o.Pipeline, &o.Topic, &o.Partition, &o.LiveFrom, &o.LiveSince, &o.Fingerprint, &o.Adopted}, func() error {
			out.Origins = append(out.Origins, o)
			return nil
		}); err != nil {
			return fmt.Errorf("read pipeline origins: %w", err)
		}
		rows, err = tx.Query(ctx, `SELECT pipeline, topic, partition, from_offset, to_offset, next_offset, records, descending, started_at, updated_at
FROM ratchet_pipeline_backfills WHERE consumer_group = $1 ORDER BY pipeline, topic, partition`, group)
		if err != nil {
			return fmt.Errorf("read pipeline backfills: %w", err)
		}
		var b Backfill
		if _, err := pgx.ForEachRow(rows, []any{&b.Pipeline, &b.Topic, &b.Partition, &b.From, &b.To, &b.Next, &b.Records, &b.Descending, &b.StartedAt, &b.UpdatedAt}, func() error {
			out.Backfills = append(out.Backfills, b)
			return nil
		}); err != nil {
			return fmt.Errorf("read pipeline backfills: %w", err)
		}
		return nil
	})
	return out, err
}

func sortDefinitions(ds []RecordedDefinition) {
	slices.SortFunc(ds, func(a, b RecordedDefinition) int { return strings.Compare(a.Pipeline, b.Pipeline) })
}

// BackfillRunningError refuses to forget a pipeline that a backfill holds
// (its lease has not expired).
type BackfillRunningError struct {
	Pipeline string
	Owner    string
	Until    time.Time
}

func (e *BackfillRunningError) Error() string {
	return fmt.Sprintf("pipeline %s is being backfilled by %s (lease until %s): stop the backfill first, or wait for its lease to expire",
		e.Pipeline, e.Owner, e.Until.UTC().Format(time.RFC3339))
}

// Forgotten counts what ForgetPipeline removed.
type Forgotten struct {
	Definitions, Origins, Backfills, Leases int64
}

// ForgetPipeline removes everything recorded of pipeline in group: its
// definition, its origins, its backfill positions and lease, in one
// transaction under the group's definitions lock; a backfill that holds
// the pipeline's lease refuses it (*BackfillRunningError). With replace set, it
// then records replace as the pipeline's definition (ratchet pipelines
// reset: the configured definition, accepted on purpose; its origins are
// recorded again by the next batch applied live).
func ForgetPipeline(ctx context.Context, pool *pgxpool.Pool, group, pipeline string, replace *PipelineDefinition) (Forgotten, error) {
	var f Forgotten
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		f = Forgotten{}
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, $2)", groupLockKey(group), int32(definitionsLockKey)); err != nil {
			return fmt.Errorf("take the pipeline definitions lock: %w", err)
		}
		var owner string
		var until time.Time
		err := tx.QueryRow(ctx, `SELECT owner, expires_at FROM ratchet_pipeline_backfill_leases
WHERE consumer_group = $1 AND pipeline = $2 AND expires_at > now() FOR UPDATE`, group, pipeline).Scan(&owner, &until)
		switch {
		case err == nil:
			return &BackfillRunningError{Pipeline: pipeline, Owner: owner, Until: until}
		case !errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("read the backfill lease of pipeline %s: %w", pipeline, err)
		}
		for _, d := range []struct {
			table string
			n     *int64
		}{
			{"ratchet_pipeline_definitions", &f.Definitions},
			{"ratchet_pipeline_origins", &f.Origins},
			{"ratchet_pipeline_backfills", &f.Backfills},
			{"ratchet_pipeline_backfill_leases", &f.Leases},
		} {
			tag, err := tx.Exec(ctx, "DELETE FROM "+d.table+" WHERE consumer_group = $1 AND pipeline = $2", group, pipeline)
			if err != nil {
				return fmt.Errorf("forget pipeline %s: %s: %w", pipeline, d.table, err)
			}
			*d.n = tag.RowsAffected()
		}
		if replace != nil {
			if _, err := tx.Exec(ctx, `INSERT INTO ratchet_pipeline_definitions (consumer_group, pipeline, fingerprint, definition)
VALUES ($1, $2, $3, $4::jsonb)`, group, pipeline, replace.Fingerprint, string(replace.Definition)); err != nil {
				return fmt.Errorf("record pipeline %s: %w", pipeline, err)
			}
		}
		return nil
	})
	return f, err
}
