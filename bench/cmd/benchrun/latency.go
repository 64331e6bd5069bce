package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"ratchet/config"
	"ratchet/internal/produce"
	"ratchet/processor/dashboard"
)

// latencyResult is produce-to-committed latency at a steady rate.
type latencyResult struct {
	Rate             float64 // achieved events/s
	Events           int
	P50, P99, Max    time.Duration // measured outside the engine (see measureLatency)
	HistP50, HistP99 time.Duration // from ratchet_end_to_end_latency_seconds
}

// sent is one delivered record: where it landed and when it was produced.
type sent struct {
	offset int64
	at     time.Time
}

// offsetChange is a stored offset observed at a time.
type offsetChange struct {
	at   time.Time
	next int64
}

// pacedProducer writes generated events to topic at rate for d and records
// every delivered record's partition, offset and produce time.
func pacedProducer(ctx context.Context, brokers []string, topic string, rate float64, d time.Duration, seed int64) (map[int32][]sent, int, error) {
	p, err := kafka.NewProducer(&kafka.ConfigMap{
		"bootstrap.servers": strings.Join(brokers, ","), "linger.ms": 5, "compression.type": "lz4",
		"queue.buffering.max.messages": 1000000, "log_level": 3,
	})
	if err != nil {
		return nil, 0, fmt.Errorf("producer: %w", err)
	}
	out := map[int32][]sent{}
	failed := 0
	var wg sync.WaitGroup
	wg.Go(func() { // ends when p.Close closes the events channel
		for ev := range p.Events() {
			m, ok := ev.(*kafka.Message)
			if !ok {
				continue
			}
			if m.TopicPartition.Error != nil {
				failed++
				continue
			}
			out[m.TopicPartition.Partition] = append(out[m.TopicPartition.Partition],
				sent{offset: int64(m.TopicPartition.Offset), at: m.Opaque.(time.Time)})
		}
	})
	gen := produce.NewGenerator(produce.Options{Seed: seed})
	start := time.Now()
	total := int64(rate * d.Seconds())
	var n int64
	for n < total && ctx.Err() == nil {
		due := min(int64(rate*time.Since(start).Seconds())+1, total)
		for ; n < due; n++ {
			key, value, _, _ := gen.Next()
			now := time.Now()
			msg := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny},
				Key: key, Value: value, Timestamp: now, Opaque: now}
			for {
				err := p.Produce(msg, nil)
				if err == nil {
					break
				}
				if kerr, ok := err.(kafka.Error); !ok || kerr.Code() != kafka.ErrQueueFull {
					p.Close()
					wg.Wait()
					return nil, 0, fmt.Errorf("produce: %w", err)
				}
				p.Flush(5)
			}
		}
		time.Sleep(500 * time.Microsecond) // pacing, not waiting for a result
	}
	for p.Len() > 0 && time.Since(start) < d+30*time.Second {
		p.Flush(100)
	}
	p.Close()
	wg.Wait()
	if failed > 0 {
		return nil, 0, fmt.Errorf("%d records not delivered", failed)
	}
	return out, int(n), nil
}

