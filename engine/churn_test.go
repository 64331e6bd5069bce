package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/testenv"
)

// churnEvents is how many joins and graceful leaves a churn run makes:
// RATCHET_CHURN_EVENTS, else 20 (make test); make soak runs more.
func churnEvents(tb testing.TB) int {
	if v := os.Getenv("RATCHET_CHURN_EVENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			tb.Fatalf("RATCHET_CHURN_EVENTS=%q: want a positive number", v)
		}
		return n
	}
	return 20
}

// TestChurnWithOverlapReplaysNothing is membership churn as rolling updates
// and autoscaling make it: members join and leave gracefully every 1-4 s
// while events keep coming, without waiting for the group to settle, so most
// stops land while the group is rebalancing (a join triggers one; a leave
// triggers the next). Every stop must return cleanly within
// shutdown.timeout, and at the end every event is applied exactly once: a
// stop or a revoke committed everything it applied, under whatever
// generation the group had reached. Run against kfake and against
// librdkafka's mock cluster, two independent group coordinators.
func TestChurnWithOverlapReplaysNothing(t *testing.T) {
	for _, broker := range []string{"kfake", "mock"} {
		for _, mode := range []string{config.ModeAtLeastOnce, config.ModeExactlyOnce} {
			t.Run(broker+"/"+mode, func(t *testing.T) {
				churn(t, broker, mode, false)
			})
		}
	}
}

// TestRollingRestartOfStaticMembers restarts three static members
// (kafka.instance_id) in turn, StatefulSet style, under load: each stops
// gracefully and comes back with the same id while the others keep
// consuming, and the next one is stopped while the group still rebalances.
func TestRollingRestartOfStaticMembers(t *testing.T) {
	for _, broker := range []string{"kfake", "mock"} {
		for _, mode := range []string{config.ModeAtLeastOnce, config.ModeExactlyOnce} {
			t.Run(broker+"/"+mode, func(t *testing.T) {
				churn(t, broker, mode, true)
			})
		}
	}
}

// member is one engine of a churn run.
type member struct {
	owner   string
	id      string // kafka.instance_id; empty for a dynamic member
	cancel  context.CancelFunc
	done    chan error
	stopped chan struct{}
}

