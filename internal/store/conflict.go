package store

import (
	"errors"
	"fmt"
)

// ErrFenced means another claim of the partition is newer than the one a
// batch was applied under: the partition belongs to someone else now.
var ErrFenced = errors.New("partition fenced by a newer claim")

// ErrOffsetMismatch means a batch does not start at the partition's stored
// position: applying it would skip (gap) or re-apply (overlap) records.
var ErrOffsetMismatch = errors.New("batch does not start at the stored offset")

// ConflictKind says why the offset guard refused a batch.
type ConflictKind int

const (
	// Fenced: the stored epoch is not the batch's claim epoch.
	Fenced ConflictKind = iota + 1
	// Gap: the batch starts after the stored position; records between
	// would be skipped.
	Gap
	// Overlap: the batch starts before the stored position; records would be
	// applied twice.
	Overlap
)

// String returns "fenced", "gap" or "overlap"; the values are stable and
// used as metric label values.
func (k ConflictKind) String() string {
	switch k {
	case Fenced:
		return "fenced"
	case Gap:
		return "gap"
	case Overlap:
		return "overlap"
	default:
		return fmt.Sprintf("conflict(%d)", int(k))
	}
}

// OffsetConflictError is returned by Store.Apply when the offset guard
// refuses a batch; the transaction, processor writes included, was rolled
// back. errors.Is matches ErrFenced for Kind Fenced and ErrOffsetMismatch for
// Gap and Overlap.
type OffsetConflictError struct {
	Kind      ConflictKind
	Group     string
	Topic     string
	Partition int32
	// Epoch is the batch's claim epoch, StoredEpoch the one in the store
	// (0 when the row is gone).
	Epoch       int64
	StoredEpoch int64
	// Start is where the batch begins, StoredNext the stored position (-1
	// when the row is gone).
	Start      int64
	StoredNext int64
}

// Error describes the refusal: the epochs for Fenced, the positions for Gap
// and Overlap.
func (e *OffsetConflictError) Error() string {
	switch e.Kind {
	case Fenced:
		if e.StoredEpoch == 0 {
			return fmt.Sprintf("offset guard %s[%d]: fenced: epoch %d, offset row missing", e.Topic, e.Partition, e.Epoch)
		}
		return fmt.Sprintf("offset guard %s[%d]: fenced: epoch %d, stored epoch %d", e.Topic, e.Partition, e.Epoch, e.StoredEpoch)
	default:
		return fmt.Sprintf("offset guard %s[%d]: %s: batch starts at %d, stored next offset %d", e.Topic, e.Partition, e.Kind, e.Start, e.StoredNext)
	}
}

// Unwrap returns ErrFenced or ErrOffsetMismatch according to Kind.
func (e *OffsetConflictError) Unwrap() error {
	if e.Kind == Fenced {
		return ErrFenced
	}
	return ErrOffsetMismatch
}

// IsFenced reports whether err says that a newer claim owns the partition.
func IsFenced(err error) bool { return errors.Is(err, ErrFenced) }

// IsOffsetConflict reports whether err is an *OffsetConflictError of any
// kind: the batch was refused and must never be retried as it is.
func IsOffsetConflict(err error) bool {
	var c *OffsetConflictError
	return errors.As(err, &c)
}

// ConflictReason returns the Kind of the *OffsetConflictError in err as a
// label value ("fenced", "gap", "overlap"), or "" when err is none.
func ConflictReason(err error) string {
	var c *OffsetConflictError
	if !errors.As(err, &c) {
		return ""
	}
	return c.Kind.String()
}
