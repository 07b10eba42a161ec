package hub

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sortie-edge/sortie/driver"
)

// PGStore keeps gateways and their missions in PostgreSQL, for the
// cluster mode: several hub replicas share one database, and each
// applies what it fetched in one transaction. Its rules are the bbolt
// Store's (one applier for both); the tests run the same cases on both.
//
// Replicas applying messages of the same gateway at once are kept apart
// by a row lock on the gateway, which every Apply takes first (in ID
// order, so two never wait on each other); the ack chain and the
// counters live in that row.
type PGStore struct {
	pool *pgxpool.Pool
	// timeout bounds each call.
	timeout time.Duration

	// lead is the connection holding the rollouts' lead lock (Lead);
	// SaveFleet writes on it, so that a replica whose session (and with
	// it the lock) is gone cannot overwrite the next leader's records.
	// led says Lead was ever held: then a SaveFleet with no lead
	// connection is a leader's that lost it.
	leadMu sync.Mutex
	lead   *pgxpool.Conn
	led    bool
}

// pgMigrations are the schema's versions: pgMigrations[i] takes the
// database from version i to i+1, and sortie_schema records the version
// reached. Each statement is idempotent (IF NOT EXISTS, ...) and runs in
// a transaction of its own: a migration cut short runs again whole, and
// a replica of the previous version ingesting meanwhile never waits
// behind locks held across tables (one transaction for all could
// deadlock with it). A migration leaves the previous version's queries
// working (add columns and indexes; rename or drop only in a later
// release), since older replicas run beside it during a rolling upgrade.
// A new version is a new entry at the end; an entry once released never
// changes.
var pgMigrations = [][]string{
	// 1: the tables of the first cluster release. Before versions were
	// recorded every replica ran these at start, so a database made then
	// is at version 1 once they find everything there.
	{
		`CREATE TABLE IF NOT EXISTS sortie_gateways (
			id   text PRIMARY KEY,
			doc  bytea NOT NULL)`,
		// mkey is missionKey (gateway 0x00 id), created_ns and finished_ns
		// the time keys of the bbolt store's order and finished indexes, so
		// both stores page and prune in the same order.
		`CREATE TABLE IF NOT EXISTS sortie_missions (
			gateway     text NOT NULL,
			id          text NOT NULL,
			mkey        bytea NOT NULL,
			created_ns  bigint NOT NULL,
			finished_ns bigint,
			state       text NOT NULL,
			scene       text NOT NULL,
			doc         bytea NOT NULL,
			PRIMARY KEY (gateway, id))`,
		`CREATE INDEX IF NOT EXISTS sortie_missions_order ON sortie_missions (created_ns DESC, mkey DESC)`,
		`CREATE INDEX IF NOT EXISTS sortie_missions_finished ON sortie_missions (finished_ns, mkey) WHERE finished_ns IS NOT NULL`,
		`CREATE TABLE IF NOT EXISTS sortie_events (
			gateway text NOT NULL,
			mission text NOT NULL,
			seq     bigint NOT NULL,
			doc     bytea NOT NULL,
			PRIMARY KEY (gateway, mission, seq))`,
		`CREATE TABLE IF NOT EXISTS sortie_traces (
			gateway    text NOT NULL,
			request_id text NOT NULL,
			updated    timestamptz NOT NULL,
			doc        bytea NOT NULL,
			PRIMARY KEY (gateway, request_id))`,
		`CREATE INDEX IF NOT EXISTS sortie_traces_updated ON sortie_traces (updated)`,
	},
	// 2: the outcome roll-up (hub/outcomes.go): scope, hour since 1970
	// UTC, and the row's counters and duration histogram.
	{
		`CREATE TABLE IF NOT EXISTS sortie_outcomes (
			scope text NOT NULL,
			hour  bigint NOT NULL,
			v     bigint[] NOT NULL,
			PRIMARY KEY (scope, hour))`,
	},
	// 3: bundles and rollouts (hub/pgfleet.go): the rollout engine's
	// records, as the bbolt Store keeps them, each a JSON document.
	{
		`CREATE TABLE IF NOT EXISTS sortie_bundles (
			hash text PRIMARY KEY,
			info bytea NOT NULL,
			data bytea NOT NULL)`,
		// One counter for every group, as the single hub's.
		`CREATE SEQUENCE IF NOT EXISTS sortie_release_version`,
		`CREATE TABLE IF NOT EXISTS sortie_releases (
			version bigint PRIMARY KEY,
			grp     text NOT NULL,
			hash    text NOT NULL,
			doc     bytea NOT NULL)`,
		`CREATE INDEX IF NOT EXISTS sortie_releases_group ON sortie_releases (grp, version DESC)`,
		`CREATE TABLE IF NOT EXISTS sortie_rollouts (
			id  text PRIMARY KEY,
			doc bytea NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS sortie_targets (
			rollout text NOT NULL,
			gateway text NOT NULL,
			doc     bytea NOT NULL,
			PRIMARY KEY (rollout, gateway))`,
		`CREATE TABLE IF NOT EXISTS sortie_fleet (
			gateway text PRIMARY KEY,
			doc     bytea NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS sortie_groups (
			name text PRIMARY KEY,
			doc  bytea NOT NULL)`,
	},
	// 4: what the fleet's counts and the gateway list read without the
	// records (hub/briefs.go), and the worst ranking's index.
	{
		// A gateway's brief: its state and its last heartbeat's backlog,
		// written with its record by every replica of this version; the
		// UPDATE fills them for the records already there. A replica of
		// version 3 still running during a rolling upgrade writes the
		// record alone: the gateway's brief is then stale until a replica
		// of this version next writes it (its next heartbeat).
		`ALTER TABLE sortie_gateways ADD COLUMN IF NOT EXISTS state text NOT NULL DEFAULT ''`,
		`ALTER TABLE sortie_gateways ADD COLUMN IF NOT EXISTS backlog integer NOT NULL DEFAULT 0`,
		`UPDATE sortie_gateways SET state = coalesce(convert_from(doc, 'UTF8')::json->>'state', ''),
			backlog = least(greatest(coalesce((convert_from(doc, 'UTF8')::json->'heartbeat'->>'backlog')::numeric, 0), 0), 2147483647)::integer
			WHERE length(doc) > 0`,
		// "Failed in the last 24 h" of a page's gateways: their failed
		// missions by time, a small index (failures are a few percent).
		// CONCURRENTLY: built without stopping ingest on a table of
		// millions of rows (a statement of its own, as every one here).
		// A concurrent build cut short leaves an invalid index that IF NOT
		// EXISTS would keep: a migration run again (only when cut short)
		// drops it first.
		`DROP INDEX CONCURRENTLY IF EXISTS sortie_missions_failed`,
		`CREATE INDEX CONCURRENTLY IF NOT EXISTS sortie_missions_failed ON sortie_missions (gateway, finished_ns) WHERE state = 'FAILED'`,
		// The worst ranking reads one kind of scope ("g/", "s/", "d/")
		// over a range of hours: the primary key (scope, hour) cannot
		// serve a prefix of scope in a database whose collation is not
		// C, and served it only as a scan of every hour of the kind.
		`DROP INDEX CONCURRENTLY IF EXISTS sortie_outcomes_kind`,
		`CREATE INDEX CONCURRENTLY IF NOT EXISTS sortie_outcomes_kind ON sortie_outcomes (left(scope, 2), hour)`,
	},
}

