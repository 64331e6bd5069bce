package actors

import (
	"errors"
	"fmt"
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

func TestGroupRefusal(t *testing.T) {
	ke := func(c kafka.ErrorCode) error { return kafka.NewError(c, c.String(), false) }
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"nil", nil, ""},
		{"rebalance in progress", ke(kafka.ErrRebalanceInProgress), "group_rebalancing"},
		{"illegal generation, wrapped", fmt.Errorf("commit events[0]: %w", ke(kafka.ErrIllegalGeneration)), "group_generation"},
		{"unknown member, joined with others", errors.Join(errors.New("x"),
			fmt.Errorf("commit events[1]: %w", ke(kafka.ErrUnknownMemberID))), "group_unknown_member"},
		{"coordinator moved", ke(kafka.ErrNotCoordinator), "group_coordinator"},
		{"coordinator loading", ke(kafka.ErrCoordinatorLoadInProgress), "group_coordinator"},
		{"timeout is not the group", ke(kafka.ErrTimedOut), ""},
		{"fenced is not resolved by rejoining", ke(kafka.ErrFencedInstanceID), ""},
		{"plain error", errors.New("boom"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := GroupRefusal(tc.err); got != tc.want {
				t.Errorf("GroupRefusal(%v) = %q, want %q", tc.err, got, tc.want)
			}
		})
	}
}
