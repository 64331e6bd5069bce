package web

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// The server-side rendering of the page. app.js builds the same markup from
// /api/state; keep the two in step (class names, chart geometry, formats).

// Chart geometry, in SVG user units: one slot per minute bucket.
const (
	chartWidth  = 300.0
	chartHeight = 80.0
	chartTop    = 4.0 // head room above the tallest bar
	slotWidth   = chartWidth / windowMinutes
	barWidth    = slotWidth * 0.72
)

type pageView struct {
	Title       string
	Instance    string
	Group       string
	Mode        string
	ModeClass   string
	State       string
	StateClass  string
	Reason      string
	Error       string
	GeneratedAt string
	Window      int
	Summary     []summaryView
	Rows        []rowView
	Metrics     []metricView
	// ShowDeadLetters is set when the source reports dead-letter reasons.
	ShowDeadLetters bool
	DeadLetters     []deadLetterView
	// ShowPipelines is set when the source runs configured pipelines.
	ShowPipelines bool
	Pipelines     []pipelineView
	// ShowDashboard is false when the Dashboard panel has nothing to chart
	// (pipelines replace the built-in processor).
	ShowDashboard bool
}

type pipelineView struct {
	Name, Topic, Sink, Table                 string
	Written, Filtered, Ignored, DeadLettered string
	Rows                                     string
	DLClass                                  string
}

type deadLetterView struct {
	Topic    string
	Pipeline string
	Class    string // the reason class, with the SQLSTATE when there is one
	Reason   string
	Count    string
	Last     string
}

type summaryView struct {
	Key   string
	Label string
	Value string
	Note  string
	Class string
}

type rowView struct {
	Topic       string
	Partition   string
	Owner       string
	Stored      string
	Committed   string
	End         string
	Lag         string
	LagClass    string
	Rate        string
	Records     string
	Retries     string
	DeadLetters string
	DLClass     string
	Restarts    string
	Status      string
	StatusClass string
}

type metricView struct {
	Name       string
	Total      string
	LastMinute string
	Avg        string
	Min        string
	Max        string
	Peak       string
	Bars       []barView
}

type barView struct {
	X, Y, W, H string
	Class      string
	Title      string
}

func stateClass(s ReadinessState) string {
	switch s {
	case StateReady, StateIdle, StateStarting, StateDegraded, StateDraining:
		return "state-" + string(s)
	}
	return "state-unknown"
}

// modeClass tells the delivery modes apart at a glance: at-least-once is
// the weaker guarantee and is drawn in amber.
func modeClass(mode string) string {
	if mode == "at-least-once" {
		return "pill-alo"
	}
	return ""
}

func stateLabel(s ReadinessState) string {
	if s == "" {
		return "unknown"
	}
	return string(s)
}

func buildErrorView(title string, rd Readiness, now time.Time) pageView {
	return pageView{
		Title:         title,
		State:         stateLabel(rd.State),
		StateClass:    stateClass(rd.State),
		Reason:        rd.Reason,
		Error:         "source unavailable",
		GeneratedAt:   now.Format(time.RFC3339),
		Window:        windowMinutes,
		Summary:       buildSummary(nil),
		ShowDashboard: true,
	}
}

func buildView(title string, st state) pageView {
	v := pageView{
		Title:       title,
		Instance:    st.Pipeline.Instance,
		Group:       st.Pipeline.Group,
		Mode:        st.Pipeline.Mode,
		ModeClass:   modeClass(st.Pipeline.Mode),
		State:       stateLabel(st.Readiness.State),
		StateClass:  stateClass(st.Readiness.State),
		Reason:      st.Readiness.Reason,
		GeneratedAt: st.GeneratedAt.Format(time.RFC3339),
		Window:      windowMinutes,
		Summary:     buildSummary(st.Pipeline.Partitions),
	}
	for _, p := range st.Pipeline.Partitions {
		v.Rows = append(v.Rows, buildRow(p))
	}
	v.Metrics = buildMetrics(st.Rollups, st.Since)
	v.ShowDashboard = st.Dashboard
	v.ShowPipelines = st.Pipelines != nil
	for _, p := range st.Pipelines {
		v.Pipelines = append(v.Pipelines, pipelineView{Name: p.Name, Topic: p.Topic, Sink: p.Sink, Table: p.Table,
			Written: formatInt(p.Written), Filtered: formatInt(p.Filtered), Ignored: formatInt(p.Ignored),
			DeadLettered: formatInt(p.DeadLettered), Rows: pipelineRows(p), DLClass: badIf(p.DeadLettered)})
	}
	v.ShowDeadLetters = st.DeadLetters != nil
	for _, d := range st.DeadLetters {
		v.DeadLetters = append(v.DeadLetters, buildDeadLetter(d))
	}
	return v
}