// OpenPG connects to the database at dsn (a pgx connection string) and
// migrates its schema to the version this hub knows (pgMigrations),
// creating the tables in an empty database. An error marked
// ErrStoreUnavailable may go away by itself (the database starting); one
// marked ErrSchemaNewer will not (a newer hub migrated the database).
func OpenPG(ctx context.Context, dsn string) (*PGStore, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: postgres dsn: %w", ErrInvalid, err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	if err := migrate(ctx, pool, pgMigrations); err != nil {
		pool.Close()
		unavailable(&err) // a database still starting: worth waiting for
		return nil, fmt.Errorf("hub schema: %w", err)
	}
	return &PGStore{pool: pool, timeout: 30 * time.Second}, nil
}

// schemaLock is the advisory lock a replica migrating the schema takes:
// two running the same CREATE TABLE IF NOT EXISTS at once can collide in
// the catalogue (a unique violation on pg_type), and a migration is run
// once.
const schemaLock = pruneLock + 1

// pgSchemaTable records the schema's version: one row, made by the
// first migration run.
const pgSchemaTable = `CREATE TABLE IF NOT EXISTS sortie_schema (
	one     boolean PRIMARY KEY DEFAULT true CHECK (one),
	version integer NOT NULL)`

// schemaVersion reads the database's schema version: 0 before any was
// recorded.
func schemaVersion(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (int, error) {
	var recorded bool
	if err := q.QueryRow(ctx, `SELECT to_regclass('sortie_schema') IS NOT NULL`).Scan(&recorded); err != nil || !recorded {
		return 0, err
	}
	var v int
	err := q.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM sortie_schema`).Scan(&v)
	return v, err
}

// migrate brings the schema to the last of migrations. Replicas starting
// together take turns (schemaLock); one that finds the database at the
// version it knows does nothing and takes no lock, so a replica starting
// beside running ones holds up none of their writes.
func migrate(ctx context.Context, pool *pgxpool.Pool, migrations [][]string) error {
	want := len(migrations)
	v, err := schemaVersion(ctx, pool)
	switch {
	case err != nil:
		return err
	case v == want:
		return nil
	case v > want:
		return fmt.Errorf("%w: version %d, this hub knows %d: run a hub of that version or newer", ErrSchemaNewer, v, want)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	// Polled, not waited for in pg_advisory_lock: a session blocked in
	// that statement holds a snapshot, which the concurrent index builds
	// of the replica migrating wait for, and the two would deadlock (a
	// rolling upgrade of two replicas). Between polls no statement is
	// open.
	for {
		var got bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, schemaLock).Scan(&got); err != nil {
			return err
		}
		if got {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	defer func() { _, _ = conn.Exec(context.Background(), `SELECT pg_advisory_unlock($1)`, schemaLock) }()
	if v, err = schemaVersion(ctx, conn); err != nil { // another replica may have migrated meanwhile
		return err
	}
	if v > want {
		return fmt.Errorf("%w: version %d, this hub knows %d: run a hub of that version or newer", ErrSchemaNewer, v, want)
	}
	if _, err := conn.Exec(ctx, pgSchemaTable); err != nil {
		return err
	}
	for ; v < want; v++ {
		for _, q := range migrations[v] {
			if _, err := conn.Exec(ctx, q); err != nil {
				return fmt.Errorf("schema version %d: %w", v+1, err)
			}
		}
		if _, err := conn.Exec(ctx, `INSERT INTO sortie_schema (version) VALUES ($1)
			ON CONFLICT (one) DO UPDATE SET version = excluded.version`, v+1); err != nil {
			return fmt.Errorf("schema version %d: %w", v+1, err)
		}
	}
	return nil
}

// Close closes the connections.
func (s *PGStore) Close() error { s.pool.Close(); return nil }

// unavailable marks *err with ErrStoreUnavailable when it means
// PostgreSQL could not be reached (down, restarting, a connection cut)
// rather than that it refused something: the API answers 503 for it,
// not 500. A wrong password or a missing database is not this: retrying
// will not help.
func unavailable(err *error) {
	if *err == nil || errors.Is(*err, ErrStoreUnavailable) {
		return
	}
	var pe *pgconn.PgError
	if errors.As(*err, &pe) {
		// Class 08: connection exception; 57P01-03: the server shutting
		// down, crashed, or not yet accepting connections.
		if strings.HasPrefix(pe.Code, "08") || pe.Code == "57P01" || pe.Code == "57P02" || pe.Code == "57P03" {
			*err = fmt.Errorf("%w: %w", ErrStoreUnavailable, *err)
		}
		return
	}
	var ce *pgconn.ConnectError
	if errors.As(*err, &ce) || pgconn.Timeout(*err) || pgconn.SafeToRetry(*err) || errors.Is(*err, io.ErrUnexpectedEOF) {
		*err = fmt.Errorf("%w: %w", ErrStoreUnavailable, *err)
	}
}

// Ping says whether the database answers, for /readyz: a replica whose
// database is away stores nothing, and its monitoring should say so.
func (s *PGStore) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("postgresql: %w", err)
	}
	return nil
}

// size is the database's size on disk for /metrics; 0 when it does not
// answer within a second (a scrape must not hang on a restarting server).
func (s *PGStore) size() int64 {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var n int64
	if err := s.pool.QueryRow(ctx, `SELECT pg_database_size(current_database())`).Scan(&n); err != nil {
		return 0
	}
	return n
}

// bound gives a call the store's own deadline as well as the caller's.
func (s *PGStore) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.timeout)
}

// Register inserts the configured gateways that the database does not
// know yet. Unlike the bbolt Store it leaves known gateways' presence
// alone: a replica starting says nothing about gateways connected to
// the other replicas' broker.
func (s *PGStore) Register(ctx context.Context, now time.Time, ids ...string) error {
	for _, id := range ids {
		if err := driver.ValidateID("gateway", id); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	for _, id := range ids {
		doc, err := json.Marshal(&Gateway{ID: id, State: StateUnknown, Since: now})
		if err != nil {
			return err
		}
		if _, err := s.pool.Exec(ctx, `INSERT INTO sortie_gateways (id, doc, state) VALUES ($1, $2, $3) ON CONFLICT (id) DO NOTHING`, id, doc, StateUnknown); err != nil {
			return fmt.Errorf("register gateway %s: %w", id, err)
		}
	}
	return nil
}

// Apply folds messages into the database in one transaction, as
// Store.Apply does. A transaction that loses a deadlock or a
// serialization race is run again.
func (s *PGStore) Apply(ctx context.Context, in []Inbound) (Result, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	for attempt := 1; ; attempt++ {
		res, err := s.apply(ctx, in)
		var pe *pgconn.PgError
		if err != nil && errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001") && attempt < 5 {
			continue
		}
		if err != nil && errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "23")) {
			// Data the database refuses (class 22 data exception, 23
			// integrity): sending it again will not mend it.
			return Result{}, fmt.Errorf("ingest: %w: %w", ErrInvalid, err)
		}
		if err != nil {
			return Result{}, fmt.Errorf("ingest: %w", err)
		}
		return res, nil
	}
}

func (s *PGStore) apply(ctx context.Context, in []Inbound) (Result, error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = tx.Rollback(ctx) }() // after Commit, a no-op
	r, err := preload(ctx, tx, in)
	if err != nil {
		return Result{}, err
	}
	a := newApplier(r)
	a.chainOnly = true
	for i := range in {
		if err := a.apply(&in[i]); err != nil {
			return Result{}, err
		}
	}
	if err := pgFlush(ctx, tx, a); err != nil {
		return Result{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return Result{}, err
	}
	return a.res, nil
}

// pgReader holds, read in bulk at the start of a transaction, every
// record its messages can touch.
type pgReader struct {
	gws      map[string]*Gateway
	missions map[string]*Mission // by missionKey
	events   map[string]bool     // by eventKey
	traces   map[string]*Trace   // by traceKey
}

func (r *pgReader) gateway(id string) (*Gateway, error) { return clonePtr(r.gws[id]), nil }
func (r *pgReader) mission(gw, id string) (*Mission, error) {
	return clonePtr(r.missions[string(missionKey(gw, id))]), nil
}
func (r *pgReader) hasEvent(gw, mission string, seq uint64) (bool, error) {
	return r.events[string(eventKey(missionKey(gw, mission), seq))], nil
}
func (r *pgReader) trace(gw, requestID string) (*Trace, error) {
	return clonePtr(r.traces[string(traceKey(gw, requestID))]), nil
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	c := *p
	return &c
}

// preload locks the messages' gateways (inserting the unknown ones
// first, so there is a row to lock) and reads their missions, events
// and trigger records.
func preload(ctx context.Context, tx pgx.Tx, in []Inbound) (*pgReader, error) {
	r := &pgReader{gws: map[string]*Gateway{}, missions: map[string]*Mission{}, events: map[string]bool{}, traces: map[string]*Trace{}}
	gwSet := map[string]bool{}
	var mg, mi, eg, em, tg, tr []string
	var es []int64
	for _, m := range in {
		if driver.ValidateID("gateway", m.Gateway) != nil {
			continue // the applier rejects it
		}
		gwSet[m.Gateway] = true
		if m.Batch != nil {
			for _, e := range m.Batch.Entries {
				mg, mi = append(mg, m.Gateway), append(mi, e.Event.MissionID)
				eg, em, es = append(eg, m.Gateway), append(em, e.Event.MissionID), append(es, int64(e.Event.Seq))
			}
		}
		if m.Traces != nil {
			for _, t := range m.Traces.Traces {
				tg, tr = append(tg, m.Gateway), append(tr, t.RequestID)
			}
		}
	}
	ids := make([]string, 0, len(gwSet))
	for id := range gwSet {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	if len(ids) > 0 {
		// A placeholder row to lock; the applier writes the real record.
		if _, err := tx.Exec(ctx, `INSERT INTO sortie_gateways (id, doc) SELECT unnest($1::text[]), '\x'::bytea ON CONFLICT (id) DO NOTHING`, ids); err != nil {
			return nil, fmt.Errorf("insert gateways: %w", err)
		}
		rows, err := tx.Query(ctx, `SELECT id, doc FROM sortie_gateways WHERE id = ANY($1::text[]) ORDER BY id COLLATE "C" FOR UPDATE`, ids)
		if err != nil {
			return nil, fmt.Errorf("lock gateways: %w", err)
		}
		var id string
		var doc []byte
		_, err = pgx.ForEachRow(rows, []any{&id, &doc}, func() error {
			if len(doc) == 0 {
				return nil // inserted just now: unknown to the applier
			}
			var g Gateway
			if err := json.Unmarshal(doc, &g); err != nil {
				return fmt.Errorf("decode gateway %q: %w", id, err)
			}
			r.gws[id] = &g
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	if len(mg) > 0 {
		rows, err := tx.Query(ctx, `SELECT m.gateway, m.id, m.doc FROM sortie_missions m
			JOIN (SELECT DISTINCT * FROM unnest($1::text[], $2::text[]) AS k(g, i)) k ON m.gateway = k.g AND m.id = k.i`, mg, mi)
		if err != nil {
			return nil, fmt.Errorf("read missions: %w", err)
		}
		var gw, id string
		var doc []byte
		_, err = pgx.ForEachRow(rows, []any{&gw, &id, &doc}, func() error {
			var m Mission
			if err := json.Unmarshal(doc, &m); err != nil {
				return fmt.Errorf("decode mission %s/%s: %w", gw, id, err)
			}
			r.missions[string(missionKey(gw, id))] = &m
			return nil
		})
		if err != nil {
			return nil, err
		}
		rows, err = tx.Query(ctx, `SELECT e.gateway, e.mission, e.seq FROM sortie_events e
			JOIN (SELECT DISTINCT * FROM unnest($1::text[], $2::text[], $3::bigint[]) AS k(g, m, s)) k
			ON e.gateway = k.g AND e.mission = k.m AND e.seq = k.s`, eg, em, es)
		if err != nil {
			return nil, fmt.Errorf("read events: %w", err)
		}
		var mission string
		var seq int64
		_, err = pgx.ForEachRow(rows, []any{&gw, &mission, &seq}, func() error {
			r.events[string(eventKey(missionKey(gw, mission), uint64(seq)))] = true
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	if len(tg) > 0 {
		rows, err := tx.Query(ctx, `SELECT t.gateway, t.request_id, t.doc FROM sortie_traces t
			JOIN (SELECT DISTINCT * FROM unnest($1::text[], $2::text[]) AS k(g, r)) k ON t.gateway = k.g AND t.request_id = k.r`, tg, tr)
		if err != nil {
			return nil, fmt.Errorf("read trigger records: %w", err)
		}
		var gw, rid string
		var doc []byte
		_, err = pgx.ForEachRow(rows, []any{&gw, &rid, &doc}, func() error {
			var t Trace
			if err := json.Unmarshal(doc, &t); err != nil {
				return fmt.Errorf("decode trace %s/%s: %w", gw, rid, err)
			}
			r.traces[string(traceKey(gw, rid))] = &t
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return r, nil
}

// jsonDoc decodes a row of one JSON document column into a T, for
// pgx.CollectRows; what names a T in errors.
func jsonDoc[T any](what string) pgx.RowToFunc[T] {
	return func(row pgx.CollectableRow) (T, error) {
		var v T
		var doc []byte
		if err := row.Scan(&doc); err != nil {
			return v, err
		}
		if err := json.Unmarshal(doc, &v); err != nil {
			return v, fmt.Errorf("decode %s: %w", what, err)
		}
		return v, nil
	}
}

// pgText is s as PostgreSQL takes text: no NUL byte (valid JSON, and
// refused by text columns). The document column keeps s as sent.
func pgText(s string) string {
	return strings.ReplaceAll(s, "\x00", "")
}

// nsKey is timeKey's timestamp: nanoseconds, before 1970 as 0.
func nsKey(t time.Time) int64 {
	ns := t.UnixNano()
	if ns < 0 || t.IsZero() {
		return 0
	}
	return ns
}

// pgFlush writes what a did, one statement per table.
func pgFlush(ctx context.Context, tx pgx.Tx, a *applier) error {
	if n := len(a.events); n > 0 {
		gws, ms, seqs, docs := make([]string, n), make([]string, n), make([]int64, n), make([][]byte, n)
		for i, e := range a.events {
			v, err := e.JSON()
			if err != nil {
				return fmt.Errorf("encode event: %w", err)
			}
			gws[i], ms[i], seqs[i], docs[i] = e.Gateway, e.Event.MissionID, int64(e.Event.Seq), v
		}
		if _, err := tx.Exec(ctx, `INSERT INTO sortie_events (gateway, mission, seq, doc)
			SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bytea[]) ON CONFLICT DO NOTHING`, gws, ms, seqs, docs); err != nil {
			return fmt.Errorf("insert events: %w", err)
		}
	}
	if len(a.changedTraces) > 0 {
		var gws, rids []string
		var upd []time.Time
		var docs [][]byte
		for _, t := range a.changedTraces {
			v, err := json.Marshal(t)
			if err != nil {
				return err
			}
			gws, rids, upd, docs = append(gws, t.Gateway), append(rids, t.RequestID), append(upd, t.Updated), append(docs, v)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO sortie_traces (gateway, request_id, updated, doc)
			SELECT * FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::bytea[])
			ON CONFLICT (gateway, request_id) DO UPDATE SET updated = excluded.updated, doc = excluded.doc`, gws, rids, upd, docs); err != nil {
			return fmt.Errorf("write trigger records: %w", err)
		}
	}
	gws, missions := a.changes()
	if len(gws) > 0 {
		ids, docs := make([]string, len(gws)), make([][]byte, len(gws))
		states, backlogs := make([]string, len(gws)), make([]int32, len(gws))
		for i, g := range gws {
			v, err := json.Marshal(g)
			if err != nil {
				return err
			}
			b := briefOf(g)
			ids[i], docs[i], states[i], backlogs[i] = g.ID, v, pgText(b.State), int32(b.Backlog)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO sortie_gateways (id, doc, state, backlog) SELECT * FROM unnest($1::text[], $2::bytea[], $3::text[], $4::integer[])
			ON CONFLICT (id) DO UPDATE SET doc = excluded.doc, state = excluded.state, backlog = excluded.backlog`, ids, docs, states, backlogs); err != nil {
			return fmt.Errorf("write gateways: %w", err)
		}
	}
	if n := len(missions); n > 0 {
		gw, id, states, scenes := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		mkeys, docs := make([][]byte, n), make([][]byte, n)
		created, finished := make([]int64, n), make([]*int64, n)
		for i, m := range missions {
			v, err := json.Marshal(m)
			if err != nil {
				return err
			}
			gw[i], id[i], states[i], scenes[i] = m.Gateway, m.ID, pgText(string(m.Summary.State)), pgText(m.Summary.Scene)
			mkeys[i], docs[i], created[i] = missionKey(m.Gateway, m.ID), v, nsKey(m.Created)
			if f := finishedAt(m); !f.IsZero() {
				ns := nsKey(f)
				finished[i] = &ns
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO sortie_missions (gateway, id, mkey, created_ns, finished_ns, state, scene, doc)
			SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bigint[], $5::bigint[], $6::text[], $7::text[], $8::bytea[])
			ON CONFLICT (gateway, id) DO UPDATE SET finished_ns = excluded.finished_ns, state = excluded.state,
				scene = excluded.scene, doc = excluded.doc`,
			gw, id, mkeys, created, finished, states, scenes, docs); err != nil {
			return fmt.Errorf("write missions: %w", err)
		}
	}
	return pgOutcomes(ctx, tx, a.outcomeDeltas())
}