func churn(t *testing.T, broker, mode string, static bool) {
	const partitions = 8
	var addr string
	switch broker {
	case "kfake":
		var cl *kfake.Cluster
		cl, addr = testenv.Kafka(t, partitions, topic, topic+".dlq")
		if os.Getenv("RATCHET_TEST_TRACE_GROUP") != "" {
			for _, k := range []kmsg.Key{kmsg.LeaveGroup, kmsg.JoinGroup, kmsg.SyncGroup} {
				cl.ControlKey(int16(k), func(req kmsg.Request) (kmsg.Response, error, bool) {
					cl.KeepControl()
					switch r := req.(type) {
					case *kmsg.LeaveGroupRequest:
						t.Logf("%s LeaveGroup %v %+v", time.Now().Format("15:04:05.000"), r.MemberID, r.Members)
					case *kmsg.JoinGroupRequest:
						t.Logf("%s JoinGroup %v gen?", time.Now().Format("15:04:05.000"), r.MemberID)
					case *kmsg.SyncGroupRequest:
						t.Logf("%s SyncGroup %v gen %d", time.Now().Format("15:04:05.000"), r.MemberID, r.Generation)
					}
					return nil, nil, false
				})
			}
		}
	default:
		addr = testenv.MockKafka(t, partitions, topic, topic+".dlq")
	}
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	cfg := testConfig(t, addr, dbURL, mode)
	cfg.Kafka.GroupID = "churn"
	cfg.Shutdown.Timeout = 10 * time.Second
	cfg.Commit.Interval = 500 * time.Millisecond
	// Four members at partitions+4 connections each, beside the other test
	// packages that go test runs at the same time, would crowd PostgreSQL's
	// 100 connections; a member needs only a few.
	cfg.Postgres.MaxConns = 6
	cfg.Kafka.Properties = map[string]string{}
	if broker == "mock" {
		// The mock coordinator waits session.timeout.ms less a second for
		// members to join before it answers any JoinGroup, and aborts the
		// process when a member sends a second JoinGroup meanwhile (which
		// librdkafka does once the first times out: socket.timeout.ms). A
		// short session keeps every join well inside that timeout.
		// It also blocks a member's connection while its JoinGroup waits,
		// so a stop may sit out a whole join or two before its commit goes
		// through: give it the time.
		cfg.Kafka.Properties["session.timeout.ms"] = "6000"
		cfg.Kafka.Properties["heartbeat.interval.ms"] = "1000"
		cfg.Shutdown.Timeout = 25 * time.Second
	}
	if d := os.Getenv("RATCHET_TEST_RDKAFKA_DEBUG"); d != "" {
		cfg.Kafka.Properties["debug"] = d
	}

	logs := &testenv.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			if f, err := os.CreateTemp("", "churn-*.log"); err == nil {
				_, _ = f.WriteString(logs.String())
				_ = f.Close()
				t.Logf("engine logs: %s", f.Name())
			}
		}
	})
	// About 1,500 events a second, as the field report had.
	s := stream(t, addr, 30, 20*time.Millisecond)

	var (
		mu      sync.Mutex
		seq     int
		stops   sync.WaitGroup
		members []*member
	)
	rnd := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	join := func(id string) {
		seq++
		m := &member{owner: fmt.Sprintf("m%d", seq), id: id, done: make(chan error, 1), stopped: make(chan struct{})}
		c := cfg
		c.Kafka.InstanceID = id
		ctx, cancel := context.WithCancel(context.Background())
		m.cancel = cancel
		go func() {
			log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})).With("owner", m.owner)
			m.done <- engine.Run(ctx, c, engine.Options{Processor: ledger{m.owner}, Logger: log, Owner: m.owner,
				Registry: prometheus.NewRegistry()})
		}()
		members = append(members, m)
	}
	// leave stops m without waiting: the next membership change overlaps
	// its stop. The stop must end within shutdown.timeout, cleanly.
	leave := func(m *member) {
		began := time.Now()
		m.cancel()
		stops.Go(func() {
			defer close(m.stopped)
			limit := cfg.Shutdown.Timeout + 2*time.Second // the engine's own stop, plus scheduling slack
			select {
			case err := <-m.done:
				took := time.Since(began)
				if err != nil {
					t.Errorf("%s stopped with error: %v", m.owner, err)
				}
				if took > cfg.Shutdown.Timeout {
					t.Errorf("%s took %s to stop, shutdown.timeout is %s", m.owner, took.Round(time.Millisecond), cfg.Shutdown.Timeout)
				}
			case <-time.After(limit):
				t.Errorf("%s did not stop within %s", m.owner, limit)
			}
		})
	}

	events := churnEvents(t)
	if static {
		if os.Getenv("RATCHET_CHURN_EVENTS") == "" {
			events = 9 // three rounds of three pods; make soak runs more
		}
		ids := []string{"pod-0", "pod-1", "pod-2"}
		for _, id := range ids {
			join(id)
		}
		waitApplied(t, pool, 1000)
		for i := range events {
			// Stop pod-i and bring it back as soon as it is gone; the next
			// pod is stopped a moment later, while the group still
			// rebalances.
			idx := i % len(ids)
			var m *member
			for j, x := range members {
				if x.id == ids[idx] {
					m = x
					members = append(members[:j], members[j+1:]...)
					break
				}
			}
			leave(m)
			<-m.stopped
			join(ids[idx])
			time.Sleep(time.Duration(500+rnd.IntN(2000)) * time.Millisecond) // the pause between two membership changes is the scenario
		}
	} else {
		join("")
		join("")
		waitApplied(t, pool, 1000)
		for range events {
			mu.Lock()
			n := len(members)
			mu.Unlock()
			if n >= 4 || (n > 1 && rnd.IntN(2) == 0) {
				i := rnd.IntN(n)
				m := members[i]
				members = append(members[:i], members[i+1:]...)
				leave(m)
			} else {
				join("")
			}
			time.Sleep(time.Duration(1000+rnd.IntN(3000)) * time.Millisecond) // the pause between two membership changes is the scenario
		}
	}

	s.stop()
	waitApplied(t, pool, s.sent.Load())
	for _, m := range members {
		leave(m)
	}
	stops.Wait()
	if broker == "mock" && mode == config.ModeAtLeastOnce {
		// librdkafka's mock coordinator refuses every OffsetCommit while a
		// join is under way (its JOINING state), where Apache Kafka and
		// kfake take commits of the current generation until every member
		// has rejoined. A revoke that overlaps another member's join can
		// then not commit before it returns, and the next owner replays
		// what it applied. Nothing may be lost, and every replayed record
		// must have been reported, in the error line and the metric, by
		// the member that gave up its commit.
		assertReplaysReported(t, pool, s.sent.Load(), logs)
	} else {
		assertLedgerExactlyOnce(t, pool, s.sent.Load())
	}
	if mode == config.ModeExactlyOnce {
		assertKafkaFollowsStore(t, addr, pool, cfg.Kafka.GroupID, partitions)
	}
}

