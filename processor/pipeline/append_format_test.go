package pipeline

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// copyTimeByFmt is appendCopyTime's format spelled with fmt, the form it
// replaced.
func copyTimeByFmt(t time.Time) string {
	t = t.UTC().Truncate(time.Microsecond)
	year, bc := t.Year(), false
	if year <= 0 {
		year, bc = 1-year, true
	}
	s := fmt.Sprintf("%04d-%02d-%02d %02d:%02d:%02d.%06d+00", year, int(t.Month()), t.Day(),
		t.Hour(), t.Minute(), t.Second(), t.Nanosecond()/1000)
	if bc {
		s += " BC"
	}
	return s
}

func TestAppendCopyTimeMatchesTheFmtForm(t *testing.T) {
	paris := time.FixedZone("CET", 3600)
	times := []time.Time{
		time.Date(2026, 12, 4, 16, 30, 0, 0, time.UTC),
		time.Date(2026, 12, 4, 16, 30, 0, 123456789, paris), // another zone, nanoseconds cut
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(0, 12, 31, 23, 59, 59, 999999999, time.UTC), // 1 BC
		time.Date(-4712, 1, 1, 12, 0, 0, 0, time.UTC),
		time.Date(294276, 12, 31, 23, 59, 59, 999999000, time.UTC), // five digits and more
		time.Date(999, 3, 9, 7, 5, 3, 1000, time.UTC),
		time.Unix(0, 0),
	}
	r := rand.New(rand.NewPCG(33, 2))
	for range 10000 {
		times = append(times, time.Unix(r.Int64N(1<<40)-1<<39, r.Int64N(1e9)).In(paris))
	}
	for _, tm := range times {
		got, want := string(appendCopyTime([]byte("x"), tm)), "x"+copyTimeByFmt(tm)
		if got != want {
			t.Fatalf("appendCopyTime(%v) = %q, want %q", tm, got, want)
		}
	}
}

func TestAppendZeroPadded(t *testing.T) {
	for _, c := range []struct {
		v, width int
	}{{0, 1}, {0, 4}, {7, 2}, {42, 2}, {123, 2}, {5, 6}, {999999, 6}, {12345, 4}} {
		if got, want := string(appendZeroPadded([]byte("ab"), c.v, c.width)), fmt.Sprintf("ab%0*d", c.width, c.v); got != want {
			t.Errorf("appendZeroPadded(%d, %d) = %q, want %q", c.v, c.width, got, want)
		}
	}
}

// copyEscapedByByte is appendCopyEscaped's escaping one byte at a time,
// the form it replaced.
func copyEscapedByByte(s string) string {
	var sb strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			sb.WriteString(`\\`)
		case '\n':
			sb.WriteString(`\n`)
		case '\r':
			sb.WriteString(`\r`)
		case '\t':
			sb.WriteString(`\t`)
		default:
			sb.WriteByte(c)
		}
	}
	return sb.String()
}

func TestAppendCopyEscaped(t *testing.T) {
	cases := []string{"", "plain", `a\b`, "\\", "\n", "tab\there", "end\r\n", "\t\t\\\\\n", "é\x00ü\\", "\\x"}
	r := rand.New(rand.NewPCG(33, 4))
	alphabet := []byte("ab\\\n\r\t é")
	for range 2000 {
		b := make([]byte, r.IntN(20))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		cases = append(cases, string(b))
	}
	for _, s := range cases {
		if got, want := string(appendCopyEscaped([]byte("p"), s)), "p"+copyEscapedByByte(s); got != want {
			t.Fatalf("appendCopyEscaped(%q) = %q, want %q", s, got, want)
		}
	}
}

// BenchmarkAppendCopyText is one append row's fields of the bench's order
// log (section (j2)): partition, offset, key, status, customer, amount and
// timestamp.
func BenchmarkAppendCopyText(b *testing.B) {
	row := []any{int64(7), int64(123456), "o4711", "new", "c42", 249.75, time.Date(2026, 12, 4, 16, 30, 0, 123456000, time.UTC)}
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		buf = buf[:0]
		for i, v := range row {
			if i > 0 {
				buf = append(buf, '\t')
			}
			buf = appendCopyText(buf, v)
		}
	}
}

// A buffer a failed COPY may still be reading is never handed to another
// batch; a written one is.
func TestCopyRowsReleaseKeepsALentBuffer(t *testing.T) {
	var r copyRows
	r.take()
	r.buf = append(r.buf, "lent row\n"...)
	lent := r.buf
	r.lent = true
	r.release()
	if r.buf != nil || r.n != 0 || r.lent {
		t.Fatalf("after release: %+v", r)
	}
	reused := false
	for range 100 {
		var o copyRows
		o.take()
		if cap(o.buf) > 0 && &o.buf[:1][0] == &lent[0] {
			t.Fatal("a lent buffer was handed out again")
		}
		o.buf = append(o.buf, "other batch\n"...)
		first := &o.buf[0]
		o.release()
		var again copyRows
		again.take()
		reused = reused || (cap(again.buf) > 0 && &again.buf[:1][0] == first)
		again.release()
	}
	if string(lent) != "lent row\n" {
		t.Fatalf("the lent buffer was overwritten: %q", lent)
	}
	if !reused {
		t.Fatal("a released buffer was never handed out again")
	}
}
