package schemareg

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry"
	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry/serde"
	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry/serde/jsonschema"
	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry/serde/protobuf"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"ratchet/config"
	"ratchet/internal/event"
	"ratchet/internal/metrics"
	"ratchet/internal/testenv"
	ratchetv1 "ratchet/messages/ratchet/v1"
	"ratchet/processor"
)

func sampleEvent(i int) *ratchetv1.Event {
	return &ratchetv1.Event{Id: "e" + string(rune('a'+i)), Metric: "page_view", Value: float64(i) + 0.5,
		Time: timestamppb.New(time.Date(2026, 12, 3, 10, 0, i, 0, time.UTC)), Labels: map[string]string{"region": "eu"}}
}

func newRegistry(t *testing.T, url string) (*Registry, *metrics.Metrics) {
	t.Helper()
	m := metrics.New(prometheus.NewRegistry())
	r, err := New(config.SchemaRegistry{URL: config.SecretURL(url)}, m)
	if err != nil {
		t.Fatal(err)
	}
	return r, m
}

// serializeProtobuf frames ev with Confluent's protobuf serializer, which
// registers the schema in the registry at url.
func serializeProtobuf(t *testing.T, url, topic string, ev *ratchetv1.Event) []byte {
	t.Helper()
	client, err := schemaregistry.NewClient(schemaregistry.NewConfig(url))
	if err != nil {
		t.Fatal(err)
	}
	ser, err := protobuf.NewSerializer(client, serde.ValueSerde, protobuf.NewSerializerConfig())
	if err != nil {
		t.Fatal(err)
	}
	b, err := ser.Serialize(topic, ev)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// decode runs a record through d as the partition does: resolve what is
// missing, learn it, decode.
func decode(t *testing.T, d *Decoder, value []byte) (*processor.Record, error) {
	t.Helper()
	if d.Missing(value) {
		learn, err := d.Resolve(context.Background(), [][]byte{value})
		if err != nil {
			t.Fatalf("resolve: %v", err)
		}
		learn()
		if d.Missing(value) {
			t.Fatal("still missing after learning")
		}
	}
	rec := &processor.Record{Value: value}
	return rec, d.DecodeRecord(rec)
}

func TestDecodesConfluentProtobuf(t *testing.T) {
	reg := testenv.NewRegistry(t, "", "")
	r, m := newRegistry(t, reg.URL())
	d := NewDecoder(r, event.FormatProtobuf, m)
	for i := range 5 {
		want := sampleEvent(i)
		rec, err := decode(t, d, serializeProtobuf(t, reg.URL(), "events", want))
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if !proto.Equal(rec.Event, want) {
			t.Errorf("decoded %v, want %v", rec.Event, want)
		}
	}
	if _, byID := reg.Requests(); byID != 1 {
		t.Errorf("%d lookups by id for one schema, want 1 (cached)", byID)
	}
	if n := testutil.ToFloat64(m.RegistryLookups.WithLabelValues("found")); n != 1 {
		t.Errorf("lookups found = %v, want 1", n)
	}
	if n := testutil.ToFloat64(m.RegistryCacheHits); n != 5 {
		t.Errorf("cache hits = %v, want 5 (one per decoded record)", n)
	}
	// Another partition's decoder asks the shared cache, not the registry.
	d2 := NewDecoder(r, event.FormatProtobuf, m)
	if _, err := decode(t, d2, serializeProtobuf(t, reg.URL(), "events", sampleEvent(0))); err != nil {
		t.Fatal(err)
	}
	if _, byID := reg.Requests(); byID != 1 {
		t.Errorf("%d lookups by id after a second partition, want 1", byID)
	}
}

// eventJSONSchema describes the protojson form of ratchet.v1.Event.
const eventJSONSchema = `{"type":"object","properties":{"metric":{"type":"string"}}}`

func TestDecodesConfluentJSON(t *testing.T) {
	reg := testenv.NewRegistry(t, "", "")
	id := reg.Add("events-value", "JSON", eventJSONSchema)
	client, err := schemaregistry.NewClient(schemaregistry.NewConfig(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	conf := jsonschema.NewSerializerConfig()
	conf.AutoRegisterSchemas, conf.UseSchemaID = false, id
	ser, err := jsonschema.NewSerializer(client, serde.ValueSerde, conf)
	if err != nil {
		t.Fatal(err)
	}
	want := sampleEvent(3)
	doc, err := protojson.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	value, err := ser.Serialize("events", json.RawMessage(doc))
	if err != nil {
		t.Fatal(err)
	}
	r, m := newRegistry(t, reg.URL())
	rec, err := decode(t, NewDecoder(r, event.FormatJSON, m), value)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if !proto.Equal(rec.Event, want) {
		t.Errorf("decoded %v, want %v", rec.Event, want)
	}
}

func TestPoisonReasons(t *testing.T) {
	reg := testenv.NewRegistry(t, "", "")
	good := serializeProtobuf(t, reg.URL(), "events", sampleEvent(1))
	otherID := reg.Add("other-value", "PROTOBUF", `syntax = "proto3"; package shop.v1; message Order { string id = 1; }`)
	eventSecondID := reg.Add("two-value", "PROTOBUF", `syntax = "proto3"; package ratchet.v1;
message Other { string x = 1; }
message Event { string id = 1; string metric = 2; double value = 3; }`)
	avroID := reg.Add("avro-value", "", `{"type":"string"}`)
	brokenID := reg.Add("broken-value", "PROTOBUF", `syntax = "proto3"; message {`)
	payload, _ := proto.Marshal(sampleEvent(1))
	frame := func(id int, idx []int) []byte { return append(event.AppendFrame(nil, int32(id), idx), payload...) }

	cases := []struct {
		name  string
		value []byte
		want  string
	}{
		{"unknown id", frame(4242, []int{0}), "schema id 4242 not found in the schema registry"},
		{"no magic byte", payload, "no magic byte"},
		{"not ratchet.v1.Event", frame(otherID, []int{0}), "does not define ratchet.v1.Event"},
		{"indexes name another message", frame(eventSecondID, []int{0}), "the value is ratchet.v1.Other, not ratchet.v1.Event"},
		{"indexes name nothing", frame(eventSecondID, []int{7}), "has no message at indexes [7]"},
		{"avro schema", frame(avroID, []int{0}), "is a AVRO schema, the topic's format is protobuf"},
		{"schema does not parse", frame(brokenID, []int{0}), "is not a protobuf schema that parses"},
		{"bad payload", append(good[:len(good)-3:len(good)-3], 0xff, 0xff, 0xff), "decode protobuf"},
	}
	r, m := newRegistry(t, reg.URL())
	d := NewDecoder(r, event.FormatProtobuf, m)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decode(t, d, tc.value)
			if !event.IsPoison(err) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("decode = %v, want poison containing %q", err, tc.want)
			}
		})
	}
	// A well-placed Event in a schema with other messages decodes.
	if _, err := decode(t, d, frame(eventSecondID, []int{1})); err != nil {
		t.Errorf("Event at index 1: %v", err)
	}
	if n := testutil.ToFloat64(m.RegistryLookups.WithLabelValues("not_found")); n != 1 {
		t.Errorf("not_found lookups = %v, want 1", n)
	}
}

