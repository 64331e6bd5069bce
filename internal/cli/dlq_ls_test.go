package cli

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
)

// `dlq ls` groups dead letters by source topic, pipeline, reason class
// and SQLSTATE, not by their text: 684 dead letters of two causes are two
// lines, each with its count, offset ranges per partition and one example,
// whose record values are left out unless log.include_values. Dead letters
// written before the ratchet.reason header existed are grouped by their
// text without its addresses.
func TestDLQLsGroupsByPipelineAndReason(t *testing.T) {
	failed := time.Date(2026, 12, 4, 16, 0, 0, 0, time.UTC)
	var letters []deadLetter
	for i := range 684 {
		p, off := int32(i%3), int64(10+i)
		d := deadLetter{DLQTopic: "app_events.dlq", Topic: "app_events", Partition: p, Offset: off, FailedAt: failed.Add(time.Duration(i) * time.Second)}
		if i%6 == 0 {
			d.Class, d.Pipeline, d.SQLState = "refused_by_postgres", "orders", "22P02"
			d.Reason = fmt.Sprintf(`apply app_events[%d] offsets %d..%d: pipeline orders: upsert 1 rows of orders: ERROR: invalid input syntax for type numeric: "card-%d" (SQLSTATE 22P02)`, p, off, off+1, i)
		} else {
			d.Class, d.Pipeline = "expression", "orders"
			d.Reason = fmt.Sprintf(`apply app_events[%d] offsets %d..%d: pipelines: pipeline orders: record app_events[%d]@%d: rollup.time: "soon-%d" is not an RFC 3339 time`, p, off, off+1, p, off, i)
		}
		letters = append(letters, d)
	}
	// Two of an older ratchet, at different offsets, with one cause.
	for _, off := range []int64{3, 5} {
		letters = append(letters, deadLetter{DLQTopic: "app_events.dlq", Topic: "app_events", Partition: 1, Offset: off, FailedAt: failed,
			Reason: fmt.Sprintf("apply app_events[1] offsets %d..%d: processor: unknown customer", off, off+1)})
	}
	var out bytes.Buffer
	writeDLQSummary(&out, "app_events.dlq", letters, false)
	t.Logf("\n%s", out.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 5 || lines[0] != "app_events.dlq: 686 dead letters" {
		t.Fatalf("want a title, a header and 3 groups:\n%s", out.String())
	}
	for i, want := range [][]string{
		{"app_events", "-", "-", "-", "2", "1:3..5"},
		{"app_events", "orders", "expression", "-", "570", "0:13..691,1:11..692,2:12..693"},
		{"app_events", "orders", "refused_by_postgres", "22P02", "114", "0:10..688"},
	} {
		f := strings.Fields(lines[2+i])
		if len(f) < len(want) || strings.Join(f[:len(want)], " ") != strings.Join(want, " ") {
			t.Errorf("group %d: %q, want it to start with %q", i, lines[2+i], want)
		}
	}
	if !strings.Contains(lines[3], `app_events[0]@13: apply app_events[0] offsets 13..14: pipelines: pipeline orders: record app_events[0]@13: rollup.time: "…" is not an RFC 3339 time`) {
		t.Errorf("the expression group's example: %s", lines[3])
	}
	if strings.Contains(out.String(), "soon-") || strings.Contains(out.String(), "card-") {
		t.Errorf("record values in the output:\n%s", out.String())
	}
	out.Reset()
	writeDLQSummary(&out, "app_events.dlq", letters, true)
	if !strings.Contains(out.String(), `"card-0"`) {
		t.Errorf("with log.include_values the example keeps its value:\n%s", out.String())
	}
}
