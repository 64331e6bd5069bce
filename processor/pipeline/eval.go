package pipeline

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/interpreter"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	"ratchet/internal/partial"
	ratchetv1 "ratchet/messages/ratchet/v1"
	"ratchet/processor"
)

// activation returns the CEL variables of rec: value (what the topic's
// format decoded) and record (its Kafka metadata, built on first use: most
// pipelines read only value). It is used on one goroutine, for one record;
// evaluations under it stop when ctx (the batch's) ends.
func activation(ctx context.Context, rec *processor.Record, format string, adapter types.Adapter) (interpreter.Activation, error) {
	a := &recordActivation{}
	a.reset(ctx, rec, format, adapter)
	return a, nil
}

// reset makes a the activation of rec (see activation), forgetting the
// record before: one activation serves a batch's records in turn.
func (a *recordActivation) reset(ctx context.Context, rec *processor.Record, format string, adapter types.Adapter) {
	*a = recordActivation{ctx: ctx, rec: rec, adapter: adapter}
	switch {
	case rec.Value == nil:
	case format == "event":
		if rec.Event != nil {
			a.value = rec.Event
		}
	default:
		a.value = rec.Decoded
	}
}

// recordActivation resolves value and record for one record.
type recordActivation struct {
	ctx     context.Context
	rec     *processor.Record
	adapter types.Adapter
	value   any
	// valueVal and recordVal are value and record converted to CEL values,
	// once per record however many expressions read them.
	valueVal, recordVal ref.Val
}

// ResolveName implements interpreter.Activation.
func (a *recordActivation) ResolveName(name string) (any, bool) {
	switch name {
	case "value":
		if a.valueVal == nil {
			if a.value == nil {
				a.valueVal = types.NullValue
			} else {
				a.valueVal = a.adapter.NativeToValue(plainValue(a.value))
			}
		}
		return a.valueVal, true
	case "record":
		if a.recordVal == nil {
			a.recordVal = a.adapter.NativeToValue(recordVar(a.rec))
		}
		return a.recordVal, true
	}
	return nil, false
}

// Parent implements interpreter.Activation: there is none.
func (a *recordActivation) Parent() interpreter.Activation { return nil }

// recordVar is the record variable of rec.
func recordVar(rec *processor.Record) map[string]any {
	headers := make(map[string][]byte, len(rec.Headers))
	for _, h := range rec.Headers {
		headers[h.Key] = h.Value // the last of a name wins
	}
	key := rec.Key
	if key == nil {
		key = []byte{}
	}
	return map[string]any{
		"key":       key,
		"headers":   headers,
		"timestamp": rec.Timestamp,
		"topic":     rec.Topic,
		"partition": int64(rec.Partition),
		"offset":    rec.Offset,
	}
}

// eval evaluates e; an evaluation error names e's key path. Unless e is
// bounded, under a record's activation the evaluation stops when the
// batch's context ends, with an error wrapping ErrInterrupted and the
// context's (no fault of the record), and past e's cost limit, with a
// record error that says so.
func (e *expr) eval(act interpreter.Activation) (ref.Val, error) {
	if e.form != nil {
		if v, ok := e.fast(act); ok {
			return v, nil
		}
	}
	if e.bounded {
		v, _, err := e.prg.Eval(act)
		if err != nil {
			return nil, fmt.Errorf("%s: %s", e.shortKey(), err)
		}
		return v, nil
	}
	ctx := context.Background()
	if a, ok := act.(*recordActivation); ok && a.ctx != nil {
		ctx = a.ctx
	}
	v, _, err := e.prg.ContextEval(ctx, act)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return nil, fmt.Errorf("%s: %w: %w", e.shortKey(), ErrInterrupted, cerr)
		}
		var cancelled interpreter.EvalCancelledError
		if errors.As(err, &cancelled) && cancelled.Cause == interpreter.CostLimitExceeded {
			return nil, fmt.Errorf("%s: CEL cost over the pipeline's cost_limit %d on this record", e.shortKey(), e.costLimit)
		}
		return nil, fmt.Errorf("%s: %s", e.shortKey(), err)
	}
	return v, nil
}

// timeOf evaluates e, a rollup's time, to a time as toTime reads its
// value. record.timestamp is read as it is, without making a CEL value of
// it (which allocates); the same time and the same refusals as through
// eval and toTime.
func (e *expr) timeOf(act interpreter.Activation) (time.Time, error) {
	if f := e.form; f != nil && f.record == "timestamp" {
		if a, ok := act.(*recordActivation); ok {
			t, err := inRange(a.rec.Timestamp)
			if err != nil {
				return time.Time{}, fmt.Errorf("%s: %w", e.shortKey(), err)
			}
			return t, nil
		}
	}
	v, err := e.eval(act)
	if err != nil {
		return time.Time{}, err
	}
	t, err := toTime(v, e.bounds(act))
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: %w", e.shortKey(), err)
	}
	return t, nil
}

// ErrInterrupted wraps the error of an evaluation the batch's context
// stopped: the batch is to be retried, not its record dead-lettered.
var ErrInterrupted = errors.New("evaluation interrupted")

// fast evaluates e without the interpreter when e has a form (see form)
// and the record allows; false: the interpreter decides.
func (e *expr) fast(act interpreter.Activation) (ref.Val, bool) {
	a, ok := act.(*recordActivation)
	if !ok || e.form == nil {
		return nil, false
	}
	return e.form.eval(a, e.fastLen)
}