// TestOutageIsNotPoison: a failing or unreachable registry makes Resolve
// fail with ErrUnavailable (the partition waits), never a poison record.
func TestOutageIsNotPoison(t *testing.T) {
	reg := testenv.NewRegistry(t, "", "")
	value := serializeProtobuf(t, reg.URL(), "events", sampleEvent(2))
	proxy := testenv.NewProxy(t, reg.Addr())
	r, m := newRegistry(t, "http://"+proxy.Addr())
	d := NewDecoder(r, event.FormatProtobuf, m)

	for _, status := range []int{500, 502, 503} {
		reg.Fail(status)
		if _, err := d.Resolve(context.Background(), [][]byte{value}); !errors.Is(err, ErrUnavailable) {
			t.Errorf("registry answering %d: Resolve = %v, want ErrUnavailable", status, err)
		}
	}
	reg.Fail(0)
	proxy.Cut()
	if _, err := d.Resolve(context.Background(), [][]byte{value}); !errors.Is(err, ErrUnavailable) {
		t.Errorf("registry unreachable: Resolve = %v, want ErrUnavailable", err)
	}
	if !d.Missing(value) {
		t.Error("a failed lookup was learned")
	}
	if n := testutil.ToFloat64(m.RegistryErrors.WithLabelValues("server_error")); n != 3 {
		t.Errorf("server errors = %v, want 3", n)
	}
	if n := testutil.ToFloat64(m.RegistryErrors.WithLabelValues("unreachable")); n != 1 {
		t.Errorf("unreachable errors = %v, want 1", n)
	}
	proxy.Restore()
	if _, err := decode(t, d, value); err != nil {
		t.Errorf("after the outage: %v", err)
	}
}

