package store

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrationLockKey is the pg_advisory_xact_lock key every instance takes
// before migrating ("ratchet" in ASCII), so instances starting at once apply
// each migration exactly once.
const migrationLockKey int64 = 0x72617463686574

// Migration is one embedded schema change, from migrations/NNN_name.sql.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var out []Migration
	seen := make(map[int]string)
	for _, e := range entries {
		if e.IsDir() || path.Ext(e.Name()) != ".sql" {
			continue
		}
		base := strings.TrimSuffix(e.Name(), ".sql")
		num, name, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 || name == "" {
			return nil, fmt.Errorf("migration %s: name must be NNN_name.sql", e.Name())
		}
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("migration %s: version %d already used by %s", e.Name(), v, prev)
		}
		seen[v] = e.Name()
		b, err := migrationFiles.ReadFile("migrations/" + e.Name())
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", e.Name(), err)
		}
		out = append(out, Migration{Version: v, Name: name, SQL: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// Migrate applies the embedded migrations that the database does not have
// yet, all in one transaction, and records each in
// ratchet_schema_migrations. It is idempotent, and safe when several
// instances start at once: they serialise on a transaction-scoped advisory
// lock, and the ones that come second find nothing left to do. On error
// nothing is applied.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	migrations, err := Migrations()
	if err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrationLockKey); err != nil {
			return fmt.Errorf("take migration lock: %w", err)
		}
		// Created under the lock: concurrent CREATE TABLE IF NOT EXISTS
		// can otherwise fail on the catalog's unique indexes.
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS ratchet_schema_migrations (
	version    int         PRIMARY KEY,
	name       text        NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
)`); err != nil {
			return fmt.Errorf("create ratchet_schema_migrations: %w", err)
		}
		rows, err := tx.Query(ctx, "SELECT version FROM ratchet_schema_migrations")
		if err != nil {
			return fmt.Errorf("read applied migrations: %w", err)
		}
		versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return fmt.Errorf("read applied migrations: %w", err)
		}
		applied := make(map[int]bool, len(versions))
		for _, v := range versions {
			applied[int(v)] = true
		}
		for _, m := range migrations {
			if applied[m.Version] {
				continue
			}
			// No arguments: pgx sends it with the simple protocol, which
			// allows several statements in one file.
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return fmt.Errorf("apply migration %03d_%s: %w", m.Version, m.Name, err)
			}
			if _, err := tx.Exec(ctx,
				"INSERT INTO ratchet_schema_migrations (version, name, applied_at) VALUES ($1, $2, now())",
				m.Version, m.Name); err != nil {
				return fmt.Errorf("record migration %03d_%s: %w", m.Version, m.Name, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}
