package cli

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestExitCodeExplainsPreparedStatementErrors: a command that stops on a
// prepared statement error (a transaction-mode pooler and
// default_query_exec_mode=cache_statement) says what to change.
func TestExitCodeExplainsPreparedStatementErrors(t *testing.T) {
	err := fmt.Errorf("migrate: take migration lock: %w",
		&pgconn.PgError{Severity: "ERROR", Code: "42P05", Message: `prepared statement "stmtcache_1" already exists`})
	var errOut bytes.Buffer
	if code := exitCode(&errOut, err); code != ExitError {
		t.Errorf("exit code %d, want %d", code, ExitError)
	}
	if got := errOut.String(); !strings.Contains(got, "already exists") ||
		!strings.Contains(got, "set default_query_exec_mode=cache_describe in postgres.url") {
		t.Errorf("stderr does not say what to change: %q", got)
	}
}