// TestNonJSONErrorBodies: only the registry's own "schema not found" (a
// 404 whose JSON body has error_code 40403) says an id is unknown. A proxy's
// HTML 404, a JSON 404 without that code (a registry's unknown endpoint),
// the subject and version codes, or 40403 on another status are no answer
// to a lookup by id: an outage. A reference (by subject and version) is
// missing on the registry's 40401, 40402 or 40403 only.
func TestNonJSONErrorBodies(t *testing.T) {
	for _, tc := range []struct {
		name        string
		status      int
		body        string
		notFound    bool
		refNotFound bool
		reason      string
	}{
		{"registry schema not found", 404, `{"error_code":40403,"message":"Schema 1 not found"}`, true, true, ""},
		{"html 404", 404, "<html>nope</html>", false, false, reasonUnexpected},
		{"plain-text 404", 404, "404 page not found", false, false, reasonUnexpected},
		{"empty 404", 404, "", false, false, reasonUnexpected},
		{"json 404 without a code", 404, `{"message":"no route"}`, false, false, reasonUnexpected},
		{"registry unknown endpoint", 404, `{"error_code":404,"message":"HTTP 404 Not Found"}`, false, false, reasonUnexpected},
		{"subject not found", 404, `{"error_code":40401,"message":"Subject not found"}`, false, true, reasonUnexpected},
		{"version not found", 404, `{"error_code":40402,"message":"Version not found"}`, false, true, reasonUnexpected},
		{"40403 on a 502", 502, `{"error_code":40403,"message":"Schema 1 not found"}`, false, false, reasonServerError},
		{"html 502", 502, "<html>bad gateway</html>", false, false, reasonServerError},
		{"html 401", 401, "<html>nope</html>", false, false, reasonRefused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := statusTransport{next: roundTripFunc(func() (int, string) { return tc.status, tc.body })}
			sc := schemaregistry.NewConfig("http://registry.invalid")
			sc.MaxRetries, sc.HTTPClient = 0, &http.Client{Transport: tr}
			client, err := schemaregistry.NewClient(sc)
			if err != nil {
				t.Fatal(err)
			}
			_, err = client.GetBySubjectAndID("", 1)
			if err == nil {
				t.Fatal("no error")
			}
			if got := isSchemaNotFound(err); got != tc.notFound {
				t.Errorf("isSchemaNotFound(%v) = %v, want %v", err, got, tc.notFound)
			}
			if got := isReferenceNotFound(err); got != tc.refNotFound {
				t.Errorf("isReferenceNotFound(%v) = %v, want %v", err, got, tc.refNotFound)
			}
			if !tc.notFound {
				if got := errorReason(err); got != tc.reason {
					t.Errorf("errorReason(%v) = %q, want %q", err, got, tc.reason)
				}
			}
		})
	}
}

