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
// that cannot answer (unreachable, 5xx, refusing our credentials, any
// answer that is not the registry's own, such as an ingress's HTML 404) is
// an outage: Lookup returns an error, nothing is decided about the record,
// and the partition waits. Only the registry's own "schema not found"
// (HTTP 404 with error_code 40403 in its JSON body) makes an id unknown,
// and an unknown id is remembered for notFoundTTL only, by the Registry
// and by every Decoder: a schema registered later is found.
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
	"github.com/hamba/avro/v2"
	"github.com/jhump/protoreflect/desc"
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

// notFoundTTL is how long an unknown schema id is remembered, by the
// Registry and by each Decoder. An id the registry does not know is usually
// a value from another registry, or garbage that happens to start with 0;
// remembering it keeps such a stream from costing a request per record,
// and forgetting it lets a schema registered later be found.
const notFoundTTL = 30 * time.Second

// Error codes of the registry's JSON error bodies that say something does
// not exist. A lookup by id (GET /schemas/ids/{id}, no subject) is answered
// 40403 when the id is unknown; 40401 and 40402 answer lookups by subject
// and version, which only the references of a protobuf schema use.
const (
	codeSubjectNotFound = 40401
	codeVersionNotFound = 40402
	codeSchemaNotFound  = 40403
)

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
	// NotFound is set when the registry does not know the id (its 404
	// with error_code 40403); the answer holds until retryAt.
	NotFound bool
	retryAt  time.Time
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
	// file is the parsed protobuf schema (nil for other types, or when it
	// does not parse), for pipelines that read any message type.
	file *desc.FileDescriptor
	// avro is the parsed Avro schema, parsed on first use (avroOnce);
	// avroProblem says why it does not parse.
	avroOnce    sync.Once
	avro        avro.Schema
	avroProblem string
}

// Registry looks schema ids up and caches the answers; it is shared by
// every partition of an engine and safe for concurrent use. Found schemas
// are kept for the life of the Registry: a schema id's schema never
// changes.
type Registry struct {
	client schemaregistry.Client
	m      *metrics.Metrics

	inflight singleflight.Group // by schema id
	// now is the clock of the not-found answers: time.Now; a test sets
	// its own before the Registry is used (each Decoder copies it).
	now func() time.Time

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
	return &Registry{client: client, m: m, now: time.Now, found: map[int32]*Schema{}, notFound: map[int32]time.Time{}}, nil
}

// NewClient returns a schemaregistry client for cfg: basic auth from
// Username and Password, or from the URL's user information (user and
// password, or a token alone as the user); no retries of
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
		// Decoded, and "user:" for a token alone (https://TOKEN@host),
		// as curl sends it; the client's own "URL" source would send the
		// percent-encoded user information, and no colon for a token.
		password, _ := u.User.Password()
		sc = schemaregistry.NewConfigWithBasicAuthentication(raw, u.User.Username(), password)
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
	if until, ok := r.notFound[id]; ok && r.now().Before(until) {
		r.mu.Unlock()
		r.m.RegistryCacheHits.Inc()
		return &Schema{ID: id, NotFound: true, retryAt: until}, nil
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
		if isSchemaNotFound(err) {
			r.m.RegistryLookups.WithLabelValues("not_found").Inc()
			until := r.now().Add(notFoundTTL)
			r.mu.Lock()
			if len(r.notFound) >= maxNotFound {
				clear(r.notFound)
			}
			r.notFound[id] = until
			r.mu.Unlock()
			return &Schema{ID: id, NotFound: true, retryAt: until}, nil
		}
		reason := errorReason(err)
		r.m.RegistryErrors.WithLabelValues(reason).Inc()
		hint := ""
		if reason == reasonUnexpected {
			hint = " (a 404 that is not the registry's answer: check the path of schema_registry.url)"
		}
		return nil, fmt.Errorf("%w: look up schema id %d: %s%s", ErrUnavailable, id, config.RedactURL(err.Error()), hint)
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

// isSchemaNotFound reports whether err is the registry saying it does not
// know the schema id: its JSON error body with error_code 40403 (on an HTTP
// 404, see statusTransport). Any other 404 (an ingress's default backend,
// a wrong path prefix, a JSON body without that code) did not come from a
// registry asked the question, and is an outage.
func isSchemaNotFound(err error) bool {
	var re *rest.Error
	return errors.As(err, &re) && re.Code == codeSchemaNotFound
}

// isReferenceNotFound reports whether err is the registry saying it does
// not have a schema that another references by subject and version:
// subject, version or schema not found, in its JSON error body.
func isReferenceNotFound(err error) bool {
	var re *rest.Error
	if !errors.As(err, &re) {
		return false
	}
	switch re.Code {
	case codeSubjectNotFound, codeVersionNotFound, codeSchemaNotFound:
		return true
	}
	return false
}

// Reasons of ratchet_schema_registry_errors_total.
const (
	reasonUnreachable = "unreachable"
	reasonServerError = "server_error"
	reasonRefused     = "refused"
	// reasonUnexpected: an HTTP 404 that is not the registry's "schema not
	// found" (a wrong URL path, an ingress's default backend).
	reasonUnexpected = "unexpected_answer"
)

// errorReason classifies a failed request for the errors metric.
func errorReason(err error) string {
	var re *rest.Error
	switch {
	case !errors.As(err, &re):
		return reasonUnreachable
	case re.Code >= 500 && re.Code < 600 || re.Code/100 >= 500 && re.Code/100 < 600:
		return reasonServerError
	case re.Code == http.StatusNotFound || re.Code/100 == http.StatusNotFound:
		return reasonUnexpected
	default:
		return reasonRefused
	}
}

// statusTransport makes every error answer of the registry readable by the
// schemaregistry client as a rest.Error carrying the HTTP status: the
// client decodes error bodies as JSON and, when a body is not JSON (a proxy's
// HTML 502, a plain-text 404), returns a bare JSON syntax error, from which
// a missing schema could not be told apart from an outage. A JSON body
// without an error_code, or with one that does not belong to the HTTP
// status (the registry's codes are the status and one more digit: 40403 on
// a 404), gets the HTTP status as its code; so error_code 40403 always
// comes with a 404.
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
	if json.Unmarshal(body, &e) != nil || e.Code != resp.StatusCode && e.Code/100 != resp.StatusCode {
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
