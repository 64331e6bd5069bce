package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"

	"ratchet/internal/chaos"
	"ratchet/internal/event"
	"ratchet/internal/produce"
	"ratchet/internal/testenv"
)

// TestPanickyProcessor runs the chaos build of ratchet (test/chaos/panicky)
// as two members of a group against the test broker and PostgreSQL while a
// producer writes 3,000 events (1 % poison) at 500 a second. The dashboard
// panics once per process on the events RATCHET_CHAOS_PANIC_EVERY chooses
// and at every attempt on those RATCHET_CHAOS_PANIC_ALWAYS chooses. Every
// restart is a planned panic, logged and counted: one per process for an
// event chosen once, four or five (about retry.max_attempts) before an
// event that always panics is isolated, hence a restart budget of 100. No
// member exits, ratchet_held_bytes returns to 0, every good event is
// counted exactly once (exactly-once mode), and the dead-letter topic holds
// the poison and the always-panicking records, nothing else; a dead letter is
// written again only where a planned restart read its batch again.
func TestPanickyProcessor(t *testing.T) {
	const (
		partitions = 4
		rate       = 500
		total      = 3000
	)
	choice := chaos.PanicChoice{Every: 250, Always: 1000}
	bin := testenv.BuildPanicky(t, "")
	cluster, addr := testenv.Kafka(t, partitions, topic, dlqTopic)
	dbURL := testenv.Postgres(t)
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	dir, err := os.MkdirTemp("", "ratchet-chaos-panic-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // the logs stay when the test fails
		if !t.Failed() {
			_ = os.RemoveAll(dir)
		}
	})
	env := []string{
		"RATCHET_KAFKA_BROKERS=" + addr, "RATCHET_POSTGRES_URL=" + dbURL,
		"RATCHET_COMMIT_MODE=" + chaos.ExactlyOnce, "RATCHET_COMMIT_INTERVAL=" + commitInterval.String(),
		"RATCHET_RETRY_MAX_BACKOFF=2s", "RATCHET_LOG_LEVEL=info", "RATCHET_KAFKA_INSTANCE_ID=",
		"RATCHET_LOG_DEAD_LETTERS=each", // readPanicLogs reads every dead letter's line
		"RATCHET_SUPERVISION_MAX_RESTARTS=100",
		"RATCHET_KAFKA_PROPERTIES=session.timeout.ms=6000,heartbeat.interval.ms=500",
		chaos.EnvPanicEvery + "=" + strconv.FormatUint(choice.Every, 10),
		chaos.EnvPanicAlways + "=" + strconv.FormatUint(choice.Always, 10),
	}
	var procs []*testenv.Process
	for i := range 2 {
		procs = append(procs, testenv.StartProcess(t, bin, testenv.ProcessOptions{
			Name: fmt.Sprintf("p%d", i), Env: env, LogDir: dir, HTTP: true}))
	}

	// The load, paced, every delivery recorded.
	type sent struct {
		id        string
		poison    bool
		partition int32
		offset    int64
		key       bucketKey
		value     float64
	}
	g := produce.NewGenerator(produce.Options{Seed: 24, Format: event.FormatProtobuf, PoisonFraction: 0.01,
		TimeSpread: 30 * 24 * time.Hour, Now: func() time.Time { return time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC) }})
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": addr, "linger.ms": 5,
		"enable.idempotence": true, "acks": "all", "log_level": 3})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	deliveries := make(chan kafka.Event, total)
	tick := time.NewTicker(20 * time.Millisecond) // pacing of the load
	tp := topic
	for n := 0; n < total; {
		<-tick.C
		for range rate / 50 {
			k, v, ev, poison := g.Next()
			s := sent{poison: poison}
			if ev != nil {
				s.id, s.value = ev.Id, ev.Value
				s.key = bucketKey{ev.Metric, ev.Time.AsTime().UTC().Truncate(time.Minute)}
			}
			if err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &tp, Partition: kafka.PartitionAny},
				Key: k, Value: v, Opaque: s}, deliveries); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	tick.Stop()
	for p.Flush(1000) > 0 {
	}
	want := map[bucketKey]agg{}
	dead := map[[2]int64]bool{}
	once, always := 0, 0
	for range total {
		m := (<-deliveries).(*kafka.Message)
		if m.TopicPartition.Error != nil {
			t.Fatalf("delivery: %v", m.TopicPartition.Error)
		}
		s := m.Opaque.(sent)
		at := [2]int64{int64(m.TopicPartition.Partition), int64(m.TopicPartition.Offset)}
		switch {
		case s.poison:
			dead[at] = true
		case choice.Poison(s.id):
			dead[at] = true
			always++
		default:
			if choice.Chosen(s.id) {
				once++
			}
			a := want[s.key]
			a.count++
			a.sum += s.value
			want[s.key] = a
		}
	}
	if once == 0 || always == 0 {
		t.Fatalf("the load holds %d events chosen to panic once and %d always; the test exercises nothing", once, always)
	}

	r := &run{t: t, pool: pool, cluster: cluster, addr: addr}
	testenv.Eventually(t, 90*time.Second, func() bool {
		got, err := r.rollups()
		return err == nil && covered(want, got, false) && r.dlqSize() >= int64(len(dead))
	}, "%d buckets counted and %d dead letters written", len(want), len(dead))

	var restarts float64
	for _, pr := range procs {
		if !pr.Running() {
			t.Fatalf("%s exited on its own (code %d); log %s", pr.Name, pr.ExitCode(), pr.LogPath)
		}
		v, _, err := pr.Metric(context.Background(), "ratchet_actor_restarts_total")
		if err != nil {
			t.Fatal(err)
		}
		restarts += v
		// What the panicking incarnations held is given back.
		testenv.Eventually(t, 30*time.Second, func() bool {
			v, found, err := pr.Metric(context.Background(), "ratchet_held_bytes")
			return err == nil && found && v == 0
		}, "%s's ratchet_held_bytes back to 0 once idle", pr.Name)
	}
	for _, pr := range procs {
		pr.Signal(syscall.SIGTERM)
		select {
		case <-pr.Exited():
		case <-time.After(40 * time.Second):
			t.Fatalf("%s still running 40 s after SIGTERM; log %s", pr.Name, pr.LogPath)
		}
		if code := pr.ExitCode(); code != 0 {
			t.Errorf("%s exited %d after SIGTERM; log %s", pr.Name, code, pr.LogPath)
		}
	}

	// Every restart was a planned panic, and every planned panic restarted
	// its partition actor: once per process for an event chosen once.
	logs := readPanicLogs(t, dir)
	restarted := logs.restarts
	plannedOnce, plannedAlways := 0, 0
	for _, pr := range restarted {
		if pr.always {
			plannedAlways++
		} else {
			plannedOnce++
		}
	}
	if float64(len(restarted)) != restarts {
		t.Errorf("%d restarts logged, ratchet_actor_restarts_total says %v", len(restarted), restarts)
	}
	if plannedOnce < once || plannedOnce > len(procs)*once {
		t.Errorf("%d restarts for events chosen to panic once; want from %d to %d (once per process)", plannedOnce, once, len(procs)*once)
	}
	if plannedAlways < always {
		t.Errorf("%d restarts for events that always panic; want at least one for each of %d", plannedAlways, always)
	}

	got, err := r.rollups()
	if err != nil {
		t.Fatal(err)
	}
	for k, w := range want {
		if have := got[k]; have.count != w.count {
			t.Errorf("%s@%s counted %d times, want %d", k.metric, k.bucket.Format(time.DateTime), have.count, w.count)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d rollup rows, want %d", len(got), len(want))
	}
	// A batch's dead letters are written before its transaction; a panic
	// rolls the transaction back and the restart reads the batch again and
	// writes them again (the dead-letter topic is at-least-once). So each
	// repeat needs a planned restart on its partition, from a batch start
	// at or before the record, between the first and the last write.
	letters := readDeadLetters(t, addr)
	dup := 0
	for at, n := range letters {
		if !dead[at] {
			t.Errorf("dead letter for %d@%d, which is neither poison nor always panicking", at[0], at[1])
		}
		dup += n - 1
		if covering := logs.covering(at); n-1 > covering {
			t.Errorf("dead letter for %d@%d written %d times; only %d planned restarts re-read it", at[0], at[1], n, covering)
		}
	}
	for at := range dead {
		if letters[at] == 0 {
			t.Errorf("no dead letter for %d@%d", at[0], at[1])
		}
	}
	t.Logf("%d events (%d poison, %d panicking once, %d always): %d restarts, all planned (%d once, %d always); %d dead letters, %d of them repeats",
		total, len(dead)-always, once, always, len(restarted), plannedOnce, plannedAlways, len(letters)+dup, dup)
}

