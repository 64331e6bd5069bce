package engine_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry"
	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry/serde"
	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry/serde/jsonschema"
	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry/serde/protobuf"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"ratchet/config"
	"ratchet/internal/event"
	"ratchet/internal/testenv"
	ratchetv1 "ratchet/messages/ratchet/v1"
)

// confluentSerializer frames events the way Confluent's serializers do,
// against the registry at url: protobuf auto-registers the event schema,
// json uses a JSON schema registered by the test.
func confluentSerializer(tb testing.TB, reg *testenv.Registry, format string) func(*ratchetv1.Event) []byte {
	tb.Helper()
	client, err := schemaregistry.NewClient(schemaregistry.NewConfig(reg.URL()))
	if err != nil {
		tb.Fatal(err)
	}
	if format == event.FormatProtobuf {
		ser, err := protobuf.NewSerializer(client, serde.ValueSerde, protobuf.NewSerializerConfig())
		if err != nil {
			tb.Fatal(err)
		}
		return func(ev *ratchetv1.Event) []byte {
			b, err := ser.Serialize(topic, ev)
			if err != nil {
				tb.Fatalf("serialize: %v", err)
			}
			return b
		}
	}
	conf := jsonschema.NewSerializerConfig()
	conf.AutoRegisterSchemas = false
	conf.UseSchemaID = reg.Add(topic+"-value", "JSON", `{"type":"object","properties":{"metric":{"type":"string"}}}`)
	ser, err := jsonschema.NewSerializer(client, serde.ValueSerde, conf)
	if err != nil {
		tb.Fatal(err)
	}
	return func(ev *ratchetv1.Event) []byte {
		doc, err := protojson.Marshal(ev)
		if err != nil {
			tb.Fatal(err)
		}
		b, err := ser.Serialize(topic, json.RawMessage(doc))
		if err != nil {
			tb.Fatalf("serialize: %v", err)
		}
		return b
	}
}

// waitRollups waits until dashboard_rollups equals want.
func waitRollups(tb testing.TB, pool *pgxpool.Pool, want map[rollupKey]rollup) {
	tb.Helper()
	testenv.Eventually(tb, 120*time.Second, func() bool {
		if count(tb, pool, `SELECT count(*) FROM dashboard_rollups`) < 0 {
			return false // not migrated yet
		}
		got := readRollups(tb, pool)
		if len(got) != len(want) {
			return false
		}
		for k, w := range want {
			if got[k] != w {
				return false
			}
		}
		return true
	}, "dashboard_rollups equal to the produced events")
}

