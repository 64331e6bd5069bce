package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/types/known/timestamppb"

	"ratchet/config"
	"ratchet/internal/testenv"
	ratchetv1 "ratchet/messages/ratchet/v1"
	"ratchet/processor"
)

// startHTTP starts an engine serving HTTP on a free loopback port and
// returns it with the address it listens on.
func startHTTP(tb testing.TB, cfg config.Config, p processor.Processor, owner string) (*testenv.Engine, string) {
	tb.Helper()
	cfg.HTTP.Addr = "127.0.0.1:0"
	r := start(tb, cfg, p, owner)
	return r, "http://" + r.Addr(tb, 60*time.Second)
}

// nowGen makes events whose times fall in the last five minutes, so that
// the page's 30-minute charts show them: every metric gets every minute.
type nowGen struct{ n int }

func (g *nowGen) next() *ratchetv1.Event {
	i := g.n
	g.n++
	return &ratchetv1.Event{
		Id:     fmt.Sprintf("now-%d", i),
		Metric: metricNames[(i*7)%len(metricNames)],
		Value:  float64((i*31)%1000 - 200),
		Time:   timestamppb.New(time.Now().Add(-time.Duration(i/len(metricNames)%5) * time.Minute)),
		Labels: map[string]string{"region": []string{"eu", "us", "ap"}[i%3]},
	}
}

// streamNow is stream with events of nowGen.
func streamNow(tb testing.TB, addr string, batch int, every time.Duration) *streamer {
	return streamFrom(tb, addr, batch, every, (&nowGen{}).next)
}

// artifactDir is where tests leave files for people to look at:
// RATCHET_ARTIFACTS_DIR when set, else the test's temporary directory.
func artifactDir(tb testing.TB) string {
	tb.Helper()
	if d := os.Getenv("RATCHET_ARTIFACTS_DIR"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			tb.Fatalf("artifacts dir: %v", err)
		}
		return d
	}
	return tb.TempDir()
}

// pageState is what the test reads from the rendered page's DOM.
type pageState struct {
	Rows    []string `json:"rows"`    // the Records cell of every partition row
	Bars    int      `json:"bars"`    // chart bars with a non-zero height
	Metrics int      `json:"metrics"` // metric cards
	Live    string   `json:"live"`    // the live indicator
}

// readPageJS reads pageState. Selectors follow templates/index.html and
// static/app.js: partition rows in tbody#partitions (the placeholder row is
// tr.empty-row), Records is the ninth cell, bars are rect.bar in svg.bars.
const readPageJS = `(() => {
	const rows = Array.from(document.querySelectorAll('#partitions tr:not(.empty-row)'));
	const bars = Array.from(document.querySelectorAll('#metrics svg.bars rect.bar'))
		.filter(r => parseFloat(r.getAttribute('height')) > 0);
	return {
		rows: rows.map(r => r.children.length > 8 ? r.children[8].textContent : ''),
		bars: bars.length,
		metrics: document.querySelectorAll('#metrics article.metric').length,
		live: (document.getElementById('live') || {}).textContent || '',
	};
})()`

// records parses the Records cells ("12,345") of ps.
func (ps pageState) records() ([]int64, error) {
	out := make([]int64, len(ps.Rows))
	for i, s := range ps.Rows {
		n, err := strconv.ParseInt(strings.ReplaceAll(strings.TrimSpace(s), ",", ""), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("row %d records %q: %w", i, s, err)
		}
		out[i] = n
	}
	return out, nil
}

// waitPage evaluates readPageJS until cond holds or timeout passes.
func waitPage(tb testing.TB, ctx context.Context, timeout time.Duration, what string, cond func(pageState) bool) pageState {
	tb.Helper()
	var last pageState
	var lastErr error
	deadline := time.Now().Add(timeout)
	for {
		evalCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ps, err := chromedp.Run(evalCtx, chromedp.Evaluate[pageState](readPageJS))
		cancel()
		if err == nil {
			last = ps
			if cond(ps) {
				return ps
			}
		} else {
			lastErr = err
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			tb.Fatalf("page: %s not seen within %s; last DOM state %+v, last error %v", what, timeout, last, lastErr)
		}
		time.Sleep(100 * time.Millisecond) // polling interval, not synchronisation
	}
}

