package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"ratchet/actors"
	"ratchet/internal/store"
	"ratchet/processor/pipeline"
)

// The flags of `pipelines backfill`: NAME before or after them, one start
// at most, a rate of 0 or more.
func TestParseBackfillArgs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		want  string // "" for success, else part of the usage error
		check func(backfillOptions) bool
	}{
		{"name only", []string{"revenue"}, "", func(o backfillOptions) bool { return o.name == "revenue" && !o.execute && o.from.IsZero() }},
		{"flags after the name", []string{"revenue", "--execute", "--rate", "500"}, "", func(o backfillOptions) bool {
			return o.name == "revenue" && o.execute && o.rate == 500
		}},
		{"flags before the name", []string{"--from-datetime", "2026-12-01T00:00:00Z", "revenue"}, "", func(o backfillOptions) bool {
			return o.name == "revenue" && o.from.Equal(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
		}},
		{"from earliest", []string{"--from-earliest", "revenue", "--config", "x.yaml"}, "", func(o backfillOptions) bool {
			return o.earliest && o.config == "x.yaml"
		}},
		{"no name", []string{"--execute"}, "the pipeline's NAME is missing", nil},
		{"two names", []string{"a", "b"}, `unexpected argument "b"`, nil},
		{"both starts", []string{"a", "--from-earliest", "--from-datetime", "2026-12-01T00:00:00Z"}, "choose one", nil},
		{"bad time", []string{"a", "--from-datetime", "yesterday"}, "an RFC 3339 time", nil},
		{"negative rate", []string{"a", "--rate", "-1"}, "--rate -1", nil},
		{"unknown flag", []string{"a", "--to-latest"}, "flag provided but not defined", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &env{stdout: &strings.Builder{}, stderr: &strings.Builder{}}
			o, err := parseBackfillArgs(e, tc.args)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("error: %v", err)
				}
				if !tc.check(o) {
					t.Fatalf("options %+v", o)
				}
				return
			}
			var ue *usageError
			if err == nil || !strings.Contains(err.Error(), tc.want) || !asUsage(err, &ue) {
				t.Fatalf("err %v, want a usage error saying %q", err, tc.want)
			}
		})
	}
}

func asUsage(err error, ue **usageError) bool {
	u, ok := err.(*usageError)
	*ue = u
	return ok
}

// planBackfill: a range per partition from the start (no earlier than
// the topic's first offset, no later than the origin) to the origin; a
// recorded range kept; every refusal named by partition.
func TestPlanBackfill(t *testing.T) {
	origin := func(p int32, from int64) store.BackfillOrigin {
		return store.BackfillOrigin{Topic: "orders", Partition: p, LiveFrom: from, Fingerprint: "fp1"}
	}
	low := map[int32]int64{0: 10, 1: 0}
	start := map[int32]int64{0: 0, 1: 0}
	t.Run("new ranges", func(t *testing.T) {
		plan, err := planBackfill("rev", "orders", "fp1", []int32{0, 1}, []store.BackfillOrigin{origin(0, 100), origin(1, 50)}, nil, low, start, false)
		if err != nil {
			t.Fatal(err)
		}
		if got := plan.parts[0]; got.From != 10 || got.To != 100 || got.Next != 10 || got.recorded {
			t.Fatalf("partition 0: %+v", got)
		}
		if got := plan.parts[1]; got.From != 0 || got.To != 50 {
			t.Fatalf("partition 1: %+v", got)
		}
		if plan.remaining() != 140 {
			t.Fatalf("remaining %d", plan.remaining())
		}
	})
	t.Run("from a time past the origin", func(t *testing.T) {
		plan, err := planBackfill("rev", "orders", "fp1", []int32{0}, []store.BackfillOrigin{origin(0, 100)}, nil, low,
			map[int32]int64{0: 1<<63 - 1}, false)
		if err != nil {
			t.Fatal(err)
		}
		if got := plan.parts[0]; got.From != 100 || got.Remaining() != 0 {
			t.Fatalf("partition 0: %+v", got)
		}
	})
	t.Run("recorded", func(t *testing.T) {
		rec := []store.BackfillPosition{{Topic: "orders", Partition: 0, From: 0, To: 100, Next: 40, Records: 40}}
		plan, err := planBackfill("rev", "orders", "fp1", []int32{0}, []store.BackfillOrigin{origin(0, 100)}, rec, map[int32]int64{0: 60}, start, false)
		if err != nil {
			t.Fatal(err)
		}
		if got := plan.parts[0]; !got.recorded || got.Next != 40 || got.Remaining() != 60 {
			t.Fatalf("partition 0: %+v", got)
		}
		if len(plan.notes) != 1 || !strings.Contains(plan.notes[0], "offsets 40..59") {
			t.Fatalf("notes %q", plan.notes)
		}
	})
	for _, tc := range []struct {
		name     string
		origins  []store.BackfillOrigin
		recorded []store.BackfillPosition
		want     string
	}{
		{"no origin", []store.BackfillOrigin{origin(0, 100)}, nil, "orders[1]: pipeline rev has not started live there yet"},
		{"adopted", []store.BackfillOrigin{origin(0, 100), {Topic: "orders", Partition: 1, LiveFrom: 7, Fingerprint: "fp1", Adopted: true}}, nil,
			"orders[1]: pipeline rev was already running before its origin was recorded (adopted at offset 7)"},
		{"changed", []store.BackfillOrigin{origin(0, 100), {Topic: "orders", Partition: 1, LiveFrom: 7, Fingerprint: "fp0"}}, nil,
			"orders[1]: pipeline rev began live with another definition"},
		{"recorded elsewhere", []store.BackfillOrigin{origin(0, 100), origin(1, 50)},
			[]store.BackfillPosition{{Topic: "orders", Partition: 1, From: 0, To: 40, Next: 0}}, "ends at 40, but it began live at 50"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := planBackfill("rev", "orders", "fp1", []int32{0, 1}, tc.origins, tc.recorded, low, start, false)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

// `dlq replay` keeps ratchet.backfill on the record it re-produces (it
// drops only the headers the DLQ adds), so that the engine applies a
// replayed backfill dead letter in its pipeline only.
func TestReplayKeepsTheBackfillHeader(t *testing.T) {
	topic := "orders.dlq"
	m := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: 0, Offset: 3}, Value: []byte("{}"),
		Headers: []kafka.Header{{Key: "trace", Value: []byte("x")}, {Key: actors.HeaderError, Value: []byte("pipeline per_minute: bad")},
			{Key: actors.HeaderTopic, Value: []byte("orders")}, {Key: actors.HeaderPartition, Value: []byte("1")},
			{Key: actors.HeaderOffset, Value: []byte("8")}, {Key: actors.HeaderAttempts, Value: []byte("1")},
			{Key: actors.HeaderFailedAt, Value: []byte("2026-12-05T08:00:00Z")}, {Key: pipeline.HeaderBackfill, Value: []byte("per_minute")}}}
	d := parseDeadLetter(m)
	if d.Unreadable != "" {
		t.Fatalf("unreadable: %s", d.Unreadable)
	}
	var kept []string
	for _, h := range d.Headers {
		kept = append(kept, h.Key+"="+string(h.Value))
	}
	if strings.Join(kept, ",") != "trace=x,ratchet.backfill=per_minute" {
		t.Fatalf("headers kept for the replay: %v", kept)
	}
}