// measureLatency runs the engine (exactly-once, dashboard, defaults) on
// topic, produces at rate for d and measures, for every record, the time
// from its produce call to the first moment the stored offset of its
// partition in ratchet_offsets was seen past it (polled every 5 ms, so the
// figures are up to 5 ms high). The first warmup of records are left out.
func measureLatency(ctx context.Context, env *benchEnv, topic, group string, rate float64, d, warmup time.Duration) (latencyResult, error) {
	cfg := env.config(env.brokers, topic, group, config.ModeExactlyOnce)
	e := startEngine(ctx, cfg, dashboard.New(), env.engineLog)
	defer func() { _ = e.stop() }()
	// Ready once every partition is claimed.
	deadline := time.Now().Add(60 * time.Second)
	for {
		var n int
		if err := env.db.pool.QueryRow(ctx, `SELECT count(*) FROM ratchet_offsets WHERE consumer_group=$1 AND topic=$2`,
			group, topic).Scan(&n); err != nil {
			return latencyResult{}, err
		}
		if n >= 12 {
			break
		}
		if time.Now().After(deadline) {
			return latencyResult{}, fmt.Errorf("latency: only %d partitions claimed after 60s", n)
		}
		time.Sleep(50 * time.Millisecond)
	}

	changes := map[int32][]offsetChange{}
	pollCtx, stopPoll := context.WithCancel(ctx)
	var pollErr error
	var wg sync.WaitGroup
	wg.Go(func() { // ends when stopPoll is called
		last := map[int32]int64{}
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-pollCtx.Done():
				return
			case <-t.C:
			}
			rows, err := env.db.pool.Query(pollCtx, `SELECT partition, next_offset FROM ratchet_offsets
				WHERE consumer_group=$1 AND topic=$2`, group, topic)
			if err != nil {
				if pollCtx.Err() == nil {
					pollErr = err
				}
				return
			}
			now := time.Now()
			for rows.Next() {
				var p int32
				var next int64
				if err := rows.Scan(&p, &next); err != nil {
					pollErr = err
					rows.Close()
					return
				}
				if next != last[p] {
					last[p] = next
					changes[p] = append(changes[p], offsetChange{at: now, next: next})
				}
			}
			rows.Close()
		}
	})
	start := time.Now()
	recs, n, err := pacedProducer(ctx, env.brokers, topic, rate, d, 20000)
	elapsed := time.Since(start)
	if err != nil {
		stopPoll()
		wg.Wait()
		return latencyResult{}, err
	}
	// Wait until the last record of every partition is stored.
	ends := map[int32]int64{}
	for p, rs := range recs {
		ends[p] = rs[len(rs)-1].offset + 1
	}
	deadline = time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		ok := true
		for p, end := range ends {
			var next int64
			if err := env.db.pool.QueryRow(ctx, `SELECT next_offset FROM ratchet_offsets WHERE consumer_group=$1 AND topic=$2 AND partition=$3`,
				group, topic, p).Scan(&next); err != nil || next < end {
				ok = false
				break
			}
		}
		if ok {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // one more poll round
	stopPoll()
	wg.Wait()
	if pollErr != nil {
		return latencyResult{}, fmt.Errorf("poll offsets: %w", pollErr)
	}
	var lats []time.Duration
	cut := start.Add(warmup)
	for p, rs := range recs {
		ch := changes[p]
		j := 0
		for _, r := range rs {
			for j < len(ch) && ch[j].next <= r.offset {
				j++
			}
			if j == len(ch) {
				return latencyResult{}, fmt.Errorf("partition %d offset %d never stored", p, r.offset)
			}
			if r.at.Before(cut) {
				continue
			}
			lats = append(lats, ch[j].at.Sub(r.at))
		}
	}
	slices.Sort(lats)
	res := latencyResult{Rate: float64(n) / elapsed.Seconds(), Events: len(lats)}
	if len(lats) > 0 {
		res.P50 = lats[len(lats)/2]
		res.P99 = lats[min(len(lats)-1, len(lats)*99/100)]
		res.Max = lats[len(lats)-1]
	}
	res.HistP50, res.HistP99 = histQuantile(e, "ratchet_end_to_end_latency_seconds", 0.5), histQuantile(e, "ratchet_end_to_end_latency_seconds", 0.99)
	return res, nil
}

// histQuantile estimates a quantile of a histogram family of the engine's
// registry like Prometheus' histogram_quantile (linear inside a bucket).
func histQuantile(e *runningEngine, name string, q float64) time.Duration {
	mfs, err := e.reg.Gather()
	if err != nil {
		return 0
	}
	type bucket struct{ upper, count float64 }
	var bs []bucket
	var total float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			if h == nil {
				continue
			}
			total += float64(h.GetSampleCount())
			for i, b := range h.GetBucket() {
				if i >= len(bs) {
					bs = append(bs, bucket{upper: b.GetUpperBound()})
				}
				bs[i].count += float64(b.GetCumulativeCount())
			}
		}
	}
	if total == 0 {
		return 0
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].upper < bs[j].upper })
	rank := q * total
	lower, prev := 0.0, 0.0
	for _, b := range bs {
		if b.count >= rank {
			frac := (rank - prev) / math.Max(b.count-prev, 1)
			return time.Duration((lower + frac*(b.upper-lower)) * float64(time.Second))
		}
		lower, prev = b.upper, b.count
	}
	return time.Duration(lower * float64(time.Second)) // above the last bucket
}