// TestOnlyTheRegistrySaysNotFound: one HTTP server plays the registry
// under /registry and an ingress's default backend (HTML 404) everywhere
// else. Through the right URL an unknown id is poison; through a wrong path
// prefix every lookup, of a known id or not, is an outage: Resolve fails
// with ErrUnavailable, nothing is learned, nothing is poison, and the same
// record decodes once the URL is right.
func TestOnlyTheRegistrySaysNotFound(t *testing.T) {
	reg := testenv.NewRegistry(t, "", "")
	id := reg.Add("events-value", "JSON", eventJSONSchema)
	target, err := url.Parse(reg.URL())
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/registry/", http.StripPrefix("/registry", httputil.NewSingleHostReverseProxy(target)))
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, "<html><body><h1>404 Not Found</h1>default backend</body></html>")
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	doc, err := protojson.Marshal(sampleEvent(4))
	if err != nil {
		t.Fatal(err)
	}
	known := append(event.AppendFrame(nil, int32(id), nil), doc...)
	unknown := append(event.AppendFrame(nil, 4242, nil), doc...)

	wrong, m := newRegistry(t, srv.URL+"/wrong-prefix")
	d := NewDecoder(wrong, event.FormatJSON, m)
	for _, v := range [][]byte{known, unknown} {
		learn, err := d.Resolve(context.Background(), [][]byte{v})
		if !errors.Is(err, ErrUnavailable) || learn != nil {
			t.Errorf("wrong path prefix: Resolve = %v, want ErrUnavailable", err)
		}
		if err != nil && !strings.Contains(err.Error(), "check the path of schema_registry.url") {
			t.Errorf("error does not say what to check: %v", err)
		}
		if !d.Missing(v) {
			t.Error("a failed lookup was learned")
		}
	}
	if n := testutil.ToFloat64(m.RegistryLookups.WithLabelValues("not_found")); n != 0 {
		t.Errorf("not_found lookups = %v through a wrong path, want 0", n)
	}
	if n := testutil.ToFloat64(m.RegistryErrors.WithLabelValues(reasonUnexpected)); n != 2 {
		t.Errorf("%s errors = %v, want 2", reasonUnexpected, n)
	}

	right, m := newRegistry(t, srv.URL+"/registry")
	d = NewDecoder(right, event.FormatJSON, m)
	if _, err := decode(t, d, known); err != nil {
		t.Errorf("known id through the right path: %v", err)
	}
	if _, err := decode(t, d, unknown); !event.IsPoison(err) || !strings.Contains(err.Error(), "schema id 4242 not found") {
		t.Errorf("unknown id through the right path: %v, want poison", err)
	}
}

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestUnknownIDForgotten: an unknown id is poison; once its schema is
// registered, records with that id are still poison while the not-found
// answer is remembered (no request per record), and decode after
// notFoundTTL, on a partition that learned the answer and on one that
// took it from the shared cache.
func TestUnknownIDForgotten(t *testing.T) {
	reg := testenv.NewRegistry(t, "", "")
	r, m := newRegistry(t, reg.URL())
	clock := &fakeClock{t: time.Date(2026, 12, 4, 6, 0, 0, 0, time.UTC)}
	r.now = clock.Now
	want := sampleEvent(5)
	doc, err := protojson.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	const id = 1 // the test registry's first id
	value := append(event.AppendFrame(nil, id, nil), doc...)

	d1 := NewDecoder(r, event.FormatJSON, m)
	if _, err := decode(t, d1, value); !event.IsPoison(err) {
		t.Fatalf("unknown id: %v, want poison", err)
	}
	clock.Add(notFoundTTL / 2)
	d2 := NewDecoder(r, event.FormatJSON, m) // learns from the shared cache
	if _, err := decode(t, d2, value); !event.IsPoison(err) {
		t.Fatalf("unknown id on a second partition: %v, want poison", err)
	}
	if got := reg.Add("events-value", "JSON", eventJSONSchema); got != id {
		t.Fatalf("registered as id %d, want %d", got, id)
	}
	clock.Add(notFoundTTL/2 - time.Millisecond)
	for _, d := range []*Decoder{d1, d2} {
		if _, err := decode(t, d, value); !event.IsPoison(err) {
			t.Errorf("within %v of the answer: %v, want poison (remembered)", notFoundTTL, err)
		}
	}
	if _, byID := reg.Requests(); byID != 1 {
		t.Errorf("%d lookups by id within %v, want 1", byID, notFoundTTL)
	}
	clock.Add(time.Millisecond)
	for i, d := range []*Decoder{d1, d2} {
		rec, err := decode(t, d, value)
		if err != nil {
			t.Fatalf("decoder %d after %v: %v, want decoded", i+1, notFoundTTL, err)
		}
		if !proto.Equal(rec.Event, want) {
			t.Errorf("decoded %v, want %v", rec.Event, want)
		}
	}
	if _, byID := reg.Requests(); byID != 2 {
		t.Errorf("%d lookups by id, want 2 (one after the answer expired)", byID)
	}
	// Found schemas are kept for good.
	clock.Add(24 * time.Hour)
	if d1.Missing(value) {
		t.Error("a found schema was forgotten")
	}
}