// path evaluates a field path of value (value.a.b) on a JSON or Avro map,
// a partly decoded JSON object or a ratchet.v1.Event. It returns false for anything else, and wherever
// CEL's answer could differ (a key that is absent, an unset message
// field): the interpreter then decides.
func (a *recordActivation) path(path []string) (ref.Val, bool) {
	if a.value == nil {
		return nil, false
	}
	cur := a.value
	for i, name := range path {
		switch x := cur.(type) {
		case map[string]any, *object, *partial.Fields:
			v, ok := field(x, name)
			if !ok {
				return nil, false
			}
			cur = v
		case *ratchetv1.Event:
			if i != len(path)-1 {
				return nil, false
			}
			switch name {
			case "metric":
				return types.String(x.GetMetric()), true
			case "value":
				return types.Double(x.GetValue()), true
			case "id":
				return types.String(x.GetId()), true
			case "time":
				if x.GetTime() == nil {
					return nil, false
				}
				return types.Timestamp{Time: x.GetTime().AsTime()}, true
			}
			return nil, false
		default:
			return nil, false
		}
	}
	switch x := cur.(type) {
	case string:
		return types.String(x), true
	case int64:
		return types.Int(x), true
	case float64:
		return types.Double(x), true
	case bool:
		return types.Bool(x), true
	case nil:
		return types.NullValue, true
	case map[string]any, []any, *object, *partial.Fields:
		return nil, false // containers: the interpreter adapts them
	}
	return a.adapter.NativeToValue(cur), true
}

// shortKey is the key path without the pipelines[i] prefix (the pipeline
// is named next to it): upsert.columns.amount.
func (e *expr) shortKey() string { return shortKey(e.key) }

// shortKey drops the pipelines[i] prefix of a key path.
func shortKey(key string) string {
	if _, rest, ok := strings.Cut(key, "]."); ok {
		return rest
	}
	return key
}

// whereHolds evaluates a where expression: its result must be a bool.
func (e *expr) whereHolds(act interpreter.Activation) (bool, error) {
	v, err := e.eval(act)
	if err != nil {
		return false, err
	}
	b, ok := v.(types.Bool)
	if !ok {
		return false, fmt.Errorf("%s: yields %s, not a bool", e.shortKey(), v.Type().TypeName())
	}
	return bool(b), nil
}

// text renders a CEL value as the text PostgreSQL reads for a column of
// type pgType (format_type's spelling): a string, or nil for SQL NULL. The statement
// casts it to the column's type, so PostgreSQL itself refuses what does
// not fit (a record error, SQLSTATE class 22).
func text(v ref.Val, pgType string) (any, error) {
	var s string
	switch x := v.(type) {
	case types.Null:
		return nil, nil
	case types.String:
		return string(x), nil
	case types.Bool:
		s = strconv.FormatBool(bool(x))
	case types.Int:
		s = strconv.FormatInt(int64(x), 10)
	case types.Uint:
		s = strconv.FormatUint(uint64(x), 10)
	case types.Double:
		s = formatFloat(float64(x))
	case types.Bytes:
		if pgType == "bytea" {
			s = `\x` + hex.EncodeToString(x)
		} else {
			s = string(x)
		}
	case types.Timestamp:
		s = x.Time.UTC().Format(time.RFC3339Nano)
	case types.Duration:
		s = strconv.FormatFloat(x.Duration.Seconds(), 'f', -1, 64) + " seconds"
	default:
		native, err := v.ConvertToNative(reflect.TypeOf(&structpb.Value{}))
		if err != nil {
			return nil, fmt.Errorf("a %s cannot be written to a column", v.Type().TypeName())
		}
		b, err := protojson.Marshal(native.(*structpb.Value))
		if err != nil {
			return nil, fmt.Errorf("a %s cannot be written as JSON: %w", v.Type().TypeName(), err)
		}
		s = string(b)
	}
	return s, nil
}

func formatFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// bucketStart is the start of t's bucket, buckets aligned to the Unix
// epoch in UTC (so 1m, 1h and 24h buckets start on the minute, hour and
// day).
func bucketStart(t time.Time, bucket time.Duration) time.Time {
	sec := int64(bucket / time.Second)
	u := t.Unix()
	start := u - ((u%sec)+sec)%sec
	return time.Unix(start, 0).UTC()
}

// number is a sum, min or max operand: an int64 while every operand was
// an integer, a float64 from the first non-integer on.
type number struct {
	isFloat bool
	i       int64
	f       float64
}

func toNumber(v ref.Val) (number, error) {
	switch x := v.(type) {
	case types.Int:
		return number{i: int64(x)}, nil
	case types.Uint:
		if uint64(x) > math.MaxInt64 {
			return number{isFloat: true, f: float64(x)}, nil
		}
		return number{i: int64(x)}, nil
	case types.Double:
		return number{isFloat: true, f: float64(x)}, nil
	}
	return number{}, fmt.Errorf("a %s is not a number", v.Type().TypeName())
}

func (n number) float() float64 {
	if n.isFloat {
		return n.f
	}
	return float64(n.i)
}

func (n number) String() string {
	if n.isFloat {
		return formatFloat(n.f)
	}
	return strconv.FormatInt(n.i, 10)
}

// add returns n + m; an int64 overflow turns the sum into a float64.
func (n number) add(m number) number {
	if !n.isFloat && !m.isFloat {
		s := n.i + m.i
		if (s > n.i) == (m.i > 0) {
			return number{i: s}
		}
	}
	return number{isFloat: true, f: n.float() + m.float()}
}

func (n number) less(m number) bool {
	if !n.isFloat && !m.isFloat {
		return n.i < m.i
	}
	return n.float() < m.float()
}
