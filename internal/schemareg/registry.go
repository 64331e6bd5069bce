// Package schemareg reads record values in the Confluent Schema Registry
// wire format: it looks schema ids up in the registry (through
// confluent-kafka-go's schemaregistry client), caches the answers, checks
// that a schema can be decoded as ratchet.v1.Event, and decodes the
// payload.
//
// The life of one record value: the partition asks its Decoder whether the
// value's schema id is known (Missing); if not, Resolve looks it up
// (Registry.Lookup: the shared cache, else GET /schemas/ids/{id}) off the
// partition's goroutine, retried with backoff while the registry is
// unavailable; then DecodeRecord parses the framing, finds the schema in
// the Decoder's own map and decodes the payload with the event decoder.
//
// Two kinds of failure are kept apart on purpose. A record that can never
// be read (no magic byte, an id the registry does not know, a schema that
// is not ratchet.v1.Event) is poison: DecodeRecord returns an
// *event.Error and the record goes to the dead-letter topic. A registry
// that cannot answer (unreachable, 5xx, refusing our credentials) is an
// outage: Lookup returns an error, nothing is decided about the record,
// and the partition waits.
package schemareg

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry"
	"github.com/confluentinc/confluent-kafka-go/v2/schemaregistry/rest"
	"golang.org/x/sync/singleflight"

	"ratchet/config"
	"ratchet/internal/metrics"
)

// Schema types as the registry names them; an empty type means Avro.
const (
	TypeProtobuf = "PROTOBUF"
	TypeJSON     = "JSON"
	TypeAvro     = "AVRO"
)

// notFoundTTL is how long an unknown schema id is remembered. An id the
// registry does not know is usually a value from another registry, or
// garbage that happens to start with 0; remembering it keeps such a stream
// from costing a request per record, and forgetting it lets a schema
// registered later be found.
const notFoundTTL = 30 * time.Second

// maxNotFound bounds the unknown ids remembered; past it they are all
// forgotten (a stream of random ids must not grow the cache forever).
const maxNotFound = 10000

// requestTimeout bounds one registry request; the partition retries with
// its backoff after it.
const requestTimeout = 5 * time.Second

// ErrUnavailable is wrapped by every error Lookup returns: the registry
// did not answer the question (unreachable, failing, or refusing the
// credentials), so nothing can be said about the record.
var ErrUnavailable = errors.New("schema registry unavailable")

// Schema is what the registry answered for one schema id.
type Schema struct {
	ID int32
	// NotFound is set when the registry does not know the id (404).
	NotFound bool
	// Type is PROTOBUF, JSON or AVRO.
	Type string
	// Text is the schema as registered.
	Text string
	// event is the message-index path of ratchet.v1.Event in a protobuf
	// schema; nil when the schema does not define it.
	event []int
	// messages names the schema's messages by their index path (as
	// fmt.Sprint of the path), to say which message a value declares.
	messages map[string]string
	// problem says why values of this schema can never be read as
	// ratchet.v1.Event (a parse error, references that do not resolve).
	problem string
}

// Registry looks schema ids up and caches the answers; it is shared by
// every partition of an engine and safe for concurrent use. Found schemas
// are kept for the life of the Registry: a schema id's schema never
// changes.
type Registry struct {
	client schemaregistry.Client
	m      *metrics.Metrics

	inflight singleflight.Group // by schema id

	mu       sync.Mutex
	found    map[int32]*Schema
	notFound map[int32]time.Time // id → when to ask again
}

// New returns a Registry for cfg (cfg.URL must be set).
func New(cfg config.SchemaRegistry, m *metrics.Metrics) (*Registry, error) {
	client, err := NewClient(cfg)
	if err != nil {
		return nil, err
	}
	return &Registry{client: client, m: m, found: map[int32]*Schema{}, notFound: map[int32]time.Time{}}, nil
}

// NewClient returns a schemaregistry client for cfg: basic auth from
// Username and Password, or from the URL's user information; no retries of
// its own (callers retry with their backoff); error answers normalised so
// that their HTTP status is always in rest.Error.Code (see statusTransport).
func NewClient(cfg config.SchemaRegistry) (schemaregistry.Client, error) {
	raw := cfg.URL.Reveal()
	var sc *schemaregistry.Config
	switch u, err := url.Parse(raw); {
	case err != nil:
		return nil, fmt.Errorf("schema_registry.url %s: %w", cfg.URL, err)
	case cfg.Username != "":
		sc = schemaregistry.NewConfigWithBasicAuthentication(raw, cfg.Username.Reveal(), cfg.Password.Reveal())
	case u.User != nil:
		sc = schemaregistry.NewConfig(raw)
		sc.BasicAuthCredentialsSource = "URL"
	default:
		sc = schemaregistry.NewConfig(raw)
	}
	sc.MaxRetries = 0
	sc.RequestTimeoutMs = int(requestTimeout / time.Millisecond)
	sc.HTTPClient = &http.Client{Timeout: requestTimeout, Transport: statusTransport{next: http.DefaultTransport}}
	client, err := schemaregistry.NewClient(sc)
	if err != nil {
		return nil, fmt.Errorf("schema registry client for %s: %s", cfg.URL, config.RedactURL(err.Error()))
	}
	return client, nil
}

