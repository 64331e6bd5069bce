package actors

import (
	"errors"
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

func TestCommittedOffsets(t *testing.T) {
	topic := "events"
	tp := func(p int32, off kafka.Offset, err error) kafka.TopicPartition {
		return kafka.TopicPartition{Topic: &topic, Partition: p, Offset: off, Error: err}
	}
	asked := []kafka.TopicPartition{tp(0, kafka.OffsetInvalid, nil), tp(1, kafka.OffsetInvalid, nil)}
	coordinator := kafka.NewError(kafka.ErrNotCoordinator, "coordinator moved", false)
	timedOut := kafka.NewError(kafka.ErrTimedOut, "timed out", false)
	for _, tc := range []struct {
		name    string
		res     []kafka.TopicPartition
		err     error
		want    []int64
		wantErr []bool
	}{
		{"both committed", []kafka.TopicPartition{tp(0, 40, nil), tp(1, 7, nil)}, nil,
			[]int64{40, 7}, []bool{false, false}},
		{"the group has no offset: the only way to auto.offset.reset", []kafka.TopicPartition{tp(0, kafka.OffsetInvalid, nil), tp(1, 0, nil)}, nil,
			[]int64{-1, 0}, []bool{false, false}},
		{"answer in another order", []kafka.TopicPartition{tp(1, 7, nil), tp(0, 40, nil)}, nil,
			[]int64{40, 7}, []bool{false, false}},
		{"the whole call failed", nil, timedOut,
			[]int64{-1, -1}, []bool{true, true}},
		{"the whole call failed with partial answers", []kafka.TopicPartition{tp(0, 40, nil), tp(1, 7, nil)}, timedOut,
			[]int64{-1, -1}, []bool{true, true}},
		{"one partition's own error", []kafka.TopicPartition{tp(0, kafka.OffsetInvalid, coordinator), tp(1, 7, nil)}, nil,
			[]int64{-1, 7}, []bool{true, false}},
		{"a partition missing from the answer", []kafka.TopicPartition{tp(1, 7, nil)}, nil,
			[]int64{-1, 7}, []bool{true, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, errs := committedOffsets(asked, tc.res, tc.err)
			for i := range asked {
				if got[i] != tc.want[i] || (errs[i] != nil) != tc.wantErr[i] {
					t.Errorf("partition %d: got %d, %v; want %d, error %v", i, got[i], errs[i], tc.want[i], tc.wantErr[i])
				}
			}
			if tc.err != nil && !errors.Is(errs[0], tc.err) {
				t.Errorf("the call's error is not kept: %v", errs[0])
			}
		})
	}
}

func TestResumeAtLeastOnce(t *testing.T) {
	for _, tc := range []struct {
		name               string
		committed, applied int64
		lost               bool
		low, high          int64
		reset              string
		want               position
	}{
		{"committed offset", 40, 0, false, 0, 100, "earliest", position{Start: 40}},
		{"nothing committed: earliest", -1, 0, false, 0, 100, "earliest", position{Start: 0}},
		{"nothing committed, log start moved: earliest", -1, 0, false, 20, 100, "earliest", position{Start: 20}},
		{"nothing committed: latest", -1, 0, false, 20, 100, "latest", position{Start: 100}},
		{"committed at the end", 100, 0, false, 0, 100, "earliest", position{Start: 100}},
		{"committed at the log start", 20, 0, false, 20, 100, "earliest", position{Start: 20}},
		{"committed past the end: topic recreated", 150, 0, false, 0, 100, "earliest", position{Start: 0, PastEnd: true}},
		{"committed below the log start: retention deleted records", 5, 0, false, 20, 100, "earliest", position{Start: 20, Deleted: 15}},
		{"lost, came back, applied ahead", 40, 70, true, 0, 100, "earliest", position{Start: 70, Resumed: true}},
		{"lost, the next owner committed further", 80, 70, true, 0, 100, "earliest", position{Start: 80}},
		{"lost, nothing committed", -1, 70, true, 0, 100, "earliest", position{Start: 70, Resumed: true}},
		{"lost, applied past a recreated log", 40, 170, true, 0, 100, "earliest", position{Start: 40}},
		{"lost, both past a recreated log", 150, 170, true, 0, 100, "earliest", position{Start: 0, PastEnd: true}},
		{"lost, applied below the log start", 5, 10, true, 20, 100, "earliest", position{Start: 20, Resumed: true, Deleted: 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := resumeAtLeastOnce(tc.committed, tc.applied, tc.lost, tc.low, tc.high, tc.reset); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestFirstClaim(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		committed, low, high int64
		reset                string
		want                 position
	}{
		{"committed inside the log", 40, 10, 100, "earliest", position{Start: 40}},
		{"committed inside the log, latest is not used", 40, 10, 100, "latest", position{Start: 40}},
		{"committed at the end", 100, 10, 100, "latest", position{Start: 100}},
		{"committed at the log start", 10, 10, 100, "latest", position{Start: 10}},
		{"nothing committed, earliest", -1, 10, 100, "earliest", position{Start: 10}},
		{"nothing committed, latest", -1, 10, 100, "latest", position{Start: 100}},
		{"committed past the end: topic recreated, earliest", 150, 10, 100, "earliest", position{Start: 10, PastEnd: true}},
		{"committed past the end: topic recreated, latest", 150, 10, 100, "latest", position{Start: 10, PastEnd: true}},
		{"committed below the log start: clamped, earliest", 5, 10, 100, "earliest", position{Start: 10, Deleted: 5}},
		{"committed below the log start: clamped, latest", 5, 10, 100, "latest", position{Start: 10, Deleted: 5}},
		{"empty log, nothing committed, latest", -1, 0, 0, "latest", position{Start: 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := firstClaim(tc.committed, tc.low, tc.high, tc.reset); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
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
		{"stored at the log start", 20, 20, 100, position{Start: 20}},
		{"past the end: topic recreated", 150, 0, 100, position{Start: 0, PastEnd: true}},
		{"below the log start: retention deleted records", 5, 20, 100, position{Start: 20, Deleted: 15}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := resumeClaimed(tc.next, tc.low, tc.high); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