func TestPageInHeadlessChromium(t *testing.T) {
	chromium := testenv.Chromium(t)
	_, addr := testenv.Kafka(t, 12, topic)
	dbURL := testenv.Postgres(t)
	cfg := testConfig(t, addr, dbURL, config.ModeExactlyOnce)
	s := streamNow(t, addr, 50, 50*time.Millisecond)
	_, base := startHTTP(t, cfg, nil, "page")

	// The browser lives at most as long as this context.
	browserCtx, cancelBrowser := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancelBrowser()
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(browserCtx,
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1400, 1000),
		chromedp.UserDataDir(t.TempDir()),
	)
	defer cancelAlloc()
	ctx, cancelTab := chromedp.NewContext(allocCtx)
	defer cancelTab()

	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/"), chromedp.WaitVisible("#partitions")); err != nil {
		t.Fatalf("open %s/: %v", base, err)
	}

	allPositive := func(ps pageState) bool {
		recs, err := ps.records()
		if err != nil || len(recs) != 12 {
			return false
		}
		for _, n := range recs {
			if n <= 0 {
				return false
			}
		}
		return true
	}
	first := waitPage(t, ctx, 90*time.Second, "12 partition rows with records", allPositive)
	before, _ := first.records()
	t.Logf("first read: records per partition %v", before)

	second := waitPage(t, ctx, 60*time.Second, "every partition's record count growing", func(ps pageState) bool {
		recs, err := ps.records()
		if err != nil || len(recs) != len(before) {
			return false
		}
		for i := range recs {
			if recs[i] <= before[i] {
				return false
			}
		}
		return true
	})
	after, _ := second.records()
	t.Logf("second read: records per partition %v", after)

	charts := waitPage(t, ctx, 60*time.Second, "chart bars", func(ps pageState) bool { return ps.Bars > 0 && ps.Metrics > 0 })
	t.Logf("charts: %d metric cards, %d bars with height > 0, live indicator %q", charts.Metrics, charts.Bars, charts.Live)

	shotCtx, cancelShot := context.WithTimeout(ctx, 30*time.Second)
	png, err := chromedp.Run(shotCtx, chromedp.FullScreenshot(100))
	cancelShot()
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	path := filepath.Join(artifactDir(t), "observability-page.png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatalf("write screenshot: %v", err)
	}
	t.Logf("page screenshot (%d bytes): %s", len(png), path)
	s.stop()
}

