package engine_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"ratchet/actors"
	"ratchet/config"
	"ratchet/engine"
	"ratchet/internal/testenv"
	ratchetv1 "ratchet/messages/ratchet/v1"
)

// waitConfig is testConfig with short group timeouts: session.timeout.ms
// 6 s (the test broker's minimum) and shutdown.timeout d, so that the
// assignment watchdog's bound is 2 × 6 s + d.
func waitConfig(tb testing.TB, addr, dbURL string, d time.Duration) config.Config {
	tb.Helper()
	cfg := testConfig(tb, addr, dbURL, config.ModeAtLeastOnce)
	cfg.Kafka.Properties = map[string]string{"session.timeout.ms": "6000", "heartbeat.interval.ms": "1000"}
	cfg.Shutdown.Timeout = d
	return cfg
}

// startRecorded runs an engine logging to rec (and to stderr with
// RATCHET_TEST_LOG) with the metrics in reg.
func startRecorded(tb testing.TB, cfg config.Config, rec *testenv.LogRecorder, reg *prometheus.Registry) *testenv.Engine {
	tb.Helper()
	return testenv.StartEngine(tb, testenv.EngineOptions{},
		func(ctx context.Context, _ *slog.Logger, onListening func(string)) error {
			return engine.Run(ctx, cfg, engine.Options{Processor: ledger{"wait"}, Owner: "wait",
				Logger: rec.Logger(), Registry: reg, OnListening: onListening})
		})
}

