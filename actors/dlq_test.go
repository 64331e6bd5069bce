package actors

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgconn"

	"ratchet/internal/testenv"
	"ratchet/processor"
)

// unreachableProducer returns a producer whose broker never answers:
// everything it is given stays queued, no delivery report comes.
func unreachableProducer(tb testing.TB) *kafka.Producer {
	tb.Helper()
	p, err := kafka.NewProducer(&kafka.ConfigMap{
		"bootstrap.servers":  "127.0.0.1:1",
		"linger.ms":          0,
		"message.timeout.ms": 600_000,
		"log_level":          0,
	})
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// letters returns n letters for topic "events".
func letters(n int) []Letter {
	out := make([]Letter, n)
	for i := range out {
		out[i] = Letter{Record: processor.Record{Topic: "events", Offset: int64(i), Value: []byte("x")},
			Reason: errors.New("poison"), Attempts: 1}
	}
	return out
}

// TestDLQAnswersEveryRequest: a dead-letter request never leaves its caller
// (or a goroutine of its) waiting for good. Requests the DLQ actor holds
// when it stops fail with ErrDLQStopped once the flush is over; a caller
// whose context ends, or whose wait times out, cancels its request and
// leaves no goroutine behind. Counted over several start/stop cycles.
func TestDLQAnswersEveryRequest(t *testing.T) {
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	// One cycle first, so that what the actor system and cgo start once is
	// in the baseline.
	cycle := func(t *testing.T) {
		producer := unreachableProducer(t)
		handled, counted := countRequests()
		pid := sys.Root.Spawn(actor.PropsFromProducer(NewDLQ(DLQConfig{
			Producer: producer, Topic: func(string) string { return "events.dlq" }, Logger: logger,
			Backoff: RetryPolicy{InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond},
			// The shutdown has no time left: the flush gives up at once.
			FlushBy: time.Now,
		}), counted))
		client := DLQClient{Root: sys.Root, PID: pid}
		const held = 4
		results := make(chan error, held)
		for range held {
			go func() { results <- client.DeadLetter(context.Background(), letters(2)) }()
		}
		cancelled, cancel := context.WithCancel(context.Background())
		cancelledDone := make(chan error, 1)
		go func() { cancelledDone <- client.DeadLetter(cancelled, letters(1)) }()
		timedOut := DLQClient{Root: sys.Root, PID: pid, Timeout: 50 * time.Millisecond}
		timedOutDone := make(chan error, 1)
		go func() { timedOutDone <- timedOut.DeadLetter(context.Background(), letters(1)) }()
		if err := waitErr(t, timedOutDone); !errors.Is(err, actor.ErrTimeout) {
			t.Errorf("a request past its timeout returned %v, want actor.ErrTimeout", err)
		}
		testenv.Eventually(t, 10*time.Second, func() bool { return handled.Load() == held+2 },
			"every request handed to the producer")
		cancel()
		if err := waitErr(t, cancelledDone); !errors.Is(err, context.Canceled) {
			t.Errorf("a cancelled request returned %v, want context.Canceled", err)
		}
		if err := sys.Root.PoisonFuture(pid).Wait(); err != nil {
			t.Fatalf("stop dlq: %v", err)
		}
		for range held {
			if err := waitErr(t, results); !errors.Is(err, ErrDLQStopped) {
				t.Errorf("a request held at stop returned %v, want ErrDLQStopped", err)
			}
		}
		// To a DLQ actor that is gone: answered at once.
		if err := client.DeadLetter(context.Background(), letters(1)); err == nil {
			t.Error("a request to a stopped DLQ succeeded")
		}
	}
	cycle(t)
	base := runtime.NumGoroutine()
	for range 3 {
		cycle(t)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return runtime.NumGoroutine() <= base },
		"goroutines back to the %d of after the first cycle", base)
}

// countRequests counts the dead-letter requests the DLQ actor has handled
// (its letters are in the producer's queue once it has). The producer's
// Len is no such signal: it also counts librdkafka's own events, such as
// the error of a refused connection.
func countRequests() (*atomic.Int64, actor.PropsOption) {
	var n atomic.Int64
	return &n, actor.WithReceiverMiddleware(func(next actor.ReceiverFunc) actor.ReceiverFunc {
		return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
			next(c, env)
			if _, ok := env.Message.(*deadLetterRequest); ok {
				n.Add(1)
			}
		}
	})
}

