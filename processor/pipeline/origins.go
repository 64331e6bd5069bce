package pipeline

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"

	"ratchet/internal/store"
)

// origins records where each pipeline began on each partition
// (ratchet_pipeline_origins): in the transaction of the first batch a
// pipeline applies live on a partition, the batch's first offset and the
// pipeline's fingerprint. It remembers, per partition, the pipelines whose
// origin it found committed, so that it does not ask again; an origin it
// inserted itself is not remembered until a later batch finds it there
// (the batch that inserted it may still be rolled back).
type origins struct {
	group string
	mu    sync.Mutex // guards known; Process runs for many partitions at once
	known map[originKey]map[string]bool
}

type originKey struct {
	topic     string
	partition int32
}

// RecordOrigins makes p record, in each batch's transaction, where each
// pipeline of the batch's topic began on its partition for consumer
// group group, until it finds that origin committed. ratchet run calls
// it; ratchet pipelines check --sample does not.
func (p *Processor) RecordOrigins(group string) {
	p.origins = &origins{group: group, known: map[originKey]map[string]bool{}}
}

// record inserts the origins of pls on b's partition that are not known
// yet, in tx. A failure is the database's and fails the batch (it is
// retried), never taken for an origin that is there.
func (o *origins) record(ctx context.Context, tx pgx.Tx, topic string, partition int32, start int64, pls []*pipeline) error {
	k := originKey{topic, partition}
	o.mu.Lock()
	known := o.known[k]
	var names, fps []string
	for _, pl := range pls {
		if !known[pl.name] {
			names, fps = append(names, pl.name), append(fps, pl.fingerprint)
		}
	}
	o.mu.Unlock()
	if len(names) == 0 {
		return nil
	}
	present, err := store.InsertOrigins(ctx, tx, o.group, topic, partition, start, names, fps)
	if err != nil {
		return err
	}
	if len(present) == 0 {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.known[k] == nil {
		o.known[k] = map[string]bool{}
	}
	for _, n := range present {
		o.known[k][n] = true
	}
	return nil
}