// TestStalledJoinRebuildsTheConsumer is the stall of an outside chaos run
// (issue 32, item 1): the member's JoinGroup is never answered, on both
// brokers, so librdkafka would wait max.poll.interval.ms + 5 s (305 s)
// for it. The watchdog rebuilds the consumer once the member has waited
// 2 × session timeout + shutdown.timeout (15 s here) without an
// assignment: a supervised restart, logged and counted, after which the
// new member is assigned and applies the records.
//
// Cases: the first join is never answered (kfake: its JoinGroup with a
// member id is dropped, the test broker's way of losing a member that
// waits in the join, docs/testing.md; librdkafka's mock: its first
// JoinGroup answered ten minutes late), and the chaos run's sequence: a
// member that has its partitions loses them ("assignment lost": the
// coordinator no longer knows it), its rejoin is never answered, and
// then nothing.
func TestStalledJoinRebuildsTheConsumer(t *testing.T) {
	const n = 200
	bound := actors.AssignmentTimeout(6*time.Second, 3*time.Second)
	for _, c := range []struct {
		name   string
		broker string
		lost   bool // stall the rejoin of a member that has partitions
		since  string
	}{
		{"kfake first join", "kfake", false, "subscribe"},
		{"mock first join", "mock", false, "subscribe"},
		{"kfake rejoin after assignment lost", "kfake", true, "assignment lost"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var addr string
			// kfake: drop (never answer) the next JoinGroup with a member
			// id while dropJoin is set.
			var dropJoin atomic.Bool
			var cluster *kfake.Cluster
			switch c.broker {
			case "kfake":
				cluster, addr = testenv.Kafka(t, 3, topic)
				dropJoin.Store(!c.lost)
				cluster.ControlKey(int16(kmsg.JoinGroup), func(req kmsg.Request) (kmsg.Response, error, bool) {
					cluster.KeepControl()
					if j := req.(*kmsg.JoinGroupRequest); j.MemberID != "" && dropJoin.CompareAndSwap(true, false) {
						return nil, nil, true // never answered
					}
					return nil, nil, false
				})
			case "mock":
				var mc *kafka.MockCluster
				mc, addr = testenv.MockKafkaCluster(t, 3, topic, topic+".dlq")
				testenv.DelayMockRequest(t, mc, int16(kmsg.JoinGroup), 10*time.Minute)
			}
			dbURL := testenv.Postgres(t)
			pool := openPool(t, dbURL)
			createLedger(t, pool)
			g := &gen{} // distinct events across both sends
			send := func() {
				batch := make([]*ratchetv1.Event, n)
				for i := range batch {
					batch[i] = g.next()
				}
				newProducer(t, addr).send(t, batch)
			}
			send()

			rec := testenv.NewLogRecorder(slog.LevelInfo)
			reg := prometheus.NewRegistry()
			cfg := waitConfig(t, addr, dbURL, 3*time.Second)
			cfg.HTTP.Addr = "127.0.0.1:0"
			e := startRecorded(t, cfg, rec, reg)
			base := "http://" + e.Addr(t, 60*time.Second)
			want := int64(n)
			if c.lost {
				waitApplied(t, pool, n)
				// The coordinator no longer knows the member (as after the
				// chaos run's SyncGroup timeout): librdkafka declares the
				// assignment lost and rejoins, and that JoinGroup is never
				// answered.
				dropJoin.Store(true)
				cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Heartbeat}, Err: kerr.UnknownMemberID})
				testenv.Eventually(t, 60*time.Second, func() bool {
					return len(rec.Lines("assignment lost; stopping partitions without committing")) > 0
				}, "the member's assignment lost")
				send()
				want += n
			}
			stalled := time.Now()

			// While it waits, /readyz says so (503) and the gauge counts.
			testenv.Eventually(t, bound, func() bool {
				code, body := readyz(t, base)
				return code == http.StatusServiceUnavailable &&
					strings.Contains(body, "waiting for the consumer group to assign partitions") &&
					gauge(t, reg, "ratchet_assignment_wait_seconds") >= 5
			}, "/readyz 503 naming the wait and ratchet_assignment_wait_seconds counting")

			// Before the watchdog: nothing is applied for 305 s.
			testenv.Eventually(t, bound+60*time.Second, func() bool {
				return count(t, pool, `SELECT count(DISTINCT id) FROM test_ledger`) >= want
			}, "every record applied after the watchdog's rebuild")
			if took := time.Since(stalled); took < bound-time.Second {
				t.Errorf("applied %s after the stall, before the watchdog's bound %s: the join was not stalled", took, bound)
			}

			lines := rec.Lines("consumer restarted: rebuilding it to rejoin the group")
			if len(lines) == 0 {
				t.Fatal("no supervised restart of the consumer logged")
			}
			if l := lines[0]; l.Level != slog.LevelWarn || l.Attrs["actor"] != "consumer" ||
				!strings.Contains(l.Attrs["reason"].(string), "no partition assignment") ||
				!strings.Contains(l.Attrs["reason"].(string), "since "+c.since) {
				t.Errorf("restart logged as %v %q %v", l.Level, l.Msg, l.Attrs)
			}
			if got := counter(t, reg, "ratchet_actor_restarts_total", "actor", "consumer"); got < 1 {
				t.Errorf("ratchet_actor_restarts_total{actor=consumer} = %v, want >= 1", got)
			}
			if got := counter(t, reg, "ratchet_consumer_rebuilds_total", "reason", "assignment_wait"); got < 1 {
				t.Errorf("ratchet_consumer_rebuilds_total{reason=assignment_wait} = %v, want >= 1", got)
			}
			if len(rec.Lines("still no partition assignment past the session timeout")) == 0 {
				t.Error("the wait past the session timeout was not logged")
			}
			testenv.Eventually(t, 10*time.Second, func() bool {
				return gauge(t, reg, "ratchet_assignment_wait_seconds") == 0
			}, "ratchet_assignment_wait_seconds back to 0 once assigned")
			e.Stop(t)
			assertLedgerExactlyOnce(t, pool, want)
		})
	}
}

