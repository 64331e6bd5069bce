package actors

import "testing"

func TestResumeAtLeastOnce(t *testing.T) {
	for _, tc := range []struct {
		name               string
		committed, applied int64
		lost               bool
		low, high          int64
		want               position
	}{
		{"committed offset", 40, 0, false, 0, 100, position{Start: 40}},
		{"nothing committed: auto.offset.reset", -1, 0, false, 0, 100, position{Start: -1}},
		{"committed at the end", 100, 0, false, 0, 100, position{Start: 100}},
		{"committed past the end: topic recreated", 150, 0, false, 0, 100, position{Start: 0, PastEnd: true}},
		{"lost, came back, applied ahead", 40, 70, true, 0, 100, position{Start: 70, Resumed: true}},
		{"lost, the next owner committed further", 80, 70, true, 0, 100, position{Start: 80}},
		{"lost, nothing committed", -1, 70, true, 0, 100, position{Start: 70, Resumed: true}},
		{"lost, applied past a recreated log", 40, 170, true, 0, 100, position{Start: 40}},
		{"lost, both past a recreated log", 150, 170, true, 0, 100, position{Start: 0, PastEnd: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := resumeAtLeastOnce(tc.committed, tc.applied, tc.lost, tc.low, tc.high); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestClaimFallback(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		committed, low, high int64
		reset                string
		want                 int64
	}{
		{"committed inside the log", 40, 10, 100, "earliest", 40},
		{"committed at the end", 100, 10, 100, "earliest", 100},
		{"nothing committed, earliest", -1, 10, 100, "earliest", 10},
		{"nothing committed, latest", -1, 10, 100, "latest", 100},
		{"committed past the end, earliest", 150, 10, 100, "earliest", 10},
		{"committed past the end, latest", 150, 10, 100, "latest", 100},
		{"committed below the log start is kept", 5, 10, 100, "earliest", 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := claimFallback(tc.committed, tc.low, tc.high, tc.reset); got != tc.want {
				t.Errorf("got %d, want %d", got, tc.want)
			}
		})
	}
}

func TestResumeClaimed(t *testing.T) {
	for _, tc := range []struct {
		name            string
		next, low, high int64
		want            position
	}{
		{"stored position", 40, 0, 100, position{Start: 40}},
		{"stored at the end", 100, 0, 100, position{Start: 100}},
		{"past the end: topic recreated", 150, 0, 100, position{Start: 0, PastEnd: true}},
		{"below the log start: retention deleted records", 5, 20, 100, position{Start: 5, Deleted: 15}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := resumeClaimed(tc.next, tc.low, tc.high); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
