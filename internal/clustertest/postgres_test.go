package clustertest_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sortie-edge/sortie/internal/clustertest"
)

// An immediate stop is a crash to PostgreSQL: after Start, committed
// rows are there (recovered from the write-ahead log) and a transaction
// open at the stop is not.
func TestPostgresImmediateStopKeepsCommittedRows(t *testing.T) {
	t.Parallel()
	pg := clustertest.StartPostgres(t, clustertest.PostgresOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	conn := connect(ctx, t, pg.DSN())
	exec(ctx, t, conn, `CREATE TABLE events (gateway text, seq bigint, PRIMARY KEY (gateway, seq))`)
	exec(ctx, t, conn, `INSERT INTO events SELECT 'gw1', g FROM generate_series(1, 100) g`)

	// A second session holds a transaction open across the stop.
	open := connect(ctx, t, pg.DSN())
	tx, err := open.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO events SELECT 'gw2', g FROM generate_series(1, 50) g`); err != nil {
		t.Fatal(err)
	}

	pid := pg.PID()
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	if pg.PID() != 0 {
		t.Fatalf("PID after Stop = %d, want 0", pg.PID())
	}
	if err := conn.Ping(ctx); err == nil {
		t.Fatal("a connection still answers after the immediate stop")
	}
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	if pg.PID() == 0 || pg.PID() == pid {
		t.Fatalf("PID after Start = %d (before: %d), want a new process", pg.PID(), pid)
	}

	again := connect(ctx, t, pg.DSN())
	for gw, want := range map[string]int{"gw1": 100, "gw2": 0} {
		var got int
		if err := again.QueryRow(ctx, `SELECT count(*) FROM events WHERE gateway = $1`, gw).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("rows of %s after restart = %d, want %d", gw, got, want)
		}
	}
}

// Tests sharing one server keep apart in databases of their own.
func TestPostgresCreateDatabase(t *testing.T) {
	t.Parallel()
	pg := clustertest.StartPostgres(t, clustertest.PostgresOptions{Settings: map[string]string{"fsync": "off"}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dsn, err := pg.CreateDatabase("hub_a")
	if err != nil {
		t.Fatal(err)
	}
	conn := connect(ctx, t, dsn)
	var db, fsync string
	if err := conn.QueryRow(ctx, `SELECT current_database(), current_setting('fsync')`).Scan(&db, &fsync); err != nil {
		t.Fatal(err)
	}
	if db != "hub_a" || fsync != "off" {
		t.Errorf("database, fsync = %q, %q; want hub_a, off", db, fsync)
	}
}

// A Dump restored into another database (of another server) has its
// tables and rows: what a benchmark's cached fill relies on.
func TestPostgresDumpRestoresIntoAnotherServer(t *testing.T) {
	t.Parallel()
	a := clustertest.StartPostgres(t, clustertest.PostgresOptions{Settings: map[string]string{"fsync": "off"}})
	b := clustertest.StartPostgres(t, clustertest.PostgresOptions{Settings: map[string]string{"fsync": "off"}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	src := connect(ctx, t, a.DSN())
	exec(ctx, t, src, `CREATE TABLE fill (id int PRIMARY KEY, what text)`)
	exec(ctx, t, src, `INSERT INTO fill SELECT g, 'row ' || g FROM generate_series(1, 1000) g`)
	dump := filepath.Join(t.TempDir(), "fill.dump")
	if err := a.Dump(a.Database, dump); err != nil {
		t.Fatal(err)
	}
	if err := b.Restore(b.Database, dump); err != nil {
		t.Fatal(err)
	}
	var n int
	var last string
	if err := connect(ctx, t, b.DSN()).QueryRow(ctx, `SELECT count(*), max(what) FROM fill`).Scan(&n, &last); err != nil {
		t.Fatal(err)
	}
	if n != 1000 || last != "row 999" {
		t.Errorf("restored %d rows, max %q; want 1000, \"row 999\"", n, last)
	}
	if err := b.Restore(b.Database, filepath.Join(t.TempDir(), "none.dump")); err == nil {
		t.Error("restoring a missing dump: no error")
	}
}

func connect(ctx context.Context, t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) }) // may be dead already
	return conn
}

func exec(ctx context.Context, t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}
