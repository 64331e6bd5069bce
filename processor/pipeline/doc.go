// Package pipeline runs the pipelines declared in ratchet's configuration
// (the pipelines: list) as one processor.Processor: it writes what the
// records of a topic say into the user's own tables, keeping the latest
// row per key (upsert), aggregating per group and time bucket (rollup) or
// inserting one row per record (append), without Go code.
//
// Its moving parts:
//
//   - Compile (compile.go) turns the configuration into a Set: every CEL
//     expression compiled once, each problem a *config.Error line naming
//     its key path (pipelines[1].rollup.aggregates.revenue), exit code 2.
//     It refuses an upsert that shares its table with another pipeline
//     (the two would apply in pipeline order, not offset order), and an
//     append that shares one with a rollup; rollups may share with
//     rollups, appends with appends.
//
//   - Decoder (decode.go) turns a record value into what the expressions
//     read as value: a JSON document into maps, lists, strings, int64,
//     float64 and bools; a ratchet.v1.Event (format event) stays the
//     message the topic's decoder made. Compile learns which fields of
//     value the expressions of each topic read (reads.go), and the
//     topic's JSON decoder builds only those (partial.go: an object read
//     at some keys is a slice of their values, not a map, made the map
//     only for an expression the interpreter evaluates), refusing
//     exactly what the full decode refuses; ReadPaths hands the same
//     paths to the Avro and Protobuf decoders (internal/schemareg).
//
//   - Check (schema.go) compares every pipeline with the database: the
//     table and its columns exist and a unique constraint or primary key
//     covers exactly the upsert key, or the rollup's group columns and
//     bucket column (an append needs none). It also learns each column's type, which decides how
//     the writes send its values (wire.go: typed arrays for the common
//     types, text cast in the statement for the others).
//
//   - toTime (times.go) reads every time a pipeline takes (a rollup's
//     time, timestamp columns): a timestamp, RFC 3339 with a zone, or
//     epoch milliseconds within the pipeline's epoch_millis_window of the
//     record's timestamp, always within what a timestamptz holds.
//     Every evaluation of an expression whose cost grows with the record
//     is bounded by the pipeline's cost_limit (a record error past it) and
//     stopped by the batch's context (a retry, ErrInterrupted).
//
//   - Processor (processor.go) applies a batch: for each record, in offset
//     order, every pipeline of its topic evaluates its expressions; upsert
//     rows are ranked per key (rank n: each key's n-th record of the
//     batch), rollups fold per group and bucket in memory, keys compared
//     as their columns compare them (wire.go, keyOf); then each pipeline
//     writes its rows in set-based statements in the batch's transaction:
//     an upsert one delete and one upsert per rank, in rank order, so
//     PostgreSQL judges every version as if applied one by one (and only
//     a newer version replaces a row when upsert.version is set); a rollup
//     one merge; an append one COPY in text format, sent at once
//     (append.go). Each statement also collapses its rows by PostgreSQL's
//     own equality, so ON CONFLICT never meets a row twice.
//
//   - Fingerprint (fingerprint.go) hashes what decides what a pipeline
//     writes, in a canonical form that formatting, comments and key order
//     do not change; ratchet run records it per pipeline at start and
//     refuses a pipeline whose definition changed under its name.
//     RecordOrigins (origins.go) makes the Processor record, in the
//     transaction of the first batch it applies on a partition, the
//     offset from which each pipeline is applied live there.
//
//   - Backfill (backfill.go): Set.Only is the set of one pipeline, what
//     `ratchet pipelines backfill NAME` applies to the history before the
//     pipeline began live; Backfillable refuses the pipelines whose table
//     it could not fill as if the pipeline had been there from the start
//     (an upsert with on_tombstone delete). A record carrying the header
//     ratchet.backfill (a backfill's, or a replayed dead letter of one) is
//     applied by the pipeline it names only, and, for an upsert without
//     upsert.version, as older than every row of the table: it writes a
//     row only where the table has none for its key, the newest of a key
//     first (BackfillDescending: such a backfill reads from the end down).
//
// The life of one record: the partition decodes it (Decoder); the batch
// reaches Processor.Process; each pipeline of the topic evaluates it. A
// record that any pipeline cannot evaluate is refused with a
// processor.Permanent error naming the pipeline and taken out of the
// batch (processor.Reject): what the pipelines before took of it is
// undone, and the engine dead-letters it once with the batch, whose other
// records all pipelines apply in one transaction. Where the transaction
// does not take it (processor.Reject false), the error fails the batch
// and the engine bisects it until the record stands alone; the dead
// letter is the same. A value PostgreSQL refuses (SQLSTATE classes 22 and
// 23) can only be isolated that way: once bisection has left the record
// alone, its statements run at once, so the error names the pipeline too.
package pipeline
