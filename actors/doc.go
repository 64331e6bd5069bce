// Package actors is ratchet's processing core: the Kafka consumer's poll
// loop, one actor per assigned partition that applies its records in order
// to PostgreSQL, the committer that turns applied positions into Kafka
// commits, and the DLQ actor that owns the dead-letter producer. The engine
// (package engine) builds the parts, wires them and runs Supervisor.Run;
// this package decides everything that happens to a record in between.
//
// # The actor tree
//
//	root (engine)
//	├── supervisor                  supervisorActor: spawns and supervises partitions (supervision.go)
//	│   ├── partition-<t>-<p>-<gen> Partition: queue, cut, one batch in flight (partition.go)
//	│   │   └── (retry)             retry: applies a batch, retries, bisects, dead-letters (retry.go)
//	│   └── ...
//	├── committer                   Committer: watermarks → one Kafka commit per interval (committer.go)
//	└── dlq                         DLQ: the dead-letter producer and its delivery reports (dlq.go)
//
//	poll loop                       not an actor: the goroutine that calls Supervisor.Run; it alone
//	                                calls Poll, so it also runs the rebalance callback (rebalance.go)
//
// The supervisor actor does no I/O. It exists so that partition actors are
// its children, under its strategy (supervisorActor.HandleFailure:
// one-for-one, restart within supervision.max_restarts per
// supervision.within, stop and end the engine past it). The poll loop owns
// the consumer and the map of assigned partitions; it talks to the actors
// with messages and futures, and the actors talk back to it through two
// channels it drains between polls: seek requests (Supervisor.requestSeek)
// and partitions over their restart budget.
//
// # Messages
//
// Who sends what to whom, and when (messages.go, moved.go, and the
// unexported types next to their receiver):
//
//	message            from → to                       when
//	spawnPartition     poll loop → supervisor          assign callback; RequestFuture, reply *actor.PID
//	Register           poll loop → committer           assign callback, before the partition's first record;
//	                                                   also park, for a partition that came back while stopping
//	Records            poll loop → partition           each poll round (flushPending), in offset order
//	lingerExpired      partition timer → partition     the oldest queued record waited processing.batch_linger
//	lookedUp           lookup goroutine → partition    a Resolver's lookups (schema registry) finished
//	applyBatch         partition → retry               one batch at a time; again with isolatePanics
//	batchDone          retry → partition               the batch is applied, refused, panicked or abandoned
//	OffsetApplied      partition → committer           after each committed batch transaction
//	OffsetMoved        partition → committer           the offset guard refused a batch under the partition's
//	                                                   own epoch (`ratchet offsets reset` moved it)
//	Seeked             poll loop → partition           answer to a seek request (restart, rewind)
//	Drain / Drained    poll loop → partition           revoke and stop; RequestFuture, answered once the
//	                                                   batch in flight (and those cut ahead) are applied
//	Flush / Flushed    poll loop → committer           revoke, stop; RequestFuture, synchronous commit
//	Forget             poll loop → committer           after a revoke's commit, or a lost assignment
//	Rejoined           poll loop → committer           an assign callback that completes a rebalance
//	commitTick         committer timer → committer     commit.interval after the first change
//	deadLetterRequest  DLQClient → dlq                 a batch has records to dead-letter; RequestFuture,
//	                                                   reply deadLettered or deadLetterFailed
//	cancelDeadLetter   DLQClient → dlq                 the caller stopped waiting (timeout, ctx ended)
//	delivered          producer events → dlq           one delivery report
//	reproduce          dlq timer → dlq                 retry a failed dead-letter write after a backoff
//
// Observers (the page, readiness, lag) read no actor state: the partition,
// its retry child and the committer publish counters in Progress
// (atomics), and the poll loop publishes a snapshot to the Board about once
// a second (status.go).
//
// # The life of one record, from Poll to COMMIT
//
//  1. Poll. The poll loop (Supervisor.poll, supervisor.go) calls
//     consumer.Poll and keeps each *kafka.Message in its partition's
//     pending list (handle). Before every poll, backpressure (budget.go)
//     looks at the instance's memory budget and at the partitions over
//     their cap: with its shared half full the loop holds off, then pauses
//     the partitions above their reserve; above its
//     cap (its share of processing.memory_budget, at most
//     processing.max_buffered_per_partition records) a partition makes the
//     loop hold off for up to holdFor, then is paused; it resumes below
//     half. A round ends early when a partition reaches what it may
//     hold. Records fetched while the consumer stops are
//     dropped.
//  2. Records. At the end of a poll round flushPending adds the round's
//     records and their bytes to the partition's Held count (and the
//     budget) and sends them as one Records message, stamped with the
//     partition's seek generation; the partition releases them when they
//     are applied or dropped.
//  3. Queue and cut. The partition actor (Partition.enqueue) drops records
//     of an older seek generation, records it already queued or applied
//     (a redelivery), and everything while it waits for a seek or after it
//     was fenced; the rest go undecoded into its queue. maybeDispatch cuts
//     a batch when processing.batch_size records are queued or the oldest
//     waited processing.batch_linger (lingerExpired); a partition with more
//     queued (behind) takes up to processing.max_batch_size in it
//     (PartitionConfig.MaxBatch), fewer transactions for a backlog. cut decodes the
//     records (ValueDecoder; a Resolver's lookups first, see awaitLookups)
//     and starts the dead-letter write of those that do not decode, on a
//     goroutine that calls DLQClient.DeadLetter (sendDeadLetters). While a
//     batch is in flight, up to cutAhead more (fewer grown ones: ahead) are cut and their dead
//     letters started, so the DLQ round trip overlaps the transactions
//     before them.
//  4. applyBatch. The partition sends the batch to its retry child: never
//     more than one, so the partition's watermark is always contiguous.
//  5. The transaction. retry.apply calls Applier.ApplyWith
//     (store.Store.ApplyWith) after the batch's dead letters are durable
//     (safeApply waits for them, before any connection is taken). The
//     processor writes through the batch's transaction; then one round
//     trip sends, in order: BEGIN if nothing began yet, in exactly-once
//     mode the dead-letter rows and the guarded advance of
//     ratchet_offsets (ratchet_advance: epoch and start must match, else
//     SQLSTATE RT409 and a rollback), the processor's deferred statements,
//     and COMMIT. Failures are classified here: transient ones
//     (store.IsTransient) are retried with backoff for as long as they
//     last (the partition reports degraded); record errors
//     (store.IsRecordError, processor.Permanent) and unclassified ones
//     after retry.max_attempts are isolated by bisecting the batch, each
//     bad record dead-lettered (DLQ actor, below) and the offset moved past
//     it. A record the processor refuses before sending anything is taken
//     out of the batch instead (reject.go): its letter is made durable
//     within RejectWait before the transaction commits, and its row joins
//     it; past the wait the batch is bisected as before. An overlap under the partition's own epoch ending where this
//     batch ends is an earlier attempt whose COMMIT answer was lost.
//  6. batchDone. The retry actor reports to its parent. Applied: the
//     partition moves its watermark (state.next, Progress.Next), sends
//     OffsetApplied to the committer and sends the next batch cut ahead.
//     Otherwise (Partition.batchDone): a processor panic is re-raised for
//     supervision (below) until the batch start has panicked PanicLimit
//     times, then the batch is sent again with isolatePanics; a refusal
//     under its own epoch moves the watermark to the stored offset
//     (OffsetMoved) and rewinds; a refusal under another epoch (fenced)
//     stops the partition from writing for good; an abandoned batch (a
//     dead-letter write that failed) rewinds: the partition asks the poll
//     loop to seek back to its watermark and drops what it holds.
//  7. OffsetApplied. The committer keeps the highest watermark per
//     partition and assignment generation (a lower one is ignored and
//     counted) and arms one timer: commitTick, commit.interval later,
//     commits every partition ahead of Kafka in one CommitOffsets call,
//     however many batches were applied meanwhile. A commit the group
//     refuses while it rebalances (GroupRefusal, group.go) is made again
//     at the next Rejoined. Commits go through the CommitGate, which
//     keeps them from a consumer whose Close has begun (commitgate.go).
//
// Kafka's commit is what lag tools read. In exactly-once mode it is not
// what resumes a partition: step 5 stored the position in the same
// transaction as the results, and the next owner's claim starts there.
//
// # Dead letters
//
// A record goes to the dead-letter topic from two places: the partition
// when a value does not decode (step 3) and the retry actor when isolation
// pins a batch's failure on it (step 5). Both call sendDeadLetters (deadletter.go, with the rest of the plumbing), which
// logs the letter through the instance's DeadLetterLog (deadletterlog.go:
// the first of a topic and reason class in full, then a summary per
// interval), runs DLQClient.DeadLetter on a goroutine and hands back
// a dlqWait to wait on plus the rows that record the letters in
// ratchet_dead_letters in the next transaction. DLQClient asks the DLQ
// actor with a RequestFuture (bounded by DefaultDLQTimeout, cancelled with
// cancelDeadLetter when its caller stops waiting). The DLQ actor produces
// each letter (original key, value, headers and timestamp, then the
// ratchet.* headers), retries a failed delivery with backoff (reproduce),
// and answers only when every delivery report is in: no transaction that
// moves the offset past a record commits before the record is durable in
// the DLQ. When it stops or restarts it fails what it still holds
// (ErrDLQStopped); the partition then reads the batch again.
//
// # Supervision
//
// A processor panic reaches the partition actor as a *PanicError in
// batchDone and is re-raised there. supervisorActor.HandleFailure logs
// "partition actor restarted" with the offset, counts it and restarts the
// actor; partitionState survives the restart, so the new incarnation
// (Partition.started) asks the poll loop to seek to its watermark and
// ignores records until Seeked confirms a new seek generation. Nothing is
// skipped and nothing applied twice. Past the restart budget the partition
// actor is stopped and the poll loop ends the engine with an error.
//
// # Revoke, stop and reconnect
//
// Revoke (rebalance.go) runs inside the rebalance callback, inside Poll:
// Drain every revoked partition and wait, Flush their watermarks (retried
// with backoff until the drain timeout, since inside the callback the
// group takes commits, see group.go), Forget them in the committer, stop their
// actors, IncrementalUnassign. A lost assignment skips the drain and the
// commit: another member may own the partitions already.
//
// Assign claims each new partition before it is consumed
// (Supervisor.startOffsets: exactly-once, epoch + 1 and the stored offset;
// at-least-once, Kafka's committed offset or what this instance applied
// before losing the partition), spawns its actor, Registers it with the
// committer and assigns it at that explicit offset; the decisions are the
// pure functions of start.go. A partition whose start cannot be read
// (committed offset, log bounds: an error is never "no offset") or whose
// claim fails is assigned but held paused, and claims.go retries it with
// backoff from the poll loop; once claimed it is moved to its start and
// resumed (readiness says degraded meanwhile).
//
// Stop (stop.go) ends the engine and every consumer rebuild (recycle, a
// fatal error, brokers down too long, no assignment within
// AssignmentTimeout: assignwait.go): pause every partition and drop what
// arrives, Drain all partitions while polling, Flush while polling (a
// refusal is committed again from the next assign callback, commitHeld),
// Unsubscribe a dynamic member, Close the consumer with what is left of
// shutdown.timeout, and stop the partition actors. group.go explains why
// the loop must keep polling throughout. The engine then stops the DLQ
// actor (its producer flushes with what is left of shutdown.timeout) and
// the committer, and closes the pool.
//
// # Waiting for an assignment
//
// From the subscribe, and from a revoke that leaves it nothing (a lost
// assignment), until the next assign callback, the member waits for the
// group (assignwait.go). The poll loop logs the wait at INFO after a few
// seconds and at WARN past the session timeout, naming what the group
// waits for and the remedy, publishes it on the Board (/readyz) and in
// ratchet_assignment_wait_seconds, and past AssignmentTimeout (2 ×
// session timeout + shutdown.timeout) rebuilds the consumer: a supervised
// restart of the consumer, against the partition actors' restart budget.
//
// # Tracing
//
// With a *tracing.Tracer in the configs (nil: off, one nil check a batch)
// a batch's `process` span starts when the partition cuts it (cut) and
// travels in applyBatch; the retry actor opens a `transaction` child per
// attempt (safeApply), adds retry and bisect events, and ends the span with
// the outcome (Receive); sendDeadLetters opens a `send <dlq topic>` child
// per letter, whose context Letter.Trace gives the dead letter's headers
// (DLQ.produce). OffsetApplied carries the batch's Ref to the committer,
// whose commit span links to it. Stop, revoke and claim spans are the
// poll loop's (Supervisor.trace); a flush under one makes its commit span a
// child. The actors see only package tracing, never the SDK.
package actors