// TestSchemaRegistryFramedRecords: values framed by Confluent's serializers
// are applied exactly by the dashboard; a record with an unknown schema id
// and one without the magic byte are dead-lettered with their reasons.
func TestSchemaRegistryFramedRecords(t *testing.T) {
	for _, format := range []string{event.FormatProtobuf, event.FormatJSON} {
		t.Run(format, func(t *testing.T) {
			const n = 2000
			cluster, addr := testenv.Kafka(t, 4, topic)
			dbURL := testenv.Postgres(t)
			pool := openPool(t, dbURL)
			reg := testenv.NewRegistry(t, "", "")
			ser := confluentSerializer(t, reg, format)

			g := &gen{}
			var events []*ratchetv1.Event
			var recs []*rawRecord
			for range n {
				ev := g.next()
				events = append(events, ev)
				recs = append(recs, &rawRecord{key: []byte(ev.Id), value: ser(ev), id: ev.Id})
			}
			plain, err := event.Encode(format, g.next())
			if err != nil {
				t.Fatal(err)
			}
			unknown := &rawRecord{key: []byte("unknown"), value: append(event.AppendFrame(nil, 9999, []int{0}), plain...)}
			if format == event.FormatJSON {
				unknown.value = append(event.AppendFrame(nil, 9999, nil), plain...)
			}
			noMagic := &rawRecord{key: []byte("no-magic"), value: plain}
			poison := []*rawRecord{unknown, noMagic}
			if format == event.FormatProtobuf {
				// A registered schema of another message: the dashboard
				// needs ratchet.v1.Event.
				orderID := reg.Add("orders-value", "PROTOBUF", `syntax = "proto3"; package shop.v1; message Order { string id = 1; }`)
				poison = append(poison, &rawRecord{key: []byte("not-event"),
					value: append(event.AppendFrame(nil, int32(orderID), []int{0}), plain...)})
			}
			recs = append(recs[:n/2], append(poison, recs[n/2:]...)...)
			newProducer(t, addr).sendRaw(t, recs)

			_, byIDBefore := reg.Requests() // the serializer's own lookups
			cfg := testConfig(t, addr, dbURL, config.ModeExactlyOnce)
			cfg.Kafka.Format = format
			cfg.SchemaRegistry.URL = config.SecretURL(reg.URL())
			r := start(t, cfg, nil, "a")
			want := expectRollups(events)
			waitRollups(t, pool, want)
			got := readDLQ(t, cluster, addr, cfg.Kafka.DLQTopic(topic), len(poison))
			r.Stop(t)
			assertDLQHoldsExactly(t, got, poison)
			reasons := map[string]string{}
			for _, e := range got {
				reasons[string(e.key)] = e.headers["ratchet.error"]
			}
			if !strings.Contains(reasons["unknown"], "schema id 9999 not found") {
				t.Errorf("unknown id dead-lettered with %q", reasons["unknown"])
			}
			if !strings.Contains(reasons["no-magic"], "no magic byte") {
				t.Errorf("unframed record dead-lettered with %q", reasons["no-magic"])
			}
			if format == event.FormatProtobuf && !strings.Contains(reasons["not-event"], "does not define ratchet.v1.Event") {
				t.Errorf("record of another message dead-lettered with %q", reasons["not-event"])
			}
			if _, byID := reg.Requests(); byID-byIDBefore > int64(len(poison)) {
				t.Errorf("%d registry lookups by id for %d schema ids; the cache should answer the rest", byID-byIDBefore, len(poison))
			}
			if rows := readRollups(t, pool); len(rows) != len(want) {
				t.Errorf("%d rollup rows after the stop, want %d", len(rows), len(want))
			}
		})
	}
}