// pipelineRows says what a pipeline sent to its table: "12 upserted, 3
// deleted", "40 merged" or "7 appended".
func pipelineRows(p PipelineSummary) string {
	switch p.Sink {
	case "rollup":
		return formatInt(p.Merged) + " merged"
	case "append":
		return formatInt(p.Appended) + " appended"
	}
	return formatInt(p.Upserted) + " upserted, " + formatInt(p.Deleted) + " deleted"
}

func buildDeadLetter(d DeadLetterSummary) deadLetterView {
	v := deadLetterView{Topic: d.Topic, Pipeline: d.Pipeline, Class: deadLetterClass(d), Reason: d.Reason,
		Count: formatInt(d.Count), Last: "—"}
	if v.Pipeline == "" {
		v.Pipeline = "—"
	}
	if v.Reason == "" {
		v.Reason = "reasons: ratchet dlq ls"
	}
	if !d.Last.IsZero() {
		v.Last = d.Last.UTC().Format(time.RFC3339)
	}
	return v
}

// deadLetterClass is the reason column: the class, and the SQLSTATE when
// PostgreSQL refused ("refused_by_postgres 22P02"); "—" when unknown.
func deadLetterClass(d DeadLetterSummary) string {
	switch {
	case d.Class == "":
		return "—"
	case d.SQLState != "":
		return d.Class + " " + d.SQLState
	}
	return d.Class
}

func buildSummary(ps []PartitionStatus) []summaryView {
	var assigned, paused int
	var records, retries, dead, restarts, lag int64
	var rate float64
	for _, p := range ps {
		if p.Assigned {
			assigned++
		}
		if p.Paused {
			paused++
		}
		records += p.Records
		retries += p.Retries
		dead += p.DeadLetters
		restarts += p.Restarts
		if p.Lag > 0 {
			lag += p.Lag
		}
		if !math.IsNaN(p.RatePerSec) && !math.IsInf(p.RatePerSec, 0) {
			rate += p.RatePerSec
		}
	}
	partNote := formatInt(int64(assigned)) + " assigned"
	if paused > 0 {
		partNote += " · " + formatInt(int64(paused)) + " paused"
	}
	warn := func(n int64) string {
		if n > 0 {
			return "warn"
		}
		return ""
	}
	return []summaryView{
		{Key: "partitions", Label: "Partitions", Value: formatInt(int64(len(ps))), Note: partNote},
		{Key: "rate", Label: "Throughput", Value: formatFloat(rate, 1), Note: "records / s"},
		{Key: "records", Label: "Records", Value: formatInt(records), Note: "since start"},
		{Key: "lag", Label: "Lag", Value: formatInt(lag), Note: "records behind", Class: lagClass(lag)},
		{Key: "retries", Label: "Retries", Value: formatInt(retries), Note: "since start", Class: warn(retries)},
		{Key: "dead", Label: "Dead letters", Value: formatInt(dead), Note: "since start", Class: badIf(dead)},
		{Key: "restarts", Label: "Restarts", Value: formatInt(restarts), Note: "actor restarts", Class: warn(restarts)},
	}
}

func badIf(n int64) string {
	if n > 0 {
		return "bad"
	}
	return ""
}

// lagClass marks lag that is worth a look (over 1,000) or alarming (over
// 100,000); the thresholds are only for colour.
func lagClass(n int64) string {
	switch {
	case n > 100_000:
		return "bad"
	case n > 1_000:
		return "warn"
	}
	return ""
}

