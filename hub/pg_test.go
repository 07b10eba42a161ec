package hub

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/clustertest"
	"github.com/sortie-edge/sortie/uplink"
)

// pgStoreEnv names the PostgreSQL database of a run of the store cases.
const pgStoreEnv = "SORTIE_HUB_TEST_PG"

// TestPGStoreKeepsTheSameRules runs the store's cases on PostgreSQL:
// the cluster mode must store, deduplicate, chain acks, page, prune and
// count exactly as the single hub does. The cases are the tests and
// fuzz targets of this package that take their store from testStore,
// found in its source, so none is left out; they run in a run of this
// test binary of their own, with pgStoreEnv set, and each must pass.
func TestPGStoreKeepsTheSameRules(t *testing.T) {
	if os.Getenv(pgStoreEnv) != "" {
		t.Skip("the run of the store cases")
	}
	cases := storeCases(t)
	pg := clustertest.StartPostgres(t, clustertest.PostgresOptions{Settings: map[string]string{"fsync": "off"}})
	args := []string{"-test.run", "^(" + strings.Join(cases, "|") + ")$", "-test.count=1", "-test.v"}
	if testing.Short() {
		args = append(args, "-test.short")
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], args...)
	cmd.Env = append(os.Environ(), pgStoreEnv+"="+pg.DSN())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the store cases on PostgreSQL: %v\n%s", err, out)
	}
	for _, c := range cases {
		if !regexp.MustCompile(`(?m)^--- (PASS|SKIP): ` + c + ` `).Match(out) {
			t.Errorf("store case %s did not pass on PostgreSQL:\n%s", c, out)
		}
	}
	t.Logf("%d store cases passed on PostgreSQL: %s", len(cases), strings.Join(cases, " "))
}

// storeCases lists the tests and fuzz targets of this package's source
// whose own body calls testStore (a case takes its store there, not
// through a helper of its own).
func storeCases(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	var cases []string
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || fn.Body == nil || !strings.HasPrefix(fn.Name.Name, "Test") && !strings.HasPrefix(fn.Name.Name, "Fuzz") {
				continue
			}
			found := false
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				if c, ok := n.(*ast.CallExpr); ok {
					if id, ok := c.Fun.(*ast.Ident); ok && id.Name == "testStore" {
						found = true
					}
				}
				return !found
			})
			if found {
				cases = append(cases, fn.Name.Name)
			}
		}
	}
	if len(cases) == 0 {
		t.Fatal("no test calls testStore")
	}
	slices.Sort(cases)
	return cases
}

