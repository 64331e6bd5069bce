// Package store is ratchet's PostgreSQL side: the connection pool, the
// embedded schema migrations, the exactly-once offset store and the error
// predicates the retry logic branches on.
//
// Exactly-once works by moving a partition's stored position in the same
// transaction as the processor's writes (see Store.Apply). The row in
// ratchet_offsets carries an epoch that ClaimPartition raises by one each
// time an instance takes the partition, so a batch of a previous owner is
// refused (fenced) and rolled back whatever the Kafka consumer does.
package store