// plannedRestart is one "partition actor restarted" line of a planned
// panic: the partition restarts from the batch at start.
type plannedRestart struct {
	at        time.Time
	partition int64
	start     int64
	always    bool
}

// panicLogs is what the processes logged about planned panics and dead
// letters.
type panicLogs struct {
	restarts []plannedRestart
	// written holds, per (partition, offset), when each dead letter was
	// written.
	written map[[2]int64][]time.Time
}

// covering is how many planned restarts re-read the record at (partition,
// offset) between its first and its last dead-letter write.
func (l panicLogs) covering(at [2]int64) int {
	ws := l.written[at]
	if len(ws) == 0 {
		return 0
	}
	first, last := slices.MinFunc(ws, time.Time.Compare), slices.MaxFunc(ws, time.Time.Compare)
	n := 0
	for _, r := range l.restarts {
		if r.partition == at[0] && r.start <= at[1] && !r.at.Before(first) && !r.at.After(last) {
			n++
		}
	}
	return n
}

// readPanicLogs reads the restarts and dead letters that the processes
// whose logs are in dir (*.log) logged; a restart for anything but a
// planned panic fails the test.
func readPanicLogs(tb testing.TB, dir string) panicLogs {
	tb.Helper()
	out := panicLogs{written: map[[2]int64][]time.Time{}}
	paths, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil {
		tb.Fatal(err)
	}
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			tb.Fatal(err)
		}
		for line := range strings.Lines(string(b)) {
			var l struct {
				Time      time.Time `json:"time"`
				Msg       string    `json:"msg"`
				Reason    string    `json:"reason"`
				Partition int64     `json:"partition"`
				Offset    int64     `json:"offset"`
			}
			if json.Unmarshal([]byte(line), &l) != nil {
				continue
			}
			switch l.Msg {
			case "dead letter":
				at := [2]int64{l.Partition, l.Offset}
				out.written[at] = append(out.written[at], l.Time)
			case "partition actor restarted":
				if !strings.Contains(l.Reason, chaos.PanicPrefix) {
					tb.Errorf("%s: a partition actor restarted for %q, not a planned panic", path, l.Reason)
					continue
				}
				out.restarts = append(out.restarts, plannedRestart{at: l.Time, partition: l.Partition, start: l.Offset,
					always: strings.Contains(l.Reason, "(always)")})
			}
		}
	}
	return out
}