// scrape reads base/metrics and parses it.
func scrape(tb testing.TB, base string) map[string]*dto.MetricFamily {
	tb.Helper()
	c := http.Client{Timeout: 10 * time.Second}
	res, err := c.Get(base + "/metrics")
	if err != nil {
		tb.Fatalf("scrape: %v", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		tb.Fatalf("scrape: %s", res.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(res.Body)
	if err != nil {
		tb.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// series returns the value of every series of name, keyed by its labels
// ("class=transient,topic=events"), for counters and gauges.
func series(fams map[string]*dto.MetricFamily, name string) map[string]float64 {
	out := map[string]float64{}
	f := fams[name]
	if f == nil {
		return out
	}
	for _, m := range f.GetMetric() {
		var kv []string
		for _, l := range m.GetLabel() {
			kv = append(kv, l.GetName()+"="+l.GetValue())
		}
		slices.Sort(kv)
		v := m.GetCounter().GetValue()
		if m.Gauge != nil {
			v = m.GetGauge().GetValue()
		}
		out[strings.Join(kv, ",")] = v
	}
	return out
}

func sum(m map[string]float64) float64 {
	var s float64
	for _, v := range m {
		s += v
	}
	return s
}

// failFirst fails its first batch with a serialization failure, a
// transient PostgreSQL error, and applies every batch through next.
type failFirst struct {
	next   processor.Processor
	failed atomic.Bool
}

func (f *failFirst) Name() string { return "fail-first" }

func (f *failFirst) Process(ctx context.Context, tx pgx.Tx, b processor.Batch) error {
	if len(b.Records) > 0 && f.failed.CompareAndSwap(false, true) {
		return &pgconn.PgError{Code: "40001", Message: "could not serialize access (injected)"}
	}
	return f.next.Process(ctx, tx, b)
}

func TestMetricsDuringRun(t *testing.T) {
	_, addr := testenv.Kafka(t, 12, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	cfg := testConfig(t, addr, dbURL, config.ModeExactlyOnce)
	s := stream(t, addr, 100, 20*time.Millisecond)
	p := &failFirst{next: ledger{"m"}}
	r, base := startHTTP(t, cfg, p, "m")

	var first float64
	testenv.Eventually(t, 90*time.Second, func() bool {
		first = sum(series(scrape(t, base), "ratchet_records_total"))
		return first > 0
	}, "ratchet_records_total > 0")
	var second float64
	testenv.Eventually(t, 60*time.Second, func() bool {
		second = sum(series(scrape(t, base), "ratchet_records_total"))
		return second > first
	}, "ratchet_records_total grows past %v", first)
	t.Logf("ratchet_records_total: %v then %v", first, second)

	s.stop()
	sent := s.sent.Load()
	waitApplied(t, pool, sent)
	var lag map[string]float64
	testenv.Eventually(t, 60*time.Second, func() bool {
		lag = series(scrape(t, base), "ratchet_lag_records")
		if len(lag) != 12 {
			return false
		}
		for _, v := range lag {
			if v != 0 {
				return false
			}
		}
		return true
	}, "ratchet_lag_records 0 for all 12 partitions (last %v)", lag)

	fams := scrape(t, base)
	retries := series(fams, "ratchet_retries_total")
	if got := retries["class=transient"]; got < 1 {
		t.Errorf("ratchet_retries_total{class=\"transient\"} = %v, want >= 1 (all: %v)", got, retries)
	}
	if got := sum(series(fams, "ratchet_records_total")); got != float64(sent) {
		t.Errorf("ratchet_records_total = %v, want %d (every record applied once)", got, sent)
	}
	if !p.failed.Load() {
		t.Error("the injected failure never happened")
	}
	r.Stop(t)
	assertLedgerExactlyOnce(t, pool, sent)
}

// readiness polls /readyz in the background and records the sequence of
// distinct states it answers ("down" when the server does not answer).
type readiness struct {
	base string
	stop chan struct{}
	done chan struct{}

	mu     sync.Mutex
	seq    []string // distinct consecutive states
	bad    []string // answers whose status code does not match their state
	cursor int      // states before cursor were consumed by waitFor
}

func pollReadiness(tb testing.TB, base string) *readiness {
	r := &readiness{base: base, stop: make(chan struct{}), done: make(chan struct{})}
	c := &http.Client{Timeout: 5 * time.Second}
	go func() { // ends when stop is closed
		defer close(r.done)
		for {
			r.record(r.probe(c))
			select {
			case <-r.stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	tb.Cleanup(r.close)
	return r
}

func (r *readiness) close() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
}

func (r *readiness) probe(c *http.Client) string {
	res, err := c.Get(r.base + "/readyz")
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) || errors.Is(err, io.EOF) {
			return "down"
		}
		return "error"
	}
	defer res.Body.Close()
	var body struct {
		State  string `json:"state"`
		Reason string `json:"reason"`
	}
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
		return "undecodable"
	}
	ready := body.State == "ready" || body.State == "idle"
	if ready != (res.StatusCode == http.StatusOK) {
		r.mu.Lock()
		r.bad = append(r.bad, fmt.Sprintf("%s answered %d", body.State, res.StatusCode))
		r.mu.Unlock()
	}
	return body.State
}

func (r *readiness) record(state string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := len(r.seq); n == 0 || r.seq[n-1] != state {
		r.seq = append(r.seq, state)
	}
}

func (r *readiness) sequence() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seq)
}

// waitFor waits until state was seen since the last waitFor (or is the
// current state) and moves the cursor past it.
func (r *readiness) waitFor(tb testing.TB, state string, timeout time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		r.mu.Lock()
		from := max(r.cursor-1, 0) // the current state still counts
		i := slices.Index(r.seq[from:], state)
		if i >= 0 {
			r.cursor = from + i + 1
		}
		seq := slices.Clone(r.seq)
		r.mu.Unlock()
		if i >= 0 {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("/readyz %q not seen within %s; states so far %v", state, timeout, seq)
		}
		time.Sleep(20 * time.Millisecond) // polling interval, not synchronisation
	}
}

// viaProxy returns dbURL with its host replaced by addr.
func viaProxy(tb testing.TB, dbURL, addr string) string {
	tb.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		tb.Fatalf("parse %s: %v", dbURL, err)
	}
	u.Host = addr
	return u.String()
}

// dbHost is the host:port of dbURL.
func dbHost(tb testing.TB, dbURL string) string {
	tb.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		tb.Fatalf("parse %s: %v", dbURL, err)
	}
	return u.Host
}