func buildRow(p PartitionStatus) rowView {
	r := rowView{
		Topic:       p.Topic,
		Partition:   strconv.Itoa(int(p.Partition)),
		Owner:       p.Owner,
		Stored:      formatOffset(p.StoredOffset),
		Committed:   formatOffset(p.CommittedOffset),
		End:         formatOffset(p.EndOffset),
		Lag:         formatOffset(p.Lag),
		LagClass:    lagClass(p.Lag),
		Rate:        formatFloat(p.RatePerSec, 1),
		Records:     formatInt(p.Records),
		Retries:     formatInt(p.Retries),
		DeadLetters: formatInt(p.DeadLetters),
		DLClass:     badIf(p.DeadLetters),
		Restarts:    formatInt(p.Restarts),
		Status:      "active",
		StatusClass: "badge-ok",
	}
	if r.Owner == "" {
		r.Owner = "—"
	}
	switch {
	case p.Paused:
		r.Status, r.StatusClass = "paused", "badge-warn"
	case !p.Assigned:
		r.Status, r.StatusClass = "not assigned", "badge-muted"
	}
	return r
}

// buildMetrics groups rollups by metric (they arrive sorted) and lays out one
// bar per minute bucket of the window that starts at since.
func buildMetrics(rs []Rollup, since time.Time) []metricView {
	var out []metricView
	for i := 0; i < len(rs); {
		j := i
		for j < len(rs) && rs[j].Metric == rs[i].Metric {
			j++
		}
		out = append(out, buildMetric(rs[i:j], since))
		i = j
	}
	return out
}

func buildMetric(rs []Rollup, since time.Time) metricView {
	counts := make([]int64, windowMinutes)
	var total, peak int64
	var sum float64
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range rs {
		total += r.Count
		sum += r.Sum
		if r.Count > 0 {
			lo, hi = math.Min(lo, r.Min), math.Max(hi, r.Max)
		}
		i := int(r.Bucket.Sub(since) / time.Minute)
		if r.Bucket.Before(since) || i >= windowMinutes {
			continue
		}
		counts[i] += r.Count
	}
	for _, c := range counts {
		peak = max(peak, c)
	}
	m := metricView{
		Name:       rs[0].Metric,
		Total:      formatInt(total),
		LastMinute: formatInt(counts[windowMinutes-1]),
		Avg:        "—",
		Min:        "—",
		Max:        "—",
		Peak:       formatInt(peak),
	}
	if total > 0 {
		m.Avg = formatFloat(sum/float64(total), 2)
		m.Min, m.Max = formatFloat(lo, 2), formatFloat(hi, 2)
	}
	for i, c := range counts {
		h := 0.0
		if peak > 0 {
			h = float64(c) / float64(peak) * (chartHeight - chartTop)
		}
		if c > 0 {
			h = max(h, 1.5)
		}
		class := "bar"
		if i == windowMinutes-1 {
			class = "bar bar-current"
		}
		at := since.Add(time.Duration(i) * time.Minute)
		m.Bars = append(m.Bars, barView{
			X:     svgNum(float64(i)*slotWidth + (slotWidth-barWidth)/2),
			Y:     svgNum(chartHeight - h),
			W:     svgNum(barWidth),
			H:     svgNum(h),
			Class: class,
			Title: at.Format("15:04") + " UTC — " + formatInt(c) + " events",
		})
	}
	return m
}

func svgNum(f float64) string {
	return strconv.FormatFloat(f, 'f', 2, 64)
}

// formatOffset shows a negative (unknown) offset or lag as a dash.
func formatOffset(n int64) string {
	if n < 0 {
		return "—"
	}
	return formatInt(n)
}

// formatInt writes n with comma thousands separators: 1234567 → "1,234,567".
func formatInt(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// formatFloat writes f with the given decimals and thousands separators;
// NaN and infinities show as a dash.
func formatFloat(f float64, decimals int) string {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return "—"
	}
	// Round half away from zero first, as the page's Intl.NumberFormat does;
	// FormatFloat alone rounds exact halves to even.
	a := math.Abs(f)
	if p := math.Pow10(decimals); a*p < 1e15 {
		a = math.Round(a*p) / p
	}
	s := strconv.FormatFloat(a, 'f', decimals, 64)
	intPart, frac, _ := strings.Cut(s, ".")
	var b strings.Builder
	if f < 0 && strings.Trim(s, "0.") != "" {
		b.WriteByte('-')
	}
	for i, c := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if frac != "" {
		b.WriteByte('.')
		b.WriteString(frac)
	}
	return b.String()
}