// deadMember joins group as a dynamic member of the classic protocol,
// takes part in one rebalance, and then says nothing more: an instance
// killed with SIGKILL, which leaves no LeaveGroup behind. The group
// waits for it until its session (session) expires.
func deadMember(tb testing.TB, addr, group string, session time.Duration) {
	tb.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		tb.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Topics = []string{topic}
	var memberID string
	var resp *kmsg.JoinGroupResponse
	for range 2 { // the first answer is MEMBER_ID_REQUIRED with the id to use
		req := kmsg.NewPtrJoinGroupRequest()
		req.Group, req.MemberID, req.ProtocolType = group, memberID, "consumer"
		req.SessionTimeoutMillis = int32(session.Milliseconds())
		req.RebalanceTimeoutMillis = int32(session.Milliseconds())
		req.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "cooperative-sticky", Metadata: meta.AppendTo(nil)}}
		if resp, err = req.RequestWith(ctx, cl); err != nil {
			tb.Fatalf("join: %v", err)
		}
		memberID = resp.MemberID
		if err := kerr.ErrorForCode(resp.ErrorCode); err == nil {
			break
		} else if err != kerr.MemberIDRequired {
			tb.Fatalf("join: %v", err)
		}
	}
	sync := kmsg.NewPtrSyncGroupRequest()
	sync.Group, sync.MemberID, sync.Generation = group, memberID, resp.Generation
	sync.ProtocolType, sync.Protocol = kmsg.StringPtr("consumer"), kmsg.StringPtr("cooperative-sticky")
	sync.GroupAssignment = []kmsg.SyncGroupRequestGroupAssignment{{MemberID: memberID}}
	sresp, err := sync.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(sresp.ErrorCode)
	}
	if err != nil {
		tb.Fatalf("sync: %v", err)
	}
}

// TestJoinWaitIsLogged is the restart after kill -9 of an instance
// without kafka.instance_id (issue 32, item 2): the group waits for the
// dead member's session to expire. The wait is logged at INFO after a few
// seconds and at WARN past the session timeout, each naming what the
// group waits for and the remedy; then the member is assigned without a
// rebuild.
func TestJoinWaitIsLogged(t *testing.T) {
	const n = 100
	_, addr := testenv.Kafka(t, 3, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	produceEvents(t, addr, n)
	// The dead member's session is 14 s; the engine's own is 6 s, its
	// watchdog's bound 2 × 6 s + 20 s: the wait is long, not stalled.
	cfg := waitConfig(t, addr, dbURL, 20*time.Second)
	deadMember(t, addr, cfg.Kafka.GroupID, 14*time.Second)

	rec := testenv.NewLogRecorder(slog.LevelInfo)
	reg := prometheus.NewRegistry()
	e := startRecorded(t, cfg, rec, reg)
	waitApplied(t, pool, n)
	e.Stop(t)

	for _, c := range []struct {
		msg   string
		level slog.Level
	}{
		{"waiting for the consumer group to assign partitions", slog.LevelInfo},
		{"still no partition assignment past the session timeout", slog.LevelWarn},
	} {
		t.Run(c.msg, func(t *testing.T) {
			lines := rec.Lines(c.msg)
			if len(lines) != 1 {
				t.Fatalf("%d lines %q, want 1", len(lines), c.msg)
			}
			l := lines[0]
			if l.Level != c.level {
				t.Errorf("level %v, want %v", l.Level, c.level)
			}
			waitingFor, _ := l.Attrs["waiting_for"].(string)
			remedy, _ := l.Attrs["remedy"].(string)
			if !strings.Contains(waitingFor, "until its session expires") ||
				!strings.Contains(remedy, "kafka.instance_id") || !strings.Contains(remedy, "session.timeout.ms") {
				t.Errorf("line does not name the wait and the remedy: %v", l.Attrs)
			}
		})
	}
	if len(rec.Lines("consumer group assigned partitions after a long wait")) != 1 {
		t.Error("the end of the wait was not logged")
	}
	if got := counter(t, reg, "ratchet_consumer_rebuilds_total", "reason", "assignment_wait"); got != 0 {
		t.Errorf("a wait within the bound rebuilt the consumer %v times", got)
	}
}