// TestSchemaRegistryOutage: the registry is unreachable, then failing with
// 503, for 10s while records with a schema id not seen before keep
// arriving: nothing is dead-lettered, /readyz says degraded, and once the
// registry is back every record is applied once.
func TestSchemaRegistryOutage(t *testing.T) {
	cluster, addr := testenv.Kafka(t, 4, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	reg := testenv.NewRegistry(t, "", "")
	proxy := testenv.NewProxy(t, reg.Addr())
	ser := confluentSerializer(t, reg, event.FormatProtobuf)
	// A second schema defining ratchet.v1.Event first: its id is first
	// seen during the outage.
	laterID := reg.Add("events-v2", "PROTOBUF", `syntax = "proto3";
package ratchet.v1;
import "google/protobuf/timestamp.proto";
message Event { string id = 1; string metric = 2; double value = 3; google.protobuf.Timestamp time = 4; map<string, string> labels = 5; }
message Unused { string note = 1; }`)

	g := &gen{}
	pr := newProducer(t, addr)
	var sent atomic.Int64
	produce := func(n int, later bool) {
		recs := make([]*rawRecord, n)
		for i := range recs {
			ev := g.next()
			v := ser(ev)
			if later && i%2 == 0 {
				payload, err := proto.Marshal(ev)
				if err != nil {
					t.Fatal(err)
				}
				v = append(event.AppendFrame(nil, int32(laterID), []int{0}), payload...)
			}
			recs[i] = &rawRecord{key: []byte(ev.Id), value: v, id: ev.Id}
		}
		pr.sendRaw(t, recs)
		sent.Add(int64(n))
	}

	cfg := testConfig(t, addr, dbURL, config.ModeExactlyOnce)
	cfg.SchemaRegistry.URL = config.SecretURL("http://" + proxy.Addr())
	cfg.Retry.InitialBackoff, cfg.Retry.MaxBackoff = 50*time.Millisecond, 500*time.Millisecond
	r, base := startHTTP(t, cfg, ledger{"a"}, "a")
	ready := pollReadiness(t, base)
	produce(1000, false)
	waitApplied(t, pool, 1000)
	ready.waitFor(t, "ready", 30*time.Second)

	proxy.Cut()
	outageEnds := time.Now().Add(10 * time.Second)
	failing := false
	tick := time.NewTicker(100 * time.Millisecond) // production pace under load
	defer tick.Stop()
	for time.Now().Before(outageEnds) {
		if !failing && time.Until(outageEnds) < 5*time.Second {
			reg.Fail(503) // reachable again, but failing
			proxy.Restore()
			failing = true
		}
		produce(200, true)
		<-tick.C
	}
	ready.waitFor(t, "degraded", time.Second)
	if n := dlqRecords(cluster, cfg.Kafka.DLQTopic(topic)); n != 0 {
		t.Fatalf("%d records dead-lettered during the registry outage", n)
	}
	if applied := count(t, pool, `SELECT count(*) FROM test_ledger`); applied >= sent.Load() {
		t.Fatalf("all %d records applied during the outage; the test did not exercise it", applied)
	}
	reg.Fail(0)
	waitApplied(t, pool, sent.Load())
	ready.waitFor(t, "ready", 30*time.Second)
	fams := scrape(t, base)
	if n := series(fams, "ratchet_decoded_records_total")["format=protobuf+registry,result=ok,topic="+topic]; n < float64(sent.Load()) {
		t.Errorf("ratchet_decoded_records_total ok = %v, want at least %d", n, sent.Load())
	}
	errs := series(fams, "ratchet_schema_registry_errors_total")
	if errs["reason=unreachable"] == 0 || errs["reason=server_error"] == 0 {
		t.Errorf("ratchet_schema_registry_errors_total = %v, want unreachable and server_error counted", errs)
	}
	if n := series(fams, "ratchet_schema_registry_lookups_total")["result=found"]; n != 2 {
		t.Errorf("ratchet_schema_registry_lookups_total found = %v, want 2 (two schema ids)", n)
	}
	if n := sum(series(fams, "ratchet_schema_registry_cache_hits_total")); n < float64(sent.Load()) {
		t.Errorf("ratchet_schema_registry_cache_hits_total = %v, want at least %d", n, sent.Load())
	}
	r.Stop(t)
	assertLedgerExactlyOnce(t, pool, sent.Load())
	if n := dlqRecords(cluster, cfg.Kafka.DLQTopic(topic)); n != 0 {
		t.Errorf("%d records dead-lettered", n)
	}
}

// TestSchemaRegistryIngressNotFound: for 6 s every lookup of a schema by id
// is answered with an HTML 404 (an ingress's default backend, not the
// registry's JSON error_code 40403) while records with a schema id not seen
// before keep arriving. That is an outage, not an unknown id: the records
// wait (their partitions held, /readyz degraded), nothing is dead-lettered,
// and once the registry answers again every record is applied once.
func TestSchemaRegistryIngressNotFound(t *testing.T) {
	cluster, addr := testenv.Kafka(t, 4, topic)
	dbURL := testenv.Postgres(t)
	pool := openPool(t, dbURL)
	createLedger(t, pool)
	reg := testenv.NewRegistry(t, "", "")
	target, err := url.Parse(reg.URL())
	if err != nil {
		t.Fatal(err)
	}
	// The ingress in front of the registry: while misrouting, lookups by
	// id reach its default backend.
	var misrouting atomic.Bool
	var html404 atomic.Int64
	forward := httputil.NewSingleHostReverseProxy(target)
	ingress := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if misrouting.Load() && strings.HasPrefix(req.URL.Path, "/schemas/ids/") {
			html404.Add(1)
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte("<html><head><title>404 Not Found</title></head><body><center><h1>404 Not Found</h1></center><hr><center>nginx</center></body></html>\n"))
			return
		}
		forward.ServeHTTP(w, req)
	}))
	t.Cleanup(ingress.Close)
	ser := confluentSerializer(t, reg, event.FormatProtobuf)
	// A second schema defining ratchet.v1.Event first: its id is first
	// looked up while the ingress misroutes.
	laterID := reg.Add("events-v2", "PROTOBUF", `syntax = "proto3";
package ratchet.v1;
import "google/protobuf/timestamp.proto";
message Event { string id = 1; string metric = 2; double value = 3; google.protobuf.Timestamp time = 4; map<string, string> labels = 5; }
message Unused { string note = 1; }`)

	g := &gen{}
	pr := newProducer(t, addr)
	var sent int64
	produce := func(n int, later bool) {
		recs := make([]*rawRecord, n)
		for i := range recs {
			ev := g.next()
			v := ser(ev)
			if later && i%2 == 0 {
				payload, err := proto.Marshal(ev)
				if err != nil {
					t.Fatal(err)
				}
				v = append(event.AppendFrame(nil, int32(laterID), []int{0}), payload...)
			}
			recs[i] = &rawRecord{key: []byte(ev.Id), value: v, id: ev.Id}
		}
		pr.sendRaw(t, recs)
		sent += int64(n)
	}

	cfg := testConfig(t, addr, dbURL, config.ModeExactlyOnce)
	cfg.SchemaRegistry.URL = config.SecretURL(ingress.URL)
	cfg.Retry.InitialBackoff, cfg.Retry.MaxBackoff = 50*time.Millisecond, 500*time.Millisecond
	r, base := startHTTP(t, cfg, ledger{"a"}, "a")
	ready := pollReadiness(t, base)
	produce(1000, false)
	waitApplied(t, pool, 1000)
	ready.waitFor(t, "ready", 30*time.Second)

	misrouting.Store(true)
	ends := time.Now().Add(6 * time.Second)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(ends) {
		produce(200, true)
		<-tick.C
	}
	ready.waitFor(t, "degraded", 5*time.Second)
	if html404.Load() == 0 {
		t.Fatal("no lookup by id met the ingress's 404; the test did not exercise it")
	}
	if n := dlqRecords(cluster, cfg.Kafka.DLQTopic(topic)); n != 0 {
		t.Fatalf("%d records dead-lettered while the ingress answered 404", n)
	}
	if applied := count(t, pool, `SELECT count(*) FROM test_ledger`); applied >= sent {
		t.Fatalf("all %d records applied while the ingress answered 404; the test did not exercise it", applied)
	}
	misrouting.Store(false)
	waitApplied(t, pool, sent)
	ready.waitFor(t, "ready", 30*time.Second)
	fams := scrape(t, base)
	if n := series(fams, "ratchet_schema_registry_errors_total")["reason=unexpected_answer"]; n == 0 {
		t.Errorf("ratchet_schema_registry_errors_total = %v, want unexpected_answer counted", series(fams, "ratchet_schema_registry_errors_total"))
	}
	if n := series(fams, "ratchet_schema_registry_lookups_total")["result=found"]; n != 2 {
		t.Errorf("ratchet_schema_registry_lookups_total found = %v, want 2 (two schema ids)", n)
	}
	r.Stop(t)
	assertLedgerExactlyOnce(t, pool, sent)
	if n := dlqRecords(cluster, cfg.Kafka.DLQTopic(topic)); n != 0 {
		t.Errorf("%d records dead-lettered", n)
	}
}

// dlqRecords is how many records the dead-letter topic holds.
func dlqRecords(c *kfake.Cluster, dlqTopic string) int64 {
	var n int64
	for _, p := range c.PartitionInfos(dlqTopic) {
		n += p.HighWatermark
	}
	return n
}