// readDeadLetters counts the dead letters per source partition and offset.
func readDeadLetters(tb testing.TB, addr string) map[[2]int64]int {
	tb.Helper()
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": addr, "group.id": "panic-dlq-reader",
		"enable.auto.commit": false, "auto.offset.reset": "earliest", "log_level": 3})
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	t := dlqTopic
	md, err := c.GetMetadata(&t, false, 10000)
	if err != nil {
		tb.Fatal(err)
	}
	var tps []kafka.TopicPartition
	left := int64(0)
	for _, p := range md.Topics[dlqTopic].Partitions {
		_, high, err := c.QueryWatermarkOffsets(dlqTopic, p.ID, 10000)
		if err != nil {
			tb.Fatal(err)
		}
		left += high
		tps = append(tps, kafka.TopicPartition{Topic: &t, Partition: p.ID, Offset: kafka.OffsetBeginning})
	}
	if err := c.Assign(tps); err != nil {
		tb.Fatal(err)
	}
	got := map[[2]int64]int{}
	deadline := time.Now().Add(30 * time.Second)
	for ; left > 0; left-- {
		m, err := c.ReadMessage(time.Until(deadline))
		if err != nil {
			tb.Fatalf("read the dead-letter topic, %d records left: %v", left, err)
		}
		var at [2]int64
		for _, h := range m.Headers {
			switch h.Key {
			case "ratchet.partition":
				at[0], _ = strconv.ParseInt(string(h.Value), 10, 64)
			case "ratchet.offset":
				at[1], _ = strconv.ParseInt(string(h.Value), 10, 64)
			}
		}
		got[at]++
	}
	return got
}