// assertKafkaFollowsStore checks that after every member stopped
// gracefully, Kafka's committed offsets equal the stored ones (lag tools
// and autoscalers read Kafka's).
func assertKafkaFollowsStore(tb testing.TB, addr string, pool *pgxpool.Pool, group string, partitions int) {
	tb.Helper()
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": addr, "group.id": group, "log_level": 3})
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	t := topic
	var tps []kafka.TopicPartition
	for p := range partitions {
		tps = append(tps, kafka.TopicPartition{Topic: &t, Partition: int32(p)})
	}
	got, err := c.Committed(tps, 10000)
	if err != nil {
		tb.Fatalf("read committed offsets: %v", err)
	}
	for _, tp := range got {
		var stored int64
		if err := pool.QueryRow(context.Background(),
			`SELECT next_offset FROM ratchet_offsets WHERE consumer_group = $1 AND topic = $2 AND partition = $3`,
			group, topic, tp.Partition).Scan(&stored); err != nil {
			tb.Errorf("%s[%d]: stored offset: %v", topic, tp.Partition, err)
			continue
		}
		if int64(tp.Offset) != stored {
			tb.Errorf("%s[%d]: Kafka committed %v, stored %d", topic, tp.Partition, tp.Offset, stored)
		}
	}
}

// assertReplaysReported checks that nothing produced was lost and that
// every record applied more than once was reported as left uncommitted
// ("replay" in the error line of the member that abandoned the commit).
func assertReplaysReported(tb testing.TB, pool *pgxpool.Pool, produced int64, logs *testenv.Buffer) {
	tb.Helper()
	total := count(tb, pool, `SELECT count(*) FROM test_ledger`)
	distinct := count(tb, pool, `SELECT count(DISTINCT id) FROM test_ledger`)
	if distinct != produced {
		tb.Errorf("distinct events applied: %d, produced %d (lost %d)", distinct, produced, produced-distinct)
	}
	var reported int64
	for _, l := range logs.Lines(`"msg":"applied offsets left uncommitted; the next owner replays them"`) {
		var e struct {
			Replay int64 `json:"replay"`
		}
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			tb.Fatalf("%s: %v", l, err)
		}
		reported += e.Replay
	}
	if replayed := total - distinct; replayed > reported {
		tb.Errorf("%d records replayed, %d reported as left uncommitted", replayed, reported)
	} else {
		tb.Logf("%d records replayed, %d reported as left uncommitted", replayed, reported)
	}
}