// TestPGStoreReplicasShareAGateway: two replicas applying one gateway's
// batches at the same moment (as two consumers of one stream do) store
// each event once and ack only what the chain has stored; the gateway's
// row lock keeps their read-modify-write of the cursor apart, and what
// they leave unacknowledged is taken when sent again.
func TestPGStoreReplicasShareAGateway(t *testing.T) {
	pg := clustertest.StartPostgres(t, clustertest.PostgresOptions{Settings: map[string]string{"fsync": "off"}})
	var replicas [2]*PGStore
	for i := range replicas {
		st, err := OpenPG(context.Background(), pg.DSN())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		replicas[i] = st
	}
	const batches, size = 200, 3
	work := make(chan uplink.Batch)
	go func() {
		for i := range uint64(batches) {
			work <- chained("gw", i*size, (i+1)*size, 0)
		}
		close(work)
	}()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad []string
	for _, st := range replicas {
		wg.Go(func() {
			for b := range work {
				res, err := ingest(st, t0, "gw", b)
				if err != nil {
					mu.Lock()
					bad = append(bad, err.Error())
					mu.Unlock()
					continue
				}
				// Every entry up to the ack is in the database.
				var n int64
				ack := res.Acks["gw"].Upto
				if err := st.pool.QueryRow(context.Background(), `SELECT count(*) FROM sortie_events WHERE gateway = 'gw' AND mission = ANY($1)`, missionsUpTo(ack)).Scan(&n); err != nil || uint64(n) != ack {
					mu.Lock()
					bad = append(bad, fmt.Sprintf("ack %d with %d of its events stored (%v)", ack, n, err))
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("%d problems, first: %s", len(bad), bad[0])
	}
	g, err := replicas[0].Gateway(t.Context(), "gw")
	if err != nil {
		t.Fatal(err)
	}
	// A replica held back on one batch while the other stored more than
	// maxPending beyond it leaves the farthest unacknowledged (seen under
	// load); the gateway sends again what is not, as it does.
	var resent uint64
	for i := g.Acked / size; i < batches; i++ {
		if _, err := ingest(replicas[i%2], t0, "gw", chained("gw", i*size, (i+1)*size, 0)); err != nil {
			t.Fatal(err)
		}
		resent += size
	}
	if resent > 0 {
		t.Logf("%d events sent again after acked %d with %d batches pending", resent, g.Acked, len(g.Pending))
		if g, err = replicas[0].Gateway(t.Context(), "gw"); err != nil {
			t.Fatal(err)
		}
	}
	if g.Acked != batches*size || g.Events != batches*size || g.Duplicates != resent || len(g.Pending) != 0 {
		t.Fatalf("gateway after both replicas: acked %d, events %d, duplicates %d, pending %d; want %d, %d, %d, 0",
			g.Acked, g.Events, g.Duplicates, len(g.Pending), batches*size, batches*size, resent)
	}
}

// missionsUpTo names the missions of chained's entries 1..n.
func missionsUpTo(n uint64) []string {
	out := make([]string, n)
	for i := range n {
		out[i] = fmt.Sprintf("m%d", i+1)
	}
	return out
}

// TestPGStoreTakesANulInASummary: a NUL is valid JSON but not PostgreSQL
// text; one gateway's odd summary must not fail the transaction (and
// with it every other gateway's batches in the group).
func TestPGStoreTakesANulInASummary(t *testing.T) {
	pg := clustertest.StartPostgres(t, clustertest.PostgresOptions{Settings: map[string]string{"fsync": "off"}})
	st, err := OpenPG(context.Background(), pg.DSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	odd := chained("odd", 0, 1, 0)
	odd.Entries[0].Mission.Scene, odd.Entries[0].Mission.State = "go\x00home", "RUN\x00NING"
	fine := chained("fine", 0, 1, 0)
	res, err := st.Apply(t.Context(), []Inbound{{Gateway: "odd", Batch: &odd, Received: t0}, {Gateway: "fine", Batch: &fine, Received: t0}})
	if err != nil || res.Stored != 2 {
		t.Fatalf("apply: %+v, %v; want both stored", res, err)
	}
	d, err := st.Mission(t.Context(), "odd", "m1")
	if err != nil || d.Summary.Scene != "go\x00home" {
		t.Fatalf("odd mission: %+v, %v; want its summary as sent", d.Summary, err)
	}
}

// TestPGStorePrunesABacklogInBatches: retention works through more
// missions than one batch, from two replicas at once, and removes each
// mission once.
func TestPGStorePrunesABacklogInBatches(t *testing.T) {
	pg := clustertest.StartPostgres(t, clustertest.PostgresOptions{Settings: map[string]string{"fsync": "off"}})
	var reps [2]*PGStore
	for i := range reps {
		st, err := OpenPG(context.Background(), pg.DSN())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		reps[i] = st
	}
	const total, keep = 2*pruneBatch + 500, 100
	var in []Inbound
	for i := range total {
		e := entry(uint64(i+1), fmt.Sprintf("m%05d", i), 1, driver.StateSucceeded)
		e.Mission.Finished = t0.Add(time.Duration(i) * time.Second)
		b := uplink.Batch{Gateway: "gw", Entries: []uplink.Entry{e}}
		in = append(in, Inbound{Gateway: "gw", Batch: &b, Received: t0})
	}
	if _, err := reps[0].Apply(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var removed [2]int
	for i, st := range reps {
		wg.Go(func() {
			n, err := st.Prune(t.Context(), t0.Add(time.Hour*24*365), Retention{MaxCount: keep})
			if err != nil {
				t.Errorf("prune on replica %d: %v", i, err)
			}
			removed[i] = n
		})
	}
	wg.Wait()
	var missions, events int
	_ = reps[0].pool.QueryRow(context.Background(), `SELECT count(*) FROM sortie_missions`).Scan(&missions)
	_ = reps[0].pool.QueryRow(context.Background(), `SELECT count(*) FROM sortie_events`).Scan(&events)
	if removed[0]+removed[1] != total-keep || missions != keep || events != keep {
		t.Fatalf("removed %v, left %d missions and %d events; want %d removed, %d left", removed, missions, events, total-keep, keep)
	}
	// The newest are kept.
	if _, err := reps[1].Mission(t.Context(), "gw", fmt.Sprintf("m%05d", total-1)); err != nil {
		t.Fatalf("the newest mission: %v", err)
	}
}

// openUnversioned starts PostgreSQL with the database the cluster mode
// left before its schema had versions (testdata/pg-unversioned.sql,
// tables and rows, loaded on a connection of its own: the dump sets the
// session's search_path), and opens it as the hub does.
func openUnversioned(t *testing.T) (*clustertest.Postgres, *PGStore) {
	t.Helper()
	pg := clustertest.StartPostgres(t, clustertest.PostgresOptions{Settings: map[string]string{"fsync": "off"}})
	dump, err := os.ReadFile("testdata/pg-unversioned.sql")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(t.Context(), pg.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if _, err := conn.Exec(t.Context(), string(dump)); err != nil { // no arguments: the simple protocol, many statements
		t.Fatalf("load the unversioned database: %v", err)
	}
	st, err := OpenPG(t.Context(), pg.DSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return pg, st
}

// TestPGUpgradesAnUnversionedDatabaseWithItsData: a database made by
// the hub before schema versions, with gateways, missions, events and
// trigger records in it, opens at the current version, every record
// reads back as it was stored, and ingest goes on from where it was (the
// pending batch joins the chain once the missing one arrives).
func TestPGUpgradesAnUnversionedDatabaseWithItsData(t *testing.T) {
	_, st := openUnversioned(t)
	if v, err := schemaVersion(t.Context(), st.pool); err != nil || v != len(pgMigrations) {
		t.Fatalf("schema version after the upgrade: %d (%v), want %d", v, err, len(pgMigrations))
	}
	gws, err := st.Gateways(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(gws) != 2 || gws[0].ID != "home" || gws[1].ID != "idle" {
		t.Fatalf("gateways %+v, want home and idle", gws)
	}
	home := gws[0]
	if home.State != StateOnline || home.Version != "1.4.0" || home.Acked != 3 || !slices.Equal(home.Pending, []Link{{After: 5, Last: 6}}) || home.Gaps != 1 {
		t.Errorf("home: %+v", home)
	}
	ms, _, err := st.Missions(t.Context(), Query{Gateway: "home"})
	if err != nil || len(ms) != 3 {
		t.Fatalf("missions: %d (%v), want 3", len(ms), err)
	}
	d, err := st.Mission(t.Context(), "home", "m2")
	if err != nil {
		t.Fatal(err)
	}
	if d.Summary.State != driver.StateFailed || len(d.Timeline) != 2 || len(d.Gaps) != 1 || d.Gaps[0].From != 2 {
		t.Errorf("m2: state %s, %d events, gaps %+v", d.Summary.State, len(d.Timeline), d.Gaps)
	}
	if tr, err := st.Trace(t.Context(), "home", "r-1"); err != nil || len(tr.Records) != 1 || tr.Records[0].MissionID != "m1" {
		t.Errorf("trigger record r-1: %+v (%v)", tr, err)
	}
	// Version 4 filled the briefs and indexed the failures.
	briefs, err := st.GatewayBriefs(t.Context())
	if err != nil || !slices.Equal(briefs, []GatewayBrief{{ID: "home", State: StateOnline}, {ID: "idle", State: StateUnknown}}) {
		t.Errorf("briefs after the upgrade: %+v (%v)", briefs, err)
	}
	if failed, err := st.FailedSince(t.Context(), time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC), []string{"home", "idle"}); err != nil || len(failed) != 1 || failed["home"] != 1 {
		t.Errorf("failed since the upgraded missions: %v (%v), want home 1 (m2)", failed, err)
	}
	// The missing batch (outbox 4..5) arrives: the chain reaches the
	// pending one, and the ack covers both.
	res, err := ingest(st, t0, "home", chained("home", 3, 5, 0))
	if err != nil {
		t.Fatal(err)
	}
	if ack := res.Acks["home"].Upto; ack != 6 {
		t.Errorf("ack after the missing batch: %d, want 6", ack)
	}
}

// TestPGMigrationsRunOnceAndRefuseANewerSchema: a migration adding a
// column (what a release's next schema change will do) runs once on a
// database in use, with its rows, however many replicas start at once;
// a hub that knows an older version then refuses the database rather
// than misread it, and says it will not get better by waiting.
func TestPGMigrationsRunOnceAndRefuseANewerSchema(t *testing.T) {
	pg, st := openUnversioned(t)
	next := append(slices.Clone(pgMigrations), []string{
		`ALTER TABLE sortie_missions ADD COLUMN IF NOT EXISTS finished boolean`,
		`UPDATE sortie_missions SET finished = finished_ns IS NOT NULL WHERE finished IS NULL`,
		`ALTER TABLE sortie_missions ALTER COLUMN finished SET NOT NULL`,
	})
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = migrate(t.Context(), st.pool, next) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("replica %d: %v", i, err)
		}
	}
	if v, err := schemaVersion(t.Context(), st.pool); err != nil || v != len(next) {
		t.Fatalf("schema version: %d (%v), want %d", v, err, len(next))
	}
	var finished, running int
	if err := st.pool.QueryRow(t.Context(), `SELECT count(*) FILTER (WHERE finished), count(*) FILTER (WHERE NOT finished) FROM sortie_missions`).Scan(&finished, &running); err != nil {
		t.Fatal(err)
	}
	if finished != 2 || running != 1 {
		t.Errorf("after the migration: %d finished, %d running; want 2 and 1", finished, running)
	}
	_, err := OpenPG(t.Context(), pg.DSN())
	if !errors.Is(err, ErrSchemaNewer) || errors.Is(err, ErrStoreUnavailable) {
		t.Errorf("an older hub opening the migrated database: %v, want ErrSchemaNewer and not unavailable", err)
	}
}

// TestOpenPGTellsWaitingFromRefused: a database that cannot be reached
// is worth waiting for (ErrStoreUnavailable, which cmd/hub retries); one
// that refuses the hub's password or has no such database is not.
func TestOpenPGTellsWaitingFromRefused(t *testing.T) {
	pg := clustertest.StartPostgres(t, clustertest.PostgresOptions{Settings: map[string]string{"fsync": "off"}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	u, err := url.Parse(pg.DSN())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(pg.User, "wrong")
	wrong := u.String()
	for _, tc := range []struct {
		name, dsn string
		waiting   bool
	}{
		{"nothing listens", "postgres://nobody:x@127.0.0.1:1/none?sslmode=disable&connect_timeout=2", true},
		{"a wrong password", wrong, false},
		{"no such database", pg.DSNFor("no_such_db"), false},
	} {
		_, err := OpenPG(ctx, tc.dsn)
		if err == nil || errors.Is(err, ErrStoreUnavailable) != tc.waiting {
			t.Errorf("%s: %v; want an error, marked unavailable: %v", tc.name, err, tc.waiting)
		}
	}
}

// TestPGDeadlineReachesTheServer: an Apply waiting for its gateway's row
// lock, which another transaction holds, gives up at its context's
// deadline, and PostgreSQL stops running it too: no backend is left
// waiting for the lock.
func TestPGDeadlineReachesTheServer(t *testing.T) {
	pg := clustertest.StartPostgres(t, clustertest.PostgresOptions{Settings: map[string]string{"fsync": "off"}})
	st, err := OpenPG(t.Context(), pg.DSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if _, err := ingest(st, t0, "gw", chained("gw", 0, 1, 0)); err != nil {
		t.Fatal(err)
	}
	tx, err := st.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(t.Context(), `SELECT 1 FROM sortie_gateways WHERE id = 'gw' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	b := chained("gw", 1, 2, 0)
	start := time.Now()
	_, err = st.Apply(ctx, []Inbound{{Gateway: "gw", Batch: &b, Received: t0}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Apply behind a held lock: %v, want its deadline exceeded", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Apply returned %v after its deadline of 300ms", took)
	}
	waiting := -1
	for deadline := time.Now().Add(10 * time.Second); waiting != 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) { // polling the server: nothing signals a query's end
		if err := tx.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	if waiting != 0 {
		t.Errorf("%d backends still wait for the lock after the caller's deadline", waiting)
	}
}

// TestPGReadsOfThePagesUseTheirIndexes: the worst ranking's read of a
// scope kind over a range of hours, and a page's failures of the last
// day, can be served by their indexes in a database whose collation is
// not C (where the primary key (scope, hour) serves no prefix of
// scope): with sequential scans off, the plans name the indexes.
func TestPGReadsOfThePagesUseTheirIndexes(t *testing.T) {
	pg := clustertest.StartPostgres(t, clustertest.PostgresOptions{Settings: map[string]string{"fsync": "off"}})
	conn, err := pgx.Connect(t.Context(), pg.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	// ICU's root collation, as a database created in en_US.UTF-8 has
	// one that is not C.
	if _, err := conn.Exec(t.Context(), `CREATE DATABASE icu TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'und' LOCALE 'C'`); err != nil {
		t.Skipf("no ICU collation on this server: %v", err)
	}
	st, err := OpenPG(t.Context(), pg.DSNFor("icu"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	tx, err := st.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(t.Context(), `SET LOCAL enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	for index, query := range map[string]string{
		"sortie_outcomes_kind": `EXPLAIN SELECT substr(scope, 3), sum(v[1]) FROM sortie_outcomes
			WHERE left(scope, 2) = left('g/', 2) AND starts_with(scope, 'g/') AND hour >= 100 AND hour < 200 GROUP BY scope`,
		"sortie_missions_failed": `EXPLAIN SELECT gateway, count(*) FROM sortie_missions
			WHERE gateway = ANY('{a,b}'::text[]) AND finished_ns >= 5 AND state = 'FAILED' GROUP BY gateway`,
	} {
		rows, err := tx.Query(t.Context(), query)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(strings.Join(plan, "\n"), index) {
			t.Errorf("the plan does not use %s:\n%s", index, strings.Join(plan, "\n"))
		}
	}
}

// TestPGMigrationCutShortLeavesNoInvalidIndex: a concurrent index build
// of version 4 cut short (a replica killed mid-build) leaves an invalid
// index; the migration, run again by the next replica, builds it anew
// rather than keep it (IF NOT EXISTS alone would).
func TestPGMigrationCutShortLeavesNoInvalidIndex(t *testing.T) {
	pg := clustertest.StartPostgres(t, clustertest.PostgresOptions{Settings: map[string]string{"fsync": "off"}})
	st, err := OpenPG(t.Context(), pg.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	// Back to version 3 with the index half built, as a kill leaves it.
	for _, q := range []string{`UPDATE sortie_schema SET version = 3`,
		`UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'sortie_outcomes_kind'::regclass`} {
		if _, err := st.pool.Exec(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
	if err := migrate(t.Context(), st.pool, pgMigrations); err != nil {
		t.Fatal(err)
	}
	var valid bool
	if err := st.pool.QueryRow(t.Context(), `SELECT indisvalid FROM pg_index WHERE indexrelid = 'sortie_outcomes_kind'::regclass`).Scan(&valid); err != nil || !valid {
		t.Errorf("sortie_outcomes_kind after the migration ran again: valid %v (%v)", valid, err)
	}
}
