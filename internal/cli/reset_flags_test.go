package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestOffsetsAndDLQUsageErrorsExitTwoNamingTheFlag covers the bad command
// lines that need neither Kafka nor PostgreSQL: they must stop before
// connecting anywhere, with exit code 2 and a message naming the flag.
func TestOffsetsAndDLQUsageErrorsExitTwoNamingTheFlag(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no target", []string{"offsets", "reset"}, "--to-earliest"},
		{"no target, execute", []string{"offsets", "reset", "--execute"}, "--to-latest"},
		{"two targets", []string{"offsets", "reset", "--to-earliest", "--to-latest"}, "--to-latest"},
		{"offset and shift", []string{"offsets", "reset", "--to-offset", "5", "--shift-by", "-1"}, "--shift-by"},
		{"negative offset", []string{"offsets", "reset", "--to-offset", "-5"}, "--to-offset"},
		{"negative offset, = form", []string{"offsets", "reset", "--to-offset=-1"}, "--to-offset"},
		{"offset not a number", []string{"offsets", "reset", "--to-offset", "ten"}, "--to-offset"},
		{"unparsable time", []string{"offsets", "reset", "--to-datetime", "yesterday"}, "--to-datetime"},
		{"time without zone", []string{"offsets", "reset", "--to-datetime", "2026-12-03T10:00:00"}, "--to-datetime"},
		{"shift not a number", []string{"offsets", "reset", "--shift-by", "1.5"}, "--shift-by"},
		{"bad partition", []string{"offsets", "reset", "--to-earliest", "--partitions", "0,x"}, "--partitions"},
		{"negative partition", []string{"offsets", "reset", "--to-earliest", "--partitions", "-1"}, "--partitions"},
		{"partition twice", []string{"offsets", "reset", "--to-earliest", "--partitions", "1,1"}, "--partitions"},
		{"empty partitions", []string{"offsets", "reset", "--to-earliest", "--partitions", ""}, "--partitions"},
		{"empty topic", []string{"offsets", "reset", "--to-earliest", "--topic", ""}, "--topic"},
		{"unknown flag", []string{"offsets", "reset", "--to-earliest", "--force"}, "-force"},
		{"stray argument", []string{"offsets", "reset", "--to-earliest", "events"}, `"events"`},
		{"dlq without subcommand", []string{"dlq"}, "ls or replay"},
		{"dlq unknown subcommand", []string{"dlq", "purge"}, "ls or replay"},
		{"dlq ls unknown flag", []string{"dlq", "ls", "--reason", "x"}, "-reason"},
		{"replay bad regex", []string{"dlq", "replay", "--reason", "(unclosed"}, "--reason"},
		{"replay bad since", []string{"dlq", "replay", "--since", "2026-13-01T00:00:00Z"}, "--since"},
		{"replay bad until", []string{"dlq", "replay", "--until", "now"}, "--until"},
		{"replay until before since", []string{"dlq", "replay", "--since", "2026-12-03T10:00:00Z", "--until", "2026-12-03T09:00:00Z"}, "--until"},
		{"replay bad partitions", []string{"dlq", "replay", "--partitions", "a"}, "--partitions"},
		{"replay empty topic", []string{"dlq", "replay", "--topic="}, "--topic"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			// Brokers and database point nowhere: a usage error must stop
			// the command before it tries either.
			env := []string{"RATCHET_KAFKA_BROKERS=127.0.0.1:1", "RATCHET_POSTGRES_URL=postgres://127.0.0.1:1/x"}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			code := Run(ctx, tc.args, env, &out, &errOut)
			if code != ExitConfig {
				t.Fatalf("exit %d, want %d; stderr: %s", code, ExitConfig, errOut.String())
			}
			if !strings.Contains(errOut.String(), tc.want) {
				t.Errorf("stderr does not name %s: %s", tc.want, errOut.String())
			}
			if out.Len() != 0 {
				t.Errorf("stdout not empty: %q", out.String())
			}
		})
	}
}