// Gateways returns every gateway, by ID.
func (s *PGStore) Gateways(ctx context.Context) (_ []Gateway, err error) {
	defer unavailable(&err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT doc FROM sortie_gateways WHERE length(doc) > 0 ORDER BY id COLLATE "C"`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, jsonDoc[Gateway]("gateway"))
}

// Gateway returns one gateway or ErrUnknownGateway.
func (s *PGStore) Gateway(ctx context.Context, id string) (_ Gateway, err error) {
	defer unavailable(&err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var doc []byte
	err = s.pool.QueryRow(ctx, `SELECT doc FROM sortie_gateways WHERE id = $1`, id).Scan(&doc)
	if errors.Is(err, pgx.ErrNoRows) || err == nil && len(doc) == 0 {
		return Gateway{}, fmt.Errorf("%w: %q", ErrUnknownGateway, id)
	}
	if err != nil {
		return Gateway{}, err
	}
	var g Gateway
	if err := json.Unmarshal(doc, &g); err != nil {
		return Gateway{}, fmt.Errorf("decode gateway %q: %w", id, err)
	}
	return g, nil
}

// Missions returns missions matching q, newest first, as Store.Missions
// does (the same cursors).
func (s *PGStore) Missions(ctx context.Context, q Query) (_ []Mission, _ string, err error) {
	defer unavailable(&err)
	q.Limit = q.page()
	var curNS int64
	var curKey []byte
	if q.Cursor != "" {
		c, err := base64.RawURLEncoding.DecodeString(q.Cursor)
		if err != nil || len(c) < 9 {
			return nil, "", fmt.Errorf("%w: bad cursor", ErrInvalid)
		}
		curNS, curKey = int64(binary.BigEndian.Uint64(c[:8])), c[8:]
	}
	states := make([]string, len(q.States))
	for i, st := range q.States {
		states[i] = string(st)
	}
	var since, until *int64
	if !q.Since.IsZero() {
		v := nsKey(q.Since)
		since = &v
	}
	if !q.Until.IsZero() {
		v := nsKey(q.Until)
		until = &v
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT doc FROM sortie_missions
		WHERE ($1 = '' OR gateway = $1) AND ($2 = '' OR scene = $2) AND (cardinality($3::text[]) = 0 OR state = ANY($3::text[]))
		  AND ($4::bigint IS NULL OR created_ns >= $4) AND ($5::bigint IS NULL OR created_ns < $5)
		  AND ($6::bytea IS NULL OR (created_ns, mkey) < ($7, $6::bytea))
		ORDER BY created_ns DESC, mkey DESC LIMIT $8`,
		q.Gateway, q.Scene, states, since, until, curKey, curNS, q.Limit+1)
	if err != nil {
		return nil, "", err
	}
	out, err := pgx.CollectRows(rows, jsonDoc[Mission]("mission"))
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(out) > q.Limit {
		out = out[:q.Limit]
		last := out[len(out)-1]
		next = base64.RawURLEncoding.EncodeToString(timeKey(last.Created, missionKey(last.Gateway, last.ID)))
	}
	return out, next, nil
}

