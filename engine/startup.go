package engine

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"ratchet/config"
	"ratchet/internal/store"
)

// Start-up retries (startup.timeout). A pod that starts while PostgreSQL or
// the brokers blink waits for them instead of exiting at the first refused
// connection (Kubernetes would then back off for minutes).
const (
	// startAttemptTimeout bounds one attempt (connect and migrate, or read
	// the topics), itself bounded by what is left of startup.timeout.
	startAttemptTimeout = 30 * time.Second
	// startFirstBackoff and startMaxBackoff bound the wait between
	// attempts; it doubles from the first to the cap, with jitter.
	startFirstBackoff = 500 * time.Millisecond
	startMaxBackoff   = 15 * time.Second
)

// starter runs the steps of a start that need a dependency, each until it
// succeeds, fails for a reason a retry cannot change, the engine is
// stopped, or startup.timeout (counted from the start of the run, for all
// steps together) runs out.
type starter struct {
	log     *slog.Logger
	timeout time.Duration // startup.timeout; 0 waits forever
	until   time.Time     // zero when timeout is 0
	// waiting is told what the start waits for before every attempt and
	// wait (the HTTP server's /readyz reason).
	waiting func(reason string)
	// firstBackoff is startFirstBackoff; tests shorten it.
	firstBackoff time.Duration
}

func newStarter(log *slog.Logger, timeout time.Duration, waiting func(string)) *starter {
	s := &starter{log: log, timeout: timeout, waiting: waiting, firstBackoff: startFirstBackoff}
	if timeout > 0 {
		s.until = time.Now().Add(timeout)
	}
	return s
}

// permanentStartError marks a start-up failure that retrying cannot mend
// (a refused password, a missing permission, a bad property): the start
// ends at once with it.
type permanentStartError struct{ err error }

func (e permanentStartError) Error() string { return e.err.Error() }
func (e permanentStartError) Unwrap() error { return e.err }

// permanent marks err as not worth retrying at start.
func permanent(err error) error { return permanentStartError{err: err} }

// left returns the time left until the start-up deadline, and false when
// it has passed. Without a timeout it is always (a long time, true).
func (s *starter) left() (time.Duration, bool) {
	if s.until.IsZero() {
		return time.Duration(1<<63 - 1), true
	}
	d := time.Until(s.until)
	return d, d > 0
}

// do runs step until it returns nil. what names the dependency
// ("PostgreSQL", "Kafka") in the WARN of every failed attempt, in /readyz
// and in the error that ends the start. The step's context is bounded by
// startAttemptTimeout and by what is left of startup.timeout. The error
// returned wraps ctx's error when the engine was stopped meanwhile (Run
// then reports a clean stop).
func (s *starter) do(ctx context.Context, what string, step func(ctx context.Context) error) error {
	backoff := s.firstBackoff
	var last error
	for attempt := 1; ; attempt++ {
		left, ok := s.left()
		if !ok && last != nil {
			return fmt.Errorf("start-up gave up: %s unreachable for startup.timeout %s (%d attempts): %w",
				what, s.timeout, attempt-1, last)
		}
		if !ok {
			return fmt.Errorf("start-up gave up: startup.timeout %s ran out before %s was tried", s.timeout, what)
		}
		actx, cancel := context.WithTimeout(ctx, min(startAttemptTimeout, left))
		err := step(actx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("stopped while waiting for %s: %w", what, ctx.Err())
		}
		reason := config.RedactURL(err.Error())
		if pe := (permanentStartError{}); errors.As(err, &pe) {
			return fmt.Errorf("start-up: %s refused, not retried: %w", what, err)
		}
		last = err
		left, ok = s.left()
		if !ok {
			continue // gives up above, with err
		}
		// Full jitter over the upper half: instances started together do
		// not knock on the dependency in step.
		wait := min(backoff/2+rand.N(backoff/2+1), left)
		s.log.Warn("start-up: dependency unreachable, retrying", "dependency", what, "attempt", attempt,
			"retry_in", wait.Round(time.Millisecond).String(), "reason", reason)
		s.waiting(fmt.Sprintf("waiting for %s (attempt %d failed: %s)", what, attempt, reason))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("stopped while waiting for %s: %w", what, ctx.Err())
		case <-t.C:
		}
		backoff = min(2*backoff, startMaxBackoff)
	}
}

// startPostgresError classifies a failure to reach or migrate PostgreSQL
// at start: a transient one (refused or reset connection, timeout, server
// starting or shutting down, too many connections) is retried; any other
// (a refused password, a missing database or permission, a TLS setting the
// server does not support) ends the start at once.
func startPostgresError(err error) error {
	if err == nil {
		return nil
	}
	if untrustedCertificate(err) || !store.IsTransient(err) {
		return permanent(err)
	}
	return err
}

// untrustedCertificate reports whether err is a server certificate that
// does not verify (an unknown authority, another host name, expired):
// sslmode verify-ca or verify-full against the wrong CA, which no retry
// mends.
func untrustedCertificate(err error) bool {
	var (
		verify    *tls.CertificateVerificationError
		authority x509.UnknownAuthorityError
		host      x509.HostnameError
		invalid   x509.CertificateInvalidError
	)
	return errors.As(err, &verify) || errors.As(err, &authority) || errors.As(err, &host) || errors.As(err, &invalid)
}

// refusedByBrokers reads the error events queued on p and returns the
// first that says the brokers refuse this client for good — a login
// refused (SASL_AUTHENTICATION_FAILED), a broker certificate that does not
// verify — and else the first that looks like a refused login but may be a
// broker that went away during one ("SASL authentication error" on a
// dropped connection, which is also how kfake refuses a password): the
// caller takes that for a refusal only when it comes back at the next
// attempt. librdkafka reports these as events while the request that
// needed the connection only reads "Broker transport failure". It reads
// only what is queued, before the dead-letter actor reads the producer's
// events.
func refusedByBrokers(p *kafka.Producer) (refused, suspect error) {
	for {
		select {
		case ev := <-p.Events():
			ke, ok := ev.(kafka.Error)
			if !ok {
				continue
			}
			switch {
			case ke.Code() == kafka.ErrAuthentication, ke.Code() == kafka.ErrSaslAuthenticationFailed,
				ke.Code() == kafka.ErrSsl && strings.Contains(ke.Error(), "certificate verify failed"):
				return ke, nil
			case suspect == nil && strings.Contains(ke.Error(), "SASL authentication error"):
				suspect = ke
			}
		default:
			return nil, suspect
		}
	}
}

// startKafkaError classifies a failure to read or create topics at start:
// refused credentials and authorizations end the start at once, anything
// else (unreachable brokers, timeouts, a controller moving) is retried.
func startKafkaError(err error) error {
	var ke kafka.Error
	if err == nil || !errors.As(err, &ke) {
		return err
	}
	switch ke.Code() {
	case kafka.ErrAuthentication, kafka.ErrSaslAuthenticationFailed, kafka.ErrTopicAuthorizationFailed,
		kafka.ErrClusterAuthorizationFailed, kafka.ErrInvalidConfig, kafka.ErrInvalidReplicationFactor,
		kafka.ErrPolicyViolation, kafka.ErrTopicException, kafka.ErrInvalidPartitions:
		return permanent(err)
	}
	return err
}