func TestParseResetArgs(t *testing.T) {
	at := time.Date(2026, 12, 3, 14, 0, 0, 0, time.UTC)
	cases := []struct {
		name string
		args []string
		want resetOptions
	}{
		{"earliest", []string{"--to-earliest"}, resetOptions{target: toEarliest}},
		{"latest with everything", []string{"--to-latest", "--topic", "events", "--partitions", "5,0,3", "--execute", "--config", "f.yaml"},
			resetOptions{target: toLatest, topic: "events", partitions: []int32{0, 3, 5}, execute: true, config: "f.yaml"}},
		{"offset zero", []string{"--to-offset", "0"}, resetOptions{target: toOffset}},
		{"offset", []string{"--to-offset=42"}, resetOptions{target: toOffset, offset: 42}},
		{"datetime", []string{"--to-datetime", "2026-12-03T15:00:00+01:00"}, resetOptions{target: toDatetime, at: at}},
		{"shift back", []string{"--shift-by", "-100"}, resetOptions{target: shiftBy, shift: -100}},
		{"shift forward", []string{"--shift-by", "7"}, resetOptions{target: shiftBy, shift: 7}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var errOut bytes.Buffer
			got, err := parseResetArgs(&env{stderr: &errOut}, tc.args)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if got.target != tc.want.target || got.offset != tc.want.offset || got.shift != tc.want.shift ||
				!got.at.Equal(tc.want.at) || got.topic != tc.want.topic || got.execute != tc.want.execute ||
				got.config != tc.want.config || !equalParts(got.partitions, tc.want.partitions) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func equalParts(a, b []int32) bool {
	if len(a) != len(b) || (a == nil) != (b == nil) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestResetTarget is the decision where a partition goes, log bounds
// [100, 500), for each flag.
func TestResetTarget(t *testing.T) {
	row := resetRow{Low: 100, High: 500, Committed: -1}
	cases := []struct {
		name     string
		o        resetOptions
		r        resetRow
		current  int64
		want     int64
		clamped  bool
		autoLast bool
	}{
		{"earliest", resetOptions{target: toEarliest}, row, 300, 100, false, false},
		{"latest", resetOptions{target: toLatest}, row, 300, 500, false, false},
		{"offset inside", resetOptions{target: toOffset, offset: 250}, row, 300, 250, false, false},
		{"offset at end", resetOptions{target: toOffset, offset: 500}, row, 300, 500, false, false},
		{"offset before start", resetOptions{target: toOffset, offset: 3}, row, 300, 100, true, false},
		{"offset after end", resetOptions{target: toOffset, offset: 9000}, row, 300, 500, true, false},
		{"datetime found", resetOptions{target: toDatetime}, resetRow{Low: 100, High: 500, To: 321}, 300, 321, false, false},
		{"datetime after last record", resetOptions{target: toDatetime}, resetRow{Low: 100, High: 500, To: -1}, 300, 500, true, false},
		{"shift back", resetOptions{target: shiftBy, shift: -50}, row, 300, 250, false, false},
		{"shift forward", resetOptions{target: shiftBy, shift: 50}, row, 300, 350, false, false},
		{"shift before start", resetOptions{target: shiftBy, shift: -250}, row, 300, 100, true, false},
		{"shift past end", resetOptions{target: shiftBy, shift: 250}, row, 300, 500, true, false},
		{"shift without position uses committed", resetOptions{target: shiftBy, shift: 10}, resetRow{Low: 100, High: 500, Committed: 200}, -1, 210, false, false},
		{"shift without any position: log start", resetOptions{target: shiftBy, shift: 10}, row, -1, 110, false, false},
		{"shift without any position, auto reset latest", resetOptions{target: shiftBy, shift: -10}, row, -1, 490, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			auto := "earliest"
			if tc.autoLast {
				auto = "latest"
			}
			got, note := target(tc.o, tc.r, tc.current, auto)
			if got != tc.want {
				t.Errorf("target = %d, want %d (note %q)", got, tc.want, note)
			}
			if clamped := strings.Contains(note, "clamped"); clamped != tc.clamped {
				t.Errorf("note %q, clamped %v, want %v", note, clamped, tc.clamped)
			}
		})
	}
}
