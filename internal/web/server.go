package web

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Server timeouts. WriteTimeout bounds one response, including a /metrics
// scrape and the Source calls behind /api/state (which have their own,
// shorter deadline, sourceTimeout).
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	writeTimeout      = 30 * time.Second
	idleTimeout       = 60 * time.Second
	shutdownTimeout   = 5 * time.Second
	sourceTimeout     = 5 * time.Second
	sourceWarnEvery   = 30 * time.Second
	maxHeaderBytes    = 64 << 10
)

// windowMinutes is how far back the page and /api/state show rollups, in whole
// minute buckets ending with the current one.
const windowMinutes = 30

// contentSecurityPolicy allows only the page's own origin: scripts and
// styles come from /static/, fetch() goes to /api/state.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; " +
	"img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Options configure a Server.
type Options struct {
	// Addr is the TCP address to listen on; port 0 picks any free port.
	Addr string
	// Source feeds the page, /api/state and /readyz. Required.
	Source Source
	// Gatherer is what /metrics exposes; nil means prometheus.DefaultGatherer.
	Gatherer prometheus.Gatherer
	// Logger receives the server's own messages; nil means slog.Default().
	Logger *slog.Logger
	// Title heads the page; empty means "ratchet".
	Title string
	// IncludeValues shows the reasons of dead letters with the record
	// values they quote (log.include_values); otherwise those values are
	// replaced by … (redact.Values) before the page or /api/state shows
	// them: the page needs no login.
	IncludeValues bool
}

// Server is ratchet's HTTP server. Create it with New; its handler is safe
// for concurrent use.
type Server struct {
	addr   string
	source Source
	log    *slog.Logger
	title  string
	// includeValues: Options.IncludeValues.
	includeValues bool
	handler       http.Handler
	now           func() time.Time // replaced in tests

	lastWarn atomic.Int64 // unix nanos of the last source warning logged
}

// New builds a Server from opts. It does not listen; call Run.
func New(opts Options) *Server {
	s := &Server{
		addr:   opts.Addr,
		source: opts.Source,
		log:    opts.Logger,
		title:  opts.Title,
		now:    time.Now,

		includeValues: opts.IncludeValues,
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.title == "" {
		s.title = "ratchet"
	}
	g := opts.Gatherer
	if g == nil {
		g = prometheus.DefaultGatherer
	}

	mux := http.NewServeMux()
	mux.HandleFunc("/{$}", s.handleIndex)
	mux.HandleFunc("/healthz", s.handleHealthz)
	mux.HandleFunc("/readyz", s.handleReadyz)
	mux.HandleFunc("/api/state", s.handleState)
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError,
	}))
	mux.Handle("/static/", http.StripPrefix("/static/", staticHandler()))
	s.handler = secure(mux)
	return s
}

// Handler returns the server's routes with method filtering and security
// headers applied, for tests and for mounting elsewhere.
func (s *Server) Handler() http.Handler {
	return s.handler
}

// Run listens on the configured address, calls ready (when not nil) with the
// address actually bound once it is listening, and serves until ctx is done.
// It then shuts down gracefully, waiting at most 5 s for open requests.
// Run returns nil on a clean stop, and an error naming the address when it
// cannot listen (for example, the port is in use).
func (s *Server) Run(ctx context.Context, ready func(addr string)) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", s.addr)
	if err != nil {
		return fmt.Errorf("listen http on %s: %w", s.addr, err)
	}
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	addr := ln.Addr().String()
	s.log.Info("http listening", "addr", addr)
	if ready != nil {
		ready(addr)
	}

	// The serve goroutine exits when srv is shut down or closed below, or
	// when the listener fails; Run waits for it on every path.
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	select {
	case err := <-served:
		return fmt.Errorf("serve http on %s: %w", addr, err)
	case <-ctx.Done():
	}

	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	shutErr := srv.Shutdown(sctx)
	if shutErr != nil {
		// Requests still open after the grace period are cut off.
		_ = srv.Close()
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve http on %s: %w", addr, err)
	}
	if shutErr != nil {
		return fmt.Errorf("shut down http on %s: %w", addr, shutErr)
	}
	s.log.Info("http stopped", "addr", addr)
	return nil
}

// secure rejects every method but GET and HEAD and sets the security headers
// on every response.
func secure(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		next.ServeHTTP(w, r)
	})
}
