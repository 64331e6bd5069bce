// Package tracing makes ratchet's OpenTelemetry spans. It is the adapter
// the actors, the produce command and the dead-letter replay reach tracing
// through: they hold a *Tracer, and a nil *Tracer is tracing off, for which
// every method returns at once without allocating, building attributes or
// reading headers. The package depends on the OpenTelemetry API only; the
// SDK, its exporters and the OTEL_* variables are set up by package
// ratchet/internal/tracing/otlp, at the edge of the program.
//
// The life of one batch in a trace:
//
//   - A partition cuts a batch: StartBatch opens the `process <topic>` span
//     (kind CONSUMER) with the messaging attributes and, when the span is
//     recorded, one link per record to the producer's context in its W3C
//     `traceparent` header, at most MaxLinks of them (the rest are counted
//     as dropped).
//   - Each poison record of the batch goes to the dead-letter topic under a
//     `send <dlq topic>` span (kind PRODUCER), child of the batch; the dead
//     letter carries that span's `traceparent` (Send.Headers), so the DLQ
//     record leads back to the batch that refused it.
//   - Every attempt at the batch's transaction is a child span
//     `transaction` whose outcome is committed, refused (by the offset
//     guard) or rolled_back; a retry is an event `retry` on the batch with
//     the error class, a bisection step an event `bisect`.
//   - The batch span ends with the batch: applied, fenced, or abandoned
//     (its status then says why).
//   - The committer's Kafka commit is a `commit` span linking to the last
//     batch of every partition it commits.
//
// Stops, revokes and claims are spans of their own (Start), so a slow
// rolling restart reads as a sequence of spans.
package tracing
