package main

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"ratchet/config"
	"ratchet/processor/dashboard"
)

// execModeReport is the query exec mode section (h, issue 27): the same
// exactly-once drain, on a direct connection, in the two query exec modes
// store.Open picks between: cache_describe, which needs no named prepared
// statements (behind a pooler), and cache_statement, pgx's default (on a
// direct connection), each named in postgres.url as a user would.
type execModeReport struct {
	events int64
	rounds []execModeRound
}

type execModeRound struct {
	describe, statement drainResult
}

// withQueryExecMode returns the connection URL raw with
// default_query_exec_mode=mode added.
func withQueryExecMode(raw, mode string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	q := u.Query()
	q.Set("default_query_exec_mode", mode)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// runExecMode drains the topic's backlog of n events once per mode in
// each of rounds rounds, the order alternating between rounds so that a
// drift of the machine's load does not favour one mode, and checks
// sum(count) after each drain.
func runExecMode(ctx context.Context, env *benchEnv, topic string, n int64, rounds int, say func(string, ...any)) (*execModeReport, error) {
	rep := &execModeReport{events: n}
	drain := func(r int, mode string) (drainResult, error) {
		if _, err := env.db.pool.Exec(ctx, "TRUNCATE dashboard_rollups"); err != nil {
			return drainResult{}, err
		}
		u, err := withQueryExecMode(env.db.url, mode)
		if err != nil {
			return drainResult{}, err
		}
		d, err := drainRatchet(ctx, env, topic, fmt.Sprintf("bench-h-%s-%d", mode, r), config.ModeExactlyOnce, dashboard.New(), n, "",
			func(c *config.Config) { c.Postgres.URL = config.SecretURL(u) })
		if err != nil {
			return drainResult{}, fmt.Errorf("round %d (h) %s: %w", r, mode, err)
		}
		if got, err := rollupCount(ctx, env); err != nil || got != n {
			return drainResult{}, fmt.Errorf("round %d (h) %s: sum(count) in dashboard_rollups is %d, want %d (%v)", r, mode, got, n, err)
		}
		say("round %d (h) exactly-once, %-15s %9.0f events/s (wall %s), %.1f partitions in a transaction, %s", r, mode+":", d.Rate(),
			d.Wall.Round(1e6), d.inTx(), d.cpuLine())
		return d, nil
	}
	for r := 1; r <= rounds; r++ {
		var x execModeRound
		order := []string{"cache_describe", "cache_statement"}
		if r%2 == 0 {
			order[0], order[1] = order[1], order[0]
		}
		for _, mode := range order {
			d, err := drain(r, mode)
			if err != nil {
				return nil, err
			}
			if mode == "cache_describe" {
				x.describe = d
			} else {
				x.statement = d
			}
		}
		rep.rounds = append(rep.rounds, x)
	}
	return rep, nil
}

// rows adds the section's rows to the results table.
func (s *execModeReport) rows(row func(cells ...string)) {
	if s == nil || len(s.rounds) == 0 {
		return
	}
	series := func(f func(execModeRound) float64, format string) (string, float64) {
		var xs []float64
		var parts []string
		for _, r := range s.rounds {
			v := f(r)
			xs = append(xs, v)
			parts = append(parts, fmt.Sprintf(format, v))
		}
		return strings.Join(parts, ", "), median(xs)
	}
	rs, v := series(func(r execModeRound) float64 { return r.describe.Rate() }, "%.0f")
	row(fmt.Sprintf("(h) exactly-once, dashboard, %d events, `default_query_exec_mode=cache_describe` (no named prepared statements: ratchet's pick behind a pooler)", s.events),
		fmt.Sprintf("%.0f events/s (rounds: %s)", v, rs), "", "")
	rs, v = series(func(r execModeRound) float64 { return r.statement.Rate() }, "%.0f")
	row("(h) the same with `default_query_exec_mode=cache_statement` (pgx's default: ratchet's pick on a direct connection)",
		fmt.Sprintf("%.0f events/s (rounds: %s)", v, rs), "", "")
	rs, v = series(func(r execModeRound) float64 { return r.describe.Rate() / r.statement.Rate() }, "%.2f")
	row("(h) cache_describe / cache_statement: what the session-free mode costs", fmt.Sprintf("%.2f (rounds: %s)", v, rs), "", "")
	rd, vd := series(func(r execModeRound) float64 { return r.describe.cpuPerMillion() }, "%.1f")
	rst, vs := series(func(r execModeRound) float64 { return r.statement.cpuPerMillion() }, "%.1f")
	row("(h) machine CPU-seconds per million events, cache_describe / cache_statement",
		fmt.Sprintf("%.1f / %.1f (rounds: %s / %s)", vd, vs, rd, rst), "", "")
}

// method says how the section is measured.
func (s *execModeReport) method() string {
	if s == nil || len(s.rounds) == 0 {
		return ""
	}
	return fmt.Sprintf("- Exec modes (h): %d rounds, each draining the same %d-event backlog twice with the in-process engine at its defaults (exactly-once, dashboard) and a fresh group, once with `default_query_exec_mode=cache_describe` in `postgres.url` (the statement descriptions cached in the client, each execution sends its SQL as the unnamed statement: what ratchet picks behind a pooler) and once with `cache_statement` (named prepared statements, pgx's default: what it picks on a direct connection), the order alternating between rounds; `sum(count)` checked after each. Both on a direct connection, so the figure is the exec mode's alone. Rate as in (c).\n",
		len(s.rounds), s.events)
}
