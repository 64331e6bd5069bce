package testenv

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Registry is an in-process Confluent Schema Registry for tests, served
// over HTTP on 127.0.0.1, speaking the REST API for what the
// schemaregistry client and Confluent's serializers call: register a
// schema under a subject (POST /subjects/{s}/versions), look a schema up
// under a subject (POST /subjects/{s}), fetch a schema by id
// (GET /schemas/ids/{id}) and a version of a subject
// (GET /subjects/{s}/versions/{v}). Errors are answered as the registry
// does: a JSON body with error_code (40403 schema not found, 40401 subject
// not found).
//
// Fail makes it answer every request with an HTTP status (503: an
// outage), until Fail(0). For an unreachable registry put a Proxy in
// front of URL.
type Registry struct {
	srv      *httptest.Server
	user     string
	password string

	fail     atomic.Int32
	requests atomic.Int64
	byID     atomic.Int64 // GET /schemas/ids/{id}

	mu       sync.Mutex
	schemas  []registered // id-1 → schema
	subjects map[string][]int
}

type registered struct {
	Schema     string          `json:"schema"`
	SchemaType string          `json:"schemaType,omitempty"`
	References json.RawMessage `json:"references,omitempty"`
}

// NewRegistry starts a registry; it is closed when the test ends. With a
// user, every request must carry that basic-auth user and password.
func NewRegistry(tb testing.TB, user, password string) *Registry {
	tb.Helper()
	r := &Registry{user: user, password: password, subjects: map[string][]int{}}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	tb.Cleanup(r.srv.Close)
	return r
}

// URL is the registry's base URL.
func (r *Registry) URL() string { return r.srv.URL }

// Addr is the registry's host:port.
func (r *Registry) Addr() string { return strings.TrimPrefix(r.srv.URL, "http://") }

// Fail answers every request with status until Fail(0).
func (r *Registry) Fail(status int) { r.fail.Store(int32(status)) }

// Requests returns how many requests were served, and how many of them
// fetched a schema by id.
func (r *Registry) Requests() (all, byID int64) { return r.requests.Load(), r.byID.Load() }

// Add registers schema (of schemaType: PROTOBUF, JSON, or "" for Avro)
// under subject directly and returns its id.
func (r *Registry) Add(subject, schemaType, schema string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.add(subject, registered{Schema: schema, SchemaType: schemaType})
}

func (r *Registry) add(subject string, s registered) int {
	for _, id := range r.subjects[subject] {
		if same(r.schemas[id-1], s) {
			return id
		}
	}
	for i, have := range r.schemas {
		if same(have, s) {
			r.subjects[subject] = append(r.subjects[subject], i+1)
			return i + 1
		}
	}
	r.schemas = append(r.schemas, s)
	id := len(r.schemas)
	r.subjects[subject] = append(r.subjects[subject], id)
	return id
}

func same(a, b registered) bool {
	ta, tb := a.SchemaType, b.SchemaType
	if ta == "" {
		ta = "AVRO"
	}
	if tb == "" {
		tb = "AVRO"
	}
	return a.Schema == b.Schema && ta == tb
}

func (r *Registry) serve(w http.ResponseWriter, req *http.Request) {
	r.requests.Add(1)
	if code := int(r.fail.Load()); code != 0 {
		writeError(w, code, code*100+1, "registry failing on purpose")
		return
	}
	if r.user != "" {
		if u, p, ok := req.BasicAuth(); !ok || u != r.user || p != r.password {
			writeError(w, http.StatusUnauthorized, 40101, "unauthorized")
			return
		}
	}
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	switch {
	case req.Method == http.MethodGet && len(parts) == 3 && parts[0] == "schemas" && parts[1] == "ids":
		r.byID.Add(1)
		id, err := strconv.Atoi(parts[2])
		r.mu.Lock()
		defer r.mu.Unlock()
		if err != nil || id < 1 || id > len(r.schemas) {
			writeError(w, http.StatusNotFound, 40403, fmt.Sprintf("Schema %s not found", parts[2]))
			return
		}
		writeJSON(w, r.schemas[id-1])
	case req.Method == http.MethodPost && len(parts) == 3 && parts[0] == "subjects" && parts[2] == "versions":
		var s registered
		if json.NewDecoder(req.Body).Decode(&s) != nil {
			writeError(w, http.StatusUnprocessableEntity, 42201, "invalid schema")
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		writeJSON(w, map[string]int{"id": r.add(parts[1], s)})
	case req.Method == http.MethodPost && len(parts) == 2 && parts[0] == "subjects":
		var s registered
		if json.NewDecoder(req.Body).Decode(&s) != nil {
			writeError(w, http.StatusUnprocessableEntity, 42201, "invalid schema")
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		for v, id := range r.subjects[parts[1]] {
			if same(r.schemas[id-1], s) {
				writeJSON(w, map[string]any{"subject": parts[1], "id": id, "version": v + 1,
					"schema": s.Schema, "schemaType": s.SchemaType})
				return
			}
		}
		writeError(w, http.StatusNotFound, 40403, "Schema not found")
	case req.Method == http.MethodGet && len(parts) == 4 && parts[0] == "subjects" && parts[2] == "versions":
		r.mu.Lock()
		defer r.mu.Unlock()
		ids := r.subjects[parts[1]]
		v, err := strconv.Atoi(parts[3])
		if parts[3] == "latest" {
			v, err = len(ids), nil
		}
		if err != nil || v < 1 || v > len(ids) {
			writeError(w, http.StatusNotFound, 40402, "Version not found")
			return
		}
		s := r.schemas[ids[v-1]-1]
		writeJSON(w, map[string]any{"subject": parts[1], "id": ids[v-1], "version": v,
			"schema": s.Schema, "schemaType": s.SchemaType, "references": s.References})
	default:
		writeError(w, http.StatusNotFound, 404, "no such endpoint in the test registry")
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status, code int, msg string) {
	w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error_code": code, "message": msg})
}