func TestBasicAuth(t *testing.T) {
	reg := testenv.NewRegistry(t, "key", "s3cret")
	id := reg.Add("events-value", "JSON", eventJSONSchema)
	m := metrics.New(prometheus.NewRegistry())
	for _, tc := range []struct {
		name string
		cfg  config.SchemaRegistry
		ok   bool
	}{
		{"user and password", config.SchemaRegistry{URL: config.SecretURL(reg.URL()), Username: "key", Password: "s3cret"}, true},
		{"in the url", config.SchemaRegistry{URL: config.SecretURL(strings.Replace(reg.URL(), "http://", "http://key:s3cret@", 1))}, true},
		{"wrong password", config.SchemaRegistry{URL: config.SecretURL(reg.URL()), Username: "key", Password: "nope"}, false},
		{"none", config.SchemaRegistry{URL: config.SecretURL(reg.URL())}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := New(tc.cfg, m)
			if err != nil {
				t.Fatal(err)
			}
			s, err := r.Lookup(context.Background(), int32(id))
			if tc.ok && (err != nil || s.NotFound || s.Type != TypeJSON) {
				t.Errorf("Lookup = %+v, %v", s, err)
			}
			if !tc.ok && !errors.Is(err, ErrUnavailable) {
				t.Errorf("Lookup = %+v, %v; want ErrUnavailable (refused is an outage, not poison)", s, err)
			}
			if err != nil && strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error reveals the password: %v", err)
			}
		})
	}
}

// TestCredentialsInTheURL: the URL's user information authenticates
// decoded (a password with '@' or a space), and a token alone in it
// (http://TOKEN@host) is sent as the basic-auth user with no password.
func TestCredentialsInTheURL(t *testing.T) {
	for _, tc := range []struct{ name, user, password, userinfo string }{
		{"escaped password", "key", "p@ss w/rd", "key:p%40ss%20w%2Frd"},
		{"token alone", "t0ken", "", "t0ken"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := testenv.NewRegistry(t, tc.user, tc.password)
			id := reg.Add("events-value", "JSON", eventJSONSchema)
			r, _ := newRegistry(t, "http://"+tc.userinfo+"@"+reg.Addr())
			s, err := r.Lookup(context.Background(), int32(id))
			if err != nil || s.NotFound || s.Type != TypeJSON {
				t.Errorf("Lookup = %+v, %v", s, err)
			}
		})
	}
}

// TestConcurrentLookupsShareOneRequest: every partition meeting a new id at
// once costs one registry request.
func TestConcurrentLookupsShareOneRequest(t *testing.T) {
	reg := testenv.NewRegistry(t, "", "")
	id := reg.Add("events-value", "JSON", eventJSONSchema)
	r, m := newRegistry(t, reg.URL())
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			if s, err := r.Lookup(context.Background(), int32(id)); err != nil || s.Type != TypeJSON {
				t.Errorf("Lookup = %+v, %v", s, err)
			}
		})
	}
	wg.Wait()
	if _, byID := reg.Requests(); byID != 1 {
		t.Errorf("%d requests for one id, want 1", byID)
	}
	if n := testutil.ToFloat64(m.RegistryLookups.WithLabelValues("found")); n != 1 {
		t.Errorf("lookups found = %v, want 1", n)
	}
}