func TestReadinessTransitions(t *testing.T) {
	_, addr := testenv.Kafka(t, 12, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	proxy := testenv.NewProxy(t, dbHost(t, dbURL))

	cfg := testConfig(t, addr, viaProxy(t, dbURL, proxy.Addr()), config.ModeExactlyOnce)
	cfg.Retry.InitialBackoff = 50 * time.Millisecond
	cfg.Retry.MaxBackoff = 500 * time.Millisecond
	s := stream(t, addr, 50, 20*time.Millisecond)
	r, base := startHTTP(t, cfg, ledger{"r"}, "r")
	rd := pollReadiness(t, base)

	rd.waitFor(t, "ready", 90*time.Second)
	waitApplied(t, pool, 500)

	proxy.Cut()
	rd.waitFor(t, "degraded", 60*time.Second)
	proxy.Restore()
	rd.waitFor(t, "ready", 60*time.Second)
	applied := count(t, pool, `SELECT count(*) FROM test_ledger`)
	waitApplied(t, pool, applied+500) // flowing again

	// Slow every round trip so that the batches in flight are still
	// running when the engine is told to stop.
	proxy.Delay(500 * time.Millisecond)
	r.Cancel()
	rd.waitFor(t, "draining", 30*time.Second)
	r.Stop(t)
	rd.waitFor(t, "down", 30*time.Second)
	rd.close()
	s.stop()

	seq := rd.sequence()
	t.Logf("/readyz states: %v", seq)
	if len(rd.bad) > 0 {
		t.Errorf("status codes do not match states: %v", rd.bad)
	}
	// Before the first ready only starting or idle; then ready, degraded
	// while PostgreSQL is cut, ready again, draining, and the server gone.
	firstReady := slices.Index(seq, "ready")
	for _, st := range seq[:firstReady] {
		if st != "starting" && st != "idle" {
			t.Errorf("state %q before the first ready (sequence %v)", st, seq)
		}
	}
	if !slices.Contains(seq[:firstReady], "starting") {
		t.Logf("starting was not observed: the engine reports it only between the HTTP server listening and the subscription, which is instant")
	}
	firstDraining := slices.Index(seq, "draining")
	for _, st := range seq[firstDraining:] {
		if st != "draining" && st != "down" {
			t.Errorf("state %q after draining (sequence %v)", st, seq)
		}
	}
	for _, st := range seq[firstReady:firstDraining] {
		if st != "ready" && st != "degraded" {
			t.Errorf("state %q while running (sequence %v)", st, seq)
		}
	}
	assertNoDuplicates(t, pool)
}

// assertNoDuplicates checks that no record was applied twice.
func assertNoDuplicates(tb testing.TB, pool *pgxpool.Pool) {
	tb.Helper()
	var total, distinct int64
	if err := pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT id) FROM test_ledger`).Scan(&total, &distinct); err != nil {
		tb.Fatalf("count ledger: %v", err)
	}
	if total != distinct {
		tb.Errorf("%d records applied more than once (%d rows, %d distinct)", total-distinct, total, distinct)
	}
}

// perPartition returns how many ledger rows each partition has.
func perPartition(tb testing.TB, pool *pgxpool.Pool) map[int32]int64 {
	tb.Helper()
	rows, err := pool.Query(context.Background(), `SELECT partition, count(*) FROM test_ledger GROUP BY partition`)
	if err != nil {
		tb.Fatalf("count per partition: %v", err)
	}
	out := map[int32]int64{}
	for rows.Next() {
		var p int32
		var n int64
		if err := rows.Scan(&p, &n); err != nil {
			tb.Fatalf("scan: %v", err)
		}
		out[p] = n
	}
	if rows.Err() != nil {
		tb.Fatalf("count per partition: %v", rows.Err())
	}
	return out
}

// TestPartitionsResumeAfterOutage cuts PostgreSQL a few times while events
// flow: after each outage every partition must apply again, and in the end
// every event is applied exactly once. A cut that lands on a COMMIT leaves
// its outcome unknown to the engine; the retry must recognise its own
// committed batch rather than stop the partition.
func TestPartitionsResumeAfterOutage(t *testing.T) {
	_, addr := testenv.Kafka(t, 12, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	proxy := testenv.NewProxy(t, dbHost(t, dbURL))
	cfg := testConfig(t, addr, viaProxy(t, dbURL, proxy.Addr()), config.ModeExactlyOnce)
	cfg.Retry.InitialBackoff = 50 * time.Millisecond
	cfg.Retry.MaxBackoff = 500 * time.Millisecond
	s := stream(t, addr, 50, 20*time.Millisecond)
	r, base := startHTTP(t, cfg, ledger{"o"}, "o")
	rd := pollReadiness(t, base)
	rd.waitFor(t, "ready", 90*time.Second)
	waitApplied(t, pool, 500)

	for i := range 3 {
		proxy.Cut()
		rd.waitFor(t, "degraded", 60*time.Second)
		proxy.Restore()
		rd.waitFor(t, "ready", 60*time.Second)
		before := perPartition(t, pool)
		testenv.Eventually(t, 60*time.Second, func() bool {
			now := perPartition(t, pool)
			for p := range int32(12) {
				if now[p] <= before[p] {
					return false
				}
			}
			return true
		}, "every partition applies again after outage %d (before %v)", i+1, before)
	}
	s.stop()
	waitApplied(t, pool, s.sent.Load())
	r.Stop(t)
	assertLedgerExactlyOnce(t, pool, s.sent.Load())
}