// Client returns the underlying schemaregistry client.
func (r *Registry) Client() schemaregistry.Client { return r.client }

// Lookup returns the schema of id, from the cache or the registry. An
// unknown id is a Schema with NotFound set, not an error; an error (always
// wrapping ErrUnavailable) means the registry could not answer, and Lookup
// may be called again later. It blocks for at most about requestTimeout
// per request; ctx is checked before each request (the client takes no
// context).
func (r *Registry) Lookup(ctx context.Context, id int32) (*Schema, error) {
	r.mu.Lock()
	if s, ok := r.found[id]; ok {
		r.mu.Unlock()
		r.m.RegistryCacheHits.Inc()
		return s, nil
	}
	if until, ok := r.notFound[id]; ok && time.Now().Before(until) {
		r.mu.Unlock()
		r.m.RegistryCacheHits.Inc()
		return &Schema{ID: id, NotFound: true}, nil
	}
	r.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// Every partition of a topic meets a new schema id at about the same
	// time: one request answers them all.
	v, err, _ := r.inflight.Do(strconv.Itoa(int(id)), func() (any, error) { return r.fetch(id) })
	if err != nil {
		return nil, err
	}
	return v.(*Schema), nil
}

// fetch asks the registry for id and caches the answer.
func (r *Registry) fetch(id int32) (*Schema, error) {
	info, err := r.client.GetBySubjectAndID("", int(id))
	if err != nil {
		if isNotFound(err) {
			r.m.RegistryLookups.WithLabelValues("not_found").Inc()
			r.mu.Lock()
			if len(r.notFound) >= maxNotFound {
				clear(r.notFound)
			}
			r.notFound[id] = time.Now().Add(notFoundTTL)
			r.mu.Unlock()
			return &Schema{ID: id, NotFound: true}, nil
		}
		r.m.RegistryErrors.WithLabelValues(errorReason(err)).Inc()
		return nil, fmt.Errorf("%w: look up schema id %d: %s", ErrUnavailable, id, config.RedactURL(err.Error()))
	}
	r.m.RegistryLookups.WithLabelValues("found").Inc()
	s, err := r.newSchema(id, info)
	if err != nil {
		return nil, err // references could not be fetched: ask again later
	}
	r.mu.Lock()
	r.found[id] = s
	delete(r.notFound, id)
	r.mu.Unlock()
	return s, nil
}

// newSchema prepares info for decoding: for protobuf, it parses the schema
// (fetching the schemas it references) and finds ratchet.v1.Event.
func (r *Registry) newSchema(id int32, info schemaregistry.SchemaInfo) (*Schema, error) {
	s := &Schema{ID: id, Type: info.SchemaType, Text: info.Schema}
	if s.Type == "" {
		s.Type = TypeAvro
	}
	if s.Type != TypeProtobuf {
		return s, nil
	}
	if err := s.parseProtobuf(r.client, info); err != nil {
		return nil, err
	}
	return s, nil
}

// isNotFound reports whether err is the registry saying it does not know
// the schema id: HTTP 404, error code 40403 (schema not found) or another
// 404xx.
func isNotFound(err error) bool {
	var re *rest.Error
	return errors.As(err, &re) && (re.Code == http.StatusNotFound || re.Code/100 == 404)
}

// errorReason classifies a failed request for the errors metric.
func errorReason(err error) string {
	var re *rest.Error
	switch {
	case errors.As(err, &re) && (re.Code >= 500 && re.Code < 600 || re.Code/100 >= 500):
		return "server_error"
	case errors.As(err, &re):
		return "refused"
	default:
		return "unreachable"
	}
}

// statusTransport makes every error answer of the registry readable by the
// schemaregistry client as a rest.Error carrying the HTTP status: the
// client decodes error bodies as JSON and, when a body is not JSON (a proxy's
// HTML 502, a plain-text 404), returns a bare JSON syntax error, from which
// a missing schema could not be told apart from an outage. A JSON body
// without an error_code gets the HTTP status as its code.
type statusTransport struct{ next http.RoundTripper }

func (t statusTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil || resp.StatusCode < 300 {
		return resp, err
	}
	body, readErr := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if readErr != nil {
		var ne net.Error
		if errors.As(readErr, &ne) {
			return nil, readErr
		}
	}
	var e struct {
		Code    int    `json:"error_code"`
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &e) != nil || e.Code == 0 {
		e.Code = resp.StatusCode
		if e.Message == "" {
			e.Message = strings.TrimSpace(string(body[:min(len(body), 200)]))
		}
		if e.Message == "" {
			e.Message = http.StatusText(resp.StatusCode)
		}
		body, _ = json.Marshal(e)
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Del("Content-Length")
	return resp, nil
}