// waitErr waits for one error from ch, failing the test after 10s.
func waitErr(tb testing.TB, ch <-chan error) error {
	tb.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		tb.Fatal("no answer within 10s")
		return nil
	}
}

// TestDLQFlushOnStopEndsByFlushBy: the flush of what is still queued when
// the DLQ actor stops lasts until FlushBy (what is left of the shutdown),
// not a fixed 10 s, and the request it could not complete is failed.
func TestDLQFlushOnStopEndsByFlushBy(t *testing.T) {
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
	producer := unreachableProducer(t)
	var by time.Time
	handled, counted := countRequests()
	pid := sys.Root.Spawn(actor.PropsFromProducer(NewDLQ(DLQConfig{
		Producer: producer, Topic: func(string) string { return "events.dlq" },
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		Backoff: RetryPolicy{InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond},
		FlushBy: func() time.Time { return by },
	}), counted))
	client := DLQClient{Root: sys.Root, PID: pid}
	done := make(chan error, 1)
	go func() { done <- client.DeadLetter(context.Background(), letters(1)) }()
	testenv.Eventually(t, 10*time.Second, func() bool { return handled.Load() == 1 }, "the letter handed to the producer")

	const left = 700 * time.Millisecond
	start := time.Now()
	by = start.Add(left) // read by the actor after the stop below is sent
	sys.Root.Poison(pid)
	err := waitErr(t, done)
	took := time.Since(start)
	if !errors.Is(err, ErrDLQStopped) {
		t.Errorf("the request held at stop returned %v, want ErrDLQStopped", err)
	}
	if took < left-100*time.Millisecond || took > left+3*time.Second {
		t.Errorf("the stop took %s, want about %s (what FlushBy left)", took, left)
	}
}

// TestLetterHeaders: a dead letter carries, next to the full text in
// ratchet.error, its reason class, the pipeline that refused it and
// PostgreSQL's SQLSTATE as headers of their own, after the original
// headers; the pipeline and the SQLSTATE only when there are.
func TestLetterHeaders(t *testing.T) {
	numeric := &pgconn.PgError{Code: "22P02", Message: `invalid input syntax for type numeric: "soon"`}
	failed := time.Date(2026, 12, 4, 16, 0, 0, 0, time.UTC)
	rec := processor.Record{Topic: "orders", Partition: 2, Offset: 47, Headers: []processor.Header{{Key: "trace", Value: []byte("t1")}}}
	tests := []struct {
		name   string
		reason error
		want   map[string]string // ratchet.reason, ratchet.pipeline, ratchet.sqlstate ("" when absent)
	}{
		{"refused by postgres", fmt.Errorf("apply orders[2] offsets 47..48: %w", &pipelineError{"orders", fmt.Errorf("upsert 1 rows of orders: %w", numeric)}),
			map[string]string{HeaderReason: "refused_by_postgres", HeaderPipeline: "orders", HeaderSQLState: "22P02"}},
		{"expression", processor.Permanent(&pipelineError{"orders", errors.New("record orders[2]@47: amount: no such key: amout")}),
			map[string]string{HeaderReason: "expression", HeaderPipeline: "orders", HeaderSQLState: ""}},
		{"no pipeline", processor.Permanent(errors.New("unknown customer")),
			map[string]string{HeaderReason: "processor_refused", HeaderPipeline: "", HeaderSQLState: ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hs := letterHeaders(&Letter{Record: rec, Reason: tt.reason, Attempts: 1, FailedAt: failed})
			if hs[0].Key != "trace" {
				t.Errorf("first header %q, want the original trace", hs[0].Key)
			}
			got := map[string]string{}
			for _, h := range hs {
				if _, dup := got[h.Key]; dup {
					t.Errorf("header %s twice", h.Key)
				}
				got[h.Key] = string(h.Value)
			}
			if got[HeaderError] != tt.reason.Error() {
				t.Errorf("%s = %q, want the full text %q", HeaderError, got[HeaderError], tt.reason.Error())
			}
			for k, want := range tt.want {
				v, ok := got[k]
				if want == "" && ok {
					t.Errorf("%s = %q, want none", k, v)
				}
				if want != "" && v != want {
					t.Errorf("%s = %q, want %q", k, v, want)
				}
			}
		})
	}
}
