package engine_test

import (
	"context"
	"testing"
	"time"

	"ratchet/config"
	"ratchet/internal/store"
	"ratchet/internal/testenv"
	ratchetv1 "ratchet/messages/ratchet/v1"
)

// TestRefusedClaimsAreRetried: PostgreSQL refuses every claim for 10 s when
// the partitions are assigned (a trigger on ratchet_offsets raises while a
// flag row exists). The partitions stay with this member, paused, and
// /readyz says degraded with the reason; once claims succeed again every
// partition is consumed from its stored position and every event is applied
// exactly once. Before, a failed claim left its partition unconsumed for
// good while the instance reported ready.
func TestRefusedClaimsAreRetried(t *testing.T) {
	const n = 4000
	_, addr := testenv.Kafka(t, 4, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	ctx := context.Background()
	if err := store.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE test_refuse_claims (on_ bool)`,
		`INSERT INTO test_refuse_claims VALUES (true)`,
		`CREATE FUNCTION test_refuse_claims() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN
		   IF EXISTS (SELECT 1 FROM test_refuse_claims) THEN
		     RAISE EXCEPTION 'claims refused by the test';
		   END IF;
		   RETURN NEW;
		 END $$`,
		`CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON ratchet_offsets
		 FOR EACH ROW EXECUTE FUNCTION test_refuse_claims()`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	g := &gen{}
	pr := newProducer(t, addr)
	batch := make([]*ratchetv1.Event, n)
	for i := range batch {
		batch[i] = g.next()
	}
	pr.send(t, batch)

	cfg := testConfig(t, addr, dbURL, config.ModeExactlyOnce)
	cfg.Retry.MaxBackoff = time.Second
	r, base := startHTTP(t, cfg, ledger{"a"}, "a")
	rd := pollReadiness(t, base)
	rd.waitFor(t, "degraded", 60*time.Second)
	refusedAt := time.Now()
	if got := count(t, pool, `SELECT count(*) FROM test_ledger`); got != 0 {
		t.Fatalf("%d events applied without a claim", got)
	}
	// Refusing is the scenario; it lasts 10 s.
	time.Sleep(10*time.Second - time.Since(refusedAt))
	if got := count(t, pool, `SELECT count(*) FROM test_ledger`); got != 0 {
		t.Fatalf("%d events applied without a claim", got)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM test_refuse_claims`); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, pool, n)
	rd.waitFor(t, "ready", 30*time.Second)
	r.Stop(t)
	assertLedgerExactlyOnce(t, pool, n)
	if got := count(t, pool, `SELECT count(*) FROM ratchet_offsets WHERE epoch >= 1`); got != 4 {
		t.Errorf("%d of 4 partitions claimed", got)
	}
}