// Mission returns one mission with its timeline, or ErrNotFound.
func (s *PGStore) Mission(ctx context.Context, gw, id string) (_ Detail, err error) {
	defer unavailable(&err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var d Detail
	var doc []byte
	err = s.pool.QueryRow(ctx, `SELECT doc FROM sortie_missions WHERE gateway = $1 AND id = $2`, gw, id).Scan(&doc)
	if errors.Is(err, pgx.ErrNoRows) {
		return Detail{}, fmt.Errorf("%w: mission %s/%s", ErrNotFound, gw, id)
	}
	if err != nil {
		return Detail{}, err
	}
	if err := json.Unmarshal(doc, &d.Mission); err != nil {
		return Detail{}, fmt.Errorf("decode mission: %w", err)
	}
	rows, err := s.pool.Query(ctx, `SELECT doc FROM sortie_events WHERE gateway = $1 AND mission = $2 ORDER BY seq`, gw, id)
	if err != nil {
		return Detail{}, err
	}
	var v []byte
	_, err = pgx.ForEachRow(rows, []any{&v}, func() error { return d.add(v) })
	if err != nil {
		return Detail{}, err
	}
	d.Steps = Timings(d.Summary, d.Timeline)
	return d, nil
}

// Trace returns the trigger records of one request ID of gateway gw, or
// ErrNotFound.
func (s *PGStore) Trace(ctx context.Context, gw, requestID string) (_ Trace, err error) {
	defer unavailable(&err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var doc []byte
	err = s.pool.QueryRow(ctx, `SELECT doc FROM sortie_traces WHERE gateway = $1 AND request_id = $2`, gw, requestID).Scan(&doc)
	if errors.Is(err, pgx.ErrNoRows) {
		return Trace{}, ErrNotFound
	}
	if err != nil {
		return Trace{}, err
	}
	var t Trace
	return t, json.Unmarshal(doc, &t)
}

// pruneBatch is how many missions one retention transaction deletes:
// small enough for a transaction of a second or so, whatever the backlog.
const pruneBatch = 2000

// pruneLock is the advisory lock that keeps retention to one replica at
// a time (its value is arbitrary, fixed for every replica).
const pruneLock int64 = 0x736f72746965 // "sortie"; int64, PostgreSQL's bigint, on 32-bit builds too

// Prune removes finished missions and their events per r, as
// Store.Prune does, and trigger records by age. It deletes in batches,
// each its own transaction (the oldest first), so a backlog of millions
// of rows is worked through rather than timed out; and it runs on one
// replica at a time: the others find the lock taken and return 0.
func (s *PGStore) Prune(ctx context.Context, now time.Time, r Retention) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	var mine bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, pruneLock).Scan(&mine); err != nil {
		return 0, fmt.Errorf("prune lock: %w", err)
	}
	if !mine {
		return 0, nil // another replica is at it
	}
	defer func() { _, _ = conn.Exec(context.Background(), `SELECT pg_advisory_unlock($1)`, pruneLock) }()
	removed := 0
	prune := func(query string, args ...any) error {
		for {
			n, err := s.pruneOnce(ctx, conn, query, args...)
			removed += n
			if err != nil || n < pruneBatch {
				return err
			}
		}
	}
	if _, err := conn.Exec(ctx, `DELETE FROM sortie_outcomes WHERE hour < $1`, now.Add(-outcomeRetention).Unix()/3600); err != nil {
		return 0, fmt.Errorf("prune outcomes: %w", err)
	}
	if r.MaxAge > 0 {
		err := prune(`SELECT gateway, id FROM sortie_missions WHERE finished_ns < $1
			ORDER BY finished_ns, mkey LIMIT `+fmt.Sprint(pruneBatch), nsKey(now.Add(-r.MaxAge)))
		if err != nil {
			return removed, err
		}
	}
	if r.MaxCount > 0 {
		var finished int64
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM sortie_missions WHERE finished_ns IS NOT NULL`).Scan(&finished); err != nil {
			return removed, fmt.Errorf("prune: %w", err)
		}
		for over := finished - int64(r.MaxCount); over > 0; over -= pruneBatch {
			n, err := s.pruneOnce(ctx, conn, `SELECT gateway, id FROM sortie_missions WHERE finished_ns IS NOT NULL
				ORDER BY finished_ns, mkey LIMIT $1`, min(over, pruneBatch))
			removed += n
			if err != nil || n == 0 {
				return removed, err
			}
		}
	}
	age := r.MaxAge
	if age <= 0 {
		age = traceMaxAge
	}
	for {
		tag, err := conn.Exec(ctx, `DELETE FROM sortie_traces WHERE ctid IN
			(SELECT ctid FROM sortie_traces WHERE updated < $1 LIMIT 10000)`, now.Add(-age))
		if err != nil {
			return removed, fmt.Errorf("prune trigger records: %w", err)
		}
		if tag.RowsAffected() < 10000 {
			return removed, nil
		}
	}
}

// pruneOnce deletes, in one transaction, the missions pick selects and
// their events, and says how many.
func (s *PGStore) pruneOnce(ctx context.Context, conn *pgxpool.Conn, pick string, args ...any) (int, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := tx.Query(ctx, `WITH doomed AS (`+pick+`)
		DELETE FROM sortie_missions m USING doomed d WHERE m.gateway = d.gateway AND m.id = d.id
		RETURNING m.gateway, m.id`, args...)
	if err != nil {
		return 0, fmt.Errorf("prune missions: %w", err)
	}
	var gws, ids []string
	var gw, id string
	_, err = pgx.ForEachRow(rows, []any{&gw, &id}, func() error {
		gws, ids = append(gws, gw), append(ids, id)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("prune missions: %w", err)
	}
	if len(ids) > 0 {
		if _, err := tx.Exec(ctx, `DELETE FROM sortie_events e USING unnest($1::text[], $2::text[]) AS d(g, i)
			WHERE e.gateway = d.g AND e.mission = d.i`, gws, ids); err != nil {
			return 0, fmt.Errorf("prune events: %w", err)
		}
	}
	return len(ids), tx.Commit(ctx)
}
